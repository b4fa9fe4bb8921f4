/*
 * ops-src/mm_decl.h - what mm.c and mm.cu declare beside their kernels:
 * the shape rules of mm and mm_backward, and mm's derivative (mm_backward
 * for both operands). A local header: both sources' cache keys include
 * it.
 */
#ifndef MM_DECL_H
#define MM_DECL_H

#include "mm_common.h"

/* mm(self [n, k], mat2 [k, m]) -> [n, m], self's dtype */
static int mm_shape(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    int is64, rc;
    int64_t n, k, m, shape[2];
    if ((rc = mm_check(ctx, x, opjit_arg_tensor(a, 1), &is64, &n, &k, &m)) != 0)
        return rc;
    shape[0] = n;
    shape[1] = m;
    return opjit_output_shape(ctx, 0, x->dtype, 2, shape);
}

/* One gradient: [rows, cols] when wanted, else [0], self's dtype. */
static int mm_grad_shape(opjit_ctx *ctx, int index, DLDataType dt, int want, int64_t rows,
                         int64_t cols)
{
    int64_t shape[2], none = 0;
    shape[0] = rows;
    shape[1] = cols;
    return want ? opjit_output_shape(ctx, index, dt, 2, shape)
                : opjit_output_shape(ctx, index, dt, 1, &none);
}

/* mm_backward(grad [n, m], self [n, k], mat2 [k, m], output_mask) ->
 * (grad_self [n, k], grad_mat2 [k, m]) */
static int mm_backward_shape(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 1);
    int is64, rc, want[2];
    int64_t n, k, m;
    if ((rc = mm_check(ctx, x, opjit_arg_tensor(a, 2), &is64, &n, &k, &m)) != 0 ||
        (rc = mm_grad_check(ctx, a, opjit_arg_tensor(a, 0), x, n, m, want)) != 0 ||
        (rc = mm_grad_shape(ctx, 0, x->dtype, want[0], n, k)) != 0)
        return rc;
    return mm_grad_shape(ctx, 1, x->dtype, want[1], k, m);
}

/* After the module's opjit_defs of mm and mm_backward. */
static void mm_declare(opjit_module *m)
{
    opjit_shape(m, "mm", mm_shape);
    opjit_shape(m, "mm_backward", mm_backward_shape);
    opjit_derivative(m, "mm", "mm_backward", "self, mat2");
}

#endif
