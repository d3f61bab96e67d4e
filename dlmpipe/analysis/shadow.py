"""Decision-level cache validity from shadow probes (Archer Table 4; docs/ANALYSES.md).

From the probes of one (backbone, task, method): action disagreement and next-state distance
per anchor-distance bin (with counts), Spearman and partial Spearman correlations of anchor
distance and cache age with each outcome, whether the probed job reproduced the main
generations, and a figure. Reads parquet, writes CSV/PNG; no torch.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from .figures import pyplot, save_figure, write_csv

#: left-closed anchor-distance bin edges; the last bin is open-ended
DEFAULT_BINS = (0, 1, 2, 4, 8, 16, 32, 64, 128)
OUTCOMES = ("action_differs", "next_state_distance", "logit_drift_max")
#: columns of a generations row that a probed job must reproduce
TRAJECTORY = ("token_ids", "completion", "steps", "nfe", "refreshes", "cached_forwards", "revisions")


def bin_label(lo: float, hi: float | None) -> str:
    if hi is None:
        return f">={lo:g}"
    return f"{lo:g}" if hi - lo == 1 else f"{lo:g}-{hi - 1:g}"


def distance_bins(probes: pd.DataFrame, edges=DEFAULT_BINS) -> pd.DataFrame:
    """Probes by anchor-distance bin (left-closed; 0 is always the first edge): count (and how
    many were cached updates), disagreement rates, mean distances; every bin up to the last
    occupied one (empty: 0). The probe job chose the updates (``steps``: cached ones, or all)."""
    edges = sorted({0.0, *(float(e) for e in edges)})
    which = np.searchsorted(edges, probes["anchor_distance"].to_numpy(dtype=float), side="right") - 1
    last = int(which.max()) if len(which) else -1
    rows = []
    for b in range(max(last + 1, 1)):
        hi = edges[b + 1] if b + 1 < len(edges) else None
        part = probes[which == b]
        n = len(part)
        mean = (lambda c: float(part[c].mean()) if n else math.nan)  # noqa: E731
        rows.append({"distance_bin": bin_label(edges[b], hi), "distance_lo": edges[b],
                     "distance_hi": math.inf if hi is None else hi, "probes": n,
                     "cached": int(part["cached"].sum()),
                     "samples": int(part["sample_index"].nunique()),
                     "action_disagreement": mean("action_differs"),
                     "accepted_disagreement": mean("accepted_differs"),
                     "tokens_disagreement": mean("tokens_differ"),
                     "remasked_disagreement": mean("remasked_differs"),
                     "next_state_distance": mean("next_state_distance"),
                     "logit_drift_max": mean("logit_drift_max"),
                     "cache_age": mean("cache_age")})
    return pd.DataFrame(rows)


def _ranks(v) -> np.ndarray:
    return pd.Series(np.asarray(v, dtype=float)).rank(method="average").to_numpy()


def _pearson(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a - a.mean(), b - b.mean()
    denominator = math.sqrt(float((a * a).sum() * (b * b).sum()))
    return float((a * b).sum() / denominator) if denominator > 0 else math.nan


def spearman(x, y) -> float:
    """Spearman's rho: Pearson correlation of average ranks (ties share their mean rank)."""
    return _pearson(_ranks(x), _ranks(y))


def partial_spearman(x, y, z) -> float:
    """Spearman correlation of ``x`` and ``y`` controlling for ``z``: the partial correlation of
    their ranks, ``(r_xy - r_xz r_yz) / sqrt((1 - r_xz^2)(1 - r_yz^2))``; NaN when undefined
    (a constant variable, or ``z`` perfectly rank-correlated with either)."""
    rx, ry, rz = _ranks(x), _ranks(y), _ranks(z)
    r_xy, r_xz, r_yz = _pearson(rx, ry), _pearson(rx, rz), _pearson(ry, rz)
    denominator = (1 - r_xz ** 2) * (1 - r_yz ** 2)
    if not denominator > 0:
        return math.nan
    return (r_xy - r_xz * r_yz) / math.sqrt(denominator)


def correlations(probes: pd.DataFrame) -> pd.DataFrame:
    """Per outcome over the probes: Spearman with distance and with age, and the partial
    correlations distance | age and age | distance (Archer's 0.145 vs 0.040 / 0.045)."""
    d, a = probes["anchor_distance"], probes["cache_age"]
    rows = []
    for outcome in OUTCOMES:
        y = probes[outcome].astype(float)
        rows.append({"outcome": outcome, "probes": len(probes),
                     "spearman_distance": spearman(d, y), "spearman_age": spearman(a, y),
                     "partial_distance_given_age": partial_spearman(d, y, a),
                     "partial_age_given_distance": partial_spearman(a, y, d)})
    return pd.DataFrame(rows)


def reproduction(trajectory: pd.DataFrame, generations: pd.DataFrame) -> pd.DataFrame:
    """Per probed sample: whether the probed job's trajectory equals the main generations row
    (tokens, completion, steps, NFE, refreshes, cached forwards, revisions)."""
    main = generations.set_index("sample_index")
    rows = []
    for r in trajectory.itertuples(index=False):
        m = main.loc[r.sample_index] if r.sample_index in main.index else None
        equal = {c: m is not None and _same(getattr(r, c), m[c]) for c in TRAJECTORY}
        rows.append({"sample_index": r.sample_index, "task_id": r.task_id, **equal,
                     "reproduced": all(equal.values())})
    return pd.DataFrame(rows, columns=["sample_index", "task_id", *TRAJECTORY, "reproduced"])


def _same(a, b) -> bool:
    if isinstance(a, (list, np.ndarray)) or isinstance(b, (list, np.ndarray)):
        return list(a) == list(b)
    return a == b


def plot_disagreement(bins: pd.DataFrame, title: str, out: str | Path) -> Path:
    """Action disagreement per distance bin (bars, probe counts on top) and mean next-state
    distance (line, right axis)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.8), layout="constrained")
    x = np.arange(len(bins))
    ax.bar(x, bins["action_disagreement"].fillna(0), color="#4C72B0", label="action disagreement")
    for xi, (rate, n) in enumerate(zip(bins["action_disagreement"].fillna(0), bins["probes"])):
        ax.annotate(f"n={n}", (xi, rate), textcoords="offset points", xytext=(0, 3),
                    ha="center", fontsize=7)
    ax.set_ylim(0, 1.2)
    ax.set_xticks(x, bins["distance_bin"])
    ax.set_xlabel("anchor distance D_t (Hamming, response vs anchor)")
    ax.set_ylabel("share of probes whose action differs")
    right = ax.twinx()
    right.plot(x, bins["next_state_distance"], "o-", color="#DD8452", label="next-state distance")
    right.set_ylabel("mean next-state distance (tokens)")
    top = bins["next_state_distance"].max()
    right.set_ylim(0, 1.2 * max(float(top) if top == top else 0.0, 1.0))  # room for the legend
    handles = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    ax.legend(handles, [h.get_label() for h in handles], loc="upper center", ncol=2, fontsize=8)
    ax.set_title(title, fontsize=9)
    return save_figure(fig, out)


def shadow_analysis(probes: str | Path, trajectory: str | Path, generations: str | Path,
                    out_bins: str | Path, out_correlations: str | Path,
                    out_reproduction: str | Path, out_figure: str | Path,
                    edges=DEFAULT_BINS, label: str = "") -> dict:
    """The tables and the figure of one probed (backbone, task, method); returns a summary."""
    p = pd.read_parquet(probes)
    bins, corr = distance_bins(p, edges), correlations(p)
    rep = reproduction(pd.read_parquet(trajectory), pd.read_parquet(generations))
    write_csv(bins, out_bins)
    write_csv(corr, out_correlations)
    write_csv(rep, out_reproduction)
    reproduced = int(rep["reproduced"].sum())
    n_cached = int(p["cached"].sum())
    title = (f"{label}: {len(p)} probes ({n_cached} at cached updates) of {len(rep)} samples;\n"
             f"main trajectory reproduced for {reproduced}/{len(rep)}")
    plot_disagreement(bins, title, out_figure)
    if reproduced < len(rep):
        print(f"WARNING: the probed job's trajectory differs from the main generations for "
              f"{len(rep) - reproduced} of {len(rep)} samples (see {out_reproduction}); a shadow "
              "probe never changes the trajectory, so the two jobs decoded differently (another "
              "device or nondeterministic kernels)")
    return {"probes": len(p), "cached_probes": n_cached, "samples": len(rep),
            "reproduced": reproduced}
