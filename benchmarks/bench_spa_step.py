"""SPA-Cache sparse step vs full step across budgets, with the proxy overhead shown separately
(run on demand).

The CPU-sized LLaDA-shaped random model of ``bench_archer_step.py`` (d_model 1024, 8 layers,
head size 128, vocab 8192) at P = 1024, G = 256. Every time is the median of synchronized
repetitions in this one run:
- full step: one bidirectional forward over all N = P + G rows (full recompute);
- dense response step: every response row recomputed over the cached prompt K/V (SPA's
  response refresh; Archer's cached step);
- sparse step at uniform budget rho: layer 0 dense, layers >= 1 recompute int(rho * G) rows;
  with kv_update sparse (the paper's) and dense (the public code's); its cost relative to the
  full step (the target's reference) and to the dense response step (layer 0 and the LM head
  over all G rows are a floor of about 1/L + the head's share there);
- proxy overhead: the identification alone (attention-input norm, rank-r singular proxy,
  cosine similarity, top-k) over the L - 1 selective layers, next to the full-width value
  identifier (dLLM-Cache's) for comparison.

Target (issue 4): a sparse step at budget rho costs at most rho + 0.15 of a full step.
``python benchmarks/bench_spa_step.py [--device cuda]`` (bf16 with synchronized timing on CUDA).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_archer_step import build  # noqa: E402

from dlmpipe.engine.proxies import proxies_from_model  # noqa: E402
from dlmpipe.engine.spa import SPACache, layer_budgets  # noqa: E402
from dlmpipe.methods import build_cache  # noqa: E402


def once(fn, device: str) -> float:
    if device == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    fn()
    if device == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t


def interleaved(reference, candidate, device: str, reps: int) -> tuple[float, float, float]:
    """Median times of both and the median of per-repetition ratios candidate / reference,
    measured alternately (after one warm-up each) so that a busy machine's load drifts cancel."""
    reference(), candidate()
    pairs = [(once(reference, device), once(candidate, device)) for _ in range(reps)]
    return (statistics.median(a for a, _ in pairs), statistics.median(b for _, b in pairs),
            statistics.median(b / a for a, b in pairs))


def sparse_cache(model, x, P, proxies, rank, **budget) -> SPACache:
    cache = build_cache({"name": "spa", "rank": rank, "refresh_steps": None, "refresh_gen_steps": None,
                         **budget}, model, artifacts={"proxies": proxies})
    cache.begin(x, P)
    cache.response_logits(x, (0, x.shape[0] - P))  # step 0: the full refresh that fills the caches
    return cache


def identification(model, h: torch.Tensor, weights: list[torch.Tensor], cached: list[torch.Tensor], k: int):
    """The selective layers' identification work on response rows ``h [1, G, d]``."""
    for i in range(1, model.cfg.n_layers):
        normed = model.blocks[i].attn_norm(h)
        ident = normed[0] @ weights[i].T
        sim = F.cosine_similarity(ident.float(), cached[i].float(), dim=-1)
        cached[i].copy_(ident)
        torch.topk(sim, k, largest=False, sorted=False).indices.sort()


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--budgets", default="0.05,0.1,0.2,0.3,0.5")
    ap.add_argument("--rank", type=int, default=128)
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    torch.manual_seed(0)
    model = build(a.d_model, a.layers, a.vocab, dtype, a.device)
    P, G = a.prompt, a.gen
    x = torch.randint(0, a.vocab - 1, (P + G,), device=a.device)
    x[P + G // 2:] = a.vocab - 1
    proxies = proxies_from_model(model)
    print(f"device={a.device} dtype={dtype} d_model={a.d_model} layers={a.layers} head_dim=128 "
          f"vocab={a.vocab} P={P} G={G} rank={a.rank} threads={torch.get_num_threads()}")

    full = build_cache({"name": "none"}, model)
    full.begin(x, P)
    step_full = lambda: full.response_logits(x, (0, G))  # noqa: E731
    dense = sparse_cache(model, x, P, proxies, a.rank, budget="uniform", rho=1.0)
    t_full, t_dense, r_dense = interleaved(step_full, lambda: dense.response_logits(x, (0, G)),
                                           a.device, a.reps)
    print(f"full step {1e3 * t_full:.1f} ms; dense response step {1e3 * t_dense:.1f} ms "
          f"({r_dense:.3f} of full; G/N = {G / (P + G):.3f})")

    # identification alone: singular proxy (rank r) vs full-width value vectors
    h = torch.randn(1, G, a.d_model, device=a.device, dtype=dtype)
    sing = [proxies.projection(i, a.rank).to(device=a.device, dtype=dtype) for i in range(a.layers)]
    val = [blk.v_proj.weight for blk in model.blocks]
    k = int(0.25 * G)
    cache_s = [torch.zeros(G, a.rank, device=a.device, dtype=dtype) for _ in range(a.layers)]
    cache_v = [torch.zeros(G, w.shape[0], device=a.device, dtype=dtype) for w in val]
    _, t_sing, r_sing = interleaved(step_full, lambda: identification(model, h, sing, cache_s, k),
                                    a.device, a.reps)
    _, t_val, r_val = interleaved(step_full, lambda: identification(model, h, val, cache_v, k),
                                  a.device, a.reps)
    print(f"proxy overhead per step ({a.layers - 1} selective layers): singular r={a.rank} "
          f"{1e3 * t_sing:.2f} ms ({r_sing:.4f} of full); value d={val[0].shape[0]} "
          f"{1e3 * t_val:.2f} ms ({r_val:.4f} of full)")

    print(f"\n{'budget':>12} {'rows':>8} {'sparse ms':>10} {'of full':>8} {'target':>7} {'ok':>3} "
          f"{'of dense resp':>13} {'kv dense ms':>12} {'of full':>8}")
    rows = [(f"{rho:g}", dict(budget="uniform", rho=rho)) for rho in map(float, a.budgets.split(","))]
    rho_l = layer_budgets(a.layers, "llada-8b-instruct")
    mean_adaptive = (1 + sum(rho_l[1:])) / a.layers  # layer 0 dense
    rows.append(("adaptive", dict(budget="adaptive")))
    for label, budget in rows:
        cache = sparse_cache(model, x, P, proxies, a.rank, **budget)
        _, t_sparse, ratio = interleaved(step_full, lambda: cache.response_logits(x, (0, G)),
                                         a.device, a.reps)
        cache_d = sparse_cache(model, x, P, proxies, a.rank, kv_update="dense", **budget)
        _, t_kvd, ratio_d = interleaved(step_full, lambda: cache_d.response_logits(x, (0, G)),
                                        a.device, a.reps)
        rho = budget.get("rho", sum(rho_l[1:]) / (a.layers - 1))
        target = rho + 0.15
        rows_text = "/".join(map(str, sorted(set(cache.budgets[1:]))))
        print(f"{label:>12} {rows_text:>8} {1e3 * t_sparse:>10.1f} {ratio:>8.3f} {target:>7.3f} "
              f"{'yes' if ratio <= target else 'NO':>3} {ratio / r_dense:>13.3f} {1e3 * t_kvd:>12.1f} "
              f"{ratio_d:>8.3f}", flush=True)
    print(f"(adaptive: rho(l) = {', '.join(f'{r:.3f}' for r in rho_l)}; layers >= 1 mean "
          f"{sum(rho_l[1:]) / (a.layers - 1):.3f}, the target uses it; with dense layer 0 the mean "
          f"recomputed fraction is {mean_adaptive:.3f})")


if __name__ == "__main__":
    main()
