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

import sys
from dataclasses import dataclass

import numpy as np

from ..errors import GptqfmtError, UsageError
from ..gptq.packing import SUPPORTED_BITS, block, pack, unpack

CONVENTIONS = ("gptq", "gptq_v2")
WORD_DTYPES = ("int8", "int16", "int32", "int64")  # the packer's words, as files store them


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
    """Convert a packed qzeros tensor [G, N*bits/W] from `src` to `dst` convention.

    Accepts a 2-D numpy array or torch tensor of words: int8, int16, int32 or int64 (W = 8 ..
    64; 3-bit needs int32), native byte order. The same type, dtype, shape (and torch device)
    come back. Anything else (lists, which carry no word size, floats, bool, unsigned words,
    0-d or 3-D input, object arrays) raises UsageError naming what was expected and what was
    got. Raises NotRepresentable where the target cannot hold a field."""
    torch = sys.modules.get("torch")  # only a torch tensor can need torch; never import it
    torch_in = torch is not None and isinstance(qzeros, torch.Tensor)
    if torch_in:
        kind = f"torch tensor of {str(qzeros.dtype).removeprefix('torch.')}"
        name = str(qzeros.dtype).removeprefix("torch.")
    elif isinstance(qzeros, np.ndarray) and not isinstance(qzeros, np.ma.MaskedArray):
        kind, name = f"numpy array of {qzeros.dtype}", qzeros.dtype.name
        if name in WORD_DTYPES and not qzeros.dtype.isnative:
            raise UsageError(f"qzeros: expected native byte order; got a numpy array of "
                             f"{qzeros.dtype.str}: use .astype(np.{name})")
    else:
        hint = (": a list has no word size, use np.asarray(x, dtype=np.int32)"
                if isinstance(qzeros, (list, tuple)) else "")
        raise UsageError(f"qzeros: expected a numpy array or torch tensor of {_words()}; got "
                         f"{type(qzeros).__name__}{hint}")
    if name not in WORD_DTYPES:
        hint = (f": view unsigned words as signed, .view(np.int{name[4:]})"
                if name in ("uint8", "uint16", "uint32", "uint64") else "")
        raise UsageError(f"qzeros: expected packed words of {_words()}; got {kind}{hint}")
    if qzeros.ndim != 2:
        raise UsageError(f"qzeros: expected 2 dimensions [groups, words]; got {kind} of shape "
                         f"{list(qzeros.shape)}")
    word_bits = qzeros.element_size() * 8 if torch_in else qzeros.dtype.itemsize * 8
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or \
            int(bits) not in SUPPORTED_BITS:
        raise UsageError(f"bits: expected one of {SUPPORTED_BITS}; got {bits!r}")
    bits = int(bits)
    if bits == 3 and word_bits != 32:
        raise UsageError(f"qzeros: 3-bit packing needs int32 words; got {kind}")
    _, wpb = block(bits, word_bits)
    if qzeros.shape[1] % wpb:
        raise UsageError(f"qzeros: expected a multiple of {wpb} words per row for {bits}-bit "
                         f"int{word_bits} packing; got shape {list(qzeros.shape)}")
    for label, c in (("src", src), ("dst", dst)):
        if c not in CONVENTIONS:
            raise UsageError(f"{label}: expected one of {CONVENTIONS}; got {c!r}")
    arr = qzeros.detach().cpu().numpy() if torch_in else np.asarray(qzeros)
    fields, _ = convert_fields(unpack(arr, bits, axis=1), bits, src, dst, allow_lossy)
    out = pack(fields, bits, word_bits, axis=1)
    if torch_in:
        return torch.from_numpy(out).to(qzeros.device)
    return out


def _words() -> str:
    return "/".join(WORD_DTYPES)
