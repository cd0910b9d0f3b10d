"""The safetensors reader: one test per rejection rule, and the official library as an oracle."""
import io
import json
import pickle
import shlex
import struct
import subprocess
import sys
import zipfile

import numpy as np
import pytest
import safetensors.numpy as st_np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gptqfmt.errors import FindingError
from gptqfmt.safetensors_io import SafetensorsFile, reader, save_file
from gptqfmt.safetensors_io.foreign import SNIFF_BYTES
from gptqfmt.safetensors_io.header import other_format

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


def torch_zip(archive, first="data.pkl"):
    """The bytes torch.save writes, in miniature: a ZIP whose first entry is <archive>/data.pkl."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr(f"{archive}/{first}", pickle.dumps({}, protocol=2))
        z.writestr(f"{archive}/version", "3\n")
    return buf.getvalue()


# torch.save(..., _use_new_zipfile_serialization=False) begins with the pickled magic number
# 0x1950a86a20f9469cfc6c (PROTO 2, LONG1 of 10 bytes, STOP), then the protocol version
TORCH_LEGACY = b"\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.\x80\x02M\xe9\x03.\x80\x02}q\x00."


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
    "gguf": ("GQ130", b"GGUF" + struct.pack("<IQQ", 3, 0, 0), True),
    "torch-zip": ("GQ130", torch_zip("x"), True),
    "torch-legacy": ("GQ130", TORCH_LEGACY, True),
    "pickle": ("GQ130", pickle.dumps({"a": 1}, protocol=4), True),
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


# the second of two entries of one dtype and shape, wrong in one way (an entry alike one
# already checked has only its offsets checked, yet the same rules hold for it)
B = {**T2, "data_offsets": [2, 4]}
AFTER_ALIKE = {
    "float-dim": ("GQ109", {**B, "shape": [1.0]}),
    "bool-dim": ("GQ109", {**B, "shape": [True]}),
    "float-offset": ("GQ110", {**B, "data_offsets": [2.0, 4]}),
    "bool-offset": ("GQ110", {**B, "data_offsets": [2, True]}),
    "three-offsets": ("GQ110", {**B, "data_offsets": [2, 4, 6]}),
    "end-before-begin": ("GQ110", {**B, "data_offsets": [4, 2]}),
    "span-mismatch": ("GQ112", {**B, "data_offsets": [2, 6]}),
    "offsets-not-list": ("GQ106", {**B, "data_offsets": "2,4"}),
    "dtype-not-string": ("GQ106", {**B, "dtype": ["F16"]}),
    "missing-shape": ("GQ106", {"dtype": "F16", "data_offsets": [2, 4]}),
}


@pytest.mark.parametrize("case", sorted(AFTER_ALIKE))
def test_an_entry_alike_one_checked_is_held_to_every_rule(tmp_path, case):
    code, second = AFTER_ALIKE[case]
    blob = raw_file(json.dumps({"a": T2, "b": second}).encode(), b"\0" * 6)
    with pytest.raises(FindingError) as e:
        ours(tmp_path, blob)
    assert (e.value.finding.code, e.value.finding.tensor) == (code, "b")


def test_alike_entries_share_one_dtype_and_shape(tmp_path):
    blob = raw_file({n: {**T2, "data_offsets": [2 * i, 2 * i + 2]} for i, n in
                     enumerate("abc")}, b"\0" * 6)
    p = tmp_path / "x.safetensors"
    p.write_bytes(blob)
    infos = list(SafetensorsFile(p).tensors.values())
    assert [(t.begin, t.end) for t in infos] == [(0, 2), (2, 4), (4, 6)]
    assert all(t.shape is infos[0].shape and t.dtype is infos[0].dtype for t in infos)


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
def test_finite_nonzero_absmax_on_the_bits(dtype):
    """The scale check's fast path: the largest magnitude when every value is finite and
    nonzero, of either sign (auto-round stores negative scales), from integer reductions over
    the bits; None for any 0, -0, infinity or NaN (then the float path names the first bad
    scale)."""
    from gptqfmt.safetensors_io.dtypes import f32_to_bf16, finite_nonzero_absmax, to_float32

    def stored(values):
        x = np.asarray(values, dtype=np.float32)
        return {"F16": lambda: x.astype(np.float16), "BF16": lambda: f32_to_bf16(x),
                "F32": lambda: x}[dtype]()
    tiny = {"F16": 6e-8, "BF16": 1e-38, "F32": 1e-45}[dtype]   # the smallest subnormals
    big = {"F16": 65504.0, "BF16": 3.3895e38, "F32": 3.4028235e38}[dtype]
    ok = stored([0.5, tiny, 3.0, big])
    assert finite_nonzero_absmax(ok, dtype) == float(to_float32(ok, dtype).max()) > 1e4
    # a negative extreme is the largest magnitude: 4.0, not the largest value 3.0
    signed = stored([0.5, -tiny, 3.0, -4.0])
    assert finite_nonzero_absmax(signed, dtype) == 4.0
    assert finite_nonzero_absmax(stored([-big, 1.0]), dtype) == float(
        np.abs(to_float32(stored([-big]), dtype))[0])
    for bad in (0.0, -0.0, np.inf, -np.inf, np.nan):
        values = stored([0.5, bad, -3.0])
        assert finite_nonzero_absmax(values, dtype) is None, bad
    assert finite_nonzero_absmax(stored([]), dtype) == 0.0
    assert finite_nonzero_absmax(np.zeros(2, np.int32), "I32") is None


# (file bytes, what the message must name, what the hint must hold); the file is x.safetensors
OTHER_FORMATS = {
    "gguf-v3": (b"GGUF" + struct.pack("<IQQ", 3, 0, 0),
                "a GGUF file (version 3), llama.cpp's format, not safetensors; gptqfmt checks "
                "GPTQ checkpoints in safetensors, so there is nothing here for it to check",
                "`gguf-dump {path}` (pip install gguf)"),
    "gguf-implausible-version": (b"GGUF" + b"\xff" * 20, "a GGUF file, llama.cpp's format, not",
                                 "gguf-dump"),
    "gguf-4-bytes": (b"GGUF", "a GGUF file, llama.cpp's format, not safetensors", "gguf-dump"),
    "torch-zip": (torch_zip("x"), "a PyTorch checkpoint (torch.save's ZIP format, entry "
                  "x/data.pkl), not safetensors", "torch.load(\"{path}\""),
    "torch-legacy-protocol-2": (TORCH_LEGACY, "a PyTorch checkpoint (torch.save's legacy pickle "
                                "format), not safetensors", "torch.load(\"{path}\""),
    "torch-legacy-protocol-4": (b"\x80\x04\x95" + struct.pack("<Q", 13) + TORCH_LEGACY[2:],
                                "torch.save's legacy pickle format", "torch.load("),
    "pickle-protocol-5": (pickle.dumps([1, 2], protocol=5), "a Python pickle (protocol 5), "
                          "not safetensors", "safetensors.torch.save_file"),
    "zip-of-something-else": (torch_zip("x", first="notes.txt"), "a ZIP archive (first entry "
                              "x/notes.txt), not safetensors", "`unzip {path} -d {stem}`"),
    "zip-entry-with-control-bytes": (torch_zip("x\x1b[31m"), "a ZIP archive, not safetensors",
                                     "unzip"),
}


@pytest.mark.parametrize("case", sorted(OTHER_FORMATS))
def test_another_format_is_named_not_measured(tmp_path, case):
    blob, what, step = OTHER_FORMATS[case]
    p = tmp_path / "x.safetensors"
    p.write_bytes(blob)
    with pytest.raises(FindingError) as e:
        SafetensorsFile(p)
    f = e.value.finding
    assert (f.code, f.file) == ("GQ130", str(p))
    assert what in f.message and "header length" not in f.message
    assert step.format(path=p, stem=tmp_path / "x") in f.hint
    assert "\x1b" not in f.message + f.hint


def test_a_torch_file_gets_the_command_that_converts_it(tmp_path):
    """The hint's command is real: run as printed, it writes safetensors that gptqfmt reads,
    holding the same tensors bit for bit (tied weights too)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("safetensors.torch")
    w = torch.arange(12, dtype=torch.int32).reshape(3, 4)
    state = {"a.qweight": w, "a.scales": torch.ones(2, dtype=torch.float16), "tied": w}
    src = tmp_path / "dir with space" / "pytorch_model.bin"
    src.parent.mkdir()
    torch.save(state, src)
    with pytest.raises(FindingError) as e:
        SafetensorsFile(src)
    hint = e.value.finding.hint
    command = hint[hint.index("`") + 1:hint.rindex("`")]
    subprocess.run(["bash", "-c", command.replace("python -c", f"{sys.executable} -c", 1)],
                   check=True, cwd=tmp_path, timeout=120)
    target = src.parent / "model.safetensors"
    assert hint.endswith(f", then pass {shlex.quote(str(target))}")
    out = SafetensorsFile(target)
    assert sorted(out.tensors) == sorted(state)
    for k, v in state.items():
        assert np.array_equal(out.view(k), v.numpy())


def test_lfs_pointer_hint_pulls_in_the_users_directory(tmp_path):
    p = tmp_path / "ckpt" / "model.safetensors"
    p.parent.mkdir()
    p.write_bytes(REJECTIONS["lfs-pointer"][1])
    with pytest.raises(FindingError) as e:
        SafetensorsFile(p)
    assert e.value.finding.code == "GQ117"
    assert f"`cd {p.parent} && git lfs pull`" in e.value.finding.hint


@pytest.mark.parametrize("n", [640, 896, 0x04034B50])
def test_a_header_length_that_looks_like_a_magic_number_stays_safetensors(n):
    """Lengths whose bytes begin like a pickle (80 02, 80 03) or a ZIP (PK 03 04): followed by
    JSON, or by nothing (a truncated file), they are safetensors."""
    prefix = struct.pack("<Q", n)
    assert other_format(prefix + b'{"a"') is None
    assert other_format(prefix + b' {"a"') is None
    assert other_format(prefix) is None
    assert other_format(prefix + b"\x00") is not None


def test_a_pickle_like_header_of_896_bytes_reads_and_its_truncation_is_gq103(tmp_path):
    body = json.dumps({"a": T2}).encode()
    blob = raw_file(body + b" " * (896 - len(body)), b"\x00\x3c")
    assert blob[:2] == b"\x80\x03"  # what a protocol 3 pickle begins with
    assert sorted(ours(tmp_path, blob)) == ["a"]
    with pytest.raises(FindingError) as e:
        ours(tmp_path, blob[:60])
    assert e.value.finding.code == "GQ103"


def test_sniffing_reads_only_the_first_bytes(tmp_path, monkeypatch):
    """A 4 GiB GGUF file (sparse here) is named from its first SNIFF_BYTES bytes: nothing
    else is read, whether it is opened as a shard or looked at in a directory."""
    p = tmp_path / "big.gguf"
    with open(p, "wb") as f:
        f.write(b"GGUF" + struct.pack("<I", 3))
        f.truncate(4 << 30)
    reads = []
    real_open = open

    class Counting(io.FileIO):
        def read(self, size=-1):
            data = super().read(size)
            reads.append(len(data))
            return data

    def counting_open(path, mode="r", *args, **kwargs):
        return Counting(path, "rb") if mode == "rb" else real_open(path, mode, *args, **kwargs)

    monkeypatch.setattr(reader, "open", counting_open, raising=False)
    with pytest.raises(FindingError) as e:
        SafetensorsFile(p)
    assert e.value.finding.code == "GQ130"
    assert reader.sniff(p).kind == "gguf"
    assert reads and sum(reads) <= 2 * SNIFF_BYTES and max(reads) <= SNIFF_BYTES
