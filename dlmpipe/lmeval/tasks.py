"""lm-eval tasks, loaded offline from local data (docs/SCORING.md, "lm-evaluation-harness").

A task keeps lm-eval's own definition (prompt template, few-shot, generation kwargs, filters,
metrics); only where its data comes from changes: ``dataset_path`` (a local dataset directory or
a ``datasets`` builder) and ``dataset_kwargs`` (e.g. ``{"data_files": {"test": FILE}}``, with
``json``/``csv``/``parquet`` chosen from the file's suffix when no ``dataset_path`` is given).
The override is a YAML file that ``include``s the task's own YAML, so lm-eval's CLI takes it
through ``--include_path`` and the campaign through a ``TaskManager`` over the same directory.

Splits a local source does not provide (GSM8K's train split, its few-shot source) are unset, and
lm-eval's own rule then draws few-shot exemplars from the test docs, never the evaluated doc.

Indexing every lm-eval task takes ~25 s; a task's own directory, found by a text scan of the
YAML files (~2 s), is indexed instead, and everything where the scan finds nothing.
"""
from __future__ import annotations

import json
import re
import tempfile
from functools import lru_cache
from pathlib import Path

import yaml

#: the data-file suffixes and the ``datasets`` builder that reads them
BUILDERS = {".json": "json", ".jsonl": "json", ".json.gz": "json", ".jsonl.gz": "json",
            ".csv": "csv", ".parquet": "parquet"}
#: splits a task may read besides ``test_split``
OTHER_SPLITS = ("training_split", "validation_split", "fewshot_split")


def tasks_root() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


@lru_cache(maxsize=None)
def task_yaml(name: str) -> Path | None:
    """The YAML file defining lm-eval task ``name`` (``task: name``, keys maybe quoted), or None."""
    pattern = re.compile(rf"^['\"]?task['\"]?:\s*['\"]?{re.escape(name)}['\"]?\s*$", re.M)
    for path in sorted(tasks_root().rglob("*.yaml")):
        try:
            if pattern.search(path.read_text(encoding="utf-8", errors="ignore")):
                return path
        except OSError:
            continue
    return None


def builder_for(dataset_kwargs: dict) -> str | None:
    """The ``datasets`` builder of the local ``data_files`` (None when there are none)."""
    files = dataset_kwargs.get("data_files")
    if not files:
        return None
    first = next(iter(files.values())) if isinstance(files, dict) else files
    first = first[0] if isinstance(first, list) else first
    for suffix, builder in sorted(BUILDERS.items(), key=lambda kv: -len(kv[0])):
        if str(first).endswith(suffix):
            return builder
    raise ValueError(f"data file {first}: give dataset_path (a datasets builder) for files other "
                     f"than {', '.join(BUILDERS)}")


def local_override(name: str, dataset_path: str | None = None,
                   dataset_kwargs: dict | None = None) -> dict:
    """The YAML keys that point lm-eval task ``name`` at local data (its own YAML included)."""
    source = task_yaml(name)
    if source is None:
        raise ValueError(f"lm-eval task {name!r}: no YAML of lm-eval {_version()} defines it "
                         "(a single task, not a group: `lm-eval ls tasks` lists them)")
    kwargs = dict(dataset_kwargs or {})
    files = kwargs.get("data_files")
    if isinstance(files, dict):
        kwargs["data_files"] = {split: _absolute(f) for split, f in files.items()}
    elif files:
        kwargs["data_files"] = {"test": _absolute(files)}
    path = dataset_path or builder_for(kwargs)
    if path is None:
        raise ValueError(f"lm-eval task {name!r}: local data needs dataset_path or "
                         "dataset_kwargs.data_files")
    if Path(path).expanduser().exists():
        path = str(Path(path).expanduser().resolve())
    override = {"include": str(source), "task": name, "dataset_path": path,
                "dataset_name": None, "dataset_kwargs": kwargs}
    if isinstance(kwargs.get("data_files"), dict):
        from lm_eval.tasks._yaml_loader import load_yaml

        config = load_yaml(source, resolve_func=False)
        splits = set(kwargs["data_files"])
        test = config.get("test_split") or "test"
        if test not in splits:
            raise ValueError(f"lm-eval task {name!r} evaluates split {test!r}: give it in "
                             f"data_files (given: {', '.join(sorted(splits))})")
        override.update({key: None for key in OTHER_SPLITS
                         if config.get(key) and config[key] not in splits})
    return override


def _absolute(path) -> str:
    p = Path(str(path)).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"data file not found: {p.absolute()}")
    return str(p.resolve())


def write_overrides(overrides: dict[str, dict], directory: str | Path) -> Path:
    """One YAML per overridden task in ``directory`` (an lm-eval ``--include_path``)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    for name, override in overrides.items():
        (directory / f"dlmpipe_local_{_safe(name)}.yaml").write_text(
            yaml.safe_dump(override, sort_keys=False))
    return directory


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def load_task(name: str, num_fewshot: int | None = None, dataset_path: str | None = None,
              dataset_kwargs: dict | None = None, fewshot_seed: int | None = None):
    """lm-eval's ``Task`` ``name`` as ``simple_evaluate`` sets it up (``num_fewshot`` by its
    rule, the few-shot seed), reading local data where given."""
    from lm_eval.defaults import DEFAULT_OTHER_SEED
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory(prefix="dlmpipe-lm-eval-") as tmp:
        paths = [str(p.parent)] if (p := task_yaml(name)) is not None else []
        if dataset_path or dataset_kwargs:
            paths.append(str(write_overrides(
                {name: local_override(name, dataset_path, dataset_kwargs)}, tmp)))
        manager = TaskManager(include_path=paths or None, include_defaults=not paths)
        loaded = manager.load([name])
        if name not in loaded["tasks"] or loaded.get("groups"):
            raise ValueError(f"lm-eval {name!r} is a group or tag: name one of its tasks "
                             f"({', '.join(sorted(loaded['tasks'])[:8])}, ...)")
        task = loaded["tasks"][name]  # its data read as it was built (the override file's keys)
    if num_fewshot is not None and task.get_config("num_fewshot") != 0:
        task.set_config(key="num_fewshot", value=num_fewshot)
    elif task.get_config("num_fewshot") is None:
        task.set_config(key="num_fewshot", value=0)
    task.set_fewshot_seed(seed=DEFAULT_OTHER_SEED if fewshot_seed is None else fewshot_seed)
    return task


def parse_task_values(items: list[str], flag: str, as_json: bool) -> dict[str, object]:
    """``["gsm8k={...}"]`` -> ``{"gsm8k": {...}}`` (the CLI's ``--dataset_kwargs``/``--dataset_path``)."""
    out = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not name.strip():
            raise ValueError(f"{flag} {item!r}: expected TASK=VALUE")
        if as_json:
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"{flag} {item!r}: the value is not JSON ({e})") from None
        out[name.strip()] = value
    return out


def _version() -> str:
    from importlib.metadata import version

    return version("lm_eval")
