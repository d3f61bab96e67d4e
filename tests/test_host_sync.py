"""The decode loop reads nothing back to the host inside a step except what a decision needs
(docs/ARCHITECTURE.md, performance shape), counted on the CPU with tests/host_sync.py; on a GPU
benchmarks/device_check.py runs the cached step under ``torch.cuda.set_sync_debug_mode``."""
from __future__ import annotations

import pytest
import torch

from dlmpipe import registry
from dlmpipe.methods import build_cache, build_sampler

from .host_sync import (CACHE_READS, SAMPLER_READS, SAMPLER_SPECS, counted, expected_reads, host_reads,
                        per_step_reads)
from .models import FAMILIES, MASK_ID, random_prompt, tiny_backbone


def test_every_sampler_and_cache_has_a_budget():
    assert set(SAMPLER_READS) == set(registry.SAMPLERS)
    assert {spec["name"] for spec, _, _ in CACHE_READS.values()} == set(registry.CACHES)


@pytest.mark.parametrize("inference", [False, True])
def test_the_counter_sees_every_kind_of_host_read(monkeypatch, inference):
    """Each of tests/host_sync.py's rules (its docstring), and what stays free: with a CUDA
    tensor ``t``, each of ``reads`` waits for the device once, ``multinomial`` twice (inside its
    kernel), none of ``free``."""
    t, rows = torch.tensor([0.0, 2.0, 0.0, 3.0]), torch.zeros(2, 4)
    mask, index = t > 1, torch.tensor([1, 3])
    probs = torch.tensor([[0.5, 0.5]])
    reads = [lambda: t.sum().item(), lambda: int(t[1]), lambda: bool(t[0]), lambda: t.tolist(),  # 1.
             lambda: t.cpu(), lambda: torch.equal(t, t),
             lambda: t.nonzero(), lambda: torch.where(mask), lambda: t[mask],  # 2.
             lambda: t.__setitem__(mask, t[index]), lambda: t.masked_select(mask), lambda: t.unique(),
             lambda: torch.repeat_interleave(index),
             lambda: torch.tensor(1.0), lambda: t.__setitem__(index, 1.0),  # 3.
             lambda: t.__setitem__(0, 1.0), lambda: t[[1, 3]]]
    free = [lambda: t.sum(), lambda: t[index], lambda: t.__setitem__(index, t[index]), lambda: t.topk(2),
            lambda: t.__setitem__(0, t[1]), lambda: t.__setitem__(slice(1, 3), 1.0),
            lambda: rows.__setitem__(0, 1.0), lambda: torch.where(mask, t, 0.0),
            lambda: t.masked_fill(mask, 0.0), lambda: t.index_fill(0, index, 1.0),
            lambda: t.scatter(0, index, 1.0), lambda: torch.repeat_interleave(index, output_size=4),
            lambda: torch.multinomial(probs, 2, replacement=True)]
    cases = [(fn, 1) for fn in reads] + [(lambda: torch.multinomial(probs, 1), 2)] + [(fn, 0) for fn in free]
    with host_reads(monkeypatch) as counter, torch.inference_mode(inference):
        for i, (fn, want) in enumerate(cases):
            before = counter.count
            counted(counter, fn)()
            assert counter.count == before + want, (i, counter.where[before:])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cache_id", list(CACHE_READS))
def test_a_step_reads_back_only_what_its_decisions_need(monkeypatch, family, cache_id):
    # 2 layers: every per-layer path of the caches (layer 0 and the later ones) runs in a step
    model = tiny_backbone(family, seed=4, n_layers=2)
    prompt = random_prompt(9, 4)
    spec = CACHE_READS[cache_id][0]
    for s_name in SAMPLER_READS:
        if registry.pairing_problem(s_name, spec["name"]) or registry.attention_problems(
                {"sampler": {"name": s_name}, "cache": spec}, "full"):
            continue  # (the releases' block loops: block-causal backbones only)
        sampler = build_sampler(SAMPLER_SPECS[s_name])
        with host_reads(monkeypatch) as counter:
            response, steps = per_step_reads(counter, model, sampler, build_cache(spec, model), prompt)
        assert (response != MASK_ID).all()
        assert steps == expected_reads(s_name, cache_id, len(steps)), (s_name, counter.where)
