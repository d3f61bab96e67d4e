"""dlmpipe: evaluation campaigns for diffusion language models and their caching methods."""
from .cpu_kernels import pin as _pin_cpu_kernels

_pin_cpu_kernels()  # before any torch op (dlmpipe/cpu_kernels.py)

__version__ = "0.1.0"
