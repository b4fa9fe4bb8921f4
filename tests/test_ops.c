/* tests/test_ops.c - the shipped CPU operators (ops-src/nms.c, conv2d.c,
 * mm.c) through the public API, against straightforward reference
 * implementations written here: naive O(n^2) nms with torchvision's
 * semantics, a direct 7-loop convolution, a triple-loop matrix product.
 * Randomized inputs (fixed seeds) and edge cases, then every error path. */
#include "t.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <opjit.h>

static opjit_runtime *rt;
static opjit_op *op_nms, *op_conv, *op_mm;

/* ---- helpers ----------------------------------------------------------- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static void rng_seed(uint64_t s) { rng_state = s * 0x9e3779b97f4a7c15ull + 1; }
static uint64_t rng_next(void)
{
    /* splitmix64 */
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static double rng_unif(void) { return (double)(rng_next() >> 11) * (1.0 / 9007199254740992.0); }
static double rng_normal(void)
{
    double u = rng_unif() + 1e-12, v = rng_unif();
    return sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v);
}
static int64_t rng_int(int64_t lo, int64_t hi) { return lo + (int64_t)(rng_next() % (uint64_t)(hi - lo)); }

/* A CPU tensor that owns its data and shape. */
typedef struct tensor {
    DLTensor t;
    int64_t shape[4];
    int64_t strides[4];
    void *data;
} tensor;

static DLDataType dt_of(int code, int bits)
{
    DLDataType d;
    d.code = (uint8_t)code;
    d.bits = (uint8_t)bits;
    d.lanes = 1;
    return d;
}

static void tensor_init(tensor *x, DLDataType dt, int ndim, const int64_t *shape)
{
    int64_t n = 1;
    memset(x, 0, sizeof *x);
    for (int i = 0; i < ndim; i++) {
        x->shape[i] = shape[i];
        n *= shape[i];
    }
    x->data = calloc((size_t)(n > 0 ? n : 1), dt.bits / 8);
    x->t.data = x->data;
    x->t.device.device_type = kDLCPU;
    x->t.device.device_id = 0;
    x->t.ndim = ndim;
    x->t.dtype = dt;
    x->t.shape = x->shape;
    x->t.strides = NULL;
    x->t.byte_offset = 0;
}
static void tensor_free(tensor *x) { free(x->data); }
static int64_t tensor_numel(const tensor *x)
{
    int64_t n = 1;
    for (int i = 0; i < x->t.ndim; i++)
        n *= x->shape[i];
    return n;
}
/* Element i of a float32 or float64 tensor, as double. */
static double tget(const tensor *x, int64_t i)
{
    return x->t.dtype.bits == 64 ? ((double *)x->data)[i] : ((float *)x->data)[i];
}
static void tset(tensor *x, int64_t i, double v)
{
    if (x->t.dtype.bits == 64)
        ((double *)x->data)[i] = v;
    else
        ((float *)x->data)[i] = (float)v;
}
static void tensor_randn(tensor *x)
{
    int64_t n = tensor_numel(x);
    for (int64_t i = 0; i < n; i++)
        tset(x, i, rng_normal());
}

static int out_shape_is(const DLManagedTensor *o, int ndim, const int64_t *shape)
{
    if (o->dl_tensor.ndim != ndim)
        return 0;
    for (int i = 0; i < ndim; i++)
        if (o->dl_tensor.shape[i] != shape[i])
            return 0;
    return 1;
}
static const void *out_data(const DLManagedTensor *o)
{
    return (const char *)o->dl_tensor.data + o->dl_tensor.byte_offset;
}

/* ---- nms ------------------------------------------------------------------ */

/* torchvision 0.14 CPU nms, straight: stable descending sort of the scores
 * (NaN first, as torch sorts), then the O(n^2) loop in the boxes' dtype. */
#define REF_NMS(T, SUF)                                                        \
    static int64_t ref_nms_##SUF(const T *b, const T *s, int64_t n, double thr, \
                                 int64_t *keep)                                 \
    {                                                                          \
        int64_t *order = malloc(sizeof(int64_t) * (size_t)(n + 1));            \
        unsigned char *sup = calloc((size_t)n + 1, 1);                         \
        int64_t nk = 0;                                                        \
        for (int64_t i = 0; i < n; i++) {                                      \
            int64_t j = i;                                                     \
            T v = s[i];                                                        \
            /* insert i after every element that precedes or ties it */       \
            while (j > 0) {                                                    \
                T u = s[order[j - 1]];                                         \
                int before = isnan(v) ? !isnan(u) : (!isnan(u) && v > u);      \
                if (!before)                                                   \
                    break;                                                     \
                order[j] = order[j - 1];                                       \
                j--;                                                           \
            }                                                                  \
            order[j] = i;                                                      \
        }                                                                      \
        for (int64_t p = 0; p < n; p++) {                                      \
            int64_t i = order[p];                                              \
            if (sup[i])                                                        \
                continue;                                                      \
            keep[nk++] = i;                                                    \
            T ia = (b[4 * i + 2] - b[4 * i]) * (b[4 * i + 3] - b[4 * i + 1]);  \
            for (int64_t q = p + 1; q < n; q++) {                              \
                int64_t j = order[q];                                          \
                if (sup[j])                                                    \
                    continue;                                                  \
                T ja = (b[4 * j + 2] - b[4 * j]) * (b[4 * j + 3] - b[4 * j + 1]); \
                T xx1 = b[4 * i] < b[4 * j] ? b[4 * j] : b[4 * i];             \
                T yy1 = b[4 * i + 1] < b[4 * j + 1] ? b[4 * j + 1] : b[4 * i + 1]; \
                T xx2 = b[4 * j + 2] < b[4 * i + 2] ? b[4 * j + 2] : b[4 * i + 2]; \
                T yy2 = b[4 * j + 3] < b[4 * i + 3] ? b[4 * j + 3] : b[4 * i + 3]; \
                T w = xx2 - xx1, h = yy2 - yy1;                                \
                w = 0 < w ? w : 0;                                             \
                h = 0 < h ? h : 0;                                             \
                T inter = w * h;                                               \
                T ovr = inter / (ia + ja - inter);                             \
                if ((double)ovr > thr)                                         \
                    sup[j] = 1;                                                \
            }                                                                  \
        }                                                                      \
        free(order);                                                           \
        free(sup);                                                             \
        return nk;                                                             \
    }
REF_NMS(float, f32)
REF_NMS(double, f64)

/* Call nms; return the status, and on success compare with the reference.
 * Returns -1 on a mismatch (already reported). */
static int nms_check(tensor *boxes, tensor *scores, double thr, const char *what)
{
    DLManagedTensor *out = NULL;
    opjit_value args[3] = {opjit_tensor(&boxes->t), opjit_tensor(&scores->t),
                           opjit_float(thr)};
    int rc = opjit_call(rt, op_nms, args, 3, &out, 1);
    CHECKF(rc == OPJIT_OK, "%s: %s", what, opjit_errmsg(rt));
    if (rc != OPJIT_OK)
        return rc;
    int64_t n = boxes->shape[0];
    int64_t *keep = malloc(sizeof(int64_t) * (size_t)(n + 1));
    int64_t nk = boxes->t.dtype.bits == 64
                     ? ref_nms_f64(boxes->data, scores->data, n, thr, keep)
                     : ref_nms_f32(boxes->data, scores->data, n, thr, keep);
    int ok = out->dl_tensor.ndim == 1 && out->dl_tensor.dtype.code == kDLInt &&
             out->dl_tensor.dtype.bits == 64 && out->dl_tensor.device.device_type == kDLCPU;
    CHECKF(ok, "%s: output is not a 1-D int64 CPU tensor", what);
    if (ok) {
        CHECKF(out->dl_tensor.shape[0] == nk, "%s (n=%lld thr=%g): kept %lld, expected %lld",
               what, (long long)n, thr, (long long)out->dl_tensor.shape[0], (long long)nk);
        if (out->dl_tensor.shape[0] == nk) {
            const int64_t *got = out_data(out);
            int64_t bad = -1;
            for (int64_t i = 0; i < nk && bad < 0; i++)
                if (got[i] != keep[i])
                    bad = i;
            CHECKF(bad < 0, "%s (n=%lld thr=%g): index %lld is %lld, expected %lld", what,
                   (long long)n, thr, (long long)bad, (long long)(bad >= 0 ? got[bad] : 0),
                   (long long)(bad >= 0 ? keep[bad] : 0));
        }
    }
    free(keep);
    out->deleter(out);
    return 0;
}

/* Boxes: kind 0 uniform, 1 clustered (detector-like), 2 small integer
 * coordinates (many exact ties and identical boxes), 3 mixed big and small,
 * 4 with inverted, NaN and infinite coordinates. */
static void make_boxes(tensor *b, tensor *s, int64_t n, int bits, int kind, int score_ties)
{
    int64_t shp[2] = {n, 4};
    tensor_init(b, dt_of(kDLFloat, bits), 2, shp);
    tensor_init(s, dt_of(kDLFloat, bits), 1, shp);
    int64_t ncl = n / 20 + 1;
    for (int64_t i = 0; i < n; i++) {
        double x, y, w, h;
        if (kind == 1) {
            int64_t c = rng_int(0, ncl);
            x = (double)((c * 7919) % 997) + rng_normal() * 6;
            y = (double)((c * 104729) % 991) + rng_normal() * 6;
            w = 30 + rng_unif() * 30;
            h = 30 + rng_unif() * 30;
        } else if (kind == 2) {
            x = (double)rng_int(0, 20);
            y = (double)rng_int(0, 20);
            w = (double)rng_int(0, 6);
            h = (double)rng_int(0, 6);
        } else {
            x = rng_unif() * 1000;
            y = rng_unif() * 1000;
            w = 1 + rng_unif() * 60;
            h = 1 + rng_unif() * 60;
            if (kind == 3 && rng_unif() < 0.1) {
                w *= 20;
                h *= 20;
            }
        }
        tset(b, 4 * i, x);
        tset(b, 4 * i + 1, y);
        tset(b, 4 * i + 2, x + w);
        tset(b, 4 * i + 3, y + h);
        if (kind == 4) {
            double r = rng_unif();
            if (r < 0.05)
                tset(b, 4 * i + 2, x - w); /* inverted */
            else if (r < 0.08)
                tset(b, 4 * i + rng_int(0, 4), NAN);
            else if (r < 0.10)
                tset(b, 4 * i + rng_int(0, 4), rng_unif() < 0.5 ? INFINITY : -INFINITY);
        }
        tset(s, i, score_ties ? (double)rng_int(0, 4) / 4 : rng_unif());
        if (score_ties && rng_unif() < 0.05)
            tset(s, i, NAN);
    }
}

static void test_nms_random(void)
{
    static const double thrs[] = {0.5, 0.0, 0.3, 0.7, 1.0, 1e-6, -0.1, NAN};
    static const int64_t sizes[] = {2, 3, 17, 65, 300, 1500};
    rng_seed(1);
    for (int bits = 32; bits <= 64; bits += 32)
        for (int kind = 0; kind <= 4; kind++)
            for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
                for (int ties = 0; ties <= 1; ties++) {
                    tensor b, s;
                    char what[96];
                    make_boxes(&b, &s, sizes[si], bits, kind, ties);
                    for (size_t ti = 0; ti < sizeof thrs / sizeof *thrs; ti++) {
                        snprintf(what, sizeof what, "nms f%d kind %d ties %d", bits, kind, ties);
                        nms_check(&b, &s, thrs[ti], what);
                    }
                    tensor_free(&b);
                    tensor_free(&s);
                }
}

static void test_nms_large(void)
{
    /* Enough boxes for the grid path to matter, both dtypes. */
    rng_seed(2);
    for (int bits = 32; bits <= 64; bits += 32)
        for (int kind = 0; kind <= 3; kind++) {
            tensor b, s;
            make_boxes(&b, &s, 6000, bits, kind, kind == 2);
            nms_check(&b, &s, 0.5, "nms large");
            nms_check(&b, &s, 0.05, "nms large thr 0.05");
            tensor_free(&b);
            tensor_free(&s);
        }
}

static void test_nms_edges(void)
{
    tensor b, s;
    int64_t shp0[2] = {0, 4};
    DLManagedTensor *out = NULL;

    /* N = 0: an empty int64 [0]. */
    tensor_init(&b, dt_of(kDLFloat, 32), 2, shp0);
    tensor_init(&s, dt_of(kDLFloat, 32), 1, shp0);
    opjit_value args[3] = {opjit_tensor(&b.t), opjit_tensor(&s.t), opjit_float(0.5)};
    CHECKF(opjit_call(rt, op_nms, args, 3, &out, 1) == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (out) {
        int64_t z[1] = {0};
        CHECK(out_shape_is(out, 1, z));
        CHECK(out->dl_tensor.dtype.code == kDLInt && out->dl_tensor.dtype.bits == 64);
        out->deleter(out);
    }
    tensor_free(&b);
    tensor_free(&s);

    /* One box. */
    {
        int64_t shp[2] = {1, 4};
        tensor_init(&b, dt_of(kDLFloat, 32), 2, shp);
        tensor_init(&s, dt_of(kDLFloat, 32), 1, shp);
        float *p = b.data;
        p[0] = 1; p[1] = 2; p[2] = 3; p[3] = 5;
        ((float *)s.data)[0] = 0.25f;
        nms_check(&b, &s, 0.5, "one box");
        nms_check(&b, &s, -1, "one box, negative threshold");
        out = NULL;
        opjit_value a1[3] = {opjit_tensor(&b.t), opjit_tensor(&s.t), opjit_float(0.5)};
        if (opjit_call(rt, op_nms, a1, 3, &out, 1) == OPJIT_OK) {
            CHECK(out->dl_tensor.shape[0] == 1 && ((const int64_t *)out_data(out))[0] == 0);
            out->deleter(out);
        }
        tensor_free(&b);
        tensor_free(&s);
    }

    /* All identical boxes, equal scores: threshold 0.5 keeps the first,
     * threshold 1 keeps all (IoU 1 is not > 1), in index order. */
    for (int bits = 32; bits <= 64; bits += 32) {
        int64_t shp[2] = {100, 4};
        tensor_init(&b, dt_of(kDLFloat, bits), 2, shp);
        tensor_init(&s, dt_of(kDLFloat, bits), 1, shp);
        for (int i = 0; i < 100; i++) {
            tset(&b, 4 * i, 10); tset(&b, 4 * i + 1, 20);
            tset(&b, 4 * i + 2, 30); tset(&b, 4 * i + 3, 25);
            tset(&s, i, 0.5);
        }
        for (int k = 0; k < 2; k++) {
            double thr = k ? 1.0 : 0.5;
            out = NULL;
            opjit_value a2[3] = {opjit_tensor(&b.t), opjit_tensor(&s.t), opjit_float(thr)};
            CHECKF(opjit_call(rt, op_nms, a2, 3, &out, 1) == OPJIT_OK, "%s", opjit_errmsg(rt));
            if (!out)
                continue;
            const int64_t *k2 = out_data(out);
            if (thr < 1) {
                CHECK(out->dl_tensor.shape[0] == 1 && k2[0] == 0);
            } else {
                int ok = out->dl_tensor.shape[0] == 100;
                for (int i = 0; ok && i < 100; i++)
                    ok = k2[i] == i;
                CHECKF(ok, "identical boxes at threshold 1 must all be kept in index order");
            }
            out->deleter(out);
        }
        nms_check(&b, &s, 0.0, "identical, thr 0");
        tensor_free(&b);
        tensor_free(&s);
    }

    /* Threshold 0: any positive overlap suppresses; touching boxes do not. */
    {
        int64_t shp[2] = {3, 4};
        tensor_init(&b, dt_of(kDLFloat, 32), 2, shp);
        tensor_init(&s, dt_of(kDLFloat, 32), 1, shp);
        float bx[12] = {0, 0, 10, 10, 10, 0, 20, 10, 19.5f, 9.5f, 30, 30};
        float sc[3] = {0.9f, 0.8f, 0.7f};
        memcpy(b.data, bx, sizeof bx);
        memcpy(s.data, sc, sizeof sc);
        out = NULL;
        opjit_value a3[3] = {opjit_tensor(&b.t), opjit_tensor(&s.t), opjit_float(0.0)};
        CHECKF(opjit_call(rt, op_nms, a3, 3, &out, 1) == OPJIT_OK, "%s", opjit_errmsg(rt));
        if (out) {
            const int64_t *k3 = out_data(out);
            CHECK(out->dl_tensor.shape[0] == 2 && k3[0] == 0 && k3[1] == 1);
            out->deleter(out);
        }
        nms_check(&b, &s, 0.0, "touching");
        tensor_free(&b);
        tensor_free(&s);
    }
}

/* Expect a failed call with status st and a message containing needle. */
static void expect_fail(const opjit_op *op, opjit_value *args, int nargs, int st,
                        const char *needle, const char *what)
{
    DLManagedTensor *out = NULL;
    int rc = opjit_call(rt, op, args, nargs, &out, 1);
    CHECKF(rc == st, "%s: status %s, expected %s (%s)", what, opjit_status_name(rc),
           opjit_status_name(st), opjit_errmsg(rt));
    CHECKF(out == NULL, "%s: an output came back from a failed call", what);
    if (rc != OPJIT_OK)
        CHECKF(strstr(opjit_errmsg(rt), needle) != NULL, "%s: message '%s' lacks '%s'", what,
               opjit_errmsg(rt), needle);
    if (out)
        out->deleter(out);
}

static void test_nms_errors(void)
{
    tensor b, s, s64, s_short, b_i32, b_5, b_3d, s_2d;
    int64_t sb[2] = {8, 4}, s5[2] = {8, 5}, s7[1] = {7}, s3d[3] = {8, 4, 1}, s2d[2] = {8, 1};
    tensor_init(&b, dt_of(kDLFloat, 32), 2, sb);
    tensor_init(&s, dt_of(kDLFloat, 32), 1, sb);
    tensor_init(&s64, dt_of(kDLFloat, 64), 1, sb);
    tensor_init(&s_short, dt_of(kDLFloat, 32), 1, s7);
    tensor_init(&b_i32, dt_of(kDLInt, 32), 2, sb);
    tensor_init(&b_5, dt_of(kDLFloat, 32), 2, s5);
    tensor_init(&b_3d, dt_of(kDLFloat, 32), 3, s3d);
    tensor_init(&s_2d, dt_of(kDLFloat, 32), 2, s2d);

    opjit_value a[3] = {opjit_tensor(&b.t), opjit_tensor(&s64.t), opjit_float(0.5)};
    expect_fail(op_nms, a, 3, OPJIT_EKERNEL, "scores", "nms dtype mismatch");
    a[1] = opjit_tensor(&s_short.t);
    expect_fail(op_nms, a, 3, OPJIT_EKERNEL, "scores", "nms size mismatch");
    a[1] = opjit_tensor(&s.t);
    a[0] = opjit_tensor(&b_i32.t);
    expect_fail(op_nms, a, 3, OPJIT_ECALL, "boxes", "nms int32 boxes");
    a[0] = opjit_tensor(&b_5.t);
    expect_fail(op_nms, a, 3, OPJIT_EKERNEL, "boxes", "nms [N,5] boxes");
    a[0] = opjit_tensor(&b_3d.t);
    expect_fail(op_nms, a, 3, OPJIT_ECALL, "boxes", "nms 3-D boxes");
    a[0] = opjit_tensor(&b.t);
    a[1] = opjit_tensor(&s_2d.t);
    expect_fail(op_nms, a, 3, OPJIT_ECALL, "scores", "nms 2-D scores");
    a[1] = opjit_tensor(&s.t);
    expect_fail(op_nms, a, 2, OPJIT_ECALL, "iou_threshold", "nms missing threshold");

    /* After all that, a good call still works. */
    nms_check(&b, &s, 0.5, "nms after errors");

    tensor *all[] = {&b, &s, &s64, &s_short, &b_i32, &b_5, &b_3d, &s_2d};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tensor_free(all[i]);
}

/* ---- conv2d ----------------------------------------------------------------- */

typedef struct conv_case {
    int64_t n, c, h, w, o, kh, kw;
    int64_t sh, sw, ph, pw, dh, dw, groups;
    int bias;
    int unbatched;
} conv_case;

static void conv_run(const conv_case *cc, int bits, const char *what)
{
    tensor x, wt, b;
    int64_t xs[4] = {cc->n, cc->c, cc->h, cc->w};
    int64_t ws[4] = {cc->o, cc->c / cc->groups, cc->kh, cc->kw};
    int64_t bs[1] = {cc->o};
    DLDataType dt = dt_of(kDLFloat, bits);
    if (cc->unbatched)
        tensor_init(&x, dt, 3, xs + 1);
    else
        tensor_init(&x, dt, 4, xs);
    tensor_init(&wt, dt, 4, ws);
    tensor_init(&b, dt, 1, bs);
    tensor_randn(&x);
    tensor_randn(&wt);
    tensor_randn(&b);

    int64_t st[2] = {cc->sh, cc->sw}, pd[2] = {cc->ph, cc->pw}, dl[2] = {cc->dh, cc->dw};
    opjit_value args[7] = {opjit_tensor(&x.t), opjit_tensor(&wt.t),
                           cc->bias ? opjit_tensor(&b.t) : opjit_none(),
                           opjit_ints(st, 2), opjit_ints(pd, 2), opjit_ints(dl, 2),
                           opjit_int(cc->groups)};
    DLManagedTensor *out = NULL;
    int rc = opjit_call(rt, op_conv, args, 7, &out, 1);
    CHECKF(rc == OPJIT_OK, "%s: %s", what, opjit_errmsg(rt));
    if (rc == OPJIT_OK) {
        int64_t ho = (cc->h + 2 * cc->ph - cc->dh * (cc->kh - 1) - 1) / cc->sh + 1;
        int64_t wo = (cc->w + 2 * cc->pw - cc->dw * (cc->kw - 1) - 1) / cc->sw + 1;
        int64_t os[4] = {cc->n, cc->o, ho, wo};
        int shape_ok = cc->unbatched ? out_shape_is(out, 3, os + 1) : out_shape_is(out, 4, os);
        CHECKF(shape_ok, "%s: output shape", what);
        CHECKF(out->dl_tensor.dtype.bits == bits && out->dl_tensor.dtype.code == kDLFloat,
               "%s: output dtype", what);
        if (shape_ok) {
            int64_t cg = cc->c / cc->groups, og = cc->o / cc->groups, nbad = 0;
            double worst = 0;
            const void *od = out_data(out);
            for (int64_t n = 0; n < cc->n; n++)
                for (int64_t o = 0; o < cc->o; o++)
                    for (int64_t oh = 0; oh < ho; oh++)
                        for (int64_t ow = 0; ow < wo; ow++) {
                            int64_t gi = o / og;
                            double acc = cc->bias ? tget(&b, o) : 0, mag = fabs(acc);
                            for (int64_t ci = 0; ci < cg; ci++)
                                for (int64_t ki = 0; ki < cc->kh; ki++)
                                    for (int64_t kj = 0; kj < cc->kw; kj++) {
                                        int64_t ih = oh * cc->sh - cc->ph + ki * cc->dh;
                                        int64_t iw = ow * cc->sw - cc->pw + kj * cc->dw;
                                        if (ih < 0 || ih >= cc->h || iw < 0 || iw >= cc->w)
                                            continue;
                                        double xv = tget(&x, ((n * cc->c + gi * cg + ci) * cc->h + ih) * cc->w + iw);
                                        double wv = tget(&wt, ((o * cg + ci) * cc->kh + ki) * cc->kw + kj);
                                        acc += xv * wv;
                                        mag += fabs(xv * wv);
                                    }
                            int64_t oi = ((n * cc->o + o) * ho + oh) * wo + ow;
                            double got = bits == 64 ? ((const double *)od)[oi]
                                                    : ((const float *)od)[oi];
                            double err = fabs(got - acc);
                            double tol = (bits == 64 ? 1e-12 : 2e-6) * (mag + 1);
                            if (!(err <= tol))
                                nbad++;
                            if (err > worst)
                                worst = err;
                        }
            CHECKF(nbad == 0, "%s: %lld elements off (worst abs error %g)", what,
                   (long long)nbad, worst);
        }
        out->deleter(out);
    }
    tensor_free(&x);
    tensor_free(&wt);
    tensor_free(&b);
}

static void test_conv2d_cases(void)
{
    /* n c h w  o kh kw  sh sw ph pw dh dw groups bias unbatched */
    static const conv_case cases[] = {
        {2, 3, 9, 11, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1, 0},    /* plain, batch 2 */
        {1, 4, 8, 8, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2, 0, 0},     /* groups 2, no bias */
        {2, 6, 10, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 6, 1, 0},    /* depthwise */
        {2, 6, 10, 7, 12, 3, 3, 1, 1, 1, 1, 1, 1, 6, 1, 0},   /* depthwise x2 */
        {1, 4, 12, 12, 8, 3, 3, 1, 1, 2, 2, 2, 2, 1, 1, 0},   /* dilation 2 */
        {3, 5, 13, 9, 7, 3, 2, 2, 3, 1, 0, 1, 2, 1, 1, 0},    /* mixed, non-square */
        {2, 8, 7, 5, 16, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0},    /* 1x1 direct path */
        {2, 8, 7, 5, 16, 1, 1, 1, 1, 0, 0, 1, 1, 2, 0, 0},    /* 1x1 direct, groups */
        {2, 8, 7, 5, 16, 1, 1, 2, 2, 0, 0, 1, 1, 1, 1, 0},    /* 1x1 stride 2 */
        {2, 8, 7, 5, 16, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0},    /* 1x1 padded */
        {1, 3, 5, 5, 2, 5, 5, 1, 1, 0, 0, 1, 1, 1, 1, 0},     /* kernel = input */
        {1, 3, 5, 5, 2, 5, 5, 3, 3, 4, 4, 1, 1, 1, 1, 0},     /* big padding */
        {1, 3, 4, 6, 2, 3, 3, 7, 7, 0, 4, 1, 1, 1, 1, 0},     /* stride > size */
        {1, 3, 6, 6, 3, 3, 3, 1, 1, 5, 5, 3, 3, 1, 1, 0},     /* pad > input */
        {1, 2, 1, 1, 3, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0},     /* 1x1 image */
        {1, 3, 1, 17, 4, 1, 3, 1, 2, 0, 1, 1, 1, 1, 1, 0},    /* one row */
        {2, 32, 17, 19, 64, 5, 3, 2, 1, 2, 1, 1, 3, 4, 1, 0}, /* bigger */
        {1, 3, 8, 9, 5, 3, 3, 1, 2, 1, 1, 1, 1, 1, 0, 1},     /* unbatched [C,H,W] */
        {0, 3, 5, 5, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1, 0},     /* empty batch */
        {1, 3, 28, 28, 8, 7, 7, 2, 2, 3, 3, 1, 1, 1, 1, 0},   /* stem-like */
        /* 3x3, stride 1, dilation 1, one group, 32 tiles (2x2 outputs) or
         * more: Winograd F(2x2, 3x3) in the optimizing tier on AVX-512
         * (odd sizes leave partial tiles) */
        {4, 1, 9, 9, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0},     /* C = O = 1 */
        {3, 4, 7, 9, 5, 3, 3, 1, 1, 0, 0, 1, 1, 1, 0, 0},     /* batch 3, no padding */
        {2, 5, 6, 11, 9, 3, 3, 1, 1, 2, 2, 1, 1, 1, 1, 0},    /* padding 2 */
        {6, 3, 4, 4, 7, 3, 3, 1, 1, 2, 1, 1, 1, 1, 0, 0},     /* padding 2, 1 */
        {2, 2, 3, 3, 2, 3, 3, 1, 1, 4, 4, 1, 1, 1, 1, 0},     /* tiles all padding */
        {33, 3, 3, 3, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1, 0},    /* one output an image */
        {40, 2, 1, 1, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0},    /* 1x1 images */
        {2, 16, 13, 17, 24, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0}, /* C 16, O 24 */
        {1, 40, 30, 30, 33, 3, 3, 1, 1, 1, 1, 1, 1, 1, 0, 0}, /* O % 8 = 1, 2 chunks */
        {2, 3, 66, 66, 5, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0},   /* chunks split rows */
        {5, 2, 5, 7, 1, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0},     /* O = 1, images share chunks */
        {1, 600, 11, 11, 120, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0}, /* weights in 2 blocks */
        {1, 6, 13, 14, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1},   /* unbatched */
        {1, 5, 8, 8, 3, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0},     /* 16 tiles: im2col */
        /* the optimizing tier's float32 GEMM: row and column tails */
        {2, 12, 9, 9, 13, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0},   /* 1x1, O 13, 81 columns */
        {1, 16, 3, 3, 40, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0},   /* more rows than columns */
        {1, 70, 6, 50, 20, 3, 3, 2, 1, 1, 1, 1, 1, 1, 1, 0},  /* K 630, N 150 */
        {1, 8, 8, 8, 8, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0},     /* N 64 */
        {1, 20, 40, 45, 19, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0}, /* 1x1 K 20: next panel in 3 slices */
        {2, 300, 10, 31, 11, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0}, /* 1x1 K 300: next panel in 2 */
        /* ... and its im2col in blocks of output positions */
        {1, 200, 20, 21, 10, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0}, /* stride 2, 2 blocks */
        {1, 100, 13, 14, 9, 3, 3, 1, 1, 2, 1, 2, 1, 1, 0, 0},  /* dilation 2, 1, 2 blocks */
        {1, 60, 32, 32, 4, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0},  /* blocks of 240, rows 272 apart */
    };
    char what[64];
    for (int bits = 32; bits <= 64; bits += 32)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            snprintf(what, sizeof what, "conv2d case %zu f%d", i, bits);
            rng_seed(100 + i);
            conv_run(&cases[i], bits, what);
        }
}

static void test_conv2d_random(void)
{
    char what[64];
    rng_seed(7);
    for (int t = 0; t < 120; t++) {
        conv_case cc;
        int64_t groups = rng_int(1, 4);
        memset(&cc, 0, sizeof cc);
        cc.groups = groups;
        cc.c = groups * rng_int(1, 4);
        cc.o = groups * rng_int(1, 4);
        cc.kh = rng_int(1, 5);
        cc.kw = rng_int(1, 5);
        cc.sh = rng_int(1, 4);
        cc.sw = rng_int(1, 4);
        cc.ph = rng_int(0, 3);
        cc.pw = rng_int(0, 3);
        cc.dh = rng_int(1, 3);
        cc.dw = rng_int(1, 3);
        int64_t hmin = cc.dh * (cc.kh - 1) + 1 - 2 * cc.ph;
        int64_t wmin = cc.dw * (cc.kw - 1) + 1 - 2 * cc.pw;
        if (hmin < 1) hmin = 1;
        if (wmin < 1) wmin = 1;
        cc.h = rng_int(hmin, hmin + 10);
        cc.w = rng_int(wmin, wmin + 10);
        cc.n = rng_int(1, 3);
        cc.bias = (int)rng_int(0, 2);
        snprintf(what, sizeof what, "conv2d random %d", t);
        conv_run(&cc, t % 3 == 0 ? 64 : 32, what);
    }
}

static void test_conv2d_defaults(void)
{
    /* Only input and weight: stride 1, no padding, dilation 1, groups 1, no
     * bias; and a scalar for an int[2] argument. */
    tensor x, w;
    int64_t xs[4] = {1, 2, 4, 4}, ws[4] = {1, 2, 2, 2};
    tensor_init(&x, dt_of(kDLFloat, 32), 4, xs);
    tensor_init(&w, dt_of(kDLFloat, 32), 4, ws);
    for (int i = 0; i < 32; i++)
        ((float *)x.data)[i] = (float)i;
    for (int i = 0; i < 8; i++)
        ((float *)w.data)[i] = 1;
    DLManagedTensor *out = NULL;
    opjit_value a[2] = {opjit_tensor(&x.t), opjit_tensor(&w.t)};
    CHECKF(opjit_call(rt, op_conv, a, 2, &out, 1) == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (out) {
        int64_t os[4] = {1, 1, 3, 3};
        CHECK(out_shape_is(out, 4, os));
        const float *o = out_data(out);
        /* window at (0,0): channel 0 {0,1,4,5}, channel 1 {16,17,20,21} */
        CHECKF(o[0] == 84.0f, "got %g", o[0]);
        CHECKF(o[8] == 84.0f + 8 * 10, "got %g", o[8]);
        out->deleter(out);
    }
    out = NULL;
    opjit_value a2[4] = {opjit_tensor(&x.t), opjit_tensor(&w.t), opjit_none(), opjit_int(2)};
    CHECKF(opjit_call(rt, op_conv, a2, 4, &out, 1) == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (out) {
        int64_t os[4] = {1, 1, 2, 2};
        CHECK(out_shape_is(out, 4, os));
        out->deleter(out);
    }
    tensor_free(&x);
    tensor_free(&w);
}

static void test_conv2d_errors(void)
{
    tensor x, w, b, w_bad, b_bad, w64, x_i32, w3, b64, x_small, w_o;
    int64_t xs[4] = {1, 4, 5, 5}, ws[4] = {4, 2, 3, 3}, bs[1] = {4}, wbs[4] = {4, 3, 3, 3};
    int64_t bbs[1] = {3}, w3s[3] = {4, 2, 3}, xss[4] = {1, 4, 2, 2}, wos[4] = {5, 2, 3, 3};
    DLDataType f32 = dt_of(kDLFloat, 32);
    tensor_init(&x, f32, 4, xs);
    tensor_init(&w, f32, 4, ws);
    tensor_init(&b, f32, 1, bs);
    tensor_init(&w_bad, f32, 4, wbs);
    tensor_init(&b_bad, f32, 1, bbs);
    tensor_init(&w64, dt_of(kDLFloat, 64), 4, ws);
    tensor_init(&x_i32, dt_of(kDLInt, 32), 4, xs);
    tensor_init(&w3, f32, 3, w3s);
    tensor_init(&b64, dt_of(kDLFloat, 64), 1, bs);
    tensor_init(&x_small, f32, 4, xss);
    tensor_init(&w_o, f32, 4, wos);

    int64_t one[2] = {1, 1}, zero[2] = {0, 0}, neg[2] = {-1, 0}, s0[2] = {1, 0};
    int64_t three[3] = {1, 1, 1};
    opjit_value a[7] = {opjit_tensor(&x.t), opjit_tensor(&w.t), opjit_tensor(&b.t),
                        opjit_ints(one, 2), opjit_ints(zero, 2), opjit_ints(one, 2),
                        opjit_int(2)};
    DLManagedTensor *out = NULL;
    CHECKF(opjit_call(rt, op_conv, a, 7, &out, 1) == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (out)
        out->deleter(out);

    a[6] = opjit_int(1); /* weight has 2 channels: needs 4/1 */
    expect_fail(op_conv, a, 7, OPJIT_EKERNEL, "channels", "conv2d channel mismatch");
    a[6] = opjit_int(3); /* 4 channels not divisible by 3 */
    expect_fail(op_conv, a, 7, OPJIT_EKERNEL, "groups", "conv2d groups do not divide");
    a[6] = opjit_int(0);
    expect_fail(op_conv, a, 7, OPJIT_EKERNEL, "groups", "conv2d groups 0");
    a[6] = opjit_int(2);
    a[1] = opjit_tensor(&w_o.t); /* 5 output channels, groups 2 */
    a[2] = opjit_none();
    expect_fail(op_conv, a, 7, OPJIT_EKERNEL, "groups", "conv2d O not divisible");
    a[1] = opjit_tensor(&w_bad.t); /* 3 channels per group x 2 != 4 */
    expect_fail(op_conv, a, 7, OPJIT_EKERNEL, "channels", "conv2d weight channels");
    a[1] = opjit_tensor(&w.t);
    a[2] = opjit_tensor(&b_bad.t);
    expect_fail(op_conv, a, 7, OPJIT_EKERNEL, "bias", "conv2d bias size");
    a[2] = opjit_tensor(&b64.t);
    expect_fail(op_conv, a, 7, OPJIT_EKERNEL, "bias", "conv2d bias dtype");
    a[2] = opjit_tensor(&b.t);
    a[1] = opjit_tensor(&w64.t);
    expect_fail(op_conv, a, 7, OPJIT_EKERNEL, "weight", "conv2d weight dtype");
    a[1] = opjit_tensor(&w3.t);
    expect_fail(op_conv, a, 7, OPJIT_ECALL, "weight", "conv2d 3-D weight");
    a[1] = opjit_tensor(&w.t);
    a[0] = opjit_tensor(&x_i32.t);
    expect_fail(op_conv, a, 7, OPJIT_ECALL, "input", "conv2d int32 input");
    a[0] = opjit_tensor(&x_small.t); /* 2x2 input, 3x3 kernel, no padding */
    expect_fail(op_conv, a, 7, OPJIT_EKERNEL, "Kernel size can't be greater", "conv2d output size 0");
    a[0] = opjit_tensor(&x.t);
    a[3] = opjit_ints(s0, 2);
    expect_fail(op_conv, a, 7, OPJIT_EKERNEL, "stride", "conv2d stride 0");
    a[3] = opjit_ints(one, 2);
    a[4] = opjit_ints(neg, 2);
    expect_fail(op_conv, a, 7, OPJIT_EKERNEL, "padding", "conv2d negative padding");
    a[4] = opjit_ints(zero, 2);
    a[5] = opjit_ints(zero, 2);
    expect_fail(op_conv, a, 7, OPJIT_EKERNEL, "dilation", "conv2d dilation 0");
    a[5] = opjit_ints(three, 3);
    expect_fail(op_conv, a, 7, OPJIT_ECALL, "dilation", "conv2d dilation of 3");
    a[5] = opjit_ints(one, 2);
    a[0] = opjit_tensor(&b.t); /* a 1-D input */
    expect_fail(op_conv, a, 7, OPJIT_EKERNEL, "input", "conv2d 1-D input");

    tensor *all[] = {&x, &w, &b, &w_bad, &b_bad, &w64, &x_i32, &w3, &b64, &x_small, &w_o};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tensor_free(all[i]);
}

/* ---- mm ------------------------------------------------------------------------- */

/* self [n,k] (transposed storage if ta), mat2 [k,m] (if tb). */
static void mm_run(int64_t n, int64_t k, int64_t m, int bits, int ta, int tb, const char *what)
{
    tensor x, y;
    DLDataType dt = dt_of(kDLFloat, bits);
    int64_t xs[2] = {ta ? k : n, ta ? n : k}, ys[2] = {tb ? m : k, tb ? k : m};
    tensor_init(&x, dt, 2, xs);
    tensor_init(&y, dt, 2, ys);
    tensor_randn(&x);
    tensor_randn(&y);
    /* A transposed view: shape swapped, strides swapped. */
    if (ta) {
        x.strides[0] = 1;
        x.strides[1] = n;
        x.shape[0] = n;
        x.shape[1] = k;
        x.t.strides = x.strides;
    }
    if (tb) {
        y.strides[0] = 1;
        y.strides[1] = k;
        y.shape[0] = k;
        y.shape[1] = m;
        y.t.strides = y.strides;
    }
    opjit_value a[2] = {opjit_tensor(&x.t), opjit_tensor(&y.t)};
    DLManagedTensor *out = NULL;
    int rc = opjit_call(rt, op_mm, a, 2, &out, 1);
    CHECKF(rc == OPJIT_OK, "%s: %s", what, opjit_errmsg(rt));
    if (rc == OPJIT_OK) {
        int64_t os[2] = {n, m};
        CHECKF(out_shape_is(out, 2, os), "%s: output shape", what);
        CHECK(out->dl_tensor.dtype.bits == bits);
        if (out_shape_is(out, 2, os)) {
            const void *od = out_data(out);
            int64_t nbad = 0;
            for (int64_t i = 0; i < n; i++)
                for (int64_t j = 0; j < m; j++) {
                    double acc = 0, mag = 0;
                    for (int64_t p = 0; p < k; p++) {
                        double u = tget(&x, ta ? p * n + i : i * k + p);
                        double v = tget(&y, tb ? j * k + p : p * m + j);
                        acc += u * v;
                        mag += fabs(u * v);
                    }
                    double got = bits == 64 ? ((const double *)od)[i * m + j]
                                            : ((const float *)od)[i * m + j];
                    if (!(fabs(got - acc) <= (bits == 64 ? 1e-12 : 2e-6) * (mag + 1)))
                        nbad++;
                }
            CHECKF(nbad == 0, "%s: %lld elements off", what, (long long)nbad);
            if (k == 0 && n * m > 0) {
                int zeros = 1;
                for (int64_t i = 0; i < n * m; i++)
                    zeros &= (bits == 64 ? ((const double *)od)[i] : ((const float *)od)[i]) == 0;
                CHECKF(zeros, "%s: k == 0 must give zeros", what);
            }
        }
        out->deleter(out);
    }
    tensor_free(&x);
    tensor_free(&y);
}

static void test_mm(void)
{
    static const int64_t sizes[][3] = {
        {1, 1, 1}, {3, 4, 5}, {5, 1, 7}, {64, 128, 33}, {129, 65, 257}, {1, 300, 1},
        {0, 3, 4}, {3, 0, 4}, {3, 4, 0}, {0, 0, 0}, {2, 0, 0}, {17, 31, 1},
        {300, 520, 77},  /* steps of 256 of k (AVX2), blocks of 256 rows (a 512 KB L2) */
        {601, 280, 53},  /* blocks of 512 rows (a 1 MB L2), then 89 ending in 1 row */
        {3, 300, 48}};   /* fewer rows than a micro-kernel's packing full panels */
    char what[80];
    rng_seed(11);
    for (int bits = 32; bits <= 64; bits += 32)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
            for (int t = 0; t < 4; t++) {
                snprintf(what, sizeof what, "mm %lldx%lldx%lld f%d trans %d",
                         (long long)sizes[i][0], (long long)sizes[i][1],
                         (long long)sizes[i][2], bits, t);
                mm_run(sizes[i][0], sizes[i][1], sizes[i][2], bits, t & 1, t >> 1, what);
            }
}

static void test_mm_errors(void)
{
    tensor x, y, y_bad, y64, v, xi, xs;
    int64_t s23[2] = {2, 3}, s34[2] = {3, 4}, s44[2] = {4, 4}, s3[1] = {3}, s36[2] = {3, 6};
    DLDataType f32 = dt_of(kDLFloat, 32);
    tensor_init(&x, f32, 2, s23);
    tensor_init(&y, f32, 2, s34);
    tensor_init(&y_bad, f32, 2, s44);
    tensor_init(&y64, dt_of(kDLFloat, 64), 2, s34);
    tensor_init(&v, f32, 1, s3);
    tensor_init(&xi, dt_of(kDLInt, 64), 2, s23);
    /* every other column of a [3, 6]: strides [6, 2], neither layout */
    tensor_init(&xs, f32, 2, s36);
    xs.shape[0] = 2;
    xs.shape[1] = 3;
    xs.strides[0] = 6;
    xs.strides[1] = 2;
    xs.t.strides = xs.strides;

    opjit_value a[2] = {opjit_tensor(&x.t), opjit_tensor(&y_bad.t)};
    expect_fail(op_mm, a, 2, OPJIT_EKERNEL, "cannot be multiplied", "mm shape mismatch");
    a[1] = opjit_tensor(&y64.t);
    expect_fail(op_mm, a, 2, OPJIT_EKERNEL, "mat2", "mm dtype mismatch");
    a[1] = opjit_tensor(&v.t);
    expect_fail(op_mm, a, 2, OPJIT_ECALL, "mat2", "mm 1-D mat2");
    a[1] = opjit_tensor(&y.t);
    a[0] = opjit_tensor(&xi.t);
    expect_fail(op_mm, a, 2, OPJIT_ECALL, "self", "mm int64 self");
    /* every other column of a [3, 6]: neither layout, copied (as torch.mm
     * takes it) */
    a[0] = opjit_tensor(&xs.t);
    for (int i = 0; i < 18; i++)
        ((float *)xs.data)[i] = (float)i;
    for (int i = 0; i < 12; i++)
        ((float *)y.data)[i] = (float)(i % 5);
    DLManagedTensor *out = NULL;
    CHECKF(opjit_call(rt, op_mm, a, 2, &out, 1) == OPJIT_OK, "mm strided self: %s",
           opjit_errmsg(rt));
    if (out) {
        const float *o = out_data(out);
        for (int i = 0; i < 2; i++)
            for (int j = 0; j < 4; j++) {
                float want = 0;
                for (int p = 0; p < 3; p++)
                    want += (float)(6 * i + 2 * p) * (float)((4 * p + j) % 5);
                CHECKF(o[i * 4 + j] == want, "mm strided self [%d, %d]: %g, want %g", i, j,
                       o[i * 4 + j], want);
            }
        out->deleter(out);
    }
    a[0] = opjit_tensor(&x.t);
    expect_fail(op_mm, a, 1, OPJIT_ECALL, "mat2", "mm missing mat2");

    tensor *all[] = {&x, &y, &y_bad, &y64, &v, &xi, &xs};
    for (size_t i = 0; i < sizeof all / sizeof *all; i++)
        tensor_free(all[i]);
}

/* ---- main ----------------------------------------------------------------------- */

/* Create a runtime with the optimizing tier on or off and load the three
 * ops. With tiering on, wait for the optimized code so the suite runs on
 * it. Returns the tier serving nms ("tcc", "opt"), or NULL on failure. */
static const char *setup(int tiering)
{
    opjit_config cfg;
    opjit_op_info info = {.size = sizeof info};
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = tiering;
    /* With tiering off, a private cache: optimized code already in the
     * shared cache would otherwise be served. */
    cfg.no_cache = !tiering;
    int rc = opjit_create(&cfg, &rt);
    if (rc != OPJIT_OK) {
        fprintf(stderr, "opjit_create: %s\n", opjit_status_name(rc));
        return NULL;
    }
    if (opjit_load_op(rt, "nms", &op_nms) != OPJIT_OK ||
        opjit_load_op(rt, "conv2d", &op_conv) != OPJIT_OK ||
        opjit_load_op(rt, "mm", &op_mm) != OPJIT_OK) {
        fprintf(stderr, "loading the ops failed: %s\n", opjit_errmsg(rt));
        return NULL;
    }
    if (tiering && opjit_wait(rt) != OPJIT_OK) {
        fprintf(stderr, "optimizing tier failed: %s\n", opjit_errmsg(rt));
        return NULL;
    }
    if (opjit_op_info_get(rt, op_nms, &info) != OPJIT_OK || !info.tier[OPJIT_CPU])
        return "?";
    return info.tier[OPJIT_CPU];
}

static void run_suite(void)
{
    T_RUN(test_nms_edges);
    T_RUN(test_nms_random);
    T_RUN(test_nms_large);
    T_RUN(test_nms_errors);
    T_RUN(test_conv2d_cases);
    T_RUN(test_conv2d_random);
    T_RUN(test_conv2d_defaults);
    T_RUN(test_conv2d_errors);
    T_RUN(test_mm);
    T_RUN(test_mm_errors);
}

int main(void)
{
    /* Pass 1: the libtcc code. */
    const char *tier = setup(0);
    CHECKF(tier && strcmp(tier, "tcc") == 0, "tiering off: tier %s", tier ? tier : "(none)");
    if (!tier) {
        opjit_destroy(rt);
        return 1;
    }
    fprintf(stderr, "-- libtcc code\n");
    run_suite();
    opjit_destroy(rt);
    rt = NULL;

    /* Pass 2: the same sources through the optimizing tier (gcc -O2), when
     * a C compiler is there ($OPJIT_CC or cc). */
    tier = setup(1);
    int opt = tier && strcmp(tier, "opt") == 0; /* tier is rt's: gone with it */
    if (!tier) {
        CHECKF(0, "setup with tiering on failed");
    } else if (opt) {
        fprintf(stderr, "-- optimized code\n");
        run_suite();
    } else {
        fprintf(stderr, "-- optimizing tier not in use (tier %s): pass 2 skipped\n", tier);
    }
    opjit_destroy(rt);

    /* Passes 3 and 4: the optimizing tier built for the lower levels
     * (OPJIT_CPU_LEVEL), so that the AVX2 and the portable kernels are
     * tested on a CPU that has more (test_cpu_level.sh checks what the
     * artifacts hold). */
    static const char *const lower[] = {"avx2", "portable"};
    for (size_t i = 0; i < sizeof lower / sizeof *lower && opt; i++) {
        setenv("OPJIT_CPU_LEVEL", lower[i], 1);
        tier = setup(1);
        CHECKF(tier && !strcmp(tier, "opt"), "OPJIT_CPU_LEVEL=%s: tier %s", lower[i],
               tier ? tier : "(none)");
        if (tier && !strcmp(tier, "opt")) {
            fprintf(stderr, "-- optimized code, OPJIT_CPU_LEVEL=%s\n", lower[i]);
            run_suite();
        }
        opjit_destroy(rt);
    }
    unsetenv("OPJIT_CPU_LEVEL");
    return t_done();
}
