"""The per-module rules of verify, each once: what a module's verdict, its stored zero points,
its scales and its declared config say (findings are data). verify (validation.py) runs them
all; inspect the ones its bounded reads can feed; convert refuses on them before writing."""
from __future__ import annotations

import numpy as np

from .. import runtimes
from ..conventions import GPTQ, GPTQ_V2, effective_zeros
from ..findings import Finding
from ..safetensors_io.dtypes import FP16_MAX, positive_finite_max
from .checkpoint import Checkpoint, Module
from .detect import AMBIGUOUS, ModuleVerdict, corruption_signatures, stored_fields
from .labels import effective_declared
from .packing import maxq as code_max

ROUTER_SUFFIXES = (".mlp.gate", ".router", ".block_sparse_moe.gate", ".mlp.router")


def module_findings(ckpt: Checkpoint, m: Module, v: ModuleVerdict) -> list[Finding]:
    """Every per-module finding of verify, from the module's verdict `v`."""
    return zero_point_findings(ckpt, m, v) + scale_findings(ckpt, m, v) + \
        declared_findings(ckpt, m)


def zero_point_findings(ckpt: Checkpoint, m: Module, v: ModuleVerdict,
                        settled_only: bool = False) -> list[Finding]:
    """GQ403, GQ405, GQ406, GQ407, GQ412: what the verdict and its evidence say about the
    stored zero points (qzeros is the only tensor read here; `v` carries the codes' evidence).

    `settled_only` (inspect): when `v` rests on a sample of the codes (`v.complete` false), give
    only the findings that qzeros alone decide, which reading every row cannot take back. Without
    it, a sampled verdict is used as it is (convert refuses on it before writing)."""
    qz_name = m.tensors["qzeros"]
    file_qz = ckpt.store.file_of(qz_name)
    out: list[Finding] = []
    maxq = code_max(m.bits)
    decl = m.declared
    pattern_sym = v.pattern is not None
    if decl is not None and decl.sym is True and not pattern_sym:
        out.append(Finding("GQ403", "config says sym=true, but the zero points are not the "
                           f"constant {1 << (m.bits - 1)}: Marlin ignores qzeros and decodes "
                           "with the constant, other kernels read these values",
                           file=file_qz, tensor=qz_name, hint="set sym=false"))
    st = v.stats
    partial = settled_only and not v.complete
    if not partial:
        sigs, sig_ev = v.signatures, [e for e in v.evidence if any(
            k in e for k in ("AutoGPTQ", "GPTQModel", "borrow"))]
    else:  # a sample of the codes: only the signatures that the stored fields alone show
        sigs, sig_ev = corruption_signatures(st, m.bits, codes=False) if st else ([], [])
        if v.pooled_runs and "autogptq_sign_extension" not in sigs:  # qzeros alone, pooled
            sigs, sig_ev = sigs + ["autogptq_sign_extension"], sig_ev + [v.pooled_runs]
    if sigs:
        out.append(Finding("GQ405", f"{', '.join(sigs)}: " + "; ".join(sig_ev),
                           file=file_qz, tensor=qz_name, details={"signatures": sigs}))
    if partial:
        return out  # the rest rests on the codes of every row, which verify reads
    if v.inconsistent:
        out.append(Finding("GQ412", "the zero points fit neither gptq nor gptq_v2: "
                           + "; ".join(v.evidence), file=file_qz, tensor=qz_name))
    if v.outlier:
        out.append(Finding("GQ414", "the zero points sit further from either convention than "
                           "clean modules do: " + "; ".join(v.evidence), file=file_qz,
                           tensor=qz_name, hint="compare this module's zero points with its "
                           "source, or re-export it"))
    if st is not None and v.verdict in (GPTQ, AMBIGUOUS) and st.stored_maxq and not pattern_sym:
        out.append(Finding(
            "GQ406", f"{st.stored_maxq} fields store {maxq}: "
            f"{runtimes.maxq_readings(m.bits, sep=', ')} ({st.wrapped} of them have codes "
            "that say Z = 0)", file=file_qz, tensor=qz_name,
            details={"fields": st.stored_maxq, "wrapped": st.wrapped}))
    if st is not None and v.verdict == GPTQ_V2 and st.stored_zero:
        out.append(Finding("GQ407", f"{st.stored_zero} zero points are 0; gptq cannot store "
                           "them (a conversion to gptq would change those groups)",
                           file=file_qz, tensor=qz_name, details={"fields": st.stored_zero}))
    return out


def scale_findings(ckpt: Checkpoint, m: Module, v: ModuleVerdict) -> list[Finding]:
    """GQ501, GQ502: scales not finite and positive, or dequantized weights beyond float16
    (reads every scale; verify only)."""
    sc_name = m.tensors["scales"]
    file_sc = ckpt.store.file_of(sc_name)
    out: list[Finding] = []
    maxq = code_max(m.bits)
    top = positive_finite_max(ckpt.view(sc_name), ckpt.store.info(sc_name).dtype)
    if top is not None and top * (1 << m.bits) <= FP16_MAX:
        return out  # every Z and maxq - Z is at most 2^bits: no weight can pass float16's max
    scales = ckpt.float32(sc_name)
    bad = bad_scales(scales, file_sc, sc_name, ("group", "column"))
    if bad:
        out.append(bad)
    else:
        zeros = _effective_zeros(ckpt, m, v.verdict)
        reach = scales * np.maximum(zeros, maxq - zeros)
        over = reach > FP16_MAX
        if over.any():
            g, n = np.unravel_index(int(np.argmax(reach)), reach.shape)
            out.append(Finding("GQ502", f"{int(over.sum())} groups can dequantize beyond "
                               f"float16's {FP16_MAX:g}; worst {float(reach[g, n]):.4g} at group "
                               f"{g}, column {n}", file=file_sc, tensor=sc_name))
    return out


def bad_scales(scales: np.ndarray, file: str, tensor: str, axes: tuple[str, str]):
    """GQ501 when any scale (float32, 2-D, its axes named by `axes`) is not finite and
    positive, naming the first; None otherwise. Every format's scales go through here."""
    bad = ~np.isfinite(scales) | (scales <= 0)
    if not bad.any():
        return None
    i, j = np.argwhere(bad)[0]
    return Finding("GQ501", f"{int(bad.sum())} of {scales.size} scales are not finite and "
                   f"positive; first at {axes[0]} {i}, {axes[1]} {j}: {scales[i, j]!r}",
                   file=file, tensor=tensor)


def declared_findings(ckpt: Checkpoint, m: Module) -> list[Finding]:
    """GQ315, GQ316: the module's metadata (config, g_idx, name) against runtime expectations."""
    out: list[Finding] = []
    decl = m.declared
    file_qz = ckpt.store.file_of(m.tensors["qzeros"])
    if m.act_order is False and decl is not None and decl.desc_act is True and \
            not (ckpt.config and ckpt.config.static_groups) and m.groups > 1:
        out.append(Finding("GQ315", "config says desc_act=true but g_idx is k // group_size "
                           "(and static_groups is not set)", file=file_qz,
                           tensor=m.tensors.get("g_idx", m.tensors["qzeros"])))
    if m.name.endswith(ROUTER_SUFFIXES):
        out.append(Finding("GQ316", "a MoE router gate is quantized; vLLM and TGI expect it in "
                           "full precision", file=file_qz, tensor=m.tensors["qweight"]))
    return out


def _effective_zeros(ckpt: Checkpoint, m: Module, convention: str) -> np.ndarray:
    """Z per cell as vLLM reads it; the declared convention decides when the data do not."""
    if convention == AMBIGUOUS:
        convention = effective_declared(ckpt)
    return effective_zeros(stored_fields(ckpt.view(m.tensors["qzeros"]), m.bits), m.bits,
                           runtimes.REFERENCE.rule(convention))
