"""SDAR (JetAstra/SDAR: SDAR-1.7B/4B/8B-Chat): Qwen3's layout (per-head q_norm/k_norm, an
explicit ``head_dim``, no biases) under ``model_type "sdar"``, block-causal attention over blocks
of config.json's ``block_size``, unshifted logits, mask token ``<|MASK|>`` (docs/MODELS.md)."""
from __future__ import annotations

from . import qwen
from .base import Family, Fields, config_fields, qwen_widths, tied

#: generate.py's ``--block_length`` default, for a config.json without ``block_size``
DEFAULT_BLOCK_SIZE = 4


def read_config(f: Fields) -> dict:
    f.require("attention_bias", (None, False), "SDAR's projections have no biases")
    w = qwen_widths(f)
    ids = f.ids("mask_token_id")
    return config_fields("sdar", f, **w, bias=False, mask=ids[0] if ids else None, shift=False,
                         attn_head_dim=f.int("head_dim", default=w["d"] // w["heads"]), qk_norm=True,
                         tie_embeddings=tied(f), block_size=f.int("block_size", default=DEFAULT_BLOCK_SIZE))


FAMILY = Family(
    name="sdar", label="sdar for SDAR", model_types=("sdar",), read_config=read_config,
    key_map=qwen.key_map, chat_template=qwen.qwen3_template,
    # tokenizer_config.json names it <|MASK|>; the release's added_tokens.json says <MASK>
    mask_tokens=("<|MASK|>", "<MASK>"), stop_tokens=("<|endoftext|>", "<|im_end|>"),
    bpe_tokenizer=True, attention="block_causal")
