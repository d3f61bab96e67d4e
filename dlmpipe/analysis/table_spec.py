"""Which summary rows a paper-style table shows (the campaign's ``tables:`` section).

A table lists rows by method: an expanded method name (``archer-k8``) is one row; a base name
(``archer``) is one row per method of its sweep, unless the table gives ``operating_points``:
then the base is one row showing, per task (and backbone), the sweep point the paper reports
(Archer: K = 11 on MBPP, 10 on LiveCodeBench, 8 on HumanEval). Operating points name one swept
base per table. Kept free of pandas so the Snakefile's config check can use it.
"""
from __future__ import annotations

from dataclasses import dataclass

STYLES = ("archer", "spa")


@dataclass(frozen=True)
class Row:
    label: str
    methods: dict  # (backbone, task) -> the expanded method shown in that cell


def operating_point(spec: dict, task: str, backbone: str) -> str | None:
    """The method an operating point names for (task, backbone), or None."""
    value = spec.get("operating_points", {}).get(task)
    return value.get(backbone) if isinstance(value, dict) else value


def table_axes(spec: dict, backbones: list[str], tasks: list[str]) -> tuple[list[str], list[str]]:
    """The table's backbones and tasks, in the table's order (default: the campaign's)."""
    return list(spec.get("backbones") or backbones), list(spec.get("tasks") or tasks)


def table_rows(spec: dict, origin: dict[str, str], backbones: list[str], tasks: list[str]) -> list[Row]:
    """Rows in order. ``origin`` maps every expanded method to its base name, in campaign order."""
    backbones, tasks = table_axes(spec, backbones, tasks)
    cells = [(b, t) for b in backbones for t in tasks]
    swept = {origin[m] for m in _named_points(spec) if m in origin}
    entries = spec.get("methods") or list(dict.fromkeys(origin.values()))
    rows = []
    for entry in entries:
        if entry in swept:
            rows.append(Row(entry, {(b, t): operating_point(spec, t, b) for b, t in cells}))
        elif entry in origin.values():  # a base name: every point of its sweep
            rows += [Row(m, {c: m for c in cells}) for m, base in origin.items() if base == entry]
        else:  # one expanded method
            rows.append(Row(entry, {c: entry for c in cells}))
    return rows


def _named_points(spec: dict) -> list[str]:
    out = []
    for value in spec.get("operating_points", {}).values():
        out += list(value.values()) if isinstance(value, dict) else [value]
    return out


def table_problems(name: str, spec: dict, origin: dict[str, str], backbones: list[str],
                   tasks: list[str], speedup_names: list[str]) -> list[str]:
    """Problems of one table spec, each naming its dotted key (``tables.<name>.<key>``)."""
    where = f"tables.{name}"
    problems = []
    for key, known in (("backbones", backbones), ("tasks", tasks)):
        for i, v in enumerate(spec.get(key) or []):
            if v not in known:
                problems.append(f"{where}.{key}[{i}]: {v!r} is not one of the campaign's {key} "
                                f"({', '.join(known)})")
    bases = list(dict.fromkeys(origin.values()))
    for i, m in enumerate(spec.get("methods") or []):
        if m not in origin and m not in bases:
            problems.append(f"{where}.methods[{i}]: {m!r} is neither a method nor a base method "
                            f"of this campaign (base methods: {', '.join(bases)})")
    for i, m in enumerate(spec.get("speedup_against") or []):
        if m not in speedup_names:
            problems.append(f"{where}.speedup_against[{i}]: {m!r} has no speedup column; the "
                            f"summary has speedups against {', '.join(speedup_names)} "
                            "(reference_method and also_speedup_against)")
    if spec.get("tps_against") is not None and spec["tps_against"] not in origin:
        problems.append(f"{where}.tps_against: {spec['tps_against']!r} is not a method of this "
                        "campaign")
    if problems:
        return problems
    t_backbones, t_tasks = table_axes(spec, backbones, tasks)
    points = spec.get("operating_points", {})
    named_bases = set()
    for task, value in points.items():
        key = f"{where}.operating_points.{task}"
        if task not in t_tasks:
            problems.append(f"{key}: {task!r} is not a task of this table ({', '.join(t_tasks)})")
            continue
        per = value if isinstance(value, dict) else {None: value}
        for b, m in per.items():
            k = key if b is None else f"{key}.{b}"
            if b is not None and b not in t_backbones:
                problems.append(f"{k}: {b!r} is not a backbone of this table "
                                f"({', '.join(t_backbones)})")
            elif m not in origin:
                problems.append(f"{k}: {m!r} is not a method of this campaign")
            else:
                named_bases.add(origin[m])
    if len(named_bases) > 1:
        problems.append(f"{where}.operating_points: name points of one swept base method per "
                        f"table, not of {', '.join(sorted(named_bases))}")
    if problems or not named_bases:
        return problems
    (base,) = named_bases
    if spec.get("methods") and base not in spec["methods"]:
        problems.append(f"{where}.operating_points: they choose points of {base!r}, which is "
                        f"not listed in {where}.methods (list the base name, not a point)")
    for t in t_tasks:
        for b in t_backbones:
            if operating_point(spec, t, b) is None:
                problems.append(f"{where}.operating_points.{t}"
                                + (f".{b}" if isinstance(points.get(t), dict) else "")
                                + f": missing; every task and backbone of the table needs "
                                f"the point of {base!r} it reports")
    return problems
