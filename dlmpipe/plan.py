"""A campaign's cost before anything is downloaded: jobs per rule, samples per task, GPU-hours.

``python -m dlmpipe plan CONFIG`` checks the campaign without its checkpoint directories
(``Campaign(check_paths=False)``), counts the jobs Snakemake will plan per rule (``jobs_per_rule``,
tested against dry runs), the samples of each task from its benchmark's known size
(``tasks.registry.task_rows``) and estimates each backbone's GPU-hours: every decode of the
generate, timing and analysis jobs priced by dlmpipe/cost.py, at 2 x parameters FLOPs per row
(a mixture of experts' active parameters per token; a block-causal backbone's rows are the active
block's, its finished blocks computed once),
on an assumed GPU at an assumed utilisation. ``assumptions`` lists every assumption the numbers
rest on; the plan prints them (docs/ARCHITECTURE.md, "Performance shape", says the same).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from . import cost, registry

#: rules in the order the workflow runs them
RULE_ORDER = ("train_toy", "prepare_backbone", "svd", "prepare_task", "generate",
              "merge_generations", "score", "time_method", "summarize", "plot", "plot_sweeps",
              "tables", "shadow_probe", "shadow_analysis", "intervention", "score_branch",
              "intervention_analysis", "drift_profile", "drift_analysis", "all")
#: per analysis target: its jobs per rule (workflow/rules/analyses.smk)
ANALYSIS_JOBS = {"shadow": {"shadow_probe": 1, "shadow_analysis": 1},
                 "intervention": {"intervention": 1, "score_branch": 2, "intervention_analysis": 1},
                 "drift": {"drift_profile": 1, "drift_analysis": 1}}


def jobs_per_rule(campaign) -> dict[str, int]:
    """The jobs Snakemake plans per rule for a fresh run of ``campaign`` (rules without jobs
    left out), in ``RULE_ORDER``."""
    backbones, tasks = campaign.backbones, campaign.tasks
    decoded = len(campaign.decoding_jobs())
    shards = campaign.config["shards"]
    drift = {b for b, _, _ in campaign.analysis_targets("drift")}
    counts = {
        "train_toy": sum(map(campaign.is_toy, backbones)),
        "prepare_backbone": len(backbones),
        # one SVD per backbone whose SPA-Cache methods read singular proxies or that a drift
        # profile reads (workflow/rules/svd.smk)
        "svd": sum(b in drift or any(campaign.needs_proxies(m, b) for m in campaign.methods)
                   for b in backbones),
        "prepare_task": len(tasks),
        "generate": decoded * shards,
        "merge_generations": decoded if shards > 1 else 0,
        "score": decoded,
        "time_method": decoded,  # each method against the reference, per (backbone, task)
        "summarize": 1, "plot": 1, "plot_sweeps": 1,
        "tables": 1 if campaign.config["tables"] else 0,
        "all": 1,
    }
    for kind, rules in ANALYSIS_JOBS.items():
        for rule, per_target in rules.items():
            counts[rule] = per_target * len(campaign.analysis_targets(kind))
    return {rule: counts[rule] for rule in RULE_ORDER if counts.get(rule)}


def task_samples(campaign, task: str) -> int:
    """Samples of ``task`` every method decodes (its benchmark's known size, ``limit``, ...)."""
    from .tasks.registry import task_rows

    return task_rows(campaign.benchmark(task), campaign.task_options(task))


# ------------------------------------------------------------------------------------------
# backbones: parameters without the weights
# ------------------------------------------------------------------------------------------
TOY_VOCABULARY = 128  # train_toy's vocabulary (characters and LLaDA's special tokens)
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
    import inspect

    from .backbones.identity import TOY, BackboneIdentity, checkpoint_identity

    spec = campaign.config["backbones"][backbone]
    path = campaign.checkpoint_path(backbone)
    if "toy" in spec:  # trained by the workflow: train_toy's defaults and the campaign's options
        from .backbones.toy import train_toy

        defaults = {k: p.default for k, p in inspect.signature(train_toy).parameters.items()
                    if p.default is not inspect.Parameter.empty}
        o = {**defaults, **spec["toy"]}
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
    names = (backbone, *([path.name] if path is not None else []))
    for pattern, label, family, total, active, layers, kv, hd in KNOWN_MOE_CHECKPOINTS:
        if any(re.search(pattern, n, re.IGNORECASE) for n in names):
            return Size(active, layers, BackboneIdentity(family, names, backbone),
                        f"known checkpoint {label} (no config.json at {path})",
                        n_kv_heads=kv, head_dim=hd, total=total,
                        block_size=KNOWN_BLOCK_SIZES.get(family))
    for pattern, label, family, d, layers, heads, kv, hd, mlp, vocab, bias, qk, tied in KNOWN_BLOCK_CHECKPOINTS:
        if any(re.search(pattern, n, re.IGNORECASE) for n in names):
            n = parameters(d, layers, heads, kv, mlp, vocab, bias, hd, qk, tied)
            return Size(n, layers, BackboneIdentity(family, names, backbone),
                        f"known checkpoint {label} (no config.json at {path})",
                        n_kv_heads=kv, head_dim=hd, block_size=KNOWN_BLOCK_SIZES[family])
    for pattern, label, family, d, layers, heads, kv, mlp, vocab in KNOWN_CHECKPOINTS:
        if any(re.search(pattern, n, re.IGNORECASE) for n in names):
            n = parameters(d, layers, heads, kv, mlp, vocab, family == "dream")
            return Size(n, layers, BackboneIdentity(family, names, backbone),
                        f"known checkpoint {label} (no config.json at {path})",
                        n_kv_heads=kv, head_dim=d // heads)
    return None


# ------------------------------------------------------------------------------------------
# GPU-hours
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Gpu:
    """The GPU the estimate assumes: dense bf16 peak and the share of it decoding reaches."""

    name: str = "H100 SXM"
    peak_tflops: float = 989.0   # dense bf16
    utilization: float = 0.35    # samples decoded together (generate jobs, throughput passes)
    utilization_b1: float = 0.15  # one sample at a time (timing's latency passes, warm-ups)

    def hours(self, flops: float, batched: bool) -> float:
        share = self.utilization if batched else self.utilization_b1
        return flops / (self.peak_tflops * 1e12 * share) / 3600


@dataclass
class Estimate:
    """GPU-hours of one backbone, by stage, and what they rest on."""

    size: Size | None
    hours: dict[str, float] = field(default_factory=lambda: {"generate": 0.0, "timing": 0.0,
                                                             "analyses": 0.0})
    decodes: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.hours.values())


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


def _filled(method: dict, identity) -> dict:
    """A job's method with defaults filled and ``auto`` parameters chosen for ``identity``
    (a planned campaign leaves them unbound where its checkpoints are missing)."""
    try:
        return registry.bind_method(method, identity)
    except registry.NoFit:
        return registry.bind_method(method, None)


def _spa_budgets(method: dict, n_layers: int) -> list[float] | None:
    from .engine.spa_profiles import PROFILES, layer_budgets

    c = method["cache"]
    if c["name"] != "spa" or c.get("budget") != "adaptive" or c.get("profile") not in PROFILES:
        return None
    return layer_budgets(n_layers, c["profile"], c.get("rho_p"), c.get("scale", 1.0),
                         c.get("left_floor"))


def estimate(campaign, gpu: Gpu = Gpu(), parallel_tokens: float = 1.0,
             prompt_override: float | None = None) -> dict[str, Estimate]:
    """GPU-hours per backbone: each generate job's samples (and its warm-up) at the method's
    batch size on CUDA, each timing job's batch-1 decodes (warm-up and ``repeats`` per timed
    sample, of the method and the reference) and its throughput pass, each analysis job's
    decodes (shadow: one per sample plus a full forward per probe; intervention: three per
    problem, the trunk and both branches, at most; drift: one per sample)."""
    import torch

    from .generate import resolve_batch_size

    compile_mode = campaign.config.get("compile", "none")
    shards = campaign.config["shards"]
    timing = campaign.config["timing"]
    ref = campaign.config["reference_method"]
    out: dict[str, Estimate] = {}
    for b in campaign.backbones:
        size = backbone_size(campaign, b)
        est = out[b] = Estimate(size)
        if size is None:
            est.notes.append("size unknown: no config.json and no known checkpoint by this name")
            continue
        params = size.parameters
        for t in campaign.tasks:
            n = task_samples(campaign, t)
            p = prompt_tokens(campaign, b, t, size, prompt_override)
            timed = min(n, timing["samples"])

            def price(name: str) -> cost.Decode:
                method = _filled(campaign.method(name, t, b), size.identity)
                return cost.decode_cost(method, p, size.n_layers, parallel_tokens,
                                        _spa_budgets(method, size.n_layers), size.block_size)

            reference = price(ref)
            for m in campaign.methods_on(b, t):
                one = price(m)
                batch = resolve_batch_size(campaign.batch_size(m), torch.device("cuda"), compile_mode)
                f = one.flops(params)
                est.hours["generate"] += gpu.hours(n * f, batch > 1) + shards * gpu.hours(f, False)
                pair = [one] + ([reference] if m != ref else [])
                latency = sum((1 + timing["repeats"] * timed) * d.flops(params) for d in pair)
                est.hours["timing"] += gpu.hours(latency, False) + gpu.hours(timed * f, batch > 1) \
                    + gpu.hours(f, False)
                est.decodes += n + shards + (1 + timing["repeats"] * timed) * len(pair) + timed + 1
            for kind, per_sample in (("shadow", 1), ("intervention", 3), ("drift", 1)):
                for (bb, tt, m), options in campaign.analyses.get(kind, {}).items():
                    if (bb, tt) != (b, t):
                        continue
                    one = price(m)
                    k = min(n, options.get("limit") or n)
                    rows = per_sample * one.rows
                    if kind == "shadow":  # a fresh full forward at each probed update
                        rows += options.get("rate", 1.0) * one.updates * (p + one.gen_length)
                    est.hours["analyses"] += gpu.hours(k * 2.0 * params * rows, False)
                    est.decodes += k * per_sample
    return out


def assumptions(campaign, gpu: Gpu, parallel_tokens: float,
                prompt_override: float | None, sizes: dict | None = None) -> list[str]:
    """Every assumption the GPU-hours rest on, as the plan prints them (the samplers' and
    caches' of the campaign's methods; ``sizes``: the backbones' ``Size``, for the lines only
    some backbones need)."""
    used = {part: sorted({m[part]["name"] for m in campaign.methods.values()},
                         key=list(registry.KINDS[part]).index) for part in ("sampler", "cache")}
    sizes = sizes if sizes is not None else {b: backbone_size(campaign, b) for b in campaign.backbones}
    moe = [b for b, z in sizes.items() if z is not None and z.total and z.total > z.parameters * 1.5]
    blocky = [f"{b} ({z.block_size})" for b, z in sizes.items() if z is not None and z.block_size]
    return [
        "parameters: counted on the native model built from the backbone's config.json where its "
        "directory is there, else from the published architecture of a known checkpoint matched "
        "by name (" + ", ".join(k[1] for k in KNOWN_MOE_CHECKPOINTS + KNOWN_BLOCK_CHECKPOINTS
                                + KNOWN_CHECKPOINTS) + ")",
        *([f"mixture of experts ({', '.join(moe)}): priced by the ACTIVE parameters per token, "
           "not the total held in memory (the GPU count's): embedding, head, attention, the "
           "dense layers' FFN, and per MoE layer the router, the top-k routed experts and the "
           "shared experts (config.json's num_experts_per_tok x the expert width + the shared "
           "width; a known checkpoint's active count from its model card)"] if moe else []),
        *([f"block-causal backbones, block size ({', '.join(blocky)}): "
           + cost.BLOCK_CAUSAL.split(": ", 1)[1]] if blocky else []),
        "FLOPs: 2 x parameters per row a forward computes; a full forward computes every prompt "
        "and response row, a cached one the rows its cache recomputes (attention's N^2 term, "
        "identifiers and launch overheads left out: cached steps run below the assumed "
        "utilisation, so caches' gains are upper bounds)",
        "prompt tokens: "
        + (f"{prompt_override:g} for every task (--prompt-tokens)" if prompt_override is not None
           else f"each benchmark's mean prompt characters (its module's "
                f"Benchmark.prompt_chars, measured or estimated) / {CHARS_PER_TOKEN:g} (one token per "
                f"character for the toy's tokenizer), + {CHAT_TOKENS} for a chat template"),
        "samples: each task's size (its module's Benchmark.rows; a local file's records), its limit, ids or n",
        *(f"sampler {k}: {cost.SAMPLER_ASSUMPTIONS[k]}" for k in used["sampler"]),
        *(f"cache {k}: {cost.CACHE_ASSUMPTIONS[k]}" for k in used["cache"]),
        *([f"adaptive parallel samplers decode {parallel_tokens:g} token(s) per update"]
          if set(used["sampler"]) & {"threshold", "factor", "eb_sampler", "wino"} else []),
        f"GPU: {gpu.name}, {gpu.peak_tflops:g} TFLOP/s dense bf16, at {gpu.utilization:.0%} "
        f"when samples decode together (generate jobs at the method's batch size on CUDA, "
        f"throughput passes) and {gpu.utilization_b1:.0%} one at a time (warm-ups, the timing "
        "stage's latency passes, analyses)",
        "timing: per job a warm-up and `repeats` decodes of each timed sample by the method and "
        "the reference (batch 1), then a warm-up and one throughput pass of the method",
        "analyses: shadow one decode per sample plus a full forward per probe (rate of the "
        "updates); intervention three decodes per problem (at most); drift one",
        "not counted: train_toy, svd and prepare/score jobs (CPU or minutes), loading the "
        "weights, queueing",
    ]


def _h(hours: float) -> str:
    """Hours to three significant digits (a toy's are tiny)."""
    return f"{hours:.3g}" if hours < 100 else f"{hours:.0f}"


def _si(n: float) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return f"{n:.0f}"


def gpu_lines(campaign) -> list[str]:
    """GPUs per model job (generate, timing, probes) per backbone, with the memory need they
    come from (dlmpipe/gpus.py)."""
    from .gpus import describe, uses_gpus

    r = campaign.config["resources"]["generate"]
    if not uses_gpus(campaign.config):
        return [f"GPUs per model job: 0 (device: {campaign.config['device']}; with device: cuda "
                "each backbone's jobs ask for the GPUs its memory need takes)"]
    lines = [f"GPUs per model job (generate, timing, probes; {r['gpu_memory_gb']:g} GB per GPU"
             + (f", at most {r['max_gpus']}" if r["max_gpus"] is not None else "") + "):"]
    for b in campaign.backbones:
        g = campaign.gpus(b)
        need = describe(g.need) if g.need is not None else "size unknown"
        lines.append(f"  {b:24s} {g.gpus:3d}  {g.source}: {need}")
    return lines


def block_length_notes(campaign, sizes: dict) -> list[str]:
    """What each sampler's ``block_length`` means on the campaign's block-causal backbones
    (docs/METHODS.md, "Block-causal backbones"): sub-blocks of the active block, and one sub-block,
    the whole active block, where it does not divide the backbone's block size. The campaign's
    check tiles gen_length with it (registry ``blocks_tile_response``); the backbone's block
    size decides what it does, so the plan states it for every (method, backbone) it changes."""
    notes = []
    for b, size in sizes.items():
        if size is None or not size.block_size:
            continue
        n = size.block_size
        for m in dict.fromkeys(m for t in campaign.tasks for m in campaign.methods_on(b, t)):
            t = next(t for t in campaign.tasks if campaign.runs(m, b, t))
            block = campaign.method(m, t, b)["sampler"].get("block_length")
            if block and n % block:
                notes.append(f"{m} on {b}: sampler.block_length {block} does not divide the "
                             f"backbone's blocks of {n}: one sub-block, the whole active block "
                             f"of {n} (as block_length {n})")
    return notes


def render(campaign, source: str, gpu: Gpu = Gpu(), parallel_tokens: float = 1.0,
           prompt_override: float | None = None) -> str:
    """The plan as text: jobs per rule, samples per task, GPU-hours per backbone, assumptions."""
    counts = jobs_per_rule(campaign)
    estimates = estimate(campaign, gpu, parallel_tokens, prompt_override)
    lines = [f"plan of {source} ({campaign.config['results_dir']}): {len(campaign.backbones)} "
             f"backbones, {len(campaign.tasks)} tasks, {len(campaign.methods)} methods, "
             f"{len(campaign.decoding_jobs())} decoding jobs", "", "jobs per rule:"]
    lines += [f"  {rule:24s} {n:6d}" for rule, n in counts.items()]
    lines += [f"  {'total':24s} {sum(counts.values()):6d}", "", "samples per task:"]
    for t in campaign.tasks:
        bench = campaign.benchmark(t)
        lines.append(f"  {t:24s} {task_samples(campaign, t):6d}"
                     + (f"  (benchmark {bench})" if bench != t else ""))
    lines += ["", f"GPU-hours per backbone (estimate; {gpu.name}):",
              f"  {'backbone':24s} {'params':>8s} {'generate':>9s} {'timing':>8s} "
              f"{'analyses':>9s} {'total':>8s} {'decodes':>8s}  size from"]
    for b, est in estimates.items():
        if est.size is None:
            lines.append(f"  {b:24s} {'?':>8s}  " + "; ".join(est.notes))
            continue
        h = est.hours
        lines.append(f"  {b:24s} {_si(est.size.parameters):>8s} {_h(h['generate']):>9s} "
                     f"{_h(h['timing']):>8s} {_h(h['analyses']):>9s} {_h(est.total):>8s} "
                     f"{est.decodes:8d}  {est.size.source}")
    known = [e for e in estimates.values() if e.size is not None]
    lines.append(f"  {'total':24s} {'':8s} {_h(sum(e.hours['generate'] for e in known)):>9s} "
                 f"{_h(sum(e.hours['timing'] for e in known)):>8s} "
                 f"{_h(sum(e.hours['analyses'] for e in known)):>9s} "
                 f"{_h(sum(e.total for e in known)):>8s}")
    if campaign.config.get("device") == "cpu":
        lines.append("  (this campaign decodes on the CPU: the hours are what a GPU would take)")
    lines += ["", *gpu_lines(campaign)]
    if notes := block_length_notes(campaign, {b: e.size for b, e in estimates.items()}):
        lines += ["", "block lengths on block-causal backbones (docs/METHODS.md, \"Block-causal "
                  "backbones\"):"] + [f"  - {n}" for n in notes]
    lines += ["", "assumptions:"] + [f"  - {a}" for a in assumptions(
        campaign, gpu, parallel_tokens, prompt_override, {b: e.size for b, e in estimates.items()})]
    missing = [b for b in campaign.backbones if (p := campaign.checkpoint_path(b)) is not None
               and not Path(p).is_dir()]
    if missing:
        lines += ["", "checkpoints not here yet (planned without them): " + ", ".join(
            f"{b} ({campaign.checkpoint_path(b)})" for b in missing)]
    return "\n".join(lines)
