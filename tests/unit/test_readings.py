"""What each kernel path's reading makes of stored zero points (gptqfmt/runtimes/readings.py):
worked words, the word arithmetic against field-by-field arithmetic, and the data's own Z."""
import numpy as np

from gptqfmt.bits.conventions import GPTQ, GPTQ_V2
from gptqfmt.bits.packing import pack
from gptqfmt.runtimes.readings import Reading, read_zeros, truth_zeros


def test_read_zeros_worked_example():
    """The fields of the Reading docstring, one packed word at 4 bits."""
    w = pack(np.array([[15, 3, 0, 8, 8, 8, 8, 8]], np.uint8), 4, 32, axis=1)
    want = {Reading.V1_NOWRAP: [16, 4, 1, 9], Reading.V1_WRAP: [0, 4, 1, 9],
            Reading.V1_CARRY: [0, 5, 1, 9], Reading.V2: [15, 3, 0, 8],
            Reading.V2_BORROW: [15, 3, 16, 7], Reading.V1_NIBBLE: [0, 4, 1, 9],
            Reading.SYMMETRIC: [8, 8, 8, 8]}
    for reading, fields in want.items():
        assert read_zeros(w, 4, reading)[0, :4].tolist() == fields, reading


def test_word_readings_against_field_by_field_arithmetic():
    """GPTQModel's packed add and ExLlamaV2's packed subtract, against carries and borrows
    propagated field by field (an independent slow model), at 2, 4 and 8 bits."""
    rng = np.random.default_rng(5)
    for bits in (2, 4, 8):
        top = (1 << bits) - 1
        per = 32 // bits
        s = rng.integers(0, top + 1, size=(6, 4 * per)).astype(np.uint8)
        s[:, ::3] = top       # many fields that carry
        s[:, 1::5] = 0        # and that borrow
        w = pack(s, bits, 32, axis=1)
        carry, borrow = np.zeros(s.shape, np.int64), np.zeros(s.shape, np.int64)
        for g in range(s.shape[0]):
            for word in range(s.shape[1] // per):
                c = b = 0
                for j in range(word * per, (word + 1) * per):
                    v = int(s[g, j]) + 1 + c
                    carry[g, j], c = v & top, v >> bits
                    v = int(s[g, j]) - 1 - b
                    borrow[g, j], b = (v & top) + 1, int(v < 0)
        assert read_zeros(w, bits, Reading.V1_CARRY).tolist() == carry.tolist()
        assert read_zeros(w, bits, Reading.V2_BORROW).tolist() == borrow.tolist()


def test_nibble_reading_is_mod_16_at_8_bits():
    s = np.array([[127, 14, 15, 255]], np.uint8)
    w = pack(s, 8, 32, axis=1)
    assert read_zeros(w, 8, Reading.V1_NIBBLE)[0].tolist() == [0, 15, 0, 0]
    assert read_zeros(w, 8, Reading.V1_NOWRAP)[0].tolist() == [128, 15, 16, 256]


def test_truth_takes_a_stored_maxq_as_zero_unless_its_codes_say_otherwise():
    s = np.array([[15, 7, 15, 0, 8, 8, 8, 8]], np.uint8)
    assert truth_zeros(s, 4, GPTQ)[0, :4].tolist() == [0, 8, 0, 1]
    assert truth_zeros(s, 4, GPTQ, high=[2])[0, :4].tolist() == [0, 8, 16, 1]
    assert truth_zeros(s, 4, GPTQ_V2)[0, :4].tolist() == [15, 7, 15, 0]
