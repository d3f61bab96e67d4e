"""Real benchmarks by registry name: HumanEval(+/ET), MBPP(+/ET), LiveCodeBench, GSM8K, MATH-500,
BBH, GPQA, MMLU-Pro, PubMedQA, FinQA.

Each loader takes keyword options (``source`` and loader-specific ones) and returns rows in the
task-file schema (docs/ARCHITECTURE.md "File contracts"); ``limit``/``ids`` are the registry's.
Families live in their own modules: ``code`` (HumanEval/MBPP, EvalPlus, ET), ``livecodebench``,
``math`` (GSM8K, MATH-500), ``bbh``, ``multiple_choice`` (GPQA, MMLU-Pro), ``document_qa``
(PubMedQA, FinQA); ``sources`` finds and reads the data files.
"""
from __future__ import annotations

from typing import Callable

from .bbh import load_bbh
from .code import (load_humaneval, load_humaneval_et, load_humaneval_plus, load_mbpp,
                   load_mbpp_et, load_mbpp_plus)
from .document_qa import load_finqa, load_pubmedqa, load_pubmedqa_test
from .livecodebench import load_livecodebench
from .math import load_gsm8k, load_math500
from .multiple_choice import load_gpqa_diamond, load_gpqa_main, load_mmlu_pro

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
