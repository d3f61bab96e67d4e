"""The method registry: every sampler and cache, declared once (docs/METHODS.md states each rule).

One entry per sampler and per cache carries what the rest of the pipeline needs to know about it:
its class (imported lazily, so this module, the campaign check and Snakemake's parsing never
import torch), the logit rows it reads (sampler) or serves (cache), the artifacts it needs (SPA
singular proxies), its parameters with defaults, ranges and descriptions, and the checks that
relate its parameters to a task's generation length. From these derive:

- the config schema's sampler/cache blocks (``schema_defs``; dlmpipe.campaign installs them),
- the pairing rule (``pairing_problem``: a sampler may not read rows a cache leaves stale),
- the workflow's extra inputs (``artifacts``: the svd rule's proxies file),
- construction with defaults filled and ranges checked (``resolve``; dlmpipe.methods builds),
- parameters chosen from the backbone when set to ``auto`` (``bind``: SPA-Cache's ``profile``;
  the campaign binds them per backbone, so a generate job's params hold the concrete value).

Adding a method: write its class, add one entry below, add one row to the exactness table in
tests/test_exactness.py. ``python -m dlmpipe.registry`` prints every entry's parameters.
"""
from __future__ import annotations

import copy
import importlib
import math
import sys
from dataclasses import dataclass, field
from typing import Callable

from .engine import spa_profiles

# ------------------------------------------------------------------------------------------
# logit rows: which response rows get fresh logits at every step
# ------------------------------------------------------------------------------------------
#: row sets, widest first; a cache serving a set also serves every narrower one
ROWS = ("all_rows", "block_rows", "masked_rows")
ROWS_MEANING = {"all_rows": "every response row (visible ones too)",
                "block_rows": "the rows of the current block",
                "masked_rows": "the masked rows of the current block"}


def serves(cache_rows: str, sampler_rows: str) -> bool:
    return ROWS.index(cache_rows) <= ROWS.index(sampler_rows)


# ------------------------------------------------------------------------------------------
# parameter declarations (JSON schema fragments, with their default and description)
# ------------------------------------------------------------------------------------------
def integer(default, description: str, minimum: int = 1) -> dict:
    return {"description": description, "type": "integer", "minimum": minimum, "default": default}


def number(default, description: str, minimum: float | None = 0, maximum: float | None = None,
           exclusive_minimum: bool = False) -> dict:
    spec: dict = {"description": description, "type": "number", "default": default}
    if minimum is not None:
        spec["exclusiveMinimum" if exclusive_minimum else "minimum"] = minimum
    if maximum is not None:
        spec["maximum"] = maximum
    return spec


def positive_or_null(default, description: str) -> dict:
    return {"description": description, "anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
            "default": default}


def fraction_or_null(default, description: str) -> dict:
    return {"description": description,
            "anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 1}, {"type": "null"}],
            "default": default}


def choice(values: list, default, description: str) -> dict:
    return {"description": description, "enum": list(values), "default": default}


def seed_or_null(default, description: str) -> dict:
    return {"description": description, "anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}],
            "default": default}


TEMPERATURE = number(0, "Gumbel noise temperature (0 is greedy)")
#: LLaDA's blocks and uniform per-block schedule (llada_confidence, random_order)
LLADA_SCHEDULE = {"block_length": positive_or_null(None, "null means gen_length (one block)"),
                  "steps": positive_or_null(None, "total steps; null means gen_length"),
                  "temperature": TEMPERATURE}
#: Fast-dLLM's block loop (threshold, factor): each block decoded until it has no masks
PARALLEL_BLOCKS = {"block_length": positive_or_null(32, "null means gen_length (one block); "
                                                        "Fast-dLLM uses 32"),
                   "temperature": TEMPERATURE,
                   "max_steps_per_block": positive_or_null(None, "optional cap; the capped step "
                                                                 "accepts every remaining mask")}


# ------------------------------------------------------------------------------------------
# checks against a task's generation length (what a schema cannot say)
# ------------------------------------------------------------------------------------------
def blocks_tile_response(params: dict, gen_length: int) -> str | None:
    """LLaDA-style blocks tile the response (block_length null: one block)."""
    block = params.get("block_length") or gen_length
    if block > gen_length:
        return (f"sampler.block_length: {block} is longer than gen_length {gen_length} (null: one "
                "block of gen_length)")
    if gen_length % block:
        return f"sampler.block_length: {block} does not divide gen_length {gen_length}"
    return None


def steps_split_over_blocks(params: dict, gen_length: int) -> str | None:
    """LLaDA's schedule: total steps split evenly over the blocks."""
    block = params.get("block_length") or gen_length
    steps = params.get("steps")
    if gen_length % block == 0 and steps is not None and steps % (gen_length // block):
        return (f"sampler.steps: {steps} is not a multiple of the {gen_length // block} blocks "
                f"(gen_length {gen_length} / block_length {block})")
    return None


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


# ------------------------------------------------------------------------------------------
# the entries
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Component:
    """One sampler or cache: everything the pipeline knows about it without importing it."""

    name: str
    target: str                  # "module:Class", imported on first use
    description: str
    rows: str                    # sampler: rows it reads; cache: rows it serves fresh logits for
    params: dict = field(default_factory=dict)
    #: artifact kind (e.g. "proxies", a keyword of the constructor) -> whether the component
    #: needs it, given its filled parameters; the workflow makes the file, the job loads it
    artifacts: dict[str, Callable[[dict], bool]] = field(default_factory=dict)
    #: checks of the filled parameters against a task's gen_length; each returns a problem or None
    checks: tuple[Callable[[dict, int], str | None], ...] = ()
    #: checks of the filled parameters against the backbone's widths (``widths_problems``)
    width_checks: tuple[Callable[[dict, object], str | None], ...] = ()
    #: parameters whose value "auto" is chosen from the backbone: name -> function(filled
    #: params, backbones.identity.BackboneIdentity) -> the concrete value (ValueError, saying
    #: why, when none fits); a function may keep "auto" where the parameter is unused
    auto: dict[str, Callable[[dict, object], object]] = field(default_factory=dict)
    #: sampler: reads shadow rows (WINO's verification queries, ``Sampler.shadow_block``); cache:
    #: computes them (``Cache.note_shadow_block``, engine/shadow.py)
    shadow_rows: bool = False
    #: cache: keeps a prompt snapshot whose next refresh can be forced or withheld
    #: (``Cache.force_next``), which the matched-state intervention needs (docs/ANALYSES.md)
    feedback_intervention: bool = False

    def load(self) -> type:
        module, _, cls = self.target.partition(":")
        return getattr(importlib.import_module(module), cls)

    def defaults(self) -> dict:
        return {k: copy.deepcopy(v["default"]) for k, v in self.params.items()}


def _registry(*components: Component) -> dict[str, Component]:
    return {c.name: c for c in components}


#: which confidence of the model's token ranks the masked positions (llada_confidence,
#: certainty_prior; docs/METHODS.md §1.1)
CONFIDENCE = choice(["probability", "maskgit_plus", "topk_margin", "entropy"], "probability",
                    "probability: LLaDA's, the token's softmax probability; as Dream's alg, on "
                    "softmax(logits / temperature): maskgit_plus the token's probability (equal "
                    "to probability at temperature 0), topk_margin top-1 minus top-2, entropy "
                    "the negative entropy")


SAMPLERS = _registry(
    Component(
        "llada_confidence", "dlmpipe.samplers.llada_confidence:LLaDAConfidence",
        "LLaDA low-confidence remasking (blocks, uniform unmasking schedule)", "masked_rows",
        {**LLADA_SCHEDULE, "confidence": CONFIDENCE},
        checks=(blocks_tile_response, steps_split_over_blocks)),
    Component(
        "saber", "dlmpipe.samplers.saber:Saber",
        "Saber rollback sampler (adaptive acceptance, drift-based re-masking)", "all_rows",
        {"n": integer(2, "minimum accepted per step"),
         "mu": number(2, "rollback divisor", exclusive_minimum=True),
         "block_length": positive_or_null(None, "null means gen_length (one block)"),
         "temperature": TEMPERATURE,
         "max_steps_per_block": integer(1024, "guard against pathological loops: no re-masking "
                                              "after this many steps of a block")},
        checks=(blocks_tile_response,)),
    Component(
        "threshold", "dlmpipe.samplers.parallel:ThresholdSampler",
        "Fast-dLLM threshold parallel decoding (per block, looped until it has no masks)",
        "masked_rows",
        {"tau": number(0.9, "accept every candidate with confidence >= tau (the most confident "
                            "always)", maximum=1),
         **PARALLEL_BLOCKS},
        checks=(blocks_tile_response,)),
    Component(
        "factor", "dlmpipe.samplers.parallel:FactorSampler",
        "Fast-dLLM factor parallel decoding (per block, looped until it has no masks)",
        "masked_rows",
        {"f": number(1.0, "accept the largest sorted prefix n with c_(i) >= 1 - f/(i+1), i = 2..n",
                     exclusive_minimum=True),
         "rule": choice(["paper", "released"], "paper",
                        "paper: the rule above; released: Fast-dLLM's code "
                        "(get_transfer_index_dynamic), which also accepts the last candidate when "
                        "only it fails (n = m - 1 of m becomes m)"),
         **PARALLEL_BLOCKS},
        checks=(blocks_tile_response,)),
    Component(
        "random_order", "dlmpipe.samplers.random_order:RandomOrder",
        "random decoding order fixed at each block's start, LLaDA's schedule (dKV-Cache greedy)",
        "masked_rows",
        {**LLADA_SCHEDULE,
         "order_seed": seed_or_null(None, "null: orders drawn from the sample's generator; an "
                                          "integer: from a generator seeded with it at each "
                                          "sample's start, so every sample gets the same block "
                                          "orders (the released dKV-Cache code seeds 42)")},
        checks=(blocks_tile_response, steps_split_over_blocks)),
    Component(
        "dream", "dlmpipe.samplers.dream:DreamSampler",
        "Dream's native sampler: no blocks, schedule linspace(1, eps, steps + 1), masked positions "
        "anywhere in the response unmasked by confidence (alg)", "masked_rows",
        {"steps": positive_or_null(None, "total steps; null means gen_length"),
         "eps": {"description": "final time of the schedule linspace(1, eps, steps + 1)",
                 "type": "number", "minimum": 0, "exclusiveMaximum": 1, "default": 1e-3},
         "alg": choice(["origin", "maskgit_plus", "topk_margin", "entropy"], "origin",
                       "origin: each mask unmasked with probability 1 - s/t; maskgit_plus, "
                       "topk_margin, entropy: the floor(m (1 - s/t)) most confident masks by "
                       "probability, top-1 minus top-2 margin, or negative entropy"),
         "temperature": number(0, "divides the logits; > 0 samples the token, 0 takes the most "
                                  "probable"),
         "top_p": fraction_or_null(None, "nucleus filter before the softmax; null: none"),
         "top_k": positive_or_null(None, "keep the k largest logits; null: all"),
         "alg_temp": {"description": "null or 0: the most confident masks; > 0: drawn without "
                                     "replacement with probabilities softmax(confidence / alg_temp)",
                      "anyOf": [{"type": "number", "minimum": 0}, {"type": "null"}],
                      "default": None}}),
    Component(
        "certainty_prior", "dlmpipe.samplers.certainty_prior:CertaintyPriorSampler",
        "certainty-prior decoding (d2Cache): LLaDA's schedule, masked positions ranked by "
        "confidence x Gaussian density of the decoded positions around them", "masked_rows",
        {**LLADA_SCHEDULE, "confidence": CONFIDENCE,
         "sigma": {"description": "width of the Gaussian certainty density (d2Cache's default "
                                  "10; smaller: closer to left to right; inf: a constant prior, "
                                  "equal to llada_confidence)",
                   "anyOf": [{"type": "number", "exclusiveMinimum": 0},
                             {"enum": ["inf", math.inf]}],
                   "default": 10.0}},
        checks=(blocks_tile_response, steps_split_over_blocks)),
    Component(
        "pc_sampler", "dlmpipe.samplers.pc_sampler:PCSampler",
        "PC-Sampler: LLaDA's schedule, masked positions ranked by exp(-lambd * offset in the "
        "block) x min(p * -log f(token), alpha), f a reference corpus's token frequencies",
        "masked_rows",
        {**LLADA_SCHEDULE,
         "lambd": number(0.25, "position-aware weight exp(-lambd * offset) (released 0.25; 0: "
                               "no position bias)"),
         "alpha": number(10, "clip of the calibrated confidence (released 10)",
                         exclusive_minimum=True),
         "baseline_name": {"description": "reference corpus JSON (the released format: "
                                          "num_token, p_baseline_dict) for the calibration, "
                                          "tokenized by the backbone's tokenizer; null: no "
                                          "calibration (min(p, alpha)). The released default, "
                                          "PC-Sampler's data/baseline/reference_corpus.json "
                                          "(LLaDA's tokenizer), is not shipped",
                           "anyOf": [{"type": "string", "minLength": 1}, {"type": "null"}],
                           "default": None}},
        checks=(blocks_tile_response, steps_split_over_blocks)),
    Component(
        "wino", "dlmpipe.samplers.wino:Wino",
        "WINO revokable decoding: per block, wide-in unmasks every mask with confidence >= wide_in, "
        "narrow-out re-masks decoded tokens whose shadow-block verification is < narrow_out",
        "masked_rows",
        {"wide_in": number(0.6, "unmask every masked position of the block with confidence >= "
                                "wide_in (the most confident always; WINO's released default 0.6, "
                                "0.5-0.8 per task)", maximum=1),
         "narrow_out": number(0.9, "re-mask decoded tokens whose verification confidence is < "
                                   "narrow_out, at most (unmasked this step) - 1 (released 0.9; 0 "
                                   "never re-masks)", maximum=1),
         "block_length": positive_or_null(128, "null means gen_length (one block); WINO uses 128"),
         "temperature": TEMPERATURE,
         "rule": choice(["paper", "released"], "paper",
                        "paper: the rule above over the whole block; released: d2Cache's WINO, "
                        "which caps wide-in at clamp(floor(0.7 m), 5, 20) and narrows the "
                        "verification window in place to the span of the positions masked at "
                        "every earlier step")},
        checks=(blocks_tile_response,), shadow_rows=True),
    Component(
        "eb_sampler", "dlmpipe.samplers.eb_sampler:EBSampler",
        "EB-Sampler: per block, unmask the largest prefix of the masked positions (sorted by an "
        "error proxy) whose entropies sum, minus their maximum, to at most gamma", "masked_rows",
        {"gamma": number(0.001, "entropy budget: sum of the accepted entropies minus their maximum "
                                "(0: one token per step; the d2Cache release's default 0.001)"),
         "error_proxy": choice(["entropy", "confidence", "margin"], "entropy",
                               "order of the candidates: entropy (ascending), confidence "
                               "(probability of the token) or margin (top-1 minus top-2), "
                               "descending"),
         "rule": choice(["paper", "released"], "paper",
                        "paper: sum - max <= gamma; released: the d2Cache code, sum minus the "
                        "last entropy in order (equal under the entropy ordering)"),
         "block_length": positive_or_null(32, "null means gen_length (one block); the d2Cache "
                                              "release defaults to 32"),
         "temperature": TEMPERATURE},
        checks=(blocks_tile_response,)),
    Component(
        "klass", "dlmpipe.samplers.klass:KLASS",
        "KLASS: unmask the block's masked positions whose last history_length step-to-step KL "
        "divergences are below kl_threshold and whose confidence is above conf_threshold; none "
        "ready: LLaDA's top-k by confidence", "all_rows",
        {"conf_threshold": number(0.9, "ready only with confidence (probability of the token) "
                                       "above this", maximum=1),
         "kl_threshold": number(0.01, "ready only when every recorded KL is below this"),
         "history_length": integer(2, "how many recent step-to-step KLs must be below "
                                      "kl_threshold"),
         "unmask_strategy": choice(["all", "max_conf", "min_kl", "random"], "all",
                                   "which ready positions a step unmasks: all, or the one with the "
                                   "highest confidence, the lowest KL, or one at random"),
         "rule": choice(["paper", "released"], "paper",
                        "paper: the rule above; released: the LLaDA release, where nothing is ready "
                        "in a block's first history_length - 1 steps and, at temperature > 0, "
                        "confidence and KL come from the Gumbel-perturbed softmax"),
         **LLADA_SCHEDULE},
        checks=(blocks_tile_response, steps_split_over_blocks)),
)

_REFRESH_INTERVAL_OR_NULL = positive_or_null(
    None, "also a full forward every this many steps of a block (1: every step, equals full "
          "recompute); null: block starts only")


CACHES = _registry(
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
)

KINDS = {"sampler": SAMPLERS, "cache": CACHES}


# ------------------------------------------------------------------------------------------
# what derives from the entries
# ------------------------------------------------------------------------------------------
def lookup(kind: str, name: str) -> Component:
    table = KINDS[kind]
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")
    return table[name]


def _refusal(s: Component, c: Component) -> str | None:
    if not serves(c.rows, s.rows):
        return (f"cache {c.name!r} gives fresh logits only for {ROWS_MEANING[c.rows]}; sampler "
                f"{s.name!r} reads {ROWS_MEANING[s.rows]} at every step")
    if s.shadow_rows and not c.shadow_rows:
        return (f"cache {c.name!r} does not compute shadow rows; sampler {s.name!r} reads them at "
                f"every step (WINO's verification queries: a masked copy of the block appended "
                f"to the input, docs/ARCHITECTURE.md)")
    return None


def serving_caches(sampler: str) -> list[str]:
    """The caches that can serve ``sampler`` (every row it reads, shadow rows if it reads them)."""
    s = lookup("sampler", sampler)
    return [name for name, c in CACHES.items() if _refusal(s, c) is None]


def pairing_problem(sampler: str, cache: str) -> str | None:
    """Why ``cache`` cannot serve ``sampler`` (it leaves rows stale that the sampler reads), and
    the caches that can."""
    why = _refusal(lookup("sampler", sampler), lookup("cache", cache))
    if why is None:
        return None
    return f"{why}; caches that serve it: {', '.join(serving_caches(sampler))}"


def artifacts(method: dict) -> tuple[str, ...]:
    """Artifact kinds a method needs (its sampler and cache specs with defaults filled)."""
    return tuple(kind for part in ("sampler", "cache")
                 for kind, needed in lookup(part, method[part]["name"]).artifacts.items()
                 if needed(method[part]))


def gen_length_problems(method: dict, gen_length: int) -> list[str]:
    """The method's parameters against a task's generation length."""
    return [p for part in ("sampler", "cache")
            for check in lookup(part, method[part]["name"]).checks
            if (p := check(method[part], gen_length))]


def widths_problems(method: dict, widths) -> list[str]:
    """The method's parameters against the backbone's widths (``width_checks``)."""
    return [p for part in ("sampler", "cache")
            for check in lookup(part, method[part]["name"]).width_checks
            if (p := check(method[part], widths))]


def schema_defs() -> dict:
    """The config schema's ``$defs`` for samplers and caches: a name enum, one if/then per
    entry pointing at its parameter block, unknown parameters rejected."""
    defs: dict = {}
    for kind, table in KINDS.items():
        plural = f"{kind}s"
        defs[kind] = {
            "description": {"sampler": "the decoder (logits -> next response state)",
                            "cache": "how a step's logits are computed (owns every reuse and "
                                     "refresh decision)"}[kind],
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"enum": list(table)}},
            "allOf": [{"if": {"required": ["name"], "properties": {"name": {"const": n}}},
                       "then": {"$ref": f"#/$defs/{plural}/{n}"}} for n in table],
            "unevaluatedProperties": False,
        }
        defs[plural] = {n: {"description": c.description, "properties": copy.deepcopy(c.params)}
                        for n, c in table.items()}
    return defs


def canonical(value):
    """Builtin, JSON-safe parameter values: infinity is the string "inf"."""
    if isinstance(value, float) and value == float("inf"):
        return "inf"
    if isinstance(value, str) and value.lower() in (".inf", "inf", "infinity"):
        return "inf"
    return value


BOUNDS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))


def _values(values) -> list[str]:
    return list(dict.fromkeys(str(canonical(v)) for v in values))  # "inf" and math.inf once


def bounds(spec: dict) -> str | None:
    """A numeric constraint's range in words, for "out of range" messages: ">= 1 or inf",
    "> 0 and <= 1 or null", "auto or >= 1"; None when no alternative has a bound."""
    alternatives = spec.get("anyOf") or spec.get("oneOf") or [spec]
    if not any(key in alt for alt in alternatives for key, _ in BOUNDS):
        return None
    words = []
    for alt in alternatives:
        if "enum" in alt or "const" in alt:
            words += _values(alt.get("enum", [alt.get("const")]))
        elif alt.get("type") == "null":
            words.append("null")
        elif alt.get("type") in ("integer", "number"):
            words.append(" and ".join(f"{op} {alt[key]}" for key, op in BOUNDS if key in alt)
                         or f"any {alt['type']}")
    return " or ".join(dict.fromkeys(words))


def expected(spec: dict) -> str:
    """A parameter's constraint in words: "an integer >= 1", "a number > 0 and <= 1", ..."""
    if "anyOf" in spec:
        return " or ".join(expected(alt) for alt in spec["anyOf"])
    if "enum" in spec:
        values = _values(spec["enum"])
        return values[0] if len(values) == 1 else "one of " + ", ".join(values)
    kind = spec.get("type")
    if kind == "null":
        return "null"
    words = {"integer": "an integer", "number": "a number"}.get(kind, f"a {kind}")
    limits = [f"{op} {spec[key]}" for key, op in BOUNDS if key in spec]
    return " ".join([words, " and ".join(limits)]).strip()


class NoFit(ValueError):
    """No value fits an ``auto`` parameter on a backbone; ``kind`` and ``key`` name it."""

    def __init__(self, kind: str, key: str, why: str):
        self.kind, self.key = kind, key
        super().__init__(f"{kind}.{key}: auto: {why}")


def bind(kind: str, spec: dict, backbone) -> dict:
    """``spec`` (a sampler or cache with its parameters filled) with every ``auto`` parameter
    chosen for ``backbone`` (a ``backbones.identity.BackboneIdentity``); NoFit naming the
    parameter when nothing fits."""
    component = lookup(kind, spec["name"])
    out = dict(spec)
    for key, choose in component.auto.items():
        if out.get(key) == "auto":
            try:
                out[key] = choose(out, backbone)
            except ValueError as e:
                raise NoFit(kind, key, str(e)) from None
    return out


def bind_method(method: dict, backbone) -> dict:
    """A method's concrete parameters for ``backbone``: defaults filled, ranges checked, ``auto``
    parameters bound (``resolve`` of its sampler and its cache)."""
    out = dict(method)
    for part in ("sampler", "cache"):
        component, params = resolve(part, method[part], backbone)
        out[part] = {"name": component.name, **params}
    return out


def resolve(kind: str, spec: dict, backbone=None) -> tuple[Component, dict]:
    """The entry of ``spec["name"]`` and its parameters with defaults filled and ranges checked
    (ValueError naming every bad parameter), ``auto`` parameters bound to ``backbone`` when
    given. Used when a method is built outside a checked campaign (jobs, tests, benchmarks)."""
    import jsonschema

    params = dict(spec)
    component = lookup(kind, params.pop("name"))
    unknown = sorted(set(params) - set(component.params))
    problems = [f"{kind} {component.name}: unknown parameter {k!r} (known: "
                f"{', '.join(component.params) or 'none'})" for k in unknown]
    filled = {**component.defaults(), **{k: canonical(v) for k, v in params.items()}}
    for key, value in filled.items():
        spec = component.params.get(key)
        if spec is not None and not jsonschema.Draft202012Validator(spec).is_valid(value):
            problems.append(f"{kind} {component.name}: {key} must be {expected(spec)} "
                            f"(got {value!r})")
    if problems:
        raise ValueError("; ".join(problems))
    if backbone is not None:
        filled = {k: v for k, v in bind(kind, {"name": component.name, **filled}, backbone).items()
                  if k != "name"}
    return component, filled


def describe() -> str:
    """Every entry with its rows, artifacts and parameters (defaults), for people."""
    lines = []
    for kind, table in KINDS.items():
        lines.append(f"{kind}s:")
        for c in table.values():
            lines.append(f"  {c.name:18s} {c.description}")
            lines.append(f"  {'':18s} {'reads' if kind == 'sampler' else 'serves'} {c.rows}"
                         + (" + shadow rows" if c.shadow_rows else ""))
            for key, spec in c.params.items():
                lines.append(f"  {'':18s}   {key} = {spec['default']!r}: {spec['description']}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(describe())
    sys.exit(0)
