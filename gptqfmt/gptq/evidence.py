"""Gather detection evidence from a checkpoint: the I/O around the pure functions of detect.py.

inspect reads bounded amounts (every qzeros, a sample of qweight rows); verify reads all of qweight,
one chunk of rows at a time.
"""
from __future__ import annotations

import numpy as np

from . import codestats
from .checkpoint import Checkpoint, Module
from .detect import Detection, ModuleVerdict, combine, decide, stored_fields, symmetric_pattern, \
    zero_stats
from .layout import trivial_g_idx
from .packing import block

SAMPLE_BYTES = 64 * 1024  # qweight bytes read per module in inspect


def quantizer(ckpt: Checkpoint) -> str | None:
    q = (ckpt.config.meta or {}).get("quantizer") if ckpt.config else None
    items = [q] if isinstance(q, str) else (q if isinstance(q, list) else [])
    return next((i for i in items if isinstance(i, str) and i.lower().startswith("gptqmodel:")),
                items[0] if items and isinstance(items[0], str) else None)


def module_g_idx(ckpt: Checkpoint, m: Module) -> np.ndarray:
    if "g_idx" in m.tensors:
        return np.asarray(ckpt.view(m.tensors["g_idx"]), dtype=np.int64)
    return trivial_g_idx(m.in_features, m.group_size)


def module_cells(ckpt: Checkpoint, m: Module, full: bool):
    """(stored fields, code sums, counts) of the groups whose codes were read: all groups with
    `full`, else those a sample of qweight rows reaches (only their qzeros rows are unpacked)."""
    qz = ckpt.view(m.tensors["qzeros"])
    qw = ckpt.view(m.tensors["qweight"])
    _, wpb = block(m.bits, m.word_bits)
    rows = None if full else codestats.sample_blocks(qw.shape[0] // wpb, qw.shape[1], wpb,
                                                     SAMPLE_BYTES, qw.dtype.itemsize)
    sums, counts = codestats.cell_sums(qw, m.bits, module_g_idx(ckpt, m), m.groups, rows)
    read = np.flatnonzero(counts > 0)
    if len(read) == len(counts):
        return stored_fields(qz, m.bits), sums, counts
    return stored_fields(qz[read], m.bits), sums[read], counts[read]


def module_verdict(ckpt: Checkpoint, m: Module, full: bool) -> ModuleVerdict:
    pattern = symmetric_pattern(ckpt.view(m.tensors["qzeros"]), m.bits)
    st = None
    if full or pattern is None:
        stored, sums, counts = module_cells(ckpt, m, full)
        st = zero_stats(stored, sums, counts, m.bits, m.word_bits)
    return decide(m.name, m.bits, pattern, st, quantizer(ckpt))


def detect_checkpoint(ckpt: Checkpoint, full: bool = False) -> Detection:
    verdicts = []
    for m in ckpt.modules:
        if m.valid:
            verdicts.append(module_verdict(ckpt, m, full))
            ckpt.store.release(m.tensors.values())
    return combine(verdicts)
