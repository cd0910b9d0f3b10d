"""Exceptions: the tool could not do what was asked. Each class carries its exit code.

Problems *in an artifact* are findings (see findings.py), collected into reports. An exception that
wraps a finding (FindingError) is raised where reading cannot go on, e.g. a corrupt header.
"""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .findings import Finding


class GptqfmtError(Exception):
    """Base class. Unexpected failures map to exit 3 (internal error)."""

    exit_code = 3


class UsageError(GptqfmtError):
    """Bad arguments, a missing path, an output that exists: exit 2."""

    exit_code = 2


class RemoteError(GptqfmtError):
    """A Hugging Face repo read over HTTP (--remote) could not be read: the Hub or the network
    did not give what was asked. Exit 2, one line that names the repo, the file where there is
    one, and the next step."""

    exit_code = 2


class OutputError(GptqfmtError):
    """The output cannot be written (disk full, read-only, ...): exit 2. The message says what
    was left as it was, or undone, and what to do next."""

    exit_code = 2

    @classmethod
    def of(cls, e: OSError, doing: str, then: str, path: object = None, *,
           file: object = None) -> OutputError:
        """The one line of an OSError on a write path: `FILE: DOING: CAUSE; THEN`, the file
        being `file` (e's as the user knows it), else e's, else `path`; the cause as the
        system words it; `then` what was left and the next step."""
        return cls(f"{file or e.filename or path}: {doing}: {e.strerror or e}; {then}")


@contextmanager
def naming(path: object, replace: bool = False) -> Iterator[None]:
    """An OSError raised inside, with `path` as its file name where it has none (or always,
    with `replace`): write(2) and fsync(2) errors reach Python without one, and the line that
    reports them has to say which file. A new exception of the same class, since a name set on
    the old one would not cross a process boundary (--jobs pickles it)."""
    try:
        yield
    except OSError as e:
        if e.errno is None or e.filename is not None and not replace:
            raise
        raise type(e)(e.errno, e.strerror, str(path)) from e


class FindingError(GptqfmtError):
    """The input is invalid in a way that stops reading it: exit 1, carries the finding."""

    exit_code = 1

    def __init__(self, *findings: Finding) -> None:
        super().__init__(findings[0].one_line())
        self.findings = list(findings)
        self.finding = findings[0]

    def __reduce__(self) -> tuple[type, tuple[Finding, ...]]:  # crosses processes (--jobs)
        return (type(self), tuple(self.findings))


class NotRepresentable(GptqfmtError, ValueError):
    """Fields that the target convention cannot hold exactly (and allow_lossy was not given).

    A finding-class outcome, so exit 1 like any finding; still a ValueError for callers that
    caught it as one."""

    exit_code = 1

    def __init__(self, message: str, count: int):
        super().__init__(message)
        self.count = count

    def __reduce__(self) -> tuple[type, tuple[str, int]]:
        return (type(self), (str(self), self.count))
