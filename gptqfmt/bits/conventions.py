"""The zero-point conventions, in one place: what each stores for a zero point Z, what a zero
rule (how a kernel reads a stored field) makes of it, and how fields move between conventions.

    gptq     (v1) stores Z - 1: AutoGPTQ's packer, GPTQModel's `gptq` format. Z = 0 cannot be
             stored; masked writers leave maxq there, which runtimes read as 2^bits or 0.
    gptq_v2       stores Z itself: GPTQModel's internal format; every Z in [0, maxq] fits.

Worked example, 4-bit: Z = 8 is stored as 7 (gptq) or 8 (gptq_v2); Z = 0 is stored as 15 by a
masked gptq writer, which vLLM's gptq_gemm reads as Z = 16 and AutoGPTQ's exllama kernels as 0.

Adding a convention is one entry in STORED_OFFSET (everything else here follows from it) plus
its tests; the runtime table (gptqfmt/runtimes/) says which rule each runtime applies.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache

import numpy as np

from ..errors import NotRepresentable
from . import Array, native
from .packing import constant_words, maxq, pack, unpack, unsigned
from .swar import every_field, field_bytes, field_masks, has_field

GPTQ, GPTQ_V2 = "gptq", "gptq_v2"
# Each convention as data: what it adds to a stored field to give Z (Z = s + offset). Everything
# below follows from it: the symmetric field, the conversion between two conventions and the
# fields it cannot carry, and the rule a kernel applies to a file in it.
STORED_OFFSET = {GPTQ: 1, GPTQ_V2: 0}
CONVENTIONS = tuple(STORED_OFFSET)


class ZeroRule(IntEnum):
    """How a kernel turns a stored field s into Z. Names and values are the kernel's
    (GQ_ZERO_V2, GQ_ZERO_V1_NOWRAP, GQ_ZERO_V1_WRAP in kernels/gptq_dequant.h)."""
    V2 = 0         # Z = s: every runtime on gptq_v2 files
    V1_NOWRAP = 1  # Z = s + 1, a stored maxq read as 2^bits (vLLM gptq_gemm, ExLlamaV2)
    V1_WRAP = 2    # Z = (s + 1) mod 2^bits, a stored maxq read as 0 (AutoGPTQ exllama, TGI)


# The reading that checks and conversions apply when they need one: vLLM's gptq_gemm, which
# reads a gptq field as s + 1 without a wrap (a stored maxq is 2^bits) and a gptq_v2 field as
# s. The runtime table holds it as one of its readings (tests/unit/test_groups.py).
REFERENCE = ZeroRule.V1_NOWRAP


def rule_for(convention: str, gptq_rule: ZeroRule) -> ZeroRule:
    """The rule a reader whose rule for gptq fields is `gptq_rule` applies to a file stored in
    `convention`: a field that stores Z itself is read as it is by every reader."""
    return ZeroRule.V2 if STORED_OFFSET[check(convention)] == 0 else gptq_rule


def reference_rule(convention: str) -> ZeroRule:
    """The REFERENCE reading of a file stored in `convention`."""
    return rule_for(convention, REFERENCE)


def check(convention: str) -> str:
    """`convention` when it is one; ValueError naming the known ones otherwise."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention {convention!r}: expected one of {CONVENTIONS}")
    return convention


def sym_field(bits: int, convention: str) -> int:
    """The stored field of the symmetric zero point Z = 2^(bits-1) under `convention`
    (4-bit: 7 for gptq, 8 for gptq_v2)."""
    return (1 << (bits - 1)) - STORED_OFFSET[check(convention)]


def symmetric_pattern(qzeros: Array, bits: int) -> str | None:
    """The convention whose symmetric zero is every stored field of packed qzeros, else None:
    4-bit words 0x77777777 are gptq's, 0x88888888 gptq_v2's (one constant cannot be both)."""
    return next((c for c in CONVENTIONS if every_field(qzeros, bits, sym_field(bits, c))),
                None)


def symmetric_pattern_of_bytes(raw: bytes, dtype: str, shape: tuple[int, ...],
                               bits: int) -> str | None:
    """symmetric_pattern of packed qzeros given as their bytes in C order (numpy `dtype`,
    `shape`): compared whole with each convention's constant tensor, built once a shape, so
    that tens of thousands of small qzeros read together cost a byte comparison each."""
    consts = _symmetric_bytes(bits, dtype, shape)
    if consts is None:   # not integer words: as symmetric_pattern answers
        return symmetric_pattern(np.frombuffer(raw, dtype).reshape(shape), bits)
    return next((c for c, b in consts if b is not None and raw == b), None)


@lru_cache(maxsize=32)   # a checkpoint has a few qzeros shapes; each entry is two small tensors
def _symmetric_bytes(bits: int, dtype: str, shape: tuple[int, ...]
                     ) -> tuple[tuple[str, bytes | None], ...] | None:
    d = np.dtype(dtype)
    if d.kind not in "iu" or not d.isnative:   # safetensors' words are little-endian
        return None
    return tuple((c, field_bytes(sym_field(bits, c), bits, dtype, shape)) for c in CONVENTIONS)


def effective_zeros(stored: Array, bits: int, rule: ZeroRule) -> Array:
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


def lossy_mask(stored: Array, bits: int, src: str, dst: str) -> Array | None:
    """The fields that `dst` cannot hold exactly when moved from `src` (None: every field
    moves exactly): those the shift takes out of [0, maxq]. gptq -> gptq_v2: a stored maxq
    (runtimes disagree on its Z); gptq_v2 -> gptq: a Z of 0 (gptq has no field for it)."""
    d = shift(src, dst)
    if d == 0:
        return None
    return stored > maxq(bits) - d if d > 0 else stored < -d


@dataclass(frozen=True)
class FieldChanges:
    fields: int
    changed: int       # fields whose stored value differs
    ambiguous: int     # gptq stored maxq (gptq -> gptq_v2)
    lossy: int         # gptq_v2 Z = 0 (gptq_v2 -> gptq)


def convert_fields(stored: Array, bits: int, src: str, dst: str,
                   allow_lossy: bool = False) -> tuple[Array, FieldChanges]:
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


def moved_words(words: Array, bits: int, src: str, dst: str,
                checked: bool = False) -> Array | None:
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
        same: Array = u.copy().view(words.dtype)
        return same
    if not word_path(u, bits, src, dst, checked):
        return None
    one = constant_words(1, bits, u.dtype.itemsize * 8)[0]
    with np.errstate(over="ignore"):  # the top field never carries out: checked above
        out = u + one if d > 0 else u - one
    moved: Array = out.astype(u.dtype, copy=False).view(words.dtype)
    return moved


def word_path(words: Array, bits: int, src: str, dst: str,
              checked: bool = False) -> bool:
    """Whether moving `words` from `src` to `dst` is one addition per word (moved_words): no
    shift at all, or fields that never straddle a word (2, 4, 8 bits) of which none is lossy
    (has_field, skipped when the caller `checked` these very words already)."""
    d = shift(src, dst)
    if d == 0:
        return True
    return bits in (2, 4, 8) and (checked or not has_field(words, bits,
                                                             maxq(bits) if d > 0 else 0))


def words_moved(w_src: Array, w_dst: Array, bits: int, src: str, dst: str) -> bool:
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
    _, one, _ = field_masks(bits, a.dtype.itemsize)
    fast = native.differ_by(a, b, int(one)) if d > 0 else native.differ_by(b, a, int(one))
    if fast is not None:   # the same subtraction, in one compiled pass
        return fast
    with np.errstate(over="ignore"):
        diff = b - a if d > 0 else a - b
    return bool(np.all(diff == one))


def field_changes(words: Array, bits: int, src: str, dst: str,
                  allow_lossy: bool = False) -> FieldChanges:
    """What convert_words reports for these words, without making the new ones where they
    move word by word (word_path: then every field changes, or none with no shift)."""
    words = np.asarray(words)
    if word_path(unsigned(words), bits, src, dst):
        fields = words.size * words.dtype.itemsize * 8 // bits
        return FieldChanges(fields, 0 if shift(src, dst) == 0 else fields, 0, 0)
    # field by field, as convert_words does off the word path (its field test already run)
    return convert_fields(unpack(words, bits, axis=1), bits, src, dst, allow_lossy)[1]


def convert_words(words: Array, bits: int, src: str, dst: str,
                  allow_lossy: bool = False, checked: bool = False
                  ) -> tuple[Array, FieldChanges]:
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
