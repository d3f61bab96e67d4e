"""Paired, interleaved timing of a campaign's methods on one (backbone, task).

Speedups from separate generate jobs compare times taken minutes apart, under whatever else
the machine was doing then; on a CPU that noise is as large as the effects. This job loads the
model once, warms every method up, then decodes the same samples with every method, the
methods in a rotated order for each (repeat, sample) so that no method always runs first or
last, and writes every synchronized time. ``dlmpipe.analysis.speedup`` turns them into paired
per-sample ratios (a method against the reference on the same sample), their median and a
bootstrap interval over samples. Decoding is exactly the generate job's (same per-sample
seeds), so the timed work is the scored work; the token ids are kept to show it.

Those rows (``pass`` "latency") keep the papers' protocol: one sample at a time (batch 1). Then
each method decodes the same samples once more, all together at the campaign's batch size
(dlmpipe/batching.py; ``pass`` "throughput", one row per sample with its latency inside the
batch and the pass's wall time ``pass_s``), from which the summary reads throughput (tokens and
samples per second). Every row carries the peak memory of its method at its batch size
(``peak_memory``), measured around the method's untimed warm-up (batch 1) and around its
throughput pass, each from a reset high-water mark.
"""
from __future__ import annotations

import gc
import time
from pathlib import Path

import pyarrow as pa
import torch

from .decode import decode
from .environment import COLUMNS as ENVIRONMENT_COLUMNS
from .environment import environment
from .generate import device_name, encode_prompt, resolve_batch_size, resolve_device, sample_seed
from .io import atomic_write_parquet

TIMING_SCHEMA = pa.schema([
    ("backbone", pa.string()), ("task", pa.string()), ("method", pa.string()),
    ("sample_index", pa.int64()), ("repeat", pa.int64()), ("slot", pa.int64()),
    ("time_s", pa.float64()), ("nfe", pa.int64()), ("token_ids", pa.list_(pa.int64())),
    ("device", pa.string()),
    # "latency" (batch 1, repeated, interleaved) or "throughput" (one batched pass per method)
    ("pass", pa.string()), ("batch_size", pa.int64()),
    ("pass_s", pa.float64()),          # throughput rows: wall time of the method's whole pass
    ("peak_memory_mb", pa.float64()),  # the method's peak memory at this batch size
    ("peak_memory_kind", pa.string()),  # cuda_allocated | cpu_rss_hwm | unavailable
    # the environment every method was timed in (one process: one fingerprint per file)
    *((c, pa.string()) for c in ENVIRONMENT_COLUMNS),
])


def reset_peak_memory(device: torch.device) -> str:
    """Reset the peak-memory mark; returns how it is measured. CUDA: the caching allocator's
    peak of allocated bytes. CPU: the process's resident-set high-water mark (VmHWM), reset by
    writing 5 to /proc/self/clear_refs (Linux); where that cannot be written the mark is the
    process's peak since start ("cpu_rss_hwm_unreset"), and with no /proc at all nothing
    ("unavailable", the columns NaN)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        return "cuda_allocated"
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return "cpu_rss_hwm"
    except OSError:
        return "cpu_rss_hwm_unreset" if Path("/proc/self/status").exists() else "unavailable"


def peak_memory_mb(device: torch.device, kind: str) -> float:
    """The peak since ``reset_peak_memory`` in MiB (NaN when unavailable)."""
    if kind == "cuda_allocated":
        torch.cuda.synchronize(device)
        return torch.cuda.max_memory_allocated(device) / 2 ** 20
    if kind == "unavailable":
        return float("nan")
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    return float("nan")


def rotation(methods: list[str], turn: int) -> list[str]:
    """The methods in the order of one (repeat, sample): rotated by ``turn`` places."""
    k = turn % len(methods)
    return methods[k:] + methods[:k]


def timed_samples(n_rows: int, samples: int) -> list[int]:
    """The fixed subset every method is timed on: the first ``samples`` rows of the task."""
    return list(range(min(n_rows, samples)))


def run_timing_job(manifest: str, task_file: str, methods: list[dict], out: str, seed: int = 0,
                   device: str = "auto", compile: str = "none", samples: int = 10,
                   repeats: int = 3, proxies: str | None = None, log=print,
                   batch_size: int | str = "auto") -> None:
    """Time every method of ``methods`` (each as its generate job receives it: name, sampler,
    cache, gen_length) on the first ``samples`` samples, ``repeats`` times, interleaved; built
    as the generate job builds it (``auto`` parameters bound, proxies, ``compile``). Then one
    throughput pass per method at ``batch_size`` (``generate.resolve_batch_size``; a method's
    own batch size where the campaign gives one: ``methods[i]["batch_size"]``)."""
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
    peaks = {}
    for name in names:  # warm-up, untimed: allocations, kernels, caches of every method
        gc.collect()
        kind = reset_peak_memory(dev)
        run(name, indices[0])
        peaks[name] = (peak_memory_mb(dev, kind), kind)
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
                                    "pass": "latency", "batch_size": 1, "pass_s": float("nan"),
                                    "peak_memory_mb": peaks[name][0],
                                    "peak_memory_kind": peaks[name][1], **env})
                gc.collect()
        for m in methods:
            records += throughput_pass(model, m, artifacts, compile, dev, prompts, indices, rows,
                                       seed, gen_len[m["name"]], m.get("batch_size", batch_size),
                                       {"backbone": man["name"], "task": task, "device": dev_name, **env})
            gc.collect()
    finally:
        gc.enable()
    atomic_write_parquet(out, pa.Table.from_pylist(records, schema=TIMING_SCHEMA))
    log(f"timed {len(names)} methods x {len(indices)} samples x {repeats} repeats on {dev_name} "
        f"(environment {env['fingerprint']}); mean seconds per decode:")
    for n in names:
        times = [x["time_s"] for x in records if x["method"] == n and x["pass"] == "latency"]
        batched = [x for x in records if x["method"] == n and x["pass"] == "throughput"]
        log(f"  {n:32s} {sum(times) / len(times):.5f}  batch {batched[0]['batch_size']}: "
            f"{len(batched) / batched[0]['pass_s']:.2f} samples/s")


def throughput_pass(model, method: dict, artifacts: dict, compile: str, dev: torch.device,
                    prompts: dict, indices: list[int], rows: list[dict], seed: int, gen_len: int,
                    batch_size: int | str, common: dict) -> list[dict]:
    """The timed samples decoded together at the batch size (one pass, after a warm-up of the
    slots on the first sample): one row per sample, each with the pass's wall time."""
    from .batching import Sample, decode_batched, slot_models
    from .decode import _sync
    from .methods import build_method

    batch = min(resolve_batch_size(batch_size, dev, compile), len(indices))

    def samples():
        for i in indices:
            yield Sample(i, prompts[i], gen_len,
                         torch.Generator().manual_seed(sample_seed(seed, rows[i]["task_id"])))

    slots = [build_method(method, s, artifacts, compile=compile) for s in slot_models(model, batch)]
    decode_batched(model, slots, [next(samples())], lambda s, r: None)  # warm-up, untimed
    gc.collect()
    kind = reset_peak_memory(dev)
    results = {}
    _sync(dev)
    start = time.perf_counter()
    decode_batched(model, slots, samples(), lambda s, r: results.__setitem__(s.key, r))
    _sync(dev)
    wall = time.perf_counter() - start
    peak = peak_memory_mb(dev, kind)
    return [{**common, "method": method["name"], "sample_index": i, "repeat": 0, "slot": 0,
             "time_s": results[i].time_s, "nfe": results[i].stats["nfe"],
             "token_ids": results[i].response.tolist(), "pass": "throughput",
             "batch_size": batch, "pass_s": wall, "peak_memory_mb": peak,
             "peak_memory_kind": kind} for i in indices]
