"""The safetensors reader: one test per rejection rule, and the official library as an oracle."""
import json
import struct

import numpy as np
import pytest
import safetensors.numpy as st_np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptqfmt.errors import FindingError
from gptqfmt.safetensors_io import SafetensorsFile, save_file

T2 = {"dtype": "F16", "shape": [1], "data_offsets": [0, 2]}


def raw_file(header, data=b"", length=None):
    h = header if isinstance(header, bytes) else json.dumps(header).encode()
    n = len(h) if length is None else length
    return struct.pack("<Q", n) + h + data


def ours(tmp_path, blob):
    p = tmp_path / "x.safetensors"
    p.write_bytes(blob)
    f = SafetensorsFile(p)
    return {k: np.array(f.view(k)) for k in f.tensors}


def oracle(blob):
    return st_np.load(blob)


def deep(n):
    return b"{\"a\":" + b"[" * n + b"]" * n + b"}"


# (code, file bytes, whether the reference library rejects it too)
REJECTIONS = {
    "short-file": ("GQ101", b"\x01\x00\x00", True),
    "header-too-large": ("GQ102", struct.pack("<Q", 100_000_001) + b"{}", True),
    "header-past-eof": ("GQ103", raw_file(b"{}", length=100), True),
    "not-utf8": ("GQ104", raw_file(b'{"a\xff":1}'), True),
    "not-json": ("GQ105", raw_file(b'{"a":'), True),
    "nan-literal": ("GQ105", raw_file(b'{"__metadata__":{"a":NaN}}'), True),
    "nested-100k-deep": ("GQ105", raw_file(deep(100_000)), True),
    "not-an-object": ("GQ106", raw_file(b"[]"), True),
    "entry-not-object": ("GQ106", raw_file({"a": 3}), True),
    "entry-missing-dtype": ("GQ106", raw_file({"a": {"shape": [1], "data_offsets": [0, 2]}},
                                              b"\0\0"), True),
    "shape-not-list": ("GQ106", raw_file({"a": {**T2, "shape": 1}}, b"\0\0"), True),
    "duplicate-key": ("GQ107", raw_file(b'{"a":' + json.dumps(T2).encode() + b',"a":'
                                        + json.dumps(T2).encode() + b"}", b"\0\0"), False),
    "unknown-dtype": ("GQ108", raw_file({"a": {**T2, "dtype": "F17"}}, b"\0\0"), True),
    "lowercase-dtype": ("GQ108", raw_file({"a": {**T2, "dtype": "f16"}}, b"\0\0"), True),
    "negative-dim": ("GQ109", raw_file({"a": {**T2, "shape": [-1]}}, b"\0\0"), True),
    "huge-dim-zero-numel": ("GQ109", raw_file({"a": {**T2, "shape": [0, 2**64],
                                                      "data_offsets": [0, 0]}}), True),
    "minus-zero-dim": ("GQ109", raw_file(b'{"a":{"dtype":"F16","shape":[-0],'
                                         b'"data_offsets":[0,0]}}'), True),
    "lone-surrogate-name": ("GQ105", raw_file(b'{"\\ud800":{"dtype":"F16","shape":[1],'
                                              b'"data_offsets":[0,2]}}', b"\0\0"), True),
    "lone-surrogate-metadata": ("GQ105", raw_file(b'{"__metadata__":{"a":"\\udfff"}}'), True),
    "float-dim": ("GQ109", raw_file({"a": {**T2, "shape": [1.0]}}, b"\0\0"), True),
    "bool-dim": ("GQ109", raw_file({"a": {**T2, "shape": [True]}}, b"\0\0"), True),
    "three-offsets": ("GQ110", raw_file({"a": {**T2, "data_offsets": [0, 2, 4]}}, b"\0\0"), True),
    "negative-offset": ("GQ110", raw_file({"a": {**T2, "data_offsets": [-2, 0]}}, b"\0\0"), True),
    "end-before-begin": ("GQ110", raw_file({"a": {**T2, "data_offsets": [2, 0]}}, b"\0\0"), True),
    "shape-overflow": ("GQ111", raw_file({"a": {**T2, "shape": [2**32, 2**32, 4]}}, b"\0\0"),
                       True),
    "span-mismatch": ("GQ112", raw_file({"a": {**T2, "shape": [2]}}, b"\0\0"), True),
    "sub-byte-misaligned": ("GQ112", raw_file({"a": {"dtype": "F4", "shape": [3],
                                                     "data_offsets": [0, 2]}}, b"\0\0"), True),
    "hole-at-start": ("GQ113", raw_file({"a": {**T2, "data_offsets": [2, 4]}}, b"\0" * 4), True),
    "aliasing": ("GQ113", raw_file({"a": T2, "b": T2}, b"\0\0"), True),
    "overlap": ("GQ113", raw_file({"a": {**T2, "shape": [2], "data_offsets": [0, 4]},
                                   "b": {**T2, "data_offsets": [2, 4]}}, b"\0" * 4), True),
    "truncated-data": ("GQ114", raw_file({"a": {**T2, "shape": [4], "data_offsets": [0, 8]}},
                                         b"\0" * 5), True),
    "trailing-bytes": ("GQ115", raw_file({"a": T2}, b"\0\0\0"), True),
    "metadata-int-value": ("GQ116", raw_file({"__metadata__": {"a": 1}}), True),
    "metadata-not-object": ("GQ116", raw_file({"__metadata__": ["a"]}), True),
    "lfs-pointer": ("GQ117", b"version https://git-lfs.github.com/spec/v1\noid sha256:"
                    + b"0" * 64 + b"\nsize 123\n", True),
}


@pytest.mark.parametrize("case", sorted(REJECTIONS))
def test_each_rule_rejects_with_its_code(tmp_path, case):
    code, blob, reference_rejects = REJECTIONS[case]
    with pytest.raises(FindingError) as e:
        ours(tmp_path, blob)
    assert e.value.finding.code == code
    assert e.value.finding.file.endswith("x.safetensors")
    assert "\n" not in str(e.value)
    if reference_rejects:
        with pytest.raises(Exception):
            oracle(blob)
    else:  # stricter than the reference: it keeps the last duplicate silently
        oracle(blob)


def test_huge_header_claim_allocates_nothing(tmp_path):
    # a length of 2^63 must be refused from the 8-byte prefix, before any read of that size
    blob = struct.pack("<Q", 2**63) + b"{}"
    with pytest.raises(FindingError) as e:
        ours(tmp_path, blob)
    assert e.value.finding.code == "GQ102"


ACCEPTED = {
    "leading-whitespace": raw_file(b"  \t\n" + json.dumps({"a": T2}).encode(), b"\x00\x3c"),
    "trailing-spaces": raw_file(json.dumps({"a": T2}).encode() + b"    ", b"\x00\x3c"),
    "unknown-field": raw_file({"a": {**T2, "extra": [1, 2]}}, b"\x00\x3c"),
    "metadata-null": raw_file({"__metadata__": None, "a": T2}, b"\x00\x3c"),
    "empty": raw_file({}),
    "scalar": raw_file({"a": {**T2, "shape": []}}, b"\x00\x3c"),
    "zero-size-tensors": raw_file({"a": {**T2, "shape": [0, 3], "data_offsets": [0, 0]},
                                   "b": {**T2, "shape": [0], "data_offsets": [0, 0]},
                                   "c": {**T2, "data_offsets": [0, 2]}}, b"\x00\x3c"),
    "unordered-entries": raw_file({"b": {**T2, "data_offsets": [2, 4]}, "a": T2},
                                  b"\x00\x3c\x00\xbc"),
}


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_accepts_what_the_reference_accepts_with_identical_values(tmp_path, case):
    blob = ACCEPTED[case]
    got, want = ours(tmp_path, blob), oracle(blob)
    assert sorted(got) == sorted(want)
    for k in want:
        assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape
        assert np.array_equal(got[k], want[k])


def test_views_are_zero_copy_and_read_only(tmp_path):
    p = tmp_path / "m.safetensors"
    save_file({"w": np.arange(12, dtype=np.int32).reshape(3, 4)}, p)
    f = SafetensorsFile(p)
    v = f.view("w")
    assert not v.flags.writeable and not v.flags.owndata
    f.close()
    assert v.sum() == 66  # the mapping outlives close() through the view


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_headers_agree_with_reference(tmp_path_factory, data):
    base = st_np.save({"a": np.arange(6, dtype=np.float16).reshape(2, 3),
                       "b": np.arange(4, dtype=np.int32)}, metadata={"format": "pt"})
    blob = bytearray(base)
    for _ in range(data.draw(st.integers(1, 4))):
        op = data.draw(st.sampled_from(["flip", "cut", "append", "insert"]))
        pos = data.draw(st.integers(0, max(0, len(blob) - 1)))
        if op == "flip" and blob:
            blob[pos] ^= 1 << data.draw(st.integers(0, 7))
        elif op == "cut":
            del blob[pos:pos + data.draw(st.integers(1, 8))]
        elif op == "append":
            blob += data.draw(st.binary(min_size=1, max_size=4))
        else:
            blob[pos:pos] = data.draw(st.binary(min_size=1, max_size=4))
    blob = bytes(blob)
    tmp = tmp_path_factory.mktemp("fz")
    try:
        got = ours(tmp, blob)
    except FindingError as e:
        got, code = None, e.finding.code
    try:
        want = oracle(blob)
    except Exception:
        want = None
    if got is not None:
        assert want is not None, "we accepted a file the reference rejects"
        assert sorted(got) == sorted(want)
        for k in want:
            assert np.array_equal(got[k], want[k], equal_nan=want[k].dtype.kind == "f")
    elif want is not None:
        assert code in {"GQ107"}, f"rejected ({code}) a file the reference accepts"


@pytest.mark.parametrize("dtype", ["F16", "BF16", "F32"])
def test_positive_finite_max_on_the_bits(dtype):
    """The scale check's fast path: the max when every value is finite and > 0, from integer
    reductions over the bits; None for any 0, -0, negative, infinity or NaN (then the float
    path names the first bad scale)."""
    from gptqfmt.safetensors_io.dtypes import f32_to_bf16, positive_finite_max, to_float32

    def stored(values):
        x = np.asarray(values, dtype=np.float32)
        return {"F16": lambda: x.astype(np.float16), "BF16": lambda: f32_to_bf16(x),
                "F32": lambda: x}[dtype]()
    tiny = {"F16": 6e-8, "BF16": 1e-38, "F32": 1e-45}[dtype]   # the smallest subnormals
    big = {"F16": 65504.0, "BF16": 3.3895e38, "F32": 3.4028235e38}[dtype]
    ok = stored([0.5, tiny, 3.0, big])
    assert positive_finite_max(ok, dtype) == float(to_float32(ok, dtype).max()) > 1e4
    for bad in (0.0, -0.0, -1.0, -tiny, np.inf, -np.inf, np.nan):
        values = stored([0.5, bad, 3.0])
        assert positive_finite_max(values, dtype) is None, bad
    assert positive_finite_max(stored([]), dtype) == 0.0
    assert positive_finite_max(np.zeros(2, np.int32), "I32") is None
