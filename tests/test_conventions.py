"""The conventions and the runtimes as data (gptqfmt/conventions.py, gptqfmt/runtimes.py):
worked examples, the kernel's rule codes, and the sentences reports build from them."""
import re

import numpy as np
import pytest

from gptqfmt.bits.conventions import (CONVENTIONS, GPTQ, GPTQ_V2, REFERENCE, ZeroRule,
                                      convert_fields, effective_zeros, lossy_mask,
                                      reference_rule, sym_field)
from gptqfmt.errors import NotRepresentable
from gptqfmt.runtimes import groups as runtimes
from gptqfmt.runtimes.table import RUNTIMES
from tests.support import ROOT


def test_zero_rules_are_the_kernels():
    header = (ROOT / "kernels" / "gptq_dequant.h").read_text()
    enum = dict(re.findall(r"GQ_ZERO_(\w+) = (\d+)", header))
    assert {k: int(v) for k, v in enum.items()} == {r.name: r.value for r in ZeroRule}


@pytest.mark.parametrize("rule, want", [
    (ZeroRule.V2, [0, 7, 15]), (ZeroRule.V1_NOWRAP, [1, 8, 16]), (ZeroRule.V1_WRAP, [1, 8, 0])])
def test_effective_zeros_worked_example(rule, want):
    assert effective_zeros(np.array([0, 7, 15], np.uint8), 4, rule).tolist() == want


def test_symmetric_fields_and_unknown_conventions():
    assert [sym_field(b, GPTQ) for b in (2, 3, 4, 8)] == [1, 3, 7, 127]
    assert [sym_field(b, GPTQ_V2) for b in (2, 3, 4, 8)] == [2, 4, 8, 128]
    with pytest.raises(ValueError, match=r"convention 'v1': expected one of \('gptq', "
                                         r"'gptq_v2'\)"):
        sym_field(4, "v1")


def test_lossy_mask_is_what_convert_fields_refuses():
    s = np.array([[0, 1, 14, 15]], np.uint8)
    assert lossy_mask(s, 4, GPTQ, GPTQ) is None
    assert lossy_mask(s, 4, GPTQ, GPTQ_V2).tolist() == [[False, False, False, True]]
    assert lossy_mask(s, 4, GPTQ_V2, GPTQ).tolist() == [[True, False, False, False]]
    # the same fields through convert_fields, written out by hand: refused without
    # allow_lossy, else the lossy field written as 0
    for src, dst, out, changed, ambiguous, lossy in [
            (GPTQ, GPTQ_V2, [1, 2, 15, 0], 4, 1, 0),
            (GPTQ_V2, GPTQ, [0, 0, 13, 14], 3, 0, 1)]:
        with pytest.raises(NotRepresentable) as e:
            convert_fields(s, 4, src, dst)
        assert e.value.count == 1
        got, changes = convert_fields(s, 4, src, dst, allow_lossy=True)
        assert got.tolist() == [out]
        assert (changes.fields, changes.changed, changes.ambiguous, changes.lossy) == \
            (4, changed, ambiguous, lossy)
    for c in CONVENTIONS:
        assert convert_fields(s, 4, c, c)[0].tolist() == s.tolist()


def test_runtimes_group_by_their_rule_and_read_by_the_label():
    groups = runtimes.groups()
    assert [g.gptq for g in groups] == [ZeroRule.V1_NOWRAP, ZeroRule.V1_WRAP]
    assert groups[0].labels[0] == "vLLM gptq_gemm" and "TGI triton" in groups[1].labels
    # every group is the paths of the table with that field rule on gptq files, each once
    for g in groups:
        want = list(dict.fromkeys(p.label for r in RUNTIMES for p in r.paths
                                  if p.readings[GPTQ].rule == g.gptq))
        assert list(g.labels) == want
        assert g.rule(GPTQ_V2) == ZeroRule.V2 and g.rule(GPTQ) == g.gptq
    assert REFERENCE in [g.gptq for g in groups] and reference_rule(GPTQ) == REFERENCE
    assert reference_rule(GPTQ_V2) == ZeroRule.V2
    n0, n1 = (len(g.labels) - 1 for g in groups)
    assert runtimes.maxq_readings(4) == (f"vLLM gptq_gemm and {n0} other kernels read Z = 16; "
                                         f"TGI triton and {n1} other kernels read Z = 0")
    assert runtimes.maxq_readings(2, sep=", ").startswith("vLLM gptq_gemm and ")
    assert ", TGI triton and " in runtimes.maxq_readings(2, sep=", ")


def test_element_kinds_are_the_kernels():
    from gptqfmt.formats.model import Kind
    header = (ROOT / "kernels" / "gptq_dequant.h").read_text()
    enum = dict(re.findall(r"GQ_(F32|F16|BF16) = (\d+)", header))
    assert {k: int(v) for k, v in enum.items()} == {k.name: k.value for k in Kind}


def test_kernel_limits_are_read_from_the_header():
    from gptqfmt.resources import kernel_constant
    header = (ROOT / "kernels" / "gptq_dequant.h").read_text()
    assert kernel_constant("GQ_MAX_M") == 16 and "#define GQ_MAX_M 16" in header
    for f in ("gptq_gemm.cu", "host_shim.c"):  # both use the one definition
        text = (ROOT / "kernels" / f).read_text()
        assert "GQ_MAX_M" in text and "#define GQ_MAX_M" not in text and "acc[16]" not in text
    with pytest.raises(LookupError, match="defines no integer GQ_NOPE"):
        kernel_constant("GQ_NOPE")


def test_one_column_sampler_for_the_gate_and_for_verify():
    import numpy as np

    from gptqfmt.numerics.backend import sample_columns
    for seed in range(20):
        a = sample_columns(1000, 64, np.random.default_rng(seed), align=32)
        assert len(a) == 64 and a[0] % 32 == 0 and (np.diff(a) == 1).all()
        b = sample_columns(1000, 16, np.random.default_rng(seed), must=np.array([3, 999, 500]))
        assert {3, 999, 500} <= set(b.tolist()) and (np.diff(b) > 0).all()
    assert sample_columns(10, 64, np.random.default_rng(0)).tolist() == list(range(10))
    many = np.arange(500, 600, 5)  # 20 columns to include; at most width/2 = 8 of them are
    got = sample_columns(1000, 16, np.random.default_rng(1), must=many)
    assert len(np.intersect1d(got, many)) >= 8 and set(many[:8].tolist()) <= set(got.tolist())


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("word_bits", [8, 16, 32, 64])
@pytest.mark.parametrize("src,dst", [(GPTQ, GPTQ_V2), (GPTQ_V2, GPTQ), (GPTQ, GPTQ)])
def test_words_move_as_fields_do(bits, word_bits, src, dst):
    """convert_words (one addition per word where no field is lossy) against convert_fields
    field by field: every field value in every position of a word, with and without a lossy
    field; moved_words declines exactly where a word addition would carry or borrow."""
    from gptqfmt.bits.conventions import convert_fields, convert_words, moved_words
    from gptqfmt.bits.packing import pack, unpack

    if bits == 3 and word_bits != 32:
        pytest.skip("3-bit packs into int32 only")
    top = (1 << bits) - 1
    per = 96 // bits if bits == 3 else word_bits // bits
    rng = np.random.default_rng(bits * word_bits)
    # every value in every field position, the rest random
    rows = [np.roll(np.r_[v, rng.integers(0, top + 1, per - 1)], p)
            for v in range(top + 1) for p in range(per)]
    fields = np.array(rows, dtype=np.uint8).reshape(-1, per * 2 if bits == 3 else per)
    lossy = fields == (top if dst == GPTQ_V2 and src == GPTQ else 0)
    clean = np.where(lossy, 1, fields).astype(np.uint8) if src != dst else fields
    for f, has_lossy in ((clean, False), (fields, src != dst)):
        words = pack(f, bits, word_bits, axis=1)
        want, wc = convert_fields(f, bits, src, dst, allow_lossy=True)
        got, gc = convert_words(words, bits, src, dst, allow_lossy=True)
        assert got.dtype == words.dtype and got.shape == words.shape
        assert np.array_equal(unpack(got, bits, axis=1), want) and gc == wc
        moved = moved_words(words, bits, src, dst)
        assert (moved is None) == (has_lossy or (bits == 3 and src != dst))
    if src != dst:  # lossy fields without allow_lossy: refused, as convert_fields refuses
        with pytest.raises(NotRepresentable):
            convert_words(pack(fields, bits, word_bits, axis=1), bits, src, dst)


def test_moved_words_worked_example():
    from gptqfmt.bits.conventions import moved_words

    w = np.array([[0x88888037]], dtype=np.uint32).view(np.int32)
    assert moved_words(w, 4, GPTQ, GPTQ_V2).view(np.uint32)[0, 0] == 0x99999148
    assert moved_words(np.array([[0x8888803F]], np.uint32).view(np.int32), 4, GPTQ,
                       GPTQ_V2) is None
    # checked=True is the caller's word that no field is lossy: the addition is done as asked
    # (here it would carry: the caller must have run has_field on these words)
    assert moved_words(np.array([[0x8888803F]], np.uint32).view(np.int32), 4, GPTQ, GPTQ_V2,
                       checked=True).view(np.uint32)[0, 0] == 0x99999150


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("word_bits", [8, 16, 32, 64])
def test_has_field_finds_0_and_maxq_anywhere(bits, word_bits):
    """moved_words' check: a 0 or a maxq in any field position of any word (alone in an
    otherwise clean tensor, at the edges of the superword chunks too), and none in clean data
    whose other fields take every other value."""
    from gptqfmt.bits import swar
    from gptqfmt.bits.swar import has_field
    from gptqfmt.bits.packing import pack

    top = (1 << bits) - 1
    rng = np.random.default_rng(bits + word_bits)
    for value in (0, top):
        clean = rng.integers(1, top, (4, 128)).astype(np.uint8)
        clean[0, :min(128, top - 1)] = np.arange(1, top)[:128]  # every other value occurs
        assert not has_field(pack(clean, bits, word_bits, axis=1), bits, value)
        for r, c in [(0, 0), (3, 127), (2, 63), (1, 64)]:
            f = clean.copy()
            f[r, c] = value
            assert has_field(pack(f, bits, word_bits, axis=1), bits, value), (value, r, c)
    saved = swar.CHUNK
    swar.CHUNK = 1  # one superword a chunk: the boundary falls in the last one
    try:
        f = rng.integers(1, top, (4, 128)).astype(np.uint8)
        f[3, 127] = top
        assert has_field(pack(f, bits, word_bits, axis=1), bits, top)
    finally:
        swar.CHUNK = saved
    with pytest.raises(ValueError, match="neither 0 nor maxq"):
        has_field(pack(f, bits, word_bits, axis=1), bits, 1)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("word_bits", [8, 16, 32, 64])
@pytest.mark.parametrize("src,dst", [(GPTQ, GPTQ_V2), (GPTQ_V2, GPTQ), (GPTQ, GPTQ)])
def test_words_moved_checks_the_move_by_a_difference(bits, word_bits, src, dst):
    """The gate's word check: true for the fields moved one by one (convert_fields, not
    moved_words), false for one field off, for a move in the other direction, and for words of
    another shape."""
    from gptqfmt.bits.conventions import convert_fields, word_path, words_moved
    from gptqfmt.bits.packing import pack

    top = (1 << bits) - 1
    rng = np.random.default_rng(bits * word_bits)
    f = rng.integers(1, top, (3, 128)).astype(np.uint8)  # no field at 0 or maxq
    w = pack(f, bits, word_bits, axis=1)
    assert word_path(w, bits, src, dst)
    moved, _ = convert_fields(f, bits, src, dst)
    assert words_moved(w, pack(moved, bits, word_bits, axis=1), bits, src, dst)
    off = moved.copy()
    off[2, 77] = (int(off[2, 77]) + 1) % (top + 1)
    assert not words_moved(w, pack(off, bits, word_bits, axis=1), bits, src, dst)
    if src != dst:
        back, _ = convert_fields(f, bits, dst, src)
        assert not words_moved(w, pack(back, bits, word_bits, axis=1), bits, src, dst)
    assert not words_moved(w, pack(moved[:2], bits, word_bits, axis=1), bits, src, dst)
