"""On-demand benchmark (not in CI): how long Snakemake takes to plan a large campaign, against
bare Snakemake planning rules of the same shape, and what one job costs the local executor.

1. Planning: a campaign of the current shape (4 ``path:`` backbones -- tiny checkpoints in the
   exact LLaDA/Dream formats -- x 10 tasks x 125 methods from one sweep: 5,000 generate, 5,000
   score and 5,000 per-method timing jobs, plus preparation, summary and plots) planned with
   ``snakemake -n`` (dry run) from scratch, best of ``--repeat``; with ``--shards N`` the generate
   jobs are split N ways too. In the same run, a bare Snakefile with rules of the same shape
   (the same wildcards, the same jobs per rule, the same inputs between them; ``touch`` for
   every command, no dlmpipe) is planned the same way, and the ratio printed (goal: 1.5x at
   most): what the workflow's own Python (campaign checks, input functions, params) adds to
   Snakemake's planning. The tasks' data files are looked up as a job would
   (``$DLMPIPE_DATA_DIR``, else the repository's ``../shared/data``, passed to the dry run as
   ``$DLMPIPE_DATA_DIR``); a dry run that fails says why (Snakemake's own words, from its stdout
   and stderr).
2. Per-job overhead of the local executor: ``--jobs`` trivial jobs (``touch {output}``) of a
   one-rule Snakefile, run with ``--cores 2``; the wall time per job, minus the same run's planning
   (its dry run).

    python benchmarks/bench_dag_planning.py [--repeat 1] [--jobs 300] [--shards 1]
"""
from __future__ import annotations

import argparse
import json
import os
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


def data_dir() -> Path:
    """Where the tasks' data files are: $DLMPIPE_DATA_DIR, else the repository's ../shared/data
    (tasks/sources.py looks there too, but relative to the dry run's working directory, which
    is a temporary one here)."""
    return Path(os.environ.get("DLMPIPE_DATA_DIR") or REPO.parent / "shared" / "data").resolve()


def failure_reason(proc: subprocess.CompletedProcess, what: str) -> str:
    """Why a dry run failed: Snakemake prints a workflow error (a campaign check, a missing data
    file) on stdout and tracebacks on stderr; both tails, the error lines first."""
    text = (proc.stdout or "") + "\n" + (proc.stderr or "")
    errors = [line for line in text.splitlines()
              if re.search(r"Error|error:|No such file|not found|missing", line)]
    hint = ""
    if not data_dir().is_dir():
        hint = (f"\n(the tasks' data files are looked up in {data_dir()}, which does not exist: "
                "set DLMPIPE_DATA_DIR to the directory holding them, docs/SCORING.md)")
    return (f"{what} failed (exit status {proc.returncode}); its errors:\n  "
            + "\n  ".join(errors[-12:] or ["(none named)"])
            + f"\n--- stdout (tail) ---\n{proc.stdout[-2500:]}\n--- stderr (tail) ---\n"
            f"{proc.stderr[-2500:]}{hint}")


def dry_run(snakefile: Path, workdir: Path, config: Path | None, what: str) -> tuple[float, dict[str, int]]:
    cmd = [sys.executable, "-m", "snakemake", "-s", str(snakefile), "--directory", str(workdir),
           "-n", "--quiet", "rules"] + (["--configfile", str(config)] if config else [])
    env = {**os.environ, "DLMPIPE_DATA_DIR": str(data_dir())}
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    took = time.perf_counter() - start
    if proc.returncode != 0 or "Job stats:" not in proc.stdout:
        raise SystemExit(failure_reason(proc, what))
    table = proc.stdout.split("Job stats:", 1)[1].split("Reasons:", 1)[0]
    counts = {m[0]: int(m[1]) for m in re.findall(r"^(\w+)\s+(\d+)\s*$", table, re.M)}
    return took, counts


#: bare Snakemake with the campaign's shape: the same wildcards and rules, each job one ``touch``
BARE = """
B, T, M, SHARDS = {backbones!r}, {tasks!r}, {methods!r}, {shards}
GEN = "results/generations/{{backbone}}/{{task}}/{{method}}"
OUT = GEN if SHARDS == 1 else GEN + ".shards/{{shard}}-of-" + str(SHARDS)

wildcard_constraints:
    backbone="|".join(B), task="|".join(T), method="|".join(M), shard=r"\\d+"

rule all:
    input:
        "results/summary.parquet", "results/plots/done", "results/sweeps/done", "results/tables/done"

rule prepare_backbone:
    output: "results/backbones/{{backbone}}/manifest.json"
    shell: "touch {{output}}"

rule prepare_task:
    output: "results/tasks/{{task}}.parquet"
    shell: "touch {{output}}"

rule generate:
    input:
        manifest="results/backbones/{{backbone}}/manifest.json",
        task="results/tasks/{{task}}.parquet",
    output: OUT + ".parquet", OUT + ".provenance.json"
    params: method=lambda w: w.method, seed=0
    threads: 1
    resources: gpu=1, mem_mb=2000, runtime=60
    shell: "touch {{output}}"

if SHARDS > 1:
    rule merge_generations:
        input: expand(OUT + ".parquet", shard=range(SHARDS), allow_missing=True)
        output: GEN + ".parquet", GEN + ".provenance.json"
        localrule: True
        shell: "touch {{output}}"

rule score:
    input:
        generations=GEN + ".parquet",
        task="results/tasks/{{task}}.parquet",
    output: "results/scores/{{backbone}}/{{task}}/{{method}}.parquet"
    resources: mem_mb=2000, runtime=30
    shell: "touch {{output}}"

rule time_method:
    input:
        manifest="results/backbones/{{backbone}}/manifest.json",
        task="results/tasks/{{task}}.parquet",
    output: "results/timing/{{backbone}}/{{task}}/{{method}}.parquet"
    params: method=lambda w: w.method, reference=lambda w: M[0]
    resources: gpu=1, mem_mb=2000, runtime=60
    shell: "touch {{output}}"

rule summarize:
    input:
        scores=expand("results/scores/{{b}}/{{t}}/{{m}}.parquet", b=B, t=T, m=M),
        timing=expand("results/timing/{{b}}/{{t}}/{{m}}.parquet", b=B, t=T, m=M),
    output: "results/summary.parquet", "results/summary.csv"
    localrule: True
    shell: "touch {{output}}"

rule plot:
    input: "results/summary.parquet"
    output: "results/plots/done"
    localrule: True
    shell: "touch {{output}}"

rule tables:
    input: "results/summary.parquet"
    output: "results/tables/done"
    localrule: True
    shell: "touch {{output}}"

rule plot_sweeps:
    input: "results/summary.parquet"
    output: "results/sweeps/done"
    localrule: True
    shell: "touch {{output}}"
"""


def bare_snakefile(path: Path, config: dict) -> Path:
    sweep = config["methods"]["archer"]["sweep"]  # 125 names of the campaign's pattern
    methods = [f"archer-k{k}-n{n}" for k in sweep["cache.K"] for n in sweep["sampler.n"]]
    path.write_text(BARE.format(backbones=list(config["backbones"]), tasks=list(config["tasks"]),
                                methods=methods, shards=config["shards"]))
    return path


def without_missing_data(spec: dict) -> dict:
    """The campaign with each task whose data file is not here replaced by a toy task of the
    same name (``benchmark: toy_code``; the same jobs, so the same shape), each one said."""
    import os

    from dlmpipe.campaign import Campaign, ConfigError

    os.environ["DLMPIPE_DATA_DIR"] = str(data_dir())
    try:
        Campaign(json.loads(json.dumps(spec)), str(REPO / "workflow/schemas/config.schema.yaml"))
        return spec
    except ConfigError as e:
        missing = sorted(set(re.findall(r"tasks\.(\w+)\.(?:source|base_source)", str(e))))
        if not missing:
            raise
    for t in missing:
        spec["tasks"][t] = {"benchmark": "toy_code", "n": 20, "seed": 1000, "gen_length": 256}
    print(f"(no data file of {', '.join(missing)} in {data_dir()}: planned as toy_code tasks of "
          "the same names, the same jobs; set DLMPIPE_DATA_DIR to plan the real ones)")
    return spec


def planning(repeat: int, shards: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        config = root / "campaign.yaml"
        spec = without_missing_data(campaign(root, shards))
        config.write_text(yaml.safe_dump(spec, sort_keys=False))
        bare = bare_snakefile(root / "Snakefile.bare", spec)
        times, bare_times = [], []
        for i in range(repeat):  # alternating, so load on a shared machine hits both alike
            workdir = root / f"run{i}"
            workdir.mkdir()
            took, counts = dry_run(REPO / "Snakefile", workdir, config, "the campaign's dry run")
            times.append(took)
            workdir = root / f"bare{i}"
            workdir.mkdir()
            took, bare_counts = dry_run(bare, workdir, None, "the bare Snakefile's dry run")
            bare_times.append(took)
        jobs, bare_jobs = counts.pop("total"), bare_counts.pop("total")
        print(f"planning (snakemake -n, from scratch), best of {repeat}:")
        print(f"  dlmpipe's workflow: {jobs} jobs in {min(times):.1f} s "
              f"({1e3 * min(times) / jobs:.2f} ms per job)")
        print("    " + ", ".join(f"{rule} {n}" for rule, n in counts.items()))
        print(f"  bare Snakemake, rules of the same shape: {bare_jobs} jobs in {min(bare_times):.1f} s "
              f"({1e3 * min(bare_times) / bare_jobs:.2f} ms per job)")
        print("    " + ", ".join(f"{rule} {n}" for rule, n in bare_counts.items()))
        for rule in ("generate", "score", "time_method"):
            if counts.get(rule) != bare_counts.get(rule):
                print(f"  WARNING: {rule}: {counts.get(rule)} jobs in the campaign, "
                      f"{bare_counts.get(rule)} in the bare Snakefile (not the same shape)")
        print(f"  ratio: {min(times) / min(bare_times):.2f}x the bare planning (goal: 1.5x at most)")


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
