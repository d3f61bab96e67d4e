"""BIG-Bench Hard as task rows: one ``bbh`` task over the 27 subtasks (or those named).

Source: the BBH release directory (suzgunmirac/BIG-Bench-Hard ``bbh/``): ``<subtask>.json``
(``{"examples": [{"input", "target"}]}``) and ``cot-prompts/<subtask>.txt`` (a canary line,
``-----``, the task description and three chain-of-thought exemplars).

Prompt (the BBH paper's chain-of-thought setting, as lm-evaluation-harness's ``bbh_cot_fewshot``):
the task description and ``fewshot`` exemplars (3 by default), then "Q: {input}"; the response
continues "A: Let's think step by step." (``response_prefix``), and the exemplars end with
"So the answer is X.". Scoring by the subtask's answer form (``subtask`` column; per-subtask
accuracy in the summary): multiple choice (``choice``, the options parsed from the input),
True/False, Yes/No, valid/invalid (``label``), counts and arithmetic (``math``), Dyck languages and
word sorting (``text``, exact). Three items whose target is an option text rather than a letter
(broken options upstream: movie_recommendation 163, ruin_names 99 and 144) are ``text`` items.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from .spec import Benchmark, DataFile
from .sources import read_json, resolve_source

SUBTASKS = (
    "boolean_expressions", "causal_judgement", "date_understanding", "disambiguation_qa",
    "dyck_languages", "formal_fallacies", "geometric_shapes", "hyperbaton",
    "logical_deduction_five_objects", "logical_deduction_seven_objects",
    "logical_deduction_three_objects", "movie_recommendation", "multistep_arithmetic_two",
    "navigate", "object_counting", "penguins_in_a_table", "reasoning_about_colored_objects",
    "ruin_names", "salient_translation_error_detection", "snarks", "sports_understanding",
    "temporal_sequences", "tracking_shuffled_objects_five_objects",
    "tracking_shuffled_objects_seven_objects", "tracking_shuffled_objects_three_objects",
    "web_of_lies", "word_sorting")
# the subtasks that are not multiple choice, by answer form
LABELS = {"boolean_expressions": ["True", "False"], "causal_judgement": ["Yes", "No"],
          "formal_fallacies": ["valid", "invalid"], "navigate": ["Yes", "No"],
          "sports_understanding": ["yes", "no"], "web_of_lies": ["Yes", "No"]}
NUMBERS = ("multistep_arithmetic_two", "object_counting")
TEXTS = ("dyck_languages", "word_sorting")
RESPONSE_PREFIX = "A: Let's think step by step.\n"


def load_bbh(source: str | None = None, subtasks: list[str] | None = None,
             fewshot: int = 3) -> list[dict]:
    """BBH rows, subtask by subtask in ``SUBTASKS`` order (6,511 over all 27)."""
    root = Path(resolve_source("bbh", source))
    if not root.is_dir():
        raise ValueError(f"bbh: {root} is not the BBH directory (<subtask>.json, cot-prompts/)")
    unknown = sorted(set(subtasks or ()) - set(SUBTASKS))
    if unknown:
        raise ValueError(f"bbh: unknown subtask(s) {unknown}; known: {', '.join(SUBTASKS)}")
    if not 0 <= fewshot <= 3:
        raise ValueError(f"bbh: fewshot must be 0 to 3 (the exemplars of cot-prompts), not {fewshot}")
    out = []
    for name in [s for s in SUBTASKS if not subtasks or s in subtasks]:
        path = root / f"{name}.json"
        data = read_json("bbh", path)
        if not isinstance(data, dict) or not isinstance(data.get("examples"), list):
            raise ValueError(f"bbh: malformed data file {path}: expected {{\"examples\": [...]}}")
        header = cot_prompt(root, name, fewshot)
        for i, example in enumerate(data["examples"]):
            if not isinstance(example, dict) or not {"input", "target"} <= set(example):
                raise ValueError(f"bbh: malformed data file {path}: example {i} lacks input/target")
            out.append({"task_id": f"bbh/{name}/{i}", "subtask": name,
                        "prompt": f"{header}Q: {example['input']}\n",
                        "response_prefix": RESPONSE_PREFIX, "code_prefix": "", "test": "",
                        "entry_point": "", **_answer(name, example, path, i)})
    return out


def cot_prompt(root: Path, name: str, fewshot: int) -> str:
    """The task description and the first ``fewshot`` chain-of-thought exemplars, each ending
    in a blank line."""
    path = root / "cot-prompts" / f"{name}.txt"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise FileNotFoundError(f"bbh: chain-of-thought prompt missing: {path} ({e})") from None
    body = text.split("-----\n", 1)[-1].strip()
    parts = re.split(r"\n\n(?=Q: )", body)
    if len(parts) < 4:
        raise ValueError(f"bbh: malformed prompt file {path}: expected a description and 3 exemplars")
    return "".join(p.strip() + "\n\n" for p in parts[:1 + fewshot])


def options_of(question: str) -> list[str]:
    """The option texts of a multiple-choice input ("Options:\\n(A) ...\\n(B) ...")."""
    return [m.group(2).strip() for m in re.finditer(r"^\(([A-Z])\)\s*(.*)$", question, re.M)]


def _answer(name: str, example: dict, path: Path, i: int) -> dict:
    target = str(example["target"]).strip()
    if name in LABELS:
        if target not in LABELS[name]:
            raise ValueError(f"bbh: malformed data file {path}: example {i}: target {target!r} "
                             f"is not one of {LABELS[name]}")
        return {"kind": "label", "answer": target, "choices": json.dumps(LABELS[name])}
    if name in NUMBERS:
        if not re.fullmatch(r"-?\d+", target):
            raise ValueError(f"bbh: malformed data file {path}: example {i}: target {target!r} "
                             "is not a number")
        return {"kind": "math", "answer": target}
    letter = re.fullmatch(r"\(([A-Z])\)", target)
    if name in TEXTS or not letter:
        return {"kind": "text", "answer": target}
    options = options_of(example["input"])
    if ord(letter.group(1)) - ord("A") >= len(options):
        raise ValueError(f"bbh: malformed data file {path}: example {i}: target {target} is not "
                         f"among its {len(options)} options")
    return {"kind": "choice", "answer": letter.group(1), "choices": json.dumps(options)}


BENCHMARKS = (  # 250 rows per task but three; prompt characters measured here
    Benchmark("bbh", load_bbh, (DataFile("source", "bbh"),), 6511, 3165,
              subtask_rows={"causal_judgement": 187, "penguins_in_a_table": 146, "snarks": 178,
                            "*": 250}),
)
