"""Selective hidden-state updates: the one mechanism under SPA-Cache and dLLM-Cache.

Per layer the cache keeps, in buffers allocated once per sample and updated in place:
K/V of all N rows, the residual delta (attention + FFN output) of every response row, and the
identifier of every response row at the previous step. A step runs the response rows (and, on a
prompt refresh, the prompt rows) through every layer; at each layer l >= 1 it identifies the
``k_l`` response rows whose identifier drifted most since the previous step (lowest cosine
similarity) and recomputes only those: their queries attend over the cached K/V (their own
fresh K/V scattered in first), then FFN, and their new delta is scattered into the cache. Every
other response row reuses its cached delta: ``output = current input + cached delta``. Layer 0 is
always dense over the response; prompt rows are never selected, they are recomputed (all of them,
at every layer) only on a prompt refresh. The identifier cache is updated for every row every
step (step-to-step similarity, as the reference code does).

Policies (subclasses) say when the prompt and the whole response are refreshed
(``schedule``), how many rows each layer recomputes (``layer_budget``), which identifier
(``singular`` rank-r proxy, ``value``, ``query``, ``key``, ``attn_input``, ``attn_output``) and
which K/V rows a sparse step rewrites (``kv_update``: ``sparse`` the selected rows, ``dense``
every response row, ``values`` V of every response row and K of the selected ones).

Response rows are the rows ``[first_logit_row, N)``: for logit-shifted families (Dream) the
last prompt row produces the first response position's logits, so it belongs to the response
part and is recomputed at every layer (forced), on top of the ``k_l`` selected rows.
"""
from __future__ import annotations

import math
from abc import abstractmethod

import torch
import torch.nn.functional as F
from torch import Tensor

from ..backbones.model import Backbone
from .base import Cache
from .kv import KVBuffer
from .shadow import append, with_shadow


def rows_for_budget(rho: float, gen_len: int) -> int:
    """``k_l = int(rho(l) * G)`` (a hair of slack so 0.29 * 100 is 29, not 28)."""
    return min(gen_len, max(0, math.floor(rho * gen_len + 1e-9)))


class SelectiveCache(Cache):
    """Selective-update cache; subclasses set the policy (see the module docstring)."""

    shadow_rows = True  # each layer they attend to the K/V the computed rows attended to

    def __init__(self, model: Backbone, identifier: str, kv_update: str, rank: int | None = None,
                 proxies=None):
        super().__init__(model)
        self.identifier, self.kv_update = identifier, kv_update
        self.proxy_weights: list[Tensor] = []
        if identifier == "singular":
            from .proxies import check_against_model, resolve_proxies

            prox = resolve_proxies(proxies, model)
            check_against_model(prox, model)
            self.rank = prox.stored_rank if rank is None else rank
            prox.check_rank(self.rank)
            w = model.embed.weight
            self.proxy_weights = [model.to_layer(i, prox.projection(i, self.rank).to(
                dtype=w.dtype, device=w.device)) for i in range(model.cfg.n_layers)]
        self.rows_recomputed: list[int] = []
        self.response_refreshes = 0

    # ---- policy -------------------------------------------------------------------------
    @abstractmethod
    def schedule(self, step: int) -> tuple[bool, bool]:
        """(refresh the prompt, recompute the whole response) at forward ``step`` (0-based)."""

    @abstractmethod
    def layer_budget(self, layer: int, gen_len: int) -> int:
        """Response rows (of G) layer ``layer >= 1`` recomputes on a selective step."""

    # ---- per sample ---------------------------------------------------------------------
    def begin(self, x: Tensor, prompt_len: int) -> None:
        super().begin(x, prompt_len)
        m, cfg = self.model, self.model.cfg
        n = x.shape[0]
        self.first_row = m.first_logit_row(prompt_len)
        self.forced = prompt_len - self.first_row  # 1: Dream's last prompt row, always computed
        self.n_rows = n - self.first_row           # response rows R (G, or G + 1 when shifted)
        gen_len = n - prompt_len
        # rows each layer recomputes on a selective step (layer 0: all of them)
        self.budgets = [self.n_rows] + [min(self.n_rows, self.layer_budget(i, gen_len) + self.forced)
                                        for i in range(1, cfg.n_layers)]
        dtype, device = m.embed.weight.dtype, m.device
        self.kv = KVBuffer.for_model(m, n)
        if m.placement is None:
            self.delta = torch.empty((cfg.n_layers, 1, self.n_rows, cfg.d_model), dtype=dtype, device=device)
            self.ident = torch.empty((cfg.n_layers, self.n_rows, self._ident_width()), dtype=dtype,
                                     device=device)
        else:  # each layer's on its layer's device (dlmpipe/placement.py)
            self.delta = [m.layer_empty(i, (1, self.n_rows, cfg.d_model)) for i in range(cfg.n_layers)]
            self.ident = [m.layer_empty(i, (self.n_rows, self._ident_width()))
                          for i in range(cfg.n_layers)]
        self.positions = torch.arange(n, device=device)
        self.step = 0
        self.rows_recomputed = [0] * cfg.n_layers
        self.response_refreshes = 0

    def _ident_width(self) -> int:
        cfg = self.model.cfg
        return {"singular": getattr(self, "rank", 0), "value": cfg.n_kv_heads * cfg.head_dim,
                "key": cfg.n_kv_heads * cfg.head_dim, "query": cfg.n_heads * cfg.head_dim,
                "attn_input": cfg.d_model, "attn_output": cfg.d_model}[self.identifier]

    # ---- the step -----------------------------------------------------------------------
    def response_logits(self, x: Tensor, block: tuple[int, int]) -> Tensor:
        step = self.step
        self.step += 1
        self.stats.nfe += 1
        prompt, dense = self.schedule(step)
        if step == 0:
            prompt = dense = True  # step 0: full refresh
        if prompt and step > 0:
            self.stats.refreshes += 1
        if not prompt:
            self.stats.cached_forwards += 1
            self.response_refreshes += dense
        m, f = self.model, self.first_row
        base = 0 if prompt else f  # absolute position of the first tracked row
        h = m.embed(x[None, base:])
        self.rope_tracked = m.rope(self.positions[base:])  # the tracked rows' tables, once per step
        shadow = with_shadow(m, x, self.prompt_len, self.shadow)
        for layer in range(m.cfg.n_layers):
            h = self._layer(layer, m.to_layer(layer, h), base, dense or layer == 0)
            if shadow is not None:
                shadow.layer(layer, *self.kv.layer(layer))
        return append(m.response_logits_from_rows(h[:, f - base:])[0], shadow)

    def _layer(self, layer: int, h: Tensor, base: int, dense: bool) -> Tensor:
        """One layer over the tracked rows ``h [1, N - base, d]`` (prompt part first when
        ``base == 0``); returns the layer's output rows."""
        m, f = self.model, self.first_row
        n_prompt = f - base                      # prompt rows recomputed this step (0 or f)
        normed = m.attn_input(layer, h)
        nr = normed[:, n_prompt:]                # response part [1, R, d]
        k_rows = self.budgets[layer]
        selected = value_rows = None
        if dense or k_rows >= self.n_rows:
            pass
        elif self.identifier == "attn_output":
            return self._attn_output_layer(layer, h, normed, base, k_rows)
        else:
            ident = self._identify(layer, nr)
            selected = self._select(layer, ident, k_rows)
            if self.identifier == "value" and n_prompt == 0:
                value_rows = ident[None]  # V of every response row: reused by the K/V update

        if selected is None:  # every tracked row: the full layer's math, row for row
            q, k, v = m.project_qkv(layer, normed, self.rope_tracked)
            self.kv.write(layer, slice(base, None), k, v)
            a = m.attn_output(layer, m.attend(q, *self.kv.layer(layer)))
            mid = h + a
            ffo = m.ffn(layer, mid)
            torch.add(a[:, n_prompt:], ffo[:, n_prompt:], out=self.delta[layer])
            if layer > 0:
                self.ident[layer].copy_(self._identify(layer, nr, v=v[:, :, n_prompt:])
                                        if self.identifier != "attn_output" else a[0, n_prompt:])
            self.rows_recomputed[layer] += self.n_rows
            return mid + ffo

        # selective: prompt rows (on a prompt refresh) + the selected response rows
        rows = selected + n_prompt
        if n_prompt:
            rows = torch.cat([torch.arange(n_prompt, device=rows.device), rows])
        rope = m.rope(self.positions[base + m.beside(rows, self.positions)])
        hc, nc = h.index_select(1, rows), normed.index_select(1, rows)
        q = m.queries(layer, nc, rope)
        self._update_kv(layer, normed, nc, rows, rope, base, value_rows)
        a = m.attn_output(layer, m.attend(q, *self.kv.layer(layer)))
        return self._finish(layer, h, hc, a, selected, n_prompt)

    def _finish(self, layer: int, h: Tensor, hc: Tensor, a: Tensor, selected: Tensor,
                n_prompt: int) -> Tensor:
        """FFN of the computed rows; scatter their delta; everything else reuses its delta."""
        m = self.model
        mid = hc + a
        ffo = m.ffn(layer, mid)
        out = mid + ffo
        self.delta[layer].index_copy_(1, selected, (a + ffo)[:, n_prompt:])
        hr = h[:, n_prompt:]
        hr.add_(self.delta[layer])
        hr.index_copy_(1, selected, out[:, n_prompt:])  # computed rows exactly as a full layer
        if n_prompt:
            h[:, :n_prompt] = out[:, :n_prompt]
        self.rows_recomputed[layer] += selected.shape[0]
        return h

    def _update_kv(self, layer: int, normed: Tensor, nc: Tensor, rows: Tensor,
                   rope: tuple[Tensor, Tensor], base: int, value_rows: Tensor | None) -> None:
        """Scatter fresh K/V of the computed rows (sparse), or of every tracked row (dense), or
        V of every tracked row and K of the computed ones (values). ``value_rows``: V of every
        tracked row when the identifier already computed it."""
        m, tracked = self.model, slice(base, None)
        if self.kv_update == "dense":
            self.kv.write(layer, tracked, keys=m.keys(layer, normed, self.rope_tracked))
        else:
            self.kv.write(layer, base + rows, keys=m.keys(layer, nc, rope))
        if self.kv_update == "sparse":
            self.kv.write(layer, base + rows, values=m.values(layer, nc))
        elif value_rows is not None:
            self.kv.write(layer, tracked, values=m.split_heads(value_rows, m.cfg.n_kv_heads))
        else:
            self.kv.write(layer, tracked, values=m.values(layer, normed))

    def _attn_output_layer(self, layer: int, h: Tensor, normed: Tensor, base: int, k_rows: int) -> Tensor:
        """Attention-output identifier: attention must run for every tracked row before the
        selection (why it is the slow identifier); K/V of every row are fresh."""
        m, n_prompt = self.model, self.first_row - base
        q, k, v = m.project_qkv(layer, normed, self.rope_tracked)
        self.kv.write(layer, slice(base, None), k, v)
        a_all = m.attn_output(layer, m.attend(q, *self.kv.layer(layer)))
        selected = self._select(layer, a_all[0, n_prompt:], k_rows)
        rows = selected + n_prompt
        if n_prompt:
            rows = torch.cat([torch.arange(n_prompt, device=rows.device), rows])
        return self._finish(layer, h, h.index_select(1, rows), a_all.index_select(1, rows),
                            selected, n_prompt)

    # ---- identification -----------------------------------------------------------------
    def _identify(self, layer: int, nr: Tensor, v: Tensor | None = None) -> Tensor:
        """Identifier ``[R, D]`` of the response rows from their normed attention input."""
        blk, ident = self.model.blocks[layer], self.identifier
        if ident == "singular":
            return nr[0] @ self.proxy_weights[layer].T
        if ident == "value":
            if v is not None:  # already computed (heads -> rows)
                return v[0].transpose(0, 1).reshape(nr.shape[1], -1)
            return blk.v_proj(nr)[0]
        if ident == "key":
            return blk.k_proj(nr)[0]
        if ident == "query":
            return blk.q_proj(nr)[0]
        return nr[0]  # attn_input

    def _select(self, layer: int, ident: Tensor, k_rows: int) -> Tensor:
        """The ``k_rows`` least similar rows to last step's identifiers (sorted); the cached
        identifiers become this step's, for every row."""
        sim = F.cosine_similarity(ident.float(), self.ident[layer].float(), dim=-1)
        self.ident[layer].copy_(ident)
        if self.forced:
            sim[: self.forced] = -math.inf
        selected = torch.topk(sim, k_rows, largest=False, sorted=False).indices
        return selected.sort().values

    # ---- statistics ---------------------------------------------------------------------
    def recompute_fractions(self) -> list[float]:
        steps = max(self.stats.nfe, 1)
        return [r / (steps * self.n_rows) for r in self.rows_recomputed]

    def extra_stats(self) -> dict:
        per_layer = self.recompute_fractions() if self.stats.nfe else []
        return {"response_refreshes": self.response_refreshes,
                "recompute_fraction_per_layer": [round(v, 6) for v in per_layer],
                "recompute_fraction": round(sum(per_layer) / len(per_layer), 6) if per_layer else None}
