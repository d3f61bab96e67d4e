"""Which summary rows a paper-style table shows (the campaign's ``tables:`` section).

A table lists rows by method: an expanded method name (``archer-k8``) is one row; a base name
(``archer``) is one row per method of its sweep, unless the table gives ``operating_points``:
then the base is one row showing, per task (and backbone), the sweep point the paper reports
(Archer: K = 11 on MBPP, 10 on LiveCodeBench, 8 on HumanEval). Operating points name one swept
base per table. Kept free of pandas so the Snakefile's config check can use it.

A table may carry the paper's numbers (``reported``: row -> column -> value, rows keyed as the
table groups them: backbone then method label for the archer style, task then method label for
the spa style) and the ``tolerance`` a measured cell may differ from them by, per column or per
unit (``%``: percentage points, ``x``: ratios, ``s``, ``ms``, ``TPS``), absolute or relative to
the reported value. ``table_columns`` lists the columns a table can have, so a misspelt row or
column is a config error naming it (``reported_problems``).
"""
from __future__ import annotations

from dataclasses import dataclass

STYLES = ("archer", "spa")
UNITS = ("%", "x", "s", "ms", "TPS")  # what a tolerance may be stated per (a column's unit)


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
    if problems:
        return problems
    if not named_bases:
        return reported_problems(name, spec, origin, backbones, tasks, speedup_names)
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
    return problems or reported_problems(name, spec, origin, backbones, tasks, speedup_names)


# ---- the paper's reported numbers -------------------------------------------------------------
def table_columns(spec: dict, backbones: list[str], tasks: list[str],
                  speedup_names: list[str]) -> list[str]:
    """Every number column the table's style can write (``tables.py``), in order;
    ``speedup_names``: the reference method, then the ``also_speedup_against`` methods. An
    archer table's extended-test column is listed for every task (whether a task has extended
    tests shows only in the summary)."""
    t_backbones, t_tasks = table_axes(spec, backbones, tasks)
    if spec["style"] == "archer":
        against = spec.get("speedup_against") or speedup_names
        ext = spec.get("extended_label", "+")
        cols = [c for t in t_tasks for c in (f"{t} base (%)", f"{t} {ext} (%)", f"{t} latency (s)",
                                             *(f"{t} speedup vs {a} (x)" for a in against))]
        return cols + ["overall quality (%)", *(f"overall speedup vs {a} (x)" for a in against)]
    against = spec.get("tps_against") or speedup_names[0]
    return [c for b in t_backbones for c in (f"{b} TPS", f"{b} TPS vs {against} (x)",
                                             f"{b} TTFT (ms)", f"{b} accuracy (%)", f"{b} SE (%)")]


def row_axis(style: str) -> str:
    """What a table row is grouped by besides its method: backbone (archer) or task (spa)."""
    return "backbone" if style == "archer" else "task"


def reported_cells(spec: dict) -> dict[tuple[str, str, str], float]:
    """``reported`` as {(backbone or task, method label, column): value}. A column may be
    written nested at its first space (``{llada-8b-instruct: {TPS: 29.67}}`` is the column
    ``llada-8b-instruct TPS``), which keeps a row of one backbone's columns on one line."""
    cells = {}
    for outer, rows in (spec.get("reported") or {}).items():
        for label, columns in rows.items():
            for col, value in columns.items():
                if isinstance(value, dict):
                    cells.update({(outer, label, f"{col} {sub}"): v for sub, v in value.items()})
                else:
                    cells[(outer, label, col)] = value
    return cells


def column_unit(column: str) -> str:
    """A column's unit: what its trailing parentheses say, or TPS."""
    if column.endswith(")") and "(" in column:
        return column[column.rindex("(") + 1:-1]
    return "TPS" if column.endswith("TPS") else ""


def tolerance_for(spec: dict, column: str) -> tuple[str, float] | None:
    """(``absolute`` or ``relative``, amount) for ``column``: its own entry, else its unit's."""
    tol = spec.get("tolerance") or {}
    entry = tol.get(column) or tol.get(column_unit(column))
    return None if not entry else next(iter(entry.items()))


def reported_problems(name: str, spec: dict, origin: dict[str, str], backbones: list[str],
                      tasks: list[str], speedup_names: list[str]) -> list[str]:
    """Problems of a table's ``reported``/``tolerance``: every row, column and tolerance key
    must be the table's own (a typo would silently compare nothing), every reported column
    needs a tolerance."""
    where = f"tables.{name}"
    reported, tol = spec.get("reported") or {}, spec.get("tolerance") or {}
    if not reported and not tol:
        return []
    axis = row_axis(spec["style"])
    t_backbones, t_tasks = table_axes(spec, backbones, tasks)
    outers = t_backbones if axis == "backbone" else t_tasks
    labels = list(dict.fromkeys(r.label for r in table_rows(spec, origin, backbones, tasks)))
    columns = table_columns(spec, backbones, tasks, speedup_names)
    problems = []
    for key in tol:
        if key not in UNITS and key not in columns:
            problems.append(f"{where}.tolerance.{key}: neither a unit ({', '.join(UNITS)}) nor a "
                            f"column of this table ({', '.join(columns)})")
    for outer, rows in reported.items():
        if outer not in outers:
            problems.append(f"{where}.reported.{outer}: {outer!r} is not a {axis} of this table "
                            f"({', '.join(outers)})")
            continue
        for label, cols in rows.items():
            if label not in labels:
                problems.append(f"{where}.reported.{outer}.{label}: {label!r} is not a row of this "
                                f"table (its rows: {', '.join(labels)})")
    if problems:
        return problems
    for (outer, label, col), value in reported_cells(spec).items():
        key = f"{where}.reported.{outer}.{label}.{col}"
        if col not in columns:
            problems.append(f"{key}: {col!r} is not a column of this table (its columns: "
                            f"{', '.join(columns)})")
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{key}: {value!r} is not a number")
        elif tolerance_for(spec, col) is None:
            problems.append(f"{key}: no tolerance for this column; give {where}.tolerance."
                            f"{column_unit(col) or col} (or one for the column itself)")
    return problems
