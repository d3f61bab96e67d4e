"""Synthetic tasks with checkable answers, for the toy backbone and the CPU default campaign.

Prompts are long relative to answers (P/G of about 5 at gen length 16) so prompt caching has
something to save. The same generators feed the toy trainer and the task preparation; the
trainer and the evaluation sets use disjoint seeds.

- ``toy_code``: write a one-line Python function from an English spec; scored by executing the
  program against hidden tests in the sandbox.
- ``toy_arith``: look up variables among distractor facts and add them; scored by exact match.
"""
from __future__ import annotations

import random

# Fixed-width templates keep every answer-relevant character at a fixed offset from the
# response, so a model of ~1M parameters learns the tasks in a few CPU minutes; the long
# example/fact lines still make prompts ~5x longer than answers.
FUNCTION_NAMES = ["f", "g", "h", "k", "m", "p"]
VARIABLES = list("abcdefg")


def _spec(rng: random.Random) -> tuple[str, str]:
    a, b = rng.randint(2, 9), rng.randint(1, 9)
    kind = rng.randrange(5)
    if kind == 0:
        return f"adds {b} to x", f"x + {b}"
    if kind == 1:
        return f"subtracts {b} from x", f"x - {b}"
    if kind == 2:
        return f"multiplies x by {a}", f"x * {a}"
    if kind == 3:
        return f"multiplies x by {a} and then adds {b}", f"x * {a} + {b}"
    return f"multiplies x by {a} and then subtracts {b}", f"x * {a} - {b}"


def toy_code_example(rng: random.Random) -> dict:
    name = rng.choice(FUNCTION_NAMES)
    spec, expr = _spec(rng)
    x0 = rng.randint(1, 9)
    y0 = eval(expr, {"x": x0})  # noqa: S307 - our own arithmetic template
    prompt = (f"# Example: {name}({x0}) == {y0}\n"
              f"# Write {name}(x): it {spec}.\n"
              f"def {name}(x):\n    return ")
    xs = [rng.randint(-20, 20) for _ in range(4)] + [0, 11]
    test = "\n".join(f"assert {name}({x}) == {eval(expr, {'x': x})}" for x in xs)  # noqa: S307
    return {"prompt": prompt, "answer": expr, "entry_point": name,
            "test": test, "kind": "code"}


def toy_arith_example(rng: random.Random) -> dict:
    names = VARIABLES
    values = {n: rng.randint(0, 9) for n in names}
    facts = ", ".join(f"{n}={v}" for n, v in values.items())
    if rng.random() < 0.5:
        q = rng.choice(names)
        question, answer = f"What is {q}?", str(values[q])
    else:
        p, q = rng.sample(names, 2)
        question, answer = f"What is {p}+{q}?", str(values[p] + values[q])
    prompt = f"Facts: {facts}.\nQuestion: {question}\nAnswer: "
    return {"prompt": prompt, "answer": answer, "entry_point": "", "test": "", "kind": "exact"}


GENERATORS = {"toy_code": toy_code_example, "toy_arith": toy_arith_example}


def make_examples(task: str, n: int, seed: int) -> list[dict]:
    """``n`` examples of a toy task, deterministic in ``seed``, with stable task ids."""
    rng = random.Random(f"{task}:{seed}")
    rows = []
    for i in range(n):
        row = GENERATORS[task](rng)
        row["task_id"] = f"{task}/{i}"
        rows.append(row)
    return rows
