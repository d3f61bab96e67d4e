"""Synthetic tasks with checkable answers, for the toy backbone and the CPU default campaign.

Both tasks are counting chains: a row of 14 digits with blanks (``_``), where each blank is the
number before it plus (toy_arith) or minus (toy_code) one, wrapping around. A blank's value
depends on the value decoded just before it, so a small model is surest of a blank once its left
neighbour is decoded (before, it has to count the run of blanks in one pass). How a response is
decoded therefore matters: one confident token at a time gets the chain right; decoding many
tokens from one set of logits (aggressive thresholds) loses samples on toy_arith's long runs.
A briefly trained toy is also hurt by caches that keep rows' states after a neighbour changed,
by how much depending on its training seed; the shipped toy is trained to tolerate that
(``stale_kv``, dlmpipe/backbones/toy.py), so most caches lose little on it, as on real models.

The layout is what makes this learnable in a few CPU minutes by a ~1M-parameter model: single
digits at a stride of two characters, the pattern right before the answer, and the same
distance from each pattern item to its answer item in both tasks (one positional copy circuit
serves both). Constant text in the prompt is kept short: every constant character dilutes the
attention the copy circuit starts from and slows its learning several-fold. The same generators
feed the toy trainer and the task preparation; the trainer and the evaluation sets use
disjoint seeds.

- ``toy_code``: ``f()`` returns the chain counting down as a Python list literal, continuing
  ``return [``; scored by executing the program against a hidden test in the sandbox (a wrong
  item, a missing comma or a missing closing bracket fails).
- ``toy_arith``: the chain counting up, digits separated by spaces; scored by exact match.
"""
from __future__ import annotations

import random

FUNCTION_NAMES = ["f", "g", "h", "k", "m", "p"]
BLANK = "_"
CODE_BLANKS = 0.6    # share of blanks after the first item: runs of 2-4 blanks are common
ARITH_BLANKS = 0.8   # longer runs (often 5-10): longer dependency chains
ITEMS = 14         # answer 27 characters: fits gen_length 32 with the closing bracket


def counting_chain(rng: random.Random, items: int, step: int,
                   blanks: float) -> tuple[list[str], list[int]]:
    """A pattern (digits and blanks, the first always a digit, each later item a blank with
    probability ``blanks``) and its filled values: each blank is the value before it plus
    ``step``, mod 10."""
    pattern, values = [], []
    for i in range(items):
        if i and rng.random() < blanks:
            pattern.append(BLANK)
            values.append((values[-1] + step) % 10)
        else:
            d = rng.randrange(10)
            pattern.append(str(d))
            values.append(d)
    return pattern, values


def toy_code_example(rng: random.Random) -> dict:
    name = rng.choice(FUNCTION_NAMES)
    pattern, values = counting_chain(rng, ITEMS, step=-1, blanks=CODE_BLANKS)
    prompt = f"def {name}():\n   # count down: {','.join(pattern)}\n   return ["
    answer = ",".join(map(str, values)) + "]"
    return {"prompt": prompt, "answer": answer, "entry_point": name,
            "test": f"assert {name}() == [{answer}", "kind": "code"}


def toy_arith_example(rng: random.Random) -> dict:
    pattern, values = counting_chain(rng, ITEMS, step=1, blanks=ARITH_BLANKS)
    prompt = f"count up: {' '.join(pattern)}\nfilled in: "
    return {"prompt": prompt, "answer": " ".join(map(str, values)), "entry_point": "", "test": "",
            "kind": "exact"}


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
