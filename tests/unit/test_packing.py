"""Packing core against golden words and a deliberately slow bit-by-bit reference."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gptqfmt.bits.packing import block, constant_words, pack, unpack, unpack_columns
from tests.support import slow_pack_column, slow_unpack_column

COMBOS = [(b, w) for b in (2, 3, 4, 8) for w in (8, 16, 32, 64) if b != 3 or w == 32]


@pytest.mark.parametrize(("zeros", "word"), [
    ([0, 3, 15, 8, 8, 8, 8, 8], 0x88888F30),
    ([1, 3, 15, 8, 8, 8, 8, 8], 0x88888F31),
    # per-field gptq of [0,3,15,8,...]: (Z-1) & 15 = [15, 2, 14, 7, ...]
    ([15, 2, 14, 7, 7, 7, 7, 7], 0x77777E2F),
    ([0, 2, 14, 7, 7, 7, 7, 7], 0x77777E20),
])
def test_golden_4bit_words(zeros, word):
    packed = pack(np.array([zeros]), 4, 32, axis=1)
    assert packed.dtype == np.int32
    assert int(packed.view(np.uint32)[0, 0]) == word
    assert unpack(packed, 4, axis=1).tolist() == [zeros]


@pytest.mark.parametrize(("bits", "field", "words"), [
    (2, 1, [0x55555555]), (2, 2, [0xAAAAAAAA]),
    (4, 7, [0x77777777]), (4, 8, [0x88888888]),
    (8, 127, [0x7F7F7F7F]), (8, 128, [0x80808080]),
    (3, 3, [0xDB6DB6DB, 0xB6DB6DB6, 0x6DB6DB6D]),
    (3, 4, [0x24924924, 0x49249249, 0x92492492]),
])
def test_golden_symmetric_words(bits, field, words):
    assert [int(w) for w in constant_words(field, bits, 32)] == words


def test_3bit_straddling_values():
    # value 10 sits at stream bits 30..32: bits 30-31 of word 0 and bit 0 of word 1
    codes = np.zeros((32, 1), np.uint8)
    codes[10, 0] = 0b111
    w = pack(codes, 3, 32, axis=0).view(np.uint32)[:, 0]
    assert [hex(int(x)) for x in w] == ["0xc0000000", "0x1", "0x0"]
    codes[10, 0], codes[21, 0] = 0, 0b101  # value 21: bit 63 of the stream, then bits 64-65
    w = pack(codes, 3, 32, axis=0).view(np.uint32)[:, 0]
    assert [hex(int(x)) for x in w] == ["0x0", "0x80000000", "0x2"]


@pytest.mark.parametrize(("bits", "word_bits"), COMBOS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_round_trip_against_slow_reference(bits, word_bits, data):
    vpb, wpb = block(bits, word_bits)
    blocks = data.draw(st.integers(1, 3))
    cols = data.draw(st.integers(1, 3))
    n = blocks * vpb
    flat = data.draw(st.lists(st.integers(0, 2**bits - 1), min_size=n * cols, max_size=n * cols))
    codes = np.array(flat, dtype=np.uint8).reshape(n, cols)
    # dim 0 (qweight layout)
    words = pack(codes, bits, word_bits, axis=0)
    assert words.dtype == np.dtype(f"int{word_bits}") and words.shape == (blocks * wpb, cols)
    for c in range(cols):
        expect = slow_pack_column(codes[:, c].tolist(), bits, word_bits)
        got = [int(x) for x in words[:, c].view(np.dtype(f"uint{word_bits}"))]
        assert got == expect
        assert unpack(words, bits, axis=0)[:, c].tolist() == slow_unpack_column(expect, bits,
                                                                                 word_bits)
    # dim 1 (qzeros layout) is the same stream along the other axis
    words_t = pack(codes.T, bits, word_bits, axis=1)
    assert np.array_equal(words_t, words.T)
    assert np.array_equal(unpack(words_t, bits, axis=1), codes.T)


@pytest.mark.parametrize(("bits", "word_bits"), COMBOS)
def test_unpack_reads_random_words_like_reference(bits, word_bits):
    rng = np.random.default_rng(bits * 100 + word_bits)
    _, wpb = block(bits, word_bits)
    u = rng.integers(0, 2**word_bits, size=(wpb * 2, 2), dtype=np.dtype(f"uint{word_bits}"),
                     endpoint=False)
    words = u.view(np.dtype(f"int{word_bits}"))  # negative words included
    got = unpack(words, bits, axis=0)
    for c in range(2):
        assert got[:, c].tolist() == slow_unpack_column(u[:, c].tolist(), bits, word_bits)
    assert np.array_equal(pack(got, bits, word_bits, axis=0), words)


@pytest.mark.parametrize(("call", "message"), [
    (lambda: pack(np.zeros((8, 1), np.uint8), 5, 32), "bits=5"),
    (lambda: pack(np.zeros((32, 1), np.uint8), 3, 16), "3-bit packing needs int32"),
    (lambda: pack(np.zeros((7, 1), np.uint8), 4, 32), "multiple of 8"),
    (lambda: pack(np.full((8, 1), 16), 4, 32), "code 16 out of range"),
    (lambda: pack(np.full((8, 1), -1), 4, 32), "code -1 out of range"),
    (lambda: unpack(np.zeros((2, 1), np.int32), 3), "multiple of 3"),
    (lambda: unpack(np.zeros((2, 1), np.float32), 4), "must be integers"),
])
def test_errors_name_the_numbers(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize(("bits", "word_bits"), [c for c in COMBOS if c[0] != 3])
def test_byte_path_and_word_path_agree(bits, word_bits):
    """unpack reads 2/4/8-bit fields from the words' bytes along the last axis and along axis 0
    of a matrix, and shifts whole words otherwise (here: axis 0 of a 3-d array)."""
    rng = np.random.default_rng(bits + word_bits)
    u = rng.integers(0, 2**word_bits, size=(5, 7), dtype=np.dtype(f"uint{word_bits}"))
    words = u.view(np.dtype(f"int{word_bits}"))
    assert np.array_equal(unpack(words, bits, axis=0), unpack(words[:, None], bits, axis=0)[:, 0])
    assert np.array_equal(unpack(words, bits, axis=1),
                          unpack(words.T[:, None], bits, axis=0)[:, 0].T)
    # 1-d words against the bit-by-bit reference; a strided view against the word path
    assert unpack(words[0], bits, axis=0).tolist() == \
        slow_unpack_column(u[0].tolist(), bits, word_bits)
    view = words[:, ::2]
    assert np.array_equal(unpack(view, bits, axis=1), unpack(view.T[:, None], bits, axis=0)[:, 0].T)


@pytest.mark.parametrize(("bits", "word_bits"), COMBOS)
def test_unpack_columns_is_those_columns_of_unpack(bits, word_bits):
    """Only the blocks of words holding the columns asked for are unpacked; the values are
    unpack's, in the order asked (repeats, the first and last column, none at all)."""
    rng = np.random.default_rng(10 * bits + word_bits)
    vpb, wpb = block(bits, word_bits)
    u = rng.integers(0, 2**word_bits, size=(6, 4 * wpb), dtype=np.dtype(f"uint{word_bits}"))
    words = u.view(np.dtype(f"int{word_bits}"))
    whole = unpack(words, bits, axis=1)
    n = whole.shape[1]
    for cols in (rng.integers(0, n, size=11), np.array([n - 1, 0, 0, vpb]), np.arange(n),
                 np.array([], dtype=np.int64)):
        got = unpack_columns(words, bits, cols)
        assert got.shape == (6, cols.size) and np.array_equal(got, whole[:, cols])


def test_unpack_columns_golden():
    words = np.array([[0x76543210, 0xFEDCBA98]], dtype=np.uint32).view(np.int32)
    assert unpack_columns(words, 4, np.array([1, 9, 15])).tolist() == [[1, 9, 15]]


def test_unique_is_numpys_without_importing_numpy_ma():
    """bits.unique against np.unique (values, order, dtype, flattening), and a process that
    only calls it never imports numpy.ma."""
    import subprocess
    import sys

    from gptqfmt.bits import unique

    rng = np.random.default_rng(0)
    for a in [np.array([3, 1, 3, 2]), np.zeros(0, np.int64), rng.integers(0, 9, 1000),
              rng.integers(0, 5, (4, 6)).astype(np.int32), np.array([2.5, -1.0, 2.5])]:
        got, want = unique(a), np.unique(a)
        assert got.dtype == want.dtype and np.array_equal(got, want)
    assert unique([3, 1, 3, 2]).tolist() == [1, 2, 3]
    code = ("import sys; from gptqfmt.bits import unique; unique([3, 1, 3]); "
            "print('numpy.ma' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"
