"""Evidence for the zero-point convention (gptq vs gptq_v2) from the data itself.

Symmetric quantization sets Z = 2^(bits-1) in every group. A `gptq` file stores Z - 1 in every
field (4-bit words 0x77777777), a `gptq_v2` file stores Z (0x88888888). Asymmetric quantization
never yields one constant Z over every group and column of a real layer, so a whole module of one
of these patterns decides it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .packing import block, constant_words, unsigned

GPTQ, GPTQ_V2, AMBIGUOUS = "gptq", "gptq_v2", "ambiguous"


def sym_field(bits: int, convention: str) -> int:
    """The stored field of a symmetric zero point under `convention`."""
    return (1 << (bits - 1)) - (1 if convention == GPTQ else 0)


def symmetric_pattern(qzeros: np.ndarray, bits: int) -> str | None:
    """GPTQ or GPTQ_V2 when every field is that convention's symmetric zero, else None."""
    w = qzeros.dtype.itemsize * 8
    _, wpb = block(bits, w)
    u = unsigned(np.asarray(qzeros))
    if u.size == 0 or u.shape[-1] % wpb:
        return None
    blocks = u.reshape(-1, wpb)
    for conv in (GPTQ, GPTQ_V2):
        if np.array_equal(blocks, np.broadcast_to(constant_words(sym_field(bits, conv), bits, w),
                                                  blocks.shape)):
            return conv
    return None


@dataclass
class ModuleVerdict:
    name: str
    verdict: str
    confidence: float
    evidence: list[str] = field(default_factory=list)

    def to_json(self):
        return {"name": self.name, "verdict": self.verdict, "confidence": self.confidence,
                "evidence": self.evidence}


@dataclass
class Detection:
    verdict: str
    confidence: float
    modules: list[ModuleVerdict]
    evidence: list[str]


def detect_module(name: str, qzeros: np.ndarray, bits: int) -> ModuleVerdict:
    conv = symmetric_pattern(qzeros, bits)
    if conv is not None:
        f = sym_field(bits, conv)
        return ModuleVerdict(name, conv, 1.0, [f"every zero-point field is {f}: the symmetric "
                                               f"zero {1 << (bits - 1)} stored as {conv}"])
    return ModuleVerdict(name, AMBIGUOUS, 0.0, ["zero points are not one symmetric constant"])


def combine(verdicts: list[ModuleVerdict]) -> Detection:
    """One verdict for the checkpoint: unanimous decided modules, else ambiguous."""
    if not verdicts:
        return Detection(AMBIGUOUS, 0.0, [], ["no quantized module to look at"])
    counts = {c: sum(v.verdict == c for v in verdicts) for c in (GPTQ, GPTQ_V2, AMBIGUOUS)}
    n = len(verdicts)
    summary = f"{counts[GPTQ]} gptq, {counts[GPTQ_V2]} gptq_v2, {counts[AMBIGUOUS]} ambiguous " \
              f"of {n} modules"
    if counts[GPTQ] and counts[GPTQ_V2]:
        return Detection(AMBIGUOUS, 0.0, verdicts, [summary + ": modules disagree"])
    for conv in (GPTQ, GPTQ_V2):
        if counts[conv] == n:
            conf = min(v.confidence for v in verdicts)
            return Detection(conv, conf, verdicts, [summary])
    return Detection(AMBIGUOUS, 0.0, verdicts, [summary])
