"""The papers' campaigns, configs/archer.yaml and configs/spa.yaml: dry runs on tiny checkpoints
of the real formats plan every job of the campaign (counts derived from the config), with the
paper's settings reaching the jobs, and every paper table resolving to methods that run."""
from __future__ import annotations

import copy
import json
import re

import yaml

from dlmpipe.analysis.table_spec import table_rows
from dlmpipe.campaign import Campaign

from .checkpoints import make_tiny_checkpoint
from .models import decode_method, random_prompt, tiny_backbone
from .workflow import REPO, expected_counts, job_blocks, job_counts, scheduled

# backbone name in the configs -> (family, the checkpoint's directory name, as downloaded)
CHECKPOINTS = {"llada-8b-instruct": ("llada", "LLaDA-8B-Instruct"),
               "dream-v0-instruct-7b": ("dream", "Dream-v0-Instruct-7B"),
               "diffucoder-7b-cpgrpo": ("diffucoder", "DiffuCoder-7B-cpGRPO")}


def paper_campaign(name: str, tmp_path, write_config):
    """The paper's config with each backbone's path on a tiny checkpoint of its format."""
    config = yaml.safe_load((REPO / "configs" / f"{name}.yaml").read_text())
    for backbone, spec in config["backbones"].items():
        family, directory = CHECKPOINTS[backbone]
        spec["path"] = str(make_tiny_checkpoint(tmp_path / "models" / directory, family))
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


def test_archer_campaign_plans_the_papers_jobs(tmp_path, snakemake, write_config):
    campaign, path = paper_campaign("archer", tmp_path, write_config)
    planned = dry_run(tmp_path, snakemake, campaign, path)
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


def test_spa_campaign_plans_the_papers_jobs(tmp_path, snakemake, write_config):
    campaign, path = paper_campaign("spa", tmp_path, write_config)
    planned = dry_run(tmp_path, snakemake, campaign, path)
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
