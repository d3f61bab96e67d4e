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
    with pytest.raises(ValueError, match=rf"answer: record 0 of {path} lacks field 'answer'"):
        load_task("local", source=str(path), prompt="{question}")
    with pytest.raises(ValueError, match=r"prompt: the prompt names field 'problem', which record 0"):
        load_task("local", source=str(path), prompt="{problem}")
    path.write_text(json.dumps({"question": "?", "answer": "many"}) + "\n")
    with pytest.raises(ValueError, match=r"'many' is not a number \(metric numeric\)"):
        load_task("local", source=str(path), prompt="{question}", metric="numeric")


# ---- the records' fields, read by `check` and `plan` before any job -----------------------------
COUNTRIES = [{"qid": "c1", "country": "France", "capital": "Paris"},
             {"qid": "c2", "country": "Peru", "capital": "Lima"},
             {"qid": "c3", "country": "Chad"}]


def countries(tmp_path, rows=COUNTRIES) -> str:
    path = tmp_path / "countries.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


@pytest.mark.parametrize("check_paths", [True, False], ids=["check", "plan"])
def test_check_and_plan_report_every_field_problem_naming_field_record_and_file(
        tmp_path, tiny_config, check_paths):
    """The issue's mistakes (a misspelt template field, a wrong answer field, a record lacking
    the answer) each a problem of `check` and of `plan` (which checks no checkpoint and no
    downloadable data, but the campaign's own files), all at once, each naming its option,
    the field, the first record and the file."""
    source = countries(tmp_path)
    tiny_config["tasks"]["capitals"] = {"benchmark": "local", "gen_length": 8, "source": source,
                                        "prompt": "Capital of {contry}?", "answer": "capital",
                                        "id": "qid"}
    tiny_config["tasks"]["capitals2"] = {"benchmark": "local", "gen_length": 8, "source": source,
                                         "prompt": "Capital of {country}?", "answer": "captial"}
    tiny_config["tasks"]["capitals3"] = {"benchmark": "local", "gen_length": 8, "source": source,
                                         "prompt": "Capital of {country}?", "answer": "capital",
                                         "id": "code"}
    assert problems(tiny_config, check_paths=check_paths) == [
        f"tasks.capitals.prompt: the prompt names field 'contry', which record 0 of {source} lacks "
        "(its fields: qid, country, capital) (3 records in all)",
        f"tasks.capitals.answer: record 2 of {source} lacks field 'capital' (its fields: qid, "
        "country)",
        f"tasks.capitals2.answer: record 0 of {source} lacks field 'captial' (its fields: qid, "
        "country, capital) (3 records in all)",
        f"tasks.capitals3.id: record 0 of {source} has no field 'code' (its id would be "
        "countries/0; its fields: qid, country, capital) (3 records in all)",
        f"tasks.capitals3.answer: record 2 of {source} lacks field 'capital' (its fields: qid, "
        "country)"]


def test_ids_fewshot_and_choices_are_read_before_any_job(tmp_path, tiny_config):
    """Duplicate or missing ids, a few-shot file too short or lacking a field, options that are
    not a list: each named with its record and file."""
    rows = [{"id": "a", "q": "?", "opts": ["x", "y"], "answer": "x"},
            {"id": "a", "q": "?", "opts": "x or y", "answer": "y"},
            {"q": "?", "opts": ["x", "y"], "answer": "z"}]
    source = tmp_path / "mc.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in rows))
    shots = tmp_path / "shots.jsonl"
    shots.write_text(json.dumps({"q": "?", "opts": ["x", "y"]}) + "\n")
    tiny_config["tasks"]["mc"] = {"benchmark": "local", "gen_length": 8, "source": str(source),
                                  "prompt": "{q}\n{choices}", "metric": "choice",
                                  "choices": "opts", "fewshot": 2, "fewshot_source": str(shots)}
    assert problems(tiny_config) == [
        f"tasks.mc.fewshot: 2 exemplars, but {shots} holds 1 record",
        f"tasks.mc.fewshot_source: record 0 of {shots} lacks field 'answer' (its fields: q, opts)",
        f"tasks.mc.choices: record 1 of {source}: field 'opts' is not a list of options (nor a "
        "JSON list)",
        f"tasks.mc.id: record 2 of {source} has no field 'id' (its id would be mc/2; its fields: "
        "q, opts, answer)",
        f"tasks.mc.answer: record 2 of {source}: 'z' is neither a letter of its 2 options nor one "
        "of them"]
    source.write_text("".join(json.dumps(r) + "\n" for r in [rows[0], rows[0]]))
    shots.write_text("".join(json.dumps(rows[0]) + "\n" for _ in range(2)))
    assert problems(tiny_config) == [
        f"tasks.mc.id: records 0 and 1 of {source} share the id 'a' (each sample's id must be "
        "unique)"]


def test_plan_refuses_a_missing_or_empty_file_instead_of_counting_0_rows(tmp_path, tiny_config,
                                                                          write_config, capsys):
    from dlmpipe.cli import main

    missing = tmp_path / "absent.jsonl"
    tiny_config["tasks"]["mine"] = {"benchmark": "local", "gen_length": 8, "source": str(missing),
                                    "prompt": "{q}"}
    config = write_config(tiny_config, tmp_path / "c.yaml")
    assert main(["plan", str(config)]) == 2
    assert f"tasks.mine.source: data file not found: {missing}" in capsys.readouterr().err
    missing.write_text("")
    assert main(["plan", str(config)]) == 2
    assert f"tasks.mine.source: {missing} holds no records" in capsys.readouterr().err


# ---- relative paths: against the campaign file's folder; "not found" names the absolute path ----
def test_relative_paths_resolve_against_the_campaign_files_folder(tmp_path, tiny_config,
                                                                  write_config, monkeypatch):
    from dlmpipe.campaign import ConfigError, load_campaign

    folder = tmp_path / "campaign"
    folder.mkdir()
    (folder / "q.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    tiny_config["tasks"]["mine"] = {"benchmark": "local", "gen_length": 8, "source": "q.jsonl",
                                    "prompt": "{question}", "id": "qid"}
    config = write_config(tiny_config, folder / "c.yaml")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    campaign = load_campaign([config])
    assert campaign.task_options("mine")["source"] == str(folder / "q.jsonl")  # what the job reads
    # a later file's relative path is relative to that file's folder; every "not found" is
    # absolute and says what the relative path was relative to
    (tmp_path / "over.yaml").write_text("tasks: {mine: {source: data/absent.jsonl}}\n"
                                        "backbones: {real: {path: ckpt}}\n")
    with pytest.raises(ConfigError) as e:
        load_campaign([config, tmp_path / "over.yaml"])
    assert e.value.problems == [
        f"backbones.real.path: {tmp_path / 'ckpt'} is not a directory (given as 'ckpt' in "
        f"{tmp_path / 'over.yaml'}, relative to its folder)",
        f"tasks.mine.source: data file not found: {tmp_path / 'data' / 'absent.jsonl'} (given as "
        f"'data/absent.jsonl' in {tmp_path / 'over.yaml'}, relative to its folder)"]
