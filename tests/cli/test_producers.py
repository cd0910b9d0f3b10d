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
