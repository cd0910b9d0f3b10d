"""GPTQ (gptq and gptq_v2) as a Source of the one model: the reader over checkpoint.py's model.

A gptq (v1) checkpoint's zero points go through conventions.convert_fields, the same per-field
rules as `convert --to gptq_v2` (a stored maxq is ambiguous and is refused without
allow_lossy), so moving to another format refuses exactly where gptq -> gptq_v2 does. Its stored
fields follow the convention its label declares (`labelled`): the source reads them in that
convention until read_as names another (the detected one, or convert's --from).
"""
from __future__ import annotations

from functools import cached_property
from typing import Any

import numpy as np

from ...bits.conventions import (
    GPTQ_V2,
    REFERENCE,
    ZeroRule,
    convert_fields,
    effective_zeros,
    lossy_mask,
    rule_for,
    shift,
)
from ...bits.packing import pack, unpack, unsigned
from ...findings import Finding
from ..model import ModuleRecord, ModuleTensors, QuantModule, any_lm_head, mixed, uniform
from ..relayout import Banded, bands_of, words_differ
from .checkpoint import Checkpoint, Module


class GptqSource:
    scale_axes = ("group", "column")

    def __init__(self, ckpt: Checkpoint, convention: str | None = None,
                 allow_lossy: bool = False):
        self.ckpt, self.store, self.root, self.path = ckpt, ckpt.store, ckpt.store.root, ckpt.path
        self.format = convention or ckpt.label
        self.allow_lossy = allow_lossy
        self.findings: list[Finding] = list(ckpt.findings)
        self.config_files = list(ckpt.config.sources) if ckpt.config else []
        self.declared_by = self.config_files[0] if self.config_files else None
        self.other_tensors = ckpt.other_tensors

    @property
    def labelled(self) -> Checkpoint:
        return self.ckpt

    @cached_property
    def modules(self) -> list[QuantModule]:
        """Every valid module; those the config's `dynamic` excludes (GQ313) unlisted."""
        return [QuantModule(m.name, m.bits, m.group_size, m.in_features, m.out_features,
                            self._symmetric(m), bool(m.act_order), m.scale_dtype,
                            _without_bias(m.tensors),
                            listed=m.declared is not None)
                for m in self.ckpt.valid_modules]

    @cached_property
    def passthrough(self) -> list[str]:
        claimed = {t for m in self.modules for t in m.tensors.values()}
        return sorted(t for t in self.store.locations if t not in claimed)

    def read_as(self, convention: str, allow_lossy: bool = False) -> GptqSource:
        if (convention, allow_lossy) == (self.format, self.allow_lossy):
            return self   # its modules are already read
        return GptqSource(self.ckpt, convention, allow_lossy)

    def _module(self, m: QuantModule) -> Module:
        return self.ckpt.module(m.name)

    def _symmetric(self, m: Module) -> bool:
        """Declared sym and every Z = 2^(bits-1) (a sym label over other zeros is GQ403): every
        stored field the symmetric one of the convention read. Modules are read one after
        another here, so the pages of a qzeros read here are dropped after each."""
        return bool(m.declared and m.declared.sym) and \
            self.ckpt.symmetric_pattern(m, release=True) == self.format

    # -- the one model -------------------------------------------------------------------
    def qweight(self, m: QuantModule) -> np.ndarray:
        w = self.ckpt.view(m.tensors["qweight"])
        if w.dtype.itemsize == 4:
            return w.view(np.int32)
        return pack(unpack(unsigned(w), m.bits, axis=0), m.bits, 32, axis=0)

    def stored_qweight(self, m: QuantModule) -> tuple[np.ndarray, bool]:
        return self.qweight(m), False

    def qweight_bands(self, m: QuantModule) -> Banded:
        return bands_of(self.qweight(m), False)

    def qweight_columns(self, m: QuantModule, cols: np.ndarray) -> np.ndarray:
        if self._module(m).word_bits != 32:   # other words: re-packed whole (qweight)
            return np.asarray(self.qweight(m))[:, cols]
        return self.store.columns(m.tensors["qweight"], np.asarray(cols)).view(np.int32)

    def qweight_differ(self, m: QuantModule, words: np.ndarray, transposed: bool) -> int:
        return words_differ(self.qweight(m), False, words, transposed)

    def qzeros(self, m: QuantModule) -> np.ndarray:
        words = self.zero_words(m)
        if words is not None:   # Z already, in int32 words: as stored, nothing re-packed
            return words
        stored = self.ckpt.stored_fields(self._module(m))
        if self.format != GPTQ_V2:
            stored = convert_fields(stored, m.bits, self.format, GPTQ_V2, self.allow_lossy)[0]
        return pack(stored, m.bits, 32, axis=1)

    def scales(self, m: QuantModule) -> np.ndarray:
        return self.ckpt.view(m.tensors["scales"])

    def g_idx(self, m: QuantModule) -> np.ndarray:
        return self.ckpt.g_idx(self._module(m)).astype(np.int32)

    # -- as runtimes read it -------------------------------------------------------------
    def operands(self, m: QuantModule, gptq_rule: ZeroRule | None = None
                 ) -> tuple[ModuleTensors, ZeroRule]:
        """The file's own tensors (any word size), under its convention's rule."""
        t = self.ckpt.module_tensors(self._module(m))
        return t, rule_for(self.format, gptq_rule if gptq_rule is not None else REFERENCE)

    def zero_words(self, m: QuantModule) -> np.ndarray | None:
        """The stored words where they hold Z itself (read as gptq_v2, in int32 words); None
        where Z is the rule's reading of them (gptq: s + 1, a stored maxq read two ways) or
        they are packed in other words."""
        if shift(self.format, GPTQ_V2) or self._module(m).word_bits != 32:
            return None
        words: np.ndarray = self.ckpt.view(m.tensors["qzeros"]).view(np.int32)
        return words

    def zeros(self, m: QuantModule, gptq_rule: ZeroRule | None = None
              ) -> tuple[np.ndarray, np.ndarray]:
        """(Z as the rule reads the stored fields, the fields gptq_v2 cannot hold exactly):
        what a conversion must reproduce, and where it may not (conventions.lossy_mask)."""
        stored = self.ckpt.stored_fields(self._module(m))
        rule = rule_for(self.format, gptq_rule if gptq_rule is not None else REFERENCE)
        z = effective_zeros(stored, m.bits, rule)
        lossy = lossy_mask(stored, m.bits, self.format, GPTQ_V2)
        return z, (np.zeros(z.shape, dtype=bool) if lossy is None else lossy)

    # -- what inspect and verify say of it -----------------------------------------------
    def data_findings(self, m: QuantModule, full: bool) -> list[Finding]:
        return []   # GPTQ's data checks read the detected convention (checks/modules.py)

    @property
    def record_count(self) -> int:
        return len(self.ckpt.modules)

    def records(self) -> list[ModuleRecord]:
        ck = self.ckpt
        return [ModuleRecord(
            m.name, m.bits, m.group_size, m.act_order,
            m.declared.sym if m.declared else None, m.in_features, m.out_features,
            m.pack_dtype, m.groups, m.scale_dtype, "g_idx" in m.tensors, "bias" in m.tensors,
            m.declared is None, m.valid, sorted({ck.store.file_of(t) for t in m.tensors.values()}))
            for m in ck.modules]

    def quantization(self) -> dict[str, Any]:
        """Declared base values, falling back to the value every module's shapes agree on."""
        ck = self.ckpt
        base = ck.config.base if ck.config else None
        mods = ck.valid_modules

        def pick(declared: Any, inferred: Any) -> Any:
            return declared if declared is not None else inferred

        return {
            "bits": pick(base and base.bits, uniform(mods, "bits")),
            "group_size": pick(base and base.group_size, uniform(mods, "group_size")),
            "sym": base.sym if base else None,
            "desc_act": pick(base and base.desc_act, uniform(mods, "act_order")),
            "pack_dtype": pick(base and base.pack_dtype,
                               None if (w := uniform(mods, "word_bits")) is None else
                               f"int{w}"),   # Module.pack_dtype, formatted once
            "lm_head": any_lm_head(mods),
            "static_groups": bool(ck.config and ck.config.static_groups),
            "mixed": mixed(mods, ("bits", "group_size", "act_order", "word_bits")),
        }

    def describe(self) -> str:
        return f"GPTQ {self.format} ({', '.join(self.config_files) or 'no config'})"

    def close(self) -> None:
        self.ckpt.close()


def _without_bias(tensors: dict[str, str]) -> dict[str, str]:
    """A module's tensors but its bias (copied only where it has one: a dict a module, for tens
    of thousands of modules, is kept once)."""
    return {r: t for r, t in tensors.items() if r != "bias"} if "bias" in tensors else tensors
