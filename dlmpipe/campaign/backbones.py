"""The campaign's backbones: where each checkpoint is, its weight pins (checked before any job),
and what its config.json says that methods depend on, read without torch: family and names
(``auto`` parameters, ``registry.bind``) and widths (``registry.width_checks``). A ``hub:``
backbone's checkpoint is its snapshot in the Hugging Face cache, its config.json there or
downloaded alone (``hub.HubSources``).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..backbones.checkpoint_config import Widths, read_widths
from ..backbones.identity import TOY, BackboneIdentity, CheckpointError, checkpoint_identity, shipped_identity
from ..backbones.pins import sha256_problems
from ..backbones.shipped import RECORD, SHIPPED_DIR, read_record, shipped_names
from ..sizes import TOY_SIZE
from .hashes import HashCache



def checkpoint_path(spec: dict, hub=None, name: str | None = None) -> Path | None:
    """Where a backbone's weights are: the shipped directory, the local ``path`` (absolute), a
    ``hub:`` one's snapshot folder (``hub``: the campaign's HubSources; ``name``: the
    backbone); None for a toy the workflow trains (or a Hub commit not known)."""
    if "hub" in spec:
        return hub.checkpoint_path(name) if hub is not None else None
    if "shipped" in spec:
        return SHIPPED_DIR / spec["shipped"]
    if "path" in spec:
        return Path(spec["path"]).expanduser().resolve()
    return None


def weight_sha256(spec: dict) -> dict[str, str] | None:
    """The sha256 the backbone's weight files must have: the campaign's ``sha256``, else a
    shipped checkpoint's record; None: unpinned."""
    if "sha256" in spec:
        return {k: v.lower() for k, v in spec["sha256"].items()}
    if "shipped" in spec:
        return read_record(spec["shipped"])["sha256"]
    return None


def backbone_problems(backbones: dict[str, dict], hashes: HashCache | None = None,
                      hub=None) -> list[str]:
    """Checkpoint directories that are missing or have no config.json, unknown shipped names,
    pins on a trained toy, a toy's heads that do not divide its width, and (with ``hashes``)
    weight files that are not the pinned ones (a ``hub:`` backbone's own pins once it is
    fetched: its fetch job checks the Hub's record, ``hub``: the campaign's HubSources)."""
    problems = []
    for name, b in backbones.items():
        if "hub" in b:
            if hub is not None and hashes is not None and "sha256" in b and hub.fetched(name):
                problems += [f"backbones.{name}.sha256: {p}" for p in sha256_problems(
                    hub.checkpoint_path(name), weight_sha256(b), hashes.digest)]
            continue
        if "toy" in b:
            if "sha256" in b:
                problems.append(f"backbones.{name}.sha256: a trained toy's weights depend on the "
                                "machine's CPU kernels; pin a `shipped:` or `path:` checkpoint")
            d, heads = (b["toy"].get(k, TOY_SIZE[k]) for k in ("d_model", "n_heads"))
            if d % heads:
                problems.append(f"backbones.{name}.toy.d_model: {d} is not a multiple of n_heads "
                                f"{heads} (each head is d_model / n_heads wide)")
        if "shipped" in b and b["shipped"] not in shipped_names():
            problems.append(f"backbones.{name}.shipped: no shipped checkpoint {b['shipped']!r} "
                            f"(shipped: {', '.join(shipped_names()) or 'none'})")
            continue
        if "path" in b:
            path = Path(b["path"]).expanduser().absolute()
            if not path.is_dir():
                problems.append(f"backbones.{name}.path: {path} is not a directory")
                continue
            if not (path / "config.json").is_file():
                problems.append(f"backbones.{name}.path: {path} has no config.json")
                continue
        pins = weight_sha256(b) if hashes is not None and "toy" not in b else None
        if pins:
            key, whose = (("sha256", "") if "sha256" in b else
                          ("shipped", f" (pinned by {SHIPPED_DIR / b['shipped'] / RECORD})"))
            problems += [f"backbones.{name}.{key}: {p}{whose}"
                         for p in sha256_problems(checkpoint_path(b), pins, hashes.digest)]
    return problems


class Checkpoints:
    """What each backbone's config.json says, read once: ``identity`` (family and names) and
    ``widths``; for a toy the workflow trains, what its options say."""

    def __init__(self, backbones: dict[str, dict], hub=None):
        self.specs, self.hub = backbones, hub
        self._identities: dict[str, BackboneIdentity | CheckpointError] = {}
        self._widths: dict[str, Widths | CheckpointError] = {}

    def identity(self, backbone: str) -> BackboneIdentity | CheckpointError:
        """The backbone's family and checkpoint names, or why config.json cannot tell them."""
        if backbone not in self._identities:
            b = self.specs[backbone]
            if "toy" in b:  # trained by train_toy in the workflow, in LLaDA's format
                identity = dataclasses.replace(TOY, source=f"backbones.{backbone} (toy)")
            elif "hub" in b:
                identity = self._hub_identity(backbone)
            elif "shipped" in b:  # trained by train_toy: LLaDA's format, or SDAR's (block toy)
                try:
                    identity = shipped_identity(checkpoint_path(b),
                                                f"backbones.{backbone} (shipped {b['shipped']})")
                except CheckpointError as e:
                    identity = e
            else:
                try:
                    identity = dataclasses.replace(checkpoint_identity(b["path"]),
                                                   source=f"backbones.{backbone} ({b['path']})")
                except CheckpointError as e:
                    identity = e
            self._identities[backbone] = identity
        return self._identities[backbone]

    def widths(self, backbone: str) -> Widths | CheckpointError:
        """The backbone's widths: its toy options (train_toy's defaults where unset), else its
        config.json."""
        if backbone not in self._widths:
            b = self.specs[backbone]
            if "toy" in b:
                d, heads = (b["toy"].get(k, TOY_SIZE[k]) for k in ("d_model", "n_heads"))
                self._widths[backbone] = Widths(d, heads, heads, f"backbones.{backbone}.toy")
            elif (folder := self._config_folder(backbone)) is None:
                self._widths[backbone] = CheckpointError(
                    f"backbones.{backbone}: its config.json could not be read")
            else:
                try:
                    self._widths[backbone] = read_widths(folder)
                except CheckpointError as e:
                    self._widths[backbone] = e
        return self._widths[backbone]

    def key(self, backbone: str) -> str:
        """The key naming the backbone's checkpoint (``path`` or ``hub``)."""
        return "hub" if "hub" in self.specs[backbone] else "path"

    def readable(self, backbone: str) -> bool:
        """Whether a problem reading its config.json is news (a missing directory or
        config.json is reported by ``backbone_problems``, a Hub one's by ``HubSources``)."""
        path = self._config_folder(backbone)
        if "hub" in self.specs[backbone]:
            return path is not None
        return path is None or (path / "config.json").is_file()

    def _config_folder(self, backbone: str) -> Path | None:
        if "hub" in self.specs[backbone]:
            return self.hub.config_folder(backbone) if self.hub is not None else None
        return checkpoint_path(self.specs[backbone])

    def _hub_identity(self, backbone: str) -> BackboneIdentity | CheckpointError:
        folder = self._config_folder(backbone)
        source = f"backbones.{backbone} ({self.specs[backbone]['hub']})"
        if folder is None:
            return CheckpointError(f"{source}: its config.json could not be read")
        try:
            return dataclasses.replace(checkpoint_identity(folder), source=source)
        except CheckpointError as e:
            return e
