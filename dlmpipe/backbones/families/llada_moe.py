"""LLaDA-MoE (inclusionAI LLaDA-MoE-7B-A1B-Base / -Instruct): an OLMoE-style decoder without the
causal mask, in Hugging Face names (``model.layers.{i}.self_attn.*``, per-head q_norm/k_norm,
``mlp.gate`` router, ``mlp.experts.{e}.*``, an optional ``shared_expert`` on the layer), routed
by softmax + expert bias, top-k, no renormalisation (moe.py ``softmax_biased``). Its released
config.json says ``model_type "llada"`` like LLaDA-8B's, so the family claims an ``llada``
config.json with MoE fields (and ``lladamoe``, the name ZHZisZZ/dllm asks users to set). The
tokenizer (shared with LLaDA2.0): a fast ``tokenizer.json``, ``<|mask|>``, ``<|endoftext|>``,
``<|role_end|>`` (docs/MODELS.md)."""
from __future__ import annotations

from ..chat import ChatPrompt
from ..errors import CheckpointError
from .base import Family, Fields, config_fields, tied

#: the turn markers of the Ling tokenizer both releases share (LLaDA2.0's and dInfer's prompts)
DEFAULT_SYSTEM = "detailed thinking off"


def ling_template(p: ChatPrompt) -> str:
    """The fallback chat string (the tokenizer's own template is used when shipped): dInfer's and
    the LLaDA2.0 model card's prompt, ``<role>SYSTEM</role>detailed thinking off<|role_end|>
    <role>HUMAN</role>{user}<|role_end|><role>ASSISTANT</role>``; a given system turn replaces
    the default system text."""
    system = p.system or DEFAULT_SYSTEM
    return (f"<role>SYSTEM</role>{system}<|role_end|><role>HUMAN</role>{p.user}<|role_end|>"
            "<role>ASSISTANT</role>")


MASK_TOKENS = ("<|mask|>",)
STOP_TOKENS = ("<|endoftext|>", "<|role_end|>")


def partial_rope(f: Fields, head_dim: int) -> int | None:
    """``partial_rotary_factor`` -> RoPE channels per head (transformers' default rope init:
    ``int(head_dim * factor)``); None when the whole head rotates."""
    v = f.raw.get("partial_rotary_factor", 1.0)
    if v is None:
        v = 1.0
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
        raise CheckpointError(f"{f.file}: field 'partial_rotary_factor' must be in (0, 1], got {v!r}")
    dim = int(head_dim * v)
    if dim % 2 or dim == 0:
        raise CheckpointError(f"{f.file}: partial_rotary_factor {v} gives {dim} RoPE channels of "
                              f"head_dim {head_dim}; an even, positive count is needed")
    return None if dim == head_dim else dim


def flag(f: Fields, name: str, default: bool = False) -> bool:
    v = f.raw.get(name, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise CheckpointError(f"{f.file}: field {name!r} must be true or false, got {v!r}")
    return v


def check_routing(f: Fields, experts: int, k: int) -> None:
    if k > experts:
        raise CheckpointError(f"{f.file}: num_experts_per_tok={k} exceeds num_experts={experts}")


def read_config(f: Fields) -> dict:
    f.require("hidden_act", (None, "silu"), "the experts are SwiGLU")
    f.require("rope_scaling", (None,), "plain RoPE only")
    f.require("attention_bias", (None, False), "LLaDA-MoE's projections have no biases (o_proj would be biased too)")
    f.require("clip_qkv", (None,), "q/k/v clipping is not implemented")
    d, heads, layers = f.int("hidden_size"), f.int("num_attention_heads"), f.int("num_hidden_layers")
    if f.raw.get("head_dim") not in (None, d // heads):
        raise CheckpointError(f"{f.file}: head_dim={f.raw['head_dim']} != hidden_size / num_attention_heads "
                              f"(modeling_lladamoe.py derives it)")
    experts, k = f.int("num_experts"), f.int("num_experts_per_tok")
    check_routing(f, experts, k)
    freq = f.raw.get("moe_layer_freq")
    if (not isinstance(freq, list) or len(freq) < layers
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in freq)):
        raise CheckpointError(f"{f.file}: field 'moe_layer_freq' must list 0 (dense) or 1 (MoE) for each "
                              f"of the {layers} layers, got {freq!r}")
    dense = [i for i in range(layers) if freq[i] == 0]
    shared = f.raw.get("shared_expert_intermediate_size")
    ids = f.ids("mask_token_id")
    return config_fields(
        "llada_moe", f, d=d, layers=layers, heads=heads,
        kv_heads=f.int("num_key_value_heads", default=heads),
        mlp=f.int("dense_intermediate_size") if dense else f.int("dense_intermediate_size", default=1),
        vocab=f.int("vocab_size"), theta=f.float("rope_theta", 10000.0),
        eps=f.float("rms_norm_eps", 1e-5), bias=False, mask=ids[0] if ids else None, shift=False,
        qk_norm=flag(f, "qk_layernorm"), tie_embeddings=tied(f), rope_dim=partial_rope(f, d // heads),
        n_experts=experts, experts_per_token=k, expert_hidden=f.int("expert_intermediate_size"),
        shared_expert_hidden=0 if shared is None else f.int("shared_expert_intermediate_size"),
        dense_layers=dense, router="softmax_biased",
        router_bias=flag(f, "moe_router_enable_expert_bias"))


_ATTN = {"input_layernorm": "attn_norm", "self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj",
         "self_attn.v_proj": "v_proj", "self_attn.o_proj": "attn_out", "post_attention_layernorm": "ff_norm"}
_DENSE = {"gate_proj": "ff_gate", "up_proj": "ff_up", "down_proj": "ff_down"}
_EXPERT = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down"}


def expert_keys(src: str, dst: str, cfg) -> dict[str, str]:
    """``{src}experts.{e}.{gate,up,down}_proj.weight`` -> ``{dst}experts.{e}.{gate,up,down}.weight``."""
    return {f"{src}experts.{e}.{a}.weight": f"{dst}experts.{e}.{b}.weight"
            for e in range(cfg.n_experts) for a, b in _EXPERT.items()}


def swiglu_keys(src: str, dst: str, names: dict[str, str]) -> dict[str, str]:
    return {f"{src}{a}.weight": f"{dst}{b}.weight" for a, b in names.items()}


def key_map(cfg) -> dict[str, str]:
    m = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "final_norm.weight"}
    if not cfg.tie_embeddings:
        m["lm_head.weight"] = "head.weight"
    for i in range(cfg.n_layers):
        src, dst = f"model.layers.{i}.", f"blocks.{i}."
        m |= swiglu_keys(src, dst, _ATTN)
        if cfg.qk_norm:
            m |= swiglu_keys(src + "self_attn.", dst, {"q_norm": "q_norm", "k_norm": "k_norm"})
        if not cfg.is_moe_layer(i):
            m |= swiglu_keys(src + "mlp.", dst, _DENSE)
            continue
        m[src + "mlp.gate.weight"] = dst + "moe.router.weight"
        if cfg.router_bias:
            m[src + "mlp.expert_bias"] = dst + "moe.expert_bias"
        m |= expert_keys(src + "mlp.", dst + "moe.", cfg)
        if cfg.shared_expert_hidden:  # on the decoder layer, not under mlp
            m |= swiglu_keys(src + "shared_expert.", dst + "moe.shared.", _EXPERT)
    return m


def claims(raw: dict) -> bool:
    """The release's config.json: ``model_type "llada"`` with HF-style MoE fields."""
    t = raw.get("model_type")
    return isinstance(t, str) and t.lower() == "llada" and ("num_experts" in raw or "moe_layer_freq" in raw)


FAMILY = Family(
    name="llada_moe", label="lladamoe (or llada with num_experts) for LLaDA-MoE",
    model_types=("lladamoe", "llada_moe"), read_config=read_config, key_map=key_map,
    chat_template=ling_template, mask_tokens=MASK_TOKENS, stop_tokens=STOP_TOKENS, claims=claims)
