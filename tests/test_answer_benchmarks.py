"""BBH, GPQA, MMLU-Pro, PubMedQA, FinQA and MATH-500: rows from the real files (BBH, PubMedQA) or
fixtures in the upstream formats (tests/data), prompts, and gold answers scoring 1.0 and
perturbed ones 0.0 through the real scorer; the score stage's and the summary's new columns."""
from __future__ import annotations

import collections
import json
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlmpipe.analysis.summary import summary_table
from dlmpipe.scoring.code import Settings
from dlmpipe.scoring.score import score_generations, score_sample
from dlmpipe.tasks.registry import load_task, write_task_table
from dlmpipe.tasks.sources import data_dirs

from .gold import gold_completion, perturbed_completion

DATA = Path(__file__).resolve().parent / "data"
SETTINGS = Settings(time_limit=10.0)


def shared(name: str) -> Path:
    for d in data_dirs():
        if (d / name).exists():
            return d / name
    pytest.skip(f"{name} not in $DLMPIPE_DATA_DIR or ../shared/data")


def gold_and_perturbed(rows: list[dict]) -> tuple[float, float]:
    """Mean score of the gold and of the perturbed completions through the real scorer."""
    gold = [score_sample(r, gold_completion(r), SETTINGS)["score"] for r in rows]
    bad = [score_sample(r, perturbed_completion(r), SETTINGS)["score"] for r in rows]
    return sum(gold) / len(gold), sum(bad) / len(bad)


# ---------------------------------------------------------------------------------------------
# BBH (real files: 27 subtasks, 6,511 examples, 3-shot chain-of-thought prompts)


def test_bbh_real_rows_prompts_and_gold_answers():
    rows = load_task("bbh", source=str(shared("bbh")))
    assert len(rows) == 6511
    per_subtask = collections.Counter(r["subtask"] for r in rows)
    assert len(per_subtask) == 27 and per_subtask["causal_judgement"] == 187
    kinds = collections.Counter(r["kind"] for r in rows)
    assert kinds == {"choice": 4071, "label": 1437, "text": 503, "math": 500}
    date = next(r for r in rows if r["task_id"] == "bbh/date_understanding/0")
    assert date["prompt"].startswith("Infer the date from context.\n\nQ: Today is Christmas Eve")
    assert date["prompt"].count("\nA: Let's think step by step.\n") == 3
    question = json.loads((shared("bbh") / "date_understanding.json").read_text())["examples"][0]["input"]
    assert date["prompt"].endswith("So the answer is (B).\n\nQ: " + question + "\n")
    assert date["response_prefix"] == "A: Let's think step by step.\n"
    assert date["answer"] == "B" and len(json.loads(date["choices"])) == 6
    assert gold_and_perturbed(rows) == (1.0, 0.0)


def test_bbh_options(tmp_path):
    root = shared("bbh")
    zero = load_task("bbh", source=str(root), subtasks=["navigate", "word_sorting"], fewshot=0)
    assert {r["subtask"] for r in zero} == {"navigate", "word_sorting"} and len(zero) == 500
    assert "\nA: Let's think step by step." not in zero[0]["prompt"]
    assert zero[0]["prompt"].startswith("Given a series of navigation instructions")
    with pytest.raises(ValueError, match="unknown subtask"):
        load_task("bbh", source=str(root), subtasks=["navigation"])
    broken = tmp_path / "bbh"
    (broken / "cot-prompts").mkdir(parents=True)
    (broken / "navigate.json").write_text('{"examples": [{"input": "go"}]}')
    (broken / "cot-prompts" / "navigate.txt").write_text((root / "cot-prompts" / "navigate.txt").read_text())
    with pytest.raises(ValueError, match="navigate.json.*lacks input/target"):
        load_task("bbh", source=str(broken), subtasks=["navigate"])
    (broken / "navigate.json").write_text('{"examples": [{"input": "go", "target": "Maybe"}]}')
    with pytest.raises(ValueError, match="navigate.json.*not one of"):
        load_task("bbh", source=str(broken), subtasks=["navigate"])


# ---------------------------------------------------------------------------------------------
# PubMedQA (real files: 1,000 expert-labelled questions, the 500-question test split)


def test_pubmedqa_real_rows_and_gold_answers():
    rows = load_task("pubmedqa", source=str(shared("pubmedqa_ori_pqal.json.gz")))
    assert len(rows) == 1000
    assert collections.Counter(r["answer"] for r in rows) == {"yes": 552, "no": 338, "maybe": 110}
    assert rows[0]["prompt"].startswith("Abstract: Programmed cell death (PCD)")
    assert rows[0]["prompt"].endswith("?\nAnswer with yes, no or maybe.")
    test = load_task("pubmedqa_test", source=str(shared("pubmedqa_test_ground_truth.json")),
                     base_source=str(shared("pubmedqa_ori_pqal.json.gz")))
    assert len(test) == 500 and {r["task_id"] for r in test} < {r["task_id"] for r in rows}
    assert gold_and_perturbed(rows) == (1.0, 0.0)
    assert gold_and_perturbed(test) == (1.0, 0.0)


def test_pubmedqa_test_ids_must_be_in_the_base_file(tmp_path):
    truth = tmp_path / "truth.json"
    truth.write_text('{"99999999": "yes"}')
    with pytest.raises(ValueError, match="PMIDs of .*truth.json are not in"):
        load_task("pubmedqa_test", source=str(truth), base_source=str(shared("pubmedqa_ori_pqal.json.gz")))


# ---------------------------------------------------------------------------------------------
# GPQA, MMLU-Pro, FinQA, MATH-500 (fixtures in the upstream formats)


def test_gpqa_shuffles_with_a_fixed_seed():
    rows = load_task("gpqa_main", source=str(DATA / "gpqa_main.csv"))
    assert [r["task_id"] for r in rows] == [f"gpqa_main/recFixture00{i}" for i in (1, 2, 3)]
    for r, correct in zip(rows, ["600 K", "Hydroxyl", "46"]):
        assert json.loads(r["choices"])["ABCD".index(r["answer"])] == correct
        assert f"({r['answer']}) {correct}\n" in r["prompt"] + "\n"
    assert rows[0]["prompt"].startswith("What is the correct answer to this question: A gas at")
    assert "Format your response as follows: \"The correct answer is (insert answer here)\"" in rows[0]["prompt"]
    assert rows == load_task("gpqa_main", source=str(DATA / "gpqa_main.csv"))  # deterministic
    others = [load_task("gpqa_main", source=str(DATA / "gpqa_main.csv"), seed=s) for s in range(1, 6)]
    assert any([r["choices"] for r in o] != [r["choices"] for r in rows] for o in others)
    assert load_task("gpqa_diamond", source=str(DATA / "gpqa_main.csv"))[0]["task_id"].startswith("gpqa_diamond/")
    assert gold_and_perturbed(rows) == (1.0, 0.0)


def test_gpqa_missing_column(tmp_path):
    bad = tmp_path / "gpqa.csv"
    bad.write_text("Question,Correct Answer\nq,a\n")
    with pytest.raises(ValueError, match="gpqa.csv.*lacks"):
        load_task("gpqa_main", source=str(bad))


def test_mmlu_pro_five_shot_prompts_from_the_validation_split(tmp_path):
    test, val = DATA / "mmlu_pro_test.jsonl", DATA / "mmlu_pro_validation.jsonl"
    rows = load_task("mmlu_pro", source=str(test), fewshot_source=str(val))
    assert [r["task_id"] for r in rows] == ["mmlu_pro/70001", "mmlu_pro/70002", "mmlu_pro/70003"]
    first = rows[0]
    assert len(json.loads(first["choices"])) == 6  # "N/A" padding dropped
    assert first["prompt"].startswith("The following are multiple choice questions (with answers) "
                                      "about math. Think step by step")
    assert first["prompt"].count("Question:\n") == 6 and "about physics" not in first["prompt"]
    assert first["prompt"].count("Answer: Let's think step by step. Adding one") == 5
    assert first["prompt"].endswith("Question:\nWhat is 7 multiplied by 8?\nOptions:\nA. 54\nB. 56\n"
                                    "C. 58\nD. 64\nE. 48\nF. 72\n")
    assert first["response_prefix"] == "Answer: Let's think step by step."
    assert [r["subtask"] for r in rows] == ["math", "physics", "math"]
    assert gold_and_perturbed(rows) == (1.0, 0.0)
    # the release's parquet files read the same
    for name, path in (("t", test), ("v", val)):
        records = [json.loads(line) for line in path.read_text().splitlines()]
        pq.write_table(pa.Table.from_pylist(records), tmp_path / f"{name}.parquet")
    assert load_task("mmlu_pro", source=str(tmp_path / "t.parquet"),
                     fewshot_source=str(tmp_path / "v.parquet")) == rows
    only = load_task("mmlu_pro", source=str(test), fewshot=0, subtasks=["physics"])
    assert len(only) == 1 and only[0]["prompt"].count("Question:") == 1
    with pytest.raises(ValueError, match="unknown categories"):
        load_task("mmlu_pro", source=str(test), fewshot=0, subtasks=["law"])
    with pytest.raises(ValueError, match="fewer than fewshot=6"):
        load_task("mmlu_pro", source=str(test), fewshot=6, fewshot_source=str(val))


def test_finqa_numbers_and_yes_no():
    rows = load_task("finqa", source=str(DATA / "finqa_test.json"))
    assert [r["kind"] for r in rows] == ["number", "number", "label"]
    assert rows[0]["answer"] == "0.14177" and rows[2]["answer"] == "yes"
    assert "| revenue | $ 1200 | $ 1051 |" in rows[0]["prompt"]
    assert rows[0]["prompt"].endswith("Question: what was the percentage change in revenue from 2008 to "
                                      "2009?\nPlease reason step by step, and finish with \"The answer "
                                      "is\" and the number.")
    assert gold_and_perturbed(rows) == (1.0, 0.0)
    percent = score_sample(rows[0], "The change is 149 / 1051. The answer is 14.2%.", SETTINGS)
    assert percent["passed"] and percent["extracted"] == "14.2%"


def test_math500_rows():
    rows = load_task("math500", source=str(DATA / "math500_test.jsonl"))
    assert [r["answer"] for r in rows] == ["\\frac{3}{4}", "51", "(1,1)"]
    assert [r["subtask"] for r in rows] == ["Prealgebra", "Prealgebra", "Algebra"]
    assert gold_and_perturbed(rows) == (1.0, 0.0)


@pytest.mark.parametrize("task, options", [("humaneval", {"fewshot": 3}), ("bbh", {"seed": 1})])
def test_options_a_loader_does_not_take_are_errors(task, options):
    with pytest.raises(ValueError, match="takes no option"):
        load_task(task, **options)


# ---------------------------------------------------------------------------------------------
# The score stage and the summary: extracted answers, rules, subtasks


def test_scores_keep_the_extracted_answer_rule_and_subtask(tmp_path):
    rows = load_task("bbh", source=str(shared("bbh")), ids=["bbh/navigate/0", "bbh/navigate/1",
                                                             "bbh/word_sorting/0"])
    task_file = tmp_path / "bbh.parquet"
    write_task_table(rows, task_file)
    completions = [gold_completion(rows[0]), "It is unclear.", gold_completion(rows[2])]
    n = len(rows)
    gen = tmp_path / "gen.parquet"
    pq.write_table(pa.table({
        "sample_index": list(range(n)), "task_id": [r["task_id"] for r in rows],
        "completion": completions, "job_time_s": [0.1] * n, "backbone": ["b"] * n, "task": ["bbh"] * n,
        "method": ["m"] * n}), gen)
    out = tmp_path / "scores.parquet"
    score_generations(gen, task_file, out)
    got = pq.read_table(out).to_pylist()
    assert [r["passed"] for r in got] == [True, False, True]
    assert [r["extraction_rule"] for r in got] == ["answer is", "none", "answer is"]
    assert got[0]["extracted"] == rows[0]["answer"] and got[1]["extracted"] is None
    assert [r["subtask"] for r in got] == ["navigate", "navigate", "word_sorting"]


def test_summary_quality_by_subtask_and_verdicts_by_rule():
    base = {"backbone": "b", "task": "bbh", "job_time_s": 1.0, "nfe": 8, "steps": 8, "refreshes": 0,
            "cached_forwards": 0, "revisions": 0}
    scores = pd.DataFrame([
        {**base, "method": "m", "sample_index": 0, "score": 1.0, "subtask": "navigate", "extraction_rule": "answer is"},
        {**base, "method": "m", "sample_index": 1, "score": 0.0, "subtask": "navigate", "extraction_rule": "none"},
        {**base, "method": "m", "sample_index": 2, "score": 1.0, "subtask": "word_sorting", "extraction_rule": "answer is"},
    ])
    table = summary_table(scores, reference="m")
    assert json.loads(table.loc[0, "quality_by_subtask"]) == {"navigate": 0.5, "word_sorting": 1.0}
    assert json.loads(table.loc[0, "verdicts_by_rule"]) == {"answer is": {"passed": 2, "failed": 0},
                                                            "none": {"passed": 0, "failed": 1}}
    plain = summary_table(scores.drop(columns=["subtask", "extraction_rule"]), reference="m")
    assert "quality_by_subtask" not in plain.columns and "verdicts_by_rule" not in plain.columns
