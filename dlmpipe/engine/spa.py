"""SPA-Cache: singular-proxy identification and adaptive layer budgets (docs/METHODS.md §2.3).

On the selective-update mechanism of ``selective.py``: step 0 and every ``refresh_steps``-th
step are full refreshes (prompt and response), every ``refresh_gen_steps``-th step recomputes
the whole response over the cached prompt K/V, and every other step recomputes at layer l >= 1
only the ``int(rho(l) * G)`` response rows whose identifier (by default the rank-r singular
proxy ``S_r B_r^T h`` of the value projection, ``proxies.py``) drifted most since last step.

The layer budget rho(l), t = l / L: a split Gaussian peaking at ``m`` with height ``rho_p`` and
ends ``rho_1`` (t = 0) and ``rho_L`` (t = 1); per-backbone constants in ``PROFILES``
(spa_profiles.py, with the rules of ``profile: auto``). ``rho_p`` sets the peak with the ends
rescaled in proportion (the reference's max_update_ratio), ``scale`` multiplies the whole
profile, ``left_floor`` clips the left side from below. ``budget: uniform`` gives every layer
``rho`` (the paper's ablation).
"""
from __future__ import annotations

import math

from ..backbones.model import Backbone
from .selective import SelectiveCache, rows_for_budget
from .spa_profiles import PROFILES


def split_gaussian(t: float, m: float, rho_p: float, rho_1: float, rho_L: float,
                   left_floor: float | None = None) -> float:
    """``rho(t) = rho_p exp(-(t - m)^2 / (2 sigma^2))``, sigma from the left end for t < m
    (``sigma^2 = m^2 / (2 ln(rho_p / rho_1))``) and from the right end otherwise
    (``(1 - m)^2 / (2 ln(rho_p / rho_L))``); an end equal to the peak makes its side flat."""
    left = t < m
    end, span = (rho_1, m) if left else (rho_L, 1.0 - m)
    ratio = math.log(rho_p / end)
    if ratio == 0.0 or t == m:
        rho = rho_p
    else:
        sigma2 = span ** 2 / (2.0 * ratio)
        rho = rho_p * math.exp(-((t - m) ** 2) / (2.0 * sigma2))
    if left and left_floor is not None:
        rho = max(rho, left_floor)
    return rho


def layer_budgets(n_layers: int, profile: str, rho_p: float | None = None,
                  scale: float = 1.0, left_floor: float | None = None) -> list[float]:
    """rho(l) for l = 0..L-1 at t = l / L, clipped to 1 (layer 0 runs dense regardless)."""
    c = dict(PROFILES[profile])
    if rho_p is not None:  # a new peak, the ends rescaled with it: same shape
        c = {**c, "rho_1": c["rho_1"] * rho_p / c["rho_p"], "rho_L": c["rho_L"] * rho_p / c["rho_p"],
             "rho_p": rho_p}
    c = {**c, **{k: c[k] * scale for k in ("rho_p", "rho_1", "rho_L")}}
    return [min(1.0, split_gaussian(i / n_layers, c["m"], c["rho_p"], c["rho_1"], c["rho_L"], left_floor))
            for i in range(n_layers)]


class SPACache(SelectiveCache):
    def __init__(self, model: Backbone, *, identifier: str, rank: int, budget: str, profile: str,
                 rho_p: float | None, scale: float, left_floor: float | None, rho: float,
                 kv_update: str, refresh_steps: int | None, refresh_gen_steps: int | None,
                 proxies=None):
        self.refresh_steps, self.refresh_gen_steps = refresh_steps, refresh_gen_steps
        super().__init__(model, identifier=identifier, kv_update=kv_update,
                         rank=rank if identifier == "singular" else None, proxies=proxies)
        n = model.cfg.n_layers
        self.budget = budget
        self.rho_per_layer = ([min(1.0, rho)] * n if budget == "uniform"
                              else layer_budgets(n, profile, rho_p, scale, left_floor))

    def schedule(self, step: int) -> tuple[bool, bool]:
        full = self.refresh_steps is not None and step % self.refresh_steps == 0
        response = self.refresh_gen_steps is not None and step % self.refresh_gen_steps == 0
        return full, full or response

    def layer_budget(self, layer: int, gen_len: int) -> int:
        return rows_for_budget(self.rho_per_layer[layer], gen_len)

    def extra_stats(self) -> dict:
        return {**super().extra_stats(), "layer_budget": [round(r, 6) for r in self.rho_per_layer]}
