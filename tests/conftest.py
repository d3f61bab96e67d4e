"""Shared fixtures: the repository, test campaigns, and a Snakemake runner."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
CONFIGS = Path(__file__).resolve().parent / "configs"


def run_snakemake(workdir: Path, *args: str, configfile: Path | None = None,
                  check: bool = True) -> subprocess.CompletedProcess:
    """Run this repository's workflow in ``workdir`` (its own .snakemake and results)."""
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"),
           "--directory", str(workdir), *args]
    if configfile is not None:
        cmd += ["--configfile", str(configfile)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=workdir)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


@pytest.fixture(scope="session")
def snakemake():
    """``snakemake(workdir, *args, configfile=None, check=True)`` -> CompletedProcess."""
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


DIRECTORY_RULES = {"train_toy", "plot"}  # rules whose output is a directory


def _real_commands_available() -> bool:
    if os.environ.get("DLMPIPE_DAG_TOUCH") == "1":
        return False
    return all(importlib.util.find_spec(m) is not None
               for m in ("dlmpipe.generate", "dlmpipe.scoring.score"))


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory, snakemake):
    """A workdir holding a finished run of the tiny campaign, shared by the tests that read one
    (they must not change it). Real (the tiny campaign, trained and decoded in seconds) when the
    generate and score commands are importable, otherwise faked: every output created empty and
    then ``snakemake --touch --forceall`` records the metadata a real run would (params
    included). ``DLMPIPE_DAG_TOUCH=1`` forces the fake."""
    workdir = tmp_path_factory.mktemp("finished")
    config = CONFIGS / "tiny.yaml"
    if _real_commands_available():
        snakemake(workdir, "--cores", "2", configfile=config)
        assert (workdir / "results" / "summary.csv").is_file()
        assert list((workdir / "results" / "plots").glob("pareto_*.png"))
    else:
        summary = snakemake(workdir, "--summary", configfile=config).stdout
        for line in summary.splitlines()[1:]:
            path, rule = line.split("\t")[0], line.split("\t")[2]
            if rule in DIRECTORY_RULES:
                (workdir / path).mkdir(parents=True, exist_ok=True)
            else:
                (workdir / path).parent.mkdir(parents=True, exist_ok=True)
                (workdir / path).touch()
        snakemake(workdir, "--touch", "--forceall", "--cores", "1", configfile=config)
    proc = snakemake(workdir, "-n", configfile=config)
    assert "Nothing to be done" in proc.stdout + proc.stderr
    return workdir
