"""LLaDA2.0 (inclusionAI LLaDA2.0-mini, -flash and their -preview versions): the Ling 2.0
(BailingMoeV2) layout under ``model_type "llada2_moe"``: a fused ``attention.query_key_value``
(q, k, v row blocks; split on load, weights.split_rows), per-head ``query_layernorm`` /
``key_layernorm``, partial RoPE (``partial_rotary_factor``), ``attention.dense``; the first
``first_k_dense_replace`` layers dense, the rest MoE with a sigmoid router, expert bias
(``mlp.gate.expert_bias``), group-limited top-k, normalised and scaled weights and
``num_shared_experts`` shared experts (moe.py ``sigmoid_grouped``). Block diffusion: block-causal
attention over blocks of 32 (modeling_llada2_moe.py ``generate``'s ``block_length`` default, the
mask its forward is given; config.json holds no block size). Tokenizer as LLaDA-MoE's
(docs/MODELS.md)."""
from __future__ import annotations

from ..errors import CheckpointError
from .base import Family, Fields, config_fields, tied
from .llada_moe import (MASK_TOKENS, STOP_TOKENS, _DENSE, _EXPERT, check_routing, expert_keys,
                        ling_template, partial_rope, swiglu_keys)

#: modeling_llada2_moe.py ``LLaDA2MoeModelLM.generate(block_length=32)``; dInfer's default too
BLOCK_SIZE = 32


def read_config(f: Fields) -> dict:
    f.require("hidden_act", (None, "silu"), "the experts are SwiGLU")
    f.require("rope_scaling", (None,), "plain RoPE only")
    f.require("use_bias", (None, False), "the attention output projection has no bias")
    f.require("score_function", (None, "sigmoid"), "modeling_llada2_moe.py's router is sigmoid")
    d, heads, layers = f.int("hidden_size"), f.int("num_attention_heads"), f.int("num_hidden_layers")
    head_dim = f.int("head_dim", default=d // heads)
    qkv_bias = f.raw.get("use_qkv_bias", False)
    if not isinstance(qkv_bias, bool):
        raise CheckpointError(f"{f.file}: field 'use_qkv_bias' must be true or false, got {qkv_bias!r}")
    moe = {}
    dense = list(range(layers))
    if f.raw.get("num_experts") is not None:
        experts, k = f.int("num_experts"), f.int("num_experts_per_tok")
        check_routing(f, experts, k)
        groups, topk_group = f.int("n_group", default=1), f.int("topk_group", default=1)
        if experts % groups or experts // groups < 2 or topk_group > groups \
                or k > topk_group * (experts // groups):
            raise CheckpointError(
                f"{f.file}: grouped routing n_group={groups}, topk_group={topk_group} does not fit "
                f"num_experts={experts}, num_experts_per_tok={k} (groups of at least 2 experts, "
                f"topk_group <= n_group, enough experts in the kept groups)")
        first_dense = f.int("first_k_dense_replace", default=0, positive=False)
        if first_dense < 0:
            raise CheckpointError(f"{f.file}: field 'first_k_dense_replace' must be >= 0, got {first_dense}")
        dense = list(range(min(first_dense, layers)))
        n_shared = f.raw.get("num_shared_experts")
        shared = 0 if not n_shared else f.int("num_shared_experts")
        hidden = f.int("moe_intermediate_size")
        moe = dict(n_experts=experts, experts_per_token=k, expert_hidden=hidden,
                   shared_expert_hidden=hidden * shared, dense_layers=dense, router="sigmoid_grouped",
                   router_bias=True, n_group=groups, topk_group=topk_group,
                   routed_scaling=f.float("routed_scaling_factor", 1.0))
    ids = f.ids("mask_token_id")
    return config_fields(
        "llada2", f, d=d, layers=layers, heads=heads, kv_heads=f.int("num_key_value_heads", default=heads),
        mlp=f.int("intermediate_size") if dense else f.int("intermediate_size", default=1),
        vocab=f.int("vocab_size"), theta=f.float("rope_theta", 10000.0), eps=f.float("rms_norm_eps", 1e-6),
        bias=qkv_bias, mask=ids[0] if ids else None, shift=False, attn_head_dim=head_dim, qk_norm=True,
        tie_embeddings=tied(f), rope_dim=partial_rope(f, head_dim), block_size=BLOCK_SIZE, **moe)


def key_map(cfg) -> dict:
    m = {"model.word_embeddings.weight": "embed.weight", "model.norm.weight": "final_norm.weight"}
    if not cfg.tie_embeddings:
        m["lm_head.weight"] = "head.weight"
    for i in range(cfg.n_layers):
        src, dst = f"model.layers.{i}.", f"blocks.{i}."
        m |= swiglu_keys(src, dst, {"input_layernorm": "attn_norm", "post_attention_layernorm": "ff_norm",
                                    "attention.dense": "attn_out", "attention.query_layernorm": "q_norm",
                                    "attention.key_layernorm": "k_norm"})
        m[src + "attention.query_key_value.weight"] = tuple(dst + p + ".weight" for p in ("q_proj", "k_proj", "v_proj"))
        if cfg.qkv_bias:
            m[src + "attention.query_key_value.bias"] = tuple(dst + p + ".bias" for p in ("q_proj", "k_proj", "v_proj"))
        if not cfg.is_moe_layer(i):
            m |= swiglu_keys(src + "mlp.", dst, _DENSE)
            continue
        m[src + "mlp.gate.weight"] = dst + "moe.router.weight"
        m[src + "mlp.gate.expert_bias"] = dst + "moe.expert_bias"
        m |= expert_keys(src + "mlp.", dst + "moe.", cfg)
        if cfg.shared_expert_hidden:
            m |= swiglu_keys(src + "mlp.shared_experts.", dst + "moe.shared.", _EXPERT)
    return m


FAMILY = Family(
    name="llada2", label="llada2_moe for LLaDA2.0", model_types=("llada2_moe",), read_config=read_config,
    key_map=key_map, chat_template=ling_template, mask_tokens=MASK_TOKENS, stop_tokens=STOP_TOKENS,
    attention="block_causal")
