"""Your own dataset without code (docs/SCORING.md, "Your own dataset"): the docs' example
config as written loads, checks, plans and scores; each metric; ids kept; a file in a known
benchmark's format is planned at its own size; a missing file or a bad option is a `check`
problem naming the key."""
from __future__ import annotations

import json
import re

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from dlmpipe.scoring.code import Settings
from dlmpipe.scoring.score import score_sample
from dlmpipe.tasks.registry import load_task, prompt_chars, task_rows

from .test_plan_checks import problems
from .workflow import REPO

ROWS = [{"qid": "q-7", "question": "What is 2 + 3?", "answer": "5"},
        {"qid": "q-9", "question": "What is 10 - 4?", "answer": "6"}]


def docs_example() -> str:
    """The YAML block of docs/SCORING.md's "Your own dataset" section."""
    doc = (REPO / "docs" / "SCORING.md").read_text()
    section = doc[doc.index("## Your own dataset"):]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def test_the_docs_example_checks_plans_and_loads_as_written(tmp_path, monkeypatch, tiny_config):
    import yaml

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_questions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "my_exemplars.jsonl").write_text(json.dumps(
        {"qid": "x", "question": "What is 1 + 1?", "answer": "2"}) + "\n")
    tasks = yaml.safe_load(docs_example())["tasks"]
    tiny_config["tasks"].update(tasks)
    assert problems(tiny_config) == []
    name, options = next(iter(tasks.items()))
    loader = {k: v for k, v in options.items() if k not in ("gen_length", "benchmark")}
    rows = load_task("local", **loader)
    assert [r["task_id"] for r in rows] == ["q-7", "q-9"]                  # ids kept
    assert rows[0]["prompt"].startswith("Question: What is 1 + 1?\nAnswer: 2")  # the exemplar
    assert rows[0]["prompt"].endswith("Question: What is 2 + 3?\nAnswer:")
    assert task_rows("local", options) == 2
    assert prompt_chars("local", options) == round(sum(len(r["prompt"]) for r in rows) / 2)
    assert score_sample(rows[0], "The sum is 5.", Settings())["passed"]
    assert not score_sample(rows[1], "It is 7.", Settings())["passed"]


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".parquet"])
def test_each_file_format_reads_the_same_rows(tmp_path, suffix):
    path = tmp_path / f"q{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    elif suffix == ".csv":
        path.write_text("qid,question,answer\n" + "".join(
            f"{r['qid']},{r['question']},{r['answer']}\n" for r in ROWS))
    else:
        pq.write_table(pa.Table.from_pylist(ROWS), path)
    rows = load_task("local", source=str(path), prompt="{question}", id="qid", metric="numeric")
    assert [(r["task_id"], r["prompt"], r["answer"], r["kind"]) for r in rows] == [
        ("q-7", "What is 2 + 3?", "5", "math"), ("q-9", "What is 10 - 4?", "6", "math")]
    assert task_rows("local", {"source": str(path)}) == 2


def test_exact_and_choice_metrics(tmp_path):
    path = tmp_path / "mc.jsonl"
    path.write_text(json.dumps({"q": "Sky colour?", "opts": ["green", "blue"], "gold": "blue",
                                "word": "Paris"}) + "\n")
    rows = load_task("local", source=str(path), prompt="{q}\n{choices}\nLetter:", answer="gold",
                     metric="choice", choices="opts")
    assert rows[0]["prompt"] == "Sky colour?\nA. green\nB. blue\nLetter:"
    assert rows[0]["answer"] == "B" and rows[0]["task_id"] == "mc/0"     # no id field: file/row
    assert score_sample(rows[0], "The answer is (B).", Settings())["passed"]
    assert not score_sample(rows[0], "The answer is (A).", Settings())["passed"]
    exact = load_task("local", source=str(path), prompt="Capital of France?", answer="word")
    assert score_sample(exact[0], " Paris \n", Settings())["passed"]
    assert not score_sample(exact[0], "It is Paris", Settings())["passed"]


def test_the_code_metric_runs_the_rows_tests_in_the_sandbox(tmp_path):
    path = tmp_path / "code.jsonl"
    path.write_text(json.dumps({"task": "Write add(a, b).", "tests": "assert add(2, 3) == 5\n",
                                "fn": "add"}) + "\n")
    row = load_task("local", source=str(path), prompt="{task}", metric="code", test="tests",
                    entry_point="fn")[0]
    assert row["kind"] == "code" and row["entry_point"] == "add"
    good = score_sample(row, "```python\ndef add(a, b):\n    return a + b\n```", Settings())
    bad = score_sample(row, "```python\ndef add(a, b):\n    return a - b\n```", Settings())
    assert good["passed"] and good["isolation"] != "none", good
    assert not bad["passed"] and bad["status"] == "failed", bad


def test_a_file_in_a_known_format_is_planned_at_its_own_size_with_its_ids(tmp_path):
    path = tmp_path / "gsm.jsonl"
    path.write_text("".join(json.dumps({"id": f"mine-{i}", "question": f"{i} + 1?",
                                        "answer": f"... #### {i + 1}"}) + "\n" for i in range(4)))
    assert task_rows("gsm8k", {"source": str(path)}) == 4               # not GSM8K's 1,319
    assert [r["task_id"] for r in load_task("gsm8k", source=str(path))] == [
        f"mine-{i}" for i in range(4)]


def test_check_names_the_key_of_each_problem(tmp_path, tiny_config):
    tiny_config["tasks"]["mine"] = {"benchmark": "local", "gen_length": 8,
                                    "source": str(tmp_path / "absent.jsonl"), "prompt": "{q}",
                                    "metric": "fuzzy", "fewshot": 2}
    assert problems(tiny_config) == [
        "tasks.mine.metric: 'fuzzy' is not one of exact, numeric, choice, code",
        "tasks.mine.fewshot_source: needed with fewshot > 0: a file of exemplars with the same "
        "fields (the scored rows are never exemplars)",
        f"tasks.mine.source: data file not found: {tmp_path / 'absent.jsonl'}"]


def test_a_bad_record_is_an_error_naming_file_record_and_field(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question": "?"}) + "\n")
    with pytest.raises(ValueError, match=r"record 0 lacks field 'answer'"):
        load_task("local", source=str(path), prompt="{question}")
    with pytest.raises(ValueError, match=r"prompt names field 'problem', which record 0"):
        load_task("local", source=str(path), prompt="{problem}")
    path.write_text(json.dumps({"question": "?", "answer": "many"}) + "\n")
    with pytest.raises(ValueError, match=r"answer 'many' is not a number \(metric numeric\)"):
        load_task("local", source=str(path), prompt="{question}", metric="numeric")
