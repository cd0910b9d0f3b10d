"""Every predicate on packed words, written once: SWAR (SIMD within a register) tests that mark,
count or find fields without unpacking them.

A word of W bits holds W/bits fields (2, 4 or 8 bits: fields never straddle a word). With
L, 1s and H the low bits, the lowest bit and the top bit of every field (field_masks: 4-bit
uint32 0x77777777, 0x11111111, 0x88888888), a field's top bit after

    maxq_tops:      ((x & L) + 1s) & x & H     is set where the field is maxq
    nonzero_tops:   ((x & L) + L | x) & H      is set where the field is not 0

and neither sum can carry into the next field (the low bits of a field plus 1, or plus L,
reach at most its top bit). Words are taken 64 bits at a time where the rows allow
(superwords): one operation then tests 64/W words, and nothing crosses a word boundary
because every field, and so every word, keeps its own top bit.

Worked example, 4-bit int32: x = 0xF0F00FF7 holds fields (low first) 7, F, F, 0, 0, F, 0, F;
x & L = 0x70700777; maxq_tops gives (0x70700777 + 0x11111111) & x & H = 0x80800880 (fields 1,
2, 5 and 7 are 15); nonzero_tops gives (0x70700777 + 0x77777777 | x) & H = 0x80880888 (five
fields are not 0, so three are).

Whole-array passes run a chunk at a time (CHUNK elements), so their temporaries stay in cache:
over a whole tensor each pass would be bound by memory bandwidth.
"""
from __future__ import annotations

from functools import lru_cache
from typing import Any

import numpy as np
import numpy.typing as npt

from . import native
from .packing import UNSIGNED, block, constant_words, maxq, unsigned

Words = npt.NDArray[Any]

# Elements (words, superwords or cells) per step of a whole-array pass: a few temporaries of at
# most 8 bytes an element, 512 KiB each, stay in the L2 cache. The one chunk size of every pass
# over packed words, fields and cells (SWAR marks and counts, code sums, field comparisons).
CHUNK = 1 << 16


def superwords(u: Words) -> Words:
    """Unsigned words [G, n] as 64-bit superwords where the rows allow: one operation then
    handles 64/W words (SWAR code that never carries across a word boundary)."""
    w = u.dtype.itemsize * 8
    return u.view(np.uint64) if w < 64 and u.ndim == 2 and (u.shape[1] * w) % 64 == 0 else u


Mask = np.unsignedinteger[Any]


@lru_cache(maxsize=64)
def field_masks(bits: int, itemsize: int) -> tuple[Mask, Mask, Mask]:
    """(low bits, 1, top bit) of every `bits`-wide field of an unsigned integer of `itemsize`
    bytes, as that numpy type (4-bit uint32: 0x77777777, 0x11111111, 0x88888888)."""
    ut = UNSIGNED[itemsize * 8]

    def every(value: int) -> Mask:
        m: Mask = ut(sum(value << j for j in range(0, itemsize * 8, bits)))
        return m
    return every((1 << (bits - 1)) - 1), every(1), every(1 << (bits - 1))


@lru_cache(maxsize=16)
def word_tops(w: int, itemsize: int) -> Mask:
    """The top bit of every W-bit word in an unsigned integer of `itemsize` bytes."""
    m: Mask = UNSIGNED[itemsize * 8](sum(1 << j for j in range(w - 1, itemsize * 8, w)))
    return m


def rows_per_chunk(width: int, multiple: int = 1) -> int:
    """Rows of `width` elements per CHUNK (at least one; a multiple of `multiple` when there
    are that many)."""
    rows = max(1, CHUNK // max(1, width))
    return rows if rows < multiple else rows // multiple * multiple


# ---------------------------------------------------------------- the two field tests


def maxq_tops(x: Words, out: Words, low: Any, one: Any, top: Any) -> Words:
    """Each field's top bit in `out`: set where the field of `x` is maxq (see the module
    docstring); returns `out`."""
    np.bitwise_and(x, low, out=out)
    np.add(out, one, out=out)
    np.bitwise_and(out, x, out=out)
    np.bitwise_and(out, top, out=out)
    return out


def nonzero_tops(x: Words, out: Words, low: Any, top: Any, scratch: Words | None = None
                 ) -> Words:
    """Each field's top bit in `out`: set where the field of `x` is not 0 (see the module
    docstring). `out` may be `x` itself, which then needs `scratch` (an array like it; one is
    made when none is given). Returns `out`."""
    lows = out if out is not x else (np.empty_like(x) if scratch is None else scratch)
    np.bitwise_and(x, low, out=lows)
    np.add(lows, low, out=lows)      # carries into the top bit where a low bit is set
    np.bitwise_or(x, lows, out=out)
    np.bitwise_and(out, top, out=out)
    return out


def count_fields(marks: Words) -> int:
    """How many fields a mark array (top bits, from the tests here) marks."""
    return int(np.bitwise_count(marks).sum(dtype=np.uint64))


def fields_equal(qzeros: Words, bits: int, value: int) -> Words:
    """Per packed word, the top bit of each field set where the field equals `value`."""
    u = np.ascontiguousarray(unsigned(np.asarray(qzeros)))
    x = superwords(u)
    low, _, top = field_masks(bits, x.dtype.itemsize)
    t = np.bitwise_xor(x, constant_words(value, bits, 64 if x.dtype.itemsize == 8 else
                                         u.dtype.itemsize * 8)[0])
    t = nonzero_tops(t, t, low, top)
    return np.bitwise_xor(t, top, out=t).view(u.dtype)


def every_field(words: Words, bits: int, value: int) -> bool:
    """Whether every field of packed words [G, n] (packed along the last axis) equals `value`:
    the words compared with the repeating block of that value, the first row first (it
    refutes most tensors at once)."""
    w = words.dtype.itemsize * 8
    _, wpb = block(bits, w)
    u = unsigned(np.asarray(words))
    if u.size == 0 or u.shape[-1] % wpb:
        return False
    if u.flags.c_contiguous:
        # rows of whole blocks: the words are the block repeated, compared as bytes (a small
        # tensor in microseconds: tens of thousands of qzeros are asked this), the first row
        # first
        one, flat = _block_bytes(value, bits, u.dtype.str), u.reshape(-1)
        row = u.shape[-1] // wpb
        return one * row == flat[:row * wpb].tobytes() and \
            one * (u.size // wpb) == flat.tobytes()
    blocks = u.reshape(-1, wpb)
    const = constant_words(value, bits, w)
    head = blocks[:max(1, u.shape[-1] // wpb)]
    return bool(np.array_equal(head, np.broadcast_to(const, head.shape)) and
                np.array_equal(blocks, np.broadcast_to(const, blocks.shape)))


def field_bytes(value: int, bits: int, dtype: str, shape: tuple[int, ...]) -> bytes | None:
    """The bytes of the packed words of numpy `dtype` (its byte order included) and `shape`
    whose every field is `value`: every_field(w, bits, value) is w.tobytes() == this for
    words `w` of that dtype and shape. None where it is False for any such words (no words,
    or rows that are not whole blocks).

    Worked example: 4-bit value 7 in int32 words of shape (1, 2): 0x77777777 twice, the eight
    bytes 77 77 77 77 77 77 77 77."""
    d = np.dtype(dtype)
    _, wpb = block(bits, d.itemsize * 8)
    size = int(np.prod(shape, dtype=np.int64))
    if size == 0 or not shape or shape[-1] % wpb:
        return None
    return _block_bytes(value, bits, d.str) * (size // wpb)


@lru_cache(maxsize=256)
def _block_bytes(value: int, bits: int, dtype: str) -> bytes:
    """constant_words' block as the bytes of words of `dtype` (its byte order included)."""
    d = np.dtype(dtype)
    return constant_words(value, bits, d.itemsize * 8).astype(d).tobytes()


def has_field(words: Words, bits: int, value: int) -> bool:
    """Whether any field of packed words (2/4/8 bits) equals `value`, 0 or maxq: a few whole-
    array steps on 64-bit superwords, a chunk at a time, nothing counted, stopping at the first
    chunk that holds one."""
    if value not in (0, maxq(bits)):
        raise ValueError(f"has_field: {value} is neither 0 nor maxq at {bits} bits")
    found = native.has_field(words, bits, value != 0)   # the same test in one compiled pass
    if found is not None:
        return found
    u = np.ascontiguousarray(unsigned(np.asarray(words)))
    x = superwords(u).reshape(-1)
    low, one, top = field_masks(bits, x.dtype.itemsize)
    buf = np.empty(min(x.size, CHUNK), dtype=x.dtype)
    with np.errstate(over="ignore"):  # a field's carry stops at its own top bit
        for i in range(0, x.size, CHUNK):
            part = x[i:i + CHUNK]
            t = buf[:part.size]
            if value == 0:
                nonzero_tops(part, t, low, top)
                np.bitwise_xor(t, top, out=t)
            else:
                maxq_tops(part, t, low, one, top)
            if t.any():
                return True
    return False


# ---------------------------------------------------------------- carries across fields


def carried_fields(qzeros: Words, bits: int, add: bool) -> Words:
    """Per packed word, the top bit of each field set where adding (`add`) or subtracting 1
    in every field by one whole-word operation (word + 0x..1111 or word - 0x..1111) leaves
    another value than the same +1 or -1 done field by field: the fields a carry or borrow
    from the field below reached. 2/4/8 bits (fields never straddle a word).

    Field by field without crossing (L = low bits, H = top bit of every field):
    a + 1 = ((a & L) + 1s) ^ (a & H);  a - 1 = ((a | H) - 1s) ^ (~a & H).
    Worked example, 4-bit, fields (low first) [15, 3, 0, 8, 8, 8, 8, 8] = 0x88888030 + 0xF
    = 0x8888803F: + 0x11111111 = 0x99999150 (fields 0, 5, 1, 9, ...): the 15 carried into
    field 1, so field 1's top bit is set: 0x00000080."""
    if 32 % bits and bits != 8:
        raise ValueError(f"carried_fields: {bits}-bit fields straddle words")
    u = np.ascontiguousarray(unsigned(np.asarray(qzeros)))
    x = superwords(u)
    ends = word_tops(u.dtype.itemsize * 8, x.dtype.itemsize)
    low, one, top = field_masks(bits, x.dtype.itemsize)
    word, field = np.empty_like(x), np.empty_like(x)   # in place: two buffers, no temporaries
    with np.errstate(over="ignore"):
        # the whole words' +1s and -1s, lane by lane (a lane = one W-bit word): the same SWAR
        # step with the words' top bits, so nothing crosses from one word into the next
        if add:
            np.bitwise_and(x, ~ends, out=word)
            np.add(word, one, out=word)
            np.bitwise_xor(word, np.bitwise_and(x, ends), out=word)
            np.bitwise_and(x, low, out=field)
            np.add(field, one, out=field)
            np.bitwise_xor(field, np.bitwise_and(x, top), out=field)
        else:
            np.bitwise_or(x, ends, out=word)
            np.subtract(word, one, out=word)
            np.bitwise_xor(word, np.bitwise_and(np.invert(x), ends), out=word)
            np.bitwise_or(x, top, out=field)
            np.subtract(field, one, out=field)
            np.bitwise_xor(field, np.bitwise_and(np.invert(x), top), out=field)
    np.bitwise_xor(word, field, out=word)
    return nonzero_tops(word, word, low, top, field).view(u.dtype)


def count_marked(qzeros: Words, bits: int, carry: bool | None = None,
                 value: int | None = None, unless_carried: bool = False) -> int:
    """How many fields carried_fields(qzeros, bits, carry) marks, or fields_equal(qzeros,
    bits, value) (with `unless_carried`: those equal to `value` that the carry or borrow does
    not reach), a chunk of rows at a time: the same counts with the temporaries in cache."""
    u = np.asarray(qzeros)
    n = u.shape[1] if u.ndim == 2 else 1
    rows = rows_per_chunk(n)
    total = 0
    for r0 in range(0, u.shape[0], rows):
        part = u[r0:r0 + rows]
        moved = carried_fields(part, bits, carry) if carry is not None else None
        if value is None:
            assert moved is not None
            total += count_fields(moved)
            continue
        eq = fields_equal(part, bits, value)
        if unless_carried:
            assert moved is not None
            eq &= ~moved
        total += count_fields(eq)
    return total


def marked(marks: Words, bits: int, flat: npt.ArrayLike, columns: int) -> npt.NDArray[np.bool_]:
    """Whether the fields at flat indices g * columns + n of [G, columns] are marked."""
    fpw = marks.dtype.itemsize * 8 // bits
    g, n = np.divmod(np.asarray(flat, dtype=np.int64), columns)
    shift = (n % fpw) * bits + bits - 1
    bits_at: npt.NDArray[np.bool_] = \
        ((marks[g, n // fpw] >> shift.astype(marks.dtype)) & 1).astype(bool)
    return bits_at


# ---------------------------------------------------------------- counts over whole tensors


def maxq_zero_counts(u: Words, bits: int) -> tuple[int, int]:
    """(fields at maxq, fields at 0) of unsigned words u [G, n], a chunk of rows at a time."""
    x = superwords(u)
    ut = x.dtype.type
    low, one, top = field_masks(bits, x.dtype.itemsize)
    g, nx = x.shape
    rows = rows_per_chunk(nx)
    at, nz = (np.empty((min(rows, g), nx), ut) for _ in range(2))
    cnt = np.empty((min(rows, g), nx), np.uint8)
    maxq_fields = nonzero = 0
    for r0 in range(0, g, rows):
        xs = x[r0:r0 + rows]
        n = len(xs)
        a, o, c = at[:n], nz[:n], cnt[:n]
        maxq_tops(xs, a, low, one, top)
        nonzero_tops(xs, o, low, top)
        maxq_fields += int(np.add.reduce(np.bitwise_count(a, out=c), axis=None, dtype=np.uint64))
        nonzero += int(np.add.reduce(np.bitwise_count(o, out=c), axis=None, dtype=np.uint64))
    return maxq_fields, u.size * (u.dtype.itemsize * 8 // bits) - nonzero


def top_runs(u: Words, bits: int, run: int) -> int:
    """Words of u [G, n] whose top `run` fields are all maxq: their top r = run*bits bits all
    set, which for an unsigned word is word >= 2^W - 2^(W-r) (4-bit int32: >= 0xFFFF0000), one
    comparison per word."""
    w = u.dtype.itemsize * 8
    r = run * bits
    return int(np.count_nonzero(u >= u.dtype.type((1 << w) - (1 << (w - r)))))


def maxq_by_group_and_run_column(u: Words, bits: int, run: int
                                 ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(maxq fields of each group [G], groups storing maxq at each of the top `run` fields of
    each word [n words, run]) of unsigned words u [G, n]."""
    x = superwords(u)
    ut = x.dtype.type
    w, sw = u.dtype.itemsize * 8, x.dtype.itemsize * 8
    k, fpw = sw // w, w // bits
    low, one, top = field_masks(bits, x.dtype.itemsize)
    g, nx = x.shape
    per_lane = maxq(bits)      # rows whose 0/1 fields can be summed without a carry
    # chunks of whole partial sums (a partial sum's lanes are taken apart in Python steps)
    rows = rows_per_chunk(nx, per_lane)
    at = np.empty((min(rows, g), nx), ut)
    cnt = np.empty((min(rows, g), nx), np.uint8)
    grp = np.empty(g, np.int64)
    cols = np.zeros((nx, k, run), np.uint64)
    for r0 in range(0, g, rows):
        xs = x[r0:r0 + rows]
        n = len(xs)
        a, c = at[:n], cnt[:n]
        maxq_tops(xs, a, low, one, top)
        grp[r0:r0 + n] = np.add.reduce(np.bitwise_count(a, out=c), axis=1, dtype=np.uint32)
        np.right_shift(a, ut(bits - 1), out=a)   # 0/1 in each field's low bit
        for p0 in range(0, n, per_lane):          # column counts at the run's fields
            lane_sums = np.add.reduce(a[p0:p0 + per_lane], axis=0)
            for i in range(k):
                for jj in range(run):
                    cols[:, i, jj] += (lane_sums >> ut(i * w + (fpw - run + jj) * bits)) & \
                        ut(per_lane)
    return grp, cols.reshape(-1, run).astype(np.int64)


__all__ = ["CHUNK", "carried_fields", "count_fields", "count_marked", "every_field",
           "field_masks", "fields_equal", "has_field", "marked", "maxq_by_group_and_run_column",
           "maxq_tops", "maxq_zero_counts", "nonzero_tops", "rows_per_chunk", "superwords",
           "top_runs", "word_tops"]
