"""What the Qwen-based families share (Dream/DiffuCoder and Fast-dLLM v2 on Qwen2.5, SDAR on
Qwen3): the Qwen2/Qwen3 weight names and the Qwen chat templates (docs/MODELS.md)."""
from __future__ import annotations

from ..chat import ChatPrompt

DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant."  # Qwen2.5's, used by Dream and DiffuCoder

_LAYER = {"input_layernorm": "attn_norm", "self_attn.q_proj": "q_proj", "self_attn.k_proj": "k_proj",
          "self_attn.v_proj": "v_proj", "self_attn.o_proj": "attn_out",
          "post_attention_layernorm": "ff_norm", "mlp.gate_proj": "ff_gate", "mlp.up_proj": "ff_up",
          "mlp.down_proj": "ff_down"}


def key_map(cfg) -> dict[str, str]:
    """Qwen2's keys (``model.layers.{i}.*``), q/k/v biases when the config has them, Qwen3's
    per-head ``q_norm``/``k_norm`` when it has those; no ``lm_head.weight`` when the head is tied
    to the embedding (transformers saves tied weights once)."""
    m = {"model.embed_tokens.weight": "embed.weight", "model.norm.weight": "final_norm.weight"}
    if not cfg.tie_embeddings:
        m["lm_head.weight"] = "head.weight"
    for i in range(cfg.n_layers):
        for src, dst in _LAYER.items():
            m[f"model.layers.{i}.{src}.weight"] = f"blocks.{i}.{dst}.weight"
        if cfg.qkv_bias:
            for p in ("q_proj", "k_proj", "v_proj"):
                m[f"model.layers.{i}.self_attn.{p}.bias"] = f"blocks.{i}.{p}.bias"
        if cfg.qk_norm:
            for p in ("q_norm", "k_norm"):
                m[f"model.layers.{i}.self_attn.{p}.weight"] = f"blocks.{i}.{p}.weight"
    return m


def qwen25_template(p: ChatPrompt) -> str:
    """Qwen2.5: a system turn always, the default one when none is given."""
    system = p.system or DEFAULT_SYSTEM_PROMPT
    return (f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{p.user}<|im_end|>\n"
            f"<|im_start|>assistant\n")


def qwen3_template(p: ChatPrompt) -> str:
    """Qwen3 (SDAR): a system turn only when given; no thinking block (``enable_thinking`` unset)."""
    system = f"<|im_start|>system\n{p.system}<|im_end|>\n" if p.system else ""
    return f"{system}<|im_start|>user\n{p.user}<|im_end|>\n<|im_start|>assistant\n"
