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
"gu").
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
def fast_dllm_v2_release(model, prompt, gen_len, *, sub, threshold, top_p=0.95):
    """gf ``batch_sample`` at temperature 0 (its default, gf line 31), batch 1, without the
    block cache: the steps it takes."""
    n, P = model.cfg.block_size, prompt.shape[0]
    x = prompt.clone()
    if P > n and P % n == 0:  # gf 36-46: prefill, the next token greedy
        x = torch.cat([x, model(x[None])[0, -1:].argmax(-1)])
    steps = []
    for b in range(P // n, gen_len // n + P // n):  # gf 33, 58
        lo, hi = b * n, (b + 1) * n
        x = torch.cat([x, torch.full((hi - x.shape[0],), MASK_ID, dtype=torch.long)])  # gf 62
        for k in range(n // sub):  # gf 90-95
            start, end = lo + k * sub, lo + (k + 1) * sub
            while (x[start:end] == MASK_ID).any():  # gf 96-99
                raw = model(x[None, :hi])[0]
                logits = torch.cat([raw[:1], raw[:-1]])[start:end]  # gf 111-113
                # modeling 763-769: at temperature 0 the plain softmax and its argmax (top_p unused)
                p_1t = torch.softmax(logits.double(), -1)
                x_1 = p_1t.argmax(-1)
                masked = x[start:end] == MASK_ID
                x1_p = p_1t.gather(-1, x_1[:, None])[:, 0].masked_fill(~masked, float("-inf"))  # gf 115-116
                unmask = x1_p > threshold  # gf 118
                unmask[x1_p.argmax()] = True  # gf 119-120
                unmask &= masked  # gf 121
                x[start:end][unmask] = x_1[unmask]  # gf 123
                steps.append(((start, end), [(start + int(i), int(x_1[i]))
                                             for i in unmask.nonzero()[:, 0]]))
        x = torch.cat([x, model(x[None])[0, -1:].argmax(-1)])  # gf 81-85: the next block's token
    return steps


@pytest.mark.parametrize("p_len", [5, 16, 21])
def test_fast_dllm_v2_at_temperature_0_with_the_default_top_p_is_the_release_step_by_step(p_len):
    """The registry's default top_p 0.95 is unused at temperature 0, as in the release: the
    confidence is the plain softmax (before issue 40 it was cut and renormalised by top_p, which
    raised every confidence and unmasked more per step)."""
    differs = 0
    for seed in (0, 1, 2):
        model = tiny_backbone("fast_dllm_v2", seed=seed, n_layers=3, stop_ids=[])
        prompt = random_prompt(p_len, seed)
        ref = fast_dllm_v2_release(model, prompt, 24, sub=4, threshold=0.3)
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
        model = tiny_backbone("fast_dllm_v2", seed=seed, n_layers=3, stop_ids=[])
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


def fast_dllm_v2_block_cache_release(model, prompt, gen_len, *, sub, threshold):
    """gf ``batch_sample`` with ``use_block_cache=True`` at temperature 0, batch 1: per step the
    rows its forward computed and the (position, token) pairs it unmasked."""
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
            while (x[start:end] == MASK_ID).any():  # gf 96-99
                if block is None or x[start] == MASK_ID:  # gf 102
                    raw, prefix, block = release_block_cache_full(model, x, lo, hi)  # gf 103-104
                    logits = torch.cat([raw[:1], raw[:-1]])[start - lo:end - lo]  # gf 105-106
                    rows = [[lo, hi]]
                else:
                    raw = release_block_cache_cached(model, x, start, end, lo, prefix, block)  # gf 108
                    logits = torch.cat([raw[:1], raw[:-1]])  # gf 109: `start` served by its own row
                    rows = [[start, end]]
                p_1t = torch.softmax(logits.double(), -1)  # modeling 766-769 (temperature 0)
                x_1 = p_1t.argmax(-1)
                masked = x[start:end] == MASK_ID
                x1_p = p_1t.gather(-1, x_1[:, None])[:, 0].masked_fill(~masked, float("-inf"))  # gf 115-116
                unmask = x1_p > threshold  # gf 118
                unmask[x1_p.argmax()] = True  # gf 119-120
                unmask &= masked  # gf 121
                x[start:end][unmask] = x_1[unmask]  # gf 123
                steps.append((rows, [(start + int(i), int(x_1[i])) for i in unmask.nonzero()[:, 0]]))
        x = torch.cat([x, model(x[None])[0, -1:].argmax(-1)])  # gf 81-85: the next block's token
    return steps


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
        model = tiny_backbone("fast_dllm_v2", seed=seed, n_layers=3, stop_ids=[])
        prompt = random_prompt(p_len, seed)
        ref = fast_dllm_v2_block_cache_release(model, prompt, 24, sub=4, threshold=threshold)
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


# ---- dInfer on LLaDA2.0 ---------------------------------------------------------------------
def dinfer_block_release(model, prompt, gen_len, *, threshold, low_threshold):
    """gu ``BlockDiffusionLLM.generate`` (lines 929-955) with block_length the model's block
    size and the benchmark's ``BlockIteratorFactory(start_block_align=True)``: blocks from the
    prompt's end to the next multiple of the block length (the rest of the block at once), then
    whole blocks to ``total_length`` (gu 937-940); each block stepped until it has no masks by
    hierarchical decoding (the decoder as tests/test_dinfer.py checks it), over the prefix."""
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
            out.append(((lo, hi), [(lo + int(c), int(t)) for c, t in
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
