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
from typing import Callable, NamedTuple

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
GATE_SEED = 0          # module i draws its columns, then X, from default_rng((GATE_SEED, i))
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
                    cols: np.ndarray, words: np.ndarray | None = None) -> np.ndarray:
    """W[:, cols] in fp32: scale * (q - Z), from those columns' effective zeros and stored
    scales ([G, len(cols)]); `words`: src.qweight_columns(m, cols), where the caller took
    them."""
    if words is None:
        words = src.qweight_columns(m, cols)
    q = unpack(np.ascontiguousarray(words), m.bits, axis=0)
    return dequant_fields(q, zeros, to_float32(scales, m.scale_dtype), src.g_idx(m))


class Ahead(NamedTuple):
    """What the gate's second thread takes of a module while its qweight is mapped for the
    word comparison: codes_differ's answer, the module's random draws (module_rng; its
    columns drawn), the block of columns Y = X @ W is computed on, and both sides' words at
    those columns (a column gather touches every row, so every page: here they are mapped
    already)."""
    codes: int
    rng: np.random.Generator
    block: np.ndarray
    words: tuple[np.ndarray, np.ndarray]


def module_rng(i: int) -> np.random.Generator:
    """Module i's draws (its columns, then X): its own stream, whichever thread draws."""
    return np.random.default_rng((GATE_SEED, i))


def take_ahead(src: Source, m: QuantModule, out: Source, mo: QuantModule, i: int
               ) -> Ahead | None:
    """Ahead for module `m` (the i-th compared) and its output `mo`; None where their schemes
    differ (check_module says how)."""
    if scheme_differences(m, mo):
        return None
    codes = codes_differ(src, m, out, mo)
    rng = module_rng(i)
    block = sample_columns(m.out_features, GEMM_COLUMNS, rng)
    return Ahead(codes, rng, block, (src.qweight_columns(m, block),
                                     out.qweight_columns(mo, block)))


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
                 backends: list[Backend], ahead: Ahead | None = None, i: int = 0
                 ) -> tuple[ModuleCheck, list[str]]:
    """Module `m` (the i-th compared) against its output `mo`; `ahead`: take_ahead's, where
    the caller took it (else taken here)."""
    why = scheme_differences(m, mo)
    if why:
        return ModuleCheck(m.name, 0, 0, False, False), why
    if ahead is None:
        ahead = take_ahead(src, m, out, mo, i)
        assert ahead is not None   # the same scheme
    scales = np.asarray(src.scales(m)), np.asarray(out.scales(mo))
    why = field_differences(src, m, out, mo, ahead.codes, scales)
    cells, lossy, zeros_why, zeros_at = compare_zeros(src, m, out, mo)
    why += zeros_why
    # the block drawn, and up to half as many columns again that hold lossy cells
    must = np.flatnonzero(lossy.any(axis=0))[:GEMM_COLUMNS // 2]
    words: tuple[np.ndarray | None, np.ndarray | None] = ahead.words
    cols = ahead.block
    if len(must):   # the words taken ahead are the block's: all of them taken again
        cols, words = np.union1d(cols, must), (None, None)
    x = ahead.rng.standard_normal((GEMM_ROWS, m.in_features)).astype(np.float32)
    gemm_equal, max_err, rel = True, 0.0, 0.0
    for be in backends:
        if be.name == "cpu":  # numpy's matmul: both sides computed alike, compared bitwise
            za, zb = zeros_at(cols)
            ya = x @ dequant_columns(src, m, za, scales[0][:, cols], cols, words[0])
            yb = x @ dequant_columns(out, mo, zb, scales[1][:, cols], cols, words[1])
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
    pool = ThreadPoolExecutor(1)
    try:
        theirs = {m.name: m for m in out.modules}
        missing = [m.name for m in src.modules if m.name not in theirs]
        extra = sorted(set(theirs) - {m.name for m in src.modules})
        result.failures += [f"{n}: missing in the output" for n in missing]
        result.failures += [f"{n}: in the output but not in SRC" for n in extra]
        advance = start(on_module, GATE, len(src.modules))
        pairs = [(m, theirs[m.name]) for m in src.modules if m.name in theirs]

        def taken(m: QuantModule, mo: QuantModule, i: int) -> Ahead | None:
            try:
                return take_ahead(src, m, out, mo, i)
            finally:
                # its pages go at once, by their ranges: two modules' qweights mapped
                # together would double the gate's memory, and this thread's pages are not
                # the ones the loop's release looks for
                src.store.release_ranges(m.tensors.values())
                out.store.release_ranges(mo.tensors.values())
        # each module's codes (the bulk of the bytes, compared on threads of their own) and
        # sampled columns while the module before is checked on this thread
        compared = bounded_map(pool, taken, *zip(*pairs), range(len(pairs)), ahead=2) \
            if pairs else iter(())
        for i, m in enumerate(src.modules):
            if m.name in theirs:
                chk, why = check_module(src, out, m, theirs[m.name], backends, next(compared))
                # by their ranges too: a whole file's release would drop the pages of the
                # next module, which the second thread is reading in the same file
                src.store.release_ranges(m.tensors.values())
                out.store.release_ranges(theirs[m.name].tensors.values())
                result.modules.append(chk)
                if why:
                    result.failures.append(f"{m.name}: the converted module does not compute "
                                           f"what the source computed ({'; '.join(why)})")
            advance(1)
            faults.point("gate-module", i)
        compare_passthrough(src, out, to, result, on_module)
    finally:
        pool.shutdown(cancel_futures=True)
        out.close()
    return result
