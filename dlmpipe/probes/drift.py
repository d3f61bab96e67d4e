"""The per-layer drift profile (SPA-Cache Figures 1 and 2; docs/ANALYSES.md).

Along a method's trajectory, before every update the state is run through one instrumented
full forward (the backbone directly; the method's cache is untouched), and per layer ``l`` the
response rows of four quantities are compared, token by token, with the previous update's by
cosine similarity:

- ``input``: the layer's input hidden state ``h_l`` (the residual stream entering the layer);
- ``proxy``: the singular proxy ``S_r B_r^T RMSNorm(h_l)`` (engine/proxies.py, rank ``r``);
- ``value``: the value vectors ``W_v RMSNorm(h_l)`` (all KV heads, bias included);
- ``ffn_output``: the FFN's output (the delta it adds to the residual stream).

Per (update, layer, quantity) a record holds the mean and minimum similarity over the response
tokens and how many fall below ``tau`` (0.95 in the paper: "highly drifting" tokens).
"""
from __future__ import annotations

import pyarrow as pa
import torch
import torch.nn.functional as F
from torch import Tensor

from ..decode import Decoding, Observer

SERIES = ("input", "proxy", "value", "ffn_output")

DRIFT_SCHEMA = pa.schema([
    ("sample_index", pa.int64()), ("task_id", pa.string()), ("update", pa.int64()),
    ("layer", pa.int64()), ("series", pa.string()), ("mean_similarity", pa.float64()),
    ("min_similarity", pa.float64()), ("drifting", pa.int64()), ("tokens", pa.int64()),
])


def layer_states(model, x: Tensor, prompt_len: int,
                 proxy_weights: list[Tensor] | None = None) -> list[dict[str, Tensor]]:
    """Per layer, the response rows ``[G, D]`` of each series, from one full forward over
    ``x [N]`` (the same math as ``Backbone.layer``)."""
    P, G = prompt_len, x.shape[0] - prompt_len
    rope = model.rope(torch.arange(x.shape[0], device=x.device))
    h = model.embed(x[None])
    out = []
    for i in range(model.cfg.n_layers):
        normed = model.attn_input(i, h)
        q, k, v = model.project_qkv(i, normed, rope)
        mid = h + model.attn_output(i, model.attend(q, k, v))
        ffo = model.ffn(i, mid)
        states = {"input": h[0, P:], "value": v[0, :, P:].transpose(0, 1).reshape(G, -1),
                  "ffn_output": ffo[0, P:]}
        if proxy_weights is not None:
            states["proxy"] = normed[0, P:] @ proxy_weights[i].T
        out.append(states)
        h = mid + ffo
    return out


class DriftProfile(Observer):
    """Records, before every update after the first, each layer's step-to-step similarities.
    ``proxy_weights``: per layer ``S_r B_r^T [r, d]`` (None: no proxy series)."""

    def __init__(self, proxy_weights: list[Tensor] | None = None, tau: float = 0.95):
        self.proxy_weights, self.tau = proxy_weights, tau
        self.start()

    def start(self) -> "DriftProfile":
        self.previous: list[dict[str, Tensor]] | None = None
        self.offset = 0  # where the compared rows start in the response (block-causal: the block)
        self.records: list[dict] = []
        return self

    def before_update(self, run: Decoding, logits: Tensor) -> None:
        # the sampler's view: on a block-causal backbone the active block's rows (a full forward
        # over it attends to the finished prefix's exact K/V), compared within a block only
        with run.uncounted():
            states = layer_states(run.active_model, run.sequence, run.active_prompt_len,
                                  self.proxy_weights)
        if run.active_offset != self.offset:
            self.previous, self.offset = None, run.active_offset
        if self.previous is not None:
            keys, values = [], []
            for layer, (now, before) in enumerate(zip(states, self.previous)):
                for series in (s for s in SERIES if s in now):
                    sim = F.cosine_similarity(now[series].float(), before[series].float(), dim=-1)
                    keys.append((layer, series, sim.numel()))
                    values.append(torch.stack([sim.mean(), sim.min(), (sim < self.tau).sum().float()]))
            for (layer, series, n), (mean, low, drifting) in zip(keys, torch.stack(values).tolist()):
                self.records.append({"update": run.updates, "layer": layer, "series": series,
                                     "mean_similarity": mean, "min_similarity": low,
                                     "drifting": int(drifting), "tokens": n})
        self.previous = states
