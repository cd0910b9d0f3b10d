"""The CLI: stdout carries only results, errors are one line with a stable exit code."""
import json
import subprocess
import sys

import numpy as np
import pytest

from gptqfmt.resources import validator
from gptqfmt.runtimes import RUNTIMES
from gptqfmt.safetensors_io import save_file
from tests.support import CKPT, SPECS

FIX = CKPT / "b4-sym-act-gptq-sharded"


def test_text_report(run_cli):
    r = run_cli("inspect", FIX, "-v")
    assert r.exit_code == 0 and r.stderr == ""
    out = r.stdout
    assert out.startswith("OK: the data are gptq, as declared; ")
    assert "declared     gptq " in out and "detected     gptq (confidence 1.00" in out
    assert "bits=4 group_size=32 sym=yes desc_act=yes pack_dtype=int32" in out
    table = out[out.index("\nmodules "):out.index("\nruntimes ")]
    assert table.count("model.layers.0.") == 7
    assert out.splitlines()[-1] == ("OK: 7 modules, 0 errors, 0 warnings, 0 infos; gptq declared "
                                    "and detected")
    # with -v: one row per runtime of the table, in its order
    rows = out[out.index("\nruntimes ") + 1:].splitlines()[2:2 + len(RUNTIMES)]
    assert [r.split()[0] for r in rows] == [x.id for x in RUNTIMES]


def test_json_report_is_one_valid_document(run_cli):
    r = run_cli("inspect", FIX, "--format", "json")
    assert r.exit_code == 0 and r.stderr == ""
    doc = json.loads(r.stdout)
    validator("inspect").validate(doc)
    assert doc["checkpoint_format"]["declared"] == "gptq"


def test_missing_path_exit_2(run_cli, tmp_path):
    r = run_cli("inspect", tmp_path / "nope")
    assert r.exit_code == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "no such file" in r.stderr
    r = run_cli("inspect", tmp_path / "nope", "--format", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 2 and doc["status"] == "error"
    validator("inspect").validate(doc)


def test_corrupt_file_exit_1_with_finding_line(run_cli, tmp_path):
    p = tmp_path / "model.safetensors"
    p.write_bytes((FIX / "model-00001-of-00003.safetensors").read_bytes()[:50])
    r = run_cli("inspect", p)
    assert r.exit_code == 1 and "Traceback" not in r.stdout + r.stderr
    assert r.stdout.splitlines()[1].startswith("model.safetensors: GQ103 header length")
    r = run_cli("inspect", p, "--format", "json")
    doc = json.loads(r.stdout)
    assert doc["status"] == "fail" and doc["findings"][0]["code"] == "GQ103"
    validator("inspect").validate(doc)


def test_gptq_tensors_under_an_awq_label_are_named(run_cli, tmp_path):
    d = tmp_path / "awq"
    d.mkdir()
    (d / "model.safetensors").write_bytes((CKPT / SPECS["gsm1-b4-sym-gptq"].name /
                                           "model.safetensors").read_bytes())
    (d / "quant_config.json").write_text(json.dumps({"w_bit": 4, "q_group_size": 128,
                                                     "zero_point": True, "version": "GEMM"}))
    r = run_cli("inspect", d)
    assert r.exit_code == 1 and "GQ303" in r.stdout and "GPTQ's shapes" in r.stdout
    assert "AutoAWQ" in r.stdout and "quant_config.json" in r.stdout


def test_control_characters_in_names_are_escaped(run_cli, tmp_path):
    name = "evil\x1b[31m\n.qweight"
    save_file({name: np.zeros((4, 32), np.int32), "x\x07": np.zeros(1, np.float16)},
              tmp_path / "model.safetensors")
    r = run_cli("inspect", tmp_path)
    assert "\x1b" not in r.stdout and "\x07" not in r.stdout
    assert "evil\\x1b[31m\\x0a" in r.stdout
    r = run_cli("inspect", tmp_path, "--format", "json")
    assert "\x1b" not in r.stdout
    doc = json.loads(r.stdout)
    assert "x\x07" in doc["other_tensors"]["names"]  # exact name after JSON decoding


def test_internal_error_exit_3_one_line(run_cli, monkeypatch):
    import gptqfmt.ops.inspect as ops  # the command imports it when it runs

    def boom(path):
        raise RuntimeError("simulated")
    monkeypatch.setattr(ops, "inspect_checkpoint", boom)
    r = run_cli("inspect", FIX)
    assert r.exit_code == 3 and r.stdout == ""
    assert r.stderr.startswith("gptqfmt: error: internal error: RuntimeError: simulated")
    assert "Traceback" not in r.stderr


def test_python_m_entry_point():
    r = subprocess.run([sys.executable, "-m", "gptqfmt", "--version"], capture_output=True,
                       text=True, check=True)
    import gptqfmt
    assert r.stdout.strip().endswith(gptqfmt.__version__)


@pytest.mark.parametrize("name", ["b4-sym-noact-gptq_v2-single", "lmhead-b4-sym-gptq_v2"])
def test_exit_codes_follow_error_findings(run_cli, name):
    assert run_cli("inspect", CKPT / name).exit_code == 0


def test_click_usage_errors_still_give_one_json_document(tmp_path):
    r = subprocess.run([sys.executable, "-m", "gptqfmt", "verify", str(FIX), "--format", "json",
                        "--jobs", "0"], capture_output=True, text=True)
    doc = json.loads(r.stdout)
    assert r.returncode == 2 and doc["status"] == "error" and "--jobs" in doc["error"]
    r = subprocess.run([sys.executable, "-m", "gptqfmt", "verify", "--jobs", "0", str(FIX)],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stdout == "" and "Invalid value for '--jobs'" in r.stderr


def run_on_a_terminal(args, env=None):
    """Run gptqfmt with stderr on a pseudo-terminal; returns (exit code, stdout, stderr)."""
    import fcntl
    import os
    import pty
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a real screen
    p = subprocess.Popen([sys.executable, "-m", "gptqfmt", *map(str, args)],
                         stdout=subprocess.PIPE, stderr=slave,
                         env=None if env is None else {**os.environ, **env})
    os.close(slave)
    err = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        err += chunk
    with p.stdout:
        out = p.stdout.read()
    p.wait()
    os.close(master)
    return p.returncode, out.decode(), err.decode(errors="replace")


def test_progress_bars_only_for_a_person(tmp_path):
    # tqdm redraws at most every 0.1 s; with TQDM_MININTERVAL=0 it draws every update, so
    # what the bars show does not depend on timing
    code, out, err = run_on_a_terminal(["convert", FIX, tmp_path / "a"],
                                       env={"TQDM_MININTERVAL": "0"})
    assert code == 0 and "write" in err and "verify" in err and "module" in err
    n_modules = len(json.loads(subprocess.run(
        [sys.executable, "-m", "gptqfmt", "inspect", str(FIX), "--format", "json"],
        capture_output=True, text=True).stdout)["modules"])
    # bars with totals (a percentage and n/total), decimal units
    assert f"{n_modules}/{n_modules}" in err and "100%" in err and "kB/" in err
    assert "write" not in out
    code, out, err = run_on_a_terminal(["convert", FIX, tmp_path / "b", "--format", "json"])
    assert code == 0 and err == "" and json.loads(out)["written"] is True
    code, out, err = run_on_a_terminal(["verify", FIX], env={"TQDM_MININTERVAL": "0"})
    assert code == 0 and "verify: 100%" in err and "kB/" in err  # a total, in decimal units
    code, out, err = run_on_a_terminal(["convert", FIX, tmp_path / "c", "--quiet"])
    assert code == 0 and err == ""
    r = subprocess.run([sys.executable, "-m", "gptqfmt", "convert", str(FIX), str(tmp_path / "d")],
                       capture_output=True, text=True)  # stderr not a terminal
    assert r.returncode == 0 and r.stderr == ""
