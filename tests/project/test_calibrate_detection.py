"""Detection on synthetic whole models (fixtures/make_calibration.py), through the calibration
script's own functions: clean models raise no alarm, inspect (a growing sample) decides what
verify (every code) decides, and mislabels and corruption are caught. The full corpus (1,024
models) runs in scripts/calibrate_detection.py; these are a few of its cases, so that a change
that breaks the calibration fails here first."""
import pytest

from gptqfmt.bits.conventions import GPTQ, GPTQ_V2
from gptqfmt.detection.pool import misfit_threshold
from tests.support import ROOT, load_script

pytestmark = pytest.mark.slow

CAL = load_script(ROOT / "scripts" / "calibrate_detection.py")
MC = CAL.mc


@pytest.mark.parametrize("seed,bits,act,conv", [
    (1, 8, False, GPTQ), (2, 8, True, GPTQ_V2), (3, 4, True, GPTQ), (4, 3, False, GPTQ_V2),
    (5, 2, True, GPTQ)])
def test_clean_whole_models_raise_no_alarm_and_inspect_agrees(seed, bits, act, conv):
    mods = MC.model(seed, bits, False, act, conv, n_modules=210)
    full, sampled = CAL.detect(mods, True), CAL.detect(mods, False)
    assert CAL.alarms(full, conv) == [] and CAL.alarms(sampled, conv) == []
    assert full.verdict == sampled.verdict == conv
    # every module carries the checkpoint's verdict, alone or with the others' evidence
    assert {v.verdict for v in full.modules} == {conv}


def test_three_small_8bit_modules_decide_together_in_inspect():
    """The case inspect used to leave ambiguous: three 576-wide 8-bit asymmetric modules,
    group 128, none decided alone."""
    for conv in (GPTQ, GPTQ_V2):
        mods = MC.model(11, 8, False, False, conv, group_size=128, n_modules=3, shape=4)
        full, sampled = CAL.detect(mods, True), CAL.detect(mods, False)
        assert full.verdict == sampled.verdict == conv, (full.evidence, sampled.evidence)
        assert any("pooled log-likelihood ratio" in e for e in sampled.evidence)


@pytest.mark.parametrize("kind,bits", [("mislabel", 8), ("autogptq", 4), ("gptqmodel", 4),
                                       ("autogptq", 8), ("shift+3", 4), ("shift+3", 3),
                                       ("random", 4), ("random", 8)])
def test_corruption_and_mislabels_are_caught(kind, bits):
    assert CAL.attack_case((1, bits, kind))[2] == [True, True]  # verify, inspect


def test_the_misfit_threshold_grows_with_the_module_count():
    assert 3.8 < misfit_threshold(1) < 3.9
    assert 5.2 < misfit_threshold(600) < 5.3
    assert misfit_threshold(600) > misfit_threshold(210) > misfit_threshold(3)
