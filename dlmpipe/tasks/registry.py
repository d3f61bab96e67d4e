"""Task registry: name -> loader returning rows in the task-file schema (docs/ARCHITECTURE.md).

A loader takes the task's options from config.yaml (``n``, ``seed``, ``source``, ``limit``,
``ids``...) and returns a list of row dicts. ``prepare_task`` writes them as a parquet table.
"""
from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Callable

import pyarrow as pa
import pyarrow.parquet as pq

from ..arrow import SOURCES_KEY, task_sources  # noqa: F401  (task_sources: the tables' reader)
from ..io import atomic_write_parquet
from ..lmeval.campaign import load_lm_eval  # imports lm_eval only when it loads a task
from .benchmarks import BENCHMARKS, LOADERS
from .toy import make_examples

TASK_COLUMNS = ["task_id", "prompt", "kind", "answer", "code_prefix", "test", "entry_point"]
#: loader options that may name a dataset id
DATA_KEYS = ("source", "base_source")
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
    """The options a task's loader takes (besides the registry's ``limit`` and ``ids``; a loader
    that takes ``limit`` itself gets the registry's, ``load_task``)."""
    return [p.name for p in inspect.signature(TASKS[name]).parameters.values()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "limit"]


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


def dataset_options(options: dict) -> dict[str, str]:
    """The loader options naming a dataset id (not a local file): option -> id."""
    from .spec import is_dataset_id

    return {k: v for k, v in options.items() if k in DATA_KEYS and is_dataset_id(v)}


def pin_datasets(options: dict, revision: str | None) -> dict:
    """``options`` with every dataset id pinned to the commit its revision names (``revision``,
    else one the id names, else main: dlmpipe/hub.py), so that what is read is what is
    recorded."""
    from ..hub import Repo, resolve
    from .sources import parse_dataset_id, pin_dataset_id

    pinned = dict(options)
    for key, value in dataset_options(options).items():
        repo, own, _ = parse_dataset_id(value)
        pinned[key] = pin_dataset_id(value, resolve(Repo(repo, revision or own or "main", "dataset")))
    return pinned


def dataset_sources(options: dict) -> dict[str, dict]:
    """What a task's table records of the dataset ids it read: option -> repository, commit
    and config (its options pinned, ``pin_datasets``)."""
    from .sources import parse_dataset_id

    out = {}
    for key, value in dataset_options(options).items():
        repo, commit, config = parse_dataset_id(value)
        out[key] = {"repo": repo, "commit": commit, **({"config": config} if config else {})}
    return out


def load_task(name: str, **options) -> list[dict]:
    """A task's rows: its loader's with ``options``, then ``ids``/``limit`` selected; dataset
    ids are read at the commit ``revision`` names (``pin_datasets``)."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    limit, ids = options.pop("limit", None), options.pop("ids", None)
    revision = options.pop("revision", None)
    unknown = sorted(set(options) - set(loader_options(name)))
    if unknown:
        raise ValueError(f"task {name!r} takes no option(s) {', '.join(unknown)}; its options: "
                         f"{', '.join(loader_options(name) + ['limit', 'ids', 'revision'])}")
    if dataset_options(options):
        options = pin_datasets(options, revision)
    if limit is not None and not ids and "limit" in inspect.signature(TASKS[name]).parameters:
        options["limit"] = limit  # the loader reads only the first rows (lm-eval: their requests)
    rows = select(TASKS[name](**options), limit=limit, ids=ids)
    columns = TASK_COLUMNS + [c for c in OPTIONAL_COLUMNS if any(c in r for r in rows)]
    return [{c: str(r.get(c, "") or "") for c in columns} for r in rows]


def write_task_table(rows: list[dict], out: str | Path, sources: dict | None = None) -> None:
    """``sources``: the dataset ids read and their commits (``dataset_sources``), recorded in
    the table's metadata (``SOURCES_KEY``) for every job's provenance."""
    columns = TASK_COLUMNS + [c for c in OPTIONAL_COLUMNS if rows and c in rows[0]]
    metadata = {SOURCES_KEY: json.dumps(sources, sort_keys=True)} if sources else None
    table = pa.Table.from_pylist(rows, schema=pa.schema([(c, pa.string()) for c in columns],
                                                        metadata=metadata))
    atomic_write_parquet(out, table)


def prepare_task(name: str, options: dict, out: str | Path) -> None:
    """The prepare-task job: the task's rows as a table, recording the commit of every dataset
    id it read."""
    options = dict(options)
    revision = options.pop("revision", None)
    if dataset_options(options):
        options = pin_datasets(options, revision)
    write_task_table(load_task(name, **options), out, dataset_sources(options))



def read_task_table(path: str | Path) -> list[dict]:
    return pq.read_table(path).to_pylist()
