/* loader/inline.c - op modules whose source text the host hands over in
 * memory (opjit_load_inline), the way torch.utils.cpp_extension.load_inline
 * and CuPy's RawModule(code=...) take a string.
 *
 * An inline source is a source like any other once made: its name ("scale2.c")
 * and bytes and its local headers go into the same digest a file of that
 * name in that directory would get, so an identical string hits the cache in
 * a later process (and a file with the same text and headers hits the same
 * entry). What differs is where its headers may come from: only from the
 * directory the host names, resolved inside it, or nowhere. A source read
 * from a file includes headers from anywhere its text points; a string has
 * no directory of its own, and its "x.h" would otherwise be looked up in the
 * process's current directory (libtcc looks there first for the text it
 * compiles), which no key records.
 *
 * Its identity in the runtime is "<inline>/NAME": loading the same name again
 * replaces the module (a changed text) or does nothing (the same text), as
 * loading a file again does; that string is no path, so the watcher and
 * unloading by path never find a file behind it. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "loader/loader_int.h"

#define INLINE_PREFIX "<inline>/"

/* "scale2.c", "scale2.cu": a file name without a directory, of an op
 * source, made of characters a module name and a #line directive take. */
static int check_name(opjit_runtime *rt, const char *name)
{
    if (!name || !*name)
        return rt_error(rt, OPJIT_EINVAL, "opjit_load_inline: NULL or empty name");
    size_t n = strlen(name);
    if (n > NAME_MAX)
        return rt_error(rt, OPJIT_EINVAL, "opjit_load_inline: the name is longer than %d bytes",
                        NAME_MAX);
    if (strchr(name, '/'))
        return rt_error(rt, OPJIT_EINVAL, "opjit_load_inline: '%s': a name, not a path (no "
                        "'/')", name);
    for (const char *p = name; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '_' || *p == '-' || *p == '.'))
            return rt_error(rt, OPJIT_EINVAL, "opjit_load_inline: '%s': a name holds letters, "
                            "digits, '_', '-' and '.' only", name);
    if (!loader_source_stem(name))
        return rt_error(rt, OPJIT_EINVAL, "opjit_load_inline: '%s': expected NAME.c (C, for "
                        "libtcc) or NAME.cu (CUDA: NVRTC and libtcc)", name);
    return OPJIT_OK;
}

/* The source for name and text, its headers under include_dir (or none). */
static int inline_source(loader *l, const char *name, const char *text, const char *include_dir,
                         source *s)
{
    opjit_runtime *rt = l->rt;
    memset(s, 0, sizeof *s);
    s->path = name;
    s->device = loader_is_cuda_source(name) ? OPJIT_CUDA : OPJIT_CPU;
    snprintf(s->real, sizeof s->real, INLINE_PREFIX "%s", name);
    if (include_dir) {
        struct stat st;
        if (!*include_dir)
            return rt_error(rt, OPJIT_EINVAL, "%s: the include directory is \"\"", name);
        if (!realpath(include_dir, s->dir))
            return rt_error(rt, errno == ENOENT ? OPJIT_ENOTFOUND : OPJIT_EIO,
                            "%s: include directory %s: %s", name, include_dir, strerror(errno));
        if (stat(s->dir, &st) != 0 || !S_ISDIR(st.st_mode))
            return rt_error(rt, OPJIT_EINVAL, "%s: include directory %s: not a directory", name,
                            include_dir);
    }
    s->confine = (source_confine){.dir = s->dir, .name = name};
    s->len = strlen(text);
    if (!(s->text = malloc(s->len + 1)))
        return rt_error(rt, OPJIT_ENOMEM, "out of memory");
    memcpy(s->text, text, s->len + 1);
    return source_finish(l, s);
}

int opjit_load_inline(opjit_runtime *rt, const char *name, const char *text,
                      const char *include_dir, opjit_op **op, opjit_load_info *info)
{
    if (op)
        *op = NULL;
    if (!rt)
        return OPJIT_EINVAL;
    int rc = check_name(rt, name);
    if (rc)
        return rc;
    if (!text || !*text)
        return rt_error(rt, OPJIT_EINVAL, "opjit_load_inline: %s: NULL or empty source text",
                        name);
    if (info && (rc = abi_out_check_rt(rt, "opjit_load_inline", info, ABI_MIN_LOAD_INFO,
                                       "opjit_load_info")))
        return rc;
    double t0 = loader_now_ms();
    source s;
    if ((rc = inline_source(rt->loader, name, text, include_dir, &s)))
        return rc;
    opjit_load_info mine = {.size = sizeof mine};
    pthread_mutex_lock(&rt->loader->lock);
    rc = loader_load_read_locked(rt->loader, &s, t0, op, info ? &mine : NULL);
    pthread_mutex_unlock(&rt->loader->lock);
    source_free(&s);
    if (info)
        abi_out(info, &mine, sizeof mine);
    return rc;
}

/* The module that holds op's kernel for its first device with one. */
static const module *module_of(const opjit_op *op)
{
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
        const kernel *k = atomic_load(&op->kernels[d]);
        if (k)
            return k->mod;
    }
    return NULL;
}

/* Whether a kernel of o comes from the source at real. */
static int from_source(const opjit_op *o, const char *real)
{
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
        const kernel *k = atomic_load(&o->kernels[d]);
        if (k && !strcmp(k->mod->real, real))
            return 1;
    }
    return 0;
}

int opjit_module_ops(opjit_runtime *rt, const opjit_op *op,
                     int (*fn)(void *ud, const opjit_op *op), void *ud)
{
    if (!rt || !op || !fn)
        return rt_error(rt, OPJIT_EINVAL, "opjit_module_ops: NULL argument");
    /* As opjit_list: ops are never removed, so no lock is needed; the
     * modules read stay loaded until reclaim_exit (a reload meanwhile
     * unloads the ones it replaced after). */
    reclaim_enter();
    const module *m = module_of(op);
    for (opjit_op *o = atomic_load_explicit(&rt->ops, memory_order_acquire); m && o;
         o = atomic_load_explicit(&o->next, memory_order_acquire))
        if (from_source(o, m->real) && fn(ud, o))
            break;
    reclaim_exit();
    if (!m)
        return rt_error(rt, OPJIT_ENOKERNEL, "%s: the op has no kernel left (unloaded)",
                        op->name);
    return OPJIT_OK;
}
