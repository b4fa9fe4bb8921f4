/*
 * ops-src/half_wide_cuda.h - float16 and bfloat16 through the float32
 * path of a .cu op (mm.cu, conv2d.cu): each 16-bit operand (any strides,
 * at most 4 dimensions) is widened, exactly, into a dense float32 copy in
 * device workspace; the float32 path runs (cuBLAS / cuDNN in float32, or
 * the op's own kernels); each output is rounded once, to nearest even, at
 * the end. Both halves of the file include it: the device kernels under
 * NVRTC, the launchers under libtcc. A local header: the cache keys of
 * the files that include it cover it.
 */
#ifndef OPS_HALF_WIDE_CUDA_H
#define OPS_HALF_WIDE_CUDA_H

#ifdef __CUDACC_RTC__

#include <cuda_bf16.h>
#include <cuda_fp16.h>

/* dst (dense, shape d) from src at element strides s. */
struct hw_dims {
    long long d[4], s[4];
};

__device__ __forceinline__ long long hw_at(const hw_dims &a, long long i)
{
    long long i3 = i % a.d[3], r = i / a.d[3], i2 = r % a.d[2], i1, i0;
    r /= a.d[2];
    i1 = r % a.d[1];
    i0 = r / a.d[1];
    return i0 * a.s[0] + i1 * a.s[1] + i2 * a.s[2] + i3 * a.s[3];
}

extern "C" __global__ void hw_widen_f16(long long total, hw_dims a, const unsigned short *src,
                                        float *dst)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = __half2float(__ushort_as_half(src[hw_at(a, i)]));
}

extern "C" __global__ void hw_widen_bf16(long long total, hw_dims a, const unsigned short *src,
                                         float *dst)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = __bfloat162float(__ushort_as_bfloat16(src[hw_at(a, i)]));
}

extern "C" __global__ void hw_narrow_f16(long long total, const float *src, unsigned short *dst)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = __half_as_ushort(__float2half_rn(src[i]));
}

extern "C" __global__ void hw_narrow_bf16(long long total, const float *src, unsigned short *dst)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x)
        dst[i] = __bfloat16_as_ushort(__float2bfloat16_rn(src[i]));
}

#else /* the host half */

#include <opjit_op.h>

enum { HWC_F16 = 1, HWC_BF16 = 2 };

/* Same layout as the device's struct hw_dims. */
typedef struct hwc_dims {
    long long d[4], s[4];
} hwc_dims;

/* HWC_F16, HWC_BF16, or 0 for any other dtype. */
static int hwc_kind(DLDataType dt)
{
    if (dt.bits != 16 || dt.lanes != 1)
        return 0;
    return dt.code == kDLFloat ? HWC_F16 : dt.code == kDLBfloat ? HWC_BF16 : 0;
}

/* Blocks of 256 over total elements, at most 65535 * 16 of them (the
 * kernels loop over the rest). */
static int hwc_launch(opjit_ctx *ctx, const char *kernel, long long total, void **params)
{
    long long blocks = (total + 255) / 256;
    unsigned grid[3] = {1, 1, 1}, block[3] = {256, 1, 1};
    grid[0] = (unsigned)(blocks < 65535 * 16 ? blocks : 65535 * 16);
    return opjit_launch(ctx, kernel, grid, block, 0, params);
}

/* t (16-bit values of kind, any strides, at most 4 dimensions) widened
 * into a dense float32 copy in device workspace: *w is t's view of it
 * (t's shape, float32, NULL strides). 0, or -1 with the error recorded. */
static int hwc_widen(opjit_ctx *ctx, int kind, const DLTensor *t, DLTensor *w)
{
    hwc_dims a;
    long long total = 1;
    int k = 4 - t->ndim, i;
    void *src = opjit_data(t), *dst, *params[4];
    if (t->ndim > 4)
        return opjit_fail(ctx, "float16/bfloat16 tensors of more than 4 dimensions");
    for (i = 0; i < 4; i++) {
        a.d[i] = i < k ? 1 : t->shape[i - k];
        a.s[i] = i < k || !t->strides ? 0 : t->strides[i - k];
        total *= a.d[i];
    }
    for (i = 3; !t->strides && i >= k; i--) /* row-major strides */
        a.s[i] = i == 3 ? 1 : a.s[i + 1] * a.d[i + 1];
    if (!(dst = opjit_device_workspace(ctx, (size_t)(total > 0 ? total : 1) * sizeof(float))))
        return -1;
    *w = *t;
    w->data = dst;
    w->byte_offset = 0;
    w->dtype = opjit_dtype(kDLFloat, 32);
    w->strides = NULL;
    if (total == 0)
        return 0;
    params[0] = &total;
    params[1] = &a;
    params[2] = &src;
    params[3] = &dst;
    return hwc_launch(ctx, kind == HWC_F16 ? "hw_widen_f16" : "hw_widen_bf16", total, params);
}

/* n float32 values at src (device) rounded into dst (16-bit values of
 * kind). 0, or the status of the failure. */
static int hwc_narrow(opjit_ctx *ctx, int kind, const void *src, void *dst, int64_t n)
{
    long long total = (long long)n;
    void *s = (void *)src, *params[3];
    if (n <= 0)
        return 0;
    params[0] = &total;
    params[1] = &s;
    params[2] = &dst;
    return hwc_launch(ctx, kind == HWC_F16 ? "hw_narrow_f16" : "hw_narrow_bf16", total, params);
}

/* Float32 device workspace for n values (a valid pointer for n == 0);
 * NULL with the error recorded. */
static void *hwc_scratch(opjit_ctx *ctx, int64_t n)
{
    return opjit_device_workspace(ctx, (size_t)(n > 0 ? n : 1) * sizeof(float));
}

#endif
#endif
