"""convert --in-place PATH: between gptq and gptq_v2 only the zero points change, and their
bytes keep their offsets (the header does not move), so the checkpoint itself is rewritten:
the qzeros byte ranges and the configs, megabytes of a model of many gigabytes, with no second
copy on disk.

    plan (plan.py, as convert) -> refuse shared files -> per module: new words computed and
    proven (gate.check_words: effective zeros per cell, Y = X @ W on lossy columns), the change
    put in the undo journal (the old bytes, unless they are the new ones less one byte delta) ->
    shards opened for writing, configs' new copies written beside them -> journal sealed
    (journal.py) -> each range's words computed again (their CRC-32 the proven words'), written
    and read back, fsynced -> configs' copies renamed over them, read back and hashed against
    the journal's record -> journal marked complete and removed

Every byte the change needs on disk (the journal, the configs' new copies) is written before
the first overwrite, so a full disk or a read-only mount stops it with nothing changed and
nothing left behind. A failure or a signal after the journal is sealed writes back what was
overwritten before the error is reported, and the error says how many changes that undid; a
SIGKILL leaves the journal, and the next gptqfmt command that opens the directory finishes or
undoes the change (GQ420). The source is refused, untouched, when a file to change is a link
into a Hugging Face cache's blobs/ (content-addressed, shared between revisions), another
symbolic link, or has other hard links."""
from __future__ import annotations

import errno
import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from .. import faults
from ..bits.conventions import CONVENTIONS, convert_words
from ..errors import FindingError, OutputError, UsageError, naming
from ..findings import Finding
from ..formats.configs import CONFIG_FILES
from ..formats.gptq.checkpoint import Checkpoint
from ..formats.open import open_labelled
from ..ops.reports import GATE, SYNC, WRITE, Progress, start
from ..safetensors_io import journal
from .configs import DERIVED_FILE, declaring_configs, dumps, provenance, relabelled, set_convention
from .gate import GateResult, check_labels, check_words
from .plan import plan_conversion
from .report import ConvertReport
from .write import check_unchanged, snapshot


def convert_in_place(path: str | os.PathLike[str], to: str, src_convention: str = "auto",
                     allow_lossy: bool = False, dry_run: bool = False,
                     progress: Progress | None = None,
                     on_module: Progress | None = None,
                     trust_from: bool = False) -> ConvertReport:
    """Convert the GPTQ checkpoint directory `path` into convention `to`, in place (see the
    module docstring); the ConvertReport, with `in_place` set. `trust_from`: as convert's.
    `progress` hears of the plan's phases (DETECT, CHECK, PLAN), then WRITE over the qzeros
    bytes rewritten and SYNC over the shards they are in, each as its fsync returns;
    `on_module` of GATE, the proof of each module's new words."""
    root = Path(path)
    if not root.is_dir():
        raise UsageError(f"{path}: " + ("a file; --in-place converts a checkpoint directory "
                                        f"(its configs too): pass {root.parent}"
                                        if root.is_file() else "no such directory"))
    if to not in CONVENTIONS:
        raise UsageError(f"--in-place converts between {' and '.join(CONVENTIONS)}, where only "
                         f"the zero points change; --to {to} re-lays out the tensors: convert "
                         f"{path} DST")
    # before planning, which reads every qzeros and scales: a shared file is refused at once
    refuse_shared(root, sorted(p.name for p in root.iterdir() if p.name.endswith(".safetensors"))
                  + [n for n in CONFIG_FILES if (root / n).exists()])
    source, ckpt = open_labelled(root)
    try:
        plan = plan_conversion(source, src_convention, to, allow_lossy, trust_from=trust_from,
                               progress=progress)
        report = ConvertReport.of(plan, str(path), str(path), dry_run, "cpu", in_place=True)
        if dry_run:
            return report
        flags = (f" --from {src_convention}" if src_convention != "auto" else "") + \
            (" --trust-from" if trust_from else "") + (" --allow-lossy" if allow_lossy else "")
        gate = _apply(ckpt, root, plan.from_, to, allow_lossy, report, plan.derived, progress,
                      on_module, Commands(f"gptqfmt convert --in-place {path} --to {to}{flags}",
                                          f"gptqfmt convert {path} DST --to {to}{flags}"),
                      reread=plan.trusted)
    finally:
        source.close()
    return replace(report, written=True, gate=gate)


def refuse_shared(root: Path, names: list[str]) -> None:
    """UsageError, before anything is written, when a file to change in place is not this
    checkpoint's alone."""
    for name in names:
        p = root / name
        if p.is_symlink():
            target = Path(os.path.realpath(p))
            if target.parent.name == "blobs":
                raise UsageError(
                    f"{p}: a link into a Hugging Face cache ({target}); blobs are "
                    "content-addressed and shared between revisions, so changing one in place "
                    "would corrupt every snapshot that links to it; convert to a new directory "
                    f"instead: gptqfmt convert {root} DST")
            raise UsageError(f"{p}: a symbolic link ({target}); changing it in place would "
                             "change the file it points to; convert to a new directory instead: "
                             f"gptqfmt convert {root} DST")
        links = p.stat().st_nlink
        if links > 1:
            raise UsageError(f"{p}: has {links - 1} other hard link(s), which would change "
                             "too; convert to a new directory instead (gptqfmt convert "
                             f"{root} DST), or copy the file first")


def _new_configs(root: Path, from_conv: str, to: str, report: ConvertReport,
                 derived: dict[str, Any] | None) -> list[tuple[str, bytes | None, bytes]]:
    """(name, old bytes or None, new bytes) of each config file to replace: those that hold a
    quantization config, relabelled as convert writes them; a derived one for a source with
    none."""
    prov = provenance(from_conv, to, report.totals)
    out: list[tuple[str, bytes | None, bytes]] = []
    for name in declaring_configs(root):
        if derived is not None and name == DERIVED_FILE:
            continue
        old = (root / name).read_bytes()
        doc = json.loads(old.decode("utf-8"))
        out.append((name, old, dumps(relabelled(name, doc, to, prov))))
    if derived is not None:
        p = root / DERIVED_FILE
        out.append((DERIVED_FILE, p.read_bytes() if p.is_file() else None,
                    dumps(set_convention(derived, to, {**prov, "config": "derived"}))))
    return out


def _ranges(ckpt: Checkpoint):
    """(module, qzeros tensor, shard name, byte offset in the shard) of every module, in file
    order: the journal's order and the order of the writes."""
    store = ckpt.store
    out = []
    for m in ckpt.valid_modules:
        qz = m.tensors["qzeros"]
        name = store.file_of(qz)
        f = store.files[name]
        out.append((m, qz, name, f.header.data_start + f.tensors[qz].begin))
    return sorted(out, key=lambda r: (r[2], r[3]))


@dataclass(frozen=True)
class Commands:
    """The user's command again, and its copying form: the next steps an I/O error names."""
    again: str
    copy: str

    def failed(self, e: OSError, undone: int, root: Path) -> OutputError:
        """The one line for an OSError that stopped the change after `undone` changes were
        written and then written back (0: nothing was changed), with the next step: a
        directory that cannot be written here is converted into a copy elsewhere; anything
        else (a full disk, an I/O error) is fixed and run again."""
        left = (f"{journal.undone(undone)}: {root} is as it was before" if undone else
                "nothing was changed")
        step = (f"write a converted copy instead: {self.copy}"
                if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM) else
                f"once that is fixed, run {self.again}")
        return OutputError.of(e, "cannot write", f"{left}; {step}", root)


def _apply(ckpt: Checkpoint, root: Path, from_conv: str, to: str, allow_lossy: bool, report,
           derived, progress, on_module, commands: Commands, reread: bool = False
           ) -> GateResult:
    before = {n: v for n, v in snapshot(root).items() if n not in journal.NAMES}
    gate = GateResult(method="in place: effective zeros of every cell checked on the new words "
                             "before writing (qweight, scales and g_idx are the same bytes, so "
                             "equal zeros are equal weights; Y = X @ W on the columns with lossy "
                             "cells); the words written are the proven ones (CRC-32), every "
                             "rewritten range read back and compared, every config hashed "
                             "against the journal")
    rng = np.random.default_rng(0)
    ranges = _ranges(ckpt)
    changed = []   # (module, qzeros, shard, offset, CRC-32 of the proven words, no lossy field)
    fds: dict[str, int] = {}   # shard -> opened for writing before the journal is sealed
    w: journal.Writer | None = None
    try:
        w = journal.Writer(root, f"convert {from_conv} -> {to}")
        advance = start(on_module, GATE, len(ranges))
        for m, qz, name, offset in ranges:
            old = ckpt.view(qz)
            new, c = convert_words(old, m.bits, from_conv, to, allow_lossy)
            clean = not (c.ambiguous or c.lossy)  # no lossy field: checked once, here
            gate.add(check_words(ckpt, m, old, new, from_conv, to, rng, checked=clean))
            if c.changed or not np.array_equal(old, new):   # a changed field changes its word
                e = w.range(name, offset, _bytes(old), _bytes(new))
                changed.append((m, qz, name, offset, e.new_crc32, clean))
            ckpt.store.release(m.tensors.values())
            advance(1)
        if gate.failures:
            raise FindingError(*[Finding("GQ503", msg, file=str(root))
                                 for msg in gate.failures])
        configs = _new_configs(root, from_conv, to, report, derived)
        for name, old_bytes, new_bytes in configs:
            w.whole(name, old_bytes, new_bytes)
        # a shard that cannot be opened for writing stops the change here, not half-way
        for i, name in enumerate(dict.fromkeys(c[2] for c in changed)):
            with naming(root / name):
                faults.point("inplace-open", i)
                fds[name] = os.open(root / name, os.O_RDWR | getattr(os, "O_NOFOLLOW", 0))
        check_unchanged(before, root, journal.NAMES)
        for name, _, new_bytes in configs:
            w.stage(name, new_bytes)
        w.seal()
    except BaseException as e:
        _close(fds)
        if w is not None:
            w.abandon()  # nothing was changed: the pending journal and the new copies go
        if isinstance(e, OSError):
            raise commands.failed(e, 0, root) from None
        raise
    assert w is not None  # sealed
    try:
        faults.point("inplace-journaled")
        written = _write(ckpt, root, changed, fds, from_conv, to, allow_lossy, progress)
        for j, (name, _, _) in enumerate(configs):
            with naming(root / name):
                w.commit_file(name)
                faults.point("inplace-config", j)
        journal.fsync_path(root)
        gate.bytes_compared = written + _read_back(root, w.entries)
        mislabelled = check_labels(root, to, reread, ckpt.store, progress)
        if mislabelled:
            raise FindingError(*[Finding("GQ503", msg, file=str(root)) for msg in mislabelled])
        journal.complete(root)
    except BaseException as e:
        _close(fds)
        if journal.finished(root):  # the change is whole: nothing to undo
            if isinstance(e, OSError):
                raise OutputError.of(e, "cannot write", f"{root} was converted before that "
                                     f"(the change is complete); check it with gptqfmt verify "
                                     f"{root}", root) from None
            raise
        _undo(root, e, commands)  # the source as it was, then the error or the signal
        raise
    finally:
        _close(fds)
        w.close()
    return gate


def _undo(root: Path, cause: BaseException, commands: Commands) -> None:
    """Roll the change back after `cause` stopped it; an OSError as the one line that says how
    many changes were written back. When the rollback itself fails, the journal stays and the
    line says so; other causes (a finding, a signal) go on as they are."""
    try:
        _, n = journal.rollback(root)
    except OSError as e:
        what = (f"{cause.filename or root}: cannot write: {cause.strerror or cause}"
                if isinstance(cause, OSError) else str(cause))
        raise OutputError(f"{what}; then {e.filename or root}: cannot write it back: "
                          f"{e.strerror or e}; the journal {root / journal.JOURNAL} keeps what "
                          f"it needs to undo the rest: once that is fixed, gptqfmt "
                          f"verify {root} rolls it back") from None
    if isinstance(cause, OSError):
        raise commands.failed(cause, n, root) from None


def _close(fds: dict[str, int]) -> None:
    """Close the shards opened for writing (unbuffered: nothing of theirs is written later)."""
    while fds:
        os.close(fds.popitem()[1])


def _bytes(words: np.ndarray) -> memoryview:
    """The bytes of a tensor's words as they lie in the file, without a copy."""
    return np.ascontiguousarray(words).data.cast("B")


def _write(ckpt: Checkpoint, root: Path, changed, fds: dict[str, int], from_conv, to,
           allow_lossy, progress) -> int:
    """Overwrite each changed qzeros range with its new words (its writeback started at once),
    then fsync each shard; returns the bytes written. The words are computed again from the
    old ones, still on disk (one tensor in memory at a time): their CRC-32 must be the proven
    words' (else GQ503 and the rollback), and each range is read back right after its write
    and compared byte for byte with what was written. The writes are unbuffered (pwrite): no
    byte of a range can reach the file after a rollback has written the old ones back."""
    sizes = [ckpt.store.info(qz).nbytes for _, qz, _, _, _, _ in changed]
    total = sum(sizes)
    # one buffer for every read-back (the largest range's size): no fresh pages per range
    back = bytearray(max(sizes, default=0))
    advance = start(progress, WRITE, total)
    for i, (m, qz, name, offset, proven, clean) in enumerate(changed):
        words, _ = convert_words(ckpt.view(qz), m.bits, from_conv, to, allow_lossy, clean)
        new = _bytes(words)
        ckpt.store.release([qz])
        if journal.crc32(new) != proven:
            raise FindingError(Finding("GQ503", "the words computed for writing are not "
                                       "the ones proven; rolled back", file=name,
                                       tensor=qz))
        fd = fds[name]
        with naming(root / name):
            done = 0
            while done < len(new):
                done += os.pwrite(fd, new[done:], offset + done)
            if not _read_into(fd, memoryview(back)[:len(new)], offset) or \
                    not back.startswith(new):   # memcmp of the bytes read with the words
                raise FindingError(Finding("GQ503", "holds other bytes than the ones just "
                                           "written; rolled back", file=name, tensor=qz))
            faults.point("inplace-range", i)
            journal.start_writeback(fd, offset, len(new))  # while the next range is computed
        advance(len(new))
    advance = start(progress, SYNC, sum(os.fstat(fd).st_size for fd in fds.values()))
    for name, fd in fds.items():
        with naming(root / name):
            os.fsync(fd)
            advance(os.fstat(fd).st_size)
    faults.point("inplace-synced")
    return total


def _read_into(fd: int, buf: memoryview, offset: int) -> bool:
    """Fill `buf` with `fd`'s bytes at `offset`; False where the file ends first."""
    got = 0
    while got < len(buf):
        n = os.preadv(fd, [buf[got:]], offset + got)
        if n == 0:
            return False
        got += n
    return True


def _read_back(root: Path, entries) -> int:
    """Every replaced file (the configs) as it is on disk now, checked against the digest of
    the new content the journal recorded; returns the bytes read. (The ranges were read back
    as written.)"""
    n = 0
    for e in entries:
        if e.offset is not None:
            continue
        data = (root / e.file).read_bytes()
        n += len(data)
        if journal.crc32(data) != e.new_crc32:
            raise FindingError(Finding("GQ503", "holds other bytes than the ones written and "
                                       "proven; rolled back", file=e.file))
    return n
