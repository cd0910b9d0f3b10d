"""`verify --runtime ID`: the runtimes section in inspect's and verify's reports, the gate's
findings (GQ601-GQ607) with the failing rule, its source and the next step, and its usage."""
import json

import pytest

from gptqfmt import runtimes as rt
from gptqfmt.resources import validator
from tests.support import CKPT


def test_runtimes_section_is_in_both_reports_and_valid(run_cli):
    for cmd, schema in (("inspect", "inspect"), ("verify", "report")):
        r = run_cli(cmd, "--format", "json", CKPT / "mislabelled-marlin-b4-sym-v2-as-gptq")
        doc = json.loads(r.stdout)
        validator(schema).validate(doc)
        assert [e["id"] for e in doc["runtimes"]] == [x.id for x in rt.RUNTIMES]
        e = {x["id"]: x for x in doc["runtimes"]}["exllamav2"]
        assert e["decodes_correctly"] is False and e["modules_affected"] == 7
        assert (e["max_weight_change"] is None) == (cmd == "inspect")


@pytest.mark.parametrize("name, ids, code, codes", [
    ("b4-asym-noact-gptq-single", "vllm", 1, {"GQ601"}),
    ("b4-asym-act-gptq-single", "vllm-gptq-gemm", 1, {"GQ604"}),
    # AutoGPTQ decodes right at decoding batch sizes; its prefill path (cuda-torch) would not
    ("b4-asym-act-gptq-single", "tgi,autogptq", 0, {"GQ606"}),
    ("b4-asym-act-gptq-single", "gptqmodel", 1, {"GQ605", "GQ606"}),
    ("mislabelled-b4-sym-v2-as-gptq", "exllamav2", 1, {"GQ401", "GQ602"}),
    ("b8-sym-noact-gptq-single", "autogptq", 1, {"GQ605", "GQ606"}),
    ("rt-marlin-b4-sym-gptq_v2", "vllm,sglang,transformers", 0, set()),
    # TGI ignores the label: right on Marlin, its exllamav2 and triton paths read gptq_v2 wrong
    ("rt-marlin-b4-sym-gptq_v2", "tgi", 0, {"GQ606"}),
    ("mislabelled-marlin-b4-sym-v2-as-gptq", "vllm", 1, {"GQ401"}),
    ("mislabelled-marlin-b4-sym-v2-as-gptq", "vllm-gptq-gemm", 1, {"GQ401", "GQ606"}),
])
def test_verify_runtime_gate(run_cli, name, ids, code, codes):
    r = run_cli("verify", "--quiet", "--format", "json", "--runtime", ids, CKPT / name)
    doc = json.loads(r.stdout)
    validator("report").validate(doc)
    assert r.exit_code == code, r.stdout
    got = {f["code"] for f in doc["findings"] if f["code"] >= "GQ600" or f["code"] == "GQ401"}
    assert got == codes
    for f in doc["findings"]:
        if f["code"] >= "GQ600":
            assert f["details"]["runtime"] in ids.split(",")


def test_verify_runtime_names_the_failing_rule_and_its_source(run_cli):
    r = run_cli("verify", "--quiet", "--format", "json", "--runtime", "vllm",
                CKPT / "b3-asym-act-gptq-single")
    f = next(f for f in json.loads(r.stdout)["findings"] if f["code"] == "GQ601")
    rules = {x["rule"]: x for x in f["details"]["rules_failed"]}
    assert {"bits", "sym", "desc_act_grouped"} <= rules.keys()
    assert rules["bits"]["found"] == "bits is 3" and "auto_gptq.py" in rules["bits"]["source"]
    assert "compressed-tensors" in f["hint"]


def test_verify_runtime_text_shows_the_hint(run_cli):
    r = run_cli("verify", "--quiet", "--runtime", "vllm", CKPT / "b4-asym-noact-gptq-single")
    assert r.exit_code == 1
    line = next(x for x in r.stdout.splitlines() if "GQ601" in x)
    assert "would not load it: sym is false" in line and "(hint: next step:" in line


@pytest.mark.parametrize("arg, fmt", [("nope", "text"), ("vllm,,x", "json"), (",", "text")])
def test_verify_runtime_unknown_id_is_a_usage_error(run_cli, arg, fmt):
    r = run_cli("verify", "--format", fmt, "--runtime", arg, CKPT / "b4-sym-noact-gptq-single")
    assert r.exit_code == 2
    if fmt == "json":
        doc = json.loads(r.stdout)
        assert doc["exit_code"] == 2 and "known: vllm, vllm-gptq-gemm" in doc["error"]
    else:
        assert r.stdout == "" and "--runtime" in r.stderr


def test_verify_runtime_all_and_inapplicable_modes(run_cli):
    r = run_cli("verify", "--quiet", "--format", "json", "--runtime", "all",
                CKPT / "rt-marlin-b4-sym-gptq_v2")
    doc = json.loads(r.stdout)
    named = {f["details"]["runtime"] for f in doc["findings"] if f["code"] >= "GQ600"}
    assert "autogptq" in named and "vllm" not in named
    r = run_cli("verify", "--runtime", "vllm", "--against", CKPT / "b4-sym-noact-gptq-single",
                CKPT / "b4-sym-noact-gptq-single")
    assert r.exit_code == 2 and "--runtime does not apply" in r.stderr


def test_marlin_ignoring_non_constant_zeros_is_gq603(run_cli):
    """sym: true over zero points that are not 8: GPTQModel takes Marlin, which decodes with 8."""
    from tests.support import FIXTURES
    r = run_cli("verify", "--quiet", "--format", "json", "--runtime", "gptqmodel",
                FIXTURES / "invalid" / "sym-true-with-asymmetric-zeros")
    doc = json.loads(r.stdout)
    f = next(f for f in doc["findings"] if f["code"] == "GQ603")
    assert r.exit_code == 1 and f["details"]["kernel"] == "marlin"
    assert f["details"]["zero_cells_affected"] > 0 and f["details"]["max_weight_change"] > 0
    assert "marlin ignores qzeros" in f["message"] and "sym=false" in f["hint"]


def test_gptqmodel_refuses_autogptqs_is_marlin_format_by_name(run_cli):
    """AutoGPTQ 0.7.1's configs carry is_marlin_format: false; GPTQModel >= 6.0 refuses the
    key before anything else (its config is parsed first), here beside the asymmetric-v1 rule.
    transformers builds GPTQConfig(**quantization_config), whose __init__ keeps no unknown key
    (transformers 5.24.0 utils/quantization_config.py L682-730), so it loads."""
    d = CKPT / "autogptq-b4-asym-gptq"
    r = run_cli("inspect", "--format", "json", d)
    doc = json.loads(r.stdout)
    validator("inspect").validate(doc)
    entries = {e["id"]: e for e in doc["runtimes"]}
    g = entries["gptqmodel"]
    assert g["loads"] is False and g["kernel"] is None
    assert [x["rule"] for x in g["rules_failed"]] == ["no_is_marlin_format", "asym_v1_quantizer"]
    assert g["reasons"][0] == ("quantize_config.json carries is_marlin_format (refused by name "
                               "since GPTQModel 6.0) (needs no is_marlin_format key in the "
                               "config it reads)")
    assert entries["transformers"]["loads"] is True

    r = run_cli("verify", "--quiet", "--format", "json", "--runtime", "gptqmodel", d)
    doc = json.loads(r.stdout)
    validator("report").validate(doc)
    gq601 = [f for f in doc["findings"] if f["code"] == "GQ601"]
    assert r.exit_code == 1 and len(gq601) == 1
    assert "carries is_marlin_format" in gq601[0]["message"]
    assert gq601[0]["hint"].startswith("next step: `gptqfmt fix-label PATH` removes "
                                       "is_marlin_format")
