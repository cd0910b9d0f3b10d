"""The scale checks (gptqfmt/checks/modules.py bad_scales, scale_findings): a scale's sign is data
(auto-round's symmetric quantizer writes negative scales on purpose, and every kernel multiplies
by the scale as stored); NaN, infinity and zero are not (no producer writes them)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from gptqfmt.checks.modules import bad_scales
from gptqfmt.ops.verify import validate
from tests.support import CKPT, FIXTURES, Q, rewrite_tensors

AXES = ("group", "column")


def test_negative_scales_are_scales():
    scales = np.array([[0.01, -0.02], [-3e-5, 65504.0]], np.float32)
    assert bad_scales(scales, "f", "t", AXES) is None


@pytest.mark.parametrize(("bad", "shown"), [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf"),
                                            (0.0, "0.0"), (-0.0, "-0.0")])
def test_nan_infinity_and_zero_are_gq501(bad, shown):
    scales = np.array([[0.01, -0.02, 0.5], [0.3, bad, bad]], np.float32)
    f = bad_scales(scales, "model.safetensors", "x.scales", AXES)
    assert f.code == "GQ501" and (f.file, f.tensor) == ("model.safetensors", "x.scales")
    assert f.message.startswith("2 of 6 scales are NaN, infinite or zero")
    assert "first at group 1, column 1" in f.message and shown in f.message


def test_autoround_fixture_stores_negative_scales_and_verifies():
    """The premise: about half of auto-round's symmetric scales are negative (make_fixtures.py
    autoround_sym_quantize), and verify reads every one of them without a finding."""
    from safetensors.numpy import load_file  # the reference reader, not gptqfmt's
    d = CKPT / "autoround-b4-sym-gptq"
    t = load_file(d / "model.safetensors")
    signs = np.concatenate([v.ravel() for k, v in t.items() if k.endswith(".scales")])
    assert 0.3 < float(np.mean(signs < 0)) < 0.7
    rep = validate(d, jobs=1)
    assert rep.findings == [] and not rep.failed(strict=True)


def test_overflow_counts_the_magnitude_of_a_negative_scale(tmp_path):
    """GQ502: |scale| x the farthest code from Z beyond float16's range, whatever the sign."""
    d = tmp_path / "c"
    shutil.copytree(FIXTURES / "invalid" / "scale-overflows-fp16", d)
    rewrite_tensors(d, lambda t: t.__setitem__(f"{Q}.scales",
                                               ("F16", -t[f"{Q}.scales"][1])))
    codes = [f.code for f in validate(d, jobs=1).findings]
    assert codes == ["GQ502"]
