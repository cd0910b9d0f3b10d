"""The word re-layouts between formats (gptqfmt/formats/relayout.py) against golden words,
compressed-tensors' own packer and make_formats.py's independent slow writers."""
from __future__ import annotations

import numpy as np
import pytest

from gptqfmt.bits import native
from gptqfmt.bits.packing import pack
from gptqfmt.formats import relayout
from tests.support import HAVE_CT, load_generator, loops, needs_ct

FGEN = load_generator("make_formats")

if HAVE_CT:
    import torch
    from compressed_tensors.compressors.pack_quantized.helpers import pack_to_int32


@pytest.fixture(params=["compiled", "numpy"])
def both_loops(request):
    """The test twice: with the compiled loops (gptqfmt.bits.native; skipped where not built)
    and with the numpy ones."""
    if request.param == "compiled" and not native.available():
        pytest.skip("gptqfmt.bits._native was not built")
    with loops(request.param == "compiled"):
        yield


@pytest.mark.usefixtures("both_loops")
@pytest.mark.parametrize("shape", [(1, 1), (33, 7), (300, 1000), (2100, 2100)])
def test_transposed_is_the_transpose(shape):
    """Blocks of BLOCK columns (on threads past PARALLEL_BYTES: the largest shape), tiles of
    TILE rows, and the edges of both, on random words."""
    rng = np.random.default_rng(shape[0])
    words = rng.integers(0, 1 << 32, shape, dtype=np.uint64).astype(np.uint32).view(np.int32)
    got = relayout.transposed(words)
    assert got.dtype == np.int32 and got.flags.c_contiguous and np.array_equal(got, words.T)


@pytest.mark.usefixtures("both_loops")
@pytest.mark.parametrize("dtype", [np.float16, np.uint16, np.float32, np.float64])
def test_transposed_values_keep_their_dtype_and_bits(dtype):
    """Scales between [G, N] and [N, G]: every bit pattern kept (NaN payloads too)."""
    rng = np.random.default_rng(3)
    a = rng.integers(0, 256, (37, 300 * 8), dtype=np.uint8).view(dtype)
    got = relayout.transposed_values(a)
    assert got.dtype == a.dtype and got.flags.c_contiguous
    assert np.array_equal(got.view(np.uint8), np.ascontiguousarray(a.T).view(np.uint8))
    assert np.array_equal(relayout.transposed_values(a[:, ::2]).view(np.uint8),
                          np.ascontiguousarray(a[:, ::2].T).view(np.uint8))


def test_awq_word_golden():
    """gemm.py packs output channels 0..7 as nibbles [0,2,4,6,1,3,5,7]: 0x75316420."""
    w = FGEN.awq_pack(np.arange(8, dtype=np.uint8)[None])
    assert w.view(np.uint32)[0, 0] == 0x75316420
    assert relayout.awq_fields(np.array([[0x75316420]], np.uint32).view(np.int32)).tolist() \
        == [list(range(8))]


def test_awq_words_to_gptq_is_the_unpacked_permutation():
    """qzeros' nibble shuffle against unpacking to channel order and packing again, on every
    bit pattern of random words, and the docstring's word."""
    rng = np.random.default_rng(5)
    words = rng.integers(0, 1 << 32, (33, 70), dtype=np.uint64).astype(np.uint32).view(np.int32)
    got = relayout.awq_words_to_gptq(words)
    assert got.dtype == np.int32 and np.array_equal(got, pack(relayout.awq_fields(words), 4, 32,
                                                               axis=1))
    assert relayout.awq_words_to_gptq(np.array([[0x75316420]], np.uint32)).view(
        np.uint32)[0, 0] == 0x76543210


def test_awq_layout_matches_the_slow_writer():
    rng = np.random.default_rng(1)
    codes = rng.integers(0, 16, (5, 64)).astype(np.uint8)
    words = FGEN.awq_pack(codes)
    assert np.array_equal(relayout.awq_fields(words), codes)


@pytest.mark.usefixtures("both_loops")
@pytest.mark.parametrize("k,n", [(8, 8), (16, 24), (64, 1024), (2056, 56), (4096, 8)])
def test_awq_qweight_to_gptq_is_the_slow_relayout(k, n):
    """The word transpose (three delta swaps) against make_formats.py's writer and the
    unpack-permute-pack reading it replaces, on random codes of every channel and row."""
    rng = np.random.default_rng(k + n)
    codes = rng.integers(0, 16, (k, n)).astype(np.uint8)
    words = FGEN.awq_pack(codes).view(np.int32)
    got = relayout.awq_qweight_to_gptq(words)
    assert got.dtype == np.int32 and got.flags.c_contiguous
    assert np.array_equal(got, pack(codes, 4, 32, axis=0))
    assert np.array_equal(got, pack(relayout.awq_fields(words), 4, 32, axis=0))


@pytest.mark.usefixtures("both_loops")
@pytest.mark.parametrize("k,n", [(8, 8), (16, 24), (136, 1024), (2056, 56)])
def test_awq_qweight_transposed_is_the_transpose_of_the_relayout(k, n):
    """compressed-tensors' layout straight from AutoAWQ's words (one pass where compiled)."""
    rng = np.random.default_rng(k * n)
    codes = rng.integers(0, 16, (k, n)).astype(np.uint8)
    words = FGEN.awq_pack(codes).view(np.int32)
    got = relayout.awq_qweight_transposed(words)
    assert got.dtype == np.int32 and got.flags.c_contiguous
    assert np.array_equal(got, pack(codes, 4, 32, axis=0).T)
    with pytest.raises(ValueError, match=f"has {k - 4} rows; 4-bit GPTQ packs 8 rows"):
        relayout.awq_qweight_transposed(words[:k - 4])


@pytest.mark.usefixtures("both_loops")
def test_awq_qweight_to_gptq_in_blocks_on_threads():
    """Many blocks of rows (BLOCK at a time, on threads past PARALLEL_BYTES) give the words a
    single pass gives, on random words (every bit pattern, not only valid codes)."""
    rng = np.random.default_rng(7)
    words = rng.integers(0, 1 << 32, (8 * (relayout.BLOCK * 3 + 5), 700),
                         dtype=np.uint64).astype(np.uint32).view(np.int32)
    assert words.nbytes > relayout.PARALLEL_BYTES
    ref = pack(relayout.awq_fields(words), 4, 32, axis=0)
    assert np.array_equal(relayout.awq_qweight_to_gptq(words, workers=2), ref)
    assert np.array_equal(relayout.awq_qweight_to_gptq(words, workers=1), ref)
    assert np.array_equal(relayout.awq_qweight_transposed(words, workers=2), ref.T)
    # compared in place against the transpose: several row tiles and column blocks, threads
    other = np.ascontiguousarray(ref.T)
    compiled = native.available()
    flips = [(0, 0), (other.shape[0] - 1, other.shape[1] - 1), (8 * relayout.BLOCK + 3, 17),
             (5, relayout.BLOCK + 1)]
    for r, c in flips:
        other[r, c] ^= 1
    for workers in (1, 2):
        got = relayout.awq_qweight_differ(words, other, workers=workers)
        assert got == (len(flips) if compiled else None)
    # what an AWQ source falls back to without them: the laid-out words compared
    assert relayout.words_differ(ref, False, other, True) == len(flips)
    assert relayout.awq_qweight_differ(words, other[:-1]) == -1
    with pytest.raises(ValueError, match="12 rows"):
        relayout.awq_qweight_differ(words[:12], other)
    with pytest.raises(ValueError, match="12 rows"):
        relayout.awq_qweight_to_gptq(words[:12])


@pytest.mark.usefixtures("both_loops")
@needs_ct
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
def test_ct_words_are_gptq_words_transposed(bits):
    """pack_to_int32 (rows, and zero points along dim 0) gives GPTQ's words transposed."""
    rng = np.random.default_rng(bits)
    n, k, g = 64, 96, 3
    q = rng.integers(0, 1 << bits, (n, k))
    signed = torch.tensor(q - (1 << (bits - 1)), dtype=torch.int8)
    assert np.array_equal(pack_to_int32(signed, bits).numpy(),
                          relayout.transposed(pack(q.T.astype(np.uint8), bits, 32, axis=0)))
    z = rng.integers(0, 1 << bits, (n, g))
    zs = torch.tensor(z - (1 << (bits - 1)), dtype=torch.int8)
    assert np.array_equal(pack_to_int32(zs, bits, packed_dim=0).numpy(),
                          relayout.transposed(pack(z.T.astype(np.uint8), bits, 32, axis=1)))
    assert np.array_equal(FGEN.stream_rows(q, bits), pack_to_int32(signed, bits).numpy())


def test_ct_golden_word():
    """compressed-tensors' own example: signed [-8,-7,0,7,1,2,3,4] at 4 bits is 0xcba9f810."""
    signed = np.array([-8, -7, 0, 7, 1, 2, 3, 4])
    w = pack((signed + 8).astype(np.uint8)[:, None], 4, 32, axis=0)
    assert w.view(np.uint32)[0, 0] == 0xCBA9F810


@pytest.mark.parametrize("bits", range(2, 9))
def test_padded_rows_become_the_dense_rows(bits):
    """compressed-tensors 0.17's padded words, written by make_formats.py's slow writer, become
    the dense words its stream writer writes, along dim 1 (weight) and dim 0 (zero point)."""
    rng = np.random.default_rng(bits)
    q = rng.integers(0, 1 << bits, (300, 96))                        # [N, K]: 300 rows, 2 blocks
    dense = relayout.padded_to_dense(FGEN.padded_rows(q, bits), bits, 96, axis=1)
    assert np.array_equal(dense, FGEN.stream_rows(q, bits))
    z = rng.integers(0, 1 << bits, (3, 300))                         # [G, N], packed along N
    zp = np.ascontiguousarray(FGEN.padded_rows(z, bits).T)
    assert np.array_equal(relayout.padded_to_dense(zp, bits, 300, axis=0),
                          FGEN.stream_rows(z, bits).T)


def _awq_words(k: int, c: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 1 << 32, (k, c), dtype=np.uint64).astype(np.uint32).view(np.int32)


@pytest.mark.parametrize("rows,step,grain,phase,parts,nbytes", [
    (8 * 100, 8, 256, 0, 2, 4096), (8 * 100, 8, 256, 112, 2, 4096),
    (8 * 100, 8, 256, 8, 1, 1 << 30), (37, 1, 32, 0, 2, 64), (37, 1, 32, 31, 3, 64),
    (1, 1, 32, 5, 2, 1 << 20), (8 * 3, 8, 256, 0, 4, 16), (8 * 300, 8, 256, 248, 2, 1 << 20)])
def test_bands_cover_the_rows_in_order_in_whole_steps(rows, step, grain, phase, parts, nbytes):
    b = relayout.Banded((rows, 5), lambda out, r0, r1: None, step, grain, phase)
    bands = b.bands(parts, nbytes)
    spans = [s for band in bands for s in band]
    assert spans[0][0] == 0 and spans[-1][1] == rows
    assert all(a < b_ and b_ == c for (a, b_), (c, _) in zip(spans, spans[1:] + [(rows, 0)]))
    assert all(a % step == 0 for a, _ in spans)
    limit = b.band_rows(parts, nbytes)
    assert all(band[-1][1] - band[0][0] <= limit and len(band) <= parts for band in bands)
    # every cut inside the tensor is at phase + k grain: a thread gets whole tiles, each
    # starting where its source rows start a cache line
    assert all((a - phase) % grain == 0 for a, _ in spans[1:])


@pytest.mark.parametrize("offset", [0, 4, 56])
def test_the_line_phase_is_where_every_row_starts_a_line(offset):
    raw = np.zeros(64 * 40 + 64 + offset, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    a = raw[start:start + 64 * 40].view(np.int32).reshape(40, 16)   # rows one line apart
    p = relayout.line_phase(a)
    assert (a[:, p:].ctypes.data % 64 == 0) and p == (64 - offset) % 64 // 4
    assert relayout.line_phase(a, 8) == 8 * p
    assert relayout.line_phase(raw[:60 * 5].view(np.int32).reshape(5, 15)) == 0   # 60-byte rows
    assert relayout.line_phase(np.zeros((3, 5), np.int32)[:, ::2]) == 0   # not whole rows
    odd = raw[start + 2:start + 2 + 4 * 48].view(np.int32).reshape(3, 16)
    assert relayout.line_phase(odd) == 0   # words that straddle lines


@pytest.mark.usefixtures("both_loops")
@pytest.mark.parametrize("k,c", [(8 * 70, 75), (8, 1), (8 * 33, 40)])
def test_awq_bands_are_the_rows_of_the_transpose(k, c):
    """Each band, made alone into a buffer of its size, is those rows of the whole transpose;
    bands small enough that a tensor takes several, split for two threads."""
    words = _awq_words(k, c, k + c)
    # the slow reference: every code unpacked in channel order, packed as GPTQ, transposed
    want = np.ascontiguousarray(pack(relayout.awq_fields(words), 4, 32, axis=0).T)
    b = relayout.awq_qweight_bands(words)
    assert b.shape == want.shape and b.nbytes == want.nbytes
    got = np.full(want.shape, 7, np.int32)
    for band in b.bands(2, 4 * want.shape[1] * 8 * 32):
        for r0, r1 in band:
            out = np.full((r1 - r0, want.shape[1]), 7, np.int32)
            b.fill(out, r0, r1)
            got[r0:r1] = out
    assert np.array_equal(got, want)


@pytest.mark.usefixtures("both_loops")
@pytest.mark.parametrize("is_transposed", [False, True])
def test_bands_of_stored_words(is_transposed):
    rng = np.random.default_rng(3)
    words = rng.integers(-2**31, 2**31, (70, 45), dtype=np.int64).astype(np.int32)
    want = words if is_transposed else words.T
    b = relayout.bands_of(words, is_transposed)
    assert b.shape == want.shape
    assert np.array_equal(b.whole(workers=2), want)
    out = np.zeros((10, want.shape[1]), np.int32)
    b.fill(out, 33, 43)
    assert np.array_equal(out, want[33:43])
