"""Batch invariance: a sample decoded in a batch (dlmpipe/batching.py) gets the tokens and the
decoding statistics it gets alone, for every sampler x cache the registry allows, on both
families, with prompts of different lengths and more samples than slots (continuous batching).

The reference is the plain batch-1 ``decode``; the batched runs use B = 3 and B = 8 slots over
10 samples. Float32 on the CPU: any row whose result depended on how many rows share a call
would show up as a different token somewhere in this matrix (it did, before the Backbone padded
projections of fewer than 4 rows: tests below pin that primitive too).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dlmpipe import registry
from dlmpipe.backbones.model import MIN_GEMM_ROWS, linear
from dlmpipe.batching import BatchScheduler, Sample, SlotModel, decode_batched, slot_models
from dlmpipe.methods import build_method

from .models import FAMILIES, MASK_ID, decode_method, random_prompt, tiny_backbone
from .test_exactness import DEGENERATE

GEN = 16
N_SAMPLES = 10
STATS = ("steps", "nfe", "refreshes", "cached_forwards", "revisions")


def sampler_at_defaults(name: str) -> dict:
    """A sampler at its registry defaults, in blocks of 8 where it has blocks (GEN = 16)."""
    params = registry.SAMPLERS[name].params
    return {"name": name, **({"block_length": 8} if "block_length" in params else {})}


def cache_at_defaults(name: str) -> dict:
    return {"name": name, **({"rank": 8} if name == "spa" else {})}


def allowed_pairings() -> list[tuple[dict, dict]]:
    return [(sampler_at_defaults(s), cache_at_defaults(c))
            for s in registry.SAMPLERS for c in registry.CACHES
            if not registry.pairing_problem(s, c)]


def prompts() -> list[torch.Tensor]:
    return [random_prompt(4 + 3 * (i % 5), i) for i in range(N_SAMPLES)]  # 5 lengths, 4..16


def decode_all(model, sampler: dict, cache: dict, batch_size: int) -> dict:
    method = {"sampler": sampler, "cache": cache}
    slots = slot_models(model, batch_size)
    methods = [build_method(method, slot) for slot in slots]
    samples = [Sample(i, p, GEN, torch.Generator().manual_seed(i)) for i, p in enumerate(prompts())]
    out: dict = {}

    def done(sample, res):
        assert sample.key not in out  # every sample once
        out[sample.key] = res

    decode_batched(model, methods, samples, done)
    assert sorted(out) == list(range(N_SAMPLES))
    return out


def check_invariant(model, sampler: dict, cache: dict, sizes=(3, 8)) -> None:
    refs = [decode_method(model, sampler, cache, p, GEN, seed=i) for i, p in enumerate(prompts())]
    for b in sizes:
        got = decode_all(model, sampler, cache, b)
        for i, ref in enumerate(refs):
            label = (sampler["name"], cache["name"], b, i)
            assert torch.equal(got[i].response, ref.response), label
            assert {k: got[i].stats[k] for k in STATS} == {k: ref.stats[k] for k in STATS}, label
            assert got[i].time_s > 0 and got[i].ttft_s <= got[i].time_s


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("sampler", list(registry.SAMPLERS))
def test_every_allowed_pairing_is_batch_invariant(family, sampler):
    """Each sampler at its defaults with every cache it may pair with, each cache at its
    defaults: tokens and statistics at B = 3 and B = 8 equal B = 1 for every sample."""
    model = tiny_backbone(family, seed=3)
    pairs = [(s, c) for s, c in allowed_pairings() if s["name"] == sampler]
    assert pairs
    for s, c in pairs:
        check_invariant(model, s, c)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", list(DEGENERATE))
def test_degenerate_rows_are_batch_invariant(family, name):
    """The exactness table's rows (caches at their degenerate settings, the papers' samplers)."""
    sampler, cache, _ = DEGENERATE[name]
    check_invariant(tiny_backbone(family, seed=1, n_layers=4), sampler, cache, sizes=(3,))


def test_the_scheduler_batches_rows_of_several_slots():
    """With 4 slots most leaf requests share a call: far fewer calls than requests."""
    model = tiny_backbone("llada", seed=0)
    slots = slot_models(model, 4)
    methods = [build_method({"sampler": {"name": "llada_confidence", "block_length": 8},
                             "cache": {"name": "archer", "K": 4}}, s) for s in slots]
    samples = [Sample(i, random_prompt(6, 0), GEN) for i in range(8)]
    sched = decode_batched(model, methods, samples, lambda s, r: None)
    assert sched.requests > 2.5 * sched.calls, (sched.requests, sched.calls)


def test_slot_model_is_the_backbone_on_one_slot():
    """A full forward through one slot's stand-in equals the backbone's own."""
    model = tiny_backbone("dream", seed=2)
    slot = SlotModel(model, BatchScheduler(model))
    ids = random_prompt(12, 0)[None]
    out = {}

    def body():
        out["logits"] = slot(ids)

    slot.scheduler.run([body])
    assert torch.equal(out["logits"], model(ids))


def test_cpu_projection_of_few_rows_equals_the_same_rows_in_a_large_call():
    """The primitive batch invariance rests on: a row's projection does not depend on how many
    rows share the call. MKL's small-M sgemm path (1-3 rows) rounds differently; ``linear``
    pads to ``MIN_GEMM_ROWS``. Fails if the padding is removed or the threshold is too low."""
    torch.manual_seed(0)
    proj = torch.nn.Linear(128, 96)
    for rows in range(1, 9):
        x = torch.randn(rows, 128)
        alone = linear(proj, x[None])[0]
        shared = linear(proj, torch.cat([torch.randn(5, 128), x, torch.randn(20, 128)])[None])[0, 5:5 + rows]
        assert torch.equal(alone, shared), rows
    assert MIN_GEMM_ROWS >= 4
    # the bias-free projections and 2-d inputs too
    head = torch.nn.Linear(128, 64, bias=False)
    x = torch.randn(2, 128)
    assert torch.equal(linear(head, x), linear(head, torch.cat([x, torch.randn(9, 128)]))[:2])
    assert torch.equal(linear(head, x), F.linear(torch.cat([x, x.new_zeros(2, 128)]), head.weight)[:2])


def test_finished_rows_leave_and_new_samples_join():
    """Continuous batching: with samples of very different lengths of work, slots that finish
    take the next sample; all samples decode once, each as alone."""
    model = tiny_backbone("llada", seed=4)
    sampler, cache = {"name": "threshold", "tau": 0.9, "block_length": 8}, {"name": "fast_dllm_dual"}
    check_invariant(model, sampler, cache, sizes=(2, 16))  # 16 slots > 10 samples: some idle
    assert (decode_all(model, sampler, cache, 2)[0].response != MASK_ID).all()


def test_padded_attention_matches_each_call_closely():
    """The CUDA half-precision path (keys padded and masked, queries padded and dropped) on the
    CPU: the same attention up to rounding, each call's own shape; not bitwise, hence off in
    float32 (module docstring of dlmpipe/batching.py)."""
    from dlmpipe.batching import _padded_attend

    model = tiny_backbone("dream", seed=0)  # GQA: 4 query heads over 2 K/V heads
    g = torch.Generator().manual_seed(0)
    args = [(torch.randn(1, 4, tq, 16, generator=g), torch.randn(1, 2, tk, 16, generator=g),
             torch.randn(1, 2, tk, 16, generator=g)) for tq, tk in ((3, 10), (8, 24), (1, 17))]
    for (q, k, v), got in zip(args, _padded_attend(model, args)):
        want = model.attend(q, k, v)
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    slots = slot_models(model, 3, pad_attention=True)
    methods = [build_method({"sampler": {"name": "llada_confidence", "block_length": 8},
                             "cache": {"name": "fast_dllm_dual"}}, s) for s in slots]
    out = {}
    decode_batched(model, methods, [Sample(i, random_prompt(4 + 5 * i, i), GEN) for i in range(5)],
                   lambda s, r: out.__setitem__(s.key, r))
    assert sorted(out) == list(range(5)) and all((r.response != MASK_ID).all() for r in out.values())


def test_a_backbone_attribute_the_stand_in_does_not_batch_is_the_backbone_s_own():
    model = tiny_backbone("llada", seed=0)
    slot = SlotModel(model, BatchScheduler(model))
    assert slot.cfg is model.cfg and slot.embed.weight is model.embed.weight
    assert slot.first_logit_row(5) == 5 and slot.head is model.head
    assert slot.named_parameters is not None  # delegated (unbatched, per slot)
