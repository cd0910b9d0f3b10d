"""The CPU twin of kernels/gptq_gemm.cu: the same arithmetic in the same order, vectorised over
rows and columns (numpy float32; each multiply and add rounded separately, never fused)."""
from __future__ import annotations

import numpy as np

from ..conventions import ZeroRule, effective_zeros
from ..gptq.packing import unpack
from ..safetensors_io.dtypes import bf16_to_f32
from .operands import BF16, F16, Kind, ModuleTensors


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
    g = np.asarray(g_idx, dtype=np.int64)
    return s[g] * (q.astype(np.int32) - z[g]).astype(np.float32)


def gemm_from_weights(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Y = X @ W accumulated in k order in float32, as the kernel does."""
    acc = np.zeros((x.shape[0], w.shape[1]), dtype=np.float32)
    for k in range(x.shape[1]):
        acc = acc + x[:, k:k + 1] * w[k]
    return acc


class CpuBackend:
    name = "cpu"

    def gemm(self, x: np.ndarray, x_kind: Kind, t: ModuleTensors, rule: ZeroRule,
             cols=None) -> np.ndarray:
        """Y = X @ W[:, cols] in float32, X [M, K] of `x_kind`."""
        return gemm_from_weights(to_f32(x, x_kind), dequant(t, rule, cols))

    def dequant(self, t: ModuleTensors, rule: ZeroRule, cols=None) -> np.ndarray:
        return dequant(t, rule, cols)

