/* tests/t_ops.h - calling the small test ops of the loader tests. */
#ifndef OPJIT_TEST_T_OPS_H
#define OPJIT_TEST_T_OPS_H
#include "opjit.h"
#include "t.h"

/* Call op with no arguments; the value of its 1-element float32 output,
 * or -1 when the call failed (a failed check). */
static inline float t_call_f32(opjit_runtime *rt, const opjit_op *op)
{
    DLManagedTensor *out = NULL;
    int rc = opjit_call(rt, op, NULL, 0, &out, 1);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (rc)
        return -1;
    float v = ((float *)out->dl_tensor.data)[0];
    out->deleter(out);
    return v;
}
#endif
