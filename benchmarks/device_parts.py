"""The correctness parts of the device check (benchmarks/device_check.py says what each checks).

Each part takes the shared ``Check`` (device, report) and reports its own lines and verdicts.
"""
from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from device_moe import moe
from device_speed import compile_step, speed_table

REPO = Path(__file__).resolve().parents[1]
FAMILIES = ("llada", "dream")
BF16_REL_TOL = 0.05  # bf16 logits vs CPU float32: |diff| <= 5% of the largest |logit|


def families(ck) -> tuple[str, ...]:
    """Both families on a GPU; the CPU-sized check takes Dream (GQA, shifted logits)."""
    return FAMILIES if ck.gpu else ("dream",)


# ---- 1. native forwards on the device against the CPU float32 forward -----------------------
def forwards(ck) -> None:
    from dlmpipe.backbones import load_backbone
    from tests.checkpoints import make_tiny_checkpoint

    torch.backends.cuda.matmul.allow_tf32 = False  # float32 means float32 (PyTorch's default)
    size = dict(d_model=256, n_layers=4, n_heads=4, mlp_hidden=512) if ck.gpu else {}
    with tempfile.TemporaryDirectory() as tmp, torch.inference_mode():
        for family in FAMILIES:
            path = make_tiny_checkpoint(Path(tmp) / family, family, **size)
            ref_model = load_backbone(path, "float32", "cpu", with_tokenizer=False)
            cfg = ref_model.cfg
            ids = torch.randint(0, cfg.vocab_size, (2, 45), generator=torch.Generator().manual_seed(0))
            ids[0, 5:9] = cfg.mask_id
            ref = ref_model(ids)
            for dtype in ("float32", "bfloat16"):
                model = load_backbone(path, dtype, ck.device, with_tokenizer=False)
                out = model(ids.to(ck.device)).float().cpu()
                diff, scale = (out - ref).abs().max().item(), ref.abs().max().item()
                agree = (out.argmax(-1) == ref.argmax(-1)).float().mean().item()
                limit = 1e-4 if dtype == "float32" else BF16_REL_TOL * scale
                ck.data.setdefault("forwards", {})[f"{family}/{dtype}"] = {"max_abs_diff": diff,
                                                                          "limit": limit, "argmax_agree": agree}
                ck.check(diff <= limit, f"{family} ({cfg.n_heads} heads / {cfg.n_kv_heads} K/V heads) "
                         f"{dtype} on {ck.device.type} vs CPU float32: max |diff| {diff:.2e} <= "
                         f"{limit:.1e}{' (5% of max |logit| ' + f'{scale:.2f})' if dtype != 'float32' else ''}; "
                         f"argmax agreement {agree:.1%}")


# ---- 2. the degenerate-setting exactness table, by pytest, on the device ---------------------
def exactness(ck) -> None:
    test = "tests/test_exactness.py::test_degenerate_setting_equals_full_recompute"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", test,
           "--dlmpipe-device", ck.device.type]
    if not ck.gpu:
        cmd += ["-k", "archer-k1/llada-llada"]  # CPU-sized: one row (make test runs the whole table)
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    summary = (proc.stdout.strip().splitlines() or ["(no output)"])[-1]
    ck.data["exactness"] = summary
    ck.check(proc.returncode == 0, f"every cache's degenerate setting equals full recompute on "
             f"{ck.device.type}, token for token ({' '.join(cmd[3:])}): {summary}")
    if proc.returncode:
        ck.say(proc.stdout[-4000:] + proc.stderr[-2000:])


# ---- 3. captured steps give the eager tokens --------------------------------------------------
LENGTHS = (7, 7, 12, 9, 7)  # prompt lengths of one job: a capture per change of length (4)


def compiled_steps(ck) -> None:
    from dlmpipe import graphs
    from dlmpipe.decode import decode
    from dlmpipe.methods import build_method
    from tests.models import random_prompt, tiny_backbone

    if not ck.gpu:  # the CPU stand-in replays the recorded operations like a graph
        from tests.host_sync import replay_capture
        graphs.CAPTURE["cpu"] = replay_capture
    archer = {"name": "archer", "K": "inf"}
    samplers = [{"name": "saber", "n": 2, "mu": 2}, {"name": "llada_confidence", "block_length": 8},
                {"name": "llada_confidence", "temperature": 1.0},
                {"name": "certainty_prior", "block_length": 8, "confidence": "topk_margin"},
                {"name": "pc_sampler", "temperature": 1.0}]
    if not ck.gpu:  # CPU-sized: the samplers tests/test_graphs.py's stand-in tests do not decode
        samplers = samplers[3:]
    changes = 1 + sum(a != b for a, b in zip(LENGTHS, LENGTHS[1:]))
    for family in families(ck):
        model = tiny_backbone(family, seed=3, n_layers=4 if ck.gpu else 2).to(ck.device)
        for spec in samplers:
            equal, captures = True, []
            for mode in ("none", "cuda_graphs"):
                s, c = build_method({"sampler": spec, "cache": archer}, model, compile=mode)
                # every response kept: a released graph's outputs still alive when the next
                # length captures (what made a capture into the released graph's pool fail)
                outs = [decode(model, s, c, random_prompt(p, i), 16, torch.Generator().manual_seed(i)).response
                        for i, p in enumerate(LENGTHS)]
                if mode == "none":
                    ref = outs
                else:
                    equal = all(torch.equal(a, b) for a, b in zip(outs, ref))
                    captures = [c.cached_step.captures, getattr(s, "scoring", None) and s.scoring.captures]
            ck.check(equal and captures[0] == changes, f"{family} {spec['name']}"
                     f"{' T=1' if spec.get('temperature') else ''} + archer K=inf, compile cuda_graphs"
                     f"{'' if ck.gpu else ' (CPU replay stand-in)'}: eager tokens on {len(LENGTHS)} "
                     f"samples of prompt lengths {', '.join(map(str, LENGTHS))}; cached forward "
                     f"captured {captures[0]}x (want {changes}, once per change of length)"
                     + (f", scoring {captures[1]}x" if captures[1] else ""))
    failed_capture(ck)


def failed_capture(ck) -> None:
    """A capture that fails midway (a host read inside the step: a graph cannot hold one) warns
    and runs that shape eagerly, and leaves the process usable: random draws on the device (torch
    2.11 left its generator in capture mode) and the next capture work."""
    import warnings

    from dlmpipe.graphs import CaptureFailed, StepRunner

    x = torch.ones(4, device=ck.device)
    reads = StepRunner(lambda t: t * int(t.sum()), "cuda_graphs")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        eager = torch.equal(reads(x), x * 4) and reads.captures == 0
    warned = any(issubclass(w.category, CaptureFailed) for w in caught)
    try:
        draws = "work" if torch.randn(3, device=ck.device).isfinite().all().item() else "not finite"
    except RuntimeError as e:
        draws = f"raise {e}"
    good = StepRunner(lambda t: t * 2, "cuda_graphs")
    replays = [good(x * i).clone() for i in (1, 3)]
    next_ok = good.captures == 1 and all(torch.equal(r, x * 2 * i) for r, i in zip(replays, (1, 3)))
    ck.check(eager and warned and draws == "work" and next_ok, f"a capture failing midway (a host "
             f"read in the step) on {ck.device.type}: warned {warned}, ran eagerly {eager}; after "
             f"it random draws {draws}, the next step captured and replayed {next_ok}")


# ---- 4. host syncs per step -------------------------------------------------------------------
def host_syncs(ck) -> None:
    from pytest import MonkeyPatch

    from dlmpipe import registry
    from dlmpipe.methods import build_cache, build_sampler
    from tests.host_sync import (CACHE_READS, SAMPLER_READS, SAMPLER_SPECS, CudaSyncs, expected_reads,
                                 host_reads, per_step_reads)
    from tests.models import random_prompt, tiny_backbone

    how = "torch.cuda.set_sync_debug_mode('warn')" if ck.gpu else "tests/host_sync.py's counter"
    ck.say(f"  host reads per step ({how}) against each method's budget (sampler: Saber and the "
           f"parallel ones 1, LLaDA/random order/Dream 0; cache: dKV 1, Archer K=4 1, others 0)"
           + ("" if ck.gpu else "; CPU-sized: every sampler and every cache at least once (the whole "
              "table on the CPU is tests/test_host_sync.py's)"))
    seen: set[str] = set()
    for family in families(ck):
        model = tiny_backbone(family, seed=4).to(ck.device)
        for cache_id, (spec, _, _) in CACHE_READS.items():
            bad = []
            pairs = [s for s in SAMPLER_READS if not (registry.pairing_problem(s, spec["name"]) or
                     registry.attention_problems({"sampler": {"name": s}, "cache": spec}, "full"))]
            if not ck.gpu:  # each sampler once, and one with every cache
                pairs = [s for s in pairs if s not in seen] or pairs[:1]
                seen.update(pairs)
            for s_name in pairs:  # (full-attention families: no block-causal releases)
                sampler = build_sampler(SAMPLER_SPECS[s_name])
                with MonkeyPatch.context() as mp:
                    if ck.gpu:
                        counter = CudaSyncs()
                        _, steps = per_step_reads(counter, model, sampler, build_cache(spec, model),
                                                  random_prompt(9, 4))
                    else:
                        with host_reads(mp) as counter:
                            _, steps = per_step_reads(counter, model, sampler, build_cache(spec, model),
                                                      random_prompt(9, 4))
                want = expected_reads(s_name, cache_id, len(steps))
                if steps != want:
                    bad.append(f"{s_name}: {steps} != {want} at {counter.where[:4]}")
            which = ("every sampler" if ck.gpu else
                     ", ".join(pairs) or "no sampler (none pairs on full attention)")
            ck.check(not bad, f"{family} {cache_id}: {which} within budget" + "".join(f"\n    {b}" for b in bad))


# ---- 6. the tiny campaign end to end on the device --------------------------------------------
def campaign(ck) -> None:
    import pandas as pd
    import yaml

    from dlmpipe.campaign import Campaign
    from dlmpipe.generate import run_generation_job
    from tests.workflow import CONFIGS, run_snakemake

    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    config["device"], config["sandbox"] = ck.device.type, "auto"
    if not ck.gpu:  # CPU-sized: one task scored by exact match, one method
        config["tasks"] = {"toy_arith": {**config["tasks"]["toy_arith"], "n": 2}}
        config["methods"] = {"archer": {**config["methods"]["archer"], "sweep": {"cache.K": ["inf"]}}}
        config["reference_method"] = "archer-kinf"
    plan = Campaign(config)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cfg = work / "campaign.yaml"
        cfg.write_text(yaml.safe_dump(config, sort_keys=False))
        cores = str(min(os.cpu_count() or 2, 8))
        # CPU-sized: up to the summary (generation, timing, scoring); the plots and tables after
        # it run on the CPU either way and are the toy campaign's tests' (docs/DEVELOPING.md)
        targets = [] if ck.gpu else ["summarize"]
        proc = run_snakemake(work, *targets, "--cores", cores, "--resources", "gpu=1", configfile=cfg,
                             check=False)
        if not ck.check(proc.returncode == 0, f"tiny campaign with device: {ck.device.type} through "
                        f"Snakemake (--cores {cores}{', to the summary' if targets else ''})"):
            ck.say(proc.stdout[-3000:] + proc.stderr[-3000:])
            return
        results = work / "results"
        summary = pd.read_csv(results / "summary.csv")
        ck.check(len(summary) == len(plan.tasks) * len(plan.methods), f"summary: {len(summary)} rows "
                 f"({', '.join(sorted(plan.methods))} x {', '.join(plan.tasks)}), quality "
                 f"{', '.join(f'{q:.2f}' for q in summary['quality'])}")
        reruns = [("cpu", "none")] + ([(ck.device.type, "cuda_graphs")] if ck.gpu else [])
        for task in plan.tasks:
            for method in plan.methods:
                gens = pd.read_parquet(results / "generations" / "toy" / task / f"{method}.parquet")
                scores = pd.read_parquet(results / "scores" / "toy" / task / f"{method}.parquet")
                devices = set(gens["device"])
                for device, mode in reruns:
                    if mode == "cuda_graphs" and plan.method(method, task, "toy")["cache"]["name"] != "archer":
                        continue
                    out = work / f"rerun-{device}-{mode}-{task}-{method}.parquet"
                    with contextlib.redirect_stderr(io.StringIO()):  # the job's progress bar
                        run_generation_job(str(results / "backbones" / "toy" / "manifest.json"),
                                           str(results / "tasks" / f"{task}.parquet"),
                                           plan.method(method, task, "toy"), str(out), str(out) + ".json",
                                           seed=config["seed"], device=device, compile=mode, warmup=False)
                    again = [list(t) for t in pd.read_parquet(out)["token_ids"]]
                    first = [list(t) for t in gens["token_ids"]]
                    differ = [f"sample {i} from position {next(j for j, (a, b) in enumerate(zip(u, v)) if a != b)}"
                              for i, (u, v) in enumerate(zip(again, first)) if u != v]
                    ck.check(not differ, f"{task}/{method}: generated on {', '.join(devices)}, scored on "
                             f"the CPU ({', '.join(sorted(set(scores['status'])))}); {device} compile {mode}: "
                             + ("the same tokens for all " + str(len(first)) + " samples" if not differ else
                                "tokens differ (float32 rounds differently on each device: a near tie "
                                "can flip a token): " + "; ".join(differ)))
        bf16_batching(ck, plan, config, work, results)


def bf16_batching(ck, plan, config, work: Path, results: Path) -> None:
    """Every generate job of the campaign again in bf16 on the device, at batch 1 and batch 16
    (CPU-sized: 4): the fraction of samples with identical tokens and the quality of each
    (scored like the campaign). Reported, not checked: bf16 matrix products need not be
    row-invariant, so batching may move a near tie (docs/ARCHITECTURE.md, batched decoding)."""
    import json

    import pandas as pd

    from dlmpipe.generate import run_generation_job
    from dlmpipe.scoring.score import score_many
    from dlmpipe.tasks import read_task_table

    big = 16 if ck.gpu else 4
    manifest = json.loads((results / "backbones" / "toy" / "manifest.json").read_text())
    bf16 = work / "manifest-bf16.json"
    bf16.write_text(json.dumps({**manifest, "dtype": "bfloat16"}))
    same = total = 0
    quality: dict[int, list[float]] = {1: [], big: []}
    for task in plan.tasks:
        task_file = results / "tasks" / f"{task}.parquet"
        rows = read_task_table(str(task_file))
        for method in plan.methods:
            tokens = {}
            for b in (1, big):
                out = work / f"bf16-b{b}-{task}-{method}.parquet"
                with contextlib.redirect_stderr(io.StringIO()):
                    run_generation_job(str(bf16), str(task_file), plan.method(method, task, "toy"),
                                       str(out), str(out) + ".json", seed=config["seed"],
                                       device=ck.device.type, warmup=False, batch_size=b)
                    gens = pd.read_parquet(out)
                    scores = score_many([(rows[i], c) for i, c in zip(gens["sample_index"], gens["completion"])],
                                        sandbox=config["sandbox"])
                tokens[b] = [list(t) for t in gens["token_ids"]]
                quality[b] += [s["score"] for s in scores]
            same += sum(u == v for u, v in zip(tokens[1], tokens[big]))
            total += len(tokens[1])
    q1, qb = (sum(quality[b]) / len(quality[b]) for b in (1, big))
    ck.data["batching_bf16"] = {"batch": big, "identical": same, "samples": total,
                                "quality_b1": q1, f"quality_b{big}": qb}
    ck.say(f"  bf16 on {ck.device.type}, batch {big} vs 1: {same}/{total} samples identical; quality "
           f"{q1:.3f} at batch 1, {qb:.3f} at batch {big} (difference {qb - q1:+.3f})")


def batching(ck) -> None:
    """Generate-job wall time at batch 16 vs 1 (benchmarks/bench_batching.py): LLaDA-8B shapes,
    random bf16 weights on a GPU (goal: >= 5x throughput for the cached methods), with the
    fraction of samples whose bf16 tokens equal batch 1's; CPU-sized: a tiny float32 model at
    batch 4, where every sample must be identical (batch invariance)."""
    import bench_batching as bb

    if ck.gpu:
        model, methods, prompts, gen_len = bb.llada_setup(ck.device, 16)
        sizes = [1, 16]
    else:
        from tests.models import random_prompt, tiny_backbone
        # 2 layers (the first and one after it: every per-layer path) and 5 prompts (one joins
        # a slot another left at batch 4)
        model = tiny_backbone("dream", seed=0, n_layers=2)
        methods = [dict(m, gen_length=16, sampler=dict(m["sampler"], block_length=8, steps=16)
                        if m["sampler"]["name"] == "llada_confidence" else
                        dict(m["sampler"], block_length=8))
                   for m in bb.LLADA_METHODS if m["name"] in ("full", "archer-k8", "fast-dllm-dual")]
        prompts, gen_len, sizes = [random_prompt(4 + 3 * i, i) for i in range(5)], 16, [1, 4]
    # on a GPU until 30 s before what later parts reserve (a method already begun runs on)
    budget = max(ck.free() - 30, 30) if ck.gpu else 600
    ck.say(f"  budget: methods begun within {budget:.0f} s")
    deadline = time.monotonic() + budget
    with torch.inference_mode():
        # on a GPU its minutes go to the timings; on the CPU the floors' code runs, its peak
        # measured on a 256^3 product (1024^3 costs ~2 CPU s here and tells nothing of a GPU)
        res = bb.run(model, methods, prompts, gen_len, sizes, repeats=1, say=ck.say, deadline=deadline,
                     floors=not ck.gpu, peak_size=256)
    ck.data["batching"] = res
    big = sizes[-1]
    for name, r in res.items():
        gain = r["tokens_per_s"][big] / r["tokens_per_s"][1]
        if ck.gpu:
            goal = " (goal >= 5x)" if name in bb.CACHED else ""
            ck.say(f"  {name}: throughput at B={big} / B=1 = {gain:.2f}x{goal}; bf16 samples identical "
                   f"to B=1: {r['identical'][big]:.0%}")
        else:
            ck.check(r["identical"][big] == 1.0, f"{name}: every sample at B={big} has batch 1's "
                     f"tokens (float32 CPU); throughput {gain:.2f}x")


def skipped_compile(ck) -> None:
    ck.say("  CPU: skipped (Inductor takes a minute on a CPU; tests/test_graphs.py::"
           "test_torch_compile_decodes_the_eager_tokens checks its tokens)")


def floors(ck) -> None:
    """Part 10 (issue 48): every figure of the check as a ratio to its floor, in one table, from
    what parts 5, 7 and 9 measured (a figure whose part did not run is said so): each cached step
    against its roofline (the weight-streaming floor at these row counts), the full step over 768
    rows (the nearest on the CPU) against the matrix peak, a whole decode against the sum of its
    forwards, batch 16 against batch 1 throughput against the ideal B times, the MoE layer against
    its roofline (goal: at most 3x from 32 rows). Floors use the rates measured in this run
    (device_speed.peaks)."""
    from device_speed import peaks

    peak, bandwidth = peaks(ck)
    rows: list[dict] = []

    def add(figure: str, measured: float, floor: float, unit: str = "ms", goal: float | None = None):
        rows.append({"figure": figure, "measured": measured, "floor": floor, "unit": unit,
                     "ratio": measured / floor if floor else float("inf"), "goal": goal})

    table = ck.data.get("table", [])
    if table:
        model = "llada-8b"
        longest = max(r["P"] for r in table if r["model"] == model)
        at = [r for r in table if r["model"] == model and r["P"] == longest]
        add(f"{model} full step, P = {longest}", at[0]["full_ms"], at[0]["full_floor_ms"])
        for r in at:
            add(f"{model} {r['step']} step, P = {longest}", r["ms"], r["floor_ms"])
        full = min((r for r in table if r["model"] == model), key=lambda r: abs(r["P"] + 256 - 768)
                   if ck.gpu else -r["P"])
        add(f"{model} full step, {full['P']} + G rows, vs the matrix peak", full["full_ms"],
            1e3 * full["full_flops"] / peak)
    decode = ck.data.get("decode_vs_forwards")
    if decode:
        add(f"whole decode vs the sum of its {decode['steps']} forwards (fast_dllm_dual)", decode["decode_ms"],
            decode["forwards_ms"])
    batching = ck.data.get("batching", {})
    for name, r in batching.items():
        big = max(r["tokens_per_s"])
        gain = r["tokens_per_s"][big] / r["tokens_per_s"][1]
        add(f"{name}: time per token at batch {big} vs batch 1 / {big}", 1 / gain, 1 / big, unit="x")
    for r in ck.data.get("moe_layer", []):
        add(f"MoE layer {r['model']}, {r['rows']} rows", r["moe_ms"], r["floor_ms"], goal=3.0)
    missing = [part for part, key in (("5 (table)", "table"), ("7 (moe)", "moe_layer"),
                                      ("9 (batching)", "batching")) if key not in ck.data]
    ck.say(f"  floors from this run's rates: {ck.data['peaks']['dtype']} matrix products "
           f"{peak / 1e12:.2f} TFLOP/s, copies {bandwidth / 1e12:.2f} TB/s"
           + (f"; not run, so not in the table: part {', '.join(missing)}" if missing else ""))
    ck.say(f"  {'figure':<72}{'measured':>10}{'floor':>10}{'ratio':>8}  goal")
    for r in rows:
        goal = ""
        if r["goal"] is not None:
            goal = f"<= {r['goal']:g}x: {'met' if r['ratio'] <= r['goal'] else 'not met'}"
        unit = "" if r["unit"] == "x" else " ms"
        ck.say(f"  {r['figure']:<72}{r['measured']:>8.3f}{unit:<2}{r['floor']:>8.3f}{unit:<2}"
               f"{r['ratio']:>7.2f}x  {goal}")
    ck.data["floors"] = rows


PARTS = {
    "forwards": ("1. native forwards on the device vs CPU float32 (tiny real-format checkpoints)", forwards),
    "exactness": ("2. degenerate-setting exactness table on the device (pytest)", exactness),
    "compiled": ("3. captured steps (compile: cuda_graphs) give the eager tokens", compiled_steps),
    "syncs": ("4. host syncs per step against each method's budget", host_syncs),
    "table": ("5. prompt-length table (full / Archer cached / SPA sparse) and peak memory", speed_table),
    "campaign": ("6. tiny campaign end to end on the device, tokens against the CPU", campaign),
    "moe": ("7. MoE: layer vs its dense floor, LLaDA2.0-mini shapes decoded, batch invariance", moe),
    "torch_compile": ("8. torch.compile'd Archer cached step (reduce-overhead)",
                      lambda ck: compile_step(ck) if ck.gpu else skipped_compile(ck)),
    "batching": ("9. batched generate jobs: throughput at B=16 vs 1, bf16 tokens vs batch 1", batching),
    "floors": ("10. every figure as a ratio to its floor (issue 48)", floors),
}
