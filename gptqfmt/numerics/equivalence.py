"""`verify SRC --against DST` and `verify PATH --reference fp32`.

--against: module by module, Y = X @ W from SRC under its convention against Y from DST under
its convention (the label runtimes read: a mislabelled side computes what runtimes compute), for
each group of runtimes (their zero rules differ for gptq files). Bitwise
equality where the conversion was exact; otherwise the largest absolute and relative errors, how
many zero-point cells differ, and which runtimes' readings differ.

--reference fp32: Y of a checkpoint as runtimes compute it (the convention its config declares)
against an fp32 dequant under the convention its data show; a mismatch is classified as a
one-step zero offset (a convention error), inf/NaN (fp16 overflow), or random corruption (zero
points the detector finds inconsistent with both conventions, or a known writer bug).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np

from .. import formats, runtimes
from ..conventions import ZeroRule, effective_zeros
from ..errors import UsageError
from ..formats import GPTQ, sniff
from ..formats import module_tensors as model_tensors
from ..formats.gptq import GptqSource, reference_zeros
from ..formats.model import outside_words
from ..gptq.checkpoint import Checkpoint, open_checkpoint
from ..gptq.detect import AMBIGUOUS, stored_fields
from ..gptq.evidence import detect_checkpoint
from ..gptq.labels import effective_declared
from ..gptq.packing import unpack
from ..safetensors_io.dtypes import FP16_MAX
from ..safetensors_io.index import open_store
from . import get_backend
from .operands import F16, F32, module_tensors, sample_columns

ROWS = 4          # rows of the random input X
COLUMNS = 64      # output columns sampled per module (a contiguous block; all when fewer)


@dataclass
class ModuleEquivalence:
    name: str
    equal: bool
    max_abs: float = 0.0
    max_rel: float = 0.0
    cells_differ: dict[str, int] = field(default_factory=dict)   # per runtime group
    runtimes_differ: list[str] = field(default_factory=list)
    note: str = ""

    def to_json(self):
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

    @property
    def equivalent(self) -> bool:
        return all(m.equal for m in self.modules)

    def to_json(self):
        return {"status": "ok" if self.equivalent else "fail", "mode": "against",
                "src": self.src, "dst": self.dst, "backend": self.backend,
                "src_convention": self.src_convention, "dst_convention": self.dst_convention,
                "columns_per_module": self.columns, "findings": [],
                "modules": [m.to_json() for m in self.modules],
                "summary": {"modules": len(self.modules),
                            "equal": sum(m.equal for m in self.modules),
                            "differ": sum(not m.equal for m in self.modules)}}


def convention_of(ckpt: Checkpoint) -> str:
    det = detect_checkpoint(ckpt, full=False)
    return det.verdict if det.verdict != AMBIGUOUS else effective_declared(ckpt)


def _columns(n: int, rng) -> np.ndarray:
    return sample_columns(n, COLUMNS, rng, align=32)


def compare(src: str | os.PathLike, dst: str | os.PathLike, backend: str = "auto",
            seed: int = 0) -> EquivalenceReport:
    """See the module docstring. When either side is compressed-tensors or AWQ,
    compare_formats does the work."""
    be = get_backend(backend)
    (sa, fa), (sb, fb) = _opened(src), _opened(dst)   # each store read once
    if not fa.format == fb.format == GPTQ:
        return compare_formats(src, dst, be, seed, (sa, fa), (sb, fb))
    a, b = open_checkpoint(src, sa), open_checkpoint(dst, sb)
    ca, cb = effective_declared(a), effective_declared(b)  # runtimes' reading
    other = {m.name: m for m in b.modules}
    rng = np.random.default_rng(seed)
    out = []
    for m in a.modules:
        mb = other.get(m.name)
        if not (m.valid and mb is not None and mb.valid):
            out.append(ModuleEquivalence(m.name, False, note="missing or invalid in one file"))
            continue
        if (m.bits, m.in_features, m.out_features, m.groups) != \
                (mb.bits, mb.in_features, mb.out_features, mb.groups):
            out.append(ModuleEquivalence(m.name, False, note="geometry differs"))
            continue
        cols = _columns(m.out_features, rng)
        x = rng.standard_normal((ROWS, m.in_features)).astype(np.float32)
        ta, tb = module_tensors(a, m), module_tensors(b, mb)
        sa, sb = stored_fields(ta.qzeros, m.bits), stored_fields(tb.qzeros, m.bits)
        res = ModuleEquivalence(m.name, True)
        for g in runtimes.groups():
            group, ra, rb = g.name, g.rule(ca), g.rule(cb)
            res.cells_differ[group] = int(np.count_nonzero(
                effective_zeros(sa, m.bits, ra) != effective_zeros(sb, mb.bits, rb)))
            ya = be.gemm(x, F32, ta, ra, cols)
            yb = be.gemm(x, F32, tb, rb, cols)
            if not np.array_equal(ya, yb) or res.cells_differ[group]:
                res.equal = False
                res.runtimes_differ.append(group)
                err = np.abs(yb - ya)
                res.max_abs = max(res.max_abs, float(np.nanmax(err)))
                res.max_rel = max(res.max_rel, float(np.linalg.norm(yb - ya) /
                                                     (np.linalg.norm(ya) or 1.0)))
        a.store.release(m.tensors.values())
        b.store.release(mb.tensors.values())
        out.append(res)
    return EquivalenceReport(str(src), str(dst), be.name, ca, cb,
                             COLUMNS, out)


ACROSS = "every runtime"  # the one reading when a side stores Z itself


def _opened(path) -> tuple:
    """(its tensor store, what format it is in): opened once, handed to the reader."""
    store = open_store(path)
    return store, sniff(store)


class _Side:
    """One checkpoint of a cross-format comparison: per module, its operands and zero rule as
    runtimes compute it (a GPTQ file under its label, read as the reference runtime reads it;
    another format in the one model, Z stored exactly) and its effective Z per cell."""

    def __init__(self, path, opened: tuple):
        store, sniffed = opened
        if sniffed.format == GPTQ:
            ckpt = open_checkpoint(path, store)
            self.convention = effective_declared(ckpt)
            self.src = GptqSource(ckpt, self.convention)
        else:
            self.src = formats.open_source(path, sniffed, store)
            self.convention = self.src.format
        self.modules = {m.name: m for m in self.src.modules}

    def operands(self, m):
        if isinstance(self.src, GptqSource):   # the file's own tensors under its label
            return (module_tensors(self.src.ckpt, self.src.module(m.name)),
                    runtimes.REFERENCE.rule(self.convention))
        return model_tensors(self.src, m), ZeroRule.V2

    def zeros(self, m) -> np.ndarray:
        if isinstance(self.src, GptqSource):
            return reference_zeros(self.src, m)[0]
        return unpack(self.src.qzeros(m), m.bits, axis=1).astype(np.int32)

    def close(self):
        self.src.close()


def compare_formats(src, dst, be, seed: int, opened_src: tuple,
                    opened_dst: tuple) -> EquivalenceReport:
    """--against where a side is compressed-tensors or AWQ: per module, the effective zero
    points cell by cell and Y = X @ W bitwise, each side computed as runtimes compute it.
    `opened_*`: each side's (store, sniffed format) from _opened."""
    try:
        a = _Side(src, opened_src)
    except BaseException:
        opened_dst[0].close()
        raise
    try:
        b = _Side(dst, opened_dst)
    except BaseException:
        a.close()
        raise
    rng = np.random.default_rng(seed)
    out = []
    try:
        for name, m in a.modules.items():
            mb = b.modules.get(name)
            if mb is None:
                out.append(ModuleEquivalence(name, False, note="missing or invalid in one file"))
                continue
            if (m.bits, m.in_features, m.out_features, m.groups) != \
                    (mb.bits, mb.in_features, mb.out_features, mb.groups):
                out.append(ModuleEquivalence(name, False, note="geometry differs"))
                continue
            outside = outside_words(m)
            if outside:   # no form in the one model the comparison computes on
                out.append(ModuleEquivalence(name, False, note=f"not compared: {outside}"))
                continue
            res = ModuleEquivalence(name, True)
            res.cells_differ[ACROSS] = int(np.count_nonzero(a.zeros(m) != b.zeros(mb)))
            (ta, ra), (tb, rb) = a.operands(m), b.operands(mb)
            cols = _columns(m.out_features, rng)
            x = rng.standard_normal((ROWS, m.in_features)).astype(np.float32)
            ya, yb = be.gemm(x, F32, ta, ra, cols), be.gemm(x, F32, tb, rb, cols)
            same_g = np.array_equal(np.asarray(ta.g_idx), np.asarray(tb.g_idx))
            if not np.array_equal(ya, yb) or res.cells_differ[ACROSS] or not same_g:
                res.equal = False
                res.runtimes_differ.append(ACROSS)
                res.max_abs = float(np.nanmax(np.abs(yb - ya)))
                res.max_rel = float(np.linalg.norm(yb - ya) / (np.linalg.norm(ya) or 1.0))
                if not same_g:
                    res.note = "g_idx differs"
            a.src.store.release(m.tensors.values())
            b.src.store.release(mb.tensors.values())
            out.append(res)
        out += [ModuleEquivalence(n, False, note="missing or invalid in one file")
                for n in b.modules if n not in a.modules]
    finally:
        a.close()
        b.close()
    return EquivalenceReport(str(src), str(dst), be.name, a.convention, b.convention, COLUMNS,
                             out)


@dataclass(frozen=True)
class ModuleDiagnosis:
    name: str
    verdict: str   # consistent | one-step zero offset | inf/nan | random corruption | invalid
    max_abs: float
    detail: str = ""

    def to_json(self):
        return dict(self.__dict__)


@dataclass(frozen=True)
class ReferenceReport:
    """What runtimes compute from one checkpoint against an fp32 dequant with the data's own
    convention, module by module."""
    declared: str     # what runtimes read
    detected: str     # what the data are
    modules: list[ModuleDiagnosis]
    backend: str

    @property
    def inconsistent(self) -> list[ModuleDiagnosis]:
        return [d for d in self.modules if d.verdict != "consistent"]

    def to_json(self) -> dict:
        return {"status": "fail" if self.inconsistent else "ok", "mode": "reference",
                "findings": [], "backend": self.backend, "declared": self.declared,
                "detected": self.detected, "modules": [d.to_json() for d in self.modules]}


def reference_fp32(path: str | os.PathLike, backend: str = "auto",
                   seed: int = 0) -> ReferenceReport:
    """The checkpoint's ReferenceReport; see the module docstring. Invalid modules are
    diagnosed as such (they cannot be computed)."""
    be = get_backend(backend)
    ck = open_checkpoint(path)
    declared = effective_declared(ck)
    detected = convention_of(ck)
    rule_decl = runtimes.REFERENCE.rule(declared)
    rule_data = runtimes.REFERENCE.rule(detected)
    rng = np.random.default_rng(seed)
    # each module's verdict in the light of all of them (misfits are judged against the count)
    verdicts = {v.name: v for v in detect_checkpoint(ck, full=True).modules}
    out = []
    for m in ck.modules:
        if not m.valid:
            out.append(ModuleDiagnosis(m.name, "invalid", 0.0, "its tensors do not form a "
                                       "module (see `gptqfmt verify`)"))
            continue
        cols = _columns(m.out_features, rng)
        x = rng.standard_normal((ROWS, m.in_features)).astype(np.float32)
        t = module_tensors(ck, m)
        y_rt = be.gemm(x.astype(np.float16).view(np.uint16), F16, t, rule_decl, cols)
        w_ref = be.dequant(t, rule_data, cols).astype(np.float64)
        y_ref = x.astype(np.float16).astype(np.float64) @ w_ref
        diff = y_rt.astype(np.float64) - y_ref
        scale_sum = x.astype(np.float16).astype(np.float64) @ \
            ck.float32(m.tensors["scales"]).astype(np.float64)[t.g_idx][:, cols]
        out.append(_classify(m.name, y_rt, diff, scale_sum, y_ref, verdicts[m.name]))
        ck.store.release(m.tensors.values())
    return ReferenceReport(declared, detected, out, be.name)


def _classify(name, y_rt, diff, scale_sum, y_ref, verdict) -> ModuleDiagnosis:
    if not np.isfinite(y_rt).all() or np.abs(y_rt).max(initial=0) > FP16_MAX:
        return ModuleDiagnosis(name, "inf/nan", float("inf"),
                               "outputs overflow float16 or are not finite")
    tol = 1e-4 * (np.abs(y_ref).max(initial=0) + 1)
    worst = float(np.abs(diff).max(initial=0))
    if worst > tol:
        for sign in (1, -1):  # Z read one too high lowers every weight by one scale step
            if np.abs(diff + sign * scale_sum).max(initial=0) <= \
                    tol + 1e-3 * np.abs(scale_sum).max():
                return ModuleDiagnosis(name, "one-step zero offset", worst, "runtimes read "
                                       "every zero point off by one: the label is wrong")
    if verdict.inconsistent or verdict.signatures:
        why = ", ".join(verdict.signatures) or "; ".join(verdict.evidence[-2:])
        return ModuleDiagnosis(name, "random corruption", worst,
                               f"the zero points follow no convention and no common offset: {why}")
    return ModuleDiagnosis(name, "consistent", worst)


def check_usage(against, reference):
    if against and reference:
        raise UsageError("--against and --reference are separate modes; give one")
