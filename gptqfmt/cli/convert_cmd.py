"""`gptqfmt convert SRC DST`: rewrite zero points losslessly, verified before anything is
visible."""
from __future__ import annotations

import click

from .boundary import DOWNLOAD_OPTION, guarded


@click.command("convert", short_help="Convert losslessly into a new directory (gptq <-> gptq_v2, "
                                       "<-> compressed-tensors, AWQ ->), proven equal first.")
@click.argument("src", type=click.Path(exists=False, file_okay=True, dir_okay=True))
@click.argument("dst", type=click.Path(exists=False, file_okay=False, dir_okay=True),
                required=False)
# the choices: formats.TARGETS and formats.FORMATS, written out so that --help loads no library
# (tests/cli/test_startup.py holds them equal)
@click.option("--to", "to", type=click.Choice(("gptq", "gptq_v2", "compressed-tensors")),
              default="gptq_v2", show_default=True,
              help="Target: a GPTQ zero-point convention, or compressed-tensors "
                   "(pack-quantized).")
@click.option("--from", "src_convention",
              type=click.Choice(("auto", "gptq", "gptq_v2", "compressed-tensors", "awq")),
              default="auto", show_default=True,
              help="Source format or GPTQ convention; auto reads the configs and tensors "
                   "(for GPTQ: the declared convention, refused when the data contradict it).")
@click.option("--trust-from", "trust_from", is_flag=True,
              help="Convert as --from says even where the data contradict it (else refused, "
                   "GQ422); the output is kept only when its data then agree with its label.")
@click.option("--allow-lossy", is_flag=True,
              help="Convert fields the target cannot hold exactly, and report them.")
@click.option("--dry-run", is_flag=True, help="Plan and report; write nothing.")
@click.option("--in-place", "in_place", is_flag=True,
              help="Rewrite SRC itself (gptq <-> gptq_v2; no DST): only the qzeros byte ranges "
                   "and the configs, under an undo journal.")
@click.option("--force", is_flag=True, help="Replace DST if it exists.")
@click.option("--jobs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Shards written in parallel processes (gptq <-> gptq_v2).")
@click.option("--backend", type=click.Choice(["auto", "cpu", "cupy"]), default="auto",
              show_default=True, help="Numerical check before commit.")
@DOWNLOAD_OPTION
@guarded
def convert_cmd(src, dst, out, to, src_convention, allow_lossy, dry_run, force, jobs, backend,
                download, in_place, trust_from):
    """Convert the checkpoint directory SRC into DST: GPTQ zero points between gptq and
    gptq_v2 (every byte outside qzeros copied unchanged), gptq/gptq_v2 to compressed-tensors
    (a padded compressed-tensors checkpoint of 0.17 and older too: re-packed dense), or
    compressed-tensors/AWQ to gptq_v2 (tensors re-laid out, every other tensor copied). DST
    appears only after the output has been proven equal to SRC. SRC may be a Hugging Face
    repo id (org/model[@revision]) read from the local cache; DST is always a path.
    With --in-place (gptq <-> gptq_v2, no DST) SRC itself is rewritten: the qzeros byte ranges
    and the configs only, proven first and written under an undo journal; a kill leaves the
    original or the converted checkpoint, and the next gptqfmt command that opens it finishes
    or undoes the change.

    Exit 0 converted (or planned, with --dry-run), 1 refused or invalid input (nothing
    written), 2 usage error or DST exists, 3 internal error."""
    from ..conversion import convert
    from .progress import Progress

    [src] = out.checkpoints(src, download=download)
    show = out.progress
    with Progress(enabled=show, unit="B", desc="write") as bar, \
            Progress(enabled=show, unit="module", desc="verify", position=1) as mods:
        report = convert(src, dst, to=to, src_convention=src_convention,
                         allow_lossy=allow_lossy, dry_run=dry_run, force=force, jobs=jobs,
                         backend=backend, progress=bar.update, on_module=mods.update,
                         in_place=in_place, trust_from=trust_from)
    out.convert(report, 0)
    return 0
