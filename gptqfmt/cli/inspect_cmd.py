"""`gptqfmt inspect PATH`: what is in a checkpoint."""
from __future__ import annotations

import click

from .boundary import DOWNLOAD_OPTION, SUMMARY_OPTION, guarded, remote_options


@click.command("inspect", short_help="What is in a checkpoint: modules, bits, group size, and the "
                                       "declared and detected zero-point convention.")
@click.argument("path", type=click.Path(exists=False, dir_okay=True, file_okay=True))
@DOWNLOAD_OPTION
@remote_options
@SUMMARY_OPTION
@guarded
def inspect_cmd(path, out, download, remote, whole_files, in_flight):
    """Show layers, bits, group size, sym, act-order, word size and the declared and detected
    zero-point convention of the checkpoint at PATH (a directory or one .safetensors file).

    With --remote, PATH is a Hugging Face repo id read on the Hub without downloading it; the
    answer is the one a local copy gets, with the commit read and the bytes fetched.

    Exit 0 when nothing is wrong, 1 when findings of severity error exist, 2 when PATH cannot be
    read."""
    from ..ops.inspect import inspect_checkpoint

    if remote:
        from ..ops.remote import inspect_remote

        result = inspect_remote(path, out.remote(in_flight, whole_files, download))
        assert result.remote is not None
        out.locate_remote(result.remote)
    else:
        [path] = out.checkpoints(path, download=download)
        result = inspect_checkpoint(path)
    code = 0 if result.ok else 1
    out.inspect(result, code)
    return code
