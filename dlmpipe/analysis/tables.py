"""Paper-style tables from the summary: one CSV, Markdown and HTML file per table.

- ``archer`` style (Archer's Tables 1 and 2): one row per (backbone, method); per task Pass@1 on
  the base tests and, where the task has them, on the extended tests (ET / "+") side by side,
  seconds per problem, and the speedup against each method of ``speedup_against`` (default: the
  reference method and every ``also_speedup_against`` method, i.e. the summary's ``speedup`` and
  ``speedup_vs_<m>`` columns, with their intervals when the summary has them); then Overall: the
  mean of the row's quality scores and the mean of its speedups over the table's tasks.
- ``spa`` style (SPA-Cache's Tables 2 to 5): one row per (task, method); per backbone the mean
  tokens per second with its ratio to the reference method's (or ``tps_against``'s: Dream's own
  vanilla decoding), the mean time to first token in
  milliseconds, and accuracy with its binomial standard error (``quality_se``).

Which rows, and which point of a sweep a row shows per task, follow the table's spec
(``table_spec.py``). The CSV holds the numbers (percent, seconds, milliseconds, ratios); the
Markdown and HTML hold the same numbers formatted as the papers print them.
"""
from __future__ import annotations

import html
import math
from pathlib import Path

import pandas as pd

from ..io import atomic_write_text
from .table_spec import Row, table_axes, table_rows

KEYS = ["backbone", "task", "method"]
MISSING = "–"


class Scope:
    """Where each method runs: ``scope`` maps a base method with ``backbones:``/``tasks:`` to
    those lists (the others run everywhere)."""

    def __init__(self, origin: dict[str, str], scope: dict[str, dict] | None = None):
        self.origin, self.scope = origin, scope or {}

    def runs(self, method: str, backbone: str, task: str) -> bool:
        s = self.scope.get(self.origin.get(method, method))
        return s is None or (backbone in s["backbones"] and task in s["tasks"])

    def lookup(self, summary: pd.DataFrame, backbone: str, task: str, method: str) -> pd.Series:
        """The summary's row; where the method does not run, one of NaNs (shown as "–")."""
        try:
            return summary.loc[(backbone, task, method)]
        except KeyError:
            if self.runs(method, backbone, task):
                raise ValueError(f"the summary has no row for backbone {backbone!r}, task "
                                 f"{task!r}, method {method!r}, which a table shows") from None
            return pd.Series(math.nan, index=summary.columns)

    def shows(self, row: Row, cells: list[tuple[str, str]]) -> bool:
        """A row is shown where its method runs on at least one of the cells."""
        return any(self.runs(row.methods[(b, t)], b, t) for b, t in cells)


def _speedup_column(against: str, reference: str) -> str:
    return "speedup" if against == reference else f"speedup_vs_{against}"


def default_speedups(summary: pd.DataFrame) -> list[str]:
    """The reference method, then every method of the summary's ``speedup_vs_<m>`` columns."""
    others = [c.removeprefix("speedup_vs_") for c in summary.columns
              if c.startswith("speedup_vs_") and not c.endswith(("_ci_low", "_ci_high"))]
    return [summary["reference"].iloc[0], *others]


def _mean(values: list[float]) -> float:
    """Mean that stays NaN when a value is missing (an Overall over fewer tasks would mislead)."""
    return sum(values) / len(values) if values and not any(map(math.isnan, values)) else math.nan


def _points_note(rows: list[Row], backbones: list[str], tasks: list[str]) -> list[str]:
    """One line per row that shows different sweep points per cell: which point, where."""
    notes = []
    for row in rows:
        if all(m == row.label for m in row.methods.values()):
            continue
        for b in backbones:
            cells = ", ".join(f"{t}: {row.methods[(b, t)]}" for t in tasks)
            notes.append(f"{row.label} on {b}: {cells}")
    return notes


def archer_table(summary: pd.DataFrame, spec: dict, origin: dict[str, str], backbones: list[str],
                 tasks: list[str], scope: dict | None = None) -> tuple[pd.DataFrame, list[str]]:
    """The numbers of an Archer-style table and its notes (operating points); ``scope``: the
    methods that run only on some backbones/tasks (``Scope``)."""
    where = Scope(origin, scope)
    backbones, tasks = table_axes(spec, backbones, tasks)
    rows = table_rows(spec, origin, backbones, tasks)
    reference = summary["reference"].iloc[0]
    against = spec.get("speedup_against") or default_speedups(summary)
    ext = spec.get("extended_label", "+")
    idx = summary.set_index(KEYS).sort_index()
    extended = {t: "quality_plus" in summary.columns
                and bool(summary.loc[summary["task"] == t, "quality_plus"].notna().any())
                for t in tasks}
    out = []
    for b in backbones:
        for row in rows:
            if not where.shows(row, [(b, t) for t in tasks]):
                continue
            line = {"backbone": b, "method": row.label}
            quality, speedups = [], {a: [] for a in against}
            for t in tasks:
                s = where.lookup(idx, b, t, row.methods[(b, t)])
                line[f"{t} base (%)"] = 100 * s["quality"]
                quality.append(line[f"{t} base (%)"])
                if extended[t]:
                    line[f"{t} {ext} (%)"] = 100 * s["quality_plus"]
                    quality.append(line[f"{t} {ext} (%)"])
                line[f"{t} time (s)"] = s["mean_time_s"]
                for a in against:
                    col = _speedup_column(a, reference)
                    label = f"{t} speedup vs {a} (x)"
                    line[label] = s[col]
                    speedups[a].append(s[col])
                    for end in ("ci_low", "ci_high"):
                        if f"{col}_{end}" in s.index:
                            line[f"{label} {end}"] = s[f"{col}_{end}"]
            line["overall quality (%)"] = _mean(quality)
            for a in against:
                line[f"overall speedup vs {a} (x)"] = _mean(speedups[a])
            out.append(line)
    return pd.DataFrame(out), _points_note(rows, backbones, tasks)


def spa_table(summary: pd.DataFrame, spec: dict, origin: dict[str, str], backbones: list[str],
              tasks: list[str], scope: dict | None = None) -> tuple[pd.DataFrame, list[str]]:
    """The numbers of a SPA-style table and its notes (operating points); ``scope`` as for
    ``archer_table``."""
    where = Scope(origin, scope)
    backbones, tasks = table_axes(spec, backbones, tasks)
    rows = table_rows(spec, origin, backbones, tasks)
    idx = summary.set_index(KEYS).sort_index()
    against = spec.get("tps_against") or summary["reference"].iloc[0]
    out = []
    for t in tasks:
        for row in rows:
            if not where.shows(row, [(b, t) for b in backbones]):
                continue
            line = {"task": t, "method": row.label}
            for b in backbones:
                s = where.lookup(idx, b, t, row.methods[(b, t)])
                line[f"{b} TPS"] = s["mean_tps"]
                line[f"{b} TPS vs {against} (x)"] = s["mean_tps"] / where.lookup(idx, b, t, against)["mean_tps"]
                line[f"{b} TTFT (ms)"] = 1000 * s["mean_ttft_s"]
                line[f"{b} accuracy (%)"] = 100 * s["quality"]
                line[f"{b} SE (%)"] = 100 * s["quality_se"]
                if "throughput_tps" in s.index:  # the timing stage's batched pass
                    line[f"{b} throughput (tok/s)"] = s["throughput_tps"]
                    line[f"{b} batch"] = s["batch_size"]
            out.append(line)
    return pd.DataFrame(out), _points_note(rows, backbones, tasks)


# ---- formatting: the numbers as the papers print them -------------------------------------------
def _fmt(value, digits: int = 2, suffix: str = "") -> str:
    return MISSING if value is None or pd.isna(value) else f"{value:.{digits}f}{suffix}"


def display_frame(numbers: pd.DataFrame, style: str) -> pd.DataFrame:
    """The formatted table: speedups as "2.57×" (with "[low, high]" when intervals exist),
    SPA's TPS as "190.73 (6.4×)" and accuracy as "78.24 ± 1.14"; missing values as "–"."""
    cols = list(numbers.columns)
    shown = {}
    for c in cols:
        if c.endswith(("ci_low", "ci_high")) or " SE (%)" in c or (style == "spa" and " TPS vs " in c):
            continue  # folded into the column they belong to
        values = numbers[c]
        if c.endswith("(x)"):
            low, high = f"{c} ci_low", f"{c} ci_high"
            shown[c.removesuffix(" (x)")] = [
                _fmt(v, suffix="×") + (f" [{_fmt(lo)}, {_fmt(hi)}]" if low in numbers
                                       and not pd.isna(lo) else "")
                for v, lo, hi in zip(values, numbers.get(low, values), numbers.get(high, values))]
        elif style == "spa" and c.endswith(" TPS"):
            ratio = next(k for k in cols if k.startswith(f"{c} vs "))
            shown[c] = [f"{_fmt(v)} ({_fmt(r, 1, '×')})" for v, r in zip(values, numbers[ratio])]
        elif c.endswith(" batch"):
            shown[c] = [MISSING if pd.isna(v) else str(int(v)) for v in values]
        elif c.endswith("TTFT (ms)"):
            shown[c] = [_fmt(v, 1) for v in values]
        elif style == "spa" and c.endswith(" accuracy (%)"):
            se = numbers[c.replace(" accuracy (%)", " SE (%)")]
            shown[c] = [_fmt(v) + ("" if pd.isna(e) else f" ± {_fmt(e)}") for v, e in zip(values, se)]
        elif pd.api.types.is_numeric_dtype(values):
            shown[c] = [_fmt(v) for v in values]
        else:
            shown[c] = values.tolist()
    return pd.DataFrame(shown)


TITLES = {"archer": "Archer-style: Pass@1 (%), seconds per problem and speedups per benchmark",
          "spa": "SPA-style: tokens per second (ratio to the reference), TTFT (ms), accuracy (%) ± SE"}


def render_markdown(name: str, style: str, shown: pd.DataFrame, notes: list[str]) -> str:
    text = f"## {name}\n\n{TITLES[style]}.\n\n{shown.to_markdown(index=False, disable_numparse=True)}\n"
    if notes:
        text += "\nOperating points:\n\n" + "".join(f"- {n}\n" for n in notes)
    return text


def render_html(name: str, style: str, shown: pd.DataFrame, notes: list[str]) -> str:
    items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(name)}</title>"
            "<style>table{border-collapse:collapse;font:13px sans-serif}td,th{border:1px solid #ccc;"
            "padding:3px 6px;text-align:right}</style></head><body>"
            f"<h2>{html.escape(name)}</h2><p>{html.escape(TITLES[style])}.</p>"
            f"{shown.to_html(index=False, border=0)}"
            + (f"<p>Operating points:</p><ul>{items}</ul>" if notes else "") + "</body></html>")


BUILDERS = {"archer": archer_table, "spa": spa_table}


def write_tables(summary: str | Path, tables: dict[str, dict], origin: dict[str, str],
                 backbones: list[str], tasks: list[str], out_dir: str | Path,
                 scope: dict | None = None) -> list[Path]:
    """``{name}.csv``, ``{name}.md`` and ``{name}.html`` in ``out_dir`` for every table."""
    table = pd.read_parquet(summary)
    out = Path(out_dir)
    written = []
    for name, spec in tables.items():
        style = spec["style"]
        numbers, notes = BUILDERS[style](table, spec, origin, backbones, tasks, scope)
        shown = display_frame(numbers, style)
        for suffix, text in (("csv", numbers.to_csv(index=False, float_format="%.6g")),
                             ("md", render_markdown(name, style, shown, notes)),
                             ("html", render_html(name, style, shown, notes))):
            path = out / f"{name}.{suffix}"
            atomic_write_text(path, text)
            written.append(path)
    return written
