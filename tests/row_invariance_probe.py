"""Row invariance under whatever kernels this process runs: run by tests/test_row_invariance.py in
subprocesses whose MKL_CBWR, ATEN_CPU_CAPABILITY and thread counts differ (the other CPUs' code
paths, where a second machine is not at hand). Prints one line per failed check and exits 1 if
any failed; prints the chunk sizes chosen (dlmpipe/backbones/rowwise.py) and exits 0 otherwise.
The thread counts given (default: the current one) run one after the other in this process
(``torch.set_num_threads``: MKL and OpenMP take it per call; the chunk sizes are chosen per
thread count); the kernels' environment is read once, at start, hence a process per kernel.

    python -m tests.row_invariance_probe [THREADS ...]
"""
from __future__ import annotations

import sys

import torch

from dlmpipe.backbones import rowwise


def _rows(n: int, k: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(n, k, generator=g) * 3


def check_primitives() -> list[str]:
    """Each primitive: rows alone equal the same rows at another place in a larger call."""
    g = torch.Generator().manual_seed(0)
    bad = []
    for k, n, bias in ((64, 192, True), (200, 64, False), (128, 512, False), (96, 1000, False)):
        w = torch.randn(n, k, generator=g) / k ** 0.5
        b = torch.randn(n, generator=g) if bias else None
        big = _rows(90, k, g)
        full = rowwise.matmul_rows(big, w, b)
        for rows in list(range(1, 35)) + [47, 64, 65]:
            for at in (0, 7):
                part = big[at:at + rows]
                if part.shape[0] == rows and not torch.equal(rowwise.matmul_rows(part, w, b), full[at:at + rows]):
                    bad.append(f"linear K={k} N={n}: {rows} rows at {at}")
        sq = rowwise.mean_square(big)
        for rows in (1, 3, 17, 40):
            if not torch.equal(rowwise.mean_square(big[5:5 + rows]), sq[5:5 + rows]):
                bad.append(f"mean_square d={k}: {rows} rows")
    x = torch.randn(300 * 37, generator=g) * 4
    for fn in (rowwise.silu, rowwise.sigmoid, rowwise.cos, rowwise.sin):
        ref = fn(x)
        for n in (1, 15, 17, 37 * 9, 37 * 250):
            if not torch.equal(fn(x[3:3 + n]), ref[3:3 + n]):
                bad.append(f"{fn.__name__}: {n} elements")
    for h, hkv, hd in ((4, 2, 16), (4, 4, 32)):
        for tk in (9, 40, 300):
            q = torch.randn(3, h, 70, hd, generator=g)
            k, v = torch.randn(2, 3, hkv, tk, hd, generator=g)
            mask = torch.rand(70, tk, generator=g) < 0.6
            mask[:, 0] = True
            for m in (None, mask):
                full = rowwise.attend(q, k, v, m, enable_gqa=h != hkv)
                for rows in (1, 2, 3, 5, 33, 34):
                    part = rowwise.attend(q[:1, :, 4:4 + rows], k[:1], v[:1],
                                          None if m is None else m[4:4 + rows], enable_gqa=h != hkv)
                    if not torch.equal(part, full[:1, :, 4:4 + rows]):
                        bad.append(f"attend H={h} Hkv={hkv} hd={hd} Tk={tk} mask={m is not None}: {rows} rows")
    return bad


def check_decodes() -> list[str]:
    """Two pairings an independent check found changing tokens in a batch: alone vs B = 3."""
    from .models import tiny_backbone
    from .test_batching import LAYERS, check_invariant

    bad = []
    for family, sampler, cache in (("dream", {"name": "dream"}, {"name": "dllm_cache"}),
                                   ("llada", {"name": "llada_confidence", "block_length": 8}, {"name": "none"}),
                                   ("dream", {"name": "eb_sampler", "block_length": 8}, {"name": "fast_dllm_dual"})):
        try:
            check_invariant(tiny_backbone(family, seed=1, n_layers=LAYERS), sampler, cache, sizes=(3,))
        except AssertionError as e:
            bad.append(f"{family} {sampler['name']} + {cache['name']} at B = 3: {str(e)[:200]}")
    return bad


def main(argv: list[str] | None = None) -> int:
    bad = []
    for threads in [int(t) for t in (sys.argv[1:] if argv is None else argv)] or [torch.get_num_threads()]:
        torch.set_num_threads(threads)
        failed = check_primitives() + check_decodes()
        chunks = sorted({n for (_, _, t), n in rowwise.chunk_sizes().items() if t == threads})
        print("\n".join(f"threads {threads}: {b}" for b in failed) if failed else
              f"row-invariant: {torch.backends.cpu.get_cpu_capability()} threads {threads} chunks {chunks}")
        bad += failed
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
