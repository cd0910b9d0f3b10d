"""write_banded (conversion/reformat.py): a tensor made a band at a time into a few reused
buffers reaches the file whole and in order, however far the writer falls behind."""
from __future__ import annotations

import io
from collections import deque
from concurrent.futures import Executor, Future

import numpy as np
import pytest

from gptqfmt.conversion.reformat import RING, write_banded
from gptqfmt.formats.relayout import Banded


class _Lazy(Future):
    def __init__(self, owner: LaggingWriter) -> None:
        super().__init__()
        self.owner = owner

    def result(self, timeout=None):
        self.owner.run_through(self)
        return super().result(timeout)


class LaggingWriter(Executor):
    """Runs a submitted call only once `lag` later ones wait behind it, or when its result is
    asked for: a writer as far behind as a test wants, with no threads and no timing."""

    def __init__(self, lag: int) -> None:
        self.lag = lag
        self.queue: deque[tuple[Future, object, tuple]] = deque()

    def submit(self, fn, /, *args, **kwargs):
        fut = _Lazy(self)
        self.queue.append((fut, fn, args))
        while len(self.queue) > self.lag:
            self._run_one()
        return fut

    def _run_one(self) -> None:
        fut, fn, args = self.queue.popleft()
        fut.set_result(fn(*args))

    def run_through(self, fut: Future) -> None:
        while not fut.done():
            self._run_one()


class Inline(Executor):
    def submit(self, fn, /, *args, **kwargs):
        fut: Future = Future()
        fut.set_result(fn(*args, **kwargs))
        return fut


def _counting(rows: int, width: int) -> tuple[Banded, np.ndarray, list]:
    want = np.arange(rows * width, dtype=np.int32).reshape(rows, width)
    calls: list[tuple[int, int]] = []

    def fill(out, r0, r1):
        calls.append((r0, r1))
        out[...] = want[r0:r1]
    return Banded((rows, width), fill, 2, 4), want, calls


@pytest.mark.parametrize("lag", [0, 1, RING - 1, RING, 50])
def test_every_band_reaches_the_file_whole_and_in_order(lag, monkeypatch):
    monkeypatch.setattr("gptqfmt.formats.relayout.BAND_BYTES", 4 * 7 * 8)  # 8 rows a band
    t, want, calls = _counting(94, 7)
    out = io.BytesIO()
    heard: list[int] = []
    write_banded(t, out, LaggingWriter(lag), Inline(), 2, heard.append)
    assert out.getvalue() == want.tobytes()
    assert sum(heard) == want.nbytes and len(heard) == len(t.bands(2)) > RING
    assert sorted(calls) == calls and calls[0][0] == 0 and calls[-1][1] == 94


def test_a_buffer_is_made_into_again_only_after_its_write_returned(monkeypatch):
    """With the writer never catching up on its own, each band waits for the write RING
    bands before it (a buffer filled over a write not yet made would show in the bytes)."""
    monkeypatch.setattr("gptqfmt.formats.relayout.BAND_BYTES", 4 * 7 * 8)
    t, want, _ = _counting(64, 7)
    writer = LaggingWriter(10**6)
    waiting: list[int] = []
    fill = t.fill

    def watched(out, r0, r1):
        waiting.append(len(writer.queue))
        fill(out, r0, r1)
    out = io.BytesIO()
    write_banded(Banded(t.shape, watched, t.step, t.grain), out, writer, Inline(), 1)
    assert out.getvalue() == want.tobytes()
    assert max(waiting) == RING - 1   # never a write of the buffer being filled still queued


def test_an_empty_tensor_writes_nothing():
    t = Banded((0, 4), lambda out, r0, r1: pytest.fail("nothing to fill"), 8, 8)
    out = io.BytesIO()
    write_banded(t, out, Inline(), Inline(), 2)
    assert out.getvalue() == b""
