"""The report's HTML pages (dlmpipe/analysis/report_html.py) on hand-built summaries: the headline
columns lead whatever else the summary holds, the device and sandbox level are the ones the rows
record, the landing page embeds every Pareto plot, CSV tables render whole. (In a browser, inside
the report: tests/test_report_browser.py.)"""
from __future__ import annotations

import base64
import html
import re
from html.parser import HTMLParser

import pandas as pd

from dlmpipe.analysis.report_html import csv_page, devices, headline_html, summary_html


class Tables(HTMLParser):
    """Every <table> of a page as rows of cell texts (header row included); <img> sources."""

    def __init__(self, page: str):
        super().__init__()
        self.tables, self.images, self._cell = [], [], None
        self.feed(page)

    def handle_starttag(self, tag, attrs):
        if tag == "table":
            self.tables.append([])
        elif tag == "tr":
            self.tables[-1].append([])
        elif tag in ("td", "th"):
            self._cell = ""
        elif tag == "img":
            self.images.append(dict(attrs))

    def handle_endtag(self, tag):
        if tag in ("td", "th"):
            self.tables[-1][-1].append(self._cell)
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data


def summary(**extra) -> pd.DataFrame:
    rows = [{"backbone": "b", "task": "code", "method": "ref", "quality": 0.5, "quality_se": 0.1,
             "quality_ci_low": 0.3, "quality_ci_high": 0.7, "speedup": 1.0, "speedup_ci_low": 1.0,
             "speedup_ci_high": 1.0, "pareto": True, "cpu_model": "Xeon", "gpu_name": "",
             "torch_threads": "4", "isolation": "bwrap", "fingerprint_warning": ""},
            {"backbone": "b", "task": "math", "method": "fast", "quality": 0.25, "quality_se": 0.1,
             "quality_ci_low": 0.1, "quality_ci_high": 0.5, "speedup": 2.5, "speedup_ci_low": 2.0,
             "speedup_ci_high": 3.125, "pareto": False, "cpu_model": "Xeon", "gpu_name": "",
             "torch_threads": "4", "isolation": "none", "fingerprint_warning": ""}]
    table = pd.DataFrame(rows)
    for name, values in extra.items():
        table[name] = values
    return table


def text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def test_the_headline_columns_lead_whatever_else_the_summary_holds():
    table = summary(new_metric=[1.5, 2.5])[["new_metric", *summary().columns]]  # a new first column
    page = Tables(summary_html(table))
    headline, every = page.tables[0], page.tables[1]
    assert headline == [["backbone", "task", "method", "quality [95% CI]", "speedup [95% CI]", "pareto"],
                        ["b", "code", "ref", "0.500 [0.300, 0.700]", "1.00× [1.00, 1.00]", "✓"],
                        ["b", "math", "fast", "0.250 [0.100, 0.500]", "2.50× [2.00, 3.12]", ""]]
    # every column: the headline ones first, then the rest in the summary's order; a column with
    # one value in every row (the CPU, the threads) listed once below instead
    assert every[0] == ["backbone", "task", "method", "quality", "quality_ci_low", "quality_ci_high",
                        "speedup", "speedup_ci_low", "speedup_ci_high", "pareto", "new_metric",
                        "isolation"]
    assert every[1][-2:] == ["1.5", "bwrap"]
    assert re.search(r"<dt>cpu_model</dt><dd>Xeon</dd>", summary_html(table))
    # without the interval columns the value stands alone; without quality there is no column
    bare = Tables(summary_html(summary().drop(columns=["speedup_ci_low", "speedup_ci_high", "quality"])))
    assert bare.tables[0][0] == ["backbone", "task", "method", "speedup [95% CI]", "pareto"]
    assert bare.tables[0][2][3] == "2.50×"


def test_the_device_and_sandbox_are_the_ones_the_rows_record():
    page = text(summary_html(summary()))
    assert "Decoded on: CPU Xeon, 4 torch threads" in page
    assert "Sandbox of the scores: code ran under bwrap (code); no code run (math)" in page
    gpu = summary(gpu_name=["NVIDIA H200", "NVIDIA H200"], gpu_driver=["550.1", "550.1"],
                  cuda_version=["12.4", "12.4"])
    assert devices(gpu) == ["GPU NVIDIA H200 (driver 550.1, CUDA 12.4), 4 torch threads"]
    weak = text(summary_html(summary(isolation=["process+landlock+seccomp", "none"])))
    assert "code ran under process+landlock+seccomp (code) (weaker than bubblewrap" in weak
    mixed = text(summary_html(summary(fingerprint_warning=["quality mixes 2 environments", ""])))
    assert "decoded in several environments" in mixed and "b / code / ref: quality mixes" in mixed
    assert "not recorded" in text(summary_html(summary().drop(columns=["cpu_model", "isolation"])))


def test_the_landing_page_embeds_every_pareto_plot(tmp_path):
    png = b"\x89PNG\r\n\x1a\n" + b"plot"
    for task in ("code", "math"):
        (tmp_path / f"pareto_b_{task}.png").write_bytes(png + task.encode())
    page = Tables(headline_html(summary(), tmp_path))
    assert [i["alt"] for i in page.images] == ["Pareto front b / code", "Pareto front b / math"]
    assert [base64.b64decode(i["src"].split(",", 1)[1]) for i in page.images] == [
        png + b"code", png + b"math"]
    assert page.tables[0][1][:3] == ["b", "code", "ref"]  # the summary's headline table first


def test_csv_tables_render_whole(tmp_path):
    pd.DataFrame({"bin": ["0", "1-2"], "probes": [3, 4], "share": [0.125, None]}).to_csv(
        tmp_path / "bins.csv", index=False)
    pd.DataFrame({"layer": [0]}).to_csv(tmp_path / "layers.csv", index=False)
    page = csv_page("toy/code/archer", [tmp_path / "bins.csv", tmp_path / "layers.csv"])
    assert Tables(page).tables == [[["bin", "probes", "share"], ["0", "3", "0.125"], ["1-2", "4", "–"]],
                                   [["layer"], ["0"]]]
    assert "<h3>bins.csv</h3>" in page and "<title>toy/code/archer</title>" in page
