"""The speed and memory parts of the device check (benchmarks/device_check.py).

The papers' prompt-length table at real LLaDA-8B / Dream-7B shapes (docs/MODELS.md) with random
bf16 weights, which is all timing needs: per prompt length P (G = 256) the full step (one
bidirectional forward over N = P + G rows), Archer's cached step (the response rows over cached
prompt K/V) eager and replayed as a CUDA graph, the Fast-dLLM dual cache's step (a block of 32
rows over every other row's cached K/V), and SPA-Cache's sparse step at uniform budgets
0.05..0.5 (rank-r singular proxy; random orthonormal proxies stand in for the SVD, which only
changes which rows are chosen, not the work). Times are medians of CUDA-event intervals (on a
CPU: of wall time) after warm-ups, all in this one run; speedup = full / step; ideal: Archer's
``1 + P/G`` (rows), SPA's the rows a full step computes over the rows the sparse one does,
``L N / (G + sum_l k_l)``. Then the peak memory of the 8B-shaped model and of each cache at the
longest P, and a whole decode against the sum of its forwards (``decode_vs_forwards``). Each
row keeps its roofline (``floor_ms``: FLOPs at the measured matrix rate or weight bytes at the
measured copy bandwidth, the slower), which part 10 puts in one table. On a CPU the shapes shrink (CPU stand-ins: 2 layers, width 256, G = 32); their
numbers show the script runs, not what a GPU does.

``python benchmarks/device_speed.py compile-step`` runs part 7 alone (the subprocess the device
check bounds by the time left): torch.compile'd Archer cached step at P = 2048.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "benchmarks")]

from bench_backbone_forward import REAL, build  # noqa: E402

from dlmpipe.backbones.model import BackboneConfig  # noqa: E402

GPU_PROMPTS, GPU_G = (128, 256, 512, 1024, 2048), 256
CPU_PROMPTS, CPU_G = (32, 128), 32
CPU_SHAPE = dict(d_model=256, n_layers=2, n_heads=2, n_kv_heads=2, mlp_hidden=512, vocab_size=1024)
BUDGETS = (0.05, 0.1, 0.2, 0.3, 0.5)
RANK = {"llada-8b": 128, "dream-7b": 32}  # the papers' proxy ranks


def model_config(key: str, gpu: bool) -> BackboneConfig:
    cfg = REAL[key]
    if gpu:
        return cfg
    shape = CPU_SHAPE | ({"n_kv_heads": 1} if cfg.n_kv_heads != cfg.n_heads else {})  # keep GQA
    return BackboneConfig(**(cfg.to_dict() | shape | {"mask_id": shape["vocab_size"] - 1,
                                                      "stop_ids": [0], "pad_id": 0}))


def timer(device: torch.device, reps: int, warmup: int = 2):
    """``time(fn)``: median seconds of ``fn()``; CUDA events on a GPU (the interval between them
    includes the gaps where the GPU waits for launches: launch-bound code shows)."""
    def time_cuda(fn) -> float:
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        return statistics.median(samples)

    def time_cpu(fn) -> float:
        for _ in range(warmup):
            fn()
        samples = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - t)
        return statistics.median(samples)
    return time_cuda if device.type == "cuda" else time_cpu


def step_cost(cfg: BackboneConfig, rows: float, keys: int, G: int, size: int = 2) -> tuple[float, float]:
    """(FLOPs, weight bytes at ``size`` bytes a weight, bf16's 2 by default) of a forward of
    ``rows`` query rows over ``keys`` key rows with the LM head on G rows: every layer's
    projections, attention and FFN, then the head."""
    d, q, kv = cfg.d_model, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    per_row = d * (2 * q + 2 * kv) + 3 * d * cfg.mlp_hidden   # q, k, v, out; gate, up, down
    flops = cfg.n_layers * (2 * rows * per_row + 4 * rows * keys * q) + 2 * G * d * cfg.vocab_size
    return flops, size * (cfg.n_layers * per_row + d * cfg.vocab_size)


def measured_peaks(device: torch.device, n: int = 8192, nbytes: int = 2 ** 30,
                   dtype: torch.dtype = torch.bfloat16) -> tuple[float, float]:
    """This device's matrix rate (FLOP/s, n^3 products in ``dtype``) and copy bandwidth
    (bytes/s read + written), measured here: the roofline's ceilings."""
    time_it = timer(device, reps=5)
    a = torch.randn(n, n, device=device, dtype=dtype)
    flops = 2 * n ** 3 / time_it(lambda: a @ a)
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() / time_it(lambda: dst.copy_(src))
    return flops, bandwidth


def peaks(ck) -> tuple[float, float]:
    """(matrix FLOP/s, copy bytes/s) of the check's device in the dtype its timings use (bf16 on a
    GPU, float32 on the CPU), measured once per check (``ck.data["peaks"]``): the floors of part
    10's table (issue 48). CPU-sized: 1024^3 products and 64 MB copies."""
    if "peaks" not in ck.data:
        flops, bandwidth = (measured_peaks(ck.device) if ck.gpu else
                            measured_peaks(ck.device, 1024, 2 ** 26, torch.float32))
        ck.data["peaks"] = {"flops": flops, "copy_bytes_per_s": bandwidth,
                            "dtype": "bfloat16" if ck.gpu else "float32"}
    p = ck.data["peaks"]
    return p["flops"], p["copy_bytes_per_s"]


def roofline_s(flops: float, nbytes: float, ck) -> float:
    """The floor of work of ``flops`` that reads ``nbytes``: the slower of compute and reads."""
    peak, bandwidth = peaks(ck)
    return max(flops / peak, nbytes / bandwidth)


def random_proxies(model, rank: int):
    """Orthonormal rank-r projections in the proxies' format (timing needs only their shape)."""
    from dlmpipe.engine.proxies import SingularProxies

    g = torch.Generator().manual_seed(0)
    d = model.cfg.d_model
    bt = [torch.linalg.qr(torch.randn(d, rank, generator=g))[0].T.contiguous() for _ in model.blocks]
    s = [torch.linspace(2.0, 1.0, rank) for _ in model.blocks]
    return SingularProxies(s, bt, {"source": "random orthonormal proxies (timing)"})


def no_host_sync(ck, fn, what: str) -> None:
    """Run ``fn`` once with every synchronizing CUDA call an error."""
    if not ck.gpu:
        return
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        fn()
        ok, why = True, ""
    except RuntimeError as e:
        ok, why = False, f": {str(e).splitlines()[0]}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
    ck.check(ok, f"{what}: no host sync (torch.cuda.set_sync_debug_mode('error')){why}")


#: Fast-dLLM's block length: the dual cache's step recomputes one block
BLOCK = 32


def _steps(model, x, P: int, G: int, gpu: bool, proxies):
    """(label, cache, block, ideal, rows) for every step of the table, each cache primed by its
    full forward; ``rows``: the query rows its step computes per layer (its floor's work)."""
    from dlmpipe.methods import build_cache

    L, N = model.cfg.n_layers, P + G
    caches = [("archer", {"name": "archer", "K": "inf"}, "none")]
    if gpu:
        caches.append(("archer+graph", {"name": "archer", "K": "inf"}, "cuda_graphs"))
    caches.append(("dual", {"name": "fast_dllm_dual"}, "none"))
    caches += [(f"spa {rho:g}", {"name": "spa", "rank": proxies.stored_rank, "budget": "uniform",
                                 "rho": rho, "refresh_steps": None, "refresh_gen_steps": None}, "none")
               for rho in BUDGETS]
    for label, spec, mode in caches:
        cache = build_cache(spec, model, artifacts={"proxies": proxies})
        cache.use_compile(mode)
        cache.begin(x, P)
        block = (0, BLOCK) if spec["name"] == "fast_dllm_dual" else (0, G)
        cache.response_logits(x, block)  # the full forward that fills the cache (a block start)
        if spec["name"] == "archer":
            rows = G
        elif spec["name"] == "fast_dllm_dual":
            rows = BLOCK
        else:
            rows = sum(cache.budgets) / L
        yield label, cache, block, N / rows, rows


@torch.inference_mode()
def speed_table(ck) -> None:
    from dlmpipe.methods import build_cache

    dtype = torch.bfloat16 if ck.gpu else torch.float32
    prompts, G = (GPU_PROMPTS, GPU_G) if ck.gpu else (CPU_PROMPTS, CPU_G)
    time_it = timer(ck.device, reps=10 if ck.gpu else 3)
    ck.say(f"  {'real shapes' if ck.gpu else 'CPU stand-in shapes'}, random {str(dtype)[6:]} weights, "
           f"G = {G}, batch 1; median ms; speedup = full / step; % = speedup / ideal")
    ck.say(f"  {'model':>9} {'P':>5} {'step':>13} {'ms':>9} {'speedup':>8} {'ideal':>7} {'%':>5}")
    rows = ck.data.setdefault("table", [])
    size = 2 if ck.gpu else 4  # bytes a weight
    peak, bandwidth = peaks(ck)
    ck.say(f"  measured here: {ck.data['peaks']['dtype']} matrix products {peak / 1e12:.2f} TFLOP/s, "
           f"copies {bandwidth / 1e12:.2f} TB/s; roofline = max(FLOPs / rate, weight bytes / bandwidth)")
    for key in REAL:
        cfg = model_config(key, ck.gpu)
        model = build(cfg, ck.device, dtype)
        proxies = random_proxies(model, min(RANK[key], cfg.n_kv_heads * cfg.head_dim, cfg.d_model))
        for P in prompts:
            x = torch.randint(0, cfg.vocab_size - 1, (P + G,), device=ck.device,
                              generator=torch.Generator(ck.device).manual_seed(P))
            x[P + G // 2:] = cfg.mask_id
            full = build_cache({"name": "none"}, model)
            full.begin(x, P)
            t_full = time_it(lambda: full.response_logits(x, (0, G)))
            line = f"  {key:>9} {P:>5} {'full':>13} {1e3 * t_full:>9.2f}"
            floor = lambda r, k, head=G: roofline_s(*step_cost(cfg, r, k, head, size), ck)  # noqa: E731
            f_full, f_cached = floor(P + G, P + G), floor(G, P + G)
            if ck.gpu:  # how far each step is from its floor, and the speedup the floors allow
                line += (f"  (roofline: full >= {1e3 * f_full:.2f} ms, Archer cached >= "
                         f"{1e3 * f_cached:.2f} ms, so at most {f_full / f_cached:.2f}x at equal efficiency)")
            ck.say(line)
            for label, cache, block, ideal, step_rows in _steps(model, x, P, G, ck.gpu, proxies):
                step = lambda: cache.response_logits(x, block)  # noqa: E731
                step()  # the first cached step (captures the graph, if any)
                if P == prompts[-1] and label.startswith("archer"):
                    no_host_sync(ck, step, f"{key} {label} cached step at P = {P}")
                t = time_it(step)
                speedup = t_full / t
                rows.append({"model": key, "P": P, "step": label, "ms": 1e3 * t, "full_ms": 1e3 * t_full,
                             "speedup": speedup, "ideal": ideal, "floor_ms": 1e3 * floor(step_rows, P + G, BLOCK if label == "dual" else G),
                             "full_floor_ms": 1e3 * f_full, "full_flops": step_cost(cfg, P + G, P + G, G)[0]})
                ck.say(f"  {key:>9} {P:>5} {label:>13} {1e3 * t:>9.2f} {speedup:>7.2f}x {ideal:>6.2f}x "
                       f"{100 * speedup / ideal:>4.0f}%")
                del cache
        if key == "llada-8b":
            decode_vs_forwards(ck, model, prompts[min(2, len(prompts) - 1)], G)
            memory(ck, model, prompts[-1], G, proxies)
        del model, full
        if ck.gpu:
            torch.cuda.empty_cache()
    best = [r for r in rows if r["model"] == "llada-8b" and r["P"] == prompts[-1] and r["step"].startswith("archer")]
    if ck.gpu and best:
        top = max(best, key=lambda r: r["speedup"])
        ck.say(f"  goal: Archer cached step at P = 2048, LLaDA-8B, >= 90% of ideal: "
               f"{100 * top['speedup'] / top['ideal']:.0f}% ({top['step']}) -> "
               f"{'met' if top['speedup'] >= 0.9 * top['ideal'] else 'not met'}")


def decode_vs_forwards(ck, model, P: int, G: int) -> None:
    """A whole decode (Fast-dLLM dual cache under LLaDA's schedule, blocks of 32, 4 tokens a
    step) against the sum of its own forwards, each timed where it runs (CUDA events on a GPU):
    what the loop, the sampler and the cache's bookkeeping add between forwards (issue 48: the
    floor of a decode is its forwards)."""
    from dlmpipe.decode import Decoding
    from dlmpipe.methods import build_method

    method = {"sampler": {"name": "llada_confidence", "block_length": BLOCK, "steps": G // 4},
              "cache": {"name": "fast_dllm_dual"}}
    x = torch.randint(0, model.cfg.vocab_size - 1, (P,), device=ck.device,
                      generator=torch.Generator(ck.device).manual_seed(1))
    for attempt in range(2):  # the first one warms up
        sampler, cache = build_method(method, model)
        forward, spans = cache.response_logits, []

        def timed(seq, block):
            if ck.gpu:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                out = forward(seq, block)
                end.record()
                spans.append((start, end))
                return out
            t = time.perf_counter()
            out = forward(seq, block)
            spans.append(time.perf_counter() - t)
            return out

        cache.response_logits = timed
        if ck.gpu:
            torch.cuda.synchronize()
        t = time.perf_counter()
        run = Decoding(model, sampler, cache, x, G, torch.Generator(ck.device).manual_seed(0))
        while not run.done:
            run.step()
        if ck.gpu:
            torch.cuda.synchronize()
        total = time.perf_counter() - t
    forwards = sum(s.elapsed_time(e) / 1e3 for s, e in spans) if ck.gpu else sum(spans)
    ck.data["decode_vs_forwards"] = {"P": P, "G": G, "method": "llada_confidence + fast_dllm_dual",
                                     "steps": len(spans), "decode_ms": 1e3 * total,
                                     "forwards_ms": 1e3 * forwards}
    ck.say(f"  whole decode at P = {P}, G = {G} (llada_confidence + fast_dllm_dual, {len(spans)} steps): "
           f"{1e3 * total:.1f} ms, its forwards {1e3 * forwards:.1f} ms ({total / forwards:.2f}x)")


def held_bytes(cache) -> int:
    """Bytes of the tensors a cache keeps between steps (its buffers, each storage once)."""
    seen, total = set(), 0
    stack = list(vars(cache).values())
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            if v.untyped_storage().data_ptr() not in seen:
                seen.add(v.untyped_storage().data_ptr())
                total += v.untyped_storage().nbytes()
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
        elif type(v).__name__ == "KVBuffer":
            stack.extend(vars(v).values())
    return total


def memory(ck, model, P: int, G: int, proxies) -> None:
    """Peak memory of the model and of each cache (begin, full forward, one cached step)."""
    from dlmpipe import registry
    from dlmpipe.methods import build_cache

    gib = 2 ** 30
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    line = f"  memory: {model.cfg.n_layers}-layer model weights {weights / gib:.2f} GiB"
    if ck.gpu:
        torch.cuda.synchronize()
        line += f", peak allocated so far {torch.cuda.max_memory_allocated() / gib:.2f} GiB"
    ck.say(line + f"; per cache at P = {P}, G = {G} (held: buffers kept between steps; "
           f"peak: allocated above the model during begin + full forward + cached step)")
    x = torch.randint(0, model.cfg.vocab_size - 1, (P + G,), device=ck.device)
    x[P + G // 2:] = model.cfg.mask_id
    # each cache at the setting whose cached path runs (its registry entry's ``cheap``), with the
    # proxies' rank where it reads proxies; measured on LLaDA shapes: full attention
    specs = {n: {**c.cheap, **({"rank": proxies.stored_rank} if "proxies" in c.artifacts else {})}
             for n, c in registry.CACHES.items()
             if not registry.attention_refusal("cache", n, "full")}
    mem = ck.data.setdefault("memory", {"weights_gib": weights / gib})
    for name, params in specs.items():
        if ck.gpu:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        cache = build_cache({"name": name, **params}, model, artifacts={"proxies": proxies})
        cache.begin(x, P)
        block = (0, 32)  # Fast-dLLM's block length
        for _ in range(2):
            cache.note_due_positions(None)
            cache.response_logits(x, block)
        held = held_bytes(cache)
        peak = (torch.cuda.max_memory_allocated() - base) / gib if ck.gpu else None
        mem[name] = {"held_gib": held / gib, "peak_gib": peak}
        ck.say(f"    {name:>17}: held {held / gib:7.3f} GiB" + (f", peak {peak:7.3f} GiB" if ck.gpu else ""))
        del cache


# ---- 7. torch.compile, in a subprocess bounded by the time left ------------------------------
def compile_step(ck) -> None:
    limit = ck.free() - 20
    ck.say(f"  budget: {max(limit, 0):.0f} s ({ck.left():.0f} s left, less what later parts reserve and 20 s)")
    if limit < 90:
        ck.say("  skipped: needs ~90 s or more to compile")
        return
    cmd = [sys.executable, __file__, "compile-step"]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        ck.say(f"  not finished within the {limit:.0f} s left: compile time exceeds the budget")
        return
    last = (proc.stdout.strip().splitlines() or ["{}"])[-1]
    if proc.returncode or not last.startswith("{"):
        ck.check(False, "torch.compile'd cached step raised:\n" + proc.stderr[-3000:])
        return
    r = json.loads(last)
    ck.data["torch_compile"] = r
    ck.check(r["max_abs_diff"] <= r["tolerance"], f"llada-8b P = {r['P']}: compiled {r['compile_s']:.0f} s; "
             f"cached step {r['ms']:.2f} ms vs eager {r['eager_ms']:.2f} ms, full {r['full_ms']:.2f} ms: "
             f"speedup {r['full_ms'] / r['ms']:.2f}x of ideal {r['ideal']:.2f}x "
             f"({100 * r['full_ms'] / r['ms'] / r['ideal']:.0f}%); logits vs eager max |diff| "
             f"{r['max_abs_diff']:.3f} (bf16; <= {r['tolerance']:.3f})")


@torch.inference_mode()
def compile_step_main() -> None:
    from dlmpipe.methods import build_cache

    device, P, G = torch.device("cuda"), GPU_PROMPTS[-1], GPU_G
    model = build(REAL["llada-8b"], device, torch.bfloat16)
    time_it = timer(device, reps=10)
    x = torch.randint(0, model.cfg.vocab_size - 1, (P + G,), device=device)
    x[P + G // 2:] = model.cfg.mask_id
    out = {}
    for mode in ("none", "torch_compile"):
        cache = build_cache({"name": "archer", "K": "inf"}, model)
        cache.use_compile(mode)
        cache.begin(x, P)
        cache.response_logits(x, (0, G))
        t = time.perf_counter()
        logits = cache.response_logits(x, (0, G)).clone()  # the first cached step compiles
        torch.cuda.synchronize()
        out[mode] = (logits, time.perf_counter() - t, time_it(lambda: cache.response_logits(x, (0, G))))
    full = build_cache({"name": "none"}, model)
    full.begin(x, P)
    t_full = time_it(lambda: full.response_logits(x, (0, G)))
    eager, compiled = out["none"][0], out["torch_compile"][0]
    print(json.dumps({"P": P, "compile_s": out["torch_compile"][1], "ms": 1e3 * out["torch_compile"][2],
                      "eager_ms": 1e3 * out["none"][2], "full_ms": 1e3 * t_full, "ideal": 1 + P / G,
                      "max_abs_diff": (compiled - eager).abs().max().item(),
                      "tolerance": 0.05 * eager.abs().max().item()}))


if __name__ == "__main__" and sys.argv[1:] == ["compile-step"]:
    compile_step_main()
