"""Math benchmarks as task rows: GSM8K and MATH-500.

Prompts: the question with a request for a final ``####`` (GSM8K) or ``\\boxed{}`` (MATH-500)
answer; GSM8K few-shot exemplars come from a train-split file, never from the test rows.
"""
from __future__ import annotations

from pathlib import Path

from .spec import Benchmark, DataFile, counted
from .sources import read_records, require, resolve_source

GSM8K_INSTRUCTION = ("{question}\nPlease reason step by step, and write the final answer as a "
                     "number after \"####\".")
MATH_INSTRUCTION = ("{problem}\nPlease reason step by step, and put your final answer within "
                    "\\boxed{{}}.")


def load_gsm8k(source: str | None = None, fewshot: int = 0,
               fewshot_source: str | None = None) -> list[dict]:
    """GSM8K test split; the reference is the number after ``####``."""
    from ..scoring.extraction import gsm8k_strict

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
        out.append({"task_id": str(r.get("id") or f"gsm8k/{n}"),  # a file's own ids kept
                    "prompt": question, "kind": "math", "answer": answer,
                    "code_prefix": "", "test": "", "entry_point": ""})
    return out


def load_math500(source: str | None = None) -> list[dict]:
    """MATH-500 (``HuggingFaceH4/MATH-500``'s test.jsonl: problem, solution, answer, subject, level,
    unique_id; the answer from the solution's last ``\\boxed{}`` when the record has none)."""
    from ..scoring.extraction import last_boxed

    src = resolve_source("math500", source)
    out = []
    for n, r in enumerate(read_records("math500", src)):
        require("math500", src, r, ("problem",), n)
        answer = r.get("answer") or last_boxed(r.get("solution", ""))
        if not answer:
            raise ValueError(f"math500: malformed data file {src}: record {n} has no answer")
        out.append({"task_id": str(r.get("unique_id") or f"math500/{n}"),
                    "prompt": MATH_INSTRUCTION.format(problem=r["problem"]), "kind": "math",
                    "answer": str(answer), "code_prefix": "", "test": "", "entry_point": "",
                    "subtask": str(r.get("subject") or "")})
    return out


def _fewshot_block(fewshot: int, fewshot_source: str | None) -> str:
    if not fewshot:
        return ""
    if not fewshot_source:
        raise ValueError("gsm8k: fewshot needs fewshot_source (a train-split jsonl); test rows "
                         "are never used as exemplars")
    path = Path(fewshot_source)
    if not path.is_file():
        raise FileNotFoundError(f"gsm8k: fewshot data file not found: {path.absolute()}")
    shots = read_records("gsm8k", path)[:fewshot]
    return "".join(f"Question: {s['question']}\nAnswer: {s['answer']}\n\n" for s in shots)


BENCHMARKS = (  # GSM8K's prompt characters measured here, MATH-500's estimated
    Benchmark("gsm8k", load_gsm8k, (
        DataFile("source", "gsm8k"),
        DataFile("fewshot_source", None, lambda o: o["fewshot"] > 0, local=True,
                 why="needed with fewshot {fewshot} (a file of exemplars; test rows are never "
                     "used as exemplars)")), counted(1319), 321),
    Benchmark("math500", load_math500, (DataFile("source", "math500"),), counted(500), 300),
)
