/*
 * bench/gpu_helper.c - the C side of bench/gpu_bench.py: loops of
 * opjit_call on CUDA tensors that torch allocated, so that the Python
 * process times opjit and torch side by side on the same stream, and the
 * per-call cost measured is opjit's, not ctypes'.
 *
 * Built by scripts/gpu-check as a shared object linked to libopjit.so:
 *   cc -O2 -shared -fPIC -I include -o gpu_helper.so bench/gpu_helper.c -L build -lopjit
 *
 * Each gb_* function runs `iters` calls; every output but the last is freed
 * at once (its deleter), the last is handed back in *last (NULL allowed:
 * freed too) for the caller to check. Returns the first failing status, or
 * OPJIT_OK; the message is opjit_errmsg(rt).
 */
#include <string.h>

#include "opjit.h"

static DLTensor cuda_tensor(void *data, int bits, int ndim, const int64_t *shape)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCUDA;
    t.device.device_id = 0;
    t.ndim = ndim;
    t.dtype.code = kDLFloat;
    t.dtype.bits = (uint8_t)bits;
    t.dtype.lanes = 1;
    t.shape = (int64_t *)shape;
    return t;
}

static int loop(opjit_runtime *rt, const opjit_op *op, const opjit_value *v, int nargs, int iters,
                DLManagedTensor **last)
{
    DLManagedTensor *out = NULL;
    if (last)
        *last = NULL;
    for (int i = 0; i < iters; i++) {
        int rc = opjit_call(rt, op, v, nargs, &out, 1);
        if (rc)
            return rc;
        if (i + 1 < iters || !last)
            out->deleter(out);
        else
            *last = out;
    }
    return OPJIT_OK;
}

int gb_nms(opjit_runtime *rt, const opjit_op *op, void *boxes, void *scores, int64_t n, int bits,
           double iou, int iters, DLManagedTensor **last)
{
    int64_t bs[2] = {n, 4}, ss[1] = {n};
    DLTensor b = cuda_tensor(boxes, bits, 2, bs), s = cuda_tensor(scores, bits, 1, ss);
    opjit_value v[3] = {opjit_tensor(&b), opjit_tensor(&s), opjit_float(iou)};
    return loop(rt, op, v, 3, iters, last);
}

int gb_mm(opjit_runtime *rt, const opjit_op *op, void *a, void *b, int64_t n, int64_t k, int64_t m,
          int bits, int iters, DLManagedTensor **last)
{
    int64_t as[2] = {n, k}, bs[2] = {k, m};
    DLTensor ta = cuda_tensor(a, bits, 2, as), tb = cuda_tensor(b, bits, 2, bs);
    opjit_value v[2] = {opjit_tensor(&ta), opjit_tensor(&tb)};
    return loop(rt, op, v, 2, iters, last);
}

/* geom: N C H W, O kH kW, stride h w, padding h w, dilation h w, groups. */
int gb_conv(opjit_runtime *rt, const opjit_op *op, void *x, void *w, void *bias,
            const int64_t geom[14], int bits, int iters, DLManagedTensor **last)
{
    int64_t xs[4] = {geom[0], geom[1], geom[2], geom[3]};
    int64_t ws[4] = {geom[4], geom[1] / geom[13], geom[5], geom[6]};
    int64_t bs[1] = {geom[4]};
    DLTensor tx = cuda_tensor(x, bits, 4, xs), tw = cuda_tensor(w, bits, 4, ws),
             tb = cuda_tensor(bias, bits, 1, bs);
    opjit_value v[7] = {opjit_tensor(&tx),      opjit_tensor(&tw),
                        bias ? opjit_tensor(&tb) : opjit_none(),
                        opjit_ints(geom + 7, 2), opjit_ints(geom + 9, 2),
                        opjit_ints(geom + 11, 2), opjit_int(geom[13])};
    return loop(rt, op, v, 7, iters, last);
}
