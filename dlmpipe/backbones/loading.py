"""Load a local Hugging Face checkpoint directory (LLaDA or Dream/DiffuCoder family) natively.

Everything is checked before a single weight is materialized (config fields, tokenizer, shards
present, safetensors headers, key set, shapes), so a bad checkpoint gives one ``CheckpointError``
naming the problem and the file, and nothing is half-loaded.

Weights are then read tensor by tensor with plain file reads into tensors allocated once in the
target dtype on the target device; the model is built on the meta device and the tensors are
assigned into it. Host memory stays at one copy of the weights plus one staging tensor (when the
dtype or device differs from the file's). We do not use ``safetensors.safe_open(...).get_tensor``:
on the CPU it returns tensors that share the file's memory map, so "loaded" weights would be
file-backed pages that change (or fault) when the checkpoint file is rewritten, and a dtype cast
on top of them doubles the resident peak.

No remote code is ever executed and no loader may prompt: config.json is read as JSON, the
tokenizer classes are named explicitly (never ``AutoTokenizer``, never ``trust_remote_code``).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from .model import Backbone, BackboneConfig
from .prompts import ChatPrompt, chat_ids


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message names the problem and file."""


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                      "F64": torch.float64}

# Special tokens by name (their ids always come from the checkpoint's own files).
MASK_TOKENS = {"llada": ["<|mdm_mask|>"], "dream": ["<|mask|>"]}
STOP_TOKENS = {"llada": ["<|endoftext|>", "<|eot_id|>"],
               "dream": ["<|endoftext|>", "<|im_end|>", "<|dlm_pad|>"]}
PAD_TOKENS = {"llada": [], "dream": ["<|dlm_pad|>"]}  # DiffuCoder pads its answers with <|dlm_pad|>

# Buffers some exporters write next to the weights; recomputed here, so skipped, not "unexpected".
IGNORED_KEY_SUFFIXES = ("rotary_emb.inv_freq",)


# ---- config.json --------------------------------------------------------------------------
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
            shift) -> BackboneConfig:
    if d % heads or heads % kv_heads:
        raise CheckpointError(f"{f.file}: {heads} heads / {kv_heads} kv heads do not divide width {d}")
    pad = f.ids("pad_token_id")
    return BackboneConfig(family=family, d_model=d, n_layers=layers, n_heads=heads, n_kv_heads=kv_heads,
                          mlp_hidden=mlp, vocab_size=vocab, rope_theta=theta, norm_eps=eps, qkv_bias=bias,
                          mask_id=mask, stop_ids=_unique(f.ids("eos_token_id")),
                          pad_id=pad[0] if pad else None, logit_shift=shift)


FAMILY_OF_MODEL_TYPE = {"llada": "llada", "dream": "dream", "qwen2": "dream"}  # compared lower-case
CONFIG_READERS = {"llada": _llada_config, "dream": _dream_config}


def _read_json(file: Path, what: str) -> dict:
    try:
        raw = json.loads(file.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: {what} is not valid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: {what} must be a JSON object, got {type(raw).__name__}")
    return raw


def read_config(path: Path) -> BackboneConfig:
    """Architecture and the special ids config.json / generation_config.json declare."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file}: config.json missing (is {path} a checkpoint directory?)")
    raw = _read_json(cfg_file, "config.json")
    model_type = raw.get("model_type")
    family = FAMILY_OF_MODEL_TYPE.get(model_type.lower()) if isinstance(model_type, str) else None
    if family is None:
        raise CheckpointError(f"{cfg_file}: unknown model_type {model_type!r} "
                              f"(supported: llada for LLaDA, Dream or qwen2 for Dream/DiffuCoder)")
    cfg = CONFIG_READERS[family](_Fields(raw, cfg_file))
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        cfg.stop_ids = _unique(cfg.stop_ids + _Fields(_read_json(gen_file, "generation_config.json"),
                                                      gen_file).ids("eos_token_id"))
    return cfg


def _unique(ids) -> list[int]:
    return list(dict.fromkeys(i for i in ids if i is not None))


# ---- tokenizer ----------------------------------------------------------------------------
def load_tokenizer(path: Path, family: str | None = None):
    """The checkpoint's tokenizer, without remote code.

    LLaDA ships a fast ``tokenizer.json``. Dream/DiffuCoder name a remote-code ``DreamTokenizer``
    that is a Qwen2 byte-level BPE over vocab.json + merges.txt, so transformers' own Qwen2
    tokenizer reads those files; the added tokens (``<|mask|>``, ...) come from
    tokenizer_config.json / added_tokens.json and are checked to land on their declared ids.
    """
    import transformers

    path = Path(path)
    family = family or read_config(path).family
    has_bpe = (path / "vocab.json").is_file() and (path / "merges.txt").is_file()
    has_fast = (path / "tokenizer.json").is_file()
    if family == "dream" and has_bpe:
        cls = getattr(transformers, "Qwen2TokenizerFast", None) or transformers.Qwen2Tokenizer
        file = path / "vocab.json"
    elif has_fast:
        cls, file = transformers.PreTrainedTokenizerFast, path / "tokenizer.json"
    else:
        want = "vocab.json + merges.txt (or tokenizer.json)" if family == "dream" else "tokenizer.json"
        raise CheckpointError(f"{path}: tokenizer missing (expected {want})")
    try:
        tok = cls.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # noqa: BLE001 - any failure inside transformers, re-raised with the file named
        raise CheckpointError(f"{file}: cannot load tokenizer ({type(e).__name__}: {e})") from e
    _check_added_tokens(tok, path)
    return tok


def _declared_added_tokens(path: Path) -> dict[str, int]:
    declared: dict[str, int] = {}
    added_file = path / "added_tokens.json"
    if added_file.is_file():
        declared |= {str(k): v for k, v in _read_json(added_file, "added_tokens.json").items()}
    tc_file = path / "tokenizer_config.json"
    if tc_file.is_file():
        decoder = _read_json(tc_file, "tokenizer_config.json").get("added_tokens_decoder") or {}
        for i, entry in decoder.items():
            content = entry.get("content") if isinstance(entry, dict) else None
            if content is None or not str(i).isdigit():
                raise CheckpointError(f"{tc_file}: malformed added_tokens_decoder entry {i!r}: {entry!r}")
            declared[content] = int(i)
    return declared


def _check_added_tokens(tok, path: Path) -> None:
    """Add declared tokens the tokenizer class skipped (in id order), then insist on the ids."""
    from tokenizers import AddedToken

    declared = _declared_added_tokens(path)
    for content, i in sorted(declared.items(), key=lambda kv: kv[1]):
        if tok.convert_tokens_to_ids(content) in (None, tok.unk_token_id) and i == len(tok):
            tok.add_tokens([AddedToken(content, special=True, normalized=False)])
    wrong = {c: (i, tok.convert_tokens_to_ids(c)) for c, i in declared.items()
             if tok.convert_tokens_to_ids(c) != i}
    if wrong:
        c, (i, got) = next(iter(wrong.items()))
        raise CheckpointError(f"{path}: added token {c!r} is declared with id {i} but the tokenizer "
                              f"gives {got} ({len(wrong)} such token(s))")


def _token_id(tok, token: str) -> int | None:
    i = tok.convert_tokens_to_ids(token)
    return None if i is None or (i == tok.unk_token_id and token != tok.unk_token) else i


def resolve_special_ids(cfg: BackboneConfig, tok, path: Path) -> BackboneConfig:
    """Fill mask / stop / pad ids from the tokenizer where config.json leaves them open.

    Mask: config.json's ``mask_token_id``, else the tokenizer's mask token, else the family's
    mask token by name. Stops: config/generation_config eos ids, the tokenizer's eos, and the
    family's end-of-turn tokens present in the vocabulary (``<|eot_id|>``, ``<|im_end|>``,
    DiffuCoder's ``<|dlm_pad|>``). Pad: DiffuCoder's ``<|dlm_pad|>``, else config.json's
    ``pad_token_id``, else the tokenizer's pad, else the first stop id.
    """
    fam = cfg.family
    if tok is not None:
        if cfg.mask_id is None:
            cfg.mask_id = tok.mask_token_id if getattr(tok, "mask_token", None) else None
        for name in MASK_TOKENS[fam]:
            cfg.mask_id = cfg.mask_id if cfg.mask_id is not None else _token_id(tok, name)
        cfg.stop_ids = _unique(cfg.stop_ids + [tok.eos_token_id] + [_token_id(tok, n) for n in STOP_TOKENS[fam]])
        pads = [_token_id(tok, n) for n in PAD_TOKENS[fam]] + [cfg.pad_id, tok.pad_token_id]
        cfg.pad_id = next((p for p in pads if p is not None), None)
    if cfg.mask_id is None:
        raise CheckpointError(f"{path / 'config.json'}: no mask token id (no mask_token_id field and no "
                              f"{' / '.join(MASK_TOKENS[fam])} in the tokenizer)")
    if not cfg.stop_ids:
        raise CheckpointError(f"{path / 'config.json'}: no stop token id (no eos_token_id and no tokenizer eos)")
    if cfg.pad_id is None:
        cfg.pad_id = cfg.stop_ids[0]
    for name, i in [("mask", cfg.mask_id), ("pad", cfg.pad_id)] + [("stop", s) for s in cfg.stop_ids]:
        if not 0 <= i < cfg.vocab_size:
            raise CheckpointError(f"{path / 'config.json'}: {name} token id {i} is outside the "
                                  f"vocabulary of {cfg.vocab_size}")
    return cfg


# ---- weights ------------------------------------------------------------------------------
def checkpoint_key_map(cfg: BackboneConfig) -> dict[str, str]:
    """Checkpoint key -> native parameter name, for the family's exact on-disk names."""
    m: dict[str, str] = {}
    if cfg.family == "llada":
        t = "model.transformer."
        m[t + "wte.weight"] = "embed.weight"
        m[t + "ln_f.weight"] = "final_norm.weight"
        m[t + "ff_out.weight"] = "head.weight"
        # Naming trap: ff_proj is the gate, up_proj the up projection, the block's ff_out the down.
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


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: file, byte range, on-disk dtype and shape."""
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def read_safetensors_header(file: Path) -> dict[str, TensorEntry]:
    """Parse and validate a safetensors header (no tensor data is read)."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            head = fh.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < n <= size - 8:
                raise CheckpointError(f"{file}: not a safetensors file (bad header length; truncated?)")
            header = json.loads(fh.read(n))
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read shard ({e})") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: corrupt safetensors header ({e})") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{file}: corrupt safetensors header")
    header.pop("__metadata__", None)
    entries = {}
    for key, info in header.items():
        try:
            dtype_name, shape, (b, e) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{file}: corrupt safetensors header entry for {key!r}") from err
        dtype = SAFETENSORS_DTYPES.get(dtype_name)
        if dtype is None:
            raise CheckpointError(f"{file}: tensor {key!r} has dtype {dtype_name}; only float weights "
                                  f"({', '.join(SAFETENSORS_DTYPES)}) are supported (quantized checkpoint?)")
        numel = 1
        for s in shape:
            numel *= s
        start, end = 8 + n + b, 8 + n + e
        if e - b != numel * dtype.itemsize or end > size or b < 0:
            raise CheckpointError(f"{file}: tensor {key!r} data is out of bounds or mis-sized "
                                  f"(truncated or corrupt shard)")
        entries[key] = TensorEntry(file, dtype, shape, start, end)
    return entries


def shard_files(path: Path) -> dict[str, Path]:
    """Checkpoint key -> shard file, from the index when sharded, else the single file."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index, "model.safetensors.index.json").get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index}: no valid 'weight_map' (key -> shard file name)")
        files = {k: path / f for k, f in weight_map.items()}
        for f in sorted(set(files.values())):
            if not f.is_file():
                raise CheckpointError(f"{f}: shard named in {index.name} is missing")
        return files
    single = path / "model.safetensors"
    if not single.is_file():
        raise CheckpointError(f"{path}: no weights (neither model.safetensors nor "
                              f"model.safetensors.index.json)")
    return {k: single for k in read_safetensors_header(single)}


def _plan(model: Backbone, key_map: dict[str, str], files: dict[str, Path],
          path: Path) -> dict[str, TensorEntry]:
    """Native parameter name -> tensor location, after checking keys and shapes against config."""
    files = {k: f for k, f in files.items() if not k.endswith(IGNORED_KEY_SUFFIXES)}
    missing = [k for k in key_map if k not in files]
    unexpected = sorted(set(files) - set(key_map))
    where = sorted({f.name for f in files.values()})
    if missing:
        raise CheckpointError(f"{path}: missing key(s) {missing[:5]}"
                              + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                              + f" (looked in {', '.join(where)}; does config.json match the weights?)")
    if unexpected:
        raise CheckpointError(f"{files[unexpected[0]]}: unexpected key(s) {unexpected[:5]}"
                              + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else "")
                              + f" for a {model.cfg.family} checkpoint")
    headers = {f: read_safetensors_header(f) for f in sorted(set(files.values()))}
    params = dict(model.named_parameters())
    plan = {}
    for k, f in files.items():
        entry = headers[f].get(k)
        if entry is None:
            raise CheckpointError(f"{f}: key {k!r} listed in the index is not in this shard")
        want = tuple(params[key_map[k]].shape)
        if entry.shape != want:
            raise CheckpointError(f"{f}: shape mismatch for {k!r}: file has {entry.shape}, "
                                  f"config.json implies {want}")
        plan[key_map[k]] = entry
    return plan


def _read_tensors(plan: dict[str, TensorEntry], dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Read every tensor once into its final dtype/device; one reused host staging buffer."""
    direct = device.type == "cpu"
    staging_bytes = max((e.end - e.start for e in plan.values() if not (direct and e.dtype == dtype)), default=0)
    staging = torch.empty(staging_bytes, dtype=torch.uint8) if staging_bytes else None
    state = {}
    by_file: dict[Path, list[tuple[str, TensorEntry]]] = {}
    for name, e in plan.items():
        by_file.setdefault(e.file, []).append((name, e))
    for file, items in by_file.items():
        with open(file, "rb", buffering=0) as fh:
            for name, e in sorted(items, key=lambda it: it[1].start):
                out = torch.empty(e.shape, dtype=dtype, device=device)
                if direct and e.dtype == dtype:
                    _readinto(fh, e, out.reshape(-1).view(torch.uint8))
                else:
                    raw = staging[:e.end - e.start]
                    _readinto(fh, e, raw)
                    out.copy_(raw.view(e.dtype).view(e.shape))
                state[name] = out
    return state


def _readinto(fh, e: TensorEntry, buf: torch.Tensor) -> None:
    view = memoryview(buf.numpy()).cast("B")
    fh.seek(e.start)
    got = 0
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            raise CheckpointError(f"{e.file}: unexpected end of file (truncated shard)")
        got += n


# ---- the loaded backbone ------------------------------------------------------------------
@dataclass
class LoadedBackbone:
    """A native backbone with its tokenizer and the checkpoint's special ids."""
    model: Backbone
    tokenizer: object
    path: Path

    @property
    def cfg(self) -> BackboneConfig:
        return self.model.cfg

    @property
    def family(self) -> str:
        return self.cfg.family

    @property
    def mask_id(self) -> int:
        return self.cfg.mask_id

    @property
    def stop_ids(self) -> list[int]:
        return self.cfg.stop_ids

    @property
    def pad_id(self) -> int:
        return self.cfg.pad_id

    @property
    def logit_shift(self) -> bool:
        return self.cfg.logit_shift

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """``[B, N]`` ids -> raw logits ``[B, N, V]`` (unshifted; see ``model.shift``)."""
        return self.model(input_ids)

    __call__ = forward

    def chat_prompt(self, prompt: str | ChatPrompt, system: str | None = None) -> list[int]:
        """Token ids of a user turn in the checkpoint's chat template (see ``prompts``)."""
        if self.tokenizer is None:
            raise RuntimeError("loaded with with_tokenizer=False: no chat prompts")
        p = prompt if isinstance(prompt, ChatPrompt) else ChatPrompt(user=prompt, system=system)
        return chat_ids(self.tokenizer, self.family, p)

    def encode(self, text: str) -> list[int]:
        """Plain (non-chat) prompt ids, without added special tokens."""
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]


def check_checkpoint(path: str | Path) -> BackboneConfig:
    """Validate a checkpoint directory without materializing weights; returns its config."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    cfg = read_config(path)
    resolve_special_ids(cfg, load_tokenizer(path, cfg.family), path)
    with torch.device("meta"):
        model = Backbone(cfg)
    _plan(model, checkpoint_key_map(cfg), shard_files(path), path)
    return cfg


def load_backbone(path: str | Path, dtype: str | torch.dtype = "float32",
                  device: str | torch.device = "cpu", with_tokenizer: bool = True) -> LoadedBackbone:
    """Load a local checkpoint directory into the native backbone (see the module docstring)."""
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    if isinstance(dtype, str) and dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use one of {', '.join(DTYPES)}")
    torch_dtype = DTYPES[dtype] if isinstance(dtype, str) else dtype
    device = torch.device(device)
    cfg = read_config(path)
    tokenizer = load_tokenizer(path, cfg.family) if with_tokenizer else None
    resolve_special_ids(cfg, tokenizer, path)
    with torch.device("meta"):
        model = Backbone(cfg)
    plan = _plan(model, checkpoint_key_map(cfg), shard_files(path), path)
    model.load_state_dict(_read_tensors(plan, torch_dtype, device), assign=True, strict=True)
    model.eval().requires_grad_(False)
    return LoadedBackbone(model=model, tokenizer=tokenizer, path=path)
