"""Exceptions: the tool could not do what was asked. Each class carries its exit code.

Problems *in an artifact* are findings (see findings.py), collected into reports. An exception that
wraps a finding (FindingError) is raised where reading cannot go on, e.g. a corrupt header.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .findings import Finding


class GptqfmtError(Exception):
    """Base class. Unexpected failures map to exit 3 (internal error)."""

    exit_code = 3


class UsageError(GptqfmtError):
    """Bad arguments, a missing path, an output that exists: exit 2."""

    exit_code = 2


class OutputError(GptqfmtError):
    """The output cannot be written (disk full, read-only, ...): exit 2; nothing was committed."""

    exit_code = 2


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
