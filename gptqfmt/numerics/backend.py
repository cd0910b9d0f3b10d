"""What a numerical backend offers (the Backend protocol: cpu.CpuBackend, the CuPy backend),
and the one sampler of output columns the comparisons compute on."""
from __future__ import annotations

from typing import Protocol

import numpy as np
import numpy.typing as npt

from ..bits import Array
from ..bits.conventions import ZeroRule
from ..formats.model import Kind, ModuleTensors


def sample_columns(n: int, width: int, rng: np.random.Generator, align: int = 1,
                   must: npt.ArrayLike | None = None) -> Array:
    """Output columns to compute on, sorted: a contiguous block of `width` of the n (all when
    n is smaller) starting at a multiple of `align`, so each qweight row is read from few pages,
    plus up to width/2 columns of `must` (those that hold what is being checked). The one
    sampler of the verify gate and of verify --against / --reference."""
    w = min(n, width)
    start = int(rng.integers(0, n - w + 1)) // align * align
    cols = np.arange(start, min(n, start + w))
    if must is not None:
        must = np.asarray(must)
        if len(must):
            cols = np.union1d(cols, must[:width // 2])
    return cols


class Backend(Protocol):
    """What a numerical backend offers: the same bits from both, for every module, zero rule
    and element kind."""
    name: str

    def gemm(self, x: Array, x_kind: Kind, t: ModuleTensors, rule: ZeroRule,
             cols: Array | None = None) -> Array:
        """Y = X @ W[:, cols] in float32 (all columns when None), X [M, K] of `x_kind`."""

    def dequant(self, t: ModuleTensors, rule: ZeroRule, cols: Array | None = None) -> Array:
        """W[:, cols] in float32: scale * float(q - Z)."""

    def count_differences(self, a: ModuleTensors, rule_a: ZeroRule, b: ModuleTensors,
                          rule_b: ZeroRule) -> Array:
        """Per output column, how many input channels give other weight bits in `a` (under
        `rule_a`) than in `b` (under `rule_b`)."""
