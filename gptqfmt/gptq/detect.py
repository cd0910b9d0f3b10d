"""Evidence for the zero-point convention (gptq vs gptq_v2) from the data, never a silent guess.

Three kinds of evidence, strongest first:

1. Symmetric patterns. Symmetric quantization sets Z = 2^(bits-1) in every group: `gptq` stores
   2^(bits-1) - 1 in every field (4-bit words 0x77777777), `gptq_v2` stores 2^(bits-1)
   (0x88888888). A whole module of one pattern decides it.
2. Zero-point statistics. Weights in a group are close to zero-mean, so the mean code of a cell
   (group x output column) sits near the true Z: mean(code) - stored is near 0 under `gptq_v2`
   and near 1 under `gptq`. The median over cells with an interior stored value (0 < s < maxq)
   is robust to the few clamped or corrupted cells; its standard error comes from the spread.
3. Clamp and corruption signatures, which only `gptq` files have: stored maxq fields whose codes
   say Z = 0 (a wrapped zero: no `gptq_v2` writer stores Z = 0 as maxq); AutoGPTQ 0.7.1 sign
   extension (a wrapped field with every higher field of its word maxq although their codes say
   otherwise); GPTQModel's borrow (the field after a wrapped one stored 2 below its Z); and
   GPTQModel <= 6.0.3 3-bit constants (offsets that depend on the field position).

Where it stays `ambiguous`: modules with too few cells for the statistic to separate 0 from 1
(tiny layers at 8 bits, where a code step is small next to the spread of group means); files
whose zero points match neither convention (corruption); checkpoints whose modules disagree.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import numpy as np

from .packing import block, constant_words, unpack, unsigned

GPTQ, GPTQ_V2, AMBIGUOUS = "gptq", "gptq_v2", "ambiguous"
MIN_Z = 4.0          # standard errors between the median and the 0.5 threshold to decide
MAX_OFFSET = 0.35    # how far the median may sit from 0 or 1 and still count as that convention


def sym_field(bits: int, convention: str) -> int:
    """The stored field of a symmetric zero point under `convention`."""
    return (1 << (bits - 1)) - (1 if convention == GPTQ else 0)


def symmetric_pattern(qzeros: np.ndarray, bits: int) -> str | None:
    """GPTQ or GPTQ_V2 when every field is that convention's symmetric zero, else None."""
    w = qzeros.dtype.itemsize * 8
    _, wpb = block(bits, w)
    u = unsigned(np.asarray(qzeros))
    if u.size == 0 or u.shape[-1] % wpb:
        return None
    blocks = u.reshape(-1, wpb)
    for conv in (GPTQ, GPTQ_V2):
        if np.array_equal(blocks, np.broadcast_to(constant_words(sym_field(bits, conv), bits, w),
                                                  blocks.shape)):
            return conv
    return None


@dataclass
class ZeroStats:
    """What the codes say about one module's stored zero points.

    stored_maxq, stored_zero and top_runs need no codes: they count every field of qzeros, so
    inspect (a sample of codes) and verify (all codes) agree on them. The rest are over the cells
    whose codes were read."""
    cells: int = 0                 # interior cells in the statistic
    median: float = math.nan       # median of mean(code) - stored over interior cells
    se: float = math.inf           # its standard error
    stored_maxq: int = 0           # fields stored as maxq (all of qzeros)
    stored_zero: int = 0           # fields stored as 0 (all of qzeros)
    wrapped: int = 0               # stored maxq, codes say Z = 0
    maxq_consistent: int = 0       # stored maxq, codes say Z = maxq
    sign_extension: int = 0        # words with AutoGPTQ's sign-extension signature
    top_runs: int = 0              # words whose top fields are all maxq (all of qzeros)
    top_runs_expected: float = 0.0  # the same count if maxq fields fell independently
    borrow_offset: float = math.nan  # median offset of fields right after a wrapped one
    borrow_cells: int = 0
    borrow_se: float = math.inf
    position_spread: float = 0.0   # spread of per-field-position medians

    def to_json(self) -> dict:
        out = {}
        for k, v in self.__dict__.items():
            out[k] = None if isinstance(v, float) and not math.isfinite(v) else (
                round(v, 4) if isinstance(v, float) else v)
        return out


def zero_stats(stored: np.ndarray, sums: np.ndarray, counts: np.ndarray, bits: int,
               word_bits: int) -> ZeroStats:
    """Summarise cells: `stored` [G, N] unpacked qzeros fields, `sums` [G, N] code sums over
    `counts` [G] codes per cell. Rows with count 0 (codes not read) enter only the counts that
    need no codes (stored_maxq, stored_zero, top_runs)."""
    maxq = (1 << bits) - 1
    st = ZeroStats(stored_maxq=int(np.count_nonzero(stored == maxq)),
                   stored_zero=int(np.count_nonzero(stored == 0)))
    if st.stored_maxq and bits != 3:
        st.top_runs, st.top_runs_expected = _top_runs(stored, bits, word_bits, maxq)
    have = counts > 0
    if not have.any():
        return st
    if not have.all():
        stored, sums, counts = stored[have], sums[have], counts[have]
    m = sums.astype(np.float32) / counts[:, None].astype(np.float32)
    d = m - stored
    interior = (stored > 0) & (stored < maxq)
    di = d[interior]
    if di.size:
        q1, med, q3 = _quartiles(di)
        st.cells, st.median = int(di.size), med
        spread = (q3 - q1) / 1.349  # the IQR of a normal sample, as a robust sigma
        st.se = 1.2533 * max(spread, 1e-3) / math.sqrt(di.size)
    at_max = stored == maxq
    if at_max.any():
        low = m < maxq / 2
        st.wrapped = int(np.count_nonzero(at_max & low))
        st.maxq_consistent = int(np.count_nonzero(at_max & ~low))
        if bits >= 4 and st.wrapped:  # at 2 bits a code step is too coarse to tell
            _word_signatures(st, stored, m, d, at_max, low, bits, word_bits, maxq)
    if bits == 3:
        st.position_spread = _position_spread(d, interior, bits, word_bits)
    return st


def _quartiles(x: np.ndarray) -> tuple[float, float, float]:
    """Lower quartile, median, upper quartile (nearest rank) of a scratch array, in one
    partition; `x` is reordered."""
    n = x.size
    ks = sorted({(n - 1) // 4, (n - 1) // 2, n // 2, (3 * (n - 1)) // 4})
    x.partition(ks)
    med = (float(x[(n - 1) // 2]) + float(x[n // 2])) / 2
    return float(x[(n - 1) // 4]), med, float(x[(3 * (n - 1)) // 4])


def _top_runs(s, bits, word_bits, maxq) -> tuple[int, float]:
    """Words whose highest fields are all maxq, against the count expected by chance.

    AutoGPTQ 0.7.1 ORs Z - 1 = 0xFFFFFFFF into the word, so a Z = 0 at field j sets every field
    from j to the top: runs up to the top word boundary, far more than independent fields give.
    Needs no codes, so it works at 2 bits too."""
    fpw = word_bits // bits
    if s.shape[1] % fpw or fpw < 2:
        return 0, 0.0
    at = s.reshape(-1, fpw) == maxq
    run = max(2, min(4, fpw // 2))
    top = np.logical_and.reduce(at[:, fpw - run:], axis=1)
    return int(top.sum()), float(at.shape[0] * at.mean() ** run)


def _word_signatures(st, s, m, d, at_max, low, bits, word_bits, maxq):
    """AutoGPTQ sign extension and GPTQModel borrow, on the qzeros words that hold a wrapped
    zero (2/4/8 bits: a word holds W/bits whole fields)."""
    fpw = word_bits // bits
    if s.shape[1] % fpw:
        return
    shape = (-1, fpw)
    at_max, low, m, d, s = (a.reshape(shape) for a in (at_max, low, m, d, s))
    wrapped = at_max & low
    words = np.flatnonzero(wrapped.any(axis=1))
    at_max, low, m, d, s, wrapped = (a[words] for a in (at_max, low, m, d, s, wrapped))
    # all fields from j to the top of the word are maxq
    top_run = np.logical_and.accumulate(at_max[:, ::-1], axis=1)[:, ::-1]
    impossible = at_max & (m > 0.3 * maxq) & (m < 0.7 * maxq)  # neither Z = 0 nor Z = 2^bits
    above = np.zeros_like(impossible)
    above[:, :-1] = np.logical_or.accumulate(impossible[:, :0:-1], axis=1)[:, ::-1]
    st.sign_extension = int((wrapped & top_run & above).any(axis=1).sum())
    nxt = np.zeros_like(wrapped)
    nxt[:, 1:] = wrapped[:, :-1]
    nxt &= (s > 0) & (s < maxq)
    if nxt.sum() >= 3:
        dn = d[nxt]
        st.borrow_cells = int(dn.size)
        q1, st.borrow_offset, q3 = _quartiles(dn)
        st.borrow_se = 1.2533 * (q3 - q1) / 1.349 / math.sqrt(dn.size)


def _position_spread(d, interior, bits, word_bits) -> float:
    """Max minus min of per-field-position medians (positions within one block of words)."""
    vpb, _ = block(bits, word_bits)
    if d.shape[1] % vpb or vpb < 2:
        return 0.0
    d3 = d.reshape(d.shape[0], -1, vpb)
    i3 = interior.reshape(d3.shape)
    meds = []
    for p in range(vpb):
        sel = d3[..., p][i3[..., p]]
        if sel.size >= 8:
            meds.append(float(np.median(sel)))
    return max(meds) - min(meds) if len(meds) >= 2 else 0.0


@dataclass
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
    # every row may change it (validate.zero_point_findings, settled_only)
    complete: bool = True

    def to_json(self):
        return {"name": self.name, "verdict": self.verdict, "confidence": self.confidence,
                "evidence": self.evidence, "signatures": self.signatures,
                "stats": self.stats.to_json() if self.stats else None}


def _z_confidence(z: float) -> float:
    return round(math.erf(z / math.sqrt(2)), 4)


def decide(name: str, bits: int, pattern: str | None, st: ZeroStats | None,
           quantizer: str | None = None) -> ModuleVerdict:
    """One module's verdict from its evidence."""
    if pattern is not None:
        f = sym_field(bits, pattern)
        return ModuleVerdict(name, pattern, 1.0, [
            f"every zero-point field is {f}: the symmetric zero {1 << (bits - 1)} stored as "
            f"{pattern}"], st, pattern=pattern)
    if st is None:
        return ModuleVerdict(name, AMBIGUOUS, 0.0, ["zero points are not one symmetric constant "
                                                    "and no codes were read"])
    sigs, ev = corruption_signatures(st, bits, quantizer)
    inconsistent = False
    maxq = (1 << bits) - 1
    if st.wrapped:
        ev.append(f"{st.wrapped} stored {maxq} fields whose codes say Z = 0 (a wrapped zero; "
                  f"only gptq writers store that)")
    if st.maxq_consistent:
        ev.append(f"{st.maxq_consistent} stored {maxq} fields whose codes say Z = {maxq} (gptq "
                  f"would read them as Z = {maxq + 1} or 0)")
    stat_verdict = None
    if st.cells:
        z = abs(st.median - 0.5) / st.se
        nearest = GPTQ if st.median > 0.5 else GPTQ_V2
        off = abs(st.median - (1.0 if nearest == GPTQ else 0.0))
        ev.append(f"median of mean(code) - stored over {st.cells} cells is {st.median:.3f} "
                  f"(+/- {st.se:.3f}): gptq predicts 1, gptq_v2 predicts 0")
        if off > MAX_OFFSET and z >= MIN_Z:
            ev.append(f"the codes sit {off:.2f} away from either convention's zero")
            inconsistent = True
        elif off > MAX_OFFSET:
            ev.append(f"too little evidence: the median sits {off:.2f} from either zero")
        elif st.position_spread > 0.75:
            ev.append(f"the offset varies by {st.position_spread:.2f} across field positions: "
                      "the zero points were not packed field by field")
        elif z >= MIN_Z:
            stat_verdict = (nearest, _z_confidence(z))
        else:
            ev.append(f"too little evidence: {z:.1f} standard errors from the midpoint "
                      f"(needs {MIN_Z:.0f})")
    inconsistent = inconsistent and not sigs  # a known writer bug explains the misfit
    # Clamp evidence: a clean gptq file stores maxq only for Z = 0 (codes low); a gptq_v2 file
    # stores maxq only for Z = maxq (codes high).
    # Corruption in gptq files also leaves maxq fields with high codes, so a wrapped zero
    # outweighs them; gptq_v2 needs maxq fields with high codes and not one wrapped zero.
    clamp = None
    if sigs or st.wrapped >= 3:
        clamp = (GPTQ, 0.99 if sigs else 0.95)
    elif st.maxq_consistent >= 3 and st.wrapped == 0:
        clamp = (GPTQ_V2, 0.95)
    if stat_verdict and clamp and stat_verdict[0] != clamp[0]:
        ev.append(f"the statistic says {stat_verdict[0]} but the stored {maxq} fields say "
                  f"{clamp[0]}")
        return ModuleVerdict(name, AMBIGUOUS, 0.0, ev, st, sigs, inconsistent=True)
    if stat_verdict:
        return ModuleVerdict(name, stat_verdict[0], stat_verdict[1], ev, st, sigs)
    if clamp and not inconsistent:
        return ModuleVerdict(name, clamp[0], clamp[1], ev, st, sigs)
    return ModuleVerdict(name, AMBIGUOUS, 0.0, ev, st, sigs, inconsistent=inconsistent)


def corruption_signatures(st: ZeroStats, bits: int, quantizer: str | None = None,
                          codes: bool = True) -> tuple[list[str], list[str]]:
    """(signature names, evidence lines) of the known writer bugs that `st` shows.

    With `codes=False`, only what the stored fields alone show (AutoGPTQ's runs of maxq at the
    top of words): the evidence that does not change when more qweight rows are read."""
    sigs: list[str] = []
    ev: list[str] = []
    maxq = (1 << bits) - 1
    runs = st.top_runs >= 3 and st.top_runs > 10 * st.top_runs_expected + 2
    sign_extension = st.sign_extension if codes else 0
    if sign_extension or runs:
        sigs.append("autogptq_sign_extension")
    if sign_extension:
        ev.append(f"{st.sign_extension} qzeros words with AutoGPTQ 0.7.1 sign extension: a "
                  f"wrapped Z = 0 with every higher field {maxq} although their codes disagree")
    if runs:
        ev.append(f"{st.top_runs} qzeros words end in a run of fields at {maxq} "
                  f"({st.top_runs_expected:.2g} expected by chance): AutoGPTQ 0.7.1 sign "
                  "extension overwrote the fields above a Z = 0")
    if not codes:
        return sigs, ev
    base = st.median if math.isfinite(st.median) else 1.0
    if st.borrow_cells >= 3 and abs(st.borrow_offset - base - 1) < 0.3 and \
            (st.borrow_offset - base) / max(st.borrow_se, st.se, 1e-3) >= MIN_Z:
        sigs.append("gptqmodel_borrow")
        ev.append(f"fields right after a wrapped zero sit {st.borrow_offset:.2f} below their "
                  f"codes (GPTQModel's packed subtract borrowed from them)")
    if st.position_spread > 0.75 and quantizer_is_old_gptqmodel(quantizer):
        sigs.append("gptqmodel_603_3bit")
        ev.append(f"zero offsets vary by {st.position_spread:.2f} across field positions and "
                  f"meta.quantizer is {quantizer}: GPTQModel <= 6.0.3 packed 3-bit constants "
                  "with words 0 and 2 swapped")
    return sigs, ev


def quantizer_is_old_gptqmodel(quantizer: str | None) -> bool:
    """True for meta.quantizer 'gptqmodel:X' with X <= 6.0.3 ('v6.0.0', '6.0.3-rc1' and '6'
    included)."""
    m = re.match(r"gptqmodel:v?(\d+)(?:\.(\d+))?(?:\.(\d+))?", (quantizer or "").lower())
    if not m:
        return False
    return tuple(int(p or 0) for p in m.groups()) <= (6, 0, 3)


@dataclass
class Detection:
    verdict: str
    confidence: float
    modules: list[ModuleVerdict]
    evidence: list[str]

    def to_json(self):
        return {"detected": self.verdict, "confidence": self.confidence,
                "evidence": self.evidence}


def combine(verdicts: list[ModuleVerdict]) -> Detection:
    """One verdict for the checkpoint. Decided modules must agree; undecided ones are pooled
    (inverse-variance weighted medians) when no module decided."""
    if not verdicts:
        return Detection(AMBIGUOUS, 0.0, [], ["no quantized module to look at"])
    counts = {c: sum(v.verdict == c for v in verdicts) for c in (GPTQ, GPTQ_V2, AMBIGUOUS)}
    n = len(verdicts)
    summary = (f"{counts[GPTQ]} gptq, {counts[GPTQ_V2]} gptq_v2, {counts[AMBIGUOUS]} ambiguous "
               f"of {n} modules")
    if counts[GPTQ] and counts[GPTQ_V2]:
        return Detection(AMBIGUOUS, 0.0, verdicts, [summary + ": modules disagree"])
    for conv in (GPTQ, GPTQ_V2):
        if counts[conv]:
            conf = min(v.confidence for v in verdicts if v.verdict == conv)
            return Detection(conv, conf, verdicts, [summary])
    pooled = [v.stats for v in verdicts if v.stats and v.stats.cells and
              math.isfinite(v.stats.se)]
    if pooled:
        w = np.array([1 / s.se**2 for s in pooled])
        med = float(np.dot(w, [s.median for s in pooled]) / w.sum())
        se = float(1 / math.sqrt(w.sum()))
        pool = ZeroStats(cells=sum(s.cells for s in pooled), median=med, se=se)
        v = decide("(all modules)", 4, None, pool)
        if v.verdict != AMBIGUOUS:
            return Detection(v.verdict, v.confidence, verdicts,
                             [summary, "pooled over modules: " + v.evidence[-1]])
        return Detection(AMBIGUOUS, 0.0, verdicts, [summary, "pooled over modules: "
                                                    + "; ".join(v.evidence)])
    return Detection(AMBIGUOUS, 0.0, verdicts, [summary])


def stored_fields(qzeros: np.ndarray, bits: int) -> np.ndarray:
    """The stored zero-point fields [G, N] of a qzeros tensor."""
    return unpack(qzeros, bits, axis=1)
