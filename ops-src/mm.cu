/*
 * mm.cu - matrix product on CUDA, the twin of mm.c (torch.mm semantics).
 *
 *   mm(Tensor self, Tensor mat2) -> Tensor
 *
 * self [n, k] times mat2 [k, m] gives a contiguous [n, m] of the same dtype,
 * float32 or float64, on the operands' device. Any strides work (a
 * transpose needs no copy); zero-size dimensions work (an empty product,
 * or zeros when k is 0).
 *
 * The kernel is the classic shared-memory tiling: a 256-thread block
 * computes a 64x64 tile of the result, each thread 4x4 values spread 16
 * apart (so the shared-memory reads of a warp hit distinct banks or one
 * broadcast word, and its stores are coalesced), walking k in slices of 16
 * that the block stages in shared memory (the A slice transposed, padded
 * by a column so its staging stores do not collide in one bank). Accumulation is in the operands'
 * dtype with fused multiply-adds, so results differ from the BLAS twin in
 * the last bits.
 */
#ifdef __CUDACC_RTC__

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

#include <opjit_op.h>
#include <limits.h>

#include "mm_common.h"

#define MM_TILE 64
#define MM_THREADS 256

static int mm_cuda(opjit_ctx *ctx, opjit_args *a)
{
    DLTensor *x = opjit_arg_tensor(a, 0);
    DLTensor *y = opjit_arg_tensor(a, 1);
    DLTensor *out;
    int64_t n, k, m, shape[2];
    long long sa0, sa1, sb0, sb1;
    int in, ik, im, is64, rc;
    void *pa, *pb, *pc;
    void *params[10];
    unsigned grid[3], block[3];

    if ((rc = mm_check(ctx, x, y, &is64, &n, &k, &m)) != 0)
        return rc;
    if (n > INT_MAX || k > INT_MAX || m > INT_MAX || (n + MM_TILE - 1) / MM_TILE > 65535)
        return opjit_fail(ctx, "dimensions too large for the CUDA kernel (%lldx%lld and "
                               "%lldx%lld; rows at most %d)",
                          (long long)n, (long long)k, (long long)k, (long long)m,
                          65535 * MM_TILE);
    shape[0] = n;
    shape[1] = m;
    out = opjit_output(ctx, 0, x->dtype, 2, shape);
    if (!out)
        return -1;
    if (n == 0 || m == 0)
        return 0;
    /* Element strides; DLPack's NULL strides mean row-major. */
    sa0 = x->strides ? x->strides[0] : k;
    sa1 = x->strides ? x->strides[1] : 1;
    sb0 = y->strides ? y->strides[0] : m;
    sb1 = y->strides ? y->strides[1] : 1;
    in = (int)n;
    ik = (int)k;
    im = (int)m;
    pa = opjit_data(x);
    pb = opjit_data(y);
    pc = opjit_data(out);
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

OPJIT_MODULE(mm_cuda, m)
{
    opjit_def(m, "mm(Tensor self, Tensor mat2) -> Tensor", OPJIT_CUDA, mm_cuda,
              "Matrix product [n,k] x [k,m] -> [n,m] on CUDA (shared-memory tiles)");
    opjit_require(m, "self", "float32|float64 rank=2");
    opjit_require(m, "mat2", "float32|float64 rank=2");
}

#endif
