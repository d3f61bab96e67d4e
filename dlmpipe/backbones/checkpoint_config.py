"""A checkpoint directory's config.json (and generation_config.json) -> ``BackboneConfig``.

Read as plain JSON (never remote code), every field checked, so a bad file gives one
``CheckpointError`` naming the field and the file (loading.py states the whole loading contract).
Everything but building the ``BackboneConfig`` runs without torch: the campaign check reads a
checkpoint's widths here (``read_widths``) before any job.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import CheckpointError
from .errors import read_json as _read_json
from .families import family, family_of
from .families.base import Fields as _Fields
from .families.base import unique as _unique

if TYPE_CHECKING:
    from .model import BackboneConfig

__all__ = ["CheckpointError", "Widths", "read_config", "read_fields", "read_widths"]


def read_fields(path: Path) -> dict:
    """``BackboneConfig``'s fields, as config.json / generation_config.json declare them, every
    field checked (no torch)."""
    path = Path(path)
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file}: config.json missing (is {path} a checkpoint directory?)")
    raw = _read_json(cfg_file, "config.json")
    fields = family(family_of(raw, cfg_file)).read_config(_Fields(raw, cfg_file))
    gen_file = path / "generation_config.json"
    if gen_file.is_file():
        fields["stop_ids"] = _unique(fields["stop_ids"] + _Fields(
            _read_json(gen_file, "generation_config.json"), gen_file).ids("eos_token_id"))
    return fields


def read_config(path: Path) -> BackboneConfig:
    """Architecture and the special ids config.json / generation_config.json declare."""
    from .model import BackboneConfig

    return BackboneConfig(**read_fields(path))


@dataclass(frozen=True)
class Widths:
    """The widths a method's parameters may depend on (registry ``width_checks``)."""

    d_model: int
    n_heads: int
    n_kv_heads: int
    source: str = ""  # where they were read, for messages
    attn_head_dim: int | None = None  # when config.json sets a head width (SDAR: 128 at width 2560)

    @property
    def head_dim(self) -> int:
        return self.attn_head_dim or self.d_model // self.n_heads

    @property
    def value_rank(self) -> int:
        """Rank of the value projection W_v (d_model -> n_kv_heads * head_dim): SPA-Cache's
        singular proxies keep at most this many directions (engine/proxies.py)."""
        return min(self.n_kv_heads * self.head_dim, self.d_model)


def read_widths(path: Path) -> Widths:
    """A checkpoint directory's widths, from config.json (CheckpointError naming the field)."""
    fields = read_fields(path)
    return Widths(fields["d_model"], fields["n_heads"], fields["n_kv_heads"],
                  str(Path(path) / "config.json"), fields.get("attn_head_dim"))
