"""Process lifecycle of the CLI: SIGINT, SIGTERM and SIGHUP unwind and clean up like Ctrl-C and
exit 128 + n; a closed stdout ends the process quietly with 141.

Signals arrive at named stages through the GPTQFMT_FAULT test hook (gptqfmt/faults.py): the
process sends the signal to itself there, exactly as `kill` would, so no test waits or races.
Each test runs the real CLI as its own process.
"""
import json
import os
import signal
import subprocess
import sys

import pytest

from gptqfmt.resources import validator
from tests.support import CKPT, ROOT, build, digest, staging_dirs

pytestmark = pytest.mark.faults

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENV.pop("GPTQFMT_FAULT", None)
INSPECT_FIX = CKPT / "autogptq-b4-asym-gptq"  # the longest inspect report; findings: exit 1


def gptqfmt(*args, fault=None, **kw):
    env = ENV if fault is None else {**ENV, "GPTQFMT_FAULT": fault}
    return subprocess.run([sys.executable, "-m", "gptqfmt", *map(str, args)], env=env,
                          capture_output=True, text=True, **kw)


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    d = tmp_path_factory.mktemp("ckpt") / "src"
    build(d, shards=3, k=256, n=512)
    return d


# (signal, stage where it arrives, output format, DST existed before (--force))
CONVERT_CASES = [
    (signal.SIGTERM, "mid-shard:1.0", "json", False),
    (signal.SIGTERM, "mid-shard:2.1", "text", True),
    (signal.SIGHUP, "staging-created", "json", False),
    (signal.SIGHUP, "before-gate", "text", False),
    (signal.SIGINT, "gate-module:3", "json", False),
]


@pytest.mark.parametrize("sig, stage, fmt, force", CONVERT_CASES,
                         ids=[f"{s.name}-{st}-{f}{'-force' * fo}"
                              for s, st, f, fo in CONVERT_CASES])
def test_signal_during_convert_cleans_up(src, tmp_path, sig, stage, fmt, force):
    before = digest(src)
    dst = tmp_path / "dst"
    if force:  # an existing DST that --force would replace: it must survive the interruption
        dst.mkdir()
        (dst / "keep.txt").write_text("old output")
    r = gptqfmt("convert", src, dst, "--quiet", "--backend", "cpu", "--format", fmt,
                *["--force"] * force, fault=f"{stage}:{sig.name}")
    assert r.returncode == 128 + sig, r.stderr
    assert staging_dirs(tmp_path) == []  # the 'finally' of the staging directory ran
    assert digest(src) == before
    if force:
        assert sorted(p.name for p in dst.iterdir()) == ["keep.txt"]
    else:
        assert not dst.exists()
    message = f"interrupted by {sig.name}"
    if fmt == "json":
        doc = json.loads(r.stdout)  # exactly one document: a second one would be extra data
        assert doc == {"status": "error", "exit_code": 128 + sig, "findings": [],
                       "error": message}
        validator("convert").validate(doc)
        assert r.stderr == ""
    else:
        assert r.stdout == ""
        assert r.stderr == f"gptqfmt: error: {message}\n"


def test_sigterm_after_the_rename_leaves_a_complete_output(src, tmp_path, run_cli):
    """Past the rename DST is the verified output: it stays, and the exit still says 143."""
    dst = tmp_path / "dst"
    r = gptqfmt("convert", src, dst, "--quiet", "--backend", "cpu", fault="after-rename:TERM")
    assert r.returncode == 143 and r.stderr == "gptqfmt: error: interrupted by SIGTERM\n"
    assert staging_dirs(tmp_path) == []
    assert run_cli("verify", dst).exit_code == 0


@pytest.mark.parametrize("command, sig, fmt, schema", [
    ("verify", signal.SIGINT, "json", "report"),
    ("inspect", signal.SIGTERM, "text", None),
], ids=["verify-SIGINT-json", "inspect-SIGTERM-text"])
def test_signal_around_inspect_and_verify(command, sig, fmt, schema):
    """The `command` stage is in the CLI entry, before the command runs: the signal is reported
    outside a command body, with one JSON document too."""
    r = gptqfmt(command, CKPT / "b4-sym-act-gptq-sharded", "--format", fmt,
                fault=f"command:{sig.name}")
    assert r.returncode == 128 + sig
    if fmt == "json":
        doc = json.loads(r.stdout)
        assert doc == {"status": "error", "exit_code": 128 + sig, "findings": [],
                       "error": f"interrupted by {sig.name}"}
        validator(schema).validate(doc)
        assert r.stderr == ""
    else:
        assert r.stdout == "" and r.stderr == f"gptqfmt: error: interrupted by {sig.name}\n"


def test_a_signal_the_parent_ignores_stays_ignored():
    """nohup sets SIGHUP to be ignored: the hangup must not stop the command."""
    r = gptqfmt("inspect", CKPT / "b4-sym-act-gptq-sharded", fault="command:HUP",
                preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert r.returncode == 0 and r.stdout.startswith("OK: ") and r.stderr == ""


def test_a_second_signal_while_unwinding_ends_the_process_at_once():
    script = "\n".join([
        "import os, signal",
        "from gptqfmt.cli.main import Interrupted, _handle_signals",
        "_handle_signals()",
        "try:",
        "    os.kill(os.getpid(), signal.SIGTERM)",
        "except Interrupted:",
        "    os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C during the cleanup",
        "raise SystemExit(0)",
    ])
    r = subprocess.run([sys.executable, "-c", script], env=ENV, capture_output=True, text=True)
    assert (r.returncode, r.stderr) == (-signal.SIGINT, "")


# ------------------------------------------------------------------ closed stdout (| head -1)
@pytest.mark.parametrize("args", [
    ["inspect", INSPECT_FIX],
    ["inspect", INSPECT_FIX, "--format", "json"],
    ["inspect", CKPT / "no-such-checkpoint", "--format", "json"],  # printed by guarded's error path
    ["inspect", INSPECT_FIX, "--format", "json", "--no-such-option"],  # printed by run()
], ids=["text", "json", "json-error", "json-usage-error"])
def test_closed_stdout_exits_quietly(args):
    """stdout is a pipe whose reader is gone before anything is written: the first write fails
    with EPIPE, every time."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        r = subprocess.run([sys.executable, "-m", "gptqfmt", *map(str, args)], env=ENV,
                           stdout=write_end, stderr=subprocess.PIPE, text=True)
    finally:
        os.close(write_end)
    assert (r.returncode, r.stderr) == (128 + signal.SIGPIPE, "")


# ------------------------------------------------------------------ the hook itself (in-process)
def test_fault_spec_parsing():
    import errno

    from gptqfmt.faults import Fail, _armed, _parse

    assert _parse("mid-shard:2.1:SIGTERM") == ("mid-shard", (2, 1), signal.SIGTERM)
    assert _parse("inplace-range:3:EIO") == ("inplace-range", (3,), Fail(errno.EIO))
    assert _parse("before-rename:enospc") == ("before-rename", (), Fail(errno.ENOSPC))
    hook = _armed("inplace-range:3:EROFS,inplace-rollback:1:EACCES")  # each fires once
    hook("inplace-range", 2)
    for stage, index, code in (("inplace-range", 3, errno.EROFS),
                               ("inplace-rollback", 1, errno.EACCES)):
        with pytest.raises(OSError) as e:
            hook(stage, index)
        assert (e.value.errno, e.value.strerror, e.value.filename) == \
            (code, os.strerror(code), None)  # no file name, as write(2) reports
        hook(stage, index)
    assert _parse("mid-shard:2") == ("mid-shard", (2, 0), signal.SIGKILL)
    assert _parse("gate-module:3:hup") == ("gate-module", (3,), signal.SIGHUP)
    assert _parse("before-rename:INT") == ("before-rename", (), signal.SIGINT)
    assert _parse("before-rename:0:TERM") == ("before-rename", (), signal.SIGTERM)
    for bad in ("no-such-stage", "before-rename:1", "mid-shard:1.2.3", "mid-shard:1:SIGNOPE",
                "mid-shard:1:ENOPE",
                "gate-module:x.1", "before-gate:TERM:extra", "mid-shard:-1"):
        with pytest.raises(ValueError, match="GPTQFMT_FAULT"):
            _parse(bad)


def test_unset_hook_is_a_no_op_and_a_bad_one_is_exit_2(monkeypatch, capsys):
    from gptqfmt import faults
    from gptqfmt.cli import run

    assert faults.point is faults._unset  # the suite runs without GPTQFMT_FAULT
    monkeypatch.setattr(faults, "point", faults._armed("no-such-stage"))
    with pytest.raises(SystemExit) as e:
        run(["inspect", CKPT / "b4-sym-act-gptq-sharded", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert e.value.code == 2 and doc["exit_code"] == 2 and "no-such-stage" in doc["error"]
