"""bounded_map: results in order, a bounded number of tasks in flight, calls not started
cancelled when the caller stops taking; with `batch`, the same answers from fewer tasks."""
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from gptqfmt.parallel import bounded_map


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
