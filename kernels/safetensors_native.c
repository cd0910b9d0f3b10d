// gptqfmt.safetensors_io._native: a safetensors header read in one pass, in C, and the other
// loops over a checkpoint's files and names that Python runs too slowly. Built at install
// time where a C compiler is found (setup.py marks it optional); header.py's parser reads
// every header where it is missing.
//
// scan: a safetensors header read in one pass, for the headers every writer of the field
// writes. A mixture of experts' shards hold hundreds of thousands of tensor entries;
// json.loads, then a Python object and a check per entry, took most of the time to open such
// a checkpoint. It takes only a strict subset of JSON whose meaning is plain, and answers
// None for anything else, for header.py's parser to read and report: strings of printable
// ASCII without escapes, non-negative integers of up to 18 digits, entries of exactly the
// keys dtype, shape and data_offsets, a __metadata__ object of strings, no key twice, a dtype
// it is given the size of, offsets that span the shape's bytes, tensors that tile the data
// from byte 0 without a hole or an overlap. What it answers is what header.py's parser
// answers for the same bytes (the tests hold the two equal on fixtures and on mutated
// headers).
//
// survey: many small ranges of one open file read with the GIL released, each compared with
// the first range of its group or checked for zero bytes (see survey below).
//
// crc32, crc32_pages: the undo journal's digests (gq_crc32.h), with the GIL released.
//
// index_map: model.safetensors.index.json of the plain kind in one pass; natural_order: names
// in the order of formats/gptq/checkpoint.py's natural_key; group_roles: names grouped by
// module as formats/gptq/checkpoint.py's _group does (see each below).
#define _GNU_SOURCE   // preadv2 and RWF_NOWAIT where the C library has them
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <unistd.h>

#include "gq_crc32.h"

#define MODULE_VERSION 5
#define MAX_DIMS 16      // more dimensions than any weight has: the Python parser takes those
#define MAX_DIGITS 18    // below 2^63, so no integer here overflows
#define SHAPE_CACHE 32   // distinct (dtype, shape) pairs a file's entries share objects from

typedef struct {
    const char* p;
    const char* end;
} Cursor;

static void skip_ws(Cursor* c) {
    while (c->p < c->end && (*c->p == ' ' || *c->p == '\n' || *c->p == '\r' || *c->p == '\t'))
        ++c->p;
}

static int take(Cursor* c, char ch) {
    skip_ws(c);
    if (c->p < c->end && *c->p == ch) {
        ++c->p;
        return 1;
    }
    return 0;
}

// A string of printable ASCII without escapes: its bytes [*s, *s + *n). 0 for anything else.
static int string(Cursor* c, const char** s, Py_ssize_t* n) {
    if (!take(c, '"')) return 0;
    const char* start = c->p;
    while (c->p < c->end) {
        unsigned char ch = (unsigned char)*c->p;
        if (ch == '"') {
            *s = start;
            *n = c->p - start;
            ++c->p;
            return 1;
        }
        if (ch < 0x20 || ch > 0x7e || ch == '\\') return 0;
        ++c->p;
    }
    return 0;
}

// A non-negative JSON integer of at most MAX_DIGITS digits (no sign, no leading zero, no
// fraction or exponent after it).
static int unsigned_int(Cursor* c, uint64_t* out) {
    skip_ws(c);
    const char* start = c->p;
    uint64_t v = 0;
    while (c->p < c->end && *c->p >= '0' && *c->p <= '9') {
        v = v * 10 + (uint64_t)(*c->p - '0');
        ++c->p;
    }
    Py_ssize_t digits = c->p - start;
    if (digits == 0 || digits > MAX_DIGITS || (digits > 1 && *start == '0')) return 0;
    if (c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E')) return 0;
    *out = v;
    return 1;
}

static int key_is(const char* s, Py_ssize_t n, const char* word) {
    return (Py_ssize_t)strlen(word) == n && memcmp(s, word, (size_t)n) == 0;
}

typedef struct {
    PyObject* name;  // owned
    PyObject* dtype; // borrowed from the dtype table
    PyObject* shape; // borrowed from the shape cache
    uint64_t begin, end;
    Py_ssize_t order;  // its place in the header: ties keep it, as a stable sort does
} Entry;

typedef struct {
    const char* s;   // the dtype's bytes in the header (compared by content)
    Py_ssize_t n;
    PyObject* name;  // owned: the interned str
    int bits;
} Dtype;

typedef struct {
    Py_ssize_t dtype;  // index into the dtype table
    int ndim;
    uint64_t dims[MAX_DIMS];
    uint64_t nbytes;
    PyObject* shape;   // owned tuple
} Shape;

typedef struct {
    Entry* entries;
    Py_ssize_t count, cap;
    Dtype dtypes[64];
    Py_ssize_t n_dtypes;
    Shape shapes[SHAPE_CACHE];
    Py_ssize_t n_shapes;
    PyObject* names;   // name -> None, to find a key met twice
    PyObject* metadata;
} Scan;

static void scan_free(Scan* s) {
    for (Py_ssize_t i = 0; i < s->count; ++i) Py_XDECREF(s->entries[i].name);
    PyMem_Free(s->entries);
    for (Py_ssize_t i = 0; i < s->n_dtypes; ++i) Py_XDECREF(s->dtypes[i].name);
    for (Py_ssize_t i = 0; i < s->n_shapes; ++i) Py_XDECREF(s->shapes[i].shape);
    Py_XDECREF(s->names);
    Py_XDECREF(s->metadata);
}

// The result of a step: go on, not taken (answer None), or a Python error is set.
enum { OK = 0, NOT_TAKEN = 1, ERROR = -1 };

// The dtype table's index of the dtype named by [s, s + n): looked up in `bits` (dtype name
// -> bits per element) the first time it is met in the file.
static int dtype_of(Scan* sc, PyObject* bits, const char* s, Py_ssize_t n, Py_ssize_t* index) {
    for (Py_ssize_t i = 0; i < sc->n_dtypes; ++i)
        if (sc->dtypes[i].n == n && memcmp(sc->dtypes[i].s, s, (size_t)n) == 0) {
            *index = i;
            return OK;
        }
    if (sc->n_dtypes == (Py_ssize_t)(sizeof sc->dtypes / sizeof sc->dtypes[0])) return NOT_TAKEN;
    PyObject* name = PyUnicode_FromStringAndSize(s, n);
    if (name == NULL) return ERROR;
    PyObject* b = PyDict_GetItemWithError(bits, name);
    if (b == NULL) {
        Py_DECREF(name);
        return PyErr_Occurred() ? ERROR : NOT_TAKEN;   // an unknown dtype: GQ108 there
    }
    long v = PyLong_AsLong(b);
    if (v == -1 && PyErr_Occurred()) {
        Py_DECREF(name);
        return ERROR;
    }
    PyUnicode_InternInPlace(&name);
    Dtype* d = &sc->dtypes[sc->n_dtypes];
    d->s = s;
    d->n = n;
    d->name = name;
    d->bits = (int)v;
    *index = sc->n_dtypes++;
    return OK;
}

// The shared shape tuple of (dtype, dims) and its bytes; NOT_TAKEN where the bytes overflow
// or are not whole (GQ111, GQ112 there).
static int shape_of(Scan* sc, Py_ssize_t dtype, const uint64_t* dims, int ndim,
                    PyObject** shape, uint64_t* nbytes) {
    for (Py_ssize_t i = 0; i < sc->n_shapes; ++i) {
        Shape* h = &sc->shapes[i];
        if (h->dtype == dtype && h->ndim == ndim &&
            memcmp(h->dims, dims, sizeof(uint64_t) * (size_t)ndim) == 0) {
            *shape = h->shape;
            *nbytes = h->nbytes;
            return OK;
        }
    }
    // a file of more kinds of tensor than the cache holds is rare: the Python parser reads it
    if (sc->n_shapes == SHAPE_CACHE) return NOT_TAKEN;
    uint64_t numel = 1;
    for (int i = 0; i < ndim; ++i)
        if (__builtin_mul_overflow(numel, dims[i], &numel)) return NOT_TAKEN;
    uint64_t total_bits;
    if (__builtin_mul_overflow(numel, (uint64_t)sc->dtypes[dtype].bits, &total_bits) ||
        total_bits % 8 != 0)
        return NOT_TAKEN;
    PyObject* t = PyTuple_New(ndim);
    if (t == NULL) return ERROR;
    for (int i = 0; i < ndim; ++i) {
        PyObject* d = PyLong_FromUnsignedLongLong(dims[i]);
        if (d == NULL) {
            Py_DECREF(t);
            return ERROR;
        }
        PyTuple_SET_ITEM(t, i, d);
    }
    Shape* h = &sc->shapes[sc->n_shapes++];
    h->dtype = dtype;
    h->ndim = ndim;
    memcpy(h->dims, dims, sizeof(uint64_t) * (size_t)ndim);
    h->nbytes = total_bits / 8;
    h->shape = t;   // the cache owns it
    *shape = t;
    *nbytes = h->nbytes;
    return OK;
}

static int entry(Scan* sc, Cursor* c, PyObject* bits, PyObject* name) {
    const char* ds = NULL;
    Py_ssize_t dn = 0;
    uint64_t dims[MAX_DIMS];
    int ndim = -1;
    uint64_t off[2];
    int have_off = 0;
    if (!take(c, '{')) return NOT_TAKEN;
    for (int k = 0; k < 3; ++k) {
        const char* ks;
        Py_ssize_t kn;
        if (k > 0 && !take(c, ',')) return NOT_TAKEN;
        if (!string(c, &ks, &kn) || !take(c, ':')) return NOT_TAKEN;
        if (key_is(ks, kn, "dtype") && ds == NULL) {
            if (!string(c, &ds, &dn)) return NOT_TAKEN;
        } else if (key_is(ks, kn, "shape") && ndim < 0) {
            if (!take(c, '[')) return NOT_TAKEN;
            ndim = 0;
            if (!take(c, ']')) {
                do {
                    if (ndim == MAX_DIMS || !unsigned_int(c, &dims[ndim])) return NOT_TAKEN;
                    ++ndim;
                } while (take(c, ','));
                if (!take(c, ']')) return NOT_TAKEN;
            }
        } else if (key_is(ks, kn, "data_offsets") && !have_off) {
            if (!take(c, '[') || !unsigned_int(c, &off[0]) || !take(c, ',') ||
                !unsigned_int(c, &off[1]) || !take(c, ']'))
                return NOT_TAKEN;
            have_off = 1;
        } else {
            return NOT_TAKEN;   // another key, or one of the three twice
        }
    }
    if (!take(c, '}')) return NOT_TAKEN;
    Py_ssize_t d;
    int r = dtype_of(sc, bits, ds, dn, &d);
    if (r != OK) return r;
    PyObject* shape;
    uint64_t nbytes;
    r = shape_of(sc, d, dims, ndim, &shape, &nbytes);
    if (r != OK) return r;
    if (off[1] < off[0] || off[1] - off[0] != nbytes) return NOT_TAKEN;
    if (sc->count == sc->cap) {
        Py_ssize_t cap = sc->cap ? 2 * sc->cap : 256;
        Entry* e = PyMem_Realloc(sc->entries, sizeof(Entry) * (size_t)cap);
        if (e == NULL) {
            PyErr_NoMemory();
            return ERROR;
        }
        sc->entries = e;
        sc->cap = cap;
    }
    Entry* e = &sc->entries[sc->count++];
    Py_INCREF(name);
    e->name = name;
    e->dtype = sc->dtypes[d].name;
    e->shape = shape;
    e->begin = off[0];
    e->end = off[1];
    e->order = sc->count - 1;
    return OK;
}

static int metadata(Scan* sc, Cursor* c) {
    if (sc->metadata != NULL || !take(c, '{')) return NOT_TAKEN;
    sc->metadata = PyDict_New();
    if (sc->metadata == NULL) return ERROR;
    if (take(c, '}')) return OK;
    do {
        const char *ks, *vs;
        Py_ssize_t kn, vn;
        if (!string(c, &ks, &kn) || !take(c, ':') || !string(c, &vs, &vn)) return NOT_TAKEN;
        PyObject* k = PyUnicode_FromStringAndSize(ks, kn);
        if (k == NULL) return ERROR;
        int has = PyDict_Contains(sc->metadata, k);
        PyObject* v = has == 0 ? PyUnicode_FromStringAndSize(vs, vn) : NULL;
        int r = v == NULL ? (has == 1 ? NOT_TAKEN : ERROR)
                          : (PyDict_SetItem(sc->metadata, k, v) < 0 ? ERROR : OK);
        Py_DECREF(k);
        Py_XDECREF(v);
        if (r != OK) return r;
    } while (take(c, ','));
    return take(c, '}') ? OK : NOT_TAKEN;
}

static int by_offsets(const void* a, const void* b) {
    const Entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->order < y->order ? -1 : (x->order > y->order);
}

static int header(Scan* sc, Cursor* c, PyObject* bits) {
    if (!take(c, '{')) return NOT_TAKEN;
    if (!take(c, '}')) {
        do {
            const char* ks;
            Py_ssize_t kn;
            if (!string(c, &ks, &kn) || !take(c, ':')) return NOT_TAKEN;
            int r;
            if (key_is(ks, kn, "__metadata__")) {
                r = metadata(sc, c);
            } else {
                PyObject* name = PyUnicode_FromStringAndSize(ks, kn);
                if (name == NULL) return ERROR;
                Py_ssize_t before = PyDict_GET_SIZE(sc->names);
                r = PyDict_SetItem(sc->names, name, Py_None) < 0 ? ERROR
                    : PyDict_GET_SIZE(sc->names) == before ? NOT_TAKEN   // met twice: GQ107
                    : entry(sc, c, bits, name);
                Py_DECREF(name);
            }
            if (r != OK) return r;
        } while (take(c, ','));
        if (!take(c, '}')) return NOT_TAKEN;
    }
    skip_ws(c);
    return c->p == c->end ? OK : NOT_TAKEN;
}

// scan(raw: bytes, bits: dict[str, int], info: type) -> (tensors, metadata, data_len) | None
// tensors: name -> info(name, dtype, shape, begin, end) in data order; metadata: dict or None.
static PyObject* scan(PyObject* self, PyObject* args) {
    Py_buffer raw;
    PyObject *bits, *info;
    if (!PyArg_ParseTuple(args, "y*O!O!", &raw, &PyDict_Type, &bits, &PyType_Type, &info))
        return NULL;
    if (!PyType_IsSubtype((PyTypeObject*)info, &PyTuple_Type) ||
        ((PyTypeObject*)info)->tp_basicsize != PyTuple_Type.tp_basicsize) {
        PyBuffer_Release(&raw);
        PyErr_SetString(PyExc_TypeError, "info must be a tuple type without fields of its own");
        return NULL;
    }
    Scan sc;
    memset(&sc, 0, sizeof sc);
    PyObject* out = NULL;
    PyObject* tensors = NULL;
    sc.names = PyDict_New();
    if (sc.names == NULL) goto done;
    Cursor c = {(const char*)raw.buf, (const char*)raw.buf + raw.len};
    int r = header(&sc, &c, bits);
    if (r == ERROR) goto done;
    if (r == NOT_TAKEN) {
        out = Py_NewRef(Py_None);
        goto done;
    }
    int sorted = 1;
    for (Py_ssize_t i = 1; i < sc.count && sorted; ++i)
        sorted = by_offsets(&sc.entries[i - 1], &sc.entries[i]) <= 0;
    if (!sorted) qsort(sc.entries, (size_t)sc.count, sizeof(Entry), by_offsets);
    uint64_t expected = 0;
    for (Py_ssize_t i = 0; i < sc.count; ++i) {
        if (sc.entries[i].begin != expected) {   // a hole or an overlap: GQ113 there
            out = Py_NewRef(Py_None);
            goto done;
        }
        expected = sc.entries[i].end;
    }
    tensors = PyDict_New();
    if (tensors == NULL) goto done;
    PyTypeObject* type = (PyTypeObject*)info;
    for (Py_ssize_t i = 0; i < sc.count; ++i) {
        Entry* e = &sc.entries[i];
        // what tuple.__new__(info, items) does for a named tuple, without its Python __new__
        PyObject* t = type->tp_alloc(type, 5);
        if (t == NULL) goto done;
        PyObject* begin = PyLong_FromUnsignedLongLong(e->begin);
        PyObject* end = PyLong_FromUnsignedLongLong(e->end);
        PyTuple_SET_ITEM(t, 0, Py_NewRef(e->name));
        PyTuple_SET_ITEM(t, 1, Py_NewRef(e->dtype));
        PyTuple_SET_ITEM(t, 2, Py_NewRef(e->shape));
        PyTuple_SET_ITEM(t, 3, begin);
        PyTuple_SET_ITEM(t, 4, end);
        int bad = begin == NULL || end == NULL || PyDict_SetItem(tensors, e->name, t) < 0;
        Py_DECREF(t);
        if (bad) goto done;
    }
    out = Py_BuildValue("(OOK)", tensors, sc.metadata ? sc.metadata : Py_None,
                        (unsigned long long)expected);
done:
    Py_XDECREF(tensors);
    scan_free(&sc);
    PyBuffer_Release(&raw);
    return out;
}


// -- survey ----------------------------------------------------------------------------------
#define SURVEY_EQUAL 1   // the range holds the bytes of its group's first range (that one too)
#define SURVEY_ZERO 2    // every byte of the range is 0 (ranges of group -1 only)
#define SURVEY_UNREAD 4  // the range could not be read whole: nothing is said of it

// All of [at, at + len) into buf, from `got` bytes already there; the bytes read in all.
static int64_t read_rest(int fd, char* buf, int64_t len, int64_t at, int64_t got) {
    while (got < len) {
        ssize_t n = pread(fd, buf + got, (size_t)(len - got), (off_t)(at + got));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;   // an error, or the end of the file: the caller says UNREAD
        got += n;
    }
    return got;
}

typedef struct {
    int fd;
    int64_t hint, every;
    int cold, asking;      // asking: reads that do not wait tell whether the file is cached
    int64_t told, next;    // ranges [0, told) told to the kernel; tell more at range `next`
} Ahead;

// Before range j is read: once a range is found missing from the page cache (a read that does
// not wait, at a file's first two ranges and every `every`-th after, gets less than all of
// it), the kernel is told of the ranges up to `hint` bytes past the one being read, each
// once, and more half way there; as reader.ReadAhead does for the Python reads. Returns
// the bytes of range j already read into buf.
static int64_t ahead_before(Ahead* a, const int64_t* spans, int64_t count, int64_t j,
                            char* buf) {
    int64_t got = 0;
    const int64_t at = spans[3 * j], len = spans[3 * j + 1];
#if defined(RWF_NOWAIT) && defined(POSIX_FADV_WILLNEED)
    if (!a->cold && a->asking && j % a->every <= 1 && len > 0) {
        struct iovec v = {buf, (size_t)len};
        ssize_t n = preadv2(a->fd, &v, 1, (off_t)at, RWF_NOWAIT);
        if (n == len) return len;
        if (n < 0 && errno != EAGAIN) {   // a system or file system that refuses the flag
            a->asking = 0;
            return 0;
        }
        got = n > 0 ? n : 0;
        a->cold = 1;
        a->told = a->next = j;
    }
    if (a->cold && j >= a->next) {
        int64_t total = 0, i = j;
        for (; i < count && total < a->hint; ++i) {
            if (i >= a->told && spans[3 * i + 1] > 0)
                posix_fadvise(a->fd, (off_t)spans[3 * i], (off_t)spans[3 * i + 1],
                              POSIX_FADV_WILLNEED);
            total += spans[3 * i + 1];
        }
        if (i > a->told) a->told = i;
        a->next = j + ((i - j) / 2 > 1 ? (i - j) / 2 : 1);
    }
#else
    (void)spans; (void)count; (void)j; (void)buf; (void)a; (void)at; (void)len;
#endif
    return got;
}

// Every range of spans [count, 3] (offset, length, group) of open file fd read in order and
// judged into flags (SURVEY_*): a range of group g >= 0 compared with the first range of
// group g (kept in memory, one per group, until the call returns), one of group -1 checked
// for zero bytes. Once *stop is nonzero (set by another thread) the rest are UNREAD. Called
// without the GIL. 0, or -1 where memory ran out.
static int survey_ranges(int fd, const int64_t* spans, int64_t count, int64_t groups,
                         int64_t hint, int64_t every, int cold, char* flags,
                         const volatile char* stop) {
    int64_t most = 0;
    for (int64_t j = 0; j < count; ++j)
        if (spans[3 * j + 1] > most) most = spans[3 * j + 1];
    char** reps = (char**)calloc((size_t)groups + 1, sizeof(char*));
    int64_t* rep_len = (int64_t*)calloc((size_t)groups + 1, sizeof(int64_t));
    char* scratch = (char*)malloc((size_t)most + 1);
    int failed = reps == NULL || rep_len == NULL || scratch == NULL;
    Ahead a = {fd, hint, every, cold != 0, 1, 0, 0};
    for (int64_t j = 0; j < count && !failed; ++j) {
        const int64_t at = spans[3 * j], len = spans[3 * j + 1], g = spans[3 * j + 2];
        if (*stop) {
            memset(flags + j, SURVEY_UNREAD, (size_t)(count - j));
            break;
        }
        // a group's first range is kept (the others are compared with it)
        const int first = g >= 0 && reps[g] == NULL && rep_len[g] == 0;
        char* buf = scratch;
        if (first && (buf = reps[g] = (char*)malloc((size_t)len + 1)) == NULL) {
            failed = 1;
            break;
        }
        int64_t got = read_rest(fd, buf, len, at, ahead_before(&a, spans, count, j, buf));
        char f = 0;
        if (got != len) {
            f = SURVEY_UNREAD;
            if (first) {   // the group has nothing to compare with: its ranges say nothing
                free(reps[g]);
                reps[g] = NULL;
                rep_len[g] = -1;
            }
        } else if (g < 0) {
            if (len == 0 || (buf[0] == 0 && memcmp(buf, buf + 1, (size_t)len - 1) == 0))
                f = SURVEY_ZERO;
        } else if (first) {
            rep_len[g] = len;
            f = SURVEY_EQUAL;
        } else if (reps[g] != NULL && rep_len[g] == len &&
                   memcmp(buf, reps[g], (size_t)len) == 0) {
            f = SURVEY_EQUAL;
        }
        flags[j] = f;
    }
    if (reps != NULL)
        for (int64_t g = 0; g < groups; ++g) free(reps[g]);
    free(reps);
    free(rep_len);
    free(scratch);
    return failed ? -1 : 0;
}

// Whether `name`'s text after its last dot is one of `suffixes` (a tuple of str).
static int has_suffix(PyObject* name, PyObject* suffixes) {
    Py_ssize_t n;
    const char* s = PyUnicode_AsUTF8AndSize(name, &n);
    if (s == NULL) return -1;
    const char* dot = memrchr(s, '.', (size_t)n);
    if (dot == NULL || dot == s) return 0;   // a role needs a module before it
    const char* tail = dot + 1;
    const Py_ssize_t k = n - (tail - s);
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(suffixes); ++i) {
        Py_ssize_t m;
        const char* want = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(suffixes, i), &m);
        if (want == NULL) return -1;
        if (m == k && memcmp(tail, want, (size_t)k) == 0) return 1;
    }
    return 0;
}

// One file's ranges, chosen from its header entries (survey says which) while the GIL is held.
typedef struct {
    PyObject* path;    // bytes (the file system's encoding)
    int64_t first;     // its ranges: [first, first + count) of the shared arrays
    int64_t count;
    int64_t groups;    // kinds (dtype, shape) of its whole ranges
} SurveyFile;

// Choose file `sf`'s ranges from `infos` into spans and names (from sf->first on); -1 with an
// exception set on bad input or no memory.
static int survey_choose(SurveyFile* sf, PyObject* infos, long long start, PyObject* alike,
                         PyObject* heads, long long n, long long most, int64_t* spans,
                         PyObject** names) {
    PyObject* kinds = PyDict_New();
    if (kinds == NULL) return -1;
    int64_t count = 0;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(infos); ++i) {
        PyObject* e = PyList_GET_ITEM(infos, i);
        if (!PyTuple_Check(e) || PyTuple_GET_SIZE(e) < 5 ||
            !PyUnicode_Check(PyTuple_GET_ITEM(e, 0))) {
            PyErr_SetString(PyExc_TypeError, "survey: infos must be (name, dtype, shape, "
                            "begin, end) tuples");
            goto fail;
        }
        PyObject* name = PyTuple_GET_ITEM(e, 0);
        const int whole = has_suffix(name, alike);
        const int head = whole ? 0 : has_suffix(name, heads);
        if (whole < 0 || head < 0) goto fail;
        if (!whole && !head) continue;
        const long long begin = PyLong_AsLongLong(PyTuple_GET_ITEM(e, 3));
        const long long end = PyLong_AsLongLong(PyTuple_GET_ITEM(e, 4));
        if (PyErr_Occurred()) goto fail;
        const long long size = end - begin;
        if (begin < 0 || size <= 0 || (whole && size > most)) continue;
        int64_t g = -1;
        if (whole) {
            PyObject* key = PyTuple_Pack(2, PyTuple_GET_ITEM(e, 1), PyTuple_GET_ITEM(e, 2));
            if (key == NULL) goto fail;
            PyObject* index = PyLong_FromSsize_t(PyDict_GET_SIZE(kinds));
            PyObject* got = index ? PyDict_SetDefault(kinds, key, index) : NULL;
            Py_DECREF(key);
            Py_XDECREF(index);
            if (got == NULL) goto fail;
            g = PyLong_AsLongLong(got);
        }
        const int64_t j = sf->first + count++;
        names[j] = name;   // borrowed: infos holds it for the call
        spans[3 * j] = start + begin;
        spans[3 * j + 1] = whole ? size : (size < n ? size : n);
        spans[3 * j + 2] = g;
    }
    sf->count = count;
    sf->groups = PyDict_GET_SIZE(kinds);
    Py_DECREF(kinds);
    return 0;
fail:
    Py_DECREF(kinds);
    return -1;
}

// survey(files, alike, heads, n, most, hint, every, cold, stop) -> [(rep, zero)], one per
// file.
// files: [(path, infos, data_start)]: a file's header entries (name, dtype, shape, begin,
// end) in the order to read them (the file's data order: a disk reads ahead of reads that
// move forward). An entry whose name ends in .<one of alike> of 1 to `most` bytes is compared
// whole with the first such entry of its dtype and shape in its file: rep maps each that
// holds the first one's bytes (that one too) to the first one's name. An entry ending in
// .<one of heads> has its first `n` bytes (all of a smaller one) checked: zero maps it to
// whether they are all 0 (an empty one is left out). What could not be read whole (a file
// that cannot be opened: all of it), or was not read because `stop` (a writable byte another
// thread may set while this runs) was set, is in neither. The files are opened and read with the
// GIL released, once for all of them (a thread that takes the GIL back waits for the others
// to let it go), with read-ahead as reader.ReadAhead's (hint, every; cold: from the first
// range of each file on).
static PyObject* survey(PyObject* self, PyObject* args) {
    (void)self;
    int cold;
    PyObject *files, *alike, *heads;
    long long n, most, hint, every;
    Py_buffer stop;
    if (!PyArg_ParseTuple(args, "O!O!O!LLLLpw*", &PyList_Type, &files, &PyTuple_Type, &alike,
                          &PyTuple_Type, &heads, &n, &most, &hint, &every, &cold, &stop))
        return NULL;
    if (n < 0 || most < 0 || hint < 0 || every < 1 || stop.len < 1) {
        PyBuffer_Release(&stop);
        PyErr_SetString(PyExc_ValueError, "survey: n, most and hint must be >= 0, every >= 1, "
                        "stop a writable byte");
        return NULL;
    }
    const Py_ssize_t nfiles = PyList_GET_SIZE(files);
    int64_t total = 0;
    for (Py_ssize_t f = 0; f < nfiles; ++f) {
        PyObject* t = PyList_GET_ITEM(files, f);
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 3 ||
            !PyList_Check(PyTuple_GET_ITEM(t, 1))) {
            PyErr_SetString(PyExc_TypeError, "survey: files must be (path, infos list, "
                            "data_start) tuples");
            PyBuffer_Release(&stop);
            return NULL;
        }
        total += PyList_GET_SIZE(PyTuple_GET_ITEM(t, 1));
    }
    SurveyFile* sfs = (SurveyFile*)calloc((size_t)nfiles + 1, sizeof(SurveyFile));
    PyObject** names = (PyObject**)malloc(sizeof(PyObject*) * (size_t)(total + 1));
    int64_t* spans = (int64_t*)malloc(sizeof(int64_t) * 3 * (size_t)(total + 1));
    char* flags = NULL;
    int* status = NULL;
    PyObject* out = NULL;
    if (sfs == NULL || names == NULL || spans == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t count = 0;
    for (Py_ssize_t f = 0; f < nfiles; ++f) {
        PyObject* t = PyList_GET_ITEM(files, f);
        long long start = PyLong_AsLongLong(PyTuple_GET_ITEM(t, 2));
        if (start == -1 && PyErr_Occurred()) goto done;
        if (start < 0) {
            PyErr_SetString(PyExc_ValueError, "survey: data_start must be >= 0");
            goto done;
        }
        if (!PyUnicode_FSConverter(PyTuple_GET_ITEM(t, 0), &sfs[f].path)) goto done;
        sfs[f].first = count;
        if (survey_choose(&sfs[f], PyTuple_GET_ITEM(t, 1), start, alike, heads, n, most,
                          spans, names) < 0)
            goto done;
        count += sfs[f].count;
    }
    flags = (char*)malloc((size_t)count + 1);
    status = (int*)calloc((size_t)nfiles + 1, sizeof(int));
    if (flags == NULL || status == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t f = 0; f < nfiles; ++f) {
        SurveyFile* sf = &sfs[f];
        if (sf->count == 0) continue;
        int fd = *(const volatile char*)stop.buf ? -1 :
                 open(PyBytes_AS_STRING(sf->path), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {   // stopped, or left to the reads, which report why
            memset(flags + sf->first, SURVEY_UNREAD, (size_t)sf->count);
            continue;
        }
        status[f] = survey_ranges(fd, spans + 3 * sf->first, sf->count, sf->groups, hint,
                                  every, cold, flags + sf->first, (const char*)stop.buf);
        close(fd);
    }
    Py_END_ALLOW_THREADS
    for (Py_ssize_t f = 0; f < nfiles; ++f)
        if (status[f] < 0) {
            PyErr_NoMemory();
            goto done;
        }
    out = PyList_New(nfiles);
    if (out == NULL) goto done;
    for (Py_ssize_t f = 0; f < nfiles; ++f) {
        SurveyFile* sf = &sfs[f];
        PyObject *rep = PyDict_New(), *zero = PyDict_New();
        PyObject** firsts = (PyObject**)calloc((size_t)sf->groups + 1, sizeof(PyObject*));
        int bad = rep == NULL || zero == NULL || firsts == NULL;
        for (int64_t k = 0; k < sf->count && !bad; ++k) {
            const int64_t j = sf->first + k, g = spans[3 * j + 2];
            if (flags[j] & SURVEY_UNREAD) continue;
            if (g < 0) {
                bad = PyDict_SetItem(zero, names[j],
                                     flags[j] & SURVEY_ZERO ? Py_True : Py_False) < 0;
            } else if (flags[j] & SURVEY_EQUAL) {   // a group's first range read is flagged too
                if (firsts[g] == NULL) firsts[g] = names[j];
                bad = PyDict_SetItem(rep, names[j], firsts[g]) < 0;
            }
        }
        free(firsts);
        PyObject* pair = bad ? NULL : PyTuple_Pack(2, rep, zero);
        Py_XDECREF(rep);
        Py_XDECREF(zero);
        if (pair == NULL) {
            if (!PyErr_Occurred()) PyErr_NoMemory();
            Py_CLEAR(out);
            goto done;
        }
        PyList_SET_ITEM(out, f, pair);
    }
done:
    if (sfs != NULL)
        for (Py_ssize_t f = 0; f < nfiles; ++f) Py_XDECREF(sfs[f].path);
    free(sfs);
    free(names);
    free(spans);
    free(flags);
    free(status);
    PyBuffer_Release(&stop);
    return out;
}

// Whether to take the carry-less body: `how` 0 takes it where the CPU has it, 1 never (the
// tests hold the two bodies equal on one machine).
static int crc_clmul = 0;

static uint32_t crc_run(uint32_t crc, const unsigned char* p, size_t len, int how) {
    const uint32_t reg = ~crc;
    return ~(how == 0 && crc_clmul ? gq_crc32_clmul(reg, p, len) : gq_crc32_table(reg, p, len));
}

// Bytes from which the GIL is let go while a digest is computed.
#define CRC_NOGIL (64 * 1024)

static PyObject* crc32(PyObject* self, PyObject* args) {
    (void)self;
    Py_buffer buf;
    unsigned int value = 0;
    int how = 0;
    if (!PyArg_ParseTuple(args, "y*|Ii", &buf, &value, &how)) return NULL;
    uint32_t crc;
    if (buf.len >= CRC_NOGIL) {
        Py_BEGIN_ALLOW_THREADS
        crc = crc_run(value, (const unsigned char*)buf.buf, (size_t)buf.len, how);
        Py_END_ALLOW_THREADS
    } else {
        crc = crc_run(value, (const unsigned char*)buf.buf, (size_t)buf.len, how);
    }
    PyBuffer_Release(&buf);
    return PyLong_FromUnsignedLong(crc);
}

// buffer: the bytes of a file range that starts at file offset `offset`; the range cut where
// the file's offset is a multiple of `page` (journal.pages: the first and last pieces may be
// shorter). Returns (CRC-32 of the whole range, the pieces' CRC-32 as little-endian uint32
// bytes), in one pass: the whole one combined from the pieces'.
static PyObject* crc32_pages(PyObject* self, PyObject* args) {
    (void)self;
    Py_buffer buf;
    long long offset, page;
    int how = 0;
    if (!PyArg_ParseTuple(args, "y*LL|i", &buf, &offset, &page, &how)) return NULL;
    if (offset < 0 || page < 1) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "crc32_pages: offset must be >= 0, page >= 1");
        return NULL;
    }
    const int64_t len = buf.len, lead = (page - offset % page) % page;
    const int64_t pieces = len == 0 ? 0 : (lead > 0) + (len - (lead < len ? lead : len) +
                                                        page - 1) / page;
    PyObject* digests = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(4 * pieces));
    if (digests == NULL) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    unsigned char* out = (unsigned char*)PyBytes_AS_STRING(digests);
    const unsigned char* p = (const unsigned char*)buf.buf;
    uint32_t whole = 0;
    Py_BEGIN_ALLOW_THREADS
    const uint32_t full = gq_crc32_xpow8((uint64_t)page);
    int64_t at = 0;
    for (int64_t k = 0; k < pieces; ++k) {
        const int64_t end = k == 0 && lead > 0 ? (lead < len ? lead : len)
                                               : (at + page < len ? at + page : len);
        const uint32_t c = crc_run(0, p + at, (size_t)(end - at), how);
        whole = k == 0 ? c : gq_crc32_combine(whole, c, end - at == page
                                              ? full : gq_crc32_xpow8((uint64_t)(end - at)));
        out[4 * k] = (unsigned char)c;
        out[4 * k + 1] = (unsigned char)(c >> 8);
        out[4 * k + 2] = (unsigned char)(c >> 16);
        out[4 * k + 3] = (unsigned char)(c >> 24);
        at = end;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    PyObject* crc = PyLong_FromUnsignedLong(whole);
    if (crc == NULL) {
        Py_DECREF(digests);
        return NULL;
    }
    PyObject* pair = PyTuple_Pack(2, crc, digests);
    Py_DECREF(crc);
    Py_DECREF(digests);
    return pair;
}

// index_map(raw: bytes) -> (weight_map, metadata) | None: model.safetensors.index.json read
// in one pass, as json.loads reads it, for the indexes writers write: a top-level object of
// "weight_map" (names to shard names) and "metadata" (keys to non-negative integers of up to
// 18 digits or strings), each at most once, strings of printable ASCII without escapes. None
// for anything else (another key, a nested value, a float, an escape, trailing bytes): the
// Python reader then parses and reports it. A mixture of experts' index names hundreds of
// thousands of tensors, which json.loads reads at a tenth of a second a hundred thousand.
#define INDEX_VALUES 8   // the shard names met last: an index names a few, thousands of times

static int index_object(Cursor* c, PyObject* into, int numbers) {
    // a value that repeats one of the last few is that str again, not a new one
    PyObject* seen[INDEX_VALUES] = {NULL};
    int next = 0;
    int r = OK;
    if (!take(c, '{')) return NOT_TAKEN;
    if (take(c, '}')) return OK;
    do {
        const char *ks, *vs;
        Py_ssize_t kn, vn;
        uint64_t number = 0;
        if (!string(c, &ks, &kn) || !take(c, ':')) {
            r = NOT_TAKEN;
            break;
        }
        skip_ws(c);
        int is_number = numbers && c->p < c->end && *c->p >= '0' && *c->p <= '9';
        if (is_number ? !unsigned_int(c, &number) : !string(c, &vs, &vn)) {
            r = NOT_TAKEN;
            break;
        }
        PyObject* k = PyUnicode_FromStringAndSize(ks, kn);
        if (k == NULL) {
            r = ERROR;
            break;
        }
        PyObject* v = NULL;
        if (is_number) {
            v = PyLong_FromUnsignedLongLong(number);
        } else {
            for (int i = 0; i < INDEX_VALUES && v == NULL; ++i)
                if (seen[i] != NULL && PyUnicode_GET_LENGTH(seen[i]) == vn &&
                    memcmp(PyUnicode_DATA(seen[i]), vs, (size_t)vn) == 0)
                    v = Py_NewRef(seen[i]);
            if (v == NULL && (v = PyUnicode_FromStringAndSize(vs, vn)) != NULL) {
                Py_XSETREF(seen[next], Py_NewRef(v));
                next = (next + 1) % INDEX_VALUES;
            }
        }
        // a key met twice keeps its first place and takes the last value, as json.loads does
        r = v == NULL || PyDict_SetItem(into, k, v) < 0 ? ERROR : OK;
        Py_DECREF(k);
        Py_XDECREF(v);
        if (r != OK) break;
    } while (take(c, ','));
    if (r == OK && !take(c, '}')) r = NOT_TAKEN;
    for (int i = 0; i < INDEX_VALUES; ++i) Py_XDECREF(seen[i]);
    return r;
}

static PyObject* index_map(PyObject* self, PyObject* args) {
    Py_buffer raw;
    if (!PyArg_ParseTuple(args, "y*", &raw)) return NULL;
    Cursor c = {(const char*)raw.buf, (const char*)raw.buf + raw.len};
    PyObject *weight_map = NULL, *meta = NULL, *out = NULL;
    int r = take(&c, '{') ? OK : NOT_TAKEN;
    if (r == OK && !take(&c, '}')) {
        do {
            const char* ks;
            Py_ssize_t kn;
            if (!string(&c, &ks, &kn) || !take(&c, ':')) {
                r = NOT_TAKEN;
                break;
            }
            PyObject** into = key_is(ks, kn, "weight_map") ? &weight_map
                              : key_is(ks, kn, "metadata") ? &meta : NULL;
            if (into == NULL || *into != NULL) {   // another key, or one met twice
                r = NOT_TAKEN;
                break;
            }
            *into = PyDict_New();
            if (*into == NULL) {
                r = ERROR;
                break;
            }
            r = index_object(&c, *into, into == &meta);
        } while (r == OK && take(&c, ','));
        if (r == OK && !take(&c, '}')) r = NOT_TAKEN;
    }
    skip_ws(&c);
    if (r == OK && (c.p != c.end || weight_map == NULL)) r = NOT_TAKEN;
    if (r == OK)
        out = PyTuple_Pack(2, weight_map, meta ? meta : Py_None);
    else if (r == NOT_TAKEN)
        out = Py_NewRef(Py_None);
    Py_XDECREF(weight_map);
    Py_XDECREF(meta);
    PyBuffer_Release(&raw);
    return out;
}

// natural_order(names: list[str]) -> list[str] | None: the names as
// sorted(names, key=natural_key) orders them (formats/gptq/checkpoint.py), for a mixture of
// experts' tens of thousands of module names (a Python key a name costs 4 us). A key is the
// name split at its runs of digits, text and numbers alternating from text, each number by
// value, and keys compare as Python lists: the first unequal part decides, a key that is a
// prefix of the other comes first. Names of ASCII only (Python's \d also takes other scripts'
// digits): None for any other, for the Python key to order. Equal keys ("a01", "a1") keep
// their order, as Python's sort is stable.
typedef struct {
    const char* s;
    Py_ssize_t n;
    Py_ssize_t index;
    PyObject* name;
} Natural;

static inline int is_digit(char c) { return c >= '0' && c <= '9'; }

static int natural_cmp(const void* pa, const void* pb) {
    const Natural* a = (const Natural*)pa;
    const Natural* b = (const Natural*)pb;
    // the keys' parts agree up to the first byte the names differ at, so the comparison
    // starts there: inside a text run (comparing its rest compares the run), or at the start
    // of the run of digits it falls in (a number compares whole)
    Py_ssize_t n = a->n < b->n ? a->n : b->n, p = 0;
    while (p < n && a->s[p] == b->s[p]) ++p;
    while (p > 0 && is_digit(a->s[p - 1])) --p;
    Py_ssize_t i = p, j = p;
    for (;;) {
        // a text run (possibly empty), compared as Python compares two str
        Py_ssize_t ie = i, je = j;
        while (ie < a->n && !is_digit(a->s[ie])) ++ie;
        while (je < b->n && !is_digit(b->s[je])) ++je;
        Py_ssize_t la = ie - i, lb = je - j;
        int c = memcmp(a->s + i, b->s + j, (size_t)(la < lb ? la : lb));
        if (c != 0) return c < 0 ? -1 : 1;
        if (la != lb) return la < lb ? -1 : 1;
        i = ie;
        j = je;
        // the key goes on only where a digit follows: the shorter key comes first
        int more_a = i < a->n, more_b = j < b->n;
        if (!more_a || !more_b) {
            if (more_a != more_b) return more_a ? 1 : -1;
            return a->index < b->index ? -1 : (a->index > b->index);
        }
        // a run of digits, compared by value: its leading zeros skipped, then the longer is
        // larger, else the first differing digit decides
        while (i < a->n && a->s[i] == '0') ++i;
        while (j < b->n && b->s[j] == '0') ++j;
        ie = i;
        je = j;
        while (ie < a->n && is_digit(a->s[ie])) ++ie;
        while (je < b->n && is_digit(b->s[je])) ++je;
        la = ie - i;
        lb = je - j;
        if (la != lb) return la < lb ? -1 : 1;
        c = memcmp(a->s + i, b->s + j, (size_t)la);
        if (c != 0) return c < 0 ? -1 : 1;
        i = ie;
        j = je;
    }
}

static PyObject* natural_order(PyObject* self, PyObject* arg) {
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "natural_order: names must be a list of str");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(arg);
    Natural* items = PyMem_Malloc(sizeof(Natural) * (size_t)(n > 0 ? n : 1));
    if (items == NULL) return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; ++i) {
        PyObject* name = PyList_GET_ITEM(arg, i);
        if (!PyUnicode_Check(name)) {
            PyMem_Free(items);
            PyErr_SetString(PyExc_TypeError, "natural_order: names must be a list of str");
            return NULL;
        }
        if (!PyUnicode_IS_ASCII(name)) {
            PyMem_Free(items);
            Py_RETURN_NONE;
        }
        items[i] = (Natural){(const char*)PyUnicode_DATA(name), PyUnicode_GET_LENGTH(name), i,
                             name};
    }
    qsort(items, (size_t)n, sizeof(Natural), natural_cmp);
    PyObject* out = PyList_New(n);
    if (out != NULL)
        for (Py_ssize_t i = 0; i < n; ++i) PyList_SET_ITEM(out, i, Py_NewRef(items[i].name));
    PyMem_Free(items);
    return out;
}

// group_roles(items: list, roles: tuple[str, ...]) -> (parts, rest, kinds): items are tensor
// names (str) or header entries (tuples: name, dtype, shape, ...). Each item whose name's
// text after its last dot equals one of `roles` and before it is not empty goes to
// parts[that text before][the role, the tuple's own str] = name (modules in the order first
// met); every other name to rest, in order. kinds[module] = a number that two modules share
// exactly where their (role, dtype, shape) in the order their items came are equal, for each
// module all of whose items are entries (a module with a bare name has none). What
// `prefix, _, role = name.rpartition(".")` and a dict of the roles give, without a str made
// for each role, and which modules are alike without a lookup of their tensors: a mixture
// of experts has some 150,000 names.
static PyObject* group_roles(PyObject* self, PyObject* args) {
    (void)self;
    PyObject *items, *roles;
    if (!PyArg_ParseTuple(args, "O!O!", &PyList_Type, &items, &PyTuple_Type, &roles))
        return NULL;
    const Py_ssize_t nroles = PyTuple_GET_SIZE(roles);
    for (Py_ssize_t r = 0; r < nroles; ++r)
        if (!PyUnicode_Check(PyTuple_GET_ITEM(roles, r))) {
            PyErr_SetString(PyExc_TypeError, "group_roles: roles must be a tuple of str");
            return NULL;
        }
    PyObject* parts = PyDict_New();
    PyObject* rest = PyList_New(0);
    PyObject* sigs = PyDict_New();    // module -> [role, dtype, shape, role, ...], or None
    PyObject* kinds = NULL;
    PyObject* seen = NULL;
    PyObject* out = NULL;
    if (parts == NULL || rest == NULL || sigs == NULL) goto done;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(items); ++i) {
        PyObject* item = PyList_GET_ITEM(items, i);
        PyObject* name = item;
        const int entry = PyTuple_Check(item);
        if (entry && PyTuple_GET_SIZE(item) >= 3) name = PyTuple_GET_ITEM(item, 0);
        if (!PyUnicode_Check(name) || (entry && name == item)) {
            PyErr_SetString(PyExc_TypeError, "group_roles: items must be str or (name, "
                            "dtype, shape, ...) tuples");
            goto done;
        }
        const Py_ssize_t len = PyUnicode_GET_LENGTH(name);
        const Py_ssize_t dot = len ? PyUnicode_FindChar(name, '.', 0, len, -1) : -1;
        if (dot == -2) goto done;
        PyObject* role = NULL;
        if (dot > 0)   // a role needs a module before it
            for (Py_ssize_t r = 0; r < nroles && role == NULL; ++r) {
                PyObject* want = PyTuple_GET_ITEM(roles, r);
                if (PyUnicode_GET_LENGTH(want) != len - dot - 1) continue;
                const Py_ssize_t hit = PyUnicode_Tailmatch(name, want, dot + 1, len, 1);
                if (hit < 0) goto done;
                if (hit) role = want;
            }
        if (role == NULL) {
            if (PyList_Append(rest, name) < 0) goto done;
            continue;
        }
        PyObject* prefix = PyUnicode_Substring(name, 0, dot);
        if (prefix == NULL) goto done;
        PyObject* mod = PyDict_GetItemWithError(parts, prefix);   // borrowed
        PyObject* sig = NULL;                                      // borrowed
        if (mod == NULL && !PyErr_Occurred()) {
            mod = PyDict_New();
            sig = mod != NULL ? PyList_New(0) : NULL;
            int bad = sig == NULL || PyDict_SetItem(parts, prefix, mod) < 0 ||
                      PyDict_SetItem(sigs, prefix, sig) < 0;
            Py_XDECREF(mod);   // parts and sigs hold them
            Py_XDECREF(sig);
            if (bad) mod = NULL;
        } else if (mod != NULL) {
            sig = PyDict_GetItemWithError(sigs, prefix);
            if (sig == NULL) mod = NULL;
        }
        if (mod == NULL || PyDict_SetItem(mod, role, name) < 0) {
            Py_DECREF(prefix);
            goto done;
        }
        int bad = 0;
        if (!entry) {   // a bare name: the module has no kind
            if (sig != Py_None) bad = PyDict_SetItem(sigs, prefix, Py_None) < 0;
        } else if (sig != Py_None) {
            bad = PyList_Append(sig, role) < 0 ||
                  PyList_Append(sig, PyTuple_GET_ITEM(item, 1)) < 0 ||
                  PyList_Append(sig, PyTuple_GET_ITEM(item, 2)) < 0;
        }
        Py_DECREF(prefix);
        if (bad) goto done;
    }
    kinds = PyDict_New();
    seen = PyDict_New();   // a kind's (role, dtype, shape, ...) -> its number
    if (kinds == NULL || seen == NULL) goto done;
    PyObject *key, *sig;
    Py_ssize_t pos = 0;
    while (PyDict_Next(sigs, &pos, &key, &sig)) {
        if (sig == Py_None) continue;
        PyObject* t = PyList_AsTuple(sig);
        PyObject* n = t != NULL ? PyLong_FromSsize_t(PyDict_GET_SIZE(seen)) : NULL;
        PyObject* got = n != NULL ? PyDict_SetDefault(seen, t, n) : NULL;   // borrowed
        int bad = got == NULL || PyDict_SetItem(kinds, key, got) < 0;
        Py_XDECREF(t);
        Py_XDECREF(n);
        if (bad) goto done;
    }
    out = PyTuple_Pack(3, parts, rest, kinds);
done:
    Py_XDECREF(parts);
    Py_XDECREF(rest);
    Py_XDECREF(sigs);
    Py_XDECREF(kinds);
    Py_XDECREF(seen);
    return out;
}

static PyMethodDef methods[] = {
    {"scan", scan, METH_VARARGS,
     "scan(raw, bits, info) -> (tensors, metadata, data_len) | None: a safetensors header "
     "of the plain kind, or None for the Python parser to read."},
    {"survey", survey, METH_VARARGS,
     "survey(files, alike, heads, n, most, hint, every, cold, stop) -> [(rep, zero)]: "
     "which small tensors of each file hold the bytes of the first of their dtype and shape "
     "there, and which begin with n zero bytes, read with the GIL released."},
    {"crc32", crc32, METH_VARARGS,
     "crc32(data, value=0, how=0) -> int: zlib.crc32(data, value), the carry-less body where "
     "the CPU has it (how=1: the table body)."},
    {"crc32_pages", crc32_pages, METH_VARARGS,
     "crc32_pages(data, offset, page, how=0) -> (crc, digests): the CRC-32 of a file range "
     "at offset and of each of its pieces cut at the file's page boundaries (uint32 "
     "little-endian bytes), in one pass."},
    {"index_map", index_map, METH_VARARGS,
     "index_map(raw) -> (weight_map, metadata) | None: a safetensors index of the plain "
     "kind, or None for json.loads to read."},
    {"natural_order", natural_order, METH_O,
     "natural_order(names) -> list | None: the names in the order of natural_key "
     "(numbers by value); None where a name is not ASCII."},
    {"group_roles", group_roles, METH_VARARGS,
     "group_roles(items, roles) -> (parts, rest, kinds): the names of each module's roles, "
     "by module, the other names, and a number per module shared by the modules alike in "
     "their roles, dtypes and shapes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_native",
    "A safetensors header and index read in one pass, many small ranges surveyed, CRC-32 "
    "and names in natural order or grouped by module "
    "(kernels/safetensors_native.c).", -1, methods,
};

PyMODINIT_FUNC PyInit__native(void) {
    gq_crc32_init();
    crc_clmul = gq_crc32_has_clmul();
    PyObject* m = PyModule_Create(&module);
    if (m != NULL && (PyModule_AddIntConstant(m, "VERSION", MODULE_VERSION) < 0 ||
                      PyModule_AddIntConstant(m, "CLMUL", crc_clmul) < 0)) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
