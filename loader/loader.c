/* loader/loader.c - from a name or a path to registered kernels:
 * resolve the source, read it and the local headers it includes, hash the
 * cache key, fetch or build the artifact, dlopen it, run the module init,
 * publish its kernels.
 *
 * Loads on one runtime are serialised by the loader's mutex (compiles are
 * serialised anyway); calls never take it. */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

#include "jit/jit.h"
#include "loader/loader_int.h"
#include "opjit_build_config.h"
#include "runtime/cuda.h"

double loader_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static void cache_log(void *ud, int level, const char *msg)
{
    rt_log(ud, level, "%s", msg);
}

/* The ops shipped with this copy of the library, found from where it is
 * loaded: <directory of libopjit.so>/<libdir to datadir>/opjit/ops, or from
 * the executable's bindir when libopjit.a is linked into it. NULL when that
 * directory does not exist or is the configure-time one. */
static char *relocated_ops_dir(void)
{
    Dl_info info;
    struct link_map *map = NULL;
    char self[PATH_MAX], dir[PATH_MAX], real[PATH_MAX], conf[PATH_MAX];
    const char *rel = OPJIT_DATADIR_FROM_LIBDIR;
    if (!dladdr1((void *)&loader_create, &info, (void **)&map, RTLD_DL_LINKMAP) || !map)
        return NULL;
    if (map->l_name && map->l_name[0]) { /* a shared object: libopjit.so */
        if (!realpath(map->l_name, self))
            return NULL;
    } else { /* the executable */
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        if (n <= 0 || (size_t)n >= sizeof self - 1)
            return NULL;
        self[n] = '\0';
        rel = OPJIT_DATADIR_FROM_BINDIR;
    }
    char *slash = strrchr(self, '/');
    if (!slash)
        return NULL;
    *slash = '\0';
    if ((size_t)snprintf(dir, sizeof dir, "%s/%s/opjit/ops", self, rel) >= sizeof dir ||
        !realpath(dir, real) || strchr(real, ':'))
        return NULL;
    if (realpath(OPJIT_INSTALLED_OPS_DIR, conf) && strcmp(real, conf) == 0)
        return NULL;
    return strdup(real);
}

int loader_create(opjit_runtime *rt, const opjit_config *cfg, struct loader **out)
{
    loader *l = calloc(1, sizeof *l);
    if (!l)
        return OPJIT_ENOMEM;
    l->rt = rt;
    pthread_mutex_init(&l->lock, NULL);
    const char *env = getenv("OPJIT_OPS_PATH");
    char *moved = relocated_ops_dir();
    size_t n = (cfg->ops_path ? strlen(cfg->ops_path) : 0) + (env ? strlen(env) : 0) +
               (moved ? strlen(moved) : 0) + strlen(OPJIT_INSTALLED_OPS_DIR) + 4;
    l->ops_path = malloc(n);
    if (!l->ops_path) {
        free(moved);
        free(l);
        return OPJIT_ENOMEM;
    }
    snprintf(l->ops_path, n, "%s%s%s%s%s%s%s", cfg->ops_path ? cfg->ops_path : "",
             cfg->ops_path && *cfg->ops_path ? ":" : "", env ? env : "",
             env && *env ? ":" : "", moved ? moved : "", moved ? ":" : "",
             OPJIT_INSTALLED_OPS_DIR);
    free(moved);
    cache_config cc = {
        .dir = cfg->cache_dir,
        .readonly = cfg->readonly_caches,
        .offline = cfg->offline,
        .disabled = cfg->no_cache,
        .log = cache_log,
        .log_ud = rt,
        .remote_url = cfg->remote_cache,
        .remote_key_file = cfg->remote_key_file,
        .remote_connect_timeout_ms = cfg->remote_connect_timeout_ms,
        .remote_timeout_ms = cfg->remote_timeout_ms,
        .remote_push = cfg->remote_push,
    };
    char err[1024];
    int rc = cache_open(&cc, &l->cache, err, sizeof err);
    if (!rc && (rc = tier_create(l, cfg)))
        cache_close(l->cache);
    l->cfg_offline = cfg->offline;
    l->cfg_no_cache = cfg->no_cache;
    if (!rc && ((cfg->cuda_archs && !(l->cuda_archs = strdup(cfg->cuda_archs))) ||
                (cfg->cache_dir && !(l->cfg_cache_dir = strdup(cfg->cache_dir))) ||
                (cfg->readonly_caches && !(l->cfg_readonly = strdup(cfg->readonly_caches))))) {
        free(l->cuda_archs);
        free(l->cfg_cache_dir);
        tier_destroy(l);
        cache_close(l->cache);
        rc = OPJIT_ENOMEM;
    }
    if (rc) {
        free(l->ops_path);
        free(l);
        return rc;
    }
    *out = l;
    return OPJIT_OK;
}

/* What the scratch directory may hold: opjit_op.h, and cc-version.txt
 * while the tier asks the compiler for its version. A process killed with
 * it still there leaves it to the next one that makes one (see
 * cache_private_mkdir). */
static const char *const scratch_files[] = {"opjit_op.h", "cc-version.txt", NULL};

static void remove_scratch(loader *l)
{
    if (!l->scratch[0])
        return;
    cache_private_rmdir(l->scratch, scratch_files);
    close(l->scratch_lock); /* after: nobody sweeps it under us */
    l->scratch[0] = '\0';
}

void loader_destroy(struct loader *l)
{
    if (!l)
        return;
    tier_destroy(l); /* first: its worker uses everything below */
    for (loaded *e = l->loaded, *next; e; e = next) {
        next = e->next;
        free(e->path);
        free(e->op_name);
        free(e);
    }
    cache_close(l->cache);
    remove_scratch(l);
    free(l->ops_path);
    free(l->cuda_archs);
    free(l->cfg_cache_dir);
    free(l->cfg_readonly);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

/* The op header as this library was built with it, written once per
 * runtime into a private directory for libtcc to include. */
static int make_scratch(loader *l);

/* Created on the first compile only: cache hits never touch /tmp. The
 * tier worker may get here too, hence the lock. */
int loader_scratch(loader *l)
{
    static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
    pthread_mutex_lock(&lock);
    int rc = l->scratch[0] ? OPJIT_OK : make_scratch(l);
    pthread_mutex_unlock(&lock);
    return rc;
}

static int make_scratch(loader *l)
{
    const char *tmp = getenv("TMPDIR");
    int e = cache_private_mkdir(tmp && *tmp ? tmp : "/tmp", "opjit-", scratch_files, l->scratch,
                                sizeof l->scratch, &l->scratch_lock);
    if (e) {
        l->scratch[0] = '\0';
        return rt_error(l->rt, OPJIT_EIO, "cannot create a temporary directory in %s: %s",
                        tmp && *tmp ? tmp : "/tmp", strerror(e));
    }
    char p[PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/opjit_op.h", l->scratch);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(opjit_op_h_text, 1, sizeof opjit_op_h_text, f) != sizeof opjit_op_h_text) {
        e = errno;
        if (f)
            fclose(f);
        remove_scratch(l);
        return rt_error(l->rt, OPJIT_EIO, "cannot write %s: %s", p, strerror(e));
    }
    if (fclose(f)) {
        e = errno;
        remove_scratch(l);
        return rt_error(l->rt, OPJIT_EIO, "cannot write %s: %s", p, strerror(e));
    }
    return OPJIT_OK;
}

/* ---- reading sources ------------------------------------------------------ */

char *loader_read_file(const char *path, size_t *len)
{
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is then
     * refused as not a regular file. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    struct stat st;
    int bad = fstat(fd, &st) != 0 ? errno : !S_ISREG(st.st_mode) ? EINVAL : 0;
    if (bad) {
        close(fd);
        errno = bad;
        return NULL;
    }
    size_t cap = (size_t)st.st_size + 4096, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        ssize_t r = read(fd, buf + n, cap - n - 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            if (r < 0) {
                free(buf);
                buf = NULL;
                errno = EIO;
            }
            break;
        }
        n += (size_t)r;
        if (n == cap - 1) { /* it grew while we read */
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
            cap *= 2;
        }
    }
    int e = errno;
    close(fd);
    if (!buf) {
        errno = e == EIO ? EIO : ENOMEM;
        return NULL;
    }
    buf[n] = '\0';
    if (len)
        *len = n;
    return buf;
}

/* Local headers: every `#include "x"` resolved against the including
 * file's directory, transitively, as the compiler finds them. Each goes
 * into the key as (name relative to the source's directory, contents).
 * Every one counts, however many and however deep (each is visited once,
 * which ends include cycles): one left out would make its edits stale
 * cache hits. The buffers live on the heap, as the recursion may be deep. */
#define MAX_INCLUDE_DEPTH 1024

typedef struct header_set {
    char **real; /* realpaths already hashed */
    int n, cap;
    int oom;
    char *bad;   /* the first local header that is not a regular file */
} header_set;

typedef struct header_bufs {
    char name[512], path[PATH_MAX], rel[PATH_MAX], real[PATH_MAX], hdir[PATH_MAX],
        hprefix[PATH_MAX];
} header_bufs;

static int header_seen(header_set *hs, const char *real)
{
    for (int i = 0; i < hs->n; i++)
        if (!strcmp(hs->real[i], real))
            return 1;
    if (hs->n == hs->cap) {
        int cap = hs->cap ? hs->cap * 2 : 16;
        char **p = realloc(hs->real, (size_t)cap * sizeof *p);
        if (!p)
            return hs->oom = 1;
        hs->real = p;
        hs->cap = cap;
    }
    if (!(hs->real[hs->n] = strdup(real)))
        return hs->oom = 1;
    hs->n++;
    return 0;
}

/* dir: the including file's directory; src_dir: the source's, which the
 * compilers also search first (-I) for "x.h" and <x.h> alike. */
static void add_local_headers(cache_keygen *g, const char *src_dir, const char *dir,
                              const char *text, const char *rel_prefix, header_set *hs,
                              int depth)
{
    if (depth > MAX_INCLUDE_DEPTH) {
        hs->oom = 1; /* never a key that silently lacks headers */
        return;
    }
    header_bufs *b = NULL;
    for (const char *p = text; (p = strstr(p, "#")); p++) {
        const char *q = p + 1;
        /* must be at the start of a line, maybe indented */
        const char *bl = p;
        while (bl > text && (bl[-1] == ' ' || bl[-1] == '\t'))
            bl--;
        if (bl > text && bl[-1] != '\n')
            continue;
        while (*q == ' ' || *q == '\t')
            q++;
        if (strncmp(q, "include", 7))
            continue;
        q += 7;
        while (*q == ' ' || *q == '\t')
            q++;
        if (*q != '"' && *q != '<')
            continue;
        int quoted = *q == '"';
        const char *e = strchr(q + 1, quoted ? '"' : '>');
        const char *nl = strchr(q + 1, '\n');
        if (!e || (nl && nl < e) || e - q - 1 >= 512)
            continue;
        if (!b && !(b = malloc(sizeof *b))) {
            hs->oom = 1;
            return;
        }
        snprintf(b->name, sizeof b->name, "%.*s", (int)(e - q - 1), q + 1);
        /* Where the compiler looks first: "x.h" next to the including
         * file, then (like <x.h>) in the source's directory. */
        int found = 0;
        if (quoted && (size_t)snprintf(b->path, sizeof b->path, "%s/%s", dir, b->name) <
                          sizeof b->path && realpath(b->path, b->real)) {
            found = 1;
            snprintf(b->rel, sizeof b->rel, "%s%s", rel_prefix, b->name);
        } else if ((size_t)snprintf(b->path, sizeof b->path, "%s/%s", src_dir, b->name) <
                       sizeof b->path && realpath(b->path, b->real)) {
            found = 1;
            snprintf(b->rel, sizeof b->rel, "%s", b->name);
        }
        if (!found)
            continue; /* not local: a system header, or the compiler will fail */
        if (header_seen(hs, b->real))
            continue;
        size_t len;
        char *h = loader_read_file(b->real, &len);
        if (!h && errno == EINVAL && !hs->bad) /* a FIFO or device: the compiler would hang */
            hs->bad = strdup(b->real);
        if (!h)
            continue;
        cache_keygen_add_str(g, "header-name", b->rel);
        cache_keygen_add(g, "header", h, len);
        snprintf(b->hdir, sizeof b->hdir, "%s", b->real);
        char *slash = strrchr(b->hdir, '/');
        if (slash)
            *slash = '\0';
        const char *rslash = strrchr(b->rel, '/');
        snprintf(b->hprefix, sizeof b->hprefix, "%.*s", rslash ? (int)(rslash - b->rel + 1) : 0,
                 b->rel);
        add_local_headers(g, src_dir, b->hdir, h, b->hprefix, hs, depth + 1);
        free(h);
    }
    free(b);
}

/* ---- one source file ------------------------------------------------------ */

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

static int has_suffix(const char *s, const char *suf)
{
    size_t n = strlen(s), m = strlen(suf);
    return n >= m && !strcmp(s + n - m, suf);
}

static char target_triple[128];
static pthread_once_t target_once = PTHREAD_ONCE_INIT;

static void target_init(void)
{
    struct utsname u;
    snprintf(target_triple, sizeof target_triple, "%s-linux",
             uname(&u) == 0 ? u.machine : "unknown");
}

/* Once per process: runtimes on other threads read it at the same time. */
const char *loader_target(void)
{
    pthread_once(&target_once, target_init);
    return target_triple;
}

static void source_digest(const source *s, cache_key *out, char **bad_header);

int source_read(loader *l, const char *path, source *s)
{
    opjit_runtime *rt = l->rt;
    memset(s, 0, sizeof *s);
    s->path = path;
    if (has_suffix(path, ".c"))
        s->device = OPJIT_CPU;
    else if (has_suffix(path, ".cu"))
        s->device = OPJIT_CUDA; /* host half by libtcc, device half by NVRTC */
    else
        return rt_error(rt, OPJIT_EINVAL, "%s: not an op source (expected a .c or .cu file)",
                        path);
    if (!realpath(path, s->real))
        return rt_error(rt, errno == ENOENT ? OPJIT_ENOTFOUND : OPJIT_EIO, "%s: %s", path,
                        strerror(errno));
    s->text = loader_read_file(s->real, &s->len);
    if (!s->text && errno == EINVAL)
        return rt_error(rt, OPJIT_EINVAL, "%s: not a regular file", path);
    if (!s->text)
        return rt_error(rt, OPJIT_EIO, "%s: cannot read: %s", path, strerror(errno));
    if (strlen(s->text) != s->len) {
        source_free(s);
        return rt_error(rt, OPJIT_EINVAL, "%s: not a text file (it holds a NUL byte)", path);
    }
    snprintf(s->dir, sizeof s->dir, "%s", s->real);
    *strrchr(s->dir, '/') = '\0';
    s->name = base_name(path);
    snprintf(s->stem, sizeof s->stem, "%.*s", (int)(strrchr(s->name, '.') - s->name), s->name);
    char *bad = NULL;
    source_digest(s, &s->digest, &bad);
    if (bad) {
        rt_error(rt, OPJIT_EINVAL, "%s: the local header %s is not a regular file", path, bad);
        free(bad);
        source_free(s);
        return OPJIT_EINVAL;
    }
    return OPJIT_OK;
}

void source_free(source *s)
{
    free(s->text);
    s->text = NULL;
}

/* What every artifact of s depends on, hashed: opjit's ABI and op header,
 * the source's name and bytes, its local headers as they are on disk.
 * *bad_header (NULL: not wanted) receives a local header that is not a
 * regular file (malloc'd), which no compile may be asked to open. */
static void source_digest(const source *s, cache_key *out, char **bad_header)
{
    cache_keygen *g = cache_keygen_new();
    if (!g) {
        memset(out, 0, sizeof *out); /* the cache refuses an all-zero key */
        return;
    }
    char abi[32];
    snprintf(abi, sizeof abi, "%d", OPJIT_ABI_VERSION);
    cache_keygen_add_str(g, "opjit-abi", abi);
    cache_keygen_add(g, "opjit_op.h", opjit_op_h_text, sizeof opjit_op_h_text);
    cache_keygen_add_str(g, "source-name", s->name);
    cache_keygen_add(g, "source", s->text, s->len);
    header_set hs = {0};
    add_local_headers(g, s->dir, s->dir, s->text, "", &hs, 0);
    for (int i = 0; i < hs.n; i++)
        free(hs.real[i]);
    free(hs.real);
    if (bad_header)
        *bad_header = hs.bad;
    else
        free(hs.bad);
    if (hs.oom || hs.bad) {
        /* Never a key that silently lacks headers: the all-zero key, which
         * the cache refuses (out of memory). */
        cache_keygen_finish(g, out);
        memset(out, 0, sizeof *out);
        return;
    }
    cache_keygen_finish(g, out);
}

cache_keygen *source_keygen(const source *s)
{
    static const unsigned char zero[sizeof s->digest.bytes];
    /* An all-zero digest is one that could not be computed (out of
     * memory): no key may be made of it, or every such source would share
     * one. */
    if (!memcmp(s->digest.bytes, zero, sizeof zero))
        return NULL;
    cache_keygen *g = cache_keygen_new();
    if (g)
        cache_keygen_add(g, "source-digest", s->digest.bytes, sizeof s->digest.bytes);
    return g;
}

int source_unchanged(const source *s)
{
    cache_key now;
    source_digest(s, &now, NULL);
    return !memcmp(now.bytes, s->digest.bytes, sizeof now.bytes);
}

typedef struct build_ctx {
    loader *l;
    const source *src;
    char diag[OPJIT_ERRMSG_SIZE - 256];
} build_ctx;

#define TCC_OPTIONS "-shared -DFORCE_OPENBLAS_COMPLEX_STRUCT -DOPJIT_TIER_TCC -lm"

/* Linking OpenBLAS costs its initialisation (2 to 15 ms of thread-pool
 * start-up) at every dlopen, so only sources that use it get it. */
int source_uses_blas(const source *s) { return strstr(s->text, "cblas") != NULL; }

static int build_tcc(void *ud, const char *dir, char *err, size_t errlen)
{
    build_ctx *b = ud;
    char out[PATH_MAX];
    int rc = loader_scratch(b->l);
    if (rc) {
        snprintf(err, errlen, "%s", opjit_errmsg(b->l->rt));
        return rc;
    }
    snprintf(out, sizeof out, "%s/host.so", dir);
    const char *includes[] = {b->src->dir, b->l->scratch, OPJIT_DLPACK_INCLUDE_DIR,
                              OPJIT_CBLAS_INCLUDE_DIR, NULL, NULL, NULL};
    const char *defines[] = {"FORCE_OPENBLAS_COMPLEX_STRUCT", "OPJIT_TIER_TCC", NULL};
    int cuda = b->src->device == OPJIT_CUDA; /* a .cu host half: cuda.h, cudnn.h */
    if (cuda) {
        includes[4] = cu_toolkit_include();
        includes[includes[4] ? 5 : 4] = cu_cudnn_include();
    }
    const char *libs[] = {"m", source_uses_blas(b->src) ? "openblas" : NULL, NULL};
    char libdir[PATH_MAX];
    snprintf(libdir, sizeof libdir, "%s", OPJIT_OPENBLAS_LIBRARY);
    char *slash = strrchr(libdir, '/');
    if (slash)
        *slash = '\0';
    const char *libdirs[] = {libdir, NULL};
    jit_tcc_job job = {
        .source_name = b->src->path,
        .text = b->src->text,
        .include_dirs = includes,
        .defines = cuda ? cu_host_defines : defines,
        .libraries = libs,
        .library_dirs = libdirs,
        .tcc_lib_dir = OPJIT_TCC_LIB_DIR,
        .out_path = out,
    };
    rc = jit_tcc_compile(&job, b->diag, sizeof b->diag);
    if (!rc && !source_unchanged(b->src)) {
        /* A header changed while we compiled: the artifact may not be
         * what the key says. Never publish it. */
        snprintf(b->diag, sizeof b->diag, "%s: a local header changed during the compile; "
                 "load it again", b->src->path);
        rc = OPJIT_ECOMPILE;
    }
    if (rc)
        snprintf(err, errlen, "%s", rc == OPJIT_ECOMPILE ? "compile error" : b->diag);
    return rc;
}

loaded *loader_find_loaded(loader *l, const char *real)
{
    for (loaded *e = l->loaded; e; e = e->next)
        if (!strcmp(e->path, real))
            return e;
    return NULL;
}

static int remember(loader *l, const char *real, const cache_key *key, const char *op_name,
                    const char *tier)
{
    loaded *e = loader_find_loaded(l, real);
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e || !(e->path = strdup(real))) {
            free(e);
            return OPJIT_ENOMEM;
        }
        e->next = l->loaded;
        l->loaded = e;
    }
    char *name = strdup(op_name);
    if (!name)
        return OPJIT_ENOMEM;
    free(e->op_name);
    e->op_name = name;
    e->key = *key;
    snprintf(e->tier, sizeof e->tier, "%s", tier);
    return OPJIT_OK;
}

/* The op to hand back for a module: the one named after the file, else the
 * first it registered. */
static const char *module_op_name(const module *m, const char *stem)
{
    for (const kernel *k = m->kernels; k; k = k->next_in_module)
        if (!strcmp(k->sch.name, stem))
            return k->sch.name;
    return m->kernels->sch.name;
}

int load_module(loader *l, const source *s, const char *so, const char *tier, module **out)
{
    opjit_runtime *rt = l->rt;
    int rc;
    *out = NULL;
    if (!so) /* the cache entry lacks the artifact */
        return rt_error(rt, OPJIT_ECACHE, "%s: the cache entry has no host.so", s->path);
    module *m = module_new(rt, s->path, s->real, tier, s->device);
    if (!m)
        return rt_error(rt, OPJIT_ENOMEM, "out of memory");
    m->dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!m->dl) {
        const char *why = dlerror();
        rc = rt_error(rt, OPJIT_EMODULE, "%s: cannot load the compiled module: %s", s->path,
                      why ? why : "unknown dlopen error");
        goto fail;
    }
    opjit_module_init_fn init = (opjit_module_init_fn)dlsym(m->dl, OPJIT_MODULE_ENTRY);
    if (!init) {
        rc = rt_error(rt, OPJIT_EMODULE, "%s: no OPJIT_MODULE(...) block: the source must "
                      "define its module init with OPJIT_MODULE(name, m) { ... }", s->path);
        goto fail;
    }
    if (init(&runtime_api, (opjit_module *)m) != 0) {
        rc = rt_error(rt, OPJIT_EMODULE, "%s: the module refused this runtime (built for "
                      "another opjit ABI than %d)", s->path, OPJIT_ABI_VERSION);
        goto fail;
    }
    if (m->status) {
        rc = rt_error(rt, m->status, "%s", m->err);
        goto fail;
    }
    if (!m->kernels) {
        rc = rt_error(rt, OPJIT_EMODULE, "%s: OPJIT_MODULE registered no kernel (call "
                      "opjit_def in it)", s->path);
        goto fail;
    }
    *out = m;
    return OPJIT_OK;
fail:
    module_discard(m);
    return rc;
}

/* Load, publish and remember the module in entry's artifact. */
static int publish_entry(loader *l, const source *s, cache_entry *entry, const char *tier,
                         const cache_key *key, char *opname, size_t opname_len,
                         struct cuda_module *cm)
{
    module *m;
    if (s->device == OPJIT_CUDA)
        cu_preload(l, s); /* cuDNN, cuBLAS: for the sources that mention them */
    int rc = load_module(l, s, cache_entry_path(entry, "host.so"), tier, &m);
    if (rc && s->device == OPJIT_CUDA && cu_preload_missing(l, opjit_errmsg(l->rt)))
        rc = load_module(l, s, cache_entry_path(entry, "host.so"), tier, &m); /* links one */
    if (rc) {
        cuda_module_free(cm);
        if (s->device == OPJIT_CUDA) {
            char why[2300], msg[2048];
            cu_preload_explain(opjit_errmsg(l->rt), why, sizeof why);
            snprintf(msg, sizeof msg, "%s", opjit_errmsg(l->rt));
            if (why[0])
                rc = rt_error(l->rt, rc, "%s%s", msg, why);
        }
        return rc;
    }
    m->cuda = cm; /* the module owns its device code now */
    snprintf(opname, opname_len, "%s", module_op_name(m, s->stem));
    if ((rc = module_publish(l->rt, m))) {
        module_discard(m);
        return rc;
    }
    if (remember(l, s->real, key, opname, tier))
        return rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
    return OPJIT_OK;
}

/* The request of s's libtcc artifact: everything that goes into it,
 * nothing else. OPJIT_ENOMEM when the key cannot be made. */
static int tcc_request(const source *s, cache_request *req)
{
    cache_keygen *g = source_keygen(s);
    if (!g)
        return OPJIT_ENOMEM;
    cache_keygen_add_str(g, "compiler", OPJIT_TCC_IDENTITY);
    cache_keygen_add_str(g, "options", TCC_OPTIONS);
    cache_keygen_add_str(g, "link-blas", source_uses_blas(s) ? "yes" : "no");
    cache_keygen_add_str(g, "target", loader_target());
    if (s->device == OPJIT_CUDA)
        cu_host_key(g);
    *req = (cache_request){
        .op_name = s->stem,
        .source_name = s->name,
        .compiler = OPJIT_TCC_IDENTITY,
        .options = TCC_OPTIONS,
        .target = loader_target(),
        .tier = "tcc",
    };
    cache_keygen_finish(g, &req->key);
    return OPJIT_OK;
}

/* One load in progress: what load_file_locked's steps share. */
typedef struct load_job {
    loader *l;
    const char *path;
    source src;
    cache_request req;
    opjit_load_info *info; /* may be NULL */
    double t0, t_key;
    char opname[OPJIT_NAME_MAX + 1];
} load_job;

/* Fill the timings and the outcome into info; hit is a CACHE_* origin. */
static void load_report(load_job *j, int hit, const char *tier, double t_fetch)
{
    static const char *const origins[] = {"compiled", "local", "remote"};
    opjit_load_info *info = j->info;
    double now = loader_now_ms();
    if (!info)
        return;
    info->key_ms = j->t_key - j->t0;
    info->cache_hit = hit != CACHE_BUILT;
    snprintf(info->origin, sizeof info->origin, "%s", origins[hit]);
    info->compile_ms = hit || t_fetch <= 0 ? 0 : t_fetch - j->t_key;
    info->load_ms = t_fetch > 0 ? now - t_fetch : 0;
    info->total_ms = now - j->t0;
    snprintf(info->tier, sizeof info->tier, "%s", tier);
}

/* An optimized artifact already in a cache serves at once: OPJIT_OK when
 * it did (else the libtcc path runs). */
static int load_optimized(load_job *j)
{
    cache_entry *entry = NULL;
    if (tier_lookup(j->l, &j->src, &entry) != OPJIT_OK)
        return OPJIT_ENOTFOUND;
    double t_fetch = loader_now_ms();
    int origin = cache_entry_origin(entry);
    int rc = publish_entry(j->l, &j->src, entry, "opt", &j->req.key, j->opname,
                           sizeof j->opname, NULL);
    cache_entry_release(entry);
    if (rc) {
        rt_log(j->l->rt, OPJIT_LOG_WARN, "%s: the optimized artifact did not load (%s); "
               "using libtcc", j->path, opjit_errmsg(j->l->rt));
        return rc;
    }
    load_report(j, origin, "opt", t_fetch);
    rt_log(j->l->rt, OPJIT_LOG_INFO, "loaded %s (optimized tier from the cache, %.2f ms)",
           j->path, loader_now_ms() - j->t0);
    return OPJIT_OK;
}

/* The libtcc artifact from the cache or the compiler, a .cu's device code,
 * then the module published and the optimizing compile queued. */
static int load_compiled(load_job *j)
{
    loader *l = j->l;
    build_ctx *b = calloc(1, sizeof *b);
    if (!b)
        return rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
    *b = (build_ctx){.l = l, .src = &j->src};
    cache_entry *entry = NULL;
    char err[1024] = "";
    int hit = 0, rc = cache_fetch(l->cache, &j->req, build_tcc, b, &entry, &hit, err, sizeof err);
    if (rc == OPJIT_ECOMPILE)
        rt_error(l->rt, rc, "%s: compile error:\n%s", j->path, b->diag);
    else if (rc)
        rt_error(l->rt, rc, "%s: %s", j->path, err);
    free(b);
    struct cuda_module *cm = NULL;
    const char *tier = j->src.device == OPJIT_CUDA ? "nvrtc" : "tcc";
    int dev_hit = 1;
    if (!rc && j->src.device == OPJIT_CUDA) /* its device code, per architecture */
        rc = cu_device_code(l, &j->src, &cm, &dev_hit);
    double t_fetch = loader_now_ms();
    if (!rc)
        rc = publish_entry(l, &j->src, entry, tier, &j->req.key, j->opname, sizeof j->opname, cm);
    cache_entry_release(entry);
    if (rc)
        return rc;
    tier_schedule(l, &j->src, &j->req.key);
    int origin = !hit || !dev_hit ? CACHE_BUILT : hit > dev_hit ? hit : dev_hit;
    load_report(j, origin, tier, t_fetch);
    rt_log(l->rt, OPJIT_LOG_INFO, "loaded %s (%s, %.2f ms)", j->path,
           origin == CACHE_BUILT ? "compiled" : origin == CACHE_HIT_REMOTE ? "remote hit"
                                                                         : "cache hit",
           loader_now_ms() - j->t0);
    return OPJIT_OK;
}

static int load_file_locked(loader *l, const char *path, opjit_op **op, opjit_load_info *info)
{
    load_job *j = calloc(1, sizeof *j);
    if (!j)
        return rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
    *j = (load_job){.l = l, .path = path, .info = info, .t0 = loader_now_ms()};
    if (info) {
        memset(info, 0, sizeof *info);
        snprintf(info->source, sizeof info->source, "%s", path);
    }
    int rc = source_read(l, path, &j->src);
    if (rc) {
        free(j);
        return rc;
    }
    if ((rc = tcc_request(&j->src, &j->req)))
        rc = rt_error(l->rt, rc, "out of memory");
    j->t_key = loader_now_ms();
    loaded *prev = rc ? NULL : loader_find_loaded(l, j->src.real);
    if (prev && !memcmp(prev->key.bytes, j->req.key.bytes, sizeof j->req.key.bytes)) {
        /* Unchanged since it was loaded: nothing to do. */
        snprintf(j->opname, sizeof j->opname, "%s", prev->op_name);
        load_report(j, 1, prev->tier, 0);
    } else if (!rc && load_optimized(j) != OPJIT_OK) {
        rc = load_compiled(j);
    }
    source_free(&j->src);
    if (!rc && op)
        rc = opjit_find_op(l->rt, j->opname, op);
    free(j);
    return rc;
}

/* ---- names ---------------------------------------------------------------- */

void loader_same_caches(const loader *l, opjit_config *cfg)
{
    opjit_config_init(cfg);
    cfg->cache_dir = l->cfg_cache_dir;
    cfg->readonly_caches = l->cfg_readonly;
    cfg->offline = l->cfg_offline;
    cfg->no_cache = l->cfg_no_cache;
    cfg->cuda_archs = l->cuda_archs;
}

int loader_is_path_spec(const char *spec)
{
    return strchr(spec, '/') || has_suffix(spec, ".c") || has_suffix(spec, ".cu");
}

size_t loader_source_stem(const char *file)
{
    size_t n = strlen(file);
    if (file[0] == '.')
        return 0;
    if (n > 2 && has_suffix(file, ".c"))
        return n - 2;
    if (n > 3 && has_suffix(file, ".cu"))
        return n - 3;
    return 0;
}

int opjit_load_file(opjit_runtime *rt, const char *path, opjit_op **op, opjit_load_info *info)
{
    if (op)
        *op = NULL;
    if (!rt || !path)
        return rt_error(rt, OPJIT_EINVAL, "opjit_load_file: NULL argument");
    pthread_mutex_lock(&rt->loader->lock);
    int rc = load_file_locked(rt->loader, path, op, info);
    pthread_mutex_unlock(&rt->loader->lock);
    return rc;
}

/* Call fn for each source of op `name` on the search path (name.c, name.cu
 * in each directory, in order); stops when fn returns non-zero. */
static int loader_each_source(opjit_runtime *rt, const char *name,
                              int (*fn)(void *ud, const char *path), void *ud)
{
    loader *l = rt->loader;
    const char *p = l->ops_path;
    while (*p) {
        const char *e = strchr(p, ':');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (n) {
            char path[PATH_MAX];
            static const char *const suffixes[] = {".c", ".cu"};
            for (int i = 0; i < 2; i++) {
                /* A truncated path is another file (".cu" cut to ".c"). */
                if ((size_t)snprintf(path, sizeof path, "%.*s/%s%s", (int)n, p, name,
                                     suffixes[i]) < sizeof path &&
                    access(path, R_OK) == 0) {
                    int rc = fn(ud, path);
                    if (rc)
                        return rc;
                }
            }
        }
        p += n + (e ? 1 : 0);
    }
    return 0;
}

int opjit_wait(opjit_runtime *rt)
{
    if (!rt)
        return OPJIT_EINVAL;
    char msg[1024];
    int rc = tier_wait(rt->loader, msg, sizeof msg);
    return rc ? rt_error(rt, rc, "an optimizing compile failed: %s", msg) : OPJIT_OK;
}

/* Forget the source at real: the next load of it compiles or hits the
 * cache again instead of being a no-op. */
static void forget_loaded(loader *l, const char *real)
{
    for (loaded **pe = &l->loaded; *pe; pe = &(*pe)->next)
        if (!strcmp((*pe)->path, real)) {
            loaded *e = *pe;
            *pe = e->next;
            free(e->path);
            free(e->op_name);
            free(e);
            return;
        }
}

int opjit_unload(opjit_runtime *rt, const char *spec)
{
    if (!rt || !spec || !*spec)
        return rt_error(rt, OPJIT_EINVAL, "opjit_unload: NULL or empty spec");
    loader *l = rt->loader;
    char reals[OPJIT_DEVICE_COUNT][PATH_MAX];
    int nreal = 0;
    if (loader_is_path_spec(spec)) {
        if (!realpath(spec, reals[0]))
            return rt_error(rt, OPJIT_ENOTFOUND, "%s: %s", spec, strerror(errno));
        nreal = 1;
    } else {
        opjit_op *op;
        if (opjit_find_op(rt, spec, &op))
            return rt_error(rt, OPJIT_ENOTFOUND, "no op named '%s' is loaded", spec);
        for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
            const kernel *k = atomic_load(&op->kernels[d]);
            if (k)
                snprintf(reals[nreal++], PATH_MAX, "%s", k->mod->real);
        }
    }
    pthread_mutex_lock(&l->lock);
    int n = 0;
    for (int i = 0; i < nreal; i++) {
        n += module_unpublish(rt, reals[i]);
        forget_loaded(l, reals[i]);
    }
    pthread_mutex_unlock(&l->lock);
    if (!n)
        return rt_error(rt, OPJIT_ENOTFOUND, "%s: nothing loaded from it", spec);
    rt_log(rt, OPJIT_LOG_INFO, "unloaded %s (%d kernel%s)", spec, n, n == 1 ? "" : "s");
    return OPJIT_OK;
}

typedef struct by_name {
    opjit_runtime *rt;
    int found, loaded, usable;
    char first_dir_found[PATH_MAX];
    int rc;
    opjit_op *op; /* of the first source loaded */
} by_name;

static int load_one(void *ud, const char *path)
{
    by_name *bn = ud;
    bn->found++;
    /* The first directory that has the op wins; later ones are shadowed. */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    if (!bn->first_dir_found[0])
        snprintf(bn->first_dir_found, sizeof bn->first_dir_found, "%s", dir);
    else if (strcmp(dir, bn->first_dir_found))
        return 0;
    int cu = has_suffix(path, ".cu");
    char why[1024];
    if (cu && cu_usable(why, sizeof why)) {
        /* No driver or no device: CUDA code could not run here. */
        rt_log(bn->rt, OPJIT_LOG_INFO, "%s: skipped: %s", path, why);
        return 0;
    }
    bn->usable++;
    opjit_op *op = NULL;
    int rc = load_file_locked(bn->rt->loader, path, &op, NULL);
    if (!rc && !bn->op)
        bn->op = op;
    if (rc && cu && rc == OPJIT_EDEVICE && bn->loaded) {
        /* No NVRTC (and nothing warmed): the CPU kernels serve. */
        rt_log(bn->rt, OPJIT_LOG_WARN, "%s", opjit_errmsg(bn->rt));
        return 0;
    }
    if (rc) {
        bn->rc = rc;
        return 1;
    }
    bn->loaded++;
    return 0;
}

int opjit_load_op(opjit_runtime *rt, const char *spec, opjit_op **op)
{
    if (op)
        *op = NULL;
    if (!rt || !spec || !*spec)
        return rt_error(rt, OPJIT_EINVAL, "opjit_load_op: NULL or empty spec");
    if (loader_is_path_spec(spec))
        return opjit_load_file(rt, spec, op, NULL);
    pthread_mutex_lock(&rt->loader->lock);
    by_name bn = {.rt = rt};
    loader_each_source(rt, spec, load_one, &bn);
    pthread_mutex_unlock(&rt->loader->lock);
    if (bn.rc)
        return bn.rc;
    if (!bn.found)
        return rt_error(rt, OPJIT_ENOTFOUND, "no source for op '%s' on the search path (%s)",
                        spec, rt->loader->ops_path);
    if (!bn.usable)
        return rt_error(rt, OPJIT_EDEVICE, "op '%s': no source usable on this machine in %s",
                        spec, bn.first_dir_found);
    if (op)
        *op = bn.op;
    return OPJIT_OK;
}
