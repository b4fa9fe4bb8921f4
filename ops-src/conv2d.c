/*
 * conv2d.c - 2-D convolution on the CPU, torch.nn.functional.conv2d
 * semantics for NCHW float32 and float64.
 *
 *   conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1,
 *          int[2] padding=0, int[2] dilation=1, int groups=1) -> Tensor
 *
 * input [N, C, H, W] (or unbatched [C, H, W], as PyTorch allows), weight
 * [O, C/groups, kH, kW], bias [O]; the output is [N, O, Ho, Wo] (or
 * [O, Ho, Wo]) with Ho = (H + 2*padH - dilH*(kH-1) - 1) / strideH + 1.
 *
 * Method (Caffe's): for each image and group, unfold the input patches into
 * a [C/groups * kH * kW, Ho * Wo] column matrix in workspace memory
 * (im2col) and multiply by the group's weights [O/groups, C/groups*kH*kW]
 * with one GEMM straight into the output. A 1x1 kernel with stride 1 and
 * no padding needs no unfolding: the GEMM reads the input directly. The
 * bias is added afterwards. The GEMM is OpenBLAS's.
 *
 * float32 in the optimizing tier (gcc), on a CPU with AVX-512, has faster
 * paths (see "the optimizing tier on x86-64 with AVX-512" below):
 *  - 3x3, stride 1, dilation 1, one group (enough tiles): Winograd
 *    F(2x2, 3x3), 16 GEMMs over the transformed tiles of the whole batch,
 *    bias added in the output transform;
 *  - everything else: this file's GEMM instead of OpenBLAS's, and the
 *    im2col done in blocks of output positions that stay in L2.
 */
#ifndef FORCE_OPENBLAS_COMPLEX_STRUCT
#define FORCE_OPENBLAS_COMPLEX_STRUCT
#endif
#include <opjit_op.h>
#include <cblas.h>
#include <limits.h>
#include <string.h>

#include "conv2d_common.h"


/* Smallest q >= 0 with q * s >= num (s > 0). */
static int64_t conv_ceil_div(int64_t num, int64_t s)
{
    return num <= 0 ? 0 : (num + s - 1) / s;
}

/* im2col for one scalar type: im is [cg, H, W] of one image and group; col
 * receives [cg * kh * kw, ho * wo]. Each output row is a run of zeros, a
 * copy (strided when the stride is not 1) and a run of zeros; the bounds of
 * the valid run are computed once per kernel column, so nothing reads
 * outside im. */
#define CONV_DEFINE(T, SUF)                                                   \
    static void conv_im2col_##SUF(const conv_geom *g, const T *im, T *col)    \
    {                                                                         \
        int64_t c, ki, kj, oh, ow;                                            \
        const int64_t H = g->h, W = g->w, ho = g->ho, wo = g->wo;             \
        const int64_t sh = g->sh, sw = g->sw;                                 \
        for (c = 0; c < g->cg; c++) {                                         \
            const T *plane = im + c * H * W;                                  \
            for (ki = 0; ki < g->kh; ki++) {                                  \
                int64_t ih0 = ki * g->dh - g->ph; /* ih = oh*sh + ih0 */      \
                for (kj = 0; kj < g->kw; kj++) {                              \
                    int64_t iw0 = kj * g->dw - g->pw; /* iw = ow*sw + iw0 */  \
                    int64_t lo = conv_ceil_div(-iw0, sw);                     \
                    int64_t hi = conv_ceil_div(W - iw0, sw);                  \
                    if (hi > wo)                                              \
                        hi = wo;                                              \
                    if (lo > hi)                                              \
                        lo = hi;                                              \
                    for (oh = 0; oh < ho; oh++, col += wo) {                  \
                        int64_t ih = oh * sh + ih0;                           \
                        const T *src;                                         \
                        T *dst;                                               \
                        if (ih < 0 || ih >= H || lo == hi) {                  \
                            memset(col, 0, (size_t)wo * sizeof(T));           \
                            continue;                                         \
                        }                                                     \
                        if (lo > 0)                                           \
                            memset(col, 0, (size_t)lo * sizeof(T));           \
                        src = plane + ih * W + (lo * sw + iw0);               \
                        if (sw == 1) {                                        \
                            memcpy(col + lo, src, (size_t)(hi - lo) * sizeof(T)); \
                        } else {                                              \
                            dst = col + lo;                                   \
                            for (ow = lo; ow < hi; ow++, src += sw)           \
                                *dst++ = *src;                                \
                        }                                                     \
                        if (hi < wo)                                          \
                            memset(col + hi, 0, (size_t)(wo - hi) * sizeof(T)); \
                    }                                                         \
                }                                                             \
            }                                                                 \
        }                                                                     \
    }                                                                         \
                                                                              \
    static void conv_add_bias_##SUF(const conv_geom *g, T *out, const T *bias) \
    {                                                                         \
        int64_t n, o, e, plane = g->ho * g->wo;                               \
        for (n = 0; n < g->n; n++) {                                          \
            for (o = 0; o < g->o; o++) {                                      \
                T b = bias[o], *p = out + (n * g->o + o) * plane;             \
                for (e = 0; e < plane; e++)                                   \
                    p[e] += b;                                                \
            }                                                                 \
        }                                                                     \
    }

CONV_DEFINE(float, f32)
CONV_DEFINE(double, f64)

/* ---- the optimizing tier on x86-64 with AVX-512 ----------------------------------
 *
 * OpenBLAS runs AVX2 kernels on one core at about 100 GFLOP/s (Debian's
 * 0.3.21 does not know newer CPUs; OPENBLAS_CORETYPE may pin it too),
 * half of what AVX-512 FMA units do. With gcc, the optimizing tier adds a
 * single-precision GEMM written with GCC vector extensions (8 rows x 48
 * columns of accumulators, 24 zmm registers, about 230 GFLOP/s on the
 * bench machine), the Winograd transforms and a blocked im2col, compiled
 * for AVX-512 (target attribute) and chosen at run time when the CPU has
 * it. libtcc never sees this part; other compilers and CPUs keep the
 * OpenBLAS path. */
#if defined(OPJIT_TIER_OPT) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__TINYC__) && defined(__x86_64__)
#define CONV_FAST 1

typedef float conv_v16 __attribute__((vector_size(64), aligned(4), __may_alias__));
typedef int conv_i16 __attribute__((vector_size(64)));
/* The tier compiles with -ffp-contract=off (nms needs both tiers to round
 * alike); here a * b + c may be one FMA. */
#define CONV_AVX512 __attribute__((target("avx512f"), optimize("fp-contract=fast")))
#define CONV_LD(p) (*(const conv_v16 *)(const void *)(p))
#define CONV_ST(p, v) (*(conv_v16 *)(void *)(p) = (v))

/* Whether the CPU (and the OS) runs AVX-512 code. */
static int conv_fast_ok(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 1 : 0;
}

/* ---- GEMM ---------------------------------------------------------------------- */

/* Micro-kernels: C[8][16*NV] = A[8][K] . B[K][16*NV], row-major with
 * leading dimensions lda, ldb, ldc. Rows 0-3 of A are read through p,
 * rows 4-7 through q = p + 4*lda. */
#define CONV_R3(r, p, i)                                                      \
    a = p[(i) * lda]; c##r##0 += a * b0; c##r##1 += a * b1; c##r##2 += a * b2;
#define CONV_R2(r, p, i) a = p[(i) * lda]; c##r##0 += a * b0; c##r##1 += a * b1;
#define CONV_R1(r, p, i) a = p[(i) * lda]; c##r##0 += a * b0;
#define CONV_ROWS(R)                                                          \
    R(0, p, 0) R(1, p, 1) R(2, p, 2) R(3, p, 3)                               \
    R(4, q, 0) R(5, q, 1) R(6, q, 2) R(7, q, 3)

CONV_AVX512 static void conv_k8x48(int64_t K, const float *A, int64_t lda, const float *B,
                                   int64_t ldb, float *C, int64_t ldc)
{
    conv_v16 c00 = {0}, c01 = {0}, c02 = {0}, c10 = {0}, c11 = {0}, c12 = {0};
    conv_v16 c20 = {0}, c21 = {0}, c22 = {0}, c30 = {0}, c31 = {0}, c32 = {0};
    conv_v16 c40 = {0}, c41 = {0}, c42 = {0}, c50 = {0}, c51 = {0}, c52 = {0};
    conv_v16 c60 = {0}, c61 = {0}, c62 = {0}, c70 = {0}, c71 = {0}, c72 = {0};
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
    for (k = 0; k < K; k++, p++, q++, B += ldb) {
        conv_v16 b0 = CONV_LD(B), b1 = CONV_LD(B + 16), b2 = CONV_LD(B + 32);
        float a;
        CONV_ROWS(CONV_R3)
    }
#define CONV_S3(r) CONV_ST(C + r * ldc, c##r##0); CONV_ST(C + r * ldc + 16, c##r##1); \
    CONV_ST(C + r * ldc + 32, c##r##2);
    CONV_S3(0) CONV_S3(1) CONV_S3(2) CONV_S3(3) CONV_S3(4) CONV_S3(5) CONV_S3(6) CONV_S3(7)
#undef CONV_S3
}

CONV_AVX512 static void conv_k8x32(int64_t K, const float *A, int64_t lda, const float *B,
                                   int64_t ldb, float *C, int64_t ldc)
{
    conv_v16 c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0};
    conv_v16 c30 = {0}, c31 = {0}, c40 = {0}, c41 = {0}, c50 = {0}, c51 = {0};
    conv_v16 c60 = {0}, c61 = {0}, c70 = {0}, c71 = {0};
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
    for (k = 0; k < K; k++, p++, q++, B += ldb) {
        conv_v16 b0 = CONV_LD(B), b1 = CONV_LD(B + 16);
        float a;
        CONV_ROWS(CONV_R2)
    }
#define CONV_S2(r) CONV_ST(C + r * ldc, c##r##0); CONV_ST(C + r * ldc + 16, c##r##1);
    CONV_S2(0) CONV_S2(1) CONV_S2(2) CONV_S2(3) CONV_S2(4) CONV_S2(5) CONV_S2(6) CONV_S2(7)
#undef CONV_S2
}

CONV_AVX512 static void conv_k8x16(int64_t K, const float *A, int64_t lda, const float *B,
                                   int64_t ldb, float *C, int64_t ldc)
{
    conv_v16 c00 = {0}, c10 = {0}, c20 = {0}, c30 = {0};
    conv_v16 c40 = {0}, c50 = {0}, c60 = {0}, c70 = {0};
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
    for (k = 0; k < K; k++, p++, q++, B += ldb) {
        conv_v16 b0 = CONV_LD(B);
        float a;
        CONV_ROWS(CONV_R1)
    }
#define CONV_S1(r) CONV_ST(C + r * ldc, c##r##0);
    CONV_S1(0) CONV_S1(1) CONV_S1(2) CONV_S1(3) CONV_S1(4) CONV_S1(5) CONV_S1(6) CONV_S1(7)
#undef CONV_S1
}

/* Scratch conv_sgemm needs: a zero-padded copy of the last rows of A
 * (8 x K), of the last columns of B (K x 16) and one block of C (8 x 48). */
static size_t conv_sgemm_scratch(int64_t K)
{
    return (size_t)(8 * K + 16 * K + 8 * 48 + 16) * sizeof(float);
}

/* C (M x N) = A (M x K) . B (K x N), row-major, K >= 1. Panels of 48
 * columns (64 left: two of 32), blocks of 8 rows; the last M % 8 rows and
 * N % 16 columns go through zero-padded copies. */
CONV_AVX512 static void conv_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                                   const float *B, int64_t ldb, float *C, int64_t ldc,
                                   float *scratch)
{
    float *at = scratch, *bt = at + 8 * K, *ct = bt + 16 * K;
    int64_t mfull = M & ~(int64_t)7, nfull = N & ~(int64_t)15, i, j, r, k, w;
    /* the larger operand outermost: it is read once */
    int64_t iblk = M > N ? 8 : (M + 7) / 8 * 8, i0;
    if (M > mfull) {
        memset(at, 0, (size_t)(8 * K) * sizeof(float));
        for (r = 0; r < M - mfull; r++)
            memcpy(at + r * K, A + (mfull + r) * lda, (size_t)K * sizeof(float));
    }
    if (N > nfull) {
        memset(bt, 0, (size_t)(16 * K) * sizeof(float));
        for (k = 0; k < K; k++)
            memcpy(bt + 16 * k, B + k * ldb + nfull, (size_t)(N - nfull) * sizeof(float));
    }
    for (i0 = 0; i0 < M; i0 += iblk) {
        for (j = 0; j < N; j += w) {
            w = N - j;
            w = w == 64 ? 32 : w >= 48 ? 48 : w >= 32 ? 32 : w >= 16 ? 16 : w;
            for (i = i0; i < i0 + iblk && i < M; i += 8) {
                const float *a = i < mfull ? A + i * lda : at;
                int64_t la = i < mfull ? lda : K, rows = M - i < 8 ? M - i : 8;
                float *dst = rows == 8 && w >= 16 ? C + i * ldc + j : ct;
                int64_t ld = dst == ct ? 48 : ldc;
                if (w == 48)
                    conv_k8x48(K, a, la, B + j, ldb, dst, ld);
                else if (w == 32)
                    conv_k8x32(K, a, la, B + j, ldb, dst, ld);
                else if (w == 16)
                    conv_k8x16(K, a, la, B + j, ldb, dst, ld);
                else
                    conv_k8x16(K, a, la, bt, 16, dst, ld);
                if (dst == ct)
                    for (r = 0; r < rows; r++)
                        memcpy(C + (i + r) * ldc + j, ct + r * 48, (size_t)w * sizeof(float));
            }
        }
    }
}

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

/* U[xi][f] = (G g_f G^T)[xi] for the filters g_f = w[f], f = o * C + c,
 * G = [1 0 0; 1/2 1/2 1/2; 1/2 -1/2 1/2; 0 0 1], 16 filters at a time:
 * filter f's 9 taps are the first lanes of a load at w + 9 f; a 16 x 16
 * transpose in registers makes vectors of one tap across the 16 filters,
 * which G then combines. The last block reads a zero-padded copy. */
CONV_AVX512 static void conv_wino_weights(const float *w, int64_t nf, float *u, int64_t ups)
{
    const conv_i16 lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const conv_i16 hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const conv_i16 lo4 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
    const conv_i16 hi4 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
    const conv_i16 lo2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    const conv_i16 hi2 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
    const conv_i16 lo1 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
    const conv_i16 hi1 = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
    float gt[16 * 9 + 16], tv[16];
    int64_t f0, xi;
    for (f0 = 0; f0 < nf; f0 += 16) {
        int64_t cnt = nf - f0 < 16 ? nf - f0 : 16;
        const float *g = w + f0 * 9;
        conv_v16 r0, r1, r2, r3, r4, r5, r6, r7, r8, r9, r10, r11, r12, r13, r14, r15, p, q;
        conv_v16 s[4][3], o[16];
        int b, i;
        if (f0 + 16 >= nf) { /* loads of the last filters would run past w */
            memset(gt, 0, sizeof gt);
            memcpy(gt, g, (size_t)(cnt * 9) * sizeof(float));
            g = gt;
        }
        r0 = CONV_LD(g); r1 = CONV_LD(g + 9); r2 = CONV_LD(g + 18); r3 = CONV_LD(g + 27);
        r4 = CONV_LD(g + 36); r5 = CONV_LD(g + 45); r6 = CONV_LD(g + 54); r7 = CONV_LD(g + 63);
        r8 = CONV_LD(g + 72); r9 = CONV_LD(g + 81); r10 = CONV_LD(g + 90);
        r11 = CONV_LD(g + 99); r12 = CONV_LD(g + 108); r13 = CONV_LD(g + 117);
        r14 = CONV_LD(g + 126); r15 = CONV_LD(g + 135);
        /* rows a and a + h exchange blocks of h lanes, h = 8, 4, 2, 1 */
#define CONV_TR(a, c, lo, hi)                                                 \
    p = a;                                                                    \
    q = c;                                                                    \
    a = __builtin_shuffle(p, q, lo);                                          \
    c = __builtin_shuffle(p, q, hi);
        CONV_TR(r0, r8, lo8, hi8) CONV_TR(r1, r9, lo8, hi8) CONV_TR(r2, r10, lo8, hi8)
        CONV_TR(r3, r11, lo8, hi8) CONV_TR(r4, r12, lo8, hi8) CONV_TR(r5, r13, lo8, hi8)
        CONV_TR(r6, r14, lo8, hi8) CONV_TR(r7, r15, lo8, hi8)
        CONV_TR(r0, r4, lo4, hi4) CONV_TR(r1, r5, lo4, hi4) CONV_TR(r2, r6, lo4, hi4)
        CONV_TR(r3, r7, lo4, hi4) CONV_TR(r8, r12, lo4, hi4) CONV_TR(r9, r13, lo4, hi4)
        CONV_TR(r10, r14, lo4, hi4) CONV_TR(r11, r15, lo4, hi4)
        CONV_TR(r0, r2, lo2, hi2) CONV_TR(r1, r3, lo2, hi2) CONV_TR(r4, r6, lo2, hi2)
        CONV_TR(r5, r7, lo2, hi2) CONV_TR(r8, r10, lo2, hi2) CONV_TR(r9, r11, lo2, hi2)
        CONV_TR(r12, r14, lo2, hi2) CONV_TR(r13, r15, lo2, hi2)
        CONV_TR(r0, r1, lo1, hi1) CONV_TR(r2, r3, lo1, hi1) CONV_TR(r4, r5, lo1, hi1)
        CONV_TR(r6, r7, lo1, hi1) CONV_TR(r8, r9, lo1, hi1)
#undef CONV_TR
        (void)r10; (void)r11; (void)r12; (void)r13; (void)r14; (void)r15;
        /* r0 .. r8: taps 3a + b, a the row; s = G g, then (G g) G^T */
        {
            conv_v16 t[9];
            t[0] = r0; t[1] = r1; t[2] = r2; t[3] = r3; t[4] = r4;
            t[5] = r5; t[6] = r6; t[7] = r7; t[8] = r8;
            for (b = 0; b < 3; b++) {
                conv_v16 e = t[b] + t[6 + b];
                s[0][b] = t[b];
                s[1][b] = 0.5f * (e + t[3 + b]);
                s[2][b] = 0.5f * (e - t[3 + b]);
                s[3][b] = t[6 + b];
            }
        }
        for (i = 0; i < 4; i++) {
            conv_v16 e = s[i][0] + s[i][2];
            o[4 * i] = s[i][0];
            o[4 * i + 1] = 0.5f * (e + s[i][1]);
            o[4 * i + 2] = 0.5f * (e - s[i][1]);
            o[4 * i + 3] = s[i][2];
        }
        if (cnt == 16) {
            for (xi = 0; xi < 16; xi++)
                CONV_ST(u + xi * ups + f0, o[xi]);
        } else {
            for (xi = 0; xi < 16; xi++) {
                CONV_ST(tv, o[xi]);
                memcpy(u + xi * ups + f0, tv, (size_t)cnt * sizeof(float));
            }
        }
    }
}

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
 * B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], 16 tiles at a time. Per
 * channel, the rows the runs read are copied into rb (wp floats a row,
 * input column 0 at rb column pw, the rest zeros from the start), so
 * padding and partial tiles read zeros. A run's last block may write up
 * to 15 columns past the run: the next run overwrites them, and ldv
 * leaves room after the last. */
CONV_AVX512 static void conv_wino_input(const conv_geom *g, const float *x, const conv_seg *segs,
                                        int64_t nseg, const int64_t *rows, int64_t nrows,
                                        float *v, int64_t ldv, int64_t cs, float *rb,
                                        int64_t wp)
{
    const conv_i16 ev = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const conv_i16 od = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
    const int64_t H = g->h, W = g->w, C = g->c;
    const size_t wb = (size_t)W * sizeof(float);
    int64_t s, c, l, k;
    for (c = 0; c <= C; c++) {
        /* rows of channel c into buffer c % 2, then channel c - 1's tiles
         * from the other buffer: no load right behind the copy's stores */
        float *rc = rb + (c & 1) * nrows * wp, *rp = rb + ((c - 1) & 1) * nrows * wp;
        if (c < C) {
            const float *plane = x + c * H * W;
            const conv_v16 zv = {0};
            for (k = 0; k < nrows; k++) {
                float *d = rc + k * wp + g->pw;
                const float *src = plane + (rows[k] >= 0 ? rows[k] : 0);
                int64_t q;
                if (W < 16) {
                    if (rows[k] >= 0)
                        memcpy(d, src, wb);
                    else
                        memset(d, 0, wb);
                } else if (rows[k] >= 0) { /* the last vector overlaps */
                    for (q = 0; q + 16 < W; q += 16)
                        CONV_ST(d + q, CONV_LD(src + q));
                    CONV_ST(d + W - 16, CONV_LD(src + W - 16));
                } else {
                    for (q = 0; q + 16 < W; q += 16)
                        CONV_ST(d + q, zv);
                    CONV_ST(d + W - 16, zv);
                }
            }
        }
        if (c == 0)
            continue;
        for (s = 0; s < nseg; s++) {
            const conv_seg *sg = &segs[s];
            const float *r0 = rp + sg->row * wp + 2 * sg->tx0;
            float *vc = v + (c - 1) * ldv + sg->pos;
            int64_t nb = (sg->cnt + 15) / 16;
            for (l = 0; l < nb; l++) {
                const float *r = r0 + 32 * l;
                float *o = vc + 16 * l;
                conv_v16 a0, a1, b0, b1, d0, d1, d2, d3;
                conv_v16 t00, t01, t02, t03, t10, t11, t12, t13;
                conv_v16 t20, t21, t22, t23, t30, t31, t32, t33;
#define CONV_IN_ROW(i)                                                        \
    a0 = CONV_LD(r + (i) * wp);                                               \
    a1 = CONV_LD(r + (i) * wp + 16);                                          \
    b0 = CONV_LD(r + (i) * wp + 2);                                           \
    b1 = CONV_LD(r + (i) * wp + 18);                                          \
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
    CONV_ST(o + (j) * cs, t0##j - t2##j);                                     \
    CONV_ST(o + (4 + j) * cs, t1##j + t2##j);                                 \
    CONV_ST(o + (8 + j) * cs, t2##j - t1##j);                                 \
    CONV_ST(o + (12 + j) * cs, t1##j - t3##j);
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
CONV_AVX512 static void conv_wino_output(const conv_geom *g, const float *m, int64_t ldm, int64_t xs,
                                         const conv_seg *segs, int64_t nseg, int64_t o0,
                                         int64_t oc, const float *bias, float *y)
{
    const conv_i16 il = {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23};
    const conv_i16 ih = {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31};
    const int64_t O = g->o, Ho = g->ho, Wo = g->wo;
    float tmp[32];
    int64_t o, s, l;
    for (o = o0; o < o0 + oc; o++) {
        const float *mo = m + (o - o0) * ldm;
        float bo = bias ? bias[o] : 0.0f;
        for (s = 0; s < nseg; s++) {
            const conv_seg *sg = &segs[s];
            int64_t nb = (sg->cnt + 15) / 16, oy = 2 * sg->ty;
            float *y0 = y + ((sg->n * O + o) * Ho + oy) * Wo, *y1 = y0 + Wo;
            int two = oy + 1 < Ho;
            for (l = 0; l < nb; l++) {
                const float *mp = mo + sg->pos + 16 * l;
                conv_v16 s00, s01, s02, s03, s10, s11, s12, s13, r00, r01, r10, r11, z0, z1;
                int64_t ox = 2 * (sg->tx0 + 16 * l), nx = Wo - ox;
                int64_t lim = 2 * (sg->cnt - 16 * l); /* columns of this block's tiles */
                if (nx > lim)
                    nx = lim;
#define CONV_OUT_COL(j)                                                       \
    {                                                                         \
        conv_v16 m0 = CONV_LD(mp + (j) * xs), m1 = CONV_LD(mp + (4 + j) * xs); \
        conv_v16 m2 = CONV_LD(mp + (8 + j) * xs), m3 = CONV_LD(mp + (12 + j) * xs); \
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
                if (nx >= 32) {
                    CONV_ST(y0 + ox, z0);
                    CONV_ST(y0 + ox + 16, z1);
                } else {
                    CONV_ST(tmp, z0);
                    CONV_ST(tmp + 16, z1);
                    memcpy(y0 + ox, tmp, (size_t)nx * sizeof(float));
                }
                if (!two)
                    continue;
                z0 = __builtin_shuffle(r10, r11, il);
                z1 = __builtin_shuffle(r10, r11, ih);
                if (nx >= 32) {
                    CONV_ST(y1 + ox, z0);
                    CONV_ST(y1 + ox + 16, z1);
                } else {
                    CONV_ST(tmp, z0);
                    CONV_ST(tmp + 16, z1);
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

/* The whole convolution, float32, batch included. Returns 0, or -1 when
 * the workspace could not be had (the runtime recorded why). */
static int conv_wino_f32(opjit_ctx *ctx, const conv_geom *g, const float *x, const float *w,
                         const float *bias, float *y)
{
    const int64_t C = g->c, O = g->o;
    const int64_t th = (g->ho + 1) / 2, tw = (g->wo + 1) / 2, tiles = g->n * th * tw;
    const int64_t ob = conv_wino_oblock(g), tc = conv_wino_chunk(g, tiles, ob);
    int64_t ldv = tc + 16, ldm = tc + 16, wp = (2 * tw + 48 + 15) / 16 * 16;
    /* runs a chunk: a partial tile row at each end, whole ones between */
    int64_t nseg_max = tc / tw + 2, nrows_max = 4 * nseg_max;
    int64_t ups, vps, mps, p0, o0, xi, nrows, nseg;
    size_t nu, nv, nm, nr, bytes;
    float *u, *v, *m, *rb, *scr;
    int64_t *rows;
    conv_seg *segs;
    char *base;
    /* Leading dimensions that are multiples of 1 KiB alias in the caches. */
    if (ldv % 256 == 0)
        ldv += 16;
    if (ldm % 256 == 0)
        ldm += 16;
    /* The 16 planes of U, V and M: 64 bytes more than their size apart, so
     * that the 16 streams a transform reads or writes use different sets. */
    ups = ob * C + 16;
    vps = C * ldv + 16;
    mps = ob * ldm + 16;
    nu = (size_t)(16 * ups);
    nv = (size_t)(16 * vps);
    nm = (size_t)(16 * mps);
    nr = (size_t)(2 * nrows_max * wp);
    bytes = (nu + nv + nm + nr) * sizeof(float) + nseg_max * sizeof(conv_seg) +
            nrows_max * sizeof(int64_t) + 6 * 64 + conv_sgemm_scratch(C);
    base = (char *)opjit_workspace(ctx, bytes);
    if (!base)
        return -1;
#define CONV_CARVE(ptr, type, n)                                              \
    ptr = (type *)base;                                                       \
    base += ((size_t)(n) * sizeof(type) + 63) / 64 * 64;
    CONV_CARVE(u, float, nu)
    CONV_CARVE(v, float, nv)
    CONV_CARVE(m, float, nm)
    CONV_CARVE(rb, float, nr)
    CONV_CARVE(segs, conv_seg, nseg_max)
    CONV_CARVE(rows, int64_t, nrows_max)
    scr = (float *)base;
#undef CONV_CARVE
    memset(rb, 0, nr * sizeof(float));
    if (ob == O)
        conv_wino_weights(w, O * C, u, ups);
    for (p0 = 0; p0 < tiles; p0 += tc) {
        int64_t nt = tiles - p0 < tc ? tiles - p0 : tc, ntp = (nt + 15) / 16 * 16;
        nseg = conv_wino_segs(g, p0, nt, th, tw, segs, rows, &nrows);
        conv_wino_input(g, x, segs, nseg, rows, nrows, v, ldv, vps, rb, wp);
        if (ntp > nt) { /* finite values in the padding columns */
            int64_t r;
            for (r = 0; r < 16 * C; r++)
                memset(v + (r / C) * vps + (r % C) * ldv + nt, 0,
                       (size_t)(ntp - nt) * sizeof(float));
        }
        for (o0 = 0; o0 < O; o0 += ob) {
            int64_t oc = O - o0 < ob ? O - o0 : ob;
            if (ob < O)
                conv_wino_weights(w + o0 * C * 9, oc * C, u, ups);
            for (xi = 0; xi < 16; xi++)
                conv_sgemm(oc, ntp, C, u + xi * ups, C, v + xi * vps, ldv, m + xi * mps, ldm,
                           scr);
            conv_wino_output(g, m, ldm, mps, segs, nseg, o0, oc, bias, y);
        }
    }
    return 0;
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
           conv_sgemm_scratch(kdim) / sizeof(float);
}

/* The unfolded input for output positions p0 .. p0 + np - 1 (p = oh * wo
 * + ow): col[(c * kh + ki) * kw + kj][p - p0], rows ldc >= np + 16 apart.
 * Each output row's run is zeros, a copy (vector loads for strides 1 and
 * 2) and zeros, written left to right in whole vectors, so a vector that
 * runs past a run is overwritten by the next (or lands in the slack). A
 * copy that could read past the input tensor (xend) is done one by one. */
CONV_AVX512 static void conv_im2col_blk(const conv_geom *g, const float *im, const float *xend,
                                        int64_t p0, int64_t np, float *col, int64_t ldc)
{
    const conv_i16 ev = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
    const conv_v16 zv = {0};
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
                        for (q = owa; q < owb; q += 16)
                            CONV_ST(d + q, zv);
                        continue;
                    }
                    for (q = owa; q < a; q += 16)
                        CONV_ST(d + q, zv);
                    s = plane + ih * W + (a * sw + iw0); /* ow = a */
                    if (sw == 1 && s + (b - a) + 16 <= xend) {
                        for (q = a; q < b; q += 16)
                            CONV_ST(d + q, CONV_LD(s + (q - a)));
                    } else if (sw == 2 && s + 2 * (b - a) + 32 <= xend) {
                        for (q = a; q < b; q += 16)
                            CONV_ST(d + q, __builtin_shuffle(CONV_LD(s + 2 * (q - a)),
                                                             CONV_LD(s + 2 * (q - a) + 16), ev));
                    } else {
                        for (q = a; q < b; q++)
                            d[q] = s[(q - a) * sw];
                    }
                    for (q = b; q < owb; q += 16)
                        CONV_ST(d + q, zv);
                }
            }
        }
    }
}

/* One image and group: out (og x plane) = w (og x kdim) . im2col(im), a
 * block of output positions at a time. ws: conv_col_floats() floats. */
static void conv_im2col_gemm_f32(const conv_geom *g, const float *im, const float *xend,
                                 const float *w, float *out, float *ws)
{
    const int64_t kdim = g->cg * g->kh * g->kw, plane = g->ho * g->wo;
    const int64_t pb = conv_col_block(kdim, plane), ldc = conv_col_ld(kdim, plane);
    int64_t p0;
    for (p0 = 0; p0 < plane; p0 += pb) {
        int64_t np = plane - p0 < pb ? plane - p0 : pb;
        conv_im2col_blk(g, im, xend, p0, np, ws, ldc);
        conv_sgemm(g->og, np, kdim, w, kdim, ws, ldc, out + p0, plane, ws + kdim * ldc + 16);
    }
}
#endif /* CONV_FAST */

static int conv2d_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *input = opjit_arg_tensor(a, 0);
    DLTensor *weight = opjit_arg_tensor(a, 1);
    DLTensor *bias = opjit_arg_tensor(a, 2);
    int64_t shape[4], kdim, plane;
    int64_t n, grp;
    conv_geom g;
    DLTensor *out;
    int is64, batched, direct, fast = 0, rc;
    size_t esz, colsz, scrsz = 0;
    void *col = NULL;
    char *outp;
    const char *inp, *wp;
#ifdef CONV_FAST
    const float *xend;
#endif

    if ((rc = conv_check(ctx, a, input, weight, bias, &g)) != 0)
        return rc;
    is64 = g.is64;
    batched = g.batched;
    grp = g.groups;

    kdim = g.cg * g.kh * g.kw;
    plane = g.ho * g.wo;
    if (plane > INT_MAX || kdim > INT_MAX || g.og > INT_MAX ||
        g.h * g.w > INT_MAX)
        return opjit_fail(ctx, "sizes too large for BLAS (output plane %lld, "
                               "patch size %lld)", (long long)plane, (long long)kdim);

    if (batched) {
        shape[0] = g.n; shape[1] = g.o; shape[2] = g.ho; shape[3] = g.wo;
        out = opjit_output(ctx, 0, input->dtype, 4, shape);
    } else {
        shape[0] = g.o; shape[1] = g.ho; shape[2] = g.wo;
        out = opjit_output(ctx, 0, input->dtype, 3, shape);
    }
    if (!out)
        return -1;
    if (g.n == 0)
        return 0;
    esz = is64 ? sizeof(double) : sizeof(float);
    outp = (char *)opjit_data(out);

    if (kdim == 0) { /* no input channels: the output is the bias, or 0 */
        memset(outp, 0, (size_t)(g.n * g.o * plane) * esz);
    } else {
#ifdef CONV_FAST
        fast = !is64 && conv_fast_ok();
        /* Winograd for 3x3, stride 1, dilation 1, one group, with enough
         * tiles (2x2 outputs) to repay transforming the weights; channels
         * bounded so the workspace stays within about 64 MB. im2col and
         * GEMM otherwise. */
        if (fast && g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 &&
            g.dw == 1 && grp == 1 && g.c <= 4096 && g.o * g.c <= ((int64_t)1 << 20) &&
            g.n * ((g.ho + 1) / 2) * ((g.wo + 1) / 2) >= 32) {
            if (conv_wino_f32(ctx, &g, (const float *)opjit_data(input),
                              (const float *)opjit_data(weight),
                              bias ? (const float *)opjit_data(bias) : NULL, (float *)outp))
                return opjit_fail(ctx, "out of memory for the Winograd workspace");
            return 0; /* bias included */
        }
#else
        (void)fast;
#endif
        direct = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 &&
                 g.pw == 0;
        if ((uint64_t)kdim * (uint64_t)plane > ((uint64_t)1 << 60) / esz)
            return opjit_fail(ctx, "im2col buffer too large");
        colsz = direct ? 0 : (size_t)(kdim * plane) * esz;
        colsz = (colsz + 63) / 64 * 64;
#ifdef CONV_FAST
        if (fast) { /* im2col in blocks; the GEMM's scratch */
            if (!direct)
                colsz = conv_col_floats(kdim, plane) * sizeof(float);
            scrsz = conv_sgemm_scratch(kdim);
        }
#endif
        if (colsz + scrsz > 0) {
            col = opjit_workspace(ctx, colsz + scrsz);
            if (!col)
                return opjit_fail(ctx, "out of memory for a %lldx%lld im2col "
                                       "buffer", (long long)kdim, (long long)plane);
        }
        inp = (const char *)opjit_data(input);
        wp = (const char *)opjit_data(weight);
#ifdef CONV_FAST
        xend = (const float *)inp + g.n * g.c * g.h * g.w;
#endif
        for (n = 0; n < g.n; n++) {
            int64_t gi;
            for (gi = 0; gi < grp; gi++) {
                const char *im = inp + (size_t)((n * g.c + gi * g.cg) * g.h * g.w) * esz;
                const char *wg = wp + (size_t)(gi * g.og * kdim) * esz;
                char *og = outp + (size_t)((n * g.o + gi * g.og) * plane) * esz;
                const void *b = im;
#ifdef CONV_FAST
                if (fast && !direct) {
                    conv_im2col_gemm_f32(&g, (const float *)im, xend, (const float *)wg,
                                         (float *)og, (float *)col);
                    continue;
                }
#endif
                if (!direct) {
                    if (is64)
                        conv_im2col_f64(&g, (const double *)im, (double *)col);
                    else
                        conv_im2col_f32(&g, (const float *)im, (float *)col);
                    b = col;
                }
                if (is64)
                    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g.og,
                                (int)plane, (int)kdim, 1.0, (const double *)wg,
                                (int)kdim, (const double *)b, (int)plane, 0.0,
                                (double *)og, (int)plane);
#ifdef CONV_FAST
                else if (fast)
                    conv_sgemm(g.og, plane, kdim, (const float *)wg, kdim, (const float *)b,
                               plane, (float *)og, plane, (float *)((char *)col + colsz));
#endif
                else
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g.og,
                                (int)plane, (int)kdim, 1.0f, (const float *)wg,
                                (int)kdim, (const float *)b, (int)plane, 0.0f,
                                (float *)og, (int)plane);
            }
        }
    }
    if (bias) {
        if (is64)
            conv_add_bias_f64(&g, (double *)outp, (const double *)opjit_data(bias));
        else
            conv_add_bias_f32(&g, (float *)outp, (const float *)opjit_data(bias));
    }
    return 0;
}

OPJIT_MODULE(conv2d, m)
{
    opjit_def(m,
              "conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, "
              "int[2] padding=0, int[2] dilation=1, int groups=1) -> Tensor",
              OPJIT_CPU, conv2d_cpu,
              "2-D convolution, NCHW (torch.nn.functional.conv2d): im2col + GEMM, "
              "Winograd F(2x2, 3x3) for 3x3 stride 1 (optimizing tier, AVX-512)");
    opjit_require(m, "input", "float32|float64 contiguous");
    opjit_require(m, "weight", "float32|float64 rank=4 contiguous");
    opjit_require(m, "bias", "float32|float64 rank=1 contiguous");
}
