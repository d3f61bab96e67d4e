"""The device check's MoE part (issue 33; benchmarks/device_check.py): the GPU version of
benchmarks/bench_moe.py, LLaDA2.0-mini shapes decoded on one GPU, and the MoE layer's batch
invariance on CUDA.

a. layer time: the routed MoE layer (dlmpipe/backbones/moe.py) against its floor, a dense SwiGLU
   with the same active parameters, at 32..2048 rows, at LLaDA-MoE-7B-A1B's and LLaDA2.0-mini's
   expert counts and top-k (bench_moe.py's shapes, built and timed by its ``build`` and
   ``timed_pair``): real widths in bf16 on CUDA; widths / 16, float32, 32 and 128 rows on the CPU.
b. decoding: a model with LLaDA2.0-mini's real widths and expert counts (all 20 layers, layer 0
   dense; random bf16 weights, ~16B parameters, ~32 GB) decodes one block of 32 after a prompt
   of 32, block-causally, with the release loop (configs/moe.yaml ``llada2-generate``: the sdar
   sampler, low_confidence_dynamic) and with one cache (``fast-dllm-parallel``: threshold 0.9 +
   fast_dllm_dual); ms per step and the peak GPU memory are reported. Tokens: a tiny LLaDA2.0
   model decodes a few prompts on the CPU and on the GPU in float32 with both methods (checked:
   the same tokens); the mini-shaped model decodes two prompts at batch 1 and at batch 2 with
   the release loop (bf16: reported, not checked; a bf16 product need not be row-invariant).
   On the CPU: the mini shape narrowed (d_model 64, 2 layers, vocab 512; expert counts, top-k,
   groups and the block of 32 kept) in float32, and batch 1 vs 2 is checked (the CPU rows are
   invariant, docs/MODELS.md "MoE layer").
c. batch invariance on CUDA: rows of the LLaDA2.0-mini MoE layer alone vs in a call of 64 rows,
   and each sample's logits of the mini-shaped model alone vs in a batch of 4, bit for bit.
   On CUDA reported, never failed (the layer sums a row's experts in slot order, but cuBLAS may
   pick another kernel for another row count); on the CPU (float32) checked.

Expected on one H200: about 1-1.5 minutes (building the 16B-parameter model ~15 s, each
20-layer decode of 33 steps ~10 s, three of them plus the two timed ones; the layer benchmark
~15 s, most of it filling the bench layers' weights on the host). The batch-2 decode is skipped,
and said so, when less than 150 s of the device check's budget are left.
"""
from __future__ import annotations

import time
from pathlib import Path
from unittest import mock

import torch
import yaml

from bench_backbone_forward import build as build_model
from bench_batching import job_time
from bench_moe import SHAPES, build as build_layer, timed_pair

from dlmpipe.backbones.model import BackboneConfig
from dlmpipe.decode import Decoding
from dlmpipe.methods import build_method

REPO = Path(__file__).resolve().parents[1]
METHODS = ("llada2-generate", "fast-dllm-parallel")  # the release loop, and one cache
P, G = 32, 32  # one prompt block, one generated block (LLaDA2.0's blocks are 32)


def mini_config(gpu: bool) -> BackboneConfig:
    """LLaDA2.0-mini's config.json (docs/MODELS.md) as a BackboneConfig; CPU: narrowed."""
    if gpu:
        w = dict(d_model=2048, n_layers=20, n_heads=16, n_kv_heads=4, attn_head_dim=128, mlp_hidden=5120,
                 vocab_size=157184, expert_hidden=512, shared_expert_hidden=512, mask_id=156895,
                 stop_ids=[156892], pad_id=156892)
    else:
        w = dict(d_model=64, n_layers=2, n_heads=4, n_kv_heads=1, attn_head_dim=16, mlp_hidden=160,
                 vocab_size=512, expert_hidden=16, shared_expert_hidden=16, mask_id=511, stop_ids=[0], pad_id=0)
    return BackboneConfig(family="llada2", rope_theta=600000.0, norm_eps=1e-6, qkv_bias=False,
                          logit_shift=False, qk_norm=True, tie_embeddings=False, block_size=32,
                          rope_dim=w["attn_head_dim"] // 2, n_experts=256, experts_per_token=8,
                          router="sigmoid_grouped", router_bias=True, n_group=8, topk_group=4,
                          routed_scaling=2.5, dense_layers=[0], **w)


def methods() -> dict[str, dict]:
    cfg = yaml.safe_load((REPO / "configs" / "moe.yaml").read_text())["methods"]
    return {m: {k: cfg[m][k] for k in ("sampler", "cache")} for m in METHODS}


def invariant(ck, same: bool, what: str) -> None:
    """Checked on the CPU; on CUDA reported, never a failure, but said plainly."""
    if not ck.gpu:
        ck.check(same, what + ": bit for bit")
    elif same:
        ck.say(f"  [same] {what}: bit for bit")
    else:
        ck.say(f"  [DIFFERS] {what}: NOT bit for bit on CUDA (reported, not a failure)")


def _sync(ck) -> None:
    if ck.gpu:
        torch.cuda.synchronize(ck.device)


class Unfinished(RuntimeError):
    pass


@torch.inference_mode()
def capped_decode(ck, model, spec: dict, prompt, gen_len: int):
    """``decode`` (dlmpipe/decode.py) as a loop that gives up after 4 x ``gen_len`` steps (a
    sampler that stops committing must fail this part, not hang the device check):
    (response, seconds, stats)."""
    s, c = build_method(spec, model)
    _sync(ck)
    t = time.perf_counter()
    run, n = Decoding(model, s, c, prompt, gen_len, None), 0
    while not run.done and n < 4 * gen_len:
        run.step(None)
        n += 1
    _sync(ck)
    if not run.done:
        left = int((run.response == model.cfg.mask_id).sum())
        raise Unfinished(f"{spec['sampler']['name']} + {spec['cache']['name']}: not done after {n} steps "
                         f"(prompt {len(prompt)}, G = {gen_len}; {left} positions still masked)")
    return run.response.cpu(), time.perf_counter() - t, run.stats()


# ---- a. the MoE layer against its dense floor -------------------------------------------------
def layer_floor_s(ck, cfg, rows: int, active: int, dtype: torch.dtype) -> float:
    """The layer's roofline (issue 48's floor, part 10): reading the router, the shared expert and
    the ``active`` experts' weights once, or the products of ``rows`` rows through the router,
    their top-k experts and the shared one, whichever takes longer at this device's measured
    rates (device_speed.peaks)."""
    from device_speed import roofline_s

    d, h, hs, e, k = cfg.d_model, cfg.expert_hidden, cfg.shared_expert_hidden, cfg.n_experts, cfg.experts_per_token
    size = torch.finfo(dtype).bits // 8
    weights = d * e + 3 * d * (active * h + hs)
    flops = 2 * rows * (d * e + 3 * d * (k * h + hs))
    return roofline_s(flops, size * weights, ck)


@torch.inference_mode()
def layer_table(ck) -> torch.nn.Module | None:
    dev = ck.device.type
    narrow, dtype = (1, torch.bfloat16) if ck.gpu else (16, torch.float32)
    rows_list, reps = ((32, 128, 512, 2048), 5) if ck.gpu else ((32, 128), 3)
    ck.say(f"  MoE layer vs dense SwiGLU of the same active width (bench_moe.py), {dtype}, widths / "
           f"{narrow}, median of {reps} interleaved repeats")
    ck.say(f"  {'model':<18}{'rows':>6}{'moe ms':>9}{'dense ms':>10}{'ratio':>7}{'router ms':>10}"
           f"{'active':>7}{'rows/exp':>9}")
    table, mini_layer = [], None
    for shape in SHAPES:
        name, cfg, moe, dense = build_layer(shape, narrow, dev, dtype)
        for rows in rows_list:
            x = torch.randn(rows, cfg.d_model, generator=torch.Generator().manual_seed(rows)).to(dev, dtype)
            t_moe, t_dense, t_route = timed_pair([lambda: moe(x), lambda: dense(x), lambda: moe.route(x)],
                                                 dev, reps)
            active = int((torch.bincount(moe.route(x)[0].reshape(-1), minlength=cfg.n_experts) > 0).sum())
            table.append({"model": name, "rows": rows, "moe_ms": 1e3 * t_moe, "dense_ms": 1e3 * t_dense,
                          "ratio": t_moe / t_dense, "router_ms": 1e3 * t_route, "active": active,
                          "floor_ms": 1e3 * layer_floor_s(ck, cfg, rows, active, dtype)})
            ck.say(f"  {name:<18}{rows:>6}{1e3 * t_moe:>9.2f}{1e3 * t_dense:>10.2f}{t_moe / t_dense:>7.2f}"
                   f"{1e3 * t_route:>10.2f}{active:>7}{rows * cfg.experts_per_token / active:>9.1f}")
        if cfg.n_group > 1:
            mini_layer = moe
        del dense
    ck.data["moe_layer"] = table
    return mini_layer


# ---- c. batch invariance: layer rows and model logits -----------------------------------------
@torch.inference_mode()
def layer_invariance(ck, moe) -> None:
    x = torch.randn(64, moe.cfg.d_model, generator=torch.Generator().manual_seed(7)).to(
        ck.device, next(moe.parameters()).dtype)
    together = moe(x)
    alone = torch.cat([moe(x[i:i + 1]) for i in range(0, 64, 8)])
    differ = int((together[::8] != alone).any(-1).sum())
    ck.data.setdefault("moe_invariance", {})["layer_rows_differing"] = differ
    invariant(ck, differ == 0, f"LLaDA2.0-mini MoE layer ({x.dtype}, {ck.device.type}): 8 rows alone vs "
              f"in a call of 64: {differ}/8 rows differ")


@torch.inference_mode()
def logits_invariance(ck, model) -> None:
    cfg = model.cfg
    ids = torch.randint(0, cfg.mask_id, (4, 64), generator=torch.Generator().manual_seed(5))
    ids[:, 40:] = cfg.mask_id
    ids = ids.to(ck.device)
    together = model(ids)
    differ = [b for b in range(4) if not torch.equal(model(ids[b:b + 1])[0], together[b])]
    ck.data.setdefault("moe_invariance", {})["logits_samples_differing"] = len(differ)
    dtype = next(model.parameters()).dtype
    invariant(ck, not differ, f"LLaDA2.0-mini-shaped model ({dtype}, {ck.device.type}): each sample's "
              f"logits alone vs in a batch of 4 (64 positions): {len(differ)}/4 samples differ")


# ---- b. decoding ------------------------------------------------------------------------------
def tiny_cpu_vs_device(ck, specs) -> None:
    """A tiny LLaDA2.0 model (tests/models.py), float32: the GPU decodes the CPU's tokens. The
    CPU-sized check has no second device: it runs the same code CPU against CPU on one prompt (the
    batch check below is its real check)."""
    from tests.models import random_prompt, tiny_backbone

    if ck.gpu:
        torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32
    cpu = tiny_backbone("llada2", seed=11)
    dev = tiny_backbone("llada2", seed=11).to(ck.device)
    prompts = [random_prompt(p, i) for i, p in enumerate((5, 12, 20) if ck.gpu else (5,))]
    for name, spec in specs.items():
        toks = {}
        for where, m in (("the CPU", cpu), (f"{ck.device.type} (second copy)", dev)):
            try:
                toks[where] = [capped_decode(ck, m, spec, p, 24)[0] for p in prompts]
            except Unfinished as e:
                toks = None
                ck.check(False, f"tiny LLaDA2.0 {name} on {where}: {e}")
                break
        if toks is None:
            continue
        differ = [i for i, (a, b) in enumerate(zip(*toks.values())) if not torch.equal(a, b)]
        ck.check(not differ, f"tiny LLaDA2.0 (8 experts, top-2, blocks of 8) {name}, float32: "
                 f"{ck.device.type} tokens equal the CPU's on {len(prompts)} prompt(s)"
                 + ("" if ck.gpu else " (CPU-sized: CPU against CPU, the code path only)")
                 + (f" (samples {differ} differ)" if differ else ""))


@torch.inference_mode()
def mini_decode(ck, specs) -> None:
    cfg = mini_config(ck.gpu)
    dtype = torch.bfloat16 if ck.gpu else torch.float32
    t = time.perf_counter()
    if ck.gpu:
        torch.cuda.reset_peak_memory_stats(ck.device)
    no_init = lambda self: None  # noqa: E731
    with mock.patch.object(torch.nn.Linear, "reset_parameters", no_init), \
            mock.patch.object(torch.nn.Embedding, "reset_parameters", no_init):
        model = build_model(cfg, ck.device, dtype)  # its weights are filled anyway: skip the
        # default init of its ~15,000 modules (even on the meta device ~5 ms each)
    _sync(ck)
    n_params = sum(p.numel() for p in model.parameters())
    what = ("real widths, all 20 layers" if ck.gpu else "narrowed: d_model 64, 2 layers, vocab 512, "
            "expert counts, top-k, groups and blocks of 32 as released")
    ck.say(f"  LLaDA2.0-mini shapes ({what}; 256 experts, top-8, 1 shared, 8 groups / 4 kept), random "
           f"{dtype} weights: {n_params / 1e9:.3g}B parameters, built in {time.perf_counter() - t:.1f} s")
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, cfg.mask_id, (P,), generator=g) for _ in range(2)]
    model(prompts[0][None].to(ck.device))  # warm-up: kernels, cuBLAS handles
    res = {}
    for name, spec in specs.items():
        try:
            tokens, secs, stats = capped_decode(ck, model, spec, prompts[0], G)
        except Unfinished as e:
            ck.check(False, f"mini shapes {name}: {e}")
            return
        steps = stats["steps"]
        res[name] = {"time_s": secs, "steps": steps, "nfe": stats.get("nfe"),
                     "ms_per_step": 1e3 * secs / steps, "tokens": tokens}
        ck.say(f"  {name} ({spec['sampler']['name']} + {spec['cache']['name']}), P = {P}, G = {G}, batch 1: "
               f"{1e3 * secs / steps:.0f} ms per step ({steps} steps, {stats.get('nfe')} forwards, "
               f"{secs:.2f} s incl. the prompt's prefill; {G / secs:.1f} tokens/s)")
    if ck.gpu:
        peak = torch.cuda.max_memory_allocated(ck.device) / 2**30
        res["peak_gib"] = peak
        ck.say(f"  peak GPU memory {peak:.1f} GiB (weights {n_params * 2 / 2**30:.1f} GiB)")
    logits_invariance(ck, model)
    name = METHODS[0]
    if ck.gpu and ck.left() < 150:
        ck.say(f"  batch 2 vs 1 skipped: {ck.left():.0f} s of the budget left (needs ~30 s; later parts ~120 s)")
    else:
        alone = [res[name]["tokens"], capped_decode(ck, model, specs[name], prompts[1], G)[0]]
        _, batched = job_time(model, specs[name], prompts, G, 2)  # both finished alone
        same = sum(torch.equal(a, b) for a, b in zip(alone, batched))
        res["batch2_identical"] = same
        what = f"mini shapes {name}, {dtype}: batch 2 vs batch 1, {same}/2 samples with the same tokens"
        if ck.gpu:
            ck.say(f"  {what} (bf16: reported, not checked)")
        else:
            ck.check(same == 2, what)
    for r in res.values():
        if isinstance(r, dict):
            r.pop("tokens", None)
    ck.data["moe_decode"] = res
    del model
    if ck.gpu:
        torch.cuda.empty_cache()


def moe(ck) -> None:
    specs = methods()
    mini_layer = layer_table(ck)
    layer_invariance(ck, mini_layer)
    del mini_layer
    if ck.gpu:
        torch.cuda.empty_cache()
    tiny_cpu_vs_device(ck, specs)
    mini_decode(ck, specs)
