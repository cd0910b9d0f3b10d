"""Gather detection evidence from a GPTQ checkpoint: the I/O around the pure functions of
stats.py, decide.py and pool.py.

inspect reads bounded amounts (every qzeros, a sample of qweight rows); verify reads all of qweight,
one chunk of rows at a time.
"""
from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np

from .. import faults
from ..bits.layout import stored_fields
from ..bits.packing import block
from ..errors import GptqfmtError
from ..formats.gptq.checkpoint import SMALL, Checkpoint, Module
from ..parallel import bounded_map, child_signals, cpus, forks_safely
from . import codestats
from .decide import AMBIGUOUS, ModuleVerdict, decide
from .pool import Detection, combine, runs_chance_missing, with_runs_chance
from .stats import FieldCounts, field_counts, zero_stats

SAMPLE_BYTES = 64 * 1024  # qweight bytes read per module in inspect's first pass
# inspect reads more while the checkpoint stays undecided: each round reads 4x the sample of
# every module not yet read whole, until it decides, every module is read, or this many more
# bytes of qweight have been read (a byte budget, not a time budget, so that inspect's answer
# does not depend on the machine's load).
EXTRA_BYTES = 256 * 1024 * 1024


def sampled_blocks(m: Module, shape: tuple[int, ...], full: bool,
                   sample: int = SAMPLE_BYTES) -> np.ndarray | None:
    """The blocks of qweight rows (qweight of `shape`) whose codes are read: None for all of
    them (verify, or a sample that is the whole tensor), else an evenly spread `sample` bytes
    of them (inspect)."""
    if full:
        return None
    _, wpb = block(m.bits, m.word_bits)
    total = shape[0] // wpb
    rows = codestats.sample_blocks(total, shape[1], wpb, sample, m.word_bits // 8)
    return None if len(rows) == total else rows


def block_bytes(m: Module, shape: tuple[int, ...],
                blocks: np.ndarray | None) -> list[tuple[int, int]] | None:
    """The byte ranges of qweight (of `shape`) that hold `blocks` (None: all of it), runs of
    adjacent blocks as one range.

        >>> from types import SimpleNamespace as M
        >>> block_bytes(M(bits=4, word_bits=32), (16, 8), np.array([0, 1, 5]))
        [(0, 64), (160, 192)]
    """
    if blocks is None:
        return None
    _, wpb = block(m.bits, m.word_bits)
    per = wpb * shape[1] * (m.word_bits // 8)
    out: list[tuple[int, int]] = []
    for b in blocks.tolist():
        if out and out[-1][1] == b * per:
            out[-1] = (out[-1][0], (b + 1) * per)
        else:
            out.append((b * per, (b + 1) * per))
    return out


def module_reads(ckpt: Checkpoint, m: Module, full: bool, sample: int = SAMPLE_BYTES,
                 codes: bool = True) -> list[tuple[str, list[tuple[int, int]] | None]]:
    """What module_verdict reads of module `m`, as (tensor, byte ranges or None for all of
    it), for TensorStore.prefetch: qzeros, g_idx, and with `codes` the qweight rows."""
    out: list[tuple[str, list[tuple[int, int]] | None]] = [
        (m.tensors[r], None) for r in ("qzeros", "g_idx") if r in m.tensors]
    if codes:
        t = m.tensors["qweight"]
        shape = ckpt.store.info(t).shape
        out.append((t, block_bytes(m, shape, sampled_blocks(m, shape, full, sample))))
    return out


def module_verdict(ckpt: Checkpoint, m: Module, full: bool, sample: int = SAMPLE_BYTES,
                   known: tuple[str | None, FieldCounts | None] | None = None) -> ModuleVerdict:
    """The module's evidence: all of qweight with `full`, else `sample` bytes of it. `known`
    is (symmetric pattern, FieldCounts) from an earlier read of the same qzeros (they need no
    codes, so a bigger sample does not change them). verify (`full`) computes the runs by chance
    of every module; inspect only of those with runs (detect_sequential fills in the rest when
    the pooled test needs them)."""
    pattern, fields = known if known is not None else (ckpt.symmetric_pattern(m), None)
    st = None
    complete = True  # a symmetric pattern decides from qzeros alone
    if full or pattern is None:
        qz = ckpt.view(m.tensors["qzeros"])
        t = m.tensors["qweight"]
        shape = ckpt.store.info(t).shape
        rows = sampled_blocks(m, shape, full, sample)
        qw = ckpt.view(t, block_bytes(m, shape, rows))
        read, sums, counts = codestats.read_cell_sums(qw, m.bits, ckpt.g_idx(m),
                                                      m.groups, rows)
        complete = rows is None
        if fields is None or (complete and fields.stored_maxq is None):
            # the counts of maxq and 0 fields only where every code is read (they back
            # findings reported only then), runs by chance only where the module's own runs
            # need it (detect_sequential fills in the rest when the pooled test needs them)
            fields = field_counts(qz, m.bits, chance=True if full else None, counts=complete)
        # only the groups whose codes were read are unpacked: the counts over every field
        # come from the packed words (fields)
        st = zero_stats(stored_fields(qz[read], m.bits), sums, counts, m.bits, m.word_bits,
                        fields, row_index=np.arange(len(qz))[read])
    v = decide(m.name, m.bits, pattern, st, ckpt.quantizer)
    return v if complete else replace(v, complete=False)   # a verdict is complete by default


# Reading a module is many small numpy steps, and Python runs those one thread at a time (the
# GIL), so threads barely help; forked processes do (detection on the 70B-shaped bench: 1.93 s
# in two threads, 1.01 to 1.07 s in two processes). From this many modules on, worth a fork
# per worker.
PROCESS_MIN_MODULES = 64


def detect_checkpoint(ckpt: Checkpoint, full: bool = False, jobs: int | None = None,
                      progress: Callable[[int], Callable[[int], Any]] | None = None
                      ) -> Detection:
    """The checkpoint's convention from every valid module: all of qweight with `full`
    (verify), else a sample that grows while the pooled evidence does not decide (inspect).
    Modules are read by `jobs` workers (default: one per CPU): forked processes for
    PROCESS_MIN_MODULES modules or more where the platform forks safely, else threads. The
    answer does not depend on the workers or their order. `progress(n)` as each round of reads
    starts, over n modules: it returns the function told of each module read (`(1)`)."""
    mods = ckpt.valid_modules
    infos = ckpt.store.infos
    work = _Work(ckpt, mods, full)
    workers = jobs or cpus()
    remote = ckpt.store.remote
    # a mirrored checkpoint is read in threads: what a forked worker fetched would land in
    # the file but not in this process's record of what is there
    forking = workers > 1 and len(mods) >= PROCESS_MIN_MODULES and not remote
    # the pool is made at the first read: where every module settles from its qzeros (a
    # mixture of experts' symmetric ones), none is made, and the store's survey is not
    # waited for past the qzeros (a fork would wait for its last pass, the probes)
    pools: list[Executor] = []
    runner: Callable[[Callable, list], Any] | None = None

    def run(fn, args):
        nonlocal runner
        if runner is None:
            runner = _runner(work, workers, forking, pools)
        return runner(fn, args)
    try:
        def prefetch(indices: list[int], sample: int, known: dict) -> None:
            # one batch for the round: every module's reads coalesced and fetched in parallel
            # (a module whose qzeros already showed a symmetric pattern reads no codes)
            ckpt.store.prefetch(p for i in indices for p in module_reads(
                ckpt, mods[i], full, sample, codes=full or known.get(i, (None,))[0] is None))
        settled = None
        patterns: dict[int, str | None] = {}
        if not full:
            # a symmetric pattern decides a sampled module from qzeros alone: every small
            # qzeros read here in one pass, and those modules never handed to a worker
            patterns = ckpt.small_patterns(mods, SMALL)

            def settled(indices: list[int]) -> list[ModuleVerdict | None]:
                return [None if (p := patterns.get(i)) is None else
                        module_verdict(ckpt, mods[i], False, known=(p, None)) for i in indices]
        reads = ModuleReads(run, [m.name for m in mods], prefetch if remote else None, settled,
                            progress)
        det = detect_sequential(reads, len(mods),
                                lambda i: infos[mods[i].tensors["qweight"]].nbytes, full)
    except BrokenProcessPool:
        raise GptqfmtError(f"{ckpt.store.root}: a worker process reading its modules ended "
                           "abruptly (killed, or out of memory?); run again") from None
    finally:  # on an interrupt, drop the modules not started (no worker outlives the call)
        for pool in pools:
            pool.shutdown(wait=True, cancel_futures=True)
    # the patterns of the modules read in the workers (the others' are the checkpoint's)
    ckpt.keep_patterns({v.name: v.pattern for i, v in enumerate(det.modules)
                        if i not in patterns})
    return det


def _runner(work: _Work, workers: int, forking: bool, pools: list[Executor]
            ) -> Callable[[Callable, list], Any]:
    """run(fn, args) for ModuleReads over a pool made now (and added to `pools`): forked
    processes where `forking` and the platform forks safely (the store's survey thread ended
    first), else threads."""
    if forking:
        work.ckpt.store.settle()   # the store's survey thread ends: this process may fork
    if forking and forks_safely():
        ctx = multiprocessing.get_context("fork")
        procs = ProcessPoolExecutor(max_workers=workers, mp_context=ctx,
                                    initializer=_start_worker, initargs=(work,))
        pools.append(procs)
        chunk = max(1, len(work.mods) // (4 * workers))
        return lambda fn, args: procs.map(_in_worker, [fn] * len(args), args, chunksize=chunk)
    threads = ThreadPoolExecutor(max_workers=workers)
    pools.append(threads)
    return lambda fn, args: bounded_map(threads, lambda a: fn(work, *a), args)


@dataclass(frozen=True)
class _Work:
    """What a worker reads modules from (a forked worker inherits it, nothing is pickled)."""
    ckpt: Checkpoint
    mods: list[Module]
    full: bool


def _read_one(work: _Work, i: int, sample: int,
              known: tuple[str | None, FieldCounts | None] | None) -> ModuleVerdict:
    m = work.mods[i]
    v = module_verdict(work.ckpt, m, work.full, sample, known)
    work.ckpt.store.release(m.tensors.values())
    return v


def _chance_one(work: _Work, i: int) -> float | None:
    m = work.mods[i]
    e = field_counts(work.ckpt.view(m.tensors["qzeros"]), m.bits, chance=True,
                     counts=False).top_runs_expected
    work.ckpt.store.release([m.tensors["qzeros"]])
    return e


_WORKER: _Work | None = None  # set in a forked worker by _start_worker


def _start_worker(work: _Work) -> None:
    """A forked worker: a child's signals (parallel.child_signals), and the work to read."""
    global _WORKER
    child_signals()
    _WORKER = work


def _in_worker(fn, args):
    assert _WORKER is not None
    return fn(_WORKER, *args)


class ModuleReads:
    """Module reads for detect_sequential, in batches run by `run(fn, args)` (threads or
    processes: it calls fn(work, *a) for each a and gives the results in order, as they come);
    `names`: the modules' names, by index. Remembers what each module's qzeros gave (symmetric
    pattern, FieldCounts), which more rows do not change. `progress(n)` as each batch of n
    starts: it returns the function told of each module done (`(1)`)."""

    def __init__(self, run, names: list[str], prefetch=None,
                 settled: Callable[[list[int]], list[ModuleVerdict | None]] | None = None,
                 progress: Callable[[int], Callable[[int], Any]] | None = None):
        self.run = run
        self.names = names
        self.known: dict[int, tuple[str | None, FieldCounts | None]] = {}
        self.rounds = 0
        # prefetch(indices, sample, known): told what a round will read before it runs
        self.prefetch = prefetch
        # settled(indices): each module's verdict where it needs no read of its own (else None)
        self.settled = settled
        self.progress = progress

    def _advance(self, n: int) -> Callable[[int], Any]:
        return self.progress(n) if self.progress is not None else (lambda k: None)

    def verdicts(self, indices: list[int], sample: int) -> list[ModuleVerdict]:
        advance = self._advance(len(indices))
        got = self.settled(indices) if self.settled is not None else [None] * len(indices)
        for v in got:
            if v is not None:
                advance(1)
        rest = [i for i, v in zip(indices, got) if v is None]
        if rest:
            if self.prefetch is not None:
                self.prefetch(rest, sample, self.known)
            read = iter(self.run(_read_one, [(i, sample, self.known.get(i)) for i in rest]))
            for k, v in enumerate(got):
                if v is None:
                    got[k] = next(read)
                    advance(1)
        out = cast(list[ModuleVerdict], got)   # every one settled or read
        known, names = self.known, self.names
        for i, v in zip(indices, out):
            known[i] = (v.pattern, v.stats.field_counts() if v.stats else None)
            v.name = names[i]  # the module's own string, not a worker process's copy
        faults.point("detect-round", self.rounds)
        self.rounds += 1
        return out

    def chances(self, indices: list[int]) -> list[float | None]:
        advance = self._advance(len(indices))
        out = []
        for e in self.run(_chance_one, [(i,) for i in indices]):
            out.append(e)
            advance(1)
        for i, e in zip(indices, out):
            pattern, fields = self.known[i]
            assert fields is not None
            self.known[i] = (pattern, replace(fields, top_runs_expected=e))
        return out


def detect_sequential(reads, count: int, size: Callable[[int], int], full: bool) -> Detection:
    """The sampling policy, apart from the I/O: `reads.verdicts(indices, sample_bytes)` gives
    those modules' verdicts from that many bytes of their qweight (all of it when `full`);
    `size(i)` is module i's qweight size, of `count` modules (asked only by a later round:
    most checkpoints, every symmetric one, decide in the first). Each round reads 4x the
    sample of the modules not yet read whole, in module order until EXTRA_BYTES are spent,
    leaving out those that already fit neither convention beyond doubt (inconsistent: more
    rows would not make them fit, and verify reads them all anyway). `reads.chances(indices)`
    gives runs by chance where the pooled runs test needs them and the reads left them out
    (runs_chance_missing)."""
    sample = SAMPLE_BYTES
    verdicts = reads.verdicts(list(range(count)), sample)

    def settle() -> Detection:
        missing = runs_chance_missing(verdicts)
        for i, e in zip(missing, reads.chances(missing) if missing else []):
            verdicts[i] = with_runs_chance(verdicts[i], e)
        return combine(verdicts)
    det = settle()
    spent = 0
    while not full and det.verdict == AMBIGUOUS and spent < EXTRA_BYTES and \
            not any(e.endswith("modules disagree") for e in det.evidence):
        sample *= 4
        todo = []
        for i, v in enumerate(det.modules):
            if verdicts[i].complete or v.inconsistent:
                continue
            if spent >= EXTRA_BYTES:
                break
            spent += min(sample, size(i))
            todo.append(i)
        if not todo:
            break
        for i, v in zip(todo, reads.verdicts(todo, sample)):
            verdicts[i] = v
        det = settle()
    return det
