"""convert under faults: SIGKILL at random moments leaves SRC intact and no DST."""
import hashlib
import os
import random
import resource
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from gptqfmt.gptq.detect import sym_field
from gptqfmt.gptq.packing import pack
from gptqfmt.safetensors_io import save_file
from tests.conftest import ROOT


def build(d, shards=4, k=2048, n=4096):
    """A ~34 MB symmetric 4-bit gptq checkpoint in `shards` files."""
    d.mkdir()
    rng = np.random.default_rng(0)
    wm = {}
    for s in range(shards):
        t = {}
        for j in range(2):
            p = f"model.layers.{s * 2 + j}.mlp.up_proj"
            t[f"{p}.qweight"] = rng.integers(-2**31, 2**31, (k // 8, n), dtype=np.int64) \
                .astype(np.int32)
            t[f"{p}.qzeros"] = pack(np.full((k // 128, n), sym_field(4, "gptq")), 4, 32, 1)
            t[f"{p}.scales"] = np.full((k // 128, n), 0.01, np.float16)
            t[f"{p}.g_idx"] = (np.arange(k) // 128).astype(np.int32)
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        save_file(t, d / name)
        wm.update({x: name for x in t})
    import json
    (d / "model.safetensors.index.json").write_text(json.dumps({"weight_map": wm}))
    (d / "quantize_config.json").write_text(json.dumps(
        {"bits": 4, "group_size": 128, "sym": True, "desc_act": False,
         "checkpoint_format": "gptq"}))
    (d / "tokenizer.json").write_text("{}")


def digest(d):
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())}


def cmd(src, dst):
    return [sys.executable, "-m", "gptqfmt", "convert", str(src), str(dst), "--quiet"]


@pytest.mark.slow
def test_sigkill_at_random_moments(tmp_path):
    src, dst = tmp_path / "src", tmp_path / "dst"
    build(src)
    before = digest(src)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.perf_counter()
    subprocess.run(cmd(src, tmp_path / "probe"), check=True, env=env)
    full = time.perf_counter() - t0
    rnd = random.Random(1234)
    killed = mid_write = 0
    seen: set[str] = set()
    for trial in range(24):
        p = subprocess.Popen(cmd(src, dst), env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
        if trial % 2:  # any moment of the whole run (start-up, planning, writing, commit)
            time.sleep(rnd.uniform(0.05, full * 0.95))
        else:  # a moment while output is being written: wait for the staging directory
            deadline = time.perf_counter() + 10
            while p.poll() is None and time.perf_counter() < deadline and not any(
                    ".gptqfmt-tmp-" in x.name and x.name not in seen
                    for x in tmp_path.iterdir()):
                time.sleep(0.001)
            time.sleep(rnd.uniform(0, 0.08))
        if p.poll() is None:
            p.send_signal(signal.SIGKILL)
            killed += 1
        p.wait()
        tmps = {x.name for x in tmp_path.iterdir() if ".gptqfmt-tmp-" in x.name}
        mid_write += bool(tmps - seen)  # this run had begun writing its output
        seen |= tmps
        assert digest(src) == before
        if dst.exists():  # committed before the kill: it must be complete and verified
            subprocess.run([sys.executable, "-m", "gptqfmt", "verify", str(dst)], check=True,
                           env=env, stdout=subprocess.DEVNULL)
            subprocess.run(["rm", "-rf", str(dst)], check=True)
    assert killed >= 20 and mid_write >= 8  # many kills landed while output was being written
    subprocess.run(cmd(src, dst), check=True, env=env)  # a new run cleans up after the dead
    assert not [x for x in tmp_path.iterdir() if ".gptqfmt-tmp-" in x.name]
    assert digest(src) == before and dst.is_dir()
    print(f"killed {killed} of 24 runs, {mid_write} while writing")


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


def test_gate_failure_writes_nothing(tmp_path, monkeypatch):
    from gptqfmt.conversion import gate as gate_mod
    from gptqfmt.conversion import run as convert_run
    from gptqfmt.errors import FindingError

    src, dst = tmp_path / "src", tmp_path / "dst"
    build(src, shards=2, k=256, n=256)
    monkeypatch.setattr(convert_run, "check_module", lambda s, o, m, a, b, lossy, rng:
                        gate_mod.check_module(s, o, m, a, a, lossy, rng))  # wrong reading
    with pytest.raises(FindingError) as e:
        convert_run.convert(src, dst)
    assert e.value.finding.code == "GQ503"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


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
    from gptqfmt.conversion.atomic import create
    from gptqfmt.errors import UsageError
    from gptqfmt.conversion import convert

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
    import re
    pkg = ROOT / "gptqfmt"
    bad = re.compile(r"\bpickle\b|torch\.load|allow_pickle\s*=\s*True|np\.load\(|\beval\(")
    hits = [f"{p}:{i}" for p in pkg.rglob("*.py")
            for i, line in enumerate(p.read_text().splitlines(), 1) if bad.search(line)]
    assert hits == []
