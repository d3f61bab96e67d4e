"""Every cache, declared once (docs/METHODS.md §2): class, the rows it serves fresh logits for,
parameters with defaults and ranges, the artifacts it needs, the parameters it chooses from the
backbone (``auto``) and the checks of its parameters against the backbone's widths.

Adding a cache: its class in dlmpipe/engine/, one entry below, one row in the exactness table
of tests/test_exactness.py.
"""
from __future__ import annotations

import dataclasses
import math

from ..engine import spa_profiles
from .component import Component, choice, fraction_or_null, integer, number, positive_or_null, table

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


CACHES = table(
    Component("none", "dlmpipe.engine.full:FullRecompute",
              "full recompute every step (the exactness reference)", "all_rows", shadow_rows=True),
    Component(
        "archer", "dlmpipe.engine.archer:ArcherCache",
        "prompt K/V reuse with state-anchored refresh", "all_rows",
        {"K": {"description": "refresh radius, an integer >= 1 or inf (K=1 equals full recompute)",
               "anyOf": [{"type": "integer", "minimum": 1}, {"enum": ["inf", math.inf]}],
               "default": 8},
         "refresh": choice(["distance", "age"], "distance",
                           "distance (Hamming distance to the anchor >= K) or age (every A updates)"),
         "A": integer(8, "refresh age for refresh=age")},
        feedback_intervention=True, shadow_rows=True),
    Component(
        "fast_dllm_prefix", "dlmpipe.engine.fast_dllm:FastDLLMPrefixCache",
        "Fast-dLLM prefix cache: a full forward at each block start; later steps recompute the "
        "current block and every later position over cached prompt/earlier-block K/V",
        "block_rows", {"refresh_interval": _REFRESH_INTERVAL_OR_NULL}, shadow_rows=True),
    Component(
        "fast_dllm_dual", "dlmpipe.engine.fast_dllm:FastDLLMDualCache",
        "Fast-dLLM dual cache: a full forward at each block start; later steps recompute only the "
        "current block over cached K/V of every other position",
        "block_rows", {"refresh_interval": _REFRESH_INTERVAL_OR_NULL}, shadow_rows=True),
    Component(
        "fast_dllm_v2", "dlmpipe.engine.fast_dllm:FastDLLMv2Cache",
        "Fast-dLLM v2's block + sub-block cache: finished blocks are the block cache; the whole "
        "active block at each sub-block start and while its first position is masked, else only "
        "the sub-block's rows", "block_rows", {"refresh_interval": _REFRESH_INTERVAL_OR_NULL},
        shadow_rows=True, needs_block_causal=True),
    Component(
        "dkv_decode", "dlmpipe.engine.dkv:DKVDecodeCache",
        "dKV-Cache decode (delayed caching of decoded tokens' K/V; steps 0 and 1 of a block full)",
        "masked_rows",
        {"refresh_interval": integer(8, "full forward every this many steps of a block (paper 8; "
                                        "1 equals full recompute)")}, shadow_rows=True),
    Component(
        "dkv_greedy", "dlmpipe.engine.dkv:DKVGreedyCache",
        "dKV-Cache greedy: recompute only the tokens decoded since the last forward, the tokens "
        "due next (random_order sampler) and masked neighbours within the window", "masked_rows",
        {"refresh_interval": integer(2, "full forward every this many steps of a block (paper 2; "
                                        "1 equals full recompute)"),
         "window": integer(4, "masked positions within this distance of a recomputed token are "
                              "recomputed too (paper 4)", minimum=0)}, shadow_rows=True),
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
        auto={"profile": spa_profiles.profile_for}, shadow_rows=True),
    Component(
        "dllm_cache", "dlmpipe.engine.dllm_cache:DLLMCache",
        "dLLM-Cache: prompt refresh every K_p steps, response refresh every K_r steps, in between "
        "recompute the floor(rho*G) response rows whose value vectors changed most", "all_rows",
        {"K_p": integer(50, "prompt refresh interval (K_p = K_r = 1 equals full recompute)"),
         "K_r": integer(7, "response refresh interval"),
         "rho": number(0.25, "fraction of response rows recomputed between response refreshes",
                       maximum=1)}, shadow_rows=True),
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
        shadow_rows=True),
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
         "refresh_interval": _REFRESH_INTERVAL_OR_NULL},
        shadow_rows=True),
)


#: what each cache means on a block-causal backbone (``Component.on_block_causal``): every one
#: runs on the active block over the exact K/V of the finished prefix (dlmpipe/blockwise.py)
_ON_BLOCK_CAUSAL = {
    "none": "the active block's rows every step over the exact prefix (the releases' loop "
            "without a sub-block cache; the exactness reference)",
    "archer": "prompt cache over the active block's prompt rows (the prompt's tail, a shifted "
              "family's next token); the finished prefix is exact without it",
    "fast_dllm_prefix": "the sampler's sub-block and the rest of the active block recomputed, the "
                        "block's earlier rows reused",
    "fast_dllm_dual": "a sub-block cache (Fast-dLLM v2's, refreshed at sub-block starts only): the "
                      "sampler's sub-block over the active block's cached K/V",
    "fast_dllm_v2": "the release's block + sub-block cache",
    "dkv_decode": "delayed caching of the active block's decoded rows",
    "dkv_greedy": "the active block's rows decoded since the last forward, its due and "
                  "neighbouring masks",
    "spa": "updates rows of the active block (budgets of its positions); the prefix is exact, "
           "never refreshed",
    "dllm_cache": "updates rows of the active block (rho of its positions); the prefix is exact, "
                  "never refreshed",
    "d2cache": "selects rows of the active block; its attention rollout runs over them (the "
               "prefix's attention left out)",
    "dinfer_vicinity": "the window inside the active block: the sampler's sub-block with "
                       "prefix_look rows before and after_look rows after it, clipped to the "
                       "active block (the finished prefix is exact, never recomputed); "
                       "warmup_steps counts each active block's forwards (the cache begins with "
                       "each block)",
}
CACHES = {n: dataclasses.replace(c, on_block_causal=_ON_BLOCK_CAUSAL[n]) for n, c in CACHES.items()}
