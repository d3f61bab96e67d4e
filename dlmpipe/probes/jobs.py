"""The analysis jobs that run the model (docs/ANALYSES.md): the matched-state intervention and
the drift profile. (The shadow probe runs inside the generate job: ``generate.py``.)

Like the generate job, each loads the model once, decodes the task's first ``limit`` problems
with the campaign's per-sample seeds (so a trajectory is the one the generations file holds),
journals every finished problem (a killed job resumes) and writes its files atomically.
"""
from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import torch

from .. import registry
from ..decode import DecodeResult
from ..generate import (GENERATION_SCHEMA, JOURNAL_FORMAT, Journal, bind_job_method, device_name,
                        generation_row, job_samples, load_job_model, resolve_device, sample_seed)
from ..io import atomic_write_parquet

PAIR_SCHEMA = pa.schema([
    ("sample_index", pa.int64()), ("task_id", pa.string()), ("branched", pa.bool_()),
    ("branch_update", pa.int64()), ("position", pa.int64()), ("token", pa.int64()),
    ("confidence", pa.float64()),
    ("revised_at_fresh", pa.int64()), ("revised_at_cached", pa.int64()),
    ("steps_fresh", pa.int64()), ("steps_cached", pa.int64()),
    ("nfe_fresh", pa.int64()), ("nfe_cached", pa.int64()),
    ("same_completion", pa.bool_()),
])


def _open(manifest: str, task_file: str, method: dict, out: str, device: str, limit: int | None,
          identity: dict):
    """The manifest, ``method`` bound to its checkpoint, the device, the task rows, the samples
    to decode and the journal."""
    from ..backbones.manifest import read_manifest
    from ..tasks import read_task_table

    man = read_manifest(manifest)
    method = bind_job_method(method, man)
    dev = resolve_device(device)
    rows = read_task_table(task_file)
    indices = job_samples(len(rows), "0/1", limit)
    journal = Journal(Path(out).with_name(Path(out).name + ".journal.jsonl"),
                      {**identity, "format": JOURNAL_FORMAT, "method": method,
                       "task_file_rows": len(rows), "limit": limit,
                       "backbone": man.get("fingerprint"), "device": device_name(dev)})
    return man, method, dev, rows, indices, journal


def run_intervention_job(manifest: str, task_file: str, method: dict, out_pairs: str,
                         out_fresh: str, out_cached: str, seed: int = 0, device: str = "auto",
                         limit: int | None = None, threshold: float = 0.9, follow: int = 5,
                         proxies: str | None = None, compile: str = "none") -> None:
    """Write the pairs table and each branch's completions as a generations file (scored by
    the score stage like any other); problems without a branch point have no branch rows."""
    from .intervention import intervene

    cache_name = method["cache"]["name"]
    if not registry.lookup("cache", cache_name).feedback_intervention:
        able = [n for n, c in registry.CACHES.items() if c.feedback_intervention]
        raise ValueError(f"the matched-state intervention needs a cache with a prompt snapshot to "
                         f"keep or rebuild ({', '.join(able)}); method {method['name']!r} uses "
                         f"{cache_name!r}")
    man, method, dev, rows, indices, journal = _open(
        manifest, task_file, method, out_pairs, device, limit,
        {"analysis": "intervention", "seed": seed, "threshold": threshold, "follow": follow,
         "compile": compile})
    todo = [i for i in indices if i not in journal.rows]
    if todo:
        job = load_job_model(man, dev, method, proxies, compile)
        task = Path(task_file).stem
        for i in todo:
            row = rows[i]
            gen = torch.Generator().manual_seed(sample_seed(seed, row["task_id"]))
            prompt = job.prompt(row)
            point, branches = intervene(job.model, job.sampler, job.cache, prompt,
                                        int(method["gen_length"]), gen, threshold, follow)
            pair = {"sample_index": i, "task_id": row["task_id"], "branched": point is not None}
            record = {"sample_index": i, "pair": pair}
            if point is not None:
                pair.update(branch_update=point.update, position=point.position, token=point.token,
                            confidence=point.confidence,
                            same_completion=branches["fresh"].response == branches["cached"].response)
                for name, b in branches.items():
                    pair.update({f"revised_at_{name}": b.revised_at, f"steps_{name}": b.stats["steps"],
                                 f"nfe_{name}": b.stats["nfe"]})
                    stats = {**b.stats, "branch": name, "branch_update": point.update,
                             "revised_at": b.revised_at}
                    # time: the branch's own decoding; no first-token time (a branch starts
                    # from a state that already holds tokens)
                    res = DecodeResult(torch.tensor(b.response), b.time_s, float("nan"), stats)
                    record[name] = generation_row(job, i, row, len(prompt), res, man, task,
                                                  method, dev)
            journal.append(record)
    final = [journal.rows[i] for i in indices]
    atomic_write_parquet(out_pairs, pa.Table.from_pylist([r["pair"] for r in final], schema=PAIR_SCHEMA))
    for name, out in (("fresh", out_fresh), ("cached", out_cached)):
        atomic_write_parquet(out, pa.Table.from_pylist([r[name] for r in final if name in r],
                                                       schema=GENERATION_SCHEMA))
    journal.path.unlink(missing_ok=True)


def run_drift_job(manifest: str, task_file: str, method: dict, out: str, proxies: str | None,
                  rank: int | None = None, tau: float = 0.95, seed: int = 0,
                  device: str = "auto", limit: int | None = None, compile: str = "none") -> None:
    """Write the drift records (``probes/drift.py``) of the first ``limit`` problems decoded
    with ``method``; ``proxies``: the backbone's proxies file (the proxy series, rank ``rank``,
    None: the stored rank)."""
    from ..decode import decode
    from ..engine.proxies import load_proxies
    from .drift import DRIFT_SCHEMA, DriftProfile

    man, method, dev, rows, indices, journal = _open(
        manifest, task_file, method, out, device, limit,
        {"analysis": "drift", "seed": seed, "rank": rank, "tau": tau, "compile": compile})
    todo = [i for i in indices if i not in journal.rows]
    if todo:
        needs = "proxies" in registry.artifacts(method)
        job = load_job_model(man, dev, method, proxies if needs else None, compile)
        weights = None
        if proxies:
            prox = load_proxies(proxies, man.get("fingerprint"))
            r = prox.stored_rank if rank is None else rank
            w = job.model.embed.weight
            weights = [prox.projection(i, r).to(dtype=w.dtype, device=w.device)
                       for i in range(job.model.cfg.n_layers)]
        profile = DriftProfile(weights, tau)
        for i in todo:
            row = rows[i]
            gen = torch.Generator().manual_seed(sample_seed(seed, row["task_id"]))
            decode(job.model, job.sampler, job.cache, job.prompt(row), int(method["gen_length"]),
                   gen, profile.start())
            journal.append({"sample_index": i, "records": [
                {"sample_index": i, "task_id": row["task_id"], **r} for r in profile.records]})
    records = [r for i in indices for r in journal.rows[i]["records"]]
    atomic_write_parquet(out, pa.Table.from_pylist(records, schema=DRIFT_SCHEMA))
    journal.path.unlink(missing_ok=True)
