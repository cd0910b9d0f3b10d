"""The per-module rules of verify, each once, and the one entry that runs them on any source
(module_findings): the format's own data checks, the scales, and for a labelled source (GPTQ)
what the module's verdict, its stored zero points and its declared config say. verify runs
them all; inspect the ones its bounded reads can feed; convert refuses on them before writing.
Findings are data."""
from __future__ import annotations

from collections.abc import Iterable, Set

import numpy as np

from ..bits.conventions import GPTQ, GPTQ_V2, effective_zeros, reference_rule
from ..bits.packing import maxq as code_max
from ..detection.decide import AMBIGUOUS, ModuleVerdict, corruption_signatures, zero_clamp
from ..findings import Finding
from ..formats.gptq.checkpoint import Checkpoint, Module
from ..formats.model import PROBE, PROBED, QuantModule
from ..formats.source import Source
from ..runtimes.groups import maxq_readings
from ..safetensors_io.dtypes import FP16_MAX, finite_nonzero_absmax, to_float32

# fields above a wrapped zero whose codes do not clear them, before verify says it cannot tell
# (as stored maxq fields decide from 3: one or two are a genuine Z = 0 of one-signed weights
# at a word's top as often as not)
UNSETTLED_MIN = 3
ROUTER_SUFFIXES = (".mlp.gate", ".router", ".block_sparse_moe.gate", ".mlp.router")


def module_findings(src: Source, m: QuantModule, verdict: ModuleVerdict | None = None,
                    full: bool = True, zero_heads: Set[str] | None = None
                    ) -> list[Finding]:
    """Every per-module finding of module `m` of `src`: verify's (full reads), or inspect's
    (`full` False: bounded reads, and of a sampled verdict only what qzeros alone decide).

    A labelled source's module is judged with its `verdict` (detection's, required there): its
    zero points, its scales up to float16's range under the verdict's convention, its declared
    config; another format's with its own data checks and its scales. `zero_heads`: the
    tensors of `src` whose first PROBE bytes are zero, where the caller probed many modules
    at once (probe_heads); else this module's are probed here."""
    empty = zero_tensor_findings(src, m, zero_heads)
    if empty:   # nothing else about the module means anything
        return empty
    ck = src.labelled
    if ck is None:
        return src.data_findings(m, full) + (scale_findings(src, m) if full else [])
    if verdict is None:
        raise ValueError(f"{m.name}: a labelled source's module is checked with its verdict")
    mod = ck.module(m.name)
    out = zero_point_findings(ck, mod, verdict, settled_only=not full)
    out += zero_clamp_findings(ck, mod, verdict, settled_only=not full)
    if full:
        out += scale_findings(src, m, lambda: _effective_zeros(ck, mod, verdict.verdict))
    return out + declared_findings(ck, mod)


ZERO_SCAN = 1 << 20   # then per step, where the probe found none


def _all_zero_after_probe(raw: np.ndarray) -> bool:
    """Whether every byte past the first PROBE (found zero by the caller) is 0, a step at a
    time."""
    return not any(raw[i:i + ZERO_SCAN].any() for i in range(PROBE, raw.size, ZERO_SCAN))


def probed(m: QuantModule) -> list[str]:
    """The tensors of module `m` whose first PROBE bytes zero_tensor_findings looks at."""
    return [t for r in PROBED if (t := m.tensors.get(r))]


def probe_reads(m: QuantModule) -> list[tuple[str, list[tuple[int, int]] | None]]:
    """What zero_tensor_findings reads of a module with data in it (TensorStore.prefetch)."""
    return [(t, [(0, PROBE)]) for t in probed(m)]


def probe_heads(src: Source, mods: Iterable[QuantModule]) -> set[str]:
    """The `zero_heads` of module_findings for modules `mods`: every probe of them read in one
    pass, each file opened once."""
    return src.store.zero_heads([t for m in mods for t in probed(m)], PROBE)


def zero_tensor_findings(src: Source, m: QuantModule, zero_heads: Set[str] | None = None
                         ) -> list[Finding]:
    """GQ318: qweight or scales all zero bytes, what a checkpoint saved before its weights were
    packed (or with a tensor filled in) holds: every weight of the module is 0 (scales) or
    -Z * scale (codes), and runtimes load it without a word. A real tensor has a nonzero byte
    in its first PROBE bytes (`zero_heads`: the tensors whose first bytes are zero, as
    probe_heads finds them), so only an empty one is read to its end."""
    if zero_heads is None:
        zero_heads = probe_heads(src, [m])
    if not zero_heads:   # no probe of any module read as zeros: a real checkpoint's case
        return []
    out = []
    for role in ("qweight", "scales"):
        t = m.tensors.get(role)
        if t is None or t not in zero_heads:
            continue
        raw = src.store.view(t).reshape(-1).view(np.uint8)
        if _all_zero_after_probe(raw):
            what = ("every code is 0, so every weight is -Z * scale" if role == "qweight" else
                    "every scale is 0, so every weight is 0")
            out.append(Finding("GQ318", f"all {raw.size} bytes are zero: {what}; a runtime "
                               "loads it and computes nothing of the model's", file=src.store.
                               file_of(t), tensor=t, hint="the tensor was never written: "
                               "re-export the checkpoint from its quantizer"))
    return out


def zero_point_findings(ckpt: Checkpoint, m: Module, v: ModuleVerdict,
                        settled_only: bool = False) -> list[Finding]:
    """GQ403, GQ405, GQ406, GQ407, GQ412, GQ414: what the verdict and its evidence say about
    the stored zero points (qzeros is the only tensor read here; `v` carries the codes'
    evidence).

    `settled_only` (inspect): when `v` rests on a sample of the codes (`v.complete` false), give
    only the findings that qzeros alone decide, which reading every row cannot take back."""
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
        sigs = v.signatures
        sig_ev = [e for e in v.evidence if any(k in e for k in ("AutoGPTQ", "GPTQModel",
                                                                "borrow"))] if sigs else []
    else:  # a sample of the codes: only the signatures that the stored fields alone show
        sigs, sig_ev = corruption_signatures(st, m.bits, codes=False) if st else ([], [])
        if v.pooled_runs and "autogptq_sign_extension" not in sigs:  # qzeros alone, pooled
            sigs, sig_ev = sigs + ["autogptq_sign_extension"], sig_ev + [v.pooled_runs]
    if sigs:
        out.append(Finding("GQ405", f"{', '.join(sigs)}: " + "; ".join(sig_ev),
                           file=file_qz, tensor=qz_name, details={"signatures": sigs}))
    # what the codes read show but do not settle: verify's GQ405 where inspect's sample shows
    # a signature, or fields at maxq above a wrapped zero too few of which disagree
    sampled = [g for g in v.signatures if g not in sigs] if partial and not sigs else []
    if sampled or (not sigs and st is not None and v.verdict != GPTQ_V2
                   and st.run_fields - st.run_fields_zero >= UNSETTLED_MIN):
        out.append(_unsettled_finding(ckpt, st, sampled, maxq, file_qz, qz_name, partial))
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
            f"{maxq_readings(m.bits, sep=', ')} ({st.wrapped} of them have codes "
            "that say Z = 0)", file=file_qz, tensor=qz_name,
            details={"fields": st.stored_maxq, "wrapped": st.wrapped}))
    if st is not None and v.verdict == GPTQ_V2 and st.stored_zero:
        out.append(Finding("GQ407", f"{st.stored_zero} zero points are 0; gptq cannot store "
                           "them (a conversion to gptq would change those groups)",
                           file=file_qz, tensor=qz_name, details={"fields": st.stored_zero}))
    return out


def _unsettled_finding(ckpt: Checkpoint, st, sampled: list[str], maxq: int, file_qz: str,
                       qz_name: str, partial: bool) -> Finding:
    """GQ423 (every code read) or GQ424 (inspect's sample): what the codes read show of a
    writer bug without settling it. Fields at maxq above a wrapped Z = 0 up to the top of their
    word are where AutoGPTQ's sign extension (or GPTQModel's borrow) puts maxq; a genuine gptq
    maxq has codes that say Z = 0, so those whose codes do not are suspect, but too few of them
    for the signature (GQ405) leave the file unable to tell. A sample's signature is verify's
    to settle."""
    n, bad = (st.run_fields, st.run_fields - st.run_fields_zero) if st is not None else (0, 0)
    what = (f"{n} fields store {maxq} above a wrapped Z = 0 up to the top of their word, as "
            f"AutoGPTQ's sign extension leaves them, and {bad} of them have codes that do not "
            "say Z = 0")
    details = {"fields": n, "codes_disagree": bad, "signatures": sampled}
    if partial:
        shown = (f"inspect's sample of the codes shows {', '.join(sampled)}" if sampled else
                 f"{what} in inspect's sample of the codes")
        return Finding("GQ424", f"{shown}: a writer bug is not ruled out", file=file_qz,
                       tensor=qz_name, details=details,
                       hint=f"gptqfmt verify {ckpt.store.root} reads every code and decides")
    return Finding("GQ423", f"{what}, too few to decide (a third would): their true zero "
                   "points cannot be told from the file", file=file_qz, tensor=qz_name,
                   details=details, hint="compare these fields with the checkpoint's source, "
                   "or re-quantize with a writer that masks Z - 1 (GPTQModel >= 7)")


def scale_findings(src: Source, m: QuantModule, zeros=None) -> list[Finding]:
    """GQ501: every scale finite and nonzero; GQ502 (where `zeros()` gives Z per cell, in
    the stored scales' layout): no dequantized weight beyond float16's range. Reads every
    scale once, as integers first: finite nonzero scales whose largest magnitude times 2^bits
    stays in range need nothing more (every Z and maxq - Z is at most 2^bits)."""
    t = m.tensors["scales"]
    raw = src.store.view(t)
    try:
        top = finite_nonzero_absmax(raw, m.scale_dtype)
        if top is not None and (zeros is None or top * (1 << m.bits) <= FP16_MAX):
            return []
        scales = to_float32(raw, m.scale_dtype)
    finally:
        src.store.release([t])
    file = src.store.file_of(t)
    bad = bad_scales(scales, file, t, src.scale_axes)
    if bad or zeros is None:
        return [bad] if bad else []
    z = zeros()
    reach = np.abs(scales) * np.maximum(z, code_max(m.bits) - z)
    over = reach > FP16_MAX
    if not over.any():
        return []
    g, n = np.unravel_index(int(np.argmax(reach)), reach.shape)
    return [Finding("GQ502", f"{int(over.sum())} groups can dequantize beyond float16's "
                    f"{FP16_MAX:g}; worst {float(reach[g, n]):.4g} at group {g}, column {n}",
                    file=file, tensor=t)]


# A scale's sign is data: w = s * (q - Z) holds for either sign, and the kernels multiply by
# the scale as stored (ModelCloud/GPTQModel@f4c327a17eb3: gptqmodel_ext/marlin/
# marlin_template.h scale() L107-114, __hmul2; gptqmodel_ext/exllamav2/cuda/
# q_gemm_kernel_gptq.cuh L173-176, fma with the group's scale). auto-round's symmetric
# quantizer writes negative scales on purpose (intel/auto-round v0.16.0, PyPI wheel sha256
# 750904817e750bfb: auto_round/data_type/int.py quant_tensor_sym L230-232, the scale takes the
# sign of the group's larger-magnitude extreme). No producer writes a NaN, an infinity or a
# 0: each keeps |scale| away from 0 (that quant_tensor_sym, q_scale_thresh; GPTQ's
# find_params widens an all-zero group to [-1, 1], gptqmodel/quantization/quantizer.py
# L123-125 at the same GPTQModel commit), and a 0 zeroes its whole group whatever the codes.
def bad_scales(scales: np.ndarray, file: str, tensor: str, axes: tuple[str, str]):
    """GQ501 when any scale (float32, 2-D, its axes named by `axes`) is NaN, infinite or
    zero, naming the first; None otherwise. Every format's scales go through here."""
    bad = ~np.isfinite(scales) | (scales == 0)
    if not bad.any():
        return None
    i, j = np.argwhere(bad)[0]
    return Finding("GQ501", f"{int(bad.sum())} of {scales.size} scales are NaN, infinite or "
                   f"zero (expected finite and nonzero); first at {axes[0]} {i}, {axes[1]} "
                   f"{j}: {scales[i, j]!r}", file=file, tensor=tensor,
                   hint="re-quantize the module from its unquantized weights")


def declared_findings(ckpt: Checkpoint, m: Module) -> list[Finding]:
    """GQ315, GQ316: the module's metadata (config, g_idx, name) against runtime expectations."""
    out: list[Finding] = []
    decl = m.declared
    if m.act_order is False and decl is not None and decl.desc_act is True and \
            not (ckpt.config and ckpt.config.static_groups) and m.groups > 1:
        out.append(Finding("GQ315", "config says desc_act=true but g_idx is k // group_size "
                           "(and static_groups is not set)",
                           file=ckpt.store.file_of(m.tensors["qzeros"]),
                           tensor=m.tensors.get("g_idx", m.tensors["qzeros"])))
    if m.name.endswith(ROUTER_SUFFIXES):
        out.append(Finding("GQ316", "a MoE router gate is quantized; vLLM and TGI expect it in "
                           "full precision", file=ckpt.store.file_of(m.tensors["qzeros"]),
                           tensor=m.tensors["qweight"]))
    return out


def _effective_zeros(ckpt: Checkpoint, m: Module, convention: str) -> np.ndarray:
    """Z per cell as vLLM reads it; the declared convention decides when the data do not."""
    if convention == AMBIGUOUS:
        convention = ckpt.label
    return effective_zeros(ckpt.stored_fields(m), m.bits, reference_rule(convention))


def zero_clamp_findings(ckpt: Checkpoint, m: Module, v: ModuleVerdict,
                        settled_only: bool = False) -> list[Finding]:
    """GQ506: a gptq module whose writer stored its zero points of 0 as 0 (detection's
    zero_clamp), which every runtime reads as Z = 1. The codes decide it: with `settled_only`
    (inspect) only on a verdict that read every row."""
    why = zero_clamp(v.stats, m.bits) if v.verdict == GPTQ else None
    if why is None or (settled_only and not v.complete):
        return []
    qz = m.tensors["qzeros"]
    assert v.stats is not None  # zero_clamp found fields in them
    return [Finding("GQ506", f"{why}; expected {code_max(m.bits)} (gptq's Z = 0), got 0, "
                    "which every runtime reads as Z = 1: each weight of those groups decodes "
                    "one scale step off", file=ckpt.store.file_of(qz), tensor=qz,
                    hint="re-export in a form that stores Z = 0 (gptq_v2, or auto-round's "
                    "auto_round format); no gptq field can say it",
                    details={"fields": v.stats.zero_clamped})]
