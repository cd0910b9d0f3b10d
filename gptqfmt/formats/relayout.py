"""Word-level re-layouts between GPTQ and its neighbouring formats (pure functions, numpy in and
out, no file access).

All three formats store the codes as one little-endian bit stream of `bits`-bit values (value k
at stream bit k*bits, least significant first; gptq/packing.py). They differ in the axis the
stream runs along, and AutoAWQ in the order of the eight nibbles of a word:

- GPTQ `qweight [K*bits/32, N]`: per output column n, the stream over input channels k.
  GPTQ `qzeros [G, N*bits/32]`: per group g, the stream over output channels n.
- compressed-tensors `weight_packed [N, ceil(K*bits/32)]` (pack_to_int32, packed_dim=1): per
  output row n, the stream over k, padded with zero bits to whole words; `weight_zero_point
  [ceil(N*bits/32), G]` (packed_dim=0): per group, the stream over n. With the dense
  packing of 0.18 and later (compressors/pack_quantized/helpers.py, 0.20.0: "32 consecutive elements
  are packed into exactly num_bits int32 words"), so `weight_packed == qweight.T` and
  `weight_zero_point == qzeros.T`, word for word, whenever K*bits and N*bits are multiples of
  32. (Up to 0.17, floor(32/bits) values went to a word, padded: the same words for 1/2/4/8
  bits, other ones at 3/5/6/7 bits, which `padded_to_dense` re-packs; bits/ct_layouts.py has
  both.) Stored codes and zeros are offset-binary (signed + 2^(bits-1)), i.e. GPTQ's unsigned
  codes and gptq_v2's Z.
- AutoAWQ GEMM `qweight [K, N/8]`, `qzeros [G, N/8]` (4-bit; awq/modules/linear/gemm.py): per
  input row (per group), 8 output channels per int32 word, channel `8c + AWQ_ORDER[i]` in nibble
  i of word c.

Worked example (AWQ, one word): channels 0..7 hold codes 0x0..0x7; nibble i holds channel
AWQ_ORDER[i] = [0, 2, 4, 6, 1, 3, 5, 7], so nibbles 7..0 read 7 5 3 1 6 4 2 0: the word is
0x75316420. GPTQ packs the same eight channels of one group as 0x76543210 (qzeros, axis 1).
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..bits import ct_layouts, native
from ..bits.packing import unpack, unsigned
from ..parallel import cpus

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)               # nibble i holds channel AWQ_ORDER[i]
AWQ_INVERSE = tuple(AWQ_ORDER.index(j) for j in range(8))  # channel j sits in nibble (0,4,1,...)
AWQ_BITS = 4


PARALLEL_BYTES = 16 << 20   # below this a transpose runs in the calling thread
BLOCK = 256                 # columns moved (or compared) per step: a cache-sized strided read
# rows of a BLOCK moved at once: a tile of BLOCK x TILE words is read and written within the
# caches (a whole BLOCK of a 1024-row qweight, moved at once, ran at 0.7 GB/s on two threads;
# tiles of 32 rows at 1.3 to 1.5 GB/s)
TILE = 32
# Bands (Banded): about this many bytes made at once, within a core's L2 cache, so that the
# write copying a band into the page cache reads it from the caches
BAND_BYTES = 2 << 20
AWQ_TILE = 32               # word columns of a tile of the compiled AWQ re-layout
TRANSPOSE_TILE = 64         # columns of a tile of the compiled word transpose


@dataclass(frozen=True)
class Banded:
    """An int32 tensor [rows, width] made a band of rows at a time, into buffers the caller
    reuses: no copy of it all is ever in memory, and no fresh pages are zeroed for it (writing
    2.35 GB from fresh 112 MiB arrays took 2.5 to 3.8 s here, from one reused array 1.1 to
    1.6 s). fill(out, r0, r1) writes the rows [r0, r1) into out [r1 - r0, width]; r0 and r1
    are multiples of `step` (r1 may be the last row). `grain`: the rows one call should take
    at least to run at speed (a tile of the loops that make them); `phase`: where grains
    start (modulo grain; a multiple of `step`), so that the calls read their source from whole
    cache lines (a source whose rows start mid-line made the AWQ loops 25 to 30% slower)."""
    shape: tuple[int, int]
    fill: Callable[[np.ndarray, int, int], None]
    step: int = 1
    grain: int = 1
    phase: int = 0

    @property
    def nbytes(self) -> int:
        return 4 * self.shape[0] * self.shape[1]

    def band_rows(self, parts: int = 1, nbytes: int | None = None) -> int:
        """Rows a band: about `nbytes` (default BAND_BYTES), whole grains, at least a grain
        for each of `parts` threads, no more than the tensor."""
        rows, width = self.shape
        grains = max(parts, (nbytes or BAND_BYTES) // max(1, 4 * width * self.grain))
        return max(self.step, min(rows, grains * self.grain))

    def bands(self, parts: int = 1, nbytes: int | None = None) -> list[list[tuple[int, int]]]:
        """The bands in order, each as up to `parts` spans of whole grains (cut at phase +
        k grain; the first and last may be partial) that threads can fill at once, in
        order."""
        cuts = _cuts(self.shape[0], self.grain, self.phase)
        per_band = max(1, self.band_rows(parts, nbytes) // self.grain)
        per_span = -(-per_band // parts)
        out = []
        for b in range(0, len(cuts) - 1, per_band):
            ends = cuts[b:min(b + per_band, len(cuts) - 1) + 1]
            out.append([(ends[i], ends[min(i + per_span, len(ends) - 1)])
                        for i in range(0, len(ends) - 1, per_span)])
        return out

    def whole(self, workers: int | None = None) -> np.ndarray:
        """All of it in one new array (BLOCK rows a call, cut at the phase, on `workers`
        threads; BLOCK is whole steps and grains)."""
        out = np.empty(self.shape, dtype=np.int32)
        blocks(lambda r0, r1: self.fill(out[r0:r1], r0, r1), self.shape[0], self.nbytes,
               workers, self.phase)
        return out


def _cuts(n: int, unit: int, phase: int = 0) -> list[int]:
    """Where [0, n) is cut into spans of whole units, the first starting at `phase` (modulo
    unit): 0, phase + k unit inside (0, n), and n; none for n = 0.

        >>> _cuts(10, 4, 1), _cuts(8, 4), _cuts(0, 4)
        ([0, 1, 5, 9, 10], [0, 4, 8], [])
    """
    return [0, *range(phase % unit or unit, n, unit), n] if n > 0 else []


def line_phase(a: np.ndarray, per: int = 1) -> int:
    """`per` x the columns of the 2-D array `a` before the first one whose every row starts a
    64-byte cache line there (0 where no column does: rows a line apart in no whole lines)."""
    line = 64 // a.itemsize
    if a.ndim != 2 or a.strides[1] != a.itemsize or a.strides[0] % 64 or \
            a.ctypes.data % a.itemsize:
        return 0
    return per * ((-(a.ctypes.data // a.itemsize)) % line)


def bands_of(words: np.ndarray, is_transposed: bool) -> Banded:
    """qweight's transpose (compressed-tensors' weight_packed) a band at a time, from words as
    Source.stored_qweight gives them: rows of them as they are where they are the transpose
    already, else the transpose of their columns."""
    a = np.asarray(words).view(np.int32)
    if is_transposed:
        def rows(out: np.ndarray, r0: int, r1: int) -> None:
            out[...] = a[r0:r1]
        return Banded(a.shape, rows, 1, TRANSPOSE_TILE)

    def columns(out: np.ndarray, r0: int, r1: int) -> None:
        _transpose_into(a, out, r0, r1)
    return Banded(a.shape[::-1], columns, 1, TRANSPOSE_TILE, line_phase(a))


def _transpose_into(a: np.ndarray, out: np.ndarray, c0: int, c1: int) -> None:
    """out = a[:, c0:c1].T (the rows [c0, c1) of a's transpose): by the compiled loops where
    they take the elements, else TILE rows at once (numpy's copies release the GIL)."""
    if native.transpose(a, out, c0, c1):
        return
    for r, tile in tiles(a[:, c0:c1]):
        out[:, r:r + TILE] = tile


def transposed(words: np.ndarray, workers: int | None = None) -> np.ndarray:
    """A C-contiguous int32 copy of words.T (GPTQ <-> compressed-tensors, both directions):
    transposed_values of the words as int32."""
    return transposed_values(np.asarray(words).view(np.int32), workers)


def transposed_values(a: np.ndarray, workers: int | None = None) -> np.ndarray:
    """A C-contiguous copy of a.T of the same dtype (words, and scales between GPTQ's [G, N]
    and compressed-tensors' [N, G]), BLOCK columns at a time on `workers` threads (default:
    the CPUs this process may use): by the compiled loops where they take the elements, else
    TILE rows of a block at once (numpy's copies release the GIL)."""
    a = np.asarray(a)
    if a.ndim != 2:
        return np.ascontiguousarray(a.T)
    out = np.empty(a.shape[::-1], dtype=a.dtype)

    def part(i: int, j: int) -> None:
        _transpose_into(a, out[i:j], i, j)
    blocks(part, a.shape[1], a.nbytes, workers, line_phase(a))
    return out


def words_differ(a: np.ndarray, at: bool, b: np.ndarray, bt: bool,
                 workers: int | None = None) -> int:
    """How many words of two qweights differ, each as Source.stored_qweight gives it (the one
    model's [K*bits/32, N], or with `at` / `bt` its transpose); -1 when the shapes differ. In
    blocks of BLOCK rows or columns on `workers` threads (memory: one block); a transposed side
    is read row-contiguously, against tiles of the other (compiled where built)."""
    a, b = unsigned(np.asarray(a)), unsigned(np.asarray(b))
    if at == bt:  # the same layout
        if a.shape != b.shape:
            return -1
        return sum(blocks(lambda i, j: int(np.count_nonzero(a[i:j] != b[i:j])),
                          a.shape[0], a.nbytes, workers))
    if at:
        a, b = b, a   # a: the one model's [K*bits/32, N]; b: its transpose as stored
    if a.shape != b.shape[::-1]:
        return -1

    def part(n: int, m: int) -> int:   # columns [n, m), TILE rows of them at once (transposed)
        compiled = native.transposed_differ(a, b, n, m)
        if compiled is not None:
            return compiled
        right = b[n:m]
        return sum(int(np.count_nonzero(right[:, r:r + tile.shape[1]] != tile))
                   for r, tile in tiles(a[:, n:m]))
    return sum(blocks(part, a.shape[1], a.nbytes, workers, line_phase(a)))


def awq_qweight_differ(words: np.ndarray, other: np.ndarray, workers: int | None = None
                       ) -> int | None:
    """How many words of `other` (GPTQ qweight's transpose, [N, K/8]) differ from AutoAWQ
    qweight `words` [K, N/8] laid out as awq_qweight_transposed does, with no copy laid out
    (BLOCK word columns at a time, on threads); -1 when the shapes differ; None where the
    compiled loops do not take it (then words_differ on the laid-out copy)."""
    w, k, c = _awq_words(words)   # refused as the layout refuses it
    o = unsigned(np.asarray(other))
    if o.shape != (8 * c, k // 8):
        return -1
    if not native.available():
        return None
    counts = blocks(lambda i, j: native.awq_transposed_differ(w, AWQ_ORDER, o[8 * i:8 * j], i, j),
                    c, w.nbytes, workers, line_phase(w))
    return None if None in counts else sum(counts)


def tiles(block: np.ndarray):
    """(r, block[r:r + TILE].T) down a block of columns: its transpose, TILE rows at a time
    (the order transposed() moves, and a transposed comparison reads, within the caches)."""
    for r in range(0, block.shape[0], TILE):
        yield r, block[r:r + TILE].T


def blocks(fn, n: int, nbytes: int, workers: int | None = None, phase: int = 0) -> list:
    """fn(i, j) for the spans [i, j) of [0, n) cut at phase + k BLOCK (the phase: where the
    compiled loops read whole cache lines, line_phase), on threads when the data are large;
    the results in order."""
    cuts = _cuts(n, BLOCK, phase)
    spans = list(zip(cuts, cuts[1:]))
    workers = cpus() if workers is None else workers
    if workers <= 1 or nbytes < PARALLEL_BYTES:
        return [fn(i, j) for i, j in spans]
    with ThreadPoolExecutor(workers) as pool:
        return list(pool.map(lambda ij: fn(*ij), spans))


def _awq_words(words: np.ndarray) -> tuple[np.ndarray, int, int]:
    """AutoAWQ qweight as C-ordered uint32 words [K, C], with K and C; K must be whole blocks of
    the 8 rows a GPTQ word packs."""
    w = np.ascontiguousarray(np.asarray(words).view(np.uint32))
    k, c = w.shape
    if k % 8:
        raise ValueError(f"AWQ qweight has {k} rows; 4-bit GPTQ packs 8 rows to a word")
    return w, k, c


def awq_fields(words: np.ndarray) -> np.ndarray:
    """AutoAWQ words [R, C] (int32) -> codes [R, 8C] (uint8) in channel order."""
    nibbles = unpack(np.asarray(words).view(np.int32), AWQ_BITS, axis=1)  # nibble i at 8c + i
    r, n = nibbles.shape
    return np.ascontiguousarray(
        nibbles.reshape(r, n // 8, 8)[:, :, list(AWQ_INVERSE)].reshape(r, n))


# The two delta swaps of a word's nibbles a0..a7 (AutoAWQ's order) into GPTQ's channel order
# a0 a4 a1 a5 a2 a6 a3 a7: the middle bytes trade places, then the middle nibbles of each half
_NIBBLE_SHUFFLE = ((8, 0x0000FF00), (4, 0x00F000F0))


def awq_words_to_gptq(words: np.ndarray) -> np.ndarray:
    """AutoAWQ words [R, C] (8 channels to a word, in AWQ_ORDER) -> GPTQ's words (channels in
    order, as qzeros packs them along the output axis): within each word, nibble i of the
    result is nibble AWQ_INVERSE[i] of the source, by two delta swaps, with no unpacking
    (pack(awq_fields(words), 4, 32, axis=1) gives the same words).

        >>> hex(int(awq_words_to_gptq(np.array([[0x75316420]], np.uint32))[0, 0]))
        '0x76543210'
    """
    x = np.asarray(words).view(np.uint32).copy()
    for shift, mask in _NIBBLE_SHUFFLE:
        _delta_swap(x, x, shift, mask)
    return x.view(np.int32)


def _delta_swap(a: np.ndarray, b: np.ndarray, shift: int, mask: int) -> None:
    """In place, uint32: the `mask` bits of `a` shifted down by `shift` trade places with the
    `mask` bits of `b` (a and b may be one array: bits within each word trade places)."""
    t = np.right_shift(a, np.uint32(shift))
    np.bitwise_xor(t, b, out=t)
    np.bitwise_and(t, np.uint32(mask), out=t)
    np.bitwise_xor(b, t, out=b)
    np.left_shift(t, np.uint32(shift), out=t)
    np.bitwise_xor(a, t, out=a)


# The three delta swaps that transpose an 8 x 8 matrix of nibbles held as 8 words (word a,
# nibble i): (shift, mask, rows a) swapping nibble block (a, high) with (a + shift / 4, low)
_NIBBLE_TRANSPOSE = ((16, 0x0000FFFF, 4), (8, 0x00FF00FF, 2), (4, 0x0F0F0F0F, 1))


def awq_qweight_to_gptq(words: np.ndarray, workers: int | None = None) -> np.ndarray:
    """AutoAWQ qweight [K, N/8] -> GPTQ qweight [K/8, N] (int32), on the words, with no
    unpacking: rows 8r..8r+7 of word column c are an 8 x 8 matrix of nibbles (row k, nibble i:
    the code of channel 8c + AWQ_ORDER[i] at input k), whose transpose is, in row i, GPTQ's
    word (r, 8c + AWQ_ORDER[i]) (nibble k: input 8r + k). The transpose is three delta swaps
    (16-, 8-, then 4-bit blocks between rows 4, 2, then 1 apart), a few integer operations a
    word; BLOCK rows of words at a time, on `workers` threads.

        >>> rows = np.array([[0x75316420 + 0x11111111 * k] for k in range(8)], np.uint32)
        >>> hex(int(awq_qweight_to_gptq(rows.view(np.int32)).view(np.uint32)[0, 3]))
        '0xa9876543'

    (channel 3 sits in nibble 5 of every row: 3 + k at input k.)"""
    w, k, c = _awq_words(words)
    blocks3 = w.reshape(k // 8, 8, c)
    out = np.empty((k // 8, c, 8), dtype=np.uint32)   # (r, c, channel within the word)

    flat = out.reshape(k // 8, c * 8)

    def part(i: int, j: int) -> None:
        if native.awq_to_gptq(w, AWQ_ORDER, flat, i, j):
            return
        x = blocks3[i:j].copy()
        r = len(x)
        for shift, mask, apart in _NIBBLE_TRANSPOSE:
            pairs = x.reshape(r, 8 // (2 * apart), 2, apart, c)
            _delta_swap(pairs[:, :, 0], pairs[:, :, 1], shift, mask)
        for slot, channel in enumerate(AWQ_ORDER):   # row `slot` holds that channel
            out[i:j, :, channel] = x[:, slot, :]
    blocks(part, k // 8, w.nbytes, workers)
    return flat.view(np.int32)


def awq_qweight_transposed(words: np.ndarray, workers: int | None = None) -> np.ndarray:
    """AutoAWQ qweight [K, N/8] -> GPTQ qweight's transpose [N, K/8] (int32: what
    compressed-tensors stores as weight_packed): awq_qweight_to_gptq(words).T, in one pass by
    the compiled loops (BLOCK word columns at a time, on `workers` threads), else as that."""
    return awq_qweight_bands(words).whole(workers)


def awq_qweight_bands(words: np.ndarray) -> Banded:
    """awq_qweight_transposed a band at a time: its rows [8 c0, 8 c1) come from the AWQ word
    columns [c0, c1), by the compiled loops in one pass, else as awq_qweight_to_gptq of those
    columns, transposed."""
    w, k, c = _awq_words(words)

    def fill(out: np.ndarray, r0: int, r1: int) -> None:
        c0, c1 = r0 // 8, r1 // 8
        if not native.awq_to_transposed(w, AWQ_ORDER, out, c0, c1):
            out[...] = awq_qweight_to_gptq(w[:, c0:c1], workers=1).T
    return Banded((8 * c, k // 8), fill, 8, 8 * AWQ_TILE, line_phase(w, 8))


def padded_to_dense(words: np.ndarray, bits: int, values: int, axis: int,
                    workers: int | None = None) -> np.ndarray:
    """compressed-tensors' padded rows (up to 0.17) of `values` values along `axis` as the
    dense rows of 0.18 and later (int32, C-contiguous), BLOCK lines across `axis` at a time, on
    `workers` threads (bits/ct_layouts.py: the two layouts)."""
    w = np.asarray(words).view(np.int32)
    n = w.shape[1 - axis]
    dense = ct_layouts.width(values, bits, ct_layouts.DENSE)
    out = np.empty((n, dense) if axis == 1 else (dense, n), dtype=np.int32)

    def part(i: int, j: int) -> None:
        lines = (slice(i, j), slice(None)) if axis == 1 else (slice(None), slice(i, j))
        out[lines] = ct_layouts.repack(w[lines], bits, values, ct_layouts.PADDED,
                                       ct_layouts.DENSE, axis)
    blocks(part, n, w.nbytes, workers)
    return out
