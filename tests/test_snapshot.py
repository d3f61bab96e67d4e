"""Decoder state snapshot/restore (``Decoding.clone``): for every sampler and every cache the
registry pairs with it, a clone taken after any update resumes exactly as the uninterrupted
decoding continues (tokens, logits, statistics, the generator's state), and neither disturbs
the other. New registry entries are covered without editing this file."""
from __future__ import annotations

import pytest
import torch

from dlmpipe import registry
from dlmpipe.backbones import rowwise
from dlmpipe.decode import Decoding
from dlmpipe.methods import build_method

from .models import BLOCK_FAMILIES, random_prompt, tiny_backbone

GEN_LEN = 16


def sampler_spec(name: str) -> dict:
    """The entry's defaults, with blocks of 8 and Gumbel noise where it has them (so that the
    generator's state matters)."""
    params = registry.SAMPLERS[name].params
    spec = {"name": name}
    if "block_length" in params:
        spec["block_length"] = 8
    if "temperature" in params:
        spec["temperature"] = 0.7
    return spec


def cache_spec(name: str) -> dict:
    params = registry.CACHES[name].params
    # (SPA-Cache's profile named: none is known for the block-causal families)
    return {"name": name, **({"rank": 8, "profile": "llada-8b-instruct"} if "rank" in params else {})}


PAIRS = [(s, c) for s in registry.SAMPLERS for c in registry.CACHES
         if not registry.pairing_problem(s, c)]
#: one family of each attention pattern: LLaDA (full, unshifted) and Fast-dLLM v2 (block-causal,
#: shifted: a clone also carries the block loop's next-token row). ``clone`` is one deepcopy of
#: the state (dlmpipe/decode.py): a family changes the state's sizes and values (Dream's and
#: Fast-dLLM v2's extra shifted row, SDAR's q/k norms in the weights), not which objects it
#: holds, so Dream and SDAR repeated these cases (issue 46: 534 -> 266)
SNAPSHOT_FAMILIES = ["llada", "fast_dllm_v2"]
#: (family, sampler, cache): every pairing on each of those families whose attention it fits
#: (the releases' block loops on the block-causal one only)
CASES = [(f, s, c) for f in SNAPSHOT_FAMILIES for s, c in PAIRS
         if not registry.attention_problems({"sampler": {"name": s}, "cache": {"name": c}},
                                            "block_causal" if f in BLOCK_FAMILIES else "full")]


def start(model, sampler: str, cache: str, prompt) -> Decoding:
    s, c = build_method({"sampler": sampler_spec(sampler), "cache": cache_spec(cache)}, model)
    return Decoding(model, s, c, prompt, GEN_LEN, torch.Generator().manual_seed(11))


def finish(run: Decoding) -> list[torch.Tensor]:
    """Step to the end; the state after each update."""
    states = []
    while not run.done:
        run.step()
        states.append(run.x.clone())
    return states


@pytest.mark.parametrize("family,sampler,cache", CASES, ids=[f"{f}-{s}/{c}" for f, s, c in CASES])
@torch.inference_mode()
def test_a_cloned_state_resumes_exactly_like_the_uninterrupted_one(family, sampler, cache):
    """Clones taken after the first update, half way and before the last, each run to the end
    before the original goes on: every clone and the original (after all three) step exactly as
    an uninterrupted decoding does. One original serves the three cuts (each clone was a
    separate run's before: the same checks, 3.5 instead of 5.5 decodes' steps).

    On the plain ops (``rowwise.plain_ops``, as training and the GPU compute): a clone resumes
    with the same calls on the same shapes as the uninterrupted run, so the bits agree on any
    deterministic kernels, and a state it failed to copy or shares shows in the tokens, the
    statistics or the generator either way; the row-invariant products, which only make calls
    of *different* sizes agree (dlmpipe/backbones/rowwise.py; docs/ARCHITECTURE.md, "Row
    invariance, by construction"), cost a quarter more here and are the row-invariance and
    batching tests' (issue 46)."""
    with rowwise.plain_ops():
        resumes_exactly(family, sampler, cache)


def resumes_exactly(family: str, sampler: str, cache: str) -> None:
    model = tiny_backbone(family, seed=2, n_layers=2)
    prompt = random_prompt(7, 2)
    reference = start(model, sampler, cache, prompt)
    ref_states = finish(reference)
    ref_stats = reference.stats()
    assert len(ref_states) >= 4
    cuts = (1, len(ref_states) // 2, len(ref_states) - 1)
    original = start(model, sampler, cache, prompt)
    original.step()
    original_states: list[torch.Tensor] = []  # after the first cut
    for cut in cuts:
        while len(original_states) + cuts[0] < cut:
            original.step()
            original_states.append(original.x.clone())
        clone = original.clone()
        # weights shared, not copied (a block-causal cache runs over the active block's stand-in)
        assert clone.model is model and getattr(clone.cache.model, "inner", clone.cache.model) is model
        clone_states = finish(clone)  # before the original goes on: it must take nothing from it
        assert len(clone_states) == len(ref_states) - cut
        assert all(torch.equal(a, b) for a, b in zip(clone_states, ref_states[cut:])), cut
        assert clone.stats() == ref_stats, cut
        assert torch.equal(clone.sampler.generator.get_state(), reference.sampler.generator.get_state()), cut
    original_states += finish(original)
    assert len(original_states) == len(ref_states) - cuts[0]
    assert all(torch.equal(a, b) for a, b in zip(original_states, ref_states[cuts[0]:]))
    assert original.stats() == ref_stats
    assert torch.equal(original.sampler.generator.get_state(), reference.sampler.generator.get_state())


def test_the_pairs_cover_every_sampler_and_cache():
    assert {s for s, _ in PAIRS} == set(registry.SAMPLERS)
    assert {c for _, c in PAIRS} == set(registry.CACHES)


@torch.inference_mode()
def test_a_clone_at_a_cached_step_keeps_the_caches_state_not_a_fresh_one():
    """A clone carries the cache's stale K/V and anchor: after Archer K=inf has served cached
    forwards, the clone's next logits are the cached ones, not full recompute's."""
    model = tiny_backbone("llada", seed=4, n_layers=2)
    run = start(model, "saber", "archer", random_prompt(9, 4))
    run.cache.K = float("inf")
    for _ in range(3):
        run.step()
    clone = run.clone()
    assert torch.equal(clone.cache.anchor, run.cache.anchor)
    assert clone.cache.kv.keys.data_ptr() != run.cache.kv.keys.data_ptr()
    a = run.cache.response_logits(run.x, run.sampler.block)
    b = clone.cache.response_logits(clone.x, clone.sampler.block)
    assert torch.equal(a, b) and clone.cache.stats.as_dict() == run.cache.stats.as_dict()
    assert run.cache.stats.refreshes == 0 and run.cache.stats.cached_forwards == 3
