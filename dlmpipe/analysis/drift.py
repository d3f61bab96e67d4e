"""The drift profile's table and figures (SPA-Cache Figures 1 and 2; docs/ANALYSES.md).

From the drift records of one (backbone, task, method): per layer and quantity the mean
step-to-step cosine similarity and the share of drifting tokens (similarity below tau), pooled
over every compared token of every update and sample; a similarity figure (per quantity, the
mean similarity of each layer at each update: Figure 1) and a drift-share figure (per layer,
with the uniform budget 0.25 and SPA-Cache's adaptive rho(l): Figure 2). No torch.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

from ..engine.spa_profiles import PROFILES, layer_budgets
from .figures import pyplot, save_figure, write_csv

SERIES_LABELS = {"input": "layer input", "proxy": "singular proxy", "value": "value vectors",
                 "ffn_output": "FFN output"}
UNIFORM_BUDGET = 0.25  # dLLM-Cache's fixed rho, the dashed line of SPA-Cache's Figure 2


def drift_layers(records: pd.DataFrame) -> pd.DataFrame:
    """One row per (layer, series): token-weighted mean similarity, the lowest similarity, the
    drifting share (tokens below tau / tokens compared) and the counts."""
    r = records.assign(weighted=records["mean_similarity"] * records["tokens"])
    g = r.groupby(["layer", "series"], sort=True)
    out = pd.DataFrame({"mean_similarity": g["weighted"].sum() / g["tokens"].sum(),
                        "min_similarity": g["min_similarity"].min(),
                        "drifting_share": g["drifting"].sum() / g["tokens"].sum(),
                        "drifting": g["drifting"].sum(), "tokens": g["tokens"].sum(),
                        "updates": g["update"].count()}).reset_index()
    order = {s: i for i, s in enumerate(SERIES_LABELS)}
    return out.sort_values(["layer", "series"], key=lambda c: c.map(order) if c.name == "series" else c,
                           ignore_index=True)


def plot_similarity(records: pd.DataFrame, title: str, out: str | Path) -> Path:
    """Per series a heatmap: mean step-to-step similarity of each layer (rows) at each update
    (columns), averaged over samples."""
    plt = pyplot()
    series = [s for s in SERIES_LABELS if s in set(records["series"])]
    fig, axes = plt.subplots(1, len(series), figsize=(3.2 * len(series), 3.4), squeeze=False,
                             layout="constrained", sharey=True)
    grid = records.groupby(["series", "layer", "update"])["mean_similarity"].mean()
    low = max(-1.0, float(records["mean_similarity"].min()))
    image = None
    for ax, s in zip(axes[0], series):
        table = grid.loc[s].unstack("update")
        image = ax.imshow(table.to_numpy(), aspect="auto", origin="lower", vmin=low, vmax=1.0,
                          cmap="viridis", interpolation="nearest",
                          extent=(table.columns.min() - 0.5, table.columns.max() + 0.5,
                                  -0.5, len(table) - 0.5))
        ax.set_title(SERIES_LABELS[s], fontsize=9)
        ax.set_xlabel("update")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0][0].set_ylabel("layer")
    axes[0][0].yaxis.set_major_locator(MaxNLocator(integer=True))
    fig.colorbar(image, ax=axes[0].tolist(), label="cosine similarity to the previous update")
    fig.suptitle(title, fontsize=9)
    return save_figure(fig, out)


def plot_drift_share(layers: pd.DataFrame, title: str, out: str | Path, tau: float,
                     profile: str | None = "llada-8b-instruct") -> Path:
    """Per layer the share of drifting tokens of each series (bars: FFN output), with the
    uniform budget 0.25 dashed and, when ``profile`` names one, SPA-Cache's adaptive rho(l)."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 3.6), layout="constrained")
    wide = layers.pivot(index="layer", columns="series", values="drifting_share")
    x = wide.index.to_numpy()
    if "ffn_output" in wide:
        ax.bar(x, wide["ffn_output"], color="#4C72B0", alpha=0.8, label=SERIES_LABELS["ffn_output"])
    styles = {"input": ("o-", "#55A868"), "proxy": ("s-", "#C44E52"), "value": ("^-", "#DD8452")}
    for s, (marker, color) in styles.items():
        if s in wide:
            ax.plot(x, wide[s], marker, color=color, label=SERIES_LABELS[s], markersize=4)
    if profile is not None:
        ax.plot(x, layer_budgets(len(x), profile), ":", color="#8172B2",
                label=f"adaptive rho(l) ({profile})")
    ax.axhline(UNIFORM_BUDGET, ls="--", color="gray", label=f"uniform rho = {UNIFORM_BUDGET}")
    ax.set_xlabel("layer")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(f"share of tokens with cos sim < {tau:g}")
    top = float(np.nanmax(wide.to_numpy())) if wide.size else 0.0
    ax.set_ylim(0, min(1.0, max(0.3, 1.15 * top)))
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title, fontsize=9)
    return save_figure(fig, out)


def drift_analysis(records: str | Path, out_table: str | Path, out_similarity: str | Path,
                   out_share: str | Path, tau: float = 0.95, label: str = "",
                   profile: str | None = "llada-8b-instruct") -> pd.DataFrame:
    if profile is not None and profile not in PROFILES:
        raise ValueError(f"unknown budget profile {profile!r}; known: {', '.join(PROFILES)}")
    r = pd.read_parquet(records)
    if r.empty:
        raise ValueError(f"{records}: no drift records (every sample finished in one update?)")
    layers = drift_layers(r)
    write_csv(layers, out_table)
    samples = r["sample_index"].nunique()
    plot_similarity(r, f"{label}: step-to-step similarity ({samples} samples)", out_similarity)
    plot_drift_share(layers, f"{label}: drifting tokens per layer ({samples} samples, tau {tau:g})",
                     out_share, tau, profile)
    return layers
