/*
 * mm.cu - matrix product on CUDA, the twin of mm.c (torch.mm semantics).
 *
 *   mm(Tensor self, Tensor mat2) -> Tensor
 *
 *   mm_backward(Tensor grad, Tensor self, Tensor mat2, int[2] output_mask=1)
 *       -> (Tensor grad_self, Tensor grad_mat2)
 *
 * self [n, k] times mat2 [k, m] gives a contiguous [n, m] of the same dtype,
 * float32, float64, float16 or bfloat16, on the operands' device. The
 * 16-bit ones go to cuBLAS as they are, as torch.mm sends them
 * (cublasGemmEx: float16 or bfloat16 operands and result, float32
 * compute, CUBLAS_GEMM_DEFAULT_TENSOR_OP, the handle's default math mode:
 * tensor cores, and reduced-precision reductions allowed, torch's
 * defaults); where cuBLAS cannot serve them, or $OPJIT_MM_KERNEL=wide (or
 * own) says so, they are widened to float32 on the device
 * (half_wide_cuda.h), multiplied by the float32 path below and rounded
 * once at the end. Any strides work (a
 * transpose needs no copy); zero-size dimensions work (an empty product,
 * or zeros when k is 0). mm_backward's two products, grad mat2^T and
 * self^T grad, are the same products with the operands read transposed
 * (a view: strides swapped), each [0] when output_mask says so.
 *
 * What runs:
 *
 * - cuBLAS (cublasSgemm / cublasDgemm, the GEMMs torch.mm calls) when it
 *   is there and can express the operands: each one row-major or
 *   transposed (a unit stride in one dimension and the other at least the
 *   row length, within int range), and k > 0. The row-major product
 *   C = A B is computed as the column-major C^T = B^T A^T, on the call's
 *   stream, with CUBLAS_DEFAULT_MATH: float32 stays true FP32 (no TF32),
 *   like torch.mm by default. cuBLAS is taken at the first call by dlsym
 *   (where a GPU is, the runtime makes libcublas.so.13 global before
 *   loading .cu host code that mentions it, $OPJIT_CUBLAS_LIBRARY naming
 *   the exact file; else this file dlopens it by that name or soname), so
 *   the op loads and runs where it is missing. It is not used when the
 *   runtime's driver is not libcuda.so.1 (a stand-in for tests). Handles
 *   are kept per device for the life of the process, one per call in
 *   flight (cuda_handles.h), with cuBLAS's own workspace.
 *
 * - Otherwise the kernel below: other strides (broadcast, both
 *   non-unit), k == 0 (zeros), no cuBLAS, or a device where cuBLAS
 *   cannot start (its runtime finds no driver, an unsupported GPU). It is
 *   the classic shared-memory tiling: a 256-thread block computes a 64x64
 *   tile of the result, each thread 4x4 values spread 16 apart (so the
 *   shared-memory reads of a warp hit distinct banks or one broadcast
 *   word, and its stores are coalesced), walking k in slices of 16 that
 *   the block stages in shared memory (the A slice transposed, padded by a
 *   column so its staging stores do not collide in one bank).
 *
 * $OPJIT_MM_KERNEL=own forces the kernel below; =wide the float32 path
 * for 16-bit operands (cuBLAS's sgemm on the widened copies where it can,
 * to compare with the tensor-core product); =cublas makes a call that
 * cuBLAS cannot serve fail with the reason instead of falling back (both
 * read at every call, for tests and comparisons). Either way accumulation
 * is in the operands' dtype with fused multiply-adds, so results differ
 * from the BLAS twin in the last bits.
 */
#ifdef __CUDACC_RTC__

#include "half_wide_cuda.h"

#define MM_TILE 64
#define MM_K 16
#define MM_THREADS 256

template <typename T>
__device__ __forceinline__ void mm_body(int n, int m, int k, const T *__restrict__ A,
                                        long long sa0, long long sa1,
                                        const T *__restrict__ B, long long sb0,
                                        long long sb1, T *__restrict__ C,
                                        T (*As)[MM_TILE + 1], T (*Bs)[MM_TILE])
{
    const int t = threadIdx.x, tx = t % 16, ty = t / 16;
    const int r0 = blockIdx.y * MM_TILE, c0 = blockIdx.x * MM_TILE;
    T acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            acc[i][j] = 0;
    for (int k0 = 0; k0 < k; k0 += MM_K) {
        /* Stage A[r0.., k0..] transposed (As[kk][row]) and B[k0.., c0..]. */
        for (int q = 0; q < MM_TILE * MM_K / MM_THREADS; q++) {
            int e = t + q * MM_THREADS;
            int row = e / MM_K, kk = e % MM_K;
            int gr = r0 + row, gk = k0 + kk;
            As[kk][row] = gr < n && gk < k ? A[gr * sa0 + gk * sa1] : (T)0;
            int kb = e / MM_TILE, col = e % MM_TILE;
            int gkb = k0 + kb, gc = c0 + col;
            Bs[kb][col] = gkb < k && gc < m ? B[gkb * sb0 + gc * sb1] : (T)0;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < MM_K; kk++) {
            T av[4], bv[4];
            for (int i = 0; i < 4; i++)
                av[i] = As[kk][ty + 16 * i];
            for (int j = 0; j < 4; j++)
                bv[j] = Bs[kk][tx + 16 * j];
            for (int i = 0; i < 4; i++)
                for (int j = 0; j < 4; j++)
                    acc[i][j] += av[i] * bv[j];
        }
        __syncthreads();
    }
    for (int i = 0; i < 4; i++) {
        int r = r0 + ty + 16 * i;
        if (r >= n)
            continue;
        for (int j = 0; j < 4; j++) {
            int c = c0 + tx + 16 * j;
            if (c < m)
                C[(long long)r * m + c] = acc[i][j];
        }
    }
}

extern "C" __global__ void __launch_bounds__(MM_THREADS)
    mm_f32(int n, int m, int k, const float *A, long long sa0, long long sa1, const float *B,
           long long sb0, long long sb1, float *C)
{
    __shared__ float As[MM_K][MM_TILE + 1], Bs[MM_K][MM_TILE];
    mm_body<float>(n, m, k, A, sa0, sa1, B, sb0, sb1, C, As, Bs);
}

extern "C" __global__ void __launch_bounds__(MM_THREADS)
    mm_f64(int n, int m, int k, const double *A, long long sa0, long long sa1, const double *B,
           long long sb0, long long sb1, double *C)
{
    __shared__ double As[MM_K][MM_TILE + 1], Bs[MM_K][MM_TILE];
    mm_body<double>(n, m, k, A, sa0, sa1, B, sb0, sb1, C, As, Bs);
}

#else /* the host half, compiled by libtcc */

#define _GNU_SOURCE /* RTLD_DEFAULT */
#include <opjit_op.h>
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_handles.h"
#include "half_wide_cuda.h"
#include "mm_common.h"
#include "mm_decl.h"

#define MM_TILE 64
#define MM_THREADS 256

/* ---- cuBLAS, resolved at the first call --------------------------------- */

/* The little of cublas_api.h this file needs, so that it builds without
 * cuBLAS's headers: enums are ints, a handle is a pointer. */
enum {
    MM_CUBLAS_SUCCESS = 0,
    MM_CUBLAS_NOT_INITIALIZED = 1,
    MM_CUBLAS_ARCH_MISMATCH = 8,
    MM_CUBLAS_NOT_SUPPORTED = 15,
    MM_CUBLAS_OP_N = 0,
    MM_CUBLAS_OP_T = 1,
    MM_CUBLAS_DEFAULT_MATH = 0,
    MM_CUDA_R_16F = 2,
    MM_CUDA_R_16BF = 14,
    MM_CUBLAS_COMPUTE_32F = 68,
    MM_CUBLAS_GEMM_DEFAULT_TENSOR_OP = 99
};

static const char *mm_cublas_status(int st)
{
    static const struct {
        int st;
        const char *name;
    } names[] = {
        {0, "CUBLAS_STATUS_SUCCESS"},          {1, "CUBLAS_STATUS_NOT_INITIALIZED"},
        {3, "CUBLAS_STATUS_ALLOC_FAILED"},     {7, "CUBLAS_STATUS_INVALID_VALUE"},
        {8, "CUBLAS_STATUS_ARCH_MISMATCH"},    {11, "CUBLAS_STATUS_MAPPING_ERROR"},
        {13, "CUBLAS_STATUS_EXECUTION_FAILED"}, {14, "CUBLAS_STATUS_INTERNAL_ERROR"},
        {15, "CUBLAS_STATUS_NOT_SUPPORTED"},   {16, "CUBLAS_STATUS_LICENSE_ERROR"},
    };
    size_t i;
    for (i = 0; i < sizeof names / sizeof *names; i++)
        if (names[i].st == st)
            return names[i].name;
    return "an unknown cuBLAS status";
}

static struct {
    int state; /* 0 not tried, 1 ready, -1 unavailable */
    char why[512];
    int (*create)(void **handle);
    int (*destroy)(void *handle);
    int (*set_stream)(void *handle, void *stream);
    int (*set_math_mode)(void *handle, int mode);
    int (*sgemm)(void *handle, int transa, int transb, int m, int n, int k, const float *alpha,
                 const float *A, int lda, const float *B, int ldb, const float *beta, float *C,
                 int ldc);
    int (*dgemm)(void *handle, int transa, int transb, int m, int n, int k, const double *alpha,
                 const double *A, int lda, const double *B, int ldb, const double *beta,
                 double *C, int ldc);
    int (*gemm_ex)(void *handle, int transa, int transb, int m, int n, int k, const void *alpha,
                   const void *A, int atype, int lda, const void *B, int btype, int ldb,
                   const void *beta, void *C, int ctype, int ldc, int compute, int algo);
    /* Devices where cuBLAS cannot start, and why (the first one). */
    char dead[HANDLE_POOL_DEVICES];
    char dead_why[256];
} blas;
static pthread_mutex_t blas_lock = PTHREAD_MUTEX_INITIALIZER;
static handle_pool blas_handles = HANDLE_POOL_INIT;

static void mm_why(const char *what, const char *detail)
{
    snprintf(blas.why, sizeof blas.why, "%s%s", what, detail ? detail : "");
}

/* 1 when cuBLAS is ready, -1 (blas.why says why) when it cannot be. */
static int mm_cublas_load(void)
{
    static const char *const names[] = {"libcublas.so.13", "libcublas.so.12", "libcublas.so",
                                        NULL};
    static const char *const syms[] = {"cublasCreate_v2", "cublasDestroy_v2",
                                       "cublasSetStream_v2", "cublasSetMathMode",
                                       "cublasSgemm_v2", "cublasDgemm_v2", "cublasGemmEx"};
    void *fns[7];
    void *h = RTLD_DEFAULT;
    const char *lib;
    int i;
    pthread_mutex_lock(&blas_lock);
    if (blas.state) {
        pthread_mutex_unlock(&blas_lock);
        return blas.state;
    }
    /* cuBLAS drives the GPU through libcuda.so.1, which its runtime loads
     * by that name: where calls run on another driver library
     * ($OPJIT_CUDA_DRIVER: the tests' stand-in), it would not see their
     * contexts and memory. */
    if (!(h = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD))) {
        mm_why("the CUDA driver in use is not libcuda.so.1, which cuBLAS runs on", NULL);
        blas.state = -1;
        pthread_mutex_unlock(&blas_lock);
        return -1;
    }
    dlclose(h);
    h = RTLD_DEFAULT;
    /* Normally the runtime made it global before loading this file. */
    if (!dlsym(RTLD_DEFAULT, "cublasCreate_v2")) {
        lib = getenv("OPJIT_CUBLAS_LIBRARY");
        if (lib && *lib) {
            h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
        } else {
            h = NULL;
            for (i = 0; !h && names[i]; i++)
                h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
        }
        if (!h) {
            const char *e = dlerror();
            mm_why(e ? e : "libcublas.so.13 not found", NULL);
            blas.state = -1;
            pthread_mutex_unlock(&blas_lock);
            return -1;
        }
    }
    for (i = 0; i < 7; i++)
        if (!(fns[i] = dlsym(h, syms[i]))) {
            mm_why("libcublas lacks ", syms[i]);
            blas.state = -1;
            pthread_mutex_unlock(&blas_lock);
            return -1;
        }
    memcpy(&blas.create, &fns[0], sizeof fns[0]);
    memcpy(&blas.destroy, &fns[1], sizeof fns[1]);
    memcpy(&blas.set_stream, &fns[2], sizeof fns[2]);
    memcpy(&blas.set_math_mode, &fns[3], sizeof fns[3]);
    memcpy(&blas.sgemm, &fns[4], sizeof fns[4]);
    memcpy(&blas.dgemm, &fns[5], sizeof fns[5]);
    memcpy(&blas.gemm_ex, &fns[6], sizeof fns[6]);
    blas.state = 1;
    pthread_mutex_unlock(&blas_lock);
    return 1;
}

/* cuBLAS cannot run on dev in this process (a failure that calling again
 * will not cure): the kernel of this file from now on. */
static void mm_cublas_dead(int dev, const char *what, int st)
{
    pthread_mutex_lock(&blas_lock);
    if (!blas.dead_why[0])
        snprintf(blas.dead_why, sizeof blas.dead_why, "%s: %s", what, mm_cublas_status(st));
    blas.dead[dev] = 1;
    pthread_mutex_unlock(&blas_lock);
}

/* A handle of dev for this call: 0, or the status of cublasCreate or
 * cublasSetMathMode (then *h is NULL). */
static int mm_handle_get(int dev, void **h, const char **what)
{
    int st;
    *h = handle_pool_take(&blas_handles, dev);
    if (*h)
        return 0;
    *what = "cublasCreate";
    if ((st = blas.create(h)) != MM_CUBLAS_SUCCESS) { /* in the call's context */
        *h = NULL;
        return st;
    }
    /* FP32 stays FP32: no TF32, whatever the library's default becomes. */
    *what = "cublasSetMathMode";
    if ((st = blas.set_math_mode(*h, MM_CUBLAS_DEFAULT_MATH)) != MM_CUBLAS_SUCCESS) {
        blas.destroy(*h);
        *h = NULL;
    }
    return st;
}

/* ---- the op ---------------------------------------------------------------- */

static int mm_own(opjit_ctx *ctx, int is64, int64_t n, int64_t k, int64_t m, void *pa,
                  long long sa0, long long sa1, void *pb, long long sb0, long long sb1, void *pc)
{
    int in = (int)n, ik = (int)k, im = (int)m;
    void *params[10];
    unsigned grid[3], block[3];
    params[0] = &in;
    params[1] = &im;
    params[2] = &ik;
    params[3] = &pa;
    params[4] = &sa0;
    params[5] = &sa1;
    params[6] = &pb;
    params[7] = &sb0;
    params[8] = &sb1;
    params[9] = &pc;
    grid[0] = (unsigned)((m + MM_TILE - 1) / MM_TILE);
    grid[1] = (unsigned)((n + MM_TILE - 1) / MM_TILE);
    grid[2] = 1;
    block[0] = MM_THREADS;
    block[1] = block[2] = 1;
    return opjit_launch(ctx, is64 ? "mm_f64" : "mm_f32", grid, block, 0, params);
}

/* Whether cuBLAS serves this call: 1 with a handle of dev in *h, or 0
 * with the reason in no. */
static int mm_use_cublas(int dev, void **h, char *no, size_t len)
{
    const char *what = "";
    int st, dead;
    *h = NULL;
    if (!handle_pool_has_device(dev)) {
        snprintf(no, len, "CUDA device %d is beyond this op's table", dev);
        return 0;
    }
    if (mm_cublas_load() < 0) {
        snprintf(no, len, "cuBLAS is not available: %s", blas.why);
        return 0;
    }
    pthread_mutex_lock(&blas_lock);
    dead = blas.dead[dev];
    if (dead)
        snprintf(no, len, "cuBLAS cannot start on device %d: %s", dev, blas.dead_why);
    pthread_mutex_unlock(&blas_lock);
    if (dead)
        return 0;
    if ((st = mm_handle_get(dev, h, &what)) != MM_CUBLAS_SUCCESS) {
        if (st == MM_CUBLAS_NOT_INITIALIZED || st == MM_CUBLAS_ARCH_MISMATCH)
            mm_cublas_dead(dev, what, st);
        snprintf(no, len, "%s: %s", what, mm_cublas_status(st));
        return 0;
    }
    return 1;
}

/* How this call is served: 0 auto, 1 this file's kernel, 2 cuBLAS, 3
 * 16-bit operands widened to float32 ($OPJIT_MM_KERNEL), or -1 with the
 * error recorded. */
static int mm_want(opjit_ctx *ctx)
{
    const char *env = getenv("OPJIT_MM_KERNEL");
    if (!env || !*env)
        return 0;
    if (!strcmp(env, "own"))
        return 1;
    if (!strcmp(env, "cublas"))
        return 2;
    if (!strcmp(env, "wide"))
        return 3;
    opjit_fail(ctx, "OPJIT_MM_KERNEL is '%s': expected own, cublas, wide or nothing", env);
    return -1;
}

/* out [n, m] (dense, on the device) = x [n, k] y [k, m], x and y of any
 * strides: cuBLAS where it can read them, else the kernel above. 0, or
 * the status of opjit_fail. */
static int mm_product(opjit_ctx *ctx, int is64, int want, int64_t n, int64_t k, int64_t m,
                      const DLTensor *x, const DLTensor *y, void *out)
{
    long long sa0, sa1, sb0, sb1;
    int64_t lda, ldb;
    int rc = 0, st, dev, xt = 0, yt = 0, blas_ok = 0;
    const char *what;
    char no[400];
    void *h = NULL;
    float one_f = 1.0f, zero_f = 0.0f;
    double one_d = 1.0, zero_d = 0.0;

    /* Element strides; DLPack's NULL strides mean row-major. */
    sa0 = x->strides ? x->strides[0] : k;
    sa1 = x->strides ? x->strides[1] : 1;
    sb0 = y->strides ? y->strides[0] : m;
    sb1 = y->strides ? y->strides[1] : 1;
    dev = opjit_device_id(ctx);
    if (n == 0 || m == 0)
        return 0;
    /* cuBLAS, unless something rules it out. */
    no[0] = '\0';
    if (k == 0)
        ; /* nothing to multiply: the kernel below writes the zeros */
    else if (want == 1)
        snprintf(no, sizeof no, "OPJIT_MM_KERNEL=own");
    else if (!mm_layout(x, &xt, &lda) || !mm_layout(y, &yt, &ldb) || lda > INT_MAX ||
             ldb > INT_MAX)
        snprintf(no, sizeof no, "operand strides cuBLAS cannot express (self %lld, %lld; "
                                "mat2 %lld, %lld)", sa0, sa1, sb0, sb1);
    else
        blas_ok = mm_use_cublas(dev, &h, no, sizeof no);
    if (want == 2 && no[0])
        return opjit_fail(ctx, "OPJIT_MM_KERNEL=cublas, but cuBLAS cannot serve this call: %s",
                          no);
    if (!blas_ok && (n + MM_TILE - 1) / MM_TILE > 65535)
        return opjit_fail(ctx, "dimensions too large for the CUDA kernel (%lldx%lld and "
                               "%lldx%lld; rows at most %d without cuBLAS)",
                          (long long)n, (long long)k, (long long)k, (long long)m,
                          65535 * MM_TILE);
    if (!blas_ok)
        return mm_own(ctx, is64, n, k, m, opjit_data(x), sa0, sa1, opjit_data(y), sb0, sb1, out);

    /* C [n, m] row-major is C^T [m, n] column-major: C^T = B^T A^T, where a
     * row-major operand is, to cuBLAS, its own transpose already. */
    what = "cublasSetStream";
    if ((st = blas.set_stream(h, opjit_stream(ctx))) != MM_CUBLAS_SUCCESS)
        goto blas_fail;
    what = is64 ? "cublasDgemm" : "cublasSgemm";
    if (is64)
        st = blas.dgemm(h, yt ? MM_CUBLAS_OP_T : MM_CUBLAS_OP_N,
                        xt ? MM_CUBLAS_OP_T : MM_CUBLAS_OP_N, (int)m, (int)n, (int)k, &one_d,
                        opjit_data(y), (int)ldb, opjit_data(x), (int)lda, &zero_d, out, (int)m);
    else
        st = blas.sgemm(h, yt ? MM_CUBLAS_OP_T : MM_CUBLAS_OP_N,
                        xt ? MM_CUBLAS_OP_T : MM_CUBLAS_OP_N, (int)m, (int)n, (int)k, &one_f,
                        opjit_data(y), (int)ldb, opjit_data(x), (int)lda, &zero_f, out, (int)m);
    if (st == MM_CUBLAS_SUCCESS)
        goto done;
    if ((st == MM_CUBLAS_ARCH_MISMATCH || st == MM_CUBLAS_NOT_SUPPORTED) && want != 2 &&
        (n + MM_TILE - 1) / MM_TILE <= 65535) {
        /* Nothing ran: this file's kernel instead. */
        if (st == MM_CUBLAS_ARCH_MISMATCH)
            mm_cublas_dead(dev, what, st);
        rc = mm_own(ctx, is64, n, k, m, opjit_data(x), sa0, sa1, opjit_data(y), sb0, sb1, out);
        goto done;
    }
blas_fail:
    rc = opjit_fail(ctx, "%s: %s", what, mm_cublas_status(st));
done:
    handle_pool_give(&blas_handles, dev, h);
    return rc;
}

static int mm_sizes_ok(opjit_ctx *ctx, int64_t n, int64_t k, int64_t m)
{
    if (n > INT_MAX || k > INT_MAX || m > INT_MAX)
        return opjit_fail(ctx, "dimensions too large for the CUDA kernels (%lldx%lld and "
                               "%lldx%lld; each at most %d)",
                          (long long)n, (long long)k, (long long)k, (long long)m, INT_MAX);
    return 0;
}

/* out [n, m] = x [n, k] y [k, m] in float16 or bfloat16 (kind) on
 * cublasGemmEx, as torch.mm does it: 1 when cuBLAS took the call (*rc its
 * status), 0 when it cannot (the reason in no). */
static int mm_half_gemm(opjit_ctx *ctx, int kind, int64_t n, int64_t k, int64_t m,
                        const DLTensor *x, const DLTensor *y, void *out, int *rc, char *no,
                        size_t len)
{
    int64_t lda, ldb;
    int xt = 0, yt = 0, st, dev = opjit_device_id(ctx), ty = kind == HWC_F16 ? MM_CUDA_R_16F
                                                                             : MM_CUDA_R_16BF;
    float one = 1.0f, zero = 0.0f;
    const char *what = "cublasSetStream";
    void *h = NULL;
    if (k == 0 || !mm_layout(x, &xt, &lda) || !mm_layout(y, &yt, &ldb) || lda > INT_MAX ||
        ldb > INT_MAX) {
        snprintf(no, len, k == 0 ? "k is 0" : "operand strides cuBLAS cannot express");
        return 0;
    }
    if (!mm_use_cublas(dev, &h, no, len))
        return 0;
    /* C^T = B^T A^T column-major, as mm_product */
    if ((st = blas.set_stream(h, opjit_stream(ctx))) == MM_CUBLAS_SUCCESS) {
        what = "cublasGemmEx";
        st = blas.gemm_ex(h, yt ? MM_CUBLAS_OP_T : MM_CUBLAS_OP_N,
                          xt ? MM_CUBLAS_OP_T : MM_CUBLAS_OP_N, (int)m, (int)n, (int)k, &one,
                          opjit_data(y), ty, (int)ldb, opjit_data(x), ty, (int)lda, &zero, out,
                          ty, (int)m, MM_CUBLAS_COMPUTE_32F, MM_CUBLAS_GEMM_DEFAULT_TENSOR_OP);
    }
    handle_pool_give(&blas_handles, dev, h);
    if (st == MM_CUBLAS_ARCH_MISMATCH || st == MM_CUBLAS_NOT_SUPPORTED) {
        /* nothing ran (bfloat16 before sm_80, say): widen instead */
        snprintf(no, len, "%s: %s", what, mm_cublas_status(st));
        return 0;
    }
    *rc = st == MM_CUBLAS_SUCCESS ? 0 : opjit_fail(ctx, "%s: %s", what, mm_cublas_status(st));
    return 1;
}

/* out [n, m] = x [n, k] y [k, m] in float16 or bfloat16 (kind), x and y
 * of any strides: mm_half_gemm, else (or with want 1 or 3) the operands
 * widened to dense float32, the float32 product, rounded once into out. */
static int mm_cuda_half(opjit_ctx *ctx, int kind, int want, int64_t n, int64_t k, int64_t m,
                        const DLTensor *x, const DLTensor *y, void *out)
{
    DLTensor xw, yw;
    void *o;
    int rc;
    char no[400];
    if (n == 0 || m == 0)
        return 0;
    if (want != 1 && want != 3 &&
        mm_half_gemm(ctx, kind, n, k, m, x, y, out, &rc, no, sizeof no))
        return rc;
    if (want == 2 && k != 0)
        return opjit_fail(ctx, "OPJIT_MM_KERNEL=cublas, but cuBLAS cannot serve this call: %s",
                          no);
    if (hwc_widen(ctx, kind, x, &xw) || hwc_widen(ctx, kind, y, &yw) ||
        !(o = hwc_scratch(ctx, n * m)))
        return -1;
    if ((rc = mm_product(ctx, 0, want == 3 ? 0 : want, n, k, m, &xw, &yw, o)) != 0)
        return rc;
    return hwc_narrow(ctx, kind, o, out, n * m);
}

static int mm_cuda(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    DLTensor *y = opjit_arg_tensor(a, 1);
    DLTensor *out;
    int64_t n, k, m, shape[2];
    int is64, rc, want;

    if ((rc = mm_check(ctx, x, y, &is64, &n, &k, &m)) != 0)
        return rc;
    if ((want = mm_want(ctx)) < 0)
        return -1;
    if ((rc = mm_sizes_ok(ctx, n, k, m)) != 0)
        return rc;
    shape[0] = n;
    shape[1] = m;
    if (!(out = opjit_output(ctx, 0, x->dtype, 2, shape)))
        return -1;
    if (hwc_kind(x->dtype))
        return mm_cuda_half(ctx, hwc_kind(x->dtype), want, n, k, m, x, y, opjit_data(out));
    return mm_product(ctx, is64, want, n, k, m, x, y, opjit_data(out));
}

/* The transpose of the 2-D t as a view: shape and strides swapped. */
static DLTensor mm_t(const DLTensor *t, int64_t shape[2], int64_t strides[2])
{
    DLTensor v = *t;
    shape[0] = t->shape[1];
    shape[1] = t->shape[0];
    strides[0] = t->strides ? t->strides[1] : 1;
    strides[1] = t->strides ? t->strides[0] : t->shape[1];
    v.shape = shape;
    v.strides = strides;
    return v;
}

/* Output index of mm_backward, [rows, cols] when wanted, else [0], its
 * data into *data. 0, or -1 with the error recorded. */
static int mm_grad_output(opjit_ctx *ctx, int index, DLDataType dt, int want, int64_t rows,
                          int64_t cols, void **data)
{
    int64_t shape[2] = {rows, cols}, none = 0;
    DLTensor *t = want ? opjit_output(ctx, index, dt, 2, shape)
                       : opjit_output(ctx, index, dt, 1, &none);
    *data = t ? opjit_data(t) : NULL;
    return t ? 0 : -1;
}

static int mm_backward_cuda(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *g = opjit_arg_tensor(a, 0);
    DLTensor *x = opjit_arg_tensor(a, 1);
    DLTensor *y = opjit_arg_tensor(a, 2);
    DLTensor xt, yt;
    int64_t n, k, m, xs[2], xst[2], ys[2], yst[2];
    int is64, rc, want, grads[2], kind;
    void *gx, *gy;

    if ((rc = mm_check(ctx, x, y, &is64, &n, &k, &m)) != 0 ||
        (rc = mm_grad_check(ctx, a, g, x, n, m, grads)) != 0)
        return rc;
    if ((want = mm_want(ctx)) < 0)
        return -1;
    if ((rc = mm_sizes_ok(ctx, n, k, m)) != 0)
        return rc;
    if (mm_grad_output(ctx, 0, x->dtype, grads[0], n, k, &gx) ||
        mm_grad_output(ctx, 1, x->dtype, grads[1], k, m, &gy))
        return -1;
    xt = mm_t(x, xs, xst);
    yt = mm_t(y, ys, yst);
    if ((kind = hwc_kind(x->dtype)) != 0) { /* the products of mm, in half */
        if (grads[0] && (rc = mm_cuda_half(ctx, kind, want, n, m, k, g, &yt, gx)) != 0)
            return rc;
        return grads[1] ? mm_cuda_half(ctx, kind, want, k, n, m, &xt, g, gy) : 0;
    }
    /* grad_self [n, k] = grad [n, m] mat2^T [m, k] */
    if (grads[0] && (rc = mm_product(ctx, is64, want, n, m, k, g, &yt, gx)) != 0)
        return rc;
    /* grad_mat2 [k, m] = self^T [k, n] grad [n, m] */
    if (grads[1] && (rc = mm_product(ctx, is64, want, k, n, m, &xt, g, gy)) != 0)
        return rc;
    return 0;
}

OPJIT_MODULE(m)
{
    opjit_def(m, "mm(Tensor self, Tensor mat2) -> Tensor", OPJIT_CUDA, mm_cuda,
              "Matrix product [n,k] x [k,m] -> [n,m] on CUDA (cuBLAS, else shared-memory "
              "tiles)");
    opjit_require(m, "self", "floating rank=2");
    opjit_require(m, "mat2", "floating rank=2");
    opjit_def(m, MM_BACKWARD_SCHEMA, OPJIT_CUDA, mm_backward_cuda,
              "Gradients of mm on CUDA: grad mat2^T and self^T grad (cuBLAS, else "
              "shared-memory tiles)");
    opjit_require(m, "grad", "floating rank=2");
    opjit_require(m, "self", "floating rank=2");
    opjit_require(m, "mat2", "floating rank=2");
    mm_declare(m);
}

#endif
