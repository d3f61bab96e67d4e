"""Summary table, speedups, Pareto flags and plots, on hand-built score tables."""
from __future__ import annotations

import numpy as np
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
        "passed": [bool(p) for p in passed], "job_time_s": time_s if isinstance(time_s, list) else [time_s] * n,
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
    assert code.loc["archer-k8", "job_time_s"] == pytest.approx(0.5)
    # without timing files: a ratio of the jobs' times, and no speed figure claims more
    assert code.loc["archer-k8", "speedup"] == pytest.approx(4.0)
    assert table[["latency_s", "tps", "ttft_s", "latency_p50_s"]].isna().all().all()
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
    campaign_scores.drop(columns=["job_time_s"]).to_parquet(path)
    with pytest.raises(ValueError, match="lacks column.*job_time_s"):
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
                         "score": 1.0, "job_time_s": t, "nfe": 4, "steps": 4, "refreshes": 0,
                         "cached_forwards": 0, "revisions": 0})
    table = summary_table(pd.DataFrame(rows), "llada-confidence", ["saber"]).set_index("method")
    assert table.loc["archer-k8", "speedup"] == 4.0
    assert table.loc["archer-k8", "speedup_vs_saber"] == 2.0
    assert table.loc["saber", "speedup_vs_saber"] == 1.0


def test_quality_on_extended_tests_when_scores_have_them():
    import pandas as pd

    from dlmpipe.analysis.summary import summary_table

    rows = [{"backbone": "b", "task": "humaneval_plus", "method": "m", "sample_index": i,
             "score": 1.0, "plus_passed": i == 0, "job_time_s": 1.0, "nfe": 4, "steps": 4,
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
    """mean_generated_length is the per-sample mean of the generate job's measurement (its tps
    and ttft_s are the job's, not a method's speed: not summarized); quality_se is the binomial
    sqrt(p(1-p)/n) with a Wilson interval around p."""
    import math

    scores = campaign_scores.assign(generated_length=[3, 5, 8, 0] * 4 + [4, 4] * 3)
    scores = scores.assign(job_tps=scores["generated_length"] / scores["job_time_s"].where(scores["job_time_s"] > 0),
                           job_ttft_s=scores["job_time_s"] / 4)
    table = summary_table(scores, "ref").set_index(["task", "method"])
    assert list(summary_table(scores, "ref").columns) == SUMMARY_COLUMNS
    k8 = table.loc[("code", "archer-k8")]  # times 0.5, 0.5, 1.0, 0.0 (the last: no rate)
    assert k8["mean_generated_length"] == 4.0
    assert not {"mean_tps", "mean_ttft_s", "mean_time_s", "job_tps", "job_ttft_s"} & set(table.columns)
    for (task, method), row in table.iterrows():
        p, n = row["quality"], row["n"]
        assert row["quality_se"] == pytest.approx(math.sqrt(p * (1 - p) / n))
        assert 0 <= row["quality_ci_low"] <= p <= row["quality_ci_high"] <= 1
    # p = 1 (arith/ref): no spread, yet the interval does not collapse onto the point
    ref = table.loc[("arith", "ref")]
    assert ref["quality_se"] == 0 and ref["quality_ci_high"] == 1 and ref["quality_ci_low"] < 1
    # scores written before the measurements existed: the columns are there, empty
    old = summary_table(campaign_scores, "ref")
    assert old["mean_generated_length"].isna().all()


# ---- uncertainty: quality SE and interval, paired speedups, the front within error ----------------
def timing_of(backbone, task, times: dict[str, list[list[float]]]) -> pd.DataFrame:
    """A timing table: ``times[method][repeat][sample]`` seconds."""
    rows = []
    for method, repeats in times.items():
        for r, per_sample in enumerate(repeats):
            for i, t in enumerate(per_sample):
                rows.append({"backbone": backbone, "task": task, "method": method, "sample_index": i,
                             "repeat": r, "slot": 0, "time_s": t})
    return pd.DataFrame(rows)


def test_quality_standard_error_and_wilson_interval(campaign_scores):
    table = summary_table(campaign_scores, "ref").set_index(["task", "method"])
    ref = table.loc[("code", "ref")]  # 2 of 4
    assert ref["quality_se"] == pytest.approx(0.25)
    # Wilson score interval at p = 0.5, n = 4, z = 1.96
    assert ref["quality_ci_low"] == pytest.approx(0.1500, abs=1e-4)
    assert ref["quality_ci_high"] == pytest.approx(0.8500, abs=1e-4)
    twin = table.loc[("arith", "twin")]  # 2 of 2: no spread, but an interval that is not a point
    assert twin["quality_se"] == 0 and twin["quality_ci_high"] == 1.0
    assert 0.3 < twin["quality_ci_low"] < 1.0
    assert (table["quality_ci_low"] <= table["quality"]).all()
    assert (table["quality"] <= table["quality_ci_high"]).all()


def test_paired_speedup_is_the_geometric_mean_ratio_with_a_bootstrap_interval():
    from dlmpipe.analysis.speedup import timed_measures

    ref = [1.0, 2.0, 4.0, 1.5, 3.0, 2.5, 1.2]
    # the method is 2x faster on every sample, except one repeat of one sample that was disturbed
    fast = [[t / 2 for t in ref] for _ in range(3)]
    fast[1][3] = 10.0
    slower = [[t * 1.25 for t in ref]] * 3
    timing = timing_of("b", "t", {"ref": [ref] * 3, "fast": fast, "slower": slower})
    out = timed_measures(timing, "ref", seed=0).set_index("method")
    # medians over repeats drop the outlier; the ratios are paired, so differences between
    # samples (1 s to 4 s here) do not widen the interval at all
    assert out.loc["fast", "speedup"] == pytest.approx(2.0)
    assert out.loc["fast", ["ci_low", "ci_high"]].tolist() == pytest.approx([2.0, 2.0])
    assert out.loc["slower", "speedup"] == pytest.approx(0.8)
    assert out.loc["ref", ["speedup", "ci_low", "ci_high"]].tolist() == [1.0, 1.0, 1.0]
    assert (out["samples"] == len(ref)).all()
    # noisy ratios: the interval holds the estimate, lies within the ratios, and is reproducible
    rng = np.random.default_rng(1)
    noisy = [[t / rng.uniform(1.5, 2.5) for t in ref]]
    again = timing_of("b", "t", {"ref": [ref], "noisy": noisy})
    a = timed_measures(again, "ref", seed=3).set_index("method").loc["noisy"]
    b = timed_measures(again, "ref", seed=3).set_index("method").loc["noisy"]
    ratios = np.array(ref) / np.array(noisy[0])
    assert a["speedup"] == pytest.approx(np.exp(np.log(ratios).mean()))
    assert ratios.min() <= a["ci_low"] < a["speedup"] < a["ci_high"] <= ratios.max()
    assert a.equals(b)


def runs_of(backbone, task, anchor: list[float], runs: dict[str, tuple[float, list[float]]],
            tokens: int = 32) -> pd.DataFrame:
    """Timing files of the per-method format: the reference ``ref`` alone on ``anchor`` seconds
    per sample; each other method's run with the reference slowed by ``drift`` and the method's
    own times ``times`` (``runs[m] = (drift, times)``), two repeats each, TTFT a tenth."""
    rows = []

    def add(run, method, times):
        for r in range(2):
            for i, t in enumerate(times):
                rows.append({"backbone": backbone, "task": task, "run": run, "method": method,
                             "sample_index": i, "repeat": r, "slot": 0, "time_s": t,
                             "ttft_s": t / 10, "pass": "latency", "token_ids": [1] * tokens})
    add("ref", "ref", anchor)
    for m, (drift, times) in runs.items():
        add(m, "ref", [t * drift for t in anchor])
        add(m, m, times)
    return pd.DataFrame(rows)


def test_every_speed_figure_is_on_the_reference_runs_clock():
    """Methods timed in separate runs, one beside a busy neighbour (its reference 1.5x slower
    than alone): the speedups are the paired ratios, and every latency, TTFT and TPS is on the
    reference's own run's clock, so the reference's latency over a method's is its speedup."""
    from dlmpipe.analysis.speedup import timed_measures

    anchor = [1.0, 2.0, 4.0]
    timing = runs_of("b", "t", anchor, {
        "fast": (1.5, [t * 1.5 / 2 for t in anchor]),     # 2x, measured on a machine 1.5x slower
        "mixed": (1.0, [0.5, 1.0, 1.0]),                 # 2x, 2x, 4x on a quiet machine
        "slow": (0.8, [t * 0.8 * 1.25 for t in anchor])})  # 0.8x while the machine was quicker
    out = timed_measures(timing, "ref", ["fast"], seed=0).set_index("method")
    geo = float(np.exp(np.log(anchor).mean()))
    assert out.loc["fast", "speedup"] == pytest.approx(2.0)
    assert out.loc["fast", "latency_s"] == pytest.approx(geo / 2)
    assert out.loc["fast", "latency_measured_s"] == pytest.approx(1.5 * geo / 2)
    assert out.loc["fast", "reference_drift"] == pytest.approx(1.5)
    assert out.loc["slow", "reference_drift"] == pytest.approx(0.8)
    assert out.loc["ref", ["latency_s", "reference_drift", "speedup"]].tolist() == pytest.approx([geo, 1.0, 1.0])
    for m in out.index:  # one story per row: times, TPS and TTFT agree with the speedup exactly
        row = out.loc[m]
        assert out.loc["ref", "latency_s"] / row["latency_s"] == pytest.approx(row["speedup"])
        assert row["tps"] / out.loc["ref", "tps"] == pytest.approx(row["speedup"])
        assert row["tps"] == pytest.approx(32 / row["latency_s"])
        assert out.loc["ref", "ttft_s"] / row["ttft_s"] == pytest.approx(row["speedup"])
        assert row["ci_low"] <= row["speedup"] <= row["ci_high"]
    assert out.loc["mixed", "speedup"] == pytest.approx((2 * 2 * 4) ** (1 / 3))
    assert out.loc["mixed", ["latency_p50_s", "latency_p90_s"]].tolist() == pytest.approx([1.0, 1.0])
    # against another method: chained through the reference on each sample
    assert out.loc["slow", "speedup_vs_fast"] == pytest.approx(0.8 / 2.0)
    assert out.loc["fast", "speedup_vs_fast"] == pytest.approx(1.0)
    assert out.loc["ref", "latency_s"] / out.loc["fast", "latency_s"] == pytest.approx(
        out.loc["fast", "speedup"])


def test_unpaired_timing_is_refused():
    from dlmpipe.analysis.speedup import timed_measures

    timing = timing_of("b", "t", {"ref": [[1.0, 2.0, 3.0]], "m": [[1.0, 2.0]]})
    with pytest.raises(ValueError, match="lack some of each other's timed samples"):
        timed_measures(timing, "ref")
    with pytest.raises(ValueError, match="no method 'saber'"):
        timed_measures(timing, "saber")
    # a method's run without the reference in it cannot be paired
    runs = runs_of("b", "t", [1.0, 2.0], {"m": (1.0, [0.5, 1.0])})
    lonely = runs[~((runs["run"] == "m") & (runs["method"] == "ref"))]
    with pytest.raises(ValueError, match="b/t/m has no run of the reference 'ref'"):
        timed_measures(lonely, "ref")


def test_summary_speedups_come_from_the_timing_stage(campaign_scores):
    # generate-job times say archer-k8 is 4x faster; the paired timing says 1.6x: it wins
    timing = pd.concat([
        timing_of("toy", "code", {"ref": [[1.0, 2.0, 1.5]], "archer-k8": [[0.625, 1.25, 0.9375]],
                                  "slow-good": [[2.0, 4.0, 3.0]], "dominated": [[1.0, 2.0, 1.5]]}),
        timing_of("toy", "arith", {"ref": [[1.0]], "twin": [[1.0]], "worse": [[0.5]]}),
    ])
    table = summary_table(campaign_scores, "ref", ["slow-good"], timing=timing).set_index(["task", "method"])
    assert table.loc[("code", "archer-k8"), "speedup"] == pytest.approx(1.6)
    assert table.loc[("code", "archer-k8"), "job_time_s"] == pytest.approx(0.5)  # the jobs' own
    assert table.loc[("code", "archer-k8"), "latency_s"] == pytest.approx(3 ** (1 / 3) / 1.6)
    assert table.loc[("code", "slow-good"), ["speedup", "speedup_ci_low", "speedup_ci_high"]].tolist() \
        == pytest.approx([0.5, 0.5, 0.5])
    assert table.loc[("code", "archer-k8"), "speedup_vs_slow-good"] == pytest.approx(3.2)
    assert "speedup_vs_slow-good_ci_high" in table.columns
    assert table.loc[("arith", "worse"), "speedup"] == 2.0 and (table["timed_samples"] > 0).all()
    # a method the timing stage did not time cannot get a paired speedup
    with pytest.raises(ValueError, match="no timing for toy/code/dominated"):
        summary_table(campaign_scores, "ref", timing=timing[timing["method"] != "dominated"])


def test_points_within_error_of_the_front_are_marked():
    from dlmpipe.analysis.summary import front_flags

    table = pd.DataFrame({
        "backbone": "b", "task": "t", "method": ["ref", "fast", "mid", "near", "far", "ref-twin"],
        "quality": [0.80, 0.50, 0.75, 0.70, 0.30, 0.78], "quality_se": [0.05, 0.05, 0.05, 0.06, 0.05, 0.05],
        "speedup": [1.0, 3.0, 2.0, 1.8, 1.5, 0.98],
        "speedup_ci_low": [1.0, 2.8, 1.9, 1.7, 1.4, 0.9],
        "speedup_ci_high": [1.0, 3.2, 2.1, 2.2, 1.6, 1.05]})
    flags = front_flags(table).set_index("method")
    assert flags["pareto"].to_dict() == {"ref": True, "fast": True, "mid": True, "near": False,
                                         "far": False, "ref-twin": False}
    # near (dominated by mid): its bars reach (0.76, 2.2), which no front point beats;
    # far: (0.35, 1.6) is beaten by fast (0.5, 3.0); ref-twin: reaches (0.83, 1.05), past ref
    assert flags["overlaps_front"].to_dict() == {"ref": False, "fast": False, "mid": False,
                                                 "near": True, "far": False, "ref-twin": True}


def test_plot_labels_never_overlap_and_the_front_uses_the_estimates(tmp_path):
    """A crowded plot (exact settings on top of their reference, a sweep side by side): every
    point gets its number, no two labels overlap each other or any marker in the saved figure,
    and the drawn front is the staircase through the Pareto-optimal point estimates."""
    import matplotlib

    matplotlib.use("Agg")
    from dlmpipe.analysis.plots import pareto_figure
    from dlmpipe.analysis.summary import front_flags, quality_uncertainty

    methods = ["ref", "saber", "archer-k1", "archer-k2", "archer-k4", "archer-k8", "archer-kinf",
               "spa-a", "spa-b", "spa-c", "parallel", "dkv", "dllm"]
    quality = [0.80, 0.82, 0.82, 0.82, 0.81, 0.80, 0.70, 0.80, 0.79, 0.55, 0.40, 0.78, 0.80]
    speedup = [1.00, 1.07, 1.06, 1.30, 1.50, 1.60, 2.20, 1.21, 1.20, 1.22, 3.00, 1.19, 1.20]
    part = front_flags(quality_uncertainty(pd.DataFrame({
        "backbone": "toy", "task": "t", "method": methods, "quality": quality, "n": 40,
        "speedup": speedup, "speedup_ci_low": [s * 0.95 for s in speedup],
        "speedup_ci_high": [s * 1.05 for s in speedup], "reference": "ref"})))
    fig, ax, texts = pareto_figure(part, "toy", "t")
    fig.savefig(tmp_path / "p.png", dpi=150)
    renderer = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(renderer) for t in texts]
    assert sorted(int(t.get_text()) for t in texts) == list(range(1, len(methods) + 1))
    for i, a in enumerate(boxes):
        for b in boxes[i + 1:]:
            assert not a.overlaps(b), (a, b)
        for x, y in zip(speedup, quality):
            px, py = ax.transData.transform((x, y))
            assert not a.contains(px, py), "a label covers a point"
    # the front line: Pareto-optimal point estimates only, sorted by speedup
    line = [ln for ln in ax.get_lines() if ln.get_label().startswith("Pareto front")][0]
    on = part[part["pareto"]].sort_values("speedup")
    assert list(line.get_xdata()) == on["speedup"].tolist()
    assert list(line.get_ydata()) == on["quality"].tolist()
    assert set(part.loc[part["overlaps_front"], "method"]) >= {"ref", "archer-k1"}


# ---- environment fingerprints (dlmpipe/environment.py) ------------------------------------------
def with_environment(frame: pd.DataFrame, cpu: str, threads: str = "1") -> pd.DataFrame:
    """``frame`` with the fingerprint columns of a CPU environment named ``cpu``."""
    from dlmpipe.environment import FIELDS, fingerprint_id

    env = {f: "" for f in FIELDS} | {"cpu_model": cpu, "torch_version": "2.5.1",
                                     "transformers_version": "4.46", "dlmpipe_revision": "abc123",
                                     "torch_threads": threads, "omp_num_threads": threads}
    return frame.assign(**env, fingerprint=fingerprint_id(env))


def test_summary_rows_name_their_environment_and_flag_qualities_from_mixed_shards(campaign_scores):
    scores = with_environment(campaign_scores, "Xeon")
    # archer-k8's four samples: two shards, the second decoded on another machine
    k8 = (scores["method"] == "archer-k8") & (scores["sample_index"] >= 2)
    other = with_environment(scores[k8], "EPYC")
    scores.loc[k8, other.columns] = other
    timing = with_environment(pd.concat([
        timing_of("toy", "code", {m: [[1.0, 1.0]] for m in ("ref", "archer-k8", "slow-good", "dominated")}),
        timing_of("toy", "arith", {m: [[1.0]] for m in ("ref", "twin", "worse")})]), "Xeon")
    table = summary_table(scores, "ref", timing=timing).set_index(["task", "method"])
    xeon, epyc = scores["fingerprint"].iloc[0], other["fingerprint"].iloc[0]
    assert xeon != epyc
    ref = table.loc[("code", "ref")]
    assert ref["fingerprint"] == ref["timing_fingerprint"] == xeon and ref["cpu_model"] == "Xeon"
    assert ref["fingerprint_warning"] == "" and ref["torch_threads"] == "1"
    mixed = table.loc[("code", "archer-k8")]
    assert mixed["quality"] == 0.5  # still summarized: informative, but flagged
    assert mixed["fingerprint"] == ", ".join(sorted([xeon, epyc]))
    assert sorted(mixed["cpu_model"].split(" | ")) == ["EPYC", "Xeon"]
    assert mixed["fingerprint_warning"] == (f"quality mixes 2 environments: "
                                            + ", ".join(f"{f} (2 samples)" for f in sorted([xeon, epyc])))
    assert (table.drop(index=("code", "archer-k8"))["fingerprint_warning"] == "").all()
    # rows written before fingerprints were recorded: empty columns, no warning
    plain = summary_table(campaign_scores, "ref", timing=timing_of("toy", "arith", {
        m: [[1.0]] for m in ("ref", "twin", "worse")}).pipe(lambda t: pd.concat([t, timing_of(
            "toy", "code", {m: [[1.0]] for m in ("ref", "archer-k8", "slow-good", "dominated")})])))
    assert (plain["fingerprint"] == "").all() and (plain["fingerprint_warning"] == "").all()
    assert (plain["timing_fingerprint"] == "").all() and list(plain.columns[:len(SUMMARY_COLUMNS)]) == SUMMARY_COLUMNS


def test_speedups_from_timing_of_mixed_environments_are_refused(tmp_path, campaign_scores):
    from dlmpipe.analysis.speedup import read_timing

    # the reference's timing from one run, the methods' from another (two files of one pair)
    here = with_environment(timing_of("toy", "code", {"ref": [[1.0, 1.0]]}), "Xeon")
    there = with_environment(timing_of("toy", "code", {m: [[0.5, 0.5]] for m in
                                                       ("archer-k8", "slow-good", "dominated")}), "Xeon",
                             threads="8")
    here.to_parquet(tmp_path / "ref.parquet")
    there.to_parquet(tmp_path / "others.parquet")
    timing = read_timing([tmp_path / "ref.parquet", tmp_path / "others.parquet"])
    scores = campaign_scores[campaign_scores["task"] == "code"]
    with pytest.raises(ValueError, match="timing of toy/code mixes environment fingerprints") as err:
        summary_table(scores, "ref", timing=timing)
    message = str(err.value)
    assert f"{here['fingerprint'].iloc[0]}: {tmp_path / 'ref.parquet'}" in message
    assert f"{there['fingerprint'].iloc[0]}: {tmp_path / 'others.parquet'}" in message
    # a timing file of one run passes, and so does one without fingerprints at all
    same = pd.concat([here, with_environment(there, "Xeon")])
    assert summary_table(scores, "ref", timing=same)["timing_fingerprint"].nunique() == 1
    # one run with fingerprints mixed with an older one without: refused too
    with pytest.raises(ValueError, match="unrecorded"):
        summary_table(scores, "ref", timing=pd.concat([here, there.drop(columns="fingerprint")]))


def test_speedups_from_generate_jobs_of_different_environments_are_refused(campaign_scores):
    # without the timing stage a speedup divides the generate jobs' own times
    scores = with_environment(campaign_scores, "Xeon")
    assert summary_table(scores, "ref")["fingerprint_warning"].eq("").all()
    moved = scores["method"] == "twin"
    scores.loc[moved, "fingerprint"] = with_environment(scores[moved], "EPYC")["fingerprint"]
    with pytest.raises(ValueError, match=r"toy/arith: the speedup of 'twin' over 'ref' would divide"):
        summary_table(scores, "ref")


def test_scores_written_before_the_job_time_rename_still_summarize(tmp_path, campaign_scores):
    path = tmp_path / "old.parquet"
    campaign_scores.rename(columns={"job_time_s": "time_s"}).to_parquet(path)
    table = summarize([str(path)], "ref", str(tmp_path / "s.parquet"), str(tmp_path / "s.csv"))
    assert table.set_index(["task", "method"]).loc[("code", "archer-k8"), "job_time_s"] == pytest.approx(0.5)


def test_summarize_warns_of_mixed_environments(tmp_path, campaign_scores, capsys):
    scores = with_environment(campaign_scores, "Xeon")
    k8 = (scores["method"] == "archer-k8") & (scores["sample_index"] == 0)
    scores.loc[k8, "fingerprint"] = "0123456789ab"
    path, timing = tmp_path / "scores.parquet", tmp_path / "timing.parquet"
    scores.to_parquet(path)
    with_environment(pd.concat([
        timing_of("toy", "code", {m: [[1.0]] for m in ("ref", "archer-k8", "slow-good", "dominated")}),
        timing_of("toy", "arith", {m: [[1.0]] for m in ("ref", "twin", "worse")})]), "Xeon").to_parquet(timing)
    summarize([str(path)], "ref", str(tmp_path / "s.parquet"), str(tmp_path / "s.csv"),
              timing=[str(timing)])
    assert "warning: toy/code/archer-k8: quality mixes 2 environments" in capsys.readouterr().err
    csv = pd.read_csv(tmp_path / "s.csv", keep_default_na=False)
    assert csv.set_index("method").loc["archer-k8", "fingerprint_warning"].startswith("quality mixes")


def test_throughput_latency_percentiles_and_peak_memory_from_the_timing_stage():
    """The timing stage's batched pass gives throughput and its batch size; the batch-1 rows the
    p50/p90 latency (each sample's median over repeats) and speedups, unaffected by the pass."""
    from dlmpipe.analysis.speedup import timed_measures
    from dlmpipe.analysis.summary import throughput

    lat = timing_of("toy", "code", {"ref": [[1.0, 2.0, 3.0, 4.0], [1.0, 2.0, 3.0, 4.0]],
                                    "fast": [[0.5, 1.0, 1.5, 2.0], [0.5, 1.0, 1.5, 2.0]]})
    lat = lat.assign(**{"pass": "latency", "batch_size": 1, "pass_s": float("nan"), "token_ids": [[1] * 8] * len(lat),
                        "peak_memory_mb": lat["method"].map({"ref": 100.0, "fast": 120.0})})
    batched = pd.DataFrame([{"backbone": "toy", "task": "code", "method": m, "sample_index": i,
                             "repeat": 0, "slot": 0, "time_s": 0.9, "pass": "throughput",
                             "batch_size": 4, "pass_s": wall, "token_ids": [1] * 8,
                             "peak_memory_mb": mem}
                            for m, wall, mem in (("ref", 2.0, 300.0), ("fast", 0.5, 400.0)) for i in range(4)])
    timing = pd.concat([lat, batched], ignore_index=True)
    out = throughput(timing).set_index("method")
    measured = timed_measures(timing, "ref").set_index("method")
    assert out.loc["ref", "batch_size"] == 4
    assert out.loc["ref", "throughput_tps"] == pytest.approx(4 * 8 / 2.0)
    assert out.loc["fast", "throughput_sps"] == pytest.approx(4 / 0.5)
    assert measured.loc["ref", "latency_p50_s"] == pytest.approx(2.5)
    assert measured.loc["ref", "latency_p90_s"] == pytest.approx(3.7)
    assert out.loc["fast", "peak_memory_mb_b1"] == 120.0 and out.loc["fast", "peak_memory_mb_batch"] == 400.0
    # speedups read only the batch-1 rows (the pass's 0.9 s everywhere would make them 1.0)
    assert measured.loc["fast", "speedup"] == pytest.approx(2.0)
