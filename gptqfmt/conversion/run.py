"""convert: open (the one open) -> plan and refuse (plan.py) -> write (write.py between gptq
and gptq_v2, reformat.py between formats) -> verify gate -> atomic commit; --in-place rewrites
SRC itself (inplace.py) from the same plan."""
from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
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
from ..ops.reports import GPU_GATE, SYNC, WRITE, Progress, start
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

    `progress` hears of the phases before the gate (reports.Progress): DETECT, CHECK and PLAN
    module by module, WRITE as each chunk of the output is written (its total: the bytes of
    the output's shards; in place, of the qzeros ranges rewritten), and SYNC while written
    shards are still on their way to the disk; `on_module` of the gate's (GATE, module by
    module, and between formats COMPARE over the tensors outside the modules).

    Raises FindingError (exit 1) when the input is invalid or the conversion is refused, and
    UsageError (exit 2) for paths and options; nothing is written in either case.
    `trust_from`: convert a --from the data contradict as asked (else refused, GQ422); the
    output is then kept only when verify's detection of its data agrees with its label."""
    if in_place:
        why = {"DST": f"it writes no new directory (run `gptqfmt convert {src} {dst}` "
                      "without --in-place for a copy)",
               "--force": "there is no DST to replace",
               "--jobs": "it rewrites only the qzeros ranges, in one process",
               "--backend cupy": "its proof runs on the CPU before anything is written"}
        given = [n for n, v in (("DST", dst is not None), ("--force", force),
                                ("--jobs", jobs > 1), ("--backend cupy", backend == "cupy"))
                 if v]
        if given:
            raise UsageError(f"--in-place rewrites SRC itself, so {' and '.join(given)} "
                             f"{'does' if len(given) == 1 else 'do'} not apply: "
                             + "; ".join(f"{n}: {why[n]}" for n in given))
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
        plan = plan_conversion(source, src_convention, to, allow_lossy, jobs, trust_from,
                               progress=progress)
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
        flushes: list[tuple[Future[Any], int]] = []
        reformat.write_all(src, writer, tmp, provenance(plan.from_, plan.to, report.totals),
                           progress, lambda p: flushes.append(
                               (flusher.submit(fsync_path, p), p.stat().st_size)))
        faults.point("before-gate")
        gate = run_format_gate(src, tmp, plan.to, report.backend, on_module)
        _synced(flushes, progress)
        if not gate.ok:
            raise FindingError(*[Finding("GQ503", msg, file=str(dst)) for msg in gate.failures])
        check_unchanged(before, src.root)
        atomic.commit(tmp, dst, force)
    return gate


# write_shard's arguments before its progress callback: source and output shard, its qzeros,
# conventions, allow_lossy, the shard's index
ShardArgs = tuple[Path, Path, list[QzerosJob], str, str, bool, int]


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

    def shard_args(self, tmp: Path) -> list[ShardArgs]:
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
        flushes: list[tuple[Future[Any], int]] = []
        total = sum(a[0].stat().st_size for a in args)
        written: list[ShardWritten] = []
        advance = start(progress, WRITE, total) if progress else None
        with _written_shards(job.jobs, args, advance) as shards:
            for a, w in zip(args, shards):
                flushes.append((flusher.submit(fsync_path, a[1]), w.size))
                written.append(w)
        faults.point("shards-written")
        root = job.ckpt.store.root
        copy_other_files(root, tmp, set(job.ckpt.store.files) | set(CONFIG_FILES))
        rewrite_configs(root, tmp, job.dst_conv,
                        provenance(job.src_conv, job.dst_conv, report.totals), job.derived_config)
        # the staged configs must declare what the shards hold, as verify reads them
        mislabelled = check_labels(tmp, job.dst_conv, reread=job.trusted, progress=progress)
        if mislabelled:
            raise FindingError(*[Finding("GQ503", msg, file=str(job.dst)) for msg in mislabelled])
        faults.point("before-gate")
        gate = run_gate(job.ckpt, tmp, job.src_conv, job.dst_conv,
                        sum(w.copied for w in written), on_module)
        if report.backend == "cupy" and gate.ok:
            gate = gpu_gate(job, tmp, report, gate, on_module)
        _synced(flushes, progress)
        if not gate.ok:
            raise FindingError(*[Finding("GQ503", msg, file=str(job.dst))
                                 for msg in gate.failures])
        check_unchanged(before, job.ckpt.store.root)
        atomic.commit(tmp, job.dst, job.force)
    return gate


def _synced(flushes: list[tuple[Future[Any], int]], progress: Progress | None) -> None:
    """Wait for the fsync of every written shard ((future, its bytes)): SYNC over the bytes
    of those still on their way to the disk."""
    for f, _ in flushes:
        if f.done():
            f.result()
    waiting = [(f, n) for f, n in flushes if not f.done()]
    if not waiting:
        return
    advance = start(progress, SYNC, sum(n for _, n in waiting))
    for f, n in waiting:
        f.result()
        advance(n)


def gpu_gate(job: Job, tmp: Path, report: ConvertReport, gate: GateResult,
             on_module: Progress | None = None) -> GateResult:
    """The GPU confirmation: every weight of every module, source under its convention and
    output under the target, as each runtime group reads them, computed and compared bit for
    bit on the device by the fused kernel (gptq_count_differences: nothing stored, mismatches
    counted per column). Modules with lossy cells are what the report measures, not checked.
    `on_module` hears of GPU_GATE, module by module."""
    from ..numerics import get_backend
    be = get_backend("cupy")
    lossy = {m.name for m in report.modules if m.lossy}
    out = open_checkpoint(tmp)
    failures = []
    try:
        modules = [m for m in job.ckpt.valid_modules if m.name not in lossy]
        advance = start(on_module, GPU_GATE, len(modules))
        for m in modules:
            ta, tb = job.ckpt.module_tensors(m), out.module_tensors(out.module(m.name))
            differ = [g.name for g in runtime_groups()
                      if be.count_differences(ta, g.rule(job.src_conv), tb,
                                              g.rule(job.dst_conv)).any()]
            job.ckpt.store.release(m.tensors.values())
            out.store.release(m.tensors.values())
            if differ:
                failures.append(f"{m.name}: other weights on the GPU for {', '.join(differ)}")
            advance(1)
    finally:
        out.close()
    return replace(gate, failures=gate.failures + failures,
                   method=gate.method + "; every weight of every module compared bit for bit "
                   "under each runtime group's reading with the CUDA kernel (cupy)")


@contextmanager
def _written_shards(jobs: int, args: list[ShardArgs],
                    advance: Callable[[int], Any] | None) -> Iterator[Iterator[ShardWritten]]:
    """write_shard over `args`: in `jobs` worker processes where there is more than one shard
    for them, else in this process (results in order, each as soon as it is written);
    `advance(n)` as each n bytes are written, in this process either way (a thread here relays
    what the workers send)."""
    if jobs <= 1 or len(args) <= 1:
        yield (_write_shard_args(a, advance) for a in args)
        return
    ctx = multiprocessing.get_context("forkserver")  # no fork beside running threads
    sent = ctx.SimpleQueue() if advance else None
    relay = _Relay(sent, advance) if advance else None
    try:
        with ProcessPoolExecutor(max_workers=min(jobs, len(args)), mp_context=ctx,
                                 initializer=_start_writer, initargs=(sent,)) as pool:
            yield pool.map(_write_in_worker, args)
    finally:  # every worker has ended: all they sent is in the pipe before the end marker
        if relay is not None:
            relay.stop()
    if relay is not None and relay.error is not None:
        raise relay.error


class _Relay:
    """Byte counts from the shard writers' processes, passed on to `advance` by a thread of
    this one as they arrive (a SimpleQueue's put is in the pipe when it returns)."""

    def __init__(self, sent: Any, advance: Callable[[int], Any]):
        self.sent, self.advance = sent, advance
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (n := self.sent.get()) is not None:
            if self.error is None:
                try:
                    self.advance(n)
                except BaseException as e:  # noqa: BLE001 - raised in the caller after stop()
                    self.error = e   # the pipe is still drained, so no writer blocks on it

    def stop(self) -> None:
        """Once every writer has ended: the rest passed on, the thread ended."""
        self.sent.put(None)
        self.thread.join()


def _write_shard_args(a: ShardArgs,
                      advance: Callable[[int], Any] | None = None) -> ShardWritten:
    with naming(a[1]):  # a write(2) that fails says which shard it was writing
        return write_shard(*a, advance)


_SENT: Any = None   # in a shard writer process: where its byte counts go (_start_writer)


def _write_in_worker(a: ShardArgs) -> ShardWritten:
    return _write_shard_args(a, _SENT.put if _SENT is not None else None)


def _start_writer(sent: Any) -> None:
    """Workers share the terminal's process group, so Ctrl-C reaches them too: they leave it
    to the parent, which unwinds and removes the staging directory (no worker tracebacks).
    `sent`: the queue their byte counts go to (None: no progress wanted)."""
    import signal

    global _SENT
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _SENT = sent


def _backend(requested: str) -> str:
    """cpu, or cupy when asked for (or, with auto, usable); UsageError when cupy is asked for
    and unusable."""
    if requested == "cpu":
        return "cpu"
    from ..numerics import get_backend
    return get_backend(requested).name

