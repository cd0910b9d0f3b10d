"""What producers write on purpose is read as their loaders read it, through the CLI: inspect,
verify and convert agree (exit codes, first lines, schema-valid JSON) on auto-round's negative
scales, its symmetric AWQ GEMM export, optimum's contradicting config files, and auto-round's
clamped zero points of 0. The fixtures: make_fixtures.py (autoround-*, optimum-*) and
make_formats.py (autoround-awq-*)."""
from __future__ import annotations

import json
import shutil

import pytest

from gptqfmt.resources import validator
from tests.support import CKPT, FORMATS

SIGNED = CKPT / "autoround-b4-sym-gptq"
AWQ_SYM = FORMATS / "autoround-awq-b4-sym-g32"
CLAMPED = CKPT / "autoround-b2-asym-gptq"
OPTIMUM = CKPT / "optimum-b4-sym-gptq-sharded"


def json_of(run_cli, schema, *args):
    r = run_cli(*args, "--format", "json")
    doc = json.loads(r.stdout)
    validator(schema).validate(doc)
    return r.exit_code, doc


def codes(doc):
    return sorted({f["code"] for f in doc["findings"]})


@pytest.mark.parametrize("path", [SIGNED, AWQ_SYM], ids=["gptq", "awq"])
def test_negative_scales_pass_inspect_verify_and_convert(run_cli, tmp_path, path):
    """inspect said ok while verify and convert refused with GQ501: now all three pass, and
    the converted copy computes what the source computes (verify --against, bitwise)."""
    code, doc = json_of(run_cli, "inspect", "inspect", path)
    assert (code, doc["status"], codes(doc)) == (0, "ok", [])
    code, doc = json_of(run_cli, "report", "verify", path, "--strict")
    assert (code, doc["status"], codes(doc)) == (0, "ok", [])
    text = run_cli("verify", path)
    assert text.exit_code == 0 and text.stdout.splitlines()[-1].startswith("OK: 7 modules, 0 ")
    r = run_cli("convert", path, tmp_path / "out")
    assert r.exit_code == 0, r.stdout + r.stderr
    assert r.stdout.startswith(f"OK: converted {path} (")
    against = run_cli("verify", path, "--against", tmp_path / "out")
    assert against.exit_code == 0, against.stdout


def test_symmetric_awq_gemm_export_is_read_as_awq(run_cli, tmp_path):
    """auto-round's `zero_point: false` + version gemm: AWQ GEMM with the constant zero 8,
    inspected as such and converted into a symmetric gptq_v2 checkpoint (0x88888888 words)."""
    q = json.loads((AWQ_SYM / "config.json").read_text())["quantization_config"]
    assert (q["quant_method"], q["version"], q["zero_point"], q["sym"]) == ("awq", "gemm",
                                                                            False, True)
    text = run_cli("inspect", AWQ_SYM)
    assert text.exit_code == 0
    assert "format       AutoAWQ GEMM (config.json:quantization_config)" in text.stdout
    assert "sym=yes" in text.stdout
    code, doc = json_of(run_cli, "convert", "convert", AWQ_SYM, tmp_path / "o", "--to",
                        "gptq_v2")
    assert code == 0 and doc["status"] == "ok"
    code, doc = json_of(run_cli, "inspect", "inspect", tmp_path / "o")
    assert code == 0 and doc["quantization"]["sym"] is True
    assert {m["zero_point"]["verdict"] for m in doc["modules"]} == {"gptq_v2"}
    assert all("symmetric zero 8 stored as gptq_v2" in m["zero_point"]["evidence"][0]
               for m in doc["modules"])


def test_optimum_contradiction_through_the_cli(run_cli, tmp_path):
    """inspect and verify both report GQ212 (and GQ209); convert resolves it (both keys in
    every file), and so does fix-label."""
    for cmd, schema in (("inspect", "inspect"), ("verify", "report")):
        code, doc = json_of(run_cli, schema, cmd, OPTIMUM)
        assert code == 1 and codes(doc) == ["GQ209", "GQ212"], cmd
    text = run_cli("verify", OPTIMUM)
    first = text.stdout.splitlines()
    assert first[0].startswith("FAIL: format set without checkpoint_format; loaders that read "
                               "only checkpoint_format read gptq (GQ209: ")
    assert first[1].startswith("config.json:quantization_config: GQ209 ")
    assert first[2].startswith("config.json:quantization_config: GQ212 the config files "
                               "declare different conventions")
    assert "gptq_v2 by transformers" in first[2] and "gptq by GPTQModel" in first[2]
    code, doc = json_of(run_cli, "convert", "convert", OPTIMUM, tmp_path / "o")
    assert code == 0
    code, doc = json_of(run_cli, "report", "verify", tmp_path / "o", "--strict")
    assert (code, codes(doc)) == (0, [])
    fixed = tmp_path / "f"
    shutil.copytree(OPTIMUM, fixed)
    assert run_cli("fix-label", fixed).exit_code == 0
    code, doc = json_of(run_cli, "report", "verify", fixed, "--strict")
    assert (code, codes(doc)) == (0, [])


def test_clamped_zeros_are_a_warning_everywhere(run_cli, tmp_path):
    """GQ506 from inspect and verify alike (a warning: exit 0, 1 with --strict); convert
    carries the fields as every runtime reads them (Z = 1), nothing lost that was not already."""
    code, ins = json_of(run_cli, "inspect", "inspect", CLAMPED)
    assert code == 0 and codes(ins) == ["GQ506"]
    code, rep = json_of(run_cli, "report", "verify", CLAMPED)
    assert code == 0 and codes(rep) == ["GQ506"]
    assert [(f["tensor"], f["details"]) for f in ins["findings"]] == \
        [(f["tensor"], f["details"]) for f in rep["findings"]]
    assert run_cli("verify", CLAMPED, "--strict").exit_code == 1
    text = run_cli("verify", CLAMPED)
    assert text.stdout.splitlines()[0].startswith("OK: every check passes (4 warnings)")
    assert text.stdout.splitlines()[1].startswith(
        "model.safetensors::model.layers.0.mlp.gate_proj.qzeros (and 3 more like it): GQ506 ")
    r = run_cli("convert", CLAMPED, tmp_path / "o")
    assert r.exit_code == 0, r.stdout + r.stderr
    assert run_cli("verify", CLAMPED, "--against", tmp_path / "o").exit_code == 0
