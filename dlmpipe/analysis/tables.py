"""Paper-style tables from the summary: one CSV, Markdown and HTML file per table.

- ``archer`` style (Archer's Tables 1 and 2): one row per (backbone, method); per task Pass@1 on
  the base tests and, where the task has them, on the extended tests (ET / "+") side by side,
  seconds per problem, and the speedup against each method of ``speedup_against`` (default: the
  reference method and every ``also_speedup_against`` method, i.e. the summary's ``speedup`` and
  ``speedup_vs_<m>`` columns, with their intervals when the summary has them); then Overall: the
  mean of the row's quality scores and the mean of its speedups over the table's tasks.
- ``spa`` style (SPA-Cache's Tables 2 to 5): one row per (task, method); per backbone tokens per
  second with its ratio to the reference method's (or ``tps_against``'s: Dream's own vanilla
  decoding), the time to first token in milliseconds, and accuracy with its binomial standard
  error (``quality_se``).

Every time, TPS and speedup comes from the timing stage on one clock (``speedup.py``): batch-1
latency per problem as the geometric mean over the timed samples, so in every row the reference's
latency over the row's equals its speedup, and its TPS ratio equals it too where both decode the
same response length. The generate jobs' times (``job_time_s``) are their cost, not shown here.

Which rows, and which point of a sweep a row shows per task, follow the table's spec
(``table_spec.py``). The CSV holds the numbers (percent, seconds, milliseconds, ratios); the
Markdown and HTML hold the same numbers formatted as the papers print them.

Where the spec carries the paper's numbers (``reported``), each such cell is printed beside
them: the CSV adds ``<col> reported``, ``<col> diff`` (measured - reported) and ``<col> flag``
(|diff| beyond the tolerance), the Markdown and HTML show "measured (paper reported, diff ✓/✗)"
and end with a reproduction summary. A row whose summary rows mix environments
(``fingerprint_warning``, dlmpipe/analysis/summary.py) is marked ⚠ and its warning listed.
"""
from __future__ import annotations

import html
import math
from pathlib import Path

import pandas as pd

from ..io import atomic_write_text
from .table_spec import (Row, column_unit, reported_cells, row_axis, table_axes, table_rows,
                         tolerance_for)

KEYS = ["backbone", "task", "method"]
MISSING = "–"
WARNING = "environment warning"  # column of the rows whose numbers mix environments
WITHIN, OUTSIDE, MIXED = "✓", "✗", "⚠"


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


def _warn(warnings: list[str], s: pd.Series, backbone: str, task: str, method: str) -> None:
    """Collect the summary row's environment warning (empty where its samples share one)."""
    w = s.get("fingerprint_warning")
    if isinstance(w, str) and w:
        warnings.append(f"{backbone}/{task}/{method}: {w}")


def _with_warnings(out: list[dict]) -> pd.DataFrame:
    """The rows; the warning column only where some row has a warning."""
    numbers = pd.DataFrame(out)
    if WARNING in numbers.columns and not numbers[WARNING].astype(bool).any():
        numbers = numbers.drop(columns=WARNING)
    return numbers


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
            quality, speedups, warnings = [], {a: [] for a in against}, []
            for t in tasks:
                s = where.lookup(idx, b, t, row.methods[(b, t)])
                _warn(warnings, s, b, t, row.methods[(b, t)])
                line[f"{t} base (%)"] = 100 * s["quality"]
                quality.append(line[f"{t} base (%)"])
                if extended[t]:
                    line[f"{t} {ext} (%)"] = 100 * s["quality_plus"]
                    quality.append(line[f"{t} {ext} (%)"])
                line[f"{t} latency (s)"] = s["latency_s"]
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
            line[WARNING] = "; ".join(warnings)
            out.append(line)
    return _with_warnings(out), _points_note(rows, backbones, tasks)


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
            line, warnings = {"task": t, "method": row.label}, []
            for b in backbones:
                s = where.lookup(idx, b, t, row.methods[(b, t)])
                _warn(warnings, s, b, t, row.methods[(b, t)])
                line[f"{b} TPS"] = s["tps"]
                line[f"{b} TPS vs {against} (x)"] = s["tps"] / where.lookup(idx, b, t, against)["tps"]
                line[f"{b} TTFT (ms)"] = 1000 * s["ttft_s"]
                line[f"{b} accuracy (%)"] = 100 * s["quality"]
                line[f"{b} SE (%)"] = 100 * s["quality_se"]
                if "throughput_tps" in s.index:  # the timing stage's batched pass
                    line[f"{b} throughput (tok/s)"] = s["throughput_tps"]
                    line[f"{b} batch"] = s["batch_size"]
            line[WARNING] = "; ".join(warnings)
            out.append(line)
    return _with_warnings(out), _points_note(rows, backbones, tasks)


# ---- the paper's reported numbers beside the measured ones --------------------------------------
REPORTED_ENDS = (" reported", " diff", " flag")


def compare_reported(numbers: pd.DataFrame, spec: dict) -> tuple[pd.DataFrame, dict]:
    """``numbers`` with ``<col> reported``, ``<col> diff`` (measured - reported, in the column's
    unit) and ``<col> flag`` (True where |diff| exceeds the column's tolerance; empty where a
    side is missing) after each column the spec reports, and the reproduction counts: reported
    cells, compared (both sides present), within tolerance, outside, not measured."""
    cells = reported_cells(spec)
    axis = row_axis(spec["style"])
    counts = {"reported": len(cells), "compared": 0, "within": 0, "outside": 0, "unmeasured": 0}
    if not cells:
        return numbers, counts
    numbers = numbers.copy()
    keys = list(zip(numbers[axis], numbers["method"])) if len(numbers) else []
    found = set()
    for col in dict.fromkeys(c for _, _, c in cells):
        if col not in numbers.columns:  # e.g. extended tests the run does not have
            numbers[col] = math.nan
        reported = [cells.get((o, m, col), math.nan) for o, m in keys]
        found |= {(o, m, col) for o, m in keys if (o, m, col) in cells}
        kind, amount = tolerance_for(spec, col)
        diffs, flags = [], []
        for measured, rep in zip(numbers[col].astype(float), reported):
            diff = measured - rep
            diffs.append(diff)
            if pd.isna(diff):
                flags.append(None)
                counts["unmeasured"] += not pd.isna(rep)
                continue
            bound = amount if kind == "absolute" else amount * abs(rep)
            flags.append(bool(abs(diff) > bound + 1e-9))
            counts["compared"] += 1
            counts["outside" if flags[-1] else "within"] += 1
        numbers[f"{col} reported"], numbers[f"{col} diff"] = reported, diffs
        numbers[f"{col} flag"] = pd.Series(flags, index=numbers.index, dtype="object")
    counts["unmeasured"] += len(set(cells) - found)  # rows the table does not show
    order = []
    for c in numbers.columns:
        if not c.endswith(REPORTED_ENDS):
            order += [c] + [f"{c}{e}" for e in REPORTED_ENDS if f"{c}{e}" in numbers.columns]
    return numbers[order], counts


def _tolerance_text(spec: dict, columns: list[str]) -> str:
    """The tolerances the reported columns use, by unit (or by column where one has its own):
    "±2 points (%); ±15% (x)"."""
    own = spec.get("tolerance") or {}
    seen = {}
    for c in columns:
        kind, amount = tolerance_for(spec, c)
        unit = column_unit(c)
        amount_text = (f"±{amount:g} {'points' if unit == '%' else unit}" if kind == "absolute"
                       else f"±{100 * amount:g}%")
        seen.setdefault(f"{amount_text} ({c if c in own else unit})", None)
    return "; ".join(seen)


def reproduction_summary(counts: dict, spec: dict) -> str:
    """One line: how many reported cells were compared, and how many are within tolerance."""
    if not counts["reported"]:
        return ""
    columns = list(dict.fromkeys(c for _, _, c in reported_cells(spec)))
    text = (f"Reproduction: {counts['compared']} of {counts['reported']} reported cells compared, "
            f"{counts['within']} within tolerance {WITHIN}, {counts['outside']} outside {OUTSIDE}")
    if counts["unmeasured"]:
        text += f", {counts['unmeasured']} without a measurement"
    return text + f". Tolerance: {_tolerance_text(spec, columns)}."


# ---- formatting: the numbers as the papers print them -------------------------------------------
def _fmt(value, digits: int = 2, suffix: str = "") -> str:
    return MISSING if value is None or pd.isna(value) else f"{value:.{digits}f}{suffix}"


def _beside(numbers: pd.DataFrame, col: str, texts: list[str], digits: int = 2,
            suffix: str = "") -> list[str]:
    """``texts`` with the paper's value, the difference and the verdict where ``col`` has a
    reported value: "41.20 (paper 42.07, -0.87 ✓)"."""
    if f"{col} reported" not in numbers.columns:
        return texts
    out = []
    for text, rep, diff, flag in zip(texts, numbers[f"{col} reported"], numbers[f"{col} diff"],
                                     numbers[f"{col} flag"]):
        if pd.isna(rep):
            out.append(text)
            continue
        verdict = ("" if flag is None or pd.isna(flag)
                   else f"{diff:+.{digits}f} {OUTSIDE if flag else WITHIN}")
        out.append(f"{text} (paper {_fmt(rep, digits, suffix)}" + (f", {verdict})" if verdict else ")"))
    return out


def display_frame(numbers: pd.DataFrame, style: str) -> pd.DataFrame:
    """The formatted table: speedups as "2.57×" (with "[low, high]" when intervals exist),
    SPA's TPS as "190.73 (6.4×)" and accuracy as "78.24 ± 1.14"; missing values as "–"."""
    cols = list(numbers.columns)
    shown = {}
    for c in cols:
        if (c.endswith(("ci_low", "ci_high", *REPORTED_ENDS)) or " SE (%)" in c or c == WARNING
                or (style == "spa" and " TPS vs " in c)):
            continue  # folded into the column they belong to
        values = numbers[c]
        if c.endswith("(x)"):
            low, high = f"{c} ci_low", f"{c} ci_high"
            shown[c.removesuffix(" (x)")] = _beside(numbers, c, [
                _fmt(v, suffix="×") + (f" [{_fmt(lo)}, {_fmt(hi)}]" if low in numbers
                                       and not pd.isna(lo) else "")
                for v, lo, hi in zip(values, numbers.get(low, values), numbers.get(high, values))],
                suffix="×")
        elif style == "spa" and c.endswith(" TPS"):
            ratio = next(k for k in cols if k.startswith(f"{c} vs "))
            shown[c] = _beside(numbers, ratio, _beside(numbers, c, [
                f"{_fmt(v)} ({_fmt(r, 1, '×')})" for v, r in zip(values, numbers[ratio])]),
                digits=1, suffix="×")
        elif c.endswith(" batch"):
            shown[c] = [MISSING if pd.isna(v) else str(int(v)) for v in values]
        elif c.endswith("TTFT (ms)"):
            shown[c] = _beside(numbers, c, [_fmt(v, 1) for v in values], digits=1)
        elif style == "spa" and c.endswith(" accuracy (%)"):
            se = numbers[c.replace(" accuracy (%)", " SE (%)")]
            shown[c] = _beside(numbers, c, [_fmt(v) + ("" if pd.isna(e) else f" ± {_fmt(e)}")
                                            for v, e in zip(values, se)])
        elif pd.api.types.is_numeric_dtype(values):
            shown[c] = _beside(numbers, c, [_fmt(v) for v in values])
        else:
            shown[c] = values.tolist()
    if WARNING in numbers.columns:  # the rows whose numbers mix environments
        shown["method"] = [f"{m} {MIXED}" if w else m
                           for m, w in zip(shown["method"], numbers[WARNING].fillna(""))]
    return pd.DataFrame(shown)


TITLES = {"archer": "Archer-style: Pass@1 (%), latency per problem (s) and speedups per benchmark",
          "spa": "SPA-style: tokens per second (ratio to the reference), TTFT (ms), accuracy (%) ± SE"}
#: what every speed figure of a table is (docs/METHODS.md §3), printed under it
TIMING_NOTE = ("Speed figures come from the timing stage (paired with the reference, alternating, "
               "batch 1; dlmpipe/analysis/speedup.py): latency and TTFT are geometric means over "
               "the {samples} timed samples of each sample's median over the repeats, on the "
               "clock of the reference's own run; TPS is the response length G over that latency; "
               "speedups are geometric means of the per-sample paired ratios with 95% bootstrap "
               "intervals [low, high], so the reference's latency over a row's equals its speedup. "
               "Throughput (where shown): one pass at the batch size, in the method's own run.")


ENVIRONMENT_NOTE = (f"{MIXED} Numbers of these rows come from samples decoded in different "
                    "environments (dlmpipe/environment.py); compare them with care:")


def render_markdown(name: str, style: str, shown: pd.DataFrame, notes: list[str],
                    reproduction: str = "", warnings: list[str] = (), timing: str = "") -> str:
    text = f"## {name}\n\n{TITLES[style]}.\n\n{shown.to_markdown(index=False, disable_numparse=True)}\n"
    if timing:
        text += f"\n{timing}\n"
    if reproduction:
        text += f"\n{reproduction}\n"
    if notes:
        text += "\nOperating points:\n\n" + "".join(f"- {n}\n" for n in notes)
    if warnings:
        text += f"\n{ENVIRONMENT_NOTE}\n\n" + "".join(f"- {w}\n" for w in warnings)
    return text


def render_html(name: str, style: str, shown: pd.DataFrame, notes: list[str],
                reproduction: str = "", warnings: list[str] = (), timing: str = "") -> str:
    def items(lines):
        return "<ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in lines) + "</ul>"
    return (f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(name)}</title>"
            "<style>table{border-collapse:collapse;font:13px sans-serif}td,th{border:1px solid #ccc;"
            "padding:3px 6px;text-align:right}</style></head><body>"
            f"<h2>{html.escape(name)}</h2><p>{html.escape(TITLES[style])}.</p>"
            f"{shown.to_html(index=False, border=0)}"
            + (f"<p>{html.escape(timing)}</p>" if timing else "")
            + (f"<p>{html.escape(reproduction)}</p>" if reproduction else "")
            + (f"<p>Operating points:</p>{items(notes)}" if notes else "")
            + (f"<p>{html.escape(ENVIRONMENT_NOTE)}</p>{items(warnings)}" if warnings else "")
            + "</body></html>")


BUILDERS = {"archer": archer_table, "spa": spa_table}


def timing_note(summary: pd.DataFrame) -> str:
    """What the speed figures are, with the number of timed samples; without timing (a summary
    made without the timing stage) what is missing."""
    timed = summary["timed_samples"] if "timed_samples" in summary.columns else pd.Series([0])
    if not (timed > 0).any():
        return ("No timing stage: the speed columns are empty (the generate jobs' times are their "
                "cost, not a method's speed).")
    low, high = int(timed[timed > 0].min()), int(timed.max())
    return TIMING_NOTE.format(samples=low if low == high else f"{low}-{high}")


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
        numbers, counts = compare_reported(numbers, spec)
        reproduction = reproduction_summary(counts, spec)
        warnings = ([w for ws in numbers[WARNING].fillna("") if ws for w in ws.split("; ")]
                    if WARNING in numbers.columns else [])
        shown = display_frame(numbers, style)
        timing = timing_note(table)
        for suffix, text in (("csv", numbers.to_csv(index=False, float_format="%.6g")),
                             ("md", render_markdown(name, style, shown, notes, reproduction, warnings,
                                                    timing)),
                             ("html", render_html(name, style, shown, notes, reproduction, warnings,
                                                  timing))):
            path = out / f"{name}.{suffix}"
            atomic_write_text(path, text)
            written.append(path)
        if reproduction:
            print(f"{name}: {reproduction}", flush=True)
    return written
