"""The ``compile`` option (dlmpipe/graphs.py): exactness with it on, and the capture logic.

CUDA graphs run only on a GPU (benchmarks/device_check.py checks their tokens there); here the
same capture/replay logic runs with tests/host_sync.py's ``replay_capture`` standing in for the
graph: it replays the recorded operations on the captured tensors, so a step that depends on
anything the capture did not pin (a reallocated buffer, a changed host value, a host read) goes
wrong here as it would on a GPU. torch.compile runs on the CPU for real (slow: seconds to compile).
"""
from __future__ import annotations

import copy

import pytest
import torch

from dlmpipe import graphs
from dlmpipe.decode import decode
from dlmpipe.graphs import StepRunner
from dlmpipe.methods import build_method

from .host_sync import HostReadInCapture, replay_capture
from .models import FAMILIES, decode_method, random_prompt, tiny_backbone

SABER = {"name": "saber", "n": 2, "mu": 2}
LLADA = {"name": "llada_confidence", "block_length": 8}
ARCHER_INF = {"name": "archer", "K": "inf"}


@pytest.fixture
def cpu_capture(monkeypatch):
    monkeypatch.setitem(graphs.CAPTURE, "cpu", replay_capture)


def test_unknown_modes_and_cuda_graphs_without_cuda_are_refused():
    with pytest.raises(ValueError, match="compile: unknown mode 'jit'"):
        StepRunner(lambda x: x, "jit")
    model = tiny_backbone("llada")
    with pytest.raises(ValueError, match="cuda_graphs needs a CUDA device; the model is on cpu"):
        build_method({"sampler": LLADA, "cache": ARCHER_INF}, model, compile="cuda_graphs")


def test_the_stand_in_replays_captured_memory_not_the_python(cpu_capture):
    """What makes the stand-in a test of the capture logic: replay reads the captured tensors
    (a replaced one is not seen), inputs go through the static buffers, host reads fail."""
    state = {"w": torch.tensor([2.0, 3.0])}
    runner = StepRunner(lambda x: x * state["w"], "cuda_graphs")
    assert torch.equal(runner(torch.tensor([1.0, 1.0])), torch.tensor([2.0, 3.0]))
    out = runner(torch.tensor([2.0, 1.0]))
    assert torch.equal(out, torch.tensor([4.0, 3.0])) and runner.captures == 1
    state["w"] = torch.tensor([10.0, 10.0])  # reallocated without a new state_key: not seen
    assert torch.equal(runner(torch.tensor([1.0, 1.0])), torch.tensor([2.0, 3.0]))
    assert torch.equal(runner(torch.tensor([1.0, 1.0]), state_key=1), torch.tensor([10.0, 10.0]))
    assert runner.captures == 2
    with pytest.raises(HostReadInCapture):
        replay_capture(lambda x: x * int(x.sum()), (torch.ones(2),))


def test_a_failed_capture_warns_runs_its_key_eagerly_and_the_next_key_captures(cpu_capture):
    """A capture that raises midway (here the stand-in, at a host read a graph cannot hold; on a
    GPU also an allocator or memory error) leaves the runner usable: that key runs eagerly with
    a warning naming the step and the error, other keys capture and replay as before (one graph
    per runner, for the latest key: dlmpipe/graphs.py)."""
    def step(x):
        return x * (int(x.sum()) if x.numel() == 3 else 2)  # a host read for 3 elements only
    runner = StepRunner(step, "cuda_graphs")
    with pytest.warns(graphs.CaptureFailed, match="capturing .*step failed .HostReadInCapture"):
        assert torch.equal(runner(torch.ones(3)), torch.full((3,), 3.0))
    assert torch.equal(runner(torch.full((3,), 2.0)), torch.full((3,), 12.0)) and runner.captures == 0
    assert torch.equal(runner(torch.ones(2)), torch.full((2,), 2.0)) and runner.captures == 1
    assert torch.equal(runner(torch.full((2,), 3.0)), torch.full((2,), 6.0)) and runner.captures == 1
    with pytest.warns(graphs.CaptureFailed):  # tried again: another key released the attempt
        runner(torch.ones(3))
    # one graph per runner: the 2-element graph went with the key change, captured anew
    assert torch.equal(runner(torch.ones(2)), torch.full((2,), 2.0)) and runner.captures == 2


def test_a_capture_that_could_not_be_unwound_is_not_run_eagerly(monkeypatch):
    def lost(fn, inputs):
        raise graphs.CaptureStateLost("the stand-in's CUDA state is lost")
    monkeypatch.setitem(graphs.CAPTURE, "cpu", lost)
    with pytest.raises(graphs.CaptureStateLost):
        StepRunner(lambda x: x * 2, "cuda_graphs")(torch.ones(2))


@pytest.mark.parametrize("family", FAMILIES)
def test_captured_steps_decode_the_eager_tokens(cpu_capture, family):
    """Archer's cached forward and LLaDA confidence's scoring, captured once per shape and
    replayed, give the eager tokens and statistics; a sample of the same shape reuses the
    capture, another prompt length captures again; a copy (snapshots) captures its own. Two
    layers: the cached forward's every per-layer path (layer 0's K/V and a later layer's, which
    reads layer 0's output) is in the capture (issue 46)."""
    model = tiny_backbone(family, seed=3, n_layers=2)
    for sampler in (SABER, LLADA, {**LLADA, "temperature": 1.0}):
        s, c = build_method({"sampler": sampler, "cache": ARCHER_INF}, model, compile="cuda_graphs")
        for i, p_len in enumerate((7, 7, 12)):
            prompt = random_prompt(p_len, i)
            ref = decode_method(model, sampler, ARCHER_INF, prompt, seed=i)
            got = decode(model, s, c, prompt, 16, torch.Generator().manual_seed(i))
            assert torch.equal(got.response, ref.response), (sampler, p_len)
            assert got.stats == ref.stats
            assert c.cached_step.captures == (1 if p_len == 7 else 2)
        if sampler["name"] == "llada_confidence":
            assert s.scoring.captures == 1  # the same shape every step and block
        twin = copy.deepcopy(c)
        assert twin.cached_step.captures == 0 and twin.cached_step.fn.__self__ is twin
        got = decode(model, copy.deepcopy(s), twin, prompt, 16, torch.Generator().manual_seed(2))
        assert torch.equal(got.response, ref.response) and twin.cached_step.captures == 1


@pytest.mark.slow
def test_torch_compile_decodes_the_eager_tokens(tmp_path, monkeypatch):
    """Inductor on the CPU (tens of seconds to compile): Dream's GQA and shifted logits, Archer's
    cached forward and LLaDA confidence's scoring compiled. Fused kernels may round otherwise,
    which may move a near tie; this tiny model has none. Its cost is Inductor's C++ compiler,
    about a CPU second per fused kernel: 4 per layer and 4 more (12 at 2 layers; the second
    sample, of the same length, compiles none). 2 layers are the fewest where a layer reads
    another's output and keeps its K/V apart from the first layer's (one layer cannot check it)."""
    # Inductor's own cache directory, empty: the test compiles, as on a fresh machine, whatever an
    # earlier run left in the machine-wide one (whose keys miss ATEN_CPU_CAPABILITY: kernels cached
    # by a run under ATEN_CPU_CAPABILITY=avx2 abort the process in a run without it, torch 2.13)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    model = tiny_backbone("dream", seed=3, n_layers=2)
    s, c = build_method({"sampler": LLADA, "cache": ARCHER_INF}, model, compile="torch_compile")
    for i, p_len in enumerate((7, 7)):
        prompt = random_prompt(p_len, i)
        ref = decode_method(model, LLADA, ARCHER_INF, prompt)
        got = decode(model, s, c, prompt, 16)
        assert torch.equal(got.response, ref.response)
        assert got.stats == ref.stats
