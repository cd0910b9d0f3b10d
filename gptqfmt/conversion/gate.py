"""The verify gate: prove that DST computes what SRC computed before DST becomes visible.

Between gptq and gptq_v2 only the zero points change, so the proof is about bytes and zeros,
from what the conversion passed through and what it wrote (no second read of either copy):
1. every byte outside qzeros is SRC's: the shard writer copies each range of SRC once, accounts
   for every byte of it (write.py), and the output's headers and sizes are read back here and
   compared with SRC's;
2. per module, the qzeros read back from the output hold the effective zero point of every
   source cell (vLLM's reading: gptq Z = s + 1, gptq_v2 Z = s), except the cells the report
   lists as lossy: word by word where no field is lossy (conventions.moved_words: one
   addition per word is exactly the field-by-field move), field by field otherwise;
3. with qweight, scales and g_idx the same bytes, a weight is a pure function of them and its
   Z, so equal zeros are equal weights; Y = X @ W (fp32, from the files' tensors) is computed
   on the columns that hold a lossy cell, to measure what is given up.

Before those, `check_labels` runs verify's label checks on the staged output: its configs must
declare the target convention the way runtimes read it (a DST that `gptqfmt verify` would fail
with GQ401, GQ204, GQ209 or any other config error is never committed).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .. import faults
from ..bits.conventions import effective_zeros, lossy_mask, reference_rule, word_path, words_moved
from ..bits.layout import stored_fields
from ..bits.packing import unpack
from ..checks.labels import convention_findings
from ..detection.decide import ModuleVerdict
from ..detection.pool import combine
from ..errors import FindingError
from ..findings import ERROR
from ..formats.gptq.checkpoint import Checkpoint, Module, open_checkpoint
from ..numerics.cpu import dequant_fields
from ..ops.reports import GATE, Progress, start
from ..ops.verify import validate
from ..safetensors_io.dtypes import to_float32
from ..safetensors_io.index import TensorStore

GEMM_ROWS = 4


@dataclass(frozen=True)
class ModuleCheck:
    name: str
    cells: int
    lossy_cells: int
    zeros_equal: bool
    gemm_equal: bool
    max_abs_err: float = 0.0
    rel_err: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class GateResult:
    method: str
    bytes_compared: int = 0
    modules: list[ModuleCheck] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def add(self, chk: ModuleCheck) -> None:
        """A module's check, and its failure when its zeros differ beyond the lossy cells (or,
        with none lossy, its Y = X @ W)."""
        self.modules.append(chk)
        if not chk.zeros_equal or (chk.lossy_cells == 0 and not chk.gemm_equal):
            self.failures.append(f"{chk.name}: the converted module does not compute what the "
                                 "source computed")


def check_labels(path, target: str, reread: bool = False,
                 store: TensorStore | None = None, progress: Progress | None = None
                 ) -> list[str]:
    """What verify would fail the staged output at `path` for, on its configs and labels: one
    message per problem, each saying what the staged configs declare; empty when they declare
    `target` as every runtime reads it.

    The output's convention is known (convert wrote `target` from data that agreed with --from
    or the label), so the data are not read again: verify's convention_findings runs with a
    detection that says `target` for every module (`reread`: --from was trusted over data that
    contradicted it, so the output is verified as a whole, every check over all its data), and
    the label (what vLLM, transformers and ExLlamaV2 read) must be `target`. Every
    error of opening the output counts too (config errors such as GQ204, GQ205, GQ209, and
    declared values against the shapes, GQ304-GQ307): the source had none, or was refused.
    `store`: the output's tensors where they are open already (in place: the source's own, whose
    headers the conversion leaves as they are), so that tens of thousands of header entries are
    not held twice; it stays open. `progress`: verify's phases, where the output is read again."""
    if reread:
        report = validate(path, progress=progress)
        return [f"verify of the output would report {f.one_line()}" for f in report.findings
                if f.severity == ERROR]
    try:
        out = open_checkpoint(path, store)
    except FindingError as e:
        return [f"the output cannot be opened: {f.one_line()}" for f in e.findings]
    try:
        says = declarations(out)
        written = f"written as {target} by convert"   # one string for every module
        det = combine([ModuleVerdict(name=m.name, verdict=target, confidence=1.0,
                                     evidence=[written]) for m in out.valid_modules])
        errors = [f for f in out.findings + convention_findings(out, det) if f.severity == ERROR]
        msgs = [f"{says}; verify would report {f.one_line()}" for f in errors]
        declared = out.label
        if declared != target and not any(f.code == "GQ401" for f in errors):
            msgs.append(f"{says}: runtimes read {declared}, but the output holds {target}")
        return msgs
    finally:
        if store is None:
            out.close()


def declarations(ckpt: Checkpoint) -> str:
    """What the configs of `ckpt` declare, in words, for messages."""
    cfg = ckpt.config
    read = f"runtimes read {ckpt.label}"
    if cfg is None:
        return f"the staged output has no config ({read})"
    if not cfg.declared_in:
        return (f"the staged configs ({', '.join(cfg.sources)}) declare neither "
                f"checkpoint_format nor format ({read})")
    return ("the staged configs declare " + ", ".join(
        f"{d.file} {d.said()}" for d in cfg.declared_in) + f" ({read})")


def compare_headers(src: Checkpoint, dst: Checkpoint, result: GateResult) -> None:
    """Every shard of the output has SRC's size and SRC's header, byte for byte (read back from
    the output: its offsets are the ones the qzeros are proven at)."""
    for name, fs in src.store.files.items():
        fd = dst.store.files.get(name)
        if fd is None or fd.size != fs.size:
            result.failures.append(f"{name}: missing or of another size in the output")
            continue
        n = fs.header.data_start
        if fs.raw()[:n].tobytes() != fd.raw()[:n].tobytes():
            result.failures.append(f"{name}: its header differs from SRC's")
        fs.release(0, n)
        fd.release(0, n)


def check_words(src: Checkpoint, m: Module, w_src: np.ndarray, w_dst: np.ndarray,
                src_conv: str, dst_conv: str, rng: np.random.Generator,
                checked: bool = False) -> ModuleCheck:
    """Module `m` converted: `w_dst` (the output's qzeros words, or the words about to be
    written in place) against the source's `w_src`, every other tensor being `src`'s own bytes
    (see the module docstring, 2 and 3). `checked`: the caller found no lossy field in `w_src`
    (conventions.word_path)."""
    if not word_path(w_src, m.bits, src_conv, dst_conv, checked):  # lossy, or 3 bits
        return check_fields(src, m, stored_fields(w_src, m.bits), stored_fields(w_dst, m.bits),
                            src_conv, dst_conv, rng)
    equal = words_moved(w_src, w_dst, m.bits, src_conv, dst_conv)
    cells = w_src.size * w_src.dtype.itemsize * 8 // m.bits
    return ModuleCheck(m.name, cells, 0, equal, equal)


def check_fields(src: Checkpoint, m: Module, s_src: np.ndarray, s_dst: np.ndarray,
                 src_conv: str, dst_conv: str, rng: np.random.Generator) -> ModuleCheck:
    """check_words on stored zero-point fields: the effective zeros of every cell equal except
    exactly the fields the conversion cannot carry (conventions.lossy_mask), and Y = X @ W on
    the columns that hold such a field (qweight and scales read once, for both sides)."""
    z_src = effective_zeros(s_src, m.bits, reference_rule(src_conv))
    z_dst = effective_zeros(s_dst, m.bits, reference_rule(dst_conv))
    differ = z_src != z_dst
    lossy = lossy_mask(s_src, m.bits, src_conv, dst_conv)
    if lossy is None:
        lossy = np.zeros_like(differ)
    zeros_equal = bool(np.array_equal(differ, lossy))
    cols = np.flatnonzero(lossy.any(axis=0))
    if cols.size == 0:
        return ModuleCheck(m.name, int(differ.size), 0, zeros_equal, zeros_equal)
    x = rng.standard_normal((GEMM_ROWS, m.in_features)).astype(np.float32)
    q = unpack(src.store.columns(m.tensors["qweight"], cols), m.bits, axis=0)
    sc = m.tensors["scales"]
    scales = to_float32(src.view(sc)[:, cols], src.store.info(sc).dtype)
    g_idx = src.g_idx(m)
    # numpy's matmul: both sides are computed the same way and compared bitwise, so the gate
    # needs no particular order of additions (numerics/cpu.py keeps the kernel's k order,
    # which its equality with the GPU needs, at a Python step per input channel)
    y_src = x @ dequant_fields(q, z_src[:, cols], scales, g_idx)
    y_dst = x @ dequant_fields(q, z_dst[:, cols], scales, g_idx)
    err = np.abs(y_dst - y_src)
    norm = float(np.linalg.norm(y_src)) or 1.0
    return ModuleCheck(m.name, int(differ.size), int(lossy.sum()), zeros_equal,
                       bool(np.array_equal(y_src, y_dst)), float(err.max(initial=0.0)),
                       float(np.linalg.norm(y_dst - y_src)) / norm)


def run_gate(src: Checkpoint, tmp: Path, src_conv: str, dst_conv: str, copied: int,
             on_module: Progress | None = None) -> GateResult:
    """The exact CPU gate over the staged output `tmp` (see the module docstring), `copied`
    being the bytes outside qzeros the shard writer copied and accounted for: `on_module` hears
    of GATE, module by module."""
    result = GateResult(method="cpu exact: every byte outside qzeros copied once and accounted "
                               "for, headers and sizes read back; the qzeros read back prove "
                               "the effective zero of every cell (equal zeros over the same "
                               "qweight, scales and g_idx bytes are equal weights); Y = X @ W "
                               "bitwise on the columns with lossy cells",
                        bytes_compared=copied)
    out = open_checkpoint(tmp)
    modules = src.valid_modules   # every one: convert refuses a source with an invalid one
    try:
        compare_headers(src, out, result)
        if result.failures:  # the qzeros are found through the headers: nothing to prove on
            return result
        rng = np.random.default_rng(0)
        advance = start(on_module, GATE, len(modules))
        for i, m in enumerate(modules):
            qz = m.tensors["qzeros"]
            chk = check_words(src, m, src.view(qz), out.view(qz), src_conv, dst_conv, rng)
            src.store.release(m.tensors.values())
            out.store.release([qz])
            result.add(chk)
            advance(1)
            faults.point("gate-module", i)
    finally:
        out.close()
    return result
