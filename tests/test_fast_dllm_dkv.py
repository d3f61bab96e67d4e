"""Fast-dLLM prefix/dual caches and dKV-Cache decode/greedy (docs/METHODS.md §2.5, §2.6): exact
cached paths on an unchanged state, the rows each step recomputes, block handling, and the
config-time refusal of rollback samplers (their degenerate settings: tests/test_exactness.py)."""
from __future__ import annotations

import pytest
import torch

from dlmpipe.campaign import Campaign, ConfigError
from dlmpipe.methods import build_cache

from .models import FAMILIES, MASK_ID, decode_method, random_prompt, tiny_backbone

G = 16


def _run(model, sampler, cache, prompt, seed=0):
    return decode_method(model, sampler, cache, prompt, G, seed=seed)


# ---- the cached paths are exact when nothing changed since the full forward -------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", ["fast_dllm_prefix", "fast_dllm_dual", "dkv_decode", "dkv_greedy"])
def test_cached_forward_on_an_unchanged_state_equals_the_full_forward(family, name):
    model = tiny_backbone(family, seed=4)
    P = 20
    for block in ((0, 8), (8, 16)):  # Dream: the row before the block is P-1, then P+7
        x = torch.cat([random_prompt(P, 4), torch.full((G,), MASK_ID)])
        x[P:P + block[0]] = torch.arange(3, 3 + block[0])  # earlier blocks decoded
        x[P + block[0] + 2] = 5                            # one visible token in the block
        exact = model.shift(model(x[None]))[0, P:]
        cache = build_cache({"name": name, "refresh_interval": 100}, model)
        cache.begin(x, P)
        for _ in range(3):  # dKV: steps 0 and 1 are full; Fast-dLLM: only the block's first
            logits = cache.response_logits(x, block)
        assert cache.stats.cached_forwards >= 1
        served = ~torch.isnan(logits[:, 0])
        expected = torch.zeros(G, dtype=torch.bool)
        expected[block[0]:block[1]] = True
        if name.startswith("dkv"):  # masked rows of the block only
            expected[block[0] + 2] = False
        assert torch.equal(served, expected)
        torch.testing.assert_close(logits[served], exact[served], rtol=1e-5, atol=1e-5)


# ---- which rows a cached step recomputes -------------------------------------------------------
def _recorded_rows(cache):
    rows = []
    inner = cache._forward_rows

    def record(x, r, serve):
        rows.append(r.tolist())
        return inner(x, r, serve)

    cache._forward_rows = record
    return rows


@pytest.mark.parametrize("family", FAMILIES)
def test_fast_dllm_recomputes_the_block_and_later_rows_or_the_block_only(family):
    model = tiny_backbone(family, seed=5)
    P, shift = 6, 1 if family == "dream" else 0
    for name, stop in (("fast_dllm_prefix", P + G), ("fast_dllm_dual", P + 8)):
        x = torch.cat([random_prompt(P, 5), torch.full((G,), MASK_ID)])
        cache = build_cache({"name": name}, model)
        rows = _recorded_rows(cache)
        cache.begin(x, P)
        cache.response_logits(x, (0, 8))    # block start: full
        x[P + 1] = 4
        cache.response_logits(x, (0, 8))
        x[P:P + 8] = 4
        cache.response_logits(x, (8, 16))   # next block: full again
        cache.response_logits(x, (8, 16))
        assert rows == [list(range(P - shift, stop)), list(range(P + 8 - shift, P + G))]
        assert cache.stats.as_dict() == {"nfe": 4, "cached_forwards": 2, "refreshes": 1}


def test_fast_dllm_with_blocks_has_one_full_forward_per_block():
    model = tiny_backbone("llada", seed=6)
    prompt = random_prompt(10, 6)
    for cache in ("fast_dllm_prefix", "fast_dllm_dual"):
        r = _run(model, {"name": "llada_confidence", "block_length": 4}, {"name": cache}, prompt)
        assert (r.response != MASK_ID).all()
        assert (r.stats["nfe"], r.stats["refreshes"], r.stats["cached_forwards"]) == (16, 3, 12)
        r = _run(model, {"name": "llada_confidence", "block_length": 8},
                 {"name": cache, "refresh_interval": 3}, prompt)
        assert r.stats["refreshes"] == 1 + 2 * 2  # block 2's start, steps 3 and 6 of each block
    prefix = _run(model, {"name": "threshold", "block_length": 4}, {"name": "fast_dllm_prefix"}, prompt)
    dual = _run(model, {"name": "threshold", "block_length": 4}, {"name": "fast_dllm_dual"}, prompt)
    assert dual.stats["query_row_fraction"] < prefix.stats["query_row_fraction"] < 1


@pytest.mark.parametrize("family", FAMILIES)
def test_dkv_decode_delays_caching_by_one_step(family):
    """A token decoded by update i is recomputed at step i+1 and cached from step i+2."""
    model = tiny_backbone(family, seed=7)
    P, shift = 6, 1 if family == "dream" else 0
    x = torch.cat([random_prompt(P, 7), torch.full((G,), MASK_ID)])
    cache = build_cache({"name": "dkv_decode", "refresh_interval": 4}, model)
    rows = _recorded_rows(cache)
    cache.begin(x, P)
    decoded_by_step = [[3, 9], [0, 15], [4, 5], [10], [1]]
    for positions in decoded_by_step:
        cache.response_logits(x, (0, G))
        x[P + torch.tensor(positions)] = 7
    # step 0 and 1 full; step 2 recomputes rows masked at step 1 (all but 3, 9); step 3 rows
    # masked at step 2; step 4 is full (refresh interval 4)
    masked_at = lambda k: [p for p in range(G) if p not in sum(decoded_by_step[:k], [])]  # noqa: E731
    expected = []
    for k in (1, 2):
        needed = set(masked_at(k)) | {p - shift for p in masked_at(k + 1)}  # Dream: row before
        expected.append([P + p for p in sorted(needed)])
    assert rows == expected
    assert cache.stats.as_dict() == {"nfe": 5, "cached_forwards": 2, "refreshes": 2}


def test_dkv_greedy_recomputes_decoded_due_and_masked_neighbours_only():
    model = tiny_backbone("llada", seed=8)
    P = 4
    x = torch.cat([random_prompt(P, 8), torch.full((G,), MASK_ID)])
    cache = build_cache({"name": "dkv_greedy", "refresh_interval": 4, "window": 1}, model)
    rows = _recorded_rows(cache)
    cache.begin(x, P)
    cache.note_due_positions(torch.tensor([5]))
    cache.response_logits(x, (0, G))              # step 0: full
    x[P + 5] = 9
    x[P + 7] = 9                                  # visible, not decoded since: never recomputed
    cache.note_due_positions(torch.tensor([12, 2]))
    logits = cache.response_logits(x, (0, G))
    # decoded since the last forward: 5 (and 7); due: 2, 12; masked within 1 of them: 1, 3, 4,
    # 6, 11, 13 (7 is visible but was masked at the last forward: decoded since, so an anchor)
    assert rows == [[P + p for p in (1, 2, 3, 4, 5, 6, 7, 8, 11, 12, 13)]]
    served = (~torch.isnan(logits[:, 0])).nonzero()[:, 0].tolist()
    assert served == [2, 12]


def test_dkv_greedy_without_due_positions_serves_every_masked_row_of_the_block():
    model = tiny_backbone("dream", seed=9)
    prompt = random_prompt(8, 9)
    r = _run(model, {"name": "llada_confidence", "block_length": 8},
             {"name": "dkv_greedy", "refresh_interval": 3, "window": 1}, prompt)
    assert (r.response != MASK_ID).all() and r.stats["cached_forwards"] > 0
    r = _run(model, {"name": "random_order", "block_length": 8},
             {"name": "dkv_greedy", "refresh_interval": 3, "window": 1}, prompt)
    assert (r.response != MASK_ID).all() and r.stats["query_row_fraction"] < 1


# ---- pairing: refused before any job runs (every pair: tests/test_exactness.py) ----------------
def test_config_rejects_dkv_with_saber_naming_the_key(tiny_config):
    tiny_config["methods"]["dkv-saber"] = {"sampler": {"name": "saber"},
                                           "cache": {"name": "dkv_decode"}}
    with pytest.raises(ConfigError) as err:
        Campaign(tiny_config)
    assert err.value.problems == [
        "methods.dkv-saber: cache 'dkv_decode' gives fresh logits only for the masked rows of the "
        "current block; sampler 'saber' reads every response row (visible ones too) at every step; "
        "caches that serve it: none, archer, spa, dllm_cache"]


def test_the_default_campaign_keeps_every_cache_and_the_baselines_with_valid_blocks():
    from dlmpipe import registry
    from dlmpipe.campaign import load_campaign

    from .workflow import REPO

    c = load_campaign([REPO / "config.yaml"])  # validation checks blocks tile gen_length
    # every cache family it had stays (issue: dropping methods keeps every family; Fast-dLLM
    # v2's block + sub-block cache on the block-diffusion toy); a cache added later need not join
    # (that would change the stored toy expectations; tests/test_method_recipe.py covers it)
    from .test_config import DEFAULT_CACHES

    assert {m["cache"]["name"] for m in c.methods.values()} >= DEFAULT_CACHES
    assert DEFAULT_CACHES <= set(registry.CACHES)
    for name in ("fast-dllm-dual", "fast-dllm-parallel", "dkv-decode", "dkv-greedy", "llada-confidence"):
        assert name in c.methods
    assert c.methods["fast-dllm-parallel"]["sampler"]["tau"] == 0.9
    assert c.methods["fast-dllm-parallel"]["cache"]["name"] == "fast_dllm_prefix"
    assert c.methods["fast-dllm-dual"]["cache"]["name"] == "fast_dllm_dual"
    assert c.methods["dkv-greedy"]["sampler"]["name"] == "random_order"
