"""Load a local Hugging Face checkpoint directory (LLaDA or Dream/Qwen2 family) natively.

Everything is checked before a single weight is materialized (shards present, key set, shapes),
so a bad checkpoint gives one clear error naming the file and nothing is half-loaded. Weights
are then read shard by shard straight into the target dtype/device and assigned into a model
built on the meta device: host memory stays close to one copy of the weights.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from .model import Backbone, BackboneConfig


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message names the problem and file."""


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _llada_config(raw: dict) -> BackboneConfig:
    if raw.get("include_bias"):
        raise CheckpointError("LLaDA checkpoints with include_bias=true are not supported")
    return BackboneConfig(
        family="llada",
        d_model=raw["d_model"],
        n_layers=raw["n_layers"],
        n_heads=raw["n_heads"],
        n_kv_heads=raw.get("n_kv_heads") or raw["n_heads"],
        mlp_hidden=raw["mlp_hidden_size"],
        vocab_size=raw.get("embedding_size") or raw["vocab_size"],
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        norm_eps=float(raw.get("rms_norm_eps", 1e-5)),
        qkv_bias=bool(raw.get("include_qkv_bias", False)),
        mask_id=raw["mask_token_id"],
        stop_ids=[raw["eos_token_id"]],
        pad_id=raw.get("pad_token_id"),
        logit_shift=False,
    )


def _dream_config(raw: dict) -> BackboneConfig:
    eos = raw.get("eos_token_id")
    stops = list(eos) if isinstance(eos, list) else [eos]
    return BackboneConfig(
        family="dream",
        d_model=raw["hidden_size"],
        n_layers=raw["num_hidden_layers"],
        n_heads=raw["num_attention_heads"],
        n_kv_heads=raw.get("num_key_value_heads") or raw["num_attention_heads"],
        mlp_hidden=raw["intermediate_size"],
        vocab_size=raw["vocab_size"],
        rope_theta=float(raw.get("rope_theta", 10000.0)),
        norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
        qkv_bias=True,
        mask_id=raw["mask_token_id"],
        stop_ids=[s for s in stops if s is not None],
        pad_id=raw.get("pad_token_id"),
        logit_shift=True,
    )


FAMILY_OF_MODEL_TYPE = {"llada": "llada", "dream": "dream", "qwen2": "dream"}
CONFIG_READERS = {"llada": _llada_config, "dream": _dream_config}


def checkpoint_key_map(cfg: BackboneConfig) -> dict[str, str]:
    """Checkpoint key -> native parameter name, for the family's exact on-disk names."""
    m: dict[str, str] = {}
    if cfg.family == "llada":
        t = "model.transformer."
        m[t + "wte.weight"] = "embed.weight"
        m[t + "ln_f.weight"] = "final_norm.weight"
        m[t + "ff_out.weight"] = "head.weight"
        names = {"attn_norm": "attn_norm", "q_proj": "q_proj", "k_proj": "k_proj",
                 "v_proj": "v_proj", "attn_out": "attn_out", "ff_norm": "ff_norm",
                 "ff_proj": "ff_gate", "up_proj": "ff_up", "ff_out": "ff_down"}
        for i in range(cfg.n_layers):
            for src, dst in names.items():
                m[f"{t}blocks.{i}.{src}.weight"] = f"blocks.{i}.{dst}.weight"
            if cfg.qkv_bias:
                for p in ("q_proj", "k_proj", "v_proj"):
                    m[f"{t}blocks.{i}.{p}.bias"] = f"blocks.{i}.{p}.bias"
    else:
        m["model.embed_tokens.weight"] = "embed.weight"
        m["model.norm.weight"] = "final_norm.weight"
        m["lm_head.weight"] = "head.weight"
        names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "q_proj",
                 "self_attn.k_proj": "k_proj", "self_attn.v_proj": "v_proj",
                 "self_attn.o_proj": "attn_out", "post_attention_layernorm": "ff_norm",
                 "mlp.gate_proj": "ff_gate", "mlp.up_proj": "ff_up", "mlp.down_proj": "ff_down"}
        for i in range(cfg.n_layers):
            for src, dst in names.items():
                m[f"model.layers.{i}.{src}.weight"] = f"blocks.{i}.{dst}.weight"
            for p in ("q_proj", "k_proj", "v_proj"):
                m[f"model.layers.{i}.self_attn.{p}.bias"] = f"blocks.{i}.{p}.bias"
    return m


def read_config(path: Path) -> BackboneConfig:
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file}: config.json missing (is {path} a checkpoint directory?)")
    try:
        raw = json.loads(cfg_file.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{cfg_file}: not valid JSON ({e})") from e
    model_type = raw.get("model_type")
    family = FAMILY_OF_MODEL_TYPE.get(model_type)
    if family is None:
        raise CheckpointError(
            f"{cfg_file}: unknown model_type {model_type!r} "
            f"(supported: {', '.join(sorted(FAMILY_OF_MODEL_TYPE))})")
    try:
        return CONFIG_READERS[family](raw)
    except KeyError as e:
        raise CheckpointError(f"{cfg_file}: missing field {e.args[0]!r} for a {model_type} config") from e


def shard_files(path: Path) -> dict[str, Path]:
    """Checkpoint key -> shard file, from the index when sharded, else the single file."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = {k: path / f for k, f in weight_map.items()}
        for f in sorted(set(files.values())):
            if not f.is_file():
                raise CheckpointError(f"{f}: shard named in {index.name} is missing")
        return files
    single = path / "model.safetensors"
    if not single.is_file():
        raise CheckpointError(f"{path}: neither model.safetensors nor model.safetensors.index.json found")
    with safe_open(single, framework="pt") as f:
        return {k: single for k in f.keys()}


def _check_keys_and_shapes(model: Backbone, key_map: dict[str, str], files: dict[str, Path]) -> None:
    missing = sorted(set(key_map) - set(files))
    unexpected = sorted(set(files) - set(key_map))
    if missing:
        raise CheckpointError(f"{sorted(set(files.values()))[0].parent}: missing key(s) {missing[:5]}"
                              + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    if unexpected:
        raise CheckpointError(f"{files[unexpected[0]]}: unexpected key(s) {unexpected[:5]}"
                              + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else ""))
    params = dict(model.named_parameters())
    by_file: dict[Path, list[str]] = {}
    for k, f in files.items():
        by_file.setdefault(f, []).append(k)
    for f, keys in by_file.items():
        with safe_open(f, framework="pt") as sf:
            present = set(sf.keys())
            for k in keys:
                if k not in present:
                    raise CheckpointError(f"{f}: key {k!r} listed in the index is not in this shard")
                shape = tuple(sf.get_slice(k).get_shape())
                want = tuple(params[key_map[k]].shape)
                if shape != want:
                    raise CheckpointError(f"{f}: shape mismatch for {k!r}: file has {shape}, "
                                          f"config.json implies {want}")


@dataclass
class LoadedBackbone:
    model: Backbone
    tokenizer: object
    path: Path

    @property
    def cfg(self) -> BackboneConfig:
        return self.model.cfg


def load_tokenizer(path: Path):
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    if (path / "tokenizer.json").is_file():
        try:
            return PreTrainedTokenizerFast.from_pretrained(str(path))
        except Exception as e:  # noqa: BLE001 - re-raised with the file named
            raise CheckpointError(f"{path / 'tokenizer.json'}: cannot load tokenizer ({e})") from e
    if (path / "vocab.json").is_file() and (path / "merges.txt").is_file():
        from transformers import Qwen2TokenizerFast

        return Qwen2TokenizerFast(vocab_file=str(path / "vocab.json"),
                                  merges_file=str(path / "merges.txt"))
    del AutoTokenizer
    raise CheckpointError(f"{path}: tokenizer missing (no tokenizer.json, nor vocab.json + merges.txt)")


def check_checkpoint(path: Path) -> BackboneConfig:
    """Validate a checkpoint directory without materializing weights; returns its config."""
    cfg = read_config(path)
    load_tokenizer(path)
    with torch.device("meta"):
        model = Backbone(cfg)
    _check_keys_and_shapes(model, checkpoint_key_map(cfg), shard_files(path))
    return cfg


def load_backbone(path: str | Path, dtype: str | torch.dtype = "float32",
                  device: str | torch.device = "cpu", with_tokenizer: bool = True) -> LoadedBackbone:
    """Load a local checkpoint directory into the native backbone (see module docstring)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    cfg = read_config(path)
    tokenizer = load_tokenizer(path) if with_tokenizer else None
    files = shard_files(path)
    with torch.device("meta"):
        model = Backbone(cfg)
    key_map = checkpoint_key_map(cfg)
    _check_keys_and_shapes(model, key_map, files)
    state: dict[str, torch.Tensor] = {}
    for f in sorted(set(files.values())):
        with safe_open(f, framework="pt", device=str(device)) as sf:
            for k in sf.keys():
                state[key_map[k]] = sf.get_tensor(k).to(dtype=torch_dtype)
    model.load_state_dict(state, assign=True, strict=True)
    model.eval().requires_grad_(False)
    return LoadedBackbone(model=model, tokenizer=tokenizer, path=path)
