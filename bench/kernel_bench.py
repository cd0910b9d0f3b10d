#!/usr/bin/env python3
"""GPU kernel time of gptq_dequant_gemm on 70B-Llama-sized layers, and achieved bandwidth over the
bytes of qweight + scales + qzeros, against a device-to-device copy of the same bytes measured in
the same run (goal >= 70 %). Needs CuPy and a CUDA device.

    python bench/kernel_bench.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import cupy as cp  # noqa: E402

from gptqfmt.gptq.packing import pack  # noqa: E402
from gptqfmt.numerics.cupy_backend import THREADS, _kernels  # noqa: E402

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


def main():
    rng = np.random.default_rng(0)
    kern = _kernels().get_function("gptq_dequant_gemm")
    print(f"device: {cp.cuda.runtime.getDeviceProperties(0)['name'].decode()}")
    for name, k, n in SHAPES:
        bits, g = 4, k // 128
        qw = cp.asarray(rng.integers(0, 2**32, (k // 8, n), dtype=np.uint64).astype(np.uint32))
        qz = cp.asarray(pack(rng.integers(0, 16, (g, n)), 4, 32, 1).view(np.uint32))
        sc = cp.asarray((rng.random((g, n)) * 0.01).astype(np.float16))
        gi = cp.asarray((np.arange(k) // 128).astype(np.int32))
        for m in (1, 8):
            x = cp.asarray(rng.standard_normal((m, k)).astype(np.float16))
            y = cp.empty((m, n), cp.float32)
            blocks = (n + THREADS - 1) // THREADS
            t = timed(lambda: kern((blocks,), (THREADS,), (
                x, np.int32(1), qw, qz, sc, np.int32(1), gi, y, np.int32(m), np.int64(k),
                np.int64(n), np.int32(bits), np.int32(1))))
            nbytes = qw.nbytes + qz.nbytes + sc.nbytes
            src = cp.empty(nbytes, cp.uint8)
            dst = cp.empty_like(src)
            tc = timed(lambda: dst.__setitem__(slice(None), src))
            copy_bw = 2 * nbytes / tc  # a copy reads and writes
            bw = nbytes / t
            print(f"{name:9s} K={k:5d} N={n:5d} M={m}: {t * 1e6:8.1f} us, {bw / 1e9:7.1f} GB/s; "
                  f"d2d copy {copy_bw / 1e9:7.1f} GB/s; ratio {bw / copy_bw:.0%} (goal >= 70 %)")


if __name__ == "__main__":
    main()
