"""Every sampler and cache for people: parameters with defaults and ranges, and which caches
serve which samplers (``python -m dlmpipe methods``; ``--format markdown`` for the docs).

Everything shown comes from the entries (samplers.py, caches.py) and the pairing rule
(``derived.pairing_problem`` decides every cell of the table), so it cannot drift from what a
campaign check accepts.
"""
from __future__ import annotations

import string
import textwrap

from .component import ROWS_MEANING, Component
from .derived import KINDS, canonical, expected, pairing_problem, refusal

ALLOWED = "✓"


def value_text(value) -> str:
    """A parameter value as a config file writes it (null, true, inf, 0.9, probability)."""
    value = canonical(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def rows_text(kind: str, c: Component) -> str:
    """What an entry reads (sampler) or serves (cache), and what else it needs."""
    verb = "reads" if kind == "sampler" else "serves fresh logits for"
    extra = []
    if c.shadow_rows:
        extra.append("reads shadow rows" if kind == "sampler" else "computes shadow rows")
    extra += [f"needs the backbone's {a}" for a in c.artifacts]
    extra += [f"{key}: auto chosen from the backbone" for key in c.auto]
    if c.needs_block_causal:
        extra.append("block-causal backbones only")
    if c.block_causal_refusal:
        extra.append(f"refused on block-causal backbones: {c.block_causal_refusal}")
    elif c.on_block_causal:
        extra.append(f"on a block-causal backbone: {c.on_block_causal}")
    if c.on_moe:
        extra.append(f"on an MoE backbone: {c.on_moe}")
    return "; ".join([f"{verb} {ROWS_MEANING[c.rows]}", *extra])


def pairing_table() -> tuple[dict[tuple[str, str], str], dict[str, str]]:
    """Every (sampler, cache) cell: ``ALLOWED`` where ``pairing_problem`` allows the pair, else
    the letter of its reason; and the reasons by letter (names replaced by "the sampler" and
    "the cache", so pairs refused for the same reason share one letter)."""
    cells, letters = {}, {}
    for s in KINDS["sampler"]:
        for c in KINDS["cache"]:
            if pairing_problem(s, c) is None:
                cells[(s, c)] = ALLOWED
                continue
            reason = refusal(s, c)
            for named, word in ((f"cache {c!r}", "the cache"), (f"sampler {s!r}", "the sampler"),
                                (repr(c), "the cache"), (repr(s), "the sampler")):
                reason = reason.replace(named, word)
            cells[(s, c)] = letters.setdefault(reason, string.ascii_lowercase[len(letters)])
    return cells, {letter: reason for reason, letter in letters.items()}


def _text() -> list[str]:
    lines = []
    for kind, entries in KINDS.items():
        lines.append(f"{kind}s:")
        for c in entries.values():
            lines.append(f"  {c.name}: {c.description}")
            lines += textwrap.wrap(rows_text(kind, c), 100, initial_indent="    ",
                                   subsequent_indent="    ")
            for key, spec in c.params.items():
                lines.append(f"    {key} = {value_text(spec['default'])}  ({expected(spec)})")
                lines += textwrap.wrap(spec["description"], 100, initial_indent="        ",
                                       subsequent_indent="        ")
        lines.append("")
    cells, legend = pairing_table()
    caches = list(KINDS["cache"])
    width = max(map(len, KINDS["sampler"]))
    lines.append(f"which caches serve which samplers ({ALLOWED}: paired; a letter: refused, for "
                 "the reason below):")
    lines.append(f"  {'':{width}s}  " + "  ".join(caches))
    for s in KINDS["sampler"]:
        lines.append((f"  {s:{width}s}  " + "  ".join(f"{cells[(s, c)]:^{len(c)}s}"
                                                      for c in caches)).rstrip())
    for letter, reason in legend.items():
        lines += textwrap.wrap(f"{letter}: {reason}", 100, initial_indent="  ",
                               subsequent_indent="     ")
    return lines


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _markdown() -> list[str]:
    lines = []
    for kind, entries in KINDS.items():
        lines += [f"### {kind.capitalize()}s", ""]
        for c in entries.values():
            lines += [f"#### `{c.name}`", "", f"{c.description}. {_sentence(rows_text(kind, c))}.",
                      ""]
            if c.params:
                lines += ["| parameter | default | range | meaning |", "| --- | --- | --- | --- |"]
                lines += [f"| `{key}` | `{value_text(spec['default'])}` | {_cell(expected(spec))} "
                          f"| {_cell(spec['description'])} |" for key, spec in c.params.items()]
                lines.append("")
    cells, legend = pairing_table()
    caches = list(KINDS["cache"])
    lines += ["### Which caches serve which samplers", "",
              f"{ALLOWED}: the pair is allowed; a letter: refused, for the reason below.", "",
              "| sampler | " + " | ".join(f"`{c}`" for c in caches) + " |",
              "| --- |" + " :---: |" * len(caches)]
    lines += [f"| `{s}` | " + " | ".join(cells[(s, c)] for c in caches) + " |"
              for s in KINDS["sampler"]]
    lines += [""] + [f"- {letter}: {_cell(reason)}" for letter, reason in legend.items()]
    return lines


def describe(fmt: str = "text") -> str:
    """Every sampler and cache with its parameters (default, range, meaning), then the pairing
    table; ``fmt``: ``text`` or ``markdown``."""
    render = {"text": _text, "markdown": _markdown}
    if fmt not in render:
        raise ValueError(f"format must be one of {', '.join(render)}, not {fmt!r}")
    return "\n".join(render[fmt]())
