"""The whole chain on the tiny campaign: train, prepare, generate, score (sandbox), summarize,
plot, report. Real jobs through Snakemake, scaled down to seconds: the session's one run of the
tiny campaign (conftest's ``finished_run``), which this test reads and does not change."""
from __future__ import annotations

import re

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml

from dlmpipe.campaign import Campaign

from .workflow import CONFIGS


def test_tiny_campaign_end_to_end(finished_run, tmp_path, warm_snakemake):
    config = CONFIGS / "tiny.yaml"
    campaign = Campaign(yaml.safe_load(config.read_text()))
    results = finished_run / "results"
    if not (results / "summary.csv").stat().st_size:
        pytest.skip("the finished run is faked (DLMPIPE_DAG_TOUCH=1): no results to check")

    # the parquet keeps full precision (the invariants below); the CSV the same table, 6 digits
    summary = pd.read_parquet(results / "summary.parquet")
    csv = pd.read_csv(results / "summary.csv")
    assert csv["method"].tolist() == summary["method"].tolist()
    for column in ("quality", "speedup", "cached_fraction", "job_time_s", "latency_s"):
        assert ((csv[column] - summary[column]).abs() <= 1e-5 * summary[column].abs()).all(), column
    assert len(summary) == len(campaign.backbones) * len(campaign.tasks) * len(campaign.methods)
    assert set(summary["method"]) == set(campaign.methods)
    assert summary["quality"].between(0, 1).all() and (summary["mean_nfe"] > 0).all()
    ref = summary[summary["method"] == "llada-confidence"]
    assert (ref["speedup"] == 1.0).all()
    assert (ref["speedup_ci_low"] == 1.0).all() and (ref["speedup_ci_high"] == 1.0).all()
    assert (summary["speedup_ci_low"] <= summary["speedup"]).all()
    assert (summary["speedup"] <= summary["speedup_ci_high"]).all()
    assert (summary["quality_ci_low"] <= summary["quality"]).all()

    # the timing stage: each method against the reference on the same samples, each repeat; the
    # timed decodes are the scored ones (same token ids as the generate jobs)
    samples = min(campaign.config["timing"]["samples"], 3)
    repeats = campaign.config["timing"]["repeats"]
    reference = campaign.config["reference_method"]
    for task in campaign.tasks:
        for method in campaign.methods:
            timing = pd.read_parquet(results / "timing" / "toy" / task / f"{method}.parquet")
            assert set(timing["run"]) == {method}
            latency = timing[timing["pass"] == "latency"]
            timed_here = {method, reference}
            assert set(latency["method"]) == timed_here
            assert len(latency) == len(timed_here) * samples * repeats
            assert (latency["batch_size"] == 1).all()
            # and one throughput pass of the method over the same samples, at its batch size
            throughput = timing[timing["pass"] == "throughput"]
            assert len(throughput) == samples and set(throughput["method"]) == {method}
            assert (throughput["repeat"] == 0).all() and (throughput["batch_size"] >= 1).all()
            assert set(timing.groupby("method")["sample_index"].nunique()) == {samples}
            for m in timed_here:
                gen = pd.read_parquet(results / "generations" / "toy" / task / f"{m}.parquet")
                for row in timing[timing["method"] == m].itertuples():
                    assert list(row.token_ids) == list(gen.loc[row.sample_index, "token_ids"])
        log = results / "logs" / "time_method" / "toy" / task / "archer-k1.log"
        assert f"repeat {repeats}/{repeats}:" in log.read_text()  # progress per repeat
    assert summary.groupby(["backbone", "task"])["pareto"].any().all()
    assert pq.read_table(results / "summary.parquet").num_rows == len(csv)

    # Archer K=1 refreshes on every change: same tokens as Saber-style full recompute would give,
    # no cached forwards; K=inf serves every forward after the first from the cache.
    k1 = summary[summary["method"] == "archer-k1"]
    kinf = summary[summary["method"] == "archer-kinf"]
    assert (k1["cached_fraction"] == 0).all()
    assert (kinf["mean_refreshes"] == 0).all()
    assert ((kinf["cached_fraction"] - (1 - 1 / kinf["mean_nfe"])).abs() < 1e-9).all()

    for task in campaign.tasks:
        scores = pq.read_table(results / "scores" / "toy" / task / "archer-k1.parquet").to_pandas()
        assert len(scores) == 3 and scores["status"].notna().all()
        if task == "toy_code":
            assert set(scores["isolation"]) <= {"bwrap", "process"}
        png = results / "plots" / f"pareto_toy_{task}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the job's measurements: TTFT within each generation, TPS x time = the generated tokens
    gens = pd.read_parquet(results / "generations" / "toy" / "toy_code" / "archer-kinf.parquet")
    assert ((gens["job_ttft_s"] > 0) & (gens["job_ttft_s"] <= gens["job_time_s"])).all()
    assert ((gens["job_tps"] * gens["job_time_s"] - gens["generated_length"]).abs() < 1e-9).all()
    assert summary["tps"].notna().all() and (summary["ttft_s"] <= summary["latency_s"]).all()
    assert_one_timing_truth(results, campaign)

    # the paper tables (the default tables section: one Archer-style, one SPA-style) and the
    # sweep figure of the one swept method
    archer = pd.read_csv(results / "tables" / "archer.csv")
    # no operating points: every sweep point a row, in the campaign's order
    assert archer["method"].tolist() == list(campaign.methods)
    ref = archer.set_index("method").loc["llada-confidence"]
    assert ref["overall speedup vs llada-confidence (x)"] == 1.0
    spa = pd.read_csv(results / "tables" / "spa.csv")
    assert len(spa) == len(campaign.tasks) * len(campaign.methods)
    assert "toy TTFT (ms)" in spa.columns
    assert re.search(r"^\| toy_code\s+\| llada-confidence\s+\| [\d.]+ \(1\.0×\)",
                     (results / "tables" / "spa.md").read_text(), re.M)
    assert sorted(p.name for p in (results / "sweeps").glob("*.png")) == [
        f"sweep_toy_{t}_archer.png" for t in sorted(campaign.tasks)]

    warm_snakemake(finished_run, "--report", str(tmp_path / "report.html"), configfile=config)
    html = (tmp_path / "report.html").read_text(errors="replace")
    assert "summary" in html.lower() and len(html) > 10_000
    assert "Paper tables" in html and "sweep_toy_toy_code_archer.png" in html


def _within(ratio: float, low: float, high: float) -> bool:
    return low * (1 - 1e-9) <= ratio <= high * (1 + 1e-9)


def assert_one_timing_truth(results, campaign) -> None:
    """Every row of the summary, the paper tables and the sweeps' data: the reference's time over
    the row's (latency, and TPS the other way round) agrees with the row's speedup within its
    95% interval, so no column contradicts another (docs/METHODS.md §3); TTFT, another quantity,
    comes from the same timing rows."""
    summary = pd.read_parquet(results / "summary.parquet")
    reference = campaign.config["reference_method"]
    for (b, t), part in summary.groupby(["backbone", "task"]):
        ref = part.set_index("method").loc[reference]
        for row in part.itertuples():
            for ratio in (ref["latency_s"] / row.latency_s, row.tps / ref["tps"]):
                assert _within(ratio, row.speedup_ci_low, row.speedup_ci_high), (b, t, row.method)
            # TTFT is another quantity (the prefill and first update), on the same clock
            assert 0 < row.ttft_s <= row.latency_s
            assert row.reference_drift > 0 and row.latency_measured_s > 0
    archer = pd.read_csv(results / "tables" / "archer.csv")
    for row in archer.to_dict("records"):
        ref = archer[(archer["backbone"] == row["backbone"]) & (archer["method"] == reference)].iloc[0]
        for t in campaign.tasks:
            speed = f"{t} speedup vs {reference} (x)"
            ratio = ref[f"{t} latency (s)"] / row[f"{t} latency (s)"]
            assert _within(ratio, row[f"{speed} ci_low"], row[f"{speed} ci_high"]), (row["method"], t)
    spa = pd.read_csv(results / "tables" / "spa.csv")
    indexed = summary.set_index(["backbone", "task", "method"])
    for row in spa.to_dict("records"):
        s = indexed.loc[("toy", row["task"], row["method"])]
        assert _within(row[f"toy TPS vs {reference} (x)"], s["speedup_ci_low"], s["speedup_ci_high"])
        assert row["toy TTFT (ms)"] == pytest.approx(1000 * s["ttft_s"], rel=1e-5)  # the summary's
    # the sweep figures draw quality, speedup and TPS from these summary rows
    for base, entry in campaign.sweeps().items():
        for (b, t), part in summary[summary["method"].isin(list(entry["points"]))].groupby(["backbone", "task"]):
            ref_tps = indexed.loc[(b, t, reference), "tps"]
            for row in part.itertuples():
                assert _within(row.tps / ref_tps, row.speedup_ci_low, row.speedup_ci_high)
