"""The reporter layer: each output format is one class in gptqfmt/cli/reporters.py, every
command offers exactly those formats, and every reporter answers every kind of result."""
import inspect as pyinspect

import click

from gptqfmt.cli import main
from gptqfmt.cli.reporters import REPORTERS, with_exit_code

KINDS = ("inspect", "verify", "against", "reference", "convert", "fix_label", "doctor",
         "failure")


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
