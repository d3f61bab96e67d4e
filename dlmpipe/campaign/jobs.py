"""Every generate job's concrete method, per (method, task, backbone): the method's overrides for
that backbone and task applied (dlmpipe/overrides.py), its ``auto`` parameters chosen for the
backbone's checkpoint (``registry.bind``), its generation length (the method's own, else the
task's), and the registry's checks of the result against that length, against the
backbone's widths (config.json, or a toy's options) and against its attention pattern
(block-causal or full), each problem naming the key that set it.
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
        return method, ([f"backbones.{backbone}.path: {identity} (needed to choose the auto "
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
        return ([f"backbones.{backbone}.path: {widths} (needed to check the parameters of {where})"]
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
                jobs[(name, task, backbone)] = {**method, "gen_length": gen_length}
    return jobs, problems


def differences(campaign: Campaign, name: str) -> dict[str, str]:
    """Where the method's jobs decode with other parameters than configured (overrides,
    ``auto`` parameters): ``backbone`` (every task alike) or ``backbone/task`` -> the differing
    parameters as text."""
    point, out = campaign.methods[name], {}
    backbones, tasks = campaign._scope[campaign.origin[name]]
    for backbone in backbones:
        per_task = {}
        for task in tasks:
            job = campaign.method(name, task, backbone)
            per_task[task] = ", ".join(f"{part}.{k}={v}" for part in overrides.PARTS
                                       for k, v in job[part].items() if point[part].get(k) != v)
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
                    problems.append(f"backbones.{backbone}.path: {widths} (needed to check "
                                    f"analyses.drift[{n}].rank)")
            elif rank > widths.value_rank:
                problems.append(f"analyses.drift[{n}].rank: {rank} exceeds the value projection's "
                                f"rank min(n_kv_heads*head_dim, d_model) = min({widths.n_kv_heads}*"
                                f"{widths.head_dim}, {widths.d_model}) = {widths.value_rank} "
                                f"(backbone {backbone}: {widths.source})")
    return problems
