"""Scoring one completion of a code task: assemble the program, build its suites, run them.

A task row's ``test`` is the base suite and its optional ``plus_test`` the extended one (EvalPlus
"plus" inputs or ET tests). Each is Python test code or a JSON test spec (``{"format": ...}``;
see harness.py). Both run in one sandbox, base first; ``plus`` counts as passed only when base
passed too (EvalPlus's base+extra convention).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache

from ..tasks.code import from_tagged
from ..tasks.extract import program_for
from .levels import isolation
from .references import REFERENCES, References
from .sandbox import Isolation, Limits, RunResult, run_suites


@dataclass(frozen=True)
class Settings:
    """Time limits (seconds) and resources for executing generated code.

    ``time_limit`` bounds each suite; a differential (EvalPlus) suite may take up to
    ``time_factor`` x its reference's total time when that is longer, and each of its inputs
    ``max(min_input_time, time_factor * reference time)`` (EvalPlus's defaults: 4.0 s and 4.0);
    LiveCodeBench cases get ``case_time_limit`` each. The wall-clock kill follows (sandbox.py).
    """

    time_limit: float = 30.0
    min_input_time: float = 4.0
    time_factor: float = 4.0
    case_time_limit: float = 6.0
    load_time_limit: float = 10.0
    limits: Limits = field(default_factory=Limits)

    @classmethod
    def from_options(cls, options: dict | None) -> "Settings":
        options = dict(options or {})
        limits = Limits(**options.pop("limits", {}))
        known = {k: float(options[k]) for k in ("time_limit", "min_input_time", "time_factor",
                                                 "case_time_limit", "load_time_limit")
                 if k in options}
        return cls(limits=limits, **known)


def parse_test(test: str, object_hook=None) -> dict:
    """A suite spec from a ``test``/``plus_test`` cell: JSON spec or Python test code."""
    text = test.lstrip()
    if text.startswith("{"):
        try:
            spec = json.loads(text, object_hook=object_hook)
        except json.JSONDecodeError:
            spec = None
        if isinstance(spec, dict) and "format" in spec:
            return spec
    return {"format": "assert", "code": test}


@lru_cache(maxsize=64)
def _parsed(test: str) -> dict:
    """The spec with its tuples, sets and complex numbers decoded, as the sandbox gets them."""
    return parse_test(test, object_hook=from_tagged)


def suites_for(row: dict, settings: Settings) -> list[dict]:
    suites = []
    for name, column in (("base", "test"), ("plus", "plus_test")):
        if not row.get(column):
            continue
        spec = dict(_parsed(row[column]))
        spec.setdefault("entry_point", row.get("entry_point", ""))
        spec.update(name=name, time_limit=settings.time_limit,
                    min_input_time=settings.min_input_time, time_factor=settings.time_factor,
                    case_time_limit=settings.case_time_limit)
        suites.append(spec)
    return suites


def program_of(row: dict, completion: str) -> str:
    stdin_task = bool(row.get("test")) and _parsed(row["test"])["format"] == "stdin"
    return program_for(completion, entry_point=row.get("entry_point", ""),
                       code_prefix=row.get("code_prefix", ""),
                       response_prefix=row.get("response_prefix", ""),
                       sanitize_program=not stdin_task)


def run_code(row: dict, program: str, settings: Settings, iso: Isolation | None = None,
             references: References = REFERENCES, share: bool = True) -> RunResult:
    """``iso`` None: this process's level (levels.isolation: $DLMPIPE_SANDBOX, else bwrap).
    Differential suites reuse the reference outputs an earlier sample computed (references.py;
    outputs too large to keep are computed by every sample, which does not send them back);
    ``share`` False: no later sample needs this one's, so its sandbox computes the outputs
    without sending them back (stored ones are still used)."""
    iso = iso if iso is not None else isolation()
    suites = suites_for(row, settings)
    keys, first = {}, []
    for suite, column in zip(suites, [c for c in ("test", "plus_test") if row.get(c)]):
        if suite["format"] == "evalplus":
            key = (row[column], iso.python)
            if not share:
                blob = references.stored(key)
                if blob:
                    suite["expected"] = blob
                continue
            blob, is_first = references.claim(key, wait=not first)
            if blob:
                suite["expected"] = blob
            elif not references.sendable(key):  # too large: computed here, not pickled
                suite["share_reference"] = False
            else:
                keys[suite["name"]] = key
                if is_first:
                    first.append(key)

    def store(sent: dict[str, str]) -> None:
        for name, key in keys.items():
            if key in first or name in sent:
                references.settle(key, sent.get(name))
        first.clear()

    try:
        return run_suites(program, suites, limits=settings.limits, iso=iso,
                          load_time_limit=settings.load_time_limit,
                          on_references=store if keys else None)
    finally:
        for key in first:  # the run never reported (e.g. an exception): release the waiters
            references.settle(key, None)


def verdict(result: RunResult) -> dict:
    """Score columns of one sample from its sandbox run."""
    base = result.suites.get("base")
    plus = result.suites.get("plus")
    passed = base is not None and base.status == "passed"
    out = {"passed": passed, "score": 1.0 if passed else 0.0,
           "status": base.status if base else "error", "detail": (base.detail if base else "no test"),
           "isolation": result.isolation, "plus_passed": None, "plus_status": None}
    if plus is not None:
        out["plus_passed"] = passed and plus.status == "passed"
        out["plus_status"] = plus.status if passed else f"base-{out['status']}"
    return out


def score_code(row: dict, completion: str, settings: Settings,
               iso: Isolation | None = None, share: bool = True) -> dict:
    if not row.get("test") and not row.get("plus_test"):
        return {"passed": False, "score": 0.0, "status": "error", "detail": "task has no tests",
                "isolation": "none", "plus_passed": None, "plus_status": None}
    return verdict(run_code(row, program_of(row, completion), settings, iso, share=share))
