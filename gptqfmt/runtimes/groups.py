"""The runtime table grouped by how its kernel paths read a gptq field: one numerical
comparison covers every path of a group (verify --against compares a checkpoint under each
group's rule), and one sentence says what the groups make of a stored maxq.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..bits.conventions import GPTQ, ZeroRule, rule_for
from .readings import Reading, canonical, modelled
from .table import RUNTIMES

# --against reads a file the way its label means it: gptq_v2 fields as Z, gptq fields by one of
# the field rules the label-aware gptq_gemm-style kernels and the label-ignoring ones apply.
# Which runtimes ignore the label is the verdicts' business.


@dataclass(frozen=True)
class RuntimeGroup:
    """The kernel paths that read a gptq field the same way (one numerical comparison covers
    them): `labels` name them, `gptq` is their rule."""
    labels: tuple[str, ...]
    gptq: ZeroRule

    @property
    def name(self) -> str:
        """The first path and how many more ("vLLM gptq_gemm and 5 other kernels"); the
        runtimes section of inspect and verify says which."""
        return named(self.labels)

    def rule(self, convention: str) -> ZeroRule:
        return rule_for(convention, self.gptq)


def groups() -> list[RuntimeGroup]:
    """Every field rule some path applies to a gptq file, with the paths that apply it, in
    order of first appearance in RUNTIMES."""
    seen: dict[ZeroRule, list[str]] = {}
    for r in RUNTIMES:
        for p in r.paths:
            rule = p.readings[GPTQ].rule
            if rule is not None and rule != ZeroRule.V2:
                labels = seen.setdefault(rule, [])
                if p.label not in labels:
                    labels.append(p.label)
    return [RuntimeGroup(tuple(labels), rule) for rule, labels in seen.items()]


def named(labels: tuple[str, ...]) -> str:
    """Kernel paths in words: the first and how many more."""
    more = len(labels) - 1
    return labels[0] + (f" and {more} other kernel{'s' if more > 1 else ''}" if more else "")


def label_readings(label: str, bits: int, sym: bool) -> list[tuple[tuple[str, ...], Reading]]:
    """Every way some kernel path of the table reads the zero points of a `bits`-bit file
    labelled `label` (the label as each path reads it, a path that ignores it included), with
    the paths ("runtime kernel") that read it so: what `verify --reference` computes, one
    product per reading. Marlin's constant (qzeros not read) counts only where the config
    declares sym, which those paths require."""
    seen: dict[Reading, list[str]] = {}
    for r in RUNTIMES:
        for p in r.paths:
            rd = p.readings.get(label)
            if rd is None or (rd is Reading.SYMMETRIC and not sym):
                continue
            labels = seen.setdefault(modelled(canonical(rd, bits), bits), [])
            who = f"{r.name} {p.kernel}"   # the runtime's name tells its versions apart
            if who not in labels:
                labels.append(who)
    return [(tuple(labels), rd) for rd, labels in seen.items()]


def maxq_readings(bits: int, sep: str = "; ") -> str:
    """What the kernel paths read a stored maxq of a gptq file as, in a sentence: "vLLM
    gptq_gemm and 5 other kernels read Z = 16; TGI triton and 2 other kernels read Z = 0" at 4
    bits (which ones: the runtimes section of inspect and verify)."""
    z = {ZeroRule.V1_NOWRAP: 1 << bits, ZeroRule.V1_WRAP: 0}
    return sep.join(f"{g.name} read Z = {z[g.gptq]}" for g in groups())
