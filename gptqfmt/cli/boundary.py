"""The one error boundary of every command: exceptions become one line (or one JSON document)
and an exit code."""
from __future__ import annotations

import functools
import io
import os
import traceback
from pathlib import Path
from signal import SIGINT
from typing import Callable

import click

from ..errors import FindingError, GptqfmtError, OutputError, UsageError
from .output import Reporter, note
from .view import COLOR_CHOICES, PLAIN, SUMMARY_ABOVE, View, colour_wanted

# The names of reporters.REPORTERS, in its order: what --format and --output take. Written out
# here because the reporters import the library (numpy), which `--help` must not wait for;
# tests/cli/test_reporters.py holds every command's --format to REPORTERS.
FORMAT_NAMES = ("text", "json", "github", "sarif", "junit")

FORMAT_OPTION = click.option("--format", "fmt", type=click.Choice(FORMAT_NAMES),
                             default="text", show_default=True,
                             help="Output format on stdout: text, json (one document), github "
                                  "(workflow commands), sarif (SARIF 2.1.0), junit (JUnit XML).")


def _outputs(ctx, param, values) -> list[tuple[str, Path | None]]:
    """--output FORMAT=FILE, repeatable: checked before the command runs, so that a report
    that cannot be written is a usage error, not a surprise after an hour of verify. FILE `-`
    is stdout (None)."""
    out: list[tuple[str, Path | None]] = []
    seen = set()
    for v in values:
        fmt, eq, file = v.partition("=")
        if not eq or fmt not in FORMAT_NAMES or not file:
            raise click.BadParameter(f"{v!r}: expected FORMAT=FILE with FORMAT one of "
                                     f"{', '.join(FORMAT_NAMES)}", ctx, param)
        if file == "-":   # stdout, as `-` is everywhere else: --format's place
            out.append((fmt, None))
            continue
        path = Path(file)
        if path.resolve() in seen:
            raise click.BadParameter(f"{file!r} named twice", ctx, param)
        if path.is_dir() or not path.resolve().parent.is_dir():
            raise click.BadParameter(f"{file!r}: not a file in an existing directory", ctx,
                                     param)
        seen.add(path.resolve())
        out.append((fmt, path))
    return out


OUTPUT_OPTION = click.option(
    "--output", "outputs", multiple=True, metavar="FORMAT=FILE", callback=_outputs,
    help="Also write the report in FORMAT to FILE (repeatable), e.g. --output sarif=gptqfmt."
         "sarif; FILE - is stdout (in place of --format). Written when the command ends, also "
         "on failure.")
COLOR_OPTION = click.option("--color", "color", type=click.Choice(COLOR_CHOICES),
                            default="auto", show_default=True,
                            help="Colour text by severity: auto (a terminal, NO_COLOR unset), "
                                 "always, never.")
QUIET_OPTION = click.option("-q", "--quiet", is_flag=True,
                            help="Only the final line and what made the command fail (errors; "
                                 "under --strict, warnings too); no progress bar.")
VERBOSE_OPTION = click.option("-v", "--explain", "--verbose", "verbose", is_flag=True,
                              help="Every detail: each finding, infos too, and why each "
                                   "runtime refuses or decodes wrong (kernels, readings).")
SUMMARY_OPTION = click.option(
    "--summary/--no-summary", "summary", default=None,
    help=f"Leave out per-module rows (the default above {SUMMARY_ABOVE} modules); "
         "--no-summary lists every module.")


class Outputs:
    """The reporters of one command: --format's on stdout, each --output's into its file (plain,
    never coloured), all told the same results. Calling `out.verify(...)` reports to all."""

    def __init__(self, fmt: str, view: View, files: list[tuple[str, Path]], target,
                 command: str = "gptqfmt"):
        from .ci import GithubReporter
        from .reporters import reporter

        self.fmt, self.view = fmt, view
        self.main = reporter(fmt, None, view)
        self.buffers = [(io.StringIO(), path) for _, path in files]
        self.files = [reporter(f, buf, PLAIN) for (f, _), (buf, _) in zip(files, self.buffers)]
        github = [g for g in self.all if isinstance(g, GithubReporter)]
        for g in github[1:]:
            g.step_summary = False  # one job summary per command
        for r in self.all:
            r.target, r.command = target, command

    @property
    def all(self) -> list[Reporter]:
        """Every reporter of the command: stdout's first, then each --output's."""
        return [self.main, *self.files]

    def checkpoints(self, *args: str | None, download: bool = False) -> list[str | None]:
        """The paths that PATH arguments name (None stays None): a path as given, a Hugging
        Face repo id or cache entry resolved to its cached snapshot (hub.resolve; said on
        stderr). The reporters locate the findings' files under the first. --download with no
        Hub name among them is refused, not ignored."""
        from ..safetensors_io import hub

        if download and not self.progress:
            _hub_bars_off()
        resolved = [None if a is None else hub.resolve(a, download) for a in args]
        if download and not any(r and r.repo_id for r in resolved):
            raise UsageError(f"--download fetches a Hugging Face repo id (org/model[@revision]),"
                             f" and {', '.join(a for a in args if a)} names none (a path that "
                             "exists is read as a path)")
        for i, r in enumerate(resolved):
            if r and r.repo_id:
                self.note(f"gptqfmt: {r.describe()}")
                if i == 0:
                    for rep in self.all:
                        rep.target = r.path
        return [None if r is None else r.path for r in resolved]

    def remote(self, in_flight: int, whole_files: bool, download: bool = False):
        """The Hub client of --remote (safetensors_io.remote.Hub): --download, which fetches
        the files, is refused beside it."""
        from ..safetensors_io.remote import Hub

        if download:
            raise UsageError("--remote reads the repo where it lies; --download fetches it "
                             "into the cache: give one of them")
        return Hub(in_flight=in_flight, whole_files=whole_files)

    def locate_remote(self, remote: dict) -> None:
        """Findings of a repo read over HTTP are located at its files' pages on the Hub."""
        from ..ops.remote import blob_url

        for rep in self.all:
            rep.target = blob_url(remote)

    @property
    def progress(self) -> bool:
        """Whether a progress bar may show: text for a person, not quiet."""
        return self.fmt == "text" and not self.view.quiet

    def note(self, message: str) -> None:
        """A line for people on stderr, unless quiet."""
        if not self.view.quiet:
            note(message)

    def __getattr__(self, kind):
        def report(*args, **kwargs):
            getattr(self.main, kind)(*args, **kwargs)
            for r in self.files:
                getattr(r, kind)(*args, **kwargs)
        return report

    def commit(self) -> None:
        """Write each --output file, atomically (a reader never sees half a report)."""
        for r, (buf, path) in zip(self.files, self.buffers):
            tmp = path.with_name(f".{path.name}.gptqfmt-tmp")
            try:
                tmp.write_text(buf.getvalue(), encoding="utf-8")
                os.replace(tmp, path)
            except OSError as e:
                tmp.unlink(missing_ok=True)
                raise OutputError(f"{path}: cannot write the {r.name} report: "
                                  f"{e.strerror or e}") from None


def _hub_bars_off() -> None:
    try:
        from huggingface_hub.utils import disable_progress_bars
    except ImportError:
        return  # hub.resolve says which extra to install
    disable_progress_bars()


# The runtime table's entry ids in its order (runtimes.table.RUNTIMES) and its families, sorted:
# what --runtime's help and shell completion offer. Written out here because the table imports
# the library (numpy), which `--help` and completion must not wait for; the table itself judges
# every --runtime given, and tests/cli/test_startup.py holds these equal to it.
RUNTIME_IDS = ("vllm", "vllm-gptq-gemm", "vllm-legacy", "vllm-humming", "sglang",
               "sglang-gptq-gemm", "exllamav2", "tgi", "transformers", "gptqmodel", "autogptq",
               "llama.cpp")
RUNTIME_FAMILIES = ("autogptq", "exllamav2", "gptqmodel", "llama.cpp", "sglang", "tgi",
                    "transformers", "vllm", "vllm-humming")


class RuntimeId(click.ParamType):
    """doctor's --runtime: a runtime id or family in any case, with an optional @VERSION (the
    table's resolve() judges it when the command runs); completed from the table's names."""
    name = "ID[@VERSION]"

    def shell_complete(self, ctx, param, incomplete):
        from click.shell_completion import CompletionItem

        low = incomplete.lower()
        return [CompletionItem(i) for i in sorted({*RUNTIME_FAMILIES, *RUNTIME_IDS})
                if i.startswith(low)]


class RuntimeIds(click.ParamType):
    """verify's --runtime: runtime ids separated by commas, or `all`, in any case: passed on
    lowercased (the table's ids are), for the command to judge; each id completed in turn."""
    name = "ID[,ID...]"

    def convert(self, value, param, ctx):
        return value.lower() if isinstance(value, str) else value

    def shell_complete(self, ctx, param, incomplete):
        from click.shell_completion import CompletionItem

        done, comma, last = incomplete.rpartition(",")
        given = {n.strip().lower() for n in done.split(",")}
        names = RUNTIME_IDS if comma else ("all", *RUNTIME_IDS)
        return [CompletionItem(done + comma + i) for i in names
                if i.startswith(last.strip().lower()) and i not in given]


DOWNLOAD_OPTION = click.option(
    "--download", is_flag=True,
    help="Fetch a Hugging Face repo id (org/model[@revision]) that is not cached yet, with "
         "huggingface_hub; without it nothing is downloaded.")


def http_options(in_flight: int, limit: int, what: str = "With --remote: "):
    """--whole-files and --in-flight (default `in_flight`, at most `limit`): how a repo is read
    over HTTP range requests."""
    def add(fn):
        fn = click.option(
            "--in-flight", "in_flight", type=click.IntRange(1, limit), default=in_flight,
            show_default=True, help=f"{what}the most HTTP requests in flight at once.")(fn)
        return click.option(
            "--whole-files", "whole_files", is_flag=True,
            help=f"{what}where the server ignores byte ranges (it would send whole files), "
                 "read whole files instead of stopping.")(fn)
    return add


def remote_options(fn):
    """--remote with http_options: a Hub repo read over HTTP range requests."""
    fn = http_options(8, 64)(fn)
    return click.option(
        "--remote", is_flag=True,
        help="PATH is a Hugging Face repo id (ORG/NAME[@REVISION]) read on the Hub over HTTP "
             "range requests: the configs, each shard's header and the byte ranges the answer "
             "needs (about 1% of a 4-bit checkpoint), through huggingface_hub (HF_ENDPOINT, "
             "HF_TOKEN, proxies); nothing is downloaded whole.")(fn)


def handle(body: Callable[[], int | None], failure: Callable[..., None], debug: bool) -> int:
    """The one error boundary: run `body` and return its exit code; an exception becomes one
    report through `failure(status, code, findings=..., message=...)` and its exit code
    (FindingError 1 with its findings, another GptqfmtError its own, a signal 128 + n, anything
    else 3 with one line, its traceback only with `debug`). A closed stdout is left to run()."""
    try:
        return body() or 0
    except FindingError as e:
        failure("fail", 1, findings=e.findings)
        return 1
    except GptqfmtError as e:
        failure("error", e.exit_code, message=str(e))
        return e.exit_code
    except Interrupted as e:  # SIGINT/SIGTERM/SIGHUP; `finally` blocks (staging) have run
        failure("error", e.exit_code, message=str(e))
        return e.exit_code
    except KeyboardInterrupt:  # Ctrl-C where run() set no handler (main() called directly)
        interrupted = Interrupted(SIGINT)
        failure("error", interrupted.exit_code, message=str(interrupted))
        return interrupted.exit_code
    except BrokenPipeError:
        raise  # stdout was closed (`| head`): not an internal error; run() exits quietly
    except Exception as e:  # noqa: BLE001 - the catch-all that keeps tracebacks off CI logs
        if debug:
            traceback.print_exc()
        failure("error", 3, message=f"internal error: {type(e).__name__}: {e}"
                + ("" if debug else " (run with --debug for the traceback)"))
        return 3


DEBUG_OPTION = click.option("--debug", is_flag=True,
                            help="Show the traceback of an internal error (exit 3).")


def guarded(fn):
    """Run a command body inside the error boundary (handle): errors become one line (or one
    JSON document) and an exit code. The body gets `out` (an Outputs) in place of the
    --format, --output, --color, --quiet and --summary options, and reports through it."""

    @functools.wraps(fn)
    def wrapper(*args, fmt="text", debug=False, outputs=(), color="auto", quiet=False,
                verbose=False, **kwargs):
        outputs = list(outputs)
        to_stdout = [f for f, path in outputs if path is None]
        if to_stdout:
            # `--output FORMAT=-`: stdout carries one report, so it names --format's
            if len(to_stdout) > 1 or fmt not in ("text", to_stdout[0]):
                raise click.UsageError(
                    "stdout carries one report: --format " + fmt + " and "
                    + " and ".join(f"--output {f}=-" for f in to_stdout) + " both name it")
            fmt = to_stdout[0]
            outputs = [(f, path) for f, path in outputs if path is not None]
        view = View(color=fmt == "text" and colour_wanted(color), quiet=quiet,
                    summary=kwargs.pop("summary", None), verbose=verbose)
        target = kwargs.get("path") or kwargs.get("src")
        command = fn.__name__.removesuffix("_cmd").replace("_", "-")  # verify_cmd: verify
        try:
            out = Outputs(fmt, view, list(outputs), target, command)  # loads the library
        except KeyboardInterrupt:  # raised, not signalled: click would make it Abort
            raise Interrupted(SIGINT) from None
        code = handle(lambda: fn(*args, out=out, **kwargs), out.failure, debug)
        try:
            out.commit()
        except OutputError as e:
            note(f"gptqfmt: error: {e}")
            code = e.exit_code if code in (0, 1, None) else code
        raise SystemExit(code or 0)

    wrapper = DEBUG_OPTION(wrapper)
    for option in (VERBOSE_OPTION, QUIET_OPTION, COLOR_OPTION, OUTPUT_OPTION, FORMAT_OPTION):
        wrapper = option(wrapper)
    return wrapper


class Interrupted(BaseException):
    """SIGINT, SIGTERM or SIGHUP arrived (main._handle_signals). A BaseException, like
    KeyboardInterrupt, so that no `except Exception` stops it and every `finally` on the way
    runs; not a KeyboardInterrupt, which click would turn into Abort and lose the signal."""

    def __init__(self, signum: int):
        import signal

        self.signum = signum
        self.exit_code = 128 + signum  # what a shell reports for a process the signal killed
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
