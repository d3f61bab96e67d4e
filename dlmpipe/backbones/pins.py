"""Weight pins: the sha256 of a checkpoint's safetensors files, and the check every loader runs.

Any checkpoint (``path:`` or ``shipped:``) may pin its safetensors files' sha256
(``sha256: {file: hex}``); the loader checks them before reading a weight, and a mismatch is one
``CheckpointError`` naming the file, the expected and the actual hash (nothing is written or
removed). A shipped checkpoint without ``sha256:`` in the campaign is checked against its record
(shipped.py); a trained toy records its own (toy.py). Plain file reads: no torch.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

from .identity import CheckpointError


def file_sha256(file: Path) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def weight_sha256(path: str | Path) -> dict[str, str]:
    """sha256 of every safetensors file of a checkpoint directory, by file name."""
    return {f.name: file_sha256(f) for f in sorted(Path(path).glob("*.safetensors"))}


def sha256_problems(path: str | Path, expected: dict[str, str],
                    digest: Callable[[Path], str] = file_sha256) -> list[str]:
    """One line per pinned file that is missing or has another sha256 (by ``digest``), and per
    safetensors file left unpinned. Reads only."""
    path = Path(path)
    problems = []
    for name, want in sorted(expected.items()):
        file = path / name
        if not file.is_file():
            problems.append(f"{file}: pinned by sha256 but missing (expected sha256 {want})")
            continue
        got = digest(file)
        if got != want.lower():
            problems.append(f"{file}: sha256 mismatch: expected {want}, actual {got}")
    extra = sorted(set(f.name for f in path.glob("*.safetensors")) - set(expected))
    problems += [f"{path / name}: weight file not pinned by sha256 (pinned: {', '.join(sorted(expected))})"
                 for name in extra]
    return problems


def check_sha256(path: str | Path, expected: dict[str, str] | None) -> None:
    """Raise CheckpointError unless every pinned file exists with its pinned sha256 (and no
    safetensors file is left unpinned). Reads only; nothing is changed."""
    if not expected:
        return
    problems = sha256_problems(path, expected)
    if problems:
        raise CheckpointError("checkpoint weights are not the pinned ones (the campaign's "
                              "backbone sha256; nothing was changed):\n  " + "\n  ".join(problems))
