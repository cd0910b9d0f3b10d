"""One module's verdict from its evidence (gptqfmt/detection/decide.py): the statistic alone on a
real-sized layer, weak or contradicting evidence left undecided with the reason, and the
symmetric pattern."""
import math
from dataclasses import replace

import numpy as np
import pytest

from gptqfmt.bits.conventions import GPTQ, GPTQ_V2
from gptqfmt.bits.packing import pack
from gptqfmt.detection.codestats import read_cell_sums
from gptqfmt.detection.decide import AMBIGUOUS, decide
from gptqfmt.detection.pool import combine
from gptqfmt.detection.stats import ZeroStats, zero_stats
from tests.support import GEN


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


def test_to_json_has_no_nan():
    st = ZeroStats()
    assert all(not (isinstance(v, float) and math.isnan(v)) for v in st.to_json().values())
