"""Verdicts for answer tasks (no code runs, so no sandbox): the stated answer against the reference.

Kinds (docs/ARCHITECTURE.md): ``exact`` (the whole completion), ``math`` (numbers compared as
numbers; LaTeX answers by normalized string or value), ``number`` (FinQA: a number against
``exe_ans`` within FinQA's tolerance, below), ``choice`` (a letter), ``label`` (one of a closed
set, case-insensitive) and ``text`` (BBH's free-form answers: exact after whitespace and case).
Extraction is ``extraction.py``'s; every verdict keeps the extracted answer and its rule.

MATH answers are LaTeX; two spellings of one value must match (``\\dfrac{1}{2}``, ``\\frac12``,
``0.5``, ``\\left(1,2\\right)`` and ``(1, 2)``). We normalize the strings the way the usual MATH
graders do and then compare either the strings or, for simple closed forms, their values.
Values come from a tiny evaluator over Python's ``ast`` that accepts numbers, + - * / ** and
sqrt/pi only: sympy's ``sympify``/``parse_expr`` call ``eval`` and must never see model output.
"""
from __future__ import annotations

import ast
import json
import math
import operator
import re
from dataclasses import dataclass

from .extraction import (Extracted, clean_number, extract_label, extract_latex, extract_letter,
                         extract_number, extract_text)

ANSWER_KINDS = ("exact", "math", "number", "choice", "label", "text")


@dataclass(frozen=True)
class Verdict:
    """One answer task's verdict, the answer it is based on and the rule that extracted it."""

    passed: bool
    extracted: str | None
    rule: str

    @property
    def detail(self) -> str:
        return f"extracted {self.extracted!r} ({self.rule})"[:200]


def check_answer(row: dict, completion: str) -> Verdict:
    """The verdict on one completion of an answer task (``row``: a task-file row)."""
    kind, reference = row.get("kind", ""), str(row.get("answer", ""))
    if kind == "exact":
        return Verdict(exact_match(completion, reference), completion.strip()[:200], "whole text")
    if kind == "math":
        found = extract_number(completion) if is_number(reference) else extract_latex(completion)
        return _verdict(found, math_equal(found.answer, reference))
    if kind == "number":
        found = extract_number(completion)
        return _verdict(found, finqa_equal(found.answer, reference))
    if kind == "choice":
        found = extract_letter(completion, _choices(row))
        return _verdict(found, found.answer == reference.strip().strip("()"))
    if kind == "label":
        found = extract_label(completion, _choices(row))
        return _verdict(found, (found.answer or "").lower() == reference.strip().lower())
    if kind == "text":
        found = extract_text(completion)
        return _verdict(found, found.answer is not None and _words(found.answer) == _words(reference))
    raise ValueError(f"not an answer task kind: {kind!r}")


def _verdict(found: Extracted, passed: bool) -> Verdict:
    return Verdict(bool(passed), found.answer, found.rule)


def _choices(row: dict) -> list[str]:
    choices = json.loads(row.get("choices") or "[]")
    if not choices:
        raise ValueError(f"{row.get('task_id')}: a {row.get('kind')} task needs its choices")
    return choices


def _words(s: str) -> str:
    return " ".join(s.split()).lower()


def is_number(reference: str) -> bool:
    """A plain number ("18", "-0.5", "1,000", "25%"): compared as a number, read as one."""
    s = reference.strip().replace("\\%", "%").replace("\\$", "").replace("$", "")
    return re.fullmatch(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)?(?:\.\d+)?%?", s) is not None and \
        any(ch.isdigit() for ch in s)

_UNIT_WORDS = ("degrees", "degree", "cm", "meters", "meter", "inches", "inch", "feet", "units",
               "dollars", "cents", "square", "sq", "mph", "hours", "minutes", "seconds")


def exact_match(completion: str, answer: str) -> bool:
    return completion.strip() == answer.strip()


def _strip_text_units(s: str) -> str:
    s = re.sub(r"\\(?:text|textbf|mbox|mathrm)\{\s*([^{}]*)\}", r"\1", s)
    words = "|".join(_UNIT_WORDS)
    return re.sub(rf"(?<=[\d}}])\s*(?:{words})\b\^?\d*$", "", s.strip())


def _fix_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``; ``\\frac1{2}`` -> ``\\frac{1}{2}``."""
    s = re.sub(r"\\frac\s*(\d)\s*(\d)", r"\\frac{\1}{\2}", s)
    s = re.sub(r"\\frac\s*(\d)\s*\{", r"\\frac{\1}{", s)
    s = re.sub(r"\\frac\s*\{([^{}]*)\}\s*(\d)", r"\\frac{\1}{\2}", s)
    return s


def normalize_math(s: str | None) -> str:
    """String normalization of a final answer (docs/SCORING.md): units, \\left/\\right, spaces,
    \\dfrac, trailing .0, degrees, dollars, percent, "x =" prefixes."""
    if s is None:
        return ""
    s = str(s).strip()
    s = s.replace("\\!", "").replace("\\,", "").replace("\\;", "").replace("\\ ", "")
    s = s.replace("\\left", "").replace("\\right", "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = s.replace("^\\circ", "").replace("^{\\circ}", "").replace("\\circ", "").replace("°", "")
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = _strip_text_units(s)
    s = re.sub(r"^[a-zA-Z]\s*=\s*", "", s)          # "x = 5" -> "5"
    s = s.replace(" ", "").rstrip(".")
    s = _fix_fracs(s)
    if s.startswith("."):
        s = "0" + s
    s = re.sub(r"(?<=\d),(?=\d{3}(?!\d))", "", s)   # 1,000 -> 1000
    s = re.sub(r"(\d+)\.0+(?!\d)", r"\1", s)          # 5.0 -> 5, 2.50 stays
    s = s.replace("\\{", "{").replace("\\}", "}")
    return s


_BIN = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.Div: operator.truediv, ast.Pow: operator.pow}


def _eval_node(node: ast.AST) -> float:
    if isinstance(node, ast.Expression):
        return _eval_node(node.body)
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) \
            and not isinstance(node.value, bool):
        return float(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        v = _eval_node(node.operand)
        return -v if isinstance(node.op, ast.USub) else v
    if isinstance(node, ast.BinOp) and type(node.op) in _BIN:
        left, right = _eval_node(node.left), _eval_node(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 1e6):
            raise ValueError("exponent too large")
        return _BIN[type(node.op)](left, right)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sqrt" \
            and len(node.args) == 1 and not node.keywords:
        return math.sqrt(_eval_node(node.args[0]))
    if isinstance(node, ast.Name) and node.id == "pi":
        return math.pi
    raise ValueError("not a simple closed form")


def latex_value(s: str) -> float | None:
    """Value of a simple closed-form LaTeX number (``\\frac{3}{4}``, ``2\\sqrt{3}``, ``\\pi/2``)."""
    if not s or len(s) > 200:
        return None
    e = s
    for _ in range(5):
        e = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", e)
        e = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", e)
    e = re.sub(r"\\sqrt(\d+)", r"sqrt(\1)", e)
    e = e.replace("\\pi", "pi").replace("\\cdot", "*").replace("\\times", "*").replace("^", "**")
    e = e.replace("{", "(").replace("}", ")")
    e = re.sub(r"(\d|\))\s*(sqrt|pi|\()", r"\1*\2", e)  # implicit products: 2sqrt(3), 2(3)
    if re.search(r"[^0-9+\-*/().\s a-z]", e) or re.search(r"[a-z]", e.replace("sqrt", "").replace("pi", "")):
        return None
    try:
        return _eval_node(ast.parse(e, mode="eval"))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError, TypeError, RecursionError):
        return None


def math_equal(predicted: str | None, reference: str) -> bool:
    if predicted is None:
        return False
    p, r = normalize_math(predicted), normalize_math(reference)
    if p == r and p != "":
        return True
    try:
        return math.isclose(float(clean_number(p)), float(clean_number(r)), rel_tol=1e-6, abs_tol=1e-9)
    except ValueError:
        pass
    vp, vr = latex_value(p), latex_value(r)
    return vp is not None and vr is not None and math.isclose(vp, vr, rel_tol=1e-6, abs_tol=1e-9)


def score_math(completion: str, reference: str) -> tuple[bool, str]:
    """(passed, detail naming the extracted answer and its rule) for a ``math`` completion."""
    verdict = check_answer({"kind": "math", "answer": reference}, completion)
    return verdict.passed, verdict.detail


def finqa_equal(predicted: str | None, reference: str) -> bool:
    """A stated number against FinQA's ``exe_ans`` (a program's output, rounded to 5 decimals).

    Equal when, read as written or as a percentage (FinQA's ``str_to_num`` reads "14.1%" as
    0.141; a percentage written without its sign is accepted too), the stated number is the
    reference rounded to the precision it was written with ("14.1%" or "14%" for 0.14136), as
    long as it keeps two significant digits; otherwise FinQA's own rule: equal at 5 decimals.
    """
    if predicted is None:
        return False
    try:
        gold = float(reference)
    except ValueError:
        return _words(predicted) == _words(reference)
    written = predicted.strip().replace("\\%", "%")
    percent = written.endswith("%")
    number = clean_number(written.rstrip("%").strip())
    if not re.fullmatch(r"[-+]?\d*\.?\d+", number):
        value = latex_value(normalize_math(predicted))
        return value is not None and math.isclose(value, gold, rel_tol=1e-6, abs_tol=1e-9)
    value = float(number)
    decimals = len(number.split(".")[1]) if "." in number else 0
    significant = len(number.lstrip("+-").replace(".", "").lstrip("0"))
    scales = (0.01, 1.0) if percent else (1.0, 0.01)
    for scale in scales:
        candidate = value * scale
        if round(candidate, 5) == round(gold, 5):
            return True
        if significant >= 2 and abs(candidate - gold) <= 0.5 * 10 ** -decimals * scale + 1e-12:
            return True
    return False
