"""The one module model every format is read into and written from (source.py has the Source
protocol every format's reader implements, and the Writer protocol of the written ones).

A quantized linear, whatever its file format, is: codes q [K, N] and per group g and output
channel n a zero point Z and a scale s, with `w[k, n] = s[g_idx[k], n] * (q[k, n] - Z[g, n])`.
Readers hand it over as ModuleTensors in gptq_v2 layout (qweight words packed along K, qzeros
packed along N storing Z itself, scales [G, N], g_idx [K]): the form the CPU twin and the CUDA
kernel compute on, so proving two checkpoints equal across formats is the same comparison as
within GPTQ. Writers take the same form apart into their own tensors.

"""
from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from operator import attrgetter, methodcaller
from typing import Any, Callable

from ..bits import Array
from ..bits.conventions import GPTQ, GPTQ_V2
from ..bits.layout import n_groups
from ..safetensors_io.index import TensorStore

COMPRESSED_TENSORS, AWQ = "compressed-tensors", "awq"
FORMATS = (GPTQ, GPTQ_V2, COMPRESSED_TENSORS, AWQ)   # gptq and gptq_v2: GPTQ's two conventions


class Kind(IntEnum):
    """Element kinds of activations and scales, numbered as the kernel numbers them
    (GQ_F32, GQ_F16, GQ_BF16 in kernels/gptq_dequant.h)."""
    F32 = 0
    F16 = 1   # fp16 bits in uint16 (or float16)
    BF16 = 2  # bf16 bits in uint16


F32, F16, BF16 = Kind.F32, Kind.F16, Kind.BF16
DTYPE_KIND = {"F32": F32, "F16": F16, "BF16": BF16}  # safetensors dtype -> kind
# A module's tensors that are probed for zero bytes (a tensor never written), by role, and the
# first bytes of each looked at for a nonzero byte (one page)
PROBED = ("qweight", "scales")
PROBE = 4096


@dataclass(frozen=True)
class ModuleTensors:
    """One quantized linear as the backends read it: packed qweight [K*bits/W, N], packed
    qzeros [G, N*bits/W], scales [G, N] of `scale_kind`, g_idx [K] (int32)."""
    qweight: Array
    qzeros: Array
    scales: Array
    scale_kind: Kind
    g_idx: Array
    bits: int




def uniform(modules: Sequence[Any], attr: str) -> Any:
    """The value of `attr` every module shares, else None (none, or they differ)."""
    vals = set(map(attrgetter(attr), modules))   # one C loop: tens of thousands of modules
    return vals.pop() if len(vals) == 1 else None


def mixed(modules: Sequence[Any], attrs: tuple[str, ...]) -> bool:
    """Whether the modules differ in any of `attrs`."""
    return any(len(set(map(attrgetter(a), modules))) > 1 for a in attrs)

def is_lm_head(name: str) -> bool:
    """Whether module `name` is the output head (lm_head under any prefix), which runtimes load
    apart from the decoder layers."""
    return name.rpartition(".")[2] == "lm_head"   # the last part (a name without a dot: all)


def any_lm_head(modules: Sequence[Any]) -> bool:
    """Whether any of `modules` is an lm_head (is_lm_head): the names that cannot be one are
    passed over in C (a mixture of experts has tens of thousands)."""
    names = map(attrgetter("name"), modules)
    return any(map(is_lm_head, filter(methodcaller("endswith", "lm_head"), names)))


# slots, not frozen: one per module, tens of thousands in a MoE, and a frozen dataclass's
# __init__ sets each field through object.__setattr__ (2 us a module against 0.4); records
# are never assigned to after they are built
@dataclass(slots=True)
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
    # False: quantized, but the config leaves it unquantized (a GPTQ `dynamic` "-:" rule): no
    # config of a target can describe it
    listed: bool = True

    @property
    def groups(self) -> int:
        return n_groups(self.in_features, self.group_size)

    @property
    def scheme(self) -> tuple[int, int, bool, bool]:
        """What a config must say of this module: (bits, group_size, sym, act_order)."""
        return (self.bits, self.group_size, self.sym, self.act_order)


@dataclass(slots=True)   # not frozen, as QuantModule
class ModuleRecord:
    """A module as inspect lists it, whatever its format (valid or not: None where its tensors
    do not tell)."""
    name: str
    bits: int | None
    group_size: int | None
    desc_act: bool | None
    sym: bool | None
    in_features: int | None
    out_features: int | None
    pack_dtype: str | None
    groups: int | None
    scale_dtype: str | None
    has_g_idx: bool
    has_bias: bool
    excluded_by_config: bool
    valid: bool
    files: list[str]

    def to_json(self, zero_point: dict[str, Any] | None) -> dict[str, Any]:
        return {**{k: getattr(self, k) for k in self.__slots__}, "zero_point": zero_point}


def discover(store: TensorStore, suffixes: dict[str, str],
             build: Callable[[str, dict[str, str]], QuantModule | None]
             ) -> tuple[list[QuantModule], list[str], bool]:
    """The modules of a store, found by the tensor suffix of their codes (`suffixes["qweight"]`):
    `build(prefix, {role: tensor name})` models each (None when it cannot), every tensor of a
    module is claimed, and the rest is passthrough. A module with a tensor in a shard that
    cannot be read is not built (that shard's finding is the cause). Returns (modules,
    passthrough, any found)."""
    key = "." + suffixes["qweight"]
    claimed: set[str] = set()
    modules = []
    prefixes = sorted({t[:-len(key)] for t in itertools.chain(store.locations, store.unreadable)
                       if t.endswith(key)})
    for p in prefixes:
        names = {r: f"{p}.{s}" for r, s in suffixes.items() if f"{p}.{s}" in store.locations}
        claimed.update(names.values())
        if any(f"{p}.{s}" in store.unreadable for s in suffixes.values()):
            continue
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
