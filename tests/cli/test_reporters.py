"""The reporter layer: each output format is one class in gptqfmt/cli/reporters.py, every
command offers exactly those formats, and every reporter answers every kind of result."""
import enum
import inspect as pyinspect
import json
import math
import random
import shutil

import click
import jsonschema
import pytest

from gptqfmt.cli import main
from gptqfmt.cli.output import json_text
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


# -- the JSON text: json.dumps(indent=2) byte for byte, non-finite floats null ---------------
def _finite_reference(x):
    """The slow reference: every non-finite float value replaced, then json's own encoder."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite_reference(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_finite_reference(v) for v in x]
    return x


class _Kind(enum.IntEnum):
    A = 3


def _random_doc(rng: random.Random, depth: int = 0):
    leaves = [lambda: rng.randint(-2**70, 2**70), lambda: rng.random() * 10 ** rng.randint(-30, 30),
              lambda: rng.choice([float("nan"), float("inf"), -float("inf"), -0.0, 0.1]),
              lambda: rng.choice([True, False, None, _Kind.A]),
              lambda: "".join(rng.choice('aé\u2028"\\\n\t\x00\x1f☃😀/<>') for _ in
                              range(rng.randint(0, 8)))]
    if depth > 4 or rng.random() < 0.4:
        return rng.choice(leaves)()
    n = rng.randint(0, 5)
    kind = rng.random()
    if kind < 0.4:
        keys = [rng.choice(["k", "é", "a\nb", 1, 2.5, True, False, None]) for _ in range(n)]
        return {k: _random_doc(rng, depth + 1) for k in keys}
    items = [_random_doc(rng, depth + 1) for _ in range(n)]
    return tuple(items) if kind < 0.5 else items


@pytest.mark.parametrize("seed", range(40))
def test_json_text_is_jsons_own_indented_text(seed):
    doc = _random_doc(random.Random(seed))
    want = json.dumps(_finite_reference(doc), indent=2, allow_nan=False)
    assert json_text(doc) == want


def test_json_text_refuses_what_json_refuses():
    with pytest.raises(TypeError):
        json_text({"a": object()})
    with pytest.raises(TypeError):
        json_text({(1, 2): 3})
    with pytest.raises(ValueError):
        json_text({float("nan"): 1})
