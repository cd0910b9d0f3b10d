// Dequant + GEMM for GPTQ: Y[m, n] = sum_k X[m, k] * W[k, n], fp32 accumulation in k order,
// W dequantized on the fly (gptq_dequant.h) under a zero-point rule. One thread per output column
// n handles every row m of X, so each qweight word is read once; neighbouring threads read
// neighbouring columns (coalesced). Compiled by CuPy's RawModule from this file's text.
#include "gptq_dequant.h"

extern "C" __global__ void gptq_dequant_gemm(
    const void* x, int x_kind, const uint32_t* qweight, const uint32_t* qzeros,
    const void* scales, int scale_kind, const int32_t* g_idx, float* y,
    int M, long long K, long long N, int bits, int rule) {
    const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N || M > GQ_MAX_M) return;
    float acc[GQ_MAX_M];
    for (int m = 0; m < M; ++m) acc[m] = 0.0f;
    for (long long k = 0; k < K; ++k) {
        const float w = gq_weight(qweight, qzeros, scales, scale_kind, g_idx, k, n, N, bits, rule);
        for (int m = 0; m < M; ++m) acc[m] = gq_mac(acc[m], gq_load(x, (long long)m * K + k, x_kind), w);
    }
    for (int m = 0; m < M; ++m) y[(long long)m * N + n] = acc[m];
}

// W itself, [K, N] fp32: for the GPU-vs-CPU equality checks and the bandwidth benchmark.
extern "C" __global__ void gptq_dequant(
    const uint32_t* qweight, const uint32_t* qzeros, const void* scales, int scale_kind,
    const int32_t* g_idx, float* w, long long K, long long N, int bits, int rule) {
    const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    for (long long k = blockIdx.y; k < K; k += gridDim.y)
        w[k * N + n] = gq_weight(qweight, qzeros, scales, scale_kind, g_idx, k, n, N, bits, rule);
}
