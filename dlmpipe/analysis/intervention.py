"""The matched-state feedback intervention's tables (Archer Table 3; docs/ANALYSES.md).

From the pairs table and the two branches' scores: per branch Pass@1 (base, and the extended
tests where the task has them), Rev.@5 (the share of pairs whose selected token is re-masked or
replaced within the followed updates) with the mean update of that revision, and branch-only
passes; the paired counts (both pass, only Fresh, only Cached, neither); a figure. No torch.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from .figures import pyplot, save_figure, write_csv

BRANCH_LABELS = {"fresh": "Fresh", "cached": "Cached"}


def _passed(scores: pd.DataFrame, column: str) -> pd.Series:
    return scores.set_index("sample_index")[column].astype(bool)


def intervention_tables(pairs: pd.DataFrame, fresh: pd.DataFrame,
                        cached: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(per-branch table, paired counts) over the problems with a branch point."""
    branched = pairs[pairs["branched"]].set_index("sample_index")
    idx = branched.index
    scores = {"fresh": fresh, "cached": cached}
    for name, s in scores.items():
        missing = sorted(set(idx) - set(s["sample_index"]))
        if missing:
            raise ValueError(f"{name} branch scores lack samples {missing[:5]} of the pairs table")
    base = {n: _passed(s, "passed").reindex(idx) for n, s in scores.items()}
    plus = ({n: _passed(s, "plus_passed").reindex(idx) for n, s in scores.items()}
            if all("plus_passed" in s for s in scores.values()) else None)
    n = len(idx)
    rows = []
    for name, other in (("fresh", "cached"), ("cached", "fresh")):
        revised = branched[f"revised_at_{name}"]
        row = {"branch": BRANCH_LABELS[name], "pairs": n,
               "pass_at_1": float(base[name].mean()) if n else np.nan}
        if plus is not None:
            row["pass_at_1_plus"] = float(plus[name].mean()) if n else np.nan
        row.update({"rev_at_follow": float(revised.notna().mean()) if n else np.nan,
                    "mean_revision_update": float(revised.mean()) if revised.notna().any() else np.nan,
                    "only_pass": int((base[name] & ~base[other]).sum()),
                    "mean_steps": float(branched[f"steps_{name}"].mean()) if n else np.nan,
                    "mean_nfe": float(branched[f"nfe_{name}"].mean()) if n else np.nan})
        if plus is not None:
            row["only_pass_plus"] = int((plus[name] & ~plus[other]).sum())
        rows.append(row)
    f, c = base["fresh"], base["cached"]
    paired = pd.DataFrame([{
        "problems": len(pairs), "pairs": n, "unbranched": len(pairs) - n,
        "both_pass": int((f & c).sum()), "only_fresh": int((f & ~c).sum()),
        "only_cached": int((~f & c).sum()), "neither": int((~f & ~c).sum()),
        "same_completion": int(branched["same_completion"].astype(bool).sum()),
        "mean_confidence": float(branched["confidence"].mean()) if n else np.nan}])
    return pd.DataFrame(rows), paired


def plot_intervention(table: pd.DataFrame, paired: pd.DataFrame, title: str, out: str | Path,
                      follow: int = 5) -> Path:
    """Left: Pass@1 and Rev.@follow per branch; right: the paired outcome counts."""
    plt = pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(8, 3.6), layout="constrained")
    metrics = [c for c in ("pass_at_1", "pass_at_1_plus", "rev_at_follow") if c in table]
    width = 0.8 / len(table)
    x = np.arange(len(metrics))
    for k, row in enumerate(table.itertuples(index=False)):
        left.bar(x + (k - (len(table) - 1) / 2) * width, [getattr(row, m) for m in metrics],
                 width, label=row.branch)
    left.set_xticks(x, [{"pass_at_1": "Pass@1", "pass_at_1_plus": "Pass@1 (plus)",
                         "rev_at_follow": f"Rev.@{follow}"}[m] for m in metrics])
    left.set_ylim(0, 1.05)
    left.legend(fontsize=8)
    counts = paired.iloc[0]
    names = ["both_pass", "only_fresh", "only_cached", "neither"]
    right.bar(range(4), [int(counts[c]) for c in names], color=["#55A868", "#4C72B0", "#DD8452", "0.6"])
    right.set_xticks(range(4), ["both pass", "only Fresh", "only Cached", "neither"], fontsize=8)
    right.set_ylabel(f"problems (of {int(counts['pairs'])} pairs)")
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, out)


def intervention_analysis(pairs: str | Path, fresh_scores: str | Path, cached_scores: str | Path,
                          out_table: str | Path, out_paired: str | Path, out_figure: str | Path,
                          label: str = "", follow: int = 5) -> dict:
    p = pd.read_parquet(pairs)
    table, paired = intervention_tables(p, pd.read_parquet(fresh_scores), pd.read_parquet(cached_scores))
    write_csv(table, out_table)
    write_csv(paired, out_paired)
    plot_intervention(table, paired, f"{label}: {int(paired['pairs'].iloc[0])} matched pairs "
                      f"(selected token followed for {follow} updates)", out_figure, follow)
    return paired.iloc[0].to_dict()
