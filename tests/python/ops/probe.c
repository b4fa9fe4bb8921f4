/* probe(Tensor x) -> Tensor: where the data is, as the kernel sees it.
 * Output int64[2]: the address of x's first element (data + byte_offset)
 * and the address of the output's own data. Proves zero-copy from Python. */
#include <opjit_op.h>

static int probe_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    int64_t two = 2;
    DLTensor *y = opjit_output(ctx, 0, OPJIT_INT64, 1, &two);
    if (!y)
        return -1;
    int64_t *out = y->data;
    out[0] = (int64_t)(uintptr_t)opjit_data(x);
    out[1] = (int64_t)(uintptr_t)y->data;
    return 0;
}

OPJIT_MODULE(probe, m)
{
    opjit_def(m, "probe(Tensor x) -> Tensor", OPJIT_CPU, probe_cpu, "data addresses");
}
