"""dInfer's decoders and cache (docs/METHODS.md §1.13, §1.14, §2.9): each rule against an
independent re-statement of the release's rule (inclusionAI/dInfer, python/dinfer/decoding/),
the vicinity refresh's schedule and windows, its two edges against the Fast-dLLM caches, and
the pairings refused at config time. The degenerate settings are rows of tests/test_exactness.py.
"""
from __future__ import annotations

import math

import pytest
import torch

from dlmpipe import registry
from dlmpipe.methods import build_sampler, check_pairing

from .models import (FAMILIES, HAND_MASK, HAND_PROMPT, HAND_VOCAB, MASK_ID, decode_method,
                     random_prompt, tiny_backbone)


# ---- re-statements (per position, in plain Python over float32 rows) ---------------------------
def _token_and_p(row: torch.Tensor) -> tuple[int, float]:
    """The release's argmax (here never the MASK id) and its float32 softmax probability."""
    masked = row.clone()
    masked[HAND_MASK] = -math.inf
    tok = int(masked.argmax())
    return tok, float(torch.softmax(row.float(), -1)[tok])


def hierarchy_reference(block: list[int], rows: torch.Tensor, threshold: float, low: float) -> dict:
    """HierarchyDecoder.get_transfer_index: in each run of adjacent masked positions the
    positions holding the run's maximum confidence, if above ``low``; every one above
    ``threshold``; the most confident masked position (first on ties). Position -> token."""
    conf, tok = {}, {}
    for i, t in enumerate(block):
        if t == HAND_MASK:
            tok[i], conf[i] = _token_and_p(rows[i])
    chosen = set()
    i = 0
    while i < len(block):
        if block[i] != HAND_MASK:
            i += 1
            continue
        j = i
        while j < len(block) and block[j] == HAND_MASK:
            j += 1
        best = max(conf[k] for k in range(i, j))
        chosen |= {k for k in range(i, j) if conf[k] == best and conf[k] > low}
        i = j
    chosen |= {k for k in conf if conf[k] > threshold}
    top = max(conf.values())
    chosen.add(min(k for k in conf if conf[k] == top))
    return {k: tok[k] for k in chosen}


def random_block(gen: torch.Generator, length: int, p_masked: float = 0.6) -> list[int]:
    keep = torch.rand(length, generator=gen) > p_masked
    block = [int(t) if k else HAND_MASK for t, k in
             zip(torch.randint(0, HAND_MASK, (length,), generator=gen), keep)]
    if HAND_MASK not in block:
        block[int(torch.randint(0, length, (1,), generator=gen))] = HAND_MASK
    return block


def test_hierarchical_decoding_equals_the_release_rule():
    """Many random blocks (runs of masked positions of every length, logits sharp and flat):
    one step unmasks exactly what the release's rule unmasks, with the same tokens."""
    gen = torch.Generator().manual_seed(0)
    several_runs = 0
    for case in range(300):
        g = 8
        sampler = build_sampler({"name": "dinfer_hierarchy", "block_length": g,
                                 "block_alignment": "response",
                                 "threshold": 0.35, "low_threshold": 0.2})
        block = random_block(gen, g)
        x = torch.tensor([1, 2, 3] + block)
        sampler.begin(HAND_PROMPT, g, HAND_MASK)
        sampler.remaining = block.count(HAND_MASK)
        logits = torch.randn(g, HAND_VOCAB, generator=gen) * (0.5 + 3 * (case % 3))
        expected = hierarchy_reference(block, logits, 0.35, 0.2)
        sampler.step(x, logits)
        after = x[HAND_PROMPT:].tolist()
        got = {i: after[i] for i in range(g) if block[i] == HAND_MASK and after[i] != HAND_MASK}
        assert got == expected, (case, block)
        below = [k for k in expected if _token_and_p(logits[k])[1] <= 0.35]
        several_runs += len(below) > 1
    assert several_runs > 10  # steps where several runs gave a position below the threshold


def test_hierarchical_decoding_takes_each_run_s_best_not_the_block_s():
    """Two runs of masks, none above threshold: each run's best above low_threshold is unmasked
    (threshold decoding would take only the block's best); a run whose best is below
    low_threshold gives nothing but the block's best."""
    from .models import logits_for
    sampler = build_sampler({"name": "dinfer_hierarchy", "block_length": 6, "threshold": 0.9,
                             "block_alignment": "response",
                             "low_threshold": 0.3})
    x = torch.tensor([1, 2, 3, HAND_MASK, HAND_MASK, 4, HAND_MASK, HAND_MASK, 5])
    sampler.begin(HAND_PROMPT, 6, HAND_MASK)
    sampler.remaining = 4
    logits = logits_for([6, 7, 0, 8, 9, 0], [0.5, 0.6, 0.9, 0.4, 0.35, 0.9])
    sampler.step(x, logits)
    assert x[HAND_PROMPT:].tolist() == [HAND_MASK, 7, 4, 8, HAND_MASK, 5]
    low = build_sampler({"name": "dinfer_hierarchy", "block_length": 6, "threshold": 0.9,
                             "block_alignment": "response",
                         "low_threshold": 0.45})
    x = torch.tensor([1, 2, 3, HAND_MASK, HAND_MASK, 4, HAND_MASK, HAND_MASK, 5])
    low.begin(HAND_PROMPT, 6, HAND_MASK)
    low.remaining = 4
    low.step(x, logits)
    assert x[HAND_PROMPT:].tolist() == [HAND_MASK, 7, 4, HAND_MASK, HAND_MASK, 5]


def credit_reference(rows_per_step: list[torch.Tensor], g: int, threshold: float, alpha: float,
                     gamma: float, beta: float) -> list[list[int]]:
    """CreditThresholdParallelDecoder.decode over one block, step by step: the credit of each
    (position, token) pair decays by beta after the block's first step, each masked position
    adds p_top1 ** gamma at its top-1 token; the threshold rule of get_transfer_index_threshold
    on logits + alpha log(1 + credit). The block after each step."""
    block = [HAND_MASK] * g
    credit = [[0.0] * HAND_VOCAB for _ in range(g)]
    states = []
    for step, rows in enumerate(rows_per_step):
        if HAND_MASK not in block:
            break
        masked = [i for i in range(g) if block[i] == HAND_MASK]
        if step:
            credit = [[c * beta for c in r] for r in credit]
        for i in masked:
            p = torch.softmax(rows[i].float(), -1)
            credit[i][int(p.argmax())] += float(p.max()) ** gamma
        conf, tok = {}, {}
        for i in masked:
            fused = rows[i].float() + alpha * torch.log(torch.tensor(credit[i], dtype=torch.float32) + 1)
            tok[i], conf[i] = _token_and_p(fused)
        bar = min(threshold, max(conf.values()) - 1e-5)
        for i in masked:
            if conf[i] >= bar:
                block[i] = tok[i]
        states.append(list(block))
    return states


@pytest.mark.parametrize("alpha", [0.7, 0.0, 3.0])
def test_credit_decoding_equals_the_release_rule(alpha):
    """Logits that drift a little from step to step (so credit builds up over several steps):
    the block after each step equals the release's rule (alpha 0: dInfer's plain threshold
    decoder)."""
    gen = torch.Generator().manual_seed(1)
    for case in range(40):
        g = 6
        base = torch.randn(g, HAND_VOCAB, generator=gen) * 2.5
        rows = [base + 0.4 * torch.randn(g, HAND_VOCAB, generator=gen) for _ in range(2 * g)]
        expected = credit_reference(rows, g, 0.9, alpha, 0.2, 0.8)
        sampler = build_sampler({"name": "dinfer_credit", "block_length": g, "threshold": 0.9,
                                 "block_alignment": "response",
                                 "credit_alpha": alpha})
        x = torch.tensor([1, 2, 3] + [HAND_MASK] * g)
        sampler.begin(HAND_PROMPT, g, HAND_MASK)
        for step, want in enumerate(expected):
            sampler.step(x, rows[step])
            assert x[HAND_PROMPT:].tolist() == want, (case, step)
        assert sampler.done


def test_credit_lets_consistently_predicted_tokens_pass_sooner():
    """Positions predicting the same token just below the threshold at every step gain credit
    and pass it together; without credit (alpha 0, dInfer's threshold decoder) the block takes
    one per step."""
    from .models import logits_for
    rows = logits_for(list(range(8)), [0.86 - 0.005 * i for i in range(8)])
    accepted = {}
    for alpha in (0.0, 0.7):
        sampler = build_sampler({"name": "dinfer_credit", "block_length": 8, "threshold": 0.9,
                                 "block_alignment": "response",
                                 "credit_alpha": alpha})
        x = torch.tensor([1, 2, 3] + [HAND_MASK] * 8)
        sampler.begin(HAND_PROMPT, 8, HAND_MASK)
        while not sampler.done:
            sampler.step(x, rows)
        assert x[HAND_PROMPT:].tolist() == list(range(8))
        accepted[alpha] = sampler.stats()["accepted_per_step"]
    assert accepted[0.0] == [1] * 8
    assert accepted[0.7] == [3, 5]


@pytest.mark.parametrize("name", ["dinfer_hierarchy", "dinfer_credit"])
def test_absolute_block_alignment_is_the_benchmarks(name):
    """block_alignment absolute (the default; the release's start_block_align): blocks at
    multiples of block_length in absolute positions, the first cut at the response's start, the
    last at its end; every block decoded in turn, each handed to the cache; gen_length need not
    be a multiple then."""
    model = tiny_backbone("llada", seed=8, n_layers=2)
    for p_len, g, length, bounds in ((5, 16, 8, [0, 3, 11, 16]), (8, 16, 8, [0, 8, 16]),
                                     (13, 20, 8, [0, 3, 11, 19, 20])):
        out, calls = _recorded(model, {"name": name, "block_length": length, "threshold": 0.5},
                               {"name": "dinfer_vicinity", "prefix_look": 1, "after_look": 1,
                                "warmup_steps": 0}, random_prompt(p_len, 8), g)
        seen = list(dict.fromkeys(block for block, _ in calls))
        assert seen == list(zip(bounds, bounds[1:])), (p_len, seen)
        assert (out.response != MASK_ID).all()
    method = {"sampler": {"name": name, "block_length": 64, "block_alignment": "absolute"},
              "cache": {"name": "none"}}
    assert registry.gen_length_problems(method, 96) == []


# ---- the vicinity refresh -------------------------------------------------------------------
def _recorded(model, sampler, cache_spec, prompt, gen_len=16):
    """Decode, recording for each forward its block and whether it was full or which rows."""
    from dlmpipe.decode import decode
    from dlmpipe.methods import build_cache

    s = build_sampler(sampler)
    c = build_cache(cache_spec, model)
    calls = []
    full, rows, inner = c._full_forward, c._forward_rows, c.response_logits

    def record_full(x, serve):
        calls[-1][1] = "full"
        return full(x, serve)

    def record_rows(x, r, serve):
        calls[-1][1] = (int(r[0]), int(r[-1]) + 1, r.numel())
        return rows(x, r, serve)

    def response_logits(x, block):
        calls.append([tuple(block), None])
        return inner(x, block)

    c._full_forward, c._forward_rows, c.response_logits = record_full, record_rows, response_logits
    out = decode(model, s, c, prompt, gen_len, torch.Generator().manual_seed(0))
    return out, calls


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("look", [(2, 3), (0, 0), (7, 40)])
def test_vicinity_refresh_schedule_and_windows(family, look):
    """The first warmup_steps forwards full, the next one full (the dual cache built), each
    later block's first forward full; every other forward recomputes exactly the block with
    prefix_look rows before and after_look after it (clipped; a shifted family's row before
    the block always), over the cached rest."""
    before, after = look
    warmup, p_len, g = 2, 5, 16
    model = tiny_backbone(family, seed=4, n_layers=2)
    out, calls = _recorded(model, {"name": "threshold", "block_length": 4, "tau": 0.7},
                           {"name": "dinfer_vicinity", "prefix_look": before, "after_look": after,
                            "warmup_steps": warmup}, random_prompt(p_len, 4), g)
    n = p_len + g
    shift = model.first_logit_row(p_len) < p_len
    seen_blocks = set()
    windows = 0
    for i, (block, what) in enumerate(calls):
        lo, hi = block
        new = block not in seen_blocks
        seen_blocks.add(block)
        start = max(0, min(p_len + lo - before, p_len + lo - int(shift)))
        stop = min(n, p_len + hi + after)
        if i < warmup + 1 or new or (start, stop) == (0, n):
            assert what == "full", (i, block, what)
        else:
            assert what == (start, stop, stop - start), (i, block, what)
            windows += 1
    assert windows > 0 or (before, after) == (7, 40)
    assert out.stats["cached_forwards"] == windows


@pytest.mark.parametrize("family", FAMILIES)
def test_vicinity_edges_are_the_fast_dllm_caches(family):
    """No vicinity and no warm-up is dInfer's plain dual cache: Fast-dLLM's dual cache's rows,
    token for token; a window reaching the sequence's end with none before the block is
    Fast-dLLM's prefix cache, token for token. Blocks from the response's start (under
    absolute alignment a block starting inside the prompt is recomputed from its start, prompt
    rows included, as dInfer's caches do: tests/test_release_traces.py)."""
    model = tiny_backbone(family, seed=5, n_layers=3)
    sampler = {"name": "dinfer_credit", "block_length": 4, "threshold": 0.7,
               "block_alignment": "response"}
    for seed in (0, 1):
        prompt = random_prompt(6 + 5 * seed, seed)
        pairs = (({"name": "dinfer_vicinity", "prefix_look": 0, "after_look": 0, "warmup_steps": 0},
                  {"name": "fast_dllm_dual"}),
                 ({"name": "dinfer_vicinity", "prefix_look": 0, "after_look": 10**6, "warmup_steps": 0},
                  {"name": "fast_dllm_prefix"}))
        for vicinity, fast in pairs:
            got = decode_method(model, sampler, vicinity, prompt, seed=seed)
            ref = decode_method(model, sampler, fast, prompt, seed=seed)
            assert torch.equal(got.response, ref.response), (vicinity, seed)
            for key in ("nfe", "cached_forwards", "refreshes", "query_row_fraction"):
                assert got.stats[key] == ref.stats[key], (key, vicinity)


def test_vicinity_differs_from_the_plain_dual_cache_somewhere():
    """The window matters: over a few prompts, recomputing 8 rows around the block changes
    some token against the plain dual cache (the test above would pass for any window rule
    that ignored prefix_look and after_look otherwise)."""
    model = tiny_backbone("llada", seed=6, n_layers=3)
    sampler = {"name": "dinfer_hierarchy", "block_length": 4, "threshold": 0.6, "low_threshold": 0.2,
               "block_alignment": "response"}
    differs = 0
    for seed in range(6):
        prompt = random_prompt(7, seed)
        a = decode_method(model, sampler, {"name": "dinfer_vicinity", "prefix_look": 0,
                                           "after_look": 0, "warmup_steps": 0}, prompt)
        b = decode_method(model, sampler, {"name": "dinfer_vicinity", "prefix_look": 8,
                                           "after_look": 8, "warmup_steps": 0}, prompt)
        differs += not torch.equal(a.response, b.response)
        assert a.stats["query_row_fraction"] < b.stats["query_row_fraction"]
    assert differs


# ---- pairings and checks at config time ------------------------------------------------------
def test_config_time_refusals():
    """Samplers that read every response row (Saber's rollback, KLASS's KL history) are refused
    with the vicinity cache, saying why; dInfer's decoders pair with every cache; their blocks
    must tile gen_length."""
    for sampler in ("saber", "klass"):
        problem = registry.pairing_problem(sampler, "dinfer_vicinity")
        assert problem and "rows of the current block" in problem
        with pytest.raises(ValueError, match="dinfer_vicinity"):
            check_pairing(sampler, "dinfer_vicinity")
    for sampler in ("dinfer_hierarchy", "dinfer_credit"):
        assert registry.serving_caches(sampler) == list(registry.CACHES)
        filled = registry.resolve("sampler", {"name": sampler, "block_alignment": "response"})[1]
        method = {"sampler": filled | {"name": sampler}, "cache": {"name": "none"}}
        assert registry.gen_length_problems(method, 128) == []
        assert "does not divide gen_length 96" in registry.gen_length_problems(method, 96)[0]
    for attention in registry.ATTENTIONS:
        method = {"sampler": {"name": "dinfer_credit"}, "cache": {"name": "dinfer_vicinity"}}
        assert registry.attention_problems(method, attention) == []


def test_vicinity_released_rule_refuses_a_refresh_interval():
    """``rule: released`` is the release's iteration counter, which refreshes at block starts
    only: a ``refresh_interval`` with it is refused at config time, saying why."""
    sampler = registry.resolve("sampler", {"name": "dinfer_credit"})[1] | {"name": "dinfer_credit"}
    for interval, refused in ((2, True), (None, False)):
        cache = {"name": "dinfer_vicinity", "rule": "released", "refresh_interval": interval}
        problems = registry.gen_length_problems({"sampler": sampler, "cache": cache}, 128)
        assert any("refresh_interval null" in p for p in problems) == refused
