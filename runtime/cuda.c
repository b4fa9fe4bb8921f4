/* runtime/cuda.c - CUDA devices through the Driver API, loaded at run time.
 *
 * Nothing happens until it is needed: the first CUDA call (or the loader
 * asking whether CUDA is usable) dlopens libcuda.so.1 and runs cuInit; a
 * device's primary context is retained on its first call; a module's device
 * code is loaded into a context on its first call there. The driver stays
 * loaded for the life of the process (outputs may outlive the runtime, and
 * their deleters call cuMemFree).
 *
 * The driver's types and entry points are declared here, an ABI-stable
 * subset of cuda.h, so the library builds without the toolkit. Versioned
 * entry points are taken by their _v2 symbol names (what cuda.h maps the
 * plain names to), which the driver keeps exporting.
 *
 * Image choice for a device of compute capability X.Y (number XY): the
 * cubin built for sm_XY; else the highest compute_NN PTX with NN <= XY (the
 * driver JIT-compiles it); else a cubin of the same major version built
 * for a lower minor (binary compatible). Each candidate is tried in turn. */
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/cuda.h"
#include "runtime/settings.h"
#include "opjit_build_config.h"

/* ---- the driver ---------------------------------------------------------- */

typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
/* CUmemPoolProps: the same size and leading fields in CUDA 11.2 to 13. */
typedef struct {
    int alloc_type;   /* CU_MEM_ALLOCATION_TYPE_PINNED */
    int handle_types; /* none */
    int location_type, location_id;
    void *win32_security_attributes;
    unsigned char reserved[64];
} cuda_pool_props;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209,
    CUDA_ERROR_INVALID_PTX = 218,
    CUDA_ERROR_JIT_COMPILER_NOT_FOUND = 221,
    CUDA_ERROR_UNSUPPORTED_PTX_VERSION = 222,
    CUDA_ERROR_NOT_FOUND = 500,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    CU_JIT_ERROR_LOG_BUFFER = 5,
    CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES = 6,
    CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED = 115,
    CU_MEM_ALLOCATION_TYPE_PINNED = 1,
    CU_MEM_LOCATION_TYPE_DEVICE = 1,
    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD = 4,
};

/* X(field, symbol, return, parameters) */
#define CUDA_DRIVER_FUNCS(X)                                                            \
    X(GetErrorName, "cuGetErrorName", CUresult, (CUresult, const char **))              \
    X(GetErrorString, "cuGetErrorString", CUresult, (CUresult, const char **))          \
    X(Init, "cuInit", CUresult, (unsigned))                                             \
    X(DriverGetVersion, "cuDriverGetVersion", CUresult, (int *))                        \
    X(DeviceGetCount, "cuDeviceGetCount", CUresult, (int *))                            \
    X(DeviceGet, "cuDeviceGet", CUresult, (CUdevice *, int))                            \
    X(DeviceGetAttribute, "cuDeviceGetAttribute", CUresult, (int *, int, CUdevice))     \
    X(PrimaryCtxRetain, "cuDevicePrimaryCtxRetain", CUresult, (CUcontext *, CUdevice))  \
    X(PrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", CUresult, (CUdevice))          \
    X(CtxPushCurrent, "cuCtxPushCurrent_v2", CUresult, (CUcontext))                     \
    X(CtxPopCurrent, "cuCtxPopCurrent_v2", CUresult, (CUcontext *))                     \
    X(ModuleLoadDataEx, "cuModuleLoadDataEx", CUresult,                                 \
      (CUmodule *, const void *, unsigned, int *, void **))                             \
    X(ModuleUnload, "cuModuleUnload", CUresult, (CUmodule))                             \
    X(ModuleGetFunction, "cuModuleGetFunction", CUresult,                               \
      (CUfunction *, CUmodule, const char *))                                           \
    X(FuncGetAttribute, "cuFuncGetAttribute", CUresult, (int *, int, CUfunction))       \
    X(FuncSetAttribute, "cuFuncSetAttribute", CUresult, (CUfunction, int, int))         \
    X(LaunchKernel, "cuLaunchKernel", CUresult,                                         \
      (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, \
       CUstream, void **, void **))                                                     \
    X(MemAlloc, "cuMemAlloc_v2", CUresult, (CUdeviceptr *, size_t))                     \
    X(MemFree, "cuMemFree_v2", CUresult, (CUdeviceptr))                                 \
    X(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", CUresult,                                \
      (CUdeviceptr, const void *, size_t, CUstream))                                    \
    X(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", CUresult,                                \
      (void *, CUdeviceptr, size_t, CUstream))                                          \
    X(MemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2", CUresult,                                \
      (CUdeviceptr, CUdeviceptr, size_t, CUstream))                                     \
    X(StreamSynchronize, "cuStreamSynchronize", CUresult, (CUstream))

/* Optional (CUDA 11.2+): stream-ordered allocation of outputs from a pool. */
#define CUDA_DRIVER_OPTIONAL_FUNCS(X)                                                   \
    X(MemPoolCreate, "cuMemPoolCreate", CUresult, (CUmemoryPool *, const cuda_pool_props *)) \
    X(MemPoolSetAttribute, "cuMemPoolSetAttribute", CUresult, (CUmemoryPool, int, void *)) \
    X(MemPoolTrimTo, "cuMemPoolTrimTo", CUresult, (CUmemoryPool, size_t))               \
    X(MemAllocFromPoolAsync, "cuMemAllocFromPoolAsync", CUresult,                       \
      (CUdeviceptr *, size_t, CUmemoryPool, CUstream))                                  \
    X(MemFreeAsync, "cuMemFreeAsync", CUresult, (CUdeviceptr, CUstream))                \
    X(CtxSynchronize, "cuCtxSynchronize", CUresult, (void))

static struct {
    pthread_once_t once;
    int status; /* OPJIT_OK, or OPJIT_EDEVICE with why */
    char why[768];
    void *dl;
    int version; /* cuDriverGetVersion: 12040 for 12.4 */
    int ndev;
    CUdevice dev[CUDA_MAX_DEVICES];
    int cc[CUDA_MAX_DEVICES]; /* major * 10 + minor */
#define X(field, symbol, ret, params) ret(*field) params;
    CUDA_DRIVER_FUNCS(X)
    CUDA_DRIVER_OPTIONAL_FUNCS(X)
#undef X
    /* Per device: the pool outputs come from (pool_state 1), or none
     * (-1: plain cuMemAlloc); 0 until the first output. */
    pthread_mutex_t pool_lock;
    int pool_state[CUDA_MAX_DEVICES];
    CUmemoryPool pool[CUDA_MAX_DEVICES];
} drv = {.once = PTHREAD_ONCE_INIT, .pool_lock = PTHREAD_MUTEX_INITIALIZER};

/* "CUDA_ERROR_NO_DEVICE: no CUDA-capable device is detected" */
static const char *cu_err(CUresult r, char *buf, size_t n)
{
    const char *name = NULL, *str = NULL;
    if (drv.GetErrorName)
        drv.GetErrorName(r, &name);
    if (drv.GetErrorString)
        drv.GetErrorString(r, &str);
    if (name && str)
        snprintf(buf, n, "%s: %s", name, str);
    else
        snprintf(buf, n, "CUDA error %d", r);
    return buf;
}

int cuda_driver_findable(const char *ld_library_path, const char *ld_cache,
                         const char *const *dirs)
{
    static const char name[] = "libcuda.so.1";
    if (ld_library_path && *ld_library_path)
        return 1;
    int fd = open(ld_cache, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || st.st_size <= 0) {
        if (fd >= 0)
            close(fd);
        return 1; /* no cache to tell: dlopen looks */
    }
    void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m == MAP_FAILED)
        return 1;
    /* Its names and paths end with a NUL: "libcuda.so.1" and its NUL are
     * in the cache exactly when the library is. */
    int found = memmem(m, (size_t)st.st_size, name, sizeof name) != NULL;
    munmap(m, (size_t)st.st_size);
    for (int i = 0; !found && dirs[i]; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", dirs[i], name);
        found = access(path, F_OK) == 0;
    }
    return found;
}

/* The directories ld.so searches after its cache (its trusted ones). */
static const char *const driver_system_dirs[] = {
    "/lib/" OPJIT_HOST_MACHINE "-linux-gnu", "/usr/lib/" OPJIT_HOST_MACHINE "-linux-gnu",
    "/lib64", "/usr/lib64", "/lib", "/usr/lib", NULL};

static void driver_load(void)
{
    const char *path = settings_libs_get()->cuda_driver; /* another driver library: tests */
    drv.status = OPJIT_EDEVICE;
    if (!path && !cuda_driver_findable(settings_libs_get()->ld_library_path, "/etc/ld.so.cache",
                                       driver_system_dirs)) {
        snprintf(drv.why, sizeof drv.why, "no libcuda.so.1: not in /etc/ld.so.cache, "
                 "$LD_LIBRARY_PATH or the system's library directories (the NVIDIA driver is "
                 "not installed, or not visible here; $OPJIT_CUDA_DRIVER names one elsewhere)");
        return;
    }
    if (!path)
        path = "libcuda.so.1";
    drv.dl = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!drv.dl) {
        const char *why = dlerror();
        snprintf(drv.why, sizeof drv.why,
                 "no %s: %s (the NVIDIA driver is not installed, or not visible here)", path,
                 why ? why : "dlopen failed");
        return;
    }
    void *p;
#define X(field, symbol, ret, params)                                                    \
    p = dlsym(drv.dl, symbol);                                                           \
    if (!p && !strcmp(symbol, "cuDevicePrimaryCtxRelease_v2"))                           \
        p = dlsym(drv.dl, "cuDevicePrimaryCtxRelease");                                  \
    if (!p) {                                                                            \
        snprintf(drv.why, sizeof drv.why,                                                \
                 "%s lacks %s: the CUDA driver is too old (opjit needs CUDA 11 or later)", \
                 path, symbol);                                                          \
        return;                                                                          \
    }                                                                                    \
    memcpy(&drv.field, &p, sizeof p);
    CUDA_DRIVER_FUNCS(X)
#undef X
#define X(field, symbol, ret, params)                                                    \
    p = dlsym(drv.dl, symbol);                                                           \
    memcpy(&drv.field, &p, sizeof p);
    CUDA_DRIVER_OPTIONAL_FUNCS(X)
#undef X
    char e[256];
    CUresult r = drv.Init(0);
    if (r == CUDA_ERROR_NO_DEVICE) {
        snprintf(drv.why, sizeof drv.why, "no CUDA device (cuInit: %s)", cu_err(r, e, sizeof e));
        return;
    }
    if (r) {
        snprintf(drv.why, sizeof drv.why, "the CUDA driver did not initialise (cuInit: %s)",
                 cu_err(r, e, sizeof e));
        return;
    }
    drv.DriverGetVersion(&drv.version);
    int n = 0;
    if ((r = drv.DeviceGetCount(&n))) {
        snprintf(drv.why, sizeof drv.why, "cuDeviceGetCount: %s", cu_err(r, e, sizeof e));
        return;
    }
    if (n > CUDA_MAX_DEVICES)
        n = CUDA_MAX_DEVICES;
    for (int i = 0; i < n; i++) {
        int major = 0, minor = 0;
        if ((r = drv.DeviceGet(&drv.dev[i], i)) ||
            (r = drv.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                        drv.dev[i])) ||
            (r = drv.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                        drv.dev[i]))) {
            snprintf(drv.why, sizeof drv.why, "CUDA device %d: %s", i, cu_err(r, e, sizeof e));
            return;
        }
        drv.cc[i] = major * 10 + minor;
    }
    drv.ndev = n;
    if (!n) {
        snprintf(drv.why, sizeof drv.why, "no CUDA device (the driver reports none)");
        return;
    }
    drv.status = OPJIT_OK;
}

/* The driver is loaded and initialised (devices may still be 0). */
static int driver(char *why, size_t n)
{
    pthread_once(&drv.once, driver_load);
    if (drv.status && why)
        snprintf(why, n, "%s", drv.why);
    return drv.status;
}

int cuda_available(char *why, size_t n) { return driver(why, n); }

int cuda_device_archs(int *cc, int max)
{
    if (driver(NULL, 0))
        return 0;
    int n = drv.ndev < max ? drv.ndev : max;
    memcpy(cc, drv.cc, (size_t)n * sizeof *cc);
    return n;
}

/* ---- device code ---------------------------------------------------------------- */

typedef struct cuda_image {
    char arch[24];
    int number; /* 90 */
    int ptx;
    int specific; /* sm_90a: this exact device only */
    size_t size;
    unsigned char *data; /* PTX: NUL-terminated */
    size_t mapped;       /* non-zero: data is a read-only mapping of this many bytes */
    char producer[64];
} cuda_image;

typedef struct cuda_fn {
    char *name;
    CUfunction f;
    unsigned dyn_shared; /* the dynamic shared memory limit set on it */
    struct cuda_fn *next;
} cuda_fn;

/* A module's device code loaded into one context. */
typedef struct cuda_loaded {
    CUcontext cuctx;
    CUmodule mod;
    const cuda_image *image;
    pthread_mutex_t lock; /* fns */
    cuda_fn *fns;
    struct cuda_loaded *next;
} cuda_loaded;

struct cuda_module {
    char *source;
    int nimages;
    cuda_image *images;
    pthread_mutex_t lock; /* loaded */
    cuda_loaded *loaded;
    _Atomic(cuda_loaded *) by_dev[CUDA_MAX_DEVICES]; /* last used per device */
};

cuda_module *cuda_module_new(const char *source)
{
    cuda_module *cm = calloc(1, sizeof *cm);
    if (!cm || !(cm->source = strdup(source ? source : "?"))) {
        free(cm);
        return NULL;
    }
    pthread_mutex_init(&cm->lock, NULL);
    return cm;
}

/* "sm_90" -> 90, ptx 0; "compute_90" -> 90, ptx 1; *specific for "sm_90a". */
static int arch_parse(const char *s, int *number, int *ptx, int *specific)
{
    int n = 0;
    if (!strncmp(s, "sm_", 3))
        *ptx = 0, s += 3;
    else if (!strncmp(s, "compute_", 8))
        *ptx = 1, s += 8;
    else
        return 0;
    if (*s < '1' || *s > '9')
        return 0;
    while (*s >= '0' && *s <= '9' && n < 10000)
        n = n * 10 + (*s++ - '0');
    *specific = *s == 'a' || *s == 'f';
    if (*specific)
        s++;
    if (*s || n < 10)
        return 0;
    *number = n;
    return 1;
}

/* The image of arch at data (size bytes; mapped: a mapping of that many,
 * else malloc'd with room for a NUL) into cm. */
static int image_add(cuda_module *cm, const char *arch, unsigned char *data, size_t size,
                     size_t mapped, const char *producer)
{
    int number, ptx, specific;
    if (!cm || !arch || strlen(arch) >= sizeof cm->images->arch ||
        !arch_parse(arch, &number, &ptx, &specific) || !data || (mapped && ptx))
        return OPJIT_EINVAL;
    cuda_image *v = realloc(cm->images, (size_t)(cm->nimages + 1) * sizeof *v);
    if (!v)
        return OPJIT_ENOMEM;
    cm->images = v;
    cuda_image *im = &v[cm->nimages];
    memset(im, 0, sizeof *im);
    im->data = data;
    if (!mapped)
        im->data[size] = 0;
    im->mapped = mapped;
    im->size = size;
    snprintf(im->arch, sizeof im->arch, "%s", arch);
    snprintf(im->producer, sizeof im->producer, "%s", producer ? producer : "NVRTC");
    im->number = number;
    im->ptx = ptx;
    im->specific = specific;
    cm->nimages++;
    return OPJIT_OK;
}

int cuda_module_take_image(cuda_module *cm, const char *arch, unsigned char *data, size_t size,
                           const char *producer)
{
    return image_add(cm, arch, data, size, 0, producer);
}

int cuda_module_map_image(cuda_module *cm, const char *arch, const char *path,
                          const char *producer)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return OPJIT_EIO;
    void *p = fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0
                  ? MAP_FAILED
                  : mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return OPJIT_EIO;
    int rc = image_add(cm, arch, p, (size_t)st.st_size, (size_t)st.st_size, producer);
    if (rc)
        munmap(p, (size_t)st.st_size);
    return rc;
}

const char *cuda_module_archs(const cuda_module *cm, char *buf, size_t n)
{
    size_t k = 0;
    if (n)
        buf[0] = '\0';
    for (int i = 0; cm && i < cm->nimages && k < n; i++)
        k += (size_t)snprintf(buf + k, n - k, "%s%s", i ? "," : "", cm->images[i].arch);
    return buf;
}

void cuda_module_free(cuda_module *cm)
{
    if (!cm)
        return;
    for (cuda_loaded *l = cm->loaded, *next; l; l = next) {
        next = l->next;
        if (drv.CtxPushCurrent && drv.CtxPushCurrent(l->cuctx) == CUDA_SUCCESS) {
            /* A replaced module's last launches may still be queued. */
            if (drv.CtxSynchronize)
                drv.CtxSynchronize();
            drv.ModuleUnload(l->mod);
            CUcontext dummy;
            drv.CtxPopCurrent(&dummy);
        }
        for (cuda_fn *f = l->fns, *fn; f; f = fn) {
            fn = f->next;
            free(f->name);
            free(f);
        }
        pthread_mutex_destroy(&l->lock);
        free(l);
    }
    for (int i = 0; i < cm->nimages; i++) {
        if (cm->images[i].mapped)
            munmap(cm->images[i].data, cm->images[i].mapped);
        else
            free(cm->images[i].data);
    }
    free(cm->images);
    pthread_mutex_destroy(&cm->lock);
    free(cm->source);
    free(cm);
}

/* Candidate images for a device, best first; returns how many. */
static int candidates(const cuda_module *cm, int cc, int *order, int max)
{
    int n = 0;
    for (int i = 0; i < cm->nimages && n < max; i++) /* the exact cubin */
        if (!cm->images[i].ptx && cm->images[i].number == cc)
            order[n++] = i;
    for (;;) { /* PTX, highest first */
        int best = -1;
        for (int i = 0; i < cm->nimages; i++) {
            const cuda_image *im = &cm->images[i];
            int taken = 0;
            for (int j = 0; j < n; j++)
                taken |= order[j] == i;
            if (!taken && im->ptx && !im->specific && im->number <= cc &&
                (best < 0 || im->number > cm->images[best].number))
                best = i;
        }
        if (best < 0 || n == max)
            break;
        order[n++] = best;
    }
    for (;;) { /* a binary-compatible cubin: same major, lower minor */
        int best = -1;
        for (int i = 0; i < cm->nimages; i++) {
            const cuda_image *im = &cm->images[i];
            int taken = 0;
            for (int j = 0; j < n; j++)
                taken |= order[j] == i;
            if (!taken && !im->ptx && !im->specific && im->number / 10 == cc / 10 &&
                im->number < cc && (best < 0 || im->number > cm->images[best].number))
                best = i;
        }
        if (best < 0 || n == max)
            break;
        order[n++] = best;
    }
    return n;
}

/* Record mod, loaded from im into cuctx, on cm (cm->lock held). */
static int loaded_add(cuda_module *cm, CUcontext cuctx, int id, const cuda_image *im,
                      CUmodule mod, cuda_loaded **out, char *why, size_t whylen)
{
    cuda_loaded *l = calloc(1, sizeof *l);
    if (!l) {
        drv.ModuleUnload(mod);
        snprintf(why, whylen, "out of memory");
        return OPJIT_ENOMEM;
    }
    l->cuctx = cuctx;
    l->mod = mod;
    l->image = im;
    pthread_mutex_init(&l->lock, NULL);
    l->next = cm->loaded;
    cm->loaded = l;
    atomic_store_explicit(&cm->by_dev[id], l, memory_order_release);
    *out = l;
    return OPJIT_OK;
}

/* Load the first of cm's images (order: n candidates, best first) that
 * the driver takes into the current context cuctx; cm->lock held. Else
 * OPJIT_EDEVICE with what each attempt said in tried, and *too_old the
 * first image whose PTX is too new for the driver (-1: none). */
static int load_first_image(cuda_module *cm, CUcontext cuctx, int id, const int *order, int n,
                            cuda_loaded **out, int *too_old, char *tried, size_t triedlen,
                            char *why, size_t whylen)
{
    size_t t = 0;
    *too_old = -1;
    for (int i = 0; i < n; i++) {
        const cuda_image *im = &cm->images[order[i]];
        char log[1024] = "";
        int opts[2] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
        void *vals[2] = {log, (void *)(uintptr_t)sizeof log};
        CUmodule mod = NULL;
        CUresult r = drv.ModuleLoadDataEx(&mod, im->data, 2, opts, vals);
        if (r == CUDA_SUCCESS)
            return loaded_add(cm, cuctx, id, im, mod, out, why, whylen);
        if (r == CUDA_ERROR_UNSUPPORTED_PTX_VERSION && *too_old < 0)
            *too_old = order[i];
        char e[256];
        log[sizeof log - 1] = '\0';
        if (t < triedlen)
            t += (size_t)snprintf(tried + t, triedlen - t, "%s%s: %s%s%.300s", t ? "; " : "",
                                  im->arch, cu_err(r, e, sizeof e), log[0] ? ": " : "", log);
    }
    return OPJIT_EDEVICE;
}

/* Why none of cm's n candidate images loaded on device id (sm_cc). */
static void no_device_code(const cuda_module *cm, int id, int cc, int n, int too_old,
                           const char *tried, char *why, size_t whylen)
{
    char have[256];
    cuda_module_archs(cm, have, sizeof have);
    if (too_old >= 0) {
        const cuda_image *im = &cm->images[too_old];
        snprintf(why, whylen,
                 "driver too old for this PTX: %s's %s PTX comes from %s, newer than what the "
                 "driver (CUDA %d.%d) accepts; update the driver, or warm a cubin for this "
                 "GPU (OPJIT_CUDA_ARCHS=sm_%d) [%s]",
                 cm->source, im->arch, im->producer, drv.version / 1000,
                 drv.version % 1000 / 10, cc, tried);
    } else if (!n) {
        snprintf(why, whylen,
                 "%s has no device code this GPU can run: CUDA device %d is sm_%d and the "
                 "module was built for %s; add sm_%d (or compute_NN with NN <= %d) to "
                 "OPJIT_CUDA_ARCHS and load again",
                 cm->source, id, cc, have, cc, cc);
    } else {
        snprintf(why, whylen, "%s: cannot load its device code on CUDA device %d (sm_%d): %s",
                 cm->source, id, cc, tried);
    }
}

/* Load cm's device code into the current context (d's), once. */
static int module_loaded(cuda_module *cm, CUcontext cuctx, int id, cuda_loaded **out, char *why,
                         size_t whylen)
{
    cuda_loaded *l = atomic_load_explicit(&cm->by_dev[id], memory_order_acquire);
    if (l && l->cuctx == cuctx) {
        *out = l;
        return OPJIT_OK;
    }
    *out = NULL;
    if (!cm->nimages)
        return OPJIT_OK; /* a host half without device code: launches fail */
    int rc = OPJIT_OK, cc = drv.cc[id], n = 0, too_old = -1, order[64];
    char tried[1536] = "";
    pthread_mutex_lock(&cm->lock);
    for (l = cm->loaded; l; l = l->next)
        if (l->cuctx == cuctx)
            break;
    if (l) { /* loaded into this context already */
        atomic_store_explicit(&cm->by_dev[id], l, memory_order_release);
        *out = l;
    } else {
        n = candidates(cm, cc, order, 64);
        rc = load_first_image(cm, cuctx, id, order, n, out, &too_old, tried, sizeof tried, why,
                              whylen);
    }
    pthread_mutex_unlock(&cm->lock);
    if (rc == OPJIT_EDEVICE)
        no_device_code(cm, id, cc, n, too_old, tried, why, whylen);
    return rc;
}

/* ---- per runtime ------------------------------------------------------------------- */

typedef struct cuda_ovf {
    CUdeviceptr p;
    struct cuda_ovf *next;
} cuda_ovf;

typedef struct cuda_ws {
    CUdeviceptr base;
    size_t cap, used, want;
    cuda_ovf *ovf;
    struct cuda_ws *next;
} cuda_ws;

typedef struct cuda_dev {
    atomic_int ready;    /* ctx and stream are set */
    CUcontext ctx;       /* what calls run in */
    CUstream stream;
    CUcontext primary;   /* retained primary context, or NULL */
    CUcontext host_ctx;  /* from opjit_set_cuda_stream */
    CUstream host_stream;
    cuda_ws *free_ws;
} cuda_dev;

struct cuda_rt {
    pthread_mutex_t lock;
    cuda_dev dev[CUDA_MAX_DEVICES];
};

cuda_rt *cuda_rt_new(void)
{
    cuda_rt *c = calloc(1, sizeof *c);
    if (c)
        pthread_mutex_init(&c->lock, NULL);
    return c;
}

/* The overflow blocks of ws and its arena, freed (the arena to be sized
 * anew). */
static void ws_drop(cuda_ws *ws)
{
    while (ws->ovf) {
        cuda_ovf *o = ws->ovf;
        ws->ovf = o->next;
        drv.MemFree(o->p);
        free(o);
    }
    if (ws->base)
        drv.MemFree(ws->base);
    ws->base = 0;
    ws->cap = 0;
}

static void ws_free_list(cuda_ws *ws)
{
    while (ws) {
        cuda_ws *next = ws->next;
        ws_drop(ws);
        free(ws);
        ws = next;
    }
}

/* Free d's pooled workspaces (in d->ctx); c->lock held. */
static void dev_drop_pool(cuda_dev *d)
{
    if (!d->free_ws)
        return;
    CUcontext dummy;
    if (drv.CtxPushCurrent(d->ctx) == CUDA_SUCCESS) {
        ws_free_list(d->free_ws);
        drv.CtxPopCurrent(&dummy);
    }
    d->free_ws = NULL;
}

void cuda_rt_free(cuda_rt *c)
{
    if (!c)
        return;
    for (int i = 0; i < CUDA_MAX_DEVICES; i++) {
        cuda_dev *d = &c->dev[i];
        if (d->free_ws && d->ctx)
            dev_drop_pool(d);
        if (d->primary)
            drv.PrimaryCtxRelease(drv.dev[i]);
    }
    /* Give back what the output pools keep unused. */
    pthread_mutex_lock(&drv.pool_lock);
    for (int i = 0; i < CUDA_MAX_DEVICES; i++)
        if (drv.pool_state[i] > 0)
            drv.MemPoolTrimTo(drv.pool[i], 0);
    pthread_mutex_unlock(&drv.pool_lock);
    pthread_mutex_destroy(&c->lock);
    free(c);
}

int opjit_set_cuda_stream(opjit_runtime *rt, int device, void *cu_context, void *cu_stream)
{
    if (!rt)
        return OPJIT_EINVAL;
    if (device < 0 || device >= CUDA_MAX_DEVICES)
        return rt_error(rt, OPJIT_EINVAL, "opjit_set_cuda_stream: bad device %d", device);
    cuda_rt *c = rt->cuda;
    cuda_dev *d = &c->dev[device];
    pthread_mutex_lock(&c->lock);
    if (atomic_load(&d->ready)) {
        /* Pooled workspaces were last used on the old stream: let that
         * work finish, and give them back in their own context. */
        CUcontext dummy;
        if (drv.CtxPushCurrent(d->ctx) == CUDA_SUCCESS) {
            drv.StreamSynchronize(d->stream);
            drv.CtxPopCurrent(&dummy);
        }
        dev_drop_pool(d);
        atomic_store(&d->ready, 0);
    }
    d->host_ctx = (CUcontext)cu_context;
    d->host_stream = (CUstream)cu_stream;
    pthread_mutex_unlock(&c->lock);
    return OPJIT_OK;
}

static int dev_ready(opjit_runtime *rt, cuda_dev *d, int id, char *why, size_t n)
{
    cuda_rt *c = rt->cuda;
    int rc = OPJIT_OK;
    pthread_mutex_lock(&c->lock);
    if (!atomic_load(&d->ready)) {
        CUcontext ctx = d->host_ctx;
        if (!ctx) {
            CUresult r = d->primary ? CUDA_SUCCESS : drv.PrimaryCtxRetain(&d->primary, drv.dev[id]);
            if (r) {
                char e[256];
                d->primary = NULL;
                snprintf(why, n, "cannot use CUDA device %d (cuDevicePrimaryCtxRetain: %s)", id,
                         cu_err(r, e, sizeof e));
                rc = r == CUDA_ERROR_OUT_OF_MEMORY ? OPJIT_ENOMEM : OPJIT_EDEVICE;
            }
            ctx = d->primary;
        }
        if (!rc) {
            d->ctx = ctx;
            d->stream = d->host_stream;
            atomic_store_explicit(&d->ready, 1, memory_order_release);
        }
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

/* ---- calls --------------------------------------------------------------------------- */

int cuda_call_begin(opjit_ctx *ctx)
{
    opjit_runtime *rt = ctx->rt;
    const char *op = ctx->k->sch->name;
    char why[2560];
    if (driver(why, sizeof why))
        return rt_error(rt, OPJIT_EDEVICE, "%s: cannot run on CUDA: %s", op, why);
    int id = ctx->device_id;
    if (id < 0 || id >= drv.ndev)
        return rt_error(rt, OPJIT_EDEVICE,
                        "%s: the tensors are on CUDA device %d, but there is no such device "
                        "(%d found)", op, id, drv.ndev);
    cuda_dev *d = &rt->cuda->dev[id];
    int rc;
    if (!atomic_load_explicit(&d->ready, memory_order_acquire) &&
        (rc = dev_ready(rt, d, id, why, sizeof why)))
        return rt_error(rt, rc, "%s: %s", op, why);
    char e[256];
    CUresult r = drv.CtxPushCurrent(d->ctx);
    if (r)
        return rt_error(rt, OPJIT_EDEVICE, "%s: cannot make the context of CUDA device %d "
                        "current: %s", op, id, cu_err(r, e, sizeof e));
    ctx->pushed = 1;
    ctx->cdev = d;
    cuda_module *cm = ctx->k->mod->cuda;
    if (cm && (rc = module_loaded(cm, d->ctx, id, &ctx->cmod, why, sizeof why))) {
        cuda_call_end(ctx);
        return rt_error(rt, rc, "%s: %s", op, why);
    }
    return OPJIT_OK;
}

static void ws_release(cuda_rt *c, cuda_dev *d, cuda_ws *ws)
{
    if (ws->ovf) {
        /* It did not fit: size the arena to the whole demand for next time,
         * once the work queued by this call no longer uses it. */
        drv.StreamSynchronize(d->stream);
        ws_drop(ws);
        if (drv.MemAlloc(&ws->base, ws->want) == CUDA_SUCCESS)
            ws->cap = ws->want;
        else
            ws->base = 0;
    }
    ws->used = 0;
    ws->want = 0;
    pthread_mutex_lock(&c->lock);
    ws->next = d->free_ws;
    d->free_ws = ws;
    pthread_mutex_unlock(&c->lock);
}

void cuda_call_end(opjit_ctx *ctx)
{
    /* The kernel may have copied from host memory the runtime reuses (its
     * workspace): with pinned memory the copy reads it asynchronously. */
    if (ctx->htod_pending && ctx->cdev) {
        drv.StreamSynchronize(ctx->cdev->stream);
        ctx->htod_pending = 0;
    }
    if (ctx->dws) {
        ws_release(ctx->rt->cuda, ctx->cdev, ctx->dws);
        ctx->dws = NULL;
    }
    if (ctx->pushed) {
        CUcontext dummy;
        drv.CtxPopCurrent(&dummy);
        ctx->pushed = 0;
    }
}

/* Queue a copy on s (a device-to-host copy is waited for, as is every
 * copy when sync). *what names the direction; -1 for a bad kind. */
static CUresult copy_on(CUstream s, void *dst, const void *src, size_t bytes, int kind, int sync,
                        const char **what)
{
    CUresult r;
    switch (kind) {
    case OPJIT_COPY_HTOD:
        *what = "host to device";
        r = drv.MemcpyHtoDAsync((CUdeviceptr)(uintptr_t)dst, src, bytes, s);
        break;
    case OPJIT_COPY_DTOH:
        *what = "device to host";
        r = drv.MemcpyDtoHAsync(dst, (CUdeviceptr)(uintptr_t)src, bytes, s);
        sync = 1;
        break;
    case OPJIT_COPY_DTOD:
        *what = "device to device";
        r = drv.MemcpyDtoDAsync((CUdeviceptr)(uintptr_t)dst, (CUdeviceptr)(uintptr_t)src, bytes,
                                s);
        break;
    default:
        *what = "?";
        return -1;
    }
    if (!r && sync)
        r = drv.StreamSynchronize(s);
    return r;
}

/* Device id's pool for outputs, made on first use: memory freed by an
 * output's deleter goes back to it (cuMemFreeAsync, no device-wide
 * synchronisation as cuMemFree has) and is reused by later outputs on the
 * same stream. It keeps what it holds (the release threshold is unlimited,
 * as PyTorch's caching allocator does) until opjit_destroy trims it. NULL
 * where the driver or device has no memory pools. */
static CUmemoryPool output_pool(int id)
{
    pthread_mutex_lock(&drv.pool_lock);
    if (!drv.pool_state[id]) {
        int ok = 0;
        drv.pool_state[id] = -1;
        if (drv.MemPoolCreate && drv.MemPoolSetAttribute && drv.MemPoolTrimTo &&
            drv.MemAllocFromPoolAsync && drv.MemFreeAsync &&
            drv.DeviceGetAttribute(&ok, CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
                                   drv.dev[id]) == CUDA_SUCCESS && ok) {
            cuda_pool_props props;
            memset(&props, 0, sizeof props);
            props.alloc_type = CU_MEM_ALLOCATION_TYPE_PINNED;
            props.location_type = CU_MEM_LOCATION_TYPE_DEVICE;
            props.location_id = drv.dev[id];
            unsigned long long keep = ~0ull;
            if (drv.MemPoolCreate(&drv.pool[id], &props) == CUDA_SUCCESS) {
                drv.MemPoolSetAttribute(drv.pool[id], CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep);
                drv.pool_state[id] = 1;
            }
        }
    }
    CUmemoryPool pool = drv.pool_state[id] > 0 ? drv.pool[id] : NULL;
    pthread_mutex_unlock(&drv.pool_lock);
    return pool;
}

int cuda_mem_alloc(cuda_dev *d, int id, size_t bytes, cuda_mem *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    if (!d) {
        snprintf(err, errlen, "not a CUDA call");
        return OPJIT_EDEVICE;
    }
    CUdeviceptr p = 0;
    CUmemoryPool pool = output_pool(id);
    CUresult r = CUDA_ERROR_OUT_OF_MEMORY;
    if (pool && (r = drv.MemAllocFromPoolAsync(&p, bytes ? bytes : 1, pool, d->stream)) ==
                    CUDA_SUCCESS) {
        out->pooled = 1;
        out->stream = d->stream;
    } else {
        if (pool) /* what the pool keeps may be what is missing */
            drv.MemPoolTrimTo(pool, 0);
        r = drv.MemAlloc(&p, bytes ? bytes : 1);
    }
    if (r) {
        char e[256];
        snprintf(err, errlen, "cuMemAlloc(%zu bytes) on CUDA device %d: %s", bytes, id,
                 cu_err(r, e, sizeof e));
        return r == CUDA_ERROR_OUT_OF_MEMORY ? OPJIT_ENOMEM : OPJIT_EKERNEL;
    }
    out->ptr = p;
    out->cuctx = d->ctx;
    out->device = id;
    /* The memory lives as long as its context: an output keeps the primary
     * context alive after the runtime released it. */
    if (d->ctx == d->primary) {
        CUcontext again;
        if (drv.PrimaryCtxRetain(&again, drv.dev[id]) == CUDA_SUCCESS)
            out->primary = 1;
    }
    return OPJIT_OK;
}

void cuda_mem_free(const cuda_mem *m)
{
    if (!m || !m->ptr)
        return;
    CUcontext dummy;
    if (drv.CtxPushCurrent((CUcontext)m->cuctx) == CUDA_SUCCESS) {
        /* Pooled: back to the pool in the order of the stream it was made
         * on, after the work queued there that uses it. */
        if (!m->pooled || drv.MemFreeAsync(m->ptr, (CUstream)m->stream) != CUDA_SUCCESS)
            drv.MemFree(m->ptr);
        drv.CtxPopCurrent(&dummy);
    }
    if (m->primary)
        drv.PrimaryCtxRelease(drv.dev[m->device]);
}

static int not_cuda(opjit_ctx *ctx, const char *what)
{
    if (!ctx)
        return OPJIT_EINVAL;
    return call_error(ctx, OPJIT_EDEVICE, "%s: not available in a %s call (CUDA only)", what,
                      opjit_device_name(ctx->device));
}

/* The kernel called name in l, the call's module: found among those
 * looked up before, or looked up and added. l->lock held. */
static int fn_find_locked(opjit_ctx *ctx, cuda_loaded *l, const char *name, cuda_fn **out)
{
    for (cuda_fn *f = l->fns; f; f = f->next)
        if (!strcmp(f->name, name)) {
            *out = f;
            return OPJIT_OK;
        }
    char e[256];
    CUfunction fn = NULL;
    CUresult r = drv.ModuleGetFunction(&fn, l->mod, name);
    if (r == CUDA_ERROR_NOT_FOUND)
        return call_error(ctx, OPJIT_EKERNEL,
                          "opjit_launch: no kernel '%s' in the device code of %s (a "
                          "kernel must be extern \"C\" __global__ in the "
                          "__CUDACC_RTC__ half)", name, ctx->k->mod->source);
    if (r)
        return call_error(ctx, OPJIT_EKERNEL, "opjit_launch(%s): cuModuleGetFunction: %s",
                          name, cu_err(r, e, sizeof e));
    cuda_fn *f = calloc(1, sizeof *f);
    if (!f || !(f->name = strdup(name))) {
        free(f);
        return call_error(ctx, OPJIT_ENOMEM, "out of memory");
    }
    int dyn = 0;
    if (drv.FuncGetAttribute(&dyn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, fn) ||
        dyn < 0)
        dyn = 0; /* unknown: opt in for any dynamic shared memory */
    f->f = fn;
    f->dyn_shared = (unsigned)dyn;
    f->next = l->fns;
    l->fns = f;
    *out = f;
    return OPJIT_OK;
}

/* The kernel called name in the call's module, looked up once; with at
 * least shared_bytes of dynamic shared memory allowed (opting in above what
 * the driver grants by default: 48 KiB less the kernel's static __shared__
 * arrays; beyond the device's limit it fails). */
static int get_fn(opjit_ctx *ctx, const char *name, unsigned shared_bytes, CUfunction *out)
{
    cuda_loaded *l = ctx->cmod;
    cuda_fn *f = NULL;
    pthread_mutex_lock(&l->lock);
    int rc = fn_find_locked(ctx, l, name, &f);
    if (rc == OPJIT_OK && shared_bytes > f->dyn_shared) {
        char e[256];
        CUresult r = drv.FuncSetAttribute(f->f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                          (int)shared_bytes);
        if (r)
            rc = call_error(ctx, OPJIT_EKERNEL, "opjit_launch(%s): %u bytes of dynamic "
                            "shared memory: %s", name, shared_bytes, cu_err(r, e, sizeof e));
        else
            f->dyn_shared = shared_bytes;
    }
    if (rc == OPJIT_OK)
        *out = f->f;
    pthread_mutex_unlock(&l->lock);
    return rc;
}

int cuda_api_launch(opjit_ctx *ctx, const char *kernel, const unsigned grid[3],
                    const unsigned block[3], unsigned shared_bytes, void **params)
{
    if (!ctx || !ctx->cdev)
        return not_cuda(ctx, "opjit_launch");
    if (!kernel || !grid || !block)
        return call_error(ctx, OPJIT_EKERNEL, "opjit_launch: NULL kernel name, grid or block");
    if (!grid[0] || !grid[1] || !grid[2])
        return OPJIT_OK; /* no blocks: nothing to run */
    if (!ctx->cmod)
        return call_error(ctx, OPJIT_EKERNEL, "opjit_launch(%s): %s has no device code (no "
                          "__CUDACC_RTC__ half, or it was built for no architecture)", kernel,
                          ctx->k->mod->source);
    CUfunction f = NULL;
    int rc = get_fn(ctx, kernel, shared_bytes, &f);
    if (rc)
        return rc;
    char e[256];
    CUresult r;
    r = drv.LaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                         shared_bytes, ctx->cdev->stream, params, NULL);
    if (r)
        return call_error(ctx, r == CUDA_ERROR_OUT_OF_MEMORY ? OPJIT_ENOMEM : OPJIT_EKERNEL,
                          "opjit_launch(%s, grid %ux%ux%u, block %ux%ux%u, %u bytes shared): %s",
                          kernel, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                          shared_bytes, cu_err(r, e, sizeof e));
    return OPJIT_OK;
}

int cuda_api_memcpy(opjit_ctx *ctx, void *dst, const void *src, size_t bytes, int kind)
{
    if (!ctx || !ctx->cdev)
        return not_cuda(ctx, "opjit_memcpy");
    if (!bytes)
        return OPJIT_OK;
    if (!dst || !src)
        return call_error(ctx, OPJIT_EKERNEL, "opjit_memcpy: NULL pointer");
    const char *what;
    CUresult r = copy_on(ctx->cdev->stream, dst, src, bytes, kind, 0, &what);
    if (kind == OPJIT_COPY_HTOD)
        ctx->htod_pending = 1;
    else if (kind == OPJIT_COPY_DTOH)
        ctx->htod_pending = 0; /* waited for, with all before it */
    if (r < 0)
        return call_error(ctx, OPJIT_EKERNEL, "opjit_memcpy: bad direction %d (expected "
                          "OPJIT_COPY_HTOD, _DTOH or _DTOD)", kind);
    if (r) {
        char e[256];
        return call_error(ctx, OPJIT_EKERNEL, "opjit_memcpy(%zu bytes, %s): %s", bytes, what,
                          cu_err(r, e, sizeof e));
    }
    return OPJIT_OK;
}

void *cuda_api_device_workspace(opjit_ctx *ctx, size_t bytes)
{
    if (!ctx || !ctx->cdev) {
        not_cuda(ctx, "opjit_device_workspace");
        return NULL;
    }
    if (bytes > SIZE_MAX / 2) {
        call_error(ctx, OPJIT_ENOMEM, "opjit_device_workspace: %zu bytes is too much", bytes);
        return NULL;
    }
    bytes = bytes ? (bytes + 255) & ~(size_t)255 : 256;
    cuda_rt *c = ctx->rt->cuda;
    cuda_dev *d = ctx->cdev;
    if (!ctx->dws) {
        pthread_mutex_lock(&c->lock);
        ctx->dws = d->free_ws;
        if (ctx->dws)
            d->free_ws = ctx->dws->next;
        pthread_mutex_unlock(&c->lock);
        if (!ctx->dws && !(ctx->dws = calloc(1, sizeof *ctx->dws))) {
            call_error(ctx, OPJIT_ENOMEM, "out of memory for the device workspace");
            return NULL;
        }
        ctx->dws->next = NULL;
    }
    cuda_ws *ws = ctx->dws;
    ws->want += bytes;
    if (ws->cap - ws->used >= bytes) {
        CUdeviceptr p = ws->base + ws->used;
        ws->used += bytes;
        return (void *)(uintptr_t)p;
    }
    cuda_ovf *o = malloc(sizeof *o);
    CUresult r = o ? drv.MemAlloc(&o->p, bytes) : CUDA_ERROR_OUT_OF_MEMORY;
    if (r) {
        char e[256];
        free(o);
        call_error(ctx, OPJIT_ENOMEM, "opjit_device_workspace(%zu bytes) on CUDA device %d: %s",
                   bytes, ctx->device_id, cu_err(r, e, sizeof e));
        return NULL;
    }
    o->next = ws->ovf;
    ws->ovf = o;
    return (void *)(uintptr_t)o->p;
}

void *cuda_api_stream(opjit_ctx *ctx)
{
    return ctx && ctx->cdev ? (void *)ctx->cdev->stream : NULL;
}

int cuda_api_synchronize(opjit_ctx *ctx)
{
    if (!ctx || !ctx->cdev)
        return not_cuda(ctx, "opjit_synchronize");
    CUresult r = drv.StreamSynchronize(ctx->cdev->stream);
    ctx->htod_pending = 0;
    if (r) {
        char e[256];
        return call_error(ctx, OPJIT_EKERNEL, "opjit_synchronize: %s (an earlier launch or "
                          "copy failed)", cu_err(r, e, sizeof e));
    }
    return OPJIT_OK;
}

/* ---- outside a call ------------------------------------------------------------------ */

int cuda_enter(opjit_runtime *rt, int id, cuda_dev **out, char *why, size_t n)
{
    *out = NULL;
    int rc = driver(why, n);
    if (rc)
        return rc;
    if (id < 0 || id >= drv.ndev) {
        snprintf(why, n, "there is no CUDA device %d (%d found)", id, drv.ndev);
        return OPJIT_EDEVICE;
    }
    cuda_dev *d = &rt->cuda->dev[id];
    if (!atomic_load_explicit(&d->ready, memory_order_acquire) &&
        (rc = dev_ready(rt, d, id, why, n)))
        return rc;
    CUresult r = drv.CtxPushCurrent(d->ctx);
    if (r) {
        char e[256];
        snprintf(why, n, "cannot make the context of CUDA device %d current: %s", id,
                 cu_err(r, e, sizeof e));
        return OPJIT_EDEVICE;
    }
    *out = d;
    return OPJIT_OK;
}

void cuda_leave(cuda_dev *d)
{
    if (d) {
        CUcontext dummy;
        drv.CtxPopCurrent(&dummy);
    }
}

int cuda_copy(cuda_dev *d, void *dst, const void *src, size_t bytes, int kind, char *err,
              size_t errlen)
{
    if (!bytes)
        return OPJIT_OK;
    const char *what;
    CUresult r = copy_on(d->stream, dst, src, bytes, kind, 1, &what);
    if (r) {
        char e[256];
        if (r < 0)
            snprintf(err, errlen, "bad copy direction %d", kind);
        else
            snprintf(err, errlen, "copying %zu bytes %s: %s", bytes, what,
                     cu_err(r, e, sizeof e));
        return r == CUDA_ERROR_OUT_OF_MEMORY ? OPJIT_ENOMEM : OPJIT_EDEVICE;
    }
    return OPJIT_OK;
}

/* ---- the device's instance (runtime/device.h) ------------------------------------ */

static int dev_enter(opjit_runtime *rt, int id, void **dev, char *why, size_t n)
{
    cuda_dev *d = NULL;
    int rc = cuda_enter(rt, id, &d, why, n);
    *dev = d;
    return rc;
}

static void dev_leave(void *dev) { cuda_leave(dev); }

static int dev_mem_alloc(void *dev, int id, size_t bytes, device_mem *m, char *err,
                         size_t errlen)
{
    int rc = cuda_mem_alloc(dev, id, bytes, m, err, errlen);
    if (!rc)
        m->free = cuda_mem_free;
    return rc;
}

static int dev_copy(void *dev, void *dst, const void *src, size_t bytes, int kind, char *err,
                    size_t errlen)
{
    return cuda_copy(dev, dst, src, bytes, kind, err, errlen);
}

const device_ops device_cuda = {
    .dl_type = kDLCUDA,
    .host_memory = 0,
    .max_id = INT_MAX, /* cuda_enter says which exist */
    .call_begin = cuda_call_begin,
    .call_end = cuda_call_end,
    .enter = dev_enter,
    .leave = dev_leave,
    .mem_alloc = dev_mem_alloc,
    .copy = dev_copy,
};
