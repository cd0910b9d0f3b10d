"""The zero-point conventions, in one place: what each stores for a zero point Z, what a zero
rule (how a runtime reads a stored field) makes of it, and how fields move between conventions.

    gptq     (v1) stores Z - 1: AutoGPTQ's packer, GPTQModel's `gptq` format. Z = 0 cannot be
             stored; masked writers leave maxq there, which runtimes read as 2^bits or 0.
    gptq_v2       stores Z itself: GPTQModel's internal format; every Z in [0, maxq] fits.

Worked example, 4-bit: Z = 8 is stored as 7 (gptq) or 8 (gptq_v2); Z = 0 is stored as 15 by a
masked gptq writer, which vLLM's gptq_gemm reads as Z = 16 and AutoGPTQ's exllama kernels as 0.

Adding a convention is one entry here (its name, its symmetric field, its rule under each
runtime, its conversion to the others) plus its tests; runtimes.py says which rule each runtime
applies.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, IntEnum
from functools import lru_cache

import numpy as np

from .errors import GptqfmtError
from .gptq.packing import (UNSIGNED, constant_words, field_masks, maxq, pack, superwords,
                           unpack, unsigned)

GPTQ, GPTQ_V2 = "gptq", "gptq_v2"
# Each convention as data: what it adds to a stored field to give Z (Z = s + offset). Everything
# below follows from it: the symmetric field, the conversion between two conventions and the
# fields it cannot carry, and (runtimes.py) the rule a runtime applies to a file.
STORED_OFFSET = {GPTQ: 1, GPTQ_V2: 0}
CONVENTIONS = tuple(STORED_OFFSET)


class ZeroRule(IntEnum):
    """How a runtime turns a stored field s into Z. Names and values are the kernel's
    (GQ_ZERO_V2, GQ_ZERO_V1_NOWRAP, GQ_ZERO_V1_WRAP in kernels/gptq_dequant.h)."""
    V2 = 0         # Z = s: every runtime on gptq_v2 files
    V1_NOWRAP = 1  # Z = s + 1, a stored maxq read as 2^bits (vLLM gptq_gemm, ExLlamaV2)
    V1_WRAP = 2    # Z = (s + 1) mod 2^bits, a stored maxq read as 0 (AutoGPTQ exllama, TGI)


class Reading(Enum):
    """How one runtime path turns a module's qzeros into Z: a field rule the kernel shares
    (`rule`), packed-word arithmetic that crosses fields, or no reading at all.

    Worked example, 4-bit, one int32 word of fields (LSB first) [15, 3, 0, 8, ...]:
      V1_NOWRAP  [16, 4, 1, 9]  s + 1
      V1_WRAP    [0, 4, 1, 9]   (s + 1) & 15
      V1_CARRY   [0, 5, 1, 9]   word + 0x11111111: the 15 carries into the next field
      V1_NIBBLE  [0, 4, 1, 9]   ((s & 15) + 1) & 15 (at 8 bits: Z mod 16, AutoGPTQ's bug)
      V2         [15, 3, 0, 8]  s
      V2_BORROW  [15, 3, 16, 7] word - 0x11111111 (the 0 borrows from the next field), + 1
      SYMMETRIC  [8, 8, 8, 8]   qzeros never read (Marlin's uint4b8 type)
    """
    V2 = "v2"                # Z = s
    V1_NOWRAP = "v1"         # Z = s + 1; a stored maxq is 2^bits
    V1_WRAP = "v1-wrap"      # Z = (s + 1) mod 2^bits; a stored maxq is 0
    V1_CARRY = "v1-carry"    # GPTQModel's v1 -> v2 at load: word + 0x..1111, carries cross fields
    V2_BORROW = "v2-borrow"  # ExLlamaV2 on gptq_v2: word - 0x..1111 (borrows), then Z = s' + 1
    V1_NIBBLE = "v1-nibble"  # AutoGPTQ's CUDA extension: ((s & maxq) + 1) & 15, at any bits
    SYMMETRIC = "symmetric"  # qzeros not read: Z = 2^(bits-1)

    @property
    def rule(self) -> ZeroRule | None:
        """The kernel's field rule for this reading, None where it is not field by field."""
        return {Reading.V2: ZeroRule.V2, Reading.V1_NOWRAP: ZeroRule.V1_NOWRAP,
                Reading.V1_WRAP: ZeroRule.V1_WRAP}.get(self)


def read_zeros(qzeros: np.ndarray, bits: int, reading: Reading) -> np.ndarray:
    """Z per cell (int32, [G, N]) as a runtime reading computes it from packed qzeros [G, W'].

    The word readings emulate the runtimes' arithmetic on the unsigned words, modulo 2^W: a
    carry or borrow out of a field moves into the next field of the same word and is lost at
    the top of the word (3-bit fields straddle words, so a carry crosses words there as the
    runtimes' per-word additions do not: no 3-bit word reading is modelled; ValueError)."""
    words = np.asarray(qzeros)
    if reading is Reading.SYMMETRIC:
        g, nw = words.shape
        n = nw * words.dtype.itemsize * 8 // bits
        return np.full((g, n), 1 << (bits - 1), dtype=np.int32)
    if reading.rule is not None:
        return effective_zeros(unpack(words, bits, axis=1), bits, reading.rule)
    if reading is Reading.V1_NIBBLE:  # a 4-bit mask whatever the bits (AutoGPTQ 0.7.1)
        return (unpack(words, bits, axis=1).astype(np.int32) + 1) & 0x0F
    if bits == 3:
        raise ValueError(f"{reading.name}: no 3-bit word arithmetic is modelled")
    w = words.dtype.itemsize * 8
    u = unsigned(words)
    one = constant_words(1, bits, w)[0]
    with np.errstate(over="ignore"):
        moved = u + one if reading is Reading.V1_CARRY else u - one
    fields = unpack(moved.astype(UNSIGNED[w]), bits, axis=1).astype(np.int32)
    return fields if reading is Reading.V1_CARRY else fields + 1


def carried_fields(qzeros: np.ndarray, bits: int, reading: Reading) -> np.ndarray:
    """Per packed word, the top bit of each field set where the reading's word arithmetic
    (V1_CARRY: word + 0x..1111; V2_BORROW: word - 0x..1111) leaves another value than the same
    +1 or -1 done field by field: the fields a carry or borrow from the field below reached.
    2/4/8 bits (fields never straddle a word).

    Field by field without crossing (SWAR, L = low bits, H = top bit of every field):
    a + 1 = ((a & L) + 1s) ^ (a & H);  a - 1 = ((a | H) - 1s) ^ (~a & H).
    Worked example, 4-bit, fields (low first) [15, 3, 0, 8, 8, 8, 8, 8] = 0x88888030 + 0xF
    = 0x8888803F: + 0x11111111 = 0x99999150 (fields 0, 5, 1, 9, ...): the 15 carried into
    field 1, so field 1's top bit is set: 0x00000080."""
    if reading not in (Reading.V1_CARRY, Reading.V2_BORROW) or 32 % bits and bits != 8:
        raise ValueError(f"carried_fields: {reading} at {bits} bits is not a word reading")
    u = np.ascontiguousarray(unsigned(np.asarray(qzeros)))
    x = superwords(u)
    ends = _word_tops(u.dtype.itemsize * 8, x.dtype.type)
    low, one, top = field_masks(bits, x.dtype.type)
    word, field = np.empty_like(x), np.empty_like(x)   # in place: two buffers, no temporaries
    with np.errstate(over="ignore"):
        # the whole words' +1s and -1s, lane by lane (a lane = one W-bit word): the same SWAR
        # step with the words' top bits, so nothing crosses from one word into the next
        if reading is Reading.V1_CARRY:
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
    return _nonzero_tops(word, low, top, field).view(u.dtype)


@lru_cache(maxsize=16)
def _word_tops(w: int, ut) -> np.generic:
    """The top bit of every W-bit word in an unsigned integer of type `ut`."""
    return ut(sum(1 << j for j in range(w - 1, np.dtype(ut).itemsize * 8, w)))


def _nonzero_tops(t: np.ndarray, low, top, buf: np.ndarray) -> np.ndarray:
    """The top bit of each field of `t` set where the field is not 0 (in place: t and buf are
    overwritten; returns t)."""
    np.bitwise_and(t, low, out=buf)
    np.add(buf, low, out=buf)          # carries into the top bit where a low bit is set
    np.bitwise_or(t, buf, out=t)
    np.bitwise_and(t, top, out=t)
    return t


def fields_equal(qzeros: np.ndarray, bits: int, value: int) -> np.ndarray:
    """Per packed word, the top bit of each field set where the field equals `value`."""
    u = np.ascontiguousarray(unsigned(np.asarray(qzeros)))
    x = superwords(u)
    low, _, top = field_masks(bits, x.dtype.type)
    t = np.bitwise_xor(x, constant_words(value, bits, 64 if x.dtype.itemsize == 8 else
                                         u.dtype.itemsize * 8)[0])
    t = _nonzero_tops(t, low, top, np.empty_like(t))
    return np.bitwise_xor(t, top, out=t).view(u.dtype)


MARK_CHUNK = 1 << 15   # words per chunk of count_marked (its temporaries stay in cache)


def count_marked(qzeros: np.ndarray, bits: int, reading: Reading | None = None,
                 value: int | None = None, unless_carried: bool = False) -> int:
    """How many fields carried_fields(qzeros, bits, reading) marks, or fields_equal(qzeros,
    bits, value) (with `unless_carried`: those equal to `value` that the reading's carry or
    borrow does not reach), a chunk of rows at a time: the same counts with the temporaries in
    cache, where whole-tensor passes are bound by memory bandwidth."""
    u = np.asarray(qzeros)
    n = u.shape[1] if u.ndim == 2 else 1
    rows = max(1, MARK_CHUNK // max(1, n))
    total = 0
    for r0 in range(0, u.shape[0], rows):
        part = u[r0:r0 + rows]
        moved = carried_fields(part, bits, reading) if reading is not None else None
        if value is None:
            total += count_fields(moved)
            continue
        eq = fields_equal(part, bits, value)
        if unless_carried:
            eq &= ~moved
        total += count_fields(eq)
    return total


def count_fields(marks: np.ndarray) -> int:
    """How many fields a mark array (top bits, from carried_fields or fields_equal) marks."""
    return int(np.bitwise_count(marks).sum(dtype=np.uint64))


def marked(marks: np.ndarray, bits: int, flat: np.ndarray, columns: int) -> np.ndarray:
    """Whether the fields at flat indices g * columns + n of [G, columns] are marked."""
    fpw = marks.dtype.itemsize * 8 // bits
    g, n = np.divmod(np.asarray(flat, dtype=np.int64), columns)
    shift = (n % fpw) * bits + bits - 1
    return ((marks[g, n // fpw] >> shift.astype(marks.dtype)) & 1).astype(bool)


def check(convention: str) -> str:
    """`convention` when it is one; ValueError naming the known ones otherwise."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention {convention!r}: expected one of {CONVENTIONS}")
    return convention


def sym_field(bits: int, convention: str) -> int:
    """The stored field of the symmetric zero point Z = 2^(bits-1) under `convention`
    (4-bit: 7 for gptq, 8 for gptq_v2)."""
    return (1 << (bits - 1)) - STORED_OFFSET[check(convention)]


def effective_zeros(stored: np.ndarray, bits: int, rule: ZeroRule) -> np.ndarray:
    """Z per field (int32) from stored fields under a zero rule."""
    z = stored.astype(np.int32)
    if rule == ZeroRule.V1_NOWRAP:
        return z + 1
    if rule == ZeroRule.V1_WRAP:
        return (z + 1) & maxq(bits)
    return z


def shift(src: str, dst: str) -> int:
    """What moving a field from `src` to `dst` adds to it (gptq -> gptq_v2: +1)."""
    return STORED_OFFSET[check(src)] - STORED_OFFSET[check(dst)]


def lossy_mask(stored: np.ndarray, bits: int, src: str, dst: str) -> np.ndarray | None:
    """The fields that `dst` cannot hold exactly when moved from `src` (None: every field
    moves exactly): those the shift takes out of [0, maxq]. gptq -> gptq_v2: a stored maxq
    (runtimes disagree on its Z); gptq_v2 -> gptq: a Z of 0 (gptq has no field for it)."""
    d = shift(src, dst)
    if d == 0:
        return None
    return stored > maxq(bits) - d if d > 0 else stored < -d


class NotRepresentable(GptqfmtError, ValueError):
    """Fields that the target convention cannot hold exactly (and allow_lossy was not given).

    A finding-class outcome, so exit 1 like any finding; still a ValueError for callers that
    caught it as one."""

    exit_code = 1

    def __init__(self, message: str, count: int):
        super().__init__(message)
        self.count = count

    def __reduce__(self):
        return (type(self), (str(self), self.count))


@dataclass(frozen=True)
class FieldChanges:
    fields: int
    changed: int       # fields whose stored value differs
    ambiguous: int     # gptq stored maxq (gptq -> gptq_v2)
    lossy: int         # gptq_v2 Z = 0 (gptq_v2 -> gptq)


def convert_fields(stored: np.ndarray, bits: int, src: str, dst: str,
                   allow_lossy: bool = False) -> tuple[np.ndarray, FieldChanges]:
    """New stored fields (uint8, same shape) for `dst`, from fields stored under `src`, field
    by field (never packed-word arithmetic: subtracting 0x11111111 from a word borrows across
    fields).

    gptq -> gptq_v2: Z = s + 1, exact for s in [0, maxq - 1]; a stored maxq is ambiguous (a
    masked writer's Z = 0, AutoGPTQ's sign-extension garbage, or a GPTQModel borrow) and is only
    converted with allow_lossy, to Z = 0 (the wrap reading). gptq_v2 -> gptq: s = Z - 1, exact
    for Z >= 1; Z = 0 has no gptq encoding and with allow_lossy is written as s = 0 (read as
    Z = 1 by every runtime: each weight of that group moves by one scale step)."""
    top = maxq(bits)
    s = np.asarray(stored).astype(np.int16)
    if s.size and (s.min() < 0 or s.max() > top):
        raise ValueError(f"stored field out of range [0, {top}] for bits={bits}")
    lossy_at = lossy_mask(s, bits, src, dst)
    n_lossy = 0 if lossy_at is None else int(lossy_at.sum())
    if n_lossy and not allow_lossy:
        if shift(src, dst) > 0:
            raise NotRepresentable(f"{n_lossy} {src} fields store {top}, which runtimes read as "
                                   f"Z = {top + 1} or Z = 0", n_lossy)
        raise NotRepresentable(f"{n_lossy} {src} zero points are 0, which {dst} cannot store",
                               n_lossy)
    if lossy_at is None:
        out = s
    else:  # both lossy cases are written as 0
        out = np.where(lossy_at, 0, s + shift(src, dst))
    out = out.astype(np.uint8)
    # past maxq: a stored maxq whose Z runtimes disagree on; below 0: a Z the target cannot hold
    ambiguous, lossy = (n_lossy, 0) if shift(src, dst) > 0 else (0, n_lossy)
    return out, FieldChanges(int(s.size), int(np.count_nonzero(out != s)), ambiguous, lossy)


def has_field(words: np.ndarray, bits: int, value: int) -> bool:
    """Whether any field of packed words (2/4/8 bits) equals `value`, 0 or maxq: four whole-
    array steps on 64-bit superwords, a chunk at a time, nothing counted.

    A field is maxq exactly when its low bits are all set (adding 1 to them carries into the
    field's top bit) and its top bit is set: ((x & 0x77777777) + 0x11111111) & x & 0x88888888
    at 4 bits. A field is 0 exactly when it is maxq in ~x."""
    if value not in (0, maxq(bits)):
        raise ValueError(f"has_field: {value} is neither 0 nor maxq at {bits} bits")
    u = np.ascontiguousarray(unsigned(np.asarray(words)))
    x = superwords(u).reshape(-1)
    low, one, top = field_masks(bits, x.dtype.type)
    buf = np.empty(min(x.size, MARK_CHUNK), dtype=x.dtype)
    with np.errstate(over="ignore"):  # a field's carry stops at its own top bit
        for i in range(0, x.size, MARK_CHUNK):
            part = x[i:i + MARK_CHUNK]
            t = buf[:part.size]
            if value == 0:
                np.invert(part, out=t)
                c = np.bitwise_and(t, low)
                c += one
                t &= c
            else:
                np.bitwise_and(part, low, out=t)
                t += one
                t &= part
            t &= top
            if t.any():
                return True
    return False


def moved_words(words: np.ndarray, bits: int, src: str, dst: str,
                checked: bool = False) -> np.ndarray | None:
    """The packed qzeros words `dst` stores for `words` stored under `src`, by one addition per
    word, when that equals convert_fields field by field; None otherwise (then move the fields
    one by one).

    Adding the shift to every field at once (4-bit +1: word + 0x11111111) is exact when no
    field is one the shift takes out of [0, maxq]: then no carry or borrow crosses into the
    next field (the word readings V1_CARRY and V2_BORROW are what happens when one does). It
    needs fields that never straddle a word (2, 4, 8 bits) and no lossy field (lossy_mask
    empty, checked word by word with fields_equal, nothing unpacked).

    Worked example, 4-bit gptq -> gptq_v2, fields (low first) [7, 3, 0, 8, 8, 8, 8, 8] =
    0x88888037: no field is 15, so + 0x11111111 = 0x99999148, fields [8, 4, 1, 9, ...]; with
    a 15 in field 0 (0x8888803F) the word is not moved here (convert_fields decides it).

    `checked`: the caller has found no lossy field in these very words (a has_field already
    run on them), so the check is not run again."""
    d = shift(src, dst)
    u = unsigned(np.asarray(words))
    if d == 0:
        return u.copy().view(words.dtype)
    if not word_path(u, bits, src, dst, checked):
        return None
    one = constant_words(1, bits, u.dtype.itemsize * 8)[0]
    with np.errstate(over="ignore"):  # the top field never carries out: checked above
        out = u + one if d > 0 else u - one
    return out.astype(u.dtype, copy=False).view(words.dtype)


def word_path(words: np.ndarray, bits: int, src: str, dst: str,
              checked: bool = False) -> bool:
    """Whether moving `words` from `src` to `dst` is one addition per word (moved_words): no
    shift at all, or fields that never straddle a word (2, 4, 8 bits) of which none is lossy
    (has_field, skipped when the caller `checked` these very words already)."""
    d = shift(src, dst)
    if d == 0:
        return True
    return bits in (2, 4, 8) and (checked or not has_field(words, bits,
                                                             maxq(bits) if d > 0 else 0))


def words_moved(w_src: np.ndarray, w_dst: np.ndarray, bits: int, src: str, dst: str) -> bool:
    """Whether `w_dst` holds every field of `w_src` moved by shift(src, dst), for words on the
    word path (word_path true: no lossy field, so nothing carries). Checked as a difference of
    whole words, w_dst - w_src (or w_src - w_dst) equal to 1 in every field (field_masks), not
    by redoing moved_words' addition, so a wrong move is caught rather than repeated."""
    a, b = unsigned(np.asarray(w_src)), unsigned(np.asarray(w_dst))
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    d = shift(src, dst)
    if d == 0:
        return bool(np.array_equal(a, b))
    _, one, _ = field_masks(bits, a.dtype.type)
    with np.errstate(over="ignore"):
        diff = b - a if d > 0 else a - b
    return bool(np.all(diff == one))


def convert_words(words: np.ndarray, bits: int, src: str, dst: str,
                  allow_lossy: bool = False, checked: bool = False
                  ) -> tuple[np.ndarray, FieldChanges]:
    """convert_fields on packed qzeros words [G, W'] (packed along axis 1): new words of the
    same dtype and what changed. One addition per word (moved_words) where no field is lossy,
    which is every clean checkpoint; field by field otherwise (and at 3 bits). `checked`: as
    moved_words'."""
    words = np.asarray(words)
    fields = words.size * words.dtype.itemsize * 8 // bits
    moved = moved_words(words, bits, src, dst, checked)
    if moved is not None:
        return moved, FieldChanges(fields, 0 if shift(src, dst) == 0 else fields, 0, 0)
    new, changes = convert_fields(unpack(words, bits, axis=1), bits, src, dst, allow_lossy)
    return pack(new, bits, words.dtype.itemsize * 8, axis=1), changes
