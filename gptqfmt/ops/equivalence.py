"""`verify SRC --against DST` and `verify PATH --reference fp32`.

--against: module by module, Y = X @ W from SRC as runtimes compute it against Y from DST as
runtimes compute it (each side read the way its label means it, so a mislabelled side computes
what runtimes compute), the effective zero points cell by cell and g_idx; bitwise equality
where the conversion was exact, otherwise the largest absolute and relative errors, how many
zero-point cells differ, and which runtimes' readings differ. When both sides store labelled
zero points (GPTQ), once per group of runtimes (their zero rules differ for gptq files); when
either stores Z itself, once for every runtime, in the one model.

--reference fp32: Y of a checkpoint under every way some runtime reads its zero points (the
label as each kernel path reads it, a stored maxq as each reads it, the packed-constant words)
against an fp32 dequant with the zero points the data mean (their convention; a stored maxq as
its codes say). Each reading is named with its runtimes and its formula, so the answer agrees
with verify's runtimes section; a mismatch is a one-step zero offset (a label read wrong),
zero points misread (a stored maxq, or words a packed constant carries through), inf/NaN
(fp16 overflow), or random corruption (zero points the detector finds inconsistent with both
conventions, or a known writer bug).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..bits.conventions import ZeroRule
from ..bits.packing import unpack
from ..detection.decide import AMBIGUOUS, ModuleVerdict
from ..detection.read import detect_checkpoint
from ..errors import UsageError
from ..formats import Source, open_source
from ..formats.gptq.checkpoint import Checkpoint
from ..formats.model import F16, F32, QuantModule, outside_words
from ..formats.open import open_labelled
from ..numerics import get_backend
from ..numerics.backend import sample_columns
from ..numerics.cpu import dequant_fields
from ..runtimes.groups import groups as runtime_groups
from ..runtimes.groups import label_readings, named
from ..runtimes.readings import Reading, read_zeros, truth_zeros
from ..safetensors_io.dtypes import FP16_MAX, to_float32
from .differences import (
    SIDES,
    config_differences,
    field_differences,
    scheme_differences,
    tensor_differences,
)

ROWS = 4          # rows of the random input X
COLUMNS = 64      # output columns sampled per module (a contiguous block; all when fewer)
ACROSS = "every runtime"  # the one reading when a side stores Z itself


@dataclass
class ModuleEquivalence:
    name: str
    equal: bool
    max_abs: float = 0.0
    max_rel: float = 0.0
    cells_differ: dict[str, int] = field(default_factory=dict)   # per runtime group
    runtimes_differ: list[str] = field(default_factory=list)
    # what differs, one phrase each, SRC's side first ("bits 4 vs 8", "only in DST")
    differences: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "note": "; ".join(self.differences)}


@dataclass(frozen=True)
class Difference:
    """A tensor outside the modules, or a config entry, that differs."""
    where: str
    what: str

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class EquivalenceReport:
    src: str
    dst: str
    backend: str
    src_convention: str
    dst_convention: str
    columns: int
    modules: list[ModuleEquivalence]
    tensors: list[Difference] = field(default_factory=list)
    configs: list[Difference] = field(default_factory=list)
    tensors_compared: int = 0       # tensors outside the modules that both sides have
    tensors_identical: int = 0
    bytes_compared: int = 0

    @property
    def equivalent(self) -> bool:
        return all(m.equal for m in self.modules) and not self.tensors and not self.configs

    def to_json(self) -> dict[str, Any]:
        return {"status": "ok" if self.equivalent else "fail", "mode": "against",
                "src": self.src, "dst": self.dst, "backend": self.backend,
                "src_convention": self.src_convention, "dst_convention": self.dst_convention,
                "columns_per_module": self.columns, "findings": [],
                "modules": [m.to_json() for m in self.modules],
                "tensors": [d.to_json() for d in self.tensors],
                "configs": [d.to_json() for d in self.configs],
                "summary": {"modules": len(self.modules),
                            "equal": sum(m.equal for m in self.modules),
                            "differ": sum(not m.equal for m in self.modules),
                            "tensors": self.tensors_compared,
                            "tensors_differ": len(self.tensors),
                            "bytes_compared": self.bytes_compared,
                            "configs_differ": len(self.configs)}}


def _columns(n: int, rng: np.random.Generator) -> np.ndarray:
    return sample_columns(n, COLUMNS, rng, align=32)


def compare(src: str | os.PathLike[str], dst: str | os.PathLike[str], backend: str = "auto",
            seed: int = 0) -> EquivalenceReport:
    """See the module docstring. The two are compared as wholes, alike in either order: every
    module either side has (one only one side has, or has valid, differs), every tensor
    outside the modules byte for byte, and the configs as far as they change what a runtime
    computes."""
    be = get_backend(backend)
    a = open_source(src)
    try:
        b = open_source(dst)
    except BaseException:
        a.close()
        raise
    try:
        # (reading's name, the rule a runtime group applies to gptq fields; None: the
        # source's own reading, Z as stored or its reference)
        readings: list[tuple[str, ZeroRule | None]] = \
            [(g.name, g.gptq) for g in runtime_groups()] \
            if a.labelled is not None and b.labelled is not None else [(ACROSS, None)]
        rng = np.random.default_rng(seed)
        out = [_module(a, b, name, ma, mb, readings, be, rng)
               for name, ma, mb in _paired(a, b)]
        tensors, n_tensors, n_same, n_bytes = tensor_differences(a, b)
        configs = config_differences(a, b)
    finally:
        a.close()
        b.close()
    return EquivalenceReport(str(src), str(dst), be.name, a.format, b.format, COLUMNS, out,
                             [Difference(*d) for d in tensors], [Difference(*d) for d in configs],
                             n_tensors, n_same, n_bytes)


def _paired(a: Source, b: Source) -> list[tuple[str, QuantModule | str, QuantModule | str]]:
    """Every module either side has, in SRC's order then DST's, with each side's one-model
    form, or why it has none ("missing", "invalid")."""
    def side(src: Source) -> dict[str, QuantModule | str]:
        valid = {m.name: m for m in src.modules}
        return {r.name: valid.get(r.name, "invalid") for r in src.records()}
    sa, sb = side(a), side(b)
    names = list(sa) + [n for n in sb if n not in sa]
    return [(n, sa.get(n, "missing"), sb.get(n, "missing")) for n in names]


def _module(a: Source, b: Source, name: str, m: QuantModule | str, mb: QuantModule | str,
            readings: list[tuple[str, ZeroRule | None]], be: Any,
            rng: np.random.Generator) -> ModuleEquivalence:
    if isinstance(m, str) or isinstance(mb, str):
        if m == "missing" or mb == "missing":
            return ModuleEquivalence(name, False, differences=[
                f"only in {SIDES[m == 'missing']}"])
        bad = [s for s, x in zip(SIDES, (m, mb)) if isinstance(x, str)]
        return ModuleEquivalence(name, False, differences=[
            f"invalid in {' and '.join(bad)}: its tensors do not form a module (see "
            "`gptqfmt verify`)"])
    scheme = scheme_differences(m, mb)
    if scheme:
        return ModuleEquivalence(name, False, differences=scheme)
    outside = outside_words(m) if readings[0][1] is None else None
    if outside:   # no form in the one model the comparison computes on
        return ModuleEquivalence(name, False, differences=[f"not compared: {outside}"])
    cols = _columns(m.out_features, rng)
    x = rng.standard_normal((ROWS, m.in_features)).astype(np.float32)
    res = ModuleEquivalence(name, True)
    try:
        res.differences = field_differences(a, m, b, mb)
        res.equal = not res.differences
        for label, gptq_rule in readings:
            (ta, ra), (tb, rb) = a.operands(m, gptq_rule), b.operands(mb, gptq_rule)
            res.cells_differ[label] = int(np.count_nonzero(
                a.zeros(m, gptq_rule)[0] != b.zeros(mb, gptq_rule)[0]))
            ya, yb = be.gemm(x, F32, ta, ra, cols), be.gemm(x, F32, tb, rb, cols)
            if not np.array_equal(ya, yb) or res.cells_differ[label] or res.differences:
                res.equal = False
                res.runtimes_differ.append(label)
                err = np.abs(yb - ya)
                res.max_abs = max(res.max_abs, float(np.nanmax(err)))
                res.max_rel = max(res.max_rel, float(np.linalg.norm(yb - ya) /
                                                     (np.linalg.norm(ya) or 1.0)))
        cells = {n: c for n, c in res.cells_differ.items() if c}
        if cells:
            res.differences.append("zero points: " + ", ".join(
                f"{c} of {m.groups * m.out_features} cells differ for {n}"
                for n, c in cells.items()))
        if not res.equal and not res.differences:
            res.differences.append("Y = X @ W differs")
    finally:
        a.store.release(m.tensors.values())
        b.store.release(mb.tensors.values())
    return res


@dataclass(frozen=True)
class ReadingDiagnosis:
    """One way runtimes read a module's zero points, against the data's own."""
    runtimes: tuple[str, ...]   # the kernel paths that read it so ("vLLM (legacy) gptq_gemm")
    formula: str                # how they compute Z from a stored field s
    reads_label: bool           # False: the paths read another convention than the label
    verdict: str                # consistent | one-step zero offset | zero points misread | inf/nan
    cells: int                  # zero-point cells read otherwise than the data mean them
    max_abs: float

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "runtimes": list(self.runtimes)}


@dataclass(frozen=True)
class ModuleDiagnosis:
    name: str
    verdict: str   # the worst of its readings, or random corruption, or invalid
    max_abs: float
    detail: str = ""
    readings: tuple[ReadingDiagnosis, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {**self.__dict__, "readings": [r.to_json() for r in self.readings]}


# the verdicts from worst to best (a module's is its worst reading's)
SEVERITY = ("invalid", "inf/nan", "random corruption", "one-step zero offset",
            "zero points misread", "consistent")


@dataclass(frozen=True)
class ReferenceReport:
    """What every runtime reading computes from one checkpoint against an fp32 dequant with
    the zero points its data mean, module by module."""
    declared: str     # the label runtimes read
    detected: str     # what the data are
    modules: list[ModuleDiagnosis]
    backend: str

    @property
    def inconsistent(self) -> list[ModuleDiagnosis]:
        return [d for d in self.modules if d.verdict != "consistent"]

    def to_json(self) -> dict[str, Any]:
        return {"status": "fail" if self.inconsistent else "ok", "mode": "reference",
                "findings": [], "backend": self.backend, "declared": self.declared,
                "detected": self.detected, "modules": [d.to_json() for d in self.modules]}


def reference_fp32(path: str | os.PathLike[str], backend: str = "auto",
                   seed: int = 0) -> ReferenceReport:
    """The checkpoint's ReferenceReport. For each module, Y = X @ W with fp16 X under every
    way some runtime reads its zero points (runtimes.groups.label_readings: the label as each
    path reads it, a stored maxq as each kernel reads it, words as the packed-constant kernels
    add them) against an fp32 dequant with the zero points the data mean (their convention,
    a stored maxq as its codes say: readings.truth_zeros). So a module is consistent exactly
    where every runtime reading gives the data's zero points, which is what the runtimes
    section of verify says per runtime. Invalid modules are diagnosed as such."""
    be = get_backend(backend)
    src, ck = open_labelled(path)
    try:
        declared = ck.label
        det = detect_checkpoint(ck, full=True)
        detected = det.verdict if det.verdict != AMBIGUOUS else declared
        rng = np.random.default_rng(seed)
        verdicts = {v.name: v for v in det.modules}
        valid = {m.name: m for m in src.modules}
        out = []
        for r in src.records():
            m = valid.get(r.name)
            if m is None:
                out.append(ModuleDiagnosis(r.name, "invalid", 0.0, "its tensors do not form a "
                                           "module (see `gptqfmt verify`)"))
                continue
            out.append(_diagnose(src, ck, m, verdicts[m.name], declared, detected, be, rng))
            src.store.release(m.tensors.values())
    finally:
        src.close()
    return ReferenceReport(declared, detected, out, be.name)


def _diagnose(src: Source, ck: Checkpoint, m: QuantModule, verdict: ModuleVerdict,
              declared: str, detected: str, be: Any, rng: np.random.Generator
              ) -> ModuleDiagnosis:
    cols = _columns(m.out_features, rng)
    x16 = rng.standard_normal((ROWS, m.in_features)).astype(np.float32).astype(np.float16)
    t, _ = src.operands(m)
    words = np.asarray(t.qzeros)
    stored = unpack(words, m.bits, axis=1)
    high = verdict.stats.consistent_at if verdict.stats is not None else ()
    truth = truth_zeros(stored, m.bits, detected, high)
    q = unpack(np.ascontiguousarray(np.asarray(t.qweight)[:, cols]), m.bits, axis=0)
    s32 = to_float32(np.asarray(ck.view(m.tensors["scales"]))[:, cols], m.scale_dtype)
    g_idx = np.asarray(t.g_idx)
    x64 = x16.astype(np.float64)
    y_ref = x64 @ dequant_fields(q, truth[:, cols], s32, g_idx).astype(np.float64)
    tol = 1e-3 * (np.abs(y_ref).max(initial=0) + 1)
    readings: list[ReadingDiagnosis] = []
    for who, rd in label_readings(declared, m.bits, m.sym):
        z = read_zeros(words, m.bits, rd)
        if rd.rule is not None:   # the kernel's own arithmetic
            y = be.gemm(x16.view(np.uint16), F16, t, rd.rule, cols).astype(np.float64)
        else:                     # packed-word readings: their zero points, the same formula
            y = x64 @ dequant_fields(q, z[:, cols], s32, g_idx).astype(np.float64)
        readings.append(_reading(who, rd, rd.convention in (None, declared), z - truth, y,
                                 y_ref, tol))
    # the module's verdict: the readings of the paths that read its label; a path that reads
    # another convention misreads any label, which the runtimes section says of the runtime
    judged = [r for r in readings if r.reads_label]
    worst = min(judged, key=lambda r: SEVERITY.index(r.verdict)).verdict if judged \
        else "consistent"
    max_abs = max((r.max_abs for r in judged), default=0.0)
    detail = "; ".join(
        ("" if r.reads_label else "ignoring the label, ") + f"{named(r.runtimes)} "
        f"({r.formula}): {r.verdict}" + (f" in {r.cells} of {truth.size} cells" if r.cells
                                         else "")
        for r in sorted(readings, key=lambda r: not r.reads_label) if r.verdict != "consistent")
    if worst != "inf/nan" and (verdict.inconsistent or verdict.signatures):
        why = ", ".join(verdict.signatures) or "; ".join(verdict.evidence[-2:])
        return ModuleDiagnosis(m.name, "random corruption", max_abs, "the zero points follow "
                               f"no convention and no common offset: {why}", tuple(readings))
    return ModuleDiagnosis(m.name, worst, max_abs, detail, tuple(readings))


def _reading(who: tuple[str, ...], rd: Reading, reads_label: bool, dz: np.ndarray,
             y: np.ndarray, y_ref: np.ndarray, tol: float) -> ReadingDiagnosis:
    """One reading's verdict: its zero points against the data's (dz per cell), its outputs
    against the reference."""
    formula = rd.formula if rd.formula.startswith("Z") else f"Z = {rd.formula}"
    cells = int(np.count_nonzero(dz))
    if not np.isfinite(y).all() or np.abs(y).max(initial=0) > FP16_MAX:
        return ReadingDiagnosis(who, formula, reads_label, "inf/nan", cells, float("inf"))
    worst = float(np.abs(y - y_ref).max(initial=0))
    if not cells:
        return ReadingDiagnosis(who, formula, reads_label, "consistent" if worst <= tol else
                                "zero points misread", 0, worst)
    # the label read wrong: most cells one step off the same way
    for step in (1, -1):
        if np.count_nonzero(dz == step) * 2 > dz.size:
            return ReadingDiagnosis(who, formula, reads_label, "one-step zero offset", cells,
                                    worst)
    return ReadingDiagnosis(who, formula, reads_label, "zero points misread", cells, worst)


def check_usage(against: str | None, reference: str | None) -> None:
    if against and reference:
        raise UsageError("--against and --reference are separate modes; give one")
