"""On-demand benchmark (not in CI): how long Snakemake takes to plan a large campaign, and what
one job costs the local executor.

1. Planning: a 10,000-job campaign (4 ``path:`` backbones -- tiny checkpoints in the exact
   LLaDA/Dream formats -- x 10 tasks x 125 methods from one sweep = 5,000 generate + 5,000 score
   jobs, plus preparation, summary and plots) planned with ``snakemake -n`` (dry run) from scratch,
   best of ``--repeat``; with ``--shards N`` the generate jobs are split N ways too.
2. Per-job overhead of the local executor: ``--jobs`` trivial jobs (``touch {output}``) of a
   one-rule Snakefile, run with ``--cores 2``; the wall time per job, minus the same run's planning
   (its dry run).

    python benchmarks/bench_dag_planning.py [--repeat 1] [--jobs 300] [--shards 1]
"""
from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TASKS = ["toy_code", "toy_arith", "humaneval", "humaneval_plus", "mbpp", "mbpp_plus",
         "livecodebench", "gsm8k", "math500", "humaneval_et"]
FAMILIES = ["llada", "dream", "diffucoder", "llada"]


def campaign(root: Path, shards: int) -> dict:
    from tests.checkpoints import make_tiny_checkpoint

    backbones = {}
    for i, family in enumerate(FAMILIES):
        ckpt = make_tiny_checkpoint(root / f"ckpt-{i}", family, d_model=32, n_layers=1, n_heads=2,
                                    mlp_hidden=32, seed=i)
        backbones[f"{family}-{i}"] = {"path": str(ckpt), "dtype": "bfloat16", "chat": True}
    tasks = {t: ({"n": 40, "seed": 1000, "gen_length": 16} if t.startswith("toy_")
                 else {"limit": 20, "gen_length": 256}) for t in TASKS}
    methods = {
        "llada-confidence": {"sampler": {"name": "llada_confidence"}, "cache": {"name": "none"}},
        # 25 x 5 = 125 points: archer-k1-n1 ... archer-k25-n5
        "archer": {"sampler": {"name": "saber"}, "cache": {"name": "archer"},
                   "sweep": {"cache.K": list(range(1, 26)), "sampler.n": list(range(1, 6))}},
    }
    # the reference is one of the 125 (keeps the method count at exactly 125)
    methods.pop("llada-confidence")
    return {"results_dir": "results", "seed": 0, "device": "cuda", "shards": shards,
            "reference_method": "archer-k1-n2", "backbones": backbones, "tasks": tasks,
            "methods": methods}


def dry_run(workdir: Path, config: Path) -> tuple[float, dict[str, int]]:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(REPO / "Snakefile"), "--directory",
           str(workdir), "--configfile", str(config), "-n", "--quiet", "rules"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"dry run failed:\n{proc.stderr[-3000:]}")
    table = proc.stdout.split("Job stats:", 1)[1].split("Reasons:", 1)[0]
    counts = {m[0]: int(m[1]) for m in re.findall(r"^(\w+)\s+(\d+)\s*$", table, re.M)}
    return took, counts


def planning(repeat: int, shards: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = root / "campaign.yaml"
        config.write_text(yaml.safe_dump(campaign(root, shards), sort_keys=False))
        times = []
        for i in range(repeat):
            workdir = root / f"run{i}"
            workdir.mkdir()
            took, counts = dry_run(workdir, config)
            times.append(took)
        jobs = counts.pop("total")
        print(f"planning (snakemake -n, from scratch): {jobs} jobs, best {min(times):.1f} s of "
              f"{repeat} ({1e3 * min(times) / jobs:.2f} ms per job)")
        print("  " + ", ".join(f"{rule} {n}" for rule, n in counts.items()))


TRIVIAL = """
rule all:
    input: expand("out/{i}.txt", i=range({n}))

rule touch:
    output: "out/{i}.txt"
    shell: "touch {output}"
"""


def local_overhead(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        (workdir / "Snakefile").write_text(TRIVIAL.replace("{n}", str(n)))
        base = [sys.executable, "-m", "snakemake", "-s", str(workdir / "Snakefile"), "--directory",
                str(workdir), "--cores", "2", "--quiet", "all"]
        start = time.perf_counter()
        subprocess.run(base + ["-n"], check=True, capture_output=True)
        plan = time.perf_counter() - start
        start = time.perf_counter()
        subprocess.run(base, check=True, capture_output=True)
        run = time.perf_counter() - start
        assert len(list((workdir / "out").iterdir())) == n
        print(f"local executor: {n} trivial jobs (--cores 2) in {run:.1f} s, planning {plan:.1f} s: "
              f"{1e3 * (run - plan) / n:.0f} ms per job")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--jobs", type=int, default=300, help="trivial jobs for the local executor")
    p.add_argument("--shards", type=int, default=1)
    a = p.parse_args()
    planning(a.repeat, a.shards)
    local_overhead(a.jobs)


if __name__ == "__main__":
    main()
