/*
 * ops-src/op_blas.h - the two GEMMs of the machine's BLAS the shipped ops
 * fall back on (the libtcc tier, float64, a CPU without the optimizing
 * tier's kernels), through opjit_blas: the library is loaded the first time
 * such a path runs, not with every load of the op (an optimized float32
 * mm never needs it). A local header: the cache keys of mm.c and conv2d.c
 * hold it.
 *
 * op_sgemm and op_dgemm take cblas_sgemm's and cblas_dgemm's arguments
 * after ctx and return 0, or -1 with the error recorded (return it from
 * the kernel or chunk). <cblas.h> gives the enums and the functions'
 * types; nothing of it is linked.
 */
#ifndef OP_BLAS_H
#define OP_BLAS_H

#ifndef FORCE_OPENBLAS_COMPLEX_STRUCT /* libtcc has no _Complex */
#define FORCE_OPENBLAS_COMPLEX_STRUCT
#endif
#include <opjit_op.h>
#include <cblas.h>

typedef void (*op_sgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE,
                            blasint, blasint, blasint, float, const float *, blasint,
                            const float *, blasint, float, float *, blasint);
typedef void (*op_dgemm_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE,
                            blasint, blasint, blasint, double, const double *, blasint,
                            const double *, blasint, double, double *, blasint);

static int op_sgemm(opjit_ctx *ctx, enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta,
                    enum CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k, float alpha,
                    const float *a, blasint lda, const float *b, blasint ldb, float beta,
                    float *c, blasint ldc)
{
    op_sgemm_fn f = (op_sgemm_fn)opjit_blas(ctx, "cblas_sgemm");
    if (!f)
        return -1;
    f(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return 0;
}

static int op_dgemm(opjit_ctx *ctx, enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta,
                    enum CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k, double alpha,
                    const double *a, blasint lda, const double *b, blasint ldb, double beta,
                    double *c, blasint ldc)
{
    op_dgemm_fn f = (op_dgemm_fn)opjit_blas(ctx, "cblas_dgemm");
    if (!f)
        return -1;
    f(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return 0;
}

#endif
