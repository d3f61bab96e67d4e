"""Row invariance on other CPUs' kernels (docs/ARCHITECTURE.md, "Row invariance"): the rows of
every primitive, and batched decodes, equal the same rows alone under each code path this
machine can be made to take in place of a second machine: MKL's AVX2 and compatible branches
(``MKL_CBWR``, the paths MKL takes on AMD and older CPUs), ATen's AVX2 and AVX-512 kernels
(``ATEN_CPU_CAPABILITY``) and 1 or 2 threads (tests/row_invariance_probe.py in a subprocess per
kernel setting, which the process reads at start; both thread counts in it, one after the
other). The native kernels are this test process's own where neither variable is set in it: the
probe runs here then (no second torch import)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

from .workflow import REPO

X86 = platform.machine().lower() in ("x86_64", "amd64")
KERNELS = [{}, {"MKL_CBWR": "AVX2", "ATEN_CPU_CAPABILITY": "avx2"},
           {"MKL_CBWR": "COMPATIBLE", "ATEN_CPU_CAPABILITY": "default"}]


THREADS = (1, 2)
#: the variables that choose the kernels (read once, at a process's start)
KERNEL_ENV = ("MKL_CBWR", "ATEN_CPU_CAPABILITY")


@pytest.mark.parametrize("kernels", KERNELS if X86 else [{}],
                         ids=lambda k: "-".join(k.values()) or "native")
def test_rows_are_invariant_under_other_kernels_and_thread_counts(kernels, capsys):
    if not kernels and not any(k in os.environ for k in KERNEL_ENV):  # this process's kernels are native
        from . import row_invariance_probe

        capsys.readouterr()
        returncode = row_invariance_probe.main(list(map(str, THREADS)))  # (conftest restores the threads)
        stdout = capsys.readouterr().out
        stderr = ""
    else:
        clean = {k: v for k, v in os.environ.items() if k not in (*KERNEL_ENV, "OMP_NUM_THREADS", "MKL_NUM_THREADS")}
        most = str(max(THREADS))
        env = {**clean, **kernels, "OMP_NUM_THREADS": most, "MKL_NUM_THREADS": most, "PYTHONPATH": str(REPO)}
        out = subprocess.run([sys.executable, "-m", "tests.row_invariance_probe", *map(str, THREADS)],
                             cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
        returncode, stdout, stderr = out.returncode, out.stdout, out.stderr
    assert returncode == 0, stdout + stderr[-3000:]
    lines = stdout.splitlines()
    assert len(lines) == len(THREADS), stdout
    for line, threads in zip(lines, THREADS):
        assert line.startswith("row-invariant:") and f" threads {threads} " in line, stdout


def test_where_no_chunk_size_is_invariant_rows_go_one_per_call_and_it_says_so(monkeypatch):
    """The fallback: kernels that compute rows by their place in every chunk size tried get
    one-row calls (the same call for every row), with a warning, never silently."""
    import torch

    from dlmpipe.backbones import rowwise

    monkeypatch.setattr(rowwise, "_chosen", {})
    monkeypatch.setattr(rowwise, "_position_invariant", lambda run, n: False)
    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(7, 24, generator=g), torch.randn(10, 24, generator=g)
    with pytest.warns(UserWarning, match="one-row calls"):
        y = rowwise.matmul_rows(x, w)
    assert set(rowwise.chunk_sizes().values()) == {1}
    assert all(torch.equal(y[i], rowwise.matmul_rows(x[i:i + 1], w)[0]) for i in range(7))
