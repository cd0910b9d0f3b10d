"""The record convert and fix-label leave in each config they write (`meta.gptqfmt`): one shape,
built by one function (conversion/configs.py provenance): tool, version, command, from, to, then
the command's own field (convert's `totals`, fix-label's `previous`)."""
import json
import shutil

from gptqfmt.conversion.configs import provenance
from gptqfmt.version import __version__
from tests.support import CKPT

MISLABELLED = CKPT / "mislabelled-b4-sym-v2-as-gptq"   # gptq_v2 data labelled gptq
COMMON = ["tool", "version", "command", "from", "to"]


def records(d):
    """meta.gptqfmt of each config file of checkpoint `d` that holds a quantization config."""
    out = {}
    q = json.loads((d / "quantize_config.json").read_text())
    out["quantize_config.json"] = q["meta"]["gptqfmt"]
    cfg = json.loads((d / "config.json").read_text())
    out["config.json"] = cfg["quantization_config"]["meta"]["gptqfmt"]
    return out


def test_convert_and_fix_label_write_one_shape(run_cli, tmp_path):
    src = CKPT / "b4-sym-noact-gptq-single"
    r = run_cli("convert", src, tmp_path / "v2", "--to", "gptq_v2", "--format", "json")
    assert r.exit_code == 0, r.stdout
    totals = json.loads(r.stdout)["totals"]
    converted = records(tmp_path / "v2")

    d = tmp_path / "relabel"
    shutil.copytree(MISLABELLED, d)
    before = {n: json.loads((d / n).read_text()) for n in ("quantize_config.json", "config.json")}
    r = run_cli("fix-label", "--quiet", "--format", "json", d)
    assert r.exit_code == 0, r.stdout
    relabelled = records(d)

    for name, rec in converted.items():
        assert list(rec) == COMMON + ["totals"], name
        assert rec == {"tool": "gptqfmt", "version": __version__, "command": "convert",
                       "from": "gptq", "to": "gptq_v2", "totals": totals}
    for name, rec in relabelled.items():
        assert list(rec) == COMMON + ["previous"], name
        q = before[name] if name != "config.json" else before[name]["quantization_config"]
        assert rec == {"tool": "gptqfmt", "version": __version__, "command": "fix-label",
                       "from": "gptq", "to": "gptq_v2",
                       "previous": {"checkpoint_format": q["checkpoint_format"],
                                    "format": q["format"]}}
        assert q["checkpoint_format"] == q["format"] == "gptq"   # the label it carried


def test_the_record_carries_only_the_field_its_command_has():
    convert = provenance("gptq", "gptq_v2", {"fields": 4, "changed": 4, "ambiguous": 0,
                                             "lossy": 0})
    relabel = provenance(None, "gptq", command="fix-label",
                         previous={"checkpoint_format": None, "desc_act": True})
    assert convert == {"tool": "gptqfmt", "version": __version__, "command": "convert",
                       "from": "gptq", "to": "gptq_v2",
                       "totals": {"fields": 4, "changed": 4, "ambiguous": 0, "lossy": 0}}
    assert relabel == {"tool": "gptqfmt", "version": __version__, "command": "fix-label",
                       "from": None, "to": "gptq",
                       "previous": {"checkpoint_format": None, "desc_act": True}}
