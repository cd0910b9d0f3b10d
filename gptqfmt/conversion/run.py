"""convert: open (the one open) -> plan and refuse (plan.py) -> write (write.py between gptq
and gptq_v2, reformat.py between formats) -> verify gate -> atomic commit; --in-place rewrites
SRC itself (inplace.py) from the same plan."""
from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import faults
from ..errors import FindingError, OutputError, UsageError, naming
from ..findings import Finding
from ..formats import FORMATS, TARGETS, WRITERS, open_source
from ..formats.configs import CONFIG_FILES
from ..formats.gptq.checkpoint import Checkpoint, open_checkpoint
from ..ops.reports import Progress
from ..runtimes.groups import groups as runtime_groups
from ..safetensors_io.journal import fsync_path
from . import atomic, reformat
from .configs import provenance, rewrite_configs
from .gate import GateResult, check_labels, run_gate
from .inplace import convert_in_place
from .plan import Plan, plan_conversion
from .reformat_gate import run_format_gate
from .report import ConvertReport
from .write import QzerosJob, ShardWritten, check_unchanged, copy_other_files, snapshot, write_shard


def convert(src: str | os.PathLike[str], dst: str | os.PathLike[str] | None,
            to: str = "gptq_v2", src_convention: str = "auto", allow_lossy: bool = False,
            dry_run: bool = False, force: bool = False, jobs: int = 1, backend: str = "auto",
            progress: Progress | None = None, on_module: Progress | None = None,
            in_place: bool = False, trust_from: bool = False) -> ConvertReport:
    """Convert the checkpoint directory `src` into `dst` (see the module docstring); with
    `in_place` (and no `dst`), rewrite `src` itself (inplace.py).

    `progress(nbytes, total_bytes)` is called as shards are written and `on_module(1,
    total_modules)` as the gate checks modules (each first with 0, so a bar knows its total).

    Raises FindingError (exit 1) when the input is invalid or the conversion is refused, and
    UsageError (exit 2) for paths and options; nothing is written in either case.
    `trust_from`: convert a --from the data contradict as asked (else refused, GQ422); the
    output is then kept only when verify's detection of its data agrees with its label."""
    if in_place:
        given = [n for n, v in (("DST", dst is not None), ("--force", force),
                                ("--jobs", jobs > 1), ("--backend cupy", backend == "cupy"))
                 if v]
        if given:
            raise UsageError(f"--in-place rewrites SRC itself, so {', '.join(given)} "
                             "does not apply (the proof runs on the CPU before anything is "
                             "written)")
        return convert_in_place(src, to, src_convention, allow_lossy, dry_run, progress,
                                on_module, trust_from)
    if dst is None:
        raise UsageError("missing DST: convert SRC DST writes a new directory; --in-place "
                         "rewrites SRC itself")
    if to not in TARGETS or src_convention not in FORMATS + ("auto",):
        raise UsageError(f"--to takes {', '.join(TARGETS)} and --from auto, "
                         f"{', '.join(FORMATS)}; got from={src_convention!r}, to={to!r}")
    backend = _backend(backend)
    src_path, dst_path = Path(src), Path(dst)
    if src_path.is_file():
        raise UsageError(f"{src}: a file; convert reads a checkpoint directory, since the "
                         f"configs beside the weights are rewritten too: pass its directory "
                         f"({src_path.parent})")
    if not src_path.is_dir():
        raise UsageError(f"{src}: no such directory")
    atomic.check_destination(dst_path, force, src_path)
    source = open_source(src_path)
    try:
        plan = plan_conversion(source, src_convention, to, allow_lossy, jobs, trust_from)
        report = ConvertReport.of(plan, str(src), str(dst), dry_run, backend)
        if dry_run:
            return report
        with _output_errors(dst_path):
            if plan.relayout:
                gate = _write_format(plan, report, dst_path, force, progress, on_module)
            else:
                gate = _write_verify_commit(Job.of(plan, dst_path, allow_lossy, force, jobs),
                                            report, progress, on_module)
        return replace(report, written=True, gate=gate)
    finally:
        source.close()


@contextmanager
def _output_errors(dst: Path) -> Iterator[None]:
    """An OSError while writing, as the one-line OutputError the CLI reports (exit 2), naming
    the file as it would be in DST (the staging directory is gone by then)."""
    try:
        yield
    except atomic.AfterRename as e:
        raise OutputError(f"{e.filename or dst}: {e.strerror or e} after {dst} was put in "
                          f"place; check it with `gptqfmt verify {dst}`") from None
    except OSError as e:
        raise OutputError.of(e, "cannot write the output", "nothing was written", dst,
                             file=atomic.in_destination(e.filename, dst)) from None


def _write_format(plan: Plan, report: ConvertReport, dst: Path, force: bool,
                  progress: Progress | None, on_module: Progress | None) -> GateResult:
    """Between formats (conversion/reformat.py): write, gate, commit."""
    src, writer = plan.source, WRITERS[plan.to]
    before = snapshot(src.root)
    with atomic.staging(dst, force, src.root) as tmp, ThreadPoolExecutor(1) as flusher:
        flushes = []
        reformat.write_all(src, writer, tmp, provenance(plan.from_, plan.to, report.totals),
                           progress, lambda p: flushes.append(flusher.submit(fsync_path, p)))
        faults.point("before-gate")
        gate = run_format_gate(src, tmp, plan.to, report.backend, on_module)
        for f in flushes:
            f.result()
        if not gate.ok:
            raise FindingError(*[Finding("GQ503", msg, file=str(dst)) for msg in gate.failures])
        check_unchanged(before, src.root)
        atomic.commit(tmp, dst, force)
    return gate


@dataclass(frozen=True)
class Job:
    """What a conversion between gptq and gptq_v2 writes, decided before anything is written."""
    ckpt: Checkpoint
    dst: Path
    src_conv: str
    dst_conv: str
    allow_lossy: bool
    force: bool
    jobs: int
    derived_config: dict[str, Any] | None = None  # quantize_config.json where SRC has none
    trusted: bool = False                          # --from trusted over the data (Plan)

    @classmethod
    def of(cls, plan: Plan, dst: Path, allow_lossy: bool, force: bool, jobs: int) -> Job:
        ck = plan.source.labelled
        assert ck is not None   # a plan between conventions reads a labelled source
        return cls(ck, dst, plan.from_, plan.to, allow_lossy, force, jobs, plan.derived,
                   plan.trusted)

    def shard_args(self, tmp: Path) -> list[tuple[Any, ...]]:
        """write_shard's arguments for every shard, with the qzeros each one holds."""
        store = self.ckpt.store
        qz: dict[str, list[QzerosJob]] = {s: [] for s in store.files}
        for m in self.ckpt.valid_modules:
            qz[store.file_of(m.tensors["qzeros"])].append(QzerosJob(m.tensors["qzeros"], m.bits))
        return [(store.root / s, tmp / s, qz[s], self.src_conv, self.dst_conv, self.allow_lossy,
                 i) for i, s in enumerate(sorted(store.files))]


def _write_verify_commit(job: Job, report: ConvertReport, progress: Progress | None,
                         on_module: Progress | None) -> GateResult:
    """Write, verify and commit the planned `report`; the gate's result once DST is in
    place."""
    before = snapshot(job.ckpt.store.root)
    with atomic.staging(job.dst, job.force, job.ckpt.store.root) as tmp, \
            ThreadPoolExecutor(1) as flusher:
        # each shard is flushed to disk in the background while the next one is written
        args = job.shard_args(tmp)
        flushes = []
        total = sum(a[0].stat().st_size for a in args)
        bar = (lambda n, p=progress: p(n, total)) if progress else None
        if bar:
            bar(0)
        written: list[ShardWritten] = []
        with _shard_writers(job.jobs, len(args)) as mapper:
            for a, w in zip(args, mapper(_write_shard_args, args)):
                flushes.append(flusher.submit(fsync_path, a[1]))
                written.append(w)
                if bar:
                    bar(w.size)
        faults.point("shards-written")
        root = job.ckpt.store.root
        copy_other_files(root, tmp, set(job.ckpt.store.files) | set(CONFIG_FILES))
        rewrite_configs(root, tmp, job.dst_conv,
                        provenance(job.src_conv, job.dst_conv, report.totals), job.derived_config)
        # the staged configs must declare what the shards hold, as verify reads them
        mislabelled = check_labels(tmp, job.dst_conv, reread=job.trusted)
        if mislabelled:
            raise FindingError(*[Finding("GQ503", msg, file=str(job.dst)) for msg in mislabelled])
        faults.point("before-gate")
        gate = run_gate(job.ckpt, tmp, job.src_conv, job.dst_conv,
                        sum(w.copied for w in written), on_module)
        if report.backend == "cupy" and gate.ok:
            gate = gpu_gate(job, tmp, report, gate)
        for f in flushes:
            f.result()
        if not gate.ok:
            raise FindingError(*[Finding("GQ503", msg, file=str(job.dst))
                                 for msg in gate.failures])
        check_unchanged(before, job.ckpt.store.root)
        atomic.commit(tmp, job.dst, job.force)
    return gate


def gpu_gate(job: Job, tmp: Path, report: ConvertReport, gate: GateResult) -> GateResult:
    """The GPU confirmation: every weight of every module, source under its convention and
    output under the target, as each runtime group reads them, computed and compared bit for
    bit on the device by the fused kernel (gptq_count_differences: nothing stored, mismatches
    counted per column). Modules with lossy cells are what the report measures, not checked."""
    from ..numerics import get_backend
    be = get_backend("cupy")
    lossy = {m.name for m in report.modules if m.lossy}
    out = open_checkpoint(tmp)
    failures = []
    try:
        for m in job.ckpt.valid_modules:
            if m.name in lossy:
                continue
            ta, tb = job.ckpt.module_tensors(m), out.module_tensors(out.module(m.name))
            differ = [g.name for g in runtime_groups()
                      if be.count_differences(ta, g.rule(job.src_conv), tb,
                                              g.rule(job.dst_conv)).any()]
            job.ckpt.store.release(m.tensors.values())
            out.store.release(m.tensors.values())
            if differ:
                failures.append(f"{m.name}: other weights on the GPU for {', '.join(differ)}")
    finally:
        out.close()
    return replace(gate, failures=gate.failures + failures,
                   method=gate.method + "; every weight of every module compared bit for bit "
                   "under each runtime group's reading with the CUDA kernel (cupy)")


@contextmanager
def _shard_writers(jobs: int, shards: int) -> Iterator[Callable[..., Iterator[Any]]]:
    """A map over shards: `jobs` worker processes where there is more than one shard for them,
    else this process (results in order, each as soon as it is written)."""
    if jobs <= 1 or shards <= 1:
        yield map
        return
    ctx = multiprocessing.get_context("forkserver")  # no fork beside running threads
    with ProcessPoolExecutor(max_workers=min(jobs, shards), mp_context=ctx,
                             initializer=_ignore_interrupts) as pool:
        yield pool.map


def _write_shard_args(a: tuple[Any, ...]) -> ShardWritten:
    with naming(a[1]):  # a write(2) that fails says which shard it was writing
        return write_shard(*a)


def _ignore_interrupts() -> None:
    """Workers share the terminal's process group, so Ctrl-C reaches them too: they leave it
    to the parent, which unwinds and removes the staging directory (no worker tracebacks)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _backend(requested: str) -> str:
    """cpu, or cupy when asked for (or, with auto, usable); UsageError when cupy is asked for
    and unusable."""
    if requested == "cpu":
        return "cpu"
    from ..numerics import get_backend
    return get_backend(requested).name

