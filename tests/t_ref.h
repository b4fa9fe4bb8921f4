/* tests/t_ref.h - what tests/test_backward.c and tests/test_strides.c
 * share: tensors with any strides over storage they own, dense double
 * copies of them, and straightforward reference loops for conv2d and mm
 * and their gradients (sums in double), written here from the
 * definitions. */
#ifndef OPJIT_TEST_T_REF_H
#define OPJIT_TEST_T_REF_H

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "opjit.h"
#include "t.h"

/* ---- random numbers (splitmix64) ------------------------------------------- */

static uint64_t ref_rng = 0x9e3779b97f4a7c15ull;
static inline void ref_seed(uint64_t s) { ref_rng = s * 0x9e3779b97f4a7c15ull + 1; }
static inline uint64_t ref_next(void)
{
    uint64_t z = (ref_rng += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
static inline double ref_unif(void) { return (double)(ref_next() >> 11) * (1.0 / 9007199254740992.0); }
static inline int64_t ref_int(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(ref_next() % (uint64_t)(hi - lo));
}

/* ---- tensors -------------------------------------------------------------------- */

/* A CPU float32/float64 tensor: a view (shape, strides, offset) of storage
 * it owns. */
typedef struct rtensor {
    DLTensor t;
    int64_t shape[4], strides[4];
    void *store;
    int64_t nstore; /* elements of storage */
} rtensor;

static inline int64_t ref_numel(int ndim, const int64_t *shape)
{
    int64_t n = 1;
    for (int i = 0; i < ndim; i++)
        n *= shape[i];
    return n;
}

/* A view of shape with strides (NULL: dense, DLPack's NULL strides) at
 * element offset off into nstore elements of random storage in [-1, 1). */
static inline void rt_view(rtensor *x, int bits, int ndim, const int64_t *shape, const int64_t *strides,
                    int64_t off, int64_t nstore)
{
    memset(x, 0, sizeof *x);
    x->nstore = nstore;
    x->store = malloc((size_t)(nstore > 0 ? nstore : 1) * (size_t)(bits / 8));
    for (int64_t i = 0; i < nstore; i++) {
        double v = 2 * ref_unif() - 1;
        if (bits == 64)
            ((double *)x->store)[i] = v;
        else
            ((float *)x->store)[i] = (float)v;
    }
    for (int i = 0; i < ndim; i++) {
        x->shape[i] = shape[i];
        x->strides[i] = strides ? strides[i] : 0;
    }
    x->t.data = nstore > 0 ? x->store : NULL; /* empty: no data, as torch gives */
    x->t.byte_offset = (uint64_t)off * (uint64_t)(bits / 8);
    x->t.device.device_type = kDLCPU;
    x->t.ndim = ndim;
    x->t.dtype.code = kDLFloat;
    x->t.dtype.bits = (uint8_t)bits;
    x->t.dtype.lanes = 1;
    x->t.shape = x->shape;
    x->t.strides = strides ? x->strides : NULL;
}

/* A dense tensor of shape, random. */
static inline void rt_dense(rtensor *x, int bits, int ndim, const int64_t *shape)
{
    rt_view(x, bits, ndim, shape, NULL, 0, ref_numel(ndim, shape));
}

/* Layouts a test can ask of a 4-D (or 2-D) tensor, all of them views of
 * the same logical shape. */
enum {
    RL_DENSE = 0,   /* row-major, NULL strides */
    RL_CHLAST,      /* channels_last: dims (0, 2, 3, 1) in memory; 2-D: a transpose */
    RL_STEP2,       /* every other element of the last dimension: x[..., ::2] */
    RL_EXPAND,      /* dimension 0 broadcast (stride 0), as expand gives */
    RL_OFFSET,      /* row-major inside a larger buffer, rows padded, with an offset */
    RL_COUNT
};
static const char *const rl_names[RL_COUNT] = {"dense", "channels_last", "[..., ::2]",
                                               "expand", "padded rows + offset"};

/* x of shape in layout lay (RL_*), random. */
static inline void rt_layout(rtensor *x, int bits, int ndim, const int64_t *shape, int lay)
{
    int64_t st[4], n = ref_numel(ndim, shape), acc = 1;
    int order[4], i;
    if (lay == RL_DENSE || n == 0) {
        rt_dense(x, bits, ndim, shape);
        return;
    }
    for (i = 0; i < ndim; i++)
        order[i] = i;
    if (lay == RL_CHLAST) { /* innermost first: 1, 3, 2, 0 (2-D: 0, 1) */
        if (ndim == 4) {
            order[0] = 1; order[1] = 3; order[2] = 2; order[3] = 0;
        } else {
            for (i = 0; i < ndim; i++)
                order[i] = i;
        }
    } else {
        for (i = 0; i < ndim; i++)
            order[i] = ndim - 1 - i;
    }
    for (i = 0; i < ndim; i++) {
        int d = order[i];
        int64_t step = lay == RL_STEP2 && i == 0 ? 2 : 1;
        st[d] = acc * step;
        acc *= shape[d] * step + (lay == RL_OFFSET && i == 0 ? 3 : 0);
    }
    if (lay == RL_EXPAND) { /* one slice, broadcast along dim 0 */
        st[0] = 0;
        acc /= shape[0] > 0 ? shape[0] : 1;
    }
    rt_view(x, bits, ndim, shape, st, lay == RL_OFFSET ? 5 : 0, acc + (lay == RL_OFFSET ? 5 : 0));
}

static inline void rt_free(rtensor *x) { free(x->store); }

/* Element at logical index idx, as double. */
static inline double rt_at(const rtensor *x, const int64_t *idx)
{
    int64_t off = (int64_t)(x->t.byte_offset / (x->t.dtype.bits / 8)), st = 1;
    for (int i = x->t.ndim - 1; i >= 0; i--) {
        off += idx[i] * (x->t.strides ? x->strides[i] : st);
        st *= x->shape[i];
    }
    return x->t.dtype.bits == 64 ? ((const double *)x->store)[off]
                                 : ((const float *)x->store)[off];
}

/* A dense double copy (row-major) of x's logical elements; free() it. */
static inline double *rt_doubles(const rtensor *x)
{
    int nd = x->t.ndim;
    int64_t n = ref_numel(nd, x->shape), idx[4] = {0, 0, 0, 0};
    double *d = malloc(sizeof(double) * (size_t)(n > 0 ? n : 1));
    for (int64_t i = 0; i < n; i++) {
        int64_t r = i;
        for (int k = nd - 1; k >= 0; k--) {
            idx[k] = r % x->shape[k];
            r /= x->shape[k];
        }
        d[i] = rt_at(x, idx);
    }
    return d;
}

/* Element i of a dense output, as double. */
static inline double out_at(const DLManagedTensor *o, int64_t i)
{
    const char *p = (const char *)o->dl_tensor.data + o->dl_tensor.byte_offset;
    return o->dl_tensor.dtype.bits == 64 ? ((const double *)(const void *)p)[i]
                                         : ((const float *)(const void *)p)[i];
}

static inline int out_shape_is(const DLManagedTensor *o, int ndim, const int64_t *shape)
{
    if (!o || o->dl_tensor.ndim != ndim || o->dl_tensor.strides)
        return 0;
    for (int i = 0; i < ndim; i++)
        if (o->dl_tensor.shape[i] != shape[i])
            return 0;
    return 1;
}

/* Compare n elements of out with want (mag: the sum of |terms| of each,
 * for the tolerance); returns the number off, worst error in *worst. */
static inline int64_t ref_compare(const DLManagedTensor *out, const double *want, const double *mag,
                           int64_t n, int bits, double *worst)
{
    int64_t bad = 0;
    *worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double err = fabs(out_at(out, i) - want[i]);
        double tol = (bits == 64 ? 1e-12 : 3e-6) * (mag[i] + 1);
        if (!(err <= tol))
            bad++;
        if (err > *worst || err != err)
            *worst = err;
    }
    return bad;
}

/* ---- conv2d ---------------------------------------------------------------------- */

/* One convolution: input [n, c, h, w], weight [o, c/groups, kh, kw];
 * padding top/left (ph, pw) and bottom/right (ph2, pw2), which differ only
 * for padding="same" with an even dilated kernel. */
typedef struct ref_conv {
    int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, ph2, pw2, dh, dw, groups;
    int64_t ho, wo;
} ref_conv;

static inline void ref_conv_sizes(ref_conv *g)
{
    g->ho = (g->h + g->ph + g->ph2 - g->dh * (g->kh - 1) - 1) / g->sh + 1;
    g->wo = (g->w + g->pw + g->pw2 - g->dw * (g->kw - 1) - 1) / g->sw + 1;
}

/* Input index of output (oh, ow) and tap (ki, kj), or -1 outside. */
static inline int64_t ref_tap(const ref_conv *g, int64_t oh, int64_t ow, int64_t ki, int64_t kj)
{
    int64_t ih = oh * g->sh - g->ph + ki * g->dh, iw = ow * g->sw - g->pw + kj * g->dw;
    return ih < 0 || ih >= g->h || iw < 0 || iw >= g->w ? -1 : ih * g->w + iw;
}

/* Visit every (output element, input element, weight element) triple:
 * fn(u, oi, xi, wi) with flat indices into y, x and w. */
#define REF_CONV_EACH(g, BODY)                                                        \
    for (int64_t n_ = 0; n_ < (g)->n; n_++)                                           \
        for (int64_t o_ = 0; o_ < (g)->o; o_++)                                       \
            for (int64_t oh_ = 0; oh_ < (g)->ho; oh_++)                               \
                for (int64_t ow_ = 0; ow_ < (g)->wo; ow_++) {                         \
                    int64_t cg_ = (g)->c / (g)->groups, og_ = (g)->o / (g)->groups;   \
                    int64_t gi_ = o_ / og_;                                           \
                    int64_t oi = ((n_ * (g)->o + o_) * (g)->ho + oh_) * (g)->wo + ow_; \
                    for (int64_t c_ = 0; c_ < cg_; c_++)                              \
                        for (int64_t ki_ = 0; ki_ < (g)->kh; ki_++)                   \
                            for (int64_t kj_ = 0; kj_ < (g)->kw; kj_++) {             \
                                int64_t t_ = ref_tap((g), oh_, ow_, ki_, kj_);        \
                                if (t_ < 0)                                           \
                                    continue;                                         \
                                int64_t xi = (n_ * (g)->c + gi_ * cg_ + c_) * (g)->h * (g)->w + t_; \
                                int64_t wi = ((o_ * cg_ + c_) * (g)->kh + ki_) * (g)->kw + kj_; \
                                BODY                                                  \
                            }                                                         \
                }

/* y = conv(x, w) + b (b may be NULL); ym: sums of |terms|. */
static inline void ref_conv_forward(const ref_conv *g, const double *x, const double *w,
                             const double *b, double *y, double *ym)
{
    int64_t ny = g->n * g->o * g->ho * g->wo;
    for (int64_t i = 0; i < ny; i++) {
        int64_t o = i / (g->ho * g->wo) % g->o;
        y[i] = b ? b[o] : 0;
        ym[i] = b ? fabs(b[o]) : 0;
    }
    REF_CONV_EACH(g, {
        y[oi] += x[xi] * w[wi];
        ym[oi] += fabs(x[xi] * w[wi]);
    })
}

/* The gradients for dy: dx (like x), dw (like w), db [o]; *m: sums of
 * |terms|. Any output pointer may be NULL. */
static inline void ref_conv_backward(const ref_conv *g, const double *dy, const double *x,
                              const double *w, double *dx, double *dxm, double *dw, double *dwm,
                              double *db, double *dbm)
{
    int64_t nx = g->n * g->c * g->h * g->w, nw = g->o * (g->c / g->groups) * g->kh * g->kw;
    int64_t ny = g->n * g->o * g->ho * g->wo;
    if (dx)
        for (int64_t i = 0; i < nx; i++)
            dx[i] = dxm[i] = 0;
    if (dw)
        for (int64_t i = 0; i < nw; i++)
            dw[i] = dwm[i] = 0;
    if (db) {
        for (int64_t i = 0; i < g->o; i++)
            db[i] = dbm[i] = 0;
        for (int64_t i = 0; i < ny; i++) {
            db[i / (g->ho * g->wo) % g->o] += dy[i];
            dbm[i / (g->ho * g->wo) % g->o] += fabs(dy[i]);
        }
    }
    REF_CONV_EACH(g, {
        if (dx) {
            dx[xi] += dy[oi] * w[wi];
            dxm[xi] += fabs(dy[oi] * w[wi]);
        }
        if (dw) {
            dw[wi] += dy[oi] * x[xi];
            dwm[wi] += fabs(dy[oi] * x[xi]);
        }
    })
}

/* ---- mm ------------------------------------------------------------------------------ */

/* c [n, m] = a [n, k] b [k, m] with a and b dense doubles read through
 * transposition flags (ta: a is given as [k, n]); cm: sums of |terms|. */
static inline void ref_mm(int64_t n, int64_t k, int64_t m, const double *a, int ta, const double *b,
                   int tb, double *c, double *cm)
{
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            double s = 0, sm = 0;
            for (int64_t p = 0; p < k; p++) {
                double u = ta ? a[p * n + i] : a[i * k + p];
                double v = tb ? b[j * k + p] : b[p * m + j];
                s += u * v;
                sm += fabs(u * v);
            }
            c[i * m + j] = s;
            cm[i * m + j] = sm;
        }
}

#endif
