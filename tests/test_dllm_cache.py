"""dLLM-Cache (docs/METHODS.md §2.4) on the selective-update mechanism: the refresh schedule and
the partial update (V of every response row, K of the selected); exactness at K_p = K_r = 1 is a
row of tests/test_exactness.py."""
from __future__ import annotations

import pytest
import torch

from dlmpipe.methods import build_cache

from .models import FAMILIES, MASK_ID, decode_method, random_prompt, tiny_backbone

SAMPLER = {"name": "llada_confidence", "block_length": 8, "steps": 16}


def _run(model, cache: dict, prompt, sampler=SAMPLER):
    return decode_method(model, sampler, cache, prompt, 16)


@pytest.mark.parametrize("family", FAMILIES)
def test_budget_one_between_prompt_refreshes_equals_archer_k_inf(family):
    model = tiny_backbone(family, seed=2, n_layers=4)
    prompt = random_prompt(20, 2)
    archer = _run(model, {"name": "archer", "K": "inf"}, prompt)
    got = _run(model, {"name": "dllm_cache", "K_p": 100, "K_r": 100, "rho": 1.0}, prompt)
    assert torch.equal(got.response, archer.response)


def test_schedule_counts_prompt_and_response_refreshes():
    model = tiny_backbone("llada", seed=3, n_layers=3)
    r = _run(model, {"name": "dllm_cache", "K_p": 4, "K_r": 2, "rho": 0.25}, random_prompt(10, 3))
    # steps 1..16: prompt refresh at 1, 5, 9, 13; response refresh at every odd step
    assert r.stats["refreshes"] == 3 and r.stats["cached_forwards"] == 12
    assert r.stats["response_refreshes"] == 4  # steps 3, 7, 11, 15 (the prompt cached)
    # layers >= 1: 8 dense steps of 16 rows, 8 partial steps of 4 rows
    assert r.stats["recompute_fraction_per_layer"] == pytest.approx([1.0] + [(8 * 16 + 8 * 4) / 256] * 2)


@pytest.mark.parametrize("family", FAMILIES)
def test_partial_update_replaces_every_value_and_only_selected_keys(family):
    model = tiny_backbone(family, seed=4, n_layers=3)
    P, G = 12, 8
    x = torch.cat([random_prompt(P, 4), torch.full((G,), MASK_ID)])
    cache = build_cache({"name": "dllm_cache", "K_p": 50, "K_r": 50, "rho": 0.25}, model)
    cache.begin(x, P)
    cache.response_logits(x, (0, G))
    keys, values = cache.kv.keys.clone(), cache.kv.values.clone()
    x[P + 2], x[P + 5] = 7, 9
    cache.response_logits(x, (0, G))
    f = model.first_logit_row(P)
    forced = P - f
    assert cache.budgets == [G + forced] + [2 + forced] * 2  # floor(8 * 0.25) = 2
    keys_changed = (cache.kv.keys[1:, 0, 0, f:] != keys[1:, 0, 0, f:]).any(-1).sum(-1)
    values_changed = (cache.kv.values[1:, 0, 0, f:] != values[1:, 0, 0, f:]).any(-1).sum(-1)
    assert keys_changed.tolist() == [2 + forced] * 2
    assert values_changed.tolist() == [G + forced] * 2
    assert torch.equal(cache.kv.keys[:, :, :, :f], keys[:, :, :, :f])  # prompt cached (no K_p step)


def test_prompt_refresh_without_response_refresh_recomputes_the_prompt_rows():
    """(step - 1) % K_p == 0 but not K_r: prompt rows run through every layer, the response gets
    the partial update."""
    model = tiny_backbone("llada", seed=5, n_layers=3)
    P, G = 10, 8
    x = torch.cat([random_prompt(P, 5), torch.full((G,), MASK_ID)])
    cache = build_cache({"name": "dllm_cache", "K_p": 1, "K_r": 50, "rho": 0.25}, model)
    cache.begin(x, P)
    cache.response_logits(x, (0, G))
    keys = cache.kv.keys.clone()
    x[P + 1] = 3
    cache.response_logits(x, (0, G))
    assert cache.stats.refreshes == 1 and cache.response_refreshes == 0
    assert (cache.kv.keys[1:, 0, 0, :P] != keys[1:, 0, 0, :P]).any(-1).all()  # every prompt row fresh
    assert cache.extra_stats()["recompute_fraction_per_layer"][1] == pytest.approx((8 + 2) / 16)


def test_bad_parameters_are_rejected():
    model = tiny_backbone("llada", seed=6)
    for kwargs in ({"K_p": 0}, {"K_r": 1.5}, {"rho": 1.2}):
        with pytest.raises(ValueError):
            build_cache({"name": "dllm_cache", **kwargs}, model)
