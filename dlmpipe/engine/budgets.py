"""SPA-Cache's adaptive layer budget rho(l) (docs/METHODS.md §2.3): plain math, no torch, so the
drift-profile figure (dlmpipe/analysis/mechanism.py) draws it without loading the engine.

The layer budget rho(l), t = l / L: a split Gaussian peaking at ``m`` with height ``rho_p`` and
ends ``rho_1`` (t = 0) and ``rho_L`` (t = 1); per-backbone constants in ``PROFILES``.
"""
from __future__ import annotations

import math

# m, rho_p, rho_1, rho_L (docs/METHODS.md §2.3; Dream's are rescaled so the peak is 0.25)
PROFILES: dict[str, dict[str, float]] = {
    "llada-8b-instruct": {"m": 0.75, "rho_p": 0.25, "rho_1": 0.03, "rho_L": 0.13},
    "llada-1.5": {"m": 0.80, "rho_p": 0.25, "rho_1": 0.03, "rho_L": 0.13},
    "dream-7b": {"m": 0.5, "rho_p": 0.25, "rho_1": 0.05 * 0.25 / 0.30, "rho_L": 0.25 * 0.25 / 0.30},
}


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
