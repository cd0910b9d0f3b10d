"""Convention detection against the generator's ground truth, and the decision rules."""
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gptqfmt
from gptqfmt.formats.gptq.checkpoint import open_checkpoint
from gptqfmt.detection.codestats import read_cell_sums
from gptqfmt.bits.conventions import GPTQ, GPTQ_V2
from gptqfmt.detection.decide import AMBIGUOUS, ModuleVerdict, decide
from gptqfmt.detection.pool import combine
from gptqfmt.detection.stats import ZeroStats, zero_stats
from gptqfmt.detection.read import detect_checkpoint
from gptqfmt.bits.packing import pack
from tests.support import CKPT, GEN, MANIFEST, SPECS


@pytest.mark.parametrize("name", sorted(SPECS))
@pytest.mark.parametrize("full", [False, True], ids=["inspect", "verify"])
def test_verdict_is_the_data_convention(name, full):
    with open_checkpoint(CKPT / name) as ck:
        det = detect_checkpoint(ck, full=full)
    assert det.verdict == SPECS[name].convention, det.evidence
    assert 0.9 <= det.confidence <= 1.0


def signatures(name):
    with open_checkpoint(CKPT / name) as ck:
        return {s for v in detect_checkpoint(ck, full=True).modules for s in v.signatures}


def test_no_corruption_signature_on_clean_writers():
    for name, spec in SPECS.items():
        if spec.writer == "exact":
            assert signatures(name) == set(), name


@pytest.mark.parametrize(("name", "kind"), [
    ("autogptq-b4-asym-gptq", "autogptq_sign_extension"),
    ("autogptq-b2-asym-gptq", "autogptq_sign_extension"),  # structural: runs to the word top
    ("gptqmodel-b4-asym-gptq", "gptqmodel_borrow"),
    ("gptqmodel603-b3-asym-gptq", "gptqmodel_603_3bit"),
    ("gptqmodel603-b3-sym-gptq", "gptqmodel_603_3bit"),
])
def test_corruption_signatures_found(name, kind):
    assert kind in signatures(name)


def big_layer(bits, convention, seed, k=512, n=512, gs=64):
    """A larger asymmetric layer quantized by the fixture generator's quantizer."""
    rng = np.random.default_rng(seed)
    w = GEN.realistic_weight(rng, n, k)
    g_idx = GEN.assign_groups(k, gs, False, False, rng)
    codes, z, _ = GEN.quantize(w, bits, False, g_idx)
    maxq = 2**bits - 1
    stored = z if convention == GPTQ_V2 else (z - 1) & maxq
    return pack(codes, bits, 32, 0), stored.astype(np.uint8), g_idx, k // gs


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("convention", [GPTQ, GPTQ_V2])
def test_statistic_alone_decides_a_real_sized_asymmetric_layer(bits, convention):
    # at 8 bits a code step is small next to the spread of group means: it takes more cells
    qw, stored, g_idx, groups = big_layer(bits, convention, seed=bits,
                                          n=4096 if bits == 8 else 512)
    _, sums, counts = read_cell_sums(qw, bits, g_idx, groups)  # every row
    st = zero_stats(stored, sums, counts, bits, 32)
    expect = 1.0 if convention == GPTQ else 0.0
    assert abs(st.median - expect) < 0.35 and st.se < 0.125
    st.stored_maxq = st.wrapped = st.maxq_consistent = 0  # statistic only
    v = decide("m", bits, None, st)
    if bits < 8:
        assert v.verdict == convention and v.confidence > 0.999
        return
    # at 8 bits the weights' own skew (TAU) is a large part of a code step: one module alone
    # does not decide, its likelihood ratio points the right way, and a few modules decide
    assert v.verdict == AMBIGUOUS and (v.llr > 0) == (convention == GPTQ)
    det = combine([replace(v, name=f"m{i}") for i in range(4)])
    assert det.verdict == convention and det.confidence > 0.9999
    assert all(m.verdict == convention for m in det.modules)


def test_weak_evidence_is_ambiguous_with_reason():
    v = decide("m", 8, None, ZeroStats(cells=20, median=0.8, se=0.3))
    assert v.verdict == AMBIGUOUS and v.confidence == 0.0
    assert any("too little evidence" in e for e in v.evidence)


def test_codes_at_neither_position_are_ambiguous():
    v = decide("m", 4, None, ZeroStats(cells=5000, median=-3.0, se=0.01))
    assert v.verdict == AMBIGUOUS and any("away from either" in e for e in v.evidence)


def test_statistic_against_clamp_evidence_is_ambiguous():
    st = ZeroStats(cells=5000, median=0.02, se=0.01, stored_maxq=10, wrapped=10)
    v = decide("m", 4, None, st)
    assert v.verdict == AMBIGUOUS and any("but the stored 15" in e for e in v.evidence)


def test_symmetric_pattern_wins():
    assert decide("m", 4, GPTQ_V2, None).verdict == GPTQ_V2


def test_mislabelled_copies_are_detected_not_believed():
    for name in [n for n in SPECS if n.startswith("mislabelled")]:
        cf = gptqfmt.inspect(CKPT / name).to_json()["checkpoint_format"]
        assert cf["declared"] == MANIFEST[name]["declared"] != SPECS[name].convention
        assert cf["detected"] == SPECS[name].convention


def test_to_json_has_no_nan():
    st = ZeroStats()
    assert all(not (isinstance(v, float) and math.isnan(v)) for v in st.to_json().values())


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


def test_pooled_runs_keep_their_evidence_line_when_the_module_is_adopted():
    """Twelve small modules with 2 AutoGPTQ runs each (too few alone, 24 together): each carries
    the signature and the line that says why, also when it then takes the checkpoint's
    convention, which appends a line after it (validate reports the line from here)."""
    mods = [ModuleVerdict(f"m{i}", AMBIGUOUS, 0.0, [], ZeroStats(
        cells=100, median=0.9, se=0.05, top_runs=2, top_runs_expected=0.001), llr=2.0)
        for i in range(12)]
    det = combine(mods)
    assert det.verdict == GPTQ
    for v in det.modules:
        assert v.signatures == ["autogptq_sign_extension"]
        assert v.pooled_runs.startswith("2 qzeros words end in a run") and \
            v.pooled_runs in v.evidence
        assert v.verdict == GPTQ and v.evidence[-1] != v.pooled_runs  # adopted after it
