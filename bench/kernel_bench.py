#!/usr/bin/env python3
"""The CUDA kernels on 70B-Llama-sized layers: achieved bandwidth over the bytes each one must
read (qweight + qzeros + scales, and X; twice that for the fused comparison of two checkpoints),
against a device-to-device copy of the same number of bytes measured in the same run (a copy
reads and writes, so its bandwidth counts both). Goal: >= 70 % of the copy. Needs CuPy and a
CUDA device.

    gptq_gemm_tiles + gptq_sum_tiles   Y = X @ W, tiled over N and K (M = 1 and 8 rows of X)
    gptq_count_differences             both checkpoints' W per element, compared, counted

    python bench/kernel_bench.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupy as cp  # noqa: E402

from gptqfmt.bits.packing import pack  # noqa: E402
from gptqfmt.numerics.cupy_backend import THREADS, TILE_K, _kernels  # noqa: E402

SHAPES = [("q_proj", 8192, 8192), ("gate_proj", 8192, 28672), ("down_proj", 28672, 8192)]


def timed(fn, reps=20) -> float:
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    fn()
    start.record()
    for _ in range(reps):
        fn()
    stop.record()
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / reps / 1e3


def copy_bandwidth(nbytes: int) -> float:
    src = cp.empty(nbytes, cp.uint8)
    dst = cp.empty_like(src)
    return 2 * nbytes / timed(lambda: dst.__setitem__(slice(None), src))


def report(what: str, nbytes: int, secs: float) -> None:
    bw, copy = nbytes / secs, copy_bandwidth(nbytes)
    print(f"{what}: {secs * 1e6:9.1f} us, {bw / 1e9:7.1f} GB/s; d2d copy {copy / 1e9:7.1f} GB/s;"
          f" {bw / copy:.0%} of it (goal >= 70 %)")


def main():
    rng = np.random.default_rng(0)
    k_tiles = _kernels().get_function("gptq_gemm_tiles")
    k_sum = _kernels().get_function("gptq_sum_tiles")
    k_cmp = _kernels().get_function("gptq_count_differences")
    props = cp.cuda.runtime.getDeviceProperties(0)
    print(f"device: {props['name'].decode()}, {props['multiProcessorCount']} SMs; "
          f"tile {TILE_K} rows of K, {THREADS} columns a block")
    for name, k, n in SHAPES:
        bits, g = 4, k // 128
        qw = cp.asarray(rng.integers(0, 2**32, (k // 8, n), dtype=np.uint64).astype(np.uint32))
        qz = cp.asarray(pack(rng.integers(0, 16, (g, n)), 4, 32, 1).view(np.uint32))
        sc = cp.asarray((rng.random((g, n)) * 0.01 + 0.001).astype(np.float16))
        gi = cp.asarray((np.arange(k) // 128).astype(np.int32))
        tiles = (k + TILE_K - 1) // TILE_K
        grid = ((n + THREADS - 1) // THREADS, tiles)
        weights = qw.nbytes + qz.nbytes + sc.nbytes + gi.nbytes
        for m in (1, 8):
            x = cp.asarray(rng.standard_normal((m, k)).astype(np.float16))
            partial = cp.empty((tiles, m, n), cp.float32)
            y = cp.empty((m, n), cp.float32)

            def gemm():
                k_tiles(grid, (THREADS,), (x, np.int32(1), qw, qz, sc, np.int32(1), gi, partial,
                                           np.int32(m), np.int64(k), np.int64(n), np.int32(bits),
                                           np.int32(1)))
                k_sum(((m * n + THREADS - 1) // THREADS,), (THREADS,),
                      (partial, y, np.int64(tiles), np.int32(m), np.int64(n)))
            report(f"{name:9s} K={k:5d} N={n:5d} gemm M={m}", weights + x.nbytes, timed(gemm))
        counts = cp.zeros(n, cp.uint64)
        # the other side: its own copies in device memory (no cache hits on shared arrays),
        # its zero points as gptq_v2 stores them, read under the v2 rule
        qw2, sc2, gi2 = qw.copy(), sc.copy(), gi.copy()
        qz2 = qz + cp.uint32(0x11111111)

        def compare():
            k_cmp(grid, (THREADS,), (qw, qz, sc, np.int32(1), gi, np.int32(1), qw2, qz2, sc2,
                                     np.int32(1), gi2, np.int32(0), np.int64(k), np.int64(n),
                                     np.int32(bits), counts))
        report(f"{name:9s} K={k:5d} N={n:5d} fused compare", 2 * weights, timed(compare))


if __name__ == "__main__":
    main()
