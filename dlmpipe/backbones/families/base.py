"""What a backbone family is: everything dlmpipe knows about one released checkpoint format.

A family module (llada.py, dream.py, ...) states one ``Family``; families/__init__.py registers it
with one line. Nothing here imports torch: the campaign check reads config.json through these
readers before any job runs (docs/MODELS.md lists every family and its formats).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ..chat import ChatPrompt
from ..errors import CheckpointError


class Fields:
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


def config_fields(family: str, f: Fields, *, d, layers, heads, kv_heads, mlp, vocab, theta, eps, bias,
                  mask, shift, **more) -> dict:
    """``BackboneConfig``'s fields from what a family's reader found (stop ids: config.json's eos);
    ``more``: the fields only some families set (``attn_head_dim``, ``qk_norm``, ``block_size``,
    ``tie_embeddings``)."""
    if heads % kv_heads or (more.get("attn_head_dim") is None and d % heads):
        raise CheckpointError(f"{f.file}: {heads} heads / {kv_heads} kv heads do not divide width {d}")
    pad = f.ids("pad_token_id")
    return dict(family=family, d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads,
                mlp_hidden=mlp, vocab_size=vocab, rope_theta=theta, norm_eps=eps, qkv_bias=bias,
                mask_id=mask, stop_ids=unique(f.ids("eos_token_id")),
                pad_id=pad[0] if pad else None, logit_shift=shift, **more)


def qwen_widths(f: Fields) -> dict:
    """The Qwen2/Qwen3 config.json widths every Qwen-based family reads alike, checked."""
    f.require("hidden_act", (None, "silu"), "the FFN is SwiGLU")
    f.require("rope_scaling", (None,), "plain RoPE only")
    f.require("use_sliding_window", (None, False), "full attention only")
    d, heads = f.int("hidden_size"), f.int("num_attention_heads")
    return dict(d=d, layers=f.int("num_hidden_layers"), heads=heads,
                kv_heads=f.int("num_key_value_heads", default=heads), mlp=f.int("intermediate_size"),
                vocab=f.int("vocab_size"), theta=f.float("rope_theta", 10000.0),
                eps=f.float("rms_norm_eps", 1e-6))


def tied(f: Fields) -> bool:
    """config.json's ``tie_word_embeddings``; absent means untied (the default of SDAR's and
    Fast-dLLM v2's config classes)."""
    v = f.raw.get("tie_word_embeddings", False)
    if not isinstance(v, bool):
        raise CheckpointError(f"{f.file}: field 'tie_word_embeddings' must be true or false, got {v!r}")
    return v


def unique(ids) -> list[int]:
    return list(dict.fromkeys(i for i in ids if i is not None))


@dataclass(frozen=True)
class Family:
    """One checkpoint family: how its files are read and what its tokens and prompts are.

    ``key_map(cfg)``: checkpoint key -> native parameter name (model.py's names) for a
    ``BackboneConfig``. Special tokens are names; their ids always come from the checkpoint's own
    files (tokenizer.py). ``bpe_tokenizer``: vocab.json + merges.txt are read with transformers'
    own Qwen2 tokenizer classes before any tokenizer.json (a remote-code tokenizer class is named).
    ``attention``: ``full`` (bidirectional) or ``block_causal`` (model.py, ``block_size``).
    ``key_map`` may map a fused on-disk tensor to a tuple of native names (weights.split_rows).
    """

    name: str
    label: str  # for messages: the checkpoints it covers
    model_types: tuple[str, ...]  # config.json's model_type values, compared lower-case
    read_config: Callable[[Fields], dict]
    key_map: Callable[[object], dict[str, str]]
    chat_template: Callable[[ChatPrompt], str]  # the fallback when the tokenizer ships none
    mask_tokens: tuple[str, ...]
    stop_tokens: tuple[str, ...]
    pad_tokens: tuple[str, ...] = ()  # preferred over config.json's pad_token_id when present
    bpe_tokenizer: bool = False
    attention: str = "full"
    #: claims a config.json whose ``model_type`` another family also answers to (LLaDA-MoE's
    #: release says ``llada``, as LLaDA-8B's does); checked before ``model_types``
    claims: Callable[[dict], bool] | None = None
