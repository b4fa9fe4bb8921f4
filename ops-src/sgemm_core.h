/*
 * ops-src/sgemm_core.h - the single-precision GEMM of the optimizing tier,
 * written once for any vector width; included by the header of one
 * instruction set (sgemm_avx512.h, sgemm_avx2.h), which defines first:
 *
 *   SG_W      floats a vector (16, 8)       sg_v, sg_vi  its float and int vectors
 *   SG_MR     rows of C a micro-kernel computes (8, 4)
 *   SG_TGT    the attributes of every vector function
 *   SG_LD/SG_ST  unaligned vector load and store
 *   sg_tr_block  a W x W transpose in registers
 *
 * A micro-kernel holds SG_MR rows x 3 vectors of C in registers (AVX-512:
 * 8 x 48, 24 of 32 zmm; AVX2: 4 x 24, 12 of 16 ymm, oneDNN's AVX2 shape),
 * reading one vector row of B and one element of each row of A per k.
 *
 * Every element of C is one chain of fused multiply-adds over k = 0, 1,
 * ..., K-1 starting from 0, whatever the micro-kernel, panel or block that
 * computes it (or the vector width): splitting C among threads in any way,
 * or another instruction set, gives the same bits.
 */
#ifndef SGEMM_CORE_H
#define SGEMM_CORE_H

#include <string.h>

/* Micro-kernels: C[MR][W*NV] = A[MR][K] . B[K][W*NV] (acc: C +=, the
 * chains of fused multiply-adds starting from C instead of 0), B and C
 * row-major with leading dimensions ldb, ldc; A's element (i, k) at
 * A[i * lda + k * aks] (aks 1: row-major; lda 1: a transposed view, read
 * without a copy). Rows 0-3 of A are read through p, rows 4-7 through
 * q = p + 4*lda. */
#define SG_I(r, v) (acc ? SG_LD(C + (r) * ldc + SG_W * (v)) : z)
#define SG_R3(r, p, i)                                                      \
    a = p[(i) * lda]; c##r##0 += a * b0; c##r##1 += a * b1; c##r##2 += a * b2;
#define SG_R2(r, p, i) a = p[(i) * lda]; c##r##0 += a * b0; c##r##1 += a * b1;
#define SG_R1(r, p, i) a = p[(i) * lda]; c##r##0 += a * b0;
#define SG_D3(r) sg_v c##r##0 = SG_I(r, 0), c##r##1 = SG_I(r, 1), c##r##2 = SG_I(r, 2);
#define SG_D2(r) sg_v c##r##0 = SG_I(r, 0), c##r##1 = SG_I(r, 1);
#define SG_D1(r) sg_v c##r##0 = SG_I(r, 0);
#define SG_S3(r) SG_ST(C + (r) * ldc, c##r##0); SG_ST(C + (r) * ldc + SG_W, c##r##1); \
    SG_ST(C + (r) * ldc + 2 * SG_W, c##r##2);
#define SG_S2(r) SG_ST(C + (r) * ldc, c##r##0); SG_ST(C + (r) * ldc + SG_W, c##r##1);
#define SG_S1(r) SG_ST(C + (r) * ldc, c##r##0);
#if SG_MR == 8
#define SG_EACH(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7)
#define SG_ROWS(R)                                                          \
    R(0, p, 0) R(1, p, 1) R(2, p, 2) R(3, p, 3)                               \
    R(4, q, 0) R(5, q, 1) R(6, q, 2) R(7, q, 3)
#else
#define SG_EACH(M) M(0) M(1) M(2) M(3)
#define SG_ROWS(R) R(0, p, 0) R(1, p, 1) R(2, p, 2) R(3, p, 3)
#endif
/* One micro-kernel's loop over k, NV vectors of B a row. */
#define SG_LOOP(NV, B_LOAD, EXTRA)                                          \
    for (k = 0; k < K; k++, p += aks, q += aks, B += ldb) {                 \
        B_LOAD                                                              \
        float a;                                                            \
        EXTRA                                                               \
        SG_ROWS(SG_R##NV)                                                   \
    }

/* pf: also prefetch the next 3 vectors of columns of B (the next panel),
 * whose rows are far apart when B is not packed (a 1x1 convolution reads
 * the input in place), so that the next call does not wait on memory row
 * by row. */
SG_TGT static void sg_k3(int64_t K, const float *A, int64_t lda, int64_t aks, const float *B,
                         int64_t ldb, float *C, int64_t ldc, int pf, int acc)
{
    const sg_v z = {0};
    SG_EACH(SG_D3)
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
#define SG_B3 sg_v b0 = SG_LD(B), b1 = SG_LD(B + SG_W), b2 = SG_LD(B + 2 * SG_W);
    if (pf)
        SG_LOOP(3, SG_B3, __builtin_prefetch(B + 3 * SG_W);
                __builtin_prefetch(B + 3 * SG_W + 16); __builtin_prefetch(B + 6 * SG_W - 1);)
    else
        SG_LOOP(3, SG_B3, )
#undef SG_B3
    (void)q;
    SG_EACH(SG_S3)
}

SG_TGT static void sg_k2(int64_t K, const float *A, int64_t lda, int64_t aks, const float *B,
                         int64_t ldb, float *C, int64_t ldc, int acc)
{
    const sg_v z = {0};
    SG_EACH(SG_D2)
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
    SG_LOOP(2, sg_v b0 = SG_LD(B); sg_v b1 = SG_LD(B + SG_W);, )
    (void)q;
    SG_EACH(SG_S2)
}

SG_TGT static void sg_k1(int64_t K, const float *A, int64_t lda, int64_t aks, const float *B,
                         int64_t ldb, float *C, int64_t ldc, int acc)
{
    const sg_v z = {0};
    SG_EACH(SG_D1)
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
    SG_LOOP(1, sg_v b0 = SG_LD(B);, )
    (void)q;
    SG_EACH(SG_S1)
}

/* Scratch sg_sgemm needs: a zero-padded copy of the last rows of A
 * (MR x K), of the last columns of B (K x W) and one block of C (MR x 3W). */
static size_t sg_sgemm_scratch(int64_t K)
{
    return (size_t)(SG_MR * K + SG_W * K + SG_MR * 3 * SG_W + 16) * sizeof(float);
}

/* Copy the last M % MR rows of A and the last N % W columns of B into
 * zero-padded blocks (at: MR x K, bt: K x W). */
static void sg_tails(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda, int64_t aks,
                     const float *B, int64_t ldb, float *at, float *bt)
{
    int64_t mfull = M - M % SG_MR, nfull = N - N % SG_W, r, k;
    if (M > mfull) {
        memset(at, 0, (size_t)(SG_MR * K) * sizeof(float));
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
        memset(bt, 0, (size_t)(SG_W * K) * sizeof(float));
        for (k = 0; k < K; k++)
            memcpy(bt + SG_W * k, B + k * ldb + nfull, (size_t)(N - nfull) * sizeof(float));
    }
}

/* C (M x N) = A (M x K) . B (K x N), or with acc C += A . B (each element's
 * chain of fused multiply-adds continues from C's value: splitting K into
 * calls with acc gives the bits of one call); A's element (i, k) at
 * A[i * lda + k * aks], B and C row-major, K >= 1. Panels of 3 vectors of
 * columns (4 left: two of 2), blocks of MR rows; the last M % MR rows and
 * N % W columns go through zero-padded copies. */
SG_TGT static void sg_gemm_ex(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                              int64_t aks, const float *B, int64_t ldb, float *C, int64_t ldc,
                              float *scratch, int acc)
{
    const int64_t W = SG_W, ldt = 3 * SG_W;
    float *at = scratch, *bt = at + SG_MR * K, *ct = bt + SG_W * K;
    int64_t mfull = M - M % SG_MR, i, j, r, w;
    /* the larger operand outermost: it is read once */
    int64_t iblk = M > N ? SG_MR : (M + SG_MR - 1) / SG_MR * SG_MR, i0;
    sg_tails(M, N, K, A, lda, aks, B, ldb, at, bt);
    for (i0 = 0; i0 < M; i0 += iblk) {
        for (j = 0; j < N; j += w) {
            w = N - j;
            w = w == 4 * W ? 2 * W : w >= 3 * W ? 3 * W : w >= 2 * W ? 2 * W : w >= W ? W : w;
            for (i = i0; i < i0 + iblk && i < M; i += SG_MR) {
                const float *a = i < mfull ? A + i * lda : at;
                int64_t la = i < mfull ? lda : K, ka = i < mfull ? aks : 1;
                int64_t rows = M - i < SG_MR ? M - i : SG_MR;
                float *dst = rows == SG_MR && w >= W ? C + i * ldc + j : ct;
                int64_t ld = dst == ct ? ldt : ldc;
                if (dst == ct && acc) /* the partial block's values, to go on from */
                    for (r = 0; r < rows; r++)
                        memcpy(ct + r * ldt, C + (i + r) * ldc + j, (size_t)w * sizeof(float));
                if (w == 3 * W) /* the first block of rows fetches the next panel */
                    sg_k3(K, a, la, ka, B + j, ldb, dst, ld, i == i0 && j + 3 * W < N, acc);
                else if (w == 2 * W)
                    sg_k2(K, a, la, ka, B + j, ldb, dst, ld, acc);
                else if (w == W)
                    sg_k1(K, a, la, ka, B + j, ldb, dst, ld, acc);
                else
                    sg_k1(K, a, la, ka, bt, W, dst, ld, acc);
                if (dst == ct)
                    for (r = 0; r < rows; r++)
                        memcpy(C + (i + r) * ldc + j, ct + r * ldt, (size_t)w * sizeof(float));
            }
        }
    }
}

/* sg_gemm_ex of a row-major A (aks 1). */
SG_TGT static void sg_gemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                           const float *B, int64_t ldb, float *C, int64_t ldc, float *scratch,
                           int acc)
{
    sg_gemm_ex(M, N, K, A, lda, 1, B, ldb, C, ldc, scratch, acc);
}

/* C (M x N) = A (M x K) . B (K x N): sg_gemm without acc. */
SG_TGT static void sg_sgemm(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                            const float *B, int64_t ldb, float *C, int64_t ldc, float *scratch)
{
    sg_gemm(M, N, K, A, lda, B, ldb, C, ldc, scratch, 0);
}

/* dst (cols x rows, leading dimension ldd) = src (rows x cols, lds)
 * transposed: W x W blocks in registers (sg_tr_block), the edges one by
 * one. */
SG_TGT static void sg_transpose(const float *src, int64_t lds, int64_t rows, int64_t cols,
                                float *dst, int64_t ldd)
{
    int64_t r0, c0, r, c;
    for (r0 = 0; r0 + SG_W <= rows; r0 += SG_W) {
        for (c0 = 0; c0 + SG_W <= cols; c0 += SG_W)
            sg_tr_block(src + r0 * lds + c0, lds, dst + c0 * ldd + r0, ldd);
        for (c = c0; c < cols; c++)
            for (r = r0; r < r0 + SG_W; r++)
                dst[c * ldd + r] = src[r * lds + c];
    }
    for (r = r0; r < rows; r++)
        for (c = 0; c < cols; c++)
            dst[c * ldd + r] = src[r * lds + c];
}

#undef SG_I
#undef SG_R3
#undef SG_R2
#undef SG_R1
#undef SG_D3
#undef SG_D2
#undef SG_D1
#undef SG_S3
#undef SG_S2
#undef SG_S1
#undef SG_EACH
#undef SG_ROWS
#undef SG_LOOP

#endif
