/*
 * tools/npy.c - NumPy .npy reader and writer. See npy.h for the contract.
 *
 * The format (numpy/lib/format.py):
 *   "\x93NUMPY" major minor
 *   header length: uint16 LE (1.0) or uint32 LE (2.0, 3.0)
 *   header: a Python dict literal, e.g.
 *     {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
 *   padded with spaces and ended by '\n' so that the data starts at a
 *   multiple of 64 bytes
 *   data: the elements in C order
 */
#include "tools/npy.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "opjit_admin.h"

#define NPY_MAGIC "\x93NUMPY"
#define NPY_MAGIC_LEN 6
#define NPY_ALIGN 64
/* numpy refuses headers over 10000 bytes by default; we allow more but
 * bound what an untrusted length field can make us allocate. */
#define NPY_MAX_HEADER (1u << 20)
/* numpy >= 1.24 leaves room in the header to grow the first axis in place. */
#define NPY_GROWTH_AXIS_MAX_DIGITS 21

/* A dtype as .npy files spell it: every dtype of opjit's table
 * (opjit_dtype_at) that numpy has, named by numpy's kind letter and item
 * size. bfloat16 has no numpy spelling, so .npy files cannot hold it. */
typedef struct npy_dtype {
    DLDataType dt;
    const char *name; /* opjit's name, "float32" */
    char descr[8];    /* without the byte-order character: "f4" */
} npy_dtype;

static void npy_err(char *err, size_t errlen, const char *fmt, ...)
{
    if (!err || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

/* numpy's kind letter for a DLPack type code; 0 when numpy has none. */
static char npy_kind(uint8_t code)
{
    switch (code) {
    case kDLFloat: return 'f';
    case kDLInt: return 'i';
    case kDLUInt: return 'u';
    case OPJIT_DL_BOOL: return 'b';
    default: return 0;
    }
}

/* dt as a .npy dtype into *d: 0, or -1 when .npy files cannot hold it. */
static int npy_dtype_of(DLDataType dt, npy_dtype *d)
{
    char kind = npy_kind(dt.code);
    d->name = opjit_dtype_name(dt);
    if (!kind || !d->name || dt.bits % 8)
        return -1;
    d->dt = dt;
    snprintf(d->descr, sizeof d->descr, "%c%d", kind, dt.bits / 8);
    return 0;
}

const char *npy_dtype_name(DLDataType dtype)
{
    npy_dtype d;
    return npy_dtype_of(dtype, &d) == 0 ? d.name : NULL;
}

static int host_is_little_endian(void)
{
    const uint16_t one = 1;
    unsigned char b;
    memcpy(&b, &one, 1);
    return b == 1;
}

/* ---- reading ------------------------------------------------------------ */

/* Where the bytes come from: a file or a memory buffer of known size. */
typedef struct npy_src {
    FILE *f;
    const unsigned char *mem;
    uint64_t size;
} npy_src;

static int src_read(npy_src *s, uint64_t off, void *dst, size_t n)
{
    if (off > s->size || n > s->size - off)
        return -1;
    if (n == 0)
        return 0;
    if (s->mem) {
        memcpy(dst, s->mem + off, n);
        return 0;
    }
    if (fseeko(s->f, (off_t)off, SEEK_SET) != 0)
        return -1;
    return fread(dst, 1, n, s->f) == n ? 0 : -1;
}

/* A cursor over the header text. */
typedef struct hdr_cur {
    const char *p, *end;
} hdr_cur;

static void cur_ws(hdr_cur *c)
{
    while (c->p < c->end &&
           (*c->p == ' ' || *c->p == '\t' || *c->p == '\n' || *c->p == '\r'))
        c->p++;
}

static int cur_peek(hdr_cur *c)
{
    return c->p < c->end ? (unsigned char)*c->p : -1;
}

static int cur_eat(hdr_cur *c, char ch)
{
    cur_ws(c);
    if (c->p < c->end && *c->p == ch) {
        c->p++;
        return 1;
    }
    return 0;
}

/* A quoted string ('...' or "...") into out (outlen bytes). */
static int cur_string(hdr_cur *c, char *out, size_t outlen)
{
    cur_ws(c);
    int q = cur_peek(c);
    if (q != '\'' && q != '"')
        return -1;
    c->p++;
    size_t n = 0;
    while (c->p < c->end && *c->p != q) {
        if (*c->p == '\\' || n + 1 >= outlen)
            return -1;
        out[n++] = *c->p++;
    }
    if (c->p >= c->end)
        return -1;
    c->p++;
    out[n] = '\0';
    return 0;
}

static int cur_word(hdr_cur *c, const char *w)
{
    cur_ws(c);
    size_t n = strlen(w);
    if ((size_t)(c->end - c->p) < n || memcmp(c->p, w, n) != 0)
        return 0;
    /* not a prefix of a longer identifier */
    if ((size_t)(c->end - c->p) > n) {
        char nx = c->p[n];
        if ((nx >= 'a' && nx <= 'z') || (nx >= 'A' && nx <= 'Z') ||
            (nx >= '0' && nx <= '9') || nx == '_')
            return 0;
    }
    c->p += n;
    return 1;
}

typedef struct npy_header {
    char descr[64];
    int have_descr, have_fortran, have_shape;
    int fortran_order;
    int ndim;
    int64_t shape[NPY_MAX_DIMS];
} npy_header;

/* The shape tuple: "()", "(3,)", "(2, 3)", Python 2's "(3L,)". */
static int parse_shape(hdr_cur *c, npy_header *h, char *err, size_t errlen)
{
    if (!cur_eat(c, '(')) {
        npy_err(err, errlen, "bad header: 'shape' is not a tuple");
        return -1;
    }
    h->ndim = 0;
    for (;;) {
        if (cur_eat(c, ')'))
            return 0;
        cur_ws(c);
        int neg = 0;
        if (cur_peek(c) == '-' || cur_peek(c) == '+') {
            neg = *c->p == '-';
            c->p++;
        }
        int ch = cur_peek(c);
        if (ch < '0' || ch > '9') {
            npy_err(err, errlen, "bad header: 'shape' must be a tuple of integers");
            return -1;
        }
        int64_t v = 0;
        while ((ch = cur_peek(c)) >= '0' && ch <= '9') {
            if (v > (INT64_MAX - (ch - '0')) / 10) {
                npy_err(err, errlen, "bad header: dimension %d of 'shape' is too large",
                        h->ndim);
                return -1;
            }
            v = v * 10 + (ch - '0');
            c->p++;
        }
        if (cur_peek(c) == 'L' || cur_peek(c) == 'l')
            c->p++;
        if (neg && v != 0) {
            npy_err(err, errlen, "bad header: dimension %d of 'shape' is negative (-%lld)",
                    h->ndim, (long long)v);
            return -1;
        }
        if (h->ndim >= NPY_MAX_DIMS) {
            npy_err(err, errlen, "bad header: more than %d dimensions", NPY_MAX_DIMS);
            return -1;
        }
        h->shape[h->ndim++] = v;
        if (cur_eat(c, ','))
            continue;
        if (cur_eat(c, ')')) {
            /* Python writes a 1-tuple as "(3,)"; accept "(3)" too. */
            return 0;
        }
        npy_err(err, errlen, "bad header: expected ',' or ')' in 'shape'");
        return -1;
    }
}

static int parse_header(const char *text, size_t len, npy_header *h, char *err,
                        size_t errlen)
{
    hdr_cur c = {text, text + len};
    memset(h, 0, sizeof *h);
    if (!cur_eat(&c, '{')) {
        npy_err(err, errlen, "bad header: not a Python dict literal (no '{')");
        return -1;
    }
    for (;;) {
        if (cur_eat(&c, '}'))
            break;
        char key[32];
        if (cur_string(&c, key, sizeof key) != 0) {
            npy_err(err, errlen, "bad header: expected a quoted key or '}'");
            return -1;
        }
        if (!cur_eat(&c, ':')) {
            npy_err(err, errlen, "bad header: expected ':' after '%s'", key);
            return -1;
        }
        if (strcmp(key, "descr") == 0) {
            if (h->have_descr++) {
                npy_err(err, errlen, "bad header: 'descr' given twice");
                return -1;
            }
            cur_ws(&c);
            if (cur_peek(&c) == '[') {
                npy_err(err, errlen, "structured dtypes are not supported");
                return -1;
            }
            if (cur_string(&c, h->descr, sizeof h->descr) != 0) {
                npy_err(err, errlen, "bad header: 'descr' is not a string");
                return -1;
            }
        } else if (strcmp(key, "fortran_order") == 0) {
            if (h->have_fortran++) {
                npy_err(err, errlen, "bad header: 'fortran_order' given twice");
                return -1;
            }
            if (cur_word(&c, "True"))
                h->fortran_order = 1;
            else if (cur_word(&c, "False"))
                h->fortran_order = 0;
            else {
                npy_err(err, errlen, "bad header: 'fortran_order' is not True or False");
                return -1;
            }
        } else if (strcmp(key, "shape") == 0) {
            if (h->have_shape++) {
                npy_err(err, errlen, "bad header: 'shape' given twice");
                return -1;
            }
            if (parse_shape(&c, h, err, errlen) != 0)
                return -1;
        } else {
            npy_err(err, errlen, "bad header: unexpected key '%s'", key);
            return -1;
        }
        if (cur_eat(&c, ','))
            continue;
        if (cur_eat(&c, '}'))
            break;
        npy_err(err, errlen, "bad header: expected ',' or '}' after '%s'", key);
        return -1;
    }
    cur_ws(&c);
    if (c.p != c.end) {
        npy_err(err, errlen, "bad header: unexpected text after the dict");
        return -1;
    }
    if (!h->have_descr || !h->have_fortran || !h->have_shape) {
        npy_err(err, errlen, "bad header: missing key '%s'",
                !h->have_descr ? "descr" : !h->have_fortran ? "fortran_order" : "shape");
        return -1;
    }
    return 0;
}

/* "supported: float32 '<f4', ..., bool '|b1'" into buf. */
static void npy_supported(char *buf, size_t len)
{
    npy_dtype d;
    DLDataType dt;
    size_t n = (size_t)snprintf(buf, len, "supported:");
    for (int i = 0; opjit_dtype_at(i, &dt) && n < len; i++)
        if (npy_dtype_of(dt, &d) == 0)
            n += (size_t)snprintf(buf + n, len - n, "%s %s '%c%s'", n > 10 ? "," : "", d.name,
                                  dt.bits == 8 ? '|' : '<', d.descr);
}

/* descr ("<f4") -> *d: 0, or -1 with a message. */
static int descr_dtype(const char *descr, npy_dtype *d, char *err, size_t errlen)
{
    char order = descr[0];
    const char *rest = descr + 1;
    if (order != '<' && order != '>' && order != '|' && order != '=') {
        order = '=';
        rest = descr;
    }
    DLDataType dt;
    int found = 0;
    for (int i = 0; !found && opjit_dtype_at(i, &dt); i++)
        found = npy_dtype_of(dt, d) == 0 && strcmp(rest, d->descr) == 0;
    if (!found) {
        char supported[512];
        npy_supported(supported, sizeof supported);
        npy_err(err, errlen, "unsupported dtype '%s' (%s)", descr, supported);
        return -1;
    }
    if (d->dt.bits > 8) {
        if (order == '|') {
            npy_err(err, errlen, "bad dtype '%s': '|' is only for 1-byte types", descr);
            return -1;
        }
        if (order == '>' || (order == '=' && !host_is_little_endian())) {
            npy_err(err, errlen,
                    "big-endian dtype '%s' is not supported; convert it with "
                    "a.astype('<%s')", descr, d->descr);
            return -1;
        }
    }
    return 0;
}

static void *npy_alloc_data(size_t nbytes)
{
    size_t n = nbytes ? nbytes : 1;
    if (n > SIZE_MAX - (NPY_ALIGN - 1))
        return NULL;
    n = (n + NPY_ALIGN - 1) / NPY_ALIGN * NPY_ALIGN;
    return aligned_alloc(NPY_ALIGN, n);
}

/* The format version and where the header text lies: *hoff, *hlen. */
static int npy_preamble(npy_src *s, uint64_t *hoff, uint64_t *hlen, char *err, size_t errlen)
{
    unsigned char pre[12];
    size_t have = s->size < sizeof pre ? (size_t)s->size : sizeof pre;
    if (src_read(s, 0, pre, have) != 0) {
        npy_err(err, errlen, "read error: %s", strerror(errno));
        return -1;
    }
    if (memcmp(pre, NPY_MAGIC, have < NPY_MAGIC_LEN ? have : NPY_MAGIC_LEN) != 0) {
        npy_err(err, errlen, "not a .npy file (bad magic string)");
        return -1;
    }
    if (have < 10) {
        npy_err(err, errlen, "truncated: %zu bytes is too short for a .npy file", have);
        return -1;
    }
    int major = pre[6], minor = pre[7];
    if (major == 1 && minor == 0) {
        *hoff = 10;
        *hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8;
    } else if ((major == 2 || major == 3) && minor == 0) {
        if (have < 12) {
            npy_err(err, errlen, "truncated: the header length is cut off");
            return -1;
        }
        *hoff = 12;
        *hlen = (uint64_t)pre[8] | (uint64_t)pre[9] << 8 | (uint64_t)pre[10] << 16 |
                (uint64_t)pre[11] << 24;
    } else {
        npy_err(err, errlen, "unsupported .npy format version %d.%d (1.0, 2.0 and 3.0 are)",
                major, minor);
        return -1;
    }
    return 0;
}

/* Read and parse the header; *doff receives where the data starts. */
static int npy_read_header(npy_src *s, npy_header *h, uint64_t *doff, char *err, size_t errlen)
{
    uint64_t hoff, hlen;
    if (npy_preamble(s, &hoff, &hlen, err, errlen) != 0)
        return -1;
    if (hlen > s->size - hoff) {
        npy_err(err, errlen,
                "truncated: the header length (%llu bytes) goes beyond the end of "
                "the file (%llu bytes)",
                (unsigned long long)hlen, (unsigned long long)s->size);
        return -1;
    }
    if (hlen > NPY_MAX_HEADER) {
        npy_err(err, errlen, "header too large (%llu bytes)", (unsigned long long)hlen);
        return -1;
    }
    char *text = malloc((size_t)hlen + 1);
    int rc = -1;
    if (!text)
        npy_err(err, errlen, "out of memory");
    else if (src_read(s, hoff, text, (size_t)hlen) != 0)
        npy_err(err, errlen, "read error in the header");
    else {
        text[hlen] = '\0';
        rc = parse_header(text, (size_t)hlen, h, err, errlen);
    }
    free(text);
    *doff = hoff + hlen;
    return rc;
}

/* The element count and byte size of h's array, refusing overflow. */
static int npy_sizes(const npy_header *h, const npy_dtype *d, int64_t *numel, uint64_t *nbytes,
                     char *err, size_t errlen)
{
    uint64_t itemsize = d->dt.bits / 8;
    int64_t n = 1;
    for (int i = 0; i < h->ndim; i++) {
        if (h->shape[i] == 0) {
            n = 0;
            continue;
        }
        if (n != 0 && h->shape[i] > INT64_MAX / n) {
            npy_err(err, errlen, "bad header: the shape's element count overflows");
            return -1;
        }
        n *= h->shape[i];
    }
    if ((uint64_t)n > (uint64_t)INT64_MAX / itemsize ||
        (uint64_t)n * itemsize > (uint64_t)SIZE_MAX) {
        npy_err(err, errlen, "bad header: the array's byte size overflows");
        return -1;
    }
    *numel = n;
    *nbytes = (uint64_t)n * itemsize;
    return 0;
}

/* Allocate a and read its nbytes of data at doff. */
static int npy_fill(npy_src *s, const npy_header *h, uint64_t doff, npy_array *a, char *err,
                    size_t errlen)
{
    a->shape = malloc(sizeof(int64_t) * (h->ndim > 0 ? (size_t)h->ndim : 1));
    a->data = npy_alloc_data(a->nbytes);
    if (!a->shape || !a->data) {
        npy_err(err, errlen, "out of memory (%llu bytes)", (unsigned long long)a->nbytes);
        return -1;
    }
    if (src_read(s, doff, a->data, a->nbytes) != 0) {
        npy_err(err, errlen, "read error in the data (did the file change?)");
        return -1;
    }
    memcpy(a->shape, h->shape, sizeof(int64_t) * (size_t)h->ndim);
    if (h->ndim == 0)
        a->shape[0] = 1;
    a->t.data = a->data;
    a->t.device.device_type = kDLCPU;
    a->t.device.device_id = 0;
    a->t.ndim = h->ndim;
    a->t.shape = a->shape;
    a->t.strides = NULL;
    a->t.byte_offset = 0;
    return 0;
}

static int npy_load(npy_src *s, npy_array *out, char *err, size_t errlen)
{
    npy_header h;
    npy_dtype d;
    npy_array a;
    uint64_t doff, nbytes;
    memset(&a, 0, sizeof a);
    if (npy_read_header(s, &h, &doff, err, errlen) != 0 ||
        descr_dtype(h.descr, &d, err, errlen) != 0)
        return -1;
    if (h.fortran_order && h.ndim > 1) {
        npy_err(err, errlen,
                "fortran_order arrays are not supported; save a C-ordered copy "
                "(np.save(f, np.ascontiguousarray(a)))");
        return -1;
    }
    if (npy_sizes(&h, &d, &a.numel, &nbytes, err, errlen) != 0)
        return -1;
    if (nbytes > s->size - doff) {
        npy_err(err, errlen,
                "truncated: a %s array of %lld elements needs %llu data bytes, "
                "the file has %llu",
                d.name, (long long)a.numel, (unsigned long long)nbytes,
                (unsigned long long)(s->size - doff));
        return -1;
    }
    a.nbytes = (size_t)nbytes;
    a.t.dtype = d.dt;
    if (npy_fill(s, &h, doff, &a, err, errlen) != 0) {
        npy_free(&a);
        return -1;
    }
    *out = a;
    return 0;
}

int npy_read(const char *path, npy_array *out, char *err, size_t errlen)
{
    char msg[512];
    if (out)
        memset(out, 0, sizeof *out);
    if (!path || !out) {
        npy_err(err, errlen, "npy_read: NULL argument");
        return -1;
    }
    FILE *f = fopen(path, "rb");
    if (!f) {
        npy_err(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        npy_err(err, errlen, "%s: not a regular file", path);
        fclose(f);
        return -1;
    }
    npy_src s = {f, NULL, (uint64_t)st.st_size};
    int rc = npy_load(&s, out, msg, sizeof msg);
    fclose(f);
    if (rc != 0)
        npy_err(err, errlen, "%s: %s", path, msg);
    return rc;
}

int npy_read_mem(const void *buf, size_t len, npy_array *out, char *err,
                 size_t errlen)
{
    if (out)
        memset(out, 0, sizeof *out);
    if ((!buf && len) || !out) {
        npy_err(err, errlen, "npy_read_mem: NULL argument");
        return -1;
    }
    npy_src s = {NULL, buf ? buf : (const void *)"", (uint64_t)len};
    return npy_load(&s, out, err, errlen);
}

void npy_free(npy_array *a)
{
    if (!a)
        return;
    free(a->shape);
    free(a->data);
    memset(a, 0, sizeof *a);
}

/* ---- writing ------------------------------------------------------------ */

typedef struct npy_plan {
    npy_dtype d;
    char header[128 + NPY_MAX_DIMS * 24];
    size_t hlen;       /* bytes of magic + length + header text */
    size_t nbytes;     /* data bytes */
    int contiguous;
} npy_plan;

/* p->nbytes for t's shape, refusing what is not a valid tensor. */
static int npy_plan_size(const DLTensor *t, npy_plan *p, char *err, size_t errlen)
{
    if (t->ndim < 0 || t->ndim > NPY_MAX_DIMS || (t->ndim > 0 && !t->shape)) {
        npy_err(err, errlen, "bad tensor rank %d", t->ndim);
        return -1;
    }
    uint64_t itemsize = p->d.dt.bits / 8, numel = 1;
    int zero = 0;
    for (int i = 0; i < t->ndim; i++) {
        if (t->shape[i] < 0) {
            npy_err(err, errlen, "bad tensor: dimension %d is negative", i);
            return -1;
        }
        if (t->shape[i] == 0) {
            zero = 1;
        } else if (numel > (uint64_t)INT64_MAX / (uint64_t)t->shape[i]) {
            npy_err(err, errlen, "bad tensor: element count overflows");
            return -1;
        } else {
            numel *= (uint64_t)t->shape[i];
        }
    }
    if (zero)
        numel = 0;
    if (numel > SIZE_MAX / itemsize) {
        npy_err(err, errlen, "bad tensor: byte size overflows");
        return -1;
    }
    p->nbytes = (size_t)(numel * itemsize);
    if (numel > 0 && !t->data) {
        npy_err(err, errlen, "bad tensor: data is NULL");
        return -1;
    }
    return 0;
}

/* The header, as numpy.lib.format._write_array_header makes it. */
static int npy_plan_header(const DLTensor *t, npy_plan *p, char *err, size_t errlen)
{
    char dict[sizeof p->header];
    int n = snprintf(dict, sizeof dict, "{'descr': '%c%s', 'fortran_order': False, 'shape': (",
                     p->d.dt.bits == 8 ? '|' : '<', p->d.descr);
    for (int i = 0; i < t->ndim; i++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "%s%lld", i ? ", " : "",
                      (long long)t->shape[i]);
    n += snprintf(dict + n, sizeof dict - (size_t)n, "%s), }", t->ndim == 1 ? "," : "");
    if (t->ndim > 0) {
        int digits = snprintf(NULL, 0, "%lld", (long long)t->shape[0]);
        for (int i = digits; i < NPY_GROWTH_AXIS_MAX_DIGITS; i++)
            dict[n++] = ' ';
    }
    /* magic(6) + version(2) + length(2) + dict + padding + '\n' */
    size_t total = 10 + (size_t)n + 1;
    size_t pad = (NPY_ALIGN - total % NPY_ALIGN) % NPY_ALIGN;
    total += pad;
    if (total > sizeof p->header || total - 10 > 65535) {
        npy_err(err, errlen, "header too large");
        return -1;
    }
    memcpy(p->header, NPY_MAGIC, NPY_MAGIC_LEN);
    p->header[6] = 1;
    p->header[7] = 0;
    p->header[8] = (char)((total - 10) & 0xff);
    p->header[9] = (char)((total - 10) >> 8);
    memcpy(p->header + 10, dict, (size_t)n);
    memset(p->header + 10 + n, ' ', pad);
    p->header[total - 1] = '\n';
    p->hlen = total;
    return 0;
}

static int npy_plan_make(const DLTensor *t, npy_plan *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof *p);
    if (!t) {
        npy_err(err, errlen, "no tensor");
        return -1;
    }
    if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost) {
        npy_err(err, errlen, "the tensor is not in host memory (device type %d); copy "
                "it to the CPU first", (int)t->device.device_type);
        return -1;
    }
    if (npy_dtype_of(t->dtype, &p->d) != 0) {
        npy_err(err, errlen, "cannot save dtype code %d bits %d lanes %d to .npy",
                t->dtype.code, t->dtype.bits, t->dtype.lanes);
        return -1;
    }
    if (npy_plan_size(t, p, err, errlen) != 0)
        return -1;
    p->contiguous = 1;
    if (t->strides) {
        int64_t expect = 1;
        for (int i = t->ndim - 1; i >= 0; i--) {
            if (t->shape[i] != 1 && t->strides[i] != expect)
                p->contiguous = 0;
            expect *= t->shape[i] ? t->shape[i] : 1;
        }
    }
    return npy_plan_header(t, p, err, errlen);
}

/* Copy t's elements in C order into dst (p->nbytes bytes). */
static void npy_gather(const DLTensor *t, const npy_plan *p, unsigned char *dst)
{
    size_t itemsize = p->d.dt.bits / 8;
    const unsigned char *base = (const unsigned char *)t->data + t->byte_offset;
    if (p->nbytes == 0)
        return;
    if (p->contiguous) {
        memcpy(dst, base, p->nbytes);
        return;
    }
    int64_t idx[NPY_MAX_DIMS] = {0};
    size_t count = p->nbytes / itemsize;
    for (size_t k = 0; k < count; k++) {
        int64_t off = 0;
        for (int i = 0; i < t->ndim; i++)
            off += idx[i] * t->strides[i];
        memcpy(dst + k * itemsize, base + off * (int64_t)itemsize, itemsize);
        for (int i = t->ndim - 1; i >= 0; i--) {
            if (++idx[i] < t->shape[i])
                break;
            idx[i] = 0;
        }
    }
}

int npy_write_mem(const DLTensor *t, unsigned char **buf, size_t *len, char *err,
                  size_t errlen)
{
    npy_plan p;
    if (!buf || !len) {
        npy_err(err, errlen, "npy_write_mem: NULL argument");
        return -1;
    }
    *buf = NULL;
    *len = 0;
    if (npy_plan_make(t, &p, err, errlen) != 0)
        return -1;
    if (p.nbytes > SIZE_MAX - p.hlen) {
        npy_err(err, errlen, "too large");
        return -1;
    }
    unsigned char *b = malloc(p.hlen + p.nbytes);
    if (!b) {
        npy_err(err, errlen, "out of memory");
        return -1;
    }
    memcpy(b, p.header, p.hlen);
    npy_gather(t, &p, b + p.hlen);
    *buf = b;
    *len = p.hlen + p.nbytes;
    return 0;
}

/* Where npy_write puts the bytes. A regular file (or a new one) is written
 * beside the target and renamed over it on success, so a failed write
 * leaves what was there; anything else (a device node, a FIFO, /dev/stdout)
 * is written in place and never removed or replaced: renaming over
 * /dev/null would replace the device itself. */
typedef struct npy_out {
    FILE *f;
    char tmp[PATH_MAX];   /* "" when writing in place */
    char final[PATH_MAX]; /* what tmp is renamed to */
} npy_out;

static int npy_in_place(const char *path)
{
    struct stat st;
    if (!strncmp(path, "/dev/", 5) || !strncmp(path, "/proc/", 6))
        return 1;
    return stat(path, &st) == 0 && !S_ISREG(st.st_mode);
}

static int npy_out_open(npy_out *o, const char *path)
{
    o->tmp[0] = '\0';
    if (npy_in_place(path)) {
        o->f = fopen(path, "wb");
        return o->f ? 0 : -1;
    }
    /* An existing file's real path, so a symbolic link stays a link. */
    struct stat st;
    int exists = stat(path, &st) == 0;
    if (!(exists ? realpath(path, o->final) != NULL
                 : (size_t)snprintf(o->final, sizeof o->final, "%s", path) < sizeof o->final))
        return -1;
    const char *slash = strrchr(o->final, '/');
    int dirlen = slash ? (int)(slash - o->final) + 1 : 0;
    if ((size_t)snprintf(o->tmp, sizeof o->tmp, "%.*s.%s.XXXXXX", dirlen, o->final,
                         o->final + dirlen) >= sizeof o->tmp) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = mkstemp(o->tmp);
    if (fd < 0)
        return -1;
    mode_t mask = umask(0);
    umask(mask);
    if (fchmod(fd, exists ? (st.st_mode & 07777) : (0666 & ~mask)) != 0 ||
        !(o->f = fdopen(fd, "wb"))) {
        int e = errno;
        close(fd);
        unlink(o->tmp);
        errno = e;
        return -1;
    }
    return 0;
}

/* Finish: ok says every write succeeded. Returns 0, or -1 with errno. */
static int npy_out_close(npy_out *o, int ok)
{
    int e = errno;
    if (fclose(o->f) != 0 && ok) {
        ok = 0;
        e = errno;
    }
    if (ok && o->tmp[0] && rename(o->tmp, o->final) != 0) {
        ok = 0;
        e = errno;
    }
    if (!ok && o->tmp[0])
        unlink(o->tmp);
    errno = e;
    return ok ? 0 : -1;
}

int npy_write(const char *path, const DLTensor *t, char *err, size_t errlen)
{
    npy_plan p;
    char msg[256];
    if (!path) {
        npy_err(err, errlen, "npy_write: NULL path");
        return -1;
    }
    if (npy_plan_make(t, &p, msg, sizeof msg) != 0) {
        npy_err(err, errlen, "%s: %s", path, msg);
        return -1;
    }
    unsigned char *gathered = NULL;
    const void *data = (const unsigned char *)t->data + t->byte_offset;
    if (!p.contiguous) {
        gathered = malloc(p.nbytes ? p.nbytes : 1);
        if (!gathered) {
            npy_err(err, errlen, "%s: out of memory", path);
            return -1;
        }
        npy_gather(t, &p, gathered);
        data = gathered;
    }
    npy_out o;
    if (npy_out_open(&o, path) != 0) {
        npy_err(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        free(gathered);
        return -1;
    }
    errno = 0;
    int ok = fwrite(p.header, 1, p.hlen, o.f) == p.hlen &&
             (p.nbytes == 0 || fwrite(data, 1, p.nbytes, o.f) == p.nbytes);
    if (!ok && !errno)
        errno = EIO;
    free(gathered);
    if (npy_out_close(&o, ok) != 0) {
        npy_err(err, errlen, "%s: write failed: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}
