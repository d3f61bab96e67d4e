"""WINO (docs/METHODS.md §1.8): token- and step-level parity against a straightforward
re-statement of the released algorithm on tiny models of both families, the shadow block's
attention geometry, and the wide-in / narrow-out rules on hand-built logits.

The re-statement below is written from the released code's logic (the official
``decoding_wino`` and d2Cache's ``wino_generate_step``), not from dlmpipe's classes: one forward
over ``[sequence ; shadow block]`` with an explicit boolean attention mask through the model's
public layers, then the selection rules on full-length masks. Its one deliberate difference
from the releases is dlmpipe's token choice (never the MASK id, like the threshold sampler).
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from dlmpipe import registry
from dlmpipe.decode import Decoding
from dlmpipe.engine.shadow import ShadowRows, shadow_inputs
from dlmpipe.methods import build_cache, build_method
from dlmpipe.samplers.wino import Wino, released_cap, wide_in_count

from .models import (FAMILIES, HAND_MASK, HAND_PROMPT, MASK_ID, logits_for, random_prompt, start,
                     tiny_backbone)


# ---- the re-statement ------------------------------------------------------------------------
def reference_forward(model, x, P, lo, hi):
    """Response logits ``[G, V]`` and the verification logits of response positions [lo, hi)
    from one forward over ``[x ; shadow]``: the shadow is the masked copy of the block (for a
    logit-shifted family also the row before it, keeping its token), nothing real attends to
    it, it attends to itself, and the row whose logits verify a position never sees that
    position's real token (the released mask's ``~eye``, moved with Dream's shift)."""
    s = int(model.cfg.logit_shift)
    n, a, b = x.numel(), P + lo, P + hi
    shadow_ids = torch.full((b - a + s,), MASK_ID)
    if s:
        shadow_ids[0] = x[a - 1]
    ids = torch.cat([x, shadow_ids])
    positions = torch.cat([torch.arange(n), torch.arange(a - s, b)])
    L = ids.numel()
    mask = torch.ones(L, L, dtype=torch.bool)
    mask[:, n:] = False
    mask[n:, n:] = True
    for k in range(b - a):
        mask[n + k, a + k] = False
    rope = model.rope(positions)
    h = model.embed(ids[None])
    for i in range(model.cfg.n_layers):
        q, k, v = model.qkv(i, h, rope)
        h = h + model.attn_output(i, model.attend(q, k, v, mask))
        h = h + model.ffn(i, h)
    raw = model.logits(h)[0]
    return raw[P - s:n - s], raw[n:n + b - a]


def reference_wino(model, prompt, gen_len, block_length, wide_in, narrow_out, rule):
    """The released loop, step by step; returns the sequence after every step."""
    P = prompt.numel()
    x = torch.cat([prompt, torch.full((gen_len,), MASK_ID)])
    states = []
    for nb in range(gen_len // block_length):
        lo, hi = nb * block_length, (nb + 1) * block_length
        block_mask = torch.zeros(gen_len, dtype=torch.bool)
        block_mask[lo:hi] = True
        while True:
            resp = x[P:]
            if rule == "released":
                on = block_mask.nonzero()[:, 0]
                w0, w1 = int(on[0]), int(on[-1]) + 1  # the window, before the in-place AND
                block_mask &= resp == MASK_ID           # check_can_generate narrows it in place
                if not block_mask.any():
                    break
            else:
                w0, w1 = lo, hi
                if not (resp[lo:hi] == MASK_ID).any():
                    break
            logits, verify = reference_forward(model, x, P, w0, w1)
            masked = resp[w0:w1] == MASK_ID
            rows = logits[w0:w1].double()
            choose = rows.clone()
            choose[:, MASK_ID] = float("-inf")
            x0 = choose.argmax(-1)
            conf = torch.softmax(rows, -1).gather(-1, x0[:, None])[:, 0]
            conf = torch.where(masked, conf, float("-inf"))
            selected = conf >= wide_in
            if rule == "released":
                cap = min(max(int(masked.sum() * 0.7), 5), 20)
                if selected.sum() > cap:
                    selected = torch.zeros_like(selected)
                    selected[torch.topk(conf, cap).indices] = True
            if not selected.any():
                selected[conf.argmax()] = True
            target = int(selected.sum()) - 1
            vconf = torch.softmax(verify.double(), -1).gather(-1, resp[w0:w1, None])[:, 0]
            vconf = torch.where(masked, float("inf"), vconf)
            remask = vconf < narrow_out
            if remask.sum() > target:
                remask = torch.zeros_like(remask)
                if target > 0:
                    remask[torch.topk(vconf, target, largest=False).indices] = True
            new = resp[w0:w1].clone()
            new[selected] = x0[selected]
            new[remask] = MASK_ID
            x[P + w0:P + w1] = new
            states.append(x.clone())
    return states


def dlmpipe_states(model, sampler: dict, cache: dict, prompt, gen_len):
    s, c = build_method({"sampler": sampler, "cache": cache}, model)
    run = Decoding(model, s, c, prompt, gen_len)
    states = []
    with torch.inference_mode():
        while not run.done:
            run.step()
            states.append(run.x.clone())
    return states, run.stats()


# ---- parity ----------------------------------------------------------------------------------
CASES = [(0.05, 0.2), (0.2, 0.9), (0.4, 0.99)]  # (wide_in, narrow_out)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("rule", ["paper", "released"])
def test_every_step_equals_the_released_algorithm(family, rule):
    remasked = 0
    for seed in (0, 1, 2):
        model = tiny_backbone(family, seed=seed, scale=2.0)  # peaked: several unmasks, re-masks
        prompt = random_prompt(9, seed)
        for wide_in, narrow_out in CASES:
            with torch.inference_mode():
                want = reference_wino(model, prompt, 16, 8, wide_in, narrow_out, rule)
            for cache in ({"name": "none"}, {"name": "archer", "K": 1}):
                got, stats = dlmpipe_states(model, {"name": "wino", "block_length": 8, "wide_in": wide_in,
                                                    "narrow_out": narrow_out, "rule": rule},
                                            cache, prompt, 16)
                assert len(got) == len(want), (seed, wide_in, cache)
                for t, (g, w) in enumerate(zip(got, want)):
                    assert torch.equal(g, w), (seed, wide_in, cache, t)
                assert stats["steps"] == stats["nfe"] == len(want)
            remasked += sum(stats["remasked_per_step"])
    assert remasked > 0  # the cases exercise narrow-out


def test_the_released_window_can_leave_masks_the_paper_rule_does_not():
    """d2Cache's in-place narrowing ends a block while a re-masked position outside the
    narrowed mask is still masked; the paper rule decodes every block to the end."""
    model = tiny_backbone("llada", seed=0, scale=1.0)
    prompt = random_prompt(9, 0)
    spec = {"name": "wino", "block_length": 8, "wide_in": 0.05, "narrow_out": 0.2}
    paper, _ = dlmpipe_states(model, {**spec, "rule": "paper"}, {"name": "none"}, prompt, 16)
    released, _ = dlmpipe_states(model, {**spec, "rule": "released"}, {"name": "none"}, prompt, 16)
    assert (paper[-1] != MASK_ID).all()
    assert (released[-1][9:] == MASK_ID).any()


# ---- the shadow rows -------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_shadow_rows_equal_the_masked_single_forward(family):
    model = tiny_backbone(family, seed=5, scale=1.0)
    prompt = random_prompt(7, 5)
    x = torch.cat([prompt, torch.randint(1, MASK_ID, (16,))])
    x[7 + 9] = MASK_ID
    for lo, hi in ((0, 8), (8, 16), (3, 11)):
        want_resp, want_verify = reference_forward(model, x, 7, lo, hi)
        cache = build_cache({"name": "none"}, model)
        cache.begin(x, 7)
        cache.note_shadow_block((lo, hi))
        got = cache.response_logits(x, (lo, hi))
        assert got.shape[0] == 16 + hi - lo
        torch.testing.assert_close(got[:16], want_resp, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(got[16:], want_verify, rtol=1e-4, atol=1e-4)
        # the response rows are exactly the plain forward's (nothing real sees the shadow)
        cache.note_shadow_block(None)
        assert torch.equal(cache.response_logits(x, (lo, hi)), got[:16])


@pytest.mark.parametrize("family", FAMILIES)
@torch.inference_mode()
def test_a_verifying_row_never_sees_the_token_it_verifies(family):
    """With one layer, nothing else carries a token to the shadow: the verification logits of
    position i do not depend on x_i (they would for Dream if the LLaDA mask were read through
    the shift), and they do depend on its neighbours."""
    model = tiny_backbone(family, seed=6, n_layers=1, scale=1.0)
    P = 5
    x = torch.cat([random_prompt(P, 6), torch.randint(1, MASK_ID, (8,))])
    base = ShadowRows(model, *shadow_inputs(model, x, P, P + 8))
    model.hidden_states(x[None], base)
    for k in range(8):
        y = x.clone()
        y[P + k] = (x[P + k] % (MASK_ID - 1)) + 1
        moved = ShadowRows(model, *shadow_inputs(model, y, P, P + 8))
        model.hidden_states(y[None], moved)
        assert torch.equal(moved.logits()[k], base.logits()[k]), k
        assert not torch.allclose(moved.logits()[(k + 1) % 8], base.logits()[(k + 1) % 8])


#: every cache at the setting whose cached path runs on a tiny model (its entry's ``cheap``)
CACHED = {n: {"name": n, **c.cheap} for n, c in registry.CACHES.items() if n != "none"}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", list(CACHED))
@torch.inference_mode()
def test_a_cached_forward_serves_the_full_forwards_shadow_rows_on_an_unchanged_sequence(family, name):
    """Each cache's cheap path runs the shadow rows over its own K/V (cached and fresh rows);
    on an unchanged sequence those K/V are the full forward's, so are the shadow logits."""
    model = tiny_backbone(family, seed=7, scale=1.0)
    prompt = random_prompt(6, 7)
    x = torch.cat([prompt, torch.randint(1, MASK_ID, (16,))])
    x[6 + 9:6 + 13] = MASK_ID  # masked rows in the block, for the caches that serve only those
    cache = build_cache(CACHED[name], model)
    cache.begin(x, 6)
    cache.note_shadow_block((8, 16))
    full = cache.response_logits(x, (8, 16)).clone()
    for _ in range(3):  # dKV-Cache decode's second forward of a block is full too
        cached = cache.response_logits(x, (8, 16))
    assert cache.stats.cached_forwards >= 1
    served = torch.isfinite(cached[:16]).all(-1)
    assert served[9:13].all()
    if name == "fast_dllm_v2" and model.cfg.logit_shift:
        # the release serves the sub-block's first position (decoded here, never sampled) from
        # its own row, not the row before it (v2/generation_functions.py lines 108-109; §2.8)
        served[8] = False
    torch.testing.assert_close(cached[:16][served], full[:16][served], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cached[16:], full[16:], rtol=1e-4, atol=1e-4)


def test_caches_declare_what_they_compute():
    for name, entry in registry.CACHES.items():
        assert entry.load().shadow_rows == entry.shadow_rows, name
    assert not [c for c in registry.CACHES if registry.pairing_problem("wino", c)]


def test_a_cache_without_shadow_rows_is_refused_at_config_time_and_at_the_seam(monkeypatch):
    entry = registry.CACHES["fast_dllm_dual"]
    monkeypatch.setitem(registry.CACHES, "fast_dllm_dual", dataclasses.replace(entry, shadow_rows=False))
    problem = registry.pairing_problem("wino", "fast_dllm_dual")
    assert problem and "does not compute shadow rows" in problem
    assert registry.pairing_problem("threshold", "fast_dllm_dual") is None
    model = tiny_backbone("llada", seed=0)
    cache = build_cache({"name": "fast_dllm_dual"}, model)
    monkeypatch.setattr(type(cache), "shadow_rows", False)
    with pytest.raises(NotImplementedError, match="shadow rows"):
        cache.note_shadow_block((0, 8))
    cache.note_shadow_block(None)


# ---- the rules on hand-built logits ----------------------------------------------------------
def hand(rows_main: list[tuple[int, float]], rows_shadow: list[tuple[int, float]]) -> torch.Tensor:
    """Logits [G + W, V]: the response rows, then the shadow rows (token, probability)."""
    return torch.cat([logits_for(*zip(*rows_main)), logits_for(*zip(*rows_shadow))])


def sampler(**kw) -> Wino:
    params = {"wide_in": 0.6, "narrow_out": 0.9, "block_length": None, "temperature": 0.0,
              "rule": "paper", **kw}
    return Wino(**params)


def test_wide_in_takes_every_mask_at_or_over_the_threshold():
    s = sampler()
    x = start(s, 4)
    anything = [(1, 0.5)] * 4
    s.step(x, hand([(4, 0.7), (5, 0.5), (6, 0.61), (7, 0.59)], anything))
    assert x[HAND_PROMPT:].tolist() == [4, HAND_MASK, 6, HAND_MASK]
    assert s.accepted_per_step == [2] and not s.done
    # the threshold itself passes (>=), and one is taken of none passing
    assert int(wide_in_count(torch.tensor([0.7, 0.6, 0.5], dtype=torch.float64), 0.6)) == 2
    assert int(wide_in_count(torch.tensor([0.3, 0.2], dtype=torch.float64), 0.6)) == 1


def test_wide_in_takes_the_most_confident_when_none_passes_and_never_the_mask():
    s = sampler()
    x = start(s, 3)
    s.step(x, hand([(HAND_MASK, 0.55), (5, 0.3), (6, 0.4)], [(1, 0.5)] * 3))
    # row 0's MASK is excluded: its best other token has (1 - 0.55) / 11 < 0.4
    assert x[HAND_PROMPT:].tolist() == [HAND_MASK, HAND_MASK, 6]


def test_narrow_out_remasks_low_verifications_at_most_unmasked_minus_one():
    s = sampler()
    x = start(s, 6)
    x[HAND_PROMPT:HAND_PROMPT + 3] = torch.tensor([4, 5, 6])  # decoded before this step
    s.remaining = 3
    # three verifications below 0.9; three new tokens unmasked -> at most two re-masked, lowest first
    s.step(x, hand([(1, 0.1), (1, 0.1), (1, 0.1), (7, 0.95), (8, 0.97), (9, 0.96)],
                   [(4, 0.5), (5, 0.2), (6, 0.89), (1, 0.5), (1, 0.5), (1, 0.5)]))
    assert x[HAND_PROMPT:].tolist() == [HAND_MASK, HAND_MASK, 6, 7, 8, 9]
    assert s.remasked_per_step == [2]


def test_narrow_out_keeps_verified_tokens_and_never_remasks_after_a_single_unmask():
    s = sampler()
    x = start(s, 4)
    x[HAND_PROMPT:HAND_PROMPT + 2] = torch.tensor([4, 5])
    s.remaining = 2
    s.step(x, hand([(1, 0.1), (1, 0.1), (7, 0.3), (8, 0.2)],
                   [(4, 0.1), (5, 0.95), (1, 0.5), (1, 0.5)]))
    assert x[HAND_PROMPT:].tolist() == [4, 5, 7, HAND_MASK]  # one unmasked: nothing re-masked
    s.step(x, hand([(1, 0.1), (1, 0.1), (1, 0.1), (8, 0.3)],
                   [(9, 0.5), (5, 0.95), (7, 0.95), (1, 0.5)]))
    assert x[HAND_PROMPT:].tolist() == [4, 5, 7, 8] and s.done  # token 4 reads 0.5/11 < 0.9, yet kept


def test_narrow_out_zero_never_remasks():
    s = sampler(narrow_out=0.0)
    x = start(s, 4)
    x[HAND_PROMPT:HAND_PROMPT + 2] = torch.tensor([4, 5])
    s.remaining = 2
    s.step(x, hand([(1, 0.1), (1, 0.1), (7, 0.9), (8, 0.9)], [(1, 0.99), (1, 0.99), (1, 0.5), (1, 0.5)]))
    assert x[HAND_PROMPT:].tolist() == [4, 5, 7, 8]


def test_the_released_rule_caps_wide_in():
    assert [released_cap(m) for m in (1, 7, 8, 10, 28, 29, 40)] == [5, 5, 5, 7, 19, 20, 20]
    s = sampler(rule="released", wide_in=0.5)
    x = start(s, 8)
    s.step(x, hand([(t, 0.9 - 0.01 * t) for t in range(1, 9)], [(1, 0.5)] * 8))
    assert s.accepted_per_step == [5]
    assert x[HAND_PROMPT:].tolist() == [1, 2, 3, 4, 5] + [HAND_MASK] * 3


# ---- the shadow probe (docs/ANALYSES.md) sees WINO's shadow rows too -------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_the_shadow_probe_compares_shadow_rows_and_archer_k1_never_disagrees(family):
    from dlmpipe.decode import decode
    from dlmpipe.probes.shadow import ShadowProbe

    model = tiny_backbone(family, seed=0, scale=2.0)
    spec = {"sampler": {"name": "wino", "block_length": 8, "wide_in": 0.2, "narrow_out": 0.9}}
    for K in (1, 4):  # K = 4: the probe runs over cached steps; K = 1: nothing may differ
        s, c = build_method({**spec, "cache": {"name": "archer", "K": K}}, model)
        probe = ShadowProbe(rate=1.0, steps="all").start("0")
        decode(model, s, c, random_prompt(9, 0), 16, observer=probe)
        assert probe.records
        if K == 1:
            assert not any(r["action_differs"] for r in probe.records)
            assert all(r["logit_drift_max"] == 0 for r in probe.records)


# ---- Archer's cached step with shadow rows stays capturable (dlmpipe/graphs.py) ---------------
@pytest.mark.parametrize("family", FAMILIES)
def test_archers_captured_shadow_step_decodes_the_eager_tokens(monkeypatch, family):
    from dlmpipe import graphs
    from dlmpipe.decode import decode

    from .host_sync import replay_capture

    monkeypatch.setitem(graphs.CAPTURE, "cpu", replay_capture)  # the CPU stand-in for a graph
    model = tiny_backbone(family, seed=3, scale=2.0)
    archer = {"name": "archer", "K": "inf"}
    for rule in ("paper", "released"):
        sampler = {"name": "wino", "block_length": 8, "wide_in": 0.2, "narrow_out": 0.9, "rule": rule}
        s, c = build_method({"sampler": sampler, "cache": archer}, model, compile="cuda_graphs")
        for i in range(2):
            prompt = random_prompt(7, i)
            want, _ = dlmpipe_states(model, sampler, archer, prompt, 16)
            got = decode(model, s, c, prompt, 16, torch.Generator().manual_seed(i))
            assert torch.equal(got.response, want[-1][7:]), (rule, i)
        if rule == "paper":  # one shape (block length + shift shadow rows) for every step
            assert c.cached_shadow_step.captures == 1
