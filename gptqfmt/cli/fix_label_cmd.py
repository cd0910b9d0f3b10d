"""`gptqfmt fix-label PATH`: set the configs' convention label to what the data are, in place."""
from __future__ import annotations

import click

from .boundary import guarded


@click.command("fix-label", short_help="Set checkpoint_format/format in the configs to the "
                                        "convention the data have, in place; then verify.")
@click.argument("path", type=click.Path(exists=False, file_okay=True, dir_okay=True))
# the choices: conversion.relabel.TARGETS, written out so that --help loads no library
# (tests/cli/test_startup.py holds them equal)
@click.option("--to", "to", type=click.Choice(("detected", "gptq", "gptq_v2")),
              default="detected", show_default=True,
              help="The label to write: the detected convention, or one you name (refused "
                   "when the data contradict it).")
@click.option("--dry-run", is_flag=True, help="Say what would change; write nothing.")
@guarded
def fix_label_cmd(path, out, to, dry_run):
    """Rewrite only `checkpoint_format` and `format` in the config files of PATH, and remove
    AutoGPTQ's `is_marlin_format: false`, which GPTQModel 6.0 and later refuse by name (every
    other key, its order and `meta` kept; meta.gptqfmt records the change), each file replaced
    atomically, then run verify. No tensor is read for writing or copied.

    Refused, with nothing written: data whose convention is undecidable (GQ416; name it with
    --to), a --to the data contradict (GQ417), config files that are symbolic links (a
    Hugging Face cache snapshot: copy it first).

    Exit 0 relabelled (or planned) and verify passes, 1 refused or verify fails, 2 usage
    error or unwritable configs, 3 internal error."""
    from ..conversion.relabel import fix_label
    from .progress import Progress

    with Progress(enabled=out.progress and not dry_run, unit="B",
                  desc="verify") as bar:
        result = fix_label(path, to=to, dry_run=dry_run, progress=bar.update)
    failed = result.plan.refused or (result.verify is not None and result.verify.failed())
    code = 1 if failed else 0
    out.fix_label(result, code)
    return code
