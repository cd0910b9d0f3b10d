// Per-element GPTQ arithmetic shared by the CUDA kernels and the host (g++) build used in CI.
//
// Codes form one little-endian bit stream cut into 32-bit words: value k sits at stream bit
// k*bits (word k*bits/32, bit k*bits%32), least significant first; 3-bit values 10 and 21 of
// each 96-bit block straddle two words. Stored zero points are read under one of three rules:
//   GQ_ZERO_V2        Z = s                       (gptq_v2)
//   GQ_ZERO_V1_NOWRAP Z = s + 1                   (gptq: vLLM gptq_gemm, ExLlamaV2)
//   GQ_ZERO_V1_WRAP   Z = (s + 1) & maxq          (gptq: AutoGPTQ exllama paths, TGI)
// and w = scale * (q - Z), computed in fp32 in this order.
#pragma once
#include <stdint.h>

#if defined(__CUDACC__)
#define GQ_HD __host__ __device__ __forceinline__
#else
#define GQ_HD static inline
#endif

enum { GQ_ZERO_V2 = 0, GQ_ZERO_V1_NOWRAP = 1, GQ_ZERO_V1_WRAP = 2 };

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

GQ_HD float gq_dequant(uint32_t q, int32_t zero, float scale) {
    return scale * (float)((int32_t)q - zero);
}
