/* scalars(int i, float f, bool b, int[2] l, Tensor? t=None, int k=7)
 *   -> Tensor
 * Echoes its scalar arguments as float64[7]: i, f, b, l[0], l[1], whether
 * t was given, k. Shows how Python values reach a kernel. */
#include <opjit_op.h>

static int scalars_cpu(opjit_ctx *ctx, opjit_args *a)
{
    int64_t seven = 7;
    DLTensor *y = opjit_output(ctx, 0, OPJIT_FLOAT64, 1, &seven);
    if (!y)
        return -1;
    double *out = y->data;
    const int64_t *l = opjit_arg_ints(a, 3);
    out[0] = (double)opjit_arg_int(a, 0);
    out[1] = opjit_arg_float(a, 1);
    out[2] = opjit_arg_bool(a, 2);
    out[3] = (double)l[0];
    out[4] = (double)l[1];
    out[5] = opjit_arg_tensor(a, 4) != NULL;
    out[6] = (double)opjit_arg_int(a, 5);
    return 0;
}

OPJIT_MODULE(scalars, m)
{
    opjit_def(m, "scalars(int i, float f, bool b, int[2] l, Tensor? t=None, int k=7) -> Tensor",
              OPJIT_CPU, scalars_cpu, "echo");
}
