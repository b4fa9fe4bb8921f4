/* loader/cuda_load.c - what loading a .cu source adds to loading a .c.
 *
 * A .cu holds two halves. The host half (`#ifndef __CUDACC_RTC__`) is C
 * compiled by libtcc exactly like a .c, with a few macros cudnn.h and
 * cuda.h need under an unknown compiler, and the toolkit's include
 * directory. The device half (`#ifdef __CUDACC_RTC__`) is compiled by NVRTC
 * once per architecture in use; each architecture is a cache entry of its
 * own (artifact "sm_90.cubin" or "compute_90.ptx"), keyed by the source and
 * its local headers, the NVRTC identity, the options, the architecture and
 * the opjit ABI. Every such entry is also reachable through a small index
 * entry keyed without the NVRTC identity, whose artifact names the full
 * key: a deployment without NVRTC uses device code warmed elsewhere.
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
 * NVRTC's identity is remembered in the cache (see nvrtc_identity) so a
 * process whose device code is all cached never loads NVRTC either.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "jit/jit.h"
#include "loader/loader_int.h"
#include "runtime/cuda.h"

#define CU_DEFAULT_ARCHS "sm_80,sm_90,compute_90"

/* The host half under libtcc: what cudnn.h / cuda.h ask of an unknown
 * compiler (crt/host_defines.h), plus the defines every op gets. */
const char *const cu_host_defines[] = {
    "FORCE_OPENBLAS_COMPLEX_STRUCT",
    "OPJIT_TIER_TCC",
    "OPJIT_CUDA_HOST",
    "__align__(n)=__attribute__((aligned(n)))",
    "CUDARTAPI=",
    "CUDARTAPI_CDECL=",
    "__location__(a)=",
    NULL,
};

/* The include directory, found once per process. */
static char host_inc[PATH_MAX];
static pthread_once_t host_inc_once = PTHREAD_ONCE_INIT;
static void find_host_inc(void) { jit_cuda_include_dir(host_inc, sizeof host_inc); }

const char *cu_toolkit_include(void)
{
    pthread_once(&host_inc_once, find_host_inc);
    return host_inc[0] ? host_inc : NULL;
}

/* cuDNN's headers when the toolkit's include directory lacks them, as where
 * pip installs cuDNN apart from the toolkit: the include directory beside
 * the library $OPJIT_CUDNN_LIBRARY names (.../lib/libcudnn.so.9 ->
 * .../include/cudnn.h). Found once per process. */
static char cudnn_inc[PATH_MAX];
static pthread_once_t cudnn_inc_once = PTHREAD_ONCE_INIT;
static void find_cudnn_inc(void)
{
    char probe[PATH_MAX + 32], inc[PATH_MAX];
    const char *tk = cu_toolkit_include(), *lib = getenv("OPJIT_CUDNN_LIBRARY");
    struct stat st;
    if (tk && (snprintf(probe, sizeof probe, "%s/cudnn.h", tk), stat(probe, &st) == 0))
        return;
    if (!lib || !*lib || strlen(lib) >= sizeof inc)
        return;
    memcpy(inc, lib, strlen(lib) + 1);
    for (int up = 0; up < 2; up++) { /* drop the file, then lib/ */
        char *slash = strrchr(inc, '/');
        if (!slash)
            return;
        *slash = '\0';
    }
    if (strlen(inc) + sizeof "/include" > sizeof inc)
        return;
    strcat(inc, "/include");
    snprintf(probe, sizeof probe, "%s/cudnn.h", inc);
    if (stat(probe, &st) == 0 && S_ISREG(st.st_mode))
        memcpy(cudnn_inc, inc, sizeof inc);
}

const char *cu_cudnn_include(void)
{
    pthread_once(&cudnn_inc_once, find_cudnn_inc);
    return cudnn_inc[0] ? cudnn_inc : NULL;
}

void cu_host_key(cache_keygen *g)
{
    for (int i = 0; cu_host_defines[i]; i++)
        cache_keygen_add_str(g, "cuda-host-define", cu_host_defines[i]);
    /* The toolkit headers a host half may include: their versions. */
    const char *inc = cu_toolkit_include();
    if (!inc) {
        cache_keygen_add_str(g, "cuda-toolkit", "none");
        return;
    }
    char p[PATH_MAX + 32];
    const char *dnn = cu_cudnn_include();
    snprintf(p, sizeof p, "%s/cudnn_version.h", dnn ? dnn : inc);
    size_t len;
    char *text = loader_read_file(p, &len);
    cache_keygen_add(g, "cudnn_version.h", text ? text : "", text ? len : 0);
    free(text);
    snprintf(p, sizeof p, "%s/cuda.h", inc);
    FILE *f = fopen(p, "rb");
    char line[256], version[64] = "unknown";
    for (int i = 0; f && i < 2000 && fgets(line, sizeof line, f); i++)
        if (sscanf(line, "#define CUDA_VERSION %63s", version) == 1)
            break;
    if (f)
        fclose(f);
    cache_keygen_add_str(g, "cuda-version", version);
}

/* ---- NVIDIA libraries in the global namespace ------------------------------- */

/* A host half whose text mentions `mention` gets the library made global
 * before its dlopen: $env names the exact file, else the first of names
 * in the toolkit or on the default path (jit_cuda_dlopen). Tried once per
 * process; a library that is missing is no error here. */
static struct cu_lib {
    const char *mention, *what, *env;
    const char *const names[4];
    int tried;
    char why[1024]; /* "" when loaded */
} cu_libs[] = {
    {"cudnn", "cuDNN", "OPJIT_CUDNN_LIBRARY", {"libcudnn.so.9", "libcudnn.so", NULL}, 0, ""},
    {"cublas", "cuBLAS", "OPJIT_CUBLAS_LIBRARY",
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
        if (jit_cuda_dlopen(c->names, getenv(c->env), RTLD_NOW | RTLD_GLOBAL, path, sizeof path,
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
static int resolve_archs(loader *l, char *out, size_t n, int *defaulted)
{
    const char *from = "config.cuda_archs";
    const char *list = l->cuda_archs;
    char def[512];
    if (!list || !*list) {
        list = getenv("OPJIT_CUDA_ARCHS");
        from = "OPJIT_CUDA_ARCHS";
    }
    if (!list || !*list) {
        /* This machine's GPUs; the usual ones without a GPU. */
        int cc[CUDA_MAX_DEVICES], nd = cuda_device_archs(cc, CUDA_MAX_DEVICES);
        size_t k = 0;
        def[0] = '\0';
        for (int i = 0; i < nd; i++) {
            char a[32];
            if (jit_nvrtc_identity() && !jit_nvrtc_supports(cc[i]) &&
                jit_nvrtc_highest_arch(cc[i]))
                snprintf(a, sizeof a, "compute_%d", jit_nvrtc_highest_arch(cc[i]));
            else
                snprintf(a, sizeof a, "sm_%d", cc[i]);
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
        int number, ptx;
        snprintf(a, sizeof a, "%.*s", (int)(len < sizeof a ? len : sizeof a - 1), p);
        if (len >= sizeof a || !jit_cuda_arch_parse(a, &number, &ptx))
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

typedef struct dev_build {
    const source *src;
    const char *arch;
    const char *artifact;
    char diag[OPJIT_ERRMSG_SIZE - 512];
} dev_build;

static int build_nvrtc(void *ud, const char *dir, char *err, size_t errlen)
{
    dev_build *b = ud;
    char out[PATH_MAX + 64];
    snprintf(out, sizeof out, "%s/%s", dir, b->artifact);
    jit_nvrtc_job job = {
        .source_name = b->src->path,
        .text = b->src->text,
        .arch = b->arch,
        .out_path = out,
    };
    int rc = jit_nvrtc_compile(&job, b->diag, sizeof b->diag);
    if (!rc && !source_unchanged(b->src)) {
        /* As for the host half: never publish under a stale key. */
        snprintf(b->diag, sizeof b->diag, "%s: a local header changed during the compile; "
                 "load it again", b->src->path);
        rc = OPJIT_ECOMPILE;
    }
    if (rc)
        snprintf(err, errlen, "%.*s", (int)(errlen > 1 ? errlen - 1 : 0),
                 rc == OPJIT_ECOMPILE ? "compile error" : b->diag);
    return rc;
}


/* The request for s's device code for arch; identity NULL: its index. */
static void device_request(const source *s, const char *arch, const char *identity,
                           cache_request *req)
{
    cache_keygen *g = source_keygen(s);
    if (g) {
        cache_keygen_add_str(g, "kind", identity ? "cuda-device" : "cuda-device-index");
        cache_keygen_add_str(g, "options", jit_nvrtc_options());
        cache_keygen_add_str(g, "target", arch);
        if (identity)
            cache_keygen_add_str(g, "compiler", identity);
    }
    *req = (cache_request){
        .op_name = s->stem,
        .source_name = s->name,
        .compiler = identity ? identity : "any NVRTC",
        .options = jit_nvrtc_options(),
        .target = arch,
        .tier = identity ? "nvrtc" : "nvrtc-index",
    };
    if (g)
        cache_keygen_finish(g, &req->key);
    else
        memset(&req->key, 0, sizeof req->key), memset(req->key.hex, '0', 32);
}

/* Without NVRTC: the entry an index names, if both are in a cache. */
static int fetch_by_index(loader *l, const source *s, const char *arch, cache_entry **out)
{
    cache_request ireq, full;
    device_request(s, arch, NULL, &ireq);
    full = ireq;
    full.tier = "nvrtc";
    return cache_index_fetch(l->cache, &ireq, &full, out) == OPJIT_OK ? OPJIT_OK
                                                                      : OPJIT_ENOTFOUND;
}

/* ---- NVRTC's identity, without loading it ------------------------------------ */

/* Loading libnvrtc costs 10 to 20 ms, and a cache hit needs only its
 * identity for the key. So the identity is kept in a small cache entry
 * keyed by the library file (path, size, mtime, inode): a process whose
 * device code is all in the cache never loads NVRTC. */
static int memo_request(const char *real, const struct stat *st, cache_request *req)
{
    cache_keygen *g = cache_keygen_new();
    if (!g)
        return 0;
    char buf[128];
    cache_keygen_add_str(g, "kind", "nvrtc-identity");
    cache_keygen_add_str(g, "path", real);
    snprintf(buf, sizeof buf, "%lld %lld.%09ld %llu", (long long)st->st_size,
             (long long)st->st_mtim.tv_sec, (long)st->st_mtim.tv_nsec,
             (unsigned long long)st->st_ino);
    cache_keygen_add_str(g, "stat", buf);
    const char *base = strrchr(real, '/');
    *req = (cache_request){
        .op_name = "nvrtc",
        .source_name = base ? base + 1 : real,
        .compiler = "NVRTC identity",
        .options = "",
        .target = loader_target(),
        .tier = "nvrtc-id",
    };
    cache_keygen_finish(g, &req->key);
    return 1;
}

static int nvrtc_identity(loader *l, char *id, size_t n, char *err, size_t errlen)
{
    char path[PATH_MAX], real[PATH_MAX];
    struct stat st;
    cache_request req;
    int memo = jit_nvrtc_locate(path, sizeof path) && realpath(path, real) &&
               stat(real, &st) == 0 && memo_request(real, &st, &req);
    char *text = NULL;
    if (memo && cache_note_get(l->cache, &req, "identity", &text) == OPJIT_OK &&
        strlen(text) < n && !strncmp(text, "nvrtc ", 6)) {
        memcpy(id, text, strlen(text) + 1);
        free(text);
        return OPJIT_OK;
    }
    free(text);
    int rc = jit_nvrtc_load(err, errlen); /* at once when loaded already */
    if (rc)
        return rc;
    snprintf(id, n, "%s", jit_nvrtc_identity());
    char loaded[PATH_MAX];
    if (memo && jit_nvrtc_path() && realpath(jit_nvrtc_path(), loaded) &&
        !strcmp(loaded, real))
        cache_note_put(l->cache, &req, "identity", id);
    return OPJIT_OK;
}

int cu_device_code(loader *l, const source *s, cuda_module **out, int *all_hit)
{
    opjit_runtime *rt = l->rt;
    *out = NULL;
    *all_hit = 1;
    char nverr[2048], idbuf[PATH_MAX + 128];
    int nvrc = nvrtc_identity(l, idbuf, sizeof idbuf, nverr, sizeof nverr);
    char archs[1024];
    int defaulted = 0;
    int rc = resolve_archs(l, archs, sizeof archs, &defaulted);
    if (rc)
        return rc;
    const char *identity = nvrc ? NULL : idbuf;
    /* "NVRTC 13.0" reads better in messages than the key string. */
    char producer[96] = "the NVRTC that warmed the cache";
    int vmaj, vmin;
    if (identity && sscanf(identity, "nvrtc %d.%d", &vmaj, &vmin) == 2)
        snprintf(producer, sizeof producer, "NVRTC %d.%d", vmaj, vmin);
    cuda_module *cm = cuda_module_new(s->path);
    dev_build *b = calloc(1, sizeof *b);
    if (!cm || !b) {
        cuda_module_free(cm);
        free(b);
        return rt_error(rt, OPJIT_ENOMEM, "out of memory");
    }
    for (char *p = archs; *p;) {
        size_t len = strcspn(p, ",");
        char arch[32], artifact[48];
        snprintf(arch, sizeof arch, "%.*s", (int)len, p);
        p += len + (p[len] == ',');
        int number, ptx;
        jit_cuda_arch_parse(arch, &number, &ptx);
        snprintf(artifact, sizeof artifact, "%s.%s", arch, ptx ? "ptx" : "cubin");

        cache_entry *entry = NULL;
        int hit = 0;
        if (identity) {
            cache_request req;
            device_request(s, arch, identity, &req);
            *b = (dev_build){.src = s, .arch = arch, .artifact = artifact};
            char err[1024] = "";
            rc = cache_fetch(l->cache, &req, build_nvrtc, b, &entry, &hit, err, sizeof err);
            if (rc == OPJIT_ECOMPILE && defaulted && !ptx && !jit_nvrtc_supports(number) &&
                jit_nvrtc_highest_arch(number)) {
                /* This GPU is newer than NVRTC: its highest PTX instead,
                 * which the driver compiles for the GPU. */
                char sub[32];
                snprintf(sub, sizeof sub, "compute_%d", jit_nvrtc_highest_arch(number));
                rt_log(rt, OPJIT_LOG_INFO, "%s: NVRTC cannot compile for %s; using %s", s->path,
                       arch, sub);
                snprintf(arch, sizeof arch, "%s", sub);
                jit_cuda_arch_parse(arch, &number, &ptx);
                snprintf(artifact, sizeof artifact, "%s.ptx", arch);
                device_request(s, arch, identity, &req);
                *b = (dev_build){.src = s, .arch = arch, .artifact = artifact};
                rc = cache_fetch(l->cache, &req, build_nvrtc, b, &entry, &hit, err, sizeof err);
            }
            if (rc) {
                if (rc == OPJIT_ECOMPILE)
                    rt_error(rt, rc, "%s: compile error (NVRTC, %s):\n%s", s->path, arch,
                             b->diag);
                else
                    rt_error(rt, rc, "%s: device code for %s: %s", s->path, arch,
                             err[0] ? err : b->diag);
                goto fail;
            }
            /* Findable without NVRTC; best effort. */
            cache_request ireq;
            device_request(s, arch, NULL, &ireq);
            cache_index_put(l->cache, &ireq, &req.key);
        } else if (fetch_by_index(l, s, arch, &entry) == OPJIT_OK) {
            hit = 1;
        } else {
            rc = rt_error(rt, OPJIT_EDEVICE, "%s: %s (and no %s device code for it is in a "
                          "cache)", s->path, nverr, arch);
            goto fail;
        }
        if (!hit || (*all_hit && hit == CACHE_HIT_REMOTE))
            *all_hit = hit; /* CACHE_BUILT, or remote where any came from there */
        const char *path = cache_entry_path(entry, artifact);
        size_t size = 0;
        char *data = path ? loader_read_file(path, &size) : NULL;
        cache_entry_release(entry);
        if (!data) {
            rc = rt_error(rt, OPJIT_ECACHE, "%s: the cache entry for %s lacks %s", s->path, arch,
                          artifact);
            goto fail;
        }
        rc = cuda_module_add_image(cm, arch, data, size, producer);
        free(data);
        if (rc) {
            rt_error(rt, rc, "%s: %s: cannot keep the device code", s->path, arch);
            goto fail;
        }
    }
    free(b);
    *out = cm;
    return OPJIT_OK;
fail:
    free(b);
    cuda_module_free(cm);
    return rc;
}
