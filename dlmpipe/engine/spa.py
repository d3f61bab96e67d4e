"""SPA-Cache: singular-proxy identification and adaptive layer budgets (docs/METHODS.md §2.3).

On the selective-update mechanism of ``selective.py``: step 0 and every ``refresh_steps``-th
step are full refreshes (prompt and response), every ``refresh_gen_steps``-th step recomputes
the whole response over the cached prompt K/V, and every other step recomputes at layer l >= 1
only the ``int(rho(l) * G)`` response rows whose identifier (by default the rank-r singular
proxy ``S_r B_r^T h`` of the value projection, ``proxies.py``) drifted most since last step.

The layer budget rho(l), t = l / L: a split Gaussian peaking at ``m`` with height ``rho_p`` and
ends ``rho_1`` (t = 0) and ``rho_L`` (t = 1); per-backbone constants in ``PROFILES``
(spa_profiles.py, with ``layer_budgets`` and the rules of ``profile: auto``). ``rho_p`` sets the peak with the ends
rescaled in proportion (the reference's max_update_ratio), ``scale`` multiplies the whole
profile, ``left_floor`` clips the left side from below. ``budget: uniform`` gives every layer
``rho`` (the paper's ablation).
"""
from __future__ import annotations

from ..backbones.model import Backbone
from .selective import SelectiveCache, rows_for_budget
from .spa_profiles import layer_budgets


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
