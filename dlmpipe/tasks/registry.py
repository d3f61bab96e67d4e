"""Task registry: name -> loader returning rows in the task-file schema (docs/ARCHITECTURE.md).

A loader takes the task's options from config.yaml (``n``, ``seed``, ``source``, ``limit``,
``ids``...) and returns a list of row dicts. ``prepare_task`` writes them as a parquet table.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from ..io import atomic_write_parquet
from ..lmeval.campaign import load_lm_eval  # imports lm_eval only when it loads a task
from .benchmarks import LOADERS
from .toy import make_examples

TASK_COLUMNS = ["task_id", "prompt", "kind", "answer", "code_prefix", "test", "entry_point"]
# optional columns, written only when a loader fills them (docs/ARCHITECTURE.md, File contracts)
OPTIONAL_COLUMNS = ["response_prefix", "plus_test", "choices", "subtask",
                    "lm_eval"]  # an lm-eval task's doc, options and stop strings (lmeval/campaign.py)


def _toy_loader(task: str) -> Callable[..., list[dict]]:
    def load(n: int = 40, seed: int = 1000) -> list[dict]:
        rows = make_examples(task, n, seed)
        for r in rows:
            # the completion continues the prompt's `return `; the program is prompt + completion
            r["code_prefix"] = r["prompt"] if r["kind"] == "code" else ""
        return rows
    return load


TASKS: dict[str, Callable[..., list[dict]]] = {
    "toy_code": _toy_loader("toy_code"),
    "toy_arith": _toy_loader("toy_arith"),
    **LOADERS,  # real benchmarks (dlmpipe/tasks/benchmarks.py)
    "lm_eval": load_lm_eval,  # any lm-eval task (the extra dlmpipe[lm-eval]; docs/SCORING.md)
}


# ---- sizes, for planning a campaign before its data is downloaded (``dlmpipe plan``) ----------
#: rows of each registered benchmark's full data (docs/SCORING.md, "Benchmarks"); the toy tasks
#: have ``n`` rows. tests/test_cli.py checks each against the files present here.
ROWS = {"humaneval": 164, "humaneval_plus": 164, "humaneval_et": 164, "mbpp": 427,
        "mbpp_plus": 378, "mbpp_et": 427,  # MBPP-ET: the sanitized problems it covers, at most
        "livecodebench": 400, "gsm8k": 1319, "math500": 500, "bbh": 6511, "gpqa_main": 448,
        "gpqa_diamond": 198, "mmlu_pro": 12032, "pubmedqa": 1000, "pubmedqa_test": 500,
        "finqa": 1147}
#: rows per subtask where a task's ``subtasks`` option selects some: BBH's tasks (250 each but
#: three), MMLU-Pro's categories
SUBTASK_ROWS = {
    "bbh": {"causal_judgement": 187, "penguins_in_a_table": 146, "snarks": 178},  # others 250
    "mmlu_pro": {"biology": 717, "business": 789, "chemistry": 1132, "computer science": 410,
                 "economics": 844, "engineering": 969, "health": 818, "history": 381,
                 "law": 1101, "math": 1351, "other": 924, "philosophy": 499, "physics": 1299,
                 "psychology": 798}}
SUBTASK_DEFAULT_ROWS = {"bbh": 250}
#: mean characters of a row's prompt and response prefix at the loader's default options
#: (few-shot exemplars included): measured on the files here where marked, else estimated from
#: the prompt format; ``dlmpipe plan`` turns them into tokens
PROMPT_CHARS = {"toy_code": 65, "toy_arith": 49,  # measured (n 40, seed 1000)
                "humaneval": 1037, "humaneval_plus": 1037, "humaneval_et": 1037,  # measured
                "mbpp": 430, "mbpp_plus": 299, "gsm8k": 321, "bbh": 3165,  # measured
                "pubmedqa": 1486, "pubmedqa_test": 1498,  # measured
                "mbpp_et": 430,  # as mbpp (the same problems and prompt)
                "livecodebench": 2000, "math500": 300, "gpqa_main": 800, "gpqa_diamond": 800,
                "mmlu_pro": 7000, "finqa": 4000,  # estimated (mmlu_pro: 5-shot chain of thought)
                "lm_eval": 1000}  # a guess: lm-eval's tasks range from 100 to 10,000


def task_rows(name: str, options: dict) -> int:
    """Rows a task of registered benchmark ``name`` has with ``options`` (its config entry),
    without loading it: ``ids``, else ``limit`` of the known size (``n`` for the toy tasks,
    the selected ``subtasks`` where sizes are known per subtask)."""
    if options.get("ids"):
        return len(options["ids"])
    if name in ROWS:
        rows = ROWS[name]
        if options.get("subtasks") and name in SUBTASK_ROWS:
            per = SUBTASK_ROWS[name]
            rows = sum(per.get(s, SUBTASK_DEFAULT_ROWS.get(name, 0)) for s in options["subtasks"])
    elif name == "lm_eval":  # its size is lm-eval's to know: the limit, else unknown (0)
        return options.get("limit") or 0
    else:  # a generated task: its ``n`` (the loader's default when unset)
        rows = options.get("n", inspect.signature(TASKS[name]).parameters["n"].default)
    return rows if options.get("limit") is None else min(rows, options["limit"])


def loader_options(name: str) -> list[str]:
    """The options a task's loader takes (besides the registry's ``limit`` and ``ids``)."""
    return [p.name for p in inspect.signature(TASKS[name]).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def select(rows: list[dict], limit: int | None = None, ids: list[str] | None = None) -> list[dict]:
    """Subset by explicit ids (in the given order) and/or the first ``limit`` rows."""
    if ids:
        by_id = {r["task_id"]: r for r in rows}
        unknown = [i for i in ids if i not in by_id]
        if unknown:
            raise ValueError(f"unknown task id(s): {unknown[:5]}")
        rows = [by_id[i] for i in ids]
    if limit is not None:
        rows = rows[:limit]
    return rows


def load_task(name: str, **options) -> list[dict]:
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    limit, ids = options.pop("limit", None), options.pop("ids", None)
    unknown = sorted(set(options) - set(loader_options(name)))
    if unknown:
        raise ValueError(f"task {name!r} takes no option(s) {', '.join(unknown)}; its options: "
                         f"{', '.join(loader_options(name) + ['limit', 'ids'])}")
    rows = select(TASKS[name](**options), limit=limit, ids=ids)
    columns = TASK_COLUMNS + [c for c in OPTIONAL_COLUMNS if any(c in r for r in rows)]
    return [{c: str(r.get(c, "") or "") for c in columns} for r in rows]


def write_task_table(rows: list[dict], out: str | Path) -> None:
    columns = TASK_COLUMNS + [c for c in OPTIONAL_COLUMNS if rows and c in rows[0]]
    table = pa.Table.from_pylist(rows, schema=pa.schema([(c, pa.string()) for c in columns]))
    atomic_write_parquet(out, table)


def read_task_table(path: str | Path) -> list[dict]:
    return pq.read_table(path).to_pylist()
