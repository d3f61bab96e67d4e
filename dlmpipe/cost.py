"""What one decode costs, from a method's parameters alone: updates, rows computed, FLOPs.

``dlmpipe plan`` prices a campaign before its checkpoints and data are downloaded. A decode of a
prompt of P tokens into G response positions runs the sampler's updates (its NFE); each update
runs one forward of the cache, over all N = P + G rows (a full forward) or over the rows the
cache recomputes (a cached one). A forward over r rows costs 2 x parameters x r FLOPs: attention's
N^2 term, the identifiers' and selections' extra work and launch overheads are left out, and a
cached forward runs at the full forward's efficiency (it runs below it: docs/ARCHITECTURE.md,
"Performance shape"). Each sampler and cache declares its own cost model in its registry entry
(``Component.cost``: dlmpipe/registry/costs.py), with the sentence ``plan`` prints as what it
assumes; a registry entry without one fails at registration.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from . import registry
from .registry.costs import SDAR_BLOCK, Schedule, Step  # noqa: F401  (SDAR_BLOCK: plan's words)

#: how each sampler's updates follow from its parameters, and the rows each cache computes per
#: update (N = P + G; full: a forward over all N rows): each entry's ``cost`` (dlmpipe/registry/)
SAMPLER_ASSUMPTIONS = {n: c.cost.assumption for n, c in registry.SAMPLERS.items()}
CACHE_ASSUMPTIONS = {n: c.cost.assumption for n, c in registry.CACHES.items()}
#: (the rows above are a full-attention backbone's; on a block-causal one, ``BLOCK_CAUSAL``)
BLOCK_CAUSAL = ("block-causal backbones (SDAR, Fast-dLLM v2, LLaDA2.0): the prompt's rows once "
                "(prefill), then each active block of the backbone's block size as a decode of "
                "its own (the sampler's steps per active block, capped at its positions; the "
                "cache's rows over the active block only, N = the block), and each block's rows "
                "once more at its commit; a finished block is never recomputed (attention over "
                "the prefix and the prompt's tail inside the first block left out)")


@dataclass(frozen=True)
class Decode:
    """One decode's shape and work: ``updates`` (NFE), ``full`` (its forwards over every row)
    and ``rows`` (rows computed over all its forwards; a full one computes ``prompt +
    gen_length``)."""

    prompt: float
    gen_length: int
    updates: int
    full: int
    rows: float

    def flops(self, parameters: float) -> float:
        return 2.0 * parameters * self.rows


def schedule(sampler: dict, gen_length: int, parallel_tokens: float = 1.0,
             model_block: int | None = None) -> Schedule:
    """The sampler's schedule from its (filled) parameters (``SAMPLER_ASSUMPTIONS``);
    ``model_block``: a block-causal backbone's block size (SDAR's loop decodes its blocks)."""
    entry = registry.SAMPLERS.get(sampler["name"])
    if entry is None:
        raise ValueError(f"no cost model for sampler {sampler['name']!r}: not registered")
    return entry.cost.schedule(sampler, gen_length, parallel_tokens, model_block)


def decode_cost(method: dict, prompt: float, n_layers: int = 32, parallel_tokens: float = 1.0,
                spa_budgets: list[float] | None = None, block_size: int | None = None) -> Decode:
    """Updates and rows of one decode of ``method`` (name, sampler, cache with parameters
    filled, gen_length) on a prompt of ``prompt`` tokens. ``spa_budgets``: SPA-Cache's rho(l)
    per layer when its budget is adaptive. ``block_size``: the backbone is block-causal over
    blocks of that many positions (``block_causal_cost``); None: full attention."""
    if block_size:
        return block_causal_cost(method, prompt, block_size, n_layers, parallel_tokens, spa_budgets)
    g = int(method["gen_length"])
    s = schedule(method["sampler"], g, parallel_tokens)
    return _rows(method, s, prompt, n_layers, spa_budgets)


def active_block_sampler(sampler: dict, block_size: int) -> dict:
    """The sampler as it decodes one active block of ``block_size`` positions (docs/METHODS.md,
    "Block-causal backbones"): ``steps`` count per active block, capped at its positions (null:
    its positions); a ``block_length`` that does not divide the block makes one sub-block."""
    s = dict(sampler)
    if "steps" in s and s["name"] != "sdar":
        s["steps"] = min(s["steps"] or block_size, block_size)
    if s.get("block_length") and block_size % s["block_length"]:
        s["block_length"] = block_size
    return s


def block_causal_cost(method: dict, prompt: float, block_size: int, n_layers: int = 32,
                      parallel_tokens: float = 1.0,
                      spa_budgets: list[float] | None = None) -> Decode:
    """One decode on a block-causal backbone (dlmpipe/blockwise.py): the prompt's rows computed
    once (prefill), then per active block of ``block_size`` positions the sampler's updates with
    the cache's rows over that block alone (its own problem: no prompt rows, the finished blocks'
    K/V exact and never recomputed), and the block's rows once more when it is committed. ``full``
    counts forwards over the whole active block. The prompt's tail inside the first block and
    attention over the prefix are left out."""
    g, b = int(method["gen_length"]), block_size
    blocks = math.ceil(g / b)
    inner = {**method, "gen_length": b, "sampler": active_block_sampler(method["sampler"], b)}
    s = schedule(inner["sampler"], b, parallel_tokens, model_block=b)
    one = _rows(inner, s, 0.0, n_layers, spa_budgets)
    return Decode(prompt, g, blocks * one.updates, blocks * one.full,
                  prompt + blocks * (one.rows + b))


def _rows(method: dict, s: Schedule, prompt: float, n_layers: int,
          spa_budgets: list[float] | None) -> Decode:
    """Updates and rows of a decode of ``method`` following schedule ``s``."""
    g = int(method["gen_length"])
    cache = method["cache"]
    entry = registry.CACHES.get(cache["name"])
    if entry is None:
        raise ValueError(f"no cost model for cache {cache['name']!r}: not registered")
    rows_of = entry.cost.rows
    n = prompt + g
    total, full = 0.0, 0
    for u in range(s.updates):
        b, j = divmod(u, s.per_block)
        decoded = min(g, b * s.block + j * s.tokens)
        rows = min(n, rows_of(cache, Step(u, b, j, decoded, s, g, n, n_layers, spa_budgets)))
        full += rows == n
        total += rows + s.shadow
    return Decode(prompt, g, s.updates, full, total)
