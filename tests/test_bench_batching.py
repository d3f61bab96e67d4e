"""benchmarks/bench_batching.py's compute floor: the operation count it divides by the peak must
be the decode's real arithmetic, or the floor it reports (how far batching can cut a job's wall
time) would be wrong."""
import sys
from pathlib import Path

import torch
from torch.utils import flop_counter

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import bench_batching as bb  # noqa: E402

from tests.models import random_prompt, tiny_backbone  # noqa: E402


def full_forward_flops(cfg, rows: int, logit_rows: int) -> int:
    """Multiply-adds x 2 of one full forward: projections, attention (QK^T and AV over every
    row), and the output head over the rows whose logits are read."""
    d, kv = cfg.d_model, cfg.n_kv_heads * cfg.head_dim
    layer = (2 * rows * d * (d + 2 * kv) + 2 * rows * d * d + 2 * rows * d * cfg.mlp_hidden * 3
             + 2 * 2 * rows * rows * d)
    return cfg.n_layers * layer + 2 * logit_rows * d * cfg.vocab_size


def test_job_flops_counts_every_matrix_product_and_attention_of_full_recompute():
    model = tiny_backbone("llada", seed=0)
    prompt_len, gen_len = 12, 8
    method = {"name": "full", "gen_length": gen_len, "cache": {"name": "none"},
              "sampler": {"name": "llada_confidence", "block_length": gen_len, "steps": gen_len}}
    with torch.inference_mode():
        flops = bb.job_flops(model, method, [random_prompt(prompt_len, 0)] * 2, gen_len)
    # one full forward per step (steps = gen_len), logits of the response rows
    assert flops == 2 * gen_len * full_forward_flops(model.cfg, prompt_len + gen_len, gen_len)


def test_a_cache_that_recomputes_fewer_rows_counts_fewer_flops_and_the_peak_is_a_rate():
    model = tiny_backbone("llada", seed=0)
    sampler = {"name": "llada_confidence", "block_length": 4, "steps": 8}
    prompts = [random_prompt(10, i) for i in range(2)]
    with torch.inference_mode():
        full = bb.job_flops(model, {"name": "f", "gen_length": 8, "sampler": sampler,
                                    "cache": {"name": "none"}}, prompts, 8)
        dual = bb.job_flops(model, {"name": "d", "gen_length": 8, "sampler": sampler,
                                    "cache": {"name": "fast_dllm_dual"}}, prompts, 8)
    assert 0 < dual < 0.8 * full
    assert bb.gemm_peak(torch.device("cpu"), torch.float32, size=256) > 1e8  # FLOP/s, any CPU


def test_grouped_query_attention_is_counted_whatever_torchs_own_sdpa_rule(monkeypatch):
    """Dream's fewer K/V heads than query heads: its attention counted by the script's formula
    (K/V heads shared by their query group), not torch's, whose shape rule depends on the version:
    torch 2.11's, which refuses fewer K/V heads (the H200 node's torch), stands in here."""
    torch_rule = flop_counter.sdpa_flop_count

    def rule_of_torch_2_11(q, k, v):
        if q[1] != k[1]:
            raise AssertionError("sdpa_flop_count: query/key/value shapes are incompatible")
        return torch_rule(q, k, v)
    monkeypatch.setattr(flop_counter, "sdpa_flop_count", rule_of_torch_2_11)
    model = tiny_backbone("dream", seed=0)
    assert model.cfg.n_kv_heads < model.cfg.n_heads
    prompt_len, gen_len = 12, 8
    method = {"name": "full", "gen_length": gen_len, "cache": {"name": "none"},
              "sampler": {"name": "llada_confidence", "block_length": gen_len, "steps": gen_len}}
    with torch.inference_mode():
        flops = bb.job_flops(model, method, [random_prompt(prompt_len, 0)], gen_len)
    # shifted logits: the head runs on the rows from P - 1 to the end, G + 1 of them
    assert flops == gen_len * full_forward_flops(model.cfg, prompt_len + gen_len, gen_len + 1)


def test_every_row_of_the_report_names_its_method():
    """Without compute floors (the GPU run) the timing row is the method's only one: it names it."""
    model = tiny_backbone("llada", seed=0)
    method = {"name": "archer-k8", "gen_length": 8, "cache": {"name": "archer", "K": 8},
              "sampler": {"name": "llada_confidence", "block_length": 8, "steps": 8}}
    lines = []
    with torch.inference_mode():
        bb.run(model, [method], [random_prompt(6, i) for i in range(2)], 8, [1, 2], repeats=1,
               say=lines.append, floors=False)
    assert lines and all(line.strip().startswith("archer-k8 ") for line in lines), lines
