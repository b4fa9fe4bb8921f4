/* tests/test_npy.c - the .npy reader and writer of the opjit tool.
 * tools/npy.c is compiled into this test directly (it is not part of
 * libopjit). */
#include "tools/npy.c"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "t.h"

static char tmpdir[256];

static void tmp_path(char *buf, size_t len, const char *name)
{
    snprintf(buf, len, "%s/%s", tmpdir, name);
}

/* A .npy file image: magic, version, header length, dict padded with spaces
 * and ended by '\n' to a multiple of 64 bytes (as numpy does), then data. */
static unsigned char *make_npy(int major, const char *dict, const void *data, size_t nbytes,
                               size_t *len)
{
    size_t pre = major == 1 ? 10 : 12, dl = strlen(dict);
    size_t total = pre + dl + 1;
    total += (64 - total % 64) % 64;
    unsigned char *b = malloc(total + nbytes + 1);
    memcpy(b, "\x93NUMPY", 6);
    b[6] = (unsigned char)major;
    b[7] = 0;
    size_t hlen = total - pre;
    b[8] = (unsigned char)(hlen & 0xff);
    b[9] = (unsigned char)(hlen >> 8);
    if (major != 1) {
        b[10] = (unsigned char)(hlen >> 16);
        b[11] = (unsigned char)(hlen >> 24);
    }
    memcpy(b + pre, dict, dl);
    memset(b + pre + dl, ' ', total - pre - dl - 1);
    b[total - 1] = '\n';
    if (nbytes)
        memcpy(b + total, data, nbytes);
    *len = total + nbytes;
    return b;
}

static DLTensor make_tensor(void *data, DLDataType dt, int ndim, int64_t *shape)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCPU;
    t.ndim = ndim;
    t.dtype = dt;
    t.shape = shape;
    return t;
}

static DLDataType dtype(int code, int bits)
{
    DLDataType d;
    d.code = (uint8_t)code;
    d.bits = (uint8_t)bits;
    d.lanes = 1;
    return d;
}

/* Every dtype, many shapes, through memory and through files. */
static void test_roundtrip(void)
{
    static int64_t shapes[][4] = {{0}, {0}, {5}, {2, 3}, {2, 0, 4}, {1, 1, 1, 1}, {3, 1, 2}};
    static const int ndims[] = {0, 1, 1, 2, 3, 4, 3};
    DLDataType dt;
    int ndtypes = 0;
    for (int d = 0; opjit_dtype_at(d, &dt); d++) {
        npy_dtype nd;
        if (npy_dtype_of(dt, &nd) != 0) { /* bfloat16: numpy has no such dtype */
            CHECK(dt.code == kDLBfloat);
            continue;
        }
        ndtypes++;
        size_t item = dt.bits / 8;
        for (size_t s = 0; s < sizeof ndims / sizeof ndims[0]; s++) {
            int64_t numel = 1;
            for (int i = 0; i < ndims[s]; i++)
                numel *= shapes[s][i];
            size_t nbytes = (size_t)numel * item;
            unsigned char *data = malloc(nbytes + 1);
            for (size_t i = 0; i < nbytes; i++)
                data[i] = (unsigned char)(dt.code == OPJIT_DL_BOOL ? i % 2 : i * 7 + 3);
            DLTensor t = make_tensor(data, dt, ndims[s], shapes[s]);

            unsigned char *buf;
            size_t len;
            char err[512] = "";
            CHECKF(npy_write_mem(&t, &buf, &len, err, sizeof err) == 0, "%s", err);
            CHECK(len % 64 == nbytes % 64);
            npy_array a;
            CHECKF(npy_read_mem(buf, len, &a, err, sizeof err) == 0, "%s %s dim %d",
                   err, nd.name, ndims[s]);
            CHECK(a.t.ndim == ndims[s]);
            CHECK(a.t.dtype.code == dt.code && a.t.dtype.bits == dt.bits &&
                  a.t.dtype.lanes == 1);
            CHECK(a.t.device.device_type == kDLCPU && a.t.strides == NULL);
            CHECK(a.t.shape != NULL && a.t.data != NULL);
            CHECK(a.numel == numel && a.nbytes == nbytes);
            CHECK(((uintptr_t)a.t.data % 64) == 0);
            for (int i = 0; i < ndims[s]; i++)
                CHECK(a.t.shape[i] == shapes[s][i]);
            CHECK(nbytes == 0 || memcmp(a.t.data, data, nbytes) == 0);
            npy_free(&a);
            CHECK(a.data == NULL && a.shape == NULL);

            /* The same through a file. */
            char path[512];
            tmp_path(path, sizeof path, "rt.npy");
            CHECKF(npy_write(path, &t, err, sizeof err) == 0, "%s", err);
            CHECKF(npy_read(path, &a, err, sizeof err) == 0, "%s", err);
            CHECK(a.t.ndim == ndims[s] && a.nbytes == nbytes);
            CHECK(nbytes == 0 || memcmp(a.t.data, data, nbytes) == 0);
            npy_free(&a);
            FILE *f = fopen(path, "rb");
            unsigned char *fbuf = malloc(len + 1);
            CHECK(f && fread(fbuf, 1, len + 1, f) == len);
            CHECK(memcmp(fbuf, buf, len) == 0);
            if (f)
                fclose(f);
            free(fbuf);
            free(buf);
            free(data);
        }
    }
    /* float16, float32, float64, int8..int64, uint8..uint64, bool */
    CHECK(ndtypes == 12);
}

/* Byte for byte what numpy 1.24+ writes for
 * np.save(f, np.arange(6, dtype=np.float32).reshape(2, 3)): the dict, 21
 * minus the digits of the first dimension spaces of room to grow it, then
 * spaces to 128 bytes, then '\n'. */
static void test_matches_numpy(void)
{
    float v[6] = {0, 1, 2, 3, 4, 5};
    int64_t shape[2] = {2, 3};
    DLTensor t = make_tensor(v, dtype(kDLFloat, 32), 2, shape);
    unsigned char *buf;
    size_t len;
    char err[256];
    CHECK(npy_write_mem(&t, &buf, &len, err, sizeof err) == 0);
    const char *dict = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
    unsigned char want[128 + 24];
    memcpy(want, "\x93NUMPY\x01\x00\x76\x00", 10);
    memset(want + 10, ' ', 118);
    memcpy(want + 10, dict, strlen(dict));
    want[127] = '\n';
    memcpy(want + 128, v, sizeof v);
    CHECK(len == sizeof want);
    CHECK(len == sizeof want && memcmp(buf, want, len) == 0);
    free(buf);

    /* 0-d bool, 1-d uint8: descr '|b1' / '|u1', shapes () and (3,). */
    unsigned char b = 1;
    t = make_tensor(&b, dtype(OPJIT_DL_BOOL, 8), 0, NULL);
    CHECK(npy_write_mem(&t, &buf, &len, err, sizeof err) == 0);
    CHECK(len == 129);
    CHECK(memmem(buf, len, "{'descr': '|b1', 'fortran_order': False, 'shape': (), }", 55) != NULL);
    CHECK(buf[127] == '\n' && buf[128] == 1);
    free(buf);
    unsigned char u[3] = {1, 2, 255};
    int64_t s3 = 3;
    t = make_tensor(u, dtype(kDLUInt, 8), 1, &s3);
    CHECK(npy_write_mem(&t, &buf, &len, err, sizeof err) == 0);
    CHECK(memmem(buf, len, "'shape': (3,), }", 16) != NULL);
    free(buf);
}

/* Headers numpy or other writers produce: older numpy without growth room,
 * versions 2.0 and 3.0, other key orders and quotes, Python 2 longs. */
static void test_reads_variants(void)
{
    int64_t d[3] = {10, -20, 30};
    static const struct {
        int major;
        const char *dict;
    } cases[] = {
        {1, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }"},
        {2, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }"},
        {3, "{'descr': '<i8', 'fortran_order': False, 'shape': (3,), }"},
        {1, "{\"shape\": (3,), \"fortran_order\": False, \"descr\": \"<i8\"}"},
        {1, "{'descr':'<i8','fortran_order':False,'shape':(3L,)}"},
        {1, "  {  'descr' : '<i8' ,\n 'fortran_order' : False , 'shape' : ( 3 , ) , }  "},
        {1, "{'descr': '<i8', 'fortran_order': True, 'shape': (3,), }"}, /* 1-d: same bytes */
        {1, "{'descr': '=i8', 'fortran_order': False, 'shape': (3,), }"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        size_t len;
        unsigned char *buf = make_npy(cases[i].major, cases[i].dict, d, sizeof d, &len);
        npy_array a;
        char err[512] = "";
        CHECKF(npy_read_mem(buf, len, &a, err, sizeof err) == 0, "case %zu: %s", i, err);
        CHECK(a.t.ndim == 1 && a.t.shape[0] == 3 && a.t.dtype.code == kDLInt &&
              a.t.dtype.bits == 64);
        CHECK(a.nbytes == sizeof d && memcmp(a.t.data, d, sizeof d) == 0);
        npy_free(&a);
        /* Trailing bytes after the data are ignored (as numpy.load does). */
        unsigned char *more = malloc(len + 7);
        memcpy(more, buf, len);
        memset(more + len, 0xab, 7);
        CHECK(npy_read_mem(more, len + 7, &a, err, sizeof err) == 0);
        CHECK(a.nbytes == sizeof d && memcmp(a.t.data, d, sizeof d) == 0);
        npy_free(&a);
        free(more);
        free(buf);
    }
}

/* Writing a strided view gathers it in C order; byte_offset is applied. */
static void test_write_strided(void)
{
    /* m is 2x3; t is its transpose, 3x2, strides (1, 3), skipping one float. */
    float m[7] = {-1, 1, 2, 3, 4, 5, 6};
    int64_t shape[2] = {3, 2}, strides[2] = {1, 3};
    DLTensor t = make_tensor(m, dtype(kDLFloat, 32), 2, shape);
    t.strides = strides;
    t.byte_offset = sizeof(float);
    unsigned char *buf;
    size_t len;
    char err[256], path[512];
    CHECK(npy_write_mem(&t, &buf, &len, err, sizeof err) == 0);
    npy_array a;
    CHECK(npy_read_mem(buf, len, &a, err, sizeof err) == 0);
    float want[6] = {1, 4, 2, 5, 3, 6};
    CHECK(a.t.shape[0] == 3 && a.t.shape[1] == 2);
    CHECK(memcmp(a.t.data, want, sizeof want) == 0);
    npy_free(&a);
    free(buf);

    tmp_path(path, sizeof path, "strided.npy");
    CHECKF(npy_write(path, &t, err, sizeof err) == 0, "%s", err);
    CHECK(npy_read(path, &a, err, sizeof err) == 0);
    CHECK(a.nbytes == sizeof want && memcmp(a.t.data, want, sizeof want) == 0);
    npy_free(&a);

    /* Compact strides given explicitly count as contiguous. */
    int64_t cs[2] = {2, 1};
    t.strides = cs;
    t.byte_offset = 0;
    CHECK(npy_write_mem(&t, &buf, &len, err, sizeof err) == 0);
    CHECK(npy_read_mem(buf, len, &a, err, sizeof err) == 0);
    CHECK(memcmp(a.t.data, m, sizeof want) == 0);
    npy_free(&a);
    free(buf);
}

static void expect_error(const char *what, const void *buf, size_t len, const char *msg)
{
    npy_array a;
    char err[512] = "";
    int rc = npy_read_mem(buf, len, &a, err, sizeof err);
    CHECKF(rc == -1, "%s: accepted", what);
    CHECKF(strstr(err, msg) != NULL, "%s: message '%s' lacks '%s'", what, err, msg);
    CHECK(a.data == NULL && a.shape == NULL);
    if (rc == 0)
        npy_free(&a);
}

static void expect_dict_error(const char *dict, const char *msg)
{
    float data[4] = {0};
    size_t len;
    unsigned char *buf = make_npy(1, dict, data, sizeof data, &len);
    expect_error(dict, buf, len, msg);
    free(buf);
}

static void test_errors(void)
{
    float data[4] = {1, 2, 3, 4};
    size_t len;
    unsigned char *good = make_npy(1, "{'descr': '<f4', 'fortran_order': False, 'shape': (4,), }",
                                   data, sizeof data, &len);
    unsigned char *b = malloc(len);

    expect_error("empty", "", 0, "truncated");
    expect_error("bad magic", "\x93NUMPX\x01\x00", 8, "bad magic");
    expect_error("a text file", "hello, world\n", 13, "bad magic");
    expect_error("magic only", "\x93NUMPY", 6, "truncated");
    expect_error("v1 no length", "\x93NUMPY\x01\x00\x10", 9, "truncated");
    expect_error("v2 no length", "\x93NUMPY\x02\x00\x10\x00\x00", 11, "truncated");
    expect_error("version 4", "\x93NUMPY\x04\x00\x00\x00\x00\x00", 12, "version 4.0");
    expect_error("version 1.1", "\x93NUMPY\x01\x01\x00\x00\x00\x00", 12, "version 1.1");

    memcpy(b, good, len);
    b[8] = 0xff;
    b[9] = 0x7f;
    expect_error("header past the end", b, len, "beyond the end of the file");
    memcpy(b, good, len);
    expect_error("truncated header", b, 40, "beyond the end");
    expect_error("truncated data", b, len - 1, "needs 16 data bytes, the file has 15");
    expect_error("no data", b, len - sizeof data, "the file has 0");
    /* v2 with a 4 GiB header length */
    expect_error("huge header", "\x93NUMPY\x02\x00\xff\xff\xff\xff{}", 14, "beyond the end");

    expect_dict_error("", "no '{'");
    expect_dict_error("[1, 2]", "no '{'");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False}", "missing key 'shape'");
    expect_dict_error("{'descr': '<f4', 'shape': (4,)}", "missing key 'fortran_order'");
    expect_dict_error("{'fortran_order': False, 'shape': (4,)}", "missing key 'descr'");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (4,), 'x': 1}",
                      "unexpected key 'x'");
    expect_dict_error("{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (4,)}",
                      "'descr' given twice");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (4,)", "expected");
    expect_dict_error("{'descr': '<f4' 'fortran_order': False, 'shape': (4,)}", "expected ','");
    expect_dict_error("{'descr: '<f4', 'fortran_order': False, 'shape': (4,)}", "bad header");
    expect_dict_error("{'descr': '<f4', 'fortran_order': Maybe, 'shape': (4,)}",
                      "not True or False");
    expect_dict_error("{'descr': '<f4', 'fortran_order': Falsey, 'shape': (4,)}",
                      "not True or False");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': 4}", "not a tuple");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (4,) } x",
                      "after the dict");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (a,)}",
                      "tuple of integers");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (4 4)}",
                      "expected ',' or ')'");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (-4,)}", "negative");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (99999999999999999999,)}",
                      "too large");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (4294967296, 4294967296,)}",
                      "overflows");
    expect_dict_error("{'descr': '<f8', 'fortran_order': False, 'shape': (2305843009213693952,)}",
                      "overflows");
    expect_dict_error("{'descr': '<f4', 'fortran_order': False, 'shape': (1000000000, 1000,)}",
                      "truncated");
    expect_dict_error("{'descr': '>f4', 'fortran_order': False, 'shape': (4,)}", "big-endian");
    expect_dict_error("{'descr': '<f16', 'fortran_order': False, 'shape': (4,)}",
                      "unsupported dtype '<f16'");
    expect_dict_error("{'descr': '<V2', 'fortran_order': False, 'shape': (4,)}",
                      "supported: float32 '<f4', float64 '<f8', float16 '<f2', int8 '|i1'");
    expect_dict_error("{'descr': '<i01', 'fortran_order': False, 'shape': (4,)}",
                      "unsupported dtype");
    expect_dict_error("{'descr': '>f2', 'fortran_order': False, 'shape': (4,)}",
                      "a.astype('<f2')");
    expect_dict_error("{'descr': '<c8', 'fortran_order': False, 'shape': (4,)}",
                      "unsupported dtype");
    expect_dict_error("{'descr': '|O', 'fortran_order': False, 'shape': (4,)}",
                      "unsupported dtype");
    expect_dict_error("{'descr': '|f4', 'fortran_order': False, 'shape': (4,)}", "1-byte");
    expect_dict_error("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (4,)}",
                      "structured");
    expect_dict_error("{'descr': '<f4', 'fortran_order': True, 'shape': (2, 2)}",
                      "fortran_order arrays are not supported");
    /* 65 dimensions */
    char dict[512];
    int n = snprintf(dict, sizeof dict, "{'descr': '<f4', 'fortran_order': False, 'shape': (");
    for (int i = 0; i < 65; i++)
        n += snprintf(dict + n, sizeof dict - (size_t)n, "1,");
    snprintf(dict + n, sizeof dict - (size_t)n, ")}");
    expect_dict_error(dict, "more than 64 dimensions");
    free(b);
    free(good);
}

/* float16 is numpy's '<f2', read and written with opjit's dtype table. */
static void test_float16(void)
{
    static const uint16_t halves[3] = {0x3c00, 0xc000, 0x3800}; /* 1, -2, 0.5 */
    size_t len;
    char err[512] = "";
    unsigned char *buf = make_npy(1, "{'descr': '<f2', 'fortran_order': False, 'shape': (3,), }",
                                  halves, sizeof halves, &len);
    npy_array a;
    CHECKF(npy_read_mem(buf, len, &a, err, sizeof err) == 0, "%s", err);
    CHECK(a.t.dtype.code == kDLFloat && a.t.dtype.bits == 16 && a.t.dtype.lanes == 1);
    CHECK(a.numel == 3 && a.nbytes == 6 && memcmp(a.t.data, halves, 6) == 0);
    CHECK(npy_dtype_name(a.t.dtype) && !strcmp(npy_dtype_name(a.t.dtype), "float16"));
    unsigned char *out;
    size_t olen;
    CHECKF(npy_write_mem(&a.t, &out, &olen, err, sizeof err) == 0, "%s", err);
    CHECK(olen > 10 && memmem(out, olen, "'descr': '<f2'", 14) != NULL);
    CHECK(olen >= 6 && memcmp(out + olen - 6, halves, 6) == 0);
    free(out);
    npy_free(&a);
    free(buf);
    DLDataType bf = dtype(kDLBfloat, 16);
    CHECK(npy_dtype_name(bf) == NULL); /* opjit knows it; .npy cannot hold it */
    CHECK(opjit_dtype_name(bf) && !strcmp(opjit_dtype_name(bf), "bfloat16"));
}

static void test_file_errors(void)
{
    npy_array a;
    char err[512] = "", path[512];
    tmp_path(path, sizeof path, "does-not-exist.npy");
    CHECK(npy_read(path, &a, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "cannot open");
    CHECK_STR_CONTAINS(err, "does-not-exist.npy");
    CHECK(npy_read(tmpdir, &a, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "not a regular file");

    /* A message names the file. */
    tmp_path(path, sizeof path, "text.npy");
    FILE *f = fopen(path, "wb");
    fputs("not numpy", f);
    fclose(f);
    CHECK(npy_read(path, &a, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "text.npy: not a .npy file");

    float v = 1;
    int64_t s1 = 1;
    DLTensor t = make_tensor(&v, dtype(kDLFloat, 32), 1, &s1);
    tmp_path(path, sizeof path, "no-such-dir/x.npy");
    CHECK(npy_write(path, &t, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "cannot create");
    tmp_path(path, sizeof path, "bad.npy");
    t.dtype = dtype(kDLBfloat, 16); /* numpy has no bfloat16 */
    CHECK(npy_write(path, &t, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "cannot save dtype");
    CHECK(access(path, F_OK) != 0);
    t.dtype = dtype(kDLFloat, 32);
    t.device.device_type = kDLCUDA;
    CHECK(npy_write(path, &t, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "not in host memory");
    t.device.device_type = kDLCPU;
    int64_t neg = -1;
    t.shape = &neg;
    CHECK(npy_write(path, &t, err, sizeof err) == -1);
    CHECK_STR_CONTAINS(err, "negative");
    t.shape = &s1;
    t.dtype.lanes = 4;
    CHECK(npy_write(path, &t, err, sizeof err) == -1);

    /* NULL arguments are errors, not crashes. */
    CHECK(npy_read(NULL, &a, err, sizeof err) == -1);
    CHECK(npy_read_mem(NULL, 5, &a, err, sizeof err) == -1);
    CHECK(npy_write(NULL, &t, err, sizeof err) == -1);
    CHECK(npy_write_mem(NULL, NULL, NULL, err, sizeof err) == -1);
    npy_free(NULL);
    /* err may be NULL */
    CHECK(npy_read_mem("x", 1, &a, NULL, 0) == -1);
}

/* What a reader must never do on any input: crash, over-read (ASan), leak,
 * or succeed with an array inconsistent with the bytes. */
static int check_one(const unsigned char *buf, size_t len)
{
    npy_array a;
    char err[512];
    err[0] = '\0';
    /* Copy to an exact-size allocation so ASan sees any over-read. */
    unsigned char *exact = malloc(len ? len : 1);
    if (len)
        memcpy(exact, buf, len);
    int rc = npy_read_mem(exact, len, &a, err, sizeof err);
    free(exact);
    if (rc != 0) {
        CHECKF(err[0] != '\0', "error without a message (len %zu)", len);
        CHECK(a.data == NULL);
        return 0;
    }
    size_t item = a.t.dtype.bits / 8;
    int64_t numel = 1;
    for (int i = 0; i < a.t.ndim; i++)
        numel *= a.t.shape[i];
    CHECK(a.t.ndim >= 0 && a.t.ndim <= NPY_MAX_DIMS);
    CHECK(a.numel == numel && a.nbytes == (size_t)numel * item);
    CHECK(a.nbytes <= len);
    npy_free(&a);
    return 1;
}

static void test_fuzz(void)
{
    int64_t d[6] = {1, 2, 3, 4, 5, 6};
    static const char *const dicts[] = {
        "{'descr': '<i8', 'fortran_order': False, 'shape': (2, 3), }",
        "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }",
        "{'descr': '|u1', 'fortran_order': False, 'shape': (), }",
    };
    for (size_t k = 0; k < sizeof dicts / sizeof dicts[0]; k++) {
        for (int major = 1; major <= 3; major++) {
            size_t len;
            unsigned char *buf = make_npy(major, dicts[k], d, sizeof d, &len);
            /* Every truncation; only lengths covering the data succeed. */
            for (size_t n = 0; n <= len; n++) {
                int ok = check_one(buf, n);
                size_t hdr = len - sizeof d;
                size_t need = hdr + (k == 0 ? 48 : k == 1 ? 48 : 1);
                CHECKF(ok == (n >= need), "dict %zu v%d truncated at %zu: ok=%d", k, major, n,
                       ok);
            }
            /* Each header byte set to interesting values. */
            static const unsigned char vals[] = {0, 0xff, 0x80, ' ', '\n', '\'', '"', '(',
                                                 ')', ',', ':', '{', '}', '-', '0', '9',
                                                 'L', 'T', '<', '>', '|'};
            size_t hdr = len - sizeof d;
            unsigned char *m = malloc(len);
            for (size_t i = 0; i < hdr; i++)
                for (size_t v = 0; v < sizeof vals; v++) {
                    memcpy(m, buf, len);
                    m[i] = vals[v];
                    check_one(m, len);
                    check_one(m, hdr); /* and without the data */
                }
            /* Random multi-byte mutations, reproducible. */
            uint32_t seed = 12345u + (uint32_t)k * 7u + (uint32_t)major;
            for (int it = 0; it < 4000; it++) {
                memcpy(m, buf, len);
                int flips = 1 + it % 4;
                for (int j = 0; j < flips; j++) {
                    seed = seed * 1103515245u + 12345u;
                    size_t pos = (seed >> 8) % hdr;
                    seed = seed * 1103515245u + 12345u;
                    m[pos] = (unsigned char)(seed >> 16);
                }
                seed = seed * 1103515245u + 12345u;
                check_one(m, (seed >> 4) % 8 == 0 ? (seed >> 8) % (len + 1) : len);
            }
            free(m);
            free(buf);
        }
    }
}

int main(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmpdir, sizeof tmpdir, "%s/opjit-test-npy-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    T_RUN(test_roundtrip);
    T_RUN(test_matches_numpy);
    T_RUN(test_reads_variants);
    T_RUN(test_write_strided);
    T_RUN(test_errors);
    T_RUN(test_float16);
    T_RUN(test_file_errors);
    T_RUN(test_fuzz);

    static const char *const files[] = {"rt.npy", "strided.npy", "text.npy", "bad.npy"};
    char path[512];
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        tmp_path(path, sizeof path, files[i]);
        remove(path);
    }
    rmdir(tmpdir);
    return t_done();
}
