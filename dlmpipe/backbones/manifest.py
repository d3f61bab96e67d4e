"""Backbone manifests: the workflow's handle on a checkpoint directory.

``prepare-backbone`` checks that the directory loads (config, shards, keys, shapes, tokenizer)
and writes ``backbones/{b}/manifest.json`` with the path, family, special ids and a fingerprint
of the weight files, so downstream jobs rerun when the checkpoint changes; with the weights'
pinned sha256 (checked here and again by every job that loads them, dlmpipe/backbones/pins.py).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ..io import atomic_write_json
from .loading import check_checkpoint
from .pins import check_sha256


def checkpoint_fingerprint(path: Path) -> str:
    """Cheap, content-sensitive fingerprint: names, sizes and mtimes of the checkpoint files."""
    h = hashlib.sha256()
    for f in sorted(path.iterdir()):
        if f.is_file():
            st = f.stat()
            h.update(f"{f.name}:{st.st_size}:{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def write_manifest(path: str | Path, out: str | Path, name: str, dtype: str = "float32",
                   chat: bool = False, sha256: dict[str, str] | None = None,
                   hub: dict | None = None) -> dict:
    """``sha256``: the weight files' pinned hashes (checked here, recorded for every loader).
    ``hub``: a Hub checkpoint's fetch record (dlmpipe/hub.py, ``fetch_all``; ``path`` is its
    snapshot folder): its repository, revision, commit and the Hub's sha256 of its weights,
    which the fetch checked, recorded (every generation's provenance names them)."""
    path = Path(path).resolve()
    cfg = check_checkpoint(path)
    check_sha256(path, sha256)
    manifest = {"name": name, "path": str(path), "family": cfg.family, "dtype": dtype,
                "chat": chat, "config": cfg.to_dict(), "fingerprint": checkpoint_fingerprint(path),
                **({"sha256": sha256} if sha256 else {}),
                **({"hub": {k: hub[k] for k in ("repo", "revision", "commit", "sha256")}}
                   if hub else {})}
    atomic_write_json(out, manifest)
    return manifest


def read_manifest(path: str | Path) -> dict:
    return json.loads(Path(path).read_text())
