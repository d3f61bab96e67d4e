"""A method's ``overrides:`` block: other parameters on some backbones and/or tasks.

The papers tune a method per backbone and benchmark (Archer's K, SPA-Cache's proxy rank); one
campaign states that under the method, and the method keeps its name everywhere (the summary
compares a method across backbones)::

    archer:
      sampler: {name: saber}
      cache: {name: archer, K: 8}
      overrides:
        dream: {cache: {K: 17}}          # backbone dream, every task
        humaneval: {cache: {K: 15}}      # task humaneval, every backbone
        llada/mbpp: {cache: {K: 11}}     # backbone llada on task mbpp

Rules (dlmpipe.campaign applies them and names every problem by its dotted key):

- A key is a backbone, a task, or ``<backbone>/<task>``; ``*`` stands for any (``dream/*``,
  ``*/mbpp``) and is needed only for a name that is both a backbone and a task.
- Parameters only, never a sampler or cache name, checked against the method's own entry in
  dlmpipe/registry/.
- Overrides and sweeps: an override applies to every point of the method's sweep; it may not
  change a swept parameter (the sweep puts its values in the method names, an override would
  make those names lie), and the name template may not show an overridden parameter.
- For a job (backbone b, task t) the method's parameters are taken, then b's entry, t's entry
  and b/t's entry; where b's and t's entries set one parameter to different values, b/t's entry
  must set it too (nothing wins silently).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .registry import canonical

PARTS = ("sampler", "cache")


@dataclass(frozen=True)
class Override:
    key: str              # as written in the config, for messages
    backbone: str | None  # None: every backbone
    task: str | None      # None: every task
    params: dict          # part -> {parameter: value}


def parse(where: str, block: dict, backbones: list[str],
          tasks: list[str]) -> tuple[list[Override], list[str]]:
    """The entries of ``block`` (a method's ``overrides``) with their scope, and the problems
    found in its keys and the shape of its entries (values are checked by the campaign)."""
    entries, problems, seen = [], [], {}
    for key, params in block.items():
        label = f"{where}.overrides.{key}"
        scope, problem = _scope(key, backbones, tasks)
        if problem:
            problems.append(f"{label}: {problem}")
            continue
        if scope in seen:
            problems.append(f"{label}: the same backbone and task as {where}.overrides.{seen[scope]}")
            continue
        seen[scope] = key
        named = [part for part in PARTS if "name" in params.get(part, {})]
        problems += [f"{label}.{part}.name: overrides change parameters, not the {part}; list "
                     f"another {part} as a separate method" for part in named]
        if not named:
            entries.append(Override(key, *scope, {
                part: {k: canonical(v) for k, v in params[part].items()}
                for part in PARTS if params.get(part)}))
    return entries, problems


def _scope(key: str, backbones: list[str], tasks: list[str]) -> tuple[tuple, str | None]:
    if "/" in key:
        b, t = key.split("/", 1)
        if b == t == "*":
            return (None, None), "applies everywhere; change the method's own parameters instead"
        for name, known, what in ((b, backbones, "backbone"), (t, tasks, "task")):
            if name != "*" and name not in known:
                return (None, None), (f"unknown {what} {name!r} ({what}s: {', '.join(known)})")
        return (None if b == "*" else b, None if t == "*" else t), None
    if key == "*":
        return (None, None), "applies everywhere; change the method's own parameters instead"
    if key in backbones and key in tasks:
        return (None, None), (f"{key!r} is both a backbone and a task; write {key}/* for the "
                              f"backbone or */{key} for the task")
    if key in backbones:
        return (key, None), None
    if key in tasks:
        return (None, key), None
    return (None, None), (f"{key!r} is neither a backbone ({', '.join(backbones)}) nor a task "
                          f"({', '.join(tasks)}); use <backbone>, <task> or <backbone>/<task>")


def check(where: str, spec: dict, entries: list[Override], shown: set[str],
          problems_of: Callable[[str, dict], list[tuple[str, str]]]) -> tuple[list[Override], list[str]]:
    """The valid entries of a method's overrides, and the problems of the others: changing a
    swept parameter or one the name template shows (``shown``), or a value the method's own
    sampler/cache rejects (``problems_of(part, spec)``: (parameter, problem) pairs)."""
    problems, bad = [], set()
    swept = set(spec.get("sweep") or {})
    for field, key in overridden(entries).items():
        if field in swept:
            problems.append(f"{where}.overrides.{key}.{field}: {field} is swept ({where}.sweep); "
                            "an override cannot change a swept parameter (its values name the "
                            "methods): sweep it, or make separate methods")
        if field in shown:
            problems.append(f"{where}.name: template field {{{field}}} is overridden "
                            f"({where}.overrides.{key}); a method keeps one name on every "
                            "backbone and task")
    for e in entries:
        for part, params in e.params.items():
            for k, problem in problems_of(part, {**spec[part], **params}):
                bad.add(e.key)
                problems.append(f"{where}.overrides.{e.key}.{part}.{k}: {problem}")
    return [e for e in entries if e.key not in bad], problems


def overridden(entries: list[Override]) -> dict[str, str]:
    """Dotted parameter (``cache.K``) -> the first entry key that overrides it."""
    out: dict[str, str] = {}
    for e in entries:
        for part, params in e.params.items():
            for k in params:
                out.setdefault(f"{part}.{k}", e.key)
    return out


def apply(where: str, method: dict, entries: list[Override], backbone: str,
          task: str) -> tuple[dict, list[Override], list[str]]:
    """The method's parameters on (backbone, task): its own, then the entries that apply, the
    entries applied, and the conflicts found (between a backbone's and a task's entry)."""
    by_backbone = [e for e in entries if e.backbone == backbone and e.task is None]
    by_task = [e for e in entries if e.backbone is None and e.task == task]
    both = [e for e in entries if e.backbone == backbone and e.task == task]
    applied = by_backbone + by_task + both
    if not applied:
        return method, [], []
    problems = []
    for eb in by_backbone:
        for et in by_task:
            for part, params in eb.params.items():
                for k, v in params.items():
                    other = et.params.get(part, {}).get(k, v)
                    settled = any(k in e.params.get(part, {}) for e in both)
                    if other != v and not settled:
                        problems.append(
                            f"{where}.overrides: {eb.key} and {et.key} both set {part}.{k} "
                            f"({v!r} and {other!r}) on {backbone}/{task}; set it in "
                            f"{where}.overrides.{backbone}/{task}.{part}.{k} to choose")
    out = {**method, **{part: dict(method[part]) for part in PARTS}}
    for e in applied:
        for part, params in e.params.items():
            out[part].update(params)
    return out, applied, problems
