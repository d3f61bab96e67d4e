"""Every sampler, declared once (docs/METHODS.md §1): class, the rows it reads, parameters with
defaults and ranges, and the checks of its blocks and steps against a task's gen_length.

Each entry also says what it means on a block-causal backbone, its cost model for ``plan`` and
its host reads per step (with the parameters they are checked at).

Adding a sampler (docs/DEVELOPING.md, "Adding a method"): its class in dlmpipe/samplers/, one
entry below, one row in the exactness table of tests/test_exactness.py.
"""
from __future__ import annotations

import math

from .component import (Component, choice, fraction_or_null, integer, number, positive_or_null,
                        seed_or_null, table)
from .costs import block_steps, fixed_steps, parallel, per_update

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
        return f"sampler.block_length: {block} is longer than gen_length {gen_length}"
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


def response_blocks_tile_response(params: dict, gen_length: int) -> str | None:
    """dInfer's decoders: blocks from the response's start tile it (absolute alignment: any
    length; the first and last blocks are cut)."""
    return blocks_tile_response(params, gen_length) if params.get("block_alignment") != "absolute" else None


#: dInfer's block alignment (dinfer_hierarchy, dinfer_credit; docs/METHODS.md §1.13)
DINFER_ALIGNMENT = choice(["absolute", "response"], "absolute",
                          "absolute: blocks at multiples of block_length in absolute positions, "
                          "the first cut at the response's start (start_block_align, as the "
                          "release's benchmark runs); response: blocks from the response's first "
                          "position (BlockIteratorFactory's own default, as dlmpipe's other block "
                          "samplers), block_length must divide gen_length")


#: which confidence of the model's token ranks the masked positions (llada_confidence,
#: certainty_prior; docs/METHODS.md §1.1)
CONFIDENCE = choice(["probability", "maskgit_plus", "topk_margin", "entropy"], "probability",
                    "probability: LLaDA's, the token's softmax probability; as Dream's alg, on "
                    "softmax(logits / temperature): maskgit_plus the token's probability (equal "
                    "to probability at temperature 0), topk_margin top-1 minus top-2, entropy "
                    "the negative entropy")


SAMPLERS = table(
    Component(
        "llada_confidence", "dlmpipe.samplers.llada_confidence:LLaDAConfidence",
        "LLaDA low-confidence remasking (blocks, uniform unmasking schedule)", "masked_rows",
        {**LLADA_SCHEDULE, "confidence": CONFIDENCE},
        checks=(blocks_tile_response, steps_split_over_blocks),
        on_block_causal="LLaDA's schedule inside each active block (steps per active block)",
        host_sync=(0, {"block_length": 8}),
        cost=fixed_steps()),
    Component(
        "saber", "dlmpipe.samplers.saber:Saber",
        "Saber rollback sampler (adaptive acceptance, drift-based re-masking)", "all_rows",
        {"n": integer(2, "minimum accepted per step"),
         "mu": number(2, "rollback divisor", exclusive_minimum=True),
         "block_length": positive_or_null(None, "null means gen_length (one block)"),
         "temperature": TEMPERATURE,
         "max_steps_per_block": integer(1024, "guard against pathological loops: no re-masking "
                                              "after this many steps of a block")},
        checks=(blocks_tile_response,),
        on_block_causal="rollback stays inside the active block: finished blocks are final (the exact "
             "prefix); Saber re-scores only the active block's rows",
        host_sync=(1, {"block_length": 8}),
        cost=per_update("gen_length / n updates (n accepted per update net of rollbacks): an "
                        "estimate", lambda p, t: float(p["n"]), capped=False)),
    Component(
        "threshold", "dlmpipe.samplers.parallel:ThresholdSampler",
        "Fast-dLLM threshold parallel decoding (per block, looped until it has no masks)",
        "masked_rows",
        {"tau": number(0.9, "accept every candidate with confidence >= tau (the most confident "
                            "always)", maximum=1),
         **PARALLEL_BLOCKS},
        checks=(blocks_tile_response,),
        on_block_causal="the block loop inside the active block (block_length: its sub-blocks)",
        host_sync=(1, {"block_length": 8}),
        cost=parallel("gen_length / t updates, t the assumed tokens per update "
                      "(--parallel-tokens; 1: the rule's worst case), at most max_steps_per_block per "
                      "block")),
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
        checks=(blocks_tile_response,),
        on_block_causal="the block loop inside the active block (block_length: its sub-blocks)",
        host_sync=(1, {"block_length": 8}),
        cost=parallel("gen_length / t updates, t as for threshold, at most "
                      "max_steps_per_block per block")),
    Component(
        "random_order", "dlmpipe.samplers.random_order:RandomOrder",
        "random decoding order fixed at each block's start, LLaDA's schedule (dKV-Cache greedy)",
        "masked_rows",
        {**LLADA_SCHEDULE,
         "order_seed": seed_or_null(None, "null: orders drawn from the sample's generator; an "
                                          "integer: from a generator seeded with it at each "
                                          "sample's start, so every sample gets the same block "
                                          "orders (the released dKV-Cache code seeds 42)")},
        checks=(blocks_tile_response, steps_split_over_blocks),
        on_block_causal="orders fixed per sub-block of the active block",
        host_sync=(0, {"block_length": 8}),
        cost=fixed_steps()),
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
                      "default": None}},
        on_block_causal="Dream's schedule over each active block's positions (steps per active block)",
        host_sync=(0, {"alg": "entropy", "temperature": 0.2, "top_p": 0.95}),
        cost=fixed_steps(blocks=False)),
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
        checks=(blocks_tile_response, steps_split_over_blocks),
        on_block_causal="LLaDA's schedule inside the active block; the certainty density over "
                       "its decoded positions",
        host_sync=(0, {"block_length": 8}),
        cost=fixed_steps()),
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
        checks=(blocks_tile_response, steps_split_over_blocks),
        on_block_causal="LLaDA's schedule inside the active block; the position weight from the "
                  "sub-block's start",
        host_sync=(0, {"block_length": 8}),
        cost=fixed_steps()),
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
        checks=(blocks_tile_response,), shadow_rows=True,
        on_block_causal="wide-in and narrow-out inside the active block; the shadow rows also attend to the "
            "finished prefix's K/V",
        host_sync=(1, {"block_length": 8}),
        cost=parallel("gen_length / t updates, t as for threshold, plus "
                      "block_length shadow rows in every forward", shadow=True)),
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
        checks=(blocks_tile_response,),
        on_block_causal="the entropy bound inside the active block (block_length: its sub-blocks)",
        host_sync=(1, {"block_length": 8}),
        cost=parallel("gen_length / t updates, t as for threshold")),
    Component(
        "sdar", "dlmpipe.samplers.sdar:SDARSampler",
        "SDAR's generate (block_diffusion_generate): per active block, the block's positions split "
        "over steps; each step draws tokens (temperature, top-k, top-p) and transfers them by the "
        "remasking strategy", "block_rows",
        {"remasking": choice(["low_confidence_dynamic", "low_confidence_static", "sequential",
                              "entropy_bounded"], "low_confidence_dynamic",
                             "low_confidence_dynamic: every mask above confidence_threshold when at "
                             "least the step's count, else that many most confident; "
                             "low_confidence_static: the step's count most confident; sequential: "
                             "from the first mask on; entropy_bounded: by ascending entropy while "
                             "their sum stays below eb_threshold"),
         "steps": integer(4, "denoising steps per active block (the release's default 4; its "
                             "evaluation uses the block size)"),
         "confidence_threshold": number(0.85, "low_confidence_dynamic's threshold (released 0.85)",
                                        maximum=1),
         "eb_threshold": number(0.35, "entropy_bounded's bound on the summed entropies (released "
                                      "0.35)", exclusive_minimum=True),
         "temperature": number(1.0, "divides the logits before the draw (released 1.0; 0: the most "
                                    "probable token)"),
         "top_k": positive_or_null(None, "keep the k most probable tokens (null: all; the "
                                         "release's 0)"),
         "top_p": number(1.0, "nucleus mass kept (1: all)", exclusive_minimum=True, maximum=1),
         "rule": choice(["paper", "released", "evaluation"], "paper",
                        "paper: only masked positions are transferred; released: generate.py's "
                        "top-k over the whole block, which rewrites decoded positions once the "
                        "step's count exceeds the masks left (entropy_bounded cannot run there); "
                        "evaluation: the release's OpenCompass loop (huggingface_bd3.py), the "
                        "confidence the token's probability before top-k/top-p (temperature > 0, "
                        "low_confidence remasking only)")},
        checks=(lambda p, g: "sampler.rule: released cannot run remasking entropy_bounded (the "
                "release's branch sums the chosen tokens' p log p over the block and never "
                "initialises its selection); use rule paper"
                if p.get("rule") == "released" and p.get("remasking") == "entropy_bounded" else None,
                lambda p, g: "sampler.rule: evaluation (SDAR's OpenCompass loop) needs temperature "
                "> 0 (its sampler asserts it; greedy there is top_k 1) and remasking "
                "low_confidence_dynamic or low_confidence_static (its only two)"
                if p.get("rule") == "evaluation" and (
                    (p.get("temperature", 1.0) or 0) <= 0 or p.get("remasking", "low_confidence_dynamic")
                    not in ("low_confidence_dynamic", "low_confidence_static")) else None),
        needs_block_causal=True,
        on_block_causal="the release's denoising loop of one active block",
        host_sync=(1, {"block_length": 8}),  # whether the block still has masks
        cost=block_steps("steps updates per block of the backbone (its config.json's block "
                         "size; 4, SDAR's released one, where it is not known)")),
    Component(
        "fast_dllm_v2", "dlmpipe.samplers.fast_dllm_v2:FastDLLMv2Sampler",
        "Fast-dLLM v2's batch_sample: per active block, sub-blocks from the block's start, each "
        "stepped until it has no masks, unmasking every mask above threshold and the most "
        "confident", "masked_rows",
        {"threshold": number(0.9, "unmask every masked position with confidence > threshold (the "
                                  "most confident always; eval.py's 0.9)", maximum=1),
         "sub_block_length": integer(8, "sub-block positions, counted from the active block's start "
                                        "(eval.py's small_block_size 8)"),
         "temperature": number(0, "0 (the release's default): the most probable token; > 0: drawn "
                                  "from the top-p filtered softmax(logits / T)"),
         "top_p": number(0.95, "nucleus mass kept at temperature > 0 (released 0.95)",
                         exclusive_minimum=True, maximum=1)},
        needs_block_causal=True,
        on_block_causal="the release's sub-block loop of one active block",
        host_sync=(1, {"block_length": 8}),  # whether the sub-block still has masks
        cost=parallel("gen_length / t updates, t as for threshold, in sub-blocks of "
                      "sub_block_length", block_key="sub_block_length")),
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
        checks=(blocks_tile_response, steps_split_over_blocks),
        on_block_causal="KL histories of the active block's positions (steps per active block)",
        host_sync=(1, {"block_length": 8}),
        cost=fixed_steps("at most steps updates (LLaDA's schedule when nothing is ready): "
                          "steps assumed")),
    Component(
        "dinfer_hierarchy", "dlmpipe.samplers.dinfer:HierarchySampler",
        "dInfer's hierarchical decoding: per step, in every run of adjacent masked positions of "
        "the block, the most confident one if above low_threshold; every position above "
        "threshold; always the block's most confident (per block, looped until it has no masks)",
        "masked_rows",
        {"threshold": number(0.9, "also unmask every masked position with confidence > threshold "
                                  "(the release's benchmark default 0.9)", maximum=1),
         "low_threshold": number(0.3, "a run's most confident position is unmasked only above "
                                      "this (the benchmark's default 0.3; HierarchyDecoder's own "
                                      "0.4)", maximum=1),
         "block_length": positive_or_null(64, "null means gen_length (one block); the release's "
                                              "benchmark uses 64"),
         "block_alignment": DINFER_ALIGNMENT,
         "temperature": TEMPERATURE},
        checks=(response_blocks_tile_response,),
        on_block_causal="the block loop inside the active block (block_length: its sub-blocks); "
                        "runs of masked positions are counted inside the sub-block",
        host_sync=(1, {"block_length": 8}),  # the block loop's read (accepted, masks left)
        cost=parallel("gen_length / t updates, t as for threshold")),
    Component(
        "dinfer_credit", "dlmpipe.samplers.dinfer:CreditSampler",
        "dInfer's credit decoding: a per-block credit (EMA of each masked position's top-1 "
        "probability ** boost_gamma at its top-1 token) fused into the logits, l + credit_alpha "
        "log(1 + credit); dInfer's threshold rule on the fused confidences (per block, looped "
        "until it has no masks)", "masked_rows",
        {"threshold": number(0.9, "unmask every candidate with fused confidence >= threshold "
                                  "(the most confident always; the benchmark's default 0.9)",
                             maximum=1),
         "credit_alpha": number(0.7, "weight of log(1 + credit) added to the logits (released 0.7; "
                                     "0: dInfer's plain threshold decoder)"),
         "boost_gamma": number(0.2, "exponent of the top-1 probability added to the credit "
                                    "(released 0.2)"),
         "decay_beta": number(0.8, "the credit's decay per step of a block (released 0.8)",
                              maximum=1),
         "block_length": positive_or_null(64, "null means gen_length (one block); the release's "
                                              "benchmark uses 64"),
         "block_alignment": DINFER_ALIGNMENT,
         "temperature": TEMPERATURE},
        checks=(response_blocks_tile_response,),
        on_block_causal="the block loop inside the active block (block_length: its sub-blocks); "
                     "the credit restarts with each sub-block",
        host_sync=(1, {"block_length": 8}),  # the block loop's read (accepted, masks left)
        cost=parallel("gen_length / t updates, t as for threshold")),
    kind="sampler",
)
