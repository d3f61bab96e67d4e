"""Multiple-choice benchmarks as task rows: GPQA (main, diamond) and MMLU-Pro.

Rows are ``choice`` tasks: ``answer`` is the letter, ``choices`` the option texts in letter order
(docs/SCORING.md lists the extraction rules: "The answer is (C)", "Answer: C", ...).

- GPQA: the release CSV (``Question``, ``Correct Answer``, ``Incorrect Answer 1-3``, ``Record ID``;
  ``gpqa_main.csv`` 448 rows, ``gpqa_diamond.csv`` 198) or the dataset id
  ``Idavidrein/gpqa:gpqa_main``. The four options are shuffled per question with a fixed seed
  (``seed``, default 0, and the record id), the correct letter recorded. Prompt: GPQA's zero-shot
  prompt ("What is the correct answer to this question: ...\\n\\nChoices:\\n(A) ...\\n\\nFormat your
  response as follows: "The correct answer is (insert answer here)"") and its chain-of-thought
  cue "Let's think step by step:".
- MMLU-Pro: the release's test split (``question_id``, ``question``, ``options`` (up to 10; "N/A"
  padding dropped), ``answer``, ``answer_index``, ``category``, ``cot_content``) from a parquet,
  json or jsonl file, or ``TIGER-Lab/MMLU-Pro``. Prompt: MMLU-Pro's own chain-of-thought prompt
  (``evaluate_from_local.py``): "The following are multiple choice questions (with answers)
  about {category}. Think step by step and then finish your answer with "the answer is (X)" where
  X is the correct letter choice.", then ``fewshot`` (5) exemplars of the same category from the
  validation split with their ``cot_content``, then "Question:\\n...\\nOptions:\\nA. ...", continued
  from "Answer: Let's think step by step." (``response_prefix``). ``subtasks`` keeps categories.
"""
from __future__ import annotations

import json
import random

from .spec import Benchmark, DataFile, counted, is_dataset_id
from .sources import option_list, read_records, require, resolve_source

LETTERS = "ABCDEFGHIJKLMNOP"
GPQA_INSTRUCTION = ("What is the correct answer to this question: {question}\n\nChoices:\n{choices}"
                    "\n\nFormat your response as follows: \"The correct answer is (insert answer "
                    "here)\"\nLet's think step by step:")
MMLU_PRO_HEADER = ("The following are multiple choice questions (with answers) about {category}. "
                   "Think step by step and then finish your answer with \"the answer is (X)\" "
                   "where X is the correct letter choice.\n\n")
MMLU_PRO_PREFIX = "Answer: Let's think step by step."
_GPQA_KEYS = ("Question", "Correct Answer", "Incorrect Answer 1", "Incorrect Answer 2",
              "Incorrect Answer 3")
_MMLU_PRO_KEYS = ("question_id", "question", "options", "answer", "category")


def load_gpqa_main(source: str | None = None, seed: int = 0) -> list[dict]:
    """GPQA main (448 questions)."""
    return load_gpqa("gpqa_main", source, seed)


def load_gpqa_diamond(source: str | None = None, seed: int = 0) -> list[dict]:
    """GPQA diamond (198 questions)."""
    return load_gpqa("gpqa_diamond", source, seed)


def load_gpqa(task: str, source: str | None, seed: int) -> list[dict]:
    src = resolve_source(task, source)
    out = []
    for n, r in enumerate(read_records(task, src, "train")):
        require(task, src, r, _GPQA_KEYS, n)
        record = str(r.get("Record ID") or n)
        options = [_clean(r[k]) for k in _GPQA_KEYS[1:]]
        order = list(range(4))
        random.Random(f"{seed}:{record}").shuffle(order)
        shuffled = [options[i] for i in order]
        letter = LETTERS[order.index(0)]
        choices = "\n".join(f"({LETTERS[i]}) {text}" for i, text in enumerate(shuffled))
        out.append({"task_id": f"{task}/{record}", "kind": "choice", "answer": letter,
                    "choices": json.dumps(shuffled),
                    "prompt": GPQA_INSTRUCTION.format(question=_clean(r["Question"]), choices=choices),
                    "code_prefix": "", "test": "", "entry_point": "",
                    "subtask": str(r.get("High-level domain") or "")})
    return out


def load_mmlu_pro(source: str | None = None, fewshot: int = 5, fewshot_source: str | None = None,
                  subtasks: list[str] | None = None) -> list[dict]:
    """MMLU-Pro test split (12,032 questions in 14 categories)."""
    src = resolve_source("mmlu_pro", source)
    rows = _mmlu_pro_rows("mmlu_pro", src, read_records("mmlu_pro", src, "test"))
    categories = sorted({r["category"] for r in rows})
    unknown = sorted(set(subtasks or ()) - set(categories))
    if unknown:
        raise ValueError(f"mmlu_pro: unknown categories {unknown}; {src} has {categories}")
    shots = _mmlu_pro_shots(src, fewshot, fewshot_source)
    out = []
    for r in rows:
        if subtasks and r["category"] not in subtasks:
            continue
        examples = shots.get(r["category"], [])[:fewshot]
        if len(examples) < fewshot:
            raise ValueError(f"mmlu_pro: the validation split has {len(examples)} exemplars of "
                             f"{r['category']!r}, fewer than fewshot={fewshot}")
        prompt = (MMLU_PRO_HEADER.format(category=r["category"])
                  + "".join(_mmlu_pro_question(s) + _cot(s) + "\n\n" for s in examples)
                  + _mmlu_pro_question(r))
        out.append({"task_id": f"mmlu_pro/{r['question_id']}", "kind": "choice",
                    "answer": r["answer"], "choices": json.dumps(r["options"]), "prompt": prompt,
                    "response_prefix": MMLU_PRO_PREFIX, "code_prefix": "", "test": "",
                    "entry_point": "", "subtask": r["category"]})
    return out


def _mmlu_pro_rows(task: str, src, records: list[dict]) -> list[dict]:
    """Records with their "N/A" padding options dropped and the answer letter checked."""
    out = []
    for n, r in enumerate(records):
        require(task, src, r, _MMLU_PRO_KEYS, n)
        options = option_list(r["options"])
        if options is None:
            raise ValueError(f"{task}: malformed data file {src}: record {n}: options is not a list")
        options = [str(o) for o in options if o != "N/A"]
        answer = str(r["answer"]).strip()
        if answer not in LETTERS[:len(options)]:
            raise ValueError(f"{task}: malformed data file {src}: record {n}: answer {answer!r} "
                             f"is not one of its {len(options)} options")
        out.append({**r, "options": options, "answer": answer, "category": str(r["category"])})
    return out


def _mmlu_pro_shots(src, fewshot: int, fewshot_source: str | None) -> dict[str, list[dict]]:
    """Validation exemplars by category: from ``fewshot_source``, the dataset id's validation
    split, or the default validation file; the test split is never used."""
    if not fewshot:
        return {}
    if fewshot_source:
        val = resolve_source("mmlu_pro_validation", fewshot_source, "fewshot_source")
    elif isinstance(src, str):
        val = src  # a dataset id: its validation split
    else:
        val = resolve_source("mmlu_pro_validation", None, "fewshot_source")
    records = _mmlu_pro_rows("mmlu_pro", val, read_records("mmlu_pro", val, "validation"))
    by_category: dict[str, list[dict]] = {}
    for r in records:
        if not r.get("cot_content"):
            raise ValueError(f"mmlu_pro: exemplar {r['question_id']} of {val} has no cot_content")
        by_category.setdefault(r["category"], []).append(r)
    return by_category


def _mmlu_pro_question(r: dict) -> str:
    options = "".join(f"{LETTERS[i]}. {o}\n" for i, o in enumerate(r["options"]))
    return f"Question:\n{r['question']}\nOptions:\n{options}"


def _cot(r: dict) -> str:
    return str(r["cot_content"]).replace("A: Let's think step by step.", MMLU_PRO_PREFIX)


def _clean(text) -> str:
    return str(text or "").strip()


BENCHMARKS = (  # prompt characters estimated (MMLU-Pro: 5-shot chain of thought)
    Benchmark("gpqa_main", load_gpqa_main, (DataFile("source", "gpqa_main"),), counted(448), 800),
    Benchmark("gpqa_diamond", load_gpqa_diamond, (DataFile("source", "gpqa_diamond"),),
              counted(198), 800),
    Benchmark("mmlu_pro", load_mmlu_pro, (
        DataFile("source", "mmlu_pro"),
        # a dataset id as source brings its own validation split
        DataFile("fewshot_source", "mmlu_pro_validation",
                 lambda o: o["fewshot"] > 0 and (o.get("fewshot_source")
                                                 or not is_dataset_id(o.get("source"))))),
        counted(12032), 7000,
        subtask_rows={"biology": 717, "business": 789, "chemistry": 1132, "computer science": 410,
                      "economics": 844, "engineering": 969, "health": 818, "history": 381,
                      "law": 1101, "math": 1351, "other": 924, "philosophy": 499, "physics": 1299,
                      "psychology": 798}),
)
