"""convert --in-place PATH: between gptq and gptq_v2 only the zero points change, and their
bytes keep their offsets (the header does not move), so the checkpoint itself is rewritten:
the qzeros byte ranges and the configs, megabytes of a model of many gigabytes, with no second
copy on disk.

    plan (plan.py, as convert) -> refuse shared files -> per module: new words computed and
    proven (gate.check_words: effective zeros per cell, Y = X @ W on lossy columns), old bytes
    put in the undo journal -> journal sealed (journal.py) -> each range's words computed again
    (their CRC-32 the proven words'), written and read back, fsynced -> configs replaced, read
    back and hashed against the journal's record -> journal marked complete and removed

A failure or a signal after the journal is sealed writes the old bytes back before the error
is reported; a SIGKILL leaves the journal, and the next gptqfmt command that opens the
directory finishes or undoes the change (GQ420). The source is refused, untouched, when a
file to change is a link into a Hugging Face cache's blobs/ (content-addressed, shared between
revisions), another symbolic link, or has other hard links."""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from .. import faults
from ..bits.conventions import CONVENTIONS, convert_words
from ..errors import FindingError, UsageError
from ..findings import Finding
from ..formats.configs import CONFIG_FILES
from ..formats.gptq.checkpoint import Checkpoint
from ..formats.open import open_labelled
from ..ops.reports import Progress
from ..safetensors_io import journal
from .configs import DERIVED_FILE, declaring_configs, dumps, provenance, relabelled, set_convention
from .gate import GateResult, check_labels, check_words
from .plan import plan_conversion
from .report import ConvertReport
from .write import check_unchanged, snapshot


def convert_in_place(path: str | os.PathLike[str], to: str, src_convention: str = "auto",
                     allow_lossy: bool = False, dry_run: bool = False,
                     progress: Progress | None = None,
                     on_module: Progress | None = None) -> ConvertReport:
    """Convert the GPTQ checkpoint directory `path` into convention `to`, in place (see the
    module docstring); the ConvertReport, with `in_place` set."""
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
        plan = plan_conversion(source, src_convention, to, allow_lossy)
        report = ConvertReport.of(plan, str(path), str(path), dry_run, "cpu", in_place=True)
        if dry_run:
            return report
        gate = _apply(ckpt, root, plan.from_, to, allow_lossy, report, plan.derived, progress,
                      on_module)
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


def _apply(ckpt: Checkpoint, root: Path, from_conv: str, to: str, allow_lossy: bool, report,
           derived, progress, on_module) -> GateResult:
    before = {n: v for n, v in snapshot(root).items() if n not in journal.NAMES}
    gate = GateResult(method="in place: effective zeros of every cell checked on the new words "
                             "before writing (qweight, scales and g_idx are the same bytes, so "
                             "equal zeros are equal weights; Y = X @ W on the columns with lossy "
                             "cells); the words written are the proven ones (CRC-32), every "
                             "rewritten range read back and compared, every config hashed "
                             "against the journal")
    rng = np.random.default_rng(0)
    ranges = _ranges(ckpt)
    on_module and on_module(0, len(ranges))
    w = journal.Writer(root, f"convert {from_conv} -> {to}")
    changed = []   # (module, qzeros, shard, offset, CRC-32 of the proven words, no lossy field)
    try:
        for m, qz, name, offset in ranges:
            old = ckpt.view(qz)
            new, c = convert_words(old, m.bits, from_conv, to, allow_lossy)
            clean = not (c.ambiguous or c.lossy)  # no lossy field: checked once, here
            gate.add(check_words(ckpt, m, old, new, from_conv, to, rng, checked=clean))
            if not np.array_equal(old, new):
                e = w.range(name, offset, _bytes(old), _bytes(new))
                changed.append((m, qz, name, offset, e.new_crc32, clean))
            ckpt.store.release(m.tensors.values())
            on_module and on_module(1, len(ranges))
        if gate.failures:
            raise FindingError(*[Finding("GQ503", msg, file=str(root))
                                 for msg in gate.failures])
        configs = _new_configs(root, from_conv, to, report, derived)
        for name, old_bytes, new_bytes in configs:
            w.whole(name, old_bytes, new_bytes)
        check_unchanged(before, root, journal.NAMES)
        w.seal()
    except BaseException:
        w.abandon()  # nothing was changed: the pending journal goes
        raise
    try:
        faults.point("inplace-journaled")
        written = _write(ckpt, root, changed, from_conv, to, allow_lossy, progress)
        for j, (name, _, new_bytes) in enumerate(configs):
            journal.replace_file(root / name, new_bytes)
            faults.point("inplace-config", j)
        journal.fsync_path(root)
        gate.bytes_compared = written + _read_back(root, w.entries)
        mislabelled = check_labels(root, to)
        if mislabelled:
            raise FindingError(*[Finding("GQ503", msg, file=str(root)) for msg in mislabelled])
        journal.complete(root)
    except BaseException:
        journal.rollback(root)  # the source as it was, then the error or the signal
        raise
    finally:
        w.close()
    return gate


def _bytes(words: np.ndarray) -> memoryview:
    """The bytes of a tensor's words as they lie in the file, without a copy."""
    return np.ascontiguousarray(words).data.cast("B")


def _write(ckpt: Checkpoint, root: Path, changed, from_conv, to, allow_lossy,
           progress) -> int:
    """Overwrite each changed qzeros range with its new words, then fsync each shard; returns
    the bytes written. The words are computed again from the old ones, still on disk (one
    tensor in memory at a time): their CRC-32 must be the proven words' (else GQ503 and the
    rollback), and each range is read back right after its write and compared byte for byte
    with what was written."""
    total = sum(ckpt.store.info(qz).nbytes for _, qz, _, _, _, _ in changed)
    progress and progress(0, total)
    handles: dict[str, BinaryIO] = {}
    try:
        for i, (m, qz, name, offset, proven, clean) in enumerate(changed):
            words, _ = convert_words(ckpt.view(qz), m.bits, from_conv, to, allow_lossy, clean)
            new = _bytes(words)
            ckpt.store.release([qz])
            if journal.crc32(new) != proven:
                raise FindingError(Finding("GQ503", "the words computed for writing are not "
                                           "the ones proven; rolled back", file=name,
                                           tensor=qz))
            f = handles.get(name) or handles.setdefault(name, open(root / name, "r+b"))
            f.seek(offset)
            f.write(new)
            f.flush()
            back = np.frombuffer(os.pread(f.fileno(), len(new), offset), dtype=np.uint8)
            if not np.array_equal(back, np.frombuffer(new, dtype=np.uint8)):
                raise FindingError(Finding("GQ503", "holds other bytes than the ones just "
                                           "written; rolled back", file=name, tensor=qz))
            faults.point("inplace-range", i)
            progress and progress(len(new), total)
        for f in handles.values():
            os.fsync(f.fileno())
    finally:
        for f in handles.values():
            f.close()
    faults.point("inplace-synced")
    return total


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
