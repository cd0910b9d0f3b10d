"""inspect on every fixture against the generator's parameters (never against earlier output)."""
import json

import pytest

import gptqfmt
from gptqfmt.resources import validator
from tests.support import CKPT, MANIFEST, SPECS

VALIDATOR = validator("inspect")
SYM_DECIDABLE = {n for n, s in SPECS.items() if s.sym and s.writer != "gptqmodel603"}


def test_manifest_covers_every_spec_and_directory():
    assert sorted(MANIFEST) == sorted(SPECS) == sorted(p.name for p in CKPT.iterdir())


@pytest.mark.parametrize("name", sorted(SPECS))
def test_inspect_matches_generator(name):
    spec, truth = SPECS[name], MANIFEST[name]
    doc = gptqfmt.inspect(CKPT / name).to_json()
    VALIDATOR.validate({**doc, "exit_code": int(doc["status"] != "ok")})  # as the CLI prints it
    q = doc["quantization"]
    assert q["bits"] == spec.bits
    assert q["group_size"] == spec.group_size
    # AutoGPTQ records no sym in __metadata__, and inspect reports only what is declared
    assert q["sym"] is (None if spec.config_style == "autogptq-metadata" or "sym" in spec.omit
                        else spec.sym)
    assert q["desc_act"] is spec.act_order
    assert q["pack_dtype"] == f"int{spec.word_bits}"
    assert q["static_groups"] is spec.static_groups
    assert doc["sharded"] is spec.sharded
    assert len(doc["files"]) == (3 if spec.sharded else 1)
    cf = doc["checkpoint_format"]
    assert cf["declared"] == spec.declared_convention
    mods = {m["name"]: m for m in doc["modules"]}
    assert sorted(mods) == sorted(truth["modules"])
    for mname, t in truth["modules"].items():
        m = mods[mname]
        assert (m["bits"], m["in_features"], m["out_features"], m["groups"]) == (
            t["bits"], t["in_features"], t["out_features"], t["groups"])
        assert m["desc_act"] is t["act_order"]
        assert m["pack_dtype"] == f"int{spec.word_bits}"
        assert m["scale_dtype"] == spec.scale_dtype
        gs = spec.group_size if t["groups"] > 1 else -1
        assert m["group_size"] == gs
        assert m["has_bias"] is mname.endswith(("q_proj", "k_proj", "v_proj"))
    assert cf["detected"] == spec.convention
    if name in SYM_DECIDABLE:
        assert cf["confidence"] == 1.0


@pytest.mark.parametrize("name", ["b4-asym-act-gptq-sharded", "int64-b4-asym-gptq_v2"])
def test_module_tensors_split_across_shards_are_joined(name):
    doc = gptqfmt.inspect(CKPT / name).to_json()
    split = [m for m in doc["modules"] if len(m["files"]) > 1]
    index = json.loads((CKPT / name / "model.safetensors.index.json").read_text())
    expect = [m for m in MANIFEST[name]["modules"]
              if len({index["weight_map"][f"{m}.{r}"] for r in ("qweight", "qzeros", "scales",
                                                                 "g_idx")}) > 1]
    assert sorted(m["name"] for m in split) == sorted(expect)


# Fixtures whose writers corrupt zero points on purpose: the codes verify reports too.
CORRUPT_WRITER_CODES = {
    "autogptq-b4-asym-gptq": {"GQ405", "GQ406"},
    "autogptq-b3-asym-act-gptq": {"GQ405", "GQ406"},
    "autogptq-b2-asym-gptq": {"GQ405", "GQ406"},
    "autogptq-b4-sym-gptq": set(),
    "gptqmodel-b4-asym-gptq": {"GQ405", "GQ406"},
    "gptqmodel-b2-asym-act-gptq": {"GQ406", "GQ423"},   # its borrow at 2 bits: undecidable
    "gptqmodel-b8-asym-gptq": {"GQ406"},
    "gptqmodel603-b3-asym-gptq": {"GQ405", "GQ406"},
    "gptqmodel603-b3-sym-gptq": {"GQ403", "GQ405"},
    # Z = 0 clamped to stored 0 (read as 1): no stored maxq, so no GQ406 either
    "autoround-b2-asym-gptq": {"GQ506"},
}


def expected_zero_point_findings(name):
    """{(code, tensor, fields)} from the generator's true zero points: an exact gptq writer stores
    Z = 0 as maxq (GQ406 warning), gptq_v2 stores it as 0 (GQ407 info)."""
    spec = SPECS[name]
    code = "GQ406" if spec.convention == "gptq" else "GQ407"
    return {(code, f"{m}.qzeros", t["zero_fields"])
            for m, t in MANIFEST[name]["modules"].items() if t["zero_fields"]}


def test_findings_of_valid_fixtures():
    # inspect reports what it finds with verify's rules (GQ406/GQ407 from every qzeros field)
    expected = {"lmhead-b4-sym-gptq_v2": {"GQ311"},
                "formatonly-b4-asym-gptq_v2": {"GQ209", "GQ401"},
                # config.json says format gptq_v2, quantize_config.json gptq (optimum's save)
                "optimum-b4-sym-gptq-sharded": {"GQ209", "GQ212"},
                # the runtime conditions: each fixture's own finding
                "rt-nosym-b4-sym-gptq": {"GQ208"}, "rt-nodescact-b4-sym-gptq": {"GQ208"},
                "rt-lmhead-undeclared-b4-sym-gptq_v2": {"GQ311"},
                "rt-nogidx-b4-asym-gptq_v2": {"GQ308"}, "rt-odd-b4-asym-gptq_v2": {"GQ312"}}
    expected.update({n: {"GQ401"} for n in SPECS if n.startswith("mislabelled")})
    for name in SPECS:
        found = gptqfmt.inspect(CKPT / name).findings
        if name in CORRUPT_WRITER_CODES:
            assert {f.code for f in found} == CORRUPT_WRITER_CODES[name], name
            continue
        zp = {(f.code, f.tensor, f.details["fields"]) for f in found
              if f.code in ("GQ406", "GQ407")}
        assert zp == expected_zero_point_findings(name), name
        assert {f.code for f in found} - {"GQ406", "GQ407"} == expected.get(name, set()), name


def test_dynamic_overrides_and_exclusions():
    doc = gptqfmt.inspect(CKPT / "dynamic-b4-asym-gptq_v2").to_json()
    bits = {m["name"].split(".")[-1]: m["bits"] for m in doc["modules"]}
    assert bits == {"q_proj": 4, "k_proj": 4, "v_proj": 4, "gate_proj": 8, "up_proj": 8,
                    "down_proj": 8}
    assert "model.layers.0.self_attn.o_proj.weight" in doc["other_tensors"]["names"]
    assert doc["quantization"]["mixed"] is True


def test_tgi_scalars_are_other_tensors():
    doc = gptqfmt.inspect(CKPT / "tgi-b4-sym-gptq").to_json()
    assert {"gptq_bits", "gptq_groupsize"} <= set(doc["other_tensors"]["names"])


def test_single_file_path():
    doc = gptqfmt.inspect(CKPT / "b4-sym-noact-gptq_v2-single" / "model.safetensors").to_json()
    assert doc["checkpoint_format"]["declared"] == "gptq_v2"
    assert len(doc["modules"]) == 7


def test_a_label_runtimes_do_not_read_is_said_as_what_they_read(run_cli):
    """`format: gptq_v2` without `checkpoint_format`: the configs declare gptq_v2, runtimes
    read gptq, the data are gptq_v2. The report compares the data with what runtimes read
    (verify's `effective`), never with the label they ignore."""
    path = CKPT / "formatonly-b4-asym-gptq_v2"
    doc = json.loads(run_cli("inspect", path, "--format", "json").stdout)
    cf = doc["checkpoint_format"]
    assert (cf["declared"], cf["effective"], cf["detected"]) == ("gptq_v2", "gptq", "gptq_v2")
    assert cf == {k: v for k, v in json.loads(run_cli(
        "verify", path, "--format", "json").stdout)["checkpoint_format"].items() if k in cf}
    lines = run_cli("inspect", path).stdout.splitlines()
    assert lines[0].startswith("FAIL: declared gptq_v2, runtimes read gptq, the data are "
                               "gptq_v2: ")
    declared = next(ln for ln in lines if ln.startswith("declared "))
    assert "gptq_v2 (runtimes read gptq)  MISMATCH: the data are gptq_v2" in declared


@pytest.mark.parametrize("path", [CKPT / "b4-asym-act-gptq-sharded",
                                  CKPT.parent / "invalid" / "scales-wrong-shape",
                                  CKPT.parent / "invalid" / "module-missing-qzeros",
                                  CKPT.parent / "formats" / "ct-b4-asym-g32",
                                  CKPT.parent / "formats" / "awq-b4-g32"])
def test_a_document_without_rows_is_the_same_but_for_them(path):
    """The text report that shows only the module count builds no module record: its
    document is the whole one with `modules` None, and the count is that of the records
    (invalid modules too)."""
    from gptqfmt.ops.inspect import inspect_checkpoint
    result = inspect_checkpoint(path)
    whole, short = result.to_json(), result.to_json(rows=False)
    assert short["modules"] is None and whole["modules"]
    assert short == {**whole, "modules": None}
    assert whole["summary"]["modules"] == len(whole["modules"]) == result.source.record_count
