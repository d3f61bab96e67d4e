"""Archer: prompt-K/V reuse with state-anchored refresh (docs/METHODS.md §2.2, Algorithm 1).

A full forward builds every layer's prompt K/V under the current response g and sets the anchor
g_r = g. A cached forward embeds only the response rows and runs them through every layer,
attending to [cached prompt K/V || fresh response K/V] at true RoPE positions; no response state
is kept across steps. Before each forward the controller decides: refresh when the Hamming
distance d_H(g, g_r) (MASK is a symbol) reaches K, or, for the age controller, every A updates.

For logit-shifted families (Dream) the last prompt row is computed with the response rows, since
it produces the first response position's logits.

The cached forward has fixed shapes within a sample and reads nothing back to the host, so it
can run as a captured CUDA graph or compiled (``use_compile``, dlmpipe/graphs.py). Its buffers
(K/V, RoPE tables) are kept across samples of the same shape, so a captured graph is reused.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..backbones.model import Backbone
from .base import Cache
from ..graphs import StepRunner
from .kv import KVBuffer
from .shadow import ShadowRows, append, shadow_inputs, with_shadow


def hamming_distance(a: Tensor, b: Tensor) -> Tensor:
    """d_H(a, b) as a 0-d tensor on their device (reading it is the caller's choice)."""
    return (a != b).sum()


def parse_radius(K: int | str) -> float:
    """The refresh radius as a number: an integer, or "inf" (never refresh by distance)."""
    return math.inf if K == "inf" else float(K)


class ArcherCache(Cache):
    shadow_rows = True  # they attend to the same K/V as the response rows (engine/shadow.py)

    def __init__(self, model: Backbone, *, K: int | str, refresh: str, A: int):
        super().__init__(model)
        self.K, self.refresh, self.A = parse_radius(K), refresh, A
        self.refresh_distances: list[int | Tensor] = []
        self.shape: tuple[int, int] | None = None
        self.cached_step = StepRunner(self._cached_rows)
        self.cached_shadow_step = StepRunner(self._cached_rows_with_shadow)

    def use_compile(self, mode: str) -> None:
        super().use_compile(mode)
        self.cached_step = StepRunner(self._cached_rows, mode)
        self.cached_shadow_step = StepRunner(self._cached_rows_with_shadow, mode)

    def begin(self, x: Tensor, prompt_len: int) -> None:
        super().begin(x, prompt_len)
        m, n = self.model, x.shape[0]
        # rows computed on the cached path: the response, plus the last prompt row when shifted
        self.first_row = m.first_logit_row(prompt_len)
        rope = m.rope(torch.arange(self.first_row, n, device=m.device))
        if self.shape != (self.first_row, n):  # else the last sample's buffers (and graph) serve
            self.kv = KVBuffer.for_model(m, n)
            self.rope_rows = rope
            self.shape = (self.first_row, n)
        else:  # in place (a captured graph reads these tensors): a block-causal backbone's active
            for table, new in zip(self.rope_rows, rope):  # block sits elsewhere each time
                table.copy_(new)
        self.anchor: Tensor | None = None
        self.updates_since_refresh = 0
        self.refresh_distances = []
        self.forced: bool | None = None  # force_next: the next forward's decision, once

    def _refresh_distance(self, response: Tensor) -> int | Tensor | None:
        """The distance to the anchor when this forward must refresh, else None. The distance
        controller reads d_H back to decide (its one host read per step; none at K = inf, which
        no distance reaches); the age controller decides by count and keeps the distance it
        records on the device until the sample's statistics are read."""
        if self.refresh == "age":
            due = self.updates_since_refresh >= self.A
            return hamming_distance(response, self.anchor) if due else None
        if self.K == math.inf:
            return None
        distance = int(hamming_distance(response, self.anchor))
        return distance if distance >= self.K else None

    def response_logits(self, x: Tensor, block: tuple[int, int]) -> Tensor:
        P = self.prompt_len
        response = x[P:]
        self.stats.nfe += 1
        if self.anchor is None:
            return self._full_forward(x)
        self.updates_since_refresh += 1
        forced, self.forced = self.forced, None
        if forced is None:
            distance = self._refresh_distance(response)
        else:  # force_next: the intervention decides, the rule is not consulted
            distance = hamming_distance(response, self.anchor) if forced else None
        if distance is not None:
            self.stats.refreshes += 1
            self.refresh_distances.append(distance)
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
        shadow = with_shadow(m, x, self.prompt_len, self.shadow)
        h = m.hidden_states_storing_kv(x[None], self.kv, shadow)
        self.anchor = x[self.prompt_len:].clone()
        self.updates_since_refresh = 0
        return append(m.response_logits_from_rows(h[:, self.first_row:])[0], shadow)

    def _cached_forward(self, x: Tensor) -> Tensor:
        state = (self.shape, self.kv.keys[0].data_ptr(), self.rope_rows[0].data_ptr())
        if self.shadow is not None:  # the shadow rows' inputs are tensors: the step stays capturable
            lo, hi = self.shadow
            shadow = shadow_inputs(self.model, x, self.prompt_len + lo, self.prompt_len + hi)
            return self.cached_shadow_step(x[self.first_row:], *shadow, state_key=state)
        return self.cached_step(x[self.first_row:], state_key=state)

    def _cached_rows_with_shadow(self, rows: Tensor, *shadow: Tensor) -> Tensor:
        """``_cached_rows`` with WINO's shadow rows (``shadow_inputs``) attending next to them;
        their verification logits follow the response logits."""
        rows_of_shadow = ShadowRows(self.model, *shadow)
        return append(self._cached_rows(rows, rows_of_shadow), rows_of_shadow)

    def _cached_rows(self, rows: Tensor, shadow: ShadowRows | None = None) -> Tensor:
        """Run only rows [first_row, N) (token ids ``rows``) through every layer over cached
        prompt K/V; fresh K/V of these rows is written into the buffer. ``shadow`` rows attend
        to the same K/V (cached prompt, fresh response) and their own."""
        m, f = self.model, self.first_row
        h = m.embed(rows[None])
        for i in range(m.cfg.n_layers):
            h = m.to_layer(i, h)  # the layer boundary (placement.py)
            q, k, v = m.qkv(i, h, self.rope_rows)
            self.kv.write(i, slice(f, None), k, v)
            h = h + m.attn_output(i, m.attend(q, *self.kv.layer(i)))
            h = h + m.ffn(i, h)
            if shadow is not None:
                shadow.layer(i, *self.kv.layer(i))
        return m.response_logits_from_rows(h)[0]

    def extra_stats(self) -> dict:
        return {"refresh_distances": [int(d) for d in self.refresh_distances]}
