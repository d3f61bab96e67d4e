"""Answer extraction the way a careful grader reads a completion: a table of completion styles per
benchmark, correct and wrong answers in each, each with its expected verdict and the rule that
must produce it (the rule is recorded beside every verdict, so it is part of the contract)."""
from __future__ import annotations

import json

import pytest

from dlmpipe.scoring.answers import check_answer, finqa_equal
from dlmpipe.scoring.extraction import extract_letter, number_words, response_text


def row(kind: str, answer: str, choices: list[str] | None = None) -> dict:
    return {"task_id": "t/0", "kind": kind, "answer": answer,
            "choices": json.dumps(choices) if choices is not None else ""}


def verdict(r: dict, completion: str) -> tuple[bool, str | None, str]:
    v = check_answer(r, completion)
    return v.passed, v.extracted, v.rule


# ---------------------------------------------------------------------------------------------
# Numeric answers: GSM8K (reference 42, 1234 or 23)

GSM8K = [
    # (completion, reference, passed, rule)
    ("Natalia sold 21 + 21 = 42 clips.\n#### 42", "42", True, "####"),
    ("So she sold 42 clips.\n####42", "42", True, "####"),
    ("#### $42", "42", True, "####"),
    ("#### 41", "42", False, "####"),
    ("The answer is $1,234.", "1234", True, "answer is"),
    ("The answer is $1,243.", "1234", False, "answer is"),
    ("The answer is \\boxed{42}.", "42", True, "boxed"),
    ("So the total is \\boxed{42}, i.e. 6 * 7.", "42", True, "boxed"),
    ("6 * 7 = 42.00", "42", True, "last number"),
    ("6 * 7 = 42.5", "42", False, "last number"),
    # the three shapes the issue reports
    ("There are 4 rows of 4 people. The answer is 16 people.", "16", True, "answer is"),
    ("There are 4 rows of 4 people. The answer is 15 people.", "16", False, "answer is"),
    ("She keeps 3 of 15 eggs. The answer is 12 eggs.", "12", True, "answer is"),
    ("He walks 2 + 3 miles. The answer is 5 miles.", "5", True, "answer is"),
    ("Final answer: 595 (from steps 1 to 6)", "595", True, "final answer"),
    ("Final answer: 594 (from steps 1 to 6)", "595", False, "final answer"),
    ("The answer is twenty-three.", "23", True, "answer is"),
    ("The answer is twenty-two.", "23", False, "answer is"),
    ("The answer is one hundred and five dollars.", "105", True, "answer is"),
    # a wrong number after the stated answer does not count
    ("The answer is 42. Check: 6 * 7 = 42, and 42 + 1 = 43.", "42", True, "answer is"),
    ("#### 42\nNext year she will have 50.", "42", True, "####"),
    ("**Final Answer**\n\n42\n\nThat is 2 more than 40.", "42", True, "final answer"),
    # a correct number followed by a wrong one: the final statement counts
    ("The answer is 42. Actually, I made a mistake: the answer is 43.", "42", False, "answer is"),
    ("42\nwait, no: 43", "42", False, "last number"),
    # markup, currency, percent, signs
    ("So the answer is **42**.", "42", True, "answer is"),
    ("Total: **$1,234**", "1234", True, "bold"),
    ("**Step 3: add 1** which gives 42", "42", True, "last number"),
    ("The answer is 25%.", "25", True, "answer is"),
    ("The answer is -7.", "-7", True, "answer is"),
    ("The answer is 3.5 hours.", "3.5", True, "answer is"),
    ("The answer is approximately 1,000,000.", "1000000", True, "answer is"),
    # a new few-shot question the model went on to write is not the response
    ("18 * 2 = 36. #### 36\n\nQuestion: Tom has 5 apples...\nAnswer: #### 5", "36", True, "####"),
    ("no number here", "18", False, "none"),
]


@pytest.mark.parametrize("completion, reference, passed, rule", GSM8K)
def test_gsm8k_styles(completion, reference, passed, rule):
    got = verdict(row("math", reference), completion)
    assert got[0] is passed and got[2] == rule, got


# ---------------------------------------------------------------------------------------------
# MATH-500: LaTeX references by value; numeric references read like GSM8K

MATH = [
    ("So the answer is $\\boxed{\\dfrac34}$", "\\frac{3}{4}", True, "boxed"),
    ("\\boxed{0.75}", "\\frac{3}{4}", True, "boxed"),
    ("\\boxed{\\frac{2}{3}}", "\\frac{3}{4}", False, "boxed"),
    ("The final answer is $\\frac{3}{4}$. I hope it is correct.", "\\frac{3}{4}", True, "final answer"),
    ("The answer is $(1, 2)$.", "(1,2)", True, "answer is"),
    ("The answer is $(2, 1)$.", "(1,2)", False, "answer is"),
    ("\\boxed{12 \\text{ cm}}", "12", True, "boxed"),
    ("\\boxed{16 \\text{ people}}", "16", True, "boxed"),
    ("\\boxed{2\\sqrt{3}}", "\\sqrt{12}", True, "boxed"),
    ("The area is $12$ square units. The answer is 12.", "12", True, "answer is"),
    ("So $\\boxed{\\frac{3}{4}}$, which is 0.75 of the whole, not 1.", "\\frac{3}{4}", True, "boxed"),
    ("First $\\boxed{\\frac{3}{4}}$; on second thought $\\boxed{1}$.", "\\frac{3}{4}", False, "boxed"),
]


@pytest.mark.parametrize("completion, reference, passed, rule", MATH)
def test_math500_styles(completion, reference, passed, rule):
    got = verdict(row("math", reference), completion)
    assert got[0] is passed and got[2] == rule, got


# ---------------------------------------------------------------------------------------------
# FinQA: a number against exe_ans (0.14136: "14.1%"; 1234.5), FinQA's tolerance

FINQA = [
    ("The percentage change is 14.1%. The answer is 14.1%.", "0.14136", True, "answer is"),
    ("The answer is 14.14%", "0.14136", True, "answer is"),
    ("The answer is 14%.", "0.14136", True, "answer is"),
    ("The answer is 0.1414.", "0.14136", True, "answer is"),
    ("The answer is 14.14", "0.14136", True, "answer is"),  # a percentage without its sign
    ("The answer is 14.5%.", "0.14136", False, "answer is"),
    ("The answer is 1%.", "0.14136", False, "answer is"),
    ("The answer is 14.1% (up from 12.0% in 2008).", "0.14136", True, "answer is"),
    ("Revenue grew to $1,234.5 million. The answer is $1,234.5 million.", "1234.5", True, "answer is"),
    ("The answer is 1,235.", "1234.5", True, "answer is"),
    ("The answer is 1,200.", "1234.5", False, "answer is"),
    ("The change is -3.49%.", "-0.0349", True, "last number"),
    ("The change is 3.49%.", "-0.0349", False, "last number"),
    ("The answer is 3.", "3.4", False, "answer is"),  # one significant digit is no answer to 3.4
    ("The answer is 14.1%. Correction: the answer is 15%.", "0.14136", False, "answer is"),
]


@pytest.mark.parametrize("completion, reference, passed, rule", FINQA)
def test_finqa_styles(completion, reference, passed, rule):
    got = verdict(row("number", reference), completion)
    assert got[0] is passed and got[2] == rule, got


def test_finqa_exact_program_outputs():
    assert finqa_equal("0.14136", "0.14136") and finqa_equal("14.136%", "0.14136")
    assert finqa_equal("5", "5.0") and not finqa_equal("6", "5.0") and not finqa_equal(None, "1")


# ---------------------------------------------------------------------------------------------
# Multiple choice (GPQA, MMLU-Pro, BBH): reference C, options A-D

OPTIONS = ["12/14/2026", "12/14/1950", "12/14/1937", "07/14/1938"]
CHOICE = [
    ("So the answer is (C).", "C", True, "answer is"),
    ("So the answer is (B).", "C", False, "answer is"),
    ("The correct answer is C.", "C", True, "answer is"),
    ("The answer is: **(C)**", "C", True, "answer is"),
    ("The answer is (c) because the date moves back.", "C", True, "answer is"),
    ("The best option is C) 12/14/1937.", "C", True, "answer is"),
    ("Answer: (C)", "C", True, "answer:"),
    ("Answer: D", "C", False, "answer:"),
    ("**Answer:** C", "C", True, "answer:"),
    ("\\boxed{C}", "C", True, "boxed"),
    ("$\\boxed{\\text{(C)}}$", "C", True, "boxed"),
    ("The answer is 12/14/1937.", "C", True, "option text"),
    ("The answer is 12/14/1950.", "C", False, "option text"),
    ("12/14/1937", "C", True, "option text"),
    ("Ten days before Dec 24 is Dec 14, so **C**", "C", True, "bold"),
    ("Ten days before Dec 24 is Dec 14, which is option (C) 12/14/1937", "C", True, "(X)"),
    ("C. 12/14/1937", "C", True, "letter line"),
    ("C", "C", True, "letter line"),
    ("B", "C", False, "letter line"),
    ("A date ten days earlier; I pick C", "C", True, "last letter"),
    # a wrong letter after the stated answer, a correct letter followed by a wrong one
    ("The answer is (C). Option (D) is wrong because it is in 1938.", "C", True, "answer is"),
    ("The answer is (C). Wait, the answer is (D).", "C", False, "answer is"),
    ("So the answer is (C).\n\nQ: Another question\nA: So the answer is (A).", "C", True, "answer is"),
    ("I do not know.", "C", False, "none"),
]


@pytest.mark.parametrize("completion, reference, passed, rule", CHOICE)
def test_multiple_choice_styles(completion, reference, passed, rule):
    got = verdict(row("choice", reference, OPTIONS), completion)
    assert got[0] is passed and got[2] == rule, got


def test_mmlu_pro_ten_letters_and_a_pronoun():
    ten = [str(i) for i in range(10)]
    assert extract_letter("The answer is (I).", ten).answer == "I"
    assert extract_letter("I think it is J", ten).answer == "J"  # "I think": a pronoun
    assert extract_letter("The answer is (K).", ten).answer is None  # not an option


# ---------------------------------------------------------------------------------------------
# Labels: PubMedQA (yes/no/maybe), BBH's True/False and valid/invalid

LABELS = [
    (["yes", "no", "maybe"], "Yes", "yes", True, "first word"),
    (["yes", "no", "maybe"], "Yes. However, there is no evidence in older patients.", "yes", True,
     "first word"),
    (["yes", "no", "maybe"], "No, the study shows no effect.", "yes", False, "first word"),
    (["yes", "no", "maybe"], "The results are mixed, so the answer is maybe.", "maybe", True,
     "answer is"),
    (["yes", "no", "maybe"], "Answer: no", "no", True, "answer:"),
    (["yes", "no", "maybe"], "The effect held in all groups: **yes**", "yes", True, "bold"),
    (["yes", "no", "maybe"], "\\boxed{no}", "yes", False, "boxed"),
    (["yes", "no", "maybe"], "Based on the abstract, not yet clear; yes in adults.", "yes", True,
     "last label"),
    (["True", "False"], "not ( True ) = False. So the answer is False.", "False", True, "answer is"),
    (["True", "False"], "So the answer is True. The expression evaluates to False.", "True", True,
     "answer is"),
    (["valid", "invalid"], "So the answer is invalid.", "valid", False, "answer is"),
    (["valid", "invalid"], "So the answer is valid.", "valid", True, "answer is"),
    (["Yes", "No"], "So the answer is no.", "No", True, "answer is"),
    (["yes", "no", "maybe"], "The answer is yes. Actually, the answer is no.", "yes", False,
     "answer is"),
]


@pytest.mark.parametrize("labels, completion, reference, passed, rule", LABELS)
def test_label_styles(labels, completion, reference, passed, rule):
    got = verdict(row("label", reference, labels), completion)
    assert got[0] is passed and got[2] == rule, got


# ---------------------------------------------------------------------------------------------
# Free-form text (BBH Dyck languages, word sorting): exact after BBH's answer marker

TEXT = [
    ("We close the brackets in order. So the answer is ] ] ).", "] ] )", True, "answer is"),
    ("So the answer is ] ).", "] ] )", False, "answer is"),
    ("So the answer is: apple banana cherry.", "apple banana cherry", True, "answer is"),
    ("So the answer is apple cherry banana.", "apple banana cherry", False, "answer is"),
    ("apple banana cherry", "apple banana cherry", False, "none"),
    ("So the answer is ] ] ). Then ( is opened again.", "] ] )", True, "answer is"),
    ("So the answer is ] ] ).\nNo, so the answer is ] ).", "] ] )", False, "answer is"),
]


@pytest.mark.parametrize("completion, reference, passed, rule", TEXT)
def test_text_styles(completion, reference, passed, rule):
    got = verdict(row("text", reference), completion)
    assert got[0] is passed and got[2] == rule, got


# ---------------------------------------------------------------------------------------------
# Pieces


def test_number_words():
    assert number_words("twenty-three apples") == 23
    assert number_words("one hundred and five") == 105
    assert number_words("two thousand three hundred") == 2300
    assert number_words("zero") == 0
    assert number_words("none of them") is None
    assert number_words("the answer") is None


def test_response_ends_at_stop_strings_and_new_questions():
    assert response_text("#### 4<|eot_id|>#### 5") == "#### 4"
    assert response_text("So the answer is (B).\n\nQ: next") == "So the answer is (B).\n"
    assert response_text("It is 3.\nQuestion: more\nAnswer: 4") == "It is 3."


def test_exact_kind_keeps_the_whole_text():
    assert verdict(row("exact", "7"), " 7\n") == (True, "7", "whole text")
    assert verdict(row("exact", "7"), "7 because") == (False, "7 because", "whole text")
