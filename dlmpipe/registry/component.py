"""What a registry entry is: a ``Component`` (one sampler or cache), the logit rows it reads or
serves, and the declarations of its parameters (JSON schema fragments with a default and a
description), from which the schema blocks and the checks in derived.py follow. No torch.
"""
from __future__ import annotations

import copy
import importlib
import inspect
from dataclasses import dataclass, field
from typing import Callable

# ------------------------------------------------------------------------------------------
# logit rows: which response rows get fresh logits at every step
# ------------------------------------------------------------------------------------------
#: row sets, widest first; a cache serving a set also serves every narrower one
ROWS = ("all_rows", "block_rows", "masked_rows")
ROWS_MEANING = {"all_rows": "every response row (visible ones too)",
                "block_rows": "the rows of the current block",
                "masked_rows": "the masked rows of the current block"}


def serves(cache_rows: str, sampler_rows: str) -> bool:
    return ROWS.index(cache_rows) <= ROWS.index(sampler_rows)


# ------------------------------------------------------------------------------------------
# parameter declarations (JSON schema fragments, with their default and description)
# ------------------------------------------------------------------------------------------
def integer(default, description: str, minimum: int = 1) -> dict:
    return {"description": description, "type": "integer", "minimum": minimum, "default": default}


def number(default, description: str, minimum: float | None = 0, maximum: float | None = None,
           exclusive_minimum: bool = False) -> dict:
    spec: dict = {"description": description, "type": "number", "default": default}
    if minimum is not None:
        spec["exclusiveMinimum" if exclusive_minimum else "minimum"] = minimum
    if maximum is not None:
        spec["maximum"] = maximum
    return spec


def positive_or_null(default, description: str) -> dict:
    return {"description": description, "anyOf": [{"type": "integer", "minimum": 1}, {"type": "null"}],
            "default": default}


def fraction_or_null(default, description: str) -> dict:
    return {"description": description,
            "anyOf": [{"type": "number", "exclusiveMinimum": 0, "maximum": 1}, {"type": "null"}],
            "default": default}


def choice(values: list, default, description: str) -> dict:
    return {"description": description, "enum": list(values), "default": default}


def seed_or_null(default, description: str) -> dict:
    return {"description": description, "anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}],
            "default": default}


# ------------------------------------------------------------------------------------------
# the entries
# ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Component:
    """One sampler or cache: everything the pipeline knows about it without importing it."""

    name: str
    target: str                  # "module:Class", imported on first use
    description: str
    rows: str                    # sampler: rows it reads; cache: rows it serves fresh logits for
    params: dict = field(default_factory=dict)
    #: artifact kind (e.g. "proxies", a keyword of the constructor) -> whether the component
    #: needs it, given its filled parameters; the workflow makes the file, the job loads it
    artifacts: dict[str, Callable[[dict], bool]] = field(default_factory=dict)
    #: checks of the filled parameters against a task's gen_length; each returns a problem or None
    checks: tuple[Callable[[dict, int], str | None], ...] = ()
    #: checks of the filled parameters against the backbone's widths (``widths_problems``)
    width_checks: tuple[Callable[[dict, object], str | None], ...] = ()
    #: parameters whose value "auto" is chosen from the backbone: name -> function(filled
    #: params, backbones.identity.BackboneIdentity) -> the concrete value (ValueError, saying
    #: why, when none fits); a function may keep "auto" where the parameter is unused
    auto: dict[str, Callable[[dict, object], object]] = field(default_factory=dict)
    #: sampler: reads shadow rows (WINO's verification queries, ``Sampler.shadow_block``); cache:
    #: computes them (``Cache.note_shadow_block``, engine/shadow.py)
    shadow_rows: bool = False
    #: cache: keeps a prompt snapshot whose next refresh can be forced or withheld
    #: (``Cache.force_next``), which the matched-state intervention needs (docs/ANALYSES.md)
    feedback_intervention: bool = False
    #: what it means on a block-causal backbone (``block_size``: SDAR, Fast-dLLM v2), where the
    #: decode loop hands sampler and cache one active block over the exact K/V of the finished
    #: prefix (dlmpipe/blockwise.py; docs/METHODS.md, "Block-causal backbones")
    on_block_causal: str = ""
    #: why it cannot run on a block-causal backbone (refused at config time), or None
    block_causal_refusal: str | None = None
    #: a release's block loop: runs on block-causal backbones only (refused on full attention)
    needs_block_causal: bool = False
    #: cache: what it means on a mixture-of-experts backbone (docs/METHODS.md, "MoE backbones")
    on_moe: str = ""
    #: its cost model for ``dlmpipe plan``: sampler ``costs.SamplerCost``, cache ``costs.CacheCost``
    cost: object = None
    #: host reads per step (tests/host_sync.py, the device check): sampler ``(reads, params)``;
    #: cache ``{label: (params, reads at the first step, reads at every later one)}``
    host_sync: object = None
    #: cache: parameters at which it equals full recompute (the exactness table's degenerate row;
    #: ``plan`` must price it as full recompute)
    exact: dict | None = None
    #: cache: parameters at which its cached path runs on a tiny model (16 response positions,
    #: blocks of 8): the shadow-row and memory checks use them
    cheap: dict | None = None

    def load(self) -> type:
        module, _, cls = self.target.partition(":")
        return getattr(importlib.import_module(module), cls)

    def constructor_problem(self) -> str | None:
        """Where the class's constructor (``constructor_params``) and this entry disagree on
        the keyword parameters (the entry's ``params`` and ``artifacts``), or None."""
        takes, declared = constructor_params(self.load()), set(self.params) | set(self.artifacts)
        if takes == declared:
            return None
        return (f"{self.name!r}: {self.target} takes {sorted(takes)}, the entry declares "
                f"{sorted(declared)} ({DOC})")

    def defaults(self) -> dict:
        return {k: copy.deepcopy(v["default"]) for k, v in self.params.items()}


def constructor_params(cls: type) -> set[str]:
    """The keyword-only parameters a sampler's or cache's constructor takes: its own
    ``__init__``'s and, while an ``__init__`` passes the rest on (``**options``), the next one's
    up the class hierarchy. So a class built on an existing sampler or cache takes only its own
    parameters where it fixes the parent's (``super().__init__(model, refresh_interval=8)``),
    and the parent's too where it passes ``**options`` on (docs/DEVELOPING.md, "Adding a
    method")."""
    params: set[str] = set()
    for c in cls.__mro__:
        if "__init__" not in c.__dict__:
            continue
        signature = inspect.signature(c.__dict__["__init__"]).parameters.values()
        params |= {p.name for p in signature if p.kind == p.KEYWORD_ONLY}
        if not any(p.kind == p.VAR_KEYWORD for p in signature):
            break
    return params


#: what every entry declares, by kind (docs/DEVELOPING.md, "Adding a method")
REQUIRED = {"sampler": ("on_block_causal", "cost", "host_sync"),
            "cache": ("on_block_causal", "on_moe", "cost", "host_sync", "exact", "cheap")}
DOC = 'docs/DEVELOPING.md, "Adding a method"'


def declaration_problems(kind: str, c: Component) -> list[str]:
    """The declarations a ``kind`` entry lacks, each naming the field and where it is explained."""
    from .costs import CacheCost, SamplerCost

    missing = [f for f in REQUIRED[kind] if getattr(c, f) in (None, "")
               and not (f == "on_block_causal" and c.block_causal_refusal)]
    out = [f"{kind} {c.name!r}: no `{f}` declared ({DOC})" for f in missing]
    want = SamplerCost if kind == "sampler" else CacheCost
    if c.cost is not None and not isinstance(c.cost, want):
        out.append(f"{kind} {c.name!r}: `cost` is a registry.costs.{want.__name__} ({DOC})")
    if c.rows not in ROWS:
        out.append(f"{kind} {c.name!r}: `rows` must be one of {', '.join(ROWS)} ({DOC})")
    return out


def table(*components: Component, kind: str) -> dict[str, Component]:
    """Entries by name, in declaration order (the schema's and the docs' order); an entry that
    lacks a declaration fails here, at registration, naming the field."""
    problems = [p for c in components for p in declaration_problems(kind, c)]
    if problems:
        raise ValueError("; ".join(problems))
    return {c.name: c for c in components}
