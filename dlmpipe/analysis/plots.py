"""Quality-vs-speedup plots, one PNG per (backbone, task): error bars, the Pareto front, and
numbered points with a table beside the axes naming each method.

Quality bars are +- one standard error; speedup bars are the timing stage's 95% interval. The
front is drawn through the point estimates (``pareto``); points off it whose bars reach it
(``overlaps_front``) are drawn apart from the clearly dominated ones. Each point is labelled
with its number only, placed by a greedy search over rings of positions around the point so
that no label overlaps another label or any marker; the table carries names and numbers.
"""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from matplotlib.ticker import FuncFormatter, PercentFormatter

from .pareto import front_steps

STYLE = {  # role -> (colour, marker size, legend label)
    "front": ("tab:blue", 60, "Pareto-optimal"),
    "near": ("tab:orange", 50, "within error of the front"),
    "dominated": ("0.55", 40, "dominated"),
}


def _role(row) -> str:
    if bool(row.pareto):
        return "front"
    return "near" if bool(getattr(row, "overlaps_front", False)) else "dominated"


def _speedup_bounds(part: pd.DataFrame) -> tuple[pd.Series, pd.Series]:
    lo = part["speedup_ci_low"] if "speedup_ci_low" in part else part["speedup"]
    hi = part["speedup_ci_high"] if "speedup_ci_high" in part else part["speedup"]
    return lo.fillna(part["speedup"]), hi.fillna(part["speedup"])


def _overlap(a, b) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _ring_offsets(step: float, rings: int = 40, directions: int = 12):
    """Candidate label offsets in pixels: rings of growing radius, evenly spread directions."""
    for r in range(1, rings + 1):
        for k in range(directions):
            angle = 2 * math.pi * k / directions + (math.pi / directions) * (r % 2)
            yield r, (r * step * math.cos(angle), r * step * math.sin(angle))


def place_labels(ax, xs, ys, labels, fontsize: int = 8) -> list:
    """Number every point without overlaps: each label goes to the first position, on rings of
    growing radius around its point, whose box clears the labels already placed and every
    marker; a label moved beyond the first ring gets a leader line to its point."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    pts = [ax.transData.transform((x, y)) for x, y in zip(xs, ys)]
    marker = 5.0 * fig.dpi / 72  # half the marker's extent in pixels
    obstacles = [(px - marker, py - marker, px + marker, py + marker) for px, py in pts]
    placed, texts = [], []
    for (px, py), (x, y), label in zip(pts, zip(xs, ys), labels):
        text = ax.text(x, y, label, fontsize=fontsize, ha="center", va="center", zorder=6)
        bbox = text.get_window_extent(renderer)
        w, h = bbox.width + 2, bbox.height + 2
        for ring, (dx, dy) in _ring_offsets(step=max(w, h) * 0.9):
            box = (px + dx - w / 2, py + dy - h / 2, px + dx + w / 2, py + dy + h / 2)
            if not any(_overlap(box, b) for b in placed + obstacles):
                break
        placed.append(box)
        text.set_position(ax.transData.inverted().transform((px + dx, py + dy)))
        if ring > 1:
            ax.annotate("", (x, y), ax.transData.inverted().transform((px + dx, py + dy)),
                        arrowprops={"arrowstyle": "-", "color": "0.5", "lw": 0.6,
                                    "shrinkA": 4, "shrinkB": 3}, zorder=1)
        texts.append(text)
    return texts


def _table(ax, part: pd.DataFrame, numbers: list[int]) -> None:
    ax.axis("off")
    rows = []
    lo, hi = _speedup_bounds(part)
    for number, row, s_lo, s_hi in zip(numbers, part.itertuples(index=False), lo, hi):
        interval = "" if s_lo == s_hi == row.speedup else f" [{s_lo:.2f}, {s_hi:.2f}]"
        rows.append([str(number), row.method, f"{row.quality:.0%} ± {row.quality_se:.0%}",
                     f"{row.speedup:.2f}x{interval}",
                     {"front": "front", "near": "near"}.get(_role(row), "")])
    table = ax.table(cellText=rows, colLabels=["#", "method", "quality ± SE", "speedup [95% CI]", ""],
                     loc="upper center", cellLoc="left", colLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7.5)
    table.auto_set_column_width(list(range(5)))
    for (r, _), cell in table.get_celld().items():
        cell.set_linewidth(0.3)
        if r > 0 and rows[r - 1][4]:
            cell.set_facecolor({"front": "#dbe8f6", "near": "#fde6cf"}[rows[r - 1][4]])


def pareto_figure(part: pd.DataFrame, backbone: str, task: str):
    """The figure for one (backbone, task); returns (figure, plot axes, label texts)."""
    import matplotlib.pyplot as plt

    part = part.reset_index(drop=True)
    numbers = list(range(1, len(part) + 1))  # campaign order: the same number on every plot
    fig, (ax, tab) = plt.subplots(1, 2, figsize=(13, 6), width_ratios=[1.25, 1],
                                  layout="constrained")
    reference = part["reference"].iloc[0]
    lo, hi = _speedup_bounds(part)
    ax.axvline(1.0, color="0.6", linestyle="--", linewidth=1, label=f"reference ({reference})")
    roles = [_role(r) for r in part.itertuples(index=False)]
    for role, (colour, size, label) in STYLE.items():
        sel = [r == role for r in roles]
        if not any(sel):
            continue
        p = part[sel]
        ax.errorbar(p["speedup"], p["quality"], yerr=p["quality_se"],
                    xerr=[p["speedup"] - lo[sel], hi[sel] - p["speedup"]], fmt="none",
                    ecolor=colour, elinewidth=0.9, capsize=2, alpha=0.7, zorder=2)
        ax.scatter(p["speedup"], p["quality"], color=colour, s=size, zorder=4, label=label,
                   edgecolors="white", linewidths=0.6)
    xs, ys = front_steps(part["quality"].tolist(), part["speedup"].tolist())
    ax.step(xs, ys, where="pre", color="tab:blue", linewidth=1.3, zorder=3, label="Pareto front (estimates)")
    timed = "timed" if part["speedup_ci_low"].notna().all() else "mean time"
    ax.set_xlabel(f"speedup over {reference} (timing stage: paired geometric mean, 95% CI; log scale)" if timed == "timed"
                  else f"speedup over {reference} (generate jobs' mean times, untimed; log scale)")
    ax.set_ylabel("quality (mean score ± SE)")
    ax.yaxis.set_major_formatter(PercentFormatter(1.0))
    ax.set_title(f"{backbone} / {task}  (n = {int(part['n'].max())} per method)")
    q_lo = (part["quality"] - part["quality_se"]).min()
    q_hi = (part["quality"] + part["quality_se"]).max()
    pad = max(0.04, 0.12 * (q_hi - q_lo))
    ax.set_ylim(max(q_lo - pad, 0.0) - 0.02, min(q_hi + pad, 1.0) + 0.06)
    # speedups are ratios: a log axis gives 1.3x and 1.5x room next to 30x
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_xlim(min(1.0, lo.min()) / 1.3, max(1.0, hi.max()) * 1.3)
    ax.grid(True, alpha=0.3)
    _table(tab, part, numbers)
    handles, labels = ax.get_legend_handles_labels()
    tab.legend(handles, labels, loc="lower center", fontsize=7.5, ncols=2, frameon=False)
    # label the front first (it gets the closest free spots), then the rest, fastest first
    order = sorted(range(len(part)), key=lambda i: (("front", "near", "dominated").index(roles[i]),
                                                     -part["speedup"].iloc[i]))
    texts = place_labels(ax, [part["speedup"].iloc[i] for i in order],
                         [part["quality"].iloc[i] for i in order], [str(numbers[i]) for i in order])
    fig.set_layout_engine("none")  # keep the axes where the labels were placed
    return fig, ax, texts


def plot_pareto(summary: str | Path, out_dir: str | Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = pd.read_parquet(summary)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for (backbone, task), part in table.groupby(["backbone", "task"], sort=False):
        fig, _, _ = pareto_figure(part, backbone, task)
        path = out / f"pareto_{backbone}_{task}.png"
        fig.savefig(path, dpi=150)
        plt.close(fig)
        written.append(path)
    return written
