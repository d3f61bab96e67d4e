"""The environment fingerprint: what a generation, timing or summary row was computed on.

The same campaign can give different tokens and very different times on another CPU, GPU,
driver, library version or thread count, so every generations, timing and summary row carries
the facts below as explicit columns (docs/ARCHITECTURE.md, file contracts) plus
``fingerprint``, a short hash of them: two rows share a fingerprint exactly when every field
agrees. The summary refuses speedups whose timing rows mix fingerprints and flags qualities
whose generation rows do (dlmpipe/analysis/summary.py). Provenance records use the same
versions and revision (``provenance_versions``): one fact, one place.

Computed once per process and device kind (``environment``); a job fixes its threads before
it decodes, so the thread counts read here are the ones it decoded with.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import subprocess
from pathlib import Path

# the columns, in order; every one of them enters the fingerprint: each can change the tokens
# (kernels, library numerics, the decoding code) or the times (hardware, threads)
FIELDS = ("cpu_model", "gpu_name", "gpu_driver", "cuda_version", "torch_version",
          "transformers_version", "dlmpipe_revision", "torch_threads", "omp_num_threads")
FINGERPRINT = "fingerprint"
COLUMNS = (*FIELDS, FINGERPRINT)


@functools.lru_cache(maxsize=None)
def git_revision() -> str:
    """dlmpipe's git revision (``<sha>``, ``<sha>-dirty`` with uncommitted changes to the
    library's tracked files, ``unknown`` outside a checkout). Only the library's own files count:
    an edited campaign config changes no token or time, and must not make the runs timed before
    it look like another environment than those timed after it."""
    here = Path(__file__).parent

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=here,
                              timeout=5).stdout.strip()

    try:
        sha = git("rev-parse", "HEAD")
        if not sha:
            return "unknown"
        return sha + ("-dirty" if git("status", "--porcelain", "--untracked-files=no", "--", ".") else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux), else what the platform module says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.split(":", 1)[0].strip() in ("model name", "Hardware", "cpu model"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def nvidia_driver() -> str:
    """The NVIDIA kernel driver's version ("" where none answers)."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
        for word in text.split():
            if word[:1].isdigit() and word.count(".") >= 1:
                return word
    except OSError:
        pass
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10).stdout.split()
        return out[0] if out else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def fingerprint_id(fields: dict) -> str:
    """12 hex digits of sha256 over the fields (key order does not matter; values as text)."""
    text = json.dumps({k: "" if fields.get(k) is None else str(fields[k]) for k in FIELDS},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def transformers_version() -> str:
    """The installed transformers' version, read from its package metadata: importing it takes
    0.5-1 s, and the model jobs no longer need it (backbones/light_tokenizer.py)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("transformers")
    except PackageNotFoundError:
        return ""


@functools.lru_cache(maxsize=None)
def _environment(device_type: str, device_index: int | None) -> dict:
    import torch

    gpu = {"gpu_name": "", "gpu_driver": "", "cuda_version": ""}  # decoding on the CPU
    if device_type == "cuda":
        gpu = {"gpu_name": torch.cuda.get_device_name(device_index), "gpu_driver": nvidia_driver(),
               "cuda_version": torch.version.cuda or ""}
    fields = {"cpu_model": cpu_model(), **gpu, "torch_version": torch.__version__,
              "transformers_version": transformers_version(), "dlmpipe_revision": git_revision(),
              "torch_threads": str(torch.get_num_threads()),
              "omp_num_threads": os.environ.get("OMP_NUM_THREADS", "")}
    return {**fields, FINGERPRINT: fingerprint_id(fields)}


def environment(device=None) -> dict:
    """The fingerprint columns of this process decoding on ``device`` (a torch.device or its
    name; default the CPU). The GPU fields are empty on the CPU."""
    import torch

    dev = torch.device(device or "cpu")
    index = (dev.index if dev.index is not None else torch.cuda.current_device()) \
        if dev.type == "cuda" else None
    return dict(_environment(dev.type, index))


def provenance_versions() -> dict:
    """The versions a provenance record names, from the same source as the rows' columns."""
    import torch

    from . import __version__
    return {"dlmpipe": __version__, "git_revision": git_revision(),
            "python": platform.python_version(), "torch": torch.__version__,
            "transformers": transformers_version()}
