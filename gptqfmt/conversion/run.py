"""convert: plan (plan.py) -> per-field rewrite -> streaming write -> verify gate -> atomic
commit."""
from __future__ import annotations

import multiprocessing
from contextlib import contextmanager
import os
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

from .. import faults, runtimes
from ..formats import FORMATS, GPTQ, TARGETS, Sniffed, sniff
from ..safetensors_io.index import open_store
from ..conventions import CONVENTIONS
from ..errors import FindingError, OutputError, UsageError
from ..findings import ERROR, Finding
from ..journal import fsync_path
from ..gptq.checkpoint import Checkpoint, open_checkpoint
from . import atomic, reformat
from .reformat_gate import run_format_gate
from .configs import CONFIG_FILES, declaring_configs, derive_config, provenance, rewrite_configs
from .gate import GateResult, check_labels, run_gate
from .inplace import convert_in_place
from .plan import open_and_plan
from .report import ConvertReport
from .write import QzerosJob, check_unchanged, copy_other_files, snapshot, write_shard

def convert(src: str | os.PathLike, dst: str | os.PathLike | None, to: str = "gptq_v2",
            src_convention: str = "auto", allow_lossy: bool = False, dry_run: bool = False,
            force: bool = False, jobs: int = 1, backend: str = "auto",
            progress=None, on_module=None, in_place: bool = False) -> ConvertReport:
    """Convert the checkpoint directory `src` into `dst` (see the module docstring); with
    `in_place` (and no `dst`), rewrite `src` itself (inplace.py).

    `progress(nbytes, total_bytes)` is called as shards are written and `on_module(1,
    total_modules)` as the gate checks modules (each first with 0, so a bar knows its total).

    Raises FindingError (exit 1) when the input is invalid or the conversion is refused, and
    UsageError (exit 2) for paths and options; nothing is written in either case."""
    if in_place:
        given = [n for n, v in (("DST", dst is not None), ("--force", force),
                                ("--jobs", jobs > 1), ("--backend cupy", backend == "cupy"))
                 if v]
        if given:
            raise UsageError(f"--in-place rewrites SRC itself, so {', '.join(given)} "
                             "does not apply (the proof runs on the CPU before anything is "
                             "written)")
        return convert_in_place(src, to, src_convention, allow_lossy, dry_run, progress,
                                on_module)
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
    sniffed = _sniff(src_path)
    if sniffed.format == GPTQ and src_convention not in CONVENTIONS + ("auto",):
        raise UsageError(f"{src}: a GPTQ checkpoint, not --from {src_convention}")
    if sniffed.format != GPTQ or to not in CONVENTIONS:
        if jobs > 1:
            raise UsageError("--jobs applies between gptq and gptq_v2; between formats the "
                             "shards are written one at a time, each tensor's re-layout on "
                             "every CPU already")
        return _convert_format(src_path, dst_path, sniffed, to, src_convention, allow_lossy,
                               dry_run, force, backend, progress, on_module)
    ckpt, det, from_conv, plans, findings = open_and_plan(src_path, src_convention, to,
                                                          allow_lossy)
    derived = None
    if not declaring_configs(ckpt.store.root):  # the output must say what it holds
        derived, about = derive_config(ckpt, from_conv, to)
        findings += about
    refusals = [f for f in findings if f.severity == ERROR]
    if refusals:
        raise FindingError(*refusals)
    report = ConvertReport(str(src), str(dst), from_conv, to, dry_run, plans, det, findings,
                           backend=backend)
    if dry_run:
        return report
    job = Job(ckpt, dst_path, from_conv, to, allow_lossy, force, jobs, derived)
    with _output_errors(dst_path):
        gate = _write_verify_commit(job, report, progress, on_module)
    return replace(report, written=True, gate=gate)


@contextmanager
def _output_errors(dst: Path):
    """An OSError while writing, as the one-line OutputError the CLI reports (exit 1)."""
    try:
        yield
    except atomic.AfterRename as e:
        raise OutputError(f"{e.filename or dst}: {e.strerror or e} after {dst} was put in "
                          "place; check it with `gptqfmt verify`") from None
    except OSError as e:
        raise OutputError(f"{e.filename or dst}: cannot write the output: "
                          f"{e.strerror or e}; nothing was written") from None


def _sniff(path: Path) -> Sniffed:
    store = open_store(path)
    try:
        return sniff(store)
    finally:
        store.close()


def _convert_format(src_path: Path, dst_path: Path, sniffed: Sniffed, to: str, requested: str,
                    allow_lossy: bool, dry_run: bool, force: bool, backend: str, progress,
                    on_module) -> ConvertReport:
    """Between formats (conversion/reformat.py): plan, write, gate, commit."""
    opened = reformat.open_for_convert(src_path, sniffed, requested, to, allow_lossy)
    src = opened.source
    try:
        refusals = [f for f in opened.findings if f.severity == ERROR]
        if refusals:
            raise FindingError(*refusals)
        report = ConvertReport(str(src_path), str(dst_path), opened.from_, to, dry_run,
                               opened.plans, opened.detection, opened.findings, backend=backend)
        if dry_run:
            return report
        with _output_errors(dst_path):
            gate = _write_format(src, opened, report, dst_path, force, progress, on_module)
        return replace(report, written=True, gate=gate)
    finally:
        src.close()


def _write_format(src, opened, report: ConvertReport, dst: Path, force: bool, progress,
                  on_module) -> GateResult:
    before = snapshot(src.root)
    with atomic.staging(dst, force, src.root) as tmp, ThreadPoolExecutor(1) as flusher:
        flushes = []
        reformat.write_all(src, report.dst_convention, tmp,
                           reformat.prov(opened.from_, report.dst_convention, opened.plans),
                           progress, lambda p: flushes.append(flusher.submit(fsync_path,
                                                                             p)))
        faults.point("before-gate")
        gate = run_format_gate(src, tmp, report.dst_convention, report.backend, on_module)
        for f in flushes:
            f.result()
        if not gate.ok:
            raise FindingError(*[Finding("GQ503", msg, file=str(dst)) for msg in gate.failures])
        check_unchanged(before, src.root)
        atomic.commit(tmp, dst, force)
    return gate


@dataclass(frozen=True)
class Job:
    """What a conversion writes, decided before anything is written."""
    ckpt: Checkpoint
    dst: Path
    src_conv: str
    dst_conv: str
    allow_lossy: bool
    force: bool
    jobs: int
    derived_config: dict | None = None  # quantize_config.json for a source without configs

    def shard_args(self, tmp: Path) -> list[tuple]:
        """write_shard's arguments for every shard, with the qzeros each one holds."""
        store = self.ckpt.store
        qz = {s: [] for s in store.files}
        for m in self.ckpt.modules:
            qz[store.file_of(m.tensors["qzeros"])].append(QzerosJob(m.tensors["qzeros"], m.bits))
        return [(store.root / s, tmp / s, qz[s], self.src_conv, self.dst_conv, self.allow_lossy,
                 i) for i, s in enumerate(sorted(store.files))]


def _write_verify_commit(job: Job, report: ConvertReport, progress, on_module) -> GateResult:
    """Write, verify and commit the planned `report`; the gate's result once DST is in
    place."""
    before = snapshot(job.ckpt.store.root)
    with atomic.staging(job.dst, job.force, job.ckpt.store.root) as tmp, \
            ThreadPoolExecutor(1) as flusher:
        # each shard is flushed to disk in the background while the next one is written
        args = job.shard_args(tmp)
        flushes = []
        total = sum(a[0].stat().st_size for a in args)
        progress = (lambda n, p=progress: p(n, total)) if progress else None
        progress and progress(0)
        written = []
        with _shard_writers(job.jobs, len(args)) as mapper:
            for a, w in zip(args, mapper(_write_shard_args, args)):
                flushes.append(flusher.submit(fsync_path, a[1]))
                written.append(w)
                progress and progress(w.size)
        faults.point("shards-written")
        root = job.ckpt.store.root
        copy_other_files(root, tmp, set(job.ckpt.store.files) | set(CONFIG_FILES))
        rewrite_configs(root, tmp, job.dst_conv,
                        provenance(job.src_conv, job.dst_conv, report.totals), job.derived_config)
        # the staged configs must declare what the shards hold, as verify reads them
        mislabelled = check_labels(tmp, job.dst_conv)
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
    from ..numerics.operands import module_tensors
    be = get_backend("cupy")
    lossy = {m.name for m in report.modules if m.lossy}
    out = open_checkpoint(tmp)
    failures = []
    try:
        for m in job.ckpt.modules:
            if m.name in lossy or not m.valid:
                continue
            ta, tb = module_tensors(job.ckpt, m), module_tensors(out, m)
            differ = [g.name for g in runtimes.groups()
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
def _shard_writers(jobs: int, shards: int):
    """A map over shards: `jobs` worker processes where there is more than one shard for them,
    else this process (results in order, each as soon as it is written)."""
    if jobs <= 1 or shards <= 1:
        yield map
        return
    ctx = multiprocessing.get_context("forkserver")  # no fork beside running threads
    with ProcessPoolExecutor(max_workers=min(jobs, shards), mp_context=ctx,
                             initializer=_ignore_interrupts) as pool:
        yield pool.map


def _write_shard_args(a):
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
