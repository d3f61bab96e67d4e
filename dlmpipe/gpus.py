"""How many GPUs a job that runs the model asks for: its backbone's memory need against the GPU's.

A generate job (and every other job that runs the model: common.smk's ``model_job_resources``)
holds the weights at the backbone's dtype, every layer's K/V of the samples it decodes together,
and activations. Its need is

    weights    parameters held in memory (every expert of a mixture of experts) x dtype bytes
    K/V        layers x kv heads x head width x 2 (K and V) x (prompt + gen_length) x batch size
               x dtype bytes
    margin     ``MARGIN`` x (weights + K/V) + ``OVERHEAD_GB`` (activations, logits, the CUDA
               context, the allocator's slack)

and it asks for ceil(need / ``resources.generate.gpu_memory_gb``) GPUs; the job places its layers
across the GPUs it got (dlmpipe/placement.py). The parameters come from the checkpoint's
safetensors headers where its directory is there, else from what ``dlmpipe plan`` knows of the
published checkpoint (sizes.py ``backbone_size``); the prompt length is the plan's estimate
(``sizes.prompt_tokens``). A campaign fixes the count (``resources.generate.gpu``) or caps it
(``resources.generate.max_gpus``); a need above either is a config error naming the key.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import sizes
from .batch_size import resolve_batch_size

#: bytes per element of a backbone's ``dtype``
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
#: activation and allocator share on top of weights and K/V, and the fixed overhead per GPU job
MARGIN = 0.10
OVERHEAD_GB = 2.0
GB = 1e9


@dataclass(frozen=True)
class Need:
    """One job's memory need, in bytes, by part."""

    weights: float
    kv: float
    rows: float   # prompt + gen_length (the largest task's, for a backbone)
    batch: int

    @property
    def margin(self) -> float:
        return MARGIN * (self.weights + self.kv) + OVERHEAD_GB * GB

    @property
    def total(self) -> float:
        return self.weights + self.kv + self.margin

    def gpus(self, gpu_memory_gb: float) -> int:
        return max(1, math.ceil(self.total / (gpu_memory_gb * GB)))


def memory_need(size: sizes.Size, dtype: str, rows: float, batch: int) -> Need:
    """The need of a job decoding ``batch`` samples of ``rows`` rows on a backbone of ``size``."""
    b = DTYPE_BYTES[dtype]
    kv = size.n_layers * size.n_kv_heads * size.head_dim * 2 * rows * batch * b
    return Need(size.weights * b, kv, rows, batch)


def uses_gpus(config: dict) -> bool:
    """Whether the campaign's model jobs run on GPUs (device cuda, or a fixed GPU count)."""
    fixed = config["resources"]["generate"]["gpu"]
    return bool(fixed) if fixed is not None else config["device"] == "cuda"


def job_batch(campaign, method: str) -> int:
    """The samples a generate job on a GPU decodes together (``auto``: batching's default)."""
    return resolve_batch_size(campaign.batch_size(method), "cuda",
                              campaign.config.get("compile", "none"))


@dataclass(frozen=True)
class JobGpus:
    """The GPUs one model job asks for, and why (``need`` None: the backbone's size is unknown)."""

    gpus: int
    need: Need | None
    source: str


def job_need(campaign, backbone: str, task: str, method: str,
             size: sizes.Size | None = None) -> Need | None:
    """The memory need of the generate job of (``backbone``, ``task``, ``method``)."""
    size = size or sizes.backbone_size(campaign, backbone)
    if size is None:
        return None
    rows = sizes.prompt_tokens(campaign, backbone, task, size, None) + campaign.gen_length(method, task)
    return memory_need(size, campaign.config["backbones"][backbone]["dtype"], rows,
                       job_batch(campaign, method))


def backbone_gpus(campaign, backbone: str) -> JobGpus:
    """The GPUs every model job of ``backbone`` asks for: what its largest generate job needs
    (0 when the campaign decodes on the CPU), fixed or capped by the campaign's keys. Raises
    ``GpuPlanError`` naming the key when the need is above a fixed count or the cap."""
    r = campaign.config["resources"]["generate"]
    if not uses_gpus(campaign.config):
        return JobGpus(r["gpu"] or 0, None, "device is not cuda")
    size = sizes.backbone_size(campaign, backbone)
    needs = [job_need(campaign, b, t, m, size) for b, t, m in campaign.decoding_jobs()
             if b == backbone] if size is not None else []
    need = max(needs, key=lambda n: n.total, default=None)
    planned = need.gpus(r["gpu_memory_gb"]) if need is not None else 1
    where = f"{backbone} needs {planned} GPU(s) of {r['gpu_memory_gb']:g} GB " + (
        f"({describe(need)})" if need is not None else "(size unknown: 1 assumed)")
    if r["gpu"] is not None:
        if planned > r["gpu"]:
            raise GpuPlanError(f"resources.generate.gpu: {r['gpu']} GPU(s) fixed, but {where}; "
                               "raise it, set it to null (planned from memory), or raise "
                               "resources.generate.gpu_memory_gb if the GPUs are larger")
        return JobGpus(r["gpu"], need, "resources.generate.gpu")
    if planned > 1 and campaign.config.get("compile", "none") != "none":
        raise GpuPlanError(f"compile: {campaign.config['compile']} captures or compiles one "
                           f"device's step, but {where} (its layers placed across them); use "
                           "compile: none, or GPUs it fits on (resources.generate.gpu_memory_gb)")
    if r["max_gpus"] is not None and planned > r["max_gpus"]:
        raise GpuPlanError(f"resources.generate.max_gpus: at most {r['max_gpus']} GPU(s) per job, "
                           f"but {where}; raise the cap, lower the batch size or use larger GPUs "
                           "(resources.generate.gpu_memory_gb)")
    return JobGpus(planned, need, "planned from memory")


class GpuPlanError(ValueError):
    """A campaign whose model does not fit the GPUs it allows a job."""


def describe(need: Need) -> str:
    return (f"weights {need.weights / GB:.1f} GB + K/V {need.kv / GB:.2f} GB at batch "
            f"{need.batch} x {need.rows:.0f} rows + margin {need.margin / GB:.1f} GB = "
            f"{need.total / GB:.1f} GB")


def plan_problems(campaign) -> list[str]:
    """Every backbone's GPU plan problem (``GpuPlanError``), for the campaign's check."""
    problems = []
    for b in campaign.backbones:
        try:
            campaign.gpus(b)
        except GpuPlanError as e:
            problems.append(str(e))
    return problems
