// Per-element GPTQ arithmetic shared by the CUDA kernel (gptq_gemm.cu) and the host build used in
// CI (host_shim.c through g++), so the GPU and the CPU twin compute the same bits.
//
// Codes form one little-endian bit stream cut into 32-bit words: value k sits at stream bit
// k*bits (word k*bits/32, bit k*bits%32), least significant first; 3-bit values 10 and 21 of
// each 96-bit block straddle two words. Stored zero points are read under one of three rules:
//   GQ_ZERO_V2        Z = s                       (gptq_v2)
//   GQ_ZERO_V1_NOWRAP Z = s + 1                   (gptq: vLLM gptq_gemm, ExLlamaV2)
//   GQ_ZERO_V1_WRAP   Z = (s + 1) & maxq          (gptq: AutoGPTQ exllama paths, TGI)
// and w = scale * (float)(q - Z), one fp32 multiply. Scales arrive as fp16 or bf16 bits and are
// widened exactly by the functions below (no device intrinsics, so the host agrees bit for bit).
#pragma once
#if defined(__CUDACC_RTC__)  // NVRTC (CuPy's RawModule) has no system headers
typedef unsigned int uint32_t;
typedef int int32_t;
typedef unsigned short uint16_t;
typedef long long int64_t;
#else
#include <stdint.h>
#endif

#if defined(__CUDACC__)
#define GQ_HD __host__ __device__ __forceinline__
#else
#define GQ_HD static inline
#endif

enum { GQ_ZERO_V2 = 0, GQ_ZERO_V1_NOWRAP = 1, GQ_ZERO_V1_WRAP = 2 };
enum { GQ_F32 = 0, GQ_F16 = 1, GQ_BF16 = 2 };
// Rows of X one GEMM call takes: each thread keeps one accumulator per row in registers.
// (The Python side reads this line: gptqfmt.resources.kernel_constant.)
#define GQ_MAX_M 16
// Input channels (k) of one tile of the tiled kernels: each (tile, column) sums its rows in k
// order from 0.0f, and the tiles' partial sums are added in tile order. The result depends on
// this number and never on the launch (grid, block, SM count); numerics/cpu.py adds in the
// same order. (Read by gptqfmt.resources.kernel_constant too.)
#define GQ_TILE_K 512

// Value k of the bit stream held in `words` (unsigned 32-bit words).
GQ_HD uint32_t gq_field(const uint32_t* words, int64_t k, int bits) {
    const int64_t bit = k * bits;
    const int64_t w = bit >> 5;
    const int off = (int)(bit & 31);
    uint32_t v = words[w] >> off;
    if (off + bits > 32) v |= words[w + 1] << (32 - off);
    return v & ((1u << bits) - 1u);
}

// Effective zero point from a stored field under `rule`.
GQ_HD int32_t gq_zero(uint32_t stored, int bits, int rule) {
    const int32_t maxq = (1 << bits) - 1;
    if (rule == GQ_ZERO_V2) return (int32_t)stored;
    if (rule == GQ_ZERO_V1_NOWRAP) return (int32_t)stored + 1;
    return ((int32_t)stored + 1) & maxq;
}

GQ_HD float gq_bits_to_float(uint32_t u) {
    union { uint32_t u; float f; } c;
    c.u = u;
    return c.f;
}

// IEEE binary16 -> binary32, exact (subnormals, infinities and NaN included).
GQ_HD float gq_half_to_float(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1Fu;
    uint32_t man = h & 0x3FFu;
    if (exp == 0x1Fu) return gq_bits_to_float(sign | 0x7F800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return gq_bits_to_float(sign);
        exp = 113;  // normalise the subnormal: 127 - 15 + 1
        while ((man & 0x400u) == 0) { man <<= 1; --exp; }
        man &= 0x3FFu;
        return gq_bits_to_float(sign | (exp << 23) | (man << 13));
    }
    return gq_bits_to_float(sign | ((exp + 112u) << 23) | (man << 13));
}

// One step of the fp32 accumulation, rounded after the multiply and after the add (never fused):
// the CUDA build uses the _rn intrinsics, the host build is compiled with -ffp-contract=off.
GQ_HD float gq_mac(float acc, float x, float w) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(acc, __fmul_rn(x, w));
#else
    const float p = x * w;
    return acc + p;
#endif
}

// An fp32 add, rounded (the tiles' partial sums are only added).
GQ_HD float gq_add(float a, float b) {
#if defined(__CUDA_ARCH__)
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

GQ_HD float gq_bf16_to_float(uint16_t h) { return gq_bits_to_float((uint32_t)h << 16); }

// A value of dtype `kind` (GQ_F32 / GQ_F16 / GQ_BF16) at index i of raw storage `p`.
GQ_HD float gq_load(const void* p, int64_t i, int kind) {
    if (kind == GQ_F16) return gq_half_to_float(((const uint16_t*)p)[i]);
    if (kind == GQ_BF16) return gq_bf16_to_float(((const uint16_t*)p)[i]);
    return ((const float*)p)[i];
}

// W[k, n] of a GPTQ Linear: qweight [K*bits/32, N] packed along k, qzeros [G, N*bits/32] packed
// along n, scales [G, N], g_idx [K].
GQ_HD float gq_weight(const uint32_t* qweight, const uint32_t* qzeros, const void* scales,
                      int scale_kind, const int32_t* g_idx, int64_t k, int64_t n, int64_t N,
                      int bits, int rule) {
    const int64_t g = g_idx[k];
    // column n of qweight is its own bit stream down the rows: its words sit N apart
    const int64_t bit = k * bits;
    const int64_t w = bit >> 5;
    const int off = (int)(bit & 31);
    uint32_t q = qweight[w * N + n] >> off;
    if (off + bits > 32) q |= qweight[(w + 1) * N + n] << (32 - off);
    q &= (1u << bits) - 1u;
    const uint32_t s = gq_field(qzeros + g * ((N * bits) >> 5), n, bits);
    const int32_t z = gq_zero(s, bits, rule);
    return gq_load(scales, g * N + n, scale_kind) * (float)((int32_t)q - z);
}

// The rows [k0, k1) of K tile t.
GQ_HD int64_t gq_tile_end(int64_t t, int64_t K) {
    const int64_t end = (t + 1) * GQ_TILE_K;
    return end < K ? end : K;
}

// One (column n, K tile t) of Y = X @ W: acc[m] = sum over the tile's k, in k order from 0.0f,
// of X[m, k] * W[k, n], each product and sum rounded to fp32 (gq_mac).
GQ_HD void gq_gemm_tile(const void* x, int x_kind, const uint32_t* qweight,
                        const uint32_t* qzeros, const void* scales, int scale_kind,
                        const int32_t* g_idx, int M, int64_t K, int64_t N, int bits, int rule,
                        int64_t n, int64_t t, float* acc) {
    for (int m = 0; m < M; ++m) acc[m] = 0.0f;
    for (int64_t k = t * GQ_TILE_K; k < gq_tile_end(t, K); ++k) {
        const float w = gq_weight(qweight, qzeros, scales, scale_kind, g_idx, k, n, N, bits, rule);
        for (int m = 0; m < M; ++m) acc[m] = gq_mac(acc[m], gq_load(x, m * K + k, x_kind), w);
    }
}

// Y[m, n] from the tiles' partial sums partial[tiles, M, N]: ((0 + p[0]) + p[1]) + ..., in
// tile order.
GQ_HD float gq_sum_tiles(const float* partial, int64_t tiles, int M, int64_t N, int m,
                         int64_t n) {
    float y = 0.0f;
    for (int64_t t = 0; t < tiles; ++t) y = gq_add(y, partial[(t * M + m) * N + n]);
    return y;
}

// One side of the fused comparison: a module's tensors and the rule its zeros are read under.
typedef struct {
    const uint32_t* qweight;
    const uint32_t* qzeros;
    const void* scales;
    int scale_kind;
    const int32_t* g_idx;
    int rule;
} gq_side;

// How many k of tile t give W_a[k, n] and W_b[k, n] with other bits: both checkpoints'
// weights computed per element and compared, never stored (equal bits: equal weights, NaN
// payloads and the sign of zero included).
GQ_HD int gq_tile_differences(gq_side a, gq_side b, int64_t K, int64_t N, int bits, int64_t n,
                              int64_t t) {
    int differ = 0;
    for (int64_t k = t * GQ_TILE_K; k < gq_tile_end(t, K); ++k) {
        union { float f; uint32_t u; } wa, wb;
        wa.f = gq_weight(a.qweight, a.qzeros, a.scales, a.scale_kind, a.g_idx, k, n, N, bits,
                         a.rule);
        wb.f = gq_weight(b.qweight, b.qzeros, b.scales, b.scale_kind, b.g_idx, k, n, N, bits,
                         b.rule);
        differ += wa.u != wb.u;
    }
    return differ;
}
