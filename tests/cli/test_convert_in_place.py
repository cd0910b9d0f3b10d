"""convert --in-place (conversion/inplace.py, journal.py): the result is byte for byte what the
copying convert writes, only qzeros ranges and configs are written, files that are not the
checkpoint's alone are refused, and a kill at every stage (and during the recovery itself)
leaves the original or the converted checkpoint, never a mix; the next command says which."""
import fcntl
import json
import os
import shutil
import signal

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
# on purpose: lossy cells, or a source without configs that runtimes read as gptq)
@pytest.mark.parametrize("src,to,extra,against", [
    (SRC, "gptq", [], 0), (CKPT / "b4-asym-act-gptq-sharded", "gptq_v2", ["--allow-lossy"], 1),
    (CKPT / "b4-sym-noact-gptq-single", "gptq_v2", [], 0),
    (FIXTURES / "invalid" / "no-config-at-all", "gptq", ["--from", "gptq_v2"], 1)],
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


def test_text_report_and_dry_run(tmp_path, run_cli):
    d = copy(tmp_path)
    r = run_cli("convert", "--in-place", d, "--to", "gptq", "--dry-run")
    assert r.exit_code == 0 and digest(d) == digest(SRC)
    assert r.stdout.startswith(f"would convert {d} in place (gptq_v2 -> gptq): 7 modules")
    r = run_cli("convert", "--in-place", d, "--to", "gptq")
    lines = r.stdout.splitlines()
    assert lines[0].startswith(f"converted {d} in place (gptq_v2 -> gptq)")
    assert "bytes rewritten (qzeros ranges and configs) and read back as proven" in lines[1]


@pytest.mark.parametrize("args,why", [
    (["--to", "compressed-tensors"], "--in-place converts between gptq and gptq_v2"),
    (["{tmp}/dst"], "DST does not apply"), (["--force"], "--force does not apply"),
    (["--jobs", "2"], "--jobs does not apply")])
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
        assert ("rolled forward" if finished else "rolled back") in found["message"], fault
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
        assert recovered(run_cli, d)["code"] == "GQ420"
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
        real_pread = os.pread

        def torn(fd, n, offset):
            data = real_pread(fd, n, offset)
            calls.append(1)
            return data[:-1] + bytes([data[-1] ^ 0xFF]) if len(calls) == 3 else data
        monkeypatch.setattr(inplace.os, "pread", torn)
    with pytest.raises(FindingError) as e:
        convert(d, None, to="gptq", in_place=True)
    assert e.value.finding.code == "GQ503" and "rolled back" in e.value.finding.message
    assert digest(d) == want["original"]
    assert not any((d / n).exists() for n in journal.NAMES)


@pytest.mark.faults
@pytest.mark.parametrize("torn", ["new prefix", "every other page", "old prefix",
                                  "a foreign page"])
def test_a_range_torn_by_a_kill_inside_its_write(tmp_path, run_cli, monkeypatch, want, torn):
    """A kill can cut a write short between pages, in the convert (new pages, then old ones) or
    in a recovery (old, then new): that range holds both, and is rolled back like any other. A
    page that is neither its old bytes nor its new ones was written by something else: GQ421,
    nothing touched. The journal is written here as convert writes it, with 16-byte pages so
    the fixture's 64-byte ranges span several."""
    from gptqfmt.safetensors_io.journal import pages
    d = copy(tmp_path)
    converted = tmp_path / "converted"
    assert run_cli("convert", SRC, converted, "--to", "gptq", "-q").exit_code == 0
    monkeypatch.setattr(journal, "PAGE", 16)
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
    assert doc["page"] == 16
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
    assert recovered(run_cli, d)["code"] == "GQ420"
    assert digest(d) == want["original"] and no_journal(d)
