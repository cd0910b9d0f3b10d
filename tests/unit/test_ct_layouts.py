"""compressed-tensors' two pack_to_int32 layouts (gptqfmt/bits/ct_layouts.py) against golden
words, a slow value-by-value reference at every width, and compressed-tensors' own helpers of
0.17.1 (padded) and 0.18.0 (dense) where their wheels are at hand."""
from __future__ import annotations

import numpy as np
import pytest

from gptqfmt.bits import ct_layouts as lay
from tests.support import ct_release_helpers, slow_ct_row, slow_ct_values

BITS = range(2, 9)
COUNTS = (1, 5, 10, 11, 20, 21, 31, 32, 33, 64, 97)


def test_worked_example_of_the_docstring():
    """3 bits, values 9 = 0b010 and 10 = 0b101: padded 0x10000001 0x00000005 (value 10 alone in
    word 1), dense 0x50000001 0x00000001 (value 10's low bits 01 on top of word 0)."""
    v = np.array([[1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 5]], np.uint8)
    padded, dense = lay.pack(v, 3, lay.PADDED), lay.pack(v, 3, lay.DENSE)
    assert padded.view(np.uint32).tolist() == [[0x10000001, 0x00000005]]
    assert dense.view(np.uint32).tolist() == [[0x50000001, 0x00000001]]
    assert lay.fitting(11, 3, 2) == (lay.DENSE, lay.PADDED)   # both 2 words: width undecided
    assert lay.unpack(padded, 3, 11, lay.PADDED).tolist() == v.tolist()
    assert lay.unpack(dense, 3, 11, lay.DENSE).tolist() == v.tolist()
    assert lay.unpack(dense, 3, 11, lay.PADDED).tolist() != v.tolist()   # misread the other way


def test_golden_words_at_five_six_and_seven_bits():
    """Six 5-bit values fit one word in both layouts (bits 0-29): 31 as value 0 and 1 as value
    5 (bit 25) are 0x0200001F either way. A seventh value starts word 1 when padded and bit 30
    of word 0 when dense, straddling into word 1."""
    v = np.array([[31, 0, 0, 0, 0, 1]], np.uint8)
    assert lay.pack(v, 5, lay.PADDED).view(np.uint32).tolist() == [[0x0200001F]]
    assert lay.pack(v, 5, lay.DENSE).view(np.uint32).tolist() == [[0x0200001F]]
    # seven 5-bit 31s: padded 0x3FFFFFFF then 0x1F; dense 0xFFFFFFFF then 0x7 (value 6 straddles)
    v = np.full((1, 7), 31, np.uint8)
    assert lay.pack(v, 5, lay.PADDED).view(np.uint32).tolist() == [[0x3FFFFFFF, 0x1F]]
    assert lay.pack(v, 5, lay.DENSE).view(np.uint32).tolist() == [[0xFFFFFFFF, 0x7]]
    # 6 bits: five 63s fill 30 bits of a padded word; 7 bits: four 127s fill 28
    assert lay.pack(np.full((1, 6), 63, np.uint8), 6, lay.PADDED).view(np.uint32).tolist() \
        == [[0x3FFFFFFF, 0x3F]]
    assert lay.pack(np.full((1, 5), 127, np.uint8), 7, lay.PADDED).view(np.uint32).tolist() \
        == [[0x0FFFFFFF, 0x7F]]
    assert lay.pack(np.full((1, 5), 127, np.uint8), 7, lay.DENSE).view(np.uint32).tolist() \
        == [[0xFFFFFFFF, 0x7]]


@pytest.mark.parametrize("layout", lay.LAYOUTS)
@pytest.mark.parametrize("bits", BITS)
def test_pack_and_unpack_match_the_slow_reference(bits, layout):
    rng = np.random.default_rng(bits * 7 + len(layout))
    for count in COUNTS:
        v = rng.integers(0, 1 << bits, (3, count)).astype(np.uint8)
        words = lay.pack(v, bits, layout)
        want = [slow_ct_row(row, bits, layout) for row in v]
        assert words.dtype == np.int32 and words.shape == (3, lay.width(count, bits, layout))
        assert words.view(np.uint32).tolist() == want, (bits, layout, count)
        back = lay.unpack(np.array(want, np.uint32).view(np.int32), bits, count, layout)
        assert back.tolist() == [slow_ct_values(w, bits, count, layout) for w in want]
        assert np.array_equal(back, v)
        assert lay.padding_clean(words, count, bits, layout).all()


@pytest.mark.parametrize("bits", BITS)
def test_along_dim_0_as_the_zero_point_is_packed(bits):
    """weight_zero_point [groups, out] packs along out: the packed axis is 0 of [out, groups]."""
    rng = np.random.default_rng(bits)
    z = rng.integers(0, 1 << bits, (45, 3)).astype(np.uint8)   # [out, groups]
    for layout in lay.LAYOUTS:
        words = lay.pack(z, bits, layout, axis=0)
        assert words.shape == (lay.width(45, bits, layout), 3)
        assert np.array_equal(words, lay.pack(z.T, bits, layout).T)
        assert np.array_equal(lay.unpack(words, bits, 45, layout, axis=0), z)
    dense = lay.repack(lay.pack(z, bits, lay.PADDED, axis=0), bits, 45, lay.PADDED, lay.DENSE,
                       axis=0)
    assert np.array_equal(dense, lay.pack(z, bits, lay.DENSE, axis=0))


@pytest.mark.parametrize("bits", BITS)
def test_widths_and_when_they_tell_the_layout(bits):
    f = 32 // bits
    undecided = [c for c in range(1, 400) if len(lay.fitting(c, bits, lay.width(
        c, bits, lay.DENSE))) == 2 and not lay.coincide(c, bits)]
    # where the widths agree and the bits do not: never a multiple of 32, none past these
    assert max(undecided, default=0) == {3: 150, 5: 90, 6: 75, 7: 28}.get(bits, 0)
    if bits == 3:   # the docstring's 11 values, and the first run: 2 words either way
        assert undecided[:10] == list(range(11, 21))
    assert not [c for c in undecided if c % 32 == 0]
    for count in range(1, 200):
        assert lay.width(count, bits, lay.PADDED) == len(slow_ct_row([0] * count, bits,
                                                                      "padded"))
        assert lay.width(count, bits, lay.DENSE) == -(-count * bits // 32)
        fits = lay.fitting(count, bits, lay.width(count, bits, lay.DENSE))
        assert lay.DENSE in fits
        if not lay.differ(bits):
            assert fits == lay.LAYOUTS and lay.coincide(count, bits)
            continue
        # the same bits exactly while the row fits in its first word
        same = slow_ct_row(range(count), bits, "padded") == \
            slow_ct_row([i % (1 << bits) for i in range(count)], bits, "dense") \
            if count < (1 << bits) else None
        if same is not None:
            assert same == lay.coincide(count, bits) == (count <= f), count
        if count % 32 == 0:   # every real layer: the padded row is wider
            assert lay.width(count, bits, lay.PADDED) > lay.width(count, bits, lay.DENSE)
            assert fits == (lay.DENSE,)


@pytest.mark.parametrize("layout", lay.LAYOUTS)
def test_a_bit_outside_the_values_is_found(layout):
    """60 values of 3 bits: padded, 6 words with their top 2 bits free; dense, 180 bits in 6
    words, the last 12 free."""
    rng = np.random.default_rng(3)
    v = rng.integers(0, 8, (4, 60)).astype(np.uint8)
    words = lay.pack(v, 3, layout)
    assert lay.padding_clean(words, 60, 3, layout).all()
    col = 0 if layout == lay.PADDED else -1        # a word's bit 30 is free in both
    words[2, col] |= np.int32(1 << 30)
    assert lay.padding_clean(words, 60, 3, layout).tolist() == [True, True, False, True]
    words[2, col] ^= np.int32(1 << 30)
    words[1, 1] |= np.int32(1 << 29)               # a value bit in both: clean
    assert lay.padding_clean(words, 60, 3, layout).all()


def test_refusals():
    with pytest.raises(ValueError, match="1 to 8"):
        lay.width(4, 9, lay.DENSE)
    with pytest.raises(ValueError, match=r"\[0, 7\]"):
        lay.pack(np.array([[8]]), 3, lay.DENSE)
    with pytest.raises(ValueError, match="take 7 in the padded layout"):
        lay.unpack(np.zeros((1, 6), np.int32), 3, 64, lay.PADDED)


# ------------------------------------------------ compressed-tensors' own code, per release

def _signed(torch, v, bits):
    return torch.tensor(v.astype(np.int16) - (1 << (bits - 1)), dtype=torch.int8)


@pytest.mark.parametrize(("version", "layout"), [("0.17.1", lay.PADDED), ("0.18.0", lay.DENSE)])
@pytest.mark.parametrize("bits", BITS)
def test_what_compressed_tensors_packs_and_unpacks(version, layout, bits):
    """pack_to_int32 of 0.17.1 is the padded layout and that of 0.18.0 the dense one, along dim
    1 (weight) and dim 0 (zero point), and their unpack_from_int32 reads our words back."""
    import torch
    ct = ct_release_helpers(version)
    rng = np.random.default_rng(bits)
    for out, k in ((5, 64), (3, 11), (7, 97)):
        v = rng.integers(0, 1 << bits, (out, k)).astype(np.uint8)
        ours = lay.pack(v, bits, layout)
        theirs = ct.pack_to_int32(_signed(torch, v, bits), bits).numpy()
        assert np.array_equal(theirs, ours), (version, bits, out, k)
        back = ct.unpack_from_int32(torch.from_numpy(ours), bits, torch.Size((out, k))).numpy()
        assert np.array_equal(back.astype(np.int16) + (1 << (bits - 1)), v)
        zeros = ct.pack_to_int32(_signed(torch, v, bits), bits, packed_dim=0).numpy()
        assert np.array_equal(zeros, lay.pack(v, bits, layout, axis=0))


@pytest.mark.parametrize("bits", (3, 5, 6, 7))
def test_compressed_tensors_018_misreads_a_padded_row_without_a_word(bits):
    """Why the shapes must decide: 0.18's unpack_from_int32 takes a padded tensor (its width is
    not checked) and returns other values, silently."""
    import torch
    new = ct_release_helpers("0.18.0")
    rng = np.random.default_rng(bits)
    v = rng.integers(0, 1 << bits, (4, 64)).astype(np.uint8)
    padded = ct_release_helpers("0.17.1").pack_to_int32(_signed(torch, v, bits), bits)
    read = new.unpack_from_int32(padded, bits, torch.Size((4, 64))).numpy()
    assert read.shape == (4, 64)
    assert not np.array_equal(read.astype(np.int16) + (1 << (bits - 1)), v)
    assert np.array_equal(lay.unpack(padded.numpy(), bits, 64, lay.PADDED), v)
