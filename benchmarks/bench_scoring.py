"""On-demand benchmark (not in CI): what sandboxed scoring costs on this machine.

1. Per-program overhead: one trivial program scored through the sandbox at every level (bwrap,
   process+landlock+seccomp, each layer alone, plain process) against a bare
   ``subprocess.run([python, "-c", ...])`` of the same interpreter, interleaved.
2. Throughput: the canonical solutions of HumanEval+ and MBPP+ (base and plus suites) scored
   with the sandbox on, ``--workers`` at a time, at ``--sandbox`` (default: bwrap).

    python benchmarks/bench_scoring.py [--workers 0] [--repeat 50] [--skip-plus] [--sandbox L]

Data files come from ``$DLMPIPE_DATA_DIR`` or ``../shared/data`` (or ``--humaneval-plus`` /
``--mbpp-plus``).
"""
from __future__ import annotations

import argparse
import dataclasses
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


def interleaved(fns: dict, repeat: int) -> dict[str, list[float]]:
    """Time each function ``repeat`` times, one call of each in turn (machine drift hits all)."""
    for fn in fns.values():
        fn()  # warm caches
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            out[name].append(time.perf_counter() - start)
    return out


def overhead(repeat: int) -> None:
    """Every level this machine can run: bwrap, the process level with each subset of its
    confinement layers (the plain process level is what a kernel without them gets)."""
    process = isolation("process")
    levels = [isolation("bwrap")] if isolation("auto").level == "bwrap" else []
    subsets = [process.layers] + [(layer,) for layer in process.layers] + [()]
    for layers in dict.fromkeys(subsets):
        levels.append(dataclasses.replace(process, layers=layers,
                                          level="+".join(("process", *layers))))
    python = levels[0].python
    fns = {"bare": lambda: subprocess.run([python, "-I", "-c", PROGRAM + SUITE[0]["code"]],
                                          check=True)}
    for iso in levels:
        def run(iso=iso):
            assert run_suites(PROGRAM, SUITE, iso=iso).passed
        fns[iso.level] = run
    times = {name: statistics.median(t) for name, t in interleaved(fns, repeat).items()}
    print(f"per-program cost, median of {repeat} interleaved runs (interpreter {python}):")
    print(f"  {'bare subprocess':<28} {1e3 * times['bare']:7.1f} ms")
    for name, t in times.items():
        if name != "bare":
            print(f"  {name:<28} {1e3 * t:7.1f} ms   overhead {1e3 * (t - times['bare']):+6.1f} ms"
                  f"   x{t / times['bare']:.2f}")


def canonical(task: str, source: str | None, workers: int, sandbox: str | None) -> None:
    rows = load_task(task, **({"source": source} if source else {}))
    pairs = [({**r, "response_prefix": ""}, r["answer"]) for r in rows]
    start = time.perf_counter()
    results = score_many(pairs, workers, Settings(), sandbox=sandbox)
    elapsed = time.perf_counter() - start
    base = sum(r["passed"] for r in results)
    plus = sum(bool(r.get("plus_passed")) for r in results)
    n = len(results)
    print(f"{task}: {n} canonical solutions in {elapsed:.1f} s with {workers or os.cpu_count()} "
          f"workers ({n / elapsed:.2f} programs/s, {elapsed / n * 1e3:.0f} ms each); "
          f"base {base}/{n} ({100 * base / n:.1f}%), plus {plus}/{n} ({100 * plus / n:.1f}%), "
          f"isolation {', '.join(sorted({r['isolation'] for r in results}))}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--workers", type=int, default=0, help="parallel sandboxes (0: all cores)")
    p.add_argument("--repeat", type=int, default=50)
    p.add_argument("--skip-plus", action="store_true", help="only the overhead measurement")
    p.add_argument("--humaneval-plus", default=None)
    p.add_argument("--mbpp-plus", default=None)
    p.add_argument("--sandbox", default=None, help="level of the throughput runs (levels.py)")
    a = p.parse_args()
    iso = isolation(a.sandbox)
    print(f"isolation: {iso.level} ({iso.variant}), interpreter {iso.python}, {os.cpu_count()} cores")
    overhead(a.repeat)
    if not a.skip_plus:
        canonical("humaneval_plus", a.humaneval_plus, a.workers, a.sandbox)
        canonical("mbpp_plus", a.mbpp_plus, a.workers, a.sandbox)


if __name__ == "__main__":
    main()
