"""The CuPy backend: kernels/gptq_gemm.cu compiled lazily by RawModule (cached by CuPy).

Arguments are checked here (CuPy does not check kernel arguments) and scalars passed with
explicit numpy types. Importing this module imports CuPy and fails without it.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..errors import UsageError
from ..resources import data_dir

THREADS = 128
MAX_M = 16
_module = None


def _kernels():
    global _module
    if _module is None:
        kdir = data_dir("kernels")
        code = (kdir / "gptq_gemm.cu").read_text()
        _module = cp.RawModule(code=code, options=("-I" + str(kdir), "--fmad=false",
                                                   "-std=c++14"))
    return _module


def _u32(a) -> "cp.ndarray":
    a = np.ascontiguousarray(a)
    if a.dtype != np.int32 and a.dtype != np.uint32:
        raise UsageError(f"the cupy kernel reads int32 words; got {a.dtype}")
    return cp.asarray(a.view(np.uint32))


class CupyBackend:
    name = "cupy"

    def __init__(self):
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")

    def _args(self, qweight, qzeros, scales, g_idx, bits, cols):
        cols = np.arange(qweight.shape[1]) if cols is None else np.asarray(cols)
        if bits not in (2, 3, 4, 8):
            raise UsageError(f"bits={bits}")
        qw = _u32(qweight[:, cols])  # a column subset is still one bit stream per column
        n = len(cols)
        if (n * bits) % 32:
            # qzeros rows must hold whole words for the chosen columns: take all columns
            raise UsageError("the cupy backend needs column counts whose fields fill words")
        from ..gptq.packing import pack, unpack
        zf = unpack(qzeros, bits, axis=1)[:, cols]
        qz = _u32(pack(zf, bits, 32, axis=1))
        sc = cp.asarray(np.ascontiguousarray(scales[:, cols]))
        gi = cp.asarray(np.ascontiguousarray(g_idx, dtype=np.int32))
        return qw, qz, sc, gi, n

    def gemm(self, x, x_kind, qweight, qzeros, scales, scale_kind, g_idx, bits, rule, cols=None):
        qw, qz, sc, gi, n = self._args(qweight, qzeros, scales, g_idx, bits, cols)
        x = np.ascontiguousarray(x)
        m, k = x.shape
        if m > MAX_M:
            raise UsageError(f"at most {MAX_M} rows of X; got {m}")
        if gi.shape[0] != k:
            raise UsageError(f"X has {k} columns; g_idx has {gi.shape[0]}")
        xd = cp.asarray(x)
        y = cp.empty((m, n), dtype=cp.float32)
        blocks = (n + THREADS - 1) // THREADS
        _kernels().get_function("gptq_dequant_gemm")(
            (blocks,), (THREADS,),
            (xd, np.int32(x_kind), qw, qz, sc, np.int32(scale_kind), gi, y, np.int32(m),
             np.int64(k), np.int64(n), np.int32(bits), np.int32(rule)))
        return cp.asnumpy(y)

    def dequant(self, qweight, qzeros, scales, scale_kind, g_idx, bits, rule, cols=None):
        qw, qz, sc, gi, n = self._args(qweight, qzeros, scales, g_idx, bits, cols)
        k = gi.shape[0]
        w = cp.empty((k, n), dtype=cp.float32)
        grid = ((n + THREADS - 1) // THREADS, min(k, 1024))
        _kernels().get_function("gptq_dequant")(
            grid, (THREADS,), (qw, qz, sc, np.int32(scale_kind), gi, w, np.int64(k), np.int64(n),
                               np.int32(bits), np.int32(rule)))
        return cp.asnumpy(w)
