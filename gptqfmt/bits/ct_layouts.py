"""compressed-tensors' two `pack_to_int32` layouts: rows of b-bit values (b = 1..8) in int32
words, padded per word up to 0.17, one dense bit stream from 0.18 (pure functions, numpy in and
out, no file access).

The values are what the file stores: compressed-tensors adds 2^(b-1) to the signed code (offset
binary), for the weight and for its zero point alike (pack_to_int32 step 1), so they lie in
[0, 2^b - 1]. A row is the packed axis: weight_packed [out, in] packs along dim 1, the zero point
[out, groups] along dim 0 (`packed_dim=0`); pass `axis`.

- padded, compressed-tensors <= 0.17.x (compressors/pack_quantized/helpers.py at 0.17.1,
  c18a0fa8b969, L66 `pack_factor = 32 // num_bits`, L72 `padded_cols = math.ceil(cols /
  pack_factor) * pack_factor`): each word holds floor(32/b) values, value i in word i // f at
  bit (i % f) * b with f = floor(32/b); the word's top 32 - f*b bits and the fields past the
  row's last value are zero. ceil(values / f) words: 10, 6, 5, 4 values a word at 3, 5, 6, 7
  bits.
- dense, compressed-tensors >= 0.18.0 (66e631f65018, #732 "CT support for humming";
  helpers.py L27 "This packing is dense, with no padding bits, where necessary elements are
  split across int32 boundaries", L62 `packed_cols = math.ceil(cols * num_bits / 32)`): value
  i starts at bit i*b of the row's stream, least significant bit first, and may straddle two
  words; the bits past the last value are zero. ceil(values * b / 32) words. (The nightlies
  between 66e631f6 and 0.18.0, versioned like 0.17.2a2026MMDD, pack densely too.)

At 1, 2, 4 and 8 bits f*b = 32 and both layouts are the same bits. At 3, 5, 6 and 7 they
agree only while a row fits in its first word (values <= f); past it they differ, though the
widths may still agree (11 values at 3 bits are 2 words either way), so a width alone does not
always tell the layout (`fitting`).

Worked example, 3 bits, 11 values [1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 5] (value 9 = 0b010, value 10
= 0b101), bits 31..0 of each word, fields split by `|`:

    padded  word 0 = 00|010|000|000|000|000|000|000|000|000|001 = 0x10000001   values 0..9,
            word 1 = 0...0|101                                  = 0x00000005   top 2 bits 0
    dense   word 0 = 01|010|000|000|000|000|000|000|000|000|001 = 0x50000001   value 10's low
            word 1 = 0...0|1                                    = 0x00000001   bits 01 on top,
                                                                              its high bit 1
"""
from __future__ import annotations

import numpy as np

from .packing import pack_stream, unpack_stream
from .packing import unpack as unpack_fields

PADDED, DENSE = "padded", "dense"
LAYOUTS = (DENSE, PADDED)
LABELS = {PADDED: "padded (compressed-tensors <= 0.17)",
          DENSE: "dense (compressed-tensors >= 0.18)"}
WORD = 32


def check_bits(bits: int) -> None:
    if not (isinstance(bits, int) and 1 <= bits <= 8):
        raise ValueError(f"bits={bits!r}: pack_to_int32 packs 1 to 8 bits")


def per_word(bits: int) -> int:
    """Values a word of the padded layout holds: floor(32 / bits)."""
    check_bits(bits)
    return WORD // bits


def width(values: int, bits: int, layout: str) -> int:
    """Words a row of `values` values takes in `layout`."""
    check_bits(bits)
    if layout == PADDED:
        return -(-values // per_word(bits))
    if layout == DENSE:
        return -(-values * bits // WORD)
    raise ValueError(f"layout {layout!r}: expected {PADDED!r} or {DENSE!r}")


def differ(bits: int) -> bool:
    """Whether the two layouts differ at all at `bits` (3, 5, 6, 7)."""
    check_bits(bits)
    return WORD % bits != 0


def coincide(values: int, bits: int) -> bool:
    """Whether a row of `values` values is the same bits in both layouts: always at 1/2/4/8
    bits, else only while it fits in one word (values <= floor(32/bits))."""
    return not differ(bits) or values <= per_word(bits)


def fitting(values: int, bits: int, words: int) -> tuple[str, ...]:
    """The layouts in which a row of `values` values takes `words` words (none, one, or both:
    then the width alone does not tell them apart, unless they `coincide`)."""
    return tuple(lay for lay in LAYOUTS if width(values, bits, lay) == words)


def _rows(a: np.ndarray, axis: int) -> np.ndarray:
    """`a` with the packed axis last."""
    return np.moveaxis(np.asarray(a), axis, -1)


def pack(codes: np.ndarray, bits: int, layout: str, axis: int = -1) -> np.ndarray:
    """int32 words from stored values in [0, 2^bits - 1] along `axis` (that axis becomes
    width(values, bits, layout) long)."""
    codes = np.asarray(codes)
    if codes.dtype.kind not in "iu":
        raise ValueError(f"values must be integers; got {codes.dtype}")
    top = (1 << bits) - 1
    if codes.size and (codes.min() < 0 or codes.max() > top):
        raise ValueError(f"values must lie in [0, {top}] at {bits} bits; got "
                         f"[{int(codes.min())}, {int(codes.max())}]")
    c = _rows(codes, axis)
    values = c.shape[-1]
    lead = c.shape[:-1]
    n = width(values, bits, layout)
    if layout == PADDED:
        f = per_word(bits)
        cc = np.zeros(lead + (n * f,), np.uint32)
        cc[..., :values] = c
        cw = cc.reshape(lead + (n, f))
        out = np.zeros(lead + (n,), np.uint32)
        for i in range(f):
            out |= cw[..., i] << np.uint32(i * bits)
    else:   # GPTQ's bit stream: 32 values fill `bits` whole words; packed, cut to n words
        blocks = -(-values // WORD)
        cc = np.zeros((blocks * WORD,) + lead, np.uint32)
        cc[:values] = np.moveaxis(c, -1, 0)
        out = np.moveaxis(pack_stream(cc, bits, WORD), 0, -1)[..., :n]
    return np.ascontiguousarray(np.moveaxis(out.view(np.int32), -1, axis))


def unpack(words: np.ndarray, bits: int, values: int, layout: str,
           axis: int = -1) -> np.ndarray:
    """Stored values (uint8) from int32 words along `axis`, `values` of them per row (the
    padding dropped). The axis must be width(values, bits, layout) words long."""
    w = _rows(words, axis)
    if w.dtype.itemsize != 4 or w.dtype.kind not in "iu":
        raise ValueError(f"packed words must be int32; got {w.dtype}")
    n = width(values, bits, layout)
    if w.shape[-1] != n:
        raise ValueError(f"{w.shape[-1]} words along axis {axis}; {values} values of {bits} "
                         f"bits take {n} in the {layout} layout")
    u = w.view(np.uint32)
    lead = u.shape[:-1]
    mask = np.uint32((1 << bits) - 1)
    if layout == PADDED:
        f = per_word(bits)
        out = np.empty(lead + (n * f,), np.uint8)
        for i in range(f):
            np.bitwise_and(u >> np.uint32(i * bits), mask, out=out[..., i::f], casting="unsafe")
    elif bits in (2, 4, 8):   # no value straddles a word: the stream is the words' bytes
        out = unpack_fields(u, bits, axis=-1)
    else:   # GPTQ's bit stream, padded to whole blocks of 32 values
        blocks = -(-n // bits)
        ub = np.zeros((blocks * bits,) + lead, np.uint32)
        ub[:n] = np.moveaxis(u, -1, 0)
        out = np.moveaxis(unpack_stream(ub, bits), 0, -1)
    return np.moveaxis(out[..., :values], -1, axis)


def repack(words: np.ndarray, bits: int, values: int, src: str, dst: str,
           axis: int = -1) -> np.ndarray:
    """The same rows moved from layout `src` into `dst` (int32)."""
    if src == dst:
        return np.ascontiguousarray(np.asarray(words).view(np.int32))
    return pack(unpack(words, bits, values, src, axis), bits, dst, axis)


def padding_clean(words: np.ndarray, values: int, bits: int, layout: str,
                  axis: int = -1) -> np.ndarray:
    """Per row (the lines along `axis`), whether every bit that holds no value is zero, as
    pack_to_int32 leaves it: in the padded layout the top 32 - f*b bits of every word and the
    fields past the last value, in the dense one the bits past the last value."""
    u = _rows(words, axis).view(np.uint32)
    n = width(values, bits, layout)
    if u.shape[-1] != n:
        raise ValueError(f"{u.shape[-1]} words along axis {axis}; {values} values of {bits} "
                         f"bits take {n} in the {layout} layout")
    if n == 0:
        return np.ones(u.shape[:-1], dtype=bool)
    if layout == PADDED:   # bits a full word holds, and the last word of the row
        full, last = per_word(bits) * bits, (values - (n - 1) * per_word(bits)) * bits
    else:
        full, last = WORD, values * bits - (n - 1) * WORD
    keep = np.full(n, (1 << full) - 1, dtype=np.uint32)
    keep[-1] = (1 << last) - 1
    cols = np.flatnonzero(keep != np.uint32(0xFFFFFFFF))
    if not cols.size:
        return np.ones(u.shape[:-1], dtype=bool)
    dirty: np.ndarray = ((u[..., cols] & ~keep[cols]) != 0).any(axis=-1)
    return ~dirty
