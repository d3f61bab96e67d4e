"""d2Cache, dual adaptive caching (docs/METHODS.md §2.7).

After the first (full) forward, every forward gives queries only to the rows the previous step
selected; their fresh K/V overwrite their rows of the shared ``KVBuffer`` and they attend over
all N cached rows (the row-cache mechanism of ``row_cache.py``). The selection for a step is made
from the state the previous step left (the release does it at the end of a step):

1. masked tokens, certainty prior: score = cached confidence x Gaussian density of decoded
   neighbours (``sigma``); the ``current_k`` best masked positions in a search window that starts
   at the previous step's block and ends at the block boundary after the ``current_k``-th masked
   position (the previous block's masks biased to win) are selected; ``released`` takes that block
   as its positions still masked when the previous step began (the release narrows its block mask
   in place), so the window starts at the first of them and its end is rounded to a multiple of
   their count; for logit-shifted families (Dream) the row before each selected position is
   recomputed instead (it gives its logits; ``released`` also sets the last prompt row to
   position 0's choice, dropping it when rollout selected it);
2. tokens decoded (changed) since the last forward: their K/V are stale, always recomputed;
3. other tokens, attention rollout: the column sums of the last forward's attention rollout,
   nucleus-selected with mass ``rollout_p`` (at least one row);
4. ``inflate_w > 0``: an unselected gap of at most ``inflate_w`` between selected rows is filled;
5. (dlmpipe) the logit rows of the masked positions the next update may decode (the current
   block's, or the sampler's due positions) are always added, so every sampler reading masked
   rows gets fresh logits (registry rows ``masked_rows``); a no-op where the release's selection
   already covers them (semi-autoregressive blocks with ``current_k`` a multiple of their length).

The cached confidence (``rule``): ``paper`` refreshes it at every recomputed masked position with
the top-1 probability of its fresh logits; ``released`` keeps the first forward's values (the
release's update writes into a copy and never takes effect). A step that selects every row runs a
full forward and counts as a refresh (``rollout_p = 1`` does: exactness).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from ..backbones.model import Backbone
from .row_cache import RowKVCache, indices
from .shadow import ShadowRows, append, with_shadow


def density_weights(gen_len: int, sigma: float, device) -> Tensor:
    """``W [G, 3G]`` with ``density = W @ canvas``: the release's certainty density as an explicit
    convolution. The canvas is the response's decoded mask padded with G ones on the left and G
    copies of the last entry on the right; each position's Gaussian-weighted sum over it is
    divided by the kernel's total mass over lags ``[-3G, 3G)`` (what the release's FFT
    normalisation of a constant signal works out to)."""
    g = gen_len
    lags = torch.arange(-3 * g, 3 * g, device=device, dtype=torch.float64)
    total = torch.exp(-lags ** 2 / (2 * sigma ** 2)).sum()
    centre = torch.arange(g, 2 * g, device=device, dtype=torch.float64)[:, None]
    source = torch.arange(3 * g, device=device, dtype=torch.float64)[None, :]
    return (torch.exp(-(centre - source) ** 2 / (2 * sigma ** 2)) / total).float()


def certainty_density(decoded: Tensor, weights: Tensor) -> Tensor:
    """Density of decoded neighbours ``[G]`` of the bool mask ``decoded [G]`` (``weights`` from
    ``density_weights``): left of the response counts as decoded, right of it as its last entry."""
    d = decoded.float()
    canvas = torch.cat([torch.ones_like(d), d, d[-1:].expand_as(d)])
    return weights @ canvas


def nucleus(scores: Tensor, top_p: float, candidates: Tensor) -> Tensor:
    """The release's nucleus selection among ``candidates`` (bool): normalised scores sorted
    descending, those whose cumulative mass is <= ``top_p``, and at least the first; ``top_p >= 1``
    selects every candidate (the release's float cumulative sum may drop the tail there)."""
    if top_p >= 1:
        return candidates.clone()
    s = torch.where(candidates, scores, 0.0)
    probs = s / (s.sum() + 1e-9)
    ordered, order = torch.sort(probs, descending=True)
    keep = ordered.cumsum(0) <= top_p
    keep[0].fill_(True)  # (not ``keep[0] = True``: on CUDA a copy from the host, a sync)
    keep &= candidates[order]
    return torch.zeros_like(candidates).scatter_(0, order, keep)


def inflate(q: Tensor, width: int) -> Tensor:
    """Fill every unselected gap whose distance from the previous selected row plus the distance
    to the next one is at most ``width`` (the release's inflation)."""
    n = q.shape[0]
    pos = torch.arange(n, device=q.device)
    nxt = torch.where(q, pos, n).flip(0).cummin(0).values.flip(0)
    prv = torch.where(q, pos, -1).cummax(0).values
    return q | (((nxt - pos) + (pos - prv) <= width) & (prv >= 0) & (nxt < n))


class D2Cache(RowKVCache):
    """d2Cache (module docstring); its parameters are the registry's."""

    def __init__(self, model: Backbone, *, rollout_p: float, current_k: int, sigma: float,
                 inflate_w: int, rule: str):
        super().__init__(model)
        if rule not in ("paper", "released"):
            raise ValueError(f"rule must be paper or released, not {rule!r}")
        self.rollout_p, self.current_k, self.sigma = rollout_p, current_k, sigma
        self.inflate_w, self.rule = inflate_w, rule

    def begin(self, x: Tensor, prompt_len: int) -> None:
        super().begin(x, prompt_len)
        m, n = self.model, x.shape[0]
        g, dev = n - prompt_len, m.device
        self.first_row = m.first_logit_row(prompt_len)
        self.weights = density_weights(g, self.sigma, dev)
        self.conf = torch.zeros(g, device=dev)         # cached confidence of each position
        self.importance = torch.zeros(n, device=dev)   # rollout column sums, last forward
        self.rollout = torch.empty((n, n), device=dev)  # M, float32, reset per forward
        self.prev_x = x.clone()
        self.prev_block: tuple[int, int] | None = None
        self.due: Tensor | None = None

    def note_due_positions(self, due: Tensor | None) -> None:
        self.due = due

    # ---- the step -----------------------------------------------------------------------
    def response_logits(self, x: Tensor, block: tuple[int, int]) -> Tensor:
        self.stats.nfe += 1
        n, p, f = x.shape[0], self.prompt_len, self.first_row
        masked = x[p:] == self.model.cfg.mask_id
        shadow = with_shadow(self.model, x, p, self.shadow)  # WINO's rows, next to the forward
        if self.prev_block is None:  # first forward: every row
            logits = self._serve(self._forward(x, None, shadow), self.positions, self.positions[: n - p])
            self.conf = torch.where(masked, self._top1(logits), 0.0)
        else:
            q = self.select(x, masked, block)
            rows, serve = indices(q, q[f:f + n - p])  # the one host read: the rows' count
            full = rows.numel() == n
            self.stats.refreshes += full
            self.stats.cached_forwards += not full
            logits = self._serve(self._forward(x, None if full else rows, shadow), rows, serve)
            if self.rule == "paper":  # the cached confidence of recomputed masked positions
                fresh = torch.where(masked[serve], self._top1(logits[serve]), self.conf[serve])
                self.conf.index_copy_(0, serve, fresh)
        self.prev_x.copy_(x)
        self.prev_block = (int(block[0]), int(block[1]))
        return append(logits, shadow)

    @staticmethod
    def _top1(logits: Tensor) -> Tensor:
        return logits.softmax(dim=-1).amax(dim=-1)

    def select(self, x: Tensor, masked: Tensor, block: tuple[int, int]) -> Tensor:
        """Rows ``[N]`` (bool) this step gives queries to (module docstring, steps 1-5)."""
        n, p, f = x.shape[0], self.prompt_len, self.first_row
        g, dev = n - p, x.device
        lo, hi = self.prev_block
        col = torch.arange(g, device=dev)
        # 1. masked tokens by certainty prior, in the window from the previous block's start
        prev = (col >= lo) & (col < hi)  # the previous step's block
        if self.rule == "released":  # the release's block mask, narrowed to the masks it had
            prev &= self.prev_x[p:] == self.model.cfg.mask_id
        size = prev.sum().clamp_min(1)  # 0 only where the release runs no step (no masks)
        start = prev.long().argmax()
        scores = self.conf * certainty_density(~masked, self.weights)
        meets = masked.long().cumsum(0) >= self.current_k
        first = torch.where(meets.any(), meets.long().argmax(), g - 1)
        end = (first // size + 1) * size - 1
        biased = scores + torch.where(prev, scores.max(), 0.0)
        candidates = torch.where((col >= start) & (col <= end) & masked, biased, -math.inf)
        top = torch.topk(candidates, min(self.current_k, g)).indices
        chosen = torch.zeros_like(masked).scatter_(0, top, True) & masked
        # the rows giving the chosen positions' logits (Dream: the row before each)
        response = torch.cat([chosen[1:], chosen[:1] & False]) if f < p else chosen.clone()
        # 2. tokens changed since the last forward: stale K/V
        response |= x[p:] != self.prev_x[p:]
        q = torch.cat([torch.zeros(p, dtype=torch.bool, device=dev), response])
        # 3. the rest by attention rollout
        q |= nucleus(self.importance, self.rollout_p, ~q)
        if f < p:  # the last prompt row gives position 0's logits
            if self.rule == "released":  # an assignment: may drop a rollout-selected row
                q[p - 1] = chosen[0]
            else:
                q[p - 1] |= chosen[0]
        # 4. inflation
        if self.inflate_w > 0:
            q = inflate(q, self.inflate_w)
        # 5. (dlmpipe) the logit rows of what the next update may decode
        if self.due is not None:
            q.index_fill_(0, f + self.due, True)
        else:
            due = torch.zeros_like(masked)
            due[block[0]:block[1]] = masked[block[0]:block[1]]
            q[f:f + g] |= due
        return q

    def _forward(self, x: Tensor, rows: Tensor | None, shadow: ShadowRows | None = None) -> Tensor:
        """Hidden rows of ``rows`` (ascending absolute indices; None: every row) through every
        layer over the cached K/V, their K/V written back, and the attention rollout of this
        forward accumulated: per layer ``R = normalise(A + I)`` on the rows with queries (the
        head-averaged attention rows ``A``), the identity on the others; ``M <- R M``."""
        m = self.model
        every = rows is None
        where = slice(None) if every else rows
        positions = self.positions if every else rows
        rope = m.rope(positions)
        h = m.embed(x[None] if every else x[rows][None])
        rollout = self.rollout
        rollout.zero_().diagonal().fill_(1.0)
        diag = torch.arange(positions.numel(), device=x.device)
        for i in range(m.cfg.n_layers):
            h = m.to_layer(i, h)  # the layer boundary (placement.py)
            q, k, v = m.qkv(i, h, rope)
            self.kv.write(i, where, k, v)
            keys, values = self.kv.layer(i)
            h = h + m.attn_output(i, m.attend(q, keys, values))
            h = h + m.ffn(i, h)
            if shadow is not None:  # over the K/V the selected rows attended to
                shadow.layer(i, keys, values)
            r = m.to_layer(0, m.attention_probs(q, keys)[0])  # the rollout is the first device's
            r[diag, positions] += 1.0
            r = r / r.sum(dim=-1, keepdim=True)
            if every:
                rollout = r @ rollout
            else:
                rollout.index_copy_(0, rows, r @ rollout)
        self.importance = rollout.sum(dim=0)
        self._count(positions.numel())
        return h
