"""One set of CPU math kernels on every x86-64 machine, so a float32 CPU decode gives the same
bits everywhere (docs/ARCHITECTURE.md, reproducible CPU kernels).

MKL picks its sgemm kernels by the CPU it finds (AVX-512 on one server, AVX2 on another, its own
paths for Intel and AMD), and ATen's vectorized ops (exp, SiLU, softmax) by the instruction set;
each rounds differently, so a near tie in the toy's logits can go the other way on another
machine, and a stored token hash or verdict with it. MKL's conditional numerical reproducibility
(``MKL_CBWR``) and ATen's ``ATEN_CPU_CAPABILITY`` pin both to AVX2, which every x86-64 server of
the last decade has. Both are read at the first CPU op, so ``pin`` runs when dlmpipe is imported
(before any of its torch work); a value already in the environment wins (``MKL_CBWR=AUTO
ATEN_CPU_CAPABILITY=avx512`` takes a machine's fastest kernels instead). GPU kernels are not
affected.
"""
from __future__ import annotations

import os
import platform

#: environment variable -> value that pins the kernels (x86-64 only: elsewhere neither applies)
PINS = {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"}


def pin() -> dict[str, str]:
    """Set each of ``PINS`` not already set; returns the values in effect."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return {}
    for name, value in PINS.items():
        os.environ.setdefault(name, value)
    return {name: os.environ[name] for name in PINS}
