"""The job commands that turn results into the report: the mechanism analyses' tables and figures
(shadow, intervention, drift) and the summary, plots, headline, tables and sweep figures. No
model runs here and nothing imports torch. Split from jobs.py (which registers these through
``register_analyses`` and ``register_reports``, in that order of its listing).
"""
from __future__ import annotations

import argparse
import json


def _shadow_analysis(a: argparse.Namespace) -> None:
    from ..analysis.shadow import shadow_analysis

    print(shadow_analysis(a.probes, a.trajectory, a.generations, a.out_bins, a.out_correlations,
                          a.out_reproduction, a.out_figure, edges=json.loads(a.bins), label=a.label))


def _intervention_analysis(a: argparse.Namespace) -> None:
    from ..analysis.intervention import intervention_analysis

    print(intervention_analysis(a.pairs, a.fresh_scores, a.cached_scores, a.out_table,
                                a.out_paired, a.out_figure, label=a.label, follow=a.follow))


def _drift_analysis(a: argparse.Namespace) -> None:
    from ..analysis.drift import drift_analysis

    print(drift_analysis(a.records, a.out_table, a.out_similarity, a.out_share, tau=a.tau,
                         label=a.label, profile=a.profile or None).to_string(index=False))


def _summarize(a: argparse.Namespace) -> None:
    from ..analysis.summary import summarize

    table = summarize(a.scores, reference=a.reference, out_parquet=a.out_parquet,
                      out_csv=a.out_csv, also_against=a.also_against, timing=a.timing,
                      seed=a.seed)
    if a.out_isolation:
        from ..analysis.isolation import write_isolation_note

        write_isolation_note(table, a.out_isolation)
    if a.out_html:
        from ..analysis.report_html import write_summary_html

        write_summary_html(table, a.out_html)


def _plot(a: argparse.Namespace) -> None:
    from ..analysis.plots import plot_pareto

    plot_pareto(a.summary, a.out_dir)


def _headline(a: argparse.Namespace) -> None:
    from ..analysis.report_html import write_headline_html

    write_headline_html(a.summary, a.plots, a.out)


def _csv_page(a: argparse.Namespace) -> None:
    from ..analysis.report_html import write_csv_page

    write_csv_page(a.title, a.csv, a.out)


def _tables(a: argparse.Namespace) -> None:
    from ..analysis.tables import write_tables

    campaign = json.loads(a.campaign)
    write_tables(a.summary, json.loads(a.tables), campaign["origin"], campaign["backbones"],
                 campaign["tasks"], a.out_dir, scope=campaign.get("scope"))


def _plot_sweeps(a: argparse.Namespace) -> None:
    from ..analysis.sweeps import plot_sweeps

    plot_sweeps(a.summary, json.loads(a.sweeps), a.out_dir)


def register_analyses(sub) -> None:
    """The analyses' table-and-figure commands (after the model jobs in ``--help``)."""
    s = sub.add_parser("shadow-analysis", help="disagreement by anchor distance, partial Spearman "
                       "correlations, reproduction check, figure")
    s.add_argument("--probes", required=True)
    s.add_argument("--trajectory", required=True, help="the probed job's generations")
    s.add_argument("--generations", required=True, help="the main generations of the same method")
    s.add_argument("--bins", default="[0, 1, 2, 4, 8, 16, 32, 64, 128]", help="JSON bin edges")
    s.add_argument("--label", default="")
    for out in ("bins", "correlations", "reproduction", "figure"):
        s.add_argument(f"--out-{out}", required=True)
    s.set_defaults(func=_shadow_analysis)

    s = sub.add_parser("intervention-analysis", help="Pass@1, Rev.@5 and paired counts of the "
                       "intervention's branches, figure")
    s.add_argument("--pairs", required=True)
    s.add_argument("--fresh-scores", required=True)
    s.add_argument("--cached-scores", required=True)
    s.add_argument("--follow", type=int, default=5)
    s.add_argument("--label", default="")
    for out in ("table", "paired", "figure"):
        s.add_argument(f"--out-{out}", required=True)
    s.set_defaults(func=_intervention_analysis)

    s = sub.add_parser("drift-analysis", help="per-layer drift table, similarity and drift-share "
                       "figures")
    s.add_argument("--records", required=True)
    s.add_argument("--tau", type=float, default=0.95)
    s.add_argument("--profile", default="llada-8b-instruct", help="adaptive rho(l) drawn for "
                   "comparison; empty: none")
    s.add_argument("--label", default="")
    for out in ("table", "similarity", "share"):
        s.add_argument(f"--out-{out}", required=True)
    s.set_defaults(func=_drift_analysis)


def register_reports(sub) -> None:
    """The summary and report commands (last in ``--help``)."""
    s = sub.add_parser("summarize", help="one summary row per (backbone, task, method)")
    s.add_argument("--scores", nargs="+", required=True)
    s.add_argument("--reference", required=True)
    s.add_argument("--also-against", nargs="*", default=[], help="extra speedup references")
    s.add_argument("--timing", nargs="*", default=[], help="the timing stage's files: speedups "
                   "as paired median ratios with bootstrap intervals (else: ratios of mean times)")
    s.add_argument("--seed", type=int, default=0, help="seed of the bootstrap intervals")
    s.add_argument("--out-parquet", required=True)
    s.add_argument("--out-csv", required=True)
    s.add_argument("--out-isolation", default="", help="HTML page for the report: the rows "
                   "scored under a sandbox weaker than bubblewrap, or the all-clear")
    s.add_argument("--out-html", default="", help="the summary as an HTML page for the report "
                   "(headline columns first, the device and sandbox level that ran)")
    s.set_defaults(func=_summarize)

    s = sub.add_parser("plot", help="quality-vs-speedup Pareto plots per (backbone, task)")
    s.add_argument("--summary", required=True)
    s.add_argument("--out-dir", required=True)
    s.set_defaults(func=_plot)

    s = sub.add_parser("headline", help="the report's landing page: the summary and every Pareto "
                       "plot in one HTML file (plots embedded)")
    s.add_argument("--summary", required=True, help="summary.parquet")
    s.add_argument("--plots", required=True, help="the directory of the Pareto plots")
    s.add_argument("--out", required=True)
    s.set_defaults(func=_headline)

    s = sub.add_parser("csv-page", help="CSV tables as one HTML page for the report (which shows "
                       "HTML, but offers CSV only as a download)")
    s.add_argument("--title", required=True)
    s.add_argument("--csv", nargs="+", required=True)
    s.add_argument("--out", required=True)
    s.set_defaults(func=_csv_page)

    s = sub.add_parser("tables", help="paper-style tables (Archer, SPA-Cache) from the summary: "
                       "{name}.csv, .md and .html per table")
    s.add_argument("--summary", required=True)
    s.add_argument("--tables", required=True, help="JSON: the campaign's tables section")
    s.add_argument("--campaign", required=True,
                   help='JSON: {"origin": {method: base}, "backbones": [...], "tasks": [...]}')
    s.add_argument("--out-dir", required=True)
    s.set_defaults(func=_tables)

    s = sub.add_parser("plot-sweeps", help="quality, speedup and TPS against the swept value, "
                       "per (backbone, task, swept base method)")
    s.add_argument("--summary", required=True)
    s.add_argument("--sweeps", required=True,
                   help='JSON: {base: {"keys": [...], "points": {method: [values]}}}')
    s.add_argument("--out-dir", required=True)
    s.set_defaults(func=_plot_sweeps)
