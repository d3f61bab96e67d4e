"""Sampler rules on hand-built logits (docs/METHODS.md §1.1 and §1.3)."""
from __future__ import annotations

import pytest
import torch

from dlmpipe.methods import build_sampler
from dlmpipe.samplers.llada_confidence import transfer_schedule
from dlmpipe.samplers.saber import remask_count

from .models import HAND_MASK as MASK
from .models import HAND_PROMPT as P
from .models import HAND_VOCAB as V
from .models import logits_for, start


def test_remask_count_formula():
    # r = min(max(floor(n/2), ceil(k/mu)), k - 1)
    assert [remask_count(2, 2, k) for k in range(1, 7)] == [0, 1, 2, 2, 3, 3]
    assert [remask_count(4, 2, k) for k in range(1, 6)] == [0, 1, 2, 2, 3]
    assert remask_count(2, 1, 5) == 4


def test_saber_first_step_accepts_n_most_confident_then_remasks_lowest_drift():
    s = build_sampler({"name": "saber", "n": 2, "mu": 2, "block_length": 4})
    x = start(s, 8)
    probs = [0.5, 0.9, 0.3, 0.7, 0.99, 0.99, 0.99, 0.99]  # right of the block edge ignored
    s.step(x, logits_for([4, 5, 6, 7, 8, 8, 8, 8], probs))
    # tau = 1.0 (nothing recorded): fallback accepts the 2 most confident in the window (1, 3);
    # r = min(max(1, 1), 1) = 1 re-masks the accepted token with the lowest drift (p - 0): pos 3
    assert x[P:].tolist() == [MASK, 5, MASK, MASK, MASK, MASK, MASK, MASK]
    assert s.committed.tolist() == [False, True] + [False] * 6
    assert s.acc[3].item() == pytest.approx(0.7)  # acc kept on remask
    assert s.stats()["revisions"] == 1 and s.stats()["accepted"] == 2 and s.stats()["remasked"] == 1


def test_saber_accepts_everything_above_running_mean():
    s = build_sampler({"name": "saber", "n": 1, "mu": 100, "block_length": 6})
    x = start(s, 6)
    s.step(x, logits_for([4] * 6, [0.6, 0.1, 0.1, 0.1, 0.1, 0.1]))  # n=1: accept pos 0, acc mean 0.6
    assert x[P:].tolist()[0] == 4
    s.step(x, logits_for([4, 5, 6, 7, 8, 9], [0.6, 0.65, 0.7, 0.2, 0.61, 0.5]))
    # tau = 0.6: positions 1, 2, 4 beat it -> k = 3, r = min(max(0, 1), 2) = 1 re-mask
    response = x[P:].tolist()
    assert s.stats()["accepted"] == 4
    assert sum(t != MASK for t in response) == 3


def test_saber_n_fallback_with_fewer_candidates_than_n():
    s = build_sampler({"name": "saber", "n": 4, "mu": 2, "block_length": 2})
    x = start(s, 4)
    s.step(x, logits_for([4, 5, 6, 7], [0.2, 0.3, 0.9, 0.9]))
    # only two uncommitted positions left of the edge; both accepted, the block is full:
    # no backtracking on this step, next block starts
    assert x[P:].tolist() == [4, 5, MASK, MASK]
    assert s.block == (2, 4)
    assert s.stats()["remasked"] == 0


def test_saber_never_remasks_prompt_and_finishes_every_block():
    torch.manual_seed(0)
    s = build_sampler({"name": "saber", "n": 2, "mu": 2, "block_length": 4})
    x = start(s, 12)
    prompt = x[:P].clone()
    while not s.done:
        s.step(x, torch.randn(12, V))
        assert torch.equal(x[:P], prompt)
        lo, hi = s.block
        assert (x[P + hi:] == MASK).all() or s.done  # nothing right of the window is touched
    assert (x[P:] != MASK).all()
    assert s.steps < 12 * 4


def test_saber_excludes_mask_from_argmax():
    s = build_sampler({"name": "saber", "n": 1, "block_length": 2})
    x = start(s, 2)
    logits = torch.zeros(2, V)
    logits[:, MASK] = 10.0
    logits[0, 3] = 1.0
    s.step(x, logits)
    assert MASK not in x[P:P + 1].tolist() and x[P] == 3


def test_transfer_schedule_puts_remainder_first():
    assert transfer_schedule(10, 4) == [3, 3, 2, 2]
    assert transfer_schedule(4, 4) == [1, 1, 1, 1]


def test_llada_confidence_unmasks_top_k_inside_block_and_never_changes_tokens():
    # 2 blocks, 2 steps each -> 2 tokens per step
    s = build_sampler({"name": "llada_confidence", "block_length": 4, "steps": 4})
    x = start(s, 8)
    s.step(x, logits_for([4, 5, 6, 7, 8, 8, 8, 8], [0.5, 0.9, 0.3, 0.7, 0.99, 0.99, 0.99, 0.99]))
    assert x[P:].tolist() == [MASK, 5, MASK, 7] + [MASK] * 4
    s.step(x, logits_for([9, 9, 9, 9, 8, 8, 8, 8], [0.1] * 8))
    assert x[P:P + 4].tolist() == [9, 5, 9, 7]  # earlier tokens unchanged
    assert s.block == (4, 8)
    s.step(x, logits_for([1] * 8, [0.2] * 4 + [0.3, 0.8, 0.4, 0.9]))
    assert x[P + 4:].tolist() == [MASK, 1, MASK, 1]
    s.step(x, logits_for([2] * 8, [0.5] * 8))
    assert s.done and (x[P:] != MASK).all()


def test_llada_confidence_gumbel_sampling_is_seeded_float64():
    logits = torch.randn(8, V)
    outs = []
    for _ in range(2):
        s = build_sampler({"name": "llada_confidence", "temperature": 1.0})
        x = torch.cat([torch.tensor([1, 2, 3]), torch.full((8,), MASK)])
        s.begin(P, 8, MASK, torch.Generator().manual_seed(5))
        while not s.done:
            s.step(x, logits)
        outs.append(x.clone())
    assert torch.equal(outs[0], outs[1])
    greedy = build_sampler({"name": "llada_confidence", "temperature": 0.0})
    x = torch.cat([torch.tensor([1, 2, 3]), torch.full((8,), MASK)])
    greedy.begin(P, 8, MASK)
    while not greedy.done:
        greedy.step(x, logits)
    assert torch.equal(x[P:], logits.argmax(-1))


def test_block_length_must_divide_gen_length():
    with pytest.raises(ValueError, match="multiple of block_length"):
        build_sampler({"name": "llada_confidence", "block_length": 5}).begin(P, 8, MASK)
