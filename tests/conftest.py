"""Shared fixtures: one torch thread, test campaigns, a Snakemake runner, the trained toy, and
the ``device`` parameter of the tests that run on every device (``--dlmpipe-device``).

Helpers that are not fixtures live in tests/models.py (tiny models, decoding, hand-built
logits), tests/workflow.py (running Snakemake, reading dry runs) and tests/checkpoints.py
(checkpoints in the real on-disk formats).
"""
from __future__ import annotations

import os

# Before torch loads (its OpenMP runtime reads these once), for the test processes and every
# command they start: one thread, as the tests run (``one_thread``), and threads that sleep at an
# OpenMP barrier instead of spinning (dlmpipe/cli.py's job_environment does the same for jobs).
# The test workers already fill the cores: two workers training a toy on 2 threads beside one
# busy process took 32 s each spinning, 10 s sleeping (5 s alone); test_generate_job.py's
# commands alone 62 s at the default 2 threads, 32 s at 1. Snakemake's jobs get their rule's
# threads (Snakemake sets OMP_NUM_THREADS); values set by the user win.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import importlib.util  # noqa: E402
import shutil
from pathlib import Path

import pytest

import dlmpipe  # noqa: F401
import torch
import yaml

from .cpu_time import pytest_runtest_makereport, pytest_runtest_setup  # noqa: F401  (hooks)
from .toy_retraining import ToyRetraining, shared_root
from .workflow import CONFIGS, REPO, fake_finished_run, run_snakemake  # noqa: F401  (re-exported)

RETRAIN_TEST = "test_the_shipped_weights_are_what_train_toy_trains_with_the_recorded_options"
RETRAINING = pytest.StashKey[ToyRetraining]()


def pytest_addoption(parser):
    parser.addoption("--dlmpipe-device", action="append", default=None, metavar="DEVICE",
                     help="device the device-parametrized tests run on (repeatable); default: "
                          "cpu, and cuda where available (benchmarks/device_check.py: cuda)")


def pytest_generate_tests(metafunc):
    """Tests taking ``device`` run once per selected device."""
    if "device" in metafunc.fixturenames:
        devices = metafunc.config.getoption("dlmpipe_device") or (
            ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
        metafunc.parametrize("device", devices)


#: Files of many independent tests whose module fixtures cost seconds: under `make test`'s
#: ``--dist loadgroup`` their tests spread over the workers one by one (each worker builds the
#: cheap fixtures once). Every other file is one xdist group, on one worker, so its costly module
#: fixtures (a campaign run, a trained toy) are built once, as ``--dist loadfile`` would.
SPREAD_FILES = {"test_batching.py", "test_probes.py", "test_exactness.py", "test_engine_exactness.py",
                "test_block_causal.py", "test_block_releases.py", "test_backbones.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist's worker reads the groups
def pytest_collection_modifyitems(session, config, items):
    """The retraining test runs last, so the whole suite overlaps the background training
    (~15 minutes on one core) before the test waits for it. A file not in SPREAD_FILES is one
    xdist group."""
    items.sort(key=lambda item: item.name == RETRAIN_TEST)  # stable: the rest keep their order
    for item in items:
        if item.path.name not in SPREAD_FILES:
            item.add_marker(pytest.mark.xdist_group(item.path.name))


def pytest_collection_finish(session):
    """The shipped toy's retraining takes minutes: start it beside the other tests as soon as
    its test is collected (tests/toy_retraining.py), where it can reproduce the shipped bits.
    Under pytest-xdist the controller starts it (``pytest_xdist_node_collection_finished``)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    if any(item.name == RETRAIN_TEST for item in session.items):
        _start_retraining(session.config, None)


def _start_retraining(config, root: Path | None) -> None:
    from .test_shipped_toy import kernels_differ

    if RETRAINING not in config.stash and not kernels_differ():
        config.stash[RETRAINING] = ToyRetraining(root)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node, ids):
    """On the controller, when a worker has collected: starts the toy's retraining where the
    retraining test was collected (before any test runs: tests/toy_retraining.py), and stops
    the run where ``--dist loadgroup`` does not group: xdist marks a grouped test by suffixing
    its node id with ``@<group>``, which some pytest releases silently undo (pyproject.toml's
    pin), leaving every module fixture to run on every worker."""
    if any(f"::{RETRAIN_TEST}" in i for i in ids):
        _start_retraining(node.config, shared_root(node.workerinput["testrunuid"]))
    if node.config.getvalue("dist") != "loadgroup":
        return
    ungrouped = [i for i in ids if "@" not in i and Path(i.split("::")[0]).name not in SPREAD_FILES]
    if ungrouped:
        pytest.exit(f"--dist loadgroup is not grouping ({ungrouped[0]} has no @group suffix): this "
                    "pytest / pytest-xdist pair ignores xdist_group; see pyproject.toml's pin", 4)


def pytest_sessionfinish(session):
    retraining = session.config.stash.get(RETRAINING, None)
    if retraining is not None:
        retraining.stop()


@pytest.fixture
def toy_retraining(request) -> ToyRetraining:
    """The background retraining of the shipped toy (started at collection)."""
    retraining = request.config.stash.get(RETRAINING, None)
    if retraining is None and (uid := os.environ.get("PYTEST_XDIST_TESTRUNUID")):
        retraining = ToyRetraining.attach(shared_root(uid))  # the controller's
    if retraining is None:
        retraining = request.config.stash[RETRAINING] = ToyRetraining()
    return retraining


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is fastest, and immune to a busy machine's oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def snakemake():
    """``snakemake(workdir, *args, configfile=None, check=True)`` -> CompletedProcess: a fresh
    ``python -m snakemake`` process, for a property that needs one (another environment);
    otherwise ``warm_snakemake``, the same call at about a quarter of the cost."""
    return run_snakemake


@pytest.fixture
def tiny_config() -> dict:
    """The tiny test campaign as a dict, to modify and write with ``write_config``."""
    return yaml.safe_load((CONFIGS / "tiny.yaml").read_text())


@pytest.fixture(scope="session")
def write_config():
    """``write_config(config_dict, path)`` -> path, as YAML."""
    def write(config: dict, path: Path) -> Path:
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        return path
    return write


def _real_commands_available() -> bool:
    if os.environ.get("DLMPIPE_DAG_TOUCH") == "1":
        return False
    return all(importlib.util.find_spec(m) is not None
               for m in ("dlmpipe.generate", "dlmpipe.scoring.score"))


def shared_between_workers(tmp_path_factory) -> Path:
    """A directory every pytest-xdist worker of this session sees (the parent of the workers'
    own base temp directories); the session's base temp directory without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory):
    """A workdir holding a finished run of the tiny campaign, shared by the tests that read one
    (they must not change its outputs): real (trained and decoded in seconds) when the generate
    and score commands are importable, otherwise ``fake_finished_run``. ``DLMPIPE_DAG_TOUCH=1``
    forces the fake. Made once per test session: under pytest-xdist the first worker that asks
    runs it while the others wait on a file lock, then all read the same directory (Snakemake's
    dry runs, --summary and --report take no lock on it). A real run's log (``-p``: the jobs'
    commands) and what its job server left in its TMPDIR are kept beside it, in
    ``finished-run.json`` (tests/workflow.py's ``served_local_run``; tests/test_jobserver.py)."""
    import json

    from filelock import FileLock

    from .workflow import served_local_run

    real = _real_commands_available()
    workdir = shared_between_workers(tmp_path_factory) / ("finished-run" if real else "finished-touch")
    config = CONFIGS / "tiny.yaml"
    done = workdir.with_name(workdir.name + ".done")
    with FileLock(str(workdir) + ".lock"):
        if not done.exists():
            shutil.rmtree(workdir, ignore_errors=True)
            workdir.with_suffix(".json").unlink(missing_ok=True)
            workdir.mkdir()
            if real:
                proc, left = served_local_run(workdir, "--cores", "2", configfile=config)
                workdir.with_suffix(".json").write_text(json.dumps(
                    {"log": proc.stdout + proc.stderr, "tmpdir_left": left}))
                assert (workdir / "results" / "summary.csv").is_file()
                assert list((workdir / "results" / "plots").glob("pareto_*.png"))
            else:
                fake_finished_run(workdir, config)
            done.touch()
    proc = run_snakemake(workdir, "-n", configfile=config)
    assert "Nothing to be done" in proc.stdout + proc.stderr
    return workdir


@pytest.fixture(scope="session")
def warm_snakemake(tmp_path_factory):
    """Like ``snakemake`` (same call, same CompletedProcess), each command forked from one
    process that imported Snakemake and the workflow's modules once (tests/workflow.py's
    WarmSnakemake): a dry run of the tiny campaign in about a quarter of the time."""
    from .workflow import WarmSnakemake

    runner = WarmSnakemake(tmp_path_factory.mktemp("warm-snakemake"))
    yield runner
    runner.close()
