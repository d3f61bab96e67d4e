"""dlmpipe: evaluation campaigns for diffusion language models and their caching methods."""

__version__ = "0.1.0"
