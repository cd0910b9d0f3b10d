"""A GPTQ checkpoint: its tensor store, its config, and the quantized modules found in it.

Modules are found from tensor names (`<prefix>.qweight` with `.qzeros`, `.scales`, `.g_idx`,
`.bias`), wherever each tensor sits. Geometry (bits, K, N, groups, word size) is inferred from
shapes alone and then cross-checked with the declared per-module config.
"""
from __future__ import annotations

import itertools
import os
import re
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import numpy as np

from ...bits import layout
from ...bits.conventions import GPTQ, symmetric_pattern, symmetric_pattern_of_bytes
from ...bits.packing import block
from ...findings import Finding
from ...safetensors_io import compiled
from ...safetensors_io.dtypes import DTYPES, PACK_DTYPE_NAMES, WORD_DTYPES, to_float32
from ...safetensors_io.index import SurveyPlan, TensorStore, open_store
from ..model import DTYPE_KIND, PROBE, PROBED, ModuleTensors, is_lm_head
from .config import ModuleConfig, QuantConfig, load_config

ROLES = ("qweight", "qzeros", "scales", "g_idx", "bias")
# qzeros (and g_idx) up to this size are read in the parent, all together: a mixture of
# experts' tens of thousands (9 to 24 KiB each) are read in a fraction of a second; a dense
# 70B's qzeros (up to 900 KiB each, 0.5 GB in all) are left to detection's workers, which map
# them in parallel
SMALL = 128 << 10
# what inspect surveys (TensorStore.start_survey): g_idx first, as modelling asks for them;
# detection the qzeros, then the checks the probes (a pass of their own: detection need not
# wait for them)
SURVEY: SurveyPlan = ([(("g_idx",), ()), (("qzeros",), ()), ((), PROBED)], PROBE, SMALL)
_ROLE = {r: sys.intern(r) for r in ROLES}   # one string a role, not one a module
_PACK_DTYPE = {8: "int8", 16: "int16", 32: "int32", 64: "int64"}   # by word bits
REQUIRED = ("qweight", "qzeros", "scales")
SCALE_DTYPES = ("F16", "BF16", "F32")


@dataclass(slots=True)   # not frozen, as QuantModule (formats/model.py) says why
class Module:
    """A quantized module: its tensors, its declared config and its geometry, complete and
    consistent (inferred from the shapes and g_idx, checked against the config)."""
    name: str
    tensors: dict[str, str]                  # role -> tensor name
    declared: ModuleConfig | None            # None: config excludes it (dynamic "-:")
    bits: int
    word_bits: int
    in_features: int
    out_features: int
    groups: int
    group_size: int                          # -1: one group over all of K
    act_order: bool                          # non-trivial g_idx
    scale_dtype: str
    valid: Literal[True] = True

    @property
    def pack_dtype(self) -> str:
        # asked of every module by every runtime's rules: a lookup, not a new str
        return _PACK_DTYPE.get(self.word_bits) or f"int{self.word_bits}"


@dataclass(slots=True)   # not frozen, as Module
class InvalidModule:
    """Tensors named like a quantized module that do not form one (a finding says why): the
    geometry as far as it was consistent, None from the first inconsistency on."""
    name: str
    tensors: dict[str, str]
    declared: ModuleConfig | None
    bits: int | None = None
    word_bits: int | None = None
    in_features: int | None = None
    out_features: int | None = None
    groups: int | None = None
    group_size: int | None = None
    act_order: bool | None = None
    scale_dtype: str | None = None
    valid: Literal[False] = False

    @property
    def pack_dtype(self) -> str | None:
        return f"int{self.word_bits}" if self.word_bits else None


@dataclass
class Checkpoint:
    path: Path
    store: TensorStore
    config: QuantConfig | None
    modules: list[Module | InvalidModule]    # in natural order of their names
    other_tensors: list[str]
    findings: list[Finding] = field(default_factory=list)

    def __post_init__(self) -> None:
        # asked of tens of thousands of modules by every pass: built once (modules is not
        # changed after the checkpoint is modelled)
        self._valid: list[Module] = [m for m in self.modules if m.valid]
        self._by_name = {m.name: m for m in self._valid}
        self._patterns: dict[str, str | None] = {}

    @property
    def label(self) -> str:
        """The convention runtimes read from its configs: checkpoint_format exactly, as vLLM
        and ExLlamaV2 read it; missing means gptq (where transformers and GPTQModel read
        `format` instead, GQ209 and GQ212 say so)."""
        return self.config.runtime_convention if self.config else GPTQ

    def view(self, tensor: str, part: list[tuple[int, int]] | None = None) -> np.ndarray:
        """The tensor's array; `part`: the byte ranges of it that will be read (TensorStore)."""
        return self.store.view(tensor, part)

    @property
    def valid_modules(self) -> list[Module]:
        """The modules whose tensors form a quantized module, in order (one list, not to be
        changed by a caller)."""
        return self._valid

    def module(self, name: str) -> Module:
        """The valid module of that name."""
        return self._by_name[name]

    def g_idx(self, m: Module) -> np.ndarray:
        """Module `m`'s g_idx (int64), k // group_size where the file has none."""
        if "g_idx" in m.tensors:
            return np.asarray(self.view(m.tensors["g_idx"]), dtype=np.int64)
        return layout.trivial_g_idx(m.in_features, m.group_size)

    def stored_fields(self, m: Module) -> np.ndarray:
        """Module `m`'s stored zero-point fields [G, N] (uint8), in whatever convention; the
        pages of qzeros are dropped after (modules are read one after another)."""
        qz = m.tensors["qzeros"]
        try:
            return layout.stored_fields(self.view(qz), m.bits)
        finally:
            self.store.release([qz])

    def symmetric_pattern(self, m: Module, release: bool = False) -> str | None:
        """The convention whose symmetric zero is every stored field of `m`, else None
        (conventions.symmetric_pattern), kept per module: the source (sym, for writers) and
        detection both ask, and a whole pass over qzeros answers with one word. `release`:
        drop the pages of qzeros where it was read here (a caller that reads nothing more of
        the module; detection goes on to read its fields)."""
        if m.name not in self._patterns:
            try:
                self._patterns[m.name] = symmetric_pattern(self.view(m.tensors["qzeros"]),
                                                           m.bits)
            finally:
                if release:   # read once, kept: its pages are not needed again
                    self.store.release([m.tensors["qzeros"]])
        return self._patterns[m.name]

    def small_patterns(self, mods: list[Module], most: int) -> dict[int, str | None]:
        """symmetric_pattern of those of `mods` whose qzeros hold at most `most` bytes, by
        index in `mods`: the ones not yet read read together, each file opened once and
        nothing mapped (TensorStore.heads), so that tens of thousands of small tensors cost a
        read each, not a page fault and a release. Larger ones are left to whoever reads the
        module (copied here, they would cost more than mapped)."""
        infos, patterns = self.store.infos, self._patterns
        small: list[int] = []
        todo: dict[str, Module] = {}
        for i, m in enumerate(mods):   # one pass: a mixture of experts has tens of thousands
            qz = m.tensors["qzeros"]
            if (info := infos[qz]).end - info.begin <= most:
                small.append(i)
                if m.name not in patterns:
                    todo[qz] = m
        for raw, ts in self.store.heads_grouped(todo):
            info = self.store.info(ts[0])   # tensors alike share their dtype and shape
            found: dict[int, str | None] = {}   # by bits
            for t in ts:
                m = todo[t]
                if m.bits not in found:
                    found[m.bits] = symmetric_pattern_of_bytes(
                        raw, DTYPES[info.dtype].numpy.str, info.shape, m.bits)
                self._patterns[m.name] = found[m.bits]
        return {i: patterns[mods[i].name] for i in small}

    def keep_patterns(self, patterns: dict[str, str | None]) -> None:
        """Symmetric patterns read elsewhere (detection's worker processes), kept so that
        symmetric_pattern does not read those qzeros again."""
        self._patterns.update(patterns)

    def module_tensors(self, m: Module) -> ModuleTensors:
        """Module `m` as the backends compute on it: the file's own tensors, mapped (not
        read), whatever their word size."""
        sc = m.tensors["scales"]
        return ModuleTensors(self.view(m.tensors["qweight"]), self.view(m.tensors["qzeros"]),
                             self.view(sc), DTYPE_KIND[m.scale_dtype],
                             self.g_idx(m).astype(np.int32), m.bits)

    @cached_property   # asked of every module's verdict
    def quantizer(self) -> str | None:
        """The quantizer that wrote it, as its config's meta.quantizer names it (GPTQModel's
        entry where it lists several)."""
        q = (self.config.meta or {}).get("quantizer") if self.config else None
        items = [q] if isinstance(q, str) else (q if isinstance(q, list) else [])
        return next((i for i in items if isinstance(i, str) and
                     i.lower().startswith("gptqmodel:")),
                    items[0] if items and isinstance(items[0], str) else None)

    def float32(self, tensor: str) -> np.ndarray:
        """A float tensor (scales, bias) widened to float32 whatever its dtype."""
        return to_float32(self.view(tensor), self.store.info(tensor).dtype)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_checkpoint(path: str | os.PathLike[str], store: TensorStore | None = None,
                    survey: bool = False) -> Checkpoint:
    """Open and model a checkpoint (headers, configs, g_idx; no qweight data is read); `store`:
    its tensor store when already open (the one open, formats/open.py, sniffed it). `survey`:
    for a caller about to read every g_idx and small qzeros and probe every qweight and scales
    (inspect), those reads start now on a second thread (TensorStore.start_survey)."""
    store = store or open_store(path, SURVEY if survey else None)
    if survey:
        store.start_survey(*SURVEY)   # where the store was opened without it
    findings = list(store.findings)
    first = next(iter(store.files.values()))
    config, cfg_findings = load_config(store.root, first.metadata)
    findings += cfg_findings
    found, others, kinds = _group(store, config)
    g_idx_written = config.g_idx_written if config else True
    # what _infer reads, fetched together where the store is remote (nothing locally)
    store.prefetch((m.tensors["g_idx"], None) for m in found if "g_idx" in m.tensors)
    modules = _infer_all(found, store, findings, g_idx_written, kinds)
    for m in modules:
        if m.declared is None and m.valid:
            findings.append(Finding("GQ313", "config's dynamic rules leave this module "
                                    "unquantized, but it has quantized tensors",
                                    file=store.file_of(m.tensors["qweight"]),
                                    tensor=m.tensors["qweight"]))
    if not modules:
        findings.append(Finding("GQ314", "no tensor named <module>.qweight: not a GPTQ "
                                "checkpoint, or its quantized tensors are missing"))
    findings.sort(key=Finding.sort_key)
    return Checkpoint(store.root if Path(path).is_dir() else Path(path), store, config, modules,
                      others, findings)


_DIGITS = re.compile(r"(\d+)")


def natural_key(name: str) -> list[str | int]:
    """Sort key that puts layers.2 before layers.10: the name split at its runs of digits,
    text and numbers alternating from text (so two keys compare str with str and int with
    int), each run as its number.

    >>> natural_key("layers.10.mlp")
    ['layers.', 10, '.mlp']
    """
    parts: list[str | int] = list(_DIGITS.split(name))
    parts[1::2] = map(int, parts[1::2])
    return parts


def natural_sorted(names: Iterable[str]) -> list[str]:
    """sorted(names, key=natural_key), in one compiled pass where the install built it (a
    mixture of experts names tens of thousands of modules, and the key costs microseconds a
    name)."""
    names = list(names)
    ordered = compiled.natural_order(names)
    return ordered if ordered is not None else sorted(names, key=natural_key)


def _group(store: TensorStore, config: QuantConfig | None
           ) -> tuple[list[InvalidModule], list[str], dict[str, int] | None]:
    """Each group of tensors named like a module (its geometry not yet known), the tensors
    outside them, and where the compiled grouping found them, the modules' kinds: a number
    shared by the modules alike in _kind's first part (None: _infer_all takes each
    module's)."""
    readable = store.locations
    # a module in a shard that cannot be read is still one of the checkpoint's (invalid, and
    # said once, at its shard); the header entries, in the order of `locations`, carry the
    # dtypes and shapes of the kinds
    grouped = compiled.group_roles([*store.infos.values(), *store.unreadable], ROLES)
    kinds: dict[str, int] | None = None
    if grouped is not None:
        parts, rest, kinds = grouped
        others = [t for t in rest if t in readable]
    else:
        parts, others = {}, []
        for t in itertools.chain(readable, store.unreadable):
            prefix, _, role = t.rpartition(".")
            r = _ROLE.get(role)
            if r is not None and prefix:
                roles = parts.get(prefix)
                if roles is None:
                    roles = parts[prefix] = {}
                roles[r] = t
            elif t in readable:
                others.append(t)
    modules: list[InvalidModule] = []
    for prefix in natural_sorted(parts):
        roles = parts[prefix]
        if "qweight" not in roles and "qzeros" not in roles:
            others += [t for t in roles.values() if t in readable]  # e.g. a plain Linear's .bias
            continue
        declared = config.for_module(prefix) if config else ModuleConfig()
        modules.append(InvalidModule(prefix, roles, declared))
    return modules, sorted(others), kinds


def _infer_all(found: list[InvalidModule], store: TensorStore, findings: list[Finding],
               g_idx_written: bool, kinds: dict[str, int] | None = None
               ) -> list[Module | InvalidModule]:
    """_infer of each module of `found`, in order, taken once for modules alike in their
    tensors' dtypes and shapes and their declared config (a mixture of experts has tens of
    thousands): a module like one _infer found valid, with no finding and no act-order, gets
    that one's geometry where its g_idx holds the same bytes (the only data _infer reads), with
    no step of _infer taken again; any other module goes through _infer.

    Two passes: modules are inferred in order until one of their kind can be shared; then the
    g_idx of the rest of that kind are read together, each file opened once
    (TensorStore.heads), and compared as bytes. `kinds`: _group's numbers for _kind's first
    part, where it found them (a module of a shard that cannot be read has none)."""
    out: list[Module | InvalidModule | None] = [None] * len(found)
    # key -> (the first module, its g_idx bytes; None: it has none), where it can be shared
    alike: dict[tuple[Any, ...], tuple[Module, bytes | None]] = {}
    # (index, the first module and its g_idx bytes) of modules like a first one
    later: list[tuple[int, tuple[Module, bytes | None]]] = []
    for i, m in enumerate(found):
        # hashed once: a declared config hashes slowly
        if kinds is None:
            key = _kind(m, store, g_idx_written)
        else:
            kind = kinds.get(m.name)
            key = None if kind is None else (kind, m.declared, g_idx_written)
        shared = alike.get(key) if key is not None else None
        if shared is not None:
            later.append((i, shared))
            continue
        before = len(findings)
        out[i] = mod = _infer(m, store, findings, g_idx_written)
        if key is not None and isinstance(mod, Module) and not mod.act_order and \
                len(findings) == before:
            # not act-order: g_idx is the trivial one of its group size, exactly
            g = m.tensors.get("g_idx")
            alike[key] = (mod, None if g is None else layout.trivial_g_idx(
                mod.in_features, mod.group_size).astype(
                    DTYPES[store.info(g).dtype].numpy).tobytes())
    with_g_idx = {found[i].tensors["g_idx"]: g_idx for i, (_, g_idx) in later
                  if g_idx is not None}
    same: set[str] = set()
    for raw, ts in store.heads_grouped(with_g_idx):
        equal: dict[int, bool] = {}   # alike tensors share their kind's expected bytes
        for t in ts:
            expected = with_g_idx[t]
            ok = equal.get(id(expected))
            if ok is None:
                ok = equal[id(expected)] = raw == expected
            if ok:
                same.add(t)
    for i, (first, g_idx) in later:
        m = found[i]
        if g_idx is None or m.tensors["g_idx"] in same:
            out[i] = Module(m.name, m.tensors, m.declared, first.bits, first.word_bits,
                            first.in_features, first.out_features, first.groups,
                            first.group_size, False, first.scale_dtype)
        else:
            out[i] = _infer(m, store, findings, g_idx_written)
    return [mod for mod in out if mod is not None]


def _kind(m: InvalidModule, store: TensorStore, g_idx_written: bool) -> tuple[Any, ...] | None:
    """What modules alike for _infer_all share: their tensors' roles (in the order their
    header lists them: alike modules' headers list them alike), dtypes and shapes, their
    declared config; None for a module with a tensor in a shard that cannot be read."""
    if store.unreadable and any(t in store.unreadable for t in m.tensors.values()):
        return None
    infos = store.infos   # asked four times a module: a lookup, not a call
    return (tuple([(r, (i := infos[t]).dtype, i.shape) for r, t in m.tensors.items()]),
            m.declared, g_idx_written)


def _infer(m: InvalidModule, store: TensorStore, findings: list[Finding],
           g_idx_written: bool = True) -> Module | InvalidModule:
    """`m` with its geometry from the tensors' headers (and g_idx), as far as it is consistent:
    a Module when all of it is, else an InvalidModule; each inconsistency is a finding.
    `g_idx_written`: whether the producer writes g_idx (QuantConfig.g_idx_written): where it
    does not, a missing one is no GQ308."""
    geo: dict[str, Any] = {}  # what is known so far; an early return keeps it
    def add(code: str, message: str, role: str = "qweight", hint: str | None = None) -> None:
        t = m.tensors.get(role) or f"{m.name}.{role}"
        home = next(iter(m.tensors.values()))  # a missing tensor is reported beside its module
        findings.append(Finding(code, message, file=store.locations.get(t, store.file_of(home)),
                                tensor=t, hint=hint))

    if any(t in store.unreadable for t in m.tensors.values()):
        return m   # its shard's finding is the cause; nothing here can be judged
    missing = [r for r in REQUIRED if r not in m.tensors]
    if missing:
        add("GQ301", f"module {m.name} has no {', '.join(missing)}", missing[0],
            hint="every quantized module needs qweight, qzeros and scales")
        return replace(m, **geo)
    info = {r: store.info(t) for r, t in m.tensors.items()}
    qw, qz, sc = info["qweight"], info["qzeros"], info["scales"]
    for role, i in (("qweight", qw), ("qzeros", qz)):
        if i.dtype not in WORD_DTYPES:
            add("GQ302", f"dtype {i.dtype}; packed words must be I32 (or I8/I16/I64)", role)
            return replace(m, **geo)
    if qz.dtype != qw.dtype:
        add("GQ302", f"dtype {qz.dtype}; expected {qw.dtype} like qweight", "qzeros")
        return replace(m, **geo)
    if sc.dtype not in SCALE_DTYPES:
        add("GQ302", f"dtype {sc.dtype}; scales must be F16, BF16 or F32", "scales")
        return replace(m, **geo)
    for role, ndim in (("qweight", 2), ("qzeros", 2), ("scales", 2), ("g_idx", 1), ("bias", 1)):
        if role in info and len(info[role].shape) != ndim:
            add("GQ303", f"shape {list(info[role].shape)}: expected {ndim} dimensions", role)
            return replace(m, **geo)
    if "bias" in info and info["bias"].dtype not in SCALE_DTYPES:
        add("GQ302", f"dtype {info['bias'].dtype}; bias must be F16, BF16 or F32", "bias")
        return replace(m, **geo)
    if "g_idx" in info and info["g_idx"].dtype not in ("I32", "I64"):
        add("GQ302", f"dtype {info['g_idx'].dtype}; g_idx must be I32", "g_idx")
        return replace(m, **geo)
    w = WORD_DTYPES[qw.dtype]
    n = qw.shape[1]
    groups = sc.shape[0]
    geo.update(word_bits=w, out_features=n, groups=groups, scale_dtype=sc.dtype)
    if sc.shape[1] != n:
        add("GQ303", f"shape {list(sc.shape)}: expected {n} columns like qweight {list(qw.shape)}",
            "scales")
        return replace(m, **geo)
    bits = layout.bits_from_qzeros(qz.shape[1], n, w)
    if bits is None:
        add("GQ303", f"shape {list(qz.shape)}: {qz.shape[1]} words of int{w} for "
            f"out_features={n} give no bit width in (2, 3, 4, 8)", "qzeros")
        return replace(m, **geo)
    geo["bits"] = bits
    if bits == 3 and w != 32:
        add("GQ310", f"3-bit packed into int{w} words; GPTQ's 3-bit layout exists only for int32")
        return replace(m, **geo)
    if qz.shape[0] != groups:
        add("GQ303", f"shape {list(qz.shape)}: expected {groups} rows like scales "
            f"{list(sc.shape)}", "qzeros")
        return replace(m, **geo)
    if (qw.shape[0] * w) % bits or qw.shape[0] % block(bits, w)[1]:
        add("GQ303", f"shape {list(qw.shape)}: {qw.shape[0]} rows of int{w} do not hold whole "
            f"{bits}-bit values")
        return replace(m, **geo)
    k = qw.shape[0] * w // bits
    if k == 0 or n == 0 or groups == 0 or groups > k:
        add("GQ303", f"in_features={k}, out_features={n}, {groups} groups: a quantized module "
            "needs at least one input channel per group and one output channel", "scales")
        return replace(m, **geo)
    if "g_idx" in info and info["g_idx"].shape[0] != k:
        add("GQ303", f"length {info['g_idx'].shape[0]}: qweight {list(qw.shape)} holds "
            f"{k} input channels at bits={bits}, int{w}", "g_idx")
        return replace(m, **geo)
    geo["in_features"] = k
    if "bias" in info and info["bias"].shape != (n,):
        add("GQ303", f"shape {list(info['bias'].shape)}: expected [{n}]", "bias")
        return replace(m, **geo)
    if k % 32 or n % 32:
        add("GQ312", f"in_features={k}, out_features={n}: GPTQ writers need multiples of 32")
    decl = m.declared or ModuleConfig()
    if "g_idx" in m.tensors:
        g_idx = store.view(m.tensors["g_idx"])
        # nearly every g_idx is arange(K) // group_size, with group_size what the groups say:
        # then that is the group size, with no act-order (group_size_from_g_idx's answer, at
        # one comparison; a mixture of experts has tens of thousands)
        even = -1 if groups == 1 else -(-k // groups)
        gs: int | None
        if layout.n_groups(k, even) == groups and \
                np.array_equal(g_idx, layout.trivial_g_idx(k, even)):
            gs, why = even, None
            geo["act_order"] = False
        else:
            gs, why = layout.group_size_from_g_idx(g_idx, groups)
        if gs is not None and "act_order" not in geo:
            geo["act_order"] = not np.array_equal(g_idx, layout.trivial_g_idx(k, gs))
        # modules are read one after another: their pages are dropped, so that resident
        # memory stays one module's, whatever the module count
        store.release([m.tensors["g_idx"]])
        if gs is None:
            add("GQ309", why or "", "g_idx")
            return replace(m, **geo)
    else:
        if g_idx_written:
            add("GQ308", "no g_idx: runtimes assume no act-order", "g_idx",
                hint="AutoAWQ checkpoints have none; GPTQ exporters always write it")
        gs = decl.group_size if decl.group_size and layout.n_groups(k, decl.group_size) == groups \
            else (-1 if groups == 1 else (k // groups if k % groups == 0 else None))
        geo["act_order"] = False
        if gs is None:
            add("GQ303", f"{groups} groups for in_features={k} fit no group size", "scales")
            return replace(m, **geo)
    if layout.n_groups(k, gs) != groups:
        add("GQ303", f"{groups} groups for in_features={k} fit no group size", "scales")
        return replace(m, **geo)
    valid = Module(m.name, m.tensors, m.declared, bits, w, k, n, groups, gs, geo["act_order"],
                   sc.dtype)
    _cross_check(valid, decl, add)
    return valid


def _cross_check(m: Module, decl: ModuleConfig, add: Callable[..., None]) -> None:
    if decl.bits is not None and decl.bits != m.bits:
        add("GQ304", f"config says bits={decl.bits}; shapes give bits={m.bits}", "qzeros")
    if decl.group_size is not None and m.group_size is not None:
        same = layout.n_groups(m.in_features, decl.group_size) == m.groups and (
            m.groups == 1 or decl.group_size == m.group_size)
        if not same:
            add("GQ305", f"config says group_size={decl.group_size}; shapes and g_idx give "
                f"{m.group_size} ({m.groups} groups over {m.in_features} input channels)", "scales")
    if decl.desc_act is False and m.act_order:
        add("GQ306", "g_idx is non-trivial (act-order) but config says desc_act=false; vLLM "
            "then ignores g_idx and decodes wrong weights", "g_idx")
    if decl.pack_dtype is not None and decl.pack_dtype != m.pack_dtype:
        add("GQ307", f"config says pack_dtype={decl.pack_dtype}; words are "
            f"{PACK_DTYPE_NAMES.get(f'I{m.word_bits}')}")
    if is_lm_head(m.name):
        add("GQ311", "the lm_head is quantized; vLLM, TGI and ExLlamaV2 may refuse it")
