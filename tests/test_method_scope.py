"""A method's `backbones:` and `tasks:` (default every one): which jobs exist, what the checks
refuse, and what Snakemake plans and reruns."""
from __future__ import annotations

import copy

import pytest
import yaml

from dlmpipe.campaign import Campaign, ConfigError

from .workflow import REPORT_JOBS, expected_counts, fake_finished_run, job_counts, scheduled, timing_jobs

METHODS = ["llada-confidence", "archer-k1", "archer-kinf"]


def scoped(config: dict, **scope) -> dict:
    config = copy.deepcopy(config)
    config["methods"]["archer"].update(scope)
    return config


def test_a_scoped_method_has_jobs_only_where_it_runs(tiny_config):
    c = Campaign(scoped(tiny_config, tasks=["toy_code"]))
    assert c.decoding_jobs() == [("toy", "toy_code", m) for m in METHODS] + [
        ("toy", "toy_arith", "llada-confidence")]
    assert c.methods_on("toy", "toy_arith") == ["llada-confidence"]
    assert c.runs("archer-kinf", "toy", "toy_code") and not c.runs("archer-kinf", "toy", "toy_arith")
    assert c.method("archer-k1", "toy_code", "toy")["cache"]["K"] == 1
    with pytest.raises(ValueError, match="does not run on toy/toy_arith"):
        c.method("archer-k1", "toy_arith", "toy")
    # unscoped, every method runs everywhere
    assert len(Campaign(tiny_config).decoding_jobs()) == 6


@pytest.mark.parametrize("change, problem", [
    (lambda c: c["methods"]["archer"].update(backbones=["dream"]),
     "methods.archer.backbones[0]: 'dream' is not one of this campaign's backbones (toy)"),
    (lambda c: c["methods"]["archer"].update(tasks=["toy_code", "gsm8k"]),
     "methods.archer.tasks[1]: 'gsm8k' is not one of this campaign's tasks (toy_code, toy_arith)"),
    (lambda c: c["methods"]["llada-confidence"].update(tasks=["toy_code"]),
     "reference_method: 'llada-confidence' runs only on some backbones or tasks "
     "(methods.llada-confidence.backbones/tasks); every method's speedup is against it on the "
     "same backbone and task, so it runs on all of them"),
    (lambda c: c["methods"]["archer"].update(tasks=["toy_arith"]) or c.update(
        analyses={"shadow": [{"methods": ["archer-kinf"], "tasks": ["toy_code"]}]}),
     "analyses.shadow[0].methods[0]: 'archer-kinf' runs on none of this entry's backbones and "
     "tasks (its backbones:/tasks: in methods)"),
])
def test_scope_problems_name_their_key(tiny_config, change, problem):
    change(tiny_config)
    with pytest.raises(ConfigError) as err:
        Campaign(tiny_config)
    assert problem in err.value.problems


def test_analyses_cover_where_the_method_runs(tiny_config):
    config = scoped(tiny_config, tasks=["toy_arith"])
    config["analyses"] = {"shadow": [{"methods": ["archer-kinf"]}]}  # every task: the ones it runs on
    config["also_speedup_against"] = ["archer-k1"]  # its column is empty on toy_code
    c = Campaign(config)
    assert c.analysis_targets("shadow") == [("toy", "toy_arith", "archer-kinf")]


def test_the_dag_of_a_scoped_campaign(tmp_path, warm_snakemake, tiny_config, write_config):
    config = scoped(tiny_config, tasks=["toy_code"])
    path = write_config(config, tmp_path / "scoped.yaml")
    proc = warm_snakemake(tmp_path, "-n", configfile=path)
    assert job_counts(proc.stdout) == expected_counts(Campaign(config))
    jobs = scheduled(proc.stdout)
    assert {j for j in jobs if j[0] == "generate"} == {
        ("generate", "toy", t, m) for t, m in [("toy_code", m) for m in METHODS]
        + [("toy_arith", "llada-confidence")]}


def test_narrowing_a_method_reruns_only_the_timing_of_what_it_left(tmp_path, warm_snakemake, tiny_config,
                                                                     write_config):
    fake_finished_run(tmp_path, write_config(tiny_config, tmp_path / "all.yaml"), snakemake=warm_snakemake)
    narrowed = write_config(scoped(tiny_config, tasks=["toy_code"]), tmp_path / "narrowed.yaml")
    jobs = scheduled(warm_snakemake(tmp_path, "-n", configfile=narrowed).stdout)
    # the other generations' parameters are unchanged: no decoding and no timing reruns (each
    # method is timed in its own job); the report is rebuilt from fewer rows
    assert jobs == REPORT_JOBS


def test_the_paper_config_scopes_its_baselines_to_table_1s_backbone():
    from .workflow import REPO

    c = Campaign(yaml.safe_load((REPO / "configs" / "archer.yaml").read_text()), check_paths=False)
    llada = "llada-8b-instruct"
    for name in ("fast-dllm-cache", "fast-dllm-parallel", "dkv-decode", "dkv-greedy", "dllm-cache",
                 "no-rollback"):
        assert [b for b in c.backbones if c.runs(name, b, "mbpp")] == [llada], name
    assert all(c.runs("saber", b, "mbpp") and c.runs("archer-k11", b, "mbpp") for b in c.backbones)
