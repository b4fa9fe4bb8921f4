/* sleep_ms(Tensor x, int ms) -> Tensor: sleeps, then returns int64[1]
 * holding ms. Shows that calls release the GIL. */
#include <opjit_op.h>
#include <time.h>

static int sleep_cpu(opjit_ctx *ctx, opjit_args *a)
{
    int64_t ms = opjit_arg_int(a, 1), one = 1;
    struct timespec ts;
    ts.tv_sec = (time_t)(ms / 1000);
    ts.tv_nsec = (long)(ms % 1000) * 1000000L;
    while (nanosleep(&ts, &ts) != 0)
        ;
    DLTensor *y = opjit_output(ctx, 0, OPJIT_INT64, 1, &one);
    if (!y)
        return -1;
    *(int64_t *)y->data = ms;
    return 0;
}

OPJIT_MODULE(sleep_ms, m)
{
    opjit_def(m, "sleep_ms(Tensor x, int ms) -> Tensor", OPJIT_CPU, sleep_cpu, "sleep");
}
