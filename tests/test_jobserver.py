"""The local job server (dlmpipe/jobserver.py): a served job is the job a fresh process runs (its
directory, environment, thread count, streams and exit status), stays killable, and a local
Snakemake run serves its jobs and stops the server when it ends.

The mechanics run against a server whose ``dlmpipe.cli.main`` is a stand-in (``STAND_IN``) that
reports what the job sees, exits, raises, signals itself or sleeps on request: cheap, and each
behaviour is observable. The last test runs the real workflow."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .workflow import REPO, served_local_run

STAND_IN = '''
import os, signal, sys, time
import torch
import dlmpipe.cli
from dlmpipe import jobserver

def main(argv):
    what = argv[0]
    if what == "report":
        print("cwd", os.getcwd())
        print("env", os.environ.get("PROBE", ""))
        print("threads", torch.get_num_threads())
        print("argv", " ".join(sys.argv[1:]))
        print("to stderr", file=sys.stderr)
        return 0
    if what == "exit":
        return int(argv[1])
    if what == "raise":
        raise RuntimeError("the job failed")
    if what == "signal":
        os.kill(os.getpid(), int(argv[1]))
        time.sleep(5)
    if what == "sleep":
        open(argv[1], "w").write(str(os.getpid()))
        time.sleep(60)
    return 9

dlmpipe.cli.main = main
jobserver.serve(sys.argv[1])
'''


def _stand_in_server(root: Path):
    """Starts a stand-in server under ``root``; yields (socket path, its Popen); stops it."""
    script = root / "server.py"
    script.write_text(STAND_IN)
    path = root / "s" / "socket"
    path.parent.mkdir(mode=0o700)
    proc = subprocess.Popen([sys.executable, str(script), str(path)], stdin=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.time() + 60
    while not path.exists():
        assert proc.poll() is None and time.time() < deadline, "the server never listened"
        time.sleep(0.02)
    yield path, proc
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A running stand-in server, (socket path, its Popen), shared by the tests of served jobs
    (each job is a fork of its own: a job run, exited, signalled or killed before leaves the
    server as it was; its start-up imports torch, a second of CPU)."""
    yield from _stand_in_server(tmp_path_factory.mktemp("server"))


@pytest.fixture
def own_server(tmp_path):
    """A stand-in server of this test's own (one the test stops)."""
    yield from _stand_in_server(tmp_path)


def client(path, *argv, cwd=None, env=None, **kwargs) -> subprocess.Popen:
    """``python -m dlmpipe <argv>`` told to use the server at ``path``."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "DLMPIPE_JOB_SERVER": str(path), **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "dlmpipe", *argv], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_a_served_job_runs_in_the_clients_directory_environment_and_streams(server, tmp_path, threads):
    path, _ = server
    work = tmp_path / "work"
    work.mkdir()
    out, err = client(path, "report", "--flag", cwd=work,
                      env={"PROBE": f"p{threads}", "OMP_NUM_THREADS": threads}).communicate(timeout=60)
    assert out.splitlines() == [f"cwd {work}", f"env p{threads}", f"threads {threads}",
                                "argv report --flag"]
    assert err == "to stderr\n"


def test_a_served_job_exits_as_the_job_did(server):
    path, _ = server
    proc = client(path, "exit", "3")
    proc.communicate(timeout=60)
    assert proc.returncode == 3
    proc = client(path, "raise")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and "RuntimeError: the job failed" in err
    proc = client(path, "signal", str(int(signal.SIGTERM)))
    proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM  # died by the child's signal


def _job_pid(pid_file: Path, proc: subprocess.Popen) -> int:
    deadline = time.time() + 60
    while not pid_file.exists() or not pid_file.read_text():
        assert proc.poll() is None and time.time() < deadline, "the served job never started"
        time.sleep(0.02)
    return int(pid_file.read_text())


def _gone(pid: int, within: float = 10) -> bool:
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.01)
    return False


def test_a_signal_to_the_client_reaches_the_job(server, tmp_path):
    path, _ = server
    proc = client(path, "sleep", str(tmp_path / "pid"))
    job = _job_pid(tmp_path / "pid", proc)
    assert job != proc.pid  # the job runs in the server's child
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM
    assert _gone(job)


def test_a_client_killed_outright_takes_its_job_with_it(server, tmp_path):
    path, _ = server
    proc = client(path, "sleep", str(tmp_path / "pid"))
    job = _job_pid(tmp_path / "pid", proc)
    proc.kill()  # SIGKILL: nothing can be forwarded; the job sees its client's socket close
    proc.communicate(timeout=30)
    assert _gone(job, within=2), "the job outlived its killed client"


def test_without_a_reachable_server_the_command_runs_itself(tmp_path):
    for value in (str(tmp_path / "no-such-socket"), "0"):
        proc = client(value, "--help")
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0 and "job commands" in out
        assert ("unreachable" in err) == (value != "0")  # a fallback says so; opting out is quiet


def test_the_server_stops_when_its_stdin_closes(own_server):
    path, proc = own_server
    proc.stdin.close()
    assert proc.wait(timeout=30) == 0
    assert not path.exists()


def test_a_local_snakemake_run_serves_its_jobs_and_stops_the_server(finished_run, tmp_path, tiny_config,
                                                                   write_config):
    """The real workflow: every `python -m dlmpipe` command of a local run is served (the server's
    count at its exit is the number of such commands Snakemake printed), and the server is gone
    with its socket's directory when the run ends. The run is the session's local run of the
    tiny campaign (conftest's ``finished_run``, run by tests/workflow.py's ``served_local_run``),
    where it is real; else a run of one method on two samples here."""
    record = finished_run.with_suffix(".json")
    if record.exists():
        run = json.loads(record.read_text())
        log, left = run["log"], run["tmpdir_left"]
    else:
        tiny_config["tasks"] = {"toy_arith": {**tiny_config["tasks"]["toy_arith"], "n": 2}}
        tiny_config["methods"] = {"llada-confidence": tiny_config["methods"]["llada-confidence"]}
        proc, left = served_local_run(tmp_path, "--cores", "2",
                                      configfile=write_config(tiny_config, tmp_path / "one.yaml"))
        log = proc.stdout + proc.stderr
    commands = log.count("python -m dlmpipe ")
    served = [int(line.split("served ")[1].split()[0]) for line in log.splitlines()
              if line.startswith("dlmpipe job server: served")]
    assert commands >= 5 and served == [commands], log[-3000:]
    assert not [name for name in left if name.startswith("dlmpipe-jobs-")], "the server left its socket behind"
