"""The zero-point conventions (gptqfmt/bits/conventions.py): the kernel's rule codes, worked
examples, what a conversion cannot carry, and words moved by one addition against fields moved
one by one."""
import re

import numpy as np
import pytest

from gptqfmt.bits.conventions import (
    CONVENTIONS,
    GPTQ,
    GPTQ_V2,
    ZeroRule,
    convert_fields,
    effective_zeros,
    lossy_mask,
    sym_field,
)
from gptqfmt.errors import NotRepresentable
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


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("word_bits", [8, 16, 32, 64])
@pytest.mark.parametrize("src,dst", [(GPTQ, GPTQ_V2), (GPTQ_V2, GPTQ), (GPTQ, GPTQ)])
def test_words_move_as_fields_do(bits, word_bits, src, dst):
    """convert_words (one addition per word where no field is lossy) against convert_fields
    field by field: every field value in every position of a word, with and without a lossy
    field; moved_words declines exactly where a word addition would carry or borrow."""
    from gptqfmt.bits.conventions import convert_fields, convert_words, field_changes, moved_words
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
        assert field_changes(words, bits, src, dst, allow_lossy=True) == wc
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


@pytest.mark.parametrize("bits", [2, 3, 4, 8])
@pytest.mark.parametrize("dtype", ["<i4", "<u4", "<i2", "<i8", "<u1", ">i4"])
def test_symmetric_pattern_of_bytes_is_symmetric_pattern(bits, dtype):
    """The byte comparison against each convention's constant tensor answers as the word
    predicate does: either constant, one field off, the padding of a row off, rows that are
    not whole blocks, no words, and float words."""
    from gptqfmt.bits.conventions import symmetric_pattern, symmetric_pattern_of_bytes
    from gptqfmt.bits.packing import constant_words
    rng = np.random.default_rng(bits)
    d = np.dtype(dtype)
    w = d.itemsize * 8
    if bits == 3 and w != 32:
        return   # 3-bit fields pack in 32-bit words only
    cases = []
    for c in CONVENTIONS:
        one = constant_words(sym_field(bits, c), bits, w).astype(d.newbyteorder("=")).astype(d)
        for rows, blocks in ((1, 1), (3, 4), (0, 2)):
            words = np.tile(one, (rows, blocks))
            cases.append(words)
            if words.size:
                off = words.copy()
                off.reshape(-1)[rng.integers(off.size)] ^= d.type(1)
                cases.append(off)
        cases.append(np.tile(one, (2, 1))[:, :max(1, one.size - 1)])  # a partial block
    cases.append(rng.integers(0, 2**(min(w, 32) - 1), (4, 6)).astype(d))
    for words in cases:
        words = np.ascontiguousarray(words)
        assert symmetric_pattern_of_bytes(words.tobytes(), d.str, words.shape, bits) == \
            symmetric_pattern(words, bits), (words.shape, words)
    f = np.zeros((2, 3), np.float32)
    assert symmetric_pattern_of_bytes(f.tobytes(), f.dtype.str, f.shape, bits) is None
