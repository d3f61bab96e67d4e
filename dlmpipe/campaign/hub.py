"""The campaign's Hugging Face Hub repositories (dlmpipe/hub.py): each backbone's ``hub`` and
each task's dataset ids, at their ``revision`` (default main).

Before any job each is resolved to the commit its revision names: from the cache where a fetch
left its complete snapshot (no network), else by asking the Hub, so that a gated or missing
repository, a revision it lacks, and no network (or HF_HUB_OFFLINE) without the snapshot are
problems naming the key. A backbone not fetched yet is read from its config.json alone
(downloaded by itself) for the checks that need its widths and family; ``plan``, which checks
no downloadable data, sizes a backbone from its names where even that cannot be reached. The
workflow's ``fetch`` jobs (local rules) then fetch what is missing, and every job reads the
snapshot of the resolved commit.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..tasks.sources import parse_dataset_id, pin_dataset_id


@dataclass
class Resolved:
    """One repository: ``repo`` as configured, ``commit`` its revision names (None: unknown),
    ``snapshot`` where fetched (complete in the cache), ``config`` a folder holding its
    config.json (backbones)."""

    key: str
    repo: object
    commit: str | None = None
    snapshot: object = None
    config: Path | None = None

    def fetch_entry(self) -> dict:
        """What the fetch job fetches (``python -m dlmpipe fetch-hub``)."""
        return {"key": self.key, "repo": self.repo.id, "kind": self.repo.kind,
                "revision": self.repo.revision, "commit": self.commit}


class HubSources:
    """The campaign's Hub repositories, resolved; ``problems`` name their keys.
    ``check_paths=False`` (``plan``): datasets are left alone and a backbone that cannot be
    reached is sized by its names."""

    def __init__(self, config: dict, check_paths: bool = True):
        from ..tasks.registry import dataset_options

        self.problems: list[str] = []
        self.backbones: dict[str, Resolved] = {}
        self.tasks: dict[str, dict[str, Resolved]] = {}
        self.check_paths = check_paths
        for name, spec in config["backbones"].items():
            if "hub" in spec:
                self.backbones[name] = self._backbone(name, spec)
            elif "revision" in spec:
                self.problems.append(f"backbones.{name}.revision: pins a `hub:` checkpoint's "
                                     "revision; this backbone names none")
        for name, options in config["tasks"].items():
            ids = dataset_options(options)
            if "revision" in options and not ids:
                self.problems.append(f"tasks.{name}.revision: pins a dataset id's revision (a "
                                     "`source` of the form org/name); this task reads local files")
            if ids and check_paths:
                self.tasks[name] = {key: self._dataset(f"tasks.{name}", key, value,
                                                       options.get("revision"))
                                    for key, value in ids.items()}

    def _backbone(self, name: str, spec: dict) -> Resolved:
        from ..hub import HubError, Repo, cached, cached_commit, config_folder, resolve

        found = Resolved(f"backbones.{name}.hub", Repo(spec["hub"], spec.get("revision", "main")))
        found.snapshot = cached(found.repo)
        try:
            if found.snapshot is not None:
                found.commit = found.snapshot.commit
            else:  # the Hub says whether the fetch job can fetch it (plan: the cache may tell)
                found.commit = (resolve(found.repo) if self.check_paths
                                else cached_commit(found.repo) or resolve(found.repo))
            found.config = config_folder(found.repo)
        except HubError as e:
            if self.check_paths or e.about != "network":  # plan: sized by its names
                key = "revision" if e.about == "revision" else "hub"
                self.problems.append(f"backbones.{name}.{key}: {e}")
        return found

    def _dataset(self, where: str, key: str, value: str, revision: str | None) -> Resolved:
        from ..hub import HubError, Repo, cached, resolve

        repo, own, _ = parse_dataset_id(value)
        found = Resolved(f"{where}.{key}", Repo(repo, revision or own or "main", "dataset"))
        found.snapshot = cached(found.repo)
        try:
            found.commit = found.snapshot.commit if found.snapshot else resolve(found.repo)
        except HubError as e:
            self.problems.append(f"{where}.{'revision' if e.about == 'revision' else key}: {e}")
        return found

    # ---- what the rules and checks read ---------------------------------------------------
    def checkpoint_path(self, backbone: str) -> Path | None:
        """The snapshot folder of the backbone's commit (its files once fetched)."""
        from ..hub import snapshot_folder

        found = self.backbones[backbone]
        return None if found.commit is None else snapshot_folder(found.repo, found.commit)

    def config_folder(self, backbone: str) -> Path | None:
        return self.backbones[backbone].config

    def fetched(self, backbone: str) -> bool:
        return self.backbones[backbone].snapshot is not None

    def job_options(self, task: str, options: dict) -> dict:
        """A task's loader options for its job: each dataset id pinned to its commit (the
        revision dropped: the commit says it)."""
        if task not in self.tasks:
            return options
        pinned = {k: v for k, v in options.items() if k != "revision"}
        for key, found in self.tasks[task].items():
            pinned[key] = pin_dataset_id(options[key], found.commit)
        return pinned

    def fetch_entries(self, section: str, name: str) -> list[dict]:
        """The repositories a ``fetch`` job of a backbone or task fetches."""
        if section == "backbones":
            return [self.backbones[name].fetch_entry()] if name in self.backbones else []
        return [f.fetch_entry() for f in self.tasks.get(name, {}).values()]


def fetch_campaign(campaign) -> list[str]:
    """``python -m dlmpipe fetch``: every Hub repository of the campaign fetched at its
    configured revision (a branch read anew), where the network is; one line each."""
    from ..hub import Repo, fetch

    lines = []
    found = [*campaign.hub.backbones.values(),
             *(f for task in campaign.hub.tasks.values() for f in task.values())]
    for f in found:
        snapshot = fetch(Repo(f.repo.id, f.repo.revision, f.repo.kind))
        checked = f", {len(snapshot.sha256)} safetensors sha256 checked" if snapshot.sha256 else ""
        lines.append(f"{f.key}: {f.repo} -> commit {snapshot.commit}{checked} ({snapshot.folder})")
    return lines or ["nothing to fetch: the campaign names no Hub repository"]
