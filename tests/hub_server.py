"""A local fake of the Hugging Face Hub's HTTP API, for tests (written against huggingface_hub 2.4.0).

:class:`HubServer` serves model repositories held in memory on ``127.0.0.1`` (a free port), from a
daemon thread, with the standard library only. It answers the routes the real ``huggingface_hub``
client calls to list branches, read repository info, list a tree, read a file's metadata and
download a file (whole or by range), so ``HfApi(endpoint=server.endpoint)``, ``hf_hub_download``
and ``snapshot_download`` (``endpoint=server.endpoint``) run against it with no network:

- ``GET /api/models/{repo}/refs`` (``include_prs`` adds ``pullRequests``);
- ``GET /api/models/{repo}/revision/{revision}`` (``blobs`` adds each file's ``blobId`` and LFS
  info, as ``model_info(files_metadata=True)`` asks);
- ``GET /api/models/{repo}/tree/{revision}[/{path}]`` (``recursive``; one page, no ``Link``);
- ``HEAD`` and ``GET /{repo}/resolve/{revision}/{file}`` (``Range: bytes=a-b`` answers 206).

A revision is a branch name or a branch's commit, the sha1 of ``"{repo}@{branch}"``. Files named
``*.safetensors`` or ``*.bin`` are served as the Hub serves LFS files: their ``ETag`` and
``X-Linked-Etag`` are the content's sha256 and the tree gives their ``lfs`` info; any other file's
``ETag`` is its git blob id. No ``X-Xet-*`` header is ever sent, so the client downloads over plain
HTTP. Errors carry the Hub's ``X-Error-Code`` / ``X-Error-Message`` headers and a JSON
``{"error": ...}`` body, which ``huggingface_hub.utils.hf_raise_for_status`` turns into its error
types: a gated repository answers 401 ``GatedRepo`` on every route, a missing repository 404
``RepoNotFound``, a missing revision 404 ``RevisionNotFound``, a missing file 404 ``EntryNotFound``.

``server.cut_after(repo, filename, n_bytes)`` makes the next download of a file stop mid-way.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

#: File names served as LFS files (sha256 ETag, ``X-Linked-Etag``, ``lfs`` in the tree).
LFS_SUFFIXES = (".safetensors", ".bin")
#: Path segments that follow a one-segment repository name (``gpt2``) in an API route.
_API_ROUTES = frozenset({"refs", "revision", "tree"})
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
#: A fixed date for every ``lastModified`` / ``createdAt``: the fake's answers are deterministic.
_DATE = "2024-01-01T00:00:00.000Z"

Repos = Mapping[str, Mapping[str, Mapping[str, bytes]]]


def commit_sha(repo: str, branch: str) -> str:
    """The fake commit of ``branch`` in ``repo``: the hex sha1 of ``"{repo}@{branch}"``."""
    return hashlib.sha1(f"{repo}@{branch}".encode()).hexdigest()


def is_lfs(filename: str) -> bool:
    """Whether the fake serves ``filename`` as an LFS file (a weights file)."""
    return filename.endswith(LFS_SUFFIXES)


def git_blob_id(content: bytes) -> str:
    """The git object id of a blob holding ``content`` (what the Hub gives as a file's ``oid``)."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def lfs_pointer(content: bytes) -> bytes:
    """The git LFS pointer file committed in place of ``content``."""
    sha256 = hashlib.sha256(content).hexdigest()
    return f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {len(content)}\n".encode()


@dataclass(frozen=True)
class ServedRequest:
    """One request the fake answered: its method, its path (still URL-quoted, without the query),
    its query string, its ``Range`` header, the status sent and how many body bytes were sent."""

    method: str
    path: str
    query: str
    range: str | None
    status: int
    body_bytes: int


class HubError(Exception):
    """An error answer: a status, the Hub's ``X-Error-Code`` (if any), a message and extra headers."""

    def __init__(
        self, status: int, code: str | None, message: str, headers: Mapping[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


class HubServer:
    """A fake Hugging Face Hub serving ``repos`` over HTTP on ``127.0.0.1``; a context manager.

    ``repos`` maps ``"ORG/NAME"`` to branch name to ``{file name: content}``; ``gated`` names the
    repositories that answer 401 ``GatedRepo`` on every route (listed in ``repos`` or not).

    Attributes:
        endpoint: ``"http://127.0.0.1:PORT"``, once started (pass it as the client's ``endpoint``).
        requests: ``(method, path)`` of each request answered, in order (path URL-quoted, no query).
        log: a :class:`ServedRequest` per request answered, in the same order.
    """

    def __init__(self, repos: Repos, gated: frozenset[str] = frozenset()) -> None:
        self.repos: dict[str, dict[str, dict[str, bytes]]] = {
            repo: {branch: dict(files) for branch, files in branches.items()}
            for repo, branches in repos.items()
        }
        self.gated = frozenset(gated)
        #: Seconds each whole-file download waits before its body (a slow link; 0: none).
        self.download_delay = 0.0
        self.requests: list[tuple[str, str]] = []
        self.log: list[ServedRequest] = []
        self.endpoint = ""
        self._lock = threading.Lock()
        self._cuts: dict[tuple[str, str], list[int]] = {}  # (repo, file) -> [n_bytes, times left]
        self._connections: set[socket.socket] = set()
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> HubServer:
        """Bind a free port on ``127.0.0.1`` and serve from a daemon thread."""
        if self._httpd is not None:
            raise RuntimeError("the fake Hub is already running")
        handler = type("BoundHubHandler", (_HubHandler,), {"hub": self})
        httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        httpd.daemon_threads = True
        self._httpd = httpd
        self.endpoint = f"http://127.0.0.1:{httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving, close the port and every open connection (kept-alive ones included)."""
        if self._httpd is None:
            return
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._lock:
            connections, self._connections = list(self._connections), set()
        for connection in connections:
            try:
                connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass  # already closed by its handler
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> HubServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    # -- test controls -----------------------------------------------------------------------

    def commit(self, repo: str, branch: str) -> str:
        """The commit sha the fake gives ``branch`` of ``repo`` (see :func:`commit_sha`)."""
        return commit_sha(repo, branch)

    def cut_after(self, repo: str, filename: str, n_bytes: int, times: int = 1) -> None:
        """Make the next ``times`` GETs of ``filename`` in ``repo`` (any revision, any range) send
        their full headers (the whole ``Content-Length``) but close the connection after
        ``n_bytes`` bytes of the body. ``HEAD`` requests are not cut."""
        if n_bytes < 0 or times < 1:
            raise ValueError("cut_after needs n_bytes >= 0 and times >= 1")
        with self._lock:
            self._cuts[(repo, filename)] = [n_bytes, times]

    def ranges(self, method: str, path: str) -> list[str | None]:
        """The ``Range`` header (None when absent) of each ``method`` request of ``path`` served."""
        with self._lock:
            return [r.range for r in self.log if r.method == method and r.path == path]

    # -- request handling (called from the handler threads) ------------------------------------

    def _record(self, served: ServedRequest) -> None:
        with self._lock:
            self.requests.append((served.method, served.path))
            self.log.append(served)

    def _take_cut(self, repo: str, filename: str) -> int | None:
        """The byte count to cut this GET after, if a cut is pending for the file (and use it)."""
        with self._lock:
            cut = self._cuts.get((repo, filename))
            if cut is None:
                return None
            n_bytes, times = cut
            if times <= 1:
                del self._cuts[(repo, filename)]
            else:
                cut[1] = times - 1
            return n_bytes

    def _track(self, connection: socket.socket, opened: bool) -> None:
        with self._lock:
            if opened:
                self._connections.add(connection)
            else:
                self._connections.discard(connection)

    def _branches(self, repo: str) -> dict[str, dict[str, bytes]]:
        """The repository's branches, or the Hub's error for a gated or missing repository."""
        if repo in self.gated:
            raise HubError(
                401,
                "GatedRepo",
                f"Access to model {repo} is restricted. You must have access to it and be "
                "authenticated to access it. Please log in.",
            )
        if repo not in self.repos:
            raise HubError(404, "RepoNotFound", "Repository not found")
        return self.repos[repo]

    def _resolve(self, repo: str, revision: str) -> tuple[str, dict[str, bytes]]:
        """``(commit, files)`` of ``revision`` (a branch or a branch's commit) in ``repo``."""
        branches = self._branches(repo)
        if revision in branches:
            return commit_sha(repo, revision), branches[revision]
        for branch, files in branches.items():
            if commit_sha(repo, branch) == revision:
                return revision, files
        raise HubError(404, "RevisionNotFound", f"Invalid rev id: {revision}")

    def refs(self, repo: str, include_prs: bool) -> dict[str, Any]:
        """The ``/refs`` answer: every branch with its commit; no tags, converts or PRs."""
        body: dict[str, Any] = {
            "branches": [
                {
                    "name": branch,
                    "ref": f"refs/heads/{branch}",
                    "targetCommit": commit_sha(repo, branch),
                }
                for branch in self._branches(repo)
            ],
            "tags": [],
            "converts": [],
        }
        if include_prs:
            body["pullRequests"] = []
        return body

    def model_info(self, repo: str, revision: str, blobs: bool) -> dict[str, Any]:
        """The ``/revision/{revision}`` answer: the model info ``HfApi.model_info`` parses."""
        commit, files = self._resolve(repo, revision)
        siblings = []
        for name, content in sorted(files.items()):
            sibling: dict[str, Any] = {"rfilename": name, "size": len(content)}
            if blobs:
                sibling["blobId"] = git_blob_id(lfs_pointer(content) if is_lfs(name) else content)
                if is_lfs(name):
                    sibling["lfs"] = {
                        "sha256": hashlib.sha256(content).hexdigest(),
                        "size": len(content),
                        "pointerSize": len(lfs_pointer(content)),
                    }
            siblings.append(sibling)
        return {
            "_id": hashlib.sha1(repo.encode()).hexdigest()[:24],
            "id": repo,
            "modelId": repo,
            "author": repo.split("/")[0] if "/" in repo else None,
            "sha": commit,
            "lastModified": _DATE,
            "createdAt": _DATE,
            "private": False,
            "disabled": False,
            "gated": False,
            "downloads": 0,
            "likes": 0,
            "tags": [],
            "siblings": siblings,
            "usedStorage": sum(len(content) for content in files.values()),
        }

    def tree(self, repo: str, revision: str, path: str, recursive: bool) -> list[dict[str, Any]]:
        """The ``/tree/{revision}/{path}`` answer: the files (and folders) under ``path``."""
        _, files = self._resolve(repo, revision)
        prefix = f"{path.strip('/')}/" if path.strip("/") else ""
        under = {name: content for name, content in files.items() if name.startswith(prefix)}
        if prefix and not under:
            raise HubError(404, "EntryNotFound", f"{path} does not exist on {revision}")
        folders: set[str] = set()
        entries: list[dict[str, Any]] = []
        for name, content in sorted(under.items()):
            parts = name[len(prefix) :].split("/")
            for depth in range(1, len(parts) if recursive else min(len(parts), 2)):
                folders.add(prefix + "/".join(parts[:depth]))
            if len(parts) > 1 and not recursive:
                continue
            entry: dict[str, Any] = {"type": "file", "size": len(content), "path": name}
            if is_lfs(name):
                pointer = lfs_pointer(content)
                entry["oid"] = git_blob_id(pointer)
                entry["lfs"] = {
                    "oid": hashlib.sha256(content).hexdigest(),
                    "size": len(content),
                    "pointerSize": len(pointer),
                }
            else:
                entry["oid"] = git_blob_id(content)
            entries.append(entry)
        directories = [
            {
                "type": "directory",
                "oid": hashlib.sha1(f"{repo}:{folder}".encode()).hexdigest(),
                "size": 0,
                "path": folder,
            }
            for folder in sorted(folders)
        ]
        return directories + entries

    def file(self, repo: str, revision: str, filename: str) -> tuple[bytes, dict[str, str]]:
        """A file's content and the headers ``/resolve`` sends with it (not the length ones)."""
        commit, files = self._resolve(repo, revision)
        if filename not in files:
            raise HubError(404, "EntryNotFound", "Entry not found", {"X-Repo-Commit": commit})
        content = files[filename]
        headers = {"X-Repo-Commit": commit, "Accept-Ranges": "bytes"}
        if is_lfs(filename):
            sha256 = hashlib.sha256(content).hexdigest()
            headers.update(
                {
                    "ETag": f'"{sha256}"',
                    "X-Linked-Etag": f'"{sha256}"',
                    "X-Linked-Size": str(len(content)),
                }
            )
        else:
            headers["ETag"] = f'"{git_blob_id(content)}"'
        return content, headers


class _HubHandler(BaseHTTPRequestHandler):
    """Answers one connection's requests for the :class:`HubServer` bound as ``hub``."""

    hub: HubServer
    _method: str  # this request's method, path (quoted), query and Range header, for its record
    _path: str
    _query: str
    _range: str | None
    protocol_version = "HTTP/1.1"  # keep-alive, as the Hub: every answer has a Content-Length
    server_version = "FakeHub/1.0"

    def setup(self) -> None:
        super().setup()
        self.hub._track(self.connection, opened=True)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.hub._track(self.connection, opened=False)

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the requests are in ``hub.requests`` / ``hub.log``."""

    # Every method goes through _dispatch: GET and HEAD are served, any other answers 405.

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_HEAD(self) -> None:
        self._dispatch("HEAD")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def do_PUT(self) -> None:
        self._dispatch("PUT")

    def do_DELETE(self) -> None:
        self._dispatch("DELETE")

    # -- routing -------------------------------------------------------------------------------

    def _dispatch(self, method: str) -> None:
        split = urlsplit(self.path)
        self._method, self._path, self._query = method, split.path, split.query
        self._range = self.headers.get("Range")
        if method not in ("GET", "HEAD"):
            self.close_connection = True  # a request body, if any, is left unread
            self._send_error(HubError(405, None, f"{method} is not served by the fake Hub"))
            return
        segments = split.path.split("/")[1:]
        query = {key: values[-1] for key, values in parse_qs(split.query).items()}
        try:
            if segments[:2] == ["api", "models"]:
                self._api(segments[2:], query, head=method == "HEAD")
            elif "resolve" in segments[1:3]:
                at = segments.index("resolve", 1)
                repo = unquote("/".join(segments[:at]))
                if len(segments) < at + 3:
                    raise HubError(404, None, "no file in a resolve path")
                revision = unquote(segments[at + 1])
                filename = unquote("/".join(segments[at + 2 :]))
                self._resolve_file(repo, revision, filename, head=method == "HEAD")
            else:
                raise HubError(404, None, f"{split.path} is not served by the fake Hub")
        except HubError as error:
            self._send_error(error, head=method == "HEAD")

    def _api(self, rest: list[str], query: dict[str, str], head: bool) -> None:
        """``/api/models/{repo}/...``: refs, model info, tree."""
        width = 1 if len(rest) >= 2 and rest[1] in _API_ROUTES else 2  # segments in the repo id
        repo, route = unquote("/".join(rest[:width])), rest[width:]
        if route == ["refs"]:
            body: Any = self.hub.refs(repo, include_prs=_true(query.get("include_prs")))
        elif len(route) == 2 and route[0] == "revision":
            body = self.hub.model_info(repo, unquote(route[1]), blobs=_true(query.get("blobs")))
        elif len(route) >= 2 and route[0] == "tree":
            path = unquote("/".join(route[2:]))
            body = self.hub.tree(repo, unquote(route[1]), path, _true(query.get("recursive")))
        else:
            self.hub._branches(repo)  # a gated or missing repository answers as such first
            raise HubError(404, None, f"/api/models/{repo}/{'/'.join(route)} is not served")
        payload = json.dumps(body).encode()
        self._send(200, {"Content-Type": "application/json"}, payload, head=head)

    def _resolve_file(self, repo: str, revision: str, filename: str, head: bool) -> None:
        """``/{repo}/resolve/{revision}/{file}``: the file, whole or one ``Range``."""
        content, headers = self.hub.file(repo, revision, filename)
        headers["Content-Type"] = "application/octet-stream"
        status, body = 200, content
        if self._range is not None and not head:
            start, end = _parse_range(self._range, len(content))
            if start is None:
                headers["Content-Range"] = f"bytes */{len(content)}"
                raise HubError(416, None, f"Range {self._range} not satisfiable", headers)
            status, body = 206, content[start : end + 1]
            headers["Content-Range"] = f"bytes {start}-{end}/{len(content)}"
        cut = None if head else self.hub._take_cut(repo, filename)
        if not head and status == 200 and self.hub.download_delay:
            time.sleep(self.hub.download_delay)
        self._send(status, headers, body, head=head, cut=cut)

    # -- answers -------------------------------------------------------------------------------

    def _send(
        self,
        status: int,
        headers: Mapping[str, str],
        body: bytes,
        head: bool = False,
        cut: int | None = None,
    ) -> None:
        """Send ``status``, ``headers`` and ``Content-Length: len(body)``, then the body (none for
        HEAD); with ``cut``, only its first ``cut`` bytes, then close the connection. The request
        is recorded first: a client that has its answer finds it in ``hub.requests``."""
        sent = b"" if head else body if cut is None else body[:cut]
        self.hub._record(
            ServedRequest(self._method, self._path, self._query, self._range, status, len(sent))
        )
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        if cut is not None:
            self.close_connection = True  # the server closes it once this handler returns
        self.end_headers()
        self.wfile.write(sent)
        self.wfile.flush()

    def _send_error(self, error: HubError, head: bool = False) -> None:
        """Send ``error`` as the Hub does: ``X-Error-Code``, ``X-Error-Message``, a JSON body."""
        headers = {"Content-Type": "application/json", **error.headers}
        if error.code is not None:
            headers["X-Error-Code"] = error.code
        headers["X-Error-Message"] = error.message
        self._send(error.status, headers, json.dumps({"error": error.message}).encode(), head=head)


def _true(value: str | None) -> bool:
    """A query flag as the client sends it (``true`` / ``1``)."""
    return value is not None and value.lower() in ("1", "true")


def _parse_range(header: str, size: int) -> tuple[int | None, int]:
    """``(first, last)`` byte of a ``bytes=a-b`` / ``bytes=a-`` / ``bytes=-n`` range of a
    ``size``-byte file, the last clipped to the file; ``(None, 0)`` when not satisfiable."""
    match = _RANGE.fullmatch(header.strip())
    if match is None or match.groups() == ("", ""):
        return None, 0
    first, last = match.groups()
    if first == "":  # the last n bytes
        start, end = max(size - int(last), 0), size - 1
    else:
        start = int(first)
        end = min(int(last), size - 1) if last else size - 1
    if start >= size or start > end:
        return None, 0
    return start, end
