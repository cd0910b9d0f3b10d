"""Per-cell code sums from packed qweight: the raw material of zero-point detection.

A cell is (group g, output column n). For each cell we need the sum of its codes and how many
codes were summed; mean(code) - stored zero then tells the convention (see detect.py).

Two paths, both exact integer sums:
- group-contiguous rows (no act-order, group_size a multiple of the values per word): the fields
  of one word all belong to one group. Whole groups (verify) go through group_sums: a mask and
  two sums per word (even fields, and the words themselves), the lanes folded only in the few
  partial sums; a sample's scattered rows (inspect) and 64-bit words are reduced word by word
  (word_field_sums) and summed per group;
- act-order (g_idx arbitrary): over all rows (verify), channel_sorted_sums gathers each
  channel's byte of the bit stream in group order and sums runs; over a sample (inspect), per
  field position j, the j-th field of every word is extracted and its rows summed by group
  after sorting rows by g_idx.
Work runs over chunks of rows so that temporaries stay small (and in cache).
Over every row of 2-, 4- and 8-bit words, the compiled loops of kernels/gptq_sums.h
(bits/native.py) take both cases where the install built them: one pass over the words.
"""
from __future__ import annotations

import numpy as np

from ..bits import native, unique
from ..bits.packing import UNSIGNED, block, maxq, unpack
from ..bits.swar import CHUNK


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


def group_sums(words: np.ndarray, bits: int, rows_per_group: int) -> np.ndarray:
    """Per group of `rows_per_group` consecutive packed rows and per column, the sum of every
    field: [R / rows_per_group, N] uint64 from words [R, N] (2/4/8 bits, words of at most 32
    bits and at least two fields).

    Two sums per word, and no per-word fold: with E the even fields of a word (x & 0x0F0F0F0F
    at 4 bits, each in a lane of 2 * bits) and O its odd ones, x = E + 2^bits * O. Over a run
    of rows short enough that no lane of the sum of E overflows (4-bit: 17 rows of at most 15),
    sum(O) = (sum(x) - sum(E)) >> bits, with sum(x) taken in uint64: one mask and two sums per
    word. The lanes of the few partial sums are then folded into one sum each, and the runs of
    a group added in uint64.
    Worked example, 4-bit int32, one group of two rows, words 0x11111111 and 0xFFFFFFFF: E sums
    to 0x01010101 + 0x0F0F0F0F = 0x10101010, x to 0x111111110, so O sums to (0x111111110 -
    0x10101010) >> 4 = 0x10101010; each folds to 4 x 16 = 64, 128 in all = 8 x 1 + 8 x 15."""
    w_bits = words.dtype.itemsize * 8
    if not 2 * bits <= w_bits <= 32:
        raise ValueError(f"group_sums: {bits}-bit fields in {w_bits}-bit words (the even "
                         "fields need lanes of twice their width, the sums of 64-bit words "
                         "do not fit uint64)")
    ut = UNSIGNED[w_bits]
    rows, n = words.shape
    x = words.view(ut)
    limit = ((1 << (2 * bits)) - 1) // maxq(bits)  # rows whose even fields fit a lane
    run = max(d for d in range(1, min(rows_per_group, limit) + 1) if rows_per_group % d == 0)
    even = np.bitwise_and(x, ut(_lane_mask(bits, w_bits)))
    runs = (rows // run, run, n)
    s_even = even.reshape(runs).sum(axis=1, dtype=ut)
    s_odd = x.reshape(runs).sum(axis=1, dtype=np.uint64)
    s_odd -= s_even
    s_odd >>= np.uint64(bits)
    s_odd = s_odd.astype(ut)
    width = 2 * bits
    while width < w_bits:
        s_even = _fold(s_even, width, w_bits)
        s_odd = _fold(s_odd, width, w_bits)
        width *= 2
    total = s_even.astype(np.uint64)
    total += s_odd
    return total.reshape(rows // rows_per_group, rows_per_group // run, n).sum(axis=1)


SORTED_BLOCK_BYTES = 4 << 20  # bytes of codes per column block of channel_sorted_sums


def channel_sorted_sums(qweight: np.ndarray, bits: int, g_idx: np.ndarray,
                        groups: int) -> np.ndarray:
    """Per group and column the sum of the codes of every input channel, for any g_idx
    (act-order): [groups, N] uint64 from qweight [K*bits/W, N] (2/4/8 bits).

    A column's packed words are one little-endian bit stream, so channel c sits in byte
    c // (8 / bits) of it, at bit (c % (8 / bits)) * bits. A block of columns is turned into
    byte rows (the words' bytes transposed to rows), the byte row of every channel gathered in
    order of its group (channels sorted by g_idx: each group a run of rows), the field shifted
    down and masked per row, and each run summed. Codes are never unpacked in channel order
    first.
    Worked example, 4-bit, one int32 word 0x76543210 (channels 0..7 hold 0..7), g_idx
    [1, 0, 1, 0, 1, 0, 1, 0]: byte rows 0x10, 0x32, 0x54, 0x76; group 0 gathers channels 1, 3,
    5, 7 (byte rows 0, 1, 2, 3, shifted by 4): 1 + 3 + 5 + 7 = 16; group 1: 0 + 2 + 4 + 6."""
    per_byte = 8 // bits
    k = len(g_idx)
    n = qweight.shape[1]
    nbytes = qweight.dtype.itemsize
    order = np.argsort(g_idx, kind="stable")
    byte_row = order // per_byte
    shift = ((order % per_byte) * bits).astype(np.uint8)[:, None]
    sizes = np.bincount(g_idx, minlength=groups)
    equal = bool(np.all(sizes == sizes[0]))
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    wide = np.uint16 if int(sizes.max(initial=0)) * maxq(bits) < 1 << 16 else np.uint32
    sums = np.zeros((groups, n), dtype=np.uint64)
    cols = max(8, SORTED_BLOCK_BYTES // max(1, k))
    rows = qweight.shape[0]
    for c0 in range(0, n, cols):
        b = qweight[:, c0:c0 + cols].view(np.uint8).reshape(rows, -1, nbytes)
        stream = np.ascontiguousarray(b.transpose(0, 2, 1)).reshape(rows * nbytes, -1)
        codes = stream[byte_row]
        codes >>= shift
        codes &= np.uint8(maxq(bits))
        if equal and sizes[0]:
            part = codes.reshape(groups, int(sizes[0]), -1).sum(axis=1, dtype=wide)
        else:
            nonempty = sizes > 0
            part = np.zeros((groups, codes.shape[1]), dtype=np.uint32)
            part[nonempty] = np.add.reduceat(codes, starts[nonempty], axis=0,
                                             dtype=np.uint32)
        sums[:, c0:c0 + cols] = part
    return sums


def _fold(x: np.ndarray, width: int, w_bits: int) -> np.ndarray:
    """Neighbouring `width`-bit lanes of `x` (a temporary: changed in place) added into
    2*width-bit lanes."""
    mask = UNSIGNED[w_bits](_lane_mask(width, w_bits))
    t = x >> UNSIGNED[w_bits](width)
    t &= mask
    x &= mask
    x += t
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
    if row_blocks is None:  # every row: the compiled loops where the install built them
        compiled = native.cell_sums(qweight, bits, g_idx, groups, trivial_rpg)
        if compiled is not None:
            return np.arange(groups), *compiled
    if row_blocks is None and trivial_rpg is None and bits != 3 and np.little_endian and \
            qweight.dtype.isnative and len(g_idx) == qweight.shape[0] * vpb // wpb:
        counts = np.bincount(g_idx, minlength=groups).astype(np.int64)
        return np.arange(groups), channel_sorted_sums(qweight, bits, g_idx, groups), counts
    step = max(1, CHUNK // max(1, n * wpb))
    if trivial_rpg and row_blocks is None and trivial_rpg % wpb == 0:
        per = trivial_rpg // wpb  # whole groups per chunk, so group_sums takes them
        step = max(per, step // per * per)
    blocks = None if row_blocks is None else np.asarray(row_blocks, dtype=np.int64)
    if blocks is None:
        read = np.arange(groups)
    else:  # the groups the blocks' values fall in
        chans = (blocks[:, None] * vpb + np.arange(vpb)).reshape(-1)
        read = unique(g_idx[chans]) if trivial_rpg is None else \
            unique(blocks * wpb // trivial_rpg)
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
        if trivial_rpg and blocks is None and words.shape[0] % trivial_rpg == 0 and \
                b0 * wpb % trivial_rpg == 0 and 2 * bits <= words_bits <= 32:  # whole groups
            g0 = b0 * wpb // trivial_rpg
            got = group_sums(words, bits, trivial_rpg)
            sums[g0:g0 + len(got)] += got
            counts[g0:g0 + len(got)] += trivial_rpg * (vpb // wpb)
        elif trivial_rpg:
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
    return unique(np.linspace(0, total_blocks - 1, k).round().astype(np.int64))
