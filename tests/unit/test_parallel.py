"""bounded_map: results in order, a bounded number of tasks in flight, calls not started
cancelled when the caller stops taking; with `batch`, the same answers from fewer tasks.
in_child: the answer of a call in a forked child, or the call's own answer here wherever the
child cannot give it; no child outlives its block."""
import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from gptqfmt.parallel import bounded_map, forks_safely, in_child


class CountingPool(ThreadPoolExecutor):
    """A pool that counts the tasks handed to it and the most ever submitted and unfinished."""

    def __init__(self):
        super().__init__(max_workers=2)
        self.tasks = self.active = self.most = 0
        self.lock = threading.Lock()

    def submit(self, fn, *args):
        with self.lock:
            self.tasks += 1
            self.active += 1
            self.most = max(self.most, self.active)

        def done(*a):
            try:
                return fn(*a)
            finally:
                with self.lock:
                    self.active -= 1
        return super().submit(done, *args)


@pytest.mark.parametrize("batch", [1, 3, 10, 200])
def test_results_in_order_from_tasks_of_batch_calls(batch):
    items = list(range(101))
    with CountingPool() as pool:
        got = list(bounded_map(pool, lambda a, b: a * 1000 + b, items, items[::-1],
                               ahead=4, batch=batch))
    assert got == [a * 1000 + b for a, b in zip(items, items[::-1])]
    assert pool.tasks == -(-len(items) // batch)
    assert pool.most <= 4


@pytest.mark.parametrize(("batch", "blocked"), [(1, 5), (4, 8)])
def test_calls_not_started_are_cancelled_when_the_caller_stops(batch, blocked):
    """The caller takes 5 results and stops while the next task is held running: of 1000
    calls, none past that task's ever runs (the tasks submitted ahead are cancelled)."""
    ran = []
    release = threading.Event()

    def call(i):
        if i == blocked:   # the first call of the task after those taken: held until closed
            release.wait(timeout=60)
        ran.append(i)
        return i

    with ThreadPoolExecutor(max_workers=1) as pool:
        results = bounded_map(pool, call, range(1000), ahead=3, batch=batch)
        taken = [next(results) for _ in range(5)]
        results.close()
        release.set()
    assert taken == [0, 1, 2, 3, 4]
    assert max(ran) < blocked + batch


linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forks only on Linux")
PARENT = os.getpid()


@linux_only
def test_in_child_answers_from_another_process():
    assert forks_safely()
    with in_child(lambda: (os.getpid(), list(range(5)))) as answer:
        pid, got = answer()
    assert pid != PARENT and got == [0, 1, 2, 3, 4]


def in_parent_only(then):
    """A call that answers `then()` here and fails in any child: the answer in_child gives is
    always this process's."""
    def call():
        return "here" if os.getpid() == PARENT else then()
    return call


def killed():
    os._exit(3)


def unpicklable():
    return lambda: 1


def raises():
    raise ValueError("only in the child")


@linux_only
@pytest.mark.parametrize("then", [killed, unpicklable, raises])
def test_a_child_that_fails_leaves_the_answer_to_this_process(then):
    with in_child(in_parent_only(then)) as answer:
        assert answer() == "here"


@linux_only
def test_an_error_is_the_callers_own():
    def call():
        raise KeyError("everywhere")
    with in_child(call) as answer, pytest.raises(KeyError, match="everywhere"):
        answer()


def test_no_fork_beside_another_thread():
    release = threading.Event()
    t = threading.Thread(target=release.wait)
    t.start()
    try:
        assert not forks_safely()
        with in_child(os.getpid) as answer:
            assert answer() == PARENT
    finally:
        release.set()
        t.join()


@linux_only
def test_a_child_not_asked_is_killed_as_the_block_ends():
    """The child tells its pid, then waits on a pipe no one writes: leaving the block (as an
    error or a signal would) kills and reaps it."""
    told_r, told_w = os.pipe()
    never_r, never_w = os.pipe()

    def call():
        os.write(told_w, str(os.getpid()).encode())
        os.read(never_r, 1)
        return "never"
    try:
        with pytest.raises(RuntimeError, match="left"):
            with in_child(call):
                pid = int(os.read(told_r, 32))
                raise RuntimeError("left")
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)   # reaped: no such process any more
    finally:
        for fd in (told_r, told_w, never_r, never_w):
            os.close(fd)
