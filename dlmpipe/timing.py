"""Paired, interleaved timing of one method against the reference, on one (backbone, task).

Speedups from separate generate jobs compare times taken minutes apart, under whatever else
the machine was doing then; on a CPU that noise is as large as the effects. One timing job per
(backbone, task, method) loads the model once, warms the method and the campaign's reference
method up (on the CPU with eager kernels their first ``WARMUP_STEPS`` updates, which warm what a
first call pays for; elsewhere a whole decode each: ``generate.warmup_needed``), then decodes
the same samples with both, alternating which goes first for each (repeat, sample), and writes
every synchronized time. ``dlmpipe.analysis.speedup`` turns them
into paired per-sample ratios (the method against the reference on the same sample, in the same
process, moments apart), and expresses every time of the run on the clock of the reference's own
run (the job that times the reference alone), so that the times and speedups of all methods of a
(backbone, task) tell one story although they come from separate jobs. Changing or adding one
method re-times that method only. Decoding is exactly the generate job's (same per-sample seeds),
so the timed work is the scored work; the token ids are kept to show it.

Those rows (``pass`` "latency") keep the papers' protocol: one sample at a time (batch 1). Then
the method (not the reference) decodes the same samples once more, all together at its batch
size (dlmpipe/batching.py; ``pass`` "throughput", one row per sample with its latency inside the
batch and the pass's wall time ``pass_s``), from which the summary reads throughput (tokens and
samples per second). Every row carries the peak memory of its method at its batch size
(``peak_memory``), measured around the method's untimed warm-up (batch 1; on the CPU with eager
kernels around its first timed decode instead) and around its throughput pass, each from a reset
high-water mark. Every row names the run it belongs to (``run``: the method the job times; the
reference's rows of a method's job carry that method).
"""
from __future__ import annotations

import gc
import time
from pathlib import Path

import pyarrow as pa
import torch

from .arrow import table_from_rows
from .decode import Decoding, decode
from .environment import COLUMNS as ENVIRONMENT_COLUMNS
from .environment import environment
from .generate import (device_name, encode_prompt, resolve_batch_size, resolve_device, sample_seed,
                       warmup_needed)
from .io import atomic_write_parquet

TIMING_SCHEMA = pa.schema([
    ("backbone", pa.string()), ("task", pa.string()),
    ("run", pa.string()),  # the method this job times (its reference rows carry it too)
    ("method", pa.string()),  # the method decoded: the run's, or the reference
    ("sample_index", pa.int64()), ("repeat", pa.int64()), ("slot", pa.int64()),
    ("time_s", pa.float64()),  # synchronized wall time of the whole decode
    ("ttft_s", pa.float64()),  # synchronized time to the first committed response token
    ("nfe", pa.int64()), ("token_ids", pa.list_(pa.int64())),
    ("device", pa.string()),
    # "latency" (batch 1, repeated, interleaved) or "throughput" (one batched pass per method)
    ("pass", pa.string()), ("batch_size", pa.int64()),
    ("pass_s", pa.float64()),          # throughput rows: wall time of the method's whole pass
    ("peak_memory_mb", pa.float64()),  # the method's peak memory at this batch size
    ("peak_memory_kind", pa.string()),  # cuda_allocated | cpu_rss_hwm | unavailable
    # the environment every method was timed in (one process: one fingerprint per file)
    *((c, pa.string()) for c in ENVIRONMENT_COLUMNS),
])


#: the CPU warm-up of each method (eager kernels; ``generate.warmup_needed``): its first updates
#: on the first timed sample (cache construction, cached steps, the sampler's step), not a whole
#: decode; on a GPU or under ``compile`` a whole decode (shapes, captures)
WARMUP_STEPS = 4


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


def _progress(*args) -> None:
    print(*args, flush=True)  # the job's log shows each repeat as it ends


def run_timing_job(manifest: str, task_file: str, method: dict, out: str,
                   reference: dict | None = None, seed: int = 0, device: str = "auto",
                   compile: str = "none", samples: int = 10, repeats: int = 3,
                   proxies: str | None = None, log=_progress,
                   batch_size: int | str = "auto") -> None:
    """Time ``method`` (as its generate job receives it: name, sampler, cache, gen_length) and
    ``reference`` (the campaign's reference method; None, or the method itself, when the job
    times the reference alone) on the first ``samples`` samples, ``repeats`` times, alternating
    their order; built as the generate job builds them (``auto`` parameters bound, proxies,
    ``compile``). Then one throughput pass of ``method`` at ``batch_size``
    (``generate.resolve_batch_size``; the method's own where the campaign gives one:
    ``method["batch_size"]``)."""
    from . import registry
    from .backbones.identity import checkpoint_identity
    from .backbones.loading import load_backbone
    from .backbones.manifest import read_manifest
    from .methods import build_method
    from .arrow import read_rows as read_task_table  # no pandas (dlmpipe/arrow.py)

    if samples < 1 or repeats < 1:
        raise ValueError(f"timing needs samples >= 1 and repeats >= 1 (got {samples}, {repeats})")
    man = read_manifest(manifest)
    identity = checkpoint_identity(man["path"])
    subject = registry.bind_method(method, identity)
    methods = [subject]
    if reference is not None and reference["name"] != method["name"]:
        methods.insert(0, registry.bind_method(reference, identity))
    if not proxies and any("proxies" in registry.artifacts(m) for m in methods):
        raise ValueError("an SPA-Cache method with the singular identifier needs the backbone's "
                         "proxies file (--proxies)")
    dev = resolve_device(device)
    rows = read_task_table(task_file)
    if not rows:
        raise ValueError(f"{task_file}: the task has no samples to time")
    loaded = load_backbone(man["path"], dtype=man.get("dtype", "float32"), device=dev,
                           sha256=man.get("sha256"), light_tokenizer=True)
    model = loaded.model
    artifacts = {}
    if proxies:  # the backbone's singular proxies (svd rule), checked against its fingerprint
        from .engine.proxies import load_proxies
        artifacts["proxies"] = load_proxies(proxies, man.get("fingerprint"))
    def built_for(m):  # each method over its own block size (methods.<m>.block_size)
        model.use_block_size(m.get("block_size"), "method block_size")
        return build_method(m, model, artifacts, compile=compile)

    built = {m["name"]: built_for(m) for m in methods}
    block_sizes = {m["name"]: m.get("block_size") for m in methods}
    gen_len = {m["name"]: int(m["gen_length"]) for m in methods}
    indices = timed_samples(len(rows), samples)
    prompts = {i: torch.tensor(encode_prompt(loaded, rows[i], chat=bool(man.get("chat"))),
                               dtype=torch.long) for i in indices}

    def run(name: str, i: int):
        sampler, cache = built[name]
        model.use_block_size(block_sizes[name], "method block_size")
        gen = torch.Generator().manual_seed(sample_seed(seed, rows[i]["task_id"]))
        return decode(model, sampler, cache, prompts[i], gen_len[name], gen)

    @torch.inference_mode()
    def warm_prefix(name: str, i: int):  # the first WARMUP_STEPS updates of a decode of sample i
        sampler, cache = built[name]
        model.use_block_size(block_sizes[name], "method block_size")
        gen = torch.Generator().manual_seed(sample_seed(seed, rows[i]["task_id"]))
        decoding = Decoding(model, sampler, cache, prompts[i], gen_len[name], gen)
        for _ in range(WARMUP_STEPS):
            if decoding.done:
                break
            decoding.step()

    names = list(built)
    log(f"timing {' against '.join(reversed(names))}: {len(indices)} samples x {repeats} repeats, "
        f"batch 1, then a throughput pass of {subject['name']}")
    peaks = {}
    full_warmup = warmup_needed(dev, compile)
    gc.collect()
    gc.freeze()
    for name in names:  # warm-up, untimed: allocations, kernels, captures of every method
        gc.collect()
        if not full_warmup:  # the CPU, eager: a prefix warms what a first call pays for
            warm_prefix(name, indices[0])
            continue  # its peak memory: around its first timed decode
        kind = reset_peak_memory(dev)
        run(name, indices[0])
        peaks[name] = (peak_memory_mb(dev, kind), kind)
    task, dev_name, env = Path(task_file).stem, device_name(dev), environment(dev)
    common = {"backbone": man["name"], "task": task, "run": subject["name"], "device": dev_name, **env}
    records = []
    gc.collect()
    gc.freeze()  # what lives now (torch, the model) is never scanned again: a collection
    # between samples scans the decodes' garbage only (~0.3 s each without, 22 per job)
    gc.disable()  # no collector pauses inside a timed decode; collected between samples
    try:
        for r in range(repeats):
            for j, i in enumerate(indices):
                for slot, name in enumerate(rotation(names, r * len(indices) + j)):
                    first = name not in peaks  # no warm-up: the peak around its first decode
                    if first:
                        gc.collect()
                        kind = reset_peak_memory(dev)
                    res = run(name, i)
                    if first:
                        peaks[name] = (peak_memory_mb(dev, kind), kind)
                    records.append({**common, "method": name, "sample_index": i, "repeat": r,
                                    "slot": slot, "time_s": res.time_s, "ttft_s": res.ttft_s,
                                    "nfe": res.stats["nfe"], "token_ids": res.response.tolist(),
                                    "pass": "latency", "batch_size": 1, "pass_s": float("nan"),
                                    "peak_memory_mb": peaks[name][0],
                                    "peak_memory_kind": peaks[name][1]})
                gc.collect()
            done = [x for x in records if x["repeat"] == r]
            log(f"  repeat {r + 1}/{repeats}: " + ", ".join(
                f"{n} {sum(x['time_s'] for x in done if x['method'] == n) / len(indices):.4f} s/decode"
                for n in names))
        records += throughput_pass(model, subject, artifacts, compile, dev, prompts, indices, rows,
                                   seed, gen_len[subject["name"]],
                                   subject.get("batch_size", batch_size), common)
    finally:
        gc.enable()
    atomic_write_parquet(out, table_from_rows(records, TIMING_SCHEMA))
    batched = [x for x in records if x["pass"] == "throughput"]
    log(f"timed on {dev_name} (environment {env['fingerprint']}); throughput pass of "
        f"{subject['name']} at batch {batched[0]['batch_size']}: "
        f"{len(batched) / batched[0]['pass_s']:.2f} samples/s")


def throughput_pass(model, method: dict, artifacts: dict, compile: str, dev: torch.device,
                    prompts: dict, indices: list[int], rows: list[dict], seed: int, gen_len: int,
                    batch_size: int | str, common: dict) -> list[dict]:
    """The timed samples decoded together at the batch size (one pass; on a GPU or under
    ``compile`` after a warm-up of the slots on the first sample, on the CPU with eager kernels
    after the method's batch-1 decodes only): one row per sample, each with the pass's wall time."""
    from .batching import Sample, decode_batched, slot_models
    from .decode import _sync
    from .methods import build_method

    batch = min(resolve_batch_size(batch_size, dev, compile), len(indices))

    def samples():
        for i in indices:
            yield Sample(i, prompts[i], gen_len,
                         torch.Generator().manual_seed(sample_seed(seed, rows[i]["task_id"])))

    model.use_block_size(method.get("block_size"), "method block_size")
    slots = [build_method(method, s, artifacts, compile=compile) for s in slot_models(model, batch)]
    if warmup_needed(dev, compile):  # the slots' shapes: new kernels, captures on a GPU
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
             "time_s": results[i].time_s, "ttft_s": results[i].ttft_s,
             "nfe": results[i].stats["nfe"],
             "token_ids": results[i].response.tolist(), "pass": "throughput",
             "batch_size": batch, "pass_s": wall, "peak_memory_mb": peak,
             "peak_memory_kind": kind} for i in indices]
