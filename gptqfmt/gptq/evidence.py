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


def sampled_blocks(m: Module, qw: np.ndarray, full: bool) -> np.ndarray | None:
    """The blocks of qweight rows whose codes are read: None for all of them (verify, or a
    sample that is the whole tensor), else an evenly spread SAMPLE_BYTES of them (inspect)."""
    if full:
        return None
    _, wpb = block(m.bits, m.word_bits)
    total = qw.shape[0] // wpb
    rows = codestats.sample_blocks(total, qw.shape[1], wpb, SAMPLE_BYTES, qw.dtype.itemsize)
    return None if len(rows) == total else rows


def module_cells(ckpt: Checkpoint, m: Module, full: bool):
    """(stored fields [G, N], code sums [G, N], counts [G]) of every group: the codes of all
    groups with `full`, else of those a sample of qweight rows reaches (count 0 for the others;
    their stored fields still count where no codes are needed)."""
    qz = ckpt.view(m.tensors["qzeros"])
    qw = ckpt.view(m.tensors["qweight"])
    rows = sampled_blocks(m, qw, full)
    sums, counts = codestats.cell_sums(qw, m.bits, module_g_idx(ckpt, m), m.groups, rows)
    return stored_fields(qz, m.bits), sums, counts


def module_verdict(ckpt: Checkpoint, m: Module, full: bool) -> ModuleVerdict:
    pattern = symmetric_pattern(ckpt.view(m.tensors["qzeros"]), m.bits)
    st = None
    complete = True  # a symmetric pattern decides from qzeros alone
    if full or pattern is None:
        stored, sums, counts = module_cells(ckpt, m, full)
        st = zero_stats(stored, sums, counts, m.bits, m.word_bits)
        complete = sampled_blocks(m, ckpt.view(m.tensors["qweight"]), full) is None
    v = decide(m.name, m.bits, pattern, st, quantizer(ckpt))
    v.complete = complete
    return v


def detect_checkpoint(ckpt: Checkpoint, full: bool = False) -> Detection:
    verdicts = []
    for m in ckpt.modules:
        if m.valid:
            verdicts.append(module_verdict(ckpt, m, full))
            ckpt.store.release(m.tensors.values())
    return combine(verdicts)
