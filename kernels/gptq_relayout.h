// Word re-layouts between GPTQ and its neighbours (gptqfmt/formats/relayout.py does the same in
// numpy; the tests hold the two equal): the transpose of a matrix of 32-bit words (GPTQ
// qweight [K*bits/32, N] <-> compressed-tensors weight_packed [N, K*bits/32]), the count of
// words that differ between a matrix and a transposed one (the convert gate), and AutoAWQ's
// qweight [K, N/8] -> GPTQ's [K/8, N] by an 8 x 8 transpose of nibbles.
#pragma once
#include <stdint.h>
#include <string.h>

#include "gptq_sums.h"   // GQ_INLINE

// SSE2's 4 x 4 blocks where the compiler has them, unless GQ_NO_SIMD (the tests build the
// plain C loops that way too).

// Rows and columns of a tile of 16-bit values, halved (gq_transpose_halves: 32 x 32 x 2
// bytes, each row of it a 64-byte line).
#define GQ_TRANSPOSE_TILE 16

// A hint that a line is wanted soon (for writing where `write` is 1, a constant), into L2: the
// lines these loops ask for a tile ahead lie rows 4 KiB and more apart, so they share a few
// of L1's sets, and asked into L1 they pushed each other out before they were read.
#if defined(__GNUC__)
#define GQ_PREFETCH(p, write) __builtin_prefetch((p), (write), 2)
#else
#define GQ_PREFETCH(p, write) ((void)(p))
#endif

#if defined(__SSE2__) && defined(__GNUC__) && !defined(GQ_NO_SIMD)
#include <emmintrin.h>
// t[i] = column i of src[r..r+3, j..j+3] (src's rows `cols` words apart): four rows in, four
// columns out, by unpacking.
GQ_INLINE void gq_load_transposed_4x4(const uint32_t* src, int64_t cols, __m128i t[4]) {
    const __m128i a = _mm_loadu_si128((const __m128i*)(src));
    const __m128i b = _mm_loadu_si128((const __m128i*)(src + cols));
    const __m128i c = _mm_loadu_si128((const __m128i*)(src + 2 * cols));
    const __m128i d = _mm_loadu_si128((const __m128i*)(src + 3 * cols));
    const __m128i ab0 = _mm_unpacklo_epi32(a, b), ab1 = _mm_unpackhi_epi32(a, b);
    const __m128i cd0 = _mm_unpacklo_epi32(c, d), cd1 = _mm_unpackhi_epi32(c, d);
    t[0] = _mm_unpacklo_epi64(ab0, cd0);
    t[1] = _mm_unpackhi_epi64(ab0, cd0);
    t[2] = _mm_unpacklo_epi64(ab1, cd1);
    t[3] = _mm_unpackhi_epi64(ab1, cd1);
}

// dst[j..j+3, r..r+3] = src[r..r+3, j..j+3]^T (dst's rows `rows` words apart).
GQ_INLINE void gq_transpose_4x4(const uint32_t* src, int64_t cols, uint32_t* dst, int64_t rows) {
    __m128i t[4];
    gq_load_transposed_4x4(src, cols, t);
    for (int i = 0; i < 4; ++i) _mm_storeu_si128((__m128i*)(dst + i * rows), t[i]);
}
#endif

#if defined(__SSE2__) && defined(__GNUC__) && !defined(GQ_NO_SIMD)
// dst[j..j+7, r..r+7] = src[r..r+7, j..j+7]^T for 16-bit values (src's rows `cols` apart,
// dst's `rows`): eight rows in, eight columns out, by unpacking pairs of rows three times.
GQ_INLINE void gq_transpose_8x8_halves(const uint16_t* src, int64_t cols, uint16_t* dst,
                                       int64_t rows) {
    __m128i a[8], b[8];
    for (int k = 0; k < 8; ++k) a[k] = _mm_loadu_si128((const __m128i*)(src + k * cols));
    for (int k = 0; k < 8; k += 2) {   // rows k, k+1 by values: columns 0-3, then 4-7
        b[k] = _mm_unpacklo_epi16(a[k], a[k + 1]);
        b[k + 1] = _mm_unpackhi_epi16(a[k], a[k + 1]);
    }
    for (int k = 0; k < 8; k += 4)     // rows k..k+3 by pairs: columns 0-1, 2-3, 4-5, 6-7
        for (int s = 0; s < 2; ++s) {
            a[k + 2 * s] = _mm_unpacklo_epi32(b[k + s], b[k + s + 2]);
            a[k + 2 * s + 1] = _mm_unpackhi_epi32(b[k + s], b[k + s + 2]);
        }
    for (int c = 0; c < 4; ++c) {      // rows 0-3 with 4-7: column 2c, then 2c + 1
        _mm_storeu_si128((__m128i*)(dst + 2 * c * rows), _mm_unpacklo_epi64(a[c], a[c + 4]));
        _mm_storeu_si128((__m128i*)(dst + (2 * c + 1) * rows),
                         _mm_unpackhi_epi64(a[c], a[c + 4]));
    }
}
#endif

// dst[c - c0, r] = src[r, c] for the columns [c0, c1) of src [rows, cols] of 16-bit values
// (fp16 or bf16 scales): dst holds the rows [c0, c1) of the transpose, a tile at a time, 8 x 8
// blocks by SSE2 within a tile where the compiler has it, the edges value by value: 5.5 to 5.9
// GB/s a core on scales of 64 x 8192 to 224 x 8192 (value by value throughout, 0.7 to 1.1).
GQ_INLINE void gq_transpose_halves(const uint16_t* src, int64_t rows, int64_t cols,
                                   uint16_t* dst, int64_t c0, int64_t c1) {
    const int64_t T = 2 * GQ_TRANSPOSE_TILE;   // 32 x 2 bytes: a line per row of the tile
    for (int64_t r0 = 0; r0 < rows; r0 += T) {
        const int64_t r1 = r0 + T < rows ? r0 + T : rows;
        for (int64_t j0 = c0; j0 < c1; j0 += T) {
            const int64_t j1 = j0 + T < c1 ? j0 + T : c1;
            int64_t j8 = j0;   // the columns in whole blocks
#if defined(__SSE2__) && defined(__GNUC__) && !defined(GQ_NO_SIMD)
            const int64_t r8 = r0 + (r1 - r0) / 8 * 8;
            j8 = j0 + (j1 - j0) / 8 * 8;
            for (int64_t j = j0; j < j8; j += 8)
                for (int64_t r = r0; r < r8; r += 8)
                    gq_transpose_8x8_halves(src + r * cols + j, cols,
                                            dst + (j - c0) * rows + r, rows);
            for (int64_t j = j0; j < j8; ++j)   // the rows past the last block of 8
                for (int64_t r = r8; r < r1; ++r) dst[(j - c0) * rows + r] = src[r * cols + j];
#endif
            for (int64_t j = j8; j < j1; ++j)   // the columns past it (all of them without)
                for (int64_t r = r0; r < r1; ++r) dst[(j - c0) * rows + r] = src[r * cols + j];
        }
    }
}

#if defined(__SSE2__) && defined(__GNUC__) && !defined(GQ_NO_SIMD)
// `equal` less one in each lane for each of the 16 words of src[r..r+3, j..j+3]^T that equals
// dst[j..j+3, r..r+3]'s: four lanes counted down, summed once a tile. A popcount of each
// block's mask instead, in a build for any x86-64 (which has no popcount instruction), ran the
// comparison at 4.6 GB/s a core on a matrix in L2, against 18 so (in C, built alone; 2.1
// against 2.9 on a 32 MiB matrix in memory).
GQ_INLINE __m128i gq_equal_4x4(const uint32_t* a, int64_t cols, const uint32_t* b, int64_t rows,
                               __m128i equal) {
    __m128i t[4];
    gq_load_transposed_4x4(a, cols, t);
    for (int i = 0; i < 4; ++i)
        equal = _mm_add_epi32(
            equal, _mm_cmpeq_epi32(t[i], _mm_loadu_si128((const __m128i*)(b + i * rows))));
    return equal;
}
#endif

// Tiles of gq_transpose_walk: 64 x 64 words (16 KiB a side).
#define GQ_WORD_TILE 64

// The columns [c0, c1) of `rows` rows of a (rows `lda` words apart) against the rows
// [c0, c1) of their transpose, b (rows `ldb` words apart; b's row 0 is the transpose's row
// `b0`: c0 for a band, 0 for all of it), in tiles of GQ_WORD_TILE x GQ_WORD_TILE: a column of
// tiles is walked down a's rows, so each of its b rows is written in order, and the next
// tile's lines (64 rows of a further down, the next 256 bytes of the same b rows) are
// prefetched into L2 while this one moves: 3.6 to 4.9 GB/s a core written and 2.9 to 3.9
// compared (bench/relayout_bench.py; asked into L1, 2.7 to 3.5 and 2.1 to 3.0), where 16 x 16
// tiles without prefetches ran at 1.3 to 2.7 (rows of a 32 to 112 KiB apart, b's 4 to 14
// KiB). 4 x 4 blocks by SSE2 within a tile where the compiler has it, the edges word by word:
// with `compare` 0, b[c - b0, r] = a[r, c] (the transpose; 0 returned); with 1, how many
// b[c - b0, r] differ from a[r, c] (nothing written). `compare` is a constant at each call
// site.
GQ_INLINE int64_t gq_transpose_walk(const uint32_t* a, int64_t lda, int64_t rows, uint32_t* b,
                                    int64_t ldb, int64_t b0, int64_t c0, int64_t c1,
                                    int compare) {
    const int64_t T = GQ_WORD_TILE;
    int64_t differ = 0;
    for (int64_t j0 = c0; j0 < c1; j0 += T) {
        const int64_t j1 = j0 + T < c1 ? j0 + T : c1;
        for (int64_t r0 = 0; r0 < rows; r0 += T) {
            const int64_t r1 = r0 + T < rows ? r0 + T : rows;
            const int64_t rn = r1 + T < rows ? r1 + T : rows;   // the next tile's rows
            for (int64_t r = r1; r < rn; ++r)
                for (int64_t l = j0; l < j1; l += 16)   // a 64-byte line is 16 words
                    GQ_PREFETCH(a + r * lda + l, 0);
            for (int64_t j = j0; r1 < rn && j < j1; ++j)
                for (int64_t l = r1; l < rn; l += 16) {
                    if (compare) GQ_PREFETCH(b + (j - b0) * ldb + l, 0);
                    else GQ_PREFETCH(b + (j - b0) * ldb + l, 1);
                }
            int64_t j4 = j0;
#if defined(__SSE2__) && defined(__GNUC__) && !defined(GQ_NO_SIMD)
            const int64_t r4 = r0 + (r1 - r0) / 4 * 4;
            j4 = j0 + (j1 - j0) / 4 * 4;
            __m128i equal = _mm_setzero_si128();   // per lane at most a tile's words / 4
            for (int64_t j = j0; j < j4; j += 4)
                for (int64_t r = r0; r < r4; r += 4) {
                    uint32_t* at = b + (j - b0) * ldb + r;
                    if (compare) equal = gq_equal_4x4(a + r * lda + j, lda, at, ldb, equal);
                    else gq_transpose_4x4(a + r * lda + j, lda, at, ldb);
                }
            if (compare) {   // the blocks' words, less those equal
                int32_t lanes[4];
                _mm_storeu_si128((__m128i*)lanes, equal);
                differ += (j4 - j0) * (r4 - r0) + lanes[0] + lanes[1] + lanes[2] + lanes[3];
            }
            for (int64_t j = j0; j < j4; ++j)   // the rows past the last block of 4
                for (int64_t r = r4; r < r1; ++r) {
                    if (compare) differ += b[(j - b0) * ldb + r] != a[r * lda + j];
                    else b[(j - b0) * ldb + r] = a[r * lda + j];
                }
#endif
            for (int64_t j = j4; j < j1; ++j)   // the columns past it (all of them without)
                for (int64_t r = r0; r < r1; ++r) {
                    if (compare) differ += b[(j - b0) * ldb + r] != a[r * lda + j];
                    else b[(j - b0) * ldb + r] = a[r * lda + j];
                }
        }
    }
    return differ;
}

// dst[c - c0, r] = src[r, c] for the columns [c0, c1) of src [rows, cols]: dst holds the rows
// [c0, c1) of the transpose [cols, rows], a band of it (all of it for [0, cols)).
GQ_INLINE void gq_transpose_words(const uint32_t* src, int64_t rows, int64_t cols,
                                  uint32_t* dst, int64_t c0, int64_t c1) {
    gq_transpose_walk(src, cols, rows, dst, rows, c0, c0, c1, 0);
}

// How many of the columns [c0, c1) of a [rows, cols] hold a word other than b [cols, rows]'s
// at the transposed place (b is only read).
GQ_INLINE int64_t gq_transposed_differ(const uint32_t* a, int64_t rows, int64_t cols,
                                       const uint32_t* b, int64_t c0, int64_t c1) {
    return gq_transpose_walk(a, cols, rows, (uint32_t*)b, rows, 0, c0, c1, 1);
}

// One delta swap of a transpose held in words: the `mask` bits of x[i] shifted up by `shift`
// trade places with the `mask` bits of x[j].
GQ_INLINE void gq_delta_swap(uint32_t* x, int i, int j, int shift, uint32_t mask) {
    const uint32_t t = ((x[i] >> shift) ^ x[j]) & mask;
    x[j] ^= t;
    x[i] ^= t << shift;
}

// The 8 x 8 matrix of nibbles held in x[0..7] (row k = x[k], column i = nibble i), transposed
// in place: three delta swaps, of 16-, 8- and 4-bit blocks between rows 4, 2 and 1 apart.
GQ_INLINE void gq_nibble_transpose(uint32_t* x) {
    for (int i = 0; i < 4; ++i) gq_delta_swap(x, i, i + 4, 16, 0x0000FFFFu);
    for (int i = 0; i < 8; i += 4) {
        gq_delta_swap(x, i, i + 2, 8, 0x00FF00FFu);
        gq_delta_swap(x, i + 1, i + 3, 8, 0x00FF00FFu);
    }
    for (int i = 0; i < 8; i += 2) gq_delta_swap(x, i, i + 1, 4, 0x0F0F0F0Fu);
}

// AutoAWQ qweight [K, C] (4-bit, 8 output channels per word, channel 8c + order[i] in nibble
// i) -> GPTQ qweight [K/8, 8C] for the row blocks [b0, b1) (rows 8b..8b+7): rows 8b..8b+7 of
// word column c are an 8 x 8 matrix of nibbles (row k, nibble i), whose transpose holds, in
// row i, GPTQ's word (b, 8c + order[i]) (nibble k: input 8b + k).
// Worked example: rows 0x75316420 + 0x11111111 k (k = 0..7) of one column: channel 3 sits in
// nibble 5 of every row, holding 3 + k at row k, so GPTQ's word 3 is 0xA9876543.
GQ_INLINE void gq_awq_to_gptq_rows(const uint32_t* src, int64_t C, uint32_t* dst,
                                   const int* order, int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
        const uint32_t* in = src + b * 8 * C;
        uint32_t* out = dst + b * 8 * C;
        for (int64_t c = 0; c < C; ++c) {
            uint32_t x[8];
            for (int k = 0; k < 8; ++k) x[k] = in[k * C + c];
            gq_nibble_transpose(x);
            for (int i = 0; i < 8; ++i) out[8 * c + order[i]] = x[i];
        }
    }
}

// Tiles of gq_awq_to_transposed: 32 row blocks by 32 word columns (256 source rows of 128 bytes,
// 256 destination rows of 128 bytes; its buffer is 32 KiB, within L1).
#define GQ_AWQ_TILE 32

#if defined(__GNUC__)
// Eight words in one vector register where the target has them (two SSE2 halves otherwise):
// eight word columns transposed at once, the same delta swaps lane by lane.
typedef uint32_t gq_v8 __attribute__((vector_size(32)));
#define GQ_V8_SWAP(xi, xj, shift, mask)                           \
    do {                                                          \
        const gq_v8 t_ = (((xi) >> (shift)) ^ (xj)) & (mask);     \
        (xj) ^= t_;                                               \
        (xi) ^= t_ << (shift);                                    \
    } while (0)
#endif

// Stage one of a tile: g[b][i][c] = GPTQ's word (b0 + b, 8 (t0 + c) + order[i]), for the nb row
// blocks from b0 and the nc word columns from t0: gq_awq_to_gptq_rows' words, kept in the
// order they come out of the nibble transpose (slot i, then column) so that both the reads
// (8 source rows, consecutive columns) and the writes are whole vectors.
GQ_INLINE void gq_awq_tile(const uint32_t* src, int64_t C, int64_t b0, int64_t t0, int64_t nb,
                           int64_t nc, uint32_t g[GQ_AWQ_TILE][8][GQ_AWQ_TILE]) {
    for (int64_t b = 0; b < nb; ++b) {
        const uint32_t* in = src + 8 * (b0 + b) * C + t0;
        int64_t c = 0;
#if defined(__GNUC__)
        for (; c + 8 <= nc; c += 8) {
            gq_v8 x[8];
            for (int k = 0; k < 8; ++k) memcpy(&x[k], in + k * C + c, sizeof x[k]);
            for (int i = 0; i < 4; ++i) GQ_V8_SWAP(x[i], x[i + 4], 16, 0x0000FFFFu);
            for (int i = 0; i < 8; i += 4) {
                GQ_V8_SWAP(x[i], x[i + 2], 8, 0x00FF00FFu);
                GQ_V8_SWAP(x[i + 1], x[i + 3], 8, 0x00FF00FFu);
            }
            for (int i = 0; i < 8; i += 2) GQ_V8_SWAP(x[i], x[i + 1], 4, 0x0F0F0F0Fu);
            for (int i = 0; i < 8; ++i) memcpy(&g[b][i][c], &x[i], sizeof x[i]);
        }
#endif
        for (; c < nc; ++c) {   // the columns past the last eight (all of them without vectors)
            uint32_t x[8];
            for (int k = 0; k < 8; ++k) x[k] = in[k * C + c];
            gq_nibble_transpose(x);
            for (int i = 0; i < 8; ++i) g[b][i][c] = x[i];
        }
    }
}

// AutoAWQ qweight [K, C] -> GPTQ qweight's transpose [8C, K/8] (compressed-tensors'
// weight_packed) for the word columns [c0, c1), whose destination rows [8 c0, 8 c1) are one
// contiguous band: dst holds that band only (its row 0 is row 8 c0), so a caller can make the
// tensor a band at a time in a small buffer that stays in cache. gq_awq_to_gptq_rows' words,
// each put where the transpose puts it, with no GPTQ copy between; with `compare` (a constant
// at each call site), nothing is written and the words of dst that differ are counted instead.
// A tile (32 row blocks by 32 word columns) is built by gq_awq_tile, then each of its
// destination rows is written (or compared) 32 words at once, by gq_transpose_walk over the
// buffer; a column of tiles is walked down the row blocks, so each destination row is written
// in order.
// Source rows are C words apart and destination rows K/8 (4 KiB each at N = K = 8192): no
// prefetcher follows 256 such short runs, and a tile waited on each line in turn (1 GB/s).
// So the next tile's lines (the same source columns 256 rows down, the next 128 bytes of the
// same destination rows) are prefetched into L2 while this one is built: 2.4 to 4.0 GB/s a
// core written, 1.5 to 1.8 compared, on 112 MiB matrices (kernels built alone, in C; asked
// into L1, 1.6 to 2.7 and 1.0 to 1.2).
GQ_INLINE int64_t gq_awq_to_transposed(const uint32_t* src, int64_t K, int64_t C,
                                       uint32_t* dst, const int* order, int64_t c0, int64_t c1,
                                       int compare) {
    enum { T = GQ_AWQ_TILE };
    const int64_t blocks = K / 8;   // the length of a destination row
    int64_t differ = 0;
    uint32_t g[T][8][T];   // [row block][slot i][word column]
    for (int64_t t0 = c0; t0 < c1; t0 += T) {
        const int64_t nc = t0 + T < c1 ? T : c1 - t0;
        uint32_t* band = dst + 8 * (t0 - c0) * blocks;   // destination row 8 t0
        for (int64_t b0 = 0; b0 < blocks; b0 += T) {
            const int64_t nb = b0 + T < blocks ? T : blocks - b0;
            const int64_t next = b0 + T < blocks ? (b0 + 2 * T < blocks ? T : blocks - b0 - T) : 0;
            for (int64_t r = 0; r < 8 * next; ++r)
                for (int64_t l = 0; l < nc; l += 16)   // a 64-byte line is 16 words
                    GQ_PREFETCH(src + (8 * (b0 + T) + r) * C + t0 + l, 0);
            for (int64_t r = 0; next && r < 8 * nc; ++r)
                for (int64_t l = 0; l < next; l += 16) {
                    const uint32_t* at = band + r * blocks + b0 + T + l;
                    if (compare) GQ_PREFETCH(at, 0);
                    else GQ_PREFETCH(at, 1);
                }
            gq_awq_tile(src, C, b0, t0, nb, nc, g);
            // slot i of the tile, [nb row blocks, nc word columns], is the transpose of the
            // destination rows 8 t + order[i] (8 rows apart) at the words b0..b0+nb-1
            for (int i = 0; i < 8; ++i)
                differ += gq_transpose_walk(&g[0][i][0], 8 * T, nb,
                                            band + order[i] * blocks + b0, 8 * blocks, 0, 0,
                                            nc, compare);
        }
    }
    return differ;
}

#if defined(__GNUC__) && defined(__x86_64__) && !defined(GQ_NO_SIMD)
#include <immintrin.h>
// gq_awq_to_transposed_avx2 is built (the caller runs it where the CPU has AVX2).
#define GQ_AWQ_AVX2 1

// Its tile: 8 row blocks (64 source rows, 32 bytes of each destination row) by 32 word
// columns (128 bytes of each source row, 256 destination rows): the grain the bands of
// formats/relayout.py hand each call (AWQ_TILE word columns).
#define GQ_AWQ_AVX2_BLOCKS 8
#define GQ_AWQ_AVX2_COLUMNS 32
// How far ahead its loads are asked for (GQ_PREFETCH: into L2): the source rows of the row block this many
// blocks down, as each block is taken; with `compare`, the destination words this many tiles
// along its rows.
#define GQ_AWQ_AVX2_AHEAD 4
#define GQ_AWQ_AVX2_AHEAD_COMPARED 2

// m[r][c] -> m[c][r] for an 8 x 8 matrix of words, a row to a register: pairs of rows
// interleaved by words, then by pairs of words, then the 128-bit halves traded.
__attribute__((target("avx2"))) static inline void gq_transpose_8x8_avx2(__m256i* m) {
    __m256i a[8], b[8];
    for (int r = 0; r < 8; r += 2) {
        a[r] = _mm256_unpacklo_epi32(m[r], m[r + 1]);       // r0 r1 of columns 0 1 | 4 5
        a[r + 1] = _mm256_unpackhi_epi32(m[r], m[r + 1]);   // of columns 2 3 | 6 7
    }
    for (int r = 0; r < 8; r += 4)
        for (int s = 0; s < 2; ++s) {
            b[r + 2 * s] = _mm256_unpacklo_epi64(a[r + s], a[r + s + 2]);       // column 2s | +4
            b[r + 2 * s + 1] = _mm256_unpackhi_epi64(a[r + s], a[r + s + 2]);   // 2s + 1 | +4
        }
    for (int c = 0; c < 4; ++c) {
        m[c] = _mm256_permute2x128_si256(b[c], b[c + 4], 0x20);
        m[c + 4] = _mm256_permute2x128_si256(b[c], b[c + 4], 0x31);
    }
}

// gq_nibble_transpose lane by lane: eight word columns at once.
#define GQ_SWAP_AVX2(xi, xj, shift, mask)                                                   \
    do {                                                                                    \
        const __m256i t_ = _mm256_and_si256(                                                \
            _mm256_xor_si256(_mm256_srli_epi32((xi), (shift)), (xj)),                        \
            _mm256_set1_epi32(mask));                                                       \
        (xj) = _mm256_xor_si256((xj), t_);                                                  \
        (xi) = _mm256_xor_si256((xi), _mm256_slli_epi32(t_, (shift)));                      \
    } while (0)

__attribute__((target("avx2"))) static inline void gq_nibble_transpose_avx2(__m256i* x) {
    for (int i = 0; i < 4; ++i) GQ_SWAP_AVX2(x[i], x[i + 4], 16, 0x0000FFFF);
    for (int i = 0; i < 8; i += 4) {
        GQ_SWAP_AVX2(x[i], x[i + 2], 8, 0x00FF00FF);
        GQ_SWAP_AVX2(x[i + 1], x[i + 3], 8, 0x00FF00FF);
    }
    for (int i = 0; i < 8; i += 2) GQ_SWAP_AVX2(x[i], x[i + 1], 4, 0x0F0F0F0F);
}

// One 8 x 8 block (row block b, word column c) of gq_awq_to_transposed's band `dst` (its row 0
// is row 8 c0), word by word: the tiles' edges. Returns the words that differ with `compare`.
GQ_INLINE int64_t gq_awq_block(const uint32_t* src, int64_t C, int64_t blocks, uint32_t* dst,
                               const int* order, int64_t c0, int64_t b, int64_t c,
                               int compare) {
    uint32_t x[8];
    for (int k = 0; k < 8; ++k) x[k] = src[(8 * b + k) * C + c];
    gq_nibble_transpose(x);
    int64_t differ = 0;
    for (int i = 0; i < 8; ++i) {
        uint32_t* at = dst + (8 * (c - c0) + order[i]) * blocks + b;
        if (compare) differ += *at != x[i];
        else *at = x[i];
    }
    return differ;
}

// gq_awq_to_transposed for a CPU with AVX2, with no buffer between: eight word columns of
// eight source rows are nibble-transposed at once (a register per slot i, lanes the columns);
// eight row blocks of those give, for each slot, an 8 x 8 matrix of words whose transpose
// holds eight consecutive words of eight destination rows, each written (or compared) as one
// 32-byte run.
// Its loads are asked for ahead, a row block at a time, into L2. Asking at a tile's start for
// all of the next tile's 128 source lines, into L1, was no faster than not asking at all: the
// rows are 4 or 14 KiB apart, so those lines share a few of L1's sets and pushed each other
// out before they were read. Compared, the destination is read 32 bytes a row at a time, as
// strided as the source, and is asked for too.
// Measured on this project's 2-core machine, GB/s a core (bench/relayout_bench.py, 32 to 112
// MiB matrices): written into a reused 2 MiB band, as the shard writer does, 3.4 to 5.2
// (asked for a tile at a time into L1: 2.1 to 2.8); compared with a whole transpose in
// memory, 3.6 to 6.0 (2.1 to 2.5). `compare` is a constant at each call site
// (gq_awq_to_transposed_avx2 below).
__attribute__((target("avx2"), always_inline)) static inline int64_t gq_awq_avx2_body(
    const uint32_t* src, int64_t K, int64_t C, uint32_t* dst, const int* order, int64_t c0,
    int64_t c1, int compare) {
    enum { TB = GQ_AWQ_AVX2_BLOCKS, TC = GQ_AWQ_AVX2_COLUMNS, AHEAD = GQ_AWQ_AVX2_AHEAD,
           AHEAD_COMPARED = GQ_AWQ_AVX2_AHEAD_COMPARED };
    const int64_t blocks = K / 8;   // the length of a destination row
    int64_t differ = 0;
    __m256i g[TC / 8][8][TB];       // [eight columns][slot i][row block]
    int64_t c = c0;
    for (; c + TC <= c1; c += TC) {
        __m256i count = _mm256_setzero_si256();   // per lane at most 32 x blocks
        int64_t b = 0;
        for (; b + TB <= blocks; b += TB) {
            for (int bb = 0; bb < TB; ++bb) {
                const uint32_t* in = src + 8 * (b + bb) * C + c;
                if (b + bb + AHEAD < blocks)   // that block's lines, AHEAD blocks down
                    for (int r = 0; r < 8; ++r)
                        for (int l = 0; l < TC; l += 16)   // a 64-byte line is 16 words
                            GQ_PREFETCH(in + (8 * AHEAD + r) * C + l, 0);
                for (int h = 0; h < TC / 8; ++h) {
                    __m256i x[8];
                    for (int k = 0; k < 8; ++k)
                        x[k] = _mm256_loadu_si256((const __m256i*)(in + k * C + 8 * h));
                    gq_nibble_transpose_avx2(x);
                    for (int i = 0; i < 8; ++i) g[h][i][bb] = x[i];
                }
            }
            for (int h = 0; h < TC / 8; ++h)
                for (int i = 0; i < 8; ++i) {
                    gq_transpose_8x8_avx2(g[h][i]);   // g[h][i][j]: words b..b+7 of a row
                    uint32_t* row = dst + (8 * (c + 8 * h - c0) + order[i]) * blocks + b;
                    if (compare && b + (AHEAD_COMPARED + 1) * TB <= blocks)
                        for (int j = 0; j < 8; ++j)   // these rows' words, tiles along
                            GQ_PREFETCH(row + 8 * j * blocks + AHEAD_COMPARED * TB, 0);
                    for (int j = 0; j < 8; ++j) {
                        __m256i* at = (__m256i*)(row + 8 * j * blocks);
                        if (compare)   // equal lanes are all ones: count the others
                            count = _mm256_sub_epi32(count, _mm256_xor_si256(
                                _mm256_cmpeq_epi32(_mm256_loadu_si256(at), g[h][i][j]),
                                _mm256_set1_epi32(-1)));
                        else
                            _mm256_storeu_si256(at, g[h][i][j]);
                    }
                }
        }
        for (; b < blocks; ++b)   // the row blocks past the last tile
            for (int64_t cc = c; cc < c + TC; ++cc)
                differ += gq_awq_block(src, C, blocks, dst, order, c0, b, cc, compare);
        uint32_t lanes[8];
        _mm256_storeu_si256((__m256i*)lanes, count);
        for (int l = 0; l < 8; ++l) differ += lanes[l];
    }
    if (c < c1)   // the word columns past the last tile: their band rows, as the tiles do
        differ += gq_awq_to_transposed(src, K, C, dst + 8 * (c - c0) * blocks, order, c, c1,
                                       compare);
    return differ;
}

__attribute__((target("avx2"))) static int64_t gq_awq_to_transposed_avx2(
    const uint32_t* src, int64_t K, int64_t C, uint32_t* dst, const int* order, int64_t c0,
    int64_t c1, int compare) {
    if (compare) return gq_awq_avx2_body(src, K, C, dst, order, c0, c1, 1);
    return gq_awq_avx2_body(src, K, C, dst, order, c0, c1, 0);
}
#endif
