"""Full-forward and prompt-cached-step time of real-shaped, randomly initialized backbones.

No weights are needed: LLaDA-8B and Dream-7B are built at their real shapes (docs/MODELS.md) directly
on the device in bf16 and filled with random values, which is all timing needs. On CUDA this is
the check behind the papers' prompt-length table (Archer: cached step vs full step at G=256,
P=128..2048); on a CPU-only machine the same script picks a scaled-down shape automatically.

Columns: ``full`` = one bidirectional forward over all N = P + G rows with logits for every row
(what LLaDA-Confidence / Saber pay per step); ``cached`` = one Archer cached step (only the
response rows through every layer, over cached prompt K/V; the engine's own ``ArcherCache``);
``ideal`` = 1 + P/G, the cached-step ceiling. Times are medians of synchronized wall time.

    python benchmarks/bench_backbone_forward.py [--device cuda] [--models llada-8b dream-7b]
        [--prompt-lens 128 256 512 1024 2048] [--gen-len 256] [--repeats 10]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from dlmpipe.backbones.model import Backbone, BackboneConfig

REAL = {
    "llada-8b": BackboneConfig(family="llada", d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                               mlp_hidden=12288, vocab_size=126464, rope_theta=500000.0, norm_eps=1e-5,
                               qkv_bias=False, mask_id=126336, stop_ids=[126081], pad_id=126081),
    "dream-7b": BackboneConfig(family="dream", d_model=3584, n_layers=28, n_heads=28, n_kv_heads=4,
                               mlp_hidden=18944, vocab_size=152064, rope_theta=1e6, norm_eps=1e-6,
                               qkv_bias=True, mask_id=151666, stop_ids=[151643], pad_id=151643,
                               logit_shift=True),
}
# CPU stand-ins: same families and head layout (GQA 7:1 kept for Dream), ~1/8 width, 4 layers.
SCALED = {
    "llada-8b": dict(d_model=512, n_layers=4, n_heads=4, n_kv_heads=4, mlp_hidden=1536, vocab_size=8192),
    "dream-7b": dict(d_model=448, n_layers=4, n_heads=7, n_kv_heads=1, mlp_hidden=2368, vocab_size=8192),
}


def build(cfg: BackboneConfig, device: torch.device, dtype: torch.dtype) -> Backbone:
    """Allocate once on the device in the target dtype (meta -> to_empty), then fill randomly."""
    with torch.device("meta"):
        model = Backbone(cfg).to(dtype)
    model = model.to_empty(device=device)
    g = torch.Generator(device=device).manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            else:
                p.normal_(0.0, 0.02, generator=g)
    return model.eval().requires_grad_(False)


def timed(fn, device: torch.device, repeats: int, warmup: int = 2) -> float:
    """Median seconds of ``fn()`` with the device synchronized before and after each call."""
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def cached_step_fn(model: Backbone, x: torch.Tensor, prompt_len: int):
    """One Archer cached step, primed by a full forward; None if the engine is not available."""
    try:
        from dlmpipe.methods import build_cache
    except ImportError:
        return None
    cache = build_cache({"name": "archer", "K": "inf"}, model)
    cache.begin(x, prompt_len)
    block = (0, x.shape[0] - prompt_len)
    cache.response_logits(x, block)  # full forward: builds the prompt K/V
    return lambda: cache.response_logits(x, block)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto")
    ap.add_argument("--models", nargs="+", default=list(REAL), choices=list(REAL))
    ap.add_argument("--prompt-lens", nargs="+", type=int)
    ap.add_argument("--gen-len", type=int, default=256)
    ap.add_argument("--repeats", type=int)
    ap.add_argument("--dtype", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--scaled", action="store_true", help="use the CPU stand-in shapes on any device")
    args = ap.parse_args()
    device = torch.device(("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device)
    on_gpu = device.type == "cuda"
    scaled = args.scaled or not on_gpu
    dtype = getattr(torch, args.dtype or ("bfloat16" if on_gpu else "float32"))
    prompt_lens = args.prompt_lens or ([128, 256, 512, 1024, 2048] if not scaled else [128, 512])
    repeats = args.repeats or (10 if on_gpu else 3)
    G = args.gen_len
    name = torch.cuda.get_device_name(device) if on_gpu else f"cpu ({torch.get_num_threads()} threads)"
    print(f"device: {name}; dtype: {str(dtype).removeprefix('torch.')}; "
          f"shapes: {'scaled-down CPU stand-ins' if scaled else 'real'}; G={G}; batch 1; medians of {repeats}")
    print(f"{'model':>10} {'params':>7} {'P':>5} {'N':>5} {'full ms':>9} {'cached ms':>10} "
          f"{'speedup':>8} {'ideal':>6} {'tok/s full':>11}")
    for key in args.models:
        cfg = REAL[key]
        if scaled:
            cfg = BackboneConfig(**(cfg.to_dict() | SCALED[key] | {"mask_id": SCALED[key]["vocab_size"] - 1,
                                                                  "stop_ids": [0], "pad_id": 0}))
        model = build(cfg, device, dtype)
        n_params = sum(p.numel() for p in model.parameters())
        for P in prompt_lens:
            x = torch.randint(0, cfg.vocab_size, (P + G,), device=device)
            with torch.inference_mode():
                full = timed(lambda: model(x[None]), device, repeats)
                step = cached_step_fn(model, x, P)
                cached = timed(step, device, repeats) if step else float("nan")
            print(f"{key:>10} {n_params / 1e9:6.2f}B {P:5d} {P + G:5d} {full * 1e3:9.1f} {cached * 1e3:10.1f} "
                  f"{full / cached:7.2f}x {1 + P / G:5.2f}x {(P + G) / full:11.0f}", flush=True)
        del model
        if on_gpu:
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
