/* scale(Tensor self, float alpha=1.0, Tensor? shift=None) -> Tensor:
 * alpha * self + shift, float32 or float64, with everything a framework
 * needs beside the kernel: a shape rule and a derivative, computed by the
 * backward op scale_backward (grad_self = alpha * grad; grad_shift = grad).
 * scale_nograd is the same forward with no gradient declared. The tests
 * of the Python front use them before the shipped ops have backward ops. */
#include <opjit_op.h>
#include <string.h>

/* out = alpha * x (+ s), elementwise; t's dtype. */
static int axpb(opjit_ctx *ctx, int index, const DLTensor *x, double alpha, const DLTensor *s)
{
    int64_t i, n = opjit_numel(x);
    int is64 = opjit_is_dtype(x, kDLFloat, 64);
    DLTensor *o = opjit_output(ctx, index, x->dtype, x->ndim, x->shape);
    if (!o)
        return -1;
    for (i = 0; i < n; i++) {
        double v = is64 ? ((const double *)opjit_data(x))[i] : ((const float *)opjit_data(x))[i];
        double b = !s ? 0 : is64 ? ((const double *)opjit_data(s))[i]
                                 : ((const float *)opjit_data(s))[i];
        if (is64)
            ((double *)o->data)[i] = alpha * v + b;
        else
            ((float *)o->data)[i] = (float)(alpha * v + b);
    }
    return 0;
}

/* self and shift agree in shape and dtype. */
static int scale_check(opjit_ctx *ctx, const DLTensor *x, const DLTensor *s, const char *what)
{
    if (!s)
        return 0;
    if (s->ndim != x->ndim || memcmp(s->shape, x->shape, (size_t)x->ndim * sizeof(int64_t)))
        return opjit_fail(ctx, "%s must have the shape of self", what);
    if (s->dtype.bits != x->dtype.bits)
        return opjit_fail(ctx, "%s must have the dtype of self", what);
    return 0;
}

static int scale_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0), *s = opjit_arg_tensor(a, 2);
    if (scale_check(ctx, x, s, "shift"))
        return -1;
    return axpb(ctx, 0, x, opjit_arg_float(a, 1), s);
}

static int scale_shape(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    if (scale_check(ctx, x, a->n > 2 ? opjit_arg_tensor(a, 2) : NULL, "shift"))
        return -1;
    return opjit_output_shape(ctx, 0, x->dtype, x->ndim, x->shape);
}

/* (alpha * grad, grad), or [0] where output_mask says 0, and for no shift. */
static int scale_backward_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *g = opjit_arg_tensor(a, 0), *s = opjit_arg_tensor(a, 2);
    const int64_t *mask = opjit_arg_ints(a, 3);
    int64_t zero = 0;
    if (mask[0] ? axpb(ctx, 0, g, opjit_arg_float(a, 1), NULL)
                : !opjit_output(ctx, 0, g->dtype, 1, &zero))
        return -1;
    if (mask[1] && s)
        return axpb(ctx, 1, g, 1.0, NULL);
    return opjit_output(ctx, 1, g->dtype, 1, &zero) ? 0 : -1;
}

static int scale_backward_shape(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *g = opjit_arg_tensor(a, 0), *s = opjit_arg_tensor(a, 2);
    const int64_t *mask = opjit_arg_ints(a, 3);
    int64_t zero = 0;
    int rc = mask[0] ? opjit_output_shape(ctx, 0, g->dtype, g->ndim, g->shape)
                     : opjit_output_shape(ctx, 0, g->dtype, 1, &zero);
    if (rc)
        return rc;
    return mask[1] && s ? opjit_output_shape(ctx, 1, g->dtype, g->ndim, g->shape)
                        : opjit_output_shape(ctx, 1, g->dtype, 1, &zero);
}

OPJIT_MODULE(scale, m)
{
    opjit_def(m, "scale(Tensor self, float alpha=1.0, Tensor? shift=None) -> Tensor", OPJIT_CPU,
              scale_cpu, "alpha * self + shift");
    opjit_require(m, "self", "float32|float64 contiguous");
    opjit_require(m, "shift", "float32|float64 contiguous");
    opjit_def(m, "scale_backward(Tensor grad, float alpha, Tensor? shift, int[2] output_mask) -> "
              "(Tensor grad_self, Tensor grad_shift)", OPJIT_CPU, scale_backward_cpu,
              "the gradients of scale");
    opjit_require(m, "grad", "float32|float64 contiguous");
    opjit_def(m, "scale_nograd(Tensor self, float alpha=1.0) -> Tensor", OPJIT_CPU, scale_cpu,
              "scale without a gradient");
    opjit_require(m, "self", "float32|float64 contiguous");
    opjit_derivative(m, "scale", "scale_backward", "self, shift");
    opjit_shape(m, "scale", scale_shape);
    opjit_shape(m, "scale_backward", scale_backward_shape);
    opjit_shape(m, "scale_nograd", scale_shape);
}
