/*
 * ops-src/conv2d_common.h - what conv2d.c and the host half of conv2d.cu
 * share: the geometry of one call and the checks that produce it, so both
 * accept and refuse the same calls with the same messages. A local header:
 * both sources' cache keys include it.
 */
#ifndef CONV2D_COMMON_H
#define CONV2D_COMMON_H

#include <opjit_op.h>
#include <stdio.h>
#include <string.h>

typedef struct conv_geom {
    int64_t n, c, h, w;      /* input */
    int64_t o, kh, kw;       /* weight */
    int64_t sh, sw, ph, pw, dh, dw, groups;
    int64_t ph2, pw2;        /* padding at the bottom and right (ph, pw: top, left) */
    int64_t ho, wo;          /* output */
    int64_t cg, og;          /* channels per group in and out */
    int is64;                /* float64, else float32 */
    int batched;             /* input [N, C, H, W], else [C, H, W] */
    int no_winograd;         /* direct sums only (16-bit inputs widened: Winograd's
                                error with mixed magnitudes is far above torch's) */
} conv_geom;

/* The schemas every conv2d source registers (CPU and CUDA alike): the
 * forward, its gradients, and the overloads with padding as a string, as
 * aten's conv2d.padding. */
#define CONV2D_SCHEMA                                                          \
    "conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, "  \
    "int[2] padding=0, int[2] dilation=1, int groups=1) -> Tensor"
#define CONV2D_PADDING_SCHEMA                                                  \
    "conv2d.padding(Tensor input, Tensor weight, Tensor? bias=None, "          \
    "int[2] stride=1, str padding=\"valid\", int[2] dilation=1, int groups=1) " \
    "-> Tensor"
#define CONV2D_BACKWARD_SCHEMA                                                 \
    "conv2d_backward(Tensor grad, Tensor input, Tensor weight, Tensor? bias=None, " \
    "int[2] stride=1, int[2] padding=0, int[2] dilation=1, int groups=1, "     \
    "int[3] output_mask=1) -> (Tensor grad_input, Tensor grad_weight, Tensor grad_bias)"
#define CONV2D_BACKWARD_PADDING_SCHEMA                                         \
    "conv2d_backward.padding(Tensor grad, Tensor input, Tensor weight, "       \
    "Tensor? bias=None, int[2] stride=1, str padding=\"valid\", int[2] dilation=1, " \
    "int groups=1, int[3] output_mask=1) -> (Tensor grad_input, Tensor grad_weight, " \
    "Tensor grad_bias)"

/* Largest stride, padding, dilation, group count or spatial size accepted:
 * keeps every size product below 2^63. */
#define CONV_MAX_PARAM ((int64_t)1 << 30)

static const char *conv_dtype_name(const DLTensor *t)
{
    if (opjit_is_dtype(t, kDLFloat, 32))
        return "float";
    if (opjit_is_dtype(t, kDLFloat, 64))
        return "double";
    if (opjit_is_dtype(t, kDLFloat, 16))
        return "c10::Half"; /* torch's names in this message */
    if (opjit_is_dtype(t, kDLBfloat, 16))
        return "c10::BFloat16";
    return "another dtype";
}

static int conv_same_dtype(const DLTensor *a, const DLTensor *b)
{
    return a->dtype.code == b->dtype.code && a->dtype.bits == b->dtype.bits &&
           a->dtype.lanes == b->dtype.lanes;
}

/* An int[2] argument; one value means both. */
static int conv_pair(opjit_args *a, int i, int64_t v[2])
{
    const int64_t *p = opjit_arg_ints(a, i);
    int len = opjit_arg_len(a, i);
    if (!p || len < 1 || len > 2)
        return 0;
    v[0] = p[0];
    v[1] = len == 2 ? p[1] : p[0];
    return 1;
}

/* stride, padding, dilation and groups as a call gives them. */
typedef struct conv_args {
    int64_t stride[2], pad[2], dil[2], groups;
    int same; /* padding="same": the padding follows from the kernel */
} conv_args;

/* Read stride, padding, dilation, groups from arguments first .. first+3;
 * padding an int[2], or (str_padding) a str, "valid" or "same", as
 * F.conv2d takes it. Returns 0, or the status of opjit_fail. */
static int conv_read_args(opjit_ctx *ctx, opjit_args *a, int first, int str_padding,
                          conv_args *p)
{
    memset(p, 0, sizeof *p);
    if (!conv_pair(a, first, p->stride))
        return opjit_fail(ctx, "stride must be 2 integers");
    if (str_padding) {
        const char *s = opjit_arg_str(a, first + 1);
        if (!s || (strcmp(s, "valid") && strcmp(s, "same")))
            return opjit_fail(ctx, "Invalid padding string: '%s'", s ? s : "None");
        p->same = !strcmp(s, "same");
    } else if (!conv_pair(a, first + 1, p->pad)) {
        return opjit_fail(ctx, "padding must be 2 integers");
    }
    if (!conv_pair(a, first + 2, p->dil))
        return opjit_fail(ctx, "dilation must be 2 integers");
    p->groups = opjit_arg_int(a, first + 3);
    if (p->stride[0] < 1 || p->stride[1] < 1)
        return opjit_fail(ctx, "non-positive stride is not supported");
    if (p->pad[0] < 0 || p->pad[1] < 0)
        return opjit_fail(ctx, "negative padding is not supported");
    if (p->dil[0] < 1 || p->dil[1] < 1)
        return opjit_fail(ctx, "dilation should be greater than zero, but got [%lld, %lld]",
                          (long long)p->dil[0], (long long)p->dil[1]);
    if (p->groups < 1)
        return opjit_fail(ctx, "non-positive groups is not supported");
    if (p->same && (p->stride[0] != 1 || p->stride[1] != 1))
        return opjit_fail(ctx, "padding='same' is not supported for strided convolutions");
    if (p->stride[0] > CONV_MAX_PARAM || p->stride[1] > CONV_MAX_PARAM ||
        p->pad[0] > CONV_MAX_PARAM || p->pad[1] > CONV_MAX_PARAM ||
        p->dil[0] > CONV_MAX_PARAM || p->dil[1] > CONV_MAX_PARAM ||
        p->groups > CONV_MAX_PARAM)
        return opjit_fail(ctx, "stride, padding, dilation and groups must be at most %lld",
                          (long long)CONV_MAX_PARAM);
    return 0;
}

/* The sizes of input, weight and bias into g, checked as F.conv2d checks
 * them (its messages). Returns 0, or the status of opjit_fail. */
static int conv_check_tensors(opjit_ctx *ctx, const DLTensor *input, const DLTensor *weight,
                              const DLTensor *bias, int64_t grp, conv_geom *g)
{
    const int64_t *ws = weight->shape;
    if (input->ndim != 4 && input->ndim != 3)
        return opjit_fail(ctx, "Expected 3D (unbatched) or 4D (batched) input to conv2d, but "
                               "got input of %dD", input->ndim);
    if (weight->ndim != 4)
        return opjit_fail(ctx, "weight must be 4D [O, C/groups, kH, kW], got %dD", weight->ndim);
    g->is64 = opjit_is_dtype(input, kDLFloat, 64);
    if (!g->is64 && !opjit_is_dtype(input, kDLFloat, 32) && !opjit_is_dtype(input, kDLFloat, 16) &&
        !opjit_is_dtype(input, kDLBfloat, 16))
        return opjit_fail(ctx, "input must be float32, float64, float16 or bfloat16");
    if (!conv_same_dtype(weight, input))
        return opjit_fail(ctx, "Input type (%s) and weight type (%s) should be the same",
                          conv_dtype_name(input), conv_dtype_name(weight));
    if (bias && !conv_same_dtype(bias, input))
        return opjit_fail(ctx, "Input type (%s) and bias type (%s) should be the same",
                          conv_dtype_name(input), conv_dtype_name(bias));
    g->batched = input->ndim == 4;
    g->n = g->batched ? input->shape[0] : 1;
    g->c = input->shape[g->batched ? 1 : 0];
    g->h = input->shape[g->batched ? 2 : 1];
    g->w = input->shape[g->batched ? 3 : 2];
    g->o = ws[0];
    g->kh = ws[2];
    g->kw = ws[3];
    g->groups = grp;
    if (g->o < 1 || g->o % grp != 0)
        return opjit_fail(ctx, "Given groups=%lld, expected weight to be %s %lld at dimension "
                               "0, but got weight of size [%lld, %lld, %lld, %lld] instead",
                          (long long)grp, g->o < 1 ? "at least" : "divisible by",
                          (long long)(g->o < 1 ? 1 : grp), (long long)ws[0], (long long)ws[1],
                          (long long)ws[2], (long long)ws[3]);
    if (ws[1] > CONV_MAX_PARAM || ws[1] * grp != g->c)
        return opjit_fail(ctx, "Given groups=%lld, weight of size [%lld, %lld, %lld, %lld], "
                               "expected input with %lld channels, but got %lld channels "
                               "instead",
                          (long long)grp, (long long)ws[0], (long long)ws[1], (long long)ws[2],
                          (long long)ws[3], (long long)(ws[1] * grp), (long long)g->c);
    if (g->kh < 1 || g->kw < 1)
        return opjit_fail(ctx, "kernel size should be greater than zero, but got kernel_height: "
                               "%lld kernel_width: %lld", (long long)g->kh, (long long)g->kw);
    if (bias && (bias->ndim != 1 || bias->shape[0] != g->o))
        return opjit_fail(ctx, "Given weight of size [%lld, %lld, %lld, %lld], expected bias to "
                               "be 1-dimensional with %lld elements, but got bias of %dD with "
                               "%lld elements instead",
                          (long long)ws[0], (long long)ws[1], (long long)ws[2],
                          (long long)ws[3], (long long)g->o, bias->ndim,
                          (long long)(bias->ndim >= 1 ? bias->shape[0] : 0));
    if (g->h > CONV_MAX_PARAM || g->w > CONV_MAX_PARAM || g->kh > CONV_MAX_PARAM ||
        g->kw > CONV_MAX_PARAM)
        return opjit_fail(ctx, "spatial sizes must be at most %lld", (long long)CONV_MAX_PARAM);
    return 0;
}

/* Check a convolution as F.conv2d does and fill g: the tensors, then the
 * padding (from the kernel for padding="same": total dil * (k - 1), the
 * odd one at the bottom or right, as torch pads) and the output size.
 * Returns 0, or the status of opjit_fail. */
static int conv_check(opjit_ctx *ctx, const DLTensor *input, const DLTensor *weight,
                      const DLTensor *bias, const conv_args *p, conv_geom *g)
{
    int64_t num_h, num_w;
    int rc;
    memset(g, 0, sizeof *g);
    if (!input || !weight)
        return opjit_fail(ctx, "input and weight are required");
    if ((rc = conv_check_tensors(ctx, input, weight, bias, p->groups, g)) != 0)
        return rc;
    g->sh = p->stride[0];
    g->sw = p->stride[1];
    g->dh = p->dil[0];
    g->dw = p->dil[1];
    g->ph = g->ph2 = p->pad[0];
    g->pw = g->pw2 = p->pad[1];
    if (p->same) {
        g->ph = g->dh * (g->kh - 1) / 2;
        g->ph2 = g->dh * (g->kh - 1) - g->ph;
        g->pw = g->dw * (g->kw - 1) / 2;
        g->pw2 = g->dw * (g->kw - 1) - g->pw;
    }
    if ((g->h == 0 || g->w == 0) && g->n > 0 && g->c > 0)
        return opjit_fail(ctx, "Only zero batch or zero channel inputs are supported, but got "
                               "input of spatial size %lldx%lld",
                          (long long)g->h, (long long)g->w);
    num_h = g->h + g->ph + g->ph2 - g->dh * (g->kh - 1) - 1;
    num_w = g->w + g->pw + g->pw2 - g->dw * (g->kw - 1) - 1;
    if (num_h < 0 || num_w < 0)
        return opjit_fail(ctx, "Calculated padded input size per channel: (%lld x %lld). "
                               "Kernel size: (%lld x %lld). Kernel size can't be greater than "
                               "actual input size",
                          (long long)(g->h + g->ph + g->ph2), (long long)(g->w + g->pw + g->pw2),
                          (long long)(g->dh * (g->kh - 1) + 1),
                          (long long)(g->dw * (g->kw - 1) + 1));
    g->ho = num_h / g->sh + 1;
    g->wo = num_w / g->sw + 1;
    g->cg = g->c / g->groups;
    g->og = g->o / g->groups;
    return 0;
}

/* "[2, 3, 4]" into buf (at most 8 sizes, then "..."). */
static void conv_shape_text(const int64_t *shape, int nd, char *buf, size_t len)
{
    size_t n = 0;
    int i;
    buf[0] = '\0';
    for (i = 0; i < nd && i < 8 && n < len; i++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", i ? ", " : "[", (long long)shape[i]);
    if (n < len)
        snprintf(buf + n, len - n, "%s", nd == 0 ? "[]" : nd > 8 ? ", ...]" : "]");
}

/* The incoming gradient of a convolution: the output's shape ([N, O, Ho,
 * Wo], or [O, Ho, Wo] unbatched) and the input's dtype; want[i] from
 * output_mask (argument mask_arg). Returns 0, or the status of opjit_fail. */
static int conv_check_grad(opjit_ctx *ctx, opjit_args *a, int mask_arg, const DLTensor *grad,
                           const DLTensor *input, const conv_geom *g, int want[3])
{
    const int64_t *mask = opjit_arg_ints(a, mask_arg);
    int64_t want_shape[4] = {g->n, g->o, g->ho, g->wo};
    const int64_t *ws = g->batched ? want_shape : want_shape + 1;
    int nd = g->batched ? 4 : 3, i, ok;
    if (!grad)
        return opjit_fail(ctx, "grad is required");
    if (!conv_same_dtype(grad, input))
        return opjit_fail(ctx, "Input type (%s) and grad type (%s) should be the same",
                          conv_dtype_name(input), conv_dtype_name(grad));
    ok = grad->ndim == nd;
    for (i = 0; ok && i < nd; i++)
        ok = grad->shape[i] == ws[i];
    if (!ok) {
        char want_s[128], got_s[128];
        conv_shape_text(ws, nd, want_s, sizeof want_s);
        conv_shape_text(grad->shape, grad->ndim, got_s, sizeof got_s);
        return opjit_fail(ctx, "grad must have the shape of the convolution's output, %s, "
                               "but got %s", want_s, got_s);
    }
    if (!mask || opjit_arg_len(a, mask_arg) != 3)
        return opjit_fail(ctx, "output_mask must be 3 integers");
    for (i = 0; i < 3; i++)
        want[i] = mask[i] != 0;
    return 0;
}

#endif
