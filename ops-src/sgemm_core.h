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
#include <unistd.h>

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
/* Micro-kernels are functions of their own: inlined into the driver they
 * lose registers to it and reload pointers from the stack every step. */
#define SG_NOINLINE __attribute__((noinline))
/* One micro-kernel's loop over k, NV vectors of B a row. */
#define SG_LOOP(NV, B_LOAD, EXTRA)                                          \
    _Pragma("GCC unroll 4")                                                   \
    for (k = 0; k < K; k++, p += aks, q += aks, B += ldb) {                 \
        B_LOAD                                                              \
        float a;                                                            \
        EXTRA                                                               \
        SG_ROWS(SG_R##NV)                                                   \
    }

/* pf (unless NULL): also prefetch 3 vectors of floats from pf every pfe
 * steps of k (pfe >= 1), rows ldpf apart: a slice of the next panel of B
 * read in place, whose rows are far apart (a 1x1 convolution's input), so
 * that the next call does not wait on memory row by row. bw (unless NULL;
 * then pf is): also store each row of B read (K x 3W): the panel packed
 * on the way (SG_PACK), its loads' misses hidden behind the products,
 * where a loop of its own waited on them (256->64 1x1 convolution, one
 * image in L3: 4% faster). */
SG_TGT SG_NOINLINE static void sg_k3(int64_t K, const float *A, int64_t lda, int64_t aks,
                                     const float *B, int64_t ldb, float *C, int64_t ldc,
                                     const float *pf, int64_t ldpf, int64_t pfe, float *bw,
                                     int acc)
{
    const sg_v z = {0};
    SG_EACH(SG_D3)
    const float *p = A, *q = A + 4 * lda;
    int64_t k, due = 1;
#define SG_B3 sg_v b0 = SG_LD(B), b1 = SG_LD(B + SG_W), b2 = SG_LD(B + 2 * SG_W);
#define SG_PF                                                                 \
    __builtin_prefetch(pf);                                                   \
    __builtin_prefetch(pf + 16);                                              \
    __builtin_prefetch(pf + 3 * SG_W - 1);                                    \
    pf += ldpf;
/* with SG_PACK into L2: the panel in L1 is the packed one, and the rows
 * read in place may be 4 KB apart (a matrix of 1024 columns), all in one
 * set of L1 */
#define SG_PFE                                                                \
    if (--due == 0) {                                                         \
        due = pfe;                                                            \
        __builtin_prefetch(pf, 0, SG_PACK ? 2 : 3);                           \
        __builtin_prefetch(pf + 16, 0, SG_PACK ? 2 : 3);                      \
        __builtin_prefetch(pf + 3 * SG_W - 1, 0, SG_PACK ? 2 : 3);           \
        pf += ldpf;                                                           \
    }
#define SG_BW                                                                 \
    SG_ST(bw, b0);                                                            \
    SG_ST(bw + SG_W, b1);                                                     \
    SG_ST(bw + 2 * SG_W, b2);                                                 \
    bw += 3 * SG_W;
    if (pf && pfe > 1)
        SG_LOOP(3, SG_B3, SG_PFE)
    else if (pf)
        SG_LOOP(3, SG_B3, SG_PF)
    else if (bw)
        SG_LOOP(3, SG_B3, SG_BW)
    else
        SG_LOOP(3, SG_B3, )
#undef SG_B3
#undef SG_PF
#undef SG_PFE
#undef SG_BW
    (void)q;
    SG_EACH(SG_S3)
}

SG_TGT SG_NOINLINE static void sg_k2(int64_t K, const float *A, int64_t lda, int64_t aks,
                                     const float *B, int64_t ldb, float *C, int64_t ldc, int acc)
{
    const sg_v z = {0};
    SG_EACH(SG_D2)
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
    SG_LOOP(2, sg_v b0 = SG_LD(B); sg_v b1 = SG_LD(B + SG_W);, )
    (void)q;
    SG_EACH(SG_S2)
}

SG_TGT SG_NOINLINE static void sg_k1(int64_t K, const float *A, int64_t lda, int64_t aks,
                                     const float *B, int64_t ldb, float *C, int64_t ldc, int acc)
{
    const sg_v z = {0};
    SG_EACH(SG_D1)
    const float *p = A, *q = A + 4 * lda;
    int64_t k;
    SG_LOOP(1, sg_v b0 = SG_LD(B);, )
    (void)q;
    SG_EACH(SG_S1)
}

/* Blocking, by what measured faster (issue 26; the bench machine runs
 * 256-bit and 512-bit FMAs at the same rate):
 *  - SG_PACK (AVX2): steps of SG_KC of k, each panel of B packed (SG_KC x
 *    3W floats, 24 KB) to stay in L1 while blocks of sg_mc() rows run
 *    over it (their rows of A copied, SG_LDA apart, into L2) while the
 *    next panel is prefetched into L2: OpenBLAS's and oneDNN's way;
 *  - otherwise (AVX-512, 3 vectors of 64 bytes a row of B): B read in
 *    place, the next panel prefetched, all of k at once; with more rows
 *    than columns each block of MR rows runs over every panel (its rows of
 *    A stay in L1), else each panel over every row. */
#define SG_KC (2048 / SG_W)
/* SG_PACK: a block of rows of A (sg_mc() x SG_KC), rows SG_LDA apart: not a
 * multiple of 1 KB, so that a micro-kernel's rows do not share the sets
 * of L1 as rows of a large matrix (lda 2-8 KB) do. */
#define SG_LDA (SG_KC + 16)

/* SG_PACK: rows of A a block, whose copy stays in L2 while every panel of
 * B runs over it: the most, a power of two up to 1024, whose copy fills at
 * most 55% of this core's L2 (glibc's figure, read at process start): 512
 * rows (557 KB) for 1 MB (Zen 4 and 5), 256 for 512 KB (Zen 3), 128 for
 * 256 KB. Taller blocks pack each panel of B fewer times: 512 rows, not
 * 256, took 2048 x 2048 from 0.94-0.97x oneDNN's AVX2 GEMM to 0.975-0.988x
 * at 1 thread and 1.00-1.02x at 2 on a 1 MB L2 (256, not 128: 2-3% on
 * 1024 x 1024). Only which rows run together changes, never an element's
 * chain over k: the bits are the same whatever the L2. */
static int64_t sg_mc(void)
{
    long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    int64_t mc = 64;
    if (l2 <= 0)
        return 256;
    while (mc < 1024 && (size_t)(2 * mc * SG_LDA) * sizeof(float) * 20 <= (size_t)l2 * 11)
        mc *= 2;
    return mc;
}

/* Scratch sg_gemm_ex needs: a zero-padded copy of the last rows of A
 * (MR x K), one packed panel of B (KC x 3W; without SG_PACK the last
 * N % W columns, K x W) and one block of C (MR x 3W). */
#define SG_PANEL(K) (SG_PACK ? SG_KC * 3 * SG_W : (K) * SG_W)
#define SG_ABLK (SG_PACK ? sg_mc() * SG_LDA : 0)
static size_t sg_sgemm_scratch(int64_t K)
{
    return (size_t)(SG_MR * K + SG_PANEL(K) + SG_MR * 3 * SG_W + SG_ABLK + 16) * sizeof(float);
}

/* The last M % MR rows of A into at (MR x K, zero-padded). */
static void sg_tail_rows(int64_t M, int64_t K, const float *A, int64_t lda, int64_t aks,
                         float *at)
{
    int64_t mfull = M - M % SG_MR, r, k;
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

/* kc rows of w columns of B into bp (kc x wp, wp = w rounded up to W,
 * zero-padded): read once, in L1 for every block of rows after; the next
 * panel is fetched meanwhile. */
SG_TGT static void sg_pack(const float *B, int64_t ldb, int64_t kc, int64_t w, float *bp,
                           int64_t wp)
{
    int64_t k, c;
    if (w == wp) {
        for (k = 0; k < kc; k++, B += ldb, bp += wp) {
            /* the next panel's rows, far apart when B is read in place: in
             * cache when it is packed after this one's products */
            __builtin_prefetch(B + wp);
            __builtin_prefetch(B + 2 * wp - 1);
            for (c = 0; c < wp; c += SG_W)
                SG_ST(bp + c, SG_LD(B + c));
        }
        return;
    }
    for (k = 0; k < kc; k++, B += ldb, bp += wp)
        for (c = 0; c < wp; c++)
            bp[c] = c < w ? B[c] : 0.0f;
}

/* Rows [i0, i1) of C's columns [j, j + w) += or = A . the panel bp (kc x
 * wp, rows ldbp apart) for k in [k0, k0 + kc); at holds A's last rows (K
 * apart). bin (unless NULL, a full panel of 3W columns): the panel
 * unpacked (rows ldin apart), which the first micro-kernel reads and packs
 * into bw, which is bp. pf (unless NULL): the next panel of B, rows ldpf
 * apart, a slice of its rows prefetched by each micro-kernel, so that its
 * misses to memory spread over the panel's products instead of queueing
 * in one (256->64 1x1 convolution, batch 8: 5% faster), by the
 * micro-kernel as it goes (sg_k3's pf, a row every pfe steps of k: 1.5%
 * faster than the same prefetches in a burst before it, with SG_PACK or
 * without). */
SG_TGT static void sg_rows(int64_t i0, int64_t i1, int64_t j, int64_t w, int64_t M, int64_t K,
                           int64_t k0, int64_t kc, const float *A, int64_t lda, int64_t aks,
                           const float *at, const float *bp, int64_t wp, int64_t ldbp,
                           const float *bin, int64_t ldin, float *bw, const float *pf,
                           int64_t ldpf,
                           float *C, int64_t ldc, float *ct, int acc)
{
    const int64_t ldt = 3 * SG_W, mfull = M - M % SG_MR;
    const int64_t nk = (i1 - i0 + SG_MR - 1) / SG_MR, slice = (kc + nk - 1) / nk;
    int64_t i, r, t, kk;
    const float *pft;
    int in_k3;
    for (i = i0; i < i1; i += SG_MR) {
        const float *a = i < mfull ? A + i * lda + k0 * aks : at + k0;
        int64_t la = i < mfull ? lda : K, ka = i < mfull ? aks : 1;
        int64_t rows = M - i < SG_MR ? M - i : SG_MR;
        float *dst = rows == SG_MR && w == wp ? C + i * ldc + j : ct;
        int64_t ld = dst == ct ? ldt : ldc;
        if (dst == ct && acc) /* the partial block's values, to go on from */
            for (r = 0; r < rows; r++)
                memcpy(ct + r * ldt, C + (i + r) * ldc + j, (size_t)w * sizeof(float));
        /* this micro-kernel's slice of the next panel: by sg_k3 as it goes,
         * else (the first with SG_PACK, which packs; narrower panels) into
         * L2 before it */
        t = (i - i0) / SG_MR;
        pft = pf && t * slice < kc ? pf + t * slice * ldpf : NULL;
        in_k3 = pft && wp == 3 * SG_W && !(bin && i == i0);
        if (SG_PACK && pft && !in_k3)
            for (kk = t * slice; kk < (t + 1) * slice && kk < kc; kk++) {
                __builtin_prefetch(pf + kk * ldpf, 0, 2);
                __builtin_prefetch(pf + kk * ldpf + 16, 0, 2);
                __builtin_prefetch(pf + kk * ldpf + 3 * SG_W - 1, 0, 2);
            }
        if (bin && i == i0)
            sg_k3(kc, a, la, ka, bin, ldin, dst, ld, NULL, 0, 1, bw, acc);
        else if (wp == 3 * SG_W)
            sg_k3(kc, a, la, ka, bp, ldbp, dst, ld, in_k3 ? pft : NULL, ldpf,
                  (kc + slice - 1) / slice, NULL, acc);
        else if (wp == 2 * SG_W)
            sg_k2(kc, a, la, ka, bp, ldbp, dst, ld, acc);
        else
            sg_k1(kc, a, la, ka, bp, ldbp, dst, ld, acc);
        if (dst == ct)
            for (r = 0; r < rows; r++)
                memcpy(C + (i + r) * ldc + j, ct + r * ldt, (size_t)w * sizeof(float));
    }
}

/* C (M x N) = A (M x K) . B (K x N), or with acc C += A . B (each element's
 * chain of fused multiply-adds continues from C's value: splitting K into
 * calls with acc gives the bits of one call, which is how the steps of k
 * go); A's element (i, k) at A[i * lda + k * aks], B and C row-major,
 * K >= 1. Panels of 3 vectors of columns (4 left: two of 2), blocks of MR
 * rows (see SG_PACK above: without it, blocks of MR rows over every panel
 * when M > N, else each panel over every row: a 1x1 convolution's, whose
 * next panel is fetched from memory a slice by each block of rows, 1-5%
 * faster than blocks of rows over panels, which wrote C as a few streams
 * but fetched the whole input in a first pass of one block of rows); the
 * last M % MR rows and N % W columns go through zero-padded copies. */
SG_TGT static void sg_gemm_ex(int64_t M, int64_t N, int64_t K, const float *A, int64_t lda,
                              int64_t aks, const float *B, int64_t ldb, float *C, int64_t ldc,
                              float *scratch, int acc)
{
    const int64_t W = SG_W, nfull = N - N % SG_W;
    const int64_t kb = SG_PACK ? SG_KC : K;
    const int64_t mb = SG_PACK ? sg_mc() : M > N ? SG_MR : M;
    float *at = scratch, *bp = at + SG_MR * K, *ct = bp + SG_PANEL(K);
    float *ab = ct + SG_MR * 3 * SG_W; /* SG_PACK: the block of rows of A */
    const int64_t mfull = M - M % SG_MR;
    /* SG_PACK: A's rows already one block, in a row (a convolution's
     * weights, K <= SG_KC): read in place, not copied for every call */
    const int a_in_place = SG_PACK && aks == 1 && lda == K && K <= SG_KC;
    int64_t k0, i0, j, w, r, k;
    if (M % SG_MR)
        sg_tail_rows(M, K, A, lda, aks, at);
    if (!SG_PACK && N > nfull) /* the last columns, once */
        sg_pack(B + nfull, ldb, K, N - nfull, bp, W);
    for (k0 = 0; k0 < K; k0 += kb) {
        int64_t kc = K - k0 < kb ? K - k0 : kb;
        for (i0 = 0; i0 < M; i0 += mb) {
            int64_t i1 = M - i0 < mb ? M : i0 + mb;
            if (SG_PACK && !a_in_place) /* its whole rows, read by every panel after */
                for (r = i0; r < (i1 < mfull ? i1 : mfull); r++) {
                    const float *src = A + r * lda + k0 * aks;
                    float *dst = ab + (r - i0) * SG_LDA;
                    if (aks == 1)
                        memcpy(dst, src, (size_t)kc * sizeof(float));
                    else
                        for (k = 0; k < kc; k++)
                            dst[k] = src[k * aks];
                }
            for (j = 0; j < N; j += w) {
                int64_t wp, pack;
                const float *pf;
                w = N - j;
                w = w == 4 * W ? 2 * W : w >= 3 * W ? 3 * W : w >= 2 * W ? 2 * W : w >= W ? W : w;
                wp = (w + W - 1) / W * W;
                pack = SG_PACK || w < W;
                /* The next panel: this block's, else the next block's first,
                 * else the columns after N (the next call's, when a 1x1
                 * convolution walks a plane in blocks; 1-3% at batch 8;
                 * a prefetch past the end of B is harmless). */
                if (SG_PACK)
                    pf = B + k0 * ldb + (j + w < N ? j + w : i1 < M ? 0 : N);
                else /* read in place: by the first block of rows only (M >
                      * N: the others find it in L2; prefetching it into L1
                      * for each block of MR rows evicted the panel being
                      * read: 1x1 256->64, batch 8, 4%) */
                    pf = !pack && i0 == 0 ? B + k0 * ldb + j + 3 * W : NULL;
                if (SG_PACK && w < 3 * W) /* a full panel: packed by its first kernel */
                    sg_pack(B + k0 * ldb + j, ldb, kc, w, bp, wp);
                if (SG_PACK) /* rows of the block from 0: A its copy (k from 0) */
                    sg_rows(0, i1 - i0, j, w, M - i0, K, 0, kc,
                            a_in_place ? A + i0 * lda : ab, a_in_place ? lda : SG_LDA, 1,
                            at + k0, bp, wp, wp, w == 3 * W ? B + k0 * ldb + j : NULL, ldb, bp,
                            pf, ldb, C + i0 * ldc, ldc, ct, acc || k0 > 0);
                else
                    sg_rows(i0, i1, j, w, M, K, k0, kc, A, lda, aks, at,
                            pack ? bp : B + k0 * ldb + j, wp, pack ? wp : ldb, NULL, 0, NULL,
                            pf, ldb, C, ldc, ct, acc || k0 > 0);
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
