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

from .cpu_time import add_cpu

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


def skip_unless_in_setup_venv() -> Path:
    """The repository's .venv, where this suite runs in it as scripts/setup.sh made it (make
    test, CI); elsewhere the calling test skips, saying so."""
    import sys

    import pytest

    venv = REPO / ".venv"
    if Path(sys.prefix).resolve() != venv.resolve() or not (venv / ".dlmpipe-installed").is_file():
        pytest.skip("not running in the repository's .venv as scripts/setup.sh made it")
    return venv


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


def served_local_run(workdir: Path, *args: str, configfile: Path) -> tuple[subprocess.CompletedProcess, list[str]]:
    """A local run (``run_snakemake`` with ``-p``: each job's command printed) in a TMPDIR of its
    own, where the Snakefile's job server makes its socket's directory (dlmpipe/jobserver.py;
    short: a socket path has < 108 bytes); returns the run and the names left in that TMPDIR
    when it ended (tests/test_jobserver.py reads both), then removes it."""
    import os
    import shutil
    import tempfile

    tmpdir = Path(tempfile.mkdtemp(prefix="js-", dir="/tmp"))
    try:
        proc = run_snakemake(workdir, *args, "-p", configfile=configfile,
                             env={**os.environ, "TMPDIR": str(tmpdir)})
        return proc, sorted(p.name for p in tmpdir.iterdir())
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


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


def fake_finished_run(workdir: Path, config: Path, snakemake=None) -> None:
    """Every output created empty, then the metadata a real run records (params included).
    ``snakemake``: what runs the commands (default ``run_snakemake``; a ``WarmSnakemake``)."""
    run = snakemake or run_snakemake
    summary = run(workdir, "--summary", configfile=config).stdout
    for line in summary.splitlines()[1:]:
        path, rule = line.split("\t")[0], line.split("\t")[2]
        if rule in DIRECTORY_RULES:
            (workdir / path).mkdir(parents=True, exist_ok=True)
        else:
            (workdir / path).parent.mkdir(parents=True, exist_ok=True)
            (workdir / path).touch()
    run(workdir, "--touch", "--forceall", "--cores", "1", configfile=config)
    proc = run(workdir, "-n", configfile=config)
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


# ---- Snakemake commands forked from one warm process ---------------------------------------------
#: modules every Snakemake command of this workflow imports (Snakemake's CLI, API, DAG and
#: storage, the smart_open/requests stack its source cache loads, the profile's yte, dlmpipe's
#: campaign checks and the modules the Snakefile reads): about 1 s of every `python -m snakemake`
#: (1.5-2 s in all for a dry run of the tiny campaign); imported once by the server below, they
#: cost a forked command nothing.
WARM_IMPORTS = ("snakemake.cli", "snakemake.api", "snakemake.dag", "snakemake.workflow",
                "snakemake.persistence", "snakemake.storage", "smart_open", "yte", "jsonschema",
                "packaging.version", "dlmpipe.campaign", "dlmpipe.campaign.files", "dlmpipe.preflight",
                "dlmpipe.analysis", "dlmpipe.batch_size", "dlmpipe.gpus", "dlmpipe.scoring", "dlmpipe.sizes")

# The server: imports WARM_IMPORTS and collects Snakemake's plugins (what its argument parser
# finds installed: about 0.07 s of each command), then for each request line (JSON: cwd, args,
# env, stdout and stderr paths) forks a child that runs `python -m snakemake <args>` as that
# process would (its sys.argv, working directory, environment and standard streams;
# snakemake.cli.main, the code of `python -m snakemake`), and answers "<id> <exit status> <CPU
# seconds>" when the child ends (the server reaps it, so the test's os.times cannot see that
# CPU: the client reports it, add_cpu); a request for a session of its own (WarmSnakemake.start:
# a command the caller kills) is also answered "<id> started <pid>" when it starts.
# Single-threaded (a fork copies no other thread's held locks); requests run side by side.
_FORK_SERVER = r'''
import importlib, importlib.util, json, os, select, sys
for name in json.loads(sys.argv[1]):
    importlib.import_module(name)
import snakemake.cli
snakemake.cli.get_argument_parser()  # collects Snakemake's plugin registries (singletons) once
MAIN = importlib.util.find_spec("snakemake.__main__").origin
children, pending, stdin = {}, b"", sys.stdin.fileno()

def run(request):
    if request.get("session"):  # a process group of its own: the caller may kill it and its jobs
        os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(null, 0), os.dup2(out, 1), os.dup2(err, 2)
    for fd in (null, out, err):
        os.close(fd)
    sys.argv = [MAIN, *request["args"]]
    import snakemake.workflow  # the run directory it records at import: this command's
    snakemake.workflow.Workflow._rundir = os.path.abspath(os.getcwd())
    try:
        snakemake.cli.main(request["args"])
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)

def reap(flags):
    while children:
        pid, status, usage = os.wait4(-1, flags)
        if not pid:
            return
        cpu = usage.ru_utime + usage.ru_stime  # the child's and its waited-for children's
        sys.stdout.write(f"{children.pop(pid)} {os.waitstatus_to_exitcode(status)} {cpu:.6f}\n")
        sys.stdout.flush()

while True:
    ready, _, _ = select.select([stdin], [], [], 0.02)
    if ready:
        data = os.read(stdin, 65536)
        if not data:
            break
        pending += data
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            sys.stdout.flush(), sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                status = 1
                try:
                    status = run(request)
                finally:
                    try:
                        sys.stdout.flush(), sys.stderr.flush()
                    finally:
                        os._exit(status)
            children[pid] = request["id"]
            if request.get("session"):
                sys.stdout.write(f"{request['id']} started {pid}\n")
                sys.stdout.flush()
    reap(os.WNOHANG)
reap(0)
'''


class WarmSnakemake:
    """``run_snakemake`` without the start-up: each command is a process forked from one server
    that has imported Snakemake and the workflow's modules (WARM_IMPORTS), running Snakemake's
    command line (``snakemake.cli.main``) with the same arguments, working directory, environment
    and streams as ``run_snakemake``'s ``python -m snakemake``; the result is the same
    CompletedProcess. Thread-safe: commands from several threads run side by side. ``env``
    (another environment than this process's) falls back to ``run_snakemake``, since a module
    imported by the server may have read the environment."""

    def __init__(self, scratch: Path):
        import itertools
        import json
        import threading

        self._json, self._scratch, self._ids = json, Path(scratch), itertools.count()
        self._lock, self._done, self._status, self._reported = threading.Lock(), {}, {}, 0.0
        self._started, self._pids = {}, {}
        self._server = subprocess.Popen([sys.executable, "-c", _FORK_SERVER, json.dumps(WARM_IMPORTS)],
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                        cwd=self._scratch)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self._server.stdout:
            key, status, cpu = line.split()
            if status == "started":  # a session's process started (start): its pid
                self._pids[int(key)] = int(cpu)
                self._started[int(key)].set()
                continue
            add_cpu(float(cpu))  # before the waiting test resumes: its command's CPU
            self._reported += float(cpu)
            self._status[int(key)] = int(status)
            self._done[int(key)].set()
        for event in [*self._done.values(), *self._started.values()]:  # the server died: wake every waiter
            event.set()

    def __call__(self, workdir: Path, *args: str, configfile: Path | None = None, check: bool = True,
                 env: dict | None = None) -> subprocess.CompletedProcess:
        if env is not None:
            return run_snakemake(workdir, *args, configfile=configfile, check=check, env=env)
        return self._send(workdir, args, configfile)(check)

    def start(self, workdir: Path, *args: str, configfile: Path | None = None):
        """The same command started in a session (process group) of its own, as ``Popen(...,
        start_new_session=True)``: returns (its pid, ``wait(check=True)`` -> CompletedProcess);
        ``os.killpg(pid, ...)`` kills it and the jobs it started."""
        import threading

        key = next(self._ids)
        self._started[key] = threading.Event()
        wait = self._send(workdir, args, configfile, key=key)
        self._started[key].wait()
        del self._started[key]
        if key not in self._pids:
            raise RuntimeError(f"the Snakemake fork server died (exit status {self._server.poll()})")
        return self._pids.pop(key), wait

    def _send(self, workdir: Path, args, configfile: Path | None, key: int | None = None):
        """Sends the request (``key``: a session of its own, ``start``); returns ``wait(check)``."""
        import os
        import threading

        cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"),
               "--directory", str(workdir), *args]
        if configfile is not None:
            cmd += ["--configfile", str(configfile)]
        session = key is not None
        key = next(self._ids) if key is None else key
        out, err = self._scratch / f"{key}.out", self._scratch / f"{key}.err"
        done = self._done[key] = threading.Event()
        request = {"id": key, "cwd": str(workdir), "args": cmd[3:], "env": dict(os.environ),
                   "stdout": str(out), "stderr": str(err), "session": session}
        with self._lock:
            self._server.stdin.write(self._json.dumps(request) + "\n")
            self._server.stdin.flush()

        def wait(check: bool = True) -> subprocess.CompletedProcess:
            done.wait()
            if key not in self._status:
                raise RuntimeError(f"the Snakemake fork server died (exit status {self._server.poll()})")
            proc = subprocess.CompletedProcess(cmd, self._status.pop(key), out.read_text(), err.read_text())
            out.unlink(), err.unlink()
            del self._done[key]
            if check and proc.returncode != 0:
                raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            return proc
        return wait

    def close(self) -> None:
        self._server.stdin.close()
        self._server.wait()
        self._reader.join()
        add_cpu(-self._reported)  # waiting for the server counted its reaped children again


def dry_runs(runs: list[tuple[Path, Path]], parallel: int = 2, check: bool = True,
             snakemake: WarmSnakemake | None = None) -> list[subprocess.CompletedProcess]:
    """``run_snakemake(workdir, "-n", configfile=configfile)`` for each (workdir, configfile),
    ``parallel`` at a time, by ``snakemake`` (default: a WarmSnakemake of their own)."""
    import tempfile
    from concurrent.futures import ThreadPoolExecutor

    with tempfile.TemporaryDirectory() as scratch:
        runner = snakemake or WarmSnakemake(Path(scratch))
        try:
            with ThreadPoolExecutor(max_workers=parallel) as pool:
                return list(pool.map(lambda run: runner(run[0], "-n", configfile=run[1], check=check), runs))
        finally:
            if snakemake is None:
                runner.close()
