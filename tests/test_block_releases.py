"""The releases' block loops (docs/METHODS.md §1.11, §1.12) against re-statements of the released
code written here independently, batch 1: SDAR's ``block_diffusion_generate`` and Fast-dLLM
v2's ``batch_sample``, each over one forward of the sequence so far with the block-causal mask
(what their KV caches compute), token for token. The draws use the sampler's own functions with
the same generator (the releases draw from the device's global RNG), so the loops' structure is
what is compared: prompt alignment, prefill, schedule, remasking, sub-blocks, next tokens.
"""
from __future__ import annotations

import math

import pytest
import torch

from dlmpipe.decode import decode
from dlmpipe.methods import build_method
from dlmpipe.samplers.sdar import draw, filtered_probs, transfer_counts

from .models import MASK_ID, random_prompt, tiny_backbone
from .test_release_traces import fast_dllm_v2_release


def sdar_release(model, prompt, gen_len, *, steps, remasking, threshold, temperature, top_k,
                 released, generator):
    """generate.py's loop: blocks from position 0, the prompt's whole blocks prefilled, each
    later block denoised until it has no masks, ``steps`` transfer counts over the block."""
    n, P = model.cfg.block_size, prompt.shape[0]
    total = -(-(P + gen_len) // n) * n
    x = torch.full((total,), MASK_ID, dtype=torch.long)
    x[:P] = prompt
    counts = transfer_counts(n, steps)
    for b in range(P // n, total // n):
        lo, hi = b * n, (b + 1) * n
        for step in range(steps + 1):
            block = x[lo:hi]
            if not (block == MASK_ID).any():
                break
            logits = model(x[None, :hi])[0, lo:hi]
            first = max(P - lo, 0)  # rows of the prompt hold no draw (the sampler's response rows)
            probs = filtered_probs(logits[first:], temperature, top_k, 1.0)
            tokens = draw(probs, temperature, generator, MASK_ID)
            conf = torch.full((n,), float("-inf"), dtype=torch.float64)
            conf[first:] = probs.gather(-1, tokens[:, None])[:, 0]
            masked = block == MASK_ID
            conf[~masked] = float("-inf")
            k = counts[step]
            chosen = torch.zeros(n, dtype=torch.bool)
            if remasking == "sequential":
                f = int(masked.nonzero()[0])
                chosen[f:f + k] = True
            else:
                chosen[first + torch.topk(conf[first:], min(k, n - first)).indices] = True
                if remasking == "low_confidence_dynamic" and int((conf > threshold).sum()) >= k:
                    chosen = conf > threshold
            if not released:
                chosen &= masked
            full = torch.full((n,), MASK_ID, dtype=torch.long)
            full[first:] = tokens
            block[chosen] = full[chosen]
    return x[P:P + gen_len]


SDAR_CASES = {
    "dynamic": dict(remasking="low_confidence_dynamic", threshold=0.5, temperature=0.0, top_k=None),
    "dynamic-sampled": dict(remasking="low_confidence_dynamic", threshold=0.3, temperature=1.0, top_k=8),
    "static-2-steps": dict(remasking="low_confidence_static", threshold=0.85, temperature=0.0, top_k=None, steps=2),
    "sequential": dict(remasking="sequential", threshold=0.85, temperature=0.0, top_k=None),
    "static-released": dict(remasking="low_confidence_static", threshold=0.85, temperature=0.0,
                            top_k=None, steps=2, released=True),
    "dynamic-released": dict(remasking="low_confidence_dynamic", threshold=0.2, temperature=1.0,
                             top_k=4, steps=2, released=True),
}


@pytest.mark.parametrize("case", list(SDAR_CASES))
def test_sdar_method_is_the_released_generate_loop(case):
    c = {"steps": 4, "released": False, **SDAR_CASES[case]}
    for seed in (0, 1):
        # (2 layers: the loops' rules act on the logits; a later layer over layer 0's prefix K/V)
        model = tiny_backbone("sdar", seed=seed, n_layers=2, stop_ids=[])
        for p_len in (4, 6, 11):
            prompt = random_prompt(p_len, seed)
            ref = sdar_release(model, prompt, 16, steps=c["steps"], remasking=c["remasking"],
                               threshold=c["threshold"], temperature=c["temperature"],
                               top_k=c["top_k"], released=c["released"],
                               generator=torch.Generator().manual_seed(seed))
            spec = {"name": "sdar", "steps": c["steps"], "remasking": c["remasking"],
                    "confidence_threshold": c["threshold"], "temperature": c["temperature"],
                    "top_k": c["top_k"], "rule": "released" if c["released"] else "paper"}
            s, cache = build_method({"sampler": spec, "cache": {"name": "none"}}, model)
            got = decode(model, s, cache, prompt, 16, torch.Generator().manual_seed(seed))
            assert torch.equal(got.response, ref), (case, seed, p_len)


@pytest.mark.parametrize("cache", ["none", "fast_dllm_v2"])
def test_fast_dllm_v2_method_is_the_released_batch_sample_loop(cache):
    """Token for token: over full recompute the loop without its block cache, over the block +
    sub-block cache the loop with it (``use_block_cache=True``: the release's own approximation,
    its cached forward restated in tests/test_release_traces.py)."""
    for seed in (0, 1, 2):
        # (2 layers: the block cache's K/V at layer 0 and at a later one)
        model = tiny_backbone("fast_dllm_v2", seed=seed, n_layers=2, stop_ids=[])
        for p_len in (5, 16, 21):
            prompt = random_prompt(p_len, seed)
            _, ref = fast_dllm_v2_release(model, prompt, 24, sub=4, threshold=0.3,
                                          use_block_cache=cache == "fast_dllm_v2")
            s, c = build_method({"sampler": {"name": "fast_dllm_v2", "sub_block_length": 4,
                                             "threshold": 0.3}, "cache": {"name": cache}}, model)
            got = decode(model, s, c, prompt, 24).response
            overlap = min(ref.shape[0], got.shape[0])  # the release decodes (G//n + P//n) blocks
            assert torch.equal(got[:overlap], ref[:overlap]), (seed, p_len)


@pytest.mark.parametrize("rule", ["paper", "released"])
def test_sdar_released_rule_rewrites_decoded_positions_once_the_count_exceeds_the_masks(rule):
    """Block of 4, 2 steps (counts 2, 2): a dynamic first step takes the 3 positions above the
    threshold; the second step's count 2 exceeds the one mask left, so the release's top-k also
    picks a decoded position and rewrites it with its new draw; the paper's rule does not."""
    from dlmpipe.samplers.sdar import SDARSampler

    from .models import HAND_MASK, logits_for

    s = SDARSampler(remasking="low_confidence_dynamic", steps=2, confidence_threshold=0.5,
                    eb_threshold=0.35, temperature=0.0, top_k=None, top_p=1.0, rule=rule)
    x = torch.full((4,), HAND_MASK)  # an active block of 4 response positions
    s.begin(0, 4, HAND_MASK)
    s.step(x, logits_for([1, 2, 3, 4], [0.9, 0.9, 0.9, 0.2]))
    assert x.tolist() == [1, 2, 3, HAND_MASK] and not s.done
    s.step(x, logits_for([5, 6, 7, 8], [0.9, 0.9, 0.9, 0.2]))  # new draws everywhere
    assert s.done
    rewritten = sum(int(a != b) for a, b in zip(x[:3].tolist(), [1, 2, 3]))
    assert x[3] == 8 and rewritten == (1 if rule == "released" else 0)
    assert s.stats()["revisions"] == rewritten


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_model_that_ranks_mask_first_still_finishes_its_block(temperature):
    """A drawn MASK would leave its position masked forever (the block ends when no masks
    remain): the samplers take the most probable other token instead (docs/METHODS.md §1.11);
    here MASK holds 60% of every row, the intended token 30%."""
    from dlmpipe.samplers.fast_dllm_v2 import FastDLLMv2Sampler
    from dlmpipe.samplers.sdar import SDARSampler

    from .models import HAND_MASK, HAND_VOCAB

    samplers = [SDARSampler(remasking=r, steps=4, confidence_threshold=0.95, eb_threshold=0.35,
                            temperature=temperature, top_k=None, top_p=1.0, rule="paper")
                for r in ("low_confidence_dynamic", "low_confidence_static")]
    samplers.append(FastDLLMv2Sampler(threshold=0.9, sub_block_length=2, temperature=temperature,
                                      top_p=1.0))
    for s in samplers:
        x = torch.full((4,), HAND_MASK)
        s.begin(0, 4, HAND_MASK, generator=torch.Generator().manual_seed(0))
        for _ in range(4):
            rows = torch.full((4, HAND_VOCAB), math.log(0.1 / (HAND_VOCAB - 2)))
            rows[:, HAND_MASK] = math.log(0.6)
            rows[torch.arange(4), torch.arange(1, 5)] = math.log(0.3)
            s.step(x, rows)
            if s.done:
                break
        assert s.done and HAND_MASK not in x.tolist(), (type(s).__name__, x.tolist())
        if temperature == 0:  # the most probable other token
            assert x.tolist() == [1, 2, 3, 4], type(s).__name__


@pytest.mark.parametrize("rule", ["paper", "evaluation"])
def test_a_top_k_of_1_that_leaves_only_mask_falls_back_to_the_next_most_probable_token(rule):
    """top_k 1 (generate.py's greedy, the evaluation's setting) over a row whose most probable
    token is MASK leaves MASK alone in the filtered distribution: the fallback is the most
    probable other token of the unfiltered one (before issue 40 the default rule took the argmax
    of the filtered row with MASK removed, all zeros: token 0)."""
    from dlmpipe.samplers.sdar import SDARSampler

    from .models import HAND_MASK, HAND_VOCAB

    s = SDARSampler(remasking="low_confidence_static", steps=4, confidence_threshold=0.85,
                    eb_threshold=0.35, temperature=1.0, top_k=1, top_p=1.0, rule=rule)
    x = torch.full((4,), HAND_MASK)
    s.begin(0, 4, HAND_MASK, generator=torch.Generator().manual_seed(0))
    while not s.done:
        rows = torch.full((4, HAND_VOCAB), math.log(0.1 / (HAND_VOCAB - 2)))
        rows[:, HAND_MASK] = math.log(0.6)
        rows[torch.arange(4), torch.arange(1, 5)] = math.log(0.3)
        s.step(x, rows)
    assert x.tolist() == [1, 2, 3, 4]
