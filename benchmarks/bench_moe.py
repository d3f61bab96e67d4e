"""The routed MoE FFN (dlmpipe/backbones/moe.py) against its floor, a dense SwiGLU with the same
active parameters (run on demand).

Shapes: LLaDA-MoE-7B-A1B (64 experts, top-8, no shared expert, router ``softmax_biased``) and
LLaDA2.0-mini (256 experts, top-8, one shared expert, 8 groups of which 4 kept, router
``sigmoid_grouped``), widths narrowed by ``--narrow`` (default 4: d_model 2048 -> 512, expert
widths 1024 / 512 -> 256 / 128). The floor is one SwiGLU of width top_k x expert width (+ the
shared expert's), i.e. the same multiply-adds per row. At 32, 128, 512 and 2048 rows the two are
timed interleaved (MoE, dense, MoE, dense, ...; median of ``--reps``) in one run, single-threaded
on the CPU (``--threads``), and printed side by side with their ratio. To show where the MoE time
goes: the router alone, the mean rows an active expert receives and the measured time of one
expert call at that many rows; ``overhead`` is what remains of the MoE time after the router and
the active experts' calls (sorting, gathers, scatters, the weighted sum).

Goal (issue 33): within 2x of the floor at 2048 rows on the CPU. ``--device cuda`` times the same
on a GPU (synchronized).
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from dlmpipe.backbones.model import BackboneConfig
from dlmpipe.backbones.moe import Expert, MoEFFN

#: (name, d_model, experts, top_k, expert width, shared width, router, groups, kept groups)
SHAPES = [("LLaDA-MoE-7B-A1B", 2048, 64, 8, 1024, 0, "softmax_biased", 1, 1),
          ("LLaDA2.0-mini", 2048, 256, 8, 512, 512, "sigmoid_grouped", 8, 4)]


def build(shape, narrow: int, device: str, dtype: torch.dtype):
    name, d, e, k, width, shared, router, groups, kept = shape
    d, width, shared = d // narrow, width // narrow, shared // narrow
    cfg = BackboneConfig(family="bench", d_model=d, n_layers=1, n_heads=4, n_kv_heads=4, mlp_hidden=1,
                         vocab_size=8, rope_theta=1e4, norm_eps=1e-6, qkv_bias=False, mask_id=0,
                         n_experts=e, experts_per_token=k, expert_hidden=width,
                         shared_expert_hidden=shared, router=router, router_bias=True,
                         n_group=groups, topk_group=kept, routed_scaling=2.5 if groups > 1 else 1.0)
    g = torch.Generator().manual_seed(0)
    with torch.device(device):
        moe = MoEFFN(cfg)
        dense = Expert(d, k * width + shared)
    for m in (moe, dense):
        for p in m.parameters():
            p.data.copy_((0.02 * torch.randn(p.shape, generator=g)).to(device))
    return name, cfg, moe.to(dtype).eval(), dense.to(dtype).eval()


def timed_pair(fns, device: str, reps: int) -> list[float]:
    """Median seconds of each of ``fns``, run interleaved ``reps`` times after one warm-up each."""
    for fn in fns:
        fn()
    samples = [[] for _ in fns]
    for _ in range(reps):
        for i, fn in enumerate(fns):
            if device == "cuda":
                torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            if device == "cuda":
                torch.cuda.synchronize()
            samples[i].append(time.perf_counter() - t)
    return [statistics.median(s) for s in samples]


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rows", default="32,128,512,2048")
    ap.add_argument("--narrow", type=int, default=4)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--dtype", default=None, help="default: float32 on the CPU, bfloat16 on CUDA")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.float32 if args.device == "cpu" else torch.bfloat16)
    print(f"device {args.device}, {args.threads} thread(s), {dtype}, widths / {args.narrow}, "
          f"median of {args.reps} interleaved repeats")
    print(f"{'model':<18}{'rows':>6}{'moe ms':>9}{'dense ms':>10}{'ratio':>7}{'router':>8}"
          f"{'active':>7}{'rows/exp':>9}{'call ms':>8}{'calls ms':>9}{'overhead':>9}")
    for shape in SHAPES:
        name, cfg, moe, dense = build(shape, args.narrow, args.device, dtype)
        for rows in map(int, args.rows.split(",")):
            x = torch.randn(rows, cfg.d_model, generator=torch.Generator().manual_seed(rows)).to(args.device, dtype)
            t_moe, t_dense = timed_pair([lambda: moe(x), lambda: dense(x)], args.device, args.reps)
            idx, _ = moe.route(x)
            counts = torch.bincount(idx.reshape(-1), minlength=cfg.n_experts)
            active = int((counts > 0).sum())
            per = max(1, round(rows * cfg.experts_per_token / active))
            xe = x[:per]
            if per > rows:
                xe = x.repeat(-(-per // rows), 1)[:per]
            t_route, t_call = timed_pair([lambda: moe.route(x), lambda: moe.experts[0](xe)], args.device, args.reps)
            t_shared = timed_pair([lambda: moe.shared(x)], args.device, args.reps)[0] if cfg.shared_expert_hidden else 0.0
            calls = active * t_call + t_shared
            print(f"{name:<18}{rows:>6}{1e3 * t_moe:>9.2f}{1e3 * t_dense:>10.2f}{t_moe / t_dense:>7.2f}"
                  f"{1e3 * t_route:>8.2f}{active:>7}{per:>9}{1e3 * t_call:>8.3f}{1e3 * calls:>9.2f}"
                  f"{1e3 * (t_moe - t_route - calls):>9.2f}")


if __name__ == "__main__":
    main()
