"""The command line's start: --version, --help, `COMMAND --help` and shell completion load no
library code (numpy, jsonschema, the formats, conversion); a Ctrl-C while it starts is one line
and exit 130; an option given to the wrong command names the commands that have it; runtime ids
are case-insensitive and completed wherever --runtime is taken.

Each start is a process of its own, whose sys.modules is printed at its end: what the start
loaded, read deterministically (no timing)."""
import json
import os
import signal
import subprocess
import sys

import pytest

from tests.support import CKPT, ROOT

ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
ENV.pop("GPTQFMT_FAULT", None)
for var in [v for v in ENV if v.startswith("_GPTQFMT")]:
    ENV.pop(var)
PATH = CKPT / "b4-sym-noact-gptq-single"

# what a start must not load: the library below the command line, and its heavy dependencies
HEAVY = ("numpy", "jsonschema", "tqdm", "gptqfmt.bits", "gptqfmt.formats", "gptqfmt.conversion",
         "gptqfmt.safetensors_io", "gptqfmt.runtimes", "gptqfmt.ops", "gptqfmt.doctor",
         "gptqfmt.cli.reporters")

# runs the CLI as the console script does, then prints the modules loaded, on stderr
RUN_THEN_LIST = """
import json, sys
from gptqfmt.cli import run
try:
    run(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def start(*args, env=None):
    """(exit code, stdout, stderr lines before the last, modules loaded) of one CLI process."""
    r = subprocess.run([sys.executable, "-c", RUN_THEN_LIST, *map(str, args)],
                       capture_output=True, text=True, env={**ENV, **(env or {})})
    *err, last = r.stderr.splitlines()
    end = json.loads(last)
    return end["code"], r.stdout, err, set(end["modules"])


def heavy(modules):
    return sorted(m for m in modules if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("args, says", [
    (["--version"], "gptqfmt, version "),
    (["--help"], "Usage: gptqfmt [OPTIONS] COMMAND [ARGS]..."),
    (["inspect", "--help"], "Usage: gptqfmt inspect [OPTIONS] PATH"),
    (["verify", "-h"], "Usage: gptqfmt verify [OPTIONS] PATH"),
    (["convert", "--help"], "Usage: gptqfmt convert [OPTIONS] SRC [DST]"),
    (["fix-label", "--help"], "Usage: gptqfmt fix-label [OPTIONS] PATH"),
    (["doctor", "--help"], "Usage: gptqfmt doctor [OPTIONS] PATH"),
], ids=lambda x: " ".join(x) if isinstance(x, list) else None)
def test_version_and_help_load_no_library(args, says):
    code, out, err, modules = start(*args)
    assert (code, err) == (0, []) and out.startswith(says)
    assert "gptqfmt.cli.main" in modules  # the command line was there, and nothing below it
    assert heavy(modules) == []


def test_the_library_is_loaded_when_a_command_runs():
    """The other side: the same listing shows the library once a command body runs."""
    code, out, err, modules = start("inspect", PATH, "--format", "json")
    assert code == 0 and json.loads(out)["status"] == "ok"
    assert {"numpy", "gptqfmt.formats", "gptqfmt.ops.inspect"} <= modules


# what inspect never needs: the other commands' libraries (convert's, doctor's, scan's, verify's
# whole-checkpoint checks) and the junit reporter's XML
OTHER_COMMANDS = ("gptqfmt.conversion", "gptqfmt.doctor", "gptqfmt.ops.scan",
                  "gptqfmt.ops.equivalence", "gptqfmt.ops.verify", "gptqfmt.numerics", "xml")


@pytest.mark.parametrize("fmt", ["text", "json", "github", "sarif"])
def test_inspect_loads_no_other_commands_library(fmt):
    """The reporters name every command's result type, for type checks only: an inspect start
    (its imports are a tenth of a mixture of experts' run) loads none of their modules."""
    code, out, err, modules = start("inspect", PATH, "--format", fmt)
    assert code == 0 and out
    assert "gptqfmt.ops.inspect" in modules
    assert sorted(m for m in modules if m.startswith(OTHER_COMMANDS)) == []


def test_import_gptqfmt_loads_nothing_until_a_name_is_used():
    script = ("import sys, gptqfmt; before = set(sys.modules); gptqfmt.pack; "
              "print(sorted(before)); print(gptqfmt.pack.__module__)")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV,
                       check=True)
    before, module = r.stdout.splitlines()
    assert heavy(eval(before)) == [] and module == "gptqfmt.bits.packing"


def test_the_doctor_export_stays_the_function_when_its_module_is_imported():
    """gptqfmt.doctor is the function; importing the module gptqfmt/doctor.py (as the doctor
    command does) must not put the module in its place."""
    script = ("import gptqfmt, gptqfmt.doctor as m, inspect; "
              "print(inspect.isfunction(gptqfmt.doctor), m is gptqfmt.doctor)")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=ENV,
                       check=True)
    assert r.stdout.split() == ["True", "True"]


# ------------------------------------------------------------------ shell completion
def complete(*words):
    """bash completion of the last of `words` (after `gptqfmt`), as click's script asks it."""
    code, out, err, modules = start(env={"_GPTQFMT_COMPLETE": "bash_complete",
                                         "COMP_WORDS": " ".join(["gptqfmt", *words]),
                                         "COMP_CWORD": str(len(words))})
    assert (code, err) == (0, [])
    return [line.partition(",")[2] for line in out.splitlines()], heavy(modules)


def test_runtime_completion_on_doctor_and_verify_any_case():
    assert complete("doctor", "x", "--runtime", "VLLM-") == \
        (["vllm-gptq-gemm", "vllm-humming", "vllm-legacy"], [])
    assert complete("doctor", "x", "--runtime", "ll") == (["llama.cpp"], [])
    assert complete("verify", "x", "--runtime", "Sg") == \
        (["sglang", "sglang-gptq-gemm"], [])
    assert complete("verify", "x", "--runtime", "a") == (["all", "autogptq"], [])
    # a list: the ids after the last comma, the ones already named left out
    assert complete("verify", "x", "--runtime", "tgi,vllm-l") == (["tgi,vllm-legacy"], [])
    assert complete("verify", "x", "--runtime", "tgi,t") == (["tgi,transformers"], [])


# ------------------------------------------------------------------ Ctrl-C while starting
@pytest.mark.faults
def test_ctrl_c_while_starting_is_one_line_and_130():
    """SIGINT at the `start` stage, before main.py is imported and its handlers set: Python's
    own handler raises KeyboardInterrupt there, which the entry point turns into one line,
    without loading the library to say so."""
    code, out, err, modules = start("inspect", PATH, env={"GPTQFMT_FAULT": "start:INT"})
    assert (code, out, err) == (130, "", ["gptqfmt: error: interrupted by SIGINT"])
    assert heavy(modules) == []


@pytest.mark.faults
@pytest.mark.parametrize("entry", [["-m", "gptqfmt"], ["-c", "from gptqfmt.cli import run; run()"]])
def test_ctrl_c_while_starting_under_json_is_one_document(entry):
    r = subprocess.run([sys.executable, *entry, "inspect", str(PATH), "--format", "json"],
                       capture_output=True, text=True, env={**ENV, "GPTQFMT_FAULT": "start:INT"})
    assert r.returncode == 128 + signal.SIGINT and r.stderr == ""
    assert json.loads(r.stdout) == {"status": "error", "exit_code": 130, "findings": [],
                                    "error": "interrupted by SIGINT"}


@pytest.mark.faults
def test_ctrl_c_inside_a_commands_import_is_one_line_and_130():
    """A KeyboardInterrupt raised while a command imports its library code (here: the
    import machinery raises it for gptqfmt.ops.inspect) ends the command like Ctrl-C."""
    script = "\n".join([
        "import sys",
        "class Stop:",
        "    def find_spec(self, name, path=None, target=None):",
        "        if name == 'gptqfmt.ops.inspect':",
        "            raise KeyboardInterrupt",
        "sys.meta_path.insert(0, Stop())",
        "from gptqfmt.cli import run",
        "run(sys.argv[1:])",
    ])
    r = subprocess.run([sys.executable, "-c", script, "inspect", str(PATH)], capture_output=True,
                       text=True, env=ENV)
    assert (r.returncode, r.stdout, r.stderr) == (130, "", "gptqfmt: error: interrupted by "
                                                            "SIGINT\n")


@pytest.mark.parametrize("entry", ["gptqfmt.cli.run", "gptqfmt.cli.precommit.run"])
def test_ctrl_c_before_the_handlers_are_set(monkeypatch, capsys, entry):
    """main.run's own window, before _handle_signals has set the handlers (gptqfmt-pre-commit
    enters there); the SIGINT handler is left as it was."""
    import importlib

    main_module = importlib.import_module("gptqfmt.cli.main")

    def not_yet():
        raise KeyboardInterrupt
    monkeypatch.setattr(main_module, "_handle_signals", not_yet)
    module, _, name = entry.rpartition(".")
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(SystemExit) as e:
        getattr(importlib.import_module(module), name)([str(PATH / "config.json")])
    assert e.value.code == 130 and signal.getsignal(signal.SIGINT) is before
    assert capsys.readouterr() == ("", "gptqfmt: error: interrupted by SIGINT\n")


# ------------------------------------------------------------------ an option of another command
def cli(*args):
    r = subprocess.run([sys.executable, "-m", "gptqfmt", *map(str, args)], capture_output=True,
                       text=True, env=ENV)
    return r.returncode, r.stdout, r.stderr


def test_an_option_of_other_commands_names_them():
    code, out, err = cli("inspect", "--runtime", "vllm", PATH)
    assert code == 2 and out == ""
    assert err.splitlines()[-1] == (
        f"Error: No such option '--runtime' (inspect has no --runtime; verify and doctor have "
        f"it: `gptqfmt verify --runtime vllm {PATH}`)")
    assert "Did you mean" not in err
    code, out, err = cli("convert", PATH, "--strict")
    assert code == 2 and err.splitlines()[-1] == (
        f"Error: No such option '--strict' (convert has no --strict; verify has it: "
        f"`gptqfmt verify {PATH} --strict`)")


def test_an_option_of_other_commands_under_json_is_one_document():
    code, out, err = cli("doctor", PATH, "--format", "json", "--against=x")
    doc = json.loads(out)
    assert code == 2 and err == "" and doc["exit_code"] == 2 and doc["status"] == "error"
    assert doc["error"] == (
        f"No such option '--against' (doctor has no --against; verify has it: "
        f"`gptqfmt verify {PATH} --format json --against=x`)")


def test_an_option_no_command_has_keeps_clicks_suggestion():
    code, out, err = cli("inspect", "--sumary", PATH)
    assert code == 2 and "Did you mean" in err and "--summary" in err and "has it" not in err


# ------------------------------------------------------------------ runtime ids in any case
def test_verify_takes_runtime_ids_in_any_case():
    from gptqfmt.cli import main
    from gptqfmt.cli.verify_cmd import runtime_ids
    from gptqfmt.runtimes import BY_ID

    ctx = main.commands["verify"].make_context("verify", [str(PATH), "--runtime", "VLLM,Tgi"])
    assert runtime_ids(ctx.params["runtime"]) == ("vllm", "tgi")
    ctx = main.commands["verify"].make_context("verify", [str(PATH), "--runtime", "ALL"])
    assert runtime_ids(ctx.params["runtime"]) == tuple(BY_ID)


def test_an_unknown_runtime_id_in_any_case_lists_the_known_ones(run_cli):
    r = run_cli("verify", "--format", "json", "--runtime", "Vllm,NOPE", PATH)
    doc = json.loads(r.stdout)
    assert r.exit_code == 2 and doc["error"].startswith("--runtime 'nope': not a runtime id; "
                                                        "known: vllm, vllm-gptq-gemm")


# ------------------------------------------------------------------ names written out for --help
def test_names_the_command_line_writes_out_are_the_librarys():
    """--help shows these without loading the library; the library decides them."""
    from gptqfmt.bits.conventions import GPTQ_V2
    from gptqfmt.cli import boundary, main
    from gptqfmt.cli.reporters import REPORTERS
    from gptqfmt.conversion import relabel
    from gptqfmt.formats import FORMATS, TARGETS
    from gptqfmt.runtimes.table import RUNTIMES

    def option(command, name):
        return next(p for p in main.commands[command].params if p.name == name)
    assert boundary.FORMAT_NAMES == tuple(REPORTERS)
    assert boundary.RUNTIME_IDS == tuple(r.id for r in RUNTIMES)
    assert boundary.RUNTIME_FAMILIES == tuple(sorted({r.family for r in RUNTIMES}))
    assert tuple(option("convert", "to").type.choices) == TARGETS
    assert option("convert", "to").default == GPTQ_V2
    assert tuple(option("convert", "src_convention").type.choices) == ("auto", *FORMATS)
    assert tuple(option("fix-label", "to").type.choices) == relabel.TARGETS
    assert option("fix-label", "to").default == relabel.DETECTED


def test_ctrl_c_inside_a_command_body_where_no_handler_was_set(run_cli, monkeypatch):
    """main() called directly (no run(), so no signal handlers): Ctrl-C in the body is still
    one line and 130, not click's "Aborted!"."""
    import gptqfmt.ops.inspect as ops

    def interrupted(path):
        raise KeyboardInterrupt
    monkeypatch.setattr(ops, "inspect_checkpoint", interrupted)
    r = run_cli("inspect", PATH)
    assert (r.exit_code, r.stdout, r.stderr) == (130, "", "gptqfmt: error: interrupted by "
                                                          "SIGINT\n")


def test_the_pre_commit_hooks_help_loads_no_library():
    script = RUN_THEN_LIST.replace("from gptqfmt.cli import run",
                                   "from gptqfmt.cli.precommit import run")
    r = subprocess.run([sys.executable, "-c", script, "--help"], capture_output=True, text=True,
                       env=ENV)
    end = json.loads(r.stderr.splitlines()[-1])
    assert end["code"] == 0 and r.stdout.startswith("Usage: gptqfmt-pre-commit")
    assert heavy(end["modules"]) == []


# runs the CLI, then prints the BLAS thread variables numpy read at its import, on stderr
RUN_THEN_BLAS = """
import json, os, sys
from gptqfmt.cli import run
from gptqfmt.cli.main import BLAS_THREADS
seen = {}
class AtNumpy:   # the variables as numpy's import finds them, the moment it starts
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" and not seen:
            seen.update({v: os.environ.get(v) for v in BLAS_THREADS})
sys.meta_path.insert(0, AtNumpy())
try:
    run(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps({"numpy": "numpy" in sys.modules, "blas": seen}), file=sys.stderr)
"""


@pytest.mark.parametrize("given", [None, "3"])
def test_numpy_blas_runs_on_one_thread_unless_the_user_says(given):
    """gptqfmt's own threads share the cores; a BLAS pool (whose OpenBLAS threads spin after
    each small product) would take them. Set before numpy loads, and a user's value wins."""
    env = {k: v for k, v in ENV.items() if k not in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                                                     "OMP_NUM_THREADS")}
    if given:
        env["OPENBLAS_NUM_THREADS"] = given
    r = subprocess.run([sys.executable, "-c", RUN_THEN_BLAS, "inspect", str(PATH)],
                       capture_output=True, text=True, env=env)
    end = json.loads(r.stderr.splitlines()[-1])
    assert end["numpy"]   # the command loaded numpy, and found the variables set:
    assert end["blas"] == {"OPENBLAS_NUM_THREADS": given or "1", "MKL_NUM_THREADS": "1",
                           "OMP_NUM_THREADS": "1"}


# runs the CLI, then prints the collector's thresholds as the command left them, on stderr
RUN_THEN_GC = """
import gc, json, sys
from gptqfmt.cli import run
before = gc.get_threshold()
try:
    run(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps({"before": before, "after": gc.get_threshold()}), file=sys.stderr)
"""


def test_a_command_runs_the_cyclic_collector_less_often():
    from gptqfmt.cli.main import GC_THRESHOLDS

    r = subprocess.run([sys.executable, "-c", RUN_THEN_GC, "inspect", str(PATH)],
                       capture_output=True, text=True, env=ENV)
    end = json.loads(r.stderr.splitlines()[-1])
    assert tuple(end["after"]) == GC_THRESHOLDS and end["after"][0] > end["before"][0]
