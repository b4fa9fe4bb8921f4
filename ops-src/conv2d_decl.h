/*
 * ops-src/conv2d_decl.h - what conv2d.c and conv2d.cu declare beside their
 * kernels: the shape rule of conv2d. A local header: both sources' cache
 * keys include it.
 */
#ifndef CONV2D_DECL_H
#define CONV2D_DECL_H

#include "conv2d_common.h"

/* conv2d -> [N, O, Ho, Wo] ([O, Ho, Wo] for an unbatched input), the
 * input's dtype */
static int conv2d_shape(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *input = opjit_arg_tensor(a, 0);
    conv_geom g;
    int64_t shape[4];
    int rc;
    if ((rc = conv_check(ctx, a, input, opjit_arg_tensor(a, 1), opjit_arg_tensor(a, 2), &g)))
        return rc;
    shape[0] = g.n;
    shape[1] = g.o;
    shape[2] = g.ho;
    shape[3] = g.wo;
    return g.batched ? opjit_output_shape(ctx, 0, input->dtype, 4, shape)
                     : opjit_output_shape(ctx, 0, input->dtype, 3, shape + 1);
}

static void conv2d_declare(opjit_module *m)
{
    opjit_shape(m, "conv2d", conv2d_shape);
}

#endif
