"""dInfer's dual cache with vicinity refresh (inclusionAI/dInfer ``VicinityCacheDiffusionLLM``;
docs/METHODS.md §2.9), block-wise.

The first ``warmup_steps`` forwards of a sample are full forwards (the release's warm-up, without
a cache). The next forward, and the first forward of every later block, is a full forward that
stores every layer's K/V (the dual cache); ``refresh_interval`` (optional) adds one every that
many steps of a block. Every other step recomputes the vicinity window: the sampler's block with
``prefix_look`` rows before it and ``after_look`` rows after it (absolute rows, the prompt
included, clipped to the sequence), over the cached K/V of every other row, and serves the
block's logits. For logit-shifted families (Dream) the row before the block is in the window
too. A window that covers every row is a full forward; so ``prefix_look`` and ``after_look``
covering the sequence, ``refresh_interval`` 1 or ``warmup_steps`` beyond the decode are the
degenerate settings (full recompute token for token); ``prefix_look = after_look = 0`` is dInfer's
plain dual cache (Fast-dLLM's dual cache rows).

The release replaces the window's rows in a copy of the cache for the forward and never writes
them back; this cache writes them in place (``RowKVCache``), which gives the same logits: the
window is recomputed at every step of the block, every row outside it keeps the block's full
forward's K/V, and the next block starts with a full forward.
"""
from __future__ import annotations

from torch import Tensor

from ..backbones.model import Backbone
from .row_cache import RowKVCache


class VicinityCache(RowKVCache):
    def __init__(self, model: Backbone, *, prefix_look: int, after_look: int, warmup_steps: int,
                 refresh_interval: int | None):
        super().__init__(model)
        self.prefix_look, self.after_look = prefix_look, after_look
        self.warmup_steps, self.refresh_interval = warmup_steps, refresh_interval

    def begin(self, x: Tensor, prompt_len: int) -> None:
        super().begin(x, prompt_len)
        self.forwards = 0      # forwards of this sample so far
        self.built = False     # a full forward after the warm-up stored the dual cache
        self.window_rows: list[tuple[int, int]] = []  # each cached step's [start, stop)

    def window(self, lo: int, hi: int) -> tuple[int, int]:
        """Absolute rows ``[start, stop)`` a cached step of response block ``[lo, hi)``
        recomputes."""
        p, n = self.prompt_len, self.positions.numel()
        start = max(0, min(self.model.first_logit_row(p + lo), p + lo - self.prefix_look))
        return start, min(n, p + hi + self.after_look)

    def response_logits(self, x: Tensor, block: tuple[int, int]) -> Tensor:
        self.stats.nfe += 1
        first = self.forwards == 0
        self.forwards += 1
        new_block = self._enter(block)
        lo, hi = self.block
        serve = self.positions[lo:hi]
        start, stop = self.window(lo, hi)
        warmup = self.forwards <= self.warmup_steps
        due = self.refresh_interval is not None and self.block_step % self.refresh_interval == 0
        if warmup or not self.built or new_block or due or (start, stop) == (0, self.positions.numel()):
            self.built = self.built or not warmup
            self.stats.refreshes += 0 if first else 1
            return self._full_forward(x, serve)
        self.stats.cached_forwards += 1
        self.window_rows.append((start, stop))
        return self._forward_rows(x, self.positions[start:stop], serve)
