"""SPA-Cache's layer-budget profiles and which backbone gets which (docs/METHODS.md §2.3).

A profile holds the constants of the split Gaussian rho(l) (``layer_budgets``). ``profile:
auto``, the default, takes the backbone's (``profile_for``, bound per backbone by the campaign
through ``dlmpipe.registry``): by config.json's family and the checkpoint's names
(dlmpipe/backbones/identity.py), since LLaDA-1.5 and LLaDA-8B-Instruct share one config.json.
No torch here: the campaign check imports this, and the drift-profile figure draws rho(l).
"""
from __future__ import annotations

import math
import re

# m, rho_p, rho_1, rho_L (docs/METHODS.md §2.3; Dream's are rescaled so the peak is 0.25)
PROFILES: dict[str, dict[str, float]] = {
    "llada-8b-instruct": {"m": 0.75, "rho_p": 0.25, "rho_1": 0.03, "rho_L": 0.13},
    "llada-1.5": {"m": 0.80, "rho_p": 0.25, "rho_1": 0.03, "rho_L": 0.13},
    "dream-7b": {"m": 0.5, "rho_p": 0.25, "rho_1": 0.05 * 0.25 / 0.30, "rho_L": 0.25 * 0.25 / 0.30},
}

#: (family, pattern searched in the checkpoint's names ("" matches any), profile); first match
#: wins; profile None: no profile fits (NO_FIT says why)
RULES = (
    ("llada", r"llada[-_ .]?v?1[._]5", "llada-1.5"),
    ("dream", r"diffucoder", None),
    # every other LLaDA-format checkpoint (LLaDA-8B-Instruct and -Base, fine-tunes, the toy) has
    # LLaDA-8B-Instruct's config.json: its profile, the one the paper measured on LLaDA-8B
    ("llada", "", "llada-8b-instruct"),
    ("dream", "", "dream-7b"),  # Dream-v0-Instruct/Base-7B
)
NO_FIT = {"diffucoder": "the paper publishes no profile for DiffuCoder (Dream's architecture, "
                        "trained from Qwen2.5-Coder; dream-7b is the closest)"}


def profile_for(params: dict, backbone) -> str:
    """The profile ``auto`` stands for on ``backbone`` (a backbones.identity.BackboneIdentity).
    Where none fits: ValueError saying why when the budget is adaptive; "auto" kept when it is
    uniform (rho(l) is unused there)."""
    why = "no SPA-Cache profile is known for this family"
    for family, pattern, profile in RULES:
        if family == backbone.family and (not pattern or any(
                re.search(pattern, name, re.IGNORECASE) for name in backbone.names)):
            if profile is not None:
                return profile
            why = NO_FIT[pattern]
            break
    if params["budget"] != "adaptive":
        return "auto"
    raise ValueError(f"no SPA-Cache profile fits {backbone.describe()}: {why}; name one of "
                     f"{', '.join(PROFILES)}")


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
