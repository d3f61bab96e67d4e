"""Generate-job wall time of the same samples at batch sizes 1, 4, 16 (dlmpipe/batching.py).

Per method family (full recompute, Archer, Fast-dLLM, dKV-Cache, SPA-Cache, dLLM-Cache, d2Cache,
Saber, ...) the same samples are decoded as a generate job decodes them: one after another at
batch 1 (``decode``), and together at each larger batch size (``decode_batched``, continuous
batching). The sizes are measured side by side, interleaved per repeat (rotated order), in one
run; the report gives the median wall time per (method, batch size), the ratio to batch 1, the
throughput, and the fraction of samples whose tokens equal batch 1's (1.0 in float32 on the
CPU: batch invariance; on bf16 GPUs the fraction shows how far batching moves tokens).

Each method also gets its **compute floor**: the floating-point operations of its batch-1 job
(counted by torch's FlopCounterMode: projections, attention, logits) at the peak rate of one
large matrix product measured in the same run, as a share of the batch-1 wall time. Batching
can only remove time spent off the arithmetic (host work, small-GEMM inefficiency), so no batch
size can bring a method's wall-time ratio below its floor: where batch 1 already runs near the
peak (the toy on one CPU core), the floor says how much batching can buy at all.

    python benchmarks/bench_batching.py [--checkpoint DIR] [--sizes 1 4 16] [--samples 16]
    python benchmarks/bench_batching.py --shape llada-8b        # CUDA, random bf16 weights

``--shape toy`` (default): the toy checkpoint (``--checkpoint``, else the shipped toy the
default campaign decodes, dlmpipe/shipped/toy), the default campaign's methods (config.yaml,
bound for the toy) on toy_code prompts, one thread. ``--shape llada-8b``: LLaDA-8B shapes with
random bf16 weights (benchmarks/bench_backbone_forward.py), random prompts of 64..256 tokens,
G = 64 in blocks of 32, one method per family (SPA-Cache with the value identifier: the
singular proxies would need an SVD of random weights, which times nothing of interest).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from dlmpipe.batching import Sample, decode_batched, slot_models  # noqa: E402
from dlmpipe.decode import _sync, decode  # noqa: E402
from dlmpipe.methods import build_method  # noqa: E402

BLOCKS = {"name": "llada_confidence", "block_length": 32, "steps": 32}
#: --shape llada-8b: one method per family (G = 64, blocks of 32)
LLADA_METHODS = [
    {"name": "full", "sampler": BLOCKS, "cache": {"name": "none"}},
    {"name": "archer-k8", "sampler": BLOCKS, "cache": {"name": "archer", "K": 8}},
    {"name": "fast-dllm-dual", "sampler": BLOCKS, "cache": {"name": "fast_dllm_dual"}},
    {"name": "dkv-decode", "sampler": BLOCKS, "cache": {"name": "dkv_decode"}},
    {"name": "spa-value", "sampler": BLOCKS, "cache": {"name": "spa", "identifier": "value"}},
    {"name": "dllm-cache", "sampler": BLOCKS, "cache": {"name": "dllm_cache"}},
    {"name": "d2cache", "sampler": BLOCKS, "cache": {"name": "d2cache", "current_k": 32}},
    {"name": "saber-archer", "sampler": {"name": "saber", "block_length": 32},
     "cache": {"name": "archer", "K": 8}},
]
CACHED = {"archer-k8", "fast-dllm-dual", "dkv-decode", "spa-value", "dllm-cache", "d2cache", "saber-archer"}


def toy_setup(checkpoint: str | None, n: int):
    """The toy model, the default campaign's methods bound for it, toy_code prompts."""
    import yaml

    from dlmpipe.backbones.loading import load_backbone
    from dlmpipe.campaign import Campaign
    from dlmpipe.generate import encode_prompt
    from dlmpipe.tasks import load_task

    if checkpoint is None and (REPO / "dlmpipe" / "shipped" / "toy").is_dir():
        checkpoint = str(REPO / "dlmpipe" / "shipped" / "toy")  # the default campaign's toy
    if checkpoint is None:
        from tests.models import toy_checkpoint_dir
        checkpoint = str(toy_checkpoint_dir(Path(tempfile.mkdtemp()), steps=40))
    config = yaml.safe_load((REPO / "config.yaml").read_text())
    camp = Campaign(config, check_paths=False)
    methods = [dict(camp.methods[m], gen_length=32) for m in camp.methods]
    loaded = load_backbone(checkpoint, device="cpu")
    rows = load_task("toy_code", n=n, seed=1000)
    prompts = [torch.tensor(encode_prompt(loaded, r, chat=False)) for r in rows]
    return loaded.model, methods, prompts, 32


def llada_setup(device: torch.device, n: int, scaled: bool = False):
    """LLaDA-8B shapes in bf16 (``scaled``: the CPU stand-in's shapes in float32, to check the
    script on a CPU; its numbers say nothing about a GPU)."""
    from bench_backbone_forward import REAL, SCALED, build

    from dlmpipe.backbones.model import BackboneConfig

    cfg = REAL["llada-8b"]
    if scaled:
        cfg = BackboneConfig(**(cfg.to_dict() | SCALED["llada-8b"] | {"mask_id": 8191}))
    model = build(cfg, device, torch.float32 if scaled else torch.bfloat16)
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(64, 257, (n,), generator=g).tolist()
    prompts = [torch.randint(0, cfg.mask_id, (p,), generator=g) for p in lengths]
    return model, [dict(m, gen_length=64) for m in LLADA_METHODS], prompts, 64


def job_time(model, method: dict, prompts, gen_len: int, batch: int, artifacts=None):
    """Wall time of decoding every prompt at ``batch`` (1: one after another), and the tokens."""
    device = model.device
    out = {}
    if batch == 1:
        sampler, cache = build_method(method, model, artifacts)
        _sync(device)
        start = time.perf_counter()
        for i, p in enumerate(prompts):
            out[i] = decode(model, sampler, cache, p, gen_len, torch.Generator().manual_seed(i)).response
    else:
        slots = [build_method(method, s, artifacts) for s in slot_models(model, batch)]
        samples = [Sample(i, p, gen_len, torch.Generator().manual_seed(i)) for i, p in enumerate(prompts)]
        _sync(device)
        start = time.perf_counter()
        decode_batched(model, slots, samples, lambda s, r: out.__setitem__(s.key, r.response))
    _sync(device)
    return time.perf_counter() - start, [out[i] for i in range(len(prompts))]


def gemm_peak(device: torch.device, dtype: torch.dtype, size: int = 1024) -> float:
    """FLOP/s of one large square matrix product on ``device`` (median of 5): the arithmetic
    peak the compute floors are measured against."""
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    times = []
    for _ in range(5):
        _sync(device)
        start = time.perf_counter()
        for _ in range(4):
            a @ b
        _sync(device)
        times.append((time.perf_counter() - start) / 4)
    return 2 * size ** 3 / statistics.median(times)


#: the SDPA kernels a decode may dispatch to (those of them this torch has), counted by sdpa_flops
SDPA_KERNELS = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
                "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")


def sdpa_flops(q, k, v, *args, out_shape=None, **kwargs) -> int:
    """Operations of one SDPA call from its q, k, v shapes ``[B, H, T, hd]``: QK^T and the
    weighted sum of V per query head, K/V heads shared by their query group (GQA: Dream's 28
    query heads over 4 K/V heads). Counted here, not by torch's formula, whose shape rule depends
    on the version (torch 2.11 refuses fewer K/V heads than query heads, 2.13 accepts them)."""
    b, h, s_q, d = q
    s_k, d_v = k[-2], v[-1]
    return 2 * b * h * s_q * s_k * (d + d_v)


def job_flops(model, method: dict, prompts, gen_len: int, artifacts=None) -> int:
    """Floating-point operations of the batch-1 job (FlopCounterMode: matrix products and
    attention, the work batching shares out; elementwise work and rowwise.py's padding are left
    out, so the floor is a lower bound). SDPA by ``sdpa_flops`` on every device (the CPU's kernel
    has no formula in torch's table)."""
    from torch.utils.flop_counter import FlopCounterMode

    from dlmpipe.backbones import rowwise

    sampler, cache = build_method(method, model, artifacts)
    sdpa = {getattr(torch.ops.aten, k): sdpa_flops for k in SDPA_KERNELS if hasattr(torch.ops.aten, k)}
    # counted with the plain ops: the padded rows of rowwise.py's fixed-shape calls are
    # overhead on top of the method's arithmetic, not part of its floor
    with FlopCounterMode(display=False, custom_mapping=sdpa) as counter, rowwise.plain_ops():
        for i, p in enumerate(prompts):
            decode(model, sampler, cache, p, gen_len, torch.Generator().manual_seed(i))
    return counter.get_total_flops()


def run(model, methods, prompts, gen_len, sizes, repeats, say=print, deadline=None,
        floors: bool = True, peak_size: int = 1024) -> dict:
    """Every (method, size) timed ``repeats`` times, interleaved; returns per method the median
    wall time per size, the ratio to the smallest size, throughput and identical fractions
    (with ``floors``, the compute floor against one ``peak_size``^3 matrix product's rate)."""
    artifacts = {}
    if any(m["cache"]["name"] == "spa" and m["cache"].get("identifier", "singular") == "singular"
           for m in methods):
        from dlmpipe.engine.proxies import proxies_from_model
        artifacts["proxies"] = proxies_from_model(model)
    if floors:
        peak = gemm_peak(model.device, next(model.parameters()).dtype, peak_size)
        say(f"  arithmetic peak (one {peak_size}^3 matrix product): {peak / 1e9:.1f} GFLOP/s")
    results = {}
    for m in methods:
        if deadline is not None and time.monotonic() > deadline:
            say(f"  {m['name']}: skipped (time budget)")
            continue
        job_time(model, m, prompts[:2], gen_len, 1, artifacts)  # warm-up
        job_time(model, m, prompts[:2], gen_len, max(sizes), artifacts)
        times = {b: [] for b in sizes}
        tokens = {}
        for r in range(repeats):
            order = sizes[r % len(sizes):] + sizes[:r % len(sizes)]
            for b in order:
                t, toks = job_time(model, m, prompts, gen_len, b, artifacts)
                times[b].append(t)
                tokens[b] = toks
        base = sizes[0]
        med = {b: statistics.median(ts) for b, ts in times.items()}
        same = {b: sum(torch.equal(x, y) for x, y in zip(tokens[b], tokens[base])) / len(prompts)
                for b in sizes}
        n_tok = len(prompts) * gen_len
        results[m["name"]] = {"wall_s": med, "ratio": {b: med[b] / med[base] for b in sizes},
                              "tokens_per_s": {b: n_tok / med[b] for b in sizes},
                              "identical": same}
        say(f"  {m['name']:28s} " + "  ".join(
            f"B={b}: {med[b]:7.3f} s ({med[b] / med[base]:.3f}x time, {n_tok / med[b]:8.1f} tok/s, "
            f"{same[b]:.0%} same)" for b in sizes))
        if floors:
            flops = job_flops(model, m, prompts, gen_len, artifacts)
            floor = flops / peak / med[base]
            results[m["name"]] |= {"gflop": flops / 1e9, "batch1_gflops": flops / med[base] / 1e9,
                                   "compute_floor": floor}
            say(f"  {'':28s} {flops / 1e9:7.2f} GFLOP; B=1 runs them at "
                f"{flops / med[base] / 1e9:6.1f} GFLOP/s: compute floor {floor:.3f}x time")
    return results


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="toy", choices=["toy", "llada-8b"])
    ap.add_argument("--checkpoint", default=None, help="toy checkpoint directory (--shape toy)")
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--methods", nargs="*", default=None, help="only these method names")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--scaled", action="store_true", help="--shape llada-8b at the CPU stand-in's "
                    "shapes in float32 on the CPU (a check that the script runs)")
    a = ap.parse_args()
    torch.manual_seed(0)
    if a.shape == "toy":
        torch.set_num_threads(1)
        model, methods, prompts, gen_len = toy_setup(a.checkpoint, a.samples)
    else:
        model, methods, prompts, gen_len = llada_setup(torch.device("cpu" if a.scaled else "cuda"),
                                                       a.samples, a.scaled)
    if a.methods:
        methods = [m for m in methods if m["name"] in a.methods]
    print(f"{a.shape}: {len(prompts)} samples, G = {gen_len}, batch sizes {a.sizes}, "
          f"{a.repeats} interleaved repeats; times are whole-job wall times")
    with torch.inference_mode():
        results = run(model, methods, prompts, gen_len, sorted(a.sizes), a.repeats)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
