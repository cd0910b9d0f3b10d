"""A local stand-in for the Hugging Face Hub: an HTTP server on 127.0.0.1 that serves model repos
from local directories on the routes huggingface_hub calls (model_info's /api/models/..., and the
HEAD and GET of /{repo}/resolve/{revision}/{file} that hf_hub_download makes), with the headers
and error codes it reads (X-Repo-Commit, ETag, X-Linked-Etag, X-Linked-Size, X-Error-Code), byte
ranges, and knobs that inject faults: one-shot error statuses, a server that ignores Range, a
request that never gets an answer, a changed ETag, and LFS files behind a redirect. It counts
every request and every body byte it writes.

    with HubServer([Repo("org/model", CKPT / "b4-sym-noact-gptq_v2-single")]) as hub:
        HfApi(endpoint=hub.endpoint).model_info("org/model", files_metadata=True)

It never sends X-Xet-* headers, so huggingface_hub downloads over plain HTTP.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import socket
import socketserver
import sys
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

CHUNK = 64 * 1024  # bodies are read from disk and written in chunks of this size
LFS_SUFFIXES = (".safetensors",)  # files stored with Git LFS (ETag: sha256, X-Linked-*)
LAST_MODIFIED = "2026-01-01T00:00:00.000Z"
_HEX40 = re.compile(r"[0-9a-f]{40}")
_RANGE = re.compile(r"(\d*)-(\d*)")
_DISCONNECT = (ConnectionError, TimeoutError)  # BrokenPipe, ConnectionReset, ...


@dataclass
class Request:
    """One request the server received. status stays 0 for a request never answered (hang);
    body_bytes counts the body bytes written to the client."""
    method: str
    path: str            # the URL path, unquoted, without the query
    range: str | None    # the Range header
    status: int = 0
    body_bytes: int = 0


@dataclass(frozen=True)
class _File:
    name: str                    # relative posix name in the repo
    path: Path
    size: int
    blob_id: str                 # git sha1 of the git blob (the LFS pointer for an LFS file)
    sha256: str | None = None    # LFS files only
    pointer_size: int | None = None

    @property
    def lfs(self) -> bool:
        return self.sha256 is not None


def _git_sha1_of_bytes(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _scan(name: str, path: Path) -> _File:
    size = path.stat().st_size
    lfs = name.endswith(LFS_SUFFIXES)
    h = hashlib.sha256() if lfs else hashlib.sha1(b"blob %d\0" % size)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    if not lfs:
        return _File(name, path, size, h.hexdigest())
    sha256 = h.hexdigest()
    pointer = (f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\n"
               f"size {size}\n").encode()
    return _File(name, path, size, _git_sha1_of_bytes(pointer), sha256, len(pointer))


class Repo:
    """A model repo: the files under `root` (recursively; folders whose name starts with a dot
    are skipped) at one commit, a sha1 derived from the repo id and the files' names and
    contents. `revisions` maps extra revision names to commits ({"main": commit} is always
    there unless given); any of those commits, and `commit`, is accepted as a revision too.
    With `token` the repo is private: a request without `Authorization: Bearer <token>` gets
    401 RepoNotFound. With `gated` too, model_info stays public and only the files need the
    token (401 GatedRepo); gated without a token: no request ever gets the files."""

    def __init__(self, repo_id: str, root: str | Path, *, revisions: dict[str, str] | None = None,
                 token: str | None = None, gated: bool = False) -> None:
        if repo_id.count("/") != 1 or not all(repo_id.split("/")):
            raise ValueError(f"repo_id must be 'org/name': {repo_id!r}")
        self.repo_id = repo_id
        self.root = Path(root)
        self.token = token
        self.gated = gated
        files: dict[str, _File] = {}
        for dirpath, dirnames, filenames in os.walk(self.root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for fn in sorted(filenames):
                p = Path(dirpath, fn)
                name = p.relative_to(self.root).as_posix()
                files[name] = _scan(name, p)
        if not files:
            raise ValueError(f"no files under {self.root}")
        self.files = dict(sorted(files.items()))
        h = hashlib.sha1(f"hubserver\0{repo_id}\0".encode())
        for f in self.files.values():
            h.update(f"{f.name}\0{f.blob_id}\0{f.sha256 or ''}\n".encode())
        self.commit: str = h.hexdigest()
        self.revisions: dict[str, str] = {"main": self.commit, **(revisions or {})}

    @property
    def private(self) -> bool:
        return self.token is not None and not self.gated

    def resolve(self, revision: str) -> str | None:
        """The commit of a revision name or of a full commit sha; None when unknown."""
        if revision in self.revisions:
            return self.revisions[revision]
        if _HEX40.fullmatch(revision) and (revision == self.commit
                                           or revision in self.revisions.values()):
            return revision
        return None

    def authorized(self, authorization: str | None) -> bool:
        return self.token is not None and authorization == f"Bearer {self.token}"

    def __repr__(self) -> str:
        return f"Repo({self.repo_id!r}, {str(self.root)!r}, commit={self.commit[:12]})"


class _Answer(Exception):
    """Raised inside a handler to answer with an error status (and the Hub's error headers)."""

    def __init__(self, status: int, code: str | None, message: str,
                 headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message
        self.headers = headers or {}


class _Unsatisfiable(Exception):
    pass


def _parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte of a single `bytes=` range; None to serve the whole body (no Range, a
    malformed or a multi-range one, which RFC 9110 lets a server ignore); _Unsatisfiable."""
    if header is None:
        return None
    unit, _, spec = header.strip().partition("=")
    if unit.strip().lower() != "bytes" or "," in spec:
        return None
    m = _RANGE.fullmatch(spec.strip())
    if m is None or m.group(1) == m.group(2) == "":
        return None
    a, b = m.groups()
    if a == "":
        n = int(b)
        if n == 0 or size == 0:
            raise _Unsatisfiable
        return max(0, size - n), size - 1
    first = int(a)
    if b and int(b) < first:
        return None
    if first >= size:
        raise _Unsatisfiable
    return first, min(int(b), size - 1) if b else size - 1


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "hubserver/1"
    timeout = 60  # a safety net: a connection idle this long is closed
    disable_nagle_algorithm = True  # headers and body go out at once (no delayed-ACK stall)
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except OSError:
            pass  # the client went away (or __exit__ shut the connection)

    def do_GET(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    # --- plumbing ---------------------------------------------------------------------------

    def _dispatch(self) -> None:
        hub = self.server.hub
        url = urlsplit(self.path)
        self._req = Request(self.command, unquote(url.path), self.headers.get("Range"))
        self._sent_headers = False
        if hub.hang is not None and hub.hang in self._req.path:
            hub._begin(self._req, active=False)  # not busy for wait_idle
            hub._release.wait()
            self.close_connection = True
            return
        hub._begin(self._req)
        try:
            try:
                fault = hub._take_fault(self._req.path)
                if fault is not None:
                    status, headers = fault
                    self._start(status, {**headers, "Content-Length": "0"})
                    return
                self._route(url.path, parse_qs(url.query))
            except _Answer as e:
                self._error(e)
        except _DISCONNECT:
            self.close_connection = True
        except Exception as e:  # a bug in the emulation: answer 500, keep it for the test
            hub.errors.append(e)
            self.close_connection = True
            if not self._sent_headers:
                try:
                    self._error(_Answer(500, None, f"hubserver: {type(e).__name__}: {e}"))
                except OSError:
                    pass
        finally:
            hub._end()

    def _start(self, status: int, headers: dict[str, str]) -> None:
        """Send the status line and the headers (every response has a Content-Length)."""
        assert "Content-Length" in headers
        self._req.status = status
        self._sent_headers = True
        self.send_response(status)
        for k, v in headers.items():
            self.send_header(k, v)
        self.end_headers()

    def _write(self, data: bytes) -> bool:
        """Write a piece of the body; False when the client has gone. The counters count it
        before the write (a client that has read it sees it counted) and take it back when
        the write fails."""
        hub = self.server.hub
        hub._count(self._req, len(data))
        try:
            self.wfile.write(data)
        except _DISCONNECT:
            hub._count(self._req, -len(data))
            self.close_connection = True
            return False
        return True

    def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self._start(status, {**headers, "Content-Length": str(len(body))})
        if self.command != "HEAD" and body:
            self._write(body)

    def _error(self, e: _Answer) -> None:
        headers = {"Content-Type": "application/json; charset=utf-8", **e.headers}
        if e.code is not None:
            headers["X-Error-Code"] = e.code
        # header values go out as latin-1: a non-ASCII file name is escaped
        headers["X-Error-Message"] = e.message.encode("ascii", "backslashreplace").decode()
        self._send(e.status, json.dumps({"error": e.message}).encode(), headers)

    # --- routes -----------------------------------------------------------------------------

    def _route(self, raw_path: str, query: dict[str, list[str]]) -> None:
        parts = raw_path.split("/")[1:]
        if len(parts) >= 4 and parts[:2] == ["api", "models"]:
            rest = parts[4:]
            if not rest:
                revision = None
            elif rest[0] == "revision" and len(rest) > 1 and all(rest[1:]):
                revision = "/".join(unquote(p) for p in rest[1:])
            else:
                raise _Answer(404, None, "Not Found")
            return self._model_info(f"{unquote(parts[2])}/{unquote(parts[3])}", revision)
        if len(parts) == 2 and parts[0] == "cdn":
            return self._cdn(parts[1], query)
        if len(parts) >= 5 and parts[2] == "resolve":
            return self._resolve(f"{unquote(parts[0])}/{unquote(parts[1])}", parts[3:])
        raise _Answer(404, None, "Not Found")

    def _repo(self, repo_id: str) -> Repo:
        repo = self.server.hub._repo(repo_id)
        if repo is None or (repo.private
                            and not repo.authorized(self.headers.get("Authorization"))):
            missing = repo is None
            raise _Answer(404 if missing else 401, "RepoNotFound",
                          "Repository not found" if missing else "Invalid username or password.")
        return repo

    def _model_info(self, repo_id: str, revision: str | None) -> None:
        repo = self._repo(repo_id)
        commit = repo.resolve("main" if revision is None else revision)
        if commit is None:
            raise _Answer(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        siblings: list[dict[str, Any]] = []
        for f in repo.files.values():
            s: dict[str, Any] = {"rfilename": f.name, "size": f.size, "blobId": f.blob_id}
            if f.lfs:
                s["lfs"] = {"size": f.size, "sha256": f.sha256, "pointerSize": f.pointer_size}
            siblings.append(s)
        info = {
            "_id": hashlib.sha1(repo.repo_id.encode()).hexdigest()[:24],
            "id": repo.repo_id,
            "modelId": repo.repo_id,
            "author": repo.repo_id.split("/")[0],
            "sha": commit,
            "private": repo.private,
            "gated": "auto" if repo.gated else False,
            "disabled": False,
            "lastModified": LAST_MODIFIED,
            "tags": [],
            "siblings": siblings,
        }
        self._send(200, json.dumps(info).encode(),
                   {"Content-Type": "application/json; charset=utf-8"})

    def _resolve(self, repo_id: str, rest: list[str]) -> None:
        repo = self._repo(repo_id)
        if repo.gated and not repo.authorized(self.headers.get("Authorization")):
            raise _Answer(401, "GatedRepo",
                          f"Access to model {repo.repo_id} is restricted. You must have access "
                          "to it and be authenticated to access it. Please log in.")
        # the revision is one quoted segment (refs%2Fpr%2F1, as hf_hub_url sends it); an
        # unquoted one with slashes (refs/pr/1) is found as the shortest known prefix
        names = [unquote(p) for p in rest]
        for k in range(1, len(names)):
            revision = "/".join(names[:k])
            commit = repo.resolve(revision)
            if commit is not None:
                break
        else:
            raise _Answer(404, "RevisionNotFound", f"Invalid rev id: {names[0]}")
        name = "/".join(names[k:])
        f = repo.files.get(name)
        if f is None:
            raise _Answer(404, "EntryNotFound", f"{name} does not exist on \"{revision}\"",
                          {"X-Repo-Commit": commit})
        etag = self.server.hub._etag(f)
        headers = {"X-Repo-Commit": commit, "ETag": f'"{etag}"'}
        if f.lfs:
            headers |= {"X-Linked-Etag": f'"{etag}"', "X-Linked-Size": str(f.size)}
            if self.server.hub.redirect_lfs:
                query = urlencode({"repo": repo.repo_id, "commit": commit, "file": f.name})
                headers["Location"] = f"/cdn/{f.sha256}?{query}"
                return self._send(302, b"", headers)
        self._file(f, headers)

    def _cdn(self, sha256: str, query: dict[str, list[str]]) -> None:
        """The content of an LFS file by its sha256, as a CDN serves it. The query (like a
        signed URL's) names the repo, commit and file the redirect came from: the response
        carries that X-Repo-Commit and the file's ETag (etag_salt included)."""
        hub = self.server.hub
        repo = hub._repo(query.get("repo", [""])[0])
        f = repo.files.get(query.get("file", [""])[0]) if repo is not None else None
        if f is None or f.sha256 != sha256:
            f = hub._blob(sha256)
        if f is None:
            raise _Answer(404, None, "NoSuchKey")
        etag = hub._etag(f)
        headers = {"ETag": f'"{etag}"', "X-Linked-Etag": f'"{etag}"',
                   "X-Linked-Size": str(f.size)}
        if "commit" in query:
            headers["X-Repo-Commit"] = query["commit"][0]
        self._file(f, headers)

    def _file(self, f: _File, headers: dict[str, str]) -> None:
        """A file's body (or the asked range of it), read from disk in chunks."""
        headers = {**headers, "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        size = f.size
        first, last = 0, size - 1
        status = 200
        if not self.server.hub.ignore_range:
            try:
                rng = _parse_range(self.headers.get("Range"), size)
            except _Unsatisfiable:
                return self._send(416, b"", {**headers, "Content-Range": f"bytes */{size}"})
            if rng is not None:
                first, last = rng
                status = 206
                headers["Content-Range"] = f"bytes {first}-{last}/{size}"
        length = last - first + 1
        self._start(status, {**headers, "Content-Length": str(length)})
        if self.command == "HEAD" or length == 0:
            return
        with open(f.path, "rb") as fh:
            fh.seek(first)
            while length > 0:
                chunk = fh.read(min(CHUNK, length))
                if not chunk:  # the file shrank under us: the promised length cannot be kept
                    self.close_connection = True
                    return
                if not self._write(chunk):
                    return
                length -= len(chunk)


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: HubServer) -> None:
        self.hub = hub
        super().__init__(("127.0.0.1", 0), _Handler)

    def server_bind(self) -> None:
        socketserver.TCPServer.server_bind(self)  # not HTTPServer's: no getfqdn (a DNS look-up)
        self.server_name, self.server_port = self.server_address[:2]

    def process_request(self, request: Any, client_address: Any) -> None:
        """Each connection in a daemon thread, both kept so that __exit__ can end them."""
        t = threading.Thread(target=self.process_request_thread, args=(request, client_address),
                             name=f"hubserver:{self.server_address[1]}:conn", daemon=True)
        with self.hub._lock:
            self.hub._conns.add(request)
            self.hub._threads = [x for x in self.hub._threads if x.is_alive()] + [t]
        t.start()

    def shutdown_request(self, request: Any) -> None:
        with self.hub._lock:
            self.hub._conns.discard(request)
            super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        exc = sys.exc_info()[1]
        if exc is not None and not isinstance(exc, OSError):
            self.hub.errors.append(exc)


class HubServer:
    """The server; a context manager (started on enter, stopped on exit). See the module doc.

    Knobs, plain attributes a test sets:
      fail          one-shot faults (path substring, status, extra headers): the first entry
                    whose substring is in a request's path is taken off and answered with
                    that status, an empty body and the headers
      ignore_range  file routes answer 200 with the whole body, whatever the Range
      hang          requests whose path contains it get no answer until __exit__, which
                    closes them
      etag_salt     file name -> a string mixed into that file's ETag
      redirect_lfs  an LFS file's resolve answers 302 to /cdn/<sha256>?... (relative)
    Counters: requests (every Request, in arrival order), bytes_sent (body bytes written);
    reset_counts() clears them. errors: exceptions the emulation itself raised (a bug)."""

    def __init__(self, repos: list[Repo] | None = None) -> None:
        self._lock = threading.RLock()
        self._idle = threading.Condition(self._lock)
        self._active = 0
        self._release = threading.Event()
        self._conns: set[socket.socket] = set()
        self._threads: list[threading.Thread] = []
        self._repos: dict[str, Repo] = {}
        self._blobs: dict[str, _File] = {}
        self._httpd: _Server | None = None
        self._thread: threading.Thread | None = None
        self.endpoint = ""
        self.requests: list[Request] = []
        self.bytes_sent = 0
        self.max_active = 0     # the most requests answered at once (since reset_counts)
        self.errors: list[BaseException] = []
        self.fail: list[tuple[str, int, dict[str, str]]] = []
        self.ignore_range = False
        self.hang: str | None = None
        self.etag_salt: dict[str, str] = {}
        self.redirect_lfs = False
        for repo in repos or []:
            self.add(repo)

    def add(self, repo: Repo) -> None:
        with self._lock:
            self._repos[repo.repo_id] = repo
            for f in repo.files.values():
                if f.sha256 is not None:
                    self._blobs.setdefault(f.sha256, f)

    @property
    def repos(self) -> dict[str, Repo]:
        with self._lock:
            return dict(self._repos)

    def __enter__(self) -> HubServer:
        self._release.clear()
        self._httpd = _Server(self)
        port = self._httpd.server_address[1]
        self.endpoint = f"http://127.0.0.1:{port}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, args=(0.02,),
                                        name=f"hubserver:{port}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        httpd, thread = self._httpd, self._thread
        if httpd is None or thread is None:
            return
        self._release.set()       # hung handlers return and close their connections
        httpd.shutdown()          # no new connections
        thread.join()
        with self._lock:          # wake handlers waiting on a kept-alive connection
            for conn in list(self._conns):
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        for t in self._threads:
            t.join(10)
        httpd.server_close()
        self._httpd = self._thread = None
        self._threads = []

    # --- counters ---------------------------------------------------------------------------

    def requests_for(self, suffix: str) -> list[Request]:
        with self._lock:
            return [r for r in self.requests if r.path.endswith(suffix)]

    def reset_counts(self) -> None:
        with self._lock:
            self.requests = []
            self.bytes_sent = 0
            self.max_active = 0

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Wait until no request is being answered (a hung one does not count): then every
        counter is final. False if that did not happen within `timeout` seconds."""
        with self._idle:
            return self._idle.wait_for(lambda: self._active == 0, timeout)

    # --- used by the handlers ---------------------------------------------------------------

    def _begin(self, req: Request, active: bool = True) -> None:
        with self._lock:
            self.requests.append(req)
            self._active += active
            self.max_active = max(self.max_active, self._active)

    def _end(self) -> None:
        with self._lock:
            self._active -= 1
            self._idle.notify_all()

    def _count(self, req: Request, n: int) -> None:
        with self._lock:
            req.body_bytes += n
            self.bytes_sent += n

    def _take_fault(self, path: str) -> tuple[int, dict[str, str]] | None:
        with self._lock:
            for i, (sub, status, headers) in enumerate(self.fail):
                if sub in path:
                    del self.fail[i]
                    return status, dict(headers)
        return None

    def _repo(self, repo_id: str) -> Repo | None:
        with self._lock:
            return self._repos.get(repo_id)

    def _blob(self, sha256: str) -> _File | None:
        with self._lock:
            return self._blobs.get(sha256)

    def _etag(self, f: _File) -> str:
        """A git sha1 of the blob, or the sha256 of an LFS file; a salt makes another one of
        the same form."""
        base = f.sha256 or f.blob_id
        salt = self.etag_salt.get(f.name)
        if salt is None:
            return base
        algo = hashlib.sha256 if f.lfs else hashlib.sha1
        return algo(f"{base}:{salt}".encode()).hexdigest()
