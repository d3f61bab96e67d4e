"""Reproducibility: the tiny campaign run twice from scratch (train the toy, prepare the tasks,
decode every method, score) gives the same weights, the same token ids and the same qualities.
The stages are the library functions the workflow's jobs call, run in this process (seconds)."""
from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import yaml

from dlmpipe.backbones.manifest import write_manifest
from dlmpipe.backbones.toy import train_toy
from dlmpipe.campaign import Campaign
from dlmpipe.generate import run_generation_job
from dlmpipe.scoring.score import score_generations
from dlmpipe.tasks import load_task, write_task_table

from .workflow import CONFIGS


def run_campaign(campaign: Campaign, root: Path) -> dict:
    """Every stage of the tiny campaign into ``root``; returns what must reproduce."""
    seed, out = campaign.config["seed"], {}
    ckpt = root / "checkpoints" / "toy"
    train_toy(ckpt, **campaign.toy_options("toy"), log=lambda *_: None)
    out["weights"] = [f.read_bytes() for f in sorted(ckpt.glob("*.safetensors"))]
    write_manifest(ckpt, root / "manifest.json", name="toy")
    for task in campaign.tasks:
        task_file = root / "tasks" / f"{task}.parquet"
        write_task_table(load_task(task, **campaign.task_options(task)), task_file)
        for name in campaign.methods:
            gen = root / "generations" / task / f"{name}.parquet"
            run_generation_job(str(root / "manifest.json"), str(task_file), campaign.method(name, task, "toy"),
                               str(gen), str(gen.with_suffix(".json")), seed=seed, device="cpu")
            scores = root / "scores" / task / f"{name}.parquet"
            score_generations(gen, task_file, scores, workers=1)
            rows = pq.read_table(scores).to_pylist()
            out[(task, name)] = {"token_ids": [r["token_ids"] for r in rows],
                                 "scores": [r["score"] for r in rows],
                                 "quality": sum(r["score"] for r in rows) / len(rows)}
    return out


def test_the_tiny_campaign_reproduces_token_for_token(tmp_path):
    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    # a sampled method too (Gumbel noise at temperature 1): its tokens depend on the seeds
    config["methods"]["sampled"] = {"sampler": {"name": "llada_confidence", "temperature": 1.0},
                                    "cache": {"name": "none"}}
    campaign = Campaign(config)
    first = run_campaign(campaign, tmp_path / "first")
    second = run_campaign(campaign, tmp_path / "second")
    assert len(first) == 1 + len(campaign.tasks) * len(campaign.methods)
    assert first["weights"] == second["weights"]
    for key in first:
        if key != "weights":
            assert first[key] == second[key], key
            assert all(len(ids) == campaign.method(key[1], key[0], "toy")["gen_length"]
                       for ids in first[key]["token_ids"])
    # the comparison has something to compare: sampled responses differ between samples
    for task in campaign.tasks:
        sampled = first[(task, "sampled")]["token_ids"]
        assert len({tuple(ids) for ids in sampled}) > 1
