"""Checkpoints and datasets by Hugging Face Hub name, pinned to a revision (README, "A campaign
for a real checkpoint"; docs/CAMPAIGNS.md, "Hub names").

A repository at a revision (a tag, branch or commit) is fetched once into the standard Hugging
Face cache (``HF_HOME``, ``HF_HUB_CACHE``; ``HF_ENDPOINT``, ``HF_TOKEN`` and ``HF_HUB_OFFLINE``
honoured: huggingface_hub reads them) by ``fetch``: huggingface_hub's ``snapshot_download``,
which resumes a partial file and records the repository's file listing for the commit; then
every safetensors file's sha256 is checked against the Hub's record in that listing. Afterwards
``cached`` finds the complete snapshot with no network at all, so the jobs read it offline.
``resolve`` names the commit a revision stands for (the cache's record, else one question to the
Hub), and turns what can go wrong before any job into one sentence: a gated or missing
repository, a revision it does not have, no network or offline mode without the snapshot.
A backbone's snapshot holds the files dlmpipe reads (``MODEL_FILES``: configs, safetensors
weights, tokenizer files; never remote code), a dataset's every file.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .backbones.pins import file_sha256

#: what a backbone's snapshot holds: config and index JSON, weights, tokenizer and chat template
MODEL_FILES = ("*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja")
COMMIT = re.compile(r"[0-9a-f]{40}")
FETCH = "python -m dlmpipe fetch CONFIG"


class HubError(ValueError):
    """Why a repository cannot be read at a revision, in one sentence; ``about``: what to fix
    (``revision``: one the repository lacks; ``network``: no network, or HF_HUB_OFFLINE,
    without the snapshot; ``name``: anything else)."""

    def __init__(self, message: str, about: str = "name"):
        self.about = about
        super().__init__(message)


@dataclass(frozen=True)
class Repo:
    """A repository on the Hub at a revision: ``kind`` model (a backbone) or dataset."""

    id: str
    revision: str = "main"
    kind: str = "model"

    def __str__(self) -> str:
        return f"{self.kind} {self.id} at revision {self.revision!r}"

    @property
    def patterns(self) -> tuple[str, ...] | None:
        return MODEL_FILES if self.kind == "model" else None


@dataclass(frozen=True)
class Snapshot:
    """A repository's files at one commit in the cache: ``folder``; ``sha256``: the Hub's
    record of each safetensors file's hash (what ``fetch`` checked)."""

    repo: Repo
    commit: str
    folder: Path
    sha256: dict[str, str]

    def record(self) -> dict:
        """What a manifest and a provenance record name."""
        return {"repo": self.repo.id, "kind": self.repo.kind, "revision": self.repo.revision,
                "commit": self.commit}


def cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


def snapshot_folder(repo: Repo, commit: str) -> Path:
    """Where the cache keeps ``repo`` at ``commit`` (whether or not it is there yet)."""
    from huggingface_hub.file_download import repo_folder_name

    return cache_dir() / repo_folder_name(repo_id=repo.id, repo_type=repo.kind) / "snapshots" / commit


def cached_commit(repo: Repo) -> str | None:
    """The commit the revision names in the cache (a commit itself, or the ref a fetch
    recorded), without the network; None when no fetch recorded it."""
    if COMMIT.fullmatch(repo.revision):
        return repo.revision
    from huggingface_hub.file_download import repo_folder_name

    ref = cache_dir() / repo_folder_name(repo_id=repo.id, repo_type=repo.kind) / "refs" / repo.revision
    return ref.read_text().strip() if ref.is_file() else None


def cached(repo: Repo) -> Snapshot | None:
    """The complete snapshot of ``repo`` in the cache (every file of the fetched listing that
    the repo's patterns select is there), with no network; None when it was not fetched."""
    # the listing snapshot_download keeps per commit, with each LFS file's sha256 (the public
    # get_cached_repo_tree leaves the sha256 out)
    from huggingface_hub._tree_cache import read_tree_cache

    commit = cached_commit(repo)
    if commit is None:
        return None
    tree = read_tree_cache(str(snapshot_folder(repo, commit).parent.parent), commit)
    if tree is None:
        return None
    folder = snapshot_folder(repo, commit)
    files = {path: entry for path, entry in tree.items() if _selected(path, repo.patterns)}
    if not all((folder / path).is_file() for path in files):
        return None
    return Snapshot(repo, commit, folder, {path: entry.lfs_sha256 for path, entry in files.items()
                                           if path.endswith(".safetensors") and entry.lfs_sha256})


def resolve(repo: Repo) -> str:
    """The commit ``repo``'s revision names: the cache's record where a fetch made one, else
    the Hub's answer (one request); a HubError saying why neither can tell."""
    snapshot = cached(repo)
    if snapshot is not None:
        return snapshot.commit
    from huggingface_hub import HfApi

    try:
        info = HfApi().repo_info(repo.id, repo_type=repo.kind, revision=repo.revision)
    except Exception as e:  # noqa: BLE001  (explained, or raised as it is)
        raise explain(repo, e) from None
    return info.sha


def fetch(repo: Repo) -> Snapshot:
    """``repo`` in the cache, complete: downloaded where it is not (resuming partial files),
    found offline where it is; every safetensors file's sha256 checked against the Hub's
    record (a HubError naming the file and both hashes where one differs)."""
    from huggingface_hub import snapshot_download

    try:
        snapshot_download(repo.id, repo_type=repo.kind, revision=repo.revision,
                          allow_patterns=list(repo.patterns) if repo.patterns else None)
    except Exception as e:  # noqa: BLE001
        raise explain(repo, e) from None
    snapshot = cached(repo)
    if snapshot is None:
        raise HubError(f"{repo}: the download left the snapshot in {cache_dir()} incomplete; "
                       f"fetch again ({FETCH})")
    for name, want in snapshot.sha256.items():
        got = file_sha256(snapshot.folder / name)
        if got != want:
            blob = (snapshot.folder / name).resolve()
            raise HubError(f"{repo}: {name} has sha256 {got}, the Hub records {want}: delete "
                           f"{blob} and fetch again ({FETCH})")
    return snapshot


def config_folder(repo: Repo) -> Path:
    """A folder holding ``repo``'s config.json: its fetched snapshot, else config.json alone
    downloaded into the cache (how ``check`` and ``plan`` size a backbone before its weights
    are fetched)."""
    snapshot = cached(repo)
    if snapshot is not None:
        return snapshot.folder
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    hit = try_to_load_from_cache(repo.id, "config.json", revision=repo.revision)
    if isinstance(hit, str):
        return Path(hit).parent
    try:  # the ref it records lets a later plan find it offline
        return Path(hf_hub_download(repo.id, "config.json", revision=repo.revision)).parent
    except Exception as e:  # noqa: BLE001
        raise explain(repo, e) from None


def explain(repo: Repo, error: Exception) -> Exception:
    """huggingface_hub's error as a HubError of one sentence saying what to do (errors it does
    not name are returned as they are)."""
    from huggingface_hub import constants
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, IncompleteSnapshotError,
                                        LocalEntryNotFoundError, OfflineModeIsEnabled,
                                        RepositoryNotFoundError, RevisionNotFoundError)

    url = f"{constants.ENDPOINT}/{'datasets/' if repo.kind == 'dataset' else ''}{repo.id}"
    missing = f"{repo} is not in the Hugging Face cache ({cache_dir()})"
    where = f"run `{FETCH}` where the network is, with the same HF_HOME"
    if isinstance(error, GatedRepoError):
        return HubError(f"{repo.id} is gated: accept its conditions at {url} with your account, "
                        "then log in where dlmpipe fetches it (`hf auth login`, or HF_TOKEN)")
    if isinstance(error, RevisionNotFoundError):
        return HubError(f"{repo.id} has no revision {repo.revision!r} (a branch, tag or commit "
                        f"of {url})", about="revision")
    if isinstance(error, RepositoryNotFoundError):
        return HubError(f"no {repo.kind} repository {repo.id} at {constants.ENDPOINT} (a "
                        "misspelt name, or a private repository: log in with a token that can "
                        "read it)")
    if isinstance(error, IncompleteSnapshotError):
        missing = f"{repo}: its snapshot in the Hugging Face cache ({cache_dir()}) is incomplete"
    if isinstance(error, OfflineModeIsEnabled) or (
            isinstance(error, LocalEntryNotFoundError) and _offline()):
        return HubError(f"{missing} and HF_HUB_OFFLINE is set: {where} (or unset HF_HUB_OFFLINE "
                        "here)", about="network")
    if isinstance(error, LocalEntryNotFoundError) or _network_error(error):
        return HubError(f"{missing} and {constants.ENDPOINT} cannot be reached "
                        f"({type(error).__name__}: {_first_line(error)}): {where}", about="network")
    if isinstance(error, HfHubHTTPError):
        return HubError(f"{repo}: {constants.ENDPOINT} answered {_first_line(error)}")
    return error


def _offline() -> bool:
    from huggingface_hub import constants

    return constants.is_offline_mode()


def _network_error(error: Exception) -> bool:
    """A connection refused, a timeout, a name that does not resolve (httpx's errors)."""
    names = {c.__name__ for c in type(error).__mro__}
    return bool(names & {"ConnectError", "TimeoutException", "NetworkError", "TransportError"})


def _first_line(error: Exception) -> str:
    return next((line for line in str(error).splitlines() if line.strip()), type(error).__name__)


def _selected(path: str, patterns: tuple[str, ...] | None) -> bool:
    from huggingface_hub.utils import filter_repo_objects

    return patterns is None or bool(list(filter_repo_objects([path], allow_patterns=list(patterns))))


def fetch_all(entries: list[dict]) -> dict[str, dict]:
    """The fetch job (``python -m dlmpipe fetch-hub``): each entry (``key``, ``repo``,
    ``kind``, ``revision`` as configured, ``commit`` it names) fetched at its commit; returns
    key -> what was fetched (``Snapshot.record``, the revision as configured, the sha256
    checked), for the manifest and the task's table."""
    out = {}
    for e in entries:
        snapshot = fetch(Repo(e["repo"], e["commit"], e["kind"]))
        out[e["key"]] = {**snapshot.record(), "revision": e["revision"], "sha256": snapshot.sha256}
    return out
