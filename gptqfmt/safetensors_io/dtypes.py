"""safetensors dtype names: their sizes, their order, and the numpy dtype used to view them.

The order is the reference library's enum order; its writer sorts tensors by it (descending).
numpy has no bfloat16 or float8: those are viewed as raw unsigned words of the same width
(`raw=True` in DTypeInfo), and `bf16_to_f32` widens BF16 exactly.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..bits import native


@dataclass(frozen=True)
class DTypeInfo:
    name: str
    bits: int           # bits per element (4 and 6 for the sub-byte float formats)
    numpy: np.dtype     # little-endian dtype of a view; raw containers for bf16/f8/f4/f6
    raw: bool = False   # True when `numpy` is only a container of the right width


def _d(name, bits, np_dtype, raw=False):
    return DTypeInfo(name, bits, np.dtype(np_dtype).newbyteorder("<"), raw)


_ORDERED = [
    _d("BOOL", 8, np.bool_), _d("F4", 4, np.uint8, True), _d("F6_E2M3", 6, np.uint8, True),
    _d("F6_E3M2", 6, np.uint8, True), _d("U8", 8, np.uint8), _d("I8", 8, np.int8),
    _d("F8_E5M2", 8, np.uint8, True), _d("F8_E4M3", 8, np.uint8, True),
    _d("F8_E8M0", 8, np.uint8, True), _d("F8_E4M3FNUZ", 8, np.uint8, True),
    _d("F8_E5M2FNUZ", 8, np.uint8, True), _d("I16", 16, np.int16), _d("U16", 16, np.uint16),
    _d("F16", 16, np.float16), _d("BF16", 16, np.uint16, True), _d("I32", 32, np.int32),
    _d("U32", 32, np.uint32), _d("F32", 32, np.float32), _d("C64", 64, np.complex64),
    _d("F64", 64, np.float64), _d("I64", 64, np.int64), _d("U64", 64, np.uint64),
]

DTYPES: dict[str, DTypeInfo] = {d.name: d for d in _ORDERED}
ORDER: dict[str, int] = {d.name: i for i, d in enumerate(_ORDERED)}

# Signed integer word dtypes GPTQ packs into (GPTQModel's pack_dtype), by width.
FP16_MAX = 65504.0  # the largest finite float16
WORD_DTYPES = {"I8": 8, "I16": 16, "I32": 32, "I64": 64}
PACK_DTYPE_NAMES = {"I8": "int8", "I16": "int16", "I32": "int32", "I64": "int64"}


def from_numpy(dtype: np.dtype) -> str:
    """The safetensors name of a (non-raw) numpy dtype."""
    dtype = np.dtype(dtype)
    for d in _ORDERED:
        if not d.raw and d.numpy == dtype.newbyteorder("<"):
            return d.name
    raise ValueError(f"numpy dtype {dtype} has no safetensors name; pass the name explicitly")


def nbytes(dtype: str, numel: int) -> int | None:
    """Bytes taken by `numel` elements, or None when sub-byte elements do not fill whole bytes."""
    total_bits = DTYPES[dtype].bits * numel
    return total_bits // 8 if total_bits % 8 == 0 else None


def bf16_to_f32(raw: np.ndarray) -> np.ndarray:
    """Widen BF16 stored as uint16 to float32, exactly."""
    return (raw.astype(np.uint32) << 16).view(np.float32)


# The largest finite magnitude's bit pattern, per float dtype whose magnitudes order as their
# bits do once the sign bit is cleared (IEEE: exponent, then mantissa), and the mask that
# clears it.
_MAX_FINITE_BITS = {"F16": 0x7BFF, "BF16": 0x7F7F, "F32": 0x7F7FFFFF}
_MAGNITUDE_BITS = {"F16": 0x7FFF, "BF16": 0x7FFF, "F32": 0x7FFFFFFF}


def finite_nonzero_absmax(raw: np.ndarray, dtype: str) -> float | None:
    """The largest magnitude of a float tensor when every value is finite and nonzero (either
    sign); None when one is not (or the dtype is not F16, BF16 or F32). Integer reductions over
    the bits with the sign bit cleared, nothing widened: a finite nonzero float's magnitude
    bits lie in [1, max finite] and order as the magnitudes do (+0 and -0, infinities and NaNs
    all fall outside)."""
    top = _MAX_FINITE_BITS.get(dtype)
    if top is None:
        return None
    u = np.asarray(raw).view(np.uint32 if dtype == "F32" else np.uint16)
    if u.size == 0:
        return 0.0
    both = native.magnitude_range(u)   # one compiled pass where it is built
    if both is None:
        mag = u & u.dtype.type(_MAGNITUDE_BITS[dtype])
        both = int(mag.min()), int(mag.max())
    lo, hi = both
    if lo < 1 or hi > top:
        return None
    return float(to_float32(np.array([hi], dtype=u.dtype).view(raw.dtype), dtype)[0])


def to_float32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """A tensor's values as float32, given its safetensors dtype (BF16 stored as uint16)."""
    return bf16_to_f32(raw) if dtype == "BF16" else np.asarray(raw).astype(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 to BF16 (round to nearest even), returned as the uint16 storage."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    nan = np.isnan(x)
    out = rounded.astype(np.uint16)
    out[nan] = 0x7FC0
    return out
