"""Atomic output: build in a temporary directory beside DST, fsync, rename into place.

A crash or SIGKILL leaves only the temporary directory, named `.<dst>.gptqfmt-tmp-<pid>-<rand>`;
the next run removes those whose process is gone. DST never exists half-written.
"""
from __future__ import annotations

import ctypes
import errno
import os
import secrets
import shutil
from contextlib import contextmanager
from pathlib import Path

from .. import faults
from ..errors import UsageError
from ..safetensors_io.journal import fsync_path

TMP_TAG = ".gptqfmt-tmp-"


def _tmp_prefix(dst: Path) -> str:
    return f".{dst.name}{TMP_TAG}"


def remove_stale(dst: Path) -> list[Path]:
    """Remove temporary directories of earlier runs for `dst` whose process no longer exists."""
    removed: list[Path] = []
    parent = dst.parent
    if not parent.is_dir():
        return removed
    for p in parent.iterdir():
        if not p.name.startswith(_tmp_prefix(dst)) or p.is_symlink() or not p.is_dir():
            continue
        if p.name.endswith("-old"):
            continue  # an old DST moved aside by a run that died mid-replace: left for the user
        pid = p.name[len(_tmp_prefix(dst)):].split("-")[0]
        if pid.isdigit() and alive(int(pid)):
            continue
        shutil.rmtree(p, ignore_errors=True)
        removed.append(p)
    return removed


def alive(pid: int) -> bool:
    """Whether a process `pid` exists (ours or another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def in_destination(name: str | None, dst: Path) -> str | None:
    """A file name an OSError carries, as the user knows it: a path inside the staging
    directory beside DST (removed when the write fails) shown at its place in DST."""
    if name is None:
        return None
    p = Path(name)
    for i, part in enumerate(p.parts):
        if part.startswith(_tmp_prefix(dst)):
            return str(Path(dst, *p.parts[i + 1:]))
    return str(name)


def create(path: Path):
    """A new file for writing in the staging directory: never an existing file, never through a
    symbolic link (O_EXCL | O_NOFOLLOW)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    return os.fdopen(os.open(path, flags, 0o644), "wb")


def check_destination(dst: Path, force: bool, src: Path | None = None) -> None:
    """UsageError unless DST may be written: its parent exists, it does not overlap SRC (also
    through symbolic links: replacing it must never delete a source file), it does not exist
    (unless force), and it is not a symbolic link (never written through)."""
    real_dst = Path(os.path.realpath(dst))
    if not real_dst.parent.is_dir():
        raise UsageError(f"{dst.parent}: no such directory")
    if src is not None:
        real_src = Path(os.path.realpath(src))
        sources = [real_src] + [Path(os.path.realpath(p)) for p in src.iterdir()]
        if real_dst.is_relative_to(real_src) or any(s.is_relative_to(real_dst) for s in sources):
            raise UsageError(f"{dst}: overlaps the source {src} (or files it links to); the "
                             "output must lie outside it and must not contain it")
    if (dst.exists() or dst.is_symlink()) and not force:
        raise UsageError(f"{dst}: already exists (use --force to replace it)")
    if dst.is_symlink():
        raise UsageError(f"{dst}: is a symbolic link; refusing to write through it")


@contextmanager
def staging(dst: Path, force: bool, src: Path | None = None):
    """Yield a fresh temporary directory; on success the caller calls commit(tmp, dst).
    DST is checked again here (check_destination): it may have changed since the caller's
    first look."""
    dst = Path(os.path.abspath(dst))
    check_destination(dst, force, src)
    remove_stale(dst)
    tmp = dst.parent / f"{_tmp_prefix(dst)}{os.getpid()}-{secrets.token_hex(4)}"
    try:  # mkdir inside: a signal that lands just after it still removes the directory
        try:
            tmp.mkdir()
        except OSError as e:
            raise UsageError(f"{dst.parent}: cannot create a directory there: "
                             f"{e.strerror or e}") from None
        faults.point("staging-created")
        yield tmp
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


class AfterRename(OSError):
    """An OSError once DST is in place (fsync of its parent, removal of the old DST): the
    output exists, complete, but its durability was not confirmed."""


def commit(tmp: Path, dst: Path, force: bool) -> None:
    """fsync everything in tmp, then make it DST in one rename. An old DST (with force) is
    swapped out atomically (renameat2 RENAME_EXCHANGE) and then removed; where the exchange is
    not available it is moved aside and put back if the second rename fails. An OSError after
    the rename is raised as AfterRename."""
    dst = Path(os.path.abspath(dst))
    faults.point("before-fsync")
    for f in tmp.iterdir():
        fsync_path(f)
    fsync_path(tmp)
    faults.point("before-rename")
    if dst.exists() or dst.is_symlink():
        if not force or dst.is_symlink():
            raise UsageError(f"{dst}: appeared while converting, or is a symbolic link; "
                             "not replaced")
        if _exchange(tmp, dst):  # tmp now holds the old DST, which staging() removes
            _after_rename(fsync_path, dst.parent)
            return
        old = dst.parent / f"{_tmp_prefix(dst)}{os.getpid()}-old"
        os.rename(dst, old)
        try:
            os.rename(tmp, dst)
        except OSError:
            os.rename(old, dst)
            raise
        _after_rename(lambda: shutil.rmtree(old, ignore_errors=True) if old.is_dir()
                      else old.unlink())
    else:
        os.rename(tmp, dst)
    _after_rename(fsync_path, dst.parent)


def _after_rename(fn, *args) -> None:
    try:
        faults.point("after-rename")  # inside the try: an OSError here is one after the rename
        fn(*args)
    except OSError as e:
        raise AfterRename(e.errno, e.strerror, e.filename) from e


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically with renameat2(RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.EXDEV):
        return False
    raise OSError(err, os.strerror(err), str(b))
