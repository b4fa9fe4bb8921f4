/*
 * conv2d.c - 2-D convolution on the CPU, torch.nn.functional.conv2d
 * semantics for NCHW float32 and float64.
 *
 *   conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1,
 *          int[2] padding=0, int[2] dilation=1, int groups=1) -> Tensor
 *
 * input [N, C, H, W] (or unbatched [C, H, W], as PyTorch allows), weight
 * [O, C/groups, kH, kW], bias [O]; the output is [N, O, Ho, Wo] (or
 * [O, Ho, Wo]) with Ho = (H + 2*padH - dilH*(kH-1) - 1) / strideH + 1.
 *
 * Method (Caffe's): for each image and group, unfold the input patches into
 * a [C/groups * kH * kW, Ho * Wo] column matrix in workspace memory
 * (im2col) and multiply by the group's weights [O/groups, C/groups*kH*kW]
 * with one GEMM straight into the output. A 1x1 kernel with stride 1 and
 * no padding needs no unfolding: the GEMM reads the input directly. The
 * bias is added afterwards.
 */
#ifndef FORCE_OPENBLAS_COMPLEX_STRUCT
#define FORCE_OPENBLAS_COMPLEX_STRUCT
#endif
#include <opjit_op.h>
#include <cblas.h>
#include <limits.h>
#include <string.h>

typedef struct conv_geom {
    int64_t n, c, h, w;      /* input */
    int64_t o, kh, kw;       /* weight */
    int64_t sh, sw, ph, pw, dh, dw, groups;
    int64_t ho, wo;          /* output */
    int64_t cg, og;          /* channels per group in and out */
} conv_geom;

/* Smallest q >= 0 with q * s >= num (s > 0). */
static int64_t conv_ceil_div(int64_t num, int64_t s)
{
    return num <= 0 ? 0 : (num + s - 1) / s;
}

/* im2col for one scalar type: im is [cg, H, W] of one image and group; col
 * receives [cg * kh * kw, ho * wo]. Each output row is a run of zeros, a
 * copy (strided when the stride is not 1) and a run of zeros; the bounds of
 * the valid run are computed once per kernel column, so nothing reads
 * outside im. */
#define CONV_DEFINE(T, SUF)                                                   \
    static void conv_im2col_##SUF(const conv_geom *g, const T *im, T *col)    \
    {                                                                         \
        int64_t c, ki, kj, oh, ow;                                            \
        const int64_t H = g->h, W = g->w, ho = g->ho, wo = g->wo;             \
        const int64_t sh = g->sh, sw = g->sw;                                 \
        for (c = 0; c < g->cg; c++) {                                         \
            const T *plane = im + c * H * W;                                  \
            for (ki = 0; ki < g->kh; ki++) {                                  \
                int64_t ih0 = ki * g->dh - g->ph; /* ih = oh*sh + ih0 */      \
                for (kj = 0; kj < g->kw; kj++) {                              \
                    int64_t iw0 = kj * g->dw - g->pw; /* iw = ow*sw + iw0 */  \
                    int64_t lo = conv_ceil_div(-iw0, sw);                     \
                    int64_t hi = conv_ceil_div(W - iw0, sw);                  \
                    if (hi > wo)                                              \
                        hi = wo;                                              \
                    if (lo > hi)                                              \
                        lo = hi;                                              \
                    for (oh = 0; oh < ho; oh++, col += wo) {                  \
                        int64_t ih = oh * sh + ih0;                           \
                        const T *src;                                         \
                        T *dst;                                               \
                        if (ih < 0 || ih >= H || lo == hi) {                  \
                            memset(col, 0, (size_t)wo * sizeof(T));           \
                            continue;                                         \
                        }                                                     \
                        if (lo > 0)                                           \
                            memset(col, 0, (size_t)lo * sizeof(T));           \
                        src = plane + ih * W + (lo * sw + iw0);               \
                        if (sw == 1) {                                        \
                            memcpy(col + lo, src, (size_t)(hi - lo) * sizeof(T)); \
                        } else {                                              \
                            dst = col + lo;                                   \
                            for (ow = lo; ow < hi; ow++, src += sw)           \
                                *dst++ = *src;                                \
                        }                                                     \
                        if (hi < wo)                                          \
                            memset(col + hi, 0, (size_t)(wo - hi) * sizeof(T)); \
                    }                                                         \
                }                                                             \
            }                                                                 \
        }                                                                     \
    }                                                                         \
                                                                              \
    static void conv_add_bias_##SUF(const conv_geom *g, T *out, const T *bias) \
    {                                                                         \
        int64_t n, o, e, plane = g->ho * g->wo;                               \
        for (n = 0; n < g->n; n++) {                                          \
            for (o = 0; o < g->o; o++) {                                      \
                T b = bias[o], *p = out + (n * g->o + o) * plane;             \
                for (e = 0; e < plane; e++)                                   \
                    p[e] += b;                                                \
            }                                                                 \
        }                                                                     \
    }

CONV_DEFINE(float, f32)
CONV_DEFINE(double, f64)

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

/* Read an int[2] argument into v[0], v[1]; a single value applies to both. */
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

/* Largest stride, padding or dilation accepted: keeps every size product
 * below 2^63. */
#define CONV_MAX_PARAM ((int64_t)1 << 30)

static int conv2d_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *input = opjit_arg_tensor(a, 0);
    DLTensor *weight = opjit_arg_tensor(a, 1);
    DLTensor *bias = opjit_arg_tensor(a, 2);
    int64_t stride[2], pad[2], dil[2], shape[4], num_h, num_w, kdim, plane;
    int64_t n, grp;
    conv_geom g;
    DLTensor *out;
    int is64, batched, direct;
    size_t esz;
    void *col = NULL;
    char *outp;
    const char *inp, *wp;

    if (!input || !weight)
        return opjit_fail(ctx, "input and weight are required");
    if (input->ndim != 4 && input->ndim != 3)
        return opjit_fail(ctx, "input must be 4D [N, C, H, W] or 3D "
                               "[C, H, W], got %dD", input->ndim);
    if (weight->ndim != 4)
        return opjit_fail(ctx, "weight must be 4D [O, C/groups, kH, kW], "
                               "got %dD", weight->ndim);
    is64 = opjit_is_dtype(input, kDLFloat, 64);
    if (!is64 && !opjit_is_dtype(input, kDLFloat, 32))
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

    batched = input->ndim == 4;
    memset(&g, 0, sizeof g);
    g.n = batched ? input->shape[0] : 1;
    g.c = input->shape[batched ? 1 : 0];
    g.h = input->shape[batched ? 2 : 1];
    g.w = input->shape[batched ? 3 : 2];
    g.o = weight->shape[0];
    g.kh = weight->shape[2];
    g.kw = weight->shape[3];
    g.sh = stride[0]; g.sw = stride[1];
    g.ph = pad[0]; g.pw = pad[1];
    g.dh = dil[0]; g.dw = dil[1];
    g.groups = grp;

    if (g.o < 1)
        return opjit_fail(ctx, "weight must have at least one output channel, "
                               "got weight [%lld, %lld, %lld, %lld]",
                          (long long)weight->shape[0], (long long)weight->shape[1],
                          (long long)weight->shape[2], (long long)weight->shape[3]);
    if (weight->shape[1] > CONV_MAX_PARAM)
        return opjit_fail(ctx, "weight has too many input channels (%lld)",
                          (long long)weight->shape[1]);
    if (g.o % grp != 0)
        return opjit_fail(ctx, "weight has %lld output channels, not divisible "
                               "by groups=%lld", (long long)g.o, (long long)grp);
    if (weight->shape[1] * grp != g.c)
        return opjit_fail(ctx, "weight [%lld, %lld, %lld, %lld] with groups=%lld "
                               "expects input with %lld channels, got %lld",
                          (long long)weight->shape[0], (long long)weight->shape[1],
                          (long long)weight->shape[2], (long long)weight->shape[3],
                          (long long)grp, (long long)(weight->shape[1] * grp),
                          (long long)g.c);
    if (g.kh < 1 || g.kw < 1)
        return opjit_fail(ctx, "weight kernel size must be positive, got %lldx%lld",
                          (long long)g.kh, (long long)g.kw);
    if (bias && (bias->ndim != 1 || bias->shape[0] != g.o))
        return opjit_fail(ctx, "bias must be 1D with %lld elements (one per "
                               "output channel), got %dD with %lld",
                          (long long)g.o, bias->ndim,
                          (long long)(bias->ndim >= 1 ? bias->shape[0] : 0));
    if (g.h > CONV_MAX_PARAM || g.w > CONV_MAX_PARAM || g.kh > CONV_MAX_PARAM ||
        g.kw > CONV_MAX_PARAM)
        return opjit_fail(ctx, "spatial sizes must be at most %lld",
                          (long long)CONV_MAX_PARAM);

    num_h = g.h + 2 * g.ph - g.dh * (g.kh - 1) - 1;
    num_w = g.w + 2 * g.pw - g.dw * (g.kw - 1) - 1;
    if (num_h < 0 || num_w < 0)
        return opjit_fail(ctx, "padded input %lldx%lld is smaller than the "
                               "dilated kernel %lldx%lld",
                          (long long)(g.h + 2 * g.ph), (long long)(g.w + 2 * g.pw),
                          (long long)(g.dh * (g.kh - 1) + 1),
                          (long long)(g.dw * (g.kw - 1) + 1));
    g.ho = num_h / g.sh + 1;
    g.wo = num_w / g.sw + 1;
    g.cg = g.c / grp;
    g.og = g.o / grp;

    kdim = g.cg * g.kh * g.kw;
    plane = g.ho * g.wo;
    if (plane > INT_MAX || kdim > INT_MAX || g.og > INT_MAX ||
        g.h * g.w > INT_MAX)
        return opjit_fail(ctx, "sizes too large for BLAS (output plane %lld, "
                               "patch size %lld)", (long long)plane, (long long)kdim);

    if (batched) {
        shape[0] = g.n; shape[1] = g.o; shape[2] = g.ho; shape[3] = g.wo;
        out = opjit_output(ctx, 0, input->dtype, 4, shape);
    } else {
        shape[0] = g.o; shape[1] = g.ho; shape[2] = g.wo;
        out = opjit_output(ctx, 0, input->dtype, 3, shape);
    }
    if (!out)
        return -1;
    if (g.n == 0)
        return 0;
    esz = is64 ? sizeof(double) : sizeof(float);
    outp = (char *)opjit_data(out);

    if (kdim == 0) { /* no input channels: the output is the bias, or 0 */
        memset(outp, 0, (size_t)(g.n * g.o * plane) * esz);
    } else {
        direct = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 &&
                 g.pw == 0;
        if (!direct) {
            if ((uint64_t)kdim * (uint64_t)plane > ((uint64_t)1 << 60) / esz)
                return opjit_fail(ctx, "im2col buffer too large");
            col = opjit_workspace(ctx, (size_t)(kdim * plane) * esz);
            if (!col)
                return opjit_fail(ctx, "out of memory for a %lldx%lld im2col "
                                       "buffer", (long long)kdim, (long long)plane);
        }
        inp = (const char *)opjit_data(input);
        wp = (const char *)opjit_data(weight);
        for (n = 0; n < g.n; n++) {
            int64_t gi;
            for (gi = 0; gi < grp; gi++) {
                const char *im = inp + (size_t)((n * g.c + gi * g.cg) * g.h * g.w) * esz;
                const char *wg = wp + (size_t)(gi * g.og * kdim) * esz;
                char *og = outp + (size_t)((n * g.o + gi * g.og) * plane) * esz;
                const void *b = im;
                if (!direct) {
                    if (is64)
                        conv_im2col_f64(&g, (const double *)im, (double *)col);
                    else
                        conv_im2col_f32(&g, (const float *)im, (float *)col);
                    b = col;
                }
                if (is64)
                    cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g.og,
                                (int)plane, (int)kdim, 1.0, (const double *)wg,
                                (int)kdim, (const double *)b, (int)plane, 0.0,
                                (double *)og, (int)plane);
                else
                    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, (int)g.og,
                                (int)plane, (int)kdim, 1.0f, (const float *)wg,
                                (int)kdim, (const float *)b, (int)plane, 0.0f,
                                (float *)og, (int)plane);
            }
        }
    }
    if (bias) {
        if (is64)
            conv_add_bias_f64(&g, (double *)outp, (const double *)opjit_data(bias));
        else
            conv_add_bias_f32(&g, (float *)outp, (const float *)opjit_data(bias));
    }
    return 0;
}

OPJIT_MODULE(conv2d, m)
{
    opjit_def(m,
              "conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1, "
              "int[2] padding=0, int[2] dilation=1, int groups=1) -> Tensor",
              OPJIT_CPU, conv2d_cpu,
              "2-D convolution, NCHW (torch.nn.functional.conv2d): im2col + GEMM");
    opjit_require(m, "input", "float32|float64 contiguous");
    opjit_require(m, "weight", "float32|float64 rank=4 contiguous");
    opjit_require(m, "bias", "float32|float64 rank=1 contiguous");
}
