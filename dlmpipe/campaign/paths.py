"""Relative paths in a campaign file resolve against that file's folder, not the working
directory, so that a campaign and its data move together and every "not found" names the
absolute path looked at (docs/CAMPAIGNS.md, "The campaign file").

The keys holding paths: ``backbones.<b>.path`` and a task's files (``source``, ``base_source``,
``fewshot_source``, lm-eval's ``dataset_path`` and ``dataset_kwargs.data_files``). A value no
campaign file gives (Snakemake's ``--config``, a config built in Python) resolves against the
working directory. A ``source`` or ``dataset_path`` that names nothing there and reads as a
dataset id (``org/name``) stays an id. ``anchor_paths`` makes every one absolute, in place, before
any check reads them, and says where each relative one came from, for the problems about it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterator, Sequence

from ..tasks.sources import looks_like_dataset_id
from .files import read_campaign_file

#: a task's keys naming a local file or directory; ``ID_KEYS`` may name a dataset id instead
TASK_KEYS = ("source", "base_source", "fewshot_source", "dataset_path")
ID_KEYS = ("source", "dataset_path")


def path_keys(config: dict) -> Iterator[tuple]:
    """The keys (as tuples; list positions as ints) of ``config`` that hold a path string."""
    for name, b in _mapping(config.get("backbones")).items():
        if isinstance(b, dict) and isinstance(b.get("path"), str):
            yield ("backbones", name, "path")
    for name, t in _mapping(config.get("tasks")).items():
        if not isinstance(t, dict):
            continue
        yield from (("tasks", name, k) for k in TASK_KEYS if isinstance(t.get(k), str))
        files = _mapping(t.get("dataset_kwargs")).get("data_files")
        base = ("tasks", name, "dataset_kwargs", "data_files")
        if isinstance(files, str):
            yield base
        for split, f in (files.items() if isinstance(files, dict) else enumerate(files)
                         if isinstance(files, list) else ()):
            if isinstance(f, str):
                yield (*base, split)
            elif isinstance(f, list):
                yield from ((*base, split, i) for i, g in enumerate(f) if isinstance(g, str))


def anchor_paths(config: dict, files: Sequence[str | Path] = ()) -> dict[str, tuple[str, str]]:
    """Every relative path of ``config`` made absolute, in place, against the folder of the
    last of ``files`` (the campaign files, in order) that gives it this value, else the working
    directory. Returns dotted key -> (the absolute path, where the relative one came from), for
    the problems about it (``annotate``)."""
    read = {}
    notes = {}
    for key in list(path_keys(config)):
        value = _get(config, key)
        path = Path(value).expanduser()
        if path.is_absolute():
            continue
        origin = next((Path(f) for f in reversed(files) if _gives(read, f, key, value)), None)
        folder = (origin.parent if origin else Path.cwd()).absolute()
        if key[-1] in ID_KEYS and not (folder / path).exists() and looks_like_dataset_id(value):
            continue  # a dataset id
        _set(config, key, str(folder / path))
        notes[".".join(str(k) for k in key)] = (str(folder / path), (
            f"{value!r} in {origin.absolute()}, relative to its folder" if origin
            else f"{value!r}, relative to the working directory"))
    return notes


def annotate(problems: list[str], notes: dict[str, tuple[str, str]]) -> list[str]:
    """Problems about a relative path (its key, or the key above it, and its absolute path)
    with where it came from (``anchor_paths``' notes)."""
    out = []
    for p in problems:
        where = p.partition(":")[0]
        note = next((n for k, (path, n) in notes.items()
                     if (k == where or k.startswith(f"{where}.")) and path in p), None)
        out.append(f"{p} (given as {note})" if note else p)
    return out


def _gives(read: dict, file, key: tuple, value: str) -> bool:
    if file not in read:
        try:
            read[file] = read_campaign_file(file)
        except Exception:  # noqa: BLE001  (a file Snakemake read, or one load_campaign reports)
            read[file] = {}
    try:
        return _get(read[file], key) == value
    except (KeyError, IndexError, TypeError):
        return False


def _mapping(value) -> dict:
    return value if isinstance(value, dict) else {}


def _get(node, key: tuple):
    for k in key:
        node = node[k]
    return node


def _set(node, key: tuple, value) -> None:
    _get(node, key[:-1])[key[-1]] = value
