"""The timing stage: interleaved order, every (method, sample, repeat) timed, timed = scored."""
from __future__ import annotations

from collections import Counter

import pyarrow.parquet as pq

from dlmpipe.environment import environment
from dlmpipe.timing import rotation, run_timing_job


def test_rotation_puts_every_method_in_every_slot_equally():
    methods = ["a", "b", "c", "d"]
    turns = [rotation(methods, t) for t in range(8)]
    assert all(sorted(t) == methods for t in turns)
    for slot in range(4):
        assert Counter(t[slot] for t in turns) == {m: 2 for m in methods}


def test_timing_job_times_every_method_on_the_same_samples(tmp_path, toy_checkpoint):
    from dlmpipe.backbones.manifest import write_manifest
    from dlmpipe.generate import run_generation_job
    from dlmpipe.tasks import load_task, write_task_table

    write_manifest(toy_checkpoint, tmp_path / "manifest.json", name="toy")
    task = tmp_path / "toy_arith.parquet"
    write_task_table(load_task("toy_arith", n=5, seed=2), task)
    saber = {"name": "saber", "n": 2, "mu": 2}
    methods = [{"name": "saber", "sampler": saber, "cache": {"name": "none"}, "gen_length": 16},
               {"name": "archer-k1", "sampler": saber, "cache": {"name": "archer", "K": 1},
                "gen_length": 16},
               {"name": "sampled", "sampler": {"name": "llada_confidence", "temperature": 1.0},
                "cache": {"name": "none"}, "gen_length": 16}]
    out = tmp_path / "timing.parquet"
    methods[1]["batch_size"] = 2  # a method's own batch size; the others take the job's
    run_timing_job(str(tmp_path / "manifest.json"), str(task), methods, str(out), seed=4,
                   device="cpu", samples=3, repeats=2, log=lambda *_: None, batch_size=3)
    every = pq.read_table(out).to_pandas()
    # the throughput pass: each method once over the timed samples, together, at its batch size
    batched = every[every["pass"] == "throughput"]
    assert len(batched) == 3 * 3
    assert dict(batched.groupby("method")["batch_size"].first()) == {"saber": 3, "archer-k1": 2, "sampled": 3}
    assert (batched.groupby("method")["pass_s"].nunique() == 1).all()
    assert (batched["time_s"] <= batched["pass_s"] + 1e-9).all()
    assert (every["peak_memory_mb"] > 0).all() and set(every["peak_memory_kind"]) == {"cpu_rss_hwm"}
    rows = every[every["pass"] == "latency"]
    assert len(rows) == 3 * 3 * 2 and set(rows["batch_size"]) == {1}
    # batch invariance: the throughput pass decodes the latency rows' tokens
    for row in batched.itertuples():
        same = rows[(rows["method"] == row.method) & (rows["sample_index"] == row.sample_index)]
        assert all(list(t) == list(row.token_ids) for t in same["token_ids"])
    assert set(rows.groupby(["method", "repeat"])["sample_index"].apply(tuple)) == {(0, 1, 2)}
    assert (rows["time_s"] > 0).all() and set(rows["slot"]) == {0, 1, 2}
    # each (repeat, sample) is one rotation of the campaign's methods
    for _, group in rows.groupby(["repeat", "sample_index"]):
        order = group.sort_values("slot")["method"].tolist()
        assert order in [rotation([m["name"] for m in methods], t) for t in range(3)]
    # the timed decodes are the generate jobs' decodes: same seeds, same tokens, every repeat
    for m in methods:
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
