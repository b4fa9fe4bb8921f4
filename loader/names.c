/* loader/names.c - ops by name: opjit_load_op finds the sources of a name
 * on the search path (in the first directory with a file named after the
 * op or a module that registers it, through the index; "module::op" names
 * the module), loads them, and hands back the op of that name, never
 * another; opjit_unload takes them out again. */
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
    char dir[PATH_MAX];   /* the directory of the sources found */
    char real[PATH_MAX];  /* the first source loaded, for the messages */
    size_t stem;          /* the length of its module name */
    int rc;
} by_name;

static int load_one(void *ud, const char *path)
{
    by_name *bn = ud;
    bn->found++;
    /* Both lookups give the sources of one directory, .c before .cu. */
    if (!bn->dir[0]) {
        snprintf(bn->dir, sizeof bn->dir, "%s", path);
        *strrchr(bn->dir, '/') = '\0';
    }
    int cu = loader_is_cuda_source(path);
    char why[1024];
    if (cu && cu_usable(why, sizeof why)) {
        /* No driver or no device: CUDA code could not run here. */
        rt_log(bn->rt, OPJIT_LOG_INFO, "%s: skipped: %s", path, why);
        return 0;
    }
    bn->usable++;
    int rc = loader_load_locked(bn->rt->loader, path, NULL, NULL);
    if (!rc && !bn->real[0] && realpath(path, bn->real))
        bn->stem = loader_source_stem(strrchr(bn->real, '/') + 1);
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

/* Whether a kernel of o comes from a source of module mod (its file stem)
 * in directory dir. */
static int op_from_module(const opjit_op *o, const char *dir, const char *mod, size_t n)
{
    size_t dl = strlen(dir);
    int from = 0;
    reclaim_enter(); /* the modules stay while we read them */
    for (int d = 0; d < OPJIT_DEVICE_COUNT && !from; d++) {
        const kernel *k = atomic_load(&o->kernels[d]);
        const char *file = k ? strrchr(k->mod->real, '/') + 1 : "";
        from = k && loader_source_stem(file) == n && !strncmp(file, mod, n) &&
               (size_t)(file - 1 - k->mod->real) == dl && !strncmp(k->mod->real, dir, dl);
    }
    reclaim_exit();
    return from;
}

typedef struct defined {
    const char *dir, *mod;
    size_t n;
    char list[512];
} defined;

static int add_defined(void *ud, const opjit_op *o)
{
    defined *d = ud;
    size_t k = strlen(d->list);
    if (op_from_module(o, d->dir, d->mod, d->n) && k + 1 < sizeof d->list)
        snprintf(d->list + k, sizeof d->list - k, "%s%s", k ? ", " : "", o->name);
    return 0;
}

/* After the sources of a module were loaded (real: the first of them):
 * the op called name, which must come from that module; else an error
 * saying what it registers. */
static int pick_op(opjit_runtime *rt, const char *real, size_t stem, const char *name,
                   opjit_op **op)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", real);
    char *file = strrchr(dir, '/');
    *file++ = '\0';
    opjit_op *o = NULL;
    if (opjit_find_op(rt, name, &o) == OPJIT_OK && op_from_module(o, dir, file, stem)) {
        if (op)
            *op = o;
        return OPJIT_OK;
    }
    defined d = {dir, file, stem, ""};
    opjit_list(rt, add_defined, &d);
    return rt_error(rt, OPJIT_ENOTFOUND, "op '%s': module '%.*s' registers no op '%s'; %s "
                    "registers %s", name, (int)stem, file, name, real,
                    d.list[0] ? d.list : "no op");
}

/* spec: an op ("rmsnorm": in the first directory with a file named after
 * it or a module that registers it) or "module::op" (the first directory
 * with that module). */
static int load_by_name(opjit_runtime *rt, const char *spec, const char *sep, by_name *bn)
{
    if (sep && (sep == spec || !sep[2] || (size_t)(sep - spec) > NAME_MAX))
        return rt_error(rt, OPJIT_EINVAL, "'%s': expected MODULE::OP", spec);
    pthread_mutex_lock(&rt->loader->lock);
    int rc = OPJIT_OK;
    if (sep) {
        char mod[NAME_MAX + 1];
        snprintf(mod, sizeof mod, "%.*s", (int)(sep - spec), spec);
        loader_each_source(rt, mod, load_one, bn);
    } else {
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
                        spec, loader_ops_path(rt->loader));
    if (!bn.usable)
        return rt_error(rt, OPJIT_EDEVICE, "op '%s': no source usable on this machine in %s",
                        spec, bn.dir);
    if (!bn.real[0])
        return rt_error(rt, OPJIT_EIO, "op '%s': loaded from %s, then not found there", spec,
                        bn.dir);
    /* The module loaded: the one named (module::op), or the one of the
     * directory that decided. */
    return pick_op(rt, bn.real, bn.stem, sep ? sep + 2 : spec, op);
}
