"""The config's `analyses:` section expanded into targets (docs/ANALYSES.md, "In a campaign").

Each entry names methods, and optionally tasks and backbones (null: every one); its other keys
are the analysis's options. The campaign check (dlmpipe/campaign.py) calls ``expand_analyses``
before any job runs. No torch.
"""
from __future__ import annotations

import itertools
from typing import Callable

from .. import registry

Target = tuple[str, str, str]  # (backbone, task, method)


def expand_analyses(section: dict[str, list[dict]], backbones: list[str], tasks: list[str],
                    methods: dict[str, dict], method: Callable[[str, str, str], dict],
                    runs: Callable[[str, str, str], bool],
                    ) -> tuple[dict[str, dict[Target, dict]], list[str]]:
    """analysis -> {(backbone, task, method): options}, and the problems found, each named by
    its dotted key: names that are not in the campaign, a target listed twice within one
    analysis, an intervention on a cache without a prompt snapshot (``method(name, task,
    backbone)`` is the campaign's concrete method of a job). An entry covers the backbones and
    tasks each of its methods runs on (``runs(method, backbone, task)``); a method that runs
    on none of them is a problem."""
    known = {"methods": list(methods), "tasks": tasks, "backbones": backbones}
    out: dict[str, dict[Target, dict]] = {}
    problems: list[str] = []
    for kind, entries in section.items():
        out[kind] = {}
        for n, entry in enumerate(entries):
            where = f"analyses.{kind}[{n}]"
            names = {k: entry[k] if entry.get(k) is not None else known[k] for k in known}
            for k in known:
                problems += [f"{where}.{k}[{j}]: {name!r} is not one of this campaign's {k} "
                             f"({', '.join(known[k])})"
                             for j, name in enumerate(names[k]) if name not in known[k]]
            options = {k: v for k, v in entry.items() if k not in known}
            cells = [(b, t) for b in names["backbones"] for t in names["tasks"]
                     if b in backbones and t in tasks]
            if entry.get("methods") is not None:  # a named method must run on one of the cells
                problems += [f"{where}.methods[{j}]: {m!r} runs on none of this entry's backbones "
                             "and tasks (its backbones:/tasks: in methods)"
                             for j, m in enumerate(names["methods"])
                             if m in methods and not any(runs(m, b, t) for b, t in cells)]
            for (b, t), m in itertools.product(cells, names["methods"]):
                if m not in methods or not runs(m, b, t):
                    continue  # an unknown name (reported above), or outside the method's scope
                if (b, t, m) in out[kind]:
                    problems.append(f"{where}: {b}/{t}/{m} is already analysed by an earlier "
                                    f"entry of analyses.{kind}")
                out[kind][(b, t, m)] = options
                cache = method(m, t, b)["cache"]["name"]
                if kind == "intervention" and not registry.lookup("cache", cache).feedback_intervention:
                    able = [c for c, e in registry.CACHES.items() if e.feedback_intervention]
                    problems.append(f"{where}.methods: {m!r} decodes with cache {cache!r}, which "
                                    "has no prompt snapshot to keep or rebuild; the intervention "
                                    f"needs one of: {', '.join(able)}")
    return out, problems
