"""On-demand benchmark (not in CI): what sandboxed scoring costs on this machine.

1. Per-program overhead: one trivial program scored through the sandbox (bwrap, process) against
   a bare ``subprocess.run([python, "-c", ...])`` of the same interpreter.
2. Throughput: the canonical solutions of HumanEval+ and MBPP+ (base and plus suites) scored
   with the sandbox on, ``--workers`` at a time.

    python benchmarks/bench_scoring.py [--workers 0] [--repeat 50] [--skip-plus]

Data files come from ``$DLMPIPE_DATA_DIR`` or ``../shared/data`` (or ``--humaneval-plus`` /
``--mbpp-plus``).
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dlmpipe.scoring.code import Settings  # noqa: E402
from dlmpipe.scoring.levels import isolation  # noqa: E402
from dlmpipe.scoring.sandbox import run_suites  # noqa: E402
from dlmpipe.scoring.score import score_many  # noqa: E402
from dlmpipe.tasks.registry import load_task  # noqa: E402

PROGRAM = "def f(x):\n    return x + 1\n"
SUITE = [{"name": "base", "format": "assert", "code": "assert f(1) == 2\n"}]


def timed(fn, repeat: int) -> list[float]:
    fn()  # warm caches
    out = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        out.append(time.perf_counter() - start)
    return out


def overhead(repeat: int) -> None:
    levels = [isolation()]
    if levels[0].level == "bwrap":
        levels.append(isolation("process"))
    python = levels[0].python
    bare = timed(lambda: subprocess.run([python, "-I", "-c", PROGRAM + SUITE[0]["code"]],
                                        check=True), repeat)
    print(f"per-program cost over {repeat} runs (median, interpreter {python}):")
    print(f"  bare subprocess          {1e3 * statistics.median(bare):7.1f} ms")
    for iso in levels:
        def run(iso=iso):
            assert run_suites(PROGRAM, SUITE, iso=iso).passed
        t = timed(run, repeat)
        print(f"  sandbox {iso.level:<8} ({iso.variant:<7}) {1e3 * statistics.median(t):7.1f} ms"
              f"   overhead {1e3 * (statistics.median(t) - statistics.median(bare)):+6.1f} ms")


def canonical(task: str, source: str | None, workers: int) -> None:
    rows = load_task(task, **({"source": source} if source else {}))
    pairs = [({**r, "response_prefix": ""}, r["answer"]) for r in rows]
    start = time.perf_counter()
    results = score_many(pairs, workers, Settings())
    elapsed = time.perf_counter() - start
    base = sum(r["passed"] for r in results)
    plus = sum(bool(r.get("plus_passed")) for r in results)
    n = len(results)
    print(f"{task}: {n} canonical solutions in {elapsed:.1f} s with {workers or os.cpu_count()} "
          f"workers ({n / elapsed:.2f} programs/s, {elapsed / n * 1e3:.0f} ms each); "
          f"base {base}/{n} ({100 * base / n:.1f}%), plus {plus}/{n} ({100 * plus / n:.1f}%)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workers", type=int, default=0, help="parallel sandboxes (0: all cores)")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--skip-plus", action="store_true", help="only the overhead measurement")
    p.add_argument("--humaneval-plus", default=None)
    p.add_argument("--mbpp-plus", default=None)
    a = p.parse_args()
    iso = isolation()
    print(f"isolation: {iso.level} ({iso.variant}), interpreter {iso.python}, {os.cpu_count()} cores")
    overhead(a.repeat)
    if not a.skip_plus:
        canonical("humaneval_plus", a.humaneval_plus, a.workers)
        canonical("mbpp_plus", a.mbpp_plus, a.workers)


if __name__ == "__main__":
    main()
