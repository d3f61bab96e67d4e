"""Summary table, speedups, Pareto flags and plots, on hand-built score tables."""
from __future__ import annotations

import pandas as pd
import pytest

from dlmpipe.analysis.pareto import front_steps, pareto_mask
from dlmpipe.analysis.plots import plot_pareto
from dlmpipe.analysis.summary import SUMMARY_COLUMNS, summarize, summary_table


def scores_of(backbone, task, method, passed, time_s, nfe=4, cached=0, refreshes=0, revisions=0):
    """A scores table (the columns summary reads) for one (backbone, task, method)."""
    n = len(passed)
    return pd.DataFrame({
        "backbone": backbone, "task": task, "method": method, "sample_index": range(n),
        "task_id": [f"{task}/{i}" for i in range(n)], "score": [float(p) for p in passed],
        "passed": [bool(p) for p in passed], "time_s": time_s if isinstance(time_s, list) else [time_s] * n,
        "nfe": nfe, "steps": nfe, "cached_forwards": cached, "refreshes": refreshes,
        "revisions": revisions, "status": ["passed" if p else "failed" for p in passed]})


@pytest.fixture
def campaign_scores() -> pd.DataFrame:
    return pd.concat([
        # toy / code: the reference, a faster equal-quality cache, a slower better one, a bad one
        scores_of("toy", "code", "ref", [1, 0, 1, 0], 2.0),
        scores_of("toy", "code", "archer-k8", [1, 0, 1, 0], [0.5, 0.5, 1.0, 0.0], nfe=8, cached=6,
                  refreshes=2, revisions=3),
        scores_of("toy", "code", "slow-good", [1, 1, 1, 0], 4.0),
        scores_of("toy", "code", "dominated", [1, 0, 0, 0], 1.5),
        # toy / arith: a tie with the reference in both objectives
        scores_of("toy", "arith", "ref", [1, 1], 1.0),
        scores_of("toy", "arith", "twin", [1, 1], 1.0),
        scores_of("toy", "arith", "worse", [0, 1], 1.0),
    ], ignore_index=True)


def test_summary_rows_speedups_and_pareto(campaign_scores):
    table = summary_table(campaign_scores, reference="ref").set_index(["task", "method"])
    assert list(summary_table(campaign_scores, "ref").columns) == SUMMARY_COLUMNS
    code = table.loc["code"]
    assert code.loc["ref", "quality"] == 0.5 and code.loc["slow-good", "quality"] == 0.75
    assert code.loc["archer-k8", "n"] == 4
    assert code.loc["archer-k8", "mean_time_s"] == pytest.approx(0.5)
    assert code.loc["archer-k8", "speedup"] == pytest.approx(4.0)
    assert code.loc["slow-good", "speedup"] == pytest.approx(0.5)
    assert code.loc["ref", "speedup"] == 1.0
    assert code.loc["archer-k8", "cached_fraction"] == pytest.approx(24 / 32)
    assert code.loc["archer-k8", "mean_refreshes"] == 2 and code.loc["archer-k8", "mean_revisions"] == 3
    assert code.loc["archer-k8", "mean_nfe"] == 8 and code.loc["archer-k8", "mean_steps"] == 8
    assert code.loc["ref", "cached_fraction"] == 0
    assert (table["reference"] == "ref").all()
    assert code["pareto"].to_dict() == {"ref": False, "archer-k8": True, "slow-good": True,
                                        "dominated": False}
    # identical points are both on the front; a point worse in quality at equal speed is not
    assert table.loc["arith", "pareto"].to_dict() == {"ref": True, "twin": True, "worse": False}


def test_speedup_is_per_backbone_and_task(campaign_scores):
    other = scores_of("big", "code", "ref", [1, 1], 10.0)
    fast = scores_of("big", "code", "archer-k8", [1, 1], 1.0)
    table = summary_table(pd.concat([campaign_scores, other, fast]), "ref").set_index(
        ["backbone", "task", "method"])
    assert table.loc[("big", "code", "archer-k8"), "speedup"] == pytest.approx(10.0)
    assert table.loc[("toy", "code", "archer-k8"), "speedup"] == pytest.approx(4.0)


def test_missing_reference_is_a_clear_error(campaign_scores):
    lacking = campaign_scores[~((campaign_scores.task == "arith") & (campaign_scores.method == "ref"))]
    with pytest.raises(ValueError, match=r"reference method 'ref' has no scores for toy/arith"):
        summary_table(lacking, "ref")
    with pytest.raises(ValueError, match="reference method 'greedy'"):
        summary_table(campaign_scores, "greedy")


def test_duplicate_samples_are_refused(tmp_path, campaign_scores):
    path = tmp_path / "a.parquet"
    campaign_scores.to_parquet(path)
    with pytest.raises(ValueError, match="sample scored twice"):
        summarize([str(path), str(path)], "ref", str(tmp_path / "s.parquet"), str(tmp_path / "s.csv"))


def test_missing_columns_are_named(tmp_path, campaign_scores):
    path = tmp_path / "a.parquet"
    campaign_scores.drop(columns=["time_s"]).to_parquet(path)
    with pytest.raises(ValueError, match="lacks column.*time_s"):
        summarize([str(path)], "ref", str(tmp_path / "s.parquet"), str(tmp_path / "s.csv"))


def test_summarize_writes_parquet_and_csv(tmp_path, campaign_scores):
    paths = []
    for (b, t, m), part in campaign_scores.groupby(["backbone", "task", "method"]):
        paths.append(str(tmp_path / f"{b}-{t}-{m}.parquet"))
        part.to_parquet(paths[-1])
    summarize(paths, "ref", str(tmp_path / "out" / "summary.parquet"), str(tmp_path / "out" / "summary.csv"))
    from_parquet = pd.read_parquet(tmp_path / "out" / "summary.parquet")
    from_csv = pd.read_csv(tmp_path / "out" / "summary.csv")
    assert list(from_parquet.columns) == list(from_csv.columns) == SUMMARY_COLUMNS
    assert len(from_parquet) == 7
    assert from_parquet["pareto"].dtype == bool and from_parquet["n"].dtype == "int64"
    assert sorted(from_csv["method"]) == sorted(from_parquet["method"])


def test_pareto_helpers():
    q, s = [0.5, 0.5, 0.75, 0.25, 0.75], [1.0, 4.0, 0.5, 1.5, 0.5]
    assert pareto_mask(q, s) == [False, True, True, False, True]
    xs, ys = front_steps(q, s)
    assert xs == [0.5, 0.5, 4.0] and ys == [0.75, 0.75, 0.5]
    assert pareto_mask([], []) == []


def test_plot_pareto_writes_one_png_per_backbone_and_task(tmp_path, campaign_scores):
    summary = tmp_path / "summary.parquet"
    summary_table(campaign_scores, "ref").to_parquet(summary)
    written = plot_pareto(summary, tmp_path / "plots")
    assert sorted(p.name for p in written) == ["pareto_toy_arith.png", "pareto_toy_code.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000


def test_speedups_also_against_a_second_reference():
    """Archer's tables: speedup over LLaDA-confidence and, separately, over Saber."""
    import pandas as pd

    from dlmpipe.analysis.summary import summary_table

    rows = []
    for method, t in (("llada-confidence", 4.0), ("saber", 2.0), ("archer-k8", 1.0)):
        for i in range(2):
            rows.append({"backbone": "b", "task": "t", "method": method, "sample_index": i,
                         "score": 1.0, "time_s": t, "nfe": 4, "steps": 4, "refreshes": 0,
                         "cached_forwards": 0, "revisions": 0})
    table = summary_table(pd.DataFrame(rows), "llada-confidence", ["saber"]).set_index("method")
    assert table.loc["archer-k8", "speedup"] == 4.0
    assert table.loc["archer-k8", "speedup_vs_saber"] == 2.0
    assert table.loc["saber", "speedup_vs_saber"] == 1.0


def test_quality_on_extended_tests_when_scores_have_them():
    import pandas as pd

    from dlmpipe.analysis.summary import summary_table

    rows = [{"backbone": "b", "task": "humaneval_plus", "method": "m", "sample_index": i,
             "score": 1.0, "plus_passed": i == 0, "time_s": 1.0, "nfe": 4, "steps": 4,
             "refreshes": 0, "cached_forwards": 0, "revisions": 0} for i in range(4)]
    table = summary_table(pd.DataFrame(rows), "m")
    assert table.loc[0, "quality"] == 1.0 and table.loc[0, "quality_plus"] == 0.25


def test_summary_lists_each_rows_isolation_levels_and_the_report_warns(campaign_scores, tmp_path):
    from dlmpipe.analysis.isolation import isolation_note, weaker_rows
    from dlmpipe.cli import main as cli

    scores = campaign_scores.assign(isolation="bwrap")
    scores.loc[scores["task"] == "arith", "isolation"] = "none"
    table = summary_table(scores, "ref")
    assert list(table.columns) == SUMMARY_COLUMNS + ["isolation"]
    assert set(table["isolation"]) == {"bwrap", "none"}
    assert weaker_rows(table).empty and "Every code score ran under bubblewrap" in isolation_note(table)

    # one sample of one method scored under the opt-in process level
    scores.loc[(scores["method"] == "archer-k8") & (scores["sample_index"] == 2),
               "isolation"] = "process+landlock+seccomp"
    path = tmp_path / "scores.parquet"
    scores.to_parquet(path)
    note = tmp_path / "isolation.html"
    assert cli(["summarize", "--scores", str(path), "--reference", "ref", "--out-parquet",
                str(tmp_path / "s.parquet"), "--out-csv", str(tmp_path / "s.csv"),
                "--out-isolation", str(note)]) == 0
    table = pd.read_csv(tmp_path / "s.csv").set_index("method")
    assert table.loc["archer-k8", "isolation"] == "bwrap,process+landlock+seccomp"
    html = note.read_text()
    assert "Warning: 1 of 7 rows" in html and "<td>archer-k8</td>" in html
    assert "<td>slow-good</td>" not in html and "scratch directory is on the host" in html


def test_measurement_means_and_quality_standard_error(campaign_scores):
    """mean_tps / mean_ttft_s / mean_generated_length are per-sample means of the generate job's
    measurements; quality_se is the binomial sqrt(p(1-p)/n) with a Wilson interval around p."""
    import math

    scores = campaign_scores.assign(generated_length=[3, 5, 8, 0] * 4 + [4, 4] * 3)
    scores = scores.assign(tps=scores["generated_length"] / scores["time_s"].where(scores["time_s"] > 0),
                           ttft_s=scores["time_s"] / 4)
    table = summary_table(scores, "ref").set_index(["task", "method"])
    assert list(summary_table(scores, "ref").columns) == SUMMARY_COLUMNS
    k8 = table.loc[("code", "archer-k8")]  # times 0.5, 0.5, 1.0, 0.0 (the last: no rate)
    assert k8["mean_tps"] == pytest.approx((3 / 0.5 + 5 / 0.5 + 8 / 1.0) / 3)
    assert k8["mean_generated_length"] == 4.0 and k8["mean_ttft_s"] == pytest.approx(0.5 / 4)
    assert (table["mean_ttft_s"] <= table["mean_time_s"]).all()
    for (task, method), row in table.iterrows():
        p, n = row["quality"], row["n"]
        assert row["quality_se"] == pytest.approx(math.sqrt(p * (1 - p) / n))
        assert 0 <= row["quality_ci_low"] <= p <= row["quality_ci_high"] <= 1
    # p = 1 (arith/ref): no spread, yet the interval does not collapse onto the point
    ref = table.loc[("arith", "ref")]
    assert ref["quality_se"] == 0 and ref["quality_ci_high"] == 1 and ref["quality_ci_low"] < 1
    # scores written before the measurements existed: the columns are there, empty
    old = summary_table(campaign_scores, "ref")
    assert old[["mean_tps", "mean_ttft_s", "mean_generated_length"]].isna().all().all()
