"""Gather detection evidence from a checkpoint: the I/O around the pure functions of detect.py.

inspect reads bounded amounts (every qzeros, a sample of qweight rows); verify reads all of qweight,
one chunk of rows at a time.
"""
from __future__ import annotations

from dataclasses import replace

import numpy as np

from . import codestats
from .checkpoint import Checkpoint, Module
from .detect import AMBIGUOUS, Detection, ModuleVerdict, combine, decide, stored_fields, \
    symmetric_pattern, zero_stats
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


def module_verdict(ckpt: Checkpoint, m: Module, full: bool,
                   sample: int = SAMPLE_BYTES) -> ModuleVerdict:
    """The module's own evidence: all of qweight with `full`, else `sample` bytes of it."""
    qz = ckpt.view(m.tensors["qzeros"])
    pattern = symmetric_pattern(qz, m.bits)
    st = None
    complete = True  # a symmetric pattern decides from qzeros alone
    if full or pattern is None:
        qw = ckpt.view(m.tensors["qweight"])
        rows = sampled_blocks(m, qw, full, sample)
        sums, counts = codestats.cell_sums(qw, m.bits, module_g_idx(ckpt, m), m.groups, rows)
        st = zero_stats(stored_fields(qz, m.bits), sums, counts, m.bits, m.word_bits)
        complete = rows is None
    return replace(decide(m.name, m.bits, pattern, st, quantizer(ckpt)), complete=complete)


def detect_checkpoint(ckpt: Checkpoint, full: bool = False) -> Detection:
    """The checkpoint's convention from every valid module: all of qweight with `full`
    (verify), else a sample that grows while the pooled evidence does not decide (inspect)."""
    mods = [m for m in ckpt.modules if m.valid]
    sizes = [ckpt.store.info(m.tensors["qweight"]).nbytes for m in mods]
    return detect_sequential(lambda i, sample: _read(ckpt, mods[i], full, sample), sizes,
                             full)


def detect_sequential(read, sizes: list[int], full: bool) -> Detection:
    """The sampling policy, apart from the I/O: `read(i, sample_bytes)` gives module i's
    verdict from that many bytes of its qweight (all of it when `full`); `sizes[i]` is its
    qweight's size. Each round reads 4x the sample of the modules not yet read whole."""
    sample = SAMPLE_BYTES
    verdicts = [read(i, sample) for i in range(len(sizes))]
    det = combine(verdicts)
    spent = 0
    while not full and det.verdict == AMBIGUOUS and spent < EXTRA_BYTES and \
            not any(e.endswith("modules disagree") for e in det.evidence):
        todo = [i for i, v in enumerate(verdicts) if not v.complete]
        if not todo:
            break
        sample *= 4
        for i in todo:
            if spent >= EXTRA_BYTES:
                break
            spent += min(sample, sizes[i])
            verdicts[i] = read(i, sample)
        det = combine(verdicts)
    return det


def _read(ckpt: Checkpoint, m: Module, full: bool, sample: int) -> ModuleVerdict:
    v = module_verdict(ckpt, m, full, sample)
    ckpt.store.release(m.tensors.values())
    return v
