"""Checkpoints shipped with dlmpipe (``backbones: {b: {shipped: toy}}``), and weight hashes.

Training the toy on each machine gave each machine other weights (CPU kernels differ in their
floating-point sums, and 600 Adam steps amplify the last bit), and with them other verdicts on
the methods. The default campaign therefore decodes one trained toy shipped in the package,
``dlmpipe/shipped/<name>/``, in LLaDA's on-disk format like any checkpoint, beside the record
``training.json`` of how it was trained: every ``train_toy`` keyword argument, and the
environment whose kernels produced these exact bits (torch version, CPU capability and model,
threads). ``python -m dlmpipe ship-toy`` retrains it from that record (or from new options) and
prints the hashes the campaign pins; ``tests/test_shipped_toy.py`` proves the shipped weights
are what the record's options train.

Any checkpoint (``path:`` or ``shipped:``) may pin its safetensors files' sha256
(``sha256: {file: hex}``); the loader checks them before reading a weight, and a mismatch is one
``CheckpointError`` naming the file, the expected and the actual hash (nothing is written or
removed). A shipped checkpoint without ``sha256:`` in the campaign is checked against its record.
"""
from __future__ import annotations

import hashlib
import json
import platform
from pathlib import Path

from .checkpoint_config import CheckpointError

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


def file_sha256(file: Path) -> str:
    h = hashlib.sha256()
    with open(file, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def weight_sha256(path: str | Path) -> dict[str, str]:
    """sha256 of every safetensors file of a checkpoint directory, by file name."""
    return {f.name: file_sha256(f) for f in sorted(Path(path).glob("*.safetensors"))}


def check_sha256(path: str | Path, expected: dict[str, str] | None) -> None:
    """Raise CheckpointError unless every pinned file exists with its pinned sha256 (and no
    safetensors file is left unpinned). Reads only; nothing is changed."""
    if not expected:
        return
    path = Path(path)
    problems = []
    for name, want in sorted(expected.items()):
        file = path / name
        if not file.is_file():
            problems.append(f"{file}: pinned by sha256 but missing (expected sha256 {want})")
            continue
        got = file_sha256(file)
        if got != want.lower():
            problems.append(f"{file}: sha256 mismatch: expected {want}, actual {got}")
    extra = sorted(set(f.name for f in path.glob("*.safetensors")) - set(expected))
    problems += [f"{path / name}: weight file not pinned by sha256 (pinned: {', '.join(sorted(expected))})"
                 for name in extra]
    if problems:
        raise CheckpointError("checkpoint weights are not the pinned ones (the campaign's "
                              "backbone sha256; nothing was changed):\n  " + "\n  ".join(problems))


def training_environment(threads: int) -> dict:
    """What decides a trained toy's exact bits besides its options: the kernels torch picks."""
    import torch

    return {"torch": torch.__version__, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu": cpu_model(), "machine": platform.machine(), "threads": threads,
            "python": platform.python_version()}


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


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
