"""SPA-Cache (docs/METHODS.md §2.3): the selective step, exactness over a stale prompt, the
singular proxies and their file, the layer budget rho(l), and the svd rule in the workflow."""
from __future__ import annotations

import json
import math
import re

import pytest
import torch
import torch.nn.functional as F
import yaml

from dlmpipe.engine.proxies import load_proxies, proxies_from_model
from dlmpipe.engine.spa_profiles import PROFILES, layer_budgets, split_gaussian
from dlmpipe.methods import build_cache

from .models import FAMILIES, MASK_ID, decode_method, random_prompt, tiny_backbone
from .workflow import CONFIGS, fake_finished_run, scheduled

SAMPLER = {"name": "llada_confidence", "block_length": 8, "steps": 16}


def _run(model, cache: dict, prompt, sampler=SAMPLER, gen_len=16):
    return decode_method(model, sampler, cache, prompt, gen_len)


def _spa(**params) -> dict:
    return {"name": "spa", "rank": 16, **params}


# ---- exactness (budget 1 with a refresh every step: tests/test_exactness.py) -------------------
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("kv_update", ["sparse", "dense"])
def test_budget_one_over_a_stale_prompt_equals_archer_k_inf(family, kv_update):
    """Budget 1 at every layer with no periodic refresh is the selective path recomputing every
    response row over the step-0 prompt K/V: Archer K=inf exactly (the same stale prompt)."""
    model = tiny_backbone(family, seed=2, n_layers=4)
    prompt = random_prompt(20, 2)
    archer = _run(model, {"name": "archer", "K": "inf"}, prompt)
    got = _run(model, _spa(budget="uniform", rho=1.0, refresh_steps=None, refresh_gen_steps=None,
                           kv_update=kv_update), prompt)
    assert torch.equal(got.response, archer.response)
    assert got.stats["cached_forwards"] == archer.stats["cached_forwards"] == 15


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("identifier", ["singular", "value", "query", "key", "attn_input", "attn_output"])
def test_unchanged_sequence_at_any_budget_gives_the_full_forward_logits(family, identifier):
    """Cached deltas are exact for rows whose inputs did not change, whatever is selected."""
    model = tiny_backbone(family, seed=3, n_layers=4)
    prompt = random_prompt(20, 3)
    x = torch.cat([prompt, torch.full((12,), MASK_ID)])
    x[24], x[29] = 5, 7
    reference = model.shift(model(x[None]))[0, 20:]
    for budget in ({"budget": "uniform", "rho": 0.0}, {"budget": "uniform", "rho": 0.3}, {"budget": "adaptive"}):
        cache = build_cache({"name": "spa", "identifier": identifier, "rank": 8, "refresh_steps": None,
                             "refresh_gen_steps": None, **budget}, model)
        cache.begin(x, 20)
        torch.testing.assert_close(cache.response_logits(x, (0, 12)), reference, rtol=0, atol=0)
        for _ in range(2):
            torch.testing.assert_close(cache.response_logits(x, (0, 12)), reference, rtol=1e-5, atol=1e-5)
        assert cache.stats.cached_forwards == 2


@pytest.mark.parametrize("family", FAMILIES)
def test_a_sparse_step_recomputes_the_budget_and_never_the_prompt(family):
    model = tiny_backbone(family, seed=4, n_layers=4)
    P, G = 20, 16
    x = torch.cat([random_prompt(P, 4), torch.full((G,), MASK_ID)])
    cache = build_cache({"name": "spa", "rank": 16, "budget": "uniform", "rho": 0.25, "refresh_steps": None,
                         "refresh_gen_steps": None}, model)
    cache.begin(x, P)
    cache.response_logits(x, (0, G))
    f = model.first_logit_row(P)
    keys, values, delta = cache.kv.keys.clone(), cache.kv.values.clone(), cache.delta
    pointers = (cache.kv.keys.data_ptr(), cache.kv.values.data_ptr(), delta.data_ptr())
    x[P + 3], x[P + 9] = 5, 6
    cache.response_logits(x, (0, G))
    assert (cache.kv.keys.data_ptr(), cache.kv.values.data_ptr(), cache.delta.data_ptr()) == pointers  # in place
    # prompt K/V are never selectively updated (Dream's last prompt row is a response logit row)
    assert torch.equal(cache.kv.keys[:, :, :, :f], keys[:, :, :, :f])
    assert torch.equal(cache.kv.values[:, :, :, :f], values[:, :, :, :f])
    # layer 0 dense; layers >= 1: int(0.25 * 16) = 4 rows (+ Dream's forced last prompt row)
    forced = P - f
    assert cache.budgets == [G + forced] + [4 + forced] * 3
    changed = (cache.kv.keys[1:, 0, 0, f:] != keys[1:, 0, 0, f:]).any(-1).sum(-1)  # rows per layer
    assert changed.tolist() == [4 + forced] * 3
    per_layer = cache.extra_stats()["recompute_fraction_per_layer"]
    R = G + forced
    assert per_layer == pytest.approx([1.0] + [(R + 4 + forced) / (2 * R)] * 3, abs=1e-6)


def test_dense_kv_update_rewrites_every_response_row():
    model = tiny_backbone("llada", seed=5, n_layers=3)
    P, G = 12, 8
    x = torch.cat([random_prompt(P, 5), torch.full((G,), MASK_ID)])
    cache = build_cache({"name": "spa", "rank": 8, "budget": "uniform", "rho": 0.25, "kv_update": "dense",
                         "refresh_steps": None, "refresh_gen_steps": None}, model)
    cache.begin(x, P)
    cache.response_logits(x, (0, G))
    before = cache.kv.keys.clone()
    x[P + 1] = 9
    cache.response_logits(x, (0, G))
    changed = (cache.kv.keys[1:, 0, 0, P:] != before[1:, 0, 0, P:]).any(-1).sum(-1)
    assert changed.tolist() == [G, G]
    assert torch.equal(cache.kv.keys[:, :, :, :P], before[:, :, :, :P])


def test_refresh_schedule_and_stats():
    model = tiny_backbone("llada", seed=6, n_layers=3)
    r = _run(model, _spa(rank=8, refresh_steps=6, refresh_gen_steps=4), random_prompt(10, 6))
    # steps 0..15: full at 0, 6, 12; response-only at 4, 8; the rest sparse
    assert r.stats["nfe"] == 16 and r.stats["refreshes"] == 2
    assert r.stats["response_refreshes"] == 2 and r.stats["cached_forwards"] == 13
    assert len(r.stats["recompute_fraction_per_layer"]) == 3
    assert r.stats["recompute_fraction_per_layer"][0] == 1.0
    assert 0 < r.stats["recompute_fraction"] < 1


def test_rollback_sampler_is_served():
    """Every response row has a hidden state, so Saber (reads all rows) pairs with SPA-Cache."""
    model = tiny_backbone("dream", seed=7, n_layers=3)
    r = _run(model, _spa(rank=8), random_prompt(10, 7), sampler={"name": "saber"})
    assert (r.response != MASK_ID).all()


# ---- singular proxies -----------------------------------------------------------------------------
@pytest.mark.parametrize("family", FAMILIES)
def test_full_rank_singular_proxy_ranks_tokens_like_the_value_vectors(family):
    """A has orthonormal columns, so cos(W h1, W h2) = cos(S B^T h1, S B^T h2) at full rank: the
    same cosine similarities (bias-free values), hence the same order and the same selections."""
    model = tiny_backbone(family, seed=8, n_layers=2, d_model=64)
    prox = proxies_from_model(model)
    g = torch.Generator().manual_seed(0)
    for layer, blk in enumerate(model.blocks):
        w = blk.v_proj.weight
        h1 = torch.randn(40, 64, generator=g)
        h2 = h1 + 0.5 * torch.randn(40, 64, generator=g) * torch.rand(40, 1, generator=g)
        p = prox.projection(layer, prox.stored_rank)
        by_value = F.cosine_similarity(h1 @ w.T, h2 @ w.T, dim=-1)
        by_proxy = F.cosine_similarity(h1 @ p.T, h2 @ p.T, dim=-1)
        torch.testing.assert_close(by_proxy, by_value, rtol=0, atol=1e-5)
        assert torch.equal(by_proxy.argsort(), by_value.argsort())
    # and the cache makes the same decisions with either identifier (LLaDA: no value bias)
    if family == "llada":
        prompt = random_prompt(20, 8)
        a = _run(model, _spa(rank=64, refresh_steps=None), prompt)
        b = _run(model, _spa(identifier="value", refresh_steps=None), prompt)
        assert torch.equal(a.response, b.response)


def test_rank_larger_than_stored_is_a_clear_error(tmp_path):
    model = tiny_backbone("dream", seed=9, d_model=64, n_heads=4, n_kv_heads=2)  # n_kv*hd = 32
    with pytest.raises(ValueError, match=r"proxy rank 33 exceeds the rank 32 stored in .*choose rank <= 32"):
        build_cache({"name": "spa", "rank": 33}, model)
    build_cache({"name": "spa", "rank": 32}, model)  # full rank is fine


def test_svd_job_writes_a_file_that_reconstructs_the_value_projection(tmp_path, capsys):
    from dlmpipe.backbones.loading import load_backbone
    from dlmpipe.backbones.manifest import write_manifest
    from dlmpipe.cli import main
    from tests.checkpoints import make_tiny_checkpoint

    ckpt = make_tiny_checkpoint(tmp_path / "ckpt", "dream", n_layers=2)
    man = write_manifest(ckpt, tmp_path / "manifest.json", name="tiny")
    out = tmp_path / "proxies.safetensors"
    assert main(["svd", "--manifest", str(tmp_path / "manifest.json"), "--out", str(out)]) == 0
    prox = load_proxies(out, fingerprint=man["fingerprint"])
    assert prox.metadata["backbone"] == "tiny" and prox.metadata["fingerprint"] == man["fingerprint"]
    model = load_backbone(ckpt, with_tokenizer=False).model
    for i, blk in enumerate(model.blocks):
        w = blk.v_proj.weight  # [n_kv*hd, d]: W^T W = B S^2 B^T
        sbt = prox.projection(i, prox.stored_rank)
        assert sbt.dtype == torch.float32 and sbt.shape == (w.shape[0], w.shape[1])
        torch.testing.assert_close(sbt.T @ sbt, w.T @ w, rtol=1e-4, atol=1e-5)
        assert (prox.singular_values[i][:-1] >= prox.singular_values[i][1:]).all()
    assert prox.projection(0, 4).shape == (4, w.shape[1])  # rank chosen at load time
    with pytest.raises(ValueError, match="exceeds the rank"):
        prox.projection(0, prox.stored_rank + 1)

    # the workflow's form: from the checkpoint directory, beside prepare-backbone (no manifest);
    # the same file, down to the fingerprint a generate job checks against the manifest's
    direct = tmp_path / "direct.safetensors"
    assert main(["svd", "--path", str(ckpt), "--name", "tiny", "--sha256", "null",
                 "--out", str(direct)]) == 0
    again = load_proxies(direct, fingerprint=man["fingerprint"])
    recorded = {k: v for k, v in again.metadata.items() if k != "source"}  # source: the file
    assert recorded == {k: v for k, v in prox.metadata.items() if k != "source"}
    assert recorded["family"] == man["family"]
    for i in range(len(model.blocks)):
        assert torch.equal(again.singular_values[i], prox.singular_values[i])
        assert torch.equal(again.projection(i, again.stored_rank), prox.projection(i, prox.stored_rank))
    # the pinned hashes are checked, as by every loader: a clear error, no file
    bad = tmp_path / "bad.safetensors"
    assert main(["svd", "--path", str(ckpt), "--name", "tiny", "--sha256",
                 json.dumps({f.name: "0" * 64 for f in ckpt.glob("*.safetensors")}),
                 "--out", str(bad)]) == 2
    assert "sha256 mismatch" in capsys.readouterr().err and not bad.exists()
    with pytest.raises(ValueError, match="fingerprint"):
        load_proxies(out, fingerprint="0123")
    # the cache reads the file; a rank beyond it fails when the job builds the method
    build_cache({"name": "spa", "rank": 8}, model, artifacts={"proxies": str(out)})
    with pytest.raises(ValueError, match="exceeds the rank"):
        build_cache({"name": "spa", "rank": prox.stored_rank + 1}, model, artifacts={"proxies": str(out)})


# ---- the layer budget rho(l) -------------------------------------------------------------------------
def _reference_rho(t, m, rho_p, rho_1, rho_L):
    sigma2 = (m ** 2 / (2 * math.log(rho_p / rho_1)) if t < m
              else (1 - m) ** 2 / (2 * math.log(rho_p / rho_L)))
    return rho_p * math.exp(-(t - m) ** 2 / (2 * sigma2))


def test_llada_8b_profile_peaks_at_three_quarters_with_the_reference_ends():
    c = PROFILES["llada-8b-instruct"]
    assert (c["m"], c["rho_p"], c["rho_1"], c["rho_L"]) == (0.75, 0.25, 0.03, 0.13)
    f = lambda t: split_gaussian(t, **c)  # noqa: E731
    assert f(0.75) == pytest.approx(0.25) and f(0.0) == pytest.approx(0.03) and f(1.0) == pytest.approx(0.13)
    rho = layer_budgets(32, "llada-8b-instruct")
    assert max(rho) == pytest.approx(0.25) and rho.index(max(rho)) == 24  # t = 24/32
    assert rho[0] == pytest.approx(0.03)
    for i, r in enumerate(rho):
        assert r == pytest.approx(_reference_rho(i / 32, 0.75, 0.25, 0.03, 0.13), rel=1e-12)


def test_other_profiles_floor_scale_and_peak():
    assert layer_budgets(10, "llada-1.5").index(0.25) == 8  # m = 0.8
    dream = PROFILES["dream-7b"]
    assert (dream["m"], dream["rho_p"]) == (0.5, 0.25)
    assert dream["rho_1"] == pytest.approx(0.05 / 1.2) and dream["rho_L"] == pytest.approx(0.25 / 1.2)
    d = layer_budgets(28, "dream-7b")
    assert d[14] == pytest.approx(0.25) and d[0] == pytest.approx(0.05 / 1.2)
    plain, floored = layer_budgets(32, "llada-8b-instruct"), layer_budgets(32, "llada-8b-instruct", left_floor=0.0625)
    for i, (a, b) in enumerate(zip(plain, floored)):
        assert b == (max(a, 0.0625) if i / 32 < 0.75 else a)
    assert floored[0] == 0.0625
    doubled = layer_budgets(32, "llada-8b-instruct", scale=2.0)
    assert doubled == pytest.approx([2 * r for r in plain])
    assert layer_budgets(32, "llada-8b-instruct", rho_p=0.5) == pytest.approx(doubled)
    assert max(layer_budgets(32, "llada-8b-instruct", scale=10.0)) == 1.0  # clipped
    for t in (0.0, 0.3, 0.75, 0.9):  # the formula, checked independently
        assert split_gaussian(t, 0.75, 0.25, 0.03, 0.13) == pytest.approx(_reference_rho(t, 0.75, 0.25, 0.03, 0.13))


def test_cache_budgets_follow_the_profile():
    model = tiny_backbone("llada", seed=10, n_layers=4)
    cache = build_cache({"name": "spa", "rank": 8}, model)
    cache.begin(torch.cat([random_prompt(8, 0), torch.full((100,), MASK_ID)]), 8)
    rho = layer_budgets(4, "llada-8b-instruct")
    assert cache.budgets == [100] + [int(r * 100 + 1e-9) for r in rho[1:]]


def test_bad_parameters_are_rejected():
    model = tiny_backbone("llada", seed=11)
    for kwargs, msg in (({"identifier": "values"}, "identifier"), ({"kv_update": "values"}, "kv_update"),
                        ({"budget": "gaussian"}, "budget"), ({"profile": "llama"}, "profile"),
                        ({"rho": 1.5}, "rho"), ({"refresh_steps": 0}, "refresh_steps")):
        with pytest.raises(ValueError, match=msg):
            build_cache({"name": "spa", "rank": 8, **kwargs}, model)


# ---- the svd rule in the workflow ------------------------------------------------------------------
def _spa_campaign(tmp_path, write_config, name="spa.yaml", **spa_cache):
    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    config["methods"]["spa"] = {"sampler": {"name": "llada_confidence"},
                                "cache": {"name": "spa", "rank": 16, **spa_cache}}
    config["methods"]["spa-value"] = {"sampler": {"name": "llada_confidence"},
                                      "cache": {"name": "spa", "identifier": "value"}}
    return write_config(config, tmp_path / name), config


def _jobs(stdout: str) -> set[tuple]:
    """(rule, method) of every job a dry run scheduled."""
    return {(rule, method) for rule, _, _, method in scheduled(stdout)}


def test_svd_rule_runs_once_per_backbone_and_not_for_spa_parameter_changes(tmp_path, warm_snakemake,
                                                                            write_config):
    from concurrent.futures import ThreadPoolExecutor

    path, config = _spa_campaign(tmp_path, write_config)
    dry = warm_snakemake(tmp_path, "-n", "-p", configfile=path).stdout
    assert re.search(r"^svd\s+1\s*$", dry, re.M)
    # only the singular-proxy method's generate jobs read the proxies file
    with_proxies = re.findall(r"--method '(\{.*?\})'.*--proxies=(\S*)", dry)
    by_method = {yaml.safe_load(m)["name"]: p for m, p in with_proxies}
    assert by_method.pop("spa") == "results/backbones/toy/proxies.safetensors"
    assert set(by_method.values()) == {""}

    fake_finished_run(tmp_path, path, snakemake=warm_snakemake)

    changes = {"rank": {"rank": 8},
               "budget": {"budget": "uniform", "rho": 0.5, "kv_update": "dense", "refresh_steps": 4}}

    def rerun(name):
        if name == "backbone":  # retraining the toy changes the backbone: the SVD reruns
            _, changed = _spa_campaign(tmp_path, write_config)
            changed["backbones"]["toy"]["toy"]["steps"] += 1
            changed = write_config(changed, tmp_path / "b.yaml")
            return _jobs(warm_snakemake(tmp_path, "-n", configfile=changed).stdout)
        changed, _ = _spa_campaign(tmp_path, write_config, f"{name}.yaml", **changes[name])
        return _jobs(warm_snakemake(tmp_path, "-n", configfile=changed).stdout)

    with ThreadPoolExecutor(max_workers=3) as pool:
        results = dict(zip([*changes, "backbone"], pool.map(rerun, [*changes, "backbone"])))
    # the SPA method's decoding and timing only
    spa_only = {("generate", "spa"), ("score", "spa"), ("time_method", "spa"), ("summarize", None),
                ("plot", None), ("plot_sweeps", None), ("tables", None)}
    assert results["rank"] == results["budget"] == spa_only
    assert ("svd", None) in results["backbone"] and ("generate", "spa-value") in results["backbone"]


def test_summary_reports_the_mean_recompute_fraction():
    import json

    import pandas as pd

    from dlmpipe.analysis.summary import summary_table

    def rows(method, fractions):
        return [{"backbone": "toy", "task": "t", "method": method, "sample_index": i, "score": 1.0,
                 "job_time_s": 1.0, "nfe": 4, "steps": 4, "refreshes": 0, "cached_forwards": 3, "revisions": 0,
                 "stats": json.dumps({"nfe": 4} if f is None else {"recompute_fraction": f})}
                for i, f in enumerate(fractions)]

    table = summary_table(pd.DataFrame(rows("ref", [None, None]) + rows("spa", [0.25, 0.5])), "ref")
    got = dict(zip(table["method"], table["mean_recompute_fraction"]))
    assert got["spa"] == pytest.approx(0.375) and math.isnan(got["ref"])
