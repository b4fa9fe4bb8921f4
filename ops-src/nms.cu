/*
 * nms.cu - non-maximum suppression on CUDA, the twin of nms.c (same schema,
 * same result bit for bit: torchvision.ops.nms semantics).
 *
 *   nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor
 *
 * boxes [N, 4] (x1, y1, x2, y2) and scores [N] on one CUDA device, both
 * float32 or both float64. Returns the int64 indices of the kept boxes, in
 * decreasing score order, on the same device.
 *
 * Steps (torchvision's CUDA algorithm, with the final reduce on the device):
 *   1. order: the scores are copied to the host and sorted there (a stable
 *      descending sort with nms.c's keys: NaN first, -0.0 == 0.0), and the
 *      order is copied back: N is at most a few hundred thousand, so the
 *      copy costs less than a device sort would take to write here;
 *   2. nms_gather: boxes gathered in sorted order with their areas;
 *   3. nms_mask: a 2-D grid of 64-thread blocks over pairs of 64-box tiles,
 *      upper triangle only; the column tile sits in shared memory and each
 *      thread writes one 64-bit word: which boxes of the tile its box
 *      overlaps with IoU > threshold;
 *   4. nms_reduce: one block walks the boxes in order, keeping a box unless
 *      an earlier kept one suppressed it, and ORs the kept box's mask row
 *      into a "removed" bit set held in shared memory (global memory past
 *      48 KiB); it writes the kept indices and their count;
 *   5. the count comes to the host, the output is allocated and the kept
 *      indices copied into it on the device.
 * The IoU is computed as nms.c does, operation for operation, with
 * round-to-nearest intrinsics so no multiply-add is fused, and compared
 * with the threshold in double.
 */
#ifdef __CUDACC_RTC__

#define NMS_TPB 64 /* threads per mask block = bits per mask word */

template <typename T> struct nms_arith;
template <> struct nms_arith<float> {
    static __device__ __forceinline__ float sub(float a, float b) { return __fsub_rn(a, b); }
    static __device__ __forceinline__ float add(float a, float b) { return __fadd_rn(a, b); }
    static __device__ __forceinline__ float mul(float a, float b) { return __fmul_rn(a, b); }
    static __device__ __forceinline__ float div(float a, float b) { return __fdiv_rn(a, b); }
};
template <> struct nms_arith<double> {
    static __device__ __forceinline__ double sub(double a, double b) { return __dsub_rn(a, b); }
    static __device__ __forceinline__ double add(double a, double b) { return __dadd_rn(a, b); }
    static __device__ __forceinline__ double mul(double a, double b) { return __dmul_rn(a, b); }
    static __device__ __forceinline__ double div(double a, double b) { return __ddiv_rn(a, b); }
};

/* sorted[5 * i ..] = x1, y1, x2, y2, area of box order[i]. */
template <typename T>
__device__ __forceinline__ void nms_gather_body(int n, const T *__restrict__ boxes,
                                                const long long *__restrict__ order,
                                                T *__restrict__ sorted)
{
    typedef nms_arith<T> A;
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const T *b = boxes + 4 * order[i];
    T x1 = b[0], y1 = b[1], x2 = b[2], y2 = b[3];
    T *o = sorted + 5 * (long long)i;
    o[0] = x1;
    o[1] = y1;
    o[2] = x2;
    o[3] = y2;
    o[4] = A::mul(A::sub(x2, x1), A::sub(y2, y1));
}

/* IoU(a, b) > thr; a is the earlier box (nms.c's i), b the later (j). */
template <typename T>
__device__ __forceinline__ bool nms_iou_gt(const T *a, const T *b, double thr)
{
    typedef nms_arith<T> A;
    const T zero = 0;
    T xx1 = a[0] < b[0] ? b[0] : a[0];
    T xx2 = b[2] < a[2] ? b[2] : a[2];
    T w = A::sub(xx2, xx1);
    w = zero < w ? w : zero;
    T yy1 = a[1] < b[1] ? b[1] : a[1];
    T yy2 = b[3] < a[3] ? b[3] : a[3];
    T h = A::sub(yy2, yy1);
    h = zero < h ? h : zero;
    T inter = A::mul(w, h);
    T ovr = A::div(inter, A::sub(A::add(a[4], b[4]), inter));
    return (double)ovr > thr;
}

/* Block (col, row) of a col_blocks x col_blocks grid, row <= col: thread t
 * compares box row*64 + t with the boxes of tile col (in tile, shared) and
 * writes mask[box * col_blocks + col]. */
template <typename T>
__device__ __forceinline__ void nms_mask_body(int n, double thr, const T *__restrict__ sorted,
                                              unsigned long long *__restrict__ mask,
                                              int col_blocks, T *tile)
{
    const int row = blockIdx.y, col = blockIdx.x;
    if (row > col)
        return; /* the lower triangle is never read */
    const int row_size = min(n - row * NMS_TPB, NMS_TPB);
    const int col_size = min(n - col * NMS_TPB, NMS_TPB);
    const int t = threadIdx.x;
    if (t < col_size)
        for (int k = 0; k < 5; k++)
            tile[t * 5 + k] = sorted[(long long)(col * NMS_TPB + t) * 5 + k];
    __syncthreads();
    if (t < row_size) {
        const int cur = row * NMS_TPB + t;
        T me[5];
        for (int k = 0; k < 5; k++)
            me[k] = sorted[(long long)cur * 5 + k];
        unsigned long long bits = 0;
        for (int i = row == col ? t + 1 : 0; i < col_size; i++)
            if (nms_iou_gt<T>(me, tile + i * 5, thr))
                bits |= 1ULL << i;
        mask[(long long)cur * col_blocks + col] = bits;
    }
}

extern "C" __global__ void nms_gather_f32(int n, const float *boxes, const long long *order,
                                          float *sorted)
{
    nms_gather_body<float>(n, boxes, order, sorted);
}

extern "C" __global__ void nms_gather_f64(int n, const double *boxes, const long long *order,
                                          double *sorted)
{
    nms_gather_body<double>(n, boxes, order, sorted);
}

extern "C" __global__ void __launch_bounds__(NMS_TPB)
    nms_mask_f32(int n, double thr, const float *sorted, unsigned long long *mask, int col_blocks)
{
    __shared__ float tile[NMS_TPB * 5];
    nms_mask_body<float>(n, thr, sorted, mask, col_blocks, tile);
}

extern "C" __global__ void __launch_bounds__(NMS_TPB)
    nms_mask_f64(int n, double thr, const double *sorted, unsigned long long *mask,
                 int col_blocks)
{
    __shared__ double tile[NMS_TPB * 5];
    nms_mask_body<double>(n, thr, sorted, mask, col_blocks, tile);
}

/* One block. removed: col_blocks words, in dynamic shared memory, or
 * removed_global when that is too big. Every thread takes the same
 * decisions (they read the same words between barriers); thread 0 writes
 * the kept indices, keep[k] = order[i], and finally their count. */
extern "C" __global__ void nms_reduce(int n, int col_blocks,
                                      const unsigned long long *__restrict__ mask,
                                      const long long *__restrict__ order,
                                      unsigned long long *removed_global,
                                      long long *__restrict__ keep, long long *count)
{
    extern __shared__ unsigned long long removed_shared[];
    unsigned long long *removed = removed_global ? removed_global : removed_shared;
    const int t = threadIdx.x;
    for (int j = t; j < col_blocks; j += blockDim.x)
        removed[j] = 0;
    __syncthreads();
    long long nk = 0;
    for (int blk = 0; blk < col_blocks; blk++) {
        unsigned long long rv = removed[blk];
        __syncthreads(); /* everyone has read it before anyone adds to it */
        const int base = blk * NMS_TPB;
        const int lim = min(NMS_TPB, n - base);
        for (int b = 0; b < lim; b++) {
            if (rv >> b & 1ULL)
                continue;
            const int i = base + b;
            if (t == 0)
                keep[nk] = order[i];
            nk++;
            const unsigned long long *p = mask + (long long)i * col_blocks;
            for (int j = blk + t; j < col_blocks; j += blockDim.x)
                removed[j] |= p[j];
            __syncthreads();
            rv = removed[blk];
            __syncthreads();
        }
    }
    if (t == 0)
        *count = nk;
}

#else /* the host half, compiled by libtcc */

#include <opjit_op.h>
#include <string.h>

#include "nms_common.h"

#define NMS_TPB 64
#define NMS_MAX_COLS 65535 /* gridDim.y */
#define NMS_REDUCE_THREADS 256
#define NMS_SHARED_MAX (48 * 1024)

static size_t nmsc_align(size_t b) { return (b + 255) & ~(size_t)255; }

static int nms_cuda(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *boxes = opjit_arg_tensor(a, 0);
    DLTensor *scores = opjit_arg_tensor(a, 1);
    double thr = opjit_arg_float(a, 2);
    int is64, n32, cols, rc;
    int64_t n, i, shape[1];
    long long count = 0;
    size_t esz, mask_bytes;
    unsigned char *hws;
    uint64_t *key, *tkey;
    int64_t *order, *tidx;
    char *dws;
    void *d_order, *d_sorted, *d_mask, *d_keep, *d_count, *d_removed;
    void *d_boxes;
    unsigned grid[3], block[3], shared;
    DLTensor *out;

    if ((rc = nms_check(ctx, boxes, scores, &is64, &n)) != 0)
        return rc;
    if (n == 0) {
        shape[0] = 0;
        return opjit_output(ctx, 0, OPJIT_INT64, 1, shape) ? 0 : -1;
    }
    if (n > (int64_t)NMS_MAX_COLS * NMS_TPB)
        return opjit_fail(ctx, "nms: too many boxes for the CUDA kernel (%lld, at most %lld)",
                          (long long)n, (long long)NMS_MAX_COLS * NMS_TPB);
    n32 = (int)n;
    cols = (int)((n + NMS_TPB - 1) / NMS_TPB);
    esz = is64 ? sizeof(double) : sizeof(float);

    /* 1. The order, on the host. */
    hws = (unsigned char *)opjit_workspace(ctx, 4 * nmsc_align((size_t)n * 8) +
                                                    nmsc_align((size_t)n * esz));
    if (!hws)
        return opjit_fail(ctx, "nms: out of memory for %lld boxes", (long long)n);
    key = (uint64_t *)hws;
    tkey = (uint64_t *)(hws + nmsc_align((size_t)n * 8));
    order = (int64_t *)(hws + 2 * nmsc_align((size_t)n * 8));
    tidx = (int64_t *)(hws + 3 * nmsc_align((size_t)n * 8));
    if ((rc = opjit_memcpy(ctx, hws + 4 * nmsc_align((size_t)n * 8), opjit_data(scores),
                           (size_t)n * esz, OPJIT_COPY_DTOH)))
        return rc;
    if (is64) {
        const double *s = (const double *)(hws + 4 * nmsc_align((size_t)n * 8));
        for (i = 0; i < n; i++) {
            key[i] = nms_key(s[i]);
            order[i] = i;
        }
    } else {
        const float *s = (const float *)(hws + 4 * nmsc_align((size_t)n * 8));
        for (i = 0; i < n; i++) {
            key[i] = nms_key((double)s[i]);
            order[i] = i;
        }
    }
    nms_sort(key, order, tkey, tidx, n);

    if (thr != thr) {
        /* IoU > NaN is always false: every box is kept, in order. */
        shape[0] = n;
        out = opjit_output(ctx, 0, OPJIT_INT64, 1, shape);
        if (!out)
            return -1;
        return opjit_memcpy(ctx, opjit_data(out), order, (size_t)n * 8, OPJIT_COPY_HTOD);
    }

    /* Device memory: order, sorted boxes, the mask, kept indices, count,
     * and the removed set when it does not fit in shared memory. */
    mask_bytes = (size_t)n * (size_t)cols * 8;
    shared = (unsigned)((size_t)cols * 8);
    if (shared > NMS_SHARED_MAX)
        shared = 0;
    dws = (char *)opjit_device_workspace(
        ctx, nmsc_align((size_t)n * 8) + nmsc_align((size_t)n * 5 * esz) + nmsc_align(mask_bytes) +
                 nmsc_align((size_t)n * 8) + 256 + (shared ? 0 : nmsc_align((size_t)cols * 8)));
    if (!dws)
        return -1;
    d_order = dws;
    d_sorted = dws + nmsc_align((size_t)n * 8);
    d_mask = (char *)d_sorted + nmsc_align((size_t)n * 5 * esz);
    d_keep = (char *)d_mask + nmsc_align(mask_bytes);
    d_count = (char *)d_keep + nmsc_align((size_t)n * 8);
    d_removed = shared ? NULL : (char *)d_count + 256;
    if ((rc = opjit_memcpy(ctx, d_order, order, (size_t)n * 8, OPJIT_COPY_HTOD)))
        return rc;

    /* 2. Gather. */
    d_boxes = opjit_data(boxes);
    {
        void *p[4];
        p[0] = &n32;
        p[1] = &d_boxes;
        p[2] = &d_order;
        p[3] = &d_sorted;
        grid[0] = (unsigned)((n + 255) / 256);
        grid[1] = grid[2] = 1;
        block[0] = 256;
        block[1] = block[2] = 1;
        if ((rc = opjit_launch(ctx, is64 ? "nms_gather_f64" : "nms_gather_f32", grid, block, 0,
                               p)))
            return rc;
    }
    /* 3. The mask. */
    {
        void *p[5];
        p[0] = &n32;
        p[1] = &thr;
        p[2] = &d_sorted;
        p[3] = &d_mask;
        p[4] = &cols;
        grid[0] = (unsigned)cols;
        grid[1] = (unsigned)cols;
        grid[2] = 1;
        block[0] = NMS_TPB;
        block[1] = block[2] = 1;
        if ((rc = opjit_launch(ctx, is64 ? "nms_mask_f64" : "nms_mask_f32", grid, block, 0, p)))
            return rc;
    }
    /* 4. The reduce. */
    {
        void *p[7];
        p[0] = &n32;
        p[1] = &cols;
        p[2] = &d_mask;
        p[3] = &d_order;
        p[4] = &d_removed;
        p[5] = &d_keep;
        p[6] = &d_count;
        grid[0] = grid[1] = grid[2] = 1;
        block[0] = NMS_REDUCE_THREADS;
        block[1] = block[2] = 1;
        if ((rc = opjit_launch(ctx, "nms_reduce", grid, block, shared, p)))
            return rc;
    }
    /* 5. The output. */
    if ((rc = opjit_memcpy(ctx, &count, d_count, sizeof count, OPJIT_COPY_DTOH)))
        return rc;
    if (count < 0 || count > n)
        return opjit_fail(ctx, "nms: the device kernel returned a bad count (%lld)", count);
    shape[0] = count;
    out = opjit_output(ctx, 0, OPJIT_INT64, 1, shape);
    if (!out)
        return -1;
    return opjit_memcpy(ctx, opjit_data(out), d_keep, (size_t)count * 8, OPJIT_COPY_DTOD);
}

OPJIT_MODULE(nms_cuda, m)
{
    opjit_def(m, "nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor", OPJIT_CUDA,
              nms_cuda,
              "Non-maximum suppression (torchvision.ops.nms) on CUDA: 64-bit overlap masks "
              "over 64-box tiles, reduced on the device");
    opjit_require(m, "boxes", "float32|float64 rank=2 contiguous");
    opjit_require(m, "scores", "float32|float64 rank=1 contiguous");
}

#endif
