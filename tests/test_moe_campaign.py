"""configs/moe.yaml (issue 33): LLaDA-MoE-7B-A1B-Instruct, LLaDA2.0-mini and -flash with the
releases' settings, planned on tiny checkpoints in the released formats (tests/checkpoints.py
``moe_checkpoint``) whose index states the released total size, as a downloaded checkpoint's
does: a dry run with the SLURM profile plans every job, the releases' settings reach the
generate jobs, and each backbone's model jobs ask for the GPUs its weights need (flash several)."""
from __future__ import annotations

import copy
import json
import re

import pytest
import yaml

from dlmpipe.campaign import Campaign

from .checkpoints import moe_checkpoint
from .test_slurm import PROFILE, job_resources, slurm_gpu_flags
from .workflow import REPO, expected_counts, job_blocks, job_counts, scheduled

#: backbone -> (family, directory as downloaded, the release's total parameters (model cards))
RELEASES = {"llada-moe-7b-a1b-instruct": ("llada_moe", "LLaDA-MoE-7B-A1B-Instruct", 7_000_000_000),
            "llada2-mini": ("llada2", "LLaDA2.0-mini", 16_000_000_000),
            "llada2-flash": ("llada2", "LLaDA2.0-flash", 100_000_000_000)}
# SPA-Cache's rank 128 needs a value projection at least that wide: LLaDA-MoE's kv heads = heads
# (16 x 128 released; 4 x 64 here), LLaDA2.0's head width 16 (tiny format) x 8 kv heads
WIDTHS = {"llada_moe": {"d_model": 256, "n_heads": 4, "n_kv_heads": 4},
          "llada2": {"d_model": 256, "n_heads": 16, "n_kv_heads": 8}}
#: GPUs per model job in bfloat16 on the config's 80 GB GPUs (gpus.py: weights + K/V + margin)
GPUS = {"llada-moe-7b-a1b-instruct": 1, "llada2-mini": 1, "llada2-flash": 3}


@pytest.fixture(autouse=True)
def benchmark_data(monkeypatch):
    from dlmpipe.tasks.sources import DATA_ENV

    monkeypatch.setenv(DATA_ENV, str(REPO / "tests" / "data"))


def stand_in(dir, family: str, total: int):
    """A tiny checkpoint of ``family`` whose index states ``total`` parameters (float32: 4 bytes
    each), as the released checkpoint's index states its size."""
    path = moe_checkpoint(dir, family, **WIDTHS[family])
    index = path / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["metadata"] = {"total_size": 4 * total}
    index.write_text(json.dumps(data))
    return path


@pytest.fixture(scope="module")
def moe_config(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("moe-campaign")
    config = yaml.safe_load((REPO / "configs" / "moe.yaml").read_text())
    assert set(config["backbones"]) == set(RELEASES)
    for backbone, spec in config["backbones"].items():
        family, directory, total = RELEASES[backbone]
        assert spec["path"].endswith("/" + directory)
        spec["path"] = str(stand_in(tmp / "models" / directory, family, total))
    return config


def test_moe_campaign_dry_run_with_the_slurm_profile(moe_config, tmp_path, write_config, warm_snakemake):
    campaign = Campaign(copy.deepcopy(moe_config))
    path = write_config(moe_config, tmp_path / "moe.yaml")
    proc = warm_snakemake(tmp_path, "-n", "-p", "--profile", str(PROFILE), configfile=path)
    assert job_counts(proc.stdout) == {k: v for k, v in expected_counts(campaign).items() if v}
    want = {(rule, b, t, m) for rule in ("generate", "score") for b, t, m in campaign.decoding_jobs()}
    assert {j for j in scheduled(proc.stdout, in_groups=True) if j[0] in ("generate", "score")} == want
    # every model job asks for the GPUs its backbone needs; no other job asks for one
    seen = {}
    for (rule, body), (_, res) in zip(job_blocks(proc.stdout, in_groups=True), job_resources(proc.stdout)):
        if rule not in ("generate", "time_method"):
            assert "gpu" not in res, rule
            continue
        backbone = re.search(r"backbone=([^,\s]+)", body).group(1)
        seen.setdefault(backbone, set()).add(slurm_gpu_flags(res))
    assert seen == {b: {f"--gpus={g}"} for b, g in GPUS.items()}
    for b, g in GPUS.items():
        assert re.search(rf"DLMPIPE_GPUS={g} python -m dlmpipe generate .*/{b}/", proc.stdout), b
    assert {b: campaign.gpus(b).gpus for b in campaign.backbones} == GPUS
    assert campaign.gpus("llada2-flash").need.weights == 2 * 100_000_000_000  # every expert, bf16
    # the releases' settings reach the generate jobs
    planned = {(b, t, json.loads(m)["name"]): json.loads(m) for b, t, m in re.findall(
        r"--manifest \S*backbones/([^/]+)/manifest\.json --task-file \S*tasks/(\w+)\.parquet "
        r"--method '(\{.*?\})'", proc.stdout)}
    assert len(planned) == len(campaign.decoding_jobs())
    assert {campaign.benchmark(t) for t in campaign.tasks} == {"gsm8k", "math500", "humaneval", "mbpp"}
    llada2 = {"llada2-mini", "llada2-flash"}
    where = {}
    for b, t, n in planned:
        where.setdefault(n, set()).add(b)
    assert where.pop("llada2-generate") == llada2  # LLaDA2.0's own loop on its own models only
    assert all(on == set(RELEASES) for on in where.values()), where  # the rest everywhere
    for (b, t, name), m in planned.items():
        assert m["gen_length"] == 256 and m["sampler"].get("temperature", 0) == 0, (b, t, name)
        s, c = m["sampler"], m["cache"]
        if name == "llada2-generate":  # generate's defaults: 32 steps per block of 32, tau 0.95
            assert (s["name"], s["remasking"], s["steps"], s["confidence_threshold"]) == (
                "sdar", "low_confidence_dynamic", 32, 0.95)
        if name.startswith("dinfer-"):
            assert s["block_length"] == 64 and (c["name"], c["prefix_look"], c["after_look"],
                                                c["warmup_steps"]) == ("dinfer_vicinity", 16, 16, 4)
        if name == "dinfer-hierarchy":
            assert (s["threshold"], s["low_threshold"]) == (0.8, 0.5)
        if name == "fast-dllm-parallel":
            assert (s["tau"], s["block_length"], c["name"]) == (0.9, 32, "fast_dllm_dual")
    for name, spec in campaign.config["tables"].items():
        for b in spec["backbones"]:
            for t in spec["tasks"]:
                for m in spec["methods"]:
                    assert campaign.runs(m, b, t), (name, b, t, m)


def test_a_gpu_cap_below_flash_is_refused(moe_config):
    from dlmpipe.campaign import ConfigError

    c = copy.deepcopy(moe_config)
    c["resources"]["generate"]["max_gpus"] = 2
    with pytest.raises(ConfigError, match=r"resources\.generate\.max_gpus: .*llada2-flash needs 3 GPU"):
        Campaign(c)
