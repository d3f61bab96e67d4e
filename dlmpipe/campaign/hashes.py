"""sha256 of weight files at plan time, each file hashed once while it stays the same file.

The campaign checks every pinned checkpoint (``backbones.<b>.sha256``, a shipped checkpoint's
record) before any job. Hashing a multi-GB checkpoint at every plan would take minutes, so a
file's hash is kept in ``.snakemake/dlmpipe/sha256.json`` of the working directory (the
workflow's, where Snakemake keeps its own records), keyed by the file's absolute path and
stamped with its size, inode, mtime and ctime in nanoseconds: a file rewritten, replaced,
copied over or touched gets a new ctime (which no user tool can set back), and is hashed again.
Jobs check the pins again, in full, before reading any weight (``backbones.pins``), so the
cache only decides how early a mismatch is reported, never whether. Where the directory cannot
be written, nothing is kept.
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from ..backbones.pins import file_sha256

CACHE = Path(".snakemake") / "dlmpipe" / "sha256.json"
#: files at least this large say that they are being hashed (once)
ANNOUNCE_BYTES = 256 << 20


def _stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns]


class HashCache:
    """``digest(file)``: the file's sha256, from the cache while its stamp is unchanged."""

    def __init__(self, path: str | Path = CACHE):
        self.path = Path(path)
        self.changed = False
        try:
            self.entries = json.loads(self.path.read_text())
            if not isinstance(self.entries, dict):
                self.entries = {}
        except (OSError, ValueError):
            self.entries = {}

    def digest(self, file: Path) -> str:
        key = str(Path(file).resolve())
        stamp = _stamp(os.stat(key))
        entry = self.entries.get(key)
        if isinstance(entry, dict) and entry.get("stamp") == stamp and isinstance(entry.get("sha256"), str):
            return entry["sha256"]
        if stamp[0] >= ANNOUNCE_BYTES:
            print(f"dlmpipe: hashing {key} ({stamp[0] / 2**30:.1f} GiB) to check its sha256 pin; "
                  f"once: kept in {self.path}", file=sys.stderr)
        digest = file_sha256(Path(key))
        self.entries[key] = {"stamp": stamp, "sha256": digest}
        self.changed = True
        return digest

    def save(self) -> None:
        """Write the cache (atomically) if it changed; a directory that cannot be written keeps
        nothing."""
        if not self.changed:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps(self.entries, indent=1, sort_keys=True))
            os.replace(tmp, self.path)
            self.changed = False
        except OSError:
            pass
