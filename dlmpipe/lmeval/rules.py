"""dlmpipe's own answer rule for an lm-eval task's doc, where dlmpipe scores that benchmark.

An lm-eval task in a campaign gets two verdicts (docs/SCORING.md, "lm-evaluation-harness"):
lm-eval's filters and metric, and dlmpipe's extraction with the answer kind its own loader gives
the same benchmark (dlmpipe/tasks/). This maps lm-eval task names to that kind and reference:
GSM8K's tasks (the number after ``####``, ``math``) and BBH's generative tasks (each subtask's
form: ``choice`` over the options, ``label``, ``math`` or ``text``, as tasks/bbh.py reads it).
Other tasks have no dlmpipe rule: only lm-eval's verdict.
"""
from __future__ import annotations

import re

from ..tasks.bbh import SUBTASKS, _answer as bbh_answer

#: lm-eval's BBH task names: bbh_{cot_fewshot,cot_zeroshot,fewshot,zeroshot}_<subtask>
BBH = re.compile(r"^bbh_(?:cot_fewshot|cot_zeroshot|fewshot|zeroshot)_(\w+)$")


def dlmpipe_rule(task: str, doc: dict) -> dict | None:
    """The task-row fields dlmpipe's scorer reads (``kind``, ``answer``, maybe ``choices``,
    ``subtask``) for ``doc`` of lm-eval task ``task``; None where dlmpipe has no rule."""
    if task == "gsm8k" or task.startswith("gsm8k_"):
        from ..scoring.extraction import gsm8k_strict

        answer = gsm8k_strict(str(doc.get("answer", "")))
        return None if answer is None else {"kind": "math", "answer": answer}
    if (m := BBH.match(task)) and m.group(1) in SUBTASKS and {"input", "target"} <= set(doc):
        return {**bbh_answer(m.group(1), doc, task, 0), "subtask": m.group(1)}
    return None
