"""A briefly trained toy backbone saved in LLaDA's format, shared by tests (cached per session)."""
from __future__ import annotations

from pathlib import Path

_CACHE: dict[str, Path] = {}


def toy_checkpoint_dir(root: Path, steps: int = 40) -> Path:
    """Train the toy backbone for a few steps (seconds) and return its checkpoint directory."""
    from dlmpipe.backbones.toy import train_toy

    key = f"{root}:{steps}"
    if key not in _CACHE:
        out = root / f"toy-{steps}"
        train_toy(out, seed=0, steps=steps, batch_size=16, log=lambda *_: None)
        _CACHE[key] = out
    return _CACHE[key]
