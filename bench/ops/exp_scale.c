/*
 * bench/ops/exp_scale.c - exp_scale(Tensor x, float s) -> Tensor: exp(x) * s
 * on float32, element by element. Not a shipped op: the small op with
 * <math.h> that most op authors write first, whose cold load the bench
 * times (libtcc spends more on <math.h> than on such an op's code; opjit
 * starts it from the build's preprocessed <opjit_op.h> and <math.h>).
 */
#include <opjit_op.h>
#include <math.h>

static int exp_scale_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    float s = (float)opjit_arg_float(a, 1);
    DLTensor *y = opjit_output(ctx, 0, OPJIT_FLOAT32, x->ndim, x->shape);
    if (!y)
        return -1;
    const float *px = opjit_data(x);
    float *py = opjit_data(y);
    for (int64_t i = 0, n = opjit_numel(x); i < n; i++)
        py[i] = expf(px[i]) * s;
    return 0;
}

OPJIT_MODULE(exp_scale, m)
{
    opjit_def(m, "exp_scale(Tensor x, float s) -> Tensor", OPJIT_CPU, exp_scale_cpu, "");
    opjit_require(m, "x", "float32 contiguous");
}
