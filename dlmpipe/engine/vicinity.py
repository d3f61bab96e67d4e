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

``rule: released`` follows the release's iteration counter instead (``generate_uniform.py``
``VicinityCacheIteration.forward``, lines 614-644, under ``BlockRunner.decode``, lines 97-100):
its warm-up counts every forward of the release, those that decode nothing too (the
``BlockRunner``'s unrolled iterations after a block has no masks, ``unroll_k = max(min(masks //
8, 4), 1)`` iterations between checks; the window forward after a refresh that finished the
block), and a cache first built after the warm-up in a block other than the first is built
again at that block's next iteration (line 629: ``past_key_values is None`` short-circuits
``require_update``, which so never records the block). Those release forwards that decode
nothing are counted, not run.
"""
from __future__ import annotations

from torch import Tensor

from ..backbones.model import Backbone
from .row_cache import RowKVCache


class VicinityCache(RowKVCache):
    #: the release's ``BlockRunner`` defaults (``VicinityCacheDiffusionLLM``: ``expected_tpf`` 8,
    #: ``maximum_unroll`` 4), for ``rule: released``
    EXPECTED_TPF, MAXIMUM_UNROLL = 8, 4

    def __init__(self, model: Backbone, *, prefix_look: int, after_look: int, warmup_steps: int,
                 refresh_interval: int | None, rule: str = "paper"):
        super().__init__(model)
        self.prefix_look, self.after_look = prefix_look, after_look
        self.warmup_steps, self.refresh_interval = warmup_steps, refresh_interval
        self.rule = rule

    def begin(self, x: Tensor, prompt_len: int) -> None:
        super().begin(x, prompt_len)
        self.forwards = 0      # forwards of this sample so far
        self.built = False     # a full forward after the warm-up stored the dual cache
        self.window_rows: list[tuple[int, int]] = []  # each cached step's [start, stop)
        # rule released: the release's iteration counter (iter_no), the block its cache manager
        # last recorded (require_update), its block index, the iterations left in the current
        # unrolled group, and a refresh whose window forward is still due in its iteration
        self.iter_no, self.recorded, self.block_id = 0, None, -1
        self.group_left, self.window_due = 0, False

    def window(self, lo: int, hi: int) -> tuple[int, int]:
        """Absolute rows ``[start, stop)`` a cached step of response block ``[lo, hi)``
        recomputes."""
        p, n = self.prompt_len, self.positions.numel()
        # the sampler's block from its first row, prompt rows included (``block_start``: dInfer's
        # decoders under absolute alignment, a block starting inside the prompt, as the release)
        first = p + lo if self.block_start is None else min(self.block_start, p + lo)
        start = max(0, min(self.model.first_logit_row(p + lo), first - self.prefix_look))
        return start, min(n, p + hi + self.after_look)

    def response_logits(self, x: Tensor, block: tuple[int, int]) -> Tensor:
        if self.rule == "released":
            return self._released(x, block)
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

    # ---- rule: released -------------------------------------------------------------------
    def _require_update(self, block: tuple[int, int]) -> bool:
        """``DiffusionKVCacheManager.require_update`` (utils.py lines 397-420, no
        ``cache_update_freq``): whether the block differs from the one it last recorded."""
        changed = self.recorded != block
        self.recorded = block
        return changed

    def _refresh_due(self, block: tuple[int, int]) -> bool:
        """Line 629: ``past_key_values is None or (require_update(...) and block_id > 0)``,
        evaluated left to right (no ``require_update`` while nothing is cached)."""
        return not self.built or (self._require_update(block) and self.block_id > 0)

    def _idle_iterations(self) -> None:
        """The iterations the release runs on the finished previous block (they decode
        nothing): the window forward of a refresh that finished it, then the rest of the
        unrolled group; counted as the release counts them (line 626, 635, 644)."""
        if self.window_due:
            self.iter_no, self.window_due = self.iter_no + 1, False
        for _ in range(self.group_left):
            if self.iter_no < self.warmup_steps:
                self.iter_no += 1
                continue
            refresh = self._refresh_due(self.block)
            self.built = True
            self.iter_no += 2 if refresh else 1
        self.group_left = 0

    def _released(self, x: Tensor, block: tuple[int, int]) -> Tensor:
        self.stats.nfe += 1
        first = self.forwards == 0
        self.forwards += 1
        previous = self.block
        if self.block is not None and (int(block[0]), int(block[1])) != self.block:
            self._idle_iterations()  # of the previous block, before it is left
        new_block = self._enter(block)
        if new_block:
            self.block_id += 1
        lo, hi = self.block
        serve = self.positions[lo:hi]
        start, stop = self.window(lo, hi)
        if self.window_due and not new_block:  # the window forward of the refresh's iteration
            self.iter_no, self.window_due = self.iter_no + 1, False
            return self._window(x, start, stop, serve)
        if self.group_left == 0:  # BlockRunner.decode line 98: masks read back once per group
            p = self.prompt_len
            masks = int((x[p + lo:p + hi] == self.model.cfg.mask_id).sum())
            self.group_left = max(min(masks // self.EXPECTED_TPF, self.MAXIMUM_UNROLL), 1)
        self.group_left -= 1
        if self.iter_no < self.warmup_steps:  # lines 622-627
            self.iter_no += 1
            self.last_decision = "warm-up"
            return self._full_forward(x, serve)
        if self._refresh_due(self.block):  # lines 629-635; its window forward is the next step
            self.built, self.window_due = True, True
            self.iter_no += 1
            self.stats.refreshes += 0 if first else 1
            self.last_decision = "refresh" if previous == self.block else "block start"
            return self._full_forward(x, serve)
        self.iter_no += 1  # lines 637-644
        return self._window(x, start, stop, serve)

    def _window(self, x: Tensor, start: int, stop: int, serve: Tensor) -> Tensor:
        self.last_decision = "cached"
        if (start, stop) == (0, self.positions.numel()):
            return self._full_forward(x, serve)
        self.stats.cached_forwards += 1
        self.window_rows.append((start, stop))
        return self._forward_rows(x, self.positions[start:stop], serve)
