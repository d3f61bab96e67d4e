"""Dream (Dream-v0-Instruct-7B, DiffuCoder-7B): Qwen2.5's layout and config.json with
``model_type "Dream"``, shifted logits, a remote-code ``DreamTokenizer`` that is Qwen2's BPE
(docs/MODELS.md)."""
from __future__ import annotations

from ..errors import CheckpointError
from . import qwen
from .base import Family, Fields, config_fields


def read_config(f: Fields) -> dict:
    f.require("hidden_act", (None, "silu"), "the FFN is SwiGLU")
    f.require("tie_word_embeddings", (None, False), "the LM head is untied")
    f.require("rope_scaling", (None,), "plain RoPE only")
    f.require("use_sliding_window", (None, False), "full attention only")
    d, heads = f.int("hidden_size"), f.int("num_attention_heads")
    if f.raw.get("head_dim") not in (None, d // heads):
        raise CheckpointError(f"{f.file}: head_dim={f.raw['head_dim']} != hidden_size / num_attention_heads")
    ids = f.ids("mask_token_id")
    return config_fields("dream", f, d=d, layers=f.int("num_hidden_layers"), heads=heads,
                         kv_heads=f.int("num_key_value_heads", default=heads),
                         mlp=f.int("intermediate_size"), vocab=f.int("vocab_size"),
                         theta=f.float("rope_theta", 10000.0), eps=f.float("rms_norm_eps", 1e-6),
                         bias=True, mask=ids[0] if ids else None, shift=True)


FAMILY = Family(
    name="dream", label="Dream or qwen2 for Dream/DiffuCoder", model_types=("dream", "qwen2"),
    read_config=read_config, key_map=qwen.key_map, chat_template=qwen.qwen25_template,
    mask_tokens=("<|mask|>",), stop_tokens=("<|endoftext|>", "<|im_end|>", "<|dlm_pad|>"),
    pad_tokens=("<|dlm_pad|>",),  # DiffuCoder pads its answers with <|dlm_pad|>
    bpe_tokenizer=True)
