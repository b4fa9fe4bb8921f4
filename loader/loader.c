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
#include <stddef.h>
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

static void cache_log(void *ud, int level, const char *msg)
{
    rt_log(ud, level, "%s", msg);
}

static void loader_destroy_parts(loader *l, int parts);

int loader_create(opjit_runtime *rt, struct loader **out)
{
    loader *l = malloc(sizeof *l);
    if (!l)
        return OPJIT_ENOMEM;
    memset(l, 0, offsetof(loader, pipe)); /* the pipeline: pipeline_init */
    l->rt = rt;
    l->discover_cancel_fd = -1;
    pthread_mutex_init(&l->lock, NULL);
    pthread_mutex_init(&l->ops_lock, NULL);
    int rc = ops_path_init(l), parts = 0;
    cache_config cc;
    pipeline_cache_config(&rt->set, &cc);
    cc.log = rt->log ? cache_log : NULL; /* so a hit formats no message */
    cc.log_ud = rt;
    cc.log_level = rt->verbosity;
    char err[1024];
    jit_settings set = {.cuda_archs = l->archs, .tmpdir = rt->set.tmpdir,
                        .cc_name = rt->set.cc, .path = rt->set.path};
    if (!rc && !(rc = cache_open(&cc, &l->cache, err, sizeof err)))
        parts = 1;
    if (!rc && !(rc = pipeline_init(&l->pipe, l->cache, &set)))
        parts = 2;
    if (!rc && !(rc = tier_create(l)))
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
    int below_best;        /* that code is for a lower CPU level than this one's best */
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
    j->below_best = !art.best;
    j->waited_ms += cache_entry_waited_ms(art.entry);
    j->t_fetch = loader_now_ms();
    if (!art.path) {
        cuda_module_free(cm);
        rc = rt_error(l->rt, OPJIT_ECACHE, "%s: the cache entry has no %s", j->path, art.name);
    } else
        rc = loader_publish_module(l, j->src, art.path, tier, j->below_best, j->opname,
                                   sizeof j->opname, cm, j->replaces);
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
        if (!(jc->halves & j->half) || (jc->background && !j->l->rt->set.tiering))
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
    /* Better compilers than the one serving build in the background; so
     * does the serving one when a cache held its code for a lower CPU
     * level only (warmed on an older machine, or under OPJIT_CPU_LEVEL):
     * that code serves until this machine's best is built. */
    for (int i = 0; l->rt->set.tiering && i < j->served; i++)
        if (jit_compilers[i]->background && (jit_compilers[i]->halves & j->half))
            tier_schedule(l, jit_compilers[i], j->src);
    if (j->below_best && jit_compilers[j->served]->background)
        tier_schedule(l, jit_compilers[j->served], j->src);
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
void loader_warn_missing_dirs(loader *l)
{
    const char *from[2] = {l->rt->set.ops_path_cfg, l->rt->set.ops_path_env};
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

int loader_runtime_new(const settings *set, opjit_runtime **out)
{
    opjit_runtime *rt;
    int rc = runtime_new(set, &rt);
    if (rc)
        return rc;
    if ((rc = loader_create(rt, &rt->loader))) {
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

int loader_child_settings(const loader *l, settings *set)
{
    if (settings_copy(set, &l->rt->set))
        return OPJIT_ENOMEM;
    set->log = NULL;
    set->alloc = NULL;
    set->pool = NULL;
    set->watch = 0;
    set->watch_fn = NULL;
    return OPJIT_OK;
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

/* Until the background compiles queued so far have ended: the first that
 * failed since the last wait, or OPJIT_OK. */
int opjit_wait(opjit_runtime *rt)
{
    if (!rt)
        return OPJIT_EINVAL;
    char msg[1024];
    int rc = tier_wait(rt->loader, msg, sizeof msg);
    return rc ? rt_error(rt, rc, "an optimizing compile failed: %s", msg) : OPJIT_OK;
}
