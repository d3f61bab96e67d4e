"""Shared plumbing of the analysis figures and tables: headless matplotlib, atomic writes."""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from ..io import atomic_write, atomic_write_text


def pyplot():
    """matplotlib.pyplot on the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, out: str | Path) -> Path:
    """Write ``fig`` as a PNG atomically and close it."""
    try:
        return atomic_write(out, lambda tmp: fig.savefig(tmp, format="png", dpi=150), fsync=False)
    finally:
        pyplot().close(fig)


def write_csv(table: pd.DataFrame, out: str | Path) -> Path:
    return atomic_write_text(out, table.to_csv(index=False, float_format="%.6g"), fsync=False)
