"""Every cache at its degenerate setting reproduces full recompute, token for token, on both
backbone families (docs/ARCHITECTURE.md, testing shape); and every registered method is
importable, registered and paired correctly (dlmpipe/registry/).

A new cache adds one row to ``DEGENERATE``; ``test_every_cache_has_a_degenerate_row`` fails
until it does.
"""
from __future__ import annotations

import importlib
import inspect
import json
import pkgutil

import pytest
import torch

import dlmpipe.engine
import dlmpipe.samplers
from dlmpipe import registry
from dlmpipe.engine.base import Cache
from dlmpipe.samplers.base import Sampler

from .models import (BLOCK_FAMILIES, FAMILIES, MASK_ID, TINY_BLOCK, decode_method, random_prompt,
                     tiny_backbone)

SABER = {"name": "saber", "n": 2, "mu": 2}
LLADA_BLOCKS = {"name": "llada_confidence", "block_length": 8, "steps": 16}
THRESHOLD_ONE_BLOCK = {"name": "threshold", "tau": 0.3, "block_length": None}
SPA_EXACT = {"name": "spa", "rank": 16, "budget": "uniform", "rho": 1.0, "refresh_steps": 1}
# Dream's native sampler as the papers ran it: SPA-Cache/dLLM-Cache sampled (temperature 0.2,
# top_p 0.95, entropy), Archer/Saber deterministic; and its other confidences and draws
DREAM_SAMPLED = {"name": "dream", "alg": "entropy", "temperature": 0.2, "top_p": 0.95}
# (steps G / 2: every step unmasks >= 1 token; with steps G the first unmasks floor(0.999) = 0,
# and Archer K = 1 rightly reuses its snapshot of an unchanged state)
DREAM_GREEDY = {"name": "dream", "alg": "maskgit_plus", "steps": 8}
DREAM_MARGIN_DRAWN = {"name": "dream", "alg": "topk_margin", "alg_temp": 0.5, "top_k": 8}
DREAM_ORIGIN = {"name": "dream", "alg": "origin", "steps": 8}
# WINO on these 64-token models: several unmasks per step and re-masks (revisions), so its
# shadow rows (engine/shadow.py) decide tokens through every cache
WINO = {"name": "wino", "wide_in": 0.035, "narrow_out": 0.08, "block_length": 8}
# dInfer's decoders in blocks of 8 (thresholds low enough for several unmasks per step here)
DINFER_HIERARCHY = {"name": "dinfer_hierarchy", "block_length": 8, "threshold": 0.5,
                    "low_threshold": 0.1}
DINFER_CREDIT = {"name": "dinfer_credit", "block_length": 8, "threshold": 0.5}


def row(sampler: dict, cache: dict, **stats) -> tuple[dict, dict, dict]:
    """A cache at its degenerate setting under a sampler; ``stats`` it must also report."""
    return sampler, cache, stats


# id -> (sampler, cache at its degenerate setting, expected stats). The reference is the same
# sampler over full recompute; every forward of the degenerate setting is a full one.
DEGENERATE = {
    "archer-k1/saber": row(SABER, {"name": "archer", "K": 1}),
    "archer-k1/llada": row(LLADA_BLOCKS, {"name": "archer", "K": 1}),
    "fast_dllm_prefix/llada": row({"name": "llada_confidence"}, {"name": "fast_dllm_prefix", "refresh_interval": 1}),
    "fast_dllm_dual/llada": row({"name": "llada_confidence"}, {"name": "fast_dllm_dual", "refresh_interval": 1}),
    "fast_dllm_prefix/threshold": row(THRESHOLD_ONE_BLOCK, {"name": "fast_dllm_prefix", "refresh_interval": 1}),
    "fast_dllm_dual/threshold": row(THRESHOLD_ONE_BLOCK, {"name": "fast_dllm_dual", "refresh_interval": 1}),
    "dkv_decode/llada": row({"name": "llada_confidence", "block_length": 8},
                            {"name": "dkv_decode", "refresh_interval": 1}),
    "dkv_greedy/random_order": row({"name": "random_order", "block_length": 8},
                                {"name": "dkv_greedy", "refresh_interval": 1, "window": 2}),
    "dkv_greedy/factor": row({"name": "factor", "f": 1.0, "block_length": 8},
                             {"name": "dkv_greedy", "refresh_interval": 1}),
    "spa-sparse/llada": row(LLADA_BLOCKS, {**SPA_EXACT, "kv_update": "sparse"}, recompute_fraction=1.0),
    "spa-dense/llada": row(LLADA_BLOCKS, {**SPA_EXACT, "kv_update": "dense"}, recompute_fraction=1.0),
    "spa-value/saber": row(SABER, {**SPA_EXACT, "identifier": "value"}, recompute_fraction=1.0),
    "dllm_cache-rho0.25/llada": row(LLADA_BLOCKS, {"name": "dllm_cache", "K_p": 1, "K_r": 1, "rho": 0.25},
                                    recompute_fraction=1.0),
    # d2Cache: rollout_p 1 selects every row, so every forward after the first is full
    "d2cache-p1/llada": row(LLADA_BLOCKS, {"name": "d2cache", "rollout_p": 1.0, "current_k": 4}),
    "d2cache-p1-inflate/threshold": row({"name": "threshold", "tau": 0.5, "block_length": 8},
                                        {"name": "d2cache", "rollout_p": 1.0, "inflate_w": 4}),
    "dllm_cache-rho1/llada": row(LLADA_BLOCKS, {"name": "dllm_cache", "K_p": 1, "K_r": 1, "rho": 1.0},
                                 recompute_fraction=1.0),
    # under Dream's native sampler (no blocks: the block-serving caches serve the whole response)
    "archer-k1/dream": row(DREAM_GREEDY, {"name": "archer", "K": 1}),
    "fast_dllm_prefix/dream": row(DREAM_SAMPLED, {"name": "fast_dllm_prefix", "refresh_interval": 1}),
    "fast_dllm_dual/dream": row(DREAM_MARGIN_DRAWN, {"name": "fast_dllm_dual", "refresh_interval": 1}),
    "dkv_decode/dream": row(DREAM_ORIGIN, {"name": "dkv_decode", "refresh_interval": 1}),
    "dkv_greedy/dream": row(DREAM_MARGIN_DRAWN, {"name": "dkv_greedy", "refresh_interval": 1}),
    "spa-sparse/dream": row(DREAM_SAMPLED, {**SPA_EXACT, "kv_update": "sparse"}, recompute_fraction=1.0),
    "d2cache-p1/dream": row(DREAM_SAMPLED, {"name": "d2cache", "rollout_p": 1.0, "current_k": 2}),
    "dllm_cache-rho0.25/dream": row(DREAM_SAMPLED, {"name": "dllm_cache", "K_p": 1, "K_r": 1, "rho": 0.25},
                                    recompute_fraction=1.0),
    # under WINO: its shadow rows computed next to each cache's forward
    "archer-k1/wino": row(WINO, {"name": "archer", "K": 1}),
    "fast_dllm_prefix/wino": row(WINO, {"name": "fast_dllm_prefix", "refresh_interval": 1}),
    "fast_dllm_dual/wino": row(WINO, {"name": "fast_dllm_dual", "refresh_interval": 1}),
    "dkv_decode/wino": row(WINO, {"name": "dkv_decode", "refresh_interval": 1}),
    "dkv_greedy/wino": row(WINO, {"name": "dkv_greedy", "refresh_interval": 1}),
    "spa-sparse/wino": row(WINO, {**SPA_EXACT, "kv_update": "sparse"}, recompute_fraction=1.0),
    "dllm_cache-rho0.25/wino": row(WINO, {"name": "dllm_cache", "K_p": 1, "K_r": 1, "rho": 0.25},
                                   recompute_fraction=1.0),
    "d2cache-p1/wino": row(WINO, {"name": "d2cache", "rollout_p": 1.0, "current_k": 4}),
    # block-causal backbones only: Fast-dLLM v2's block + sub-block cache refreshes while a
    # sub-block's first position is masked, so sub-blocks of one position refresh every step
    "fast_dllm_v2-sub1/fast_dllm_v2": row({"name": "fast_dllm_v2", "sub_block_length": 1},
                                          {"name": "fast_dllm_v2"}),
    # dInfer's vicinity refresh: a window covering the sequence, a full forward every step, or a
    # warm-up longer than the decode are full recompute; under dInfer's decoders and others
    "dinfer_vicinity-all/dinfer_hierarchy": row(DINFER_HIERARCHY, {"name": "dinfer_vicinity",
                                                                   "prefix_look": 10**6,
                                                                   "after_look": 10**6}),
    "dinfer_vicinity-refresh1/dinfer_credit": row(DINFER_CREDIT, {"name": "dinfer_vicinity",
                                                                  "refresh_interval": 1}),
    "dinfer_vicinity-warmup/threshold": row({"name": "threshold", "tau": 0.5, "block_length": 8},
                                            {"name": "dinfer_vicinity", "warmup_steps": 10**6}),
    "dinfer_vicinity-all/llada": row(LLADA_BLOCKS, {"name": "dinfer_vicinity", "prefix_look": 10**6,
                                                    "after_look": 10**6, "warmup_steps": 0}),
    # dInfer's decoders read only their block's masked rows: the row caches serve them
    "fast_dllm_dual/dinfer_hierarchy": row(DINFER_HIERARCHY, {"name": "fast_dllm_dual",
                                                              "refresh_interval": 1}),
    "dkv_decode/dinfer_credit": row(DINFER_CREDIT, {"name": "dkv_decode", "refresh_interval": 1}),
}


def _needs_blocks(name: str) -> bool:
    sampler, cache, _ = DEGENERATE[name]
    return any(registry.lookup(kind, spec["name"]).needs_block_causal
               for kind, spec in (("sampler", sampler), ("cache", cache)))


#: on a block-causal backbone each active block is a response of its own (dlmpipe/blockwise.py):
#: Dream's schedule with as many steps as the block's positions unmasks nothing in its first
#: step (see DREAM_GREEDY), so that row takes 2 steps per block there
BLOCK_ROWS = {**DEGENERATE, "archer-k1/dream": row({**DREAM_GREEDY, "steps": 2}, {"name": "archer", "K": 1})}


#: the table's layers: 2 run every per-layer path of the caches (layer 0, which the selective
#: caches always compute whole, and a later one, which they serve; K/V or rows left stale at
#: either change the logits), as 4 did at twice the cost (issue 46)
TABLE_LAYERS = 2


#: the table's models, built once per process: (family, seed, device) -> model (no decode
#: changes a model: the references above are shared the same way)
_TABLE_MODELS: dict = {}


def table_model(family: str, seed: int, device: str | torch.device = "cpu"):
    """The table's models: MASK never given a probability (tests/models.py ``NeverMask``), so
    that every position of a response is decided holds by construction, on every device. Two
    layers (``TABLE_LAYERS``). Built once per (family, seed, device) and shared by the rows."""
    key = (family, seed, str(device))
    if key not in _TABLE_MODELS:
        _TABLE_MODELS[key] = tiny_backbone(family, seed=seed, n_layers=TABLE_LAYERS,
                                           never_mask=True).to(device)
    return _TABLE_MODELS[key]


#: full-recompute references, shared by the rows that decode the same sampler (a row's reference
#: does not depend on its cache): (family, model class, seed, n_layers, device, sampler, prompt) -> result
_REFERENCES: dict = {}


def reference(model, family: str, seed: int, sampler: dict, prompt: torch.Tensor, gen_len: int = 16):
    """``decode_method(model, sampler, none, prompt, gen_len, seed=seed)`` for the model
    ``family`` at ``seed`` (table_model or the block-causal rows' model): decoded once per
    session. A decode with a seeded generator is deterministic (the same bits each time), so a
    shared reference is the one each row would decode; the rows still decode their own cached
    runs."""
    key = (family, type(model).__name__, seed, model.cfg.n_layers, str(model.device),
           json.dumps(sampler, sort_keys=True),
           tuple(prompt.tolist()), gen_len)
    if key not in _REFERENCES:
        _REFERENCES[key] = decode_method(model, sampler, {"name": "none"}, prompt, gen_len, seed=seed)
    return _REFERENCES[key]


def block_gen(family: str) -> int:
    """The response length of the block-causal rows: two of the family's blocks (SDAR's tiny
    blocks of 4: 8; Fast-dLLM v2's of 8: 16). Each active block is a problem of its own for the
    cache (``cache.begin`` on the block, over the committed prefix's K/V: dlmpipe/blockwise.py),
    so a decode of two blocks runs every path one of four does: the prompt's tail block (prompt
    5), a whole block after a committed one, the cache begun again on a later block and the
    prefix extended (every SDAR decode of the table but the 4 of 234 that stop at their first
    block, at 16 as at 8). At 16 SDAR's decodes were 4-5 blocks, at twice the cost; with a
    row cache serving stale rows on later blocks or Fast-dLLM skipping a refresh, the same rows
    fail at 8 as at 16."""
    return 2 * TINY_BLOCK[family]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("name", [n for n in DEGENERATE if not _needs_blocks(n)])
def test_degenerate_setting_equals_full_recompute(family, name, device):
    """``device``: cpu, and cuda where available (tests/conftest.py; device_check runs it on cuda)."""
    sampler, cache, stats = DEGENERATE[name]
    for seed in (0, 1, 2):
        model = table_model(family, seed, device)
        for p_len in (5, 24):
            prompt = random_prompt(p_len, seed)
            ref = reference(model, family, seed, sampler, prompt)
            got = decode_method(model, sampler, cache, prompt, seed=seed)
            assert torch.equal(got.response, ref.response), (seed, p_len)
            for key in ("steps", "nfe", "revisions"):
                assert got.stats[key] == ref.stats[key], (key, seed, p_len)
            assert ref.stats["nfe"] == ref.stats["steps"]
            assert got.stats["cached_forwards"] == 0 and got.stats["refreshes"] == got.stats["nfe"] - 1
            assert (got.response != MASK_ID).all()
            assert {k: got.stats[k] for k in stats} == stats


def test_the_tables_premise_holds_on_every_random_stream():
    """No MASK left in a response (the table's premise) is the model's doing, not the CPU
    generator's luck: on cuda Dream's sampler draws from a generator of the device, another
    stream, and the plain tiny LLaDA model drew MASK from it in the sampled rows (4 of 76 on an
    H200); it does from these CPU streams too."""
    model = table_model("llada", seed=1)
    for stream in (0, 28, 37):
        out = decode_method(model, DREAM_SAMPLED, {"name": "none"}, random_prompt(24, 1), seed=stream)
        assert (out.response != MASK_ID).all(), stream


@pytest.mark.parametrize("family", BLOCK_FAMILIES)
@pytest.mark.parametrize("name", list(BLOCK_ROWS))
def test_degenerate_setting_equals_full_recompute_on_block_causal_backbones(family, name, device):
    """The same rows on SDAR- and Fast-dLLM-v2-shaped models: each cache on the active block over
    the exact prefix (dlmpipe/blockwise.py) at its degenerate setting equals recomputing the
    active block every step, token for token (tests/test_block_causal.py: which equals a forward
    over the whole sequence); every forward of a block is a full one. The table's models: a MASK
    picked would leave the state unchanged, which Archer K = 1 rightly serves from its snapshot."""
    sampler, cache, stats = BLOCK_ROWS[name]
    for seed in (0, 1, 2):
        model = table_model(family, seed, device)
        for p_len in (5, 24):
            prompt = random_prompt(p_len, seed)
            ref = reference(model, family, seed, sampler, prompt, block_gen(family))
            got = decode_method(model, sampler, cache, prompt, block_gen(family), seed=seed)
            assert torch.equal(got.response, ref.response), (seed, p_len)
            for key in ("steps", "nfe", "revisions", "block_forwards", "rows_computed"):
                assert got.stats[key] == ref.stats[key], (key, seed, p_len)
            assert got.stats["cached_forwards"] == 0
            assert {k: got.stats[k] for k in stats} == stats


def test_every_cache_has_a_degenerate_row():
    covered = {cache["name"] for _, cache, _ in DEGENERATE.values()}
    assert covered == set(registry.CACHES) - {"none"}


# ---- the registry is complete and every entry loads -----------------------------------------
def _classes(package, base) -> set[type]:
    """Concrete (not abstract) subclasses of ``base`` defined in the package's modules."""
    found = set()
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, base) and obj.__module__ == module.__name__ and not inspect.isabstract(obj):
                found.add(obj)
    return found


def test_every_sampler_and_cache_class_is_registered_and_every_entry_loads():
    registered = {c.load() for table in registry.KINDS.values() for c in table.values()}
    assert _classes(dlmpipe.samplers, Sampler) <= registered
    assert _classes(dlmpipe.engine, Cache) <= registered
    # constructor and registry declare the same parameters (and artifact keywords)
    assert [p for table in registry.KINDS.values() for c in table.values()
            if (p := c.constructor_problem())] == []


# ---- pairing: what the registry allows runs, what it refuses would read unserved rows -------
def _rows_read(sampler_rows: str, x: torch.Tensor, prompt_len: int, block, due) -> torch.Tensor:
    response = x[prompt_len:]
    rows = torch.zeros_like(response, dtype=torch.bool)
    if sampler_rows == "all_rows":
        rows[:] = True
        return rows
    rows[block[0]:block[1]] = True
    if sampler_rows == "masked_rows":
        rows &= response == MASK_ID
        if due is not None:
            rows &= torch.isin(torch.arange(rows.numel()), due)
    return rows


#: each sampler at its host-sync probe setting (its registry entry), these with settings that
#: accept more per step
SERVES_SAMPLERS = {n: e.host_sync[1] for n, e in registry.SAMPLERS.items()} | {
    "llada_confidence": {"block_length": 8}, "saber": {"block_length": 8},
    "threshold": {"block_length": 8}, "factor": {"block_length": 8},
    "random_order": {"block_length": 8}, "dream": {"alg": "entropy"},
    "certainty_prior": {"block_length": 8}, "pc_sampler": {"block_length": 8},
    "wino": {"block_length": 8},
    "eb_sampler": {"block_length": 8, "gamma": 0.5},
    "klass": {"block_length": 8, "conf_threshold": 0.5, "kl_threshold": 0.5},
    "sdar": {"temperature": 0.5}, "fast_dllm_v2": {"sub_block_length": 4},
    "dinfer_hierarchy": {"block_length": 8}, "dinfer_credit": {"block_length": 8}}


def _stale(attention: str) -> set[tuple[str, str]]:
    """The (sampler, cache) pairs whose cache leaves rows stale that the sampler reads (the
    rows each registry entry declares), of those the attention pattern allows."""
    return {(s, c) for s, se in registry.SAMPLERS.items() for c, ce in registry.CACHES.items()
            if not registry.serves(ce.rows, se.rows)
            and not registry.attention_problems({"sampler": {"name": s}, "cache": {"name": c}},
                                                attention)}


@pytest.mark.parametrize("family", FAMILIES + BLOCK_FAMILIES)
@pytest.mark.parametrize("c_name", list(registry.CACHES))
def test_every_allowed_pairing_serves_the_rows_its_sampler_reads(family, c_name):
    """For every sampler x cache the registry allows (one cache per case, every sampler), decode
    and check at every step that the rows the sampler reads hold finite logits; refused pairs are
    refused by check_pairing, and the releases' block loops by the backbone's attention pattern
    (on block-causal backbones the sampler and the cache see the active block). One case per
    cache: a new cache's contract run (tests/test_method_recipe.py) decodes its own pairings.
    G = 16; on a block-causal family two of its blocks (``block_gen``: SDAR's 8 positions after
    the 9-token prompt are 3 active blocks, the later two begun without prompt rows)."""
    from dlmpipe.decode import decode
    from dlmpipe.methods import build_cache, build_method, build_sampler, check_pairing

    model = tiny_backbone(family, seed=3, n_layers=2)  # every per-layer path (TABLE_LAYERS)
    prompt = random_prompt(9, 3)
    refused = set()
    attention = "block_causal" if family in BLOCK_FAMILIES else "full"
    for s_name, s_params in SERVES_SAMPLERS.items():
        method = {"sampler": {"name": s_name}, "cache": {"name": c_name}}
        if registry.attention_problems(method, attention):
            assert "decodes a block-causal backbone's blocks" in registry.attention_problems(
                method, attention)[0]
            with pytest.raises(ValueError):  # (the pairing's problem, else this one)
                build_method(method, model)
            continue
        if registry.pairing_problem(s_name, c_name):
            with pytest.raises(ValueError, match=f"cache '{c_name}' (gives fresh logits only "
                                                 f"for .*|does not compute shadow rows); "
                                                 f"sampler '{s_name}' reads"):
                check_pairing(s_name, c_name)
            refused.add((s_name, c_name))
            continue
        sampler = build_sampler({"name": s_name, **s_params})
        # (no SPA-Cache profile is known for the block-causal families: name one)
        spa = {"rank": 8, **({"profile": "llada-8b-instruct"} if attention != "full" else {})}
        cache = build_cache({"name": c_name, **(spa if c_name == "spa" else {})}, model)
        reads = registry.SAMPLERS[s_name].rows
        inner = cache.response_logits

        def checked(x, block, inner=inner, reads=reads, sampler=sampler):
            logits = inner(x, block)
            rows = _rows_read(reads, x, sampler.prompt_len, block, sampler.due_positions())
            assert torch.isfinite(logits[:rows.numel()][rows]).all(), (s_name, c_name)
            shadow = sampler.shadow_block()  # its verification rows follow the response's
            assert logits.shape[0] == rows.numel() + (0 if shadow is None else shadow[1] - shadow[0])
            assert torch.isfinite(logits[rows.numel():]).all(), (s_name, c_name)
            return logits

        cache.response_logits = checked
        gen = block_gen(family) if family in BLOCK_FAMILIES else 16
        out = decode(model, sampler, cache, prompt, gen, torch.Generator().manual_seed(0))
        if family in FAMILIES:  # a block-causal decode stops after a block with a stop token
            assert (out.response != MASK_ID).all(), (s_name, c_name)
    # only the caches that leave rows stale refuse a sampler (rollback re-scores every response
    # row, KLASS's KL history covers positions before their block starts, SDAR reads its whole
    # active block): the rows each entry declares, so a new method is covered as it is declared.
    # WINO reads shadow rows (its verification queries): every cache computes them next to its
    # forward (engine/shadow.py), over the K/V its own rows attend to, so none refuses it; a
    # cache without them would be refused (registry shadow_rows; tests/test_wino.py)
    stale = _stale(attention)
    assert ("saber", "fast_dllm_dual") in stale and ("klass", "d2cache") in stale
    assert refused == {(s, c) for s, c in stale if c == c_name}


def test_every_method_states_what_it_means_on_block_causal_backbones():
    """docs/METHODS.md, "Block-causal backbones": each sampler and cache says what it does on the
    active block, or why it is refused there."""
    for table in registry.KINDS.values():
        for c in table.values():
            assert c.on_block_causal or c.block_causal_refusal, c.name
