/*
 * ops-src/sgemm_avx512.h - the optimizing tier's single-precision GEMM
 * (sgemm_core.h) and vector helpers for x86-64 CPUs with AVX-512, shared
 * by conv2d.c and mm.c. A local header: the cache keys of both include it.
 *
 * Defines SG_FAST (and SG_W 16) when the compiler builds it: gcc, the
 * optimizing tier, compiling for x86-64-v4 (the tier's -march, which is
 * the CPU level in the artifact's key: the code never meets a CPU without
 * AVX-512; OPJIT_CPU_LEVEL=avx2 or portable builds the lower levels).
 * sgemm_avx2.h is the same for x86-64-v3. libtcc never sees it.
 */
#ifndef SGEMM_AVX512_H
#define SGEMM_AVX512_H

/* ---- the optimizing tier on x86-64 with AVX-512 ----------------------------------
 *
 * OpenBLAS runs AVX2 kernels on one core at about 100 GFLOP/s (Debian's
 * 0.3.21 does not know newer CPUs; OPENBLAS_CORETYPE may pin it too),
 * half of what AVX-512 FMA units do. With gcc, the optimizing tier adds a
 * single-precision GEMM written with GCC vector extensions (8 rows x 48
 * columns of accumulators, 24 zmm registers, about 230 GFLOP/s on the
 * bench machine), the Winograd transforms and a blocked im2col. */
#if defined(OPJIT_TIER_OPT) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__TINYC__) && defined(__x86_64__) && defined(__AVX512F__)
#define SG_FAST 1
#include "cpu_features.h"
#define SG_W 16
#define SG_PACK 0 /* sgemm_core.h: pack the panels of B */
#define SG_MR 8
#define SG_ISA "avx512"

typedef float sg_v __attribute__((vector_size(64), aligned(4), __may_alias__));
typedef int sg_vi __attribute__((vector_size(64)));
/* The tier compiles with -ffp-contract=off (nms needs both tiers to round
 * alike); here a * b + c may be one FMA. */
#define SG_TGT __attribute__((optimize("fp-contract=fast")))
#define SG_LD(p) (*(const sg_v *)(const void *)(p))
#define SG_ST(p, v) (*(sg_v *)(void *)(p) = (v))
/* Lanes 0, 2, 4, ... and 1, 3, 5, ... of two vectors; the first halves of
 * two vectors interleaved (a0 b0 a1 b1 ...), and their second halves. */
#define SG_EVEN {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30}
#define SG_ODD {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31}
#define SG_ILO {0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23}
#define SG_IHI {8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31}

/* Whether the CPU (and the OS) runs this code: what -march promised. */
static int sg_fast_ok(void) { return CPU_HAS(AVX512F, "avx512f") ? 1 : 0; }

/* v (16 vectors of 16) transposed in place: rows a and a + h exchange
 * blocks of h lanes, h = 8, 4, 2, 1. */
SG_TGT static inline void sg_tr16(sg_v v[16])
{
    const sg_vi lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
    const sg_vi hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
    const sg_vi lo4 = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
    const sg_vi hi4 = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
    const sg_vi lo2 = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
    const sg_vi hi2 = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
    const sg_vi lo1 = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
    const sg_vi hi1 = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
    sg_v p, q;
#define SG_TR(a, b, lo, hi)                                                   \
    p = v[a];                                                                 \
    q = v[b];                                                                 \
    v[a] = __builtin_shuffle(p, q, lo);                                       \
    v[b] = __builtin_shuffle(p, q, hi);
    SG_TR(0, 8, lo8, hi8) SG_TR(1, 9, lo8, hi8) SG_TR(2, 10, lo8, hi8) SG_TR(3, 11, lo8, hi8)
    SG_TR(4, 12, lo8, hi8) SG_TR(5, 13, lo8, hi8) SG_TR(6, 14, lo8, hi8) SG_TR(7, 15, lo8, hi8)
    SG_TR(0, 4, lo4, hi4) SG_TR(1, 5, lo4, hi4) SG_TR(2, 6, lo4, hi4) SG_TR(3, 7, lo4, hi4)
    SG_TR(8, 12, lo4, hi4) SG_TR(9, 13, lo4, hi4) SG_TR(10, 14, lo4, hi4)
    SG_TR(11, 15, lo4, hi4)
    SG_TR(0, 2, lo2, hi2) SG_TR(1, 3, lo2, hi2) SG_TR(4, 6, lo2, hi2) SG_TR(5, 7, lo2, hi2)
    SG_TR(8, 10, lo2, hi2) SG_TR(9, 11, lo2, hi2) SG_TR(12, 14, lo2, hi2)
    SG_TR(13, 15, lo2, hi2)
    SG_TR(0, 1, lo1, hi1) SG_TR(2, 3, lo1, hi1) SG_TR(4, 5, lo1, hi1) SG_TR(6, 7, lo1, hi1)
    SG_TR(8, 9, lo1, hi1) SG_TR(10, 11, lo1, hi1) SG_TR(12, 13, lo1, hi1)
    SG_TR(14, 15, lo1, hi1)
#undef SG_TR
}

/* d (16 x 16, rows ldd apart) = s (16 x 16, lds) transposed. */
SG_TGT static void sg_tr_block(const float *s, int64_t lds, float *d, int64_t ldd)
{
    sg_v v[16];
    int i;
    for (i = 0; i < 16; i++)
        v[i] = SG_LD(s + i * lds);
    sg_tr16(v);
    for (i = 0; i < 16; i++)
        SG_ST(d + i * ldd, v[i]);
}

#include "sgemm_core.h"

#endif /* SG_FAST */

#endif
