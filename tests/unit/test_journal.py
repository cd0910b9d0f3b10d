"""The undo journal of in-place changes (gptqfmt/safetensors_io/journal.py): a rollback writes
back and counts only the changes that no longer hold their old bytes; a file's new copy is
never left behind by a failed write and keeps the file's permissions; a journal another
process is writing is never truncated."""
import errno
import json
import os
import struct

import pytest

from gptqfmt import faults
from gptqfmt.errors import FindingError
from gptqfmt.safetensors_io import journal

OLD = bytes(range(64))
# the new bytes of a range: every byte its old one plus 0x40 (the journal keeps no old bytes),
# or not (it keeps them)
NEW = {"delta": bytes(range(64, 128)), "stored": bytes(range(127, 63, -1))}


def journaled(root, ranges=3, kind="delta"):
    """A file of `ranges` 64-byte ranges and a config, their changes journaled and sealed (as
    convert --in-place leaves it before its first overwrite); the file's bytes and the
    config's before."""
    root.mkdir()
    data = OLD * ranges
    (root / "shard").write_bytes(data)
    (root / "cfg.json").write_bytes(b'{"a": 1}')
    w = journal.Writer(root, "test")
    for i in range(ranges):
        w.range("shard", 64 * i, OLD, NEW[kind])
    w.whole("cfg.json", b'{"a": 1}', b'{"a": 2}')
    w.stage("cfg.json", b'{"a": 2}')
    w.seal()
    w.close()
    return data


@pytest.mark.parametrize("kind", NEW)
@pytest.mark.parametrize("written", [0, 1, 3])
def test_a_rollback_counts_only_what_was_written(tmp_path, written, kind):
    root = tmp_path / "c"
    data = journaled(root, kind=kind)
    # the journal's body: per range its old bytes (or none) and one page digest; the config's
    assert journal.read(root / journal.JOURNAL)[1] == 3 * ((64 if kind == "stored" else 0) + 4) + 8
    with open(root / "shard", "r+b") as f:  # the first `written` ranges overwritten
        for i in range(written):
            f.seek(64 * i)
            f.write(NEW[kind])
    doc, n = journal.rollback(root)
    assert (doc["what"], n) == ("test", written)
    assert (root / "shard").read_bytes() == data
    assert sorted(os.listdir(root)) == ["cfg.json", "shard"]  # no journal, no staged copy


def test_a_replaced_file_is_written_back_and_counted(tmp_path):
    root = tmp_path / "c"
    journaled(root, ranges=1)
    os.replace(root / f".cfg.json{journal.NEW_TAG}", root / "cfg.json")
    assert journal.rollback(root)[1] == 1
    assert (root / "cfg.json").read_bytes() == b'{"a": 1}'


def test_a_failed_write_of_a_new_copy_leaves_nothing(tmp_path, monkeypatch):
    target = tmp_path / "cfg.json"
    target.write_bytes(b"old")
    target.chmod(0o600)
    tmp = journal.beside(target)
    monkeypatch.setattr(faults, "point", faults._armed("inplace-config-new:0:ENOSPC"))
    with pytest.raises(OSError) as e:
        journal.write_beside(target, tmp, b"new", ("inplace-config-new", 0))
    assert (e.value.errno, e.value.filename) == (errno.ENOSPC, str(target))  # the user's file
    assert sorted(os.listdir(tmp_path)) == ["cfg.json"] and target.read_bytes() == b"old"
    journal.replace_file(target, b"new")  # the hook fired once
    assert target.read_bytes() == b"new" and target.stat().st_mode & 0o777 == 0o600
    assert sorted(os.listdir(tmp_path)) == ["cfg.json"]


def test_a_journal_being_written_is_never_truncated(tmp_path):
    root = tmp_path / "c"
    root.mkdir()
    (root / journal.PENDING).write_bytes(b"another gptqfmt's journal")
    with pytest.raises(FindingError) as e:
        journal.Writer(root, "test")
    assert e.value.finding.code == "GQ421" and "appeared while" in e.value.finding.message
    assert (root / journal.PENDING).read_bytes() == b"another gptqfmt's journal"


def recorded_writeback(monkeypatch):
    """Each start of writeback as (file name, offset, length, the file's size then)."""
    calls = []

    def fadvise(fd, offset, length, advice):
        assert advice == os.POSIX_FADV_DONTNEED   # the advice that starts writeback
        calls.append((os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), offset, length,
                      os.fstat(fd).st_size))
    monkeypatch.setattr(os, "posix_fadvise", fadvise, raising=False)
    return calls


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names open files by /proc")
def test_the_journal_starts_writeback_as_it_grows(tmp_path, monkeypatch):
    monkeypatch.setattr(journal, "WRITEBACK_EVERY", 100)
    calls = recorded_writeback(monkeypatch)
    root = tmp_path / "c"
    journaled(root, ranges=5, kind="stored")   # 5 x 64 old bytes and 4 of page digests each
    # every 100 bytes or more as they are written, flushed first (the kernel has them),
    # from the start, with no gap and no overlap; the rest is left to the seal's fsync
    assert calls == [(journal.PENDING, 0, 136, 136), (journal.PENDING, 136, 136, 272)]
    # the sealed journal still reads back whole, and rolls back
    with open(root / "shard", "r+b") as f:
        f.write(NEW["stored"])
    assert journal.rollback(root)[1] == 1


def test_writeback_is_a_hint(tmp_path, monkeypatch):
    """Where posix_fadvise is missing or refuses, the journal is written as before."""
    def refuse(*a):
        raise OSError(errno.EINVAL, "refused")
    monkeypatch.setattr(journal, "WRITEBACK_EVERY", 1)
    monkeypatch.setattr(os, "posix_fadvise", refuse, raising=False)
    journaled(tmp_path / "a", kind="stored")
    monkeypatch.delattr(os, "posix_fadvise", raising=False)
    journaled(tmp_path / "b", kind="stored")
    for d in ("a", "b"):
        assert journal.read(tmp_path / d / journal.JOURNAL)[0]["what"] == "test"


@pytest.mark.parametrize("old,new,delta", [
    (b"\x26\x62", b"\x37\x73", 0x11),      # 4 bits, gptq -> gptq_v2: every field + 1
    (b"\x37\x73", b"\x26\x62", 0xEF),      # and back: - 0x11
    (b"\x00\x7f\xfe", b"\x01\x80\xff", 1),  # 8 bits
    (b"\xff\x00", b"\x00\x01", 1),          # wraps mod 256 like the bytes do
    (b"\x26\x62", b"\x37\x72", None),      # one byte off
    (b"\x26", b"\x26", None),                # nothing changes
    (b"", b"", None)])
def test_byte_delta(old, new, delta):
    assert journal.byte_delta(old, new) == delta


def test_a_journal_before_deltas_is_rolled_back(tmp_path):
    """A journal an earlier gptqfmt left (GQJRNL02: old bytes for every range, entries without
    a delta key) is read and applied as before."""
    root = tmp_path / "c"
    data = journaled(root, kind="stored")
    p = root / journal.JOURNAL
    doc, size = journal.read(p)
    assert p.read_bytes().endswith(b"GQJRNL03")
    for e in doc["entries"]:
        del e["delta"]
    trailer = json.dumps(doc).encode()
    p.write_bytes(p.read_bytes()[:size] + trailer + struct.pack("<Q", len(trailer))
                  + b"GQJRNL02")
    with open(root / "shard", "r+b") as f:
        f.write(NEW["stored"])
    assert journal.rollback(root)[1] == 1 and (root / "shard").read_bytes() == data


@pytest.mark.parametrize("kind", NEW)
def test_a_range_changed_during_the_rollback_is_not_written(tmp_path, monkeypatch, kind):
    """The rollback reads a range again as it writes it back, whether the journal keeps its
    old bytes or not: bytes that changed since it was judged (something else writing the
    shard) are refused, GQ421, not overwritten."""
    root = tmp_path / "c"
    journaled(root, ranges=1, kind=kind)
    with open(root / "shard", "r+b") as f:
        f.write(NEW[kind])
    reads, now = [], journal._now

    def foreign_second_time(target, e):
        reads.append(e.offset)
        return now(target, e) if len(reads) == 1 else bytes(x ^ 0x5A for x in now(target, e))
    monkeypatch.setattr(journal, "_now", foreign_second_time)
    with pytest.raises(FindingError) as e:
        journal.rollback(root)
    assert e.value.finding.code == "GQ421" and "changed during the rollback" in str(e.value)
    assert (root / "shard").read_bytes() == NEW[kind] and (root / journal.JOURNAL).exists()
