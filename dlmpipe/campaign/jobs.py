"""Every generate job's concrete method, per (method, task, backbone): the method's overrides for
that backbone and task applied (dlmpipe/overrides.py), its ``auto`` parameters chosen for the
backbone's checkpoint (``registry.bind``), its generation length (the method's own, else the
task's), and the registry's checks of the result against that length, against the
backbone's widths (config.json, or a toy's options) and against its attention pattern
(block-causal or full), its block size (``methods.<m>.block_size``, else
``backbones.<b>.block_size``, else the checkpoint's) against what the release allows, each
problem naming the key that set it.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import overrides, registry
from ..backbones.families import family
from ..backbones.identity import CheckpointError
from .backbones import Checkpoints

if TYPE_CHECKING:
    from . import Campaign


def bind(where: str, method: dict, backbone: str, checkpoints: Checkpoints,
         check_paths: bool) -> tuple[dict, list[str]]:
    """``method`` with its ``auto`` parameters chosen for the backbone."""
    if not any(method[part].get(key) == "auto"
               for part in overrides.PARTS
               for key in registry.lookup(part, method[part]["name"]).auto):
        return method, []
    identity = checkpoints.identity(backbone)
    if isinstance(identity, CheckpointError):
        # a missing directory or config.json is reported by backbone_problems; unchecked paths
        # (check_paths=False): the generate job chooses, from the manifest
        return method, ([f"backbones.{backbone}.{checkpoints.key(backbone)}: {identity} (needed to choose the auto "
                         f"parameters of {where})"]
                        if check_paths and checkpoints.readable(backbone) else [])
    try:
        return {**method, **{part: registry.bind(part, method[part], identity)
                             for part in overrides.PARTS}}, []
    except registry.NoFit as e:
        return method, [f"{where}.{e}; set {where}.{e.kind}.{e.key}, or "
                        f"{where}.overrides.{backbone}.{e.kind}.{e.key} for this backbone"]


def width_problems(where: str, method: dict, backbone: str, checkpoints: Checkpoints,
                   check_paths: bool, job: str) -> list[str]:
    """The method's parameters against the backbone's widths (read only when a check applies);
    ``job`` says which job's method it is."""
    if not any(registry.lookup(part, method[part]["name"]).width_checks for part in overrides.PARTS):
        return []
    widths = checkpoints.widths(backbone)
    if isinstance(widths, CheckpointError):
        return ([f"backbones.{backbone}.{checkpoints.key(backbone)}: {widths} (needed to check the parameters of {where})"]
                if check_paths and checkpoints.readable(backbone) else [])
    return [f"{where}.{p} ({job}: {widths.source})" for p in registry.widths_problems(method, widths)]


def attention_problems(where: str, method: dict, backbone: str, checkpoints: Checkpoints,
                       job: str) -> list[str]:
    """The method's sampler and cache against the backbone's attention pattern (its family's,
    from config.json's model_type: block-causal for SDAR and Fast-dLLM v2; a toy is LLaDA's)."""
    identity = checkpoints.identity(backbone)
    if isinstance(identity, CheckpointError):
        return []  # reported where the checkpoint is checked
    attention = family(identity.family).attention
    return [f"{where}: {p} ({job}: {identity.describe()})"
            for p in registry.attention_problems(method, attention)]


#: what each block-causal family's release does with the generation length at block size n
#: (docs/MODELS.md, "Block sizes and generation lengths"); printed by ``dlmpipe plan``
GEN_LENGTH_MAPPING = {
    "sdar": "SDAR generate.py block_diffusion_generate(gen_length, block_length=n): "
            "ceil((P + G) / n) blocks from block 0, positions P .. ceil((P + G) / n) * n decoded; "
            "dlmpipe decodes the same blocks with gen_length G",
    "llada2": "LLaDA2.0 modeling_llada2_moe.py generate(gen_length, block_length=n) and dInfer "
              "(generate_uniform.py, new_gen_length = total_length - prompt_length): "
              "ceil((P + G) / n) blocks from block 0, as SDAR; dlmpipe decodes the same blocks "
              "with gen_length G",
    "fast_dllm_v2": "Fast-dLLM v2 batch_sample(block_size=n, max_new_tokens=M) "
                    "(v2/generation_functions.py): P // n + M // n blocks counted from block 0 "
                    "(M < n decodes none), and each committed block's forward appends its greedy "
                    "next token, so it returns one token more, ending at (P // n + M // n) * n + 1; "
                    "dlmpipe decodes whole blocks up to ceil((P + G) / n) * n and skips the last "
                    "block's store forward, so G = (P // n + M // n) * n - P decodes the release's "
                    "blocks and returns its response without that last token",
}


def block_size_of(campaign: Campaign, name: str, base: str,
                  backbone: str) -> tuple[int | None, str]:
    """The block size a method's jobs on ``backbone`` decode with and the key that set it: the
    method's ``block_size`` (set, or this point's of its sweep), else the backbone's, else
    (None, "") the checkpoint's."""
    method_value = campaign.methods[name].get("block_size")
    if method_value is not None:
        swept = "block_size" in (campaign.config["methods"][base].get("sweep") or {})
        return method_value, f"methods.{base}.{'sweep.' if swept else ''}block_size"
    value = campaign.config["backbones"][backbone].get("block_size")
    return (value, f"backbones.{backbone}.block_size") if value is not None else (None, "")


def block_size_problems(key: str, n: int, method: dict, gen_length: int, identity,
                        job: str) -> list[str]:
    """A campaign's block size against what the backbone's release allows (docs/MODELS.md):
    a block-causal family only (a bidirectional one has no blocks); on Fast-dLLM v2 at least
    one block of response (batch_sample decodes ``max_new_tokens // block_size`` blocks past the
    prompt's: fewer positions decode none) and sub-blocks that tile the block (``num_small_blocks
    = block_size // small_block_size``: a remainder's masks are never decoded and the block's
    loop never ends). SDAR and LLaDA2.0 (dInfer) take any positive block length. ``identity``:
    the backbone's (``BackboneIdentity``; a ``CheckpointError`` is reported elsewhere); ``job``
    says which job it is about. Also ``dlmpipe decode --block-size``'s check."""
    if isinstance(identity, CheckpointError):
        return []  # reported where the checkpoint is checked
    fam = family(identity.family)
    if fam.attention != "block_causal":
        # a backbone's key: one problem, whichever job asks; a method's: which job, and the fix
        where = (f" ({job}); restrict the method to block-causal backbones "
                 f"({'.'.join(key.split('.')[:2])}.backbones)"
                 if key.startswith("methods.") else "")
        return [f"{key}: {n}: {identity.describe()} attends bidirectionally, it has no blocks; "
                f"a block size applies to the block-causal families only (sdar, fast_dllm_v2, "
                f"llada2){where}"]
    problems = []
    if fam.name == "fast_dllm_v2":
        if gen_length < n:
            problems.append(
                f"{key}: {n} exceeds gen_length {gen_length} ({job}): Fast-dLLM v2's batch_sample "
                f"decodes max_new_tokens // block_size blocks past the prompt's "
                f"(v2/generation_functions.py), none below one block; use gen_length >= {n}")
        if method["sampler"]["name"] == "fast_dllm_v2":
            sub = method["sampler"].get("sub_block_length",
                                        registry.lookup("sampler", "fast_dllm_v2").defaults()
                                        .get("sub_block_length"))
            if sub and n % sub:
                problems.append(
                    f"{key}: {n} is not a multiple of sampler.sub_block_length {sub} ({job}): "
                    f"Fast-dLLM v2's batch_sample steps block_size // small_block_size sub-blocks "
                    f"(v2/generation_functions.py), the remainder would never be decoded")
    return problems


def build_jobs(campaign: Campaign, checkpoints: Checkpoints,
               check_paths: bool) -> tuple[dict[tuple[str, str, str], dict], list[str]]:
    """(method, task, backbone) -> the method its generate job decodes with, and the problems
    found on the way."""
    problems: list[str] = []
    jobs: dict[tuple[str, str, str], dict] = {}
    for name, point in campaign.methods.items():
        base = campaign.origin[name]
        where = f"methods.{base}"
        backbones, tasks = campaign._scope[base]
        # the generation length a job decodes with: the method's own, else each task's
        length_key = "gen_length" if "gen_length" in point else None
        for task in tasks:
            gen_length = campaign.gen_length(name, task)
            source_key = length_key or f"tasks.{task}.gen_length"
            for backbone in backbones:
                method, applied, found = overrides.apply(where, point, campaign._overrides[base],
                                                         backbone, task)
                method, bound = bind(where, method, backbone, checkpoints, check_paths)
                problems += found + bound
                used = ", ".join(f"{where}.overrides.{e.key}" for e in applied)
                via = f" on {backbone}, with {used}" if applied else ""
                problems += [f"{where}.{p} (method {name}{via}, {source_key})"
                             for p in registry.gen_length_problems(method, gen_length)]
                job = f"method {name} on {backbone}" + (f", with {used}" if applied else "")
                problems += width_problems(where, method, backbone, checkpoints, check_paths, job)
                problems += attention_problems(where, method, backbone, checkpoints, job)
                block, block_key = block_size_of(campaign, name, base, backbone)
                if block is not None:
                    problems += block_size_problems(block_key, block, method, gen_length,
                                                    checkpoints.identity(backbone), job)
                # the block size only where the campaign sets one: other jobs' params unchanged
                jobs[(name, task, backbone)] = {**method, "gen_length": gen_length,
                                                **({"block_size": block} if block is not None else {})}
    return jobs, problems


def differences(campaign: Campaign, name: str) -> dict[str, str]:
    """Where the method's jobs decode with other parameters than configured (overrides,
    ``auto`` parameters, a campaign's block size): ``backbone`` (every task alike) or
    ``backbone/task`` -> the differing parameters as text."""
    point, out = campaign.methods[name], {}
    backbones, tasks = campaign._scope[campaign.origin[name]]
    for backbone in backbones:
        per_task = {}
        for task in tasks:
            job = campaign.method(name, task, backbone)
            per_task[task] = ", ".join([f"{part}.{k}={v}" for part in overrides.PARTS
                                        for k, v in job[part].items() if point[part].get(k) != v]
                                       + ([f"block_size={job['block_size']}"]
                                          if job.get("block_size") != point.get("block_size")
                                          else []))
        if len(set(per_task.values())) == 1:
            if (diff := next(iter(per_task.values()))):
                out[backbone] = diff
        else:
            out.update({f"{backbone}/{t}": d for t, d in per_task.items() if d})
    return out


def drift_rank_problems(campaign: Campaign, checkpoints: Checkpoints, check_paths: bool) -> list[str]:
    """Each drift profile's ``rank`` against its backbones' value projections (the svd rule
    stores at most that many singular directions)."""
    problems = []
    for n, entry in enumerate(campaign.config["analyses"].get("drift", [])):
        rank = entry.get("rank")
        if rank is None:
            continue
        for backbone in entry.get("backbones") or campaign.backbones:
            if backbone not in campaign.backbones:
                continue  # reported by the analyses' own check
            widths = checkpoints.widths(backbone)
            if isinstance(widths, CheckpointError):
                if check_paths and checkpoints.readable(backbone):
                    problems.append(f"backbones.{backbone}.{checkpoints.key(backbone)}: {widths} (needed to check "
                                    f"analyses.drift[{n}].rank)")
            elif rank > widths.value_rank:
                problems.append(f"analyses.drift[{n}].rank: {rank} exceeds the value projection's "
                                f"rank min(n_kv_heads*head_dim, d_model) = min({widths.n_kv_heads}*"
                                f"{widths.head_dim}, {widths.d_model}) = {widths.value_rank} "
                                f"(backbone {backbone}: {widths.source})")
    return problems
