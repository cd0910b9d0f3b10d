"""The AutoAWQ reader (gptqfmt/formats/awq.py): what is not the GEMM layout is refused with its
reason."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from gptqfmt.bits.packing import pack
from gptqfmt.formats import open_source
from gptqfmt.formats.relayout import awq_fields
from gptqfmt.ops.verify import validate
from tests.support import FORMATS, edit_config, loops, slow_ct_values


def test_awq_gemv_is_refused_with_its_reason(tmp_path):
    d = tmp_path / "a"
    shutil.copytree(FORMATS / "awq-b4-g32", d)
    edit_config(d, lambda q: q.update({"version": "gemv"}))
    rep = validate(d)
    assert [f.code for f in rep.findings if f.code == "GQ210"] and \
        "GEMV" in next(f.message for f in rep.findings if f.code == "GQ210")


def test_zero_point_false_beside_gemm_tensors_is_symmetric_awq():
    """auto-round's symmetric AWQ export: `zero_point: false` with version gemm over GEMM
    tensors whose every zero point is 8 (make_formats.py, producer autoround). The version
    and the tensors name the layout, so it is read as AWQ, symmetric, with nothing to report."""
    from gptqfmt.formats import open_source
    d = FORMATS / "autoround-awq-b4-sym-g32"
    src = open_source(d)
    try:
        assert src.format == "awq" and src.findings == []
        assert {m.sym for m in src.modules} == {True} and src.quantization()["sym"] is True
    finally:
        src.close()
    assert validate(d).findings == []


def test_zero_point_false_over_other_zero_points_is_gq403(tmp_path):
    """A config that says symmetric over zero points that are not all 8: one GQ403 per module,
    naming its qzeros, as for a GPTQ `sym: true` whose zeros are not the constant."""
    d = tmp_path / "a"
    shutil.copytree(FORMATS / "awq-b4-g32", d)
    edit_config(d, lambda q: q.update({"zero_point": False}))
    rep = validate(d)
    gq403 = [f for f in rep.findings if f.code == "GQ403"]
    assert len(gq403) == 7 and {f.code for f in rep.findings} == {"GQ403"}
    assert all(f.tensor.endswith(".qzeros") and "zero_point=false" in f.message
               for f in gq403)


def test_awq_marlin_version_is_still_refused(tmp_path):
    d = tmp_path / "a"
    shutil.copytree(FORMATS / "autoround-awq-b4-sym-g32", d)
    edit_config(d, lambda q: q.update({"version": "marlin"}))
    msgs = [f.message for f in validate(d).findings if f.code == "GQ210"]
    assert len(msgs) == 1 and "'marlin'" in msgs[0]


@pytest.mark.parametrize("compiled", [True, False], ids=["compiled", "numpy"])
@pytest.mark.parametrize("name", ["awq-b4-g32", "autoround-awq-b4-sym-g32", "ct-b4-asym-g32",
                                  "ct-b3-asym-g32-padded"])
def test_qweight_columns_are_the_columns_of_qweight(name, compiled):
    """The gate's sample of columns reads only their words (AWQ: the word columns that hold
    them, re-laid out; compressed-tensors: their rows, transposed), and gives qweight's; the
    stored words are qweight or its transpose, as said."""
    src = open_source(FORMATS / name)
    try:
        with loops(compiled):
            check_columns_and_layouts(src)
    finally:
        src.close()


def slow_qweight(src, m):
    """qweight of the one model from the stored words, code by code: AutoAWQ's nibbles in
    channel order (awq_fields, held to make_formats.py's writer), compressed-tensors' rows
    value by value (slow_ct_values), packed down the input channels."""
    raw = np.asarray(src.store.view(m.tensors["qweight"]))
    if src.format == "awq":
        return pack(awq_fields(raw), 4, 32, axis=0)
    layout = "padded" if raw.shape[1] * 32 // m.bits > m.in_features else "dense"
    codes = np.array([slow_ct_values(row, m.bits, m.in_features, layout) for row in raw],
                     dtype=np.uint8)
    return pack(codes.T, m.bits, 32, axis=0)


def check_columns_and_layouts(src):
    for m in src.modules:
        assert np.array_equal(src.qweight(m), slow_qweight(src, m))
        n = m.out_features
        for cols in (np.arange(n), np.array([0]), np.array([n - 1, 3, 9, 10, 17]) % n,
                     np.arange(5, n, 7)):
            got = src.qweight_columns(m, cols)
            assert np.array_equal(got, np.asarray(src.qweight(m))[:, cols])
        words, t = src.stored_qweight(m)   # qweight, or (True) the words of its transpose
        assert np.array_equal(np.asarray(words).T if t else words, src.qweight(m))
        # compared against either layout: nothing differs, then one flipped word does
        for other, flag in ((np.array(src.qweight(m)), False),
                            (np.ascontiguousarray(np.asarray(src.qweight(m)).T), True)):
            assert src.qweight_differ(m, other, flag) == 0
            other[-1, 0] ^= 1
            assert src.qweight_differ(m, other, flag) == 1
            assert src.qweight_differ(m, other[:-1], flag) == -1
