"""How a kernel path reads stored zero points (a Reading), and everything a reading means, in
one place: the Z it computes from packed qzeros, the formula the tables print, the field rule
the kernels share, where it agrees with the data without a field being read, why it differs
(the finding code of its cause, and the sentence that says it), and how many cells it
misreads, counted on the packed words.

A new way of reading zero points is one member of Reading and its entries here; the runtime
table (table.py) then names it for the paths that read that way.

"What the data mean" (truth_zeros) is the detected convention: Z = s for gptq_v2 data; Z = s + 1
for gptq data, where a stored maxq means Z = 0 (the only Z a clean gptq writer stores there)
unless the codes of that cell say Z = 2^bits (`high`: their flat indices).
"""
from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING, Iterable

import numpy as np

from ..bits import Array, unique
from ..bits.conventions import GPTQ, GPTQ_V2, ZeroRule, effective_zeros, sym_field
from ..bits.packing import UNSIGNED, constant_words, unpack, unsigned
from ..bits.swar import carried_fields, count_marked, marked

if TYPE_CHECKING:
    from ..detection.decide import ModuleVerdict


# why a runtime computes other weights than the data mean: the finding code of each cause
CAUSE_LABEL = "GQ602"       # it reads the other convention (the config's label)
CAUSE_IGNORES = "GQ603"     # it ignores qzeros, which are not the symmetric constant
CAUSE_MAXQ = "GQ604"        # it reads stored maxq fields as another Z than the data mean
CAUSE_WORDS = "GQ605"       # its arithmetic corrupts fields: word carries, borrows, a 4-bit mask


class Reading(Enum):
    """How one runtime path turns a module's qzeros into Z: a field rule the kernel shares
    (`rule`), packed-word arithmetic that crosses fields, or no reading at all.

    Worked example, 4-bit, one int32 word of fields (LSB first) [15, 3, 0, 8, ...]:
      V1_NOWRAP  [16, 4, 1, 9]  s + 1
      V1_WRAP    [0, 4, 1, 9]   (s + 1) & 15
      V1_CARRY   [0, 5, 1, 9]   word + 0x11111111: the 15 carries into the next field
      V1_NIBBLE  [0, 4, 1, 9]   ((s & 15) + 1) & 15 (at 8 bits: Z mod 16, AutoGPTQ's bug)
      V2         [15, 3, 0, 8]  s
      V2_BORROW  [15, 3, 16, 7] word - 0x11111111 (the 0 borrows from the next field), + 1
      SYMMETRIC  [8, 8, 8, 8]   qzeros never read (Marlin's uint4b8 type)
    """
    V2 = "v2"                # Z = s
    V1_NOWRAP = "v1"         # Z = s + 1; a stored maxq is 2^bits
    V1_WRAP = "v1-wrap"      # Z = (s + 1) mod 2^bits; a stored maxq is 0
    V1_CARRY = "v1-carry"    # GPTQModel's v1 -> v2 at load: word + 0x..1111, carries cross fields
    V2_BORROW = "v2-borrow"  # ExLlamaV2 on gptq_v2: word - 0x..1111 (borrows), then Z = s' + 1
    V1_NIBBLE = "v1-nibble"  # AutoGPTQ's CUDA extension: ((s & maxq) + 1) & 15, at any bits
    SYMMETRIC = "symmetric"  # qzeros not read: Z = 2^(bits-1)

    # members are singletons compared by identity: hashed as such, in C (Enum's own hash is a
    # Python call on the name, a million of them per checkpoint of tens of thousands of modules)
    __hash__ = object.__hash__

    @property
    def rule(self) -> ZeroRule | None:
        """The kernel's field rule for this reading, None where it is not field by field."""
        return _RULES.get(self)

    @property
    def convention(self) -> str | None:
        """The convention this reading takes the fields to be in (None: qzeros not read)."""
        return None if self is Reading.SYMMETRIC else \
            GPTQ_V2 if self in (Reading.V2, Reading.V2_BORROW) else GPTQ

    @property
    def formula(self) -> str:
        """How it computes Z from the stored field s, as the README's runtime table says it."""
        return _FORMULAS[self]


_RULES = {Reading.V2: ZeroRule.V2, Reading.V1_NOWRAP: ZeroRule.V1_NOWRAP,
          Reading.V1_WRAP: ZeroRule.V1_WRAP}
_FORMULAS = {Reading.V2: "Z = s", Reading.V1_NOWRAP: "s + 1",
             Reading.V1_WRAP: "(s + 1) mod 2^b", Reading.V1_CARRY: "word + 0x..1111 (carries)",
             Reading.V2_BORROW: "word - 0x..1111, + 1 (borrows)",
             Reading.V1_NIBBLE: "((s & maxq) + 1) & 15", Reading.SYMMETRIC: "qzeros not read"}
# the readings that add a packed constant to whole words: + 1 (True) or - 1 (False) per field
_WORD_ADD = {Reading.V1_CARRY: True, Reading.V2_BORROW: False}


def read_zeros(qzeros: Array, bits: int, reading: Reading) -> Array:
    """Z per cell (int32, [G, N]) as a runtime reading computes it from packed qzeros [G, W'].

    The word readings emulate the runtimes' arithmetic on the unsigned words, modulo 2^W: a
    carry or borrow out of a field moves into the next field of the same word and is lost at
    the top of the word (3-bit fields straddle words, so a carry crosses words there as the
    runtimes' per-word additions do not: no 3-bit word reading is modelled; ValueError)."""
    words = np.asarray(qzeros)
    if reading is Reading.SYMMETRIC:
        g, nw = words.shape
        n = nw * words.dtype.itemsize * 8 // bits
        return np.full((g, n), 1 << (bits - 1), dtype=np.int32)
    if reading.rule is not None:
        return effective_zeros(unpack(words, bits, axis=1), bits, reading.rule)
    if reading is Reading.V1_NIBBLE:  # a 4-bit mask whatever the bits (AutoGPTQ 0.7.1)
        return (unpack(words, bits, axis=1).astype(np.int32) + 1) & 0x0F
    if bits == 3:
        raise ValueError(f"{reading.name}: no 3-bit word arithmetic is modelled")
    w = words.dtype.itemsize * 8
    u = unsigned(words)
    one = constant_words(1, bits, w)[0]
    with np.errstate(over="ignore"):
        moved = u + one if _WORD_ADD[reading] else u - one
    fields = unpack(moved.astype(UNSIGNED[w]), bits, axis=1).astype(np.int32)
    return fields if _WORD_ADD[reading] else fields + 1


def truth_zeros(stored: Array, bits: int, convention: str, high: Iterable[int] = ()) -> Array:
    """Z per cell [G, N] (int32) as the data mean it, from the stored fields [G, N] (see the
    module docstring): s for gptq_v2; s + 1 for gptq, a stored maxq 0 unless its codes say
    2^bits (`high`: flat indices)."""
    if convention == GPTQ_V2:
        return effective_zeros(stored, bits, ZeroRule.V2)
    z = effective_zeros(stored, bits, ZeroRule.V1_WRAP)
    at = np.fromiter(high, dtype=np.int64)
    if at.size:
        z.reshape(-1)[at] = 1 << bits
    return z


def canonical(reading: Reading, bits: int) -> Reading:
    """The field rule a reading amounts to at `bits`, where it is one: AutoGPTQ's 4-bit mask
    wraps at 4 bits and cannot wrap below (((s & maxq) + 1) <= 8 < 16). bits=0: unchanged."""
    if reading is Reading.V1_NIBBLE and 0 < bits < 8:
        return Reading.V1_WRAP if bits == 4 else Reading.V1_NOWRAP
    return reading


def modelled(reading: Reading, bits: int) -> Reading:
    """The reading as modelled at `bits`: the runtimes that add packed constants (GPTQModel,
    ExLlamaV2) do so per word, and 3-bit fields straddle words; modelled field by field, the
    carry within a word only would be a guess, so the label's offset is what every cell
    shows."""
    if bits == 3 and reading in (Reading.V1_CARRY, Reading.V2_BORROW):
        return Reading.V1_WRAP if reading is Reading.V1_CARRY else Reading.V2
    return reading


def differs_everywhere(reading: Reading, truth: str) -> bool:
    """Readings that move every field whatever it holds: the other convention's offset."""
    if truth == GPTQ_V2:
        return reading in (Reading.V1_NOWRAP, Reading.V1_WRAP, Reading.V1_CARRY)
    return reading in (Reading.V2, Reading.V2_BORROW)


def agrees_without_reading(reading: Reading, truth: str, v: ModuleVerdict) -> bool:
    """Readings that give the data's Z in every cell, known without reading qzeros (from the
    module's symmetric pattern and its field counts)."""
    st = v.stats
    if reading is Reading.SYMMETRIC:
        return v.pattern == truth
    if truth == GPTQ_V2:
        # borrows start only at a stored 0
        return reading is Reading.V2 or (reading is Reading.V2_BORROW and (
            v.pattern is not None or (st is not None and st.stored_zero == 0)))
    if reading is Reading.V1_WRAP:
        return st is None or not st.consistent_at  # a stored maxq means Z = 0
    if reading is Reading.V1_NOWRAP:
        return v.pattern is not None or (st is not None and st.stored_maxq == 0)
    if reading is Reading.V1_CARRY:  # carries start only at a stored maxq
        return v.pattern is not None or (st is not None and st.stored_maxq == 0)
    return False


def cause_of(reading: Reading, label_right: bool, bits: int) -> str:
    """The finding code of why `reading` misreads (with the label read right or not)."""
    if reading is Reading.SYMMETRIC:
        return CAUSE_IGNORES
    if not label_right:
        return CAUSE_LABEL
    if reading in _WORD_ADD or (reading is Reading.V1_NIBBLE and bits > 4):
        return CAUSE_WORDS
    return CAUSE_MAXQ


def cause_text(cause: str, reading: Reading, label: str, truth: str, kernel: str) -> str:
    """The sentence that says why `reading` (of kernel path `kernel`, reading `label`) gives
    other zero points than the data's (`truth`) for `cause`."""
    if cause == CAUSE_IGNORES:
        return (f"{kernel} ignores qzeros and decodes with Z = 2^(bits-1), but the zero "
                "points are not that constant")
    if cause == CAUSE_LABEL:
        return f"reads the zero points as {label}, but the data are {truth}"
    if cause == CAUSE_WORDS:
        return {Reading.V1_CARRY: "adds 1 to each field by adding a packed constant to the "
                                  "word, so a stored maxq carries into the next field",
                Reading.V2_BORROW: "subtracts a packed constant from the word, so a zero point "
                                   "of 0 borrows from the next field",
                Reading.V1_NIBBLE: "masks each zero point to 4 bits (((s & maxq) + 1) & 15), "
                                   "so it reads Z mod 16"}[reading]
    if reading is Reading.V1_NOWRAP:
        return "reads a stored maxq as Z = 2^bits where the codes say Z = 0"
    if reading is Reading.V1_WRAP:
        return "reads a stored maxq as Z = 0 where the codes say Z = 2^bits"
    return ("reads stored maxq fields as another Z than their codes say (2^bits against 0 "
            "or the reverse)")


def count_misread(qz: Array, bits: int, out_features: int, cells: int, high: Array,
                  truth: str, reading: Reading) -> int | None:
    """The cells (of `cells`) that `reading` misreads in packed qzeros `qz` [G, W'] against
    the data's Z (`truth`, `high` as truth_zeros takes it), counted on the packed words (a
    few integer operations per word, no unpacking: inspect reads every module's qzeros); None
    where it needs the fields."""
    if bits == 3 or reading is Reading.V1_NIBBLE:
        return None
    if truth == GPTQ:
        if reading is Reading.V1_WRAP:      # wrong exactly where the codes say 2^bits
            return int(high.size)
        if reading is Reading.V1_NOWRAP:    # wrong at every stored maxq the codes say is 0
            return count_marked(qz, bits, value=(1 << bits) - 1) - int(high.size)
        if reading is Reading.V1_CARRY:     # where a carry lands, and the 2^bits cells
            if not high.size:
                return count_marked(qz, bits, True)
            rows = unique(high // out_features)   # the few rows those cells are in
            at = np.searchsorted(rows, high // out_features) * out_features + \
                high % out_features
            reached = marked(carried_fields(qz[rows], bits, True), bits, at, out_features)
            return count_marked(qz, bits, True) + int(np.count_nonzero(~reached))
    if truth == GPTQ_V2 and reading is Reading.V2_BORROW:  # where a borrow lands, and the 0s
        return count_marked(qz, bits, False) + count_marked(qz, bits, False, value=0,
                                                            unless_carried=True)
    if reading is Reading.SYMMETRIC:        # every field other than the constant's
        return cells - count_marked(qz, bits, value=sym_field(bits, truth))
    return None
