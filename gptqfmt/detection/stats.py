"""What a module's data say about its zero points, as numbers: the symmetric pattern of its
qzeros, counts over every stored field (FieldCounts, straight from the packed words), and the
statistics of the codes against the stored zero points (ZeroStats). decide.py turns them into a
module's verdict, pool.py into the checkpoint's.

The statistic: weights in a group are close to zero-mean, so the mean code of a cell (group x
output column) sits near the true Z: mean(code) - stored is near 0 under `gptq_v2` and near 1
under `gptq`. The median over cells with an interior stored value (0 < s < maxq) is robust to
the few clamped or corrupted cells; its standard error comes from the spread.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from ..bits import native, unique
from ..bits.layout import stored_fields
from ..bits.packing import block, unsigned
from ..bits.packing import maxq as code_max
from ..bits.swar import maxq_by_group_and_run_column, maxq_zero_counts, top_runs


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
    # fields at maxq above a wrapped zero up to the top of its word (where AutoGPTQ's sign
    # extension puts maxq), and of them those whose codes say Z = 0 beyond doubt, as a genuine
    # gptq maxq's do
    run_fields: int = 0
    run_fields_zero: int = 0
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
    # stored 0, codes say Z = 0 (2 bits only: zero_clamped); read by GQ506, not part of the
    # JSON statistics either
    zero_clamped: int = 0

    def field_counts(self) -> FieldCounts:
        """The part that needs no codes (unchanged by reading more rows)."""
        return FieldCounts(self.stored_maxq, self.stored_zero, self.top_runs,
                           self.top_runs_expected)

    def to_json(self) -> dict:
        out = {}
        for k, v in self.__dict__.items():
            if k in ("consistent_at", "zero_clamped"):
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


# A module's own runs signature needs 3 runs and adoption of the pooled one 2: below that its
# runs-by-chance matters only to the pooled test, which reads it when the checkpoint's runs
# reach pool.POOLED_RUNS_MIN (the column counts behind it cost twice the rest of field_counts).
RUNS_CHANCE_MIN = 2



def field_counts(qzeros: np.ndarray, bits: int, chance: bool | None = None,
                 counts: bool = True) -> FieldCounts:
    """FieldCounts of packed qzeros [G, N*bits/W], straight from the words (2/4/8 bits: fields
    never straddle a word): a few in-place integer operations per 64 bits of qzeros instead of
    unpacking every field, a chunk of rows at a time. Same answer as `zero_stats` computes from
    the unpacked fields (tests/unit/test_stats.py holds the two against each other).

    The maxq and 0 tests are bits/swar.py's (its docstring works the word 0xF0F00FF7: 4 fields
    at maxq, 3 at 0). Its top four fields are 0, F, 0, F (top 16 bits 0xF0F0, not 0xFFFF): not
    AutoGPTQ's run.

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
    top = top_runs(u, bits, run) if run else 0
    stored_maxq, stored_zero = maxq_zero_counts(u, bits) if counts else (None, None)
    if not run or stored_maxq == 0:
        expected: float | None = 0.0
    elif chance is False or (chance is None and top < RUNS_CHANCE_MIN):
        expected = None
    else:
        grp, cols = maxq_by_group_and_run_column(u, bits, run)
        expected = _runs_expected(grp, cols, grp.shape[0], u.shape[1] * fpw, run) \
            if grp.any() else 0.0
    return FieldCounts(stored_maxq, stored_zero, top, expected)



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
    equal = counts.min() == counts.max()
    # every cell's mean rests on c codes: mean - stored = k / c with k an integer, counted in
    # one compiled pass over the interior cells where the bins stay few beside the cells
    c = int(counts[0])
    counted = native.interior_histogram(stored, sums, c, maxq) \
        if equal and _few_bins(2 * maxq * c, stored.size) else None
    interior: np.ndarray | None = None   # 0 < stored < maxq, made where numpy counts
    if counted is not None:
        hist, cells = counted
    else:
        interior = (stored > 0) & (stored < maxq)
        cells = int(np.count_nonzero(interior))
    d = None  # mean(code) - stored per cell, float32: built only where needed (it is the cost)
    if not equal or bits == 3:
        d = sums.astype(np.float32) / counts[:, None].astype(np.float32) - stored
    if cells:
        if counted is not None:
            q1, med, q3 = (v / c for v in _quartiles_of_counts(hist, -maxq * c, cells))
        elif equal:
            assert interior is not None   # made where the compiled pass did not count
            # the same counting in numpy: k of every cell, the few at 0 or maxq counted out
            # again afterwards (whole-array passes instead of gathering the interior)
            k = np.multiply(stored, -c, dtype=np.int64)
            k += sums.view(np.int64)  # code sums stay far below 2^63
            edge = np.flatnonzero(~interior)
            # k lies in [-maxq * c, maxq * c]: the counting needs no min or max pass
            q1, med, q3 = (v / c for v in _quartiles_of_integers(
                k.reshape(-1), -maxq * c, maxq * c, drop=edge))
        else:
            assert d is not None and interior is not None   # built where the counts differ
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
        if st.wrapped:
            _word_signatures(st, stored, sums, counts, rows[low], cols[low], bits, word_bits,
                             maxq)
    if bits == 3:
        if interior is None:
            interior = (stored > 0) & (stored < maxq)
        st.position_spread = _position_spread(d, interior, bits, word_bits)
    st.zero_clamped = zero_clamped(stored, sums, counts, bits)
    return st


def zero_clamped(stored: np.ndarray, sums: np.ndarray, counts: np.ndarray, bits: int) -> int:
    """Fields that store 0 although their codes say Z = 0 (mean code below 1/2: the bulk of
    the group sits at code 0, where a group with Z = 1 has it at 1), over the cells whose codes
    were read (`counts` [G] > 0). In a gptq file a stored 0 means Z = 1; a writer that clamps
    Z - 1 at 0 instead of wrapping it to maxq stores Z = 0 there too (auto-round 0.16,
    qlinear_torch_zp.py: make_fixtures.py write_qzeros).

    Counted at 2 bits only, where the codes separate the two: with 3 codes above the zero, a
    group whose zero is 0 has most weights round to code 0 (on the fixtures' weights 85 % of
    Z = 0 cells have mean code < 1/2, no Z = 1 cell of 80,000 does; over 960 clean 2-bit gptq
    modules of scripts/calibrate_detection.py's corpus, 1 field). From 3 bits up a group
    with Z = 0 is a one-signed group whose codes spread over the range, as a Z = 1 group's do,
    so nothing separates them there: 0."""
    if bits != 2:
        return 0
    have = counts > 0
    at = (stored[have] == 0) & (2 * sums[have].astype(np.int64) < counts[have, None])
    return int(np.count_nonzero(at))


def _quartiles_of_integers(k: np.ndarray, lo: int | None = None, hi: int | None = None,
                           drop: np.ndarray | None = None) -> tuple[float, float, float]:
    """What _quartiles gives (nearest rank; the median of an even count is the mean of the two
    middle values), for integers, by counting them: one pass, no sort. Falls back to a
    partition when the values spread far wider than their number (counting would cost more).
    `lo` and `hi` bound the values where the caller knows them (else they are measured).
    `drop`: positions of `k` (1-D) to leave out, counted and subtracted (few, as a rule)."""
    n = k.size - (0 if drop is None else drop.size)
    if drop is not None and drop.size and (lo is None or hi is None or
                                           not _few_bins(hi - lo, n)):
        return _quartiles_of_integers(np.delete(k, drop), lo, hi)
    if lo is None or hi is None or not _few_bins(hi - lo, n):
        lo, hi = int(k.min()), int(k.max())
    if not _few_bins(hi - lo, n):
        return _quartiles(k.astype(np.float64))
    counts = np.bincount(k - lo, minlength=hi - lo + 1)
    if drop is not None and drop.size:
        counts -= np.bincount(k[drop] - lo, minlength=hi - lo + 1)
    return _quartiles_of_counts(counts, lo, n)


def _few_bins(span: int, n: int) -> bool:
    """Whether counting n integers over a range `span` wide costs less than partitioning
    them: the bins stay few beside the values."""
    return span <= 4 * n + 4096


def _quartiles_of_counts(counts: np.ndarray, lo: int, n: int) -> tuple[float, float, float]:
    """What _quartiles gives of the `n` integers that `counts` tallies (counts[i]: how many
    are lo + i)."""
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


def word_columns(n: int, bits: int, word_bits: int) -> np.ndarray | None:
    """The fields of a row of `n` that lie whole in one word, word by word: [words, fields per
    word] column indices, in the order of their bits (None where the row is not whole words).

    2/4/8 bits: every field, W/bits to a word. 3 bits (32-bit words): 32 fields fill 3 words;
    fields 10 and 21 straddle two words, so word 0 holds whole fields 0..9, word 1 11..20, word
    2 22..31 (a sign extension from field j reaches the top of j's word and no further)."""
    if bits == 3:
        if word_bits != 32 or n % 32:
            return None
        block = np.arange(n).reshape(-1, 32)
        return np.stack([block[:, 0:10], block[:, 11:21], block[:, 22:32]], axis=1
                        ).reshape(-1, 10)
    fpw = word_bits // bits
    if word_bits % bits or n % fpw:
        return None
    return np.arange(n).reshape(-1, fpw)


def _word_signatures(st, s, sums, counts, wrapped_rows, wrapped_cols, bits, word_bits, maxq):
    """AutoGPTQ sign extension and GPTQModel borrow, on the qzeros words that hold a wrapped
    zero (the fields whole in a word: word_columns): `s` [G, N] stored fields, `sums` and
    `counts` their codes, the wrapped fields at (wrapped_rows, wrapped_cols)."""
    cols = word_columns(s.shape[1], bits, word_bits)
    if cols is None:
        return
    word_of = np.full(s.shape[1], -1, np.int64)
    word_of[cols] = np.arange(len(cols))[:, None]
    inside = word_of[wrapped_cols] >= 0
    # the words (rows of whole fields) that hold a wrapped zero; means only of their cells
    per_row = len(cols)
    words = unique(wrapped_rows[inside] * per_row + word_of[wrapped_cols[inside]])
    if not words.size:
        return
    rows, wcols = words // per_row, cols[words % per_row]
    s = s[rows[:, None], wcols]
    sw = sums[rows[:, None], wcols]
    cw = counts[rows, None]
    m = sw.astype(np.float32) / cw.astype(np.float32)
    d = m - s
    at_max = s == maxq
    low = 2 * sw.astype(np.int64) < maxq * cw   # as zero_stats counts them
    wrapped = at_max & low
    # all fields from j to the top of the word are maxq
    top_run = np.logical_and.accumulate(at_max[:, ::-1], axis=1)[:, ::-1]
    # neither Z = 0 nor Z = 2^bits; at 2 bits a genuine Z = 0 of one-signed weights averages up
    # to a code and a half, so there only codes that do not say Z = 0 at all (above maxq / 2,
    # where `low` ends) count
    lo = 0.5 if bits == 2 else 0.3
    impossible = at_max & (m > lo * maxq) & (m < 0.7 * maxq)
    above = np.zeros_like(impossible)
    above[:, :-1] = np.logical_or.accumulate(impossible[:, :0:-1], axis=1)[:, ::-1]
    # A genuine Z = 0 above a wrapped one (two one-signed groups in a word) also sits at maxq
    # with codes off both ends now and then, so the signature needs a third of the fields above
    # wrapped zeros to be impossible: clean writers gave 0 to 0.15 of them, AutoGPTQ 0.7.1
    # 0.41 to 0.82 (tests/cli/test_inspect_verify_agree.py).
    base = wrapped & top_run
    over = np.zeros_like(base)
    over[:, 1:] = np.logical_or.accumulate(base, axis=1)[:, :-1]
    candidates = int(np.count_nonzero(over & at_max))
    # cleared: codes that say Z = 0 beyond doubt (at 2 bits a mean near one code is a Z = 0 of
    # one-signed weights or a Z = 1 alike, which is what GPTQModel's borrow leaves there)
    st.run_fields = candidates
    st.run_fields_zero = int(np.count_nonzero(over & at_max & (m <= 0.3 * maxq)))
    if candidates and np.count_nonzero(over & impossible) * 3 >= candidates:
        st.sign_extension = int((base & above).any(axis=1).sum())
    if bits == 3:  # whole words only: a borrow crosses the straddling fields
        return
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
