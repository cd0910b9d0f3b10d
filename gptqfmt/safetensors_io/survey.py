"""A survey of many small tensors, read on a second thread while the caller models the
checkpoint: which of them hold the same bytes as another of their dtype and shape in their
file, and which begin with zero bytes.

A mixture of experts has tens of thousands of modules whose g_idx and (symmetric) qzeros are
byte for byte alike, and whose qweight and scales are probed for zero bytes: 146,000 small
reads, each a system call and a copy. Read where they are asked for, they take the main
thread half a second; here the compiled loops (kernels/safetensors_native.c, `survey`) read
them with the GIL released, on a core the main thread leaves idle: the first pass from the
moment the first file's header is parsed, while the main thread parses the others, and the
rest once every file is open. The caller then reads one tensor of each alike group instead
of all of them (TensorStore.heads_grouped), and takes the zero probes as found
(TensorStore.zero_heads).

What it says is exact (bytes compared, not hashed); what it could not read, or was not asked,
is left to the ordinary reads, which report what they find. Without the compiled loops
(GPTQFMT_NATIVE=0, no C compiler) nothing is surveyed and every tensor is read where it is
asked for: the answers are the same.

Worked example: three g_idx of 16 KiB in one shard, the first and third `arange(4096) // 128`
and the second permuted: the survey says the third holds the first's bytes (they form a
group whose representative is the first) and says nothing of the second; heads_grouped reads
the first once for the two, and the second alone.
"""
from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Sequence
from typing import TypeVar

from . import compiled
from .reader import CHECK_EVERY, HINT_BYTES, SafetensorsFile

Pass = tuple[tuple[str, ...], tuple[str, ...]]   # (suffixes compared whole, suffixes probed)
T = TypeVar("T")


class Survey:
    """Started on its own thread at construction, and fed the files as they are opened
    (add), then told the store is complete (fed). `passes`, each over every file in turn, in
    the order the caller will ask for them: (the name suffixes, after the last dot, of the
    tensors compared whole with the first of their dtype and shape in their file, up to
    `most` bytes, a group's first one held in memory while its file is read; those whose
    first `n` bytes are checked for zero). The first pass reads each file as it comes, while
    the caller parses the headers of the next ones; the others begin once every file is in.
    A query about a tensor waits for the pass that surveys it. Files mirrored from the Hub are
    not surveyed (their reads are fetched in batches of their own)."""

    def __init__(self, passes: Sequence[Pass], n: int, most: int):
        self.n, self._most = n, most
        self._passes = [(tuple(a), tuple(h)) for a, h in passes]
        self._pass_of = {s: i for i, (a, h) in enumerate(self._passes) for s in a + h}
        self.rep: dict[str, str] = {}     # tensor -> the first tensor of its group it equals
        self.zero: dict[str, bool] = {}   # tensor -> whether its first n bytes are all 0
        self._done = [threading.Event() for _ in self._passes]
        # the files given and not yet taken by the thread, and whether every file is given
        self._arrived: list[tuple[str, SafetensorsFile]] = []
        self._taken: list[tuple[str, SafetensorsFile]] = []   # by the thread, in order
        self._complete = False
        self._fed = threading.Condition()
        # a tensor stored in two files is read from the one `locations` names (the other
        # copy is a finding): where there is one, each file's answers are kept only for its
        # own (set by fed)
        self._locations: dict[str, str] | None = None
        # set to 1 by close(): the compiled loops stop reading at the next range (an
        # interrupted command does not wait for a cold page cache)
        self._stop = bytearray(1)
        self._thread = threading.Thread(target=self._run, name="gptqfmt-survey", daemon=True)
        self._thread.start()

    def add(self, name: str, f: SafetensorsFile) -> None:
        """File `name` of the store, opened (its header read): the first pass may read it."""
        with self._fed:
            self._arrived.append((name, f))
            self._fed.notify()

    def fed(self, locations: dict[str, str]) -> None:
        """Every file is added; `locations`: the store's tensor -> file."""
        with self._fed:
            added = self._taken + self._arrived
            if sum(len(f.tensors) for _, f in added) != len(locations):
                self._locations = locations
            self._complete = True
            self._fed.notify()

    def join(self) -> None:
        """Wait for every pass to be read and the thread to end (once fed: before, the thread
        waits for more files; close() ends it then)."""
        self._thread.join()

    def close(self) -> None:
        """Stop the reads that are left and wait for the thread (a store being closed leaves
        no reader behind); what was not read is left unsaid."""
        with self._fed:   # a thread waiting for files wakes to the stop
            self._stop[0] = 1
            self._fed.notify()
        self._thread.join()

    def _said(self, found: dict[str, T], tensors: Iterable[str]
              ) -> Iterator[tuple[str, T | None]]:
        """(tensor, what `found` says of it, None where nothing) for each of `tensors`,
        once the pass that surveys it, if any, is done."""
        for t in tensors:
            v = found.get(t)
            if v is None:
                p = self._pass_of.get(t.rpartition(".")[2])
                if p is not None:
                    self._done[p].wait()
                    v = found.get(t)
            yield t, v

    def groups(self, tensors: Iterable[str]) -> tuple[dict[str, list[str]], list[str]]:
        """({representative: [those of `tensors` that hold its bytes]}, the tensors the survey
        says nothing of)."""
        known: dict[str, list[str]] = {}
        rest: list[str] = []
        for t, r in self._said(self.rep, tensors):
            if r is None:
                rest.append(t)
            else:
                known.setdefault(r, []).append(t)
        return known, rest

    def zero_heads(self, tensors: Iterable[str], n: int) -> tuple[set[str], list[str]]:
        """(those of `tensors` whose first `n` bytes are zero, the tensors the survey says
        nothing of at `n`)."""
        if n != self.n:
            return set(), list(tensors)
        if all(done.is_set() for done in self._done):   # nothing to wait for: in two passes
            found = self.zero
            tensors = tensors if isinstance(tensors, list) else list(tensors)
            return {t for t in tensors if found.get(t)}, [t for t in tensors if t not in found]
        zero, rest = set(), []
        for t, z in self._said(self.zero, tensors):
            if z is None:
                rest.append(t)
            elif z:
                zero.add(t)
        return zero, rest

    def _run(self) -> None:
        try:
            # the first pass, a file batch at a time as the files are opened (a batch is what
            # came while the last one was read: the GIL is taken back once a batch)
            first: list[tuple[str, tuple[dict[str, str], dict[str, bool]]]] = []
            complete = False
            while not complete:
                with self._fed:
                    while not (self._arrived or self._complete or self._stop[0]):
                        self._fed.wait()
                    batch, self._arrived = self._arrived, []
                    self._taken += batch
                    complete = self._complete
                if self._stop[0]:
                    return
                batch = [(name, f) for name, f in batch if f.filler is None]
                if batch and self._passes:
                    first += zip([name for name, _ in batch], self._read(batch, 0))
            files = [(name, f) for name, f in self._taken if f.filler is None]
            for p, done in enumerate(self._done):
                if self._stop[0]:
                    break
                found = first if p == 0 else zip([name for name, _ in files],
                                                  self._read(files, p))
                where = self._locations
                for name, (rep, zero) in found:
                    if where is not None:   # answers only for the tensors each file holds
                        rep = {t: r for t, r in rep.items() if where.get(t) == name ==
                               where.get(r)}
                        zero = {t: z for t, z in zero.items() if where.get(t) == name}
                    self.rep.update(rep)
                    self.zero.update(zero)
                done.set()
        except Exception:   # noqa: BLE001 - anything unsaid is read where it is asked for
            pass
        finally:
            for done in self._done:
                done.set()

    def _read(self, files: list[tuple[str, SafetensorsFile]], p: int
              ) -> list[tuple[dict[str, str], dict[str, bool]]]:
        """Pass `p` over `files`, all in one call: this thread takes the GIL back once (each
        time it waits for the main thread to let go of it)."""
        alike, heads = self._passes[p]
        return compiled.survey(
            [(f.path, list(f.header.tensors.values()), f.header.data_start) for _, f in files],
            alike, heads, self.n, self._most, HINT_BYTES, CHECK_EVERY, False, self._stop)
