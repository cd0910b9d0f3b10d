"""gptqfmt.convert_qzeros: the types it takes (golden words), the types it refuses (UsageError,
exit 2, naming what was expected and what was got), and NotRepresentable as a GptqfmtError."""
import pickle

import numpy as np
import pytest
import torch

import gptqfmt
from gptqfmt import GptqfmtError, NotRepresentable, UsageError, convert_qzeros

# Golden words, written out by hand from the field layout (field k at bit k*bits, LSB first),
# never produced by the packer under test. Each row: (bits, numpy dtype, gptq words, gptq_v2
# words), both as unsigned bit patterns of the word size.
GOLDEN = [
    # 4-bit int32: eight fields of 7 (0111) -> eight of 8 (1000)
    (4, np.int32, [0x77777777, 0x77777777], [0x88888888, 0x88888888]),
    # 4-bit int32, fields LSB first [0, 2, 14, 7, 7, 7, 7, 7] -> [1, 3, 15, 8, 8, 8, 8, 8]
    # 0111 0111 0111 0111 0111 1110 0010 0000 -> 1000 1000 1000 1000 1000 1111 0011 0001
    (4, np.int32, [0x77777E20, 0x77777777], [0x88888F31, 0x88888888]),
    # 4-bit int8: fields [7, 7] -> [8, 8]
    (4, np.int8, [0x77, 0x77], [0x88, 0x88]),
    # 8-bit int16: fields [0x10, 0x20] -> [0x11, 0x21]
    (8, np.int16, [0x2010, 0x2010], [0x2111, 0x2111]),
    # 2-bit int64: 32 fields of 1 (01) -> 32 of 2 (10)
    (2, np.int64, [0x5555555555555555, 0x5555555555555555],
     [0xAAAAAAAAAAAAAAAA, 0xAAAAAAAAAAAAAAAA]),
    # 3-bit int32, one block of 32 fields in 3 words: all 3 (011) -> all 4 (100); stream bit i
    # is set where i % 3 != 2 (gptq) or i % 3 == 2 (gptq_v2)
    (3, np.int32, [0xDB6DB6DB, 0xB6DB6DB6, 0x6DB6DB6D], [0x24924924, 0x49249249, 0x92492492]),
]


def words(values, dtype):
    """Signed words of `dtype` from unsigned bit patterns, one row."""
    bits = np.dtype(dtype).itemsize * 8
    return np.array([[v - (1 << bits) if v >> (bits - 1) else v for v in values]], dtype=dtype)


def patterns(arr):
    bits = arr.dtype.itemsize * 8
    return [int(w) & ((1 << bits) - 1) for w in arr.reshape(-1)]


@pytest.mark.parametrize(("bits", "dtype", "v1", "v2"), GOLDEN)
def test_golden_numpy(bits, dtype, v1, v2):
    got = convert_qzeros(words(v1, dtype), bits, "gptq", "gptq_v2")
    assert type(got) is np.ndarray and got.dtype == dtype and got.shape == (1, len(v1))
    assert patterns(got) == v2
    back = convert_qzeros(words(v2, dtype), bits, "gptq_v2", "gptq")
    assert back.dtype == dtype and patterns(back) == v1


@pytest.mark.parametrize(("bits", "dtype", "v1", "v2"), GOLDEN)
def test_golden_torch(bits, dtype, v1, v2):
    t = torch.from_numpy(words(v1, dtype))
    got = convert_qzeros(t, bits, "gptq", "gptq_v2")
    assert isinstance(got, torch.Tensor) and got.dtype == t.dtype and got.device == t.device
    assert tuple(got.shape) == (1, len(v1))
    assert patterns(got.numpy()) == v2
    back = convert_qzeros(torch.from_numpy(words(v2, dtype)), bits, "gptq_v2", "gptq")
    assert back.dtype == t.dtype and patterns(back.numpy()) == v1


def test_torch_input_is_not_modified():
    t = torch.from_numpy(words([0x77777777], np.int32))
    convert_qzeros(t, 4)
    assert patterns(t.numpy()) == [0x77777777]


# Each refused input: (argument, bits, words that must appear in the message: what was expected
# and what was got).
REFUSED = {
    "list": ([[0x77777777] * 4] * 2, 4, ["numpy array or torch tensor", "got list", "int32"]),
    "tuple": (((0x77777777,),), 4, ["numpy array or torch tensor", "got tuple"]),
    "python-int": (0x77777777, 4, ["numpy array or torch tensor", "got int"]),
    "numpy-scalar": (np.int32(7), 4, ["numpy array or torch tensor", "got int32"]),
    "numpy-0d": (np.array(7, dtype=np.int32), 4, ["2 dimensions", "shape []"]),
    "numpy-1d": (np.zeros(4, dtype=np.int32), 4, ["2 dimensions", "shape [4]"]),
    "numpy-3d": (np.zeros((1, 2, 4), dtype=np.int32), 4, ["2 dimensions", "shape [1, 2, 4]"]),
    "numpy-float32": (np.zeros((2, 4), dtype=np.float32), 4, ["int8/int16/int32/int64",
                                                              "numpy array of float32"]),
    "numpy-float64": (np.zeros((2, 4)), 4, ["int32", "numpy array of float64"]),
    "numpy-bool": (np.zeros((2, 4), dtype=bool), 4, ["int32", "numpy array of bool"]),
    "numpy-uint32": (np.zeros((2, 4), dtype=np.uint32), 4, ["int32", "numpy array of uint32",
                                                            ".view(np.int32)"]),
    "numpy-object": (np.array([[1, 2], [3, 4]], dtype=object), 4, ["int32",
                                                                    "numpy array of object"]),
    "numpy-big-endian": (np.zeros((2, 4), dtype=">i4"), 4, ["native byte order", ">i4"]),
    "numpy-masked": (np.ma.zeros((2, 4), dtype=np.int32), 4, ["numpy array or torch tensor",
                                                              "got MaskedArray"]),
    "torch-bfloat16": (torch.zeros(2, 4, dtype=torch.bfloat16), 4, ["int32",
                                                                    "torch tensor of bfloat16"]),
    "torch-float32": (torch.zeros(2, 4), 4, ["int32", "torch tensor of float32"]),
    "torch-bool": (torch.zeros(2, 4, dtype=torch.bool), 4, ["int32", "torch tensor of bool"]),
    "torch-uint8": (torch.zeros(2, 4, dtype=torch.uint8), 4, ["int8", "torch tensor of uint8"]),
    "torch-0d": (torch.tensor(7, dtype=torch.int32), 4, ["2 dimensions", "shape []"]),
    "torch-1d": (torch.zeros(4, dtype=torch.int32), 4, ["2 dimensions", "shape [4]"]),
    "bits-5": (np.zeros((2, 4), dtype=np.int32), 5, ["(2, 3, 4, 8)", "got 5"]),
    "bits-bool": (np.zeros((2, 4), dtype=np.int32), True, ["(2, 3, 4, 8)", "got True"]),
    "bits-float": (np.zeros((2, 4), dtype=np.int32), 4.0, ["(2, 3, 4, 8)", "got 4.0"]),
    "bits-3-int16": (np.zeros((2, 3), dtype=np.int16), 3, ["int32 words", "int16"]),
    "bits-3-partial-block": (np.zeros((2, 4), dtype=np.int32), 3, ["multiple of 3 words",
                                                                   "[2, 4]"]),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_inputs(case):
    arg, bits, words_in_message = REFUSED[case]
    with pytest.raises(UsageError) as e:
        convert_qzeros(arg, bits)
    assert isinstance(e.value, GptqfmtError) and e.value.exit_code == 2
    for w in words_in_message:
        assert w in str(e.value), (case, str(e.value))


@pytest.mark.parametrize(("src", "dst"), [("gptq", "v2"), ("auto", "gptq")])
def test_unknown_convention_is_a_usage_error(src, dst):
    with pytest.raises(UsageError, match="expected one of"):
        convert_qzeros(words([0x77777777], np.int32), 4, src, dst)


def test_not_representable_is_a_finding_class_error():
    v1 = words([0x7777777F], np.int32)  # field 0 stores 15 (maxq): no lossless gptq_v2 value
    with pytest.raises(NotRepresentable) as e:
        convert_qzeros(v1, 4, "gptq", "gptq_v2")
    assert isinstance(e.value, gptqfmt.GptqfmtError)
    assert e.value.exit_code == 1 and e.value.count == 1
    back = pickle.loads(pickle.dumps(e.value))
    assert type(back) is NotRepresentable
    assert (str(back), back.count, back.exit_code) == (str(e.value), 1, 1)
