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
and 2 threads; tests/test_batching.py).

On a GPU (``grouped_experts``; issue 48: the per-expert loop measured 46-157x the layer's floor
on an H200) the experts run as two grouped matrix products over the rows sorted by expert
(``torch._grouped_mm`` with each expert's end offset, over weights stacked once, which the
experts' parameters then view): a fixed number of launches and no host read, whatever the
routing; CUDA's ``index_add_`` being atomic and unordered, the outputs are gathered back to
slot order and summed there. Where the installed torch has no grouped product for the device or
dtype, one SwiGLU per active expert after one host read of the counts.

Cost on the CPU: one host read of the per-expert counts per layer call (which experts run, how
many rows each), as the releases' ``tokens_per_expert.cpu()``; and per active expert a fixed
per-call overhead on top of its products, which is what separates the layer from a dense SwiGLU
of the same active width when experts receive few rows each (benchmarks/bench_moe.py).
"""
from __future__ import annotations

import warnings

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

    def _cpu_experts(self, x2: Tensor, idx: Tensor, w: Tensor) -> Tensor:
        """The CPU's routed sum (module docstring): each expert's rows gathered and added back
        while in cache, in ascending expert order (row-invariant)."""
        t, k = x2.shape[0], self.cfg.experts_per_token
        flat = idx.reshape(-1)  # slot j of row r at r * k + j
        order = torch.argsort(flat, stable=True)  # slots grouped by expert, rows ascending
        counts = torch.bincount(flat, minlength=self.cfg.n_experts).tolist()  # one host read
        rows_of = order // k
        ws = w.reshape(-1).index_select(0, order)[:, None]
        acc = torch.zeros(t, x2.shape[-1], dtype=torch.float32, device=x2.device)
        start = 0
        for e, c in enumerate(counts):
            if c:
                rows = rows_of[start:start + c]
                y = self.experts[e](x2.index_select(0, rows)).float() * ws[start:start + c]
                acc.index_add_(0, rows, y)  # a row's experts added in ascending expert order
                self._called(e, c)
            start += c
        return acc

    def grouped_experts(self, x2: Tensor, idx: Tensor, w: Tensor, grouped: bool | None = None) -> Tensor:
        """Every routed expert over its rows as two grouped matrix products (issue 48; the GPU's
        path, any device in the tests): the (row, slot) pairs sorted by expert, the experts'
        gate+up and down weights stacked (``stacked_experts``), ``torch._grouped_mm`` over the
        sorted rows with each expert's end offset, weighted outputs gathered back to slot order
        and summed in it (CUDA's ``index_add_`` is atomic, in no fixed order). A fixed number of
        launches whatever the routing and no host read, so the layer can be captured in a CUDA
        graph. Where the grouped product is missing or refuses the shapes (dtype, widths not a
        multiple of 16 bytes), or ``grouped`` is False, one SwiGLU per expert over its rows
        instead, after one host read of the counts. Returns float32 ``[T, d]``."""
        t, k, e_all = x2.shape[0], self.cfg.experts_per_token, self.cfg.n_experts
        flat = idx.reshape(-1)  # slot j of row r at r * k + j
        order = torch.argsort(flat, stable=True)  # slots grouped by expert, rows ascending
        rows_of = order // k
        ws = w.reshape(-1).index_select(0, order)[:, None]
        xs = x2.index_select(0, rows_of)
        counts = torch.zeros(e_all, dtype=torch.int32, device=x2.device).scatter_add_(
            0, flat, torch.ones_like(flat, dtype=torch.int32))  # bincount would read its size back
        ends = torch.cumsum(counts, 0, dtype=torch.int32)
        gate_up, down = self.stacked_experts()
        h = gate_up.shape[1] // 2
        if grouped is None:
            grouped = _grouped_mm_fits(xs, h)
        if grouped:
            try:
                gu = torch._grouped_mm(xs, gate_up.transpose(1, 2), offs=ends)
                ys = torch._grouped_mm(silu(gu[:, :h]) * gu[:, h:], down.transpose(1, 2), offs=ends)
            except (RuntimeError, NotImplementedError) as err:  # this device or dtype has none: remembered
                _NO_GROUPED_MM.add((xs.device.type, xs.dtype))
                warnings.warn(f"dlmpipe: torch._grouped_mm cannot run {xs.dtype} on {xs.device.type} "
                              f"({str(err).splitlines()[0][:200]}): the experts run one by one, one host "
                              "read per layer (same results, slower)", stacklevel=2)
                grouped = False
        if not grouped:
            ys = torch.empty(t * k, x2.shape[-1], dtype=xs.dtype, device=x2.device)
            start = 0
            for e, c in enumerate(counts.tolist()):  # one host read
                if c:
                    ys[start:start + c] = self.experts[e](xs[start:start + c])
                    self._called(e, c)
                start += c
        ys = ys.float() * ws
        back = torch.empty_like(order)
        back[order] = torch.arange(order.numel(), device=order.device)
        out = ys.index_select(0, back).view(t, k, -1)
        acc = out[:, 0]
        for j in range(1, k):  # slot order, elementwise: the same sum whatever t is
            acc = acc + out[:, j]
        return acc

    def stacked_experts(self) -> tuple[Tensor, Tensor]:
        """The experts' weights as two stacked tensors, gate and up ``[E, 2H, d]`` and down
        ``[E, d, H]``, which the experts' own parameters are then views of (no second copy; a
        state dict and the CPU path read the same values). Stacked on first use and again after
        the parameters were replaced (``Module.to``, a load that reassigns them): checked by
        address, a host-side comparison."""
        first = self.experts[0]
        stack = self.__dict__.get("_stack")
        if stack is not None and first.gate.weight.data_ptr() == stack[0].data_ptr() \
                and first.down.weight.data_ptr() == stack[1].data_ptr():
            return stack
        h = first.gate.weight.shape[0]
        with torch.inference_mode(False), torch.no_grad():
            gate_up = torch.stack([torch.cat([ex.gate.weight, ex.up.weight]) for ex in self.experts])
            down = torch.stack([ex.down.weight for ex in self.experts])
            for e, ex in enumerate(self.experts):
                ex.gate.weight.data, ex.up.weight.data = gate_up[e, :h], gate_up[e, h:]
                ex.down.weight.data = down[e]
        self.__dict__["_stack"] = (gate_up, down)
        return gate_up, down

    # ---- forward ------------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if x2.shape[0] == 0:
            return torch.zeros_like(x)
        idx, w = self.route(x2)
        if x.device.type != "cpu":  # no host read, no launch per expert (grouped_experts)
            acc = self.grouped_experts(x2, idx, w)
        else:
            acc = self._cpu_experts(x2, idx, w)
        y = acc.to(x.dtype)
        if self.cfg.shared_expert_hidden:
            y = y + self.shared(x2)
        return y.view(shape)


#: (device type, dtype) where ``torch._grouped_mm`` raised: the per-expert loop from then on
_NO_GROUPED_MM: set = set()


def _grouped_mm_fits(xs: Tensor, hidden: int) -> bool:
    """Whether ``torch._grouped_mm`` can take these rows: it exists, has not refused this device
    and dtype, and every row is a multiple of 16 bytes (its stride rule)."""
    size = xs.element_size()
    return (hasattr(torch, "_grouped_mm") and (xs.device.type, xs.dtype) not in _NO_GROUPED_MM
            and xs.shape[-1] * size % 16 == 0 and hidden * size % 16 == 0)


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
