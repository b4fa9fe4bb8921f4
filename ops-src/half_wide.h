/*
 * ops-src/half_wide.h - float16 and bfloat16 through the float32 kernels,
 * for mm.c and conv2d.c: the 16-bit operands are widened to float32
 * (exactly) in workspace, the float32 path runs, and each output is
 * rounded once, to nearest even, at the end (accumulation in float32, as
 * torch does on the CPU). A local header: its users' cache keys include
 * it.
 *
 *   int kind = hw_kind(x->dtype);               // 0: not a 16-bit dtype
 *   float *xw = hw_widen(ctx, kind, x16, n);    // NULL: error recorded
 *   float *o = hw_scratch(ctx, m);              // the float32 result
 *   ... the float32 path into o ...
 *   hw_narrow(ctx, kind, o, out16, m);
 *
 * Conversions are element by element, so the thread count changes no bit.
 */
#ifndef OPS_HALF_WIDE_H
#define OPS_HALF_WIDE_H

#include <opjit_op.h>
#include <stdlib.h>
#include <string.h>

enum { HW_F16 = 1, HW_BF16 = 2 };

#define HW_GRAIN ((int64_t)1 << 14) /* elements a chunk: 4 or more for a 256 x 256 operand */

/* HW_F16, HW_BF16, or 0 for any other dtype. */
static int hw_kind(DLDataType dt)
{
    if (dt.bits != 16 || dt.lanes != 1)
        return 0;
    return dt.code == kDLFloat ? HW_F16 : dt.code == kDLBfloat ? HW_BF16 : 0;
}

typedef struct hw_job {
    int kind;
    const void *from;
    void *to;
    int64_t n;
} hw_job;

/* float16 <-> float32 over arrays: 8 values an instruction where the
 * compiler targets F16C (the optimizing tier on x86-64-v3 and up), whose
 * vcvtph2ps / vcvtps2ph (round to nearest even) give opjit_op.h's bits;
 * element by element elsewhere (libtcc, the portable level). */
#if defined(__F16C__) && defined(__GNUC__) && !defined(__TINYC__)
#define HW_F16C 1
#endif

/* n float16 values at s into float32 at d. */
static void hw_f16_widen(const uint16_t *s, float *d, int64_t n)
{
    int64_t i = 0;
#ifdef HW_F16C
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(s + i))));
#endif
    for (; i < n; i++)
        d[i] = opjit_f16_to_f32(s[i]);
}

/* n float32 values at s rounded into float16 at d. */
static void hw_f16_narrow(const float *s, uint16_t *d, int64_t n)
{
    int64_t i = 0;
#ifdef HW_F16C
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(d + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++)
        d[i] = opjit_f32_to_f16(s[i]);
}

static int hw_widen_run(void *user, int64_t lo, int64_t hi)
{
    const hw_job *j = (const hw_job *)user;
    const uint16_t *s = (const uint16_t *)j->from;
    float *d = (float *)j->to;
    int64_t i = lo * HW_GRAIN, end = hi * HW_GRAIN < j->n ? hi * HW_GRAIN : j->n;
    if (j->kind == HW_F16)
        hw_f16_widen(s + i, d + i, end - i);
    else
        for (; i < end; i++)
            d[i] = opjit_bf16_to_f32(s[i]);
    return 0;
}

static int hw_narrow_run(void *user, int64_t lo, int64_t hi)
{
    const hw_job *j = (const hw_job *)user;
    const float *s = (const float *)j->from;
    uint16_t *d = (uint16_t *)j->to;
    int64_t i = lo * HW_GRAIN, end = hi * HW_GRAIN < j->n ? hi * HW_GRAIN : j->n;
    if (j->kind == HW_F16)
        hw_f16_narrow(s + i, d + i, end - i);
    else
        for (; i < end; i++)
            d[i] = opjit_f32_to_bf16(s[i]);
    return 0;
}

/* $OPJIT_HALF_KERNEL (opjit_half_kernel: read at every call, in both
 * tiers, by the library's settings): unset, "" or
 * "auto" lets a bfloat16 op use the fastest kernel it has (the optimizing
 * tier's GEMMs, gemm_half.h: on AMX tiles where the CPU and the OS allow
 * them, else vdpbf16ps) unless an operand holds a bfloat16 subnormal
 * (those kernels count them as zero); "amx" demands the tiles and "dot"
 * the vdpbf16ps GEMM for every bfloat16 operand (subnormals counted as
 * zero, as oneDNN does); "wide" widens to float32 always. float16 mm
 * takes the float32 GEMM converting while it packs where the tier has it
 * (have's HW_GEMM; its bits are the widening path's), unless "wide"; "amx"
 * and "dot" name bfloat16 kernels and leave float16 alone. For
 * comparisons and tests.
 *
 * A path is a set of these bits (none of them: widen). */
enum {
    HW_WIDEN = 0,
    HW_GEMM = 1, /* a 16-bit GEMM (gemm_half.h; float16: mm.c's converting one) */
    HW_SCAN = 2, /* ... unless an operand holds a subnormal (hg_subnormal) */
    HW_AMX = 4   /* ... on AMX tiles */
};

/* The path of a call of kind (have: the GEMMs this tier and CPU have,
 * HW_GEMM and HW_AMX bits), or -1 with the error recorded. */
static int hw_path(opjit_ctx *ctx, int kind, int have)
{
    int k = opjit_half_kernel(ctx), dot = k == OPJIT_HALF_DOT, amx = k == OPJIT_HALF_AMX;
    if (k < 0) /* a bad value: the error is recorded */
        return -1;
    if (k == OPJIT_HALF_WIDE)
        return HW_WIDEN;
    if (kind != HW_BF16) /* float16: the converting GEMM where there is one */
        return kind == HW_F16 ? have & HW_GEMM : HW_WIDEN;
    if (dot && !(have & HW_GEMM))
        return opjit_fail(ctx, "OPJIT_HALF_KERNEL=dot, but there is no bfloat16 dot-product "
                               "kernel here: it needs the optimizing tier (gcc) and a CPU with "
                               "AVX512_BF16"), -1;
    if (amx && !(have & HW_AMX))
        return opjit_fail(ctx, "OPJIT_HALF_KERNEL=amx, but there are no AMX tiles here: it "
                               "needs the optimizing tier (gcc), a CPU with AMX-TILE, AMX-BF16 "
                               "and AVX512_BF16, and Linux granting this process the tile "
                               "state"), -1;
    if (dot || amx)
        return HW_GEMM | (amx ? HW_AMX : 0);
    return have & HW_GEMM ? HW_GEMM | HW_SCAN | (have & HW_AMX) : HW_WIDEN;
}

/* float32 workspace for n elements (a valid pointer for n == 0); NULL
 * with the error recorded. */
static float *hw_scratch(opjit_ctx *ctx, int64_t n)
{
    return (float *)opjit_workspace(ctx, (size_t)(n > 0 ? n : 1) * sizeof(float));
}

/* n dense 16-bit values of kind at src, widened into new float32
 * workspace; NULL with the error recorded. */
static float *hw_widen(opjit_ctx *ctx, int kind, const void *src, int64_t n)
{
    hw_job j;
    float *to = hw_scratch(ctx, n);
    if (!to)
        return NULL;
    j.kind = kind;
    j.from = src;
    j.to = to;
    j.n = n;
    if (n > 0 && opjit_parallel_for(ctx, 0, (n + HW_GRAIN - 1) / HW_GRAIN, 1, hw_widen_run, &j))
        return NULL;
    return to;
}

/* n float32 values rounded into dst (16-bit values of kind). 0, or the
 * status of the failure recorded. */
static int hw_narrow(opjit_ctx *ctx, int kind, const float *src, void *dst, int64_t n)
{
    hw_job j;
    j.kind = kind;
    j.from = src;
    j.to = dst;
    j.n = n;
    if (n <= 0)
        return 0;
    return opjit_parallel_for(ctx, 0, (n + HW_GRAIN - 1) / HW_GRAIN, 1, hw_narrow_run, &j);
}

#endif
