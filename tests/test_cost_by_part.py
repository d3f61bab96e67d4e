"""benchmarks/cost_by_part.py: the suite's cost by test file and a campaign's by rule."""
from __future__ import annotations

import importlib.util
import json

import pytest

from .workflow import REPO

pytest_plugins = ["pytester"]

spec = importlib.util.spec_from_file_location("cost_by_part", REPO / "benchmarks" / "cost_by_part.py")
cost_by_part = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cost_by_part)


def test_suite_costs_sum_each_files_tests(tmp_path):
    junit = tmp_path / "junit.xml"
    junit.write_text("""<testsuites><testsuite>
      <testcase classname="tests.test_a" name="t1" time="1.5"/>
      <testcase classname="tests.test_a" name="t2" time="2.0"/>
      <testcase classname="tests.test_b" name="t[x]" time="0.25"/>
    </testsuite></testsuites>""")
    per_file, tests = cost_by_part.suite_costs(junit)
    assert per_file == {"test_a.py": [1.5, 2.0], "test_b.py": [0.25]}
    assert tests[0] == (2.0, "test_a.py::t2")


def test_campaign_costs_count_a_job_once_however_many_files_it_wrote(tmp_path, capsys):
    meta = tmp_path / ".snakemake" / "metadata"
    meta.mkdir(parents=True)
    # two outputs of one job: Snakemake stamps each output's start on its own, microseconds apart
    records = [("generate", 1, 100.0, 110.0), ("generate", 1, 100.00009, 110.0),
               ("generate", 2, 105.0, 108.0), ("score", 3, 110.0, 111.0),
               ("score", 4, 111.0, None)]  # unfinished: not counted
    for i, (rule, h, start, end) in enumerate(records):
        (meta / str(i)).write_text(json.dumps({"rule": rule, "job_hash": h, "starttime": start,
                                               "endtime": end, "incomplete": end is None}))
    per_rule, span = cost_by_part.campaign_costs(tmp_path)
    assert {r: sorted(v) for r, v in per_rule.items()} == {"generate": [3.0, 10.0], "score": [1.0]}
    assert span == 11.0
    assert cost_by_part.main(["campaign", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "generate" in out and "13.0" in out and "span" in out


def test_a_slower_machine_multiplies_cpu_seconds_and_keeps_waiting(tmp_path, capsys):
    junit = tmp_path / "junit.xml"
    junit.write_text("""<testsuites><testsuite>
      <testcase classname="tests.test_a" name="busy" time="2.0"><properties>
        <property name="cpu_s" value="2.0"/></properties></testcase>
      <testcase classname="tests.test_a" name="waits" time="5.0"><properties>
        <property name="cpu_s" value="0.5"/></properties></testcase>
      <testcase classname="tests.test_b" name="unmeasured" time="1.0"/>
    </testsuite></testsuites>""")
    # busy: 2 x 6; waits: 4.5 s of waiting + 0.5 x 6; test_b has no CPU seconds: left out
    assert cost_by_part.slower_machine(junit, 6.0) == {"test_a.py": (7.0, 2.5, 12.0 + 4.5 + 3.0)}
    assert cost_by_part.main(["suite", str(junit), "--cpu-ratio", "6", "--workers", "2"]) == 0
    assert "19.5" in capsys.readouterr().out


def test_measure_scales_this_machines_products_to_the_zen_1(tmp_path, capsys, monkeypatch):
    """``--cpu-ratio measure``: this machine's product rate against the Zen 1's, times how its
    decode jobs scaled: a Sapphire Rapids' 115 GFLOP/s gives the 5.8 measured there, a machine
    half as fast half of it; suite and campaign estimates use that ratio."""
    assert abs(cost_by_part.zen1_ratio(115.0) - 5.8) < 1e-9
    assert abs(cost_by_part.zen1_ratio(57.5) - 2.9) < 1e-9
    assert cost_by_part.product_gflops(64) > 0  # the real measurement, on a small product
    junit = tmp_path / "junit.xml"
    junit.write_text("""<testsuites><testsuite>
      <testcase classname="tests.test_a" name="busy" time="60.0"><properties>
        <property name="cpu_s" value="60.0"/></properties></testcase>
    </testsuite></testsuites>""")
    monkeypatch.setattr(cost_by_part, "product_gflops", lambda: 57.5)
    assert cost_by_part.main(["suite", str(junit), "--cpu-ratio", "measure", "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "58 GFLOP/s per core" in out and "x2.90" in out
    assert "at least 2.9 min of tests" in out  # 60 CPU s x 2.9 on one worker
    meta = tmp_path / ".snakemake" / "metadata"
    meta.mkdir(parents=True)
    (meta / "0").write_text(json.dumps({"rule": "generate", "job_hash": 1, "starttime": 0.0,
                                        "endtime": 120.0, "incomplete": False}))
    assert cost_by_part.main(["campaign", str(tmp_path), "--cpu-ratio", "measure", "--cores", "2"]) == 0
    assert "2.9x slower per core, 2 cores: at least 2.9 min" in capsys.readouterr().out


def _campaign(workdir, jobs: dict[str, tuple[int, float]], gap: float = 0.0,
              revision: str = "6710ff6e09ab7f3f922b16ce236d0a3ce84ffe4d") -> None:
    """Snakemake metadata of finished jobs: ``{rule: (jobs, seconds each)}``, one after another
    with ``gap`` seconds between them, and a generation's provenance naming ``revision``."""
    meta = workdir / ".snakemake" / "metadata"
    meta.mkdir(parents=True)
    generation = workdir / "results" / "generations" / "toy" / "toy_arith"
    generation.mkdir(parents=True)
    (generation / "llada-confidence.provenance.json").write_text(json.dumps({"git_revision": revision}))
    t, i = 0.0, 0
    for rule, (n, seconds) in jobs.items():
        for _ in range(n):
            (meta / str(i)).write_text(json.dumps({"rule": rule, "job_hash": i, "starttime": t,
                                                   "endtime": t + seconds, "incomplete": False}))
            t, i = t + seconds + gap, i + 1


def test_same_jobs_ratio_divides_the_zen_1s_job_seconds_by_this_runs(tmp_path, capsys):
    """``--cpu-ratio same-jobs:DIR``: the reference commit's campaign run here at 5 and 6.75 s a
    decode job where the Zen 1 took 20 and 27: x4 on its decode jobs (whatever the other 71 jobs
    took); the span's ratio is the Zen 1's 1541 s over this run's. Another campaign (other job
    counts, or the same counts decoded by other code: later commits keep them) or a directory
    without metadata is refused, saying which commit to run."""
    others = cost_by_part.REFERENCE_JOBS - 104
    _campaign(tmp_path, {"generate": (52, 5.0), "time_method": (52, 6.75), "score": (others, 0.5)})
    decode, span = cost_by_part.same_jobs_ratio(tmp_path)
    assert abs(decode - 4.0) < 1e-9
    assert abs(span - 1541 / (52 * 5.0 + 52 * 6.75 + others * 0.5)) < 1e-9
    junit = tmp_path / "junit.xml"
    junit.write_text("""<testsuites><testsuite>
      <testcase classname="tests.test_a" name="busy" time="60.0"><properties>
        <property name="cpu_s" value="60.0"/></properties></testcase>
    </testsuite></testsuites>""")
    assert cost_by_part.main(["suite", str(junit), "--cpu-ratio", f"same-jobs:{tmp_path}",
                              "--workers", "1"]) == 0
    out = capsys.readouterr().out
    assert "x4.00 slower per core" in out and "at least 4.0 min of tests" in out  # 60 CPU s x 4
    other = tmp_path / "other"
    _campaign(other, {"generate": (26, 5.0), "time_method": (52, 6.75), "score": (others, 0.5)})
    later, edited = tmp_path / "later", tmp_path / "edited"
    _campaign(later, {"generate": (52, 5.0), "time_method": (52, 6.75), "score": (others, 0.5)},
              revision="a83fbe9" + "0" * 33)
    _campaign(edited, {"generate": (52, 5.0), "time_method": (52, 6.75), "score": (others, 0.5)},
              revision="6710ff6e09ab7f3f922b16ce236d0a3ce84ffe4d-dirty")
    for workdir, says in ((other, "not 6710ff6's default campaign"), (tmp_path / "none", "no Snakemake metadata"),
                          (later, "decoded by dlmpipe a83fbe9"), (edited, "-dirty, not 6710ff6")):
        with pytest.raises(SystemExit):
            cost_by_part.main(["suite", str(junit), "--cpu-ratio", f"same-jobs:{workdir}"])
        assert says in capsys.readouterr().err


def test_each_test_records_its_cpu_seconds(pytester):
    """tests/cpu_time.py's hooks write ``cpu_s`` into the JUnit XML: a busy test's is about its
    busy time, a sleeping one's about none."""
    pytester.makepyfile(test_x="""
import time
def test_busy():
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
def test_sleeps():
    time.sleep(0.3)
""")
    junit = pytester.path / "junit.xml"
    pytester.runpytest("-p", "tests.cpu_time", f"--junitxml={junit}").assert_outcomes(passed=2)
    cpu = {case_id.split("::")[1]: c for _, case_id, _, c in cost_by_part.cases(junit)}
    assert cpu["test_busy"] >= 0.3 and cpu["test_sleeps"] < 0.1, cpu


def test_setup_scales_its_cpu_and_keeps_its_waiting_and_adds_to_the_suite(tmp_path, capsys):
    """scripts/setup.sh's record (wall and CPU seconds of its last install): downloads stay,
    CPU-bound time is multiplied (at most the wall time of it: compileall runs on every core),
    and ``make test`` from a fresh clone there is that plus the tests."""
    record = tmp_path / "setup.json"
    record.write_text(json.dumps({"wall_s": 100.0, "cpu_s": 40.0}))
    assert cost_by_part.setup_there(record, 3.0) == (100.0, 40.0, 60.0 + 120.0)
    record.write_text(json.dumps({"wall_s": 50.0, "cpu_s": 80.0}))  # on 2 cores: 50 s of CPU-bound wall
    assert cost_by_part.setup_there(record, 3.0) == (50.0, 80.0, 150.0)
    assert cost_by_part.setup_there(tmp_path / "none.json", 3.0) is None
    junit = tmp_path / "junit.xml"
    junit.write_text("""<testsuites><testsuite>
      <testcase classname="tests.test_a" name="busy" time="60.0"><properties>
        <property name="cpu_s" value="60.0"/></properties></testcase>
    </testsuite></testsuites>""")
    assert cost_by_part.main(["suite", str(junit), "--cpu-ratio", "3", "--workers", "1",
                              "--setup", str(record)]) == 0
    out = capsys.readouterr().out
    # tests 60 x 3 = 180 s, setup 150 s: 5.5 min
    assert "at least 3.0 min of tests" in out and "about 2.5 min there" in out
    assert "fresh clone there: at least 5.5 min" in out
    assert cost_by_part.main(["suite", str(junit), "--cpu-ratio", "3", "--setup", str(tmp_path / "x")]) == 0
    assert "no setup record" in capsys.readouterr().out


def test_setup_recorded_the_install_this_suite_runs_in():
    """scripts/setup.sh writes its record beside its stamp whenever it installs: where this suite
    runs in the repository's .venv (make test), the record of that install is there."""
    from .workflow import skip_unless_in_setup_venv

    venv = skip_unless_in_setup_venv()
    wall, cpu, there = cost_by_part.setup_there(venv / ".dlmpipe-setup-time.json", 2.0)
    assert wall > 1 and cpu > 1 and there >= wall  # an install of torch takes seconds
