"""What each cache means on a mixture-of-experts backbone (LLaDA-MoE, LLaDA2.0: the FFN is a
router + routed experts + shared experts, dlmpipe/backbones/moe.py), printed by ``python -m
dlmpipe methods`` next to the block-causal statements (docs/METHODS.md, "MoE backbones").

What holds for all of them: the MoE FFN is row-local, as a dense FFN is (a row's experts and
weights are a function of that row's own normed hidden state, and the routed layer computes each
row alike whatever rows share its calls), so a cache that reuses a row's FFN output or K/V reuses
that row's routing of the step it was computed at, and one that recomputes a row routes it
afresh; experts run only for the recomputed rows (rows x top-k expert rows, not every expert).
The degenerate settings stay exact (tests/test_exactness.py's MoE rows)."""
from __future__ import annotations

_REUSED_KV = ("reused K/V rows carry the routing of the step they were computed at (the expert "
              "choice shaped them in earlier layers); recomputed rows are routed afresh")

ON_MOE = {
    "none": "every row routed afresh every step: its top-k experts and the shared experts (the "
            "exactness reference)",
    "archer": "the cached prompt rows keep the routing of the step they were cached at; " + _REUSED_KV,
    "fast_dllm_prefix": _REUSED_KV,
    "fast_dllm_dual": _REUSED_KV,
    "fast_dllm_v2": _REUSED_KV,
    "dkv_decode": _REUSED_KV,
    "dkv_greedy": _REUSED_KV,
    "spa": "the proxies are on the attention side (the value projection's singular directions, or "
           "value/query/key/attention input/output), before the FFN, untouched by routing: a "
           "routing change is seen only through the next layers' inputs. A row not selected "
           "reuses its whole residual delta, attention plus the routed experts' weighted sum and "
           "the shared experts: its experts and weights stay those of its last recompute; a "
           "selected row is routed afresh, so the experts run on selected rows only",
    "dllm_cache": "the reused attention + FFN output of a row is its routed output (top-k experts, "
                  "their weights, the shared experts) from when it was last computed, routing "
                  "frozen with it; the V drift that picks rows is measured before the FFN, so it "
                  "does not see routing changes; recomputed rows are routed afresh (experts run "
                  "on them only)",
    "d2cache": "the attention rollout reads attention maps only (the MoE FFN plays no part in "
               "the selection); rows without queries keep their K/V, which their routing of the "
               "step they were last computed at shaped; rows with queries are routed afresh",
    "dinfer_vicinity": "the window's rows are routed afresh each step; " + _REUSED_KV,
}
