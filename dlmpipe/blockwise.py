"""Block-causal decoding: a property of the backbone, not a fork of the decode loop.

On a backbone with ``block_size`` n (SDAR, Fast-dLLM v2; docs/MODELS.md) a position attends to
its own block of n positions (counted from position 0) and to every earlier block, never to a
later one. So once a block holds its final tokens, its K/V are exact for every later step; and
rows after the block being decoded cannot change it. ``Decoding`` (decode.py) therefore decodes
such a backbone one *active block* at a time, each as a small problem of its own:

- the prompt's whole blocks are prefilled once (their K/V stored, ``BlockState.extend``);
- the active block is the sequence the sampler and the cache see: its rows before the first
  position to decode (the prompt's tail, or a shifted family's next token) are its prompt, the
  rest its response. The cache runs over a ``BlockModel``, a stand-in of the backbone whose
  RoPE positions are offset to the block's and whose attention prepends the exact K/V of the
  finished prefix, so every cache works on the active block unchanged;
- when the sampler is done with the block, its K/V are computed once with the final tokens and
  appended to the prefix; no later step computes its rows again, and no step computes a row of
  a later block (``BlockState.committed`` and ``BlockCausal.rows_per_update`` count them;
  tests/test_block_causal.py);
- a shifted family (Fast-dLLM v2: token j from row j - 1) has a block's first position predicted
  by the previous block's last row, which cannot see the active block: that token is decided
  when the previous block is committed (or the prompt prefilled), greedily, as the release does;
- the decode ends after the first finished block that holds a stop token: later blocks cannot
  change any text before it (the rest of the response stays masked); whole blocks are decoded,
  so the last may run past ``gen_len`` (those positions are not part of the response).

The sampler's ``block_length`` and ``steps`` apply to each active block as its response
(docs/METHODS.md, "Block-causal backbones"): a block whose positions to decode are not a
multiple of ``block_length`` (the first, after a prompt that ends inside a block) is one
sub-block, and ``steps`` is capped at its positions.
"""
from __future__ import annotations

import torch
from torch import Tensor

from .backbones.model import Backbone
from .engine.kv import KVBuffer


class BlockModel:
    """The active block's stand-in for the backbone (or a batch slot's ``SlotModel``): row 0 of
    its sequence is absolute position ``start``; every attention call sees the finished prefix's
    K/V first. Backbone's composite methods run on it, its leaves are the inner model's."""

    layer = Backbone.layer
    hidden_states = Backbone.hidden_states
    hidden_states_storing_kv = Backbone.hidden_states_storing_kv
    response_logits_from_rows = Backbone.response_logits_from_rows
    first_logit_row = Backbone.first_logit_row
    shift = Backbone.shift
    split_heads = Backbone.split_heads
    apply_rope = staticmethod(Backbone.apply_rope)

    def __init__(self, inner, state: "BlockState"):
        self.inner, self.state = inner, state
        self.cfg = inner.cfg
        self._layer = 0
        self.query_rows = 0  # rows given queries by the active block's forwards (layer 0)

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("inner", "state"):  # copying an unset instance
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, input_ids: Tensor) -> Tensor:
        return self.forward(input_ids)

    def forward(self, input_ids: Tensor) -> Tensor:
        return self.logits(self.hidden_states(input_ids))

    def parameters(self):
        return self.inner.parameters()

    def buffers(self):
        return self.inner.buffers()

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return self.inner.rope(positions + self.state.start)

    def attention_mask(self, q_positions: Tensor, k_positions: Tensor) -> None:
        return None  # inside the active block attention is bidirectional

    # the layered leaves remember their layer, which attention's prefix belongs to
    def _at(self, layer: int):
        self._layer = layer
        return self.inner

    def attn_input(self, layer, h):
        return self._at(layer).attn_input(layer, h)

    def queries(self, layer, normed, rope):
        return self._at(layer).queries(layer, normed, rope)

    def keys(self, layer, normed, rope):
        return self._at(layer).keys(layer, normed, rope)

    def values(self, layer, normed):
        return self._at(layer).values(layer, normed)

    def qkv(self, layer, h, rope):
        return self._at(layer).qkv(layer, h, rope)

    def project_qkv(self, layer, normed, rope):
        return self._at(layer).project_qkv(layer, normed, rope)

    def prefix_kv(self, layer: int) -> tuple[Tensor, Tensor]:
        """The finished prefix's K/V of ``layer`` (views ``[1, Hkv, start, hd]``), for what
        attends without ``attend`` (WINO's shadow rows, engine/shadow.py)."""
        keys, values = self.state.kv.layer(layer)
        return keys[:, :, :self.state.start], values[:, :, :self.state.start]

    def _with_prefix(self, k: Tensor, v: Tensor | None) -> tuple[Tensor, Tensor]:
        """The block's K/V written after the prefix in the state's buffer (n rows copied, the
        prefix never), returned as one view over [prefix ; block] (``v`` None: keys only)."""
        state, start = self.state, self.state.start
        if k.shape[2] != state.length:
            raise ValueError(f"attention over {k.shape[2]} keys; the active block has {state.length}")
        state.kv.write(self._layer, slice(start, start + state.length), k, v)
        keys, values = state.kv.layer(self._layer)
        return keys[:, :, :start + state.length], values[:, :, :start + state.length]

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        if self._layer == 0:
            self.query_rows += q.shape[2]
        keys, values = self._with_prefix(k, v)
        if mask is not None:  # the prefix is visible to every row
            mask = torch.cat([mask.new_ones(*mask.shape[:-1], self.state.start), mask], dim=-1)
        return self.inner.attend(q, keys, values, mask)

    def attention_probs(self, q: Tensor, k: Tensor) -> Tensor:
        """Attention over [prefix ; block], the block's columns only (d2Cache's rollout is over
        the active block's rows; the finished prefix is outside its sequence)."""
        keys, _ = self._with_prefix(k, None)
        return self.inner.attention_probs(q, keys)[..., self.state.start:]


class BlockState:
    """One sample's finished prefix (its K/V of every layer) and the active block's bounds."""

    def __init__(self, model, x: Tensor):
        self.model, self.n = model, model.cfg.block_size
        self.kv = KVBuffer.for_model(model, x.shape[0])
        self.start, self.length = 0, 0  # the active block: absolute rows [start, start + length)
        self.finished = 0               # rows [0, finished) hold their exact K/V
        self.committed = torch.zeros(x.shape[0], dtype=torch.int32)  # K/V computations per row
        self.block_forwards = 0         # prefill and commit forwards
        #: each prefill/commit forward as (kind, lo, stop, next token or None), for the decode
        #: trace (dlmpipe/trace.py), which empties it
        self.log: list[tuple[str, int, int, int | None]] = []

    def extend(self, x: Tensor, stop: int, kind: str = "commit") -> Tensor:
        """Compute rows [finished, stop) of ``x`` over the prefix (block-causal among themselves)
        and append their K/V; returns their final hidden rows."""
        m, lo = self.model, self.finished
        positions = torch.arange(lo, stop, device=x.device)
        keys_at = torch.arange(stop, device=x.device)
        mask = m.attention_mask(positions, keys_at)
        if lo // self.n == (stop - 1) // self.n:
            mask = None  # one block: every row sees every key (the unmasked kernel)
        rope = m.rope(positions)
        h = m.embed(x[lo:stop][None])
        for i in range(m.cfg.n_layers):
            h = m.to_layer(i, h)  # the layer boundary (placement.py)
            q, k, v = m.qkv(i, h, rope)
            self.kv.write(i, slice(lo, stop), k, v)
            keys, values = self.kv.layer(i)
            h = h + m.attn_output(i, m.attend(q, keys[:, :, :stop], values[:, :, :stop], mask))
            h = h + m.ffn(i, h)
        self.committed[lo:stop] += 1
        self.finished = stop
        self.block_forwards += 1
        self.log.append((kind, lo, stop, None))
        return h


def padded_length(n_tokens: int, block: int) -> int:
    """Whole blocks covering ``n_tokens`` positions."""
    return -(-n_tokens // block) * block


def merge_stats(total: dict, part: dict) -> None:
    """Add one block's sampler and cache statistics into the sample's: counts add up, lists of
    counts are concatenated, fractions are averaged over the blocks' forwards (``nfe``)."""
    weight, before = part.get("nfe", 0), total.get("nfe", 0)
    for key, value in part.items():
        old = total.get(key)
        if key not in total:
            total[key] = list(value) if isinstance(value, list) else value
        elif isinstance(value, bool) or value is None or old is None:
            total[key] = value if old is None else old
        elif isinstance(value, int) and isinstance(old, int):
            total[key] = old + value
        elif isinstance(value, float) or isinstance(old, float):
            total[key] = _mean(old, before, value, weight)
        elif isinstance(value, list) and key.endswith("_per_layer") and len(value) == len(old):
            total[key] = [_mean(a, before, b, weight) for a, b in zip(old, value)]
        elif isinstance(value, list):
            total[key] = old if old == value and key == "layer_budget" else old + list(value)


def _mean(a, wa, b, wb):
    return round((a * wa + b * wb) / (wa + wb), 6) if wa + wb else b


class BlockCausal:
    """The block loop of one ``Decoding`` on a block-causal backbone (module docstring)."""

    def __init__(self, model, sampler, cache, x: Tensor, prompt_len: int, gen_len: int,
                 generator, stop_ids: list[int]):
        self.sampler, self.cache, self.generator = sampler, cache, generator
        self.prompt_len, self.gen_len, self.stop_ids = prompt_len, gen_len, stop_ids
        self.state = BlockState(model, x)
        self.block_model = BlockModel(model, self.state)
        cache.model = self.block_model
        self.shift = bool(model.cfg.logit_shift)
        self.totals: dict = {}
        self.done = False
        self.rows_per_update: list[int] = []  # rows each update's forward computed
        n = self.state.n
        prefill = prompt_len // n * n
        if prefill:
            h = self.state.extend(x, prefill, "prefill")
            if self.shift and prefill == prompt_len:
                x[prefill] = self._next_token(h)
                self._log_next(x, prefill)
        self._begin_block(x, prefill)

    def _next_token(self, h: Tensor) -> Tensor:
        """A shifted family's next position from the last finished row (greedy, as Fast-dLLM
        v2's release decides a block's first token)."""
        return self.block_model.inner.logits(h[:, -1:])[0, 0].argmax()

    def _log_next(self, x: Tensor, row: int) -> None:
        kind, lo, stop, _ = self.state.log[-1]
        self.state.log[-1] = (kind, lo, stop, row)

    def _begin_block(self, x: Tensor, start: int) -> None:
        state, n = self.state, self.state.n
        state.start, state.length = start, n
        first = max(self.prompt_len, start + int(self.shift and start >= self.prompt_len))
        self.active = x[start:start + n]
        self.active_prompt = first - start
        self._begin_sampler(n - self.active_prompt)
        self.cache.begin(self.active, self.active_prompt)
        self.block_model.query_rows = 0

    def _begin_sampler(self, positions: int) -> None:
        """``sampler.begin`` on the block's positions, its block length and steps fitted to them
        (module docstring); its parameters are restored after."""
        s = self.sampler
        saved = {k: getattr(s, k) for k in ("block_length_opt", "steps_opt") if hasattr(s, k)}
        if saved.get("block_length_opt") and positions % saved["block_length_opt"]:
            s.block_length_opt = None
        if saved.get("steps_opt"):  # (positions is a multiple of the sub-blocks' count)
            s.steps_opt = min(saved["steps_opt"], positions)
        try:
            s.begin(self.active_prompt, positions, self.state.model.cfg.mask_id, self.generator,
                    self.state.model.device)
        finally:
            for k, v in saved.items():
                setattr(s, k, v)

    def after_update(self, x: Tensor) -> None:
        """Count the update's rows; when the sampler is done with the block, commit it and begin
        the next (or end: the last block, or a stop token in the response so far)."""
        self.rows_per_update.append(self.block_model.query_rows)
        self.block_model.query_rows = 0
        if not self.sampler.done:
            return
        merge_stats(self.totals, {**self.sampler.stats(), **self.cache.stats.as_dict(),
                                  **self.cache.extra_stats()})
        state = self.state
        end = state.start + state.length
        response = x[self.prompt_len:end]
        stopped = bool(torch.isin(response, torch.tensor(self.stop_ids, device=x.device)).any()) \
            if self.stop_ids else False
        if stopped or end == x.shape[0]:
            self.done = True
            return
        h = state.extend(x, end)
        if self.shift:
            x[end] = self._next_token(h)
            self._log_next(x, end)
        self._begin_block(x, end)

    def stats(self) -> dict:
        out = dict(self.totals)
        if not self.done:  # a clone mid-block (analyses): the active block so far
            merge_stats(out, {**self.sampler.stats(), **self.cache.stats.as_dict(),
                              **self.cache.extra_stats()})
        out["nfe"] = out.get("nfe", 0) + self.state.block_forwards
        out["block_forwards"] = self.state.block_forwards
        out["rows_computed"] = int(self.state.committed.sum()) + sum(self.rows_per_update)
        return out
