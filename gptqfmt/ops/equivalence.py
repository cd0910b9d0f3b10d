"""`verify SRC --against DST` and `verify PATH --reference fp32`.

--against: module by module, Y = X @ W from SRC as runtimes compute it against Y from DST as
runtimes compute it (each side read the way its label means it, so a mislabelled side computes
what runtimes compute), the effective zero points cell by cell and g_idx; bitwise equality
where the conversion was exact, otherwise the largest absolute and relative errors, how many
zero-point cells differ, and which runtimes' readings differ. When both sides store labelled
zero points (GPTQ), once per group of runtimes (their zero rules differ for gptq files); when
either stores Z itself, once for every runtime, in the one model.

--reference fp32: Y of a checkpoint as runtimes compute it (the convention its config declares)
against an fp32 dequant under the convention its data show; a mismatch is classified as a
one-step zero offset (a convention error), inf/NaN (fp16 overflow), or random corruption (zero
points the detector finds inconsistent with both conventions, or a known writer bug).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..bits.conventions import ZeroRule, reference_rule
from ..detection.decide import AMBIGUOUS, ModuleVerdict
from ..detection.read import detect_checkpoint
from ..errors import UsageError
from ..formats import Source, open_source
from ..formats.model import F16, F32, QuantModule, outside_words
from ..formats.open import open_labelled
from ..numerics import get_backend
from ..numerics.backend import sample_columns
from ..runtimes.groups import groups as runtime_groups
from ..safetensors_io.dtypes import FP16_MAX
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
    tensors_compared: int = 0
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
        tensors, n_tensors, n_bytes = tensor_differences(a, b)
        configs = config_differences(a, b)
    finally:
        a.close()
        b.close()
    return EquivalenceReport(str(src), str(dst), be.name, a.format, b.format, COLUMNS, out,
                             [Difference(*d) for d in tensors], [Difference(*d) for d in configs],
                             n_tensors, n_bytes)


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
class ModuleDiagnosis:
    name: str
    verdict: str   # consistent | one-step zero offset | inf/nan | random corruption | invalid
    max_abs: float
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
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

    def to_json(self) -> dict[str, Any]:
        return {"status": "fail" if self.inconsistent else "ok", "mode": "reference",
                "findings": [], "backend": self.backend, "declared": self.declared,
                "detected": self.detected, "modules": [d.to_json() for d in self.modules]}


def reference_fp32(path: str | os.PathLike[str], backend: str = "auto",
                   seed: int = 0) -> ReferenceReport:
    """The checkpoint's ReferenceReport; see the module docstring. Invalid modules are
    diagnosed as such (they cannot be computed)."""
    be = get_backend(backend)
    src, ck = open_labelled(path)
    try:
        declared = ck.label
        det = detect_checkpoint(ck, full=False)
        detected = det.verdict if det.verdict != AMBIGUOUS else declared
        rule_decl, rule_data = reference_rule(declared), reference_rule(detected)
        rng = np.random.default_rng(seed)
        # each module's verdict in the light of all of them (misfits are judged against the count)
        verdicts = {v.name: v for v in detect_checkpoint(ck, full=True).modules}
        valid = {m.name: m for m in src.modules}
        out = []
        for r in src.records():
            m = valid.get(r.name)
            if m is None:
                out.append(ModuleDiagnosis(r.name, "invalid", 0.0, "its tensors do not form a "
                                           "module (see `gptqfmt verify`)"))
                continue
            cols = _columns(m.out_features, rng)
            x = rng.standard_normal((ROWS, m.in_features)).astype(np.float32)
            t, _ = src.operands(m)
            y_rt = be.gemm(x.astype(np.float16).view(np.uint16), F16, t, rule_decl, cols)
            w_ref = be.dequant(t, rule_data, cols).astype(np.float64)
            y_ref = x.astype(np.float16).astype(np.float64) @ w_ref
            diff = y_rt.astype(np.float64) - y_ref
            scales = ck.float32(m.tensors["scales"]).astype(np.float64)
            scale_sum = x.astype(np.float16).astype(np.float64) @ scales[t.g_idx][:, cols]
            out.append(_classify(m.name, y_rt, diff, scale_sum, y_ref, verdicts[m.name]))
            src.store.release(m.tensors.values())
    finally:
        src.close()
    return ReferenceReport(declared, detected, out, be.name)


def _classify(name: str, y_rt: np.ndarray, diff: np.ndarray, scale_sum: np.ndarray,
              y_ref: np.ndarray, verdict: ModuleVerdict) -> ModuleDiagnosis:
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


def check_usage(against: str | None, reference: str | None) -> None:
    if against and reference:
        raise UsageError("--against and --reference are separate modes; give one")
