"""How many threads the work may use: the CPUs this process may run on, and a map over a pool
that keeps only a few items in flight. A leaf module (the standard library only), so that any
layer can ask, from the container reader up."""
from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

T = TypeVar("T")


def cpus() -> int:
    """The CPUs this process may run on (its affinity where the platform tells it)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def bounded_map(pool: Executor, fn: Callable[..., T], *iterables: Iterable[Any],
                ahead: int | None = None, batch: int = 1) -> Iterator[T]:
    """`pool.map(fn, *iterables)`, results in order, with at most `ahead` calls submitted and
    not yet taken (default: 4 per CPU). Executor.map submits every call at once, and each
    future then lives until its result is taken: tens of thousands of modules would hold tens
    of thousands of futures and of finished results. Calls not started when the caller stops
    taking are cancelled. `batch`: calls run `batch` at a time in one task, where a call is
    small beside the cost of handing a task to a thread (tens of microseconds)."""
    if batch > 1:
        def run(chunk: list[tuple[Any, ...]]) -> list[T]:
            return [fn(*args) for args in chunk]
        for results in bounded_map(pool, run, _chunks(zip(*iterables), batch), ahead=ahead):
            yield from results
        return
    limit = ahead or 4 * cpus()
    pending: deque[Future[T]] = deque()
    try:
        for args in zip(*iterables):
            pending.append(pool.submit(fn, *args))
            if len(pending) >= limit:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()
    finally:
        for f in pending:
            f.cancel()


def _chunks(items: Iterable[Any], n: int) -> Iterator[list[Any]]:
    """`items` in lists of `n` (the last one shorter)."""
    chunk: list[Any] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == n:
            yield chunk
            chunk = []
    if chunk:
        yield chunk
