"""The CPU twin of kernels/gptq_gemm.cu: the same arithmetic in the same order, vectorised over
rows and columns (numpy float32; each multiply and add rounded separately, never fused)."""
from __future__ import annotations

import numpy as np

from ..gptq.packing import unpack
from ..safetensors_io.dtypes import bf16_to_f32
from . import BF16, F16, RUNTIMES, ZERO_V1_NOWRAP, ZERO_V1_WRAP


def to_f32(raw: np.ndarray, kind: int) -> np.ndarray:
    """fp16 / bf16 bits or fp32 values, widened exactly."""
    if kind == F16:
        return np.asarray(raw).view(np.float16).astype(np.float32)
    if kind == BF16:
        return bf16_to_f32(np.asarray(raw).view(np.uint16))
    return np.asarray(raw, dtype=np.float32)


def effective_zeros(stored: np.ndarray, bits: int, rule: int | str) -> np.ndarray:
    """Z per cell from stored fields under a zero rule, or under a convention name as vLLM reads
    it (gptq: s + 1 without wrap; gptq_v2: s)."""
    if isinstance(rule, str):
        rule = RUNTIMES["vLLM gptq_gemm, ExLlamaV2"][rule]
    z = stored.astype(np.int32)
    if rule == ZERO_V1_NOWRAP:
        return z + 1
    if rule == ZERO_V1_WRAP:
        return (z + 1) & ((1 << bits) - 1)
    return z


def dequant(qweight, qzeros, scales, scale_kind, g_idx, bits, rule, cols=None) -> np.ndarray:
    """W[:, cols] (all columns when None) as float32: scale * float(q - Z)."""
    cols = np.arange(qweight.shape[1]) if cols is None else np.asarray(cols)
    q = unpack(np.ascontiguousarray(qweight[:, cols]), bits, axis=0)
    z = effective_zeros(unpack(qzeros, bits, axis=1)[:, cols], bits, rule)
    s = to_f32(np.ascontiguousarray(scales[:, cols]), scale_kind)
    return dequant_fields(q, z, s, g_idx)


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

    def gemm(self, x, x_kind, qweight, qzeros, scales, scale_kind, g_idx, bits, rule,
             cols=None) -> np.ndarray:
        w = dequant(qweight, qzeros, scales, scale_kind, g_idx, bits, rule, cols)
        return gemm_from_weights(to_f32(x, x_kind), w)

    def dequant(self, qweight, qzeros, scales, scale_kind, g_idx, bits, rule, cols=None):
        return dequant(qweight, qzeros, scales, scale_kind, g_idx, bits, rule, cols)

