"""The one module model every format is read into and written from.

A quantized linear, whatever its file format, is: codes q [K, N] and per group g and output
channel n a zero point Z and a scale s, with `w[k, n] = s[g_idx[k], n] * (q[k, n] - Z[g, n])`.
Readers hand it over as numerics.operands.ModuleTensors in gptq_v2 layout (qweight words packed
along K, qzeros packed along N storing Z itself, scales [G, N], g_idx [K]): the form the CPU twin
and the CUDA kernel already compute on, so proving two checkpoints equal across formats is the
same comparison as within GPTQ. Writers take the same form apart into their own tensors.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from ..findings import Finding
from ..gptq.layout import n_groups
from ..numerics.operands import DTYPE_KIND, ModuleTensors
from ..safetensors_io.index import TensorStore

GPTQ, GPTQ_V2, COMPRESSED_TENSORS, AWQ = "gptq", "gptq_v2", "compressed-tensors", "awq"
FORMATS = (GPTQ, GPTQ_V2, COMPRESSED_TENSORS, AWQ)   # gptq and gptq_v2: GPTQ's two conventions
TARGETS = (GPTQ, GPTQ_V2, COMPRESSED_TENSORS)        # what convert writes


@dataclass(frozen=True)
class QuantModule:
    """One quantized linear of a checkpoint: its geometry, its scheme and its tensor names."""
    name: str
    bits: int
    group_size: int                 # -1: one group over all of K
    in_features: int
    out_features: int
    sym: bool                       # Z = 2^(bits-1) everywhere, and declared so
    act_order: bool                 # a non-trivial g_idx
    scale_dtype: str
    # role -> the tensor's name in its format; the roles are GPTQ's in every format (qweight,
    # qzeros, scales, g_idx; compressed-tensors adds shape): weight_packed is the "qweight"
    tensors: dict[str, str] = field(default_factory=dict)

    @property
    def groups(self) -> int:
        return n_groups(self.in_features, self.group_size)

    @property
    def scheme(self) -> tuple:
        """What a config must say of this module: (bits, group_size, sym, act_order)."""
        return (self.bits, self.group_size, self.sym, self.act_order)


class Source(Protocol):
    """A checkpoint opened in its own format, read one module at a time."""
    format: str
    root: Path
    store: TensorStore
    modules: list[QuantModule]
    passthrough: list[str]          # tensors outside the quantized modules, copied as they are
    findings: list[Finding]
    config_files: list[str]         # the config files that declare its quantization

    def qweight(self, m: QuantModule) -> np.ndarray:
        """Codes as GPTQ int32 words [K*bits/32, N]."""

    def qzeros(self, m: QuantModule) -> np.ndarray:
        """Z itself (gptq_v2 semantics) as int32 words [G, N*bits/32]."""

    def scales(self, m: QuantModule) -> np.ndarray:
        """Scales [G, N] as stored (F16/F32 values, BF16 as its uint16 bits)."""

    def g_idx(self, m: QuantModule) -> np.ndarray:
        """The group of each input channel, int32 [K]."""

    def close(self) -> None: ...


def discover(store: TensorStore, suffixes: dict[str, str], build) -> tuple[list, list, bool]:
    """The modules of a store, found by the tensor suffix of their codes (`suffixes["qweight"]`):
    `build(prefix, {role: tensor name})` models each (None when it cannot), every tensor of a
    module is claimed, and the rest is passthrough. Returns (modules, passthrough, any found)."""
    key = "." + suffixes["qweight"]
    claimed: set[str] = set()
    modules = []
    prefixes = sorted(t[:-len(key)] for t in store.locations if t.endswith(key))
    for p in prefixes:
        names = {r: f"{p}.{s}" for r, s in suffixes.items() if f"{p}.{s}" in store.locations}
        claimed.update(names.values())
        m = build(p, names)
        if m is not None:
            modules.append(m)
    return modules, sorted(t for t in store.locations if t not in claimed), bool(prefixes)


def outside_words(m: QuantModule) -> str | None:
    """Why module `m` has no form in the one model (GPTQ's whole 32-bit words along K and N),
    or None when it has one."""
    if (m.in_features * m.bits) % 32 or (m.out_features * m.bits) % 32:
        return (f"{m.in_features} x {m.out_features} at {m.bits} bits: GPTQ packs "
                f"in_features*bits and out_features*bits into whole 32-bit words")
    return None


def module_tensors(src: Source, m: QuantModule) -> ModuleTensors:
    """Module `m` of `src` in the one model (see the module docstring)."""
    return ModuleTensors(src.qweight(m), src.qzeros(m), src.scales(m),
                         DTYPE_KIND[m.scale_dtype], src.g_idx(m), m.bits)
