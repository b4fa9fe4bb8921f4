/*
 * nms.c - non-maximum suppression on the CPU, torchvision.ops.nms semantics.
 *
 *   nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor
 *
 * boxes [N, 4] as (x1, y1, x2, y2) and scores [N], of one dtype: float32,
 * float64, float16 or bfloat16 (the 16-bit ones widened to float32 first,
 * so the IoU is computed in float32 as torchvision's CUDA kernel does for
 * half; its CPU kernel takes no half). Returns the int64 indices of the
 * kept boxes in decreasing score order. Matches torchvision 0.14's CPU
 * kernel bit for bit:
 *
 *   - order: a stable descending sort of the scores (torchvision sorts with
 *     stable=true): equal scores keep their index order, -0.0 equals 0.0,
 *     and NaN scores sort before every number (as torch's descending sort
 *     puts them), in index order among themselves;
 *   - areas (x2 - x1) * (y2 - y1) and IoU inter / (area_i + area_j - inter)
 *     in the boxes' dtype, no "+1", with std::max/std::min argument order so
 *     NaN coordinates behave the same;
 *   - box j is suppressed when IoU > iou_threshold (strict, compared in
 *     double). A NaN threshold suppresses nothing; a negative one suppresses
 *     every later box whose IoU is a number (even disjoint ones), as in
 *     torchvision.
 *
 * Work: the order is a stable merge sort of integer keys; boxes and areas
 * are then gathered into contiguous per-coordinate arrays in sorted order.
 * For a threshold >= 0 and finite coordinates (the usual case) only boxes
 * that overlap can suppress each other, so kept boxes go into a uniform
 * grid and each box is tested against the kept boxes in the cells it
 * covers: near-linear for detector outputs instead of O(N * kept). Other
 * inputs take torchvision's O(N * kept) loop, which walks the arrays
 * linearly and skips suppressed boxes. Both give the same result.
 */
#include <opjit_op.h>
#include <string.h>

#include "nms_common.h"
#include "nms_decl.h"

/* Everything the suppression loop works on, in sorted order. The
 * per-coordinate arrays are float or double (the boxes' dtype, so every
 * IoU rounds as torchvision's does); the grid arrays are shared. */
typedef struct nms_work {
    int64_t n;
    double thr;
    const int64_t *order; /* sorted position -> original index */
    void *x1, *y1, *x2, *y2, *area;
    unsigned char *sup;   /* brute force: suppressed flags */
    int64_t *keep;        /* kept original indices, in order */
    /* grid path */
    int32_t *cx0, *cx1, *cy0, *cy1; /* cell range of each box; cx0 < 0: empty */
    int32_t *kept;        /* sorted positions of kept non-empty boxes */
    int32_t *big;         /* ... of those covering more than NMS_CAP cells */
    int32_t *head;        /* per cell: first entry, or -1 */
    int32_t *enext, *ebox;/* entries: next entry, sorted position */
    int64_t nk, nkept, nbig, ne; /* kept (output), kept non-empty, big, entries */
} nms_work;

/* A box covering more than this many grid cells is not registered in the
 * grid: it sits on a list every candidate checks, and as a candidate it
 * checks every kept box. */
#define NMS_CAP 16

/* For one scalar type T:
 *
 * nms_gather_T: gathers boxes into x1..area in sorted order; returns 1 when
 *   every coordinate is finite.
 *
 * nms_brute_T: torchvision's loop. For a threshold >= 0, a pair with
 *   w == 0 or h == 0 cannot be suppressed (its IoU is 0, -0 or NaN) and is
 *   skipped before the division.
 *
 * nms_grid_T: the same result in another order, for a threshold >= 0 and
 *   finite coordinates. Box j is kept iff no earlier kept box i has
 *   IoU(i, j) > thr, and with thr >= 0 only boxes whose intervals overlap
 *   with positive length in x and in y can do that. Kept boxes are
 *   registered in a uniform grid; a candidate checks the kept boxes in the
 *   cells it covers. The cell of a coordinate is monotone in it, so two
 *   overlapping boxes always share a cell. Boxes with x2 <= x1 or y2 <= y1
 *   overlap nothing: always kept, never registered.
 *
 * nms_iou_gt_T: IoU(i, j) > thr, computed as torchvision does: xx1 =
 *   std::max(ix1, x1[j]) is (ix1 < x1[j] ? x1[j] : ix1), std::min(ix2,
 *   x2[j]) is (x2[j] < ix2 ? x2[j] : ix2), w = std::max(0, xx2 - xx1). */
#define NMS_DEFINE(T, SUF)                                                    \
    static int nms_gather_##SUF(nms_work *w, const T *boxes)                  \
    {                                                                         \
        T *x1 = (T *)w->x1, *y1 = (T *)w->y1, *x2 = (T *)w->x2;               \
        T *y2 = (T *)w->y2, *area = (T *)w->area;                             \
        const int64_t *order = w->order;                                      \
        int64_t i, n = w->n;                                                  \
        int finite = 1;                                                       \
        for (i = 0; i < n; i++) {                                             \
            const T *b = boxes + 4 * order[i];                                \
            T a = b[0], c = b[1], d = b[2], e = b[3];                         \
            x1[i] = a;                                                        \
            y1[i] = c;                                                        \
            x2[i] = d;                                                        \
            y2[i] = e;                                                        \
            area[i] = (d - a) * (e - c);                                      \
            if (!(a - a == 0 && c - c == 0 && d - d == 0 && e - e == 0))      \
                finite = 0;                                                   \
        }                                                                     \
        return finite;                                                        \
    }                                                                         \
                                                                              \
    static int nms_iou_gt_##SUF(const nms_work *w, int64_t i, int64_t j)      \
    {                                                                         \
        const T *x1 = (const T *)w->x1, *y1 = (const T *)w->y1;               \
        const T *x2 = (const T *)w->x2, *y2 = (const T *)w->y2;               \
        const T *area = (const T *)w->area;                                   \
        const T zero = 0;                                                     \
        T xx1, yy1, xx2, yy2, ww, hh, inter, ovr;                             \
        xx1 = x1[i] < x1[j] ? x1[j] : x1[i];                                  \
        xx2 = x2[j] < x2[i] ? x2[j] : x2[i];                                  \
        ww = xx2 - xx1;                                                       \
        ww = zero < ww ? ww : zero;                                           \
        yy1 = y1[i] < y1[j] ? y1[j] : y1[i];                                  \
        yy2 = y2[j] < y2[i] ? y2[j] : y2[i];                                  \
        hh = yy2 - yy1;                                                       \
        hh = zero < hh ? hh : zero;                                           \
        inter = ww * hh;                                                      \
        ovr = inter / (area[i] + area[j] - inter);                            \
        return (double)ovr > w->thr;                                          \
    }                                                                         \
                                                                              \
    static int64_t nms_brute_##SUF(nms_work *w)                               \
    {                                                                         \
        const T *x1 = (const T *)w->x1, *y1 = (const T *)w->y1;               \
        const T *x2 = (const T *)w->x2, *y2 = (const T *)w->y2;               \
        const T *area = (const T *)w->area;                                   \
        unsigned char *sup = w->sup;                                          \
        int64_t i, j, nk = 0, n = w->n;                                       \
        double thr = w->thr;                                                  \
        const T zero = 0;                                                     \
        int fast = thr >= 0;                                                  \
        memset(sup, 0, (size_t)n);                                            \
        for (i = 0; i < n; i++) {                                             \
            T ix1, iy1, ix2, iy2, iarea;                                      \
            if (sup[i])                                                       \
                continue;                                                     \
            w->keep[nk++] = w->order[i];                                      \
            ix1 = x1[i];                                                      \
            iy1 = y1[i];                                                      \
            ix2 = x2[i];                                                      \
            iy2 = y2[i];                                                      \
            iarea = area[i];                                                  \
            for (j = i + 1; j < n; j++) {                                     \
                T xx1, yy1, xx2, yy2, ww, hh, inter, ovr;                     \
                if (sup[j])                                                   \
                    continue;                                                 \
                xx1 = ix1 < x1[j] ? x1[j] : ix1;                              \
                xx2 = x2[j] < ix2 ? x2[j] : ix2;                              \
                ww = xx2 - xx1;                                               \
                ww = zero < ww ? ww : zero;                                   \
                if (fast && ww == zero)                                       \
                    continue;                                                 \
                yy1 = iy1 < y1[j] ? y1[j] : iy1;                              \
                yy2 = y2[j] < iy2 ? y2[j] : iy2;                              \
                hh = yy2 - yy1;                                               \
                hh = zero < hh ? hh : zero;                                   \
                if (fast && hh == zero)                                       \
                    continue;                                                 \
                inter = ww * hh;                                              \
                ovr = inter / (iarea + area[j] - inter);                      \
                if ((double)ovr > thr)                                        \
                    sup[j] = 1;                                               \
            }                                                                 \
        }                                                                     \
        return nk;                                                            \
    }                                                                         \
                                                                              \
    /* Cell ranges of every box; returns the number of grid entries needed  \
     * (boxes covering at most NMS_CAP cells), or -1 when the extent is not \
     * representable (caller falls back to brute force). */                 \
    static int64_t nms_cells_##SUF(nms_work *w, int32_t *gx_out,              \
                                   int32_t *gy_out)                           \
    {                                                                         \
        const T *x1 = (const T *)w->x1, *y1 = (const T *)w->y1;               \
        const T *x2 = (const T *)w->x2, *y2 = (const T *)w->y2;               \
        int64_t i, n = w->n, nv = 0, entries = 0, cells;                      \
        double minx = 0, miny = 0, maxx = 0, maxy = 0, sw = 0, sh = 0;        \
        double rx, ry, gxd, gyd, invx, invy, maxcells;                        \
        int32_t gx, gy;                                                       \
        for (i = 0; i < n; i++) {                                             \
            double a = x1[i], b = y1[i], c = x2[i], d = y2[i];                \
            if (!(a < c && b < d))                                            \
                continue;                                                     \
            if (nv == 0) {                                                    \
                minx = a; maxx = c; miny = b; maxy = d;                       \
            } else {                                                          \
                if (a < minx) minx = a;                                       \
                if (c > maxx) maxx = c;                                       \
                if (b < miny) miny = b;                                       \
                if (d > maxy) maxy = d;                                       \
            }                                                                 \
            sw += c - a;                                                      \
            sh += d - b;                                                      \
            nv++;                                                             \
        }                                                                     \
        rx = maxx - minx;                                                     \
        ry = maxy - miny;                                                     \
        if (!(rx - rx == 0 && ry - ry == 0 && sw - sw == 0 && sh - sh == 0))  \
            return -1;                                                        \
        /* Cells about the mean box size, at most ~4 per box in all. */      \
        gxd = nv && sw > 0 ? rx / (sw / (double)nv) : 1;                      \
        gyd = nv && sh > 0 ? ry / (sh / (double)nv) : 1;                      \
        if (gxd < 1) gxd = 1;                                                 \
        if (gyd < 1) gyd = 1;                                                 \
        if (gxd > 4096) gxd = 4096;                                           \
        if (gyd > 4096) gyd = 4096;                                           \
        maxcells = 4.0 * (double)nv + 16;                                     \
        while (gxd * gyd > maxcells) {                                        \
            if (gxd >= gyd) gxd = gxd / 2 < 1 ? 1 : gxd / 2;                  \
            else gyd = gyd / 2 < 1 ? 1 : gyd / 2;                             \
        }                                                                     \
        gx = (int32_t)gxd;                                                    \
        gy = (int32_t)gyd;                                                    \
        invx = rx > 0 ? (double)gx / rx : 0;                                  \
        invy = ry > 0 ? (double)gy / ry : 0;                                  \
        if (!(invx - invx == 0)) { /* rx subnormal */                         \
            gx = 1;                                                           \
            invx = 0;                                                         \
        }                                                                     \
        if (!(invy - invy == 0)) {                                            \
            gy = 1;                                                           \
            invy = 0;                                                         \
        }                                                                     \
        for (i = 0; i < n; i++) {                                             \
            double a = x1[i], b = y1[i], c = x2[i], d = y2[i], t;             \
            int32_t c0, c1, r0, r1;                                           \
            if (!(a < c && b < d)) {                                          \
                w->cx0[i] = -1;                                               \
                continue;                                                     \
            }                                                                 \
            t = (a - minx) * invx; c0 = t < gx - 1 ? (int32_t)t : gx - 1;    \
            t = (c - minx) * invx; c1 = t < gx - 1 ? (int32_t)t : gx - 1;    \
            t = (b - miny) * invy; r0 = t < gy - 1 ? (int32_t)t : gy - 1;    \
            t = (d - miny) * invy; r1 = t < gy - 1 ? (int32_t)t : gy - 1;    \
            w->cx0[i] = c0; w->cx1[i] = c1;                                   \
            w->cy0[i] = r0; w->cy1[i] = r1;                                   \
            cells = (int64_t)(c1 - c0 + 1) * (r1 - r0 + 1);                  \
            if (cells <= NMS_CAP)                                             \
                entries += cells;                                             \
        }                                                                     \
        *gx_out = gx;                                                         \
        *gy_out = gy;                                                         \
        return entries;                                                       \
    }

NMS_DEFINE(float, f32)
NMS_DEFINE(double, f64)

typedef int (*nms_iou_fn)(const nms_work *, int64_t, int64_t);

/* Whether a kept box suppresses box j (non-empty): among kept[k0..k1) when
 * j covers more than NMS_CAP cells, else among big[b0..b1) and the grid
 * entries of j's cells with sorted position >= emin (each cell's list is
 * newest first, so the walk stops at the first older entry). */
static int nms_hit(const nms_work *w, int64_t j, int64_t k0, int64_t k1, int64_t b0, int64_t b1,
                   int64_t emin, int32_t gx, nms_iou_fn iou_gt)
{
    int32_t c0 = w->cx0[j], c1 = w->cx1[j], r0 = w->cy0[j], r1 = w->cy1[j], r, q, e;
    int64_t k;
    if ((int64_t)(c1 - c0 + 1) * (r1 - r0 + 1) > NMS_CAP) {
        for (k = k0; k < k1; k++)
            if (iou_gt(w, w->kept[k], j))
                return 1;
        return 0;
    }
    for (k = b0; k < b1; k++)
        if (iou_gt(w, w->big[k], j))
            return 1;
    for (r = r0; r <= r1; r++) {
        const int32_t *hrow = w->head + (int64_t)r * gx;
        for (q = c0; q <= c1; q++)
            for (e = hrow[q]; e >= 0 && w->ebox[e] >= emin; e = w->enext[e])
                if (iou_gt(w, w->ebox[e], j))
                    return 1;
    }
    return 0;
}

/* Keep box j (non-empty): the output, the kept list, the grid or the big
 * list. */
static void nms_register(nms_work *w, int64_t j, int32_t gx)
{
    int32_t c0 = w->cx0[j], c1 = w->cx1[j], r0 = w->cy0[j], r1 = w->cy1[j], r, q;
    w->keep[w->nk++] = w->order[j];
    w->kept[w->nkept++] = (int32_t)j;
    if ((int64_t)(c1 - c0 + 1) * (r1 - r0 + 1) > NMS_CAP) {
        w->big[w->nbig++] = (int32_t)j;
        return;
    }
    for (r = r0; r <= r1; r++) {
        int32_t *hrow = w->head + (int64_t)r * gx;
        for (q = c0; q <= c1; q++) {
            w->ebox[w->ne] = (int32_t)j;
            w->enext[w->ne] = hrow[q];
            hrow[q] = (int32_t)w->ne;
            w->ne++;
        }
    }
}

/* The blocked walk's shared state: phase 1 of a block tests its boxes, in
 * parallel, against the boxes kept before it (the grid is read only). */
typedef struct nms_par {
    nms_work *w;
    int32_t gx;
    nms_iou_fn iou_gt;
    int64_t j0, k1, b1;
    unsigned char *hit;
} nms_par;

static int nms_phase1_run(void *user, int64_t lo, int64_t hi)
{
    const nms_par *p = (const nms_par *)user;
    int64_t j;
    for (j = lo; j < hi; j++)
        p->hit[j - p->j0] = p->w->cx0[j] >= 0 &&
                            nms_hit(p->w, j, 0, p->k1, 0, p->b1, 0, p->gx, p->iou_gt);
    return 0;
}

/* The grid walk, shared by both types through the IoU test iou_gt. Box j is
 * kept iff no box kept before it suppresses it. With one thread, in order;
 * with more, by blocks of NMS_BLOCK boxes: phase 1 (parallel) checks each
 * box of the block against the boxes kept before the block, phase 2 (this
 * thread, in order) checks the survivors against the boxes kept in the
 * block so far. The same pairs decide, so the same boxes are kept.
 * Blocks are a quarter of the boxes, from 1024 to NMS_BLOCK: each costs a
 * wake-up of the pool, and the larger a block, the more boxes find their
 * suppressor only in phase 2 after a full phase 1. hit: NMS_BLOCK bytes.
 * Returns the number kept, or the status of a failed loop as a negative
 * number. */
#define NMS_BLOCK 4096
static int64_t nms_grid(opjit_ctx *ctx, nms_work *w, int32_t gx, int32_t gy, nms_iou_fn iou_gt,
                        unsigned char *hit)
{
    int64_t j, j0, c, n = w->n, bs = n / 4 < 1024 ? 1024 : n / 4 > NMS_BLOCK ? NMS_BLOCK : n / 4;
    int blocked = opjit_num_threads(ctx) > 1 && n >= 4096;
    nms_par p;
    for (c = 0; c < (int64_t)gx * gy; c++)
        w->head[c] = -1;
    w->nk = w->nkept = w->nbig = w->ne = 0;
    p.w = w;
    p.gx = gx;
    p.iou_gt = iou_gt;
    p.hit = hit;
    for (j0 = 0; j0 < n; j0 += bs) {
        int64_t j1 = n - j0 < bs ? n : j0 + bs;
        p.j0 = j0;
        p.k1 = w->nkept;
        p.b1 = w->nbig;
        if (blocked && !p.k1) { /* nothing kept yet: phase 1 finds nothing */
            memset(hit, 0, (size_t)(j1 - j0));
        } else if (blocked) {
            int rc = opjit_parallel_for(ctx, j0, j1, 64, nms_phase1_run, &p);
            if (rc)
                return -rc;
        }
        for (j = j0; j < j1; j++) {
            if (w->cx0[j] < 0) { /* empty box: overlaps nothing */
                w->keep[w->nk++] = w->order[j];
                continue;
            }
            if (blocked ? hit[j - j0] || nms_hit(w, j, p.k1, w->nkept, p.b1, w->nbig, j0, gx,
                                                 iou_gt)
                        : nms_hit(w, j, 0, w->nkept, 0, w->nbig, 0, gx, iou_gt))
                continue;
            nms_register(w, j, gx);
        }
    }
    return w->nk;
}

/* Round a byte count up to a multiple of 64. */
static size_t nms_align(size_t b) { return (b + 63) & ~(size_t)63; }

/* n float16 or bfloat16 values as float32 (every one exactly). */
static void nms_widen(int elem, const uint16_t *src, float *dst, int64_t n)
{
    int64_t i;
    if (elem == NMS_F16)
        for (i = 0; i < n; i++)
            dst[i] = opjit_f16_to_f32(src[i]);
    else
        for (i = 0; i < n; i++)
            dst[i] = opjit_bf16_to_f32(src[i]);
}

static int nms_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *boxes = opjit_arg_tensor(a, 0);
    DLTensor *scores = opjit_arg_tensor(a, 1);
    double thr = opjit_arg_float(a, 2);
    int is64, elem, finite;
    int64_t n, i, nk, shape[1];
    const void *bdata, *sdata;
    size_t esz, sz_key, sz_idx, sz_val, sz_i32;
    unsigned char *ws;
    uint64_t *key, *tkey;
    int64_t *order, *tidx;
    nms_work w;
    DLTensor *out;

    if ((i = nms_check(ctx, boxes, scores, &elem, &n)) != 0)
        return (int)i;
    is64 = elem == NMS_F64;
    if (n == 0) {
        shape[0] = 0;
        return opjit_output(ctx, 0, OPJIT_INT64, 1, shape) ? 0 : -1;
    }
    if (n > INT32_MAX)
        return opjit_fail(ctx, "too many boxes (%lld, at most %ld)",
                          (long long)n, (long)INT32_MAX);

    /* One region: keys x2, indices x3 (order, scratch, keep), five value
     * arrays, four int32 cell arrays, two int32 lists, the flags. */
    esz = is64 ? sizeof(double) : sizeof(float);
    sz_key = nms_align((size_t)n * sizeof(uint64_t));
    sz_idx = nms_align((size_t)n * sizeof(int64_t));
    sz_val = nms_align((size_t)n * esz);
    sz_i32 = nms_align((size_t)n * sizeof(int32_t));
    ws = (unsigned char *)opjit_workspace(
        ctx, 2 * sz_key + 3 * sz_idx + 5 * sz_val + 6 * sz_i32 + nms_align((size_t)n) +
                 (elem >= NMS_F16 ? nms_align((size_t)n * 5 * sizeof(float)) : 0));
    if (!ws)
        return opjit_fail(ctx, "out of memory for %lld boxes", (long long)n);
    bdata = opjit_data(boxes);
    sdata = opjit_data(scores);
    if (elem >= NMS_F16) { /* float16, bfloat16: widened to float32, exactly */
        float *wide = (float *)ws;
        nms_widen(elem, (const uint16_t *)bdata, wide, 4 * n);
        nms_widen(elem, (const uint16_t *)sdata, wide + 4 * n, n);
        bdata = wide;
        sdata = wide + 4 * n;
        ws += nms_align((size_t)n * 5 * sizeof(float));
    }
    key = (uint64_t *)ws; ws += sz_key;
    tkey = (uint64_t *)ws; ws += sz_key;
    order = (int64_t *)ws; ws += sz_idx;
    tidx = (int64_t *)ws; ws += sz_idx;
    memset(&w, 0, sizeof w);
    w.n = n;
    w.thr = thr;
    w.order = order;
    w.keep = (int64_t *)ws; ws += sz_idx;
    w.x1 = ws; ws += sz_val;
    w.y1 = ws; ws += sz_val;
    w.x2 = ws; ws += sz_val;
    w.y2 = ws; ws += sz_val;
    w.area = ws; ws += sz_val;
    w.cx0 = (int32_t *)ws; ws += sz_i32;
    w.cx1 = (int32_t *)ws; ws += sz_i32;
    w.cy0 = (int32_t *)ws; ws += sz_i32;
    w.cy1 = (int32_t *)ws; ws += sz_i32;
    w.kept = (int32_t *)ws; ws += sz_i32;
    w.big = (int32_t *)ws; ws += sz_i32;
    w.sup = ws;

    if (is64) {
        const double *s = (const double *)sdata;
        for (i = 0; i < n; i++) {
            key[i] = nms_key(s[i]);
            order[i] = i;
        }
    } else {
        const float *s = (const float *)sdata;
        for (i = 0; i < n; i++) {
            key[i] = nms_key((double)s[i]);
            order[i] = i;
        }
    }
    nms_sort(key, order, tkey, tidx, n);

    if (thr != thr) {
        /* Every IoU > NaN is false: nothing is suppressed. */
        memcpy(w.keep, order, (size_t)n * sizeof *w.keep);
        nk = n;
    } else {
        finite = is64 ? nms_gather_f64(&w, (const double *)bdata)
                      : nms_gather_f32(&w, (const float *)bdata);
        nk = -1;
        if (finite && thr >= 0 && n > 64) {
            int32_t gx = 1, gy = 1;
            int64_t entries = is64 ? nms_cells_f64(&w, &gx, &gy)
                                   : nms_cells_f32(&w, &gx, &gy);
            if (entries >= 0 && entries <= INT32_MAX) {
                size_t sz_head = nms_align((size_t)gx * (size_t)gy * sizeof(int32_t));
                size_t sz_ent = nms_align((size_t)entries * sizeof(int32_t));
                unsigned char *g = (unsigned char *)opjit_workspace(
                    ctx, sz_head + 2 * sz_ent + NMS_BLOCK + 64);
                if (g) {
                    w.head = (int32_t *)g;
                    w.enext = (int32_t *)(g + sz_head);
                    w.ebox = (int32_t *)(g + sz_head + sz_ent);
                    nk = nms_grid(ctx, &w, gx, gy, is64 ? nms_iou_gt_f64 : nms_iou_gt_f32,
                                  g + sz_head + 2 * sz_ent);
                    if (nk < 0)
                        return (int)-nk;
                }
            }
        }
        if (nk < 0)
            nk = is64 ? nms_brute_f64(&w) : nms_brute_f32(&w);
    }

    shape[0] = nk;
    out = opjit_output(ctx, 0, OPJIT_INT64, 1, shape);
    if (!out)
        return -1;
    memcpy(opjit_data(out), w.keep, (size_t)nk * sizeof *w.keep);
    return 0;
}

OPJIT_MODULE(m)
{
    opjit_def(m, "nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor",
              OPJIT_CPU, nms_cpu,
              "Non-maximum suppression (torchvision.ops.nms): indices of the kept "
              "boxes, by decreasing score");
    opjit_require(m, "boxes", "floating rank=2 contiguous");
    opjit_require(m, "scores", "floating rank=1 contiguous");
    nms_declare(m);
}
