"""Every sampler that generalises another reproduces it, token for token, at its degenerate
setting, on both backbone families (docs/METHODS.md, "Exactness").

The base samplers are the papers' (LLaDA confidence, Saber, Fast-dLLM's threshold and factor,
random order, Dream's own); every other registered sampler generalises one of them and adds one
row to ``GENERALISES``; ``test_every_other_sampler_has_a_row`` fails until it does.
"""
from __future__ import annotations

import json

import pytest
import torch

from dlmpipe import registry

from .models import FAMILIES, decode_method, random_prompt, tiny_backbone

BASE_SAMPLERS = {"llada_confidence", "saber", "threshold", "factor", "random_order", "dream",
                 # the releases' own block loops, checked against them (tests/test_block_releases.py)
                 "sdar", "fast_dllm_v2",
                 # dInfer's credit decoding: at credit_alpha 0 it is dInfer's own threshold rule
                 # (float32, every candidate within 1e-5 of the best), which no other sampler is;
                 # both checked against the release's rule (tests/test_dinfer.py)
                 "dinfer_credit"}


def row(sampler: dict, reference: dict, cache: dict | None = None) -> tuple[dict, dict, dict]:
    """``sampler`` at its degenerate setting decodes as ``reference`` does (over ``cache``,
    default full recompute)."""
    return sampler, reference, cache or {"name": "none"}


# id -> (sampler at its degenerate setting, the sampler it generalises, cache)
GENERALISES: dict[str, tuple[dict, dict, dict]] = {
    # Dream's maskgit_plus confidence at temperature 0 is LLaDA's probability (§1.1)
    "llada_confidence-maskgit_plus-t0": row(
        {"name": "llada_confidence", "block_length": 8, "confidence": "maskgit_plus"},
        {"name": "llada_confidence", "block_length": 8}),
    # sigma = inf: the certainty density is the same at every position (§1.6)
    "certainty_prior-sigma-inf": row(
        {"name": "certainty_prior", "block_length": 8, "sigma": "inf"},
        {"name": "llada_confidence", "block_length": 8}),
    "certainty_prior-sigma-inf-t0.7": row(
        {"name": "certainty_prior", "block_length": 8, "sigma": "inf", "temperature": 0.7},
        {"name": "llada_confidence", "block_length": 8, "temperature": 0.7}),
    # lambd = 0 without a reference corpus: weight 1, score min(p, alpha) = p (§1.7)
    "pc_sampler-lambd0-uncalibrated": row(
        {"name": "pc_sampler", "block_length": 8, "lambd": 0},
        {"name": "llada_confidence", "block_length": 8}),
    "pc_sampler-lambd0-uncalibrated-t0.7": row(
        {"name": "pc_sampler", "lambd": 0, "temperature": 0.7, "steps": 8},
        {"name": "llada_confidence", "temperature": 0.7, "steps": 8}),
    # WINO never re-masking (narrow_out 0: no verification confidence is < 0) is Fast-dLLM's
    # threshold rule: every mask with confidence >= tau, at least the most confident (0.03 on
    # these 64-token models: some steps take one, some several, some the whole block)
    "wino-narrow-out-0": row({"name": "wino", "wide_in": 0.03, "narrow_out": 0.0, "block_length": 8},
                             {"name": "threshold", "tau": 0.03, "block_length": 8}),
    # ... with Gumbel noise too: the same draws (the block's masked rows, in order)
    "wino-narrow-out-0-noise": row({"name": "wino", "wide_in": 0.03, "narrow_out": 0.0,
                                    "block_length": 8, "temperature": 0.7},
                                   {"name": "threshold", "tau": 0.03, "block_length": 8,
                                    "temperature": 0.7}),
    # gamma 0 accepts only the first candidate in order (the others' entropies are > 0), the
    # confidence order is the threshold sampler's, and tau 1 accepts only its most confident
    # candidate (the others' probabilities are < 1): one token per step, the same block loop
    "eb_sampler-gamma0/threshold-tau1": row(
        {"name": "eb_sampler", "gamma": 0.0, "error_proxy": "confidence", "block_length": 8},
        {"name": "threshold", "tau": 1.0, "block_length": 8}),
    "eb_sampler-gamma0-t0.7/threshold-tau1-t0.7": row(
        {"name": "eb_sampler", "gamma": 0.0, "error_proxy": "confidence", "block_length": 8,
         "temperature": 0.7, "rule": "released"},
        {"name": "threshold", "tau": 1.0, "block_length": 8, "temperature": 0.7}),
    # conf_threshold 1: no probability exceeds it, so every step falls back to LLaDA's top-k
    "klass-conf1/llada_confidence": row(
        {"name": "klass", "conf_threshold": 1.0, "block_length": 8},
        {"name": "llada_confidence", "block_length": 8}),
    "klass-conf1-k2-t0.7/llada_confidence": row(
        {"name": "klass", "conf_threshold": 1.0, "block_length": 8, "steps": 8, "temperature": 0.7},
        {"name": "llada_confidence", "block_length": 8, "steps": 8, "temperature": 0.7}),
    # dInfer's hierarchical decoding with both thresholds at 1: no run's best passes
    # low_threshold and no position passes threshold, so a step takes the block's most confident
    # candidate only: the threshold sampler at tau 1, with its draws (§1.13)
    "dinfer_hierarchy-thresholds1/threshold-tau1": row(
        {"name": "dinfer_hierarchy", "threshold": 1.0, "low_threshold": 1.0, "block_length": 8,
         "block_alignment": "response"},
        {"name": "threshold", "tau": 1.0, "block_length": 8}),
    "dinfer_hierarchy-thresholds1-t0.7/threshold-tau1-t0.7": row(
        {"name": "dinfer_hierarchy", "threshold": 1.0, "low_threshold": 1.0, "block_length": 8,
         "block_alignment": "response", "temperature": 0.7},
        {"name": "threshold", "tau": 1.0, "block_length": 8, "temperature": 0.7}),
}


#: the references' decodes, shared by the rows that generalise the same sampler setting (a
#: seeded decode gives the same bits each time): (family, seed, reference, cache, p_len) -> result
_REFERENCES: dict = {}


def _reference(model, family: str, seed: int, reference: dict, cache: dict, prompt):
    key = (family, seed, json.dumps([reference, cache], sort_keys=True), prompt.numel())
    if key not in _REFERENCES:
        _REFERENCES[key] = decode_method(model, reference, cache, prompt, seed=seed)
    return _REFERENCES[key]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", list(GENERALISES))
def test_degenerate_sampler_equals_the_sampler_it_generalises(family, name):
    sampler, reference, cache = GENERALISES[name]
    for seed in (0, 1, 2):
        # (the rows are rules on logits: 2 layers give the same variety as 3, e.g. WINO's row's
        # steps of one, several and a whole block)
        model = tiny_backbone(family, seed=seed, n_layers=2)
        for p_len in (5, 24):
            prompt = random_prompt(p_len, seed)
            ref = _reference(model, family, seed, reference, cache, prompt)
            got = decode_method(model, sampler, cache, prompt, seed=seed)
            assert torch.equal(got.response, ref.response), (seed, p_len)
            assert got.stats["steps"] == ref.stats["steps"], (seed, p_len)
            assert got.stats["nfe"] == ref.stats["nfe"], (seed, p_len)


def test_every_other_sampler_has_a_row():
    covered = {sampler["name"] for sampler, _, _ in GENERALISES.values()}
    # a base sampler may have rows too (its own variants: llada_confidence's confidences)
    assert set(registry.SAMPLERS) - BASE_SAMPLERS <= covered <= set(registry.SAMPLERS)
