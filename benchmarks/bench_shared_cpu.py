"""A CPU job's slowdown on a shared machine: alone vs next to one competing CPU-bound process.

Login nodes and shared workstations are where this pipeline's local steps run. A job's fair
share there: a 2-thread job on 2 cores next to one busy process gets 2 of 3 runnable threads,
a 1.5x slowdown (2-3x counting that torch's threads meet at a barrier after every op). Measured
for the toy trainer (seconds per training step, 2 threads as `train_toy` runs it) and a generate
job (seconds per forward of the toy backbone, LLaDA confidence, full recompute), each in a fresh
process with the environment Snakemake gives a job of that many threads (OMP_NUM_THREADS, ...):

- before: that environment alone (libgomp's default wait policy: a thread that reaches a
  barrier first spins for a while; when its partner is descheduled it burns the CPU that
  partner needs)
- after: plus what ``python -m dlmpipe`` does before torch loads (``dlmpipe.cli.job_environment``)

Runs alternate (before/after, alone/contended) ``--rounds`` times; medians and ratios of this one
run are printed, with the load average before and after (other users' processes skew absolute
times; compare ratios). Goal (issue 17): <= 2.5x for a 2-thread job on 2 cores against one
competing process.

    .venv/bin/python benchmarks/bench_shared_cpu.py [--threads 2] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
OMP_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "KMP_BLOCKTIME")


def worker(kind: str, threads: int, setup: str, checkpoint: str, amount: int) -> dict:
    """One measurement in this (fresh) process; torch is imported only after the setup."""
    if setup == "after":
        from dlmpipe.cli import job_environment

        job_environment()
    import torch

    if kind == "train":
        from dlmpipe.backbones.toy import train_toy

        with tempfile.TemporaryDirectory() as d:
            stats = train_toy(d, seed=0, steps=amount, threads=threads, log=lambda *_: None)
        return {"seconds": stats["train_seconds"] / amount, "unit": "s/step"}
    from dlmpipe.backbones.loading import load_backbone
    from dlmpipe.decode import decode
    from dlmpipe.generate import encode_prompt
    from dlmpipe.methods import build_method
    from dlmpipe.tasks import load_task

    loaded = load_backbone(checkpoint)
    method = {"name": "llada-confidence", "sampler": {"name": "llada_confidence"},
              "cache": {"name": "none"}, "gen_length": 16}
    sampler, cache = build_method(method, loaded.model)
    rows = load_task("toy_code", n=amount + 1, seed=0)
    time_s = nfe = 0.0
    for i, row in enumerate(rows):
        prompt = torch.tensor(encode_prompt(loaded, row, chat=False), dtype=torch.long)
        res = decode(loaded.model, sampler, cache, prompt, 16, torch.Generator().manual_seed(i))
        if i:  # the first generation warms up, untimed (as a generate job does)
            time_s, nfe = time_s + res.time_s, nfe + res.stats["nfe"]
    return {"seconds": time_s / nfe, "unit": "s/forward", "threads": torch.get_num_threads()}


def measure(kind: str, threads: int, setup: str, competing: bool, checkpoint: str,
            amount: int) -> float:
    # the environment Snakemake's shell gives a job of `threads` threads (snakemake/shell.py)
    env = {k: v for k, v in os.environ.items() if k not in OMP_VARIABLES}
    env.update({k: str(threads) for k in ("OMP_NUM_THREADS", "GOTO_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                          "MKL_NUM_THREADS", "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")})
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    rival = subprocess.Popen([sys.executable, "-c", "while True: pass"]) if competing else None
    try:
        out = subprocess.run([sys.executable, __file__, "--worker", kind, "--threads", str(threads),
                              "--setup", setup, "--checkpoint", checkpoint, "--amount", str(amount)],
                             env=env, capture_output=True, text=True, check=True)
    finally:
        if rival is not None:
            rival.kill()
            rival.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2, help="threads of the measured job")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--train-steps", type=int, default=12, help="toy training steps per run")
    ap.add_argument("--samples", type=int, default=4, help="generations per run (16 forwards each)")
    ap.add_argument("--kinds", default="train,generate")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--setup", default="after", help=argparse.SUPPRESS)
    ap.add_argument("--checkpoint", default="", help=argparse.SUPPRESS)
    ap.add_argument("--amount", type=int, default=0, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        print(json.dumps(worker(a.worker, a.threads, a.setup, a.checkpoint, a.amount)))
        return

    kinds = a.kinds.split(",")
    print(f"cores: {os.cpu_count()}  job threads: {a.threads}  rounds: {a.rounds}  "
          f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = ""
        if "generate" in kinds:  # a briefly trained toy backbone in LLaDA's format
            checkpoint = str(Path(tmp) / "toy")
            subprocess.run([sys.executable, "-c", "import sys; from dlmpipe.backbones.toy import train_toy; "
                            "train_toy(sys.argv[1], steps=2, log=lambda *_: None)", checkpoint],
                           env={**os.environ, "PYTHONPATH": str(REPO)}, check=True, capture_output=True)
        times: dict[tuple, list[float]] = {}
        start = time.perf_counter()
        for _ in range(a.rounds):
            for kind in kinds:
                amount = a.train_steps if kind == "train" else a.samples
                for setup in ("before", "after"):
                    for competing in (False, True):
                        times.setdefault((kind, setup, competing), []).append(
                            measure(kind, a.threads, setup, competing, checkpoint, amount))
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}  "
          f"({time.perf_counter() - start:.0f} s)")
    print(f"{'job':9} {'setup':7} {'alone':>9} {'1 rival':>9} {'slowdown':>9}   (medians; "
          "seconds per training step / per forward)")
    for kind in kinds:
        for setup in ("before", "after"):
            alone = statistics.median(times[(kind, setup, False)])
            rival = statistics.median(times[(kind, setup, True)])
            print(f"{kind:9} {setup:7} {alone:9.4f} {rival:9.4f} {rival / alone:8.2f}x")
        before = statistics.median(times[(kind, "before", False)])
        after = statistics.median(times[(kind, "after", False)])
        print(f"{kind:9} alone, after / before: {after / before:.2f}x")


if __name__ == "__main__":
    main()
