/*
 * ops-src/conv2d_decl.h - what conv2d.c and conv2d.cu declare beside their
 * kernels: what each schema requires of its tensors, the shape rules of
 * conv2d, conv2d_backward and their padding overloads, and conv2d's
 * derivative (conv2d_backward for input, weight and bias). A local header:
 * both sources' cache keys include it.
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

/* One gradient shaped like t when wanted, else [0], t's dtype. */
static int conv2d_grad_shape(opjit_ctx *ctx, int index, const DLTensor *t, int want)
{
    int64_t none = 0;
    return want ? opjit_output_shape(ctx, index, t->dtype, t->ndim, t->shape)
                : opjit_output_shape(ctx, index, t->dtype, 1, &none);
}

/* conv2d_backward (str_padding: .padding) -> (grad_input like input,
 * grad_weight like weight, grad_bias like bias; [0] where output_mask
 * says 0, and grad_bias without a bias): the kernels' own checks. */
static int conv2d_backward_shape_of(opjit_ctx *ctx, opjit_args *a, int str_padding)
{
    DLTensor *input = opjit_arg_tensor(a, 1), *weight = opjit_arg_tensor(a, 2);
    DLTensor *bias = opjit_arg_tensor(a, 3);
    conv_args p;
    conv_geom g;
    int want[3], rc;
    if ((rc = conv_read_args(ctx, a, 4, str_padding, &p)) ||
        (rc = conv_check(ctx, input, weight, bias, &p, &g)) ||
        (rc = conv_check_grad(ctx, a, 8, opjit_arg_tensor(a, 0), input, &g, want)) ||
        (rc = conv2d_grad_shape(ctx, 0, input, want[0])) ||
        (rc = conv2d_grad_shape(ctx, 1, weight, want[1])))
        return rc;
    return conv2d_grad_shape(ctx, 2, bias ? bias : weight, want[2] && bias);
}

static int conv2d_backward_shape(opjit_ctx *ctx, opjit_args *a)
{
    return conv2d_backward_shape_of(ctx, a, 0);
}
static int conv2d_backward_padding_shape(opjit_ctx *ctx, opjit_args *a)
{
    return conv2d_backward_shape_of(ctx, a, 1);
}

/* Right after the opjit_def of a conv2d schema (backward: of a
 * conv2d_backward one, which takes grad too): what it asks of its tensors. */
static void conv2d_require(opjit_module *m, int backward)
{
    if (backward)
        opjit_require(m, "grad", "floating");
    opjit_require(m, "input", "floating");
    opjit_require(m, "weight", "floating rank=4");
    opjit_require(m, "bias", "floating rank=1");
}

/* After the module's opjit_defs (conv2d, conv2d_backward; padding: their
 * .padding overloads too). */
static void conv2d_declare(opjit_module *m, int padding)
{
    opjit_shape(m, "conv2d", conv2d_shape);
    opjit_shape(m, "conv2d_backward", conv2d_backward_shape);
    opjit_derivative(m, "conv2d", "conv2d_backward", "input, weight, bias");
    if (padding) {
        opjit_shape(m, "conv2d.padding", conv2d_padding_shape);
        opjit_shape(m, "conv2d_backward.padding", conv2d_backward_padding_shape);
        opjit_derivative(m, "conv2d.padding", "conv2d_backward.padding", "input, weight, bias");
    }
}

#endif
