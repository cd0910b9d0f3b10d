"""verify on the fixtures: exit codes, text and JSON reports, library calls."""
import json

import pytest

import gptqfmt
from gptqfmt.resources import validator
from tests.support import CKPT, SPECS

CLEAN_FAIL = {  # clean-data fixtures whose labels or writers are wrong on purpose
    "formatonly-b4-asym-gptq_v2": {"GQ209", "GQ401"},
    "optimum-b4-sym-gptq-sharded": {"GQ209", "GQ212"},   # its two files declare two labels
    "autogptq-b4-asym-gptq": {"GQ405"},
    "autogptq-b2-asym-gptq": {"GQ405"},
    "autogptq-b3-asym-act-gptq": {"GQ405"},
    "gptqmodel-b4-asym-gptq": {"GQ405"},
    "gptqmodel603-b3-asym-gptq": {"GQ405"},
    "gptqmodel603-b3-sym-gptq": {"GQ403", "GQ405"},
}


@pytest.mark.parametrize("name", sorted(SPECS))
def test_verify_verdict_and_exit(run_cli, name):
    r = run_cli("verify", CKPT / name, "--format", "json")
    doc = json.loads(r.stdout)
    validator("report").validate(doc)
    errors = {f["code"] for f in doc["findings"] if f["severity"] == "error"}
    if name.startswith("mislabelled"):
        assert errors == {"GQ401"} and r.exit_code == 1
        f = next(f for f in doc["findings"] if f["code"] == "GQ401")
        assert f["details"]["detected"] == SPECS[name].convention
    else:
        assert errors == CLEAN_FAIL.get(name, set())
        assert r.exit_code == (1 if errors else 0)
    assert doc["checkpoint_format"]["detected"] == SPECS[name].convention


def test_gptq_maxq_fields_are_warned_and_strict_fails(run_cli):
    name = "b4-asym-noact-gptq-single"
    r = run_cli("verify", CKPT / name)
    assert r.exit_code == 0 and " GQ406 " in r.stdout
    assert r.stdout.splitlines()[-1].startswith("OK: 7 modules, 0 errors, ")
    assert run_cli("verify", CKPT / name, "--strict").exit_code == 1


def test_text_report_shape(run_cli):
    r = run_cli("verify", CKPT / "mislabelled-b4-sym-v2-as-gptq")
    lines = r.stdout.splitlines()
    assert lines[0] == ("FAIL: declared gptq, the data are gptq_v2: every runtime that reads the "
                        "zero points reads each one off by one")
    assert lines[1].startswith("config.json:quantization_config: GQ401 config declares gptq, "
                               "but the data are gptq_v2")
    assert lines[-1] == ("FAIL: 7 modules, 1 error, 0 warnings, 0 infos; declared gptq, "
                         "detected gptq_v2")
    assert r.stderr == ""


def test_library_calls():
    rep = gptqfmt.validate(CKPT / "mislabelled-b4-sym-gptq-as-v2")
    assert isinstance(rep, gptqfmt.Report) and rep.failed()
    assert [f.code for f in rep.findings] == ["GQ401"]
    det = gptqfmt.detect(CKPT / "b3-asym-act-gptq_v2-sharded")
    assert isinstance(det, gptqfmt.Detection) and det.verdict == "gptq_v2"
    assert all(isinstance(v, gptqfmt.ModuleVerdict) for v in det.modules)


def test_jobs_do_not_change_the_report():
    a = gptqfmt.validate(CKPT / "autogptq-b4-asym-gptq", jobs=1).to_json()
    b = gptqfmt.validate(CKPT / "autogptq-b4-asym-gptq", jobs=4).to_json()
    assert a == b


def test_module_fitting_neither_convention_fails(tmp_path):
    import shutil

    import numpy as np

    from gptqfmt.bits.packing import pack, unpack
    from gptqfmt.safetensors_io import SafetensorsFile, save_file
    name = "b4-asym-noact-gptq_v2-single"
    shutil.copytree(CKPT / name, tmp_path / "c")
    f = SafetensorsFile(CKPT / name / "model.safetensors")
    t = {k: np.array(f.view(k)) for k in f.tensors}
    key = "model.layers.0.mlp.down_proj.qzeros"
    z = unpack(t[key], 4, axis=1).astype(np.int64)
    t[key] = pack(np.clip(z + 3, 0, 15), 4, 32, axis=1)  # every zero point 3 too high
    save_file(t, tmp_path / "c" / "model.safetensors", f.metadata)
    rep = gptqfmt.validate(tmp_path / "c")
    assert rep.failed() and [x.tensor for x in rep.findings if x.code == "GQ412"] == [key]
