"""What the numerical backends compute on: the element kinds of their float inputs, and one
module's tensors as one typed value (instead of positional arrays and bare integer codes)."""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import numpy as np

from ..conventions import ZeroRule
from ..gptq.checkpoint import Checkpoint, Module
from ..gptq.evidence import module_g_idx


class Kind(IntEnum):
    """Element kinds of activations and scales, numbered as the kernel numbers them
    (GQ_F32, GQ_F16, GQ_BF16 in kernels/gptq_dequant.h)."""
    F32 = 0
    F16 = 1   # fp16 bits in uint16 (or float16)
    BF16 = 2  # bf16 bits in uint16


F32, F16, BF16 = Kind.F32, Kind.F16, Kind.BF16
DTYPE_KIND = {"F32": F32, "F16": F16, "BF16": BF16}  # safetensors dtype -> kind


@dataclass(frozen=True)
class ModuleTensors:
    """One quantized linear as the backends read it: packed qweight [K*bits/W, N], packed
    qzeros [G, N*bits/W], scales [G, N] of `scale_kind`, g_idx [K] (int32)."""
    qweight: np.ndarray
    qzeros: np.ndarray
    scales: np.ndarray
    scale_kind: Kind
    g_idx: np.ndarray
    bits: int


def module_tensors(ckpt: Checkpoint, m: Module) -> ModuleTensors:
    """Module `m` of `ckpt`, mapped (not read)."""
    return ModuleTensors(ckpt.view(m.tensors["qweight"]), ckpt.view(m.tensors["qzeros"]),
                         ckpt.view(m.tensors["scales"]),
                         DTYPE_KIND[ckpt.store.info(m.tensors["scales"]).dtype],
                         module_g_idx(ckpt, m).astype(np.int32), m.bits)


def sample_columns(n: int, width: int, rng: np.random.Generator, align: int = 1,
                   must: np.ndarray | None = None) -> np.ndarray:
    """Output columns to compute on, sorted: a contiguous block of `width` of the n (all when
    n is smaller) starting at a multiple of `align`, so each qweight row is read from few pages,
    plus up to width/2 columns of `must` (those that hold what is being checked). The one
    sampler of the verify gate and of verify --against / --reference."""
    w = min(n, width)
    start = int(rng.integers(0, n - w + 1)) // align * align
    cols = np.arange(start, min(n, start + w))
    if must is not None and len(must):
        cols = np.union1d(cols, np.asarray(must)[:width // 2])
    return cols


class Backend(Protocol):
    """What a numerical backend offers (cpu.CpuBackend, cupy_backend.CupyBackend): the same
    bits from both, for every module, zero rule and element kind."""
    name: str

    def gemm(self, x: np.ndarray, x_kind: Kind, t: ModuleTensors, rule: ZeroRule,
             cols: np.ndarray | None = None) -> np.ndarray:
        """Y = X @ W[:, cols] in float32 (all columns when None), X [M, K] of `x_kind`."""

    def dequant(self, t: ModuleTensors, rule: ZeroRule,
                cols: np.ndarray | None = None) -> np.ndarray:
        """W[:, cols] in float32: scale * float(q - Z)."""
