"""``python -m dlmpipe.registry``: every sampler and cache (as ``dlmpipe methods``)."""
from .describe import describe

print(describe())
