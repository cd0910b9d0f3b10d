"""Per-cell code sums from packed qweight: the raw material of zero-point detection.

A cell is (group g, output column n). For each cell we need the sum of its codes and how many
codes were summed; mean(code) - stored zero then tells the convention (see detect.py).

Two paths, both exact integer sums:
- group-contiguous rows (no act-order, group_size a multiple of the values per word): the fields
  of one word all belong to one group, so each word is reduced to the sum of its fields with
  SWAR folds (a few whole-array integer ops), then rows are summed per group;
- act-order (g_idx arbitrary): per field position j, the j-th field of every word is extracted and
  its rows summed by group after sorting rows by g_idx.
Work runs over chunks of rows so that temporaries stay small (and in cache).
"""
from __future__ import annotations

import numpy as np

from .packing import UNSIGNED, block, maxq, unpack

CHUNK_WORDS = 1 << 17  # words per chunk (512 KiB of int32: temporaries stay in cache)


def word_field_sums(words: np.ndarray, bits: int) -> np.ndarray:
    """Sum of the fields of each word (2/4/8 bits: fields never straddle words).

    SWAR: fold neighbouring lanes together until each byte holds a partial sum, then add the
    bytes with one multiply when the total fits in a byte (4-bit int32: 8 x 15 = 120).
    """
    w_bits = words.dtype.itemsize * 8
    ut = UNSIGNED[w_bits]
    x = words.view(ut)
    width = bits
    while width < min(8, w_bits):
        mask = ut(_lane_mask(width, w_bits))
        x = (x & mask) + ((x >> ut(width)) & mask)
        width *= 2
    if w_bits > 8 and (w_bits // bits) * maxq(bits) <= 255:
        ones = ut(int("01" * (w_bits // 8), 16))         # 0x01010101 for int32
        return (x * ones) >> ut(w_bits - 8)
    while width < w_bits:
        mask = ut(_lane_mask(width, w_bits))
        x = (x & mask) + ((x >> ut(width)) & mask)
        width *= 2
    return x


def _lane_mask(width: int, w_bits: int) -> int:
    """Mask selecting the low `width` bits of every 2*width-bit lane."""
    lane = (1 << width) - 1
    m = 0
    for start in range(0, w_bits, 2 * width):
        m |= lane << start
    return m


def rows_per_group(bits: int, word_bits: int, group_size: int, in_features: int) -> int | None:
    """Packed rows per group when every word holds fields of one group only, else None."""
    vpw = word_bits // bits if bits != 3 else None
    gs = in_features if group_size == -1 else group_size
    if vpw is None or gs % vpw:
        return None
    return gs // vpw


def read_cell_sums(qweight: np.ndarray, bits: int, g_idx: np.ndarray, groups: int,
                   row_blocks: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(read [R] group indices, sums [R, N] uint64, counts [R] int64) over the packed rows in
    `row_blocks` (all if None): only the R groups some row was read of, so that a sample of a
    large module allocates what it reads, not a cell per group.

    `row_blocks` are sorted indices of blocks of packed rows (a block = the words holding whole
    values: 1 row, or 3 rows at 3 bits), so sampling never splits a value. Blocks are taken a
    chunk at a time (a slice where they are contiguous, one gather where sampled), so a sample
    of scattered rows costs what its bytes cost, not a Python step per row.
    """
    words_bits = qweight.dtype.itemsize * 8
    vpb, wpb = block(bits, words_bits)
    n = qweight.shape[1]
    total_blocks = qweight.shape[0] // wpb
    g_idx = np.asarray(g_idx, dtype=np.int64)
    trivial_rpg = _trivial_rows_per_group(g_idx, bits, words_bits, groups)
    step = max(1, CHUNK_WORDS // max(1, n * wpb))
    blocks = None if row_blocks is None else np.asarray(row_blocks, dtype=np.int64)
    if blocks is None:
        read = np.arange(groups)
    else:  # the groups the blocks' values fall in
        chans = (blocks[:, None] * vpb + np.arange(vpb)).reshape(-1)
        read = np.unique(g_idx[chans]) if trivial_rpg is None else \
            np.unique(blocks * wpb // trivial_rpg)
    slot = np.full(groups, -1, dtype=np.int64)
    slot[read] = np.arange(len(read))
    sums = np.zeros((len(read), n), dtype=np.uint64)
    counts = np.zeros(len(read), dtype=np.int64)
    nblocks = total_blocks if blocks is None else len(blocks)
    for c0 in range(0, nblocks, step):
        c1 = min(nblocks, c0 + step)
        if blocks is None or blocks[c1 - 1] - blocks[c0] == c1 - 1 - c0:  # contiguous
            b0 = c0 if blocks is None else int(blocks[c0])
            words = qweight[b0 * wpb: (b0 + c1 - c0) * wpb]
            rows = np.arange(b0 * wpb, (b0 + c1 - c0) * wpb)
        else:
            rows = (blocks[c0:c1, None] * wpb + np.arange(wpb)).reshape(-1)
            words = qweight[rows]
        if trivial_rpg:
            _add_rows(sums, counts, word_field_sums(words, bits), slot[rows // trivial_rpg],
                      vpb // wpb)
        else:
            chans = (rows // wpb)[::wpb, None] * vpb + np.arange(vpb)
            _add_rows(sums, counts, unpack(words, bits, axis=0), slot[g_idx[chans.reshape(-1)]],
                      1)
    return read, sums, counts


def _trivial_rows_per_group(g_idx, bits, word_bits, groups) -> int | None:
    if bits == 3:
        return None
    vpw = word_bits // bits
    k = len(g_idx)
    if groups == 1:
        return k // vpw
    gs = int(np.count_nonzero(g_idx == 0))
    if gs % vpw or not np.array_equal(g_idx, np.arange(k) // gs):
        return None
    return gs // vpw


def _add_rows(sums, counts, values, slots, per_row):
    """Add each row of `values` [R, N] to its group's slot in `sums`; each row holds `per_row`
    codes. (np.add.reduceat along rows is some 50x slower than slicing: one sum per run of
    equal slots, or one vectorised add when no two rows share a slot, as in a sparse sample.)"""
    if not np.all(slots[1:] >= slots[:-1]):
        order = np.argsort(slots, kind="stable")
        values, slots = values[order], slots[order]
    starts = np.flatnonzero(np.r_[True, slots[1:] != slots[:-1]])
    if len(starts) == len(slots):
        sums[slots] += values
        counts[slots] += per_row
        return
    ends = np.r_[starts[1:], len(slots)]
    for g, a, b in zip(slots[starts].tolist(), starts.tolist(), ends.tolist()):
        sums[g] += values[a:b].sum(axis=0, dtype=np.uint64)
        counts[g] += (b - a) * per_row


def sample_blocks(total_blocks: int, n_cols: int, wpb: int, budget_bytes: int,
                  word_bytes: int) -> np.ndarray:
    """Evenly spread block indices whose words fit in `budget_bytes` (at least one block)."""
    per_block = n_cols * wpb * word_bytes
    k = max(1, min(total_blocks, budget_bytes // max(1, per_block)))
    if k >= total_blocks:
        return np.arange(total_blocks)
    return np.unique(np.linspace(0, total_blocks - 1, k).round().astype(np.int64))
