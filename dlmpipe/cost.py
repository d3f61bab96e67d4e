"""What one decode costs, from a method's parameters alone: updates, rows computed, FLOPs.

``dlmpipe plan`` prices a campaign before its checkpoints and data are downloaded. A decode of a
prompt of P tokens into G response positions runs the sampler's updates (its NFE); each update
runs one forward of the cache, over all N = P + G rows (a full forward) or over the rows the
cache recomputes (a cached one). A forward over r rows costs 2 x parameters x r FLOPs: attention's
N^2 term, the identifiers' and selections' extra work and launch overheads are left out, and a
cached forward runs at the full forward's efficiency (it runs below it: docs/ARCHITECTURE.md,
"Performance shape"). ``ASSUMPTIONS`` says per sampler and per cache what is assumed; every
registered sampler and cache has an entry (tests/test_cli.py), as it has one in the registry.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

#: how each sampler's updates follow from its parameters (fixed schedules: exactly)
SAMPLER_ASSUMPTIONS = {
    "llada_confidence": "steps updates (gen_length when null), exactly",
    "random_order": "steps updates (gen_length when null), exactly",
    "certainty_prior": "steps updates (gen_length when null), exactly",
    "pc_sampler": "steps updates (gen_length when null), exactly",
    "dream": "steps updates (gen_length when null), exactly",
    "klass": "at most steps updates (LLaDA's schedule when nothing is ready): steps assumed",
    "saber": "gen_length / n updates (n accepted per update net of rollbacks): an estimate",
    "threshold": "gen_length / t updates, t the assumed tokens per update (--parallel-tokens; "
                 "1: the rule's worst case), at most max_steps_per_block per block",
    "factor": "gen_length / t updates, t as for threshold, at most max_steps_per_block per block",
    "eb_sampler": "gen_length / t updates, t as for threshold",
    "wino": "gen_length / t updates, t as for threshold, plus block_length shadow rows in every "
            "forward",
    "sdar": "steps updates per block of the backbone (its config.json's block size; 4, "
            "SDAR's released one, where it is not known)",
    "fast_dllm_v2": "gen_length / t updates, t as for threshold, in sub-blocks of "
                    "sub_block_length",
    "dinfer_hierarchy": "gen_length / t updates, t as for threshold",
    "dinfer_credit": "gen_length / t updates, t as for threshold",
}
#: the rows each cache computes per update (N = P + G; full: a forward over all N rows)
CACHE_ASSUMPTIONS = {
    "none": "every update full",
    "archer": "full at update 0 and at each refresh (distance: every ceil(K / tokens per update) "
              "updates; age: every A), else the G response rows",
    "fast_dllm_prefix": "full at each block start (and every refresh_interval updates of a "
                        "block), else the current block and every later position",
    "fast_dllm_dual": "full at each block start (and every refresh_interval), else the block",
    "dkv_decode": "full at a block's updates 0 and 1 and every refresh_interval, else the "
                  "response's masked rows",
    "dkv_greedy": "full every refresh_interval updates of a block, else the tokens decoded and "
                  "due and their masked neighbours: (2 + 2 window) x tokens per update",
    "spa": "full at update 0 and every refresh_steps, the G response rows every "
           "refresh_gen_steps, else the layer budget's rows (mean rho(l) G, layer 0 dense)",
    "dllm_cache": "full every K_p updates, the G response rows every K_r, else rho G rows "
                  "(layer 0 dense)",
    "d2cache": "full at update 0, else current_k (or the block's masked rows, if more) + the "
               "tokens just decoded + rollout_p x N rows",
    "fast_dllm_v2": "as fast_dllm_dual over the sampler's sub-blocks",
    "dinfer_vicinity": "full at updates 0 to warmup_steps, at each block start (and every "
                       "refresh_interval), else the block with prefix_look rows before and "
                       "after_look rows after it",
}
#: (the rows above are a full-attention backbone's; on a block-causal one, ``BLOCK_CAUSAL``)
BLOCK_CAUSAL = ("block-causal backbones (SDAR, Fast-dLLM v2, LLaDA2.0): the prompt's rows once "
                "(prefill), then each active block of the backbone's block size as a decode of "
                "its own (the sampler's steps per active block, capped at its positions; the "
                "cache's rows over the active block only, N = the block), and each block's rows "
                "once more at its commit; a finished block is never recomputed (attention over "
                "the prefix and the prompt's tail inside the first block left out)")
#: SDAR's released block size (SDAR-*-Chat config.json ``block_size``), where the backbone's is
#: not known
SDAR_BLOCK = 4


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


def schedule(sampler: dict, gen_length: int, parallel_tokens: float = 1.0,
             model_block: int | None = None) -> Schedule:
    """The sampler's schedule from its (filled) parameters (``SAMPLER_ASSUMPTIONS``);
    ``model_block``: a block-causal backbone's block size (SDAR's loop decodes its blocks)."""
    name, g = sampler["name"], gen_length
    block = (sampler.get("block_length") or g) if name != "dream" else g  # dream: no blocks
    if name == "sdar":
        b = model_block or SDAR_BLOCK
        return Schedule(b, max(1, g // b), sampler["steps"], b / sampler["steps"])
    if name == "fast_dllm_v2":
        block = sampler["sub_block_length"]
    blocks = max(1, g // block)
    if name in ("llada_confidence", "random_order", "certainty_prior", "pc_sampler", "klass",
                "dream"):
        per_block = max(1, (sampler.get("steps") or g) // blocks)
        return Schedule(block, blocks, per_block, block / per_block)
    if name == "saber":
        tokens = float(sampler["n"])
    elif name in ("threshold", "factor", "eb_sampler", "wino", "fast_dllm_v2", "dinfer_hierarchy",
                  "dinfer_credit"):
        tokens = max(1.0, float(parallel_tokens))
    else:
        raise ValueError(f"no cost model for sampler {name!r} (dlmpipe/cost.py)")
    per_block = math.ceil(block / tokens)
    if sampler.get("max_steps_per_block") and name != "saber":
        per_block = min(per_block, sampler["max_steps_per_block"])
    return Schedule(block, blocks, per_block, block / per_block,
                    shadow=block if name == "wino" else 0)


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
    rows_of = _CACHE_ROWS.get(cache["name"])
    if rows_of is None:
        raise ValueError(f"no cost model for cache {cache['name']!r} (dlmpipe/cost.py)")
    n = prompt + g
    total, full = 0.0, 0
    for u in range(s.updates):
        b, j = divmod(u, s.per_block)
        decoded = min(g, b * s.block + j * s.tokens)
        rows = min(n, rows_of(cache, _Step(u, b, j, decoded, s, g, n, n_layers, spa_budgets)))
        full += rows == n
        total += rows + s.shadow
    return Decode(prompt, g, s.updates, full, total)


@dataclass(frozen=True)
class _Step:
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


def _every(k, i: int) -> bool:
    return isinstance(k, int) and k > 0 and i % k == 0


def _archer(c: dict, t: _Step) -> float:
    if t.update == 0:
        return t.n
    if c.get("refresh") == "age":
        interval = c.get("A", 8)
    else:
        k = c.get("K", 8)
        interval = None if k in ("inf", math.inf) else max(1, math.ceil(k / t.s.tokens))
    return t.n if _every(interval, t.update) else t.g


def _block_start(c: dict, t: _Step) -> bool:
    return t.in_block == 0 or _every(c.get("refresh_interval"), t.in_block)


def _layer_share(c: dict, t: _Step, rho: float) -> float:
    """Response rows of a selective step: layer 0 dense, the others ``rho`` of G."""
    if c.get("budget", "uniform") == "adaptive" and t.spa_budgets:
        shares = [1.0] + [math.floor(r * t.g) / t.g for r in t.spa_budgets[1:]]
        return t.g * sum(shares) / len(shares)
    return t.g * (1 + (t.n_layers - 1) * rho) / t.n_layers


def _spa(c: dict, t: _Step) -> float:
    if t.update == 0 or _every(c.get("refresh_steps"), t.update):
        return t.n
    if _every(c.get("refresh_gen_steps"), t.update):
        return t.g
    return _layer_share(c, t, c.get("rho", 0.25))


def _dllm(c: dict, t: _Step) -> float:
    if _every(c.get("K_p", 50), t.update):
        return t.n
    if _every(c.get("K_r", 7), t.update):
        return t.g
    return _layer_share({"budget": "uniform"}, t, c.get("rho", 0.25))


_CACHE_ROWS = {
    "none": lambda c, t: t.n,
    "archer": _archer,
    "fast_dllm_prefix": lambda c, t: t.n if _block_start(c, t) else t.g - t.block * t.s.block,
    "fast_dllm_dual": lambda c, t: t.n if _block_start(c, t) else t.s.block,
    "fast_dllm_v2": lambda c, t: t.n if _block_start(c, t) else t.s.block,
    "dkv_decode": lambda c, t: t.n if t.in_block < 2 or _every(c.get("refresh_interval"),
                                                              t.in_block) else t.masked + t.s.tokens,
    "dkv_greedy": lambda c, t: t.n if _every(c.get("refresh_interval", 2), t.in_block) else min(
        t.masked + t.s.tokens, (2 + 2 * c.get("window", 4)) * t.s.tokens),
    "spa": _spa,
    "dllm_cache": _dllm,
    "dinfer_vicinity": lambda c, t: t.n if t.update <= c.get("warmup_steps", 4) or _block_start(c, t)
    else t.s.block + c.get("prefix_look", 16) + c.get("after_look", 16),
    "d2cache": lambda c, t: t.n if t.update == 0 else (
        max(c.get("current_k", 32), t.masked_in_block) + t.s.tokens + c.get("rollout_p", 0.1) * t.n),
}
