/* bench/peak.c - one core's arithmetic peak: how many GFLOP/s a loop of
 * nothing but independent FMAs (AVX2 ymm, AVX-512 zmm) and bfloat16 dot
 * products (vdpbf16ps zmm) reaches on this machine. The GEMM and
 * convolution rows of bench/results/latest.md are read against it: a row
 * where opjit and its anchor both run at about this speed is a tie at the
 * hardware's limit, not a kernel to tune.
 *
 *     cc -O2 bench/peak.c -o /tmp/peak && /tmp/peak
 *
 * Independent accumulators hide each instruction's latency, each starts
 * at its own value (equal ones the compiler merges into one chain), and
 * the asm barrier keeps it from hoisting the loop's work. An instruction
 * set the CPU lacks is said, not run. */
#include <immintrin.h>
#include <stdio.h>
#include <time.h>

#define ITERS 100000000L
/* The accumulators spelled out: an array indexed in a loop lives in
 * memory at -O2, and its loads and stores, not the FMAs, set the pace.
 * Twelve for the FMAs (16 ymm registers; 4-cycle latency, two a cycle),
 * twenty-four for vdpbf16ps (its latency is longer: twelve reached 506 of
 * 545 GFLOP/s on an AMD family 26). */
#define TWELVE(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9) op(10) op(11)
#define TWENTY_FOUR(op) TWELVE(op) op(12) op(13) op(14) op(15) op(16) op(17) op(18) \
    op(19) op(20) op(21) op(22) op(23)
#define DECL(i) a##i = FILL((float)(i)),
#define SUM(i) + a##i

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

__attribute__((target("avx2,fma"))) static double ymm_fma(void)
{
    const __m256 zero = _mm256_setzero_ps();
#define FILL _mm256_set1_ps /* each its own start: equal ones the compiler merges */
    __m256 TWELVE(DECL) x = _mm256_set1_ps(1e-9f), y = _mm256_set1_ps(1.0f);
    double t = now();
    for (long n = 0; n < ITERS; n++) {
        __asm__ volatile("" : "+x"(x));
#define STEP(i) a##i = _mm256_fmadd_ps(x, y, a##i);
        TWELVE(STEP)
#undef STEP
    }
    t = now() - t;
#undef FILL
    volatile float keep = _mm256_cvtss_f32(zero TWELVE(SUM));
    (void)keep;
    return 12.0 * ITERS * 16 / t / 1e9; /* 8 lanes, 2 FLOP each */
}

__attribute__((target("avx512f"))) static double zmm_fma(void)
{
    const __m512 zero = _mm512_setzero_ps();
#define FILL _mm512_set1_ps
    __m512 TWELVE(DECL) x = _mm512_set1_ps(1e-9f), y = _mm512_set1_ps(1.0f);
    double t = now();
    for (long n = 0; n < ITERS; n++) {
        __asm__ volatile("" : "+v"(x));
#define STEP(i) a##i = _mm512_fmadd_ps(x, y, a##i);
        TWELVE(STEP)
#undef STEP
    }
    t = now() - t;
#undef FILL
    volatile float keep = _mm512_reduce_add_ps(zero TWELVE(SUM));
    (void)keep;
    return 12.0 * ITERS * 32 / t / 1e9; /* 16 lanes */
}

__attribute__((target("avx512f,avx512bf16"))) static double zmm_dpbf16(void)
{
    const __m512 zero = _mm512_setzero_ps();
#define FILL _mm512_set1_ps
    __m512 TWENTY_FOUR(DECL) unused = zero;
    __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = x;
    double t = now();
    for (long n = 0; n < ITERS; n++) {
        __asm__ volatile("" : "+v"(x));
#define STEP(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
        TWENTY_FOUR(STEP)
#undef STEP
    }
    t = now() - t;
#undef FILL
    volatile float keep = _mm512_reduce_add_ps(unused TWENTY_FOUR(SUM));
    (void)keep;
    return 24.0 * ITERS * 64 / t / 1e9; /* 16 lanes, 2 products each */
}

int main(void)
{
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        printf("float32 FMA, AVX2 (ymm):        %6.0f GFLOP/s a core\n", ymm_fma());
    else
        printf("float32 FMA, AVX2 (ymm):        not on this CPU\n");
    if (__builtin_cpu_supports("avx512f"))
        printf("float32 FMA, AVX-512 (zmm):     %6.0f GFLOP/s a core\n", zmm_fma());
    else
        printf("float32 FMA, AVX-512 (zmm):     not on this CPU\n");
    if (__builtin_cpu_supports("avx512bf16"))
        printf("bfloat16 vdpbf16ps (zmm):       %6.0f GFLOP/s a core\n", zmm_dpbf16());
    else
        printf("bfloat16 vdpbf16ps (zmm):       not on this CPU\n");
    return 0;
}
