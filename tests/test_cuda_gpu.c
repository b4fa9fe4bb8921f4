/* tests/test_cuda_gpu.c - every CUDA op against its CPU twin, on a real GPU,
 * on random inputs from empty to large and adversarial (NaN/Inf boxes): nms
 * must agree exactly, mm and conv2d within floating-point tolerance (conv2d
 * on cuDNN's graph API and on its legacy one); float16 and bfloat16 calls of
 * mm, conv2d and their gradients against the CPU twin;
 * opjit_tensor_to_device round trips keep every byte. Also: the PTX
 * fallback (a runtime whose cache has only compute_XX device code), a
 * host-provided stream (opjit_set_cuda_stream) whose queued work the op
 * must wait for, several threads calling CUDA ops at once, and device
 * memory stable over 10,000 calls.
 *
 * OPJIT_GPU_QUICK=1 runs one small call of each op, forward and backward,
 * in each dtype, and nothing else: what scripts/gpu-check runs under
 * compute-sanitizer.
 *
 * Skips (exit 77) where no GPU is, saying that GPU execution went untested.
 * Device memory for inputs comes straight from the driver (dlopened here
 * too); the runtime and the test share the device's primary context.
 *
 * Under AddressSanitizer the CUDA driver needs protect_shadow_gap=0: the
 * default options below say so (ASAN_OPTIONS adds to them). */
#include <dlfcn.h>
#include <pthread.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "opjit.h"
#include "runtime/cuda.h"
#include "t.h"

const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "protect_shadow_gap=0"; }

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

static struct {
    void *dl;
    void *ctx;
    CUresult (*retain)(void **, int);
    CUresult (*release)(int);
    CUresult (*push)(void *);
    CUresult (*pop)(void **);
    CUresult (*alloc)(CUdeviceptr *, size_t);
    CUresult (*free_)(CUdeviceptr);
    CUresult (*htod)(CUdeviceptr, const void *, size_t);
    CUresult (*dtoh)(void *, CUdeviceptr, size_t);
    CUresult (*sync)(void);
    CUresult (*stream_create)(void **, unsigned);
    CUresult (*stream_destroy)(void *);
    CUresult (*stream_sync)(void *);
    CUresult (*host_func)(void *, void (*)(void *), void *);
    CUresult (*memset32)(CUdeviceptr, unsigned, size_t, void *);
    CUresult (*mem_info)(size_t *, size_t *);
} cu;

static int cu_open(void)
{
    const char *path = getenv("OPJIT_CUDA_DRIVER");
    cu.dl = dlopen(path && *path ? path : "libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu.dl)
        return 0;
    *(void **)&cu.retain = dlsym(cu.dl, "cuDevicePrimaryCtxRetain");
    *(void **)&cu.release = dlsym(cu.dl, "cuDevicePrimaryCtxRelease_v2");
    *(void **)&cu.push = dlsym(cu.dl, "cuCtxPushCurrent_v2");
    *(void **)&cu.pop = dlsym(cu.dl, "cuCtxPopCurrent_v2");
    *(void **)&cu.alloc = dlsym(cu.dl, "cuMemAlloc_v2");
    *(void **)&cu.free_ = dlsym(cu.dl, "cuMemFree_v2");
    *(void **)&cu.htod = dlsym(cu.dl, "cuMemcpyHtoD_v2");
    *(void **)&cu.dtoh = dlsym(cu.dl, "cuMemcpyDtoH_v2");
    *(void **)&cu.sync = dlsym(cu.dl, "cuCtxSynchronize");
    *(void **)&cu.stream_create = dlsym(cu.dl, "cuStreamCreate");
    *(void **)&cu.stream_destroy = dlsym(cu.dl, "cuStreamDestroy_v2");
    *(void **)&cu.stream_sync = dlsym(cu.dl, "cuStreamSynchronize");
    *(void **)&cu.host_func = dlsym(cu.dl, "cuLaunchHostFunc");
    *(void **)&cu.memset32 = dlsym(cu.dl, "cuMemsetD32Async");
    *(void **)&cu.mem_info = dlsym(cu.dl, "cuMemGetInfo_v2");
    if (!cu.retain || !cu.push || !cu.alloc || !cu.htod || !cu.dtoh || !cu.sync ||
        !cu.stream_create || !cu.stream_destroy || !cu.stream_sync || !cu.host_func ||
        !cu.memset32 || !cu.mem_info)
        return 0;
    /* cuInit ran in the runtime (cuda_available); keep the context current
     * on this thread for the test's own copies. */
    return cu.retain(&cu.ctx, 0) == 0 && cu.push(cu.ctx) == 0;
}

static void *dev_copy(const void *host, size_t n)
{
    CUdeviceptr p = 0;
    CHECK(cu.alloc(&p, n ? n : 1) == 0);
    if (n)
        CHECK(cu.htod(p, host, n) == 0);
    return (void *)(uintptr_t)p;
}

static void dev_free(void *p) { cu.free_((CUdeviceptr)(uintptr_t)p); }

/* The output's data on the host (malloc'd). */
static void *host_copy(const DLManagedTensor *t, size_t elem)
{
    size_t n = elem;
    for (int i = 0; i < t->dl_tensor.ndim; i++)
        n *= (size_t)t->dl_tensor.shape[i];
    void *h = malloc(n ? n : 1);
    CHECK(cu.sync() == 0);
    if (n)
        CHECK(cu.dtoh(h, (CUdeviceptr)(uintptr_t)t->dl_tensor.data, n) == 0);
    return h;
}

static DLTensor tensor(void *data, int dltype, DLDataType dt, int ndim, int64_t *shape)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = dltype;
    t.ndim = ndim;
    t.dtype = dt;
    t.shape = shape;
    return t;
}

static _Thread_local unsigned long long rng = 0x9E3779B97F4A7C15ull;
static double urand(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (double)(rng >> 11) / 9007199254740992.0;
}

static const char *ops_dir(void)
{
    static char d[1024];
    const char *src = getenv("OPJIT_SOURCE_DIR");
    snprintf(d, sizeof d, "%s/ops-src", src ? src : ".");
    return d;
}

static opjit_runtime *rt;

static opjit_op *load_pair(const char *name)
{
    char p[2048];
    opjit_op *a = NULL, *b = NULL;
    snprintf(p, sizeof p, "%s/%s.c", ops_dir(), name);
    int rc = opjit_load_file(rt, p, &a, NULL);
    CHECKF(rc == OPJIT_OK, "%s: %s", p, opjit_errmsg(rt));
    snprintf(p, sizeof p, "%s/%s.cu", ops_dir(), name);
    rc = opjit_load_file(rt, p, &b, NULL);
    CHECKF(rc == OPJIT_OK, "%s: %s", p, opjit_errmsg(rt));
    return a == b ? a : NULL;
}

/* ---- nms: exact agreement ------------------------------------------------------ */

static void nms_case(opjit_op *op, int n, int is64, double thr, int mode)
{
    size_t esz = is64 ? 8 : 4;
    char *boxes = malloc((size_t)n * 4 * esz + 8), *scores = malloc((size_t)n * esz + 8);
    for (int i = 0; i < n; i++) {
        double span = mode == 4 ? 2000 : 100;
        double x = urand() * span, y = urand() * span, w = urand() * 30, h = urand() * 30;
        double v[4] = {x, y, x + w, y + h}, sc = urand();
        if (mode == 1)
            sc = (double)(int)(urand() * 4);
        if (mode == 2 && i % 7 == 0)
            sc = NAN;
        if (mode == 2 && i % 11 == 0)
            v[2] = v[0];
        if (mode == 3 && i % 2)
            v[0] = 10, v[1] = 10, v[2] = 40, v[3] = 40;
        if (mode == 5) { /* adversarial coordinates */
            static const double bad[] = {NAN, INFINITY, -INFINITY, -5, 1e30, -1e30};
            if (i % 3 == 0)
                v[(i / 3) % 4] = bad[(i / 12) % 6];
            if (i % 5 == 0)
                v[2] = v[0] - 3; /* negative width */
            if (i % 13 == 0)
                sc = (i / 13) % 2 ? INFINITY : -INFINITY;
        }
        if (mode == 6) { /* a detector's output: clusters of jittered boxes */
            double cx = 50 + 900 * ((i / 40) % 25) / 25.0, cy = 50 + 900 * ((i / 1000) % 25) / 25.0;
            double s = 20 + 60 * urand();
            x = cx + 8 * (urand() - 0.5), y = cy + 8 * (urand() - 0.5);
            v[0] = x, v[1] = y, v[2] = x + s, v[3] = y + s * (0.5 + urand());
        }
        for (int k = 0; k < 4; k++)
            is64 ? (((double *)boxes)[4 * i + k] = v[k]) : (((float *)boxes)[4 * i + k] = (float)v[k]);
        is64 ? (((double *)scores)[i] = sc) : (((float *)scores)[i] = (float)sc);
    }
    int64_t bs[2] = {n, 4}, ss[1] = {n};
    DLDataType dt = {kDLFloat, (uint8_t)(esz * 8), 1};
    DLTensor hb = tensor(boxes, kDLCPU, dt, 2, bs), hs = tensor(scores, kDLCPU, dt, 1, ss);
    void *db = dev_copy(boxes, (size_t)n * 4 * esz), *dsc = dev_copy(scores, (size_t)n * esz);
    DLTensor gb = tensor(db, kDLCUDA, dt, 2, bs), gs = tensor(dsc, kDLCUDA, dt, 1, ss);
    opjit_value ha[3] = {opjit_tensor(&hb), opjit_tensor(&hs), opjit_float(thr)};
    opjit_value ga[3] = {opjit_tensor(&gb), opjit_tensor(&gs), opjit_float(thr)};
    DLManagedTensor *ho = NULL, *go = NULL;
    int rc = opjit_call(rt, op, ha, 3, &ho, 1);
    CHECKF(rc == OPJIT_OK, "cpu nms: %s", opjit_errmsg(rt));
    rc = opjit_call(rt, op, ga, 3, &go, 1);
    CHECKF(rc == OPJIT_OK, "cuda nms n=%d: %s", n, opjit_errmsg(rt));
    if (ho && go) {
        CHECK(go->dl_tensor.device.device_type == kDLCUDA);
        int64_t *g = host_copy(go, 8);
        int64_t nh = ho->dl_tensor.shape[0], ng = go->dl_tensor.shape[0];
        CHECKF(nh == ng && !memcmp(ho->dl_tensor.data, g, (size_t)nh * 8),
               "nms n=%d f%d thr=%g mode %d: cpu keeps %lld, cuda %lld", n, is64 ? 64 : 32, thr,
               mode, (long long)nh, (long long)ng);
        free(g);
    }
    if (ho)
        ho->deleter(ho);
    if (go)
        go->deleter(go);
    dev_free(db);
    dev_free(dsc);
    free(boxes);
    free(scores);
}

static void nms_matches_cpu(void)
{
    opjit_op *op = load_pair("nms");
    if (!op)
        return;
    static const double thrs[] = {0.5, 0.0, 0.7, -0.25, 1.0, NAN};
    static const int sizes[] = {0, 1, 2, 63, 64, 65, 129, 1000, 5000};
    for (int is64 = 0; is64 < 2; is64++)
        for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++)
            for (size_t ti = 0; ti < sizeof thrs / sizeof *thrs; ti++)
                nms_case(op, sizes[si], is64, thrs[ti], (int)(si + ti) % 4);
    nms_case(op, 30000, 0, 0.5, 4); /* large and sparse */
    nms_case(op, 20000, 1, 0.3, 0);
    nms_case(op, 100000, 0, 0.5, 4); /* 100k boxes: 1563 mask tiles, removed set in global memory */
    nms_case(op, 100000, 0, 0.7, 0);
    for (int is64 = 0; is64 < 2; is64++) {
        nms_case(op, 10000, is64, 0.5, 6); /* clustered, detector-like */
        nms_case(op, 2000, is64, 0.5, 5);  /* NaN / Inf / negative-size boxes */
        nms_case(op, 2000, is64, 0.0, 5);
        nms_case(op, 4097, is64, 0.3, 2);  /* NaN scores, degenerate boxes */
    }
}

/* ---- mm and conv2d: within tolerance ----------------------------------------------- */

/* float16 and bfloat16 bits of exactly representable normal values (or
 * zero), and back: what half_case's inputs and results are. */
static uint16_t to_h16(float f, int bf)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if (bf || f == 0.0f)
        return (uint16_t)(u >> 16);
    return (uint16_t)(((u >> 16) & 0x8000) | ((((u >> 23) & 0xff) - 112) << 10) |
                      ((u >> 13) & 0x3ff));
}

static float from_h16(uint16_t h, int bf)
{
    uint32_t u = (uint32_t)(h & 0x8000) << 16;
    float f;
    if (bf)
        u = (uint32_t)h << 16;
    else if (h & 0x7fff) /* normal: every value of these sums is */
        u |= ((((uint32_t)h >> 10 & 0x1f) + 112) << 23) | ((uint32_t)(h & 0x3ff) << 13);
    memcpy(&f, &u, 4);
    return f;
}

/* Element i of data, of type dt (float64, float32, float16 or bfloat16). */
static double elem(DLDataType dt, const void *data, size_t i)
{
    if (dt.bits == 64)
        return ((const double *)data)[i];
    if (dt.bits == 32)
        return ((const float *)data)[i];
    return from_h16(((const uint16_t *)data)[i], dt.code == kDLBfloat);
}

/* |cpu - gpu| <= tol * (1 + |cpu|) everywhere. */
static void close_enough(const char *what, const DLManagedTensor *ho, const DLManagedTensor *go,
                         double tol)
{
    DLDataType dt = ho->dl_tensor.dtype;
    size_t n = 1;
    for (int i = 0; i < ho->dl_tensor.ndim; i++) {
        CHECK(ho->dl_tensor.shape[i] == go->dl_tensor.shape[i]);
        n *= (size_t)ho->dl_tensor.shape[i];
    }
    void *g = host_copy(go, dt.bits / 8);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double x = elem(dt, ho->dl_tensor.data, i), y = elem(dt, g, i);
        double e = fabs(x - y) / (1 + fabs(x));
        if (!(e <= worst))
            worst = e;
    }
    CHECKF(worst <= tol, "%s: relative error %g > %g", what, worst, tol);
    free(g);
}

static void mm_case(opjit_op *op, int n, int k, int m, int is64, int trans)
{
    size_t esz = is64 ? 8 : 4;
    char *a = malloc((size_t)n * k * esz + 8), *b = malloc((size_t)k * m * esz + 8);
    for (int i = 0; i < n * k; i++)
        is64 ? (((double *)a)[i] = urand() - 0.5) : (((float *)a)[i] = (float)(urand() - 0.5));
    for (int i = 0; i < k * m; i++)
        is64 ? (((double *)b)[i] = urand() - 0.5) : (((float *)b)[i] = (float)(urand() - 0.5));
    DLDataType dt = {kDLFloat, (uint8_t)(esz * 8), 1};
    int64_t as[2] = {n, k}, bs[2] = {k, m}, ast[2] = {1, n}, bst[2] = {1, k};
    DLTensor ha = tensor(a, kDLCPU, dt, 2, as), hb = tensor(b, kDLCPU, dt, 2, bs);
    void *da = dev_copy(a, (size_t)n * k * esz), *dbp = dev_copy(b, (size_t)k * m * esz);
    DLTensor ga = tensor(da, kDLCUDA, dt, 2, as), gb = tensor(dbp, kDLCUDA, dt, 2, bs);
    if (trans & 1) /* self transposed */
        ha.strides = ga.strides = ast;
    if (trans & 2) /* mat2 transposed */
        hb.strides = gb.strides = bst;
    opjit_value hv[2] = {opjit_tensor(&ha), opjit_tensor(&hb)};
    opjit_value gv[2] = {opjit_tensor(&ga), opjit_tensor(&gb)};
    DLManagedTensor *ho = NULL, *go = NULL;
    int rc = opjit_call(rt, op, hv, 2, &ho, 1);
    CHECKF(rc == OPJIT_OK, "cpu mm: %s", opjit_errmsg(rt));
    rc = opjit_call(rt, op, gv, 2, &go, 1);
    CHECKF(rc == OPJIT_OK, "cuda mm: %s", opjit_errmsg(rt));
    char what[64];
    snprintf(what, sizeof what, "mm %dx%dx%d f%d T%d kernel %s", n, k, m, is64 ? 64 : 32, trans,
             getenv("OPJIT_MM_KERNEL") ? getenv("OPJIT_MM_KERNEL") : "default");
    if (ho && go)
        close_enough(what, ho, go, (is64 ? 1e-13 : 2e-6) * sqrt(k + 1.0));
    if (ho)
        ho->deleter(ho);
    if (go)
        go->deleter(go);
    dev_free(da);
    dev_free(dbp);
    free(a);
    free(b);
}

static void mm_matches_cpu(void)
{
    opjit_op *op = load_pair("mm");
    if (!op)
        return;
    static const int dims[][3] = {{1, 1, 1},     {3, 5, 7},        {64, 64, 64}, {65, 17, 130},
                                  {0, 3, 4},     {3, 0, 4},        {3, 4, 0},    {257, 513, 129},
                                  {1024, 1024, 1024}, {1, 4096, 1}, {2000, 3, 2000},
                                  {1, 1024, 4096},    {4096, 1024, 1}, {1000, 37, 3000},
                                  {1, 1, 5000},       {3000, 2048, 17}};
    /* The default (cuBLAS where it can), cuBLAS forced (a case it cannot
     * serve fails: k == 0 is skipped), and the own kernel. */
    static const char *const kernels[] = {NULL, "cublas", "own"};
    for (int kn = 0; kn < 3; kn++) {
        if (kernels[kn])
            setenv("OPJIT_MM_KERNEL", kernels[kn], 1);
        else
            unsetenv("OPJIT_MM_KERNEL");
        for (int is64 = 0; is64 < 2; is64++)
            for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
                for (int tr = 0; tr < 4; tr++)
                    if (kn != 1 || dims[i][1] > 0)
                        mm_case(op, dims[i][0], dims[i][1], dims[i][2], is64, tr);
    }
    unsetenv("OPJIT_MM_KERNEL");
}

/* The cuDNN API conv2d.cu is told to take ($OPJIT_CUDNN_GRAPH, read at
 * each call): the conv2d tests run under both. */
static const char *cudnn_api(void)
{
    const char *v = getenv("OPJIT_CUDNN_GRAPH");
    return v && !strcmp(v, "0") ? "legacy API" : "graph API";
}

typedef struct conv_cfg {
    int n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw, g, bias, unbatched;
} conv_cfg;

static void conv_case(opjit_op *op, conv_cfg f, int is64)
{
    size_t esz = is64 ? 8 : 4;
    size_t nx = (size_t)f.n * f.c * f.h * f.w, nw = (size_t)f.o * (f.c / f.g) * f.kh * f.kw;
    char *x = malloc(nx * esz + 8), *w = malloc(nw * esz + 8), *b = malloc((size_t)f.o * esz + 8);
    for (size_t i = 0; i < nx; i++)
        is64 ? (((double *)x)[i] = urand() - 0.5) : (((float *)x)[i] = (float)(urand() - 0.5));
    for (size_t i = 0; i < nw; i++)
        is64 ? (((double *)w)[i] = urand() - 0.5) : (((float *)w)[i] = (float)(urand() - 0.5));
    for (int i = 0; i < f.o; i++)
        is64 ? (((double *)b)[i] = urand()) : (((float *)b)[i] = (float)urand());
    DLDataType dt = {kDLFloat, (uint8_t)(esz * 8), 1};
    int64_t xs4[4] = {f.n, f.c, f.h, f.w}, ws[4] = {f.o, f.c / f.g, f.kh, f.kw}, bs[1] = {f.o};
    int64_t *xs = f.unbatched ? xs4 + 1 : xs4;
    int xnd = f.unbatched ? 3 : 4;
    void *dx = dev_copy(x, nx * esz), *dw = dev_copy(w, nw * esz), *db = dev_copy(b, (size_t)f.o * esz);
    DLTensor hx = tensor(x, kDLCPU, dt, xnd, xs), hw = tensor(w, kDLCPU, dt, 4, ws),
             hb = tensor(b, kDLCPU, dt, 1, bs);
    DLTensor gx = tensor(dx, kDLCUDA, dt, xnd, xs), gw = tensor(dw, kDLCUDA, dt, 4, ws),
             gb = tensor(db, kDLCUDA, dt, 1, bs);
    int64_t st[2] = {f.sh, f.sw}, pd[2] = {f.ph, f.pw}, dl[2] = {f.dh, f.dw};
    opjit_value hv[7] = {opjit_tensor(&hx), opjit_tensor(&hw), f.bias ? opjit_tensor(&hb) : opjit_none(),
                         opjit_ints(st, 2), opjit_ints(pd, 2), opjit_ints(dl, 2), opjit_int(f.g)};
    opjit_value gv[7] = {opjit_tensor(&gx), opjit_tensor(&gw), f.bias ? opjit_tensor(&gb) : opjit_none(),
                         opjit_ints(st, 2), opjit_ints(pd, 2), opjit_ints(dl, 2), opjit_int(f.g)};
    DLManagedTensor *ho = NULL, *go = NULL;
    int rc = opjit_call(rt, op, hv, 7, &ho, 1);
    CHECKF(rc == OPJIT_OK, "cpu conv2d: %s", opjit_errmsg(rt));
    rc = opjit_call(rt, op, gv, 7, &go, 1);
    CHECKF(rc == OPJIT_OK, "cuda conv2d: %s", opjit_errmsg(rt));
    char what[192];
    snprintf(what, sizeof what, "conv2d x[%d,%d,%d,%d] w[%d,%d,%d,%d] s%d,%d p%d,%d d%d,%d g%d f%d, %s",
             f.n, f.c, f.h, f.w, f.o, f.c / f.g, f.kh, f.kw, f.sh, f.sw, f.ph, f.pw, f.dh, f.dw,
             f.g, is64 ? 64 : 32, cudnn_api());
    if (ho && go)
        close_enough(what, ho, go,
                     (is64 ? 1e-13 : 4e-6) * sqrt((double)(f.c / f.g) * f.kh * f.kw + 1));
    if (ho)
        ho->deleter(ho);
    if (go)
        go->deleter(go);
    dev_free(dx);
    dev_free(dw);
    dev_free(db);
    free(x);
    free(w);
    free(b);
}

static void conv2d_matches_cpu(void)
{
    opjit_op *op = load_pair("conv2d");
    if (!op)
        return;
    static const conv_cfg cfgs[] = {
        {1, 1, 5, 5, 1, 3, 3, 1, 1, 0, 0, 1, 1, 1, 0, 0},
        {2, 3, 17, 19, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0},
        {2, 4, 16, 16, 6, 3, 5, 2, 1, 2, 0, 1, 2, 2, 1, 0},   /* groups, dilation */
        {1, 8, 9, 9, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8, 1, 0},     /* depthwise */
        {3, 16, 8, 8, 32, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0},   /* 1x1 */
        {1, 3, 7, 7, 4, 3, 3, 3, 3, 0, 0, 1, 1, 1, 1, 1},     /* unbatched, stride 3 */
        {0, 3, 7, 7, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1, 0},     /* empty batch */
        {2, 0, 5, 5, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1, 0},     /* no input channels */
        {8, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0}, /* large */
        {4, 32, 30, 28, 64, 3, 3, 2, 2, 2, 2, 2, 2, 4, 1, 0}, /* groups + dilation + stride + bias */
        {2, 64, 14, 14, 256, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 0}, /* ResNet-50 1x1 expand */
        {1, 3, 64, 64, 16, 7, 7, 2, 2, 3, 3, 1, 1, 1, 0, 0},  /* stem-like 7x7 stride 2 */
    };
    for (int legacy = 0; legacy < 2; legacy++) {
        setenv("OPJIT_CUDNN_GRAPH", legacy ? "0" : "1", 1);
        for (int is64 = 0; is64 < 2; is64++)
            for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++)
                conv_case(op, cfgs[i], is64);
    }
    unsetenv("OPJIT_CUDNN_GRAPH");
}


/* ---- the gradients: conv2d_backward (.padding) and mm_backward against the CPU ---- */

/* A random float32/float64 buffer of n elements, on the host and the device. */
static void rand_pair(size_t n, int is64, char **h, void **d)
{
    size_t esz = is64 ? 8 : 4;
    *h = malloc(n * esz + 8);
    for (size_t i = 0; i < n; i++)
        is64 ? (((double *)*h)[i] = urand() - 0.5) : (((float *)*h)[i] = (float)(urand() - 0.5));
    *d = dev_copy(*h, n * esz);
}

/* conv2d_backward of f (pad: .padding with that string), input and grad
 * channels_last when chlast, all three gradients, CUDA against the CPU. */
static void conv_bw_case(opjit_op *op, conv_cfg f, int is64, int chlast, const char *pad)
{
    int64_t ho = (f.h + 2 * f.ph - f.dh * (f.kh - 1) - 1) / f.sh + 1;
    int64_t wo = (f.w + 2 * f.pw - f.dw * (f.kw - 1) - 1) / f.sw + 1;
    if (pad && !strcmp(pad, "same"))
        ho = f.h, wo = f.w;
    else if (pad)
        ho = f.h - f.dh * (f.kh - 1), wo = f.w - f.dw * (f.kw - 1);
    int64_t xs[4] = {f.n, f.c, f.h, f.w}, ws[4] = {f.o, f.c / f.g, f.kh, f.kw}, bs[1] = {f.o};
    int64_t ys[4] = {f.n, f.o, ho, wo};
    int64_t xst[4] = {f.c * f.h * f.w, 1, f.w * f.c, f.c}, yst[4] = {f.o * ho * wo, 1, wo * f.o, f.o};
    size_t nx = (size_t)(f.n * f.c * f.h * f.w), nw = (size_t)(f.o * (f.c / f.g) * f.kh * f.kw);
    size_t ny = (size_t)(f.n * f.o * ho * wo);
    DLDataType dt = {kDLFloat, (uint8_t)(is64 ? 64 : 32), 1};
    char *hx, *hw, *hy, *hb;
    void *dx, *dw, *dy, *db;
    rand_pair(nx, is64, &hx, &dx);
    rand_pair(nw, is64, &hw, &dw);
    rand_pair(ny, is64, &hy, &dy);
    rand_pair((size_t)f.o, is64, &hb, &db);
    DLTensor t[2][4] = {{tensor(hy, kDLCPU, dt, 4, ys), tensor(hx, kDLCPU, dt, 4, xs),
                         tensor(hw, kDLCPU, dt, 4, ws), tensor(hb, kDLCPU, dt, 1, bs)},
                        {tensor(dy, kDLCUDA, dt, 4, ys), tensor(dx, kDLCUDA, dt, 4, xs),
                         tensor(dw, kDLCUDA, dt, 4, ws), tensor(db, kDLCUDA, dt, 1, bs)}};
    int64_t st[2] = {f.sh, f.sw}, pd[2] = {f.ph, f.pw}, dl[2] = {f.dh, f.dw};
    DLManagedTensor *o[2][3] = {{0}, {0}};
    for (int side = 0; side < 2; side++) {
        if (chlast)
            t[side][0].strides = yst, t[side][1].strides = xst;
        opjit_value v[8] = {opjit_tensor(&t[side][0]), opjit_tensor(&t[side][1]),
                            opjit_tensor(&t[side][2]),
                            f.bias ? opjit_tensor(&t[side][3]) : opjit_none(), opjit_ints(st, 2),
                            pad ? opjit_str(pad) : opjit_ints(pd, 2), opjit_ints(dl, 2),
                            opjit_int(f.g)};
        int rc = opjit_call(rt, op, v, 8, o[side], 3);
        CHECKF(rc == OPJIT_OK, "%s conv2d_backward: %s", side ? "cuda" : "cpu", opjit_errmsg(rt));
    }
    double red[3] = {(double)(f.o / f.g) * f.kh * f.kw, (double)(f.n * ho * wo),
                     (double)(f.n * ho * wo)};
    for (int i = 0; i < 3; i++) {
        char what[224];
        snprintf(what, sizeof what, "conv2d_backward output %d x[%d,%d,%d,%d] w[%d,%d,%d,%d] s%d,%d "
                 "p%s d%d,%d g%d f%d%s, %s", i, f.n, f.c, f.h, f.w, f.o, f.c / f.g, f.kh, f.kw, f.sh,
                 f.sw, pad ? pad : "(int)", f.dh, f.dw, f.g, is64 ? 64 : 32,
                 chlast ? " channels_last" : "", cudnn_api());
        if (o[0][i] && o[1][i])
            close_enough(what, o[0][i], o[1][i], (is64 ? 1e-13 : 4e-6) * sqrt(red[i] + 1));
        for (int side = 0; side < 2; side++)
            if (o[side][i])
                o[side][i]->deleter(o[side][i]);
    }
    dev_free(dx), dev_free(dw), dev_free(dy), dev_free(db);
    free(hx), free(hw), free(hy), free(hb);
}

static void conv2d_backward_matches_cpu(void)
{
    opjit_op *op = NULL, *op_pad = NULL;
    if (!load_pair("conv2d") || opjit_find_op(rt, "conv2d_backward", &op) ||
        opjit_find_op(rt, "conv2d_backward.padding", &op_pad)) {
        CHECKF(0, "conv2d_backward: %s", opjit_errmsg(rt));
        return;
    }
    static const conv_cfg cfgs[] = {
        {2, 3, 17, 19, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0},
        {2, 4, 16, 16, 6, 3, 5, 2, 1, 2, 0, 1, 2, 2, 1, 0},   /* groups, dilation */
        {1, 8, 9, 9, 8, 3, 3, 1, 1, 1, 1, 1, 1, 8, 1, 0},     /* depthwise */
        {3, 16, 8, 8, 32, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0},   /* 1x1 */
        {0, 3, 7, 7, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1, 0},     /* empty batch */
        {2, 0, 5, 5, 4, 3, 3, 1, 1, 0, 0, 1, 1, 1, 1, 0},     /* no input channels */
        {8, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0}, /* ResNet-50 3x3 */
        {8, 256, 56, 56, 64, 1, 1, 1, 1, 0, 0, 1, 1, 1, 0, 0}, /* ResNet-50 1x1 */
        {2, 64, 28, 28, 128, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 0}, /* stride 2 */
        {1, 3, 64, 64, 16, 7, 7, 2, 2, 3, 3, 1, 1, 1, 1, 0},  /* stem-like */
    };
    /* padding="same": even kernels pad one more at the end (a padded copy) */
    static const conv_cfg same[] = {
        {2, 4, 9, 10, 6, 2, 2, 1, 1, 0, 0, 1, 1, 2, 1, 0},
        {2, 4, 9, 10, 6, 4, 3, 1, 1, 0, 0, 1, 2, 1, 1, 0},
        {2, 4, 9, 10, 6, 3, 3, 1, 1, 0, 0, 1, 1, 1, 0, 0},
    };
    for (int legacy = 0; legacy < 2; legacy++) {
        setenv("OPJIT_CUDNN_GRAPH", legacy ? "0" : "1", 1);
        for (int is64 = 0; is64 < 2; is64++)
            for (size_t i = 0; i < sizeof cfgs / sizeof *cfgs; i++)
                for (int chlast = 0; chlast < 2; chlast++)
                    conv_bw_case(op, cfgs[i], is64, chlast, NULL);
        for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
            conv_bw_case(op_pad, same[i], 0, 0, "same");
            conv_bw_case(op_pad, same[i], 1, 1, "same");
            conv_bw_case(op_pad, same[i], 0, 1, "valid");
        }
    }
    unsetenv("OPJIT_CUDNN_GRAPH");
}

/* mm_backward(grad, self, mat2) of n x k by k x m (self transposed: tr), both
 * gradients, CUDA against the CPU. */
static void mm_bw_case(opjit_op *op, int n, int k, int m, int is64, int tr)
{
    size_t cnt[3] = {(size_t)n * m, (size_t)n * k, (size_t)k * m};
    int64_t shp[3][2] = {{n, m}, {n, k}, {k, m}}, ast[2] = {1, n};
    DLDataType dt = {kDLFloat, (uint8_t)(is64 ? 64 : 32), 1};
    char *h[3];
    void *d[3];
    DLTensor ht[3], gt[3];
    for (int t = 0; t < 3; t++) {
        rand_pair(cnt[t], is64, &h[t], &d[t]);
        ht[t] = tensor(h[t], kDLCPU, dt, 2, shp[t]);
        gt[t] = tensor(d[t], kDLCUDA, dt, 2, shp[t]);
    }
    if (tr)
        ht[1].strides = gt[1].strides = ast;
    opjit_value hv[3] = {opjit_tensor(&ht[0]), opjit_tensor(&ht[1]), opjit_tensor(&ht[2])};
    opjit_value gv[3] = {opjit_tensor(&gt[0]), opjit_tensor(&gt[1]), opjit_tensor(&gt[2])};
    DLManagedTensor *ho[2] = {0}, *go[2] = {0};
    CHECKF(opjit_call(rt, op, hv, 3, ho, 2) == OPJIT_OK, "cpu: %s", opjit_errmsg(rt));
    CHECKF(opjit_call(rt, op, gv, 3, go, 2) == OPJIT_OK, "cuda: %s", opjit_errmsg(rt));
    for (int j = 0; j < 2; j++) {
        char what[96];
        snprintf(what, sizeof what, "mm_backward %dx%dx%d f%d T%d output %d", n, k, m,
                 is64 ? 64 : 32, tr, j);
        if (ho[j] && go[j])
            close_enough(what, ho[j], go[j], (is64 ? 1e-13 : 2e-6) * sqrt((j ? n : m) + 1.0));
        if (ho[j])
            ho[j]->deleter(ho[j]);
        if (go[j])
            go[j]->deleter(go[j]);
    }
    for (int t = 0; t < 3; t++) {
        dev_free(d[t]);
        free(h[t]);
    }
}

/* mm_backward: both gradients, each operand dense or transposed. */
static void mm_backward_matches_cpu(void)
{
    opjit_op *op = NULL;
    if (!load_pair("mm") || opjit_find_op(rt, "mm_backward", &op)) {
        CHECKF(0, "mm_backward: %s", opjit_errmsg(rt));
        return;
    }
    static const int dims[][3] = {{1, 1, 1}, {65, 17, 130}, {257, 513, 129}, {1024, 1024, 1024},
                                  {3, 0, 4}, {0, 3, 4}};
    for (int is64 = 0; is64 < 2; is64++)
        for (size_t i = 0; i < sizeof dims / sizeof *dims; i++)
            for (int tr = 0; tr < 2; tr++)
                mm_bw_case(op, dims[i][0], dims[i][1], dims[i][2], is64, tr);
}

/* ---- opjit_tensor_to_device: bytes survive the round trip ---------------------------- */

static void tensor_to_device_round_trips(void)
{
    static const struct {
        DLDataType dt;
        int ndim;
        int64_t shape[3];
    } cases[] = {
        {{kDLFloat, 32, 1}, 2, {3, 5, 0}}, {{kDLFloat, 64, 1}, 1, {1000, 0, 0}},
        {{kDLInt, 8, 1}, 3, {2, 3, 7}},    {{kDLInt, 64, 1}, 0, {0, 0, 0}},
        {{kDLFloat, 32, 1}, 2, {0, 4, 0}}, {{kDLUInt, 16, 1}, 1, {1 << 20, 0, 0}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        size_t n = cases[c].dt.bits / 8;
        int64_t shape[3];
        memcpy(shape, cases[c].shape, sizeof shape);
        for (int i = 0; i < cases[c].ndim; i++)
            n *= (size_t)shape[i];
        unsigned char *h = malloc(n + 1);
        for (size_t i = 0; i < n; i++)
            h[i] = (unsigned char)(urand() * 256);
        DLTensor src = tensor(h, kDLCPU, cases[c].dt, cases[c].ndim, shape);
        DLManagedTensor *g = NULL, *g2 = NULL, *back = NULL;
        int rc = opjit_tensor_to_device(rt, &src, OPJIT_CUDA, 0, &g);
        CHECKF(rc == OPJIT_OK && g, "case %zu to cuda: %s", c, opjit_errmsg(rt));
        if (g) {
            CHECK(g->dl_tensor.device.device_type == kDLCUDA);
            void *seen = host_copy(g, cases[c].dt.bits / 8);
            CHECKF(!n || !memcmp(seen, h, n), "case %zu: the bytes on the GPU differ", c);
            free(seen);
            rc = opjit_tensor_to_device(rt, &g->dl_tensor, OPJIT_CUDA, 0, &g2);
            CHECKF(rc == OPJIT_OK && g2, "case %zu cuda to cuda: %s", c, opjit_errmsg(rt));
        }
        if (g2) {
            rc = opjit_tensor_to_device(rt, &g2->dl_tensor, OPJIT_CPU, 0, &back);
            CHECKF(rc == OPJIT_OK && back, "case %zu back: %s", c, opjit_errmsg(rt));
        }
        if (back) {
            CHECK(back->dl_tensor.device.device_type == kDLCPU);
            CHECKF(!n || !memcmp(back->dl_tensor.data, h, n), "case %zu: round trip changed "
                   "the bytes", c);
            back->deleter(back);
        }
        if (g2)
            g2->deleter(g2);
        if (g)
            g->deleter(g);
        free(h);
    }
}

/* ---- float16 and bfloat16: one call of each op, against the CPU twin ---------------- */

/* Values k/32, |k| <= 32, are exact in both 16-bit types, and so are their
 * products and the float32 sums of a few hundred: the device's tensor-core
 * results and the CPU twin's agree once rounded to 16 bits (within an ulp
 * where cuDNN takes Winograd). */

/* op on nt 16-bit tensors (ndim[t] dimensions of shape[t]) filled with
 * k/32, then extra: the CPU twin and the device, nout outputs compared. */
static void half_case(const char *what, opjit_op *op, int bf, int nt, const int *ndim,
                      int64_t shape[][4], const opjit_value *extra, int nextra, int nout)
{
    DLDataType dt = {(uint8_t)(bf ? kDLBfloat : kDLFloat), 16, 1};
    uint16_t *h[4];
    void *d[4];
    DLTensor ht[4], gt[4];
    opjit_value hv[8], gv[8];
    DLManagedTensor *ho[3] = {0}, *go[3] = {0};
    for (int t = 0; t < nt; t++) {
        size_t n = 1;
        for (int i = 0; i < ndim[t]; i++)
            n *= (size_t)shape[t][i];
        h[t] = malloc(2 * n + 2);
        for (size_t i = 0; i < n; i++)
            h[t][i] = to_h16((float)((int)(urand() * 65) - 32) / 32.0f, bf);
        d[t] = dev_copy(h[t], 2 * n);
        ht[t] = tensor(h[t], kDLCPU, dt, ndim[t], shape[t]);
        gt[t] = tensor(d[t], kDLCUDA, dt, ndim[t], shape[t]);
        hv[t] = opjit_tensor(&ht[t]);
        gv[t] = opjit_tensor(&gt[t]);
    }
    for (int e = 0; e < nextra; e++)
        hv[nt + e] = gv[nt + e] = extra[e];
    CHECKF(opjit_call(rt, op, hv, nt + nextra, ho, nout) == OPJIT_OK, "cpu %s %s: %s", what,
           bf ? "bfloat16" : "float16", opjit_errmsg(rt));
    CHECKF(opjit_call(rt, op, gv, nt + nextra, go, nout) == OPJIT_OK, "cuda %s %s: %s", what,
           bf ? "bfloat16" : "float16", opjit_errmsg(rt));
    for (int j = 0; j < nout; j++) {
        char name[96];
        snprintf(name, sizeof name, "%s %s output %d", what, bf ? "bfloat16" : "float16", j);
        if (ho[j] && go[j])
            close_enough(name, ho[j], go[j], bf ? 8e-3 : 1e-3);
        if (ho[j])
            ho[j]->deleter(ho[j]);
        if (go[j])
            go[j]->deleter(go[j]);
    }
    for (int t = 0; t < nt; t++) {
        dev_free(d[t]);
        free(h[t]);
    }
}

/* mm, mm_backward, conv2d and conv2d_backward in float16 and bfloat16. */
static void half_calls(void)
{
    opjit_op *mm = load_pair("mm"), *conv = load_pair("conv2d"), *mm_bw = NULL, *conv_bw = NULL;
    if (!mm || !conv || opjit_find_op(rt, "mm_backward", &mm_bw) ||
        opjit_find_op(rt, "conv2d_backward", &conv_bw)) {
        CHECKF(0, "the half ops: %s", opjit_errmsg(rt));
        return;
    }
    /* conv: x [2, 4, 16, 16], w [6, 2, 3, 5] in 2 groups, stride (2, 1),
     * padding (2, 0), dilation (1, 2): y [2, 6, 9, 8] */
    static const int nd_mm[3] = {2, 2, 2}, nd_conv[4] = {4, 4, 4, 1};
    int64_t mm_sh[3][4] = {{65, 33}, {33, 129}}, mmbw_sh[3][4] = {{65, 129}, {65, 33}, {33, 129}};
    int64_t conv_sh[3][4] = {{2, 4, 16, 16}, {6, 2, 3, 5}, {6}};
    int64_t convbw_sh[4][4] = {{2, 6, 9, 8}, {2, 4, 16, 16}, {6, 2, 3, 5}, {6}};
    int64_t st[2] = {2, 1}, pd[2] = {2, 0}, dl[2] = {1, 2};
    opjit_value geom[4] = {opjit_ints(st, 2), opjit_ints(pd, 2), opjit_ints(dl, 2), opjit_int(2)};
    for (int bf = 0; bf < 2; bf++) {
        half_case("mm", mm, bf, 2, nd_mm, mm_sh, NULL, 0, 1);
        half_case("mm_backward", mm_bw, bf, 3, nd_mm, mmbw_sh, NULL, 0, 2);
        half_case("conv2d", conv, bf, 3, nd_conv + 1, conv_sh, geom, 4, 1);
        half_case("conv2d_backward", conv_bw, bf, 4, nd_conv, convbw_sh, geom, 4, 3);
    }
}

/* ---- a few small calls of each op (compute-sanitizer runs only these) --------------- */

/* One small call of each op, forward and backward, in each dtype (on both
 * cuDNN APIs for conv2d): what compute-sanitizer runs. */
static void one_call_of_each(void)
{
    opjit_op *op = load_pair("nms"), *bw = NULL;
    if (op) {
        nms_case(op, 200, 0, 0.5, 0);
        nms_case(op, 4000, 0, 0.5, 4); /* removed set in shared memory, several tiles */
        nms_case(op, 300, 1, 0.3, 2);  /* float64, NaN scores */
    }
    op = load_pair("mm");
    if (op && !opjit_find_op(rt, "mm_backward", &bw))
        for (int is64 = 0; is64 < 2; is64++) {
            mm_case(op, 65, 33, 129, is64, 0);
            mm_case(op, 65, 33, 129, is64, 1); /* self transposed */
            mm_bw_case(bw, 65, 33, 129, is64, 1);
        }
    op = load_pair("conv2d");
    if (op && !opjit_find_op(rt, "conv2d_backward", &bw)) {
        conv_cfg f = {2, 4, 16, 16, 6, 3, 5, 2, 1, 2, 0, 1, 2, 2, 1, 0};
        conv_cfg g = {2, 3, 17, 19, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 0};
        for (int legacy = 0; legacy < 2; legacy++) {
            setenv("OPJIT_CUDNN_GRAPH", legacy ? "0" : "1", 1);
            for (int is64 = 0; is64 < 2; is64++) {
                conv_case(op, f, is64);
                conv_case(op, g, is64);
                conv_bw_case(bw, f, is64, 0, NULL);
            }
        }
        unsetenv("OPJIT_CUDNN_GRAPH");
    }
    half_calls();
}

/* ---- the PTX fallback: a cache with only compute_XX device code ----------------------- */

static int device_cc(void)
{
    int cc[4];
    return cuda_device_archs(cc, 4) > 0 ? cc[0] : 0;
}

static void ptx_fallback_runs(void)
{
    int cc = device_cc();
    CHECK(cc > 0);
    char archs[32];
    snprintf(archs, sizeof archs, "compute_%d", cc);
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = 0;
    cfg.cuda_archs = archs; /* no cubin at all: the driver JIT-compiles the PTX */
    opjit_runtime *saved = rt, *prt = NULL;
    CHECK(opjit_create(&cfg, &prt) == OPJIT_OK);
    if (!prt)
        return;
    rt = prt;
    one_call_of_each();
    opjit_op *op = load_pair("nms");
    if (op)
        nms_case(op, 1000, 0, 0.5, 0);
    /* The cache now holds a PTX entry for this arch. */
    char cmd[2048];
    const char *dir = getenv("OPJIT_CACHE_DIR");
    if (dir) {
        snprintf(cmd, sizeof cmd, "find '%s' -name '%s.ptx' | grep -q .", dir, archs);
        CHECKF(system(cmd) == 0, "no %s.ptx in the cache %s", archs, dir);
        snprintf(cmd, sizeof cmd, "find '%s' -name 'sm_%d.cubin' | grep -q .", dir, cc);
        CHECKF(system(cmd) == 0, "no sm_%d.cubin in the cache %s (the default runtime should "
               "have built one for this GPU)", cc, dir);
    }
    opjit_destroy(prt);
    rt = saved;
}

/* ---- a host stream: the op queues behind the host's work on it ----------------------- */

static void slow_host_func(void *ud)
{
    (void)ud;
    usleep(200 * 1000); /* the stream stalls here; a call on another stream would not wait */
}

static void host_stream_orders_work(void)
{
    opjit_op *op = load_pair("mm");
    if (!op)
        return;
    void *stream = NULL;
    CHECK(cu.stream_create(&stream, 1 /* CU_STREAM_NON_BLOCKING */) == 0);
    if (!stream)
        return;
    CHECK(opjit_set_cuda_stream(rt, 0, NULL, stream) == OPJIT_OK);
    enum { N = 512 };
    float *a = malloc(sizeof(float) * N * N), *b = malloc(sizeof(float) * N * N);
    for (int i = 0; i < N * N; i++)
        a[i] = (float)(urand() - 0.5), b[i] = (float)(int)(urand() * 8);
    void *da = dev_copy(a, sizeof(float) * N * N), *db = dev_copy(b, sizeof(float) * N * N);
    /* Queue on the host's stream: a 200 ms stall, then A := all ones. An op
     * that runs on this stream multiplies ones; one that does not reads the
     * random A before the memset lands. */
    CHECK(cu.host_func(stream, slow_host_func, NULL) == 0);
    CHECK(cu.memset32((CUdeviceptr)(uintptr_t)da, 0x3f800000u, (size_t)N * N, stream) == 0);
    int64_t sh[2] = {N, N};
    DLDataType dt = {kDLFloat, 32, 1};
    DLTensor ga = tensor(da, kDLCUDA, dt, 2, sh), gb = tensor(db, kDLCUDA, dt, 2, sh);
    opjit_value v[2] = {opjit_tensor(&ga), opjit_tensor(&gb)};
    DLManagedTensor *go = NULL;
    int rc = opjit_call(rt, op, v, 2, &go, 1);
    CHECKF(rc == OPJIT_OK, "mm on the host stream: %s", opjit_errmsg(rt));
    if (go) {
        CHECK(cu.stream_sync(stream) == 0);
        float *c = host_copy(go, 4);
        int bad = 0;
        for (int j = 0; j < N; j++) { /* every row of ones·B is B's column sums */
            double col = 0;
            for (int k = 0; k < N; k++)
                col += b[k * N + j];
            for (int i = 0; i < N; i += 97)
                bad += c[i * N + j] != (float)col;
        }
        CHECKF(!bad, "%d results did not see the host stream's memset: the op did not run on "
               "the stream handed over", bad);
        free(c);
        go->deleter(go);
    }
    /* nms on the same stream, against the CPU. */
    opjit_op *nms = load_pair("nms");
    if (nms)
        nms_case(nms, 3000, 0, 0.5, 0);
    CHECK(opjit_set_cuda_stream(rt, 0, NULL, NULL) == OPJIT_OK);
    dev_free(da);
    dev_free(db);
    cu.stream_destroy(stream);
    free(a);
    free(b);
}

/* ---- threads: CUDA calls at once on one runtime -------------------------------------- */

enum { NTHREADS = 8, THREAD_ITERS = 40 };
static opjit_op *th_nms, *th_mm;

static void *thread_caller(void *arg)
{
    rng ^= (unsigned long long)(uintptr_t)arg * 0x2545F4914F6CDD1Dull; /* own inputs per thread */
    if (cu.push(cu.ctx) != 0) /* for the test's own copies */
        return (void *)1;
    for (int it = 0; it < THREAD_ITERS; it++) {
        if (it % 2)
            nms_case(th_nms, 500 + 37 * it, it % 4 == 1, 0.5, it % 4);
        else
            mm_case(th_mm, 33 + it, 17 + 2 * it, 65, it % 4 == 0, it % 3 == 0);
    }
    void *dummy;
    cu.pop(&dummy);
    return NULL;
}

static void threads_call_at_once(void)
{
    th_nms = load_pair("nms");
    th_mm = load_pair("mm");
    if (!th_nms || !th_mm)
        return;
    pthread_t th[NTHREADS];
    int started = 0;
    for (int i = 0; i < NTHREADS; i++)
        started += pthread_create(&th[i], NULL, thread_caller, (void *)(uintptr_t)(i + 1)) == 0;
    CHECK(started == NTHREADS);
    for (int i = 0; i < started; i++) {
        void *r = NULL;
        pthread_join(th[i], &r);
        CHECK(r == NULL);
    }
}

/* ---- device memory over 10,000 calls -------------------------------------------------- */

static size_t free_device_memory(void)
{
    size_t fr = 0, total = 0;
    CHECK(cu.sync() == 0);
    CHECK(cu.mem_info(&fr, &total) == 0);
    return fr;
}

static void run_calls(opjit_op *op, opjit_value *v, int nargs, int times)
{
    for (int i = 0; i < times; i++) {
        DLManagedTensor *o = NULL;
        int rc = opjit_call(rt, op, v, nargs, &o, 1);
        if (rc != OPJIT_OK) {
            CHECKF(0, "call %d: %s", i, opjit_errmsg(rt));
            return;
        }
        o->deleter(o);
    }
}

static void device_memory_stable(void)
{
    opjit_op *nms = load_pair("nms"), *mm = load_pair("mm"), *conv = load_pair("conv2d");
    if (!nms || !mm || !conv)
        return;
    enum { NB = 300 };
    float boxes[NB * 4], scores[NB], a[32 * 32], x[2 * 3 * 12 * 12], w[4 * 3 * 3 * 3];
    for (int i = 0; i < NB; i++) {
        float x0 = (float)(urand() * 100), y0 = (float)(urand() * 100);
        boxes[4 * i] = x0, boxes[4 * i + 1] = y0;
        boxes[4 * i + 2] = x0 + (float)(urand() * 30), boxes[4 * i + 3] = y0 + (float)(urand() * 30);
        scores[i] = (float)urand();
    }
    for (int i = 0; i < 32 * 32; i++)
        a[i] = (float)urand();
    for (size_t i = 0; i < sizeof x / sizeof *x; i++)
        x[i] = (float)urand();
    for (size_t i = 0; i < sizeof w / sizeof *w; i++)
        w[i] = (float)urand();
    DLDataType dt = {kDLFloat, 32, 1};
    int64_t bs[2] = {NB, 4}, ss[1] = {NB}, as[2] = {32, 32}, xs[4] = {2, 3, 12, 12},
            ws[4] = {4, 3, 3, 3};
    void *db = dev_copy(boxes, sizeof boxes), *ds = dev_copy(scores, sizeof scores),
         *da = dev_copy(a, sizeof a), *dx = dev_copy(x, sizeof x), *dw = dev_copy(w, sizeof w);
    DLTensor gb = tensor(db, kDLCUDA, dt, 2, bs), gs = tensor(ds, kDLCUDA, dt, 1, ss),
             ga = tensor(da, kDLCUDA, dt, 2, as), gx = tensor(dx, kDLCUDA, dt, 4, xs),
             gw = tensor(dw, kDLCUDA, dt, 4, ws);
    int64_t one[2] = {1, 1}, zero[2] = {0, 0};
    opjit_value nv[3] = {opjit_tensor(&gb), opjit_tensor(&gs), opjit_float(0.5)};
    opjit_value mv[2] = {opjit_tensor(&ga), opjit_tensor(&ga)};
    opjit_value cv[7] = {opjit_tensor(&gx), opjit_tensor(&gw), opjit_none(), opjit_ints(one, 2),
                         opjit_ints(zero, 2), opjit_ints(one, 2), opjit_int(1)};
    /* Warm up: modules loaded, pools and cuDNN/cuBLAS handles made. */
    run_calls(nms, nv, 3, 100);
    run_calls(mm, mv, 2, 100);
    run_calls(conv, cv, 7, 100);
    size_t before = free_device_memory();
    run_calls(nms, nv, 3, 10000);
    run_calls(mm, mv, 2, 10000);
    run_calls(conv, cv, 7, 10000);
    size_t after = free_device_memory();
    long long lost = (long long)before - (long long)after;
    printf("device memory over 30,000 calls: %lld bytes less free\n", lost);
    CHECKF(lost <= 2 << 20, "device memory grew by %lld bytes over 30,000 calls", lost);
    dev_free(db);
    dev_free(ds);
    dev_free(da);
    dev_free(dx);
    dev_free(dw);
}

int main(void)
{
    char why[1024];
    if (cuda_available(why, sizeof why) != OPJIT_OK) {
        printf("skipped: %s: GPU execution of the CUDA ops is untested on this machine\n", why);
        return 77;
    }
    if (!cu_open()) {
        printf("skipped: the CUDA driver could not be used by the test: GPU execution is "
               "untested on this machine\n");
        return 77;
    }
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = 0;
    if (opjit_create(&cfg, &rt) != OPJIT_OK) {
        printf("cannot create a runtime\n");
        return 1;
    }
    const char *quick = getenv("OPJIT_GPU_QUICK");
    if (quick && !strcmp(quick, "1")) {
        T_RUN(one_call_of_each);
    } else {
        T_RUN(nms_matches_cpu);
        T_RUN(mm_matches_cpu);
        T_RUN(conv2d_matches_cpu);
        T_RUN(conv2d_backward_matches_cpu);
        T_RUN(mm_backward_matches_cpu);
        T_RUN(half_calls);
        T_RUN(tensor_to_device_round_trips);
        T_RUN(ptx_fallback_runs);
        T_RUN(host_stream_orders_work);
        T_RUN(threads_call_at_once);
        T_RUN(device_memory_stable);
    }
    opjit_destroy(rt);
    void *dummy;
    cu.pop(&dummy);
    cu.release(0);
    return t_done();
}
