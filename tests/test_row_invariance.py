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


def test_a_large_calls_rows_have_the_bits_of_the_same_rows_alone(monkeypatch):
    """Calls run in the sizes ``_ladder`` found (multiples of the chunk for many rows, divisors
    for the last few), each row with the bits it has alone; the calls made are ``_spans``' (fails
    if the spans lose or repeat rows, or if a size were used that rounds otherwise)."""
    import torch

    from dlmpipe.backbones import rowwise

    monkeypatch.setattr(rowwise, "_ladders", {})
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(48, 40, generator=g), torch.randn(48, generator=g)
    x = torch.randn(1100, 40, generator=g)
    y, ms = rowwise.matmul_rows(x, w, b), rowwise.mean_square(x)  # (the probes run once, here)
    calls = []
    gemm = rowwise._gemm
    monkeypatch.setattr(rowwise, "_gemm", lambda a, *rest: (calls.append(a.shape[0]), gemm(a, *rest))[1])
    assert torch.equal(rowwise.matmul_rows(x, w, b), y)
    r = rowwise.chunk_sizes()[("linear", (40, 48, True, torch.float32, torch.float32), torch.get_num_threads())]
    ladder = rowwise.call_sizes()[("linear", (40, 48, True, torch.float32, torch.float32), r, torch.get_num_threads())]
    spans = rowwise._spans(1100, r, ladder, -(-rowwise.CALL_MACS // (40 * 48)))
    assert calls == [hi - lo for lo, hi in spans]
    assert [lo for lo, _ in spans] == [0] + [hi for _, hi in spans[:-1]]  # every row once, in order
    assert 1100 <= spans[-1][1] < 1100 + r
    for rows in (1, 3, r // 4, r // 4 + 1, r - 1, r + 1, 2 * r + 3, 300, 700, 1100):
        assert torch.equal(rowwise.matmul_rows(x[:rows], w, b), y[:rows]), rows
        assert torch.equal(rowwise.mean_square(x[:rows]), ms[:rows]), rows
    alone = torch.stack([rowwise.matmul_rows(x[i:i + 1], w, b)[0] for i in range(0, 1100, 37)])
    assert torch.equal(alone, y[::37])
    assert torch.equal(torch.cat([rowwise.mean_square(x[i:i + 1]) for i in range(0, 1100, 37)]), ms[::37])


@pytest.mark.parametrize("other", ["larger", "smaller", "one-smaller"])
def test_a_call_size_that_rounds_otherwise_is_never_used(monkeypatch, other):
    """A kernel whose larger (or smaller, or one smaller) calls round rows differently
    (simulated: the last bit of every product of more (fewer, or a chunk less 3) rows than a
    chunk's) gets no such sizes: those rows stay in calls of sizes that do not, each row with
    its bits alone."""
    import torch

    from dlmpipe.backbones import rowwise

    g = torch.Generator().manual_seed(1)
    w, x = torch.randn(24, 40, generator=g), torch.randn(500, 40, generator=g)
    rowwise.matmul_rows(x[:1], w)  # the chunk size, chosen on the true kernel
    r = rowwise.chunk_sizes()[("linear", (40, 24, False, torch.float32, torch.float32), torch.get_num_threads())]
    monkeypatch.setattr(rowwise, "_ladders", {})
    gemm = rowwise._gemm
    rounds_otherwise = {"larger": lambda rows: rows > r, "smaller": lambda rows: rows < r,
                        "one-smaller": lambda rows: rows == r - 3}[other]

    def rounding_otherwise(a, weight, bias, out=None, wt=None):
        out = gemm(a, weight, bias, out, wt)
        if rounds_otherwise(a.shape[0]):
            out.copy_(torch.nextafter(out, torch.full_like(out, float("inf"))))
        return out

    monkeypatch.setattr(rowwise, "_gemm", rounding_otherwise)
    y = rowwise.matmul_rows(x, w)
    sizes = [v for (kind, *_), v in rowwise.call_sizes().items() if kind == "linear"]
    assert sizes and not any(map(rounds_otherwise, sum(sizes, ())))
    assert torch.equal(y[::23], torch.stack([rowwise.matmul_rows(x[i:i + 1], w)[0] for i in range(0, 500, 23)]))
    assert torch.equal(rowwise.matmul_rows(x[:r - 3], w), y[:r - 3])  # in a size that passed


def test_fewer_rows_than_a_chunk_take_one_call_of_their_own_size_where_it_passes(monkeypatch):
    """Every size below the chunk is a candidate (``_ladder``), so a call of fewer rows than a
    chunk (a batch-1 decode's 26 rows) is one product of exactly those rows where its size
    passed the check, with no padding; otherwise the next size up that passed; either way each
    row gets the bits a chunk-size call gives it."""
    import torch

    from dlmpipe.backbones import rowwise

    monkeypatch.setattr(rowwise, "_ladders", {})
    checked = []
    matching = rowwise._matching_sizes
    monkeypatch.setattr(rowwise, "_matching_sizes",
                        lambda candidates, r, draw: (checked.append(list(candidates)), matching(candidates, r, draw))[1])
    g = torch.Generator().manual_seed(2)
    w, b = torch.randn(24, 40, generator=g), torch.randn(24, generator=g)
    x = torch.randn(64, 40, generator=g)
    key = (40, 24, True, torch.float32, torch.float32)
    rowwise.matmul_rows(x[:1], w, b)  # the chunk size and the ladder, checked once here
    r = rowwise.chunk_sizes()[("linear", key, torch.get_num_threads())]
    ladder = rowwise.call_sizes()[("linear", key, r, torch.get_num_threads())]
    assert checked and set(range(1, r)) <= set(checked[0])
    in_chunks = torch.cat([rowwise._gemm(x[lo:lo + r], w, b) for lo in range(0, 64, r)])
    calls = []
    gemm = rowwise._gemm
    monkeypatch.setattr(rowwise, "_gemm", lambda a, *rest: (calls.append(a.shape[0]), gemm(a, *rest))[1])
    for rows in range(1, r):
        calls.clear()
        assert torch.equal(rowwise.matmul_rows(x[:rows], w, b), in_chunks[:rows]), rows
        assert calls == [min(s for s in ladder + (r,) if rows <= s <= r)], (rows, calls, ladder)


def test_a_one_call_product_of_a_batched_input_is_the_kernel_call_of_its_rows():
    """A call of exactly one checked size over a contiguous input of more than two dimensions
    ([B, T, K]) goes to ``F.linear`` as it is (no reshape, no view from Python): ATen views it as
    its rows' 2-d matrix in C++ and calls ``mm`` / ``addmm`` on that [rows, K] shape, the kernel
    call the probes checked. Fails if a torch version routes it to another kernel or shape (a
    batched product, a separate bias add), or if the bits differ from the 2-d call; the RMS
    statistic's one call over such an input likewise equals the 2-d one."""
    import torch
    from torch.profiler import profile

    from dlmpipe.backbones import rowwise

    g = torch.Generator().manual_seed(4)
    w, b = torch.randn(24, 40, generator=g), torch.randn(24, generator=g)
    with torch.inference_mode():
        rowwise.matmul_rows(torch.randn(1, 40, generator=g), w, b)  # the chunk size, checked
        r = rowwise.chunk_sizes()[("linear", (40, 24, True, torch.float32, torch.float32), torch.get_num_threads())]
        x = torch.randn(2, r // 2, 40, generator=g)  # r rows: one call of a checked size
        for bias in (b, None):
            with profile(record_shapes=True) as prof:
                y = rowwise.matmul_rows(x, w, bias)
            kernels = [(e.name, e.input_shapes) for e in prof.events() if e.name in ("aten::mm", "aten::addmm", "aten::bmm")]
            want = ("aten::mm", [[r, 40], [40, 24]]) if bias is None else ("aten::addmm", [[24], [r, 40], [40, 24], [], []])
            assert kernels == [want], kernels
            assert y.shape == (2, r // 2, 24)
            assert torch.equal(y.reshape(r, 24), rowwise._gemm(x.reshape(r, 40), w, bias))
        for rows, d in ((r, 40), (26, 64), (7, 24)):
            x = torch.randn(rows, d, generator=g)
            flat = rowwise.mean_square(x)
            for shape in ((1, rows, d), (rows, 1, d)):
                assert torch.equal(rowwise.mean_square(x.view(shape)).reshape(rows, 1), flat), shape


def test_fewer_query_rows_than_a_chunk_take_one_attention_call_of_their_size_where_it_passes(monkeypatch):
    """Attention likewise: every query count below the chunk ``Q`` is checked once per shape, and
    a call of that many query rows (a cached step's response rows, a batch-1 forward's last few)
    is one SDPA call of exactly those rows where it passed, else of the next size up that
    passed; each row gets the bits it gets in a ``Q``-row call."""
    import torch
    import torch.nn.functional as F

    from dlmpipe.backbones import rowwise

    monkeypatch.setattr(rowwise, "_ladders", {})
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 4, 64, 16, generator=g)
    k, v = torch.randn(2, 1, 2, 40, 16, generator=g)  # grouped-query: 4 heads over 2
    with torch.inference_mode():
        rowwise.attend(q[:, :, :1], k, v, None, True)
    key = (4, 2, 16, 40, False, torch.float32)
    n = rowwise.chunk_sizes()[("attend", key, torch.get_num_threads())]
    sizes = rowwise.call_sizes()[("attend", key, n, torch.get_num_threads())]
    in_chunks = torch.cat([F.scaled_dot_product_attention(q[:, :, lo:lo + n], k, v, enable_gqa=True)
                           for lo in range(0, 64, n)], dim=2)
    calls = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention",
                        lambda q, *rest, **kw: (calls.append(q.shape[2]), sdpa(q, *rest, **kw))[1])
    with torch.inference_mode():
        for rows in range(1, n + 3):
            calls.clear()
            assert torch.equal(rowwise.attend(q[:, :, :rows], k, v, None, True), in_chunks[:, :, :rows]), rows
            last = rows - n if rows > n else rows
            assert calls == [n] * (rows > n) + [min(s for s in sizes + (n,) if last <= s <= n)], (rows, calls)
