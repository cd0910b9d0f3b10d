"""GPTQ's configs (gptqfmt/formats/gptq/config.py): synonyms, reconciliation, dynamic, schema
violations and refusals of non-GPTQ layouts."""
import json
import shutil

import pytest

from gptqfmt.errors import FindingError
from gptqfmt.formats.gptq.config import ModuleConfig, load_config
from tests.support import CKPT


def write(d, name, doc):
    (d / name).write_text(doc if isinstance(doc, str) else json.dumps(doc))


def codes(findings):
    return sorted(f.code for f in findings)


BASE = {"bits": 4, "group_size": 128, "desc_act": False, "sym": True, "quant_method": "gptq",
        "checkpoint_format": "gptq_v2"}


def test_synonyms(tmp_path):
    write(tmp_path, "quantize_config.json", {"w_bit": 4, "q_group_size": 64, "zero_point": True,
                                             "desc_act": False, "checkpoint_format": "gptq_v2"})
    cfg, f = load_config(tmp_path)
    assert cfg.base == ModuleConfig(bits=4, group_size=64, sym=False, desc_act=False)
    assert cfg.convention == cfg.runtime_convention == "gptq_v2" and codes(f) == []


def test_label_case_matters_like_in_vllm(tmp_path):
    write(tmp_path, "quantize_config.json", {**BASE, "checkpoint_format": "GPTQ_V2",
                                             "format": "GPTQ_V2"})
    cfg, f = load_config(tmp_path)
    assert cfg.runtime_convention == "gptq" and cfg.convention is None
    assert codes(f) == ["GQ202", "GQ202"] and "reads 'GPTQ_V2' as gptq" in f[0].message


def test_format_only_is_read_as_gptq_by_runtimes(tmp_path):
    doc = {k: v for k, v in BASE.items() if k != "checkpoint_format"}
    write(tmp_path, "quantize_config.json", {**doc, "format": "gptq_v2"})
    cfg, f = load_config(tmp_path)
    assert cfg.convention == "gptq_v2" and cfg.runtime_convention == "gptq"
    assert codes(f) == ["GQ209"]
    # transformers >= 5 reads format where checkpoint_format is missing: the message must not
    # say it reads gptq (tests/unit/test_labels.py names each loader from the table)
    assert "transformers" not in f[0].message and "those that read format as gptq_v2" in \
        f[0].message


def test_float_bits_are_not_integers(tmp_path):
    write(tmp_path, "quantize_config.json", {**BASE, "bits": 4.0})
    _, f = load_config(tmp_path)
    assert codes(f) == ["GQ202"] and "must be an integer" in f[0].message


def test_no_label_means_none_declared(tmp_path):
    write(tmp_path, "quantize_config.json", {k: v for k, v in BASE.items()
                                             if k != "checkpoint_format"})
    cfg, f = load_config(tmp_path)
    assert cfg.convention is None and cfg.declared_in == [] and f == []


def test_format_and_checkpoint_format_disagree(tmp_path):
    write(tmp_path, "quantize_config.json", {**BASE, "format": "gptq"})
    cfg, f = load_config(tmp_path)
    assert codes(f) == ["GQ204"]
    assert cfg.convention == "gptq_v2"  # what vLLM and transformers read


def test_files_disagree(tmp_path):
    """bits is GQ205's; the convention labels are GQ212's (checks/labels.py), which names what
    each loader reads from the runtime table (tests/unit/test_labels.py)."""
    write(tmp_path, "quantize_config.json", BASE)
    write(tmp_path, "config.json", {"quantization_config": {**BASE, "bits": 8,
                                                            "checkpoint_format": "gptq"}})
    cfg, f = load_config(tmp_path)
    assert codes(f) == ["GQ205"] and f[0].message.startswith("bits: ")
    assert cfg.base.bits == 8 and cfg.convention == "gptq"  # config.json first, like vLLM
    assert [d.file for d in cfg.declared_in] == ["config.json:quantization_config",
                                                 "quantize_config.json"]


def test_missing_sym_and_desc_act_warn(tmp_path):
    write(tmp_path, "quantize_config.json", {"bits": 4, "group_size": 128})
    _, f = load_config(tmp_path)
    assert codes(f) == ["GQ208", "GQ208"]


@pytest.mark.parametrize(("doc", "needle"), [
    ({**BASE, "bits": 5}, "bits"),
    ({**BASE, "group_size": 0}, "group_size"),
    ({**BASE, "sym": "yes"}, "sym"),
    ({**BASE, "pack_dtype": "int128"}, "pack_dtype"),
    ({**BASE, "dynamic": {"x": {"bits": 9}}}, "dynamic.x.bits"),
    ({**BASE, "checkpoint_format": "gptq_v3"}, "gptq_v3"),
])
def test_schema_violations(tmp_path, doc, needle):
    write(tmp_path, "quantize_config.json", doc)
    if doc.get("bits") == 5:  # 5-bit is planar gptq_p: refused, not a schema error
        with pytest.raises(FindingError) as e:
            load_config(tmp_path)
        assert e.value.finding.code == "GQ203"
        return
    _, f = load_config(tmp_path)
    assert "GQ202" in codes(f)
    assert any(needle in x.message for x in f if x.code == "GQ202")


def test_invalid_json(tmp_path):
    write(tmp_path, "quantize_config.json", "{bits: 4")
    _, f = load_config(tmp_path)
    assert "GQ201" in codes(f) and "GQ206" in codes(f)


@pytest.mark.parametrize("doc", [
    {**BASE, "checkpoint_format": "marlin"}, {**BASE, "format": "bitblas"},
    {**BASE, "checkpoint_format": "gptq_p"}, {**BASE, "is_marlin_format": True},
    {"quant_method": "awq", "bits": 4, "version": "gemm", "zero_point": True},
    {"w_bit": 4, "q_group_size": 128, "zero_point": True, "version": "GEMM"},
    {**BASE, "quant_method": "compressed-tensors"},
])
def test_non_gptq_layouts_are_refused(tmp_path, doc):
    write(tmp_path, "quantize_config.json", doc)
    with pytest.raises(FindingError) as e:
        load_config(tmp_path)
    assert e.value.finding.code == "GQ203" and "not GPTQ" in e.value.finding.message


def test_dynamic_semantics(tmp_path):
    dyn = {r"+:.*\.mlp\..*": {"bits": 8, "group_size": 32},
           r"model\.layers\.1": {"bits": 2},
           r"-:.*\.o_proj": {}}
    write(tmp_path, "quantize_config.json", {**BASE, "dynamic": dyn})
    cfg, f = load_config(tmp_path)
    assert f == []
    assert cfg.for_module("model.layers.0.self_attn.q_proj") == cfg.base
    assert cfg.for_module("model.layers.0.mlp.up_proj").bits == 8
    assert cfg.for_module("model.layers.0.mlp.up_proj").group_size == 32
    # re.match anchors only at the start: layers.1 also matches layers.10
    assert cfg.for_module("model.layers.10.self_attn.q_proj").bits == 2
    # first match in file order wins, no merging (vLLM; GPTQModel writes exclusions first)
    assert cfg.for_module("model.layers.1.mlp.up_proj").bits == 8
    assert cfg.for_module("model.layers.1.self_attn.o_proj").bits == 2
    assert cfg.for_module("model.layers.0.self_attn.o_proj") is None


@pytest.mark.parametrize("key", ["+:model.(", "a{99999999999}"])
def test_invalid_dynamic_regex(tmp_path, key):
    write(tmp_path, "quantize_config.json", {**BASE, "dynamic": {key: {"bits": 8}}})
    _, f = load_config(tmp_path)
    assert codes(f) == ["GQ207"]


def test_autogptq_safetensors_metadata_as_last_resort(tmp_path):
    shutil.copy(CKPT / "autogptq-b4-asym-gptq" / "model.safetensors", tmp_path)
    from gptqfmt.safetensors_io import SafetensorsFile
    md = SafetensorsFile(tmp_path / "model.safetensors").metadata
    cfg, f = load_config(tmp_path, md)
    assert cfg.sources == ["__metadata__"]
    assert cfg.base.bits == 4 and cfg.base.group_size == 32 and cfg.base.desc_act is False


@pytest.mark.parametrize("doc", ["[1, 2]", "5"])
def test_config_json_not_an_object(tmp_path, doc):
    write(tmp_path, "config.json", doc)
    _, f = load_config(tmp_path)
    assert codes(f) == ["GQ202", "GQ206"]


def test_config_that_is_a_directory(tmp_path):
    (tmp_path / "quantize_config.json").mkdir()
    _, f = load_config(tmp_path)
    assert codes(f) == ["GQ201", "GQ206"]
