"""Finding and reading benchmark data files: local files (json, jsonl, csv, parquet, gzipped)
or dataset ids (``org/name[:config]``; a job's ``org/name@commit[:config]``, pinned by the
campaign).

Without ``source`` a loader looks for its usual file names (``DEFAULT_FILES``, the upstream
release's name first) in ``$DLMPIPE_DATA_DIR`` and then in ``../shared/data`` (from the working
directory and from the repository). A missing file is a ``DataNotFound`` (a
``FileNotFoundError``) naming the option and every path looked at, a malformed one a
``ValueError`` naming the file. The campaign check finds missing files before any job
(``benchmarks.missing_data``).
"""
from __future__ import annotations

import csv
import gzip
import io
import json
import os
import re
import zlib
from pathlib import Path
from typing import Iterable

DATA_ENV = "DLMPIPE_DATA_DIR"
DEFAULT_FILES: dict[str, tuple[str, ...]] = {
    "humaneval_plus": ("HumanEvalPlus-v0.1.10.jsonl.gz",),
    "mbpp_plus": ("MbppPlus-v0.2.0.jsonl.gz",),
    "mbpp": ("sanitized-mbpp.json",),
    "gsm8k": ("gsm8k_test.jsonl",),
    "math500": ("math500_test.jsonl",),
    "livecodebench": ("livecodebench_release_v1.jsonl",),
    "humaneval_et": ("HumanEval_ET.jsonl", "HumanEval_ET.jsonl.gz"),
    "mbpp_et": ("MBPP_ET.jsonl", "MBPP_ET.jsonl.gz"),
    "bbh": ("bbh",),
    "gpqa_main": ("gpqa_main.csv",),
    "gpqa_diamond": ("gpqa_diamond.csv",),
    "mmlu_pro": ("mmlu_pro_test.parquet", "mmlu_pro_test.jsonl"),
    "mmlu_pro_validation": ("mmlu_pro_validation.parquet", "mmlu_pro_validation.jsonl"),
    "pubmedqa": ("pubmedqa_ori_pqal.json.gz", "ori_pqal.json"),
    "pubmedqa_test": ("pubmedqa_test_ground_truth.json", "test_ground_truth.json"),
    "finqa": ("finqa_test.json",),
}


class DataNotFound(FileNotFoundError):
    """A benchmark's data file is missing: the one its option ``key`` names (``given``), or, with
    the option unset, every default file at every path ``looked`` at."""

    def __init__(self, task: str, key: str, given: Path | None = None, looked: tuple = ()):
        given = None if given is None else Path(given).absolute()  # says where it looked
        self.task, self.key, self.given, self.looked = task, key, given, tuple(looked)
        super().__init__(f"{task}: {self.problem(f'the task option {key}')}")

    def problem(self, setting: str) -> str:
        """What is missing and how to give it; ``setting`` names the option to set."""
        if self.given is not None:
            return f"data file not found: {self.given}"
        return (f"no data file given and none found (looked at "
                f"{', '.join(map(str, self.looked))}); set {setting}, or {DATA_ENV} to a "
                "directory holding one")


def resolve_source(task: str, source: str | None, key: str = "source") -> str | Path:
    """A local path, or a dataset id (returned as a string) when no such file exists; without
    ``source`` the first default file (``DEFAULT_FILES[task]``) found. DataNotFound names the
    option ``key`` that gives the file."""
    if source:
        path = Path(source).expanduser()
        if path.exists():
            return path
        if looks_like_dataset_id(str(source)):
            return str(source)
        raise DataNotFound(task, key, given=path)
    names = DEFAULT_FILES[task]
    for d in data_dirs():
        for name in names:
            if (d / name).exists():
                return (d / name).resolve()
    raise DataNotFound(task, key, looked=[d / name for d in data_dirs() for name in names])


def read_records(task: str, source: str | Path, split: str = "test") -> list[dict]:
    """Rows of a .json (list), .jsonl, .csv or .parquet file (maybe gzipped), or of a dataset id
    (``id[@revision][:config]``: its snapshot in the Hugging Face cache, dlmpipe/hub.py)."""
    if isinstance(source, str):
        return _dataset_rows(task, source, split)
    try:
        if str(source).endswith(".parquet"):
            import pyarrow.parquet as pq

            return pq.read_table(source).to_pylist()
        with _open_text(source) as f:
            if str(source).endswith((".csv", ".csv.gz")):
                return list(csv.DictReader(f))
            if str(source).endswith(".json"):
                data = json.load(f)
                if not isinstance(data, list):
                    raise ValueError("expected a JSON list of records")
                return data
            rows = []
            for n, line in enumerate(f, 1):
                if line.strip():
                    try:
                        rows.append(json.loads(line))
                    except json.JSONDecodeError as e:
                        raise ValueError(f"line {n}: {e}") from None
            return rows
    except (OSError, EOFError, UnicodeDecodeError, ValueError, zlib.error, csv.Error) as e:
        raise ValueError(f"{task}: malformed data file {source}: {e}") from None


def read_json(task: str, path: Path):
    """A whole JSON document (maybe gzipped), whatever its shape."""
    try:
        with _open_text(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"{task}: data file not found: {Path(path).absolute()}") from None
    except (OSError, EOFError, UnicodeDecodeError, ValueError, zlib.error) as e:
        raise ValueError(f"{task}: malformed data file {path}: {e}") from None


def require(task: str, source, row: dict, keys: Iterable[str], n: int) -> None:
    missing = [k for k in keys if k not in row]
    if missing:
        raise ValueError(f"{task}: malformed data file {source}: record {n} lacks {missing}")


def option_list(value) -> list | None:
    """A record's options: a non-empty list, or a JSON string of one (CSV and Parquet files
    store lists as text); None for anything else, for the caller to report."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, list) and value else None


def data_dirs() -> list[Path]:
    """Where loaders look for a default file: $DLMPIPE_DATA_DIR, then ../shared/data from the
    working directory and from the repository (resolved, each once)."""
    dirs = []
    if os.environ.get(DATA_ENV):
        dirs.append(Path(os.environ[DATA_ENV]).expanduser())
    repo = Path(__file__).resolve().parents[2]
    dirs += [Path.cwd() / ".." / "shared" / "data", repo / ".." / "shared" / "data"]
    return list(dict.fromkeys(d.resolve() for d in dirs))


DATASET_ID = re.compile(r"(?P<repo>[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+)(@(?P<revision>[A-Za-z0-9_.-]+))?"
                        r"(:(?P<config>[A-Za-z0-9_.-]+))?")


def looks_like_dataset_id(s: str) -> bool:
    return DATASET_ID.fullmatch(s) is not None \
        and not s.endswith((".json", ".jsonl", ".gz", ".csv", ".parquet"))


def parse_dataset_id(s: str) -> tuple[str, str | None, str | None]:
    """``org/name[@revision][:config]`` -> (repository, revision, config); None where absent."""
    m = DATASET_ID.fullmatch(s)
    return m["repo"], m["revision"], m["config"]


def pin_dataset_id(s: str, commit: str) -> str:
    """The id read at ``commit``: ``org/name@commit[:config]``."""
    repo, _, config = parse_dataset_id(s)
    return f"{repo}@{commit}" + (f":{config}" if config else "")


def _open_text(path: Path) -> io.TextIOBase:
    if str(path).endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path), encoding="utf-8")
    return open(path, encoding="utf-8")


def _dataset_rows(task: str, dataset_id: str, split: str) -> list[dict]:
    """The split of a dataset's snapshot, fetched into the Hugging Face cache (by the campaign's
    fetch step, or here) and read there by the `datasets` package, offline, as
    ``datasets.load_dataset`` reads a local repository (its README's configs, its files'
    split names)."""
    from ..hub import Repo, fetch

    try:
        import datasets  # optional: only for dataset ids
    except ImportError:
        raise ValueError(f"{task}: {dataset_id!r} is not a local file, and reading a dataset id "
                         "needs the `datasets` package (pip install datasets)") from None
    repo, revision, config = parse_dataset_id(dataset_id)
    snapshot = fetch(Repo(repo, revision or "main", "dataset"))
    return [dict(r) for r in datasets.load_dataset(str(snapshot.folder), config, split=split)]
