"""The papers' campaigns, configs/archer.yaml and configs/spa.yaml: dry runs on tiny checkpoints
of the real formats plan every job of the campaign (counts derived from the config), with the
paper's settings reaching the jobs, and every paper table resolving to methods that run."""
from __future__ import annotations

import copy
import json
import re

import pandas as pd
import pytest
import yaml

from dlmpipe.analysis.table_spec import reported_cells, table_rows, tolerance_for
from dlmpipe.analysis.tables import write_tables
from dlmpipe.campaign import Campaign

from .checkpoints import BLOCK_FAMILIES, block_checkpoint, make_tiny_checkpoint
from .models import decode_method, random_prompt, tiny_backbone
from .workflow import REPO, expected_counts, job_blocks, job_counts, scheduled

# backbone name in the configs -> (family, the checkpoint's directory name, as downloaded)
CHECKPOINTS = {"llada-8b-instruct": ("llada", "LLaDA-8B-Instruct"),
               "dream-v0-instruct-7b": ("dream", "Dream-v0-Instruct-7B"),
               "diffucoder-7b-cpgrpo": ("diffucoder", "DiffuCoder-7B-cpGRPO"),
               "sdar-8b-chat": ("sdar", "SDAR-8B-Chat"),
               "fast-dllm-v2-7b": ("fast_dllm_v2", "Fast_dLLM_v2_7B")}


# The campaign checks each SPA-Cache rank against the checkpoint's value projection (rank
# min(n_kv_heads * head_dim, d_model): 4096 on LLaDA-8B, 512 on Dream-7B); the stand-ins are as
# wide as the configs' ranks reach (Table 5's 512 on LLaDA, 128 on Dream: 2 kv heads of 64; the
# block-diffusion ones 128 too: SDAR's 2 kv heads of 128, Fast-dLLM v2's of 64), with the real
# checkpoints' blocks (SDAR 4, Fast-dLLM v2 32)
WIDTHS = {"llada": {"d_model": 512}, "dream": {"d_model": 256}, "diffucoder": {},
          "sdar": {"d_model": 256, "block_size": 4}, "fast_dllm_v2": {"d_model": 256, "block_size": 32}}


@pytest.fixture(autouse=True)
def benchmark_data(monkeypatch):
    """The papers' benchmarks not in ../shared/data are found in the release-format fixtures
    (tests/data), as a user's $DLMPIPE_DATA_DIR: the campaign checks every data file."""
    from dlmpipe.tasks.sources import DATA_ENV

    monkeypatch.setenv(DATA_ENV, str(REPO / "tests" / "data"))


def paper_campaign(name: str, tmp_path, write_config):
    """The paper's config with each backbone's path on a tiny checkpoint of its format."""
    config = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    for backbone, spec in config["backbones"].items():
        family, directory = CHECKPOINTS[backbone]
        make = block_checkpoint if family in BLOCK_FAMILIES else make_tiny_checkpoint
        spec["path"] = str(make(tmp_path / "models" / directory, family, **WIDTHS[family]))
    path = write_config(config, tmp_path / f"{name}.yaml")
    return Campaign(copy.deepcopy(config)), path


def dry_run(tmp_path, snakemake, campaign, path) -> dict[tuple, dict]:
    """Plan the campaign: every job of every rule is planned, generate jobs ask for a GPU, each
    table's files are outputs. Returns the method each generate job decodes with, as its
    command line carries it: (backbone, task, method name) -> method."""
    proc = snakemake(tmp_path, "-n", "-p", configfile=path)
    counts = job_counts(proc.stdout)
    assert counts == {k: v for k, v in expected_counts(campaign).items() if v}
    want = {(rule, b, t, m) for rule in ("generate", "score") for b, t, m in campaign.decoding_jobs()}
    assert {j for j in scheduled(proc.stdout) if j[0] in ("generate", "score")} == want
    for rule, body in job_blocks(proc.stdout):
        if rule == "generate":
            assert re.search(r"resources: .*\bgpu=1\b", body)
    results = campaign.config["results_dir"]
    for table in campaign.config["tables"]:
        for suffix in ("csv", "md", "html"):
            assert f"{results}/tables/{table}.{suffix}" in proc.stdout
    planned = {(b, t, json.loads(m)["name"]): json.loads(m) for b, t, m in re.findall(
        r"--manifest \S*backbones/([^/]+)/manifest\.json --task-file \S*tasks/(\w+)\.parquet "
        r"--method '(\{.*?\})'", proc.stdout)}
    assert len(planned) == counts["generate"]
    return planned


def every_row_runs(campaign: Campaign) -> None:
    """Each paper table's every cell is decoded: its method runs on the cell's backbone and
    task (a method's backbones:/tasks: leave no hole in the paper's tables)."""
    for name, spec in campaign.config["tables"].items():
        rows = table_rows(spec, campaign.origin, campaign.backbones, campaign.tasks)
        assert rows, name
        for row in rows:
            for (b, t), m in row.methods.items():
                assert m in campaign.methods and campaign.runs(m, b, t), (name, row.label, b, t)


def test_archer_campaign_plans_the_papers_jobs(tmp_path, warm_snakemake, write_config):
    campaign, path = paper_campaign("archer", tmp_path, write_config)
    planned = dry_run(tmp_path, warm_snakemake, campaign, path)
    every_row_runs(campaign)
    # App. G.1: MBPP and HumanEval with their ET suites, LiveCodeBench
    assert {t: campaign.benchmark(t) for t in campaign.tasks} == {
        "mbpp": "mbpp_et", "livecodebench": "livecodebench", "humaneval": "humaneval_et"}
    for (b, t, name), method in planned.items():
        sampler = method["sampler"]
        # App. G.4: temperature 0, generation length 256 and block length 256 for every method
        assert method["gen_length"] == 256 and sampler["temperature"] == 0, name
        assert sampler["block_length"] == 256, name
        if sampler["name"] == "saber":
            assert (sampler["n"], sampler["mu"]) == (2, 2), name
    # dLLM-Cache's released settings per benchmark reach each job; the baselines and the
    # no-rollback control run only on LLaDA-8B-Instruct (Tables 1, 5, 6)
    for t in campaign.tasks:
        cache = planned[("llada-8b-instruct", t, "dllm-cache")]["cache"]
        assert (cache["K_p"], cache["K_r"]) == ((100, 5) if t == "mbpp" else (50, 8))
    assert {b for (b, t, n) in planned if n in ("dllm-cache", "dkv-greedy", "no-rollback")} == {
        "llada-8b-instruct"}
    assert {b for (b, t, n) in planned if n in ("llada-confidence", "saber")} == set(campaign.backbones)
    # every operating point of Tables 1 and 2 and the radius sweep's ends decode on every backbone
    for b in campaign.backbones:
        ks = {m["cache"]["K"] for (bb, t, n), m in planned.items() if bb == b and n.startswith("archer-")}
        assert {1, 8, 9, 10, 11, 15, 17, "inf"} <= ks
    greedy = planned[("llada-8b-instruct", "mbpp", "dkv-greedy")]["sampler"]
    assert greedy["order_seed"] == 42                                              # App. G.2
    factor = planned[("llada-8b-instruct", "mbpp", "fast-dllm-parallel")]["sampler"]
    assert (factor["name"], factor["f"], factor["rule"]) == ("factor", 1.0, "released")
    assert campaign.config["reference_method"] == "llada-confidence"              # App. G.3
    assert "saber" in campaign.config["also_speedup_against"]


def test_spa_campaign_plans_the_papers_jobs(tmp_path, warm_snakemake, write_config):
    campaign, path = paper_campaign("spa", tmp_path, write_config)
    planned = dry_run(tmp_path, warm_snakemake, campaign, path)
    every_row_runs(campaign)
    # §4.1: the seven benchmarks
    assert {campaign.benchmark(t) for t in campaign.tasks} == {
        "gsm8k", "math500", "gpqa_main", "bbh", "mmlu_pro", "mbpp", "humaneval"}
    llada, dream = "llada-8b-instruct", "dream-v0-instruct-7b"
    profile = {llada: "llada-8b-instruct", dream: "dream-7b"}
    for t in campaign.tasks:
        for b, name in ((llada, "spa"), (llada, "spa-parallel"), (dream, "dream-spa")):
            # §4.1 rho_p 0.25, §4.4 r = 128, each backbone's own rho(l) constants
            cache = planned[(b, t, name)]["cache"]
            assert (cache["rank"], cache["rho_p"], cache["budget"]) == (128, 0.25, "adaptive")
            assert cache["profile"] == profile[b]
        for b in campaign.backbones:  # the reference runs everywhere
            assert planned[(b, t, "vanilla")]["sampler"]["block_length"] == 32
        sampler = planned[(dream, t, "dream-vanilla")]["sampler"]  # as SPA-Cache's code ran Dream
        assert (sampler["name"], sampler["alg"], sampler["temperature"], sampler["top_p"]) == (
            "dream", "entropy", 0.2, 0.95)
        cache = planned[(llada, t, "dllm-cache")]["cache"]
        assert (cache["K_p"], cache["K_r"]) == {"mbpp": (100, 5), "humaneval": (50, 8)}.get(t, (50, 7))
    # each method where the paper reports it: LLaDA's rows on LLaDA, Dream's on Dream, the
    # ablations on LLaDA / GSM8K (§4.4)
    where = {}
    for b, t, n in planned:
        where.setdefault(campaign.origin[n], set()).add((b, t))
    assert where["dream-spa"] == {(dream, t) for t in campaign.tasks}
    assert where["spa"] == where["fast-dllm-parallel"] == {(llada, t) for t in campaign.tasks}
    assert where["spa-rank"] == where["spa-identifier"] == {(llada, "gsm8k")}
    # the ablations: Table 1's identifiers, Table 5's ranks, Table 4's uniform 16%
    sweeps = campaign.sweeps()
    assert [v for (v,) in sweeps["spa-identifier"]["points"].values()] == [
        "query", "key", "value", "attn_input", "attn_output"]
    assert [v for (v,) in sweeps["spa-rank"]["points"].values()] == [512, 256, 128, 64, 32]
    assert campaign.methods["spa-r128-uniform-rho0.16"]["cache"]["rho"] == 0.16


def test_the_no_rollback_control_never_revises():
    """Archer's zero-revision control (configs/archer.yaml no-rollback): Saber's acceptance with
    re-masking off revises nothing, where Saber itself does."""
    model, prompt = tiny_backbone(), random_prompt(6, 3)
    control = decode_method(model, {"name": "saber", "max_steps_per_block": 1}, {"name": "none"}, prompt)
    saber = decode_method(model, {"name": "saber"}, {"name": "none"}, prompt)
    assert control.stats["revisions"] == control.stats["remasked"] == 0
    assert saber.stats["remasked"] > 0


def stand_in_summary(campaign: Campaign) -> pd.DataFrame:
    """A summary of a tiny stand-in run: every decoded (backbone, task, method) Pass@1 30%
    (base and extended tests), 8 s per sample, 2.5x over the reference, 1.4x over every other
    speedup reference, 100 tokens per second (the reference: 20), 25 ms to the first token."""
    reference = campaign.config["reference_method"]
    rows = []
    for b, t, m in campaign.decoding_jobs():
        rows.append({"backbone": b, "task": t, "method": m, "quality": 0.3, "quality_plus": 0.3,
                     "quality_se": 0.02, "n": 100, "latency_s": 8.0, "reference": reference,
                     "speedup": 2.5, "tps": 20.0 if m in ("vanilla", "dream-vanilla") else 100.0,
                     "ttft_s": 0.025, "fingerprint_warning": "",
                     **{f"speedup_vs_{o}": 1.4 for o in campaign.config["also_speedup_against"]}})
    return pd.DataFrame(rows)


@pytest.mark.parametrize("name", ["archer", "spa"])
def test_paper_tables_print_measured_beside_reported(name, tmp_path, write_config):
    """Every reported cell of the paper's tables reaches the stand-in run's tables, with the
    difference measured - reported and a flag exactly where it exceeds the tolerance."""
    campaign, _ = paper_campaign(name, tmp_path, write_config)
    summary = tmp_path / "summary.parquet"
    stand_in_summary(campaign).to_parquet(summary)
    tables = campaign.config["tables"]
    write_tables(summary, tables, campaign.origin, campaign.backbones, campaign.tasks,
                 tmp_path / "tables", scope=campaign.scopes())
    compared = 0
    for table, spec in tables.items():
        cells = reported_cells(spec)
        if not cells:
            assert "Reproduction" not in (tmp_path / "tables" / f"{table}.md").read_text()
            continue
        csv = pd.read_csv(tmp_path / "tables" / f"{table}.csv", keep_default_na=False, na_values=[""])
        rows = csv.set_index(["backbone" if spec["style"] == "archer" else "task", "method"])
        for (outer, label, col), reported in cells.items():
            row = rows.loc[(outer, label)]
            diff = row[col] - reported
            kind, amount = tolerance_for(spec, col)
            beyond = abs(diff) > (amount if kind == "absolute" else amount * abs(reported)) + 1e-9
            assert row[f"{col} reported"] == reported, (table, label, col)
            assert row[f"{col} diff"] == pytest.approx(diff, abs=1e-4), (table, label, col)
            assert str(row[f"{col} flag"]) == str(beyond), (table, label, col)
        compared += len(cells)
        md = (tmp_path / "tables" / f"{table}.md").read_text()
        assert f"Reproduction: {len(cells)} of {len(cells)} reported cells compared" in md
        assert "(paper " in md and "(paper " in (tmp_path / "tables" / f"{table}.html").read_text()
    assert compared == {"archer": 14, "spa": 308}[name]  # every cell the configs transcribe


def test_archer_table1_reproduction_cells_by_hand(tmp_path, write_config):
    campaign, _ = paper_campaign("archer", tmp_path, write_config)
    summary = tmp_path / "summary.parquet"
    stand_in_summary(campaign).to_parquet(summary)
    write_tables(summary, {"t": campaign.config["tables"]["table1-main"]}, campaign.origin,
                 campaign.backbones, campaign.tasks, tmp_path, scope=campaign.scopes())
    rows = pd.read_csv(tmp_path / "t.csv").set_index("method")
    archer, saber = rows.loc["archer"], rows.loc["saber"]
    # Pass@1 30% everywhere: Overall 30.00 against the paper's 33.63, beyond 2 points
    assert archer["overall quality (%) diff"] == pytest.approx(-3.63)
    assert archer["overall quality (%) flag"] == True  # noqa: E712
    assert rows.loc["fast-dllm-parallel", "overall quality (%) diff"] == pytest.approx(-1.12)
    assert rows.loc["fast-dllm-parallel", "overall quality (%) flag"] == False  # noqa: E712
    # 8 s per problem: 0.45 s under Saber's 8.45 (5%, within 20%); 9.75 s under its 17.75
    assert saber["mbpp latency (s) diff"] == pytest.approx(-0.45) and saber["mbpp latency (s) flag"] == False  # noqa: E712
    assert saber["livecodebench latency (s) flag"] == True  # noqa: E712
    # 1.4x over Saber: within 15% of 1.36 and 1.50, not of 1.81
    assert [archer[f"{t} speedup vs saber (x) flag"] for t in ("mbpp", "livecodebench", "humaneval")] \
        == [False, True, False]
    md = (tmp_path / "t.md").read_text()
    assert "Reproduction: 14 of 14 reported cells compared, 7 within tolerance ✓, 7 outside ✗." in md
    assert "30.00 (paper 33.63, -3.63 ✗)" in md and "1.40× (paper 1.36×, +0.04 ✓)" in md


def test_frontier_campaign_plans_every_new_method_on_both_families(tmp_path, warm_snakemake, write_config):
    """configs/frontier.yaml: every registered sampler and cache decodes in it, the new methods on
    LLaDA and Dream, the unpublished pairings on LLaDA, with their released settings; the
    block-diffusion models (SDAR, Fast-dLLM v2) with their releases' loops and every other method
    that applies to them (issue 32)."""
    from dlmpipe import registry

    campaign, path = paper_campaign("frontier", tmp_path, write_config)
    planned = dry_run(tmp_path, warm_snakemake, campaign, path)
    every_row_runs(campaign)
    llada, dream = "llada-8b-instruct", "dream-v0-instruct-7b"
    used = {(m["sampler"]["name"], m["cache"]["name"]) for m in planned.values()}
    new_samplers = {"certainty_prior", "pc_sampler", "wino", "eb_sampler", "klass"}
    assert new_samplers <= {s for s, _ in used} and "d2cache" in {c for _, c in used}
    assert {s for s, _ in used} >= set(registry.SAMPLERS) - {"factor", "random_order", "dream"} - {
        n for n, e in registry.SAMPLERS.items() if e.needs_block_causal}  # (not on LLaDA or Dream)
    for t in campaign.tasks:
        for b in (llada, dream):
            for name in ("d2cache", "certainty-prior", "pc-sampler", "wino", "eb-sampler", "klass",
                         "llada-margin"):
                method = planned[(b, t, name)]
                assert method["gen_length"] == 256, (b, t, name)
        assert {b for (b, tt, n) in planned if n in ("wino-archer-k8", "certainty-prior-spa",
                                                     "threshold-d2cache")} == {llada}
    cache = planned[(llada, "gsm8k", "d2cache")]["cache"]
    assert (cache["rollout_p"], cache["sigma"], cache["rule"]) == (0.1, 10.0, "paper")
    wino = planned[(dream, "mbpp", "wino")]["sampler"]
    assert (wino["wide_in"], wino["narrow_out"], wino["block_length"]) == (0.6, 0.9, 128)
    assert planned[(llada, "gsm8k", "wino-archer-k8")]["cache"] == {
        **planned[(llada, "gsm8k", "archer-k8")]["cache"]}
    assert planned[(dream, "gsm8k", "spa")]["cache"]["profile"] == "dream-7b"
    assert planned[(llada, "gsm8k", "certainty-prior-spa")]["cache"]["profile"] == "llada-8b-instruct"
    # the block-diffusion backbones (issue 32): their releases' loops on their own model, with the
    # releases' evaluation settings; every method without backbones: on them too, SPA-Cache with
    # the uniform budget (no published profile), the adaptive one on LLaDA and Dream only
    sdar, v2 = "sdar-8b-chat", "fast-dllm-v2-7b"
    assert {n for n, e in registry.SAMPLERS.items() if e.needs_block_causal} <= {s for s, _ in used}
    assert {"fast_dllm_v2", "fast_dllm_dual", "spa", "d2cache", "archer"} <= {c for _, c in used}
    where = {}
    for b, t, n in planned:
        where.setdefault(n, set()).add((b, t))
    on = {b: {(b, t) for t in campaign.tasks} for b in campaign.backbones}
    assert where["sdar"] == where["sdar-static"] == on[sdar]
    assert where["fast-dllm-v2"] == where["fast-dllm-v2-cache"] == on[v2]
    assert where["spa"] == on[llada] | on[dream] and where["spa-uniform"] == on[sdar] | on[v2]
    for name in ("llada-confidence", "saber", "archer-k8", "fast-dllm-parallel", "dkv-decode",
                 "dllm-cache", "d2cache", "certainty-prior", "pc-sampler", "wino", "eb-sampler",
                 "klass", "llada-margin"):
        assert where[name] >= on[sdar] | on[v2], name
    for t in campaign.tasks:
        for b, name in ((sdar, "sdar"), (sdar, "sdar-static"), (v2, "fast-dllm-v2"),
                        (v2, "fast-dllm-v2-cache"), (sdar, "spa-uniform"), (v2, "spa-uniform")):
            assert planned[(b, t, name)]["gen_length"] == 256, (b, t, name)
        for name, threshold in (("sdar", 0.95), ("sdar-static", 1.0)):
            sampler = planned[(sdar, t, name)]["sampler"]
            assert (sampler["rule"], sampler["remasking"], sampler["steps"],
                    sampler["confidence_threshold"], sampler["temperature"], sampler["top_k"]) == (
                "evaluation", "low_confidence_dynamic", 4, threshold, 1.0, 1)  # eval_sdar_hf.py
        for name, cache in (("fast-dllm-v2", "none"), ("fast-dllm-v2-cache", "fast_dllm_v2")):
            method = planned[(v2, t, name)]
            assert (method["sampler"]["threshold"], method["sampler"]["sub_block_length"],
                    method["sampler"]["temperature"], method["cache"]["name"]) == (0.9, 8, 0, cache)
        uniform = planned[(sdar, t, "spa-uniform")]["cache"]
        assert (uniform["budget"], uniform["rho"], uniform["rank"]) == ("uniform", 0.25, 128)
    assert set(campaign.config["tables"]) >= {"frontier-sdar", "frontier-fast-dllm-v2"}
    # dInfer's decoders over its vicinity-refreshed dual cache (issue 33), on every backbone, with
    # the release's benchmark settings
    assert where["dinfer-hierarchy"] == where["dinfer-credit"] == set().union(*on.values())
    for b in campaign.backbones:
        hierarchy, credit = planned[(b, "gsm8k", "dinfer-hierarchy")], planned[(b, "gsm8k", "dinfer-credit")]
        assert (hierarchy["sampler"]["threshold"], hierarchy["sampler"]["low_threshold"],
                hierarchy["sampler"]["block_length"]) == (0.8, 0.5, 64)
        assert (credit["sampler"]["credit_alpha"], credit["sampler"]["boost_gamma"],
                credit["sampler"]["decay_beta"], credit["sampler"]["threshold"]) == (0.7, 0.2, 0.8, 0.9)
        for m in (hierarchy, credit):
            assert (m["cache"]["name"], m["cache"]["prefix_look"], m["cache"]["after_look"],
                    m["cache"]["warmup_steps"], m["cache"]["refresh_interval"]) == (
                "dinfer_vicinity", 16, 16, 4, None)


def test_the_plan_knows_the_block_diffusion_checkpoints_without_them(tmp_path):
    """`python -m dlmpipe plan configs/frontier.yaml` before any download: SDAR-1.7B/4B/8B-Chat
    and Fast_dLLM_v2_1.5B/7B are sized from their releases' config.json widths (matched by the
    backbone's or directory's name), as the native model counts them, in their families."""
    import types
    from pathlib import Path

    import torch

    from dlmpipe import plan
    from dlmpipe.backbones.model import Backbone, BackboneConfig

    def size(name, directory):
        stub = types.SimpleNamespace(config={"backbones": {name: {"path": f"/nowhere/{directory}"}}},
                                     checkpoint_path=lambda b: Path(f"/nowhere/{directory}"))
        return plan.backbone_size(stub, name)

    # the parameters Qwen3's and Qwen2.5's model cards give (untied SDAR-4B: Qwen3-4B's 4.0B
    # plus a head of 151936 x 2560), by the backbone's name or the directory's
    for name, directory, family, low, high in (
            ("sdar-1.7b", "SDAR-1.7B-Chat", "sdar", 1.70e9, 1.73e9),
            ("sdar-4b", "SDAR-4B-Chat", "sdar", 4.40e9, 4.42e9),
            ("b", "SDAR-8B-Chat", "sdar", 8.18e9, 8.20e9),
            ("fast-dllm-v2-1.5b", "model", "fast_dllm_v2", 1.54e9, 1.55e9),
            ("b", "Fast_dLLM_v2_7B", "fast_dllm_v2", 7.61e9, 7.62e9)):
        s = size(name, directory)
        assert low < s.parameters < high and s.identity.family == family, (name, directory, s)
        assert "known checkpoint" in s.source and s.n_layers in (28, 36)
    # the formula's arguments are the native model's (SDAR-8B's layout at a tenth of its layers)
    cfg = BackboneConfig("sdar", 4096, 4, 32, 8, 12288, 151936, 1e6, 1e-6, False, 0,
                         attn_head_dim=128, qk_norm=True, block_size=4)
    with torch.device("meta"):
        model = Backbone(cfg)
    assert plan.parameters(4096, 4, 32, 8, 12288, 151936, False, 128, True, False) == sum(
        p.numel() for p in model.parameters())
    from dlmpipe.campaign import load_campaign

    campaign = load_campaign([REPO / "configs" / "frontier.yaml"], check_paths=False)
    sizes = {b: plan.backbone_size(campaign, b) for b in campaign.backbones}
    assert 8.18e9 < sizes["sdar-8b-chat"].parameters < 8.20e9
    assert 7.61e9 < sizes["fast-dllm-v2-7b"].parameters < 7.62e9
    assert sizes["fast-dllm-v2-7b"].identity.family == "fast_dllm_v2"
