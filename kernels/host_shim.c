// Host entry points over gptq_dequant.h, built with g++/cc by the tests (ctypes), so CI checks the
// kernel arithmetic without a GPU.
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
#ifdef __cplusplus
}
#endif
