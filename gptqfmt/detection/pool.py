"""The checkpoint's convention from every module's verdict (combine): modules that decide alone
must agree, the statistics of the rest are pooled, misfits are judged against the module count,
and AutoGPTQ's sign-extension runs are counted over all modules' qzeros.

Where it stays `ambiguous`: checkpoints whose modules disagree, and those whose pooled evidence
decides neither convention.
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, replace
from operator import attrgetter
from statistics import NormalDist
from typing import Any

from ..bits.conventions import GPTQ, GPTQ_V2
from .decide import AMBIGUOUS, MAX_OFFSET, MIN_Z, ModuleVerdict, runs_by_chance

# AutoGPTQ's runs are judged over the whole checkpoint once its modules hold this many
POOLED_RUNS_MIN = 10
MIN_LLR = math.log(1e4)  # pooled log-likelihood ratio (10^4 : 1) for a checkpoint to decide
# Chance, per clean checkpoint, of calling one of its modules a misfit: the per-module threshold
# is Bonferroni-corrected for the number of modules tested, so it survives hundreds of them.
MISFIT_ALPHA = 1e-4
MISFIT_STRONG = 3.0  # effective standard errors beyond that threshold for an error, not a warning


@dataclass
class Detection:
    verdict: str
    confidence: float
    modules: list[ModuleVerdict]
    evidence: list[str]

    def to_json(self) -> dict[str, Any]:
        return {"detected": self.verdict, "confidence": self.confidence,
                "evidence": self.evidence}


def combine(verdicts: list[ModuleVerdict]) -> Detection:
    """One verdict for the checkpoint from every module's evidence, and the modules' verdicts
    in its light (new ModuleVerdicts; the inputs are not changed).

    - Modules that decide alone (a symmetric pattern, clamp evidence, or a statistic MIN_Z
      effective standard errors from the midpoint) must agree; if they do not, the checkpoint
      is ambiguous ("modules disagree").
    - Otherwise the statistic's log-likelihood ratios are summed over modules: at 8 bits a
      module's statistic rarely decides alone, but a few hundred of them decide together. The
      checkpoint decides at MIN_LLR.
    - A module undecided alone takes the checkpoint's convention unless its own evidence points
      the other way by MIN_Z.
    - A module is a misfit (fits neither convention) only when its statistic lies further from
      the nearer convention than the module count explains: beyond the Bonferroni threshold for
      MISFIT_ALPHA per checkpoint, an outlier (warning); MISFIT_STRONG beyond it, inconsistent
      (error). A known writer bug (signature) explains a misfit and is reported as such.
    """
    if not verdicts:
        return Detection(AMBIGUOUS, 0.0, [], ["no quantized module to look at"])
    # passes over the modules in C (map, attrgetter): a mixture of experts has tens of
    # thousands
    found = Counter(map(attrgetter("verdict"), verdicts))
    counts = {c: found[c] for c in (GPTQ, GPTQ_V2, AMBIGUOUS)}
    n = len(verdicts)
    summary = (f"{counts[GPTQ]} gptq, {counts[GPTQ_V2]} gptq_v2, {counts[AMBIGUOUS]} undecided "
               f"alone of {n} modules")
    llrs = list(map(attrgetter("llr"), verdicts))
    pooled = sum(llrs)
    pool_ev = (f"pooled log-likelihood ratio gptq : gptq_v2 over "
               f"{sum(map(bool, llrs))} module statistics is {pooled:.1f} "
               f"(decides at +/-{MIN_LLR:.1f})")
    flagged = _pooled_runs(_misfits(verdicts))
    if counts[GPTQ] and counts[GPTQ_V2]:
        return Detection(AMBIGUOUS, 0.0, flagged, [summary + ": modules disagree"])
    verdict, confidence = AMBIGUOUS, 0.0
    for conv in (GPTQ, GPTQ_V2):
        if counts[conv]:
            verdict = conv
            confidence = min(v.confidence for v in verdicts if v.verdict == conv)
    if verdict != AMBIGUOUS and abs(pooled) >= MIN_LLR and (pooled > 0) != (verdict == GPTQ):
        return Detection(AMBIGUOUS, 0.0, flagged, [
            summary, pool_ev + f": the undecided modules together say the opposite of the "
            f"{counts[verdict]} that decide; modules disagree"])
    if verdict == AMBIGUOUS and abs(pooled) >= MIN_LLR:
        verdict = GPTQ if pooled > 0 else GPTQ_V2
        confidence = round(1.0 - math.exp(-abs(pooled)), 4)
    if verdict == AMBIGUOUS:
        return Detection(AMBIGUOUS, 0.0, flagged, [summary, pool_ev])
    return Detection(verdict, confidence, [_adopt(v, verdict, confidence) for v in flagged],
                     [summary, pool_ev])


def _adopt(v: ModuleVerdict, verdict: str, confidence: float) -> ModuleVerdict:
    """A module undecided alone takes the checkpoint's verdict, unless it fits neither
    convention, its offsets vary by field position, or nothing was read of it. (A module whose
    own statistic points the other way by MIN_Z decided alone, and then combine reports the
    disagreement.)"""
    st = v.stats
    if v.verdict != AMBIGUOUS or v.inconsistent or v.outlier or st is None \
            or v.misfit >= MIN_Z or st.position_spread > 0.75:
        return v
    return replace(v, verdict=verdict, confidence=confidence, evidence=v.evidence + [
        f"{verdict} with the checkpoint's other modules (pooled evidence)"])


def _pooled_runs(verdicts: list[ModuleVerdict]) -> list[ModuleVerdict]:
    """AutoGPTQ's sign-extension runs over all modules' qzeros: a small module shows a few runs
    (too few alone), a checkpoint of them shows many. Decided when the modules together hold
    at least 10 runs, 3 times what chance gives, with a Poisson tail below 1e-9; the modules
    with more runs than chance then carry the signature. (Found from qzeros alone, so inspect
    reports it as verify does.)"""
    stats = [v.stats for v in verdicts if v.stats is not None]
    top = sum(st.top_runs for st in stats)
    if top < POOLED_RUNS_MIN:
        return verdicts
    if any(st.top_runs_expected is None for st in stats):
        raise ValueError("the pooled runs test needs every module's runs by chance: fill in "
                         "runs_chance_missing(verdicts) before combine")
    expected = sum(runs_by_chance(st) for st in stats)
    if top < 3 * expected or _poisson_tail(top, expected) >= 1e-9:
        return verdicts
    out = []
    for v in verdicts:
        st = v.stats
        if st is None or "autogptq_sign_extension" in v.signatures or \
                st.top_runs < 2 or st.top_runs <= 2 * runs_by_chance(st) + 1:
            out.append(v)
            continue
        line = (f"{st.top_runs} qzeros words end in a run of fields at maxq "
                f"({st.top_runs_expected:.2g} expected by chance; {top} against "
                f"{expected:.2g} over the checkpoint): AutoGPTQ 0.7.1 sign extension "
                "overwrote the fields above a Z = 0")
        out.append(replace(v, signatures=v.signatures + ["autogptq_sign_extension"],
                           pooled_runs=line, inconsistent=False, outlier=False,
                           evidence=v.evidence + [line]))
    return out


def runs_chance_missing(verdicts: list[ModuleVerdict]) -> list[int]:
    """Indices of the modules whose runs by chance the pooled runs test needs and field_counts
    left out (chance=None): every such module once the checkpoint's runs reach POOLED_RUNS_MIN,
    else none. Fill them in with with_runs_chance before combine."""
    stats = [v.stats for v in verdicts]
    if sum(st.top_runs for st in stats if st is not None) < POOLED_RUNS_MIN:
        return []
    return [i for i, st in enumerate(stats) if st is not None and st.top_runs_expected is None]


def with_runs_chance(v: ModuleVerdict, expected: float) -> ModuleVerdict:
    """`v` with its runs by chance filled in (a module whose own runs fell below
    RUNS_CHANCE_MIN: its verdict does not depend on it)."""
    assert v.stats is not None
    return replace(v, stats=replace(v.stats, top_runs_expected=expected))


def _poisson_tail(k: int, mean: float) -> float:
    """P(X >= k) for X ~ Poisson(mean), from the log of the first term (k well above mean)."""
    if mean <= 0:
        return 0.0
    log_term = -mean + k * math.log(mean) - math.lgamma(k + 1)
    return min(1.0, math.exp(log_term) / max(1e-12, 1 - mean / (k + 1)))


def misfit_threshold(n_modules: int) -> float:
    """Effective standard errors beyond which one of `n_modules` clean modules lies with
    probability MISFIT_ALPHA (two-sided, Bonferroni)."""
    return NormalDist().inv_cdf(1.0 - MISFIT_ALPHA / (2 * max(1, n_modules)))


def _misfits(verdicts: list[ModuleVerdict]) -> list[ModuleVerdict]:
    tested = [v for v in verdicts if v.stats is not None and v.stats.cells]
    if not tested:   # every module decided from qzeros alone: none is a misfit
        return list(verdicts)
    limit = misfit_threshold(len(tested))
    out = []
    for v in verdicts:
        st = v.stats
        if st is None or not st.cells or v.signatures or v.inconsistent:
            out.append(v)
            continue
        off = min(abs(st.median - 1.0), abs(st.median))
        if off <= MAX_OFFSET or v.misfit < limit:
            out.append(v)
            continue
        strong = v.misfit >= limit + MISFIT_STRONG
        note = (f"{v.misfit:.1f} standard errors from the nearer convention, beyond the "
                f"{limit:.1f} that {len(tested)} clean modules reach with probability "
                f"{MISFIT_ALPHA:g}")
        out.append(replace(v, verdict=AMBIGUOUS, confidence=0.0, inconsistent=strong,
                           outlier=not strong, evidence=v.evidence + [note]))
    return out
