"""The gate of a conversion between formats: the staged output is opened in the target format by
the same readers verify uses, and every module is compared with SRC in the one model
(formats/model.py): codes word for word, effective zero points cell for cell (word for word
where SRC stores Z itself: equal words are equal cells), scale bits and g_idx; then Y = X @ W
on sampled columns from both sides' tensors on the CPU (every column on the GPU when that
backend is in use), bitwise. Every tensor outside the modules is compared byte for byte.
dequant(SRC) == dequant(DST) follows from the first three; the products check the readers and
the kernel arithmetic on top.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import numpy as np

from .. import faults
from ..bits.conventions import ZeroRule
from ..bits.packing import unpack, unpack_columns
from ..checks.modules import module_findings
from ..errors import FindingError
from ..findings import ERROR
from ..formats import WRITERS, QuantModule, Source, module_tensors, open_source
from ..formats.model import F32
from ..numerics import Backend, get_backend
from ..numerics.backend import sample_columns
from ..numerics.cpu import dequant_fields
from ..ops.differences import bytes_differ, codes_differ, field_differences, scheme_differences
from ..ops.reports import CHECK, COMPARE, GATE, Progress, start
from ..parallel import bounded_map
from ..safetensors_io.dtypes import to_float32
from .gate import GEMM_ROWS, GateResult, ModuleCheck, check_labels

GEMM_COLUMNS = 16      # output columns per module in Y = X @ W
NONE_LOSSY = np.zeros((1, 0), dtype=bool)   # no column holds a lossy cell
NONE_LOSSY.flags.writeable = False          # one array, shared by every module's check

Zeros = tuple[np.ndarray, np.ndarray]   # SRC's and the output's Z at some columns [G, n]


def open_output(tmp: Path, to: str, progress: Progress | None = None
                ) -> tuple[Source | None, list[str]]:
    """The staged output in the target format, and what verify would fail it for: a labelled
    output the labels its configs declare, as verify reads them (check_labels: its convention
    is the target's, so the data are not read again); another format's opening findings and
    every module's checks, as for a source (CHECK, to `progress`)."""
    try:
        out = open_source(tmp)
    except FindingError as e:
        return None, [f"the output cannot be opened: {f.one_line()}" for f in e.findings]
    if out.labelled is not None:
        return out.read_as(to), check_labels(tmp, to)
    errors = [f for f in out.findings if f.severity == ERROR]
    advance = start(progress, CHECK, len(out.modules))
    for m in out.modules:
        errors += [f for f in module_findings(out, m) if f.severity == ERROR]
        advance(1)
    return out, [f"the output would fail verify: {f.one_line()}" for f in errors]


def dequant_columns(src: Source, m: QuantModule, zeros: np.ndarray, scales: np.ndarray,
                    cols: np.ndarray) -> np.ndarray:
    """W[:, cols] in fp32: scale * (q - Z), from those columns' effective zeros and stored
    scales ([G, len(cols)])."""
    q = unpack(np.ascontiguousarray(src.qweight_columns(m, cols)), m.bits, axis=0)
    return dequant_fields(q, zeros, to_float32(scales, m.scale_dtype), src.g_idx(m))


def compare_zeros(src: Source, m: QuantModule, out: Source, mo: QuantModule
                  ) -> tuple[int, np.ndarray, list[str], Callable[[np.ndarray], Zeros]]:
    """The effective zero points of the two modules: (cells, lossy [G, N] or an empty mask
    where none is lossy, why they differ beyond the lossy cells, the two sides' Z at given
    columns). Where SRC stores Z itself (Source.zero_words) the words are compared whole and
    only the sampled columns are unpacked; else cell by cell, against the rule's reading."""
    written = out.qzeros(mo)
    words = src.zero_words(m)
    if words is not None and np.array_equal(words, written):
        def same(cols: np.ndarray) -> Zeros:
            z = unpack_columns(words, m.bits, cols)
            return z, z
        return words.size * words.dtype.itemsize * 8 // m.bits, NONE_LOSSY, [], same
    truth, lossy = src.zeros(m)
    stored = unpack(written, m.bits, axis=1)   # codes as bytes; compared as values
    differ = truth != stored
    why = [] if np.array_equal(differ, lossy) else \
        [f"{int((differ & ~lossy).sum())} zero points differ"]
    return int(differ.size), lossy, why, lambda cols: (truth[:, cols], stored[:, cols])


def check_module(src: Source, out: Source, m: QuantModule, mo: QuantModule,
                 rng: np.random.Generator, backends: list[Backend], codes: int | None = None
                 ) -> tuple[ModuleCheck, list[str]]:
    """`codes`: codes_differ(src, m, out, mo), where the caller compared them already."""
    why = scheme_differences(m, mo)
    if why:
        return ModuleCheck(m.name, 0, 0, False, False), why
    scales = np.asarray(src.scales(m)), np.asarray(out.scales(mo))
    why = field_differences(src, m, out, mo, codes, scales)
    cells, lossy, zeros_why, zeros_at = compare_zeros(src, m, out, mo)
    why += zeros_why
    cols = sample_columns(m.out_features, GEMM_COLUMNS, rng,
                          must=np.flatnonzero(lossy.any(axis=0)))
    x = rng.standard_normal((GEMM_ROWS, m.in_features)).astype(np.float32)
    gemm_equal, max_err, rel = True, 0.0, 0.0
    for be in backends:
        if be.name == "cpu":  # numpy's matmul: both sides computed alike, compared bitwise
            za, zb = zeros_at(cols)
            ya = x @ dequant_columns(src, m, za, scales[0][:, cols], cols)
            yb = x @ dequant_columns(out, mo, zb, scales[1][:, cols], cols)
        else:                 # the CUDA kernel, every column, each side in the one model
            ta, tb = module_tensors(src, m), module_tensors(out, mo)
            ya, yb = be.gemm(x, F32, ta, ZeroRule.V2), be.gemm(x, F32, tb, ZeroRule.V2)
        if not np.array_equal(ya, yb):
            gemm_equal = False
            max_err = max(max_err, float(np.abs(yb - ya).max(initial=0.0)))
            rel = max(rel, float(np.linalg.norm(yb - ya) / (np.linalg.norm(ya) or 1.0)))
    if not gemm_equal and not lossy.any():
        why.append("Y = X @ W differs")
    return ModuleCheck(m.name, cells, int(lossy.sum()), not zeros_why, gemm_equal, max_err,
                       rel), why


def compare_passthrough(src: Source, out: Source, to: str, result: GateResult,
                        progress: Progress | None = None) -> None:
    """Every tensor outside the modules that the target keeps: the same dtype, shape and
    bytes (COMPARE, over the bytes of those in the output, to `progress`)."""
    there = [t for t in src.passthrough if t in out.store.locations]
    advance = start(progress, COMPARE, sum(src.store.info(t).nbytes for t in there))
    for t in src.passthrough:
        if t not in out.store.locations:
            if WRITERS[to].keeps(t):   # else left out on purpose
                result.failures.append(f"{t}: missing in the output")
            continue
        why, size = bytes_differ(src, out, t)
        if why:
            result.failures.append(f"{t}: {why} (SRC vs the output)")
        result.bytes_compared += size
        advance(src.store.info(t).nbytes)


def run_format_gate(src: Source, tmp: Path, to: str, backend: str = "cpu",
                    on_module: Progress | None = None) -> GateResult:
    """The gate of the module docstring over the staged output `tmp`; `on_module` hears of its
    phases: CHECK (an output of a format other than GPTQ), GATE module by module, COMPARE."""
    backends = [get_backend("cpu")] + ([get_backend("cupy")] if backend == "cupy" else [])
    result = GateResult(method=(
        "exact, in the one model: codes, effective zero points, scales and g_idx of every "
        f"module compared with SRC, Y = X @ W bitwise on {GEMM_COLUMNS}+ columns per module "
        "(cpu)" + ("; Y = X @ W on every column with the CUDA kernel (cupy)"
                   if backend == "cupy" else "") + "; every other tensor compared byte for "
        "byte"))
    out, problems = open_output(tmp, to, on_module)
    result.failures += problems
    if out is None:
        return result
    ahead = ThreadPoolExecutor(1)
    try:
        theirs = {m.name: m for m in out.modules}
        missing = [m.name for m in src.modules if m.name not in theirs]
        extra = sorted(set(theirs) - {m.name for m in src.modules})
        result.failures += [f"{n}: missing in the output" for n in missing]
        result.failures += [f"{n}: in the output but not in SRC" for n in extra]
        rng = np.random.default_rng(0)
        advance = start(on_module, GATE, len(src.modules))
        pairs = [(m, theirs[m.name]) for m in src.modules if m.name in theirs]

        def codes(m: QuantModule, mo: QuantModule) -> int | None:
            if scheme_differences(m, mo):
                return None
            n = codes_differ(src, m, out, mo)
            # its pages go at once, by their ranges: two modules' qweights mapped together
            # would double the gate's memory (the check maps the few columns it multiplies
            # again), and this thread's pages are not the ones the loop's release looks for
            src.store.release_ranges(m.tensors.values())
            out.store.release_ranges(mo.tensors.values())
            return n
        # each module's codes (the bulk of the bytes, compared on threads of their own) while
        # the module before is checked on this thread
        compared = bounded_map(ahead, codes, *zip(*pairs), ahead=2) if pairs else iter(())
        for i, m in enumerate(src.modules):
            if m.name in theirs:
                chk, why = check_module(src, out, m, theirs[m.name], rng, backends,
                                        next(compared))
                src.store.release(m.tensors.values())
                out.store.release(theirs[m.name].tensors.values())
                result.modules.append(chk)
                if why:
                    result.failures.append(f"{m.name}: the converted module does not compute "
                                           f"what the source computed ({'; '.join(why)})")
            advance(1)
            faults.point("gate-module", i)
        compare_passthrough(src, out, to, result, on_module)
    finally:
        ahead.shutdown(cancel_futures=True)
        out.close()
    return result
