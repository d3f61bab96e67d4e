"""`snakemake --report` as its user sees it: the report of a finished tiny campaign opened in
headless Chromium (Debian's `chromium`, which scripts/setup.sh installs as root; skipped without
it), its landing page and every category, subcategory and result clicked through as a user
clicks them (tests/report_pages.py, over the DevTools protocol with the standard library only).

It checks that no page logs a console error (Snakemake's report used to blank the "Paper tables"
page with `TypeError ... reading 'mime_type'`), that the landing page shows the headline results
themselves (the summary table with every method, quality and speedup with their intervals, the
device and the sandbox level that ran, one decoded image per Pareto plot, all in view), that the
rule graph draws each rule once, and that every result opens as a rendered page or image (every
paper table and the summary as an HTML table), the summary CSV as a download of the file.

Set DLMPIPE_REPORT_SCREENSHOTS=<dir> to keep a PNG of every page it opened.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dlmpipe.campaign import Campaign

from .browser import chromium_or_skip_reason
from .report_pages import walk_report
from .workflow import CONFIGS, expected_counts

CHROMIUM, NO_CHROMIUM = chromium_or_skip_reason()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
TINY = CONFIGS / "tiny.yaml"


@pytest.fixture(scope="module")
def campaign() -> Campaign:
    return Campaign(yaml.safe_load(TINY.read_text()))


@pytest.fixture(scope="module")
def summary(finished_run) -> pd.DataFrame:
    path = finished_run / "results" / "summary.csv"
    if not path.stat().st_size:
        pytest.skip("the finished run is faked (DLMPIPE_DAG_TOUCH=1): no report to open")
    return pd.read_csv(path, keep_default_na=False, na_values=[""])


@pytest.fixture(scope="module")
def walked(finished_run, summary, warm_snakemake, tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("report-browser")
    warm_snakemake(finished_run, "--report", str(root / "report.html"), configfile=TINY)
    shots = os.environ.get("DLMPIPE_REPORT_SCREENSHOTS")
    return walk_report(root / "report.html", root / "downloads",
                       Path(shots) if shots else None, binary=CHROMIUM)


def test_no_page_of_the_report_logs_a_console_error(walked):
    assert walked["errors"] == []


def test_the_report_opens_on_the_headline_results(walked, summary, campaign):
    landing = walked["landing"]
    # the summary table, readable on the page: every (backbone, task, method) in order with its
    # quality and speedup and their intervals
    assert landing["header"][:5] == ["backbone", "task", "method", "quality [95% CI]",
                                     "speedup [95% CI]"]
    assert [row[:3] for row in landing["rows"]] == summary[["backbone", "task", "method"]].values.tolist()
    for row, (_, want) in zip(landing["rows"], summary.iterrows()):
        assert row[3] == (f"{want['quality']:.3f} [{want['quality_ci_low']:.3f}, "
                          f"{want['quality_ci_high']:.3f}]")
        assert row[4] == (f"{want['speedup']:.2f}× [{want['speedup_ci_low']:.2f}, "
                          f"{want['speedup_ci_high']:.2f}]")
    box, view = landing["table_box"], landing["viewport"]
    assert 0 <= box["top"] < view["height"] and 0 <= box["left"] and box["right"] <= view["width"]
    # what ran, read from the outputs: the device of the rows' environment and the sandbox
    # levels of their scores, not the campaign's `device: cpu` / `sandbox: null`
    text = landing["summary_text"]
    gpus = set(summary["gpu_name"].dropna()) - {""}
    devices = {f"GPU {g}" for g in gpus} or {f"CPU {c}" for c in summary["cpu_model"]}
    assert all(d in text for d in devices), text
    assert "Decoded on:" in text and "null" not in text and "auto" not in text
    by_task = summary.groupby("task")["isolation"].first()
    assert by_task["toy_code"] == "bwrap" and by_task["toy_arith"] == "none"
    assert "code ran under bwrap (toy_code)" in text and "no code run (toy_arith)" in text
    # one decoded image per Pareto plot
    pairs = [(b, t) for b in campaign.backbones for t in campaign.tasks]
    assert sorted(i["alt"] for i in landing["images"]) == sorted(
        f"Pareto front {b} / {t}" for b, t in pairs)
    assert all(i["loaded"] and i["width"] > 400 and i["src"].startswith("data:image/png")
               for i in landing["images"])


def test_the_rule_graph_draws_each_rule_once(walked, campaign):
    rules = walked["landing"]["rulegraph_rules"]
    assert walked["landing"]["rulegraph_drawn"]
    assert sorted(rules) == sorted(set(rules)) == sorted(expected_counts(campaign))


def test_every_category_opens_and_shows_its_results(walked, summary, campaign, finished_run):
    pages = walked["pages"]
    methods = list(campaign.methods)
    assert set(pages) == {"Summary", "Pareto fronts", "Sweeps", "Paper tables"}

    shown = pages["Summary"][None]
    assert set(shown) == {"summary", "summary (CSV download)", "sandbox isolation"}
    assert shown["summary"]["kind"] == "html" and shown["summary"]["tables"] >= 1
    assert all(m in shown["summary"]["text"] for m in methods)
    assert shown["sandbox isolation"]["kind"] == "html"
    assert "bubblewrap" in shown["sandbox isolation"]["text"]
    csv = shown["summary (CSV download)"]
    assert csv["kind"] == "download" and csv["downloaded"] is not None
    assert csv["downloaded"].read_bytes() == (finished_run / "results" / "summary.csv").read_bytes()

    # one backbone: each category lists its results directly (no subcategory to pick)
    plots = pages["Pareto fronts"][None]
    assert {label: (p["kind"], p["name"]) for label, p in plots.items()} == {
        t: ("img", f"pareto_toy_{t}.png") for t in campaign.tasks}
    assert all(p["loaded"] and p["width"] > 400 for p in plots.values())
    sweeps = pages["Sweeps"][None]
    assert {label: (p["kind"], p["name"]) for label, p in sweeps.items()} == {
        f"archer on {t}": ("img", f"sweep_toy_{t}_archer.png") for t in campaign.tasks}
    assert all(p["loaded"] for p in sweeps.values())

    tables = pages["Paper tables"][None]
    assert set(tables) == set(campaign.config["tables"]) and len(tables) == 2
    for name, page in tables.items():
        assert (page["kind"], page["name"]) == ("html", f"{name}.html")
        assert page["tables"] == 1 and all(m in page["text"] for m in methods), page["text"]
