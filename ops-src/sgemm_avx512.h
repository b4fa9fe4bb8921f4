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

/* Micro-kernels: C[8][16*NV] = A[8][K] . B[K][16*NV] (acc: C +=, the
 * chains of fused multiply-adds starting from C instead of 0), B and C
 * row-major with leading dimensions ldb, ldc; A's element (i, k) at
 * A[i * lda + k * aks] (aks 1: row-major; lda 1: a transposed view, read
 * without a copy). Rows 0-3 of A are read through p, rows 4-7 through
 * q = p + 4*lda. */
#define SG_I(r, v) (acc ? SG_LD(C + (r) * ldc + 16 * (v)) : z)
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
SG_AVX512 static void sg_k8x48(int64_t K, const float *A, int64_t lda, int64_t aks,
                                   const float *B,
                                   int64_t ldb, float *C, int64_t ldc, int pf, int acc)
{
    const sg_v16 z = {0};
    sg_v16 c00 = SG_I(0, 0), c01 = SG_I(0, 1), c02 = SG_I(0, 2), c10 = SG_I(1, 0);
    sg_v16 c11 = SG_I(1, 1), c12 = SG_I(1, 2), c20 = SG_I(2, 0), c21 = SG_I(2, 1);
    sg_v16 c22 = SG_I(2, 2), c30 = SG_I(3, 0), c31 = SG_I(3, 1), c32 = SG_I(3, 2);
    sg_v16 c40 = SG_I(4, 0), c41 = SG_I(4, 1), c42 = SG_I(4, 2), c50 = SG_I(5, 0);
    sg_v16 c51 = SG_I(5, 1), c52 = SG_I(5, 2), c60 = SG_I(6, 0), c61 = SG_I(6, 1);
    sg_v16 c62 = SG_I(6, 2), c70 = SG_I(7, 0), c71 = SG_I(7, 1), c72 = SG_I(7, 2);
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
    if (pf)
        for (k = 0; k < K; k++, p += aks, q += aks, B += ldb) {
            sg_v16 b0 = SG_LD(B), b1 = SG_LD(B + 16), b2 = SG_LD(B + 32);
            float a;
            __builtin_prefetch(B + 48);
            __builtin_prefetch(B + 64);
            __builtin_prefetch(B + 80);
            SG_ROWS(SG_R3)
        }
    else
        for (k = 0; k < K; k++, p += aks, q += aks, B += ldb) {
            sg_v16 b0 = SG_LD(B), b1 = SG_LD(B + 16), b2 = SG_LD(B + 32);
            float a;
            SG_ROWS(SG_R3)
        }
#define SG_S3(r) SG_ST(C + r * ldc, c##r##0); SG_ST(C + r * ldc + 16, c##r##1); \
    SG_ST(C + r * ldc + 32, c##r##2);
    SG_S3(0) SG_S3(1) SG_S3(2) SG_S3(3) SG_S3(4) SG_S3(5) SG_S3(6) SG_S3(7)
#undef SG_S3
}

SG_AVX512 static void sg_k8x32(int64_t K, const float *A, int64_t lda, int64_t aks,
                                   const float *B,
                                   int64_t ldb, float *C, int64_t ldc, int acc)
{
    const sg_v16 z = {0};
    sg_v16 c00 = SG_I(0, 0), c01 = SG_I(0, 1), c10 = SG_I(1, 0), c11 = SG_I(1, 1);
    sg_v16 c20 = SG_I(2, 0), c21 = SG_I(2, 1), c30 = SG_I(3, 0), c31 = SG_I(3, 1);
    sg_v16 c40 = SG_I(4, 0), c41 = SG_I(4, 1), c50 = SG_I(5, 0), c51 = SG_I(5, 1);
    sg_v16 c60 = SG_I(6, 0), c61 = SG_I(6, 1), c70 = SG_I(7, 0), c71 = SG_I(7, 1);
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
    for (k = 0; k < K; k++, p += aks, q += aks, B += ldb) {
        sg_v16 b0 = SG_LD(B), b1 = SG_LD(B + 16);
        float a;
        SG_ROWS(SG_R2)
    }
#define SG_S2(r) SG_ST(C + r * ldc, c##r##0); SG_ST(C + r * ldc + 16, c##r##1);
    SG_S2(0) SG_S2(1) SG_S2(2) SG_S2(3) SG_S2(4) SG_S2(5) SG_S2(6) SG_S2(7)
#undef SG_S2
}

SG_AVX512 static void sg_k8x16(int64_t K, const float *A, int64_t lda, int64_t aks,
                                   const float *B,
                                   int64_t ldb, float *C, int64_t ldc, int acc)
{
    const sg_v16 z = {0};
    sg_v16 c00 = SG_I(0, 0), c10 = SG_I(1, 0), c20 = SG_I(2, 0), c30 = SG_I(3, 0);
    sg_v16 c40 = SG_I(4, 0), c50 = SG_I(5, 0), c60 = SG_I(6, 0), c70 = SG_I(7, 0);
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
    for (k = 0; k < K; k++, p += aks, q += aks, B += ldb) {
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

/* C (M x N) = A (M x K) . B (K x N), or with acc C += A . B (each element's
 * chain of fused multiply-adds continues from C's value: splitting K into
 * calls with acc gives the bits of one call); A's element (i, k) at
 * A[i * lda + k * aks], B and C row-major, K >= 1. Panels of 48 columns
 * (64 left: two of 32), blocks of 8 rows; the last M % 8 rows and N % 16
 * columns go through zero-padded copies. */
SG_AVX512 static void sg_gemm_ex(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                                     int64_t aks, const float *B, int64_t ldb, float *C,
                                     int64_t ldc, float *scratch, int acc)
{
    float *at = scratch, *bt = at + 8 * K, *ct = bt + 16 * K;
    int64_t mfull = M & ~(int64_t)7, nfull = N & ~(int64_t)15, i, j, r, k, w;
    /* the larger operand outermost: it is read once */
    int64_t iblk = M > N ? 8 : (M + 7) / 8 * 8, i0;
    if (M > mfull) {
        memset(at, 0, (size_t)(8 * K) * sizeof(float));
        for (r = 0; r < M - mfull; r++) {
            const float *row = A + (mfull + r) * lda;
            if (aks == 1)
                memcpy(at + r * K, row, (size_t)K * sizeof(float));
            else
                for (k = 0; k < K; k++)
                    at[r * K + k] = row[k * aks];
        }
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
                int64_t la = i < mfull ? lda : K, ka = i < mfull ? aks : 1;
                int64_t rows = M - i < 8 ? M - i : 8;
                float *dst = rows == 8 && w >= 16 ? C + i * ldc + j : ct;
                int64_t ld = dst == ct ? 48 : ldc;
                if (dst == ct && acc) /* the partial block's values, to go on from */
                    for (r = 0; r < 8; r++)
                        if (r < rows)
                            memcpy(ct + r * 48, C + (i + r) * ldc + j, (size_t)w * sizeof(float));
                if (w == 48) /* the first block of rows fetches the next panel */
                    sg_k8x48(K, a, la, ka, B + j, ldb, dst, ld, i == i0 && j + 48 < N, acc);
                else if (w == 32)
                    sg_k8x32(K, a, la, ka, B + j, ldb, dst, ld, acc);
                else if (w == 16)
                    sg_k8x16(K, a, la, ka, B + j, ldb, dst, ld, acc);
                else
                    sg_k8x16(K, a, la, ka, bt, 16, dst, ld, acc);
                if (dst == ct)
                    for (r = 0; r < rows; r++)
                        memcpy(C + (i + r) * ldc + j, ct + r * 48, (size_t)w * sizeof(float));
            }
        }
    }
}

/* sg_gemm_ex of a row-major A (aks 1). */
SG_AVX512 static void sg_gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                                  const float *B, int64_t ldb, float *C, int64_t ldc,
                                  float *scratch, int acc)
{
    sg_gemm_ex(M, N, K, A, lda, 1, B, ldb, C, ldc, scratch, acc);
}

/* C (M x N) = A (M x K) . B (K x N): sg_gemm without acc. */
SG_AVX512 static void sg_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                                   const float *B, int64_t ldb, float *C, int64_t ldc,
                                   float *scratch)
{
    sg_gemm(M, N, K, A, lda, B, ldb, C, ldc, scratch, 0);
}

/* dst (cols x rows, leading dimension ldd) = src (rows x cols, lds)
 * transposed: 16 x 16 blocks in registers, the edges one by one. */
SG_AVX512 static void sg_transpose(const float *src, int64_t lds, int64_t rows, int64_t cols,
                                       float *dst, int64_t ldd)
{
    const sg_i16 lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const sg_i16 hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const sg_i16 lo4 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
    const sg_i16 hi4 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
    const sg_i16 lo2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    const sg_i16 hi2 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
    const sg_i16 lo1 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
    const sg_i16 hi1 = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
    int64_t r0, c0, r, c;
    for (r0 = 0; r0 + 16 <= rows; r0 += 16) {
        for (c0 = 0; c0 + 16 <= cols; c0 += 16) {
            const float *s = src + r0 * lds + c0;
            sg_v16 v0 = SG_LD(s), v1 = SG_LD(s + lds), v2 = SG_LD(s + 2 * lds);
            sg_v16 v3 = SG_LD(s + 3 * lds), v4 = SG_LD(s + 4 * lds), v5 = SG_LD(s + 5 * lds);
            sg_v16 v6 = SG_LD(s + 6 * lds), v7 = SG_LD(s + 7 * lds), v8 = SG_LD(s + 8 * lds);
            sg_v16 v9 = SG_LD(s + 9 * lds), v10 = SG_LD(s + 10 * lds);
            sg_v16 v11 = SG_LD(s + 11 * lds), v12 = SG_LD(s + 12 * lds);
            sg_v16 v13 = SG_LD(s + 13 * lds), v14 = SG_LD(s + 14 * lds);
            sg_v16 v15 = SG_LD(s + 15 * lds), p, q;
            /* rows a and a + h exchange blocks of h lanes, h = 8, 4, 2, 1 */
#define SG_TR(a, b, lo, hi)                                                   \
    p = a;                                                                    \
    q = b;                                                                    \
    a = __builtin_shuffle(p, q, lo);                                          \
    b = __builtin_shuffle(p, q, hi);
            SG_TR(v0, v8, lo8, hi8) SG_TR(v1, v9, lo8, hi8) SG_TR(v2, v10, lo8, hi8)
            SG_TR(v3, v11, lo8, hi8) SG_TR(v4, v12, lo8, hi8) SG_TR(v5, v13, lo8, hi8)
            SG_TR(v6, v14, lo8, hi8) SG_TR(v7, v15, lo8, hi8)
            SG_TR(v0, v4, lo4, hi4) SG_TR(v1, v5, lo4, hi4) SG_TR(v2, v6, lo4, hi4)
            SG_TR(v3, v7, lo4, hi4) SG_TR(v8, v12, lo4, hi4) SG_TR(v9, v13, lo4, hi4)
            SG_TR(v10, v14, lo4, hi4) SG_TR(v11, v15, lo4, hi4)
            SG_TR(v0, v2, lo2, hi2) SG_TR(v1, v3, lo2, hi2) SG_TR(v4, v6, lo2, hi2)
            SG_TR(v5, v7, lo2, hi2) SG_TR(v8, v10, lo2, hi2) SG_TR(v9, v11, lo2, hi2)
            SG_TR(v12, v14, lo2, hi2) SG_TR(v13, v15, lo2, hi2)
            SG_TR(v0, v1, lo1, hi1) SG_TR(v2, v3, lo1, hi1) SG_TR(v4, v5, lo1, hi1)
            SG_TR(v6, v7, lo1, hi1) SG_TR(v8, v9, lo1, hi1) SG_TR(v10, v11, lo1, hi1)
            SG_TR(v12, v13, lo1, hi1) SG_TR(v14, v15, lo1, hi1)
#undef SG_TR
            {
                float *d = dst + c0 * ldd + r0;
                SG_ST(d, v0); SG_ST(d + ldd, v1); SG_ST(d + 2 * ldd, v2);
                SG_ST(d + 3 * ldd, v3); SG_ST(d + 4 * ldd, v4); SG_ST(d + 5 * ldd, v5);
                SG_ST(d + 6 * ldd, v6); SG_ST(d + 7 * ldd, v7); SG_ST(d + 8 * ldd, v8);
                SG_ST(d + 9 * ldd, v9); SG_ST(d + 10 * ldd, v10); SG_ST(d + 11 * ldd, v11);
                SG_ST(d + 12 * ldd, v12); SG_ST(d + 13 * ldd, v13);
                SG_ST(d + 14 * ldd, v14); SG_ST(d + 15 * ldd, v15);
            }
        }
        for (c = c0; c < cols; c++)
            for (r = r0; r < r0 + 16; r++)
                dst[c * ldd + r] = src[r * lds + c];
    }
    for (r = r0; r < rows; r++)
        for (c = 0; c < cols; c++)
            dst[c * ldd + r] = src[r * lds + c];
}


#endif /* SG_FAST */

#endif
