"""Archer cached step vs full step, at G = 256 and growing prompt length (run on demand).

A LLaDA-shaped random model sized for the CPU (d_model 1024, 8 layers, head size 128, SwiGLU
3x) with the vocabulary scaled so the LM head's share of the per-token cost matches
LLaDA-8B's (~7%). Prints, measured in this one run, the full-step and cached-step times, the
measured speedup and the ideal 1 + P/G. On CUDA the same script runs in bf16 with synchronized
timing: ``python benchmarks/bench_archer_step.py --device cuda`` (``--compile cuda_graphs``: the
cached step replayed as a CUDA graph, dlmpipe/graphs.py; the real-shaped table with roofline
floors is part 5 of ``make device-check``).

Target (issue 3): measured speedup at least 75% of the ideal at P = 2048.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from dlmpipe.backbones.model import Backbone, BackboneConfig
from dlmpipe.methods import build_cache


def build(d_model: int, n_layers: int, vocab: int, dtype: torch.dtype, device: str) -> Backbone:
    cfg = BackboneConfig(family="llada", d_model=d_model, n_layers=n_layers, n_heads=d_model // 128,
                         n_kv_heads=d_model // 128, mlp_hidden=3 * d_model, vocab_size=vocab,
                         rope_theta=500000.0, norm_eps=1e-5, qkv_bias=False, mask_id=vocab - 1)
    with torch.device(device):
        model = Backbone(cfg)
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.02)
    return model.to(dtype).eval().requires_grad_(False)


def timed(fn, device: str, reps: int) -> float:
    """Median synchronized seconds of ``fn()`` over ``reps`` runs after one warm-up."""
    fn()
    samples = []
    for _ in range(reps):
        if device == "cuda":
            torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--gen", type=int, default=256)
    ap.add_argument("--prompts", default="128,256,512,1024,2048")
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch's default)")
    ap.add_argument("--compile", default="none", choices=["none", "cuda_graphs", "torch_compile"],
                    help="how the cached step runs (dlmpipe/graphs.py)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    dtype = torch.bfloat16 if a.device == "cuda" else torch.float32
    model = build(a.d_model, a.layers, a.vocab, dtype, a.device)
    G = a.gen
    print(f"device={a.device} dtype={dtype} d_model={a.d_model} layers={a.layers} "
          f"head_dim=128 vocab={a.vocab} G={G} threads={torch.get_num_threads()} compile={a.compile}")
    print(f"{'P':>6} {'full ms':>9} {'cached ms':>10} {'speedup':>8} {'ideal':>7} {'of ideal':>9}")
    for P in (int(p) for p in a.prompts.split(",")):
        x = torch.randint(0, a.vocab - 1, (P + G,), device=a.device)
        x[P + G // 2:] = a.vocab - 1
        full = build_cache({"name": "none"}, model)
        full.begin(x, P)
        archer = build_cache({"name": "archer", "K": "inf"}, model)
        archer.use_compile(a.compile)
        archer.begin(x, P)
        archer.response_logits(x, (0, G))  # builds the prompt K/V
        t_full = timed(lambda: full.response_logits(x, (0, G)), a.device, a.reps)
        t_cached = timed(lambda: archer.response_logits(x, (0, G)), a.device, a.reps)
        speedup, ideal = t_full / t_cached, 1 + P / G
        print(f"{P:>6} {1e3 * t_full:>9.1f} {1e3 * t_cached:>10.1f} {speedup:>7.2f}x {ideal:>6.2f}x "
              f"{100 * speedup / ideal:>8.0f}%", flush=True)


if __name__ == "__main__":
    main()
