// Per-cell code sums over packed GPTQ qweight: for every (group g, output column n), the sum of
// the codes of the input channels in group g. The raw material of zero-point detection
// (gptqfmt/detection/codestats.py computes the same sums with numpy, and the tests hold the two
// equal on every fixture and on random words).
//
// qweight is [R, N] 32-bit words packed along k: column n is one little-endian bit stream down
// the rows, so with vpw = 32 / bits fields per word, field j of word (r, n) is input channel
// r * vpw + j, at bit j * bits (2, 4 and 8 bits: no field straddles two words).
//
// Two loops, both exact integer sums:
// - gq_group_sums, groups of whole rows (no act-order; group_size a multiple of vpw): with E the
//   even fields of a word (x & 0x0F0F0F0F at 4 bits, each in a lane of 2 * bits) and O its odd
//   ones ((x >> 4) & 0x0F0F0F0F), the lanes of sum(E) and sum(O) over a run of rows hold their
//   sums without overflow while run * maxq < 2^(2 * bits) (4-bit: 17 rows), and are then folded
//   into one total: two masks and two adds per word, no per-field work; four rows a pass, so
//   the accumulators are loaded and stored once per four words (9 GB/s a core, from 6).
//   Worked example, 4-bit, one group of two rows holding 0x11111111 and 0xFFFFFFFF in column 0:
//   E sums to 0x01010101 + 0x0F0F0F0F = 0x10101010, O to the same; each folds to
//   4 x 16 = 64: 128 in all = 8 x 1 + 8 x 15.
// - gq_scattered_sums, any g_idx (act-order): each field is added to the row of its channel's
//   group, over a tile of columns whose accumulators stay in cache.
// Plain C over uint32/uint64 (no platform intrinsics): the compiler's vectoriser does the rest.
#pragma once
#include <stdint.h>
#include <string.h>

// Inlined into each caller, so a caller built for wider vectors (a target clone) vectorises
// the loops for them too, and its constant `bits` reaches the masks.
#if defined(__GNUC__)
#define GQ_INLINE static inline __attribute__((always_inline))
#else
#define GQ_INLINE static inline
#endif

// The low `width` bits of every 2 * width-bit lane of a 32-bit word.
GQ_INLINE uint32_t gq_lane_mask(int width) {
    uint32_t m = 0;
    for (int s = 0; s < 32; s += 2 * width) m |= ((1u << width) - 1u) << s;
    return m;
}

// The lanes of `x` (each `width` bits wide) added into one sum.
GQ_INLINE uint32_t gq_fold(uint32_t x, int width) {
    for (; width < 32; width *= 2) {
        const uint32_t m = gq_lane_mask(width);
        x = (x & m) + ((x >> width) & m);
    }
    return x;
}

// Rows of even (or odd) fields whose sums fit a lane of 2 * bits: (2^(2 bits) - 1) / maxq.
GQ_INLINE int gq_lane_rows(int bits) {
    return (int)(((1u << (2 * bits)) - 1u) / ((1u << bits) - 1u));
}

// Columns per tile of gq_group_sums: its two accumulators stay in L1.
#define GQ_SUM_TILE 2048

// sums[g, c0:c0 + cols] (+=) over the `rows_per_group` rows of group g of `q` [rows, N]. `bits`
// is a constant at every call site (2, 4 or 8), so the masks and the fold fold into the loop.
// A caller walks the tiles of one group before the next group: each row is then read in
// order, a tile at a time, while the accumulators stay in L1.
GQ_INLINE void gq_group_sums_bits(const uint32_t* q, int64_t N, int bits, int64_t g,
                                  int64_t rows_per_group, int64_t c0, int64_t cols,
                                  uint64_t* sums) {
    uint32_t ev[GQ_SUM_TILE], od[GQ_SUM_TILE];
    const uint32_t mask = gq_lane_mask(bits);
    const int limit = gq_lane_rows(bits);
    const int64_t g0 = g * rows_per_group;
    uint64_t* out = sums + g * N + c0;
    for (int64_t r0 = g0; r0 < g0 + rows_per_group; r0 += limit) {
        int64_t r1 = r0 + limit;
        if (r1 > g0 + rows_per_group) r1 = g0 + rows_per_group;
        memset(ev, 0, sizeof(uint32_t) * (size_t)cols);
        memset(od, 0, sizeof(uint32_t) * (size_t)cols);
        int64_t r = r0;
        // four rows a pass: the accumulators are loaded and stored once for four words (the
        // lanes hold the same r1 - r0 rows' sums either way)
        for (; r + 4 <= r1; r += 4) {
            const uint32_t* w = q + r * N + c0;
            for (int64_t n = 0; n < cols; ++n) {
                const uint32_t a = w[n], b = w[N + n], c = w[2 * N + n], d = w[3 * N + n];
                ev[n] += (a & mask) + (b & mask) + (c & mask) + (d & mask);
                od[n] += ((a >> bits) & mask) + ((b >> bits) & mask) + ((c >> bits) & mask) +
                         ((d >> bits) & mask);
            }
        }
        for (; r < r1; ++r) {
            const uint32_t* w = q + r * N + c0;
            for (int64_t n = 0; n < cols; ++n) {
                ev[n] += w[n] & mask;
                od[n] += (w[n] >> bits) & mask;
            }
        }
        for (int64_t n = 0; n < cols; ++n)
            out[n] += (uint64_t)gq_fold(ev[n], 2 * bits) + gq_fold(od[n], 2 * bits);
    }
}

// One tile of gq_scattered_sums: acc [groups, cols] uint32, zeroed by the caller. Every field is
// at most maxq and a group holds at most K < 2^32 / maxq channels, so no cell overflows.
GQ_INLINE void gq_scattered_tile_bits(const uint32_t* q, int64_t rows, int64_t N, int bits,
                                          const int32_t* g_idx, int64_t c0, int64_t cols,
                                          uint32_t* acc) {
    const int vpw = 32 / bits;
    const uint32_t maxq = (1u << bits) - 1u;
    for (int64_t r = 0; r < rows; ++r) {
        const uint32_t* w = q + r * N + c0;
        for (int j = 0; j < vpw; ++j) {
            uint32_t* a = acc + (int64_t)g_idx[r * vpw + j] * cols;
            const int shift = j * bits;
            for (int64_t n = 0; n < cols; ++n) a[n] += (w[n] >> shift) & maxq;
        }
    }
}
