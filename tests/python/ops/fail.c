/* fail(Tensor x, int code) -> Tensor: fails through opjit_fail when code
 * is not 0, else returns a copy of x's first element count as int64[1]. */
#include <opjit_op.h>

static int fail_cpu(opjit_ctx *ctx, opjit_args *a)
{
    int64_t code = opjit_arg_int(a, 1), one = 1;
    if (code)
        return opjit_fail(ctx, "asked to fail with code %lld", (long long)code);
    DLTensor *y = opjit_output(ctx, 0, OPJIT_INT64, 1, &one);
    if (!y)
        return -1;
    *(int64_t *)y->data = opjit_numel(opjit_arg_tensor(a, 0));
    return 0;
}

OPJIT_MODULE(fail, m)
{
    opjit_def(m, "fail(Tensor x, int code) -> Tensor", OPJIT_CPU, fail_cpu, "fails on request");
}
