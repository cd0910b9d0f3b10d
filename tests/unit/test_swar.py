"""The predicates on packed words (gptqfmt/bits/swar.py) against field-by-field answers, in
chunks of every size."""

import numpy as np
import pytest

from gptqfmt.bits.packing import pack


def test_count_marked_in_chunks_equals_whole_tensor_marks(monkeypatch):
    """count_marked walks rows in chunks of CHUNK words; forced to tiny chunks, it counts
    what the whole-tensor marks count."""
    from gptqfmt.bits import swar as cv
    rng = np.random.default_rng(9)
    s = rng.integers(0, 16, size=(37, 64)).astype(np.uint8)
    s[:, ::5] = 15
    s[:, 2::7] = 0
    w = pack(s, 4, 32, axis=1)
    want = (cv.count_fields(cv.carried_fields(w, 4, True)),
            cv.count_fields(cv.fields_equal(w, 4, 15)),
            cv.count_fields(cv.fields_equal(w, 4, 0) &
                            ~cv.carried_fields(w, 4, False)))
    for chunk in (8, 24, 1 << 15):
        monkeypatch.setattr(cv, "CHUNK", chunk)
        assert (cv.count_marked(w, 4, True), cv.count_marked(w, 4, value=15),
                cv.count_marked(w, 4, False, value=0, unless_carried=True)) == want
    assert want[1] == int((s == 15).sum())


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("word_bits", [8, 16, 32, 64])
def test_has_field_finds_0_and_maxq_anywhere(bits, word_bits):
    """moved_words' check: a 0 or a maxq in any field position of any word (alone in an
    otherwise clean tensor, at the edges of the superword chunks too), and none in clean data
    whose other fields take every other value."""
    from gptqfmt.bits import swar
    from gptqfmt.bits.packing import pack
    from gptqfmt.bits.swar import has_field

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


@pytest.mark.parametrize("bits, word_bits", [(b, w) for b in (2, 3, 4, 8) for w in (32, 64)
                                              if (b, w) != (3, 64)])   # 3-bit: int32 only
def test_every_field_equals_unpacking_every_field(bits, word_bits):
    """every_field against the unpacked fields: the constant, one field off in the first row,
    in a later row, in the last word; contiguous or not, signed words, one row."""
    from gptqfmt.bits.packing import block, unpack
    from gptqfmt.bits.swar import every_field

    vpb, wpb = block(bits, word_bits)
    value = (1 << (bits - 1)) - 1
    rows, n = 5, 3 * vpb
    fields = np.full((rows, n), value, np.uint8)
    signed = {32: np.int32, 64: np.int64}[word_bits]

    def packed(f):
        return pack(f, bits, word_bits, axis=1).view(signed)

    def truth(words):
        return bool((unpack(words, bits, axis=1) == value).all())
    cases = [fields]
    for r, c in [(0, 0), (3, n // 2), (rows - 1, n - 1)]:
        f = fields.copy()
        f[r, c] ^= 1
        cases.append(f)
    for f in cases:
        w = packed(f)
        for words in (w, w[:1], np.asfortranarray(w), w[::2], w[:, :wpb]):
            assert every_field(words, bits, value) == truth(words), (bits, words.shape)
    assert not every_field(packed(fields)[:, :0], bits, value)
