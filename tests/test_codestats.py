"""Per-cell code sums (both paths, sampling) against a naive loop over channels."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptqfmt.gptq import codestats
from gptqfmt.gptq.codestats import read_cell_sums, sample_blocks, word_field_sums
from gptqfmt.gptq.packing import block, pack, unpack

COMBOS = [(b, w) for b in (2, 3, 4, 8) for w in (8, 16, 32, 64) if b != 3 or w == 32]


def naive(codes, g_idx, groups, channels):
    sums = np.zeros((groups, codes.shape[1]), np.int64)
    counts = np.zeros(groups, np.int64)
    for k in channels:
        sums[g_idx[k]] += codes[k]
        counts[g_idx[k]] += 1
    return sums, counts


@pytest.mark.parametrize(("bits", "word_bits"), COMBOS)
@settings(max_examples=15, deadline=None)
@given(data=st.data())
def test_cell_sums_match_naive(bits, word_bits, data):
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
    chunk = data.draw(st.sampled_from([1, 2 * n * wpb, codestats.CHUNK_WORDS]))
    saved, codestats.CHUNK_WORDS = codestats.CHUNK_WORDS, chunk
    try:
        read, sums, counts = read_cell_sums(qw, bits, g_idx, groups, sample)
    finally:
        codestats.CHUNK_WORDS = saved
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
