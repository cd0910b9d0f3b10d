"""A checkpoint on the Hugging Face Hub read where it lies, over HTTP range requests.

`Mirror.open(repo_id, revision)` resolves the revision to its commit (one API call, which also
lists the files and their sizes) and makes a mirror: a temporary directory that holds the repo's
configs and index whole, and for each safetensors file a sparse file of the same size in which
nothing has been fetched yet. Every command reads the mirror with its own code, as it reads a
local checkpoint, so the answer is the local one by construction; what it reads is fetched
first:

- SafetensorsFile asks the file's `Filler` (`filler_for(path)`) for the bytes it reads: the
  length, the header, a tensor when it is viewed, the rows a caller names for a partial view;
- a caller that knows ahead what it will read (inspect: every qzeros and g_idx, the first
  sample of qweight rows) says so once (TensorStore.prefetch), and those ranges are fetched
  together: ranges less than GAP apart are one request, no request is longer than PIECE, and at
  most `in_flight` requests run at once (for every shard and, in a scan, every repo together).

Every byte lands in the sparse file at its own offset, so memory stays flat whatever the shard
size, and a range is fetched once. Each file is read at the commit, never at a branch, so a push
while it is read cannot mix two versions; the ETag of every answer must be the first one's
(a CDN that serves another object under the same URL is caught, not read). A server that
ignores Range would send the whole file: refused unless the caller allows whole files.

Requests go through huggingface_hub's own HTTP session, headers (the user's token) and endpoint
(HF_ENDPOINT); 429 and 5xx are retried with backoff as huggingface_hub does (Retry-After, else
1, 2, 4, 8, 8 s); every other failure is one RemoteError line that says what to do.
"""
from __future__ import annotations

import bisect
import importlib
import json
import math
import os
import re
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from ..errors import RemoteError, UsageError
from ..version import __version__
from .hub import HUB_EXTRA, download_command, first_line

GAP = 64 << 10        # ranges closer than this are read in one request (the gap is read too)
PIECE = 16 << 20      # the most bytes one request asks for
HEAD_GUESS = 64 << 10  # a shard's first read: its header length and, nearly always, its header
IN_FLIGHT = 8         # requests in flight at once, by default
RETRIES = 5           # as huggingface_hub's http_backoff
RETRY_STATUS = (429, 500, 502, 503, 504)
STREAM_CHUNK = 1 << 20

#: how the retries wait (seconds): replaced by tests, which record the waits instead
sleep: Callable[[float], None] = time.sleep


@dataclass
class Stats:
    """What was fetched: requests sent (retries included), body bytes received, retries."""
    requests: int = 0
    bytes: int = 0
    retries: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, requests: int = 0, nbytes: int = 0, retries: int = 0) -> None:
        with self.lock:
            self.requests += requests
            self.bytes += nbytes
            self.retries += retries


def _etag(headers) -> str | None:
    tag = headers.get("etag")
    if not tag:
        return None
    tag = tag.strip()
    return tag[2:].strip('"') if tag.startswith("W/") else tag.strip('"')


class Hub:
    """The Hub's HTTP API as gptqfmt uses it: huggingface_hub's session, headers and endpoint,
    gptqfmt's retries and one-line errors. `gate` bounds the requests in flight (shared by
    every repo of a scan)."""

    def __init__(self, endpoint: str | None = None, token: str | bool | None = None,
                 timeout: float | None = None, in_flight: int = IN_FLIGHT,
                 gate: threading.Semaphore | None = None, whole_files: bool = False):
        try:
            from huggingface_hub import constants
            from huggingface_hub.utils import build_hf_headers, get_session
        except ImportError:
            raise UsageError(f"--remote reads the Hugging Face Hub through huggingface_hub; "
                             f"install the hub extra: {HUB_EXTRA}") from None
        # read at each call, not at huggingface_hub's import, so that a setting made after it
        # (a test's server, a notebook's os.environ) holds
        self.endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or
                         constants.ENDPOINT).rstrip("/")
        self.offline = constants.is_offline_mode()
        self.headers = build_hf_headers(token=token, library_name="gptqfmt",
                                        library_version=__version__)
        self.timeout = timeout if timeout is not None else float(
            os.environ.get("HF_HUB_DOWNLOAD_TIMEOUT") or constants.DEFAULT_DOWNLOAD_TIMEOUT)
        self.session = get_session()
        if not hasattr(self.session, "stream"):   # huggingface_hub < 1.0: a requests session
            raise UsageError("--remote reads through huggingface_hub's httpx session: upgrade "
                             "it (pip install -U 'huggingface_hub>=1.0')")
        # the session's HTTP library (httpx2 under huggingface_hub 2, httpx under 1): its
        # exceptions are what a request raises
        self.http = importlib.import_module(type(self.session).__module__.split(".")[0])
        self.gate = gate or threading.BoundedSemaphore(max(1, in_flight))
        self.in_flight = max(1, in_flight)
        self.whole_files = whole_files
        self.stats = Stats()

    # ---- one request, retried -------------------------------------------------------------

    def request(self, url: str, what: str, rng: tuple[int, int] | None = None,
                sink: Callable[[Any], Any] | None = None) -> Any:
        """GET `url` (the bytes [start, stop) with `rng`), retried on 429 and 5xx and on
        timeouts and dropped connections. `sink(response)` reads the body inside the
        request (streamed); without one the JSON body is returned. `what` names the request in
        errors ("ORG/MODEL", "ORG/MODEL: model.safetensors")."""
        http = self.http
        if self.offline:
            raise RemoteError(f"{what}: huggingface_hub's offline mode is on (HF_HUB_OFFLINE); "
                              "--remote reads the Hub: unset it")
        headers = dict(self.headers)
        if rng is not None:
            headers["Range"] = f"bytes={rng[0]}-{rng[1] - 1}"
        wait, tries = 1.0, 0
        while True:
            tries += 1
            retry_after: float | None = None
            try:
                with self.gate:
                    self.stats.add(requests=1)
                    with self.session.stream("GET", url, headers=headers, timeout=self.timeout,
                                             follow_redirects=True) as r:
                        if r.status_code not in RETRY_STATUS:
                            if r.status_code >= 400:
                                self._fail(r, what)
                            return sink(r) if sink is not None else self._json(r, what)
                        status = r.status_code
                        retry_after = _retry_after(r.headers)
            except http.TimeoutException:
                if tries > RETRIES:
                    raise RemoteError(
                        f"{what}: no answer from {self.endpoint} within {self.timeout:g} s "
                        f"({tries} tries); check the network, or allow longer with "
                        "HF_HUB_DOWNLOAD_TIMEOUT=SECONDS") from None
                status = None
            except (http.NetworkError, http.RemoteProtocolError, http.ProxyError) as e:
                if tries > RETRIES or isinstance(e, http.ConnectError) and tries > 1:
                    raise RemoteError(f"{what}: cannot reach {self.endpoint}: "
                                      f"{first_line(e)}; check the network, the proxy "
                                      "(HTTPS_PROXY) or HF_ENDPOINT") from None
                status = None
            except http.HTTPError as e:   # too many redirects, a body that cannot be decoded
                raise RemoteError(f"{what}: {type(e).__name__}: {first_line(e)}") from None
            if status is not None and tries > RETRIES:
                if status == 429:
                    raise RemoteError(f"{what}: the Hub limits the request rate (429) and "
                                      f"still did after {tries} tries; wait a few minutes and "
                                      "run again (logged in, the limit is higher: hf auth "
                                      "login)")
                raise RemoteError(f"{what}: the server answered {status} {tries} times; run "
                                  "again later")
            self.stats.add(retries=1)
            sleep(retry_after if retry_after is not None else wait)
            wait = min(8.0, wait * 2)

    def _json(self, r, what: str) -> Any:
        body = r.read()
        self.stats.add(nbytes=len(body))
        try:
            return json.loads(body)
        except ValueError:
            raise RemoteError(f"{what}: {r.url} did not answer JSON (is HF_ENDPOINT a Hub?)"
                              ) from None

    def _fail(self, r, what: str) -> None:
        code = r.headers.get("x-error-code", "")
        message = r.headers.get("x-error-message", "")
        login = "log in with `hf auth login` or set HF_TOKEN"
        repo = what.split(":")[0].split("@")[0]
        if code == "GatedRepo":
            raise RemoteError(f"{what}: a gated repo, and this token has not been granted "
                              f"access ({r.status_code}): accept its conditions at "
                              f"{self.endpoint}/{repo}, then {login}")
        if code == "RevisionNotFound":
            raise RemoteError(f"{what}: no such revision (404); name a branch, tag or commit "
                              f"that {self.endpoint}/{repo} has")
        if code == "EntryNotFound":
            raise RemoteError(f"{what}: the repo lists the file but the server has no such "
                              "file (404); run again")
        if r.status_code == 401 and message == "Invalid credentials in Authorization header":
            raise RemoteError(f"{what}: the token is not valid (401); {login}")
        if code == "RepoNotFound" or r.status_code in (401, 404):
            raise RemoteError(f"{what}: no such repo on {self.endpoint}, or it is private and "
                              f"this token cannot read it ({r.status_code}); check the name, or "
                              f"{login}")
        if r.status_code == 403:
            raise RemoteError(f"{what}: access denied (403){': ' + message if message else ''}; "
                              f"{login} with a token that can read the repo")
        if r.status_code == 416:
            raise RemoteError(f"{what}: the server refused the byte range (416): the file is "
                              "shorter than the Hub's file list says; run again")
        raise RemoteError(f"{what}: the server answered {r.status_code}"
                          f"{': ' + message if message else ''}")

    # ---- the repo -------------------------------------------------------------------------

    def resolve(self, repo_id: str, revision: str) -> tuple[str, dict[str, int]]:
        """(commit, {file: size}) of `repo_id` at `revision`: one call to the models API."""
        url = f"{self.endpoint}/api/models/{repo_id}/revision/{quote(revision, safe='')}"
        info = self.request(url + "?blobs=true", f"{repo_id}@{revision}")
        sha = info.get("sha") if isinstance(info, dict) else None
        if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{40}", sha):
            raise RemoteError(f"{repo_id}@{revision}: the Hub's answer names no commit (is "
                              "HF_ENDPOINT a Hub?)")
        files = {}
        for s in info.get("siblings") or []:
            name, size = s.get("rfilename"), s.get("size")
            if isinstance(name, str) and isinstance(size, int):
                files[name] = size
            elif isinstance(name, str) and name.endswith((".json", ".safetensors")):
                raise RemoteError(f"{repo_id}@{revision}: the Hub's file list gives no size "
                                  f"for {name}")
        return sha, files

    def file_url(self, repo_id: str, commit: str, name: str) -> str:
        return f"{self.endpoint}/{repo_id}/resolve/{commit}/{quote(name)}"


def _retry_after(headers) -> float | None:
    value = headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


# ---- ranges ------------------------------------------------------------------------------------

def coalesce(ranges: Iterable[tuple[int, int]], gap: int = GAP,
             piece: int = PIECE) -> list[tuple[int, int]]:
    """The requests that read `ranges` ([start, stop) byte ranges, any order, may overlap):
    sorted, merged where less than `gap` bytes apart, then cut into pieces of at most `piece`.

        >>> coalesce([(100, 200), (0, 50), (180, 300), (70000, 70010)], gap=64)
        [(0, 50), (100, 300), (70000, 70010)]
        >>> coalesce([(0, 50), (60, 100)], gap=64)
        [(0, 100)]
        >>> coalesce([(0, 10)], piece=4)
        [(0, 4), (4, 8), (8, 10)]
    """
    merged: list[list[int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if merged and a - merged[-1][1] < gap:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(s, min(s + piece, b)) for a, b in merged for s in range(a, b, piece)]


def missing(have: list[tuple[int, int]], a: int, b: int) -> list[tuple[int, int]]:
    """The parts of [a, b) not in `have` (sorted, disjoint ranges).

        >>> missing([(10, 20), (30, 40)], 0, 50)
        [(0, 10), (20, 30), (40, 50)]
        >>> missing([(0, 100)], 10, 20)
        []
    """
    out, at = [], a
    # ranges are disjoint and sorted, so ends are too: start at the last one beginning at or
    # before `a` (thousands of ranges in a shard read a few at a time)
    first = max(0, bisect.bisect_right(have, (a, math.inf)) - 1)
    for s, e in have[first:]:
        if e <= at:
            continue
        if s >= b:
            break
        if s > at:
            out.append((at, min(s, b)))
        at = max(at, e)
        if at >= b:
            break
    if at < b:
        out.append((at, b))
    return out


def _add(have: list[tuple[int, int]], a: int, b: int) -> list[tuple[int, int]]:
    """`have` with [a, b) added, merged (sorted, disjoint, touching ranges joined)."""
    # the ranges that touch [a, b) are one run of `have` (sorted, disjoint): merged into one
    lo = bisect.bisect_left(have, a, key=lambda r: r[1])     # the first ending at or past a
    hi = bisect.bisect_right(have, b, key=lambda r: r[0])    # past the last starting by b
    if lo < hi:
        a, b = min(a, have[lo][0]), max(b, have[hi - 1][1])
    return [*have[:lo], (a, b), *have[hi:]]


class Filler:
    """One remote file behind its sparse local copy: `ensure(ranges)` fetches the parts of
    `ranges` not fetched yet (coalesced, in parallel) into it. Thread-safe; a range another
    thread is fetching is waited for, not fetched twice."""

    def __init__(self, hub: Hub, repo_id: str, commit: str, name: str, path: Path, size: int):
        self.hub, self.path, self.size = hub, path, size
        self.repo_id, self.commit, self.name = repo_id, commit, name
        self.url = hub.file_url(repo_id, commit, name)
        self.what = f"{repo_id}@{commit[:12]}: {name}"
        self.have: list[tuple[int, int]] = []
        self.etag: str | None = None
        self.lock = threading.Lock()
        self.busy = threading.Condition(self.lock)
        self.pending: list[tuple[int, int]] = []   # being fetched by some thread

    def ensure(self, ranges: Iterable[tuple[int, int]]) -> None:
        want = [(max(0, a), min(self.size, b)) for a, b in ranges]
        todo = self._claim(want)
        if todo:
            try:
                self.hub_fetch(todo)
            finally:
                with self.lock:
                    for r in todo:
                        self.pending.remove(r)
                    self.busy.notify_all()
        with self.lock:  # wait for ranges other threads claimed
            while any(missing(self.have, a, b) for a, b in want if b > a):
                if not self.pending:
                    raise RemoteError(f"{self.what}: a read of it failed; run again")
                self.busy.wait()

    def _claim(self, want: list[tuple[int, int]]) -> list[tuple[int, int]]:
        with self.lock:
            gaps = [g for a, b in want if b > a for g in missing(self.have, a, b)]
            pending = sorted(self.pending)
            gaps = [g for a, b in gaps for g in missing(pending, a, b)]
            todo = coalesce(gaps)
            self.pending.extend(todo)
            return todo

    def hub_fetch(self, todo: list[tuple[int, int]]) -> None:
        parallel(lambda r: self.fetch(*r), todo, self.hub.in_flight)

    def fetch(self, a: int, b: int) -> None:
        """Read [a, b) into the sparse copy, streamed (memory: one chunk)."""
        whole = a == 0 and b == self.size

        def sink(r) -> None:
            if r.status_code == 200 and not whole:
                if not self.hub.whole_files:
                    raise RemoteError(
                        f"{self.what}: the server ignores byte ranges (Range) and would send "
                        f"the whole file ({self.size} bytes) for {b - a}; download it instead "
                        f"({download_command(self.repo_id, self.commit, self.name)}) and "
                        "pass the local copy, or allow whole files (--whole-files)")
                self._store(r, 0, self.size, r.headers)
                return
            if r.status_code not in (200, 206):
                raise RemoteError(f"{self.what}: the server answered {r.status_code} to a read "
                                  f"of bytes {a}-{b - 1}")
            if r.status_code == 206:
                got = r.headers.get("content-range", "")
                if got != f"bytes {a}-{b - 1}/{self.size}":
                    raise RemoteError(f"{self.what}: asked for bytes {a}-{b - 1} of "
                                      f"{self.size}, the server sent {got or 'no Content-Range'}"
                                      "; the file differs from the Hub's file list: run again")
            self._store(r, a, b, r.headers)

        self.hub.request(self.url, self.what, None if whole else (a, b), sink)

    def _store(self, r, a: int, b: int, headers) -> None:
        tag = _etag(headers)
        with self.lock:
            if self.etag is None:
                self.etag = tag
            elif tag is not None and tag != self.etag:
                raise RemoteError(f"{self.what}: the file changed while it was read (ETag "
                                  f"{self.etag}, then {tag}); run again")
        at = a
        fd = os.open(self.path, os.O_WRONLY)
        try:
            for chunk in r.iter_bytes(STREAM_CHUNK):
                if at + len(chunk) > b:
                    raise RemoteError(f"{self.what}: the server sent more than the "
                                      f"{b - a} bytes asked for; run again")
                os.pwrite(fd, chunk, at)
                at += len(chunk)
                self.hub.stats.add(nbytes=len(chunk))
        finally:
            os.close(fd)
        if at != b:
            raise RemoteError(f"{self.what}: the answer ended after {at - a} of {b - a} bytes; "
                              "run again")
        with self.lock:
            self.have = _add(self.have, a, b)


# ---- files mirrored here -------------------------------------------------------------------

_FILLERS: dict[str, Filler] = {}
_FILLERS_LOCK = threading.Lock()


def filler_for(path: str | os.PathLike[str]) -> Filler | None:
    """The Filler of a mirrored safetensors file (None for any other file: read as it is)."""
    if not _FILLERS:
        return None
    return _FILLERS.get(os.path.realpath(path))


def register(path: str | os.PathLike[str], filler: Filler) -> None:
    """Make reads of the file at `path` go through `filler` (SafetensorsFile asks filler_for)."""
    with _FILLERS_LOCK:
        _FILLERS[os.path.realpath(path)] = filler


def unregister(path: str | os.PathLike[str]) -> None:
    with _FILLERS_LOCK:
        _FILLERS.pop(os.path.realpath(path), None)


def fetch_all(items: list[tuple[Filler, list[tuple[int, int]]]]) -> None:
    """Fetch byte ranges of several files in parallel ([(filler, [(start, stop)])])."""
    items = [(f, r) for f, r in items if r]
    if items:
        parallel(lambda t: t[0].ensure(t[1]), items, items[0][0].hub.in_flight)


def parallel(fn: Callable[[Any], Any], items: list, workers: int) -> None:
    """fn over items, `workers` at a time; on the first error the items not started are
    dropped, and it is raised once those running have ended (each request has a timeout)."""
    if len(items) <= 1:
        for it in items:
            fn(it)
        return
    pool = ThreadPoolExecutor(max_workers=min(workers, len(items)))
    wait = True
    try:
        futures = [pool.submit(fn, it) for it in items]
        for f in as_completed(futures):
            f.result()
    except BaseException as e:
        # Ctrl-C, a signal: return now; the requests running end at their timeout, and their
        # bytes land nowhere (the mirror is removed as the interrupt unwinds)
        wait = isinstance(e, Exception)
        raise
    finally:
        pool.shutdown(wait=wait, cancel_futures=True)
