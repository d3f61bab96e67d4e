"""The analyses as workflow stages (docs/ANALYSES.md): the DAG Snakemake builds for the config's
`analyses:` section (adding one reruns nothing else; each option reruns exactly the jobs that
read it), and a real run of the tiny campaign with every analysis, checked against the main
generations."""
from __future__ import annotations

import copy
import json
import os
import re
import shutil
from pathlib import Path

import pandas as pd
import pytest
import yaml

from dlmpipe.campaign import Campaign, ConfigError

from .browser import chromium_or_skip_reason
from .report_pages import walk_report
from .workflow import CONFIGS, REPO, REPORT_JOBS, dry_runs, scheduled, timing_jobs

CHROMIUM, NO_CHROMIUM = chromium_or_skip_reason()

TINY = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
TARGET = ("toy", "toy_code", "archer-kinf")
ANALYSES = {
    "shadow": [{"methods": ["archer-kinf"], "tasks": ["toy_code"], "bins": [0, 1, 2, 4]}],
    "intervention": [{"methods": ["archer-kinf"], "tasks": ["toy_code"], "threshold": 0.5}],
    "drift": [{"methods": ["llada-confidence"], "tasks": ["toy_code"], "rank": 8}],
}
SHADOW = {("shadow_probe", *TARGET), ("shadow_analysis", *TARGET)}
INTERVENTION = {("intervention", *TARGET), ("score_branch", *TARGET), ("intervention_analysis", *TARGET)}
DRIFT = {("drift_profile", "toy", "toy_code", "llada-confidence"),
         ("drift_analysis", "toy", "toy_code", "llada-confidence")}


def with_analyses(analyses: dict | None) -> dict:
    config = copy.deepcopy(TINY)
    if analyses is not None:
        config["analyses"] = copy.deepcopy(analyses)
    return config


@pytest.fixture(scope="module")
def finished(finished_run, analysed_run) -> dict[str, Path]:
    """Two finished runs: the tiny campaign (the session's, conftest's ``finished_run``), and
    with every analysis (this module's real run, ``analysed_run`` below). Dry runs only: they
    change neither (their configs are written elsewhere)."""
    return {"plain": finished_run, "analysed": analysed_run}


# ---- the config section ----------------------------------------------------------------------
def test_analysis_entries_expand_to_targets_with_defaults_filled():
    campaign = Campaign(with_analyses({"shadow": [{"methods": ["archer-k1", "archer-kinf"]}],
                                       "drift": [{"methods": ["llada-confidence"], "limit": 2}]}))
    assert campaign.analysis_targets("shadow") == [
        ("toy", t, m) for t in ("toy_code", "toy_arith") for m in ("archer-k1", "archer-kinf")]
    assert campaign.analysis("shadow", "toy", "toy_arith", "archer-k1") == {
        "limit": None, "steps": "cached", "rate": 1.0, "seed": 0, "bins": [0, 1, 2, 4, 8, 16, 32, 64, 128]}
    assert campaign.analysis("drift", "toy", "toy_code", "llada-confidence") == {
        "limit": 2, "rank": None, "tau": 0.95, "profile": "llada-8b-instruct"}
    assert campaign.analysis_targets("intervention") == []
    with pytest.raises(ValueError, match="analyses.drift names no toy/toy_code/archer-k1"):
        campaign.analysis("drift", "toy", "toy_code", "archer-k1")
    default = Campaign(yaml.safe_load((REPO / "config.yaml").read_text()))
    assert all(default.analysis_targets(k) for k in ("shadow", "intervention", "drift"))
    assert Campaign(with_analyses(None)).analyses == {"shadow": {}, "intervention": {}, "drift": {}}


@pytest.mark.parametrize("analyses,named", [
    ({"shadow": [{"methods": ["archer-k8"]}]}, r"analyses.shadow\[0\].methods\[0\]: 'archer-k8' is not"),
    ({"drift": [{"methods": ["llada-confidence"], "tasks": ["gsm8k"]}]}, r"analyses.drift\[0\].tasks\[0\]"),
    ({"shadow": [{"methods": ["archer-k1"]}, {"methods": ["archer-k1"], "tasks": ["toy_code"]}]},
     r"analyses.shadow\[1\]: toy/toy_code/archer-k1 is already analysed"),
    ({"intervention": [{"methods": ["llada-confidence"]}]}, r"cache 'none'.*one of: archer"),
    ({"shadow": [{"methods": ["archer-k1"], "bins": [0, 2], "rates": 1}]}, r"analyses.shadow\[0\].rates: unknown key"),
    ({"shadow": [{"methods": ["archer-k1"], "rate": 0}]}, r"analyses.shadow\[0\].rate"),
    ({"intervention": [{"tasks": ["toy_code"]}]}, r"analyses.intervention\[0\].methods: missing"),
    ({"ablation": []}, r"analyses.ablation: unknown key"),
])
def test_a_bad_analysis_entry_is_named_by_its_key(analyses, named):
    with pytest.raises(ConfigError, match=named):
        Campaign(with_analyses(analyses))


# ---- the DAG ------------------------------------------------------------------------------------
def _set(analysis: str, key: str, value):
    def change(analyses):
        analyses[analysis][0][key] = value
        return analyses
    return change


# name -> (finished run, the analyses section after the change, the jobs it must schedule)
CHANGES = {
    "add-shadow": ("plain", {"shadow": ANALYSES["shadow"]}, SHADOW),
    "add-intervention": ("plain", {"intervention": ANALYSES["intervention"]}, INTERVENTION),
    # the drift profile's singular proxy series needs the backbone's SVD, which no method here did
    "add-drift": ("plain", {"drift": ANALYSES["drift"]}, DRIFT | {("svd", "toy", None, None)}),
    "remove-all": ("analysed", None, set()),
    "shadow-bins": ("analysed", _set("shadow", "bins", [0, 3]), {("shadow_analysis", *TARGET)}),
    "shadow-rate": ("analysed", _set("shadow", "rate", 0.5), SHADOW),
    "shadow-limit": ("analysed", _set("shadow", "limit", 2), SHADOW),
    "intervention-threshold": ("analysed", _set("intervention", "threshold", 0.8), INTERVENTION),
    "intervention-follow": ("analysed", _set("intervention", "follow", 3), INTERVENTION),
    "drift-tau": ("analysed", _set("drift", "tau", 0.9), DRIFT),
    "drift-figure-profile": ("analysed", _set("drift", "profile", "dream-7b"),
                             {("drift_analysis", "toy", "toy_code", "llada-confidence")}),
    "add-target": ("analysed", _set("shadow", "tasks", ["toy_code", "toy_arith"]),
                   {("shadow_probe", "toy", "toy_arith", "archer-kinf"),
                    ("shadow_analysis", "toy", "toy_arith", "archer-kinf")}),
}


def method_change() -> dict:
    """archer's sampler changed: both archer methods, and every analysis of them, rerun."""
    config = with_analyses(ANALYSES)
    config["methods"]["archer"]["sampler"]["n"] = 3
    return config


@pytest.fixture(scope="module")
def reruns(finished, tmp_path_factory, warm_snakemake) -> dict[str, set[tuple]]:
    """What each change (CHANGES, and ``method-param``: ``method_change``) schedules on its
    finished run: every dry run at once, each its own Snakemake process (tests/workflow.py's
    ``dry_runs``: forked from the session's warm Snakemake, conftest's ``warm_snakemake``)."""
    configs = tmp_path_factory.mktemp("changed-configs")
    runs = {}
    for name, (run, change, _) in CHANGES.items():
        analyses = change(copy.deepcopy(ANALYSES)) if callable(change) else change
        runs[name] = (finished[run], with_analyses(analyses))
    runs["method-param"] = (finished["analysed"], method_change())
    for name, (_, config) in runs.items():
        (configs / f"{name}.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    procs = dry_runs([(workdir, configs / f"{name}.yaml") for name, (workdir, _) in runs.items()],
                     snakemake=warm_snakemake)
    return {name: scheduled(proc.stdout) for name, proc in zip(runs, procs)}


@pytest.mark.parametrize("name", list(CHANGES))
def test_an_analysis_change_reruns_exactly_its_jobs(reruns, name):
    assert reruns[name] == CHANGES[name][2]


def test_a_method_change_reruns_its_analyses_too(reruns):
    jobs = reruns["method-param"]  # method_change: archer's sampler n = 3
    decoding = {(rule, "toy", t, m) for rule in ("generate", "score") for t in ("toy_code", "toy_arith")
                for m in ("archer-k1", "archer-kinf")}
    # each method is timed in its own job: the two changed methods are re-timed on both tasks
    assert jobs == (decoding | timing_jobs(["toy"], ["toy_code", "toy_arith"], ["archer-k1", "archer-kinf"])
                    | SHADOW | INTERVENTION | REPORT_JOBS)


# ---- a real run ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def analysed_run(tmp_path_factory, warm_snakemake, finished_run) -> Path:
    """A real run of the tiny campaign with every analysis (its config: config.yaml there): a
    copy of the session's finished run of the campaign (conftest's ``finished_run``) with the
    analyses added, so only the analysis jobs run, and none of the campaign's own jobs again
    (when that run is faked, DLMPIPE_DAG_TOUCH=1, the whole campaign runs here)."""
    workdir = tmp_path_factory.mktemp("analysed-run") / "run"
    real = (finished_run / "results" / "summary.csv").stat().st_size > 0
    if real:  # copy2 keeps the mtimes Snakemake compares; .snakemake holds the recorded params
        shutil.copytree(finished_run, workdir, symlinks=True,
                        ignore=shutil.ignore_patterns("locks", "incomplete", "log", "changed-*.yaml"))
        for manifest in (workdir / "results" / "backbones").glob("*/manifest.json"):
            stat = manifest.stat()  # the copy's own checkpoint, the manifest's time kept
            manifest.write_text(manifest.read_text().replace(str(finished_run), str(workdir)))
            os.utime(manifest, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    else:
        workdir.mkdir()
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(with_analyses(ANALYSES), sort_keys=False))
    log = warm_snakemake(workdir, "--cores", "2", configfile=path)
    if real:  # adding analyses reruns nothing of the campaign (the DAG tests above, for real)
        ran = set(re.findall(r"^(?:local)?rule (\w+):", log.stdout + log.stderr, re.M))
        assert ran and not ran & {"train_toy", "prepare_task", "generate", "score", "time_method"}, ran
    return workdir


@pytest.fixture(scope="module")
def analysed_report(analysed_run, warm_snakemake, tmp_path_factory) -> Path:
    """``snakemake --report`` of the real run with every analysis, made once for the two tests
    that read it."""
    report = tmp_path_factory.mktemp("analysed-report") / "report.html"
    warm_snakemake(analysed_run, "--report", str(report), configfile=analysed_run / "config.yaml")
    return report


@pytest.mark.slow
def test_tiny_campaign_with_every_analysis(analysed_run, analysed_report):
    tmp_path = analysed_run
    root = tmp_path / "results" / "analyses"

    shadow = root / "shadow" / "toy" / "toy_code" / "archer-kinf"
    probes = pd.read_parquet(shadow / "probes.parquet")
    bins = pd.read_csv(shadow / "bins.csv")
    assert len(probes) > 0 and probes["cached"].all()
    assert bins["probes"].sum() == len(probes)
    # the probed job reproduced the main generations exactly, sample by sample
    reproduced = pd.read_csv(shadow / "reproduction.csv")
    assert len(reproduced) == 3 and reproduced["reproduced"].all()
    main = pd.read_parquet(tmp_path / "results" / "generations" / "toy" / "toy_code" / "archer-kinf.parquet")
    trajectory = pd.read_parquet(shadow / "trajectory.parquet")
    assert (trajectory["nfe"] == main["nfe"]).all() and (trajectory["completion"] == main["completion"]).all()
    # K = inf: every update after the first is cached, and each was probed (rate 1)
    assert len(probes) == int(main["cached_forwards"].sum())
    corr = pd.read_csv(shadow / "correlations.csv")
    assert set(corr["outcome"]) == {"action_differs", "next_state_distance", "logit_drift_max"}

    inter = root / "intervention" / "toy" / "toy_code" / "archer-kinf"
    pairs = pd.read_parquet(inter / "pairs.parquet")
    paired = pd.read_csv(inter / "paired.csv").iloc[0]
    assert len(pairs) == 3 and paired["problems"] == 3
    assert paired[["both_pass", "only_fresh", "only_cached", "neither"]].sum() == paired["pairs"]
    for branch in ("fresh", "cached"):
        scores = pd.read_parquet(inter / f"{branch}.scores.parquet")
        assert len(scores) == paired["pairs"] and scores["status"].notna().all()
        assert set(scores["isolation"]) <= {"bwrap", "process", "process+landlock",
                                            "process+seccomp", "process+landlock+seccomp"}
        for stats in scores["stats"]:
            assert json.loads(stats)["branch"] == branch

    drift = root / "drift" / "toy" / "toy_code" / "llada-confidence"
    layers = pd.read_csv(drift / "layers.csv")
    assert set(layers["series"]) == {"input", "proxy", "value", "ffn_output"}
    assert layers["drifting_share"].between(0, 1).all()

    pngs = [shadow / "disagreement.png", inter / "intervention.png", drift / "similarity.png",
            drift / "drift_share.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    html = analysed_report.read_text(errors="replace")
    assert "Mechanism analyses" in html


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_the_analyses_open_in_the_report_in_a_browser(analysed_report, tmp_path):
    """Each analysis target is a subcategory of "Mechanism analyses" whose tables open as one
    HTML page (its CSV tables) and whose figures open as images, with no console error
    (tests/test_report_browser.py walks the rest of the report the same way)."""
    walked = walk_report(analysed_report, tmp_path / "downloads", binary=CHROMIUM)
    assert walked["errors"] == []
    shown = walked["pages"]["Mechanism analyses"]
    tables = {"shadow": 3, "intervention": 2, "drift": 1}  # the CSV tables of each analysis
    figures = {"shadow": {"figure"}, "intervention": {"figure"},
               "drift": {"similarity figure", "drift-share figure"}}
    expected = {"shadow: archer-kinf on toy / toy_code", "intervention: archer-kinf on toy / toy_code",
                "drift: llada-confidence on toy / toy_code"}
    assert set(shown) == expected
    for subcategory, results in shown.items():
        kind = subcategory.split(":")[0]
        assert set(results) == {"tables"} | figures[kind]
        assert results["tables"]["kind"] == "html" and results["tables"]["tables"] == tables[kind]
        assert all(results[f]["kind"] == "img" and results[f]["loaded"] for f in figures[kind])
