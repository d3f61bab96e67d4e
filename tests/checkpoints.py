"""Tiny random checkpoints in each family's exact on-disk format, for tests.

The files look like the real ones (see docs/MODELS.md): LLaDA's config.json fields,
``model.transformer.*`` keys and a ``tokenizer.json`` fast tokenizer with ``auto_map`` in
config.json; Dream's Qwen2 config fields (``model_type "Dream"``), ``model.layers.*`` keys with
q/k/v biases, and a byte-level BPE given only as vocab.json + merges.txt + a tokenizer_config.json
that names the remote-code ``DreamTokenizer`` (no tokenizer.json), with ``<|mask|>`` and friends
as added tokens; DiffuCoder adds ``<|dlm_pad|>``. The block-diffusion families (block_checkpoint):
SDAR's Qwen3 files (``model_type "sdar"``, ``block_size``, an explicit ``head_dim``, per-head
q_norm/k_norm, vocab.json + merges.txt + tokenizer.json, ``<|MASK|>`` in tokenizer_config.json but
``<MASK>`` in added_tokens.json, as released) and Fast-dLLM v2's Qwen2.5 files (``model_type
"Fast_dLLM_Qwen"``, ``bd_size``, ``layer_types``, ``|<MASK>|``, the chat template only in
chat_template.jinja). Special ids are small, but not adjacent, so a hard-coded id would show. Everything here is written independently of ``dlmpipe``'s key maps,
so loading these files tests the loader rather than agreeing with it.

Deterministic (same bytes for the same arguments) and fast (a few ms for the default sizes).
"""
from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import torch
from safetensors.torch import save_file

LLADA_CHAT_TEMPLATE = (
    "{% set loop_messages = messages %}{% for message in loop_messages %}"
    "{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'"
    "+ message['content'] | trim + '<|eot_id|>' %}"
    "{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}"
)
QWEN_CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Qwen2.5's added tokens in id order (151643...), then Dream's and DiffuCoder's.
QWEN_ADDED = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
              "<|object_ref_end|>", "<|box_start|>", "<|box_end|>", "<|quad_start|>",
              "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
              "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>",
              "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
QWEN_NOT_SPECIAL = {"<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
                    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"}
DREAM_ADDED = ["<|beginoftext|>", "<|mask|>"]
DIFFUCODER_ADDED = ["<|dlm_pad|>"]

# LLaDA's specials sit far apart in its vocabulary (bos 126080, eos 126081, mask 126336,
# eot 126348); here they are spread out with reserved tokens in between.
LLADA_SPECIALS = ["<|startoftext|>", "<|endoftext|>"] + [f"<|reserved_token_{i}|>" for i in range(5)] \
    + ["<|mdm_mask|>", "<|start_header_id|>", "<|end_header_id|>", "<|reserved_token_5|>", "<|eot_id|>"]

CORPUS = (
    "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(i)\n"
    "The quick brown fox jumps over the lazy dog. Write a function that returns the sum.\n"
    "You are a helpful assistant. Here is the completed function:\n```python\n"
    "if x is not None and len(x) > 0:\n        result = [y for y in x if y % 2 == 0]\n"
)


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table used by byte-level BPE (Qwen2, LLaDA)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) \
        + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def byte_level_bpe(n_merges: int = 64) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A small byte-level BPE learned greedily on a fixed corpus (ties broken by the pair)."""
    table = bytes_to_unicode()
    vocab = {table[b]: i for i, b in enumerate(sorted(table, key=lambda b: ord(table[b])))}
    words = Counter()
    for i, w in enumerate(CORPUS.split(" ")):
        words[tuple(table[b] for b in ((" " if i else "") + w).encode())] += 1
    merges: list[tuple[str, str]] = []
    for _ in range(n_merges):
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        vocab[best[0] + best[1]] = len(vocab)
        merged = Counter()
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and (w[i], w[i + 1]) == best:
                    out.append(w[i] + w[i + 1])
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += c
        words = merged
    return vocab, merges


def _added_entry(content: str, special: bool = True) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": special}


def write_llada_tokenizer(out: Path) -> dict[str, int]:
    """tokenizer.json (byte-level BPE + LLaDA's specials) and tokenizer_config.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab, merges = byte_level_bpe()
    for t in LLADA_SPECIALS:
        vocab[t] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LLADA_SPECIALS])
    tok.save(str(out / "tokenizer.json"))
    config = {
        "added_tokens_decoder": {str(vocab[t]): _added_entry(t) for t in LLADA_SPECIALS},
        "bos_token": "<|startoftext|>",
        "chat_template": LLADA_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 1000000000000000019884624838656,
        "pad_token": "<|endoftext|>",
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        indent=2))
    return {t: vocab[t] for t in LLADA_SPECIALS}


def write_dream_tokenizer(out: Path, diffucoder: bool = False) -> dict[str, int]:
    """vocab.json + merges.txt + tokenizer_config.json naming DreamTokenizer (remote code)."""
    vocab, merges = byte_level_bpe()
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    added = QWEN_ADDED + DREAM_ADDED + (DIFFUCODER_ADDED if diffucoder else [])
    ids = {t: len(vocab) + i for i, t in enumerate(added)}
    config = {
        "add_prefix_space": False,
        "added_tokens_decoder": {str(ids[t]): _added_entry(t, t not in QWEN_NOT_SPECIAL) for t in added},
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|object_ref_start|>",
                                      "<|object_ref_end|>", "<|box_start|>", "<|box_end|>",
                                      "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
                                      "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>",
                                      "<|video_pad|>"],
        "auto_map": {"AutoTokenizer": ["tokenization_dream.DreamTokenizer", None]},
        "bos_token": "<|beginoftext|>",
        "chat_template": QWEN_CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "mask_token": "<|mask|>",
        "model_max_length": 131072,
        "pad_token": "<|dlm_pad|>" if diffucoder else "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "DreamTokenizer",
        "unk_token": None,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|beginoftext|>", "eos_token": "<|endoftext|>", "mask_token": "<|mask|>",
         "pad_token": config["pad_token"]}, indent=2))
    return ids


def llada_tensors(d: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int,
                  g: torch.Generator) -> dict[str, torch.Tensor]:
    hd = d // heads
    shapes = {"model.transformer.wte.weight": (vocab, d)}
    for i in range(layers):
        b = f"model.transformer.blocks.{i}."
        shapes |= {b + "attn_norm.weight": (d,), b + "q_proj.weight": (heads * hd, d),
                   b + "k_proj.weight": (kv_heads * hd, d), b + "v_proj.weight": (kv_heads * hd, d),
                   b + "attn_out.weight": (d, heads * hd), b + "ff_norm.weight": (d,),
                   b + "ff_proj.weight": (mlp, d), b + "up_proj.weight": (mlp, d),
                   b + "ff_out.weight": (d, mlp)}
    shapes |= {"model.transformer.ln_f.weight": (d,), "model.transformer.ff_out.weight": (vocab, d)}
    return {k: _init(k, s, g) for k, s in shapes.items()}


def dream_tensors(d: int, layers: int, heads: int, kv_heads: int, mlp: int, vocab: int,
                  g: torch.Generator) -> dict[str, torch.Tensor]:
    hd = d // heads
    shapes = {"model.embed_tokens.weight": (vocab, d)}
    for i in range(layers):
        b = f"model.layers.{i}."
        shapes |= {b + "input_layernorm.weight": (d,),
                   b + "self_attn.q_proj.weight": (heads * hd, d), b + "self_attn.q_proj.bias": (heads * hd,),
                   b + "self_attn.k_proj.weight": (kv_heads * hd, d), b + "self_attn.k_proj.bias": (kv_heads * hd,),
                   b + "self_attn.v_proj.weight": (kv_heads * hd, d), b + "self_attn.v_proj.bias": (kv_heads * hd,),
                   b + "self_attn.o_proj.weight": (d, heads * hd),
                   b + "post_attention_layernorm.weight": (d,),
                   b + "mlp.gate_proj.weight": (mlp, d), b + "mlp.up_proj.weight": (mlp, d),
                   b + "mlp.down_proj.weight": (d, mlp)}
    shapes |= {"model.norm.weight": (d,), "lm_head.weight": (vocab, d)}
    return {k: _init(k, s, g) for k, s in shapes.items()}


def _init(key: str, shape: tuple, g: torch.Generator) -> torch.Tensor:
    """Random but well-scaled: norms near 1, biases small, matrices ~ 1/sqrt(fan_in)."""
    if len(shape) == 1:
        base = 1.0 if key.endswith(("norm.weight", "ln_f.weight")) else 0.0
        return base + 0.1 * torch.randn(shape, generator=g)
    fan_in = shape[1]
    std = 1.0 if ("wte" in key or "embed_tokens" in key) else fan_in ** -0.5
    return std * torch.randn(shape, generator=g)


def write_weights(out: Path, tensors: dict[str, torch.Tensor], n_shards: int) -> None:
    """Single ``model.safetensors``, or ``model-0000i-of-0000n.safetensors`` + the index."""
    if n_shards <= 1:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
        return
    keys = list(tensors)  # layer order, as HF shards them
    per = math.ceil(len(keys) / n_shards)
    weight_map, total = {}, 0
    for s in range(n_shards):
        name = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        chunk = {k: tensors[k] for k in keys[s * per:(s + 1) * per]}
        save_file(chunk, str(out / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in chunk})
        total += sum(t.numel() * t.element_size() for t in chunk.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def make_tiny_checkpoint(dir: str | Path, family: str = "llada", sharded: bool = True, *,
                         d_model: int = 64, n_layers: int = 2, n_heads: int = 4,
                         n_kv_heads: int | None = None, mlp_hidden: int = 96,
                         vocab_size: int | None = None, n_shards: int = 3, seed: int = 0,
                         dtype: str = "float32") -> Path:
    """Write a tiny random checkpoint of ``family`` ("llada", "dream", "diffucoder", "sdar" or
    "fast_dllm_v2") to ``dir``.

    ``n_kv_heads`` defaults to ``n_heads`` for LLaDA and ``n_heads // 2`` (GQA) for Dream.
    ``vocab_size`` defaults to the tokenizer's size rounded up to 64 (real checkpoints pad their
    embedding beyond the tokenizer too). Returns ``dir``.
    """
    if family in MOE_FAMILIES:
        return moe_checkpoint(dir, family, sharded, d_model=d_model, n_layers=n_layers,
                              n_heads=n_heads, n_kv_heads=n_kv_heads, mlp_hidden=mlp_hidden,
                              vocab_size=vocab_size, n_shards=n_shards, seed=seed, dtype=dtype)
    if family in BLOCK_FAMILIES:
        return block_checkpoint(dir, family, sharded, d_model=d_model, n_layers=n_layers,
                                n_heads=n_heads, n_kv_heads=n_kv_heads, mlp_hidden=mlp_hidden,
                                vocab_size=vocab_size, n_shards=n_shards, seed=seed, dtype=dtype)
    if family not in ("llada", "dream", "diffucoder"):
        raise ValueError(f"unknown family {family!r}")
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    if family == "llada":
        ids = write_llada_tokenizer(out)
        n_kv = n_kv_heads or n_heads
        vocab = vocab_size or 64 * math.ceil((max(ids.values()) + 1) / 64)
        tensors = llada_tensors(d_model, n_layers, n_heads, n_kv, mlp_hidden, vocab, g)
        config = llada_config(d_model, n_layers, n_heads, n_kv, mlp_hidden, vocab, ids, dtype)
        generation = {"bos_token_id": ids["<|startoftext|>"], "eos_token_id": ids["<|endoftext|>"],
                      "pad_token_id": ids["<|endoftext|>"]}
    else:
        ids = write_dream_tokenizer(out, diffucoder=family == "diffucoder")
        n_kv = n_kv_heads or max(1, n_heads // 2)
        vocab = vocab_size or 64 * math.ceil((max(ids.values()) + 1) / 64)
        tensors = dream_tensors(d_model, n_layers, n_heads, n_kv, mlp_hidden, vocab, g)
        config = dream_config(d_model, n_layers, n_heads, n_kv, mlp_hidden, vocab, ids, dtype)
        generation = {"bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|endoftext|>"],
                      "pad_token_id": ids["<|endoftext|>"]}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        generation | {"_from_model_config": True, "transformers_version": "4.46.2"}, indent=2))
    write_weights(out, {k: v.to(torch_dtype) for k, v in tensors.items()}, n_shards if sharded else 1)
    return out


def llada_config(d, layers, heads, kv_heads, mlp, vocab, ids, dtype) -> dict:
    """LLaDA-8B-Instruct's config.json fields at tiny sizes."""
    return {
        "activation_type": "silu", "alibi": False, "alibi_bias_max": 8.0,
        "architectures": ["LLaDAModelLM"], "attention_dropout": 0.0, "attention_layer_norm": False,
        "attention_layer_norm_with_affine": True,
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModel": "modeling_llada.LLaDAModelLM",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
        "bias_for_layer_norm": False, "block_group_size": 1, "block_type": "llama",
        "d_model": d, "embedding_dropout": 0.0, "embedding_size": vocab,
        "eos_token_id": ids["<|endoftext|>"], "flash_attention": False, "include_bias": False,
        "include_qkv_bias": False, "init_cutoff_factor": None, "init_device": "meta",
        "init_fn": "mitchell", "init_std": 0.02, "input_emb_norm": False, "layer_norm_type": "rms",
        "layer_norm_with_affine": True, "mask_token_id": ids["<|mdm_mask|>"],
        "max_sequence_length": 4096, "mlp_hidden_size": mlp, "mlp_ratio": 4, "model_type": "llada",
        "multi_query_attention": None, "n_heads": heads, "n_kv_heads": kv_heads, "n_layers": layers,
        "pad_token_id": ids["<|endoftext|>"], "precision": "amp_bf16", "residual_dropout": 0.0,
        "rms_norm_eps": 1e-05, "rope": True, "rope_full_precision": True, "rope_theta": 500000.0,
        "scale_logits": False, "torch_dtype": dtype, "transformers_version": "4.46.3",
        "use_cache": False, "vocab_size": vocab, "weight_tying": False,
    }


def dream_config(d, layers, heads, kv_heads, mlp, vocab, ids, dtype) -> dict:
    """Dream-v0-Instruct-7B's config.json fields at tiny sizes."""
    return {
        "architectures": ["DreamModel"], "attention_dropout": 0.0,
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig",
                     "AutoModel": "modeling_dream.DreamModel"},
        "bos_token_id": ids["<|endoftext|>"], "eos_token_id": ids["<|endoftext|>"],
        "hidden_act": "silu", "hidden_size": d, "initializer_range": 0.02,
        "intermediate_size": mlp, "mask_token_id": ids["<|mask|>"],
        "max_position_embeddings": 131072, "max_window_layers": layers, "model_type": "Dream",
        "num_attention_heads": heads, "num_hidden_layers": layers, "num_key_value_heads": kv_heads,
        "pad_token_id": ids["<|endoftext|>"], "rms_norm_eps": 1e-06, "rope_scaling": None,
        "rope_theta": 1000000.0, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": dtype, "transformers_version": "4.46.2", "use_cache": False,
        "use_sliding_window": False, "vocab_size": vocab,
    }


# ---- block-diffusion families: SDAR (Qwen3) and Fast-dLLM v2 (Qwen2.5) ----------------------
BLOCK_FAMILIES = ("sdar", "fast_dllm_v2")
QWEN3_ADDED = QWEN_ADDED + ["<tool_response>", "</tool_response>", "<think>", "</think>"]
QWEN3_NOT_SPECIAL = QWEN_NOT_SPECIAL | set(QWEN3_ADDED[len(QWEN_ADDED):])
QWEN3_CHAT_TEMPLATE = (  # SDAR-4B-Chat's chat_template.jinja without its tool and thinking branches
    "{%- if messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}"
    "{%- for message in messages %}"
    "{%- if (message.role == 'user') or (message.role == 'system' and not loop.first) %}"
    "{{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}"
    "{{- '<think>\\n\\n</think>\\n\\n' }}{%- endif %}{%- endif %}"
)


def write_qwen_tokenizer(out: Path, added: list[str], not_special: set[str], config: dict,
                         legacy_added: dict[str, int] | None = None, fast: bool = False) -> dict[str, int]:
    """vocab.json + merges.txt (+ tokenizer.json when ``fast``), tokenizer_config.json with
    ``added_tokens_decoder`` and the given fields, added_tokens.json (``legacy_added`` overrides
    names there, as SDAR's release does)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab, merges = byte_level_bpe()
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (out / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    ids = {t: len(vocab) + i for i, t in enumerate(added)}
    if fast:
        tok = Tokenizer(models.BPE(vocab=dict(vocab), merges=merges))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        tok.add_tokens([AddedToken(t, special=t not in not_special, normalized=False) for t in added])
        tok.save(str(out / "tokenizer.json"))
    config = {"added_tokens_decoder": {str(ids[t]): _added_entry(t, t not in not_special) for t in added},
              **config}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    renamed = set((legacy_added or {}).values())
    legacy = {t: i for t, i in ids.items() if i not in renamed} | (legacy_added or {})
    (out / "added_tokens.json").write_text(json.dumps(legacy, indent=2))
    specials = {k: config[k] for k in ("eos_token", "pad_token", "mask_token") if config.get(k)}
    (out / "special_tokens_map.json").write_text(json.dumps(
        specials | {"additional_special_tokens": config["additional_special_tokens"]}, indent=2))
    return ids


def qwen_tensors(d: int, layers: int, heads: int, kv_heads: int, head_dim: int, mlp: int, vocab: int,
                 g: torch.Generator, *, biases: bool, qk_norm: bool, tied: bool) -> dict[str, torch.Tensor]:
    """Qwen2 (biases) or Qwen3 (q_norm/k_norm) keys, with an explicit head width."""
    shapes = {"model.embed_tokens.weight": (vocab, d)}
    for i in range(layers):
        b = f"model.layers.{i}."
        shapes |= {b + "input_layernorm.weight": (d,),
                   b + "self_attn.q_proj.weight": (heads * head_dim, d),
                   b + "self_attn.k_proj.weight": (kv_heads * head_dim, d),
                   b + "self_attn.v_proj.weight": (kv_heads * head_dim, d),
                   b + "self_attn.o_proj.weight": (d, heads * head_dim),
                   b + "post_attention_layernorm.weight": (d,),
                   b + "mlp.gate_proj.weight": (mlp, d), b + "mlp.up_proj.weight": (mlp, d),
                   b + "mlp.down_proj.weight": (d, mlp)}
        if biases:
            shapes |= {b + "self_attn.q_proj.bias": (heads * head_dim,),
                       b + "self_attn.k_proj.bias": (kv_heads * head_dim,),
                       b + "self_attn.v_proj.bias": (kv_heads * head_dim,)}
        if qk_norm:
            shapes |= {b + "self_attn.q_norm.weight": (head_dim,), b + "self_attn.k_norm.weight": (head_dim,)}
    shapes |= {"model.norm.weight": (d,)} | ({} if tied else {"lm_head.weight": (vocab, d)})
    return {k: _init(k, s, g) for k, s in shapes.items()}


def block_checkpoint(dir: str | Path, family: str, sharded: bool = True, *, d_model: int = 64,
                     n_layers: int = 2, n_heads: int = 4, n_kv_heads: int | None = None,
                     mlp_hidden: int = 96, vocab_size: int | None = None, n_shards: int = 3,
                     seed: int = 0, dtype: str = "float32", block_size: int | None = None,
                     head_dim: int | None = None, tied: bool = False) -> Path:
    """A tiny SDAR or Fast-dLLM v2 checkpoint in its release's files (module docstring).

    SDAR's head width defaults to 2 * d_model / n_heads (the real 4B: 128 at width 2560 / 32
    heads), so a reader that derives it from the width fails; block sizes default small (SDAR 4,
    Fast-dLLM v2 8) so a 23-token test sequence spans several blocks and a partial one."""
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    n_kv = n_kv_heads or max(1, n_heads // 2)
    if family == "sdar":
        ids = write_qwen_tokenizer(out, QWEN3_ADDED + ["<|MASK|>"], QWEN3_NOT_SPECIAL, {
            "add_bos_token": False, "add_prefix_space": False,
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<|MASK|>"],
            "auto_map": {"AutoTokenizer": ["tokenization_qwen2.Qwen2Tokenizer", None]},
            "bos_token": None, "chat_template": QWEN3_CHAT_TEMPLATE, "clean_up_tokenization_spaces": False,
            "eos_token": "<|endoftext|>", "errors": "replace", "mask_token": "<|MASK|>",
            "model_max_length": 131072, "pad_token": "<|endoftext|>", "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer", "unk_token": None},
            legacy_added={"<MASK>": len(byte_level_bpe()[0]) + len(QWEN3_ADDED)}, fast=True)
        (out / "chat_template.jinja").write_text(QWEN3_CHAT_TEMPLATE)
        hd = head_dim or 2 * d_model // n_heads
        vocab = vocab_size or 64 * math.ceil((max(ids.values()) + 1) / 64)
        tensors = qwen_tensors(d_model, n_layers, n_heads, n_kv, hd, mlp_hidden, vocab, g,
                               biases=False, qk_norm=True, tied=tied)
        config = {
            "architectures": ["SDARForCausalLM"],
            "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                         "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
            "attention_bias": False, "attention_dropout": 0.0, "attn_implementation": "flex_attention",
            "bos_token_id": ids["<|endoftext|>"], "debug": False, "eos_token_id": ids["<|endoftext|>"],
            "block_size": block_size or 4, "mask_token_id": ids["<|MASK|>"], "ep_size": 1,
            "fuse_cross_entropy": True, "head_dim": hd, "hidden_act": "silu", "hidden_size": d_model,
            "initializer_range": 0.02, "intermediate_size": mlp_hidden, "max_position_embeddings": 32768,
            "max_window_layers": n_layers, "micro_forward": False, "model_type": "sdar",
            "num_attention_heads": n_heads, "num_hidden_layers": n_layers, "num_key_value_heads": n_kv,
            "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000, "skip_checkpoint": False,
            "sliding_window": None, "tie_word_embeddings": tied, "torch_dtype": dtype,
            "transformers_version": "4.52.4", "use_cache": False, "use_deepep": False,
            "use_sliding_window": False, "vocab_size": vocab}
        generation = {"bos_token_id": ids["<|endoftext|>"], "do_sample": True,
                      "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                      "pad_token_id": ids["<|endoftext|>"], "temperature": 0.6, "top_k": 20, "top_p": 0.95}
    elif family == "fast_dllm_v2":
        ids = write_qwen_tokenizer(out, QWEN_ADDED + ["|<MASK>|"], QWEN_NOT_SPECIAL, {
            "add_bos_token": False, "add_prefix_space": False, "additional_special_tokens": ["|<MASK>|"],
            "bos_token": None, "clean_up_tokenization_spaces": False, "eos_token": "<|im_end|>",
            "errors": "replace", "extra_special_tokens": {}, "model_max_length": 131072,
            "pad_token": "<|endoftext|>", "padding_side": "right", "split_special_tokens": False,
            "tokenizer_class": "Qwen2Tokenizer", "unk_token": None})
        (out / "chat_template.jinja").write_text(QWEN_CHAT_TEMPLATE)
        hd = head_dim or d_model // n_heads
        vocab = vocab_size or 64 * math.ceil((max(ids.values()) + 1) / 64)
        tensors = qwen_tensors(d_model, n_layers, n_heads, n_kv, hd, mlp_hidden, vocab, g,
                               biases=True, qk_norm=False, tied=tied)
        config = {
            "architectures": ["Fast_dLLM_QwenForCausalLM"], "attention_dropout": 0.0,
            "auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig",
                         "AutoModel": "modeling.Fast_dLLM_QwenModel",
                         "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
            "bd_size": block_size or 8, "bos_token_id": ids["<|endoftext|>"], "conplemenrary_mask": True,
            "eos_token_id": ids["<|im_end|>"], "hidden_act": "silu", "hidden_size": d_model,
            "initializer_range": 0.02, "intermediate_size": mlp_hidden,
            "layer_types": ["full_attention"] * n_layers, "max_position_embeddings": 32768,
            "max_window_layers": n_layers, "model_type": "Fast_dLLM_Qwen", "num_attention_heads": n_heads,
            "num_hidden_layers": n_layers, "num_key_value_heads": n_kv, "pad_token_id": ids["<|im_end|>"],
            "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "sliding_window": None,
            "tie_word_embeddings": tied, "torch_dtype": dtype, "transformers_version": "4.53.1",
            "use_cache": True, "use_sliding_window": False, "vocab_size": vocab}
        generation = {"bos_token_id": ids["<|endoftext|>"], "do_sample": True,
                      "eos_token_id": [ids["<|im_end|>"], ids["<|endoftext|>"]],
                      "pad_token_id": ids["<|endoftext|>"], "repetition_penalty": 1.05,
                      "temperature": 0.7, "top_k": 20, "top_p": 0.8}
    else:
        raise ValueError(f"unknown block-diffusion family {family!r}")
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        generation | {"transformers_version": config["transformers_version"]}, indent=2))
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    write_weights(out, {k: v.to(torch_dtype) for k, v in tensors.items()}, n_shards if sharded else 1)
    return out


# ---- mixture-of-experts families: LLaDA-MoE and LLaDA2.0 (the Ling tokenizer) -----------------
MOE_FAMILIES = ("llada_moe", "llada2")
# The Ling tokenizer's specials (eos <|endoftext|> 156892, mask <|mask|> 156895, <|role_end|>):
# spread with reserved tokens in between, as in the release
LING_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|reserved_token_0|>", "<|reserved_token_1|>",
                 "<|mask|>", "<role>", "</role>", "<|reserved_token_2|>", "<|role_end|>"]
LING_CHAT_TEMPLATE = (  # LLaDA2.0's: a SYSTEM turn ('detailed thinking off' by default), HUMAN, ASSISTANT
    "{{ '<role>SYSTEM</role>' }}{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}"
    "{% else %}{{ 'detailed thinking off' }}{% endif %}{{ '<|role_end|>' }}"
    "{% for message in messages %}{% if message['role'] == 'user' %}"
    "{{ '<role>HUMAN</role>' + message['content'] + '<|role_end|>' }}"
    "{% elif message['role'] == 'assistant' %}{{ '<role>ASSISTANT</role>' + message['content'] + '<|role_end|>' }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<role>ASSISTANT</role>' }}{% endif %}"
)


def write_ling_tokenizer(out: Path) -> dict[str, int]:
    """tokenizer.json (byte-level BPE + the Ling specials), tokenizer_config.json (fast tokenizer,
    the chat template), special_tokens_map.json."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    vocab, merges = byte_level_bpe()
    for t in LING_SPECIALS:
        vocab[t] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in LING_SPECIALS])
    tok.save(str(out / "tokenizer.json"))
    config = {"added_tokens_decoder": {str(vocab[t]): _added_entry(t) for t in LING_SPECIALS},
              "bos_token": "<|startoftext|>", "chat_template": LING_CHAT_TEMPLATE,
              "clean_up_tokenization_spaces": False, "eos_token": "<|endoftext|>",
              "mask_token": "<|mask|>", "model_max_length": 32768, "pad_token": "<|endoftext|>",
              "tokenizer_class": "PreTrainedTokenizerFast"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "mask_token": "<|mask|>",
         "pad_token": "<|endoftext|>"}, indent=2))
    return {t: vocab[t] for t in LING_SPECIALS}


def _swiglu(prefix: str, d: int, hidden: int) -> dict[str, tuple]:
    return {prefix + "gate_proj.weight": (hidden, d), prefix + "up_proj.weight": (hidden, d),
            prefix + "down_proj.weight": (d, hidden)}


def moe_checkpoint(dir: str | Path, family: str, sharded: bool = True, *, d_model: int = 64,
                   n_layers: int = 2, n_heads: int = 4, n_kv_heads: int | None = None,
                   mlp_hidden: int = 96, vocab_size: int | None = None, n_shards: int = 3, seed: int = 0,
                   dtype: str = "float32", n_experts: int = 8, top_k: int = 2, expert_hidden: int = 32,
                   shared: bool = True, expert_bias: bool = True, **overrides) -> Path:
    """A tiny LLaDA-MoE or LLaDA2.0 checkpoint in its release's files: config.json fields of the
    release's config class, the release's weight names (LLaDA2.0's fused query_key_value), the Ling
    tokenizer. LLaDA-MoE: every layer MoE (moe_layer_freq all 1), a shared expert on the layer,
    expert bias, model_type "llada" as released. LLaDA2.0: layer 0 dense (first_k_dense_replace
    1), head_dim 16 with partial_rotary_factor 0.5, grouped routing (4 groups, 2 kept), one shared
    expert, routed_scaling_factor 2.5. ``overrides`` replace config.json fields (tests of
    malformed files). Expert biases are random, so they change the routing."""
    out = Path(dir)
    out.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(seed)
    ids = write_ling_tokenizer(out)
    vocab = vocab_size or 64 * math.ceil((max(ids.values()) + 1) / 64)
    n_kv = n_kv_heads or max(1, n_heads // 2)
    d = d_model
    common = {"eos_token_id": ids["<|endoftext|>"], "pad_token_id": ids["<|endoftext|>"],
              "hidden_act": "silu", "hidden_size": d, "initializer_range": 0.02,
              "max_position_embeddings": 8192, "num_attention_heads": n_heads,
              "num_hidden_layers": n_layers, "num_key_value_heads": n_kv, "num_experts": n_experts,
              "num_experts_per_tok": top_k, "rope_scaling": None, "tie_word_embeddings": False,
              "torch_dtype": dtype, "use_cache": False, "vocab_size": vocab}
    if family == "llada_moe":
        hd = d // n_heads
        config = common | {
            "architectures": ["LLaDAMoEModelLM"], "model_type": "llada",
            "auto_map": {"AutoConfig": "configuration_lladamoe.LLaDAConfig",
                         "AutoModel": "modeling_lladamoe.LLaDAMoEModelLM",
                         "AutoModelForCausalLM": "modeling_lladamoe.LLaDAMoEModelLM"},
            "attention_bias": False, "attention_dropout": 0.0, "clip_qkv": None,
            "dense_intermediate_size": mlp_hidden, "expert_intermediate_size": expert_hidden,
            "shared_expert_intermediate_size": expert_hidden if shared else None,
            "moe_layer_freq": [1] * n_layers, "moe_router_enable_expert_bias": expert_bias,
            "moe_router_score_function": "softmax", "norm_topk_prob": False,
            "output_router_logits": False, "partial_rotary_factor": 1, "qk_layernorm": True,
            "rms_norm_eps": 1e-05, "rope_theta": 50000, "routed_scaling_factor": 1,
            "router_aux_loss_coef": 0.01, "router_num_group": None, "router_topk_group": None,
            "transformers_version": "4.51.0"}
        shapes = {"model.embed_tokens.weight": (vocab, d)}
        for i in range(n_layers):
            b = f"model.layers.{i}."
            shapes |= {b + "input_layernorm.weight": (d,), b + "self_attn.q_proj.weight": (n_heads * hd, d),
                       b + "self_attn.k_proj.weight": (n_kv * hd, d), b + "self_attn.v_proj.weight": (n_kv * hd, d),
                       b + "self_attn.o_proj.weight": (d, n_heads * hd), b + "self_attn.q_norm.weight": (hd,),
                       b + "self_attn.k_norm.weight": (hd,), b + "post_attention_layernorm.weight": (d,),
                       b + "mlp.gate.weight": (n_experts, d)}
            if config["moe_layer_freq"][i] == 0:
                shapes |= _swiglu(b + "mlp.", d, mlp_hidden)
                continue
            if expert_bias:
                shapes[b + "mlp.expert_bias"] = (n_experts,)
            for e in range(n_experts):
                shapes |= _swiglu(f"{b}mlp.experts.{e}.", d, expert_hidden)
            if shared:
                shapes |= _swiglu(b + "shared_expert.", d, expert_hidden)
        shapes |= {"model.norm.weight": (d,), "lm_head.weight": (vocab, d)}
    elif family == "llada2":
        hd = 16
        config = common | {
            "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
            "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                         "AutoModel": "modeling_llada2_moe.LLaDA2MoeModel",
                         "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
            "attention_dropout": 0.0, "embedding_dropout": 0.0, "first_k_dense_replace": 1,
            "head_dim": hd, "intermediate_size": mlp_hidden, "moe_intermediate_size": expert_hidden,
            "moe_router_enable_expert_bias": True, "n_group": 4, "topk_group": 2,
            "norm_topk_prob": True, "num_shared_experts": 1 if shared else None,
            "output_dropout": 0.0, "output_router_logits": False, "partial_rotary_factor": 0.5,
            "rms_norm_eps": 1e-06, "rope_theta": 600000, "routed_scaling_factor": 2.5,
            "router_dtype": "fp32", "score_function": "sigmoid", "use_bias": False,
            "use_qk_norm": True, "use_qkv_bias": False, "use_rmsnorm": True,
            "transformers_version": "4.56.0"}
        shapes = {"model.word_embeddings.weight": (vocab, d)}
        for i in range(n_layers):
            b = f"model.layers.{i}."
            shapes |= {b + "input_layernorm.weight": (d,),
                       b + "attention.query_key_value.weight": ((n_heads + 2 * n_kv) * hd, d),
                       b + "attention.query_layernorm.weight": (hd,), b + "attention.key_layernorm.weight": (hd,),
                       b + "attention.dense.weight": (d, n_heads * hd), b + "post_attention_layernorm.weight": (d,)}
            if i < config["first_k_dense_replace"]:
                shapes |= _swiglu(b + "mlp.", d, mlp_hidden)
                continue
            shapes |= {b + "mlp.gate.weight": (n_experts, d), b + "mlp.gate.expert_bias": (n_experts,)}
            for e in range(n_experts):
                shapes |= _swiglu(f"{b}mlp.experts.{e}.", d, expert_hidden)
            if shared:
                shapes |= _swiglu(b + "mlp.shared_experts.", d, expert_hidden)
        shapes |= {"model.norm.weight": (d,), "lm_head.weight": (vocab, d)}
    else:
        raise ValueError(f"unknown MoE family {family!r}")
    config |= overrides
    tensors = {k: _init(k, s, g) for k, s in shapes.items()}
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps(
        {"bos_token_id": ids["<|startoftext|>"], "eos_token_id": ids["<|endoftext|>"],
         "pad_token_id": ids["<|endoftext|>"], "transformers_version": config["transformers_version"]}, indent=2))
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    write_weights(out, {k: v.to(torch_dtype) for k, v in tensors.items()}, n_shards if sharded else 1)
    return out
