"""benchmarks/bench_batching.py's compute floor: the operation count it divides by the peak must
be the decode's real arithmetic, or the floor it reports (how far batching can cut a job's wall
time) would be wrong."""
import sys
from pathlib import Path

import torch

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
