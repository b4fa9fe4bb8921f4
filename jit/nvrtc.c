/* jit/nvrtc.c - NVRTC: CUDA device code -> cubin (sm_XX) or PTX (compute_XX).
 *
 * libnvrtc is dlopened on first use, so the library builds and runs where no
 * CUDA toolkit is installed. Search order: $OPJIT_NVRTC_LIBRARY alone when
 * set (a path or a soname); else $CUDA_HOME, $CUDA_PATH, /usr/local/cuda
 * (their lib64/ then lib/), then the default library search; in each place
 * libnvrtc.so.13, .12, .11, then libnvrtc.so. A successful load is kept for
 * the life of the process; a failed one is retried on the next use (the
 * environment may have changed).
 *
 * NVRTC has no default include path: compiles get the toolkit's include
 * directory (and its cccl/ subdirectory, where CUDA 13 keeps libcu++).
 * The NVRTC API is thread-safe; only loading the library takes a lock.
 *
 * The types and entry points used are declared here (an ABI-stable subset
 * of nvrtc.h): this file compiles without the toolkit. */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "jit/jit.h"
#include "runtime/settings.h"
#include "opjit.h"

typedef int nvrtcResult; /* NVRTC_SUCCESS == 0 */
typedef struct _nvrtcProgram *nvrtcProgram;

static struct {
    pthread_mutex_t lock;
    atomic_int loaded; /* set last (release): what it guards is read without the lock */
    void *dl;
    char path[PATH_MAX];     /* where it was found */
    char identity[PATH_MAX + 96];
    char include[PATH_MAX];  /* toolkit include dir, "" if none */
    char cccl[PATH_MAX + 8]; /* include/cccl, "" if none */
    int major, minor;
    int *archs;              /* nvrtcGetSupportedArchs, may be NULL */
    int narchs;
    const char *(*GetErrorString)(nvrtcResult);
    nvrtcResult (*Version)(int *, int *);
    nvrtcResult (*GetNumSupportedArchs)(int *);
    nvrtcResult (*GetSupportedArchs)(int *);
    nvrtcResult (*CreateProgram)(nvrtcProgram *, const char *, const char *, int,
                                 const char *const *, const char *const *);
    nvrtcResult (*DestroyProgram)(nvrtcProgram *);
    nvrtcResult (*CompileProgram)(nvrtcProgram, int, const char *const *);
    nvrtcResult (*GetPTXSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetPTX)(nvrtcProgram, char *);
    nvrtcResult (*GetCUBINSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetCUBIN)(nvrtcProgram, char *);
    nvrtcResult (*GetProgramLogSize)(nvrtcProgram, size_t *);
    nvrtcResult (*GetProgramLog)(nvrtcProgram, char *);
} nv = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const char *const sonames[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so.11",
                                      "libnvrtc.so", NULL};

static int is_dir(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

static int is_file(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 && S_ISREG(st.st_mode);
}

/* The toolkit roots to look in: $CUDA_HOME, $CUDA_PATH, /usr/local/cuda. */
static int toolkit_roots(const char *roots[4])
{
    int n = 0;
    const settings_libs *libs = settings_libs_get();
    if (libs->cuda_home)
        roots[n++] = libs->cuda_home;
    if (libs->cuda_path)
        roots[n++] = libs->cuda_path;
    roots[n++] = "/usr/local/cuda";
    roots[n] = NULL;
    return n;
}

int jit_cuda_include_dir(char *out, size_t n)
{
    const char *roots[4];
    toolkit_roots(roots);
    for (int i = 0; roots[i]; i++) {
        char inc[PATH_MAX], probe[PATH_MAX + 32];
        snprintf(inc, sizeof inc, "%s/include", roots[i]);
        snprintf(probe, sizeof probe, "%s/cuda.h", inc);
        if (is_file(probe)) {
            snprintf(out, n, "%s", inc);
            return 1;
        }
    }
    if (n)
        out[0] = '\0';
    return 0;
}

void *jit_cuda_dlopen(const char *const *names, const char *override, int flags, char *path,
                      size_t pathlen, char *err, size_t errlen)
{
    char tried[2048] = "", last[512] = "";
    size_t t = 0;
    if (path && pathlen)
        path[0] = '\0';
#define TRIED(s)                                                                          \
    do {                                                                                  \
        if (t < sizeof tried)                                                             \
            t += (size_t)snprintf(tried + t, sizeof tried - t, "%s%s", t ? ", " : "", s); \
    } while (0)
    if (override && *override) {
        void *h = dlopen(override, flags);
        if (h) {
            if (path)
                snprintf(path, pathlen, "%s", override);
            return h;
        }
        const char *why = dlerror();
        snprintf(err, errlen, "cannot load %s: %s", override, why ? why : "dlopen failed");
        return NULL;
    }
    const char *roots[4];
    toolkit_roots(roots);
    static const char *const libdirs[] = {"lib64", "lib", NULL};
    for (int r = 0; roots[r]; r++)
        for (int d = 0; libdirs[d]; d++) {
            char dir[PATH_MAX];
            snprintf(dir, sizeof dir, "%s/%s", roots[r], libdirs[d]);
            if (!is_dir(dir))
                continue;
            TRIED(dir);
            for (int i = 0; names[i]; i++) {
                char p[PATH_MAX + 64];
                snprintf(p, sizeof p, "%s/%s", dir, names[i]);
                if (!is_file(p))
                    continue;
                void *h = dlopen(p, flags);
                if (h) {
                    if (path)
                        snprintf(path, pathlen, "%s", p);
                    return h;
                }
                const char *why = dlerror();
                snprintf(last, sizeof last, "%.500s", why ? why : p);
            }
        }
    TRIED("the default library path");
    for (int i = 0; names[i]; i++) {
        void *h = dlopen(names[i], flags);
        if (h) {
            if (path)
                snprintf(path, pathlen, "%s", names[i]);
            return h;
        }
        const char *why = dlerror();
        if (!last[0] || strstr(last, "No such file") || !strstr(why ? why : "", "No such file"))
            snprintf(last, sizeof last, "%.500s", why ? why : names[i]);
    }
#undef TRIED
    snprintf(err, errlen, "%s not found (looked in %s; last error: %s)", names[0], tried,
             last);
    return NULL;
}

/* p is a regular file: 1 and its stat in *st. */
static int is_file_st(const char *p, struct stat *st)
{
    return stat(p, st) == 0 && S_ISREG(st->st_mode);
}

int jit_nvrtc_locate(char *path, size_t n, struct stat *st)
{
    const char *override = settings_libs_get()->nvrtc;
    if (override) {
        if (!strchr(override, '/') || !is_file_st(override, st))
            return 0;
        snprintf(path, n, "%s", override);
        return 1;
    }
    const char *roots[4];
    toolkit_roots(roots);
    static const char *const libdirs[] = {"lib64", "lib", NULL};
    for (int r = 0; roots[r]; r++)
        for (int d = 0; libdirs[d]; d++)
            for (int i = 0; sonames[i]; i++) {
                char p[PATH_MAX + 64];
                snprintf(p, sizeof p, "%s/%s/%s", roots[r], libdirs[d], sonames[i]);
                if (is_file_st(p, st)) {
                    snprintf(path, n, "%s", p);
                    return 1;
                }
            }
    return 0; /* only the default library search would find it */
}

/* dlsym into *slot; 0 when missing. */
static int sym(void *dl, const char *name, void *slot)
{
    void *p = dlsym(dl, name);
    memcpy(slot, &p, sizeof p);
    return p != NULL;
}

/* The toolkit headers device code includes by name (half precision):
 * their sizes join the identity, so a toolkit whose headers changed under
 * the same NVRTC makes other keys. */
static void add_header_sizes(char *id, size_t n)
{
    static const char *const names[] = {"cuda_fp16.h", "cuda_fp16.hpp", "cuda_bf16.h",
                                        "cuda_bf16.hpp"};
    for (size_t i = 0; nv.include[0] && i < sizeof names / sizeof *names; i++) {
        char path[PATH_MAX + 32];
        struct stat st;
        size_t k = strlen(id);
        snprintf(path, sizeof path, "%s/%s", nv.include, names[i]);
        if (k < n && stat(path, &st) == 0)
            snprintf(id + k, n - k, " %s:%lld", names[i], (long long)st.st_size);
    }
}

static void find_include(void)
{
    nv.include[0] = nv.cccl[0] = '\0';
    if (!jit_cuda_include_dir(nv.include, sizeof nv.include)) {
        /* The library's own toolkit: <lib>/../include. */
        Dl_info di;
        char real[PATH_MAX];
        if (dladdr((void *)nv.Version, &di) && di.dli_fname &&
            realpath(di.dli_fname, real)) {
            char *s = strrchr(real, '/');
            if (s) {
                *s = '\0';
                s = strrchr(real, '/');
                if (s) {
                    *s = '\0';
                    char inc[PATH_MAX], probe[PATH_MAX + 32];
                    snprintf(inc, sizeof inc, "%.4000s/include", real);
                    snprintf(probe, sizeof probe, "%s/cuda_fp16.h", inc);
                    if (is_file(probe))
                        snprintf(nv.include, sizeof nv.include, "%s", inc);
                }
            }
        }
    }
    if (nv.include[0]) {
        char c[PATH_MAX + 8];
        snprintf(c, sizeof c, "%s/cccl", nv.include);
        if (is_dir(c))
            snprintf(nv.cccl, sizeof nv.cccl, "%s", c);
    }
}

int jit_nvrtc_load(char *err, size_t errlen)
{
    pthread_mutex_lock(&nv.lock);
    if (atomic_load_explicit(&nv.loaded, memory_order_relaxed)) {
        pthread_mutex_unlock(&nv.lock);
        return OPJIT_OK;
    }
    char why[3072];
    void *dl = jit_cuda_dlopen(sonames, settings_libs_get()->nvrtc, RTLD_NOW | RTLD_LOCAL,
                               nv.path, sizeof nv.path, why, sizeof why);
    if (!dl) {
        pthread_mutex_unlock(&nv.lock);
        snprintf(err, errlen,
                 "no NVRTC library, so CUDA device code cannot be compiled: %s. Install the "
                 "CUDA toolkit's NVRTC, or point CUDA_HOME (or OPJIT_NVRTC_LIBRARY) at it",
                 why);
        return OPJIT_EDEVICE;
    }
    int ok = sym(dl, "nvrtcGetErrorString", &nv.GetErrorString) &&
             sym(dl, "nvrtcVersion", &nv.Version) &&
             sym(dl, "nvrtcCreateProgram", &nv.CreateProgram) &&
             sym(dl, "nvrtcDestroyProgram", &nv.DestroyProgram) &&
             sym(dl, "nvrtcCompileProgram", &nv.CompileProgram) &&
             sym(dl, "nvrtcGetPTXSize", &nv.GetPTXSize) && sym(dl, "nvrtcGetPTX", &nv.GetPTX) &&
             sym(dl, "nvrtcGetCUBINSize", &nv.GetCUBINSize) &&
             sym(dl, "nvrtcGetCUBIN", &nv.GetCUBIN) &&
             sym(dl, "nvrtcGetProgramLogSize", &nv.GetProgramLogSize) &&
             sym(dl, "nvrtcGetProgramLog", &nv.GetProgramLog);
    if (ok && nv.Version(&nv.major, &nv.minor) != 0)
        ok = 0;
    if (!ok) {
        dlclose(dl);
        pthread_mutex_unlock(&nv.lock);
        snprintf(err, errlen, "%s is not a usable NVRTC (nvrtcGetCUBIN, nvrtcVersion... "
                 "missing or failing; NVRTC 11.1 or later is needed)", nv.path);
        return OPJIT_EDEVICE;
    }
    /* Optional (11.2+): the architectures it can compile for. */
    int n = 0;
    if (sym(dl, "nvrtcGetNumSupportedArchs", &nv.GetNumSupportedArchs) &&
        sym(dl, "nvrtcGetSupportedArchs", &nv.GetSupportedArchs) &&
        nv.GetNumSupportedArchs(&n) == 0 && n > 0 && (nv.archs = calloc((size_t)n, sizeof(int)))) {
        if (nv.GetSupportedArchs(nv.archs) == 0) {
            nv.narchs = n;
        } else {
            free(nv.archs);
            nv.archs = NULL;
        }
    }
    /* Identity for cache keys: the version, the file it came from and its
     * size (a patch release changes the size, not the version). */
    Dl_info di;
    char real[PATH_MAX] = "";
    long long size = -1;
    if (dladdr((void *)nv.Version, &di) && di.dli_fname && realpath(di.dli_fname, real)) {
        struct stat st;
        if (stat(real, &st) == 0)
            size = (long long)st.st_size;
    }
    const char *base = strrchr(real[0] ? real : nv.path, '/');
    base = base ? base + 1 : (real[0] ? real : nv.path);
    nv.dl = dl;
    find_include();
    snprintf(nv.identity, sizeof nv.identity, "nvrtc %d.%d %s %lld", nv.major, nv.minor, base,
             size);
    add_header_sizes(nv.identity, sizeof nv.identity);
    atomic_store_explicit(&nv.loaded, 1, memory_order_release);
    pthread_mutex_unlock(&nv.lock);
    return OPJIT_OK;
}

static int nv_loaded(void) { return atomic_load_explicit(&nv.loaded, memory_order_acquire); }

const char *jit_nvrtc_identity(void) { return nv_loaded() ? nv.identity : NULL; }

const char *jit_nvrtc_path(void) { return nv_loaded() ? nv.path : NULL; }


int jit_nvrtc_supports(int arch_number)
{
    if (!nv_loaded())
        return 0;
    if (!nv.narchs)
        return 1; /* unknown: let the compile say */
    for (int i = 0; i < nv.narchs; i++)
        if (nv.archs[i] == arch_number)
            return 1;
    return 0;
}

int jit_nvrtc_highest_arch(int at_most)
{
    int best = 0;
    if (!nv_loaded())
        return 0;
    for (int i = 0; i < nv.narchs; i++)
        if (nv.archs[i] <= at_most && nv.archs[i] > best)
            best = nv.archs[i];
    return best;
}

int jit_cuda_arch_parse(const char *s, int *number, int *ptx)
{
    int n = 0;
    if (!strncmp(s, "sm_", 3)) {
        *ptx = 0;
        s += 3;
    } else if (!strncmp(s, "compute_", 8)) {
        *ptx = 1;
        s += 8;
    } else {
        return 0;
    }
    if (*s < '1' || *s > '9')
        return 0;
    while (*s >= '0' && *s <= '9' && n < 10000)
        n = n * 10 + (*s++ - '0');
    if (*s == 'a' || *s == 'f')
        s++; /* arch-specific variants: sm_90a */
    if (*s || n < 10 || n >= 10000)
        return 0;
    *number = n;
    return 1;
}

/* ---- diagnostics ------------------------------------------------------------ */

/* NVRTC's closing "1 error detected in the compilation of "name"." (or
 * "N errors"): the name a third time, the count nothing new. */
static int summary_line(const char *p, size_t len, const char *name)
{
    static const char tail[] = " detected in the compilation of \"";
    const char *t = memmem(p, len, tail, sizeof tail - 1);
    return t && p[0] >= '1' && p[0] <= '9' && !strncmp(t + sizeof tail - 1, name, strlen(name));
}

/* NVRTC says "name(12): error: ..." then quotes the line with a caret; we
 * say "name:12: error: ..." as libtcc does and keep NVRTC's quote. */
static void rewrite_log(jit_diag *d, const char *log, const char *name)
{
    size_t nl = strlen(name);
    for (const char *p = log; *p;) {
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        char *end;
        long line;
        if (summary_line(p, len, name)) {
            len = 0;
        } else if (len > nl + 3 && !strncmp(p, name, nl) && p[nl] == '(' &&
            (line = strtol(p + nl + 1, &end, 10)) > 0 && *end == ')' && end[1] == ':') {
            char head[64];
            jit_diag_put(d, name, nl);
            int n = snprintf(head, sizeof head, ":%ld:", line);
            jit_diag_put(d, head, (size_t)n);
            jit_diag_put(d, end + 2, len - (size_t)(end + 2 - p));
        } else {
            jit_diag_put(d, p, len);
        }
        if (!e)
            break;
        jit_diag_put(d, "\n", 1);
        p = e + 1;
    }
    while (d->len && (d->buf[d->len - 1] == '\n' || d->buf[d->len - 1] == ' '))
        d->buf[--d->len] = '\0';
}

/* ---- compile ---------------------------------------------------------------- */

/* Every compile's options besides -arch and the include paths: what goes
 * into cache keys. */
#define NVRTC_STD "--std=c++17"
#define NVRTC_LINEINFO "-lineinfo"
const char *jit_nvrtc_options(void) { return NVRTC_STD " " NVRTC_LINEINFO; }

/* NVRTC's options for job: the architecture, the fixed ones, the toolkit's
 * include directories, then job's own; opts has room for 40. */
typedef struct nv_options {
    const char *v[40];
    int n;
    char arch[64], inc[PATH_MAX + 4], cccl[PATH_MAX + 16];
} nv_options;

static void nv_options_make(const jit_nvrtc_job *job, nv_options *o)
{
    o->n = 0;
    snprintf(o->arch, sizeof o->arch, "-arch=%s", job->arch);
    o->v[o->n++] = o->arch;
    o->v[o->n++] = NVRTC_STD;
    o->v[o->n++] = NVRTC_LINEINFO;
    if (nv.include[0]) {
        snprintf(o->inc, sizeof o->inc, "-I%s", nv.include);
        o->v[o->n++] = o->inc;
    }
    if (nv.cccl[0]) {
        snprintf(o->cccl, sizeof o->cccl, "-I%s", nv.cccl);
        o->v[o->n++] = o->cccl;
    }
    for (const char *const *p = job->options; p && *p && o->n < 39; p++)
        o->v[o->n++] = *p;
    o->v[o->n] = NULL;
}

/* Whether NVRTC is loaded and compiles for job->arch; why not in diag. */
static int nv_check_arch(const jit_nvrtc_job *job, int *ptx, char *diag, size_t diaglen)
{
    char why[3584];
    int number, rc = jit_nvrtc_load(why, sizeof why);
    if (rc) {
        snprintf(diag, diaglen, "%s", why);
        return rc;
    }
    if (!job->arch || !jit_cuda_arch_parse(job->arch, &number, ptx)) {
        snprintf(diag, diaglen, "bad CUDA architecture '%s' (expected sm_XY or compute_XY)",
                 job->arch ? job->arch : "(null)");
        return OPJIT_EINVAL;
    }
    if (!jit_nvrtc_supports(number)) {
        size_t k = (size_t)snprintf(diag, diaglen, "NVRTC %d.%d cannot compile for %s; it "
                                    "supports", nv.major, nv.minor, job->arch);
        for (int i = 0; i < nv.narchs && k < diaglen; i++)
            k += (size_t)snprintf(diag + k, diaglen - k, " %d", nv.archs[i]);
        return OPJIT_ECOMPILE;
    }
    return OPJIT_OK;
}

/* Compile prog; on failure its log, rewritten, into d. */
static int nv_compile(nvrtcProgram prog, const jit_nvrtc_job *job, jit_diag *d, char *diag,
                      size_t diaglen)
{
    nv_options o;
    nv_options_make(job, &o);
    nvrtcResult r = nv.CompileProgram(prog, o.n, o.v);
    size_t logsize = 0;
    if (r && nv.GetProgramLogSize(prog, &logsize) == 0 && logsize > 1) {
        char *log = malloc(logsize + 1);
        if (log && nv.GetProgramLog(prog, log) == 0) {
            log[logsize] = '\0';
            rewrite_log(d, log, job->source_name);
        }
        free(log);
    }
    if (r && !d->len)
        snprintf(diag, diaglen, "%s: %s", job->source_name, nv.GetErrorString(r));
    return r ? OPJIT_ECOMPILE : OPJIT_OK;
}

/* The compiled image: PTX text (without its NUL) or a cubin, malloc'd. */
static int nv_image(nvrtcProgram prog, const jit_nvrtc_job *job, int ptx, char **bin,
                    size_t *size, char *diag, size_t diaglen)
{
    *size = 0;
    nvrtcResult r = ptx ? nv.GetPTXSize(prog, size) : nv.GetCUBINSize(prog, size);
    *bin = r || !*size ? NULL : malloc(*size);
    if (*bin && (r = ptx ? nv.GetPTX(prog, *bin) : nv.GetCUBIN(prog, *bin)) != 0) {
        free(*bin);
        *bin = NULL;
    }
    if (!*bin) {
        snprintf(diag, diaglen, "%s: NVRTC produced no %s for %s (%s)", job->source_name,
                 ptx ? "PTX" : "cubin", job->arch,
                 r ? nv.GetErrorString(r) : *size ? "out of memory" : "it is empty");
        return r || !*size ? OPJIT_ECOMPILE : OPJIT_ENOMEM;
    }
    if (ptx)
        while (*size && (*bin)[*size - 1] == '\0')
            (*size)--; /* the file holds the text; loaders add the NUL */
    return OPJIT_OK;
}

static int nv_write(const char *path, const char *bin, size_t size, char *diag, size_t diaglen)
{
    FILE *f = fopen(path, "wbe");
    int ok = f && fwrite(bin, 1, size, f) == size;
    if (f && fclose(f))
        ok = 0;
    if (!ok)
        snprintf(diag, diaglen, "cannot write %s: %s", path, strerror(errno));
    return ok ? OPJIT_OK : OPJIT_EIO;
}

int jit_nvrtc_compile(const jit_nvrtc_job *job, char *diag, size_t diaglen)
{
    jit_diag d = {diag, 0, diaglen};
    if (diaglen)
        diag[0] = '\0';
    int ptx = 0, rc = nv_check_arch(job, &ptx, diag, diaglen);
    if (rc)
        return rc;
    nvrtcProgram prog = NULL;
    nvrtcResult r = nv.CreateProgram(&prog, job->text, job->source_name, 0, NULL, NULL);
    if (r) {
        snprintf(diag, diaglen, "nvrtcCreateProgram: %s", nv.GetErrorString(r));
        return OPJIT_ENOMEM;
    }
    char *bin = NULL;
    size_t size = 0;
    rc = nv_compile(prog, job, &d, diag, diaglen);
    if (!rc)
        rc = nv_image(prog, job, ptx, &bin, &size, diag, diaglen);
    nv.DestroyProgram(&prog);
    if (!rc)
        rc = nv_write(job->out_path, bin, size, diag, diaglen);
    free(bin);
    return rc;
}

/* ---- NVRTC in the table of compilers ----------------------------------------- */

static int nvrtc_file_id(const jit_settings *set, char *out, size_t n)
{
    (void)set;
    char path[PATH_MAX];
    struct stat st; /* the one stat that found it: the file id's */
    return jit_nvrtc_locate(path, sizeof path, &st) &&
           jit_file_id_of("nvrtc-file", path, &st, out, n);
}

static int nvrtc_identity(const jit_settings *set, char *out, size_t n, char *err,
                          size_t errlen)
{
    (void)set;
    int rc = jit_nvrtc_load(err, errlen); /* at once when loaded already */
    if (!rc)
        snprintf(out, n, "%s", jit_nvrtc_identity());
    return rc;
}

static void nvrtc_options(const jit_job *job, char *out, size_t n)
{
    (void)job;
    snprintf(out, n, "%s", jit_nvrtc_options());
}

static void nvrtc_targets(const jit_settings *set, char *out, size_t n)
{
    snprintf(out, n, "%s", set->cuda_archs ? set->cuda_archs : "");
}

static void nvrtc_artifact(const char *target, char *out, size_t n)
{
    int number, ptx = 0;
    jit_cuda_arch_parse(target, &number, &ptx);
    snprintf(out, n, "%s.%s", target, ptx ? "ptx" : "cubin");
}

static int nvrtc_compile_job(const jit_job *job, char *diag, size_t n)
{
    char out[PATH_MAX + 64];
    snprintf(out, sizeof out, "%s/%s", job->dir, job->artifact);
    jit_nvrtc_job nj = {
        .source_name = job->source_name,
        .text = job->text,
        .arch = job->target,
        .out_path = out,
    };
    return jit_nvrtc_compile(&nj, diag, n);
}

static int nvrtc_target_valid(const char *target)
{
    int number, ptx;
    return jit_cuda_arch_parse(target, &number, &ptx);
}

/* sm_CC, or where the NVRTC loaded is older than the GPU, its highest
 * PTX (the driver compiles that for the GPU). */
static void nvrtc_device_target(int cc, char *out, size_t n)
{
    if (jit_nvrtc_identity() && !jit_nvrtc_supports(cc) && jit_nvrtc_highest_arch(cc))
        snprintf(out, n, "compute_%d", jit_nvrtc_highest_arch(cc));
    else
        snprintf(out, n, "sm_%d", cc);
}

static int nvrtc_fallback_target(const char *target, char *out, size_t n)
{
    int number, ptx;
    if (!jit_cuda_arch_parse(target, &number, &ptx) || ptx || jit_nvrtc_supports(number) ||
        !jit_nvrtc_highest_arch(number))
        return 0;
    snprintf(out, n, "compute_%d", jit_nvrtc_highest_arch(number));
    return 1;
}

static void nvrtc_producer(char *out, size_t n)
{
    int vmaj, vmin;
    const char *id = jit_nvrtc_identity();
    if (id && sscanf(id, "nvrtc %d.%d", &vmaj, &vmin) == 2)
        snprintf(out, n, "NVRTC %d.%d", vmaj, vmin);
    else
        snprintf(out, n, "the NVRTC that warmed the cache");
}

const jit_compiler jit_nvrtc = {
    .name = "nvrtc",
    .what = "NVRTC",
    .halves = JIT_CU_DEVICE,
    .background = 0,
    .file_id = nvrtc_file_id,
    .identity = nvrtc_identity,
    .options = nvrtc_options,
    .targets = nvrtc_targets,
    .artifact = nvrtc_artifact,
    .compile = nvrtc_compile_job,
    .target_valid = nvrtc_target_valid,
    .device_target = nvrtc_device_target,
    .fallback_target = nvrtc_fallback_target,
    .producer = nvrtc_producer,
};
