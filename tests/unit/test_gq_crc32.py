"""The undo journal's CRC-32 (kernels/gq_crc32.h through gptqfmt.safetensors_io._native):
both compiled bodies equal zlib.crc32 on every length around their steps and on unaligned
starts, the page digests equal the journal's piece-by-piece definition, the folding constants
are the powers of x the header's derivation names, and a journal written with the compiled
digests is rolled back by an install without them."""
import importlib
import os
import random
import re
import struct
import zlib
from pathlib import Path

import pytest

from gptqfmt.safetensors_io import compiled, journal

ROOT = Path(__file__).resolve().parents[2]
needs_build = pytest.mark.skipif(not compiled.available(),
                                 reason="gptqfmt.safetensors_io._native was not built")
HOWS = {"best": 0, "table": 1}   # the carry-less body where the CPU has it; the table body


def extension():
    """The compiled module itself (its `how` argument picks a body)."""
    return importlib.import_module("gptqfmt.safetensors_io._native")


def x_pow_mod(n: int) -> int:
    """x^n modulo the CRC-32 polynomial, bit j the coefficient of x^j (a slow reference)."""
    r = 1
    for _ in range(n):
        r <<= 1
        if r >> 32 & 1:
            r ^= 0x104C11DB7
    return r


def test_the_folding_constants_are_the_powers_the_derivation_names():
    text = (ROOT / "kernels" / "gq_crc32.h").read_text()
    found = {int(n): int(v, 16) for n, v in re.findall(r"#define GQ_K(\d+) (0x[0-9a-f]+)ull",
                                                        text)}
    assert sorted(found) == [96, 160, 480, 544]
    for n, value in found.items():   # coefficients reversed into bits 32..1
        r = x_pow_mod(n)
        assert value == sum(1 << (32 - j) for j in range(32) if r >> j & 1), n


@needs_build
@pytest.mark.parametrize("how", HOWS)
def test_crc32_is_zlibs_on_every_length_and_start(how):
    native = extension()
    rng = random.Random(7)
    data = bytes(rng.getrandbits(8) for _ in range(4096))
    for length in range(0, 300):   # every tail past the 64- and 16-byte steps
        start = rng.randrange(0, 64)
        chunk = data[start:start + length]
        value = rng.getrandbits(32)
        assert native.crc32(chunk, value, HOWS[how]) == zlib.crc32(chunk, value), length
        assert native.crc32(chunk, 0, HOWS[how]) == zlib.crc32(chunk), length
    big = os.urandom(3 << 20)
    assert native.crc32(memoryview(big)[5:], 0, HOWS[how]) == zlib.crc32(big[5:])
    assert native.crc32(b"", 0, HOWS[how]) == 0


@needs_build
@pytest.mark.parametrize("how", HOWS)
def test_crc32_worked_example(how):
    # the check value every CRC-32 catalogue gives for the ASCII digits 1 to 9
    assert extension().crc32(b"123456789", 0, HOWS[how]) == 0xCBF43926


@needs_build
def test_without_carry_less_multiplication_zlib_digests(monkeypatch):
    """The table body is slower than zlib's: a CPU without PCLMULQDQ takes zlib's CRC-32 for
    whole buffers (the page digests still come from the one compiled pass)."""
    monkeypatch.setattr(extension(), "CLMUL", 0)
    assert compiled.crc32(b"123456789") is None
    assert journal.crc32(b"123456789") == 0xCBF43926
    monkeypatch.setattr(extension(), "CLMUL", 1)
    assert compiled.crc32(b"123456789") == 0xCBF43926


@needs_build
@pytest.mark.parametrize("how", HOWS)
def test_page_digests_are_the_pieces_crcs(how):
    rng = random.Random(3)
    data = os.urandom(70000)
    cases = [(0, 0, 4096), (0, 4096, 4096), (1, 4095, 4096), (4095, 2, 4096),
             (8192, 12288, 4096), (5, 1, 1)]
    cases += [(rng.randrange(0, 1 << 40), rng.randrange(0, 70000),
               rng.choice([1, 7, 64, 4096, 16384, 100000])) for _ in range(200)]
    for offset, length, page in cases:
        chunk = data[:length]
        cut = journal.pages(offset, length, page)
        want = struct.pack(f"<{len(cut)}I", *(zlib.crc32(chunk[a:b]) for a, b in cut))
        got = extension().crc32_pages(chunk, offset, page, HOWS[how])
        assert got == (zlib.crc32(chunk), want), (offset, length, page)


@needs_build
def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="offset must be >= 0"):
        compiled.crc32_pages(b"x", -1, 4096)
    with pytest.raises(ValueError, match="page >= 1"):
        compiled.crc32_pages(b"x", 0, 0)
    with pytest.raises(TypeError):
        compiled.crc32("not bytes")


@pytest.mark.parametrize("native", ["1", "0"])
def test_the_journals_digests_do_not_depend_on_the_build(monkeypatch, native):
    monkeypatch.setenv("GPTQFMT_NATIVE", native)
    data = os.urandom(20000)
    cut = journal.pages(4000, len(data))
    assert journal.page_digests(data, 4000) == (
        zlib.crc32(data), struct.pack(f"<{len(cut)}I", *(zlib.crc32(data[a:b]) for a, b in cut)))
    assert journal.crc32(data) == zlib.crc32(data)


@needs_build
def test_a_journal_with_compiled_digests_rolls_back_without_them(tmp_path, monkeypatch):
    root = tmp_path / "c"
    root.mkdir()
    old = os.urandom(3 * journal.PAGE + 100)
    new = bytes((b + 0x11) % 256 for b in old)   # a delta range: only page digests kept
    (root / "shard").write_bytes(b"h" * 50 + old)
    w = journal.Writer(root, "test")
    w.range("shard", 50, old, new)
    w.seal()
    w.close()
    with open(root / "shard", "r+b") as f:   # a kill after two of its pages were written
        f.seek(50)
        f.write(new[:2 * journal.PAGE - 50])
    monkeypatch.setenv("GPTQFMT_NATIVE", "0")
    _, undone = journal.rollback(root)
    assert undone == 1
    assert (root / "shard").read_bytes() == b"h" * 50 + old
