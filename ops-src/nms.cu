/*
 * nms.cu - non-maximum suppression on CUDA, the twin of nms.c (same schema,
 * same result bit for bit: torchvision.ops.nms semantics).
 *
 *   nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor
 *
 * boxes [N, 4] (x1, y1, x2, y2) and scores [N] on one CUDA device, of one
 * dtype: float32, float64, or float16/bfloat16 (widened to float32 on the
 * device first, so the IoU is computed in float32, as torchvision's CUDA
 * kernel does for half). Returns the int64 indices of the kept boxes, in
 * decreasing score order, on the same device.
 *
 * Steps (torchvision's CUDA algorithm, with the sort and the final reduce
 * on the device; the host only launches and reads the count):
 *   1. order: nms_keys makes nms.c's sort keys on the device (descending
 *      score, NaN first, -0.0 == 0.0) paired with their indices, padded to
 *      a power of two; a bitonic sort of (key, index) pairs orders them.
 *      Comparing the index too makes equal scores keep their input order:
 *      the stable sort of nms.c, without a stable algorithm. Stages whose
 *      partners lie within 2048 elements run in shared memory
 *      (nms_sort_local), the wider ones over global memory (nms_sort_wide);
 *   2. nms_gather: boxes gathered in sorted order with their areas;
 *   3. nms_mask: a 2-D grid of 64-thread blocks over pairs of 64-box tiles,
 *      upper triangle only; the column tile sits in shared memory and each
 *      thread writes one 64-bit word: which boxes of the tile its box
 *      overlaps with IoU > threshold;
 *   4. nms_reduce: one block walks the boxes in order, keeping a box unless
 *      an earlier kept one suppressed it, and ORs the kept box's mask row
 *      into a "removed" bit set held in shared memory (global memory past
 *      48 KiB); it writes the kept indices and their count;
 *   5. the count comes to the host (the call's one wait), the output is
 *      allocated and the kept indices copied into it on the device.
 * The IoU is computed as nms.c does, operation for operation, with
 * round-to-nearest intrinsics so no multiply-add is fused, and compared
 * with the threshold in double.
 */
#ifdef __CUDACC_RTC__
#include <cuda_fp16.h>
#include <cuda_bf16.h>

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

/* ---- 1. the order: keys, then a bitonic sort of (key, index) pairs ---------- */

#define NMS_SORT_CHUNK 2048 /* elements a block sorts in shared memory */

/* nms_common.h's nms_key: ascending key == descending score, NaN first. */
__device__ __forceinline__ unsigned long long nms_key_of(double s)
{
    if (s != s)
        return 0;
    if (s == 0)
        s = 0.0;
    unsigned long long u = (unsigned long long)__double_as_longlong(s);
    u = (u >> 63) ? ~u : (u | (1ULL << 63));
    return ~u;
}

/* keys[i], idx[i] for i < npad; the padding sorts after every real key. */
template <typename T>
__device__ __forceinline__ void nms_keys_body(int n, int npad, const T *__restrict__ scores,
                                              unsigned long long *__restrict__ keys,
                                              long long *__restrict__ idx)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= npad)
        return;
    keys[i] = i < n ? nms_key_of((double)scores[i]) : ~0ULL;
    idx[i] = i;
}

extern "C" __global__ void nms_keys_f32(int n, int npad, const float *scores,
                                        unsigned long long *keys, long long *idx)
{
    nms_keys_body<float>(n, npad, scores, keys, idx);
}

extern "C" __global__ void nms_keys_f64(int n, int npad, const double *scores,
                                        unsigned long long *keys, long long *idx)
{
    nms_keys_body<double>(n, npad, scores, keys, idx);
}

/* Order elements a < b (positions) for the stage (k, j) of element a. */
__device__ __forceinline__ void nms_sort_pair(unsigned long long *ka, long long *ia,
                                              unsigned long long *kb, long long *ib,
                                              bool ascending)
{
    bool greater = *ka > *kb || (*ka == *kb && *ia > *ib);
    if (greater == ascending) {
        unsigned long long tk = *ka;
        long long ti = *ia;
        *ka = *kb;
        *ia = *ib;
        *kb = tk;
        *ib = ti;
    }
}

/* One stage (k, j) with j >= NMS_SORT_CHUNK: a thread per pair. */
extern "C" __global__ void nms_sort_wide(int npad, int k, int j, unsigned long long *keys,
                                         long long *idx)
{
    int t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= npad / 2)
        return;
    int a = 2 * j * (t / j) + t % j, b = a + j;
    nms_sort_pair(&keys[a], &idx[a], &keys[b], &idx[b], (a & k) == 0);
}

/* Each block sorts one NMS_SORT_CHUNK slice in shared memory: every stage
 * k <= chunk when k == 0, else the stages (k, j) of one k for j < chunk.
 * NMS_SORT_CHUNK / 2 threads. */
extern "C" __global__ void __launch_bounds__(NMS_SORT_CHUNK / 2)
    nms_sort_local(int k, unsigned long long *keys, long long *idx)
{
    __shared__ unsigned long long sk[NMS_SORT_CHUNK];
    __shared__ long long si[NMS_SORT_CHUNK];
    const int base = blockIdx.x * NMS_SORT_CHUNK, t = threadIdx.x;
    sk[t] = keys[base + t];
    si[t] = idx[base + t];
    sk[t + NMS_SORT_CHUNK / 2] = keys[base + t + NMS_SORT_CHUNK / 2];
    si[t + NMS_SORT_CHUNK / 2] = idx[base + t + NMS_SORT_CHUNK / 2];
    __syncthreads();
    const int k0 = k ? k : 2, k1 = k ? k : NMS_SORT_CHUNK;
    for (int kk = k0; kk <= k1; kk <<= 1) {
        for (int j = min(kk, NMS_SORT_CHUNK) >> 1; j > 0; j >>= 1) {
            int a = 2 * j * (t / j) + t % j, b = a + j;
            nms_sort_pair(&sk[a], &si[a], &sk[b], &si[b], ((base + a) & kk) == 0);
            __syncthreads();
        }
    }
    keys[base + t] = sk[t];
    idx[base + t] = si[t];
    keys[base + t + NMS_SORT_CHUNK / 2] = sk[t + NMS_SORT_CHUNK / 2];
    idx[base + t + NMS_SORT_CHUNK / 2] = si[t + NMS_SORT_CHUNK / 2];
}

/* ---- 2. to 4. ---------------------------------------------------------------- */

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

/* One block of NMS_REDUCE_THREADS. removed: col_blocks words, in dynamic
 * shared memory, or removed_global when that is too big. Per 64-box tile
 * blk, in tile order:
 *   - the tile's diagonal mask words and indices come to shared memory (one
 *     load each, in parallel);
 *   - thread 0 decides the tile's boxes in order from removed[blk] and the
 *     diagonal words alone (on-chip: no global load in this serial part),
 *     writing keep[] and the tile's kept bits;
 *   - every thread ORs the kept boxes' mask rows into its later words of
 *     removed, the loads of one word independent of each other.
 * The same decisions as walking box by box: box i is kept unless a kept
 * box before it overlaps it. Finally thread 0 writes the count. */
#define NMS_REDUCE_THREADS 1024
extern "C" __global__ void __launch_bounds__(NMS_REDUCE_THREADS)
    nms_reduce(int n, int col_blocks, const unsigned long long *__restrict__ mask,
               const long long *__restrict__ order, unsigned long long *removed_global,
               long long *__restrict__ keep, long long *count)
{
    extern __shared__ unsigned long long removed_shared[];
    __shared__ unsigned long long diag[NMS_TPB], kept_bits;
    __shared__ long long tile_order[NMS_TPB], kept;
    unsigned long long *removed = removed_global ? removed_global : removed_shared;
    const int t = threadIdx.x;
    for (int j = t; j < col_blocks; j += blockDim.x)
        removed[j] = 0;
    if (t == 0)
        kept = 0;
    __syncthreads();
    for (int blk = 0; blk < col_blocks; blk++) {
        const int base = blk * NMS_TPB, lim = min(NMS_TPB, n - base);
        if (t < lim) {
            diag[t] = mask[(long long)(base + t) * col_blocks + blk];
            tile_order[t] = order[base + t];
        }
        __syncthreads();
        if (t == 0) {
            unsigned long long rv = removed[blk], kb = 0;
            long long nk = kept;
            for (int b = 0; b < lim; b++) {
                if (rv >> b & 1ULL)
                    continue;
                kb |= 1ULL << b;
                keep[nk++] = tile_order[b];
                rv |= diag[b]; /* the upper triangle: only later boxes of the tile */
            }
            kept_bits = kb;
            kept = nk;
        }
        __syncthreads();
        const unsigned long long kb = kept_bits;
        for (int j = blk + 1 + t; kb && j < col_blocks; j += blockDim.x) {
            unsigned long long acc = removed[j], bits = kb;
            const unsigned long long *col = mask + (long long)base * col_blocks + j;
            while (bits) { /* four loads in flight per round */
                unsigned long long v0, v1 = 0, v2 = 0, v3 = 0;
                v0 = col[(long long)(__ffsll((long long)bits) - 1) * col_blocks];
                bits &= bits - 1;
                if (bits) {
                    v1 = col[(long long)(__ffsll((long long)bits) - 1) * col_blocks];
                    bits &= bits - 1;
                }
                if (bits) {
                    v2 = col[(long long)(__ffsll((long long)bits) - 1) * col_blocks];
                    bits &= bits - 1;
                }
                if (bits) {
                    v3 = col[(long long)(__ffsll((long long)bits) - 1) * col_blocks];
                    bits &= bits - 1;
                }
                acc |= v0 | v1 | v2 | v3;
            }
            removed[j] = acc;
        }
        __syncthreads();
    }
    if (t == 0)
        *count = kept;
}

/* ---- float16 and bfloat16: widened to float32 first (exactly) ----------------- */

extern "C" __global__ void nms_widen_f16(int n, const unsigned short *src, float *dst)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = __half2float(__ushort_as_half(src[i]));
}

extern "C" __global__ void nms_widen_bf16(int n, const unsigned short *src, float *dst)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        dst[i] = __bfloat162float(__ushort_as_bfloat16(src[i]));
}

#else /* the host half, compiled by libtcc */

#include <opjit_op.h>
#include <string.h>

#include "nms_common.h"
#include "nms_decl.h"

#define NMS_TPB 64
#define NMS_SORT_CHUNK 2048 /* as in the device half */
#define NMS_MAX_COLS 65535 /* gridDim.y */
#define NMS_REDUCE_THREADS 1024 /* as in the device half */
#define NMS_SHARED_MAX (46 * 1024) /* with the kernel's static 1 KiB: within 48 KiB */

static size_t nmsc_align(size_t b) { return (b + 255) & ~(size_t)255; }

static int nmsc_launch(opjit_ctx *ctx, const char *kernel, unsigned blocks, unsigned threads,
                       unsigned shared, void **params)
{
    unsigned grid[3], block[3];
    grid[0] = blocks;
    grid[1] = grid[2] = 1;
    block[0] = threads;
    block[1] = block[2] = 1;
    return opjit_launch(ctx, kernel, grid, block, shared, params);
}

/* dst[0..n) = the float16 or bfloat16 values src[0..n) as float32. */
static int nmsc_widen(opjit_ctx *ctx, int elem, int n, void *src, void *dst)
{
    void *p[3];
    p[0] = &n;
    p[1] = &src;
    p[2] = &dst;
    return nmsc_launch(ctx, elem == NMS_F16 ? "nms_widen_f16" : "nms_widen_bf16",
                       (unsigned)((n + 255) / 256), 256, 0, p);
}

/* Step 1: order[0..n) (in idx) = the box indices by descending score, on
 * the device. keys and idx hold npad (a power of two >= NMS_SORT_CHUNK). */
static int nmsc_sort(opjit_ctx *ctx, int is64, int n32, int npad, void *scores, void *keys,
                     void *idx)
{
    void *p[5];
    int rc, k, j, zero = 0;
    p[0] = &n32;
    p[1] = &npad;
    p[2] = &scores;
    p[3] = &keys;
    p[4] = &idx;
    if ((rc = nmsc_launch(ctx, is64 ? "nms_keys_f64" : "nms_keys_f32",
                          (unsigned)((npad + 255) / 256), 256, 0, p)))
        return rc;
    p[0] = &zero;
    p[1] = &keys;
    p[2] = &idx;
    if ((rc = nmsc_launch(ctx, "nms_sort_local", (unsigned)(npad / NMS_SORT_CHUNK),
                          NMS_SORT_CHUNK / 2, 0, p)))
        return rc;
    for (k = 2 * NMS_SORT_CHUNK; k <= npad; k <<= 1) {
        for (j = k / 2; j >= NMS_SORT_CHUNK; j /= 2) {
            p[0] = &npad;
            p[1] = &k;
            p[2] = &j;
            p[3] = &keys;
            p[4] = &idx;
            if ((rc = nmsc_launch(ctx, "nms_sort_wide", (unsigned)((npad / 2 + 255) / 256), 256,
                                  0, p)))
                return rc;
        }
        p[0] = &k;
        p[1] = &keys;
        p[2] = &idx;
        if ((rc = nmsc_launch(ctx, "nms_sort_local", (unsigned)(npad / NMS_SORT_CHUNK),
                              NMS_SORT_CHUNK / 2, 0, p)))
            return rc;
    }
    return 0;
}

static int nms_cuda(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *boxes = opjit_arg_tensor(a, 0);
    DLTensor *scores = opjit_arg_tensor(a, 1);
    double thr = opjit_arg_float(a, 2);
    int is64, elem, n32, cols, npad, rc;
    int64_t n, shape[1];
    long long count = 0;
    size_t esz, mask_bytes;
    char *dws;
    void *d_keys, *d_order, *d_sorted, *d_mask, *d_keep, *d_count, *d_removed;
    void *d_boxes, *d_scores, *d_wide;
    unsigned grid[3], block[3], shared;
    DLTensor *out;

    if ((rc = nms_check(ctx, boxes, scores, &elem, &n)) != 0)
        return rc;
    is64 = elem == NMS_F64;
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
    for (npad = NMS_SORT_CHUNK; npad < n32; npad <<= 1)
        ;

    /* Device memory: sort keys, the order (sort indices), sorted boxes,
     * the mask, kept indices, count, and the removed set when it does not
     * fit in shared memory. */
    mask_bytes = (size_t)n * (size_t)cols * 8;
    shared = (unsigned)((size_t)cols * 8);
    if (shared > NMS_SHARED_MAX)
        shared = 0;
    dws = (char *)opjit_device_workspace(
        ctx, 2 * nmsc_align((size_t)npad * 8) + nmsc_align((size_t)n * 5 * esz) +
                 nmsc_align(mask_bytes) + nmsc_align((size_t)n * 8) + 256 +
                 (shared ? 0 : nmsc_align((size_t)cols * 8)) +
                 (elem >= NMS_F16 ? nmsc_align((size_t)n * 5 * sizeof(float)) : 0));
    if (!dws)
        return -1;
    d_keys = dws;
    d_order = dws + nmsc_align((size_t)npad * 8);
    d_sorted = (char *)d_order + nmsc_align((size_t)npad * 8);
    d_mask = (char *)d_sorted + nmsc_align((size_t)n * 5 * esz);
    d_keep = (char *)d_mask + nmsc_align(mask_bytes);
    d_count = (char *)d_keep + nmsc_align((size_t)n * 8);
    d_removed = shared ? NULL : (char *)d_count + 256;
    d_wide = (char *)d_count + 256 + (shared ? 0 : nmsc_align((size_t)cols * 8));

    /* 0. float16 and bfloat16 boxes and scores as float32: the IoU in
     * float32, as torchvision's CUDA kernel computes it for half. */
    d_boxes = opjit_data(boxes);
    d_scores = opjit_data(scores);
    if (elem >= NMS_F16) {
        if ((rc = nmsc_widen(ctx, elem, 4 * n32, d_boxes, d_wide)) ||
            (rc = nmsc_widen(ctx, elem, n32, d_scores, (float *)d_wide + 4 * n)))
            return rc;
        d_boxes = d_wide;
        d_scores = (float *)d_wide + 4 * n;
    }

    /* 1. The order. */
    if ((rc = nmsc_sort(ctx, is64, n32, npad, d_scores, d_keys, d_order)))
        return rc;
    if (thr != thr) {
        /* IoU > NaN is always false: every box is kept, in order. */
        shape[0] = n;
        out = opjit_output(ctx, 0, OPJIT_INT64, 1, shape);
        if (!out)
            return -1;
        return opjit_memcpy(ctx, opjit_data(out), d_order, (size_t)n * 8, OPJIT_COPY_DTOD);
    }

    /* 2. Gather. */
    {
        void *p[4];
        p[0] = &n32;
        p[1] = &d_boxes;
        p[2] = &d_order;
        p[3] = &d_sorted;
        if ((rc = nmsc_launch(ctx, is64 ? "nms_gather_f64" : "nms_gather_f32",
                              (unsigned)((n + 255) / 256), 256, 0, p)))
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
        if ((rc = nmsc_launch(ctx, "nms_reduce", 1, NMS_REDUCE_THREADS, shared, p)))
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

OPJIT_MODULE(m)
{
    opjit_def(m, "nms(Tensor boxes, Tensor scores, float iou_threshold) -> Tensor", OPJIT_CUDA,
              nms_cuda,
              "Non-maximum suppression (torchvision.ops.nms) on CUDA: 64-bit overlap masks "
              "over 64-box tiles, reduced on the device");
    opjit_require(m, "boxes", "floating rank=2 contiguous");
    opjit_require(m, "scores", "floating rank=1 contiguous");
    nms_declare(m);
}

#endif
