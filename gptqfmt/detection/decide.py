"""One module's verdict on its zero-point convention (gptq vs gptq_v2) from its evidence, never
a silent guess.

Three kinds of evidence, strongest first:

1. Symmetric patterns. Symmetric quantization sets Z = 2^(bits-1) in every group: `gptq` stores
   2^(bits-1) - 1 in every field (4-bit words 0x77777777), `gptq_v2` stores 2^(bits-1)
   (0x88888888). A whole module of one pattern decides it.
2. Zero-point statistics (stats.py): the median of mean(code) - stored sits near 1 under
   `gptq`, near 0 under `gptq_v2`.
3. Clamp and corruption signatures, which only `gptq` files have: stored maxq fields whose codes
   say Z = 0 (a wrapped zero: no `gptq_v2` writer stores Z = 0 as maxq); AutoGPTQ 0.7.1 sign
   extension (a wrapped field with every higher field of its word maxq although their codes say
   otherwise); GPTQModel's borrow (the field after a wrapped one stored 2 below its Z); and
   GPTQModel <= 6.0.3 3-bit constants (offsets that depend on the field position).

Where it stays `ambiguous`: modules with too few cells for the statistic to separate 0 from 1
(tiny layers at 8 bits, where a code step is small next to the spread of group means); files
whose zero points match neither convention (corruption). pool.py decides the checkpoint.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ..bits.conventions import GPTQ, GPTQ_V2, sym_field
from ..bits.packing import maxq as code_max
from .stats import ZeroStats

AMBIGUOUS = "ambiguous"  # the verdict where the evidence decides neither convention
MIN_Z = 4.0          # effective standard errors between the median and 0.5 for one module to decide
MAX_OFFSET = 0.35    # how far the median may sit from 0 or 1 and still count as that convention
# The statistic's spread around its convention's value that clean weights cause on top of the
# sampling error (skewed rows, one-signed groups, which cells are interior), in codes, per bits:
# the weights' own skew is a fraction of the scale, so it grows with 2^bits. Chosen so that the
# largest standardised residual of every clean module of the calibration corpus stays below 4.5
# (scripts/calibrate_detection.py --residuals: 4.03 at 8 bits over 256 models, about what the
# largest of that many Gaussian draws gives; figures in the README's detection section).
TAU = {2: 0.06, 3: 0.04, 4: 0.04, 8: 0.25}
# Zero points that do not follow the codes (random or scrambled ones) leave the median where it
# was but spread mean(code) - stored over the cells: a robust sigma above this fraction of maxq
# fits neither convention. Clean modules of the calibration corpus reach at most 0.054 (2 bits);
# random zero points 0.08 (2 bits) and 0.25 or more (3, 4, 8 bits). Judged only where each cell's
# mean rests on MIN_CODES codes or more (a sample's few codes per cell spread wider).
SPREAD_MAX = 0.15
MIN_CODES = 32



@dataclass(slots=True)   # one per module: tens of thousands in a MoE checkpoint
class ModuleVerdict:
    name: str
    verdict: str
    confidence: float
    evidence: list[str] = field(default_factory=list)
    stats: ZeroStats | None = None
    signatures: list[str] = field(default_factory=list)   # corruption kinds found
    pattern: str | None = None                            # symmetric pattern, if every field is
    inconsistent: bool = False      # the data contradict both conventions (corruption)
    # False when the verdict rests on a sample of the codes (inspect on a large module): reading
    # every row may change it (checks.zero_point_findings, settled_only)
    complete: bool = True
    llr: float = 0.0        # log-likelihood ratio gptq : gptq_v2 of the statistic (0 without one)
    misfit: float = 0.0     # |median - nearest convention's value| in effective standard errors
    outlier: bool = False   # misfit beyond what the checkpoint's module count explains (warning)
    # the evidence line when AutoGPTQ's runs were found over all modules' qzeros (combine);
    # later lines may follow it (adoption), so readers take it from here
    pooled_runs: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "verdict": self.verdict, "confidence": self.confidence,
                "evidence": self.evidence, "signatures": self.signatures,
                "llr": round(self.llr, 3), "misfit": round(self.misfit, 3),
                "stats": self.stats.to_json() if self.stats else None}


def _z_confidence(z: float) -> float:
    return round(math.erf(z / math.sqrt(2)), 4)


@lru_cache(maxsize=None)
def _symmetric_evidence(bits: int, pattern: str) -> str:
    """The evidence of a symmetric pattern: one string for every module that shows it."""
    return (f"every zero-point field is {sym_field(bits, pattern)}: the symmetric zero "
            f"{1 << (bits - 1)} stored as {pattern}")


def decide(name: str, bits: int, pattern: str | None, st: ZeroStats | None,
           quantizer: str | None = None) -> ModuleVerdict:
    """One module's verdict from its evidence."""
    if pattern is not None:
        return ModuleVerdict(name, pattern, 1.0, [_symmetric_evidence(bits, pattern)], st,
                             pattern=pattern)
    if st is None:
        return ModuleVerdict(name, AMBIGUOUS, 0.0, ["zero points are not one symmetric constant "
                                                    "and no codes were read"])
    sigs, ev = corruption_signatures(st, bits, quantizer)
    maxq = code_max(bits)
    if st.wrapped:
        ev.append(f"{st.wrapped} stored {maxq} fields whose codes say Z = 0 (a wrapped zero; "
                  f"only gptq writers store that)")
    if st.maxq_consistent:
        ev.append(f"{st.maxq_consistent} stored {maxq} fields whose codes say Z = {maxq} (gptq "
                  f"would read them as Z = {maxq + 1} or 0)")
    stat_verdict = None
    llr = misfit = 0.0
    if st.cells:
        sigma = effective_se(st.se, bits)
        z = abs(st.median - 0.5) / sigma
        nearest = GPTQ if st.median > 0.5 else GPTQ_V2
        off = abs(st.median - (1.0 if nearest == GPTQ else 0.0))
        # log N(median; 1, sigma^2) - log N(median; 0, sigma^2): what the module adds to the
        # checkpoint's evidence (combine pools it over modules)
        llr, misfit = (st.median - 0.5) / sigma**2, off / sigma
        ev.append(f"median of mean(code) - stored over {st.cells} cells is {st.median:.3f} "
                  f"(+/- {st.se:.3f} sampling, {sigma:.3f} with the weights' own skew): gptq "
                  "predicts 1, gptq_v2 predicts 0")
        if st.codes_per_cell >= MIN_CODES and st.spread > SPREAD_MAX * maxq:
            ev.append(f"the zero points do not follow the codes: mean(code) - stored spreads "
                      f"over {st.spread:.2f} codes ({st.spread / maxq:.2f} of maxq; clean "
                      f"modules stay below {SPREAD_MAX})")
            if bits == 3 and quantizer_is_old_gptqmodel(quantizer) and not sigs:
                sigs.append("gptqmodel_603_3bit")  # too few cells per position to show it
                ev.append(f"meta.quantizer is {quantizer}: GPTQModel <= 6.0.3 packed 3-bit "
                          "constants with words 0 and 2 swapped, which scrambles them")
            return ModuleVerdict(name, AMBIGUOUS, 0.0, ev, st, sigs, inconsistent=not sigs,
                                 misfit=misfit)
        if off > MAX_OFFSET and misfit >= MIN_Z:
            ev.append(f"the codes sit {off:.2f} away from either convention's zero "
                      f"({misfit:.1f} standard errors)")
            llr = 0.0  # evidence for neither convention is not evidence for the nearer one
        elif off > MAX_OFFSET:
            ev.append(f"too little evidence: the median sits {off:.2f} from either zero")
        elif st.position_spread > 0.75:
            ev.append(f"the offset varies by {st.position_spread:.2f} across field positions: "
                      "the zero points were not packed field by field")
            llr = 0.0
        elif z >= MIN_Z:
            stat_verdict = (nearest, _z_confidence(z))
        else:
            ev.append(f"too little evidence alone: {z:.1f} standard errors from the midpoint "
                      f"(needs {MIN_Z:.0f}); pooled with the other modules")
    clamp = clamp_verdict(st, sigs)
    if stat_verdict and clamp and stat_verdict[0] != clamp[0]:
        ev.append(f"the statistic says {stat_verdict[0]} but the stored {maxq} fields say "
                  f"{clamp[0]}")
        return ModuleVerdict(name, AMBIGUOUS, 0.0, ev, st, sigs, inconsistent=True, llr=0.0,
                             misfit=misfit)
    if stat_verdict:
        return ModuleVerdict(name, stat_verdict[0], stat_verdict[1], ev, st, sigs, llr=llr,
                             misfit=misfit)
    if clamp and not (misfit >= MIN_Z and not sigs):
        return ModuleVerdict(name, clamp[0], clamp[1], ev, st, sigs, llr=llr, misfit=misfit)
    return ModuleVerdict(name, AMBIGUOUS, 0.0, ev, st, sigs, llr=llr, misfit=misfit)


def effective_se(se: float, bits: int) -> float:
    """The statistic's standard error with the weights' own skew added (TAU)."""
    return math.hypot(se, TAU.get(bits, TAU[8]))


def clamp_verdict(st: ZeroStats, sigs: list[str]) -> tuple[str, float] | None:
    """What the stored maxq fields say. A clean gptq file stores maxq only for Z = 0 (codes
    low: 'wrapped'); a gptq_v2 file only for Z = maxq (codes high). A few fields of each kind
    occur by chance (a Z = 0 group whose codes sit high, a sample of few codes), so the side
    with at least 3 fields and 80 % of them decides; a known writer bug decides gptq."""
    if sigs:
        return GPTQ, 0.99
    w, c = st.wrapped, st.maxq_consistent
    if w >= 3 and w >= 0.8 * (w + c):
        return GPTQ, 0.95
    if c >= 3 and c >= 0.8 * (w + c):
        return GPTQ_V2, 0.95
    return None


def corruption_signatures(st: ZeroStats, bits: int, quantizer: str | None = None,
                          codes: bool = True) -> tuple[list[str], list[str]]:
    """(signature names, evidence lines) of the known writer bugs that `st` shows.

    With `codes=False`, only what the stored fields alone show (AutoGPTQ's runs of maxq at the
    top of words): the evidence that does not change when more qweight rows are read."""
    sigs: list[str] = []
    ev: list[str] = []
    maxq = code_max(bits)
    runs = st.top_runs >= 3 and st.top_runs > 10 * runs_by_chance(st) + 2
    # GPTQModel <= 6.0.3's 3-bit words 0 and 2 swapped (below) leave maxq fields anywhere: its
    # signature explains them, no run of its words is another writer's
    scrambled = bits == 3 and quantizer_is_old_gptqmodel(quantizer)
    sign_extension = st.sign_extension if codes and not scrambled else 0
    runs = runs and not scrambled
    # GPTQModel packs by a packed subtract, never by OR: in its files maxq fields above a
    # wrapped Z = 0 are its borrow running through fields of Z = 1, not AutoGPTQ's sign
    # extension (the same words, another writer)
    if sign_extension or runs:
        borrow = quantizer_is_gptqmodel(quantizer)
        sigs.append("gptqmodel_borrow" if borrow else "autogptq_sign_extension")
        why = (f"meta.quantizer is {quantizer}: GPTQModel's packed subtract borrowed through "
               "them" if borrow else "AutoGPTQ 0.7.1 sign extension overwrote them")
    if sign_extension:
        ev.append(f"{st.sign_extension} qzeros words hold a wrapped Z = 0 with every higher "
                  f"field {maxq} although their codes disagree ({why})")
    if runs:
        ev.append(f"{st.top_runs} qzeros words end in a run of fields at {maxq} "
                  f"({st.top_runs_expected:.2g} expected by chance): {why}")
    if not codes:
        return sigs, ev
    base = st.median if math.isfinite(st.median) else 1.0
    # judged on 8 fields or more, with cell means of MIN_CODES codes or more and the weights'
    # own skew in the error: fewer gave false borrows on clean 4-bit models
    # (scripts/calibrate_detection.py)
    if "gptqmodel_borrow" not in sigs and st.borrow_cells >= 8 and \
            st.codes_per_cell >= MIN_CODES and \
            abs(st.borrow_offset - base - 1) < 0.3 and (st.borrow_offset - base) / max(
                st.borrow_se, effective_se(st.se, bits), 1e-3) >= MIN_Z:
        sigs.append("gptqmodel_borrow")
        ev.append(f"fields right after a wrapped zero sit {st.borrow_offset:.2f} below their "
                  f"codes (GPTQModel's packed subtract borrowed from them)")
    if st.position_spread > 0.75 and quantizer_is_old_gptqmodel(quantizer):
        sigs.append("gptqmodel_603_3bit")
        ev.append(f"zero offsets vary by {st.position_spread:.2f} across field positions and "
                  f"meta.quantizer is {quantizer}: GPTQModel <= 6.0.3 packed 3-bit constants "
                  "with words 0 and 2 swapped")
    return sigs, ev


def runs_by_chance(st: ZeroStats) -> float:
    """The module's AutoGPTQ runs expected by chance, which field_counts computes for every
    module with RUNS_CHANCE_MIN runs or more (ValueError where it was left out)."""
    if st.top_runs_expected is None:
        raise ValueError(f"{st.top_runs} runs, and their number by chance not computed")
    return st.top_runs_expected


def quantizer_is_gptqmodel(quantizer: str | None) -> bool:
    """True for meta.quantizer 'gptqmodel:X' (any version)."""
    return (quantizer or "").lower().startswith("gptqmodel:")


ZERO_CLAMP_MIN = 3   # clamped fields for the signature: fewer are a Z = 1 group's chance


def zero_clamp(st: ZeroStats | None, bits: int) -> str | None:
    """The evidence line when a gptq module's stored 0 fields hold zero points of 0: the writer
    stored Z - 1 clamped at 0 (stats.zero_clamped counts them, at 2 bits), so every runtime
    reads them as Z = 1; None when the data do not show it.

    Decided only where no field stores maxq. A clamping writer never does (Z - 1 <= maxq - 1);
    every other gptq writer stores a Z = 0 as maxq (masked, sign-extended or borrowed), so in
    its files low-coded stored 0s beside maxq fields are Z = 1 groups whose bulk sits at code 0
    by chance, and inspect's sampled modules (stored_maxq not counted) decide nothing."""
    if st is None or st.zero_clamped < ZERO_CLAMP_MIN or st.stored_maxq != 0:
        return None
    return (f"{st.zero_clamped} fields store 0 whose codes say Z = 0, and no field stores "
            f"{code_max(bits)}: a writer that clamps Z - 1 at 0 (auto-round 0.16's gptq export)")


def quantizer_is_old_gptqmodel(quantizer: str | None) -> bool:
    """True for meta.quantizer 'gptqmodel:X' with X <= 6.0.3 ('v6.0.0', '6.0.3-rc1' and '6'
    included)."""
    m = re.match(r"gptqmodel:v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", (quantizer or "").lower())
    if not m:
        return False
    return tuple(int(p or 0) for p in m.groups()) <= (6, 0, 3)
