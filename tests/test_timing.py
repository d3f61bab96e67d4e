"""The timing stage: interleaved order, every (method, sample, repeat) timed, timed = scored."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dlmpipe.environment import environment
from dlmpipe.timing import rotation, run_timing_job


@pytest.fixture(scope="module")
def toy_checkpoint() -> Path:
    """The shipped toy the default campaign decodes (dlmpipe/shipped/toy, trained by
    ``train_toy``), as tests/test_generate_job.py's: loading it costs a fraction of training
    conftest's 40-step toy, and the timing job reads any checkpoint alike."""
    from dlmpipe.backbones.shipped import shipped_path

    return Path(shipped_path("toy"))


def test_rotation_puts_every_method_in_every_slot_equally():
    methods = ["a", "b", "c", "d"]
    turns = [rotation(methods, t) for t in range(8)]
    assert all(sorted(t) == methods for t in turns)
    for slot in range(4):
        assert Counter(t[slot] for t in turns) == {m: 2 for m in methods}


def test_timing_job_times_the_method_against_the_reference_on_the_same_samples(tmp_path, toy_checkpoint):
    from dlmpipe.backbones.manifest import write_manifest
    from dlmpipe.generate import run_generation_job
    from dlmpipe.tasks import load_task, write_task_table

    write_manifest(toy_checkpoint, tmp_path / "manifest.json", name="toy")
    task = tmp_path / "toy_arith.parquet"
    write_task_table(load_task("toy_arith", n=5, seed=2), task)
    saber = {"name": "saber", "n": 2, "mu": 2}
    reference = {"name": "sampled", "sampler": {"name": "llada_confidence", "temperature": 1.0},
                 "cache": {"name": "none"}, "gen_length": 16}
    method = {"name": "archer-k1", "sampler": saber, "cache": {"name": "archer", "K": 1},
              "gen_length": 16, "batch_size": 2}  # its own batch size for the throughput pass
    out = tmp_path / "timing.parquet"
    progress = []
    run_timing_job(str(tmp_path / "manifest.json"), str(task), method, str(out), reference=reference,
                   seed=4, device="cpu", samples=3, repeats=2, log=progress.append, batch_size=3)
    every = pq.read_table(out).to_pandas()
    assert set(every["run"]) == {"archer-k1"}  # every row names the run it belongs to
    # the job's log shows each repeat as it ends, with both methods' times
    assert [line.split(":")[0].strip() for line in progress if line.strip().startswith("repeat")] == ["repeat 1/2", "repeat 2/2"]
    assert all("archer-k1" in line and "sampled" in line for line in progress if line.strip().startswith("repeat"))
    # the throughput pass: the method alone (not the reference), over the timed samples, together
    batched = every[every["pass"] == "throughput"]
    assert len(batched) == 3 and set(batched["method"]) == {"archer-k1"}
    assert set(batched["batch_size"]) == {2} and batched["pass_s"].nunique() == 1
    assert (batched["time_s"] <= batched["pass_s"] + 1e-9).all()
    assert (every["peak_memory_mb"] > 0).all() and set(every["peak_memory_kind"]) == {"cpu_rss_hwm"}
    rows = every[every["pass"] == "latency"]
    assert len(rows) == 2 * 3 * 2 and set(rows["batch_size"]) == {1}
    assert ((rows["ttft_s"] > 0) & (rows["ttft_s"] <= rows["time_s"])).all()
    # batch invariance: the throughput pass decodes the latency rows' tokens
    for row in batched.itertuples():
        same = rows[(rows["method"] == row.method) & (rows["sample_index"] == row.sample_index)]
        assert all(list(t) == list(row.token_ids) for t in same["token_ids"])
    assert set(rows.groupby(["method", "repeat"])["sample_index"].apply(tuple)) == {(0, 1, 2)}
    assert (rows["time_s"] > 0).all() and set(rows["slot"]) == {0, 1}
    # each (repeat, sample) alternates which of the two goes first, equally often
    firsts = rows[rows["slot"] == 0].groupby(["repeat", "sample_index"])["method"].first()
    assert Counter(firsts) == {"sampled": 3, "archer-k1": 3}
    # the timed decodes are the generate jobs' decodes: same seeds, same tokens, every repeat
    for m in (method, reference):
        gen = tmp_path / f"{m['name']}.parquet"
        run_generation_job(str(tmp_path / "manifest.json"), str(task), m, str(gen),
                           str(gen.with_suffix(".json")), seed=4, device="cpu")
        expected = pq.read_table(gen).to_pandas().set_index("sample_index")["token_ids"]
        for row in rows[rows["method"] == m["name"]].itertuples():
            assert list(row.token_ids) == list(expected[row.sample_index]), (m["name"], row.sample_index)
    assert rows["device"].str.startswith("cpu:").all()  # the device and threads timed on
    # one process, one environment: every row carries this process's fingerprint and fields
    env = environment("cpu")
    for column, value in env.items():
        assert (rows[column] == value).all(), column


def test_the_references_own_job_times_it_alone(tmp_path, toy_checkpoint):
    from dlmpipe.backbones.manifest import write_manifest
    from dlmpipe.tasks import load_task, write_task_table

    write_manifest(toy_checkpoint, tmp_path / "manifest.json", name="toy")
    task = tmp_path / "toy_code.parquet"
    write_task_table(load_task("toy_code", n=2, seed=2), task)
    ref = {"name": "ref", "sampler": {"name": "llada_confidence"}, "cache": {"name": "none"},
           "gen_length": 8}
    out = tmp_path / "ref.parquet"
    run_timing_job(str(tmp_path / "manifest.json"), str(task), ref, str(out), reference=ref,
                   seed=0, device="cpu", samples=2, repeats=2, log=lambda *_: None, batch_size=2)
    every = pq.read_table(out).to_pandas()
    assert set(every["method"]) == set(every["run"]) == {"ref"}
    assert len(every[every["pass"] == "latency"]) == 2 * 2 and set(every["slot"]) == {0}
