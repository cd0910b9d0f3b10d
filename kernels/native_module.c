// gptqfmt.bits._native: the loops of gptq_sums.h and gptq_relayout.h for the host, and the
// largest weight change over scales widened as gptq_dequant.h widens them, as a CPython
// extension. Built at
// install time where a C compiler is found (setup.py marks it optional); gptqfmt/bits/native.py
// falls back to numpy where it is missing. The GIL is released while a module is summed, so
// verify's threads sum modules on every core.
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "gptq_dequant.h"
#include "gptq_relayout.h"
#include "gptq_sums.h"

// Bytes of uint32 accumulators per column tile of the scattered sums (groups x tile): kept
// within a typical L2.
#define GQ_SCATTER_BYTES (256 * 1024)

// Whether a buffer of `len` bytes holds exactly a x b elements of `size` bytes (a, b >= 0),
// without the product overflowing: a wrapped product must never pass for a buffer's length.
static int holds(Py_ssize_t len, Py_ssize_t a, Py_ssize_t b, Py_ssize_t size) {
    if (a < 0 || b < 0 || size <= 0) return 0;
    if (a == 0 || b == 0) return len == 0;
    if (a > PY_SSIZE_T_MAX / b / size) return 0;
    return len == a * b * size;
}

// target_clones needs ifunc: glibc on x86-64 (musl's toolchains refuse it)
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__) && \
    defined(__GLIBC__)
// one build for every x86-64, with a wider-vector body picked at load where the CPU has one
#define GQ_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define GQ_CLONES
#endif

GQ_CLONES static void group_sums(const uint32_t* q, int64_t rows, int64_t N, int bits,
                                 int64_t rows_per_group, uint64_t* sums) {
    for (int64_t g = 0; g < rows / rows_per_group; ++g)
        for (int64_t c0 = 0; c0 < N; c0 += GQ_SUM_TILE) {
            const int64_t cols = N - c0 < GQ_SUM_TILE ? N - c0 : GQ_SUM_TILE;
            switch (bits) {  // a constant per case: its masks and fold fold into the loop
                case 2: gq_group_sums_bits(q, N, 2, g, rows_per_group, c0, cols, sums); break;
                case 4: gq_group_sums_bits(q, N, 4, g, rows_per_group, c0, cols, sums); break;
                default: gq_group_sums_bits(q, N, 8, g, rows_per_group, c0, cols, sums); break;
            }
        }
}

GQ_CLONES static void scattered_tile(const uint32_t* q, int64_t rows, int64_t N, int bits,
                                     const int32_t* g_idx, int64_t c0, int64_t cols,
                                     uint32_t* acc) {
    switch (bits) {
        case 2: gq_scattered_tile_bits(q, rows, N, 2, g_idx, c0, cols, acc); break;
        case 4: gq_scattered_tile_bits(q, rows, N, 4, g_idx, c0, cols, acc); break;
        default: gq_scattered_tile_bits(q, rows, N, 8, g_idx, c0, cols, acc); break;
    }
}

// 0, or -1 when the accumulators cannot be allocated.
static int scattered_sums(const uint32_t* q, int64_t rows, int64_t N, int bits,
                          const int32_t* g_idx, int64_t groups, uint64_t* sums) {
    int64_t tile = GQ_SCATTER_BYTES / (4 * (groups > 0 ? groups : 1));
    tile = tile / 16 * 16;
    if (tile < 16) tile = 16;
    if (tile > N) tile = N;
    uint32_t* acc = (uint32_t*)malloc(sizeof(uint32_t) * (size_t)(groups * tile));
    if (acc == NULL) return -1;
    for (int64_t c0 = 0; c0 < N; c0 += tile) {
        const int64_t cols = N - c0 < tile ? N - c0 : tile;
        memset(acc, 0, sizeof(uint32_t) * (size_t)(groups * cols));
        scattered_tile(q, rows, N, bits, g_idx, c0, cols, acc);
        for (int64_t g = 0; g < groups; ++g)
            for (int64_t n = 0; n < cols; ++n) sums[g * N + c0 + n] += acc[g * cols + n];
    }
    free(acc);
    return 0;
}

PyDoc_STRVAR(cell_sums_doc,
"cell_sums(qweight, rows, n, bits, g_idx, groups, rows_per_group, out)\n\n"
"Add to out [groups, n] (uint64, C order) the sum of the codes of every (group, column) of\n"
"qweight [rows, n] (32-bit words, C order; 2, 4 or 8 bits). rows_per_group > 0: groups are\n"
"runs of that many whole rows and g_idx is not read; 0: channel k (rows * 32 / bits of them)\n"
"is in group g_idx[k] (int32), each checked to lie in [0, groups).");

static PyObject* cell_sums(PyObject* self, PyObject* args) {
    Py_buffer qw, gi, out;
    Py_ssize_t rows, n, groups, rpg;
    int bits;
    if (!PyArg_ParseTuple(args, "y*nniy*nnw*", &qw, &rows, &n, &bits, &gi, &groups, &rpg, &out))
        return NULL;
    PyObject* result = NULL;
    const char* why = NULL;
    if (bits != 2 && bits != 4 && bits != 8) why = "bits must be 2, 4 or 8";
    else if (rows < 0 || n < 0 || groups < 0 || rpg < 0) why = "negative size";
    else if (!holds(qw.len, rows, n, 4)) why = "qweight is not rows x n 32-bit words";
    else if (!holds(out.len, groups, n, 8)) why = "out is not groups x n uint64";
    else if (rpg > 0 && (rows % rpg || rows / rpg != groups))
        why = "rows are not groups x rows_per_group";
    else if (rpg == 0 && !holds(gi.len, rows, 32 / bits, 4))
        why = "g_idx is not one int32 per input channel";
    if (why == NULL && rpg == 0) {
        const int32_t* g = (const int32_t*)gi.buf;
        for (Py_ssize_t k = 0; k < gi.len / 4; ++k)
            if (g[k] < 0 || g[k] >= groups) { why = "g_idx holds a group outside [0, groups)"; break; }
    }
    if (why != NULL) {
        PyErr_Format(PyExc_ValueError, "cell_sums: %s", why);
        goto done;
    }
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
    if (rpg > 0)
        group_sums((const uint32_t*)qw.buf, rows, n, bits, rpg, (uint64_t*)out.buf);
    else
        failed = scattered_sums((const uint32_t*)qw.buf, rows, n, bits,
                                (const int32_t*)gi.buf, groups, (uint64_t*)out.buf);
    Py_END_ALLOW_THREADS
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyBuffer_Release(&qw);
    PyBuffer_Release(&gi);
    PyBuffer_Release(&out);
    return result;
}

// |x| of a scale as float32 bits, 0 where the scale is not finite: positive floats order as
// their bits do, and every finite one is below 0x7F800000, so the largest is a signed integer
// max, which vectorises (a float max does not without -ffast-math). fp16 and bf16 are widened
// exactly, as gq_load does, without its loop over a subnormal's leading zeros. One loop per
// kind, signed arithmetic only (AVX2 compares and converts signed 32-bit integers only) and
// every choice a mask (a conditional float operation keeps a loop from vectorising): each of
// the loops below vectorises (gcc -fopt-info-vec).
// Worked example (fp16): 0xBC00 (-1.0): h = 0x3C00, (0x3C00 << 13) + (112 << 23) = 0x3F800000;
// 0x0003 (3 x 2^-24, subnormal): (float)3 = 0x40400000, less 24 in the exponent: 0x34400000.
// The inverse of gq_bits_to_float (gptq_dequant.h), as a signed integer.
GQ_INLINE int32_t gq_float_int_bits(float f) {
    int32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

GQ_INLINE int32_t gq_magnitude_f16(uint16_t bits) {
    const int32_t h = bits & 0x7FFF;
    // a subnormal, h x 2^-24: (float)h is exact and normal, and stays so 24 binades down
    const int32_t sub = (gq_float_int_bits((float)h) - (24 << 23)) & -(int32_t)(h != 0);
    const int32_t normal = (h << 13) + (112 << 23);
    const int32_t is_normal = -(int32_t)(h >= 0x0400);
    return ((normal & is_normal) | (sub & ~is_normal)) & -(int32_t)(h < 0x7C00);
}

GQ_INLINE int32_t gq_magnitude_f32(uint32_t u) {
    const int32_t m = (int32_t)(u & 0x7FFFFFFFu);
    return m & -(int32_t)(m < 0x7F800000);
}

GQ_INLINE int32_t gq_magnitude_bf16(uint16_t bits) { return gq_magnitude_f32((uint32_t)bits << 16); }

// |scale x d| as float32 bits, 0 where the product is not finite (an overflowing product of a
// bf16 or float32 scale near the limit is left out). |(float)d| is (float)|d| (rounding is
// symmetric) and needs no |INT32_MIN|, which would overflow.
GQ_INLINE int32_t gq_change_bits(int32_t magnitude, int32_t d) {
    const int32_t p = gq_float_int_bits(gq_bits_to_float((uint32_t)magnitude) * fabsf((float)d));
    return p & -(int32_t)(p < 0x7F800000);
}

#define GQ_LARGEST(KIND, T)                                                                  \
    GQ_CLONES static int32_t largest_change_##KIND(const T* sc, const int32_t* d, int64_t n) { \
        int32_t best = 0;                                                                    \
        for (int64_t i = 0; i < n; ++i) {                                                    \
            const int32_t v = gq_change_bits(gq_magnitude_##KIND(sc[i]), d[i]);              \
            best = v > best ? v : best;                                                      \
        }                                                                                    \
        return best;                                                                         \
    }                                                                                        \
    GQ_CLONES static int32_t largest_magnitude_##KIND(const T* sc, int64_t n) {              \
        int32_t best = 0;                                                                    \
        for (int64_t i = 0; i < n; ++i) {                                                    \
            const int32_t v = gq_magnitude_##KIND(sc[i]);                                    \
            best = v > best ? v : best;                                                      \
        }                                                                                    \
        return best;                                                                         \
    }

GQ_LARGEST(f16, uint16_t)
GQ_LARGEST(bf16, uint16_t)
GQ_LARGEST(f32, uint32_t)

static uint32_t largest_change_bits(const void* sc, int kind, const int32_t* d, int64_t n) {
    if (kind == GQ_F16) return (uint32_t)largest_change_f16((const uint16_t*)sc, d, n);
    if (kind == GQ_BF16) return (uint32_t)largest_change_bf16((const uint16_t*)sc, d, n);
    return (uint32_t)largest_change_f32((const uint32_t*)sc, d, n);
}

static uint32_t largest_magnitude_bits(const void* sc, int kind, int64_t n) {
    if (kind == GQ_F16) return (uint32_t)largest_magnitude_f16((const uint16_t*)sc, n);
    if (kind == GQ_BF16) return (uint32_t)largest_magnitude_bf16((const uint16_t*)sc, n);
    return (uint32_t)largest_magnitude_f32((const uint32_t*)sc, n);
}

// 0, or sets a ValueError naming `fn` and returns -1: `kind` is not a scale kind
static int check_kind(const char* fn, int kind) {
    if (kind == GQ_F32 || kind == GQ_F16 || kind == GQ_BF16) return 0;
    PyErr_Format(PyExc_ValueError, "%s: kind must be 0, 1 or 2", fn);
    return -1;
}

static double bits_to_double(uint32_t u) {
    union { uint32_t u; float f; } c;
    c.u = u;
    return (double)c.f;
}

PyDoc_STRVAR(largest_change_doc,
"largest_change(scales, kind, dz) -> float\n\n"
"max over the cells of |scale x dz| in float32, the finite products of finite scales only\n"
"(0.0 when there are none; a cell with dz 0 adds 0): scales a C-order buffer of kind 0\n"
"(float32), 1 (fp16 bits) or 2 (bf16 bits), widened exactly; dz int32, one per scale.");

static PyObject* largest_change(PyObject* self, PyObject* args) {
    Py_buffer sc, dz;
    int kind;
    if (!PyArg_ParseTuple(args, "y*iy*", &sc, &kind, &dz)) return NULL;
    PyObject* result = NULL;
    const Py_ssize_t n = dz.len / 4;
    if (check_kind("largest_change", kind)) {
        // check_kind said why
    } else if (dz.len % 4 || sc.len != n * (kind == GQ_F32 ? 4 : 2))
        PyErr_SetString(PyExc_ValueError, "largest_change: not one scale per dz");
    else {
        uint32_t best;
        Py_BEGIN_ALLOW_THREADS
        best = largest_change_bits(sc.buf, kind, (const int32_t*)dz.buf, n);
        Py_END_ALLOW_THREADS
        result = PyFloat_FromDouble(bits_to_double(best));
    }
    PyBuffer_Release(&sc);
    PyBuffer_Release(&dz);
    return result;
}

PyDoc_STRVAR(largest_magnitude_doc,
"largest_magnitude(scales, kind) -> float\n\n"
"max |scale| over the finite scales (0.0 when none), kind as for largest_change.");

static PyObject* largest_magnitude(PyObject* self, PyObject* args) {
    Py_buffer sc;
    int kind;
    if (!PyArg_ParseTuple(args, "y*i", &sc, &kind)) return NULL;
    PyObject* result = NULL;
    const Py_ssize_t width = kind == GQ_F32 ? 4 : 2;
    if (check_kind("largest_magnitude", kind)) {
        // check_kind said why
    } else if (sc.len % width)
        PyErr_SetString(PyExc_ValueError, "largest_magnitude: not whole scales");
    else {
        uint32_t best;
        Py_BEGIN_ALLOW_THREADS
        best = largest_magnitude_bits(sc.buf, kind, sc.len / width);
        Py_END_ALLOW_THREADS
        result = PyFloat_FromDouble(bits_to_double(best));
    }
    PyBuffer_Release(&sc);
    return result;
}

// The least and the largest magnitude (the sign bit cleared, nothing widened) over n fp16 or
// bf16 values (16 bits) or float32 ones (32): as signed integers, which every x86-64 has a
// vector min and max of at 16 bits (the magnitudes are below the sign bit).
#define GQ_MAGNITUDE_RANGE(T, MAG)                                                           \
    GQ_CLONES static void magnitude_range_##T(const T* p, int64_t n, uint32_t* lo,           \
                                              uint32_t* hi) {                                \
        T a = MAG, b = 0;                                                                    \
        for (int64_t i = 0; i < n; ++i) {                                                    \
            const T m = (T)(p[i] & MAG);                                                     \
            a = m < a ? m : a;                                                               \
            b = m > b ? m : b;                                                               \
        }                                                                                    \
        *lo = (uint32_t)a;                                                                   \
        *hi = (uint32_t)b;                                                                   \
    }
GQ_MAGNITUDE_RANGE(int16_t, 0x7FFF)
GQ_MAGNITUDE_RANGE(int32_t, 0x7FFFFFFF)

PyDoc_STRVAR(magnitude_range_doc,
"magnitude_range(values, width) -> (least, largest)\n\n"
"The least and the largest of the values' bits with the sign bit cleared, values a C-order\n"
"buffer of 16-bit (width 2: fp16, bf16) or 32-bit (width 4: float32) values in native\n"
"order; (0x7FFF or 0x7FFFFFFF, 0) when there are none.");

static PyObject* magnitude_range(PyObject* self, PyObject* args) {
    Py_buffer v;
    int width;
    if (!PyArg_ParseTuple(args, "y*i", &v, &width)) return NULL;
    PyObject* result = NULL;
    if (width != 2 && width != 4)
        PyErr_SetString(PyExc_ValueError, "magnitude_range: width must be 2 or 4");
    else if (v.len % width)
        PyErr_SetString(PyExc_ValueError, "magnitude_range: not whole values");
    else {
        uint32_t lo, hi;
        Py_BEGIN_ALLOW_THREADS
        if (width == 2) magnitude_range_int16_t((const int16_t*)v.buf, v.len / 2, &lo, &hi);
        else magnitude_range_int32_t((const int32_t*)v.buf, v.len / 4, &lo, &hi);
        Py_END_ALLOW_THREADS
        result = Py_BuildValue("(kk)", (unsigned long)lo, (unsigned long)hi);
    }
    PyBuffer_Release(&v);
    return result;
}

static inline uint64_t load64(const unsigned char* p) {
    uint64_t x;
    memcpy(&x, p, 8);
    return x;
}

// Whether any `bits`-bit field (2, 4 or 8: a field never straddles a byte, so words of any
// width and byte order are their bytes) of the n bytes at p is 0, or with `ones` all ones
// (maxq). Per 64-bit superword y (complemented for maxq), ((y & L) + L) | y has a field's top
// bit set exactly where the field is not 0 (L: every field's bits below its top; the sum
// carries into the top bit where one is set, and never past it); the words' AND keeps a top
// bit only where no word had that field 0. Checked every 4 KiB, so a hit early stops early.
GQ_CLONES static int any_field(const unsigned char* p, int64_t n, int bits, int ones) {
    const uint64_t top = bits == 2 ? 0xAAAAAAAAAAAAAAAAull
                         : bits == 4 ? 0x8888888888888888ull : 0x8080808080808080ull;
    const uint64_t low = ~top, flip = ones ? ~0ull : 0ull;
    int64_t i = 0;
    while (i + 8 <= n) {
        const int64_t end = n - i >= 4096 ? i + 4096 : n - (n - i) % 8;
        uint64_t acc = ~0ull;
        for (; i < end; i += 8) {
            const uint64_t y = load64(p + i) ^ flip;
            acc &= ((y & low) + low) | y;
        }
        if ((acc & top) != top) return 1;
    }
    if (i < n) {   // the last bytes, padded with fields that are neither 0 nor maxq's match
        unsigned char rest[8];
        memset(rest, ones ? 0x00 : 0xFF, 8);
        memcpy(rest, p + i, (size_t)(n - i));
        const uint64_t y = load64(rest) ^ flip;
        if (((((y & low) + low) | y) & top) != top) return 1;
    }
    return 0;
}

PyDoc_STRVAR(has_field_doc,
"has_field(words, bits, ones) -> bool\n\n"
"Whether any bits-bit field (2, 4 or 8) of a C-order buffer of packed words is 0, or with\n"
"ones=1 all ones (maxq).");

static PyObject* has_field(PyObject* self, PyObject* args) {
    Py_buffer w;
    int bits, ones;
    if (!PyArg_ParseTuple(args, "y*ip", &w, &bits, &ones)) return NULL;
    PyObject* result = NULL;
    if (bits != 2 && bits != 4 && bits != 8)
        PyErr_SetString(PyExc_ValueError, "has_field: bits must be 2, 4 or 8");
    else {
        int found;
        Py_BEGIN_ALLOW_THREADS
        found = any_field((const unsigned char*)w.buf, w.len, bits, ones);
        Py_END_ALLOW_THREADS
        result = PyBool_FromLong(found);
    }
    PyBuffer_Release(&w);
    return result;
}

// The histogram of k = sum - c x stored over the n cells whose stored field is interior
// (0 < stored < maxq): hist[k + maxq c] over [-maxq c, maxq c] (2 maxq c + 1 bins, zeroed by
// the caller). A cell's mean code less its stored zero is k / c, so the quartiles of those
// differences are the histogram's over c. Returns the interior cells, or -1 where a sum is
// above maxq c (not the sum of c codes). Worked example, 4 bits, c = 2: stored [3, 0, 15],
// sums [9, 4, 30]: only the first is interior, k = 9 - 6 = 3, hist[3 + 30] = 1, returns 1.
GQ_CLONES static int64_t interior_histogram_of(const uint8_t* stored, const uint64_t* sums,
                                               int64_t n, int64_t c, int maxq, int64_t* hist) {
    const int64_t span = (int64_t)maxq * c;
    int64_t cells = 0;
    for (int64_t i = 0; i < n; ++i) {
        const int64_t s = stored[i];
        if (s == 0 || s >= maxq) continue;
        if (sums[i] > (uint64_t)span) return -1;
        ++hist[(int64_t)sums[i] - s * c + span];   // k in [-span, span]: s < maxq
        ++cells;
    }
    return cells;
}

PyDoc_STRVAR(interior_histogram_doc,
"interior_histogram(stored, sums, c, maxq, hist) -> int\n\n"
"Adds into hist (int64, 2 maxq c + 1 zeroed bins) each interior cell's sums - c x stored\n"
"(0 < stored < maxq; stored uint8, sums uint64, one per cell, C order), offset by maxq c;\n"
"returns the interior cells, or -1 where a sum exceeds maxq c.");

static PyObject* interior_histogram(PyObject* self, PyObject* args) {
    Py_buffer st, sm, h;
    long long c;
    int maxq;
    if (!PyArg_ParseTuple(args, "y*y*Liw*", &st, &sm, &c, &maxq, &h)) return NULL;
    PyObject* result = NULL;
    const Py_ssize_t n = st.len;
    if (c < 1 || maxq < 1 || maxq > 255)
        PyErr_SetString(PyExc_ValueError, "interior_histogram: c >= 1 and 1 <= maxq <= 255");
    else if (sm.len != n * 8 || h.len != (2 * (Py_ssize_t)maxq * c + 1) * 8)
        PyErr_SetString(PyExc_ValueError,
                        "interior_histogram: one sum per cell and 2 maxq c + 1 bins");
    else {
        int64_t cells;
        Py_BEGIN_ALLOW_THREADS
        cells = interior_histogram_of((const uint8_t*)st.buf, (const uint64_t*)sm.buf, n,
                                      (int64_t)c, maxq, (int64_t*)h.buf);
        Py_END_ALLOW_THREADS
        result = PyLong_FromLongLong(cells);
    }
    PyBuffer_Release(&st);
    PyBuffer_Release(&sm);
    PyBuffer_Release(&h);
    return result;
}

// Whether b[i] - a[i] (unsigned, wrapping at the width) is one d for every i of n elements of
// `size` bytes; d is set from the first (0 when n is 0).
#define GQ_SAME_DIFFERENCE(T)                                                                 \
    GQ_CLONES static int same_difference_##T(const T* a, const T* b, int64_t n, uint64_t* d) { \
        const T first = n ? (T)(b[0] - a[0]) : (T)0;                                          \
        T off = 0;                                                                            \
        for (int64_t i = 0; i < n; ++i) off |= (T)((T)(b[i] - a[i]) ^ first);                 \
        *d = first;                                                                           \
        return off == 0;                                                                      \
    }
GQ_SAME_DIFFERENCE(uint8_t)
GQ_SAME_DIFFERENCE(uint16_t)
GQ_SAME_DIFFERENCE(uint32_t)
GQ_SAME_DIFFERENCE(uint64_t)

PyDoc_STRVAR(same_difference_doc,
"same_difference(a, b, size) -> int | None\n\n"
"The d with b[i] - a[i] == d (unsigned, modulo 2^(8 size)) for every element of two C-order\n"
"buffers of the same length of native unsigned integers of `size` bytes (1, 2, 4 or 8), or\n"
"None where no one d holds (0 for empty buffers).");

static PyObject* same_difference(PyObject* self, PyObject* args) {
    Py_buffer a, b;
    int size;
    if (!PyArg_ParseTuple(args, "y*y*i", &a, &b, &size)) return NULL;
    PyObject* result = NULL;
    if (size != 1 && size != 2 && size != 4 && size != 8)
        PyErr_SetString(PyExc_ValueError, "same_difference: size must be 1, 2, 4 or 8");
    else if (a.len != b.len || a.len % size)
        PyErr_SetString(PyExc_ValueError, "same_difference: buffers of different lengths or "
                        "not whole elements");
    else {
        const int64_t n = a.len / size;
        uint64_t d = 0;
        int same;
        Py_BEGIN_ALLOW_THREADS
        switch (size) {
            case 1: same = same_difference_uint8_t(a.buf, b.buf, n, &d); break;
            case 2: same = same_difference_uint16_t(a.buf, b.buf, n, &d); break;
            case 4: same = same_difference_uint32_t(a.buf, b.buf, n, &d); break;
            default: same = same_difference_uint64_t(a.buf, b.buf, n, &d); break;
        }
        Py_END_ALLOW_THREADS
        if (same) result = PyLong_FromUnsignedLongLong(d);
        else result = Py_NewRef(Py_None);
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return result;
}

GQ_CLONES static void transpose_words(const uint32_t* src, int64_t rows, int64_t cols,
                                      uint32_t* dst, int64_t c0, int64_t c1) {
    gq_transpose_words(src, rows, cols, dst, c0, c1);
}

GQ_CLONES static int64_t transposed_differ(const uint32_t* a, int64_t rows, int64_t cols,
                                           const uint32_t* b, int64_t c0, int64_t c1) {
    return gq_transposed_differ(a, rows, cols, b, c0, c1);
}

// 0, or sets a ValueError naming `fn` and returns -1: the columns [c0, c1) of [rows, cols]
static int check_span(const char* fn, Py_ssize_t rows, Py_ssize_t cols, Py_ssize_t c0,
                      Py_ssize_t c1) {
    if (rows < 0 || cols < 0 || c0 < 0 || c1 < c0 || c1 > cols) {
        PyErr_Format(PyExc_ValueError, "%s: columns [%zd, %zd) of %zd x %zd", fn, c0, c1,
                     rows, cols);
        return -1;
    }
    return 0;
}

GQ_CLONES static void transpose_halves(const uint16_t* src, int64_t rows, int64_t cols,
                                       uint16_t* dst, int64_t c0, int64_t c1) {
    gq_transpose_halves(src, rows, cols, dst, c0, c1);
}

// 0, or sets a ValueError naming `fn` and returns -1: `ord` is not 8 ints, a permutation of 0..7
static int check_order(const char* fn, const Py_buffer* ord) {
    const int* order = (const int*)ord->buf;
    int seen = 0;
    if (ord->len == 8 * (Py_ssize_t)sizeof(int))
        for (int i = 0; i < 8; ++i)
            if (order[i] >= 0 && order[i] < 8) seen |= 1 << order[i];
    if (seen != 0xFF) {
        PyErr_Format(PyExc_ValueError, "%s: order is not a permutation of 0..7", fn);
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(transpose_doc,
"transpose(src, rows, cols, dst, c0, c1, itemsize)\n\n"
"dst[c - c0, r] = src[r, c] for the columns [c0, c1): src [rows, cols], and dst the rows\n"
"[c0, c1) of its transpose [cols, rows] (all of it for [0, cols)), both in C order, of 4-byte\n"
"(words) or 2-byte (fp16 or bf16) elements.");

static PyObject* transpose(PyObject* self, PyObject* args) {
    Py_buffer src, dst;
    Py_ssize_t rows, cols, c0, c1;
    int itemsize;
    if (!PyArg_ParseTuple(args, "y*nnw*nni", &src, &rows, &cols, &dst, &c0, &c1, &itemsize))
        return NULL;
    PyObject* result = NULL;
    if (check_span("transpose", rows, cols, c0, c1) == 0) {
        if (itemsize != 2 && itemsize != 4)
            PyErr_SetString(PyExc_ValueError, "transpose: itemsize must be 2 or 4");
        else if (!holds(src.len, rows, cols, itemsize))
            PyErr_SetString(PyExc_ValueError, "transpose: src is not rows x cols");
        else if (!holds(dst.len, c1 - c0, rows, itemsize))
            PyErr_SetString(PyExc_ValueError,
                            "transpose: dst is not the rows [c0, c1) of the transpose");
        else {
            Py_BEGIN_ALLOW_THREADS
            if (itemsize == 4)
                transpose_words((const uint32_t*)src.buf, rows, cols, (uint32_t*)dst.buf, c0,
                                c1);
            else
                transpose_halves((const uint16_t*)src.buf, rows, cols, (uint16_t*)dst.buf, c0,
                                 c1);
            Py_END_ALLOW_THREADS
            Py_INCREF(Py_None);
            result = Py_None;
        }
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&dst);
    return result;
}

PyDoc_STRVAR(transposed_differ_doc,
"transposed_differ(a, rows, cols, b, c0, c1) -> int\n\n"
"How many words of the columns [c0, c1) of a [rows, cols] differ from b [cols, rows] at the\n"
"transposed place (32-bit words, C order).");

static PyObject* transposed_differ_py(PyObject* self, PyObject* args) {
    Py_buffer a, b;
    Py_ssize_t rows, cols, c0, c1;
    if (!PyArg_ParseTuple(args, "y*nny*nn", &a, &rows, &cols, &b, &c0, &c1)) return NULL;
    PyObject* result = NULL;
    if (check_span("transposed_differ", rows, cols, c0, c1) == 0) {
        if (!holds(a.len, rows, cols, 4) || !holds(b.len, rows, cols, 4))
            PyErr_SetString(PyExc_ValueError,
                            "transposed_differ: a and b are not rows x cols words");
        else {
            int64_t n;
            Py_BEGIN_ALLOW_THREADS
            n = transposed_differ((const uint32_t*)a.buf, rows, cols, (const uint32_t*)b.buf,
                                  c0, c1);
            Py_END_ALLOW_THREADS
            result = PyLong_FromLongLong((long long)n);
        }
    }
    PyBuffer_Release(&a);
    PyBuffer_Release(&b);
    return result;
}

GQ_CLONES static void awq_rows(const uint32_t* src, int64_t C, uint32_t* dst, const int* order,
                               int64_t b0, int64_t b1) {
    gq_awq_to_gptq_rows(src, C, dst, order, b0, b1);
}

GQ_CLONES static int64_t awq_columns(const uint32_t* src, int64_t K, int64_t C, uint32_t* dst,
                                     const int* order, int64_t c0, int64_t c1, int compare) {
    if (compare) return gq_awq_to_transposed(src, K, C, dst, order, c0, c1, 1);
    return gq_awq_to_transposed(src, K, C, dst, order, c0, c1, 0);
}

// Whether awq_relayout's modes 1 and 2 run gq_awq_to_transposed_avx2: built for x86-64, and
// this CPU has AVX2 (else the loops every x86-64 runs, to the same words and count).
static int awq_avx2(void) {
#ifdef GQ_AWQ_AVX2
    return __builtin_cpu_supports("avx2");
#else
    return 0;
#endif
}

#ifndef GQ_AWQ_AVX2
#define gq_awq_to_transposed_avx2(src, K, C, dst, order, c0, c1, compare) 0
#endif

PyDoc_STRVAR(awq_relayout_doc,
"awq_relayout(src, rows, cols, order, dst, lo, hi, mode) -> int\n\n"
"AutoAWQ qweight src [rows, cols] (32-bit words; order: the 8 channels of a word's nibbles\n"
"0..7, int32). mode 0: GPTQ's qweight into dst [rows / 8, 8 cols] for the blocks of eight rows\n"
"[lo, hi); 1: its transpose [8 cols, rows / 8] for the word columns [lo, hi), whose rows\n"
"[8 lo, 8 hi) dst holds (and only those); 2: as 1, but dst is only read, and the count of\n"
"its words that differ is returned (0 otherwise).");

static PyObject* awq_relayout(PyObject* self, PyObject* args) {
    Py_buffer src, ord, dst;
    Py_ssize_t rows, cols, lo, hi;
    int mode;
    // mode 2 only reads dst: a read-only buffer is taken for it (checked below)
    if (!PyArg_ParseTuple(args, "y*nny*y*nni", &src, &rows, &cols, &ord, &dst, &lo, &hi, &mode))
        return NULL;
    PyObject* result = NULL;
    const int* order = (const int*)ord.buf;
    const Py_ssize_t span = mode ? cols : rows / 8;
    if (mode < 0 || mode > 2)
        PyErr_SetString(PyExc_ValueError, "awq_relayout: mode must be 0, 1 or 2");
    else if (mode < 2 && dst.readonly)
        PyErr_SetString(PyExc_ValueError, "awq_relayout: dst is read-only");
    else if (check_order("awq_relayout", &ord)) {
        // check_order said why
    } else if (rows < 0 || cols < 0 || rows % 8)
        PyErr_Format(PyExc_ValueError, "awq_relayout: %zd rows, not whole blocks of 8", rows);
    else if (lo < 0 || hi < lo || hi > span)
        PyErr_Format(PyExc_ValueError, "awq_relayout: %s [%zd, %zd) of %zd",
                     mode ? "word columns" : "row blocks", lo, hi, span);
    else if (!holds(src.len, rows, cols, 4))
        PyErr_SetString(PyExc_ValueError, "awq_relayout: src is not rows x cols words");
    else if (mode ? !holds(dst.len, 8 * (hi - lo), rows / 8, 4) : !holds(dst.len, rows, cols, 4))
        PyErr_SetString(PyExc_ValueError, mode ? "awq_relayout: dst is not the rows [8 lo, 8 hi) "
                                                 "of the transpose"
                                               : "awq_relayout: dst is not rows x cols words");
    else {
        int64_t n = 0;
        Py_BEGIN_ALLOW_THREADS
        if (mode && awq_avx2())
            n = gq_awq_to_transposed_avx2((const uint32_t*)src.buf, rows, cols,
                                          (uint32_t*)dst.buf, order, lo, hi, mode == 2);
        else if (mode)
            n = awq_columns((const uint32_t*)src.buf, rows, cols, (uint32_t*)dst.buf, order, lo,
                            hi, mode == 2);
        else
            awq_rows((const uint32_t*)src.buf, cols, (uint32_t*)dst.buf, order, lo, hi);
        Py_END_ALLOW_THREADS
        result = PyLong_FromLongLong((long long)n);
    }
    PyBuffer_Release(&src);
    PyBuffer_Release(&ord);
    PyBuffer_Release(&dst);
    return result;
}

static PyMethodDef methods[] = {
    {"cell_sums", cell_sums, METH_VARARGS, cell_sums_doc},
    {"largest_change", largest_change, METH_VARARGS, largest_change_doc},
    {"largest_magnitude", largest_magnitude, METH_VARARGS, largest_magnitude_doc},
    {"magnitude_range", magnitude_range, METH_VARARGS, magnitude_range_doc},
    {"has_field", has_field, METH_VARARGS, has_field_doc},
    {"interior_histogram", interior_histogram, METH_VARARGS, interior_histogram_doc},
    {"same_difference", same_difference, METH_VARARGS, same_difference_doc},
    {"transpose", transpose, METH_VARARGS, transpose_doc},
    {"transposed_differ", transposed_differ_py, METH_VARARGS, transposed_differ_doc},
    {"awq_relayout", awq_relayout, METH_VARARGS, awq_relayout_doc},
    {NULL, NULL, 0, NULL},
};

// The Python side (gptqfmt/bits/native.py) takes the extension only at this version: a build
// left in place from older sources is never run. Raise it with every change to what a
// function takes or gives.
#define GQ_NATIVE_VERSION 5

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "The per-cell code sums of kernels/gptq_sums.h, compiled for the host.", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    PyObject* m = PyModule_Create(&module);
    if (m != NULL && PyModule_AddIntConstant(m, "VERSION", GQ_NATIVE_VERSION) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
