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

/* NAME(ctx, then the arguments of cblas_?gemm) on type T, defined once
 * for float and double. */
#define OP_BLAS_GEMM(NAME, T, FUNCTION)                                           \
    typedef void (*NAME##_fn)(enum CBLAS_ORDER, enum CBLAS_TRANSPOSE, enum CBLAS_TRANSPOSE, \
                              blasint, blasint, blasint, T, const T *, blasint,       \
                              const T *, blasint, T, T *, blasint);                   \
    static int NAME(opjit_ctx *ctx, enum CBLAS_ORDER o, enum CBLAS_TRANSPOSE ta,      \
                    enum CBLAS_TRANSPOSE tb, blasint m, blasint n, blasint k, T alpha,   \
                    const T *a, blasint lda, const T *b, blasint ldb, T beta, T *c,    \
                    blasint ldc)                                                      \
    {                                                                                 \
        NAME##_fn f = (NAME##_fn)opjit_blas(ctx, FUNCTION);                           \
        if (!f)                                                                       \
            return -1;                                                                \
        f(o, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);                   \
        return 0;                                                                     \
    }

OP_BLAS_GEMM(op_sgemm, float, "cblas_sgemm")
OP_BLAS_GEMM(op_dgemm, double, "cblas_dgemm")

#endif
