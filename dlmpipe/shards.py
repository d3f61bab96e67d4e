"""Sharded generation: which samples a shard decodes, and the merge of a method's shards.

With ``shards: N`` in the campaign, each (backbone, task, method) is decoded by N generate jobs,
shard ``i/N`` taking the contiguous sample range ``shard_range(n, "i/N")``; the ranges are
disjoint and cover every sample. ``merge_shards`` joins the shard files into the generations
file scoring reads: it checks that every sample of the task is there exactly once (in the shard
that owns it, for the same backbone/task/method), orders rows by ``sample_index``, merges the
provenance records and writes both files atomically. Nothing here imports torch: the merge is a
local job and starts in a fraction of a second.
"""
from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import pyarrow as pa

from .arrow import read_table
from .io import atomic_write_json, atomic_write_parquet

# columns that must agree between every row of a merged file (one method's decoding of one task)
SAME_IN_EVERY_ROW = ("backbone", "task", "method", "sampler", "cache", "params")


def shard_range(n: int, shard: str) -> range:
    """Contiguous sample range of shard ``i/k`` (disjoint, covering 0..n-1)."""
    i, k = (int(v) for v in shard.split("/"))
    if not 0 <= i < k:
        raise ValueError(f"bad shard {shard!r}: need i/k with 0 <= i < k")
    return range(i * n // k, (i + 1) * n // k)


def merge_provenance(records: list[dict], shards: list[str]) -> dict:
    """One provenance record: fields every shard agrees on at the top level; the rest (host,
    device, finish time, ...) per shard under ``shards``."""
    keys = list(dict.fromkeys(k for r in records for k in r))
    common = {k: records[0][k] for k in keys
              if all(k in r and r[k] == records[0][k] for r in records)}
    per_shard = [{"shard": s, **{k: v for k, v in r.items() if k not in common}}
                 for s, r in zip(shards, records)]
    devices = sorted({str(r.get("device")) for r in records})
    return {**common, "devices": devices, "shards": per_shard,
            "merged_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def merge_shards(shard_files: list[str], task_file: str, out: str, provenance: str,
                 shard_provenance: list[str] | None = None) -> dict:
    """Merge shard ``i`` of ``len(shard_files)`` (given in shard order) into ``out``.

    Raises ValueError naming the sample and the file when a sample is missing, duplicated or in
    the wrong shard, or when rows of different methods/tasks/backbones are mixed; nothing is
    written then. Returns the merged provenance record.
    """
    k = len(shard_files)
    if k == 0:
        raise ValueError("merge-generations: no shard files given")
    if shard_provenance is not None and len(shard_provenance) != k:
        raise ValueError(f"{len(shard_provenance)} provenance files for {k} shards")
    task_ids = read_table(task_file, columns=["task_id"]).column("task_id").to_pylist()
    n = len(task_ids)

    tables = [read_table(path) for path in shard_files]
    shard_indices = [t.column("sample_index").to_pylist() for t in tables]
    owner: dict[int, str] = {}
    for path, indices in zip(shard_files, shard_indices):
        for idx in indices:
            if idx in owner and owner[idx] != path:
                raise ValueError(f"sample {idx} is in two shards: {owner[idx]} and {path}")
            owner[idx] = path
    for i, (path, indices) in enumerate(zip(shard_files, shard_indices)):
        want = shard_range(n, f"{i}/{k}")
        counts = Counter(indices)
        for idx, count in counts.items():
            if idx not in want:
                raise ValueError(f"{path}: sample {idx} does not belong to shard {i}/{k} "
                                 f"(samples {want.start}..{want.stop - 1} of {n})")
            if count > 1:
                raise ValueError(f"{path}: sample {idx} appears {count} times")
    for i, (path, indices) in enumerate(zip(shard_files, shard_indices)):
        want = shard_range(n, f"{i}/{k}")
        missing = sorted(set(want) - set(indices))
        if missing:
            raise ValueError(f"{path}: shard {i}/{k} lacks sample(s) {missing[:10]} "
                             f"({len(missing)} of {len(want)} missing)")

    import pyarrow.compute as pc  # only the merge sorts (generate jobs import shard_range)

    merged = pa.concat_tables(tables, promote_options="default")
    merged = merged.take(pc.sort_indices(merged, [("sample_index", "ascending")]))
    rows_task_ids = merged.column("task_id").to_pylist()
    if merged.column("sample_index").to_pylist() != list(range(n)):
        raise ValueError(f"merged shards do not cover samples 0..{n - 1} exactly once")
    for idx, (got, want_id) in enumerate(zip(rows_task_ids, task_ids)):
        if got != want_id:
            raise ValueError(f"sample {idx}: task_id {got!r} in {owner[idx]}, but {want_id!r} "
                             f"in {task_file} (shards of another task file?)")
    for col in SAME_IN_EVERY_ROW:
        if col in merged.column_names and len(set(merged.column(col).to_pylist())) > 1:
            values = sorted(set(map(str, merged.column(col).to_pylist())))
            raise ValueError(f"shards disagree on {col}: {values[:3]}")

    shards = [f"{i}/{k}" for i in range(k)]
    records = ([json.loads(Path(p).read_text()) for p in shard_provenance]
               if shard_provenance else [{} for _ in shard_files])
    record = merge_provenance(records, shards)
    for entry, path in zip(record["shards"], shard_files):
        r = shard_range(n, entry["shard"])
        entry["samples"] = [r.start, r.stop]
        entry["file"] = str(path)

    if "fingerprint" in merged.column_names:
        fingerprints = sorted({str(f) for f in merged.column("fingerprint").to_pylist()})
        if len(fingerprints) > 1:
            print(f"warning: shards decoded in different environments {fingerprints} "
                  "(dlmpipe/environment.py): the summary flags this method's quality", flush=True)
    if len(record["devices"]) > 1:
        print(f"warning: shards decoded on different devices {record['devices']}: per-sample "
              "times (job_time_s) compare only within a device", flush=True)
    atomic_write_parquet(out, merged)
    atomic_write_json(provenance, record)
    return record
