"""Dream's native sampler on hand-built logits (docs/METHODS.md §1.5)."""
from __future__ import annotations

import math

import pytest
import torch

from dlmpipe.methods import build_sampler
from dlmpipe.samplers.dream import confidence_of, draw, filter_logits, transfer_fractions

from .models import HAND_MASK as MASK
from .models import HAND_PROMPT as P
from .models import HAND_VOCAB as V
from .models import decode_method, logits_for, random_prompt, start, tiny_backbone


def rows_of(*probs: list[float]) -> torch.Tensor:
    """Logits whose softmax is each given distribution over the first tokens (0 elsewhere)."""
    out = torch.full((len(probs), V), float("-inf"))
    for i, p in enumerate(probs):
        out[i, :len(p)] = torch.log(torch.tensor(p))
    return out


def unmasked_per_step(spec: dict, logits: torch.Tensor, seed: int = 0) -> list[int]:
    s = build_sampler(spec)
    x = start(s, logits.shape[0])
    s.begin(P, logits.shape[0], MASK, torch.Generator().manual_seed(seed))
    counts = []
    while not s.done:
        before = int((x[P:] == MASK).sum())
        s.step(x, logits)
        counts.append(before - int((x[P:] == MASK).sum()))
    return counts


# ---- the schedule -------------------------------------------------------------------------------
def test_schedule_counts_follow_linspace_with_eps():
    # t = linspace(1, 0.001, 5) = 1, 0.75025, 0.5005, 0.25075, 0.001
    # m = 8: floor(8 * 0.24975) = 1; m = 7: floor(7 * 0.33289) = 2; m = 5: floor(5 * 0.49900) = 2;
    # the last step: the remaining 3
    fractions = transfer_fractions(4, 1e-3)
    assert fractions.dtype == torch.float32
    assert fractions.tolist() == pytest.approx([0.24975, 1 - 0.5005 / 0.75025, 1 - 0.25075 / 0.5005, 1.0])
    logits = logits_for([4] * 8, [0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2])
    for alg in ("maskgit_plus", "topk_margin", "entropy"):
        assert unmasked_per_step({"name": "dream", "alg": alg, "steps": 4}, logits) == [1, 2, 2, 3]
    # steps null: G steps; the schedule still ends with every mask decoded
    counts = unmasked_per_step({"name": "dream", "alg": "entropy"}, logits)
    assert len(counts) == 8 and sum(counts) == 8


def test_the_most_confident_masks_are_unmasked_and_visible_tokens_never_change():
    s = build_sampler({"name": "dream", "alg": "maskgit_plus", "steps": 4})
    x = start(s, 8)
    assert s.block == (0, 8)              # no blocks: every masked row is a candidate
    s.step(x, logits_for([4, 5, 6, 7, 8, 9, 10, 1], [0.5, 0.9, 0.3, 0.7, 0.2, 0.6, 0.4, 0.1]))
    assert x[P:].tolist() == [MASK, 5] + [MASK] * 6                     # 1 token: the 0.9 one
    s.step(x, logits_for([2] * 8, [0.5, 0.99, 0.3, 0.7, 0.2, 0.6, 0.4, 0.8]))
    # 2 tokens among the masks (position 1 is visible: its 0.99 is no candidate)
    assert x[P:].tolist() == [MASK, 5, MASK, 2, MASK, MASK, MASK, 2]
    s.step(x, logits_for([3] * 8, [0.1] * 8))
    s.step(x, logits_for([1] * 8, [0.1] * 8))
    assert s.done and s.stats()["steps"] == 4 and s.stats()["revisions"] == 0
    assert x[P:P + 4].tolist()[1::2] == [5, 2] and (x[P:] != MASK).all()


def test_each_alg_ranks_by_its_own_confidence():
    # A: two tokens at 0.5; B: 0.5 then 11 x 0.5/11; C: 0.6, 0.3, then 10 x 0.01; D: uniform
    a = [0.5, 0.5]
    b = [0.5] + [0.5 / 11] * 11
    c = [0.6, 0.3] + [0.01] * 10
    d = [1 / 12] * 12
    logits = rows_of(a, b, c, d)
    probs = torch.softmax(logits, -1)
    tokens = probs.argmax(-1)
    assert confidence_of(probs, tokens, "maskgit_plus").tolist() == pytest.approx([0.5, 0.5, 0.6, 1 / 12])
    assert confidence_of(probs, tokens, "topk_margin").tolist() == pytest.approx(
        [0, 0.5 - 0.5 / 11, 0.3, 0], abs=1e-6)
    entropy = [sum(p * math.log(p + 1e-10) for p in row) for row in (a, b, c, d)]
    assert confidence_of(probs, tokens, "entropy").tolist() == pytest.approx(entropy, rel=1e-5)
    # G = 4, steps 2: the first step unmasks floor(4 * (1 - 0.5005)) = 1 position, each alg its own
    for alg, chosen in (("maskgit_plus", 2), ("topk_margin", 1), ("entropy", 0)):
        s = build_sampler({"name": "dream", "alg": alg, "steps": 2})
        x = start(s, 4)
        s.step(x, logits)
        assert (x[P:] != MASK).nonzero()[:, 0].tolist() == [chosen], alg


# ---- filters ------------------------------------------------------------------------------------
def test_top_p_keeps_the_smallest_prefix_over_p_after_the_temperature():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    kept = lambda t, p, k=None: (filter_logits(logits, t, p, k) > torch.finfo(torch.float32).min).sum().item()
    assert kept(0, 0.7) == 2          # cumulative 0.5, 0.8 > 0.7: the second one still kept
    assert kept(0, 0.4) == 1          # the first one always
    assert kept(0, 1.0) == 4 and kept(0, None) == 4
    assert kept(2.0, 0.7) == 3        # divided by 2 first: 0.379, 0.673, 0.880 -> three kept
    assert kept(0, None, 3) == 3 and kept(0, 0.7, 1) == 1
    # at temperature 0 the filters still renormalize the confidence (the argmax is unchanged)
    probs = torch.softmax(filter_logits(logits, 0, 0.7, None), -1)
    assert probs[0].tolist() == pytest.approx([0.625, 0.375, 0, 0])


def test_sampled_tokens_come_from_the_filtered_distribution():
    logits = torch.log(torch.tensor([0.4, 0.3, 0.2, 0.1] + [1e-9] * 8)).repeat(64, 1)
    seen = set()
    for seed in range(4):
        s = build_sampler({"name": "dream", "alg": "entropy", "temperature": 1.0, "top_p": 0.6,
                           "steps": 1})
        x = start(s, 64)
        s.begin(P, 64, MASK, torch.Generator().manual_seed(seed))
        s.step(x, logits)
        seen |= set(x[P:].tolist())
    assert seen == {0, 1}             # cumulative 0.4, 0.7 > 0.6: tokens 0 and 1 only
    s = build_sampler({"name": "dream", "temperature": 1.0, "top_k": 1, "steps": 1})
    x = start(s, 64)
    s.step(x, logits)
    assert set(x[P:].tolist()) == {0}


# ---- randomness ---------------------------------------------------------------------------------
def test_a_token_is_drawn_as_torch_multinomial_draws_it():
    """The same tokens as the released code's ``torch.multinomial(probs, 1)`` from the same
    generator, filtered rows (exact zeros) included, without its host reads."""
    g = torch.Generator().manual_seed(7)
    for seed in range(20):
        probs = torch.softmax(filter_logits(3 * torch.randn(16, V, generator=g), 0.2, 0.95, None), -1)
        want = torch.multinomial(probs, 1, generator=torch.Generator().manual_seed(seed))[:, 0]
        assert torch.equal(draw(probs, torch.Generator().manual_seed(seed)), want)


def test_alg_temp_draws_without_replacement_by_softmax_of_confidence_reproducibly():
    logits = logits_for([4, 5, 6, 7], [0.6, 0.3, 0.3, 0.3])
    spec = {"name": "dream", "alg": "maskgit_plus", "steps": 2, "alg_temp": 0.3}

    def first_choice(seed):
        s = build_sampler(spec)
        x = start(s, 4)
        s.begin(P, 4, MASK, torch.Generator().manual_seed(seed))
        s.step(x, logits)
        return (x[P:] != MASK).nonzero()[:, 0].tolist()

    picks = [first_choice(seed) for seed in range(3000)]
    assert all(len(p) == 1 for p in picks)
    assert picks[:50] == [first_choice(seed) for seed in range(50)]  # the sample's generator
    expected = torch.softmax(torch.tensor([0.6, 0.3, 0.3, 0.3]) / 0.3, 0)
    freq = torch.bincount(torch.tensor([p[0] for p in picks]), minlength=4) / len(picks)
    assert freq.tolist() == pytest.approx(expected.tolist(), abs=0.03)
    # alg_temp 0 (or null) is the deterministic choice
    assert unmasked_per_step({**spec, "alg_temp": 0}, logits) == [1, 3]
    spec_det = {**spec, "alg_temp": None}
    s = build_sampler(spec_det)
    x = start(s, 4)
    s.step(x, logits)
    assert (x[P:] != MASK).nonzero()[:, 0].tolist() == [0]


def test_origin_unmasks_each_mask_with_probability_one_minus_s_over_t():
    logits = logits_for([4] * 64, [0.9] * 64)
    firsts = []
    for seed in range(100):
        counts = unmasked_per_step({"name": "dream", "alg": "origin", "steps": 4}, logits, seed)
        assert sum(counts) == 64          # the last step unmasks what is left
        firsts.append(counts[0])
    assert sum(firsts) / (100 * 64) == pytest.approx(1 - 0.75025, abs=0.02)
    assert len(set(firsts)) > 1           # random counts, unlike the confidence algs
    assert (unmasked_per_step({"name": "dream", "alg": "origin", "steps": 4}, logits, 7)
            == unmasked_per_step({"name": "dream", "alg": "origin", "steps": 4}, logits, 7))


def test_temperature_sampling_is_reproducible_with_the_sample_generator():
    model = tiny_backbone("dream", seed=3)
    prompt = random_prompt(6, 3)
    spec = {"name": "dream", "alg": "entropy", "temperature": 0.2, "top_p": 0.95}
    runs = [decode_method(model, spec, {"name": "none"}, prompt, seed=s).response for s in (5, 5, 6)]
    assert torch.equal(runs[0], runs[1])
    r = decode_method(model, spec, {"name": "none"}, prompt, seed=5)
    assert r.stats["steps"] == r.stats["nfe"] == 16


# ---- what Dream's code does that the other samplers do not ---------------------------------------
def test_mask_is_not_excluded_a_position_given_mask_stays_masked():
    s = build_sampler({"name": "dream", "alg": "maskgit_plus", "steps": 1})
    x = start(s, 3)
    s.step(x, logits_for([MASK, 4, 5], [0.9, 0.9, 0.9]))
    assert s.done and x[P:].tolist() == [MASK, 4, 5]


def test_stale_or_nan_rows_of_visible_positions_are_ignored():
    s = build_sampler({"name": "dream", "alg": "entropy", "temperature": 0.5, "top_p": 0.9, "steps": 2})
    x = start(s, 4)
    s.begin(P, 4, MASK, torch.Generator().manual_seed(0))
    x[P + 1] = 7                          # visible: its row may be NaN (dKV-Cache serves masks only)
    logits = logits_for([4, 5, 6, 8], [0.9] * 4)
    logits[1] = float("nan")
    while not s.done:
        s.step(x, logits)
    assert x[P + 1] == 7 and (x[P:] != MASK).all()
