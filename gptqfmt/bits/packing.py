"""Pack and unpack GPTQ codes: one little-endian bit stream cut into W-bit words.

Value k of the packed axis sits at stream bit k*bits: word k*bits // W, bit k*bits % W, least
significant first. For 2/4/8 bits a word holds W/bits whole values; 3-bit values (W = 32 only)
fill three words per 32 values, values 10 and 21 straddling two words.

Worked example, 4-bit int32, fields LSB first [0, 3, 15, 8, 8, 8, 8, 8]:

    bits 31..0 = 1000 1000 1000 1000 1000 1111 0011 0000 = 0x88888F30

qweight packs along dim 0 (input channels), qzeros along dim 1 (output channels): pass `axis`.
Words are signed in files (I8/I16/I32/I64); arithmetic is done on their unsigned view. The loops
below run over field positions within one block of words (at most 64), never over elements.
"""
from __future__ import annotations

from functools import lru_cache
from math import lcm

import numpy as np

SUPPORTED_BITS = (2, 3, 4, 8)
WORD_BITS = (8, 16, 32, 64)
UNSIGNED = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
_SIGNED = {8: np.int8, 16: np.int16, 32: np.int32, 64: np.int64}


def check_bits(bits: int, word_bits: int) -> None:
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits={bits}: GPTQ packing supports {SUPPORTED_BITS}")
    if word_bits not in WORD_BITS:
        raise ValueError(f"word size {word_bits} bits: expected one of {WORD_BITS}")
    if bits == 3 and word_bits != 32:
        raise ValueError(f"3-bit packing needs int32 words; got int{word_bits}")


def block(bits: int, word_bits: int) -> tuple[int, int]:
    """(values, words) in the smallest run of whole words holding whole values."""
    check_bits(bits, word_bits)
    n = lcm(bits, word_bits)
    return n // bits, n // word_bits


def maxq(bits: int) -> int:
    return (1 << bits) - 1


def unpack(words: np.ndarray, bits: int, axis: int = 0) -> np.ndarray:
    """Codes (uint8) from packed words along `axis`; that axis grows by W/bits."""
    words = np.asarray(words)
    word_bits = words.dtype.itemsize * 8
    if words.dtype.kind not in "iu":
        raise ValueError(f"packed words must be integers; got {words.dtype}")
    vpb, wpb = block(bits, word_bits)
    axis %= max(1, words.ndim)
    if bits != 3 and np.little_endian and words.dtype.isnative and words.ndim >= 1 and \
            (axis == words.ndim - 1 or (axis == 0 and words.ndim == 2)):
        return _unpack_bytes(np.ascontiguousarray(words), bits, axis)
    u = np.moveaxis(words.view(UNSIGNED[word_bits]), axis, 0)
    if u.shape[0] % wpb:
        raise ValueError(f"{u.shape[0]} words along axis {axis}: {bits}-bit int{word_bits} "
                         f"packing needs a multiple of {wpb}")
    return np.moveaxis(unpack_stream(u, bits), 0, axis)


def unpack_columns(words: np.ndarray, bits: int, cols: np.ndarray) -> np.ndarray:
    """unpack(words, bits, axis=1)[:, cols], unpacking only the blocks of words that hold
    `cols` (a few columns of a qzeros [G, N*bits/W] need not cost all of it).
    Worked example, 4-bit int32 row [0x76543210, 0xFEDCBA98]: columns [1, 9, 15] are in
    blocks 0, 1, 1 (8 values a word), fields 1, 1, 7 of theirs: 1, 9, 15."""
    words = np.asarray(words)
    cols = np.asarray(cols, dtype=np.int64)
    vpb, wpb = block(bits, words.dtype.itemsize * 8)
    at = (cols // vpb)[:, None] * wpb + np.arange(wpb)          # [n, wpb] word indices
    taken = words[:, at.reshape(-1)].reshape(-1, wpb)          # [G * n, wpb]
    values = unpack(taken, bits, axis=1).reshape(words.shape[0], cols.size, vpb)
    return np.take_along_axis(values, (cols % vpb)[None, :, None], axis=2)[:, :, 0]


def _unpack_bytes(words: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """unpack for 2/4/8 bits on little-endian words, packed along the last axis or along axis 0
    of a matrix: the words' bytes are the bit stream in order, so field k of a word is bits
    (k % (8/bits)) * bits of its byte k // (8/bits), and every shift runs on bytes.
    Worked example, 4-bit int32 0x88888F30 (bytes 30 8F 88 88): low nibbles 0, F, 8, 8 and high
    nibbles 3, 8, 8, 8 interleave to fields 0, 3, 15, 8, 8, 8, 8, 8."""
    per_byte, nbytes = 8 // bits, words.dtype.itemsize
    mask = np.uint8(maxq(bits))
    b: np.ndarray = words.view(np.uint8)
    if axis == words.ndim - 1:  # [..., n words] -> [..., n * W/bits]
        if bits == 8:
            codes: np.ndarray = b.copy()
            return codes
        out = np.empty(b.shape[:-1] + (b.shape[-1] * per_byte,), dtype=np.uint8)
        for j in range(per_byte):
            np.bitwise_and(b >> np.uint8(j * bits), mask, out=out[..., j::per_byte])
        return out
    nw, n = words.shape        # [nw, n] words along axis 0 -> [nw * W/bits, n]
    b = b.reshape(nw, n, nbytes)
    out = np.empty((nw, nbytes, per_byte, n), dtype=np.uint8)
    for i in range(nbytes):
        for j in range(per_byte):
            np.bitwise_and(b[:, :, i] >> np.uint8(j * bits), mask, out=out[:, i, j])
    return out.reshape(nw * nbytes * per_byte, n)


def pack(codes: np.ndarray, bits: int, word_bits: int = 32, axis: int = 0) -> np.ndarray:
    """Signed words (int{word_bits}) from codes in [0, 2^bits - 1] along `axis`."""
    codes = np.asarray(codes)
    vpb, wpb = block(bits, word_bits)
    if codes.dtype.kind not in "iu":
        raise ValueError(f"codes must be integers; got {codes.dtype}")
    if codes.size and (codes.min() < 0 or codes.max() > maxq(bits)):
        bad = codes[(codes < 0) | (codes > maxq(bits))].flat[0]
        raise ValueError(f"code {int(bad)} out of range [0, {maxq(bits)}] for bits={bits}")
    c = np.moveaxis(codes, axis, 0)
    if c.shape[0] % vpb:
        raise ValueError(f"{c.shape[0]} values along axis {axis}: {bits}-bit int{word_bits} "
                         f"packing needs a multiple of {vpb}")
    words = pack_stream(c, bits, word_bits).view(_SIGNED[word_bits])
    return np.ascontiguousarray(np.moveaxis(words, 0, axis))


def _stream_block(bits: int, word_bits: int) -> tuple[int, int]:
    n = lcm(bits, word_bits)
    return n // bits, n // word_bits


def pack_stream(values: np.ndarray, bits: int, word_bits: int = 32) -> np.ndarray:
    """Unsigned words [m, *rest] from values [n, *rest] in [0, 2^bits - 1] (any bits 1..8; n
    a multiple of the block, lcm(bits, word_bits) / bits) as one bit stream along axis 0,
    least significant bit first: value k starts at bit k * bits of the stream and may
    straddle two words. GPTQ's packing (pack) and compressed-tensors' dense layout
    (ct_layouts) are both this stream.
    Worked example, 3 bits, int32: values 0..9 fill bits 0..29 of word 0, value 10's low two
    bits are its bits 30..31 and its high bit is bit 0 of word 1."""
    vpb, wpb = _stream_block(bits, word_bits)
    ut = UNSIGNED[word_bits]
    n, rest = values.shape[0], values.shape[1:]
    c = values.reshape(n // vpb, vpb, *rest)
    out = np.zeros((n // vpb, wpb, *rest), dtype=ut)
    for k in range(vpb):
        i, off = divmod(k * bits, word_bits)
        v = c[:, k].astype(ut)
        out[:, i] |= v << ut(off)
        if off + bits > word_bits:   # straddles into the next word
            out[:, i + 1] |= v >> ut(word_bits - off)
    words: np.ndarray = out.reshape(n // vpb * wpb, *rest)
    return words


def unpack_stream(words: np.ndarray, bits: int) -> np.ndarray:
    """Values (uint8) [n, *rest] from unsigned words [m, *rest] (m a multiple of the block):
    the inverse of pack_stream."""
    word_bits = words.dtype.itemsize * 8
    vpb, wpb = _stream_block(bits, word_bits)
    ut = UNSIGNED[word_bits]
    nw, rest = words.shape[0], words.shape[1:]
    blocks = words.reshape(nw // wpb, wpb, *rest)
    out = np.empty((nw // wpb, vpb, *rest), dtype=np.uint8)
    mask = ut(maxq(bits))
    for k in range(vpb):
        i, off = divmod(k * bits, word_bits)
        v = blocks[:, i] >> ut(off)
        if off + bits > word_bits:   # straddles into the next word
            v = v | (blocks[:, i + 1] << ut(word_bits - off))
        out[:, k] = v & mask
    codes: np.ndarray = out.reshape(nw // wpb * vpb, *rest)
    return codes


@lru_cache(maxsize=256)
def constant_words(value: int, bits: int, word_bits: int = 32) -> np.ndarray:
    """The repeating block of words (unsigned) in which every field equals `value` (read-only:
    one array per (value, bits, word_bits), shared by every caller)."""
    vpb, _ = block(bits, word_bits)
    out = pack(np.full(vpb, value, dtype=np.uint8), bits, word_bits).view(UNSIGNED[word_bits])
    out.flags.writeable = False
    return out


def unsigned(words: np.ndarray) -> np.ndarray:
    """The unsigned view of signed words (bit containers)."""
    return words.view(UNSIGNED[words.dtype.itemsize * 8])
