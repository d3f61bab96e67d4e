"""Shared fixtures: one torch thread, test campaigns, a Snakemake runner, the trained toy, and
the ``device`` parameter of the tests that run on every device (``--dlmpipe-device``).

Helpers that are not fixtures live in tests/models.py (tiny models, decoding, hand-built
logits), tests/workflow.py (running Snakemake, reading dry runs) and tests/checkpoints.py
(checkpoints in the real on-disk formats).
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from .workflow import CONFIGS, REPO, run_snakemake  # noqa: F401  (re-exported for the tests)


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


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny models: one thread is fastest, and immune to a busy machine's oversubscription."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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


@pytest.fixture(scope="session")
def toy_backbone(tmp_path_factory):
    """The toy backbone trained briefly (40 steps), loaded."""
    from dlmpipe.backbones import load_backbone

    from .models import toy_checkpoint_dir

    return load_backbone(toy_checkpoint_dir(tmp_path_factory.mktemp("toy")))
