"""The workflow's DAG: what the planned jobs run with, and after a finished run a config change
schedules exactly the jobs it affects (params rerun trigger, PyPSA-Eur style).

The finished run is conftest's ``finished_run`` (real, or faked with ``DLMPIPE_DAG_TOUCH=1``).
Job counts per rule against the config (``expected_counts``) and a clean ``--lint``, on the
default campaign and the tiny one: tests/test_snakemake_commands.py's dry-run, --dag and --lint
tests.
"""
from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from .workflow import CONFIGS, REPORT_JOBS, decoding_jobs, job_blocks, scheduled, timing_jobs


def test_generate_jobs_ask_for_a_gpu_on_cuda(tmp_path, warm_snakemake):
    proc = warm_snakemake(tmp_path, "-n", "-p", "--config", "device=cuda", configfile=CONFIGS / "tiny.yaml")
    blocks = job_blocks(proc.stdout)
    resources = {rule: re.search(r"resources: (.*)", body).group(1) for rule, body in blocks
                 if "resources:" in body}
    assert "gpu=1" in resources["generate"] and "gpu" not in resources["score"]
    assert "--device cuda" in proc.stdout and "--compile none" in proc.stdout
    proc = warm_snakemake(tmp_path, "-n", "-p", "--config", "device=cuda", "compile=cuda_graphs",
                          configfile=CONFIGS / "tiny.yaml")
    assert "--device cuda --compile cuda_graphs" in proc.stdout


def test_generate_jobs_decode_with_the_effective_gen_length(tmp_path, warm_snakemake, tiny_config,
                                                            write_config):
    tiny_config["methods"]["scaling"] = {"sampler": {"name": "dream"}, "cache": {"name": "none"},
                                         "sweep": {"gen_length": [4, 16]}}
    tiny_config["tasks"]["code-2"] = {"benchmark": "toy_code", "n": 2, "gen_length": 12}
    config = write_config(tiny_config, tmp_path / "scaling.yaml")
    proc = warm_snakemake(tmp_path, "-n", "-p", configfile=config)
    planned = {}
    for task, method in re.findall(r"--task-file \S*/tasks/(\S+)\.parquet --method '(\{.*?\})'",
                                   proc.stdout):
        method = json.loads(method)
        planned[(task, method["name"])] = method["gen_length"]
    assert planned == {(t, m): g for t, length in (("toy_code", 8), ("toy_arith", 8), ("code-2", 12))
                       for m, g in (("llada-confidence", length), ("archer-k1", length),
                                    ("archer-kinf", length), ("scaling-g4", 4), ("scaling-g16", 16))}
    assert "prepare-task --name toy_code --options '{\"n\":2}'" in proc.stdout


def test_a_tasks_local_files_are_inputs_of_its_preparation(tmp_path, warm_snakemake, tiny_config,
                                                           write_config):
    """`source`, `base_source` and `fewshot_source`: editing any of them rebuilds the task."""
    data = Path(__file__).resolve().parent / "data"
    tiny_config["tasks"] = {"mmlu_pro": {"gen_length": 8, "source": str(data / "mmlu_pro_test.jsonl"),
                                         "fewshot_source": str(data / "mmlu_pro_validation.jsonl")},
                            "mbpp_et": {"gen_length": 8, "source": str(data / "MBPP_ET.jsonl"),
                                        "base_source": str(data / "math500_test.jsonl")}}
    proc = warm_snakemake(tmp_path, "-n", configfile=write_config(tiny_config, tmp_path / "c.yaml"))
    blocks = re.findall(r"^(?:local)?rule prepare_task:\n((?:    .*\n?)*)", proc.stdout, re.M)
    inputs = {re.search(r"wildcards: task=(\S+)", b).group(1): re.search(r"input: (.*)", b).group(1)
              for b in blocks}
    assert inputs == {"mmlu_pro": f"{data / 'mmlu_pro_test.jsonl'}, {data / 'mmlu_pro_validation.jsonl'}",
                      "mbpp_et": f"{data / 'MBPP_ET.jsonl'}, {data / 'math500_test.jsonl'}"}


# ---- incremental reruns after a finished run ----------------------------------------------------
def rerun_after(workdir: Path, snakemake, name: str, change) -> set[tuple]:
    """Apply ``change`` to the tiny config and return the jobs a dry run schedules."""
    changed = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    change(changed)
    path = workdir / f"changed-{name}.yaml"
    path.write_text(yaml.safe_dump(changed, sort_keys=False))
    proc = snakemake(workdir, "-n", configfile=path)
    return scheduled(proc.stdout)


TASKS = ["toy_code", "toy_arith"]
METHODS = ["llada-confidence", "archer-k1", "archer-kinf"]


def set_in(path: str, value):
    def change(config):
        *parents, last = path.split("/")
        node = config
        for p in parents:
            node = node[p]
        node[last] = value
    return change


CHANGES = {
    # one method's parameter: that method's generate/score jobs, then summary and plots
    # (the reference's: every method's timing, each paired with it)
    "method-param": (set_in("methods/llada-confidence/sampler/steps", 4),
                     decoding_jobs(["toy"], TASKS, ["llada-confidence"])
                     | timing_jobs(["toy"], TASKS, METHODS) | REPORT_JOBS),
    # another method's parameter: that method's jobs and its timing only
    "other-method-param": (set_in("methods/archer/sweep/cache.K", [1, 64]),
                           decoding_jobs(["toy"], TASKS, ["archer-k64"])
                           | timing_jobs(["toy"], TASKS, ["archer-k64"]) | REPORT_JOBS),
    # a new method: only its jobs, its timing (paired with the reference) included
    "new-method": (set_in("methods/saber", {"sampler": {"name": "saber"}, "cache": {"name": "none"}}),
                   decoding_jobs(["toy"], TASKS, ["saber"]) | timing_jobs(["toy"], TASKS, ["saber"])
                   | REPORT_JOBS),
    # a new sweep point: only its jobs, not the sweep's other points
    "new-sweep-point": (set_in("methods/archer/sweep/cache.K", [1, 2, "inf"]),
                        decoding_jobs(["toy"], TASKS, ["archer-k2"])
                        | timing_jobs(["toy"], TASKS, ["archer-k2"]) | REPORT_JOBS),
    # a parameter shared by a sweep's points: all of them
    "sweep-param": (set_in("methods/archer/sampler/n", 3),
                    decoding_jobs(["toy"], TASKS, ["archer-k1", "archer-kinf"])
                    | timing_jobs(["toy"], TASKS, ["archer-k1", "archer-kinf"]) | REPORT_JOBS),
    # the generation length is a decoding parameter, not a loader option: tasks are not rebuilt
    "gen-length": (set_in("tasks/toy_arith/gen_length", 4),
                   decoding_jobs(["toy"], ["toy_arith"], METHODS)
                   | timing_jobs(["toy"], ["toy_arith"], METHODS) | REPORT_JOBS),
    # a method's own gen_length (overriding the tasks' 8) reruns exactly that method's jobs ...
    "method-gen-length": (set_in("methods/llada-confidence/gen_length", 4),
                          decoding_jobs(["toy"], TASKS, ["llada-confidence"])
                          | timing_jobs(["toy"], TASKS, METHODS) | REPORT_JOBS),
    # ... and one equal to the tasks' changes no job's effective length: nothing
    "method-gen-length-same": (set_in("methods/llada-confidence/gen_length", 8), set()),
    # a task alias: a registered benchmark under another name is a new task, nothing else reruns
    "task-alias": (set_in("tasks/code-2", {"benchmark": "toy_code", "n": 2, "gen_length": 8}),
                   {("prepare_task", None, "code-2", None)}
                   | decoding_jobs(["toy"], ["code-2"], METHODS) | timing_jobs(["toy"], ["code-2"], METHODS)
                   | REPORT_JOBS),
    # the benchmark a task loads is a param of its preparation; naming the default changes nothing
    "task-benchmark": (set_in("tasks/toy_arith/benchmark", "toy_code"),
                       {("prepare_task", None, "toy_arith", None)}
                       | decoding_jobs(["toy"], ["toy_arith"], METHODS)
                       | timing_jobs(["toy"], ["toy_arith"], METHODS) | REPORT_JOBS),
    "task-benchmark-default": (set_in("tasks/toy_arith/benchmark", "toy_arith"), set()),
    # a loader option rebuilds the task and everything decoded from it
    "task-loader": (set_in("tasks/toy_arith/n", 2),
                    {("prepare_task", None, "toy_arith", None)}
                    | decoding_jobs(["toy"], ["toy_arith"], METHODS)
                    | timing_jobs(["toy"], ["toy_arith"], METHODS) | REPORT_JOBS),
    # a training option retrains the toy backbone and redoes everything downstream of it
    "toy-training": (set_in("backbones/toy/toy/steps", 21),
                     {("train_toy", "toy", None, None), ("prepare_backbone", "toy", None, None)}
                     | decoding_jobs(["toy"], TASKS, METHODS) | timing_jobs(["toy"], TASKS, METHODS)
                     | REPORT_JOBS),
    # another speedup reference re-times every method (each is paired with it), decodes nothing
    "reference": (set_in("reference_method", "archer-k1"),
                  timing_jobs(["toy"], TASKS, METHODS) | REPORT_JOBS),
    # the timing stage's own settings re-time every method, and nothing decodes again
    "timing": (set_in("timing", {"samples": 2, "repeats": 1}),
               timing_jobs(["toy"], TASKS, METHODS) | REPORT_JOBS),
    # a paper table's layout only rewrites the tables
    "table": (set_in("tables", {"archer": {"style": "archer", "methods": ["archer"],
                                           "extended_label": "ET"}, "spa": {"style": "spa"}}),
              {("tables", None, None, None)}),
    # the sandbox level changes every score's recorded isolation: the score jobs, then the report
    "sandbox": (set_in("sandbox", "process"),
                {("score", "toy", t, m) for t in TASKS for m in METHODS} | REPORT_JOBS),
    # naming the level that is already used (bwrap, the default) changes nothing
    "sandbox-default": (set_in("sandbox", "bwrap"), set()),
    # how fixed-shape steps run changes the times (and with torch_compile possibly the last
    # bits): every generate job and the timing, then what reads them
    "compile": (set_in("compile", "torch_compile"), decoding_jobs(["toy"], TASKS, METHODS)
                | timing_jobs(["toy"], TASKS, METHODS) | REPORT_JOBS),
    # the batch size is a scheduling setting for the generate jobs (the same tokens at any size),
    # but the timing stage's throughput pass runs at it: that re-times, nothing decodes again
    "batch-size": (set_in("batch_size", 3), timing_jobs(["toy"], TASKS, METHODS) | REPORT_JOBS),
    # one method's: its own throughput pass only (the reference is timed at batch 1 elsewhere)
    "method-batch-size": (set_in("methods/llada-confidence/batch_size", 2),
                          timing_jobs(["toy"], TASKS, ["llada-confidence"]) | REPORT_JOBS),
    "batch-size-default": (set_in("batch_size", "auto"), set()),
    # scheduling settings never rerun anything
    "resources": (set_in("resources", {"score": {"threads": 2}, "generate": {"mem_mb": 1000}}), set()),
}


@pytest.fixture(scope="module")
def reruns(finished_run, warm_snakemake) -> dict[str, set[tuple]]:
    """What each change schedules; the dry runs only read, so they run side by side."""
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        futures = {name: pool.submit(rerun_after, finished_run, warm_snakemake, name, change)
                   for name, (change, _) in CHANGES.items()}
        return {name: f.result() for name, f in futures.items()}


@pytest.mark.parametrize("name", list(CHANGES))
def test_a_change_reruns_exactly_what_it_affects(reruns, name):
    assert reruns[name] == CHANGES[name][1]
