"""The zero-point conventions, in one place: what each stores for a zero point Z, what a zero
rule (how a runtime reads a stored field) makes of it, and how fields move between conventions.

    gptq     (v1) stores Z - 1: AutoGPTQ's packer, GPTQModel's `gptq` format. Z = 0 cannot be
             stored; masked writers leave maxq there, which runtimes read as 2^bits or 0.
    gptq_v2       stores Z itself: GPTQModel's internal format; every Z in [0, maxq] fits.

Worked example, 4-bit: Z = 8 is stored as 7 (gptq) or 8 (gptq_v2); Z = 0 is stored as 15 by a
masked gptq writer, which vLLM's gptq_gemm reads as Z = 16 and AutoGPTQ's exllama kernels as 0.

Adding a convention is one entry here (its name, its symmetric field, its rule under each
runtime, its conversion to the others) plus its tests; runtimes.py says which rule each runtime
applies.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from .errors import GptqfmtError
from .gptq.packing import maxq

GPTQ, GPTQ_V2 = "gptq", "gptq_v2"
# Each convention as data: what it adds to a stored field to give Z (Z = s + offset). Everything
# below follows from it: the symmetric field, the conversion between two conventions and the
# fields it cannot carry, and (runtimes.py) the rule a runtime applies to a file.
STORED_OFFSET = {GPTQ: 1, GPTQ_V2: 0}
CONVENTIONS = tuple(STORED_OFFSET)


class ZeroRule(IntEnum):
    """How a runtime turns a stored field s into Z. Names and values are the kernel's
    (GQ_ZERO_V2, GQ_ZERO_V1_NOWRAP, GQ_ZERO_V1_WRAP in kernels/gptq_dequant.h)."""
    V2 = 0         # Z = s: every runtime on gptq_v2 files
    V1_NOWRAP = 1  # Z = s + 1, a stored maxq read as 2^bits (vLLM gptq_gemm, ExLlamaV2)
    V1_WRAP = 2    # Z = (s + 1) mod 2^bits, a stored maxq read as 0 (AutoGPTQ exllama, TGI)


def check(convention: str) -> str:
    """`convention` when it is one; ValueError naming the known ones otherwise."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention {convention!r}: expected one of {CONVENTIONS}")
    return convention


def sym_field(bits: int, convention: str) -> int:
    """The stored field of the symmetric zero point Z = 2^(bits-1) under `convention`
    (4-bit: 7 for gptq, 8 for gptq_v2)."""
    return (1 << (bits - 1)) - STORED_OFFSET[check(convention)]


def effective_zeros(stored: np.ndarray, bits: int, rule: ZeroRule) -> np.ndarray:
    """Z per field (int32) from stored fields under a zero rule."""
    z = stored.astype(np.int32)
    if rule == ZeroRule.V1_NOWRAP:
        return z + 1
    if rule == ZeroRule.V1_WRAP:
        return (z + 1) & maxq(bits)
    return z


def shift(src: str, dst: str) -> int:
    """What moving a field from `src` to `dst` adds to it (gptq -> gptq_v2: +1)."""
    return STORED_OFFSET[check(src)] - STORED_OFFSET[check(dst)]


def lossy_mask(stored: np.ndarray, bits: int, src: str, dst: str) -> np.ndarray | None:
    """The fields that `dst` cannot hold exactly when moved from `src` (None: every field
    moves exactly): those the shift takes out of [0, maxq]. gptq -> gptq_v2: a stored maxq
    (runtimes disagree on its Z); gptq_v2 -> gptq: a Z of 0 (gptq has no field for it)."""
    d = shift(src, dst)
    if d == 0:
        return None
    return stored > maxq(bits) - d if d > 0 else stored < -d


class NotRepresentable(GptqfmtError, ValueError):
    """Fields that the target convention cannot hold exactly (and allow_lossy was not given).

    A finding-class outcome, so exit 1 like any finding; still a ValueError for callers that
    caught it as one."""

    exit_code = 1

    def __init__(self, message: str, count: int):
        super().__init__(message)
        self.count = count

    def __reduce__(self):
        return (type(self), (str(self), self.count))


@dataclass(frozen=True)
class FieldChanges:
    fields: int
    changed: int       # fields whose stored value differs
    ambiguous: int     # gptq stored maxq (gptq -> gptq_v2)
    lossy: int         # gptq_v2 Z = 0 (gptq_v2 -> gptq)


def convert_fields(stored: np.ndarray, bits: int, src: str, dst: str,
                   allow_lossy: bool = False) -> tuple[np.ndarray, FieldChanges]:
    """New stored fields (uint8, same shape) for `dst`, from fields stored under `src`, field
    by field (never packed-word arithmetic: subtracting 0x11111111 from a word borrows across
    fields).

    gptq -> gptq_v2: Z = s + 1, exact for s in [0, maxq - 1]; a stored maxq is ambiguous (a
    masked writer's Z = 0, AutoGPTQ's sign-extension garbage, or a GPTQModel borrow) and is only
    converted with allow_lossy, to Z = 0 (the wrap reading). gptq_v2 -> gptq: s = Z - 1, exact
    for Z >= 1; Z = 0 has no gptq encoding and with allow_lossy is written as s = 0 (read as
    Z = 1 by every runtime: each weight of that group moves by one scale step)."""
    top = maxq(bits)
    s = np.asarray(stored).astype(np.int16)
    if s.size and (s.min() < 0 or s.max() > top):
        raise ValueError(f"stored field out of range [0, {top}] for bits={bits}")
    lossy_at = lossy_mask(s, bits, src, dst)
    n_lossy = 0 if lossy_at is None else int(lossy_at.sum())
    if n_lossy and not allow_lossy:
        if shift(src, dst) > 0:
            raise NotRepresentable(f"{n_lossy} {src} fields store {top}, which runtimes read as "
                                   f"Z = {top + 1} or Z = 0", n_lossy)
        raise NotRepresentable(f"{n_lossy} {src} zero points are 0, which {dst} cannot store",
                               n_lossy)
    if lossy_at is None:
        out = s
    else:  # both lossy cases are written as 0
        out = np.where(lossy_at, 0, s + shift(src, dst))
    out = out.astype(np.uint8)
    # past maxq: a stored maxq whose Z runtimes disagree on; below 0: a Z the target cannot hold
    ambiguous, lossy = (n_lossy, 0) if shift(src, dst) > 0 else (0, n_lossy)
    return out, FieldChanges(int(s.size), int(np.count_nonzero(out != s)), ambiguous, lossy)
