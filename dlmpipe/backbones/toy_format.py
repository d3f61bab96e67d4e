"""The toy backbones' on-disk formats: character-level tokenizers (LLaDA's special tokens, or
SDAR's for the block toy, loadable with AutoTokenizer), config.json with the real family's
fields, and sharded safetensors with its key names, so a toy goes through the very loader a
real checkpoint does (dlmpipe/backbones/toy.py trains it)."""
from __future__ import annotations

import math
from pathlib import Path

from safetensors.torch import save_file

from ..io import atomic_write, atomic_write_json
from .model import Backbone, BackboneConfig
from .weights import checkpoint_key_map

SPECIAL_TOKENS = ["<|endoftext|>", "<|startoftext|>", "<|mdm_mask|>", "<|eot_id|>",
                  "<|start_header_id|>", "<|end_header_id|>"]
#: the block toy's (SDAR's names: docs/MODELS.md)
SDAR_SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
CHARS = ["\n"] + [chr(c) for c in range(32, 127)]


def _char_tokenizer(out_dir: Path, specials: list[str], **special_tokens):
    """A character-level fast tokenizer: ``specials`` then CHARS then ``<unk>``, saved in HF
    format (tokenizer.json) with ``special_tokens`` naming its roles."""
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(specials + CHARS)}
    vocab["<unk>"] = len(vocab)
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(tokenizer_object=core, unk_token="<unk>", **special_tokens)
    tok.save_pretrained(str(out_dir))
    return tok


def build_tokenizer(out_dir: Path):
    """Character-level fast tokenizer with LLaDA's special tokens, saved in HF format."""
    return _char_tokenizer(
        out_dir, SPECIAL_TOKENS, bos_token="<|startoftext|>", eos_token="<|endoftext|>",
        pad_token="<|endoftext|>", mask_token="<|mdm_mask|>",
        additional_special_tokens=SPECIAL_TOKENS[3:])


def build_sdar_tokenizer(out_dir: Path):
    """Character-level fast tokenizer with SDAR's special tokens (mask ``<|MASK|>``, stops
    ``<|endoftext|>`` and ``<|im_end|>``), saved in HF format (tokenizer.json)."""
    return _char_tokenizer(
        out_dir, SDAR_SPECIAL_TOKENS, eos_token="<|endoftext|>", pad_token="<|endoftext|>",
        mask_token="<|MASK|>", additional_special_tokens=SDAR_SPECIAL_TOKENS[1:3])


def sdar_config_json(cfg: BackboneConfig, tok) -> dict:
    """config.json with the fields of SDAR-4B-Chat's, at the block toy's sizes."""
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    return {
        "architectures": ["SDARForCausalLM"],
        "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModel": "modeling_sdar.SDARModel",
                     "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
        "attention_bias": False, "attention_dropout": 0.0, "block_size": cfg.block_size,
        "bos_token_id": eos, "eos_token_id": eos,
        "mask_token_id": tok.convert_tokens_to_ids("<|MASK|>"), "head_dim": cfg.head_dim,
        "hidden_act": "silu", "hidden_size": cfg.d_model, "initializer_range": 0.02,
        "intermediate_size": cfg.mlp_hidden, "max_position_embeddings": 4096,
        "max_window_layers": cfg.n_layers, "model_type": "sdar",
        "num_attention_heads": cfg.n_heads, "num_hidden_layers": cfg.n_layers,
        "num_key_value_heads": cfg.n_kv_heads, "rms_norm_eps": cfg.norm_eps, "rope_scaling": None,
        "rope_theta": cfg.rope_theta, "sliding_window": None, "tie_word_embeddings": False,
        "torch_dtype": "float32", "use_cache": False, "use_sliding_window": False,
        "vocab_size": cfg.vocab_size,
    }


def llada_config_json(cfg: BackboneConfig, tok) -> dict:
    """config.json with the fields of LLaDA-8B-Instruct's, at the toy's sizes."""
    return {
        "architectures": ["LLaDAModelLM"],
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig",
                     "AutoModel": "modeling_llada.LLaDAModelLM",
                     "AutoModelForCausalLM": "modeling_llada.LLaDAModelLM"},
        "model_type": "llada",
        "activation_type": "silu",
        "alibi": False,
        "attention_dropout": 0.0,
        "attention_layer_norm": False,
        "block_type": "llama",
        "d_model": cfg.d_model,
        "embedding_dropout": 0.0,
        "embedding_size": cfg.vocab_size,
        "eos_token_id": tok.convert_tokens_to_ids("<|endoftext|>"),
        "pad_token_id": tok.convert_tokens_to_ids("<|endoftext|>"),
        "bos_token_id": tok.convert_tokens_to_ids("<|startoftext|>"),
        "mask_token_id": tok.convert_tokens_to_ids("<|mdm_mask|>"),
        "include_bias": False,
        "include_qkv_bias": False,
        "init_device": "meta",
        "layer_norm_type": "rms",
        "max_sequence_length": 4096,
        "mlp_hidden_size": cfg.mlp_hidden,
        "mlp_ratio": cfg.mlp_hidden // cfg.d_model,
        "multi_query_attention": None,
        "n_heads": cfg.n_heads,
        "n_kv_heads": cfg.n_kv_heads,
        "n_layers": cfg.n_layers,
        "rms_norm_eps": cfg.norm_eps,
        "rope": True,
        "rope_theta": cfg.rope_theta,
        "scale_logits": False,
        "vocab_size": cfg.vocab_size,
        "weight_tying": False,
        "torch_dtype": "float32",
    }


def save_llada_checkpoint(model: Backbone, tok, out_dir: Path, n_shards: int = 2) -> None:
    """Write config.json, ``model-0000i-of-0000n.safetensors`` shards and the index (the family's
    key names; SDAR's config.json and generation_config.json for a block toy)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    native_to_ckpt = {v: k for k, v in checkpoint_key_map(model.cfg).items()}
    tensors = {native_to_ckpt[n]: p.detach().contiguous().clone()
               for n, p in model.state_dict().items()}
    keys = sorted(tensors)
    per = math.ceil(len(keys) / n_shards)
    weight_map, total = {}, 0
    for s in range(n_shards):
        name = f"model-{s + 1:05d}-of-{n_shards:05d}.safetensors"
        chunk = {k: tensors[k] for k in keys[s * per:(s + 1) * per]}
        atomic_write(out_dir / name, lambda tmp: save_file(chunk, str(tmp), metadata={"format": "pt"}))
        weight_map.update({k: name for k in chunk})
        total += sum(t.numel() * t.element_size() for t in chunk.values())
    atomic_write_json(out_dir / "model.safetensors.index.json",
                      {"metadata": {"total_size": total}, "weight_map": weight_map})
    if model.cfg.family == "sdar":
        atomic_write_json(out_dir / "config.json", sdar_config_json(model.cfg, tok))
        eos, im_end = (tok.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>"))
        atomic_write_json(out_dir / "generation_config.json",
                          {"bos_token_id": eos, "eos_token_id": [im_end, eos], "pad_token_id": eos})
    else:
        atomic_write_json(out_dir / "config.json", llada_config_json(model.cfg, tok))
