"""The runtimes that load GPTQ checkpoints, as data: which zero rule each applies to a file of
each convention, and how reports name them. Adding a runtime is one entry in RUNTIMES plus its
tests; every report, check and numerical comparison reads it from here.

The rules, from each runtime's source (../shared/docs/gptq-format.md has the citations): every
runtime reads a gptq_v2 field as Z itself; on a gptq file vLLM's gptq_gemm and ExLlamaV2 add 1
without wrapping (a stored maxq is 2^bits), AutoGPTQ's exllama kernels and TGI add 1 modulo
2^bits (a stored maxq is 0).
"""
from __future__ import annotations

from dataclasses import dataclass

from .conventions import STORED_OFFSET, ZeroRule, check


@dataclass(frozen=True)
class Runtime:
    id: str
    name: str        # short, as equivalence reports group runtimes ("AutoGPTQ exllama")
    prose: str       # in a sentence ("AutoGPTQ's exllama kernels")
    gptq_rule: ZeroRule  # how it reads a gptq file's stored fields

    def rule(self, convention: str) -> ZeroRule:
        """The zero rule this runtime applies to a file labelled `convention`: Z = s where the
        convention stores Z itself, else its own way of adding 1."""
        return ZeroRule.V2 if STORED_OFFSET[check(convention)] == 0 else self.gptq_rule


VLLM = Runtime("vllm", "vLLM gptq_gemm", "vLLM gptq_gemm", ZeroRule.V1_NOWRAP)
EXLLAMAV2 = Runtime("exllamav2", "ExLlamaV2", "ExLlamaV2", ZeroRule.V1_NOWRAP)
AUTOGPTQ_EXLLAMA = Runtime("autogptq-exllama", "AutoGPTQ exllama", "AutoGPTQ's exllama kernels",
                           ZeroRule.V1_WRAP)
TGI = Runtime("tgi", "TGI", "TGI", ZeroRule.V1_WRAP)
RUNTIMES = (VLLM, EXLLAMAV2, AUTOGPTQ_EXLLAMA, TGI)
# the reading checks and conversions go by when they need one (what vLLM reads)
REFERENCE = VLLM


@dataclass(frozen=True)
class RuntimeGroup:
    """Runtimes that read every field the same way (one numerical comparison covers them)."""
    runtimes: tuple[Runtime, ...]

    @property
    def name(self) -> str:
        return ", ".join(r.name for r in self.runtimes)

    def rule(self, convention: str) -> ZeroRule:
        return self.runtimes[0].rule(convention)


def groups() -> list[RuntimeGroup]:
    """RUNTIMES grouped by their zero rule on gptq files, in order of first appearance."""
    rules = list(dict.fromkeys(r.gptq_rule for r in RUNTIMES))
    return [RuntimeGroup(tuple(r for r in RUNTIMES if r.gptq_rule == rule)) for rule in rules]


def maxq_readings(bits: int, sep: str = "; ") -> str:
    """What each runtime group reads a stored maxq of a gptq file as, in a sentence:
    "vLLM gptq_gemm and ExLlamaV2 read Z = 16; AutoGPTQ's exllama kernels and TGI read Z = 0"
    at 4 bits."""
    z = {ZeroRule.V1_NOWRAP: 1 << bits, ZeroRule.V1_WRAP: 0}
    return sep.join(" and ".join(r.prose for r in g.runtimes) + f" read Z = {z[g.rule('gptq')]}"
                    for g in groups())
