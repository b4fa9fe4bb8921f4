/* runtime/lifetime.c - the runtime's own parts, made and freed: the top
 * of runtime/ (it calls every file below it, none calls it).
 * opjit_create (loader/create.c) assembles the layers. */
#include <stdlib.h>
#include <string.h>

#include "runtime/abi.h"
#include "runtime/cuda.h"
#include "runtime/runtime.h"

/* The defaults, into a struct of this library's size. */
static void config_defaults(opjit_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->size = sizeof *cfg;
    cfg->offline = -1;
    cfg->tiering = -1;
    cfg->watch = -1;
    cfg->verbosity = OPJIT_LOG_WARN;
}

/* Only the host's size is written: a host built against an older header
 * has a smaller struct (see opjit.h, "Structs that grow"). */
int opjit_config_init(opjit_config *cfg, size_t size)
{
    if (!cfg || size < ABI_MIN_CONFIG)
        return OPJIT_EINVAL;
    opjit_config d;
    config_defaults(&d);
    memset(cfg, 0, size);
    cfg->size = size;
    abi_out(cfg, &d, sizeof d);
    return OPJIT_OK;
}

int config_from_host(const opjit_config *host, opjit_config *cfg, char *err, size_t errlen)
{
    config_defaults(cfg);
    if (!host)
        return OPJIT_OK;
    return abi_in(cfg, sizeof *cfg, host, ABI_MIN_CONFIG, "opjit_config", err, errlen);
}

/* Undo a partly built runtime. */
static int create_failed(opjit_runtime *rt, int status)
{
    if (rt->cuda)
        cuda_rt_free(rt->cuda);
    pool_free(rt->pool);
    out_cache_close(rt->out_cache);
    pthread_mutex_destroy(&rt->lock);
    settings_free(&rt->set);
    free(rt);
    return status;
}

int runtime_new(const settings *set, opjit_runtime **out)
{
    *out = NULL;
    opjit_runtime *rt = calloc(1, sizeof *rt);
    if (!rt)
        return OPJIT_ENOMEM;
    if (settings_copy(&rt->set, set)) {
        free(rt);
        return OPJIT_ENOMEM;
    }
    if (pthread_mutex_init(&rt->lock, NULL)) {
        settings_free(&rt->set);
        free(rt);
        return OPJIT_ENOMEM;
    }
    const settings *cfg = &rt->set;
    rt->log = cfg->log;
    rt->log_ud = cfg->log_ud;
    rt->verbosity = cfg->verbosity;
    /* The default allocator: malloc (its 16-byte alignment is what the
     * contract asks) with a cache of large blocks (runtime/alloc.c). */
    if (!cfg->alloc && !(rt->out_cache = out_cache_new(rt)))
        return create_failed(rt, OPJIT_ENOMEM);
    rt->alloc = cfg->alloc ? cfg->alloc : out_cache_alloc;
    rt->alloc_ud = cfg->alloc ? cfg->alloc_ud : rt->out_cache;
    int rc = pool_new(cfg, &rt->pool); /* no thread starts here */
    if (rc)
        return create_failed(rt, rc);
    if (!(rt->cuda = cuda_rt_new())) /* bookkeeping only: no CUDA work yet */
        return create_failed(rt, OPJIT_ENOMEM);
    *out = rt;
    return OPJIT_OK;
}

int opjit_num_threads_get(const opjit_runtime *rt, int *num_threads)
{
    if (!rt || !num_threads)
        return OPJIT_EINVAL;
    *num_threads = pool_threads(rt->pool);
    return OPJIT_OK;
}

static void ops_free(opjit_runtime *rt)
{
    for (opjit_op *op = atomic_load(&rt->ops), *next; op; op = next) {
        next = atomic_load(&op->next);
        for (op_schema *s = op->schemas, *sn; s; s = sn) {
            sn = s->next;
            schema_free(&s->s);
            free(s);
        }
        decl_op_free(op);
        free(op->name);
        free(op);
    }
}

/* Every module, published or retired: no call is running (opjit_destroy's
 * contract). */
static void modules_free(opjit_runtime *rt)
{
    module *lists[2] = {rt->modules, rt->retired};
    for (int i = 0; i < 2; i++)
        for (module *m = lists[i], *next; m; m = next) {
            next = m->next;
            module_discard(m);
        }
    for (size_t i = 0; i < rt->strings.cap; i++)
        free(rt->strings.v[i]);
    free(rt->strings.v);
}

void runtime_free(opjit_runtime *rt)
{
    ops_free(rt);
    modules_free(rt);
    pool_free(rt->pool); /* no call is running: the workers are idle */
    workspace_free_all(rt);
    cuda_rt_free(rt->cuda); /* after the modules: they unload in its contexts */
    if (rt->out_cache && rt_logs(rt, OPJIT_LOG_DEBUG)) {
        size_t held;
        unsigned long hits, misses;
        out_cache_stats(rt->out_cache, &held, &hits, &misses);
        rt_log(rt, OPJIT_LOG_DEBUG, "output cache: %lu hits, %lu misses, %zu bytes freed",
               hits, misses, held);
    }
    out_cache_close(rt->out_cache); /* outputs still alive free themselves later */
    pthread_mutex_destroy(&rt->lock);
    rt_clear_error(NULL);
    settings_free(&rt->set);
    free(rt);
}
