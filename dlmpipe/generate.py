"""The resumable generation job: a task decoded with one method (the loop itself: decode.py).

``run_generation_job`` loads the model once,
decodes every sample of a task (or of one shard of it), journals each finished sample so a
killed job resumes without losing or duplicating samples, and writes the generations parquet
and a provenance file atomically. With a shadow probe (docs/ANALYSES.md) it also records the
probes of every sample; the analysis jobs (dlmpipe/probes/jobs.py) reuse its pieces.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import torch

from .arrow import table_from_rows
from .batch_size import resolve_batch_size  # noqa: F401  (the jobs' batch size; re-exported)
from .decode import DecodeResult, decode
from .environment import COLUMNS as ENVIRONMENT_COLUMNS
from .environment import environment, provenance_versions
from .io import atomic_write_json, atomic_write_parquet, atomic_write_text
from .shards import shard_range  # noqa: F401  (re-exported: the shard a job decodes)


def cut_at_stop(ids: list[int], stop_ids: list[int]) -> list[int]:
    for i, t in enumerate(ids):
        if t in stop_ids:
            return ids[:i]
    return ids


def encode_prompt(loaded, row: dict, chat: bool) -> list[int]:
    """Prompt token ids of a task row: chat backbones wrap it in the checkpoint's chat template
    (with the task's response prefix, e.g. an opened code block); others take the raw text."""
    from .backbones.prompts import ChatPrompt

    if chat:
        return loaded.chat_prompt(ChatPrompt(user=row["prompt"],
                                             response_prefix=row.get("response_prefix") or ""))
    return loaded.encode(row["prompt"] + (row.get("response_prefix") or ""))


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def warmup_needed(device: torch.device, compile: str) -> bool:
    """Whether timing a decode needs a whole untimed decode first: on a GPU (context, library
    handles, kernel choices per shape, CUDA graph captures) and under any ``compile`` mode
    (capture or compilation on first call). On the CPU with eager kernels what a first call pays
    for is paid in a decode's first updates (the timing jobs warm with those,
    ``timing.WARMUP_STEPS``; the generate jobs, whose times are their cost, with nothing;
    measured in docs/METHODS.md §3)."""
    return device.type != "cpu" or compile != "none"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu:{platform.processor() or platform.machine()}:{torch.get_num_threads()}t"


def sample_seed(seed: int, task_id: str) -> int:
    """Per-sample seed: independent of shard layout and resume order."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{task_id}".encode()).digest()[:8], "little") >> 1


# --------------------------------------------------------------------------------------
# journal: append-only JSON lines, one per finished sample; survives a killed job
# --------------------------------------------------------------------------------------
class Journal:
    """Finished samples of an interrupted job. The header pins the job's identity, so a
    journal left by a job with other parameters is discarded rather than mixed in."""

    def __init__(self, path: Path, identity: dict):
        self.path = path
        self.identity = identity
        self.rows: dict[int, dict] = {}
        if path.exists():
            self._load()
        if not self.rows:
            atomic_write_text(path, json.dumps({"identity": identity}) + "\n")

    def _load(self) -> None:
        lines = self.path.read_text().split("\n")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError:
            return
        if header.get("identity") != self.identity:
            return
        complete = True
        for line in lines[1:]:
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                complete = line == ""  # else a partially written last line from a killed job
                break
            self.rows[row["sample_index"]] = row
        if self.rows and not complete:
            # drop the partial line, or the next append would extend it into an unreadable one
            atomic_write_text(self.path, "".join(json.dumps(r) + "\n"
                                                 for r in [header, *self.rows.values()]))

    def append(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
            f.flush()
            os.fsync(f.fileno())
        self.rows[row["sample_index"]] = row


GENERATION_SCHEMA = pa.schema([
    ("sample_index", pa.int64()), ("task_id", pa.string()), ("completion", pa.string()),
    ("token_ids", pa.list_(pa.int64())), ("steps", pa.int64()), ("nfe", pa.int64()),
    ("refreshes", pa.int64()), ("cached_forwards", pa.int64()), ("revisions", pa.int64()),
    # the job's cost of the sample: its synchronized wall time in this job (at batch size B > 1 its
    # wait inside the batch, beside whatever else ran); a method's speed is the timing stage's
    ("job_time_s", pa.float64()), ("device", pa.string()), ("backbone", pa.string()),
    ("task", pa.string()), ("method", pa.string()), ("sampler", pa.string()),
    ("cache", pa.string()), ("params", pa.string()), ("stats", pa.string()),
    # per-sample measurements (docs/ARCHITECTURE.md, file contracts): prompt tokens, tokens
    # before the first stop/pad, and, in this job, time to first token (decode.py) and generated
    # tokens / job_time_s
    ("prompt_length", pa.int64()), ("generated_length", pa.int64()), ("job_ttft_s", pa.float64()),
    ("job_tps", pa.float64()),
    # how many samples the job decoded together (dlmpipe/batching.py); job_time_s and job_ttft_s
    # are the sample's own latency inside that batch (docs/ARCHITECTURE.md, generations contract)
    ("batch_size", pa.int64()),
    # the environment it was decoded in (dlmpipe/environment.py): explicit fields + their hash
    *((c, pa.string()) for c in ENVIRONMENT_COLUMNS),
])
# Journal rows of an older format lack columns above: the identity's format discards them.
JOURNAL_FORMAT = 5


def measurements(prompt_len: int, generated: int, res: DecodeResult) -> dict:
    """The per-sample measurement columns of one decoded sample in its job: ``job_tps *
    job_time_s`` equals the generated tokens (tokens before the first stop or pad) and
    ``job_ttft_s <= job_time_s``."""
    return {"prompt_length": prompt_len, "generated_length": generated, "job_ttft_s": res.ttft_s,
            "job_tps": generated / res.time_s if res.time_s > 0 else float("nan")}


def provenance_record(seed: int, config_hash: str, manifest: dict, method: dict, device: torch.device,
                      compile: str = "none", task_sources: dict | None = None) -> dict:
    """What a generation's provenance file says; a Hub checkpoint's repository, revision and
    commit (``backbone_hub``, from its manifest) and the commits of the dataset ids its task
    was read from (``task_sources``, from the task's table) where there are any."""
    hub = manifest.get("hub")
    return {**provenance_versions(), "environment": environment(device),
            "config_hash": config_hash, "seed": seed, "device": device_name(device),
            "compile": compile, "host": socket.gethostname(), "backbone": manifest["name"],
            "backbone_fingerprint": manifest.get("fingerprint"), "method": method,
            **({"backbone_hub": {k: hub[k] for k in ("repo", "revision", "commit")}} if hub else {}),
            **({"task_sources": task_sources} if task_sources else {}),
            "finished_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


@dataclass
class JobModel:
    """What a job decoding with one method holds, loaded once: the backbone, the method's
    sampler and cache (rebegun for every sample), the stop ids; ``build`` makes another
    sampler and cache of the method (a batch slot's, over its stand-in of the model)."""
    loaded: object
    sampler: object
    cache: object
    chat: bool
    stops: list[int]
    build: object = None

    @property
    def model(self):
        return self.loaded.model

    def slot_methods(self, batch_size: int) -> list[tuple]:
        """``batch_size`` (sampler, cache) pairs, each over its own slot of one batch
        (dlmpipe/batching.py)."""
        from .batching import slot_models

        return [self.build(slot) for slot in slot_models(self.model, batch_size)]

    def prompt(self, row: dict) -> torch.Tensor:
        return torch.tensor(encode_prompt(self.loaded, row, chat=self.chat), dtype=torch.long)



def bind_job_method(method: dict, man: dict) -> dict:
    """``method`` with its ``auto`` parameters (SPA-Cache's profile) chosen for the manifest's
    checkpoint, unless the campaign already did: a job records the parameters it decodes with."""
    from . import registry
    from .backbones.identity import checkpoint_identity

    return registry.bind_method(method, checkpoint_identity(man["path"]))


def load_job_model(man: dict, dev: torch.device, method: dict, proxies: str | None = None,
                   compile: str = "none") -> JobModel:
    """The manifest's backbone on ``dev``, the method's sampler and cache (with the backbone's
    singular proxies when the method reads them, checked against its fingerprint; ``compile``:
    how fixed-shape steps run, dlmpipe/graphs.py)."""
    from .backbones.loading import load_backbone
    from .methods import build_method

    loaded = load_backbone(man["path"], dtype=man.get("dtype", "float32"), device=dev,
                           sha256=man.get("sha256"), light_tokenizer=True)
    model = loaded.model
    # the campaign's block size for this backbone/method (backbones.<b>.block_size,
    # methods.<m>.block_size), checked at plan time; None: the checkpoint's
    model.use_block_size(method.get("block_size"), "method block_size")
    artifacts = {}
    if proxies:  # the backbone's singular proxies (svd rule)
        from .engine.proxies import load_proxies
        artifacts["proxies"] = load_proxies(proxies, man.get("fingerprint"))

    def build(m):
        return build_method(method, m, artifacts, compile=compile)

    sampler, cache = build(model)
    stops = model.cfg.stop_ids + ([model.cfg.pad_id] if model.cfg.pad_id is not None else [])
    return JobModel(loaded, sampler, cache, bool(man.get("chat")), stops, build)


def method_params(method: dict) -> str:
    """The generations' ``params`` column: the method's parameters as JSON text (with the
    block size where the campaign sets one)."""
    return json.dumps({k: method[k] for k in ("sampler", "cache", "gen_length", "block_size")
                       if k in method}, sort_keys=True)


def generation_row(job: JobModel, i: int, row: dict, prompt_len: int, res: DecodeResult,
                   man: dict, task: str, method: dict, dev: torch.device, batch_size: int = 1) -> dict:
    """One row of a generations file (docs/ARCHITECTURE.md, file contracts)."""
    ids = res.response.tolist()
    kept = cut_at_stop(ids, job.stops)
    st = res.stats
    return {
        "sample_index": i, "task_id": row["task_id"],
        "completion": job.loaded.tokenizer.decode(kept, skip_special_tokens=False),
        "token_ids": ids, "steps": st["steps"], "nfe": st["nfe"], "refreshes": st["refreshes"],
        "cached_forwards": st["cached_forwards"], "revisions": st["revisions"],
        "job_time_s": res.time_s, "device": device_name(dev), "backbone": man["name"], "task": task,
        "method": method["name"], "sampler": method["sampler"]["name"],
        "cache": method["cache"]["name"], "params": method_params(method), "stats": json.dumps(st),
        **measurements(prompt_len, len(kept), res), "batch_size": batch_size, **environment(dev)}


def job_samples(n_rows: int, shard: str, limit: int | None) -> range:
    """The sample indices a job decodes: its shard of the first ``limit`` rows (all: None)."""
    return shard_range(n_rows if limit is None else min(limit, n_rows), shard)


def run_generation_job(manifest: str, task_file: str, method: dict, out: str, provenance: str,
                       seed: int = 0, device: str = "auto", compile: str = "none",
                       config_hash: str = "", shard: str = "0/1", warmup: bool = True,
                       proxies: str | None = None, limit: int | None = None, shadow: dict | None = None,
                       probes_out: str | None = None, batch_size: int | str = 1) -> None:
    """Decode the task (its first ``limit`` samples, of this shard) with ``method``.

    ``shadow``: options of the shadow-forward probe (``probes/shadow.py``: rate, steps, seed);
    the probes of every sample are written to ``probes_out``. The generations are those of the
    unprobed job: the probe changes nothing on the main trajectory (docs/ANALYSES.md).

    ``batch_size`` (``auto``: ``resolve_batch_size``): samples decoded together, each with the
    tokens it gets alone (dlmpipe/batching.py); a scheduling setting, not part of the job's
    identity, so a killed job resumes its journal at any batch size."""
    from tqdm import tqdm

    from .backbones.manifest import read_manifest
    from .arrow import read_rows as read_task_table  # no pandas (dlmpipe/arrow.py)

    out_path = Path(out)
    man = read_manifest(manifest)
    method = bind_job_method(method, man)
    dev = resolve_device(device)
    # a batch size the compile mode refuses stops the job before it writes or loads anything
    resolved_batch = resolve_batch_size(batch_size, dev, compile, shadow)
    rows = read_task_table(task_file)
    indices = job_samples(len(rows), shard, limit)
    gen_len = int(method["gen_length"])
    identity = {"format": JOURNAL_FORMAT, "method": method, "seed": seed, "shard": shard,
                "task_file_rows": len(rows), "backbone": man.get("fingerprint"),
                "device": device_name(dev), "compile": compile,
                **({"limit": limit} if limit is not None else {}),
                **({"shadow": shadow} if shadow is not None else {})}
    journal = Journal(out_path.with_name(out_path.name + ".journal.jsonl"), identity)
    todo = [i for i in indices if i not in journal.rows]
    if len(todo) < len(indices):
        print(f"resuming: {len(indices) - len(todo)} of {len(indices)} samples of shard {shard} "
              f"already decoded (journal {journal.path.name}); decoding {len(todo)}", flush=True)

    if todo:
        from .probes.shadow import ShadowProbe

        job = load_job_model(man, dev, method, proxies, compile)
        task = Path(task_file).stem

        def run(i: int, observer=None) -> tuple[int, DecodeResult]:
            prompt = job.prompt(rows[i])
            gen = torch.Generator().manual_seed(sample_seed(seed, rows[i]["task_id"]))
            return len(prompt), decode(job.model, job.sampler, job.cache, prompt, gen_len, gen, observer)

        if warmup and warmup_needed(dev, compile):
            run(todo[0])  # one warm-up generation, untimed (measurement convention)
        batch = min(resolved_batch, len(todo))
        if batch > 1:
            from .batching import Sample, decode_batched

            bar = tqdm(total=len(todo), desc=f"{man['name']}/{task}/{method['name']} (batch {batch})",
                       mininterval=2)

            def samples():
                for i in todo:
                    gen = torch.Generator().manual_seed(sample_seed(seed, rows[i]["task_id"]))
                    yield Sample(i, job.prompt(rows[i]), gen_len, gen)

            def finished(sample, res: DecodeResult) -> None:
                i = sample.key
                journal.append(generation_row(job, i, rows[i], sample.prompt_ids.shape[0], res, man,
                                              task, method, dev, batch_size=batch))
                bar.update()

            decode_batched(job.model, job.slot_methods(batch), samples(), finished)
            bar.close()
            todo = []
        for i in tqdm(todo, desc=f"{man['name']}/{task}/{method['name']}", mininterval=2):
            probe = ShadowProbe(**shadow).start(rows[i]["task_id"]) if shadow is not None else None
            prompt_len, res = run(i, probe)
            record = generation_row(job, i, rows[i], prompt_len, res, man, task, method, dev)
            if probe is not None:
                record["probes"] = probe.records
            journal.append(record)

    final = [journal.rows[i] for i in indices]
    atomic_write_parquet(out_path, table_from_rows(final, GENERATION_SCHEMA))
    if probes_out:
        from .probes.shadow import probes_table

        atomic_write_parquet(probes_out, probes_table(final))
    from .arrow import task_sources

    atomic_write_json(provenance, provenance_record(seed, config_hash, man, method, dev, compile,
                                                    task_sources(task_file)))
    journal.path.unlink(missing_ok=True)
