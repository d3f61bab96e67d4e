"""A block size per backbone (``backbones.<b>.block_size``) and per method
(``methods.<m>.block_size``), as the releases take it as a generation argument (docs/MODELS.md,
"Block sizes and generation lengths"): it changes the block-causal attention itself
(``BackboneConfig.block_size``: ``attention_mask``, the full forward, the block loop), not only
a sampler's sub-blocks; the campaign refuses what the release does not allow, naming the key;
the key reaches the job (campaign -> generate params -> loaded model); ``dlmpipe plan`` states
each release's gen_length mapping; changing a backbone's block size reruns exactly its jobs.
"""
from __future__ import annotations

import copy

import pytest
import torch

from dlmpipe.campaign import Campaign
from dlmpipe.decode import decode
from dlmpipe.methods import build_method
from dlmpipe.trace import DecodeTrace

from .checkpoints import make_tiny_checkpoint, moe_checkpoint
from .models import BLOCK_FAMILIES, TINY_BLOCK, random_prompt, tiny_backbone
from .test_block_causal import decode_full_sequence
from .test_plan_checks import problems
from .workflow import REPORT_JOBS, decoding_jobs, fake_finished_run, scheduled, timing_jobs

#: a block size other than each tiny family's own (TINY_BLOCK: sdar 4, fast_dllm_v2 8, llada2 8)
OTHER = {"sdar": 8, "fast_dllm_v2": 4, "llada2": 4}


# ---- the model: the block-causal attention at another size ------------------------------------
@pytest.mark.parametrize("family", [*BLOCK_FAMILIES, "llada2"])
def test_the_attention_mask_and_the_full_forward_follow_the_block_size(family):
    """At block size n the mask is ``k // n <= q // n`` and the full forward obeys it: a row's
    logits do not change when tokens of later blocks (of size n) change, and do change when a
    token later in its own block does (which at the checkpoint's size was a later block)."""
    model = tiny_backbone(family, seed=0, n_layers=2, stop_ids=[])
    native, n = TINY_BLOCK[family], OTHER[family]
    model.use_block_size(n)
    assert model.cfg.block_size == n
    pos = torch.arange(24)
    assert torch.equal(model.attention_mask(pos, pos), (pos[None, :] // n) <= (pos[:, None] // n))
    x = random_prompt(24, 3)[None]
    with torch.no_grad():
        base = model(x)
        for cut in range(1, 24):
            y = x.clone()
            y[0, cut:] = (y[0, cut:] + 7) % 60 + 1
            other = model(y)
            block_end = (cut // n) * n  # rows before this are in blocks wholly before `cut`
            assert torch.equal(other[0, :block_end], base[0, :block_end]), (family, cut)
            if cut % n:  # rows of cut's own block before it see the changed tokens
                assert not torch.allclose(other[0, block_end:cut], base[0, block_end:cut]), (family, cut)
    model.use_block_size(None)  # back to the checkpoint's
    assert model.cfg.block_size == native


@pytest.mark.parametrize("family", [*BLOCK_FAMILIES, "llada2"])
@pytest.mark.parametrize("sampler", [{"name": "llada_confidence"},
                                     {"name": "threshold", "tau": 0.3, "block_length": 2}],
                         ids=lambda s: s["name"])
def test_decoding_at_another_block_size_equals_the_full_forward_with_that_mask(family, sampler):
    """The block loop at the campaign's block size: one active block of n positions at a time
    (every step's active block is a block of n), token for token what recomputing the whole
    sequence with the size-n mask gives; and not what the checkpoint's size gives (in some case:
    the checkpoint's size is decoded until one differs)."""
    n = OTHER[family]
    differs = False
    for seed in (0, 1):
        model = tiny_backbone(family, seed=seed, n_layers=2, stop_ids=[])
        for p_len in (5, 8, 13):
            prompt = random_prompt(p_len, seed)
            native = None if differs else decode_full_sequence(model, sampler, prompt, 16, seed)[0]
            model.use_block_size(n)
            ref, ref_stats = decode_full_sequence(model, sampler, prompt, 16, seed)
            s, c = build_method({"sampler": sampler, "cache": {"name": "none"}}, model)
            trace = DecodeTrace()
            got = decode(model, s, c, prompt, 16, torch.Generator().manual_seed(seed), trace)
            assert torch.equal(got.response, ref), (family, seed, p_len)
            assert got.stats["steps"] == ref_stats["steps"]
            steps = [r for r in trace.records if r["kind"] == "step"]
            assert steps and all(r["block"][0] % n == 0 and r["block"][1] - r["block"][0] == n
                                 for r in steps), [r["block"] for r in steps]
            differs |= native is not None and not torch.equal(native, ref)
            model.use_block_size(None)
    assert differs, "the block size changed no decode: the test cannot tell the sizes apart"


def test_a_bidirectional_backbone_refuses_a_block_size():
    model = tiny_backbone("llada")
    with pytest.raises(ValueError, match=r"^backbones\.toy\.block_size: 8: the llada family attends "
                                         "bidirectionally"):
        model.use_block_size(8, "backbones.toy.block_size")
    sdar = tiny_backbone("sdar")
    with pytest.raises(ValueError, match=r"^methods\.m\.block_size: 0: a block size is a positive"):
        sdar.use_block_size(0, "methods.m.block_size")


# ---- the campaign: resolved, checked, carried to the job ---------------------------------------
@pytest.fixture
def block_campaign(tiny_config, tmp_path, monkeypatch):
    """The tiny campaign with an SDAR, a Fast-dLLM v2 and a LLaDA2.0 checkpoint beside the toy
    (every method runs on every backbone)."""
    monkeypatch.chdir(tmp_path)
    cfg = tiny_config
    cfg["backbones"]["sdar"] = {"path": str(make_tiny_checkpoint(tmp_path / "sdar", "sdar"))}
    cfg["backbones"]["v2"] = {"path": str(make_tiny_checkpoint(tmp_path / "v2", "fast_dllm_v2"))}
    cfg["backbones"]["l2"] = {"path": str(moe_checkpoint(tmp_path / "l2", "llada2"))}
    return cfg


def test_a_backbones_block_size_reaches_its_jobs_only(block_campaign):
    cfg = block_campaign
    assert problems(cfg) == []
    plain = Campaign(copy.deepcopy(cfg))
    assert all("block_size" not in plain.method(m, t, b) for b, t, m in plain.decoding_jobs())
    cfg["backbones"]["sdar"]["block_size"] = 8
    cfg["backbones"]["l2"]["block_size"] = 16
    c = Campaign(copy.deepcopy(cfg))
    for b, t, m in c.decoding_jobs():
        want = {"sdar": 8, "l2": 16}.get(b)
        assert c.method(m, t, b).get("block_size") == want, (b, t, m)
        if want is None:  # every other job's params are what they were
            assert c.method(m, t, b) == plain.method(m, t, b)
    # `python -m dlmpipe.campaign` shows where a method decodes otherwise than configured
    assert c.differences("llada-confidence") == {"sdar": "block_size=8", "l2": "block_size=16"}


def test_a_methods_block_size_wins_over_the_backbones(block_campaign):
    cfg = block_campaign
    cfg["backbones"]["sdar"]["block_size"] = 8
    cfg["methods"]["wide"] = {"sampler": {"name": "llada_confidence"}, "cache": {"name": "none"},
                              "block_size": 2, "backbones": ["sdar", "l2"]}
    c = Campaign(copy.deepcopy(cfg))
    assert {b: c.method("wide", "toy_code", b)["block_size"] for b in ("sdar", "l2")} == \
        {"sdar": 2, "l2": 2}
    assert c.method("llada-confidence", "toy_code", "sdar")["block_size"] == 8


def test_bad_block_sizes_are_refused_naming_the_key(block_campaign):
    cfg = block_campaign
    bad = copy.deepcopy(cfg)
    bad["backbones"]["toy"]["block_size"] = 4  # the toy is LLaDA's: bidirectional
    bad["backbones"]["sdar"]["block_size"] = 0
    found = problems(bad)
    assert any(p.startswith("backbones.sdar.block_size: 0 is out of range") for p in found), found
    bad = copy.deepcopy(cfg)
    bad["backbones"]["toy"]["block_size"] = 4
    assert problems(bad) == [
        "backbones.toy.block_size: 4: backbones.toy (toy) (llada family) attends bidirectionally, "
        "it has no blocks; a block size applies to the block-causal families only (sdar, "
        "fast_dllm_v2, llada2)"]
    bad = copy.deepcopy(cfg)
    bad["methods"]["wide"] = {"sampler": {"name": "llada_confidence"}, "cache": {"name": "none"},
                              "block_size": 2}
    found = problems(bad)
    assert found and all(p.startswith("methods.wide.block_size: 2: ") and "toy" in p
                         and p.endswith("(methods.wide.backbones)") for p in found), found
    # Fast-dLLM v2: batch_sample decodes max_new_tokens // block_size blocks past the prompt's
    bad = copy.deepcopy(cfg)
    bad["backbones"]["v2"]["block_size"] = 16
    found = problems(bad)
    assert found and all(p.startswith("backbones.v2.block_size: 16 exceeds gen_length 8") for p in found), found
    # ... and steps block_size // small_block_size sub-blocks: they must tile the block
    bad = copy.deepcopy(cfg)
    bad["methods"]["v2-loop"] = {"sampler": {"name": "fast_dllm_v2", "sub_block_length": 4},
                                 "cache": {"name": "none"}, "block_size": 6, "backbones": ["v2"]}
    found = problems(bad)
    assert found and all(p.startswith("methods.v2-loop.block_size: 6 is not a multiple of "
                                      "sampler.sub_block_length 4") for p in found), found
    bad["methods"]["v2-loop"]["block_size"] = 8
    assert problems(bad) == []


@pytest.mark.parametrize("backbone", ["sdar", "l2"])
def test_the_block_size_reaches_the_loaded_model(block_campaign, backbone):
    """campaign -> the generate job's method (its params) -> the model the job decodes with."""
    from dlmpipe.generate import load_job_model, method_params

    cfg = block_campaign
    cfg["backbones"][backbone]["block_size"] = 2
    method = Campaign(copy.deepcopy(cfg)).method("llada-confidence", "toy_code", backbone)
    assert '"block_size": 2' in method_params(method)
    man = {"path": cfg["backbones"][backbone]["path"], "dtype": "float32", "name": backbone}
    job = load_job_model(man, torch.device("cpu"), method)
    assert job.model.cfg.block_size == 2
    pos = torch.arange(6)
    assert torch.equal(job.model.attention_mask(pos, pos), (pos[None, :] // 2) <= (pos[:, None] // 2))
    # without the key the checkpoint's own
    del cfg["backbones"][backbone]["block_size"]
    method = Campaign(copy.deepcopy(cfg)).method("llada-confidence", "toy_code", backbone)
    assert load_job_model(man, torch.device("cpu"), method).model.cfg.block_size == \
        {"sdar": 4, "l2": 32}[backbone]


def test_plan_prints_each_block_causal_backbones_size_and_gen_length_mapping(block_campaign):
    from dlmpipe.plan import render

    cfg = block_campaign
    cfg["backbones"]["sdar"]["block_size"] = 8
    cfg["backbones"]["blk"] = {"shipped": "toy_block"}  # SDAR's format
    text = render(Campaign(copy.deepcopy(cfg)), "test")
    section = text.split("block sizes and generation lengths on block-causal backbones", 1)[1]
    assert "sdar: block size 8 (backbones.sdar.block_size; the checkpoint's 4)" in section
    assert "v2: block size 8 (the checkpoint's)" in section
    assert "l2: block size 32 (the checkpoint's)" in section
    assert "SDAR generate.py block_diffusion_generate" in section
    assert "Fast-dLLM v2 batch_sample" in section and "one token more" in section
    assert "dInfer" in section
    assert "toy: block size" not in section
    blk = section.split("blk: block size 8 (the checkpoint's)\n", 1)[1].splitlines()[0]
    assert "SDAR generate.py block_diffusion_generate" in blk


# ---- the workflow: a backbone's block size is a param of its generate jobs ---------------------
def test_changing_a_backbones_block_size_reruns_exactly_its_jobs(tmp_path, warm_snakemake, tiny_config,
                                                                 write_config):
    cfg = tiny_config
    cfg["backbones"]["blk"] = {"shipped": "toy_block"}
    base = write_config(cfg, tmp_path / "base.yaml")
    fake_finished_run(tmp_path, base, snakemake=warm_snakemake)
    methods = ["llada-confidence", "archer-k1", "archer-kinf"]
    tasks = ["toy_code", "toy_arith"]
    cfg["backbones"]["blk"]["block_size"] = 4
    proc = warm_snakemake(tmp_path, "-n", configfile=write_config(cfg, tmp_path / "changed.yaml"))
    assert scheduled(proc.stdout) == (decoding_jobs(["blk"], tasks, methods)
                                      | timing_jobs(["blk"], tasks, methods) | REPORT_JOBS)


# ---- `dlmpipe decode --block-size`: the same rule and the same attention ----------------------
def test_quick_decode_takes_a_block_size_and_refuses_a_bad_one(tmp_path):
    import json

    from dlmpipe.quick_decode import quick_decode

    trace = tmp_path / "trace.jsonl"
    r = quick_decode("shipped:toy_block", "llada_confidence", "none", "1+2=", 16, device="cpu",
                     trace=str(trace), block_size=4)
    assert r["method"]["block_size"] == 4
    steps = [x for x in map(json.loads, trace.read_text().splitlines()) if x["kind"] == "step"]
    assert steps and all(x["block"][0] % 4 == 0 and x["block"][1] - x["block"][0] == 4
                         for x in steps)
    with pytest.raises(ValueError, match=r"^--block-size: 4: shipped toy \(llada family\) attends "
                                         "bidirectionally"):
        quick_decode("shipped:toy", "llada_confidence", "none", "1+2=", 16, device="cpu",
                     block_size=4)


def test_generate_and_timing_jobs_decode_each_method_at_its_block_size(tmp_path):
    """A generate job decodes at its method's block size (its params record it); the timing job
    switches the model's block size per method, so a method at 4 timed against a reference at
    the checkpoint's 8 decodes exactly its generate job's tokens, and the reference its own."""
    import json

    import pyarrow.parquet as pq

    from dlmpipe.backbones.manifest import write_manifest
    from dlmpipe.backbones.shipped import SHIPPED_DIR
    from dlmpipe.generate import run_generation_job
    from dlmpipe.tasks import load_task, write_task_table
    from dlmpipe.timing import run_timing_job

    man = tmp_path / "manifest.json"
    write_manifest(SHIPPED_DIR / "toy_block", man, name="blk")
    task = tmp_path / "toy_arith.parquet"
    write_task_table(load_task("toy_arith", n=4, seed=2), task)
    ref = {"name": "ref", "sampler": {"name": "llada_confidence"}, "cache": {"name": "none"},
           "gen_length": 16}
    small = {**ref, "name": "small", "block_size": 4}
    tokens = {}
    for m in (ref, small):
        gen = tmp_path / f"{m['name']}.parquet"
        run_generation_job(str(man), str(task), m, str(gen), str(gen.with_suffix(".json")),
                           device="cpu", warmup=False)
        rows = pq.read_table(gen).to_pandas()
        assert json.loads(rows["params"][0]).get("block_size") == m.get("block_size")
        # the trained toy decodes these samples' tokens alike at 4 and 8; its block loop does
        # not: other blocks, other steps, prefill and commit forwards (NFE) per sample
        tokens[m["name"]] = {r.sample_index: (list(r.token_ids), r.nfe) for r in rows.itertuples()}
    assert all(tokens["small"][i][1] != tokens["ref"][i][1] for i in tokens["ref"]), \
        {m: {i: v[1] for i, v in t.items()} for m, t in tokens.items()}
    out = tmp_path / "timing.parquet"
    run_timing_job(str(man), str(task), small, str(out), reference=ref, device="cpu", samples=4,
                   repeats=1, log=lambda *_: None, batch_size=2)
    timed = pq.read_table(out).to_pandas()
    assert set(timed["method"]) == {"ref", "small"}
    for row in timed.itertuples():
        assert (list(row.token_ids), row.nfe) == tokens[row.method][row.sample_index], \
            (row.method, row.sample_index)


def test_a_sweep_over_block_sizes_names_one_method_per_size(block_campaign):
    """``sweep: {block_size: [...]}``: a block-size ablation, one method per size (sdar-b2,
    sdar-b8), each point's jobs at its size; a bad point is refused naming the sweep key."""
    cfg = block_campaign
    cfg["methods"]["sdar"] = {"sampler": {"name": "sdar"}, "cache": {"name": "none"},
                              "backbones": ["sdar", "l2"], "sweep": {"block_size": [2, 8]}}
    c = Campaign(copy.deepcopy(cfg))
    assert [m for m in c.methods if m.startswith("sdar")] == ["sdar-b2", "sdar-b8"]
    assert {(m, b): c.method(m, "toy_code", b)["block_size"] for m in ("sdar-b2", "sdar-b8")
            for b in ("sdar", "l2")} == {("sdar-b2", "sdar"): 2, ("sdar-b2", "l2"): 2,
                                         ("sdar-b8", "sdar"): 8, ("sdar-b8", "l2"): 8}
    assert c.differences("sdar-b2") == {}  # its own block size, as configured
    cfg["methods"]["sdar"]["backbones"] = ["v2"]
    cfg["methods"]["sdar"]["sweep"] = {"block_size": [8, 16]}
    found = problems(cfg)
    assert found and all(p.startswith("methods.sdar.sweep.block_size: 16 exceeds gen_length 8")
                         for p in found), found
    cfg["methods"]["sdar"]["backbones"] = ["toy"]
    cfg["methods"]["sdar"]["sweep"] = {"block_size": [8]}
    found = problems(cfg)
    assert any(p.startswith("methods.sdar.sweep.block_size: 8: backbones.toy (toy) (llada family) "
                            "attends bidirectionally") and p.endswith("(methods.sdar.backbones)")
               for p in found), found
    cfg["methods"]["sdar"]["sweep"] = {"block_size": [0]}
    assert any(p.startswith("methods.sdar.sweep.block_size: 0: ") for p in problems(cfg)), problems(cfg)


def test_an_lm_eval_model_of_a_campaign_method_decodes_at_its_block_size(tmp_path, tiny_config,
                                                                          write_config):
    """``DlmpipeLM(method=..., config=...)``: a campaign method's own block size reaches the model
    lm-eval decodes with (a point of its block_size sweep)."""
    pytest.importorskip("lm_eval")
    from dlmpipe.lmeval.model import DlmpipeLM

    tiny_config["backbones"]["blk"] = {"shipped": "toy_block"}
    tiny_config["methods"]["blocky"] = {"sampler": {"name": "llada_confidence"},
                                        "cache": {"name": "none"}, "backbones": ["blk"],
                                        "sweep": {"block_size": [2, 4]}}
    config = write_config(tiny_config, tmp_path / "c.yaml")
    lm = DlmpipeLM(checkpoint="shipped:toy_block", method="blocky-b2", config=str(config),
                   device="cpu")
    assert lm.loaded.model.cfg.block_size == 2
    assert DlmpipeLM(checkpoint="shipped:toy_block", method="llada-confidence", config=str(config),
                     device="cpu").loaded.model.cfg.block_size == 8


def test_plan_prices_each_job_at_its_block_size(block_campaign):
    """The GPU-hour estimate prices a block-causal job's blocks at the campaign's size
    (cost.block_causal_cost), not the checkpoint's."""
    from dlmpipe.plan import Gpu, estimate

    cfg = block_campaign
    native = estimate(Campaign(copy.deepcopy(cfg)), Gpu(), 1.0, 64.0)
    cfg["backbones"]["sdar"]["block_size"] = 16
    wider = estimate(Campaign(copy.deepcopy(cfg)), Gpu(), 1.0, 64.0)
    assert wider["sdar"].hours["generate"] != native["sdar"].hours["generate"]
    assert wider["l2"].hours == native["l2"].hours and wider["toy"].hours == native["toy"].hours
