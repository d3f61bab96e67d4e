"""Full recompute ("none"): one bidirectional forward over all N positions per step.

The exactness reference every other cache is tested against.
"""
from __future__ import annotations

from torch import Tensor

from ..backbones.model import Backbone
from .base import Cache
from .shadow import append, with_shadow


def full_response_logits(model: Backbone, x: Tensor, prompt_len: int,
                         shadow_block: tuple[int, int] | None = None) -> Tensor:
    """Response logits ``[G, V]`` of one full bidirectional forward over ``x [N]`` (no cache
    involved: also the shadow probe's fresh logits, docs/ANALYSES.md), followed by the
    verification logits of ``shadow_block`` when given (WINO's shadow rows, engine/shadow.py)."""
    shadow = with_shadow(model, x, prompt_len, shadow_block)
    h = model.hidden_states(x[None], shadow)
    return append(model.response_logits_from_rows(h[:, model.first_logit_row(prompt_len):])[0], shadow)


class FullRecompute(Cache):
    shadow_rows = True

    def response_logits(self, x: Tensor, block: tuple[int, int]) -> Tensor:
        self.stats.nfe += 1
        return full_response_logits(self.model, x, self.prompt_len, self.shadow)
