/*
 * ops-src/gemm_half.h - bfloat16 products on AMX tiles or AVX512_BF16 for
 * mm.c and conv2d.c, in the optimizing tier. A local header: its users'
 * cache keys include it.
 *
 * Defines HG_BF16 where sgemm_avx512.h defines SG_FAST (gcc, the
 * optimizing tier, x86-64), and HG_AMX with it on Linux; HG_HAVE() says
 * which of the two GEMMs this CPU runs (hg_bf16_cpu: AVX-512 with the
 * BF16 extension, vdpbf16ps; hg_amx_cpu: AMX-TILE and AMX-BF16, and the
 * kernel's grant of the tile state) and half_wide.h's hw_path which one
 * $OPJIT_HALF_KERNEL picks. libtcc never sees it; elsewhere the 16-bit
 * operands are widened to float32 and go through the float32 kernels
 * (half_wide.h). The AMX kernels are in their own section below, and
 * conv2d's grad_weight (vdpbf16ps only) in the last. float16 is not
 * here: mm.c runs it on the float32 GEMM, converting as it packs.
 *
 * Why: widening costs a pass over each operand and then runs at float32
 * speed, while vdpbf16ps multiplies 32 bfloat16 pairs into 16 float32
 * sums an instruction, twice the float32 FMA's work. torch 2.x on such a
 * CPU runs bfloat16 mm and conv2d through oneDNN on the same instruction.
 *
 * Numerics, as oneDNN's: each product of two bfloat16 values is exact in
 * float32; every output element is one chain of float32 sums over k in
 * order, k and k+1 a step (vdpbf16ps: bfloat16 subnormal inputs count as
 * zero, a subnormal float32 sum is flushed to zero); the float32 result
 * is rounded once, to nearest even, into bfloat16 (the chain does not
 * depend on blocks or threads: any thread count gives the same bits).
 *
 * vdpbf16ps counts bfloat16 subnormal inputs as zero, as oneDNN's kernels
 * do; by default (half_wide.h's hw_path) an operand holding one goes the
 * widening path instead (hg_subnormal: a scan, about 1% of a product's
 * time), so results keep them. $OPJIT_HALF_KERNEL=dot skips the scan,
 * =wide always widens.
 */
#ifndef GEMM_HALF_H
#define GEMM_HALF_H

#include <stdlib.h>
#include <string.h>

#include "half_wide.h"
#include "parallel_pair.h"
#include "sgemm_avx512.h"

#if defined(SG_FAST) && SG_W == 16 /* an AVX-512 build: under a lower OPJIT_CPU_LEVEL, none */
#define HG_BF16 1
#include <immintrin.h>

#define HG_TARGET __attribute__((target("avx512f,avx512bw,avx512bf16")))

/* Whether this CPU (and OS) runs the kernels below. */
static int hg_bf16_cpu(void)
{
    return CPU_HAS(AVX512F, "avx512f") && CPU_HAS(AVX512BW, "avx512bw") &&
           CPU_HAS(AVX512_BF16, "avx512bf16");
}

static inline uint32_t hg_pair(const uint16_t *p)
{
    uint32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* Workspace on a 64-byte boundary (opjit_workspace promises less): a
 * tile's row or a vector split over two cache lines costs both. NULL with
 * the error recorded. */
static void *hg_ws(opjit_ctx *ctx, size_t bytes)
{
    char *p = (char *)opjit_workspace(ctx, bytes + 64);
    return p ? (void *)(p + (64 - (uintptr_t)p % 64) % 64) : NULL;
}

/* ---- micro-kernels --------------------------------------------------------------
 * C[8][16 NV] = A[8][K] . B[K][16 NV]: A row-major bfloat16 (rows lda
 * apart), B packed in pairs of k (hg_pack_*): P[k/2][column][k % 2], rows
 * of pairs ldp elements apart, odd K padded with zero; C float32. Per pair
 * of k: NV vector loads of B, 8 broadcasts of a pair of A, 8 NV vdpbf16ps
 * into 8 NV accumulators (24 of the 32 registers at NV 3). */
#define HG_STEP(NV, PAIR)                                                             \
    _Pragma("GCC unroll 3") for (v = 0; v < NV; v++)                                  \
        b[v] = _mm512_loadu_si512((const void *)(P + 32 * v));                        \
    _Pragma("GCC unroll 8") for (r = 0; r < 8; r++) {                                 \
        a = _mm512_set1_epi32((int)(PAIR));                                           \
        _Pragma("GCC unroll 3") for (v = 0; v < NV; v++)                              \
            c[r][v] = _mm512_dpbf16_ps(c[r][v], (__m512bh)a, (__m512bh)b[v]);         \
    }
#define HG_KERNEL(NAME, NV)                                                           \
    HG_TARGET static void NAME(int64_t K, const uint16_t *A, int64_t lda,             \
                               const uint16_t *P, int64_t ldp, float *C, int64_t ldc) \
    {                                                                                 \
        __m512 c[8][NV];                                                              \
        __m512i b[NV], a;                                                             \
        int64_t kp, r, v;                                                             \
        _Pragma("GCC unroll 8") for (r = 0; r < 8; r++)                               \
            _Pragma("GCC unroll 3") for (v = 0; v < NV; v++) c[r][v] = _mm512_setzero_ps(); \
        for (kp = 0; kp + 1 < K; kp += 2, P += ldp) {                                 \
            HG_STEP(NV, hg_pair(A + r * lda + kp))                                    \
        }                                                                             \
        if (K & 1) { /* the last pair is (A[K-1], 0) */                               \
            HG_STEP(NV, A[r * lda + kp])                                              \
        }                                                                             \
        _Pragma("GCC unroll 8") for (r = 0; r < 8; r++)                               \
            _Pragma("GCC unroll 3") for (v = 0; v < NV; v++)                          \
                _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);                      \
    }
HG_KERNEL(hg_k8x48, 3)
HG_KERNEL(hg_k8x32, 2)
HG_KERNEL(hg_k8x16, 1)
#undef HG_KERNEL

/* The same summed over the taps of a stride-1 convolution (hg_conv_vtaps):
 * tap t's A at A + t sa (rows lda apart, Kp channels in pairs, Kp even)
 * and its B at B + off[t] (rows of pairs ldp elements apart); one chain
 * of sums per element over (tap, pair of channels) in order. */
typedef struct hg_tapk {
    int64_t ntap, sa, lda, Kp, ldp;
    int64_t off[64];
} hg_tapk;
#define HG_TKERNEL(NAME, NV)                                                          \
    HG_TARGET static void NAME(const hg_tapk *tk, const uint16_t *A0, const uint16_t *B, \
                               float *C, int64_t ldc)                                 \
    {                                                                                 \
        __m512 c[8][NV];                                                              \
        __m512i b[NV], a;                                                             \
        int64_t t, kp, r, v, lda = tk->lda;                                           \
        _Pragma("GCC unroll 8") for (r = 0; r < 8; r++)                               \
            _Pragma("GCC unroll 3") for (v = 0; v < NV; v++) c[r][v] = _mm512_setzero_ps(); \
        for (t = 0; t < tk->ntap; t++) {                                              \
            const uint16_t *A = A0 + t * tk->sa, *P = B + tk->off[t];                 \
            for (kp = 0; kp < tk->Kp; kp += 2, P += tk->ldp) {                        \
                HG_STEP(NV, hg_pair(A + r * lda + kp))                                \
            }                                                                         \
        }                                                                             \
        _Pragma("GCC unroll 8") for (r = 0; r < 8; r++)                               \
            _Pragma("GCC unroll 3") for (v = 0; v < NV; v++)                          \
                _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);                      \
    }
HG_TKERNEL(hg_t8x48, 3)
HG_TKERNEL(hg_t8x32, 2)
HG_TKERNEL(hg_t8x16, 1)
#undef HG_TKERNEL
#undef HG_STEP

/* C[8][np] = A[8][K] . P (np a multiple of 16, ldc >= np): panels of 48
 * columns (64 left: two of 32). */
HG_TARGET static void hg_strip(int64_t K, const uint16_t *A, int64_t lda, const uint16_t *P,
                               int64_t np, float *C, int64_t ldc)
{
    int64_t j, w, ldp = 2 * np;
    for (j = 0; j < np; j += w) {
        w = np - j;
        w = w == 64 ? 32 : w >= 48 ? 48 : w >= 32 ? 32 : 16;
        if (w == 48)
            hg_k8x48(K, A, lda, P + 2 * j, ldp, C + j, ldc);
        else if (w == 32)
            hg_k8x32(K, A, lda, P + 2 * j, ldp, C + j, ldc);
        else
            hg_k8x16(K, A, lda, P + 2 * j, ldp, C + j, ldc);
    }
}

/* ---- packing B -------------------------------------------------------------------
 * P[k/2][j][k % 2] for j < np (nb rounded up to 16; the columns past nb
 * and the pair past an odd K are zeros). */

/* From bfloat16 rows: B's element (k, j) at B[k * ldb + j]. */
HG_TARGET static void hg_pack_rows(const uint16_t *B, int64_t ldb, int64_t K, int64_t nb,
                                   uint16_t *P, int64_t np)
{
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    int64_t k, j;
    for (k = 0; k < K; k += 2, P += 2 * np) {
        const uint16_t *r0 = B + k * ldb, *r1 = r0 + ldb;
        for (j = 0; j < np; j += 32) {
            int64_t left = nb - j;
            __mmask32 m = left >= 32 ? ~(__mmask32)0
                          : left > 0 ? (((__mmask32)1 << left) - 1) : 0;
            __m512i x0 = _mm512_maskz_loadu_epi16(m, r0 + j);
            __m512i x1 = k + 1 < K ? _mm512_maskz_loadu_epi16(m, r1 + j) : _mm512_setzero_si512();
            _mm512_storeu_si512((void *)(P + 2 * j), _mm512_permutex2var_epi16(x0, lo, x1));
            if (j + 16 < np)
                _mm512_storeu_si512((void *)(P + 2 * j + 32),
                                    _mm512_permutex2var_epi16(x0, hi, x1));
        }
    }
}

/* v, 16 rows of 16 32-bit words, transposed in place: words moved whole
 * (a pair of bfloat16 stays a pair). Pairs of rows interleaved by words,
 * then by pairs of words (each 128-bit lane then holds 4 rows of one
 * column), then the 4 x 4 lanes exchanged. */
HG_TARGET __attribute__((always_inline)) static inline void hg_tr16(__m512i *v)
{
    __m512i t[16], w0, w1, w2, w3;
    int i, c;
    _Pragma("GCC unroll 16") for (i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    /* v[4g + c], lane L: column 4L + c of rows 4g .. 4g+3 */
    _Pragma("GCC unroll 16") for (i = 0; i < 16; i += 4) {
        v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    _Pragma("GCC unroll 4") for (c = 0; c < 4; c++) {
        w0 = _mm512_shuffle_i32x4(v[c], v[4 + c], 0x44);
        w1 = _mm512_shuffle_i32x4(v[c], v[4 + c], 0xee);
        w2 = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0x44);
        w3 = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0xee);
        t[c] = _mm512_shuffle_i32x4(w0, w2, 0x88);
        t[4 + c] = _mm512_shuffle_i32x4(w0, w2, 0xdd);
        t[8 + c] = _mm512_shuffle_i32x4(w1, w3, 0x88);
        t[12 + c] = _mm512_shuffle_i32x4(w1, w3, 0xdd);
    }
    _Pragma("GCC unroll 16") for (i = 0; i < 16; i++)
        v[i] = t[i];
}

/* The first n (<= 32) of 32 bfloat16 lanes. */
static inline __mmask32 hg_first(int64_t n)
{
    return n >= 32 ? ~(__mmask32)0 : n > 0 ? (((__mmask32)1 << n) - 1) : 0;
}

/* From bfloat16 columns (a transposed view): element (k, j) at
 * B[j * ldb + k], so each pair is one 32-bit word and P is B's words
 * transposed: blocks of 16 columns x 16 pairs through registers (hg_tr16),
 * the pair past an odd K and the columns past nb loaded as zeros. */
HG_TARGET static void hg_pack_cols(const uint16_t *B, int64_t ldb, int64_t K, int64_t nb,
                                   uint16_t *P, int64_t np)
{
    int64_t kh = (K + 1) / 2, j0, q0, i;
    __m512i v[16];
    for (j0 = 0; j0 < np; j0 += 16)
        for (q0 = 0; q0 < kh; q0 += 16) {
            __mmask32 m = hg_first(K - 2 * q0);
            _Pragma("GCC unroll 16") for (i = 0; i < 16; i++)
                v[i] = j0 + i < nb ? _mm512_maskz_loadu_epi16(m, B + (j0 + i) * ldb + 2 * q0)
                                   : _mm512_setzero_si512();
            hg_tr16(v);
            _Pragma("GCC unroll 16") for (i = 0; i < 16; i++)
                if (q0 + i < kh)
                    _mm512_storeu_si512((void *)(P + (q0 + i) * 2 * np + 2 * j0), v[i]);
        }
}

/* From float32 rows holding bfloat16 values (a widened, unfolded input):
 * the top 16 bits of each are the bfloat16 exactly. */
HG_TARGET static void hg_pack_f32(const float *B, int64_t ldb, int64_t K, int64_t nb,
                                  uint16_t *P, int64_t np)
{
    const __m512i top = _mm512_set1_epi32((int)0xffff0000u);
    int64_t k, j;
    for (k = 0; k < K; k += 2, P += 2 * np) {
        const float *r0 = B + k * ldb, *r1 = r0 + ldb;
        for (j = 0; j < np; j += 16) {
            int64_t left = nb - j;
            __mmask16 m = left >= 16 ? (__mmask16)0xffff
                          : left > 0 ? (__mmask16)((1u << left) - 1) : 0;
            __m512i x0 = _mm512_maskz_loadu_epi32(m, r0 + j);
            __m512i x1 = k + 1 < K ? _mm512_maskz_loadu_epi32(m, r1 + j) : _mm512_setzero_si512();
            _mm512_storeu_si512((void *)(P + 2 * j),
                                _mm512_or_si512(_mm512_and_si512(x1, top),
                                                _mm512_srli_epi32(x0, 16)));
        }
    }
}

/* ---- the float32 results into bfloat16 -------------------------------------------- */

/* out[r][j] = bf16(C[r][j] + bias[r]) for r < rows, j < nb (bias may be
 * NULL): rounded to nearest even, NaN kept quiet, subnormals kept, as
 * opjit_f32_to_bf16. vcvtne2ps2bf16 gives the same bits for every float32
 * but subnormals (it flushes them; checked over 2e8 random patterns, NaNs
 * included): it converts 32 sums where none is subnormal, the integer
 * rounding below the others. */
HG_TARGET static void hg_store(const float *C, int64_t ldc, int64_t rows, int64_t nb,
                               const float *bias, uint16_t *out, int64_t ldo)
{
    const __m512i one = _mm512_set1_epi32(1), half = _mm512_set1_epi32(0x7fff);
    const __m512i abs = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512i quiet = _mm512_set1_epi32(0x40);
    const __m512i ma = _mm512_set1_epi32(0x007fffff);
    int64_t r, j;
    for (r = 0; r < rows; r++) {
        const __m512 b = _mm512_set1_ps(bias ? bias[r] : 0.0f);
        for (j = 0; j + 32 <= nb; j += 32) {
            __m512 v0 = _mm512_add_ps(_mm512_loadu_ps(C + r * ldc + j), b);
            __m512 v1 = _mm512_add_ps(_mm512_loadu_ps(C + r * ldc + j + 16), b);
            __m512i u0 = _mm512_castps_si512(v0), u1 = _mm512_castps_si512(v1);
            if ((_mm512_testn_epi32_mask(u0, inf) & _mm512_test_epi32_mask(u0, ma)) |
                (_mm512_testn_epi32_mask(u1, inf) & _mm512_test_epi32_mask(u1, ma)))
                break; /* a subnormal: this row the slow way from here */
            _mm512_storeu_si512((void *)(out + r * ldo + j), (__m512i)_mm512_cvtne2ps_pbh(v1, v0));
        }
        for (; j + 16 <= nb; j += 16) {
            __m512i u = _mm512_castps_si512(_mm512_add_ps(_mm512_loadu_ps(C + r * ldc + j), b));
            __mmask16 nan;
            if (!(_mm512_testn_epi32_mask(u, inf) & _mm512_test_epi32_mask(u, ma))) {
                _mm256_storeu_si256((__m256i *)(void *)(out + r * ldo + j),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_castsi512_ps(u)));
                continue;
            }
            nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, abs), inf);
            __m512i rn = _mm512_srli_epi32(
                _mm512_add_epi32(_mm512_add_epi32(u, half),
                                 _mm512_and_si512(_mm512_srli_epi32(u, 16), one)), 16);
            rn = _mm512_mask_or_epi32(rn, nan, _mm512_srli_epi32(u, 16), quiet);
            _mm256_storeu_si256((__m256i *)(void *)(out + r * ldo + j), _mm512_cvtepi32_epi16(rn));
        }
        for (; j < nb; j++)
            out[r * ldo + j] = opjit_f32_to_bf16(C[r * ldc + j] + (bias ? bias[r] : 0.0f));
    }
}

/* A: rows i .. i+7 of a row-major [M, K] (lda), or for the last M % 8
 * rows a zero-padded copy in at (8 x K). */
static const uint16_t *hg_rows(const uint16_t *A, int64_t lda, int64_t M, int64_t K, int64_t i,
                               uint16_t *at, int64_t *ld)
{
    int64_t r;
    if (i + 8 <= M) {
        *ld = lda;
        return A + i * lda;
    }
    memset(at, 0, (size_t)(8 * K) * sizeof(uint16_t));
    for (r = 0; r < M - i; r++)
        memcpy(at + r * K, A + (i + r) * lda, (size_t)K * sizeof(uint16_t));
    *ld = K;
    return at;
}

/* out [M, nb] (ldo) = bf16(A [M, K] . P + bias) with float32 sums: strips of
 * 8 rows into ct (8 x np floats), each stored rounded. bias: per row of A,
 * or NULL. at: 8 x K for the last rows. */
static void hg_gemm_store(int64_t M, int64_t K, const uint16_t *A, int64_t lda,
                          const uint16_t *P, int64_t nb, int64_t np, const float *bias,
                          uint16_t *out, int64_t ldo, float *ct, uint16_t *at)
{
    int64_t i, la;
    for (i = 0; i < M; i += 8) {
        const uint16_t *a = hg_rows(A, lda, M, K, i, at, &la);
        hg_strip(K, a, la, P, np, ct, np);
        hg_store(ct, np, M - i < 8 ? M - i : 8, nb, bias ? bias + i : NULL, out + i * ldo, ldo);
    }
}

/* K rounded up to whole AMX tiles (32 bfloat16 a row): a packed panel has
 * room for that many, the pairs past K zero on the AMX path. */
static int64_t hg_kp(int64_t K) { return (K + 31) / 32 * 32; }

/* Floats of a strip of results: 8 x np for the vdpbf16ps kernels, 32 x np
 * (np rounded up to 32) for the AMX ones. */
static size_t hg_ct(int64_t np) { return (size_t)(32 * ((np + 31) / 32 * 32)); }

/* Bytes of slack after a packed panel for hg_unfold_pairs' whole-vector
 * stores (16 pairs). */
#define HG_SPILL 64

/* Bytes of a thread's area: a packed panel (hg_kp(K) x np), a strip of
 * results (hg_ct floats), the last rows of A (8 x K) and the panel again
 * on tiles (the AMX path). */
static size_t hg_area(int64_t K, int64_t np)
{
    size_t b = (size_t)(hg_kp(K) * np) * 4 + HG_SPILL + hg_ct(np) * 4 + (size_t)(8 * K) * 2 +
               4 * 64;
    return (b + 63) / 64 * 64;
}

typedef struct hg_area_ptrs {
    uint16_t *p, *at, *t;
    float *ct;
} hg_area_ptrs;

static hg_area_ptrs hg_carve(char *area, int64_t K, int64_t np)
{
    hg_area_ptrs a;
    size_t pb = ((size_t)(hg_kp(K) * np) * 2 + HG_SPILL + 63) / 64 * 64;
    a.p = (uint16_t *)(void *)area;
    a.ct = (float *)(void *)(area + pb);
    a.at = (uint16_t *)(void *)(area + pb + (hg_ct(np) * 4 + 63) / 64 * 64);
    a.t = (uint16_t *)(void *)(area + pb + (hg_ct(np) * 4 + 63) / 64 * 64 +
                               ((size_t)(8 * K) * 2 + 63) / 64 * 64);
    return a;
}

/* ---- AMX: tiles of 16 x 16 float32 sums (TDPBF16PS) ------------------------------
 * Where the CPU has AMX-TILE and AMX-BF16 and Linux grants this process
 * the tile state (arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA),
 * once; a tile instruction without it is SIGILL), the products below run
 * on tiles instead of hg_strip: C [32][32] in four tiles, two tiles of A
 * (16 rows x 32 k) and two of B (16 pairs of k x 16 columns, the packed
 * panel's layout) a step of 32 k. Numerics as vdpbf16ps's: exact bfloat16
 * products summed in float32, each element one chain over k in order
 * (pairs of k a step), bfloat16 subnormal inputs counted as zero, a
 * subnormal sum flushed; every element is computed by one thread over all
 * of k, so the thread count changes no bit. K is padded to a multiple of
 * 32 with zeros in both operands (A packed into a padded copy, hg_amx_a;
 * the extra pairs of B zeroed, hg_amx_tiles): a product 0 x 0 leaves a
 * float32 sum as it is. The check is made at run time, so an artifact of
 * an AVX-512 level stays right on a CPU of that level without AMX. */
#if defined(__linux__) && defined(__GNUC__) && __GNUC__ >= 11
#define HG_AMX 1
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HG_AMX_TARGET __attribute__((target("amx-tile,amx-bf16,avx512f,avx512bw,avx512bf16")))

static int hg_amx_state; /* 0 not asked yet, 1 usable, -1 not */

/* Whether the AMX kernels run here: CPUID leaf 7 (EDX bit 22 AMX-BF16,
 * bit 24 AMX-TILE), then the kernel's permission, asked once a process
 * (granted to all its threads). */
static int hg_amx_cpu(void)
{
    int s = __atomic_load_n(&hg_amx_state, __ATOMIC_ACQUIRE);
    if (!s) {
        unsigned a, b, c, d;
        unsigned long bits = 0;
        s = hg_bf16_cpu() && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) &&
                    (d >> 24 & 1) && syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18) == 0 &&
                    syscall(SYS_arch_prctl, 0x1022 /* ARCH_GET_XCOMP_PERM */, &bits) == 0 &&
                    (bits >> 18 & 1)
                ? 1
                : -1;
        __atomic_store_n(&hg_amx_state, s, __ATOMIC_RELEASE);
    }
    return s > 0;
}

/* The tile configuration, palette 1: tiles 0-7 each 16 rows of 64 bytes. */
typedef struct hg_tilecfg {
    uint8_t palette, start, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} hg_tilecfg;

/* Tiles are per-thread state: each unit of work configures them first and
 * releases them after (hg_amx_end), on whichever thread it runs. The
 * configuration is a static object: gcc 12's _tile_loadconfig tells the
 * compiler it reads 8 bytes, so stores into a local one may be dropped. */
static const hg_tilecfg hg_cfg = {1, 0, {0}, {64, 64, 64, 64, 64, 64, 64, 64},
                                  {16, 16, 16, 16, 16, 16, 16, 16}};

HG_AMX_TARGET static void hg_amx_begin(void) { _tile_loadconfig(&hg_cfg); }

HG_AMX_TARGET static void hg_amx_end(void) { _tile_release(); }

/* B on tiles: a panel of np columns (a multiple of 16) as np / 16 streams,
 * one a block of 16 columns, each hg_kp(K) / 2 rows of 16 pairs of k (64
 * bytes: a tile's row), so that a tile is 1 KiB in one piece (a packed
 * panel's rows are 4 np bytes apart: a tile's rows would be 16 lines far
 * apart). Element (k, j) at T[(j / 16 * Kp / 2 + k / 2) * 32 + j % 16 * 2 +
 * k % 2]. */
static int64_t hg_amx_stream(int64_t K) { return hg_kp(K) * 16; }

/* A packed panel (hg_pack_rows' layout: P[k/2][j][k%2], np columns) into
 * T, the pairs past K zero. */
static void hg_amx_tiles(const uint16_t *P, int64_t K, int64_t np, uint16_t *T)
{
    int64_t jb, kp, have = (K + 1) / 2, want = hg_kp(K) / 2;
    for (jb = 0; jb < np / 16; jb++) {
        uint16_t *d = T + jb * hg_amx_stream(K);
        for (kp = 0; kp < have; kp++)
            memcpy(d + kp * 32, P + kp * 2 * np + jb * 32, 64);
        memset(d + have * 32, 0, (size_t)(want - have) * 64);
    }
}

/* ct [32][32] (float32, 128 bytes a row) = (load ? ct : 0) + A [16 or 32
 * rows (two_rows)][k0, k1) . B [k0, k1)[16 or 32 columns (two_cols)]: A
 * bfloat16 rows lda apart, B two streams of hg_amx_tiles (B, B + ls), k0
 * and k1 multiples of 32. Tiles 0-3 the sums (row half r, column half c:
 * tile 2r + c), 4-5 A, 6-7 B. A sum stored and loaded again is the same
 * float32: the chain over k goes on. */
HG_AMX_TARGET static void hg_amx_block(int64_t k0, int64_t k1, const uint16_t *A, int64_t lda,
                                       const uint16_t *B, int64_t ls, int two_rows,
                                       int two_cols, float *ct, int load)
{
    const size_t sa = (size_t)lda * 2;
    const uint16_t *a1 = A + 16 * lda, *b1;
    int64_t k;
    if (load) {
        _tile_loadd(0, ct, 128);
        _tile_loadd(1, ct + 16, 128);
        _tile_loadd(2, ct + 16 * 32, 128);
        _tile_loadd(3, ct + 16 * 32 + 16, 128);
    } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
    }
    B += k0 * 16;
    b1 = B + ls;
    if (two_rows && two_cols) {
        for (k = k0; k < k1; k += 32, B += 512, b1 += 512) {
            _tile_loadd(4, A + k, sa);
            _tile_loadd(6, B, 64);
            _tile_loadd(7, b1, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
            _tile_loadd(5, a1 + k, sa);
            _tile_dpbf16ps(2, 5, 6);
            _tile_dpbf16ps(3, 5, 7);
        }
    } else if (two_cols) {
        for (k = k0; k < k1; k += 32, B += 512, b1 += 512) {
            _tile_loadd(4, A + k, sa);
            _tile_loadd(6, B, 64);
            _tile_loadd(7, b1, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(1, 4, 7);
        }
    } else if (two_rows) {
        for (k = k0; k < k1; k += 32, B += 512) {
            _tile_loadd(4, A + k, sa);
            _tile_loadd(5, a1 + k, sa);
            _tile_loadd(6, B, 64);
            _tile_dpbf16ps(0, 4, 6);
            _tile_dpbf16ps(2, 5, 6);
        }
    } else {
        for (k = k0; k < k1; k += 32, B += 512) {
            _tile_loadd(4, A + k, sa);
            _tile_loadd(6, B, 64);
            _tile_dpbf16ps(0, 4, 6);
        }
    }
    _tile_stored(0, ct, 128);
    _tile_stored(1, ct + 16, 128);
    _tile_stored(2, ct + 16 * 32, 128);
    _tile_stored(3, ct + 16 * 32 + 16, 128);
}

/* k a slice: A's 32 rows of a slice stay in L1 while the panel's columns
 * go by, each block's sums kept in ct between slices. */
#define HG_KC 256

/* C [32 rows (16 where !two_rows)][0, nb) of A . B (B: hg_amx_tiles of a
 * panel of np columns), over all of K, slice by slice: the block of
 * columns from 32 b in ct + 1024 b; each done block handed to fin (the
 * rounding store) straight after its last slice, while it is in L1. */
typedef void (*hg_amx_fin)(const void *user, int64_t c, const float *ct);
static void hg_amx_rows32(int64_t K, const uint16_t *A, int64_t lda, const uint16_t *B,
                          int64_t nb, int64_t np, int two_rows, float *ct, hg_amx_fin fin,
                          const void *user)
{
    int64_t k0, k1, c, Kp = hg_kp(K), ls = hg_amx_stream(K);
    for (k0 = 0; k0 < Kp; k0 = k1) {
        k1 = Kp - k0 > HG_KC ? k0 + HG_KC : Kp;
        for (c = 0; c < nb; c += 32) {
            float *b = ct + c / 32 * 1024;
            hg_amx_block(k0, k1, A, lda, B + c / 16 * ls, ls, two_rows, np - c > 16, b, k0 > 0);
            if (k1 == Kp)
                fin(user, c, b);
        }
    }
}

typedef struct hg_amx_out {
    int64_t rows, nb, ldo;
    const float *bias;
    uint16_t *out;
} hg_amx_out;

static void hg_amx_fin_store(const void *user, int64_t c, const float *ct)
{
    const hg_amx_out *o = (const hg_amx_out *)user;
    hg_store(ct, 32, o->rows, o->nb - c < 32 ? o->nb - c : 32, o->bias, o->out + c, o->ldo);
}

/* out [M, nb] (ldo) = bf16(A [M, K] . B + bias), as hg_gemm_store, on
 * tiles: A padded (hg_amx_a: rows lda apart, zero past K, readable up to
 * row M rounded up to 16, plus 16), B a panel of np columns on tiles
 * (hg_amx_tiles), ct hg_ct(np) floats. Blocks of 32 rows, each over the
 * panel's columns. */
static void hg_amx_store(int64_t M, int64_t K, const uint16_t *A, int64_t lda,
                         const uint16_t *B, int64_t nb, int64_t np, const float *bias,
                         uint16_t *out, int64_t ldo, float *ct)
{
    hg_amx_out o;
    int64_t i;
    o.nb = nb;
    o.ldo = ldo;
    for (i = 0; i < M; i += 32) {
        o.rows = M - i < 32 ? M - i : 32;
        o.bias = bias ? bias + i : NULL;
        o.out = out + i * ldo;
        hg_amx_rows32(K, A + i * lda, lda, B, nb, np, M - i > 16, ct, hg_amx_fin_store, &o);
    }
}

/* ---- A, padded for the tiles ----------------------------------------------------
 * groups blocks of rows rows each (element (r, k) of group g at src[(g
 * rows + r) * lds + k], or at src[k * lds + g rows + r] when transposed)
 * into dst: group g's rows at dst + g * rows_p * ldd, K columns then zeros
 * up to ldd, rows past rows zero up to rows_p (hg_amx_rows). */
typedef struct hg_amx_a {
    const uint16_t *src;
    int64_t lds, rows, groups, K, ldd, rows_p;
    int t;
    uint16_t *dst;
} hg_amx_a;

/* Rows of a group in the padded copy: whole blocks of 16, and 16 more (a
 * block of 32 rows starting 16 from the end reads them). */
static int64_t hg_amx_rows(int64_t rows) { return (rows + 15) / 16 * 16 + 16; }

/* Its row length: whole tiles, and not a multiple of 2 KiB apart (rows of
 * a tile would share cache sets). */
static int64_t hg_amx_ld(int64_t K)
{
    int64_t Kp = hg_kp(K);
    return Kp * 2 % 2048 == 0 ? Kp + 32 : Kp;
}

/* Units [lo, hi) of (group, block of 16 rows). */
static int hg_amx_a_run(void *user, int64_t lo, int64_t hi)
{
    const hg_amx_a *j = (const hg_amx_a *)user;
    int64_t nblk = j->rows_p / 16, u, r, k;
    for (u = lo; u < hi; u++) {
        int64_t g = u / nblk, r0 = u % nblk * 16;
        int64_t r1 = j->rows - r0 < 16 ? (j->rows > r0 ? j->rows : r0) : r0 + 16;
        uint16_t *d = j->dst + (g * j->rows_p + r0) * j->ldd;
        if (!j->t) {
            for (r = r0; r < r1; r++)
                memcpy(d + (r - r0) * j->ldd, j->src + (g * j->rows + r) * j->lds,
                       (size_t)j->K * sizeof(uint16_t));
        } else { /* 16 neighbours of a row of the source at a time */
            const uint16_t *s = j->src + g * j->rows;
            for (k = 0; k < j->K; k++)
                for (r = r0; r < r1; r++)
                    d[(r - r0) * j->ldd + k] = s[k * j->lds + r];
        }
        for (r = r0; r < r0 + 16; r++, d += j->ldd) {
            int64_t from = r < r1 ? j->K : 0;
            memset(d + from, 0, (size_t)(j->ldd - from) * sizeof(uint16_t));
        }
    }
    return 0;
}

/* The padded copy of A in new workspace (*ld its row length); NULL with
 * the error recorded. */
static uint16_t *hg_amx_pack_a(opjit_ctx *ctx, const void *src, int64_t lds, int t,
                               int64_t groups, int64_t rows, int64_t K, int64_t *ld)
{
    hg_amx_a j;
    j.src = (const uint16_t *)src;
    j.lds = lds;
    j.t = t;
    j.groups = groups;
    j.rows = rows;
    j.K = K;
    j.ldd = *ld = hg_amx_ld(K);
    j.rows_p = hg_amx_rows(rows);
    if (!(j.dst = (uint16_t *)hg_ws(
              ctx, (size_t)(groups * j.rows_p * j.ldd) * sizeof(uint16_t))))
        return NULL;
    if (opjit_parallel_for(ctx, 0, groups * (j.rows_p / 16), 1, hg_amx_a_run, &j))
        return NULL;
    return j.dst;
}
#endif /* AMX */

/* ---- subnormal operands ----------------------------------------------------------- */

typedef struct hg_scan {
    const uint16_t *p;
    int64_t rows, cols, ld;
    int *found; /* one slot a thread */
    opjit_ctx *ctx;
} hg_scan;

/* Rows [64 lo, 64 hi): any bfloat16 subnormal (exponent 0, mantissa not)?
 * |v| - 1 (16 bits, unsigned) is below 0x7f exactly for the subnormals
 * (zero wraps to 0xffff): its minimum over the rows is kept in a vector,
 * three plain operations a vector of 32, no mask registers. */
HG_TARGET static int hg_scan_run(void *user, int64_t lo, int64_t hi)
{
    const hg_scan *s = (const hg_scan *)user;
    const __m512i abs = _mm512_set1_epi16(0x7fff), one = _mm512_set1_epi16(1);
    __m512i least = _mm512_set1_epi16(-1);
    int64_t r, j, r1 = hi * 64 < s->rows ? hi * 64 : s->rows;
    __mmask32 tail = hg_first(s->cols % 32);
    for (r = lo * 64; r < r1; r++) {
        const uint16_t *row = s->p + r * s->ld;
        for (j = 0; j + 32 <= s->cols; j += 32)
            least = _mm512_min_epu16(least, _mm512_sub_epi16(_mm512_and_si512(
                                                 _mm512_loadu_si512((const void *)(row + j)), abs),
                                             one));
        if (tail) /* the lanes past cols load as zero: 0xffff */
            least = _mm512_min_epu16(
                least, _mm512_sub_epi16(_mm512_and_si512(_mm512_maskz_loadu_epi16(tail, row + j),
                                                         abs),
                                        one));
    }
    if (_mm512_cmplt_epu16_mask(least, _mm512_set1_epi16(0x7f)))
        s->found[opjit_thread_num(s->ctx)] = 1;
    return 0;
}

/* Whether rows x cols bfloat16 values (rows ld apart) hold a subnormal:
 * 1, 0, or -1 with the error recorded. */
static int hg_subnormal(opjit_ctx *ctx, const void *p, int64_t rows, int64_t cols, int64_t ld)
{
    hg_scan s;
    int64_t T = opjit_num_threads(ctx), t;
    if (rows <= 0 || cols <= 0)
        return 0;
    s.p = (const uint16_t *)p;
    s.rows = rows;
    s.cols = cols;
    s.ld = ld;
    s.ctx = ctx;
    if (!(s.found = (int *)hg_ws(ctx, (size_t)T * sizeof(int))))
        return -1;
    memset(s.found, 0, (size_t)T * sizeof(int));
    if (opjit_parallel_for(ctx, 0, (rows + 63) / 64, 1, hg_scan_run, &s))
        return -1;
    for (t = 0; t < T; t++)
        if (s.found[t])
            return 1;
    return 0;
}

/* ---- mm --------------------------------------------------------------------------- */

typedef struct hg_mm_job {
    opjit_ctx *ctx;
    int64_t n, k, m, lda, ldb, rows, nb, npanels;
    int yt, even;
    const uint16_t *x, *y;
    uint16_t *out, *xr;
    char *ws;
    size_t per;
} hg_mm_job;

/* Panel p's first column: panels of nb columns (the last may be
 * narrower), or with even, npanels of as equal widths as whole blocks of
 * 16 allow (with threads: a short last panel leaves a thread idle). */
static int64_t hg_mm_col(const hg_mm_job *j, int64_t p)
{
    if (p >= j->npanels)
        return j->m;
    return j->even ? (p * j->m / j->npanels + 8) / 16 * 16 : p * j->nb;
}

/* Chunks [lo, hi) of (block of rows, panel of columns), panel fastest. */
static int hg_mm_run(void *user, int64_t lo, int64_t hi)
{
    const hg_mm_job *j = (const hg_mm_job *)user;
    int64_t np0 = (j->nb + 15) / 16 * 16, t, packed = -1;
    hg_area_ptrs a = hg_carve(j->ws + (size_t)opjit_thread_num(j->ctx) * j->per, j->k, np0);
    for (t = lo; t < hi; t++) {
        int64_t panel = t % j->npanels, r0 = (t / j->npanels) * j->rows;
        int64_t c0 = hg_mm_col(j, panel), nb = hg_mm_col(j, panel + 1) - c0;
        int64_t np = (nb + 15) / 16 * 16, nr = j->n - r0 < j->rows ? j->n - r0 : j->rows;
        if (packed != panel) {
            if (j->yt)
                hg_pack_cols(j->y + c0 * j->ldb, j->ldb, j->k, nb, a.p, np);
            else
                hg_pack_rows(j->y + c0, j->ldb, j->k, nb, a.p, np);
            packed = panel;
        }
        hg_gemm_store(nr, j->k, j->x + r0 * j->lda, j->lda, a.p, nb, np, NULL,
                      j->out + r0 * j->m + c0, j->m, a.ct, a.at);
    }
    return 0;
}

/* Rows [64 lo, 64 hi) of a column-major self (element (i, q) at x[q *
 * lda + i]) into a row-major copy (xr, k a row), blocks of 32 rows x 16
 * pairs of k: rows q and q+1 of x, 32 values each (a cache line; a half
 * line a block would fetch each line twice where lda is a large power of
 * two), interleaved into pairs (as hg_pack_rows), each 16 x 16 words
 * transposed (hg_tr16) and each row's 16 pairs stored whole (the part
 * past k masked off). Pairs outermost: a step touches 32 rows of x and
 * the unit's 64 rows of the copy (pages: rows 4 KB apart, each on its
 * own, and rows outermost had the copy of 2048 x 2048 cost 3% of
 * mm_backward's time). */
HG_TARGET static int hg_transpose_run(void *user, int64_t lo, int64_t hi)
{
    const hg_mm_job *j = (const hg_mm_job *)user;
    const __m512i il = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i ih = _mm512_add_epi16(il, _mm512_set1_epi16(16));
    int64_t r0 = lo * 64, r1 = hi * 64 < j->n ? hi * 64 : j->n, kh = (j->k + 1) / 2, i0, q0, p;
    __m512i v[16], w[16];
    for (q0 = 0; q0 < kh; q0 += 16) {
        __mmask32 mk = hg_first(j->k - 2 * q0);
        for (i0 = r0; i0 < r1; i0 += 32) {
            __mmask32 m = hg_first(r1 - i0);
            _Pragma("GCC unroll 16") for (p = 0; p < 16; p++) {
                int64_t q = 2 * (q0 + p);
                const uint16_t *s = j->x + q * j->lda + i0;
                __m512i a = q < j->k ? _mm512_maskz_loadu_epi16(m, s) : _mm512_setzero_si512();
                __m512i b = q + 1 < j->k ? _mm512_maskz_loadu_epi16(m, s + j->lda)
                                         : _mm512_setzero_si512();
                v[p] = _mm512_permutex2var_epi16(a, il, b);
                w[p] = _mm512_permutex2var_epi16(a, ih, b);
            }
            hg_tr16(v);
            hg_tr16(w);
            _Pragma("GCC unroll 16") for (p = 0; p < 16; p++)
                if (i0 + p < r1)
                    _mm512_mask_storeu_epi16(j->xr + (i0 + p) * j->k + 2 * q0, mk, v[p]);
            _Pragma("GCC unroll 16") for (p = 0; p < 16; p++)
                if (i0 + 16 + p < r1)
                    _mm512_mask_storeu_epi16(j->xr + (i0 + 16 + p) * j->k + 2 * q0, mk, w[p]);
        }
    }
    return 0;
}

/* Panels of mat2 of up to 384 KB (in L2), at least 48 columns, more of
 * them, then blocks of rows, until each thread has about three chunks
 * (mm.c's float32 plan). With threads, where that leaves a narrow last
 * panel (a thread idle at the end: 0.9x torch at 512 and 1024 on two
 * threads), instead a multiple of T panels of even widths, at least two a
 * thread (m / 16 a multiple of their number where one is near), when they
 * are at least 96 wide (narrower run the slower 32-column kernels). */
static void hg_mm_plan(hg_mm_job *j, int64_t T)
{
    int64_t nb = ((int64_t)384 << 10) / 2 / j->k / 48 * 48, chunks, rb = j->n, p, c;
    if (nb < 48)
        nb = 48;
    j->npanels = (j->m + nb - 1) / nb;
    if (T > 1 && j->m % nb) {
        c = j->npanels < 2 * T ? 2 * T : (j->npanels + T - 1) / T * T;
        for (p = c; p < c + 2 * T; p += T)
            if (j->m % (16 * p) == 0) {
                c = p;
                break;
            }
        if (j->m / c >= 96) {
            j->npanels = c;
            j->even = 1;
            for (j->nb = 0, p = 0; p < c; p++)
                if (hg_mm_col(j, p + 1) - hg_mm_col(j, p) > j->nb)
                    j->nb = hg_mm_col(j, p + 1) - hg_mm_col(j, p);
            j->rows = rb;
            return;
        }
    }
    if (T > 1 && (j->m + nb - 1) / nb < 3 * T) {
        int64_t want = ((j->m + 3 * T - 1) / (3 * T) + 47) / 48 * 48;
        nb = want < nb ? want : nb;
    }
    if (nb > j->m)
        nb = j->m;
    j->nb = nb;
    j->npanels = (j->m + nb - 1) / nb;
    chunks = j->npanels;
    if (T > 1 && chunks < 3 * T && j->n >= 128) {
        int64_t nblocks = (3 * T + chunks - 1) / chunks;
        rb = (j->n + nblocks - 1) / nblocks;
        rb = rb < 64 ? 64 : (rb + 7) / 8 * 8;
    }
    j->rows = rb;
}

#ifdef HG_AMX
/* mm on tiles: self as it is where the tiles can read it, else padded
 * (hg_amx_pack_a; rows of it either way), all of mat2 on tiles once (bt:
 * column block c's stream at bt + c / 16 * hg_amx_stream(k)), then units
 * of (block of rows, block of nb columns, its part of mat2 about 512 KiB,
 * in L2), each over all of k. */
typedef struct hg_amx_mm_job {
    const hg_mm_job *j;
    const uint16_t *a;
    uint16_t *bt;
    int64_t lda, nb, ncb, rows;
    char *ws;
} hg_amx_mm_job;

/* Blocks of 16 columns [lo, hi) of mat2 rows (element (k, j) at y[k * ldb
 * + j]) into their streams: a pair of rows at a time (read along the
 * rows), 32 columns a step. */
HG_AMX_TARGET static void hg_amx_pack_rows(const hg_mm_job *j, uint16_t *bt, int64_t lo,
                                           int64_t hi)
{
    const __m512i il = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i ih = _mm512_add_epi16(il, _mm512_set1_epi16(16));
    int64_t ls = hg_amx_stream(j->k), kp, jb;
    for (kp = 0; kp < hg_kp(j->k) / 2; kp++) {
        const uint16_t *r0 = j->y + 2 * kp * j->ldb;
        for (jb = lo; jb < hi; jb += 2) {
            int64_t left = j->m - jb * 16;
            __mmask32 m = left >= 32 ? ~(__mmask32)0
                          : left > 0 ? (((__mmask32)1 << left) - 1) : 0;
            uint16_t *d0 = bt + jb * ls + kp * 32;
            __m512i x0 = 2 * kp < j->k ? _mm512_maskz_loadu_epi16(m, r0 + jb * 16)
                                       : _mm512_setzero_si512();
            __m512i x1 = 2 * kp + 1 < j->k ? _mm512_maskz_loadu_epi16(m, r0 + j->ldb + jb * 16)
                                           : _mm512_setzero_si512();
            _mm512_storeu_si512((void *)d0, _mm512_permutex2var_epi16(x0, il, x1));
            if (jb + 1 < hi)
                _mm512_storeu_si512((void *)(d0 + ls), _mm512_permutex2var_epi16(x0, ih, x1));
        }
    }
}

/* The same from mat2's columns (element (k, j) at y[j * ldb + k]): a pair
 * is one 32-bit word. */
static void hg_amx_pack_cols(const hg_mm_job *j, uint16_t *bt, int64_t lo, int64_t hi)
{
    int64_t ls = hg_amx_stream(j->k), half = hg_kp(j->k) / 2, jb, c, kp;
    for (jb = lo; jb < hi; jb++) {
        uint32_t *d = (uint32_t *)(void *)(bt + jb * ls);
        for (c = 0; c < 16; c++) {
            const uint16_t *col = j->y + (jb * 16 + c) * j->ldb;
            if (jb * 16 + c >= j->m) {
                for (kp = 0; kp < half; kp++)
                    d[kp * 16 + c] = 0;
                continue;
            }
            for (kp = 0; 2 * kp + 1 < j->k; kp++)
                d[kp * 16 + c] = hg_pair(col + 2 * kp);
            for (; kp < half; kp++)
                d[kp * 16 + c] = 2 * kp < j->k ? col[2 * kp] : 0;
        }
    }
}

/* Units [lo, hi) of packing: 256 columns of mat2 each. */
static int hg_amx_mm_pack(void *user, int64_t lo, int64_t hi)
{
    const hg_amx_mm_job *q = (const hg_amx_mm_job *)user;
    int64_t nblk = (q->j->m + 15) / 16, b0 = lo * 16, b1 = hi * 16 < nblk ? hi * 16 : nblk;
    if (q->j->yt)
        hg_amx_pack_cols(q->j, q->bt, b0, b1);
    else
        hg_amx_pack_rows(q->j, q->bt, b0, b1);
    return 0;
}

/* Units [lo, hi) of products, column block fastest. */
static int hg_amx_mm_run(void *user, int64_t lo, int64_t hi)
{
    const hg_amx_mm_job *q = (const hg_amx_mm_job *)user;
    const hg_mm_job *j = q->j;
    float *ct = (float *)(void *)(q->ws + (size_t)opjit_thread_num(j->ctx) * hg_ct(q->nb) * 4);
    int64_t t;
    hg_amx_begin();
    for (t = lo; t < hi; t++) {
        int64_t c0 = t % q->ncb * q->nb, r0 = t / q->ncb * q->rows;
        int64_t nb = j->m - c0 < q->nb ? j->m - c0 : q->nb;
        int64_t nr = j->n - r0 < q->rows ? j->n - r0 : q->rows;
        hg_amx_store(nr, j->k, q->a + r0 * q->lda, q->lda,
                     q->bt + c0 / 16 * hg_amx_stream(j->k), nb, (nb + 15) / 16 * 16, NULL,
                     j->out + r0 * j->m + c0, j->m, ct);
    }
    hg_amx_end();
    return 0;
}

static int hg_amx_mm(opjit_ctx *ctx, const hg_mm_job *j, int xt)
{
    hg_amx_mm_job q;
    int64_t T = opjit_num_threads(ctx), Kp = hg_kp(j->k), mp = (j->m + 15) / 16 * 16, nrb;
    int rc;
    memset(&q, 0, sizeof q);
    q.j = j;
    /* self read in place: whole tiles of k, whole blocks of 16 rows (a block
     * of 32 reads 16 past the last only where there are), rows not a
     * multiple of 2 KiB apart (hg_amx_ld) */
    if (!xt && j->k % 32 == 0 && j->n % 16 == 0 && j->lda * 2 % 2048 != 0) {
        q.a = j->x;
        q.lda = j->lda;
    } else if (!(q.a = hg_amx_pack_a(ctx, j->x, j->lda, xt, 1, j->n, j->k, &q.lda))) {
        return -1;
    }
    /* blocks of columns: 512 KiB of mat2 on tiles, at least 32 columns */
    q.nb = ((int64_t)512 << 10) / (2 * Kp) / 32 * 32;
    q.nb = q.nb < 32 ? 32 : q.nb > mp ? (j->m + 31) / 32 * 32 : q.nb;
    q.ncb = (j->m + q.nb - 1) / q.nb;
    /* blocks of rows (multiples of 32) until each thread has about three units */
    q.rows = (j->n + 31) / 32 * 32;
    nrb = (3 * T + q.ncb - 1) / q.ncb;
    if (T > 1 && nrb > 1)
        q.rows = ((j->n + nrb - 1) / nrb + 31) / 32 * 32;
    if (!(q.bt = (uint16_t *)hg_ws(ctx, (size_t)(mp / 16 * hg_amx_stream(j->k)) * 2)) ||
        !(q.ws = (char *)hg_ws(ctx, (size_t)T * hg_ct(q.nb) * 4)))
        return -1;
    if ((rc = opjit_parallel_for(ctx, 0, (mp / 16 + 15) / 16, 1, hg_amx_mm_pack, &q)) != 0)
        return rc;
    return opjit_parallel_for(ctx, 0, q.ncb * ((j->n + q.rows - 1) / q.rows), 1, hg_amx_mm_run,
                              &q);
}
#endif

/* j for out [n, m] = x [n, k] y [k, m] (hg_mm_bf16's arguments but xt). */
static void hg_mm_init(hg_mm_job *j, opjit_ctx *ctx, int64_t n, int64_t k, int64_t m,
                       const void *x, int64_t lda, const void *y, int yt, int64_t ldb, void *out)
{
    memset(j, 0, sizeof *j);
    j->ctx = ctx;
    j->n = n;
    j->k = k;
    j->m = m;
    j->x = (const uint16_t *)x;
    j->lda = lda;
    j->y = (const uint16_t *)y;
    j->ldb = ldb;
    j->yt = yt;
    j->out = (uint16_t *)out;
}

/* Passes over units of 64 rows in one parallel region, one after the
 * other: subnormal scans (hg_scan_run), transposing copies
 * (hg_transpose_run). */
typedef struct hg_passes {
    opjit_chunk_fn fn[5];
    void *user[5];
    int64_t units[5];
    int n;
} hg_passes;

static void hg_pass_add(hg_passes *q, opjit_chunk_fn fn, void *user, int64_t rows)
{
    q->fn[q->n] = fn;
    q->user[q->n] = user;
    q->units[q->n++] = (rows + 63) / 64;
}

static int hg_passes_run(void *user, int64_t lo, int64_t hi)
{
    const hg_passes *q = (const hg_passes *)user;
    int64_t t, u;
    int i;
    for (t = lo; t < hi; t++) {
        for (u = t, i = 0; u >= q->units[i]; i++)
            u -= q->units[i];
        q->fn[i](q->user[i], u, u + 1);
    }
    return 0;
}

static int hg_passes_go(opjit_ctx *ctx, hg_passes *q)
{
    int64_t all = 0;
    int i;
    for (i = 0; i < q->n; i++)
        all += q->units[i];
    return opjit_parallel_for(ctx, 0, all, 1, hg_passes_run, q);
}

/* Where xt (a column-major self), room for j's self copied row-major
 * (j->xr) and that copy's pass added to q; hg_mm_ready then points j at
 * it. 0, or -1 with the error recorded. */
static int hg_mm_copy(opjit_ctx *ctx, hg_mm_job *j, int xt, hg_passes *q)
{
    if (!xt)
        return 0;
    if (!(j->xr = (uint16_t *)hg_ws(ctx, (size_t)(j->n * j->k) * sizeof(uint16_t))))
        return -1;
    hg_pass_add(q, hg_transpose_run, j, j->n);
    return 0;
}

/* j, its passes run, as the kernels read it, and its blocks for T
 * threads. */
static void hg_mm_ready(hg_mm_job *j, int64_t T)
{
    if (j->xr) {
        j->x = j->xr;
        j->lda = j->k;
    }
    hg_mm_plan(j, T);
    j->per = hg_area(j->k, (j->nb + 15) / 16 * 16);
}

/* The chunks of j. */
static int64_t hg_mm_chunks(const hg_mm_job *j)
{
    return j->npanels * ((j->n + j->rows - 1) / j->rows);
}

/* out [n, m] = x [n, k] y [k, m], all bfloat16, float32 sums: x row-major
 * (lda) or transposed (xt: element (i, k) at x[k * lda + i]), y likewise
 * (yt); on tiles (amx, where hg_amx_cpu) or vdpbf16ps. 0, or the status
 * of the failure recorded. */
static int hg_mm_bf16(opjit_ctx *ctx, int64_t n, int64_t k, int64_t m, const void *x, int xt,
                      int64_t lda, const void *y, int yt, int64_t ldb, void *out, int amx)
{
    hg_mm_job j;
    hg_passes q;
    int64_t T = opjit_num_threads(ctx);
    int rc;
    if (n == 0 || m == 0)
        return 0;
    if (k == 0) {
        memset(out, 0, (size_t)(n * m) * sizeof(uint16_t));
        return 0;
    }
    hg_mm_init(&j, ctx, n, k, m, x, lda, y, yt, ldb, out);
#ifdef HG_AMX
    if (amx)
        return hg_amx_mm(ctx, &j, xt);
#else
    (void)amx;
#endif
    memset(&q, 0, sizeof q);
    if (hg_mm_copy(ctx, &j, xt, &q))
        return -1;
    if (q.n && (rc = hg_passes_go(ctx, &q)) != 0)
        return rc;
    hg_mm_ready(&j, T);
    if (!(j.ws = (char *)hg_ws(ctx, (size_t)T * j.per)))
        return -1;
    return opjit_parallel_for(ctx, 0, hg_mm_chunks(&j), 1, hg_mm_run, &j);
}

/* mm_backward's products on vdpbf16ps, gx [n, k] = g [n, m] y^T and gy
 * [k, m] = x^T g, for g, x [n, k] and y [k, m] each row-major or
 * transposed (gt, xt, yt as hg_mm_bf16's xt) with its leading dimension:
 * each as hg_mm_bf16 computes it (the same bits), in two parallel
 * regions: the passes over the operands (with scan, hg_subnormal's scans
 * of all three; the transposing copies of self, g for gx where it is
 * column-major and x for gy where it is row-major), then both products.
 * n, k, m > 0. *sub: whether the scans found a bfloat16 subnormal (then
 * nothing is computed). 0, or the status of the failure recorded. */
static int hg_mm_bf16_grads(opjit_ctx *ctx, int64_t n, int64_t k, int64_t m, const void *g,
                            int gt, int64_t ldg, const void *x, int xt, int64_t ldx,
                            const void *y, int yt, int64_t ldy, void *gx, void *gy, int scan,
                            int *sub)
{
    hg_mm_job a, b;
    hg_passes q;
    hg_scan sc[3];
    const void *op[3] = {g, x, y};
    int64_t T = opjit_num_threads(ctx), t;
    int64_t rows[3] = {gt ? m : n, xt ? k : n, yt ? m : k}; /* as stored */
    int64_t cols[3] = {gt ? n : m, xt ? n : k, yt ? k : m}, ld[3] = {ldg, ldx, ldy};
    int rc, i, *found = NULL;
    memset(&q, 0, sizeof q);
    if (scan) {
        if (!(found = (int *)hg_ws(ctx, (size_t)T * sizeof(int))))
            return -1;
        memset(found, 0, (size_t)T * sizeof(int));
        for (i = 0; i < 3; i++) {
            sc[i].p = (const uint16_t *)op[i];
            sc[i].rows = rows[i];
            sc[i].cols = cols[i];
            sc[i].ld = ld[i];
            sc[i].found = found;
            sc[i].ctx = ctx;
            hg_pass_add(&q, hg_scan_run, &sc[i], rows[i]);
        }
    }
    /* y^T is column-major where y is row-major, x^T likewise */
    hg_mm_init(&a, ctx, n, m, k, g, ldg, y, !yt, ldy, gx);
    hg_mm_init(&b, ctx, k, n, m, x, ldx, g, gt, ldg, gy);
    if (hg_mm_copy(ctx, &a, gt, &q) || hg_mm_copy(ctx, &b, !xt, &q))
        return -1;
    if (q.n && (rc = hg_passes_go(ctx, &q)) != 0)
        return rc;
    for (*sub = 0, t = 0; found && t < T; t++)
        *sub |= found[t];
    if (*sub)
        return 0;
    hg_mm_ready(&a, T);
    hg_mm_ready(&b, T);
    a.per = b.per = a.per > b.per ? a.per : b.per;
    if (!(a.ws = b.ws = (char *)hg_ws(ctx, (size_t)T * a.per)))
        return -1;
    /* both on one area a thread, the larger of the two */
    return parallel_for_pair(ctx, hg_mm_run, &a, hg_mm_chunks(&a), hg_mm_run, &b,
                             hg_mm_chunks(&b));
}

/* ---- conv2d ----------------------------------------------------------------------- */

/* The unfolded input of one image and group for output positions p0 ..
 * p0 + np - 1 into col (float32 rows ldc apart): conv2d.c's im2col. */
typedef void (*hg_unfold_fn)(const void *geom, const float *im, const float *xend, int64_t p0,
                             int64_t np, float *col, int64_t ldc);

/* One convolution's shape, as the GEMM sees it: per image and group,
 * out [og, plane] = w [og, kdim] . col [kdim, plane]. */
typedef struct hg_conv {
    int64_t n, groups, og, kdim, plane;
    int64_t in_image, in_group; /* input elements an image, a group */
    int64_t h, w, kh, kw, sh, sw, dh, dw, ph, pw, wo;
    int direct;                 /* 1x1, stride 1, no padding: col is the input */
    hg_unfold_fn unfold;        /* sw > 1: this, on the widened input */
    const void *geom;
} hg_conv;

/* Tap k of the kernel (c, ki, kj): its channel's plane in the image, and
 * its row and column offsets from an output position's. */
typedef struct hg_tap_at {
    const uint16_t *plane;
    int64_t dy, dx;
} hg_tap_at;

static hg_tap_at hg_tap_of(const hg_conv *s, const uint16_t *im, int64_t k)
{
    hg_tap_at t;
    int64_t r = k % (s->kh * s->kw);
    t.plane = im + k / (s->kh * s->kw) * s->h * s->w;
    t.dy = r / s->kw * s->dh - s->ph;
    t.dx = r % s->kw * s->dw - s->pw;
    return t;
}

/* Tap t's values for output row oh, columns ow0 .. ow0 + cnt - 1 (cnt <=
 * 32, column stride 1): zeros where it falls in the padding. Masked loads
 * fault on no masked-out element, so the base may point before the row. */
HG_TARGET static inline __m512i hg_tap(const hg_conv *s, hg_tap_at t, int64_t oh, int64_t ow0,
                                       int64_t cnt)
{
    int64_t ih = oh * s->sh + t.dy, iw0 = ow0 + t.dx;
    int64_t lo = iw0 < 0 ? -iw0 : 0, hi = s->w - iw0 < cnt ? s->w - iw0 : cnt;
    uint64_t m;
    if (ih < 0 || ih >= s->h || lo >= hi)
        return _mm512_setzero_si512();
    m = (((uint64_t)1 << hi) - 1) & ~(((uint64_t)1 << lo) - 1);
    return _mm512_maskz_loadu_epi16((__mmask32)m, t.plane + ih * s->w + iw0);
}

/* The unfolded input of one image and group (im: its first channel,
 * bfloat16) for positions p0 .. p0 + nb - 1, straight into pairs of k
 * (P, as hg_pack_rows makes it; np >= nb a multiple of 16), for a
 * column stride of 1: one pass, no float32 copy. Writes up to 16 pairs
 * past the end of P (HG_SPILL). */
HG_TARGET static void hg_unfold_pairs(const hg_conv *s, const uint16_t *im, int64_t p0,
                                      int64_t nb, uint16_t *P, int64_t np)
{
    const __m512i lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i hi = _mm512_add_epi16(lo, _mm512_set1_epi16(16));
    int64_t k, p, q, j;
    for (k = 0; k < s->kdim; k += 2, P += 2 * np) {
        uint32_t *d = (uint32_t *)(void *)P;
        hg_tap_at t0 = hg_tap_of(s, im, k), t1 = hg_tap_of(s, im, k + 1 < s->kdim ? k + 1 : k);
        for (p = p0; p < p0 + nb;) {
            int64_t oh = p / s->wo, ow = p % s->wo;
            int64_t run = s->wo - ow < p0 + nb - p ? s->wo - ow : p0 + nb - p;
            for (q = 0; q < run; q += 32) {
                int64_t cnt = run - q < 32 ? run - q : 32;
                __m512i x0 = hg_tap(s, t0, oh, ow + q, cnt);
                __m512i x1 = k + 1 < s->kdim ? hg_tap(s, t1, oh, ow + q, cnt)
                                             : _mm512_setzero_si512();
                j = p - p0 + q;
                /* whole vectors (masked stores are slow on some CPUs, Zen 4
                 * among them): what lands past this run is overwritten by
                 * the next run, the zeros past nb, the next pair's row or,
                 * past the last, falls in HG_SPILL's slack */
                _mm512_storeu_si512((void *)(d + j), _mm512_permutex2var_epi16(x0, lo, x1));
                if (cnt > 16)
                    _mm512_storeu_si512((void *)(d + j + 16),
                                        _mm512_permutex2var_epi16(x0, hi, x1));
            }
            p += run;
        }
        for (j = nb; j < np; j++)
            d[j] = 0;
    }
}

typedef struct hg_conv_job {
    opjit_ctx *ctx;
    const hg_conv *s;
    const uint16_t *x, *w;
    const float *xw, *xend, *bias; /* the input widened (not direct), bias widened */
    uint16_t *out;
    int64_t pb, nblk, ldcol;
    char *ws;
    size_t per, colb;
    const uint16_t *wa; /* on tiles: w padded (hg_amx_pack_a), rows lwa apart, */
    int64_t lwa, rows_p; /* rows_p a group */
} hg_conv_job;

/* Units [lo, hi) of (image, group, block of positions): unfold, pack, the
 * product, rounded into the output. */
static int hg_conv_run(void *user, int64_t lo, int64_t hi)
{
    const hg_conv_job *j = (const hg_conv_job *)user;
    const hg_conv *s = j->s;
    char *area = j->ws + (size_t)opjit_thread_num(j->ctx) * j->per;
    float *col = (float *)(void *)area;
    int64_t npb = (j->pb + 15) / 16 * 16, u;
    hg_area_ptrs a = hg_carve(area + j->colb, s->kdim, npb);
#ifdef HG_AMX
    if (j->wa)
        hg_amx_begin();
#endif
    for (u = lo; u < hi; u++) {
        int64_t blk = u % j->nblk, ng = u / j->nblk, img = ng / s->groups, gi = ng % s->groups;
        int64_t p0 = blk * j->pb, nb = s->plane - p0 < j->pb ? s->plane - p0 : j->pb;
        int64_t in = img * s->in_image + gi * s->in_group, oc = gi * s->og;
        if (s->direct) {
            hg_pack_rows(j->x + in + p0, s->plane, s->kdim, nb, a.p, (nb + 15) / 16 * 16);
        } else if (s->sw == 1) {
            hg_unfold_pairs(s, j->x + in, p0, nb, a.p, (nb + 15) / 16 * 16);
        } else {
            s->unfold(s->geom, j->xw + in, j->xend, p0, nb, col, j->ldcol);
            hg_pack_f32(col, j->ldcol, s->kdim, nb, a.p, (nb + 15) / 16 * 16);
        }
#ifdef HG_AMX
        if (j->wa) {
            hg_amx_tiles(a.p, s->kdim, (nb + 15) / 16 * 16, a.t);
            hg_amx_store(s->og, s->kdim, j->wa + gi * j->rows_p * j->lwa, j->lwa, a.t, nb,
                         (nb + 15) / 16 * 16, j->bias ? j->bias + oc : NULL,
                         j->out + (img * s->groups * s->og + oc) * s->plane + p0, s->plane,
                         a.ct);
            continue;
        }
#endif
        hg_gemm_store(s->og, s->kdim, j->w + oc * s->kdim, s->kdim, a.p, nb,
                      (nb + 15) / 16 * 16, j->bias ? j->bias + oc : NULL,
                      j->out + (img * s->groups * s->og + oc) * s->plane + p0, s->plane, a.ct,
                      a.at);
    }
#ifdef HG_AMX
    if (j->wa)
        hg_amx_end();
#endif
    return 0;
}

/* ---- 1x1 over small planes: the batch's positions side by side ---------------------
 * With few positions an image (ResNet's 7x7: 49), a product per image
 * pads its columns to whole vectors (49 to 64: a quarter of the work
 * wasted) and streams the whole weight matrix once an image. Instead the
 * positions of every image, side by side, are packed once (per group),
 * and a unit is a block of output channels over all of them. Each element
 * is the same chain over k as on the other path. */

typedef struct hg_small_job {
    opjit_ctx *ctx;
    const hg_conv *s;
    const uint16_t *x, *w;
    const float *bias;
    uint16_t *out, *packed;
    int64_t np, ob, nob; /* np: the batch's positions, rounded up to 16 */
    size_t psz;          /* elements of one group's packed block */
    char *ws;
    size_t per;
    const uint16_t *wa; /* as hg_conv_job's */
    int64_t lwa, rows_p;
    uint16_t *tiles; /* packed on tiles (hg_amx_tiles), psz a group */
} hg_small_job;

/* Images x groups [lo, hi) into pairs of k, image img's positions at
 * columns img * plane (masked stores: neighbours are left alone); the
 * last image also zeroes the columns past the batch's. */
HG_TARGET static int hg_small_pack_run(void *user, int64_t lo, int64_t hi)
{
    const hg_small_job *j = (const hg_small_job *)user;
    const hg_conv *s = j->s;
    const __m512i il = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9,
                                        40, 8, 39, 7, 38, 6, 37, 5, 36, 4, 35, 3, 34, 2, 33, 1,
                                        32, 0);
    const __m512i ih = _mm512_add_epi16(il, _mm512_set1_epi16(16));
    int64_t u, k, q, c;
    for (u = lo; u < hi; u++) {
        int64_t img = u / s->groups, gi = u % s->groups;
        const uint16_t *x = j->x + img * s->in_image + gi * s->in_group;
        uint32_t *d = (uint32_t *)(void *)(j->packed + (size_t)gi * j->psz) + img * s->plane;
        for (k = 0; k < s->kdim; k += 2, d += j->np) {
            for (q = 0; q < s->plane; q += 32) {
                int64_t cnt = s->plane - q < 32 ? s->plane - q : 32;
                __mmask32 m = (__mmask32)((((uint64_t)1) << cnt) - 1);
                __m512i x0 = _mm512_maskz_loadu_epi16(m, x + k * s->plane + q);
                __m512i x1 = k + 1 < s->kdim ? _mm512_maskz_loadu_epi16(m, x + (k + 1) * s->plane + q)
                                             : _mm512_setzero_si512();
                __mmask16 m0 = (__mmask16)(cnt >= 16 ? 0xffff : (1u << cnt) - 1);
                __mmask16 m1 = (__mmask16)(cnt >= 32 ? 0xffff : cnt > 16 ? (1u << (cnt - 16)) - 1
                                                                          : 0);
                _mm512_mask_storeu_epi32(d + q, m0, _mm512_permutex2var_epi16(x0, il, x1));
                _mm512_mask_storeu_epi32(d + q + 16, m1, _mm512_permutex2var_epi16(x0, ih, x1));
            }
            if (img == s->n - 1)
                for (c = s->plane; c < j->np - img * s->plane; c++)
                    d[c] = 0;
        }
    }
    return 0;
}

#ifdef HG_AMX
/* A block of the batch's columns [c, c + 32) into the images it covers. */
typedef struct hg_amx_small_out {
    const hg_conv *s;
    int64_t rows, all, oc;
    const float *bias;
    uint16_t *out;
} hg_amx_small_out;

static void hg_amx_fin_small(const void *user, int64_t c0, const float *ct)
{
    const hg_amx_small_out *o = (const hg_amx_small_out *)user;
    const hg_conv *s = o->s;
    int64_t c, c1 = o->all - c0 < 32 ? o->all : c0 + 32;
    for (c = c0; c < c1;) {
        int64_t img = c / s->plane, e = (img + 1) * s->plane < c1 ? (img + 1) * s->plane : c1;
        hg_store(ct + (c - c0), 32, o->rows, e - c, o->bias,
                 o->out + (img * s->groups * s->og + o->oc) * s->plane + (c - img * s->plane),
                 s->plane);
        c = e;
    }
}

/* hg_small_run's units on tiles: blocks of 32 channels over the batch's
 * positions, each image's share of a block stored. */
static void hg_amx_small(const hg_small_job *j, int64_t lo, int64_t hi, float *ct)
{
    const hg_conv *s = j->s;
    hg_amx_small_out o;
    int64_t u, i;
    o.s = s;
    o.all = s->n * s->plane;
    o.out = j->out;
    hg_amx_begin();
    for (u = lo; u < hi; u++) {
        int64_t gi = u / j->nob, o0 = u % j->nob * j->ob;
        int64_t no = s->og - o0 < j->ob ? s->og - o0 : j->ob, oc = gi * s->og + o0;
        for (i = 0; i < no; i += 32) {
            o.rows = no - i < 32 ? no - i : 32;
            o.oc = oc + i;
            o.bias = j->bias ? j->bias + oc + i : NULL;
            hg_amx_rows32(s->kdim, j->wa + (gi * j->rows_p + o0 + i) * j->lwa, j->lwa,
                          j->tiles + (size_t)gi * j->psz, o.all, j->np, no - i > 16, ct,
                          hg_amx_fin_small, &o);
        }
    }
    hg_amx_end();
}
#endif

/* Units [lo, hi) of (group, block of ob output channels): strips of 8
 * channels over the batch's positions, each image's share stored. */
static int hg_small_run(void *user, int64_t lo, int64_t hi)
{
    const hg_small_job *j = (const hg_small_job *)user;
    const hg_conv *s = j->s;
    char *area = j->ws + (size_t)opjit_thread_num(j->ctx) * j->per;
    float *ct = (float *)(void *)area;
    uint16_t *at = (uint16_t *)(void *)(area + ((size_t)(8 * j->np) * 4 + 63) / 64 * 64);
    int64_t u, img, i, la;
#ifdef HG_AMX
    if (j->wa) {
        hg_amx_small(j, lo, hi, ct);
        return 0;
    }
#endif
    for (u = lo; u < hi; u++) {
        int64_t gi = u / j->nob, o0 = u % j->nob * j->ob;
        int64_t no = s->og - o0 < j->ob ? s->og - o0 : j->ob, oc = gi * s->og + o0;
        const uint16_t *wg = j->w + oc * s->kdim;
        for (i = 0; i < no; i += 8) {
            const uint16_t *a = hg_rows(wg, s->kdim, no, s->kdim, i, at, &la);
            int64_t rows = no - i < 8 ? no - i : 8;
            hg_strip(s->kdim, a, la, j->packed + (size_t)gi * j->psz, j->np, ct, j->np);
            for (img = 0; img < s->n; img++)
                hg_store(ct + img * s->plane, j->np, rows, s->plane,
                         j->bias ? j->bias + oc + i : NULL,
                         j->out + (img * s->groups * s->og + oc + i) * s->plane, s->plane);
        }
    }
    return 0;
}

/* The small-plane path when it applies (1x1 direct, several images, at
 * most 256 positions an image, a group's packed batch within 8 MB): 1 (*rc
 * its status), else 0. */
static int hg_conv_small(opjit_ctx *ctx, const hg_conv *s, const void *x, const void *w,
                         const float *bias, void *out, const uint16_t *wa, int64_t lwa, int *rc)
{
    hg_small_job j;
    int64_t T = opjit_num_threads(ctx);
    memset(&j, 0, sizeof j);
    j.np = (s->n * s->plane + 15) / 16 * 16;
    j.psz = (size_t)(hg_kp(s->kdim) * j.np);
    if (!s->direct || s->n < 2 || s->plane > 256 || j.psz * 2 > ((size_t)8 << 20))
        return 0;
    j.ctx = ctx;
    j.s = s;
    j.x = (const uint16_t *)x;
    j.w = (const uint16_t *)w;
    j.bias = bias;
    j.out = (uint16_t *)out;
    /* blocks of 64 output channels, smaller (in 8s) until each thread has
     * about three */
    j.ob = 64;
    while (j.ob > 8 && s->groups * ((s->og + j.ob - 1) / j.ob) < 3 * T)
        j.ob -= 8;
    j.nob = (s->og + j.ob - 1) / j.ob;
    j.per = (hg_ct(j.np) * 4 + 63) / 64 * 64 + (size_t)(8 * s->kdim) * 2 + 64;
    j.wa = wa;
    j.lwa = lwa;
#ifdef HG_AMX
    j.rows_p = hg_amx_rows(s->og);
#endif
    if (!(j.packed = (uint16_t *)hg_ws(ctx, (size_t)s->groups * j.psz * 2)) ||
        !(j.ws = (char *)hg_ws(ctx, (size_t)T * j.per))) {
        *rc = -1;
        return 1;
    }
    if ((*rc = opjit_parallel_for(ctx, 0, s->n * s->groups, 1, hg_small_pack_run, &j)) != 0)
        return 1;
#ifdef HG_AMX
    if (wa && !(j.tiles = (uint16_t *)hg_ws(ctx, (size_t)s->groups * j.psz * 2))) {
        *rc = -1;
        return 1;
    }
    for (int64_t gi = 0; wa && gi < s->groups; gi++)
        hg_amx_tiles(j.packed + (size_t)gi * j.psz, s->kdim, j.np, j.tiles + (size_t)gi * j.psz);
#endif
    *rc = opjit_parallel_for(ctx, 0, s->groups * j.nob, 1, hg_small_run, &j);
    return 1;
}

#ifdef HG_AMX
/* ---- stride 1 on tiles: a GEMM per tap over a shifted input -------------------
 * With stride 1, tap (ky, kx) of every output position reads the input at
 * that position shifted by (ky dh, kx dw). Laid out with a padded row
 * length Wp (a multiple of 16), output position (oh, ow) is column q = oh
 * Wp + ow and its input for tap (ky, kx) is column q + ky dh Wp + kx dw of
 * the zero-padded input: so out = sum over taps of W_tap [O, C] . X
 * shifted, and the shift by whole rows is a shift by whole tile streams.
 * The input is packed on tiles once per column shift kx dw (xs[kx]: the
 * padded input shifted left by kx dw columns), kw copies instead of
 * im2col's kh kw; the columns ow >= Wo of each row are computed and
 * dropped. Each output element is one chain over (tap, channel pair) in
 * order, by one thread: the thread count changes no bit. */
typedef struct hg_taps {
    const hg_conv *s;
    opjit_ctx *ctx;
    const uint16_t *x;
    const float *bias;
    uint16_t *out, *xs, *wt; /* xs: per kx, ns streams (image img); wt: [tap][rows_p][lw] */
    int64_t img, C, Cp, ho, Wp, q, ns, lw, rows_p, cb; /* q: columns computed; cb: a unit's */
    char *ws;
} hg_taps;

/* Units [lo, hi) of (kx, 32 channels): image img's padded input shifted
 * by kx dw, on tiles (stream t: columns 16 t .. 16 t + 15, Cp / 2 rows of
 * 16 pairs of channels), read along the input's rows. */
HG_AMX_TARGET static int hg_taps_pack(void *user, int64_t lo, int64_t hi)
{
    const hg_taps *q = (const hg_taps *)user;
    const hg_conv *s = q->s;
    const __m512i il = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                        24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                        16, 0);
    int64_t u, kp, t, ls = q->Cp * 16;
    for (u = lo; u < hi; u++) {
        int64_t kx = u / (q->Cp / 32), k0 = u % (q->Cp / 32) * 16, shift = kx * s->dw;
        const uint16_t *im = q->x + q->img * s->in_image;
        uint16_t *d = q->xs + kx * q->ns * ls;
        for (kp = k0; kp < k0 + 16; kp++) {
            const uint16_t *p0 = im + 2 * kp * s->h * s->w, *p1 = p0 + s->h * s->w;
            int have0 = 2 * kp < q->C, have1 = 2 * kp + 1 < q->C;
            int64_t row = 0, col = shift; /* of the padded input, at stream t */
            for (t = 0; t < q->ns; t++, col += 16) {
                int64_t r, c0, cnt, a, b;
                if (col >= q->Wp) {
                    col -= q->Wp;
                    row++;
                }
                r = row - s->ph;
                c0 = col - s->pw;
                cnt = q->Wp - col < 16 ? q->Wp - col : 16;
                a = c0 < 0 ? -c0 : 0;
                b = s->w - c0 < cnt ? s->w - c0 : cnt;
                __m256i x0 = _mm256_setzero_si256(), x1 = _mm256_setzero_si256();
                if (r >= 0 && r < s->h && a < b) {
                    __mmask16 m = (__mmask16)((((uint32_t)1 << b) - 1) & ~(((uint32_t)1 << a) - 1));
                    if (have0)
                        x0 = _mm256_maskz_loadu_epi16(m, p0 + r * s->w + c0);
                    if (have1)
                        x1 = _mm256_maskz_loadu_epi16(m, p1 + r * s->w + c0);
                }
                _mm512_storeu_si512((void *)(d + t * ls + kp * 32),
                                    _mm512_permutexvar_epi16(
                                        il, _mm512_inserti64x4(_mm512_castsi256_si512(x0), x1, 1)));
            }
        }
    }
    return 0;
}

/* ct [32][32] = sum over taps of W_tap rows [32 (16 where !two_rows)] .
 * the tap's shifted columns [c0, c0 + 32) of the packed image. */
HG_AMX_TARGET static void hg_taps_block(const hg_taps *q, const uint16_t *wt, int64_t c0,
                                        int two_rows, float *ct)
{
    const hg_conv *s = q->s;
    const size_t sa = (size_t)q->lw * 2;
    int64_t ls = q->Cp * 16, ky, kx, k;
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    for (ky = 0; ky < s->kh; ky++)
        for (kx = 0; kx < s->kw; kx++) {
            const uint16_t *a = wt + (ky * s->kw + kx) * q->rows_p * q->lw, *a1 = a + 16 * q->lw;
            const uint16_t *b = q->xs + (kx * q->ns + (c0 + ky * s->dh * q->Wp) / 16) * ls;
            const uint16_t *b1 = b + ls;
            if (two_rows) {
                for (k = 0; k < q->Cp; k += 32, b += 512, b1 += 512) {
                    _tile_loadd(4, a + k, sa);
                    _tile_loadd(6, b, 64);
                    _tile_loadd(7, b1, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                    _tile_loadd(5, a1 + k, sa);
                    _tile_dpbf16ps(2, 5, 6);
                    _tile_dpbf16ps(3, 5, 7);
                }
            } else {
                for (k = 0; k < q->Cp; k += 32, b += 512, b1 += 512) {
                    _tile_loadd(4, a + k, sa);
                    _tile_loadd(6, b, 64);
                    _tile_loadd(7, b1, 64);
                    _tile_dpbf16ps(0, 4, 6);
                    _tile_dpbf16ps(1, 4, 7);
                }
            }
        }
    _tile_stored(0, ct, 128);
    _tile_stored(1, ct + 16, 128);
    _tile_stored(2, ct + 16 * 32, 128);
    _tile_stored(3, ct + 16 * 32 + 16, 128);
}

/* Units [lo, hi) of blocks of cb columns of image img: every 32 output
 * channels over its columns, each block's real positions (ow < Wo)
 * stored. */
static int hg_taps_run(void *user, int64_t lo, int64_t hi)
{
    const hg_taps *q = (const hg_taps *)user;
    const hg_conv *s = q->s;
    float *ct = (float *)(void *)(q->ws + (size_t)opjit_thread_num(q->ctx) * 4096);
    int64_t u, i, c0, c;
    hg_amx_begin();
    for (u = lo; u < hi; u++) {
        int64_t cs = u * q->cb, ce = cs + q->cb < q->q ? cs + q->cb : q->q;
        for (i = 0; i < s->og; i += 32) {
            int64_t rows = s->og - i < 32 ? s->og - i : 32;
            uint16_t *o = q->out + (q->img * s->og + i) * s->plane;
            for (c0 = cs; c0 < ce; c0 += 32) {
                hg_taps_block(q, q->wt + i * q->lw, c0, s->og - i > 16, ct);
                for (c = c0; c < c0 + 32; c += 16) { /* 16 columns: one padded row */
                    int64_t oh = c / q->Wp, ow = c % q->Wp;
                    int64_t n = s->wo - ow < 16 ? s->wo - ow : 16;
                    if (oh < q->ho && n > 0)
                        hg_store(ct + (c - c0), 32, rows, n, q->bias ? q->bias + i : NULL,
                                 o + oh * s->wo + ow, s->plane);
                }
            }
        }
    }
    hg_amx_end();
    return 0;
}

/* The stride-1 convolution on tiles where it fits (one group, a tap
 * spanning more than one position, the padded rows no more than 1.5 times
 * the output's): 1 (*rc its status), else 0. */
static int hg_conv_taps(opjit_ctx *ctx, const hg_conv *s, const void *x, const void *w,
                        const float *bias, void *out, int *rc)
{
    hg_taps q;
    int64_t T = opjit_num_threads(ctx), o, c, t, taps = s->kh * s->kw, units;
    const uint16_t *w16 = (const uint16_t *)w;
    if (s->groups != 1 || s->sh != 1 || s->sw != 1 || taps < 2)
        return 0;
    memset(&q, 0, sizeof q);
    q.s = s;
    q.ctx = ctx;
    q.x = (const uint16_t *)x;
    q.bias = bias;
    q.out = (uint16_t *)out;
    q.C = s->kdim / taps;
    q.Cp = hg_kp(q.C);
    q.ho = s->plane / s->wo;
    q.Wp = (s->wo + s->dw * (s->kw - 1) + 15) / 16 * 16;
    if (2 * q.Wp > 3 * s->wo)
        return 0;
    q.q = (q.ho * q.Wp + 31) / 32 * 32;
    q.ns = (q.q + s->dh * (s->kh - 1) * q.Wp) / 16;
    q.lw = hg_amx_ld(q.C);
    q.rows_p = hg_amx_rows(s->og);
    /* a unit: about 256 columns, fewer until each thread has about three
     * an image (an image at a time: its packed input stays in L2) */
    q.cb = 256;
    while (q.cb > 32 && (q.q + q.cb - 1) / q.cb < 3 * T)
        q.cb -= 32;
    units = (q.q + q.cb - 1) / q.cb;
    *rc = -1;
    if (!(q.xs = (uint16_t *)hg_ws(ctx, (size_t)(s->kw * q.ns * q.Cp * 16) * 2)) ||
        !(q.wt = (uint16_t *)hg_ws(ctx, (size_t)(taps * q.rows_p * q.lw) * 2)) ||
        !(q.ws = (char *)hg_ws(ctx, (size_t)T * 4096)))
        return 1;
    /* the weights per tap: wt[tap][o][c] = w[o][c][tap], zero past O and C */
    memset(q.wt, 0, (size_t)(taps * q.rows_p * q.lw) * 2);
    for (o = 0; o < s->og; o++)
        for (c = 0; c < q.C; c++)
            for (t = 0; t < taps; t++)
                q.wt[(t * q.rows_p + o) * q.lw + c] = w16[(o * q.C + c) * taps + t];
    for (q.img = 0, *rc = 0; q.img < s->n && *rc == 0; q.img++)
        if ((*rc = opjit_parallel_for(ctx, 0, s->kw * (q.Cp / 32), 1, hg_taps_pack, &q)) == 0)
            *rc = opjit_parallel_for(ctx, 0, units, 1, hg_taps_run, &q);
    return 1;
}
#endif

/* ---- stride 1 on vdpbf16ps: a GEMM per tap over a shifted input --------------
 * As on tiles (above), for the vector kernels. A unit (image, block of
 * output positions p = oh Wo + ow, rows oh0 .. oh1) packs the input rows
 * it reads into pairs of channels, once per column shift kx dw (xl[kx]:
 * [C/2][Q][2], rows of Wo columns: column (r - oh0) Wo + ow holds the
 * input at (r - ph, ow + kx dw - pw), zero outside), so that tap (ky, kx)
 * of position p reads column p - oh0 Wo + ky dh Wo of xl[kx]: out = sum
 * over taps of W_tap [O, C] . X shifted, with no im2col (which reads the
 * input kh kw times: a quarter of a 3x3 convolution's time), no column
 * computed to be dropped, and no barrier between packing and products
 * (the rows of the kh - 1 below a block are packed twice). Each output
 * element is one chain over (tap, pair of channels) in order, by one
 * thread: the thread count changes no bit. */
typedef struct hg_vtaps {
    const hg_conv *s;
    opjit_ctx *ctx;
    const uint16_t *x, *w;
    const float *bias;
    uint16_t *out, *wt; /* wt: [tap][rows_p][Cp] */
    int64_t C, Cp, rows_p, cb, ncb, Q; /* Q: columns of a unit's xl[kx] row, at most */
    int even; /* units of an image: ncb of about equal widths (else cb each, the last less) */
    char *ws;
    size_t per;
} hg_vtaps;

/* Output channels [lo, hi): their weights into wt (wt[tap][o][c] =
 * w[o][c][tap], zero past O and C). */
static int hg_vtaps_weights(void *user, int64_t lo, int64_t hi)
{
    const hg_vtaps *q = (const hg_vtaps *)user;
    const hg_conv *s = q->s;
    const int64_t taps = s->kh * s->kw;
    int64_t o, c, t, r;
    for (o = lo; o < hi; o++) {
        const uint16_t *w = q->w + o * q->C * taps;
        uint16_t *d = q->wt + o * q->Cp;
        for (c = 0; c < q->C; c++, w += taps)
            for (t = 0; t < taps; t++)
                d[t * q->rows_p * q->Cp + c] = w[t];
        for (t = 0; t < taps; t++) {
            if (q->Cp > q->C)
                d[t * q->rows_p * q->Cp + q->C] = 0;
            for (r = s->og; o == s->og - 1 && r < q->rows_p; r++) /* rows past O */
                memset(q->wt + (t * q->rows_p + r) * q->Cp, 0, (size_t)q->Cp * 2);
        }
    }
    return 0;
}

/* Padded rows [r0, r0 + nr) of image im (bfloat16, its first channel)
 * into xl (see above; Q columns a row of pairs). */
HG_TARGET static void hg_vtaps_pack(const hg_vtaps *q, const uint16_t *im, int64_t r0,
                                    int64_t nr, uint16_t *xl)
{
    const hg_conv *s = q->s;
    const __m512i il = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9,
                                        24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1,
                                        16, 0);
    const int64_t np = q->Cp / 2, hw = s->h * s->w;
    int64_t kx, kp, r, c0;
    /* the mask and source of each whole vector once, then every pair of
     * channels; what lands past a row is overwritten by the next vector
     * (left to right, rows in order), past the last by zeros (below) */
    for (kx = 0; kx < s->kw; kx++)
        for (r = 0; r < nr; r++)
            for (c0 = 0; c0 < s->wo; c0 += 16) {
                int64_t ir = r0 + r - s->ph, ic = c0 + kx * s->dw - s->pw;
                int64_t a = ic < 0 ? -ic : 0, b = s->w - ic < 16 ? s->w - ic : 16;
                uint16_t *d = xl + kx * np * q->Q * 2 + 2 * (r * s->wo + c0);
                if (ir < 0 || ir >= s->h || a >= b) {
                    for (kp = 0; kp < np; kp++)
                        _mm512_storeu_si512((void *)(d + kp * q->Q * 2), _mm512_setzero_si512());
                    continue;
                }
                __mmask16 m = (__mmask16)((((uint32_t)1 << b) - 1) & ~(((uint32_t)1 << a) - 1));
                const uint16_t *p0 = im + ir * s->w + ic;
                for (kp = 0; kp < np; kp++, p0 += 2 * hw) {
                    __m256i x0 = _mm256_maskz_loadu_epi16(m, p0);
                    __m256i x1 = 2 * kp + 1 < q->C
                                     ? _mm256_maskz_loadu_epi16(m, p0 + hw)
                                     : _mm256_setzero_si256();
                    _mm512_storeu_si512((void *)(d + kp * q->Q * 2),
                                        _mm512_permutexvar_epi16(
                                            il, _mm512_inserti64x4(_mm512_castsi256_si512(x0), x1,
                                                                   1)));
                }
            }
    for (kx = 0; kx < s->kw; kx++)
        for (kp = 0; kp < np; kp++)
            memset(xl + (kx * np + kp) * q->Q * 2 + 2 * nr * s->wo, 0,
                   (size_t)(q->Q - nr * s->wo) * 4);
}

/* The first position of block b of an image (b = ncb: the plane). */
static int64_t hg_vtaps_col(const hg_vtaps *q, int64_t b)
{
    int64_t c = q->even ? b * ((q->s->plane + 15) / 16) / q->ncb * 16 : b * q->cb;
    return c < q->s->plane ? c : q->s->plane;
}

/* Units [lo, hi) of (image, block of positions): its rows packed, then
 * every 8 output channels over the block (48 positions a kernel), rounded
 * into the output. */
static int hg_vtaps_run(void *user, int64_t lo, int64_t hi)
{
    const hg_vtaps *q = (const hg_vtaps *)user;
    const hg_conv *s = q->s;
    char *area = q->ws + (size_t)opjit_thread_num(q->ctx) * q->per;
    float *ct = (float *)(void *)area;
    uint16_t *xl = (uint16_t *)(void *)(area + (size_t)32 * q->cb);
    int64_t u, i, c, w, t;
    hg_tapk tk;
    tk.ntap = s->kh * s->kw;
    tk.sa = q->rows_p * q->Cp;
    tk.lda = q->Cp;
    tk.Kp = q->Cp;
    tk.ldp = 2 * q->Q;
    for (t = 0; t < tk.ntap; t++) /* xl[kx], ky dh rows down */
        tk.off[t] = 2 * (t % s->kw * (q->Cp / 2) * q->Q + t / s->kw * s->dh * s->wo);
    for (u = lo; u < hi; u++) {
        int64_t img = u / q->ncb, cs = hg_vtaps_col(q, u % q->ncb);
        int64_t ce = hg_vtaps_col(q, u % q->ncb + 1), nc = (ce - cs + 15) / 16 * 16;
        int64_t oh0 = cs / s->wo, oh1 = (ce - 1) / s->wo;
        const uint16_t *b0 = xl + 2 * (cs - oh0 * s->wo);
        hg_vtaps_pack(q, q->x + img * s->in_image, oh0, oh1 - oh0 + 1 + s->dh * (s->kh - 1),
                      xl);
        for (i = 0; i < s->og; i += 8) {
            for (c = 0; c < nc; c += w) {
                const uint16_t *a = q->wt + i * q->Cp;
                w = nc - c;
                w = w == 64 ? 32 : w >= 48 ? 48 : w >= 32 ? 32 : 16;
                if (w == 48)
                    hg_t8x48(&tk, a, b0 + 2 * c, ct + c, q->cb);
                else if (w == 32)
                    hg_t8x32(&tk, a, b0 + 2 * c, ct + c, q->cb);
                else
                    hg_t8x16(&tk, a, b0 + 2 * c, ct + c, q->cb);
            }
            hg_store(ct, q->cb, s->og - i < 8 ? s->og - i : 8, ce - cs,
                     q->bias ? q->bias + i : NULL, q->out + (img * s->og + i) * s->plane + cs,
                     s->plane);
        }
    }
    return 0;
}

/* The stride-1 convolution per tap where it fits (one group, a tap
 * spanning more than one position, at most 64 taps): 1 (*rc its status),
 * else 0. */
static int hg_conv_vtaps(opjit_ctx *ctx, const hg_conv *s, const void *x, const void *w,
                         const float *bias, void *out, int *rc)
{
    hg_vtaps q;
    int64_t T = opjit_num_threads(ctx), taps = s->kh * s->kw;
    if (s->groups != 1 || s->sh != 1 || s->sw != 1 || taps < 2 || taps > 64)
        return 0;
    memset(&q, 0, sizeof q);
    q.s = s;
    q.ctx = ctx;
    q.x = (const uint16_t *)x;
    q.w = (const uint16_t *)w;
    q.bias = bias;
    q.out = (uint16_t *)out;
    q.C = s->kdim / taps;
    q.Cp = (q.C + 1) / 2 * 2;
    q.rows_p = (s->og + 7) / 8 * 8;
    /* a unit: 192 positions (4 kernels of 48), 384 over rows wider than 32
     * (the rows below it, packed again by the next unit, cost less); with
     * threads and fewer than eight such units a thread, units of about
     * equal widths (about 96 over narrow rows: more of them balance the
     * threads better), at least three a thread, a multiple of the threads
     * (with eight or more, the narrower units' 32-column kernels and
     * packing cost more than the imbalance: 3x3 128@28 batch 8, 2 threads) */
    q.cb = s->wo > 32 ? 384 : 192;
    q.ncb = (s->plane + q.cb - 1) / q.cb;
    if (T > 1 && s->n * q.ncb < 8 * T) {
        int64_t g = (s->plane + 15) / 16;
        q.ncb = s->wo > 32 ? q.ncb : (s->plane + 95) / 96; /* 96: threads balance better */
        q.ncb = q.ncb * s->n < 3 * T ? (3 * T + s->n - 1) / s->n : q.ncb;
        q.ncb = (q.ncb + T - 1) / T * T;
        q.ncb = q.ncb < g ? q.ncb : g;
        q.cb = (g + q.ncb - 1) / q.ncb * 16;
        q.even = 1;
    }
    /* a unit's rows: those its positions span (a partial row at each end)
     * and kh - 1 dilated ones below; the columns its last kernel's whole
     * vectors read past them (15) and the packing's stores' slack */
    q.Q = ((q.cb + s->wo - 1) / s->wo + 1 + s->dh * (s->kh - 1)) * s->wo + 16 + 16;
    q.per = (size_t)32 * q.cb + (size_t)(s->kw * (q.Cp / 2) * q.Q) * 4;
    q.per = (q.per + 63) / 64 * 64;
    *rc = -1;
    if (!(q.wt = (uint16_t *)hg_ws(ctx, (size_t)(taps * q.rows_p * q.Cp) * 2)) ||
        !(q.ws = (char *)hg_ws(ctx, (size_t)T * q.per)))
        return 1;
    if ((*rc = opjit_parallel_for(ctx, 0, s->og, 16, hg_vtaps_weights, &q)) == 0)
        *rc = opjit_parallel_for(ctx, 0, s->n * q.ncb, 1, hg_vtaps_run, &q);
    return 1;
}

/* out [n, groups og, plane] = conv, bfloat16 in and out, float32 sums. x
 * the input (bfloat16, dense), xw the same widened to float32 (needed
 * when s->sw > 1), w [groups og, kdim], bias widened or NULL; on tiles
 * (amx, where hg_amx_cpu) or vdpbf16ps. 0, or the status of the failure
 * recorded. */
static int hg_conv_bf16(opjit_ctx *ctx, const hg_conv *s, const void *x, const float *xw,
                        const void *w, const float *bias, void *out, int amx)
{
    hg_conv_job j;
    int64_t T = opjit_num_threads(ctx), units, lwa = 0;
    const uint16_t *wa = NULL;
    int rc;
#ifdef HG_AMX
    if (amx && hg_conv_taps(ctx, s, x, w, bias, out, &rc))
        return rc;
    if (amx && !(wa = hg_amx_pack_a(ctx, w, s->kdim, 0, s->groups, s->og, s->kdim, &lwa)))
        return -1;
#else
    (void)amx;
#endif
    if (!amx && hg_conv_vtaps(ctx, s, x, w, bias, out, &rc))
        return rc;
    if (hg_conv_small(ctx, s, x, w, bias, out, wa, lwa, &rc))
        return rc;
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.s = s;
    j.x = (const uint16_t *)x;
    j.xw = xw;
    j.xend = xw ? xw + s->n * s->in_image : NULL;
    j.w = (const uint16_t *)w;
    j.bias = bias;
    j.out = (uint16_t *)out;
    j.wa = wa;
    j.lwa = lwa;
#ifdef HG_AMX
    j.rows_p = hg_amx_rows(s->og);
#endif
    /* blocks of positions: the packed block about 256 KB (in L2), whole
     * 48-column panels, at least three units a thread where it can */
    j.pb = ((int64_t)256 << 10) / 2 / s->kdim / 48 * 48;
    if (j.pb < 48)
        j.pb = 48;
    units = s->n * s->groups;
    if (units * ((s->plane + j.pb - 1) / j.pb) < 3 * T) {
        int64_t nblk = (3 * T + units - 1) / units;
        int64_t want = ((s->plane + nblk - 1) / nblk + 47) / 48 * 48;
        j.pb = want < j.pb ? want : j.pb;
    }
    if (j.pb > s->plane)
        j.pb = s->plane;
    j.nblk = (s->plane + j.pb - 1) / j.pb;
    /* the unfolded block's rows: 16 columns of slack (the unfold writes
     * whole vectors), not a multiple of 1 KiB apart (those alias in caches) */
    j.ldcol = (j.pb + 15) / 16 * 16 + 16;
    j.ldcol += j.ldcol % 256 == 0 ? 16 : 0;
    j.colb = s->direct || s->sw == 1
                 ? 0
                 : ((size_t)(s->kdim * j.ldcol + 16) * sizeof(float) + 63) / 64 * 64;
    j.per = j.colb + hg_area(s->kdim, (j.pb + 15) / 16 * 16);
    if (!(j.ws = (char *)hg_ws(ctx, (size_t)T * j.per)))
        return -1;
    return opjit_parallel_for(ctx, 0, units * j.nblk, 1, hg_conv_run, &j);
}

/* ---- conv2d backward: grad_weight on vdpbf16ps ----------------------------------
 * grad_weight [O, C kh kw] = sum over images and output positions of
 * dy [O, p] times the input each tap reads at p. Made as its transpose,
 * dW^T [J = C kh kw, O] = X [J, positions] . dy^T [positions, O]: the
 * reduction runs over positions, and with a padded row length Wq every
 * row of X is a shifted run of one input plane, read in place by the
 * kernels. The input is laid out once an image in phase planes: for
 * strides (sh, sw), phase (a, b) holds the zero-padded input's rows a, a
 * + sh, ... and columns b, b + sw, ..., Hq rows of Wq columns; tap (ky,
 * kx) reads phase (ky dh % sh, kx dw % sw) shifted by (ky dh / sh, kx dw
 * / sw), so output position (oh, ow), column q = oh Wq + ow, reads the
 * plane at q + shift. dy^T is packed in pairs of positions
 * (hg_pack_rows' layout), a row of Wo at a time, and the kernels read A
 * a row at a time (Wq apart). An odd Wo's rows are padded to even by a
 * position ow = Wo that does not exist (a pair never spans two rows):
 * dy is zero there, so it adds 0 x (an input value), a zero while the
 * input is finite (an input holding an Inf or NaN is given up, to the
 * widening path). A 1x1 with stride 1 and no padding reads the input
 * itself.
 * Each element of grad_weight is one chain of float32 sums over (image,
 * pair of positions) in order, by one thread, rounded once at the end:
 * the blocking and the thread count change no bit. */

/* C[R][16 NV] += sum over nrow rows of K positions of A[r][k] B[k][.]:
 * row i of the A's at A[r] + k0 + i astep (bfloat16, K consecutive), B
 * packed in pairs of positions (rows ldp apart, K / 2 rounded up a row),
 * C float32 rows ldc apart. An odd K's last pair is (A[K-1], 0). */
#define HG_GSTEP(R, NV, PAIR)                                                         \
    _Pragma("GCC unroll 4") for (v = 0; v < NV; v++)                                  \
        b[v] = _mm512_loadu_si512((const void *)(P + 32 * v));                        \
    _Pragma("GCC unroll 8") for (r = 0; r < R; r++) {                                 \
        a = _mm512_set1_epi32((int)(PAIR));                                           \
        _Pragma("GCC unroll 4") for (v = 0; v < NV; v++)                              \
            c[r][v] = _mm512_dpbf16_ps(c[r][v], (__m512bh)a, (__m512bh)b[v]);         \
    }
#define HG_GKERNEL(NAME, R, NV)                                                       \
    HG_TARGET static void NAME(int64_t nrow, int64_t K, int64_t astep,                \
                               const uint16_t *const *A0, int64_t k0, const uint16_t *P, \
                               int64_t ldp, float *C, int64_t ldc)                    \
    {                                                                                 \
        __m512 c[R][NV];                                                              \
        __m512i b[NV], a;                                                             \
        const uint16_t *A[R];                                                         \
        int64_t kp, r, v, i;                                                          \
        _Pragma("GCC unroll 8") for (r = 0; r < R; r++)                               \
            _Pragma("GCC unroll 4") for (v = 0; v < NV; v++)                          \
                c[r][v] = _mm512_loadu_ps(C + r * ldc + 16 * v);                      \
        for (i = 0; i < nrow; i++) {                                                  \
            _Pragma("GCC unroll 8") for (r = 0; r < R; r++) A[r] = A0[r] + k0 + i * astep; \
            for (kp = 0; kp + 1 < K; kp += 2, P += ldp) {                             \
                HG_GSTEP(R, NV, hg_pair(A[r] + kp))                                   \
            }                                                                         \
            if (K & 1) {                                                              \
                HG_GSTEP(R, NV, A[r][kp])                                             \
                P += ldp;                                                             \
            }                                                                         \
        }                                                                             \
        _Pragma("GCC unroll 8") for (r = 0; r < R; r++)                               \
            _Pragma("GCC unroll 4") for (v = 0; v < NV; v++)                          \
                _mm512_storeu_ps(C + r * ldc + 16 * v, c[r][v]);                      \
    }
HG_GKERNEL(hg_g6x64, 6, 4)
HG_GKERNEL(hg_g8x48, 8, 3)
HG_GKERNEL(hg_g8x32, 8, 2)
HG_GKERNEL(hg_g8x16, 8, 1)
#undef HG_GKERNEL
#undef HG_GSTEP

/* What n dense bfloat16 values hold: HG_SUB (a subnormal), HG_NONFINITE
 * (an Inf or NaN), or -1 with the error recorded. */
enum { HG_SUB = 1, HG_NONFINITE = 2 };
typedef struct hg_bits_job {
    const uint16_t *p;
    int64_t n;
    int *found; /* one slot a thread */
    opjit_ctx *ctx;
} hg_bits_job;

HG_TARGET static int hg_bits_run(void *user, int64_t lo, int64_t hi)
{
    const hg_bits_job *s = (const hg_bits_job *)user;
    const __m512i ex = _mm512_set1_epi16(0x7f80), ma = _mm512_set1_epi16(0x007f);
    int64_t i, end = hi << 16 < s->n ? hi << 16 : s->n;
    __mmask32 sub = 0, inf = 0;
    for (i = lo << 16; i < end; i += 32) {
        __mmask32 m = end - i >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << (end - i)) - 1);
        __m512i v = _mm512_maskz_loadu_epi16(m, s->p + i), e = _mm512_and_si512(v, ex);
        sub |= _mm512_testn_epi16_mask(v, ex) & _mm512_test_epi16_mask(v, ma);
        inf |= _mm512_mask_cmpeq_epi16_mask(m, e, ex);
    }
    s->found[opjit_thread_num(s->ctx)] |= (sub ? HG_SUB : 0) | (inf ? HG_NONFINITE : 0);
    return 0;
}

static int hg_bits(opjit_ctx *ctx, const void *p, int64_t n)
{
    hg_bits_job s;
    int64_t T = opjit_num_threads(ctx), t;
    int bits = 0;
    if (n <= 0)
        return 0;
    s.p = (const uint16_t *)p;
    s.n = n;
    s.ctx = ctx;
    if (!(s.found = (int *)hg_ws(ctx, (size_t)T * sizeof(int))))
        return -1;
    memset(s.found, 0, (size_t)T * sizeof(int));
    if (opjit_parallel_for(ctx, 0, (n + 65535) >> 16, 1, hg_bits_run, &s))
        return -1;
    for (t = 0; t < T; t++)
        bits |= s.found[t];
    return bits;
}

/* dst[c][r] = src[r][c] for rows r in [r0, r1) and c < cols (16-bit
 * elements; lds < 2^25): 32 rows at a time, two gathers of a word (two
 * neighbours of a row) a row pair giving two rows of dst. */
HG_TARGET static void hg_t16(const uint16_t *src, int64_t lds, int64_t r0, int64_t r1,
                             int64_t cols, uint16_t *dst, int64_t ldd)
{
    const __m512i idx = _mm512_mullo_epi32(_mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14,
                                                            12, 10, 8, 6, 4, 2, 0),
                                           _mm512_set1_epi32((int)lds));
    const __m512i lo = _mm512_set1_epi32(0xffff);
    int64_t r, c, i;
    for (r = r0; r + 32 <= r1; r += 32) {
        const uint16_t *s = src + r * lds;
        for (c = 0; c + 2 <= cols; c += 2) {
            __m512i ge = _mm512_i32gather_epi32(idx, (const void *)(s + c), 2);
            __m512i go = _mm512_i32gather_epi32(idx, (const void *)(s + lds + c), 2);
            _mm512_storeu_si512((void *)(dst + c * ldd + r),
                                _mm512_or_si512(_mm512_and_si512(ge, lo), _mm512_slli_epi32(go, 16)));
            _mm512_storeu_si512((void *)(dst + (c + 1) * ldd + r),
                                _mm512_or_si512(_mm512_srli_epi32(ge, 16),
                                                _mm512_andnot_si512(lo, go)));
        }
        for (; c < cols; c++)
            for (i = 0; i < 32; i++)
                dst[c * ldd + r + i] = s[i * lds + c];
    }
    for (; r < r1; r++)
        for (c = 0; c < cols; c++)
            dst[c * ldd + r] = src[r * lds + c];
}

typedef struct hg_t16_job {
    const uint16_t *src;
    uint16_t *dst;
    int64_t rows, cols, groups; /* groups matrices, each rows x cols, one after another */
} hg_t16_job;

/* Units [lo, hi) of (matrix, 32 rows). */
static int hg_t16_run(void *user, int64_t lo, int64_t hi)
{
    const hg_t16_job *j = (const hg_t16_job *)user;
    int64_t nblk = (j->rows + 31) / 32, u;
    for (u = lo; u < hi; u++) {
        int64_t g = u / nblk, r0 = u % nblk * 32, r1 = r0 + 32 < j->rows ? r0 + 32 : j->rows;
        hg_t16(j->src + g * j->rows * j->cols, j->cols, r0, r1, j->cols,
               j->dst + g * j->rows * j->cols, j->rows);
    }
    return 0;
}

/* groups matrices [rows][cols] of 16-bit values at src, each transposed
 * into [cols][rows] at dst. 0, or the status of the failure recorded. */
static int hg_transpose16(opjit_ctx *ctx, const void *src, int64_t groups, int64_t rows,
                          int64_t cols, void *dst)
{
    hg_t16_job j;
    int64_t r, c, g;
    if (cols >= ((int64_t)1 << 25)) { /* the gathers' offsets: element by element */
        for (g = 0; g < groups; g++)
            for (r = 0; r < rows; r++)
                for (c = 0; c < cols; c++)
                    ((uint16_t *)dst)[(g * cols + c) * rows + r] =
                        ((const uint16_t *)src)[(g * rows + r) * cols + c];
        return 0;
    }
    j.src = (const uint16_t *)src;
    j.dst = (uint16_t *)dst;
    j.rows = rows;
    j.cols = cols;
    j.groups = groups;
    return opjit_parallel_for(ctx, 0, groups * ((rows + 31) / 32), 1, hg_t16_run, &j);
}

/* The shape grad_weight needs (one group). */
typedef struct hg_gw {
    int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, ho, wo;
} hg_gw;

#define HG_GW_ROWS 48 /* rows of A a unit (24 where that leaves a thread fewer than
                       * three): whole strips of 6 and of 8 */
#define HG_GW_KB 256  /* positions a block: its B (64 columns: 32 KB) stays in L1 */

/* Three layouts: padded (above: A the input's taps over phase planes, B
 * dy^T); in place (a 1x1 with stride 1 and no padding: A and B the
 * planes of x and dy as they are, A the one with more channels, swap
 * when that is dy: the result is then grad_weight itself); folded (the
 * same over a batch of small planes: A copied with the images' positions
 * side by side, one long reduction instead of an image's few). */
typedef struct hg_gw_job {
    opjit_ctx *ctx;
    const hg_gw *s;
    const uint16_t *a, *b; /* A's source (x; dy when swapped), B's (dy; x) */
    uint16_t *dw, *xq, *bp; /* xq: A laid out (NULL: a in place); bp: B packed */
    uint16_t *t16;          /* not swapped: dW^T rounded, [J][nb] */
    float *acc;             /* [J rounded up to ru][np] */
    int64_t ru;             /* rows of A a unit */
    int64_t J, nb, np;      /* rows of A; columns of B (its channels), rounded up to 16 */
    int64_t P, Hq, Wq, Q, nph, i0, ni, ximg, bimg; /* P: positions of an image of dy */
    int64_t toff[64];       /* tap t's offset in an image's planes (channel 0) */
    int pid[16];            /* phase (a, b) at a sw + b: its index, or -1 */
    int swap, fold, last;
    int rows;   /* padded: B and the kernels a row of kr positions at a time (A's Wq apart) */
    int64_t kr; /* Wo rounded up to even: an odd Wo's last pair is (ow = Wo - 1, a
                 * position that does not exist) */
    int *found; /* a slot a thread: HG_SUB, HG_NONFINITE seen while packing */
} hg_gw_job;

/* B's source offset of position q of the chunk's image img (channel 0),
 * or -1 for a position that does not exist (zero in B). */
static int64_t hg_gw_src(const hg_gw_job *j, int64_t img, int64_t q)
{
    int64_t ow;
    if (q >= j->Q)
        return -1;
    if (j->fold)
        return q / j->P * j->nb * j->P + q % j->P;
    if (!j->rows)
        return (j->i0 + img) * j->nb * j->P + q;
    ow = q % j->kr;
    return ow < j->s->wo ? (j->i0 + img) * j->nb * j->P + q / j->kr * j->s->wo + ow : -1;
}

/* n values from s to d (whole vectors but the last), what they hold
 * OR-ed into *bits. */
HG_TARGET static void hg_gw_copy(uint16_t *d, const uint16_t *s, int64_t n, int *bits)
{
    const __m512i ex = _mm512_set1_epi16(0x7f80), ma = _mm512_set1_epi16(0x007f);
    __mmask32 sub = 0, inf = 0;
    int64_t i;
    for (i = 0; i < n; i += 32) {
        __mmask32 m = n - i >= 32 ? ~(__mmask32)0 : (((__mmask32)1 << (n - i)) - 1);
        __m512i v = _mm512_maskz_loadu_epi16(m, s + i);
        if (n - i >= 32)
            _mm512_storeu_si512((void *)(d + i), v);
        else
            _mm512_mask_storeu_epi16(d + i, m, v);
        sub |= _mm512_testn_epi16_mask(v, ex) & _mm512_test_epi16_mask(v, ma);
        inf |= _mm512_mask_cmpeq_epi16_mask(m, _mm512_and_si512(v, ex), ex);
    }
    *bits |= (sub ? HG_SUB : 0) | (inf ? HG_NONFINITE : 0);
}

static int hg_bits_of(uint16_t v)
{
    return (v & 0x7f80) == 0x7f80 ? HG_NONFINITE : !(v & 0x7f80) && (v & 0x7f) ? HG_SUB : 0;
}

/* Channel c of the chunk's image img into its phase planes. */
static void hg_gw_phases(const hg_gw_job *j, int64_t img, int64_t c, int *bits)
{
    const hg_gw *s = j->s;
    const uint16_t *xc = j->a + ((j->i0 + img) * s->c + c) * s->h * s->w;
    int64_t a, b, r, q;
    for (a = 0; a < s->sh; a++)
        for (b = 0; b < s->sw; b++) {
            int p = j->pid[a * s->sw + b];
            uint16_t *d;
            if (p < 0)
                continue;
            d = j->xq + img * j->ximg + (p * s->c + c) * j->Hq * j->Wq;
            for (r = 0; r < j->Hq; r++, d += j->Wq) {
                int64_t ir = r * s->sh + a - s->ph, c0, c1;
                if (ir < 0 || ir >= s->h) {
                    memset(d, 0, (size_t)j->Wq * 2);
                    continue;
                }
                if (s->sw > 1) {
                    for (q = 0; q < j->Wq; q++) {
                        int64_t ic = q * s->sw + b - s->pw;
                        d[q] = ic >= 0 && ic < s->w ? xc[ir * s->w + ic] : 0;
                        *bits |= hg_bits_of(d[q]);
                    }
                    continue;
                }
                /* columns [c0, c1) hold input columns c0 + b - pw .. */
                c0 = s->pw - b > 0 ? s->pw - b : 0;
                c1 = s->w + s->pw - b < j->Wq ? s->w + s->pw - b : j->Wq;
                c1 = c1 > c0 ? c1 : c0;
                memset(d, 0, (size_t)c0 * 2);
                hg_gw_copy(d + c0, xc + ir * s->w + c0 + b - s->pw, c1 - c0, bits);
                memset(d + c1, 0, (size_t)(j->Wq - c1) * 2);
            }
        }
}

/* d[j * ld] (j < 16) = column j of the 16 x 16 words r[0..15] (row i
 * in r[i]): unpacks of words and of pairs of words, then of 128-bit
 * lanes. */
HG_TARGET static void hg_t32x16(__m512i *r, uint32_t *d, int64_t ld)
{
    __m512i t[16], u[16];
    int i, m;
    for (i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (i = 0; i < 16; i += 4) { /* u[i + m] lane L: column 4 L + m, rows i .. i + 3 */
        u[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        u[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        u[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        u[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (m = 0; m < 4; m++) {
        __m512i x01 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0x44);
        __m512i x23 = _mm512_shuffle_i32x4(u[m], u[4 + m], 0xee);
        __m512i y01 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0x44);
        __m512i y23 = _mm512_shuffle_i32x4(u[8 + m], u[12 + m], 0xee);
        _mm512_storeu_si512((void *)(d + m * ld), _mm512_shuffle_i32x4(x01, y01, 0x88));
        _mm512_storeu_si512((void *)(d + (4 + m) * ld), _mm512_shuffle_i32x4(x01, y01, 0xdd));
        _mm512_storeu_si512((void *)(d + (8 + m) * ld), _mm512_shuffle_i32x4(x23, y23, 0x88));
        _mm512_storeu_si512((void *)(d + (12 + m) * ld), _mm512_shuffle_i32x4(x23, y23, 0xdd));
    }
}

/* Pairs [k0, k1) of the chunk's image img into B (hg_pack_rows' layout),
 * 16 of B's channels at a time: 16 pairs whose 32 positions are one run
 * of the source transposed in registers, else a gather of one word a
 * channel where a pair is two neighbours of a row, else value by value. */
HG_TARGET static void hg_gw_packb(const hg_gw_job *j, int64_t img, int64_t k0, int64_t k1,
                                  int *bits)
{
    const __m512i ex = _mm512_set1_epi16(0x7f80), ma = _mm512_set1_epi16(0x007f);
    const __m512i step = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7,
                                                             6, 5, 4, 3, 2, 1, 0),
                                            _mm512_set1_epi32((int)j->P));
    int64_t src[2 * 64], kp, kq, ob, o, i;
    __mmask32 sub = 0;
    uint32_t *d0 = (uint32_t *)(void *)(j->bp + img * j->bimg) + k0 * j->np;
    for (kp = k0; kp < k1; kp++) {
        src[2 * (kp - k0)] = hg_gw_src(j, img, 2 * kp);
        src[2 * (kp - k0) + 1] = hg_gw_src(j, img, 2 * kp + 1);
    }
    for (ob = 0; ob < j->np; ob += 16)
        for (kq = k0; kq < k1; kq += 16) {
            int64_t s0 = src[2 * (kq - k0)], e = kq + 16 < k1 ? kq + 16 : k1;
            uint32_t *d = d0 + (kq - k0) * j->np + ob;
            if (ob + 16 <= j->nb && e - kq == 16 && s0 >= 0 &&
                src[2 * (e - 1 - k0) + 1] == s0 + 31) { /* one run: transposed */
                __m512i r[16];
                for (i = 0; i < 16; i++) {
                    r[i] = _mm512_loadu_si512((const void *)(j->b + s0 + (ob + i) * j->P));
                    sub |= _mm512_testn_epi16_mask(r[i], ex) & _mm512_test_epi16_mask(r[i], ma);
                }
                hg_t32x16(r, d, j->np);
                continue;
            }
            for (kp = kq; kp < e; kp++, d += j->np) {
                int64_t a0 = src[2 * (kp - k0)], a1 = src[2 * (kp - k0) + 1];
                if (ob + 16 <= j->nb && a0 >= 0 && a1 == a0 + 1) {
                    __m512i v = _mm512_i32gather_epi32(
                        _mm512_add_epi32(step, _mm512_set1_epi32((int)(ob * j->P))),
                        (const void *)(j->b + a0), 2);
                    sub |= _mm512_testn_epi16_mask(v, ex) & _mm512_test_epi16_mask(v, ma);
                    _mm512_storeu_si512((void *)d, v);
                } else if (a0 < 0 && a1 < 0) {
                    _mm512_storeu_si512((void *)d, _mm512_setzero_si512());
                } else {
                    for (o = ob; o < ob + 16; o++) {
                        uint16_t v0 = o < j->nb && a0 >= 0 ? j->b[a0 + o * j->P] : 0;
                        uint16_t v1 = o < j->nb && a1 >= 0 ? j->b[a1 + o * j->P] : 0;
                        *bits |= hg_bits_of(v0) | hg_bits_of(v1);
                        d[o - ob] = v0 | (uint32_t)v1 << 16;
                    }
                }
            }
        }
    *bits |= sub ? HG_SUB : 0;
}

/* Units [lo, hi) of packing: A's (the chunk's images x channels: phase
 * planes; or A's channels: the batch folded), then B's (images x blocks
 * of 64 pairs of positions). */
static int hg_gw_pack(void *user, int64_t lo, int64_t hi)
{
    const hg_gw_job *j = (const hg_gw_job *)user;
    const hg_gw *s = j->s;
    const int64_t na = !j->xq ? 0 : j->fold ? j->J : j->ni * s->c;
    const int64_t npb = ((j->Q + 1) / 2 + 63) / 64;
    int64_t u, i;
    int bits = 0;
    for (u = lo; u < hi; u++) {
        if (u < na && j->fold) {
            for (i = 0; i < s->n; i++)
                hg_gw_copy(j->xq + u * j->Q + i * j->P, j->a + (i * j->J + u) * j->P, j->P,
                           &bits);
        } else if (u < na) {
            hg_gw_phases(j, u / s->c, u % s->c, &bits);
        } else {
            int64_t k0 = (u - na) % npb * 64, k1 = k0 + 64 < (j->Q + 1) / 2 ? k0 + 64
                                                                          : (j->Q + 1) / 2;
            hg_gw_packb(j, (u - na) / npb, k0, k1, &bits);
        }
    }
    j->found[opjit_thread_num(j->ctx)] |= bits;
    return 0;
}

/* Units [lo, hi) of ru rows of A: over the chunk's images, each
 * panel of B's columns, blocks of HG_GW_KB positions, strips of rows (6
 * over 64 columns, else 8); rows past J read row 0 into rows of acc
 * nobody reads. On the last chunk, the unit's rows rounded into dw. */
static int hg_gw_run(void *user, int64_t lo, int64_t hi)
{
    const hg_gw_job *j = (const hg_gw_job *)user;
    const hg_gw *s = j->s;
    const int64_t khw = s->kh * s->kw, plane_q = j->Hq * j->Wq;
    /* positions a block: whole output rows (at least one) in the rows layout */
    const int64_t kb = j->rows ? (HG_GW_KB / j->kr > 0 ? HG_GW_KB / j->kr : 1) * j->kr : HG_GW_KB;
    const uint16_t *rows[HG_GW_ROWS];
    int64_t u, img, c0, w, k0, i, r;
    for (u = lo; u < hi; u++) {
        int64_t j0 = u * j->ru, j1 = j0 + j->ru < j->J ? j0 + j->ru : j->J;
        for (img = 0; img < j->ni; img++) {
            const uint16_t *xi = j->xq ? j->xq + img * j->ximg
                                       : j->a + (j->i0 + img) * j->ximg;
            const uint16_t *bi = j->bp + img * j->bimg;
            for (r = 0; r < j->ru; r++) {
                int64_t jj = j0 + r < j1 ? j0 + r : 0;
                rows[r] = xi + jj / khw * plane_q + j->toff[jj % khw];
            }
            for (c0 = 0; c0 < j->np; c0 += w) {
                w = j->np - c0 >= 64 ? 64 : j->np - c0;
                for (k0 = 0; k0 < j->Q; k0 += kb) {
                    /* rows: nr output rows of kr positions, at k0 Wq / kr in A */
                    int64_t nr = j->rows ? (s->ho - k0 / j->kr < kb / j->kr ? s->ho - k0 / j->kr
                                                                            : kb / j->kr)
                                         : 1;
                    int64_t K = j->rows ? j->kr : j->Q - k0 < kb ? j->Q - k0 : kb;
                    int64_t ka = j->rows ? k0 / j->kr * j->Wq : k0;
                    const uint16_t *P = bi + k0 * j->np + 2 * c0;
                    float *C = j->acc + j0 * j->np + c0;
                    for (i = 0; i < j1 - j0; i += w == 64 ? 6 : 8) {
                        if (w == 64)
                            hg_g6x64(nr, K, j->Wq, rows + i, ka, P, 2 * j->np, C + i * j->np,
                                     j->np);
                        else if (w == 48)
                            hg_g8x48(nr, K, j->Wq, rows + i, ka, P, 2 * j->np, C + i * j->np,
                                     j->np);
                        else if (w == 32)
                            hg_g8x32(nr, K, j->Wq, rows + i, ka, P, 2 * j->np, C + i * j->np,
                                     j->np);
                        else
                            hg_g8x16(nr, K, j->Wq, rows + i, ka, P, 2 * j->np, C + i * j->np,
                                     j->np);
                    }
                }
            }
        }
        if (j->last) /* swapped: grad_weight itself; else its transpose, into t16 */
            hg_store(j->acc + j0 * j->np, j->np, j1 - j0, j->nb, NULL,
                     j->swap ? j->dw + j0 * j->nb : j->t16 + j0 * j->nb, j->nb);
    }
    return 0;
}

/* grad_weight [O, C, kh, kw] (bfloat16) of a one-group convolution of
 * shape s, from x and dy (bfloat16, dense), float32 sums. With scan, an
 * operand holding a subnormal (counted as zero here) gives it up, and so
 * does, in the padded layout, an input holding an Inf or NaN (0 x Inf at
 * a position that does not exist), found while packing. 1 when it ran
 * (*rc its status), 0 to widen instead (a shape not for it: more than 64
 * taps, a stride above 4). */
static int hg_conv_gw_bf16(opjit_ctx *ctx, const hg_gw *s, const void *x, const void *dy,
                           void *dw, int scan, int *rc)
{
    hg_gw_job j;
    int64_t khw = s->kh * s->kw, t, maxy = 0, maxx = 0, per, chunk, i0, nunits, na;
    int64_t T = opjit_num_threads(ctx), P = s->ho * s->wo;
    int inplace = khw == 1 && s->sh == 1 && s->sw == 1 && s->ph == 0 && s->pw == 0 &&
                  s->ho == s->h && s->wo == s->w;
    if (khw > 64 || s->sh > 4 || s->sw > 4 || (s->o > s->c ? s->o : s->c) * P > INT32_MAX - 64)
        return 0; /* (the packing gathers with 32-bit offsets) */
    memset(&j, 0, sizeof j);
    j.ctx = ctx;
    j.s = s;
    j.dw = (uint16_t *)dw;
    j.P = P;
    j.swap = inplace && s->o > s->c;
    j.a = (const uint16_t *)(j.swap ? dy : x);
    j.b = (const uint16_t *)(j.swap ? x : dy);
    j.J = j.swap ? s->o : s->c * khw;
    j.nb = j.swap ? s->c : s->o;
    j.np = (j.nb + 15) / 16 * 16;
    for (t = 0; t < 16; t++)
        j.pid[t] = -1;
    for (t = 0; t < khw; t++) {
        int64_t vy = t / s->kw * s->dh, vx = t % s->kw * s->dw;
        int64_t id = vy % s->sh * s->sw + vx % s->sw;
        if (j.pid[id] < 0)
            j.pid[id] = (int)j.nph++;
        maxy = vy / s->sh > maxy ? vy / s->sh : maxy;
        maxx = vx / s->sw > maxx ? vx / s->sw : maxx;
    }
    j.fold = inplace && s->n > 1 && P < 256 &&
             s->n * P * (j.J + j.np) * 2 <= ((int64_t)16 << 20);
    if (j.fold) { /* one image of the batch's positions */
        j.Hq = 1;
        j.Wq = j.Q = s->n * P;
    } else if (inplace) {
        j.Hq = s->ho;
        j.Wq = s->wo;
        j.Q = P;
        j.ximg = j.J * P;
    } else {
        j.Hq = s->ho + maxy;
        j.Wq = s->wo + maxx + (s->wo & 1); /* an odd Wo's extra position in its row */
        j.rows = 1;
        j.kr = (s->wo + 1) / 2 * 2;
        j.Q = s->ho * j.kr;
        j.ximg = j.nph * s->c * j.Hq * j.Wq;
    }
    for (t = 0; t < khw; t++) {
        int64_t vy = t / s->kw * s->dh, vx = t % s->kw * s->dw;
        j.toff[t] = j.pid[vy % s->sh * s->sw + vx % s->sw] * s->c * j.Hq * j.Wq +
                    vy / s->sh * j.Wq + vx / s->sw;
    }
    j.bimg = (j.Q + 1) / 2 * 2 * j.np;
    /* images a chunk: their planes and B within about 16 MB */
    per = (inplace ? 0 : j.ximg) + j.bimg;
    chunk = j.fold ? 1 : ((int64_t)16 << 20) / 2 / per;
    chunk = chunk < 1 ? 1 : chunk > s->n ? s->n : chunk;
    j.ru = (j.J + HG_GW_ROWS - 1) / HG_GW_ROWS < 3 * T ? HG_GW_ROWS / 2 : HG_GW_ROWS;
    nunits = (j.J + j.ru - 1) / j.ru;
    *rc = -1;
    if (!(j.acc = (float *)hg_ws(ctx, (size_t)(nunits * j.ru * j.np) * 4)) ||
        !(j.bp = (uint16_t *)hg_ws(ctx, (size_t)(chunk * j.bimg + 64) * 2)) ||
        !(j.found = (int *)hg_ws(ctx, (size_t)T * sizeof(int))) ||
        (!j.swap && !(j.t16 = (uint16_t *)hg_ws(ctx, (size_t)(j.J * j.nb) * 2))) ||
        ((!inplace || j.fold) &&
         !(j.xq = (uint16_t *)hg_ws(ctx, (size_t)((j.fold ? j.J * j.Q : chunk * j.ximg) + 64) *
                                             2))))
        return 1;
    if (inplace && !j.fold && scan) { /* A read in place: scanned first */
        int bits = hg_bits(ctx, j.a, s->n * j.J * P);
        if (bits < 0)
            return 1;
        if (bits & HG_SUB)
            return 0;
    }
    memset(j.acc, 0, (size_t)(nunits * j.ru * j.np) * 4);
    memset(j.found, 0, (size_t)T * sizeof(int));
    for (i0 = 0; i0 < s->n; i0 += j.fold ? s->n : chunk) {
        int bits = 0;
        j.i0 = i0;
        j.ni = j.fold ? 1 : s->n - i0 < chunk ? s->n - i0 : chunk;
        j.last = i0 + (j.fold ? s->n : j.ni) == s->n;
        na = !j.xq ? 0 : j.fold ? j.J : j.ni * s->c;
        if ((*rc = opjit_parallel_for(ctx, 0, na + j.ni * (((j.Q + 1) / 2 + 63) / 64), 1,
                                      hg_gw_pack, &j)) != 0)
            return 1;
        for (t = 0; t < T; t++)
            bits |= j.found[t];
        if ((scan && (bits & HG_SUB)) || (j.rows && j.kr > s->wo && (bits & HG_NONFINITE)))
            return 0;
        if ((*rc = opjit_parallel_for(ctx, 0, nunits, 1, hg_gw_run, &j)) != 0)
            return 1;
    }
    if (!j.swap)
        *rc = hg_transpose16(ctx, j.t16, 1, j.J, j.nb, j.dw);
    return 1;
}

#endif /* SG_FAST */

/* The bfloat16 GEMMs this tier and CPU have (hw_path's have): HW_GEMM
 * (vdpbf16ps), HW_AMX (tiles). */
#if defined(HG_AMX)
#define HG_HAVE() ((hg_bf16_cpu() ? HW_GEMM : 0) | (hg_amx_cpu() ? HW_AMX : 0))
#elif defined(HG_BF16)
#define HG_HAVE() (hg_bf16_cpu() ? HW_GEMM : 0)
#else
#define HG_HAVE() 0
#endif

#endif
