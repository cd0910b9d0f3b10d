"""The reporter layer: each output format is one class in gptqfmt/cli/reporters.py, every
command offers exactly those formats, and every reporter answers every kind of result."""
import inspect as pyinspect
import json
import shutil

import click
import jsonschema

from gptqfmt.cli import main
from gptqfmt.cli.reporters import REPORTERS, with_exit_code
from tests.support import CKPT, ROOT

KINDS = ("inspect", "verify", "against", "reference", "convert", "fix_label", "doctor",
         "scan", "failure")


def test_every_command_offers_the_reporters_formats():
    for name, cmd in main.commands.items():
        opt = next(p for p in cmd.params if p.name == "fmt")
        assert isinstance(opt.type, click.Choice) and \
            list(opt.type.choices) == ["text", "json", "github", "sarif", "junit"] == \
            list(REPORTERS), name


def test_every_reporter_answers_every_result_with_one_signature():
    for r in REPORTERS.values():
        public = {n for n in dir(r) if callable(getattr(r, n)) and not n.startswith("_")}
        assert public - {"echo", "emit"} == set(KINDS), r.__name__
    for kind in KINDS:
        sigs = {str(pyinspect.signature(getattr(r, kind))) for r in REPORTERS.values()}
        assert len(sigs) == 1, (kind, sigs)


def test_the_exit_code_goes_after_the_documents_header():
    assert list(with_exit_code({"tool": 1, "status": "ok", "src": 2}, 0)) == \
        ["tool", "status", "exit_code", "src"]
    assert list(with_exit_code({"status": "ok", "mode": "against", "src": 2}, 1)) == \
        ["status", "mode", "exit_code", "src"]


def test_every_json_document_carries_its_exit_code(run_cli, tmp_path):
    """inspect and verify too, right after status; fix-label's nested verify report is the
    document verify itself prints, exit_code included."""
    for args, code in ((["inspect", CKPT / "b4-sym-noact-gptq-single"], 0),
                       (["verify", CKPT / "b4-sym-noact-gptq-single"], 0),
                       (["inspect", CKPT / "mislabelled-b4-sym-v2-as-gptq"], 1),
                       (["verify", CKPT / "mislabelled-b4-sym-v2-as-gptq"], 1)):
        r = run_cli(*args, "--format", "json")
        doc = json.loads(r.stdout)
        assert r.exit_code == doc["exit_code"] == code, args
        assert list(doc)[list(doc).index("status") + 1] == "exit_code"
    d = tmp_path / "ck"
    shutil.copytree(CKPT / "mislabelled-b4-sym-v2-as-gptq", d)
    r = run_cli("fix-label", "--quiet", "--format", "json", d)
    doc = json.loads(r.stdout)
    assert r.exit_code == doc["exit_code"] == doc["verify"]["exit_code"] == 0
    assert doc["verify"] == json.loads(run_cli("verify", d, "--format", "json").stdout)
    # valid by the schema file alone, as a plain validator loads it
    jsonschema.validate(doc, json.loads((ROOT / "schemas" / "fix_label.schema.json").read_text()))
