"""Pareto fronts over (quality, speedup): both are maximized."""
from __future__ import annotations

from collections.abc import Sequence


def dominates(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """``a`` is at least as good as ``b`` in both objectives and better in one."""
    return a[0] >= b[0] and a[1] >= b[1] and (a[0] > b[0] or a[1] > b[1])


def pareto_mask(quality: Sequence[float], speedup: Sequence[float]) -> list[bool]:
    """True for every point no other point dominates (ties are all on the front)."""
    points = list(zip(quality, speedup))
    return [not any(dominates(q, p) for q in points) for p in points]


def front_steps(quality: Sequence[float], speedup: Sequence[float]) -> tuple[list[float], list[float]]:
    """The front as a staircase, sorted by speedup: draw with ``step(x, y, where="pre")`` so
    each segment shows the best quality reachable at that speedup or more."""
    on = [(s, q) for q, s, f in zip(quality, speedup, pareto_mask(quality, speedup)) if f]
    on.sort(key=lambda p: (p[0], -p[1]))
    return [s for s, _ in on], [q for _, q in on]


def reaches_front(quality: Sequence[float], speedup: Sequence[float],
                  quality_high: Sequence[float], speedup_high: Sequence[float]) -> list[bool]:
    """True for every point whose optimistic corner (``quality_high``, ``speedup_high``: the
    upper ends of its error bars) no point of the front (on the point estimates) dominates:
    within its uncertainty the point could be on the front. Front points are True."""
    on = pareto_mask(quality, speedup)
    front = [p for p, f in zip(zip(quality, speedup), on) if f]
    return [not any(dominates(p, corner) for p in front)
            for corner in zip(quality_high, speedup_high)]
