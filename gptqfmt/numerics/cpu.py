"""The CPU twin of kernels/gptq_gemm.cu: the same arithmetic in the same order, vectorised over
rows and columns (numpy float32; each multiply and add rounded separately, never fused): each
tile of GQ_TILE_K input channels summed in k order from 0, the tiles' sums added in tile
order."""
from __future__ import annotations

import numpy as np

from ..bits.conventions import ZeroRule, effective_zeros
from ..bits.packing import unpack
from ..formats.model import BF16, F16, Kind, ModuleTensors
from ..resources import kernel_constant
from ..safetensors_io.dtypes import bf16_to_f32

TILE_K = kernel_constant("GQ_TILE_K")  # input channels per tile of the kernels' sums
COMPARE_COLUMNS = 256                  # columns of W per step of count_differences


def to_f32(raw: np.ndarray, kind: Kind) -> np.ndarray:
    """fp16 / bf16 bits or fp32 values, widened exactly."""
    if kind == F16:
        return np.asarray(raw).view(np.float16).astype(np.float32)
    if kind == BF16:
        return bf16_to_f32(np.asarray(raw).view(np.uint16))
    return np.asarray(raw, dtype=np.float32)


def dequant(t: ModuleTensors, rule: ZeroRule, cols=None) -> np.ndarray:
    """W[:, cols] (all columns when None) as float32: scale * float(q - Z)."""
    cols = np.arange(t.qweight.shape[1]) if cols is None else np.asarray(cols)
    q = unpack(np.ascontiguousarray(t.qweight[:, cols]), t.bits, axis=0)
    z = effective_zeros(unpack(t.qzeros, t.bits, axis=1)[:, cols], t.bits, rule)
    s = to_f32(np.ascontiguousarray(t.scales[:, cols]), t.scale_kind)
    return dequant_fields(q, z, s, t.g_idx)


def dequant_fields(q: np.ndarray, z: np.ndarray, s: np.ndarray, g_idx) -> np.ndarray:
    """The dequant formula, once: codes q [K, C], effective zeros z and fp32 scales s [G, C],
    g_idx [K] -> W [K, C] = s[g] * float(q - z[g]), one fp32 multiply as in the kernel."""
    g = np.asarray(g_idx, dtype=np.intp)
    # float(q) - float(z) is float(q - z) exactly (codes and zeros are far below 2^24), and
    # takes two fewer temporaries than the integer difference
    w = q.astype(np.float32)
    w -= np.asarray(z, dtype=np.float32)[g]
    w *= s[g]
    return w


def gemm_from_weights(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Y = X @ W in float32 in the kernels' order: per tile of TILE_K rows of W, a sum in k
    order from 0; then the tiles' sums added in tile order, from 0."""
    y = np.zeros((x.shape[0], w.shape[1]), dtype=np.float32)
    for k0 in range(0, x.shape[1], TILE_K):
        acc = np.zeros_like(y)
        for k in range(k0, min(x.shape[1], k0 + TILE_K)):
            acc = acc + x[:, k:k + 1] * w[k]
        y = y + acc
    return y


def count_differences(a: ModuleTensors, rule_a: ZeroRule, b: ModuleTensors,
                      rule_b: ZeroRule) -> np.ndarray:
    """Per output column, how many input channels give other weight bits in `a` (under
    `rule_a`) than in `b`: the twin of gptq_count_differences, a block of columns at a time."""
    n = a.qweight.shape[1]
    out = np.zeros(n, dtype=np.uint64)
    for c0 in range(0, n, COMPARE_COLUMNS):
        cols = np.arange(c0, min(n, c0 + COMPARE_COLUMNS))
        wa = dequant(a, rule_a, cols).view(np.uint32)
        wb = dequant(b, rule_b, cols).view(np.uint32)
        out[cols] = np.count_nonzero(wa != wb, axis=0)
    return out


class CpuBackend:
    name = "cpu"

    def gemm(self, x: np.ndarray, x_kind: Kind, t: ModuleTensors, rule: ZeroRule,
             cols=None) -> np.ndarray:
        """Y = X @ W[:, cols] in float32, X [M, K] of `x_kind`."""
        return gemm_from_weights(to_f32(x, x_kind), dequant(t, rule, cols))

    def dequant(self, t: ModuleTensors, rule: ZeroRule, cols=None) -> np.ndarray:
        return dequant(t, rule, cols)


    def count_differences(self, a: ModuleTensors, rule_a: ZeroRule, b: ModuleTensors,
                          rule_b: ZeroRule) -> np.ndarray:
        return count_differences(a, rule_a, b, rule_b)
