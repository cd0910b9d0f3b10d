"""Zero-point conversion per field: unpack, shift with explicit range handling, repack.

Never packed-word arithmetic: subtracting 0x11111111 from a word borrows across fields.

gptq -> gptq_v2: Z = s + 1, exact for stored s in [0, maxq - 1]. A stored maxq is ambiguous (a
masked writer's Z = 0, AutoGPTQ's sign-extension garbage, or a GPTQModel borrow); runtimes read it
as 2^bits (vLLM gptq_gemm, ExLlamaV2) or 0 (AutoGPTQ exllama, TGI). It is only converted with
allow_lossy, to Z = 0 (the wrap reading).

gptq_v2 -> gptq: s = Z - 1, exact for Z >= 1. Z = 0 has no gptq encoding; with allow_lossy it is
written as s = 0 (read as Z = 1 by every runtime: each weight of that group moves by one scale
step).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..gptq.packing import pack, unpack

CONVENTIONS = ("gptq", "gptq_v2")


class NotRepresentable(ValueError):
    """Fields that the target convention cannot hold exactly (and allow_lossy was not given)."""

    def __init__(self, message: str, count: int):
        super().__init__(message)
        self.count = count

    def __reduce__(self):
        return (type(self), (str(self), self.count))


@dataclass(frozen=True)
class FieldCounts:
    fields: int
    changed: int       # fields whose stored value differs
    ambiguous: int     # gptq stored maxq (gptq -> gptq_v2)
    lossy: int         # gptq_v2 Z = 0 (gptq_v2 -> gptq)


def convert_fields(stored: np.ndarray, bits: int, src: str, dst: str,
                   allow_lossy: bool = False) -> tuple[np.ndarray, FieldCounts]:
    """New stored fields (uint8, same shape) for `dst`, from fields stored under `src`."""
    for c in (src, dst):
        if c not in CONVENTIONS:
            raise ValueError(f"convention {c!r}: expected one of {CONVENTIONS}")
    maxq = (1 << bits) - 1
    s = np.asarray(stored).astype(np.int16)
    if s.size and (s.min() < 0 or s.max() > maxq):
        raise ValueError(f"stored field out of range [0, {maxq}] for bits={bits}")
    ambiguous = lossy = 0
    if src == dst:
        out = s
    elif src == "gptq":
        amb = s == maxq
        ambiguous = int(amb.sum())
        if ambiguous and not allow_lossy:
            raise NotRepresentable(f"{ambiguous} gptq fields store {maxq}, which runtimes read as "
                                   f"Z = {maxq + 1} or Z = 0", ambiguous)
        out = np.where(amb, 0, s + 1)
    else:
        zero = s == 0
        lossy = int(zero.sum())
        if lossy and not allow_lossy:
            raise NotRepresentable(f"{lossy} gptq_v2 zero points are 0, which gptq cannot store",
                                   lossy)
        out = np.where(zero, 0, s - 1)
    out = out.astype(np.uint8)
    return out, FieldCounts(int(s.size), int(np.count_nonzero(out != s)), ambiguous, lossy)


def convert_qzeros(qzeros, bits: int, src: str = "gptq", dst: str = "gptq_v2",
                   allow_lossy: bool = False):
    """Convert a packed qzeros tensor [G, N*bits/W] (numpy array or torch tensor; the same type,
    dtype and shape come back). Raises NotRepresentable where the target cannot hold a field."""
    torch_in = type(qzeros).__module__.startswith("torch")
    arr = qzeros.detach().cpu().numpy() if torch_in else np.asarray(qzeros)
    if arr.ndim != 2 or arr.dtype.kind != "i":
        raise ValueError(f"qzeros must be a 2-D signed integer tensor; got {arr.dtype} "
                         f"{list(arr.shape)}")
    fields, _ = convert_fields(unpack(arr, bits, axis=1), bits, src, dst, allow_lossy)
    out = pack(fields, bits, arr.dtype.itemsize * 8, axis=1)
    if torch_in:
        import torch

        return torch.from_numpy(out).to(qzeros.device)
    return out
