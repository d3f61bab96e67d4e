"""Threshold/factor parallel decoding and random fixed-order decoding (docs/METHODS.md §1.2, §2.6)."""
from __future__ import annotations

import pytest
import torch

from dlmpipe.decode import decode
from dlmpipe.engine.full import FullRecompute
from dlmpipe.methods import build_cache, build_sampler
from dlmpipe.samplers.parallel import factor_accepts, threshold_accepts

from .models import HAND_MASK as MASK
from .models import HAND_PROMPT as P
from .models import decode_method, logits_for, random_prompt, start, tiny_backbone


def c(*values):
    return torch.tensor(values, dtype=torch.float64)


# ---- the acceptance rules on hand-built confidences ------------------------------------------
def test_factor_rule_on_hand_built_confidences():
    # f = 1: thresholds 1 - 1/(i+1) for i = 2, 3, 4, 5: 0.667, 0.75, 0.8, 0.833
    assert factor_accepts(c(0.99, 0.9, 0.8, 0.79), 1.0) == 3    # 0.79 < 0.8 stops at n = 3
    assert factor_accepts(c(0.99, 0.9, 0.8, 0.8, 0.84), 1.0) == 5
    assert factor_accepts(c(0.3, 0.2, 0.1), 1.0) == 1            # the first always
    # f = 3: thresholds 1 - 3/3 = 0 (i = 2), 1 - 3/4 = 0.25 (i = 3), 0.4 (i = 4)
    assert factor_accepts(c(0.3, 0.2, 0.1), 3.0) == 2            # 0.1 < 0.25
    assert factor_accepts(c(0.5, 0.26, 0.25, 0.39), 3.0) == 3    # >= counts; 0.39 < 0.4
    assert factor_accepts(c(0.5), 0.1) == 1
    assert factor_accepts(c(), 1.0) == 0


def released_factor_count(sorted_confidence: list[float], f: float) -> int:
    """Fast-dLLM's released loop (get_transfer_index_dynamic), restated: thresholds
    1 - f/(n+1) for n = 1..m with the first set to -1, stop at the first candidate below its
    threshold, and add one when the loop ended at index 0 or at the last index."""
    thresholds = [-1] + [1 - f / (n + 1) for n in range(2, len(sorted_confidence) + 1)]
    for top_i in range(len(thresholds)):
        if sorted_confidence[top_i] < thresholds[top_i]:
            break
    if top_i == 0 or top_i == len(thresholds) - 1:
        top_i += 1
    return top_i


def test_factor_released_rule_differs_exactly_where_the_released_code_does():
    # f = 1, thresholds 0.667, 0.75, 0.8: only the last of four fails -> paper 3, released 4
    assert factor_accepts(c(0.99, 0.9, 0.8, 0.79), 1.0) == 3
    assert factor_accepts(c(0.99, 0.9, 0.8, 0.79), 1.0, released=True) == 4
    assert factor_accepts(c(0.99, 0.5), 1.0, released=True) == 2       # m = 2, the second fails
    assert factor_accepts(c(0.99, 0.5, 0.4), 1.0, released=True) == 1  # an earlier one fails
    assert factor_accepts(c(0.3, 0.2, 0.1), 3.0, released=True) == 3   # paper 2 of 3
    assert factor_accepts(c(0.99, 0.9, 0.8, 0.8, 0.84), 1.0, released=True) == 5  # all pass
    assert factor_accepts(c(0.3), 1.0, released=True) == 1
    assert factor_accepts(c(), 1.0, released=True) == 0
    g = torch.Generator().manual_seed(0)
    differ = 0
    for _ in range(3000):
        m = int(torch.randint(1, 7, (1,), generator=g))
        conf = torch.sort(0.5 + 0.5 * torch.rand(m, generator=g, dtype=torch.float64), descending=True).values
        f = float(torch.rand(1, generator=g)) * 2 + 0.05
        paper, released = factor_accepts(conf, f), factor_accepts(conf, f, released=True)
        assert released == released_factor_count(conf.tolist(), f)
        assert (paper != released) == (m >= 2 and paper == m - 1)
        differ += paper != released
    assert differ > 100  # the case is common, not a corner


def test_factor_step_with_the_released_rule_accepts_the_failing_last_candidate():
    probs = [0.99, 0.9, 0.8, 0.79]              # sorted as is; only 0.79 < 0.8 fails
    for rule, expected in (("paper", [4, 5, 6, MASK]), ("released", [4, 5, 6, 7])):
        s = build_sampler({"name": "factor", "f": 1.0, "rule": rule, "block_length": 4})
        x = start(s, 4)
        s.step(x, logits_for([4, 5, 6, 7], probs))
        assert x[P:].tolist() == expected, rule
    with pytest.raises(ValueError, match="rule must be one of paper, released"):
        build_sampler({"name": "factor", "rule": "code"})


def test_threshold_rule_on_hand_built_confidences():
    assert threshold_accepts(c(0.95, 0.92, 0.9, 0.3), 0.9) == 3  # >= tau counts
    assert threshold_accepts(c(0.5, 0.4), 0.9) == 1               # the most confident always
    assert threshold_accepts(c(0.999, 0.999), 1.0) == 1
    assert threshold_accepts(c(), 0.9) == 0


def test_threshold_step_accepts_the_confident_candidates_of_the_block_only():
    s = build_sampler({"name": "threshold", "tau": 0.9, "block_length": 4})
    x = start(s, 8)
    probs = [0.95, 0.3, 0.92, 0.5, 0.99, 0.99, 0.99, 0.99]  # right of the block: ignored
    s.step(x, logits_for([4, 5, 6, 7, 8, 8, 8, 8], probs))
    assert x[P:].tolist() == [4, MASK, 6, MASK] + [MASK] * 4
    s.step(x, logits_for([4, 5, 6, 7, 8, 8, 8, 8], [0.1, 0.3, 0.1, 0.5, 0.99, 0.99, 0.99, 0.99]))
    assert x[P:].tolist() == [4, MASK, 6, 7] + [MASK] * 4       # below tau: the most confident
    assert s.block == (0, 4) and s.stats()["accepted_per_step"] == [2, 1]


def test_factor_step_accepts_the_largest_valid_prefix():
    s = build_sampler({"name": "factor", "f": 1.0, "block_length": 6})
    x = start(s, 6)
    s.step(x, logits_for([2, 3, 4, 5, 6, 7], [0.8, 0.99, 0.2, 0.9, 0.79, 0.95]))
    # sorted 0.99 (1), 0.95 (5), 0.9 (3), 0.8 (0), 0.79 (4): thresholds 0.667, 0.75, 0.8, 0.833
    assert x[P:].tolist() == [2, 3, MASK, 5, MASK, 7]


def test_threshold_one_accepts_exactly_one_token_per_step():
    s = build_sampler({"name": "threshold", "tau": 1.0, "block_length": 4})
    x = start(s, 8)
    while not s.done:
        s.step(x, logits_for([5] * 8, [0.999] * 8))
    assert s.stats()["steps"] == 8 and s.stats()["accepted_per_step"] == [1] * 8
    model = tiny_backbone("llada", seed=1)
    r = decode(model, build_sampler({"name": "threshold", "tau": 1.0, "block_length": 8}),
               build_cache({"name": "none"}, model),
               random_prompt(9, 1), 16)
    assert r.stats["steps"] == r.stats["nfe"] == 16
    assert r.stats["accepted_per_step"] == [1] * 16


def test_the_mask_token_is_never_decoded():
    s = build_sampler({"name": "threshold", "tau": 0.0, "block_length": 4})  # tau 0: every candidate accepted
    x = start(s, 4)
    s.step(x, logits_for([MASK, MASK, 3, MASK], [0.9, 0.9, 0.9, 0.9]))  # MASK the argmax
    assert s.done and MASK not in x[P:].tolist()


# ---- a block never ends with masks left ---------------------------------------------------------
class BlockWatch(FullRecompute):
    """Full recompute that checks, at every block change, that the left block has no masks."""

    def begin(self, x, prompt_len):
        super().begin(x, prompt_len)
        self.last_block, self.blocks = None, []

    def response_logits(self, x, block):
        if block != self.last_block:
            if self.last_block is not None:
                lo, hi = self.last_block
                assert (x[self.prompt_len + lo:self.prompt_len + hi] != self.model.cfg.mask_id).all()
            self.last_block = block
            self.blocks.append(block)
        return super().response_logits(x, block)


@pytest.mark.parametrize("spec", [
    {"name": "threshold", "tau": 0.9, "block_length": 4},
    {"name": "threshold", "tau": 0.0, "block_length": 8},
    {"name": "threshold", "tau": 1.0, "block_length": 8, "max_steps_per_block": 3},
    {"name": "factor", "f": 1.0, "block_length": 4},
    {"name": "factor", "f": 0.2, "block_length": 16, "max_steps_per_block": 1},
    {"name": "random_order", "block_length": 4},
    {"name": "random_order", "block_length": 8, "steps": 4}],
    ids=["thr0.9", "thr0", "thr1-cap3", "fac1", "fac0.2-cap1", "random", "random-2perblock"])
@pytest.mark.parametrize("family", ["llada", "dream"])
def test_a_block_never_ends_with_masks_left(spec, family):
    sampler = build_sampler(spec)
    model = tiny_backbone(family, seed=2)
    cache = BlockWatch(model)
    r = decode(model, sampler, cache, random_prompt(7, 2), 16, torch.Generator().manual_seed(0))
    assert (r.response != model.cfg.mask_id).all()
    length = sampler.block_length
    assert cache.blocks == [(lo, lo + length) for lo in range(0, 16, length)]
    if getattr(sampler, "max_steps_per_block", None):
        assert r.stats["steps"] <= sampler.max_steps_per_block * (16 // length)


def test_step_cap_accepts_every_remaining_candidate():
    s = build_sampler({"name": "threshold", "tau": 1.0, "block_length": 4, "max_steps_per_block": 2})
    x = start(s, 8)
    while not s.done:
        s.step(x, logits_for([5] * 8, [0.5] * 8))
    assert s.stats()["accepted_per_step"] == [1, 3, 1, 3]


def test_parallel_samplers_reject_bad_parameters():
    with pytest.raises(ValueError, match="tau"):
        build_sampler({"name": "threshold", "tau": 1.5})
    with pytest.raises(ValueError, match="f must be"):
        build_sampler({"name": "factor", "f": 0})
    with pytest.raises(ValueError, match="max_steps_per_block"):
        build_sampler({"name": "threshold", "max_steps_per_block": 0})
    with pytest.raises(ValueError, match="not a multiple"):
        build_sampler({"name": "threshold", "block_length": 5}).begin(P, 16, MASK)


# ---- random fixed order -----------------------------------------------------------------------
def test_random_order_is_fixed_at_block_start_seeded_and_announced():
    def orders(seed):
        s = build_sampler({"name": "random_order", "block_length": 4, "steps": 4})  # 2 steps per block, 2 tokens each
        x = start(s, 8)
        s.begin(P, 8, MASK, torch.Generator().manual_seed(seed))
        seen = []
        while not s.done:
            due = s.due_positions().tolist()
            assert s.due_positions().tolist() == due  # asking twice draws nothing new
            before = x[P:].clone()
            s.step(x, logits_for([7] * 8, [0.9] * 8))
            assert (x[P:] != before).nonzero()[:, 0].tolist() == sorted(due)
            seen.append(due)
        return seen

    a, b = orders(0), orders(0)
    assert a == b
    assert sorted(a[0] + a[1]) == [0, 1, 2, 3] and sorted(a[2] + a[3]) == [4, 5, 6, 7]
    assert any(orders(s) != a for s in range(1, 6))
    assert all(len(d) == 2 for d in a)


def test_order_seed_gives_every_sample_the_same_block_orders():
    def orders(spec, sample_seed):
        s = build_sampler({"name": "random_order", "block_length": 4, "steps": 8, **spec})
        x = start(s, 8)
        s.begin(P, 8, MASK, torch.Generator().manual_seed(sample_seed))
        seen = []
        while not s.done:
            seen += s.due_positions().tolist()
            s.step(x, logits_for([7] * 8, [0.9] * 8))
        return seen

    fixed = [orders({"order_seed": 42}, sample) for sample in range(4)]
    assert all(o == fixed[0] for o in fixed)                     # independent of the sample
    # block b gets the b-th permutation of a generator seeded with order_seed at the sample's start
    g = torch.Generator().manual_seed(42)
    assert fixed[0] == torch.randperm(4, generator=g).tolist() + (torch.randperm(4, generator=g) + 4).tolist()
    assert orders({"order_seed": 43}, 0) != fixed[0]
    per_sample = [orders({}, sample) for sample in range(4)]     # null: the sample's generator
    assert len({tuple(o) for o in per_sample}) > 1
    assert orders({"order_seed": None}, 2) == per_sample[2]
    with pytest.raises(ValueError, match="order_seed must be an integer >= 0 or null"):
        build_sampler({"name": "random_order", "order_seed": -1})


def test_order_seed_leaves_temperature_noise_to_the_sample_generator():
    model = tiny_backbone("llada", seed=4)
    prompt = random_prompt(6, 4)
    spec = {"name": "random_order", "block_length": 8, "temperature": 1.0, "order_seed": 42}
    a, b = (decode_method(model, spec, {"name": "none"}, prompt, seed=s).response for s in (0, 1))
    assert not torch.equal(a, b)  # same orders, different Gumbel draws


def test_temperature_sampling_is_reproducible_with_the_seed():
    model = tiny_backbone("dream", seed=3)
    prompt = random_prompt(6, 3)

    def run(seed):
        return decode(model, build_sampler({"name": "threshold", "tau": 0.5, "block_length": 8, "temperature": 1.0}),
                      build_cache({"name": "none"}, model), prompt, 16, torch.Generator().manual_seed(seed)).response

    assert torch.equal(run(5), run(5))
