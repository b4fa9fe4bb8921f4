/* fill(Tensor(a!) self, float value) -> Tensor: writes value into every
 * element of self (float32, contiguous) in place, as its schema says;
 * returns int64[1] holding the element count. Proves the kernel writes the
 * caller's memory. */
#include <opjit_op.h>

static int fill_cpu(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    float v = (float)opjit_arg_float(a, 1);
    float *p = opjit_data(x);
    int64_t n = opjit_numel(x), one = 1;
    for (int64_t i = 0; i < n; i++)
        p[i] = v;
    DLTensor *y = opjit_output(ctx, 0, OPJIT_INT64, 1, &one);
    if (!y)
        return -1;
    *(int64_t *)y->data = n;
    return 0;
}

static int fill_shape(opjit_ctx *ctx, opjit_args *a)
{
    int64_t one = 1;
    (void)a;
    return opjit_output_shape(ctx, 0, OPJIT_INT64, 1, &one);
}

OPJIT_MODULE(fill, m)
{
    opjit_def(m, "fill(Tensor(a!) self, float value) -> Tensor", OPJIT_CPU, fill_cpu, "in place");
    opjit_require(m, "self", "float32 contiguous");
    opjit_shape(m, "fill", fill_shape);
}
