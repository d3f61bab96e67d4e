"""Native transformer shared by every backbone family (dlmpipe/backbones/families/).

One module, written as the math reads (gpt-fast style). The caching engine never calls
``forward`` on partial inputs; it composes the per-layer primitives below (norms, projections,
RoPE at explicit positions, attention over explicit key/value rows, FFN) so that every cache
works on every family. The attention pattern is the backbone's: bidirectional, or block-causal
(``BackboneConfig.block_size``; ``attention_mask`` says which keys a query row sees).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from . import rowwise
from .backbone_config import BackboneConfig
from .moe import MoEFFN
from .rowwise import linear, silu

__all__ = ["Backbone", "BackboneConfig", "Block", "RMSNorm"]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        x32 = x if x.dtype == torch.float32 else x.float()
        x32 = x32 * torch.rsqrt(rowwise.mean_square(x32) + self.eps)  # row-invariant (rowwise.py)
        return self.weight * (x32 if x.dtype == torch.float32 else x32.to(x.dtype))


class Block(nn.Module):
    def __init__(self, cfg: BackboneConfig, layer: int = 0):
        super().__init__()
        d, hd = cfg.d_model, cfg.head_dim
        self.attn_norm = RMSNorm(d, cfg.norm_eps)
        self.q_proj = nn.Linear(d, cfg.n_heads * hd, bias=cfg.qkv_bias)
        self.k_proj = nn.Linear(d, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.v_proj = nn.Linear(d, cfg.n_kv_heads * hd, bias=cfg.qkv_bias)
        self.attn_out = nn.Linear(cfg.n_heads * hd, d, bias=False)
        if cfg.qk_norm:
            self.q_norm = RMSNorm(hd, cfg.norm_eps)
            self.k_norm = RMSNorm(hd, cfg.norm_eps)
        self.ff_norm = RMSNorm(d, cfg.norm_eps)
        if cfg.is_moe_layer(layer):  # routed experts (+ shared ones): moe.py
            self.moe = MoEFFN(cfg)
        else:
            self.ff_gate = nn.Linear(d, cfg.mlp_hidden, bias=False)
            self.ff_up = nn.Linear(d, cfg.mlp_hidden, bias=False)
            self.ff_down = nn.Linear(cfg.mlp_hidden, d, bias=False)

    def ffn(self, h: Tensor) -> Tensor:
        """Pre-normed SwiGLU feed-forward delta (without the residual); on an MoE layer the
        routed experts' weighted sum plus the shared experts (moe.py)."""
        n = self.ff_norm(h)
        if hasattr(self, "moe"):
            return self.moe(n)
        return linear(self.ff_down, silu(linear(self.ff_gate, n)) * linear(self.ff_up, n))


class Backbone(nn.Module):
    """Bidirectional masked-diffusion transformer with cache-friendly primitives.

    Tensors are batched: hidden states ``[B, T, d]``, heads ``[B, H, T, hd]``.
    """

    def __init__(self, cfg: BackboneConfig):
        super().__init__()
        self.cfg = cfg
        if torch.get_default_device().type == "meta":  # a checkpoint's skeleton (loading.py):
            # no initialisation; meta normal_ imports torch._dynamo, ~3 s of every model job
            self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model,
                                      _weight=torch.empty(cfg.vocab_size, cfg.d_model))
        else:
            self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        #: the same blocks as a tuple: the primitives index a layer per call, and a ModuleList's
        #: index checks cost ~3% of a tiny model's CPU decode step (issue 46)
        self.layer_blocks = tuple(self.blocks)
        self.final_norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        self._rope_cache: dict[torch.device, Tensor] = {}  # inverse frequencies per device
        #: the layers' devices when the model is larger than one (dlmpipe/placement.py); None:
        #: every layer on ``device``
        self.placement = None

    # ---- primitives -------------------------------------------------------------------
    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    def to_layer(self, layer: int, x: Tensor) -> Tensor:
        """``x`` on layer ``layer``'s device (itself without a placement): the decode loops move
        the hidden rows at each layer boundary, the primitives their inputs."""
        p = self.placement
        return x if p is None else p.to(x, p.stage(layer))

    def beside(self, x: Tensor, other: Tensor) -> Tensor:
        """``x`` on ``other``'s device (an index of rows held elsewhere; itself without a placement)."""
        p = self.placement
        return x if p is None else p.to(x, p.stage_of(other))

    def layer_empty(self, layer: int, shape, dtype: torch.dtype | None = None) -> Tensor:
        """An uninitialised tensor on layer ``layer``'s device (a cache's per-layer state)."""
        dtype = dtype or self.embed.weight.dtype
        p = self.placement
        if p is None:
            return torch.empty(shape, dtype=dtype, device=self.device)
        return p.empty(p.stage(layer), shape, dtype)

    def rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """RoPE tables ``cos, sin [T, hd]`` at explicit absolute positions (float32, Llama layout,
        except that ``sin``'s first half is negated: ``apply_rope`` then rotates with one roll);
        ``[T, rope_dim]`` under partial rotary (``apply_rope`` then rotates those channels only).

        Computed from the positions directly (no host sync on ``positions.max()``, which would
        stall the GPU once per layer); the same values a precomputed table would hold.
        """
        hd = self.cfg.rope_dim or self.cfg.head_dim
        inv_freq = self._rope_cache.get(positions.device)
        if inv_freq is None:
            inv_freq = 1.0 / (
                self.cfg.rope_theta
                ** (torch.arange(0, hd, 2, dtype=torch.float32, device=positions.device) / hd)
            )
            self._rope_cache[positions.device] = inv_freq
        freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
        # a position's value whatever else is in the call (rowwise.py), so each half once
        cos, sin = rowwise.cos(freqs), rowwise.sin(freqs)
        return torch.cat([cos, cos], dim=-1), torch.cat([-sin, sin], dim=-1)

    @staticmethod
    def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        """Rotate ``x [B, H, T, hd]`` (non-interleaved rotate_half) by ``rope``'s tables, computed
        in float32; with tables narrower than the head (partial rotary) only the first channels,
        as transformers' ``apply_rotary_pos_emb`` does (``rotary_dim = cos.shape[-1]``), the rest
        unchanged. ``x * cos + rotate_half(x) * sin`` as one roll and the signed ``sin`` (the
        same bits: ``(-a) * b == a * (-b)`` exactly), half the ops of slicing and negating x."""
        if cos.shape[-1] < x.shape[-1]:
            r = cos.shape[-1]
            return torch.cat([Backbone.apply_rope(x[..., :r], cos, sin), x[..., r:]], dim=-1)
        x32 = x if x.dtype == torch.float32 else x.float()
        out = x32 * cos + torch.roll(x32, x32.shape[-1] // 2, dims=-1) * sin
        return out if x.dtype == torch.float32 else out.to(x.dtype)

    def split_heads(self, x: Tensor, n_heads: int) -> Tensor:
        b, t, _ = x.shape
        return x.view(b, t, n_heads, self.cfg.head_dim).transpose(1, 2)

    def attn_input(self, layer: int, h: Tensor) -> Tensor:
        """The attention's normed input rows (what the projections and SPA's proxies read)."""
        return self.layer_blocks[layer].attn_norm(self.to_layer(layer, h))

    def queries(self, layer: int, normed: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        """RoPE'd query heads ``[B, H, T, hd]`` of normed rows (``rope`` from ``self.rope``;
        q_norm first where the family has it)."""
        block, normed, rope = self.layer_blocks[layer], *self._on_layer(layer, normed, rope)
        q = self.split_heads(linear(block.q_proj, normed), self.cfg.n_heads)
        return self.apply_rope(block.q_norm(q) if self.cfg.qk_norm else q, *rope)

    def keys(self, layer: int, normed: Tensor, rope: tuple[Tensor, Tensor]) -> Tensor:
        """RoPE'd key heads ``[B, Hkv, T, hd]`` of normed rows (k_norm first where the family has it)."""
        block, normed, rope = self.layer_blocks[layer], *self._on_layer(layer, normed, rope)
        k = self.split_heads(linear(block.k_proj, normed), self.cfg.n_kv_heads)
        return self.apply_rope(block.k_norm(k) if self.cfg.qk_norm else k, *rope)

    def values(self, layer: int, normed: Tensor) -> Tensor:
        """Value heads ``[B, Hkv, T, hd]`` of normed rows."""
        normed = self.to_layer(layer, normed)
        return self.split_heads(linear(self.layer_blocks[layer].v_proj, normed), self.cfg.n_kv_heads)

    def _on_layer(self, layer: int, normed: Tensor, rope: tuple[Tensor, Tensor]):
        if self.placement is None:
            return normed, rope
        return self.to_layer(layer, normed), tuple(self.to_layer(layer, t) for t in rope)

    def project_qkv(self, layer: int, normed: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys (RoPE'd with ``rope``, the tables of the rows' positions) and values of
        normed rows. Callers compute ``rope`` once per forward, not once per layer."""
        return self.queries(layer, normed, rope), self.keys(layer, normed, rope), self.values(layer, normed)

    def qkv(self, layer: int, h: Tensor, rope: tuple[Tensor, Tensor]) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of hidden rows ``h [B, T, d]``: norm, then projections."""
        return self.project_qkv(layer, self.attn_input(layer, h), rope)

    def attend(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        """Bidirectional attention of query rows over explicit key/value rows.

        ``q [B, H, Tq, hd]``, ``k, v [B, Hkv, Tk, hd]`` -> ``[B, Tq, H*hd]`` (before attn_out);
        ``mask`` (bool ``[Tq, Tk]``, True = attends): rows that must not see some keys, e.g. WINO's
        shadow block written as one forward (docs/METHODS.md §1.8); the caches never pass one.
        Grouped-query attention (Dream: 28 query heads over 4 K/V heads) goes through SDPA's own
        GQA support, which reads each K/V head for its query group in place: no per-layer copy
        of the cached K/V to H heads (docs/ARCHITECTURE.md, performance shape).
        """
        if self.placement is not None and mask is not None:  # the mask is built on the first device
            mask = self.placement.to(mask, self.placement.stage_of(k))
        o = rowwise.attend(q, k, v, mask, enable_gqa=self.cfg.n_heads != self.cfg.n_kv_heads)
        b, h, tq, hd = o.shape
        return o.transpose(1, 2).reshape(b, tq, h * hd)

    def use_block_size(self, block_size: int | None, key: str = "block_size") -> None:
        """Decode over blocks of ``block_size`` positions from now on (None: the checkpoint's,
        as its family's reader set it): ``attention_mask``, the full forward and the block loop
        (dlmpipe/blockwise.py) all read ``cfg.block_size``, so this changes the block-causal
        attention itself, not sub-blocks of the sampler. The releases take the block length as
        a generation argument (SDAR generate.py ``--block_length``, Fast-dLLM v2 ``batch_sample``
        ``block_size``, LLaDA2.0 ``generate`` / dInfer ``block_length``; docs/MODELS.md). A
        bidirectional backbone has no blocks: refused, naming ``key`` (the config key that
        asked)."""
        native = self.__dict__.setdefault("native_block_size", self.cfg.block_size)
        if block_size is None:
            self.cfg.block_size = native
            return
        if native is None:
            raise ValueError(f"{key}: {block_size}: the {self.cfg.family} family attends "
                             "bidirectionally (no blocks); a block size applies to a block-causal "
                             "backbone only (SDAR, Fast-dLLM v2, LLaDA2.0)")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"{key}: {block_size!r}: a block size is a positive integer")
        self.cfg.block_size = block_size

    def attention_mask(self, q_positions: Tensor, k_positions: Tensor) -> Tensor | None:
        """Which keys each query row sees, for ``attend``: None (every key) on a bidirectional
        backbone; on a block-causal one bool ``[Tq, Tk]``, True where the key's block
        (``position // block_size``, blocks counted from position 0 as the releases do) is not
        after the query's: finished blocks and the query's own block, never a later one."""
        n = self.cfg.block_size
        if n is None:
            return None
        return (k_positions[None, :] // n) <= (q_positions[:, None] // n)

    def attention_probs(self, q: Tensor, k: Tensor) -> Tensor:
        """Head-averaged attention probabilities ``[B, Tq, Tk]`` (float32) of query rows over
        explicit key rows: ``softmax(q k^T / sqrt(hd))`` as ``attend`` applies it, the mean over
        the H query heads. For what reads attention maps (d2Cache's rollout, docs/METHODS.md);
        ``attend`` stays SDPA, so computing these changes no output. GQA: each query group is
        matched with its K/V head by a view of the queries, not a copy of the keys."""
        b, h, t, hd = q.shape
        hkv = k.shape[1]
        grouped = q.reshape(b, hkv, (h // hkv) * t, hd)  # heads hkv*g + i share K/V head hkv
        scores = (grouped @ k.transpose(-1, -2)).float() * hd ** -0.5
        probs = scores.softmax(dim=-1).view(b, h, t, -1)
        return probs.mean(dim=1)

    def attn_output(self, layer: int, o: Tensor) -> Tensor:
        return linear(self.layer_blocks[layer].attn_out, self.to_layer(layer, o))

    def ffn(self, layer: int, h: Tensor) -> Tensor:
        return self.layer_blocks[layer].ffn(self.to_layer(layer, h))

    def logits(self, h: Tensor) -> Tensor:
        """Raw output logits of final hidden rows (no shift applied)."""
        p = self.placement
        if p is None:
            return linear(self.head, self.final_norm(h)).float()
        normed = self.final_norm(p.to(h, p.last))  # the final norm on the last device
        head = 0 if self.cfg.tie_embeddings else p.last  # a tied head is the embedding's
        return p.to(linear(self.head, p.to(normed, head)).float(), 0)

    # ---- full forward -----------------------------------------------------------------
    def layer(self, layer: int, h: Tensor, rope: tuple[Tensor, Tensor],
              mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
        """One full block over all rows (``rope`` from ``self.rope`` of their positions, ``mask``
        from ``attention_mask``, both computed once per forward); returns the new hidden states
        and this layer's K/V."""
        q, k, v = self.qkv(layer, h, rope)
        h = h + self.attn_output(layer, self.attend(q, k, v, mask))
        h = h + self.ffn(layer, h)
        return h, k, v

    def hidden_states(self, input_ids: Tensor, shadow=None) -> Tensor:
        """Final hidden rows ``[B, N, d]`` (before the final norm) of a full forward. ``shadow``
        (an ``engine.shadow.ShadowRows``) advances its extra query rows over each layer's K/V."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        rope, mask = self.rope(positions), self.attention_mask(positions, positions)
        h = self.embed(input_ids)
        for i in range(self.cfg.n_layers):
            h, k, v = self.layer(i, self.to_layer(i, h), rope, mask)
            if shadow is not None:
                shadow.layer(i, k, v)
        return h

    def hidden_states_storing_kv(self, input_ids: Tensor, kv, shadow=None) -> Tensor:
        """A full forward that also writes every layer's K/V into a preallocated
        ``engine.kv.KVBuffer`` of all rows (in place); returns the final hidden rows."""
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        rope, mask = self.rope(positions), self.attention_mask(positions, positions)
        h = self.embed(input_ids)
        for i in range(self.cfg.n_layers):
            h, k, v = self.layer(i, self.to_layer(i, h), rope, mask)
            kv.write(i, slice(None), k, v)
            if shadow is not None:
                shadow.layer(i, k, v)
        return h

    def forward(self, input_ids: Tensor) -> Tensor:
        """``input_ids [B, N]`` -> raw logits ``[B, N, V]`` (each row's own output)."""
        return self.logits(self.hidden_states(input_ids))

    def first_logit_row(self, prompt_len: int) -> int:
        """First row whose raw logits a response position needs (P-1 when shifted)."""
        return prompt_len - 1 if self.cfg.logit_shift else prompt_len

    def response_logits_from_rows(self, h: Tensor) -> Tensor:
        """Sampler-ready response logits ``[B, G, V]`` from hidden rows starting at
        ``first_logit_row`` (the head runs on those rows only)."""
        logits = self.logits(h)
        return logits[:, :-1] if self.cfg.logit_shift else logits

    def shift(self, raw_logits: Tensor) -> Tensor:
        """Logits as the sampler reads them: row j predicts token j (Dream shifts by one)."""
        if not self.cfg.logit_shift:
            return raw_logits
        return torch.cat([raw_logits[:, :1], raw_logits[:, :-1]], dim=1)
