#!/usr/bin/env python3
"""The compiled re-layouts on one core, against a plain copy of the same bytes in the same run.

For each 70B shape (K x N: attention and MLP), AutoAWQ qweight [K, N/8] -> compressed-tensors'
weight_packed [N, K/8] (relayout.awq_qweight_bands: written, and compared in place as the
gate compares it) and GPTQ qweight [K/8, N] -> its transpose (relayout.bands_of: the word
transpose, written and compared), each made a band at a time into one reused buffer, as
convert writes them. The source sits in memory either starting a cache line, or 56 bytes into
one (where a tensor of a safetensors file can start: its rows then cut lines, unless the
bands begin where they start one, relayout.line_phase). The baseline is numpy's copy of the
same bytes into a reused buffer. GB/s of the source; best of --repeat.

    python bench/relayout_bench.py [--repeat 5]
"""
from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gptqfmt.bits import native  # noqa: E402
from gptqfmt.formats import relayout  # noqa: E402

SHAPES = [(8192, 8192), (8192, 28672), (28672, 8192)]   # K x N


def placed(words: np.ndarray, offset: int) -> np.ndarray:
    """A copy of `words` whose first byte is `offset` bytes past a 64-byte line."""
    raw = np.empty(words.nbytes + 128, np.uint8)
    start = (-raw.ctypes.data) % 64 + offset
    out = raw[start:start + words.nbytes].view(words.dtype).reshape(words.shape)
    out[...] = words
    return out


def best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def banded(b: relayout.Banded):
    """Make `b` a band at a time into one reused buffer, on one thread."""
    out = np.empty((b.band_rows(1), b.shape[1]), np.int32)

    def run() -> None:
        for band in b.bands(1):
            for r0, r1 in band:
                b.fill(out[:r1 - r0], r0, r1)
    return run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    if not native.available():
        raise SystemExit("the compiled loops are not built (pip install -e . with a C compiler)")
    rng = np.random.default_rng(0)
    print("GB/s of the source on one core (best of %d); copy: numpy's copy of the same bytes"
          % args.repeat)
    print(f"{'K x N':>13} {'source':>9} {'copy':>6} {'AWQ->CT':>8} {'compared':>9} "
          f"{'transpose':>10} {'compared':>9}")
    for k, n in SHAPES:
        awq = rng.integers(0, 2**32, (k, n // 8), dtype=np.uint64).astype(np.uint32)
        gptq = rng.integers(0, 2**32, (k // 8, n), dtype=np.uint64).astype(np.uint32)
        for offset in (0, 56):
            a, g = placed(awq, offset), placed(gptq, offset)
            gb = a.nbytes / 1e9
            sink = np.empty_like(a)
            copy = best(lambda: np.copyto(sink, a), args.repeat)
            ab = relayout.awq_qweight_bands(a.view(np.int32))
            whole_a = ab.whole(workers=1)
            made_a = best(banded(ab), args.repeat)
            cmp_a = best(lambda: relayout.awq_qweight_differ(a, whole_a, workers=1),
                         args.repeat)
            gb_ = relayout.bands_of(g.view(np.int32), False)
            whole_g = gb_.whole(workers=1)
            made_g = best(banded(gb_), args.repeat)
            cmp_g = best(lambda: relayout.words_differ(g, False, whole_g, True, workers=1),
                         args.repeat)
            where = "in a line" if offset == 0 else f"+{offset} B"
            print(f"{k:>6} x {n:<5} {where:>9} {gb / copy:6.2f} {gb / made_a:8.2f} "
                  f"{gb / cmp_a:9.2f} {gb / made_g:10.2f} {gb / cmp_g:9.2f}")
            if offset:   # the same source, bands cut from its first column regardless
                plain = replace(ab, phase=0)
                print(f"{'':>13} {'(no phase)':>9} {'':>6} "
                      f"{gb / best(banded(plain), args.repeat):8.2f}")


if __name__ == "__main__":
    main()
