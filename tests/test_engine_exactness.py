"""Exactness of the caches against full recompute (ARCHITECTURE.md, testing shape)."""
from __future__ import annotations

import pytest
import torch

from dlmpipe.engine.archer import ArcherCache
from dlmpipe.engine.full import FullRecompute
from dlmpipe.generate import decode
from dlmpipe.methods import build_method
from dlmpipe.samplers.llada_confidence import LLaDAConfidence
from dlmpipe.samplers.saber import Saber
from tests.tiny_models import MASK_ID, random_prompt, tiny_backbone

FAMILIES = ["llada", "dream"]


def _run(model, method, prompt, gen_len=16):
    sampler, cache = build_method(method, model)
    return decode(model, sampler, cache, prompt, gen_len)


SABER_FULL = {"sampler": {"name": "saber", "n": 2, "mu": 2}, "cache": {"name": "none"}}


def _archer(K, sampler=None):
    return {"sampler": sampler or {"name": "saber", "n": 2, "mu": 2}, "cache": {"name": "archer", "K": K}}


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_archer_k1_equals_saber_full_recompute(family, seed):
    model = tiny_backbone(family, seed=seed)
    for p_len in (5, 24):
        prompt = random_prompt(p_len, seed)
        ref = _run(model, SABER_FULL, prompt)
        got = _run(model, _archer(1), prompt)
        assert torch.equal(got.response, ref.response)
        assert got.stats["steps"] == ref.stats["steps"]
        assert got.stats["nfe"] == ref.stats["nfe"] == ref.stats["steps"]
        assert got.stats["revisions"] == ref.stats["revisions"]
        assert got.stats["cached_forwards"] == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_archer_k1_equals_llada_confidence_full_recompute(family):
    model = tiny_backbone(family, seed=3)
    sampler = {"name": "llada_confidence", "block_length": 8, "steps": 16}
    prompt = random_prompt(20, 3)
    ref = _run(model, {"sampler": sampler, "cache": {"name": "none"}}, prompt)
    got = _run(model, _archer(1, sampler), prompt)
    assert torch.equal(got.response, ref.response)
    assert got.stats["nfe"] == ref.stats["nfe"] == 16


@pytest.mark.parametrize("family", FAMILIES)
def test_fresh_cached_forward_equals_full_forward(family):
    model = tiny_backbone(family, seed=4)
    prompt = random_prompt(30, 4)
    x = torch.cat([prompt, torch.full((12,), MASK_ID)])
    x[33] = 7  # some visible response tokens
    x[38] = 9
    cache = ArcherCache(model, K="inf")
    cache.begin(x, prompt.shape[0])
    full = cache.response_logits(x, (0, 12))
    cached = cache.response_logits(x, (0, 12))
    assert cache.stats.cached_forwards == 1
    reference = model.shift(model(x[None]))[0, 30:]
    torch.testing.assert_close(full, reference, rtol=0, atol=0)
    torch.testing.assert_close(cached, reference, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("family", FAMILIES)
def test_cached_forward_uses_stale_prompt_kv_until_refresh(family):
    """After the response moves, the cached path differs from full recompute (stale prompt K/V)
    by a small amount, and a refresh at distance K restores exactness."""
    model = tiny_backbone(family, seed=5)
    prompt = random_prompt(30, 5)
    x = torch.cat([prompt, torch.full((12,), MASK_ID)])
    cache = ArcherCache(model, K=3)
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
    inf = _run(model, _archer("inf"), prompt)
    assert inf.stats["refreshes"] == 0
    assert inf.stats["cached_forwards"] == inf.stats["nfe"] - 1
    age = _run(model, {"sampler": {"name": "saber"}, "cache": {"name": "archer", "refresh": "age", "A": 3}},
               prompt)
    assert age.stats["refreshes"] == (age.stats["nfe"] - 1) // 3


def test_full_recompute_counts_one_forward_per_step():
    model = tiny_backbone("llada", seed=7)
    s, c = LLaDAConfidence(block_length=4, steps=8), FullRecompute(model)
    r = decode(model, s, c, random_prompt(10, 7), 8)
    assert r.stats["nfe"] == r.stats["steps"] == 8
    assert (r.response != MASK_ID).all()


def test_saber_on_trained_toy_backbone_equals_archer_k1(toy_backbone):
    """The same exactness on the toy backbone the workflow trains, for several prompts."""
    from dlmpipe.generate import encode_prompt
    from dlmpipe.tasks.toy import make_examples

    model = toy_backbone.model
    for ex in make_examples("toy_code", 3, 7) + make_examples("toy_arith", 3, 7):
        prompt = torch.tensor(encode_prompt(toy_backbone, ex, chat=False))
        ref = _run(model, SABER_FULL, prompt)
        got = _run(model, _archer(1), prompt)
        assert torch.equal(got.response, ref.response)
        assert (got.stats["steps"], got.stats["nfe"]) == (ref.stats["steps"], ref.stats["nfe"])


def test_saber_rejects_bad_parameters():
    with pytest.raises(ValueError, match="n >= 1"):
        Saber(n=0)
    with pytest.raises(ValueError, match="K must be"):
        ArcherCache(tiny_backbone(), K=0)


@pytest.fixture(scope="module")
def toy_backbone(tmp_path_factory):
    from dlmpipe.backbones import load_backbone
    from tests.toy_checkpoint import toy_checkpoint_dir

    return load_backbone(toy_checkpoint_dir(tmp_path_factory.mktemp("toy")))
