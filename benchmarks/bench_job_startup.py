"""On-demand benchmark (not in CI): how long each kind of job takes to start, beside
``python -c "import torch"`` (the floor of any job that runs the model).

Every job is the workflow's command line (``python -m dlmpipe <job> ...``) on the shipped toy and
its toy_arith task, run as a fresh process ``--repeat`` times; the median is printed:

- ``generate`` and ``time-method``: from the process's spawn to the model's first forward (the
  command runs under a small wrapper that ends the process there, so the times contain no
  decoding; the wrapper's own imports are the standard library's);
- ``score``: the whole job on a generate job's 8 generations (answer matching, no model): for a
  job this small, all of it is start-up.

Each line also says which of torch / transformers / pandas the job had imported by then. The
machine may be shared: the numbers are medians of several runs for that reason.

    python benchmarks/bench_job_startup.py [--repeat 7]
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

REPO = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "transformers", "pandas")

#: runs ``python -m dlmpipe ARGS`` and ends the process at the model's first forward (or at its
#: end), printing the heavy modules it had imported; argv[1] is where to write them
WRAPPER = r"""
import importlib.abc, importlib.util, json, os, runpy, sys
OUT = sys.argv[1]
HEAVY = %r
FORWARDS = ("forward", "hidden_states", "hidden_states_storing_kv", "layer", "qkv", "logits")

def report():
    with open(OUT, "w") as f:
        json.dump(sorted(m for m in HEAVY if m in sys.modules), f)

class FirstForward(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "dlmpipe.backbones.model":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run = spec.loader.exec_module
        def exec_module(module):
            run(module)
            def first_forward(self, *args, **kwargs):
                report()
                os._exit(0)
            for name in FORWARDS:  # every way a decode computes with the model
                setattr(module.Backbone, name, first_forward)
        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, FirstForward())
sys.argv = ["dlmpipe", *sys.argv[2:]]
try:
    runpy.run_module("dlmpipe", run_name="__main__", alter_sys=True)
finally:
    report()
""" % (HEAVY,)

METHOD = {"name": "llada-confidence", "sampler": {"name": "llada_confidence"},
          "cache": {"name": "none"}, "gen_length": 32}


def env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def dlmpipe(*args: str, cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "dlmpipe", *args], cwd=cwd, env=env(), check=True,
                   capture_output=True)


def timed(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env(), capture_output=True, text=True)
    took = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    return took


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeat", type=int, default=7)
    a = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        dlmpipe("prepare-backbone", "--path", str(REPO / "dlmpipe/shipped/toy"), "--name", "toy",
                "--out", "manifest.json", cwd=d)
        dlmpipe("prepare-task", "--name", "toy_arith", "--options", '{"n": 8}', "--out", "task.parquet",
                cwd=d)
        model = ["--manifest", "manifest.json", "--task-file", "task.parquet", "--method",
                 json.dumps(METHOD), "--device", "cpu"]
        dlmpipe("generate", *model, "--out", "gen.parquet", "--provenance", "gen.json", cwd=d)
        (d / "wrapper.py").write_text(WRAPPER)
        jobs = {
            'python -c "import torch"': [sys.executable, "-c", "import torch"],
            "generate": [sys.executable, "wrapper.py", "mods.json", "generate", *model,
                         "--out", "g2.parquet", "--provenance", "g2.json"],
            "time-method": [sys.executable, "wrapper.py", "mods.json", "time-method", *model,
                            "--samples", "2", "--repeats", "1", "--out", "t.parquet"],
            "score": [sys.executable, "wrapper.py", "mods.json", "score", "--generations",
                      "gen.parquet", "--task-file", "task.parquet", "--out", "s.parquet",
                      "--workers", "1", "--sandbox", "process"],
        }
        times: dict[str, list[float]] = {name: [] for name in jobs}
        imported: dict[str, list[str]] = {}
        for _ in range(a.repeat):  # interleaved, so a burst of load hits every kind alike
            for name, cmd in jobs.items():
                times[name].append(timed(cmd, d))
                if (d / "mods.json").exists():
                    imported[name] = json.loads((d / "mods.json").read_text())
                    (d / "mods.json").unlink()
    floor = statistics.median(times['python -c "import torch"'])
    print(f"job start-up, median of {a.repeat} (min-max), python {sys.version.split()[0]}:")
    for name, ts in times.items():
        med = statistics.median(ts)
        extra = "" if name not in imported else (
            f"   {med - floor:+.2f} s vs import torch; imported: "
            f"{', '.join(imported[name]) or 'none'} of {'/'.join(HEAVY)}")
        print(f"  {name:26s} {med:5.2f} s ({min(ts):.2f}-{max(ts):.2f}){extra}")


if __name__ == "__main__":
    main()
