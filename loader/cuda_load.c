/* loader/cuda_load.c - what loading a .cu source adds to loading a .c.
 *
 * A .cu holds two halves. The host half (`#ifndef __CUDACC_RTC__`) is C
 * compiled by libtcc like a .c (jit/tcc.c adds the toolkit's headers and
 * the macros they need). The device half (`#ifdef __CUDACC_RTC__`) is
 * compiled by the table's device compiler (NVRTC) once per architecture
 * in use, each through the pipeline (loader/pipeline.c): its own cache
 * entry (artifact "sm_90.cubin" or "compute_90.ptx"), reachable through
 * index entries without loading NVRTC on a hit, and without NVRTC at all
 * where a cache was warmed elsewhere.
 *
 * The images are read into memory and handed to the module (runtime/cuda.h),
 * which loads the one that suits a device on the first call there.
 *
 * cuDNN and cuBLAS. libtcc 0.9.27 binds every symbol of the objects it
 * writes at dlopen time (its relocations are not lazy PLT ones: RTLD_LAZY
 * changes nothing), so a host half that called such a library directly
 * could not load where it is missing; host halves are dlopened RTLD_NOW |
 * RTLD_LOCAL like any op. One table, cu_libs, says which library a host
 * half that mentions cudnn (cublas) wants: libcudnn.so.9 (libcublas.so.13,
 * .12), found like NVRTC ($CUDA_HOME, ..., the default search) or named
 * exactly by $OPJIT_CUDNN_LIBRARY ($OPJIT_CUBLAS_LIBRARY). Where a driver
 * (libcuda.so.1) and a device are, the loader makes those libraries
 * global (RTLD_GLOBAL) before dlopening the host half, when they exist.
 * Elsewhere it does not (cuBLAS alone takes 0.3 s to load, and no call
 * could use it) unless that dlopen fails on one of their symbols: then it
 * loads them and tries again. Ops that must load and warm everywhere
 * (ours: conv2d.cu, mm.cu) take the entry points with dlsym at their first
 * call; where the library is missing, conv2d fails that call with a
 * message and mm runs its own kernel.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "jit/jit.h"
#include "loader/loader_int.h"
#include "runtime/cuda.h"

#define CU_DEFAULT_ARCHS "sm_80,sm_90,compute_90"

/* ---- NVIDIA libraries in the global namespace ------------------------------- */

/* A host half whose text mentions `mention` gets the library made global
 * before its dlopen: $env names the exact file, else the first of names
 * in the toolkit or on the default path (jit_cuda_dlopen). Tried once per
 * process; a library that is missing is no error here. */
static struct cu_lib {
    const char *mention, *what;
    size_t lib; /* the settings_libs field naming its file */
    const char *const names[4];
    int tried;
    char why[1024]; /* "" when loaded */
} cu_libs[] = {
    {"cudnn", "cuDNN", offsetof(settings_libs, cudnn), {"libcudnn.so.9", "libcudnn.so", NULL},
     0, ""},
    {"cublas", "cuBLAS", offsetof(settings_libs, cublas),
     {"libcublas.so.13", "libcublas.so.12", "libcublas.so", NULL}, 0, ""},
};
#define CU_NLIBS (sizeof cu_libs / sizeof *cu_libs)
static pthread_mutex_t cu_libs_lock = PTHREAD_MUTEX_INITIALIZER;

/* c made global (once); 1 when this call loaded it. */
static int cu_lib_load(loader *l, struct cu_lib *c)
{
    char why[sizeof c->why];
    int now = 0;
    pthread_mutex_lock(&cu_libs_lock);
    if (!c->tried) {
        char path[PATH_MAX];
        const char *file = *(const char *const *)((const char *)settings_libs_get() + c->lib);
        if (jit_cuda_dlopen(c->names, file, RTLD_NOW | RTLD_GLOBAL, path, sizeof path,
                            c->why, sizeof c->why))
            c->why[0] = '\0', now = 1;
        else if (!c->why[0])
            snprintf(c->why, sizeof c->why, "%s not found", c->names[0]);
        c->tried = 1; /* ops that need it say so when called */
    }
    memcpy(why, c->why, sizeof why);
    pthread_mutex_unlock(&cu_libs_lock);
    if (why[0])
        rt_log(l->rt, OPJIT_LOG_DEBUG, "%s not loaded: %s", c->what, why);
    return now;
}

void cu_preload(loader *l, const source *s)
{
    int usable = -1;
    for (size_t i = 0; i < CU_NLIBS; i++) {
        if (!strstr(s->text, cu_libs[i].mention))
            continue; /* only sources that use it pay for loading it */
        /* Where no CUDA call can run, ops that take the library at their
         * first call never need it (loading cuBLAS alone takes 0.3 s);
         * nor where calls run on a driver other than libcuda.so.1 (a
         * stand-in for tests), the one these libraries would run on. */
        if (usable < 0) {
            void *drv = NULL;
            usable = cu_usable(NULL, 0) == OPJIT_OK &&
                     (drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD)) != NULL;
            if (drv)
                dlclose(drv);
        }
        if (usable)
            cu_lib_load(l, &cu_libs[i]);
    }
}

int cu_preload_missing(loader *l, const char *msg)
{
    int now = 0;
    if (!strstr(msg, "undefined symbol"))
        return 0;
    for (size_t i = 0; i < CU_NLIBS; i++)
        if (strstr(msg, cu_libs[i].mention))
            now |= cu_lib_load(l, &cu_libs[i]);
    return now;
}

void cu_preload_explain(const char *msg, char *out, size_t n)
{
    size_t k = 0;
    if (n)
        out[0] = '\0';
    pthread_mutex_lock(&cu_libs_lock);
    for (size_t i = 0; i < CU_NLIBS && k < n; i++)
        if (cu_libs[i].tried && cu_libs[i].why[0] && strstr(msg, cu_libs[i].mention))
            k += (size_t)snprintf(out + k, n - k, " (%s: %s)", cu_libs[i].what, cu_libs[i].why);
    pthread_mutex_unlock(&cu_libs_lock);
}

/* ---- which sources a name loads ------------------------------------------------ */

int cu_usable(char *why, size_t n) { return cuda_available(why, n); }

/* ---- architectures -------------------------------------------------------------- */

/* The list in use, validated and deduplicated into out ("sm_80,sm_90"). */
int cu_resolve_archs(loader *l, char *out, size_t n, int *defaulted)
{
    const char *from = l->rt->set.cuda_archs_from; /* config, else $OPJIT_CUDA_ARCHS */
    const char *list = l->rt->set.cuda_archs;
    char def[512];
    if (!list || !*list) {
        /* This machine's GPUs; the usual ones without a GPU. */
        int cc[CUDA_MAX_DEVICES], nd = cuda_device_archs(cc, CUDA_MAX_DEVICES);
        size_t k = 0;
        def[0] = '\0';
        const jit_compiler *jc = jit_first(JIT_CU_DEVICE);
        for (int i = 0; i < nd && jc; i++) {
            char a[32];
            jc->device_target(cc[i], a, sizeof a);
            if (!strstr(def, a) && k < sizeof def)
                k += (size_t)snprintf(def + k, sizeof def - k, "%s%s", k ? "," : "", a);
        }
        list = nd ? def : CU_DEFAULT_ARCHS;
        from = "the default";
        *defaulted = nd > 0;
    }
    size_t k = 0;
    out[0] = '\0';
    for (const char *p = list; *p;) {
        while (*p == ',' || *p == ' ' || *p == '\t')
            p++;
        size_t len = strcspn(p, ", \t");
        if (!len)
            break;
        char a[32];
        const jit_compiler *jc = jit_first(JIT_CU_DEVICE);
        snprintf(a, sizeof a, "%.*s", (int)(len < sizeof a ? len : sizeof a - 1), p);
        if (len >= sizeof a || (jc && !jc->target_valid(a)))
            return rt_error(l->rt, OPJIT_EINVAL,
                            "%s: '%.*s' is not a CUDA architecture (expected a comma-separated "
                            "list of sm_XY for cubins and compute_XY for PTX, e.g. "
                            "\"sm_80,sm_90,compute_90\")", from, (int)len, p);
        char padded[40];
        snprintf(padded, sizeof padded, ",%s,", a);
        char have[1100];
        snprintf(have, sizeof have, ",%s,", out);
        if (!strstr(have, padded)) {
            if (k + len + 2 > n)
                return rt_error(l->rt, OPJIT_EINVAL, "%s: too many CUDA architectures", from);
            k += (size_t)snprintf(out + k, n - k, "%s%s", k ? "," : "", a);
        }
        p += len;
    }
    if (!out[0])
        return rt_error(l->rt, OPJIT_EINVAL, "%s: no CUDA architecture in '%s'", from, list);
    return OPJIT_OK;
}

/* ---- device code ---------------------------------------------------------------------- */

/* The artifact for arch through the pipeline; a target from the machine
 * (not asked for) the device compiler cannot build gets the one it offers
 * instead (NVRTC older than the GPU: its highest PTX, which the driver
 * compiles for it). arch may be rewritten. */
static int device_artifact(loader *l, const source *s, const jit_compiler *jc, char *arch,
                           size_t archlen, int defaulted, pipeline_artifact *art, char *diag,
                           size_t n)
{
    pipeline_get_args a = {s, jc, JIT_CU_DEVICE, arch, 1};
    int rc = pipeline_get(&l->pipe, &a, art, diag, n);
    char sub[32];
    if (rc == OPJIT_ECOMPILE && defaulted && jc->fallback_target(arch, sub, sizeof sub)) {
        rt_log(l->rt, OPJIT_LOG_INFO, "%s: %s cannot compile for %s; using %s", s->path,
               jc->what, arch, sub);
        snprintf(arch, archlen, "%s", sub);
        rc = pipeline_get(&l->pipe, &a, art, diag, n);
    }
    if (rc == OPJIT_ECOMPILE)
        return rt_error(l->rt, rc, "%s: compile error (%s, %s):\n%s", s->path, jc->what, arch,
                        diag);
    if (rc == OPJIT_EDEVICE || rc == OPJIT_ENOTFOUND)
        return rt_error(l->rt, OPJIT_EDEVICE, "%s: %s (and no %s device code for it is in a "
                        "cache)", s->path, diag, arch);
    if (rc)
        return rt_error(l->rt, rc, "%s: device code for %s: %s", s->path, arch, diag);
    return OPJIT_OK;
}

/* The artifact's image, kept by the module. */
static int keep_image(loader *l, const source *s, const jit_compiler *jc, cuda_module *cm,
                      const char *arch, const pipeline_artifact *art)
{
    /* "NVRTC 13.0" reads better in messages than the key string. */
    char producer[96];
    jc->producer(producer, sizeof producer);
    /* A cubin is mapped (tens of KiB a fresh process would otherwise fault
     * in, and only a GPU ever reads); PTX, which needs its NUL, is read. */
    if (art->path && !strncmp(arch, "sm_", 3) &&
        cuda_module_map_image(cm, arch, art->path, producer) == OPJIT_OK)
        return OPJIT_OK;
    size_t size = 0;
    char *data = art->path ? loader_read_file(art->path, &size) : NULL;
    if (!data)
        return rt_error(l->rt, OPJIT_ECACHE, "%s: the cache entry for %s lacks %s", s->path,
                        arch, art->name);
    int rc = cuda_module_take_image(cm, arch, (unsigned char *)data, size, producer);
    if (rc)
        free(data);
    if (rc)
        return rt_error(l->rt, rc, "%s: %s: cannot keep the device code", s->path, arch);
    return OPJIT_OK;
}

int cu_device_code(loader *l, const source *s, cuda_module **out, int *all_hit,
                   double *waited_ms, const jit_compiler **by)
{
    *out = NULL;
    *all_hit = 1;
    const jit_compiler *jc = jit_first(JIT_CU_DEVICE);
    *by = jc;
    int defaulted = 0;
    int rc = cu_resolve_archs(l, l->archs, sizeof l->archs, &defaulted);
    if (rc)
        return rc;
    cuda_module *cm = cuda_module_new(s->path);
    char *diag = malloc(OPJIT_ERRMSG_SIZE - 512), targets[sizeof l->archs], *save = NULL;
    if (!cm || !diag) {
        cuda_module_free(cm);
        free(diag);
        return rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
    }
    jc->targets(&l->pipe.set, targets, sizeof targets);
    for (char *t = strtok_r(targets, ",", &save); t && !rc; t = strtok_r(NULL, ",", &save)) {
        char arch[32];
        pipeline_artifact art = {0};
        snprintf(arch, sizeof arch, "%s", t);
        rc = device_artifact(l, s, jc, arch, sizeof arch, defaulted, &art, diag,
                             OPJIT_ERRMSG_SIZE - 512);
        if (!rc && (!art.hit || (*all_hit && art.hit == CACHE_HIT_REMOTE)))
            *all_hit = art.hit; /* CACHE_BUILT, or remote where any came from there */
        *waited_ms += cache_entry_waited_ms(art.entry);
        if (!rc)
            rc = keep_image(l, s, jc, cm, arch, &art);
        cache_entry_release(art.entry);
    }
    free(diag);
    if (rc) {
        cuda_module_free(cm);
        return rc;
    }
    *out = cm;
    return OPJIT_OK;
}
