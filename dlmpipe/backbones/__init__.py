"""Native backbones, checkpoint loading and the toy backbone trainer.

The names below are imported on first use, so that torch-free modules of this package
(``identity``, read when the campaign is checked) do not pull torch into Snakemake's parsing.
"""
from importlib import import_module

_EXPORTS = {"Backbone": ".model", "BackboneConfig": ".model", "CheckpointError": ".identity",
            "LoadedBackbone": ".loading", "load_backbone": ".loading"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
