"""What a module's data say about its zero points (gptqfmt/detection/stats.py): counts over every
qzeros field straight from the packed words against a slow field-by-field reference, the
statistics of the codes, and their quartiles by counting against a partition."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptqfmt.bits import swar
from gptqfmt.bits.packing import pack
from gptqfmt.detection import stats
from gptqfmt.detection.stats import FieldCounts, field_counts, zero_stats

COMBOS = [(b, w) for b in (2, 3, 4, 8) for w in (8, 16, 32, 64) if b != 3 or w == 32]


def reference(fields: np.ndarray, bits: int, word_bits: int) -> FieldCounts:
    """Field by field, word by word; the chance of runs as a full group x column matrix."""
    maxq = 2**bits - 1
    at = fields == maxq
    g, n = at.shape
    stored_maxq, stored_zero = int(at.sum()), int((fields == 0).sum())
    fpw = word_bits // bits
    if not stored_maxq or bits == 3 or fpw < 2:
        return FieldCounts(stored_maxq, stored_zero)
    run = max(2, min(4, fpw // 2))
    top = sum(all(at[r, w * fpw + j] for j in range(fpw - run, fpw))
              for r in range(g) for w in range(n // fpw))
    base = at.mean()
    p_col = (at.sum(axis=0) + 4 * base) / (g + 4)
    p_grp = (at.sum(axis=1) + 4 * base) / (n + 4)
    p = np.minimum(1.0, p_grp[:, None] * p_col[None, :] / base)
    expected = float(np.prod(p.reshape(g, -1, fpw)[:, :, fpw - run:], axis=2).sum())
    return FieldCounts(stored_maxq, stored_zero, top, expected)


def check(fields, bits, word_bits):
    packed = pack(fields, bits, word_bits, axis=1)
    got = field_counts(packed, bits, chance=True)
    want = reference(fields, bits, word_bits)
    assert (got.stored_maxq, got.stored_zero, got.top_runs) == \
        (want.stored_maxq, want.stored_zero, want.top_runs)
    assert got.top_runs_expected == pytest.approx(want.top_runs_expected, rel=1e-9, abs=1e-12)
    # inspect's cheaper call: the same runs, no field counts, chance only with 2 runs or more
    lazy = field_counts(packed, bits, counts=False)
    assert (lazy.stored_maxq, lazy.stored_zero, lazy.top_runs) == (None, None, want.top_runs)
    if bits == 3 or word_bits == bits:  # no runs to count: nothing left out
        assert lazy.top_runs_expected == got.top_runs_expected
    elif want.top_runs >= stats.RUNS_CHANCE_MIN:
        assert lazy.top_runs_expected == got.top_runs_expected
    else:
        assert lazy.top_runs_expected is None


def test_worked_example_of_the_docstring():
    # fields (low first) 7, F, F, 0, 0, F, 0, F
    qz = np.array([[0xF0F00FF7]], dtype=np.uint32).view(np.int32)
    f = field_counts(qz, 4)
    assert (f.stored_maxq, f.stored_zero, f.top_runs) == (4, 3, 0)
    # fields 0, 0, 0, 0, F, F, F, F: AutoGPTQ's run of four at the top
    f = field_counts(np.array([[0xFFFF0000]], dtype=np.uint32).view(np.int32), 4)
    assert (f.stored_maxq, f.stored_zero, f.top_runs) == (4, 4, 1)


@pytest.mark.parametrize(("bits", "word_bits"), COMBOS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_field_counts_match_the_reference(bits, word_bits, data):
    vpb = {3: 32}.get(bits, word_bits // bits if word_bits >= bits else 1)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    g = data.draw(st.integers(1, 40))
    n = vpb * data.draw(st.integers(1, 12))
    maxq = 2**bits - 1
    fields = rng.integers(0, maxq + 1, (g, n)).astype(np.uint8)
    fields[rng.random((g, n)) < data.draw(st.sampled_from([0.0, 0.05, 0.5, 1.0]))] = maxq
    fields[rng.random((g, n)) < data.draw(st.sampled_from([0.0, 0.1]))] = 0
    if data.draw(st.booleans()):  # AutoGPTQ's runs in some words
        fpw = max(1, word_bits // bits)
        for r, w in zip(rng.integers(0, g, 5), rng.integers(0, n // fpw if bits != 3 else 1, 5)):
            fields[r, w * fpw + fpw // 2: (w + 1) * fpw] = maxq
    chunk = data.draw(st.sampled_from([1, 7, 64, swar.CHUNK]))
    saved, swar.CHUNK = swar.CHUNK, chunk  # several chunks and partial sums
    try:
        check(fields, bits, word_bits)
    finally:
        swar.CHUNK = saved


def test_zero_stats_with_field_counts_from_the_words_equals_from_the_fields():
    """evidence passes only the read groups' fields plus FieldCounts of every field: the
    statistics must not change."""
    rng = np.random.default_rng(3)
    fields = rng.integers(0, 16, (16, 64)).astype(np.uint8)
    fields[2, 60:64] = 15
    sums = rng.integers(0, 2000, (16, 64)).astype(np.uint64)
    counts = np.zeros(16, np.int64)
    counts[[1, 5, 9]] = 128
    whole = stats.zero_stats(fields, sums, counts, 4, 32)
    read = np.flatnonzero(counts)
    part = stats.zero_stats(fields[read], sums[read], counts[read], 4, 32,
                             field_counts(pack(fields, 4, 32, axis=1), 4, chance=True),
                             row_index=read)
    assert whole == part
    assert whole.consistent_at  # where the maxq fields with high codes are, in [G, N]
    for flat in whole.consistent_at:
        g, n = divmod(flat, 64)
        assert fields[g, n] == 15 and counts[g] and 2 * sums[g, n] >= 15 * counts[g]


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(-2000, 2000), min_size=1, max_size=60))
def test_quartiles_by_counting_equal_quartiles_by_partition(values):
    """zero_stats counts integer numerators when every cell rests on the same number of codes:
    the counts must give the partition's quartiles, with the bounds measured or given (a span
    of at most 4000 always takes the counting path)."""
    from gptqfmt.detection.stats import _quartiles, _quartiles_of_integers
    k = np.array(values, dtype=np.int64)
    want = _quartiles(k.astype(np.float64))
    assert _quartiles_of_integers(k) == want
    assert _quartiles_of_integers(k, -2000, 2000) == want


@settings(max_examples=200, deadline=None)
@given(values=st.lists(st.integers(-2000, 2000), min_size=2, max_size=60), data=st.data())
def test_quartiles_with_positions_left_out(values, data):
    """zero_stats counts every cell and subtracts the few at 0 or maxq (`drop`): the same
    quartiles as the values without them, by counting (bounds given) and by partition (bounds
    too wide for counting, or measured)."""
    from gptqfmt.detection.stats import _quartiles, _quartiles_of_integers
    k = np.array(values, dtype=np.int64)
    drop = np.array(sorted(data.draw(st.sets(st.integers(0, len(k) - 1), min_size=1,
                                             max_size=len(k) - 1))), dtype=np.int64)
    want = _quartiles(np.delete(k, drop).astype(np.float64))
    assert _quartiles_of_integers(k, -2000, 2000, drop=drop) == want
    assert _quartiles_of_integers(k, -10**9, 10**9, drop=drop) == want
    assert _quartiles_of_integers(k, drop=drop) == want


def test_zero_stats_is_the_same_with_equal_and_unequal_code_counts():
    """The counting path (equal counts) and the partition path (unequal) on the same cells."""
    rng = np.random.default_rng(5)
    stored = rng.integers(0, 16, (8, 64)).astype(np.uint8)
    sums = (stored.astype(np.int64) + 1) * 32 + rng.integers(-16, 16, (8, 64))
    counts = np.full(8, 32)
    equal = zero_stats(stored, sums.astype(np.uint64), counts, 4, 32)
    # the same means with every count doubled in one group: the partition path
    sums2, counts2 = sums.copy(), counts.copy()
    sums2[0] *= 2
    counts2[0] *= 2
    unequal = zero_stats(stored, sums2.astype(np.uint64), counts2, 4, 32)
    assert equal.cells == unequal.cells == int(((stored > 0) & (stored < 15)).sum())
    assert equal.median == pytest.approx(unequal.median, abs=1e-6)
    assert equal.spread == pytest.approx(unequal.spread, abs=1e-6)
