"""The one error a bad checkpoint directory raises, and the JSON reader every checkpoint file goes
through (torch-free: the campaign check reads config.json with it before any job)."""
from __future__ import annotations

import json
from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint directory that cannot be loaded; the message names the problem and file."""


def read_json(file: Path, what: str) -> dict:
    try:
        raw = json.loads(Path(file).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{file}: {what} is not valid JSON ({e})") from e
    if not isinstance(raw, dict):
        raise CheckpointError(f"{file}: {what} must be a JSON object, got {type(raw).__name__}")
    return raw
