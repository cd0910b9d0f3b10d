"""The checkpoint's convention from every module's verdict (gptqfmt/detection/pool.py): AutoGPTQ's
runs pooled over the modules, and what the pooled test needs of each."""

import pytest

from gptqfmt.bits.conventions import GPTQ
from gptqfmt.detection import pool, stats
from gptqfmt.detection.decide import AMBIGUOUS, ModuleVerdict
from gptqfmt.detection.pool import combine
from gptqfmt.detection.read import detect_checkpoint, detect_sequential
from gptqfmt.detection.stats import ZeroStats
from gptqfmt.formats.gptq.checkpoint import open_checkpoint
from tests.support import CKPT, ROOT, load_script

PerModule = load_script(ROOT / "scripts" / "calibrate_detection.py").PerModule


def verdict(name, complete=False, inconsistent=False, llr=0.0):
    st = ZeroStats(cells=10, median=0.6, se=1.0)
    return ModuleVerdict(name, "ambiguous", 0.0, [], st, complete=complete,
                         inconsistent=inconsistent, llr=llr)


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
    det = detect_sequential(PerModule(lambda i, s: mods[i], chance), len(mods), lambda i: 10,
                            full=True)
    assert asked == [4, 5, 6]
    assert all(v.stats.top_runs_expected == 0.001 for v in det.modules)
    assert [v.signatures for v in det.modules] == [["autogptq_sign_extension"]] * 4 + [[]] * 3
    asked.clear()
    few = mods[2:]                          # 6 runs: no pooled test, nothing to read
    det = detect_sequential(PerModule(lambda i, s: few[i], chance), len(few), lambda i: 10,
                            full=True)
    assert asked == [] and det.modules[-1].stats.top_runs_expected is None


def test_combine_refuses_pooled_runs_without_every_chance():
    mods = [with_runs(f"m{i}", 2, 0.001) for i in range(5)] + [with_runs("m5", 0)]
    assert pool.runs_chance_missing(mods) == [5]
    with pytest.raises(ValueError, match="runs_chance_missing"):
        pool.combine(mods)
    filled = pool.with_runs_chance(mods[5], 0.25)
    assert filled.stats.top_runs_expected == 0.25 and mods[5].stats.top_runs_expected is None
    assert pool.combine(mods[:5] + [filled]).verdict == GPTQ


def signatures(name):
    with open_checkpoint(CKPT / name) as ck:
        return {s for v in detect_checkpoint(ck, full=True).modules for s in v.signatures}


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
