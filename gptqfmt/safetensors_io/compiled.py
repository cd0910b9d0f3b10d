"""The compiled header and index readers, range survey, CRC-32, name order and grouping of
kernels/safetensors_native.c (the extension gptqfmt.safetensors_io._native) where the install
built it. A machine without a C compiler, or GPTQFMT_NATIVE=0 (which the tests use to hold
the two equal), reads every header with header.py's parser and every index with json.loads
and gets the same answers, surveys nothing (survey.py: every tensor is then read where it is
asked for), takes its digests from zlib (journal.crc32) and orders and groups names in Python.
"""
from __future__ import annotations

from typing import Any

from ..bits import native

# the extension's VERSION this module is written for (kernels/safetensors_native.c)
VERSION = 5


_NATIVE = native.load(f"{__package__}._native", VERSION)


def available() -> bool:
    """Whether the extension was built and is not turned off (GPTQFMT_NATIVE=0)."""
    return _NATIVE is not None and not native.switched_off()


def scan(raw: bytes, bits: dict[str, int], info: type) -> tuple[dict[str, Any],
                                                                 dict[str, str] | None,
                                                                 int] | None:
    """(tensors, metadata, data length) of header JSON `raw` where it is of the plain kind the
    compiled reader takes (kernels/safetensors_native.c says which), entries made as
    `info(name, dtype, shape, begin, end)`; None where it is not, or nothing is compiled: the
    Python parser then reads it (header.parse_header)."""
    if not available():
        return None
    assert _NATIVE is not None
    return _NATIVE.scan(raw, bits, info)


def index_map(raw: bytes) -> tuple[dict[str, str], dict[str, Any] | None] | None:
    """(weight_map, metadata) of index JSON `raw` where it is of the plain kind the compiled
    reader takes (kernels/safetensors_native.c says which), as json.loads reads them; None
    where it is not, or nothing is compiled: json.loads then reads it (index._read_index)."""
    if not available():
        return None
    assert _NATIVE is not None
    return _NATIVE.index_map(raw)


def natural_order(names: list[str]) -> list[str] | None:
    """`names` in the order of sorted(names, key=natural_key) (formats/gptq/checkpoint.py),
    compared in C; None where nothing is compiled or a name is not ASCII (the key's digits
    are Unicode's), for the key to order."""
    if not available():
        return None
    assert _NATIVE is not None
    return _NATIVE.natural_order(names)


def group_roles(items: list[Any], roles: tuple[str, ...]
                ) -> tuple[dict[str, dict[str, str]], list[str], dict[str, int]] | None:
    """({module: {role: name}}, the other names, {module: its kind}) of `items`, each a
    tensor name or a header entry (TensorInfo: name, dtype, shape, ...): a name is a module's
    role where its text after the last dot is one of `roles` (the role kept is the tuple's
    own str) and the text before it is not empty; modules in the order first met, the others
    in order. A module's kind is a number that two modules share exactly where their
    (role, dtype, shape) in the order of their items are equal, for a module whose items are
    all entries. None where nothing is compiled (formats/gptq/checkpoint.py's _group then
    splits each name itself)."""
    if not available():
        return None
    assert _NATIVE is not None
    return _NATIVE.group_roles(items, roles)


def crc32(data: bytes | memoryview) -> int | None:
    """zlib.crc32(data), by carry-less multiplication (kernels/gq_crc32.h: 19 GB/s a core on
    data in cache, against zlib's 2.4); None where nothing is compiled or the CPU has no
    carry-less multiplication (the compiled table body runs at three quarters of zlib's
    speed, so zlib's is taken)."""
    if not available() or not getattr(_NATIVE, "CLMUL", 0):
        return None
    assert _NATIVE is not None
    return _NATIVE.crc32(data)


def crc32_pages(data: bytes | memoryview, offset: int, page: int) -> tuple[int, bytes] | None:
    """(zlib.crc32 of `data`, the CRC-32 of each of its pieces as little-endian uint32 bytes)
    for the bytes of a file range at `offset` cut where the file's offset is a multiple of
    `page` (journal.pages), in one pass; None where nothing is compiled."""
    if not available():
        return None
    assert _NATIVE is not None
    return _NATIVE.crc32_pages(data, offset, page)


def survey(files: list[tuple[str, list[Any], int]], alike: tuple[str, ...],
           heads: tuple[str, ...], n: int, most: int, hint: int, every: int,
           cold: bool = False, stop: bytearray | None = None
           ) -> list[tuple[dict[str, str], dict[str, bool]]]:
    """(rep, zero) of each file's small tensors, `files` as (path, its header entries in the
    order to read them, its data's start), opened and read with the GIL released
    (kernels/safetensors_native.c says how): a tensor named .<one of alike> of at most `most`
    bytes maps in rep to the first of its dtype and shape in its file whose bytes it holds;
    one named .<one of heads> maps in zero to whether its first `n` bytes are all 0.
    Read-ahead as reader.ReadAhead's (`hint`, `every`; `cold`: from each file's first range).
    `stop`: one byte another thread sets to nonzero to end the reads early (what is not read
    then is in neither answer). Only where available()."""
    assert _NATIVE is not None
    return _NATIVE.survey(files, alike, heads, n, most, hint, every, cold,
                          bytearray(1) if stop is None else stop)
