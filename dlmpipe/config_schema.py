"""The config schema: validation with the defaults filled in place, every error named by key.

``workflow/schemas/config.schema.yaml`` with the sampler/cache blocks of every registered method
(``dlmpipe.registry``) installed, applied with the default-filling validator Snakemake uses (the
jsonschema FAQ recipe), reporting *every* error at once, each as one line that starts with its
dotted key (``methods.archer.cache.K``). dlmpipe.campaign builds on it.
"""
from __future__ import annotations

import copy
import re
from pathlib import Path

import jsonschema
import yaml

from . import registry

SCHEMA = Path(__file__).resolve().parent.parent / "workflow" / "schemas" / "config.schema.yaml"


class ConfigError(ValueError):
    """An invalid campaign; every line names the offending key."""

    def __init__(self, problems: list[str], source: str = "config"):
        self.problems, self.source = problems, source
        super().__init__(f"invalid {source}:\n" + "\n".join(f"  {p}" for p in problems))


def load_schema(path: str | Path = SCHEMA) -> dict:
    """The config schema with the sampler/cache blocks of every registered method installed.
    Parsed by libyaml where PyYAML has it (the same safe constructor, ~10x faster: every
    campaign check and Snakemake command parses it)."""
    schema = yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    schema.setdefault("$defs", {}).update(registry.schema_defs())
    return schema


def _default_filling(validator_class):
    """Snakemake's validator (jsonschema FAQ recipe): ``properties`` fill their defaults, at
    any depth, including inside additionalProperties maps and if/then branches."""
    validate_properties = validator_class.VALIDATORS["properties"]

    def properties(validator, props, instance, schema):
        if isinstance(instance, dict):
            for key, sub in props.items():
                if "default" in sub:
                    instance.setdefault(key, copy.deepcopy(sub["default"]))
        yield from validate_properties(validator, props, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": properties})


def validator_for(schema: dict, subschema: dict | None = None) -> jsonschema.Validator:
    """A default-filling validator for ``subschema`` (default: the whole schema); its
    ``#/$defs/...`` references resolve against ``schema``."""
    target = schema if subschema is None else {**subschema, "$defs": schema.get("$defs", {})}
    return _default_filling(jsonschema.Draft202012Validator)(target)


def dotted(path) -> str:
    out = ""
    for p in path:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "(top level)"


def _join(key: str, child: str) -> str:
    return child if key == "(top level)" else f"{key}.{child}"


def _resolve(schema: dict, ref: str) -> dict:
    node = schema
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def allowed_keys(schema: dict, sub: dict, instance: dict) -> list[str]:
    """Keys a (sub)schema allows for this instance, following if/then branches that apply."""
    keys = list(sub.get("properties", {}))
    for branch in sub.get("allOf", []):
        cond = branch.get("if")
        if cond is not None and jsonschema.Draft202012Validator(cond).is_valid(instance):
            then = branch.get("then", {})
            then = _resolve(schema, then["$ref"]) if "$ref" in then else then
            keys += [k for k in then.get("properties", {}) if k not in keys]
    return keys


BOUND_VALIDATORS = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}


def out_of_range(error: jsonschema.ValidationError) -> bool:
    """A number outside its bounds (of one alternative of an anyOf/oneOf whose type it has)."""
    inst = error.instance
    if isinstance(inst, bool) or not isinstance(inst, (int, float)):
        return False
    if error.validator in BOUND_VALIDATORS:
        return True
    return error.validator in ("anyOf", "oneOf") and any(
        e.validator in BOUND_VALIDATORS for e in error.context or ())


def explain(error: jsonschema.ValidationError, schema: dict) -> list[str]:
    """One line per problem, each starting with the dotted key it is about."""
    key, v, inst, sub = dotted(error.absolute_path), error.validator, error.instance, error.schema
    if out_of_range(error) and (limits := registry.bounds(sub)):
        return [f"{key}: {inst!r} is out of range: must be {limits}"]
    if v in ("additionalProperties", "unevaluatedProperties"):
        allowed = allowed_keys(schema, sub, inst)
        # keys of an if/then branch that failed on another key count as unevaluated: skip them
        extra = [k for k in re.findall(r"'([^']*)'", error.message.split("(", 1)[-1])
                 if k not in allowed]
        return [f"{_join(key, k)}: unknown key (allowed here: {', '.join(allowed) or 'none'})"
                for k in extra]
    if v == "required":
        missing = re.findall(r"'([^']*)' is a required property", error.message)
        return [f"{_join(key, m)}: missing (required)" for m in missing]
    if "propertyNames" in error.schema_path:
        return [f"{_join(key, str(inst))}: invalid name ({error.message})"]
    if v == "enum":
        known = ", ".join(map(str, error.validator_value))
        path = list(error.absolute_path)
        if path[-2:-1] in (["sampler"], ["cache"]) and path[-1] == "name":
            return [f"{key}: unknown {path[-2]} {inst!r}; known: {known}"]
        return [f"{key}: {inst!r} is not one of {known}"]
    if v in ("anyOf", "oneOf") and "description" in sub:
        got = "" if isinstance(inst, (dict, list)) else f"{inst!r} is not valid; "
        return [f"{key}: {got}expected {sub['description']}"]
    return [f"{key}: {error.message}"]


def check_config(config: dict, schema_path: str | Path = SCHEMA, source: str = "config") -> dict:
    """Validate ``config`` in place (filling defaults) or raise ConfigError listing every error."""
    schema = load_schema(schema_path)
    errors = sorted(validator_for(schema).iter_errors(config), key=lambda e: list(map(str, e.absolute_path)))
    bad_names = {tuple(e.absolute_path)[:-1] for e in errors
                 if tuple(e.absolute_path)[-1:] == ("name",)}
    problems: list[str] = []
    for e in errors:
        # an unknown sampler/cache name makes its parameters look unknown too: say it once
        if e.validator == "unevaluatedProperties" and tuple(e.absolute_path) in bad_names:
            continue
        problems += [p for p in explain(e, schema) if p not in problems]
    if problems:
        raise ConfigError(problems, source)
    return config
