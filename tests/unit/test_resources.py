"""The data shipped with the package (gptqfmt/resources.py): the kernels' limits read from their
header."""
import pytest

from tests.support import ROOT


def test_kernel_limits_are_read_from_the_header():
    from gptqfmt.resources import kernel_constant
    header = (ROOT / "kernels" / "gptq_dequant.h").read_text()
    assert kernel_constant("GQ_MAX_M") == 16 and "#define GQ_MAX_M 16" in header
    for f in ("gptq_gemm.cu", "host_shim.c"):  # both use the one definition
        text = (ROOT / "kernels" / f).read_text()
        assert "GQ_MAX_M" in text and "#define GQ_MAX_M" not in text and "acc[16]" not in text
    with pytest.raises(LookupError, match="defines no integer GQ_NOPE"):
        kernel_constant("GQ_NOPE")


VALUES = [4, 4.0, 3, 8, 5, True, False, 1, 0, -1, 128, 0.5, -0.1, float("nan"), "int32",
          "int33", "gptq", None, {}, [], [4], {"+:x": {"bits": 4}}, {"-:y": {}},
          {"+:z": {"bits": 5}}, {"+:z": {"group_size": 0}}, {"+:z": {"sym": 1}},
          {"+:z": {"pack_dtype": "int8", "desc_act": True}}, {"+:z": 4}, {"tool": "x"}]
KEYS = ["bits", "group_size", "desc_act", "sym", "pack_dtype", "damp_percent", "dynamic",
        "meta", "extra_config", "checkpoint_format", "model_name_or_path", "unknown_key"]


def test_plainly_valid_only_where_the_validator_finds_no_error():
    """plainly_valid against jsonschema's validator on 3,000 random configs: never True where
    the validator finds an error; True for every shipped fixture's config, so that a command
    on them never needs the validator."""
    import json
    import random

    from gptqfmt.resources import plainly_valid, schema_errors, validator
    rnd = random.Random(11)
    v = validator("quantize_config")
    plain = 0
    for _ in range(3000):
        doc = {k: rnd.choice(VALUES) for k in rnd.sample(KEYS, rnd.randrange(0, 6))}
        if plainly_valid("quantize_config", doc):
            plain += 1
            assert v.is_valid(doc), doc
            assert schema_errors("quantize_config", doc) == []
    assert plain > 100   # the random configs reach both answers
    configs = []
    for p in (ROOT / "fixtures").rglob("*.json"):
        try:
            doc = json.loads(p.read_text())
        except ValueError:   # the hostile fixtures' broken files
            continue
        if p.name in ("quantize_config.json", "quant_config.json"):
            configs.append(doc)
        elif p.name == "config.json" and isinstance(doc, dict) and \
                isinstance(doc.get("quantization_config"), dict):
            configs.append(doc["quantization_config"])
    valid = [c for c in configs if v.is_valid(c)]
    assert len(valid) > 50 and all(plainly_valid("quantize_config", c) for c in valid)


@pytest.mark.parametrize("doc", [{"bits": 4.0}, {"group_size": 1.5}, {"bits": True},
                                 {"damp_percent": float("nan")}])
def test_what_plainly_valid_leaves_to_the_validator(doc):
    """An integral float (an integer in draft 2020-12), a bool where an integer is asked, NaN:
    never plainly valid, whatever the validator says."""
    from gptqfmt.resources import plainly_valid
    assert not plainly_valid("quantize_config", doc)


def test_inspect_of_a_valid_checkpoint_does_not_import_jsonschema():
    """jsonschema's import costs a tenth of a second; a valid config and index need none."""
    import subprocess
    import sys
    code = ("import sys; from gptqfmt.ops.inspect import inspect_checkpoint; "
            "r = inspect_checkpoint(sys.argv[1]); assert r.ok, r.findings; "
            "print('jsonschema' in sys.modules)")
    for name in ("b4-sym-noact-gptq-sharded", "b4-asym-act-gptq_v2-single"):
        out = subprocess.run([sys.executable, "-c", code, str(ROOT / "fixtures/ckpt" / name)],
                             capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "False"
