"""`gptqfmt inspect PATH`: what is in a checkpoint."""
from __future__ import annotations

import click

from .boundary import DOWNLOAD_OPTION, SUMMARY_OPTION, guarded


@click.command("inspect", short_help="What is in a checkpoint: modules, bits, group size, and the "
                                       "declared and detected zero-point convention.")
@click.argument("path", type=click.Path(exists=False, dir_okay=True, file_okay=True))
@DOWNLOAD_OPTION
@SUMMARY_OPTION
@guarded
def inspect_cmd(path, out, download):
    """Show layers, bits, group size, sym, act-order, word size and the declared and detected
    zero-point convention of the checkpoint at PATH (a directory or one .safetensors file).

    Exit 0 when nothing is wrong, 1 when findings of severity error exist, 2 when PATH cannot be
    read."""
    from ..ops.inspect import inspect_checkpoint

    [path] = out.checkpoints(path, download=download)
    result = inspect_checkpoint(path)
    code = 0 if result.ok else 1
    out.inspect(result, code)
    return code
