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
    };
    char err[1024];
    int rc = cache_open(&cc, &l->cache, err, sizeof err);
    jit_settings set = {.cuda_archs = l->archs};
    if (!rc && (rc = pipeline_init(&l->pipe, l->cache, &set)))
        cache_close(l->cache);
    if (!rc && (rc = tier_create(l, cfg))) {
        pipeline_fini(&l->pipe);
        cache_close(l->cache);
    }
    l->cfg_offline = cfg->offline;
    l->cfg_no_cache = cfg->no_cache;
    if (!rc && ((cfg->cuda_archs && !(l->cuda_archs = strdup(cfg->cuda_archs))) ||
                (cfg->cache_dir && !(l->cfg_cache_dir = strdup(cfg->cache_dir))) ||
                (cfg->readonly_caches && !(l->cfg_readonly = strdup(cfg->readonly_caches))))) {
        free(l->cuda_archs);
        free(l->cfg_cache_dir);
        tier_destroy(l);
        pipeline_fini(&l->pipe);
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
    pipeline_fini(&l->pipe);
    cache_close(l->cache);
    free(l->ops_path);
    free(l->cuda_archs);
    free(l->cfg_cache_dir);
    free(l->cfg_readonly);
    pthread_mutex_destroy(&l->lock);
    free(l);
}

/* One load in progress: what load_file_locked's steps share. */
typedef struct load_job {
    loader *l;
    const char *path;
    source src;
    unsigned half;         /* JIT_C, or JIT_CU_HOST for a .cu */
    opjit_load_info *info; /* may be NULL */
    double t0, t_key, t_fetch;
    int hit;
    int served;            /* index in jit_compilers of the host code's compiler */
    char opname[OPJIT_NAME_MAX + 1];
} load_job;

/* Fill the timings and the outcome into info. */
static void load_report(load_job *j, const char *tier)
{
    opjit_load_info *info = j->info;
    double now = loader_now_ms();
    if (!info)
        return;
    info->key_ms = j->t_key - j->t0;
    info->cache_hit = j->hit;
    info->compile_ms = j->hit || j->t_fetch <= 0 ? 0 : j->t_fetch - j->t_key;
    info->load_ms = j->t_fetch > 0 ? now - j->t_fetch : 0;
    info->total_ms = now - j->t0;
    snprintf(info->tier, sizeof info->tier, "%s", tier);
}

/* jc's host artifact of the source, published: a background compiler's
 * only when some cache holds it (OPJIT_ENOTFOUND otherwise), any other's
 * from the cache or compiled now. */
static int load_host(load_job *j, const jit_compiler *jc, struct cuda_module *cm,
                     const char *tier)
{
    loader *l = j->l;
    char targets[256], diag[OPJIT_ERRMSG_SIZE - 256];
    jc->targets(&l->pipe.set, targets, sizeof targets);
    pipeline_artifact art = {0};
    int rc = OPJIT_ENOTFOUND;
    char *save = NULL;
    for (char *t = strtok_r(targets, ",", &save); t && rc; t = strtok_r(NULL, ",", &save)) {
        pipeline_get_args a = {&j->src, jc, j->half, t, !jc->background};
        rc = pipeline_get(&l->pipe, &a, &art, diag, sizeof diag);
    }
    if (rc && jc->background)
        return OPJIT_ENOTFOUND;
    if (rc) {
        cuda_module_free(cm);
        if (rc == OPJIT_ECOMPILE)
            return rt_error(l->rt, rc, "%s: compile error:\n%s", j->path, diag);
        return rt_error(l->rt, rc, "%s: %s", j->path, diag);
    }
    j->hit = art.hit;
    j->t_fetch = loader_now_ms();
    if (!art.path) {
        cuda_module_free(cm);
        rc = rt_error(l->rt, OPJIT_ECACHE, "%s: the cache entry has no %s", j->path, art.name);
    } else
        rc = loader_publish_module(l, &j->src, art.path, tier, j->opname, sizeof j->opname, cm);
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
    if (j->src.device == OPJIT_CUDA) /* its device code, per architecture */
        rc = cu_device_code(l, &j->src, &cm, &dev_hit, &dev);
    if (!rc)
        rc = load_best_host(j, cm, dev ? dev->name : NULL);
    if (rc)
        return rc;
    j->hit = j->hit && dev_hit;
    /* Better compilers than the one serving build in the background. */
    for (int i = 0; i < j->served; i++)
        if (jit_compilers[i]->background && (jit_compilers[i]->halves & j->half))
            tier_schedule(l, jit_compilers[i], &j->src);
    const char *tier = dev ? dev->name : jit_compilers[j->served]->name;
    load_report(j, tier);
    rt_log(l->rt, OPJIT_LOG_INFO, "loaded %s (%s, %s, %.2f ms)", j->path, tier,
           j->hit ? "cache hit" : "compiled", loader_now_ms() - j->t0);
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
    j->half = j->src.device == OPJIT_CUDA ? JIT_CU_HOST : JIT_C;
    j->t_key = loader_now_ms();
    loaded *prev = loader_find_loaded(l, j->src.real);
    if (prev && !memcmp(prev->digest.bytes, j->src.digest.bytes, sizeof prev->digest.bytes)) {
        /* Unchanged since it was loaded: nothing to do. */
        snprintf(j->opname, sizeof j->opname, "%s", prev->op_name);
        j->hit = 1;
        load_report(j, prev->tier);
    } else {
        rc = load_source(j);
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
int loader_each_source(opjit_runtime *rt, const char *name,
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
        loader_forget(l, reals[i]);
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
    int via_index; /* found through the index: no file is named after the op */
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
    int cu = loader_is_cuda_source(path);
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

/* Whether a kernel of o comes from a source of module mod (its file stem). */
static int op_from_module(const opjit_op *o, const char *mod, size_t n)
{
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
        const kernel *k = atomic_load(&o->kernels[d]);
        const char *file = k ? strrchr(k->mod->real, '/') + 1 : "";
        if (k && loader_source_stem(file) == n && !strncmp(file, mod, n))
            return 1;
    }
    return 0;
}

/* After the sources were loaded: the op asked for, which for "mod::op"
 * must come from that module. */
static int pick_op(opjit_runtime *rt, const char *spec, const char *sep, opjit_op **op)
{
    const char *name = sep ? sep + 2 : spec;
    opjit_op *o = NULL;
    int rc = opjit_find_op(rt, name, &o);
    if (rc && !sep)
        return rc; /* its message says so */
    if (sep && (rc || !op_from_module(o, spec, (size_t)(sep - spec))))
        return rt_error(rt, OPJIT_ENOTFOUND, "op '%s': module '%.*s' registers no op '%s'",
                        spec, (int)(sep - spec), spec, name);
    if (op)
        *op = o;
    return OPJIT_OK;
}

/* spec: an op ("rmsnorm": a file of that name, else the module that
 * registers it, through the index) or "module::op". */
static int load_by_name(opjit_runtime *rt, const char *spec, const char *sep, by_name *bn)
{
    char mod[NAME_MAX + 1];
    if (sep && (sep == spec || !sep[2] || (size_t)(sep - spec) > NAME_MAX))
        return rt_error(rt, OPJIT_EINVAL, "'%s': expected MODULE::OP", spec);
    snprintf(mod, sizeof mod, "%.*s", (int)(sep ? sep - spec : (ptrdiff_t)strlen(spec)), spec);
    pthread_mutex_lock(&rt->loader->lock);
    loader_each_source(rt, mod, load_one, bn);
    int rc = OPJIT_OK;
    if (!bn->found && !sep) {
        bn->via_index = 1;
        rc = index_each_source(rt->loader, spec, load_one, bn);
    }
    pthread_mutex_unlock(&rt->loader->lock);
    return bn->rc ? bn->rc : rc;
}

int opjit_load_op(opjit_runtime *rt, const char *spec, opjit_op **op)
{
    if (op)
        *op = NULL;
    if (!rt || !spec || !*spec)
        return rt_error(rt, OPJIT_EINVAL, "opjit_load_op: NULL or empty spec");
    if (loader_is_path_spec(spec))
        return opjit_load_file(rt, spec, op, NULL);
    const char *sep = strstr(spec, "::");
    by_name bn = {.rt = rt};
    int rc = load_by_name(rt, spec, sep, &bn);
    if (rc)
        return rc;
    if (!bn.found)
        return rt_error(rt, OPJIT_ENOTFOUND, "no source for %s '%.*s' on the search path (%s)",
                        sep ? "module" : "op", (int)(sep ? sep - spec : (ptrdiff_t)strlen(spec)),
                        spec, rt->loader->ops_path);
    if (!bn.usable)
        return rt_error(rt, OPJIT_EDEVICE, "op '%s': no source usable on this machine in %s",
                        spec, bn.first_dir_found);
    if (sep || bn.via_index)
        return pick_op(rt, spec, sep, op);
    if (op)
        *op = bn.op;
    return OPJIT_OK;
}
