"""Sweeps -> concrete, named methods: each point of a method's sweep (cartesian, in config order)
checked against the registry's sampler/cache blocks and named readably (``archer-k8``,
``spa-r128-adaptive``, or the method's ``name`` template), the same on every backbone and task.
"""
from __future__ import annotations

import copy
import itertools
import re

from ..config_schema import explain, validator_for
from ..registry import canonical

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")
TEMPLATE_FIELD = re.compile(r"\{([^{}]*)\}")


def name_part(value) -> str:
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value).lower()


#: keys of a method besides its sampler/cache parameters that a sweep may vary, and their label
#: in default names (llada-confidence-g256, sdar-b8: a block-causal backbone's block size)
METHOD_KEYS = {"gen_length": "g", "block_size": "b"}


def get_dotted(method: dict, field: str):
    if field in METHOD_KEYS:
        if method.get(field) is None:
            raise KeyError(field)
        return method[field]
    part, _, param = field.partition(".")
    if part not in ("sampler", "cache") or param not in method[part]:
        raise KeyError(field)
    return method[part][param]


def name_label(field: str) -> str:
    return METHOD_KEYS.get(field) or field.rsplit(".", 1)[-1].lower()


def method_name(base: str, spec: dict, method: dict, swept: list[str]) -> str:
    template = spec.get("name")
    if template is None:
        return base + "".join(f"-{name_label(k)}{name_part(get_dotted(method, k))}" for k in swept)
    return TEMPLATE_FIELD.sub(lambda m: name_part(get_dotted(method, m.group(1))), template)


def expand_method(base: str, spec: dict, schema: dict) -> tuple[list[dict], list[str]]:
    """All points of one method's sweep (cartesian, in config order) and the problems found."""
    sweep = spec.get("sweep") or {}
    swept = list(sweep)
    where = f"methods.{base}"
    methods, problems = [], []
    for field in swept:
        if field.endswith(".name"):
            problems.append(f"{where}.sweep.{field}: sweeps vary parameters; list other "
                            "samplers/caches as separate methods")
    if problems:
        return [], problems
    for point in itertools.product(*(sweep[k] for k in swept)):
        method = {"sampler": copy.deepcopy(spec["sampler"]), "cache": copy.deepcopy(spec["cache"]),
                  **{k: spec.get(k) for k in METHOD_KEYS}}
        for field, value in zip(swept, point):
            if field in METHOD_KEYS:
                method[field] = value
                key_schema = schema["$defs"]["method"]["properties"][field]
                for err in validator_for(schema, key_schema).iter_errors(value):
                    problems.append(f"{where}.sweep.{field}: {value!r}: {err.message}")
                continue
            part, param = field.split(".", 1)
            method[part][param] = value
        for part in ("sampler", "cache"):
            for err in validator_for(schema, schema["$defs"][part]).iter_errors(method[part]):
                for line in explain(err, schema):
                    k, _, rest = line.partition(": ")
                    field = f"{part}.{k}" if k != "(top level)" else part
                    label = (f"{where}.sweep.{field}" if field in sweep else f"{where}.{field}")
                    problems.append(f"{label}: {rest}")
            method[part] = {k: canonical(v) for k, v in method[part].items()}
        if problems:
            return [], problems
        try:
            method["name"] = method_name(base, spec, method, swept)
        except KeyError as e:
            return [], [f"{where}.name: template field {{{e.args[0]}}} is not a parameter of "
                        "this method (use sampler.<param>, cache.<param>, gen_length or "
                        "block_size, when the method sets it)"]
        if not NAME.match(method["name"]):
            return [], [f"{where}.name: expands to {method['name']!r}, not a valid name "
                        "(letters, digits, _ . + -)"]
        methods.append({"name": method["name"], "sampler": method["sampler"],
                        "cache": method["cache"],
                        **{k: method[k] for k in METHOD_KEYS if method[k] is not None}})
    return methods, problems


def part_problems(schema: dict, part: str, spec: dict) -> list[tuple[str, str]]:
    """(parameter, problem) of a sampler or cache spec against its registry entry."""
    return [(k, rest) for err in validator_for(schema, schema["$defs"][part]).iter_errors(spec)
            for k, _, rest in (line.partition(": ") for line in explain(err, schema))]
