/* runtime/runtime.c - the runtime's own parts, made and freed; its
 * allocator. opjit_create (loader/create.c) assembles the layers. */
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda.h"
#include "runtime/runtime.h"

/* The default allocator: malloc's 16-byte alignment is what the contract
 * asks of any allocator. */
static void *default_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    (void)ud;
    (void)osize;
    if (nsize == 0) {
        free(ptr);
        return NULL;
    }
    return realloc(ptr, nsize);
}

void *rt_alloc(opjit_runtime *rt, size_t n) { return rt->alloc(rt->alloc_ud, NULL, 0, n); }

void rt_free(opjit_runtime *rt, void *p, size_t n)
{
    if (p)
        rt->alloc(rt->alloc_ud, p, n, 0);
}

void opjit_config_init(opjit_config *cfg)
{
    if (!cfg)
        return;
    memset(cfg, 0, sizeof *cfg);
    cfg->offline = -1;
    cfg->tiering = -1;
    cfg->verbosity = OPJIT_LOG_WARN;
}

int runtime_new(const opjit_config *cfg, opjit_runtime **out)
{
    *out = NULL;
    opjit_runtime *rt = calloc(1, sizeof *rt);
    if (!rt)
        return OPJIT_ENOMEM;
    if (pthread_mutex_init(&rt->lock, NULL)) {
        free(rt);
        return OPJIT_ENOMEM;
    }
    rt->alloc = cfg->alloc ? cfg->alloc : default_alloc;
    rt->alloc_ud = cfg->alloc ? cfg->alloc_ud : NULL;
    rt->log = cfg->log;
    rt->log_ud = cfg->log_ud;
    rt->verbosity = cfg->verbosity;
    if (!(rt->cuda = cuda_rt_new())) { /* bookkeeping only: no CUDA work yet */
        pthread_mutex_destroy(&rt->lock);
        free(rt);
        return OPJIT_ENOMEM;
    }
    *out = rt;
    return OPJIT_OK;
}

void runtime_free(opjit_runtime *rt)
{
    for (opjit_op *op = atomic_load(&rt->ops), *next; op; op = next) {
        next = atomic_load(&op->next);
        free(op->name);
        free(op);
    }
    for (module *m = rt->modules, *next; m; m = next) {
        next = m->next;
        module_discard(m);
    }
    workspace_free_all(rt);
    cuda_rt_free(rt->cuda); /* after the modules: they unload in its contexts */
    pthread_mutex_destroy(&rt->lock);
    rt_clear_error(NULL);
    free(rt);
}
