"""The compiled loops of kernels/gptq_sums.h and kernels/gptq_relayout.h (the extension
gptqfmt.bits._native), where the install built them, behind functions that say when they
cannot take a case.

The extension is optional: a machine without a C compiler installs and runs gptqfmt with the
numpy loops (detection/codestats.py, formats/relayout.py, ops/differences.py,
runtimes/verdicts.py, bits/swar.py, bits/conventions.py, safetensors_io/dtypes.py,
safetensors_io/journal.py), which compute the same answers; so does GPTQFMT_NATIVE=0, which
the tests use to hold the two equal.
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType

import numpy as np

from . import Array

# the values of GPTQFMT_NATIVE that turn the compiled loops off
OFF = ("0", "false", "no", "off")


# the extension's VERSION these functions are written for (kernels/native_module.c)
VERSION = 5


def load(name: str, version: int) -> ModuleType | None:
    """The compiled extension `name` (a dotted module name) where it was built at `version`,
    else None."""
    try:
        mod = importlib.import_module(name)
    except ImportError:
        return None
    # a build left in place from other sources (an editable install not rebuilt) is not run
    return mod if getattr(mod, "VERSION", None) == version else None


_NATIVE = load(f"{__package__}._native", VERSION)


def switched_off() -> bool:
    """Whether GPTQFMT_NATIVE turns every compiled path off (the loops here and the header
    reader of safetensors_io), for the Python ones to run."""
    return os.environ.get("GPTQFMT_NATIVE", "1").lower() in OFF


def available() -> bool:
    """Whether the compiled loops were built and are not turned off (GPTQFMT_NATIVE=0)."""
    return _NATIVE is not None and not switched_off()


def cell_sums(qweight: Array, bits: int, g_idx: Array, groups: int,
              rows_per_group: int | None) -> tuple[Array, Array] | None:
    """(sums [groups, N] uint64, counts [groups] int64): per group and column of qweight
    [R, N], the sum of its codes, and per group how many codes a cell sums; or None where the
    compiled loops do not take the case (not built or turned off, 3 bits, words other than
    native 32-bit ones, a g_idx of another length or naming a group outside [0, groups)), for
    the numpy loops to do.

    `rows_per_group`: packed rows per group when every word holds fields of one group (no
    act-order), so g_idx is not read where the rows are `groups` such runs; None to add each
    channel to g_idx's group.

    Worked example, 4-bit, one group of the two rows 0x11111111 and 0x7654321F in one column:
    8 x 1 + (15 + 1 + 2 + ... + 7) = 51, so the answer is ([[51]], [16]).
    """
    if not available() or bits not in (2, 4, 8) or qweight.ndim != 2 or \
            qweight.dtype.itemsize != 4 or qweight.dtype.kind not in "iu" or \
            not qweight.dtype.isnative or not qweight.flags.aligned:
        return None
    rows, n = qweight.shape
    if len(g_idx) != rows * (32 // bits):
        return None
    if rows_per_group and (rows % rows_per_group or rows // rows_per_group != groups):
        rows_per_group = None   # a last group of fewer rows: each channel to g_idx's group
    if rows_per_group:
        gi = np.zeros(0, dtype=np.int32)
    else:
        if len(g_idx) and (int(g_idx.min()) < 0 or int(g_idx.max()) >= groups):
            return None
        gi = np.ascontiguousarray(g_idx, dtype=np.int32)
    out = np.zeros((groups, n), dtype=np.uint64)
    assert _NATIVE is not None
    _NATIVE.cell_sums(np.ascontiguousarray(qweight), rows, n, bits, gi, groups,
                    rows_per_group or 0, out)
    counts = np.full(groups, rows_per_group * (32 // bits), dtype=np.int64) if rows_per_group \
        else np.bincount(gi, minlength=groups).astype(np.int64)
    return out, counts


def has_field(words: Array, bits: int, ones: bool) -> bool | None:
    """Whether any field of packed words is 0 (`ones`: all ones, maxq), in one pass over
    their bytes with the GIL released (at 2, 4 and 8 bits a field never straddles a byte, so
    the words' width and byte order do not matter); None where the compiled loops do not take
    the case (not built or turned off, other widths, words not in C order), for swar.has_field's
    numpy loop to answer.

    Worked example, 4 bits: the word 0x8888F037 has a 0 field (the third from the low end)
    and a 15 one (the fourth): True for both; 0x88888837 for neither."""
    a = np.asarray(words)
    if not available() or bits not in (2, 4, 8) or a.dtype.kind not in "iu" or \
            not a.flags.c_contiguous:
        return None
    assert _NATIVE is not None
    return bool(_NATIVE.has_field(a, bits, ones))


def interior_histogram(stored: Array, sums: Array, c: int, maxq: int
                       ) -> tuple[np.ndarray, int] | None:
    """(hist, cells): over the cells whose stored zero field is interior (0 < stored < maxq),
    how many have each k = sum - c x stored, hist[k + maxq c] for k in [-maxq c, maxq c], and
    how many cells that is; in one pass with the GIL released. None where the compiled loops
    do not take the case (not built or turned off, stored not uint8 or sums not aligned uint64
    in C order, shapes that differ, a sum above maxq c), for numpy to count.

    Worked example, 4 bits, c = 2: stored [3, 0, 15], sums [9, 4, 30]: only the first cell
    is interior, k = 9 - 2 x 3 = 3, so hist[33] = 1 and cells = 1."""
    st, sm = np.asarray(stored), np.asarray(sums)
    if not available() or st.dtype != np.uint8 or sm.dtype != np.uint64 or \
            st.shape != sm.shape or not (st.flags.c_contiguous and sm.flags.c_contiguous) or \
            not sm.flags.aligned or c < 1 or not 1 <= maxq <= 255:
        return None
    hist = np.zeros(2 * maxq * c + 1, dtype=np.int64)
    assert _NATIVE is not None
    cells = int(_NATIVE.interior_histogram(st, sm, c, maxq, hist))
    return None if cells < 0 else (hist, cells)


def differ_by(a: Array, b: Array, d: int) -> bool | None:
    """Whether b - a == d in every element (unsigned, wrapping at the elements' width: words
    compared as the machine subtracts them), in one pass with the GIL released; None where the
    compiled loops do not take the case (not built or turned off, other dtypes, shapes, byte
    orders or layouts), for numpy to answer.

    Worked example, 32-bit words: a = [0x37, 0xFFFFFFFF], b = [0x48, 0x10]: the differences are
    0x11 and 0x11 (wrapping), so differ_by(a, b, 0x11) is True."""
    a, b = np.asarray(a), np.asarray(b)
    if not available() or a.dtype != b.dtype or a.shape != b.shape or \
            a.dtype.kind not in "iu" or a.dtype.itemsize not in (1, 2, 4, 8) or \
            not a.dtype.isnative or not a.flags.c_contiguous or not b.flags.c_contiguous:
        return None
    assert _NATIVE is not None
    got = _NATIVE.same_difference(a, b, a.dtype.itemsize)
    return got is not None and (a.size == 0 or got == d % (1 << (8 * a.dtype.itemsize)))


def magnitude_range(values: Array) -> tuple[int, int] | None:
    """(least, largest) of the bits of 16- or 32-bit float values (fp16 or bf16 held as
    uint16, or float32: any native 2- or 4-byte dtype) with the sign bit cleared, in one pass
    with the GIL released; None where the compiled loops do not take the case (not built or
    turned off, other widths, byte order or layout, no values)."""
    a = np.asarray(values)
    if not available() or a.dtype.itemsize not in (2, 4) or not a.dtype.isnative or \
            not a.flags.c_contiguous or not a.flags.aligned or a.size == 0:
        return None
    assert _NATIVE is not None
    lo, hi = _NATIVE.magnitude_range(a, a.dtype.itemsize)
    return int(lo), int(hi)


# safetensors dtypes of scales -> the kinds of gptq_dequant.h's gq_load
_KINDS = {"F32": (0, np.float32), "F16": (1, np.float16), "BF16": (2, np.uint16)}


def _kind(scales: Array, dtype: str) -> int | None:
    kind = _KINDS.get(dtype)
    a = np.asarray(scales)
    if not available() or kind is None or a.dtype != kind[1] or not a.flags.aligned:
        return None
    return kind[0]


def largest_change(scales: Array, dtype: str, dz: Array) -> float | None:
    """max |scale x dZ| in float32 over the cells whose Z changes (`dz`, int32, one per
    scale), over finite scales and finite products (0.0 when none): the compiled twin of
    runtimes.verdicts.largest_change, one pass with no float32 copy of the scales. None where
    the compiled loops do not take the case (not built or turned off, a dtype other than F32,
    F16 and BF16 (held as uint16), other shapes)."""
    kind = _kind(scales, dtype)
    if kind is None or dz.dtype != np.int32 or np.shape(scales) != dz.shape or \
            not dz.flags.aligned:
        return None
    assert _NATIVE is not None
    return float(_NATIVE.largest_change(np.ascontiguousarray(scales), kind,
                                      np.ascontiguousarray(dz)))


def largest_magnitude(scales: Array, dtype: str) -> float | None:
    """max |scale| over the finite scales (0.0 when none), as float32; None where the
    compiled loops do not take the case (as for largest_change)."""
    kind = _kind(scales, dtype)
    if kind is None:
        return None
    assert _NATIVE is not None
    return float(_NATIVE.largest_magnitude(np.ascontiguousarray(scales), kind))


def _words(a: Array, sizes: tuple[int, ...] = (4,)) -> bool:
    """Native, aligned integer words (or fp16 / bf16 values, with 2 in `sizes`) in C order:
    what the compiled re-layouts take as they are (a tensor at an odd offset of its file is
    not aligned, and goes to numpy)."""
    return a.ndim == 2 and a.dtype.itemsize in sizes and a.dtype.kind in "iuf" and \
        a.dtype.isnative and a.flags.c_contiguous and a.flags.aligned


def _into(out: Array, src: Array) -> bool:
    """`out` can be written, and not over `src`."""
    return bool(out.flags.writeable) and not np.may_share_memory(out, src)


def transpose(words: Array, out: Array, c0: int, c1: int) -> bool:
    """out[c - c0, r] = words[r, c] for the columns [c0, c1) (words [R, C]; out [c1 - c0, R],
    the rows [c0, c1) of the transpose; C order; 32-bit words, or 16-bit values such as fp16
    or bf16 scales); False where the compiled loops do not take the case (then nothing is
    written)."""
    if not available() or not _words(words, (2, 4)) or not _words(out, (2, 4)) or \
            out.shape != (c1 - c0, words.shape[0]) or out.itemsize != words.itemsize or \
            not _into(out, words):
        return False
    assert _NATIVE is not None
    _NATIVE.transpose(words, words.shape[0], words.shape[1], out, c0, c1, words.itemsize)
    return True


def transposed_differ(a: Array, b: Array, c0: int, c1: int) -> int | None:
    """How many words of the columns [c0, c1) of a [R, C] differ from b [C, R] at the
    transposed place; None where the compiled loops do not take the case."""
    if not available() or not _words(a) or not _words(b) or b.shape != a.shape[::-1]:
        return None
    assert _NATIVE is not None
    return int(_NATIVE.transposed_differ(a, a.shape[0], a.shape[1], b, c0, c1))


def awq_to_gptq(words: Array, order: tuple[int, ...], out: Array, b0: int, b1: int) -> bool:
    """AutoAWQ qweight words [K, C] -> GPTQ qweight out [K/8, 8C] for the blocks of eight rows
    [b0, b1) (`order`: the channel of each nibble of a word); False where the compiled loops
    do not take the case (then nothing is written)."""
    return _awq(words, order, out, b0, b1, _AWQ_ROWS) is not None


def awq_to_transposed(words: Array, order: tuple[int, ...], out: Array, c0: int,
                      c1: int) -> bool:
    """AutoAWQ qweight words [K, C] -> the rows [8 c0, 8 c1) of the transpose of GPTQ's
    qweight [8C, K/8], which `out` [8 (c1 - c0), K/8] holds, from the word columns [c0, c1)
    (compressed-tensors' weight_packed, with no GPTQ copy between; a band of it at a time);
    False where the compiled loops do not take the case (then nothing is written)."""
    return _awq(words, order, out, c0, c1, _AWQ_TRANSPOSED) is not None


def awq_transposed_differ(words: Array, order: tuple[int, ...], other: Array, c0: int,
                          c1: int) -> int | None:
    """How many words of `other` (the rows [8 c0, 8 c1) of a transpose [8C, K/8]) differ from
    awq_to_transposed's words of AutoAWQ qweight `words` [K, C] for the word columns [c0, c1),
    with nothing laid out in memory; None where the compiled loops do not take the case."""
    return _awq(words, order, other, c0, c1, _AWQ_COMPARED)


# the extension's awq_relayout modes: into GPTQ's layout, into its transpose, compared with it
_AWQ_ROWS, _AWQ_TRANSPOSED, _AWQ_COMPARED = 0, 1, 2


def _awq(words: Array, order: tuple[int, ...], dst: Array, lo: int, hi: int,
         mode: int) -> int | None:
    """awq_relayout in `mode` over [lo, hi) where the compiled loops take the case (the count
    of differing words, 0 where nothing is compared), else None. dst's shape follows from
    words', the mode and the span; a dst that is written must not overlap words."""
    if not available() or not _words(words) or not _words(dst) or words.shape[0] % 8:
        return None
    k, c = words.shape
    shape = (k // 8, c * 8) if mode == _AWQ_ROWS else (8 * (hi - lo), k // 8)
    if dst.shape != shape or (mode != _AWQ_COMPARED and not _into(dst, words)):
        return None
    assert _NATIVE is not None
    return int(_NATIVE.awq_relayout(words, k, c, np.asarray(order, dtype=np.intc), dst, lo,
                                    hi, mode))
