"""Every method on the mixture-of-experts backbones (issue 33; docs/METHODS.md, "MoE backbones"):
the degenerate rows of tests/test_exactness.py on an LLaDA-MoE-shaped model (bidirectional) and
an LLaDA2.0-shaped one (block-causal, decoded block by block), token for token against full
recompute; and every cache states what it means on an MoE FFN (``python -m dlmpipe methods``).
One seed and one prompt per row (test_exactness.py runs three seeds and two prompt lengths on the
dense families), to keep the suite fast; the rows of one sampler share its full-recompute
reference (test_exactness.py ``reference``)."""
from __future__ import annotations

import pytest
import torch

from dlmpipe import registry
from dlmpipe.registry.describe import rows_text

from .models import MASK_ID, decode_method, random_prompt, tiny_backbone
from .test_exactness import BLOCK_ROWS, DEGENERATE, _needs_blocks, reference


def _equal_to_full_recompute(family, sampler, cache, stats, keys):
    # 2 layers: every per-layer path of the caches (test_exactness.py TABLE_LAYERS); LLaDA2.0's
    # dense first layer and a routed one
    model = tiny_backbone(family, seed=0, n_layers=2)
    for p_len in ((24,) if family == "llada_moe" else (21,)):  # LLaDA2.0: ends inside a block of 8
        prompt = random_prompt(p_len, 0)
        ref = reference(model, family, 0, sampler, prompt)  # (once per sampler: rows share it)
        got = decode_method(model, sampler, cache, prompt, seed=0)
        assert torch.equal(got.response, ref.response), p_len
        for key in keys:
            assert got.stats[key] == ref.stats[key], (key, p_len)
        assert got.stats["cached_forwards"] == 0
        assert {k: got.stats[k] for k in stats} == stats
    return ref


@pytest.mark.parametrize("name", [n for n in DEGENERATE if not _needs_blocks(n)])
def test_degenerate_setting_equals_full_recompute_on_llada_moe(name):
    sampler, cache, stats = DEGENERATE[name]
    ref = _equal_to_full_recompute("llada_moe", sampler, cache, stats, ("steps", "nfe", "revisions"))
    assert (ref.response != MASK_ID).all()


@pytest.mark.parametrize("name", list(BLOCK_ROWS))
def test_degenerate_setting_equals_full_recompute_on_llada2(name):
    sampler, cache, stats = BLOCK_ROWS[name]
    _equal_to_full_recompute("llada2", sampler, cache, stats,
                             ("steps", "nfe", "revisions", "block_forwards", "rows_computed"))


def test_every_cache_states_what_it_means_on_moe_backbones():
    for c in registry.CACHES.values():  # (an entry without `on_moe` fails at registration)
        assert c.on_moe and f"on an MoE backbone: {c.on_moe}" in rows_text("cache", c)
    for name in ("spa", "dllm_cache", "d2cache"):  # the three the issue asks about, in detail
        moe = registry.CACHES[name].on_moe
        assert "routed" in moe or "routing" in moe
