"""dlmpipe pins the CPU's math kernels to AVX2 on x86-64 (dlmpipe/cpu_kernels.py), so the toy's
stored token hashes (tests/data/toy_expected.json) hold on every machine, not only on CPUs whose
MKL and ATen take the kernels of the machine that stored them."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from .workflow import REPO

pytestmark = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                                reason="the pins are x86-64's (MKL, ATen's AVX2 kernels)")

PROBE = """
import os, hashlib{imports}
import torch
torch.manual_seed(0)
torch.set_num_threads(1)
a, b = torch.randn(37, 64), torch.randn(64, 512)
print(os.environ.get("MKL_CBWR"), torch.backends.cpu.get_cpu_capability(),
      hashlib.sha1((a @ b).numpy().tobytes()).hexdigest())
"""


def probe(with_dlmpipe: bool = True, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if k not in ("MKL_CBWR", "ATEN_CPU_CAPABILITY")}
    code = PROBE.format(imports="\nimport dlmpipe" if with_dlmpipe else "")
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env, "PYTHONPATH": str(REPO)},
                         capture_output=True, text=True, check=True).stdout
    return out.split()


def test_importing_dlmpipe_pins_mkl_and_aten_to_avx2():
    cbwr, capability, gemm = probe()
    assert (cbwr, capability) == ("AVX2", "AVX2")
    # MKL reads the pin: its bits are an explicit MKL_CBWR=AVX2 run's, not another branch's
    assert gemm == probe(False, MKL_CBWR="AVX2", ATEN_CPU_CAPABILITY="avx2")[2]
    assert gemm != probe(False, MKL_CBWR="COMPATIBLE", ATEN_CPU_CAPABILITY="avx2")[2]


def test_a_value_the_user_set_wins():
    cbwr, capability, _ = probe(MKL_CBWR="COMPATIBLE", ATEN_CPU_CAPABILITY="default")
    assert (cbwr, capability) == ("COMPATIBLE", "DEFAULT")
