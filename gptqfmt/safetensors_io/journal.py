"""An undo journal for changing files of a checkpoint in place (convert --in-place): byte
ranges overwritten inside files, and whole small files replaced (configs). A SIGKILL at any
moment leaves the directory either as it was or as it was meant to become, never a mix: the
next gptqfmt command that opens it (safetensors_io.open_store) finishes or undoes the change
and says so (GQ420).

The protocol, in the checkpoint directory:

1. `.gptqfmt-journal.tmp` gets the old bytes of every range (where they do not follow from the new
   ones, below) and the old content of every file, then a trailer that says where each is; each
   replaced file's new content is written beside it (`.NAME.gptqfmt-journal-new`) and fsynced, so
   that the space the change needs is taken before anything is changed; the journal is fsynced,
   renamed to `.gptqfmt-journal`, the directory fsynced. From here on the change can be undone. (A
   .tmp or a -new copy left over: nothing was changed yet; they are removed.)
2. The ranges are overwritten and the files fsynced; each new copy is renamed over its file;
   the directory fsynced.
3. `.gptqfmt-journal` is renamed to `.gptqfmt-journal-complete` (directory fsynced): the new
   state is durable. Then that file is removed.

Recovery: `-complete` present: the change is whole; remove it (rolled forward). `.gptqfmt-
journal` present: write back every range and file that no longer holds its old bytes, fsync,
remove it (rolled back; the changes counted are the ones written back, so a change stopped
before its first write is reported as such). Both steps are idempotent, so a kill during
recovery is recovered from the same way, and an I/O error during it (a full disk, a read-only
mount) leaves the journal for the next command once the cause is fixed.

A kill can land inside the write of one range (the kernel copies a write page by page and
stops between pages for a fatal signal), in the convert or in a recovery: that range then
holds new pages and old ones. So each range also records the CRC-32 of every page of its new
bytes (pages at file offsets that are multiples of the page size, the granularity of the page
cache): a range is whole when every page holds its old bytes or its new page. Anything else
was written by something else, and the rollback refuses (GQ421) rather than guess.

A range whose new bytes are its old ones plus one constant d (mod 256) in every byte keeps no
old bytes here: the old ones are the new ones minus d, page by page, whatever mix of pages a kill
left. Moving every zero point of a clean checkpoint by one is such a change at 2, 4 and 8 bits
(no field carries into the next byte: at 4 bits 0x37 -> 0x48 is +0x11), so converting in place
writes the qzeros once, not twice. Every other range (3 bits, whose fields straddle bytes; a
lossy field) keeps its old bytes.

File layout: per entry its old bytes (none for a range with a delta), and for a range the
CRC-32 of each page of its new bytes (uint32, little-endian), one entry after another; then
the trailer (UTF-8 JSON: what was done, the page size, and per entry its file, offset and
length in the target, its place in the journal, where its page digests start, its delta if
any, and the CRC-32 of its old and new bytes), then the trailer's length (8 bytes,
little-endian) and the magic `GQJRNL03` (`GQJRNL02`, written before deltas, is read too).

Why CRC-32 and not a cryptographic hash: the digests tell which state a range is in (old, new,
or something else) after a crash, and that the bytes written are the ones proven. That is
error detection, what CRC-32 is made for (every burst of up to 32 bits, and any other change
missed with odds of 2^-32 per entry). A cryptographic hash would add nothing against an
adversary, who could rewrite the journal beside the files, and it costs: on a CPU without SHA
instructions sha256 runs at 0.18 GB/s, against CRC-32's 2 GB/s in zlib and 20 GB/s by
carry-less multiplication (compiled.crc32, on bytes in cache), and a 70B checkpoint's qzeros
are 267 MB, digested old and new."""
from __future__ import annotations

import contextlib
import fcntl
import json
import mmap
import os
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import faults
from ..bits import native
from ..errors import FindingError, naming
from ..findings import Finding
from . import compiled

#: roots this process is changing in place right now: its own reads of them (the label check
#: before the journal is marked complete) must not recover the journal from under it
ACTIVE: set[Path] = set()

JOURNAL = ".gptqfmt-journal"
COMPLETE = ".gptqfmt-journal-complete"
PENDING = ".gptqfmt-journal.tmp"
MAGIC = b"GQJRNL03"
READS = (b"GQJRNL02", MAGIC)   # journals this version rolls back: 02 is 03 without deltas
NEW_TAG = ".gptqfmt-journal-new"   # a replaced file's new content, beside it until renamed
NAMES = (JOURNAL, COMPLETE, PENDING)
PAGE = mmap.PAGESIZE   # the page cache's unit: a write cut short by a kill stops between pages


#: the journal starts each this many bytes on their way to the disk as it is written
WRITEBACK_EVERY = 32 << 20


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Start writing `fd`'s dirty pages in [offset, offset + length) to the disk, without
    waiting for them. Linux otherwise leaves them in the page cache until the dirty share of
    memory reaches its background threshold (gigabytes on a large machine), so the fsync that
    makes a change durable would wait for every byte at once; started as each part is written,
    the disk works while the CPU computes the next part, and the fsync waits for what is left.
    POSIX_FADV_DONTNEED starts that writeback (WB_SYNC_NONE) and drops only pages that are
    clean and unmapped: just-written pages stay until their writeback has ended, and one dropped
    after it is read again from the disk, the same bytes. A hint: where the call is missing (not
    Linux) or refused, the fsync does it all, as before."""
    if hasattr(os, "posix_fadvise"):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory: the names in it, after a rename) by its path.
    The one such helper: conversion.atomic uses it too."""
    fd = os.open(path, os.O_RDONLY)
    try:
        with naming(path):
            os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Entry:
    """One change: a byte range of `file` (offset, length), or the whole file (offset None;
    `old` None when the file did not exist before)."""
    file: str
    offset: int | None
    length: int
    old_crc32: int | None
    new_crc32: int
    at: int = 0          # where the old bytes start in the journal
    pages_at: int | None = None  # where the new bytes' page digests start (ranges)
    delta: int | None = None     # a range's new bytes minus its old, the same d in every byte:
    #                              its old bytes are not in the journal (byte_delta)

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class Writer:
    """Builds `.gptqfmt-journal.tmp` one entry at a time (old bytes streamed, never all held),
    with the new copies of the files it replaces beside them (`stage`); then `seal()` makes it
    the journal. Until then nothing is changed, and `abandon()` removes what it wrote."""
    root: Path
    what: str
    entries: list[Entry] = field(default_factory=list)

    def __post_init__(self):
        path = self.root / PENDING
        # O_EXCL: opening a checkpoint removed any leftover, so one here is another gptqfmt's
        # journal under way, which truncating would destroy
        try:
            with naming(path):
                faults.point("inplace-journal", 0)
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL
                             | getattr(os, "O_NOFOLLOW", 0), 0o644)
        except FileExistsError:
            raise _busy(PENDING, "appeared while this one was planning") from None
        self._f = os.fdopen(fd, "wb")
        # held until the change is complete or undone (the lock stays with the file through
        # its renames; a killed process drops it): another gptqfmt that opens the directory
        # meanwhile is told the change is under way instead of undoing it
        try:
            fcntl.flock(self._f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # another gptqfmt's recovery got to the new file first
            self._f.close()
            path.unlink(missing_ok=True)
            raise _busy(PENDING, "is locked") from None
        self._pos = self._flushed = 0  # bytes written; bytes whose writeback is started
        self.staged: dict[str, Path] = {}   # file -> its new copy beside it
        ACTIVE.add(self.root.resolve())

    def range(self, file: str, offset: int, old: bytes | memoryview,
              new: bytes | memoryview) -> Entry:
        """Record that `file`'s bytes at `offset` go from `old` to `new` (any bytes-like
        object: a memoryview of the tensor saves a copy); returns the entry."""
        assert len(old) == len(new), "a range keeps its length"
        new_crc, digests = page_digests(new, offset)
        e = Entry(file, offset, len(old), crc32(old), new_crc, delta=byte_delta(old, new))
        self._add(e, old if e.delta is None else b"", digests)
        return e

    def whole(self, file: str, old: bytes | None, new: bytes) -> None:
        self._add(Entry(file, None, len(old or b""), None if old is None else crc32(old),
                        crc32(new)), old or b"")

    def _add(self, e: Entry, old: bytes | memoryview, digests: bytes = b"") -> None:
        e.at = self._pos
        with naming(self.root / PENDING):
            self._f.write(old)
            self._pos += len(old)
            if digests:
                e.pages_at = self._pos
                self._f.write(digests)
                self._pos += len(digests)
            if self._pos - self._flushed >= WRITEBACK_EVERY:
                self._f.flush()
                start_writeback(self._f.fileno(), self._flushed, self._pos - self._flushed)
                self._flushed = self._pos
            self.entries.append(e)
            faults.point("inplace-journal", len(self.entries))

    def stage(self, file: str, new: bytes) -> None:
        """Write `file`'s new content beside it now, so that a full disk stops the change
        before anything is changed; `commit_file` renames it over `file` later."""
        target = self.root / file
        tmp = beside(target)
        self.staged[file] = tmp
        write_beside(target, tmp, new, ("inplace-config-new", len(self.staged) - 1))

    def seal(self) -> None:
        trailer = json.dumps({"what": self.what, "page": PAGE,
                              "entries": [e.to_json() for e in self.entries]}).encode()
        with naming(self.root / PENDING):
            self._f.write(trailer + struct.pack("<Q", len(trailer)) + MAGIC)
            self._f.flush()
            os.fsync(self._f.fileno())
            os.replace(self.root / PENDING, self.root / JOURNAL)
        fsync_path(self.root)

    def commit_file(self, file: str) -> None:
        """Rename `file`'s staged new copy over it (after `seal`)."""
        rename_over(self.staged.pop(file), self.root / file)

    def abandon(self) -> None:
        """Nothing was changed: the pending journal and the staged copies go. Best effort: a
        second error here would hide the one that stopped the change, and the next gptqfmt
        that opens the directory removes what is left (recover)."""
        with contextlib.suppress(OSError):
            self._f.close()
        for p in [*self.staged.values(), self.root / PENDING]:
            with contextlib.suppress(OSError):
                p.unlink(missing_ok=True)
        self.close()

    def close(self) -> None:
        """The change is complete or undone: drop the lock."""
        try:
            self._f.close()
        finally:
            ACTIVE.discard(self.root.resolve())


def complete(root: Path) -> None:
    """Step 3: the new state is durable; the journal goes. Once COMPLETE exists (`finished`)
    the change is whole, whatever fails after it."""
    with naming(root / JOURNAL):
        os.replace(root / JOURNAL, root / COMPLETE)
    fsync_path(root)
    with naming(root / COMPLETE):
        faults.point("inplace-complete")
        (root / COMPLETE).unlink()
    fsync_path(root)


def finished(root: Path) -> bool:
    """Whether the change in `root` was marked complete (step 3 begun): never to be undone."""
    return (root / COMPLETE).exists()


def read(path: Path) -> tuple[dict, int]:
    """The journal's trailer and the size of its body; FindingError GQ421 when it is not
    whole (it cannot be: it is renamed into place only after fsync)."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 16:
            raise _unusable(path, "shorter than its trailer")
        f.seek(size - 16)
        n, magic = struct.unpack("<Q", f.read(8))[0], f.read(8)
        if magic not in READS or n > size - 16:
            raise _unusable(path, "no journal trailer at its end")
        f.seek(size - 16 - n)
        try:
            doc = json.loads(f.read(n))
        except ValueError:
            raise _unusable(path, "its trailer is not JSON") from None
    return doc, size - 16 - n


def rollback(root: Path) -> tuple[dict, int]:
    """Write back every range and file of `.gptqfmt-journal` that does not hold its old bytes
    (fsynced), then remove the journal and any staged new copies; returns its trailer and the
    number of changes written back (0: the change had not begun). Refuses (GQ421) when a
    target is not what the journal describes (a file shorter than a range, a range that holds
    neither the old nor the new bytes): then something else changed the files, and writing
    back could make it worse. An OSError leaves the journal, to be applied again."""
    path = root / JOURNAL
    with naming(path):
        doc, _ = read(path)
    entries = [Entry(**e) for e in doc["entries"]]
    remove_strays(root)
    page = doc.get("page", PAGE)
    with open(path, "rb") as j:
        undo = [(i, e) for i, e in enumerate(entries) if _changed(root, e, j, page, path)]
        for i, e in undo:
            target = root / e.file
            with naming(path):
                old = _stored(e, j) if e.offset is None else _old_bytes(_now(target, e), e, j,
                                                                        page)
            if old is None:   # changed since _changed read it: by something else
                raise _unusable(path, f"{e.file} at {e.offset}: changed during the rollback; "
                                "restore the checkpoint from a copy")
            with naming(target):
                if e.offset is not None:
                    with open(target, "r+b") as f:
                        f.seek(e.offset)
                        f.write(old)
                        f.flush()
                        os.fsync(f.fileno())
                elif e.old_crc32 is None:
                    target.unlink(missing_ok=True)
                else:
                    replace_file(target, old)
                faults.point("inplace-rollback", i)
    fsync_path(root)
    with naming(path):
        path.unlink()
    fsync_path(root)
    return doc, len(undo)


def undone(n: int) -> str:
    """What a rollback that wrote `n` changes back did, in the words every report uses."""
    return f"rolled back ({n} change{'s' if n != 1 else ''} undone)"


def _changed(root: Path, e: Entry, journal_file, page: int, path: Path) -> bool:
    """Whether change `e` has to be written back: its target does not hold the old bytes.
    FindingError GQ421 for a range that holds neither its old nor its new bytes."""
    target = root / e.file
    if e.offset is None:
        try:
            now = target.read_bytes()
        except FileNotFoundError:
            return e.old_crc32 is not None
        return e.old_crc32 is None or crc32(now) != e.old_crc32
    now = _now(target, e)
    if len(now) == e.length and crc32(now) == e.old_crc32:
        return False
    with naming(path):
        whole = len(now) == e.length and _old_bytes(now, e, journal_file, page) is not None
    if not whole:
        raise _unusable(path, f"{e.file} at {e.offset}: holds neither the old nor the new "
                        "bytes; restore the checkpoint from a copy")
    return True


def _stored(e: Entry, journal_file) -> bytes:
    """The old bytes the journal keeps for `e`."""
    journal_file.seek(e.at)
    return journal_file.read(e.length)


def _now(target: Path, e: Entry) -> bytes:
    """What range `e` of `target` holds now (shorter where the file is)."""
    assert e.offset is not None
    with open(target, "rb") as f, naming(target):
        f.seek(e.offset)
        return f.read(e.length)


def byte_delta(old: bytes | memoryview, new: bytes | memoryview) -> int | None:
    """The d in 1..255 with new[i] == (old[i] + d) % 256 for every byte i, or None where no
    one d does (or nothing changes). Worked example, 4 bits, gptq -> gptq_v2: zero points
    7, 3 stored 6, 2 are the byte 0x26; stored 7, 3 it is 0x37: d = 0x11, in every byte of
    every word while no field is 15 (which would carry)."""
    o, n = np.frombuffer(old, np.uint8), np.frombuffer(new, np.uint8)
    if not o.size:
        return None
    d = (int(n[0]) - int(o[0])) % 256
    if not d:
        return None
    same = native.differ_by(o, n, d)   # one compiled pass where it is built
    if same is None:
        same = bool(np.array_equal(o + np.uint8(d), n))
    return d if same else None


def _old_bytes(now: bytes, e: Entry, journal_file, page: int) -> bytes | None:
    """Range `e`'s old bytes, given what it holds `now`: page by page its old bytes or its new
    ones (all old, all new, or a mix left by a kill inside a write); None when it holds
    anything else."""
    assert e.offset is not None and e.pages_at is not None
    cut = pages(e.offset, e.length, page)
    journal_file.seek(e.pages_at)
    digests = struct.unpack(f"<{len(cut)}I", journal_file.read(4 * len(cut)))
    if e.delta is None:
        old = _stored(e, journal_file)
        whole = crc32(now) in (e.old_crc32, e.new_crc32) or all(
            now[a:b] == old[a:b] or crc32(now[a:b]) == d for (a, b), d in zip(cut, digests))
        return old if whole else None
    # no old bytes kept: a page is new where its digest says so, old where adding the delta
    # gives the new page's digest
    out = np.frombuffer(now, np.uint8).copy()
    for (a, b), digest in zip(cut, digests):
        if crc32(now[a:b]) == digest:
            out[a:b] -= np.uint8(e.delta)
        elif crc32((out[a:b] + np.uint8(e.delta)).tobytes()) != digest:
            return None
    return out.tobytes() if crc32(out) == e.old_crc32 else None


def pages(offset: int, length: int, size: int | None = None) -> list[tuple[int, int]]:
    """The pieces of a range [offset, offset + length) of a file cut at the file's page
    boundaries, as (start, end) within the range."""
    size = size or PAGE
    cuts = list(range(-offset % size, length, size))
    edges = sorted({0, *cuts, length})
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a]


def beside(target: Path) -> Path:
    """Where `target`'s new content waits until it is renamed over it."""
    return target.with_name(f".{target.name}{NEW_TAG}")


def replace_file(target: Path, content: bytes) -> None:
    """`target` now holds `content`: written beside it, fsynced, renamed over it (never
    through a symbolic link)."""
    tmp = beside(target)
    write_beside(target, tmp, content)
    rename_over(tmp, target)


def write_beside(target: Path, tmp: Path, content: bytes,
                 fault: tuple[str, int] | None = None) -> None:
    """Write `content` into the new file `tmp` beside `target` and fsync it, for a rename over
    `target` (rename_over): never through a link (a leftover `tmp` is removed, then it is
    created with O_EXCL | O_NOFOLLOW), with `target`'s permissions where it exists. Nothing is
    left when it fails, and the OSError names `target`, the file the user knows. `fault`: the
    fault hook's stage (faults.py) once `tmp` exists, empty."""
    with naming(target, replace=True):
        try:
            mode = target.stat().st_mode & 0o777
        except FileNotFoundError:
            mode = 0o644
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0),
                     mode)
        try:
            with os.fdopen(fd, "wb") as f:
                if fault:
                    faults.point(*fault)
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise


def rename_over(tmp: Path, target: Path) -> None:
    """Rename the written `tmp` over `target`; an OSError names `target`."""
    with naming(target, replace=True):
        os.replace(tmp, target)


def remove_strays(root: Path) -> None:
    """Remove the new copies (`.NAME.gptqfmt-journal-new`) a stopped change left beside their
    files: never renamed, so never part of the checkpoint."""
    for stray in root.glob(f".*{NEW_TAG}"):
        with naming(stray):
            stray.unlink(missing_ok=True)


def recover(root: Path) -> list[Finding]:
    """Finish or undo an in-place change that a killed gptqfmt left in `root` (see the module
    docstring); a GQ420 that says which, or nothing when there was none. An OSError on the
    way (a full disk, a read-only mount) is GQ421, with the journal kept."""
    root = Path(root)
    if not any((root / n).exists() for n in NAMES) or root.resolve() in ACTIVE:
        return []
    held = _lock(root)
    try:
        if (root / COMPLETE).exists():
            with naming(root / COMPLETE):
                doc, _ = read(root / COMPLETE)
            remove_strays(root)
            with naming(root / COMPLETE):
                (root / COMPLETE).unlink()
            fsync_path(root)
            return [Finding("GQ420", f"an in-place {doc['what']} had finished when it was "
                            "stopped; its journal was removed (rolled forward)",
                            file=COMPLETE)]
        if (root / JOURNAL).exists():
            doc, n = rollback(root)
            what = undone(n) if n else "nothing was left to undo, and its journal was removed"
            return [Finding("GQ420", f"an in-place {doc['what']} was stopped before it "
                            f"finished; {what}: the checkpoint is as it was before",
                            file=JOURNAL, hint="run the command again")]
        remove_strays(root)  # stopped before any change: nothing to undo
        with naming(root / PENDING):
            (root / PENDING).unlink(missing_ok=True)
        return []
    except OSError as e:
        where = e.filename or root / JOURNAL
        raise FindingError(Finding(
            "GQ421", f"journal of an interrupted in-place convert cannot be applied: {where}: "
            f"{e.strerror or e}", file=JOURNAL,
            hint=f"the journal stays, so nothing is lost; once {where} can be written (free "
                 f"space, a writable mount), gptqfmt verify {root} applies it")) from None
    finally:
        if held is not None:
            held.close()


def _lock(root: Path):
    """The journal file opened and locked, or None when none is left to lock; FindingError
    GQ421 when another process holds it (its in-place convert is under way)."""
    for name in NAMES:
        try:
            f = open(root / name, "rb")
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.close()
            raise _busy(name, "is locked") from None
        return f
    return None


def _busy(name: str, why: str) -> FindingError:
    return FindingError(Finding(
        "GQ421", f"another gptqfmt is converting this checkpoint in place right now ({name} "
        f"{why})", file=name, hint="wait for it to end, then run the command again"))


def _unusable(path: Path, why: str) -> FindingError:
    return FindingError(Finding("GQ421", f"journal of an interrupted in-place convert {why}",
                                file=path.name,
                                hint="restore the checkpoint from a copy, or remove the "
                                     "journal if you know the files are right"))


def crc32(b: bytes | memoryview) -> int:
    """The digest the journal records of old and new bytes (see the module docstring): the
    compiled one where it is built, zlib's otherwise (the same numbers)."""
    c = compiled.crc32(b)
    return zlib.crc32(b) if c is None else c


def page_digests(new: bytes | memoryview, offset: int, page: int | None = None
                 ) -> tuple[int, bytes]:
    """(CRC-32 of `new`, the bytes of a range at file offset `offset`; the CRC-32 of each of
    its pages as the journal stores them: uint32 little-endian, `pages`' pieces in order)."""
    page = page or PAGE
    both = compiled.crc32_pages(new, offset, page)
    if both is not None:
        return both
    cut = pages(offset, len(new), page)
    return crc32(new), struct.pack(f"<{len(cut)}I", *(crc32(new[a:b]) for a, b in cut))
