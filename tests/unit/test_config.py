"""GPTQ's configs (gptqfmt/formats/gptq/config.py): synonyms, reconciliation, dynamic, schema
violations and refusals of non-GPTQ layouts."""
import json
import shutil

import pytest

from gptqfmt.errors import FindingError
from gptqfmt.formats.gptq.config import ModuleConfig, as_gptq, label_values, load_config
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


def test_keys_loaders_refuse_by_name_are_listed_per_file(tmp_path):
    """AutoGPTQ 0.7.1 writes is_marlin_format: false into both files; GPTQModel compares keys
    lower-cased, so another case counts too. A file without it lists nothing."""
    write(tmp_path, "quantize_config.json", {**BASE, "is_marlin_format": False})
    write(tmp_path, "config.json", {"quantization_config": {**BASE, "IS_MARLIN_FORMAT": False}})
    write(tmp_path, "quant_config.json", BASE)
    cfg, _ = load_config(tmp_path)
    assert cfg.legacy_keys() == (("config.json:quantization_config", "IS_MARLIN_FORMAT"),
                                 ("quantize_config.json", "is_marlin_format"))
    assert cfg.keys["quant_config.json"] == tuple(BASE)


@pytest.mark.parametrize("doc, named", [
    # GPTQModel writes gptq_p into both keys; one of them is enough, in any case
    ({**BASE, "bits": 3, "format": "gptq_p", "checkpoint_format": "gptq_p"},
     ["checkpoint_format is 'gptq_p'", "GPTQModel's planar layout", "at 3 bits"]),
    ({**BASE, "format": "GPTQ_P", "checkpoint_format": "gptq"},
     ["format is 'GPTQ_P'", "GPTQModel's planar layout"]),
    ({**BASE, "bits": 7}, ["bits is 7", "GPTQModel's planar layout"]),
    ({"quant_method": "vptq", "config_for_layers": {}, "shared_layer_config": {}},
     ["quant_method is 'vptq'", "VPTQ", "vector quantization", "no qweight, qzeros"]),
    ({**BASE, "is_marlin_format": True},
     ["is_marlin_format is true", "AutoGPTQ's Marlin repack"]),
])
def test_formats_known_by_name_are_refused_with_what_they_are(tmp_path, doc, named):
    write(tmp_path, "quantize_config.json", doc)
    with pytest.raises(FindingError) as e:
        load_config(tmp_path)
    f = e.value.finding
    assert f.code == "GQ203" and f.file == "quantize_config.json" and "not GPTQ" in f.message
    assert [n for n in named if n not in f.message] == []
    assert f.hint and "convert it to GPTQ with the tool that produced it" not in f.hint


# ---------------------------------------------------------- auto-round's own config
# quant_method "auto-round": the convention is named by packing_format (intel/auto-round
# b9f3d0079d01 inference/backend.py L210-212: auto_round:auto_gptq stores Z - 1, auto_round and
# auto_round:gptqmodel store Z; convert_model.py L894-899: "auto" and "auto_round:gptq" are
# auto_gptq)
AR = {"bits": 4, "data_type": "int", "group_size": 128, "sym": False,
      "autoround_version": "0.16.0", "block_name_to_quantize": "model.layers",
      "quant_method": "auto-round"}
CJ = "config.json:quantization_config"


def autoround(d, **keys):
    write(d, "config.json", {"model_type": "llama", "quantization_config": {**AR, **keys}})


@pytest.mark.parametrize(("packing", "convention"), [
    ("auto_round:auto_gptq", "gptq"), ("auto_round:gptq", "gptq"), ("auto", "gptq"),
    ("auto_round", "gptq_v2"), ("auto_round:gptqmodel", "gptq_v2")])
def test_autoround_packing_format_declares_the_convention(tmp_path, packing, convention):
    autoround(tmp_path, packing_format=packing)
    cfg, f = load_config(tmp_path)
    assert (cfg.convention, cfg.runtime_convention) == (convention, convention)
    assert [d.to_json() for d in cfg.declared_in] == [
        {"file": CJ, "key": "packing_format", "value": convention, "written": packing}]
    # auto-round writes no desc_act (its loader reads it as false): not GQ208
    assert codes(f) == [] and cfg.base == ModuleConfig(bits=4, group_size=128, sym=False,
                                                       desc_act=False)
    assert cfg.g_idx_written is (packing == "auto_round:gptqmodel")


def test_autoround_before_0_5_without_packing_format_reads_gptq(tmp_path):
    autoround(tmp_path, quant_method="intel/auto-round", backend="auto_round:gptq")
    cfg, f = load_config(tmp_path)
    assert cfg.convention == cfg.runtime_convention == "gptq" and cfg.declared_in == []
    assert codes(f) == ["GQ213"] and f[0].severity == "info" and f[0].file == CJ
    assert "auto_round:auto_gptq" in f[0].message and "'auto_round:gptq'" in f[0].message


def test_unknown_packing_format_is_named_with_the_known_ones(tmp_path):
    autoround(tmp_path, packing_format="auto_round:exllamav2")
    cfg, f = load_config(tmp_path)
    assert codes(f) == ["GQ214"] and f[0].severity == "error"
    assert "'auto_round:exllamav2'" in f[0].message
    assert all(f"'{p}'" in f[0].message for p in (
        "auto_round:auto_gptq", "auto_round", "auto_round:gptqmodel", "auto_round:auto_awq"))
    assert cfg.convention is None and cfg.runtime_convention == "gptq"


@pytest.mark.parametrize("keys", [{"checkpoint_format": "gptq_v2"}, {"format": "gptq_v2"},
                                  {"checkpoint_format": "gptq_v2", "format": "gptq_v2"}])
def test_checkpoint_format_against_packing_format_is_gq215(tmp_path, keys):
    autoround(tmp_path, packing_format="auto_round:auto_gptq", **keys)
    cfg, f = load_config(tmp_path)
    assert "GQ215" in codes(f) and "GQ204" not in codes(f)
    g = next(x for x in f if x.code == "GQ215")
    assert "'auto_round:auto_gptq'" in g.message and all(
        f"{k} is 'gptq_v2'" in g.message for k in keys)
    # the loaders of auto-round's format read packing_format
    assert cfg.convention == cfg.runtime_convention == "gptq"


def test_checkpoint_format_agreeing_with_packing_format_is_fine(tmp_path):
    autoround(tmp_path, packing_format="auto_round", checkpoint_format="gptq_v2")
    cfg, f = load_config(tmp_path)
    assert codes(f) == [] and cfg.convention == "gptq_v2"


def test_autoround_awq_packing_is_refused_by_the_gptq_reader(tmp_path):
    # open.py sniffs it as AWQ; only a GPTQ-only command reads it as GPTQ
    autoround(tmp_path, packing_format="auto_round:auto_awq")
    with pytest.raises(FindingError) as e:
        load_config(tmp_path)
    f = e.value.finding
    assert f.code == "GQ203" and "packing_format is 'auto_round:auto_awq'" in f.message
    assert "inspect, verify and convert read that format" in f.message


def test_gq203_names_every_format_gptqfmt_reads(tmp_path):
    write(tmp_path, "quantize_config.json", {**BASE, "checkpoint_format": "marlin"})
    with pytest.raises(FindingError) as e:
        load_config(tmp_path)
    m = e.value.finding.message
    assert "reads only gptq and gptq_v2" not in m
    assert all(w in m for w in ("gptq_v2", "auto-round", "compressed-tensors", "AutoAWQ"))


def test_extra_config_overrides_like_its_loader(tmp_path):
    """auto-round's loader: a layer named exactly takes its entry; another layer the first
    pattern re.search finds; bits 16 keeps a layer in full precision."""
    autoround(tmp_path, packing_format="auto_round", extra_config={
        r".*mlp\.up.*": {"bits": 2},
        "model.layers.1.mlp.down_proj": {"bits": 8, "group_size": 32},
        "model.layers.0.mlp.up_proj": {"bits": 3},
        "lm_head": {"bits": 16, "data_type": "fp"},
        "model.layers.2.self_attn.q_proj": {"data_type": "int"},   # nothing GPTQ's says
    })
    cfg, f = load_config(tmp_path)
    assert codes(f) == []
    base = cfg.base
    assert cfg.for_module("model.layers.1.mlp.down_proj") == ModuleConfig(
        8, 32, base.sym, base.desc_act, base.pack_dtype)
    assert cfg.for_module("model.layers.11.mlp.down_proj") == base   # exact, not a prefix
    assert cfg.for_module("model.layers.0.mlp.up_proj").bits == 3    # exact before pattern
    assert cfg.for_module("model.layers.5.mlp.up_proj").bits == 2    # the pattern, searched
    assert cfg.for_module("lm_head") is None
    assert cfg.for_module("model.layers.2.self_attn.q_proj") == base


@pytest.mark.parametrize(("to", "g_idx", "packing"), [
    ("gptq", False, "auto_round:auto_gptq"), ("gptq", True, "auto_round:auto_gptq"),
    ("gptq_v2", False, "auto_round"), ("gptq_v2", True, "auto_round:gptqmodel")])
def test_autoround_relabel_sets_packing_format(to, g_idx, packing):
    doc = {**AR, "packing_format": "auto_round:auto_gptq"}
    assert label_values(doc, to, g_idx) == {"packing_format": packing}
    # GPTQ's keys are set only where the file has them
    assert label_values({**doc, "format": "gptq"}, to, g_idx) == {"packing_format": packing,
                                                                  "format": to}
    assert label_values(BASE, to, g_idx) == {"checkpoint_format": to, "format": to}


def test_autoround_config_as_gptq(tmp_path):
    doc = {**AR, "packing_format": "auto_round", "backend": "auto",
           "extra_config": {"model.layers.0.mlp.down_proj": {"bits": 8}}}
    out, dropped = as_gptq(doc)
    assert dropped == {"packing_format": "auto_round", "backend": "auto"}
    assert list(out)[:7] == list(AR)[:6] + ["quant_method"] and out["quant_method"] == "gptq"
    assert out["desc_act"] is False and out["extra_config"] == doc["extra_config"]
    assert out["dynamic"] == {r"+:model\.layers\.0\.mlp\.down_proj$": {"bits": 8}}
    # read back as GPTQ's config, it says what auto-round's did
    write(tmp_path, "quantize_config.json", {**out, "checkpoint_format": "gptq_v2"})
    cfg, f = load_config(tmp_path)
    assert codes(f) == [] and cfg.for_module("model.layers.0.mlp.down_proj").bits == 8
    assert as_gptq(BASE) == (BASE, {})
