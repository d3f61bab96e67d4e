"""Cost models a registry entry declares (``Component.cost``), for ``dlmpipe plan``
(dlmpipe/cost.py): a sampler's ``SamplerCost`` says how its updates follow from its parameters
(a ``Schedule``), a cache's ``CacheCost`` how many rows it computes at each update (a function
of its parameters and the update, ``Step``). Each carries the sentence ``plan`` prints as its
assumption. No torch.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


@dataclass(frozen=True)
class Schedule:
    """How a sampler moves through the response: ``blocks`` of ``block`` positions, ``per_block``
    updates each, ``tokens`` decoded per update on average, ``shadow`` rows per forward."""

    block: int
    blocks: int
    per_block: int
    tokens: float
    shadow: int = 0

    @property
    def updates(self) -> int:
        return self.blocks * self.per_block


@dataclass(frozen=True)
class Step:
    """One update of a decode, as a cache's row count sees it (N = P + G rows)."""

    update: int      # 0-based update of the decode
    block: int       # its block
    in_block: int    # its update within the block
    decoded: float   # positions decoded before it
    s: Schedule
    g: int
    n: float
    n_layers: int
    spa_budgets: list[float] | None

    @property
    def masked(self) -> float:
        return self.g - self.decoded

    @property
    def masked_in_block(self) -> float:
        return max(0.0, (self.block + 1) * self.s.block - self.decoded)


@dataclass(frozen=True)
class SamplerCost:
    """``assumption``: what ``plan`` assumes; ``schedule(params, gen_length, parallel_tokens,
    model_block)``: the schedule (``model_block``: a block-causal backbone's block size)."""

    assumption: str
    schedule: Callable[[dict, int, float, int | None], Schedule]


@dataclass(frozen=True)
class CacheCost:
    """``assumption``: what ``plan`` assumes; ``rows(params, step)``: rows computed at a step
    (``step.n``: a full forward)."""

    assumption: str
    rows: Callable[[dict, Step], float]


# ---- sampler schedules ------------------------------------------------------------------------
def fixed_steps(assumption: str = "steps updates (gen_length when null), exactly",
                blocks: bool = True) -> SamplerCost:
    """LLaDA's schedule: ``steps`` updates split over the blocks (``blocks=False``: one block)."""
    def schedule(p: dict, g: int, parallel_tokens: float, model_block) -> Schedule:
        block = (p.get("block_length") or g) if blocks else g
        n = max(1, g // block)
        per_block = max(1, (p.get("steps") or g) // n)
        return Schedule(block, n, per_block, block / per_block)
    return SamplerCost(assumption, schedule)


def per_update(assumption: str, tokens: Callable[[dict, float], float],
               block_key: str = "block_length", shadow: bool = False,
               capped: bool = True) -> SamplerCost:
    """A block loop decoding ``tokens(params, parallel_tokens)`` per update until the block has
    no masks (``capped``: at most ``max_steps_per_block``); ``shadow``: a block of shadow rows
    per forward."""
    def schedule(p: dict, g: int, parallel_tokens: float, model_block) -> Schedule:
        block = p.get(block_key) or g
        t = tokens(p, parallel_tokens)
        per_block = math.ceil(block / t)
        if capped and p.get("max_steps_per_block"):
            per_block = min(per_block, p["max_steps_per_block"])
        return Schedule(block, max(1, g // block), per_block, block / per_block,
                        shadow=block if shadow else 0)
    return SamplerCost(assumption, schedule)


def parallel(assumption: str, block_key: str = "block_length", shadow: bool = False) -> SamplerCost:
    """``t`` tokens per update, t the assumed tokens per update (``--parallel-tokens``)."""
    return per_update(assumption, lambda p, t: max(1.0, float(t)), block_key, shadow)


#: SDAR's released block size (SDAR-*-Chat config.json ``block_size``), where the backbone's is
#: not known
SDAR_BLOCK = 4


def block_steps(assumption: str) -> SamplerCost:
    """A release's loop over the backbone's blocks: ``steps`` updates per block."""
    def schedule(p: dict, g: int, parallel_tokens: float, model_block) -> Schedule:
        b = model_block or SDAR_BLOCK
        return Schedule(b, max(1, g // b), p["steps"], b / p["steps"])
    return SamplerCost(assumption, schedule)


# ---- cache rows -------------------------------------------------------------------------------
def every(k, i: int) -> bool:
    return isinstance(k, int) and k > 0 and i % k == 0


def block_start(c: dict, t: Step) -> bool:
    return t.in_block == 0 or every(c.get("refresh_interval"), t.in_block)


def layer_share(c: dict, t: Step, rho: float) -> float:
    """Response rows of a selective step: layer 0 dense, the others ``rho`` of G."""
    if c.get("budget", "uniform") == "adaptive" and t.spa_budgets:
        shares = [1.0] + [math.floor(r * t.g) / t.g for r in t.spa_budgets[1:]]
        return t.g * sum(shares) / len(shares)
    return t.g * (1 + (t.n_layers - 1) * rho) / t.n_layers


def full_at_block_starts(else_rows: Callable[[dict, Step], float]) -> Callable[[dict, Step], float]:
    """A full forward at each block start (and every ``refresh_interval``), else ``else_rows``."""
    return lambda c, t: t.n if block_start(c, t) else else_rows(c, t)
