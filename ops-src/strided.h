/*
 * ops-src/strided.h - dense copies of strided CPU tensors, for the ops that
 * take any strides as torch does (transposed views, x[..., ::2],
 * channels_last, expand's zero strides, as_strided) but compute on
 * row-major blocks. A local header of conv2d.c and mm.c: their cache keys
 * include it.
 *
 *   if (st_dense(ctx, t, &x)) return -1;   // x: t's data, or a copy in workspace
 *
 * A copy costs a read and a write of the tensor; the products that follow
 * read each element many times (a GEMM, a convolution), so the copy pays
 * for itself except on tiny inputs. Copies run over opjit_parallel_for's
 * threads; a copy is exact, so the thread count changes nothing.
 *
 * Two ways, chosen by the layout:
 *  - rows: the last dimension's runs (memcpy when its stride is 1, else
 *    an element loop), row by row;
 *  - tiles: when another dimension has stride 1 (NHWC read as NCHW, a
 *    transpose), 32 x 32 tiles of that dimension and the last one, so
 *    that both the reads and the writes stay within a few cache lines.
 */
#ifndef OPS_STRIDED_H
#define OPS_STRIDED_H

#include <opjit_op.h>
#include <string.h>

#define ST_MAX_DIMS 16 /* after merging; more is refused */
#define ST_TILE 32

/* Whether t is row-major dense: NULL strides, or strides that match its
 * shape (a dimension of size 1 may carry any stride). Empty tensors are:
 * they have no element to misplace. */
static int st_is_dense(const DLTensor *t)
{
    int64_t expect = 1;
    int i;
    if (!t->strides)
        return 1;
    for (i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0)
            return 1;
    for (i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect)
            return 0;
        expect *= t->shape[i];
    }
    return 1;
}

/* One copy: the source's dimensions with sizes of 1 dropped and
 * neighbours that are one run merged (shape, source strides), the
 * destination's row-major strides, and the way (tile: the dimension of
 * stride 1 that is not the last, else -1). */
typedef struct st_copy {
    int nd, tile, esz;
    int64_t shape[ST_MAX_DIMS], src[ST_MAX_DIMS], dst[ST_MAX_DIMS];
    int64_t rows, tiles_a, tiles_b; /* units: rows, or tiles of (tile, last) */
    const char *from;
    char *to;
} st_copy;

/* Fill c from t; 0, or -1 when t has more than ST_MAX_DIMS dimensions
 * after merging. */
static int st_plan(st_copy *c, const DLTensor *t, const void *to)
{
    int i, j;
    int64_t r = 1;
    c->nd = 0;
    c->tile = -1;
    c->esz = (t->dtype.bits * t->dtype.lanes + 7) / 8;
    for (i = 0; i < t->ndim; i++) {
        if (t->shape[i] == 1)
            continue;
        if (c->nd > 0 && c->src[c->nd - 1] == t->strides[i] * t->shape[i]) {
            c->shape[c->nd - 1] *= t->shape[i]; /* one run with the one before */
            c->src[c->nd - 1] = t->strides[i];
            continue;
        }
        if (c->nd == ST_MAX_DIMS)
            return -1;
        c->shape[c->nd] = t->shape[i];
        c->src[c->nd++] = t->strides[i];
    }
    if (c->nd == 0) { /* one element */
        c->shape[0] = 1;
        c->src[0] = 1;
        c->nd = 1;
    }
    for (j = c->nd - 1; j >= 0; j--) {
        c->dst[j] = r;
        r *= c->shape[j];
    }
    for (j = 0; j < c->nd - 1; j++)
        if (c->src[j] == 1 && c->src[c->nd - 1] != 1 && c->shape[j] >= 8)
            c->tile = j;
    c->rows = r / c->shape[c->nd - 1];
    if (c->tile >= 0) {
        c->tiles_a = (c->shape[c->tile] + ST_TILE - 1) / ST_TILE;
        c->tiles_b = (c->shape[c->nd - 1] + ST_TILE - 1) / ST_TILE;
        c->rows = c->rows / c->shape[c->tile] * c->tiles_a * c->tiles_b;
    }
    c->from = (const char *)t->data + t->byte_offset;
    c->to = (char *)to;
    return 0;
}

/* The source and destination element offsets of outer index u: the
 * dimensions before the last (all but skip, which is -1 or the tiled
 * one), row-major. */
static void st_offsets(const st_copy *c, int64_t u, int skip, int64_t *s, int64_t *d)
{
    int j;
    *s = *d = 0;
    for (j = c->nd - 2; j >= 0; j--) {
        int64_t i;
        if (j == skip)
            continue;
        i = u % c->shape[j];
        u /= c->shape[j];
        *s += i * c->src[j];
        *d += i * c->dst[j];
    }
}

/* Copy n elements of size esz, source stride ss (elements), to a run. */
static void st_run(char *d, const char *s, int64_t n, int64_t ss, int esz)
{
    int64_t i;
    if (ss == 1) {
        memcpy(d, s, (size_t)(n * esz));
    } else if (esz == 4) {
        for (i = 0; i < n; i++)
            ((uint32_t *)(void *)d)[i] = *(const uint32_t *)(const void *)(s + i * ss * 4);
    } else if (esz == 8) {
        for (i = 0; i < n; i++)
            ((uint64_t *)(void *)d)[i] = *(const uint64_t *)(const void *)(s + i * ss * 8);
    } else {
        for (i = 0; i < n; i++)
            memcpy(d + i * esz, s + i * ss * esz, (size_t)esz);
    }
}

/* One tile: rows [a0, a1) of the tiled dimension (stride 1 in the source)
 * and columns [b0, b1) of the last, read along the tiled dimension. In the
 * optimizing tier (sgemm_avx512.h included first), 4-byte elements go
 * through its 16 x 16 register transposes. */
static void st_tile(const st_copy *c, int64_t so, int64_t dof, int64_t a0, int64_t a1,
                    int64_t b0, int64_t b1)
{
    const int64_t sb = c->src[c->nd - 1], da = c->dst[c->tile];
    const int esz = c->esz;
    int64_t a, b;
#ifdef SG_FAST
    if (esz == 4 && sg_fast_ok()) { /* the source as [b][a] (rows sb apart), transposed */
        sg_transpose((const float *)(const void *)c->from + so + a0 + b0 * sb, sb, b1 - b0,
                     a1 - a0, (float *)(void *)c->to + dof + a0 * da + b0, da);
        return;
    }
#endif
    for (b = b0; b < b1; b++) {
        const char *s = c->from + (so + b * sb) * esz;
        char *d = c->to + (dof + b) * esz;
        if (esz == 4)
            for (a = a0; a < a1; a++)
                *(uint32_t *)(void *)(d + a * da * 4) = ((const uint32_t *)(const void *)s)[a];
        else if (esz == 8)
            for (a = a0; a < a1; a++)
                *(uint64_t *)(void *)(d + a * da * 8) = ((const uint64_t *)(const void *)s)[a];
        else
            for (a = a0; a < a1; a++)
                memcpy(d + a * da * esz, s + a * esz, (size_t)esz);
    }
}

/* Units [lo, hi): rows, or tiles. */
static int st_copy_run(void *user, int64_t lo, int64_t hi)
{
    const st_copy *c = (const st_copy *)user;
    const int64_t last = c->shape[c->nd - 1];
    int64_t u, so, dof;
    for (u = lo; u < hi; u++) {
        if (c->tile < 0) {
            st_offsets(c, u, -1, &so, &dof);
            st_run(c->to + dof * c->esz, c->from + so * c->esz, last,
                   c->src[c->nd - 1], c->esz);
        } else {
            int64_t per = c->tiles_a * c->tiles_b, t = u % per;
            int64_t a0 = (t / c->tiles_b) * ST_TILE, b0 = (t % c->tiles_b) * ST_TILE;
            int64_t a1 = a0 + ST_TILE < c->shape[c->tile] ? a0 + ST_TILE : c->shape[c->tile];
            int64_t b1 = b0 + ST_TILE < last ? b0 + ST_TILE : last;
            st_offsets(c, u / per, c->tile, &so, &dof);
            st_tile(c, so, dof, a0, a1, b0, b1);
        }
    }
    return 0;
}

/* Copy t (CPU, any strides) into the dense block to (numel elements).
 * Returns 0, or the status of opjit_fail. */
static int st_copy_to(opjit_ctx *ctx, const DLTensor *t, void *to)
{
    st_copy c;
    int64_t grain;
    if (st_plan(&c, t, to))
        return opjit_fail(ctx, "a tensor of %d dimensions whose strides merge into more "
                               "than %d is not supported", t->ndim, ST_MAX_DIMS);
    /* chunks of about 64 KB: a loop's wake-up costs more than smaller */
    grain = ((int64_t)1 << 16) / c.esz /
            (c.tile >= 0 ? ST_TILE * ST_TILE : c.shape[c.nd - 1]);
    return opjit_parallel_for(ctx, 0, c.rows, grain < 1 ? 1 : grain, st_copy_run, &c);
}

/* t's elements in row-major order into *out: its own data when it is
 * dense (no copy; NULL may come with no elements), else a copy in the
 * call's workspace. Returns 0, or -1 with the error recorded: return
 * opjit_fail's status, or -1. Call it before any opjit_parallel_for of the
 * kernel (workspace is taken here). */
static int st_dense(opjit_ctx *ctx, const DLTensor *t, const void **out)
{
    void *to;
    *out = opjit_data(t);
    if (st_is_dense(t))
        return 0;
    to = opjit_workspace(ctx, (size_t)opjit_numel(t) * (size_t)((t->dtype.bits + 7) / 8) + 64);
    if (!to || st_copy_to(ctx, t, to))
        return -1;
    *out = to;
    return 0;
}

#endif
