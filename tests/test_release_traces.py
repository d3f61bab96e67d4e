"""Issue 40: the block-diffusion releases' loops against dlmpipe step by step, through the decode
trace (dlmpipe/trace.py): each test restates the release's lines (cited one for one, file and
line at the commit docs/METHODS.md names) over the tiny model's own forward with the
block-causal mask (what the releases' KV caches compute), records per step which rows were
decoded with which token, and compares that with dlmpipe's trace records, not only the final
tokens. Releases: Fast-dLLM v2 ``v2/generation_functions.py`` (ydshi0/Fast-dLLM 8292f3c,
"gf"), its hub ``modeling.py`` (Satgoy152/DualDiffusion 189fa7a,
``FastDLLM-inferencing/Fast_dLLM_v2_7B/modeling.py``, "modeling"); SDAR's OpenCompass loop
(JetAstra/SDAR c2041a8, ``evaluation/opencompass/opencompass/models/huggingface_bd3.py``,
"bd3"); dInfer (inclusionAI/dInfer fce4e32, ``python/dinfer/decoding/generate_uniform.py``,
"gu"; ``decoding/utils.py``, ``decoding/parallel_strategy.py``, ``model/modeling_fused_olmoe.py``
and ``benchmarks/benchmark_dataset.py`` named in full). The dInfer restatements were checked
against the release's own code run on tiny checkpoints in its format (docs/METHODS.md §2.9).
"""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from dlmpipe.decode import decode
from dlmpipe.methods import build_method
from dlmpipe.samplers.dinfer import hierarchy_accepts
from dlmpipe.trace import DecodeTrace

from .models import MASK_ID, random_prompt, tiny_backbone


def traced(model, sampler: dict, cache: dict, prompt, gen_len: int, seed: int = 0):
    s, c = build_method({"sampler": sampler, "cache": cache}, model)
    trace = DecodeTrace()
    res = decode(model, s, c, prompt, gen_len, torch.Generator().manual_seed(seed), observer=trace)
    return res, trace.records


def steps_of(records) -> list[tuple]:
    """Per step: the sampler's block (absolute rows) and the (position, token) pairs committed."""
    return [(tuple(r["sub_block"]), [(c["pos"], c["token"]) for c in r["committed"]])
            for r in records if r["kind"] == "step"]


def with_block(model, n: int):
    model.cfg = dataclasses.replace(model.cfg, block_size=n)
    return model


# ---- Fast-dLLM v2 -------------------------------------------------------------------------
@pytest.mark.parametrize("p_len", [5, 16, 21])
def test_fast_dllm_v2_at_temperature_0_with_the_default_top_p_is_the_release_step_by_step(p_len):
    """The registry's default top_p 0.95 is unused at temperature 0, as in the release: the
    confidence is the plain softmax (before issue 40 it was cut and renormalised by top_p, which
    raised every confidence and unmasked more per step)."""
    differs = 0
    for seed in (0, 1, 2):
        model = tiny_backbone("fast_dllm_v2", seed=seed, n_layers=2, stop_ids=[])
        prompt = random_prompt(p_len, seed)
        steps, _ = fast_dllm_v2_release(model, prompt, 24, sub=4, threshold=0.3)
        ref = [(sub_block, committed) for sub_block, _, committed in steps]
        _, records = traced(model, {"name": "fast_dllm_v2", "sub_block_length": 4,
                                    "threshold": 0.3}, {"name": "none"}, prompt, 24)
        got = steps_of(records)
        assert got[:len(ref)] == ref, (seed, p_len)
        for r in records:  # the recorded confidence is the plain softmax probability
            for c in r["committed"]:
                if c["confidence"] is not None:
                    assert c["confidence"] == pytest.approx(c["p"], abs=1e-9)
        filtered = [c for r in records for c in r["committed"] if c["p"] is not None]
        differs += sum(c["p"] < 0.95 for c in filtered)
    assert differs  # cases where a top-p cut would have changed the confidence


def release_block_cache_rows(records, prompt, n: int, gen_total: int):
    """gf 101-108 replayed on dlmpipe's own states: the block + sub-block cache's forward of each
    step is the whole block (``x_t[:, -block_size:]``) on the block's first forward
    (``block_past_key_values is None``, reset per block at gf 71) or while the sub-block's
    first position ``x_t[:, -block_size + small_block_start_idx]`` is masked, else the
    sub-block's rows ``x_t[:, start:end]``."""
    x = torch.cat([prompt, torch.full((gen_total,), MASK_ID, dtype=torch.long)])
    seen_blocks, rows = set(), []
    for r in records:
        if r["kind"] == "step":
            a, b = r["block"]
            start, end = r["sub_block"]
            first = a not in seen_blocks
            seen_blocks.add(a)
            rows.append([[a, b]] if first or x[start] == MASK_ID else [[start, end]])
        for c in r["committed"]:
            x[c["pos"]] = c["token"]
    return rows


@pytest.mark.parametrize("p_len", [5, 16, 21])
def test_fast_dllm_v2_block_cache_refreshes_on_the_sub_block_first_position(p_len):
    """Sub-blocks starting with prompt rows (P = 5: rows 4-7 hold row 4 of the prompt; P = 21:
    rows 20-23) or with a decoded token (every block after the first: its first token is the
    previous block's next token) take the cached path once their first *position* is not masked;
    before issue 40 dlmpipe tested the first *response* position and ran full forwards there."""
    cached = 0
    for seed in (0, 1):
        model = tiny_backbone("fast_dllm_v2", seed=seed, n_layers=2, stop_ids=[])
        prompt = random_prompt(p_len, seed)
        res, records = traced(model, {"name": "fast_dllm_v2", "sub_block_length": 4,
                                      "threshold": 0.3}, {"name": "fast_dllm_v2"}, prompt, 24)
        steps = [r for r in records if r["kind"] == "step"]
        total = max(r["block"][1] for r in records) - p_len
        assert [r["rows"] for r in steps] == release_block_cache_rows(records, prompt, 8, total)
        assert all(r["n_rows"] == sum(b - a for a, b in r["rows"]) for r in steps)
        cached += sum(not r["full"] for r in steps)
    assert cached  # the cached path is taken


def release_block_cache_full(model, x, lo: int, hi: int):
    """modeling's forward of the whole block with ``use_block_cache=True`` and no block cache
    (gf 103): its K/V stored in a fresh block cache (modeling 466-467, 210-213), the prefix's K/V
    before them (modeling 226-230), every key up to the block's end (``eval_mask``, modeling
    88-93, 495). Returns the block rows' raw logits, the prefix's and the block's K/V per layer."""
    positions = torch.arange(hi)
    rope, mask = model.rope(positions), model.attention_mask(positions, positions)
    h = model.embed(x[None, :hi])
    prefix, block = [], []
    for i in range(model.cfg.n_layers):
        q, k, v = model.qkv(i, h, rope)
        prefix.append((k[:, :, :lo], v[:, :, :lo]))
        block.append((k[:, :, lo:].clone(), v[:, :, lo:].clone()))
        h = h + model.attn_output(i, model.attend(q, k, v, mask))
        h = h + model.ffn(i, h)
    return model.logits(h)[0, lo:], prefix, block


def release_block_cache_cached(model, x, start: int, end: int, lo: int, prefix, block):
    """modeling's forward of the sub-block's rows ``x_t[:, start:end]`` given the block cache (gf
    108, ``replace_position`` the sub-block's offset): positions from the prefix's length plus
    that offset (modeling 477-479), their K/V written over the block cache's rows in place
    (modeling 215-219), attending to the prefix's K/V and the whole block cache without a mask
    (modeling 492-493)."""
    rope = model.rope(torch.arange(start, end))
    h = model.embed(x[None, start:end])
    for i in range(model.cfg.n_layers):
        q, k, v = model.qkv(i, h, rope)
        bk, bv = block[i]
        bk[:, :, start - lo:end - lo] = k
        bv[:, :, start - lo:end - lo] = v
        keys, values = torch.cat([prefix[i][0], bk], 2), torch.cat([prefix[i][1], bv], 2)
        h = h + model.attn_output(i, model.attend(q, keys, values))
        h = h + model.ffn(i, h)
    return model.logits(h)[0]


def fast_dllm_v2_release(model, prompt, gen_len, *, sub, threshold, use_block_cache=False):
    """gf ``batch_sample`` at temperature 0 (its default, gf line 31), batch 1, with or without
    its block cache: per step the sub-block, the rows its forward computed and the (position,
    token) pairs it unmasked; and the response."""
    n, P = model.cfg.block_size, prompt.shape[0]
    x = prompt.clone()
    if P > n and P % n == 0:  # gf 36-46: prefill, the next token greedy
        x = torch.cat([x, model(x[None])[0, -1:].argmax(-1)])
    steps = []
    for b in range(P // n, gen_len // n + P // n):  # gf 33, 58
        lo, hi = b * n, (b + 1) * n
        x = torch.cat([x, torch.full((hi - x.shape[0],), MASK_ID, dtype=torch.long)])  # gf 62
        block = None  # gf 71: block_past_key_values reset per block
        for k in range(n // sub):  # gf 90-95
            start, end = lo + k * sub, lo + (k + 1) * sub
            forwards = 0
            while (x[start:end] == MASK_ID).any():  # gf 96-99
                # each forward unmasks at least one position (gf 119-121), unless its argmax is the
                # MASK id, where the release would loop forever: such a model is no comparison
                forwards += 1
                if forwards > sub:
                    pytest.fail(f"the release's loop over rows {start}-{end} unmasked nothing in "
                                f"{sub} forwards (an argmax MASK: gf 96-99 would not end)")
                if not use_block_cache:  # gf 111-113: the whole sequence over the prefix
                    raw = model(x[None, :hi])[0]
                    logits = torch.cat([raw[:1], raw[:-1]])[start:end]
                    rows = [[0, hi]]
                elif block is None or x[start] == MASK_ID:  # gf 102
                    raw, prefix, block = release_block_cache_full(model, x, lo, hi)  # gf 103-104
                    logits = torch.cat([raw[:1], raw[:-1]])[start - lo:end - lo]  # gf 105-106
                    rows = [[lo, hi]]
                else:
                    raw = release_block_cache_cached(model, x, start, end, lo, prefix, block)  # gf 108
                    logits = torch.cat([raw[:1], raw[:-1]])  # gf 109: `start` served by its own row
                    rows = [[start, end]]
                # modeling 763-769: at temperature 0 the plain softmax and its argmax (top_p unused)
                p_1t = torch.softmax(logits.double(), -1)
                x_1 = p_1t.argmax(-1)
                masked = x[start:end] == MASK_ID
                x1_p = p_1t.gather(-1, x_1[:, None])[:, 0].masked_fill(~masked, float("-inf"))  # gf 115-116
                unmask = x1_p > threshold  # gf 118
                unmask[x1_p.argmax()] = True  # gf 119-120
                unmask &= masked  # gf 121
                x[start:end][unmask] = x_1[unmask]  # gf 123
                steps.append(((start, end), rows,
                              [(start + int(i), int(x_1[i])) for i in unmask.nonzero()[:, 0]]))
        x = torch.cat([x, model(x[None])[0, -1:].argmax(-1)])  # gf 81-85: the next block's token
    return steps, x[P:]


@pytest.mark.parametrize("p_len", [5, 13, 16, 21])
@pytest.mark.parametrize("threshold", [0.3, 0.9])
def test_fast_dllm_v2_block_cache_is_the_release_step_by_step(p_len, threshold):
    """The block + sub-block cache's tokens, not only its rows: each cached forward computes the
    sub-block's rows from its first position over the prefix and the block's K/V of the last
    full forward, no mask, and the release's shift of those rows (gf 108-109), step by step.
    Sub-blocks start on a prompt row (P = 5: rows 4-7; 13: 12-15; 21: 20-23) or on the previous
    block's next token (P = 16 prefilled, and every later block). Checked against the release's
    own code (batch_sample with the hub modeling file on tiny checkpoints in its format, issue
    40): every forward's rows and commits equal."""
    cached = 0
    for seed in (0, 1):
        model = tiny_backbone("fast_dllm_v2", seed=seed, n_layers=2, stop_ids=[])
        prompt = random_prompt(p_len, seed)
        steps, _ = fast_dllm_v2_release(model, prompt, 24, sub=4, threshold=threshold,
                                        use_block_cache=True)
        ref = [(rows, committed) for _, rows, committed in steps]
        _, records = traced(model, {"name": "fast_dllm_v2", "sub_block_length": 4,
                                    "threshold": threshold}, {"name": "fast_dllm_v2"}, prompt, 24)
        got = [(r["rows"], [(c["pos"], c["token"]) for c in r["committed"]])
               for r in records if r["kind"] == "step"]
        assert got[:len(ref)] == ref, (seed, p_len, threshold)  # (dlmpipe: one more block, gf 33)
        cached += sum(r[0][0][1] - r[0][0][0] < model.cfg.block_size for r in ref)
    assert cached  # the cached path is taken


# ---- SDAR's evaluation loop -----------------------------------------------------------------
def sdar_evaluation_release(model, prompt, gen_len, *, steps, threshold, temperature, top_k):
    """bd3 ``block_diffusion_generate`` (lines 111-272) at top_p 1, batch 1: the steps it takes
    (top_k 1: the draw is the argmax, so the device's RNG plays no part)."""
    n, P = model.cfg.block_size, prompt.shape[0]
    num_blocks = (P + gen_len + n - 1) // n  # bd3 146
    x = torch.full((num_blocks * n,), MASK_ID, dtype=torch.long)  # bd3 162-164
    x[:P] = prompt
    counts = [n // steps + (1 if i < n % steps else 0) for i in range(steps)]  # bd3 102-106
    assert n % steps == 0  # bd3 185
    out = []
    for b in range(P // n, num_blocks):  # bd3 167, 188
        lo, hi = b * n, (b + 1) * n
        cur = x[lo:hi]
        for i in range(steps + 1):  # bd3 193
            mask_index = cur == MASK_ID  # bd3 194
            if not mask_index.any():  # bd3 195-203: the store_kv forward
                break
            logits = model(x[None, :hi])[0, lo:hi].double()  # bd3 205-211
            logits = logits / temperature if temperature != 1.0 else logits  # bd3 74
            ori_probs = torch.softmax(logits, -1)  # bd3 75
            kth = torch.topk(logits, top_k).values[..., -1:]  # bd3 48-50
            probs = torch.softmax(logits.masked_fill(logits < kth, float("-inf")), -1)  # bd3 83
            x0 = probs.argmax(-1)  # bd3 87: multinomial over a one-hot row (top_k 1)
            x0_p = ori_probs.gather(-1, x0[:, None])[:, 0]  # bd3 90
            x0 = torch.where(mask_index, x0, cur)  # bd3 233
            confidence = torch.where(mask_index, x0_p, torch.tensor(float("-inf"), dtype=x0_p.dtype))
            if threshold < 1.0:  # bd3 234-250
                high = confidence > threshold
                if int(high.sum()) >= counts[i]:
                    transfer = high
                else:
                    transfer = torch.zeros(n, dtype=torch.bool)
                    transfer[torch.topk(confidence, counts[i]).indices] = True
            else:  # bd3 251-260
                transfer = torch.zeros(n, dtype=torch.bool)
                transfer[torch.topk(confidence, counts[i]).indices] = True
            changed = transfer & (cur != x0)
            cur[transfer] = x0[transfer]  # bd3 262
            out.append((None, [(lo + int(j), int(cur[j])) for j in changed.nonzero()[:, 0]]))
    return out


@pytest.mark.parametrize("threshold", [0.95, 1.0, 0.3])
def test_sdar_evaluation_rule_is_the_opencompass_loop_at_its_own_settings(threshold):
    """eval_sdar_hf.py's settings: temperature 1.0, top_k 1, steps = block length, threshold
    0.95 (and 1.0, its static decode). The confidence is the unfiltered softmax: under
    generate.py's rule (``paper``) the same settings give confidence 1.0 everywhere, so the
    dynamic rule fills a block in one step."""
    for seed in (0, 1):
        model = tiny_backbone("sdar", seed=seed, n_layers=3, stop_ids=[])
        for p_len in (4, 6, 11):
            prompt = random_prompt(p_len, seed)
            ref = sdar_evaluation_release(model, prompt, 16, steps=4, threshold=threshold,
                                          temperature=1.0, top_k=1)
            spec = {"name": "sdar", "steps": 4, "remasking": "low_confidence_dynamic",
                    "confidence_threshold": threshold, "temperature": 1.0, "top_k": 1,
                    "rule": "evaluation"}
            _, records = traced(model, spec, {"name": "none"}, prompt, 16, seed)
            got = [c for _, c in steps_of(records)]
            assert got == [c for _, c in ref], (seed, p_len)
            for r in records:
                for c in r["committed"]:
                    if r["kind"] == "step":
                        assert c["confidence"] == pytest.approx(c["p"], abs=1e-9)
            if threshold == 0.95:  # generate.py's rule at these settings: confidence 1.0
                _, paper = traced(model, {**spec, "rule": "paper"}, {"name": "none"}, prompt, 16)
                assert all(c["confidence"] == 1.0 for r in paper for c in r["committed"]
                           if r["kind"] == "step")
                assert len(steps_of(paper)) < len(got)


def test_sdar_evaluation_rule_refuses_what_the_loop_cannot_run():
    from dlmpipe import registry

    for bad in ({"temperature": 0}, {"remasking": "sequential"}):
        spec = {"name": "sdar", "rule": "evaluation", "temperature": 1.0, "top_k": 1, **bad}
        method = registry.bind_method({"name": "m", "sampler": spec, "cache": {"name": "none"}}, None)
        assert any("evaluation" in p for p in registry.gen_length_problems(method, 16)), bad


# ---- SDAR's generate.py ---------------------------------------------------------------------
def sdar_generate_release(model, prompt, gen_len, *, steps, remasking, threshold, released):
    """JetAstra/SDAR c2041a8 ``generate.py`` ``block_diffusion_generate`` (lines 58-202, "gen")
    at its greedy setting, temperature 1 and top_k 1 (temperature 0 divides the logits by zero,
    gen 35-36), top_p 1, batch 1, no stop ids: per step the rows the forward computed and the
    (position, token) pairs it changed. ``released``: gen 196 as written (every position picked is
    overwritten); else dlmpipe's paper rule (masked positions only). Also returns whether a prompt
    row was overwritten (gen 164-166/177-179 rank the block's prompt rows at -inf too). None
    where a step transfers a drawn MASK (the release cannot finish, docs/METHODS.md §1.11)."""
    n, P = model.cfg.block_size, prompt.shape[0]
    num_blocks = (P + gen_len + n - 1) // n  # gen 79-81
    x = torch.full((num_blocks * n,), MASK_ID, dtype=torch.long)  # gen 89-91
    x[:P] = prompt
    counts = [n // steps + (1 if i < n % steps else 0) for i in range(steps)]  # gen 49-54, 108-109
    out, prompt_rewritten = [], False
    for b in range(P // n, num_blocks):  # gen 92, 112
        lo, hi = b * n, (b + 1) * n
        cur = x[lo:hi].clone()  # gen 113
        for step in range(steps + 1):  # gen 119
            mask_index = cur == MASK_ID  # gen 120
            if not mask_index.any():  # gen 121-129: the store_kv forward
                break
            logits = model(torch.cat([x[:lo], cur])[None])[0, lo:hi]  # gen 132-137 over the cache
            x0 = logits.argmax(-1)  # gen 37-43: top_k 1 leaves one token, multinomial draws it
            x0_p = torch.ones(n, dtype=torch.float64)  # gen 41, 44: its probability, 1.0
            confidence = torch.where(mask_index, x0_p, -torch.inf)  # gen 161, 169
            transfer = torch.zeros(n, dtype=torch.bool)  # gen 162, 170
            k = counts[step]
            if remasking == "low_confidence_static":
                transfer[torch.topk(confidence, k).indices] = True  # gen 164-166
            elif int((confidence > threshold).sum()) >= k:  # gen 172-174
                transfer = confidence > threshold  # gen 175
            else:
                transfer[torch.topk(confidence, k).indices] = True  # gen 177-179
            if not released:
                transfer &= mask_index
            if bool((transfer & (x0 == MASK_ID)).any()):
                return None  # a drawn MASK stays masked; past its schedule gen 165/174 index out
            changed = transfer & (cur != x0)
            prompt_rewritten |= bool(changed[:max(P - lo, 0)].any())
            cur[transfer] = x0[transfer]  # gen 196
            out.append(([[lo, hi]], [(lo + int(j), int(cur[j])) for j in changed.nonzero()[:, 0]]))
        x[lo:hi] = cur  # gen 198
    return out, prompt_rewritten, x[P:P + gen_len]


@pytest.mark.parametrize("rule", ["paper", "released"])
@pytest.mark.parametrize("remasking", ["low_confidence_static", "low_confidence_dynamic"])
def test_sdar_generate_ranks_the_whole_block_as_the_release_does(rule, remasking):
    """At generate.py's greedy setting every confidence is 1.0, so which masks a step takes is
    torch.topk's order among equal values over the vector it ranks: the release ranks the block's
    n rows, its prompt rows at -inf (gen 161-179). Before issue 40 dlmpipe ranked the response
    rows only, which orders ties differently once a prompt ends inside a block (P 5, block 4, 4
    steps: the release takes position 6 first, dlmpipe took 5), and under ``released`` picked
    other decoded rows to rewrite. Compared step by step over prompts ending inside a block and
    on its boundary; decodes where the release overwrites a prompt row are left out under
    ``released`` (dlmpipe keeps the prompt, docs/METHODS.md §1.11)."""
    compared = skipped = 0
    for n in (4, 8):
        for seed in (0, 1):
            model = with_block(tiny_backbone("sdar", seed=seed, n_layers=2, stop_ids=[]), n)
            for p_len in (3, 4, 5, 8, 11):
                prompt = random_prompt(p_len, seed)
                for steps in sorted({n, n // 2, 3}):
                    release = sdar_generate_release(
                        model, prompt, 16, steps=steps, remasking=remasking, threshold=0.85,
                        released=rule == "released")
                    if release is None:
                        continue
                    ref, rewrote, final = release
                    if rewrote:
                        skipped += 1
                        continue
                    spec = {"name": "sdar", "steps": steps, "remasking": remasking,
                            "confidence_threshold": 0.85, "temperature": 1.0, "top_k": 1,
                            "rule": rule}
                    res, records = traced(model, spec, {"name": "none"}, prompt, 16, seed)
                    got = [(r["rows"], [(c["pos"], c["token"]) for c in r["committed"]])
                           for r in records if r["kind"] == "step"]
                    assert got == ref, (n, seed, p_len, steps)
                    assert torch.equal(res.response, final)
                    compared += 1
    assert compared >= 40 and (skipped > 0) == (rule == "released"), (compared, skipped)


# ---- dInfer on LLaDA2.0 ---------------------------------------------------------------------
def dinfer_block_release(model, prompt, gen_len, *, threshold, low_threshold):
    """gu ``BlockDiffusionLLM.generate`` (lines 929-955) with block_length the model's block
    size and the benchmark's ``BlockIteratorFactory(start_block_align=True)``: blocks from the
    prompt's end to the next multiple of the block length (the rest of the block at once), then
    whole blocks to ``total_length`` (gu 937-940); each block stepped until it has no masks by
    hierarchical decoding (the decoder as tests/test_dinfer.py checks it), over the prefix. Each
    step's block as the iterator hands it (``utils.py`` lines 232-249: from the multiple of the
    block length, its prompt rows included)."""
    n, P = model.cfg.block_size, prompt.shape[0]
    total = (P + gen_len + n - 1) // n * n  # gu 937-938
    x = torch.full((total,), MASK_ID, dtype=torch.long)
    x[:P] = prompt
    bounds = [P] + list(range((P // n + 1) * n if P % n else P + n, total, n)) + [total]
    out = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        end = (hi + n - 1) // n * n
        while (x[lo:hi] == MASK_ID).any():
            logits = model(x[None, :end])[0, lo:hi]
            masked = x[lo:hi] == MASK_ID
            candidates = masked.nonzero()[:, 0]
            rows = logits[candidates].clone()
            rows[:, MASK_ID] = float("-inf")
            tokens = rows.argmax(-1)
            conf = torch.softmax(logits[candidates].float(), -1).gather(-1, tokens[:, None])[:, 0]
            accepted = hierarchy_accepts(candidates, conf, threshold, low_threshold)
            x[lo + candidates[accepted]] = tokens[accepted]
            out.append(((lo // n * n, hi), [(lo + int(c), int(t)) for c, t in  # its BlockLoc
                                             zip(candidates[accepted], tokens[accepted])]))
    return out


@pytest.mark.parametrize("n", [8, 16])
@pytest.mark.parametrize("p_len", [5, 21, 22])
def test_dinfer_on_llada2_decodes_the_rest_of_a_prompt_block_at_once(n, p_len):
    """Prompts ending inside a block: the release decodes the rest of that block as one block;
    before issue 40 dlmpipe cut it into sub-blocks aligned absolutely."""
    for seed in (0, 1):
        model = with_block(tiny_backbone("llada2", seed=seed, n_layers=2, stop_ids=[]), n)
        prompt = random_prompt(p_len, seed)
        ref = dinfer_block_release(model, prompt, 16, threshold=0.5, low_threshold=0.2)
        spec = {"name": "dinfer_hierarchy", "threshold": 0.5, "low_threshold": 0.2,
                "block_length": n}
        _, records = traced(model, spec, {"name": "none"}, prompt, 16)
        assert steps_of(records) == ref, (seed, p_len, n)


# ---- dInfer's iterators on LLaDA-MoE: a block starting inside the prompt ----------------------
def dinfer_model_rows(model, x, rows, past=None):
    """The release model's forward (dInfer ``model/modeling_fused_olmoe.py``,
    ``FusedOlmoeForCausalLM.forward`` over ``OlmoeSdpaAttention.forward``, lines 580-634) of the
    tokens at ``rows`` (contiguous), at their positions (``OlmoeModel.forward`` lines 1011-1013:
    ``replace_position``'s arange): with ``past`` (every layer's K/V of every row, a full
    forward's) their fresh K/V replace those rows' in a copy (``past_key_value.update``,
    ``utils.py`` ``KVCache.update`` lines 363-365, ``slice_scatter``) and they attend over every
    row with no mask (line 620, ``is_causal = False``). Their logits and every layer's K/V."""
    rope = model.rope(rows)
    h = model.embed(x[None, rows])
    kv = []
    for i in range(model.cfg.n_layers):
        q, k, v = model.qkv(i, h, rope)
        if past is not None:
            k_all, v_all = past[i][0].clone(), past[i][1].clone()
            k_all[:, :, rows], v_all[:, :, rows] = k, v
            k, v = k_all, v_all
        kv.append((k, v))
        h = h + model.attn_output(i, model.attend(q, k, v))
        h = h + model.ffn(i, h)
    return model.logits(h)[0], kv


def dinfer_threshold_decode(logits, lo, hi, x, threshold):
    """``ThresholdParallelDecoder.decode`` (``parallel_strategy.py`` lines 299-312) over
    ``get_transfer_index_threshold`` (lines 265-285) at temperature 0, in place on ``x``; the
    (position, token) pairs it commits. The argmax never picks the MASK id here (dlmpipe's
    deliberate difference, docs/METHODS.md §1.14: the release leaves such a position out)."""
    curr = x[lo:hi].clone()
    mask_index = curr == MASK_ID  # 304
    x0 = logits.clone().index_fill_(-1, torch.tensor([MASK_ID]), float("-inf")).argmax(-1)  # 267-268
    p = torch.softmax(logits.to(torch.float32), dim=-1)  # 273
    x0_p = p.gather(-1, x0[:, None])[:, 0]  # 274-275
    mask_index = mask_index & (x0 != MASK_ID)  # 278-279
    x0 = torch.where(mask_index, x0, curr)  # 280
    confidence = torch.where(mask_index, x0_p, torch.tensor(float("-inf")))  # 281
    bar = (confidence.max() - 1e-5).clamp(-1000, threshold)  # 283
    transfer = (confidence >= bar) & mask_index  # 284, 310
    x[lo:hi] = torch.where(transfer, x0, curr)  # 312
    return [(lo + int(i), int(x0[i])) for i in transfer.nonzero()[:, 0]]


def dinfer_blockwise_release(model, prompt, gen_len, n, threshold, cache, prefix_look=0,
                             after_look=0, warmup=0):
    """gu ``BlockWiseDiffusionLLM.generate`` (lines 472-489) with the benchmark's
    ``BlockIteratorFactory(start_block_align=True)`` and ``KVCacheFactory('dual')``
    (``benchmarks/benchmark_dataset.py`` lines 157, 170-173): ``cache`` "dual" runs
    ``BaseDiffusionIteration.forward`` (gu 277-306), "vicinity" ``VicinityCacheIteration.forward``
    (gu 614-644, ``warmup`` its ``warmup_steps``); ``BlockRunner.decode`` (gu 97-100) around
    them. Every forward as (rows computed ``[a, b)``, the pairs its decode committed)."""
    P = prompt.shape[0]
    N = P + gen_len
    x = torch.full((N,), MASK_ID, dtype=torch.long)  # utils.py TokenArray
    x[:P] = prompt
    manager = {"past": None, "block": None}  # DiffusionKVCacheManager (utils.py 380-420)

    def require_update(lo, hi):  # utils.py 397-420, cache_update_freq None
        changed = manager["block"] != (lo, hi)
        manager["block"] = (lo, hi)
        return changed

    def full(lo, hi):  # gu 280-286 / 630-635: a full forward, decoded, the cache stored
        logits, manager["past"] = dinfer_model_rows(model, x, torch.arange(N))
        out.append(((0, N), dinfer_threshold_decode(logits[lo:hi], lo, hi, x, threshold)))

    out = []
    iter_no = 0  # VicinityCacheIteration.iter_no
    first = P // n * n  # utils.py 195-199: the block holding the prompt's end
    for block_id, lo in enumerate(range(first, N, n)):  # utils.py 205-212, gu 482-484
        hi = min(lo + n, N)
        while (x[lo:hi] == MASK_ID).any():  # gu 97
            unroll = max(min(int((x[lo:hi] == MASK_ID).sum()) // 8, 4), 1)  # gu 98 (tpf 8, unroll 4)
            for _ in range(unroll):  # gu 99-100
                if cache == "dual":
                    if require_update(lo, hi):  # gu 279
                        full(lo, hi)
                    rows = torch.arange(lo, hi)  # gu 298-301: the block, from its start
                else:
                    if iter_no < warmup:  # gu 622-627: a full forward, no cache
                        logits, _ = dinfer_model_rows(model, x, torch.arange(N))
                        out.append(((0, N), dinfer_threshold_decode(logits[lo:hi], lo, hi, x, threshold)))
                        iter_no += 1
                        continue
                    if manager["past"] is None or (require_update(lo, hi) and block_id > 0):  # gu 629
                        full(lo, hi)
                        iter_no += 1  # gu 635
                    rows = torch.arange(max(0, lo - prefix_look), min(N, hi + after_look))  # gu 619-620, 637
                    iter_no += 1  # gu 644
                logits, _ = dinfer_model_rows(model, x, rows, manager["past"])  # gu 300 / 639
                a = int(rows[0])
                out.append(((a, int(rows[-1]) + 1),  # gu 303 / 641-643
                            dinfer_threshold_decode(logits[lo - a:hi - a], lo, hi, x, threshold)))
    return out


@pytest.mark.parametrize("cache", ["dual", "vicinity"])
@pytest.mark.parametrize("p_len", [5, 8, 21, 22])
def test_dinfer_caches_recompute_a_block_from_its_start_in_the_prompt(p_len, cache):
    """Under absolute alignment the release's first block starts inside the prompt (at the
    multiple of the block length before its end) and its caches recompute that block from there,
    prompt rows included: the dual cache's block, the vicinity window ``block_start -
    prefix_look``. Before issue 40 dlmpipe recomputed from the response's first row, so the
    prompt tail kept its refresh-time K/V (other rows, and on these models other tokens). Every
    step equal: the rows its forward computed and what it committed; the release's forwards that
    decode nothing (its refresh forward finishing the block, ``BlockRunner``'s unrolled
    iterations) are not dlmpipe steps."""
    n, g = 8, 16
    look = (2, 3) if cache == "vicinity" else (0, 0)
    for seed in (0, 1, 2):
        model = tiny_backbone("llada_moe", seed=seed, n_layers=2, stop_ids=[])
        prompt = random_prompt(p_len, seed)
        ref = [(rows, c) for rows, c in dinfer_blockwise_release(
            model, prompt, g, n, 0.7, cache, *look) if c]
        spec = {"name": "dinfer_credit", "credit_alpha": 0.0, "threshold": 0.7, "block_length": n}
        vicinity = {"name": "dinfer_vicinity", "prefix_look": look[0], "after_look": look[1],
                    "warmup_steps": 0}
        _, records = traced(model, spec, vicinity, prompt, g)
        got = [(tuple(r["rows"][0]), [(c["pos"], c["token"]) for c in r["committed"]])
               for r in records if r["kind"] == "step"]
        assert all(len(r["rows"]) == 1 for r in records)
        assert got == ref, (seed, p_len, cache)
        if p_len % n:  # the first block's cached steps recompute its prompt rows
            assert any(a < p_len < b and b <= p_len + n for (a, b), _ in got if (a, b) != (0, p_len + g))


def test_dinfer_vicinity_released_rule_is_the_release_s_iteration_counter():
    """``rule: released``: the warm-up counts every forward of the release, those that decode
    nothing too (``BlockRunner``'s unrolled iterations after a block has no masks, the window
    forward after a refresh that finished its block), and a cache first built in a block after
    the first is built again at that block's next iteration (gu 629 short-circuits
    ``require_update``). Step by step equal to the release; the default rule (warm-up counts
    decoding steps, one build per block) differs in some of these cases. Before issue 40
    dlmpipe had only the default."""
    n, g, look, warmup = 8, 16, (2, 3), 2
    differs = 0
    for p_len in (5, 8, 21, 22):
        for seed in (0, 1, 2):
            model = tiny_backbone("llada_moe", seed=seed, n_layers=2, stop_ids=[])
            prompt = random_prompt(p_len, seed)
            ref = [(rows, c) for rows, c in dinfer_blockwise_release(
                model, prompt, g, n, 0.7, "vicinity", *look, warmup=warmup) if c]
            spec = {"name": "dinfer_credit", "credit_alpha": 0.0, "threshold": 0.7,
                    "block_length": n}
            steps = {}
            for rule in ("released", "paper"):
                vicinity = {"name": "dinfer_vicinity", "prefix_look": look[0],
                            "after_look": look[1], "warmup_steps": warmup, "rule": rule}
                _, records = traced(model, spec, vicinity, prompt, g)
                steps[rule] = [(tuple(r["rows"][0]), [(c["pos"], c["token"]) for c in r["committed"]])
                               for r in records if r["kind"] == "step"]
            assert steps["released"] == ref, (seed, p_len)
            differs += steps["paper"] != ref
    assert differs


# ---- the trace itself ---------------------------------------------------------------------
@pytest.mark.parametrize("family", ["llada", "dream", "sdar", "fast_dllm_v2", "llada_moe", "llada2"])
def test_trace_records_every_forward_on_every_family(family, tmp_path):
    """One record per forward: NFE records (prefill and commit forwards included), the committed
    positions rebuild the response, and the JSON lines are the records."""
    model = tiny_backbone(family, seed=0, n_layers=2, stop_ids=[])
    prompt = random_prompt(6, 0)
    s, c = build_method({"sampler": {"name": "threshold", "tau": 0.5, "block_length": 8},
                         "cache": {"name": "fast_dllm_dual"}}, model)
    path = tmp_path / "trace.jsonl"
    with DecodeTrace(str(path)) as trace:
        res = decode(model, s, c, prompt, 16, observer=trace)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert lines == trace.records
    assert len(lines) == res.stats["nfe"]
    assert [r["forward"] for r in lines] == list(range(len(lines)))
    x = torch.full((6 + 16,), MASK_ID)
    for r in lines:
        for cm in r["committed"]:
            if cm["pos"] < x.shape[0]:
                x[cm["pos"]] = cm["token"]
    assert torch.equal(x[6:], res.response)
    steps = [r for r in lines if r["kind"] == "step"]
    assert steps[0]["full"] and steps[0]["why"] == "block start"
    assert any(not r["full"] and r["why"] == "cached" for r in steps)
    assert all(r["rows"] is not None and r["n_rows"] > 0 for r in lines)
