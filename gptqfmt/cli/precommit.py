"""`gptqfmt-pre-commit FILE...`: what the pre-commit hook `gptqfmt-verify` runs
(.pre-commit-hooks.yaml). pre-commit passes the staged files that match the hook's pattern
(configs, indexes, shards); each file's directory is a checkpoint when it holds a .safetensors
file or an index, and each checkpoint is checked once, however many of its files changed.

By default only the configs, the index and the safetensors headers are checked against each
other (validation.check_configs: milliseconds, whatever the model's size), so that a commit
stays fast; `--full` runs the whole verify (every tensor). Without it no zero point is read,
so a label that contradicts the data (GQ401) cannot be seen, and each OK line says so. Exit 0
when every checkpoint passes, 1 when one does not or cannot be read, 2 when a FILE does not
exist (nothing is checked then)."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import click

from ..errors import FindingError, GptqfmtError, UsageError
from .boundary import DEBUG_OPTION, handle
from .output import defuse, escape, finding_line, plural


def checkpoints(files) -> list[Path]:
    """The checkpoint directories the files belong to, each once, in the order first named."""
    out: list[Path] = []
    for f in files:
        d = Path(f).parent
        if d in out or not d.is_dir():
            continue
        if any(d.glob("*.safetensors")) or (d / "model.safetensors.index.json").exists():
            out.append(d)
    return out


def check(d: Path, full: bool, strict: bool) -> tuple[bool, list[str]]:
    """(passed, lines) for one checkpoint directory."""
    # the library loads when there is a checkpoint to check: start-up stays quick
    from ..ops.reports import summary_counts
    from ..ops.verify import check_configs, validate

    def located(findings) -> list[str]:
        return [finding_line(dataclasses.replace(f, file=str(d / f.file) if f.file else str(d)))
                for f in findings]

    try:
        report = validate(d) if full else check_configs(d)
    except FindingError as e:  # unreadable: each finding with its hint
        return False, located(e.findings) + [f"{escape(str(d))}: FAIL (cannot be read)"]
    except GptqfmtError as e:
        return False, [f"{escape(str(d))}: error: {escape(str(e))}"]
    except OSError as e:  # unreadable after all (permissions, a file gone meanwhile)
        return False, [f"{escape(str(d))}: error: {escape(e.filename or str(d))}: "
                       f"{escape(e.strerror or str(e))}"]
    lines = located(report.findings)
    bad = report.failed(strict)
    modules = report.module_count
    n = summary_counts(report.findings, modules)
    what = "every tensor" if full else "configs, index and headers"
    lines.append(f"{escape(str(d))}: {'FAIL' if bad else 'OK'} ({what} of "
                 f"{plural(modules, 'module')}: {plural(n['errors'], 'error')}, "
                 f"{plural(n['warnings'], 'warning')})"
                 + ("" if full or bad else f"; {UNCHECKED}"))
    return not bad, lines


# what an OK without --full has not looked at: the zero points (a wrong label, GQ401)
UNCHECKED = "zero-point convention not checked (no tensor data read): --full checks it"


@click.command("gptqfmt-pre-commit", context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("files", nargs=-1, type=click.Path())
@click.option("--full", is_flag=True,
              help="Run the whole verify on each checkpoint (reads every tensor: slow on a "
                   "large model) instead of its configs, index and headers.")
@click.option("--strict", is_flag=True, help="Fail on warnings too.")
@DEBUG_OPTION
def precommit(files: tuple[str, ...], full: bool, strict: bool, debug: bool) -> None:
    """Check the checkpoints that FILES belong to (the pre-commit hook gptqfmt-verify)."""
    def body() -> int:
        missing = [f for f in files if not os.path.lexists(f)]
        if missing:   # a usage error, before any checkpoint is checked
            raise UsageError(f"{', '.join(missing)}: no such file or directory")
        ok = True
        for d in checkpoints(files):
            passed, lines = check(d, full, strict)
            ok &= passed
            for line in lines:
                click.echo(defuse(line))
        return 0 if ok else 1
    from .reporters import reporter

    raise SystemExit(handle(body, reporter("text").failure, debug))


def run(argv: list[str] | None = None) -> None:
    """Console entry point: the command inside gptqfmt's process handling (signals, a closed
    stdout, click's usage errors), as `gptqfmt` runs."""
    from .main import run as run_command

    run_command(argv, precommit, "gptqfmt-pre-commit")
