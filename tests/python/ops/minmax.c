/* minmax(Tensor x) -> (Tensor, Tensor): the smallest and the largest
 * element of a float32 tensor, each as float32[1]. Two outputs. */
#include <opjit_op.h>

static int minmax_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    const float *p = opjit_data(x);
    int64_t n = opjit_numel(x), one = 1;
    if (n == 0)
        return opjit_fail(ctx, "minmax of an empty tensor");
    float lo = p[0], hi = p[0];
    for (int64_t i = 1; i < n; i++) {
        lo = p[i] < lo ? p[i] : lo;
        hi = p[i] > hi ? p[i] : hi;
    }
    DLTensor *y0 = opjit_output(ctx, 0, OPJIT_FLOAT32, 1, &one);
    DLTensor *y1 = y0 ? opjit_output(ctx, 1, OPJIT_FLOAT32, 1, &one) : NULL;
    if (!y1)
        return -1;
    *(float *)y0->data = lo;
    *(float *)y1->data = hi;
    return 0;
}

OPJIT_MODULE(minmax, m)
{
    opjit_def(m, "minmax(Tensor x) -> (Tensor, Tensor)", OPJIT_CPU, minmax_cpu, "min and max");
    opjit_require(m, "x", "float32 contiguous");
}
