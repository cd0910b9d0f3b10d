"""`gptqfmt verify PATH`: every check over all the data; the gate a CI pipeline runs."""
from __future__ import annotations

import click

from ..validate import validate
from .main import guarded
from .output import emit_json, finding_line
from .progress import Progress


@click.command("verify")
@click.argument("path", type=click.Path(exists=False, dir_okay=True, file_okay=True))
@click.option("--strict", is_flag=True, help="Fail on warnings too.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Threads checking modules in parallel (default: one per CPU).")
@guarded
def verify_cmd(path, fmt, strict, quiet, jobs):
    """Validate the checkpoint at PATH: container, index, configs, shapes, values, and the
    declared zero-point convention against the one the data show.

    Exit 0 when it passes, 1 when findings of severity error exist (with --strict, warnings
    too), 2 when PATH cannot be read, 3 on an internal error."""
    with Progress(enabled=fmt == "text" and not quiet, unit="B", desc="verify") as bar:
        report = validate(path, progress=lambda m, nbytes: bar.update(nbytes), jobs=jobs)
    if fmt == "json":
        emit_json(report.to_json(strict))
    else:
        for f in report.findings:
            click.echo(finding_line(f))
        doc = report.to_json(strict)
        s, cf = doc["summary"], doc["checkpoint_format"]
        status = "FAIL" if report.failed(strict) else "OK"
        click.echo(f"{status}: {s['modules']} modules, {s['errors']} errors, {s['warnings']} "
                   f"warnings, {s['infos']} infos; declared {cf['declared'] or 'none'} "
                   f"(runtimes read {cf['effective']}), detected {cf['detected']} "
                   f"(confidence {cf['confidence']:.4f})")
    return 1 if report.failed(strict) else 0
