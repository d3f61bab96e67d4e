"""Your own dataset without code (docs/SCORING.md, "Your own dataset"): a local .jsonl, .json,
.csv or .parquet file (maybe gzipped) whose rows become prompts through a template over their
fields, scored by a metric named in the campaign config, as lm-evaluation-harness's YAML tasks do:

    tasks:
      mine: {benchmark: local, source: my.jsonl, prompt: "{question}\\nAnswer:",
             answer: answer, metric: numeric, gen_length: 64}

Metrics: ``exact`` (the whole completion, stripped), ``numeric`` (the last number against the
answer as numbers), ``choice`` (a letter among the ``choices`` field's options; the answer a
letter or an option's text), ``code`` (the ``test`` field's Python asserts run after the program
in the sandbox). Ids come from the ``id`` field, else ``<file stem>/<row>``.
"""
from __future__ import annotations

import inspect
import json
import re
import string
from pathlib import Path

from .sources import DataNotFound, option_list, read_records
from .spec import DOC, Benchmark, DataFile, count_records, local_file

#: metric -> the task row's scoring kind (dlmpipe/scoring/answers.py, the sandbox for code)
METRICS = {"exact": "exact", "numeric": "math", "choice": "choice", "code": "code"}
LETTERS = string.ascii_uppercase


def load_local(source: str | None = None, prompt: str | None = None, answer: str = "answer",
               metric: str = "exact", id: str = "id", choices: str | None = None,
               test: str = "test", entry_point: str | None = None, response_prefix: str = "",
               fewshot: int = 0, fewshot_source: str | None = None) -> list[dict]:
    """Rows of ``source`` as task rows: ``prompt`` formatted with each record's fields (and
    ``{choices}``: the options as lettered lines), the reference from field ``answer``, the
    scoring kind from ``metric``; ``fewshot`` exemplars from ``fewshot_source`` (prompt then
    answer), never from the scored rows. The first problem ``record_problems`` would report is
    a ValueError naming the option, the field, the record and the file."""
    options = {k: v for k, v in locals().items() if k in DEFAULTS}
    for problem in option_problems(options):
        raise ValueError(f"local: {problem}")
    return _Rows(options, _Found(raise_first=True)).rows()


#: the loader's options with their defaults
DEFAULTS = {name: p.default for name, p in inspect.signature(load_local).parameters.items()}


def record_problems(options: dict) -> list[str]:
    """What is wrong with the records of a local task's files, read before any job (``check``
    and ``plan``): each problem once, starting with its option (``prompt``, ``answer``, ``id``,
    ...), naming the field, the first record that shows it and the file, with how many records
    show it. Files that are missing are ``check``'s data problems, not these."""
    options = DEFAULTS | dict(options)
    if option_problems(options) or local_file(options) is None:
        return []
    if options["fewshot"] and local_file(options, "fewshot_source") is None:
        return []
    found = _Found(raise_first=False)
    _Rows(options, found).rows()
    return found.lines()


def option_problems(options: dict) -> list[str]:
    """What is wrong with a local task's options, each naming its key (read no file)."""
    problems = []
    metric = options.get("metric", "exact")
    if metric not in METRICS:
        problems.append(f"metric: {metric!r} is not one of {', '.join(METRICS)}")
    if not options.get("prompt"):
        problems.append("prompt: needed: a template over the rows' fields, e.g. "
                        "\"{question}\\nAnswer:\"")
    else:
        try:
            template_fields(options["prompt"])
        except ValueError as e:
            problems.append(f"prompt: {options['prompt']!r} is not a template: {e}")
    if metric == "choice" and not options.get("choices"):
        problems.append("choices: needed with metric choice: the field holding each row's "
                        "options (a list, or a JSON list)")
    if options.get("fewshot", 0) and not options.get("fewshot_source"):
        problems.append("fewshot_source: needed with fewshot > 0: a file of exemplars with the "
                        "same fields (the scored rows are never exemplars)")
    return problems


def template_fields(template: str) -> list[str]:
    """The record fields a prompt template names (``{question}``, ``{row[0]}``: ``row``); a
    ValueError for a malformed template or a field without a name (``{}``, ``{0}``)."""
    fields = []
    for _, name, _, _ in string.Formatter().parse(template):
        if name is None:
            continue
        root = re.split(r"[.\[]", name, maxsplit=1)[0]
        if not root or root.isdigit():
            raise ValueError(f"{{{name}}} names no field (write {{field}})")
        fields.append(root)
    return list(dict.fromkeys(fields))


class _Found:
    """The problems of records: raised at the first (a job), or gathered once per kind with the
    first message and how many records show it (``check``)."""

    def __init__(self, raise_first: bool):
        self.raise_first = raise_first
        self.kinds: dict[tuple, list] = {}

    def __call__(self, key: str, kind, message: str) -> None:
        if self.raise_first:
            raise ValueError(f"local: {key}: {message}")
        self.kinds.setdefault((key, kind), [message, 0])[1] += 1

    def lines(self) -> list[str]:
        return [f"{key}: {message}" + (f" ({n} records in all)" if n > 1 else "")
                for (key, _), (message, n) in self.kinds.items()]


class _Rows:
    """A local task's rows built record by record, every problem told to ``found``."""

    def __init__(self, options: dict, found: _Found):
        self.o, self.found = options, found

    def rows(self) -> list[dict]:
        o = self.o
        path = _existing(o["source"], "source")
        shots = self._shots() if o["fewshot"] else ""
        records = self._read("source", path)
        if records is not None and not records:
            self.found("source", "empty", f"{path} holds no records")
        named = [r.get(o["id"]) not in (None, "") for r in records or []]
        # ids from a field the campaign names, or the default field where some records have it
        self.every_id = o["id"] != DEFAULTS["id"] or any(named)
        out, ids = [], {}
        for n, r in enumerate(records or []):
            row = self._row(r, path, n, shots)
            if row is None:
                continue
            first = ids.setdefault(row["task_id"], n)
            if first != n:
                self.found("id", ("duplicate", row["task_id"]), f"records {first} and {n} of {path} "
                           f"share the id {row['task_id']!r} (each sample's id must be unique)")
            out.append(row)
        return out

    def _read(self, key: str, path: Path) -> list[dict] | None:
        try:
            return read_records("local", path)
        except ValueError as e:
            self.found(key, "malformed", str(e).removeprefix("local: "))
            return None

    def _shots(self) -> str:
        o = self.o
        path = _existing(o["fewshot_source"], "fewshot_source")
        exemplars = self._read("fewshot_source", path)
        if exemplars is None:
            return ""
        if len(exemplars) < o["fewshot"]:
            self.found("fewshot", "short", f"{o['fewshot']} exemplars, but {path} holds "
                       f"{len(exemplars)} record{'s' * (len(exemplars) != 1)}")
        shots = []
        for n, r in enumerate(exemplars[:o["fewshot"]]):
            text = self._render(r, path, n, "fewshot_source", self._choices(r, path, n, "fewshot_source"))
            reference = self._field(r, o["answer"], path, n, "fewshot_source")
            if text is not None and reference is not None:
                shots.append(f"{text} {reference}\n\n")
        return "".join(shots)

    def _row(self, r: dict, path: Path, n: int, shots: str) -> dict | None:
        o = self.o
        metric = o["metric"]
        row = {"task_id": self._id(r, path, n), "prompt": None, "kind": METRICS[metric],
               "answer": "", "code_prefix": "", "test": "", "entry_point": "",
               "response_prefix": o["response_prefix"]}
        options = self._choices(r, path, n, "choices")
        text = self._render(r, path, n, "prompt", options)
        if text is not None:
            row["prompt"] = shots + text
        if metric == "code":
            row["test"] = self._field(r, o["test"], path, n, "test")
            row["entry_point"] = (self._field(r, o["entry_point"], path, n, "entry_point")
                                  if o["entry_point"] else "")
            row["answer"] = str(r.get(o["answer"]) or "")
        elif metric == "choice":
            reference = self._field(r, o["answer"], path, n, "answer")
            if options is not None and reference is not None:
                row["choices"] = json.dumps(options)
                row["answer"] = self._letter(reference, options, path, n)
            else:
                row["answer"] = None
        else:
            reference = self._field(r, o["answer"], path, n, "answer")
            row["answer"] = None if reference is None else reference.strip()
            if metric == "numeric" and row["answer"] is not None:
                from ..scoring.answers import is_number

                if not is_number(row["answer"]):
                    self.found("answer", "number", f"record {n} of {path}: {row['answer']!r} is "
                               "not a number (metric numeric)")
                    row["answer"] = None
        return None if any(v is None for v in row.values()) else row

    def _id(self, r: dict, path: Path, n: int) -> str:
        key = self.o["id"]
        if r.get(key) not in (None, ""):
            return str(r[key])
        if self.every_id:
            self.found("id", ("lacks", key), f"record {n} of {path} has no field {key!r} (its "
                       f"id would be {path.stem}/{n}; its fields: {_names(r)})")
        return f"{path.stem}/{n}"

    def _field(self, record: dict, name: str, path: Path, n: int, key: str) -> str | None:
        if name in record:
            return str(record[name])
        self.found(key, ("lacks", name), f"record {n} of {path} lacks field {name!r} (its "
                   f"fields: {_names(record)})")
        return None

    def _choices(self, record: dict, path: Path, n: int, key: str) -> list[str] | None:
        """The record's options, where the task names a choices field that a choice task needs
        or the record has (None: none, or a problem told)."""
        name = self.o["choices"]
        if not name or (self.o["metric"] != "choice" and name not in record):
            return None
        if name not in record:
            self._field(record, name, path, n, key)
            return None
        value = option_list(record[name])
        if value is None:
            self.found(key, "list", f"record {n} of {path}: field {name!r} is not a list "
                       "of options (nor a JSON list)")
            return None
        return [str(v) for v in value]

    def _letter(self, answer: str, options: list[str], path: Path, n: int) -> str | None:
        text = answer.strip()
        if len(text) == 1 and text.upper() in LETTERS[:len(options)]:
            return text.upper()
        if text in options:
            return LETTERS[options.index(text)]
        self.found("answer", "letter", f"record {n} of {path}: {text!r} is neither a letter of "
                   f"its {len(options)} options nor one of them")
        return None

    def _render(self, record: dict, path: Path, n: int, key: str,
                options: list[str] | None) -> str | None:
        template, choices = self.o["prompt"], self.o["choices"]
        fields = dict(record)
        if choices and choices in record:
            if options is None:
                return None  # told by _choices
            fields["choices"] = "\n".join(f"{LETTERS[i]}. {o}" for i, o in enumerate(options))
        missing = [f for f in template_fields(template) if f not in fields]
        for f in missing:
            where = "exemplar record" if key == "fewshot_source" else "record"
            self.found(key, ("names", f), f"the prompt names field {f!r}, which {where} {n} of "
                       f"{path} lacks (its fields: {_names(record)})")
        if missing:
            return None
        try:
            return template.format_map(fields)
        except (AttributeError, IndexError, KeyError, TypeError, ValueError) as e:
            self.found(key, "format", f"record {n} of {path}: the prompt cannot be filled in: "
                       f"{type(e).__name__}: {e}")
            return None


def _names(record: dict) -> str:
    return ", ".join(map(str, record)) or "none"


def _existing(value: str, key: str) -> Path:
    path = Path(value).expanduser().absolute()
    if not path.is_file():
        raise DataNotFound("local", key, given=path)
    return path


def _rows(options: dict) -> int:
    """Records of the task's file; its absence is a DataNotFound (``check`` and ``plan`` report
    it first), never 0 rows."""
    path = local_file(options)
    if path is None:
        raise DataNotFound("local", "source", given=Path(options.get("source") or "").absolute())
    return count_records(path)


def _prompt_chars(options: dict) -> int:
    """Mean length of the first 100 rendered prompts (500 where the file is not here)."""
    path = local_file(options)
    if path is None or not options.get("prompt"):
        return 500
    try:
        taken = inspect.signature(load_local).parameters
        rows = load_local(**{k: v for k, v in options.items() if k in taken})[:100]
    except (OSError, ValueError):
        return 500
    return round(sum(len(r["prompt"]) + len(r["response_prefix"]) for r in rows) / max(1, len(rows)))


BENCHMARKS = (
    Benchmark("local", load_local, (
        DataFile("source", None, local=True,
                 why=f"needed: the local .jsonl/.csv/.parquet file of the task's rows ({DOC})"),
        DataFile("fewshot_source", None, lambda o: o["fewshot"] > 0, local=True,
                 why="needed with fewshot > 0: a file of exemplars with the same fields (the "
                     "scored rows are never exemplars)")),
        _rows, _prompt_chars, option_problems=option_problems, record_problems=record_problems),
)
