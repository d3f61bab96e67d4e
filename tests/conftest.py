"""Shared fixtures: the repository, test campaigns, and a Snakemake runner."""
from __future__ import annotations

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
