"""Sharded generation and faults: `shards: N` splits each (backbone, task, method) into N generate
jobs over disjoint sample ranges that merge_generations joins (checked: every sample once, in
order), sharded and unsharded runs decode the same tokens, and a generate job SIGKILLed under
Snakemake resumes from its journal on the rerun and on Snakemake's own retry, losing and
duplicating nothing."""
from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from dlmpipe.campaign import Campaign
from dlmpipe.cli import main
from dlmpipe.shards import merge_shards, shard_range

from .workflow import (CONFIGS, REPO, REPORT_JOBS, expected_counts, fake_finished_run, job_counts, scheduled,
                       timing_jobs)

# ---- the merge ----------------------------------------------------------------------------------
ROW_SCHEMA = pa.schema([("sample_index", pa.int64()), ("task_id", pa.string()),
                        ("token_ids", pa.list_(pa.int64())), ("backbone", pa.string()),
                        ("task", pa.string()), ("method", pa.string()), ("device", pa.string())])


def _task_file(tmp_path: Path, n: int) -> Path:
    path = tmp_path / "task.parquet"
    pq.write_table(pa.table({"task_id": [f"t/{i}" for i in range(n)]}), path)
    return path


def _shard(tmp_path: Path, name: str, indices, method="m", host="a") -> tuple[str, str]:
    rows = [{"sample_index": i, "task_id": f"t/{i}", "token_ids": [i, i + 1], "backbone": "b",
             "task": "t", "method": method, "device": f"cuda:{host}"} for i in indices]
    path = tmp_path / f"{name}.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=ROW_SCHEMA), path)
    prov = tmp_path / f"{name}.provenance.json"
    prov.write_text(json.dumps({"seed": 0, "config_hash": "h", "host": host, "device": f"cuda:{host}"}))
    return str(path), str(prov)


def _shards(tmp_path, n, k, **kw):
    files = [_shard(tmp_path, f"s{i}", shard_range(n, f"{i}/{k}"), **kw) for i in range(k)]
    return [f for f, _ in files], [p for _, p in files]


@pytest.mark.parametrize("n,k", [(10, 3), (7, 7), (2, 4), (1, 1)])
def test_merge_orders_every_sample_once(tmp_path, n, k):
    task = _task_file(tmp_path, n)
    files, provs = _shards(tmp_path, n, k)
    out, prov = tmp_path / "out.parquet", tmp_path / "out.provenance.json"
    merge_shards(files, str(task), str(out), str(prov), shard_provenance=provs)
    rows = pq.read_table(out).to_pylist()
    assert [r["sample_index"] for r in rows] == list(range(n))
    assert [r["token_ids"] for r in rows] == [[i, i + 1] for i in range(n)]
    record = json.loads(prov.read_text())
    assert record["seed"] == 0 and record["config_hash"] == "h" and record["host"] == "a"
    assert [s["shard"] for s in record["shards"]] == [f"{i}/{k}" for i in range(k)]
    assert [tuple(s["samples"]) for s in record["shards"]] == [
        (shard_range(n, f"{i}/{k}").start, shard_range(n, f"{i}/{k}").stop) for i in range(k)]
    assert not list(tmp_path.glob(".*.tmp"))


def test_merge_keeps_what_shards_disagree_on_per_shard(tmp_path, capsys):
    task = _task_file(tmp_path, 4)
    (f0, p0), (f1, p1) = _shard(tmp_path, "s0", [0, 1], host="a"), _shard(tmp_path, "s1", [2, 3], host="b")
    prov = tmp_path / "out.provenance.json"
    record = merge_shards([f0, f1], str(task), str(tmp_path / "out.parquet"), str(prov), [p0, p1])
    assert "host" not in record and [s["host"] for s in record["shards"]] == ["a", "b"]
    assert record["devices"] == ["cuda:a", "cuda:b"]
    assert "different devices" in capsys.readouterr().out
    assert json.loads(prov.read_text()) == record


def test_shards_of_different_environments_merge_keeping_each_rows_fingerprint(tmp_path, capsys):
    task = _task_file(tmp_path, 4)
    files = []
    for name, indices, fp in (("s0", [0, 1], "aaaaaaaaaaaa"), ("s1", [2, 3], "bbbbbbbbbbbb")):
        path, _ = _shard(tmp_path, name, indices)
        pq.write_table(pq.read_table(path).append_column("fingerprint", pa.array([fp] * 2)), path)
        files.append(path)
    out = tmp_path / "out.parquet"
    merge_shards(files, str(task), str(out), str(tmp_path / "out.provenance.json"))
    assert pq.read_table(out).column("fingerprint").to_pylist() == ["aaaaaaaaaaaa"] * 2 + ["bbbbbbbbbbbb"] * 2
    assert "shards decoded in different environments" in capsys.readouterr().out


@pytest.mark.parametrize("case,match", [
    ("duplicate", r"sample 2 is in two shards"),
    ("repeated", r"sample 1 appears 2 times"),
    ("missing", r"lacks sample\(s\) \[3\]"),
    ("foreign", r"sample 1 does not belong to shard 1/2"),
    ("mixed", r"shards disagree on method"),
    ("other-task", r"task_id 't/0' .* but 'x/0'"),
])
def test_merge_refuses_bad_shards_and_writes_nothing(tmp_path, case, match):
    task = _task_file(tmp_path, 4)
    s0, s1 = {
        "duplicate": ([0, 1, 2], [2, 3]),
        "repeated": ([0, 1, 1], [2, 3]),
        "missing": ([0, 1], [2]),
        "foreign": ([0], [1, 2, 3]),
        "mixed": ([0, 1], [2, 3]),
        "other-task": ([0, 1], [2, 3]),
    }[case]
    f0, _ = _shard(tmp_path, "s0", s0)
    f1, _ = _shard(tmp_path, "s1", s1, method="other" if case == "mixed" else "m")
    if case == "other-task":
        pq.write_table(pa.table({"task_id": [f"x/{i}" for i in range(4)]}), task)
    out = tmp_path / "out.parquet"
    with pytest.raises(ValueError, match=match):
        merge_shards([f0, f1], str(task), str(out), str(tmp_path / "p.json"))
    assert not out.exists() and not (tmp_path / "p.json").exists()


def test_merge_command_reports_errors_and_never_imports_torch(tmp_path, capsys):
    """The refusal runs in this process (the command's parser, job function and error handling:
    ``python -m dlmpipe`` exits with ``main``'s status); the merge runs in a process where
    importing torch fails."""
    task = _task_file(tmp_path, 4)
    f0, p0 = _shard(tmp_path, "s0", [0, 1])
    f1, p1 = _shard(tmp_path, "s1", [2])
    args = ["merge-generations", "--shards", f0, f1, "--shard-provenance", p0, p1,
            "--task-file", str(task), "--out", str(tmp_path / "o.parquet"),
            "--provenance", str(tmp_path / "o.json")]
    code = ("import sys; sys.modules['torch'] = None\n"  # any `import torch` now fails
            f"from dlmpipe.cli import main\nsys.exit(main({args!r}))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    capsys.readouterr()
    code_in_process = main(args)
    err = capsys.readouterr().err
    assert code_in_process == 2 and "lacks sample(s) [3]" in err, err
    assert not (tmp_path / "o.parquet").exists()
    _shard(tmp_path, "s1", [2, 3])
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert pq.read_table(tmp_path / "o.parquet").column("sample_index").to_pylist() == [0, 1, 2, 3]


def test_journal_drops_a_partial_line_before_appending(tmp_path):
    """A job killed mid-write leaves half a line; the resumed job must not glue its next sample
    onto it (the line would be unreadable and every later sample lost on the next resume)."""
    from dlmpipe.generate import Journal

    path, identity = tmp_path / "x.journal.jsonl", {"method": "m"}
    path.write_text(json.dumps({"identity": identity}) + "\n" + json.dumps({"sample_index": 0}) + "\n"
                    + '{"sample_index": 1, "tok')
    journal = Journal(path, identity)
    assert list(journal.rows) == [0]
    journal.append({"sample_index": 1})
    journal.append({"sample_index": 2})
    assert list(Journal(path, identity).rows) == [0, 1, 2]


# ---- the DAG ------------------------------------------------------------------------------------
def _dry_run(snakemake, workdir: Path, shards: int, *args: str):
    return snakemake(workdir, "-n", "-p", "--config", f"shards={shards}", *args,
                     configfile=CONFIGS / "tiny.yaml")


def test_shards_split_generate_jobs_and_merge_before_scoring(tmp_path, warm_snakemake):
    snakemake = warm_snakemake
    per_method = 2 * 3  # tiny: 1 backbone x 2 tasks x 3 methods
    counts = job_counts(_dry_run(snakemake, tmp_path, 3, "--quiet", "rules").stdout)
    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    assert {k: v for k, v in counts.items() if v} == expected_counts(Campaign({**config, "shards": 3}))
    assert counts["generate"] == 3 * per_method
    assert counts["merge_generations"] == per_method and counts["score"] == per_method
    out = _dry_run(snakemake, tmp_path, 3).stdout
    for i in range(3):
        assert (f"--out results/generations/toy/toy_code/archer-k1.shards/{i}-of-3.parquet" in out
                and f"--shard {i}/3 " in out)
    merges = re.findall(r"dlmpipe merge-generations --shards (.*?) --shard-provenance", out)
    assert len(merges) == per_method
    for shard_files in merges:
        first, *rest = shard_files.split()
        method_dir = first.rsplit("/", 1)[0]
        assert method_dir.endswith(".shards")
        assert [first, *rest] == [f"{method_dir}/{i}-of-3.parquet" for i in range(3)]


def test_one_shard_keeps_todays_dag(tmp_path, warm_snakemake):
    snakemake = warm_snakemake
    proc = _dry_run(snakemake, tmp_path, 1)
    counts = job_counts(snakemake(tmp_path, "-n", "--quiet", "rules",
                                  configfile=CONFIGS / "tiny.yaml").stdout)
    assert "merge_generations" not in counts and counts["generate"] == 6
    assert "--shard" not in proc.stdout and ".shards/" not in proc.stdout


def test_sharded_reruns_follow_the_config(tmp_path, warm_snakemake, tiny_config, write_config):
    snakemake = warm_snakemake
    tiny_config["shards"] = 2
    config = write_config(tiny_config, tmp_path / "sharded.yaml")
    fake_finished_run(tmp_path, config, snakemake)

    changed = yaml.safe_load(config.read_text())
    changed["methods"]["llada-confidence"]["sampler"]["steps"] = 4
    jobs = scheduled(snakemake(tmp_path, "-n", configfile=write_config(changed, tmp_path / "c1.yaml")).stdout)
    tasks = ("toy_code", "toy_arith")
    want = {(rule, "toy", t, "llada-confidence") for t in tasks
            for rule in ("generate", "merge_generations", "score")}
    # the reference changed: every method's timing (each paired with it)
    assert jobs == want | timing_jobs(["toy"], tasks, Campaign(changed).methods) | REPORT_JOBS

    # another shard layout decodes again (its files are other files)
    changed = {**tiny_config, "shards": 3}
    jobs = scheduled(snakemake(tmp_path, "-n", configfile=write_config(changed, tmp_path / "c2.yaml")).stdout)
    assert {j for j in jobs if j[0] == "generate"} == {
        ("generate", "toy", t, m) for t in tasks for m in ("llada-confidence", "archer-k1", "archer-kinf")}


# ---- real runs ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def toy_backbone(tmp_path_factory) -> Path:
    """A small toy checkpoint (trained a few steps: the tests need its speed, not its quality)."""
    from dlmpipe.backbones.toy import train_toy

    out = tmp_path_factory.mktemp("toy") / "ckpt"
    train_toy(out, seed=0, steps=10, batch_size=8, d_model=64, n_layers=2, n_heads=2,
              mlp_hidden=128, threads=1, log=lambda *_: None)
    return out


def _campaign(backbone: Path, n: int, gen_length: int, methods: dict, shards: int = 1) -> dict:
    return {"results_dir": "results", "seed": 0, "device": "cpu", "shards": shards,
            "reference_method": next(iter(methods)),
            "backbones": {"toy": {"path": str(backbone)}},
            "tasks": {"toy_arith": {"n": n, "seed": 1000, "gen_length": gen_length}},
            "methods": methods, "resources": {"generate": {"threads": 1}, "score": {"threads": 1}}}


METHODS = {"llada-confidence": {"sampler": {"name": "llada_confidence"}, "cache": {"name": "none"}},
           "archer": {"sampler": {"name": "saber"}, "cache": {"name": "archer", "K": "inf"}}}


def _decode_in_process(snakemake, workdir: Path, target: str, config: Path, monkeypatch) -> None:
    """The generate rule's own command for ``target`` under ``config`` (read from a dry run's
    shell command), run in this process in ``workdir``: what that job decodes, without a
    Snakemake run and a job server of its own."""
    plan = snakemake(workdir, "--cores", "1", target, "-n", "-p", "--forcerun", "generate",
                     configfile=config).stdout
    shell = re.search(r"^Shell command: (.*)$", plan, re.M).group(1)
    words = shlex.split(shell.split(" > ")[0])
    start = words.index("python")
    assert words[start:start + 4] == ["python", "-m", "dlmpipe", "generate"], shell
    assert "--shard" not in words, shell
    with monkeypatch.context() as patch:
        for assignment in words[:start]:  # DLMPIPE_GPUS=...
            patch.setenv(*assignment.split("=", 1))
        patch.chdir(workdir)
        assert main(words[start + 3:]) == 0


def test_sharded_and_unsharded_runs_decode_the_same_tokens(tmp_path, warm_snakemake, toy_backbone,
                                                           write_config, monkeypatch):
    """A run in 3 shards; the unsharded job it is compared with is the generate rule's command at
    ``shards: 1``, run in this process in the same workdir (the same prepared inputs)."""
    method = {"archer": METHODS["archer"]}
    target = "results/generations/toy/toy_arith/archer.parquet"
    three = tmp_path / "shards3"
    three.mkdir()
    config = write_config(_campaign(toy_backbone, 7, 8, method, 3), tmp_path / "c3.yaml")
    warm_snakemake(three, "--cores", "1", target, configfile=config)
    got = pq.read_table(three / target).to_pylist()
    shard_files = sorted((three / target).parent.glob("archer.shards/*.parquet"))
    assert [pq.read_table(f).num_rows for f in shard_files] == [2, 2, 3]
    provenance = json.loads((three / target).with_suffix(".provenance.json").read_text())
    assert [s["samples"] for s in provenance["shards"]] == [[0, 2], [2, 4], [4, 7]]

    (three / target).unlink()
    _decode_in_process(warm_snakemake, three, target,
                       write_config(_campaign(toy_backbone, 7, 8, method, 1), tmp_path / "c1.yaml"),
                       monkeypatch)
    want = pq.read_table(three / target).to_pylist()
    assert [r["sample_index"] for r in got] == list(range(7))
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in want]
    assert [r["completion"] for r in got] == [r["completion"] for r in want]
    assert all(r["job_time_s"] > 0 and r["device"] for r in got)


def _generate_pids(workdir: Path) -> list[int]:
    """This workdir's running `python -m dlmpipe generate` processes."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            if (b"dlmpipe" in argv and b"generate" in argv
                    and os.readlink(entry / "cwd") == os.path.realpath(workdir)):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _kill_generate_when(journal: Path, workdir: Path, run, min_rows: int) -> int:
    """SIGKILL the generate job once its journal holds ``min_rows`` samples; returns how many.
    ``run``: the Future of the Snakemake command running it."""
    deadline = time.time() + 180
    while time.time() < deadline and not run.done():
        if journal.exists() and journal.read_text().count("\n") >= min_rows + 1:
            pids = _generate_pids(workdir)
            if pids:
                for pid in pids:
                    os.kill(pid, signal.SIGKILL)
                return journal.read_text().count("\n") - 1
        time.sleep(0.005)
    raise AssertionError(f"the generate job never journaled {min_rows} samples "
                         f"(snakemake exited {run.result().returncode if run.done() else None})")


@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="needs /proc to find the job")
def test_generate_job_killed_under_snakemake_resumes_without_loss_or_duplicates(
        tmp_path, toy_backbone, write_config, warm_snakemake, monkeypatch):
    """Each Snakemake run is forked from the warm interpreter (a Snakemake process of its own,
    run in a thread while this one watches the journal and kills the job); the uninterrupted
    decode they are compared with is the generate rule's command, run in this process."""
    n = 40
    methods = {"llada-confidence": METHODS["llada-confidence"]}
    config = write_config(_campaign(toy_backbone, n, 32, methods), tmp_path / "kill.yaml")
    workdir = tmp_path / "run"
    workdir.mkdir()
    target = "results/generations/toy/toy_arith/llada-confidence.parquet"
    out, journal = workdir / target, workdir / (target + ".journal.jsonl")
    log = workdir / "results/logs/generate/toy/toy_arith/llada-confidence.log"

    def snakemake(*args: str, check: bool = False):
        return warm_snakemake(workdir, "--cores", "1", target, *args, configfile=config, check=check)

    with ThreadPoolExecutor(max_workers=1) as pool:
        # 1. killed, no retries: Snakemake fails the job; the journal (not an output) survives
        run = pool.submit(snakemake, "--retries", "0")
        first = _kill_generate_when(journal, workdir, run, 3)
        proc = run.result(timeout=120)
        assert proc.returncode != 0, proc.stdout + proc.stderr
        assert 3 <= first < n, "the kill should land mid-job"
        assert not out.exists(), "no generations file may exist after a killed job"
        assert journal.read_text().count("\n") - 1 >= first

        # 2. rerun with --retries 1 and kill again: Snakemake's retry resumes from the journal
        run = pool.submit(snakemake, "--retries", "1")
        second = _kill_generate_when(journal, workdir, run, first + 3)
        proc = run.result(timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert second < n, "the second kill should land mid-job"
    resumed = re.search(r"resuming: (\d+) of (\d+) samples", log.read_text())
    assert resumed and int(resumed.group(2)) == n and second <= int(resumed.group(1)) < n, log.read_text()
    assert not journal.exists()

    rows = pq.read_table(out).to_pylist()
    assert [r["sample_index"] for r in rows] == list(range(n))

    # the same samples decoded in one go, without kills: the rule's own command, in this process
    out.rename(tmp_path / "resumed.parquet")
    _decode_in_process(warm_snakemake, workdir, target, config, monkeypatch)
    want = pq.read_table(out).to_pylist()
    assert [r["token_ids"] for r in rows] == [r["token_ids"] for r in want]
    assert [r["task_id"] for r in rows] == [r["task_id"] for r in want]
