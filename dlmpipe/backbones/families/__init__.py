"""The backbone families, registered once: adding a family is its module, one line below and one
golden-logits row in tests/test_backbones.py (docs/MODELS.md). Torch-free."""
from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError
from . import dream, fast_dllm_v2, llada, llada2, llada_moe, sdar
from .base import Family

FAMILIES: dict[str, Family] = {f.name: f for f in (
    llada.FAMILY,
    dream.FAMILY,
    sdar.FAMILY,
    fast_dllm_v2.FAMILY,
    llada_moe.FAMILY,
    llada2.FAMILY,
)}

#: config.json's model_type (lower-case) -> family name
FAMILY_OF_MODEL_TYPE = {t: f.name for f in FAMILIES.values() for t in f.model_types}


def family(name: str) -> Family:
    return FAMILIES[name]


def family_of(raw: dict, cfg_file: Path) -> str:
    """The family of a config.json's ``model_type`` (CheckpointError when unsupported)."""
    model_type = raw.get("model_type")
    claimed = [f.name for f in FAMILIES.values() if f.claims is not None and f.claims(raw)]
    if claimed:
        return claimed[0]
    name = FAMILY_OF_MODEL_TYPE.get(model_type.lower()) if isinstance(model_type, str) else None
    if name is None:
        supported = ", ".join(f.label for f in FAMILIES.values())
        raise CheckpointError(f"{cfg_file}: unknown model_type {model_type!r} (supported: {supported})")
    return name
