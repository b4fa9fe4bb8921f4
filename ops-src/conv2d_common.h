/*
 * ops-src/conv2d_common.h - what conv2d.c and the host half of conv2d.cu
 * share: the geometry of one call and the checks that produce it, so both
 * accept and refuse the same calls with the same messages. A local header:
 * both sources' cache keys include it.
 */
#ifndef CONV2D_COMMON_H
#define CONV2D_COMMON_H

#include <opjit_op.h>
#include <string.h>

typedef struct conv_geom {
    int64_t n, c, h, w;      /* input */
    int64_t o, kh, kw;       /* weight */
    int64_t sh, sw, ph, pw, dh, dw, groups;
    int64_t ho, wo;          /* output */
    int64_t cg, og;          /* channels per group in and out */
    int is64;                /* float64, else float32 */
    int batched;             /* input [N, C, H, W], else [C, H, W] */
} conv_geom;

/* Largest stride, padding, dilation, group count or spatial size accepted:
 * keeps every size product below 2^63. */
#define CONV_MAX_PARAM ((int64_t)1 << 30)

static const char *conv_dtype_name(const DLTensor *t)
{
    if (opjit_is_dtype(t, kDLFloat, 32))
        return "float32";
    if (opjit_is_dtype(t, kDLFloat, 64))
        return "float64";
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

/* Check the arguments of conv2d(input, weight, bias, stride, padding,
 * dilation, groups) as F.conv2d does and fill g. Returns 0, or the status
 * of opjit_fail. */
static int conv_check(opjit_ctx *ctx, opjit_args *a, const DLTensor *input,
                      const DLTensor *weight, const DLTensor *bias, conv_geom *g)
{
    int64_t stride[2], pad[2], dil[2], grp, num_h, num_w;

    memset(g, 0, sizeof *g);
    if (!input || !weight)
        return opjit_fail(ctx, "input and weight are required");
    if (input->ndim != 4 && input->ndim != 3)
        return opjit_fail(ctx, "input must be 4D [N, C, H, W] or 3D "
                               "[C, H, W], got %dD", input->ndim);
    if (weight->ndim != 4)
        return opjit_fail(ctx, "weight must be 4D [O, C/groups, kH, kW], "
                               "got %dD", weight->ndim);
    g->is64 = opjit_is_dtype(input, kDLFloat, 64);
    if (!g->is64 && !opjit_is_dtype(input, kDLFloat, 32))
        return opjit_fail(ctx, "input must be float32 or float64");
    if (!conv_same_dtype(weight, input))
        return opjit_fail(ctx, "weight dtype (%s) must match input dtype (%s)",
                          conv_dtype_name(weight), conv_dtype_name(input));
    if (bias && !conv_same_dtype(bias, input))
        return opjit_fail(ctx, "bias dtype (%s) must match input dtype (%s)",
                          conv_dtype_name(bias), conv_dtype_name(input));
    if (!conv_pair(a, 3, stride))
        return opjit_fail(ctx, "stride must be 2 integers");
    if (!conv_pair(a, 4, pad))
        return opjit_fail(ctx, "padding must be 2 integers");
    if (!conv_pair(a, 5, dil))
        return opjit_fail(ctx, "dilation must be 2 integers");
    grp = opjit_arg_int(a, 6);

    if (stride[0] < 1 || stride[1] < 1)
        return opjit_fail(ctx, "stride must be positive, got [%lld, %lld]",
                          (long long)stride[0], (long long)stride[1]);
    if (pad[0] < 0 || pad[1] < 0)
        return opjit_fail(ctx, "padding must be non-negative, got [%lld, %lld]",
                          (long long)pad[0], (long long)pad[1]);
    if (dil[0] < 1 || dil[1] < 1)
        return opjit_fail(ctx, "dilation must be positive, got [%lld, %lld]",
                          (long long)dil[0], (long long)dil[1]);
    if (stride[0] > CONV_MAX_PARAM || stride[1] > CONV_MAX_PARAM ||
        pad[0] > CONV_MAX_PARAM || pad[1] > CONV_MAX_PARAM ||
        dil[0] > CONV_MAX_PARAM || dil[1] > CONV_MAX_PARAM)
        return opjit_fail(ctx, "stride, padding and dilation must be at most %lld",
                          (long long)CONV_MAX_PARAM);
    if (grp < 1 || grp > CONV_MAX_PARAM)
        return opjit_fail(ctx, "groups must be between 1 and %lld, got %lld",
                          (long long)CONV_MAX_PARAM, (long long)grp);

    g->batched = input->ndim == 4;
    g->n = g->batched ? input->shape[0] : 1;
    g->c = input->shape[g->batched ? 1 : 0];
    g->h = input->shape[g->batched ? 2 : 1];
    g->w = input->shape[g->batched ? 3 : 2];
    g->o = weight->shape[0];
    g->kh = weight->shape[2];
    g->kw = weight->shape[3];
    g->sh = stride[0]; g->sw = stride[1];
    g->ph = pad[0]; g->pw = pad[1];
    g->dh = dil[0]; g->dw = dil[1];
    g->groups = grp;

    if (g->o < 1)
        return opjit_fail(ctx, "weight must have at least one output channel, "
                               "got weight [%lld, %lld, %lld, %lld]",
                          (long long)weight->shape[0], (long long)weight->shape[1],
                          (long long)weight->shape[2], (long long)weight->shape[3]);
    if (weight->shape[1] > CONV_MAX_PARAM)
        return opjit_fail(ctx, "weight has too many input channels (%lld)",
                          (long long)weight->shape[1]);
    if (g->o % grp != 0)
        return opjit_fail(ctx, "weight has %lld output channels, not divisible "
                               "by groups=%lld", (long long)g->o, (long long)grp);
    if (weight->shape[1] * grp != g->c)
        return opjit_fail(ctx, "weight [%lld, %lld, %lld, %lld] with groups=%lld "
                               "expects input with %lld channels, got %lld",
                          (long long)weight->shape[0], (long long)weight->shape[1],
                          (long long)weight->shape[2], (long long)weight->shape[3],
                          (long long)grp, (long long)(weight->shape[1] * grp),
                          (long long)g->c);
    if (g->kh < 1 || g->kw < 1)
        return opjit_fail(ctx, "weight kernel size must be positive, got %lldx%lld",
                          (long long)g->kh, (long long)g->kw);
    if (bias && (bias->ndim != 1 || bias->shape[0] != g->o))
        return opjit_fail(ctx, "bias must be 1D with %lld elements (one per "
                               "output channel), got %dD with %lld",
                          (long long)g->o, bias->ndim,
                          (long long)(bias->ndim >= 1 ? bias->shape[0] : 0));
    if (g->h > CONV_MAX_PARAM || g->w > CONV_MAX_PARAM || g->kh > CONV_MAX_PARAM ||
        g->kw > CONV_MAX_PARAM)
        return opjit_fail(ctx, "spatial sizes must be at most %lld",
                          (long long)CONV_MAX_PARAM);

    num_h = g->h + 2 * g->ph - g->dh * (g->kh - 1) - 1;
    num_w = g->w + 2 * g->pw - g->dw * (g->kw - 1) - 1;
    if (num_h < 0 || num_w < 0)
        return opjit_fail(ctx, "padded input %lldx%lld is smaller than the "
                               "dilated kernel %lldx%lld",
                          (long long)(g->h + 2 * g->ph), (long long)(g->w + 2 * g->pw),
                          (long long)(g->dh * (g->kh - 1) + 1),
                          (long long)(g->dw * (g->kw - 1) + 1));
    g->ho = num_h / g->sh + 1;
    g->wo = num_w / g->sw + 1;
    g->cg = g->c / grp;
    g->og = g->o / grp;
    return 0;
}

#endif
