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

from dataclasses import dataclass, field
from pathlib import Path

from . import cost, registry
from .batch_size import resolve_batch_size
from .sizes import (KNOWN_BLOCK_CHECKPOINTS, KNOWN_BLOCK_SIZES, KNOWN_CHECKPOINTS,  # noqa: F401
                    KNOWN_MOE_CHECKPOINTS, TOY_VOCABULARY, Size, _header, active_parameters,
                    backbone_size, checkpoint_parameters, parameters)
from .sizes import CHARS_PER_TOKEN, CHAT_TOKENS, prompt_tokens  # noqa: F401

#: rules in the order the workflow runs them
RULE_ORDER = ("fetch_backbone", "fetch_dataset", "train_toy", "prepare_backbone", "svd", "prepare_task", "generate",
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
        # a local job per Hub checkpoint and per task reading dataset ids (workflow/rules/hub.smk)
        "fetch_backbone": sum(map(campaign.is_hub, backbones)),
        "fetch_dataset": sum(map(campaign.reads_dataset_ids, tasks)),
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


#: rules whose jobs run where Snakemake runs, never submitted (the Snakefile's localrules and
#: every rule with `localrule: True`; tests/test_slurm.py checks this list against them)
LOCAL_RULES = frozenset({"all", "fetch_backbone", "fetch_dataset", "prepare_backbone",
                         "prepare_task", "summarize", "plot",
                         "plot_sweeps", "merge_generations", "tables", "shadow_analysis",
                         "intervention_analysis", "drift_analysis"})


def group_components(campaign, override: dict | None = None) -> dict:
    """The campaign's `cluster.group_components` (group -> components per allocation, None:
    ungrouped), with ``override`` (Snakemake's --group-components) winning for a grouped group,
    as the Snakefile merges them (a null group's rules have no group to size)."""
    groups = dict((campaign.config.get("cluster") or {}).get("group_components")
                  or {"decode": 1, "timing": 1})
    return {g: None if n is None else (override or {}).get(g, n) for g, n in groups.items()}


def submissions(campaign, override: dict | None = None) -> tuple[int, int]:
    """(allocations, jobs): the sbatch submissions a cluster executor (profiles/slurm) makes for
    a fresh run of ``campaign`` with its job groups, and the jobs it would submit one by one
    without them. A group's connected components (decode: a method's generate and score jobs,
    or with shards one generate shard; timing: one time_method job) are packed N to an
    allocation, as Snakemake's --group-components does (workflow/rules/common.smk)."""
    counts = jobs_per_rule(campaign)
    jobs = sum(n for rule, n in counts.items() if rule not in LOCAL_RULES)
    groups = group_components(campaign, override)
    per_allocation = lambda n, size: -(-n // size)  # noqa: E731 (ceil)
    grouped = {}  # rule -> components of its group, and the group's size
    shards = campaign.config["shards"]
    if groups.get("decode"):
        # generate and score connected (one component per method); with shards only the shards
        components = counts.get("generate", 0) if shards > 1 else counts.get("score", 0)
        grouped["decode"] = (["generate"] + ([] if shards > 1 else ["score"]), components)
    if groups.get("timing"):
        grouped["timing"] = (["time_method"], counts.get("time_method", 0))
    allocations = jobs
    for group, (rules, components) in grouped.items():
        allocations -= sum(counts.get(rule, 0) for rule in rules)
        allocations += per_allocation(components, groups[group])
    return allocations, jobs


def task_samples(campaign, task: str) -> int:
    """Samples of ``task`` every method decodes (its benchmark's known size, ``limit``, ...)."""
    from .tasks.registry import task_rows

    return task_rows(campaign.benchmark(task), campaign.task_options(task))


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
                                        _spa_budgets(method, size.n_layers),
                                        method.get("block_size") or size.block_size)

            reference = price(ref)
            for m in campaign.methods_on(b, t):
                one = price(m)
                batch = resolve_batch_size(campaign.batch_size(m), "cuda", compile_mode)
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
    blocky = [f"{b} ({campaign.config['backbones'][b].get('block_size') or z.block_size})"
              for b, z in sizes.items() if z is not None and z.block_size]
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
        for m in dict.fromkeys(m for t in campaign.tasks for m in campaign.methods_on(b, t)):
            t = next(t for t in campaign.tasks if campaign.runs(m, b, t))
            job = campaign.method(m, t, b)
            n = job.get("block_size") or size.block_size
            block = job["sampler"].get("block_length")
            if block and n % block:
                notes.append(f"{m} on {b}: sampler.block_length {block} does not divide the "
                             f"backbone's blocks of {n}: one sub-block, the whole active block "
                             f"of {n} (as block_length {n})")
    return notes


def block_size_lines(campaign, sizes: dict) -> list[str]:
    """Each block-causal backbone's block size (the checkpoint's, the campaign's
    ``backbones.<b>.block_size``, and methods with their own ``block_size``) and how its
    release maps the generation length onto blocks at that size (docs/MODELS.md, "Block sizes
    and generation lengths"; campaign/jobs.py ``GEN_LENGTH_MAPPING``)."""
    from .campaign.backbones import Checkpoints
    from .campaign.jobs import GEN_LENGTH_MAPPING

    checkpoints = Checkpoints(campaign.config["backbones"])  # a shipped toy_block is SDAR's
    lines = []
    for b, size in sizes.items():
        if size is None or not size.block_size:
            continue
        own = campaign.config["backbones"][b].get("block_size")
        text = (f"{own} (backbones.{b}.block_size; the checkpoint's {size.block_size})" if own
                else f"{size.block_size} (the checkpoint's)")
        per_method = {}
        for t in campaign.tasks:
            for m in campaign.methods_on(b, t):
                n = campaign.method(m, t, b).get("block_size")
                if n is not None and n != own:
                    per_method[m] = n
        if per_method:
            text += "; methods with their own block_size: " + ", ".join(
                f"{m} {n}" for m, n in per_method.items())
        lines.append(f"{b}: block size {text}")
        identity = checkpoints.identity(b)
        family = getattr(identity, "family", None) or getattr(size.identity, "family", None)
        if family in GEN_LENGTH_MAPPING:
            lines.append(f"  gen_length G, prompt P, block n: {GEN_LENGTH_MAPPING[family]}")
    return lines


def render(campaign, source: str, gpu: Gpu = Gpu(), parallel_tokens: float = 1.0,
           prompt_override: float | None = None) -> str:
    """The plan as text: jobs per rule, samples per task, GPU-hours per backbone, assumptions."""
    counts = jobs_per_rule(campaign)
    estimates = estimate(campaign, gpu, parallel_tokens, prompt_override)
    lines = [f"plan of {source} ({campaign.config['results_dir']}): {len(campaign.backbones)} "
             f"backbones, {len(campaign.tasks)} tasks, {len(campaign.methods)} methods, "
             f"{len(campaign.decoding_jobs())} decoding jobs", "", "jobs per rule:"]
    lines += [f"  {rule:24s} {n:6d}" for rule, n in counts.items()]
    allocations, submitted = submissions(campaign)
    groups = group_components(campaign)
    lines += [f"  {'total':24s} {sum(counts.values()):6d}", "",
              f"SLURM submissions (profiles/slurm): {allocations} allocations for {submitted} "
              "submitted jobs (cluster.group_components: "
              + ", ".join(f"{g} {'ungrouped' if n is None else n}" for g, n in groups.items())
              + "; the others run where Snakemake runs)", "", "samples per task:"]
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
    if blocks := block_size_lines(campaign, {b: e.size for b, e in estimates.items()}):
        lines += ["", "block sizes and generation lengths on block-causal backbones "
                  "(docs/MODELS.md, \"Block sizes and generation lengths\"):"] \
            + [f"  {n}" for n in blocks]
    if notes := block_length_notes(campaign, {b: e.size for b, e in estimates.items()}):
        lines += ["", "block lengths on block-causal backbones (docs/METHODS.md, \"Block-causal "
                  "backbones\"):"] + [f"  - {n}" for n in notes]
    lines += ["", "assumptions:"] + [f"  - {a}" for a in assumptions(
        campaign, gpu, parallel_tokens, prompt_override, {b: e.size for b, e in estimates.items()})]
    missing = [b for b in campaign.backbones if not campaign.is_hub(b) and (
        p := campaign.checkpoint_path(b)) is not None and not Path(p).is_dir()]
    if missing:
        lines += ["", "checkpoints not here yet (planned without them): " + ", ".join(
            f"{b} ({campaign.checkpoint_path(b)})" for b in missing)]
    unfetched = [b for b in campaign.backbones if campaign.is_hub(b) and not campaign.hub.fetched(b)]
    if unfetched:
        lines += ["", "Hub checkpoints not fetched yet (`python -m dlmpipe fetch CONFIG`, or the "
                  "workflow's fetch jobs): " + ", ".join(
                      f"{b} ({campaign.config['backbones'][b]['hub']})" for b in unfetched)]
    return "\n".join(lines)
