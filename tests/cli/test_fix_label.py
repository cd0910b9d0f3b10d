"""`gptqfmt fix-label`: only the label keys change, atomically, each refusal writes nothing, and
interruptions (driven through the GPTQFMT_FAULT hook, never a timer) leave every config whole."""
import json
import os
import shutil
import signal
import subprocess
import sys

import pytest

from gptqfmt.resources import validator
from tests.support import CKPT, FIXTURES, ROOT, TMP_TAG, digest

MISLABELLED = CKPT / "mislabelled-b4-sym-v2-as-gptq"   # gptq_v2 data labelled gptq
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENV.pop("GPTQFMT_FAULT", None)


def copy(src, tmp_path, name="ckpt"):
    dst = tmp_path / name
    shutil.copytree(src, dst)
    return dst


def tensors_digest(d):
    return {p.name: p.read_bytes() for p in sorted(d.glob("*.safetensors"))}


def gptqfmt(*args, fault=None):
    env = ENV if fault is None else {**ENV, "GPTQFMT_FAULT": fault}
    return subprocess.run([sys.executable, "-m", "gptqfmt", *map(str, args)], env=env,
                          capture_output=True, text=True)


def test_relabels_only_the_label_keys_and_verifies(run_cli, tmp_path):
    d = copy(MISLABELLED, tmp_path)
    before_cfg = json.loads((d / "config.json").read_text())
    before_q = json.loads((d / "quantize_config.json").read_text())
    tensors = tensors_digest(d)
    r = run_cli("fix-label", "--format", "json", "--quiet", d)
    doc = json.loads(r.stdout)
    validator("fix_label").validate(doc)
    assert r.exit_code == 0 and doc["status"] == "ok" and doc["to"] == "gptq_v2"
    assert sorted(doc["written"]) == ["config.json", "quantize_config.json"]
    assert {(c["file"], c["key"], c["old"], c["new"]) for c in doc["changes"]} == {
        (f, k, "gptq", "gptq_v2") for f in ("config.json", "quantize_config.json")
        for k in ("checkpoint_format", "format")}
    assert doc["verify"]["status"] == "ok" and not [
        f for f in doc["verify"]["findings"] if f["code"] == "GQ401"]
    assert tensors_digest(d) == tensors  # no tensor touched
    after_q = json.loads((d / "quantize_config.json").read_text())
    assert list(after_q) == list(before_q)  # key order kept (meta was last already)
    for k, v in before_q.items():
        if k in ("checkpoint_format", "format"):
            assert after_q[k] == "gptq_v2"
        elif k == "meta":
            assert {**v, "gptqfmt": after_q["meta"]["gptqfmt"]} == after_q["meta"]
        else:
            assert after_q[k] == v
    assert after_q["meta"]["gptqfmt"] == {
        "tool": "gptqfmt", "version": after_q["meta"]["gptqfmt"]["version"],
        "command": "fix-label", "from": "gptq", "to": "gptq_v2",
        "previous": {"checkpoint_format": "gptq", "format": "gptq"}}
    after_cfg = json.loads((d / "config.json").read_text())
    assert {k: v for k, v in after_cfg.items() if k != "quantization_config"} == \
        {k: v for k, v in before_cfg.items() if k != "quantization_config"}
    assert after_cfg["quantization_config"]["checkpoint_format"] == "gptq_v2"
    assert not list(d.glob(f".*{TMP_TAG}*"))
    # and verify agrees on its own
    assert run_cli("verify", "--quiet", d).exit_code == 0


def test_dry_run_writes_nothing(run_cli, tmp_path):
    d = copy(MISLABELLED, tmp_path)
    before = digest(d)
    r = run_cli("fix-label", "--dry-run", d)
    assert r.exit_code == 0 and digest(d) == before
    assert "quantize_config.json: would set checkpoint_format gptq -> gptq_v2" in r.stdout
    assert "nothing written (--dry-run)" in r.stdout


def test_a_right_label_is_left_alone(run_cli, tmp_path):
    d = copy(CKPT / "b4-asym-noact-gptq_v2-single", tmp_path)
    before = digest(d)
    r = run_cli("fix-label", "--quiet", "--format", "json", d)
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["changes"] == [] and doc["written"] == []
    assert digest(d) == before


def test_a_format_only_label_gets_checkpoint_format(run_cli, tmp_path):
    """format says gptq_v2 but checkpoint_format is missing (GQ209: vLLM reads gptq)."""
    d = copy(CKPT / "formatonly-b4-asym-gptq_v2", tmp_path)
    r = run_cli("fix-label", "--quiet", "--format", "json", d)
    doc = json.loads(r.stdout)
    assert r.exit_code == 0
    assert {(c["key"], c["old"]) for c in doc["changes"]} == {("checkpoint_format", None)}
    assert json.loads((d / "quantize_config.json").read_text())["checkpoint_format"] == "gptq_v2"


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_to_that_the_data_contradict_is_refused(run_cli, tmp_path, fmt):
    d = copy(MISLABELLED, tmp_path)
    before = digest(d)
    r = run_cli("fix-label", "--to", "gptq", "--format", fmt, d)
    assert r.exit_code == 1 and digest(d) == before
    if fmt == "json":
        doc = json.loads(r.stdout)
        validator("fix_label").validate(doc)
        assert [f["code"] for f in doc["findings"]] == ["GQ417"] and doc["to"] is None
        assert doc["verify"] is None and doc["status"] == "fail"
    else:
        assert "GQ417 --to gptq, but the data are gptq_v2" in r.stdout
        assert "(hint: run with --to gptq_v2" in r.stdout
        assert r.stdout.splitlines()[-1] == \
            "FAIL: 7 modules, 1 error, 0 warnings, 0 infos; nothing written (detected gptq_v2)"


def test_undecidable_data_are_refused_unless_named(run_cli, tmp_path):
    d = copy(FIXTURES / "invalid" / "modules-disagree", tmp_path)
    before = digest(d)
    r = run_cli("fix-label", "--format", "json", d)
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and [f["code"] for f in doc["findings"]] == ["GQ416"]
    assert "--to gptq" in doc["findings"][0]["hint"] and digest(d) == before
    # named: written (the data cannot contradict), then verify still fails on the mixture
    r = run_cli("fix-label", "--to", "gptq", "--quiet", "--format", "json", d)
    doc = json.loads(r.stdout)
    validator("fix_label").validate(doc)
    assert doc["written"] and r.exit_code == 1 and doc["verify"]["status"] == "fail"


def test_hugging_face_cache_snapshot_is_refused(run_cli, tmp_path):
    """snapshots/<rev>/ holds links into blobs/, shared by every revision."""
    repo = tmp_path / "models--org--name"
    blobs, snap = repo / "blobs", repo / "snapshots" / "abc123"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for p in sorted(MISLABELLED.iterdir()):
        blob = blobs / f"sha-{p.name}"
        shutil.copyfile(p, blob)
        (snap / p.name).symlink_to(os.path.relpath(blob, snap))
    before = digest(blobs)
    for fmt in ("text", "json"):
        r = run_cli("fix-label", "--format", fmt, snap)
        assert r.exit_code == 2 and digest(blobs) == before
        text = json.loads(r.stdout)["error"] if fmt == "json" else r.stderr
        assert "symbolic link" in text and "cp -rL" in text and "shared" in text
    assert all(p.is_symlink() for p in snap.iterdir())
    # verify's hint names the copy first, with the user's snapshot path, and the copy works
    hint = json.loads(run_cli("verify", snap, "--format", "json").stdout)["findings"][0]["hint"]
    command = f"cp -rL {snap} ./name && gptqfmt fix-label ./name"
    assert hint.startswith(f"`{command}` sets checkpoint_format")
    shutil.copytree(snap, tmp_path / "name", symlinks=False)
    assert run_cli("fix-label", tmp_path / "name").exit_code == 0
    assert digest(blobs) == before


def test_no_config_file_is_a_usage_error(run_cli, tmp_path):
    d = copy(FIXTURES / "invalid" / "no-config-at-all", tmp_path)
    r = run_cli("fix-label", "--format", "json", d)
    doc = json.loads(r.stdout)
    validator("fix_label").validate(doc)
    assert r.exit_code == 2 and "no config file holds a quantization config" in doc["error"]


def test_missing_path_is_a_usage_error(run_cli, tmp_path):
    r = run_cli("fix-label", tmp_path / "nope")
    assert r.exit_code == 2 and r.stdout == ""


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only directories")
def test_unwritable_directory_is_an_output_error(run_cli, tmp_path):
    d = copy(MISLABELLED, tmp_path)
    before = digest(d)
    d.chmod(0o555)
    try:
        r = run_cli("fix-label", "--format", "json", d)
    finally:
        d.chmod(0o755)
    assert r.exit_code == 2 and json.loads(r.stdout)["error"] == (
        f"{d / 'quantize_config.json'}: cannot write: Permission denied; nothing was changed; "
        f"once that is fixed, run gptqfmt fix-label {d}")
    assert digest(d) == before


# (fault through the hook, `stage:ERRNO`: that I/O step fails with that errno; the file named;
# its cause; the configs it leaves rewritten)
IO_ERRORS = [
    ("relabel-new:0:EROFS", "quantize_config.json", "Read-only file system", []),
    ("relabel-new:1:ENOSPC", "config.json", "No space left on device", []),
    ("relabel-staged:0:EACCES", "quantize_config.json", "Permission denied", []),
    ("relabel-staged:1:ENOENT", "config.json", "No such file or directory", []),
    ("relabel-renamed:0:EIO", "quantize_config.json", "Input/output error",
     ["quantize_config.json"]),
]


@pytest.mark.parametrize("fault,file,cause,rewritten", IO_ERRORS,
                         ids=[e[0] for e in IO_ERRORS])
def test_an_io_error_is_one_line_and_says_what_it_left(run_cli, tmp_path, monkeypatch, fault,
                                                       file, cause, rewritten):
    from gptqfmt import faults

    d = copy(MISLABELLED, tmp_path)
    monkeypatch.setattr(faults, "point", faults._armed(fault))
    r = run_cli("fix-label", d)
    monkeypatch.setattr(faults, "point", faults._unset)
    done = ("quantize_config.json rewritten, config.json not" if rewritten else
            "nothing was changed")
    assert (r.exit_code, r.stdout) == (2, "")
    assert r.stderr == (f"gptqfmt: error: {d / file}: cannot write: {cause}; {done}; once "
                        f"that is fixed, run gptqfmt fix-label {d}\n")
    after = digest(d)  # every file: no staged copy is left
    assert {n for n in after if after[n] != digest(MISLABELLED).get(n)} == set(rewritten)
    if rewritten:  # config.json (what runtimes read first) still old; the rerun finishes it
        r = run_cli("fix-label", "--quiet", d)
        assert r.exit_code == 0, r.output
        assert json.loads((d / "config.json").read_text())["quantization_config"][
            "checkpoint_format"] == "gptq_v2"
    v = run_cli("verify", "--format", "json", d)
    assert not [f for f in json.loads(v.stdout)["findings"] if f["code"].startswith("GQ42")]


@pytest.mark.faults
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_staging_leaves_every_config_as_it_was(tmp_path, sig):
    d = copy(MISLABELLED, tmp_path)
    before = digest(d)
    r = gptqfmt("fix-label", "--quiet", d, fault=f"relabel-staged:1:{sig.name}")
    assert r.returncode == 128 + sig, r.stderr
    assert digest(d) == before and not list(d.glob(f".*{TMP_TAG}*"))


@pytest.mark.faults
def test_a_kill_while_staging_leaves_the_configs_and_the_next_run_cleans_up(tmp_path):
    d = copy(MISLABELLED, tmp_path)
    r = gptqfmt("fix-label", "--quiet", d, fault="relabel-staged:0")
    assert r.returncode == -signal.SIGKILL
    stale = list(d.glob(f".*{TMP_TAG}*"))
    assert len(stale) == 1
    assert {p.name: b for p, b in ((p, p.read_bytes()) for p in sorted(d.iterdir()))
            if p not in stale} == {p.name: (MISLABELLED / p.name).read_bytes()
                                   for p in sorted(MISLABELLED.iterdir())}
    r = gptqfmt("fix-label", "--quiet", d)
    assert r.returncode == 0, r.stdout + r.stderr
    assert not list(d.glob(f".*{TMP_TAG}*"))


@pytest.mark.faults
def test_a_signal_between_renames_keeps_config_json_old_until_the_end(tmp_path):
    """config.json (what vLLM, transformers and SGLang read) is renamed last: stopped after the
    first rename, runtimes still see one consistent old label there, and a rerun finishes."""
    d = copy(MISLABELLED, tmp_path)
    old_cfg = (d / "config.json").read_bytes()
    r = gptqfmt("fix-label", "--quiet", d, fault="relabel-renamed:0:SIGTERM")
    assert r.returncode == 143
    assert (d / "config.json").read_bytes() == old_cfg
    assert json.loads((d / "quantize_config.json").read_text())["checkpoint_format"] == "gptq_v2"
    assert not list(d.glob(f".*{TMP_TAG}*"))
    r = gptqfmt("fix-label", "--quiet", d)
    assert r.returncode == 0
    assert json.loads((d / "config.json").read_text())["quantization_config"][
        "checkpoint_format"] == "gptq_v2"


def gptqmodel_verdict(run_cli, d):
    """verify --runtime gptqmodel: (exit code, GPTQModel's runtimes entry, the findings)."""
    r = run_cli("verify", "--quiet", "--format", "json", "--runtime", "gptqmodel", d)
    doc = json.loads(r.stdout)
    validator("report").validate(doc)
    return r.exit_code, {e["id"]: e for e in doc["runtimes"]}["gptqmodel"], doc["findings"]


def test_autogptq_is_marlin_format_is_removed_and_gptqmodel_then_loads(run_cli, tmp_path):
    """AutoGPTQ 0.7.1 writes is_marlin_format: false; GPTQModel >= 6.0 refuses the key by
    name. fix-label removes it from every config, records the removal, and GPTQModel's
    verdict becomes loads and decodes right."""
    d = copy(CKPT / "autogptq-b4-sym-gptq", tmp_path)
    code, entry, findings = gptqmodel_verdict(run_cli, d)
    assert code == 1 and entry["loads"] is False
    assert [(x["rule"], x["found"]) for x in entry["rules_failed"]] == [
        ("no_is_marlin_format", "quantize_config.json carries is_marlin_format (refused by "
                                "name since GPTQModel 6.0)")]
    assert [f["code"] for f in findings if f["code"] == "GQ601"] == ["GQ601"]
    assert "gptqfmt fix-label PATH" in next(f["hint"] for f in findings if f["code"] == "GQ601")
    before_q = json.loads((d / "quantize_config.json").read_text())
    tensors = tensors_digest(d)

    r = run_cli("fix-label", "--format", "json", "--quiet", d)
    doc = json.loads(r.stdout)
    validator("fix_label").validate(doc)
    assert r.exit_code == 0 and doc["to"] == "gptq"
    assert [(c["file"], c["key"], c["old"], c["new"]) for c in doc["changes"]
            if c["new"] is None] == [("quantize_config.json", "is_marlin_format", "false", None),
                                     ("config.json", "is_marlin_format", "false", None)]
    assert tensors_digest(d) == tensors
    after_q = json.loads((d / "quantize_config.json").read_text())
    after_c = json.loads((d / "config.json").read_text())["quantization_config"]
    assert "is_marlin_format" not in after_q and "is_marlin_format" not in after_c
    for q in (after_q, after_c):
        assert q["meta"]["gptqfmt"]["removed"] == {"is_marlin_format": False}
        assert q["meta"]["gptqfmt"]["from"] is None   # no label before
        assert q["meta"]["gptqfmt"]["previous"] == {"checkpoint_format": None, "format": None}
    # every other key as it was, in its order
    assert [k for k in after_q if k not in ("checkpoint_format", "format", "meta")] == \
        [k for k in before_q if k != "is_marlin_format"]

    code, entry, findings = gptqmodel_verdict(run_cli, d)
    assert code == 0 and entry["loads"] is True and entry["decodes_correctly"] is True
    assert entry["rules_failed"] == [] and not [f for f in findings if f["code"] == "GQ601"]


def test_a_right_label_carrying_is_marlin_format_is_still_rewritten(run_cli, tmp_path):
    """The label is right, so only the key GPTQModel refuses changes: one change, one file."""
    d = copy(CKPT / "b4-asym-noact-gptq_v2-single", tmp_path)
    q = json.loads((d / "quantize_config.json").read_text())
    (d / "quantize_config.json").write_text(json.dumps({**q, "is_marlin_format": False}))
    assert gptqmodel_verdict(run_cli, d)[1]["loads"] is False

    dry = run_cli("fix-label", "--dry-run", d)
    assert dry.exit_code == 0
    assert ("quantize_config.json: would remove is_marlin_format (false; GPTQModel 6.0 and "
            "later refuse the key)") in dry.stdout.splitlines()
    assert "every config already says so" not in dry.stdout

    r = run_cli("fix-label", "--quiet", "--format", "json", d)
    doc = json.loads(r.stdout)
    validator("fix_label").validate(doc)
    assert r.exit_code == 0 and doc["written"] == ["quantize_config.json"]
    assert doc["changes"] == [{"file": "quantize_config.json", "key": "is_marlin_format",
                               "old": "false", "new": None}]
    after = json.loads((d / "quantize_config.json").read_text())
    assert {k: v for k, v in after.items() if k != "meta"} == \
        {k: v for k, v in q.items() if k != "meta"}
    assert after["meta"]["gptqfmt"]["removed"] == {"is_marlin_format": False}
    assert after["meta"]["gptqfmt"]["from"] == "gptq_v2"
    assert after["meta"]["gptqfmt"]["previous"] == {}
    entry = gptqmodel_verdict(run_cli, d)[1]
    assert entry["loads"] is True and entry["decodes_correctly"] is True
    # and then there is nothing left to do
    again = json.loads(run_cli("fix-label", "--quiet", "--format", "json", d).stdout)
    assert again["changes"] == [] and again["written"] == []


def test_config_files_that_disagree_take_the_datas_value(run_cli, tmp_path):
    """config.json says 8 bits, quantize_config.json 4, the shapes 4: GQ205's hint names
    fix-label with the path, and fix-label writes 4 where the files said otherwise."""
    d = copy(FIXTURES / "invalid" / "config-files-disagree", tmp_path)
    before = json.loads(run_cli("verify", "--format", "json", d).stdout)
    [f205] = [f for f in before["findings"] if f["code"] == "GQ205"]
    assert f"`gptqfmt fix-label {d}` sets bits" in f205["hint"]
    r = run_cli("fix-label", "--quiet", "--format", "json", d)
    doc = json.loads(r.stdout)
    validator("fix_label").validate(doc)
    assert r.exit_code == 0
    assert doc["changes"] == [{"file": "config.json", "key": "bits", "old": "8", "new": "4"}]
    assert json.loads((d / "config.json").read_text())["quantization_config"]["bits"] == 4
    assert run_cli("verify", d).exit_code == 0


@pytest.mark.parametrize("src, key, wrong, right", [
    # act-order data (a g_idx that reorders): desc_act must be true
    ("b4-asym-act-gptq_v2-single", "desc_act", False, True),
    # asymmetric zero points: sym true would let Marlin drop them
    ("b4-asym-noact-gptq_v2-single", "sym", True, False),
    # symmetric zero points: sym true is what the data are
    ("b4-sym-noact-gptq_v2-single", "sym", False, True),
])
def test_a_disputed_key_is_set_from_the_data(run_cli, tmp_path, src, key, wrong, right):
    d = copy(CKPT / src, tmp_path)
    cfg = json.loads((d / "config.json").read_text()) if (d / "config.json").exists() else {}
    q = json.loads((d / "quantize_config.json").read_text())
    assert q[key] == right
    cfg["quantization_config"] = {**q, key: wrong}
    (d / "config.json").write_text(json.dumps(cfg))
    assert "GQ205" in run_cli("verify", d).stdout
    r = run_cli("fix-label", "--quiet", "--format", "json", d)
    assert r.exit_code == 0, r.stdout
    assert json.loads(r.stdout)["changes"] == [
        {"file": "config.json", "key": key, "old": json.dumps(wrong), "new": json.dumps(right)}]
    assert json.loads((d / "config.json").read_text())["quantization_config"][key] is right
    assert json.loads((d / "quantize_config.json").read_text())[key] is right
    assert "GQ205" not in run_cli("verify", d).stdout


def test_a_missing_desc_act_is_written_false_where_no_g_idx_reorders(run_cli, tmp_path):
    """vLLM refuses a config without desc_act; the data say it (no g_idx reorders), so
    fix-label writes false, and vLLM then loads the checkpoint."""
    d = copy(CKPT / "rt-nodescact-b4-sym-gptq", tmp_path)
    assert run_cli("verify", d, "--runtime", "vllm").exit_code == 1
    doc = json.loads(run_cli("fix-label", "--quiet", "--format", "json", d).stdout)
    assert {(c["key"], c["old"], c["new"]) for c in doc["changes"]} == {("desc_act", None,
                                                                        "false")}
    for name in ("quantize_config.json", "config.json"):
        if (d / name).exists():
            q = json.loads((d / name).read_text())
            assert q.get("quantization_config", q)["desc_act"] is False
    assert run_cli("verify", d, "--runtime", "vllm").exit_code == 0
