"""Sweep figures: a swept method's quality, speedup and tokens per second against the swept
value, one PNG per (backbone, task, base method).

The x axis is the sweep's first key; further keys of a cartesian sweep become one line each.
Integer grids that grow geometrically (K, rank, refresh intervals) are drawn on a log2 axis, and
``inf`` (Archer's K = inf) sits one doubling past the largest finite value, labelled ∞;
fractions (rho, rho_p) stay linear; other values (budget: adaptive/uniform, identifiers) are
categories in sweep order. Error bars are the summary's when it has them: the quality's standard
error (``quality_se``) and the speedup's interval (``speedup_ci_low``/``_ci_high``). Dashed
lines mark the reference method.
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.ticker import PercentFormatter

INF = "inf"


def _is_number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) or v == INF


def x_positions(values: list) -> tuple[dict, bool]:
    """Each distinct value's position on the axis (in sweep order) and whether it is log2."""
    distinct = list(dict.fromkeys(values))
    if not all(map(_is_number, distinct)):
        return {v: float(i) for i, v in enumerate(distinct)}, False
    finite = sorted(float(v) for v in distinct if v != INF)
    log = (len(finite) > 1 and all(v > 0 and v.is_integer() for v in finite)
           and finite[-1] / finite[0] >= 4)
    if not finite:
        at_inf = 1.0
    elif log:
        at_inf = 2 * finite[-1]
    else:  # one mean spacing past the largest value
        at_inf = finite[-1] + ((finite[-1] - finite[0]) / (len(finite) - 1) if len(finite) > 1 else 1.0)
    return {v: at_inf if v == INF else float(v) for v in distinct}, log


def tick_label(value) -> str:
    return "∞" if value == INF else f"{value:g}" if _is_number(value) else str(value)


def _series(points: dict[str, list], keys: list[str]) -> dict[str, list[str]]:
    """Methods grouped by the values of every key after the first (one line each)."""
    groups: dict[str, list[str]] = {}
    for method, values in points.items():
        label = ", ".join(f"{k.rsplit('.', 1)[-1]}={v}" for k, v in zip(keys[1:], values[1:]))
        groups.setdefault(label, []).append(method)
    return groups


def plot_sweep(ax_rows, part: pd.DataFrame, base: str, entry: dict) -> None:
    """Draw one (backbone, task)'s sweep of ``base`` on the given axes (quality, speedup[, TPS])."""
    keys, points = entry["keys"], entry["points"]
    rows = part.set_index("method")
    first = {m: v[0] if isinstance(v[0], (str, int, float)) else str(v[0]) for m, v in points.items()}
    at, log = x_positions(list(first.values()))
    where = {m: at[first[m]] for m in points}
    reference = rows.iloc[0]["reference"]
    ref = rows.loc[reference] if reference in rows.index else None
    panels = [("quality", "quality (mean score)", "quality_se", None),
              ("speedup", f"speedup over {reference} (x)", None, ("speedup_ci_low", "speedup_ci_high")),
              ("tps", "tokens per second (timing stage)", None, None)][:len(ax_rows)]
    for ax, (col, ylabel, se, ci) in zip(ax_rows, panels):
        for label, methods in _series(points, keys).items():
            methods = sorted((m for m in methods if m in rows.index), key=where.get)
            xs, ys = [where[m] for m in methods], rows.loc[methods, col].astype(float).tolist()
            err = None
            if se and se in rows.columns:
                err = rows.loc[methods, se].astype(float).fillna(0).tolist()
            elif ci and ci[0] in rows.columns and rows.loc[methods, ci[0]].notna().any():
                lo = rows.loc[methods, ci[0]].astype(float)
                hi = rows.loc[methods, ci[1]].astype(float)
                y = rows.loc[methods, col].astype(float)
                err = [(y - lo).clip(lower=0).fillna(0).tolist(), (hi - y).clip(lower=0).fillna(0).tolist()]
            ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, label=label or base)
            if col == "quality" and "quality_plus" in rows.columns and rows.loc[methods, "quality_plus"].notna().any():
                ax.plot(xs, rows.loc[methods, "quality_plus"].astype(float).tolist(), marker="s",
                        linestyle=":", label=f"{label or base} (extended tests)")
        if ref is not None and not pd.isna(ref[col]):
            ax.axhline(float(ref[col]), color="0.5", linestyle="--", linewidth=1,
                       label=f"{reference}")
        ax.set_ylabel(ylabel)
        if col == "quality":
            ax.yaxis.set_major_formatter(PercentFormatter(1.0))
        ax.grid(True, alpha=0.3)
        if log:
            ax.set_xscale("log", base=2)
        ax.set_xticks(list(at.values()), [tick_label(v) for v in at])
        ax.minorticks_off()
    ax_rows[0].legend(fontsize=8, loc="best")
    ax_rows[-1].set_xlabel(keys[0] + (" (log scale)" if log else ""))


def plot_sweeps(summary: str | Path, sweeps: dict[str, dict], out_dir: str | Path) -> list[Path]:
    """``sweep_{backbone}_{task}_{base}.png`` in ``out_dir`` for every swept base method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = pd.read_parquet(summary)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for base, entry in sweeps.items():
        for (backbone, task), part in table.groupby(["backbone", "task"], sort=False):
            if not part["method"].isin(list(entry["points"])).any():
                continue
            has_tps = "tps" in part.columns and part["tps"].notna().any()
            fig, axes = plt.subplots(3 if has_tps else 2, 1, figsize=(6.5, 8 if has_tps else 6),
                                     sharex=True, layout="constrained")
            plot_sweep(list(axes), part, base, entry)
            fig.suptitle(f"{backbone} / {task}: {base} over {entry['keys'][0]} "
                         f"(n = {int(part['n'].max())})")
            path = out / f"sweep_{backbone}_{task}_{base}.png"
            fig.savefig(path, dpi=120)
            plt.close(fig)
            written.append(path)
    return written
