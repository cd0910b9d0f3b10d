"""The library entry for one packed qzeros tensor: convert_qzeros checks what it is given and
converts it field by field (conventions.convert_fields)."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..bits.conventions import CONVENTIONS, convert_fields
from ..bits.packing import SUPPORTED_BITS, block, pack, unpack
from ..errors import UsageError

WORD_DTYPES = ("int8", "int16", "int32", "int64")  # the packer's words, as files store them


def convert_qzeros(qzeros: Any, bits: int, src: str = "gptq", dst: str = "gptq_v2",
                   allow_lossy: bool = False) -> Any:
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
        assert torch is not None
        return torch.from_numpy(out).to(qzeros.device)
    return out


def _words() -> str:
    return "/".join(WORD_DTYPES)
