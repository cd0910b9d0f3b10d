"""The one open (gptqfmt/formats/open.py): every format fixture is read in its format by inspect
and verify, a stray config does not change what a checkpoint is, and tensors without the
config their format needs are refused."""
from __future__ import annotations

import json
import shutil

import pytest

from gptqfmt.errors import FindingError
from gptqfmt.formats.open import open_labelled
from gptqfmt.ops.inspect import inspect_checkpoint
from gptqfmt.ops.verify import validate
from gptqfmt.resources import validator
from tests.support import CKPT, FORMATS, ct_copy

FMANIFEST = json.loads((FORMATS / "manifest.json").read_text())


@pytest.mark.parametrize("name", sorted(FMANIFEST))
def test_inspect_and_verify_read_every_format_fixture(name):
    truth = FMANIFEST[name]
    r = inspect_checkpoint(FORMATS / name)
    doc = r.to_json()
    assert not list(validator("inspect").iter_errors({**doc, "exit_code": int(not r.ok)}))
    assert doc["format"] == ("awq" if truth["params"]["layout"] == "awq"
                             else "compressed-tensors")
    mods = {m["name"]: m for m in doc["modules"]}
    assert set(mods) == set(truth["modules"])
    for n, t in truth["modules"].items():
        assert (mods[n]["bits"], mods[n]["in_features"], mods[n]["out_features"],
                mods[n]["groups"], mods[n]["desc_act"]) == \
            (t["bits"], t["in_features"], t["out_features"], t["groups"], t["act_order"])
    rep = validate(FORMATS / name)
    assert not list(validator("report").iter_errors({**rep.to_json(),
                                                     "exit_code": int(rep.failed())}))
    codes = sorted({f.code for f in rep.findings})
    assert codes == (["GQ418"] if truth["params"]["clamp"] else []) + \
        (["GQ320"] if truth["params"]["packing"] == "padded" else []), codes
    assert r.ok is not truth["params"]["clamp"]
    if truth["params"]["layout"] == "ct":   # the layout its shapes show, in both documents
        want = truth["params"]["packing"] if truth["params"]["bits"] == 3 else "either"
        assert doc["quantization"]["pack_layout"]["layout"] == want
        assert rep.to_json()["pack_layout"]["layout"] == want


def test_a_stray_gptq_config_does_not_turn_gptq_into_awq(tmp_path):
    d = tmp_path / "g"
    shutil.copytree(CKPT / "b4-asym-noact-gptq_v2-single", d)
    (d / "quant_config.json").write_text(json.dumps({"w_bit": 4, "q_group_size": 32,
                                                     "zero_point": True, "version": "GEMM"}))
    with pytest.raises(FindingError) as e:   # read as GPTQ, whose loader names the stray file
        inspect_checkpoint(d)
    f = e.value.findings[0]
    assert f.code == "GQ203" and f.file == "quant_config.json" and "stray" in f.hint


def test_symmetric_awq_config_without_quant_method_is_sniffed_as_awq(tmp_path):
    """A config that names AWQ by its keys alone (no quant_method): zero_point false beside
    version gemm is AWQ's GEMM layout with symmetric zeros, not another format."""
    d = tmp_path / "a"
    shutil.copytree(FORMATS / "autoround-awq-b4-sym-g32", d)
    doc = json.loads((d / "config.json").read_text())
    del doc["quantization_config"]["quant_method"]
    (d / "config.json").write_text(json.dumps(doc))
    r = inspect_checkpoint(d)
    assert r.source.format == "awq" and r.findings == [] and r.ok


def test_ct_tensors_without_a_config_are_refused(tmp_path):
    d = ct_copy(tmp_path)
    (d / "config.json").unlink()
    with pytest.raises(FindingError) as e:
        validate(d)
    assert e.value.findings[0].code == "GQ210" and "no config" in e.value.findings[0].message


@pytest.mark.parametrize(("name", "configs"), [
    ("ct-b4-asym-g32", True), ("ct-b4-asym-g32", False),
    ("awq-b4-g32", True), ("awq-b4-g32", False)])
def test_a_gptq_only_command_refuses_another_format_with_gq203(tmp_path, name, configs):
    """fix-label, verify --reference and convert --in-place read a label's zero points: another
    format is refused before its reader is built, naming the config that says what it is or,
    without one, the format its tensors show."""
    d = tmp_path / name
    shutil.copytree(FORMATS / name, d)
    if not configs:
        for f in ("config.json", "quant_config.json", "quantize_config.json"):
            (d / f).unlink(missing_ok=True)
    with pytest.raises(FindingError) as e:
        open_labelled(d)
    (f,) = e.value.findings
    fmt = "awq" if name.startswith("awq") else "compressed-tensors"
    assert f.code == "GQ203"
    if configs:
        assert f.file == "config.json:quantization_config"
        assert f"quant_method is '{fmt}'" in f.message
    else:
        assert f.file is None and f"stored as {fmt} (no config says so)" in f.message
