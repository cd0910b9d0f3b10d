"""Shapes of one quantized Linear, as pure functions (K = in_features, N = out_features).

    qweight [K*bits/W, N]   qzeros [G, N*bits/W]   scales [G, N]   g_idx [K]   bias [N]

with W the word size in bits and G = ceil(K / group_size) (one group when group_size = -1).
"""
from __future__ import annotations

import numpy as np

from .packing import SUPPORTED_BITS, unpack


def n_groups(in_features: int, group_size: int) -> int:
    if group_size in (-1, 0) or group_size >= in_features:
        return 1
    return -(-in_features // group_size)


def bits_from_qzeros(qzeros_cols: int, out_features: int, word_bits: int) -> int | None:
    """bits = qzeros.shape[1] * W / N, when that is a supported width."""
    if out_features <= 0 or (qzeros_cols * word_bits) % out_features:
        return None
    bits = qzeros_cols * word_bits // out_features
    return bits if bits in SUPPORTED_BITS else None


def trivial_g_idx(in_features: int, group_size: int) -> np.ndarray:
    """g_idx without act-order: k // group_size (all zero for one group)."""
    k = np.arange(in_features, dtype=np.int64)
    if group_size in (-1, 0) or group_size >= in_features:
        return np.zeros(in_features, dtype=np.int64)
    return k // group_size


def group_size_from_g_idx(g_idx: np.ndarray, groups: int) -> tuple[int | None, str | None]:
    """The group size a g_idx implies, or (None, reason).

    Every group but the last has exactly group_size members; the last has the remainder.
    One group means group_size -1 (per-column quantization).
    """
    k = len(g_idx)
    if k == 0:
        return None, "g_idx is empty"
    lo, hi = int(g_idx.min()), int(g_idx.max())
    if lo < 0 or hi >= groups:
        return None, f"values span [{lo}, {hi}]; expected [0, {groups - 1}] for {groups} groups"
    if groups == 1:
        return -1, None
    counts = np.bincount(g_idx.astype(np.int64), minlength=groups)
    gs = int(counts[0])
    if gs == 0 or np.any(counts[:-1] != gs) or counts[-1] != k - gs * (groups - 1) or \
            counts[-1] <= 0:
        return None, (f"group member counts {_sample(counts)} are not group_size for every group "
                      "but the last")
    return gs, None


def _sample(a: np.ndarray, n: int = 6) -> str:
    items = ", ".join(str(int(x)) for x in a[:n])
    return f"[{items}{', ...' if len(a) > n else ''}]"


def stored_fields(qzeros: np.ndarray, bits: int) -> np.ndarray:
    """The stored zero-point fields [G, N] (uint8) of a qzeros tensor [G, N*bits/W]."""
    return unpack(qzeros, bits, axis=1)
