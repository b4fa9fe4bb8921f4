/*
 * ops-src/sgemm_avx512.h - a single-precision GEMM for the optimizing tier
 * on x86-64 CPUs with AVX-512, shared by conv2d.c and mm.c. A local
 * header: the cache keys of both include it.
 *
 * Defines SG_FAST when the compiler can build it (gcc, the optimizing
 * tier, x86-64); sg_fast_ok() says whether this CPU runs it. libtcc never
 * sees it.
 *
 * Every element of C is one chain of fused multiply-adds over k = 0, 1,
 * ..., K-1 starting from 0, whatever the micro-kernel, panel or block that
 * computes it: splitting C among threads in any way gives the same bits.
 */
#ifndef SGEMM_AVX512_H
#define SGEMM_AVX512_H

#include <string.h>

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
#define SG_FAST 1

typedef float sg_v16 __attribute__((vector_size(64), aligned(4), __may_alias__));
typedef int sg_i16 __attribute__((vector_size(64)));
/* The tier compiles with -ffp-contract=off (nms needs both tiers to round
 * alike); here a * b + c may be one FMA. */
#define SG_AVX512 __attribute__((target("avx512f"), optimize("fp-contract=fast")))
#define SG_LD(p) (*(const sg_v16 *)(const void *)(p))
#define SG_ST(p, v) (*(sg_v16 *)(void *)(p) = (v))

/* Whether the CPU (and the OS) runs AVX-512 code. */
static int sg_fast_ok(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") ? 1 : 0;
}

/* ---- GEMM ---------------------------------------------------------------------- */

/* Micro-kernels: C[8][16*NV] = A[8][K] . B[K][16*NV], row-major with
 * leading dimensions lda, ldb, ldc. Rows 0-3 of A are read through p,
 * rows 4-7 through q = p + 4*lda. */
#define SG_R3(r, p, i)                                                      \
    a = p[(i) * lda]; c##r##0 += a * b0; c##r##1 += a * b1; c##r##2 += a * b2;
#define SG_R2(r, p, i) a = p[(i) * lda]; c##r##0 += a * b0; c##r##1 += a * b1;
#define SG_R1(r, p, i) a = p[(i) * lda]; c##r##0 += a * b0;
#define SG_ROWS(R)                                                          \
    R(0, p, 0) R(1, p, 1) R(2, p, 2) R(3, p, 3)                               \
    R(4, q, 0) R(5, q, 1) R(6, q, 2) R(7, q, 3)

/* pf: also prefetch the next 48 columns of B (the next panel), whose rows
 * are far apart when B is not packed (a 1x1 convolution reads the input
 * in place), so that the next call does not wait on memory row by row. */
SG_AVX512 static void sg_k8x48(int64_t K, const float *A, int64_t lda, const float *B,
                                   int64_t ldb, float *C, int64_t ldc, int pf)
{
    sg_v16 c00 = {0}, c01 = {0}, c02 = {0}, c10 = {0}, c11 = {0}, c12 = {0};
    sg_v16 c20 = {0}, c21 = {0}, c22 = {0}, c30 = {0}, c31 = {0}, c32 = {0};
    sg_v16 c40 = {0}, c41 = {0}, c42 = {0}, c50 = {0}, c51 = {0}, c52 = {0};
    sg_v16 c60 = {0}, c61 = {0}, c62 = {0}, c70 = {0}, c71 = {0}, c72 = {0};
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
    if (pf)
        for (k = 0; k < K; k++, p++, q++, B += ldb) {
            sg_v16 b0 = SG_LD(B), b1 = SG_LD(B + 16), b2 = SG_LD(B + 32);
            float a;
            __builtin_prefetch(B + 48);
            __builtin_prefetch(B + 64);
            __builtin_prefetch(B + 80);
            SG_ROWS(SG_R3)
        }
    else
        for (k = 0; k < K; k++, p++, q++, B += ldb) {
            sg_v16 b0 = SG_LD(B), b1 = SG_LD(B + 16), b2 = SG_LD(B + 32);
            float a;
            SG_ROWS(SG_R3)
        }
#define SG_S3(r) SG_ST(C + r * ldc, c##r##0); SG_ST(C + r * ldc + 16, c##r##1); \
    SG_ST(C + r * ldc + 32, c##r##2);
    SG_S3(0) SG_S3(1) SG_S3(2) SG_S3(3) SG_S3(4) SG_S3(5) SG_S3(6) SG_S3(7)
#undef SG_S3
}

SG_AVX512 static void sg_k8x32(int64_t K, const float *A, int64_t lda, const float *B,
                                   int64_t ldb, float *C, int64_t ldc)
{
    sg_v16 c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0};
    sg_v16 c30 = {0}, c31 = {0}, c40 = {0}, c41 = {0}, c50 = {0}, c51 = {0};
    sg_v16 c60 = {0}, c61 = {0}, c70 = {0}, c71 = {0};
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
    for (k = 0; k < K; k++, p++, q++, B += ldb) {
        sg_v16 b0 = SG_LD(B), b1 = SG_LD(B + 16);
        float a;
        SG_ROWS(SG_R2)
    }
#define SG_S2(r) SG_ST(C + r * ldc, c##r##0); SG_ST(C + r * ldc + 16, c##r##1);
    SG_S2(0) SG_S2(1) SG_S2(2) SG_S2(3) SG_S2(4) SG_S2(5) SG_S2(6) SG_S2(7)
#undef SG_S2
}

SG_AVX512 static void sg_k8x16(int64_t K, const float *A, int64_t lda, const float *B,
                                   int64_t ldb, float *C, int64_t ldc)
{
    sg_v16 c00 = {0}, c10 = {0}, c20 = {0}, c30 = {0};
    sg_v16 c40 = {0}, c50 = {0}, c60 = {0}, c70 = {0};
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
    for (k = 0; k < K; k++, p++, q++, B += ldb) {
        sg_v16 b0 = SG_LD(B);
        float a;
        SG_ROWS(SG_R1)
    }
#define SG_S1(r) SG_ST(C + r * ldc, c##r##0);
    SG_S1(0) SG_S1(1) SG_S1(2) SG_S1(3) SG_S1(4) SG_S1(5) SG_S1(6) SG_S1(7)
#undef SG_S1
}

/* Scratch sg_sgemm needs: a zero-padded copy of the last rows of A
 * (8 x K), of the last columns of B (K x 16) and one block of C (8 x 48). */
static size_t sg_sgemm_scratch(int64_t K)
{
    return (size_t)(8 * K + 16 * K + 8 * 48 + 16) * sizeof(float);
}

/* C (M x N) = A (M x K) . B (K x N), row-major, K >= 1. Panels of 48
 * columns (64 left: two of 32), blocks of 8 rows; the last M % 8 rows and
 * N % 16 columns go through zero-padded copies. */
SG_AVX512 static void sg_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
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
                if (w == 48) /* the first block of rows fetches the next panel */
                    sg_k8x48(K, a, la, B + j, ldb, dst, ld, i == i0 && j + 48 < N);
                else if (w == 32)
                    sg_k8x32(K, a, la, B + j, ldb, dst, ld);
                else if (w == 16)
                    sg_k8x16(K, a, la, B + j, ldb, dst, ld);
                else
                    sg_k8x16(K, a, la, bt, 16, dst, ld);
                if (dst == ct)
                    for (r = 0; r < rows; r++)
                        memcpy(C + (i + r) * ldc + j, ct + r * 48, (size_t)w * sizeof(float));
            }
        }
    }
}


#endif /* SG_FAST */

#endif
