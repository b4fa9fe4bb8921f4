/*
 * conv2d.c - 2-D convolution on the CPU, torch.nn.functional.conv2d
 * semantics for NCHW float32 and float64, and float16 and bfloat16 (and
 * their gradients): widened to float32, computed by the float32 path and
 * rounded once at the end (half_wide.h), as torch accumulates in float32.
 *
 *   conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1,
 *          int[2] padding=0, int[2] dilation=1, int groups=1) -> Tensor
 *
 *   conv2d.padding(..., str padding="valid", ...) -> Tensor
 *
 * input [N, C, H, W] (or unbatched [C, H, W], as PyTorch allows), weight
 * [O, C/groups, kH, kW], bias [O]; the output is [N, O, Ho, Wo] (or
 * [O, Ho, Wo]) with Ho = (H + 2*padH - dilH*(kH-1) - 1) / strideH + 1.
 *
 *   conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor? bias,
 *                   stride, padding, dilation, groups, int[3] output_mask=1)
 *       -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)
 *   conv2d_backward.padding(..., str padding="valid", ...)
 *
 * the gradients for the incoming gradient grad (the output's shape), each
 * [0] when its output_mask entry is 0 (grad_bias also when bias is None);
 * see "gradients" below for how.
 *
 * conv2d.padding takes F.conv2d's string padding: "valid" (none) or
 * "same" (stride 1 only; dil*(k-1) in all, the odd one at the bottom or
 * right, as torch pads). Operands may have any strides (channels_last,
 * views): those that are not row-major are copied into a dense block
 * first (strided.h), one pass against the convolution's many; except a
 * channels_last input of a 1x1 with fewer output than input channels in
 * the optimizing tier, read in place (the copy measured about half the
 * time of 1x1 256->64 @56 there; the output's transpose is a quarter).
 *
 * Method (Caffe's): for each image and group, unfold the input patches into
 * a [C/groups * kH * kW, Ho * Wo] column matrix in workspace memory
 * (im2col) and multiply by the group's weights [O/groups, C/groups*kH*kW]
 * with one GEMM straight into the output. A 1x1 kernel with stride 1 and
 * no padding needs no unfolding: the GEMM reads the input directly. The
 * bias is added afterwards. The GEMM is OpenBLAS's.
 *
 * float32 in the optimizing tier (gcc) built for x86-64-v4 (AVX-512) or
 * x86-64-v3 (AVX2 + FMA) has faster paths (see "the optimizing tier on
 * x86-64 with AVX-512 or AVX2" below). The level is the tier's -march, the
 * best this CPU has unless OPJIT_CPU_LEVEL caps it (avx2, portable: the
 * OpenBLAS path), and a field of the artifact's key; sgemm_avx512.h or
 * sgemm_avx2.h supplies the GEMM and the vector width, the code below is
 * the same for both:
 *  - 3x3, stride 1, dilation 1, one group (enough tiles): Winograd
 *    F(2x2, 3x3), 16 GEMMs over the transformed tiles of the whole batch,
 *    bias added in the output transform;
 *  - everything else: this file's GEMM instead of OpenBLAS's, and the
 *    im2col done in blocks of output positions that stay in L2.
 */
#include <opjit_op.h>
#include <limits.h>
#include <string.h>

#include "conv2d_common.h"
#include "conv2d_decl.h"
#include "op_blas.h"
#include "sgemm_avx2.h"
#include "sgemm_avx512.h"
#include "gemm_half.h"
#include "half_wide.h"
#include "strided.h"


/* Smallest q >= 0 with q * s >= num (s > 0). */
static int64_t conv_ceil_div(int64_t num, int64_t s)
{
    return num <= 0 ? 0 : (num + s - 1) / s;
}

/* The unit of work every path splits a convolution into: one image n,
 * one group gi, one block of output positions [p0, p0 + np) (p = oh * wo
 * + ow). Units are run by opjit_parallel_for; each writes its own part of
 * the output, so no two threads touch the same element. */
typedef struct conv_job {
    opjit_ctx *ctx;
    const conv_geom *g;
    const void *x, *w, *bias;
    void *y;
    int64_t kdim, plane, pb, nblk; /* position block size and blocks per plane */
    int direct;                    /* 1x1, stride 1, no padding: no im2col */
    char *ws;                      /* per-thread areas of `per` bytes */
    size_t per;
    const void *xend;              /* end of the input (vector loads stay before it) */
} conv_job;

/* For one scalar type T:
 *
 * conv_im2col_T: the unfolded input of one image and group for output
 *   positions [p0, p0 + np): col[(c * kh + ki) * kw + kj][p - p0], rows np
 *   apart. Each output row's run is zeros, a copy (strided when the stride
 *   is not 1) and zeros; the bounds of the valid run are computed once per
 *   kernel column, so nothing reads outside im.
 *
 * conv_blas_run_T: units [lo, hi) through OpenBLAS (one thread per call):
 *   im2col of the block into this thread's area, one GEMM into the output,
 *   the bias. The blocks are fixed by the shape, never by the thread count,
 *   so the GEMM calls and their rounding are the same for any count. */
#define CONV_DEFINE(T, SUF, GEMM)                                             \
    static void conv_im2col_##SUF(const conv_geom *g, const T *im, int64_t p0, \
                                  int64_t np, T *col)                         \
    {                                                                         \
        int64_t c, ki, kj, oh, ow;                                            \
        const int64_t H = g->h, W = g->w, wo = g->wo;                         \
        const int64_t sh = g->sh, sw = g->sw;                                 \
        const int64_t oh0 = p0 / wo, oh1 = (p0 + np - 1) / wo;                \
        for (c = 0; c < g->cg; c++) {                                         \
            const T *plane = im + c * H * W;                                  \
            for (ki = 0; ki < g->kh; ki++) {                                  \
                int64_t ih0 = ki * g->dh - g->ph; /* ih = oh*sh + ih0 */      \
                for (kj = 0; kj < g->kw; kj++, col += np) {                   \
                    int64_t iw0 = kj * g->dw - g->pw; /* iw = ow*sw + iw0 */  \
                    int64_t lo = conv_ceil_div(-iw0, sw);                     \
                    int64_t hi = conv_ceil_div(W - iw0, sw);                  \
                    if (hi > wo)                                              \
                        hi = wo;                                              \
                    if (lo > hi)                                              \
                        lo = hi;                                              \
                    for (oh = oh0; oh <= oh1; oh++) {                         \
                        int64_t owa = oh == oh0 ? p0 - oh * wo : 0;           \
                        int64_t owb = oh == oh1 ? p0 + np - oh * wo : wo;     \
                        int64_t ih = oh * sh + ih0;                           \
                        int64_t a = lo > owa ? lo : owa, b = hi < owb ? hi : owb; \
                        T *d = col + oh * wo - p0;                            \
                        const T *src;                                         \
                        if (ih < 0 || ih >= H || a >= b) {                    \
                            memset(d + owa, 0, (size_t)(owb - owa) * sizeof(T)); \
                            continue;                                         \
                        }                                                     \
                        if (a > owa)                                          \
                            memset(d + owa, 0, (size_t)(a - owa) * sizeof(T)); \
                        src = plane + ih * W + (a * sw + iw0);                \
                        if (sw == 1) {                                        \
                            memcpy(d + a, src, (size_t)(b - a) * sizeof(T));  \
                        } else {                                              \
                            for (ow = a; ow < b; ow++, src += sw)             \
                                d[ow] = *src;                                 \
                        }                                                     \
                        if (owb > b)                                          \
                            memset(d + b, 0, (size_t)(owb - b) * sizeof(T));  \
                    }                                                         \
                }                                                             \
            }                                                                 \
        }                                                                     \
    }                                                                         \
                                                                              \
    static int conv_blas_run_##SUF(void *user, int64_t lo, int64_t hi)        \
    {                                                                         \
        const conv_job *j = (const conv_job *)user;                           \
        const conv_geom *g = j->g;                                            \
        T *col = (T *)(void *)(j->ws + (size_t)opjit_thread_num(j->ctx) * j->per); \
        int64_t u;                                                            \
        for (u = lo; u < hi; u++) {                                           \
            int64_t blk = u % j->nblk, ng = u / j->nblk;                      \
            int64_t n = ng / g->groups, gi = ng % g->groups, o, e;            \
            int64_t p0 = blk * j->pb;                                         \
            int64_t np = j->plane - p0 < j->pb ? j->plane - p0 : j->pb;       \
            const T *im = (const T *)j->x + (n * g->c + gi * g->cg) * g->h * g->w; \
            const T *wg = (const T *)j->w + gi * g->og * j->kdim;             \
            T *og = (T *)j->y + (n * g->o + gi * g->og) * j->plane + p0;      \
            const T *b = im + p0;                                             \
            int64_t ldb = j->plane;                                           \
            if (!j->direct) {                                                 \
                conv_im2col_##SUF(g, im, p0, np, col);                        \
                b = col;                                                      \
                ldb = np;                                                     \
            }                                                                 \
            if (GEMM(j->ctx, CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g->og, \
                     (int)np, (int)j->kdim, 1, wg, (int)j->kdim, b, (int)ldb, 0, og, \
                     (int)j->plane))                                          \
                return -1;                                                    \
            if (j->bias)                                                      \
                for (o = 0; o < g->og; o++) {                                 \
                    T bv = ((const T *)j->bias)[gi * g->og + o];              \
                    T *r = og + o * j->plane;                                 \
                    for (e = 0; e < np; e++)                                  \
                        r[e] += bv;                                           \
                }                                                             \
        }                                                                     \
        return 0;                                                             \
    }

CONV_DEFINE(float, f32, op_sgemm)
CONV_DEFINE(double, f64, op_dgemm)

/* ---- the optimizing tier on x86-64 with AVX-512 or AVX2 ----------------------------
 *
 * sgemm_avx512.h's or sgemm_avx2.h's GEMM (the one the tier's -march
 * builds: x86-64-v4, or x86-64-v3), the Winograd transforms and a blocked
 * im2col, in vectors of SG_W floats. */
#ifdef SG_FAST

/* ---- Winograd F(2x2, 3x3) ------------------------------------------------------
 *
 * For a 3x3 kernel with stride 1, dilation 1 and one group, each 2x2 block
 * of outputs ("tile") is Y = A^T [ sum_c (G g_oc G^T) . (B^T d_c B) ] A,
 * d_c the 4x4 input patch of channel c: 16 products per tile and channel
 * pair instead of 36. The 16 element positions xi = 4*i + j of the
 * transformed tiles make 16 independent matrix products
 * M[xi] (O x T) = U[xi] (O x C) . V[xi] (C x T) over the T tiles of a chunk.
 * F(2x2, 3x3) keeps float32 rounding error within a few units of a direct
 * sum (larger tiles, F(4x4, 3x3), lose about a decimal digit). An infinite
 * input can turn all four outputs of the tiles that read it into NaN (the
 * transforms subtract), where a direct sum gives +-inf for some. */

#if SG_W == 16
/* U[xi][f] = (G g_f G^T)[xi] for the filters g_f = w[f], f = o * C + c,
 * G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1], 16 filters at a time:
 * filter f's 9 taps are the first lanes of a load at w + 9 f; a 16 x 16
 * transpose in registers makes vectors of one tap across the 16 filters,
 * which G then combines. The last block reads a zero-padded copy. */
SG_TGT static void conv_wino_weights(const float *w, int64_t nf, float *u, int64_t ups)
{
    float gt[16 * 9 + 16], tv[16];
    int64_t f0, xi;
    for (f0 = 0; f0 < nf; f0 += 16) {
        int64_t cnt = nf - f0 < 16 ? nf - f0 : 16;
        const float *g = w + f0 * 9;
        sg_v r[16];
        sg_v s[4][3], o[16];
        int b, i;
        if (f0 + 16 >= nf) { /* loads of the last filters would run past w */
            memset(gt, 0, sizeof gt);
            memcpy(gt, g, (size_t)(cnt * 9) * sizeof(float));
            g = gt;
        }
        for (i = 0; i < 16; i++)
            r[i] = SG_LD(g + 9 * i);
        sg_tr16(r);
        /* r[0] .. r[8]: taps 3a + b, a the row; s = G g, then (G g) G^T */
        for (b = 0; b < 3; b++) {
            sg_v e = r[b] + r[6 + b];
            s[0][b] = r[b];
            s[1][b] = 0.5f * (e + r[3 + b]);
            s[2][b] = 0.5f * (e - r[3 + b]);
            s[3][b] = r[6 + b];
        }
        for (i = 0; i < 4; i++) {
            sg_v e = s[i][0] + s[i][2];
            o[4 * i] = s[i][0];
            o[4 * i + 1] = 0.5f * (e + s[i][1]);
            o[4 * i + 2] = 0.5f * (e - s[i][1]);
            o[4 * i + 3] = s[i][2];
        }
        if (cnt == 16) {
            for (xi = 0; xi < 16; xi++)
                SG_ST(u + xi * ups + f0, o[xi]);
        } else {
            for (xi = 0; xi < 16; xi++) {
                SG_ST(tv, o[xi]);
                memcpy(u + xi * ups + f0, tv, (size_t)cnt * sizeof(float));
            }
        }
    }
}

#else
/* U[xi][f] = (G g_f G^T)[xi] as above, filter by filter (the 16 x 16
 * transpose needs 16 lanes; U is small against the products). */
SG_TGT static void conv_wino_weights(const float *w, int64_t nf, float *u, int64_t ups)
{
    int64_t f;
    for (f = 0; f < nf; f++) {
        const float *t = w + 9 * f;
        float s[4][3];
        int b, i;
        for (b = 0; b < 3; b++) {
            float e = t[b] + t[6 + b];
            s[0][b] = t[b];
            s[1][b] = 0.5f * (e + t[3 + b]);
            s[2][b] = 0.5f * (e - t[3 + b]);
            s[3][b] = t[6 + b];
        }
        for (i = 0; i < 4; i++) {
            float e = s[i][0] + s[i][2];
            u[(4 * i) * ups + f] = s[i][0];
            u[(4 * i + 1) * ups + f] = 0.5f * (e + s[i][1]);
            u[(4 * i + 2) * ups + f] = 0.5f * (e - s[i][1]);
            u[(4 * i + 3) * ups + f] = s[i][2];
        }
    }
}
#endif

/* A run of tiles of one tile row: image n, tile row ty, tile columns
 * tx0 .. tx0 + cnt - 1, at column pos of the chunk's matrices; its four
 * input rows are rows row .. row + 3 of the chunk's row buffer. */
typedef struct conv_seg {
    int64_t n, ty, tx0, cnt, pos, row;
} conv_seg;

/* Split tiles [p0, p0 + nt) of the batch (th x tw tiles an image) into
 * runs within tile rows, and list the input rows they read: rows[k] is the
 * offset of row k in the input, channel 0, or -1 for a padding row
 * (consecutive tile rows share two). Returns the number of runs. */
static int64_t conv_wino_segs(const conv_geom *g, int64_t p0, int64_t nt, int64_t th,
                              int64_t tw, conv_seg *s, int64_t *rows, int64_t *nrows)
{
    int64_t pos = 0, p = p0, ns = 0, nr = 0, i;
    while (pos < nt) {
        int64_t r = p % (th * tw), first = 0;
        conv_seg *q = &s[ns];
        q->n = p / (th * tw);
        q->ty = r / tw;
        q->tx0 = r % tw;
        q->cnt = tw - q->tx0 < nt - pos ? tw - q->tx0 : nt - pos;
        q->pos = pos;
        if (ns > 0 && s[ns - 1].n == q->n && s[ns - 1].ty + 1 == q->ty) {
            q->row = s[ns - 1].row + 2;
            first = 2;
        } else {
            q->row = nr;
        }
        for (i = first; i < 4; i++) {
            int64_t ih = 2 * q->ty - g->ph + i;
            rows[nr++] = ih >= 0 && ih < g->h ? (q->n * g->c * g->h + ih) * g->w : -1;
        }
        pos += q->cnt;
        p += q->cnt;
        ns++;
    }
    *nrows = nr;
    return ns;
}

/* V[xi][c][pos] = (B^T d B)[xi] for the chunk's tiles, with
 * B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], SG_W tiles at a time. Per
 * channel, the rows the runs read are copied into rb (wp floats a row,
 * input column 0 at rb column pw, the rest zeros from the start), so
 * padding and partial tiles read zeros. A run's last block may write up
 * to SG_W - 1 columns past the run: the next run overwrites them, and ldv
 * leaves room after the last. */
SG_TGT static void conv_wino_input(const conv_geom *g, const float *x, const conv_seg *segs,
                                        int64_t nseg, const int64_t *rows, int64_t nrows,
                                        float *v, int64_t ldv, int64_t cs, float *rb,
                                        int64_t wp)
{
    const sg_vi ev = SG_EVEN, od = SG_ODD;
    const int64_t H = g->h, W = g->w, C = g->c;
    const size_t wb = (size_t)W * sizeof(float);
    int64_t s, c, l, k;
    for (c = 0; c <= C; c++) {
        /* rows of channel c into buffer c % 2, then channel c - 1's tiles
         * from the other buffer: no load right behind the copy's stores */
        float *rc = rb + (c & 1) * nrows * wp, *rp = rb + ((c - 1) & 1) * nrows * wp;
        if (c < C) {
            const float *plane = x + c * H * W;
            const sg_v zv = {0};
            for (k = 0; k < nrows; k++) {
                float *d = rc + k * wp + g->pw;
                const float *src = plane + (rows[k] >= 0 ? rows[k] : 0);
                int64_t q;
                if (W < SG_W) {
                    if (rows[k] >= 0)
                        memcpy(d, src, wb);
                    else
                        memset(d, 0, wb);
                } else if (rows[k] >= 0) { /* the last vector overlaps */
                    for (q = 0; q + SG_W < W; q += SG_W)
                        SG_ST(d + q, SG_LD(src + q));
                    SG_ST(d + W - SG_W, SG_LD(src + W - SG_W));
                } else {
                    for (q = 0; q + SG_W < W; q += SG_W)
                        SG_ST(d + q, zv);
                    SG_ST(d + W - SG_W, zv);
                }
            }
        }
        if (c == 0)
            continue;
        for (s = 0; s < nseg; s++) {
            const conv_seg *sg = &segs[s];
            const float *r0 = rp + sg->row * wp + 2 * sg->tx0;
            float *vc = v + (c - 1) * ldv + sg->pos;
            int64_t nb = (sg->cnt + SG_W - 1) / SG_W;
            for (l = 0; l < nb; l++) {
                const float *r = r0 + 2 * SG_W * l;
                float *o = vc + SG_W * l;
                sg_v a0, a1, b0, b1, d0, d1, d2, d3;
                sg_v t00, t01, t02, t03, t10, t11, t12, t13;
                sg_v t20, t21, t22, t23, t30, t31, t32, t33;
#define CONV_IN_ROW(i)                                                        \
    a0 = SG_LD(r + (i) * wp);                                               \
    a1 = SG_LD(r + (i) * wp + SG_W);                                        \
    b0 = SG_LD(r + (i) * wp + 2);                                           \
    b1 = SG_LD(r + (i) * wp + SG_W + 2);                                    \
    d0 = __builtin_shuffle(a0, a1, ev);                                       \
    d1 = __builtin_shuffle(a0, a1, od);                                       \
    d2 = __builtin_shuffle(b0, b1, ev);                                       \
    d3 = __builtin_shuffle(b0, b1, od);                                       \
    t##i##0 = d0 - d2;                                                        \
    t##i##1 = d1 + d2;                                                        \
    t##i##2 = d2 - d1;                                                        \
    t##i##3 = d1 - d3;
                CONV_IN_ROW(0)
                CONV_IN_ROW(1)
                CONV_IN_ROW(2)
                CONV_IN_ROW(3)
#undef CONV_IN_ROW
#define CONV_IN_COL(j)                                                        \
    SG_ST(o + (j) * cs, t0##j - t2##j);                                     \
    SG_ST(o + (4 + j) * cs, t1##j + t2##j);                                 \
    SG_ST(o + (8 + j) * cs, t2##j - t1##j);                                 \
    SG_ST(o + (12 + j) * cs, t1##j - t3##j);
                CONV_IN_COL(0)
                CONV_IN_COL(1)
                CONV_IN_COL(2)
                CONV_IN_COL(3)
#undef CONV_IN_COL
            }
        }
    }
}

/* y = A^T M A (+ bias) for the chunk's tiles, A^T = [1 1 1 0; 0 1 -1 -1],
 * written to the output rows 2*ty and 2*ty + 1 (those inside it). */
SG_TGT static void conv_wino_output(const conv_geom *g, const float *m, int64_t ldm, int64_t xs,
                                         const conv_seg *segs, int64_t nseg, int64_t o0,
                                         int64_t oc, const float *bias, float *y)
{
    const sg_vi il = SG_ILO, ih = SG_IHI;
    const int64_t O = g->o, Ho = g->ho, Wo = g->wo;
    float tmp[32];
    int64_t o, s, l;
    for (o = o0; o < o0 + oc; o++) {
        const float *mo = m + (o - o0) * ldm;
        float bo = bias ? bias[o] : 0.0f;
        for (s = 0; s < nseg; s++) {
            const conv_seg *sg = &segs[s];
            int64_t nb = (sg->cnt + SG_W - 1) / SG_W, oy = 2 * sg->ty;
            float *y0 = y + ((sg->n * O + o) * Ho + oy) * Wo, *y1 = y0 + Wo;
            int two = oy + 1 < Ho;
            for (l = 0; l < nb; l++) {
                const float *mp = mo + sg->pos + SG_W * l;
                sg_v s00, s01, s02, s03, s10, s11, s12, s13, r00, r01, r10, r11, z0, z1;
                int64_t ox = 2 * (sg->tx0 + SG_W * l), nx = Wo - ox;
                int64_t lim = 2 * (sg->cnt - SG_W * l); /* columns of this block's tiles */
                if (nx > lim)
                    nx = lim;
#define CONV_OUT_COL(j)                                                       \
    {                                                                         \
        sg_v m0 = SG_LD(mp + (j) * xs), m1 = SG_LD(mp + (4 + j) * xs); \
        sg_v m2 = SG_LD(mp + (8 + j) * xs), m3 = SG_LD(mp + (12 + j) * xs); \
        s0##j = m0 + m1 + m2;                                                 \
        s1##j = m1 - m2 - m3;                                                 \
    }
                CONV_OUT_COL(0)
                CONV_OUT_COL(1)
                CONV_OUT_COL(2)
                CONV_OUT_COL(3)
#undef CONV_OUT_COL
                r00 = s00 + s01 + s02 + bo;
                r01 = s01 - s02 - s03 + bo;
                r10 = s10 + s11 + s12 + bo;
                r11 = s11 - s12 - s13 + bo;
                z0 = __builtin_shuffle(r00, r01, il);
                z1 = __builtin_shuffle(r00, r01, ih);
                if (nx >= 2 * SG_W) {
                    SG_ST(y0 + ox, z0);
                    SG_ST(y0 + ox + SG_W, z1);
                } else {
                    SG_ST(tmp, z0);
                    SG_ST(tmp + SG_W, z1);
                    memcpy(y0 + ox, tmp, (size_t)nx * sizeof(float));
                }
                if (!two)
                    continue;
                z0 = __builtin_shuffle(r10, r11, il);
                z1 = __builtin_shuffle(r10, r11, ih);
                if (nx >= 2 * SG_W) {
                    SG_ST(y1 + ox, z0);
                    SG_ST(y1 + ox + SG_W, z1);
                } else {
                    SG_ST(tmp, z0);
                    SG_ST(tmp + SG_W, z1);
                    memcpy(y1 + ox, tmp, (size_t)nx * sizeof(float));
                }
            }
        }
    }
}

/* Output channels a block: all of them when U (16 O C floats) is at most
 * 4 MB, transformed once; else blocks of 8k rows, each 4 MB or less of U,
 * transformed for each chunk of tiles right before its products. */
static int64_t conv_wino_oblock(const conv_geom *g)
{
    int64_t ob = ((int64_t)1 << 16) / g->c / 8 * 8;
    if (ob < 8)
        ob = 8;
    return ob < g->o ? ob : g->o;
}

/* Tiles per chunk, in multiples of 16, spread evenly over the chunks.
 * With U transformed once: V and M (16 (C + O) floats a tile) about 1.5 MB,
 * to stay in L2, but enough tiles that U's traffic, once a chunk, is at
 * most theirs (O C / (C + O)); with U in blocks, transformed once a chunk:
 * V up to 8 MB. At least 48 tiles (one GEMM panel), V and M at most 64 MB. */
static int64_t conv_wino_chunk(const conv_geom *g, int64_t tiles, int64_t ob)
{
    int64_t per_tile = 16 * 4 * (g->c + ob); /* bytes of V and M */
    int64_t t, tmax = ((int64_t)1 << 26) / per_tile, chunks;
    if (ob == g->o) {
        int64_t tu = g->o * g->c / (g->c + g->o);
        t = ((int64_t)3 << 19) / per_tile;
        if (t < tu)
            t = tu;
    } else {
        t = ((int64_t)1 << 23) / (16 * 4 * g->c);
    }
    if (t < 48)
        t = 48;
    if (t > tmax)
        t = tmax;
    if (t < 16)
        t = 16;
    chunks = (tiles + t - 1) / t;
    t = (tiles + chunks - 1) / chunks;
    return (t + 15) / 16 * 16;
}

/* One Winograd convolution: the geometry of its chunks of tiles and where
 * each thread's buffers are. */
typedef struct wino_job {
    opjit_ctx *ctx;
    const conv_geom *g;
    const float *x, *w, *bias;
    float *y;
    int64_t th, tw, tiles, ob, tc, ldv, ldm, wp, nseg_max, nrows_max, ups, vps, mps;
    const float *u; /* all filters, transformed once (ob == O); else per thread */
    char *ws;       /* per-thread areas of `per` bytes */
    size_t per, nu, nv, nm, nr;
} wino_job;

/* One thread's buffers, carved from its area. */
typedef struct wino_bufs {
    float *u, *v, *m, *rb, *scr;
    conv_seg *segs;
    int64_t *rows;
} wino_bufs;

static void conv_wino_carve(const wino_job *j, char *base, wino_bufs *b)
{
#define CONV_CARVE(ptr, type, n)                                              \
    ptr = (type *)base;                                                       \
    base += ((size_t)(n) * sizeof(type) + 63) / 64 * 64;
    CONV_CARVE(b->u, float, j->nu)
    CONV_CARVE(b->v, float, j->nv)
    CONV_CARVE(b->m, float, j->nm)
    CONV_CARVE(b->rb, float, j->nr)
    CONV_CARVE(b->segs, conv_seg, j->nseg_max)
    CONV_CARVE(b->rows, int64_t, j->nrows_max)
    b->scr = (float *)base;
#undef CONV_CARVE
}

/* Chunks [lo, hi) of tiles: transform the input, 16 products, transform
 * the output, for every block of output channels. */
static int conv_wino_run(void *user, int64_t lo, int64_t hi)
{
    const wino_job *j = user;
    const conv_geom *g = j->g;
    const int64_t C = g->c, O = g->o;
    wino_bufs b;
    int64_t c, o0, xi, nrows, nseg;
    conv_wino_carve(j, j->ws + (size_t)opjit_thread_num(j->ctx) * j->per, &b);
    for (c = lo; c < hi; c++) {
        int64_t p0 = c * j->tc, nt = j->tiles - p0 < j->tc ? j->tiles - p0 : j->tc;
        int64_t ntp = (nt + 15) / 16 * 16;
        nseg = conv_wino_segs(g, p0, nt, j->th, j->tw, b.segs, b.rows, &nrows);
        conv_wino_input(g, j->x, b.segs, nseg, b.rows, nrows, b.v, j->ldv, j->vps, b.rb, j->wp);
        if (ntp > nt) { /* finite values in the padding columns */
            int64_t r;
            for (r = 0; r < 16 * C; r++)
                memset(b.v + (r / C) * j->vps + (r % C) * j->ldv + nt, 0,
                       (size_t)(ntp - nt) * sizeof(float));
        }
        for (o0 = 0; o0 < O; o0 += j->ob) {
            int64_t oc = O - o0 < j->ob ? O - o0 : j->ob;
            const float *u = j->u;
            if (!u) {
                conv_wino_weights(j->w + o0 * C * 9, oc * C, b.u, j->ups);
                u = b.u;
            }
            for (xi = 0; xi < 16; xi++)
                sg_sgemm(oc, ntp, C, u + xi * j->ups, C, b.v + xi * j->vps, j->ldv,
                         b.m + xi * j->mps, j->ldm, b.scr);
            conv_wino_output(g, b.m, j->ldm, j->mps, b.segs, nseg, o0, oc, j->bias, j->y);
        }
    }
    return 0;
}

/* Filters [lo, hi) x 16 of U, for all output channels at once. */
static int conv_wino_weights_run(void *user, int64_t lo, int64_t hi)
{
    const wino_job *j = user;
    int64_t nf = j->g->o * j->g->c, f0 = lo * 16, f1 = hi * 16 < nf ? hi * 16 : nf;
    conv_wino_weights(j->w + f0 * 9, f1 - f0, (float *)j->u + f0, j->ups);
    return 0;
}

/* The whole convolution, float32, batch included, over the threads in
 * chunks of tiles (each output tile is computed the same way whatever the
 * chunk: the thread count leaves the bits alone). Returns 0, or the
 * status of opjit_fail. */
static int conv_wino_f32(opjit_ctx *ctx, const conv_geom *g, const float *x, const float *w,
                         const float *bias, float *y)
{
    const int64_t C = g->c, O = g->o, T = opjit_num_threads(ctx);
    wino_job j;
    size_t shared;
    int64_t tpar;
    char *base;
    int rc;
    j.ctx = ctx;
    j.g = g;
    j.x = x;
    j.w = w;
    j.bias = bias;
    j.y = y;
    j.th = (g->ho + 1) / 2;
    j.tw = (g->wo + 1) / 2;
    j.tiles = g->n * j.th * j.tw;
    j.ob = conv_wino_oblock(g);
    j.tc = conv_wino_chunk(g, j.tiles, j.ob);
    /* Enough chunks for every thread to get about three. */
    tpar = (j.tiles + 3 * T - 1) / (3 * T);
    tpar = (tpar + 15) / 16 * 16;
    if (T > 1 && tpar < j.tc)
        j.tc = tpar < 48 ? 48 : tpar;
    j.ldv = j.tc + 16;
    j.ldm = j.tc + 16;
    j.wp = (2 * j.tw + 48 + 15) / 16 * 16;
    /* runs a chunk: a partial tile row at each end, whole ones between */
    j.nseg_max = j.tc / j.tw + 2;
    j.nrows_max = 4 * j.nseg_max;
    /* Leading dimensions that are multiples of 1 KiB alias in the caches. */
    if (j.ldv % 256 == 0)
        j.ldv += 16;
    if (j.ldm % 256 == 0)
        j.ldm += 16;
    /* The 16 planes of U, V and M: 64 bytes more than their size apart, so
     * that the 16 streams a transform reads or writes use different sets. */
    j.ups = j.ob * C + 16;
    j.vps = C * j.ldv + 16;
    j.mps = j.ob * j.ldm + 16;
    shared = j.ob == O ? (size_t)(16 * j.ups) * sizeof(float) + 64 : 0;
    j.nu = j.ob == O ? 0 : (size_t)(16 * j.ups);
    j.nv = (size_t)(16 * j.vps);
    j.nm = (size_t)(16 * j.mps);
    j.nr = (size_t)(2 * j.nrows_max * j.wp);
    j.per = (j.nu + j.nv + j.nm + j.nr) * sizeof(float) + j.nseg_max * sizeof(conv_seg) +
            j.nrows_max * sizeof(int64_t) + 6 * 64 + sg_sgemm_scratch(C);
    j.per = (j.per + 63) / 64 * 64;
    base = (char *)opjit_workspace(ctx, shared + (size_t)T * j.per);
    if (!base)
        return opjit_fail(ctx, "out of memory for the Winograd workspace");
    j.u = NULL;
    j.ws = base + shared;
    for (int64_t t = 0; t < T; t++) { /* the row buffers' padding stays zero */
        wino_bufs b;
        conv_wino_carve(&j, j.ws + (size_t)t * j.per, &b);
        memset(b.rb, 0, j.nr * sizeof(float));
    }
    if (j.ob == O) {
        /* Chunks of 4096 filters: waking the pool for a loop (tens of
         * microseconds on a VM) costs more than transforming fewer. */
        j.u = (const float *)base;
        if ((rc = opjit_parallel_for(ctx, 0, (O * C + 15) / 16, 256, conv_wino_weights_run, &j)))
            return rc;
    }
    return opjit_parallel_for(ctx, 0, (j.tiles + j.tc - 1) / j.tc, 1, conv_wino_run, &j);
}

/* ---- im2col in blocks, for the GEMM above -------------------------------------- */

/* Columns of output positions a block: the block of the unfolded input
 * (kdim x pb floats) about 512 KB, to stay in L2; a multiple of 16, at
 * least 48. */
static int64_t conv_col_block(int64_t kdim, int64_t plane)
{
    int64_t pb = ((int64_t)1 << 17) / kdim / 16 * 16;
    if (pb < 48)
        pb = 48;
    if (pb > (plane + 15) / 16 * 16)
        pb = (plane + 15) / 16 * 16;
    return pb;
}

/* The block's leading dimension: 16 columns of slack, and not a multiple
 * of 1 KiB (those alias in the caches). */
static int64_t conv_col_ld(int64_t kdim, int64_t plane)
{
    int64_t ld = conv_col_block(kdim, plane) + 16;
    return ld % 256 == 0 ? ld + 16 : ld;
}

/* Floats of workspace conv_im2col_gemm_f32 needs. */
static size_t conv_col_floats(int64_t kdim, int64_t plane)
{
    return (size_t)(kdim * conv_col_ld(kdim, plane) + 16) +
           sg_sgemm_scratch(kdim) / sizeof(float);
}

/* The unfolded input for output positions p0 .. p0 + np - 1 (p = oh * wo
 * + ow): col[(c * kh + ki) * kw + kj][p - p0], rows ldc >= np + 16 apart.
 * Each output row's run is zeros, a copy (vector loads for strides 1 and
 * 2) and zeros, written left to right in whole vectors, so a vector that
 * runs past a run is overwritten by the next (or lands in the slack). A
 * copy that could read past the input tensor (xend) is done one by one. */
SG_TGT static void conv_im2col_blk(const conv_geom *g, const float *im, const float *xend,
                                        int64_t p0, int64_t np, float *col, int64_t ldc)
{
    const sg_vi ev = SG_EVEN;
    const sg_v zv = {0};
    const int64_t H = g->h, W = g->w, wo = g->wo, sh = g->sh, sw = g->sw;
    const int64_t oh0 = p0 / wo, oh1 = (p0 + np - 1) / wo;
    int64_t c, ki, kj, oh, q;
    float *row = col;
    for (c = 0; c < g->cg; c++) {
        const float *plane = im + c * H * W;
        for (ki = 0; ki < g->kh; ki++) {
            int64_t ih0 = ki * g->dh - g->ph;
            for (kj = 0; kj < g->kw; kj++, row += ldc) {
                int64_t iw0 = kj * g->dw - g->pw;
                int64_t lo = conv_ceil_div(-iw0, sw), hi = conv_ceil_div(W - iw0, sw);
                if (hi > wo)
                    hi = wo;
                if (lo > hi)
                    lo = hi;
                for (oh = oh0; oh <= oh1; oh++) {
                    int64_t owa = oh == oh0 ? p0 - oh * wo : 0;
                    int64_t owb = oh == oh1 ? p0 + np - oh * wo : wo;
                    int64_t ih = oh * sh + ih0, a = lo > owa ? lo : owa, b = hi < owb ? hi : owb;
                    float *d = row + oh * wo - p0;
                    const float *s;
                    if (ih < 0 || ih >= H || a >= b) {
                        for (q = owa; q < owb; q += SG_W)
                            SG_ST(d + q, zv);
                        continue;
                    }
                    for (q = owa; q < a; q += SG_W)
                        SG_ST(d + q, zv);
                    s = plane + ih * W + (a * sw + iw0); /* ow = a */
                    if (sw == 1 && s + (b - a) + SG_W <= xend) {
                        for (q = a; q < b; q += SG_W)
                            SG_ST(d + q, SG_LD(s + (q - a)));
                    } else if (sw == 2 && s + 2 * (b - a) + 2 * SG_W <= xend) {
                        for (q = a; q < b; q += SG_W)
                            SG_ST(d + q, __builtin_shuffle(SG_LD(s + 2 * (q - a)),
                                                             SG_LD(s + 2 * (q - a) + SG_W), ev));
                    } else {
                        for (q = a; q < b; q++)
                            d[q] = s[(q - a) * sw];
                    }
                    for (q = b; q < owb; q += SG_W)
                        SG_ST(d + q, zv);
                }
            }
        }
    }
}

/* The first output position of block b of j->nblk <= the plane's
 * 48-column panels of the GEMM (b = nblk: the plane): blocks of whole
 * panels, as many in each as can be (ceil or floor of panels / nblk), the
 * plane's last, partial panel in the last. Blocks of equal sizes in
 * multiples of 16 (256->64 @56, 2 threads: 8 x 400) leave a partial panel
 * in each, at half the speed of whole ones. */
static int64_t conv_fast_cols(const conv_job *j, int64_t b)
{
    int64_t pan = (j->plane + 47) / 48, c = (b * pan + j->nblk - 1) / j->nblk * 48;
    return c < j->plane ? c : j->plane;
}

/* Units [lo, hi) with this file's GEMM: the block unfolded into this
 * thread's area (conv_col_floats) unless direct, the product, the bias. */
static int conv_fast_run(void *user, int64_t lo, int64_t hi)
{
    const conv_job *j = user;
    const conv_geom *g = j->g;
    const int64_t kdim = j->kdim, plane = j->plane;
    float *ws = (float *)(void *)(j->ws + (size_t)opjit_thread_num(j->ctx) * j->per);
    const int64_t ldc = j->direct ? 0 : conv_col_ld(kdim, plane);
    float *scr = j->direct ? ws : ws + kdim * ldc + 16;
    int64_t u, o, e;
    for (u = lo; u < hi; u++) {
        int64_t blk = u % j->nblk, ng = u / j->nblk, n = ng / g->groups, gi = ng % g->groups;
        int64_t p0 = conv_fast_cols(j, blk), np = conv_fast_cols(j, blk + 1) - p0;
        const float *im = (const float *)j->x + (n * g->c + gi * g->cg) * g->h * g->w;
        const float *wg = (const float *)j->w + gi * g->og * kdim;
        float *og = (float *)j->y + (n * g->o + gi * g->og) * plane + p0;
        if (j->direct) {
            sg_sgemm(g->og, np, kdim, wg, kdim, im + p0, plane, og, plane, scr);
        } else {
            conv_im2col_blk(g, im, (const float *)j->xend, p0, np, ws, ldc);
            sg_sgemm(g->og, np, kdim, wg, kdim, ws, ldc, og, plane, scr);
        }
        if (j->bias)
            for (o = 0; o < g->og; o++) {
                float bv = ((const float *)j->bias)[gi * g->og + o], *r = og + o * plane;
                for (e = 0; e < np; e++)
                    r[e] += bv;
            }
    }
    return 0;
}
#endif /* SG_FAST */

/* Output positions a BLAS unit: its unfolded block (kdim x pb) about 512
 * KB, a multiple of 16, the blocks of a plane about equal. Fixed by the
 * shape: the GEMM calls, hence the rounding, do not depend on threads. */
static int64_t conv_blas_block(int64_t kdim, int64_t plane, size_t esz)
{
    int64_t pb = ((int64_t)1 << 19) / (int64_t)esz / kdim, nblk;
    if (pb < 64)
        pb = 64;
    nblk = (plane + pb - 1) / pb;
    pb = (plane + nblk - 1) / nblk;
    return (pb + 15) / 16 * 16;
}

/* Units a chunk: enough work (about 2 MFLOP) to repay handing it out. */
static int64_t conv_grain(const conv_job *j)
{
    int64_t flops = 2 * j->g->og * j->kdim * j->pb;
    int64_t grain = ((int64_t)1 << 21) / (flops > 0 ? flops : 1);
    return grain < 1 ? 1 : grain;
}

/* The unit geometry and per-thread areas of the GEMM paths, then the
 * loop. fast: this file's GEMM (float32, AVX-512 or AVX2), else OpenBLAS. */
static int conv_gemm_paths(opjit_ctx *ctx, const conv_geom *g, const void *x, const void *w,
                           const void *bias, void *out, int fast)
{
    conv_job j;
    size_t esz = g->is64 ? sizeof(double) : sizeof(float);
    int64_t T = opjit_num_threads(ctx);
    j.ctx = ctx;
    j.g = g;
    j.x = x;
    j.w = w;
    j.bias = bias;
    j.y = out;
    j.kdim = g->cg * g->kh * g->kw;
    j.plane = g->ho * g->wo;
    j.direct = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 &&
               g->pw == 0 && g->ph2 == 0 && g->pw2 == 0;
    j.xend = (const char *)j.x + (size_t)(g->n * g->c * g->h * g->w) * esz;
    j.pb = conv_blas_block(j.kdim, j.plane, esz);
    j.per = j.direct ? 0 : (size_t)(j.kdim * j.pb) * esz;
#ifdef SG_FAST
    if (fast) {
        /* Blocks of whole 48-column panels (conv_fast_cols), at most
         * conv_col_block columns, at least three per thread where the plane
         * allows: this GEMM's bits do not depend on the blocks. */
        int64_t most = conv_col_block(j.kdim, j.plane) / 48, ni = g->n * g->groups;
        int64_t pan = (j.plane + 47) / 48, nblk;
        most = most > 1 ? most : 1; /* conv_col_block < 48: it holds the plane */
        nblk = (pan + most - 1) / most;
        if (ni * nblk < 3 * T)
            nblk = (3 * T + ni - 1) / ni;
        while (T > 1 && ni * nblk < 8 * T && (ni * nblk) % T) /* as many units a thread */
            nblk++;
        j.nblk = nblk < pan ? nblk : pan;
        j.pb = (pan + j.nblk - 1) / j.nblk * 48; /* the largest */
        j.per = j.direct ? sg_sgemm_scratch(j.kdim)
                         : conv_col_floats(j.kdim, j.plane) * sizeof(float);
    }
#else
    (void)fast;
#endif
    if (!fast)
        j.nblk = (j.plane + j.pb - 1) / j.pb;
    j.per = (j.per + 63) / 64 * 64;
    j.ws = NULL;
    if (j.per && !(j.ws = (char *)opjit_workspace(ctx, (size_t)T * j.per)))
        return opjit_fail(ctx, "out of memory for %lld im2col buffers of %lldx%lld",
                          (long long)T, (long long)j.kdim, (long long)j.pb);
#ifdef SG_FAST
    if (fast)
        return opjit_parallel_for(ctx, 0, g->n * g->groups * j.nblk, conv_grain(&j),
                                  conv_fast_run, &j);
#endif
    return opjit_parallel_for(ctx, 0, g->n * g->groups * j.nblk, conv_grain(&j),
                              g->is64 ? conv_blas_run_f64 : conv_blas_run_f32, &j);
}

/* Sizes every path can index with int (BLAS): 1, else 0. */
static int conv_sizes_int(const conv_geom *g)
{
    int64_t kdim = g->cg * g->kh * g->kw, plane = g->ho * g->wo;
    return plane <= INT_MAX && kdim <= INT_MAX && g->og <= INT_MAX && g->cg <= INT_MAX &&
           g->h * g->w <= INT_MAX;
}

/* An im2col buffer that fits: 1, else 0. */
static int conv_sizes_im2col(const conv_geom *g)
{
    int64_t kdim = g->cg * g->kh * g->kw, plane = g->ho * g->wo;
    return (uint64_t)kdim * (uint64_t)plane <= ((uint64_t)1 << 60) / 8;
}

/* Both of the above, without a message: 1, else 0 (a probe that has a
 * fallback). */
static int conv_sizes_fit(const conv_geom *g) { return conv_sizes_int(g) && conv_sizes_im2col(g); }

/* Both of the above: 0, or the status of opjit_fail. */
static int conv_sizes_ok(opjit_ctx *ctx, const conv_geom *g)
{
    if (!conv_sizes_int(g))
        return opjit_fail(ctx, "sizes too large for BLAS (output plane %lld, patch size %lld)",
                          (long long)(g->ho * g->wo), (long long)(g->cg * g->kh * g->kw));
    if (!conv_sizes_im2col(g))
        return opjit_fail(ctx, "im2col buffer too large");
    return 0;
}

/* No input channels: every output element is its channel's bias, or 0. */
static void conv_fill_bias(const conv_geom *g, const void *bias, void *out)
{
    int64_t plane = g->ho * g->wo, i, e;
    memset(out, 0, (size_t)(g->n * g->o * plane) * (g->is64 ? sizeof(double) : sizeof(float)));
    for (i = 0; bias && i < g->n * g->o; i++)
        for (e = 0; e < plane; e++) {
            if (g->is64)
                ((double *)out)[i * plane + e] = ((const double *)bias)[i % g->o];
            else
                ((float *)out)[i * plane + e] = ((const float *)bias)[i % g->o];
        }
}

/* out [N, O, Ho, Wo] = conv(x, w) + bias over g; x, w and bias dense
 * (bias may be NULL). 0, or the status of opjit_fail. */
static int conv_forward(opjit_ctx *ctx, const conv_geom *g, const void *x, const void *w,
                        const void *bias, void *out)
{
    int fast = 0;
    if (g->n == 0 || g->ho * g->wo == 0)
        return 0;
    if (g->cg == 0) {
        conv_fill_bias(g, bias, out);
        return 0;
    }
#ifdef SG_FAST
    fast = !g->is64 && sg_fast_ok();
    /* Winograd for 3x3, stride 1, dilation 1, one group, with enough tiles
     * (2x2 outputs) to repay transforming the weights; channels bounded so
     * the workspace stays within about 64 MB a thread. */
    if (fast && !g->no_winograd && g->kh == 3 && g->kw == 3 && g->sh == 1 && g->sw == 1 &&
        g->dh == 1 && g->dw == 1 && g->groups == 1 && g->c <= 4096 &&
        g->o * g->c <= ((int64_t)1 << 20) && g->n * ((g->ho + 1) / 2) * ((g->wo + 1) / 2) >= 32)
        return conv_wino_f32(ctx, g, (const float *)x, (const float *)w, (const float *)bias,
                             (float *)out);
#endif
    return conv_gemm_paths(ctx, g, x, w, bias, out, fast);
}

/* The output of a convolution over g: [N, O, Ho, Wo], or [O, Ho, Wo]
 * unbatched, its data into *data. 0, or -1 with the error recorded. */
static int conv_output(opjit_ctx *ctx, const conv_geom *g, DLDataType dt, void **data)
{
    int64_t shape[4] = {g->n, g->o, g->ho, g->wo};
    DLTensor *out = g->batched ? opjit_output(ctx, 0, dt, 4, shape)
                               : opjit_output(ctx, 0, dt, 3, shape + 1);
    *data = out ? opjit_data(out) : NULL;
    return out ? 0 : -1;
}

#ifdef SG_FAST
/* A 1x1 convolution (stride 1, no padding, one group) of a channels_last
 * input with fewer output than input channels, read in place: per image,
 * out^T [P, O] = x [P, C] (NHWC rows) times W^T [C, O], then out^T
 * transposed into the NCHW output, a pass over the output where copying
 * the input would be one over the larger input. Units of (image, block of
 * positions); each element is one chain of fused multiply-adds over C, as
 * on the dense path. */
typedef struct nhwc_job {
    opjit_ctx *ctx;
    const conv_geom *g;
    const float *x, *wt, *bias;
    float *y;
    int64_t pb, nblk;
    char *ws;
    size_t per;
} nhwc_job;

static int conv_nhwc_run(void *user, int64_t lo, int64_t hi)
{
    const nhwc_job *j = (const nhwc_job *)user;
    const conv_geom *g = j->g;
    const int64_t P = g->ho * g->wo, C = g->c, O = g->o;
    float *tmp = (float *)(void *)(j->ws + (size_t)opjit_thread_num(j->ctx) * j->per);
    float *scr = tmp + j->pb * O + 16;
    int64_t u, o, e;
    for (u = lo; u < hi; u++) {
        int64_t n = u / j->nblk, p0 = u % j->nblk * j->pb, np = P - p0 < j->pb ? P - p0 : j->pb;
        float *yn = j->y + n * O * P + p0;
        sg_sgemm(np, O, C, j->x + (n * P + p0) * C, C, j->wt, O, tmp, O, scr);
        sg_transpose(tmp, O, np, O, yn, P);
        for (o = 0; j->bias && o < O; o++)
            for (e = 0; e < np; e++)
                yn[o * P + e] += j->bias[o];
    }
    return 0;
}

/* Whether input is [N, C, H, W] stored channels_last (NHWC). */
static int conv_is_nhwc(const DLTensor *t)
{
    const int64_t *s = t->strides, *d = t->shape;
    return t->ndim == 4 && s && d[1] > 1 && s[1] == 1 && s[3] == d[1] && s[2] == d[3] * d[1] &&
           (d[0] == 1 || s[0] == d[2] * d[3] * d[1]);
}

/* The channels_last 1x1 above when it applies and pays (O < C): 1 when it
 * ran (*rc its status), else 0. */
static int conv_nhwc_pointwise(opjit_ctx *ctx, const conv_geom *g, const DLTensor *input,
                               const void *w, const void *bias, void *out, int *rc)
{
    nhwc_job j;
    int64_t P = g->ho * g->wo, T;
    float *wt;
    if (g->is64 || !sg_fast_ok() || g->groups != 1 || g->o >= g->c || g->n == 0 ||
        !conv_is_nhwc(input) || g->kh != 1 || g->kw != 1 || g->sh != 1 || g->sw != 1 ||
        g->ph || g->pw || g->ph2 || g->pw2)
        return 0;
    T = opjit_num_threads(ctx);
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.g = g;
    j.x = (const float *)opjit_data(input);
    j.bias = (const float *)bias;
    j.y = (float *)out;
    j.pb = (P + 3 * T - 1) / (3 * T) < 256 ? 256 : 512; /* rows of out^T a unit */
    j.nblk = (P + j.pb - 1) / j.pb;
    j.per = ((size_t)(j.pb * g->o + 16) * sizeof(float) + sg_sgemm_scratch(g->c) + 63) / 64 * 64;
    wt = (float *)opjit_workspace(ctx, (size_t)(g->c * g->o) * sizeof(float));
    j.ws = (char *)opjit_workspace(ctx, (size_t)T * j.per);
    if (!wt || !j.ws) {
        *rc = opjit_fail(ctx, "out of memory for the channels_last workspace");
        return 1;
    }
    sg_transpose((const float *)w, g->c, g->o, g->c, wt, g->o); /* W^T [C, O] */
    j.wt = wt;
    *rc = opjit_parallel_for(ctx, 0, g->n * j.nblk, 1, conv_nhwc_run, &j);
    return 1;
}
#endif

#ifdef HG_BF16
/* conv_im2col_blk as gemm_half.h calls it. */
static void conv_hg_unfold(const void *g, const float *im, const float *xend, int64_t p0,
                           int64_t np, float *col, int64_t ldc)
{
    conv_im2col_blk((const conv_geom *)g, im, xend, p0, np, col, ldc);
}

/* The bfloat16 forward on gemm_half.h's GEMM where the CPU has
 * AVX512_BF16 (on AMX tiles where it has those), unless an operand holds
 * a subnormal (OPJIT_HALF_KERNEL=dot or amx: regardless): 1 when it ran
 * (*rc its status), 0 to widen instead. */
static int conv_forward_bf16(opjit_ctx *ctx, const conv_geom *g, const void *x, const void *w,
                             const void *b, void *out, int *rc)
{
    hg_conv s;
    float *xw = NULL, *bw = NULL;
    int path = hw_path(ctx, HW_BF16, HG_HAVE()), sub = 0;
    if ((path & HW_SCAN) && g->n && g->ho * g->wo && g->cg &&
        ((sub = hg_subnormal(ctx, x, g->n * g->c, g->h * g->w, g->h * g->w)) == 0))
        sub = hg_subnormal(ctx, w, g->o, g->cg * g->kh * g->kw, g->cg * g->kh * g->kw);
    if (path <= 0 || sub || g->n == 0 || g->ho * g->wo == 0 || g->cg == 0) {
        *rc = path < 0 || sub < 0 ? -1 : 0;
        return path < 0 || sub < 0;
    }
    s.n = g->n;
    s.groups = g->groups;
    s.og = g->og;
    s.kdim = g->cg * g->kh * g->kw;
    s.plane = g->ho * g->wo;
    s.in_image = g->c * g->h * g->w;
    s.in_group = g->cg * g->h * g->w;
    s.direct = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 &&
               g->pw == 0 && g->ph2 == 0 && g->pw2 == 0;
    s.h = g->h;
    s.w = g->w;
    s.kh = g->kh;
    s.kw = g->kw;
    s.sh = g->sh;
    s.sw = g->sw;
    s.dh = g->dh;
    s.dw = g->dw;
    s.ph = g->ph;
    s.pw = g->pw;
    s.wo = g->wo;
    s.unfold = conv_hg_unfold;
    s.geom = g;
    if ((!s.direct && s.sw != 1 && !(xw = hw_widen(ctx, HW_BF16, x, g->n * s.in_image))) ||
        (b && !(bw = hw_widen(ctx, HW_BF16, b, g->o))))
        *rc = -1;
    else
        *rc = hg_conv_bf16(ctx, &s, x, xw, w, bw, out, !!(path & HW_AMX));
    return 1;
}
#endif

/* The forward in float16 or bfloat16 (kind): x, w and b (or NULL) dense
 * 16-bit, widened to float32; the float32 convolution, rounded once into
 * out (bfloat16 on an AVX512_BF16 CPU: conv_forward_bf16). 0, or the
 * status of the failure. */
static int conv_forward_half(opjit_ctx *ctx, const conv_geom *g, int kind, const void *x,
                             const void *w, const void *b, void *out)
{
    int64_t nout = g->n * g->o * g->ho * g->wo;
    float *xw, *ww, *bw = NULL, *o;
    conv_geom g2;
    int rc;
#ifdef HG_BF16
    if (kind == HW_BF16 && conv_forward_bf16(ctx, g, x, w, b, out, &rc))
        return rc;
#endif
    if (hw_path(ctx, kind, HG_HAVE()) < 0) /* a bad $OPJIT_HALF_KERNEL */
        return -1;
    if (!(xw = hw_widen(ctx, kind, x, g->n * g->c * g->h * g->w)) ||
        !(ww = hw_widen(ctx, kind, w, g->o * g->cg * g->kh * g->kw)) ||
        (b && !(bw = hw_widen(ctx, kind, b, g->o))) || !(o = hw_scratch(ctx, nout)))
        return -1;
    /* Not Winograd: its transforms mix a tile's magnitudes, and with large
     * and small values together its error is far above the direct sum's
     * (torch's, oneDNN's direct kernels'). */
    g2 = *g;
    g2.no_winograd = 1;
    if ((rc = conv_forward(ctx, &g2, xw, ww, bw, o)) != 0)
        return rc;
    return hw_narrow(ctx, kind, o, out, nout);
}

/* conv2d and conv2d.padding (str_padding): the checks, dense copies of
 * strided operands (strided.h), the output, the convolution. */
static int conv2d_run(opjit_ctx *ctx, opjit_args *a, int str_padding)
{
    DLTensor *input = opjit_arg_tensor(a, 0);
    DLTensor *weight = opjit_arg_tensor(a, 1);
    DLTensor *bias = opjit_arg_tensor(a, 2);
    const void *x, *w, *b = NULL;
    conv_args p;
    conv_geom g;
    void *out;
    int rc;

    if ((rc = conv_read_args(ctx, a, 3, str_padding, &p)) != 0 ||
        (rc = conv_check(ctx, input, weight, bias, &p, &g)) != 0 ||
        (rc = conv_sizes_ok(ctx, &g)) != 0)
        return rc;
    if (st_dense(ctx, weight, &w) || (bias && st_dense(ctx, bias, &b)))
        return -1;
    if (conv_output(ctx, &g, input->dtype, &out))
        return -1;
    if (hw_kind(input->dtype)) {
        if (st_dense(ctx, input, &x))
            return -1;
        return conv_forward_half(ctx, &g, hw_kind(input->dtype), x, w, bias ? b : NULL, out);
    }
#ifdef SG_FAST
    if (conv_nhwc_pointwise(ctx, &g, input, w, b, out, &rc))
        return rc;
#endif
    if (st_dense(ctx, input, &x))
        return -1;
    return conv_forward(ctx, &g, x, w, b, out);
}

static int conv2d_cpu(opjit_ctx *ctx, opjit_args *a) { return conv2d_run(ctx, a, 0); }
static int conv2d_padding_cpu(opjit_ctx *ctx, opjit_args *a) { return conv2d_run(ctx, a, 1); }

/* ==== gradients ====================================================================
 *
 * conv2d_backward(grad, input, weight, bias, stride, padding, dilation,
 * groups, output_mask) -> (grad_input, grad_weight, grad_bias), each
 * computed on its own, every unit of work fixed by the shape (so the bits
 * do not depend on the thread count):
 *
 *  - grad_bias [O]: per output channel, the sum of grad over images and
 *    positions, in double (eight running sums, then their tree).
 *  - grad_input: with stride 1 (and padding at most dil * (k - 1)), the
 *    transposed convolution is a convolution of grad with the weights
 *    flipped and their two channel dimensions swapped, padded
 *    dil * (k - 1) - padding: the forward paths above serve it (Winograd
 *    for 3x3, the direct GEMM for 1x1, im2col otherwise). Else, per image
 *    and group, cols [C/g * kH * kW, Ho * Wo] = W_g^T grad_g (GEMM, in
 *    blocks of positions), then col2im per input channel (each channel's
 *    plane sums its kH * kW rows in a fixed order). A 1x1 (stride 1, no
 *    padding) reads W transposed in place, in units of images, blocks of
 *    positions and, on small images, blocks of input channels; a long
 *    reduction in steps of 128; an output over 8 MB by tiles streamed out.
 *    On a batch of small images the batch is folded into one image (grad
 *    folded once when both gradients are wanted).
 *  - grad_weight: per group, grad_g [O/g, N Ho Wo] times im2col(input)^T,
 *    a product whose long dimension is the reduction. Units: slices of
 *    that dimension (whole blocks of positions of one image) x blocks of
 *    columns (whole input channels) x blocks of rows; each unit walks its
 *    blocks of positions, unfolds its channels, and accumulates one GEMM
 *    per block into its own part of grad_weight (or, with several slices,
 *    of that slice's copy, summed in slice order at the end). In the
 *    optimizing tier the unfolded block is transposed in registers and
 *    sgemm_core.h's GEMM continues each element's chain of fused
 *    multiply-adds from the last block (with few output channels, the
 *    unfolded block times grad^T, transposed once a call, makes
 *    grad_weight^T: no block transposed); elsewhere OpenBLAS's gemm with
 *    beta = 1 on calls of shapes the slicing alone fixes.
 *
 * bfloat16 (conv_backward_half), where gemm_half.h's GEMMs run: grad_input
 * of a stride-1 convolution as the transposed convolution above, on the
 * forward's 16-bit GEMM (conv_forward_bf16) straight from the 16-bit
 * gradient; grad_weight of one group on gemm_half.h's grad_weight
 * kernels; grad_bias from the 16-bit gradient. What they do not take is
 * widened to float32, computed as above and rounded once. */

/* ---- grad_bias ------------------------------------------------------------------ */

typedef struct gb_job {
    const conv_geom *g;
    const void *dy;
    void *db;
    int half; /* dy float16 or bfloat16 (HW_F16, HW_BF16), db float32; 0: g's dtype */
} gb_job;

/* The sum of n values at r into s[0..7] (s[p & 7] += r[p]). */
#define CONV_GB_SUM(T, GET)                                                            \
    {                                                                                  \
        const T *r = (const T *)j->dy + base;                                          \
        for (p = 0; p + 8 <= plane; p += 8) {                                          \
            s[0] += GET(r[p]); s[1] += GET(r[p + 1]); s[2] += GET(r[p + 2]);           \
            s[3] += GET(r[p + 3]); s[4] += GET(r[p + 4]); s[5] += GET(r[p + 5]);       \
            s[6] += GET(r[p + 6]); s[7] += GET(r[p + 7]);                              \
        }                                                                              \
        for (; p < plane; p++)                                                         \
            s[p & 7] += GET(r[p]);                                                     \
    }
#define CONV_GB_AS_IS(v) (v)

/* Output channels [lo, hi). A 16-bit grad is read as its float32 values:
 * the bits of the float32 sum of the widened grad. */
static int conv_gb_run(void *user, int64_t lo, int64_t hi)
{
    const gb_job *j = (const gb_job *)user;
    const conv_geom *g = j->g;
    const int64_t plane = g->ho * g->wo;
    int64_t o, n, p;
    for (o = lo; o < hi; o++) {
        double s[8] = {0, 0, 0, 0, 0, 0, 0, 0}, t;
        for (n = 0; n < g->n; n++) {
            int64_t base = (n * g->o + o) * plane;
            if (j->half == HW_BF16)
                CONV_GB_SUM(uint16_t, opjit_bf16_to_f32)
            else if (j->half == HW_F16)
                CONV_GB_SUM(uint16_t, opjit_f16_to_f32)
            else if (g->is64)
                CONV_GB_SUM(double, CONV_GB_AS_IS)
            else
                CONV_GB_SUM(float, CONV_GB_AS_IS)
        }
        t = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
        if (g->is64 && !j->half)
            ((double *)j->db)[o] = t;
        else
            ((float *)j->db)[o] = (float)t;
    }
    return 0;
}

/* grad_bias into db (g's dtype; float32 for a 16-bit grad of kind half). */
static int conv_grad_bias_of(opjit_ctx *ctx, const conv_geom *g, int half, const void *dy,
                             void *db)
{
    gb_job j;
    int64_t grain = ((int64_t)1 << 16) / (g->n * g->ho * g->wo + 1);
    j.g = g;
    j.dy = dy;
    j.db = db;
    j.half = half;
    return opjit_parallel_for(ctx, 0, g->o, grain < 1 ? 1 : grain, conv_gb_run, &j);
}

static int conv_grad_bias(opjit_ctx *ctx, const conv_geom *g, const void *dy, void *db)
{
    return conv_grad_bias_of(ctx, g, 0, dy, db);
}

/* ---- grad_input -------------------------------------------------------------------- */

/* The geometry of the transposed convolution that gives grad_input when
 * the stride is 1: grad [N, O, Ho, Wo] convolved with the flipped weights
 * [C, O/g, kH, kW]. 0 when it does not apply (a stride, or a padding
 * above dil * (k - 1)). */
static int conv_transposed_geom(const conv_geom *g, conv_geom *t)
{
    int64_t eh = g->dh * (g->kh - 1), ew = g->dw * (g->kw - 1);
    if (g->sh != 1 || g->sw != 1 || g->ph > eh || g->ph2 > eh || g->pw > ew || g->pw2 > ew)
        return 0;
    *t = *g;
    t->c = g->o;
    t->h = g->ho;
    t->w = g->wo;
    t->o = g->c;
    t->ph = eh - g->ph;
    t->ph2 = eh - g->ph2;
    t->pw = ew - g->pw;
    t->pw2 = ew - g->pw2;
    t->ho = g->h;
    t->wo = g->w;
    t->cg = g->og;
    t->og = g->cg;
    return 1;
}

/* wt[gi*cg + c][o][ki][kj] = w[gi*og + o][c][kh-1-ki][kw-1-kj]: the
 * weights of the transposed convolution. (o, c) in tiles of 16 x 16: for
 * a 1x1 kernel this is a transpose, which element by element would touch
 * a page per write. */
#define CONV_FLIP(T, SUF)                                                                \
    static void conv_flip_##SUF(const conv_geom *g, const T *w, T *wt)                   \
    {                                                                                    \
        const int64_t khw = g->kh * g->kw, og = g->og, cg = g->cg;                       \
        int64_t gi, o0, c0, o, c, k;                                                     \
        for (gi = 0; gi < g->groups; gi++)                                               \
            for (o0 = 0; o0 < og; o0 += 16)                                              \
                for (c0 = 0; c0 < cg; c0 += 16)                                          \
                    for (c = c0; c < c0 + 16 && c < cg; c++)                             \
                        for (o = o0; o < o0 + 16 && o < og; o++) {                       \
                            const T *f = w + ((gi * og + o) * cg + c) * khw;             \
                            T *t = wt + ((gi * cg + c) * og + o) * khw + khw - 1;        \
                            for (k = 0; k < khw; k++)                                    \
                                t[-k] = f[k];                                            \
                        }                                                                \
    }
CONV_FLIP(float, f32)
CONV_FLIP(double, f64)

static void conv_flip_weights(const conv_geom *g, const void *w, void *wt)
{
    if (g->is64)
        conv_flip_f64(g, (const double *)w, (double *)wt);
    else
        conv_flip_f32(g, (const float *)w, (float *)wt);
}

/* grad_input by col2im: the job of the two loops below, for images
 * n0 .. n0 + nimg - 1. */
typedef struct gi_job {
    opjit_ctx *ctx;
    const conv_geom *g;
    const void *dy, *w, *wt; /* wt: the fast path's W_g^T, [G][kdim][og] */
    void *dx, *cols;         /* cols: [nimg][G][kdim][plane] */
    int64_t n0, nimg, kdim, plane, pb, nblk;
    char *ws; /* the fast path's per-thread GEMM scratch, per bytes each */
    size_t per;
    int fast;
} gi_job;

/* Units [lo, hi) of (image, group, block of positions): the block of
 * cols = W_g^T grad_g. */
static int conv_gi_cols_run(void *user, int64_t lo, int64_t hi)
{
    const gi_job *j = (const gi_job *)user;
    const conv_geom *g = j->g;
    const int64_t kdim = j->kdim, plane = j->plane, G = g->groups;
    int64_t u;
    for (u = lo; u < hi; u++) {
        int64_t blk = u % j->nblk, gi = u / j->nblk % G, ni = u / (j->nblk * G);
        int64_t p0 = blk * j->pb, np = plane - p0 < j->pb ? plane - p0 : j->pb;
        int64_t dyo = ((j->n0 + ni) * g->o + gi * g->og) * plane + p0;
        int64_t co = (ni * G + gi) * kdim * plane + p0;
#ifdef SG_FAST
        if (j->fast) {
            float *scr = (float *)(void *)(j->ws + (size_t)opjit_thread_num(j->ctx) * j->per);
            sg_sgemm(kdim, np, g->og, (const float *)j->wt + gi * kdim * g->og, g->og,
                     (const float *)j->dy + dyo, plane, (float *)j->cols + co, plane, scr);
            continue;
        }
#endif
        if (g->is64 ? op_dgemm(j->ctx, CblasRowMajor, CblasTrans, CblasNoTrans, (int)kdim,
                               (int)np, (int)g->og, 1.0,
                               (const double *)j->w + gi * g->og * kdim, (int)kdim,
                               (const double *)j->dy + dyo, (int)plane, 0.0,
                               (double *)j->cols + co, (int)plane)
                    : op_sgemm(j->ctx, CblasRowMajor, CblasTrans, CblasNoTrans, (int)kdim,
                               (int)np, (int)g->og, 1.0f,
                               (const float *)j->w + gi * g->og * kdim, (int)kdim,
                               (const float *)j->dy + dyo, (int)plane, 0.0f,
                               (float *)j->cols + co, (int)plane))
            return -1;
    }
    return 0;
}

/* col2im of one input channel's kH * kW rows of cols into its plane dx
 * (zeroed first), taps in order. */
#define CONV_COL2IM(T, SUF)                                                            \
    static void conv_col2im_##SUF(const conv_geom *g, const T *cols, T *dx)            \
    {                                                                                  \
        const int64_t H = g->h, W = g->w, wo = g->wo, plane = g->ho * g->wo;           \
        int64_t ki, kj, oh, ow;                                                        \
        memset(dx, 0, (size_t)(H * W) * sizeof(T));                                   \
        for (ki = 0; ki < g->kh; ki++)                                                 \
            for (kj = 0; kj < g->kw; kj++, cols += plane) {                            \
                int64_t ih0 = ki * g->dh - g->ph, iw0 = kj * g->dw - g->pw;            \
                int64_t lo = conv_ceil_div(-iw0, g->sw);                               \
                int64_t hi = conv_ceil_div(W - iw0, g->sw);                            \
                if (hi > wo)                                                           \
                    hi = wo;                                                           \
                for (oh = 0; oh < g->ho; oh++) {                                       \
                    int64_t ih = oh * g->sh + ih0;                                     \
                    T *d;                                                              \
                    const T *s = cols + oh * wo;                                       \
                    if (ih < 0 || ih >= H)                                             \
                        continue;                                                      \
                    d = dx + ih * W;                                                   \
                    if (g->sw == 1)                                                    \
                        for (ow = lo; ow < hi; ow++)                                   \
                            d[ow + iw0] += s[ow];                                      \
                    else                                                               \
                        for (ow = lo; ow < hi; ow++)                                   \
                            d[ow * g->sw + iw0] += s[ow];                              \
                }                                                                      \
            }                                                                          \
    }
CONV_COL2IM(float, f32)
CONV_COL2IM(double, f64)

/* Units [lo, hi) of (image, group, input channel): col2im. */
static int conv_gi_col2im_run(void *user, int64_t lo, int64_t hi)
{
    const gi_job *j = (const gi_job *)user;
    const conv_geom *g = j->g;
    const int64_t cg = g->cg, G = g->groups, khw = g->kh * g->kw;
    int64_t u;
    for (u = lo; u < hi; u++) {
        int64_t c = u % cg, gi = u / cg % G, ni = u / (cg * G);
        int64_t co = ((ni * G + gi) * j->kdim + c * khw) * j->plane;
        int64_t xo = ((j->n0 + ni) * g->c + gi * cg + c) * g->h * g->w;
        if (g->is64)
            conv_col2im_f64(g, (const double *)j->cols + co, (double *)j->dx + xo);
        else
            conv_col2im_f32(g, (const float *)j->cols + co, (float *)j->dx + xo);
    }
    return 0;
}

/* Images a batch of cols holds: about 8M elements. */
static int64_t conv_gi_images(const conv_geom *g, int64_t kdim, int64_t plane)
{
    int64_t per = g->groups * kdim * plane, n = ((int64_t)8 << 20) / (per > 0 ? per : 1);
    return n < 1 ? 1 : n > g->n ? g->n : n;
}

/* grad_input through cols and col2im, images in batches (conv_gi_images);
 * blocks of positions for about 48 units a batch, at least 64 positions,
 * fixed by the shape. 0, or the status of opjit_fail. */
static int conv_gi_col2im(opjit_ctx *ctx, const conv_geom *g, const void *dy, const void *w,
                          void *dx, int fast)
{
    gi_job j;
    size_t esz = g->is64 ? sizeof(double) : sizeof(float);
    int64_t nb, n0, G = g->groups;
    int rc;
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.g = g;
    j.dy = dy;
    j.w = w;
    j.dx = dx;
    j.fast = fast;
    j.kdim = g->cg * g->kh * g->kw;
    j.plane = g->ho * g->wo;
    j.nimg = conv_gi_images(g, j.kdim, j.plane);
    nb = (48 + j.nimg * G - 1) / (j.nimg * G);
    if (nb > (j.plane + 63) / 64)
        nb = (j.plane + 63) / 64;
    if (nb < 1)
        nb = 1;
    j.pb = ((j.plane + nb - 1) / nb + 15) / 16 * 16;
    j.nblk = (j.plane + j.pb - 1) / j.pb;
    if (!(j.cols = opjit_workspace(ctx, (size_t)(j.nimg * G * j.kdim * j.plane) * esz)))
        return opjit_fail(ctx, "out of memory for grad_input's columns");
#ifdef SG_FAST
    if (fast) { /* W_g^T [kdim][og] per group, and GEMM scratch per thread */
        float *wt = (float *)opjit_workspace(ctx, (size_t)(G * j.kdim * g->og) * sizeof(float));
        int64_t gi, o, r;
        j.per = (sg_sgemm_scratch(g->og) + 63) / 64 * 64;
        j.ws = (char *)opjit_workspace(ctx, (size_t)opjit_num_threads(ctx) * j.per);
        if (!wt || !j.ws)
            return opjit_fail(ctx, "out of memory for grad_input's workspace");
        for (gi = 0; gi < G; gi++)
            for (o = 0; o < g->og; o++)
                for (r = 0; r < j.kdim; r++)
                    wt[(gi * j.kdim + r) * g->og + o] =
                        ((const float *)w)[(gi * g->og + o) * j.kdim + r];
        j.wt = wt;
    }
#endif
    for (n0 = 0; n0 < g->n; n0 += j.nimg) {
        int64_t cnt = g->n - n0 < j.nimg ? g->n - n0 : j.nimg;
        j.n0 = n0;
        if ((rc = opjit_parallel_for(ctx, 0, cnt * G * j.nblk, 1, conv_gi_cols_run, &j)) ||
            (rc = opjit_parallel_for(ctx, 0, cnt * G * g->cg, 1, conv_gi_col2im_run, &j)))
            return rc;
    }
    return 0;
}

/* to [C][N * P] = from [N][C][P] (C channels, P positions an image): the
 * batch as more positions. 0, or the status of opjit_fail. */
static int conv_fold_batch(opjit_ctx *ctx, const conv_geom *g, const void *from, int64_t c,
                           void *to)
{
    DLTensor v;
    int64_t plane = g->ho * g->wo, shape[3] = {c, g->n, plane}, strides[3] = {plane, c * plane, 1};
    memset(&v, 0, sizeof v);
    v.data = (void *)from;
    v.device.device_type = kDLCPU;
    v.ndim = 3;
    v.dtype = g->is64 ? OPJIT_FLOAT64 : OPJIT_FLOAT32;
    v.shape = shape;
    v.strides = strides;
    return st_copy_to(ctx, &v, to);
}

/* to [N][C][P] = from [C][N * P]: conv_fold_batch undone. */
static int conv_unfold_batch(opjit_ctx *ctx, const conv_geom *g, const void *from, int64_t c,
                             void *to)
{
    DLTensor v;
    int64_t plane = g->ho * g->wo, shape[3] = {g->n, c, plane};
    int64_t strides[3] = {plane, g->n * plane, 1};
    memset(&v, 0, sizeof v);
    v.data = (void *)from;
    v.device.device_type = kDLCPU;
    v.ndim = 3;
    v.dtype = g->is64 ? OPJIT_FLOAT64 : OPJIT_FLOAT32;
    v.shape = shape;
    v.strides = strides;
    return st_copy_to(ctx, &v, to);
}

/* Whether g is a 1x1 convolution with stride 1 and no padding. */
static int conv_is_pointwise(const conv_geom *g)
{
    return g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0 &&
           g->ph2 == 0 && g->pw2 == 0;
}

/* grad_input of a 1x1 convolution with stride 1 and no padding: per image
 * and group, dx [cg, plane] = W_g^T [cg, og] dy [og, plane], W read
 * transposed in place (no flipped copy). Units of (image, group, block of
 * positions, block of rows), the blocks fixed by the shape (OpenBLAS's
 * rounding follows its calls). */
typedef struct gid_job {
    opjit_ctx *ctx;
    const conv_geom *g;
    const void *dy, *w;
    void *dx;
    int64_t plane, pb, nblk, trows;
    int64_t rbs, nrb; /* rows (input channels) a block, blocks */
    char *ws;
    size_t per, tile; /* tile (trows x pb): bytes into a thread's area, 0: none */
    int fast;
} gid_job;

#ifdef SG_FAST
#include <immintrin.h>

/* Rows of tile (ld lds) into dst (ld ldd) with stores that bypass the
 * caches: dst's lines are not read first, and an output written once and
 * far larger than the caches does not evict what the products read. */
SG_TGT static void conv_stream_rows(const float *src, int64_t lds, int64_t rows, int64_t cols,
                                    float *dst, int64_t ldd)
{
    int64_t r, c, a;
    for (r = 0; r < rows; r++, src += lds, dst += ldd) {
        a = (int64_t)(((0 - (uintptr_t)dst) & 63) / sizeof(float));
        a = a > cols ? cols : a;
        for (c = 0; c < a; c++)
            dst[c] = src[c];
#if SG_W == 16
        for (; c + 16 <= cols; c += 16)
            _mm512_stream_ps(dst + c, _mm512_loadu_ps(src + c));
#else
        for (; c + 8 <= cols; c += 8)
            _mm256_stream_ps(dst + c, _mm256_loadu_ps(src + c));
#endif
        for (; c < cols; c++)
            dst[c] = src[c];
    }
}

/* C (M x N) = A^T B, A's element (i, k) at a[k * lda + i] (the weights of
 * the group, read in place), B (K x N) rows plane apart. A long K in
 * steps of 128 (each continuing the chains, the same bits): B's panel and
 * the lines of A then stay in L1 (1x1 512->2048 @7 batch 1 grad_input,
 * 1 thread: 2.2 -> 1.45 ms). */
SG_TGT static void conv_gid_gemm(int64_t M, int64_t N, int64_t K, int64_t lda, const float *a,
                                 const float *b, int64_t plane, float *c, int64_t ldc,
                                 float *scr)
{
    const int64_t kb = K > 256 ? 128 : K;
    int64_t k0;
    for (k0 = 0; k0 < K; k0 += kb)
        sg_gemm_ex(M, N, K - k0 < kb ? K - k0 : kb, a + k0 * lda, 1, lda, b + k0 * plane, plane,
                   c, ldc, scr, k0 > 0);
}

/* Bytes of grad_input from which conv_gid_run streams it out (measured:
 * 1x1 256->64 @56, 25 MB, 10.7 -> 8.1 ms at 1 thread; 3 MB, no gain). */
#define CONV_GID_STREAM ((size_t)8 << 20)
#endif

static int conv_gid_run(void *user, int64_t lo, int64_t hi)
{
    const gid_job *j = (const gid_job *)user;
    const conv_geom *g = j->g;
    const int64_t plane = j->plane, cg = g->cg, og = g->og;
    int64_t u;
    for (u = lo; u < hi; u++) {
        int64_t rb = u % j->nrb, blk = u / j->nrb % j->nblk;
        int64_t gi = u / (j->nrb * j->nblk) % g->groups, n = u / (j->nrb * j->nblk * g->groups);
        int64_t p0 = blk * j->pb, np = plane - p0 < j->pb ? plane - p0 : j->pb;
        int64_t c0 = rb * j->rbs, nc = cg - c0 < j->rbs ? cg - c0 : j->rbs;
        int64_t yo = (n * g->o + gi * og) * plane + p0;
        int64_t xo = (n * g->c + gi * cg + c0) * plane + p0, wo = gi * og * cg + c0;
#ifdef SG_FAST
        if (j->fast && j->tile) { /* rows by tiles, streamed out */
            char *area = j->ws + (size_t)opjit_thread_num(j->ctx) * j->per;
            float *scr = (float *)(void *)area, *tile = (float *)(void *)(area + j->tile);
            int64_t r0, nr;
            for (r0 = 0; r0 < nc; r0 += j->trows) {
                nr = nc - r0 < j->trows ? nc - r0 : j->trows;
                conv_gid_gemm(nr, np, og, cg, (const float *)j->w + wo + r0,
                              (const float *)j->dy + yo, plane, tile, j->pb, scr);
                conv_stream_rows(tile, j->pb, nr, np, (float *)j->dx + xo + r0 * plane, plane);
            }
            continue;
        }
        if (j->fast) {
            float *scr = (float *)(void *)(j->ws + (size_t)opjit_thread_num(j->ctx) * j->per);
            conv_gid_gemm(nc, np, og, cg, (const float *)j->w + wo, (const float *)j->dy + yo,
                          plane, (float *)j->dx + xo, plane, scr);
            continue;
        }
#endif
        if (g->is64 ? op_dgemm(j->ctx, CblasRowMajor, CblasTrans, CblasNoTrans, (int)nc,
                               (int)np, (int)og, 1.0, (const double *)j->w + wo, (int)cg,
                               (const double *)j->dy + yo, (int)plane, 0.0,
                               (double *)j->dx + xo, (int)plane)
                    : op_sgemm(j->ctx, CblasRowMajor, CblasTrans, CblasNoTrans, (int)nc,
                               (int)np, (int)og, 1.0f, (const float *)j->w + wo, (int)cg,
                               (const float *)j->dy + yo, (int)plane, 0.0f,
                               (float *)j->dx + xo, (int)plane))
            return -1;
    }
#ifdef SG_FAST
    if (j->tile)
        _mm_sfence(); /* this thread's streamed stores before the loop's end */
#endif
    return 0;
}

static int conv_gi_direct(opjit_ctx *ctx, const conv_geom *g, const void *dy, const void *w,
                          void *dx, int fast)
{
    gid_job j;
    int64_t nb, nr, units = g->n * g->groups;
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.g = g;
    j.dy = dy;
    j.w = w;
    j.dx = dx;
    j.fast = fast;
    j.plane = g->ho * g->wo;
    /* blocks of at least 96 positions, enough for about 48 units */
    nb = (48 + units - 1) / units;
    if (nb > (j.plane + 95) / 96)
        nb = (j.plane + 95) / 96;
    if (nb < 1)
        nb = 1;
    j.pb = ((j.plane + nb - 1) / nb + 15) / 16 * 16;
    j.nblk = (j.plane + j.pb - 1) / j.pb;
    /* still short of 48 units (small images): blocks of at least 64 rows too */
    nr = (48 + units * j.nblk - 1) / (units * j.nblk);
    if (nr > g->cg / 64)
        nr = g->cg / 64;
    if (nr < 1)
        nr = 1;
    j.rbs = ((g->cg + nr - 1) / nr + 7) / 8 * 8;
    j.nrb = (g->cg + j.rbs - 1) / j.rbs;
#ifdef SG_FAST
    if (fast) {
        j.per = (sg_sgemm_scratch(g->og) + 63) / 64 * 64;
        /* grad_input far larger than the caches (a 1x1 on a batch of big
         * images): tiles of rows in this thread's area, streamed out */
        if ((size_t)(g->n * g->c * j.plane) * sizeof(float) >= CONV_GID_STREAM) {
            j.trows = (32768 / j.pb) / SG_MR * SG_MR;
            j.trows = j.trows < SG_MR ? SG_MR : j.trows > 64 ? 64 : j.trows;
            j.tile = j.per;
            j.per += (size_t)(j.trows * j.pb) * sizeof(float);
        }
        if (!(j.ws = (char *)opjit_workspace(ctx, (size_t)opjit_num_threads(ctx) * j.per)))
            return opjit_fail(ctx, "out of memory for grad_input's workspace");
    }
#endif
    return opjit_parallel_for(ctx, 0, units * j.nblk * j.nrb, 1, conv_gid_run, &j);
}

/* Whether g is a 1x1 on a batch of small images, whose gradients treat
 * the batch as one image of all the positions (conv_grad_folded). */
static int conv_folds(const conv_geom *g)
{
    return conv_is_pointwise(g) && g->n > 1 && g->ho * g->wo < 256;
}

static int conv_grad_weight(opjit_ctx *ctx, const conv_geom *g, const void *x, const void *dy,
                            void *dw);

/* The gradients of such a 1x1 (dx, dw: those wanted, else NULL; x, w
 * those they need), grad folded once for both: grad_input, one image, so
 * W is read once; grad_weight, products over long rows instead of an
 * image's few. 0, or the status of opjit_fail. */
static int conv_grad_folded(opjit_ctx *ctx, const conv_geom *g, const void *dy, const void *x,
                            const void *w, void *dx, void *dw)
{
    conv_geom g1 = *g;
    size_t esz = g->is64 ? sizeof(double) : sizeof(float), plane = (size_t)(g->h * g->w);
    void *yr = opjit_workspace(ctx, (size_t)(g->n * g->o) * plane * esz);
    void *xr = opjit_workspace(ctx, (size_t)(g->n * g->c) * plane * esz); /* dx, then x */
    int fast = 0, rc;
#ifdef SG_FAST
    fast = !g->is64 && sg_fast_ok();
#endif
    if (!xr || !yr)
        return opjit_fail(ctx, "out of memory for the gradients' workspace");
    g1.n = 1;
    g1.h = g1.ho = 1;
    g1.w = g1.wo = g->n * g->h * g->w;
    if ((rc = conv_fold_batch(ctx, g, dy, g->o, yr)) != 0)
        return rc;
    if (dx && ((rc = conv_gi_direct(ctx, &g1, yr, w, xr, fast)) != 0 ||
               (rc = conv_unfold_batch(ctx, g, xr, g->c, dx)) != 0))
        return rc;
    if (dw && ((rc = conv_fold_batch(ctx, g, x, g->c, xr)) != 0 ||
               (rc = conv_grad_weight(ctx, &g1, xr, yr, dw)) != 0))
        return rc;
    return 0;
}

/* grad_input [N, C, H, W] for grad [N, O, Ho, Wo] (dense). */
static int conv_grad_input(opjit_ctx *ctx, const conv_geom *g, const void *dy, const void *w,
                           void *dx)
{
    conv_geom t;
    int fast = 0, rc;
#ifdef SG_FAST
    fast = !g->is64 && sg_fast_ok();
#endif
    if (g->n == 0 || g->c == 0)
        return 0;
    if (conv_folds(g))
        return conv_grad_folded(ctx, g, dy, NULL, w, dx, NULL);
    if (conv_is_pointwise(g))
        return conv_gi_direct(ctx, g, dy, w, dx, fast);
    /* a probe: sizes that do not fit leave no message, the fallback below says */
    if (conv_transposed_geom(g, &t) && conv_sizes_fit(&t)) {
        size_t bytes = (size_t)(g->o * g->cg * g->kh * g->kw) * (g->is64 ? 8 : 4);
        void *wt = opjit_workspace(ctx, bytes);
        if (!wt)
            return opjit_fail(ctx, "out of memory for the flipped weights");
        conv_flip_weights(g, w, wt);
        return conv_forward(ctx, &t, dy, wt, NULL, dx);
    }
    if ((rc = conv_sizes_ok(ctx, g)) != 0)
        return rc;
    return conv_gi_col2im(ctx, g, dy, w, dx, fast);
}

/* ---- grad_weight -------------------------------------------------------------------- */

typedef struct gw_job {
    opjit_ctx *ctx;
    const conv_geom *g;
    const void *x, *dy, *xend;
    void *dw;   /* grad_weight [O, kdim]; with slices, their copies */
    int64_t S;  /* slices of the positions, each whole blocks */
    int64_t kdim, plane, khw, kb, nkb; /* positions a block, blocks an image */
    int64_t cbc, ncb, rbs, nrb;        /* channels a column block, rows a row block */
    int64_t ldcol, ldbt;               /* the unfolded block and its transpose */
    int direct, fast;
    int tr;           /* the products make grad_weight^T ([S][G][kdim][og]), from grad^T */
    const float *dyt; /* fast path, direct, O/g <= 256: grad transposed, [N][plane][O];
                       * the products then make grad_weight^T ([S][G][kdim][og]) */
    char *ws;
    size_t per;
} gw_job;

/* The unit's target: rows [r0, r0 + nr) and channels [c0, c0 + nc) of
 * group gi in slice s, zeroed when zero (the optimizing tier's first
 * product writes it instead: a chain from 0 either way). */
static void *conv_gw_target(const gw_job *j, int64_t s, int64_t gi, int64_t r0, int64_t nr,
                            int64_t c0, int64_t nc, int zero)
{
    const conv_geom *g = j->g;
    size_t esz = g->is64 ? sizeof(double) : sizeof(float);
    char *t = (char *)j->dw + ((size_t)(s * g->o * j->kdim) +
                               (size_t)((gi * g->og + r0) * j->kdim + c0 * j->khw)) * esz;
    int64_t r;
    if (j->tr) { /* grad_weight^T: rows of kdim, og apart */
        t = (char *)j->dw + ((size_t)(s * g->o * j->kdim) +
                             (size_t)((gi * j->kdim + c0 * j->khw) * g->og + r0)) * esz;
        for (r = 0; zero && r < nc * j->khw; r++)
            memset(t + (size_t)(r * g->og) * esz, 0, (size_t)nr * esz);
        return t;
    }
    for (r = 0; zero && r < nr; r++)
        memset(t + (size_t)(r * j->kdim) * esz, 0, (size_t)(nc * j->khw) * esz);
    return t;
}

/* The unfolded block: channels [c0, c0 + nc) of group gi, image n,
 * positions [p0, p0 + np), as nc * kh * kw rows. Its data and leading
 * dimension (the input itself for a direct 1x1). */
static const void *conv_gw_unfold(const gw_job *j, void *buf, int64_t n, int64_t gi, int64_t c0,
                                  int64_t nc, int64_t p0, int64_t np, int64_t *ld)
{
    const conv_geom *g = j->g;
    conv_geom sub = *g;
    size_t esz = g->is64 ? sizeof(double) : sizeof(float);
    const char *im = (const char *)j->x + (size_t)((n * g->c + gi * g->cg + c0) * g->h * g->w) * esz;
    sub.cg = nc;
    if (j->direct) {
        *ld = j->plane;
        return im + (size_t)p0 * esz;
    }
#ifdef SG_FAST
    if (j->fast) {
        conv_im2col_blk(&sub, (const float *)(const void *)im, (const float *)j->xend, p0, np,
                        (float *)buf, j->ldcol);
        *ld = j->ldcol;
        return buf;
    }
#endif
    if (g->is64)
        conv_im2col_f64(&sub, (const double *)(const void *)im, p0, np, (double *)buf);
    else
        conv_im2col_f32(&sub, (const float *)(const void *)im, p0, np, (float *)buf);
    *ld = np;
    return buf;
}

/* One block (acc 0: the unit's first, in the optimizing tier written, not
 * added to): target (nr x ncols, rows kdim apart) += grad rows dyr (nr x
 * np, rows plane apart) times the unfolded block (ncols x np, rows ld
 * apart) transposed; or, with dyt (grad^T rows, np x nr, ldt apart), the
 * transposed target (ncols x nr, rows og apart) += the block times dyt.
 * 0, or -1 with the error recorded (OpenBLAS could not be had). */
static int conv_gw_block(const gw_job *j, char *area, const void *dyr, const float *dyt,
                          int64_t ldt,
                          const void *col, int64_t ld, int64_t nr, int64_t ncols, int64_t np,
                          void *target, int acc)
{
    const conv_geom *g = j->g;
#ifdef SG_FAST
    if (dyt) { /* target^T (ncols x nr) (+)= the unfolded block times grad^T */
        float *bt = (float *)(void *)(area + (size_t)(j->cbc * j->khw * j->ldcol + 16) * 4);
        float *scr = bt + j->kb * j->ldbt + 16; /* bt may hold dyt */
        sg_gemm(ncols, nr, np, (const float *)col, ld, dyt, ldt, (float *)target, g->og, scr,
                acc);
        return 0;
    }
    if (j->fast) {
        float *bt = (float *)(void *)(area + (size_t)(j->cbc * j->khw * j->ldcol + 16) * 4);
        float *scr = bt + j->kb * j->ldbt + 16;
        sg_transpose((const float *)col, ld, ncols, np, bt, j->ldbt);
        sg_gemm(nr, ncols, np, (const float *)dyr, j->plane, bt, j->ldbt, (float *)target,
                j->kdim, scr, acc);
        return 0;
    }
#else
    (void)area;
    (void)dyt;
    (void)ldt;
#endif
    (void)acc; /* the target was zeroed: beta = 1 throughout, as always */
    if (g->is64)
        return op_dgemm(j->ctx, CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)ncols,
                        (int)np, 1.0, (const double *)dyr, (int)j->plane, (const double *)col,
                        (int)ld, 1.0, (double *)target, (int)j->kdim);
    return op_sgemm(j->ctx, CblasRowMajor, CblasNoTrans, CblasTrans, (int)nr, (int)ncols, (int)np,
                    1.0f, (const float *)dyr, (int)j->plane, (const float *)col, (int)ld, 1.0f,
                    (float *)target, (int)j->kdim);
}

/* Units [lo, hi) of (slice, group, column block, row block): the unit's
 * blocks of positions in order, each unfolded and multiplied in. */
static int conv_gw_run(void *user, int64_t lo, int64_t hi)
{
    const gw_job *j = (const gw_job *)user;
    const conv_geom *g = j->g;
    const int64_t G = g->groups, nblocks = g->n * j->nkb;
    const size_t esz = g->is64 ? sizeof(double) : sizeof(float);
    char *area = j->ws + (size_t)opjit_thread_num(j->ctx) * j->per;
    int64_t u, t;
    for (u = lo; u < hi; u++) {
        int64_t rb = u % j->nrb, cb = u / j->nrb % j->ncb, gi = u / (j->nrb * j->ncb) % G;
        int64_t s = u / (j->nrb * j->ncb * G), r0 = rb * j->rbs, c0 = cb * j->cbc;
        int64_t nr = g->og - r0 < j->rbs ? g->og - r0 : j->rbs;
        int64_t nc = g->cg - c0 < j->cbc ? g->cg - c0 : j->cbc;
        int64_t t0 = s * nblocks / j->S, t1 = (s + 1) * nblocks / j->S;
        void *target = conv_gw_target(j, s, gi, r0, nr, c0, nc, !j->fast || t0 == t1);
        for (t = t0; t < t1; t++) {
            int64_t n = t / j->nkb, p0 = (t % j->nkb) * j->kb, ld;
            int64_t np = j->plane - p0 < j->kb ? j->plane - p0 : j->kb;
            const void *col = conv_gw_unfold(j, area, n, gi, c0, nc, p0, np, &ld);
            const char *dyr = (const char *)j->dy +
                              (size_t)((n * g->o + gi * g->og + r0) * j->plane + p0) * esz;
            const float *dyt = NULL;
            int64_t ldt = g->o;
#ifdef SG_FAST
            if (j->dyt) {
                dyt = j->dyt + (n * j->plane + p0) * g->o + gi * g->og + r0;
            } else if (j->tr) { /* this block of grad^T, where a transposed block goes */
                float *bt = (float *)(void *)(area + (size_t)(j->cbc * j->khw * j->ldcol + 16) *
                                                         sizeof(float));
                sg_transpose((const float *)(const void *)dyr, j->plane, nr, np, bt, j->ldbt);
                dyt = bt;
                ldt = j->ldbt;
            }
#endif
            if (conv_gw_block(j, area, dyr, dyt, ldt, col, ld, nr, nc * j->khw, np, target,
                              t > t0))
                return -1;
        }
    }
    return 0;
}

/* The units of grad_weight, from the shape alone: column blocks of whole
 * channels, about 144 columns; row blocks of 256 when there are more than
 * 512 rows; blocks of positions whose unfolded block and its transpose are
 * about 128 KB each; slices enough for about 48 units, each two blocks or
 * more, their copies at most 4M elements in all. */
static void conv_gw_plan(gw_job *j)
{
    const conv_geom *g = j->g;
    int64_t ncols, units, nblocks, r16;
    j->khw = g->kh * g->kw;
    j->kdim = g->cg * j->khw;
    j->plane = g->ho * g->wo;
    j->direct = j->khw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0 &&
                g->ph2 == 0 && g->pw2 == 0;
    j->cbc = 144 / j->khw < 1 ? 1 : 144 / j->khw;
    if (j->cbc > g->cg)
        j->cbc = g->cg;
    j->ncb = (g->cg + j->cbc - 1) / j->cbc;
    j->cbc = (g->cg + j->ncb - 1) / j->ncb;
    j->rbs = g->og <= 512 ? g->og : 256;
    j->nrb = (g->og + j->rbs - 1) / j->rbs;
    ncols = j->cbc * j->khw;
    r16 = (j->plane + 15) / 16 * 16;
    j->kb = (32768 / ncols) / 16 * 16;
    j->kb = j->kb < 64 ? 64 : j->kb > 1024 ? 1024 : j->kb;
    j->kb = j->kb > r16 ? r16 : j->kb;
    j->nkb = (j->plane + j->kb - 1) / j->kb;
    j->kb = ((j->plane + j->nkb - 1) / j->nkb + 15) / 16 * 16;
    j->nkb = (j->plane + j->kb - 1) / j->kb;
    units = g->groups * j->ncb * j->nrb;
    nblocks = g->n * j->nkb;
    j->S = (48 + units - 1) / units;
    if (j->S > nblocks / 2)
        j->S = nblocks / 2;
    if (j->S > ((int64_t)4 << 20) / (g->o * j->kdim))
        j->S = ((int64_t)4 << 20) / (g->o * j->kdim);
    if (j->S < 1)
        j->S = 1;
    j->ldcol = (j->kb + 15) / 16 * 16 + 16;
    j->ldcol += j->ldcol % 256 == 0 ? 16 : 0;
    j->ldbt = (ncols + 15) / 16 * 16;
    j->ldbt += j->ldbt % 256 == 0 ? 16 : 0;
}

/* Bytes of one thread's area: the unfolded block; in the optimizing tier
 * also its transpose and the GEMM's scratch. */
static size_t conv_gw_area(const gw_job *j)
{
    size_t esz = j->g->is64 ? sizeof(double) : sizeof(float);
    size_t b = (size_t)(j->cbc * j->khw) * (size_t)(j->fast ? j->ldcol : j->kb) * esz + 64;
#ifdef SG_FAST
    if (j->fast)
        b += (size_t)(j->kb * j->ldbt + 16) * sizeof(float) + sg_sgemm_scratch(j->kb);
#endif
    return (b + 63) / 64 * 64;
}

typedef struct gw_sum {
    const conv_geom *g;
    const void *parts;
    void *dw;
    int64_t S, count, kdim;
    int transposed; /* the parts hold grad_weight^T per group, [G][kdim][og] */
} gw_sum;

/* Elements [lo, hi) of grad_weight: the slices' copies summed in order. */
static int conv_gw_sum_run(void *user, int64_t lo, int64_t hi)
{
    const gw_sum *q = (const gw_sum *)user;
    const int64_t og = q->g->og, kdim = q->kdim;
    int64_t i, s;
#ifdef SG_FAST
    if (q->transposed) { /* units of (group, 64 rows of kdim), float32 */
        const int64_t nrb = (kdim + 63) / 64;
        for (i = lo; i < hi; i++) {
            int64_t gi = i / nrb, r0 = i % nrb * 64, nr = kdim - r0 < 64 ? kdim - r0 : 64, e;
            float *p = (float *)q->parts + (gi * kdim + r0) * og;
            for (s = 1; s < q->S; s++) /* into copy 0, in slice order */
                for (e = 0; e < nr * og; e++)
                    p[e] += p[s * q->count + e];
            sg_transpose(p, og, nr, og, (float *)q->dw + gi * og * kdim + r0, kdim);
        }
        return 0;
    }
#endif
    (void)og;
    (void)kdim;
    for (i = lo; i < hi; i++) {
        if (q->g->is64) {
            const double *p = (const double *)q->parts + i;
            double t = p[0];
            for (s = 1; s < q->S; s++)
                t += p[s * q->count];
            ((double *)q->dw)[i] = t;
        } else {
            const float *p = (const float *)q->parts + i;
            float t = p[0];
            for (s = 1; s < q->S; s++)
                t += p[s * q->count];
            ((float *)q->dw)[i] = t;
        }
    }
    return 0;
}

#ifdef SG_FAST
/* Units [lo, hi) of (image, block of 256 positions): grad^T. */
static int conv_gw_dyt_run(void *user, int64_t lo, int64_t hi)
{
    const gw_job *j = (const gw_job *)user;
    const int64_t O = j->g->o, nb = (j->plane + 255) / 256;
    int64_t u;
    for (u = lo; u < hi; u++) {
        int64_t n = u / nb, p0 = u % nb * 256, np = j->plane - p0 < 256 ? j->plane - p0 : 256;
        sg_transpose((const float *)j->dy + n * O * j->plane + p0, j->plane, O, np,
                     (float *)j->dyt + (n * j->plane + p0) * O, O);
    }
    return 0;
}

/* grad [N][O][plane] transposed into workspace, [N][plane][O], for the
 * products that make grad_weight^T. 0, or the status of opjit_fail. */
static int conv_gw_transpose_grad(opjit_ctx *ctx, gw_job *j)
{
    size_t n = (size_t)(j->g->n * j->g->o * j->plane);
    float *t = (float *)opjit_workspace(ctx, n * sizeof(float));
    if (!t)
        return opjit_fail(ctx, "out of memory for grad_weight's workspace");
    j->dyt = t;
    return opjit_parallel_for(ctx, 0, j->g->n * ((j->plane + 255) / 256), 1, conv_gw_dyt_run, j);
}
#endif

/* grad_weight [O, C/g, kH, kW] for input x and grad dy (dense). */
static int conv_grad_weight(opjit_ctx *ctx, const conv_geom *g, const void *x, const void *dy,
                            void *dw)
{
    gw_job j;
    gw_sum q;
    size_t esz = g->is64 ? sizeof(double) : sizeof(float);
    int64_t count = g->o * g->cg * g->kh * g->kw, units;
    int rc;
    if (count == 0)
        return 0;
    if (g->n == 0) { /* no positions: a sum of nothing */
        memset(dw, 0, (size_t)count * esz);
        return 0;
    }
    if (conv_folds(g))
        return conv_grad_folded(ctx, g, dy, x, NULL, NULL, dw);
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.g = g;
    j.x = x;
    j.dy = dy;
    j.xend = (const char *)x + (size_t)(g->n * g->c * g->h * g->w) * esz;
#ifdef SG_FAST
    j.fast = !g->is64 && sg_fast_ok();
#endif
    conv_gw_plan(&j);
    j.per = conv_gw_area(&j);
#ifdef SG_FAST
    /* A 1x1 with fewer output than input channels: the products read the
     * input in place and a transposed grad (smaller than the input). Any
     * other kernel with few output channels: the unfolded block is A as it
     * stands, grad^T B, instead of a transpose of every block. */
    if (j.fast && g->og <= 256 && (j.direct ? g->og <= j.cbc : g->og <= j.cbc * j.khw)) {
        /* grad^T once a call when several units read each block of it,
         * unless two do and grad is far larger than L2: then each unit
         * transposes its blocks, in L2, with no pass over memory (1x1
         * 256->64 @56, 1 thread, CPU time: batch 8 (6 MB of grad) 6%
         * less, batch 1 4% more) */
        int64_t readers = j.ncb * j.nrb;
        size_t bytes = (size_t)(g->n * g->o * j.plane) * sizeof(float);
        j.tr = 1;
        if ((readers > 2 || (readers == 2 && bytes < ((size_t)4 << 20))) &&
            (rc = conv_gw_transpose_grad(ctx, &j)) != 0)
            return rc;
    }
#endif
    j.dw = j.S > 1 || j.tr ? opjit_workspace(ctx, (size_t)(j.S * count) * esz) : dw;
    j.ws = (char *)opjit_workspace(ctx, (size_t)opjit_num_threads(ctx) * j.per);
    if (!j.dw || !j.ws)
        return opjit_fail(ctx, "out of memory for grad_weight's workspace");
    units = j.S * g->groups * j.ncb * j.nrb;
    if ((rc = opjit_parallel_for(ctx, 0, units, 1, conv_gw_run, &j)) || j.dw == dw)
        return rc;
    q.g = g;
    q.parts = j.dw;
    q.dw = dw;
    q.S = j.S;
    q.count = count;
    q.kdim = j.kdim;
    q.transposed = j.tr;
    if (q.transposed)
        return opjit_parallel_for(ctx, 0, g->groups * ((j.kdim + 63) / 64), 1, conv_gw_sum_run,
                                  &q);
    return opjit_parallel_for(ctx, 0, count, 4096, conv_gw_sum_run, &q);
}

/* Output index of conv2d_backward shaped like t (want), else [0], its
 * data into *data (NULL when it has no elements). 0, or -1 with the error
 * recorded. */
static int conv_grad_output(opjit_ctx *ctx, int index, const DLTensor *t, int want, void **data)
{
    int64_t none = 0;
    DLTensor *o = want ? opjit_output(ctx, index, t->dtype, t->ndim, t->shape)
                       : opjit_output(ctx, index, t->dtype, 1, &none);
    *data = o ? opjit_data(o) : NULL;
    return o ? 0 : -1;
}

#ifdef HG_BF16
typedef struct flip16_job {
    const conv_geom *g;
    const uint16_t *w;
    uint16_t *wt;
} flip16_job;

/* Rows [lo, hi) (gi cg + c) of the flipped 16-bit weights (CONV_FLIP's
 * wt), in parallel: at batch 1 a serial flip was a tenth of grad_input. */
static int conv_flip16_run(void *user, int64_t lo, int64_t hi)
{
    const flip16_job *j = (const flip16_job *)user;
    const conv_geom *g = j->g;
    const int64_t khw = g->kh * g->kw;
    int64_t r, o, k;
    for (r = lo; r < hi; r++) {
        int64_t gi = r / g->cg, c = r % g->cg;
        uint16_t *t = j->wt + r * g->og * khw + khw - 1;
        for (o = 0; o < g->og; o++, t += khw) {
            const uint16_t *f = j->w + ((gi * g->og + o) * g->cg + c) * khw;
            for (k = 0; k < khw; k++)
                t[-k] = f[k];
        }
    }
    return 0;
}

/* bfloat16 grad_input on the forward's GEMM (conv_forward_bf16): the
 * transposed convolution of a stride-1 convolution (conv_transposed_geom)
 * with the flipped weights, straight on the 16-bit grad. 1 when it ran
 * (*rc its status), 0 to widen instead. */
static int conv_gi_bf16(opjit_ctx *ctx, const conv_geom *g, const void *dy, const void *w,
                        void *dx, int *rc)
{
    conv_geom t;
    uint16_t *wt;
    if (!conv_transposed_geom(g, &t) || !conv_sizes_fit(&t))
        return 0; /* widened instead, with no message left behind */
    if (!(wt = (uint16_t *)opjit_workspace(
              ctx, (size_t)(g->o * g->cg * g->kh * g->kw) * sizeof(uint16_t)))) {
        *rc = -1;
        return 1;
    }
    if (g->kh * g->kw == 1 && (*rc = hg_transpose16(ctx, w, g->groups, g->og, g->cg, wt)) != 0)
        return 1;
    if (g->kh * g->kw > 1) {
        flip16_job f;
        f.g = g;
        f.w = (const uint16_t *)w;
        f.wt = wt;
        if ((*rc = opjit_parallel_for(ctx, 0, g->groups * g->cg, 8, conv_flip16_run, &f)) != 0)
            return 1;
    }
    return conv_forward_bf16(ctx, &t, dy, wt, NULL, dx, rc);
}

/* bfloat16 grad_weight of a one-group convolution on gemm_half.h's
 * vdpbf16ps kernels (hg_conv_gw_bf16) where path has them, unless an
 * operand holds a subnormal (path's HW_SCAN) or, with an odd output
 * width, the input an Inf or NaN (the padded positions would make 0 x
 * Inf): 1 when it ran (*rc its status), 0 to widen instead. */
static int conv_gw_bf16(opjit_ctx *ctx, const conv_geom *g, int path, const void *x,
                        const void *dy, void *dw, int *rc)
{
    hg_gw s;
    if (!(path & HW_GEMM) || g->groups != 1 || g->n == 0 || g->c == 0 || g->o == 0 ||
        g->ho * g->wo == 0)
        return 0;
    s.n = g->n;
    s.c = g->c;
    s.h = g->h;
    s.w = g->w;
    s.o = g->o;
    s.kh = g->kh;
    s.kw = g->kw;
    s.sh = g->sh;
    s.sw = g->sw;
    s.ph = g->ph;
    s.pw = g->pw;
    s.dh = g->dh;
    s.dw = g->dw;
    s.ho = g->ho;
    s.wo = g->wo;
    return hg_conv_gw_bf16(ctx, &s, x, dy, dw, !!(path & HW_SCAN), rc);
}
#endif

/* The gradients in float16 or bfloat16 (kind): in = {dy, x, w} dense
 * 16-bit (x, w NULL when not needed), out = {dx, dw, db} those wanted.
 * bfloat16 grad_input and grad_weight on the GEMMs of gemm_half.h where
 * they apply (conv_gi_bf16, conv_gw_bf16); the others from the operands
 * widened to float32, the float32 gradient rounded once (grad_bias: the
 * float32 sum of the 16-bit grad, read as it is). 0, or the status of the
 * failure. */
static int conv_backward_half(opjit_ctx *ctx, const conv_geom *g, int kind, const int want[3],
                              const void *in[3], void *out[3])
{
    int64_t nx = g->n * g->c * g->h * g->w, nw = g->o * g->cg * g->kh * g->kw;
    int64_t ny = g->n * g->o * g->ho * g->wo, nout[3] = {nx, nw, g->o};
    float *dy = NULL, *x = NULL, *w = NULL, *o[3] = {NULL, NULL, NULL};
    conv_geom g2 = *g; /* grad_input as a convolution: direct sums (conv_forward_half) */
    int i, rc = 0, left[3];
    for (i = 0; i < 3; i++)
        left[i] = want[i];
#ifdef HG_BF16
    if (kind == HW_BF16) {
        int path = hw_path(ctx, kind, HG_HAVE());
        if (path < 0)
            return -1;
        if (left[0] && path > 0 && conv_gi_bf16(ctx, g, in[0], in[2], out[0], &rc)) {
            if (rc)
                return rc;
            left[0] = 0;
        }
        if (left[1] && conv_gw_bf16(ctx, g, path, in[1], in[0], out[1], &rc)) {
            if (rc)
                return rc;
            left[1] = 0;
        }
    }
#endif
    g2.no_winograd = 1;
    if (((left[0] || left[1]) && !(dy = hw_widen(ctx, kind, in[0], ny))) ||
        (left[1] && !(x = hw_widen(ctx, kind, in[1], nx))) ||
        (left[0] && !(w = hw_widen(ctx, kind, in[2], nw))))
        return -1;
    for (i = 0; i < 3; i++)
        if (left[i] && !(o[i] = hw_scratch(ctx, nout[i])))
            return -1;
    if ((left[2] && (rc = conv_grad_bias_of(ctx, g, kind, in[0], o[2])) != 0) ||
        (left[0] && (rc = conv_grad_input(ctx, &g2, dy, w, o[0])) != 0) ||
        (left[1] && (rc = conv_grad_weight(ctx, g, x, dy, o[1])) != 0))
        return rc;
    for (i = 0; i < 3; i++)
        if (left[i] && (rc = hw_narrow(ctx, kind, o[i], out[i], nout[i])) != 0)
            return rc;
    return 0;
}

/* conv2d_backward and conv2d_backward.padding (str_padding). */
static int conv2d_backward_run(opjit_ctx *ctx, opjit_args *a, int str_padding)
{
    DLTensor *grad = opjit_arg_tensor(a, 0);
    DLTensor *input = opjit_arg_tensor(a, 1);
    DLTensor *weight = opjit_arg_tensor(a, 2);
    DLTensor *bias = opjit_arg_tensor(a, 3);
    const void *dy, *x = NULL, *w = NULL;
    void *dx, *dw, *db;
    conv_args p;
    conv_geom g;
    int want[3], rc;

    if ((rc = conv_read_args(ctx, a, 4, str_padding, &p)) != 0 ||
        (rc = conv_check(ctx, input, weight, bias, &p, &g)) != 0 ||
        (rc = conv_check_grad(ctx, a, 8, grad, input, &g, want)) != 0)
        return rc;
    want[2] = want[2] && bias;
    if ((want[0] || want[1]) && (rc = conv_sizes_ok(ctx, &g)) != 0)
        return rc;
    if (st_dense(ctx, grad, &dy) || (want[1] && st_dense(ctx, input, &x)) ||
        (want[0] && st_dense(ctx, weight, &w)))
        return -1;
    if (conv_grad_output(ctx, 0, input, want[0], &dx) ||
        conv_grad_output(ctx, 1, weight, want[1], &dw) ||
        conv_grad_output(ctx, 2, bias ? bias : weight, want[2], &db))
        return -1;
    if (hw_kind(input->dtype)) {
        void *outs[3] = {dx, dw, db};
        const void *ins[3] = {dy, x, w};
        return conv_backward_half(ctx, &g, hw_kind(input->dtype), want, ins, outs);
    }
    if (want[2] && (rc = conv_grad_bias(ctx, &g, dy, db)) != 0)
        return rc;
    if (want[0] && want[1] && g.c > 0 && conv_folds(&g)) /* grad folded once */
        return conv_grad_folded(ctx, &g, dy, x, w, dx, dw);
    if (want[0] && (rc = conv_grad_input(ctx, &g, dy, w, dx)) != 0)
        return rc;
    if (want[1] && (rc = conv_grad_weight(ctx, &g, x, dy, dw)) != 0)
        return rc;
    return 0;
}

static int conv2d_backward_cpu(opjit_ctx *ctx, opjit_args *a)
{
    return conv2d_backward_run(ctx, a, 0);
}

static int conv2d_backward_padding_cpu(opjit_ctx *ctx, opjit_args *a)
{
    return conv2d_backward_run(ctx, a, 1);
}

OPJIT_MODULE(m)
{
    opjit_def(m, CONV2D_SCHEMA, OPJIT_CPU, conv2d_cpu,
              "2-D convolution, NCHW (torch.nn.functional.conv2d): im2col + GEMM, "
              "Winograd F(2x2, 3x3) for 3x3 stride 1 (optimizing tier, AVX-512 or AVX2)");
    conv2d_require(m, 0);
    opjit_def(m, CONV2D_PADDING_SCHEMA, OPJIT_CPU, conv2d_padding_cpu,
              "conv2d with padding=\"valid\" or \"same\" (F.conv2d's string padding)");
    conv2d_require(m, 0);
    opjit_def(m, CONV2D_BACKWARD_SCHEMA, OPJIT_CPU, conv2d_backward_cpu,
              "Gradients of conv2d: grad_input (a transposed convolution), grad_weight, "
              "grad_bias");
    conv2d_require(m, 1);
    opjit_def(m, CONV2D_BACKWARD_PADDING_SCHEMA, OPJIT_CPU, conv2d_backward_padding_cpu,
              "Gradients of conv2d.padding (padding=\"valid\" or \"same\")");
    conv2d_require(m, 1);
    conv2d_declare(m, 1);
}
