"""WINO's shadow block as extra query rows of a forward (docs/METHODS.md §1.8, docs/ARCHITECTURE.md
"the seam").

A sampler that verifies decoded tokens (WINO) asks, through ``Sampler.shadow_block``, for the
leave-one-out logits of the response positions ``[lo, hi)``: for each position, the logits the
model gives it when it does not see that position's own token. WINO appends a shadow copy of
the block (its tokens masked) to the input; the real rows never attend to it, so their logits
are unchanged, and each shadow row attends to every real row except the token it verifies and
to every shadow row. Because nothing real attends to the shadow, the shadow rows can run next
to any forward that has each layer's K/V of the real rows: ``layer`` advances them over the
K/V the real rows attended to in that layer (fresh ones in a full forward, Archer's cached
prompt K/V plus fresh response K/V in its cached forward, the row and selective caches' buffer
as that layer's computed rows saw it), so they carry the cache's approximation, nothing more.

Geometry, with ``s`` the family's logit shift (LLaDA 0, Dream 1: row j-1 gives token j's
logits). The verification logits of block position ``lo + k`` are read from the shadow row at
position ``lo + k - s``; that row never sees the real row ``lo + k``. The shadow rows sit at
positions ``[lo - s, hi)``: the masked copy of the block, plus for a shifted family the row
before it, which keeps its real token (it is not verified; its logits verify ``lo``). So every
verifying row sees the verified position only as a masked shadow row, as in WINO's LLaDA mask;
at ``s = 0`` this is exactly the released mask (shadow at the block's positions, all masks,
``~eye`` against the block). Reading the LLaDA mask through a global shift instead (shadow row
``q`` read as position ``q + 1``) would verify each token with a row that sees it.
"""
from __future__ import annotations

import torch
from torch import Tensor

from ..backbones.model import Backbone


def shadow_inputs(model: Backbone, x: Tensor, lo: int, hi: int) -> tuple[Tensor, ...]:
    """The shadow rows of absolute block rows ``[lo, hi)`` over the sequence ``x [N]``: their
    token ids ``[S]``, RoPE tables ``cos, sin [S, hd]`` and which real rows each attends to
    (``sees [S, N]``); ``S = hi - lo + shift``. Tensors only, so a captured step can take them."""
    s = int(model.cfg.logit_shift)
    positions = torch.arange(lo - s, hi, device=x.device)
    ids = torch.full((positions.numel(),), model.cfg.mask_id, dtype=x.dtype, device=x.device)
    if s:
        ids[0] = x[lo - 1]  # the row before the block keeps its token
    sees = torch.ones(positions.numel(), x.shape[0], dtype=torch.bool, device=x.device)
    sees[:, lo:hi].diagonal().fill_(False)  # the row verifying lo + k never sees that token
    return (ids, *model.rope(positions), sees)


class ShadowRows:
    """The shadow rows of one forward (inputs from ``shadow_inputs``); ``layer`` once per layer
    in order, then ``logits``."""

    def __init__(self, model: Backbone, ids: Tensor, cos: Tensor, sin: Tensor, sees: Tensor):
        self.model, self.rope, self.sees = model, (cos, sin), sees
        self.verified = ids.shape[0] - int(model.cfg.logit_shift)  # rows whose logits verify
        self.h = model.embed(ids[None])

    def layer(self, i: int, keys: Tensor, values: Tensor) -> None:
        """Advance the shadow rows through layer ``i`` over the real rows' K/V of that layer
        (``[1, Hkv, N, hd]``, what the real rows attended to) and their own."""
        m = self.model
        self.h = m.to_layer(i, self.h)  # the layer boundary (placement.py)
        self.sees = m.to_layer(i, self.sees)
        q, k, v = m.qkv(i, self.h, self.rope)
        prefix = m.prefix_kv(i) if hasattr(m, "prefix_kv") else None  # a block-causal stand-in
        self.h = self.h + m.attn_output(i, self.attend(q, keys, values, k, v, prefix))
        self.h = self.h + m.ffn(i, self.h)

    def attend(self, q: Tensor, keys: Tensor, values: Tensor, k: Tensor, v: Tensor,
               prefix: tuple[Tensor, Tensor] | None = None) -> Tensor:
        """Softmax attention of the shadow queries ``q [1, H, S, hd]`` over the real K/V
        (``sees``) and their own ``k, v [1, Hkv, S, hd]``, without copying the real K/V (a
        concatenation would copy N rows per layer per step): the scores of both parts share
        one softmax. Query head h reads K/V head h // (H / Hkv), as SDPA's GQA does.
        ``prefix``: on a block-causal backbone, the finished blocks' K/V, seen by every shadow
        row (a third part of the same softmax; dlmpipe/blockwise.py)."""
        b, heads, s, hd = q.shape
        kv_heads = keys.shape[1]
        qg = q.reshape(b, kv_heads, heads // kv_heads * s, hd)
        scale = hd ** -0.5
        real = (qg @ keys.transpose(-1, -2)).float() * scale          # [1, Hkv, g*S, N]
        own = (qg @ k.transpose(-1, -2)).float() * scale              # [1, Hkv, g*S, S]
        real = real.masked_fill(~self.sees.repeat(heads // kv_heads, 1), float("-inf"))
        parts = [real, own]
        if prefix is not None and prefix[0].shape[2]:
            parts.insert(0, (qg @ prefix[0].transpose(-1, -2)).float() * scale)
        w = torch.softmax(torch.cat(parts, dim=-1), dim=-1)
        lo = 0 if len(parts) == 2 else prefix[0].shape[2]
        n = keys.shape[2]
        o = w[..., lo:lo + n].to(values.dtype) @ values + w[..., lo + n:].to(v.dtype) @ v
        if lo:
            o = o + w[..., :lo].to(prefix[1].dtype) @ prefix[1]
        return o.reshape(b, heads, s, hd).transpose(1, 2).reshape(b, s, heads * hd)

    def logits(self) -> Tensor:
        """Verification logits ``[hi - lo, V]``: row k for block position ``lo + k``."""
        return self.model.logits(self.h[:, :self.verified])[0]


def with_shadow(model: Backbone, x: Tensor, prompt_len: int,
                block: tuple[int, int] | None) -> ShadowRows | None:
    """The shadow rows for the response block ``block`` (response coordinates), or None."""
    if block is None:
        return None
    lo, hi = block
    return ShadowRows(model, *shadow_inputs(model, x, prompt_len + lo, prompt_len + hi))


def append(logits: Tensor, shadow: ShadowRows | None) -> Tensor:
    """Response logits ``[G, V]`` followed by the shadow's verification logits, when asked."""
    return logits if shadow is None else torch.cat([logits, shadow.logits()])
