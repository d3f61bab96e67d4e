"""`make device-check` in its CPU-sized mode (benchmarks/device_check.py), end to end: the script
that GPU time is spent on is known to run before that time is spent."""
from __future__ import annotations

import json
import re
import runpy
import sys

import pytest

from .workflow import REPO


def run_script(path, *args: str) -> int:
    """``python PATH ARGS`` in this interpreter (``runpy`` runs the file as ``__main__``, its
    ``sys.path`` set-up and argument parsing included; the commands it starts, pytest and
    Snakemake, are processes of their own as before): its exit status. What the script changes
    in this process is put back: ``sys.argv``, ``sys.path`` and the CPU replay stand-in it
    installs for CUDA graphs (part 3), which the other tests of this worker must not see."""
    from dlmpipe import graphs

    argv, path_before, capture = sys.argv[:], sys.path[:], dict(graphs.CAPTURE)
    sys.argv = [str(path), *args]
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    finally:
        sys.argv, sys.path[:] = argv, path_before
        graphs.CAPTURE.clear()
        graphs.CAPTURE.update(capture)
    return 0


@pytest.mark.slow
def test_device_check_runs_every_part_on_a_cpu(tmp_path, monkeypatch, capsys):
    """Run in this process (a fresh interpreter's imports cost ~2 CPU s; issue 46): what is
    tested is the script and its parts, not the process it starts in (`make device-check` runs
    it as ``python benchmarks/device_check.py``, which is what ``runpy`` does here)."""
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.chdir(REPO)
    returncode = run_script(REPO / "benchmarks" / "device_check.py", "--device", "cpu")
    out, err = capsys.readouterr()
    report = (tmp_path / "device_check.txt").read_text()
    failed = [line for line in report.splitlines() if "[FAIL]" in line or ": raised" in line]
    assert returncode == 0, "\n".join(failed) + "\n" + out[-4000:] + err[-4000:]
    assert report.startswith("dlmpipe device check: no GPU")
    for part in ("== 1.", "== 2.", "== 3.", "== 4.", "== 5.", "== 6.", "== 7.", "== 8.", "== 9.", "== 10.",
                 "== summary"):
        assert part in report
    assert "[FAIL]" not in report and "all checks passed" in report
    data = json.loads((tmp_path / "device_check.json").read_text())
    assert data["failures"] == []
    assert set(data["timings_s"]) == {"forwards", "exactness", "compiled", "syncs", "table",
                                      "campaign", "moe", "torch_compile", "batching", "floors", "total"}
    # the table: both models, every prompt length, Archer and every SPA budget, positive times
    table = data["table"]
    assert {r["model"] for r in table} == {"llada-8b", "dream-7b"}
    assert {r["step"] for r in table} == {"archer", "dual", "spa 0.05", "spa 0.1", "spa 0.2", "spa 0.3",
                                          "spa 0.5"}
    assert all(r["ms"] > 0 and r["ideal"] > 1 and r["floor_ms"] > 0 for r in table)
    # part 10: every figure against its floor, in one table (issue 48)
    figures = [r["figure"] for r in data["floors"]]
    assert all(r["ratio"] > 0 for r in data["floors"])
    for kind in ("full step, P", "archer step", "dual step", "vs the matrix peak", "whole decode",
                 "at batch 4 vs batch 1", "MoE layer LLaDA-MoE", "MoE layer LLaDA2.0-mini"):
        assert any(kind in f for f in figures), kind
    assert set(data["memory"]) >= {"weights_gib", "none", "archer", "spa", "dkv_greedy"}
    assert data["memory"]["archer"]["held_gib"] > data["memory"]["none"]["held_gib"]
    assert all(v["max_abs_diff"] <= v["limit"] for v in data["forwards"].values())
    assert "passed" in data["exactness"]
    # part 4, CPU-sized: every cache, each with a sampler it pairs with, and every sampler that
    # pairs with a cache on full attention (the families it decodes) at least once
    from dlmpipe import registry

    from .host_sync import CACHE_READS, SAMPLER_READS

    syncs = report.split("== 4.")[1].split("== 5.")[0]
    checked = re.findall(r"\[ok\] dream (\S+): (.*) within budget", syncs)
    assert {c for c, _ in checked} == set(CACHE_READS)
    pairing = {s for s in SAMPLER_READS for spec, _, _ in CACHE_READS.values()
               if not (registry.pairing_problem(s, spec["name"])
                       or registry.attention_problems({"sampler": {"name": s}, "cache": spec}, "full"))}
    assert {s for _, names in checked for s in names.split(", ")} >= pairing
    # the campaign part compared a CPU re-run's tokens with the campaign's
    assert "the same tokens for all 2 samples" in report
    # batched decoding: the CPU-sized run checks batch invariance of each method it times
    assert set(data["batching"]) == {"full", "archer-k8", "fast-dllm-dual"}
    assert data["batching_bf16"]["samples"] == 2 and "bf16 on cpu, batch 4 vs 1" in report
    # the MoE part (benchmarks/device_moe.py): the layer against its floor at both releases'
    # routing, the mini-shaped decode with the release loop and a cache, batch invariance
    assert {(r["model"], r["rows"]) for r in data["moe_layer"]} == {
        (m, n) for m in ("LLaDA-MoE-7B-A1B", "LLaDA2.0-mini") for n in (32, 128)}
    assert all(r["moe_ms"] > 0 and r["dense_ms"] > 0 for r in data["moe_layer"])
    assert {"llada2-generate", "fast-dllm-parallel"} <= set(data["moe_decode"])
    assert all(data["moe_decode"][m]["ms_per_step"] > 0 for m in ("llada2-generate", "fast-dllm-parallel"))
    assert data["moe_decode"]["batch2_identical"] == 2
    assert data["moe_invariance"] == {"layer_rows_differing": 0, "logits_samples_differing": 0}
    for line in ("MoE layer vs dense SwiGLU", "LLaDA2.0-mini shapes (narrowed", "ms per step",
                 "tiny LLaDA2.0 (8 experts", "alone vs in a batch of 4", "batch 2 vs batch 1"):
        assert line in report
