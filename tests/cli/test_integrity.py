"""Integrity from the real headers: each fault is one finding at its true cause, nothing cascades
onto the files beside it, and the counts match the index."""
import json
import os
import shutil

import numpy as np
import pytest

from gptqfmt.resources import validator
from tests.support import CKPT, Q, rewrite_tensors

SHARDED = CKPT / "b4-asym-noact-gptq-sharded"
SHARD2 = "model-00002-of-00003.safetensors"


def _copy(tmp_path, src=SHARDED):
    d = tmp_path / "c"
    shutil.copytree(src, d)
    return d


def _json(run_cli, *args):
    r = run_cli(*args, "--format", "json")
    return r.exit_code, json.loads(r.stdout)


def _shard_modules(d, shard):
    weight_map = json.loads((d / "model.safetensors.index.json").read_text())["weight_map"]
    return {t.rsplit(".", 1)[0] for t, s in weight_map.items() if s == shard
            and t.rsplit(".", 1)[1] in ("qweight", "qzeros", "scales")}


@pytest.mark.parametrize("fault", ["truncated", "absent"])
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_a_shard_that_cannot_be_read_is_one_finding_and_counts_match_the_index(
        tmp_path, run_cli, fault, command):
    d = _copy(tmp_path)
    p = d / SHARD2
    if fault == "truncated":
        os.truncate(p, p.stat().st_size - 100)
    else:
        p.unlink()
    code, doc = _json(run_cli, command, d)
    validator("inspect" if command == "inspect" else "report").validate(doc)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    want = ("GQ114", SHARD2) if fault == "truncated" else ("GQ122", "model.safetensors.index.json")
    assert code == 1 and [(f["code"], f["file"]) for f in errors] == [want]
    assert not [f for f in doc["findings"] if f["code"].startswith("GQ3")]
    assert doc["runtimes"] == []            # nothing is said of runtimes on a partial read
    if command == "inspect":
        assert doc["unreadable_files"] == [SHARD2]
        invalid = {m["name"] for m in doc["modules"] if not m["valid"]}
        assert invalid == _shard_modules(d, SHARD2) and len(doc["modules"]) == 7
        text = run_cli("inspect", d).stdout
        assert f"files        3 shards (1 cannot be read: {SHARD2})" in text


def test_one_shard_given_alone_is_sent_to_its_directory(run_cli):
    r = run_cli("inspect", SHARDED / SHARD2)
    first = r.stdout.splitlines()[1]
    assert r.exit_code == 1 and first == (
        f"{SHARDED / SHARD2}: GQ131 shard 2 of 3 that model.safetensors.index.json beside it "
        "names: a module's tensors may sit in the other shards, so it is checked with them, as "
        f"a directory (hint: pass the directory: {SHARDED})")


@pytest.mark.parametrize("role", ["qweight", "scales"])
@pytest.mark.parametrize("command", ["inspect", "verify"])
def test_an_all_zero_tensor_is_one_finding(tmp_path, run_cli, role, command):
    d = _copy(tmp_path, CKPT / "b4-sym-noact-gptq-single")

    def zero(t):
        dtype, a = t[f"{Q}.{role}"]
        t[f"{Q}.{role}"] = (dtype, np.zeros_like(a))
        zero.nbytes = a.nbytes
    rewrite_tensors(d, zero)
    code, doc = _json(run_cli, command, d)
    mine = [f for f in doc["findings"] if f["tensor"] and f["tensor"].startswith(Q + ".")]
    assert code == 1 and [(f["code"], f["tensor"]) for f in mine] == [("GQ318", f"{Q}.{role}")]
    assert mine[0]["message"].startswith(f"all {zero.nbytes} bytes are zero: every ")


def test_a_module_missing_a_tensor_is_one_finding_at_its_module(tmp_path, run_cli):
    d = _copy(tmp_path, CKPT / "b4-sym-noact-gptq-single")
    rewrite_tensors(d, lambda t: t.pop(f"{Q}.qzeros"))
    code, doc = _json(run_cli, "verify", d)
    errors = [(f["code"], f["tensor"]) for f in doc["findings"] if f["severity"] == "error"]
    assert code == 1 and errors == [("GQ301", f"{Q}.qzeros")]


def test_a_shard_of_another_format_that_cannot_be_read_does_not_cascade(tmp_path, run_cli):
    from tests.support import FORMATS
    d = _copy(tmp_path, FORMATS / "ct-b4-sym-g32-sharded")
    os.truncate(d / SHARD2, (d / SHARD2).stat().st_size - 50)
    code, doc = _json(run_cli, "verify", d)
    assert code == 1 and [(f["code"], f["file"]) for f in doc["findings"]] == [("GQ114", SHARD2)]
