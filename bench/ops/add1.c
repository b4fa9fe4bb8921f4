/*
 * bench/ops/add1.c - the trivial op bench/run times opjit_call with.
 *
 *   add1(Tensor self) -> Tensor         y = x + 1, float32
 *
 * Not shipped (it lives outside ops-src/). The kernel does what the direct
 * C baseline in bench/opjit_bench.c does: allocate one output of the
 * input's shape and write x + 1 into it, so the difference between the two
 * is what opjit_call adds (schema and requirement checks, binding, the
 * kernel and api-table indirections, the output bookkeeping).
 */
#include <opjit_op.h>

static int add1_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    DLTensor *y = opjit_output(ctx, 0, x->dtype, x->ndim, x->shape);
    if (!y)
        return -1;
    const float *xs = (const float *)opjit_data(x);
    float *ys = (float *)y->data;
    int64_t n = opjit_numel(x);
    for (int64_t i = 0; i < n; i++)
        ys[i] = xs[i] + 1.0f;
    return 0;
}

OPJIT_MODULE(m)
{
    opjit_def(m, "add1(Tensor self) -> Tensor", OPJIT_CPU, add1_cpu, "x + 1 (bench only)");
    opjit_require(m, "self", "float32 contiguous");
}
