"""Snakemake's standard commands work on this workflow as on any other, with no extra flags:
``--unlock``, ``--dag``, ``--rulegraph``, ``--summary``, ``--list-rules``, ``--lint``,
``--report`` and ``-n``, on the default campaign (a working directory holding config.yaml, as the
repository root does) and on a campaign file (``--configfile``). Nothing may need ``--cores``:
the rules read the core count only when a job's threads are evaluated."""
from __future__ import annotations

import graphlib
import os
import re
import shutil
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from dlmpipe.campaign import Campaign

from .workflow import CONFIGS, REPO, expected_counts, job_counts

CAMPAIGNS = {"default": REPO / "config.yaml", "campaign-file": CONFIGS / "tiny.yaml"}
COMMANDS = {"dag": ["--dag"], "rulegraph": ["--rulegraph"], "summary": ["--summary"],
            "list-rules": ["--list-rules"], "lint": ["--lint"], "report": ["--report", "report.html"],
            "dry-run": ["-n"]}
RULES = {"all", "fetch_backbone", "fetch_dataset", "train_toy", "prepare_backbone", "svd", "prepare_task", "generate", "score",
         "time_method", "summarize", "plot", "plot_sweeps", "tables",  # merge_generations: only with shards > 1
         # the analyses (docs/ANALYSES.md), defined whether or not the campaign names any
         "shadow_probe", "shadow_analysis", "intervention", "score_branch",
         "intervention_analysis", "drift_profile", "drift_analysis"}


def campaign_workdir(root: Path, campaign: str) -> tuple[Path, Path | None]:
    """A fresh working directory and the --configfile to pass (None: the default campaign,
    found as config.yaml in the working directory, as when run from the repository root)."""
    workdir = root / campaign
    workdir.mkdir(parents=True)
    if campaign == "default":
        shutil.copy(CAMPAIGNS["default"], workdir / "config.yaml")
        return workdir, None
    return workdir, CAMPAIGNS[campaign]


@pytest.fixture(scope="module")
def ran(tmp_path_factory, warm_snakemake) -> dict[tuple[str, str], subprocess.CompletedProcess]:
    """(campaign, command) -> its process; each in its own working directory, side by side
    (forked from a warm process: conftest's ``warm_snakemake``)."""
    root = tmp_path_factory.mktemp("commands")

    def run(campaign, command):
        workdir, configfile = campaign_workdir(root / command, campaign)
        return warm_snakemake(workdir, *COMMANDS[command], configfile=configfile, check=False)

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        futures = {(c, k): pool.submit(run, c, k) for c in CAMPAIGNS for k in COMMANDS}
        return {key: f.result() for key, f in futures.items()}


def campaign_of(name: str) -> Campaign:
    return Campaign(yaml.safe_load(CAMPAIGNS[name].read_text()))


def succeeded(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"{' '.join(proc.args)} failed:\n{proc.stderr[-3000:]}"
    assert "number of cores" not in proc.stdout + proc.stderr
    return proc.stdout


def dot_graph(text: str) -> tuple[dict[str, str], set[tuple[str, str]]]:
    """A DOT digraph parsed by pydot: node id -> rule (first line of its label), edges."""
    import pydot

    graphs = pydot.graph_from_dot_data(text)
    assert graphs and len(graphs) == 1, "not one DOT graph"
    graph = graphs[0]
    assert graph.get_type() == "digraph"
    nodes = {n.get_name(): n.get("label").strip('"').split("\\n")[0]
             for n in graph.get_nodes() if n.get_name() not in ("node", "edge", "graph")}
    edges = {(e.get_source(), e.get_destination()) for e in graph.get_edges()}
    assert {n for edge in edges for n in edge} <= set(nodes), "an edge names an undefined node"
    return nodes, edges


def acyclic_order(nodes, edges) -> list[str]:
    sorter = graphlib.TopologicalSorter({n: set() for n in nodes})
    for src, dst in edges:
        sorter.add(dst, src)
    return list(sorter.static_order())  # raises CycleError on a cycle


@pytest.mark.parametrize("campaign", CAMPAIGNS)
def test_dag_is_a_dot_graph_of_every_job(ran, campaign):
    nodes, edges = dot_graph(succeeded(ran[(campaign, "dag")]))
    counts: dict[str, int] = {}
    for rule in nodes.values():
        counts[rule] = counts.get(rule, 0) + 1
    assert counts == expected_counts(campaign_of(campaign))
    order = acyclic_order(nodes, edges)
    # every job feeds the target: `all` comes last and each other job has a path to it
    (target,) = [n for n, rule in nodes.items() if rule == "all"]
    assert order[-1] == target and not [e for e in edges if e[0] == target]
    reaches = {target}
    for node in reversed(order):
        if any((node, dst) in edges for dst in reaches):
            reaches.add(node)
    assert reaches == set(nodes)


@pytest.mark.parametrize("campaign", CAMPAIGNS)
def test_rulegraph_is_a_dot_graph_of_the_rules(ran, campaign):
    nodes, edges = dot_graph(succeeded(ran[(campaign, "rulegraph")]))
    assert sorted(nodes.values()) == sorted(expected_counts(campaign_of(campaign)))
    acyclic_order(nodes, edges)
    rule_edges = {(nodes[a], nodes[b]) for a, b in edges}
    assert {("prepare_backbone", "generate"),
            ("prepare_task", "generate"), ("generate", "score"), ("score", "summarize"),
            ("summarize", "plot"), ("summarize", "all"), ("plot", "all")} <= rule_edges
    # the default campaign decodes the shipped toy; a campaign file may train one
    trains = any(map(campaign_of(campaign).is_toy, campaign_of(campaign).backbones))
    assert (("train_toy", "prepare_backbone") in rule_edges) == trains
    if "svd" in nodes.values():
        assert ("svd", "generate") in rule_edges


@pytest.mark.parametrize("campaign", CAMPAIGNS)
def test_every_rule_sits_at_one_depth_of_the_dag(ran, campaign):
    """The report's rule graph (Snakemake's report/rulegraph_spec.py) keeps one job per rule and
    depth of the DAG (its toposort layer): a rule whose jobs sit at two depths is drawn twice, as
    generate and score were while only the SPA methods' jobs waited for an svd job that waited
    for prepare_backbone."""
    nodes, edges = dot_graph(succeeded(ran[(campaign, "dag")]))
    depth: dict[str, int] = {}
    for node in acyclic_order(nodes, edges):
        depth[node] = 1 + max((depth[src] for src, dst in edges if dst == node), default=-1)
    depths: dict[str, set[int]] = {}
    for node, rule in nodes.items():
        depths.setdefault(rule, set()).add(depth[node])
    assert {rule: sorted(d) for rule, d in depths.items() if len(d) > 1} == {}


def expected_outputs(campaign: Campaign) -> set[str]:
    b_t_m = campaign.decoding_jobs()  # a method may name the backbones it runs on
    return ({"results/summary.csv", "results/summary.parquet", "results/plots"}
            | {f"results/scores/{b}/{t}/{m}.parquet" for b, t, m in b_t_m}
            | {f"results/generations/{b}/{t}/{m}.{ext}" for b, t, m in b_t_m
               for ext in ("parquet", "provenance.json")}
            | {f"results/tasks/{t}.parquet" for t in campaign.tasks}
            | {f"results/backbones/{b}/manifest.json" for b in campaign.backbones}
            | {f"results/analyses/{kind}/{b}/{t}/{m}/{name}"
               for kind, names in (("shadow", ("bins.csv", "probes.parquet")),
                                   ("intervention", ("paired.csv", "fresh.scores.parquet")),
                                   ("drift", ("layers.csv", "records.parquet")))
               for b, t, m in campaign.analysis_targets(kind) for name in names})


def summary_rows(stdout: str) -> dict[str, dict]:
    lines = [line for line in stdout.splitlines() if "\t" in line]
    header = lines[0].split("\t")
    assert header[:6] == ["output_file", "date", "rule", "log-file(s)", "status", "plan"]
    return {row[0]: dict(zip(header, row)) for row in (line.split("\t") for line in lines[1:])}


@pytest.mark.parametrize("campaign", CAMPAIGNS)
def test_summary_lists_every_output_before_a_run(ran, campaign):
    rows = summary_rows(succeeded(ran[(campaign, "summary")]))
    assert expected_outputs(campaign_of(campaign)) <= set(rows)
    assert {(r["status"], r["plan"]) for r in rows.values()} == {("missing", "update pending")}


def test_summary_of_a_finished_run(finished_run, warm_snakemake):
    rows = summary_rows(succeeded(warm_snakemake(finished_run, "--summary",
                                                 configfile=CAMPAIGNS["campaign-file"], check=False)))
    assert expected_outputs(campaign_of("campaign-file")) <= set(rows)
    assert {(r["status"], r["plan"]) for r in rows.values()} == {("ok", "no update")}
    assert all(r["date"] != "-" for r in rows.values())


@pytest.mark.parametrize("campaign", CAMPAIGNS)
def test_list_rules_names_every_rule(ran, campaign):
    out = succeeded(ran[(campaign, "list-rules")])
    assert set(re.findall(r"^(\w+)\b", out, re.M)) == RULES


@pytest.mark.parametrize("campaign", CAMPAIGNS)
def test_lint_is_clean(ran, campaign):
    proc = ran[(campaign, "lint")]
    succeeded(proc)
    assert "Congratulations, your workflow is in a good condition" in proc.stdout + proc.stderr


@pytest.mark.parametrize("campaign", CAMPAIGNS)
def test_dry_run_schedules_every_job(ran, campaign):
    proc = ran[(campaign, "dry-run")]
    assert job_counts(succeeded(proc)) == expected_counts(campaign_of(campaign))
    assert "This was a dry-run" in proc.stdout + proc.stderr


@pytest.mark.parametrize("campaign", CAMPAIGNS)
def test_report_before_a_run_names_the_missing_result(ran, campaign):
    """What Snakemake does for any workflow whose report files do not exist yet: refuse,
    naming the file (not a complaint about cores)."""
    proc = ran[(campaign, "report")]
    assert proc.returncode != 0
    assert re.search(r"results/summary\.(csv|html) marked for report but does not exist",
                     proc.stdout + proc.stderr)
    assert "number of cores" not in proc.stdout + proc.stderr


def test_report_of_a_finished_run(finished_run, warm_snakemake, tmp_path):
    if not (finished_run / "results" / "summary.csv").stat().st_size:
        pytest.skip("the finished run is faked (DLMPIPE_DAG_TOUCH=1): no summary or plots to report")
    report = tmp_path / "report.html"
    proc = warm_snakemake(finished_run, "--report", str(report), configfile=CAMPAIGNS["campaign-file"],
                          check=False)
    succeeded(proc)
    assert "Report created" in proc.stdout + proc.stderr
    html = report.read_text()
    campaign = campaign_of("campaign-file")
    for name in ["summary.csv", *(f"pareto_{b}_{t}.png" for b in campaign.backbones for t in campaign.tasks)]:
        assert name in html, name
    assert "quality" in html  # the summary's contents, not only its name


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists (the warm Snakemake's server reaps its children at once)."""
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def test_unlock_after_a_killed_run(tmp_path, warm_snakemake):
    """After a killed run Snakemake refuses the locked directory and says it "can be removed with
    the --unlock argument"; `snakemake --unlock` as such removes the lock. The killed run is
    forked from the warm Snakemake in a session of its own (``WarmSnakemake.start``, as
    ``Popen(start_new_session=True)``), SIGKILLed with the jobs it started once it has locked."""
    workdir, _ = campaign_workdir(tmp_path, "default")
    locks = workdir / ".snakemake" / "locks"
    pid, wait = warm_snakemake.start(workdir, "--cores", "1")
    try:
        deadline = time.time() + 120
        while alive(pid) and time.time() < deadline and not (locks.is_dir() and any(locks.iterdir())):
            time.sleep(0.05)
    finally:
        try:
            os.killpg(pid, signal.SIGKILL)  # the run and the jobs it started (its process group)
        except ProcessLookupError:  # it ended by itself: the assertion below says so
            pass
        run = wait(check=False)
    assert run.returncode == -signal.SIGKILL, f"the run ended before it was killed:\n{run.stderr[-2000:]}"
    assert locks.is_dir() and any(locks.iterdir()), "the run never locked its working directory"

    locked = warm_snakemake(workdir, "--cores", "1", "--until", "prepare_task", check=False)
    assert locked.returncode != 0 and "--unlock" in locked.stdout + locked.stderr

    unlocked = warm_snakemake(workdir, "--unlock", check=False)
    assert "Unlocked working directory" in succeeded(unlocked) + unlocked.stderr
    assert not locks.exists() or not any(locks.iterdir())
