/*
 * ops-src/sgemm_avx2.h - the optimizing tier's single-precision GEMM
 * (sgemm_core.h) and vector helpers for x86-64 CPUs with AVX2 and FMA
 * (x86-64-v3) but no AVX-512, shared by conv2d.c and mm.c. A local header:
 * the cache keys of both include it.
 *
 * Defines SG_FAST (and SG_W 8) when the compiler builds it: gcc, the
 * optimizing tier, compiling for x86-64-v3 (the tier's -march on a CPU
 * without AVX-512, or with OPJIT_CPU_LEVEL=avx2 on one that has it).
 * libtcc never sees it.
 */
#ifndef SGEMM_AVX2_H
#define SGEMM_AVX2_H

/* ---- the optimizing tier on x86-64 with AVX2 -------------------------------------
 *
 * Half the width of AVX-512 and 16 vector registers: micro-kernels of 4
 * rows x 24 columns (12 accumulators, 3 vectors of B, one of A), the shape
 * oneDNN's AVX2 GEMM uses; OpenBLAS's Haswell kernels run about a quarter
 * below it (issue 26). */
#if defined(OPJIT_TIER_OPT) && defined(__GNUC__) && !defined(__clang__) && \
    !defined(__TINYC__) && defined(__x86_64__) && defined(__AVX2__) && defined(__FMA__) && \
    !defined(__AVX512F__)
#define SG_FAST 1
#include "cpu_features.h"
#define SG_W 8
#define SG_PACK 1 /* sgemm_core.h: pack the panels of B */
#define SG_MR 4
#define SG_ISA "avx2"

typedef float sg_v __attribute__((vector_size(32), aligned(4), __may_alias__));
typedef int sg_vi __attribute__((vector_size(32)));
/* The tier compiles with -ffp-contract=off (nms needs both tiers to round
 * alike); here a * b + c may be one FMA. */
#define SG_TGT __attribute__((optimize("fp-contract=fast")))
#define SG_LD(p) (*(const sg_v *)(const void *)(p))
#define SG_ST(p, v) (*(sg_v *)(void *)(p) = (v))
/* Lanes 0, 2, 4, ... and 1, 3, 5, ... of two vectors; the first halves of
 * two vectors interleaved (a0 b0 a1 b1 ...), and their second halves. */
#define SG_EVEN {0, 2, 4, 6, 8, 10, 12, 14}
#define SG_ODD {1, 3, 5, 7, 9, 11, 13, 15}
#define SG_ILO {0, 8, 1, 9, 2, 10, 3, 11}
#define SG_IHI {4, 12, 5, 13, 6, 14, 7, 15}

/* Whether the CPU (and the OS) runs this code: what -march promised. */
static int sg_fast_ok(void) { return CPU_HAS(AVX2, "avx2") && CPU_HAS(FMA, "fma") ? 1 : 0; }

/* d (8 x 8, rows ldd apart) = s (8 x 8, lds) transposed: rows a and a + h
 * exchange blocks of h lanes, h = 4, 2, 1. */
SG_TGT static void sg_tr_block(const float *s, int64_t lds, float *d, int64_t ldd)
{
    const sg_vi lo4 = {0, 1, 2, 3, 8, 9, 10, 11}, hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
    const sg_vi lo2 = {0, 1, 8, 9, 4, 5, 12, 13}, hi2 = {2, 3, 10, 11, 6, 7, 14, 15};
    const sg_vi lo1 = {0, 8, 2, 10, 4, 12, 6, 14}, hi1 = {1, 9, 3, 11, 5, 13, 7, 15};
    sg_v v[8], p, q;
    int i;
    for (i = 0; i < 8; i++)
        v[i] = SG_LD(s + i * lds);
#define SG_TR(a, b, lo, hi)                                                   \
    p = v[a];                                                                 \
    q = v[b];                                                                 \
    v[a] = __builtin_shuffle(p, q, lo);                                       \
    v[b] = __builtin_shuffle(p, q, hi);
    SG_TR(0, 4, lo4, hi4) SG_TR(1, 5, lo4, hi4) SG_TR(2, 6, lo4, hi4) SG_TR(3, 7, lo4, hi4)
    SG_TR(0, 2, lo2, hi2) SG_TR(1, 3, lo2, hi2) SG_TR(4, 6, lo2, hi2) SG_TR(5, 7, lo2, hi2)
    SG_TR(0, 1, lo1, hi1) SG_TR(2, 3, lo1, hi1) SG_TR(4, 5, lo1, hi1) SG_TR(6, 7, lo1, hi1)
#undef SG_TR
    for (i = 0; i < 8; i++)
        SG_ST(d + i * ldd, v[i]);
}

#include "sgemm_core.h"

#endif /* SG_FAST */

#endif
