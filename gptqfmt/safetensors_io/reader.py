"""Open one safetensors file: header only on open, zero-copy mmap views of one tensor at a time."""
from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Iterator
from operator import attrgetter

import numpy as np

from ..errors import FindingError
from ..findings import Finding
from .dtypes import DTYPES
from .foreign import SNIFF_BYTES, Other
from .header import Header, TensorInfo, header_length, other_format, parse_header
from .remote import filler_for

_BEGIN = attrgetter("begin")   # a tensor's place in the file's data

# A cold page cache: tens of thousands of small reads that each wait on the disk in turn took
# 12 s for a mixture of experts' 73,000 probes; told of them ahead (POSIX_FADV_WILLNEED), the
# kernel reads them in parallel (1.6 s). Whether a file is cold is asked of the page cache with
# a read that does not wait (RWF_NOWAIT), at a file's first two ranges and every CHECK_EVERY-th
# after: a warm file costs a few of those. Once one range is not there, the kernel is told of
# the ranges up to HINT_BYTES ahead of the one being read. A call of fewer than MANY ranges
# (a module's own probes, as verify reads them) is read as it is: a hint would gain it little,
# and the question would double its system calls.
HINT_BYTES = 32 << 20
CHECK_EVERY = 64
MANY = 16
PAGE = 4096
# None where the system has no such read or hint (then nothing is asked, nothing told)
_NOWAIT = getattr(os, "RWF_NOWAIT", None) if hasattr(os, "preadv") else None
_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None) if hasattr(os, "posix_fadvise") else None


def cached(fd: int, at: int, k: int) -> bool:
    """Whether the first page of bytes [at, at + k) of open file `fd` is in the page cache: a
    read that does not wait (RWF_NOWAIT) gets all of it. True where the system cannot tell
    (no such flag, or a file system that refuses it): nothing is then told ahead."""
    n = min(k, PAGE)
    if not n or _NOWAIT is None:
        return True
    try:
        return os.preadv(fd, [bytearray(n)], at, _NOWAIT) == n
    except BlockingIOError:
        return False
    except OSError:   # EOPNOTSUPP and the like; a real read error is the read's to report
        return True


class ReadAhead:
    """Tells the kernel of the byte ranges `spans` ([(offset, length)], in the order they are
    read) of open file `fd` ahead of their reads, once the page cache shows one missing."""

    def __init__(self, fd: int, spans: list[tuple[int, int]]):
        self.fd, self.spans = fd, spans
        self.on = _WILLNEED is not None and len(spans) >= MANY
        self.willneed: int = _WILLNEED or 0
        self.cold = False
        self.told = 0      # spans[:told] are told
        self.next = 0      # the span at which to tell more

    def before(self, j: int) -> None:
        """Called before span j is read."""
        if not self.on:
            return
        if not self.cold:
            if j % CHECK_EVERY > 1 or cached(self.fd, *self.spans[j]):
                return
            self.cold = True
            self.told = self.next = j
        if j < self.next:
            return
        # the spans up to HINT_BYTES past span j, each told once; more at half way there
        total, i = 0, j
        while i < len(self.spans) and total < HINT_BYTES:
            at, k = self.spans[i]
            if i >= self.told and k:
                os.posix_fadvise(self.fd, at, k, self.willneed)
            total += k
            i += 1
        self.told = max(self.told, i)
        self.next = j + max(1, (i - j) // 2)

#: byte ranges within one tensor ([(start, stop)]) that a caller of view() will read
Part = list[tuple[int, int]]


def sniff(path: str | os.PathLike) -> Other | None:
    """The other format that the file at `path` is in, from its first bytes (None when it may
    be safetensors, or cannot be read)."""
    try:
        with open(path, "rb") as f:
            return other_format(f.read(SNIFF_BYTES))
    except OSError:
        return None


class SafetensorsFile:
    """A validated safetensors file. `view(name)` maps the file lazily; nothing is read eagerly.

    Views are read-only numpy arrays backed by the page cache; they stay valid after close().
    A file mirrored from the Hub (remote.Mirror) is a sparse copy: what is read is fetched
    first, through its Filler.
    """

    def __init__(self, path: str | os.PathLike, display_name: str | None = None):
        self.path = os.fspath(path)
        self.name = display_name or self.path
        self._mm: mmap.mmap | None = None
        # whether a view may have mapped pages since the last whole-file release: a module
        # that read nothing of the file costs its release no madvise (that walks the mapping),
        # and TensorStore.release not even the call
        self.viewed = False
        # a set this file is in while `viewed` (its store's: TensorStore.mapped), so that a
        # store whose files are all unviewed answers a release without looking at any
        self.watch: set[SafetensorsFile] | None = None
        self._lock = threading.Lock()  # modules are read in threads: map once
        self.filler = filler_for(self.path)
        try:
            with open(self.path, "rb") as f:
                self.size = os.fstat(f.fileno()).st_size
                self._fill([(0, SNIFF_BYTES)])
                n = header_length(f.read(SNIFF_BYTES), self.size, self.name, self.path)
                self._fill([(8, 8 + n)])
                f.seek(8)
                raw = f.read(n)
        except OSError as e:
            raise FindingError(Finding("GQ118", f"cannot read: {e.strerror or e}",
                                       file=self.name)) from None
        self.header: Header = parse_header(raw, self.size, self.name)

    @property
    def tensors(self) -> dict[str, TensorInfo]:
        return self.header.tensors

    @property
    def metadata(self) -> dict[str, str] | None:
        return self.header.metadata

    @property
    def remote(self) -> bool:
        """Whether the file is a sparse copy of a remote one (read only what is asked)."""
        return self.filler is not None

    def _fill(self, ranges: Part) -> None:
        if self.filler is not None:
            self.filler.ensure(ranges)

    def ranges(self, name: str, part: Part | None = None) -> Part:
        """The file's byte ranges that view(name, part) reads."""
        info = self.header.tensors[name]
        at = self._offset(info)
        return ([(at + a, at + min(b, info.nbytes)) for a, b in part] if part is not None
                else [(at, at + info.nbytes)])

    def fill(self, name: str, part: Part | None = None) -> None:
        """Fetch what view(name, part) reads (nothing for a local file)."""
        if self.filler is not None:
            self.filler.ensure(self.ranges(name, part))

    def view(self, name: str, part: Part | None = None) -> np.ndarray:
        """The tensor as a read-only array (raw uint container for BF16/F8/F4/F6). `part`:
        the byte ranges of it the caller reads, the only ones a remote file fetches (the rest
        of the array is then zeros, never to be read)."""
        info = self.header.tensors[name]
        self.fill(name, part)
        d = DTYPES[info.dtype]
        if info.nbytes == 0:
            return np.empty(info.shape, dtype=d.numpy)
        self._viewing()
        if d.bits < 8:  # sub-byte floats: raw bytes, no element shape
            return np.frombuffer(self._map(), np.uint8, info.nbytes, self._offset(info))
        arr = np.frombuffer(self._map(), d.numpy, info.numel, self._offset(info))
        return arr.reshape(info.shape)

    def heads(self, names: list[str], n: int | None = None) -> Iterator[tuple[str, bytes]]:
        """(name, its first `n` bytes: all of it by default or where it is smaller) of each of
        tensors `names`, in the order they lie in the file (a disk reads ahead of reads that
        move forward), read with one pread each through a descriptor opened for the call:
        nothing is mapped, so nothing is left to release, and tens of thousands of small
        reads cost no page faults. From a cold page cache they are told ahead (ReadAhead)."""
        tensors = self.header.tensors
        infos = sorted([tensors[t] for t in names], key=_BEGIN)
        start = self.header.data_start
        spans = [(start + i.begin, i.end - i.begin if n is None else min(n, i.end - i.begin))
                 for i in infos]
        if self.filler is not None:
            self._fill([(at, at + k) for at, k in spans])
        pread = os.pread
        try:
            with open(self.path, "rb", buffering=0) as f:
                fd = f.fileno()
                ahead = ReadAhead(fd, spans)
                for j, info in enumerate(infos):
                    ahead.before(j)
                    at, k = spans[j]
                    head = pread(fd, k, at) if k else b""
                    if len(head) != k:
                        raise FindingError(Finding(
                            "GQ118", f"changed while being read: {self.size} bytes when its "
                            f"header was read, {os.fstat(fd).st_size} now", file=self.name,
                            tensor=info.name))
                    yield info.name, head
        except OSError as e:
            raise FindingError(Finding("GQ118", f"cannot read: {e.strerror or e}",
                                       file=self.name)) from None

    def _offset(self, info: TensorInfo) -> int:
        return self.header.data_start + info.begin

    def _map(self):
        with self._lock:
            if self._mm is None:
                try:
                    with open(self.path, "rb") as f:
                        if os.fstat(f.fileno()).st_size != self.size:
                            raise FindingError(Finding(
                                "GQ118", f"changed while being read: {self.size} bytes when "
                                f"its header was read, {os.fstat(f.fileno()).st_size} now",
                                file=self.name))
                        self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                except OSError as e:
                    raise FindingError(Finding("GQ118", f"cannot map: {e.strerror or e}",
                                               file=self.name)) from None
            return self._mm

    def raw(self) -> np.ndarray:
        """The whole file, header included, as a read-only uint8 array (mapped, not read)."""
        self._fill([(0, self.size)])
        self._viewing()
        return np.frombuffer(self._map(), np.uint8)

    def _viewing(self) -> None:
        if not self.viewed:
            self.viewed = True
            if self.watch is not None:
                self.watch.add(self)

    def release(self, start: int = 0, stop: int | None = None) -> None:
        """Drop this process's mapped pages of bytes [start, stop), the whole file by default
        (they stay in the page cache): keeps resident memory bounded when many tensors are read
        one after another. Views stay valid. The whole file's pages are dropped only where a
        view was made since the last such release: pages a view made before it maps again
        after it stay until the file's next view and release."""
        if self._mm is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        if stop is None and start == 0:
            if self.viewed:
                self.viewed = False
                if self.watch is not None:
                    self.watch.discard(self)
                self._mm.madvise(mmap.MADV_DONTNEED)
            return
        lo = start - start % mmap.PAGESIZE
        stop = self.size if stop is None else stop
        if stop > lo:
            self._mm.madvise(mmap.MADV_DONTNEED, lo, stop - lo)

    def close(self) -> None:
        # Views keep the mapping alive through their base; dropping our reference is enough.
        self._mm = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
