"""GPUs per model job from the backbone's memory need (dlmpipe/gpus.py): the need's parts, the
weights read from safetensors headers, the campaign's cap and fixed count refused at plan time
naming the key, `dlmpipe plan`'s table, and a dry run with the SLURM profile that asks for the
GPUs LLaDA2.0-flash- and -mini-sized backbones need (tiny LLaDA2.0 checkpoints whose index states
the released total size) and one for a small model."""
from __future__ import annotations

import copy
import json
import math
import re

import pytest

from dlmpipe import gpus, plan
from dlmpipe.campaign import Campaign, ConfigError

from .checkpoints import make_tiny_checkpoint, moe_checkpoint
from .test_slurm import PROFILE, job_resources, slurm_gpu_flags
from .workflow import job_blocks

FLASH, MINI = 100_000_000_000, 16_000_000_000  # the releases' total parameters (model cards)


def stand_in(dir, total: int | None):
    """A tiny LLaDA2.0 checkpoint whose index states ``total`` parameters (float32 files:
    4 bytes each), as a released checkpoint's index states its size."""
    path = moe_checkpoint(dir, "llada2")
    if total is not None:
        index = path / "model.safetensors.index.json"
        data = json.loads(index.read_text())
        data["metadata"] = {"total_size": 4 * total}
        index.write_text(json.dumps(data))
    return path


def campaign_config(tmp_path, **generate) -> dict:
    return {
        "results_dir": "results", "device": "cuda",
        "reference_method": "base",
        "backbones": {
            "llada2-flash": {"path": str(stand_in(tmp_path / "LLaDA2.0-flash", FLASH)), "dtype": "bfloat16"},
            "llada2-mini": {"path": str(stand_in(tmp_path / "LLaDA2.0-mini", MINI)), "dtype": "bfloat16"},
            "small": {"path": str(make_tiny_checkpoint(tmp_path / "small", "llada")), "dtype": "bfloat16"},
        },
        "tasks": {"toy_code": {"n": 2, "seed": 1000, "gen_length": 32}},
        "methods": {"base": {"sampler": {"name": "llada_confidence", "steps": 32, "block_length": 32},
                             "cache": {"name": "none"}}},
        "resources": {"generate": {"threads": 1, **generate}},
    }


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    return campaign_config(tmp_path_factory.mktemp("gpu-plan"))


def test_weights_are_read_from_the_headers(tmp_path):
    """Unsharded: the headers' shapes summed (every expert of the MoE stand-in); sharded with
    an index stating its total size: that size over the files' bytes per element."""
    import torch

    from dlmpipe.backbones.checkpoint_config import read_config
    from dlmpipe.backbones.model import Backbone

    single = moe_checkpoint(tmp_path / "one", "llada2", sharded=False)
    with torch.device("meta"):
        model = Backbone(read_config(single))
    experts = sum(p.numel() for n, p in model.named_parameters() if "expert" in n)
    assert experts > 0
    assert plan.checkpoint_parameters(single) == sum(p.numel() for p in model.parameters())
    assert plan.checkpoint_parameters(stand_in(tmp_path / "big", FLASH)) == FLASH


def test_the_need_is_weights_kv_and_the_margin():
    size = plan.Size(1_400_000_000, 32, None, "test", n_kv_heads=4, head_dim=128, total=FLASH)
    need = gpus.memory_need(size, "bfloat16", rows=512 + 256, batch=16)
    assert need.weights == FLASH * 2  # every expert, at 2 bytes
    assert need.kv == 32 * 4 * 128 * 2 * 768 * 16 * 2
    assert need.total == pytest.approx((need.weights + need.kv) * (1 + gpus.MARGIN) + gpus.OVERHEAD_GB * 1e9)
    assert need.gpus(80) == math.ceil(need.total / 80e9) == 3
    assert need.gpus(141) == 2
    assert gpus.memory_need(size, "float32", 768, 16).gpus(80) == 6  # 400 GB of weights


def test_the_campaign_plans_gpus_per_backbone(config):
    c = Campaign(copy.deepcopy(config))
    assert {b: c.gpus(b).gpus for b in c.backbones} == {"llada2-flash": 3, "llada2-mini": 1, "small": 1}
    assert c.gpus("llada2-flash").need.weights == 2 * FLASH
    on_cpu = Campaign({**copy.deepcopy(config), "device": "cpu"})
    assert {on_cpu.gpus(b).gpus for b in on_cpu.backbones} == {0}


@pytest.mark.parametrize("key,value,fits", [("max_gpus", 2, False), ("max_gpus", 3, True),
                                            ("gpu", 2, False), ("gpu", 4, True)])
def test_a_cap_or_fixed_count_below_the_need_is_refused_naming_the_key(config, key, value, fits):
    c = copy.deepcopy(config)
    c["resources"]["generate"][key] = value
    if fits:
        want = 4 if key == "gpu" else 3
        assert Campaign(c).gpus("llada2-flash").gpus == want
        return
    with pytest.raises(ConfigError, match=rf"resources\.generate\.{key}: .*llada2-flash needs 3 GPU"):
        Campaign(c)


def test_compiled_steps_on_several_gpus_are_refused(config):
    c = copy.deepcopy(config)
    c["compile"] = "cuda_graphs"
    with pytest.raises(ConfigError, match=r"compile: cuda_graphs .*llada2-flash needs 3 GPU"):
        Campaign(c)
    del c["backbones"]["llada2-flash"]
    assert Campaign(c).gpus("llada2-mini").gpus == 1  # one GPU: compiled steps as before


def test_larger_gpus_need_fewer(config):
    c = copy.deepcopy(config)
    c["resources"]["generate"]["gpu_memory_gb"] = 141
    assert Campaign(c).gpus("llada2-flash").gpus == 2


def test_plan_prints_gpus_per_job_per_backbone_without_checkpoints(tmp_path, write_config, capsys):
    from dlmpipe.cli import main

    """The published sizes (plan.KNOWN_MOE_CHECKPOINTS) where no directory is there yet."""
    config = {"device": "cuda", "reference_method": "base",
              "backbones": {"llada2-flash": {"path": str(tmp_path / "LLaDA2.0-flash"), "dtype": "bfloat16"},
                            "llada2-mini": {"path": str(tmp_path / "LLaDA2.0-mini"), "dtype": "bfloat16"},
                            "llada-moe": {"path": str(tmp_path / "LLaDA-MoE-7B-A1B-Instruct"),
                                          "dtype": "bfloat16"}},
              "tasks": {"humaneval": {"gen_length": 256}},
              "methods": {"base": {"sampler": {"name": "llada_confidence", "steps": 256,
                                               "block_length": 32}, "cache": {"name": "none"}}}}
    path = write_config(config, tmp_path / "moe.yaml")
    assert main(["plan", str(path)]) == 0
    section = capsys.readouterr().out.split("GPUs per model job", 1)[1]
    rows = {line.split()[0]: int(line.split()[1]) for line in section.splitlines()[1:4]}
    assert rows == {"llada2-flash": 3, "llada2-mini": 1, "llada-moe": 1}, section
    assert "weights 200.0 GB" in section and "weights 32.0 GB" in section
    config["resources"] = {"generate": {"max_gpus": 2}}
    write_config(config, path)
    assert main(["plan", str(path)]) != 0
    assert "resources.generate.max_gpus" in "".join(capsys.readouterr())


def test_slurm_dry_run_asks_for_the_gpus_each_backbone_needs(config, tmp_path, write_config, warm_snakemake):
    path = write_config(config, tmp_path / "moe.yaml")
    proc = warm_snakemake(tmp_path, "-n", "-p", "--profile", str(PROFILE), configfile=path)
    jobs = job_resources(proc.stdout)
    want = {"llada2-flash": "3", "llada2-mini": "1", "small": "1"}
    seen = {}
    for (rule, body), (_, res) in zip(job_blocks(proc.stdout, in_groups=True), jobs):
        if rule not in ("generate", "time_method"):
            assert "gpu" not in res, rule
            continue
        backbone = next(b for b in want if f"backbone={b}" in body)
        seen[(rule, backbone)] = res["gpu"]
        assert slurm_gpu_flags(res) == f"--gpus={want[backbone]}", (rule, backbone)
    assert seen == {(r, b): g for r in ("generate", "time_method") for b, g in want.items()}
    # each job is told the GPUs it got, to place its layers across them
    for b, g in want.items():
        assert re.search(rf"DLMPIPE_GPUS={g} python -m dlmpipe generate .*/{b}/", proc.stdout), b
