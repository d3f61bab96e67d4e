"""Checkpoints shipped with dlmpipe (``backbones: {b: {shipped: toy}}``) and their records.

Training the toy on each machine gave each machine other weights (CPU kernels differ in their
floating-point sums, and 600 Adam steps amplify the last bit), and with them other verdicts on
the methods. The default campaign therefore decodes one trained toy shipped in the package,
``dlmpipe/shipped/<name>/``, in LLaDA's on-disk format like any checkpoint, beside the record
``training.json`` of how it was trained: every ``train_toy`` keyword argument, and the
environment whose kernels produced these exact bits (torch version, CPU capability and model,
threads). ``python -m dlmpipe ship-toy`` retrains it from that record (or from new options) and
prints the hashes the campaign pins; ``tests/test_shipped_toy.py`` proves the shipped weights
are what the record's options train.

A shipped checkpoint's weights are pinned by the record's sha256 unless the campaign pins them
(pins.py checks them). No torch here: the campaign check reads the records.
"""
from __future__ import annotations

import json
from pathlib import Path

from .identity import CheckpointError

SHIPPED_DIR = Path(__file__).resolve().parent.parent / "shipped"
RECORD = "training.json"


def shipped_names() -> list[str]:
    return sorted(p.name for p in SHIPPED_DIR.iterdir() if (p / RECORD).is_file()) \
        if SHIPPED_DIR.is_dir() else []


def shipped_path(name: str) -> Path:
    """The directory of a shipped checkpoint (CheckpointError naming the known ones)."""
    path = SHIPPED_DIR / name
    if not (path / RECORD).is_file():
        raise CheckpointError(f"no shipped checkpoint {name!r} (in {SHIPPED_DIR}; shipped: "
                              f"{', '.join(shipped_names()) or 'none'})")
    return path


def read_record(name_or_path: str | Path) -> dict:
    """A shipped checkpoint's training record: ``options`` (train_toy's keyword arguments),
    ``environment`` (where its bits were produced), ``sha256`` (its weight files), ``stats``."""
    path = Path(name_or_path)
    path = path if path.is_dir() else shipped_path(str(name_or_path))
    return json.loads((path / RECORD).read_text())


def ship_toy(name: str = "toy", options: dict | None = None, out: str | Path | None = None,
             log=print) -> dict:
    """Train the toy with ``options`` (default: the shipped record's, i.e. regenerate it) into
    ``out`` (default: the shipped directory itself) and write its record; returns the record.
    The weights come out identical to the shipped ones where the record's environment matches."""
    from .toy import train_toy

    if options is None:
        options = read_record(name)["options"]
    out = Path(out) if out is not None else SHIPPED_DIR / name
    train_toy(out, **options, log=log)  # writes the record, training.json
    record = read_record(out)
    log(f"{out}: pin these in the campaign (config.yaml backbones.{name}.sha256):")
    for file, digest in record["sha256"].items():
        log(f"  {file}: {digest}")
    return record
