"""Atomic file writes: every file the pipeline writes appears whole or not at all.

A killed job (timeout, preemption, SIGKILL) must never leave a truncated output that Snakemake or
a later job would take for a finished one. ``atomic_write`` writes to a temporary name unique to
this process in the same directory, flushes it to disk, renames it over the target (atomic on
POSIX filesystems) and syncs the directory; on any failure the temporary file is removed and the
old target, if any, is untouched. Temporaries left by killed processes are swept on the next write.
"""
from __future__ import annotations

import json
import os
import secrets
from pathlib import Path
from typing import Callable


def _temporary_name(out: Path) -> Path:
    return out.with_name(f".{out.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")


def _sweep_stale(out: Path) -> None:
    """Remove temporaries of ``out`` whose writer process is gone (a killed run)."""
    for stale in out.parent.glob(f".{out.name}.*.tmp"):
        pid = stale.name[len(out.name) + 2:].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            stale.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _fsync_path(path: Path, directory: bool = False) -> None:
    flags = os.O_RDONLY | (os.O_DIRECTORY if directory else 0)
    try:
        fd = os.open(path, flags)
    except OSError:  # e.g. a filesystem that cannot open directories
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write(out: str | Path, write: Callable[[Path], None], fsync: bool = True) -> Path:
    """Call ``write(tmp)`` to produce the file, then rename it over ``out``.

    ``fsync`` (default) flushes the file and its directory so the rename survives a node crash
    on shared filesystems; pass False for cheap, re-creatable files.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    _sweep_stale(out)
    tmp = _temporary_name(out)
    try:
        write(tmp)
        if fsync:
            _fsync_path(tmp)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    if fsync:
        _fsync_path(out.parent, directory=True)
    return out


def atomic_write_text(out: str | Path, text: str, fsync: bool = True) -> Path:
    return atomic_write(out, lambda tmp: tmp.write_text(text, encoding="utf-8"), fsync)


def atomic_write_json(out: str | Path, value, fsync: bool = True) -> Path:
    return atomic_write_text(out, json.dumps(value, indent=2) + "\n", fsync)


def atomic_write_parquet(out: str | Path, table, fsync: bool = True) -> Path:
    """Write a ``pyarrow.Table`` as parquet."""
    import pyarrow.parquet as pq

    return atomic_write(out, lambda tmp: pq.write_table(table, tmp), fsync)
