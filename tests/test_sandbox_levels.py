"""Choosing the isolation level fails closed: without bubblewrap (simulated with DLMPIPE_BWRAP)
the default refuses before any program runs, with one message naming both ways out; the opt-in
process level works and is recorded; a transient self-check failure is retried and never
downgrades. Only benign programs run here."""
from __future__ import annotations

import json
import marshal
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest

from dlmpipe.cli import main as cli
from dlmpipe.scoring import levels, sandbox
from dlmpipe.scoring.confine import layer_support
from dlmpipe.scoring.levels import SandboxUnavailable, isolation, requested_level
from dlmpipe.scoring.score import score_many
from dlmpipe.tasks.registry import load_task

REPO = Path(__file__).resolve().parents[1]
BWRAP = shutil.which("bwrap") or "/usr/bin/bwrap"
PROCESS_LEVEL = "+".join(("process", *(k for k, v in layer_support().items() if not v)))


@pytest.fixture
def no_bwrap(monkeypatch):
    """A machine without bubblewrap, as far as the sandbox can tell."""
    monkeypatch.setenv("DLMPIPE_BWRAP", "/nonexistent/bwrap")
    monkeypatch.delenv("DLMPIPE_SANDBOX", raising=False)


@pytest.fixture
def spawned(monkeypatch):
    """Every program the scorer hands to a sandbox (the JSON job's ``program``)."""
    programs, execute = [], sandbox._execute

    def spy(iso, limits, cpu_s, wall, payload, env, popen_kwargs, **kwargs):
        # the driver's bytecode comes first on stdin where it could be compiled (sandbox.py)
        job = payload[len(sandbox._driver_code(iso.python)) if kwargs.get("boot") else 0:]
        programs.append(marshal.loads(job)["program"])
        return execute(iso, limits, cpu_s, wall, payload, env, popen_kwargs, **kwargs)

    monkeypatch.setattr(sandbox, "_execute", spy)
    return programs


def code_pairs(n=3):
    rows = load_task("toy_code", n=n, seed=3)
    return [(r, r["answer"]) for r in rows]


def test_default_refuses_without_bwrap_and_runs_nothing(no_bwrap, spawned):
    with pytest.raises(SandboxUnavailable) as e:
        score_many(code_pairs())
    assert spawned == []  # not even a self-check: nothing to check
    message = str(e.value)
    for needed in ("bubblewrap (bwrap) is not installed", "Nothing was run",
                   "sudo apt-get install bubblewrap", "sandbox: process", "--sandbox process",
                   "DLMPIPE_SANDBOX=process", PROCESS_LEVEL, "PID namespace"):
        assert needed in message, (needed, message)


def test_broken_bwrap_refuses_after_running_only_its_self_check(monkeypatch, spawned):
    monkeypatch.setenv("DLMPIPE_BWRAP", "/bin/false")
    with pytest.raises(SandboxUnavailable, match="sandbox did not start"):
        levels._choose("bwrap")
    assert spawned and all("assert sys.version_info" in p for p in spawned)


def test_exact_match_tasks_need_no_sandbox(no_bwrap):
    rows = load_task("toy_arith", n=2, seed=5)
    results = score_many([(r, r["answer"]) for r in rows])
    assert [r["passed"] for r in results] == [True, True]
    assert {r["isolation"] for r in results} == {"none"}


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_opt_in_process_level_runs_and_is_recorded(no_bwrap, monkeypatch, how):
    if how == "environment":
        monkeypatch.setenv("DLMPIPE_SANDBOX", "process")
    results = score_many(code_pairs(), sandbox="process" if how == "argument" else None)
    assert all(r["passed"] for r in results)
    assert {r["isolation"] for r in results} == {PROCESS_LEVEL}


def test_auto_falls_back_only_where_bwrap_is_missing(no_bwrap):
    assert isolation("auto").level == PROCESS_LEVEL


def test_requested_level():
    assert requested_level("process") == "process"
    with pytest.raises(ValueError, match="bwrap, process, auto"):
        requested_level("none")


def _fake_bwrap(failures: int) -> Path:
    """A bwrap that fails ``failures`` times with EAGAIN, then runs the real one. It runs as the
    sandbox uid, so it lives in a directory anyone may read, with a counter anyone may write."""
    if not os.access(BWRAP, os.X_OK):
        pytest.skip("bubblewrap is not installed")
    d = Path(tempfile.mkdtemp(prefix="dlmpipe-fake-bwrap-"))
    os.chmod(d, 0o755)
    counter = d / "calls"
    counter.write_text("")
    os.chmod(counter, 0o666)
    script = d / "bwrap"
    script.write_text(f"""#!/bin/sh
echo x >> {counter}
if [ "$(wc -l < {counter})" -le {failures} ]; then
  echo "bwrap: Creating new namespace failed: Resource temporarily unavailable" >&2
  exit 1
fi
exec {BWRAP} "$@"
""")
    script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH | 0o044)
    return script


def test_transient_self_check_failure_is_retried(monkeypatch):
    script = _fake_bwrap(failures=2)
    try:
        monkeypatch.setenv("DLMPIPE_BWRAP", str(script))
        monkeypatch.setenv("DLMPIPE_SANDBOX_PYTHON", levels._python_candidates()[0])
        iso = levels._choose("bwrap")
        assert iso.level == "bwrap"
        assert len((script.parent / "calls").read_text().split()) == 3
    finally:
        shutil.rmtree(script.parent)


def test_a_lasting_transient_failure_never_downgrades(monkeypatch):
    script = _fake_bwrap(failures=10 ** 6)
    checked = []
    check = levels._check

    def spy(iso, retry_s):
        checked.append(iso.level)
        return check(iso, retry_s)

    try:
        monkeypatch.setenv("DLMPIPE_BWRAP", str(script))
        monkeypatch.setenv("DLMPIPE_SANDBOX_PYTHON", levels._python_candidates()[0])
        monkeypatch.setattr(levels, "START_RETRY_S", 0.5)
        monkeypatch.setattr(levels, "_check", spy)
        with pytest.raises(SandboxUnavailable, match="transient") as e:
            levels._choose("auto")  # auto opts in to falling back, but not on a transient error
        assert "downgraded" in str(e.value)
        assert set(checked) == {"bwrap"}
        assert len((script.parent / "calls").read_text().split()) > len(checked)  # retried
    finally:
        shutil.rmtree(script.parent)


# ---- the command line -----------------------------------------------------------------------


def _score_samples(tmp_path, capsys, *args):
    """``dlmpipe score-samples`` in this process (``main``: its exit status, stdout, stderr),
    where bubblewrap is missing (the ``no_bwrap`` fixture). ``python -m dlmpipe`` only exits
    with what ``main`` returns (dlmpipe/__main__.py; test_cli.py runs it)."""
    rows = load_task("toy_code", n=3, seed=3)
    samples = tmp_path / "samples.jsonl"
    samples.write_text("".join(json.dumps({"task_id": r["task_id"], "completion": r["answer"]})
                               + "\n" for r in rows))
    out = tmp_path / "scored.jsonl"
    status = cli(["score-samples", "--task", "toy_code", "--samples", str(samples), "--out",
                  str(out), "--options", '{"n": 3, "seed": 3}', *args])
    captured = capsys.readouterr()
    return status, captured.out, captured.err, out


def test_score_samples_refuses_without_bwrap(tmp_path, no_bwrap, capsys):
    status, _, err, out = _score_samples(tmp_path, capsys)
    assert status == 2, err
    assert "dlmpipe score-samples: error: no sandbox for untrusted code" in err
    assert "--sandbox process" in err and "Traceback" not in err
    assert not out.exists()


def test_score_samples_opt_in_warns_in_its_closing_lines(tmp_path, no_bwrap, capsys):
    status, stdout, err, out = _score_samples(tmp_path, capsys, "--sandbox", "process")
    assert status == 0, err
    assert {json.loads(line)["isolation"] for line in out.open()} == {PROCESS_LEVEL}
    last = stdout.strip().splitlines()[-1]
    assert last.startswith(f"WARNING: 3 of 3 samples ran under {PROCESS_LEVEL} isolation, "
                           "weaker than bubblewrap:"), stdout


def test_check_sandbox_stops_a_campaign_without_bwrap(tmp_path, no_bwrap, capsys, monkeypatch):
    monkeypatch.chdir(REPO)  # the campaign's config.yaml, as `make campaign` runs it
    assert cli(["check-sandbox", "--", "-n"]) == 2  # config.yaml: no opt-in
    assert "sudo apt-get install bubblewrap" in capsys.readouterr().err
    opted_in = tmp_path / "campaign.yaml"
    opted_in.write_text((REPO / "tests" / "configs" / "tiny.yaml").read_text()
                        + "sandbox: process\n")
    for args in (["--configfile", str(opted_in)], ["--config", "sandbox=process"]):
        status = cli(["check-sandbox", "--", *args])
        captured = capsys.readouterr()
        assert status == 0, captured.err
        assert f"scoring will use {PROCESS_LEVEL}" in captured.out
        assert "WARNING" in captured.out and "weaker than bubblewrap" in captured.out


def test_make_campaign_checks_the_sandbox_before_snakemake():
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    lines = subprocess.run(["make", "-n", "campaign", "ARGS=--configfile x.yaml"], cwd=REPO,
                           capture_output=True, text=True, check=True).stdout.splitlines()
    check = next(i for i, line in enumerate(lines)
                 if "dlmpipe check-sandbox -- --configfile x.yaml" in line)
    run = next(i for i, line in enumerate(lines) if "snakemake --cores" in line)
    assert check < run
