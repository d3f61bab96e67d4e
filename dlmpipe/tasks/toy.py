"""Synthetic tasks with checkable answers, for the toy backbone and the CPU default campaign.

Prompts are long relative to answers (P/G of about 5 at gen length 16) so prompt caching has
something to save. The same generators feed the toy trainer and the task preparation; the
trainer and the evaluation sets use disjoint seeds.

- ``toy_code``: write a one-line Python function from an English spec; scored by executing the
  program against hidden tests in the sandbox.
- ``toy_arith``: questions over a list of facts (largest/smallest value, look up a variable,
  add two); scored by exact match.

Difficulty is graded so a ~1M-parameter model trained for a few CPU minutes lands in between:
answers that need only *which* symbols occur in the prompt (one-constant specs, largest and
smallest value) are learned first; answers that need *where* they occur (two-constant specs,
look-ups, sums) come later. Caching then moves accuracy measurably, as on real models.
"""
from __future__ import annotations

import random

HEADER = "# Complete the function to match its spec.\n"
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
    prompt = (f"{HEADER}# Write {name}(x): it {spec}.\n"
              f"def {name}(x):\n    return ")
    xs = [rng.randint(-20, 20) for _ in range(4)] + [0, 11]
    test = "\n".join(f"assert {name}({x}) == {eval(expr, {'x': x})}" for x in xs)  # noqa: S307
    return {"prompt": prompt, "answer": expr, "entry_point": name,
            "test": test, "kind": "code"}


def toy_arith_example(rng: random.Random) -> dict:
    names = VARIABLES
    values = {n: rng.randint(0, 9) for n in names}
    facts = ", ".join(f"{n}={v}" for n, v in values.items())
    kind = rng.randrange(4)
    if kind == 0:
        question, answer = "What is the largest value?", str(max(values.values()))
    elif kind == 1:
        question, answer = "What is the smallest value?", str(min(values.values()))
    elif kind == 2:
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
