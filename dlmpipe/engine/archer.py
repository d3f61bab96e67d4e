"""Archer: prompt-K/V reuse with state-anchored refresh (docs/METHODS.md §2.2, Algorithm 1).

A full forward builds every layer's prompt K/V under the current response g and sets the anchor
g_r = g. A cached forward embeds only the response rows and runs them through every layer,
attending to [cached prompt K/V || fresh response K/V] at true RoPE positions; no response state
is kept across steps. Before each forward the controller decides: refresh when the Hamming
distance d_H(g, g_r) (MASK is a symbol) reaches K, or, for the age controller, every A updates.

For logit-shifted families (Dream) the last prompt row is computed with the response rows, since
it produces the first response position's logits.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..backbones.model import Backbone
from .base import Cache
from .kv import KVBuffer


def hamming_distance(a: Tensor, b: Tensor) -> int:
    return int((a != b).sum())


def parse_radius(K: int | str) -> float:
    """The refresh radius as a number: an integer, or "inf" (never refresh by distance)."""
    return math.inf if K == "inf" else float(K)


class ArcherCache(Cache):
    def __init__(self, model: Backbone, *, K: int | str, refresh: str, A: int):
        super().__init__(model)
        self.K, self.refresh, self.A = parse_radius(K), refresh, A
        self.refresh_distances: list[int] = []

    def begin(self, x: Tensor, prompt_len: int) -> None:
        super().begin(x, prompt_len)
        n = x.shape[0]
        # rows computed on the cached path: the response, plus the last prompt row when shifted
        self.first_row = self.model.first_logit_row(prompt_len)
        self.kv = KVBuffer.for_model(self.model, n)
        self.positions = torch.arange(n, device=self.model.device)
        self.anchor: Tensor | None = None
        self.updates_since_refresh = 0
        self.refresh_distances = []
        self.forced: bool | None = None  # force_next: the next forward's decision, once

    def _needs_refresh(self, response: Tensor) -> bool:
        if self.refresh == "age":
            return self.updates_since_refresh >= self.A
        return hamming_distance(response, self.anchor) >= self.K

    def response_logits(self, x: Tensor, block: tuple[int, int]) -> Tensor:
        P = self.prompt_len
        response = x[P:]
        self.stats.nfe += 1
        if self.anchor is None:
            return self._full_forward(x)
        self.updates_since_refresh += 1
        forced, self.forced = self.forced, None
        if self._needs_refresh(response) if forced is None else forced:
            self.stats.refreshes += 1
            self.refresh_distances.append(hamming_distance(response, self.anchor))
            return self._full_forward(x)
        self.stats.cached_forwards += 1
        return self._cached_forward(x)

    def force_next(self, refresh: bool) -> None:
        """Next forward: a refresh that re-anchors (``refresh``), or the cached path over the
        current prompt snapshot; counted like the rule's own decisions."""
        self.forced = bool(refresh)

    def _full_forward(self, x: Tensor) -> Tensor:
        """Exact logits and every layer's K/V under the current response; re-anchor."""
        m = self.model
        h = m.hidden_states_storing_kv(x[None], self.kv)
        self.anchor = x[self.prompt_len:].clone()
        self.updates_since_refresh = 0
        return m.response_logits_from_rows(h[:, self.first_row:])[0]

    def _cached_forward(self, x: Tensor) -> Tensor:
        """Run only rows [first_row, N) through every layer over cached prompt K/V."""
        m, f = self.model, self.first_row
        positions = self.positions[f:]
        h = m.embed(x[None, f:])
        for i in range(m.cfg.n_layers):
            q, k, v = m.qkv(i, h, positions)
            self.kv.write(i, slice(f, None), k, v)
            h = h + m.attn_output(i, m.attend(q, *self.kv.layer(i)))
            h = h + m.ffn(i, h)
        return m.response_logits_from_rows(h)[0]

    def extra_stats(self) -> dict:
        return {"refresh_distances": list(self.refresh_distances)}
