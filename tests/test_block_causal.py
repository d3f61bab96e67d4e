"""Block-causal decoding (dlmpipe/blockwise.py): one active block at a time over the exact K/V
of the finished prefix equals recomputing the whole sequence with the block-causal mask, token
for token; finished blocks' rows are computed exactly once, later blocks' never before they are
active; the prompt is prefilled once.
"""
from __future__ import annotations

import pytest
import torch

from dlmpipe.decode import Decoding, decode
from dlmpipe.engine.base import Cache
from dlmpipe.methods import build_method

from .models import BLOCK_FAMILIES, MASK_ID, TINY_BLOCK, random_prompt, tiny_backbone


class FullSequence(Cache):
    """Today's behaviour without the block loop's reuse: every step one forward over the whole
    sequence (all blocks, the block-causal mask), the active block's response rows read off it."""

    shadow_rows = False

    def __init__(self, model, run_x):
        super().__init__(model)
        self.backbone, self.run_x = model, run_x

    def response_logits(self, x, block):
        self.stats.nfe += 1
        start = x.data_ptr() - self.run_x.data_ptr()
        start //= x.element_size()
        logits = self.backbone.shift(self.backbone(self.run_x[None]))[0]
        return logits[start + self.prompt_len:start + x.shape[0]]


def decode_full_sequence(model, sampler_spec, prompt, gen_len, seed):
    sampler, _ = build_method({"sampler": sampler_spec, "cache": {"name": "none"}}, model)
    cache = FullSequence(model, None)
    run = Decoding(model, sampler, cache, prompt, gen_len, torch.Generator().manual_seed(seed))
    cache.run_x, cache.model = run.x, model  # the whole sequence, not the active block's stand-in
    cache.backbone = model
    while not run.done:
        run.step()
    return run.response.clone(), run.stats()


SAMPLERS = [{"name": "llada_confidence"}, {"name": "threshold", "tau": 0.3, "block_length": 4},
            {"name": "saber"}, {"name": "dream", "alg": "entropy", "temperature": 0.2, "top_p": 0.95}]


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
@pytest.mark.parametrize("sampler", SAMPLERS, ids=lambda s: s["name"])
def test_active_block_over_exact_prefix_equals_full_sequence(family, sampler):
    for seed in (0, 1):
        # 2 layers: the prefix's K/V at layer 0 and at a later one (which depends on layer 0's)
        model = tiny_backbone(family, seed=seed, n_layers=2, stop_ids=[])
        for p_len in (5, 8, 13):
            prompt = random_prompt(p_len, seed)
            ref, ref_stats = decode_full_sequence(model, sampler, prompt, 16, seed)
            s, c = build_method({"sampler": sampler, "cache": {"name": "none"}}, model)
            got = decode(model, s, c, prompt, 16, torch.Generator().manual_seed(seed))
            assert torch.equal(got.response, ref), (seed, p_len)
            assert got.stats["steps"] == ref_stats["steps"]


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_finished_blocks_are_computed_once_and_later_blocks_never(family):
    """The rows each update computes are the active block's; every row before the last finished
    block's end has its K/V computed exactly once (prefill or commit), later rows never outside
    their active steps. Full recompute computes every row of the sequence at every step."""
    n = TINY_BLOCK[family]
    model = tiny_backbone(family, seed=0, n_layers=2, stop_ids=[])
    for p_len in (5, 2 * n):
        s, c = build_method({"sampler": {"name": "llada_confidence"}, "cache": {"name": "none"}}, model)
        run = Decoding(model, s, c, random_prompt(p_len, 0), 4 * n)
        while not run.done:
            run.step()
        blocks = run.blocks
        assert set(blocks.rows_per_update) == {n}             # the active block's rows only
        last_end = run.x.shape[0] - n                         # the last block is never committed
        assert (blocks.state.committed[:last_end] == 1).all()
        assert (blocks.state.committed[last_end:] == 0).all()
        assert blocks.state.block_forwards == last_end // n - p_len // n + (1 if p_len >= n else 0)
        full = run.updates * run.x.shape[0]                   # full recompute: every row, every step
        assert run.stats()["rows_computed"] == last_end + run.updates * n < full


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
def test_decode_stops_after_the_block_holding_a_stop_token(family):
    """Later blocks cannot change the text before a stop token: the decode ends with that block
    and leaves the rest masked; the text up to the stop equals a decode without stopping."""
    model = tiny_backbone(family, seed=1, n_layers=2, stop_ids=[])
    prompt = random_prompt(6, 1)
    spec = {"sampler": {"name": "llada_confidence"}, "cache": {"name": "none"}}
    full = decode(model, *build_method(spec, model), prompt, 32).response
    stop = int(full[10])  # a token the decode produces: a stop from there on
    stopping = tiny_backbone(family, seed=1, n_layers=2, stop_ids=[stop])
    got = decode(stopping, *build_method(spec, stopping), prompt, 32).response
    first = int((full == stop).nonzero()[0])
    assert torch.equal(got[:first + 1], full[:first + 1])
    block_end = (6 + first) // TINY_BLOCK[family] * TINY_BLOCK[family] + TINY_BLOCK[family] - 6
    assert (got[block_end:] == MASK_ID).all()


def test_a_prompt_cache_on_blocks_without_prompt_rows_is_exact():
    """Unshifted (SDAR) with the prompt on a block boundary: every active block has no prompt rows,
    so Archer's cached forward (K = inf: never refreshed) recomputes the whole active block at its
    true positions over the exact prefix, as full recompute does."""
    spec = {"name": "llada_confidence"}
    for seed in (0, 1):
        model = tiny_backbone("sdar", seed=seed, n_layers=2, stop_ids=[])
        prompt = random_prompt(8, seed)
        s, c = build_method({"sampler": spec, "cache": {"name": "none"}}, model)
        ref = decode(model, s, c, prompt, 16).response
        s, c = build_method({"sampler": spec, "cache": {"name": "archer", "K": "inf"}}, model)
        got = decode(model, s, c, prompt, 16)
        assert got.stats["cached_forwards"] > 0
        assert torch.equal(got.response, ref)
