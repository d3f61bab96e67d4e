"""The cost model (`python -m dlmpipe plan`, dlmpipe/plan.py and cost.py) on the MoE and
block-causal backbones: a mixture of experts is priced by the parameters a token passes through
(router, top-k routed experts, shared experts, attention, embedding and head), not by every
expert it holds; a block-causal backbone by the rows its forwards compute (the active block, the
prompt once, each finished block once at its commit), not by full-sequence forwards."""
from __future__ import annotations

import copy
import math
import re
import types

import pytest
import torch

from dlmpipe import cost, plan, registry
from dlmpipe.backbones.checkpoint_config import read_config, read_fields
from dlmpipe.backbones.model import Backbone

from .checkpoints import block_checkpoint, moe_checkpoint
from .workflow import REPO

# widths chosen so that no shortcut coincides with the active count: top-3 of 8 experts of 24
# with a shared expert of 24 (LLaDA2.0's one shared expert is moe_intermediate_size wide) against
# a dense FFN of 96
SHAPES = {"n_experts": 8, "top_k": 3, "expert_hidden": 24, "mlp_hidden": 96, "n_layers": 3}


def stub(name: str, path):
    return types.SimpleNamespace(config={"backbones": {name: {"path": str(path)}}},
                                 checkpoint_path=lambda b: path)


def native_counts(path) -> tuple[int, int]:
    """(every parameter, the parameters a row passes through) of the native model built from
    the checkpoint, counted on the model itself: every parameter, less the routed experts a row
    does not use ((E - k) of each MoE layer's E, all the same size)."""
    cfg = read_config(path)
    with torch.device("meta"):
        model = Backbone(cfg)
    total = sum(p.numel() for p in model.parameters())
    unused = 0
    for i, block in enumerate(model.blocks):
        if hasattr(block, "moe"):
            experts = [e for e in block.moe.experts]
            size = sum(p.numel() for p in experts[0].parameters())
            assert all(sum(p.numel() for p in e.parameters()) == size for e in experts)
            unused += (len(experts) - cfg.experts_per_token) * size
    return total, total - unused


@pytest.mark.parametrize("family", ["llada_moe", "llada2"])
def test_an_moe_checkpoint_is_priced_by_its_active_parameters(family, tmp_path):
    path = moe_checkpoint(tmp_path / family, family, sharded=False, **SHAPES)
    total, active = native_counts(path)
    size = plan.backbone_size(stub("m", path), "m")
    assert size.parameters == active < total
    assert size.total == size.weights == total  # the memory need keeps every expert (gpus.py)
    # not the dense formula over config.json's mlp_hidden either
    c = read_fields(path)
    dense = plan.parameters(c["d_model"], c["n_layers"], c["n_heads"], c["n_kv_heads"], c["mlp_hidden"],
                            c["vocab_size"], c["qkv_bias"], c.get("attn_head_dim"), c.get("qk_norm", False))
    assert size.parameters != dense
    assert size.block_size == (32 if family == "llada2" else None)


def test_the_released_llada2_mini_architecture_gives_the_cards_counts(tmp_path):
    """LLaDA2.0-mini's config.json fields (docs/MODELS.md) give 1.4B active of 16B, as its model
    card says (the active count is the formula's; the total adds the (E - k) unused experts)."""
    mini = {"hidden_size": 2048, "num_hidden_layers": 20, "num_attention_heads": 16,
            "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 5120,
            "moe_intermediate_size": 512, "num_experts": 256, "num_experts_per_tok": 8,
            "num_shared_experts": 1, "first_k_dense_replace": 1, "n_group": 8, "topk_group": 4,
            "vocab_size": 157184}
    path = moe_checkpoint(tmp_path / "mini", "llada2", sharded=False, **mini)
    c = read_fields(path)
    active = plan.active_parameters(c)
    unused = 19 * (256 - 8) * 3 * 2048 * 512
    assert 1.40e9 < active < 1.45e9
    assert 16.0e9 < active + unused < 16.5e9


def test_plan_only_moe_checkpoints_are_priced_active(capsys, tmp_path, write_config):
    """`dlmpipe plan configs/moe.yaml` without the checkpoints: GPU-hours in proportion to the
    active parameters (mini and flash decode the same jobs: 6.1 / 1.4, where the totals would give
    100 / 16), the weights for the GPU count in proportion to the totals; the assumptions say so."""
    from dlmpipe.cli import main

    assert main(["plan", str(REPO / "configs" / "moe.yaml")]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split() for line in out.split("GPU-hours per backbone")[1]
            .split("\n\n")[0].splitlines()[2:]}
    hours = {b: float(r[5]) for b, r in rows.items() if b != "total"}
    assert rows["llada2-flash"][1] == "6.10B" and rows["llada2-mini"][1] == "1.40B"
    assert hours["llada2-flash"] / hours["llada2-mini"] == pytest.approx(6.1 / 1.4, rel=0.01)
    assert "weights 200.0 GB" in out and "weights 32.0 GB" in out
    assumptions = out.split("\nassumptions:\n")[1]
    assert "priced by the ACTIVE parameters per token" in assumptions
    # LLaDA-MoE is bidirectional: not in the block-causal line
    assert re.search(r"block-causal backbones, block size \(llada2-mini \(32\), llada2-flash \(32\)\): ",
                     assumptions)


def method(sampler: dict, cache: dict | None = None, gen_length: int = 256) -> dict:
    return registry.bind_method({"gen_length": gen_length, "sampler": sampler,
                                 "cache": cache or {"name": "none"}}, None)


def test_block_causal_rows_are_the_active_blocks_and_each_row_once_more():
    """Full recompute, one token per step, 256 positions in blocks of 32 after a prompt of 100:
    8 blocks x 32 updates of 32 rows, the prompt once, each block's 32 rows once at its commit;
    full attention computes all 356 rows at each of the 256 updates."""
    m = method({"name": "llada_confidence", "block_length": 32, "steps": 256})
    full = cost.decode_cost(m, 100)
    assert (full.updates, full.rows) == (256, 256 * 356)
    d = cost.decode_cost(m, 100, block_size=32)
    assert d.updates == 256 and d.rows == 100 + 8 * (32 * 32 + 32)
    assert d.full == 256  # every update a forward over the whole active block
    # SDAR's loop on its own block size: blocks of 4, 4 steps each (and not 4 where it is 32)
    sdar = method({"name": "sdar", "steps": 4, "confidence_threshold": 1.0})
    d4 = cost.decode_cost(sdar, 100, block_size=4)
    assert (d4.updates, d4.rows) == (64 * 4, 100 + 64 * (4 * 4 + 4))
    llada2 = method({"name": "sdar", "steps": 32, "confidence_threshold": 0.95})
    d32 = cost.decode_cost(llada2, 100, block_size=32)
    assert (d32.updates, d32.rows) == (8 * 32, 100 + 8 * (32 * 32 + 32))
    # a cache's rows inside the active block: the dual cache over sub-blocks of 8
    dual = method({"name": "threshold", "block_length": 8}, {"name": "fast_dllm_dual"})
    dd = cost.decode_cost(dual, 100, block_size=32)
    assert dd.updates == 8 * 32 and dd.rows == 100 + 8 * (4 * (32 + 7 * 8) + 32)
    # a block_length that does not divide the active block is one sub-block of it
    wide = cost.decode_cost(method({"name": "dinfer_hierarchy", "block_length": 64}), 100, block_size=32)
    assert wide.updates == 256 and wide.rows == 100 + 8 * (32 * 32 + 32)


def test_the_estimate_prices_a_block_causal_moe_checkpoint_by_both(tmp_path):
    """plan.estimate on an LLaDA2.0 checkpoint: each generate job's FLOPs are 2 x active
    parameters x the block-causal rows (a mutation to total parameters or full-sequence rows
    changes them)."""
    from dlmpipe.campaign import Campaign

    path = moe_checkpoint(tmp_path / "LLaDA2.0-tiny", "llada2", sharded=False, **SHAPES)
    config = {"results_dir": str(tmp_path / "r"), "device": "cuda", "reference_method": "base",
              "backbones": {"l2": {"path": str(path), "dtype": "bfloat16"}},
              "tasks": {"toy_code": {"n": 4, "seed": 1000, "gen_length": 64}},
              "methods": {"base": {"sampler": {"name": "llada_confidence", "steps": 64,
                                               "block_length": 32}, "cache": {"name": "none"}}}}
    campaign = Campaign(copy.deepcopy(config))
    gpu = plan.Gpu()
    est = plan.estimate(campaign, gpu)["l2"]
    _, active = native_counts(path)
    p = plan.prompt_tokens(campaign, "l2", "toy_code", est.size, None)
    rows = p + 2 * (32 * 32 + 32)
    want = gpu.hours(4 * 2 * active * rows, True) + gpu.hours(2 * active * rows, False)
    assert est.hours["generate"] == pytest.approx(want)
    assert not math.isclose(est.hours["generate"], want * est.size.total / active)


def test_plan_states_what_a_block_length_means_on_a_block_causal_backbone(capsys):
    """A sampler's block_length that does not divide a block-causal backbone's block size is one
    sub-block, the whole active block (docs/METHODS.md, dlmpipe/blockwise.py): the plan says so
    for each (method, backbone) it changes, and for no other (blocks of 32 on blocks of 32, any
    block on the bidirectional LLaDA-MoE); the cost model prices it as that block."""
    from dlmpipe.cli import main

    assert main(["plan", str(REPO / "configs" / "moe.yaml")]) == 0
    out = capsys.readouterr().out
    notes = out.split("block lengths on block-causal backbones")[1].split("\n\n")[0].splitlines()[1:]
    assert {tuple(re.match(r"  - (\S+) on (\S+): sampler\.block_length (\d+) ", n).groups())
            for n in notes} == {(m, b, "64") for m in ("dinfer-hierarchy", "dinfer-credit")
                                for b in ("llada2-mini", "llada2-flash")}
    assert all("one sub-block, the whole active block of 32" in n for n in notes)
    as64 = cost.decode_cost(method({"name": "dinfer_hierarchy", "block_length": 64}), 50, block_size=32)
    as32 = cost.decode_cost(method({"name": "dinfer_hierarchy", "block_length": 32}), 50, block_size=32)
    assert as64 == as32
