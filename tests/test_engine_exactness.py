"""Archer's cached path against full recompute (ARCHITECTURE.md, testing shape): a fresh cached
forward is exact, stale prompt K/V until a refresh, K = inf and the age controller, and the
trained toy backbone; also on an LLaDA-MoE-shaped model (its routed FFN is row-local, so the
cached prompt rows are exact while fresh). Archer K = 1 equal to full recompute is a row of
tests/test_exactness.py."""
from __future__ import annotations

import pytest
import torch

from dlmpipe.decode import decode
from dlmpipe.methods import build_cache, build_sampler

from .models import FAMILIES, MASK_ID, decode_method, random_prompt, tiny_backbone

SABER = {"name": "saber", "n": 2, "mu": 2}


@pytest.mark.parametrize("family", [*FAMILIES, "llada_moe"])
def test_fresh_cached_forward_equals_full_forward(family):
    model = tiny_backbone(family, seed=4)
    prompt = random_prompt(30, 4)
    x = torch.cat([prompt, torch.full((12,), MASK_ID)])
    x[33] = 7  # some visible response tokens
    x[38] = 9
    cache = build_cache({"name": "archer", "K": "inf"}, model)
    cache.begin(x, prompt.shape[0])
    full = cache.response_logits(x, (0, 12))
    cached = cache.response_logits(x, (0, 12))
    assert cache.stats.cached_forwards == 1
    reference = model.shift(model(x[None]))[0, 30:]
    torch.testing.assert_close(full, reference, rtol=0, atol=0)
    torch.testing.assert_close(cached, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", [*FAMILIES, "llada_moe"])
def test_cached_forward_uses_stale_prompt_kv_until_refresh(family):
    """After the response moves, the cached path differs from full recompute (stale prompt K/V)
    by a small amount, and a refresh at distance K restores exactness."""
    model = tiny_backbone(family, seed=5)
    prompt = random_prompt(30, 5)
    x = torch.cat([prompt, torch.full((12,), MASK_ID)])
    cache = build_cache({"name": "archer", "K": 3}, model)
    cache.begin(x, 30)
    cache.response_logits(x, (0, 12))
    x[30], x[31] = 5, 6  # distance 2 < K: cached path
    stale = cache.response_logits(x, (0, 12))
    exact = model.shift(model(x[None]))[0, 30:]
    assert cache.stats.cached_forwards == 1 and cache.stats.refreshes == 0
    assert not torch.allclose(stale, exact, atol=1e-6)
    x[32] = 7  # distance 3 >= K: refresh
    refreshed = cache.response_logits(x, (0, 12))
    assert cache.stats.refreshes == 1 and cache.refresh_distances == [3]
    torch.testing.assert_close(refreshed, model.shift(model(x[None]))[0, 30:], rtol=0, atol=0)


def test_archer_k_inf_never_refreshes_and_age_controller_refreshes_every_a():
    model = tiny_backbone("llada", seed=6)
    prompt = random_prompt(20, 6)
    inf = decode_method(model, SABER, {"name": "archer", "K": "inf"}, prompt)
    assert inf.stats["refreshes"] == 0
    assert inf.stats["cached_forwards"] == inf.stats["nfe"] - 1
    age = decode_method(model, {"name": "saber"}, {"name": "archer", "refresh": "age", "A": 3}, prompt)
    assert age.stats["refreshes"] == (age.stats["nfe"] - 1) // 3


def test_full_recompute_counts_one_forward_per_step():
    model = tiny_backbone("llada", seed=7)
    s = build_sampler({"name": "llada_confidence", "block_length": 4, "steps": 8})
    r = decode(model, s, build_cache({"name": "none"}, model), random_prompt(10, 7), 8)
    assert r.stats["nfe"] == r.stats["steps"] == 8
    assert (r.response != MASK_ID).all()


def test_saber_on_trained_toy_backbone_equals_archer_k1():
    """The same exactness on a trained toy, for several prompts: the shipped one the default
    campaign decodes (dlmpipe/shipped/toy, trained by ``train_toy``)."""
    from dlmpipe.backbones import load_backbone
    from dlmpipe.backbones.shipped import shipped_path
    from dlmpipe.generate import encode_prompt
    from dlmpipe.tasks.toy import make_examples

    toy_backbone = load_backbone(shipped_path("toy"))
    model = toy_backbone.model
    for ex in make_examples("toy_code", 3, 7) + make_examples("toy_arith", 3, 7):
        prompt = torch.tensor(encode_prompt(toy_backbone, ex, chat=False))
        ref = decode_method(model, SABER, {"name": "none"}, prompt)
        got = decode_method(model, SABER, {"name": "archer", "K": 1}, prompt)
        assert torch.equal(got.response, ref.response)
        assert (got.stats["steps"], got.stats["nfe"]) == (ref.stats["steps"], ref.stats["nfe"])


def test_saber_rejects_bad_parameters():
    with pytest.raises(ValueError, match="n must be an integer >= 1"):
        build_sampler({"name": "saber", "n": 0})
    with pytest.raises(ValueError, match="K must be"):
        build_cache({"name": "archer", "K": 0}, tiny_backbone())
