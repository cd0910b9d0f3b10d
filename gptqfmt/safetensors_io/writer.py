"""Write safetensors files byte-identical to the reference writer.

The reference orders tensors by dtype (descending enum order, see dtypes.ORDER) then name, writes
`__metadata__` first, compact JSON, and pads the header with spaces to a multiple of 8.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

import numpy as np

from .dtypes import DTYPES, ORDER, from_numpy, nbytes


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def layout(entries: list[Entry], metadata: dict[str, str] | None = None
           ) -> tuple[bytes, list[Entry]]:
    """The full prefix (length + padded header) and the entries in data order."""
    ordered = sorted(entries, key=lambda e: (-ORDER[e.dtype], e.name))
    doc: dict = {}
    if metadata is not None:
        doc["__metadata__"] = metadata
    offset = 0
    for e in ordered:
        doc[e.name] = {"dtype": e.dtype, "shape": list(e.shape),
                       "data_offsets": [offset, offset + e.nbytes]}
        offset += e.nbytes
    text = json.dumps(doc, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text, ordered


def _as_entry(name: str, value) -> tuple[Entry, np.ndarray]:
    if isinstance(value, tuple):
        dtype, arr = value
    else:
        arr = np.asarray(value)
        dtype = from_numpy(arr.dtype)
    arr = np.require(arr, dtype=DTYPES[dtype].numpy, requirements="C")  # keeps 0-d shapes
    size = nbytes(dtype, int(np.prod(arr.shape, dtype=np.int64)))
    if size != arr.nbytes:
        raise ValueError(f"{name}: {arr.nbytes} bytes of data for {dtype}{list(arr.shape)}")
    return Entry(name, dtype, tuple(int(d) for d in arr.shape), size), arr


def save_file(tensors: dict, path: str | os.PathLike,
              metadata: dict[str, str] | None = None) -> None:
    """Write `tensors` ({name: ndarray or (dtype_name, ndarray)}) to `path`."""
    pairs = dict(_as_entry(n, v) for n, v in tensors.items())
    prefix, ordered = layout(list(pairs), metadata)
    arrays = {e.name: a for e, a in pairs.items()}
    with open(path, "wb") as f:
        f.write(prefix)
        for e in ordered:
            f.write(arrays[e.name].tobytes())
