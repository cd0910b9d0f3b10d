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
from dataclasses import dataclass, field, replace
from statistics import NormalDist

import numpy as np

from ..conventions import GPTQ, GPTQ_V2, sym_field
from .packing import block, constant_words, field_masks, superwords, unpack, unsigned
from .packing import maxq as code_max

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
MIN_LLR = math.log(1e4)  # pooled log-likelihood ratio (10^4 : 1) for a checkpoint to decide
# Chance, per clean checkpoint, of calling one of its modules a misfit: the per-module threshold
# is Bonferroni-corrected for the number of modules tested, so it survives hundreds of them.
MISFIT_ALPHA = 1e-4
MISFIT_STRONG = 3.0  # effective standard errors beyond that threshold for an error, not a warning
# Zero points that do not follow the codes (random or scrambled ones) leave the median where it
# was but spread mean(code) - stored over the cells: a robust sigma above this fraction of maxq
# fits neither convention. Clean modules of the calibration corpus reach at most 0.054 (2 bits);
# random zero points 0.08 (2 bits) and 0.25 or more (3, 4, 8 bits). Judged only where each cell's
# mean rests on MIN_CODES codes or more (a sample's few codes per cell spread wider).
SPREAD_MAX = 0.15
MIN_CODES = 32


def symmetric_pattern(qzeros: np.ndarray, bits: int) -> str | None:
    """GPTQ or GPTQ_V2 when every field is that convention's symmetric zero, else None."""
    w = qzeros.dtype.itemsize * 8
    _, wpb = block(bits, w)
    u = unsigned(np.asarray(qzeros))
    if u.size == 0 or u.shape[-1] % wpb:
        return None
    blocks = u.reshape(-1, wpb)
    head = blocks[:max(1, u.shape[-1] // wpb)]  # the first row refutes most modules cheaply
    for conv in (GPTQ, GPTQ_V2):
        const = constant_words(sym_field(bits, conv), bits, w)
        if np.array_equal(head, np.broadcast_to(const, head.shape)) and \
                np.array_equal(blocks, np.broadcast_to(const, blocks.shape)):
            return conv
    return None


@dataclass
class ZeroStats:
    """What the codes say about one module's stored zero points.

    stored_maxq, stored_zero and top_runs need no codes: they count every field of qzeros, so
    inspect (a sample of codes) and verify (all codes) agree on them (inspect leaves the first
    two None on modules it samples: no finding it reports there needs them). The rest are over
    the cells whose codes were read."""
    cells: int = 0                 # interior cells in the statistic
    median: float = math.nan       # median of mean(code) - stored over interior cells
    se: float = math.inf           # its standard error
    # fields stored as maxq, and as 0 (all of qzeros; None where inspect did not count them)
    stored_maxq: int | None = 0
    stored_zero: int | None = 0
    wrapped: int = 0               # stored maxq, codes say Z = 0
    maxq_consistent: int = 0       # stored maxq, codes say Z = maxq
    sign_extension: int = 0        # words with AutoGPTQ's sign-extension signature
    top_runs: int = 0              # words whose top fields are all maxq (all of qzeros)
    # the same count by chance (group and column rates); None where not computed (a module with
    # fewer than RUNS_CHANCE_MIN runs needs it only for the pooled test: runs_chance_missing)
    top_runs_expected: float | None = 0.0
    borrow_offset: float = math.nan  # median offset of fields right after a wrapped one
    borrow_cells: int = 0
    borrow_se: float = math.inf
    position_spread: float = 0.0   # spread of per-field-position medians
    spread: float = math.nan       # robust sigma of mean(code) - stored over interior cells
    codes_per_cell: int = 0        # fewest codes behind one cell's mean (a sample reads few)
    # where the maxq_consistent fields are (flat indices g * N + n into [G, N]): what a runtime
    # that wraps a stored maxq to 0 misreads (verdicts.py); not part of the JSON statistics
    consistent_at: tuple[int, ...] = ()

    def field_counts(self) -> FieldCounts:
        """The part that needs no codes (unchanged by reading more rows)."""
        return FieldCounts(self.stored_maxq, self.stored_zero, self.top_runs,
                           self.top_runs_expected)

    def to_json(self) -> dict:
        out = {}
        for k, v in self.__dict__.items():
            if k == "consistent_at":
                continue
            out[k] = None if isinstance(v, float) and not math.isfinite(v) else (
                round(v, 4) if isinstance(v, float) else v)
        return out


@dataclass(frozen=True)
class FieldCounts:
    """What every field of qzeros shows without any code: the part of ZeroStats that does not
    change when more qweight rows are read."""
    stored_maxq: int | None = 0   # None: not counted (field_counts(counts=False))
    stored_zero: int | None = 0
    top_runs: int = 0
    top_runs_expected: float | None = 0.0   # None: not computed (see ZeroStats)


FIELD_CHUNK = 1 << 15  # superwords per chunk of field_counts (temporaries stay in cache)
# A module's own runs signature needs 3 runs and adoption of the pooled one 2: below that its
# runs-by-chance matters only to the pooled test, which reads it when the checkpoint's runs
# reach POOLED_RUNS_MIN (the column counts behind it cost twice the rest of field_counts).
RUNS_CHANCE_MIN = 2
POOLED_RUNS_MIN = 10


def field_counts(qzeros: np.ndarray, bits: int, chance: bool | None = None,
                 counts: bool = True) -> FieldCounts:
    """FieldCounts of packed qzeros [G, N*bits/W], straight from the words (2/4/8 bits: fields
    never straddle a word): a few in-place integer operations per 64 bits of qzeros instead of
    unpacking every field, a chunk of rows at a time. Same answer as `zero_stats` computes from
    the unpacked fields (tests/test_field_counts.py holds the two against each other).

    A field is maxq when adding 1 to its low bits carries into its top bit and that bit is set;
    it is not 0 when adding maxq/2 to its low bits carries or its top bit is set; neither sum
    can carry into the next field. Worked example, 4-bit int32: the word x = 0xF0F00FF7 holds
    fields (low first) 7, F, F, 0, 0, F, 0, F, and x & 0x77777777 = 0x70700777.
    ((0x70700777 + 0x11111111) & x & 0x88888888 = 0x80800880: 4 fields at maxq (1, 2, 5, 7);
    ((0x70700777 + 0x77777777) | x) & 0x88888888 = 0x80880888: 5 fields not 0, so 3 at 0.
    Its top four fields are 0, F, 0, F (top 16 bits 0xF0F0, not 0xFFFF): not AutoGPTQ's run.

    `counts`: count the maxq and 0 fields (False leaves them None: inspect's verdicts do not
    need them, and they are most of the cost). `chance`: compute top_runs_expected (True),
    leave it None (False), or compute it only when the module has RUNS_CHANCE_MIN runs or more
    (None)."""
    w = qzeros.dtype.itemsize * 8
    u = unsigned(np.ascontiguousarray(qzeros))
    if w % bits or u.ndim != 2:  # 3 bits: fields straddle words
        f = _field_counts_unpacked(stored_fields(qzeros, bits), bits, w)
        return f if counts else replace(f, stored_maxq=None, stored_zero=None)
    fpw = w // bits
    run = _run_length(fpw) if fpw >= 2 else 0
    top = _top_runs(u, bits, run) if run else 0
    stored_maxq, stored_zero = _maxq_zero_counts(u, bits) if counts else (None, None)
    if not run or stored_maxq == 0:
        expected: float | None = 0.0
    elif chance is False or (chance is None and top < RUNS_CHANCE_MIN):
        expected = None
    else:
        grp, cols = _maxq_by_group_and_run_column(u, bits, run)
        expected = _runs_expected(grp, cols, grp.shape[0], u.shape[1] * fpw, run) \
            if grp.any() else 0.0
    return FieldCounts(stored_maxq, stored_zero, top, expected)


def _chunk_rows(g: int, nx: int, multiple: int = 1) -> int:
    """Rows per chunk of FIELD_CHUNK superwords (at least one; a multiple of `multiple` when
    there are that many)."""
    rows = max(1, FIELD_CHUNK // max(1, nx))
    return rows if rows < multiple else rows // multiple * multiple


def _maxq_bits(xs, a, t, low, one, top_bit) -> None:
    """Each field's top bit in `a`: set where the field is maxq; `t` keeps the low bits."""
    np.bitwise_and(xs, low, out=t)
    np.add(t, one, out=a)
    np.bitwise_and(a, xs, out=a)
    np.bitwise_and(a, top_bit, out=a)


def _maxq_zero_counts(u: np.ndarray, bits: int) -> tuple[int, int]:
    """(fields at maxq, fields at 0) of unsigned words u [G, n] (see field_counts)."""
    x = superwords(u)
    ut = x.dtype.type
    low, one, top_bit = field_masks(bits, ut)
    g, nx = x.shape
    rows = _chunk_rows(g, nx)
    at, tmp, nz = (np.empty((min(rows, g), nx), ut) for _ in range(3))
    cnt = np.empty((min(rows, g), nx), np.uint8)
    maxq_fields = nonzero = 0
    for r0 in range(0, g, rows):
        xs = x[r0:r0 + rows]
        n = len(xs)
        a, t, o, c = at[:n], tmp[:n], nz[:n], cnt[:n]
        _maxq_bits(xs, a, t, low, one, top_bit)
        np.add(t, low, out=o)                    # low = maxq/2 in every field
        np.bitwise_or(o, xs, out=o)
        np.bitwise_and(o, top_bit, out=o)        # a field's top bit: the field is not 0
        maxq_fields += int(np.add.reduce(np.bitwise_count(a, out=c), axis=None, dtype=np.uint64))
        nonzero += int(np.add.reduce(np.bitwise_count(o, out=c), axis=None, dtype=np.uint64))
    return maxq_fields, u.size * (u.dtype.itemsize * 8 // bits) - nonzero


def _top_runs(u: np.ndarray, bits: int, run: int) -> int:
    """Words of u [G, n] whose top `run` fields are all maxq: their top r = run*bits bits all
    set, which for an unsigned word is word >= 2^W - 2^(W-r) (4-bit int32: >= 0xFFFF0000), one
    comparison per word."""
    w = u.dtype.itemsize * 8
    r = run * bits
    return int(np.count_nonzero(u >= u.dtype.type((1 << w) - (1 << (w - r)))))


def _maxq_by_group_and_run_column(u: np.ndarray, bits: int, run: int
                                  ) -> tuple[np.ndarray, np.ndarray]:
    """(maxq fields of each group [G], groups storing maxq at each of the run's fields of each
    word [n words, run]) of unsigned words u [G, n]: the rates behind the runs by chance."""
    x = superwords(u)
    ut = x.dtype.type
    w, sw = u.dtype.itemsize * 8, x.dtype.itemsize * 8
    k, fpw = sw // w, w // bits
    low, one, top_bit = field_masks(bits, ut)
    g, nx = x.shape
    per_lane = code_max(bits)      # rows whose 0/1 fields can be summed without a carry
    # chunks of whole partial sums (a partial sum's lanes are taken apart in Python steps)
    rows = _chunk_rows(g, nx, per_lane)
    at, tmp = (np.empty((min(rows, g), nx), ut) for _ in range(2))
    cnt = np.empty((min(rows, g), nx), np.uint8)
    grp = np.empty(g, np.int64)
    cols = np.zeros((nx, k, run), np.uint64)
    for r0 in range(0, g, rows):
        xs = x[r0:r0 + rows]
        n = len(xs)
        a, t, c = at[:n], tmp[:n], cnt[:n]
        _maxq_bits(xs, a, t, low, one, top_bit)
        grp[r0:r0 + n] = np.add.reduce(np.bitwise_count(a, out=c), axis=1, dtype=np.uint32)
        np.right_shift(a, ut(bits - 1), out=a)   # 0/1 in each field's low bit
        for p0 in range(0, n, per_lane):          # column counts at the run's fields
            lane_sums = np.add.reduce(a[p0:p0 + per_lane], axis=0)
            for i in range(k):
                for jj in range(run):
                    cols[:, i, jj] += (lane_sums >> ut(i * w + (fpw - run + jj) * bits)) & \
                        ut(per_lane)
    return grp, cols.reshape(-1, run).astype(np.int64)


def _field_counts_unpacked(s: np.ndarray, bits: int, word_bits: int) -> FieldCounts:
    maxq = code_max(bits)
    at = s == maxq
    stored_maxq = int(np.count_nonzero(at))
    stored_zero = int(np.count_nonzero(s == 0))
    fpw = word_bits // bits
    if not stored_maxq or bits == 3 or s.shape[1] % fpw or fpw < 2:
        return FieldCounts(stored_maxq, stored_zero)
    g = at.shape[0]
    run = _run_length(fpw)
    top = int(np.logical_and.reduce(at.reshape(g, -1, fpw)[:, :, fpw - run:], axis=2).sum())
    cols = at.sum(axis=0).reshape(-1, fpw)[:, fpw - run:]
    return FieldCounts(stored_maxq, stored_zero, top,
                       _runs_expected(at.sum(axis=1), cols, g, at.shape[1], run))


def _run_length(fields_per_word: int) -> int:
    """Fields at the top of a word that must all be maxq to count as AutoGPTQ's run."""
    return max(2, min(4, fields_per_word // 2))


def zero_stats(stored: np.ndarray, sums: np.ndarray, counts: np.ndarray, bits: int,
               word_bits: int, fields: FieldCounts | None = None,
               row_index: np.ndarray | None = None) -> ZeroStats:
    """Summarise cells: `stored` [G, N] unpacked qzeros fields, `sums` [G, N] code sums over
    `counts` [G] codes per cell. Rows with count 0 (codes not read) enter only the counts that
    need no codes (stored_maxq, stored_zero, top_runs), which `fields` gives instead when the
    caller has them from the packed words (field_counts): then `stored` may hold only the rows
    whose codes were read; `row_index` then says which group each row of `stored` is (for
    consistent_at; default: row r is group r)."""
    maxq = code_max(bits)
    f = fields or _field_counts_unpacked(stored, bits, word_bits)
    st = ZeroStats(stored_maxq=f.stored_maxq, stored_zero=f.stored_zero, top_runs=f.top_runs,
                   top_runs_expected=f.top_runs_expected)
    have = counts > 0
    if not have.any():
        return st
    n_cols = stored.shape[1]
    row_of = np.arange(len(stored)) if row_index is None else np.asarray(row_index)
    if not have.all():
        row_of = row_of[have]
        stored, sums, counts = stored[have], sums[have], counts[have]
    st.codes_per_cell = int(counts.min())
    interior = (stored > 0) & (stored < maxq)
    cells = int(np.count_nonzero(interior))
    equal = counts.min() == counts.max()
    d = None  # mean(code) - stored per cell, float32: built only where needed (it is the cost)
    if not equal or bits == 3:
        d = sums.astype(np.float32) / counts[:, None].astype(np.float32) - stored
    if cells:
        if equal:
            # every cell's mean rests on c codes: mean - stored = k / c with k an integer, so
            # the quartiles come from counting the k (linear, exact) instead of a partition
            c = int(counts[0])
            # k of every cell, the few at 0 or maxq counted out again afterwards: whole-array
            # passes instead of gathering the interior (most of the cells)
            k = np.multiply(stored, -c, dtype=np.int64)
            k += sums.view(np.int64)  # code sums stay far below 2^63
            edge = np.flatnonzero(~interior)
            # k lies in [-maxq * c, maxq * c]: the counting needs no min or max pass
            q1, med, q3 = (v / c for v in _quartiles_of_integers(
                k.reshape(-1), -maxq * c, maxq * c, drop=edge))
        else:
            q1, med, q3 = _quartiles(d[interior])
        st.cells, st.median = cells, med
        st.spread = (q3 - q1) / 1.349  # the IQR of a normal sample, as a robust sigma
        st.se = 1.2533 * max(st.spread, 1e-3) / math.sqrt(cells)
    at_max = stored == maxq
    if at_max.any():
        rows, cols = np.divmod(np.flatnonzero(at_max), stored.shape[1])
        # mean(code) < maxq / 2, in integers: 2 * sum < maxq * count
        low = 2 * sums[rows, cols].astype(np.int64) < maxq * counts[rows]
        st.wrapped = int(np.count_nonzero(low))
        st.maxq_consistent = len(low) - st.wrapped
        if st.maxq_consistent:
            flat = row_of[rows[~low]].astype(np.int64) * n_cols + cols[~low]
            st.consistent_at = tuple(flat.tolist())
        if bits >= 4 and st.wrapped:  # at 2 bits a code step is too coarse to tell
            _word_signatures(st, stored, sums, counts, rows[low], cols[low], bits, word_bits,
                             maxq)
    if bits == 3:
        st.position_spread = _position_spread(d, interior, bits, word_bits)
    return st


def _quartiles_of_integers(k: np.ndarray, lo: int | None = None, hi: int | None = None,
                           drop: np.ndarray | None = None) -> tuple[float, float, float]:
    """What _quartiles gives (nearest rank; the median of an even count is the mean of the two
    middle values), for integers, by counting them: one pass, no sort. Falls back to a
    partition when the values spread far wider than their number (counting would cost more).
    `lo` and `hi` bound the values where the caller knows them (else they are measured).
    `drop`: positions of `k` (1-D) to leave out, counted and subtracted (few, as a rule)."""
    n = k.size - (0 if drop is None else drop.size)
    if drop is not None and drop.size and (lo is None or hi is None or hi - lo > 4 * n + 4096):
        return _quartiles_of_integers(np.delete(k, drop), lo, hi)
    if lo is None or hi is None or hi - lo > 4 * n + 4096:
        lo, hi = int(k.min()), int(k.max())
    if hi - lo > 4 * n + 4096:
        return _quartiles(k.astype(np.float64))
    counts = np.bincount(k - lo, minlength=hi - lo + 1)
    if drop is not None and drop.size:
        counts -= np.bincount(k[drop] - lo, minlength=hi - lo + 1)
    cum = np.cumsum(counts)
    ranks = np.array([(n - 1) // 4, (n - 1) // 2, n // 2, (3 * (n - 1)) // 4])
    v = lo + np.searchsorted(cum, ranks, side="right")
    return float(v[0]), (float(v[1]) + float(v[2])) / 2, float(v[3])


def _quartiles(x: np.ndarray) -> tuple[float, float, float]:
    """Lower quartile, median, upper quartile (nearest rank) of a scratch array, in one
    partition; `x` is reordered."""
    n = x.size
    ks = sorted({(n - 1) // 4, (n - 1) // 2, n // 2, (3 * (n - 1)) // 4})
    x.partition(ks)
    med = (float(x[(n - 1) // 2]) + float(x[n // 2])) / 2
    return float(x[(n - 1) // 4]), med, float(x[(3 * (n - 1)) // 4])


def _runs_expected(grp: np.ndarray, cols: np.ndarray, g: int, n: int, run: int) -> float:
    """Words whose top `run` fields are all maxq by chance, from the maxq count of each group
    (`grp` [G]) and of each word's top fields over the groups (`cols` [N/fpw, run]).

    AutoGPTQ 0.7.1 ORs Z - 1 = 0xFFFFFFFF into the word, so a Z = 0 at field j sets every field
    from j to the top: runs up to the top word boundary, far more than chance gives. Needs no
    codes, so it works at 2 bits too. Chance allows for how maxq fields cluster in clean data:
    by output column (a column whose weights lean one way stores maxq in most of its groups)
    and by group (an outlier input channel sets Z = maxq for half the columns of its group).
    Each field's rate is its group's rate times its column's rate over the module's, each
    shrunk towards the module's rate (a column of one group says little)."""
    base = float(grp.sum()) / (g * n)
    # a field's rate is p_grp[g] * c[w, j], capped at 1; the sum over groups and words of the
    # run's product factorises wherever the cap does not bite, which keeps this linear
    c = (cols + 4 * base) / (g + 4) / base
    p_grp = (grp + 4 * base) / (n + 4)
    capped = p_grp * c.max() > 1
    expected = float((p_grp[~capped] ** run).sum() * np.prod(c, axis=1).sum())
    if capped.any():
        expected += float(np.prod(np.minimum(1.0, p_grp[capped, None, None] * c[None]),
                                  axis=2).sum())
    return expected


def _word_signatures(st, s, sums, counts, wrapped_rows, wrapped_cols, bits, word_bits, maxq):
    """AutoGPTQ sign extension and GPTQModel borrow, on the qzeros words that hold a wrapped
    zero (2/4/8 bits: a word holds W/bits whole fields): `s` [G, N] stored fields, `sums` and
    `counts` their codes, the wrapped fields at (wrapped_rows, wrapped_cols)."""
    fpw = word_bits // bits
    if s.shape[1] % fpw:
        return
    # the words (rows of fpw fields) that hold a wrapped zero; means only of their cells
    per_row = s.shape[1] // fpw
    words = np.unique(wrapped_rows * per_row + wrapped_cols // fpw)
    s = s.reshape(-1, fpw)[words]
    sw = sums.reshape(-1, fpw)[words]
    cw = counts[words // per_row, None]
    m = sw.astype(np.float32) / cw.astype(np.float32)
    d = m - s
    at_max = s == maxq
    low = 2 * sw.astype(np.int64) < maxq * cw   # as zero_stats counts them
    wrapped = at_max & low
    # all fields from j to the top of the word are maxq
    top_run = np.logical_and.accumulate(at_max[:, ::-1], axis=1)[:, ::-1]
    impossible = at_max & (m > 0.3 * maxq) & (m < 0.7 * maxq)  # neither Z = 0 nor Z = 2^bits
    above = np.zeros_like(impossible)
    above[:, :-1] = np.logical_or.accumulate(impossible[:, :0:-1], axis=1)[:, ::-1]
    # A genuine Z = 0 above a wrapped one (two one-signed groups in a word) also sits at maxq
    # with codes off both ends now and then, so the signature needs a third of the fields above
    # wrapped zeros to be impossible: clean writers gave 0 to 0.15 of them, AutoGPTQ 0.7.1
    # 0.41 to 0.82 (tests/test_inspect_verify_agree.py).
    base = wrapped & top_run
    over = np.zeros_like(base)
    over[:, 1:] = np.logical_or.accumulate(base, axis=1)[:, :-1]
    candidates = int(np.count_nonzero(over & at_max))
    if candidates and np.count_nonzero(over & impossible) * 3 >= candidates:
        st.sign_extension = int((base & above).any(axis=1).sum())
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
    # every row may change it (checks.zero_point_findings, settled_only)
    complete: bool = True
    llr: float = 0.0        # log-likelihood ratio gptq : gptq_v2 of the statistic (0 without one)
    misfit: float = 0.0     # |median - nearest convention's value| in effective standard errors
    outlier: bool = False   # misfit beyond what the checkpoint's module count explains (warning)
    # the evidence line when AutoGPTQ's runs were found over all modules' qzeros (combine);
    # later lines may follow it (adoption), so readers take it from here
    pooled_runs: str = ""

    def to_json(self):
        return {"name": self.name, "verdict": self.verdict, "confidence": self.confidence,
                "evidence": self.evidence, "signatures": self.signatures,
                "llr": round(self.llr, 3), "misfit": round(self.misfit, 3),
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
    # judged on 8 fields or more, with cell means of MIN_CODES codes or more and the weights'
    # own skew in the error: fewer gave false borrows on clean 4-bit models
    # (scripts/calibrate_detection.py)
    if st.borrow_cells >= 8 and st.codes_per_cell >= MIN_CODES and \
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
    counts = {c: sum(v.verdict == c for v in verdicts) for c in (GPTQ, GPTQ_V2, AMBIGUOUS)}
    n = len(verdicts)
    summary = (f"{counts[GPTQ]} gptq, {counts[GPTQ_V2]} gptq_v2, {counts[AMBIGUOUS]} undecided "
               f"alone of {n} modules")
    pooled = sum(v.llr for v in verdicts)
    pool_ev = (f"pooled log-likelihood ratio gptq : gptq_v2 over "
               f"{sum(1 for v in verdicts if v.llr)} module statistics is {pooled:.1f} "
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
    expected = sum(st.top_runs_expected for st in stats)
    if top < 3 * expected or _poisson_tail(top, expected) >= 1e-9:
        return verdicts
    out = []
    for v in verdicts:
        st = v.stats
        if st is None or "autogptq_sign_extension" in v.signatures or \
                st.top_runs < 2 or st.top_runs <= 2 * st.top_runs_expected + 1:
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


def stored_fields(qzeros: np.ndarray, bits: int) -> np.ndarray:
    """The stored zero-point fields [G, N] of a qzeros tensor."""
    return unpack(qzeros, bits, axis=1)
