/*
 * ops-src/nms_decl.h - what nms.c and nms.cu declare beside their kernels:
 * nms keeps at most n of n boxes (a size only the data decides) and its
 * output is indices, so it has no gradient. A local header: both sources'
 * cache keys include it.
 */
#ifndef NMS_DECL_H
#define NMS_DECL_H

#include "nms_common.h"

/* nms(boxes [n, 4], scores [n], iou_threshold) -> int64 [<= n] */
static int nms_shape(opjit_ctx *ctx, opjit_args *a)
{
    int is64, rc;
    int64_t n;
    if ((rc = nms_check(ctx, opjit_arg_tensor(a, 0), opjit_arg_tensor(a, 1), &is64, &n)) != 0)
        return rc;
    if ((rc = opjit_output_shape(ctx, 0, OPJIT_INT64, 1, &n)) != 0)
        return rc;
    return opjit_output_dynamic(ctx, 0, 0);
}

static void nms_declare(opjit_module *m)
{
    opjit_shape(m, "nms", nms_shape);
    opjit_not_differentiable(m, "nms");
}

#endif
