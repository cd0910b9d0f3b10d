"""`gptqfmt scan`: inspect --remote over many Hub repos, in parallel with a bound, one line each.

Each repo is read as `inspect ORG/NAME[@REVISION] --remote` reads it, by `jobs` threads at
once, every request of every repo under one bound (`in_flight`). A repo that cannot be read
(access, a missing repo or revision, the network) is a GQ132 finding of that repo, never the
end of the scan. What is kept of a repo is its line, its counts, its findings and what was read:
memory grows with the repos' findings, not with their size.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from ..errors import FindingError, GptqfmtError
from ..findings import ERROR, Finding
from ..safetensors_io.remote import IN_FLIGHT, Hub
from .remote import inspect_remote
from .reports import summary_counts, tool_json

OK, FAIL, UNREADABLE = "ok", "fail", "unreadable"
JOBS = 4   # repos read at once, by default: each keeps up to in_flight requests busy


@dataclass
class RepoResult:
    """One repo of a scan: its status, the verdict line inspect's text report starts with
    (reason only), its findings (files relative to the repo, as inspect's), and what was
    read."""
    repo: str
    status: str
    reason: str
    findings: list[Finding]
    modules: int | None = None
    remote: dict[str, Any] | None = None
    fetched: tuple[int, int] = (0, 0)   # (bytes, requests), also of a repo not read through

    def to_json(self) -> dict[str, Any]:
        return {"repo": self.repo, "status": self.status, "reason": self.reason,
                "commit": self.remote["commit"] if self.remote else None,
                "summary": summary_counts(self.findings, self.modules),
                "findings": [f.to_json() for f in self.findings],
                "remote": self.remote}


@dataclass
class ScanResult:
    repos: list[RepoResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.status == OK for r in self.repos)

    def count(self, status: str) -> int:
        return sum(r.status == status for r in self.repos)

    @property
    def findings(self) -> list[Finding]:
        return [f for r in self.repos for f in r.findings]

    def totals(self) -> dict[str, Any]:
        return {"repos": len(self.repos), "ok": self.count(OK), "fail": self.count(FAIL),
                "unreadable": self.count(UNREADABLE),
                "bytes_read": sum(r.fetched[0] for r in self.repos),
                "checkpoint_bytes": sum(r.remote["checkpoint_bytes"] for r in self.repos
                                        if r.remote),
                "requests": sum(r.fetched[1] for r in self.repos)}

    def to_json(self) -> dict[str, Any]:
        return {"tool": tool_json(), "status": "ok" if self.ok else "fail",
                "repos": [r.to_json() for r in self.repos],
                "totals": self.totals(),
                "summary": summary_counts(self.findings, None)}


def read_repo_list(lines: Iterable[str]) -> list[str]:
    """Repo ids from a file's lines: one per line; blank lines and # comments skipped."""
    out = []
    for line in lines:
        text = line.split("#", 1)[0].strip()
        if text:
            out.append(text)
    return out


def scan(repos: list[str], jobs: int = JOBS, in_flight: int = IN_FLIGHT,
         whole_files: bool = False, reason: Callable[[Any], str] | None = None,
         on_repo: Callable[[RepoResult], Any] | None = None) -> ScanResult:
    """Inspect each repo over HTTP (ops.remote.inspect_remote), `jobs` at a time, with at most
    `in_flight` requests in flight in all. `reason(result)`: the verdict's reason of an
    InspectResult (the text report's, by default its first error or "every check passes").
    `on_repo` hears of each repo as it ends (a progress bar)."""
    gate = threading.BoundedSemaphore(in_flight)
    why = reason or _reason

    def one(repo: str) -> RepoResult:
        hub = None
        try:
            hub = Hub(in_flight=in_flight, gate=gate, whole_files=whole_files)
            result = inspect_remote(repo, hub)
        except FindingError as e:   # read, and not a checkpoint gptqfmt can read through
            r = RepoResult(repo, FAIL, e.findings[0].one_line(), e.findings)
        except GptqfmtError as e:   # not read: access, a missing repo, the network
            r = RepoResult(repo, UNREADABLE, str(e), [Finding("GQ132", str(e))])
        else:
            r = RepoResult(repo, OK if result.ok else FAIL, why(result), result.findings,
                           len(result.source.modules), result.remote)
        if hub is not None:
            r.fetched = (hub.stats.bytes, hub.stats.requests)
        if on_repo is not None:
            on_repo(r)
        return r

    unique = list(dict.fromkeys(repos))
    if len(unique) <= 1:
        return ScanResult([one(r) for r in unique])
    pool = ThreadPoolExecutor(max_workers=max(1, min(jobs, len(unique))))
    try:
        return ScanResult(list(pool.map(one, unique)))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _reason(result: Any) -> str:
    errors = [f for f in result.findings if f.severity == ERROR]
    return errors[0].one_line() if errors else "every check passes"
