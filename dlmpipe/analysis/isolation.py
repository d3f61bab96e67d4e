"""How each summary row's code was isolated, and the report's warning when it was weaker than
bubblewrap (docs/SCORING.md, isolation levels).

The scores record one level per sample (``bwrap``, ``process+landlock+seccomp``, ...; ``none``
for exact-match and math tasks). The summary carries the distinct levels of each (backbone,
task, method) row; the report page written here names every row scored under a weaker level and
what that level leaves open, or states that every code score ran under bubblewrap.
"""
from __future__ import annotations

import html
from pathlib import Path

import pandas as pd

from ..io import atomic_write_text
from ..scoring.levels import level_caveats, weaker_than_bwrap


def isolation_levels(scores: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``keys`` + ``isolation``: each group's distinct levels, sorted, comma-separated."""
    return (scores.groupby(keys, sort=False)["isolation"]
            .agg(lambda levels: ",".join(sorted(set(map(str, levels))))).reset_index())


def weaker_rows(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary rows with a score from a level weaker than bubblewrap."""
    if "isolation" not in summary.columns:
        return summary.iloc[0:0]
    weak = summary["isolation"].map(lambda s: any(weaker_than_bwrap(x) for x in str(s).split(",")))
    return summary[weak]


def isolation_note(summary: pd.DataFrame) -> str:
    """An HTML page for the report: a warning listing the weaker rows, or the all-clear."""
    weak = weaker_rows(summary)
    if "isolation" not in summary.columns:
        body = "<p>The scores record no isolation level.</p>"
    elif weak.empty:
        body = ("<p>Every code score ran under bubblewrap (<code>bwrap</code>); exact-match and "
                "math scores run no code (<code>none</code>).</p>")
    else:
        levels = sorted({x for s in weak["isolation"] for x in s.split(",")
                         if weaker_than_bwrap(x)})
        caveats = "".join(f"<li><code>{html.escape(lv)}</code>: {html.escape(level_caveats(lv))}"
                          "</li>" for lv in levels)
        rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(r[c]))}</td>"
                                        for c in ("backbone", "task", "method", "isolation"))
                       + "</tr>" for _, r in weak.iterrows())
        body = (f'<p style="color:#a00;font-weight:bold">Warning: {len(weak)} of {len(summary)} '
                f"rows include scores of generated code that ran under an isolation level weaker "
                f"than bubblewrap (the campaign opted in with <code>sandbox:</code> or "
                f"<code>DLMPIPE_SANDBOX</code>).</p><p>What these levels leave open:</p>"
                f"<ul>{caveats}</ul><table border=1 cellpadding=3><tr><th>backbone</th>"
                f"<th>task</th><th>method</th><th>isolation</th></tr>{rows}</table>")
    return ("<!DOCTYPE html><html><head><meta charset='utf-8'><title>Sandbox isolation</title>"
            f"</head><body><h3>Sandbox isolation of the scores</h3>{body}</body></html>\n")


def write_isolation_note(summary: pd.DataFrame, out: str | Path) -> None:
    atomic_write_text(out, isolation_note(summary))
