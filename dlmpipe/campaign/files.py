"""Campaign files: YAML read with the position of a syntax error, several files merged key by key.

Snakemake parses ``--configfile`` itself, before the Snakefile runs, and says of a syntax error
only "Config file is not valid JSON or YAML". The workflow profile next to the Snakefile
(``profiles/default``, which Snakemake reads on every run of this workflow) therefore calls
``check_configfile_arguments`` first, so that the error names the file, line and column; the
Snakefile reads its default ``config.yaml`` with ``read_campaign_file`` before Snakemake does.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from ..config_schema import ConfigError


def syntax_problem(error: yaml.YAMLError) -> str:
    """A YAML error as one line: where (line and column, counted from 1) and what."""
    mark = getattr(error, "problem_mark", None)
    if mark is None:
        return f"YAML syntax error: {error}"
    context = ""
    if getattr(error, "context", None) and getattr(error, "context_mark", None):
        c = error.context_mark
        context = f" ({error.context} at line {c.line + 1}, column {c.column + 1})"
    return (f"line {mark.line + 1}, column {mark.column + 1}: YAML syntax error: "
            f"{error.problem}{context}")


def read_campaign_file(path: str | Path) -> dict:
    """One campaign file as a dict (empty file: {}); ConfigError naming the file and, for a
    syntax error, its line and column."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError([f"cannot be read ({getattr(e, 'strerror', None) or e})"], str(path)) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError([syntax_problem(e)], str(path)) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError([f"(top level): a campaign is a mapping (backbones:, tasks:, methods:, "
                           f"...), not a {type(data).__name__}"], str(path))
    return data


def merge(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``, key by key at every depth (later files override earlier)."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def read_campaign_files(paths: list[str | Path]) -> dict:
    config: dict = {}
    for p in paths:
        config = merge(config, read_campaign_file(p))
    return config


def configfile_arguments(argv: list[str]) -> list[str]:
    """The files of ``--configfile``/``--configfiles`` (each followed by one or more files, or
    ``--configfile=FILE``) in a Snakemake command line."""
    files, taking = [], False
    for arg in argv:
        if arg.startswith("-"):
            name, eq, value = arg.partition("=")
            taking = name in ("--configfile", "--configfiles") and not eq
            if name in ("--configfile", "--configfiles") and eq:
                files.append(value)
        elif taking:
            files.append(arg)
    return files


def check_configfile_arguments(argv: list[str] | None = None) -> None:
    """Before Snakemake parses the campaign files of its command line: a file that is neither
    JSON nor YAML stops the run here, naming file, line and column (a missing file is left to
    Snakemake, which names it)."""
    for name in configfile_arguments(sys.argv[1:] if argv is None else argv):
        path = Path(name).expanduser()
        if not path.is_file():
            continue
        try:
            json.loads(path.read_text(encoding="utf-8"))
            continue  # Snakemake reads JSON first
        except (ValueError, OSError):
            pass
        try:
            read_campaign_file(path)
        except ConfigError as e:
            print(e, file=sys.stderr)
            raise SystemExit(1) from None
