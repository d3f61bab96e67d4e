"""The mixture-of-experts FFN (LLaDA-MoE, LLaDA2.0; docs/MODELS.md): a router picks
``experts_per_token`` of ``n_experts`` SwiGLU experts per row, their outputs are summed with the
router's weights, and shared experts (a dense SwiGLU every row takes) are added.

Only the routed work is done: the (row, slot) pairs are sorted by expert, and each expert that
received rows runs one SwiGLU (three matrix products) over exactly its rows (``index_select``
in, each output weighted and added into its rows with ``index_add_``); an expert no row chose
is never called. Each expert's rows are gathered and added back while they are in cache: no
pass over the rows x top-k rows of the whole layer (on a memory-bound CPU such passes cost more
than the products). This is the releases' own inference path (LLaDA-MoE's per-expert
``index_add_``, LLaDA2.0's ``moe_infer``) without their Python work on empty experts.

Row invariance (rowwise.py; docs/MODELS.md, "MoE layer"): a row's result does not depend on
which other rows share the call. The router projection and every expert's products go through
``rowwise.linear`` (calls of one fixed row count, so the BLAS computes each row alike whatever
the count an expert receives); sigmoid and SiLU through the element-invariant
``rowwise.sigmoid`` / ``rowwise.silu``; softmax and top-k are per row; and the
``k`` weighted expert outputs of a row are added into it one expert after another, in ascending
expert order (CPU ``index_add_`` adds a row's contributions in index order, whatever its thread
count): an order set by the row's own experts, never by a reduction kernel's split. So a row
routed to an expert alongside 3 others or 300 others gets the same bits (tests/test_moe.py, at 1
and 2 threads; tests/test_batching.py). On CUDA, whose ``index_add_`` is atomic and unordered,
the outputs are gathered back to slot order and summed there instead.

Cost: one host read of the per-expert counts per layer call (which experts run, how many rows
each), as the releases' ``tokens_per_expert.cpu()``; and per active expert a fixed per-call
overhead on top of its products, which is what separates the layer from a dense SwiGLU of the
same active width when experts receive few rows each (benchmarks/bench_moe.py).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from .backbone_config import BackboneConfig
from .rowwise import linear, matmul_rows, sigmoid, silu

#: router kinds (``BackboneConfig.router``), as each release's modeling code computes them
ROUTERS = ("softmax_biased", "sigmoid_grouped")


class Expert(nn.Module):
    """One SwiGLU expert (also the shared expert: ``hidden`` = its whole width)."""

    def __init__(self, d: int, hidden: int):
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return linear(self.down, silu(linear(self.gate, x)) * linear(self.up, x))


class MoEFFN(nn.Module):
    """Router + routed experts + optional shared expert, over normed rows ``[..., d]``.

    ``calls``: when a list, every expert call appends ``(expert, rows)`` (tests count them)."""

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        if cfg.router not in ROUTERS:
            raise ValueError(f"unknown MoE router {cfg.router!r} (one of {', '.join(ROUTERS)})")
        self.cfg = cfg
        d, e = cfg.d_model, cfg.n_experts
        self.router = nn.Linear(d, e, bias=False)
        if cfg.router_bias:
            self.expert_bias = nn.Parameter(torch.zeros(e), requires_grad=False)
        self.experts = nn.ModuleList(Expert(d, cfg.expert_hidden) for _ in range(e))
        if cfg.shared_expert_hidden:
            self.shared = Expert(d, cfg.shared_expert_hidden)
        self.calls: list | None = None

    # ---- routing ------------------------------------------------------------------------
    def route(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Expert ids ``[T, k]`` and their weights ``[T, k]`` (float32) for rows ``x [T, d]``."""
        cfg, k = self.cfg, self.cfg.experts_per_token
        bias = self.expert_bias.float() if cfg.router_bias else None
        if cfg.router == "softmax_biased":
            # LLaDA-MoE (modeling_lladamoe.py LLaDAMoESparseMoeBlock.forward): softmax over every
            # expert in float32; the expert bias is added to those probabilities and the biased
            # values are both what top-k ranks and the weights used; no renormalisation
            # (norm_topk_prob is fixed False there) and no scaling
            probs = linear(self.router, x).float().softmax(dim=-1)
            if bias is not None:
                probs = probs + bias
            w, idx = torch.topk(probs, k, dim=-1)
            return idx, w
        # LLaDA2.0 (modeling_llada2_moe.py LLaDA2MoeGate): sigmoid scores of a float32 router;
        # the expert bias only ranks (scores + expert_bias); group-limited top-k (a group's score
        # is the sum of its best two; topk_group groups kept, the rest -inf); the weights are the
        # unbiased scores of the chosen experts, normalised to sum 1 when k > 1 (+1e-20), then
        # times routed_scaling_factor
        w32 = self.router.weight.float()
        logits = matmul_rows(x.float(), w32)
        scores = sigmoid(logits)
        ranked = scores + bias if bias is not None else scores
        t, g = ranked.shape[0], cfg.n_group
        grouped = ranked.view(t, g, cfg.n_experts // g)  # a group's score: the sum of its best two (topk(2) as
        best, at = grouped.max(dim=-1, keepdim=True)  # released: the best, then the best of the
        second = grouped.scatter(-1, at, float("-inf")).amax(dim=-1)  # rest; ties alike)
        group_scores = best.squeeze(-1) + second
        group_idx = torch.topk(group_scores, k=cfg.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1).bool()
        keep = group_mask.unsqueeze(-1).expand(t, g, cfg.n_experts // g).reshape(t, cfg.n_experts)
        idx = torch.topk(ranked.masked_fill(~keep, float("-inf")), k=k, dim=-1)[1]
        w = torch.gather(scores, 1, idx)
        if k > 1:
            w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
        return idx, w * cfg.routed_scaling

    def _called(self, e: int, rows: int) -> None:
        if self.calls is not None:
            self.calls.append((e, rows))

    # ---- forward ------------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        t, k = x2.shape[0], self.cfg.experts_per_token
        if t == 0:
            return torch.zeros_like(x)
        idx, w = self.route(x2)
        flat = idx.reshape(-1)  # slot j of row r at r * k + j
        order = torch.argsort(flat, stable=True)  # slots grouped by expert, rows ascending
        counts = torch.bincount(flat, minlength=self.cfg.n_experts).tolist()  # one host read
        rows_of = order // k
        ws = w.reshape(-1).index_select(0, order)[:, None]
        if x.device.type == "cpu":  # each expert's rows gathered and added back while in cache
            acc = torch.zeros(t, shape[-1], dtype=torch.float32, device=x.device)
            start = 0
            for e, c in enumerate(counts):
                if c:
                    rows = rows_of[start:start + c]
                    y = self.experts[e](x2.index_select(0, rows)).float() * ws[start:start + c]
                    acc.index_add_(0, rows, y)  # a row's experts added in ascending expert order
                    self._called(e, c)
                start += c
        else:  # CUDA's index_add_ adds a row's experts atomically, in no fixed order: slot order
            xs = x2.index_select(0, rows_of)
            ys = torch.empty(t * k, shape[-1], dtype=torch.float32, device=x.device)
            start = 0
            for e, c in enumerate(counts):
                if c:
                    end = start + c
                    torch.mul(self.experts[e](xs[start:end]).float(), ws[start:end], out=ys[start:end])
                    self._called(e, c)
                start += c
            back = torch.empty_like(order)
            back[order] = torch.arange(order.numel(), device=order.device)
            out = ys.index_select(0, back).view(t, k, -1)
            acc = out[:, 0]
            for j in range(1, k):  # slot order, elementwise: the same sum whatever t is
                acc = acc + out[:, j]
        y = acc.to(x.dtype)
        if self.cfg.shared_expert_hidden:
            y = y + self.shared(x2)
        return y.view(shape)


def naive_moe(moe: MoEFFN, x: Tensor) -> Tensor:
    """Every expert on every row, weighted by the router's dense ``[T, E]`` weights (zero where
    not chosen): the reference the routed layer must equal (tests), never used for decoding."""
    x2 = x.reshape(-1, x.shape[-1])
    idx, w = moe.route(x2)
    dense_w = torch.zeros(x2.shape[0], moe.cfg.n_experts, dtype=torch.float32, device=x.device)
    dense_w.scatter_(1, idx, w)
    y = sum(dense_w[:, e:e + 1] * moe.experts[e](x2).float() for e in range(moe.cfg.n_experts))
    y = y.to(x.dtype)
    if moe.cfg.shared_expert_hidden:
        y = y + moe.shared(x2)
    return y.view(x.shape)
