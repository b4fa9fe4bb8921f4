/*
 * ops-src/nms_common.h - what nms.c and the host half of nms.cu share, so
 * the CPU and CUDA kernels check their arguments and order boxes the same
 * way by construction: the sort key, the stable sort, the argument checks.
 *
 * A local header: the cache key of both sources includes it, so editing it
 * recompiles both.
 */
#ifndef NMS_COMMON_H
#define NMS_COMMON_H

#include <opjit_op.h>
#include <string.h>

/* Sort key: ascending key == torch's descending score order. NaN -> 0 (the
 * first), -0.0 -> the key of +0.0, otherwise the IEEE bits made monotone. */
static uint64_t nms_key(double s)
{
    uint64_t u;
    if (s != s)
        return 0;
    if (s == 0)
        s = 0.0;
    memcpy(&u, &s, sizeof u);
    u = (u >> 63) ? ~u : (u | ((uint64_t)1 << 63)); /* ascending in s */
    return ~u; /* descending in s; never 0 for a number */
}

/* Stable ascending sort of key[0..n) carrying idx[0..n), using tkey/tidx
 * (n each) as scratch. Insertion sort on runs of NMS_RUN, then bottom-up
 * merges ping-ponging between the two buffers. */
#define NMS_RUN 16
static void nms_sort(uint64_t *key, int64_t *idx, uint64_t *tkey,
                     int64_t *tidx, int64_t n)
{
    int64_t lo, i, j, width;
    uint64_t *ka = key, *kb = tkey, *kt;
    int64_t *ia = idx, *ib = tidx, *it;

    for (lo = 0; lo < n; lo += NMS_RUN) {
        int64_t hi = lo + NMS_RUN < n ? lo + NMS_RUN : n;
        for (i = lo + 1; i < hi; i++) {
            uint64_t k = key[i];
            int64_t v = idx[i];
            j = i;
            while (j > lo && key[j - 1] > k) { /* strict: stable */
                key[j] = key[j - 1];
                idx[j] = idx[j - 1];
                j--;
            }
            key[j] = k;
            idx[j] = v;
        }
    }
    for (width = NMS_RUN; width < n; width *= 2) {
        for (lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n;
            int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;
            const uint64_t *kl = ka + lo, *kle = ka + mid;
            const uint64_t *kr = ka + mid, *kre = ka + hi;
            const int64_t *il = ia + lo, *ir = ia + mid;
            uint64_t *ko = kb + lo;
            int64_t *io = ib + lo;
            while (kl < kle && kr < kre) {
                if (*kr < *kl) { /* take left on ties: stable */
                    *ko++ = *kr++;
                    *io++ = *ir++;
                } else {
                    *ko++ = *kl++;
                    *io++ = *il++;
                }
            }
            while (kl < kle) {
                *ko++ = *kl++;
                *io++ = *il++;
            }
            while (kr < kre) {
                *ko++ = *kr++;
                *io++ = *ir++;
            }
        }
        kt = ka; ka = kb; kb = kt;
        it = ia; ia = ib; ib = it;
    }
    if (ia != idx)
        memcpy(idx, ia, (size_t)n * sizeof *idx);
}

/* The element types nms takes: float32 and float64 compute in their own
 * type; float16 and bfloat16 are widened to float32 first (exactly), so
 * the IoU is computed in float32, as torchvision's CUDA kernel does. */
enum { NMS_F32, NMS_F64, NMS_F16, NMS_BF16 };

static const char *nms_dtype_name(const DLTensor *t)
{
    if (opjit_is_dtype(t, kDLFloat, 32))
        return "float32";
    if (opjit_is_dtype(t, kDLFloat, 64))
        return "float64";
    if (opjit_is_dtype(t, kDLFloat, 16))
        return "float16";
    if (opjit_is_dtype(t, kDLBfloat, 16))
        return "bfloat16";
    return "another dtype";
}

/* Check boxes [N, 4] and scores [N] of one float dtype. Returns 0 with
 * *elem (NMS_F32...) and *n set, or the status of opjit_fail. */
static int nms_check(opjit_ctx *ctx, const DLTensor *boxes, const DLTensor *scores,
                     int *elem, int64_t *n)
{
    *elem = NMS_F32;
    *n = 0;
    if (!boxes || !scores)
        return opjit_fail(ctx, "boxes and scores are required");
    if (boxes->ndim != 2 || boxes->shape[1] != 4)
        return opjit_fail(ctx, "boxes must have shape [N, 4] (x1, y1, x2, y2), "
                               "got a %dD tensor with %lld columns",
                          boxes->ndim,
                          (long long)(boxes->ndim >= 2 ? boxes->shape[1] : -1));
    if (scores->ndim != 1)
        return opjit_fail(ctx, "scores must be a 1D tensor [N], got %dD",
                          scores->ndim);
    if (opjit_is_dtype(boxes, kDLFloat, 64))
        *elem = NMS_F64;
    else if (opjit_is_dtype(boxes, kDLFloat, 16))
        *elem = NMS_F16;
    else if (opjit_is_dtype(boxes, kDLBfloat, 16))
        *elem = NMS_BF16;
    else if (!opjit_is_dtype(boxes, kDLFloat, 32))
        return opjit_fail(ctx, "boxes must be float32, float64, float16 or bfloat16");
    if (scores->dtype.code != boxes->dtype.code ||
        scores->dtype.bits != boxes->dtype.bits ||
        scores->dtype.lanes != boxes->dtype.lanes)
        return opjit_fail(ctx, "scores dtype (%s) must match boxes dtype (%s)",
                          nms_dtype_name(scores), nms_dtype_name(boxes));
    *n = boxes->shape[0];
    if (scores->shape[0] != *n)
        return opjit_fail(ctx, "boxes and scores must have the same number of "
                               "boxes, got boxes [%lld, 4] and scores [%lld]",
                          (long long)*n, (long long)scores->shape[0]);
    return 0;
}

#endif
