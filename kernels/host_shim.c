// Host entry points over gptq_dequant.h, built with g++ -ffp-contract=off by the tests (ctypes),
// so CI checks the kernel arithmetic, and the loop order of gptq_gemm.cu, without a GPU.
#include "gptq_dequant.h"

#ifdef __cplusplus
extern "C" {
#endif
void gq_host_fields(const uint32_t* words, int64_t n, int bits, uint32_t* out) {
    for (int64_t k = 0; k < n; ++k) out[k] = gq_field(words, k, bits);
}
void gq_host_zeros(const uint32_t* stored, int64_t n, int bits, int rule, int32_t* out) {
    for (int64_t k = 0; k < n; ++k) out[k] = gq_zero(stored[k], bits, rule);
}
void gq_host_load(const void* p, int64_t n, int kind, float* out) {
    for (int64_t i = 0; i < n; ++i) out[i] = gq_load(p, i, kind);
}
// The body of gptq_gemm_tiles, one "thread" per (tile, column): partial [tiles, M, N].
void gq_host_gemm_tiles(const void* x, int x_kind, const uint32_t* qweight,
                        const uint32_t* qzeros, const void* scales, int scale_kind,
                        const int32_t* g_idx, float* partial, int M, int64_t K, int64_t N,
                        int bits, int rule) {
    const int64_t tiles = (K + GQ_TILE_K - 1) / GQ_TILE_K;
    for (int64_t t = 0; t < tiles; ++t)
        for (int64_t n = 0; n < N; ++n) {
            float acc[GQ_MAX_M];
            gq_gemm_tile(x, x_kind, qweight, qzeros, scales, scale_kind, g_idx, M, K, N, bits,
                         rule, n, t, acc);
            for (int m = 0; m < M; ++m) partial[(t * M + m) * N + n] = acc[m];
        }
}
// The body of gptq_sum_tiles.
void gq_host_sum_tiles(const float* partial, float* y, int64_t tiles, int M, int64_t N) {
    for (int64_t i = 0; i < (int64_t)M * N; ++i)
        y[i] = gq_sum_tiles(partial, tiles, M, N, (int)(i / N), i % N);
}
// The body of gptq_count_differences.
void gq_host_count_differences(const uint32_t* qw_a, const uint32_t* qz_a, const void* sc_a,
                               int sk_a, const int32_t* g_a, int rule_a, const uint32_t* qw_b,
                               const uint32_t* qz_b, const void* sc_b, int sk_b,
                               const int32_t* g_b, int rule_b, int64_t K, int64_t N, int bits,
                               uint64_t* counts) {
    const gq_side a = {qw_a, qz_a, sc_a, sk_a, g_a, rule_a};
    const gq_side b = {qw_b, qz_b, sc_b, sk_b, g_b, rule_b};
    const int64_t tiles = (K + GQ_TILE_K - 1) / GQ_TILE_K;
    for (int64_t t = 0; t < tiles; ++t)
        for (int64_t n = 0; n < N; ++n) counts[n] += gq_tile_differences(a, b, K, N, bits, n, t);
}
// The body of gptq_dequant.
void gq_host_dequant(const uint32_t* qweight, const uint32_t* qzeros, const void* scales,
                     int scale_kind, const int32_t* g_idx, float* w, int64_t K, int64_t N,
                     int bits, int rule) {
    for (int64_t k = 0; k < K; ++k)
        for (int64_t n = 0; n < N; ++n)
            w[k * N + n] = gq_weight(qweight, qzeros, scales, scale_kind, g_idx, k, n, N, bits,
                                     rule);
}
#ifdef __cplusplus
}
#endif
