"""A cached step's kernel launches stay within its stated budget (``dlmpipe.graphs.LAUNCHES``;
docs/ARCHITECTURE.md, performance shape): on a GPU an eager step is bound by its launches, not
its arithmetic (issue 48: LLaDA-8B's dual-cache step 43 ms against a 3.7 ms weight-streaming
floor), so a launch added to every layer is a regression even where the CPU does not notice.

Counted on the CPU with tests/host_sync.py's ``Launches`` (the ATen operations a step
dispatches, the GPU's plain ops) on a tiny model of 2 and 32 layers: the budget is
``per_layer * layers + constant``, so one more operation per layer costs 32 at 32 layers and
fails, and the two depths pin the per-layer part apart from the constant one."""
from __future__ import annotations

import pytest
import torch

from dlmpipe import registry
from dlmpipe.graphs import LAUNCHES
from dlmpipe.methods import build_cache, build_sampler

from .host_sync import CACHE_READS, SAMPLER_SPECS, launches_per_call
from .models import random_prompt, tiny_backbone

DEPTHS = (2, 32)


def test_every_cache_setting_states_a_budget():
    assert set(LAUNCHES) == set(CACHE_READS)


def cached_step_launches(cache_id: str, layers: int) -> int:
    """The most launches of any cached call in a short decode at ``layers`` layers."""
    spec = CACHE_READS[cache_id][0]
    block_causal = registry.CACHES[spec["name"]].needs_block_causal
    family = "sdar" if block_causal else "llada"
    sampler = next(n for n in SAMPLER_SPECS if not registry.pairing_problem(n, spec["name"])
                   and not registry.attention_problems({"sampler": {"name": n}, "cache": spec},
                                                       "block_causal" if block_causal else "full"))
    model = tiny_backbone(family, seed=4, n_layers=layers, d_model=16, n_heads=2).to(torch.bfloat16)
    calls = launches_per_call(model, build_sampler(SAMPLER_SPECS[sampler]), build_cache(spec, model),
                              random_prompt(9, 4))
    cached = [n for is_cached, n in calls if is_cached]
    assert cached, f"{cache_id}: no cached step in the decode (its parameters: {spec})"
    return max(cached)


@pytest.mark.parametrize("cache_id", list(LAUNCHES))
def test_a_cached_step_launches_no_more_than_its_budget(cache_id):
    per_layer, constant = LAUNCHES[cache_id]
    counts = {layers: cached_step_launches(cache_id, layers) for layers in DEPTHS}
    slope = (counts[DEPTHS[1]] - counts[DEPTHS[0]]) / (DEPTHS[1] - DEPTHS[0])
    measured = f"{cache_id}: {counts} launches at {DEPTHS} layers: {slope:g} per layer + " \
               f"{counts[DEPTHS[1]] - slope * DEPTHS[1]:g}; budget {per_layer} per layer + {constant}"
    for layers, n in counts.items():
        assert n <= per_layer * layers + constant, measured


def test_one_more_launch_per_layer_exceeds_the_budget(monkeypatch):
    """The guard's point: an operation added to every layer (here a copy of the FFN's output)
    puts the 32-layer step over its budget."""
    from dlmpipe.backbones.model import Backbone

    ffn = Backbone.ffn
    monkeypatch.setattr(Backbone, "ffn", lambda self, layer, h: ffn(self, layer, h).clone())
    per_layer, constant = LAUNCHES["archer-kinf"]
    assert cached_step_launches("archer-kinf", 32) > per_layer * 32 + constant
