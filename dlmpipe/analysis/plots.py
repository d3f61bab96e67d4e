"""Quality-vs-speedup plots, one PNG per (backbone, task), with the Pareto front."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.ticker import PercentFormatter

from .pareto import front_steps


LABEL_OFFSETS = [(5, 4), (5, -11), (-5, 4), (-5, -11), (5, 15), (5, -22), (-5, 15), (-5, -22)]


def _coincident_groups(ax, part: pd.DataFrame, pixels: float = 4.0) -> list:
    """Points that land within a few pixels of each other share one label (one name a line):
    a sweep's methods often reach the same quality at nearly the same speed."""
    groups: list[list] = []
    for row in part.sort_values(["speedup", "quality"], ascending=[True, False]).itertuples(index=False):
        x, y = ax.transData.transform((row.speedup, row.quality))
        for g in groups:
            if abs(g[0] - x) <= pixels and abs(g[1] - y) <= pixels:
                g[2].append(row)
                break
        else:
            groups.append([x, y, [row]])
    return [rows[0]._replace(method="\n".join(r.method for r in rows)) for _, _, rows in groups]


def _label_points(ax, part: pd.DataFrame, fontsize: int = 8) -> None:
    """Name every point, moving a label to the first nearby slot that keeps it clear of the
    labels already placed (methods of one sweep often sit close together)."""
    fig = ax.figure
    fig.canvas.draw()
    scale = fig.dpi / 72  # points -> pixels
    placed: list[tuple[float, float, float, float]] = []
    for row in _coincident_groups(ax, part):
        x, y = ax.transData.transform((row.speedup, row.quality))
        lines = row.method.split("\n")
        w = 0.62 * fontsize * max(map(len, lines)) * scale
        h = 1.2 * fontsize * scale * len(lines)
        for dx, dy in LABEL_OFFSETS:
            x0 = x + dx * scale - (w if dx < 0 else 0)
            y0 = y + dy * scale
            box = (x0, y0, x0 + w, y0 + h)
            if not any(box[0] < b[2] and b[0] < box[2] and box[1] < b[3] and b[1] < box[3]
                       for b in placed):
                break
        else:
            dx, dy = LABEL_OFFSETS[0]
        placed.append(box)
        ax.annotate(row.method, (row.speedup, row.quality), textcoords="offset points",
                    xytext=(dx, dy), fontsize=fontsize, ha="right" if dx < 0 else "left")


def _axes_for(ax, part: pd.DataFrame, backbone: str, task: str) -> None:
    reference = part["reference"].iloc[0]
    on = part["pareto"].astype(bool)
    ax.axvline(1.0, color="0.6", linestyle="--", linewidth=1, label=f"reference ({reference})")
    ax.scatter(part.loc[~on, "speedup"], part.loc[~on, "quality"], color="tab:gray",
               s=36, zorder=3, label="dominated")
    ax.scatter(part.loc[on, "speedup"], part.loc[on, "quality"], color="tab:blue",
               s=48, zorder=4, label="Pareto-optimal")
    xs, ys = front_steps(part["quality"].tolist(), part["speedup"].tolist())
    ax.step(xs, ys, where="pre", color="tab:blue", linewidth=1.5, zorder=2, label="Pareto front")
    ax.set_xlabel(f"speedup over {reference} (x, mean time per sample)")
    ax.set_ylabel("quality (mean score)")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_title(f"{backbone} / {task}  (n = {int(part['n'].max())} per method)")
    lo, hi = part["quality"].min(), part["quality"].max()
    pad = max(0.05, 0.15 * (hi - lo))
    ax.set_ylim(max(lo - pad, 0.0) - 0.01, min(hi + pad, 1.0) + 0.01)
    ax.set_xlim(left=0, right=max(1.0, part["speedup"].max()) * 1.2)
    _label_points(ax, part)
    ax.grid(True, alpha=0.3)
    ax.legend(loc="best", fontsize=8, framealpha=0.9)


def plot_pareto(summary: str | Path, out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = pd.read_parquet(summary)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for (backbone, task), part in table.groupby(["backbone", "task"], sort=False):
        fig, ax = plt.subplots(figsize=(7, 5), layout="constrained")
        _axes_for(ax, part, backbone, task)
        path = out / f"pareto_{backbone}_{task}.png"
        fig.savefig(path, dpi=150)
        plt.close(fig)
        written.append(path)
    return written
