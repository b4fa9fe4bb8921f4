/* loader/modules.c - a compiled module in the runtime: dlopen it, run its
 * OPJIT_MODULE init, publish its kernels, and remember which source state
 * each loaded source is at (so an unchanged one is not loaded twice). */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/loader_int.h"
#include "runtime/cuda.h"

loaded *loader_find_loaded(loader *l, const char *real)
{
    for (loaded *e = l->loaded; e; e = e->next)
        if (!strcmp(e->path, real))
            return e;
    return NULL;
}

static int remember(loader *l, const source *s, const char *op_name, const char *tier,
                    int below_best)
{
    loaded *e = loader_find_loaded(l, s->real);
    if (!e) {
        e = calloc(1, sizeof *e);
        if (!e || !(e->path = strdup(s->real))) {
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
    e->digest = s->digest;
    snprintf(e->tier, sizeof e->tier, "%s", tier);
    e->below_best = below_best;
    return OPJIT_OK;
}

/* The op to hand back for a module: the one named after the file, else the
 * first it registered. */
static const char *module_op_name(const module *m, const char *stem)
{
    for (const kernel *k = m->kernels; k; k = k->next_in_module)
        if (!strcmp(k->sch->name, stem))
            return k->sch->name;
    return m->kernels->sch->name;
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
    m->links_blas = source_uses_blas(s); /* as every compiler links it */
    int blas_before = m->links_blas && pool_blas_present();
    m->dl = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    if (!m->dl) {
        const char *why = dlerror();
        rc = rt_error(rt, OPJIT_EMODULE, "%s: cannot load the compiled module: %s", s->path,
                      why ? why : "unknown dlopen error");
        goto fail;
    }
    if (m->links_blas) /* before its init, which may call BLAS */
        pool_blas_module(m->dl, !blas_before);
    opjit_module_init_fn init = (opjit_module_init_fn)dlsym(m->dl, OPJIT_MODULE_ENTRY);
    if (!init) {
        rc = rt_error(rt, OPJIT_EMODULE, "%s: no OPJIT_MODULE(...) block: the source must "
                      "define its module init with OPJIT_MODULE(m) { ... }", s->path);
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

/* Load, publish and remember the module in a host artifact. */
int loader_publish_module(loader *l, const source *s, const char *so, const char *tier,
                          int below_best, char *opname, size_t opname_len,
                          struct cuda_module *cm, const char *replaces)
{
    module *m;
    if (s->device == OPJIT_CUDA)
        cu_preload(l, s); /* cuDNN, cuBLAS: for the sources that mention them */
    int rc = load_module(l, s, so, tier, &m);
    if (rc && s->device == OPJIT_CUDA && cu_preload_missing(l, opjit_errmsg(l->rt)))
        rc = load_module(l, s, so, tier, &m); /* links one */
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
    if (replaces && !strcmp(replaces, s->real))
        replaces = NULL;
    if ((rc = module_publish_replacing(l->rt, m, replaces))) {
        module_discard(m);
        return rc;
    }
    if (replaces) /* its kernels left with the publish */
        loader_forget(l, replaces);
    if (remember(l, s, opname, tier, below_best))
        return rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
    return OPJIT_OK;
}

/* Forget the source at real: the next load of it compiles or hits the
 * cache again instead of being a no-op. */
void loader_forget(loader *l, const char *real)
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
