"""gptq_v2 as a written format: a module of the one model as GPTQ's tensors, and a config that
describes them (conversion/reformat.py writes it from compressed-tensors and AWQ sources; between
gptq and gptq_v2 only the zero points change, which conversion/write.py does in place of this).
"""
from __future__ import annotations

import re
from typing import Any

import numpy as np

from ...bits.conventions import GPTQ_V2
from ..configs import CONFIG_JSON, QUANTIZE_CONFIG
from ..model import QuantModule, is_lm_head
from ..source import Source
from ..targets import patterns


class GptqWriter:
    format: str = GPTQ_V2
    # config.json's quantization_config where SRC has a config.json; quantize_config.json
    # always (GPTQModel and AutoGPTQ read it first)
    config_files: tuple[tuple[str, bool], ...] = ((CONFIG_JSON, False), (QUANTIZE_CONFIG, True))
    hint: str = "keep it in compressed-tensors; vLLM loads it as it is"

    def no_form(self, m: QuantModule) -> str | None:
        return None     # GPTQ holds every module of the one model

    def keeps(self, tensor: str) -> bool:
        return True

    def metadata(self, meta: dict[str, str] | None) -> dict[str, str] | None:
        return meta

    def entries(self, m: QuantModule) -> list[tuple[str, str, tuple[int, ...], str]]:
        """(tensor name, dtype, shape, role) of module `m` as GPTQ stores it (g_idx always:
        every GPTQ exporter writes it)."""
        p, n, k, b = m.name, m.out_features, m.in_features, m.bits
        return [(f"{p}.qweight", "I32", (k * b // 32, n), "qweight"),
                (f"{p}.qzeros", "I32", (m.groups, n * b // 32), "qzeros"),
                (f"{p}.scales", m.scale_dtype, (m.groups, n), "scales"),
                (f"{p}.g_idx", "I32", (k,), "g_idx")]

    def tensor(self, role: str, src: Source, m: QuantModule) -> np.ndarray:
        return np.ascontiguousarray(getattr(src, role)(m))

    def config(self, modules: list[QuantModule], universe: list[str], unquantized: list[str],
               provenance: dict[str, Any]) -> dict[str, Any]:
        """A GPTQ quantization config for these modules: the most common scheme as the base,
        the others as `dynamic` `+:` rules, unquantized weights inside the decoder layers as
        `-:` rules (vLLM and GPTQModel quantize every linear a rule does not exclude)."""
        by_scheme: dict[tuple[int, int, bool, bool], list[str]] = {}
        for m in modules:
            by_scheme.setdefault(m.scheme, []).append(m.name)
        ranked = sorted(by_scheme.items(), key=lambda kv: -len(kv[1]))
        (bits, gs, sym, act), _ = ranked[0]
        dynamic: dict[str, dict[str, Any]] = {}
        inner = [u for u in unquantized if ".layers." in u]
        if inner:
            for t in patterns(inner, universe):
                dynamic["-:" + _regex(t)] = {}
        for (b2, g2, s2, a2), names in ranked[1:]:
            for t in patterns(names, universe):
                dynamic["+:" + _regex(t)] = {"bits": b2, "group_size": g2, "sym": s2,
                                             "desc_act": a2}
        doc: dict[str, Any] = {
            "quant_method": "gptq", "bits": bits, "group_size": gs, "desc_act": act,
            "sym": sym, "lm_head": any(is_lm_head(m.name) for m in modules),
            "pack_dtype": "int32", "checkpoint_format": self.format, "format": self.format}
        if dynamic:
            doc["dynamic"] = dynamic
        doc["meta"] = {"gptqfmt": provenance}
        return doc


def _regex(target: str) -> str:
    return target[3:] if target.startswith("re:") else "^" + re.escape(target) + "$"
