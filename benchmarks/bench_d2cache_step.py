"""d2Cache's step vs a full recompute step, with its rollout and selection overhead shown
separately (run on demand; docs/METHODS.md §2.7).

A LLaDA-shaped random model (``bench_archer_step.build``; CPU defaults small enough for a run
under a minute: d_model 512, 4 layers, P = 512, G = 128) on a state whose second half of the
response is masked. Every time is the median of synchronized repetitions in this one run, each
ratio the median of per-repetition ratios measured alternately with the full step:
- full step: one bidirectional forward over all N = P + G rows (full recompute);
- d2Cache full forward: the same forward with every layer's K/V stored and the attention
  rollout accumulated (its first step; the rollout's N x N products are the overhead);
- d2Cache cached step per ``current_k``: the rows the selection gives queries to (certainty
  prior, rollout nucleus ``rollout_p``, the block's masks) over the cached K/V, with the
  rollout of those rows and the next selection; next to it the same rows through the plain
  row-cache forward (no attention maps, no selection), so the difference is d2Cache's own cost,
  and ``rows/N``, the ideal fraction.
``python benchmarks/bench_d2cache_step.py [--device cuda]`` (bf16 with synchronized timing on CUDA).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_archer_step import build  # noqa: E402
from bench_spa_step import interleaved  # noqa: E402

from dlmpipe.engine.row_cache import indices  # noqa: E402
from dlmpipe.methods import build_cache  # noqa: E402


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--current-k", default="8,32,64")
    ap.add_argument("--rollout-p", type=float, default=0.1)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = build(a.d_model, a.layers, a.vocab, dtype, a.device)
    P, G = a.prompt, a.gen
    N = P + G
    x = torch.randint(0, a.vocab - 1, (N,), device=a.device)
    x[P + G // 2:] = a.vocab - 1
    block = (G // 2, G // 2 + a.block)  # the block being decoded: the first masked one
    print(f"device={a.device} dtype={dtype} d_model={a.d_model} layers={a.layers} head_dim=128 "
          f"vocab={a.vocab} P={P} G={G} block={a.block} rollout_p={a.rollout_p} "
          f"threads={torch.get_num_threads()}")

    full = build_cache({"name": "none"}, model)
    full.begin(x, P)
    step_full = lambda: full.response_logits(x, block)  # noqa: E731

    first = build_cache({"name": "d2cache", "rollout_p": a.rollout_p}, model)
    first.begin(x, P)
    t_full, t_first, r_first = interleaved(step_full, lambda: first._forward(x, None), a.device, a.reps)
    print(f"full step {1e3 * t_full:.1f} ms; d2Cache full forward (K/V stored, rollout) "
          f"{1e3 * t_first:.1f} ms ({r_first:.3f} of full)")

    print(f"\n{'current_k':>9} {'rows':>6} {'rows/N':>7} {'d2 ms':>8} {'of full':>8} {'speedup':>8} "
          f"{'rows-only ms':>12} {'of full':>8}")
    for k in map(int, a.current_k.split(",")):
        cache = build_cache({"name": "d2cache", "rollout_p": a.rollout_p, "current_k": k}, model)
        cache.begin(x, P)
        cache.response_logits(x, block)  # the full first forward
        cache.response_logits(x, block)  # one cached step: the steady selection
        q = cache.select(x, x[P:] == model.cfg.mask_id, block)
        rows, serve = indices(q, q[P:])
        step = lambda: cache.response_logits(x, block)  # noqa: E731
        _, t_d2, ratio = interleaved(step_full, step, a.device, a.reps)
        plain = lambda: cache._forward_rows(x, rows, serve)  # noqa: E731
        _, t_rows, ratio_rows = interleaved(step_full, plain, a.device, a.reps)
        print(f"{k:>9} {rows.numel():>6} {rows.numel() / N:>7.3f} {1e3 * t_d2:>8.1f} {ratio:>8.3f} "
              f"{1 / ratio:>8.2f} {1e3 * t_rows:>12.1f} {ratio_rows:>8.3f}", flush=True)
    print("(d2 ms: the cached step with its selection and rollout; rows-only: the same rows "
          "through the plain row-cache forward)")


if __name__ == "__main__":
    main()
