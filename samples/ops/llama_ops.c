/*
 * samples/ops/llama_ops.c - a module of several ops, as a PyTorch extension
 * registers several with m.def: the float32 pieces of a transformer layer.
 *
 *   rmsnorm(Tensor x, Tensor weight, float eps=1e-6) -> Tensor
 *       y[i, j] = x[i, j] / sqrt(mean_j(x[i, :]^2) + eps) * weight[j]
 *   softmax(Tensor x) -> Tensor      over the last dimension
 *   matvec(Tensor a, Tensor x) -> Tensor     a (m, n) times x (n,)
 *
 * Each op is found by its own name (opjit call rmsnorm, opjit_load_op(rt,
 * "rmsnorm")) or qualified by the module, llama_ops::rmsnorm. Not shipped:
 * it lives outside ops-src/ (docs/writing-ops.md).
 */
#include <math.h>
#include <opjit_op.h>

/* The length of the last dimension and the number of rows before it. */
static void rows_cols(const DLTensor *x, int64_t *rows, int64_t *cols)
{
    *cols = x->ndim ? x->shape[x->ndim - 1] : 1;
    *rows = *cols ? opjit_numel(x) / *cols : 0;
}

static int rmsnorm_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0), *w = opjit_arg_tensor(a, 1);
    double eps = opjit_arg_float(a, 2);
    int64_t rows, cols;
    rows_cols(x, &rows, &cols);
    if (w->shape[0] != cols)
        return opjit_fail(ctx, "rmsnorm: weight has %lld elements, x rows %lld",
                          (long long)w->shape[0], (long long)cols);
    DLTensor *y = opjit_output(ctx, 0, x->dtype, x->ndim, x->shape);
    if (!y)
        return -1;
    const float *xs = (const float *)opjit_data(x), *ws = (const float *)opjit_data(w);
    float *ys = (float *)y->data;
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t c = 0; c < cols; c++)
            ss += (double)xs[r * cols + c] * xs[r * cols + c];
        float scale = (float)(1.0 / sqrt(ss / (double)(cols ? cols : 1) + eps));
        for (int64_t c = 0; c < cols; c++)
            ys[r * cols + c] = xs[r * cols + c] * scale * ws[c];
    }
    return 0;
}

static int softmax_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    int64_t rows, cols;
    rows_cols(x, &rows, &cols);
    DLTensor *y = opjit_output(ctx, 0, x->dtype, x->ndim, x->shape);
    if (!y)
        return -1;
    const float *xs = (const float *)opjit_data(x);
    float *ys = (float *)y->data;
    for (int64_t r = 0; r < rows; r++) {
        const float *in = xs + r * cols;
        float *out = ys + r * cols, mx = -INFINITY;
        double sum = 0;
        for (int64_t c = 0; c < cols; c++)
            mx = in[c] > mx ? in[c] : mx;
        for (int64_t c = 0; c < cols; c++)
            sum += out[c] = expf(in[c] - mx);
        for (int64_t c = 0; c < cols; c++)
            out[c] = (float)(out[c] / sum);
    }
    return 0;
}

static int matvec_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *m = opjit_arg_tensor(a, 0), *x = opjit_arg_tensor(a, 1);
    if (m->shape[1] != x->shape[0])
        return opjit_fail(ctx, "matvec: a is (%lld, %lld) but x has %lld elements",
                          (long long)m->shape[0], (long long)m->shape[1],
                          (long long)x->shape[0]);
    DLTensor *y = opjit_output(ctx, 0, x->dtype, 1, m->shape);
    if (!y)
        return -1;
    const float *ms = (const float *)opjit_data(m), *xs = (const float *)opjit_data(x);
    float *ys = (float *)y->data;
    for (int64_t i = 0; i < m->shape[0]; i++) {
        double acc = 0;
        for (int64_t j = 0; j < m->shape[1]; j++)
            acc += (double)ms[i * m->shape[1] + j] * xs[j];
        ys[i] = (float)acc;
    }
    return 0;
}

OPJIT_MODULE(m)
{
    opjit_def(m, "rmsnorm(Tensor x, Tensor weight, float eps=1e-6) -> Tensor", OPJIT_CPU,
              rmsnorm_cpu, "RMS normalization over the last dimension, times weight");
    opjit_require(m, "x", "float32 contiguous");
    opjit_require(m, "weight", "float32 rank=1 contiguous");
    opjit_def(m, "softmax(Tensor x) -> Tensor", OPJIT_CPU, softmax_cpu,
              "softmax over the last dimension");
    opjit_require(m, "x", "float32 contiguous");
    opjit_def(m, "matvec(Tensor a, Tensor x) -> Tensor", OPJIT_CPU, matvec_cpu,
              "matrix (m, n) times vector (n,)");
    opjit_require(m, "a", "float32 rank=2 contiguous");
    opjit_require(m, "x", "float32 rank=1 contiguous");
}
