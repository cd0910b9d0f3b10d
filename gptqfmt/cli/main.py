"""The `gptqfmt` command group, its entry point, and the process-level handling around it
(signals, a closed stdout, usage errors click finds); command bodies run inside
boundary.guarded."""
from __future__ import annotations

import click

from ..version import __version__
from .boundary import FORMAT_NAMES, Interrupted
from .convert_cmd import convert_cmd
from .doctor_cmd import doctor_cmd
from .fix_label_cmd import fix_label_cmd
from .inspect_cmd import inspect_cmd
from .scan_cmd import scan_cmd
from .verify_cmd import verify_cmd

__all__ = ["Interrupted", "main", "run"]

@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="gptqfmt")
def main():
    """Inspect, verify and convert GPTQ checkpoints (safetensors).

    PATH is a checkpoint directory (one model.safetensors, or shards with
    model.safetensors.index.json), one .safetensors file, or a Hugging Face repo id
    org/model[@revision] read from the local cache (the [hub] extra). Every command takes
    --format text|json|github|sarif|junit (json: exactly one document on stdout), --output
    FORMAT=FILE, -q/--quiet, --color auto|always|never and --debug. Exit codes: 0 ok, 1
    findings, 2 usage or unreadable path, 3 internal error, 130/143/129 interrupted, 141 stdout
    closed."""


main.add_command(inspect_cmd)
main.add_command(verify_cmd)
main.add_command(convert_cmd)
main.add_command(fix_label_cmd)
main.add_command(doctor_cmd)
main.add_command(scan_cmd)


def run(argv: list[str] | None = None, command: click.Command | None = None,
        prog_name: str = "gptqfmt") -> None:
    """Console entry point of `command` (the gptqfmt group; gptqfmt-pre-commit passes its own):
    like calling it, but a usage error that click itself finds (a bad option value, a missing
    argument) still prints one JSON document under --format json.

    SIGINT, SIGTERM and SIGHUP unwind like Ctrl-C (convert removes its staging directory) and
    exit 128 + the signal number: 130, 143, 129; so does a Ctrl-C before the handlers are set
    (interrupted_at_start). A closed stdout (`| head -1`) exits 141 quietly."""
    import sys

    single_threaded_blas()
    fewer_collections()
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        restore = _handle_signals()
    except KeyboardInterrupt:  # Ctrl-C before the handlers were set
        raise SystemExit(interrupted_at_start(args)) from None
    try:
        try:
            code = _invoke(args, command or main, prog_name)
            if sys.stdout is not None:  # None: started with stdout closed (`>&-`)
                sys.stdout.flush()  # a closed pipe shows here, not in the exit flush
        except Interrupted as e:  # outside a command body (guarded reports those)
            _report_outside_command(args, e.exit_code, str(e))
            code = e.exit_code
    except BrokenPipeError:
        code = _stdout_closed()
    finally:
        restore()
    raise SystemExit(code or 0)


#: the BLAS libraries numpy may be built with, and the variables that set their thread count
BLAS_THREADS = ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OMP_NUM_THREADS")


def single_threaded_blas() -> None:
    """Run numpy's BLAS on the calling thread, where the user has not said otherwise; before
    numpy is imported, which reads these once. gptqfmt spreads its work over the cores
    itself (modules, tiles, shards), and its only matrix products are small (Y = X @ W on 16
    rows and a few columns): a BLAS thread pool gains nothing there, and OpenBLAS's threads
    spin for a while after each product, taking the cores from gptqfmt's own threads (a
    seventh of the CPU time of a convert between formats, in a profile)."""
    import os

    for name in BLAS_THREADS:
        os.environ.setdefault(name, "1")


#: the cyclic garbage collector's thresholds in a command (Python's defaults: 700, 10, 10)
GC_THRESHOLDS = (50_000, 20, 20)


def fewer_collections() -> None:
    """Let the cyclic garbage collector pass less often. gptqfmt's objects are freed by their
    reference counts (it makes few cycles), while each of the collector's passes walks the
    objects it tracks, whose number grows with the module count: at the defaults its passes
    took 12% of inspect's CPU on a mixture of experts of 36,472 modules (`perf record`), and
    at these thresholds inspect ran in 9.4 to 11.0 s against 11.2 to 12.6 s (three rounds
    alternating). Between passes the youngest generation holds at most 50,000 objects."""
    import gc

    gc.set_threshold(*GC_THRESHOLDS)


def _invoke(args: list[str], command: click.Command, prog_name: str) -> int:
    """`command` without click's standalone handling; returns the exit code."""
    import errno
    import sys

    from .. import faults

    stdout = sys.stdout
    try:
        try:
            faults.point("command")
        except ValueError as e:  # a malformed GPTQFMT_FAULT (a test hook): one line, exit 2
            _report_outside_command(args, 2, str(e))
            return 2
        try:
            return command.main(args=args, prog_name=prog_name, standalone_mode=False)
        except click.NoSuchOption as e:
            raise _with_its_commands(e, args) from None
    except SystemExit as e:
        # click catches EPIPE itself: it swaps in a sys.stdout that swallows the error and exits
        # 1 (older versions: from inside the except clause). Closed output is handled here.
        ctx = e.__context__
        if sys.stdout is not stdout or isinstance(ctx, OSError) and ctx.errno == errno.EPIPE:
            raise BrokenPipeError(errno.EPIPE, "Broken pipe") from None
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except click.ClickException as e:
        if _format_of(args) == "text":
            e.show()  # click's own usage text
        else:
            _report_outside_command(args, e.exit_code, message=e.format_message())
        return e.exit_code
    except click.Abort as e:  # EOF at a prompt, or a KeyboardInterrupt click caught itself
        if isinstance(e.__cause__, KeyboardInterrupt):
            return interrupted(args)
        _report_outside_command(args, 130, "aborted")
        return 130


def _report_outside_command(args: list[str], exit_code: int, message: str) -> None:
    fmt = _format_of(args)
    if fmt == "text":  # what the text reporter prints, without loading the reporters
        from .output import note

        note(f"gptqfmt: error: {message}")
        return
    from .reporters import reporter

    reporter(fmt).failure("error", exit_code, message=message)


def interrupted_at_start(args: list[str]) -> int:
    """A Ctrl-C (KeyboardInterrupt) before run() set its signal handlers (gptqfmt.cli.run
    catches one while this module loads), reported as one later is; returns 130. A second
    Ctrl-C meanwhile ends the process at once, as one does while a command unwinds."""
    import signal
    import threading

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, signal.SIG_DFL) if in_main else None
    try:
        return interrupted(args)
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def interrupted(args: list[str]) -> int:
    """Report a Ctrl-C that came outside a command body as Interrupted reports one: one line
    (or one document); returns the exit code, 130."""
    import signal

    e = Interrupted(signal.SIGINT)
    _report_outside_command(args, e.exit_code, str(e))
    return e.exit_code


def _with_its_commands(e: click.NoSuchOption, args: list[str]) -> click.NoSuchOption:
    """An option the command does not have: when other commands of the group have it, the
    error says which, and the command line with the first of them, in place of click's "Did
    you mean", which would offer an unrelated option of this command. Else `e` as it is."""
    import shlex

    ctx = e.ctx
    root = ctx.find_root() if ctx is not None else None
    if ctx is None or root is None or ctx is root or not isinstance(root.command, click.Group):
        return e  # a command without siblings, or an option before the command name
    name, here = e.option_name, ctx.info_name or ""
    owners = [n for n, c in root.command.commands.items() if n != here
              and any(name in p.opts or name in p.secondary_opts for p in c.params)]
    if not owners:
        return e  # no command has it: click's suggestion stands
    have = owners[0] if len(owners) == 1 else f"{', '.join(owners[:-1])} and {owners[-1]}"
    i = args.index(here) if here in args else len(args)
    line = shlex.join([root.info_name or "gptqfmt", *args[:i], owners[0], *args[i + 1:]])
    message = (f"{e.message.rstrip('.')} ({here} has no {name}; {have} "
               f"{'has' if len(owners) == 1 else 'have'} it: `{line}`)")
    return click.NoSuchOption(name, message, ctx=ctx)


HANDLED_SIGNALS = ("SIGINT", "SIGTERM", "SIGHUP")


def _handle_signals():
    """Turn SIGINT, SIGTERM and SIGHUP into Interrupted in the main thread; returns a function
    that puts the previous handlers back. The first signal unwinds; a second one while
    unwinding takes the default action at once (Ctrl-C twice forces the exit; a staging
    directory left behind is removed by the next convert). A signal the parent set to be
    ignored (nohup, a background job) stays ignored."""
    import os
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        return lambda: None  # signal handlers can only be set in the main thread
    fired: list[int] = []

    def handler(signum, frame):
        if fired:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        fired.append(signum)
        raise Interrupted(signum)

    previous = {}
    for name in HANDLED_SIGNALS:
        signum = getattr(signal, name, None)  # no SIGHUP on Windows
        if signum is not None and signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, handler)

    def restore():
        for signum, h in previous.items():
            signal.signal(signum, h)
    return restore


def _stdout_closed() -> int:
    """The reader of stdout went away (`gptqfmt inspect X | head -1`): a normal end, so no
    message, as for other Unix tools. Python ignores SIGPIPE, so the write raised
    BrokenPipeError instead of killing the process. As the Python docs recommend (signal
    module, "Note on SIGPIPE"), stdout is pointed at /dev/null so that the interpreter's flush
    at exit cannot raise again. The docs exit 1; here 1 means findings, so the exit is
    141 = 128 + SIGPIPE, what a shell reports for a C tool killed by SIGPIPE: `set -o
    pipefail` treats it as it treats `yes | head -1`, and a failing verify piped into head never
    reads as a pass, as it would with 0."""
    import os
    import signal
    import sys

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.__stdout__.fileno())  # type: ignore[union-attr]  # None: below
        os.close(devnull)
    except (OSError, ValueError, AttributeError):  # no real stdout (embedded): nothing to do
        pass
    return 128 + signal.SIGPIPE


def _format_of(args: list[str]) -> str:
    """The --format the command line asks for (text when none or an unknown one): what a
    failure outside a command body, before click parsed the options, is reported in. The last
    one counts, as for click."""
    fmt = "text"
    args = [str(a) for a in args]
    for a, b in zip(args, args[1:] + [""]):
        value = a.partition("=")[2] if a.startswith("--format=") else b if a == "--format" \
            else None
        if value in FORMAT_NAMES:
            fmt = value
    return fmt
