/*
 * mm.c - matrix product on the CPU through OpenBLAS, torch.mm semantics.
 *
 *   mm(Tensor self, Tensor mat2) -> Tensor
 *
 * self [n, k] times mat2 [k, m] gives a contiguous [n, m] of the same dtype
 * (float32 through cblas_sgemm, float64 through cblas_dgemm). Zero-size
 * dimensions work: an empty product when n or m is 0, zeros when k is 0.
 *
 * The operands need not be contiguous: a row-major view (unit column
 * stride) or a column-major one such as a transpose (unit row stride) goes
 * to BLAS as it is, with the matching transpose flag and leading dimension.
 * Any other layout is refused with a message.
 */
#ifndef FORCE_OPENBLAS_COMPLEX_STRUCT
#define FORCE_OPENBLAS_COMPLEX_STRUCT
#endif
#include <opjit_op.h>
#include <cblas.h>
#include <limits.h>
#include <string.h>

#include "mm_common.h"

static int mm_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    DLTensor *y = opjit_arg_tensor(a, 1);
    DLTensor *out;
    enum CBLAS_TRANSPOSE ta = CblasNoTrans, tb = CblasNoTrans;
    int xt = 0, yt = 0;
    int64_t n, k, m, lda = 1, ldb = 1, shape[2];
    int is64, rc;

    if ((rc = mm_check(ctx, x, y, &is64, &n, &k, &m)) != 0)
        return rc;
    if (n > INT_MAX || k > INT_MAX || m > INT_MAX)
        return opjit_fail(ctx, "dimensions above %d are not supported "
                               "(%lldx%lld and %lldx%lld)",
                          INT_MAX, (long long)n, (long long)k, (long long)k,
                          (long long)m);
    /* An empty product touches no operand memory: any strides do. */
    if (n > 0 && m > 0 && k > 0) {
        if (!mm_layout(x, &xt, &lda))
            return opjit_fail(ctx, "self has strides [%lld, %lld]: neither rows nor "
                                   "columns are contiguous",
                              (long long)x->strides[0], (long long)x->strides[1]);
        if (!mm_layout(y, &yt, &ldb))
            return opjit_fail(ctx, "mat2 has strides [%lld, %lld]: neither rows nor "
                                   "columns are contiguous",
                              (long long)y->strides[0], (long long)y->strides[1]);
        ta = xt ? CblasTrans : CblasNoTrans;
        tb = yt ? CblasTrans : CblasNoTrans;
        if (lda > INT_MAX || ldb > INT_MAX)
            return opjit_fail(ctx, "a leading dimension above %d is not supported",
                              INT_MAX);
    }

    shape[0] = n;
    shape[1] = m;
    out = opjit_output(ctx, 0, x->dtype, 2, shape);
    if (!out)
        return -1;
    if (n == 0 || m == 0)
        return 0;
    if (k == 0) {
        memset(opjit_data(out), 0, (size_t)(n * m) * (is64 ? 8 : 4));
        return 0;
    }
    if (is64)
        cblas_dgemm(CblasRowMajor, ta, tb, (int)n, (int)m, (int)k, 1.0,
                    (const double *)opjit_data(x), (int)lda,
                    (const double *)opjit_data(y), (int)ldb, 0.0,
                    (double *)opjit_data(out), (int)m);
    else
        cblas_sgemm(CblasRowMajor, ta, tb, (int)n, (int)m, (int)k, 1.0f,
                    (const float *)opjit_data(x), (int)lda,
                    (const float *)opjit_data(y), (int)ldb, 0.0f,
                    (float *)opjit_data(out), (int)m);
    return 0;
}

OPJIT_MODULE(mm, m)
{
    opjit_def(m, "mm(Tensor self, Tensor mat2) -> Tensor", OPJIT_CPU, mm_cpu,
              "Matrix product [n,k] x [k,m] -> [n,m] (OpenBLAS gemm)");
    opjit_require(m, "self", "float32|float64 rank=2");
    opjit_require(m, "mat2", "float32|float64 rank=2");
}
