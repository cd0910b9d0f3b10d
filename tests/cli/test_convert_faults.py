"""convert under faults: a SIGKILL at every stage leaves SRC intact and DST absent or complete.

The kills land at named stages through the GPTQFMT_FAULT test hook (gptqfmt/faults.py), so every
run dies exactly where the test says, on a loaded machine too: no sleeps, no timing.
"""
import os
import resource
import shutil
import signal
import subprocess
import sys

import pytest

from gptqfmt.safetensors_io.reader import SafetensorsFile
from tests.support import ROOT, build, digest, digest_file, staging_dirs

pytestmark = pytest.mark.faults


def cmd(src, dst):
    return [sys.executable, "-m", "gptqfmt", "convert", str(src), str(dst), "--quiet"]


SHARDS = 4
# (GPTQFMT_FAULT value, whether DST exists before the run, which then gets --force)
KILL_POINTS = [
    ("staging-created", False),
    *[(f"mid-shard:{s}.{t}", False) for s in range(SHARDS) for t in range(2)],
    ("shards-written", False),
    ("before-gate", False),
    ("gate-module:0", False),
    ("gate-module:5", False),
    ("before-fsync", False),
    ("before-rename", False),
    ("after-rename", False),
    ("staging-created", True),
    ("mid-shard:1.1", True),
    ("mid-shard:3.0", True),
    ("before-gate", True),
    ("before-rename", True),
    ("after-rename", True),
]


def test_sigkill_at_every_stage(tmp_path, run_cli, forked_cli):
    from gptqfmt.conversion import convert

    src, dst = tmp_path / "src", tmp_path / "dst"
    build(src, shards=SHARDS, k=256, n=512)
    before = digest(src)
    want = tmp_path / "want"
    want.mkdir()
    new, old = want / "new", want / "old"
    convert(src, new, backend="cpu")             # what a finished run writes
    convert(src, old, to="gptq", backend="cpu")  # a different DST for --force to replace
    new_digest, old_digest = digest(new), digest(old)
    assert new_digest != old_digest
    shards = sorted(p.name for p in src.glob("*.safetensors"))
    assert len(shards) == SHARDS

    def qzeros_span(shard, t):
        """Bytes [start, end) of the t-th qzeros tensor (file order) of a shard."""
        f = SafetensorsFile(src / shard)
        spans = sorted((f.header.data_start + f.tensors[n].begin,
                        f.header.data_start + f.tensors[n].end)
                       for n in f.tensors if n.endswith(".qzeros"))
        return spans[t]

    for fault, force in KILL_POINTS:
        if force:
            shutil.copytree(old, dst)
        code, output = forked_cli(fault, "convert", src, dst, "--quiet", "--backend", "cpu",
                                  *["--force"] * force)
        where = f"{fault} (--force: {force}): {output}"
        assert code == -signal.SIGKILL, where  # it really died there
        assert digest(src) == before, where
        stage = fault.split(":")[0]
        left = staging_dirs(tmp_path)
        # DST: untouched before the rename, the new output after it
        if stage == "after-rename":
            assert digest(dst) == new_digest, where
        elif force:
            assert digest(dst) == old_digest, where
        else:
            assert not dst.exists(), where
        if dst.exists():
            assert run_cli("verify", dst).exit_code == 0, where
        # what the dead run left beside DST shows where it died
        if stage == "after-rename" and not force:
            assert left == [], where
        else:
            assert len(left) == 1, where
            tmp = left[0]
            if stage == "after-rename":  # the exchanged-out old DST, or the moved-aside one
                assert digest(tmp) == old_digest, where
            elif stage == "staging-created":
                assert list(tmp.iterdir()) == [], where
            elif stage == "mid-shard":
                s, t = map(int, fault.split(":")[1].split("."))
                assert sorted(p.name for p in tmp.iterdir()) == shards[:s + 1], where
                for name in shards[:s]:
                    assert digest_file(tmp / name) == new_digest[name], where
                start, end = qzeros_span(shards[s], t)
                assert start <= (tmp / shards[s]).stat().st_size <= end, where  # cut inside
            elif stage == "shards-written":
                assert digest(tmp) == {k: new_digest[k] for k in shards}, where
            else:  # complete, before or during the gate, before fsync, before the rename
                assert digest(tmp) == new_digest, where
        # the next normal run removes what the dead one left and succeeds
        r = run_cli("convert", src, dst, "--quiet", "--backend", "cpu",
                    *(["--force"] if dst.exists() else []))
        assert r.exit_code == 0, where + r.stderr
        for p in staging_dirs(tmp_path):  # where renameat2 cannot exchange: left for the user
            assert p.name.endswith("-old") and stage == "after-rename" and force, where
            shutil.rmtree(p)
        assert digest(dst) == new_digest and digest(src) == before, where
        shutil.rmtree(dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src", "want"]


def test_interrupt_removes_its_temporary_directory(tmp_path, monkeypatch):
    from gptqfmt.conversion import run as convert_run

    src, dst = tmp_path / "src", tmp_path / "dst"
    build(src, shards=2, k=256, n=256)

    def boom(*a, **k):
        raise KeyboardInterrupt
    monkeypatch.setattr(convert_run, "run_gate", boom)
    with pytest.raises(KeyboardInterrupt):
        convert_run.convert(src, dst)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("wrong", ["unconverted", "one word"])
def test_gate_failure_writes_nothing(tmp_path, monkeypatch, wrong):
    """The writer's words are not what the plan says (unconverted, or one field off in one
    module): the gate's read-back proof fails, GQ503, and nothing is left behind."""
    from gptqfmt.conversion import run as convert_run
    from gptqfmt.conversion import write as write_mod
    from gptqfmt.errors import FindingError

    src, dst = tmp_path / "src", tmp_path / "dst"
    build(src, shards=2, k=256, n=256)
    real = write_mod.convert_words
    calls = []

    def bad(words, bits, a, b, allow_lossy=False):
        calls.append(1)
        if wrong == "unconverted":
            return real(words, bits, a, a, allow_lossy)
        new, c = real(words, bits, a, b, allow_lossy)
        if len(calls) == 3:
            new = new.copy()
            new[0, 0] ^= 1
        return new, c
    monkeypatch.setattr(write_mod, "convert_words", bad)
    with pytest.raises(FindingError) as e:
        convert_run.convert(src, dst)
    assert {f.code for f in e.value.findings} == {"GQ503"}
    assert len(e.value.findings) == (1 if wrong == "one word" else len(calls))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


@pytest.mark.parametrize("damage", ["header", "size"])
def test_gate_reads_back_headers_and_sizes(tmp_path, monkeypatch, damage):
    """A staged shard whose header bytes or size differ from SRC's fails the gate (the qzeros
    are proven at the header's offsets, so the header itself is read back)."""
    from gptqfmt.conversion import run as convert_run
    from gptqfmt.errors import FindingError

    src, dst = tmp_path / "src", tmp_path / "dst"
    build(src, shards=2, k=256, n=256)
    real = convert_run.run_gate

    def damaged(ckpt, tmp, *args, **kw):
        shard = sorted(tmp.glob("*.safetensors"))[1]
        data = bytearray(shard.read_bytes())
        if damage == "header":  # the same length, still valid JSON: a g_idx renamed
            n = int.from_bytes(data[:8], "little")
            i = data.index(b'.g_idx"', 8, 8 + n)
            data[i + 5:i + 6] = b"y"
        else:
            data += b"\0" * 8
        shard.write_bytes(bytes(data))
        return real(ckpt, tmp, *args, **kw)
    monkeypatch.setattr(convert_run, "run_gate", damaged)
    with pytest.raises(FindingError) as e:
        convert_run.convert(src, dst)
    assert e.value.finding.code == "GQ503"
    assert ("header differs" if damage == "header" else "of another size") in \
        e.value.finding.message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_short_kernel_copies_are_completed(tmp_path, monkeypatch):
    """copy_file_range may copy less than asked, or stop (0) where a filesystem cannot: every
    byte is still accounted for, by the read-write fallback, and the output is the same."""
    import os

    from gptqfmt.conversion import convert

    src = tmp_path / "src"
    build(src, shards=2, k=256, n=256)
    convert(src, tmp_path / "ref")
    real = os.copy_file_range
    seen = []

    def short(fi, fo, count, offset_src=None, offset_dst=None):
        seen.append(count)
        if len(seen) % 3 == 0:
            return 0
        return real(fi, fo, max(1, count // 2), offset_src, offset_dst)
    monkeypatch.setattr(os, "copy_file_range", short)
    convert(src, tmp_path / "dst")
    assert seen
    for p in sorted((tmp_path / "ref").iterdir()):
        assert (tmp_path / "dst" / p.name).read_bytes() == p.read_bytes(), p.name


def test_holes_of_a_sparse_source_stay_holes(tmp_path):
    """A shard whose zero blocks are holes is copied with holes (the kernel's copy would write
    their zeros), into the bytes the same shard without holes gives."""
    from gptqfmt.conversion import convert

    src, dense = tmp_path / "src", tmp_path / "dense"
    build(src, shards=1, k=1024, n=2048)
    shard = next(src.glob("*.safetensors"))
    f = SafetensorsFile(shard)
    info = f.tensors["model.layers.0.mlp.up_proj.qweight"]
    data = bytearray(shard.read_bytes())
    start = f.header.data_start + info.begin + 4096   # its first page kept: not GQ318's empty
    data[start:f.header.data_start + info.end] = bytes(f.header.data_start + info.end - start)
    shutil.copytree(src, dense)
    (dense / shard.name).write_bytes(data)
    convert(dense, tmp_path / "ref")
    shard.unlink()
    page = 4096
    with open(shard, "wb") as out:  # every whole page of zeros left unwritten: a hole
        for at in range(0, len(data), page):
            chunk = data[at:at + page]
            if any(chunk):
                out.seek(at)
                out.write(chunk)
        out.truncate(len(data))
    held = shard.stat().st_blocks * 512
    if held > len(data) - info.nbytes // 2:
        pytest.skip("this filesystem keeps no holes")
    convert(src, tmp_path / "dst")
    copy = tmp_path / "dst" / shard.name
    assert copy.read_bytes() == (tmp_path / "ref" / shard.name).read_bytes()
    assert copy.stat().st_blocks * 512 <= held + page


def test_read_only_destination(tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root ignores directory permissions")
    src, parent = tmp_path / "src", tmp_path / "ro"
    build(src, shards=1, k=256, n=256)
    parent.mkdir()
    parent.chmod(0o500)
    r = subprocess.run(cmd(src, parent / "dst"), capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2 and "cannot create" in r.stderr


def test_disk_full_leaves_nothing(tmp_path):
    """RLIMIT_FSIZE stands in for a full disk: every write past 1 MB fails with EFBIG."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    build(src, shards=2, k=1024, n=2048)  # shards of ~1 MB each
    before = digest(src)

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    r = subprocess.run(cmd(src, dst), capture_output=True, text=True, preexec_fn=small_files,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert r.returncode == 2, r.stderr
    assert "cannot write the output: File too large; nothing was written" in r.stderr
    assert "Traceback" not in r.stderr and r.stdout == ""
    assert digest(src) == before and sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_read_only_destination_filesystem(tmp_path, monkeypatch, run_cli):
    import errno
    from pathlib import Path

    src = tmp_path / "src"
    build(src, shards=1, k=256, n=256)
    real_mkdir = Path.mkdir

    def erofs(self, *a, **k):
        if self.parent == tmp_path / "ro":
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        return real_mkdir(self, *a, **k)
    (tmp_path / "ro").mkdir()
    monkeypatch.setattr(Path, "mkdir", erofs)
    r = run_cli("convert", src, tmp_path / "ro" / "dst")
    assert r.exit_code == 2 and "Read-only file system" in r.stderr
    assert list((tmp_path / "ro").iterdir()) == []


def test_source_changing_while_read_is_detected(tmp_path, monkeypatch):
    from gptqfmt.conversion import run as convert_run
    from gptqfmt.errors import FindingError

    src, dst = tmp_path / "src", tmp_path / "dst"
    build(src, shards=2, k=256, n=256)
    real = convert_run.write_shard

    def write_then_touch(*a):
        n = real(*a)
        with open(src / "tokenizer.json", "a") as f:  # someone edits SRC meanwhile
            f.write(" ")
        return n
    monkeypatch.setattr(convert_run, "write_shard", write_then_touch)
    with pytest.raises(FindingError) as e:
        convert_run.convert(src, dst)
    assert e.value.finding.code == "GQ118" and e.value.finding.file == "tokenizer.json"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_outputs_never_follow_symbolic_links(tmp_path):
    from gptqfmt.conversion import convert
    from gptqfmt.conversion.atomic import create
    from gptqfmt.errors import UsageError

    victim = tmp_path / "victim"
    victim.write_text("keep")
    os.symlink(victim, tmp_path / "planted")
    with pytest.raises(OSError):
        create(tmp_path / "planted")
    assert victim.read_text() == "keep"
    src = tmp_path / "src"
    build(src, shards=1, k=256, n=256)
    os.symlink(victim, tmp_path / "dst")
    with pytest.raises(UsageError):
        convert(src, tmp_path / "dst", force=True)
    assert victim.read_text() == "keep"


def test_no_pickle_or_torch_load_anywhere():
    """No code path can unpickle: no import of pickle, marshal or shelve, and no call of
    torch.load, np.load, pickle's loads or eval (the words may appear in messages, as the
    command the tool prints for converting a PyTorch file does)."""
    import ast
    banned_modules = {"pickle", "marshal", "shelve", "dill", "cloudpickle"}
    banned_calls = {"load", "loads", "eval", "exec", "Unpickler"}
    hits = []
    for p in (ROOT / "gptqfmt").rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + \
                    ([node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
                hits += [f"{p}:{node.lineno} imports {n}" for n in names
                         if n.split(".")[0] in banned_modules]
            elif isinstance(node, ast.Call):
                f = node.func
                name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
                owner = getattr(f.value, "id", "") if isinstance(f, ast.Attribute) else ""
                if name in {"eval", "exec"} and not owner or \
                        name in banned_calls and owner in {"torch", "np", "numpy", "pickle"}:
                    hits.append(f"{p}:{node.lineno} calls {owner}.{name}")
    assert hits == []


# (fault through the hook, `stage:ERRNO`: that I/O step fails with that errno, as write(2) and
# fsync(2) fail, without a file name; the file the line names, as it would be in DST; the cause)
COPY_IO_ERRORS = [
    ("staging-created:EACCES", None, "Permission denied"),
    ("mid-shard:1.0:ENOSPC", "model-00002-of-00002.safetensors", "No space left on device"),
    ("shards-written:ENOENT", None, "No such file or directory"),
    ("before-fsync:EIO", None, "Input/output error"),
    ("before-rename:EROFS", None, "Read-only file system"),
]


@pytest.mark.parametrize("fault,file,cause", COPY_IO_ERRORS, ids=[e[0] for e in COPY_IO_ERRORS])
def test_an_io_error_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, run_cli, fault,
                                                    file, cause):
    from gptqfmt import faults

    src, dst = tmp_path / "src", tmp_path / "dst"
    build(src, shards=2, k=256, n=256)
    before = digest(src)
    monkeypatch.setattr(faults, "point", faults._armed(fault))
    r = run_cli("convert", src, dst, "--backend", "cpu")
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == f"gptqfmt: error: {dst / file if file else dst}: cannot write the " \
                       f"output: {cause}; nothing was written\n"
    assert digest(src) == before and sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_an_io_error_in_a_worker_names_its_shard(tmp_path):
    """--jobs 2: the shard is written in a worker process, and the error crosses back with the
    shard's name."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    build(src, shards=2, k=256, n=256)
    before = digest(src)
    r = subprocess.run(cmd(src, dst) + ["--jobs", "2"], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(ROOT),
                            "GPTQFMT_FAULT": "mid-shard:1.0:ENOSPC"})
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == f"gptqfmt: error: {dst / 'model-00002-of-00002.safetensors'}: cannot " \
                       "write the output: No space left on device; nothing was written\n"
    assert digest(src) == before and sorted(p.name for p in tmp_path.iterdir()) == ["src"]
