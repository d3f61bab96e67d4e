"""Paired, interleaved timing of a campaign's methods on one (backbone, task).

Speedups from separate generate jobs compare times taken minutes apart, under whatever else
the machine was doing then; on a CPU that noise is as large as the effects. This job loads the
model once, warms every method up, then decodes the same samples with every method, the
methods in a rotated order for each (repeat, sample) so that no method always runs first or
last, and writes every synchronized time. ``dlmpipe.analysis.speedup`` turns them into paired
per-sample ratios (a method against the reference on the same sample), their median and a
bootstrap interval over samples. Decoding is exactly the generate job's (same per-sample
seeds), so the timed work is the scored work; the token ids are kept to show it.
"""
from __future__ import annotations

import gc
from pathlib import Path

import pyarrow as pa
import torch

from .decode import decode
from .environment import COLUMNS as ENVIRONMENT_COLUMNS
from .environment import environment
from .generate import device_name, encode_prompt, resolve_device, sample_seed
from .io import atomic_write_parquet

TIMING_SCHEMA = pa.schema([
    ("backbone", pa.string()), ("task", pa.string()), ("method", pa.string()),
    ("sample_index", pa.int64()), ("repeat", pa.int64()), ("slot", pa.int64()),
    ("time_s", pa.float64()), ("nfe", pa.int64()), ("token_ids", pa.list_(pa.int64())),
    ("device", pa.string()),
    # the environment every method was timed in (one process: one fingerprint per file)
    *((c, pa.string()) for c in ENVIRONMENT_COLUMNS),
])


def rotation(methods: list[str], turn: int) -> list[str]:
    """The methods in the order of one (repeat, sample): rotated by ``turn`` places."""
    k = turn % len(methods)
    return methods[k:] + methods[:k]


def timed_samples(n_rows: int, samples: int) -> list[int]:
    """The fixed subset every method is timed on: the first ``samples`` rows of the task."""
    return list(range(min(n_rows, samples)))


def run_timing_job(manifest: str, task_file: str, methods: list[dict], out: str, seed: int = 0,
                   device: str = "auto", compile: str = "none", samples: int = 10,
                   repeats: int = 3, proxies: str | None = None, log=print) -> None:
    """Time every method of ``methods`` (each as its generate job receives it: name, sampler,
    cache, gen_length) on the first ``samples`` samples, ``repeats`` times, interleaved; built
    as the generate job builds it (``auto`` parameters bound, proxies, ``compile``)."""
    from . import registry
    from .backbones.identity import checkpoint_identity
    from .backbones.loading import load_backbone
    from .backbones.manifest import read_manifest
    from .methods import build_method
    from .tasks import read_task_table

    if not methods:
        raise ValueError("no methods to time")
    if samples < 1 or repeats < 1:
        raise ValueError(f"timing needs samples >= 1 and repeats >= 1 (got {samples}, {repeats})")
    man = read_manifest(manifest)
    identity = checkpoint_identity(man["path"])
    methods = [registry.bind_method(m, identity) for m in methods]
    if not proxies and any("proxies" in registry.artifacts(m) for m in methods):
        raise ValueError("an SPA-Cache method with the singular identifier needs the backbone's "
                         "proxies file (--proxies)")
    dev = resolve_device(device)
    rows = read_task_table(task_file)
    if not rows:
        raise ValueError(f"{task_file}: the task has no samples to time")
    loaded = load_backbone(man["path"], dtype=man.get("dtype", "float32"), device=dev,
                           sha256=man.get("sha256"))
    model = loaded.model
    artifacts = {}
    if proxies:  # the backbone's singular proxies (svd rule), checked against its fingerprint
        from .engine.proxies import load_proxies
        artifacts["proxies"] = load_proxies(proxies, man.get("fingerprint"))
    built = {m["name"]: build_method(m, model, artifacts, compile=compile) for m in methods}
    gen_len = {m["name"]: int(m["gen_length"]) for m in methods}
    indices = timed_samples(len(rows), samples)
    prompts = {i: torch.tensor(encode_prompt(loaded, rows[i], chat=bool(man.get("chat"))),
                               dtype=torch.long) for i in indices}

    def run(name: str, i: int):
        sampler, cache = built[name]
        gen = torch.Generator().manual_seed(sample_seed(seed, rows[i]["task_id"]))
        return decode(model, sampler, cache, prompts[i], gen_len[name], gen)

    names = list(built)
    for name in names:  # warm-up, untimed: allocations, kernels, caches of every method
        run(name, indices[0])
    task, dev_name, env = Path(task_file).stem, device_name(dev), environment(dev)
    records = []
    gc.collect()
    gc.disable()  # no collector pauses inside a timed decode; collected between samples
    try:
        for r in range(repeats):
            for j, i in enumerate(indices):
                for slot, name in enumerate(rotation(names, r * len(indices) + j)):
                    res = run(name, i)
                    records.append({"backbone": man["name"], "task": task, "method": name,
                                    "sample_index": i, "repeat": r, "slot": slot,
                                    "time_s": res.time_s, "nfe": res.stats["nfe"],
                                    "token_ids": res.response.tolist(), "device": dev_name,
                                    **env})
                gc.collect()
    finally:
        gc.enable()
    atomic_write_parquet(out, pa.Table.from_pylist(records, schema=TIMING_SCHEMA))
    log(f"timed {len(names)} methods x {len(indices)} samples x {repeats} repeats on {dev_name} "
        f"(environment {env['fingerprint']}); mean seconds per decode:")
    for n in names:
        times = [x["time_s"] for x in records if x["method"] == n]
        log(f"  {n:32s} {sum(times) / len(times):.5f}")
