"""HTML pages for the `snakemake --report` report, whose pages show HTML and images but only
offer other files (CSV) as downloads: summary.html (the "Summary" category; the summarize job
writes it beside summary.csv), plots/index.html (the report's landing page: the same summary and
every Pareto plot, embedded; the plot job writes it) and each mechanism analysis's tables.html
(its CSV tables).

The summary pages are generic over the summary's columns: the headline ones lead (backbone, task,
method, quality with its interval, speedup with its interval, the Pareto flag) in the first
table; below it, in a collapsed section, every column in the summary's order, those with one
value in every row (the environment, mostly) listed once instead. Above the tables: the
device(s) the samples were decoded on and the sandbox level(s) their code ran under, read from
the summary's environment and ``isolation`` columns (what ran, not what the campaign asked for).
The style is scoped to the pages' own elements, so the report can embed a page in its landing
page as it is.
"""
from __future__ import annotations

import base64
import html
import math
from pathlib import Path

import pandas as pd

from ..io import atomic_write_text

KEYS = ("backbone", "task", "method")
# (value, interval low, interval high, how the value reads, heading)
INTERVALS = (("quality", "quality_ci_low", "quality_ci_high", "{:.3f}", "quality [95% CI]"),
             ("speedup", "speedup_ci_low", "speedup_ci_high", "{:.2f}×", "speedup [95% CI]"))
FLAGS = ("pareto",)
CSS = """
.dlmpipe-summary{font:13px/1.4 system-ui,-apple-system,"Segoe UI",sans-serif;color:#1e293b;
  background:#fff;padding:8px 12px;max-width:100%;box-sizing:border-box}
.dlmpipe-summary h2{font-size:17px;margin:4px 0 8px}
.dlmpipe-summary h3{font-size:14px;margin:14px 0 6px}
.dlmpipe-summary p,.dlmpipe-summary ul{margin:4px 0}
.dlmpipe-summary .scroll{overflow-x:auto;max-width:100%}
.dlmpipe-summary table{border-collapse:collapse;margin:6px 0;font-size:13px;width:auto}
.dlmpipe-summary th,.dlmpipe-summary td{border:1px solid #cbd5e1;padding:3px 8px;
  text-align:right;white-space:nowrap;vertical-align:top}
.dlmpipe-summary th{background:#f1f5f9;font-weight:600}
.dlmpipe-summary td.text,.dlmpipe-summary th.text{text-align:left}
.dlmpipe-summary tr.front td{background:#eff6ff}
.dlmpipe-summary .warn{color:#a00;font-weight:600}
.dlmpipe-summary details summary{cursor:pointer;font-weight:600;margin:10px 0 4px}
.dlmpipe-summary dl{display:grid;grid-template-columns:max-content auto;gap:1px 12px;margin:4px 0}
.dlmpipe-summary dt{font-weight:600}.dlmpipe-summary dd{margin:0}
.dlmpipe-summary figure{margin:8px 0}.dlmpipe-summary figure img{max-width:100%;height:auto}
"""


def _missing(value) -> bool:
    if value is None or value is pd.NA or value is pd.NaT:
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def cell(value) -> str:
    """A value as the page shows it: numbers to 4 significant digits, flags as ✓, gaps as –."""
    if _missing(value) or (isinstance(value, str) and not value):
        return "–"
    if isinstance(value, bool) or (hasattr(value, "dtype") and value.dtype == bool):
        return "✓" if value else ""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _interval(row, value, low, high, fmt) -> str:
    if _missing(row.get(value)):
        return "–"
    text = fmt.format(row[value])
    if low in row and high in row and not _missing(row[low]) and not _missing(row[high]):
        number = fmt.replace("×", "")
        text += f" [{number.format(row[low])}, {number.format(row[high])}]"
    return text


def _distinct(series: pd.Series) -> list:
    return list(dict.fromkeys(v for v in series if not _missing(v) and v != ""))


def devices(summary: pd.DataFrame) -> list[str]:
    """Where the samples were decoded, from the rows' environment columns: the GPU (with its
    driver and CUDA version) or the CPU model, and torch's threads; one entry per distinct one."""
    out = []
    for _, row in summary.iterrows():
        gpu = row.get("gpu_name")
        if not _missing(gpu) and gpu:
            extra = [f"{k} {row[c]}" for k, c in (("driver", "gpu_driver"), ("CUDA", "cuda_version"))
                     if not _missing(row.get(c)) and row.get(c)]
            text = f"GPU {gpu}" + (f" ({', '.join(extra)})" if extra else "")
        elif not _missing(row.get("cpu_model")) and row.get("cpu_model"):
            text = f"CPU {row['cpu_model']}"
        else:
            continue
        threads = row.get("torch_threads")
        if not _missing(threads) and str(threads):
            text += f", {threads} torch thread{'s' if str(threads) != '1' else ''}"
        if text not in out:
            out.append(text)
    return out


def sandbox_levels(summary: pd.DataFrame) -> dict[str, list[str]]:
    """Each isolation level that scored some row -> the tasks it scored (``none``: no code ran)."""
    levels: dict[str, list[str]] = {}
    if "isolation" not in summary.columns:
        return levels
    for _, row in summary.iterrows():
        for level in str(row["isolation"]).split(","):
            if level and level not in ("nan", "<NA>"):
                tasks = levels.setdefault(level.strip(), [])
                task = str(row.get("task", ""))
                if task not in tasks:
                    tasks.append(task)
    return levels


def _ran_on(summary: pd.DataFrame) -> str:
    from ..scoring.levels import weaker_than_bwrap

    found = devices(summary)
    lines = [f"<p><b>Decoded on:</b> {html.escape('; '.join(found)) if found else 'not recorded'}</p>"]
    levels = sandbox_levels(summary)
    if levels:
        parts = []
        for level, tasks in sorted(levels.items(), key=lambda item: item[0] == "none"):
            what = "no code run" if level == "none" else f"code ran under <code>{html.escape(level)}</code>"
            weak = (' <span class="warn">(weaker than bubblewrap: see the "sandbox isolation" '
                    'page)</span>' if level != "none" and weaker_than_bwrap(level) else "")
            parts.append(f"{what} ({html.escape(', '.join(tasks))}){weak}")
        lines.append(f"<p><b>Sandbox of the scores:</b> {'; '.join(parts)}</p>")
    else:
        lines.append("<p><b>Sandbox of the scores:</b> not recorded</p>")
    if "fingerprint_warning" in summary.columns:
        warned = summary[summary["fingerprint_warning"].map(lambda v: not _missing(v) and bool(v))]
        if len(warned):
            items = "".join(f"<li>{html.escape(' / '.join(str(r[k]) for k in KEYS if k in r))}: "
                            f"{html.escape(str(r['fingerprint_warning']))}</li>"
                            for _, r in warned.iterrows())
            lines.append(f'<p class="warn">⚠ decoded in several environments:</p><ul>{items}</ul>')
    return "".join(lines)


def _table(header: list[tuple[str, bool]], rows: list[tuple[str, list[tuple[str, bool]]]]) -> str:
    """header: (heading, is_text); rows: (row class, [(cell, is_text)])."""
    head = "".join(f'<th class="{"text" if t else "num"}">{html.escape(h)}</th>' for h, t in header)
    body = "".join(f'<tr class="{cls}">' + "".join(
        f'<td class="{"text" if t else "num"}">{html.escape(v)}</td>' for v, t in cells) + "</tr>"
        for cls, cells in rows)
    return f'<div class="scroll"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _is_text(series: pd.Series) -> bool:
    return not (pd.api.types.is_numeric_dtype(series) and not pd.api.types.is_bool_dtype(series))


def headline_table(summary: pd.DataFrame) -> str:
    keys = [k for k in KEYS if k in summary.columns]
    intervals = [i for i in INTERVALS if i[0] in summary.columns]
    flags = [f for f in FLAGS if f in summary.columns]
    header = ([(k, True) for k in keys] + [(i[4], False) for i in intervals]
              + [(f, True) for f in flags])
    rows = []
    for _, row in summary.iterrows():
        cells = ([(cell(row[k]), True) for k in keys]
                 + [(_interval(row, *i[:4]), False) for i in intervals]
                 + [(cell(bool(row[f])) if not _missing(row[f]) else "–", True) for f in flags])
        front = "pareto" in row and not _missing(row["pareto"]) and bool(row["pareto"])
        rows.append(("front" if front else "", cells))
    return _table(header, rows)


def all_columns(summary: pd.DataFrame) -> str:
    """Every column, the headline ones first; those with one value in every row listed once."""
    lead = [c for c in (*KEYS, *(c for i in INTERVALS for c in i[:3]), *FLAGS) if c in summary.columns]
    order = lead + [c for c in summary.columns if c not in lead]
    constant = [c for c in order if c not in lead and len(summary) > 1
                and summary[c].map(cell).nunique() == 1]
    varying = [c for c in order if c not in constant]
    table = _table([(c, _is_text(summary[c])) for c in varying],
                   [("", [(cell(row[c]), _is_text(summary[c])) for c in varying])
                    for _, row in summary.iterrows()])
    same = "".join(f"<dt>{html.escape(c)}</dt><dd>{html.escape(cell(summary[c].iloc[0]))}</dd>"
                   for c in constant)
    return table + (f"<h3>The same in every row</h3><dl>{same}</dl>" if constant else "")


def _summary_section(summary: pd.DataFrame, title: str) -> str:
    return (f"<h2>{html.escape(title)}</h2>{_ran_on(summary)}"
            + (headline_table(summary) if len(summary) else "<p>The summary has no rows.</p>")
            + "<details><summary>Every column of summary.csv</summary>"
            + (all_columns(summary) if len(summary) else "") + "</details>")


def _page(title: str, body: str) -> str:
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>"
            f"{html.escape(title)}</title><style>{CSS}</style></head><body>"
            f'<div class="dlmpipe-summary">{body}</div></body></html>\n')


def summary_html(summary: pd.DataFrame, title: str = "Summary") -> str:
    return _page(title, _summary_section(summary, title))


def pareto_plots(summary: pd.DataFrame, plots: str | Path) -> list[tuple[str, str, Path]]:
    """(backbone, task, its plot) for every (backbone, task) of the summary that has one."""
    pairs = dict.fromkeys(zip(summary.get("backbone", []), summary.get("task", [])))
    return [(b, t, Path(plots) / f"pareto_{b}_{t}.png") for b, t in pairs
            if (Path(plots) / f"pareto_{b}_{t}.png").is_file()]


def headline_html(summary: pd.DataFrame, plots: str | Path) -> str:
    """The report's landing page: the summary page and every Pareto plot (embedded, so the
    page is whole also as a file of its own)."""
    figures = "".join(
        f'<figure><img alt="Pareto front {html.escape(b)} / {html.escape(t)}" '
        f'src="data:image/png;base64,{base64.b64encode(path.read_bytes()).decode()}">'
        f"</figure>" for b, t, path in pareto_plots(summary, plots))
    return _page("Results", _summary_section(summary, "Summary")
                 + (f"<h2>Pareto fronts</h2>{figures}" if figures else ""))


def csv_page(title: str, csvs: list[str | Path]) -> str:
    """Each CSV table under its file name, every column as it is."""
    sections = []
    for path in csvs:
        table = pd.read_csv(path)
        text = [_is_text(table[c]) for c in table.columns]
        body = (_table(list(zip(map(str, table.columns), text)),
                       [("", [(cell(v), t) for v, t in zip(row, text)])
                        for row in table.itertuples(index=False)])
                if len(table.columns) else "<p>(empty)</p>")
        sections.append(f"<h3>{html.escape(Path(path).name)}</h3>{body}")
    return _page(title, f"<h2>{html.escape(title)}</h2>" + "".join(sections))


def write_csv_page(title: str, csvs: list[str | Path], out: str | Path) -> None:
    atomic_write_text(out, csv_page(title, csvs))


def write_summary_html(summary: pd.DataFrame, out: str | Path) -> None:
    atomic_write_text(out, summary_html(summary))


def write_headline_html(summary: str | Path, plots: str | Path, out: str | Path) -> None:
    atomic_write_text(out, headline_html(pd.read_parquet(summary), plots))
