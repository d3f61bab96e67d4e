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
from .benchmarks import BENCHMARKS, LOADERS
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
#: each benchmark declares its size and prompt length in its own module (``spec.Benchmark``);
#: the toy tasks have ``n`` rows, an lm-eval task its ``limit`` (else unknown: 0)
TOY_PROMPT_CHARS = {"toy_code": 65, "toy_arith": 49}  # measured (n 40, seed 1000)
LM_EVAL_PROMPT_CHARS = 1000  # a guess: lm-eval's tasks range from 100 to 10,000


def prompt_chars(name: str, options: dict) -> int:
    """Mean characters of a task's prompt and response prefix (few-shot exemplars included),
    measured or estimated; ``dlmpipe plan`` turns them into tokens."""
    if name in BENCHMARKS:
        return BENCHMARKS[name].chars(options)
    return TOY_PROMPT_CHARS.get(name, LM_EVAL_PROMPT_CHARS)


def task_rows(name: str, options: dict) -> int:
    """Rows a task of registered benchmark ``name`` has with ``options`` (its config entry),
    without loading it: ``ids``, else ``limit`` of its size (a local file's records where
    ``source`` names one; ``n`` for the toy tasks; the selected ``subtasks``)."""
    if options.get("ids"):
        return len(options["ids"])
    if name in BENCHMARKS:
        rows = BENCHMARKS[name].size(options)
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
