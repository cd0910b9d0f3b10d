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
// The body of gptq_dequant_gemm, one "thread" per column, in the same order.
void gq_host_gemm(const void* x, int x_kind, const uint32_t* qweight, const uint32_t* qzeros,
                  const void* scales, int scale_kind, const int32_t* g_idx, float* y, int M,
                  int64_t K, int64_t N, int bits, int rule) {
    for (int64_t n = 0; n < N; ++n) {
        float acc[GQ_MAX_M];
        for (int m = 0; m < M; ++m) acc[m] = 0.0f;
        for (int64_t k = 0; k < K; ++k) {
            const float w = gq_weight(qweight, qzeros, scales, scale_kind, g_idx, k, n, N, bits,
                                      rule);
            for (int m = 0; m < M; ++m) acc[m] = gq_mac(acc[m], gq_load(x, m * K + k, x_kind), w);
        }
        for (int m = 0; m < M; ++m) y[m * N + n] = acc[m];
    }
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
