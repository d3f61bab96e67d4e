"""Gold and perturbed completions of a task row, written the way the benchmark's own exemplars
state an answer: the gold one must score 1.0 through the real scorer, the perturbed one 0.0."""
from __future__ import annotations

import json

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def gold_completion(row: dict) -> str:
    return _completion(row, row["answer"])


def perturbed_completion(row: dict) -> str:
    kind, answer = row["kind"], row["answer"]
    if kind == "choice":
        n = max(len(json.loads(row["choices"])), 2)  # BBH snarks 88 has a single option upstream
        return _completion(row, LETTERS[(LETTERS.index(answer) + 1) % n])
    if kind == "label":
        labels = json.loads(row["choices"])
        return _completion(row, labels[(labels.index(answer) + 1) % len(labels)])
    if kind == "number":
        return _completion(row, f"{float(answer) * 1.5 + 1:.4f}")
    if kind == "math":
        try:
            return _completion(row, str(float(answer) + 1).removesuffix(".0"))
        except ValueError:
            return _completion(row, answer + "+1")
    if kind == "text":
        return _completion(row, answer + " x")
    raise ValueError(f"no perturbation for kind {kind!r}")


def _completion(row: dict, answer: str) -> str:
    """A short chain of thought ending the way the task's prompt asks for the answer."""
    kind = row["kind"]
    if kind == "math" and "boxed" in row["prompt"]:
        return f"Let me work it out.\nThe final answer is $\\boxed{{{answer}}}$."
    if kind == "math" and "####" in row["prompt"]:
        return f"Let me work it out.\n#### {answer}"
    if kind == "choice" and "insert answer here" in row["prompt"]:  # GPQA
        return f" The options differ in one step.\n\nThe correct answer is ({answer})"
    if kind == "choice":
        return f" Checking each option in turn. So the answer is ({answer})."
    if kind == "label" and row["task_id"].startswith("pubmedqa/"):
        return f"{answer}"
    return f"Step by step. So the answer is {answer}."  # BBH, FinQA
