/*
 * conv2d.cu - 2-D convolution and its gradients on CUDA through cuDNN, the
 * twin of conv2d.c (torch.nn.functional.conv2d semantics, NCHW float32,
 * float64, float16 and bfloat16). The same schemas:
 *
 *   conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1,
 *          groups=1) -> Tensor                  (and conv2d.padding, str)
 *   conv2d_backward(grad, input, weight, bias=None, stride, padding,
 *          dilation, groups, output_mask=1)
 *       -> (grad_input, grad_weight, grad_bias)  (and .padding)
 *
 * input [N, C, H, W] (or unbatched [C, H, W]), weight [O, C/groups, kH, kW],
 * bias [O]; output [N, O, Ho, Wo] (or [O, Ho, Wo]) on the input's device.
 *
 * cuDNN's graph API first (cudnn_graph.h), as PyTorch runs convolutions:
 * the forward, grad_input and grad_weight each an operation graph whose
 * execution plan is built at the first call of each shape, direction and
 * pointer alignment (cuDNN's heuristics' engines in their order, the
 * first that finalizes; no TF32 in float32 or float64, so results stay
 * close to the CPU twin) and kept for the process; a call then packs its
 * pointers and executes the plan. What the graph API cannot build or run
 * takes cuDNN's legacy API from then on, as does every call with
 * $OPJIT_CUDNN_GRAPH=0: tensor, filter and convolution descriptors made
 * per call (groups through cudnnSetConvolutionGroupCount), FMA math,
 * cudnnConvolutionForward, cudnnConvolutionBackwardData and
 * cudnnConvolutionBackwardFilter, each with the algorithm chosen by
 * measuring them (cudnnFind*, at the first call of each shape), or by
 * cuDNN's heuristic (cudnnGet*_v7) when $OPJIT_CUDNN_FIND=0 (measured on
 * an H100: the heuristic's forward picks ran up to 10x slower than
 * PyTorch's for small batches), and remembered per shape and direction.
 * (On an H100 the legacy path took at least 0.08 ms a call where torch's
 * took 0.03-0.04: the fixed cost the kept plans are for.)
 * Workspaces come from opjit_device_workspace. The bias is added by
 * a kernel of this file, and grad_bias is summed by one (a block per
 * output channel, in double, in a fixed order): it needs no cuDNN, so a
 * convolution without input channels runs without it too.
 *
 * Operands of any strides (channels_last, views, expand) are first
 * gathered into dense device workspace by conv2d_gather_* (a filter
 * descriptor cannot take strides). padding="same" with an even dilated
 * kernel pads one more at the bottom or right, which cuDNN cannot say: the
 * input is then gathered into a zero-padded copy (as torch does), and
 * grad_input is cut out of the padded one's gradient.
 *
 * float16 and bfloat16 go to cuDNN as they are, as torch sends them:
 * HALF / BFLOAT16 tensor and filter descriptors, FLOAT compute type,
 * CUDNN_TENSOR_OP_MATH (tensor cores, accumulation in float32), results
 * in the 16-bit dtype; the bias added by a kernel of this file in float32
 * (rounded once more, as torch's separate add), grad_bias summed in double
 * from the widened gradient. Operands that need a gather (strides,
 * "same" with an even kernel), or $OPJIT_CUDNN_HALF=wide, take the older
 * path instead: widened to float32 on the device (half_wide_cuda.h), the
 * float32 convolution, rounded once at the end; so does a call the
 * tensor-core path cannot run (a cuDNN error; bfloat16 before sm_80),
 * unless $OPJIT_CUDNN_HALF=tensor demands it (for the GPU checks).
 *
 * cuDNN is taken at the first call by dlsym (the runtime makes
 * libcudnn.so.9 global before loading .cu host code when it exists; else
 * this file dlopens it): the op loads and warms on machines without cuDNN,
 * and a call there fails with a message saying so. cuDNN handles are kept
 * per device for the life of the process, one per concurrent call.
 */
#ifdef __CUDACC_RTC__

#include "half_wide_cuda.h"

/* out[(n, o, e)] += bias[o]: the CPU twin's order of operations. */
template <typename T>
__device__ __forceinline__ void conv_bias_body(long long total, long long plane, int o,
                                               const T *__restrict__ bias, T *__restrict__ out,
                                               int fill)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int ch = (int)(i / plane % o);
        T b = bias ? bias[ch] : (T)0;
        out[i] = fill ? b : out[i] + b;
    }
}

extern "C" __global__ void conv2d_bias_f32(long long total, long long plane, int o,
                                           const float *bias, float *out, int fill)
{
    conv_bias_body<float>(total, plane, o, bias, out, fill);
}

extern "C" __global__ void conv2d_bias_f64(long long total, long long plane, int o,
                                           const double *bias, double *out, int fill)
{
    conv_bias_body<double>(total, plane, o, bias, out, fill);
}

/* A 4-D gather: dst [d0, d1, d2, d3] dense from src at element strides s,
 * zeros where an index reaches the source's extent e (a padded copy), a
 * cut when e is larger (a crop). */
struct conv_gather_args {
    long long d[4], e[4], s[4];
};

template <typename T>
__device__ __forceinline__ void conv_gather_body(long long total, conv_gather_args a,
                                                 const T *__restrict__ src, T *__restrict__ dst)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i, i3 = r % a.d[3], i2, i1, i0;
        r /= a.d[3];
        i2 = r % a.d[2];
        r /= a.d[2];
        i1 = r % a.d[1];
        i0 = r / a.d[1];
        dst[i] = i0 < a.e[0] && i1 < a.e[1] && i2 < a.e[2] && i3 < a.e[3]
                     ? src[i0 * a.s[0] + i1 * a.s[1] + i2 * a.s[2] + i3 * a.s[3]]
                     : (T)0;
    }
}

extern "C" __global__ void conv2d_gather_f32(long long total, conv_gather_args a,
                                             const float *src, float *dst)
{
    conv_gather_body<float>(total, a, src, dst);
}

extern "C" __global__ void conv2d_gather_f64(long long total, conv_gather_args a,
                                             const double *src, double *dst)
{
    conv_gather_body<double>(total, a, src, dst);
}

/* db[o] = the sum of dy[n, o, :] over n: one block of 256 threads a
 * channel, each summing a strided share in double, then a tree. */
template <typename T>
__device__ __forceinline__ void conv_grad_bias_body(long long n, int o, long long plane,
                                                    const T *__restrict__ dy, T *__restrict__ db)
{
    __shared__ double part[256];
    const int ch = blockIdx.x;
    double acc = 0;
    for (long long i = threadIdx.x; i < n * plane; i += blockDim.x)
        acc += (double)dy[(i / plane * o + ch) * plane + i % plane];
    part[threadIdx.x] = acc;
    __syncthreads();
    for (int h = 128; h > 0; h /= 2) {
        if (threadIdx.x < h)
            part[threadIdx.x] += part[threadIdx.x + h];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        db[ch] = (T)part[0];
}

extern "C" __global__ void __launch_bounds__(256)
    conv2d_grad_bias_f32(long long n, int o, long long plane, const float *dy, float *db)
{
    conv_grad_bias_body<float>(n, o, plane, dy, db);
}

extern "C" __global__ void __launch_bounds__(256)
    conv2d_grad_bias_f64(long long n, int o, long long plane, const double *dy, double *db)
{
    conv_grad_bias_body<double>(n, o, plane, dy, db);
}

/* out[(n, o, e)] = round(out + bias[o]) in float32, 16-bit values (bf:
 * bfloat16, else float16). */
extern "C" __global__ void conv2d_bias_h16(long long total, long long plane, int o,
                                           const unsigned short *bias, unsigned short *out,
                                           int bf)
{
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        unsigned short b = bias[(int)(i / plane % o)];
        if (bf)
            out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(
                __bfloat162float(__ushort_as_bfloat16(out[i])) +
                __bfloat162float(__ushort_as_bfloat16(b))));
        else
            out[i] = __half_as_ushort(__float2half_rn(__half2float(__ushort_as_half(out[i])) +
                                                      __half2float(__ushort_as_half(b))));
    }
}

#else /* the host half, compiled by libtcc */

#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <opjit_op.h>
#include <cudnn.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "conv2d_common.h"
#include "conv2d_decl.h"
#include "cuda_handles.h"
#include "cudnn_graph.h"
#include "half_wide_cuda.h"
#include "strided.h"

/* ---- cuDNN, resolved at the first call ------------------------------------ */

#define CONV_CUDNN_FUNCS(X)                                                    \
    X(cudnnGetErrorString) X(cudnnCreate) X(cudnnSetStream)                    \
    X(cudnnCreateTensorDescriptor) X(cudnnDestroyTensorDescriptor)             \
    X(cudnnSetTensor4dDescriptor) X(cudnnCreateFilterDescriptor)               \
    X(cudnnDestroyFilterDescriptor) X(cudnnSetFilter4dDescriptor)              \
    X(cudnnCreateConvolutionDescriptor) X(cudnnDestroyConvolutionDescriptor)   \
    X(cudnnSetConvolution2dDescriptor) X(cudnnSetConvolutionGroupCount)        \
    X(cudnnSetConvolutionMathType) X(cudnnGetConvolution2dForwardOutputDim)    \
    X(cudnnGetConvolutionForwardAlgorithm_v7)                                  \
    X(cudnnFindConvolutionForwardAlgorithm)                                    \
    X(cudnnGetConvolutionForwardWorkspaceSize) X(cudnnConvolutionForward)      \
    X(cudnnGetConvolutionBackwardDataAlgorithm_v7)                             \
    X(cudnnFindConvolutionBackwardDataAlgorithm)                               \
    X(cudnnGetConvolutionBackwardDataWorkspaceSize)                            \
    X(cudnnConvolutionBackwardData)                                            \
    X(cudnnGetConvolutionBackwardFilterAlgorithm_v7)                           \
    X(cudnnFindConvolutionBackwardFilterAlgorithm)                             \
    X(cudnnGetConvolutionBackwardFilterWorkspaceSize)                          \
    X(cudnnConvolutionBackwardFilter)                                          \
    X(cudnnBackendCreateDescriptor) X(cudnnBackendDestroyDescriptor)           \
    X(cudnnBackendSetAttribute) X(cudnnBackendGetAttribute)                    \
    X(cudnnBackendFinalize) X(cudnnBackendExecute)

static struct {
    int state; /* 0 not tried, 1 ready, -1 unavailable */
    char why[512];
#define CONV_FIELD(f) __typeof__(f) *f;
    CONV_CUDNN_FUNCS(CONV_FIELD)
#undef CONV_FIELD
} dnn;
static cg_api dnn_graph; /* the backend functions of dnn, for cudnn_graph.h */
static pthread_mutex_t dnn_lock = PTHREAD_MUTEX_INITIALIZER;

static int conv_cudnn_load(void)
{
    void *h = RTLD_DEFAULT, *p;
    pthread_mutex_lock(&dnn_lock);
    if (dnn.state) {
        pthread_mutex_unlock(&dnn_lock);
        return dnn.state;
    }
    if (!dlsym(RTLD_DEFAULT, "cudnnCreate")) {
        h = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_GLOBAL);
        if (!h) {
            const char *e = dlerror();
            strncpy(dnn.why, e ? e : "libcudnn.so.9 not found", sizeof dnn.why - 1);
            dnn.state = -1;
            pthread_mutex_unlock(&dnn_lock);
            return -1;
        }
    }
#define CONV_SYM(f)                                                            \
    p = dlsym(h, #f);                                                          \
    if (!p) {                                                                  \
        strncpy(dnn.why, "libcudnn lacks " #f " (cuDNN 8 or 9 needed)",        \
                sizeof dnn.why - 1);                                           \
        dnn.state = -1;                                                        \
        pthread_mutex_unlock(&dnn_lock);                                       \
        return -1;                                                             \
    }                                                                          \
    memcpy(&dnn.f, &p, sizeof p);
    CONV_CUDNN_FUNCS(CONV_SYM)
#undef CONV_SYM
    dnn_graph.create = dnn.cudnnBackendCreateDescriptor;
    dnn_graph.destroy = dnn.cudnnBackendDestroyDescriptor;
    dnn_graph.set = dnn.cudnnBackendSetAttribute;
    dnn_graph.get = dnn.cudnnBackendGetAttribute;
    dnn_graph.finalize = dnn.cudnnBackendFinalize;
    dnn_graph.execute = dnn.cudnnBackendExecute;
    dnn.state = 1;
    pthread_mutex_unlock(&dnn_lock);
    return 1;
}

/* Handles per device, one per call in flight (cuda_handles.h). */
static handle_pool conv_handles = HANDLE_POOL_INIT;

/* ---- algorithms, remembered per shape and direction ------------------------ */

#define CONV_MAX_ALGOS 16

typedef struct conv_key {
    int64_t v[20];
} conv_key;

#define CONV_CACHE 256
static struct {
    conv_key key;
    int algo;
    int used;
} conv_algos[CONV_CACHE];
static int conv_next_slot;

static int conv_algo_lookup(const conv_key *k, int *algo)
{
    int i, found = 0;
    pthread_mutex_lock(&dnn_lock);
    for (i = 0; i < CONV_CACHE && !found; i++)
        if (conv_algos[i].used && !memcmp(&conv_algos[i].key, k, sizeof *k)) {
            *algo = conv_algos[i].algo;
            found = 1;
        }
    pthread_mutex_unlock(&dnn_lock);
    return found;
}

static void conv_algo_store(const conv_key *k, int algo)
{
    pthread_mutex_lock(&dnn_lock);
    conv_algos[conv_next_slot].key = *k;
    conv_algos[conv_next_slot].algo = algo;
    conv_algos[conv_next_slot].used = 1;
    conv_next_slot = (conv_next_slot + 1) % CONV_CACHE;
    pthread_mutex_unlock(&dnn_lock);
}

/* ---- descriptors ---------------------------------------------------------------- */

/* One convolution as cuDNN sees it, on the call's handle: g with the input
 * hp x wp (padded for an asymmetric "same"), of 16-bit values of kind half
 * (HWC_F16, HWC_BF16) or, half 0, of g's dtype; the legacy API's
 * descriptors when it runs. */
typedef struct conv_dnn {
    cudnnHandle_t h;
    int dev;
    const conv_geom *g;
    int64_t hp, wp;
    int half;
    int descs; /* the legacy descriptors: 0 not made, 1 made, else the failed status */
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t c;
    conv_key key;
    const char *what; /* the cuDNN call that failed */
} conv_dnn;

static void conv_dnn_free(conv_dnn *d)
{
    if (d->x)
        dnn.cudnnDestroyTensorDescriptor(d->x);
    if (d->y)
        dnn.cudnnDestroyTensorDescriptor(d->y);
    if (d->w)
        dnn.cudnnDestroyFilterDescriptor(d->w);
    if (d->c)
        dnn.cudnnDestroyConvolutionDescriptor(d->c);
    if (d->h)
        handle_pool_give(&conv_handles, d->dev, (void *)d->h);
}

/* The tensors' cuDNN type. */
static cudnnDataType_t conv_dnn_dtype(const conv_dnn *d)
{
    return d->half == HWC_F16    ? CUDNN_DATA_HALF
           : d->half == HWC_BF16 ? CUDNN_DATA_BFLOAT16
           : d->g->is64          ? CUDNN_DATA_DOUBLE
                                 : CUDNN_DATA_FLOAT;
}

/* The legacy API's descriptors of d (symmetric padding ph, pw; 16-bit
 * values: float32 compute, tensor-core math; else FMA math).
 * CUDNN_STATUS_SUCCESS, or the status with d->what. */
static cudnnStatus_t conv_dnn_descs(conv_dnn *d)
{
    const conv_geom *g = d->g;
    int64_t hp = d->hp, wp = d->wp;
    int half = d->half;
    cudnnDataType_t dt = conv_dnn_dtype(d);
    cudnnDataType_t compute = half ? CUDNN_DATA_FLOAT : dt;
    cudnnStatus_t st;
    int on, oc, oh, ow;
    d->what = "descriptors";
    if ((st = dnn.cudnnCreateTensorDescriptor(&d->x)) ||
        (st = dnn.cudnnCreateTensorDescriptor(&d->y)) ||
        (st = dnn.cudnnCreateFilterDescriptor(&d->w)) ||
        (st = dnn.cudnnCreateConvolutionDescriptor(&d->c)))
        return st;
    if ((st = dnn.cudnnSetTensor4dDescriptor(d->x, CUDNN_TENSOR_NCHW, dt, (int)g->n, (int)g->c,
                                             (int)hp, (int)wp)) ||
        (st = dnn.cudnnSetFilter4dDescriptor(d->w, dt, CUDNN_TENSOR_NCHW, (int)g->o, (int)g->cg,
                                             (int)g->kh, (int)g->kw)) ||
        (st = dnn.cudnnSetConvolution2dDescriptor(d->c, (int)g->ph, (int)g->pw, (int)g->sh,
                                                  (int)g->sw, (int)g->dh, (int)g->dw,
                                                  CUDNN_CROSS_CORRELATION, compute)) ||
        (st = dnn.cudnnSetConvolutionGroupCount(d->c, (int)g->groups)) ||
        (st = dnn.cudnnSetConvolutionMathType(d->c, half ? CUDNN_TENSOR_OP_MATH
                                                         : CUDNN_FMA_MATH)))
        return st;
    d->what = "cudnnGetConvolution2dForwardOutputDim";
    if ((st = dnn.cudnnGetConvolution2dForwardOutputDim(d->c, d->x, d->w, &on, &oc, &oh, &ow)))
        return st;
    if (on != g->n || oc != g->o || oh != g->ho || ow != g->wo)
        return CUDNN_STATUS_BAD_PARAM; /* not the convolution conv_check computed */
    d->what = "cudnnSetTensor4dDescriptor";
    return dnn.cudnnSetTensor4dDescriptor(d->y, CUDNN_TENSOR_NCHW, dt, on, oc, oh, ow);
}

/* cuDNN ready, a handle of the call's device on its stream, d describing
 * g (conv_dnn's fields; g must outlive d): 0, or the status of opjit_fail. */
static int conv_dnn_open(opjit_ctx *ctx, const conv_geom *g, int64_t hp, int64_t wp, int half,
                         conv_dnn *d)
{
    cudnnStatus_t st;
    memset(d, 0, sizeof *d);
    if (conv_cudnn_load() < 0)
        return opjit_fail(ctx, "cuDNN is not available: %s", dnn.why);
    d->dev = opjit_device_id(ctx);
    if (!handle_pool_has_device(d->dev))
        return opjit_fail(ctx, "CUDA device %d is beyond this op's table", d->dev);
    d->h = (cudnnHandle_t)handle_pool_take(&conv_handles, d->dev);
    d->what = "cudnnCreate";
    if (!d->h && (st = dnn.cudnnCreate(&d->h)) != CUDNN_STATUS_SUCCESS) {
        d->h = NULL;
        return opjit_fail(ctx, "%s: %s", d->what, dnn.cudnnGetErrorString(st));
    }
    d->what = "cudnnSetStream";
    if ((st = dnn.cudnnSetStream(d->h, (cudaStream_t)opjit_stream(ctx))))
        return opjit_fail(ctx, "%s: %s", d->what, dnn.cudnnGetErrorString(st));
    d->g = g;
    d->hp = hp;
    d->wp = wp;
    d->half = half;
    d->key.v[0] = d->dev; d->key.v[1] = g->is64 + 2 * half; d->key.v[2] = g->n; d->key.v[3] = g->c;
    d->key.v[4] = hp; d->key.v[5] = wp; d->key.v[6] = g->o; d->key.v[7] = g->kh;
    d->key.v[8] = g->kw; d->key.v[9] = g->sh; d->key.v[10] = g->sw; d->key.v[11] = g->ph;
    d->key.v[12] = g->pw; d->key.v[13] = g->dh; d->key.v[14] = g->dw; d->key.v[15] = g->groups;
    return 0;
}

/* ---- one cuDNN convolution, any direction ------------------------------------- */

/* cuDNN's ranking of kind's algorithms (measured, or its heuristic), best
 * first, those that work: into algos, *n of them. */
static cudnnStatus_t conv_rank(conv_dnn *d, int kind, int *algos, int *n)
{
    int find = opjit_env_flag("OPJIT_CUDNN_FIND", 1), got = 0, i;
    cudnnStatus_t st;
    *n = 0;
    if (kind == CONV_FWD) {
        cudnnConvolutionFwdAlgoPerf_t p[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
        d->what = find ? "cudnnFindConvolutionForwardAlgorithm"
                       : "cudnnGetConvolutionForwardAlgorithm_v7";
        st = find ? dnn.cudnnFindConvolutionForwardAlgorithm(d->h, d->x, d->w, d->c, d->y,
                                                              CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                              &got, p)
                  : dnn.cudnnGetConvolutionForwardAlgorithm_v7(d->h, d->x, d->w, d->c, d->y,
                                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                               &got, p);
        for (i = 0; !st && i < got && *n < CONV_MAX_ALGOS; i++)
            if (p[i].status == CUDNN_STATUS_SUCCESS)
                algos[(*n)++] = (int)p[i].algo;
    } else if (kind == CONV_BWD_DATA) {
        cudnnConvolutionBwdDataAlgoPerf_t p[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        d->what = find ? "cudnnFindConvolutionBackwardDataAlgorithm"
                       : "cudnnGetConvolutionBackwardDataAlgorithm_v7";
        st = find ? dnn.cudnnFindConvolutionBackwardDataAlgorithm(
                        d->h, d->w, d->y, d->c, d->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, p)
                  : dnn.cudnnGetConvolutionBackwardDataAlgorithm_v7(
                        d->h, d->w, d->y, d->c, d->x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, p);
        for (i = 0; !st && i < got && *n < CONV_MAX_ALGOS; i++)
            if (p[i].status == CUDNN_STATUS_SUCCESS)
                algos[(*n)++] = (int)p[i].algo;
    } else {
        cudnnConvolutionBwdFilterAlgoPerf_t p[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
        d->what = find ? "cudnnFindConvolutionBackwardFilterAlgorithm"
                       : "cudnnGetConvolutionBackwardFilterAlgorithm_v7";
        st = find ? dnn.cudnnFindConvolutionBackwardFilterAlgorithm(
                        d->h, d->x, d->y, d->c, d->w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got,
                        p)
                  : dnn.cudnnGetConvolutionBackwardFilterAlgorithm_v7(
                        d->h, d->x, d->y, d->c, d->w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got,
                        p);
        for (i = 0; !st && i < got && *n < CONV_MAX_ALGOS; i++)
            if (p[i].status == CUDNN_STATUS_SUCCESS)
                algos[(*n)++] = (int)p[i].algo;
    }
    if (!st && *n == 0)
        algos[(*n)++] = 0; /* *_ALGO_0 (IMPLICIT_GEMM forward) works for every shape */
    return st;
}

/* The workspace kind's algorithm algo needs. */
static cudnnStatus_t conv_wsize(conv_dnn *d, int kind, int algo, size_t *bytes)
{
    *bytes = 0;
    if (kind == CONV_FWD)
        return dnn.cudnnGetConvolutionForwardWorkspaceSize(
            d->h, d->x, d->w, d->c, d->y, (cudnnConvolutionFwdAlgo_t)algo, bytes);
    if (kind == CONV_BWD_DATA)
        return dnn.cudnnGetConvolutionBackwardDataWorkspaceSize(
            d->h, d->w, d->y, d->c, d->x, (cudnnConvolutionBwdDataAlgo_t)algo, bytes);
    return dnn.cudnnGetConvolutionBackwardFilterWorkspaceSize(
        d->h, d->x, d->y, d->c, d->w, (cudnnConvolutionBwdFilterAlgo_t)algo, bytes);
}

/* out = kind(a, b): forward (x, w) -> y, backward data (w, dy) -> dx,
 * backward filter (x, dy) -> dw. */
static cudnnStatus_t conv_exec(conv_dnn *d, int kind, int algo, int is64, const void *a,
                               const void *b, void *ws, size_t wsize, void *out)
{
    double one_d = 1.0, zero_d = 0.0;
    float one_f = 1.0f, zero_f = 0.0f;
    const void *one = is64 ? (const void *)&one_d : (const void *)&one_f;
    const void *zero = is64 ? (const void *)&zero_d : (const void *)&zero_f;
    if (kind == CONV_FWD)
        return dnn.cudnnConvolutionForward(d->h, one, d->x, a, d->w, b, d->c,
                                           (cudnnConvolutionFwdAlgo_t)algo, ws, wsize, zero,
                                           d->y, out);
    if (kind == CONV_BWD_DATA)
        return dnn.cudnnConvolutionBackwardData(d->h, one, d->w, a, d->y, b, d->c,
                                                (cudnnConvolutionBwdDataAlgo_t)algo, ws, wsize,
                                                zero, d->x, out);
    return dnn.cudnnConvolutionBackwardFilter(d->h, one, d->x, a, d->y, b, d->c,
                                              (cudnnConvolutionBwdFilterAlgo_t)algo, ws, wsize,
                                              zero, d->w, out);
}

static const char *const conv_exec_names[3] = {
    "cudnnConvolutionForward", "cudnnConvolutionBackwardData", "cudnnConvolutionBackwardFilter"};

/* ---- the graph API: an execution plan per shape, direction and alignment ---- */

static struct {
    conv_key key;
    cg_plan *plan; /* NULL: the graph API cannot run it, the legacy API does */
    int broken;    /* the plan failed to run: the legacy API from then on */
} conv_plans[CONV_CACHE];
static int conv_nplans;

/* k's slot, or -1; dnn_lock held. */
static int conv_plan_slot(const conv_key *k)
{
    int i;
    for (i = 0; i < conv_nplans; i++)
        if (!memcmp(&conv_plans[i].key, k, sizeof *k))
            return i;
    return -1;
}

/* The plan kept for k: 1 and *plan (NULL: take the legacy API), or 0 when
 * there is none yet. A full table sends new shapes to the legacy API. */
static int conv_plan_lookup(const conv_key *k, cg_plan **plan)
{
    int i, found;
    pthread_mutex_lock(&dnn_lock);
    i = conv_plan_slot(k);
    *plan = i >= 0 && !conv_plans[i].broken ? conv_plans[i].plan : NULL;
    found = i >= 0 || conv_nplans == CONV_CACHE;
    pthread_mutex_unlock(&dnn_lock);
    return found;
}

/* Keep plan (NULL too) for k: the plan to use, another call's when it kept
 * one first (then plan is freed). Plans live as long as the process. */
static cg_plan *conv_plan_keep(const conv_key *k, cg_plan *plan)
{
    cg_plan *use = plan;
    int i;
    pthread_mutex_lock(&dnn_lock);
    i = conv_plan_slot(k);
    if (i >= 0) {
        use = conv_plans[i].broken ? NULL : conv_plans[i].plan;
    } else if (conv_nplans < CONV_CACHE) {
        conv_plans[conv_nplans].key = *k;
        conv_plans[conv_nplans].plan = plan;
        conv_plans[conv_nplans].broken = 0;
        conv_nplans++;
    } else {
        use = NULL;
    }
    pthread_mutex_unlock(&dnn_lock);
    if (plan && use != plan) {
        cg_plan_free(&dnn_graph, plan);
        free(plan);
    }
    return use;
}

static void conv_plan_broken(const conv_key *k)
{
    int i;
    pthread_mutex_lock(&dnn_lock);
    if ((i = conv_plan_slot(k)) >= 0)
        conv_plans[i].broken = 1;
    pthread_mutex_unlock(&dnn_lock);
}

/* The plan of d's convolution in direction kind, pointers aligned to
 * align bytes; NULL when cuDNN's graph API cannot build one. */
static cg_plan *conv_plan_new(const conv_dnn *d, int kind, int64_t align)
{
    const conv_geom *g = d->g;
    cg_plan *p = malloc(sizeof *p);
    cg_conv c;
    if (!p)
        return NULL;
    c.kind = kind;
    c.data = conv_dnn_dtype(d);
    c.x[0] = g->n, c.x[1] = g->c, c.x[2] = d->hp, c.x[3] = d->wp;
    c.w[0] = g->o, c.w[1] = g->cg, c.w[2] = g->kh, c.w[3] = g->kw;
    c.y[0] = g->n, c.y[1] = g->o, c.y[2] = g->ho, c.y[3] = g->wo;
    c.pad[0] = g->ph, c.pad[1] = g->pw;
    c.stride[0] = g->sh, c.stride[1] = g->sw;
    c.dilation[0] = g->dh, c.dilation[1] = g->dw;
    c.align = align;
    if (cg_graph(&dnn_graph, &c, d->h, p) || cg_plan_build(&dnn_graph, &c, p)) {
        cg_plan_free(&dnn_graph, p);
        free(p);
        return NULL;
    }
    return p;
}

/* The largest power of two up to 16 that divides every address. */
static int64_t conv_align(const void *x, const void *w, const void *y)
{
    uintptr_t bits = (uintptr_t)x | (uintptr_t)w | (uintptr_t)y;
    int64_t align = 16;
    while (align > 1 && (bits & (uintptr_t)(align - 1)))
        align /= 2;
    return align;
}

/* out = kind(a, b) (conv_exec's operands) on the plan kept for its shape,
 * built at its first call: 0; -1 when the workspace cannot be had (the
 * runtime said why); 1 when the graph API cannot run it: then the legacy
 * API does. */
static int conv_run_graph(opjit_ctx *ctx, conv_dnn *d, int kind, const void *a, const void *b,
                          void *out)
{
    void *x = (void *)(kind == CONV_BWD_DATA ? out : a);
    void *w = (void *)(kind == CONV_FWD ? b : kind == CONV_BWD_DATA ? a : out);
    void *y = (void *)(kind == CONV_FWD ? out : b);
    void *ws = NULL;
    conv_key key = d->key;
    cg_plan *p;
    key.v[16] = kind;
    key.v[17] = conv_align(x, w, y);
    if (!conv_plan_lookup(&key, &p))
        p = conv_plan_keep(&key, conv_plan_new(d, kind, key.v[17]));
    if (!p)
        return 1;
    if (p->workspace && !(ws = opjit_device_workspace(ctx, (size_t)p->workspace)))
        return -1;
    if (cg_execute(&dnn_graph, d->h, p, x, w, y, ws) == CUDNN_STATUS_SUCCESS)
        return 0;
    conv_plan_broken(&key);
    return 1;
}

/* ---- one convolution: the graph API, else the legacy one --------------------------- */

/* Run kind through the graph API ($OPJIT_CUDNN_GRAPH=0: never), else on
 * the legacy API's remembered algorithm for this shape, else on cuDNN's
 * ranking, the first that runs (then remembered). 0, or the status of
 * opjit_fail. */
static int conv_run_dnn(opjit_ctx *ctx, conv_dnn *d, int kind, int is64, const void *a,
                        const void *b, void *out)
{
    int algos[CONV_MAX_ALGOS], n = 0, i, remembered, rc;
    conv_key key = d->key;
    cudnnStatus_t st;
    if (opjit_env_flag("OPJIT_CUDNN_GRAPH", 1) &&
        (rc = conv_run_graph(ctx, d, kind, a, b, out)) <= 0)
        return rc;
    if (!d->descs)
        d->descs = (st = conv_dnn_descs(d)) ? (int)st : 1;
    if (d->descs != 1)
        return opjit_fail(ctx, "%s: %s", d->what, dnn.cudnnGetErrorString((cudnnStatus_t)d->descs));
    key.v[16] = kind;
    remembered = conv_algo_lookup(&key, &algos[0]);
    if (remembered)
        n = 1;
    else if ((st = conv_rank(d, kind, algos, &n)))
        return opjit_fail(ctx, "%s: %s", d->what, dnn.cudnnGetErrorString(st));
    st = CUDNN_STATUS_NOT_SUPPORTED;
    d->what = conv_exec_names[kind];
    for (i = 0; i < n; i++) {
        size_t wsize = 0;
        void *ws = NULL;
        if ((st = conv_wsize(d, kind, algos[i], &wsize)))
            continue;
        if (wsize && !(ws = opjit_device_workspace(ctx, wsize)))
            return -1; /* the runtime recorded why */
        st = conv_exec(d, kind, algos[i], is64, a, b, ws, wsize, out);
        if (st == CUDNN_STATUS_SUCCESS) {
            if (!remembered)
                conv_algo_store(&key, algos[i]);
            return 0;
        }
    }
    return opjit_fail(ctx, "%s: %s", d->what, dnn.cudnnGetErrorString(st));
}

/* ---- kernels of this file ----------------------------------------------------------- */

static void conv_grid(long long total, unsigned grid[3], unsigned block[3])
{
    long long blocks = (total + 255) / 256;
    grid[0] = (unsigned)(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
    grid[1] = grid[2] = 1;
    block[0] = 256;
    block[1] = block[2] = 1;
}

/* Add the bias (or fill with it, or with zeros: fill) on the device. */
static int conv_bias(opjit_ctx *ctx, int is64, void *out, const void *bias, int64_t n,
                     int64_t o, int64_t plane, int fill)
{
    long long total = (long long)(n * o * plane), pl = (long long)plane;
    int oc = (int)o;
    void *b = (void *)bias;
    void *params[6];
    unsigned grid[3], block[3];
    if (total == 0)
        return 0;
    params[0] = &total;
    params[1] = &pl;
    params[2] = &oc;
    params[3] = &b;
    params[4] = &out;
    params[5] = &fill;
    conv_grid(total, grid, block);
    return opjit_launch(ctx, is64 ? "conv2d_bias_f64" : "conv2d_bias_f32", grid, block, 0,
                        params);
}

/* Same layout as the device's struct conv_gather_args. */
typedef struct conv_gather_args {
    long long d[4], e[4], s[4];
} conv_gather_args;

/* dst (dense [d0..d3]) from src read through ga (extents, strides). */
static int conv_gather(opjit_ctx *ctx, int is64, const void *src, conv_gather_args *ga,
                       void *dst)
{
    long long total = ga->d[0] * ga->d[1] * ga->d[2] * ga->d[3];
    void *s = (void *)src, *params[4];
    unsigned grid[3], block[3];
    if (total == 0)
        return 0;
    params[0] = &total;
    params[1] = ga;
    params[2] = &s;
    params[3] = &dst;
    conv_grid(total, grid, block);
    return opjit_launch(ctx, is64 ? "conv2d_gather_f64" : "conv2d_gather_f32", grid, block, 0,
                        params);
}

/* t as a dense 4-D block ([1, ...] in front of fewer dimensions) of eh
 * more rows and ew more columns, zero there, into *out: t's own data when
 * it is dense and nothing is added, else a gather into device workspace.
 * 0, or -1 with the error recorded. */
static int conv_dense(opjit_ctx *ctx, const DLTensor *t, int64_t eh, int64_t ew,
                      const void **out)
{
    conv_gather_args ga;
    size_t esz = (t->dtype.bits + 7) / 8;
    int k = 4 - t->ndim, i;
    void *to;
    *out = opjit_data(t);
    if (st_is_dense(t) && !eh && !ew)
        return 0;
    for (i = 0; i < 4; i++) {
        ga.e[i] = i < k ? 1 : t->shape[i - k];
        ga.s[i] = i < k || !t->strides ? 0 : t->strides[i - k];
    }
    for (i = 3; !t->strides && i >= k; i--) /* row-major strides */
        ga.s[i] = i == 3 ? 1 : ga.s[i + 1] * ga.e[i + 1];
    memcpy(ga.d, ga.e, sizeof ga.d);
    ga.d[2] += eh;
    ga.d[3] += ew;
    to = opjit_device_workspace(ctx, (size_t)(ga.d[0] * ga.d[1] * ga.d[2] * ga.d[3]) * esz);
    if (!to || conv_gather(ctx, t->dtype.bits == 64, opjit_data(t), &ga, to))
        return -1;
    *out = to;
    return 0;
}

/* db [O] = the sums of dy over images and positions. */
static int conv_grad_bias(opjit_ctx *ctx, const conv_geom *g, const void *dy, void *db)
{
    long long n = (long long)g->n, plane = (long long)(g->ho * g->wo);
    int o = (int)g->o;
    void *y = (void *)dy, *params[5];
    unsigned grid[3] = {(unsigned)g->o, 1, 1}, block[3] = {256, 1, 1};
    params[0] = &n;
    params[1] = &o;
    params[2] = &plane;
    params[3] = &y;
    params[4] = &db;
    return opjit_launch(ctx, g->is64 ? "conv2d_grad_bias_f64" : "conv2d_grad_bias_f32", grid,
                        block, 0, params);
}

/* ---- the ops ------------------------------------------------------------------------ */

/* Sizes cuDNN's legacy API takes (int, tensors below 2^31 elements), and
 * a grid of one block per output channel: 0, or the status of opjit_fail. */
static int conv_cuda_sizes_ok(opjit_ctx *ctx, const conv_geom *g)
{
    int64_t hp = g->h + g->ph2 - g->ph, wp = g->w + g->pw2 - g->pw;
    if (g->n * g->c * hp * wp > INT_MAX || g->n * g->o * g->ho * g->wo > INT_MAX ||
        g->o * g->cg * g->kh * g->kw > INT_MAX || g->n > INT_MAX || g->o > 65535 * 1024)
        return opjit_fail(ctx, "tensors too large for cuDNN's legacy API (at most %d elements "
                               "each)", INT_MAX);
    return 0;
}

/* The output over g on the device, [N, O, Ho, Wo] or [O, Ho, Wo], its
 * data into *data. 0, or -1 with the error recorded. */
static int conv_output(opjit_ctx *ctx, const conv_geom *g, DLDataType dt, void **data)
{
    int64_t shape[4] = {g->n, g->o, g->ho, g->wo};
    DLTensor *out = g->batched ? opjit_output(ctx, 0, dt, 4, shape)
                               : opjit_output(ctx, 0, dt, 3, shape + 1);
    *data = out ? opjit_data(out) : NULL;
    return out ? 0 : -1;
}

/* The forward over g into out (dense, on the device, of input's dtype:
 * float32 or float64). 0, or the status of the failure. */
static int conv2d_cuda_forward(opjit_ctx *ctx, const conv_geom *g, const DLTensor *input,
                               const DLTensor *weight, const DLTensor *bias, void *out)
{
    const void *x, *w, *b = NULL;
    int64_t eh, ew;
    conv_dnn d;
    int rc;

    if (g->n == 0)
        return 0;
    if (bias && conv_dense(ctx, bias, 0, 0, &b))
        return -1;
    if (g->cg == 0) /* no input channels: the output is the bias, or 0 */
        return conv_bias(ctx, g->is64, out, b, g->n, g->o, g->ho * g->wo, 1);
    eh = g->ph2 - g->ph; /* an asymmetric "same": the input padded at the end */
    ew = g->pw2 - g->pw;
    if (conv_dense(ctx, input, eh, ew, &x) || conv_dense(ctx, weight, 0, 0, &w))
        return -1;
    if ((rc = conv_dnn_open(ctx, g, g->h + eh, g->w + ew, 0, &d)) == 0 &&
        (rc = conv_run_dnn(ctx, &d, CONV_FWD, g->is64, x, w, out)) == 0 && b)
        rc = conv_bias(ctx, g->is64, out, b, g->n, g->o, g->ho * g->wo, 0);
    conv_dnn_free(&d);
    return rc;
}

/* ---- float16 and bfloat16 on tensor cores ---------------------------------------- */

/* $OPJIT_CUDNN_HALF: 0 auto, 1 "tensor" (the tensor-core path or an
 * error), 2 "wide" (widened to float32), or -1 with the error recorded. */
static int conv_half_mode(opjit_ctx *ctx)
{
    const char *e = getenv("OPJIT_CUDNN_HALF");
    if (!e || !*e || !strcmp(e, "auto"))
        return 0;
    if (!strcmp(e, "tensor"))
        return 1;
    if (!strcmp(e, "wide"))
        return 2;
    opjit_fail(ctx, "OPJIT_CUDNN_HALF is '%s': expected auto, tensor, wide or nothing", e);
    return -1;
}

/* Whether cuDNN can take the 16-bit operands ts (NULL: not needed) as they
 * are: 1, or 0 with the reason in *no. */
static int conv_half_direct_ok(const conv_geom *g, const DLTensor *const *ts, int nt,
                               const char **no)
{
    int i;
    *no = NULL;
    if (g->ph2 != g->ph || g->pw2 != g->pw)
        *no = "padding cuDNN cannot say (\"same\" with an even kernel)";
    else if (g->cg == 0 || g->n == 0)
        *no = "no input channels or no images";
    for (i = 0; !*no && i < nt; i++)
        if (ts[i] && !st_is_dense(ts[i]))
            *no = "an operand that is not dense (it would need a gather)";
    return !*no;
}

/* out (16-bit of kind) += bias per channel, in float32, rounded. */
static int conv_bias_h16(opjit_ctx *ctx, const conv_geom *g, int kind, void *out,
                         const void *bias)
{
    long long plane = (long long)(g->ho * g->wo), total = (long long)(g->n * g->o) * plane;
    int o = (int)g->o, bf = kind == HWC_BF16;
    void *b = (void *)bias, *params[6];
    unsigned grid[3], block[3];
    conv_grid(total, grid, block);
    params[0] = &total;
    params[1] = &plane;
    params[2] = &o;
    params[3] = &b;
    params[4] = &out;
    params[5] = &bf;
    return opjit_launch(ctx, "conv2d_bias_h16", grid, block, 0, params);
}

/* The forward of dense 16-bit operands on cuDNN's tensor-core path. */
static int conv_half_tensor_fwd(opjit_ctx *ctx, const conv_geom *g, int kind,
                                const DLTensor *input, const DLTensor *weight,
                                const DLTensor *bias, void *out)
{
    conv_dnn d;
    int rc;
    if ((rc = conv_dnn_open(ctx, g, g->h, g->w, kind, &d)) == 0 &&
        (rc = conv_run_dnn(ctx, &d, CONV_FWD, 0, opjit_data(input), opjit_data(weight), out)) ==
            0 &&
        bias)
        rc = conv_bias_h16(ctx, g, kind, out, opjit_data(bias));
    conv_dnn_free(&d);
    return rc;
}

/* The gradients of dense 16-bit operands in = {grad, input, weight}:
 * grad_input and grad_weight on cuDNN's tensor-core path, grad_bias summed
 * in double from the widened grad. */
static int conv_half_tensor_bwd(opjit_ctx *ctx, const conv_geom *g, int kind,
                                const DLTensor *in[3], const int want[3], void *out[3])
{
    conv_dnn d;
    DLTensor dyw;
    void *o;
    int rc = 0;
    memset(&d, 0, sizeof d);
    if ((want[0] || want[1]) && (rc = conv_dnn_open(ctx, g, g->h, g->w, kind, &d)) == 0) {
        if (want[0])
            rc = conv_run_dnn(ctx, &d, CONV_BWD_DATA, 0, opjit_data(in[2]), opjit_data(in[0]),
                              out[0]);
        if (!rc && want[1])
            rc = conv_run_dnn(ctx, &d, CONV_BWD_FILTER, 0, opjit_data(in[1]),
                              opjit_data(in[0]), out[1]);
    }
    conv_dnn_free(&d);
    if (rc || !want[2])
        return rc;
    if (hwc_widen(ctx, kind, in[0], &dyw) || !(o = hwc_scratch(ctx, g->o)))
        return -1;
    if ((rc = conv_grad_bias(ctx, g, dyw.data, o)) != 0)
        return rc;
    return hwc_narrow(ctx, kind, o, out[2], g->o);
}

/* The forward in float16 or bfloat16 (kind): the operands widened to
 * float32 on the device, the float32 forward, rounded once into out. */
static int conv2d_cuda_half(opjit_ctx *ctx, const conv_geom *g, int kind, const DLTensor *input,
                            const DLTensor *weight, const DLTensor *bias, void *out)
{
    int64_t nout = g->n * g->o * g->ho * g->wo;
    const DLTensor *ts[3] = {input, weight, bias};
    const char *no = "OPJIT_CUDNN_HALF=wide";
    DLTensor iw, ww, bw;
    void *o;
    int rc, mode = conv_half_mode(ctx);
    if (mode < 0)
        return -1;
    if (mode != 2 && conv_half_direct_ok(g, ts, 3, &no)) {
        if ((rc = conv_half_tensor_fwd(ctx, g, kind, input, weight, bias, out)) == 0 ||
            mode == 1)
            return rc;
        /* the tensor-core path could not run (bfloat16 before sm_80, say) */
    } else if (mode == 1) {
        return opjit_fail(ctx, "OPJIT_CUDNN_HALF=tensor, but this call cannot take cuDNN's "
                               "16-bit path: %s", no);
    }
    if (hwc_widen(ctx, kind, input, &iw) || hwc_widen(ctx, kind, weight, &ww) ||
        (bias && hwc_widen(ctx, kind, bias, &bw)) || !(o = hwc_scratch(ctx, nout)))
        return -1;
    if ((rc = conv2d_cuda_forward(ctx, g, &iw, &ww, bias ? &bw : NULL, o)) != 0)
        return rc;
    return hwc_narrow(ctx, kind, o, out, nout);
}

/* conv2d and conv2d.padding (str_padding). */
static int conv2d_cuda_run(opjit_ctx *ctx, opjit_args *a, int str_padding)
{
    DLTensor *input = opjit_arg_tensor(a, 0);
    DLTensor *weight = opjit_arg_tensor(a, 1);
    DLTensor *bias = opjit_arg_tensor(a, 2);
    conv_args p;
    conv_geom g;
    void *out;
    int rc;

    /* The checks of conv2d.c, shared through conv2d_common.h. */
    if ((rc = conv_read_args(ctx, a, 3, str_padding, &p)) != 0 ||
        (rc = conv_check(ctx, input, weight, bias, &p, &g)) != 0 ||
        (rc = conv_cuda_sizes_ok(ctx, &g)) != 0)
        return rc;
    if (conv_output(ctx, &g, input->dtype, &out))
        return -1;
    if (hwc_kind(input->dtype))
        return conv2d_cuda_half(ctx, &g, hwc_kind(input->dtype), input, weight, bias, out);
    return conv2d_cuda_forward(ctx, &g, input, weight, bias, out);
}

static int conv2d_cuda(opjit_ctx *ctx, opjit_args *a) { return conv2d_cuda_run(ctx, a, 0); }
static int conv2d_padding_cuda(opjit_ctx *ctx, opjit_args *a)
{
    return conv2d_cuda_run(ctx, a, 1);
}

/* Output index of conv2d_backward shaped like t (want), else [0], its
 * data into *data. 0, or -1 with the error recorded. */
static int conv_grad_output(opjit_ctx *ctx, int index, const DLTensor *t, int want, void **data)
{
    int64_t none = 0;
    DLTensor *o = want ? opjit_output(ctx, index, t->dtype, t->ndim, t->shape)
                       : opjit_output(ctx, index, t->dtype, 1, &none);
    *data = o ? opjit_data(o) : NULL;
    return o ? 0 : -1;
}

/* grad_input and grad_weight through cuDNN (N > 0, C > 0): dy dense; the
 * input padded for an asymmetric "same", and grad_input cut out of the
 * padded one's gradient. */
static int conv_cuda_grads(opjit_ctx *ctx, const conv_geom *g, const DLTensor *input,
                           const DLTensor *weight, const void *dy, const int want[3], void *dx,
                           void *dw)
{
    int64_t eh = g->ph2 - g->ph, ew = g->pw2 - g->pw;
    size_t esz = g->is64 ? sizeof(double) : sizeof(float);
    const void *x = NULL, *w = NULL;
    void *dxp = dx;
    conv_dnn d;
    int rc;
    if ((want[1] && conv_dense(ctx, input, eh, ew, &x)) ||
        (want[0] && conv_dense(ctx, weight, 0, 0, &w)))
        return -1;
    if (want[0] && (eh || ew) &&
        !(dxp = opjit_device_workspace(ctx, (size_t)(g->n * g->c * (g->h + eh) * (g->w + ew)) *
                                                esz)))
        return -1;
    if ((rc = conv_dnn_open(ctx, g, g->h + eh, g->w + ew, 0, &d)) == 0 && want[0])
        rc = conv_run_dnn(ctx, &d, CONV_BWD_DATA, g->is64, w, dy, dxp);
    if (rc == 0 && want[1])
        rc = conv_run_dnn(ctx, &d, CONV_BWD_FILTER, g->is64, x, dy, dw);
    conv_dnn_free(&d);
    if (rc == 0 && dxp != dx) { /* dx = the padded gradient without its extra rows */
        conv_gather_args ga = {{g->n, g->c, g->h, g->w}, {g->n, g->c, g->h, g->w},
                               {g->c * (g->h + eh) * (g->w + ew), (g->h + eh) * (g->w + ew),
                                g->w + ew, 1}};
        rc = conv_gather(ctx, g->is64, dxp, &ga, dx);
    }
    return rc;
}

/* The gradients over g (float32 or float64) into dx, dw, db: those want
 * says. 0, or the status of the failure. */
static int conv2d_backward_cuda_grads(opjit_ctx *ctx, const conv_geom *g, const DLTensor *grad,
                                      const DLTensor *input, const DLTensor *weight,
                                      const int want[3], void *dx, void *dw, void *db)
{
    const void *dy;
    int rc;
    if (conv_dense(ctx, grad, 0, 0, &dy))
        return -1;
    if (want[2] && (rc = conv_grad_bias(ctx, g, dy, db)) != 0)
        return rc;
    if (want[1] && g->n == 0) /* a sum of nothing */
        return conv_bias(ctx, g->is64, dw, NULL, 1, g->o * g->cg * g->kh * g->kw, 1, 1);
    if (g->n == 0 || g->cg == 0 || (!want[0] && !want[1]))
        return 0;
    return conv_cuda_grads(ctx, g, input, weight, dy, want, dx, dw);
}

/* The gradients in float16 or bfloat16 (kind): in = {grad, input,
 * weight} widened to float32 on the device (input and weight where a
 * gradient needs them), the float32 gradients, each rounded once into
 * out = {dx, dw, db}. */
static int conv2d_backward_cuda_half(opjit_ctx *ctx, const conv_geom *g, int kind,
                                     const DLTensor *in[3], const int want[3], void *out[3])
{
    int64_t n[3] = {g->n * g->c * g->h * g->w, g->o * g->cg * g->kh * g->kw, g->o};
    const DLTensor *ts[3] = {in[0], want[1] ? in[1] : NULL, want[0] ? in[2] : NULL};
    const char *no = "OPJIT_CUDNN_HALF=wide";
    DLTensor w[3];
    void *o[3] = {NULL, NULL, NULL};
    int i, rc, mode = conv_half_mode(ctx);
    if (mode < 0)
        return -1;
    if (mode != 2 && (want[0] || want[1]) && conv_half_direct_ok(g, ts, 3, &no)) {
        if ((rc = conv_half_tensor_bwd(ctx, g, kind, in, want, out)) == 0 || mode == 1)
            return rc;
    } else if (mode == 1 && (want[0] || want[1])) {
        return opjit_fail(ctx, "OPJIT_CUDNN_HALF=tensor, but this call cannot take cuDNN's "
                               "16-bit path: %s", no);
    }
    if (hwc_widen(ctx, kind, in[0], &w[0]) || (want[1] && hwc_widen(ctx, kind, in[1], &w[1])) ||
        (want[0] && hwc_widen(ctx, kind, in[2], &w[2])))
        return -1;
    for (i = 0; i < 3; i++)
        if (want[i] && !(o[i] = hwc_scratch(ctx, n[i])))
            return -1;
    if ((rc = conv2d_backward_cuda_grads(ctx, g, &w[0], want[1] ? &w[1] : in[1],
                                         want[0] ? &w[2] : in[2], want, o[0], o[1], o[2])) != 0)
        return rc;
    for (i = 0; i < 3; i++)
        if (want[i] && (rc = hwc_narrow(ctx, kind, o[i], out[i], n[i])) != 0)
            return rc;
    return 0;
}

/* conv2d_backward and conv2d_backward.padding (str_padding). */
static int conv2d_backward_cuda_run(opjit_ctx *ctx, opjit_args *a, int str_padding)
{
    DLTensor *grad = opjit_arg_tensor(a, 0);
    DLTensor *input = opjit_arg_tensor(a, 1);
    DLTensor *weight = opjit_arg_tensor(a, 2);
    DLTensor *bias = opjit_arg_tensor(a, 3);
    void *dx, *dw, *db;
    conv_args p;
    conv_geom g;
    int want[3], rc;

    if ((rc = conv_read_args(ctx, a, 4, str_padding, &p)) != 0 ||
        (rc = conv_check(ctx, input, weight, bias, &p, &g)) != 0 ||
        (rc = conv_check_grad(ctx, a, 8, grad, input, &g, want)) != 0 ||
        (rc = conv_cuda_sizes_ok(ctx, &g)) != 0)
        return rc;
    want[2] = want[2] && bias;
    if (conv_grad_output(ctx, 0, input, want[0], &dx) ||
        conv_grad_output(ctx, 1, weight, want[1], &dw) ||
        conv_grad_output(ctx, 2, bias ? bias : weight, want[2], &db))
        return -1;
    if (hwc_kind(input->dtype)) {
        const DLTensor *ins[3] = {grad, input, weight};
        void *outs[3] = {dx, dw, db};
        return conv2d_backward_cuda_half(ctx, &g, hwc_kind(input->dtype), ins, want, outs);
    }
    return conv2d_backward_cuda_grads(ctx, &g, grad, input, weight, want, dx, dw, db);
}

static int conv2d_backward_cuda(opjit_ctx *ctx, opjit_args *a)
{
    return conv2d_backward_cuda_run(ctx, a, 0);
}
static int conv2d_backward_padding_cuda(opjit_ctx *ctx, opjit_args *a)
{
    return conv2d_backward_cuda_run(ctx, a, 1);
}

OPJIT_MODULE(m)
{
    opjit_def(m, CONV2D_SCHEMA, OPJIT_CUDA, conv2d_cuda,
              "2-D convolution, NCHW (torch.nn.functional.conv2d) on CUDA through cuDNN");
    conv2d_require(m, 0);
    opjit_def(m, CONV2D_PADDING_SCHEMA, OPJIT_CUDA, conv2d_padding_cuda,
              "conv2d with padding=\"valid\" or \"same\" on CUDA through cuDNN");
    conv2d_require(m, 0);
    opjit_def(m, CONV2D_BACKWARD_SCHEMA, OPJIT_CUDA, conv2d_backward_cuda,
              "Gradients of conv2d on CUDA: cuDNN's backward data and filter, grad_bias "
              "summed by a kernel of conv2d.cu");
    conv2d_require(m, 1);
    opjit_def(m, CONV2D_BACKWARD_PADDING_SCHEMA, OPJIT_CUDA, conv2d_backward_padding_cuda,
              "Gradients of conv2d.padding on CUDA (cuDNN)");
    conv2d_require(m, 1);
    conv2d_declare(m, 1);
}

#endif
