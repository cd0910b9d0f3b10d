"""Per-cell code sums (both paths, sampling) against a naive loop over channels."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptqfmt.bits import native
from gptqfmt.bits.packing import block, pack, unpack
from gptqfmt.detection import codestats
from gptqfmt.detection.codestats import read_cell_sums, sample_blocks, word_field_sums
from tests.support import loops

COMBOS = [(b, w) for b in (2, 3, 4, 8) for w in (8, 16, 32, 64) if b != 3 or w == 32]


def naive(codes, g_idx, groups, channels):
    sums = np.zeros((groups, codes.shape[1]), np.int64)
    counts = np.zeros(groups, np.int64)
    for k in channels:
        sums[g_idx[k]] += codes[k]
        counts[g_idx[k]] += 1
    return sums, counts


# the compiled loops take 2, 4 and 8 bits in 32-bit words: those run with them too
LOOPS = [(b, w, False) for b, w in COMBOS] + [
    pytest.param(b, w, True, marks=pytest.mark.skipif(not native.available(),
                                                      reason="gptqfmt.bits._native not built"))
    for b, w in COMBOS if w == 32 and b != 3]


@pytest.mark.parametrize(("bits", "word_bits", "compiled"), LOOPS)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_cell_sums_match_naive(bits, word_bits, compiled, data):
    """With the compiled loops (2/4/8 bits in 32-bit words, every row: they must take the
    case), and without."""
    vpb, wpb = block(bits, word_bits)
    nblocks = data.draw(st.integers(1, 6))
    k = nblocks * vpb
    n = data.draw(st.sampled_from([1, 3, 8]))
    gs = data.draw(st.sampled_from([v for v in (vpb, 2 * vpb, 32, 64, k) if v <= k]))
    groups = -(-k // gs)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    codes = rng.integers(0, 2**bits, (k, n)).astype(np.uint8)
    g_idx = np.arange(k) // gs
    if data.draw(st.booleans()):
        g_idx = rng.permutation(g_idx)  # act-order
    qw = pack(codes, bits, word_bits, axis=0)
    sample = None
    if data.draw(st.booleans()):
        sample = np.unique(rng.integers(0, nblocks, size=data.draw(st.integers(1, nblocks))))
    # chunks of one block or a few: gathers of scattered blocks and slices of contiguous ones
    chunk = data.draw(st.sampled_from([1, 2 * n * wpb, codestats.CHUNK]))
    saved, codestats.CHUNK = codestats.CHUNK, chunk
    took = []   # what the compiled loops answered: a result, or None (left to numpy)
    cell_sums = native.cell_sums

    def spy(*args):
        got = cell_sums(*args)
        took.append(got is not None)
        return got
    native.cell_sums = spy
    try:
        with loops(compiled):
            read, sums, counts = read_cell_sums(qw, bits, g_idx, groups, sample)
    finally:
        codestats.CHUNK = saved
        native.cell_sums = cell_sums
    # a sample is always numpy's; every row goes to the compiled loops, which take it there
    assert took == ([] if sample is not None else [compiled])
    chans = range(k) if sample is None else [b * vpb + i for b in sample for i in range(vpb)]
    want_s, want_c = naive(codes, g_idx, groups, chans)
    # only the groups some row was read of (all of them when nothing is sampled)
    want_read = np.arange(groups) if sample is None else np.flatnonzero(want_c)
    assert np.array_equal(read, want_read)
    assert np.array_equal(sums, want_s[read]) and np.array_equal(counts, want_c[read])


@pytest.mark.parametrize(("bits", "word_bits"), [c for c in COMBOS if c[0] != 3])
def test_word_field_sums_at_extremes(bits, word_bits):
    maxq = 2**bits - 1
    vpw = word_bits // bits
    codes = (np.array([[maxq] * vpw, [0] * vpw, list(range(vpw))]).T % (maxq + 1)).astype(np.uint8)
    words = pack(codes, bits, word_bits, axis=0)
    got = word_field_sums(words, bits)
    assert got.ravel().tolist() == unpack(words, bits, 0).sum(axis=0).tolist()


def test_sample_blocks_budget():
    b = sample_blocks(total_blocks=1000, n_cols=8192, wpb=1, budget_bytes=64 * 1024, word_bytes=4)
    assert len(b) == 2 and b[0] == 0 and b[-1] == 999
    assert sample_blocks(10, 1, 1, 10**9, 4).tolist() == list(range(10))


@pytest.mark.parametrize(("bits", "word_bits"),
                         [c for c in COMBOS if c[0] != 3 and 2 * c[0] <= c[1] <= 32])
@pytest.mark.parametrize("rows_per_group", [1, 2, 3, 16, 17, 34, 40])
@pytest.mark.parametrize("fill", ["random", "all ones"])
def test_group_sums_against_unpacked_codes(bits, word_bits, rows_per_group, fill):
    """verify's whole-group path: runs as long as the even fields' lanes hold (4-bit: 17 rows),
    groups of 17 and 34 rows (runs at the limit), of 3 and 40 (runs that must divide the
    group), words of every width at their maximum (every field maxq: each lane at its limit,
    and sum(x) past 32 bits), on a read-only mapping as files give it."""
    from gptqfmt.detection.codestats import group_sums

    rng = np.random.default_rng(bits * word_bits + rows_per_group)
    ut = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}[word_bits]
    words = rng.integers(0, 2**word_bits, (rows_per_group * 3, 5), dtype=np.uint64).astype(ut)
    if fill == "all ones":
        words[:] = np.iinfo(ut).max
    words = words.view(f"int{word_bits}")
    words.flags.writeable = False
    want = unpack(words, bits, axis=0).astype(np.int64).reshape(3, -1, 5).sum(axis=1)
    got = group_sums(words, bits, rows_per_group)
    assert got.dtype == np.uint64 and np.array_equal(got, want)


def test_channel_sorted_sums_worked_example_and_empty_groups():
    """The docstring's word, and a g_idx that leaves a group without channels (sums 0)."""
    from gptqfmt.detection.codestats import channel_sorted_sums

    words = np.array([[0x76543210]], dtype=np.uint32).view(np.int32)
    got = channel_sorted_sums(words, 4, np.array([1, 0, 1, 0, 1, 0, 1, 0]), 2)
    assert got.tolist() == [[16], [12]]
    got = channel_sorted_sums(words, 4, np.array([2, 0, 2, 0, 2, 0, 2, 2]), 3)
    assert got.tolist() == [[1 + 3 + 5], [0], [0 + 2 + 4 + 6 + 7]]
