"""What every format's reader offers (Source) and what a written format offers (Writer), over
the one module model of model.py.

The formats differ in one way the commands see: GPTQ stores each zero point as a field whose
meaning a label declares (gptq: Z - 1, gptq_v2: Z), so its data are checked against the label
and every runtime's reading of it (a source's `labelled` is then the GPTQ model of the
checkpoint that detection, the label checks and the runtime table read); compressed-tensors
and AWQ store Z itself (`labelled` is None: nothing to detect).
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np

from ..bits.conventions import ZeroRule
from ..bits.packing import unpack
from ..findings import Finding
from ..safetensors_io.index import TensorStore
from .gptq.checkpoint import Checkpoint
from .model import (
    DTYPE_KIND,
    Array,
    ModuleRecord,
    ModuleTensors,
    QuantModule,
    any_lm_head,
    mixed,
    uniform,
)
from .relayout import Banded, bands_of, transposed, words_differ


class OneModel(Protocol):
    """A module's tensors in the one model (model.py)."""

    def qweight(self, m: QuantModule) -> Array:
        """Codes as GPTQ int32 words [K*bits/32, N]."""

    def qzeros(self, m: QuantModule) -> Array:
        """Z itself (gptq_v2 semantics) as int32 words [G, N*bits/32]."""

    def scales(self, m: QuantModule) -> Array:
        """Scales [G, N] as stored (F16/F32 values, BF16 as its uint16 bits)."""

    def g_idx(self, m: QuantModule) -> Array:
        """The group of each input channel, int32 [K]."""


class Source(OneModel, Protocol):
    """A checkpoint opened in its own format, read one module at a time (what it holds, read
only: a reader's attributes or properties)."""

    @property
    def format(self) -> str:
        """Its format; for GPTQ the convention its fields are read in."""

    @property
    def path(self) -> Path:
        """The directory, or the one .safetensors file, it was opened from."""

    @property
    def root(self) -> Path:
        """Its directory."""

    @property
    def store(self) -> TensorStore:
        """Its tensors, across its files."""

    @property
    def modules(self) -> list[QuantModule]:
        """Every valid quantized module."""

    @property
    def passthrough(self) -> list[str]:
        """The tensors outside the modules, copied as they are."""

    @property
    def other_tensors(self) -> list[str]:
        """The tensors that belong to no module (inspect's count)."""

    @property
    def findings(self) -> list[Finding]:
        """What opening it found: container, index, configs, shapes."""

    @property
    def config_files(self) -> list[str]:
        """The config files that declare its quantization."""

    @property
    def declared_by(self) -> str | None:
        """The config that names its format (None: its tensors do)."""

    @property
    def scale_axes(self) -> tuple[str, str]:
        """What the axes of the stored scales are, for messages."""

    @property
    def labelled(self) -> Checkpoint | None:
        """The GPTQ model of the checkpoint when its stored zero points follow a convention a
        label declares (see the module docstring); None where Z is stored exactly."""

    def stored_qweight(self, m: QuantModule) -> tuple[Array, bool]:
        """qweight(), or the words the file stores when qweight() would be their transpose
        (then True): what comparisons read to need no transposed copy."""

    def qweight_bands(self, m: QuantModule) -> Banded:
        """qweight()'s transpose (compressed-tensors' weight_packed), made a band at a time
        from the words the file stores, never whole in memory."""

    def qweight_columns(self, m: QuantModule, cols: Array) -> Array:
        """qweight()[:, cols], reading (and re-laying out) only the words of those columns."""

    def qweight_differ(self, m: QuantModule, words: Array, transposed: bool) -> int:
        """How many words of qweight() differ from `words` (qweight's layout, or with
        `transposed` its transpose, as stored_qweight gives them); -1 when the shapes
        differ."""

    def operands(self, m: QuantModule, gptq_rule: ZeroRule | None = None
                 ) -> tuple[ModuleTensors, ZeroRule]:
        """The module's tensors and the zero rule runtimes compute it with: a labelled file's
        own tensors under its label, read with `gptq_rule` where its fields are gptq (default:
        the reference reading); another format's in the one model, Z as stored."""

    def zero_words(self, m: QuantModule) -> Array | None:
        """qzeros() where zeros(m) is exactly their unpacking with no lossy cell (a format that
        stores Z itself, or GPTQ read as gptq_v2): two modules' Z then compare word for word,
        nothing unpacked. None where Z is the rule's reading of the stored fields (gptq's)."""

    def zeros(self, m: QuantModule, gptq_rule: ZeroRule | None = None
              ) -> tuple[Array, Array]:
        """(Z per cell [G, N] as runtimes read it (operands' rule), the cells a conversion to
        gptq_v2 cannot carry exactly) for module `m`."""

    def data_findings(self, m: QuantModule, full: bool) -> list[Finding]:
        """The format's own checks of the module's data (inspect: full=False, bounded)."""

    def records(self) -> list[ModuleRecord]:
        """Every module found, as inspect lists it (invalid ones too)."""

    @property
    def record_count(self) -> int:
        """len(records()), without building them (a report that shows only the count)."""

    def quantization(self) -> dict[str, Any]:
        """inspect's `quantization`: the scheme the configs declare, else what every module
        agrees on."""

    def describe(self) -> str:
        """What the format stores, in words, for the text report."""

    def read_as(self, convention: str, allow_lossy: bool = False) -> Source:
        """This source with its stored fields read in `convention` (a labelled source; the
        others are the same source). `allow_lossy`: a field the one model cannot hold exactly
        is read the way a conversion writes it instead of refused."""

    def close(self) -> None: ...


class Writer(Protocol):
    """A format convert writes a module of the one model into (conversion/reformat.py)."""
    format: str
    # where its quantization config goes: (file, written even where SRC has none), in order
    config_files: tuple[tuple[str, bool], ...]
    hint: str                       # what to do with a module it has no form of

    def no_form(self, m: QuantModule) -> str | None:
        """Why the format cannot hold module `m` losslessly (None: it can)."""

    def keeps(self, tensor: str) -> bool:
        """Whether a tensor outside the modules is carried over."""

    def metadata(self, meta: dict[str, str] | None) -> dict[str, str] | None:
        """A shard's __metadata__ as the format keeps it."""

    def entries(self, m: QuantModule) -> list[tuple[str, str, tuple[int, ...], str]]:
        """(tensor name, dtype, shape, role) of module `m` as the format stores it."""

    def tensor(self, role: str, src: Source, m: QuantModule) -> Array | Banded:
        """One of those tensors, from `src` in the one model: an array, or one made a band at
        a time (the large ones a re-layout makes)."""

    def config(self, modules: list[QuantModule], universe: list[str], unquantized: list[str],
               provenance: dict[str, Any]) -> dict[str, Any]:
        """The quantization config that describes these modules (`universe`: every module
        with weights; `unquantized`: those stored in full precision)."""


def module_tensors(src: OneModel, m: QuantModule) -> ModuleTensors:
    """Module `m` of `src` in the one model (see model.py)."""
    return ModuleTensors(src.qweight(m), src.qzeros(m), src.scales(m),
                         DTYPE_KIND[m.scale_dtype], src.g_idx(m), m.bits)


_Exact = TypeVar("_Exact", bound="ExactSource")


class ExactSource(ABC):
    """What the readers of formats that store Z itself share (compressed-tensors, AWQ): the one
    model is how every runtime computes them, nothing is labelled, every zero point is carried
    exactly, and every module found is a valid one. A subclass sets the attributes of Source
    and reads the tensors."""
    labelled = None                         # Z is stored itself
    store: TensorStore
    modules: list[QuantModule]

    def stored_qweight(self, m: QuantModule) -> tuple[Array, bool]:
        return self.qweight(m), False

    def qweight_bands(self, m: QuantModule) -> Banded:
        return bands_of(*self.stored_qweight(m))

    def qweight_columns(self, m: QuantModule, cols: Array) -> Array:
        words, t = self.stored_qweight(m)
        return transposed(np.asarray(words)[cols]) if t else np.asarray(words)[:, cols]

    def qweight_differ(self, m: QuantModule, words: Array, transposed: bool) -> int:
        return words_differ(*self.stored_qweight(m), words, transposed)

    def operands(self, m: QuantModule, gptq_rule: ZeroRule | None = None
                 ) -> tuple[ModuleTensors, ZeroRule]:
        return module_tensors(self, m), ZeroRule.V2

    def zero_words(self, m: QuantModule) -> Array:
        return self.qzeros(m)

    def zeros(self, m: QuantModule, gptq_rule: ZeroRule | None = None
              ) -> tuple[Array, Array]:
        z = unpack(self.zero_words(m), m.bits, axis=1).astype(np.int32)
        return z, np.zeros(z.shape, dtype=bool)

    @property
    def record_count(self) -> int:
        return len(self.modules)

    def records(self) -> list[ModuleRecord]:
        out = []
        for m in self.modules:
            files = sorted({self.store.file_of(t) for t in m.tensors.values()})
            out.append(ModuleRecord(
                m.name, m.bits, m.group_size, m.act_order, m.sym, m.in_features,
                m.out_features, "int32", m.groups, m.scale_dtype, "g_idx" in m.tensors,
                f"{m.name}.bias" in self.store.locations, False, True, files))
        return out

    def quantization(self) -> dict[str, Any]:
        """A value where every module agrees (the configs are read per module)."""
        mods = self.modules
        return {"bits": uniform(mods, "bits"), "group_size": uniform(mods, "group_size"),
                "sym": uniform(mods, "sym"), "desc_act": uniform(mods, "act_order"),
                "pack_dtype": "int32" if mods else None,
                "lm_head": any_lm_head(mods),
                "static_groups": False,
                "mixed": mixed(mods, ("bits", "group_size", "act_order", "sym"))}

    def read_as(self: _Exact, convention: str, allow_lossy: bool = False) -> _Exact:
        return self

    def close(self) -> None:
        self.store.close()

    @abstractmethod
    def qweight(self, m: QuantModule) -> Array: ...

    @abstractmethod
    def qzeros(self, m: QuantModule) -> Array: ...

    @abstractmethod
    def scales(self, m: QuantModule) -> Array: ...

    @abstractmethod
    def g_idx(self, m: QuantModule) -> Array: ...

    @abstractmethod
    def data_findings(self, m: QuantModule, full: bool) -> list[Finding]: ...

    @abstractmethod
    def describe(self) -> str: ...
