// Dequant + GEMM for GPTQ: Y[m, n] = sum_k X[m, k] * W[k, n] in fp32, W dequantized on the fly
// (gptq_dequant.h) under a zero-point rule. Tiled over N and K so every SM has work: a grid of
// (column blocks, K tiles of GQ_TILE_K rows); each thread sums one column of one tile for every
// row m of X in k order (each qweight word read once per tile; neighbouring threads read
// neighbouring columns, coalesced), and gptq_sum_tiles adds the tiles' partial sums in tile
// order, so the bits never depend on the launch. gptq_count_differences is the fused check for
// equivalence: both checkpoints' weights per element, compared, counted per column. Compiled by
// CuPy's RawModule from this file's text.
#include "gptq_dequant.h"

extern "C" __global__ void gptq_gemm_tiles(
    const void* x, int x_kind, const uint32_t* qweight, const uint32_t* qzeros,
    const void* scales, int scale_kind, const int32_t* g_idx, float* partial,
    int M, long long K, long long N, int bits, int rule) {
    const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long t = blockIdx.y;
    if (n >= N || M > GQ_MAX_M) return;
    float acc[GQ_MAX_M];
    gq_gemm_tile(x, x_kind, qweight, qzeros, scales, scale_kind, g_idx, M, K, N, bits, rule, n,
                 t, acc);
    for (int m = 0; m < M; ++m) partial[(t * M + m) * N + n] = acc[m];
}

// Y [M, N] from gptq_gemm_tiles' partial sums [tiles, M, N], one thread per element.
extern "C" __global__ void gptq_sum_tiles(const float* partial, float* y, long long tiles,
                                          int M, long long N) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= (long long)M * N) return;
    y[i] = gq_sum_tiles(partial, tiles, M, N, (int)(i / N), i % N);
}

// Per column n, how many k give other weight bits in checkpoint a than in b: grid (column
// blocks, K tiles), one atomic add per (tile, column) that differs (integer counts: the order
// of the adds does not matter).
extern "C" __global__ void gptq_count_differences(
    const uint32_t* qw_a, const uint32_t* qz_a, const void* sc_a, int sk_a, const int32_t* g_a,
    int rule_a, const uint32_t* qw_b, const uint32_t* qz_b, const void* sc_b, int sk_b,
    const int32_t* g_b, int rule_b, long long K, long long N, int bits,
    unsigned long long* counts) {
    const long long n = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N) return;
    const gq_side a = {qw_a, qz_a, sc_a, sk_a, g_a, rule_a};
    const gq_side b = {qw_b, qz_b, sc_b, sk_b, g_b, rule_b};
    const int d = gq_tile_differences(a, b, K, N, bits, n, blockIdx.y);
    if (d) atomicAdd(counts + n, (unsigned long long)d);
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
