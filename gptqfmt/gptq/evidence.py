"""Gather detection evidence from a checkpoint: the I/O around the pure functions of detect.py.

inspect reads bounded amounts (every qzeros, a sample of qweight rows); verify reads all of qweight,
one chunk of rows at a time.
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import numpy as np

from . import codestats
from .checkpoint import Checkpoint, Module
from .detect import AMBIGUOUS, Detection, FieldCounts, ModuleVerdict, combine, decide, \
    field_counts, stored_fields, symmetric_pattern, zero_stats
from .layout import trivial_g_idx
from .packing import block

SAMPLE_BYTES = 64 * 1024  # qweight bytes read per module in inspect's first pass
# inspect reads more while the checkpoint stays undecided: each round reads 4x the sample of
# every module not yet read whole, until it decides, every module is read, or this many more
# bytes of qweight have been read (a byte budget, not a time budget, so that inspect's answer
# does not depend on the machine's load).
EXTRA_BYTES = 256 * 1024 * 1024


def quantizer(ckpt: Checkpoint) -> str | None:
    q = (ckpt.config.meta or {}).get("quantizer") if ckpt.config else None
    items = [q] if isinstance(q, str) else (q if isinstance(q, list) else [])
    return next((i for i in items if isinstance(i, str) and i.lower().startswith("gptqmodel:")),
                items[0] if items and isinstance(items[0], str) else None)


def module_g_idx(ckpt: Checkpoint, m: Module) -> np.ndarray:
    if "g_idx" in m.tensors:
        return np.asarray(ckpt.view(m.tensors["g_idx"]), dtype=np.int64)
    return trivial_g_idx(m.in_features, m.group_size)


def sampled_blocks(m: Module, qw: np.ndarray, full: bool,
                   sample: int = SAMPLE_BYTES) -> np.ndarray | None:
    """The blocks of qweight rows whose codes are read: None for all of them (verify, or a
    sample that is the whole tensor), else an evenly spread `sample` bytes of them (inspect)."""
    if full:
        return None
    _, wpb = block(m.bits, m.word_bits)
    total = qw.shape[0] // wpb
    rows = codestats.sample_blocks(total, qw.shape[1], wpb, sample, qw.dtype.itemsize)
    return None if len(rows) == total else rows


def module_verdict(ckpt: Checkpoint, m: Module, full: bool, sample: int = SAMPLE_BYTES,
                   known: tuple[str | None, FieldCounts | None] | None = None) -> ModuleVerdict:
    """The module's evidence: all of qweight with `full`, else `sample` bytes of it. `known`
    is (symmetric pattern, FieldCounts) from an earlier read of the same qzeros (they need no
    codes, so a bigger sample does not change them)."""
    qz = ckpt.view(m.tensors["qzeros"])
    pattern, fields = known if known is not None else (symmetric_pattern(qz, m.bits), None)
    st = None
    complete = True  # a symmetric pattern decides from qzeros alone
    if full or pattern is None:
        qw = ckpt.view(m.tensors["qweight"])
        rows = sampled_blocks(m, qw, full, sample)
        read, sums, counts = codestats.read_cell_sums(qw, m.bits, module_g_idx(ckpt, m),
                                                      m.groups, rows)
        fields = fields or field_counts(qz, m.bits)
        # only the groups whose codes were read are unpacked: the counts over every field
        # come from the packed words (fields)
        st = zero_stats(stored_fields(qz[read], m.bits), sums, counts, m.bits, m.word_bits,
                        fields)
        complete = rows is None
    return replace(decide(m.name, m.bits, pattern, st, quantizer(ckpt)), complete=complete)


def detect_checkpoint(ckpt: Checkpoint, full: bool = False, jobs: int | None = None) -> Detection:
    """The checkpoint's convention from every valid module: all of qweight with `full`
    (verify), else a sample that grows while the pooled evidence does not decide (inspect).
    Modules are read in `jobs` threads (default: one per CPU; numpy releases the GIL in its
    loops); the answer does not depend on their order."""
    mods = [m for m in ckpt.modules if m.valid]
    sizes = [ckpt.store.info(m.tensors["qweight"]).nbytes for m in mods]
    known: dict[int, tuple[str | None, FieldCounts | None]] = {}

    def read(i: int, sample: int) -> ModuleVerdict:
        v = module_verdict(ckpt, mods[i], full, sample, known.get(i))
        known[i] = (v.pattern, v.stats.field_counts() if v.stats else None)
        ckpt.store.release(mods[i].tensors.values())
        return v
    pool = ThreadPoolExecutor(max_workers=jobs or os.cpu_count() or 1)
    try:
        return detect_sequential(read, sizes, full, pool.map)
    finally:  # on an interrupt, drop the modules not started (no thread outlives the call)
        pool.shutdown(wait=True, cancel_futures=True)


def detect_sequential(read, sizes: list[int], full: bool, map_=map) -> Detection:
    """The sampling policy, apart from the I/O: `read(i, sample_bytes)` gives module i's
    verdict from that many bytes of its qweight (all of it when `full`); `sizes[i]` is its
    qweight's size; `map_` runs reads (in threads, say) and gives their results in order.
    Each round reads 4x the sample of the modules not yet read whole, in module order until
    EXTRA_BYTES are spent, leaving out those that already fit neither convention beyond doubt
    (inconsistent: more rows would not make them fit, and verify reads them all anyway)."""
    sample = SAMPLE_BYTES
    verdicts = list(map_(lambda i: read(i, sample), range(len(sizes))))
    det = combine(verdicts)
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
            spent += min(sample, sizes[i])
            todo.append(i)
        if not todo:
            break
        for i, v in zip(todo, map_(lambda i: read(i, sample), todo)):
            verdicts[i] = v
        det = combine(verdicts)
    return det
