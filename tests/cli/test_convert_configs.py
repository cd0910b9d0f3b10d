"""convert's output says what it holds: configs written for config-less sources, and the label gate.

A checkpoint whose only configuration is AutoGPTQ's safetensors `__metadata__` (or nothing but its
tensor shapes) used to come out of convert with gptq_v2 zero points and no file naming gptq_v2:
every loader then read gptq, and `gptqfmt verify DST` reported GQ401 on convert's own output.
"""
import json
import shutil

import numpy as np
import pytest

import gptqfmt
from gptqfmt.conversion import convert
from gptqfmt.errors import FindingError
from gptqfmt.safetensors_io import SafetensorsFile, save_file
from tests.support import CKPT, SPECS, staging_dirs


def autogptq_metadata(spec) -> dict:
    """The safetensors `__metadata__` AutoGPTQ 0.7.1 writes, key for key: BaseGPTQForCausalLM.
    save_quantized in AutoGPTQ/AutoGPTQ auto_gptq/modeling/_base.py at tag v0.7.1 (commit
    b8b41270f3dd5d657aee049d7b64538ab5dd244e), lines 669-679: every value is str() of the
    quantize config's field (so booleans are "True"/"False"). There is no `sym` key."""
    return {"format": "pt", "auto_gptq_version": "0.7.1", "gptq_bits": str(spec.bits),
            "gptq_group_size": str(spec.group_size), "gptq_desc_act": str(spec.act_order),
            "gptq_damp_percent": "0.01", "gptq_is_marlin_format": "False"}


def drop_quantization_config(d):
    cfg = json.loads((d / "config.json").read_text())
    cfg.pop("quantization_config")
    (d / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def strip_configs(d):
    """Remove every config source: quantize_config.json goes, config.json stays a plain model
    config (as a model repository without its quantization config has)."""
    (d / "quantize_config.json").unlink()
    drop_quantization_config(d)


def metadata_only(tmp_path, name):
    """A copy of the single-file fixture `name` whose only configuration is AutoGPTQ's
    `__metadata__`."""
    src = tmp_path / "src"
    shutil.copytree(CKPT / name, src)
    strip_configs(src)
    f = SafetensorsFile(CKPT / name / "model.safetensors")
    tensors = {k: np.array(f.view(k)) for k in f.tensors}
    save_file(tensors, src / "model.safetensors", autogptq_metadata(SPECS[name]))
    return src


def shapes_only(tmp_path, name):
    src = tmp_path / "src"
    shutil.copytree(CKPT / name, src)
    strip_configs(src)
    for p in src.glob("*.safetensors"):
        assert not any(k.startswith("gptq_") for k in SafetensorsFile(p).metadata or {})
    return src


def expected_config(spec, to):
    """What the written quantize_config.json must say, from the fixture's generator spec."""
    return {"bits": spec.bits, "group_size": spec.group_size, "desc_act": spec.act_order,
            "sym": spec.sym, "pack_dtype": f"int{spec.word_bits}", "lm_head": spec.lm_head,
            "quant_method": "gptq", "checkpoint_format": to, "format": to}


def written_config(dst):
    doc = json.loads((dst / "quantize_config.json").read_text())
    return doc, {k: v for k, v in doc.items() if k != "meta"}


def no_staging(parent):
    return not staging_dirs(parent)


def verify_ok(run_cli, path):
    r = run_cli("verify", path, "--format", "json")
    doc = json.loads(r.stdout)
    codes = {f["code"] for f in doc["findings"]}
    assert r.exit_code == 0 and "GQ401" not in codes and "GQ206" not in codes, doc["findings"]
    return doc


# ---------------------------------------------------------------- AutoGPTQ __metadata__ only
@pytest.mark.parametrize(("name", "lossy"), [("b4-sym-act-gptq-single", False),
                                             ("b4-asym-noact-gptq-single", True),
                                             ("b3-asym-act-gptq-single", True)])
def test_metadata_only_source_gets_a_config_naming_the_target(tmp_path, run_cli, name, lossy):
    spec = SPECS[name]
    src = metadata_only(tmp_path, name)
    dst = tmp_path / "dst"
    rep = convert(src, dst, allow_lossy=lossy)
    assert rep.written and rep.gate.ok
    doc, body = written_config(dst)
    assert body == expected_config(spec, "gptq_v2")
    assert doc["meta"] == {"gptqfmt": {**doc["meta"]["gptqfmt"], "from": "gptq", "to": "gptq_v2",
                                       "config": "derived"}}
    # config.json had no quantization_config: it is copied as it is, not given one
    assert (dst / "config.json").read_bytes() == (src / "config.json").read_bytes()
    assert sorted(p.name for p in dst.iterdir()) == sorted(
        [p.name for p in src.iterdir()] + ["quantize_config.json"])
    # the safetensors header, __metadata__ included, is unchanged (bytes outside qzeros are)
    a, b = SafetensorsFile(src / "model.safetensors"), SafetensorsFile(dst / "model.safetensors")
    assert a.metadata == b.metadata == autogptq_metadata(spec)
    assert (src / "model.safetensors").read_bytes()[:a.header.data_start] == \
        (dst / "model.safetensors").read_bytes()[:b.header.data_start]
    # the report says that a config was derived, and from what
    notes = [f for f in rep.findings if f.code == "GQ206"]
    assert len(notes) == 1 and "__metadata__" in notes[0].message
    assert notes[0].details["written"]["checkpoint_format"] == "gptq_v2"
    out = verify_ok(run_cli, dst)
    assert out["checkpoint_format"]["effective"] == out["checkpoint_format"]["detected"] \
        == "gptq_v2"


def test_metadata_only_round_trip_is_byte_identical(tmp_path, run_cli):
    name = "b4-sym-act-gptq-single"
    src = metadata_only(tmp_path, name)
    convert(src, tmp_path / "v2")
    rep = convert(tmp_path / "v2", tmp_path / "back", to="gptq")
    assert rep.src_convention == "gptq_v2" and rep.written
    assert (tmp_path / "back" / "model.safetensors").read_bytes() == \
        (src / "model.safetensors").read_bytes()
    # the second conversion has a config to rewrite: the written one, relabelled
    _, v2 = written_config(tmp_path / "v2")
    _, back = written_config(tmp_path / "back")
    assert back == {**v2, "checkpoint_format": "gptq", "format": "gptq"}
    assert not [f for f in rep.findings if f.code == "GQ206"]
    verify_ok(run_cli, tmp_path / "back")


# ---------------------------------------------------------------- shapes only
@pytest.mark.parametrize(("name", "kw"), [
    ("b4-sym-noact-gptq-sharded", {}),
    ("b2-asym-act-gptq-sharded", {"allow_lossy": True}),
    # unlabelled gptq_v2 data: auto reads the missing label as gptq and refuses (GQ408), so the
    # source is named; the output is the same data, now labelled
    ("int8-b4-asym-gptq_v2", {"src_convention": "gptq_v2"}),
    ("lmhead-b4-sym-gptq_v2", {"src_convention": "gptq_v2"}),
    ("gsm1-b4-sym-gptq", {}),
])
def test_shapes_only_source_gets_a_config_from_the_shapes(tmp_path, run_cli, name, kw):
    spec = SPECS[name]
    src = shapes_only(tmp_path, name)
    rep = convert(src, tmp_path / "dst", **kw)
    assert rep.written
    _, body = written_config(tmp_path / "dst")
    assert body == expected_config(spec, "gptq_v2")
    assert "shapes" in next(f for f in rep.findings if f.code == "GQ206").message
    verify_ok(run_cli, tmp_path / "dst")


def test_a_quantize_config_json_holding_null_is_replaced(tmp_path, run_cli):
    # load_config reads `null` as no config (no finding), so the output needs one all the same
    src = shapes_only(tmp_path, "b4-sym-noact-gptq-single")
    (src / "quantize_config.json").write_text("null\n")
    convert(src, tmp_path / "dst")
    _, body = written_config(tmp_path / "dst")
    assert body == expected_config(SPECS["b4-sym-noact-gptq-single"], "gptq_v2")
    verify_ok(run_cli, tmp_path / "dst")


def test_derived_config_is_planned_by_a_dry_run(tmp_path):
    src = shapes_only(tmp_path, "b4-sym-noact-gptq-single")
    rep = convert(src, tmp_path / "dst", dry_run=True)
    note = next(f for f in rep.findings if f.code == "GQ206")
    assert note.details["written"] == expected_config(SPECS["b4-sym-noact-gptq-single"],
                                                      "gptq_v2")
    assert not (tmp_path / "dst").exists()


def test_modules_that_disagree_on_bits_without_a_config_are_refused(tmp_path):
    # 4-bit attention, 8-bit MLP: one quantize_config.json without `dynamic` cannot hold both
    src = shapes_only(tmp_path, "dynamic-b4-asym-gptq_v2")
    for dry_run in (True, False):
        with pytest.raises(FindingError) as e:
            convert(src, tmp_path / "dst", src_convention="gptq_v2", dry_run=dry_run)
        (f,) = [f for f in e.value.findings if f.code == "GQ415"]
        assert "4 bits" in f.message and "8 bits" in f.message and "dynamic" in f.message
        assert "model.layers.0.mlp.down_proj" in f.message
        assert not (tmp_path / "dst").exists() and no_staging(tmp_path)


def graft(tmp_path, base, donor, module):
    """The single-file fixture `base` without configs, with `module`'s tensors taken from the
    fixture `donor`."""
    src = shapes_only(tmp_path, base)
    f = SafetensorsFile(CKPT / base / "model.safetensors")
    tensors = {k: np.array(f.view(k)) for k in f.tensors}
    with gptqfmt.open_checkpoint(CKPT / donor) as d:
        for role in ("qweight", "qzeros", "scales", "g_idx"):
            tensors[f"{module}.{role}"] = np.array(d.view(f"{module}.{role}"))
    save_file(tensors, src / "model.safetensors", f.metadata)
    return src


@pytest.mark.parametrize(("donor", "key", "says"), [
    ("gs128-b4-asym-gptq_v2", "group_size", ["32 in 6 modules", "128 in 1 module"]),
    ("int64-b4-asym-gptq_v2", "pack_dtype", ["int8 words in 6 modules", "int64 words in 1 module"]),
])
def test_modules_that_disagree_on_group_size_or_words_are_refused(tmp_path, donor, key, says):
    code = "GQ415"
    base = "int8-b4-asym-gptq_v2" if key == "pack_dtype" else "b4-asym-noact-gptq_v2-single"
    module = "model.layers.0.mlp.down_proj" if key == "group_size" else \
        "model.layers.0.self_attn.q_proj"
    src = graft(tmp_path, base, donor, module)
    with pytest.raises(FindingError) as e:
        convert(src, tmp_path / "dst", src_convention="gptq_v2")
    (f,) = e.value.findings
    assert f.code == code and all(s in f.message for s in says) and module in f.message
    assert not (tmp_path / "dst").exists() and no_staging(tmp_path)


def test_a_one_group_module_that_no_group_size_fits_is_refused(tmp_path):
    # q_proj (64 inputs) in one group beside 32-row groups: group_size 32 would give it two
    src = graft(tmp_path, "b4-asym-noact-gptq_v2-single", "gs128-b4-asym-gptq_v2",
                "model.layers.0.self_attn.q_proj")
    with pytest.raises(FindingError) as e:
        convert(src, tmp_path / "dst", src_convention="gptq_v2")
    (f,) = e.value.findings
    assert f.code == "GQ415" and "group_size=32" in f.message
    assert "model.layers.0.self_attn.q_proj" in f.message and not (tmp_path / "dst").exists()


def test_quant_config_json_is_relabelled_too(tmp_path, run_cli):
    # AutoGPTQ and GPTQModel read quant_config.json when quantize_config.json is missing
    src = tmp_path / "src"
    shutil.copytree(CKPT / "b4-sym-noact-gptq-single", src)
    (src / "quantize_config.json").rename(src / "quant_config.json")
    drop_quantization_config(src)
    convert(src, tmp_path / "dst")
    old = json.loads((src / "quant_config.json").read_text())
    new = json.loads((tmp_path / "dst" / "quant_config.json").read_text())
    assert new["checkpoint_format"] == new["format"] == "gptq_v2"
    assert {k: v for k, v in new.items() if k not in ("checkpoint_format", "format", "meta")} \
        == {k: v for k, v in old.items() if k not in ("checkpoint_format", "format", "meta")}
    assert not (tmp_path / "dst" / "quantize_config.json").exists()
    verify_ok(run_cli, tmp_path / "dst")


@pytest.mark.parametrize("to", ["gptq_v2", "gptq"])
def test_autogptqs_is_marlin_format_is_dropped_and_recorded(tmp_path, run_cli, to):
    """AutoGPTQ 0.7.1 writes is_marlin_format: false into both configs; GPTQModel >= 6.0
    refuses the key by name, so the output carries none, meta.gptqfmt.removed says so, and
    GPTQModel loads the output and decodes it right (it refused the source)."""
    src = CKPT / "autogptq-b4-sym-gptq"
    dst = tmp_path / "dst"
    convert(src, dst, to=to)
    for name in ("quantize_config.json", "config.json"):
        old = json.loads((src / name).read_text())
        new = json.loads((dst / name).read_text())
        old, new = old.get("quantization_config", old), new.get("quantization_config", new)
        assert old["is_marlin_format"] is False and "is_marlin_format" not in new
        assert new["checkpoint_format"] == new["format"] == to
        assert new["meta"]["gptqfmt"]["removed"] == {"is_marlin_format": False}
        assert new["meta"]["gptqfmt"]["from"] == "gptq" and new["meta"]["gptqfmt"]["to"] == to
        kept = ("checkpoint_format", "format", "meta", "is_marlin_format")
        assert [(k, v) for k, v in new.items() if k not in kept] == \
            [(k, v) for k, v in old.items() if k not in kept]
    for d, code, loads in ((src, 1, False), (dst, 0, True)):
        r = run_cli("verify", "--quiet", "--format", "json", "--runtime", "gptqmodel", d)
        entry = {e["id"]: e for e in json.loads(r.stdout)["runtimes"]}["gptqmodel"]
        assert (r.exit_code, entry["loads"]) == (code, loads), d
    assert entry["decodes_correctly"] is True and entry["rules_failed"] == []


# ---------------------------------------------------------------- the label gate
WRONG_LABELS = {
    "checkpoint_format says gptq": ({"checkpoint_format": "gptq"}, "GQ401"),
    "format says gptq": ({"format": "gptq"}, "GQ204"),
    "checkpoint_format missing": ({"checkpoint_format": None}, "GQ209"),
}


@pytest.mark.parametrize("case", sorted(WRONG_LABELS))
@pytest.mark.parametrize("source", ["with-config", "metadata-only"])
def test_gate_refuses_output_whose_config_verify_would_fail(tmp_path, monkeypatch, case, source):
    from gptqfmt.conversion import run
    change, code = WRONG_LABELS[case]
    real = run.rewrite_configs

    def wrong(src_dir, out_dir, to, prov, *args, **kwargs):
        written = real(src_dir, out_dir, to, prov, *args, **kwargs)
        p = out_dir / "quantize_config.json"
        doc = json.loads(p.read_text())
        for k, v in change.items():
            if v is None:
                doc.pop(k)
            else:
                doc[k] = v
        p.write_text(json.dumps(doc))
        return written

    monkeypatch.setattr(run, "rewrite_configs", wrong)
    name = "b4-sym-noact-gptq-single"
    if source == "with-config":  # quantize_config.json only: the file the change lands in
        src = tmp_path / "src"
        shutil.copytree(CKPT / name, src)
        drop_quantization_config(src)
    else:
        src = metadata_only(tmp_path, name)
    with pytest.raises(FindingError) as e:
        convert(src, tmp_path / "dst")
    assert {f.code for f in e.value.findings} == {"GQ503"}
    text = " ".join(f.message for f in e.value.findings)
    assert code in text and "quantize_config.json" in text and "gptq_v2" in text
    assert not (tmp_path / "dst").exists() and no_staging(tmp_path)


def test_gate_passes_every_shipped_label_style(tmp_path):
    # config.json only, quantize_config.json and config.json, format-only sources: each output is
    # labelled as verify reads it
    for name, kw in (("configjson-b4-sym-gptq_v2", {"to": "gptq"}),
                     ("b4-sym-noact-gptq_v2-single", {"to": "gptq"}),
                     ("formatonly-b4-asym-gptq_v2", {"src_convention": "gptq_v2"})):
        rep = convert(CKPT / name, tmp_path / name, **kw)
        assert rep.written
        ck = gptqfmt.open_checkpoint(tmp_path / name)
        assert ck.config.runtime_convention == rep.dst_convention
        assert not [f for f in ck.findings if f.severity == "error"]
