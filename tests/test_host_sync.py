"""The decode loop reads nothing back to the host inside a step except what a decision needs
(docs/ARCHITECTURE.md, performance shape), counted on the CPU with tests/host_sync.py; on a GPU
benchmarks/device_check.py runs the cached step under ``torch.cuda.set_sync_debug_mode``."""
from __future__ import annotations

import pytest
import torch

from dlmpipe import registry
from dlmpipe.decode import decode
from dlmpipe.methods import build_cache, build_sampler

from .host_sync import counted, host_reads
from .models import FAMILIES, MASK_ID, random_prompt, tiny_backbone

#: host reads per step the sampler's decision needs
SAMPLER_READS = {"llada_confidence": 0, "random_order": 0, "saber": 1, "threshold": 1, "factor": 1}
SAMPLERS = {name: {"name": name, "block_length": 8} for name in SAMPLER_READS}
#: cache spec -> host reads per step (the first step, the later ones) its decision needs
CACHES = {
    "none": ({"name": "none"}, 0, 0),
    "archer-kinf": ({"name": "archer", "K": "inf"}, 0, 0),
    "archer-k4": ({"name": "archer", "K": 4}, 0, 1),   # the Hamming distance, once anchored
    "archer-age": ({"name": "archer", "refresh": "age", "A": 3}, 0, 0),
    "fast_dllm_prefix": ({"name": "fast_dllm_prefix"}, 0, 0),
    "fast_dllm_dual": ({"name": "fast_dllm_dual"}, 0, 0),
    "dkv_decode": ({"name": "dkv_decode", "refresh_interval": 3}, 1, 1),  # the row sets' sizes
    "dkv_greedy": ({"name": "dkv_greedy"}, 1, 1),
    "spa": ({"name": "spa", "rank": 8, "refresh_gen_steps": 3}, 0, 0),
    "dllm_cache": ({"name": "dllm_cache", "K_r": 3}, 0, 0),
}


def test_every_sampler_and_cache_has_a_budget():
    assert set(SAMPLER_READS) == set(registry.SAMPLERS)
    assert {spec["name"] for spec, _, _ in CACHES.values()} == set(registry.CACHES)


def test_the_counter_sees_every_kind_of_host_read(monkeypatch):
    t = torch.tensor([0.0, 2.0, 0.0, 3.0])
    mask, index = t > 1, torch.tensor([1, 3])
    reads = [lambda: t.sum().item(), lambda: int(t[1]), lambda: bool(t[0]), lambda: t.tolist(),
             lambda: t.cpu(), lambda: t.nonzero(), lambda: t[mask], lambda: t.__setitem__(mask, 1.0),
             lambda: torch.tensor(1.0), lambda: t.masked_select(mask)]
    free = [lambda: t.sum(), lambda: t[index], lambda: t.__setitem__(index, 1.0), lambda: t.topk(2),
            lambda: torch.where(mask, t, 0.0), lambda: t.masked_fill(mask, 0.0)]
    with host_reads(monkeypatch) as counter:
        for i, fn in enumerate(reads + free):
            before = counter.count
            counted(counter, fn)()
            assert counter.count == before + (i < len(reads)), (i, counter.where[before:])


def _per_step_reads(monkeypatch, model, sampler, cache, prompt):
    """Host reads inside each step of the real decode loop (its four seam calls)."""
    steps: list[int] = []
    with host_reads(monkeypatch) as counter:
        for obj, name in ((cache, "note_due_positions"), (sampler, "due_positions"),
                          (cache, "response_logits")):
            setattr(obj, name, counted(counter, getattr(obj, name)))
        inner = counted(counter, sampler.step)

        def step(x, logits):
            inner(x, logits)
            steps.append(counter.count - sum(steps))
        sampler.step = step
        out = decode(model, sampler, cache, prompt, 16, torch.Generator().manual_seed(0))
    return out, steps, counter.where


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cache_id", list(CACHES))
def test_a_step_reads_back_only_what_its_decisions_need(monkeypatch, family, cache_id):
    model = tiny_backbone(family, seed=4)
    prompt = random_prompt(9, 4)
    spec, first, later = CACHES[cache_id]
    for s_name, s_reads in SAMPLER_READS.items():
        if registry.pairing_problem(s_name, spec["name"]):
            continue
        sampler, cache = build_sampler(SAMPLERS[s_name]), build_cache(spec, model)
        out, steps, where = _per_step_reads(monkeypatch, model, sampler, cache, prompt)
        assert (out.response != MASK_ID).all()
        expected = [s_reads + (first if i == 0 else later) for i in range(len(steps))]
        assert steps == expected, (s_name, where)
