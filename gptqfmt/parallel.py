"""How many threads the work may use: the CPUs this process may run on, a map over a pool
that keeps only a few items in flight, and a call run in a forked child beside the caller. A
leaf module (the standard library only), so that any layer can ask, from the container reader
up."""
from __future__ import annotations

import gc
import multiprocessing
import os
import signal
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future
from contextlib import contextmanager
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


def forks_safely() -> bool:
    """Fork only on Linux and only from a process running one thread: a lock held by another
    thread at the fork would stay held in the child forever."""
    return sys.platform.startswith("linux") and threading.active_count() == 1


def child_signals() -> None:
    """The signals of a forked child: Ctrl-C reaches the whole process group, so the child
    leaves it to the parent, which unwinds and ends its children; a termination signal ends
    the child quietly (the parent's handlers, inherited by the fork, would raise in it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in ("SIGTERM", "SIGHUP"):
        if hasattr(signal, name):
            signal.signal(getattr(signal, name), signal.SIG_DFL)


@contextmanager
def in_child(fn: Callable[[], T]) -> Iterator[Callable[[], T]]:
    """`fn()` started in a forked child process while the caller goes on: yields the function
    that returns its answer (waiting for the child). For a pass of Python over tens of
    thousands of modules beside another one: the GIL runs one at a time, a fork runs both.

    The answer is always what fn() gives in this process: where it cannot fork safely
    (forks_safely), or the child fails in any way (fn raises, its answer cannot be sent, it
    is killed), fn() runs here when the answer is asked for, and raises what it raises. A
    child whose answer is not asked for (the caller left on an error or a signal) is killed
    as the block ends: none outlives it. The child leaves Ctrl-C to this process."""
    if not forks_safely():
        yield fn
        return
    ctx = multiprocessing.get_context("fork")
    recv, send = ctx.Pipe(duplex=False)
    for stream in (sys.stdout, sys.stderr):   # a child that flushes a copy prints it twice
        if stream is not None:
            stream.flush()
    proc = ctx.Process(target=_child, args=(fn, send), daemon=True)
    proc.start()
    send.close()
    asked = False

    def answer() -> T:
        nonlocal asked
        asked = True
        try:
            (got,) = recv.recv()
        except Exception:   # noqa: BLE001 - nothing (whole) sent: the answer is made here
            proc.join()
            return fn()
        proc.join()
        return got

    try:
        yield answer
    finally:
        if not asked:
            proc.kill()
            proc.join()
        recv.close()


def _child(fn: Callable[[], Any], send: Any) -> None:
    """in_child's child: fn()'s answer sent, or nothing where it raises or cannot be sent."""
    # no collection in a child that lives for one call: it would write to every object it
    # walks, and so copy the parent's pages one by one
    gc.disable()
    child_signals()
    try:
        send.send((fn(),))
    except BaseException:   # noqa: BLE001 - the parent makes the answer, or the error, itself
        pass
    finally:
        send.close()
