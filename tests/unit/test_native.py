"""The compiled loops of kernels/gptq_sums.h (gptqfmt.bits._native) against the codes unpacked
one by one, the numpy loops' answers held equal to them, and verify's whole report equal with
and without them on every fixture."""
import sysconfig

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptqfmt.bits import native
from gptqfmt.bits.packing import pack, unpack
from gptqfmt.detection.codestats import read_cell_sums
from tests.support import CKPT, c_compiler, loops

BUILT = native.available()
needs_build = pytest.mark.skipif(not BUILT, reason="gptqfmt.bits._native was not built")


def slow_sums(qweight, bits, g_idx, groups):
    codes = unpack(qweight, bits, axis=0).astype(np.int64)
    out = np.zeros((groups, qweight.shape[1]), np.int64)
    np.add.at(out, np.asarray(g_idx), codes)
    return out


@needs_build
@pytest.mark.parametrize("bits", [2, 4, 8])
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_cell_sums_against_the_codes_one_by_one(bits, data):
    """Both loops: groups of whole rows (shorter than, equal to and longer than a lane's run
    of rows: 4-bit 17), and any g_idx (act-order, groups left empty); column counts across
    the tiles' edges; every field maxq (each lane at its limit) or random."""
    vpw = 32 // bits
    rows = data.draw(st.sampled_from([1, 2, 5, 16, 17, 34, 40, 64, 300]))  # 8-bit lanes: 257
    n = data.draw(st.sampled_from([1, 3, 17, 2048, 2049, 4100]))
    k = rows * vpw
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    words = rng.integers(0, 2**32, (rows, n), dtype=np.uint64).astype(np.uint32)
    if data.draw(st.booleans()):
        words[:] = 0xFFFFFFFF
    qweight = words.view(np.int32) if data.draw(st.booleans()) else words
    qweight.flags.writeable = False   # a read-only mapping, as a file gives it
    if data.draw(st.booleans()):   # groups of whole rows
        rpg = data.draw(st.integers(1, rows))   # a last group of fewer rows when it does
        g_idx = np.arange(k) // (rpg * vpw)     # not divide
        groups = -(-rows // rpg)
    else:
        rpg = None
        groups = data.draw(st.integers(1, k + 2))
        g_idx = rng.integers(0, groups, k)
    got = native.cell_sums(qweight, bits, g_idx, groups, rpg)
    assert got is not None and got[0].dtype == np.uint64
    assert np.array_equal(got[0], slow_sums(qweight, bits, g_idx, groups))
    assert got[1].tolist() == np.bincount(g_idx, minlength=groups).tolist()


@needs_build
@pytest.mark.parametrize("bits,lane", [(2, 5), (4, 17), (8, 257)])
def test_the_whole_rows_loop_at_its_lanes_limit(bits, lane):
    """Groups of whole rows, every field maxq, so each lane of the even and odd sums reaches
    exactly its limit (`lane` rows: (2^(2 bits) - 1) / maxq) before it is folded, and one row
    past it, across the four-rows-a-pass loop and its single-row tail. Called through the
    binding with no g_idx at all, so it is this loop that answers, not the scattered one."""
    from gptqfmt.bits import _native

    vpw = 32 // bits
    for rpg in sorted({3, 4, 5, lane, lane + 1, 2 * lane + 1}):
        for n in (3, 2049):
            rows = 2 * rpg
            words = np.full((rows, n), 0xFFFFFFFF, np.uint32)
            out = np.zeros((2, n), np.uint64)
            _native.cell_sums(words, rows, n, bits, np.zeros(0, np.int32), 2, rpg, out)
            g_idx = np.arange(rows * vpw) // (rpg * vpw)
            assert np.array_equal(out, slow_sums(words, bits, g_idx, 2)), (rpg, n)
            assert int(out[0, 0]) == rpg * vpw * (2 ** bits - 1)


@needs_build
@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_the_numpy_loops_give_the_same_cells(bits, act_order):
    rng = np.random.default_rng(bits)
    k, n, gs = 1024, 300, 128
    codes = rng.integers(0, 2**bits, (k, n)).astype(np.uint8)
    qweight = pack(codes, bits, 32, axis=0)
    g_idx = np.arange(k) // gs
    if act_order:
        g_idx = rng.permutation(g_idx)
    with loops(compiled=True):
        compiled = read_cell_sums(qweight, bits, g_idx, k // gs)
    with loops(compiled=False):
        plain = read_cell_sums(qweight, bits, g_idx, k // gs)
    for a, b in zip(compiled, plain):
        assert a.dtype == b.dtype and np.array_equal(a, b)


def test_the_cases_the_compiled_loops_leave_to_numpy():
    """None, for the numpy loops to do: 3 bits, words other than native 32-bit ones, a g_idx
    of another length or naming a group outside [0, groups), and GPTQFMT_NATIVE=0."""
    q = np.zeros((2, 4), np.int32)
    g = np.zeros(16, np.int64)
    assert native.cell_sums(pack(np.zeros((32, 4), np.uint8), 3, 32, axis=0), 3,
                            np.zeros(32, np.int64), 1, None) is None
    assert native.cell_sums(q.astype(np.int64), 4, g, 1, None) is None
    assert native.cell_sums(q.astype(">i4"), 4, g, 1, None) is None
    assert native.cell_sums(q, 4, g[:15], 1, None) is None
    assert native.cell_sums(q, 4, g + 1, 1, None) is None
    assert native.cell_sums(q, 4, g - 1, 1, None) is None
    with loops(compiled=False):
        assert not native.available()
        assert native.cell_sums(q, 4, g, 1, None) is None
    with loops(compiled=True):
        assert native.available() is BUILT
    odd = np.zeros(4 * 2 * 4 + 1, np.uint8)[1:].view(np.int32).reshape(4, 2)  # not aligned
    assert not odd.flags.aligned
    assert native.cell_sums(odd, 4, np.zeros(32, np.int64), 1, None) is None
    f16 = np.zeros(9, np.uint8)[1:].view(np.float16)
    assert native.largest_change(f16, "F16", np.zeros(4, np.int32)) is None
    assert native.largest_magnitude(f16, "F16") is None


@needs_build
@pytest.mark.parametrize(("args", "why"), [
    ((np.zeros(4, np.int32), 1, 4, 3, np.zeros(0, np.int32), 1, 1, np.zeros(4, np.uint64)),
     "bits must be 2, 4 or 8"),
    ((np.zeros(4, np.int32), 2, 4, 4, np.zeros(0, np.int32), 1, 2, np.zeros(4, np.uint64)),
     "qweight is not rows x n 32-bit words"),
    ((np.zeros(4, np.int32), 1, 4, 4, np.zeros(0, np.int32), 2, 1, np.zeros(4, np.uint64)),
     "out is not groups x n uint64"),
    ((np.zeros(8, np.int32), 2, 4, 4, np.zeros(0, np.int32), 2, 2, np.zeros(8, np.uint64)),
     "rows are not groups x rows_per_group"),
    ((np.zeros(4, np.int32), 1, 4, 4, np.zeros(7, np.int32), 1, 0, np.zeros(4, np.uint64)),
     "g_idx is not one int32 per input channel"),
    ((np.zeros(4, np.int32), 1, 4, 4, np.full(8, 1, np.int32), 1, 0, np.zeros(4, np.uint64)),
     "g_idx holds a group outside [0, groups)"),
    ((np.zeros(0, np.int32), 2**62, 1, 4, np.zeros(0, np.int32), 0, 0, np.zeros(0, np.uint64)),
     "qweight is not rows x n 32-bit words"),
])
def test_the_extension_checks_its_arguments(args, why):
    from gptqfmt.bits import _native

    with pytest.raises(ValueError) as e:
        _native.cell_sums(*args)
    assert str(e.value) == f"cell_sums: {why}"


def test_an_install_with_a_compiler_builds_the_compiled_loops():
    """setup.py marks the extension optional, so a failed build would go unnoticed but for
    this: where the tests' interpreter has a C compiler and its headers, the build must have
    given the extension (`pip install -e .` builds it in place)."""
    if c_compiler() is None:
        pytest.skip("no C compiler or no Python headers")
    with loops(compiled=True):
        assert native.available(), "gptqfmt.bits._native was not built: pip install -e ."


@needs_build
@pytest.mark.parametrize("name", sorted(p.name for p in CKPT.iterdir() if p.is_dir()))
def test_verify_reports_the_same_with_and_without_the_compiled_loops(name):
    from gptqfmt.ops.verify import validate

    with loops(compiled=True):
        compiled = validate(CKPT / name).to_json()
    with loops(compiled=False):
        plain = validate(CKPT / name).to_json()
    assert compiled == plain


def every_scale(dtype):
    """Every fp16 or bf16 bit pattern (subnormals, both zeros, infinities, NaNs), or float32
    values across the range with its specials, as the store holds them."""
    if dtype == "F32":
        rng = np.random.default_rng(32)
        bits = rng.integers(0, 2**32, 1 << 16, dtype=np.uint64).astype(np.uint32)
        special = np.array([0, 0x80000000, 1, 0x007FFFFF, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F800000,
                            0xFF800000, 0x7FC00000, 0x7F800001, 0x3F800000], np.uint32)
        return np.concatenate([bits, special]).view(np.float32)
    bits = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
    return bits.view(np.float16) if dtype == "F16" else bits


@needs_build
@pytest.mark.parametrize("dtype", ["F16", "BF16", "F32"])
def test_largest_change_and_magnitude_against_numpy(dtype):
    """The compiled pass against the numpy one (runtimes.verdicts), over every fp16 and bf16
    bit pattern and float32 with its specials: changes of 0 (no change, whatever the scale),
    negative ones, ones float32 rounds, and ones that overflow float32 with the largest bf16
    and float32 scales (left out, the others still count)."""
    from gptqfmt.runtimes.verdicts import finite_magnitudes, largest_change, largest_finite
    from gptqfmt.safetensors_io.dtypes import to_float32

    raw = every_scale(dtype)
    s32 = to_float32(raw, dtype)
    rng = np.random.default_rng(7)
    for dz in (rng.integers(-16, 17, raw.shape).astype(np.int32),
               np.where(rng.random(raw.shape) < 0.9, 0, 256).astype(np.int32),
               np.full(raw.shape, -1, np.int32),
               # changes float32 rounds (2^24 + 1, 2^31 - 1), either sign
               rng.choice(np.array([1 << 24, (1 << 24) + 1, (1 << 31) - 1, -(1 << 31) + 1,
                                    -(1 << 24) - 1], np.int32), raw.shape)):
        moved = dz != 0   # the plain formula: every moved cell's product, the finite ones
        with np.errstate(invalid="ignore", over="ignore"):
            oracle = largest_finite(s32[moved] * dz[moved].astype(np.float32))
        want = largest_change(finite_magnitudes(s32), dz.copy())
        assert want == oracle
        assert native.largest_change(raw, dtype, dz) == want
    assert native.largest_magnitude(raw, dtype) == largest_finite(s32)
    assert native.largest_change(raw[:0], dtype, np.zeros(0, np.int32)) == 0.0
    assert native.largest_magnitude(raw[:3].reshape(1, 3), dtype) == largest_finite(s32[:3])


def test_the_scales_the_compiled_pass_leaves_to_numpy():
    raw = np.ones(4, np.float16)
    dz = np.ones(4, np.int32)
    assert native.largest_change(raw, "F64", dz) is None
    assert native.largest_change(raw.astype(np.float32), "F16", dz) is None
    assert native.largest_change(raw, "F16", dz.astype(np.int64)) is None
    assert native.largest_change(raw, "F16", dz[:3]) is None
    assert native.largest_magnitude(raw, "BF16") is None   # bf16 arrives as uint16
    with loops(compiled=False):
        assert native.largest_change(raw, "F16", dz) is None
        assert native.largest_magnitude(raw, "F16") is None


@needs_build
def test_the_scale_passes_check_their_arguments():
    from gptqfmt.bits import _native

    f16, dz = np.zeros(4, np.float16), np.zeros(4, np.int32)
    cases = [
        (lambda: _native.largest_change(f16, 3, dz), "largest_change: kind must be 0, 1 or 2"),
        (lambda: _native.largest_change(f16, 0, dz), "largest_change: not one scale per dz"),
        (lambda: _native.largest_magnitude(f16, 5), "largest_magnitude: kind must be 0, 1 or 2"),
        (lambda: _native.largest_magnitude(f16[:3], 0), "largest_magnitude: not whole scales"),
    ]
    for call, why in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == why


SHAPES = [(1, 1), (3, 5), (4, 4), (16, 16), (17, 33), (64, 300), (130, 257)]


@needs_build
@pytest.mark.parametrize(("rows", "cols"), SHAPES)
def test_transposes_and_their_comparison_against_numpy(rows, cols):
    """The compiled transpose and transposed comparison (formats/relayout.py,
    ops/differences.py) against numpy's, on shapes with and without whole 4 x 4 blocks and
    tiles, a span of columns at a time, and words that differ in a few random places."""
    rng = np.random.default_rng(rows * cols)
    a = rng.integers(0, 2**32, (rows, cols), dtype=np.uint64).astype(np.uint32)
    out = np.full((cols, rows), 7, np.uint32)
    spans = [(0, cols)] if cols < 3 else [(0, 1), (1, cols // 2), (cols // 2, cols)]
    for c0, c1 in spans:   # each span into a buffer of its band alone
        band = np.full((c1 - c0, rows), 7, np.uint32)
        assert native.transpose(a.view(np.int32), band, c0, c1)
        out[c0:c1] = band
    assert np.array_equal(out, a.T)
    halves = a.astype(np.uint16).view(np.float16)   # fp16 scales, as bits
    out16 = np.zeros((cols, rows), np.float16)
    for c0, c1 in spans:
        assert native.transpose(halves, out16[c0:c1], c0, c1)
    assert np.array_equal(out16.view(np.uint16), halves.T.view(np.uint16))
    b = np.ascontiguousarray(a.T)
    flips = rng.integers(0, b.size, min(b.size, 9))
    b.reshape(-1)[flips] ^= 1
    want = int(np.count_nonzero(a.T != b))
    assert sum(native.transposed_differ(a, b, c0, c1) for c0, c1 in spans) == want
    b[::2] ^= 1   # every word of every other row as well: counts of whole blocks and tiles
    want = int(np.count_nonzero(a.T != b))
    assert sum(native.transposed_differ(a, b, c0, c1) for c0, c1 in spans) == want
    with loops(compiled=False):
        assert not native.transpose(a, out, 0, cols)
        assert native.transposed_differ(a, b, 0, cols) is None


@needs_build
@pytest.mark.parametrize("cols", [1, 3, 64])
def test_the_awq_nibble_transpose_against_numpy(cols):
    from gptqfmt.formats.relayout import AWQ_ORDER, awq_qweight_to_gptq

    rng = np.random.default_rng(cols)
    words = rng.integers(0, 2**32, (40, cols), dtype=np.uint64).astype(np.uint32).view(np.int32)
    with loops(compiled=False):
        want = awq_qweight_to_gptq(words)
    got = np.full((5, 8 * cols), 7, np.int32)
    assert native.awq_to_gptq(words, AWQ_ORDER, got, 0, 2)
    assert native.awq_to_gptq(words, AWQ_ORDER, got, 2, 5)
    assert np.array_equal(got, want)
    # straight to the transpose, and compared in place against it, a span at a time
    t = np.full((8 * cols, 5), 7, np.int32)
    halves = [(0, cols // 2), (cols // 2, cols)]
    for c0, c1 in halves:   # each span's band: its rows of the transpose, no more
        assert native.awq_to_transposed(words, AWQ_ORDER, t[8 * c0:8 * c1], c0, c1)
    assert np.array_equal(t, want.T)
    assert sum(native.awq_transposed_differ(words, AWQ_ORDER, t[8 * c0:8 * c1], c0, c1)
               for c0, c1 in halves) == 0
    t.reshape(-1)[[0, t.size - 1, t.size // 2]] ^= 1 << 30
    assert sum(native.awq_transposed_differ(words, AWQ_ORDER, t[8 * c0:8 * c1], c0, c1)
               for c0, c1 in halves) == 3
    with loops(compiled=False):
        assert native.awq_transposed_differ(words, AWQ_ORDER, t, 0, cols) is None
    # the docstring's worked example
    rows = np.array([[0x75316420 + 0x11111111 * k] for k in range(8)], np.uint32)
    one = np.zeros((1, 8), np.uint32)
    assert native.awq_to_gptq(rows, AWQ_ORDER, one, 0, 1)
    assert hex(int(one[0, 3])) == "0xa9876543"


# (rows, word columns): the AWQ tiles are 32 row blocks by 32 word columns, vectors of 8
# columns within a tile, 4 x 4 blocks of the transpose (8 row blocks by 32 word columns, 8 x 8
# blocks, where the CPU has AVX2): whole tiles, one past, and tails of each
AWQ_SHAPES = [(8 * 32, 32), (8 * 37, 43), (8 * 65, 70), (8, 9), (8 * 33, 1), (8 * 3, 5),
              (8 * 5, 100)]


@needs_build
@pytest.mark.parametrize("rows,cols", AWQ_SHAPES)
def test_the_awq_transpose_at_tile_edges(rows, cols):
    """Straight into bands of the transpose and compared with them, over spans that start and
    end inside tiles, against numpy; every word that differs is counted, in every span."""
    from gptqfmt.formats.relayout import AWQ_ORDER, awq_qweight_to_gptq

    rng = np.random.default_rng(rows + cols)
    words = rng.integers(0, 2**32, (rows, cols), dtype=np.uint64).astype(np.uint32)
    with loops(compiled=False):
        want = np.ascontiguousarray(awq_qweight_to_gptq(words.view(np.int32)).T)
    cuts = sorted({0, cols, min(cols, 1), cols // 3, min(cols, 33)})
    spans = list(zip(cuts, cuts[1:]))
    got = np.full(want.shape, 7, np.int32)
    for c0, c1 in spans:
        band = np.full((8 * (c1 - c0), rows // 8), 7, np.int32)   # a buffer of the band alone
        assert native.awq_to_transposed(words, AWQ_ORDER, band, c0, c1)
        got[8 * c0:8 * c1] = band
    assert np.array_equal(got, want)
    flips = rng.choice(got.size, min(got.size, 40), replace=False)
    got.reshape(-1)[flips] ^= 1 << 17
    assert sum(native.awq_transposed_differ(words, AWQ_ORDER, got[8 * c0:8 * c1], c0, c1)
               for c0, c1 in spans) == len(flips)


def test_the_relayouts_the_compiled_loops_leave_to_numpy():
    a = np.zeros((4, 8), np.int32)
    odd = np.zeros(4 * 8 * 4 + 1, np.uint8)[1:].view(np.int32).reshape(4, 8)
    assert not native.transpose(odd, np.zeros((8, 4), np.int32), 0, 8)     # not aligned
    square = np.zeros((4, 4), np.int32)
    assert not native.transpose(square, square, 0, 4)                      # over itself
    assert not native.transpose(a, np.zeros((4, 8), np.int32), 0, 8)      # not a's transpose
    assert not native.transpose(a, np.zeros((8, 4), np.int32), 0, 4)      # nor its band
    assert not native.transpose(a, np.zeros((8, 4), np.int64), 0, 8)
    assert not native.transpose(a, np.zeros((8, 4), np.int16), 0, 8)       # other widths
    assert not native.transpose(a.astype(np.int64), np.zeros((8, 4), np.int64), 0, 8)
    assert not native.transpose(a[:, ::2], np.zeros((4, 4), np.int32), 0, 4)  # not C order
    ro = np.zeros((8, 4), np.int32)
    ro.flags.writeable = False
    assert not native.transpose(a, ro, 0, 8)
    assert native.transposed_differ(a, np.zeros((4, 8), np.int32), 0, 8) is None
    assert not native.awq_to_gptq(np.zeros((12, 1), np.int32), (0, 2, 4, 6, 1, 3, 5, 7),
                                  np.zeros((1, 8), np.int32), 0, 1)        # rows not 8k
    awq = np.zeros((8, 2), np.int32)    # the whole transpose for one column's band
    assert not native.awq_to_transposed(awq, (0, 2, 4, 6, 1, 3, 5, 7), np.zeros((16, 1),
                                                                                np.int32), 0, 1)


@needs_build
def test_the_relayout_loops_check_their_arguments():
    from gptqfmt.bits import _native

    w = np.zeros((8, 2), np.int32)
    order = np.arange(8, dtype=np.intc)
    cases = [
        (lambda: _native.transpose(w, 8, 2, np.zeros(16, np.int32), 1, 3, 4),
         "transpose: columns [1, 3) of 8 x 2"),
        (lambda: _native.transpose(w, 8, 2, np.zeros(15, np.int32), 0, 2, 4),
         "transpose: dst is not the rows [c0, c1) of the transpose"),
        (lambda: _native.transpose(w, 8, 2, np.zeros(16, np.int32), 1, 2, 4),
         "transpose: dst is not the rows [c0, c1) of the transpose"),
        (lambda: _native.transpose(w, 8, 2, np.zeros(16, np.int32), 0, 2, 8),
         "transpose: itemsize must be 2 or 4"),
        # sizes whose product wraps to the buffers' length (0) must not pass for it
        (lambda: _native.transpose(np.zeros(0, np.int32), 2**62, 1, np.zeros(0, np.int32), 0,
                                   1, 4), "transpose: src is not rows x cols"),
        (lambda: _native.transposed_differ(np.zeros(0, np.int32), 2**62, 4,
                                           np.zeros(0, np.int32), 0, 4),
         "transposed_differ: a and b are not rows x cols words"),
        (lambda: _native.transposed_differ(w, 8, 2, np.zeros(16, np.int32), 2, 1),
         "transposed_differ: columns [2, 1) of 8 x 2"),
        (lambda: _native.transposed_differ(w, 4, 2, w, 0, 2),
         "transposed_differ: a and b are not rows x cols words"),
        (lambda: _native.awq_relayout(w, 8, 2, np.zeros(8, np.intc), np.zeros(16, np.int32),
                                      0, 1, 0),
         "awq_relayout: order is not a permutation of 0..7"),
        (lambda: _native.awq_relayout(w, 8, 2, order[:7], np.zeros(16, np.int32), 0, 1, 1),
         "awq_relayout: order is not a permutation of 0..7"),
        (lambda: _native.awq_relayout(w[:6], 6, 2, order, np.zeros(12, np.int32), 0, 1, 1),
         "awq_relayout: 6 rows, not whole blocks of 8"),
        (lambda: _native.awq_relayout(w, 8, 2, order, np.zeros(16, np.int32), 0, 2, 0),
         "awq_relayout: row blocks [0, 2) of 1"),
        (lambda: _native.awq_relayout(w, 8, 2, order, np.zeros(16, np.int32), 0, 3, 2),
         "awq_relayout: word columns [0, 3) of 2"),
        (lambda: _native.awq_relayout(w, 8, 2, order, np.zeros(8, np.int32), 0, 1, 0),
         "awq_relayout: dst is not rows x cols words"),
        # modes 1 and 2: dst is the band of the transpose that [lo, hi) makes, no more
        (lambda: _native.awq_relayout(w, 8, 2, order, np.zeros(16, np.int32), 0, 1, 1),
         "awq_relayout: dst is not the rows [8 lo, 8 hi) of the transpose"),
        (lambda: _native.awq_relayout(w, 8, 2, order, np.zeros(8, np.int32), 0, 2, 2),
         "awq_relayout: dst is not the rows [8 lo, 8 hi) of the transpose"),
        (lambda: _native.awq_relayout(np.zeros(0, np.int32), 2**62, 2, order,
                                      np.zeros(0, np.int32), 0, 1, 0),
         "awq_relayout: src is not rows x cols words"),
        (lambda: _native.awq_relayout(w, 8, 2, order, np.zeros(16, np.int32), 0, 1, 3),
         "awq_relayout: mode must be 0, 1 or 2"),
        (lambda: _native.awq_relayout(w, 8, 2, order, bytes(64), 0, 1, 1),
         "awq_relayout: dst is read-only"),
    ]
    for call, why in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == why


@needs_build
def test_the_plain_c_loops_without_simd(tmp_path):
    """The extension built with GQ_NO_SIMD (the loops a compiler without SSE2 runs) against
    numpy: transposes and transposed comparisons with tile and block edges, every bit
    width's cell sums and interior histogram; and the built extension is the version
    native.py is written for."""
    import importlib.util
    import subprocess

    from gptqfmt.bits import _native
    from gptqfmt.resources import data_dir

    assert _native.VERSION == native.VERSION
    cc = c_compiler()
    assert cc is not None   # the extension was built, so the compiler is at hand
    kernels = data_dir("kernels")
    so = tmp_path / "_native.so"
    subprocess.run([cc, "-O2", "-shared", "-fPIC", "-DGQ_NO_SIMD", "-I", str(kernels), "-I",
                    sysconfig.get_paths()["include"], str(kernels / "native_module.c"), "-o",
                    str(so)], check=True)
    spec = importlib.util.spec_from_file_location("_native", so)
    assert spec is not None and spec.loader is not None
    plain = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(plain)
    rng = np.random.default_rng(11)
    for rows, cols in SHAPES:
        a = rng.integers(0, 2**32, (rows, cols), dtype=np.uint64).astype(np.uint32)
        out = np.zeros((cols, rows), np.uint32)
        half = cols // 2
        plain.transpose(a, rows, cols, out[:half], 0, half, 4)
        band = np.zeros((cols - half, rows), np.uint32)   # the rest, into its band alone
        plain.transpose(a, rows, cols, band, half, cols, 4)
        out[half:] = band
        assert np.array_equal(out, a.T)
        out.reshape(-1)[::7] ^= 1
        want = int(np.count_nonzero(out != a.T))
        assert plain.transposed_differ(a, rows, cols, out, 0, cols) == want
    from gptqfmt.formats.relayout import AWQ_ORDER, awq_qweight_to_gptq

    order = np.asarray(AWQ_ORDER, dtype=np.intc)
    for rows, cols in AWQ_SHAPES:
        w = rng.integers(0, 2**32, (rows, cols), dtype=np.uint64).astype(np.uint32)
        with loops(compiled=False):
            want = np.ascontiguousarray(awq_qweight_to_gptq(w.view(np.int32)).T)
        got = np.zeros_like(want)
        half = cols // 2
        plain.awq_relayout(w, rows, cols, order, got[:8 * half], 0, half, 1)
        plain.awq_relayout(w, rows, cols, order, got[8 * half:], half, cols, 1)
        assert np.array_equal(got, want)
        got.reshape(-1)[::5] ^= 1
        assert plain.awq_relayout(w, rows, cols, order, got, 0, cols, 2) == \
            got.reshape(-1)[::5].size
    for bits in (2, 4, 8):
        q = rng.integers(0, 2**32, (40, 9), dtype=np.uint64).astype(np.uint32)
        g = np.arange(40 * 32 // bits) // (32 // bits * 8)
        got = np.zeros((5, 9), np.uint64)
        plain.cell_sums(q, 40, 9, bits, np.zeros(0, np.int32), 5, 8, got)
        assert np.array_equal(got, slow_sums(q, bits, g, 5))
        scattered = rng.permutation(g).astype(np.int32)   # act-order: each channel's group
        got[:] = 0
        plain.cell_sums(q, 40, 9, bits, scattered, 5, 0, got)
        assert np.array_equal(got, slow_sums(q, bits, scattered, 5))
        maxq, c = (1 << bits) - 1, 16
        stored = rng.integers(0, maxq + 1, 300).astype(np.uint8)
        sums = rng.integers(0, maxq * c + 1, 300).astype(np.uint64)
        hist = np.zeros(2 * maxq * c + 1, np.int64)
        cells = plain.interior_histogram(stored, sums, c, maxq, hist)
        want, n = slow_interior_histogram(stored, sums, c, maxq)
        assert cells == n and np.array_equal(hist, want)


def slow_interior_histogram(stored, sums, c, maxq):
    """interior_histogram's answer, one cell at a time."""
    hist = np.zeros(2 * maxq * c + 1, np.int64)
    cells = 0
    for s, t in zip(stored.reshape(-1).tolist(), sums.reshape(-1).tolist()):
        if 0 < s < maxq:
            hist[t - c * s + maxq * c] += 1
            cells += 1
    return hist, cells


@needs_build
@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("c", [1, 8, 128])
def test_interior_histogram_against_the_cells_one_by_one(bits, c):
    """The compiled count of k = sum - c x stored over the interior cells, against a loop
    over the cells: every stored value (0 and maxq left out), sums from 0 to maxq x c (the
    histogram's two ends included)."""
    maxq = (1 << bits) - 1
    rng = np.random.default_rng(bits * 1000 + c)
    stored = rng.integers(0, maxq + 1, (24, 40)).astype(np.uint8)
    sums = rng.integers(0, maxq * c + 1, (24, 40)).astype(np.uint64)
    sums[0, :3] = [0, maxq * c, maxq * c]
    stored[0, :3] = [maxq - 1, 1, maxq - 1]
    hist, cells = native.interior_histogram(stored, sums, c, maxq)
    want, n = slow_interior_histogram(stored, sums, c, maxq)
    assert cells == n and np.array_equal(hist, want)


@needs_build
@pytest.mark.parametrize("bits", [2, 4, 8])
def test_zero_stats_with_and_without_the_compiled_count(bits, monkeypatch):
    """zero_stats' quartiles from the compiled histogram and from numpy's counting, on cells
    whose means sit around their stored zero (a clean module), around another (a shifted one),
    and with some groups unread; the compiled count is taken each time it may be."""
    from gptqfmt.detection.stats import zero_stats

    taken = []
    real = native.interior_histogram

    def counted(*args):
        got = real(*args)
        taken.append(got is not None)
        return got
    monkeypatch.setattr(native, "interior_histogram", counted)
    maxq = (1 << bits) - 1
    rng = np.random.default_rng(bits)
    c, n = 64, 1024   # cells enough that 8 bits' 2 x 255 x 64 bins are counted too
    stored = rng.integers(0, maxq + 1, (16, n)).astype(np.uint8)
    for shift in (0, 1):
        codes = np.clip(stored[:, None, :].astype(np.int64) + shift +
                        rng.integers(-2, 3, (16, c, n)), 0, maxq)
        sums = codes.sum(axis=1).astype(np.uint64)
        for counts in (np.full(16, c, np.int64), np.where(np.arange(16) % 3, c, 0)):
            with loops(compiled=True):
                got = zero_stats(stored, sums, counts, bits, 32)
            with loops(compiled=False):
                want = zero_stats(stored, sums, counts, bits, 32)
            assert got == want and got.cells > 0
    assert taken == [True, False] * 4   # compiled, then numpy: both counted, never the same way


def slow_has_field(words: np.ndarray, bits: int, value: int) -> bool:
    """Any field of the words' bytes equal to `value`, one field at a time."""
    top = (1 << bits) - 1
    return any((b >> s) & top == value for b in words.view(np.uint8).reshape(-1).tolist()
               for s in range(0, 8, bits))


@needs_build
@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("dtype", ["<i4", "<u4", "<i8", "<i2", "|u1", ">i4"])
def test_has_field_against_the_fields_one_by_one(bits, dtype):
    """Words of every width and byte order, of lengths around the 8-byte steps and the 4 KiB
    checks, with no hit, one hit at every kind of place (first byte, last byte, the tail past
    the last whole superword, past the first check), or many; the compiled pass, the numpy
    loop and the fields one by one agree."""
    from gptqfmt.bits import swar

    rng = np.random.default_rng(bits)
    top = (1 << bits) - 1
    item = np.dtype(dtype).itemsize
    fill = {2: 0x66, 4: 0x67, 8: 0x67}[bits]   # no field 0 or maxq at any width
    for nbytes in sorted({0, item, 8, 16, 24, 4096 - item, 4096, 4104, 8200}):
        nbytes -= nbytes % item
        for value in (0, top):
            hit_byte = 0x00 if value == 0 else 0xFF
            places = [None] + ([0, nbytes - 1, nbytes // 2] if nbytes else [])
            for at in places:
                raw = np.full(nbytes, fill, np.uint8)
                if at is not None:
                    raw[at] = hit_byte
                words = raw.view(np.dtype(dtype))
                want = slow_has_field(words, bits, value)
                assert want == (at is not None)
                assert native.has_field(words, bits, value != 0) is want
                with loops(compiled=False):
                    assert swar.has_field(words, bits, value) is want
            noisy = rng.integers(0, 256, nbytes, dtype=np.uint8).view(np.dtype(dtype))
            assert native.has_field(noisy, bits, value != 0) == slow_has_field(noisy, bits, value)


@needs_build
def test_has_field_worked_example():
    w = np.array([0x8888F037], np.uint32)
    assert native.has_field(w, 4, False) and native.has_field(w, 4, True)
    w = np.array([0x88888837], np.uint32)
    assert not native.has_field(w, 4, False) and not native.has_field(w, 4, True)


@needs_build
@pytest.mark.parametrize("dtype", ["<u1", "<i2", "<u4", "<i4", "<u8", "<i8"])
def test_differ_by_against_numpy(dtype):
    rng = np.random.default_rng(5)
    item = np.dtype(dtype).itemsize
    mod = 1 << (8 * item)
    for n in (0, 1, 7, 8, 33, 4099):
        a = rng.integers(0, 256, n * item, dtype=np.uint8).view(np.dtype(dtype))
        d = int(rng.integers(0, mod, dtype=np.uint64)) if item < 8 else 0x1111111111111111
        b = (a.view(f"u{item}").astype(object) + d) % mod
        b = np.array(b.tolist(), dtype=f"u{item}").view(np.dtype(dtype)) if n else a.copy()
        assert native.differ_by(a, b, d) is True
        assert native.differ_by(a, b, d + 1) is (n == 0)
        if n:
            b2 = b.copy()
            b2.view(np.uint8)[-1] ^= 1   # one byte of the last element off
            assert native.differ_by(a, b2, d) is False
    # the worked example: wrapping at the width
    assert native.differ_by(np.array([0x37, 0xFFFFFFFF], np.uint32),
                            np.array([0x48, 0x10], np.uint32), 0x11) is True


@needs_build
@pytest.mark.parametrize("dtype", ["F16", "BF16", "F32"])
def test_magnitude_range_and_the_scales_check_against_numpy(dtype):
    """finite_nonzero_absmax with the compiled pass and with numpy's reductions: every kind
    of value that makes it None (either zero, either infinity, NaN) at the first, the last and
    a middle place, subnormals, the largest finite value, either sign."""
    from gptqfmt.safetensors_io.dtypes import finite_nonzero_absmax

    u = np.uint32 if dtype == "F32" else np.uint16
    bad = {"F16": [0x0000, 0x8000, 0x7C00, 0xFC00, 0x7E00],
           "BF16": [0x0000, 0x8000, 0x7F80, 0xFF80, 0x7FC0],
           "F32": [0, 0x80000000, 0x7F800000, 0xFF800000, 0x7FC00000]}[dtype]
    edge = {"F16": [0x0001, 0x7BFF, 0xFBFF], "BF16": [0x0001, 0x7F7F, 0xFF7F],
            "F32": [1, 0x7F7FFFFF, 0xFF7FFFFF]}[dtype]
    rng = np.random.default_rng(1)
    top = 0x7BFF if dtype == "F16" else 0x7F7F if dtype == "BF16" else 0x7F7FFFFF
    base = rng.integers(1, top, 1001, dtype=np.uint64).astype(u)
    base[::3] |= u(0x8000 if u is np.uint16 else 0x80000000)   # negative ones too
    cases = [base, np.array(edge, u), base[:1]]
    for v in bad:
        for at in (0, 500, 1000):
            c = base.copy()
            c[at] = v
            cases.append(c)
    for c in cases:
        raw = c.view(np.float16) if dtype == "F16" else c.view(np.float32) if dtype == "F32" \
            else c
        with loops(compiled=True):
            fast = finite_nonzero_absmax(raw, dtype)
        with loops(compiled=False):
            slow = finite_nonzero_absmax(raw, dtype)
        assert fast == slow
        mag = c & u(0x7FFF if u is np.uint16 else 0x7FFFFFFF)
        assert native.magnitude_range(c) == (int(mag.min()), int(mag.max()))


def test_the_bit_passes_the_compiled_loops_leave_to_numpy():
    """None where the case is not the compiled loops': turned off, widths or layouts they do
    not take."""
    w = np.arange(16, dtype=np.uint32)
    with loops(compiled=False):
        assert native.has_field(w, 4, True) is None
        assert native.differ_by(w, w, 0) is None
        assert native.magnitude_range(w.view(np.uint16)) is None
    if not BUILT:
        return
    assert native.has_field(w, 3, True) is None                   # fields straddle bytes
    assert native.has_field(w.reshape(4, 4)[:, ::2], 4, True) is None   # not C order
    assert native.differ_by(w, w.astype(np.int32), 0) is None      # other dtypes
    assert native.differ_by(w, w[:8], 0) is None                   # other shapes
    assert native.differ_by(w.astype(">u4"), w.astype(">u4"), 0) is None   # byte order
    assert native.magnitude_range(w.view(np.uint8)) is None        # one-byte values
    assert native.magnitude_range(w[:0]) is None                   # none
    st, sm = np.ones((2, 4), np.uint8), np.ones((2, 4), np.uint64)
    assert native.interior_histogram(st, sm, 2, 15) is not None
    assert native.interior_histogram(st.astype(np.int32), sm, 2, 15) is None   # not uint8
    assert native.interior_histogram(st, sm.astype(np.int64), 2, 15) is None   # not uint64
    assert native.interior_histogram(st, sm[:, :2], 2, 15) is None             # other shapes
    assert native.interior_histogram(st.T, sm.T, 2, 15) is None                # not C order
    assert native.interior_histogram(st, sm + 30, 2, 15) is None   # not the sum of 2 codes
    odd = np.zeros(8 * 8 + 1, np.uint8)[1:].view(np.uint64).reshape(2, 4)
    assert native.interior_histogram(st, odd, 2, 15) is None       # sums not aligned


@needs_build
def test_the_bit_passes_check_their_arguments():
    from gptqfmt.bits import _native

    cases = [
        (lambda: _native.has_field(b"\0" * 4, 3, 1), "has_field: bits must be 2, 4 or 8"),
        (lambda: _native.magnitude_range(b"\0" * 4, 8),
         "magnitude_range: width must be 2 or 4"),
        (lambda: _native.magnitude_range(b"\0" * 3, 2), "magnitude_range: not whole values"),
        (lambda: _native.same_difference(b"\0" * 4, b"\0" * 8, 4),
         "same_difference: buffers of different lengths or not whole elements"),
        (lambda: _native.same_difference(b"\0" * 4, b"\0" * 4, 3),
         "same_difference: size must be 1, 2, 4 or 8"),
        (lambda: _native.interior_histogram(b"\0", b"\0" * 8, 0, 15, bytearray(8)),
         "interior_histogram: c >= 1 and 1 <= maxq <= 255"),
        (lambda: _native.interior_histogram(b"\0", b"\0" * 8, 1, 256, bytearray(8)),
         "interior_histogram: c >= 1 and 1 <= maxq <= 255"),
        (lambda: _native.interior_histogram(b"\0", b"\0" * 8, 1, 15, bytearray(8 * 30)),
         "interior_histogram: one sum per cell and 2 maxq c + 1 bins"),
        (lambda: _native.interior_histogram(b"\0" * 2, b"\0" * 8, 1, 15, bytearray(8 * 31)),
         "interior_histogram: one sum per cell and 2 maxq c + 1 bins"),
    ]
    for call, why in cases:
        with pytest.raises(ValueError) as e:
            call()
        assert str(e.value) == why
