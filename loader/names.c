/* loader/names.c - ops by name: opjit_load_op finds the sources of a name
 * on the search path (a file named after the op, else the module that
 * registers it, through the index; "module::op" names the module), loads
 * them, and hands back the op; opjit_unload takes them out again. */
#include <errno.h>
#include <limits.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "loader/loader_int.h"

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
        reclaim_enter(); /* the modules stay while we read them */
        for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
            const kernel *k = atomic_load(&op->kernels[d]);
            if (k)
                snprintf(reals[nreal++], PATH_MAX, "%s", k->mod->real);
        }
        reclaim_exit();
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
    int rc = loader_load_locked(bn->rt->loader, path, &op, NULL);
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
    int from = 0;
    reclaim_enter(); /* the modules stay while we read them */
    for (int d = 0; d < OPJIT_DEVICE_COUNT && !from; d++) {
        const kernel *k = atomic_load(&o->kernels[d]);
        const char *file = k ? strrchr(k->mod->real, '/') + 1 : "";
        from = k && loader_source_stem(file) == n && !strncmp(file, mod, n);
    }
    reclaim_exit();
    return from;
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
