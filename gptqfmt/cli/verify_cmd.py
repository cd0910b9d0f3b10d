"""`gptqfmt verify PATH`: every check over all the data; the gate a CI pipeline runs."""
from __future__ import annotations

import click

from ..errors import UsageError
from .boundary import DOWNLOAD_OPTION, RUNTIME_IDS, SUMMARY_OPTION, RuntimeIds, guarded


@click.command("verify", short_help="Every check over all the data; exit 0/1 for CI. "
                                     "--against: prove two checkpoints compute the same.")
@click.argument("path", type=click.Path(exists=False, dir_okay=True, file_okay=True))
@click.option("--strict", is_flag=True, help="Fail on warnings too.")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Threads checking modules in parallel (default: one per CPU).")
@click.option("--against", "against", type=click.Path(), default=None,
              help="Check that PATH and this checkpoint compute the same Y = X @ W.")
@click.option("--reference", type=click.Choice(["fp32"]), default=None,
              help="Compare runtime output with an fp32 dequant and classify the difference.")
@click.option("--runtime", "runtime", type=RuntimeIds(), default=None, metavar="ID[,ID...]",
              help="Fail (exit 1) when one of these runtimes would not load the checkpoint or "
                   "would decode it wrongly (GQ601-GQ605); `all` names every one. Ids (any "
                   "case): " + ", ".join(RUNTIME_IDS) + ".")
@click.option("--backend", type=click.Choice(["auto", "cpu", "cupy"]), default=None,
              help="Backend of --against and --reference (default: auto, CuPy when a CUDA "
                   "device is usable).")
@click.option("--checksums", is_flag=True,
              help="Also hash every file and compare it with the hash its Hugging Face cache "
                   "entry (or `hf download --local-dir` metadata) records (GQ129).")
@DOWNLOAD_OPTION
@SUMMARY_OPTION
@guarded
def verify_cmd(path, out, strict, jobs, against, reference, runtime, backend, checksums,
               download):
    """Validate the checkpoint at PATH: container, index, configs, shapes, values, and the
    declared zero-point convention against the one the data show.

    Exit 0 when it passes, 1 when findings of severity error exist (with --strict, warnings
    too), 2 when PATH cannot be read, 3 on an internal error. With --against: exit 0 when
    both compute the same outputs for every runtime, 1 when not. With --runtime vllm: exit 1
    also when vLLM would refuse the checkpoint or compute other weights than the data mean.

    PATH (and --against's) may be a Hugging Face repo id, org/model[@revision], or a cache
    entry models--org--model: read offline from the local cache (--download fetches it).
    --checksums hashes every file against the hash its cache entry records."""
    from ..ops.equivalence import check_usage
    from ..ops.verify import validate, with_checksums
    from ..safetensors_io import hub
    from .progress import Progress

    gate = runtime_ids(runtime) if runtime is not None else ()
    if against or reference:
        check_usage(against, reference)
        _refuse_inapplicable(against and "--against" or "--reference", strict=strict,
                             jobs=jobs, runtime=runtime, checksums=checksums)
        backend = backend or "auto"
        path, against = out.checkpoints(path, against, download=download)
        return (_against(path, against, backend, out) if against
                else _reference(path, backend, out))
    _refuse_inapplicable("a plain verify (without --against or --reference)", backend=backend)
    [path] = out.checkpoints(path, download=download)
    with Progress(enabled=out.progress, unit="B", desc="verify") as bar:
        report = validate(path, progress=bar.update, jobs=jobs, gate=gate)
    if checksums:
        with Progress(enabled=out.progress, unit="B", desc="checksums") as bar:
            report = with_checksums(report, hub.checksums(path, progress=bar.update))
    code = 1 if report.failed(strict) else 0
    out.verify(report, strict, code)
    return code


def _refuse_inapplicable(mode: str, **given) -> None:
    """An option that does not apply to the mode is refused, never silently ignored."""
    names = {"strict": "--strict", "jobs": "--jobs", "backend": "--backend",
             "runtime": "--runtime", "checksums": "--checksums"}
    ignored = [names[k] for k, v in given.items() if v]
    if ignored:
        why = {"--strict": "it decides on warnings of the checks, which this mode does not run; "
                           "any difference already exits 1",
               "--jobs": "this mode runs in one process",
               "--runtime": "the runtime gate judges one checkpoint (run verify PATH --runtime "
                            "on each)",
               "--backend": "only --against and --reference compute on a backend",
               "--checksums": "it checks the files of one checkpoint (run verify PATH "
                              "--checksums on each)"}
        verb = "does" if len(ignored) == 1 else "do"
        raise UsageError(f"{' and '.join(ignored)} {verb} not apply to {mode}: "
                         + "; ".join(why[n] for n in ignored))


def _against(src, dst, backend, out) -> int:
    from ..ops.equivalence import compare

    rep = compare(src, dst, backend)
    code = 0 if rep.equivalent else 1
    out.against(rep, code)
    return code


def _reference(path, backend, out) -> int:
    from ..ops.equivalence import reference_fp32

    rep = reference_fp32(path, backend)
    code = 1 if rep.inconsistent else 0
    out.reference(rep, code)
    return code


def runtime_ids(text: str) -> tuple[str, ...]:
    """The runtime ids of `--runtime a,b` (`all`: every one), in the table's order; a name
    that is not one is a usage error listing the known ones."""
    from ..runtimes import BY_ID

    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError("--runtime: expected one or more runtime ids separated by commas")
    if "all" in names:
        return tuple(BY_ID)
    unknown = [n for n in names if n not in BY_ID]
    if unknown:
        raise UsageError(f"--runtime {', '.join(repr(n) for n in unknown)}: not a runtime id; "
                         f"known: {', '.join(BY_ID)} (or all)")
    return tuple(r for r in BY_ID if r in names)
