"""Sweep figures: which sweeps the campaign exposes, where each swept value sits on the axis,
and one figure per (backbone, task, swept base method)."""
from __future__ import annotations

import pandas as pd
import pytest
import yaml

from dlmpipe.analysis.sweeps import plot_sweeps, x_positions
from dlmpipe.campaign import Campaign

from .workflow import REPO


def test_campaign_sweeps_name_each_points_values():
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    config["methods"]["grid"] = {"sampler": {"name": "llada_confidence"},
                                 "cache": {"name": "dllm_cache"},
                                 "sweep": {"cache.K_r": [4, 8], "cache.rho": [0.1, 0.25]}}
    sweeps = Campaign(config).sweeps()
    # swept bases with two or more points only (fast-dllm-dual etc. are single methods)
    assert list(sweeps) == ["archer", "spa", "grid"]
    assert sweeps["archer"] == {"keys": ["cache.K"], "points": {
        "archer-k1": [1], "archer-k4": [4], "archer-kinf": ["inf"]}}
    assert sweeps["spa"] == {"keys": ["cache.rho_p"], "points": {
        "spa-r128-adaptive-p0.25": [0.25], "spa-r128-adaptive-p0.5": [0.5]}}
    assert sweeps["grid"]["keys"] == ["cache.K_r", "cache.rho"]
    assert sweeps["grid"]["points"]["grid-k_r8-rho0.1"] == [8, 0.1]


def test_axis_positions():
    at, log = x_positions([1, 2, 4, 8, "inf"])  # Archer's K: log2, inf one doubling past 8
    assert log and at == {1: 1.0, 2: 2.0, 4: 4.0, 8: 8.0, "inf": 16.0}
    at, log = x_positions([512, 256, 128, 64, 32])  # ranks: log2, in their own order
    assert log and at[512] == 512.0
    at, log = x_positions([0.125, 0.25, 0.5])  # fractions stay linear
    assert not log and at == {0.125: 0.125, 0.25: 0.25, 0.5: 0.5}
    at, log = x_positions(["adaptive", "uniform"])  # categories in sweep order
    assert not log and at == {"adaptive": 0.0, "uniform": 1.0}
    at, log = x_positions([2, 3, "inf"])  # a short linear grid: inf one spacing further
    assert not log and at["inf"] == 4.0


def _summary(with_tps: bool) -> pd.DataFrame:
    rows = []
    for task in ("code", "arith"):
        for m, q, s in (("ref", 0.5, 1.0), ("archer-k1", 0.5, 1.0), ("archer-k8", 0.6, 2.0),
                        ("archer-kinf", 0.4, 3.0), ("other", 0.3, 1.5)):
            rows.append({"backbone": "toy", "task": task, "method": m, "quality": q, "n": 20,
                         "quality_se": (q * (1 - q) / 20) ** 0.5, "speedup": s,
                         "tps": 10 * s if with_tps else float("nan"),
                         "reference": "ref", "quality_plus": float("nan")})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("with_tps", [True, False])
def test_one_figure_per_backbone_task_and_swept_method(tmp_path, with_tps):
    summary = tmp_path / "summary.parquet"
    _summary(with_tps).to_parquet(summary)
    sweeps = {"archer": {"keys": ["cache.K"], "points": {"archer-k1": [1], "archer-k8": [8],
                                                         "archer-kinf": ["inf"]}},
              "absent": {"keys": ["cache.K"], "points": {"x-1": [1], "x-2": [2]}}}
    written = plot_sweeps(summary, sweeps, tmp_path / "sweeps")
    assert sorted(p.name for p in written) == ["sweep_toy_arith_archer.png", "sweep_toy_code_archer.png"]
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and p.stat().st_size > 10_000
