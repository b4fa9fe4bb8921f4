/*
 * ops-src/conv2d_decl.h - what conv2d.c and conv2d.cu declare beside their
 * kernels: the shape rule of conv2d. A local header: both sources' cache
 * keys include it.
 */
#ifndef CONV2D_DECL_H
#define CONV2D_DECL_H

#include "conv2d_common.h"

/* conv2d (str_padding: conv2d.padding) -> [N, O, Ho, Wo] ([O, Ho, Wo] for
 * an unbatched input), the input's dtype: the kernels' own checks. */
static int conv2d_shape_of(opjit_ctx *ctx, opjit_args *a, int str_padding)
{
    DLTensor *input = opjit_arg_tensor(a, 0);
    conv_args p;
    conv_geom g;
    int64_t shape[4];
    int rc;
    if ((rc = conv_read_args(ctx, a, 3, str_padding, &p)) ||
        (rc = conv_check(ctx, input, opjit_arg_tensor(a, 1), opjit_arg_tensor(a, 2), &p, &g)))
        return rc;
    shape[0] = g.n;
    shape[1] = g.o;
    shape[2] = g.ho;
    shape[3] = g.wo;
    return g.batched ? opjit_output_shape(ctx, 0, input->dtype, 4, shape)
                     : opjit_output_shape(ctx, 0, input->dtype, 3, shape + 1);
}

static int conv2d_shape(opjit_ctx *ctx, opjit_args *a) { return conv2d_shape_of(ctx, a, 0); }
static int conv2d_padding_shape(opjit_ctx *ctx, opjit_args *a)
{
    return conv2d_shape_of(ctx, a, 1);
}

/* After the module's opjit_defs; padding: it defines conv2d.padding too. */
static void conv2d_declare(opjit_module *m, int padding)
{
    opjit_shape(m, "conv2d", conv2d_shape);
    if (padding)
        opjit_shape(m, "conv2d.padding", conv2d_padding_shape);
}

#endif
