"""Every cache, declared once (docs/METHODS.md §2): class, the rows it serves fresh logits for,
parameters with defaults and ranges, the artifacts it needs, the parameters it chooses from the
backbone (``auto``), the checks of its parameters against the backbone's widths, what it means
on block-causal and MoE backbones, its cost model for ``plan``, its host-sync budget, the
setting that equals full recompute and a setting whose cached path runs on a tiny model.

Adding a cache (docs/DEVELOPING.md, "Adding a method"): its class in dlmpipe/engine/, one entry
below, one row in the exactness table of tests/test_exactness.py.
"""
from __future__ import annotations

import math

from ..engine import spa_profiles
from .component import Component, choice, fraction_or_null, integer, number, positive_or_null, table
from .costs import CacheCost, block_start, every, full_at_block_starts, layer_share

# ------------------------------------------------------------------------------------------
# checks against the backbone's widths (config.json, read without torch, before any job)
# ------------------------------------------------------------------------------------------
def rank_within_value_projection(params: dict, widths) -> str | None:
    """SPA-Cache's singular proxy has at most the value projection's rank, min(n_kv_heads *
    head_dim, d_model) (``widths``: a ``backbones.checkpoint_config.Widths``)."""
    if params.get("identifier") != "singular" or params["rank"] <= widths.value_rank:
        return None
    return (f"cache.rank: {params['rank']} exceeds the value projection's rank "
            f"min(n_kv_heads*head_dim, d_model) = min({widths.n_kv_heads}*{widths.head_dim}, "
            f"{widths.d_model}) = {widths.value_rank}")


_REFRESH_INTERVAL_OR_NULL = positive_or_null(
    None, "also a full forward every this many steps of a block (1: every step, equals full "
          "recompute); null: block starts only")


# ------------------------------------------------------------------------------------------
# cost models of the caches whose rows are more than one line (``Component.cost``)
# ------------------------------------------------------------------------------------------
def _archer_rows(c: dict, t) -> float:
    if t.update == 0:
        return t.n
    if c.get("refresh") == "age":
        interval = c.get("A", 8)
    else:
        k = c.get("K", 8)
        interval = None if k in ("inf", math.inf) else max(1, math.ceil(k / t.s.tokens))
    return t.n if every(interval, t.update) else t.g


def _spa_rows(c: dict, t) -> float:
    if t.update == 0 or every(c.get("refresh_steps"), t.update):
        return t.n
    if every(c.get("refresh_gen_steps"), t.update):
        return t.g
    return layer_share(c, t, c.get("rho", 0.25))


def _dllm_rows(c: dict, t) -> float:
    if every(c.get("K_p", 50), t.update):
        return t.n
    if every(c.get("K_r", 7), t.update):
        return t.g
    return layer_share({"budget": "uniform"}, t, c.get("rho", 0.25))


#: on a mixture-of-experts backbone (``Component.on_moe``; docs/METHODS.md, "MoE backbones"): the
#: MoE FFN is row-local, so a reused row keeps the routing of the step it was computed at
_REUSED_KV = ("reused K/V rows carry the routing of the step they were computed at (the expert "
              "choice shaped them in earlier layers); recomputed rows are routed afresh")


CACHES = table(
    Component("none", "dlmpipe.engine.full:FullRecompute",
              "full recompute every step (the exactness reference)", "all_rows", shadow_rows=True,
        on_block_causal="the active block's rows every step over the exact prefix (the releases' loop "
            "without a sub-block cache; the exactness reference)",
        on_moe="every row routed afresh every step: its top-k experts and the shared experts (the "
            "exactness reference)",
        exact={},
        cheap={},
        host_sync={"none": ({}, 0, 0)},
        cost=CacheCost("every update full", lambda c, t: t.n)),
    Component(
        "archer", "dlmpipe.engine.archer:ArcherCache",
        "prompt K/V reuse with state-anchored refresh", "all_rows",
        {"K": {"description": "refresh radius, an integer >= 1 or inf (K=1 equals full recompute)",
               "anyOf": [{"type": "integer", "minimum": 1}, {"enum": ["inf", math.inf]}],
               "default": 8},
         "refresh": choice(["distance", "age"], "distance",
                           "distance (Hamming distance to the anchor >= K) or age (every A updates)"),
         "A": integer(8, "refresh age for refresh=age")},
        feedback_intervention=True, shadow_rows=True,
        on_block_causal="prompt cache over the active block's prompt rows (the prompt's tail, a shifted "
              "family's next token); the finished prefix is exact without it",
        on_moe="the cached prompt rows keep the routing of the step they were cached at; " + _REUSED_KV,
        exact={"K": 1},
        cheap={"K": "inf"},
        host_sync={"archer-kinf": ({"K": "inf"}, 0, 0),
                   "archer-k4": ({"K": 4}, 0, 1),  # the Hamming distance, once anchored
                   "archer-age": ({"refresh": "age", "A": 3}, 0, 0)},
        cost=CacheCost("full at update 0 and at each refresh (distance: every ceil(K / tokens per "
                       "update) updates; age: every A), else the G response rows", _archer_rows)),
    Component(
        "fast_dllm_prefix", "dlmpipe.engine.fast_dllm:FastDLLMPrefixCache",
        "Fast-dLLM prefix cache: a full forward at each block start; later steps recompute the "
        "current block and every later position over cached prompt/earlier-block K/V",
        "block_rows", {"refresh_interval": _REFRESH_INTERVAL_OR_NULL}, shadow_rows=True,
        on_block_causal="the sampler's sub-block and the rest of the active block recomputed, the "
                        "block's earlier rows reused",
        on_moe=_REUSED_KV,
        exact={"refresh_interval": 1},
        cheap={},
        host_sync={"fast_dllm_prefix": ({}, 0, 0)},
        cost=CacheCost("full at each block start (and every refresh_interval updates of a block), "
                       "else the current block and every later position",
                       full_at_block_starts(lambda c, t: t.g - t.block * t.s.block))),
    Component(
        "fast_dllm_dual", "dlmpipe.engine.fast_dllm:FastDLLMDualCache",
        "Fast-dLLM dual cache: a full forward at each block start; later steps recompute only the "
        "current block over cached K/V of every other position",
        "block_rows", {"refresh_interval": _REFRESH_INTERVAL_OR_NULL}, shadow_rows=True,
        on_block_causal="a sub-block cache (Fast-dLLM v2's, refreshed at sub-block starts only): the "
                      "sampler's sub-block over the active block's cached K/V",
        on_moe=_REUSED_KV,
        exact={"refresh_interval": 1},
        cheap={},
        host_sync={"fast_dllm_dual": ({}, 0, 0)},
        cost=CacheCost("full at each block start (and every refresh_interval), else the block",
                       full_at_block_starts(lambda c, t: t.s.block))),
    Component(
        "fast_dllm_v2", "dlmpipe.engine.fast_dllm:FastDLLMv2Cache",
        "Fast-dLLM v2's block + sub-block cache: finished blocks are the block cache; the whole "
        "active block at each sub-block start and while its first position is masked, else only "
        "the sub-block's rows", "block_rows", {"refresh_interval": _REFRESH_INTERVAL_OR_NULL},
        shadow_rows=True, needs_block_causal=True,
        on_block_causal="the release's block + sub-block cache",
        on_moe=_REUSED_KV,
        exact={"refresh_interval": 1},
        cheap={},
        host_sync={"fast_dllm_v2": ({}, 0, 1)},  # whether the sub-block's first is masked
        cost=CacheCost("as fast_dllm_dual over the sampler's sub-blocks",
                       full_at_block_starts(lambda c, t: t.s.block))),
    Component(
        "dkv_decode", "dlmpipe.engine.dkv:DKVDecodeCache",
        "dKV-Cache decode (delayed caching of decoded tokens' K/V; steps 0 and 1 of a block full)",
        "masked_rows",
        {"refresh_interval": integer(8, "full forward every this many steps of a block (paper 8; "
                                        "1 equals full recompute)")}, shadow_rows=True,
        on_block_causal="delayed caching of the active block's decoded rows",
        on_moe=_REUSED_KV,
        exact={"refresh_interval": 1},
        cheap={},
        host_sync={"dkv_decode": ({"refresh_interval": 3}, 1, 1)},  # the row sets' sizes
        cost=CacheCost("full at a block's updates 0 and 1 and every refresh_interval, else the "
                       "response's masked rows",
                       lambda c, t: t.n if t.in_block < 2 or every(c.get("refresh_interval"), t.in_block)
                       else t.masked + t.s.tokens)),
    Component(
        "dkv_greedy", "dlmpipe.engine.dkv:DKVGreedyCache",
        "dKV-Cache greedy: recompute only the tokens decoded since the last forward, the tokens "
        "due next (random_order sampler) and masked neighbours within the window", "masked_rows",
        {"refresh_interval": integer(2, "full forward every this many steps of a block (paper 2; "
                                        "1 equals full recompute)"),
         "window": integer(4, "masked positions within this distance of a recomputed token are "
                              "recomputed too (paper 4)", minimum=0)}, shadow_rows=True,
        on_block_causal="the active block's rows decoded since the last forward, its due and "
                  "neighbouring masks",
        on_moe=_REUSED_KV,
        exact={"refresh_interval": 1},
        cheap={},
        host_sync={"dkv_greedy": ({}, 1, 1)},
        cost=CacheCost("full every refresh_interval updates of a block, else the tokens decoded and "
                       "due and their masked neighbours: (2 + 2 window) x tokens per update",
                       lambda c, t: t.n if every(c.get("refresh_interval", 2), t.in_block) else min(
                           t.masked + t.s.tokens, (2 + 2 * c.get("window", 4)) * t.s.tokens))),
    Component(
        "spa", "dlmpipe.engine.spa:SPACache",
        "SPA-Cache: per layer, recompute only the response rows whose identifier drifted most "
        "since the previous step (rank-r singular proxy of the value projection by default), "
        "with an adaptive per-layer budget rho(l); other rows reuse their cached attention+FFN "
        "delta", "all_rows",
        {"identifier": choice(["singular", "value", "query", "key", "attn_input", "attn_output"],
                              "singular", "drift identifier: singular (S_r B_r^T h, reads "
                              "backbones/{b}/proxies.safetensors), value, query, key, attn_input, "
                              "attn_output"),
         "rank": integer(128, "singular proxy rank r (paper 128 for LLaDA-8B, 32 for Dream-7B; at "
                              "most min(n_kv_heads*head_dim, d_model))"),
         "budget": choice(["adaptive", "uniform"], "adaptive",
                          "adaptive: rho(l) from the profile; uniform: rho at every layer"),
         "profile": choice(["auto", *spa_profiles.PROFILES], "auto",
                           "constants of rho(l) (m, rho_p, rho_1, rho_L); auto: the backbone's, "
                           "by family and checkpoint name (LLaDA-1.5: llada-1.5; other LLaDA "
                           "checkpoints and the toy: llada-8b-instruct; Dream: dream-7b; none "
                           "fits DiffuCoder: name one)"),
         "rho_p": fraction_or_null(None, "peak of rho(l), the ends rescaled with it; null: the "
                                         "profile's (0.25)"),
         "scale": number(1.0, "multiplies the whole adaptive profile (clipped to 1)",
                         exclusive_minimum=True),
         "left_floor": fraction_or_null(None, "floor of rho(l) left of the peak (reference "
                                              "0.0625); null: none"),
         "rho": number(0.25, "budget of every layer when budget is uniform (1 with refresh_steps "
                             "1 equals full recompute)", maximum=1),
         "kv_update": choice(["sparse", "dense"], "sparse",
                             "sparse: K/V of the selected rows only (the paper); dense: K/V of "
                             "every response row (the public code)"),
         "refresh_steps": positive_or_null(50, "full refresh (prompt and response) every this "
                                               "many steps; null: step 0 only"),
         "refresh_gen_steps": positive_or_null(7, "recompute the whole response (cached prompt) "
                                                  "every this many steps; null: never")},
        artifacts={"proxies": lambda params: params["identifier"] == "singular"},
        width_checks=(rank_within_value_projection,),
        auto={"profile": spa_profiles.profile_for}, shadow_rows=True,
        on_block_causal="updates rows of the active block (budgets of its positions); the prefix is exact, "
           "never refreshed",
        on_moe="the proxies are on the attention side (the value projection's singular directions, or "
           "value/query/key/attention input/output), before the FFN, untouched by routing: a "
           "routing change is seen only through the next layers' inputs. A row not selected "
           "reuses its whole residual delta, attention plus the routed experts' weighted sum and "
           "the shared experts: its experts and weights stay those of its last recompute; a "
           "selected row is routed afresh, so the experts run on selected rows only",
        exact={"budget": "uniform", "rho": 1, "refresh_steps": 1},
        cheap={"rank": 8, "budget": "uniform", "rho": 0.25},
        host_sync={"spa": ({"rank": 8, "refresh_gen_steps": 3}, 0, 0)},
        cost=CacheCost("full at update 0 and every refresh_steps, the G response rows every "
                       "refresh_gen_steps, else the layer budget's rows (mean rho(l) G, layer 0 dense)",
                       _spa_rows)),
    Component(
        "dllm_cache", "dlmpipe.engine.dllm_cache:DLLMCache",
        "dLLM-Cache: prompt refresh every K_p steps, response refresh every K_r steps, in between "
        "recompute the floor(rho*G) response rows whose value vectors changed most", "all_rows",
        {"K_p": integer(50, "prompt refresh interval (K_p = K_r = 1 equals full recompute)"),
         "K_r": integer(7, "response refresh interval"),
         "rho": number(0.25, "fraction of response rows recomputed between response refreshes",
                       maximum=1)}, shadow_rows=True,
        on_block_causal="updates rows of the active block (rho of its positions); the prefix is exact, "
                  "never refreshed",
        on_moe="the reused attention + FFN output of a row is its routed output (top-k experts, "
                  "their weights, the shared experts) from when it was last computed, routing "
                  "frozen with it; the V drift that picks rows is measured before the FFN, so it "
                  "does not see routing changes; recomputed rows are routed afresh (experts run "
                  "on them only)",
        exact={"K_p": 1, "K_r": 1},
        cheap={"rho": 0.25},
        host_sync={"dllm_cache": ({"K_r": 3}, 0, 0)},
        cost=CacheCost("full every K_p updates, the G response rows every K_r, else rho G rows "
                       "(layer 0 dense)", _dllm_rows)),
    Component(
        "d2cache", "dlmpipe.engine.d2cache:D2Cache",
        "d2Cache (dual adaptive caching): after a full first forward, each step recomputes only the "
        "masked tokens chosen by certainty prior, the tokens just decoded and the tokens chosen by "
        "attention rollout, their K/V written back; every other row reuses its cached K/V",
        "masked_rows",
        {"rollout_p": number(0.1, "nucleus mass of the attention-rollout selection of the other "
                                  "tokens (released 0.1; 1 selects every row: equals full recompute)",
                             maximum=1),
         "current_k": integer(32, "masked tokens selected by certainty prior per step (released 32)"),
         "sigma": number(10.0, "width of the Gaussian density of decoded neighbours (released 10)",
                         exclusive_minimum=True),
         "inflate_w": integer(0, "fill unselected gaps of at most this width between selected rows; "
                                 "0: none (released config 0; 4 recommended with semi-autoregressive "
                                 "blocks)", minimum=0),
         "rule": choice(["paper", "released"], "paper",
                        "paper: the cached confidence of a masked token is refreshed whenever its "
                        "row is recomputed; released: the first forward's confidences are kept "
                        "(the release's update writes into a copy and never takes effect) and the "
                        "search window is sized by the masks the block had at the step's start")},
        shadow_rows=True,
        on_block_causal="selects rows of the active block; its attention rollout runs over them (the "
               "prefix's attention left out)",
        on_moe="the attention rollout reads attention maps only (the MoE FFN plays no part in "
               "the selection); rows without queries keep their K/V, which their routing of the "
               "step they were last computed at shaped; rows with queries are routed afresh",
        exact={"rollout_p": 1},
        cheap={"current_k": 4},
        host_sync={"d2cache": ({"current_k": 4}, 0, 1)},  # the selected rows' count
        cost=CacheCost("full at update 0, else current_k (or the block's masked rows, if more) + the "
                       "tokens just decoded + rollout_p x N rows",
                       lambda c, t: t.n if t.update == 0 else (
                           max(c.get("current_k", 32), t.masked_in_block) + t.s.tokens
                           + c.get("rollout_p", 0.1) * t.n))),
    Component(
        "dinfer_vicinity", "dlmpipe.engine.vicinity:VicinityCache",
        "dInfer's dual cache with vicinity refresh: full forwards for the first warmup_steps "
        "steps, then a full forward at each block start; later steps recompute the block with "
        "prefix_look rows before and after_look rows after it over cached K/V of every other row",
        "block_rows",
        {"prefix_look": integer(16, "rows before the block recomputed every step (the release's "
                                    "configs 16; 0 and after_look 0: dInfer's plain dual cache; "
                                    "covering the sequence equals full recompute)", minimum=0),
         "after_look": integer(16, "rows after the block recomputed every step (the release's "
                                   "configs 16)", minimum=0),
         "warmup_steps": integer(4, "full forwards without a cache at the start of a sample (the "
                                    "release's configs 4)", minimum=0),
         "refresh_interval": _REFRESH_INTERVAL_OR_NULL,
         "rule": choice(["paper", "released"], "paper",
                        "paper: warmup_steps counts the forwards of steps that decode and each "
                        "block's cache is built once, at its first forward; released: dInfer's "
                        "iteration counter, whose warm-up also counts the forwards that decode "
                        "nothing (its unrolled iterations after a block has no masks, the window "
                        "forward after a refresh that finished the block) and which builds the "
                        "cache twice when it is first built in a block after the first")},
        checks=(lambda p, g: "cache.rule: released follows the release, which refreshes only at "
                "block starts; set refresh_interval null"
                if p.get("rule") == "released" and p.get("refresh_interval") is not None else None,),
        shadow_rows=True,
        on_block_causal="the window inside the active block: the sampler's sub-block with "
                       "prefix_look rows before and after_look rows after it, clipped to the "
                       "active block (the finished prefix is exact, never recomputed); "
                       "warmup_steps counts each active block's forwards (the cache begins with "
                       "each block)",
        on_moe="the window's rows are routed afresh each step; " + _REUSED_KV,
        exact={"refresh_interval": 1},
        cheap={"warmup_steps": 0, "prefix_look": 2, "after_look": 2},
        host_sync={"dinfer_vicinity": ({"warmup_steps": 1, "prefix_look": 2, "after_look": 2}, 0, 0)},
        cost=CacheCost("full at updates 0 to warmup_steps, at each block start (and every "
                       "refresh_interval), else the block with prefix_look rows before and "
                       "after_look rows after it",
                       lambda c, t: t.n if t.update <= c.get("warmup_steps", 4) or block_start(c, t)
                       else t.s.block + c.get("prefix_look", 16) + c.get("after_look", 16))),
    kind="cache",
)
