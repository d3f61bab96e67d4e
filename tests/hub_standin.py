"""A stand-in for the Hugging Face Hub's HTTP endpoints, on the loopback interface, for tests
(no network here): what huggingface_hub asks when it resolves a revision and fetches a
repository (dlmpipe/hub.py), for models and datasets alike.

- ``GET /api/{models|datasets}/{repo}/revision/{rev}``: the repository's info at a revision
  (``sha``: the commit);
- ``GET /api/{models|datasets}/{repo}/tree/{rev}``: its files, recursively, with each LFS file's
  sha256 (``lfs.oid``), which the fetch checks the weights against;
- ``HEAD|GET /{repo}/resolve/{rev}/{file}`` (``/datasets/{repo}/...``): a file, with the
  ``X-Repo-Commit``, ``ETag`` (``X-Linked-Etag``/``X-Linked-Size`` for LFS files) and
  ``Content-Length`` headers, and ``Range`` requests (a resumed download);
- errors as the Hub states them (``X-Error-Code``: RepoNotFound, RevisionNotFound, GatedRepo,
  EntryNotFound).

A repository is added from a dict of files (safetensors files are LFS files); ``add`` again
makes a new commit that ``main`` moves to. ``requests`` records every request; ``break_once``
makes a file's next download stop halfway (the client resumes it), ``fail_once`` answer 500.
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit


@dataclass
class StoredRepo:
    files: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> path -> bytes
    refs: dict[str, str] = field(default_factory=dict)                # branch or tag -> commit
    gated: bool = False

    def commit_of(self, revision: str) -> str | None:
        return revision if revision in self.files else self.refs.get(revision)


def files_of(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder``, by its path relative to it."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def lfs(path: str) -> bool:
    return path.endswith(".safetensors")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class HubStandIn:
    """The stand-in; ``url`` is its endpoint (HF_ENDPOINT)."""

    def __init__(self):
        self.repos: dict[tuple[str, str], StoredRepo] = {}
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self.broken: set[str] = set()
        self.failing: set[str] = set()
        #: LFS sha256 the listing states instead of the file's (a corrupt record, or download)
        self.lying: dict[str, str] = {}
        self._server: ThreadingHTTPServer | None = None

    def add(self, kind: str, repo: str, files: dict[str, bytes], tags=(), gated: bool = False) -> str:
        """A new commit of ``repo`` (``kind`` model or dataset) holding ``files``; ``main`` and
        ``tags`` name it. Returns the commit."""
        stored = self.repos.setdefault((kind, repo), StoredRepo())
        stored.gated = gated
        h = hashlib.sha1(f"{kind}/{repo}/{len(stored.files)}".encode())
        for name, data in sorted(files.items()):
            h.update(name.encode() + hashlib.sha256(data).digest())
        commit = h.hexdigest()
        stored.files[commit] = dict(files)
        for ref in ("main", *tags):
            stored.refs[ref] = commit
        return commit

    def break_once(self, path: str) -> None:
        """The next GET of a file whose URL ends in ``path`` stops halfway."""
        self.broken.add(path)

    def fail_once(self, path: str) -> None:
        """The next GET of a file whose URL ends in ``path`` is answered 500."""
        self.failing.add(path)

    def downloads(self) -> list[str]:
        """The file paths fetched with GET, in order."""
        return [p for m, p, _ in self.requests if m == "GET" and "/resolve/" in p]

    # ---- the server ----------------------------------------------------------------------
    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}"

    def start(self) -> "HubStandIn":
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                hub._answer(self, head=True)

            def do_GET(self):
                hub._answer(self, head=False)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                         daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # ---- the endpoints ---------------------------------------------------------------------
    def _answer(self, r: BaseHTTPRequestHandler, head: bool) -> None:
        path = unquote(urlsplit(r.path).path)
        self.requests.append((r.command, path, r.headers.get("Range")))
        parts = path.strip("/").split("/")
        if parts[0] == "api" and len(parts) >= 6 and parts[1] in ("models", "datasets"):
            kind, repo, what = parts[1][:-1], f"{parts[2]}/{parts[3]}", parts[4]
            if what in ("revision", "tree"):
                return self._api(r, kind, repo, what, parts[5])
        if parts[0] == "datasets":
            kind, parts = "dataset", parts[1:]
        else:
            kind = "model"
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._file(r, kind, f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), head)
        return self._error(r, 404, "EntryNotFound", "no such endpoint")

    def _repo(self, r, kind: str, repo: str, revision: str) -> tuple[StoredRepo, str] | None:
        stored = self.repos.get((kind, repo))
        if stored is None:
            self._error(r, 404, "RepoNotFound", "Repository not found")
            return None
        if stored.gated:
            self._error(r, 403, "GatedRepo", "Access to this repository is restricted")
            return None
        commit = stored.commit_of(revision)
        if commit is None:
            self._error(r, 404, "RevisionNotFound", f"Invalid rev id: {revision}")
            return None
        return stored, commit

    def _api(self, r, kind: str, repo: str, what: str, revision: str) -> None:
        found = self._repo(r, kind, repo, revision)
        if found is None:
            return
        stored, commit = found
        files = stored.files[commit]
        if what == "revision":
            body = {"id": repo, "sha": commit, "private": False, "gated": False,
                    "siblings": [{"rfilename": p} for p in files]}
        else:
            body = [{"type": "file", "path": p, "size": len(d), "oid": git_blob_id(d),
                     **({"lfs": {"oid": self.lying.get(p, hashlib.sha256(d).hexdigest()),
                                 "size": len(d), "pointerSize": 134}} if lfs(p) else {})}
                    for p, d in files.items()]
        self._send(r, 200, json.dumps(body).encode(), {"Content-Type": "application/json"})

    def _file(self, r, kind: str, repo: str, revision: str, name: str, head: bool) -> None:
        found = self._repo(r, kind, repo, revision)
        if found is None:
            return
        stored, commit = found
        data = stored.files[commit].get(name)
        if data is None:
            return self._error(r, 404, "EntryNotFound", f"{name} not found")
        etag = hashlib.sha256(data).hexdigest() if lfs(name) else git_blob_id(data)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"', "Accept-Ranges": "bytes",
                   **({"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(len(data))}
                      if lfs(name) else {})}
        if head:
            return self._send(r, 200, b"", {**headers, "Content-Length": str(len(data))}, head=True)
        if name in self.failing:
            self.failing.discard(name)
            return self._error(r, 500, None, "the stand-in's planned failure")
        status, body = 200, data
        if (ranged := r.headers.get("Range", "")).startswith("bytes="):
            start = int(ranged[len("bytes="):].split("-")[0])
            status, body = 206, data[start:]
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        if name in self.broken:  # headers for the whole body, half of it, then the line drops
            self.broken.discard(name)
            r.send_response(status)
            for k, v in {**headers, "Content-Length": str(len(body))}.items():
                r.send_header(k, v)
            r.end_headers()
            r.wfile.write(body[:len(body) // 2])
            r.wfile.flush()
            r.close_connection = True
            return
        self._send(r, status, body, headers)

    def _error(self, r, status: int, code: str | None, message: str) -> None:
        self._send(r, status, json.dumps({"error": message}).encode(),
                   {"Content-Type": "application/json", "X-Error-Message": message,
                    **({"X-Error-Code": code} if code else {})})

    def _send(self, r, status: int, body: bytes, headers: dict, head: bool = False) -> None:
        r.send_response(status)
        for k, v in headers.items():
            r.send_header(k, v)
        if "Content-Length" not in headers:
            r.send_header("Content-Length", str(len(body)))
        r.end_headers()
        if not head:
            r.wfile.write(body)
