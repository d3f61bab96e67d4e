"""Full recompute ("none"): one bidirectional forward over all N positions per step.

The exactness reference every other cache is tested against.
"""
from __future__ import annotations

from torch import Tensor

from .base import Cache


class FullRecompute(Cache):
    def response_logits(self, x: Tensor, block: tuple[int, int]) -> Tensor:
        self.stats.nfe += 1
        m = self.model
        h = m.hidden_states(x[None])
        return m.response_logits_from_rows(h[:, m.first_logit_row(self.prompt_len):])[0]
