/*
 * conv2d.cu - 2-D convolution on CUDA through cuDNN, the twin of conv2d.c
 * (torch.nn.functional.conv2d semantics, NCHW float32 and float64).
 *
 *   conv2d(Tensor input, Tensor weight, Tensor? bias=None, int[2] stride=1,
 *          int[2] padding=0, int[2] dilation=1, int groups=1) -> Tensor
 *
 * input [N, C, H, W] (or unbatched [C, H, W]), weight [O, C/groups, kH, kW],
 * bias [O]; output [N, O, Ho, Wo] (or [O, Ho, Wo]) on the input's device.
 *
 * cuDNN's legacy API: tensor, filter and convolution descriptors (groups
 * through cudnnSetConvolutionGroupCount), FMA math only (no TF32, so
 * float32 results stay close to the CPU twin), the forward algorithm
 * chosen by measuring them (cudnnFindConvolutionForwardAlgorithm, at the
 * first call of each shape), or by cuDNN's heuristic
 * (cudnnGetConvolutionForwardAlgorithm_v7) when $OPJIT_CUDNN_FIND=0 (measured
 * on an H100: the heuristic's picks ran up to 10x slower than PyTorch's
 * for small batches), and remembered per shape; its workspace from
 * opjit_device_workspace. The bias is added by a kernel of this file.
 *
 * cuDNN is taken at the first call by dlsym (the runtime makes
 * libcudnn.so.9 global before loading .cu host code when it exists; else
 * this file dlopens it): the op loads and warms on machines without cuDNN,
 * and a call there fails with a message saying so. cuDNN handles are kept
 * per device for the life of the process, one per concurrent call.
 */
#ifdef __CUDACC_RTC__

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
    X(cudnnGetConvolutionForwardWorkspaceSize) X(cudnnConvolutionForward)

static struct {
    int state; /* 0 not tried, 1 ready, -1 unavailable */
    char why[512];
#define CONV_FIELD(f) __typeof__(f) *f;
    CONV_CUDNN_FUNCS(CONV_FIELD)
#undef CONV_FIELD
} dnn;
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
    dnn.state = 1;
    pthread_mutex_unlock(&dnn_lock);
    return 1;
}

/* Handles per device, one per call in flight (cuda_handles.h). */
static handle_pool conv_handles = HANDLE_POOL_INIT;

static cudnnStatus_t conv_handle_get(int dev, cudnnHandle_t *h)
{
    *h = (cudnnHandle_t)handle_pool_take(&conv_handles, dev);
    if (*h)
        return CUDNN_STATUS_SUCCESS;
    return dnn.cudnnCreate(h); /* in the call's context, which is current */
}

static void conv_handle_put(int dev, cudnnHandle_t h)
{
    handle_pool_give(&conv_handles, dev, (void *)h);
}

/* ---- the algorithm, remembered per shape -------------------------------- */

typedef struct conv_key {
    int64_t v[20];
} conv_key;

#define CONV_CACHE 256
static struct {
    conv_key key;
    cudnnConvolutionFwdAlgo_t algo;
    int used;
} conv_algos[CONV_CACHE];
static int conv_next_slot;

static int conv_algo_lookup(const conv_key *k, cudnnConvolutionFwdAlgo_t *algo)
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

static void conv_algo_store(const conv_key *k, cudnnConvolutionFwdAlgo_t algo)
{
    pthread_mutex_lock(&dnn_lock);
    conv_algos[conv_next_slot].key = *k;
    conv_algos[conv_next_slot].algo = algo;
    conv_algos[conv_next_slot].used = 1;
    conv_next_slot = (conv_next_slot + 1) % CONV_CACHE;
    pthread_mutex_unlock(&dnn_lock);
}

/* ---- the op ----------------------------------------------------------------- */

typedef struct conv_descs {
    cudnnTensorDescriptor_t x, y;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t c;
} conv_descs;

static void conv_descs_free(conv_descs *d)
{
    if (d->x)
        dnn.cudnnDestroyTensorDescriptor(d->x);
    if (d->y)
        dnn.cudnnDestroyTensorDescriptor(d->y);
    if (d->w)
        dnn.cudnnDestroyFilterDescriptor(d->w);
    if (d->c)
        dnn.cudnnDestroyConvolutionDescriptor(d->c);
}

/* Add the bias (or fill with it, or with zeros: fill) on the device. */
static int conv_bias(opjit_ctx *ctx, int is64, void *out, const DLTensor *bias, int64_t n,
                     int64_t o, int64_t plane, int fill)
{
    long long total = (long long)(n * o * plane), pl = (long long)plane;
    int oc = (int)o;
    void *b = bias ? opjit_data(bias) : NULL;
    void *params[6];
    unsigned grid[3], block[3];
    long long blocks = (total + 255) / 256;
    params[0] = &total;
    params[1] = &pl;
    params[2] = &oc;
    params[3] = &b;
    params[4] = &out;
    params[5] = &fill;
    grid[0] = (unsigned)(blocks < 65535 * 16 ? blocks : 65535 * 16);
    grid[1] = grid[2] = 1;
    block[0] = 256;
    block[1] = block[2] = 1;
    return opjit_launch(ctx, is64 ? "conv2d_bias_f64" : "conv2d_bias_f32", grid, block, 0,
                        params);
}

static int conv2d_cuda(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *input = opjit_arg_tensor(a, 0);
    DLTensor *weight = opjit_arg_tensor(a, 1);
    DLTensor *bias = opjit_arg_tensor(a, 2);
    int64_t stride[2], pad[2], dil[2], shape[4], plane;
    conv_geom g;
    conv_args cargs;
    int64_t N, C, H, W, O, kh, kw, grp, ho, wo, cg;
    int is64, batched, dev, rc = 0, i, nalgo = 0, remembered = 0, on, oc, oh, ow;
    DLTensor *out;
    cudnnDataType_t dt;
    cudnnHandle_t h = NULL;
    cudnnStatus_t st;
    conv_descs d;
    conv_key key;
    cudnnConvolutionFwdAlgo_t algos[CUDNN_CONVOLUTION_FWD_ALGO_COUNT + 1];
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    float one_f = 1.0f, zero_f = 0.0f;
    double one_d = 1.0, zero_d = 0.0;
    const char *what = "";

    /* The checks of conv2d.c, shared through conv2d_common.h. */
    if ((rc = conv_read_args(ctx, a, 3, 0, &cargs)) != 0 ||
        (rc = conv_check(ctx, input, weight, bias, &cargs, &g)) != 0)
        return rc;
    is64 = g.is64;
    batched = g.batched;
    N = g.n; C = g.c; H = g.h; W = g.w;
    O = g.o; kh = g.kh; kw = g.kw;
    stride[0] = g.sh; stride[1] = g.sw;
    pad[0] = g.ph; pad[1] = g.pw;
    dil[0] = g.dh; dil[1] = g.dw;
    grp = g.groups;
    ho = g.ho;
    wo = g.wo;
    cg = g.cg;
    plane = ho * wo;
    /* cuDNN's legacy API takes int sizes and tensors below 2^31 elements. */
    if (N * C * H * W > INT_MAX || N * O * plane > INT_MAX || O * cg * kh * kw > INT_MAX ||
        N > INT_MAX)
        return opjit_fail(ctx, "tensors too large for cuDNN's legacy API (at most %d elements "
                               "each)", INT_MAX);

    if (batched) {
        shape[0] = N; shape[1] = O; shape[2] = ho; shape[3] = wo;
        out = opjit_output(ctx, 0, input->dtype, 4, shape);
    } else {
        shape[0] = O; shape[1] = ho; shape[2] = wo;
        out = opjit_output(ctx, 0, input->dtype, 3, shape);
    }
    if (!out)
        return -1;
    if (N == 0)
        return 0;
    if (cg == 0) /* no input channels: the output is the bias, or 0 */
        return conv_bias(ctx, is64, opjit_data(out), bias, N, O, plane, 1);

    if (conv_cudnn_load() < 0)
        return opjit_fail(ctx, "cuDNN is not available: %s", dnn.why);
    dev = opjit_device_id(ctx);
    if (!handle_pool_has_device(dev))
        return opjit_fail(ctx, "CUDA device %d is beyond this op's table", dev);
    dt = is64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    memset(&d, 0, sizeof d);
    if ((st = conv_handle_get(dev, &h)) != CUDNN_STATUS_SUCCESS) {
        h = NULL;
        what = "cudnnCreate";
        goto cudnn_fail;
    }
    what = "cudnnSetStream";
    if ((st = dnn.cudnnSetStream(h, (cudaStream_t)opjit_stream(ctx))))
        goto cudnn_fail;
    what = "descriptors";
    if ((st = dnn.cudnnCreateTensorDescriptor(&d.x)) ||
        (st = dnn.cudnnCreateTensorDescriptor(&d.y)) ||
        (st = dnn.cudnnCreateFilterDescriptor(&d.w)) ||
        (st = dnn.cudnnCreateConvolutionDescriptor(&d.c)))
        goto cudnn_fail;
    if ((st = dnn.cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NCHW, dt, (int)N, (int)C, (int)H,
                                             (int)W)) ||
        (st = dnn.cudnnSetFilter4dDescriptor(d.w, dt, CUDNN_TENSOR_NCHW, (int)O, (int)cg,
                                             (int)kh, (int)kw)) ||
        (st = dnn.cudnnSetConvolution2dDescriptor(d.c, (int)pad[0], (int)pad[1],
                                                  (int)stride[0], (int)stride[1], (int)dil[0],
                                                  (int)dil[1], CUDNN_CROSS_CORRELATION, dt)) ||
        (st = dnn.cudnnSetConvolutionGroupCount(d.c, (int)grp)) ||
        (st = dnn.cudnnSetConvolutionMathType(d.c, CUDNN_FMA_MATH)))
        goto cudnn_fail;
    what = "cudnnGetConvolution2dForwardOutputDim";
    if ((st = dnn.cudnnGetConvolution2dForwardOutputDim(d.c, d.x, d.w, &on, &oc, &oh, &ow)))
        goto cudnn_fail;
    if (on != N || oc != O || oh != ho || ow != wo) {
        rc = opjit_fail(ctx, "cuDNN computes output [%d, %d, %d, %d], expected "
                             "[%lld, %lld, %lld, %lld]",
                        on, oc, oh, ow, (long long)N, (long long)O, (long long)ho,
                        (long long)wo);
        goto done;
    }
    what = "cudnnSetTensor4dDescriptor";
    if ((st = dnn.cudnnSetTensor4dDescriptor(d.y, CUDNN_TENSOR_NCHW, dt, on, oc, oh, ow)))
        goto cudnn_fail;

    /* Algorithms to try, best first: the one remembered for this shape,
     * then cuDNN's ranking. */
    memset(&key, 0, sizeof key);
    key.v[0] = dev; key.v[1] = is64; key.v[2] = N; key.v[3] = C; key.v[4] = H;
    key.v[5] = W; key.v[6] = O; key.v[7] = kh; key.v[8] = kw; key.v[9] = stride[0];
    key.v[10] = stride[1]; key.v[11] = pad[0]; key.v[12] = pad[1]; key.v[13] = dil[0];
    key.v[14] = dil[1]; key.v[15] = grp;
    if (conv_algo_lookup(&key, &algos[0])) {
        nalgo = 1;
        remembered = 1;
    } else {
        int returned = 0;
        if (opjit_env_flag("OPJIT_CUDNN_FIND", 1)) {
            what = "cudnnFindConvolutionForwardAlgorithm";
            st = dnn.cudnnFindConvolutionForwardAlgorithm(h, d.x, d.w, d.c, d.y,
                                                          CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                          &returned, perf);
        } else {
            what = "cudnnGetConvolutionForwardAlgorithm_v7";
            st = dnn.cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.c, d.y,
                                                            CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                            &returned, perf);
        }
        if (st)
            goto cudnn_fail;
        for (i = 0; i < returned && nalgo < CUDNN_CONVOLUTION_FWD_ALGO_COUNT; i++)
            if (perf[i].status == CUDNN_STATUS_SUCCESS)
                algos[nalgo++] = perf[i].algo;
        if (!nalgo) /* the one that works for every shape */
            algos[nalgo++] = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    }

    st = CUDNN_STATUS_NOT_SUPPORTED;
    for (i = 0; i < nalgo; i++) {
        size_t wsize = 0;
        void *ws = NULL;
        what = "cudnnGetConvolutionForwardWorkspaceSize";
        st = dnn.cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.c, d.y, algos[i], &wsize);
        if (st)
            continue;
        if (wsize && !(ws = opjit_device_workspace(ctx, wsize))) {
            rc = -1; /* the runtime recorded why */
            goto done;
        }
        what = "cudnnConvolutionForward";
        st = dnn.cudnnConvolutionForward(h, is64 ? (void *)&one_d : (void *)&one_f, d.x,
                                         opjit_data(input), d.w, opjit_data(weight), d.c,
                                         algos[i], ws, wsize,
                                         is64 ? (void *)&zero_d : (void *)&zero_f, d.y,
                                         opjit_data(out));
        if (st == CUDNN_STATUS_SUCCESS) {
            if (!remembered)
                conv_algo_store(&key, algos[i]);
            break;
        }
    }
    if (st)
        goto cudnn_fail;
    if (bias)
        rc = conv_bias(ctx, is64, opjit_data(out), bias, N, O, plane, 0);
    goto done;

cudnn_fail:
    rc = opjit_fail(ctx, "%s: %s", what, dnn.cudnnGetErrorString(st));
done:
    conv_descs_free(&d);
    if (h)
        conv_handle_put(dev, h);
    return rc;
}

OPJIT_MODULE(conv2d_cuda, m)
{
    opjit_def(m, CONV2D_SCHEMA, OPJIT_CUDA, conv2d_cuda,
              "2-D convolution, NCHW (torch.nn.functional.conv2d) on CUDA through cuDNN");
    opjit_require(m, "input", "float32|float64 contiguous");
    opjit_require(m, "weight", "float32|float64 rank=4 contiguous");
    opjit_require(m, "bias", "float32|float64 rank=1 contiguous");
    conv2d_declare(m, 0);
}

#endif
