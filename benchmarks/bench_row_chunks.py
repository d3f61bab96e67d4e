"""What row invariance by construction costs on the CPU (dlmpipe/backbones/rowwise.py), in one run.

Each line is a ratio, chunked (fixed-shape calls) over plain (one call of the given rows), of
medians of interleaved repetitions on one thread:
- one projection at the shipped toy's widths (128 -> 384) and at a 7B-like width scaled down
  (1024 -> 2816) for 1, 3, 16, 26, 64 and 480 rows: a call of a size that failed rowwise's
  check pays for a padded call of the next size that passed (1-3 rows on a Zen 3: 4), one of
  a size that passed (26) for the glue only, a large one for several calls;
- attention over 60 keys for 3, 32 and 60 query rows (4 heads of 32);
- a whole decode of the shipped toy (LLaDA confidence, full recompute, 32 tokens; and SPA-Cache
  at budget 0.25), batch 1 and batch 8.

    python benchmarks/bench_row_chunks.py [--repeats 7]
"""
from __future__ import annotations

import argparse
import statistics
import time
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from dlmpipe.backbones import rowwise


@contextmanager
def plain():
    """The plain ops: rowwise's exact path switched off."""
    saved = rowwise.exact_path
    rowwise.exact_path = lambda x: False
    try:
        yield
    finally:
        rowwise.exact_path = saved


def ratio(fn, repeats: int) -> tuple[float, float, float]:
    """(chunked s, plain s, ratio) of medians, the two interleaved."""
    fn()
    with plain():
        fn()
    a, b = [], []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        a.append(time.perf_counter() - t)
        with plain():
            t = time.perf_counter()
            fn()
            b.append(time.perf_counter() - t)
    ma, mb = statistics.median(a), statistics.median(b)
    return ma, mb, ma / mb


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=7)
    a = p.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    print(f"{'what':52s} {'chunked':>10s} {'plain':>10s} {'ratio':>6s}")
    for k, n in ((128, 384), (1024, 2816)):
        w = torch.randn(n, k, generator=g)
        for rows in (1, 3, 16, 26, 64, 480):
            x = torch.randn(rows, k, generator=g)
            c, pl, r = ratio(lambda: [rowwise.matmul_rows(x, w) for _ in range(20)], a.repeats)
            print(f"{f'projection {k}->{n}, {rows} rows (x20)':52s} {c * 1e3:8.2f}ms {pl * 1e3:8.2f}ms {r:6.2f}")
    k_, v_ = torch.randn(2, 8, 4, 60, 32, generator=g)
    for tq in (3, 32, 60):
        q = torch.randn(8, 4, tq, 32, generator=g)
        c, pl, r = ratio(lambda: [rowwise.attend(q, k_, v_, None, False) for _ in range(20)], a.repeats)
        print(f"{f'attention, batch 8, {tq} query rows over 60 keys (x20)':52s} {c * 1e3:8.2f}ms {pl * 1e3:8.2f}ms {r:6.2f}")
    from dlmpipe.backbones.shipped import shipped_path
    from dlmpipe.backbones.loading import load_backbone
    from dlmpipe.batching import Sample, decode_batched, slot_models
    from dlmpipe.methods import build_method

    loaded = load_backbone(shipped_path("toy"), dtype="float32")
    model = loaded.model
    prompts = [torch.randint(5, 60, (20 + i,), generator=g) for i in range(8)]
    methods = {"llada-confidence": {"sampler": {"name": "llada_confidence"}, "cache": {"name": "none"}},
               "spa-cache p0.25": {"sampler": {"name": "llada_confidence"},
                                   "cache": {"name": "spa", "rank": 16, "rho": 0.25}}}
    for name, method in methods.items():
        for b in (1, 8):
            def run():
                slots = slot_models(model, b)
                built = [build_method(method, s) for s in slots]
                samples = [Sample(i, p, 32, torch.Generator().manual_seed(i)) for i, p in enumerate(prompts)]
                decode_batched(model, built, samples, lambda *_: None)
            try:
                c, pl, r = ratio(run, max(3, a.repeats // 2))
            except Exception as e:  # a method this toy cannot run here: say so, go on
                print(f"{f'{name}, 8 samples at batch {b}':52s} skipped: {e}")
                continue
            print(f"{f'toy decode {name}, 8 samples at batch {b}':52s} {c:9.3f}s {pl:9.3f}s {r:6.2f}")
    print("chunk sizes chosen:", sorted(set(rowwise.chunk_sizes().values())))


if __name__ == "__main__":
    main()
