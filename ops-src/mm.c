/*
 * mm.c - matrix product on the CPU, torch.mm semantics.
 *
 *   mm(Tensor self, Tensor mat2) -> Tensor
 *
 * self [n, k] times mat2 [k, m] gives a contiguous [n, m] of the same dtype:
 * float32, float64, float16 or bfloat16 (summed in float32 and rounded
 * once at the end: bfloat16 on gemm_half.h's GEMMs where the CPU has
 * them, float16 on this file's float32 GEMM converting while it packs
 * (below), else both widened to float32 first, half_wide.h).
 * Zero-size dimensions work: an empty product when n or m is 0, zeros when
 * k is 0.
 *
 *   mm_backward(Tensor grad, Tensor self, Tensor mat2, int[2] output_mask=1)
 *       -> (Tensor grad_self, Tensor grad_mat2)
 *
 * the gradients of mm for the incoming gradient grad [n, m]: grad_self =
 * grad mat2^T [n, k] and grad_mat2 = self^T grad [k, m], each [0] when its
 * output_mask entry is 0 (not computed). Both products go through the
 * same GEMMs as mm (a transpose is a flag of the operand, not a copy).
 *
 * The operands may have any strides, as torch.mm's: a row-major view
 * (unit column stride) or a column-major one such as a transpose (unit
 * row stride) is read as it is; any other layout (x[:, ::2], expand's
 * zero strides, as_strided) is first copied into a dense block
 * (strided.h), which costs one pass over the operand against the k (or
 * m, n) passes of the product.
 *
 * How, over opjit_parallel_for's threads (every output element is written
 * by one thread, computed the same way for any thread count):
 *  - float32 in the optimizing tier built for x86-64-v4 or -v3 (the best
 *    the CPU has, unless OPJIT_CPU_LEVEL caps it; a field of the key):
 *    sgemm_avx512.h's or sgemm_avx2.h's GEMM on blocks of rows x panels
 *    of columns (at least 3 panels a thread, of about equal widths); on
 *    AVX-512 each panel of mat2 is first copied into a contiguous
 *    [k, panel] block that stays in L2, on AVX2 the GEMM packs its own
 *    smaller panels (sgemm_core.h, SG_PACK), so a row-major mat2 is not
 *    split unless self has few rows: each call takes every column, the
 *    threads take blocks of rows.
 *    mm_backward runs both of its products in one parallel region.
 *    Every element is one chain of fused multiply-adds over k, whatever
 *    the blocks, so the blocks may follow the thread count.
 *  - otherwise OpenBLAS's GEMMs (op_blas.h: the library is loaded the
 *    first time one runs; one thread per call) on blocks of rows. The
 *    blocks follow the shape only, never the
 *    thread count: OpenBLAS's kernels round a row differently by where it
 *    falls in a call (its edge rows, and on some CPUs a small-matrix path
 *    picked by the call's size), so the same calls must be made for any
 *    number of threads. OpenBLAS's own threads would not do: their results
 *    differ from one thread's in the last bits.
 */
#include <opjit_op.h>
#include <limits.h>
#include <string.h>

#include "gemm_half.h"
#include "half_wide.h"
#include "mm_common.h"
#include "mm_decl.h"
#include "op_blas.h"
#include "parallel_pair.h"
#include "sgemm_avx2.h"
#include "sgemm_avx512.h"
#include "strided.h"

typedef struct mm_job {
    opjit_ctx *ctx;
    int64_t n, k, m, lda, ldb;
    int xt, yt, is64, f16; /* f16: x, y, out float16 (mm_f16_chunk) */
    const void *x, *y;
    const float *xw; /* f16: self widened whole (row-major, k a row), or NULL */
    void *out;
    int64_t rows;        /* rows a block */
    int64_t nb, npanels; /* fast path: columns a panel, panels */
    char *ws;            /* fast path: per-thread areas of `per` bytes */
    size_t per;
} mm_job;

/* Blocks [lo, hi) of rows through OpenBLAS. */
static int mm_blas_run(void *user, int64_t lo, int64_t hi)
{
    const mm_job *j = (const mm_job *)user;
    int64_t r0 = lo * j->rows, r1 = hi * j->rows < j->n ? hi * j->rows : j->n;
    /* row r0 of self: a row-major view starts lda * r0 in, a transpose r0 */
    int64_t off = j->xt ? r0 : r0 * j->lda;
    enum CBLAS_TRANSPOSE ta = j->xt ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE tb = j->yt ? CblasTrans : CblasNoTrans;
    if (j->is64)
        return op_dgemm(j->ctx, CblasRowMajor, ta, tb, (int)(r1 - r0), (int)j->m, (int)j->k,
                        1.0, (const double *)j->x + off, (int)j->lda, (const double *)j->y,
                        (int)j->ldb, 0.0, (double *)j->out + r0 * j->m, (int)j->m);
    return op_sgemm(j->ctx, CblasRowMajor, ta, tb, (int)(r1 - r0), (int)j->m, (int)j->k, 1.0f,
                    (const float *)j->x + off, (int)j->lda, (const float *)j->y, (int)j->ldb,
                    0.0f, (float *)j->out + r0 * j->m, (int)j->m);
}

/* Blocks of rows: as many as the shape repays (each at least about
 * 8 MFLOP), at most MM_BLAS_BLOCKS, of equal size in whole groups of 16
 * rows. Eight blocks share evenly among 1, 2, 4 or 8 threads. */
#define MM_BLAS_BLOCKS 8

static int mm_blas(opjit_ctx *ctx, mm_job *j)
{
    int64_t flops = 2 * j->n * j->k * j->m, groups = (j->n + 15) / 16;
    int64_t nb = flops / ((int64_t)1 << 23);
    if (nb > MM_BLAS_BLOCKS)
        nb = MM_BLAS_BLOCKS;
    if (nb > groups)
        nb = groups;
    if (nb < 1)
        nb = 1;
    j->rows = 16 * ((groups + nb - 1) / nb);
    return opjit_parallel_for(ctx, 0, (j->n + j->rows - 1) / j->rows, 1, mm_blas_run, j);
}

#ifdef SG_FAST
/* Columns of the widest micro-kernel (sgemm_core.h: 3 vectors of 16 on
 * AVX-512, two panels of 3 x 8 on AVX2): panels are sized in these. */
#define MM_SUB 48

/* The first column of panel p of j: the panels split the columns about
 * evenly, at multiples of 16 (widths differ by at most 16). */
static int64_t mm_panel_col(const mm_job *j, int64_t p)
{
    return p >= j->npanels ? j->m : (p * j->m + j->npanels * 8) / j->npanels / 16 * 16;
}

/* A column-major self with columns at most this many bytes apart is read
 * in place (SG_MR consecutive floats a step of k, the next step close by);
 * farther apart, each step would cost a page, and a transposing copy
 * (its own pass and parallel region) pays. */
#define MM_XT_INPLACE 1024

/* Copy columns [c0, c0 + nb) of mat2 into p, a contiguous [k, nb]; a
 * column-major mat2 (a transposed view) is transposed in W x W blocks. */
static void mm_pack_panel(const mm_job *j, int64_t c0, int64_t nb, float *p)
{
    const float *y = (const float *)j->y;
    int64_t r;
    if (!j->yt) {
        for (r = 0; r < j->k; r++)
            memcpy(p + r * nb, y + r * j->ldb + c0, (size_t)nb * sizeof(float));
        return;
    }
    /* column-major: element (r, c) at y[c * ldb + r] */
    sg_transpose(y + c0 * j->ldb, j->ldb, nb, j->k, p, nb);
}

/* Whether the GEMM reads a float32 row-major mat2 in place: where it
 * packs its panels itself (SG_PACK), or its rows are at most MM_XT_INPLACE
 * bytes apart (256 x 256: 2% faster than a thread's copy of each panel;
 * rows 4 KB apart fall in a few sets of L1: 1024 x 1024, 27% slower). */
static int mm_y_in_place(const mm_job *j)
{
    return !j->yt && !j->f16 && (SG_PACK || j->ldb * (int64_t)sizeof(float) <= MM_XT_INPLACE);
}

/* Chunk t of job j: (block of rows, panel of columns), panel fastest;
 * packs the panel into p unless *packed says it is there or mat2 is read
 * in place (mm_y_in_place). A column-major self (xt) is read in place
 * (lda 1): SG_MR consecutive floats a step of k. */
static void mm_f16_chunk(const mm_job *j, int64_t t, float *p, float *scr, int64_t *packed);

static void mm_fast_chunk(const mm_job *j, int64_t t, float *p, float *scr, int64_t *packed)
{
    int64_t panel = t % j->npanels, r0 = (t / j->npanels) * j->rows;
    if (j->f16) {
        mm_f16_chunk(j, t, p, scr, packed);
        return;
    }
    int64_t c0 = mm_panel_col(j, panel), nb = mm_panel_col(j, panel + 1) - c0;
    int64_t nr = j->n - r0 < j->rows ? j->n - r0 : j->rows;
    const float *x = (const float *)j->x + (j->xt ? r0 : r0 * j->lda);
    int64_t lda = j->xt ? 1 : j->lda, aks = j->xt ? j->lda : 1;
    float *out = (float *)j->out + r0 * j->m + c0;
    if (mm_y_in_place(j)) {
        sg_gemm_ex(nr, nb, j->k, x, lda, aks, (const float *)j->y + c0, j->ldb, out, j->m, scr,
                   0);
        return;
    }
    if (*packed != panel) {
        mm_pack_panel(j, c0, nb, p);
        *packed = panel;
    }
    sg_gemm_ex(nr, nb, j->k, x, lda, aks, p, nb, out, j->m, scr, 0);
}

/* ---- float16 on the float32 GEMM, converting while packing ----
 * Each panel of mat2 is widened as it is packed into the float32 [k,
 * panel] block the micro-kernels read (hw_f16_widen: vcvtph2ps, 8 values
 * an instruction), and each strip of results, summed in float32 in ct,
 * is rounded once into the float16 output (vcvtps2ph, nearest even): no
 * float32 copy of mat2 or of the result. Self is read by every panel: a
 * row-major one is widened once, whole (mm_f16_self), a column-major one
 * strip by strip (mm_f16_rows). Every element is the same chain of fused
 * multiply-adds over k as the float32 path's on the widened operands: the
 * widening path's bits, for any thread count. */

/* Columns [c0, c0 + nb) of float16 mat2 into p (k x nbp floats, the
 * columns past nb zero); a column-major mat2 SG_W columns at a time,
 * each widened into tmp (SG_W x k) and transposed from there. */
static void mm_f16_panel(const mm_job *j, int64_t c0, int64_t nb, int64_t nbp, float *p,
                         float *tmp)
{
    const uint16_t *y = (const uint16_t *)j->y;
    int64_t r, c, w;
    if (!j->yt) {
        for (r = 0; r < j->k; r++) {
            hw_f16_widen(y + r * j->ldb + c0, p + r * nbp, nb);
            memset(p + r * nbp + nb, 0, (size_t)(nbp - nb) * sizeof(float));
        }
        return;
    }
    for (c = 0; c < nbp; c += SG_W) { /* element (r, c) at y[c * ldb + r] */
        w = nb - c < SG_W ? nb - c : SG_W; /* >= 1: nbp - nb < SG_W */
        for (r = 0; r < w; r++)
            hw_f16_widen(y + (c0 + c + r) * j->ldb, tmp + r * j->k, j->k);
        memset(tmp + w * j->k, 0, (size_t)((SG_W - w) * j->k) * sizeof(float));
        sg_transpose(tmp, j->k, SG_W, j->k, p + c, nbp);
    }
}

/* Rows [i, i + rows) of self (rows <= SG_MR) as the micro-kernels read
 * them, *lda and *aks set: row-major self, widened whole (j->xw), in
 * place (lda k, aks 1; the last rows copied into a, zero-padded);
 * column-major float16 self widened into the strip a, SG_MR values a
 * step of k (lda 1, aks SG_MR). */
static const float *mm_f16_rows(const mm_job *j, int64_t i, int64_t rows, float *a,
                                int64_t *lda, int64_t *aks)
{
    const uint16_t *x = (const uint16_t *)j->x;
    int64_t r, q;
    if (j->xw) {
        *lda = j->k;
        *aks = 1;
        if (rows == SG_MR)
            return j->xw + i * j->k;
        memcpy(a, j->xw + i * j->k, (size_t)(rows * j->k) * sizeof(float));
        memset(a + rows * j->k, 0, (size_t)((SG_MR - rows) * j->k) * sizeof(float));
        return a;
    }
    /* element (i, q) at x[q * lda + i] */
    if (rows == SG_MR)
        for (q = 0; q < j->k; q++)
            hw_f16_widen(x + q * j->lda + i, a + q * SG_MR, SG_MR);
    else
        for (q = 0; q < j->k; q++)
            for (r = 0; r < SG_MR; r++)
                a[q * SG_MR + r] = r < rows ? opjit_f16_to_f32(x[q * j->lda + i + r]) : 0.0f;
    *lda = 1;
    *aks = SG_MR;
    return a;
}

/* The float16 chunk t of j: mm_fast_chunk's blocks; scr holds a strip of
 * self (SG_MR x k), one of results (SG_MR x nbp) and, for a column-major
 * mat2, SG_W x k for its packing. */
static void mm_f16_chunk(const mm_job *j, int64_t t, float *p, float *scr, int64_t *packed)
{
    int64_t panel = t % j->npanels, r0 = (t / j->npanels) * j->rows;
    int64_t c0 = mm_panel_col(j, panel), nb = mm_panel_col(j, panel + 1) - c0;
    int64_t nbp = (nb + SG_W - 1) / SG_W * SG_W, r1 = j->n - r0 < j->rows ? j->n : r0 + j->rows;
    float *a = scr, *ct = a + SG_MR * j->k, *tmp = ct + SG_MR * nbp;
    uint16_t *out = (uint16_t *)j->out;
    int64_t i, c, w, r, lda, aks;
    if (*packed != panel) {
        mm_f16_panel(j, c0, nb, nbp, p, tmp);
        *packed = panel;
    }
    for (i = r0; i < r1; i += SG_MR) {
        int64_t rows = r1 - i < SG_MR ? r1 - i : SG_MR;
        const float *as = mm_f16_rows(j, i, rows, a, &lda, &aks);
        for (c = 0; c < nbp; c += w) { /* 3 vectors of columns a call (4 left: two of 2) */
            w = nbp - c;
            w = w == 4 * SG_W ? 2 * SG_W : w >= 3 * SG_W ? 3 * SG_W : w >= 2 * SG_W ? 2 * SG_W
                                                                               : SG_W;
            if (w == 3 * SG_W)
                sg_k3(j->k, as, lda, aks, p + c, nbp, ct + c, nbp,
                      c + 3 * SG_W < nbp ? p + c + 3 * SG_W : NULL, nbp, 1, NULL, 0);
            else if (w == 2 * SG_W)
                sg_k2(j->k, as, lda, aks, p + c, nbp, ct + c, nbp, 0);
            else
                sg_k1(j->k, as, lda, aks, p + c, nbp, ct + c, nbp, 0);
        }
        for (r = 0; r < rows; r++)
            hw_f16_narrow(ct + r * nbp, out + (i + r) * j->m + c0, nb);
    }
}

/* Whether the GEMM packs its own panels of mat2 (SG_PACK, a row-major
 * float32 mat2): then a call takes every column and no thread copies a
 * panel. float16 panels are always converted into a thread's copy. */
static int mm_gemm_packs(const mm_job *j)
{
    return SG_PACK && !j->yt && !j->f16;
}

/* Floats of a thread's copy of a panel of mat2: none where mat2 is read
 * in place. */
static int64_t mm_panel_floats(const mm_job *j)
{
    return mm_y_in_place(j) ? 0 : j->k * j->nb;
}

/* Chunk t of j on this thread's area: a 64-byte header (the panel packed
 * there, which a later chunk of the same panel on this thread reuses),
 * the panel, the GEMM's scratch. */
static void mm_fast_on(const mm_job *j, int64_t t)
{
    char *area = j->ws + (size_t)opjit_thread_num(j->ctx) * j->per;
    float *p = (float *)(void *)(area + 64);
    mm_fast_chunk(j, t, p, p + mm_panel_floats(j) + 16, (int64_t *)(void *)area);
}

static int mm_fast_run(void *user, int64_t lo, int64_t hi)
{
    int64_t t;
    for (t = lo; t < hi; t++)
        mm_fast_on((const mm_job *)user, t);
    return 0;
}

/* Rows [64 lo, 64 hi) of a column-major self into a row-major copy
 * (lda = k), 16 x 16 blocks at a time: read in place, a column-major
 * operand would cost the GEMM a page per step of k. */
static int mm_transpose_run(void *user, int64_t lo, int64_t hi)
{
    const mm_job *j = (const mm_job *)user;
    int64_t r0 = lo * 64, r1 = hi * 64 < j->n ? hi * 64 : j->n;
    sg_transpose((const float *)j->x + r0, j->lda, j->k, r1 - r0, (float *)(void *)j->ws + r0 * j->k,
                 j->k);
    return 0;
}

/* Self as a row-major copy (a transpose pass of its own) when it is
 * column-major with columns more than MM_XT_INPLACE bytes apart: 0, or -1
 * with the error recorded. */
static int mm_fast_rows(opjit_ctx *ctx, mm_job *j)
{
    float *copy;
    int rc;
    if (!j->xt || j->f16 || j->lda * (int64_t)sizeof(float) <= MM_XT_INPLACE)
        return 0; /* float16: its strips are widened from either layout */
    if (!(copy = (float *)opjit_workspace(ctx, (size_t)(j->n * j->k) * sizeof(float))))
        return -1;
    j->ws = (char *)copy;
    if ((rc = opjit_parallel_for(ctx, 0, (j->n + 63) / 64, 1, mm_transpose_run, j)))
        return rc;
    j->x = copy;
    j->lda = j->k;
    j->xt = 0;
    return 0;
}

/* The blocks of j for T threads and its per-thread area (j->per): panels
 * of up to 384 KB of mat2 (in L2); with threads, at least T of them where
 * each keeps 32 columns, a multiple of T, of about equal widths
 * (mm_panel_col). Not more: a narrow panel runs more of its columns in
 * the narrower micro-kernels (3T panels made 256 x 256 at 2 threads 9%
 * slower). A panel is packed by the thread that runs it: panels alone
 * never pack a column twice. Blocks of rows (panel fastest, so that a
 * thread's next chunk tends to reuse its packed panel) where there are
 * fewer than 2T panels: chunks enough that a thread that starts late (a
 * worker waking up) finds work and none waits on a large last one. Where
 * the GEMM packs its own panels (SG_PACK, a row-major mat2) a call takes
 * every column (it copies each block of rows of self once a call: panels
 * of 240 columns cost 2048 x 2048 8%) and threads split the rows, 3T
 * blocks of them, unless self has too few rows for that. Returns
 * the chunks. */
static int64_t mm_fast_plan(mm_job *j, int64_t T)
{
    int64_t nb, np, nr = 1;
    nb = ((int64_t)384 << 10) / 4 / j->k / MM_SUB * MM_SUB;
    if (SG_PACK && !j->f16) /* a float32 column-major mat2, copied: one call's rows
                             * of self should meet many columns, 2 MB of mat2 (in L3) */
        nb = ((int64_t)2 << 20) / 4 / j->k / MM_SUB * MM_SUB;
    if (nb < MM_SUB)
        nb = MM_SUB;
    np = (j->m + nb - 1) / nb;
    if (mm_gemm_packs(j))
        np = T > 1 && j->n < 3 * T * 32 ? 3 * T : 1;
    if (T > 1 && !(mm_gemm_packs(j) && np == 1)) {
        int64_t most = j->m / 32 > 1 ? j->m / 32 : 1;
        np = np < T ? T : np;
        np = (np + T - 1) / T * T;
        np = np < most ? np : most;
    }
    j->npanels = np;
    j->nb = ((j->m + np - 1) / np + 15) / 16 * 16 + 16; /* the widest */
    if (mm_gemm_packs(j) && np == 1 && T > 1) {
        nr = 3 * T;
    } else if (T > 1 && np < 2 * T && j->n >= 128) {
        nr = (3 * T + np - 1) / np;
        while ((nr * np) % T)
            nr++;
    }
    j->rows = (j->n + nr - 1) / nr;
    j->rows = (j->rows + SG_MR - 1) / SG_MR * SG_MR;
    j->per = (64 + (size_t)(mm_panel_floats(j) + 16) * sizeof(float) + sg_sgemm_scratch(j->k) +
              63) / 64 * 64;
    if (j->f16) /* mm_f16_chunk's scratch: a strip of self, of results, a column block */
        j->per += (size_t)((SG_MR + SG_W) * j->k + SG_MR * (j->nb + SG_W)) * sizeof(float);
    return np * ((j->n + j->rows - 1) / j->rows);
}

/* j's per-thread areas, no panel packed yet: 0, or -1 with the error
 * recorded. */
static int mm_fast_areas(opjit_ctx *ctx, mm_job *j, int64_t T)
{
    int64_t i;
    if (!(j->ws = (char *)opjit_workspace(ctx, (size_t)T * j->per)))
        return -1;
    for (i = 0; i < T; i++)
        *(int64_t *)(void *)(j->ws + (size_t)i * j->per) = -1;
    return 0;
}

static int mm_fast(opjit_ctx *ctx, mm_job *j)
{
    int64_t T = opjit_num_threads(ctx), chunks;
    int rc;
    if ((rc = mm_fast_rows(ctx, j)) != 0)
        return rc;
    chunks = mm_fast_plan(j, T);
    if (mm_fast_areas(ctx, j, T))
        return -1;
    return opjit_parallel_for(ctx, 0, chunks, 1, mm_fast_run, j);
}

static int mm_fast_pair(opjit_ctx *ctx, mm_job *a, mm_job *b)
{
    int64_t T = opjit_num_threads(ctx), ca, cb;
    int rc;
    if ((rc = mm_fast_rows(ctx, a)) != 0 || (rc = mm_fast_rows(ctx, b)) != 0)
        return rc;
    ca = mm_fast_plan(a, T);
    cb = mm_fast_plan(b, T);
    if (mm_fast_areas(ctx, a, T) || mm_fast_areas(ctx, b, T))
        return -1;
    return parallel_for_pair(ctx, mm_fast_run, a, ca, mm_fast_run, b, cb);
}
#endif

/* A 2-D operand as the GEMMs read it: its data, whether it is stored
 * column-major (t), and its leading dimension. */
typedef struct mm_operand {
    const void *p;
    int t;
    int64_t ld;
} mm_operand;

/* Describe t [r, c] as an operand, copying it to a dense block first when
 * its strides are neither row- nor column-major. 0, or the status of
 * opjit_fail. what names it in messages. */
static int mm_operand_of(opjit_ctx *ctx, const DLTensor *t, const char *what, mm_operand *o)
{
    o->p = opjit_data(t);
    o->t = 0;
    o->ld = t->shape[1] > 1 ? t->shape[1] : 1;
    if (opjit_numel(t) == 0)
        return 0; /* an empty product touches no operand memory */
    if (!mm_layout(t, &o->t, &o->ld)) {
        o->t = 0;
        o->ld = t->shape[1];
        if (st_dense(ctx, t, &o->p))
            return -1;
    }
    if (o->ld > INT_MAX)
        return opjit_fail(ctx, "%s: a leading dimension above %d is not supported", what,
                          INT_MAX);
    return 0;
}

/* The operand read as its transpose. */
static mm_operand mm_transposed(mm_operand o)
{
    o.t = !o.t;
    return o;
}

/* j for out [n, m] (dense) = x [n, k] y [k, m]. */
static void mm_job_init(mm_job *j, opjit_ctx *ctx, int is64, int64_t n, int64_t k, int64_t m,
                        mm_operand x, mm_operand y, void *out)
{
    memset(j, 0, sizeof *j);
    j->ctx = ctx;
    j->n = n;
    j->k = k;
    j->m = m;
    j->is64 = is64;
    j->x = x.p;
    j->xt = x.t;
    j->lda = x.ld;
    j->y = y.p;
    j->yt = y.t;
    j->ldb = y.ld;
    j->out = out;
}

/* out [n, m] (dense) = x [n, k] y [k, m]. 0, or the status of opjit_fail. */
static int mm_product(opjit_ctx *ctx, int is64, int64_t n, int64_t k, int64_t m, mm_operand x,
                      mm_operand y, void *out)
{
    mm_job j;
    if (n == 0 || m == 0)
        return 0;
    if (k == 0) {
        memset(out, 0, (size_t)(n * m) * (is64 ? 8 : 4));
        return 0;
    }
    mm_job_init(&j, ctx, is64, n, k, m, x, y, out);
#ifdef SG_FAST
    if (!is64 && sg_fast_ok())
        return mm_fast(ctx, &j);
#endif
    return mm_blas(ctx, &j);
}

/* mm_backward's two products, gx [n, k] = g [n, m] y^T and gy [k, m] = x^T
 * g: on this file's GEMM in one parallel region where it runs (float32,
 * no empty dimension), else one after the other. */
static int mm_grads(opjit_ctx *ctx, int is64, int64_t n, int64_t k, int64_t m, mm_operand g,
                    mm_operand x, mm_operand y, void *gx, void *gy)
{
    int rc;
#ifdef SG_FAST
    if (!is64 && gx && gy && n && k && m && sg_fast_ok()) {
        mm_job a, b;
        mm_job_init(&a, ctx, 0, n, m, k, g, mm_transposed(y), gx);
        mm_job_init(&b, ctx, 0, k, n, m, mm_transposed(x), g, gy);
        return mm_fast_pair(ctx, &a, &b);
    }
#endif
    /* grad_self [n, k] = grad [n, m] mat2^T [m, k] */
    if (gx && (rc = mm_product(ctx, is64, n, m, k, g, mm_transposed(y), gx)) != 0)
        return rc;
    /* grad_mat2 [k, m] = self^T [k, n] grad [n, m] */
    if (gy && (rc = mm_product(ctx, is64, k, n, m, mm_transposed(x), g, gy)) != 0)
        return rc;
    return 0;
}

static int mm_sizes_ok(opjit_ctx *ctx, int64_t n, int64_t k, int64_t m)
{
    if (n > INT_MAX || k > INT_MAX || m > INT_MAX)
        return opjit_fail(ctx, "dimensions above %d are not supported "
                               "(%lldx%lld and %lldx%lld)",
                          INT_MAX, (long long)n, (long long)k, (long long)k, (long long)m);
    return 0;
}

/* A float16 or bfloat16 operand t as a dense row-major float32 copy
 * (strided.h's copy first when its strides ask for one). 0, or -1 with
 * the error recorded. */
static int mm_widened(opjit_ctx *ctx, int kind, const DLTensor *t, mm_operand *o)
{
    const void *p;
    o->t = 0;
    o->ld = t->shape[1] > 1 ? t->shape[1] : 1;
    if (st_dense(ctx, t, &p))
        return -1;
    o->p = hw_widen(ctx, kind, p, opjit_numel(t));
    return o->p ? 0 : -1;
}

/* The path of a 16-bit call (half_wide.h's hw_path: HW_WIDEN, or HW_GEMM
 * with HW_SCAN and HW_AMX bits), or -1 with the error recorded. */
#ifdef SG_FAST
#define MM_F16_HAVE() (sg_fast_ok() ? HW_GEMM : 0)
#else
#define MM_F16_HAVE() 0
#endif
static int mm_path(opjit_ctx *ctx, int kind)
{
    return hw_path(ctx, kind, kind == HW_F16 ? MM_F16_HAVE() : HG_HAVE());
}

#ifdef SG_FAST
/* A column-major float16 self (element (i, q) at x[q lda + i]) widened
 * and transposed into w, row-major [n, k]: each chunk 64 of its stored
 * rows (values of q), in tiles of 64 x 64 (64 rows of x widened into a
 * thread's t, then transposed into w): a tile touches 64 pages of x and
 * 64 of w (their rows are pages apart at 2048). Strips of SG_MR rows
 * widened per panel from x in place read a row of x per step of k:
 * 2048 x 2048 took 2.2x the row-major self's time. */
typedef struct mm_f16_tr {
    const mm_job *j;
    float *w, *t; /* t: 64 x 64 floats a thread */
} mm_f16_tr;

static int mm_f16_tr_run(void *user, int64_t lo, int64_t hi)
{
    const mm_f16_tr *q = (const mm_f16_tr *)user;
    const mm_job *j = q->j;
    float *t = q->t + (size_t)opjit_thread_num(j->ctx) * 64 * 64;
    int64_t q0, q1 = hi * 64 < j->k ? hi * 64 : j->k, i0, r;
    for (q0 = lo * 64; q0 < q1; q0 += 64) {
        int64_t nq = q1 - q0 < 64 ? q1 - q0 : 64;
        for (i0 = 0; i0 < j->n; i0 += 64) {
            int64_t ni = j->n - i0 < 64 ? j->n - i0 : 64;
            for (r = 0; r < nq; r++)
                hw_f16_widen((const uint16_t *)j->x + (q0 + r) * j->lda + i0, t + r * 64, ni);
            sg_transpose(t, 64, nq, ni, q->w + i0 * j->k + q0, j->k);
        }
    }
    return 0;
}

/* Self widened whole into j->xw (one pass, k floats a row, the GEMM
 * reads it in place): a row-major one row by row, a column-major one
 * transposed too (mm_f16_tr_run). Strips converted per panel would cost
 * that again per panel, about 10% of mm 2048's time. 0, or -1 with the
 * error recorded. */
static int mm_f16_self(opjit_ctx *ctx, mm_job *j)
{
    float *w;
    int64_t r;
    mm_f16_tr q;
    if (!j->xt && j->lda == j->k)
        return (j->xw = hw_widen(ctx, HW_F16, j->x, j->n * j->k)) ? 0 : -1;
    if (!(w = hw_scratch(ctx, j->n * j->k)))
        return -1;
    if (j->xt) {
        q.j = j;
        q.w = w;
        if (!(q.t = hw_scratch(ctx, (int64_t)opjit_num_threads(ctx) * 64 * 64)) ||
            opjit_parallel_for(ctx, 0, (j->k + 63) / 64, 1, mm_f16_tr_run, &q))
            return -1;
    } else {
        for (r = 0; r < j->n; r++) /* rows lda apart (a slice of columns) */
            hw_f16_widen((const uint16_t *)j->x + r * j->lda, w + r * j->k, j->k);
    }
    j->xw = w;
    return 0;
}
#endif

/* out [n, m] = x [n, k] y [k, m] in float16 on the float32 GEMM,
 * converting while packing (mm_f16_chunk). 0, or the status of the
 * failure recorded. */
static int mm_f16(opjit_ctx *ctx, int64_t n, int64_t k, int64_t m, mm_operand x, mm_operand y,
                  void *out)
{
#ifdef SG_FAST
    mm_job j;
    if (n == 0 || m == 0)
        return 0;
    if (k == 0) {
        memset(out, 0, (size_t)(n * m) * sizeof(uint16_t));
        return 0;
    }
    mm_job_init(&j, ctx, 0, n, k, m, x, y, out);
    j.f16 = 1;
    if (mm_f16_self(ctx, &j))
        return -1;
    return mm_fast(ctx, &j);
#else
    (void)n, (void)k, (void)m, (void)x, (void)y, (void)out;
    return opjit_fail(ctx, "no float16 GEMM in this tier");
#endif
}

/* mm_backward's products in float16 (mm_grads' on mm_f16): gx [n, k] =
 * g y^T and gy [k, m] = x^T g, each where not NULL. */
static int mm_f16_grads(opjit_ctx *ctx, int64_t n, int64_t k, int64_t m, mm_operand g,
                        mm_operand x, mm_operand y, void *gx, void *gy)
{
    int rc;
#ifdef SG_FAST
    if (gx && gy && n && k && m) {
        mm_job a, b;
        mm_job_init(&a, ctx, 0, n, m, k, g, mm_transposed(y), gx);
        mm_job_init(&b, ctx, 0, k, n, m, mm_transposed(x), g, gy);
        a.f16 = b.f16 = 1;
        if (mm_f16_self(ctx, &a) || mm_f16_self(ctx, &b))
            return -1;
        return mm_fast_pair(ctx, &a, &b);
    }
#endif
    if (gx && (rc = mm_f16(ctx, n, m, k, g, mm_transposed(y), gx)) != 0)
        return rc;
    return gy ? mm_f16(ctx, k, n, m, mm_transposed(x), g, gy) : 0;
}

/* Whether the bfloat16 GEMM takes the n operands o (o[i]: rows[i] x
 * cols[i]) on path: 1; 0 where one holds a subnormal (HW_SCAN), -1 with
 * the error recorded. */
static int mm_use_dot(opjit_ctx *ctx, int path, int n, const mm_operand *o,
                      const int64_t *rows, const int64_t *cols)
{
#ifdef HG_BF16
    int i, s;
    for (i = 0; (path & HW_SCAN) && i < n; i++)
        if ((s = o[i].t ? hg_subnormal(ctx, o[i].p, cols[i], rows[i], o[i].ld)
                        : hg_subnormal(ctx, o[i].p, rows[i], cols[i], o[i].ld)) != 0)
            return s < 0 ? -1 : 0;
    return path != HW_WIDEN;
#else
    (void)ctx, (void)n, (void)o, (void)rows, (void)cols;
    return path != HW_WIDEN;
#endif
}

/* out [n, m] = x [n, k] y [k, m] in bfloat16 on that GEMM (on tiles where
 * path has HW_AMX). */
static int mm_dot(opjit_ctx *ctx, int path, int64_t n, int64_t k, int64_t m, mm_operand x,
                  mm_operand y, void *out)
{
#ifdef HG_BF16
    return hg_mm_bf16(ctx, n, k, m, x.p, x.t, x.ld, y.p, y.t, y.ld, out, !!(path & HW_AMX));
#else
    (void)path, (void)n, (void)k, (void)m, (void)x, (void)y, (void)out;
    return opjit_fail(ctx, "no bfloat16 GEMM in this tier");
#endif
}

/* mm_backward's products in bfloat16 on that GEMM, gx [n, k] = g y^T and
 * gy [k, m] = x^T g, each where not NULL: both on vdpbf16ps in one
 * parallel region after one of the operand passes (hg_mm_bf16_grads),
 * else (one of them, tiles) one after the other. *sub: whether path asks
 * for the scan and an operand holds a subnormal (then nothing is
 * computed: widen). 0, or the status of the failure recorded. */
static int mm_dot_grads(opjit_ctx *ctx, int path, int64_t n, int64_t k, int64_t m,
                        mm_operand g, mm_operand x, mm_operand y, void *gx, void *gy, int *sub)
{
    mm_operand o[3];
    int64_t rows[3] = {n, k, n}, cols[3] = {m, m, k};
    int rc, no = 1, dot;
#ifdef HG_BF16
    if (gx && gy && !(path & HW_AMX) && n && k && m)
        return hg_mm_bf16_grads(ctx, n, k, m, g.p, g.t, g.ld, x.p, x.t, x.ld, y.p, y.t, y.ld,
                                gx, gy, !!(path & HW_SCAN), sub);
#endif
    o[0] = g;
    if (gx)
        o[no++] = y;
    if (gy) {
        rows[no] = n;
        cols[no] = k;
        o[no++] = x;
    }
    if ((dot = mm_use_dot(ctx, path, no, o, rows, cols)) < 0)
        return -1;
    if (!(*sub = !dot)) {
        if (gx && (rc = mm_dot(ctx, path, n, m, k, g, mm_transposed(y), gx)) != 0)
            return rc;
        if (gy && (rc = mm_dot(ctx, path, k, n, m, mm_transposed(x), g, gy)) != 0)
            return rc;
    }
    return 0;
}

/* mm in float16 or bfloat16: the float32 product of the widened operands
 * (or mm_dot's), rounded once into out [n, m]. */
static int mm_half(opjit_ctx *ctx, int kind, const DLTensor *x, const DLTensor *y, int64_t n,
                   int64_t k, int64_t m, void *out)
{
    mm_operand xo, yo;
    float *o;
    int rc, dot, path = mm_path(ctx, kind);
    if (path < 0)
        return -1;
    if (path != HW_WIDEN) {
        mm_operand o[2];
        int64_t rows[2] = {n, k}, cols[2] = {k, m};
        if (mm_operand_of(ctx, x, "self", &o[0]) || mm_operand_of(ctx, y, "mat2", &o[1]))
            return -1;
        if (kind == HW_F16)
            return mm_f16(ctx, n, k, m, o[0], o[1], out);
        if ((dot = mm_use_dot(ctx, path, 2, o, rows, cols)) < 0)
            return -1;
        if (dot)
            return mm_dot(ctx, path, n, k, m, o[0], o[1], out);
    }
    if (mm_widened(ctx, kind, x, &xo) || mm_widened(ctx, kind, y, &yo) ||
        !(o = hw_scratch(ctx, n * m)))
        return -1;
    if ((rc = mm_product(ctx, 0, n, k, m, xo, yo, o)) != 0)
        return rc;
    return hw_narrow(ctx, kind, o, out, n * m);
}

static int mm_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    DLTensor *y = opjit_arg_tensor(a, 1);
    DLTensor *out;
    mm_operand xo, yo;
    int is64, rc, kind;
    int64_t n, k, m, shape[2];

    if ((rc = mm_check(ctx, x, y, &is64, &n, &k, &m)) != 0 ||
        (rc = mm_sizes_ok(ctx, n, k, m)) != 0)
        return rc;
    if ((kind = hw_kind(x->dtype)) != 0) {
        shape[0] = n;
        shape[1] = m;
        if (!(out = opjit_output(ctx, 0, x->dtype, 2, shape)))
            return -1;
        return mm_half(ctx, kind, x, y, n, k, m, opjit_data(out));
    }
    if ((rc = mm_operand_of(ctx, x, "self", &xo)) != 0 ||
        (rc = mm_operand_of(ctx, y, "mat2", &yo)) != 0)
        return rc;
    shape[0] = n;
    shape[1] = m;
    if (!(out = opjit_output(ctx, 0, x->dtype, 2, shape)))
        return -1;
    return mm_product(ctx, is64, n, k, m, xo, yo, opjit_data(out));
}

/* Output index of mm_backward, [rows, cols] when wanted (want), else [0],
 * its data into *data. 0, or -1 with the error recorded. */
static int mm_grad_output(opjit_ctx *ctx, int index, DLDataType dt, int want, int64_t rows,
                          int64_t cols, void **data)
{
    int64_t shape[2] = {rows, cols}, none = 0;
    DLTensor *t = want ? opjit_output(ctx, index, dt, 2, shape)
                       : opjit_output(ctx, index, dt, 1, &none);
    *data = t ? opjit_data(t) : NULL;
    return t ? 0 : -1;
}

/* mm_backward in float16 or bfloat16: the float32 products of the widened
 * operands, each rounded once into its output (gx [n, k], gy [k, m]);
 * bfloat16 on mm_dot's GEMM where the CPU has it (mm_dot_grads: on
 * vdpbf16ps the subnormal scans and the transposing copies in one
 * parallel region, both products in another), float16 on the float32
 * GEMM converting as it packs (mm_f16_grads). */
static int mm_backward_half(opjit_ctx *ctx, int kind, const DLTensor *g, const DLTensor *x,
                            const DLTensor *y, const int want[2], int64_t n, int64_t k,
                            int64_t m, void *gx, void *gy)
{
    mm_operand go, xo, yo;
    float *o;
    int rc, sub, path = mm_path(ctx, kind);
    if (path < 0)
        return -1;
    if (path != HW_WIDEN) { /* the same products on mm_dot */
        mm_operand o[3];
        int no = 1;
        if (mm_operand_of(ctx, g, "grad", &o[0]) ||
            (want[0] && mm_operand_of(ctx, y, "mat2", &o[no++])) ||
            (want[1] && mm_operand_of(ctx, x, "self", &o[no++])))
            return -1;
        if (kind == HW_F16)
            return mm_f16_grads(ctx, n, k, m, o[0], o[no - 1], o[1], want[0] ? gx : NULL,
                                want[1] ? gy : NULL);
        if ((rc = mm_dot_grads(ctx, path, n, k, m, o[0], o[no - 1], o[1], want[0] ? gx : NULL,
                               want[1] ? gy : NULL, &sub)) != 0 ||
            !sub)
            return rc;
    }
    if (mm_widened(ctx, kind, g, &go) || (want[0] && mm_widened(ctx, kind, y, &yo)) ||
        (want[1] && mm_widened(ctx, kind, x, &xo)))
        return -1;
    if (want[0]) {
        if (!(o = hw_scratch(ctx, n * k)))
            return -1;
        if ((rc = mm_product(ctx, 0, n, m, k, go, mm_transposed(yo), o)) != 0 ||
            (rc = hw_narrow(ctx, kind, o, gx, n * k)) != 0)
            return rc;
    }
    if (want[1]) {
        if (!(o = hw_scratch(ctx, k * m)))
            return -1;
        if ((rc = mm_product(ctx, 0, k, n, m, mm_transposed(xo), go, o)) != 0 ||
            (rc = hw_narrow(ctx, kind, o, gy, k * m)) != 0)
            return rc;
    }
    return 0;
}

static int mm_backward_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *g = opjit_arg_tensor(a, 0);
    DLTensor *x = opjit_arg_tensor(a, 1);
    DLTensor *y = opjit_arg_tensor(a, 2);
    mm_operand go, xo = {NULL, 0, 0}, yo = {NULL, 0, 0};
    int is64, rc, want[2];
    int64_t n, k, m;
    void *gx, *gy;

    if ((rc = mm_check(ctx, x, y, &is64, &n, &k, &m)) != 0 ||
        (rc = mm_grad_check(ctx, a, g, x, n, m, want)) != 0 ||
        (rc = mm_sizes_ok(ctx, n, k, m)) != 0)
        return rc;
    if (hw_kind(x->dtype)) {
        if (mm_grad_output(ctx, 0, x->dtype, want[0], n, k, &gx) ||
            mm_grad_output(ctx, 1, x->dtype, want[1], k, m, &gy))
            return -1;
        return mm_backward_half(ctx, hw_kind(x->dtype), g, x, y, want, n, k, m, gx, gy);
    }
    if ((rc = mm_operand_of(ctx, g, "grad", &go)) != 0 ||
        (want[0] && (rc = mm_operand_of(ctx, y, "mat2", &yo)) != 0) ||
        (want[1] && (rc = mm_operand_of(ctx, x, "self", &xo)) != 0))
        return rc;
    if (mm_grad_output(ctx, 0, x->dtype, want[0], n, k, &gx) ||
        mm_grad_output(ctx, 1, x->dtype, want[1], k, m, &gy))
        return -1;
    return mm_grads(ctx, is64, n, k, m, go, xo, yo, want[0] ? gx : NULL, want[1] ? gy : NULL);
}

OPJIT_MODULE(m)
{
    opjit_def(m, "mm(Tensor self, Tensor mat2) -> Tensor", OPJIT_CPU, mm_cpu,
              "Matrix product [n,k] x [k,m] -> [n,m] (OpenBLAS gemm; an AVX-512 or AVX2 "
              "GEMM in the optimizing tier)");
    opjit_require(m, "self", "floating rank=2");
    opjit_require(m, "mat2", "floating rank=2");
    opjit_def(m, MM_BACKWARD_SCHEMA, OPJIT_CPU, mm_backward_cpu,
              "Gradients of mm: grad mat2^T and self^T grad (the GEMMs of mm)");
    opjit_require(m, "grad", "floating rank=2");
    opjit_require(m, "self", "floating rank=2");
    opjit_require(m, "mat2", "floating rank=2");
    mm_declare(m);
}
