#!/usr/bin/env python3
"""The undo journal's digests on one core, against zlib's CRC-32 of the same bytes in the same
run: compiled.crc32 (carry-less multiplication where the CPU has it), the table body it falls
back to, and compiled.crc32_pages (a range's CRC-32 and its pages' in one pass, as
journal.Writer.range takes them), on a qzeros-sized range in cache (917,504 bytes: a 70B
MLP module's qzeros at group 128) and on 256 MiB in memory. GB/s; best of --repeat.

    python bench/crc_bench.py [--repeat 5]
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gptqfmt.safetensors_io import compiled, journal  # noqa: E402


def rate(fn, data: bytes, repeat: int) -> float:
    """GB/s of fn(data), best of `repeat` timings of enough calls for 0.2 s."""
    calls = max(1, int(2e8 // max(1, len(data))))
    best = float("inf")
    fn(data)
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(calls):
            fn(data)
        best = min(best, (time.perf_counter() - t) / calls)
    return len(data) / best / 1e9


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if not compiled.available():
        sys.exit("gptqfmt.safetensors_io._native was not built (or GPTQFMT_NATIVE=0)")
    native = importlib.import_module("gptqfmt.safetensors_io._native")
    ways = {
        "zlib.crc32 (baseline)": zlib.crc32,
        "compiled.crc32": compiled.crc32,
        "the table body": lambda d: native.crc32(d, 0, 1),
        "compiled.crc32_pages": lambda d: compiled.crc32_pages(d, 0, journal.PAGE),
    }
    print(f"carry-less multiplication on this CPU: {bool(native.CLMUL)}")
    for label, size in (("in cache, 917,504 B", 917504), ("in memory, 256 MiB", 256 << 20)):
        data = os.urandom(size)
        base = rate(zlib.crc32, data, args.repeat)
        print(label)
        for name, fn in ways.items():
            r = base if fn is zlib.crc32 else rate(fn, data, args.repeat)
            print(f"  {name:24s} {r:6.2f} GB/s   {r / base:5.2f}x zlib")


if __name__ == "__main__":
    main()
