"""The generation job: output format, provenance, and resume after SIGKILL (no loss, no dups)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dlmpipe.backbones.loading import load_backbone
from dlmpipe.environment import COLUMNS as ENVIRONMENT_COLUMNS
from dlmpipe.environment import fingerprint_id
from dlmpipe.generate import cut_at_stop, encode_prompt
from dlmpipe.tasks import read_task_table

# 16 tokens in two blocks of 8: a decode of 16 samples costs a second of CPU, not three
METHOD = {"name": "llada-confidence", "gen_length": 16,
          "sampler": {"name": "llada_confidence", "block_length": 8, "steps": 16, "temperature": 0.0,
                      "confidence": "probability"},
          "cache": {"name": "none"}}


def in_process(argv: list[str]) -> None:
    """``python -m dlmpipe <argv>`` in this process (the same parser and job function), where
    the process boundary is not what a test checks."""
    from dlmpipe.cli import main

    assert main(argv[argv.index("dlmpipe") + 1:] if "dlmpipe" in argv else argv) == 0


@pytest.fixture(scope="module")
def toy_checkpoint() -> Path:
    """The shipped toy the default campaign decodes (dlmpipe/shipped/toy, trained by
    ``train_toy``): loading it costs a fraction of training conftest's 40-step toy."""
    from dlmpipe.backbones.shipped import shipped_path

    return Path(shipped_path("toy"))


@pytest.fixture(scope="module")
def job_inputs(tmp_path_factory, toy_checkpoint):
    root = tmp_path_factory.mktemp("gen")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    in_process(["prepare-backbone", "--path", str(toy_checkpoint), "--name", "toy",
                "--out", str(root / "manifest.json")])
    in_process(["prepare-task", "--name", "toy_code", "--options", json.dumps({"n": 16}),
                "--out", str(root / "toy_code.parquet")])
    return root, env


def _cmd(root: Path, out: Path, method=METHOD, batch_size="auto") -> list[str]:
    return [sys.executable, "-m", "dlmpipe", "generate", "--manifest", str(root / "manifest.json"),
            "--task-file", str(root / "toy_code.parquet"), "--method", json.dumps(method),
            "--out", str(out), "--provenance", str(out.with_suffix(".provenance.json")),
            "--seed", "3", "--device", "cpu", "--config-hash", "abc", "--batch-size", str(batch_size)]


@pytest.fixture(scope="module")
def batch_one(job_inputs):
    """``batch_one(method)`` -> the job's output at batch size 1, decoded once per method for
    the tests that compare with it (a batched job's tokens, a killed and resumed job's); they
    only read it. Decoded in this process: the command's own parser and job function."""
    root, env = job_inputs
    outputs = {}

    def output(method: dict) -> Path:
        if method["name"] not in outputs:
            out = root / f"b1-{method['name']}.parquet"
            in_process(_cmd(root, out, method, 1))
            outputs[method["name"]] = out
        return outputs[method["name"]]
    return output


def test_generated_length_counts_the_tokens_before_the_first_stop_or_pad():
    # (a toy may not stop early in a test's samples: the cut is checked here by hand)
    assert cut_at_stop([5, 6, 2, 7, 2], stop_ids=[2]) == [5, 6]
    assert cut_at_stop([5, 6, 7], stop_ids=[2]) == [5, 6, 7]
    assert cut_at_stop([9, 5, 3], stop_ids=[2, 9]) == []


def test_generation_rows_and_provenance(job_inputs, toy_checkpoint):
    """The job's rows and provenance; it starts beside a journal of other parameters (the
    steps), which it discards: every sample decoded anew, none taken from that journal."""
    root, env = job_inputs
    out = root / "ref.parquet"
    other = {**METHOD, "sampler": {**METHOD["sampler"], "steps": 8}}
    (root / "ref.parquet.journal.jsonl").write_text(json.dumps({"identity": {"method": other}}) + "\n"
                                                    + json.dumps({"sample_index": 0, "token_ids": [1]}) + "\n")
    subprocess.run(_cmd(root, out), check=True, env=env, capture_output=True)
    rows = pq.read_table(out).to_pylist()
    assert [r["sample_index"] for r in rows] == list(range(16))
    loaded = load_backbone(toy_checkpoint, device="cpu")
    stops = loaded.model.cfg.stop_ids + [loaded.model.cfg.pad_id]
    tasks = read_task_table(str(root / "toy_code.parquet"))
    for r in rows:
        assert len(r["token_ids"]) == 16  # sample 0's too: not the journal's [1]
        assert r["steps"] == r["nfe"] == 16 and r["cached_forwards"] == 0
        assert r["job_time_s"] > 0 and r["device"].startswith("cpu")
        assert json.loads(r["params"])["sampler"]["block_length"] == 8
        assert r["method"] == "llada-confidence" and r["task_id"] == f"toy_code/{r['sample_index']}"
        # measurements: tokens before the first stop/pad, TPS x time = that length, TTFT inside
        first_stop = next((i for i, t in enumerate(r["token_ids"]) if t in stops), len(r["token_ids"]))
        assert r["generated_length"] == first_stop
        assert r["job_tps"] * r["job_time_s"] == pytest.approx(r["generated_length"])
        assert 0 < r["job_ttft_s"] <= r["job_time_s"]
        prompt = encode_prompt(loaded, tasks[r["sample_index"]], chat=False)
        assert r["prompt_length"] == len(prompt) > 0
        assert r["batch_size"] == 8  # auto on the CPU
    # every row names the environment it was decoded in (dlmpipe/environment.py); on the CPU no GPU
    env = {c: rows[0][c] for c in ENVIRONMENT_COLUMNS}
    assert all({c: r[c] for c in ENVIRONMENT_COLUMNS} == env for r in rows)
    assert env["fingerprint"] == fingerprint_id(env) and env["gpu_name"] == env["cuda_version"] == ""
    assert env["cpu_model"] and env["torch_version"] and env["dlmpipe_revision"]
    assert int(env["torch_threads"]) >= 1
    assert env["omp_num_threads"] == os.environ.get("OMP_NUM_THREADS", "")  # inherited
    prov = json.loads(out.with_suffix(".provenance.json").read_text())
    assert prov["environment"] == env and prov["git_revision"] == env["dlmpipe_revision"]
    assert prov["seed"] == 3 and prov["config_hash"] == "abc" and prov["torch"]
    assert "git_revision" in prov and prov["compile"] == "none"
    # the method as decoded: the given parameters, the registry's defaults filled in
    assert {part: {k: prov["method"][part][k] for k in METHOD[part]} for part in ("sampler", "cache")} \
        == {part: METHOD[part] for part in ("sampler", "cache")}
    assert not (root / "ref.parquet.journal.jsonl").exists()


def refused(argv: list[str], capsys) -> tuple[int, str]:
    """``python -m dlmpipe <argv>``'s exit status and standard error, run in this process (the
    command's parser, job function and error handling: a refusal is what they print)."""
    from dlmpipe.cli import main

    capsys.readouterr()
    code = main(argv[argv.index("dlmpipe") + 1:])
    return code, capsys.readouterr().err


def test_cuda_graphs_on_a_cpu_stop_the_job_before_it_decodes(job_inputs, capsys):
    root, env = job_inputs
    out = root / "graphs.parquet"
    code, err = refused(_cmd(root, out) + ["--compile", "cuda_graphs"], capsys)
    assert code != 0
    assert "compile: cuda_graphs needs a CUDA device; the model is on cpu" in err
    assert not out.exists()


ARCHER = {"name": "archer-k4", "gen_length": 16,
          "sampler": {"name": "saber", "block_length": 8}, "cache": {"name": "archer", "K": 4}}


@pytest.mark.parametrize("method", [METHOD, ARCHER], ids=["full", "archer"])
def test_batched_job_decodes_the_tokens_of_batch_one(job_inputs, batch_one, method):
    """Batch size is a scheduling setting: the same tokens and statistics at 1 and 5 (16
    samples, so slots take new samples as others finish); every row records its batch size.
    Both decoded in this process (the command's parser and job function)."""
    root, env = job_inputs
    one, five = batch_one(method), root / f"b5-{method['name']}.parquet"
    in_process(_cmd(root, five, method, 5))
    a, b = pq.read_table(one).to_pylist(), pq.read_table(five).to_pylist()
    assert [r["sample_index"] for r in b] == list(range(16))
    keys = ("token_ids", "completion", "steps", "nfe", "refreshes", "cached_forwards", "revisions",
            "generated_length", "prompt_length")
    assert [{k: r[k] for k in keys} for r in a] == [{k: r[k] for k in keys} for r in b]
    assert {r["batch_size"] for r in a} == {1} and {r["batch_size"] for r in b} == {5}
    assert all(0 < r["job_ttft_s"] <= r["job_time_s"] for r in b)


def test_batch_size_with_a_compile_mode_is_refused(job_inputs, capsys):
    root, env = job_inputs
    out = root / "compiled-batch.parquet"
    code, err = refused(_cmd(root, out, batch_size=4) + ["--compile", "torch_compile"], capsys)
    assert code != 0 and "batched decoding runs eagerly" in err
    # refused before the job starts: no journal written, no model loaded or step compiled
    assert not out.exists() and not out.with_name(out.name + ".journal.jsonl").exists()


def test_killed_job_resumes_without_losing_or_duplicating_samples(job_inputs, batch_one, capfd):
    """Killed mid-job at batch size 4 and resumed at 1: only what is left is decoded (batch
    size is not part of the journal's identity), every sample once, the tokens of the job run
    through at batch size 1 (``batch_one``). The killed job is a process of its own; the resumed
    one runs in this process (the command's parser and job function, reading the journal the
    killed process left)."""
    root, env = job_inputs
    ref = batch_one(METHOD)
    out = root / "killed.parquet"
    journal = root / "killed.parquet.journal.jsonl"
    proc = subprocess.Popen(_cmd(root, out, batch_size=4), env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline:
        if journal.exists() and journal.read_text().count("\n") >= 4:  # header + >= 3 samples
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = journal.read_text().count("\n") - 1
    assert 3 <= done_before < 16, "the kill should land mid-job"
    assert not out.exists(), "no output may exist after a killed job"
    capfd.readouterr()
    in_process(_cmd(root, out, batch_size=1))
    resumed = capfd.readouterr()
    assert f"decoding {16 - done_before}" in resumed.out + resumed.err
    got, want = pq.read_table(out).to_pylist(), pq.read_table(ref).to_pylist()
    assert [r["sample_index"] for r in got] == list(range(16))
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in want]
    assert sum(r["batch_size"] == 4 for r in got) == done_before


def test_shards_are_disjoint_and_cover_all_samples():
    from dlmpipe.generate import shard_range

    for n in (1, 7, 16):
        for k in (1, 2, 3, 5):
            got = [i for s in range(k) for i in shard_range(n, f"{s}/{k}")]
            assert got == list(range(n))
    with pytest.raises(ValueError):
        shard_range(4, "2/2")
