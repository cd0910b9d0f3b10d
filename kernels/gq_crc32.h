// CRC-32 as zlib and gzip compute it (the reflected polynomial 0xEDB88320, the register set
// to all ones before and inverted after), for the undo journal of convert --in-place
// (gptqfmt/safetensors_io/journal.py), which digests every old and new byte of the ranges it
// rewrites and every page of the new ones: hundreds of megabytes on a 70B checkpoint, where
// zlib's loop runs at 2 to 3 GB/s a core.
//
// Two bodies that give the same answers (the tests hold both to zlib.crc32):
// - gq_crc32_table: eight bytes a step through eight 256-entry tables (any CPU);
// - gq_crc32_clmul: carry-less multiplication (x86-64 PCLMULQDQ, taken where the CPU has it),
//   which folds the message 64 bytes a step into four 128-bit remainders (the method of
//   Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ
//   Instruction", Intel, 2009), then hands the last 16 bytes to the table body.
//
// Folding, worked out for this representation. A 16-byte block loaded little-endian holds in
// bit p the coefficient of x^(127 - p), counted from the block's end (the reflected order:
// the first byte's low bit is the highest power). A block A that ends D bits before the end of
// block T adds A(x) x^D to the message. With A = A_lo x^64 + A_hi (A_lo: its first 8 bytes),
// A(x) x^D = A_lo x^(D + 64) + A_hi x^D, and modulo P each power is a polynomial of degree
// < 32. A carry-less product of a 64-bit half (bit i: x^(63 - i)) by a constant whose bit j is
// the coefficient of x^(32 - j) has in bit t = i + j the coefficient of x^(95 - t); for it to
// land in T's bit t (x^(127 - t)) the constant must be x^(D + 64 - 32) mod P for A_lo and
// x^(D - 32) mod P for A_hi. So with D = 512 (four blocks apart) the constants are
// x^544 and x^480 mod P, with D = 128 x^160 and x^96, each its 32 coefficients reversed into
// bits 32..1 (tests/unit/test_gq_crc32.py derives them). The products have fewer than 97
// bits, so one XOR into T keeps T congruent to the message modulo P; the CRC of the message is
// then the CRC of what is left, which the table body takes from a register of 0.
//
// Combining: the CRC of A then B is x^(8 |B|) crc(A) + crc(B) modulo P (with zlib's
// conditioning the all-ones terms cancel), so the CRCs of a range's pages give the range's
// without a second pass (gq_crc32_combine).
#ifndef GQ_CRC32_H
#define GQ_CRC32_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define GQ_CRC32_POLY 0xEDB88320u

static uint32_t gq_crc32_tables[8][256];

// Once, before any thread computes a CRC (the module's init).
static void gq_crc32_init(void) {
    for (uint32_t n = 0; n < 256; ++n) {
        uint32_t c = n;
        for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ GQ_CRC32_POLY : c >> 1;
        gq_crc32_tables[0][n] = c;
    }
    for (uint32_t n = 0; n < 256; ++n)
        for (int t = 1; t < 8; ++t) {
            const uint32_t c = gq_crc32_tables[t - 1][n];
            gq_crc32_tables[t][n] = (c >> 8) ^ gq_crc32_tables[0][c & 0xFF];
        }
}

static inline uint32_t gq_load32le(const unsigned char* p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

// The register after `len` bytes from register `reg` (not conditioned: zlib's crc32(c, ...)
// is ~gq_crc32_table(~c, ...)).
static uint32_t gq_crc32_table(uint32_t reg, const unsigned char* p, size_t len) {
    const uint32_t(*T)[256] = (const uint32_t(*)[256])gq_crc32_tables;
    while (len >= 8) {
        const uint32_t a = reg ^ gq_load32le(p), b = gq_load32le(p + 4);
        reg = T[7][a & 0xFF] ^ T[6][a >> 8 & 0xFF] ^ T[5][a >> 16 & 0xFF] ^ T[4][a >> 24] ^
              T[3][b & 0xFF] ^ T[2][b >> 8 & 0xFF] ^ T[1][b >> 16 & 0xFF] ^ T[0][b >> 24];
        p += 8;
        len -= 8;
    }
    while (len--) reg = (reg >> 8) ^ T[0][(reg ^ *p++) & 0xFF];
    return reg;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define GQ_CRC32_CLMUL 1
#include <cpuid.h>
#include <emmintrin.h>
#include <wmmintrin.h>

// x^(D + 32) and x^(D - 32) mod P, reversed into bits 32..1, for D = 512 and D = 128 (above)
#define GQ_K544 0x154442bd4ull
#define GQ_K480 0x1c6e41596ull
#define GQ_K160 0x1751997d0ull
#define GQ_K96 0x0ccaa009eull

__attribute__((target("pclmul,sse2"))) static inline __m128i gq_fold(__m128i a, __m128i k,
                                                                     __m128i t) {
    return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(a, k, 0x00),
                                       _mm_clmulepi64_si128(a, k, 0x11)), t);
}

// As gq_crc32_table; only where gq_crc32_has_clmul().
__attribute__((target("pclmul,sse2"))) static uint32_t gq_crc32_clmul(uint32_t reg,
                                                                      const unsigned char* p,
                                                                      size_t len) {
    if (len < 64) return gq_crc32_table(reg, p, len);
    // the register enters as the first four bytes' XOR: a register of 0 over the changed
    // bytes is the same CRC
    __m128i x0 = _mm_xor_si128(_mm_loadu_si128((const __m128i*)p), _mm_cvtsi32_si128((int)reg));
    __m128i x1 = _mm_loadu_si128((const __m128i*)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i*)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i*)(p + 48));
    p += 64;
    len -= 64;
    const __m128i k4 = _mm_set_epi64x((long long)GQ_K480, (long long)GQ_K544);
    for (; len >= 64; p += 64, len -= 64) {   // four independent chains, 64 bytes apart
        x0 = gq_fold(x0, k4, _mm_loadu_si128((const __m128i*)p));
        x1 = gq_fold(x1, k4, _mm_loadu_si128((const __m128i*)(p + 16)));
        x2 = gq_fold(x2, k4, _mm_loadu_si128((const __m128i*)(p + 32)));
        x3 = gq_fold(x3, k4, _mm_loadu_si128((const __m128i*)(p + 48)));
    }
    const __m128i k1 = _mm_set_epi64x((long long)GQ_K96, (long long)GQ_K160);
    x0 = gq_fold(gq_fold(gq_fold(x0, k1, x1), k1, x2), k1, x3);
    for (; len >= 16; p += 16, len -= 16) x0 = gq_fold(x0, k1, _mm_loadu_si128((const __m128i*)p));
    unsigned char rest[16];
    _mm_storeu_si128((__m128i*)rest, x0);
    return gq_crc32_table(gq_crc32_table(0, rest, 16), p, len);
}

static int gq_crc32_has_clmul(void) {
    unsigned a, b, c, d;
    return __get_cpuid(1, &a, &b, &c, &d) && (c & bit_PCLMUL) && (d & bit_SSE2);
}
#else
#define GQ_CRC32_CLMUL 0
static uint32_t gq_crc32_clmul(uint32_t reg, const unsigned char* p, size_t len) {
    return gq_crc32_table(reg, p, len);
}
static int gq_crc32_has_clmul(void) { return 0; }
#endif

// a * b modulo P, both in the reflected order (bit 31: x^0)
static uint32_t gq_crc32_mulmod(uint32_t a, uint32_t b) {
    uint32_t out = 0;
    for (uint32_t m = 1u << 31; m; m >>= 1) {
        if (a & m) out ^= b;
        b = b & 1 ? (b >> 1) ^ GQ_CRC32_POLY : b >> 1;   // b times x
    }
    return out;
}

// x^(8 n) modulo P, reflected: by squaring x^(2^k) for each set bit of 8 n
static uint32_t gq_crc32_xpow8(uint64_t n) {
    uint32_t out = 1u << 31, sq = 1u << 23;   // x^0; x^8
    for (; n; n >>= 1) {
        if (n & 1) out = gq_crc32_mulmod(out, sq);
        sq = gq_crc32_mulmod(sq, sq);
    }
    return out;
}

// zlib's CRC of A then B from crc(A), crc(B) and x^(8 |B|) mod P (gq_crc32_xpow8(|B|))
static inline uint32_t gq_crc32_combine(uint32_t crc_a, uint32_t crc_b, uint32_t xpow) {
    return gq_crc32_mulmod(xpow, crc_a) ^ crc_b;
}

#endif
