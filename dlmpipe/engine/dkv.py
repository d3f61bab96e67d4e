"""dKV-Cache (Ma et al. 2025; docs/METHODS.md §2.6): delayed caching of decoded tokens' K/V.

A token decoded by the update of step i first appears in the sequence of step i+1; that step
still gives its row a query and computes its K/V with the token visible; from step i+2 until
the next refresh its K/V comes from the cache and its row gets no query. Prompt rows count as
decoded before the first step. In response terms: a partial step recomputes the rows that were
masked at the previous forward (those still masked and those decoded since).

- decode (``dkv_decode``): per block, steps 0 and 1 are full forwards, and every step whose
  index in the block is a multiple of ``refresh_interval`` (paper: 8); the others recompute the
  delayed set above.
- greedy (``dkv_greedy``): full forwards at block steps that are multiples of
  ``refresh_interval`` (paper: 2); the others recompute only the tokens decoded since the last
  forward, the tokens due at the next update, and the masked positions within ``window`` (paper:
  4) of either; every other row, masked ones included, reuses its cached K/V. The tokens due
  come from a fixed-order sampler (``random_order``) through ``note_due_positions``; with a
  sampler whose choice depends on the logits, every masked position of the block is due.

For logit-shifted families (Dream) the row before each served position is computed too. Served
rows: the masked positions of the current block (greedy with a fixed-order sampler: the due
ones); the rest hold NaN. Decoded rows get no logits, so a rollback sampler is refused at config
time. ``refresh_interval: 1`` makes every step full (equal to full recompute).
"""
from __future__ import annotations

from abc import abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor

from ..backbones.model import Backbone
from .row_cache import RowKVCache, indices


class DKVCache(RowKVCache):
    def __init__(self, model: Backbone, *, refresh_interval: int):
        super().__init__(model)
        self.refresh_interval = refresh_interval

    def begin(self, x: Tensor, prompt_len: int) -> None:
        super().begin(x, prompt_len)
        self.previous_masked: Tensor | None = None  # response rows masked at the last forward
        self.due: Tensor | None = None

    def note_due_positions(self, due: Tensor | None) -> None:
        self.due = due

    @abstractmethod
    def is_full_step(self) -> bool:
        """Whether this forward (the block's ``block_step``-th) is a full one."""

    @abstractmethod
    def recomputed(self, masked: Tensor, served: Tensor) -> Tensor:
        """Response rows ``[G]`` (bool) a partial step gives queries to; ``served`` (bool
        ``[G]``) are the positions it returns logits for."""

    def served_mask(self, masked: Tensor) -> Tensor:
        """Response positions (bool ``[G]``) whose logits this step returns: the masked ones of
        the block."""
        lo, hi = self.block
        served = torch.zeros_like(masked)
        served[lo:hi] = masked[lo:hi]
        return served

    def response_logits(self, x: Tensor, block: tuple[int, int]) -> Tensor:
        P = self.prompt_len
        masked = x[P:] == self.model.cfg.mask_id
        self.stats.nfe += 1
        first = self.previous_masked is None
        self._enter(block)
        served = self.served_mask(masked)
        if first or self.is_full_step():
            self.stats.refreshes += 0 if first else 1
            serve, = indices(served)
            out = self._full_forward(x, serve)
        else:
            self.stats.cached_forwards += 1
            rows = torch.zeros_like(self.positions, dtype=torch.bool)
            rows[P:] = self.recomputed(masked, served)
            f = self.model.first_logit_row(P)
            rows[f:f + served.shape[0]] |= served  # Dream: the row before each served position
            serve, rows = indices(served, rows)    # the partial step's one host read: the shapes
            out = self._forward_rows(x, rows, serve)
        self.previous_masked = masked
        return out


class DKVDecodeCache(DKVCache):
    def is_full_step(self) -> bool:
        return self.block_step < 2 or self.block_step % self.refresh_interval == 0

    def recomputed(self, masked: Tensor, served: Tensor) -> Tensor:
        return self.previous_masked | masked


class DKVGreedyCache(DKVCache):
    def __init__(self, model: Backbone, *, refresh_interval: int, window: int):
        super().__init__(model, refresh_interval=refresh_interval)
        self.window = window

    def is_full_step(self) -> bool:
        return self.block_step % self.refresh_interval == 0

    def served_mask(self, masked: Tensor) -> Tensor:
        if self.due is None:
            return super().served_mask(masked)
        lo, hi = self.block
        due = torch.zeros_like(masked).index_fill(0, self.due.to(masked.device), True)
        due[:lo] = False
        due[hi:] = False
        return due & masked

    def recomputed(self, masked: Tensor, served: Tensor) -> Tensor:
        anchors = (self.previous_masked & ~masked) | served  # decoded since the last forward, due next
        if self.window == 0:
            return anchors
        near = F.max_pool1d(anchors[None, None].float(), 2 * self.window + 1, stride=1,
                            padding=self.window)[0, 0] > 0
        return anchors | (near & masked)
