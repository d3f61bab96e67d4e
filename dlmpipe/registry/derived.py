"""What derives from the entries: lookup, the pairing rule, the schema's sampler and cache
blocks, the checks against gen_length and widths, parameters resolved (defaults filled, ranges
checked) and ``auto`` parameters bound to a backbone. No torch.
"""
from __future__ import annotations

import copy

from .caches import CACHES
from .component import ROWS_MEANING, Component, declaration_problems, serves
from .samplers import SAMPLERS

KINDS = {"sampler": SAMPLERS, "cache": CACHES}


def register(kind: str, component: Component) -> Component:
    """Add a sampler or cache declared outside this package (a module named in
    ``$DLMPIPE_METHODS``, or a test), checked as the built-in entries are; the schema, the
    pairing check, ``plan`` and the contract tests derive from it like the others."""
    problems = declaration_problems(kind, component)
    if component.name in KINDS[kind]:
        problems.append(f"{kind} {component.name!r} is registered already")
    if problems:
        raise ValueError("; ".join(problems))
    KINDS[kind][component.name] = component
    return component


def lookup(kind: str, name: str) -> Component:
    table = KINDS[kind]
    if name not in table:
        raise ValueError(f"unknown {kind} {name!r}; known: {', '.join(sorted(table))}")
    return table[name]


def _refusal(s: Component, c: Component) -> str | None:
    if not serves(c.rows, s.rows):
        return (f"cache {c.name!r} gives fresh logits only for {ROWS_MEANING[c.rows]}; sampler "
                f"{s.name!r} reads {ROWS_MEANING[s.rows]} at every step")
    if s.shadow_rows and not c.shadow_rows:
        return (f"cache {c.name!r} does not compute shadow rows; sampler {s.name!r} reads them at "
                f"every step (WINO's verification queries: a masked copy of the block appended "
                f"to the input, docs/ARCHITECTURE.md)")
    return None


def refusal(sampler: str, cache: str) -> str | None:
    """Why ``cache`` cannot serve ``sampler``, without the list of caches that can (the pairing
    table of ``dlmpipe methods`` shows those)."""
    return _refusal(lookup("sampler", sampler), lookup("cache", cache))


def serving_caches(sampler: str) -> list[str]:
    """The caches that can serve ``sampler`` (every row it reads, shadow rows if it reads them)."""
    s = lookup("sampler", sampler)
    return [name for name, c in CACHES.items() if _refusal(s, c) is None]


def pairing_problem(sampler: str, cache: str) -> str | None:
    """Why ``cache`` cannot serve ``sampler`` (it leaves rows stale that the sampler reads), and
    the caches that can."""
    why = refusal(sampler, cache)
    if why is None:
        return None
    return f"{why}; caches that serve it: {', '.join(serving_caches(sampler))}"


#: the attention patterns of the backbone families (backbones/families/: ``Family.attention``)
ATTENTIONS = ("full", "block_causal")


def attention_refusal(kind: str, name: str, attention: str) -> str | None:
    """Why the sampler or cache ``name`` cannot decode a backbone of ``attention`` (``full`` or
    ``block_causal``), or None."""
    c = lookup(kind, name)
    if attention == "block_causal" and c.block_causal_refusal:
        return f"{kind} {name!r} cannot decode a block-causal backbone: {c.block_causal_refusal}"
    if attention == "full" and c.needs_block_causal:
        return (f"{kind} {name!r} decodes a block-causal backbone's blocks (block_size: SDAR, "
                f"Fast-dLLM v2); this backbone attends bidirectionally over the whole sequence")
    return None


def attention_problems(method: dict, attention: str) -> list[str]:
    """The method's sampler and cache against the backbone's attention pattern."""
    return [p for part in ("sampler", "cache")
            if (p := attention_refusal(part, method[part]["name"], attention))]


def artifacts(method: dict) -> tuple[str, ...]:
    """Artifact kinds a method needs (its sampler and cache specs with defaults filled)."""
    return tuple(kind for part in ("sampler", "cache")
                 for kind, needed in lookup(part, method[part]["name"]).artifacts.items()
                 if needed(method[part]))


def gen_length_problems(method: dict, gen_length: int) -> list[str]:
    """The method's parameters against a task's generation length."""
    return [p for part in ("sampler", "cache")
            for check in lookup(part, method[part]["name"]).checks
            if (p := check(method[part], gen_length))]


def widths_problems(method: dict, widths) -> list[str]:
    """The method's parameters against the backbone's widths (``width_checks``)."""
    return [p for part in ("sampler", "cache")
            for check in lookup(part, method[part]["name"]).width_checks
            if (p := check(method[part], widths))]


def schema_defs() -> dict:
    """The config schema's ``$defs`` for samplers and caches: a name enum, one if/then per
    entry pointing at its parameter block, unknown parameters rejected."""
    defs: dict = {}
    for kind, table in KINDS.items():
        plural = f"{kind}s"
        defs[kind] = {
            "description": {"sampler": "the decoder (logits -> next response state)",
                            "cache": "how a step's logits are computed (owns every reuse and "
                                     "refresh decision)"}[kind],
            "type": "object",
            "required": ["name"],
            "properties": {"name": {"enum": list(table)}},
            "allOf": [{"if": {"required": ["name"], "properties": {"name": {"const": n}}},
                       "then": {"$ref": f"#/$defs/{plural}/{n}"}} for n in table],
            "unevaluatedProperties": False,
        }
        defs[plural] = {n: {"description": c.description, "properties": copy.deepcopy(c.params)}
                        for n, c in table.items()}
    return defs


def canonical(value):
    """Builtin, JSON-safe parameter values: infinity is the string "inf"."""
    if isinstance(value, float) and value == float("inf"):
        return "inf"
    if isinstance(value, str) and value.lower() in (".inf", "inf", "infinity"):
        return "inf"
    return value


BOUNDS = (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="), ("exclusiveMaximum", "<"))


def _values(values) -> list[str]:
    return list(dict.fromkeys(str(canonical(v)) for v in values))  # "inf" and math.inf once


def bounds(spec: dict) -> str | None:
    """A numeric constraint's range in words, for "out of range" messages: ">= 1 or inf",
    "> 0 and <= 1 or null", "auto or >= 1"; None when no alternative has a bound."""
    alternatives = spec.get("anyOf") or spec.get("oneOf") or [spec]
    if not any(key in alt for alt in alternatives for key, _ in BOUNDS):
        return None
    words = []
    for alt in alternatives:
        if "enum" in alt or "const" in alt:
            words += _values(alt.get("enum", [alt.get("const")]))
        elif alt.get("type") == "null":
            words.append("null")
        elif alt.get("type") in ("integer", "number"):
            words.append(" and ".join(f"{op} {alt[key]}" for key, op in BOUNDS if key in alt)
                         or f"any {alt['type']}")
    return " or ".join(dict.fromkeys(words))


def expected(spec: dict) -> str:
    """A parameter's constraint in words: "an integer >= 1", "a number > 0 and <= 1", ..."""
    if "anyOf" in spec:
        return " or ".join(expected(alt) for alt in spec["anyOf"])
    if "enum" in spec:
        values = _values(spec["enum"])
        return values[0] if len(values) == 1 else "one of " + ", ".join(values)
    kind = spec.get("type")
    if kind == "null":
        return "null"
    words = {"integer": "an integer", "number": "a number"}.get(kind, f"a {kind}")
    limits = [f"{op} {spec[key]}" for key, op in BOUNDS if key in spec]
    return " ".join([words, " and ".join(limits)]).strip()


class NoFit(ValueError):
    """No value fits an ``auto`` parameter on a backbone; ``kind`` and ``key`` name it."""

    def __init__(self, kind: str, key: str, why: str):
        self.kind, self.key = kind, key
        super().__init__(f"{kind}.{key}: auto: {why}")


def bind(kind: str, spec: dict, backbone) -> dict:
    """``spec`` (a sampler or cache with its parameters filled) with every ``auto`` parameter
    chosen for ``backbone`` (a ``backbones.identity.BackboneIdentity``); NoFit naming the
    parameter when nothing fits."""
    component = lookup(kind, spec["name"])
    out = dict(spec)
    for key, choose in component.auto.items():
        if out.get(key) == "auto":
            try:
                out[key] = choose(out, backbone)
            except ValueError as e:
                raise NoFit(kind, key, str(e)) from None
    return out


def bind_method(method: dict, backbone) -> dict:
    """A method's concrete parameters for ``backbone``: defaults filled, ranges checked, ``auto``
    parameters bound (``resolve`` of its sampler and its cache)."""
    out = dict(method)
    for part in ("sampler", "cache"):
        component, params = resolve(part, method[part], backbone)
        out[part] = {"name": component.name, **params}
    return out


def resolve(kind: str, spec: dict, backbone=None) -> tuple[Component, dict]:
    """The entry of ``spec["name"]`` and its parameters with defaults filled and ranges checked
    (ValueError naming every bad parameter), ``auto`` parameters bound to ``backbone`` when
    given. Used when a method is built outside a checked campaign (jobs, tests, benchmarks)."""
    import jsonschema

    params = dict(spec)
    component = lookup(kind, params.pop("name"))
    unknown = sorted(set(params) - set(component.params))
    problems = [f"{kind} {component.name}: unknown parameter {k!r} (known: "
                f"{', '.join(component.params) or 'none'})" for k in unknown]
    filled = {**component.defaults(), **{k: canonical(v) for k, v in params.items()}}
    for key, value in filled.items():
        spec = component.params.get(key)
        if spec is not None and not jsonschema.Draft202012Validator(spec).is_valid(value):
            problems.append(f"{kind} {component.name}: {key} must be {expected(spec)} "
                            f"(got {value!r})")
    if problems:
        raise ValueError("; ".join(problems))
    if backbone is not None:
        filled = {k: v for k, v in bind(kind, {"name": component.name, **filled}, backbone).items()
                  if k != "name"}
    return component, filled
