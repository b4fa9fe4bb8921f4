/*
 * ops-src/mm_decl.h - what mm.c and mm.cu declare beside their kernels:
 * the shape rule of mm. A local header: both sources' cache keys include
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

static void mm_declare(opjit_module *m)
{
    opjit_shape(m, "mm", mm_shape);
}

#endif
