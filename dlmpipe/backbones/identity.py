"""Which checkpoint a backbone is, read without torch: its family and the names it goes by.

Method parameters that follow the backbone (SPA-Cache's ``profile: auto``, dlmpipe/registry/)
are chosen from this when the campaign is checked, before any job runs, so that a generate job's
params carry the concrete value. Only config.json (plain JSON) and the directory's path are read;
checkpoint_config.py checks every other field when a job loads the checkpoint.

LLaDA-8B-Instruct, LLaDA-8B-Base and LLaDA-1.5 share one config.json (docs/MODELS.md): only a
checkpoint's names tell them apart: config.json's ``_name_or_path`` (written by
``save_pretrained``), the directory's name (as given and with symlinks resolved), and the hub
repository of a Hugging Face cache snapshot (``models--GSAI-ML--LLaDA-1.5/snapshots/<rev>``).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .errors import CheckpointError, read_json
from .families import FAMILY_OF_MODEL_TYPE, family_of

__all__ = ["FAMILY_OF_MODEL_TYPE", "TOY", "BackboneIdentity", "CheckpointError", "checkpoint_identity",
           "checkpoint_names", "family_of", "read_json", "shipped_identity"]


@dataclass(frozen=True)
class BackboneIdentity:
    """A backbone's family (a name of ``families.FAMILIES``) and checkpoint names (may be empty)."""

    family: str
    names: tuple[str, ...] = ()
    source: str = ""  # what it was read from, for messages

    def describe(self) -> str:
        names = f", checkpoint {' / '.join(self.names)}" if self.names else ""
        return f"{self.source or 'backbone'} ({self.family} family{names})"


def checkpoint_names(path: Path, raw: dict) -> tuple[str, ...]:
    """The names a checkpoint directory goes by, most specific first, without repeats."""
    path = Path(path).expanduser()
    names = []
    if isinstance(raw.get("_name_or_path"), str) and raw["_name_or_path"].strip():
        names.append(raw["_name_or_path"].strip())
    for p in (path.absolute(), path.resolve()):
        names.append(p.name)
        if p.parent.name == "snapshots" and p.parent.parent.name.startswith("models--"):
            names.append(p.parent.parent.name.removeprefix("models--").replace("--", "/"))
    return tuple(dict.fromkeys(n for n in names if n))


def checkpoint_identity(path: str | Path) -> BackboneIdentity:
    """Family and names of a local checkpoint directory (CheckpointError when config.json is
    missing, unreadable or of an unsupported model_type)."""
    path = Path(path).expanduser()
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file}: config.json missing (is {path} a checkpoint directory?)")
    raw = read_json(cfg_file, "config.json")
    return BackboneIdentity(family_of(raw, cfg_file), checkpoint_names(path, raw), str(path))


#: the toy backbone (dlmpipe/backbones/toy.py) is trained by the workflow in LLaDA's format
TOY = BackboneIdentity("llada", (), "toy backbone")


def shipped_identity(path: str | Path, source: str) -> BackboneIdentity:
    """A shipped toy's identity: ``TOY`` for one in LLaDA's format (the toy), else what its
    config.json says (the block toy, in SDAR's format: the sdar family, block-causal)."""
    import dataclasses

    identity = checkpoint_identity(path)
    return dataclasses.replace(TOY if identity.family == "llada" else identity, source=source)
