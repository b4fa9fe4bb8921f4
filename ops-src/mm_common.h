/*
 * ops-src/mm_common.h - the argument checks and the operand layout rule
 * mm.c and the host half of mm.cu share, so both accept and refuse the same calls with the same
 * messages. A local header: both sources' cache keys include it.
 */
#ifndef MM_COMMON_H
#define MM_COMMON_H

#include <opjit_op.h>

static const char *mm_dtype_name(const DLTensor *t)
{
    if (opjit_is_dtype(t, kDLFloat, 32))
        return "float32";
    if (opjit_is_dtype(t, kDLFloat, 64))
        return "float64";
    if (opjit_is_dtype(t, kDLFloat, 16))
        return "float16";
    if (opjit_is_dtype(t, kDLBfloat, 16))
        return "bfloat16";
    return "another dtype";
}

/* self [n, k] and mat2 [k, m], both of one floating dtype (float32,
 * float64, float16 or bfloat16; *is64 for float64). Returns 0 with the
 * sizes set, or the status of opjit_fail. */
static int mm_check(opjit_ctx *ctx, const DLTensor *x, const DLTensor *y, int *is64,
                    int64_t *n, int64_t *k, int64_t *m)
{
    *is64 = 0;
    *n = *k = *m = 0;
    if (!x || !y)
        return opjit_fail(ctx, "self and mat2 are required");
    if (x->ndim != 2)
        return opjit_fail(ctx, "self must be a 2D matrix, got %dD", x->ndim);
    if (y->ndim != 2)
        return opjit_fail(ctx, "mat2 must be a 2D matrix, got %dD", y->ndim);
    *is64 = opjit_is_dtype(x, kDLFloat, 64);
    if (!*is64 && !opjit_is_dtype(x, kDLFloat, 32) && !opjit_is_dtype(x, kDLFloat, 16) &&
        !opjit_is_dtype(x, kDLBfloat, 16))
        return opjit_fail(ctx, "self must be float32, float64, float16 or bfloat16");
    if (y->dtype.code != x->dtype.code || y->dtype.bits != x->dtype.bits ||
        y->dtype.lanes != x->dtype.lanes)
        return opjit_fail(ctx, "mat2 dtype (%s) must match self dtype (%s)",
                          mm_dtype_name(y), mm_dtype_name(x));
    *n = x->shape[0];
    *k = x->shape[1];
    *m = y->shape[1];
    if (y->shape[0] != *k)
        return opjit_fail(ctx, "self and mat2 shapes cannot be multiplied "
                               "(%lldx%lld and %lldx%lld)",
                          (long long)*n, (long long)*k, (long long)y->shape[0],
                          (long long)*m);
    return 0;
}

/* The schema of mm's backward op, the same for both devices. */
#define MM_BACKWARD_SCHEMA                                                     \
    "mm_backward(Tensor grad, Tensor self, Tensor mat2, int[2] output_mask=1) " \
    "-> (Tensor grad_self, Tensor grad_mat2)"

/* The incoming gradient of mm(self [n, k], mat2 [k, m]) must be [n, m] of
 * self's dtype; want[i] from output_mask (argument 3). Returns 0, or the
 * status of opjit_fail. */
static int mm_grad_check(opjit_ctx *ctx, opjit_args *a, const DLTensor *g, const DLTensor *x,
                         int64_t n, int64_t m, int want[2])
{
    const int64_t *mask = opjit_arg_ints(a, 3);
    if (!g)
        return opjit_fail(ctx, "grad is required");
    if (g->ndim != 2)
        return opjit_fail(ctx, "grad must be a 2D matrix, got %dD", g->ndim);
    if (g->dtype.code != x->dtype.code || g->dtype.bits != x->dtype.bits ||
        g->dtype.lanes != x->dtype.lanes)
        return opjit_fail(ctx, "grad dtype (%s) must match self dtype (%s)", mm_dtype_name(g),
                          mm_dtype_name(x));
    if (g->shape[0] != n || g->shape[1] != m)
        return opjit_fail(ctx, "grad has shape [%lld, %lld]; mm's output is [%lld, %lld]",
                          (long long)g->shape[0], (long long)g->shape[1], (long long)n,
                          (long long)m);
    if (!mask || opjit_arg_len(a, 3) != 2)
        return opjit_fail(ctx, "output_mask must be 2 integers");
    want[0] = mask[0] != 0;
    want[1] = mask[1] != 0;
    return 0;
}

/* How a BLAS reads the 2-D operand t [r, c]: *transposed 0 when it is
 * row-major (unit column stride; *ld the row stride), 1 when it is
 * column-major (unit row stride; *ld the column stride), the first when
 * both fit. A dimension of size 1 may carry any stride; NULL strides are
 * row-major. Returns 0 when neither fits. */
static int mm_layout(const DLTensor *t, int *transposed, int64_t *ld)
{
    int64_t r = t->shape[0], c = t->shape[1], s0, s1;
    if (!t->strides) {
        *transposed = 0;
        *ld = c > 1 ? c : 1;
        return 1;
    }
    s0 = t->strides[0];
    s1 = t->strides[1];
    if ((s1 == 1 || c <= 1) && (r <= 1 || s0 >= (c > 1 ? c : 1))) {
        *transposed = 0;
        *ld = r <= 1 ? (c > 1 ? c : 1) : s0;
        return 1;
    }
    if ((s0 == 1 || r <= 1) && (c <= 1 || s1 >= (r > 1 ? r : 1))) {
        *transposed = 1;
        *ld = c <= 1 ? (r > 1 ? r : 1) : s1;
        return 1;
    }
    return 0;
}

#endif
