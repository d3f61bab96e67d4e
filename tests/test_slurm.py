"""SLURM: the profile (profiles/slurm) dry-runs the default campaign with GPUs on the generate jobs
only, and a real single-node cluster (scripts/slurm-local.sh: munged, slurmctld, slurmd, no
accounting) runs the tiny campaign with the README's command, `--profile slurm` verbatim after
setup's profile step (scripts/slurm-profile.sh, which never replaces an existing `slurm`
profile); its generations and scores equal a local run's. Where SLURM cannot be installed or
started, the cluster test is skipped with the reason (pytest -ra prints it), never passed."""
from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from dlmpipe.campaign import Campaign

from .workflow import CONFIGS, REPO, group_jobs, job_blocks, submissions

PROFILE = REPO / "profiles" / "slurm"
SCRIPT = REPO / "scripts" / "slurm-local.sh"


def readme_command() -> str:
    """The first command of docs/CLUSTER.md (README's way to a cluster), as written there."""
    section = (REPO / "docs" / "CLUSTER.md").read_text().split("\n## ", 1)[0]
    commands = re.findall(r"^(snakemake --cores \S+ --profile \S+)\s*(?:#.*)?$", section, re.M)
    assert commands, "docs/CLUSTER.md shows no `snakemake --cores N --profile ...` line"
    return commands[0]


def job_resources(stdout: str) -> list[tuple[str, dict]]:
    """(rule, resources) of every job of a dry run (-n), those inside group jobs (indented) too."""
    jobs = []
    for rule, body in job_blocks(stdout, in_groups=True):
        found = re.search(r"resources: (.*)", body)
        pairs = re.findall(r"(\w+)=([^,]+)", found.group(1)) if found else []
        jobs.append((rule, {k: v.strip() for k, v in pairs}))
    return jobs


class _Resources(dict):
    """What the slurm plugin reads from ``job.resources`` (``.get`` and attributes)."""

    def __getattr__(self, name):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None


def slurm_gpu_flags(resources: dict) -> str:
    """The sbatch GPU flags snakemake-executor-plugin-slurm builds from a job's resources."""
    from types import SimpleNamespace

    from snakemake_executor_plugin_slurm.utils import set_gres_string

    typed = {k: int(v) if v.isdigit() else v for k, v in resources.items()}
    return set_gres_string(SimpleNamespace(resources=_Resources(typed))).strip()


# ---- the profile, without a cluster -------------------------------------------------------------
# Dry runs without an env of their own are forked from the warm Snakemake (conftest's
# warm_snakemake: Snakemake's command line, the same arguments, directory and environment).
# The rules that run the model (common.smk's model_job_resources): each asks for the GPU partition.
MODEL_RULES = {"generate", "time_method", "shadow_probe", "intervention", "drift_profile"}


def test_profile_dry_runs_the_default_campaign_with_gpus_on_model_jobs(tmp_path, monkeypatch, warm_snakemake):
    monkeypatch.setenv("DLMPIPE_SLURM_PARTITION", "cpuq")
    monkeypatch.setenv("DLMPIPE_SLURM_GPU_PARTITION", "gpuq")
    monkeypatch.setenv("DLMPIPE_SLURM_ACCOUNT", "lab42")
    proc = warm_snakemake(tmp_path, "-n", "--profile", str(PROFILE), "--config", "device=cuda",
                         configfile=REPO / "config.yaml")
    assert "Using profile" in proc.stdout + proc.stderr
    jobs = job_resources(proc.stdout)
    campaign = Campaign(yaml.safe_load((REPO / "config.yaml").read_text()))
    generate = [r for rule, r in jobs if rule == "generate"]
    assert len(generate) == len(campaign.decoding_jobs())  # the methods each backbone runs
    model_jobs = [(rule, r) for rule, r in jobs if rule in MODEL_RULES]
    assert {rule for rule, _ in model_jobs} == MODEL_RULES  # the default campaign runs every kind
    for rule, res in model_jobs:
        assert res["gpu"] == "1" and res["slurm_partition"] == "gpuq" and res["slurm_account"] == "lab42", rule
        assert slurm_gpu_flags(res) == "--gpus=1", rule
    others = [(rule, r) for rule, r in jobs if rule not in MODEL_RULES | {"all"}]
    assert {rule for rule, _ in others} >= {"score", "summarize", "plot"}
    assert "train_toy" not in {rule for rule, _ in jobs}  # the default campaign decodes the shipped toy
    for rule, res in others:  # CPU-only: no GPU asked, the CPU partition
        assert "gpu" not in res and slurm_gpu_flags(res) == "", rule
        # a score job shares its generate job's allocation (group decode), so its partition
        assert res["slurm_partition"] == ("gpuq" if rule == "score" else "cpuq"), rule
    assert {name for name, _ in group_jobs(proc.stdout)} == {"decode", "timing"}
    # ungrouped, a score job is a CPU job of its own
    ungrouped = yaml.safe_load((REPO / "config.yaml").read_text())
    ungrouped["cluster"] = {"group_components": {"decode": None}}
    (tmp_path / "ungrouped.yaml").write_text(yaml.safe_dump(ungrouped))
    proc = warm_snakemake(tmp_path, "-n", "--profile", str(PROFILE), "--config", "device=cuda",
                         configfile=tmp_path / "ungrouped.yaml")
    score = [r for rule, r in job_resources(proc.stdout) if rule == "score"]
    assert score and all(r["slurm_partition"] == "cpuq" and "gpu" not in r for r in score)


def test_profile_passes_a_gpu_model_and_no_gpus_on_the_cpu(tmp_path, tiny_config, write_config,
                                                           warm_snakemake):
    tiny_config["resources"]["generate"]["gpu_model"] = "h100"
    config = write_config(tiny_config, tmp_path / "c.yaml")
    for device, want in (("cuda", "--gpus=h100:1"), ("cpu", "")):
        proc = warm_snakemake(tmp_path, "-n", "--profile", str(PROFILE), "--config", f"device={device}",
                             configfile=config)
        generate = [r for rule, r in job_resources(proc.stdout) if rule == "generate"]
        assert generate and all(slurm_gpu_flags(r) == want for r in generate), (device, generate[0])


def test_profile_settings():
    profile = yaml.safe_load((PROFILE / "config.yaml").read_text())
    assert profile["executor"] == "slurm" and profile["slurm-status-command"] == "squeue"
    assert profile["retries"] >= 1 and profile["rerun-incomplete"] is True
    # the plugin in use knows every slurm-* key of the profile
    from snakemake_executor_plugin_slurm import ExecutorSettings

    known = {f"slurm-{name.replace('_', '-')}" for name in ExecutorSettings.__dataclass_fields__}
    keys = {k for k in profile if k.startswith("slurm-")}
    keys |= {k for v in profile.values() if isinstance(v, dict) for k in v if k.startswith("slurm-")}
    assert keys <= known, keys - known
    # the cheap steps never go through the queue
    snakefile = (REPO / "Snakefile").read_text()
    local = re.search(r"localrules:\n((?:    \w+,?\n)+)", snakefile).group(1)
    assert {"prepare_backbone", "prepare_task", "summarize", "plot"} <= set(re.findall(r"\w+", local))
    assert "localrule: True" in (REPO / "workflow/rules/generate.smk").read_text()  # merge_generations


# ---- job groups: few submissions (docs/CLUSTER.md, "Few submissions") ---------------------------
def snakefile_local_rules() -> set[str]:
    """The Snakefile's localrules and every rule declared with `localrule: True`."""
    snakefile = (REPO / "Snakefile").read_text()
    local = set(re.findall(r"\w+", re.search(r"localrules:\n((?:    \w+,?\n)+)", snakefile).group(1)))
    for smk in (REPO / "workflow" / "rules").glob("*.smk"):
        for name, body in re.findall(r"^ *rule (\w+):\n((?:(?: {4,}.*)?\n)*)", smk.read_text(), re.M):
            if re.search(r"^ +localrule: True", body, re.M):
                local.add(name)
    return local


def test_plans_local_rules_are_the_workflows():
    from dlmpipe.plan import LOCAL_RULES

    assert snakefile_local_rules() == set(LOCAL_RULES)


@pytest.mark.parametrize("cluster, shards, override", [
    (None, 1, None),                                                # defaults: decode 1, timing 1
    ({"group_components": {"decode": 4, "timing": 4}}, 1, None),
    ({"group_components": {"decode": 2, "timing": None}}, 2, None),  # shards; timing ungrouped
    ({"group_components": {"decode": 4, "timing": 4}}, 1, {"timing": 6}),  # the command line wins
    ({"group_components": {"decode": 4, "timing": None}}, 1, {"timing": 6}),  # null stays ungrouped
])
def test_profile_groups_jobs_and_plan_counts_its_submissions(tmp_path, tiny_config, write_config,
                                                             warm_snakemake, cluster, shards, override):
    """A dry run with the profile lists group jobs (a method's generate and score jobs in one,
    time_method jobs packed N at a time) and as many submissions as `dlmpipe plan` states."""
    from dlmpipe.plan import LOCAL_RULES, submissions as planned

    tiny_config["shards"] = shards
    if cluster is not None:
        tiny_config["cluster"] = cluster
    config = write_config(tiny_config, tmp_path / "c.yaml")
    args = ["-n", "--profile", str(PROFILE)]
    if override:
        args += ["--group-components", *(f"{g}={n}" for g, n in override.items())]
    out = warm_snakemake(tmp_path, *args, configfile=config).stdout
    campaign = Campaign(yaml.safe_load(config.read_text()), check_paths=False)
    allocations, jobs = planned(campaign, override)
    assert submissions(out, LOCAL_RULES) == allocations < jobs
    if not override:  # and `dlmpipe plan` prints it
        from dlmpipe.plan import render

        assert f"SLURM submissions (profiles/slurm): {allocations} allocations for {jobs} " in render(
            campaign, str(config))
    decoded = len(campaign.decoding_jobs())
    assert jobs == 1 + (shards + 2) * decoded  # train_toy, generate shards, score, time_method
    groups = group_jobs(out)
    sizes = {group: None if n is None else (override or {}).get(group, n)  # null: no group to size
             for group, n in (cluster or {"group_components": {"decode": 1, "timing": 1}})[
                 "group_components"].items()}
    decode = [rules for name, rules in groups if name == "decode"]
    if shards == 1:  # each method's generate and score job together, N methods an allocation
        assert all(sorted(rules) == sorted(["generate", "score"] * (len(rules) // 2)) for rules in decode)
    else:  # the local merge sits between: only the shards are grouped, scores go alone
        assert all(set(rules) == {"generate"} for rules in decode)
        assert sum(rule == "score" for rule, _ in job_blocks(out)) == decoded
    assert len(decode) == -(-(decoded * shards if shards > 1 else decoded) // sizes["decode"])
    timing = [rules for name, rules in groups if name == "timing"]
    if sizes["timing"] is None:
        assert not timing and sum(rule == "time_method" for rule, _ in job_blocks(out)) == decoded
    else:
        assert len(timing) == -(-decoded // sizes["timing"]) and sum(map(len, timing)) == decoded


def test_groups_only_on_a_cluster_and_they_rerun_nothing(tmp_path, tiny_config, write_config,
                                                        finished_run, warm_snakemake):
    """A local dry run shows every job on its own as before (Snakemake runs groups only on a
    cluster), and a finished run planned with the profile's groups, or with other group sizes,
    has nothing to do: grouping changes no job's outputs or params. The finished run is the
    session's shared run of the tiny campaign (conftest's ``finished_run``: dry runs only read
    it; real where the commands are importable, else a --touch fake as here before)."""
    config = write_config(tiny_config, tmp_path / "c.yaml")
    local = warm_snakemake(tmp_path, "-n", configfile=config).stdout
    assert not group_jobs(local) and "Group job" not in local
    tiny_config["cluster"] = {"group_components": {"decode": 3, "timing": None}}
    regrouped = write_config(tiny_config, tmp_path / "regrouped.yaml")
    for configfile in (config, regrouped):
        proc = warm_snakemake(finished_run, "-n", "--profile", str(PROFILE), configfile=configfile)
        assert "Nothing to be done" in proc.stdout + proc.stderr, proc.stdout[-2000:]


# ---- `--profile slurm`: scripts/slurm-profile.sh (make setup) -----------------------------------
PROFILE_SCRIPT = REPO / "scripts" / "slurm-profile.sh"


def profile_dirs(root: Path, env=os.environ) -> dict:
    """``env`` with Snakemake's user and site profile directories under ``root``."""
    return {**env, "XDG_CONFIG_HOME": str(root / "user"), "XDG_CONFIG_DIRS": str(root / "site"),
            "PYTHON": sys.executable}


def link_profile(env: dict) -> subprocess.CompletedProcess:
    proc = subprocess.run(["bash", str(PROFILE_SCRIPT)], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_setup_makes_profile_slurm_dlmpipes(tmp_path, monkeypatch, warm_snakemake):
    env = profile_dirs(tmp_path)
    first, again = link_profile(env), link_profile(env)  # idempotent
    link = tmp_path / "user" / "snakemake" / "slurm"
    assert link.is_symlink() and link.resolve() == PROFILE.resolve()
    assert "linked" in first.stdout and "uses dlmpipe's profile" in again.stdout
    # `--profile slurm` verbatim, from any working directory: dlmpipe's profile and its settings
    # (forked from the warm Snakemake in this environment: Snakemake looks for profiles, and the
    # profile reads its settings, when the command runs)
    workdir = tmp_path / "work"
    workdir.mkdir()
    for name in ("XDG_CONFIG_HOME", "XDG_CONFIG_DIRS"):
        monkeypatch.setenv(name, env[name])
    monkeypatch.setenv("DLMPIPE_SLURM_PARTITION", "cpuq")
    proc = warm_snakemake(workdir, "-n", "--profile", "slurm", configfile=CONFIGS / "tiny.yaml")
    # "Using profiles slurm and workflow specific profile .../profiles/default" (files.py)
    assert re.search(r"Using profiles? slurm\b", proc.stdout + proc.stderr)
    jobs = [r for rule, r in job_resources(proc.stdout) if rule == "generate"]
    assert jobs and all(r["slurm_partition"] == "cpuq" for r in jobs)


def test_setup_re_links_a_profile_link_to_a_checkout_that_is_gone(tmp_path):
    """A link setup made from a checkout since moved or deleted is mended; any other dangling
    `slurm` entry (not a dlmpipe profile's path) is left as it is."""
    env = profile_dirs(tmp_path)
    link = tmp_path / "user" / "snakemake" / "slurm"
    link.parent.mkdir(parents=True)
    link.symlink_to(tmp_path / "gone" / "main" / "profiles" / "slurm")
    proc = link_profile(env)
    assert "re-linked" in proc.stdout and link.resolve() == PROFILE.resolve()
    link.unlink()
    link.symlink_to(tmp_path / "someone-elses-profile")
    proc = link_profile(env)
    assert "left as it is" in proc.stdout
    assert os.readlink(link) == str(tmp_path / "someone-elses-profile")


def test_setup_makes_the_profile_step_on_every_machine():
    """scripts/setup.sh runs slurm-profile.sh unconditionally (not only where sbatch is on PATH),
    so that `--profile slurm` is found everywhere and says, without SLURM, how to run here."""
    setup = (REPO / "scripts" / "setup.sh").read_text()
    calls = [line for line in setup.splitlines() if "scripts/slurm-profile.sh" in line
             and not line.lstrip().startswith("#")]
    assert calls == ["PYTHON=$VENV/bin/python bash scripts/slurm-profile.sh"]  # top level: no if
    assert "command -v sbatch" not in setup


@pytest.mark.parametrize("where", ["user", "site"])
def test_setup_never_replaces_or_shadows_a_slurm_profile(tmp_path, where):
    env = profile_dirs(tmp_path)
    theirs = tmp_path / where / "snakemake" / "slurm"
    theirs.mkdir(parents=True)
    (theirs / "config.yaml").write_text("executor: slurm\nslurm-account: theirs\n")
    proc = link_profile(env)
    assert (theirs / "config.yaml").read_text() == "executor: slurm\nslurm-account: theirs\n"
    assert not theirs.is_symlink() and sorted(p.name for p in theirs.iterdir()) == ["config.yaml"]
    # no user link in front of the site's profile either
    assert not (tmp_path / "user" / "snakemake" / "slurm").is_symlink()
    assert f"already exists ({theirs})" in proc.stdout and "--profile profiles/slurm" in proc.stdout


# ---- without SLURM: the pre-flight (dlmpipe/preflight.py) ---------------------------------------
def without_slurm(tmp_path: Path) -> dict:
    """The environment with a PATH that has this interpreter's directory and the few tools
    Snakemake and the plugin call (which, bash, sh), and none of SLURM's commands."""
    from dlmpipe.preflight import SLURM_COMMANDS

    tools = tmp_path / "bin"
    tools.mkdir(exist_ok=True)
    for tool in ("which", "bash", "sh"):
        (tools / tool).symlink_to(shutil.which(tool))
    path = os.pathsep.join([str(tools), str(Path(sys.executable).parent)])
    assert not any(shutil.which(c, path=path) for c in SLURM_COMMANDS)
    return {**os.environ, "PATH": path}


def ran_no_job(proc: subprocess.CompletedProcess, workdir: Path) -> bool:
    return (not re.search(r"^(local)?rule \w+:", proc.stdout, re.M)
            and not (workdir / "results").exists())


def test_without_slurm_the_profile_stops_before_any_job_saying_how_to_run_here(tmp_path):
    env = without_slurm(tmp_path)
    config = CONFIGS / "tiny.yaml"
    proc = subprocess.run([sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"),
                           "--cores", "2", "--profile", str(PROFILE), "--configfile", str(config)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert (f"SLURM pre-flight: --profile {PROFILE} submits the jobs to SLURM (executor slurm), but "
            "sbatch, squeue, sacct, scontrol, scancel and sinfo are not on PATH") in out
    assert "Nothing was run." in out
    assert (f"To run the campaign on this machine instead: snakemake -s {REPO / 'Snakefile'} "
            f"--cores 2 --configfile {config}\n") in out  # not `make campaign`: the default campaign
    assert ran_no_job(proc, tmp_path)


def test_without_slurm_the_verbatim_profile_slurm_is_found_and_stops(tmp_path):
    """`snakemake --cores 2 --profile slurm` verbatim, from the repository root, after setup's
    profile step (which runs on every machine): the pre-flight, not "no profile.yaml found"."""
    link_profile(profile_dirs(tmp_path))
    env = {**profile_dirs(tmp_path), "PATH": without_slurm(tmp_path)["PATH"]}
    proc = subprocess.run([sys.executable, "-m", "snakemake", "--cores", "2", "--profile", "slurm"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "no profile.yaml" not in out
    assert "SLURM pre-flight: --profile slurm submits the jobs to SLURM" in out
    assert "To run the campaign on this machine instead: snakemake --cores 2  (or: make campaign)" in out
    assert not re.search(r"^(local)?rule \w+:", proc.stdout, re.M)


def test_without_slurm_a_dry_run_plans_and_warns(tmp_path, monkeypatch, warm_snakemake):
    # forked from the warm Snakemake with this PATH (the pre-flight looks SLURM's commands up
    # when the command runs: dlmpipe/preflight.py)
    monkeypatch.setenv("PATH", without_slurm(tmp_path)["PATH"])
    proc = warm_snakemake(tmp_path, "-n", "--profile", str(PROFILE), configfile=CONFIGS / "tiny.yaml")
    out = proc.stdout + proc.stderr
    assert "are not on PATH" in out and "A run stops here, before any job; this dry run only plans." in out
    assert "generate" in job_resources_rules(proc.stdout) and not (tmp_path / "results").exists()


def test_with_slurms_commands_on_path_there_is_no_preflight_message(tmp_path, monkeypatch, warm_snakemake):
    from dlmpipe.preflight import SLURM_COMMANDS

    env = without_slurm(tmp_path)
    fake = tmp_path / "slurm-bin"
    fake.mkdir()
    for command in SLURM_COMMANDS:  # never run by a dry run
        (fake / command).write_text("#!/bin/sh\nexit 1\n")
        (fake / command).chmod(0o755)
    monkeypatch.setenv("PATH", os.pathsep.join([str(fake), env["PATH"]]))  # as the test above
    proc = warm_snakemake(tmp_path, "-n", "--profile", str(PROFILE), configfile=CONFIGS / "tiny.yaml")
    assert "SLURM pre-flight" not in proc.stdout + proc.stderr
    assert "generate" in job_resources_rules(proc.stdout)


def job_resources_rules(stdout: str) -> set[str]:
    return {rule for rule, _ in job_resources(stdout)}


# ---- a real cluster -----------------------------------------------------------------------------
def _script(*args: str, env: dict, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def slurm_cluster():
    """A running single-node cluster: the one slurm-local.sh already runs, else one started
    here (installing the packages when root) and stopped again at the end."""
    if not sys.platform.startswith("linux") or shutil.which("bash") is None:
        pytest.skip("SLURM test: needs Linux and bash")
    env = dict(os.environ)
    running = _script("running", env=env)
    if running.returncode == 0:
        env["SLURM_LOCAL_DIR"] = running.stdout.strip()
        yield env
        return
    env["SLURM_LOCAL_DIR"] = str(Path(tempfile.gettempdir()) / f"dlmpipe-slurm-test-{os.getpid()}")
    start = ["start", "--install"] if os.geteuid() == 0 else ["start"]
    t0 = time.time()
    try:
        proc = _script(*start, env=env, timeout=900)
    except subprocess.TimeoutExpired:
        _script("stop", env=env)
        pytest.skip("SLURM cannot start here: scripts/slurm-local.sh start took over 15 minutes")
    if proc.returncode != 0:
        _script("stop", env=env)
        reasons = [line for line in proc.stderr.splitlines() if "cannot start" in line]
        reason = reasons[-1] if reasons else proc.stderr.strip()[-500:] or f"exit {proc.returncode}"
        print(f"\n{reason}", file=sys.stderr)
        pytest.skip(f"SLURM cannot start here: {reason}")
    print(f"\nslurm-local started in {time.time() - t0:.0f} s: {proc.stderr.strip()}", file=sys.stderr)
    try:
        yield env
    finally:
        stop = _script("stop", env=env)
        assert stop.returncode == 0, stop.stderr
        assert not Path(env["SLURM_LOCAL_DIR"]).exists()


def _results(workdir: Path, tasks: set | None = None, methods: set | None = None) -> dict:
    """Per (task, method): token ids and scores by sample; the summary's quality (of ``tasks``
    and ``methods``, default all)."""
    out = {}
    results = workdir / "results"
    for path in sorted((results / "generations").glob("*/*/*.parquet")):
        key = (path.parent.name, path.stem)
        if (tasks is not None and key[0] not in tasks) or (methods is not None and key[1] not in methods):
            continue
        gen = pq.read_table(path).to_pylist()
        scores = pq.read_table(results / "scores" / path.parent.parent.name / path.parent.name
                               / path.name).to_pylist()
        out[key] = {"tokens": {r["sample_index"]: r["token_ids"] for r in gen},
                    "scores": {r["sample_index"]: (r["passed"], r["status"]) for r in scores}}
    summary = pq.read_table(results / "summary.parquet").to_pylist()
    out["quality"] = sorted((r["task"], r["method"], r["quality"]) for r in summary
                            if (tasks is None or r["task"] in tasks)
                            and (methods is None or r["method"] in methods))
    return out


def test_tiny_campaign_on_slurm_matches_a_local_run(slurm_cluster, finished_run, tmp_path, tiny_config,
                                                   write_config):
    """The local run is the session's run of the same campaign (conftest's ``finished_run``): the
    resources set here are scheduling settings, which never change results (test_workflow_dag)."""
    local = finished_run
    if not (local / "results" / "summary.csv").stat().st_size:
        pytest.skip("the finished run is faked (DLMPIPE_DAG_TOUCH=1): no local results to compare")
    # scheduling only (never changes results): memory a small CI node can give
    tiny_config["resources"] = {"train_toy": {"mem_mb": 500},
                                "generate": {"threads": 1, "mem_mb": 1000},
                                "score": {"threads": 1, "mem_mb": 500}}
    # the smallest campaign that shows each property: one task, two methods (the reference and
    # Archer K=inf); each method's generate and score jobs in an allocation of their own (a
    # group job, split in two), the timing jobs packed in one allocation of three (left
    # partial); the timing stage at its smallest (its times are not compared). Each job costs
    # two Snakemake start-ups in its allocation besides its commands.
    del tiny_config["tasks"]["toy_arith"]
    tiny_config["methods"]["archer"]["sweep"] = {"cache.K": ["inf"]}
    tiny_config["timing"] = {"samples": 1, "repeats": 1}
    tiny_config["cluster"] = {"group_components": {"decode": 1, "timing": 3}}
    config = write_config(tiny_config, tmp_path / "tiny.yaml")
    cluster = tmp_path / "slurm"
    cluster.mkdir()

    # README: setup's profile step (in this test's own profile directories), activate the
    # environment, optional site settings, then its command verbatim
    bindir = str(Path(sys.executable).parent)
    env = {**profile_dirs(tmp_path / "profiles", slurm_cluster),
           "PATH": bindir + os.pathsep + slurm_cluster.get("PATH", ""),
           "VIRTUAL_ENV": str(Path(bindir).parent),
           # poll squeue often: the test's jobs take seconds. The plugin waits this long after a
           # check that saw a job end and 10 s more after each that saw none: 2 s ran this test
           # in 33-35 s where 5 s took 46 s (same machine, same load)
           "DLMPIPE_SLURM_STATUS_DELAY": "2"}
    link_profile(env)
    argv = shlex.split(readme_command())
    assert argv[-2:] == ["--profile", "slurm"], argv
    if shutil.which(argv[0], path=env["PATH"]) is None:
        argv[:1] = [sys.executable, "-m", "snakemake"]
    argv += ["--configfile", str(config), "--directory", str(cluster)]
    t0 = time.time()
    try:
        proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired as e:
        subprocess.run(["scancel", "--full", "--partition=local"], env=env, capture_output=True)
        raise AssertionError(f"the SLURM run took over 10 minutes:\n{(e.stdout or b'')[-3000:]!r}")
    took = time.time() - t0
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"{' '.join(argv)} failed:\n{log[-5000:]}"
    print(f"\nSLURM run of the tiny campaign: {took:.0f} s", file=sys.stderr)

    # every non-local job went through sbatch, in as many allocations as `dlmpipe plan` states,
    # fewer than the jobs (train_toy alone, the groups of generate + score and of time_method);
    # the cheap ones ran here
    from dlmpipe.plan import submissions as planned

    submitted = re.findall(r"has been submitted with SLURM jobid (\d+)", log)
    campaign = Campaign(yaml.safe_load(config.read_text()))
    decoding = len(campaign.backbones) * len(campaign.tasks) * len(campaign.methods)
    allocations, jobs = planned(campaign)
    assert jobs == 1 + 3 * decoding and decoding == 2  # train_toy, generate, score, time_method
    assert len(submitted) == allocations == 1 + decoding + 1 < jobs, log[-3000:]
    # what each submission was: the plugin names its log directory by rule or group job
    kinds = re.findall(r"has been submitted with SLURM jobid \d+ \(log: .*?/slurm_logs/([^/\s]+)/", log)
    assert len(kinds) == allocations, log[-3000:]
    assert kinds.count("rule_train_toy") == 1, kinds
    # (the plugin names a group job's log directory by the group and the rules it holds)
    assert kinds.count("group_decode_generate_score") == decoding, kinds  # one per method
    assert kinds.count("group_timing_time_method") == 1, kinds  # both time_method jobs
    assert re.search(r"^localrule (prepare_task|summarize|plot):", log, re.M)
    assert not re.search(r"^rule (prepare_task|prepare_backbone|summarize|plot):", log, re.M)

    # the same tokens and scores as the local run of that task (timings differ)
    got, want = _results(cluster), _results(local, tasks=set(campaign.tasks), methods=set(campaign.methods))
    assert set(got) == set(want) and len(got) == decoding + 1
    for key in want:
        assert got[key] == want[key], key
