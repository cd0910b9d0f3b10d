"""What a person at a terminal sees (gptqfmt/cli/view.py): colour by severity only on a
terminal (--color, NO_COLOR), -q/--quiet on every command, --summary without per-module rows
(the default above SUMMARY_ABOVE modules), and shell completion through click."""
import json
import os
import pty
import re
import subprocess
import sys

import pytest

from gptqfmt.cli import main
from gptqfmt.cli import view as view_mod
from gptqfmt.cli.text_lines import without_rows
from gptqfmt.cli.view import Line, View, colour_wanted
from tests.support import CKPT, FIXTURES, ROOT

ANSI = re.compile(r"\x1b\[[0-9;]*m")
FAILING = FIXTURES / "invalid" / "config-not-json"     # one error, one warning... and more
PASSING = CKPT / "b4-asym-act-gptq-sharded"


def on_a_tty(args, env=None):
    """Run gptqfmt with stdout on a pseudo-terminal (where --color auto colours); returns
    (exit code, what the terminal showed)."""
    master, slave = pty.openpty()
    environ = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    p = subprocess.Popen([sys.executable, "-m", "gptqfmt", *map(str, args)], stdout=slave,
                         stderr=subprocess.DEVNULL, env={**environ, "TERM": "xterm",
                                                         **(env or {})}, cwd=ROOT)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return p.wait(), b"".join(chunks).decode()


def test_colour_on_a_terminal_and_never_in_a_pipe(run_cli):
    code, shown = on_a_tty(["verify", FAILING])
    assert code == 1 and "\x1b[31m" in shown  # errors red
    assert "\x1b[33m" in shown  # the warning yellow
    assert not ANSI.search(run_cli("verify", FAILING).stdout)  # CliRunner: not a terminal


@pytest.mark.parametrize("env,args,coloured", [
    ({"NO_COLOR": "1"}, [], False), ({"NO_COLOR": ""}, [], True),  # empty: unset (no-color.org)
    ({"TERM": "dumb"}, [], False), ({}, ["--color", "never"], False),
    ({"NO_COLOR": "1"}, ["--color", "always"], True)])  # asked for: wins over NO_COLOR
def test_no_color_and_the_color_option(env, args, coloured):
    _, shown = on_a_tty(["verify", FAILING, *args], env)
    assert bool(ANSI.search(shown)) == coloured


def test_color_always_into_a_pipe_and_only_in_text(run_cli):
    assert ANSI.search(run_cli("verify", FAILING, "--color", "always").stdout)
    assert not ANSI.search(run_cli("verify", FAILING, "--color", "always", "--format",
                                   "json").stdout)


def test_colour_follows_severity_line_by_line(run_cli):
    out = run_cli("verify", FAILING, "--color", "always").stdout.splitlines()
    for line in out:
        plain = ANSI.sub("", line)
        if " GQ2" in plain or " GQ4" in plain:
            colour = {"GQ206": "33", "GQ201": "31", "GQ401": "31"}[
                re.search(r"GQ\d{3}", plain)[0]]
            assert line.startswith(f"\x1b[{colour}m"), line
    assert out[-1].startswith("\x1b[31m\x1b[1mFAIL")  # the final line: bold
    ok = run_cli("verify", PASSING, "--color", "always").stdout.splitlines()[-1]
    assert ok.startswith("\x1b[32m\x1b[1mOK")


def test_colour_wanted_reads_the_stream_and_the_environment(monkeypatch):
    class Tty:
        def isatty(self):
            return True
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm")
    assert colour_wanted("auto", Tty()) and not colour_wanted("never", Tty())
    assert not colour_wanted("auto", object())  # no isatty: not a terminal
    monkeypatch.setenv("NO_COLOR", "x")
    assert not colour_wanted("auto", Tty()) and colour_wanted("always", Tty())


@pytest.mark.parametrize("args", [["verify", FAILING], ["inspect", FAILING],
                                  ["verify", PASSING], ["inspect", PASSING]])
def test_quiet_prints_only_error_findings_and_the_final_line(run_cli, args):
    full = run_cli(*args).stdout.splitlines()
    quiet = run_cli(*args, "-q")
    assert quiet.exit_code == run_cli(*args).exit_code
    lines = quiet.stdout.splitlines()
    assert lines[-1] == full[-1]
    errors = [ln.strip() for ln in full if re.search(r"(^|: )GQ\d{3} ", ln.strip())
              and ln.strip() in [q.strip() for q in lines[:-1]]]
    assert [ln.strip() for ln in lines[:-1]] == errors
    assert all(" GQ206 " not in ln for ln in lines)  # the warning left out
    if args[1] == FAILING:  # its errors are all there
        assert {re.search(r"GQ\d{3}", ln)[0] for ln in lines[:-1]} == {"GQ201", "GQ401"}
    assert quiet.stderr == ""


def test_quiet_is_on_every_command(run_cli, tmp_path):
    for name, cmd in main.commands.items():
        assert any(p.name == "quiet" and "-q" in p.opts for p in cmd.params), name
    r = run_cli("convert", CKPT / "b4-sym-noact-gptq-single", tmp_path / "out", "-q")
    assert r.exit_code == 0 and len(r.stdout.splitlines()) == 1
    r = run_cli("verify", tmp_path / "missing", "-q")  # errors still on stderr
    assert r.exit_code == 2 and "gptqfmt: error:" in r.stderr


@pytest.mark.parametrize("path", [PASSING, FIXTURES / "formats" / "ct-b4-asym-g32"],
                         ids=["gptq", "compressed-tensors"])
def test_summary_leaves_out_module_rows_and_says_how_to_see_them(run_cli, path):
    full = run_cli("inspect", path).stdout.splitlines()
    short = run_cli("inspect", path, "--summary").stdout.splitlines()
    rows = [ln for ln in full if ln.startswith("  model.")]
    assert rows and not [ln for ln in short if ln.startswith("  model.")]
    assert f"  ({len(rows)} module rows not shown; --no-summary lists them)" in short
    assert [ln for ln in full if ln not in rows and not ln.startswith("  module ")] == \
        [ln for ln in short if "not shown" not in ln]  # everything else kept


def test_summary_is_the_default_above_the_threshold(run_cli, monkeypatch):
    monkeypatch.setattr(view_mod, "SUMMARY_ABOVE", 6)  # the fixture has 7 modules
    assert "not shown" in run_cli("inspect", PASSING).stdout
    assert "not shown" not in run_cli("inspect", PASSING, "--no-summary").stdout
    monkeypatch.setattr(view_mod, "SUMMARY_ABOVE", 7)
    assert "not shown" not in run_cli("inspect", PASSING).stdout


def test_summary_of_verify_against_keeps_the_modules_that_differ(run_cli):
    r = run_cli("verify", CKPT / "mislabelled-b4-sym-v2-as-gptq", "--against",
                CKPT / "b4-sym-noact-gptq-single", "--summary")
    lines = r.stdout.splitlines()
    assert lines[0].startswith("FAIL: 7 of 7 modules compute another Y = X @ W")
    assert r.exit_code == 1 and all("DIFFERS" in ln for ln in lines[1:-1])
    assert lines[-1].startswith("FAIL: 0 of 7")


def test_without_rows_counts_rows_not_table_heads():
    lines = [Line("h"), Line("  module", "rowhead"), Line("a", "row"), Line("b", "row"),
             Line("tail", "final", "ok")]
    assert [ln.text for ln in without_rows(lines)] == [
        "h", "  (2 module rows not shown; --no-summary lists them)", "tail"]
    assert View(summary=None).summarise(65) and not View(summary=None).summarise(64)


def test_shell_completion_through_click():
    env = {**os.environ, "_GPTQFMT_COMPLETE": "bash_source"}
    script = subprocess.run([sys.executable, "-m", "gptqfmt"], env=env, capture_output=True,
                            text=True).stdout
    assert "_gptqfmt_completion" in script and "complete " in script
    env = {**os.environ, "_GPTQFMT_COMPLETE": "bash_complete", "COMP_WORDS": "gptqfmt ver",
           "COMP_CWORD": "1"}
    got = subprocess.run([sys.executable, "-m", "gptqfmt"], env=env, capture_output=True,
                         text=True).stdout
    assert got.split() == ["plain,verify"]
    env.update(COMP_WORDS="gptqfmt verify --for", COMP_CWORD="2")
    got = subprocess.run([sys.executable, "-m", "gptqfmt"], env=env, capture_output=True,
                         text=True).stdout
    assert got.split() == ["plain,--format"]


def test_no_text_line_can_start_a_ci_runner_command():
    """A name from the file that starts with `::` would make the line a GitHub Actions
    workflow command; its first colon is escaped instead."""
    import io

    from gptqfmt.cli.reporters import TextReporter
    from gptqfmt.findings import Finding

    buf = io.StringIO()
    found = [Finding("GQ125", "not referenced", file="::error title=x::pwned.safetensors"),
             Finding("GQ301", "lacks qzeros", tensor="::stop-commands::tok.qweight")]
    TextReporter(buf).failure("fail", 1, findings=found)
    lines = buf.getvalue().splitlines()
    assert not [ln for ln in lines if ln.lstrip().startswith("::")]
    assert lines[1].startswith("\\x3a:error title=x::pwned.safetensors: GQ125")


def test_a_long_line_is_wrapped_within_the_width_never_cut():
    from gptqfmt.cli.view import wrapped
    text = "  " + " ".join(f"word{i}" for i in range(60)) + " /a/" + "x" * 150
    pieces = wrapped(text, 100)
    assert all(len(p) <= 100 for p in pieces) and len(pieces) > 2
    assert pieces[0].startswith("  word0") and all(p.startswith("      ") for p in pieces[1:])
    assert "".join(p.strip() for p in pieces).replace(" ", "") == text.replace(" ", "")
    assert wrapped(text, 0) == [text] and wrapped("short", 100) == ["short"]


def test_the_width_is_100_unless_gptqfmt_width_says_otherwise(run_cli, monkeypatch):
    monkeypatch.setenv("GPTQFMT_WIDTH", "100")
    wide = run_cli("verify", "-v", CKPT / "b4-asym-noact-gptq_v2-single").stdout.splitlines()
    assert max(map(len, wide)) <= 100
    monkeypatch.setenv("GPTQFMT_WIDTH", "0")
    one = run_cli("verify", "-v", CKPT / "b4-asym-noact-gptq_v2-single").stdout.splitlines()
    assert max(map(len, one)) > 100 and len(one) < len(wide)


def test_explain_lists_every_finding_the_default_counts_them(run_cli):
    """GQ407 (an info) in each of 7 modules: by default counted on the status line, with -v
    one line each."""
    src = CKPT / "b4-asym-noact-gptq_v2-single"
    brief, full = run_cli("verify", src).stdout, run_cli("verify", "-v", src).stdout
    assert " GQ407 " not in brief and "7 infos (-v lists them)" in brief.splitlines()[-1]
    assert full.count(" GQ407 ") == 7 and "(-v lists them)" not in full
    assert "kernel" in full and "kernel" not in brief.split("\n", 2)[2]   # the -v table


def test_quiet_under_strict_keeps_the_warnings_that_fail(run_cli):
    src = CKPT / "gptqmodel-b4-asym-gptq"
    plain = run_cli("verify", "-q", src)
    strict = run_cli("verify", "-q", "--strict", src)
    assert strict.exit_code == 1
    warn = [ln for ln in strict.stdout.splitlines() if " GQ" in ln and ": FAIL" not in ln]
    assert warn and len(strict.stdout.splitlines()) > len(plain.stdout.splitlines())


def test_output_dash_is_stdout(run_cli, tmp_path):
    src = CKPT / "b4-sym-noact-gptq_v2-single"
    r = run_cli("verify", src, "--output", "json=-", "--output", f"sarif={tmp_path / 'r.sarif'}")
    assert r.exit_code == 0 and json.loads(r.stdout)["exit_code"] == 0
    assert (tmp_path / "r.sarif").exists()
    clash = run_cli("verify", src, "--format", "sarif", "--output", "json=-")
    assert clash.exit_code == 2 and "stdout carries one report" in clash.output
