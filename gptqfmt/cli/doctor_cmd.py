"""`gptqfmt doctor PATH --runtime ID[@VERSION]`: will that runtime compute the right weights,
and if not, the commands that make it so (--fix runs them)."""
from __future__ import annotations

import click

from ..errors import UsageError
from .boundary import DOWNLOAD_OPTION, RUNTIME_FAMILIES, RuntimeId, guarded, remote_options


@click.command("doctor", short_help="Will this runtime compute the right weights? If not, "
                                     "the commands that make it so; --fix runs them.")
@click.argument("path", type=click.Path(exists=False, dir_okay=True, file_okay=True))
@click.option("--runtime", "runtime", type=RuntimeId(), default="vllm", show_default=True,
              help="The runtime, as `gptqfmt doctor` knows it (any case): "
                   + ", ".join(RUNTIME_FAMILIES) + " (or an entry such as "
                  "vllm-gptq-gemm), with an optional @VERSION, e.g. vllm@0.25; without one, "
                  "the newest the table knows.")
@click.option("--fix", "fix", is_flag=False, flag_value="", default=None, metavar="DST",
              help="Carry the plan out into DST (a new directory), or on PATH itself with "
                   "--fix --in-place; then judge the result again.")
@click.option("--in-place", "in_place", is_flag=True,
              help="With --fix: fix PATH itself (configs rewritten atomically, zero points "
                   "through convert's journal).")
@click.option("--capability", type=click.IntRange(min=10), default=80, show_default=True,
              help="The GPU's compute capability as 10 x major + minor (75 for a T4, 80 for "
                   "an A100, 90 for an H100): some kernels need a newer one.")
@DOWNLOAD_OPTION
@remote_options
@guarded
def doctor_cmd(path, out, runtime, fix, in_place, capability, download, remote, whole_files,
               in_flight):
    """Say whether RUNTIME will load the checkpoint at PATH and compute the weights its data
    mean (first line), why (second line), and the cheapest lossless plan that makes it so:
    fix-label, convert --in-place, convert to gptq_v2 or to compressed-tensors, with your
    paths; or that there is none, and what serves it as it is.

    Every check of verify runs first; a checkpoint that fails one gets no plan. With --remote,
    PATH is a Hugging Face repo id judged on the Hub without downloading it, on inspect's reads
    (no scales: the weight change is not measured); the plan starts with the download.

    Exit 0 when the runtime computes the right weights (with --fix: after the fix), 1 when
    not, 2 usage error, 3 internal error."""
    from ..doctor import doctor
    from .progress import Progress

    if in_place and fix is None:
        raise UsageError("--in-place goes with --fix (doctor writes only when told to)")
    if fix == "" and not in_place:
        raise UsageError("--fix needs DST, or --in-place to fix PATH itself")
    if remote:
        from ..doctor import doctor_remote

        if fix is not None:
            raise UsageError(f"--fix writes a local copy: download it first (hf download "
                             f"{path.split('@')[0]} --local-dir DIR), then gptqfmt doctor DIR "
                             f"--runtime {runtime} --fix DST")
        result = doctor_remote(path, runtime, capability=capability,
                               hub=out.remote(in_flight, whole_files, download))
        assert result.remote is not None
        out.locate_remote(result.remote)
        code = 0 if result.ok else 1
        out.doctor(result, code)
        return code
    [path] = out.checkpoints(path, download=download)
    with Progress(enabled=out.progress, unit="B", desc="doctor") as bar:
        result = doctor(path, runtime, capability=capability, dst=fix or None,
                        fix=fix is not None, in_place=in_place, progress=bar.update)
    code = 0 if result.ok else 1
    out.doctor(result, code)
    return code
