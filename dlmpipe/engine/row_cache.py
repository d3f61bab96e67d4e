"""Machinery shared by the caches that give queries to only some rows (Fast-dLLM, dKV-Cache).

Every layer's K/V of all N positions lives in a preallocated ``KVBuffer`` (kv.py). A full forward runs every
row and stores every layer's K/V. A partial forward embeds only the chosen rows (ascending
absolute indices), runs them through every layer at their true RoPE positions, writes their
fresh K/V over the cached rows in place and lets them attend over all N cached rows; every other
row keeps the K/V it was last computed with and gets no query.

Such a cache serves only some response rows (registry rows ``block_rows``/``masked_rows``): the logits of the
positions it serves are written into a reused ``[G, V]`` buffer whose other rows hold NaN (the
rows served by the previous call are reset, nothing else is touched). For logit-shifted
families (Dream) the row before each served position must be among the computed rows; callers
add it.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .base import Cache
from .kv import KVBuffer
from .shadow import append, with_shadow


def indices(*masks: Tensor) -> list[Tensor]:
    """Ascending indices of the True entries of each bool mask, reading all their counts back in
    one host sync (``nonzero`` would sync once per mask); a stable sort puts the True entries
    first in order."""
    counts = torch.stack([m.sum() for m in masks]).tolist()
    return [torch.sort((~m).to(torch.uint8), stable=True).indices[:c] for m, c in zip(masks, counts)]


class RowKVCache(Cache):
    shadow_rows = True  # they attend to the K/V buffer as the computed rows do (engine/shadow.py)

    def begin(self, x: Tensor, prompt_len: int) -> None:
        super().begin(x, prompt_len)
        m, n = self.model, x.shape[0]
        self.kv = KVBuffer.for_model(m, n)
        self.positions = torch.arange(n, device=m.device)
        self.logits = torch.full((n - prompt_len, m.cfg.vocab_size), float("nan"), device=m.device)
        self.served: Tensor | None = None   # response positions the last call wrote
        self.last_rows = None               # rows the last call computed (the decode trace)
        self.block: tuple[int, int] | None = None
        self.block_step = 0                 # forwards since the current block started
        self.query_rows = 0                 # rows given queries, over all forwards
        self.total_rows = 0

    def _full_forward(self, x: Tensor, serve: Tensor) -> Tensor:
        """Every row, every layer's K/V stored; logits of the response positions ``serve``."""
        shadow = with_shadow(self.model, x, self.prompt_len, self.shadow)
        h = self.model.hidden_states_storing_kv(x[None], self.kv, shadow)
        self.last_rows = self.positions
        self._count(x.shape[0])
        return append(self._serve(h, self.positions, serve), shadow)

    def _forward_rows(self, x: Tensor, rows: Tensor, serve: Tensor) -> Tensor:
        """Queries for ``rows`` only (ascending absolute indices), over all cached K/V."""
        m = self.model
        shadow = with_shadow(m, x, self.prompt_len, self.shadow)
        self.last_rows = rows
        if rows.numel() == 0:  # nothing changed and nothing due: no row needs a query
            for i in range(m.cfg.n_layers if shadow is not None else 0):
                shadow.layer(i, *self.kv.layer(i))
            return append(self._serve(None, rows, serve), shadow)
        rope = m.rope(self.positions[rows])
        h = m.embed(x[rows][None])
        for i in range(m.cfg.n_layers):
            h = m.to_layer(i, h)  # the layer boundary (placement.py)
            q, k, v = m.qkv(i, h, rope)
            self.kv.write(i, rows, k, v)
            h = h + m.attn_output(i, m.attend(q, *self.kv.layer(i)))
            h = h + m.ffn(i, h)
            if shadow is not None:
                shadow.layer(i, *self.kv.layer(i))
        self._count(rows.numel())
        return append(self._serve(h, rows, serve), shadow)

    def _serve(self, h: Tensor | None, rows: Tensor, serve: Tensor) -> Tensor:
        """Write the logits of response positions ``serve`` (from hidden rows ``h`` of absolute
        ``rows``) into the buffer; the rows served last time go back to NaN."""
        if self.served is not None:  # (index_fill_: a Python value assigned through [] is a host copy)
            self.logits.index_fill_(0, self.served, float("nan"))
        if serve.numel():
            source = serve + self.model.first_logit_row(self.prompt_len)  # the row predicting each
            at = torch.searchsorted(rows, source)
            self.logits[serve] = self.model.logits(h[0, self.model.beside(at, h)])
        self.served = serve
        return self.logits

    def _count(self, rows: int) -> None:
        self.query_rows += rows
        self.total_rows += self.positions.numel()

    def _enter(self, block) -> bool:
        """Track the sampler's block; True when this call starts a new one."""
        block = (int(block[0]), int(block[1]))
        if block != self.block:
            self.block, self.block_step = block, 0
            return True
        self.block_step += 1
        return False

    def extra_stats(self) -> dict:
        fraction = self.query_rows / self.total_rows if self.total_rows else 0.0
        return {"query_row_fraction": round(fraction, 4)}
