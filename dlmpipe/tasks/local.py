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
import string
from pathlib import Path

from .sources import read_records
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
    answer), never from the scored rows."""
    for problem in option_problems({"source": source, "prompt": prompt, "metric": metric,
                                    "fewshot": fewshot, "fewshot_source": fewshot_source}):
        raise ValueError(f"local: {problem}")
    path = Path(source).expanduser()
    if not path.is_file():
        raise FileNotFoundError(f"local: data file not found: {path}")
    shots = ""
    if fewshot:
        exemplars = read_records("local", Path(fewshot_source).expanduser())[:fewshot]
        shots = "".join(_render(prompt, r, choices, fewshot_source, n) + " "
                        + str(_field(r, answer, fewshot_source, n)) + "\n\n"
                        for n, r in enumerate(exemplars))
    out = []
    for n, r in enumerate(read_records("local", path)):
        row = {"task_id": str(r.get(id)) if r.get(id) not in (None, "") else f"{path.stem}/{n}",
               "prompt": shots + _render(prompt, r, choices, path, n), "kind": METRICS[metric],
               "answer": "", "code_prefix": "", "test": "", "entry_point": "",
               "response_prefix": response_prefix}
        if metric == "code":
            row["test"] = str(_field(r, test, path, n))
            row["entry_point"] = str(_field(r, entry_point, path, n)) if entry_point else ""
            row["answer"] = str(r.get(answer) or "")
        elif metric == "choice":
            options = _options(r, choices, path, n)
            row["choices"] = json.dumps(options)
            row["answer"] = _letter(_field(r, answer, path, n), options, path, n)
        else:
            row["answer"] = str(_field(r, answer, path, n)).strip()
            if metric == "numeric":
                from ..scoring.answers import is_number

                if not is_number(row["answer"]):
                    raise ValueError(f"local: {path}: record {n}: answer {row['answer']!r} is not "
                                     "a number (metric numeric)")
        out.append(row)
    return out


def option_problems(options: dict) -> list[str]:
    """What is wrong with a local task's options, each naming its key (read no file)."""
    problems = []
    metric = options.get("metric", "exact")
    if metric not in METRICS:
        problems.append(f"metric: {metric!r} is not one of {', '.join(METRICS)}")
    if not options.get("prompt"):
        problems.append("prompt: needed: a template over the rows' fields, e.g. "
                        "\"{question}\\nAnswer:\"")
    if options.get("fewshot", 0) and not options.get("fewshot_source"):
        problems.append("fewshot_source: needed with fewshot > 0: a file of exemplars with the "
                        "same fields (the scored rows are never exemplars)")
    return problems


def _field(record: dict, name: str, path, n: int):
    if name not in record:
        raise ValueError(f"local: {path}: record {n} lacks field {name!r} (fields: "
                         f"{', '.join(map(str, record))})")
    return record[name]


def _options(record: dict, choices: str | None, path, n: int) -> list[str]:
    if not choices:
        raise ValueError("local: metric choice needs `choices`, the field holding each row's "
                         "options (a list, or a JSON list)")
    value = _field(record, choices, path, n)
    if isinstance(value, str):
        value = json.loads(value)
    return [str(v) for v in value]


def _letter(answer, options: list[str], path, n: int) -> str:
    text = str(answer).strip()
    if len(text) == 1 and text.upper() in LETTERS[:len(options)]:
        return text.upper()
    if text in options:
        return LETTERS[options.index(text)]
    raise ValueError(f"local: {path}: record {n}: answer {text!r} is neither a letter of its "
                     f"{len(options)} options nor one of them")


def _render(template: str, record: dict, choices: str | None, path, n: int) -> str:
    fields = dict(record)
    if choices and choices in record:
        fields["choices"] = "\n".join(f"{LETTERS[i]}. {o}" for i, o in
                                      enumerate(_options(record, choices, path, n)))
    try:
        return template.format_map(fields)
    except KeyError as e:
        raise ValueError(f"local: prompt names field {e.args[0]!r}, which record {n} of {path} "
                         f"lacks (fields: {', '.join(map(str, record))})") from None
    except (IndexError, ValueError) as e:
        raise ValueError(f"local: prompt {template!r} is not a template: {e}") from None


def _rows(options: dict) -> int:
    path = local_file(options)
    return 0 if path is None else count_records(path)


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
        _rows, _prompt_chars, option_problems=option_problems),
)
