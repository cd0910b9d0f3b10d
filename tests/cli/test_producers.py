"""Clean checkpoints as each producer writes them pass `verify --strict`; real defects still fail.

The fixtures (fixtures/make_fixtures.py, PRODUCER_STYLES) copy each producer's index layout,
safetensors `__metadata__`, shard writer and config keys, from the save code cited there.
"""
import json
import os
import shutil

import numpy as np
import pytest
from safetensors import safe_open

from gptqfmt.formats.gptq.config import load_config
from gptqfmt.safetensors_io import SafetensorsFile, save_file
from gptqfmt.safetensors_io.index import INDEX_NAME, open_store
from tests.support import CKPT, SPECS

QC, CJ, MD = "quantize_config.json", "config.json:quantization_config", "__metadata__"
# name -> (config sources in precedence order, declared convention, places that declare it)
PRODUCERS = {
    "gptqmodel-sharded-b4-sym-gptq": ([CJ, QC], "gptq", 4),
    "gptqmodel-sharded-b4-asym-act-gptq_v2": ([CJ, QC], "gptq_v2", 4),
    "autogptq-metadata-only-b4-sym-act-gptq": ([MD], None, 0),
    # format only, and not the same: config.json gptq_v2, quantize_config.json gptq
    "optimum-b4-sym-gptq-sharded": ([CJ, QC], "gptq_v2", 2),
    "transformers-b4-asym-gptq_v2-sharded": ([CJ], "gptq_v2", 2),  # format and checkpoint_format
    "transformers4-b4-sym-act-gptq-sharded": ([CJ], None, 0),      # neither
}
# The producers whose files contradict each other, and what verify says of them
CONTRADICTING = {"optimum-b4-sym-gptq-sharded": ["GQ209", "GQ212"]}
CLEAN = sorted(set(PRODUCERS) - set(CONTRADICTING))
GPTQMODEL = [n for n in PRODUCERS if n.startswith("gptqmodel-")]
HF_SHARDED = ["optimum-b4-sym-gptq-sharded", "transformers-b4-asym-gptq_v2-sharded",
              "transformers4-b4-sym-act-gptq-sharded"]


def shard_sums(d):
    """(tensor bytes, file bytes) of a checkpoint's shards, read with the reference library."""
    files = sorted(p for p in d.iterdir() if p.suffix == ".safetensors")
    tensors = 0
    for p in files:
        with safe_open(p, framework="numpy") as f:
            tensors += sum(f.get_tensor(k).nbytes for k in f.keys())
    return tensors, sum(os.path.getsize(p) for p in files)


def set_total_size(d, value):
    p = d / INDEX_NAME
    doc = json.loads(p.read_text())
    doc["metadata"]["total_size"] = value
    p.write_text(json.dumps(doc, indent=2))


def copy_of(tmp_path, name):
    dst = tmp_path / name
    shutil.copytree(CKPT / name, dst)
    return dst


def verify_json(run_cli, path, *extra):
    r = run_cli("verify", path, "--strict", "--format", "json", *extra)
    return r.exit_code, json.loads(r.stdout)


def test_every_producer_style_has_a_fixture():
    styles = {SPECS[n].config_style for n in PRODUCERS}
    assert styles == {"gptqmodel7", "optimum", "transformers5", "transformers4",
                      "autogptq-metadata"}


@pytest.mark.parametrize("name", CLEAN)
def test_clean_producer_checkpoint_passes_strict_verify(run_cli, name):
    code, doc = verify_json(run_cli, CKPT / name)
    bad = [f for f in doc["findings"] if f["severity"] != "info"]
    assert code == 0 and bad == [], bad
    assert doc["checkpoint_format"]["detected"] == SPECS[name].convention


@pytest.mark.parametrize("name", sorted(PRODUCERS))
def test_inspect_names_the_config_sources(run_cli, name):
    sources, declared, places = PRODUCERS[name]
    r = run_cli("inspect", CKPT / name, "--format", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == (1 if name in CONTRADICTING else 0)
    assert doc["config_sources"] == sources
    cf = doc["checkpoint_format"]
    assert cf["declared"] == declared and len(cf["declared_in"]) == places
    if name not in CONTRADICTING:
        assert {d["value"] for d in cf["declared_in"]} <= {declared}
    assert doc["quantization"]["bits"] == SPECS[name].bits
    assert doc["quantization"]["group_size"] == SPECS[name].group_size


def test_optimum_files_contradict_and_each_loader_reads_its_own(run_cli):
    """optimum 2.3.0 stores `format: gptq_v2` in config.json (quantize_model, before save
    converts the data to gptq) and `format: gptq` in quantize_config.json. verify names the
    contradiction (GQ212) and what each loader reads there; GQ209 the missing
    checkpoint_format. The data are gptq and the label vLLM reads says gptq: no GQ401."""
    name = "optimum-b4-sym-gptq-sharded"
    d = CKPT / name
    cj = json.loads((d / "config.json").read_text())["quantization_config"]
    qc = json.loads((d / "quantize_config.json").read_text())
    assert (cj["format"], qc["format"]) == ("gptq_v2", "gptq")
    assert "checkpoint_format" not in cj and "checkpoint_format" not in qc
    code, doc = verify_json(run_cli, d)
    assert code == 1 and sorted(f["code"] for f in doc["findings"]) == CONTRADICTING[name]
    assert doc["checkpoint_format"]["detected"] == SPECS[name].convention == "gptq"
    [f] = [f for f in doc["findings"] if f["code"] == "GQ212"]
    reads = {k: (v["convention"], v["file"], v["key"]) for k, v in f["details"]["reads"].items()}
    assert reads["gptqmodel"] == ("gptq", QC, "format")
    assert reads["transformers"] == ("gptq_v2", CJ, "format")
    assert reads["vllm-gptq-gemm"] == reads["exllamav2"] == ("gptq", CJ, None)
    runtimes = {r["id"]: r for r in doc["runtimes"]}
    torch = {p["kernel"]: p for p in runtimes["transformers"]["paths"]}["torch"]
    assert torch["convention_read"] == "gptq_v2" and torch["decodes_correctly"] is False


# ---------------------------------------------------------------- the layouts are the producers'
@pytest.mark.parametrize("name", GPTQMODEL)
def test_gptqmodel_index_counts_file_bytes(name):
    d = CKPT / name
    index = json.loads((d / INDEX_NAME).read_text())
    tensor_bytes, file_bytes = shard_sums(d)
    assert index["metadata"] == {"total_size": file_bytes} and file_bytes > tensor_bytes
    assert open_store(d).findings == []


@pytest.mark.parametrize("name", GPTQMODEL)
def test_gptqmodel_shards_keep_state_dict_order(name):
    """GPTQModel's writer lays tensors out in state-dict order, not the reference writer's
    dtype-then-name order; the reference reader still loads every shard."""
    orders = []
    for p in sorted((CKPT / name).glob("*.safetensors")):
        raw = p.read_bytes()
        header = json.loads(raw[8:8 + int.from_bytes(raw[:8], "little")])
        assert next(iter(header)) == "__metadata__"
        names = [k for k in header if k != "__metadata__"]
        assert names == sorted(names, key=lambda t: header[t]["data_offsets"][0])
        orders.append(names)
        with safe_open(p, framework="numpy") as ref:
            assert sorted(ref.keys()) == sorted(names)
            assert ref.metadata() == {"format": "pt"}
    flat = [n for o in orders for n in o]
    assert flat[0] == "model.embed_tokens.weight" and flat[-1] == "lm_head.weight"
    q = flat.index("model.layers.0.self_attn.q_proj.qweight")
    assert flat[q:q + 5] == [f"model.layers.0.self_attn.q_proj.{r}"
                             for r in ("qweight", "qzeros", "scales", "g_idx", "bias")]


@pytest.mark.parametrize("name", GPTQMODEL)
def test_gptqmodel_quantize_config_carries_meta(name):
    doc = json.loads((CKPT / name / "quantize_config.json").read_text())
    assert doc["meta"]["quantizer"] == ["gptqmodel:7.3.4"]
    assert doc["format"] == doc["checkpoint_format"] == SPECS[name].convention
    assert doc["method"] == doc["quant_method"] == "gptq" and doc["pack_dtype"] == "int32"


@pytest.mark.parametrize("name", HF_SHARDED)
def test_huggingface_index_counts_tensor_bytes(name):
    d = CKPT / name
    meta = json.loads((d / INDEX_NAME).read_text())["metadata"]
    assert meta["total_size"] == shard_sums(d)[0]
    # transformers 5 adds total_parameters (the float weights; packed tensors are buffers)
    assert ("total_parameters" in meta) is (SPECS[name].config_style != "transformers4")
    assert sorted(p.name for p in d.glob("*.safetensors")) == [
        f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]


def test_autogptq_metadata_only_has_no_config_file():
    d = CKPT / "autogptq-metadata-only-b4-sym-act-gptq"
    assert [p.name for p in d.iterdir()] == ["gptq_model-4bit-32g.safetensors"]
    with safe_open(d / "gptq_model-4bit-32g.safetensors", framework="numpy") as f:
        assert f.metadata() == {"format": "pt", "auto_gptq_version": "0.7.1", "gptq_bits": "4",
                                "gptq_group_size": "32", "gptq_desc_act": "True",
                                "gptq_damp_percent": "0.01", "gptq_is_marlin_format": "False"}


def test_transformers_configs_carry_their_runtime_keys():
    t5 = json.loads((CKPT / "transformers-b4-asym-gptq_v2-sharded" / "config.json").read_text())
    t4 = json.loads((CKPT / "transformers4-b4-sym-act-gptq-sharded" / "config.json").read_text())
    q5, q4 = t5["quantization_config"], t4["quantization_config"]
    assert q5["backend"] == "auto" and q5["format"] == q5["checkpoint_format"] == "gptq_v2"
    assert q4["use_exllama"] is True and q4["exllama_config"] == {"version": 1}
    assert "format" not in q4 and "checkpoint_format" not in q4


# ---------------------------------------------------------------- GQ127 keeps real mismatches
@pytest.mark.parametrize("name", ["gptqmodel-sharded-b4-sym-gptq", "optimum-b4-sym-gptq-sharded"])
def test_total_size_of_neither_sum_is_gq127(tmp_path, run_cli, name):
    d = copy_of(tmp_path, name)
    tensor_bytes, file_bytes = shard_sums(d)
    set_total_size(d, file_bytes + 8)
    found = [f for f in open_store(d).findings if f.code == "GQ127"]
    assert len(found) == 1
    assert f"is {file_bytes + 8};" in found[0].message
    assert f"({tensor_bytes}," in found[0].message and f"({file_bytes}," in found[0].message
    code, doc = verify_json(run_cli, d)
    assert code == 1 and sorted(f["code"] for f in doc["findings"]
                                if f["severity"] != "info") == ["GQ127"] + CONTRADICTING.get(
        name, [])


@pytest.mark.parametrize("name", ["gptqmodel-sharded-b4-sym-gptq", "optimum-b4-sym-gptq-sharded"])
@pytest.mark.parametrize("which", [0, 1])
def test_total_size_may_be_either_sum(tmp_path, name, which):
    d = copy_of(tmp_path, name)
    set_total_size(d, shard_sums(d)[which])
    assert open_store(d).findings == []


def test_total_size_after_a_shard_is_rewritten_is_gq127(tmp_path):
    """A shard re-saved by hand: the index's file total no longer matches either sum."""
    d = copy_of(tmp_path, "gptqmodel-sharded-b4-sym-gptq")
    p = d / "model-00003-of-00003.safetensors"
    f = SafetensorsFile(p)
    tensors = {k: np.array(f.view(k)) for k in f.tensors}
    f.close()
    save_file(tensors, p, {"format": "pt", "note": "re-saved by hand with more metadata"})
    assert [x.code for x in open_store(d).findings] == ["GQ127"]


# ---------------------------------------------------------------- __metadata__ as a config source
def metadata_only(tmp_path, **extra):
    src = CKPT / "autogptq-metadata-only-b4-sym-act-gptq" / "gptq_model-4bit-32g.safetensors"
    f = SafetensorsFile(src)
    md = {**f.metadata, **extra}
    tensors = {k: np.array(f.view(k)) for k in f.tensors}
    f.close()
    d = tmp_path / "ck"
    d.mkdir()
    save_file(tensors, d / src.name, md)
    return d, md


def test_metadata_without_sym_is_not_gq208_but_a_config_file_without_it_is(tmp_path):
    d, md = metadata_only(tmp_path)
    cfg, findings = load_config(d, md)
    assert cfg.sources == [MD] and cfg.base.sym is None and findings == []
    (d / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 32,
                                                        "desc_act": True}))
    cfg, findings = load_config(d, md)
    assert cfg.sources == [QC]
    assert [(f.code, f.file) for f in findings] == [("GQ208", QC)]
    assert "sym" in findings[0].message


@pytest.mark.parametrize("value", ["True", "False"])
def test_metadata_gptq_sym_is_read(tmp_path, value):
    d, md = metadata_only(tmp_path, gptq_sym=value)
    cfg, findings = load_config(d, md)
    assert cfg.base.sym is (value == "True") and findings == []


def test_metadata_marlin_flag_is_refused(tmp_path, run_cli):
    d, _ = metadata_only(tmp_path, gptq_is_marlin_format="True")
    r = run_cli("verify", d, "--format", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 1 and [f["code"] for f in doc["findings"]] == ["GQ203"]
    assert "is_marlin_format" in doc["findings"][0]["message"]


# ------------------------------------------------ auto-round's own format (quant_method auto-round)
# Each fixture as auto-round writes it (make_fixtures.py autoround_packing_format): the
# packing_format it names and what that declares (intel/auto-round b9f3d0079d01,
# inference/backend.py L210-212), the data's convention (SPECS) independently.
AUTOROUND_OWN = {
    "autoround-own-b4-sym-gptq": ("auto_round:auto_gptq", "gptq"),
    "autoround-own-b2-asym-gptq_v2": ("auto_round", "gptq_v2"),
    "autoround-own-gidx-b4-asym-gptq_v2": ("auto_round:gptqmodel", "gptq_v2"),
    "mislabelled-autoround-own-b4-asym-v2-as-gptq": ("auto_round:auto_gptq", "gptq"),
}
MISLABELLED_AR = "mislabelled-autoround-own-b4-asym-v2-as-gptq"
CLEAN_AR = sorted(set(AUTOROUND_OWN) - {MISLABELLED_AR})


def quant_config(d):
    return json.loads((d / "config.json").read_text())["quantization_config"]


def edit_quant_config(d, **keys):
    """Set (None: remove) keys of config.json's quantization_config."""
    p = d / "config.json"
    doc = json.loads(p.read_text())
    q = doc["quantization_config"]
    for k, v in keys.items():
        if v is None:
            q.pop(k, None)
        else:
            q[k] = v
    p.write_text(json.dumps(doc, indent=2))


def test_every_autoround_packing_has_a_fixture():
    assert {n for n, s in SPECS.items() if s.config_style == "autoround-native"} == \
        set(AUTOROUND_OWN)
    for name, (packing, _) in AUTOROUND_OWN.items():
        q = quant_config(CKPT / name)
        assert (q["quant_method"], q["packing_format"]) == ("auto-round", packing)
        assert not {"checkpoint_format", "format", "desc_act"} & set(q)


@pytest.mark.parametrize("name", sorted(AUTOROUND_OWN))
def test_autoround_inspect_shows_declared_and_detected(run_cli, name):
    packing, declared = AUTOROUND_OWN[name]
    r = run_cli("inspect", CKPT / name, "--format", "json")
    cf = json.loads(r.stdout)["checkpoint_format"]
    assert cf["declared"] == declared == SPECS[name].declared_convention
    assert cf["declared_in"] == [{"file": CJ, "key": "packing_format", "value": declared,
                                  "written": packing}]
    assert cf["detected"] == SPECS[name].convention
    text = run_cli("inspect", CKPT / name).stdout.splitlines()
    [line] = [t for t in text if t.startswith(f"declared     {declared}  ")]
    assert line.endswith(f"  (in 1 place: {CJ}:packing_format={packing})")
    assert ("MISMATCH" in line) == (declared != SPECS[name].convention)
    assert any(t.startswith(f"detected     {SPECS[name].convention} (") for t in text)


@pytest.mark.parametrize("name", CLEAN_AR)
def test_autoround_checkpoint_passes_strict_verify(run_cli, name):
    # no GQ308 for the packings auto-round writes without g_idx, no GQ208 for its desc_act
    code, doc = verify_json(run_cli, CKPT / name)
    bad = [f for f in doc["findings"] if f["severity"] != "info"]
    assert code == 0 and bad == [], bad


def test_autoround_v2_data_declared_auto_gptq_fail_verify(run_cli):
    code, doc = verify_json(run_cli, CKPT / MISLABELLED_AR)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert code == 1 and [f["code"] for f in errors] == ["GQ401"]
    f = errors[0]
    assert f["file"] == CJ and f["details"]["detected"] == "gptq_v2"
    assert "packing_format='auto_round:auto_gptq'" in f["message"]
    assert "fix-label" in f["hint"] and "packing_format" in f["hint"]


@pytest.mark.parametrize("name", CLEAN_AR)
def test_autoround_converts_to_gptq_and_verify_against_passes(tmp_path, run_cli, name):
    """convert writes GPTQ's config (quant_method gptq, both label keys, no packing_format);
    v1 data go to gptq_v2 and back to the same bytes."""
    src = CKPT / name
    data = SPECS[name].convention
    there = "gptq_v2"
    out = tmp_path / "out"
    assert run_cli("convert", src, out, "--to", there).exit_code == 0
    q = quant_config(out)
    assert (q["quant_method"], q["checkpoint_format"], q["format"]) == ("gptq", there, there)
    assert "packing_format" not in q and q["desc_act"] is False
    assert q["meta"]["gptqfmt"]["removed"] == {"packing_format": AUTOROUND_OWN[name][0]}
    # as GPTQ's, a module without g_idx is a GQ308 warning (convert changes no tensor but
    # qzeros); nothing else is
    no_g_idx = not SPECS[name].g_idx
    code, doc = verify_json(run_cli, out)
    warned = {f["code"] for f in doc["findings"] if f["severity"] != "info"}
    assert (code, warned) == ((1, {"GQ308"}) if no_g_idx else (0, set()))
    assert run_cli("verify", out).exit_code == 0
    assert run_cli("verify", out, "--against", src).exit_code == 0
    if data == "gptq":
        back = tmp_path / "back"
        assert run_cli("convert", out, back, "--to", "gptq").exit_code == 0
        assert (back / "model.safetensors").read_bytes() == (src / "model.safetensors").read_bytes()
        assert run_cli("verify", back, "--against", src).exit_code == 0
        assert quant_config(back)["checkpoint_format"] == "gptq"


@pytest.mark.parametrize(("name", "mislabel", "written"), [
    (MISLABELLED_AR, None, "auto_round"),                       # v2 data without g_idx
    ("autoround-own-gidx-b4-asym-gptq_v2", "auto_round:auto_gptq", "auto_round:gptqmodel"),
    ("autoround-own-b4-sym-gptq", "auto_round", "auto_round:auto_gptq"),
])
def test_fix_label_rewrites_packing_format(tmp_path, run_cli, name, mislabel, written):
    d = copy_of(tmp_path, name)
    if mislabel:
        edit_quant_config(d, packing_format=mislabel)
    before = quant_config(d)
    assert run_cli("verify", d).exit_code == 1
    r = run_cli("fix-label", d, "--format", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["to"] == SPECS[name].convention
    assert doc["changes"] == [{"file": "config.json", "key": "packing_format",
                               "old": before["packing_format"], "new": written}]
    after = quant_config(d)
    assert after["quant_method"] == "auto-round" and after["packing_format"] == written
    assert not {"checkpoint_format", "format"} & set(after)   # auto-round's keys only
    assert {k: v for k, v in after.items() if k not in ("packing_format", "meta")} == \
        {k: v for k, v in before.items() if k != "packing_format"}
    assert run_cli("verify", d, "--strict").exit_code == 0


def test_fix_label_writes_a_missing_packing_format(tmp_path, run_cli):
    d = copy_of(tmp_path, "autoround-own-b2-asym-gptq_v2")
    edit_quant_config(d, packing_format=None)
    code, doc = verify_json(run_cli, d)
    # its loaders read auto_round:auto_gptq (gptq): said, and contradicted by the data
    assert code == 1 and {f["code"] for f in doc["findings"]} >= {"GQ213", "GQ401"}
    assert doc["checkpoint_format"]["declared"] == "gptq"
    assert run_cli("fix-label", d).exit_code == 0
    assert quant_config(d)["packing_format"] == "auto_round"
    assert verify_json(run_cli, d)[0] == 0


def test_checkpoint_format_disagreeing_with_packing_format(tmp_path, run_cli):
    d = copy_of(tmp_path, "autoround-own-b4-sym-gptq")
    edit_quant_config(d, checkpoint_format="gptq_v2")
    code, doc = verify_json(run_cli, d)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert code == 1 and [f["code"] for f in errors] == ["GQ215"]
    assert "checkpoint_format is 'gptq_v2'" in errors[0]["message"]
    assert "'auto_round:auto_gptq'" in errors[0]["message"]
    assert run_cli("fix-label", d).exit_code == 0
    q = quant_config(d)
    assert (q["packing_format"], q["checkpoint_format"]) == ("auto_round:auto_gptq", "gptq")
    assert verify_json(run_cli, d)[0] == 0


def test_unknown_packing_format(tmp_path, run_cli):
    d = copy_of(tmp_path, "autoround-own-b4-sym-gptq")
    edit_quant_config(d, packing_format="auto_round:marlin")
    code, doc = verify_json(run_cli, d)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert code == 1 and [f["code"] for f in errors] == ["GQ214"]
    assert "'auto_round:marlin'" in errors[0]["message"]
    assert "'auto_round:gptqmodel'" in errors[0]["message"]


def test_autoround_awq_packing_is_read_as_awq(tmp_path, run_cli):
    """auto-round's own export in AutoAWQ's GEMM layout: quant_method auto-round, packing_format
    auto_round:auto_awq, sym instead of zero_point (the tensors of formats/autoround-awq-*)."""
    from tests.support import FORMATS
    d = tmp_path / "awq"
    shutil.copytree(FORMATS / "autoround-awq-b4-sym-g32", d)
    edit_quant_config(d, quant_method="auto-round", packing_format="auto_round:auto_awq",
                      zero_point=None, version=None, provider=None)
    r = run_cli("inspect", d, "--format", "json")
    doc = json.loads(r.stdout)
    assert r.exit_code == 0 and doc["format"] == "awq" and doc["quantization"]["sym"] is True
    assert run_cli("verify", d, "--strict").exit_code == 0
    # fix-label reads GPTQ's zero-point labels only: refused, naming the packing
    r = run_cli("fix-label", d, "--format", "json")
    assert r.exit_code == 1 and "GQ203" in r.stdout
