"""Stream one shard to its converted copy: every byte as in SRC except the qzeros data ranges.

The header is unchanged (shapes and dtypes do not move), so the copy is SRC's bytes with each
qzeros range replaced by its converted words. Each byte of SRC is read once and each byte of the
copy written once: the ranges between qzeros tensors are copied by the kernel
(os.copy_file_range, no pass through this process) where available, every one of their bytes
accounted for (a short copy is an error, never a shorter file); memory stays bounded by one
qzeros tensor. The gate (gate.py) proves the copy from that accounting, the headers and the
qzeros read back. A progress callback (`advance(n)`) hears of every byte of the copy as it is
written, at most COPY_CHUNK at a time.
"""
from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import faults
from ..bits.conventions import convert_words
from ..errors import FindingError
from ..findings import Finding
from ..safetensors_io.reader import SafetensorsFile
from .atomic import TMP_TAG, create

COPY_CHUNK = 64 << 20


@dataclass(frozen=True)
class QzerosJob:
    tensor: str
    bits: int


@dataclass(frozen=True)
class ShardWritten:
    size: int       # bytes of the shard
    copied: int     # of them, copied from SRC as they are (everything outside qzeros)


def write_shard(src: Path, out: Path, jobs: list[QzerosJob], src_conv: str, dst_conv: str,
                allow_lossy: bool, index: int = 0,
                advance: Callable[[int], Any] | None = None) -> ShardWritten:
    """Write `out` from `src`, each qzeros range of `jobs` converted; `advance(n)` after each n
    bytes of `out` written. `index` (the shard's place in sorted order) only names the shard to
    the fault hook."""
    f = SafetensorsFile(src)
    ranges = sorted((f.header.data_start + f.tensors[j.tensor].begin, j) for j in jobs)
    copied = 0
    with open(src, "rb") as fin, create(out) as fout:
        pos = 0
        for t, (start, job) in enumerate(ranges):
            copy_range(fin, fout, pos, start - pos, advance)
            copied += start - pos
            new, _ = convert_words(f.view(job.tensor), job.bits, src_conv, dst_conv,
                                   allow_lossy)
            f.release()
            fout.write(np.ascontiguousarray(new))
            if advance:
                advance(new.nbytes)
            pos = start + new.nbytes
            faults.point("mid-shard", index, t)
        copy_range(fin, fout, pos, f.size - pos, advance)
        copied += f.size - pos
    # the gate reads back every shard's size and header; the caller fsyncs before the rename
    return ShardWritten(f.size, copied)


def copy_range(fin, fout, offset: int, length: int,
               advance: Callable[[int], Any] | None = None) -> None:
    """Copy `length` bytes of fin from `offset` to fout's current position; `advance(n)` after
    each n of them are in fout. The holes of a sparse fin stay holes (as `cp` leaves them): the
    kernel's copy would write their zeros."""
    if length <= 0:
        return
    fout.flush()
    end = offset + length
    while offset < end:
        data, hole = _data_extent(fin.fileno(), offset, end)
        if data > offset:  # zeros by definition: fout gets a hole of the same length
            at = fout.seek(data - offset, os.SEEK_CUR)
            if at > os.fstat(fout.fileno()).st_size:
                fout.truncate(at)
            if advance:
                advance(data - offset)
        _copy_data(fin, fout, data, hole - data, advance)
        offset = hole


def _data_extent(fd: int, offset: int, end: int) -> tuple[int, int]:
    """The first extent of data of fd at or after `offset`, within `end`: (start, stop); all of
    it where the filesystem cannot tell holes (SEEK_DATA)."""
    if not hasattr(os, "SEEK_DATA"):
        return offset, end
    try:
        data = os.lseek(fd, offset, os.SEEK_DATA)
    except OSError as e:
        if e.errno == errno.ENXIO:  # only a hole from here to the end of the file
            return end, end
        return offset, end
    if data >= end:
        return end, end
    return data, min(end, os.lseek(fd, data, os.SEEK_HOLE))


def _copy_data(fin, fout, offset: int, length: int,
               advance: Callable[[int], Any] | None = None) -> None:
    """copy_range of data: by the kernel where it can, else read and written here; at most
    COPY_CHUNK bytes a step, each step told to `advance`."""
    if length <= 0:
        return
    if hasattr(os, "copy_file_range"):
        done = 0
        while done < length:
            try:
                n = os.copy_file_range(fin.fileno(), fout.fileno(),
                                       min(length - done, COPY_CHUNK), offset + done)
            except OSError as e:
                if e.errno not in (errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
                    raise  # a full disk or a file-size limit is an error, not a fallback
                break  # e.g. across filesystems on old kernels: fall back below
            if n == 0:
                break
            done += n
            if advance:
                advance(n)
        if done == length:
            fout.seek(0, os.SEEK_END)
            return
        offset, length = offset + done, length - done
        fout.seek(0, os.SEEK_END)
    fin.seek(offset)
    while length > 0:
        buf = fin.read(min(COPY_CHUNK, length))
        if not buf:
            raise OSError(f"{fin.name}: ended while copying")
        fout.write(buf)
        length -= len(buf)
        if advance:
            advance(len(buf))


def copy_plain(src: str | Path, out: str | Path) -> None:
    """Copy a non-tensor file, reading through symbolic links (the HF cache is made of them)."""
    with open(src, "rb") as fin, create(Path(out)) as fout:
        copy_range(fin, fout, 0, os.fstat(fin.fileno()).st_size)  # no 64 MB buffer a file


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """(size, mtime_ns, inode) of every file of the source directory, to notice a source that
    changes while it is converted."""
    out = {}
    for p in sorted(root.iterdir()):
        if p.is_file():
            st = p.stat()
            out[p.name] = (st.st_size, st.st_mtime_ns, st.st_ino)
    return out


def check_unchanged(before: dict, root: Path, ignore: tuple[str, ...] = ()) -> None:
    """GQ118 for every source file whose snapshot differs from `before`: a source that changed
    while it was converted is never committed. `ignore`: names the conversion itself writes
    there (convert --in-place's journal)."""
    after = {n: v for n, v in snapshot(root).items() if n not in ignore}
    changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
    if changed:
        raise FindingError(*[Finding("GQ118", "changed while being converted; nothing was "
                                     "written", file=n) for n in changed])


def copy_other_files(root: Path, tmp: Path, skip: set[str]) -> None:
    """Tokenizer, generation config, README, subfolders...: copied as they are, reading through
    symbolic links; `skip` names what the conversion writes itself (shards, configs, index)."""
    for p in sorted(root.iterdir()):
        if p.name in skip or TMP_TAG in p.name:
            continue
        if p.is_dir():
            shutil.copytree(p, tmp / p.name, copy_function=copy_plain,
                            ignore_dangling_symlinks=True,
                            ignore=shutil.ignore_patterns(f"*{TMP_TAG}*"))
        elif p.is_file():
            copy_plain(p, tmp / p.name)
