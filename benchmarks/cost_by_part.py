"""Where the test suite's and the default campaign's time goes, by part (issue 46): so the next
regression shows up as a file or a rule that grew, not as a CI run that no longer fits.

- ``suite``: from a pytest JUnit XML (``make test`` writes ``.test-results/junit.xml``): per
  test file its tests, the seconds its tests took (setup, call and teardown, module fixtures
  included, as pytest-xdist's workers report them) and its share, then the slowest tests.
  Where the XML has each test's CPU seconds (tests/conftest.py records them as ``cpu_s``), also
  those and an estimate for a machine ``--cpu-ratio`` times slower per core: a test's waiting
  (wall minus CPU: sleeps, limits, a cluster's polls) stays, its CPU is multiplied. The ratio is
  the caller's to measure (issue 46's Zen 1 ran the campaign's jobs 5.8x slower than a Sapphire
  Rapids, pure Python ~3.9x and compute-bound matrix products ~9.5x slower than a Zen 5);
  ``--cpu-ratio same-jobs:DIR``: that Zen 1's job-seconds over this machine's on the same jobs,
  DIR being the campaign of the commit the Zen 1 ran, run here (``same_jobs_ratio``; the
  best-founded); or ``--cpu-ratio measure``: this machine's float32 product rate per core scaled
  to that Zen 1 the way its decode jobs scaled against a Sapphire Rapids' (``zen1_ratio``; a
  model: on a Zen 3 whose clock drifts, products moved 68 -> 97 GFLOP/s where the decode jobs
  did not follow). With scripts/setup.sh's record of its last
  install, that install's estimate too, and the two together: ``make test`` from a fresh clone.
- ``campaign``: from a finished campaign's Snakemake metadata (``.snakemake/metadata`` in the
  directory Snakemake ran in): per rule its jobs, job-seconds (each job's start to end, once per
  job however many files it wrote), mean and longest job, and the run's span (first start to
  last end: the campaign's wall time when it ran whole), and the same estimate for a slower
  machine (job-seconds x ratio over its cores: the toy's jobs are CPU-bound).

Job-seconds, not wall time, are what a slower machine multiplies: on 2 cores a campaign's wall
time is at least its job-seconds over 2.

    python benchmarks/cost_by_part.py suite [JUNIT_XML] [--top 25] [--cpu-ratio R|same-jobs:DIR|measure] [--setup F]
    python benchmarks/cost_by_part.py campaign [WORKDIR] [--cpu-ratio R|same-jobs:DIR|measure]
"""
from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: issue 46's slowest machine, a 2 GHz Zen 1: float32 GFLOP/s per core on a 1024^3 product
ZEN1_GFLOPS = 12.0
#: how its decode jobs scaled against its products: 5.8x a Sapphire Rapids' job time where that
#: machine's products ran 115 / 12 = 9.6x as fast (issue 46's measurements), about 0.6
DECODE_PER_PRODUCT = 5.8 / (115.0 / ZEN1_GFLOPS)


def product_gflops(n: int = 1024) -> float:
    """This machine's float32 GFLOP/s on one core: an ``n``^3 matrix product, best of 5 x 5, under
    this process's kernels (run it with the ATEN_CPU_CAPABILITY the measured run had)."""
    import time

    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a, b = torch.randn(n, n), torch.randn(n, n)
        a @ b
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(5):
                a @ b
            best = min(best, (time.perf_counter() - start) / 5)
    finally:
        torch.set_num_threads(threads)
    return 2 * n ** 3 / best / 1e9


def zen1_ratio(gflops: float) -> float:
    """How many times slower per core than a machine whose products run at ``gflops`` the Zen 1
    is on the toy's decode work: the products' ratio times ``DECODE_PER_PRODUCT``."""
    return DECODE_PER_PRODUCT * gflops / ZEN1_GFLOPS


#: the commit whose default campaign issue 46's Zen 1 ran (main when the issue was filed: 176
#: jobs, its README's 4 min 36 s): each decode rule's jobs and their mean job-seconds there
#: ("about 20 s each", "about 27 s each"), its jobs with Snakemake metadata, and its Snakemake
#: run's wall time there (25 min 41 s)
REFERENCE_COMMIT = "6710ff6"
ZEN1_DECODE_JOBS = {"generate": (52, 20.0), "time_method": (52, 27.0)}
REFERENCE_JOBS = 175
ZEN1_CAMPAIGN_S = 25 * 60 + 41


def same_jobs_ratio(workdir: Path) -> tuple[float, float]:
    """(decode, span): how many times slower per core issue 46's Zen 1 ran the same jobs than
    the machine that ran ``workdir``, a finished ``make campaign`` of ``REFERENCE_COMMIT``. Decode:
    the Zen 1's job-seconds of the generate and time_method jobs (104 of the 176, 85% of the
    job-seconds) over this run's; span: its Snakemake run's wall time over this run's first start
    to last end (a cross-check; it holds scheduling too). The same code on both machines, so
    unlike ``measure`` it needs no model of how decode jobs scale with products; run it beside
    the measured suite or campaign (a VM's speed drifts)."""
    if not (workdir / ".snakemake" / "metadata").is_dir():
        raise ValueError(f"{workdir}: no Snakemake metadata there (a finished campaign's "
                         "directory holds .snakemake/metadata)")
    # the code that decoded: each generation's provenance (counts alone match later campaigns)
    revisions = {json.loads(f.read_text()).get("git_revision", "unknown")
                 for f in (workdir / "results" / "generations").glob("*/*/*.provenance.json")}
    if not revisions or any(not r.startswith(REFERENCE_COMMIT) or r.endswith("-dirty") for r in revisions):
        raise ValueError(f"{workdir}: its generations were decoded by dlmpipe "
                         f"{', '.join(sorted(revisions)) or '(none found)'}, not {REFERENCE_COMMIT}: "
                         f"run `git checkout {REFERENCE_COMMIT}` and `make campaign` in a scratch clone")
    per_rule, span = campaign_costs(workdir)
    counts = {rule: len(per_rule.get(rule, ())) for rule in ZEN1_DECODE_JOBS}
    jobs = sum(map(len, per_rule.values()))
    if counts != {rule: n for rule, (n, _) in ZEN1_DECODE_JOBS.items()} or jobs != REFERENCE_JOBS:
        want = ", ".join(f"{n} {rule}" for rule, (n, _) in ZEN1_DECODE_JOBS.items())
        raise ValueError(f"{workdir}: {jobs} finished jobs ({counts}), not {REFERENCE_COMMIT}'s "
                         f"default campaign ({REFERENCE_JOBS}: {want}): run "
                         f"`git checkout {REFERENCE_COMMIT}` and `make campaign` in a scratch clone")
    zen1 = sum(n * mean for n, mean in ZEN1_DECODE_JOBS.values())
    here = sum(sum(per_rule[rule]) for rule in ZEN1_DECODE_JOBS)
    return zen1 / here, ZEN1_CAMPAIGN_S / span


def cpu_ratio(value: str) -> float:
    """``--cpu-ratio``: a number; ``same-jobs:DIR`` (``same_jobs_ratio``'s decode ratio, both
    printed); or ``measure`` (``zen1_ratio`` of ``product_gflops``, printed)."""
    if value.startswith("same-jobs:"):
        workdir = Path(value.split(":", 1)[1])
        decode, span = same_jobs_ratio(workdir)
        print(f"issue 46's Zen 1 ran {REFERENCE_COMMIT}'s campaign x{decode:.2f} slower per core "
              f"than {workdir} ran it (its generate and time_method jobs; its span: x{span:.2f})")
        return decode
    if value != "measure":
        return float(value)
    gflops = product_gflops()
    ratio = zen1_ratio(gflops)
    print(f"this machine: {gflops:.0f} GFLOP/s per core (float32 1024^3 product, one thread); issue "
          f"46's Zen 1: {ZEN1_GFLOPS:g}; its decode jobs scale as {DECODE_PER_PRODUCT:.2f} of the "
          f"products' ratio: x{ratio:.2f}")
    return ratio


def suite_costs(junit: Path) -> tuple[dict[str, list[float]], list[tuple[float, str]]]:
    """``{test file: [seconds of each test]}`` and every (seconds, test id)."""
    per_file: dict[str, list[float]] = defaultdict(list)
    tests = []
    for name, case_id, seconds, _ in cases(junit):
        per_file[name].append(seconds)
        tests.append((seconds, case_id))
    return dict(per_file), sorted(tests, reverse=True)


def cases(junit: Path) -> list[tuple[str, str, float, float | None]]:
    """(test file, test id, seconds, CPU seconds or None) of each test case."""
    out = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = (module[1] if len(module) > 1 else module[0]) + ".py"
        cpu = next((float(p.get("value")) for p in case.iter("property") if p.get("name") == "cpu_s"), None)
        out.append((name, f"{name}::{case.get('name')}", float(case.get("time") or 0), cpu))
    return out


def slower_machine(junit: Path, ratio: float) -> dict[str, tuple[float, float, float]]:
    """``{test file: (seconds, CPU seconds, seconds on a machine ratio x slower per core)}`` for
    the files whose tests all carry CPU seconds: waiting (seconds - CPU, at least 0) + ratio x CPU."""
    out: dict[str, tuple[float, float, float]] = {}
    missing = set()
    for name, _, seconds, cpu in cases(junit):
        if cpu is None:
            missing.add(name)
            continue
        wall, c, slow = out.get(name, (0.0, 0.0, 0.0))
        out[name] = (wall + seconds, c + cpu, slow + max(seconds - cpu, 0.0) + ratio * cpu)
    return {k: v for k, v in out.items() if k not in missing}


def setup_there(record: Path, ratio: float) -> tuple[float, float, float] | None:
    """(wall, CPU seconds, seconds on a machine ``ratio`` x slower per core) of the last install
    scripts/setup.sh recorded (``.venv/.dlmpipe-setup-time.json``), or None where there is none.
    Its CPU-bound part (at most its wall time: compileall runs on every core) is multiplied, its
    waiting (downloads, apt) stays: ``max(wall - cpu, 0) + ratio * min(cpu, wall)``."""
    try:
        r = json.loads(record.read_text())
        wall, cpu = float(r["wall_s"]), float(r["cpu_s"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return wall, cpu, max(wall - cpu, 0.0) + ratio * min(cpu, wall)


def campaign_costs(workdir: Path) -> tuple[dict[str, list[float]], float]:
    """``{rule: [job-seconds of each job]}`` and the span from the first start to the last end."""
    jobs: dict[tuple, tuple[str, float, float]] = {}
    for f in (workdir / ".snakemake" / "metadata").iterdir():
        try:
            m = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if m.get("starttime") is None or m.get("endtime") is None or m.get("incomplete"):
            continue
        # one job, several outputs: the same hash and end; Snakemake stamps each output's start
        # on its own (microseconds apart), so the job starts at the earliest of them
        key = (m["rule"], m.get("job_hash"), m["endtime"])
        start = min(m["starttime"], jobs[key][1]) if key in jobs else m["starttime"]
        jobs[key] = (m["rule"], start, m["endtime"])
    per_rule: dict[str, list[float]] = defaultdict(list)
    for rule, start, end in jobs.values():
        per_rule[rule].append(end - start)
    span = (max(e for _, _, e in jobs.values()) - min(s for _, s, _ in jobs.values())) if jobs else 0.0
    return dict(per_rule), span


def table(rows: dict[str, list[float]], unit: str) -> list[str]:
    total = sum(sum(v) for v in rows.values()) or 1.0
    lines = [f"{'':<34} {unit:>6} {'seconds':>9} {'share':>6} {'mean':>7} {'max':>7}"]
    for name, secs in sorted(rows.items(), key=lambda kv: -sum(kv[1])):
        lines.append(f"{name:<34} {len(secs):>6} {sum(secs):>9.1f} {sum(secs) / total:>6.1%} "
                     f"{sum(secs) / len(secs):>7.2f} {max(secs):>7.2f}")
    lines.append(f"{'total':<34} {sum(len(v) for v in rows.values()):>6} {total:>9.1f}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="what", required=True)
    s = sub.add_parser("suite")
    s.add_argument("junit", nargs="?", type=Path, default=REPO / ".test-results" / "junit.xml")
    s.add_argument("--top", type=int, default=25)
    ratio_help = ("how many times slower per core the machine to estimate for is; "
                  f"'same-jobs:DIR' (issue 46's Zen 1 against DIR, {REFERENCE_COMMIT}'s default "
                  "campaign run here: the same jobs on both); or 'measure' (this machine's "
                  "products against that Zen 1's); default: that Zen 1's measured job ratio "
                  "against a Sapphire Rapids")
    s.add_argument("--cpu-ratio", default="5.8", help=ratio_help)
    s.add_argument("--workers", type=int, default=2, help="test workers there (make test: one per core)")
    s.add_argument("--setup", type=Path, default=REPO / ".venv" / ".dlmpipe-setup-time.json",
                   help="scripts/setup.sh's record of its last install (make test from a fresh "
                        "clone is that install and the tests)")
    c = sub.add_parser("campaign")
    c.add_argument("workdir", nargs="?", type=Path, default=REPO)
    c.add_argument("--cpu-ratio", default="5.8", help=ratio_help)
    c.add_argument("--cores", type=int, default=2, help="cores there (make campaign: all of them)")
    a = ap.parse_args(argv)
    try:
        ratio = cpu_ratio(a.cpu_ratio)
    except ValueError as e:
        ap.error(str(e))
    if a.what == "suite":
        if not a.junit.is_file():
            ap.error(f"{a.junit.resolve()}: no JUnit XML there (make test writes one)")
        per_file, tests = suite_costs(a.junit)
        print(f"test suite by file ({a.junit}): seconds of test time, summed over the workers")
        print("\n".join(table(per_file, "tests")))
        print(f"\nslowest {a.top} tests:")
        print("\n".join(f"{s:9.1f}  {name}" for s, name in tests[:a.top]))
        slow = slower_machine(a.junit, ratio)
        if slow:
            print(f"\nby file, CPU seconds and an estimate for a machine {ratio:.3g}x slower per "
                  "core (waiting stays, CPU x ratio):")
            print(f"{'':<34} {'seconds':>9} {'cpu':>9} {'there':>9}")
            for name, (wall, cpu, there) in sorted(slow.items(), key=lambda kv: -kv[1][2]):
                print(f"{name:<34} {wall:>9.1f} {cpu:>9.1f} {there:>9.1f}")
            total = sum(v[2] for v in slow.values())
            print(f"{'total':<34} {sum(v[0] for v in slow.values()):>9.1f} "
                  f"{sum(v[1] for v in slow.values()):>9.1f} {total:>9.1f}")
            tests_there = total / a.workers
            print(f"there on {a.workers} workers: at least {tests_there / 60:.1f} min of tests")
            setup = setup_there(a.setup, ratio)
            if setup is None:
                print(f"(no setup record at {a.setup}: scripts/setup.sh writes one when it installs)")
            else:
                wall, cpu, there = setup
                print(f"setup, its last install ({a.setup}): {wall:.0f} s, {cpu:.0f} CPU s, about "
                      f"{there / 60:.1f} min there; make test from a fresh clone there: at least "
                      f"{(there + tests_there) / 60:.1f} min")
    else:
        if not (a.workdir / ".snakemake" / "metadata").is_dir():
            ap.error(f"{(a.workdir / '.snakemake' / 'metadata').resolve()}: no Snakemake metadata there")
        per_rule, span = campaign_costs(a.workdir)
        print(f"campaign by rule ({a.workdir.resolve()}): job-seconds")
        print("\n".join(table(per_rule, "jobs")))
        print(f"span, first job's start to last job's end: {span:.0f} s")
        total = sum(sum(v) for v in per_rule.values())
        print(f"on a machine {ratio:.3g}x slower per core, {a.cores} cores: at least "
              f"{total * ratio / a.cores / 60:.1f} min")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
