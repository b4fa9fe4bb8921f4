/* tests/fake_libcuda.c - a stand-in for libcuda.so.1, for tests on machines
 * without a GPU (built by tests/test_cuda.c at run time with $OPJIT_CC and
 * handed to opjit through $OPJIT_CUDA_DRIVER).
 *
 * "Device" memory is host memory, tracked so that a copy in the wrong
 * direction or a host pointer handed to a kernel is caught. Kernels are
 * looked up by name in a table of serial C emulations of the kernels of
 * ops-src/*.cu: the host halves, the runtime and their protocol (launch
 * geometry, parameters, copies, workspaces, contexts) are exercised for
 * real; the CUDA device code itself is not (that needs a GPU).
 *
 * Knobs (environment): FAKE_CUDA_CC (compute capability, default 90),
 * FAKE_CUDA_DEVICES (default 1), FAKE_CUDA_REJECT_PTX (a CUresult for
 * every PTX image), FAKE_CUDA_REJECT_CUBIN (one for every cubin). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;
typedef unsigned long long CUdeviceptr;

/* ---- bookkeeping, readable by the test through fake_stats ------------------ */

typedef struct fake_stats {
    int primary_refs;    /* cuDevicePrimaryCtxRetain - Release */
    int ctx_depth;       /* pushes - pops */
    int ctx_depth_max;
    long live_allocs;    /* cuMemAlloc - cuMemFree */
    int modules_loaded, modules_unloaded;
    int launches;
    int last_image_ptx;  /* the last image loaded was PTX */
    char last_image_arch[32];
    void *last_pushed;   /* the context last made current */
    int errors;          /* protocol violations seen */
    char first_error[256];
} fake_stats;

static fake_stats st;
static CUcontext ctx_stack[64];
static char primary_ctx_obj;

fake_stats *fake_stats_get(void) { return &st; }

static void violation(const char *what)
{
    if (!st.errors)
        snprintf(st.first_error, sizeof st.first_error, "%s", what);
    st.errors++;
}

typedef struct alloc {
    char *p;
    size_t n;
    struct alloc *next;
} alloc;
static alloc *allocs;

static int is_dev(const void *p, size_t n)
{
    for (alloc *a = allocs; a; a = a->next)
        if ((const char *)p >= a->p && (const char *)p + n <= a->p + a->n)
            return 1;
    return 0;
}

static int env_int(const char *name, int def)
{
    const char *e = getenv(name);
    return e && *e ? atoi(e) : def;
}

/* ---- the API ------------------------------------------------------------------ */

CUresult cuGetErrorName(CUresult r, const char **s)
{
    *s = r == 0 ? "CUDA_SUCCESS" : r == 2 ? "CUDA_ERROR_OUT_OF_MEMORY"
         : r == 209 ? "CUDA_ERROR_NO_BINARY_FOR_GPU" : r == 222 ? "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"
         : r == 500 ? "CUDA_ERROR_NOT_FOUND" : "CUDA_ERROR_FAKE";
    return 0;
}
CUresult cuGetErrorString(CUresult r, const char **s)
{
    *s = r == 222 ? "the provided PTX was compiled with an unsupported toolchain." : "fake error";
    return 0;
}
CUresult cuInit(unsigned f) { return f ? 1 : 0; }
CUresult cuDriverGetVersion(int *v) { *v = env_int("FAKE_CUDA_VERSION", 12040); return 0; }
CUresult cuDeviceGetCount(int *n) { *n = env_int("FAKE_CUDA_DEVICES", 1); return 0; }
CUresult cuDeviceGet(CUdevice *d, int i)
{
    if (i < 0 || i >= env_int("FAKE_CUDA_DEVICES", 1))
        return 101;
    *d = i;
    return 0;
}
CUresult cuDeviceGetAttribute(int *v, int attr, CUdevice d)
{
    (void)d;
    int cc = env_int("FAKE_CUDA_CC", 90);
    if (attr == 75)
        *v = cc / 10;
    else if (attr == 76)
        *v = cc % 10;
    else
        return 1;
    return 0;
}
CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    (void)d;
    st.primary_refs++;
    *c = &primary_ctx_obj;
    return 0;
}
CUresult cuDevicePrimaryCtxRelease_v2(CUdevice d)
{
    (void)d;
    if (st.primary_refs <= 0)
        violation("primary context released more often than retained");
    st.primary_refs--;
    return 0;
}
CUresult cuCtxPushCurrent_v2(CUcontext c)
{
    if (!c || st.ctx_depth == 64) {
        violation("bad context push");
        return 1;
    }
    ctx_stack[st.ctx_depth++] = c;
    st.last_pushed = c;
    if (st.ctx_depth > st.ctx_depth_max)
        st.ctx_depth_max = st.ctx_depth;
    return 0;
}
CUresult cuCtxPopCurrent_v2(CUcontext *c)
{
    if (st.ctx_depth <= 0) {
        violation("context pop without push");
        return 1;
    }
    *c = ctx_stack[--st.ctx_depth];
    return 0;
}
static void need_ctx(const char *what)
{
    if (st.ctx_depth <= 0)
        violation(what);
}

CUresult cuModuleLoadDataEx(CUmodule *m, const void *image, unsigned n, int *opts, void **vals)
{
    (void)n, (void)opts, (void)vals;
    need_ctx("cuModuleLoadDataEx without a current context");
    const char *s = image;
    int ptx = memcmp(s, "\177ELF", 4) != 0;
    if (ptx) {
        const char *t = strstr(s, ".target ");
        snprintf(st.last_image_arch, sizeof st.last_image_arch, "%.*s", t ? (int)strcspn(t + 8, "\n, ") : 0,
                 t ? t + 8 : "");
        int r = env_int("FAKE_CUDA_REJECT_PTX", 0);
        if (r) {
            if (vals && n >= 2)
                snprintf((char *)vals[0], (size_t)(uintptr_t)vals[1], "ptxas fatal: fake rejection");
            return r;
        }
    } else {
        snprintf(st.last_image_arch, sizeof st.last_image_arch, "cubin");
        int r = env_int("FAKE_CUDA_REJECT_CUBIN", 0);
        if (r)
            return r;
    }
    st.last_image_ptx = ptx;
    st.modules_loaded++;
    *m = malloc(1);
    return 0;
}
CUresult cuModuleUnload(CUmodule m)
{
    need_ctx("cuModuleUnload without a current context");
    st.modules_unloaded++;
    free(m);
    return 0;
}

/* Kernels: serial emulations, by name. */
typedef void (*emu_fn)(const unsigned grid[3], const unsigned block[3], unsigned shm,
                       void **p);
typedef struct kern {
    const char *name;
    emu_fn fn;
    int static_shared; /* bytes of __shared__ arrays, as ptxas would report */
    int dyn_max;       /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES; 0: the default */
} kern;

/* The per-block shared memory limits of an sm_90 device. */
#define FAKE_SHARED_PER_BLOCK (48 << 10)
#define FAKE_SHARED_OPTIN (227 << 10)

#define PTR(i) (*(void **)p[i])
#define CHECK_DEV(ptr, n)                                                     \
    do {                                                                      \
        if ((n) && !is_dev((ptr), (n)))                                       \
            violation("a kernel was given memory that is not device memory"); \
    } while (0)

#define NMS_EMU(T, SUF)                                                                     \
    static void nms_gather_##SUF(const unsigned g[3], const unsigned b[3], unsigned shm,   \
                                 void **p)                                                  \
    {                                                                                       \
        int n = *(int *)p[0];                                                               \
        const T *boxes = PTR(1);                                                            \
        const long long *order = PTR(2);                                                    \
        T *sorted = PTR(3);                                                                 \
        (void)shm;                                                                          \
        if ((long long)g[0] * b[0] < n)                                                     \
            violation("nms_gather: the grid does not cover every box");                     \
        CHECK_DEV(boxes, (size_t)n * 4 * sizeof(T));                                        \
        CHECK_DEV(order, (size_t)n * 8);                                                    \
        CHECK_DEV(sorted, (size_t)n * 5 * sizeof(T));                                       \
        for (int i = 0; i < n; i++) {                                                       \
            const T *bx = boxes + 4 * order[i];                                             \
            T *o = sorted + 5 * (long long)i;                                               \
            o[0] = bx[0], o[1] = bx[1], o[2] = bx[2], o[3] = bx[3];                         \
            o[4] = (bx[2] - bx[0]) * (bx[3] - bx[1]);                                       \
        }                                                                                   \
    }                                                                                       \
    static void nms_mask_##SUF(const unsigned g[3], const unsigned b[3], unsigned shm,     \
                               void **p)                                                    \
    {                                                                                       \
        int n = *(int *)p[0];                                                               \
        double thr = *(double *)p[1];                                                       \
        const T *s = PTR(2);                                                                \
        unsigned long long *mask = PTR(3);                                                  \
        int cols = *(int *)p[4];                                                            \
        (void)shm;                                                                          \
        if (b[0] != 64 || g[0] != (unsigned)cols || g[1] != (unsigned)cols)                 \
            violation("nms_mask: expected 64 threads and a cols x cols grid");              \
        CHECK_DEV(s, (size_t)n * 5 * sizeof(T));                                            \
        CHECK_DEV(mask, (size_t)n * cols * 8);                                              \
        for (int row = 0; row < cols; row++)                                                \
            for (int col = row; col < cols; col++) {                                        \
                int rs = n - row * 64 < 64 ? n - row * 64 : 64;                             \
                int cs = n - col * 64 < 64 ? n - col * 64 : 64;                             \
                for (int t = 0; t < rs; t++) {                                              \
                    const T *a = s + 5 * (long long)(row * 64 + t);                         \
                    unsigned long long bits = 0;                                            \
                    for (int i = row == col ? t + 1 : 0; i < cs; i++) {                     \
                        const T *c = s + 5 * (long long)(col * 64 + i);                     \
                        const T zero = 0;                                                   \
                        T xx1 = a[0] < c[0] ? c[0] : a[0];                                  \
                        T xx2 = c[2] < a[2] ? c[2] : a[2];                                  \
                        T w = xx2 - xx1;                                                    \
                        w = zero < w ? w : zero;                                            \
                        T yy1 = a[1] < c[1] ? c[1] : a[1];                                  \
                        T yy2 = c[3] < a[3] ? c[3] : a[3];                                  \
                        T h = yy2 - yy1;                                                    \
                        h = zero < h ? h : zero;                                            \
                        T inter = w * h;                                                    \
                        T ovr = inter / (a[4] + c[4] - inter);                              \
                        if ((double)ovr > thr)                                              \
                            bits |= 1ULL << i;                                              \
                    }                                                                       \
                    mask[(long long)(row * 64 + t) * cols + col] = bits;                    \
                }                                                                           \
            }                                                                               \
    }
NMS_EMU(float, f32)
NMS_EMU(double, f64)

/* nms.cu's sort: keys (nms_key of nms_common.h), then bitonic stages over
 * (key, index) pairs, each launch emulated stage by stage as the device
 * runs it, so a wrong launch sequence gives a wrong order. */
static unsigned long long nms_key_emu(double s)
{
    unsigned long long u;
    if (s != s)
        return 0;
    if (s == 0)
        s = 0.0;
    memcpy(&u, &s, sizeof u);
    u = (u >> 63) ? ~u : (u | (1ULL << 63));
    return ~u;
}

#define NMS_KEYS_EMU(T, SUF)                                                                 \
    static void nms_keys_##SUF(const unsigned g[3], const unsigned b[3], unsigned shm,       \
                               void **p)                                                     \
    {                                                                                        \
        int n = *(int *)p[0], npad = *(int *)p[1];                                           \
        const T *scores = PTR(2);                                                            \
        unsigned long long *keys = PTR(3);                                                   \
        long long *idx = PTR(4);                                                             \
        (void)shm;                                                                           \
        if ((long long)g[0] * b[0] < npad || npad < n)                                       \
            violation("nms_keys: the grid does not cover the padded length");               \
        CHECK_DEV(scores, (size_t)n * sizeof(T));                                            \
        CHECK_DEV(keys, (size_t)npad * 8);                                                   \
        CHECK_DEV(idx, (size_t)npad * 8);                                                    \
        for (int i = 0; i < npad; i++) {                                                     \
            keys[i] = i < n ? nms_key_emu((double)scores[i]) : ~0ULL;                        \
            idx[i] = i;                                                                      \
        }                                                                                    \
    }
NMS_KEYS_EMU(float, f32)
NMS_KEYS_EMU(double, f64)

static void sort_pair_emu(unsigned long long *keys, long long *idx, int a, int b, int ascending)
{
    int greater = keys[a] > keys[b] || (keys[a] == keys[b] && idx[a] > idx[b]);
    if (greater == ascending) {
        unsigned long long tk = keys[a];
        long long ti = idx[a];
        keys[a] = keys[b], idx[a] = idx[b];
        keys[b] = tk, idx[b] = ti;
    }
}

static void nms_sort_wide(const unsigned g[3], const unsigned b[3], unsigned shm, void **p)
{
    int npad = *(int *)p[0], k = *(int *)p[1], j = *(int *)p[2];
    unsigned long long *keys = PTR(3);
    long long *idx = PTR(4);
    (void)shm;
    if ((long long)g[0] * b[0] < npad / 2 || j < 2048 || j >= k || k > npad)
        violation("nms_sort_wide: bad stage or grid");
    CHECK_DEV(keys, (size_t)npad * 8);
    CHECK_DEV(idx, (size_t)npad * 8);
    for (int t = 0; t < npad / 2; t++) {
        int a = 2 * j * (t / j) + t % j;
        sort_pair_emu(keys, idx, a, a + j, (a & k) == 0);
    }
}

static void nms_sort_local(const unsigned g[3], const unsigned b[3], unsigned shm, void **p)
{
    int k = *(int *)p[0];
    unsigned long long *keys = PTR(1);
    long long *idx = PTR(2);
    (void)shm;
    if (b[0] != 1024)
        violation("nms_sort_local: expected 1024 threads");
    CHECK_DEV(keys, (size_t)g[0] * 2048 * 8);
    CHECK_DEV(idx, (size_t)g[0] * 2048 * 8);
    for (unsigned blk = 0; blk < g[0]; blk++) {
        int base = (int)blk * 2048;
        int k0 = k ? k : 2, k1 = k ? k : 2048;
        for (int kk = k0; kk <= k1; kk <<= 1)
            for (int j = (kk < 2048 ? kk : 2048) >> 1; j > 0; j >>= 1)
                for (int t = 0; t < 1024; t++) {
                    int a = 2 * j * (t / j) + t % j;
                    sort_pair_emu(keys + base, idx + base, a, a + j, ((base + a) & kk) == 0);
                }
    }
}

static void nms_reduce(const unsigned g[3], const unsigned b[3], unsigned shm, void **p)
{
    int n = *(int *)p[0], cols = *(int *)p[1];
    const unsigned long long *mask = PTR(2);
    const long long *order = PTR(3);
    unsigned long long *rg = PTR(4);
    long long *keep = PTR(5), *count = PTR(6);
    if (g[0] != 1 || g[1] != 1 || b[0] < 32)
        violation("nms_reduce: expected one block");
    if (rg ? shm != 0 : shm < (unsigned)cols * 8)
        violation("nms_reduce: the removed set has no room");
    CHECK_DEV(mask, (size_t)n * cols * 8);
    CHECK_DEV(order, (size_t)n * 8);
    CHECK_DEV(keep, (size_t)n * 8);
    CHECK_DEV(count, 8);
    unsigned long long *removed = calloc((size_t)cols, 8);
    long long nk = 0;
    for (int i = 0; i < n; i++) {
        if (removed[i / 64] >> (i % 64) & 1)
            continue;
        keep[nk++] = order[i];
        for (int j = i / 64; j < cols; j++)
            removed[j] |= mask[(long long)i * cols + j];
    }
    *count = nk;
    free(removed);
}

#define MM_EMU(T, SUF)                                                                   \
    static void mm_##SUF(const unsigned g[3], const unsigned b[3], unsigned shm, void **p) \
    {                                                                                    \
        int n = *(int *)p[0], m = *(int *)p[1], k = *(int *)p[2];                        \
        const T *A = PTR(3);                                                             \
        long long sa0 = *(long long *)p[4], sa1 = *(long long *)p[5];                    \
        const T *B = PTR(6);                                                             \
        long long sb0 = *(long long *)p[7], sb1 = *(long long *)p[8];                    \
        T *C = PTR(9);                                                                   \
        (void)shm;                                                                       \
        if (b[0] != 256 || (long long)g[0] * 64 < m || (long long)g[1] * 64 < n)         \
            violation("mm: the grid does not cover the output");                         \
        CHECK_DEV(C, (size_t)n * m * sizeof(T));                                         \
        if (k) {                                                                         \
            CHECK_DEV(A, sizeof(T));                                                     \
            CHECK_DEV(B, sizeof(T));                                                     \
        }                                                                                \
        for (int i = 0; i < n; i++)                                                      \
            for (int j = 0; j < m; j++) {                                                \
                T acc = 0;                                                               \
                for (int q = 0; q < k; q++)                                              \
                    acc += A[i * sa0 + q * sa1] * B[q * sb0 + j * sb1];                  \
                C[(long long)i * m + j] = acc;                                           \
            }                                                                            \
    }
MM_EMU(float, f32)
MM_EMU(double, f64)

#define BIAS_EMU(T, SUF)                                                                   \
    static void conv2d_bias_##SUF(const unsigned g[3], const unsigned b[3], unsigned shm,  \
                                  void **p)                                                \
    {                                                                                      \
        long long total = *(long long *)p[0], plane = *(long long *)p[1];                  \
        int o = *(int *)p[2];                                                              \
        const T *bias = PTR(3);                                                            \
        T *out = PTR(4);                                                                   \
        int fill = *(int *)p[5];                                                           \
        (void)g, (void)b, (void)shm;                                                       \
        CHECK_DEV(out, (size_t)total * sizeof(T));                                         \
        if (bias)                                                                          \
            CHECK_DEV(bias, (size_t)o * sizeof(T));                                        \
        for (long long i = 0; i < total; i++) {                                            \
            T v = bias ? bias[i / plane % o] : (T)0;                                       \
            out[i] = fill ? v : out[i] + v;                                                \
        }                                                                                  \
    }
BIAS_EMU(float, f32)
BIAS_EMU(double, f64)

/* nms.cu's float16 and bfloat16 widening (cuda_fp16.h's __half2float,
 * cuda_bf16.h's __bfloat162float). */
static float fake_f16(unsigned short h)
{
    unsigned exp = (h >> 10) & 0x1f, mant = h & 0x3ff, u;
    float v;
    if (!exp) { /* zero or subnormal: mant * 2^-24 */
        v = (float)mant * 5.9604644775390625e-8f;
        return (h & 0x8000) ? -v : v;
    }
    u = ((unsigned)(h & 0x8000) << 16) | (exp == 0x1f ? 0x7f800000u : (exp + 112) << 23) |
        (mant << 13);
    memcpy(&v, &u, sizeof v);
    return v;
}
static float fake_bf16(unsigned short h)
{
    unsigned u = (unsigned)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#define WIDEN_EMU(SUF, CONV)                                                                 \
    static void nms_widen_##SUF(const unsigned g[3], const unsigned b[3], unsigned shm,     \
                                void **p)                                                    \
    {                                                                                        \
        int n = *(int *)p[0];                                                                \
        const unsigned short *src = PTR(1);                                                  \
        float *dst = PTR(2);                                                                 \
        (void)shm;                                                                           \
        if ((long long)g[0] * b[0] < n)                                                      \
            violation("nms_widen: the grid does not cover every value");                    \
        CHECK_DEV(src, (size_t)n * 2);                                                       \
        CHECK_DEV(dst, (size_t)n * 4);                                                       \
        for (int i = 0; i < n; i++)                                                          \
            dst[i] = CONV(src[i]);                                                           \
    }
WIDEN_EMU(f16, fake_f16)
WIDEN_EMU(bf16, fake_bf16)

/* half_wide_cuda.h's widening (dense float32 from strided 16-bit values)
 * and rounding (float32 to float16 / bfloat16, to nearest even). */
typedef struct hw_dims {
    long long d[4], s[4];
} hw_dims;
static unsigned short fake_to_f16(float f)
{
    unsigned u, a, sign, m, sh, q, rem, half;
    memcpy(&u, &f, sizeof u);
    sign = (u >> 16) & 0x8000;
    a = u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, the payload's top bits */
        return (unsigned short)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    if (a >= 0x477ff000u) /* 65520 and up (and infinity) round to infinity */
        return (unsigned short)(sign | 0x7c00);
    if (a >= 0x38800000u) /* normal: rebias, round the 13 dropped bits to even */
        return (unsigned short)(sign | ((a - 0x38000000u + 0xfff + ((a >> 13) & 1)) >> 13));
    sh = 126 - (a >> 23); /* subnormal: the value in units of 2^-24 */
    if (sh > 24)
        return (unsigned short)sign;
    m = (a & 0x7fffffu) | 0x800000u;
    q = m >> sh;
    rem = m & ((1u << sh) - 1);
    half = 1u << (sh - 1);
    return (unsigned short)(sign | (q + (rem > half || (rem == half && (q & 1)))));
}
static unsigned short fake_to_bf16(float f)
{
    unsigned u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (unsigned short)((u >> 16) | 0x40);
    return (unsigned short)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
#define HW_EMU(SUF, WIDEN, NARROW)                                                          \
    static void hw_widen_##SUF(const unsigned g[3], const unsigned b[3], unsigned shm,      \
                               void **p)                                                     \
    {                                                                                        \
        long long total = *(long long *)p[0];                                                \
        const hw_dims *a = p[1];                                                             \
        const unsigned short *src = PTR(2);                                                  \
        float *dst = PTR(3);                                                                 \
        (void)shm;                                                                           \
        if ((long long)g[0] * b[0] < total && g[0] < 65535 * 16)                             \
            violation("hw_widen: the grid does not cover the tensor");                      \
        CHECK_DEV(dst, (size_t)total * 4);                                                   \
        CHECK_DEV(src, 2);                                                                   \
        for (long long i = 0; i < total; i++) {                                              \
            long long r = i / a->d[3], i2 = r % a->d[2], i1, i0;                             \
            r /= a->d[2];                                                                    \
            i1 = r % a->d[1];                                                                \
            i0 = r / a->d[1];                                                                \
            dst[i] = WIDEN(src[i0 * a->s[0] + i1 * a->s[1] + i2 * a->s[2] +                  \
                               i % a->d[3] * a->s[3]]);                                      \
        }                                                                                    \
    }                                                                                        \
    static void hw_narrow_##SUF(const unsigned g[3], const unsigned b[3], unsigned shm,     \
                                void **p)                                                    \
    {                                                                                        \
        long long total = *(long long *)p[0];                                                \
        const float *src = PTR(1);                                                           \
        unsigned short *dst = PTR(2);                                                        \
        (void)shm;                                                                           \
        if ((long long)g[0] * b[0] < total && g[0] < 65535 * 16)                             \
            violation("hw_narrow: the grid does not cover the tensor");                     \
        CHECK_DEV(src, (size_t)total * 4);                                                   \
        CHECK_DEV(dst, (size_t)total * 2);                                                   \
        for (long long i = 0; i < total; i++)                                                \
            dst[i] = NARROW(src[i]);                                                         \
    }
HW_EMU(f16, fake_f16, fake_to_f16)
HW_EMU(bf16, fake_bf16, fake_to_bf16)

/* conv2d.cu's gather: dst [d0..d3] from src at strides s, zeros past the
 * extents e. */
typedef struct gather_args {
    long long d[4], e[4], s[4];
} gather_args;
#define GATHER_EMU(T, SUF)                                                                 \
    static void conv2d_gather_##SUF(const unsigned g[3], const unsigned b[3], unsigned shm, \
                                    void **p)                                              \
    {                                                                                      \
        long long total = *(long long *)p[0];                                              \
        const gather_args *a = p[1];                                                       \
        const T *src = PTR(2);                                                             \
        T *dst = PTR(3);                                                                   \
        (void)shm;                                                                         \
        if ((long long)g[0] * b[0] < total && g[0] < 65535 * 16)                           \
            violation("conv2d_gather: the grid does not cover the output");                \
        CHECK_DEV(dst, (size_t)total * sizeof(T));                                         \
        CHECK_DEV(src, sizeof(T));                                                         \
        for (long long i = 0; i < total; i++) {                                            \
            long long r = i, i3 = r % a->d[3], i2, i1, i0;                                 \
            r /= a->d[3];                                                                  \
            i2 = r % a->d[2];                                                              \
            r /= a->d[2];                                                                  \
            i1 = r % a->d[1];                                                              \
            i0 = r / a->d[1];                                                              \
            dst[i] = i0 < a->e[0] && i1 < a->e[1] && i2 < a->e[2] && i3 < a->e[3]          \
                         ? src[i0 * a->s[0] + i1 * a->s[1] + i2 * a->s[2] + i3 * a->s[3]]  \
                         : (T)0;                                                           \
        }                                                                                  \
    }
GATHER_EMU(float, f32)
GATHER_EMU(double, f64)

/* conv2d.cu's grad_bias: a block of 256 per channel, sums in double. */
#define GRAD_BIAS_EMU(T, SUF)                                                                \
    static void conv2d_grad_bias_##SUF(const unsigned g[3], const unsigned b[3],             \
                                       unsigned shm, void **p)                               \
    {                                                                                        \
        long long n = *(long long *)p[0], plane = *(long long *)p[2];                        \
        int o = *(int *)p[1];                                                                \
        const T *dy = PTR(3);                                                                \
        T *db = PTR(4);                                                                      \
        (void)shm;                                                                           \
        if (g[0] != (unsigned)o || b[0] != 256)                                              \
            violation("conv2d_grad_bias: expected a block of 256 per channel");              \
        CHECK_DEV(db, (size_t)o * sizeof(T));                                                \
        if (n * plane)                                                                       \
            CHECK_DEV(dy, (size_t)(n * o * plane) * sizeof(T));                              \
        for (int ch = 0; ch < o; ch++) {                                                     \
            double acc = 0;                                                                  \
            for (long long i = 0; i < n * plane; i++)                                        \
                acc += dy[(i / plane * o + ch) * plane + i % plane];                         \
            db[ch] = (T)acc;                                                                 \
        }                                                                                    \
    }
GRAD_BIAS_EMU(float, f32)
GRAD_BIAS_EMU(double, f64)

/* A kernel with 16 KiB of static shared memory that takes dynamic shared
 * memory too: writes the dynamic size it got to x[0] (tests/test_cuda.c). */
static void qcu_shared(const unsigned g[3], const unsigned b[3], unsigned shm, void **p)
{
    float *x = PTR(0);
    (void)g, (void)b;
    CHECK_DEV(x, sizeof(float));
    x[0] = (float)shm;
}

static kern kernels[] = {
    {"nms_gather_f32", nms_gather_f32, 0, 0},
    {"nms_gather_f64", nms_gather_f64, 0, 0},
    {"nms_mask_f32", nms_mask_f32, 64 * 5 * 4, 0},
    {"nms_mask_f64", nms_mask_f64, 64 * 5 * 8, 0},
    {"nms_reduce", nms_reduce, 64 * 16 + 16, 0},
    {"nms_keys_f32", nms_keys_f32, 0, 0},
    {"nms_keys_f64", nms_keys_f64, 0, 0},
    {"nms_sort_wide", nms_sort_wide, 0, 0},
    {"nms_sort_local", nms_sort_local, 2048 * 16, 0},
    {"nms_widen_f16", nms_widen_f16, 0, 0},
    {"nms_widen_bf16", nms_widen_bf16, 0, 0},
    {"hw_widen_f16", hw_widen_f16, 0, 0},
    {"hw_widen_bf16", hw_widen_bf16, 0, 0},
    {"hw_narrow_f16", hw_narrow_f16, 0, 0},
    {"hw_narrow_bf16", hw_narrow_bf16, 0, 0},
    {"mm_f32", mm_f32, 16 * (65 + 64) * 4, 0},
    {"mm_f64", mm_f64, 16 * (65 + 64) * 8, 0},
    {"conv2d_bias_f32", conv2d_bias_f32, 0, 0},
    {"conv2d_bias_f64", conv2d_bias_f64, 0, 0},
    {"conv2d_gather_f32", conv2d_gather_f32, 0, 0},
    {"conv2d_gather_f64", conv2d_gather_f64, 0, 0},
    {"conv2d_grad_bias_f32", conv2d_grad_bias_f32, 256 * 8, 0},
    {"conv2d_grad_bias_f64", conv2d_grad_bias_f64, 256 * 8, 0},
    {"qcu_shared", qcu_shared, 16 << 10, 0},
    {NULL, NULL, 0, 0},
};

/* The dynamic shared memory a launch of k may use: by default what the
 * static arrays leave of the 48 KiB every block gets (cuda.h). */
static int dyn_limit(const kern *k)
{
    return k->dyn_max ? k->dyn_max : FAKE_SHARED_PER_BLOCK - k->static_shared;
}

CUresult cuModuleGetFunction(CUfunction *f, CUmodule m, const char *name)
{
    (void)m;
    for (kern *k = kernels; k->name; k++)
        if (!strcmp(k->name, name)) {
            *f = (CUfunction)k;
            return 0;
        }
    return 500;
}
CUresult cuFuncGetAttribute(int *v, int attr, CUfunction f)
{
    if (attr == 1) /* CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES */
        *v = ((kern *)f)->static_shared;
    else if (attr == 8) /* CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES */
        *v = dyn_limit((kern *)f);
    else
        return 1;
    return 0;
}
CUresult cuFuncSetAttribute(CUfunction f, int attr, int v)
{
    kern *k = f;
    if (attr == 8) {
        if (v < 0 || k->static_shared + v > FAKE_SHARED_OPTIN)
            return 1; /* CUDA_ERROR_INVALID_VALUE */
        k->dyn_max = v;
    }
    return 0;
}
CUresult cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned shm, CUstream s, void **params,
                        void **extra)
{
    (void)s, (void)extra;
    need_ctx("cuLaunchKernel without a current context");
    if (!gx || !gy || !gz || !bx || !by || !bz || (unsigned long)bx * by * bz > 1024 ||
        gy > 65535 || gz > 65535)
        return 1;
    if ((long)shm > dyn_limit(f)) /* not opted in: the launch fails */
        return 1;
    const unsigned g[3] = {gx, gy, gz}, b[3] = {bx, by, bz};
    st.launches++;
    ((const kern *)f)->fn(g, b, shm, params);
    return 0;
}
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n)
{
    need_ctx("cuMemAlloc without a current context");
    if (!n)
        return 1;
    alloc *a = malloc(sizeof *a);
    a->p = malloc(n);
    a->n = n;
    a->next = allocs;
    allocs = a;
    memset(a->p, 0xA5, n); /* not zeroed, as on a GPU */
    st.live_allocs++;
    *p = (CUdeviceptr)(uintptr_t)a->p;
    return 0;
}
CUresult cuMemFree_v2(CUdeviceptr p)
{
    need_ctx("cuMemFree without a current context");
    for (alloc **a = &allocs; *a; a = &(*a)->next)
        if ((*a)->p == (char *)(uintptr_t)p) {
            alloc *x = *a;
            *a = x->next;
            free(x->p);
            free(x);
            st.live_allocs--;
            return 0;
        }
    violation("cuMemFree of memory cuMemAlloc did not return");
    return 1;
}
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, CUstream st_)
{
    (void)st_;
    need_ctx("copy without a current context");
    if (!is_dev((void *)(uintptr_t)d, n) || is_dev(s, n))
        violation("host-to-device copy between the wrong kinds of memory");
    memcpy((void *)(uintptr_t)d, s, n);
    return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, CUstream st_)
{
    (void)st_;
    need_ctx("copy without a current context");
    if (is_dev(d, n) || !is_dev((void *)(uintptr_t)s, n))
        violation("device-to-host copy between the wrong kinds of memory");
    memcpy(d, (void *)(uintptr_t)s, n);
    return 0;
}
CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr d, CUdeviceptr s, size_t n, CUstream st_)
{
    (void)st_;
    need_ctx("copy without a current context");
    if (!is_dev((void *)(uintptr_t)d, n) || !is_dev((void *)(uintptr_t)s, n))
        violation("device-to-device copy between the wrong kinds of memory");
    memmove((void *)(uintptr_t)d, (void *)(uintptr_t)s, n);
    return 0;
}
CUresult cuStreamSynchronize(CUstream s)
{
    (void)s;
    need_ctx("cuStreamSynchronize without a current context");
    return 0;
}
/* Synchronous copies, for tests that use the driver themselves. */
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n)
{
    return cuMemcpyHtoDAsync_v2(d, s, n, NULL);
}
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n)
{
    return cuMemcpyDtoHAsync_v2(d, s, n, NULL);
}
CUresult cuCtxSynchronize(void)
{
    need_ctx("cuCtxSynchronize without a current context");
    return 0;
}
