"""GPTQ (gptq and gptq_v2) as a source of the one model, and gptq_v2 as a written format.

The source wraps gptq/checkpoint.py's model: a gptq (v1) checkpoint's zero points go through
conventions.convert_fields, the same per-field rules as `convert --to gptq_v2` (a stored maxq is
ambiguous and is refused without allow_lossy), so moving to another format refuses exactly where
gptq -> gptq_v2 does.
"""
from __future__ import annotations

import re

import numpy as np

from .. import runtimes
from ..conventions import GPTQ_V2, convert_fields, effective_zeros, lossy_mask, sym_field
from ..gptq.checkpoint import Checkpoint, Module
from ..gptq.detect import stored_fields
from ..gptq.evidence import module_g_idx
from ..gptq.packing import pack, unpack, unsigned
from .model import QuantModule
from .targets import patterns


class GptqSource:
    def __init__(self, ckpt: Checkpoint, convention: str, allow_lossy: bool = False):
        self.ckpt, self.store, self.root = ckpt, ckpt.store, ckpt.store.root
        self.format = convention
        self.allow_lossy = allow_lossy
        self.findings = list(ckpt.findings)
        self.config_files = list(ckpt.config.sources) if ckpt.config else []
        self._by_name: dict[str, Module] = {}
        self.modules: list[QuantModule] = []
        claimed: set[str] = set()
        self.unlisted: dict[str, str] = {}   # quantized, but `dynamic` excludes it (GQ313)
        for m in ckpt.modules:
            if m.valid and m.declared is None:
                self.unlisted[m.name] = m.tensors["qweight"]
            if not (m.valid and m.declared is not None):
                continue
            self._by_name[m.name] = m
            claimed.update(t for r, t in m.tensors.items() if r != "bias")
            self.modules.append(QuantModule(
                m.name, m.bits, m.group_size, m.in_features, m.out_features,
                self._symmetric(m), bool(m.act_order), m.scale_dtype,
                {r: t for r, t in m.tensors.items() if r != "bias"}))
        self.passthrough = sorted(t for t in ckpt.store.locations if t not in claimed)

    def module(self, name: str) -> Module:
        """The checkpoint's own Module of that name (gptq/checkpoint.py's model of it)."""
        return self._by_name[name]

    def _symmetric(self, m: Module) -> bool:
        """Declared sym and every Z = 2^(bits-1) (a sym label over other zeros is GQ403);
        read from the stored fields, so a field no convention maps exactly is simply not sym."""
        if not (m.declared and m.declared.sym):
            return False
        qz = m.tensors["qzeros"]
        stored = stored_fields(self.ckpt.view(qz), m.bits)
        self.store.release([qz])
        return bool(np.all(stored == sym_field(m.bits, self.format)))

    def _fields(self, m: Module | QuantModule) -> np.ndarray:
        """Z per group and output channel (gptq_v2 semantics), uint8 [G, N]."""
        qz = m.tensors["qzeros"]
        stored = stored_fields(self.ckpt.view(qz), m.bits)
        self.store.release([qz])
        if self.format == GPTQ_V2:
            return stored
        return convert_fields(stored, m.bits, self.format, GPTQ_V2, self.allow_lossy)[0]

    def qweight(self, m: QuantModule) -> np.ndarray:
        w = self.ckpt.view(m.tensors["qweight"])
        if w.dtype.itemsize == 4:
            return w.view(np.int32)
        return pack(unpack(unsigned(w), m.bits, axis=0), m.bits, 32, axis=0)

    def qzeros(self, m: QuantModule) -> np.ndarray:
        return pack(self._fields(m), m.bits, 32, axis=1)

    def scales(self, m: QuantModule) -> np.ndarray:
        return self.ckpt.view(m.tensors["scales"])

    def g_idx(self, m: QuantModule) -> np.ndarray:
        return module_g_idx(self.ckpt, self._by_name[m.name]).astype(np.int32)

    def close(self) -> None:
        self.ckpt.close()


# -- writing gptq_v2 -------------------------------------------------------------------------
def entries(m: QuantModule) -> list[tuple[str, str, tuple[int, ...], str]]:
    """(tensor name, dtype, shape, role) of module `m` as GPTQ stores it (g_idx always: every
    GPTQ exporter writes it)."""
    p, n, k, b = m.name, m.out_features, m.in_features, m.bits
    return [(f"{p}.qweight", "I32", (k * b // 32, n), "qweight"),
            (f"{p}.qzeros", "I32", (m.groups, n * b // 32), "qzeros"),
            (f"{p}.scales", m.scale_dtype, (m.groups, n), "scales"),
            (f"{p}.g_idx", "I32", (k,), "g_idx")]


def tensor(role: str, src, m: QuantModule) -> np.ndarray:
    return np.ascontiguousarray(getattr(src, role)(m))


def config(modules: list[QuantModule], universe: list[str], unquantized: list[str],
           provenance: dict, convention: str = GPTQ_V2) -> dict:
    """A GPTQ quantization config for these modules: the most common scheme as the base, the
    others as `dynamic` `+:` rules, unquantized weights inside the decoder layers as `-:` rules
    (vLLM and GPTQModel quantize every linear a rule does not exclude)."""
    by_scheme: dict[tuple, list[str]] = {}
    for m in modules:
        by_scheme.setdefault(m.scheme, []).append(m.name)
    ranked = sorted(by_scheme.items(), key=lambda kv: -len(kv[1]))
    (bits, gs, sym, act), _ = ranked[0]
    dynamic: dict[str, dict] = {}
    inner = [u for u in unquantized if ".layers." in u]
    if inner:
        for t in patterns(inner, universe):
            dynamic["-:" + _regex(t)] = {}
    for (b2, g2, s2, a2), names in ranked[1:]:
        for t in patterns(names, universe):
            dynamic["+:" + _regex(t)] = {"bits": b2, "group_size": g2, "sym": s2,
                                         "desc_act": a2}
    doc = {"quant_method": "gptq", "bits": bits, "group_size": gs, "desc_act": act, "sym": sym,
           "lm_head": any(m.name.split(".")[-1] == "lm_head" for m in modules),
           "pack_dtype": "int32", "checkpoint_format": convention, "format": convention}
    if dynamic:
        doc["dynamic"] = dynamic
    doc["meta"] = {"gptqfmt": provenance}
    return doc


def _regex(target: str) -> str:
    return target[3:] if target.startswith("re:") else "^" + re.escape(target) + "$"


def reference_zeros(src: GptqSource, m: QuantModule) -> tuple[np.ndarray, np.ndarray]:
    """(Z as the reference runtime reads the stored fields, the fields gptq_v2 cannot hold
    exactly): what a conversion must reproduce, and where it may not (conventions.lossy_mask)."""
    qz = m.tensors["qzeros"]
    stored = stored_fields(src.ckpt.view(qz), m.bits)
    src.store.release([qz])
    z = effective_zeros(stored, m.bits, runtimes.REFERENCE.rule(src.format))
    lossy = lossy_mask(stored, m.bits, src.format, GPTQ_V2)
    return z, (np.zeros(z.shape, dtype=bool) if lossy is None else lossy)
