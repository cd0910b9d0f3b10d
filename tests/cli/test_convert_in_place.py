"""convert --in-place (conversion/inplace.py, journal.py): the result is byte for byte what the
copying convert writes, only qzeros ranges and configs are written, files that are not the
checkpoint's alone are refused, and a kill at every stage (and during the recovery itself)
leaves the original or the converted checkpoint, never a mix; the next command says which."""
import fcntl
import json
import os
import shutil
import signal
import sys

import pytest

from gptqfmt.safetensors_io import journal
from gptqfmt.safetensors_io.reader import SafetensorsFile
from tests.support import CKPT, FIXTURES, digest

SRC = CKPT / "b4-sym-noact-gptq_v2-sharded"    # every zero point changes going to gptq
RANGES, CONFIGS = 7, 2                           # 7 qzeros ranges in 3 shards; 2 configs


@pytest.fixture
def want(tmp_path_factory, run_cli):
    """The original and what the copying convert writes, as digests."""
    out = tmp_path_factory.mktemp("want") / "converted"
    assert run_cli("convert", SRC, out, "--to", "gptq", "-q").exit_code == 0
    return {"original": digest(SRC), "converted": digest(out)}


def copy(tmp_path, src=SRC, name="m"):
    d = tmp_path / name
    shutil.copytree(src, d)
    return d


# (source, target, options, verify OUT --against SOURCE's exit: 1 where the output differs
# on purpose: lossy cells)
@pytest.mark.parametrize("src,to,extra,against", [
    (SRC, "gptq", [], 0), (CKPT / "b4-asym-act-gptq-sharded", "gptq_v2", ["--allow-lossy"], 1),
    (CKPT / "b4-sym-noact-gptq-single", "gptq_v2", [], 0),
    (FIXTURES / "invalid" / "no-config-at-all", "gptq_v2", ["--from", "gptq"], 0)],
    ids=["v2-to-gptq", "lossy", "single", "derived-config"])
def test_in_place_writes_what_the_copying_convert_writes(tmp_path, run_cli, src, to, extra,
                                                         against):
    d = copy(tmp_path, src)
    inodes = {p.name: p.stat().st_ino for p in d.glob("*.safetensors")}
    r = run_cli("convert", "--in-place", d, "--to", to, *extra, "--format", "json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["in_place"] and doc["written"] and doc["dst"] == doc["src"]
    copied = tmp_path / "copied"
    assert run_cli("convert", src, copied, "--to", to, *extra, "-q").exit_code == 0
    assert digest(d) == digest(copied)  # every file, configs included, and nothing else
    # the shards were written into, not replaced
    assert {p.name: p.stat().st_ino for p in d.glob("*.safetensors")} == inodes
    assert run_cli("verify", d, "--against", src).exit_code == against


def test_only_qzeros_ranges_change(tmp_path, run_cli):
    d = copy(tmp_path)
    assert run_cli("convert", "--in-place", d, "--to", "gptq", "-q").exit_code == 0
    for shard in sorted(SRC.glob("*.safetensors")):
        old, new = shard.read_bytes(), (d / shard.name).read_bytes()
        f = SafetensorsFile(shard)
        qz = [(f.header.data_start + f.tensors[n].begin, f.header.data_start + f.tensors[n].end)
              for n in f.tensors if n.endswith(".qzeros")]
        differ = [i for i in range(len(old)) if old[i] != new[i]]
        assert differ and all(any(a <= i < b for a, b in qz) for i in differ), shard.name


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names open files by /proc")
def test_each_range_starts_its_writeback_once_written(tmp_path, run_cli, monkeypatch):
    """The fsync at the end waits only for what is left: each rewritten range is handed to
    the disk as soon as it is written and read back, while the next one is computed."""
    started, events = [], []   # events: ("write" or "start", shard, offset), in order
    pwrite = os.pwrite

    def shard(fd):
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        return name if name.endswith(".safetensors") else None

    def fadvise(fd, offset, length, advice):
        if shard(fd):
            started.append((shard(fd), offset, os.pread(fd, length, offset)))
            events.append(("start", shard(fd), offset))

    def spied_pwrite(fd, data, offset):
        if shard(fd):
            events.append(("write", shard(fd), offset))
        return pwrite(fd, data, offset)
    monkeypatch.setattr(os, "posix_fadvise", fadvise, raising=False)
    monkeypatch.setattr(os, "pwrite", spied_pwrite)
    d = copy(tmp_path)
    assert run_cli("convert", "--in-place", d, "--to", "gptq", "-q").exit_code == 0
    qzeros = []
    for shard in sorted(SRC.glob("*.safetensors")):
        f = SafetensorsFile(shard)
        for n in sorted(f.tensors, key=lambda n: f.tensors[n].begin):
            if n.endswith(".qzeros"):
                at, end = f.header.data_start + f.tensors[n].begin, \
                    f.header.data_start + f.tensors[n].end
                qzeros.append((shard.name, at, (d / shard.name).read_bytes()[at:end]))
    assert len(qzeros) == RANGES and started == qzeros  # the new bytes, when started
    # each range's writeback starts right after its write, before the next range is written
    assert events == [(kind, name, at) for name, at, _ in qzeros for kind in ("write", "start")]


def test_text_report_and_dry_run(tmp_path, run_cli):
    d = copy(tmp_path)
    r = run_cli("convert", "--in-place", d, "--to", "gptq", "--dry-run")
    assert r.exit_code == 0 and digest(d) == digest(SRC)
    assert r.stdout.startswith(f"OK: would convert {d} in place (gptq_v2 -> gptq): 7 modules")
    r = run_cli("convert", "--in-place", d, "--to", "gptq")
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"OK: converted {d} in place (gptq_v2 -> gptq)")
    assert "bytes rewritten (qzeros ranges and configs) and read back as proven" in lines[1]


@pytest.mark.parametrize("args,why", [
    (["--to", "compressed-tensors"], "--in-place converts between gptq and gptq_v2"),
    (["{tmp}/dst"], "DST does not apply: DST: it writes no new directory"),
    (["--force"], "--force does not apply: --force: there is no DST to replace"),
    (["--jobs", "2"], "--jobs does not apply: --jobs: it rewrites only the qzeros ranges"),
    (["--backend", "cupy"], "--backend cupy: its proof runs on the CPU")])
def test_usage_errors(tmp_path, run_cli, args, why):
    d = copy(tmp_path)
    r = run_cli("convert", "--in-place", d, *[a.format(tmp=tmp_path) for a in args])
    assert r.exit_code == 2 and why in r.stderr
    assert digest(d) == digest(SRC)


def test_a_missing_dst_names_in_place(run_cli):
    r = run_cli("convert", SRC)
    assert r.exit_code == 2 and "--in-place rewrites SRC itself" in r.stderr


def test_lossy_is_refused_without_allow_lossy_and_nothing_is_touched(tmp_path, run_cli):
    d = copy(tmp_path, CKPT / "b4-asym-act-gptq-sharded")
    r = run_cli("convert", "--in-place", d, "--to", "gptq_v2", "--format", "json")
    assert r.exit_code == 1 and {f["code"] for f in json.loads(r.stdout)["findings"]} == \
        {"GQ409"}
    assert digest(d) == digest(CKPT / "b4-asym-act-gptq-sharded")


def test_shared_files_are_refused(tmp_path, run_cli):
    # a snapshot of a Hugging Face cache: its files are links into blobs/
    from tests.support import hf_cache_entry
    snap = hf_cache_entry(tmp_path / "hub", "org/model", SRC, "a" * 40)
    before = digest(snap)
    r = run_cli("convert", "--in-place", snap, "--to", "gptq")
    assert r.exit_code == 2 and "shared between revisions" in r.stderr
    assert f"gptqfmt convert {snap} DST" in r.stderr and digest(snap) == before
    # another symbolic link, and a hard link
    d = copy(tmp_path)
    (d / "config.json").rename(tmp_path / "elsewhere.json")
    (d / "config.json").symlink_to(tmp_path / "elsewhere.json")
    r = run_cli("convert", "--in-place", d, "--to", "gptq")
    assert r.exit_code == 2 and "a symbolic link" in r.stderr
    e = copy(tmp_path, name="e")
    os.link(e / "model-00002-of-00003.safetensors", tmp_path / "other-name")
    r = run_cli("convert", "--in-place", e, "--to", "gptq")
    assert r.exit_code == 2 and "1 other hard link(s)" in r.stderr
    assert digest(e) == digest(SRC)


# ---- kills: every stage, and during the recovery -----------------------------------------

KILLS = ["inplace-journaled", *[f"inplace-range:{i}" for i in range(RANGES)], "inplace-synced",
         *[f"inplace-config:{j}" for j in range(CONFIGS)], "inplace-complete"]
# the changes a kill at each stage leaves written, which the recovery writes back and counts
WRITTEN = {"inplace-journaled": 0, **{f"inplace-range:{i}": i + 1 for i in range(RANGES)},
           "inplace-synced": RANGES,
           **{f"inplace-config:{j}": RANGES + j + 1 for j in range(CONFIGS)}}


def undone(n):
    """How GQ420 and the error lines count a rollback that wrote `n` changes back."""
    return f"rolled back ({n} change{'s' if n != 1 else ''} undone)" if n else \
        "nothing was left to undo, and its journal was removed"


def recovered(run_cli, d):
    """Open the directory as any command does; the GQ420 it reports (None when none)."""
    r = run_cli("inspect", d, "--format", "json")
    found = [f for f in json.loads(r.stdout)["findings"] if f["code"].startswith("GQ42")]
    assert len(found) <= 1
    return found[0] if found else None


def no_journal(d):
    return not [n for n in os.listdir(d) if n.startswith(".gptqfmt-journal")]


@pytest.mark.faults
def test_a_sigkill_at_every_stage_leaves_one_whole_checkpoint(tmp_path, run_cli, forked_cli,
                                                               want):
    assert len(KILLS) == 12
    for i, fault in enumerate(KILLS):
        d = copy(tmp_path, name=f"k{i}")
        code, output = forked_cli(fault, "convert", "--in-place", d, "--to", "gptq", "-q")
        assert code == -signal.SIGKILL, (fault, output)
        found = recovered(run_cli, d)
        finished = fault == "inplace-complete"
        assert digest(d) == want["converted" if finished else "original"], fault
        assert found["code"] == "GQ420" and no_journal(d), fault
        assert ("rolled forward" if finished else undone(WRITTEN[fault])) in \
            found["message"], fault
        assert recovered(run_cli, d) is None  # said once; nothing left to do


@pytest.mark.faults
@pytest.mark.parametrize("signame,fault", [("SIGTERM", "inplace-range:3"),
                                           ("SIGINT", "inplace-config:0"),
                                           ("SIGTERM", "inplace-journaled")])
def test_a_signal_rolls_back_before_the_process_ends(tmp_path, forked_cli, want, signame,
                                                     fault):
    d = copy(tmp_path)
    code, output = forked_cli(f"{fault}:{signame}", "convert", "--in-place", d, "--to", "gptq")
    assert code == 128 + signal.Signals[signame], output
    assert f"interrupted by {signame}" in output
    assert digest(d) == want["original"] and no_journal(d)


@pytest.mark.faults
def test_a_sigkill_during_the_recovery_is_recovered_from(tmp_path, run_cli, forked_cli, want):
    for k in range(RANGES + CONFIGS):  # each change of the journal written back, then killed
        d = copy(tmp_path, name=f"r{k}")
        code, _ = forked_cli("inplace-config:1", "convert", "--in-place", d, "--to", "gptq",
                             "-q")
        assert code == -signal.SIGKILL
        code, output = forked_cli(f"inplace-rollback:{k}", "verify", d, "-q")
        assert code == -signal.SIGKILL, (k, output)
        assert not no_journal(d), k  # the journal survives a recovery cut short
        found = recovered(run_cli, d)
        # only what the first recovery had not yet written back is counted
        assert found["code"] == "GQ420" and undone(RANGES + CONFIGS - k - 1) in \
            found["message"], (k, found)
        assert digest(d) == want["original"] and no_journal(d), k


def test_a_leftover_pending_journal_is_removed_silently(tmp_path, run_cli):
    d = copy(tmp_path)
    (d / journal.PENDING).write_bytes(b"half a journal")
    assert recovered(run_cli, d) is None and no_journal(d) and digest(d) == digest(SRC)


@pytest.mark.faults
def test_a_journal_in_use_is_left_to_its_owner(tmp_path, run_cli, forked_cli):
    d = copy(tmp_path)
    code, _ = forked_cli("inplace-range:2", "convert", "--in-place", d, "--to", "gptq", "-q")
    assert code == -signal.SIGKILL
    with open(d / journal.JOURNAL, "rb") as held:  # as a running convert holds it
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        r = run_cli("inspect", d, "--format", "json")
        assert r.exit_code == 1
        [f] = json.loads(r.stdout)["findings"]
        assert f["code"] == "GQ421" and "converting this checkpoint in place right now" in \
            f["message"]
    assert recovered(run_cli, d)["code"] == "GQ420"  # released: rolled back


def test_a_journal_that_no_longer_matches_is_not_applied(tmp_path, run_cli, forked_cli):
    d = copy(tmp_path)
    code, _ = forked_cli("inplace-range:6", "convert", "--in-place", d, "--to", "gptq", "-q")
    assert code == -signal.SIGKILL
    doc, _ = journal.read(d / journal.JOURNAL)
    e = doc["entries"][0]
    with open(d / e["file"], "r+b") as f:  # someone else changed the range meanwhile
        f.seek(e["offset"])
        f.write(b"\xa5" * e["length"])
    shards = {p.name: p.read_bytes() for p in d.glob("*.safetensors")}
    r = run_cli("verify", d)
    assert r.exit_code == 1 and "GQ421" in r.stdout and "neither the old nor the new" in r.stdout
    assert {p.name: p.read_bytes() for p in d.glob("*.safetensors")} == shards  # untouched
    assert (d / journal.JOURNAL).exists()


@pytest.mark.faults
def test_recovery_removes_a_config_copy_a_kill_left_half_written(tmp_path, run_cli, forked_cli,
                                                                  want):
    d = copy(tmp_path)
    code, _ = forked_cli("inplace-config:0", "convert", "--in-place", d, "--to", "gptq", "-q")
    assert code == -signal.SIGKILL
    stray = d / f".quantize_config.json{journal.NEW_TAG}"  # killed between write and rename
    stray.write_bytes(b'{"bits": 4')
    assert recovered(run_cli, d)["code"] == "GQ420"
    assert not stray.exists() and digest(d) == want["original"] and no_journal(d)


@pytest.mark.faults
@pytest.mark.parametrize("fault", ["other words", "other bytes on disk"])
def test_words_not_proven_or_not_landed_roll_back(tmp_path, monkeypatch, want, fault):
    """The words are computed again for writing: a different result (CRC-32 against the proven
    words), or a range that reads back other than written, is GQ503, and the journal puts the
    old bytes back before the error is reported."""
    from gptqfmt.conversion import convert, inplace
    from gptqfmt.errors import FindingError

    d = copy(tmp_path)
    calls = []
    if fault == "other words":
        real = inplace.convert_words

        def drifting(words, bits, src, dst, allow_lossy=False, checked=False):
            calls.append(1)
            new, c = real(words, bits, src, dst, allow_lossy, checked)
            if len(calls) == RANGES + 2:  # the second range, as written
                new = new.copy()
                new[0, 0] ^= 1
            return new, c
        monkeypatch.setattr(inplace, "convert_words", drifting)
    else:
        real_preadv = os.preadv

        def torn(fd, buffers, offset, *flags):
            n = real_preadv(fd, buffers, offset, *flags)
            if sys._getframe(1).f_globals["__name__"] != inplace.__name__:
                return n   # the reads before the write (headers, probes) are not its
            calls.append(1)
            if len(calls) == 3:   # the third range read back: its last byte not as written
                buffers[-1][n - 1] ^= 0xFF
            return n
        monkeypatch.setattr(inplace.os, "preadv", torn)
    with pytest.raises(FindingError) as e:
        convert(d, None, to="gptq", in_place=True)
    assert e.value.finding.code == "GQ503" and "rolled back" in e.value.finding.message
    assert digest(d) == want["original"]
    assert not any((d / n).exists() for n in journal.NAMES)


@pytest.mark.faults
@pytest.mark.parametrize("kind", ["delta", "stored"])
@pytest.mark.parametrize("torn", ["new prefix", "every other page", "old prefix",
                                  "a foreign page"])
def test_a_range_torn_by_a_kill_inside_its_write(tmp_path, run_cli, monkeypatch, want, torn,
                                                 kind):
    """A kill can cut a write short between pages, in the convert (new pages, then old ones) or
    in a recovery (old, then new): that range holds both, and is rolled back like any other. A
    page that is neither its old bytes nor its new ones was written by something else: GQ421,
    nothing touched. The journal is written here as convert writes it, with 14-byte pages so
    the fixture's 64-byte ranges span several and cut words in two. Every zero point moves by
    one here, so the journal keeps no old bytes (delta: they are the new ones less 0x11 a byte);
    `stored` makes it keep them, as for a lossy or 3-bit range."""
    from gptqfmt.safetensors_io.journal import pages
    if kind == "stored":
        monkeypatch.setattr(journal, "byte_delta", lambda old, new: None)
    d = copy(tmp_path)
    converted = tmp_path / "converted"
    assert run_cli("convert", SRC, converted, "--to", "gptq", "-q").exit_code == 0
    monkeypatch.setattr(journal, "PAGE", 14)
    ranges = sorted((p.name, SafetensorsFile(p).header.data_start + i.begin, i.end - i.begin)
                    for p in d.glob("*.safetensors")
                    for n, i in SafetensorsFile(p).tensors.items() if n.endswith(".qzeros"))
    w = journal.Writer(d, "convert gptq_v2 -> gptq")
    for name, offset, length in ranges:
        w.range(name, offset, (d / name).read_bytes()[offset:offset + length],
                (converted / name).read_bytes()[offset:offset + length])
    w.seal()
    w.close()  # as a killed convert leaves it: journal sealed, its lock gone
    doc, _ = journal.read(d / journal.JOURNAL)
    assert doc["page"] == 14
    assert {e["delta"] for e in doc["entries"] if e["offset"] is not None} == \
        ({0xEF} if kind == "delta" else {None})   # gptq_v2 -> gptq: 0x88 -> 0x77
    for k, (name, offset, length) in enumerate(ranges[:4]):  # 0 to 2 written, 3 in flight
        new = (converted / name).read_bytes()[offset:offset + length]
        cut = pages(offset, length)
        assert len(cut) >= 4
        with open(d / name, "r+b") as f:
            for i, (a, b) in enumerate(cut):
                if k < 3 or torn == "new prefix" and i < len(cut) // 2 or \
                        torn == "every other page" and i % 2 == 0 or \
                        torn == "old prefix" and i >= len(cut) // 2:
                    f.seek(offset + a)
                    f.write(new[a:b])
                if k == 3 and torn == "a foreign page" and i == 1:
                    f.seek(offset + a)
                    f.write(bytes(x ^ 0x5A for x in new[a:b]))
    if torn == "a foreign page":
        shards = {p.name: p.read_bytes() for p in d.glob("*.safetensors")}
        r = run_cli("verify", d)
        assert r.exit_code == 1 and "GQ421" in r.stdout and "neither" in r.stdout
        assert {p.name: p.read_bytes() for p in d.glob("*.safetensors")} == shards
        return
    # the recovery cuts pages as the journal says they were cut, whatever this machine's size
    monkeypatch.setattr(journal, "PAGE", 4096)
    assert recovered(run_cli, d)["code"] == "GQ420"
    assert digest(d) == want["original"] and no_journal(d)


# ---- I/O errors: one line, exit 2, nothing left behind, every overwrite written back -------
# Injected through the fault hook (faults.py, `stage:ERRNO`): the I/O step at that stage fails
# with that errno, as write(2) and fsync(2) fail, without a file name.

SHARD1, SHARD2 = "model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors"
COPY, AGAIN = "write a converted copy instead: gptqfmt convert {d} DST --to gptq", \
    "once that is fixed, run gptqfmt convert --in-place {d} --to gptq"


def inject(monkeypatch, spec=None):
    """Arm the fault hook with `spec` in this process; None disarms it."""
    from gptqfmt import faults
    monkeypatch.setattr(faults, "point", faults._armed(spec) if spec else faults._unset)


def error_line(d, file, cause, then):
    return f"gptqfmt: error: {d / file if file else d}: cannot write: {cause}; " \
           f"{then.format(d=d)}\n"


# (fault, the file the line names, its cause, the changes written back, then the next step)
IO_ERRORS = [
    # before the first overwrite: nothing changed, nothing left (no journal, no new copies)
    ("inplace-journal:0:EROFS", journal.PENDING, "Read-only file system", 0, COPY),
    ("inplace-journal:0:EACCES", journal.PENDING, "Permission denied", 0, COPY),
    ("inplace-journal:3:ENOSPC", journal.PENDING, "No space left on device", 0, AGAIN),
    ("inplace-open:1:EACCES", SHARD2, "Permission denied", 0, COPY),
    ("inplace-open:0:ENOENT", SHARD1, "No such file or directory", 0, AGAIN),  # vanished
    ("inplace-config-new:0:ENOSPC", "quantize_config.json", "No space left on device", 0,
     AGAIN),
    ("inplace-config-new:1:EIO", "config.json", "Input/output error", 0, AGAIN),
    ("inplace-journaled:EIO", None, "Input/output error", 0, AGAIN),
    # after overwrites: each written back, and only those counted
    ("inplace-range:0:EIO", SHARD1, "Input/output error", 1, AGAIN),
    ("inplace-range:3:ENOSPC", SHARD2, "No space left on device", 4, AGAIN),
    ("inplace-synced:EIO", None, "Input/output error", RANGES, AGAIN),
    ("inplace-config:0:ENOENT", "quantize_config.json", "No such file or directory",
     RANGES + 1, AGAIN),
    ("inplace-config:1:EROFS", "config.json", "Read-only file system", RANGES + 2, COPY),
]


@pytest.mark.parametrize("fault,file,cause,done,step", IO_ERRORS, ids=[e[0] for e in IO_ERRORS])
def test_an_io_error_is_one_line_and_leaves_the_checkpoint_as_it_was(
        tmp_path, monkeypatch, run_cli, fault, file, cause, done, step):
    d = copy(tmp_path)
    inject(monkeypatch, fault)
    r = run_cli("convert", "--in-place", d, "--to", "gptq")
    then = f"{undone(done)}: {d} is as it was before; {step}" if done else \
        f"nothing was changed; {step}"
    assert (r.exit_code, r.stdout, r.stderr) == (2, "", error_line(d, file, cause, then))
    assert digest(d) == digest(SRC)  # every byte, and no other file (journal, new copies)
    inject(monkeypatch)
    v = run_cli("verify", d, "--format", "json")
    assert v.exit_code == 0 and not [f for f in json.loads(v.stdout)["findings"]
                                     if f["code"].startswith("GQ42")]


def test_an_io_error_in_json_is_one_document(tmp_path, monkeypatch, run_cli):
    d = copy(tmp_path)
    inject(monkeypatch, "inplace-config-new:0:ENOSPC")
    r = run_cli("convert", "--in-place", d, "--to", "gptq", "--format", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 2 and doc["exit_code"] == 2 and doc["findings"] == []
    assert doc["error"] == error_line(d, "quantize_config.json", "No space left on device",
                                      f"nothing was changed; {AGAIN}")[len("gptqfmt: error: "):-1]
    assert digest(d) == digest(SRC)


@pytest.mark.faults
def test_a_file_size_limit_stops_it_before_anything_is_changed(tmp_path):
    """A real write error, not an injected one: RLIMIT_FSIZE makes every write past 256 bytes
    fail with EFBIG, as a full disk fails them with ENOSPC. The configs' new copies are written
    before the first overwrite, so the change stops there."""
    import resource
    import subprocess
    import sys

    from tests.support import ROOT
    d = copy(tmp_path)

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("GPTQFMT_FAULT", None)
    r = subprocess.run([sys.executable, "-m", "gptqfmt", "convert", "--in-place", str(d),
                        "--to", "gptq"], capture_output=True, text=True, env=env,
                       preexec_fn=small_files)
    assert (r.returncode, r.stdout) == (2, ""), r.stderr
    assert r.stderr == error_line(d, "quantize_config.json", "File too large",
                                  f"nothing was changed; {AGAIN}")
    assert digest(d) == digest(SRC)


def test_a_failed_rollback_keeps_the_journal_and_says_so(tmp_path, monkeypatch, run_cli):
    """The write back fails too (after the first two changes were written back): the journal
    stays, the line names both errors, and the next command writes back the rest, counting
    only those."""
    d = copy(tmp_path)
    inject(monkeypatch, "inplace-range:3:EIO,inplace-rollback:1:ENOSPC")
    r = run_cli("convert", "--in-place", d, "--to", "gptq")
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == (
        f"gptqfmt: error: {d / SHARD2}: cannot write: Input/output error; then {d / SHARD2}: "
        f"cannot write it back: No space left on device; the journal {d / journal.JOURNAL} "
        f"keeps what it needs to undo the rest: once that is fixed, gptqfmt verify {d} "
        "rolls it back\n")
    assert sorted(set(os.listdir(d)) - set(os.listdir(SRC))) == [journal.JOURNAL]
    inject(monkeypatch)
    found = recovered(run_cli, d)
    assert found["code"] == "GQ420" and undone(2) in found["message"]  # 4 written, 2 back
    assert digest(d) == digest(SRC) and recovered(run_cli, d) is None


def test_a_recovery_that_cannot_write_keeps_the_journal(tmp_path, monkeypatch, run_cli):
    """A later command finds the journal but cannot write (a full disk, a read-only mount):
    GQ421 says so and how to go on, not to restore from a copy; once it can, the rest is
    rolled back and counted."""
    d = copy(tmp_path)
    inject(monkeypatch, "inplace-config:1:EIO,inplace-rollback:0:EROFS")  # 9 written, 1 back
    assert run_cli("convert", "--in-place", d, "--to", "gptq").exit_code == 2
    inject(monkeypatch, "inplace-rollback:3:ENOSPC")  # 3 more back, then the disk is full
    r = run_cli("verify", d, "--format", "json")
    [f] = json.loads(r.stdout)["findings"]
    assert r.exit_code == 1 and (f["code"], f["file"]) == ("GQ421", journal.JOURNAL)
    assert f["message"] == ("journal of an interrupted in-place convert cannot be applied: "
                            f"{d / SHARD2}: No space left on device")
    assert f["hint"] == (f"the journal stays, so nothing is lost; once {d / SHARD2} can be "
                         "written (free space, a writable mount), gptqfmt verify "
                         f"{d} applies it")
    assert not no_journal(d)
    inject(monkeypatch)
    found = recovered(run_cli, d)
    assert found["code"] == "GQ420" and undone(RANGES + CONFIGS - 4) in found["message"]
    assert digest(d) == digest(SRC) and recovered(run_cli, d) is None


def test_an_io_error_after_the_change_is_complete_is_not_undone(tmp_path, monkeypatch,
                                                                 run_cli, want):
    d = copy(tmp_path)
    inject(monkeypatch, "inplace-complete:EIO")
    r = run_cli("convert", "--in-place", d, "--to", "gptq")
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == (f"gptqfmt: error: {d / journal.COMPLETE}: cannot write: Input/output "
                        f"error; {d} was converted before that (the change is complete); "
                        f"check it with gptqfmt verify {d}\n")
    inject(monkeypatch)
    assert "rolled forward" in recovered(run_cli, d)["message"]
    assert digest(d) == want["converted"]


@pytest.mark.faults
def test_a_signal_after_the_change_is_complete_leaves_it_complete(tmp_path, run_cli,
                                                                  forked_cli, want):
    d = copy(tmp_path)
    code, output = forked_cli("inplace-complete:SIGTERM", "convert", "--in-place", d, "--to",
                              "gptq")
    assert code == 143 and output == "gptqfmt: error: interrupted by SIGTERM\n", output
    assert "rolled forward" in recovered(run_cli, d)["message"]
    assert digest(d) == want["converted"]
