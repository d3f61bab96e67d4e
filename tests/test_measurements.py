"""Per-sample measurements of the decode loop and the generation job: time to first token,
generated length and tokens per second, and the invariants that tie them to ``time_s``."""
from __future__ import annotations

import time

import pytest
import torch

from dlmpipe.decode import DecodeResult, decode
from dlmpipe.engine.base import Cache
from dlmpipe.generate import measurements
from dlmpipe.samplers.base import Sampler

from .models import MASK_ID, random_prompt, tiny_backbone, decode_method

STEP_S = 0.01


class LateSampler(Sampler):
    """Commits nothing for ``idle`` steps, then one token per step; each step sleeps STEP_S."""

    def __init__(self, idle: int):
        self.idle = idle

    def step(self, x, logits):
        time.sleep(STEP_S)
        self.steps += 1
        if self.steps > self.idle:
            response = x[self.prompt_len:]
            response[self.steps - self.idle - 1] = 5
        self.done = not bool((x[self.prompt_len:] == self.mask_id).any())


class ZeroLogits(Cache):
    def response_logits(self, x, block):
        self.stats.nfe += 1
        return torch.zeros(x.shape[0] - self.prompt_len, 8)


@pytest.mark.parametrize("idle", [0, 3])
def test_ttft_ends_at_the_step_that_commits_the_first_token(idle):
    model = tiny_backbone()
    gen_len = 4
    res = decode(model, LateSampler(idle), ZeroLogits(model), random_prompt(3, 0), gen_len)
    steps = idle + gen_len
    # sleeps give lower bounds: the first token comes after idle + 1 steps and gen_len - 1
    # steps follow it inside the timed region
    assert res.ttft_s >= (idle + 1) * STEP_S
    assert res.time_s - res.ttft_s >= (gen_len - 1) * STEP_S
    assert res.time_s >= steps * STEP_S and res.stats["nfe"] == steps


def test_ttft_of_real_methods_is_within_the_generation():
    model = tiny_backbone()
    prompt = random_prompt(5, 1)
    for sampler, cache in ((({"name": "llada_confidence"}), {"name": "none"}),
                           ({"name": "saber", "n": 2, "mu": 2}, {"name": "archer", "K": 4}),
                           ({"name": "threshold", "tau": 0.9, "block_length": 8},
                            {"name": "fast_dllm_dual"})):
        res = decode_method(model, sampler, cache, prompt, gen_len=16)
        assert 0 < res.ttft_s <= res.time_s, (sampler, cache)
        assert not (res.response == MASK_ID).any()


def test_measurement_columns_obey_their_invariants():
    res = DecodeResult(response=torch.zeros(8, dtype=torch.long), time_s=0.25, ttft_s=0.01)
    m = measurements(prompt_len=12, generated=5, res=res)
    assert m == {"prompt_length": 12, "generated_length": 5, "job_ttft_s": 0.01, "job_tps": 20.0}
    assert m["job_tps"] * res.time_s == pytest.approx(m["generated_length"])
    assert measurements(12, 0, res)["job_tps"] == 0.0
