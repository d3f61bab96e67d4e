"""Real-benchmark loaders: shapes and prompts, errors that name the file, subsets, the task file,
and the formats without local data here (LiveCodeBench, ET, MATH-500) on small synthetic files."""
from __future__ import annotations

import base64
import gzip
import json
import pickle
import sys
import zlib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from dlmpipe.cli import main as cli
from dlmpipe.scoring.code import Settings, parse_test
from dlmpipe.scoring.score import score_sample
from dlmpipe.tasks.sources import DATA_ENV, data_dirs, read_records, resolve_source
from dlmpipe.tasks.extract import defines
from dlmpipe.tasks.livecodebench import pickled_string
from dlmpipe.tasks.registry import TASK_COLUMNS, TASKS, load_task

SETTINGS = Settings(time_limit=10.0)


def have(name: str) -> bool:
    return any((d / name).is_file() for d in data_dirs())


def needs(name: str):
    return pytest.mark.skipif(not have(name), reason=f"{name} not in {DATA_ENV} or ../shared/data")


def test_registry_names():
    for name in ("humaneval", "humaneval_plus", "humaneval_et", "mbpp", "mbpp_plus", "mbpp_et",
                 "livecodebench", "gsm8k", "math500", "toy_code", "toy_arith", "bbh", "gpqa_main",
                 "gpqa_diamond", "mmlu_pro", "pubmedqa", "pubmedqa_test", "finqa"):
        assert name in TASKS


def test_humaneval_from_the_package_with_saber_prompts():
    rows = load_task("humaneval")
    assert len(rows) == 164 and all(set(TASK_COLUMNS) <= set(r) for r in rows)
    r = rows[0]
    assert r["task_id"] == "HumanEval/0" and r["kind"] == "code"
    assert r["prompt"].startswith("Write a solution to the following problem and make sure that "
                                  "it passes the tests:\n```python\n")
    assert r["response_prefix"] == "Here is the completed function:\n```python\n" + r["code_prefix"]
    assert r["test"].rstrip().endswith("check(has_close_elements)")
    base = load_task("humaneval", prompt_style="completion", limit=3)
    assert [b["prompt"] for b in base] == [b["code_prefix"] for b in base]
    assert base[0]["response_prefix"] == ""


@needs("HumanEvalPlus-v0.1.10.jsonl.gz")
def test_humaneval_plus_rows():
    rows = load_task("humaneval_plus")
    assert len(rows) == 164
    spec = parse_test(rows[32]["plus_test"])
    assert spec["format"] == "evalplus" and spec["oracle"] == "find_zero"
    assert len(parse_test(rows[0]["test"])["inputs"]) == 7


@needs("MbppPlus-v0.2.0.jsonl.gz")
def test_mbpp_plus_rows():
    rows = {r["task_id"]: r for r in load_task("mbpp_plus")}
    assert len(rows) == 378
    r = rows["Mbpp/2"]
    assert r["prompt"].startswith("You are an expert Python programmer. Please write a python "
                                  "function to solve the following problem:\n>>> Problem:\n")
    assert ">>> Test Cases:\nassert set(similar_elements" in r["prompt"]
    assert r["response_prefix"] == ">>> Code:\n```python\n"
    spec = parse_test(r["test"])
    assert spec["oracle"] == "set_eq"
    assert spec["inputs"][0][0] == {"__tuple__": [3, 4, 5, 6]}  # tuples survive JSON


@needs("sanitized-mbpp.json")
def test_mbpp_sanitized_427():
    rows = load_task("mbpp")
    assert len(rows) == 427
    assert all(r["entry_point"] and defines(r["answer"], r["entry_point"]) for r in rows)
    assert all(r["entry_point"] in r["test"] for r in rows)


@needs("gsm8k_test.jsonl")
def test_gsm8k_rows_and_fewshot_guard():
    rows = load_task("gsm8k", limit=5)
    assert [r["answer"] for r in rows][:1] == ["18"] and rows[0]["kind"] == "math"
    assert "####" in rows[0]["prompt"]
    with pytest.raises(ValueError, match="fewshot_source"):
        load_task("gsm8k", fewshot=4)


def test_limit_and_ids():
    rows = load_task("humaneval", ids=["HumanEval/3", "HumanEval/1"])
    assert [r["task_id"] for r in rows] == ["HumanEval/3", "HumanEval/1"]
    assert len(load_task("humaneval", limit=7)) == 7
    with pytest.raises(ValueError, match="unknown task id"):
        load_task("humaneval", ids=["HumanEval/999"])


def test_missing_and_malformed_files_name_the_file(tmp_path, monkeypatch):
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        load_task("humaneval_plus", source=str(missing))
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"task_id": "HumanEval/0"}\nnot json\n')
    with pytest.raises(ValueError, match="bad.jsonl.*line 2"):
        load_task("gsm8k", source=str(bad))
    lacking = tmp_path / "lacking.jsonl"
    lacking.write_text('{"task_id": "HumanEval/0", "prompt": "x"}\n')
    with pytest.raises(ValueError, match="lacking.jsonl.*lacks"):
        load_task("humaneval_plus", source=str(lacking))
    gz = tmp_path / "broken.jsonl.gz"
    gz.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(ValueError, match="broken.jsonl.gz"):
        load_task("mbpp_plus", source=str(gz))
    # reading a dataset id needs the datasets package: as where it is not installed (it is
    # here, with lm-eval), read_records says so before fetching anything (load_task first pins
    # the id's revision on the hub, which needs the network)
    monkeypatch.setitem(sys.modules, "datasets", None)  # `import datasets` raises ImportError
    with pytest.raises(ValueError, match="gsm8k: 'openai/gsm8k:main' is not a local file.*"
                                         "needs the `datasets` package"):
        read_records("gsm8k", "openai/gsm8k:main")


def test_default_lookup_uses_env_dir(tmp_path, monkeypatch):
    (tmp_path / "gsm8k_test.jsonl").write_text(json.dumps(
        {"question": "1+1?", "answer": "1+1=2\n#### 2"}) + "\n")
    monkeypatch.setenv(DATA_ENV, str(tmp_path))
    assert resolve_source("gsm8k", None) == (tmp_path / "gsm8k_test.jsonl").resolve()
    assert load_task("gsm8k")[0]["answer"] == "2"


def test_prepare_task_writes_optional_columns(tmp_path):
    out = tmp_path / "tasks" / "humaneval.parquet"
    assert cli(["prepare-task", "--name", "humaneval", "--options", '{"limit": 3}',
                "--out", str(out)]) == 0
    table = pq.read_table(out)
    assert table.column_names == TASK_COLUMNS + ["response_prefix"]
    assert table.num_rows == 3
    toy = tmp_path / "toy.parquet"
    assert cli(["prepare-task", "--name", "toy_arith", "--options", '{"n": 2}', "--out", str(toy)]) == 0
    assert pq.read_table(toy).column_names == TASK_COLUMNS


def test_saber_style_generations_score_end_to_end():
    """What a chat model emits after the HumanEval response prefix, scored in the sandbox."""
    row = load_task("humaneval", ids=["HumanEval/2"])[0]  # truncate_number
    good = "    return number % 1.0\n```\n\nThe function returns the decimal part."
    bad = "    return number\n```"
    assert score_sample(row, good, SETTINGS)["passed"]
    assert not score_sample(row, bad, SETTINGS)["passed"]


# ---------------------------------------------------------------------------------------------
# Formats with no local data here: synthetic files in the real layouts


def _lcb_private(cases: list[dict]) -> str:
    return base64.b64encode(zlib.compress(pickle.dumps(json.dumps(cases)))).decode()


def _lcb_file(tmp_path: Path, private: str | None = None) -> Path:
    stdin_cases = [{"input": "3\n1 2 3\n", "output": "6\n", "testtype": "stdin"}]
    hidden = [{"input": "2\n10 -4\n", "output": "6", "testtype": "stdin"},
              {"input": "1\n7\n", "output": "7\n", "testtype": "stdin"}]
    functional = [{"input": "[1, 2, 3]\n2", "output": "[3, 4, 5]", "testtype": "functional"}]
    rows = [
        {"question_id": "abc001_a", "question_title": "Sum", "question_content": "Sum N numbers.",
         "platform": "atcoder", "starter_code": "", "difficulty": "easy",
         "public_test_cases": json.dumps(stdin_cases),
         "private_test_cases": private or _lcb_private(hidden), "metadata": "{}"},
        {"question_id": "lc-add", "question_title": "Add", "question_content": "Add k to each.",
         "platform": "leetcode", "difficulty": "easy",
         "starter_code": "class Solution:\n    def addAll(self, nums: List[int], k: int) -> List[int]:\n",
         "public_test_cases": json.dumps(functional), "private_test_cases": "[]",
         "metadata": json.dumps({"func_name": "addAll"})},
    ]
    path = tmp_path / "lcb.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_livecodebench_stdin_and_functional(tmp_path):
    rows = {r["task_id"]: r for r in load_task("livecodebench", source=str(_lcb_file(tmp_path)))}
    stdin_row, func_row = rows["abc001_a"], rows["lc-add"]
    assert parse_test(stdin_row["test"])["format"] == "stdin"
    assert len(parse_test(stdin_row["test"])["cases"]) == 3
    assert "Read the inputs from stdin" in stdin_row["prompt"]
    assert "```python\nclass Solution:" in func_row["prompt"]
    stdin_ok = ("Here you go:\n```python\nimport sys\ndata = sys.stdin.read().split()\n"
                "n = int(data[0])\nprint(sum(map(int, data[1:1 + n])))\n```")
    stdin_open0 = "```python\nvals = open(0).read().split()\nprint(sum(map(int, vals[1:])))\nexit(0)\n```"
    stdin_bad = "```python\nprint(input())\n```"
    assert score_sample(stdin_row, stdin_ok, SETTINGS)["passed"]
    assert score_sample(stdin_row, stdin_open0, SETTINGS)["passed"]
    assert not score_sample(stdin_row, stdin_bad, SETTINGS)["passed"]
    func_ok = ("```python\nfrom typing import List\nclass Solution:\n"
               "    def addAll(self, nums: List[int], k: int) -> List[int]:\n"
               "        return tuple(x + k for x in nums)\n```")
    func_bad = func_ok.replace("x + k", "x - k")
    assert score_sample(func_row, func_ok, SETTINGS)["passed"]
    assert not score_sample(func_row, func_bad, SETTINGS)["passed"]


def test_livecodebench_refuses_code_in_pickles(tmp_path):
    marker = tmp_path / "executed"

    class Exploit:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    evil = base64.b64encode(zlib.compress(pickle.dumps(Exploit()))).decode()
    with pytest.raises(ValueError, match="lcb.jsonl"):
        load_task("livecodebench", source=str(_lcb_file(tmp_path, private=evil)))
    assert not marker.exists()


def test_humaneval_et(tmp_path):
    et = [{"task_id": "HumanEval/2", "prompt": "", "entry_point": "truncate_number",
           "test_case_list": ["assert truncate_number(3.5) == 0.5",
                              "assert abs(truncate_number(1.33) - 0.33) < 1e-6",
                              "assert truncate_number(123.0) == 0.0"]},
          {"task_id": "HumanEval/4", "entry_point": "mean_absolute_deviation",
           "test": "def check(candidate):\n    assert abs(candidate([1.0, 2.0]) - 0.5) < 1e-6\n"}]
    path = tmp_path / "HumanEval_ET.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in et))
    rows = {r["task_id"]: r for r in load_task("humaneval_et", source=str(path))}
    assert set(rows) == {"HumanEval/2", "HumanEval/4"}
    good = "    return number % 1.0\n```"
    only_base = "    return number % 1.0 if number % 1.0 else 1.0\n```"  # wrong on whole numbers
    assert score_sample(rows["HumanEval/2"], good, SETTINGS)["plus_passed"] is True
    r = score_sample(rows["HumanEval/2"], only_base, SETTINGS)
    assert r["passed"] is True and r["plus_passed"] is False
    mad = ("    m = sum(numbers) / len(numbers)\n"
           "    return sum(abs(x - m) for x in numbers) / len(numbers)\n```")
    assert score_sample(rows["HumanEval/4"], mad, SETTINGS)["plus_passed"] is True


@pytest.mark.skipif(not have("sanitized-mbpp.json"), reason="sanitized-mbpp.json not found")
def test_mbpp_et(tmp_path):
    et = [{"task_id": 2, "text": "shared elements", "code": "",
           "test_list": ["assert set(similar_elements((1, 2), (2, 3))) == {2}",
                         "assert similar_elements((), (1,)) == ()"]}]
    path = tmp_path / "MBPP_ET.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in et))
    rows = load_task("mbpp_et", source=str(path))
    assert [r["task_id"] for r in rows] == ["Mbpp/2"]
    good = "def similar_elements(a, b):\n    return tuple(set(a) & set(b))\n```"
    assert score_sample(rows[0], good, SETTINGS)["plus_passed"] is True


def test_math500_local_file(tmp_path):
    path = tmp_path / "math.jsonl"
    path.write_text(json.dumps({"problem": "What is 1/2 + 1/4?", "answer": "\\frac{3}{4}",
                                "unique_id": "test/algebra/1.json"}) + "\n"
                    + json.dumps({"problem": "2+2?", "solution": "It is \\boxed{4}."}) + "\n")
    rows = load_task("math500", source=str(path))
    assert [r["answer"] for r in rows] == ["\\frac{3}{4}", "4"]
    assert rows[0]["task_id"] == "test/algebra/1.json" and "\\boxed{}" in rows[0]["prompt"]
    assert score_sample(rows[0], "so the answer is $\\boxed{\\dfrac34}$", SETTINGS)["passed"]
    assert score_sample(rows[0], "\\boxed{0.75}", SETTINGS)["passed"]
    assert not score_sample(rows[1], "\\boxed{5}", SETTINGS)["passed"]


# ---------------------------------------------------------------------------------------------
# Release-format fixtures (tests/data) and the shipped HumanEval-ET file

DATA = Path(__file__).resolve().parent / "data"


@pytest.mark.parametrize("protocol", [2, 3, 4, 5])
@pytest.mark.parametrize("size", [3, 300, 70_000])  # SHORT_BINUNICODE, framed and unframed BINUNICODE
def test_pickled_strings_are_read_without_unpickling(protocol, size):
    text = json.dumps([{"input": "x" * size, "output": "é"}])
    assert pickled_string(pickle.dumps(text, protocol=protocol)) == text


@pytest.mark.parametrize("value", [["a list"], {"a": "dict"}, ("a", "tuple"), 42, b"bytes"])
def test_pickles_of_anything_but_a_string_are_refused(value):
    with pytest.raises(ValueError):
        pickled_string(pickle.dumps(value))


def test_livecodebench_release_fixture():
    rows = {r["task_id"]: r for r in load_task("livecodebench", source=str(DATA / "livecodebench_release_v1.jsonl"))}
    assert set(rows) == {"abc900_a", "9001"}
    stdin_spec, func_spec = parse_test(rows["abc900_a"]["test"]), parse_test(rows["9001"]["test"])
    assert stdin_spec["format"] == "stdin" and len(stdin_spec["cases"]) == 3
    assert func_spec["format"] == "functional" and func_spec["entry_point"] == "addK"
    assert len(func_spec["cases"]) == 3
    stdin_ok = "```python\nn, *xs = open(0).read().split()\nprint(sum(map(int, xs)))\n```"
    assert score_sample(rows["abc900_a"], stdin_ok, SETTINGS)["passed"]
    assert not score_sample(rows["abc900_a"], stdin_ok.replace("sum(", "max("), SETTINGS)["passed"]
    func_ok = ("```python\nclass Solution:\n    def addK(self, nums, k):\n"
               "        return [x + k for x in nums]\n```")
    assert score_sample(rows["9001"], func_ok, SETTINGS)["passed"]
    assert not score_sample(rows["9001"], func_ok.replace("x + k", "x + 1"), SETTINGS)["passed"]


@pytest.mark.skipif(not have("sanitized-mbpp.json"), reason="sanitized-mbpp.json not found")
def test_mbpp_et_release_fixture():
    rows = {r["task_id"]: r for r in load_task("mbpp_et", source=str(DATA / "MBPP_ET.jsonl"))}
    assert set(rows) == {"Mbpp/2", "Mbpp/3"}
    for row in rows.values():  # the reference solutions pass base and ET
        result = score_sample(row, row["answer"] + "\n```", SETTINGS)
        assert result["passed"] and result["plus_passed"], result
    # right on MBPP's own asserts (2, 10, 35, 37), wrong on ET's 91 = 7 * 13
    small_primes = "def is_not_prime(n):\n    return any(n % p == 0 for p in (2, 3, 5) if p < n)\n```"
    result = score_sample(rows["Mbpp/3"], small_primes, SETTINGS)
    assert result["passed"] is True and result["plus_passed"] is False


# HumanEval-ET's own defects: /2 compares floats exactly, the others split a loop's asserts from
# the loop (NameError); every completion, the canonical one included, fails their ET suites
ET_UPSTREAM_DEFECTS = ["HumanEval/2", "HumanEval/38", "HumanEval/44", "HumanEval/50",
                       "HumanEval/53", "HumanEval/151"]


@needs("HumanEval_ET.jsonl.gz")
def test_humaneval_et_release_file():
    rows = {r["task_id"]: r for r in load_task("humaneval_et")}  # default lookup finds the .gz
    assert len(rows) == 164
    with gzip.open(next(d for d in data_dirs() if (d / "HumanEval_ET.jsonl.gz").is_file())
                   / "HumanEval_ET.jsonl.gz", "rt") as f:
        et = {r["task_id"]: r for r in map(json.loads, f)}
    assert all(rows[t]["plus_test"].count("\nassert ") == len(et[t]["test_case_list"]) for t in rows)
    for task_id in ET_UPSTREAM_DEFECTS + ["HumanEval/0", "HumanEval/32", "HumanEval/163"]:
        result = score_sample(rows[task_id], rows[task_id]["answer"] + "```", SETTINGS)
        assert result["passed"], (task_id, result)
        assert result["plus_passed"] is (task_id not in ET_UPSTREAM_DEFECTS), (task_id, result)
