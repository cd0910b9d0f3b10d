"""Whole models (30 layers x 7 linears = 210 modules, fixtures/make_whole_models.py) as
GPTQModel writes them: clean ones pass verify with no warning, inspect and verify agree on the
convention, convert either way is exact, and a mislabelled copy is caught and convertible.

Each model is built once per session (about a second each) in a temporary directory.
"""
import itertools
import json

import pytest

from tests.support import load_generator

pytestmark = pytest.mark.slow

WM = load_generator("make_whole_models")
SPECS = [WM.WholeSpec(bits, act, conv, sharding) for bits, act, conv, sharding in
         itertools.product((4, 8), (False, True), WM.CONVENTIONS, WM.SHARDINGS)]
IDS = [s.name for s in SPECS]
# One model stays in the quick default run; every other combination is marked slow.
QUICK = "whole-b4-asym-noact-gptq-gptqmodel"
PARAMS = [pytest.param(s, id=s.name, marks=() if s.name == QUICK else pytest.mark.slow)
          for s in SPECS]


def other(convention):
    return WM.CONVENTIONS[1 - WM.CONVENTIONS.index(convention)]


@pytest.fixture(scope="session")
def whole_models(tmp_path_factory):
    """name -> (directory, ground truth); each model is written on first use."""
    root = tmp_path_factory.mktemp("whole")
    built = {}

    def get(spec):
        if spec.name not in built:
            built[spec.name] = (root / spec.name,
                                WM.build_whole_model(spec, root / spec.name))
        return built[spec.name]
    return get


@pytest.fixture(scope="session")
def mislabelled_models(tmp_path_factory, whole_models):
    root = tmp_path_factory.mktemp("mislabelled")
    built = {}

    def get(spec):
        if spec.name not in built:
            src, _ = whole_models(spec)
            declared = WM.mislabel(src, root / spec.name, spec)
            built[spec.name] = (root / spec.name, declared)
        return built[spec.name]
    return get


def cli_json(run_cli, *args):
    r = run_cli(*args, "--format", "json")
    return r.exit_code, json.loads(r.stdout)


def not_info(doc):
    return [(f["code"], f["tensor"], f["message"]) for f in doc["findings"]
            if f["severity"] != "info"]


def test_generator_writes_what_it_promises(whole_models):
    spec = WM.WholeSpec(4, True, "gptq", "gptqmodel")
    d, truth = whole_models(spec)
    assert len(truth["modules"]) == 210 == 30 * 7
    assert all(t["in_features"] % 32 == 0 and t["out_features"] % 32 == 0
               for t in truth["modules"].values())
    assert truth["shards"] == [f"model-0000{i}-of-00004.safetensors" for i in (1, 2, 3, 4)]
    cfg = json.loads((d / "quantize_config.json").read_text())
    assert (cfg["bits"], cfg["sym"], cfg["desc_act"], cfg["checkpoint_format"]) == \
        (4, False, True, "gptq")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum((d / s).stat().st_size for s in truth["shards"])


@pytest.mark.parametrize("spec", PARAMS)
def test_clean_model_verifies_with_no_warning(run_cli, whole_models, spec):
    d, _ = whole_models(spec)
    code, doc = cli_json(run_cli, "verify", d, "--strict")
    assert (code, not_info(doc)) == (0, [])
    assert doc["summary"]["modules"] == 210


@pytest.mark.parametrize("spec", PARAMS)
def test_inspect_and_verify_agree_on_the_convention(run_cli, whole_models, spec):
    d, _ = whole_models(spec)
    _, ins = cli_json(run_cli, "inspect", d)
    _, ver = cli_json(run_cli, "verify", d)
    assert ins["checkpoint_format"]["detected"] == ver["checkpoint_format"]["detected"] \
        == spec.convention
    assert ins["checkpoint_format"]["declared"] == spec.convention


@pytest.mark.parametrize("spec", PARAMS)
def test_convert_to_the_other_convention_is_equal(run_cli, whole_models, tmp_path, spec):
    d, _ = whole_models(spec)
    dst = tmp_path / "out"
    code, doc = cli_json(run_cli, "convert", d, dst, "--to", other(spec.convention))
    assert (code, doc["findings"]) == (0, []) and doc["written"]
    code, doc = cli_json(run_cli, "verify", d, "--against", dst)
    s = doc["summary"]
    assert code == 0 and (s["modules"], s["equal"], s["differ"]) == (210, 210, 0)
    assert s["tensors"] > 0 and (s["tensors_differ"], s["configs_differ"]) == (0, 0)


@pytest.mark.parametrize("spec", PARAMS)
def test_mislabelled_copy_is_gq401_and_converts_with_from(run_cli, mislabelled_models,
                                                          tmp_path, spec):
    d, declared = mislabelled_models(spec)
    assert declared == other(spec.convention)
    code, doc = cli_json(run_cli, "verify", d)
    assert code == 1 and "GQ401" in {f["code"] for f in doc["findings"]}, not_info(doc)
    assert doc["checkpoint_format"]["detected"] == spec.convention
    dst = tmp_path / "out"
    code, doc = cli_json(run_cli, "convert", d, dst, "--from", spec.convention,
                         "--to", declared)
    assert code == 0 and doc["written"], doc["findings"]
    code, doc = cli_json(run_cli, "verify", dst, "--strict")
    assert (code, not_info(doc)) == (0, [])
