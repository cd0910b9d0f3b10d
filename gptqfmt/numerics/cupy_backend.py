"""The CuPy backend: kernels/gptq_gemm.cu compiled lazily by RawModule (cached by CuPy).

Arguments are checked here (CuPy does not check kernel arguments) and scalars passed with
explicit numpy types. Importing this module imports CuPy and fails without it.
"""
from __future__ import annotations

import cupy as cp
import numpy as np

from ..errors import UsageError
from ..formats.model import BF16, F16, F32, ModuleTensors
from ..resources import data_dir, kernel_constant

THREADS = 128
MAX_M = kernel_constant("GQ_MAX_M")  # rows of X per call
TILE_K = kernel_constant("GQ_TILE_K")  # input channels per tile (grid y)
_module = None


def _kernels():
    global _module
    if _module is None:
        kdir = data_dir("kernels")
        code = (kdir / "gptq_gemm.cu").read_text()
        _module = cp.RawModule(code=code, options=("-I" + str(kdir), "--fmad=false",
                                                   "-std=c++14"))
    return _module


def _words32(a, bits: int, axis: int) -> "cp.ndarray":
    """Packed words as the kernel reads them (uint32); int8/16/64 words are repacked."""
    a = np.ascontiguousarray(a)
    if a.dtype.kind not in "iu":
        raise UsageError(f"packed words must be integers; got {a.dtype}")
    if a.dtype.itemsize != 4:
        from ..bits.packing import pack, unpack
        a = pack(unpack(a, bits, axis=axis), bits, 32, axis=axis)
    return cp.asarray(a.view(np.uint32))


_KIND_DTYPES = {F32: (np.float32,), F16: (np.float16, np.uint16), BF16: (np.uint16,)}


def _check_kind(name, arr, kind):
    if kind not in _KIND_DTYPES or arr.dtype not in [np.dtype(d) for d in _KIND_DTYPES[kind]]:
        raise UsageError(f"{name}: dtype {arr.dtype} does not match kind {kind} "
                         "(0 = float32, 1 = float16 bits, 2 = bfloat16 bits)")


class CupyBackend:
    name = "cupy"

    def __init__(self):
        if cp.cuda.runtime.getDeviceCount() < 1:
            raise RuntimeError("no CUDA device")
        _kernels().get_function("gptq_gemm_tiles")  # compile now: a failure means "unusable"

    def _args(self, t: ModuleTensors, cols):
        from ..bits.packing import pack, unpack
        qweight, qzeros, scales, g_idx, bits = t.qweight, t.qzeros, t.scales, t.g_idx, t.bits
        cols = np.arange(qweight.shape[1]) if cols is None else np.asarray(cols)
        if bits not in (2, 3, 4, 8):
            raise UsageError(f"bits={bits}")
        n = len(cols)
        pad = -n % 32  # qzeros rows must be whole words: pad every tensor's columns alike
        qw = _words32(np.pad(qweight[:, cols], ((0, 0), (0, pad))), bits, axis=0)
        zf = unpack(qzeros, bits, axis=1)[:, cols]
        qz = _words32(pack(np.pad(zf, ((0, 0), (0, pad))), bits, 32, axis=1), bits, axis=1)
        sc = np.ascontiguousarray(np.pad(scales[:, cols], ((0, 0), (0, pad))))
        _check_kind("scales", sc, t.scale_kind)
        g = np.ascontiguousarray(g_idx, dtype=np.int32)
        if g.size and (g.min() < 0 or g.max() >= sc.shape[0]):
            raise UsageError(f"g_idx values span [{g.min()}, {g.max()}]; scales have "
                             f"{sc.shape[0]} groups")
        if qw.shape[0] * 32 // bits < g.shape[0]:
            raise UsageError(f"qweight holds fewer than {g.shape[0]} input channels")
        return qw, qz, cp.asarray(sc), cp.asarray(g), n, n + pad  # the kernel's N is n + pad

    def gemm(self, x, x_kind, t: ModuleTensors, rule, cols=None):
        """Y = X @ W[:, cols] on the device (see CpuBackend.gemm, its twin)."""
        qw, qz, sc, gi, n, n_pad = self._args(t, cols)
        x = np.ascontiguousarray(x)
        _check_kind("x", x, x_kind)
        m, k = x.shape
        if m > MAX_M:
            raise UsageError(f"at most {MAX_M} rows of X; got {m}")
        if gi.shape[0] != k:
            raise UsageError(f"X has {k} columns; g_idx has {gi.shape[0]}")
        xd = cp.asarray(x)
        tiles = (k + TILE_K - 1) // TILE_K
        partial = cp.empty((tiles, m, n_pad), dtype=cp.float32)
        y = cp.empty((m, n_pad), dtype=cp.float32)
        blocks = (n_pad + THREADS - 1) // THREADS
        _kernels().get_function("gptq_gemm_tiles")(
            (blocks, tiles), (THREADS,),
            (xd, np.int32(x_kind), qw, qz, sc, np.int32(t.scale_kind), gi, partial, np.int32(m),
             np.int64(k), np.int64(n_pad), np.int32(t.bits), np.int32(rule)))
        _kernels().get_function("gptq_sum_tiles")(
            ((m * n_pad + THREADS - 1) // THREADS,), (THREADS,),
            (partial, y, np.int64(tiles), np.int32(m), np.int64(n_pad)))
        return cp.asnumpy(y[:, :n])

    def count_differences(self, a: ModuleTensors, rule_a, b: ModuleTensors, rule_b):
        """Per column, the input channels whose weight bits differ (CpuBackend's twin)."""
        if a.bits != b.bits or a.qweight.shape != b.qweight.shape or \
                len(a.g_idx) != len(b.g_idx):
            raise UsageError("count_differences compares modules of one shape and bits")
        qa, za, sa, ga, n, n_pad = self._args(a, None)
        qb, zb, sb, gb, _, _ = self._args(b, None)
        k = ga.shape[0]
        counts = cp.zeros(n_pad, dtype=cp.uint64)
        _kernels().get_function("gptq_count_differences")(
            ((n_pad + THREADS - 1) // THREADS, (k + TILE_K - 1) // TILE_K), (THREADS,),
            (qa, za, sa, np.int32(a.scale_kind), ga, np.int32(rule_a), qb, zb, sb,
             np.int32(b.scale_kind), gb, np.int32(rule_b), np.int64(k), np.int64(n_pad),
             np.int32(a.bits), counts))
        return cp.asnumpy(counts[:n])

    def dequant(self, t: ModuleTensors, rule, cols=None):
        qw, qz, sc, gi, n, n_pad = self._args(t, cols)
        k = gi.shape[0]
        w = cp.empty((k, n_pad), dtype=cp.float32)
        grid = ((n_pad + THREADS - 1) // THREADS, min(k, 1024))
        _kernels().get_function("gptq_dequant")(
            grid, (THREADS,), (qw, qz, sc, np.int32(t.scale_kind), gi, w, np.int64(k),
                               np.int64(n_pad), np.int32(t.bits), np.int32(rule)))
        return cp.asnumpy(w[:, :n])
