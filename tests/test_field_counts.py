"""Counts over every qzeros field straight from the packed words (field_counts) against a
slow field-by-field reference, and the sampling policy's use of them."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptqfmt.bits import swar
from gptqfmt.bits.conventions import GPTQ
from gptqfmt.bits.packing import pack
from gptqfmt.detection import pool, stats
from gptqfmt.detection.decide import ModuleVerdict
from gptqfmt.detection.read import detect_sequential
from gptqfmt.detection.stats import FieldCounts, ZeroStats, field_counts
from tests.support import ROOT, load_script

PerModule = load_script(ROOT / "scripts" / "calibrate_detection.py").PerModule

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


def verdict(name, complete=False, inconsistent=False, llr=0.0):
    st = ZeroStats(cells=10, median=0.6, se=1.0)
    return ModuleVerdict(name, "ambiguous", 0.0, [], st, complete=complete,
                         inconsistent=inconsistent, llr=llr)


def test_sampling_rounds_skip_modules_that_fit_neither_and_stop_at_the_budget(monkeypatch):
    from gptqfmt.detection import read as evidence
    monkeypatch.setattr(evidence, "SAMPLE_BYTES", 10)
    monkeypatch.setattr(evidence, "EXTRA_BYTES", 100)
    reads = []

    def read(i, sample):
        reads.append((i, sample))
        return verdict(f"m{i}", inconsistent=(i == 0))
    det = detect_sequential(PerModule(read), [10**6] * 3, full=False)
    assert det.verdict == "ambiguous"
    first = [(i, 10) for i in range(3)]
    # module 0 fits neither convention: never read again; 1 and 2 grow 4x a round until
    # 100 bytes more are spent (40 + 40 in round 2, 160 for module 1 in round 3, then stop)
    assert reads == first + [(1, 40), (2, 40), (1, 160)]


def test_sampling_stops_when_the_pooled_evidence_decides(monkeypatch):
    from gptqfmt.detection import read as evidence
    monkeypatch.setattr(evidence, "SAMPLE_BYTES", 10)
    reads = []

    def read(i, sample):
        reads.append((i, sample))
        return verdict(f"m{i}", llr=0.0 if sample == 10 else 6.0)
    det = detect_sequential(PerModule(read), [10**6] * 2, full=False)
    assert det.verdict == GPTQ and reads == [(0, 10), (1, 10), (0, 40), (1, 40)]


def with_runs(name, top, expected=None):
    st = ZeroStats(cells=10, median=0.9, se=0.05, top_runs=top, top_runs_expected=expected)
    return ModuleVerdict(name, "ambiguous", 0.0, [], st, llr=2.0)


def test_pooled_runs_fill_in_the_chance_they_need():
    """inspect computes a module's runs by chance only when it has 2 runs or more; once the
    checkpoint's runs reach 10, the pooled test needs every module's, and asks for those left
    out (and only then)."""
    asked = []

    def chance(i):
        asked.append(i)
        return 0.001
    tops = [2, 2, 2, 2, 1, 1, 0]           # 10 runs: the pooled test runs
    mods = [with_runs(f"m{i}", t, 0.001 if t >= stats.RUNS_CHANCE_MIN else None)
            for i, t in enumerate(tops)]
    det = detect_sequential(PerModule(lambda i, s: mods[i], chance), [10] * len(mods), full=True)
    assert asked == [4, 5, 6]
    assert all(v.stats.top_runs_expected == 0.001 for v in det.modules)
    assert [v.signatures for v in det.modules] == [["autogptq_sign_extension"]] * 4 + [[]] * 3
    asked.clear()
    few = mods[2:]                          # 6 runs: no pooled test, nothing to read
    det = detect_sequential(PerModule(lambda i, s: few[i], chance), [10] * len(few), full=True)
    assert asked == [] and det.modules[-1].stats.top_runs_expected is None


def test_combine_refuses_pooled_runs_without_every_chance():
    mods = [with_runs(f"m{i}", 2, 0.001) for i in range(5)] + [with_runs("m5", 0)]
    assert pool.runs_chance_missing(mods) == [5]
    with pytest.raises(ValueError, match="runs_chance_missing"):
        pool.combine(mods)
    filled = pool.with_runs_chance(mods[5], 0.25)
    assert filled.stats.top_runs_expected == 0.25 and mods[5].stats.top_runs_expected is None
    assert pool.combine(mods[:5] + [filled]).verdict == GPTQ


def test_inspect_reads_every_modules_chance_when_the_pooled_test_needs_it(monkeypatch):
    """The I/O side of the fill: with the pooled test always on, inspect of AutoGPTQ's fixture
    gives every module its runs by chance, and the verdicts of the eager computation."""
    from gptqfmt.formats.gptq.checkpoint import open_checkpoint
    from gptqfmt.detection.read import detect_checkpoint
    from tests.support import CKPT
    path = CKPT / "autogptq-b4-asym-gptq"
    monkeypatch.setattr(pool, "POOLED_RUNS_MIN", 0)
    lazy = detect_checkpoint(open_checkpoint(path), jobs=1)
    assert all(v.stats.top_runs_expected is not None for v in lazy.modules if v.stats)
    monkeypatch.setattr(stats, "RUNS_CHANCE_MIN", 0)
    eager = detect_checkpoint(open_checkpoint(path), jobs=1)
    assert [v.to_json() for v in lazy.modules] == [v.to_json() for v in eager.modules]


def verdicts_without_stats(det):
    return det.to_json(), [{k: v for k, v in m.to_json().items() if k != "stats"}
                           for m in det.modules]


def test_leaving_out_the_chance_changes_no_verdict(monkeypatch):
    """Every shipped fixture: inspect's lazy runs by chance gives the verdicts, evidence and
    signatures that computing it for every module gives."""
    from gptqfmt.formats.gptq.checkpoint import open_checkpoint
    from gptqfmt.detection.read import detect_checkpoint
    from tests.support import CKPT
    paths = sorted(p for p in CKPT.iterdir() if p.is_dir())
    assert len(paths) > 50
    lazy = {p.name: verdicts_without_stats(detect_checkpoint(open_checkpoint(p), jobs=1))
            for p in paths}
    monkeypatch.setattr(stats, "RUNS_CHANCE_MIN", 0)
    for p in paths:
        eager = verdicts_without_stats(detect_checkpoint(open_checkpoint(p), jobs=1))
        assert lazy[p.name] == eager, p.name
