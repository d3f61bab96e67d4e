"""Driving this repository's Snakemake workflow from tests, and reading what it plans.

``run_snakemake`` runs the workflow in its own working directory; the parsers read a dry run's
'Job stats' table and its scheduled jobs; ``fake_finished_run`` makes a workdir look like a
finished run (every output created empty, then ``--touch`` records the metadata, params
included, that a real run would) so rerun decisions can be checked in seconds.
"""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = Path(__file__).resolve().parent / "configs"
DIRECTORY_RULES = {"train_toy", "plot", "plot_sweeps"}  # rules whose output is a directory


# ---- the jobs a rerun schedules, as scheduled() lists them: (rule, backbone, task, method) ----
def decoding_jobs(backbones, tasks, methods) -> set[tuple]:
    return {(rule, b, t, m) for rule in ("generate", "score")
            for b in backbones for t in tasks for m in methods}


def timing_jobs(backbones, tasks, methods) -> set[tuple]:
    """The timing stage times each method (paired with the reference) in its own job, so a
    change to one method re-times that method only."""
    return {("time_method", b, t, m) for b in backbones for t in tasks for m in methods}


REPORT_JOBS = {("summarize", None, None, None), ("plot", None, None, None),
               ("plot_sweeps", None, None, None), ("tables", None, None, None)}


def run_snakemake(workdir: Path, *args: str, configfile: Path | None = None,
                  check: bool = True, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run this repository's workflow in ``workdir`` (its own .snakemake and results), in
    ``env`` (default: this process's environment)."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"),
           "--directory", str(workdir), *args]
    if configfile is not None:
        cmd += ["--configfile", str(configfile)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def job_counts(stdout: str) -> dict[str, int]:
    """The first 'Job stats' table of a dry run: rule -> number of jobs."""
    table = stdout.split("Job stats:", 1)[1].split("total", 1)[0]
    return {m[0]: int(m[1]) for m in re.findall(r"^(\w+)\s+(\d+)\s*$", table, re.M)}


def job_blocks(stdout: str, in_groups: bool = False) -> list[tuple[str, str]]:
    """(rule, body) of every job a dry run printed; with ``in_groups`` also the jobs of group
    jobs (a cluster executor's plan prints them indented under 'Group job ...')."""
    if in_groups:
        return re.findall(r"^(?:    )?(?:local)?rule (\w+):\n((?:(?:    )?    .*\n?)*)", stdout, re.M)
    return re.findall(r"^(?:local)?rule (\w+):\n((?:    .*\n?)*)", stdout, re.M)


def scheduled(stdout: str, in_groups: bool = False) -> set[tuple]:
    """Jobs of a dry run as (rule, backbone, task, method), absent wildcards as None; 'all' left
    out; with ``in_groups`` also those of group jobs (job_blocks)."""
    jobs = set()
    for rule, body in job_blocks(stdout, in_groups):
        w = dict(re.findall(r"(\w+)=([^,\s]+)", (re.findall(r"wildcards: (.*)", body) or [""])[0]))
        if rule != "all":
            jobs.add((rule, w.get("backbone"), w.get("task"), w.get("method")))
    return jobs


def group_jobs(stdout: str) -> list[tuple[str, list[str]]]:
    """(group, rules of its jobs) of every group job a dry run printed (a cluster executor's
    plan: each is one submission)."""
    groups = []
    for name, body in re.findall(r"Group job (\w+) \(jobs in lexicogr. order\):\n((?:\n|    .*\n?|Shell command: .*\n?)*)",
                                 stdout):
        groups.append((name, re.findall(r"^    rule (\w+):", body, re.M)))
    return groups


def submissions(stdout: str, local_rules) -> int:
    """The submissions a cluster executor's dry run plans: its group jobs, and every job outside
    a group (printed unindented) whose rule is not local."""
    ungrouped = [rule for rule, _ in job_blocks(stdout) if rule not in local_rules]
    return len(group_jobs(stdout)) + len(ungrouped)


def fake_finished_run(workdir: Path, config: Path) -> None:
    """Every output created empty, then the metadata a real run records (params included)."""
    summary = run_snakemake(workdir, "--summary", configfile=config).stdout
    for line in summary.splitlines()[1:]:
        path, rule = line.split("\t")[0], line.split("\t")[2]
        if rule in DIRECTORY_RULES:
            (workdir / path).mkdir(parents=True, exist_ok=True)
        else:
            (workdir / path).parent.mkdir(parents=True, exist_ok=True)
            (workdir / path).touch()
    run_snakemake(workdir, "--touch", "--forceall", "--cores", "1", configfile=config)
    proc = run_snakemake(workdir, "-n", configfile=config)
    assert "Nothing to be done" in proc.stdout + proc.stderr


def expected_counts(campaign) -> dict[str, int]:
    """Jobs per rule a campaign should plan (dlmpipe.campaign.Campaign)."""
    b, t, decoded = len(campaign.backbones), len(campaign.tasks), len(campaign.decoding_jobs())
    counts = {"prepare_backbone": b,
              "prepare_task": t, "generate": decoded, "score": decoded, "summarize": 1,
              "plot": 1, "plot_sweeps": 1, "all": 1,
              "time_method": decoded}  # each method timed against the reference, per (b, t)
    if campaign.config["tables"]:
        counts["tables"] = 1  # every paper table of the campaign, one local job
    # one SVD per backbone that an SPA method (singular proxy) decodes or a drift profile reads
    drift_backbones = {backbone for backbone, _, _ in campaign.analysis_targets("drift")}
    if (svd := sum(any(campaign.needs_proxies(m, bb) for m in campaign.methods) or bb in drift_backbones
                   for bb in campaign.backbones)):
        counts["svd"] = svd
    # analyses (docs/ANALYSES.md): a model job and a local table/figure job per target; the
    # intervention's two branches are scored like generations
    per_target = {"shadow": {"shadow_probe": 1, "shadow_analysis": 1},
                  "intervention": {"intervention": 1, "score_branch": 2, "intervention_analysis": 1},
                  "drift": {"drift_profile": 1, "drift_analysis": 1}}
    for kind, rules in per_target.items():
        n = len(campaign.analysis_targets(kind))
        for rule, jobs in rules.items():
            if n:
                counts[rule] = jobs * n
    if (trained := sum(map(campaign.is_toy, campaign.backbones))):
        counts["train_toy"] = trained  # shipped and path backbones are not trained
    if (fetched := sum(map(campaign.is_hub, campaign.backbones))):
        counts["fetch_backbone"] = fetched  # a local fetch job per Hub checkpoint
    if (fetched := sum(map(campaign.reads_dataset_ids, campaign.tasks))):
        counts["fetch_dataset"] = fetched
    shards = campaign.config["shards"]
    if shards > 1:  # N generate jobs per method, joined by one merge before scoring
        counts["generate"] *= shards
        counts["merge_generations"] = decoded
    return counts
