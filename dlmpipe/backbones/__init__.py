"""Native backbones, checkpoint loading and the toy backbone trainer."""
from .loading import CheckpointError, LoadedBackbone, load_backbone
from .model import Backbone, BackboneConfig

__all__ = ["Backbone", "BackboneConfig", "CheckpointError", "LoadedBackbone", "load_backbone"]
