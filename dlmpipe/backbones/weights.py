"""Safetensors weights of a checkpoint: key maps, headers, shards, and reading tensors in place.

Every header, key and shape is checked before any tensor is read (``plan_reads``); tensors are
then read with plain file reads into tensors allocated once in the target dtype and device
(``read_tensors``), never as views of a memory map (loading.py says why).
"""
from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import CheckpointError
from .errors import read_json as _read_json
from .families import family
from .model import Backbone, BackboneConfig

SAFETENSORS_DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16,
                      "F64": torch.float64}

# Buffers some exporters write next to the weights; recomputed here, so skipped, not "unexpected".
IGNORED_KEY_SUFFIXES = ("rotary_emb.inv_freq",)


def checkpoint_key_map(cfg: BackboneConfig) -> dict[str, str | tuple[str, ...]]:
    """Checkpoint key -> native parameter name, for the family's exact on-disk names; a tuple of
    names for a fused tensor whose row blocks are those parameters (``split_rows``)."""
    return family(cfg.family).key_map(cfg)


@dataclass(frozen=True)
class TensorEntry:
    """Where one tensor lives: file, byte range, on-disk dtype and shape."""
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int
    end: int


def read_safetensors_header(file: Path) -> dict[str, TensorEntry]:
    """Parse and validate a safetensors header (no tensor data is read)."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            head = fh.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            if not 0 < n <= size - 8:
                raise CheckpointError(f"{file}: not a safetensors file (bad header length; truncated?)")
            header = json.loads(fh.read(n))
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read shard ({e})") from e
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: corrupt safetensors header ({e})") from e
    if not isinstance(header, dict):
        raise CheckpointError(f"{file}: corrupt safetensors header")
    header.pop("__metadata__", None)
    entries = {}
    for key, info in header.items():
        try:
            dtype_name, shape, (b, e) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError) as err:
            raise CheckpointError(f"{file}: corrupt safetensors header entry for {key!r}") from err
        dtype = SAFETENSORS_DTYPES.get(dtype_name)
        if dtype is None:
            raise CheckpointError(f"{file}: tensor {key!r} has dtype {dtype_name}; only float weights "
                                  f"({', '.join(SAFETENSORS_DTYPES)}) are supported (quantized checkpoint?)")
        numel = 1
        for s in shape:
            numel *= s
        start, end = 8 + n + b, 8 + n + e
        if e - b != numel * dtype.itemsize or end > size or b < 0:
            raise CheckpointError(f"{file}: tensor {key!r} data is out of bounds or mis-sized "
                                  f"(truncated or corrupt shard)")
        entries[key] = TensorEntry(file, dtype, shape, start, end)
    return entries


def shard_files(path: Path) -> dict[str, Path]:
    """Checkpoint key -> shard file, from the index when sharded, else the single file."""
    index = path / "model.safetensors.index.json"
    if index.is_file():
        weight_map = _read_json(index, "model.safetensors.index.json").get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index}: no valid 'weight_map' (key -> shard file name)")
        files = {k: path / f for k, f in weight_map.items()}
        for f in sorted(set(files.values())):
            if not f.is_file():
                raise CheckpointError(f"{f}: shard named in {index.name} is missing")
        return files
    single = path / "model.safetensors"
    if not single.is_file():
        raise CheckpointError(f"{path}: no weights (neither model.safetensors nor "
                              f"model.safetensors.index.json)")
    return {k: single for k in read_safetensors_header(single)}


def plan_reads(model: Backbone, key_map: dict[str, str], files: dict[str, Path],
          path: Path) -> dict[str, TensorEntry]:
    """Native parameter name -> tensor location, after checking keys and shapes against config."""
    files = {k: f for k, f in files.items() if not k.endswith(IGNORED_KEY_SUFFIXES)}
    missing = [k for k in key_map if k not in files]
    unexpected = sorted(set(files) - set(key_map))
    where = sorted({f.name for f in files.values()})
    if missing:
        raise CheckpointError(f"{path}: missing key(s) {missing[:5]}"
                              + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
                              + f" (looked in {', '.join(where)}; does config.json match the weights?)")
    if unexpected:
        raise CheckpointError(f"{files[unexpected[0]]}: unexpected key(s) {unexpected[:5]}"
                              + (f" and {len(unexpected) - 5} more" if len(unexpected) > 5 else "")
                              + f" for a {model.cfg.family} checkpoint")
    headers = {f: read_safetensors_header(f) for f in sorted(set(files.values()))}
    params = dict(model.named_parameters())
    plan = {}
    for k, f in files.items():
        entry = headers[f].get(k)
        if entry is None:
            raise CheckpointError(f"{f}: key {k!r} listed in the index is not in this shard")
        names = key_map[k]
        if isinstance(names, tuple):  # one fused tensor on disk, native parts stacked on dim 0
            parts = [tuple(params[n].shape) for n in names]
            want = (sum(p[0] for p in parts),) + parts[0][1:]
        else:
            want = tuple(params[names].shape)
        if entry.shape != want:
            raise CheckpointError(f"{f}: shape mismatch for {k!r}: file has {entry.shape}, "
                                  f"config.json implies {want}")
        if isinstance(names, tuple):
            plan |= split_rows(entry, names, parts)
        else:
            plan[names] = entry
    return plan


def split_rows(entry: TensorEntry, names: tuple[str, ...], shapes: list[tuple]) -> dict[str, TensorEntry]:
    """A fused tensor's row blocks as tensors of their own (e.g. LLaDA2.0's ``query_key_value``
    = q, k, v rows): row-major, so each block is a contiguous byte range of the file."""
    out, start = {}, entry.start
    for name, shape in zip(names, shapes):
        numel = 1
        for s in shape:
            numel *= s
        end = start + numel * entry.dtype.itemsize
        out[name] = TensorEntry(entry.file, entry.dtype, shape, start, end)
        start = end
    return out


def read_tensors(plan: dict[str, TensorEntry], dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """Read every tensor once into its final dtype/device; one reused host staging buffer."""
    direct = device.type == "cpu"
    staging_bytes = max((e.end - e.start for e in plan.values() if not (direct and e.dtype == dtype)), default=0)
    staging = torch.empty(staging_bytes, dtype=torch.uint8) if staging_bytes else None
    state = {}
    by_file: dict[Path, list[tuple[str, TensorEntry]]] = {}
    for name, e in plan.items():
        by_file.setdefault(e.file, []).append((name, e))
    for file, items in by_file.items():
        with open(file, "rb", buffering=0) as fh:
            for name, e in sorted(items, key=lambda it: it[1].start):
                out = torch.empty(e.shape, dtype=dtype, device=device)
                if direct and e.dtype == dtype:
                    _readinto(fh, e, out.reshape(-1).view(torch.uint8))
                else:
                    raw = staging[:e.end - e.start]
                    _readinto(fh, e, raw)
                    out.copy_(raw.view(e.dtype).view(e.shape))
                state[name] = out
    return state


def _readinto(fh, e: TensorEntry, buf: torch.Tensor) -> None:
    view = memoryview(buf.numpy()).cast("B")
    fh.seek(e.start)
    got = 0
    while got < len(view):
        n = fh.readinto(view[got:])
        if not n:
            raise CheckpointError(f"{e.file}: unexpected end of file (truncated shard)")
        got += n
