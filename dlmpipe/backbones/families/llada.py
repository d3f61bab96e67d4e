"""LLaDA (LLaDA-8B-Instruct, LLaDA-8B-Base, LLaDA-1.5): OLMo-style config.json and
``model.transformer.*`` keys, a fast tokenizer.json, Llama-3 chat headers (docs/MODELS.md)."""
from __future__ import annotations

from ..chat import ChatPrompt, messages
from .base import Family, Fields, config_fields


def read_config(f: Fields) -> dict:
    f.require("block_type", (None, "llama"), "only LLaDA's Llama-style block is implemented")
    f.require("activation_type", (None, "silu", "swiglu"), "the FFN is SwiGLU")
    f.require("layer_norm_type", (None, "rms"), "the norms are RMSNorm")
    for flag, why in [("include_bias", "no biases in LLaDA"), ("alibi", "RoPE only"),
                      ("weight_tying", "the LM head is untied"), ("attention_layer_norm", "no q/k norm"),
                      ("scale_logits", "logits are not scaled"), ("input_emb_norm", "no embedding norm")]:
        f.require(flag, (None, False), why)
    f.require("rope", (None, True), "LLaDA uses RoPE")
    d, heads = f.int("d_model"), f.int("n_heads")
    kv_heads = 1 if f.raw.get("multi_query_attention") else f.int("n_kv_heads", default=heads)
    mlp = f.int("mlp_hidden_size", default=0) or f.int("mlp_ratio") * d
    ids = f.ids("mask_token_id")
    return config_fields("llada", f, d=d, layers=f.int("n_layers"), heads=heads, kv_heads=kv_heads,
                         mlp=mlp, vocab=f.int("embedding_size", "vocab_size"),
                         theta=f.float("rope_theta", 10000.0), eps=f.float("rms_norm_eps", 1e-5),
                         bias=bool(f.raw.get("include_qkv_bias", False)), mask=ids[0] if ids else None,
                         shift=False)


# Naming trap: ff_proj is the gate, up_proj the up projection, the block's ff_out the down.
_BLOCK = {"attn_norm": "attn_norm", "q_proj": "q_proj", "k_proj": "k_proj", "v_proj": "v_proj",
          "attn_out": "attn_out", "ff_norm": "ff_norm", "ff_proj": "ff_gate", "up_proj": "ff_up",
          "ff_out": "ff_down"}


def key_map(cfg) -> dict[str, str]:
    t = "model.transformer."
    m = {t + "wte.weight": "embed.weight", t + "ln_f.weight": "final_norm.weight",
         t + "ff_out.weight": "head.weight"}
    for i in range(cfg.n_layers):
        for src, dst in _BLOCK.items():
            m[f"{t}blocks.{i}.{src}.weight"] = f"blocks.{i}.{dst}.weight"
        if cfg.qkv_bias:
            for p in ("q_proj", "k_proj", "v_proj"):
                m[f"{t}blocks.{i}.{p}.bias"] = f"blocks.{i}.{p}.bias"
    return m


def chat_template(p: ChatPrompt) -> str:
    """LLaDA-8B-Instruct (Llama-3 headers, contents stripped as its template does)."""
    turns = "".join(f"<|start_header_id|>{m['role']}<|end_header_id|>\n\n{m['content'].strip()}<|eot_id|>"
                    for m in messages(p))
    return "<|startoftext|>" + turns + "<|start_header_id|>assistant<|end_header_id|>\n\n"


FAMILY = Family(
    name="llada", label="llada for LLaDA", model_types=("llada",), read_config=read_config,
    key_map=key_map, chat_template=chat_template, mask_tokens=("<|mdm_mask|>",),
    stop_tokens=("<|endoftext|>", "<|eot_id|>"))
