"""Strict safetensors header parsing: pure functions over bytes, one finding code per rule.

Layout: 8-byte little-endian header length N, N bytes of UTF-8 JSON, then the data buffer.
Every rule of the reference reader (safetensors 0.8) is enforced, and a few more: duplicate keys
(the reference keeps the last), data past the end of the file and trailing bytes get distinct
codes (the reference reports both as "incomplete metadata").
"""
from __future__ import annotations

import json
import struct
import sys
from dataclasses import dataclass
from math import prod
from typing import NamedTuple, NoReturn

from ..errors import FindingError
from ..findings import Finding
from . import compiled, foreign
from .dtypes import DTYPES, nbytes

MAX_HEADER_LEN = 100_000_000
METADATA_KEY = "__metadata__"
#: the bytes a header's JSON may begin with: whitespace or the object's brace
JSON_START = b" \t\r\n{"
_U64_MAX = 2**64 - 1


class TensorInfo(NamedTuple):
    """One tensor's header entry. A named tuple, not a frozen dataclass: a mixture of experts'
    headers hold hundreds of thousands, and a tuple is built in a quarter of the time."""
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # offsets relative to the data buffer
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numel(self) -> int:
        return prod(self.shape)


@dataclass(frozen=True)
class Header:
    tensors: dict[str, TensorInfo]      # in data order
    metadata: dict[str, str] | None
    header_len: int                     # N
    data_len: int                       # bytes of the data buffer actually covered by tensors

    @property
    def data_start(self) -> int:
        return 8 + self.header_len


def header_length(prefix: bytes, file_size: int, path: str, location: str | None = None) -> int:
    """Check the file's first bytes `prefix` (foreign.SNIFF_BYTES of them, or the whole file if
    shorter) and return N. A file in another format is named as such first (GQ117, GQ130), so
    that its magic number is never reported as a header length; `location` is the file as the
    user reaches it, for the next step's command (default `path`)."""
    other = other_format(prefix)
    if other is not None:
        raise FindingError(foreign.finding(other, path, location or path))
    if file_size < 8 or len(prefix) < 8:
        _fail("GQ101", path, None, f"file has {file_size} bytes; a safetensors file needs at least "
              "8 (the header length)")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_LEN:
        _fail("GQ102", path, None, f"header length {n} exceeds the limit of {MAX_HEADER_LEN} bytes")
    if 8 + n > file_size:
        _fail("GQ103", path, None, f"header length {n} needs {8 + n} bytes; the file has "
              f"{file_size}", "the file is truncated or not safetensors")
    return n


def other_format(prefix: bytes) -> foreign.Other | None:
    """The other format that a file's first bytes name, where they cannot begin a safetensors
    file. A header length within the limit followed by JSON's first byte (or by nothing, in a
    truncated file) stays safetensors whatever it looks like: a header of 896 bytes begins
    80 03, as a pickle does, and PyTorch's ZIP magic reads as 67,324,752."""
    if len(prefix) >= 8:
        (n,) = struct.unpack("<Q", prefix[:8])
        if n <= MAX_HEADER_LEN and prefix[8:9] in JSON_START:  # b"" (nothing) is in it too
            return None
    return foreign.identify(prefix)


_BITS = {name: d.bits for name, d in DTYPES.items()}


def parse_header(raw: bytes, file_size: int, path: str) -> Header:
    """Parse and validate header JSON `raw` (the N bytes after the length) of a file of
    `file_size`.

    A header of the plain kind every writer writes (printable ASCII strings, entries of
    exactly dtype, shape and data_offsets, tensors tiling the data) is read in one compiled
    pass where the install built it (compiled.scan); that pass takes nothing it is not
    sure of, and whatever it leaves is read here, with a finding for the first rule broken.
    Both give the same Header for the same bytes."""
    plain = compiled.scan(raw, _BITS, TensorInfo)
    if plain is not None:
        tensors, metadata, data_len = plain
        last = next(reversed(tensors)) if tensors else None
        _check_data_end(last, data_len, len(raw), file_size, path)
        return Header(tensors, metadata, len(raw), data_len)
    return _parse_header(raw, file_size, path)


def _parse_header(raw: bytes, file_size: int, path: str) -> Header:
    n = len(raw)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        _fail("GQ104", path, None, f"header is not UTF-8: byte {e.start} ({raw[e.start]:#04x})")
    try:
        floats: list[float] = []   # any at all: alike entries' dimensions are type-tested

        def parse_float(x: str) -> float:
            floats.append(float(x))
            return floats[-1]
        # the -0 rule costs a Python call per integer: only where "-0" is in the text at all
        doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                         parse_int=_strict_int if "-0" in text else None,
                         parse_float=parse_float)
    except _Duplicate as e:
        _fail("GQ107", path, e.key, "key appears more than once in the header")
    except (ValueError, RecursionError) as e:
        reason = "nested too deeply" if isinstance(e, RecursionError) else str(e)
        _fail("GQ105", path, None, f"header is not valid JSON: {reason}")
    if not isinstance(doc, dict):
        _fail("GQ106", path, None, f"header must be a JSON object; got {_json_type(doc)}")

    for key in doc:
        _check_text(key, path)
    metadata = doc.pop(METADATA_KEY, None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        _fail("GQ116", path, None, "__metadata__ must map strings to strings; got "
              + _json_type(metadata if not isinstance(metadata, dict) else
                           next(v for v in metadata.values() if not isinstance(v, str))))
    for k, v in (metadata or {}).items():
        _check_text(k, path)
        _check_text(v, path)

    checked: dict[tuple[str, tuple[int, ...]], tuple[str, tuple[int, ...], int]] = {}
    # no float and no boolean anywhere: a dimension that hashes like a checked one is an int
    # (4.0 and True hash as 4 and 1 do)
    ints = not floats and "true" not in text and "false" not in text
    infos = [_tensor_info(name, entry, path, checked, ints) for name, entry in doc.items()]
    infos.sort(key=lambda t: (t.begin, t.end))
    expected = 0
    for t in infos:
        if t.begin != expected:
            what = "a hole before it" if t.begin > expected else "overlaps the previous tensor"
            _fail("GQ113", path, t.name, f"data_offsets [{t.begin}, {t.end}]: expected to begin "
                  f"at {expected}; {what}")
        expected = t.end
    _check_data_end(infos[-1].name if infos else None, expected, n, file_size, path)
    return Header({t.name: t for t in infos}, metadata, n, expected)


def _check_data_end(last: str | None, expected: int, n: int, file_size: int, path: str) -> None:
    """GQ114 or GQ115 where the tensors' data (`expected` bytes, `last` the tensor that ends
    it) does not end where the file of `file_size` with a header of `n` bytes does."""
    data_avail = file_size - 8 - n
    if expected > data_avail:
        _fail("GQ114", path, last, f"data ends at byte {8 + n + expected}; the file has "
              f"{file_size} bytes", "the file is truncated: download it again")
    if expected < data_avail:
        _fail("GQ115", path, None, f"{data_avail - expected} bytes after the last tensor "
              f"(data ends at byte {8 + n + expected}, file has {file_size})")


def _tensor_info(name: str, entry, path: str,
                 checked: dict[tuple[str, tuple[int, ...]], tuple[str, tuple[int, ...], int]],
                 ints: bool = False) -> TensorInfo:
    """The entry of tensor `name`, checked. `checked`: per (dtype, shape) met so far in the
    file, the dtype's one string, the shape kept once and its byte size: an entry of a dtype
    and shape already checked (most of them: a mixture of experts' headers hold hundreds of
    thousands of alike entries) has only its offsets checked. `ints`: the header holds no
    float and no boolean, so a shape that hits a checked one is of ints."""
    try:
        dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        known = checked.get((dtype, tuple(shape)))
    except (TypeError, KeyError):   # not an object, a key missing, or a value of a wrong type
        known = None
    if known is not None and type(offsets) is list and len(offsets) == 2 and \
            (ints or all(type(d) is int for d in shape)):   # 4.0 == 4: a float is no hit
        begin, end = offsets
        if type(begin) is int and type(end) is int and 0 <= begin <= end <= _U64_MAX and \
                end - begin == known[2]:
            return TensorInfo(name, known[0], known[1], begin, end)
    return _checked_info(name, entry, path, checked)


def _checked_info(name: str, entry, path: str,
                  checked: dict[tuple[str, tuple[int, ...]], tuple[str, tuple[int, ...], int]]
                  ) -> TensorInfo:
    """_tensor_info's every check, one finding for the first that fails; what passes is kept
    in `checked`."""
    if not isinstance(entry, dict):
        _fail("GQ106", path, name, f"entry must be an object; got {_json_type(entry)}")
    for key, kind in (("dtype", str), ("shape", list), ("data_offsets", list)):
        if key not in entry:
            _fail("GQ106", path, name, f"entry lacks '{key}'")
        if not isinstance(entry[key], kind):
            _fail("GQ106", path, name, f"'{key}' must be a {kind.__name__}; got "
                  f"{_json_type(entry[key])}")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPES:
        _fail("GQ108", path, name, f"unknown dtype {dtype!r}; expected one of "
              + ", ".join(DTYPES))
    if not all(_is_uint(d) and d <= _U64_MAX for d in shape):
        _fail("GQ109", path, name, f"shape {_short(shape)}: dimensions must be non-negative "
              "integers")
    if len(offsets) != 2 or not all(_is_uint(o) for o in offsets):
        _fail("GQ110", path, name, f"data_offsets {_short(offsets)}: expected two non-negative "
              "integers [begin, end]")
    begin, end = offsets
    if end < begin or end > _U64_MAX:
        _fail("GQ110", path, name, f"data_offsets [{begin}, {end}]: end before begin or too big")
    numel = prod(shape)
    size = nbytes(dtype, numel)
    if numel > _U64_MAX or (size is not None and size > _U64_MAX):
        _fail("GQ111", path, name, f"shape {_short(shape)} of {dtype} overflows 64 bits")
    if size is None:
        _fail("GQ112", path, name, f"shape {_short(shape)} of {dtype} is not a whole number of "
              "bytes")
    if end - begin != size:
        _fail("GQ112", path, name, f"data_offsets span {end - begin} bytes; shape "
              f"{_short(shape)} of {dtype} needs {size}")
    shape_t = tuple(shape)
    known = checked.setdefault((dtype, shape_t), (sys.intern(dtype), shape_t, size))
    return TensorInfo(name, known[0], known[1], begin, end)


class _Duplicate(ValueError):
    def __init__(self, key):
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs):
    out = dict(pairs)
    if len(out) != len(pairs):   # the first key met twice
        seen: set[str] = set()
        for k, _ in pairs:
            if k in seen:
                raise _Duplicate(k)
            seen.add(k)
    return out


def _no_constant(name):
    raise ValueError(f"{name} is not JSON")


def _strict_int(text: str) -> int:
    return -1 if text == "-0" else int(text)  # the reference refuses -0 where it wants usize


def _check_text(s: str, path: str) -> None:
    """Lone surrogates (\\ud800 escapes) are not Unicode text; the reference refuses them."""
    if not s.isascii() and any("\ud800" <= ch <= "\udfff" for ch in s):
        _fail("GQ105", path, None, "header is not valid JSON: a string holds a lone surrogate "
              "escape")


def _is_uint(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _json_type(x) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null", int: "an integer", float: "a number"}.get(type(x), type(x).__name__)


def _short(x) -> str:
    s = json.dumps(x)
    return s if len(s) <= 80 else s[:77] + "..."


def _fail(code: str, path: str, tensor: str | None, message: str,
          hint: str | None = None) -> NoReturn:
    raise FindingError(Finding(code, message, file=path, tensor=tensor, hint=hint))
