"""A checkpoint directory's config.json (and generation_config.json) -> ``BackboneConfig``.

Read as plain JSON (never remote code), every field checked, so a bad file gives one
``CheckpointError`` naming the field and the file (loading.py states the whole loading contract).
Everything but building the ``BackboneConfig`` runs without torch: the campaign check reads a
checkpoint's widths here (``read_widths``) before any job.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .identity import CheckpointError, family_of
from .identity import read_json as _read_json

if TYPE_CHECKING:
    from .model import BackboneConfig


class _Fields:
    """Typed access to config.json fields with errors that name the file and the field."""

    def __init__(self, raw: dict, file: Path):
        self.raw, self.file = raw, file

    def int(self, *names: str, default=None, positive: bool = True) -> int | None:
        for name in names:
            v = self.raw.get(name)
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or (positive and v <= 0):
                raise CheckpointError(f"{self.file}: field {name!r} must be a positive integer, got {v!r}")
            return v
        if default is None:
            raise CheckpointError(f"{self.file}: missing field {names[0]!r}")
        return default

    def float(self, name: str, default: float) -> float:
        v = self.raw.get(name, default)
        if v is None:
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise CheckpointError(f"{self.file}: field {name!r} must be a positive number, got {v!r}")
        return float(v)

    def ids(self, name: str) -> list[int]:
        v = self.raw.get(name)
        vals = v if isinstance(v, list) else [v]
        if v is not None and not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in vals):
            raise CheckpointError(f"{self.file}: field {name!r} must be a token id or a list of ids, got {v!r}")
        return [i for i in vals if i is not None]

    def require(self, name: str, allowed: tuple, what: str) -> None:
        v = self.raw.get(name)
        if v not in allowed:
            raise CheckpointError(f"{self.file}: {name}={v!r} is not supported ({what})")


def _llada_config(f: _Fields) -> BackboneConfig:
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
    return _config("llada", f, d=d, layers=f.int("n_layers"), heads=heads, kv_heads=kv_heads, mlp=mlp,
                   vocab=f.int("embedding_size", "vocab_size"), theta=f.float("rope_theta", 10000.0),
                   eps=f.float("rms_norm_eps", 1e-5), bias=bool(f.raw.get("include_qkv_bias", False)),
                   mask=ids[0] if ids else None, shift=False)


def _dream_config(f: _Fields) -> BackboneConfig:
    f.require("hidden_act", (None, "silu"), "the FFN is SwiGLU")
    f.require("tie_word_embeddings", (None, False), "the LM head is untied")
    f.require("rope_scaling", (None,), "plain RoPE only")
    f.require("use_sliding_window", (None, False), "full attention only")
    d, heads = f.int("hidden_size"), f.int("num_attention_heads")
    if f.raw.get("head_dim") not in (None, d // heads):
        raise CheckpointError(f"{f.file}: head_dim={f.raw['head_dim']} != hidden_size / num_attention_heads")
    ids = f.ids("mask_token_id")
    return _config("dream", f, d=d, layers=f.int("num_hidden_layers"), heads=heads,
                   kv_heads=f.int("num_key_value_heads", default=heads), mlp=f.int("intermediate_size"),
                   vocab=f.int("vocab_size"), theta=f.float("rope_theta", 10000.0),
                   eps=f.float("rms_norm_eps", 1e-6), bias=True, mask=ids[0] if ids else None, shift=True)


def _config(family, f: _Fields, *, d, layers, heads, kv_heads, mlp, vocab, theta, eps, bias, mask,
            shift) -> dict:
    if d % heads or heads % kv_heads:
        raise CheckpointError(f"{f.file}: {heads} heads / {kv_heads} kv heads do not divide width {d}")
    pad = f.ids("pad_token_id")
    return dict(family=family, d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads,
                mlp_hidden=mlp, vocab_size=vocab, rope_theta=theta, norm_eps=eps, qkv_bias=bias,
                mask_id=mask, stop_ids=_unique(f.ids("eos_token_id")),
                pad_id=pad[0] if pad else None, logit_shift=shift)


CONFIG_READERS = {"llada": _llada_config, "dream": _dream_config}


def read_fields(path: Path) -> dict:
    """``BackboneConfig``'s fields, as config.json / generation_config.json declare them, every
    field checked (no torch)."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file}: config.json missing (is {path} a checkpoint directory?)")
    raw = _read_json(cfg_file, "config.json")
    fields = CONFIG_READERS[family_of(raw, cfg_file)](_Fields(raw, cfg_file))
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        fields["stop_ids"] = _unique(fields["stop_ids"] + _Fields(
            _read_json(gen_file, "generation_config.json"), gen_file).ids("eos_token_id"))
    return fields


def read_config(path: Path) -> BackboneConfig:
    """Architecture and the special ids config.json / generation_config.json declare."""
    from .model import BackboneConfig

    return BackboneConfig(**read_fields(path))


@dataclass(frozen=True)
class Widths:
    """The widths a method's parameters may depend on (registry ``width_checks``)."""

    d_model: int
    n_heads: int
    n_kv_heads: int
    source: str = ""  # where they were read, for messages

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def value_rank(self) -> int:
        """Rank of the value projection W_v (d_model -> n_kv_heads * head_dim): SPA-Cache's
        singular proxies keep at most this many directions (engine/proxies.py)."""
        return min(self.n_kv_heads * self.head_dim, self.d_model)


def read_widths(path: Path) -> Widths:
    """A checkpoint directory's widths, from config.json (CheckpointError naming the field)."""
    fields = read_fields(path)
    return Widths(fields["d_model"], fields["n_heads"], fields["n_kv_heads"],
                  str(Path(path) / "config.json"))


def _unique(ids) -> list[int]:
    return list(dict.fromkeys(i for i in ids if i is not None))
