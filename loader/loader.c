/* loader/loader.c - from a name or a path to registered kernels: the
 * loader's life, the search path, and one load: the host code's compiler
 * chosen from the table (the best whose artifact is cached, else the first
 * that compiles while the load waits), a .cu's device code, the module
 * published, the background compiles queued.
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
    struct stat st;
    if (!slash)
        return NULL;
    *slash = '\0';
    /* Mostly absent (a build tree, a host of its own): one stat says so. */
    if ((size_t)snprintf(dir, sizeof dir, "%s/%s/opjit/ops", self, rel) >= sizeof dir ||
        stat(dir, &st) != 0 || !realpath(dir, real) || strchr(real, ':'))
        return NULL;
    if (realpath(OPJIT_INSTALLED_OPS_DIR, conf) && strcmp(real, conf) == 0)
        return NULL;
    return strdup(real);
}

/* Defined (weak) by a host of libopjit.a built with OPJIT_STATIC_OPS_DIR
 * (opjit.h): where the ops of the installed tree it was built against are. */
extern const char opjit_static_ops_dir[] __attribute__((weak));

/* The installed ops a host of libopjit.a was built against, when that
 * directory exists and is not found otherwise; else "". */
static const char *static_host_ops_dir(const char *moved)
{
    const char *dir = opjit_static_ops_dir;
    char real[PATH_MAX];
    if (!dir || !*dir || strchr(dir, ':') || !realpath(dir, real) ||
        (moved && !strcmp(real, moved)))
        return "";
    return dir;
}

/* Where this copy of the library finds its shipped and installed ops:
 * it does not move while the process runs, so it is looked up once. */
static char *shipped_moved;
static const char *shipped_host, *shipped_installed;
static pthread_once_t shipped_once = PTHREAD_ONCE_INIT;

static void shipped_find(void)
{
    shipped_moved = relocated_ops_dir();
    shipped_host = static_host_ops_dir(shipped_moved);
    shipped_installed = access(OPJIT_INSTALLED_OPS_DIR, X_OK) == 0 ? OPJIT_INSTALLED_OPS_DIR : "";
}

/* The non-empty parts joined by ':', malloc'd; NULL when out of memory. */
static char *path_join(const char *const *part, size_t nparts)
{
    size_t n = 1;
    for (size_t i = 0; i < nparts; i++)
        n += part[i] ? strlen(part[i]) + 1 : 0;
    char *path = malloc(n);
    if (path) {
        size_t k = 0;
        path[0] = '\0';
        for (size_t i = 0; i < nparts; i++)
            if (part[i] && *part[i])
                k += (size_t)snprintf(path + k, n - k, "%s%s", k ? ":" : "", part[i]);
    }
    return path;
}

/* The search path: config, $OPJIT_OPS_PATH (both as they were when the
 * runtime was made), the ops shipped with this copy of the library (next
 * to it, or as a static host was told), the installed ones (where they
 * exist). Made at its first use: a load by path never needs it, so a
 * host that loads files does not look for the shipped ops. "" when out
 * of memory. */
const char *loader_ops_path(loader *l)
{
    pthread_mutex_lock(&l->ops_lock);
    if (!l->ops_path) {
        pthread_once(&shipped_once, shipped_find);
        const char *part[] = {l->ops_head, shipped_moved, shipped_host, shipped_installed};
        l->ops_path = path_join(part, sizeof part / sizeof *part);
    }
    const char *p = l->ops_path ? l->ops_path : "";
    pthread_mutex_unlock(&l->ops_lock);
    return p;
}

/* *dst = a copy of src (NULL stays NULL); non-zero when out of memory. */
static int dup_setting(char **dst, const char *src)
{
    *dst = src ? strdup(src) : NULL;
    return src && !*dst;
}

/* What the loader keeps of cfg: what its caches, and the caches of the
 * runtimes and helpers it makes, are opened with. */
static int keep_settings(loader *l, const opjit_config *cfg)
{
    l->cfg_offline = cfg->offline;
    l->cfg_no_cache = cfg->no_cache;
    l->cfg_remote_connect_ms = cfg->remote_connect_timeout_ms;
    l->cfg_remote_timeout_ms = cfg->remote_timeout_ms;
    l->cfg_remote_push = cfg->remote_push;
    int oom = dup_setting(&l->cuda_archs, cfg->cuda_archs);
    oom |= dup_setting(&l->cfg_cache_dir, cfg->cache_dir);
    oom |= dup_setting(&l->cfg_readonly, cfg->readonly_caches);
    oom |= dup_setting(&l->cfg_remote, cfg->remote_cache);
    oom |= dup_setting(&l->cfg_remote_key, cfg->remote_key_file);
    const char *head[] = {cfg->ops_path, getenv("OPJIT_OPS_PATH")};
    oom |= !(l->ops_head = path_join(head, 2));
    return oom ? OPJIT_ENOMEM : OPJIT_OK;
}

void loader_cache_config(const loader *l, cache_config *cc)
{
    *cc = (cache_config){
        .dir = l->cfg_cache_dir,
        .readonly = l->cfg_readonly,
        .offline = l->cfg_offline,
        .disabled = l->cfg_no_cache,
        .remote_url = l->cfg_remote,
        .remote_key_file = l->cfg_remote_key,
        .remote_connect_timeout_ms = l->cfg_remote_connect_ms,
        .remote_timeout_ms = l->cfg_remote_timeout_ms,
        .remote_push = l->cfg_remote_push,
    };
}

static void loader_destroy_parts(loader *l, int parts);

int loader_create(opjit_runtime *rt, const opjit_config *cfg, struct loader **out)
{
    loader *l = calloc(1, sizeof *l);
    if (!l)
        return OPJIT_ENOMEM;
    l->rt = rt;
    l->discover_cancel_fd = -1;
    pthread_mutex_init(&l->lock, NULL);
    pthread_mutex_init(&l->ops_lock, NULL);
    int rc = keep_settings(l, cfg), parts = 0;
    cache_config cc;
    loader_cache_config(l, &cc);
    cc.log = cache_log;
    cc.log_ud = rt;
    char err[1024];
    jit_settings set = {.cuda_archs = l->archs};
    if (!rc && !(rc = cache_open(&cc, &l->cache, err, sizeof err)))
        parts = 1;
    if (!rc && !(rc = pipeline_init(&l->pipe, l->cache, &set)))
        parts = 2;
    if (!rc && !(rc = tier_create(l, cfg)))
        parts = 3;
    if (rc) {
        loader_destroy_parts(l, parts);
        return rc;
    }
    *out = l;
    return OPJIT_OK;
}

/* Take down the first `parts` parts made (cache, pipeline, tier) and the
 * loader. */
static void loader_destroy_parts(loader *l, int parts)
{
    if (parts >= 3)
        tier_destroy(l); /* first: its worker uses everything below */
    for (loaded *e = l->loaded, *next; e; e = next) {
        next = e->next;
        free(e->path);
        free(e->op_name);
        free(e);
    }
    if (parts >= 2)
        pipeline_fini(&l->pipe);
    if (parts >= 1)
        cache_close(l->cache);
    free(l->ops_path);
    free(l->ops_head);
    pthread_mutex_destroy(&l->ops_lock);
    free(l->cuda_archs);
    free(l->cfg_cache_dir);
    free(l->cfg_readonly);
    free(l->cfg_remote);
    free(l->cfg_remote_key);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

void loader_destroy(struct loader *l)
{
    if (l)
        loader_destroy_parts(l, 3);
}

/* One load in progress: what load_file_locked's steps share. */
typedef struct load_job {
    loader *l;
    const char *path;
    source *src;           /* the caller's */
    unsigned half;         /* JIT_C, or JIT_CU_HOST for a .cu */
    opjit_load_info *info; /* may be NULL */
    const char *replaces;  /* the loaded source this one takes over, or NULL */
    double t0, t_key, t_fetch;
    double waited_ms; /* for other processes' builds of its artifacts */
    int hit; /* a CACHE_* origin: built, local or remote hit */
    int served;            /* index in jit_compilers of the host code's compiler */
    char opname[OPJIT_NAME_MAX + 1];
} load_job;

/* Fill the timings and the outcome into info. */
static void load_report(load_job *j, const char *tier)
{
    static const char *const origins[] = {"compiled", "local", "remote"};
    opjit_load_info *info = j->info;
    double now = loader_now_ms();
    if (!info)
        return;
    info->key_ms = j->t_key - j->t0;
    info->cache_hit = j->hit != CACHE_BUILT;
    snprintf(info->origin, sizeof info->origin, "%s", origins[j->hit]);
    info->compile_ms = j->hit || j->t_fetch <= 0 ? 0 : j->t_fetch - j->t_key - j->waited_ms;
    info->compile_ms = info->compile_ms > 0 ? info->compile_ms : 0;
    info->load_ms = j->t_fetch > 0 ? now - j->t_fetch : 0;
    info->total_ms = now - j->t0;
    info->wait_ms = j->waited_ms;
    snprintf(info->tier, sizeof info->tier, "%s", tier);
}

/* jc's host artifact of the source, published: a background compiler's
 * only when some cache holds it (OPJIT_ENOTFOUND otherwise), any other's
 * from the cache or compiled now. */
static int load_host(load_job *j, const jit_compiler *jc, struct cuda_module *cm,
                     const char *tier)
{
    loader *l = j->l;
    /* On the heap: 16 KiB of stack would push the dlopen and the module's
     * init below it onto pages a fresh process has not touched. */
    enum { DIAG = OPJIT_ERRMSG_SIZE - 256 };
    char *diag = malloc(DIAG);
    if (!diag) {
        cuda_module_free(cm);
        return rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
    }
    diag[0] = '\0';
    pipeline_artifact art = {0};
    int rc = pipeline_get_host(&l->pipe, j->src, jc, j->half, !jc->background, &art, diag, DIAG);
    if (rc) {
        if (!jc->background) {
            cuda_module_free(cm);
            rc = rt_error(l->rt, rc, rc == OPJIT_ECOMPILE ? "%s: compile error:\n%s" : "%s: %s",
                          j->path, diag);
        }
        free(diag);
        return jc->background ? OPJIT_ENOTFOUND : rc;
    }
    free(diag);
    j->hit = art.hit;
    j->waited_ms += cache_entry_waited_ms(art.entry);
    j->t_fetch = loader_now_ms();
    if (!art.path) {
        cuda_module_free(cm);
        rc = rt_error(l->rt, OPJIT_ECACHE, "%s: the cache entry has no %s", j->path, art.name);
    } else
        rc = loader_publish_module(l, j->src, art.path, tier, j->opname, sizeof j->opname, cm,
                                   j->replaces);
    cache_entry_release(art.entry);
    if (rc && jc->background)
        rt_log(l->rt, OPJIT_LOG_WARN, "%s: the %s artifact did not load (%s); compiling anew",
               j->path, jc->name, opjit_errmsg(l->rt));
    return rc;
}

/* The host code's compiler: the first of the table whose artifact is
 * cached, else the first that compiles while the load waits. */
static int load_best_host(load_job *j, struct cuda_module *cm, const char *device_tier)
{
    int rc = OPJIT_ENOTFOUND;
    for (int i = 0; jit_compilers[i] && rc; i++) {
        const jit_compiler *jc = jit_compilers[i];
        if (!(jc->halves & j->half) || (jc->background && !tier_wanted(j->l)))
            continue; /* background compilers build .c sources only: cm is NULL */
        j->served = i;
        rc = load_host(j, jc, cm, device_tier ? device_tier : jc->name);
        if (rc && !jc->background)
            return rc; /* cm is freed */
    }
    return rc;
}

/* The libtcc artifact from the cache or the compiler, a .cu's device code,
 * then the module published and the background compiles queued. */
static int load_source(load_job *j)
{
    loader *l = j->l;
    struct cuda_module *cm = NULL;
    const jit_compiler *dev = NULL;
    int dev_hit = 1, rc = OPJIT_OK;
    if (j->src->device == OPJIT_CUDA) /* its device code, per architecture */
        rc = cu_device_code(l, j->src, &cm, &dev_hit, &j->waited_ms, &dev);
    if (!rc)
        rc = load_best_host(j, cm, dev ? dev->name : NULL);
    if (rc)
        return rc;
    /* Built if anything was; else remote if anything came from there. */
    j->hit = !j->hit || !dev_hit ? CACHE_BUILT : j->hit > dev_hit ? j->hit : dev_hit;
    /* Better compilers than the one serving build in the background. */
    for (int i = 0; i < j->served; i++)
        if (jit_compilers[i]->background && (jit_compilers[i]->halves & j->half))
            tier_schedule(l, jit_compilers[i], j->src);
    const char *tier = dev ? dev->name : jit_compilers[j->served]->name;
    load_report(j, tier);
    rt_log(l->rt, OPJIT_LOG_INFO, "loaded %s (%s, %s, %.2f ms)", j->path, tier,
           j->hit == CACHE_BUILT ? "compiled" : j->hit == CACHE_HIT_REMOTE ? "remote hit"
                                                                           : "cache hit",
           loader_now_ms() - j->t0);
    return OPJIT_OK;
}

/* Load s (read already); replaces: the path of a source it takes the
 * place of (watch: a renamed or re-pointed file), or NULL. */
static int load_read_locked(loader *l, source *s, const char *replaces, double t0, opjit_op **op,
                            opjit_load_info *info)
{
    load_job job = {.l = l, .path = s->path, .info = info, .replaces = replaces, .t0 = t0,
                    .src = s}, *j = &job;
    if (info) {
        memset(info, 0, sizeof *info);
        snprintf(info->source, sizeof info->source, "%s", s->path);
    }
    int rc = OPJIT_OK;
    j->half = j->src->device == OPJIT_CUDA ? JIT_CU_HOST : JIT_C;
    j->t_key = loader_now_ms();
    loaded *prev = loader_find_loaded(l, j->src->real);
    if (prev && !memcmp(prev->digest.bytes, j->src->digest.bytes, sizeof prev->digest.bytes)) {
        /* Unchanged since it was loaded: nothing to do. */
        snprintf(j->opname, sizeof j->opname, "%s", prev->op_name);
        j->hit = CACHE_HIT_LOCAL;
        load_report(j, prev->tier);
        if (replaces && strcmp(replaces, j->src->real)) { /* the new file serves already */
            module_unpublish(l->rt, replaces);
            loader_forget(l, replaces);
        }
    } else {
        rc = load_source(j);
    }
    if (!rc && op)
        rc = opjit_find_op(l->rt, j->opname, op);
    return rc;
}

int loader_load_read_locked(loader *l, source *s, double t0, opjit_op **op,
                            opjit_load_info *info)
{
    return load_read_locked(l, s, NULL, t0, op, info);
}

static int load_locked(loader *l, const char *path, const char *replaces, opjit_op **op,
                       opjit_load_info *info)
{
    double t0 = loader_now_ms();
    if (info) {
        memset(info, 0, sizeof *info);
        snprintf(info->source, sizeof info->source, "%s", path);
    }
    source src;
    int rc = source_read(l, path, &src);
    if (rc)
        return rc;
    rc = load_read_locked(l, &src, replaces, t0, op, info);
    source_free(&src);
    return rc;
}

int loader_load_locked(loader *l, const char *path, opjit_op **op, opjit_load_info *info)
{
    return load_locked(l, path, NULL, op, info);
}

int loader_load_replacing(loader *l, const char *path, const char *replaces)
{
    return load_locked(l, path, replaces, NULL, NULL);
}


/* One warning for each directory the user put on the search path
 * (cfg.ops_path, $OPJIT_OPS_PATH) that is not one: a typo would otherwise
 * only show as "no source for op" later. */
void loader_warn_missing_dirs(loader *l, const opjit_config *cfg)
{
    const char *from[2] = {cfg->ops_path, getenv("OPJIT_OPS_PATH")};
    const char *what[2] = {"the configured ops path", "OPJIT_OPS_PATH"};
    for (int i = 0; i < 2; i++) {
        char *list = from[i] ? strdup(from[i]) : NULL, *save = NULL;
        for (char *d = list ? strtok_r(list, ":", &save) : NULL; d; d = strtok_r(NULL, ":", &save)) {
            struct stat st;
            if (stat(d, &st) != 0 || !S_ISDIR(st.st_mode))
                rt_log(l->rt, OPJIT_LOG_WARN, "%s names %s, which is %s", what[i], d,
                       stat(d, &st) != 0 ? "not there" : "not a directory");
        }
        free(list);
    }
}

int loader_runtime_new(const opjit_config *cfg, opjit_runtime **out)
{
    opjit_runtime *rt;
    int rc = runtime_new(cfg, &rt);
    if (rc)
        return rc;
    if ((rc = loader_create(rt, cfg, &rt->loader))) {
        runtime_free(rt);
        return rc;
    }
    *out = rt;
    return OPJIT_OK;
}

void loader_runtime_free(opjit_runtime *rt)
{
    if (!rt)
        return;
    loader_destroy(rt->loader); /* first: its tier worker publishes into rt */
    runtime_free(rt);
}

void loader_same_caches(const loader *l, opjit_config *cfg)
{
    opjit_config_init(cfg, sizeof *cfg);
    cfg->cache_dir = l->cfg_cache_dir;
    cfg->readonly_caches = l->cfg_readonly;
    cfg->offline = l->cfg_offline;
    cfg->no_cache = l->cfg_no_cache;
    cfg->cuda_archs = l->cuda_archs;
    cfg->remote_cache = l->cfg_remote;
    cfg->remote_key_file = l->cfg_remote_key;
    cfg->remote_connect_timeout_ms = l->cfg_remote_connect_ms;
    cfg->remote_timeout_ms = l->cfg_remote_timeout_ms;
    cfg->remote_push = l->cfg_remote_push;
}

int opjit_load_file(opjit_runtime *rt, const char *path, opjit_op **op, opjit_load_info *info)
{
    if (op)
        *op = NULL;
    if (!rt || !path)
        return rt_error(rt, OPJIT_EINVAL, "opjit_load_file: NULL argument");
    opjit_load_info mine = {.size = sizeof mine};
    int rc = info ? abi_out_check_rt(rt, "opjit_load_file", info, ABI_MIN_LOAD_INFO,
                                     "opjit_load_info")
                  : OPJIT_OK;
    if (rc)
        return rc;
    pthread_mutex_lock(&rt->loader->lock);
    rc = loader_load_locked(rt->loader, path, op, info ? &mine : NULL);
    pthread_mutex_unlock(&rt->loader->lock);
    if (info)
        abi_out(info, &mine, sizeof mine);
    return rc;
}

/* Call fn for each source of op `name` on the search path (name.c, name.cu
 * in each directory, in order); stops when fn returns non-zero. */
int opjit_wait(opjit_runtime *rt)
{
    if (!rt)
        return OPJIT_EINVAL;
    char msg[1024];
    int rc = tier_wait(rt->loader, msg, sizeof msg);
    return rc ? rt_error(rt, rc, "an optimizing compile failed: %s", msg) : OPJIT_OK;
}
