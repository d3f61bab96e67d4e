"""A backbone's parameters and shapes without its weights: from its config.json and safetensors
headers where the directory is there, a toy's options, else the published checkpoints dlmpipe
knows by name. ``dlmpipe plan`` (plan.py) prices a campaign with them and gpus.py sizes each
model job's GPUs; both import this module, and it imports neither (nor torch).
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

# ------------------------------------------------------------------------------------------
# backbones: parameters without the weights
# ------------------------------------------------------------------------------------------
TOY_VOCABULARY = 128  # train_toy's vocabulary (characters and LLaDA's special tokens)
#: train_toy's size defaults, here because backbones/toy.py imports torch (a plan or a dry run of
#: a campaign on GPUs sizes each toy backbone without it); tests/test_plan_checks.py keeps them
#: equal to train_toy's signature
TOY_SIZE = {"d_model": 128, "n_layers": 4, "n_heads": 4, "mlp_hidden": 384}
#: config.json architecture of the published checkpoints, for backbones whose directory is not
#: there yet: (pattern searched in the backbone's names, label, family, d_model, layers, heads,
#: kv heads, mlp, vocabulary)
KNOWN_CHECKPOINTS = (
    (r"llada", "LLaDA-8B (Instruct, Base, 1.5)", "llada", 4096, 32, 32, 32, 12288, 126464),
    (r"diffucoder", "DiffuCoder-7B (Qwen2.5-Coder-7B)", "dream", 3584, 28, 28, 4, 18944, 152064),
    (r"dream", "Dream-v0-7B (Qwen2.5-7B)", "dream", 3584, 28, 28, 4, 18944, 152064),
)
#: block-diffusion checkpoints (docs/MODELS.md; matched before KNOWN_CHECKPOINTS): (pattern,
#: label, family, d_model, layers, heads, kv heads, head width, mlp, vocabulary, q/k/v biases,
#: per-head q/k norms, head tied to the embedding), from the releases' config.json (SDAR: Qwen3's
#: widths, untied at 4B and 8B; Fast-dLLM v2: Qwen2.5-1.5B/7B-Instruct's)
KNOWN_BLOCK_CHECKPOINTS = (
    (r"sdar[-_]?1\.7b", "SDAR-1.7B-Chat (Qwen3-1.7B)", "sdar", 2048, 28, 16, 8, 128, 6144, 151936,
     False, True, True),
    (r"sdar[-_]?4b", "SDAR-4B-Chat (Qwen3-4B)", "sdar", 2560, 36, 32, 8, 128, 9728, 151936,
     False, True, False),
    (r"sdar[-_]?8b", "SDAR-8B-Chat (Qwen3-8B)", "sdar", 4096, 36, 32, 8, 128, 12288, 151936,
     False, True, False),
    (r"fast[-_]?dllm[-_]?v2[-_]?1\.5b", "Fast_dLLM_v2_1.5B (Qwen2.5-1.5B-Instruct)", "fast_dllm_v2",
     1536, 28, 12, 2, 128, 8960, 151936, True, False, True),
    (r"fast[-_]?dllm[-_]?v2[-_]?7b", "Fast_dLLM_v2_7B (Qwen2.5-7B-Instruct)", "fast_dllm_v2",
     3584, 28, 28, 4, 128, 18944, 152064, True, False, False),
)
#: mixture-of-experts checkpoints (matched first), whose weights are not the dense formula's:
#: (pattern, label, family, total parameters (every expert: the weights held in memory, for
#: dlmpipe/gpus.py), active parameters per token (the FLOPs), layers, kv heads, head width), from
#: the releases' model cards and config.json (the totals as the cards round them)
KNOWN_MOE_CHECKPOINTS = (
    (r"llada2(\.0)?[-_]?flash", "LLaDA2.0-flash (100B total, 6.1B active)", "llada2",
     100_000_000_000, 6_100_000_000, 32, 4, 128),
    (r"llada2(\.0)?[-_]?mini", "LLaDA2.0-mini (16B total, 1.4B active)", "llada2",
     16_000_000_000, 1_400_000_000, 20, 4, 128),
    (r"llada[-_]?moe", "LLaDA-MoE-7B-A1B (7B total, 1.4B active)", "llada_moe",
     7_000_000_000, 1_400_000_000, 16, 16, 128),
)

#: the released block size of the block-causal families, for known checkpoints without their
#: directory (config.json's: SDAR-*-Chat ``block_size`` 4, Fast-dLLM v2 ``bd_size`` 32; LLaDA2.0's
#: generate ``block_length`` 32, its config.json has none: docs/MODELS.md)
KNOWN_BLOCK_SIZES = {"sdar": 4, "fast_dllm_v2": 32, "llada2": 32}


@dataclass(frozen=True)
class Size:
    """A backbone's parameters, layers and identity, and where they were read from.
    ``parameters``: those a token passes through (a forward's FLOPs); ``total``: every weight
    held in memory (a mixture of experts' every expert; the dense ones': ``parameters``);
    ``n_kv_heads`` x ``head_dim``: one layer's K (or V) width per row (dlmpipe/gpus.py)."""

    parameters: int
    n_layers: int
    identity: object  # backbones.identity.BackboneIdentity
    source: str
    char_tokens: bool = False  # a character-level tokenizer (the toy's): one token per character
    n_kv_heads: int = 0
    head_dim: int = 0
    total: int | None = None
    #: block-causal attention over blocks of this many positions (SDAR, Fast-dLLM v2, LLaDA2.0):
    #: a forward computes the active block's rows (dlmpipe/blockwise.py); None: full attention
    block_size: int | None = None

    @property
    def weights(self) -> int:
        """Parameters held in memory."""
        return self.total or self.parameters


def parameters(d_model: int, n_layers: int, n_heads: int, n_kv_heads: int, mlp_hidden: int,
               vocab_size: int, qkv_bias: bool, head_dim: int | None = None, qk_norm: bool = False,
               tied: bool = False) -> int:
    """Parameters of the native model (backbones/model.py: embedding, head unless tied, final
    norm; per layer two norms, Q/K/V (biased in Dream's family; per-head q/k norms in SDAR's),
    output and SwiGLU projections); tests/test_cli.py holds it to the model's own count."""
    hd = head_dim or d_model // n_heads
    q, kv = n_heads * hd, n_kv_heads * hd
    layer = (2 * d_model + d_model * (q + 2 * kv) + (q + 2 * kv) * qkv_bias + q * d_model
             + 3 * d_model * mlp_hidden + 2 * hd * qk_norm)
    return (1 + (not tied)) * vocab_size * d_model + d_model + n_layers * layer


def active_parameters(c: dict) -> int:
    """The parameters a row passes through on the native model of config.json's fields ``c``
    (``read_fields``), as ``parameters`` counts a dense model's: on a mixture of experts each MoE
    layer's FFN is its router (and expert bias), ``experts_per_token`` routed experts of
    ``expert_hidden`` and the shared experts, not every expert (docs/MODELS.md); its dense layers
    (``dense_layers``) and every dense family's layers are the SwiGLU of ``mlp_hidden``."""
    d, hd = c["d_model"], c.get("attn_head_dim")
    dense = parameters(d, c["n_layers"], c["n_heads"], c["n_kv_heads"], c["mlp_hidden"],
                       c["vocab_size"], c["qkv_bias"], hd, c.get("qk_norm", False),
                       c.get("tie_embeddings", False))
    experts = c.get("n_experts", 0)
    if not experts:
        return dense
    moe_layers = c["n_layers"] - len(set(c.get("dense_layers", [])) & set(range(c["n_layers"])))
    routed = c["experts_per_token"] * c["expert_hidden"] + c.get("shared_expert_hidden", 0)
    ffn = 3 * d * routed + d * experts + experts * bool(c.get("router_bias"))
    return dense + moe_layers * (ffn - 3 * d * c["mlp_hidden"])


#: bytes per element of the safetensors dtypes (the header names them)
SAFETENSORS_BYTES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
                     "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1}


def _header(file: Path) -> dict:
    """A safetensors file's header (the JSON before the data; no tensor is read)."""
    import json
    import struct

    with open(file, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        header = json.loads(fh.read(n))
    header.pop("__metadata__", None)
    return header


def checkpoint_parameters(path: Path) -> int | None:
    """Every parameter a checkpoint directory stores (a mixture of experts' every expert), from
    its safetensors headers: the index's ``metadata.total_size`` (bytes) over the first
    tensor's bytes per element where the index states it, else the headers' shapes summed.
    None where there are no weights to read."""
    import json

    index = path / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text())
        files = sorted({path / f for f in data.get("weight_map", {}).values()})
        total = (data.get("metadata") or {}).get("total_size")
        if total and files:
            first = next(iter(_header(files[0]).values()))
            return int(total) // SAFETENSORS_BYTES[first["dtype"]]
    elif (path / "model.safetensors").is_file():
        files = [path / "model.safetensors"]
    else:
        return None
    return sum(math.prod(e["shape"]) for f in files for e in _header(f).values())


def backbone_size(campaign, backbone: str) -> Size | None:
    """``backbone``'s size: from its config.json where the directory is there (a shipped
    checkpoint's always is), a toy's options, else ``KNOWN_CHECKPOINTS`` by the backbone's and
    its directory's names; None when none of them tells."""
    from .backbones.identity import TOY, BackboneIdentity, checkpoint_identity

    spec = campaign.config["backbones"][backbone]
    # a Hub checkpoint: the folder of its config.json (fetched, or downloaded alone)
    path = campaign.hub.config_folder(backbone) if "hub" in spec else campaign.checkpoint_path(backbone)
    if "toy" in spec:  # trained by the workflow: train_toy's defaults and the campaign's options
        o = {**TOY_SIZE, **spec["toy"]}
        n = parameters(o["d_model"], o["n_layers"], o["n_heads"], o["n_heads"], o["mlp_hidden"],
                       TOY_VOCABULARY, False)
        return Size(n, o["n_layers"], TOY, "toy options", char_tokens=True,
                    n_kv_heads=o["n_heads"], head_dim=o["d_model"] // o["n_heads"])
    if path is not None and (path / "config.json").is_file():
        from .backbones.checkpoint_config import read_fields

        c = read_fields(path)
        identity = TOY if "shipped" in spec else checkpoint_identity(path)
        return Size(active_parameters(c), c["n_layers"], identity, str(path / "config.json"),
                    char_tokens="shipped" in spec, n_kv_heads=c["n_kv_heads"],
                    head_dim=c.get("attn_head_dim") or c["d_model"] // c["n_heads"],
                    total=checkpoint_parameters(path), block_size=c.get("block_size"))
    names = (backbone, *([spec["hub"].split("/")[-1]] if "hub" in spec else
                         [path.name] if path is not None else []))
    missing = (f"config.json of {spec['hub']} not reachable" if "hub" in spec
               else f"no config.json at {path}")
    for pattern, label, family, total, active, layers, kv, hd in KNOWN_MOE_CHECKPOINTS:
        if any(re.search(pattern, n, re.IGNORECASE) for n in names):
            return Size(active, layers, BackboneIdentity(family, names, backbone),
                        f"known checkpoint {label} ({missing})",
                        n_kv_heads=kv, head_dim=hd, total=total,
                        block_size=KNOWN_BLOCK_SIZES.get(family))
    for pattern, label, family, d, layers, heads, kv, hd, mlp, vocab, bias, qk, tied in KNOWN_BLOCK_CHECKPOINTS:
        if any(re.search(pattern, n, re.IGNORECASE) for n in names):
            n = parameters(d, layers, heads, kv, mlp, vocab, bias, hd, qk, tied)
            return Size(n, layers, BackboneIdentity(family, names, backbone),
                        f"known checkpoint {label} ({missing})",
                        n_kv_heads=kv, head_dim=hd, block_size=KNOWN_BLOCK_SIZES[family])
    for pattern, label, family, d, layers, heads, kv, mlp, vocab in KNOWN_CHECKPOINTS:
        if any(re.search(pattern, n, re.IGNORECASE) for n in names):
            n = parameters(d, layers, heads, kv, mlp, vocab, family == "dream")
            return Size(n, layers, BackboneIdentity(family, names, backbone),
                        f"known checkpoint {label} ({missing})",
                        n_kv_heads=kv, head_dim=d // heads)
    return None


# ------------------------------------------------------------------------------------------
# prompts: their assumed length in tokens
# ------------------------------------------------------------------------------------------
CHARS_PER_TOKEN = 4.0  # English and code with the LLaDA/Qwen2 tokenizers, roughly
CHAT_TOKENS = 20       # a chat template's turn markers around the prompt


def prompt_tokens(campaign, backbone: str, task: str, size: Size, override: float | None) -> float:
    """The assumed prompt length of ``task``'s samples on ``backbone``, in tokens."""
    from .tasks.registry import prompt_chars

    if override is not None:
        return override
    chars = prompt_chars(campaign.benchmark(task), campaign.task_options(task))
    tokens = chars if size.char_tokens else chars / CHARS_PER_TOKEN
    return tokens + (CHAT_TOKENS if campaign.config["backbones"][backbone].get("chat") else 0)
