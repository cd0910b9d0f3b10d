"""The one error boundary of every command: exceptions become one line (or one JSON document)
and an exit code."""
from __future__ import annotations

import functools
import traceback

import click

from ..errors import FindingError, GptqfmtError
from .reporters import REPORTERS, reporter

FORMAT_OPTION = click.option("--format", "fmt", type=click.Choice(list(REPORTERS)),
                             default="text", show_default=True, help="Output format.")


def guarded(fn):
    """Run a command body; map errors to one line (or one JSON document) and an exit code."""

    @functools.wraps(fn)
    def wrapper(*args, fmt="text", debug=False, **kwargs):
        try:
            code = fn(*args, fmt=fmt, **kwargs)
        except FindingError as e:
            reporter(fmt).failure("fail", 1, findings=e.findings)
            code = 1
        except GptqfmtError as e:
            reporter(fmt).failure("error", e.exit_code, message=str(e))
            code = e.exit_code
        except Interrupted as e:  # SIGINT/SIGTERM/SIGHUP; `finally` blocks (staging) have run
            reporter(fmt).failure("error", e.exit_code, message=str(e))
            code = e.exit_code
        except BrokenPipeError:
            raise  # stdout was closed (`| head`): not an internal error; run() exits quietly
        except Exception as e:  # noqa: BLE001 - the catch-all that keeps tracebacks off CI logs
            if debug:
                traceback.print_exc()
            reporter(fmt).failure("error", 3, message=f"internal error: {type(e).__name__}: "
                                  f"{e}" + ("" if debug else " (run with --debug for the "
                                            "traceback)"))
            code = 3
        raise SystemExit(code or 0)

    wrapper = click.option("--debug", is_flag=True,
                           help="Show the traceback of an internal error (exit 3).")(wrapper)
    return FORMAT_OPTION(wrapper)


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP arrived (main._handle_signals). A BaseException, like
    KeyboardInterrupt, so that no `except Exception` stops it and every `finally` on the way
    runs; not a KeyboardInterrupt, which click would turn into Abort and lose the signal."""

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        self.exit_code = 128 + signum  # what a shell reports for a process the signal killed
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
