"""Where the test suite's and the default campaign's time goes, by part (issue 46): so the next
regression shows up as a file or a rule that grew, not as a CI run that no longer fits.

- ``suite``: from a pytest JUnit XML (``make test`` writes ``.test-results/junit.xml``): per
  test file its tests, the seconds its tests took (setup, call and teardown, module fixtures
  included, as pytest-xdist's workers report them) and its share, then the slowest tests.
- ``campaign``: from a finished campaign's Snakemake metadata (``.snakemake/metadata`` in the
  directory Snakemake ran in): per rule its jobs, job-seconds (each job's start to end, once per
  job however many files it wrote), mean and longest job, and the run's span (first start to
  last end: the campaign's wall time when it ran whole).

Job-seconds, not wall time, are what a slower machine multiplies: on 2 cores a campaign's wall
time is at least its job-seconds over 2.

    python benchmarks/cost_by_part.py suite [JUNIT_XML] [--top 25]
    python benchmarks/cost_by_part.py campaign [WORKDIR]
"""
from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def suite_costs(junit: Path) -> tuple[dict[str, list[float]], list[tuple[float, str]]]:
    """``{test file: [seconds of each test]}`` and every (seconds, test id)."""
    per_file: dict[str, list[float]] = defaultdict(list)
    tests = []
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        name = (module[1] if len(module) > 1 else module[0]) + ".py"
        seconds = float(case.get("time") or 0)
        per_file[name].append(seconds)
        tests.append((seconds, f"{name}::{case.get('name')}"))
    return dict(per_file), sorted(tests, reverse=True)


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
    c = sub.add_parser("campaign")
    c.add_argument("workdir", nargs="?", type=Path, default=REPO)
    a = ap.parse_args(argv)
    if a.what == "suite":
        if not a.junit.is_file():
            ap.error(f"{a.junit.resolve()}: no JUnit XML there (make test writes one)")
        per_file, tests = suite_costs(a.junit)
        print(f"test suite by file ({a.junit}): seconds of test time, summed over the workers")
        print("\n".join(table(per_file, "tests")))
        print(f"\nslowest {a.top} tests:")
        print("\n".join(f"{s:9.1f}  {name}" for s, name in tests[:a.top]))
    else:
        if not (a.workdir / ".snakemake" / "metadata").is_dir():
            ap.error(f"{(a.workdir / '.snakemake' / 'metadata').resolve()}: no Snakemake metadata there")
        per_rule, span = campaign_costs(a.workdir)
        print(f"campaign by rule ({a.workdir.resolve()}): job-seconds")
        print("\n".join(table(per_rule, "jobs")))
        print(f"span, first job's start to last job's end: {span:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
