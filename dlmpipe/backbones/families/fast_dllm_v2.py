"""Fast-dLLM v2 (NVlabs/Fast-dLLM v2; Fast_dLLM_v2_1.5B/7B): Qwen2.5's layout (q/k/v biases)
under ``model_type "Fast_dLLM_Qwen"``, block-causal attention over blocks of config.json's
``bd_size``, shifted logits (token j from row j - 1), mask token ``|<MASK>|`` (docs/MODELS.md)."""
from __future__ import annotations

from . import qwen
from .base import Family, Fields, config_fields, qwen_widths, tied

#: Fast_dLLM_QwenConfig's ``bd_size`` default
DEFAULT_BLOCK_SIZE = 32


def read_config(f: Fields) -> dict:
    layer_types = f.raw.get("layer_types")
    if layer_types is not None and (not isinstance(layer_types, list)
                                    or any(t != "full_attention" for t in layer_types)):
        f.require("layer_types", (None,), "every layer must be full_attention (no sliding window)")
    w = qwen_widths(f)
    ids = f.ids("mask_token_id")
    head_dim = f.int("head_dim", default=w["d"] // w["heads"])
    return config_fields("fast_dllm_v2", f, **w, bias=True, mask=ids[0] if ids else None, shift=True,
                         attn_head_dim=head_dim, tie_embeddings=tied(f),
                         block_size=f.int("bd_size", default=DEFAULT_BLOCK_SIZE))


FAMILY = Family(
    name="fast_dllm_v2", label="Fast_dLLM_Qwen for Fast-dLLM v2", model_types=("fast_dllm_qwen",),
    read_config=read_config, key_map=qwen.key_map, chat_template=qwen.qwen25_template,
    mask_tokens=("|<MASK>|",), stop_tokens=("<|endoftext|>", "<|im_end|>"),
    bpe_tokenizer=True, attention="block_causal")
