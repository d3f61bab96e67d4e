"""dLLM-Cache (Liu et al. 2025; docs/METHODS.md §2.4) as a policy of the selective-update mechanism.

Global step counter from 1: the prompt part is refreshed when ``(step - 1) % K_p == 0``, the
response part when ``(step - 1) % K_r == 0`` (step 1 refreshes both); layer 0 is always dense
over the response. Between response refreshes, the adaptive partial update: V of every
response row is computed and replaces the cached V, the ``floor(G * rho)`` rows whose new V is
least similar (cosine) to last step's are recomputed (Q, K, attention, FFN) and scattered, and
every other row reuses its cached attention + FFN output on top of its current input.
"""
from __future__ import annotations

from ..backbones.model import Backbone
from .selective import SelectiveCache, rows_for_budget


class DLLMCache(SelectiveCache):
    def __init__(self, model: Backbone, *, K_p: int, K_r: int, rho: float):
        super().__init__(model, identifier="value", kv_update="values")
        self.K_p, self.K_r, self.rho = K_p, K_r, rho

    def schedule(self, step: int) -> tuple[bool, bool]:
        return step % self.K_p == 0, step % self.K_r == 0  # step is (1-based step) - 1

    def layer_budget(self, layer: int, gen_len: int) -> int:
        return rows_for_budget(self.rho, gen_len)
