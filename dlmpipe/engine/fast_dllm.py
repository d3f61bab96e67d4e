"""Fast-dLLM prefix and dual caches (docs/METHODS.md §2.5), block-wise.

The cache learns the block boundaries from the ``block`` argument: the first call of a new
block is one full forward that stores every layer's K/V. The later steps of the block recompute

- prefix cache: the current block and every later position (K/V of the prompt and earlier
  blocks reused);
- dual cache: the current block only, overwriting its rows in the cache (K/V of everything
  else, later masked positions included, reused from the block's full forward).

For logit-shifted families (Dream) the row before the block is computed too, since it predicts
the block's first position. ``refresh_interval`` (optional) adds a full forward every that many
steps inside a block; 1 is the degenerate setting (every step full) used by the exactness
tests. How long a block lasts is the sampler's decision (the parallel samplers loop each block
until it has no masks); the cache never ends a block.

``FastDLLMv2Cache`` is Fast-dLLM v2's block + sub-block cache: the dual cache with the release's
refresh condition. Only the current block's rows are served (registry rows ``block_rows``; other
rows hold NaN), so
a rollback sampler is refused at config time.
"""
from __future__ import annotations

from abc import abstractmethod

from torch import Tensor

from ..backbones.model import Backbone
from .row_cache import RowKVCache


class FastDLLMCache(RowKVCache):
    def __init__(self, model: Backbone, *, refresh_interval: int | None):
        super().__init__(model)
        self.refresh_interval = refresh_interval

    def refresh_due(self, x: Tensor) -> bool:
        """A full forward inside the block (``refresh_interval``)."""
        return self.refresh_interval is not None and self.block_step % self.refresh_interval == 0

    @abstractmethod
    def recomputed_rows(self, lo: int, hi: int) -> tuple[int, int]:
        """Absolute rows ``[start, stop)`` a cached step of block ``[lo, hi)`` recomputes."""

    def response_logits(self, x: Tensor, block: tuple[int, int]) -> Tensor:
        self.stats.nfe += 1
        first = self.block is None
        new_block = self._enter(block)
        lo, hi = self.block
        serve = self.positions[lo:hi]  # response positions of the block
        if new_block or self.refresh_due(x):
            self.last_decision = "block start" if new_block else "refresh_interval"
            self.stats.refreshes += 0 if first else 1
            return self._full_forward(x, serve)
        self.last_decision = "cached"
        self.stats.cached_forwards += 1
        start, stop = self.recomputed_rows(lo, hi)
        return self._forward_rows(x, self.positions[start:stop], serve)


class FastDLLMPrefixCache(FastDLLMCache):
    def recomputed_rows(self, lo: int, hi: int) -> tuple[int, int]:
        return self.model.first_logit_row(self.prompt_len + lo), self.positions.numel()


class FastDLLMDualCache(FastDLLMCache):
    def recomputed_rows(self, lo: int, hi: int) -> tuple[int, int]:
        return self.model.first_logit_row(self.prompt_len + lo), self.prompt_len + hi



class FastDLLMv2Cache(FastDLLMDualCache):
    """Fast-dLLM v2's block + sub-block cache (``use_block_cache``; docs/METHODS.md §2.8), on the
    active block of a block-causal backbone, whose finished blocks are the block-level cache
    (dlmpipe/blockwise.py). The release's condition (``v2/generation_functions.py`` line 102):
    a forward of the whole active block on the block's first forward and whenever the
    sub-block's first *position* (``block_start``: a prompt row or a decoded token where the
    sub-block begins with one) is masked; else the sub-block's rows from that position
    (line 108) over the cached K/V of the rest of the active block, written back.
    ``refresh_interval`` adds full forwards as for the other Fast-dLLM caches (null: the
    release's)."""

    def response_logits(self, x: Tensor, block: tuple[int, int]) -> Tensor:
        self.stats.nfe += 1
        first = self.block is None
        self._enter(block)
        lo, hi = self.block
        serve = self.positions[lo:hi]
        start = self.prompt_len + lo if self.block_start is None else self.block_start
        if first:
            self.last_decision = "first forward of the block"
        elif bool(x[start] == self.model.cfg.mask_id):
            self.last_decision = "sub-block's first position masked"
        elif super().refresh_due(x):
            self.last_decision = "refresh_interval"
        else:
            self.last_decision = "cached: sub-block's first position decoded"
            self.stats.cached_forwards += 1
            # rows from `start` only, as line 108: on a shifted family the logit of `start` (a
            # decoded position, never sampled) is then its own row's, as the release's shift of
            # these rows gives it (lines 108-109)
            return self._forward_rows(x, self.positions[start:self.prompt_len + hi], serve)
        self.stats.refreshes += 0 if first else 1
        return self._full_forward(x, serve)
