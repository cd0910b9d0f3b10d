"""The `gptqfmt` command group and the one place that turns exceptions into exit codes."""
from __future__ import annotations

import functools
import traceback

import click

from ..errors import FindingError, GptqfmtError
from ..version import __version__
from .output import emit_json, escape, finding_line, note

FORMAT_OPTION = click.option("--format", "fmt", type=click.Choice(["text", "json"]),
                             default="text", show_default=True, help="Output format.")


def guarded(fn):
    """Run a command body; map errors to one line (or one JSON document) and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args, fmt="text", debug=False, **kwargs):
        try:
            code = fn(*args, fmt=fmt, **kwargs)
        except FindingError as e:
            _report_failure(fmt, "fail", 1, findings=e.findings)
            code = 1
        except GptqfmtError as e:
            _report_failure(fmt, "error", e.exit_code, message=str(e))
            code = e.exit_code
        except Exception as e:  # noqa: BLE001 - the catch-all that keeps tracebacks off CI logs
            if debug:
                traceback.print_exc()
            _report_failure(fmt, "error", 3, message=f"internal error: {type(e).__name__}: {e}"
                            + ("" if debug else " (run with --debug for the traceback)"))
            code = 3
        raise SystemExit(code or 0)

    wrapper = click.option("--debug", is_flag=True, hidden=True,
                           help="Show tracebacks of internal errors.")(wrapper)
    return FORMAT_OPTION(wrapper)


def _report_failure(fmt, status, exit_code, findings=(), message=None):
    if fmt == "json":
        doc = {"status": status, "exit_code": exit_code,
               "findings": [f.to_json() for f in findings]}
        if message:
            doc["error"] = message
        emit_json(doc)
        return
    for f in findings:
        click.echo(finding_line(f))
    if findings:
        click.echo(f"FAIL: stopped by {len(findings)} finding{'s' if len(findings) > 1 else ''}")
    if message:
        note(f"gptqfmt: error: {escape(message)}")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="gptqfmt")
def main():
    """Inspect, verify and convert GPTQ checkpoints (safetensors)."""


def _register():
    from .convert_cmd import convert_cmd
    from .inspect_cmd import inspect_cmd
    from .verify_cmd import verify_cmd

    main.add_command(inspect_cmd)
    main.add_command(verify_cmd)
    main.add_command(convert_cmd)


_register()


def run(argv: list[str] | None = None) -> None:
    """Console entry point: like main(), but a usage error that click itself finds (a bad
    option value, a missing argument) still prints one JSON document under --format json."""
    import sys

    args = list(sys.argv[1:] if argv is None else argv)
    try:
        code = main.main(args=args, prog_name="gptqfmt", standalone_mode=False)
    except click.ClickException as e:
        if _wants_json(args):
            emit_json({"status": "error", "exit_code": e.exit_code, "findings": [],
                       "error": e.format_message()})
        else:
            e.show()
        code = e.exit_code
    except click.Abort:
        note("gptqfmt: aborted")
        code = 130
    raise SystemExit(code or 0)


def _wants_json(args: list[str]) -> bool:
    return "--format=json" in args or any(a == "--format" and b == "json"
                                          for a, b in zip(args, args[1:]))
