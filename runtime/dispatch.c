/* runtime/dispatch.c - registration (the api a module's init calls) and the
 * dispatch table: (op name, device) -> kernel.
 *
 * A module's registrations are staged on the module while its init runs and
 * published together afterwards, so a module whose init fails registers
 * nothing. Publishing swaps each op's per-device kernel pointer atomically;
 * replaced kernels stay alive until the runtime is destroyed, so calls in
 * flight finish on the code they started with. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda.h"
#include "runtime/runtime.h"

module *module_new(opjit_runtime *rt, const char *source, const char *real, const char *tier,
                   int device)
{
    module *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->rt = rt;
    m->source = strdup(source);
    m->real = strdup(real);
    m->tier = strdup(tier);
    m->device = device;
    if (!m->source || !m->real || !m->tier) {
        module_discard(m);
        return NULL;
    }
    return m;
}

static void kernel_free(kernel *k)
{
    decl_free(k->decls);
    schema_free(&k->sch);
    free(k->doc);
    free(k);
}

void module_discard(module *m)
{
    if (!m)
        return;
    for (kernel *k = m->kernels, *next; k; k = next) {
        next = k->next_in_module;
        kernel_free(k);
    }
    cuda_module_free(m->cuda);
    if (m->dl)
        dlclose(m->dl);
    free(m->source);
    free(m->real);
    free(m->tier);
    free(m);
}


/* Named groups of dtypes a spec may use, as AT_DISPATCH's type lists. */
static const struct {
    const char *name, *members;
} dtype_groups[] = {
    {"floating", "float32 float64 float16 bfloat16"},
    {"half", "float16 bfloat16"},
};

/* Add dtype d, or every dtype of the group d, to c; -1 for an unknown
 * name or too many. */
static int add_dtypes(arg_check *c, const char *d)
{
    for (size_t g = 0; g < sizeof dtype_groups / sizeof *dtype_groups; g++)
        if (!strcmp(d, dtype_groups[g].name)) {
            char list[64], *save = NULL;
            snprintf(list, sizeof list, "%s", dtype_groups[g].members);
            for (char *t = strtok_r(list, " ", &save); t; t = strtok_r(NULL, " ", &save))
                if (add_dtypes(c, t) != 0)
                    return -1;
            return 0;
        }
    if (c->ndtypes == OPJIT_MAX_DTYPES || !dtype_parse(d, &c->dtypes[c->ndtypes]))
        return -1;
    c->ndtypes++;
    return 0;
}

/* Record the module's first error; later ones are usually consequences. */
static int module_error(module *m, int status, const char *fmt, ...)
{
    if (!m->status) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(m->err, sizeof m->err, fmt, ap);
        va_end(ap);
        m->status = status;
    }
    return status;
}

int dispatch_def(opjit_module *om, const char *text, int device, opjit_kernel_fn fn,
                   const char *doc)
{
    module *m = (module *)om;
    if (!m)
        return OPJIT_EINVAL;
    if (device < 0 || device >= OPJIT_DEVICE_COUNT)
        return module_error(m, OPJIT_EMODULE, "%s: opjit_def: unknown device %d", m->source,
                            device);
    if (device != m->device)
        return module_error(m, OPJIT_EMODULE,
                            "%s: opjit_def: a %s source can only register %s kernels (got %s)",
                            m->source, m->device == OPJIT_CUDA ? ".cu" : ".c",
                            opjit_device_name(m->device), opjit_device_name(device));
    if (!fn)
        return module_error(m, OPJIT_EMODULE, "%s: opjit_def: NULL kernel for '%s'", m->source,
                            text ? text : "(null)");
    kernel *k = calloc(1, sizeof *k);
    if (!k)
        return module_error(m, OPJIT_ENOMEM, "out of memory");
    char err[512];
    int rc = schema_parse(text, &k->sch, err, sizeof err);
    if (rc) {
        free(k);
        return module_error(m, rc, "%s: %s", m->source, err);
    }
    for (kernel *o = m->kernels; o; o = o->next_in_module)
        if (!strcmp(o->sch.name, k->sch.name) && o->device == device) {
            module_error(m, OPJIT_EEXIST, "%s: %s is registered twice for %s", m->source,
                         k->sch.name, opjit_device_name(device));
            kernel_free(k);
            return OPJIT_EEXIST;
        }
    k->fn = fn;
    k->device = device;
    k->mod = m;
    k->doc = strdup(doc ? doc : "");
    /* Keep registration order: list in order, remember the last. */
    if (m->last)
        m->last->next_in_module = k;
    else
        m->kernels = k;
    m->last = k;
    return OPJIT_OK;
}

int dispatch_require(opjit_module *om, const char *arg, const char *spec)
{
    module *m = (module *)om;
    if (!m)
        return OPJIT_EINVAL;
    kernel *k = m->last;
    if (!k)
        return module_error(m, OPJIT_EMODULE, "%s: opjit_require before any opjit_def",
                            m->source);
    int i = arg ? schema_arg_index(&k->sch, arg) : -1;
    if (i < 0 || k->sch.args[i].kind != OPJIT_KIND_TENSOR)
        return module_error(m, OPJIT_EMODULE, "%s: opjit_require: %s has no Tensor argument '%s'",
                            m->source, k->sch.name, arg ? arg : "(null)");
    arg_check *c = NULL;
    for (int j = 0; j < k->nchecks; j++)
        if (k->checks[j].arg == i)
            c = &k->checks[j];
    if (!c) {
        c = &k->checks[k->nchecks++];
        memset(c, 0, sizeof *c);
        c->arg = i;
        c->rank = -1;
    }
    char buf[256];
    snprintf(buf, sizeof buf, "%s", spec ? spec : "");
    char *save = NULL;
    for (char *w = strtok_r(buf, " \t", &save); w; w = strtok_r(NULL, " \t", &save)) {
        char *end;
        if (!strcmp(w, "contiguous")) {
            c->contiguous = 1;
        } else if (!strncmp(w, "rank=", 5)) {
            long r = strtol(w + 5, &end, 10);
            if (*end || end == w + 5 || r < 0 || r > 32)
                return module_error(m, OPJIT_EMODULE, "%s: opjit_require(%s): bad rank '%s'",
                                    m->source, arg, w);
            c->rank = (int)r;
        } else {
            char *save2 = NULL;
            c->ndtypes = 0;
            for (char *d = strtok_r(w, "|", &save2); d; d = strtok_r(NULL, "|", &save2)) {
                if (add_dtypes(c, d) != 0)
                    return module_error(m, OPJIT_EMODULE,
                                        "%s: opjit_require(%s): unknown word or dtype '%s' "
                                        "(expected dtypes like float32|float64, a group "
                                        "(floating, half), rank=N, contiguous)",
                                        m->source, arg, d);
            }
        }
    }
    return OPJIT_OK;
}

static opjit_op *find_op_locked(opjit_runtime *rt, const char *name)
{
    for (opjit_op *op = rt->ops; op; op = atomic_load(&op->next))
        if (!strcmp(op->name, name))
            return op;
    return NULL;
}

/* Whether every kernel of op comes from the source at real. */
static int only_from(const opjit_op *op, const char *real)
{
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
        const kernel *k = atomic_load(&op->kernels[d]);
        if (k && strcmp(k->mod->real, real))
            return 0;
    }
    return 1;
}

static int module_defines(const module *m, const char *name, int device)
{
    for (const kernel *k = m->kernels; k; k = k->next_in_module)
        if (k->device == device && !strcmp(k->sch.name, name))
            return 1;
    return 0;
}

/* A reload (m from a source already loaded): the ops the source's earlier
 * module registered and m does not (removed or renamed) are gone, so a
 * module's ops are exactly what its latest init registered. Their old code
 * stays mapped, as for an unload. Called with rt->lock held. */
static void retire_dropped(opjit_runtime *rt, const module *m)
{
    for (opjit_op *op = rt->ops; op; op = atomic_load(&op->next)) {
        const kernel *k = atomic_load(&op->kernels[m->device]);
        if (k && k->mod != m && !strcmp(k->mod->real, m->real) &&
            !module_defines(m, op->name, m->device))
            atomic_store_explicit(&op->kernels[m->device], NULL, memory_order_release);
    }
}

/* Whether every kernel of m may be published: its schema agrees with
 * the op's other sources, and no other module holds its op and device.
 * rt->lock held. */
static int publish_check_locked(opjit_runtime *rt, const module *m)
{
    for (const kernel *k = m->kernels; k; k = k->next_in_module) {
        opjit_op *op = find_op_locked(rt, k->sch.name);
        if (!op)
            continue;
        const schema *cur = atomic_load(&op->sch);
        /* A new schema is fine when this source is the op's only one
         * (an edit and reload); otherwise all sources must agree. */
        if (strcmp(cur->canonical, k->sch.canonical) && !only_from(op, m->real)) {
            const kernel *other = NULL;
            for (int d = 0; d < OPJIT_DEVICE_COUNT && !other; d++) {
                other = atomic_load(&op->kernels[d]);
                if (other && !strcmp(other->mod->real, m->real))
                    other = NULL;
            }
            return rt_error(rt, OPJIT_ESCHEMA,
                            "%s declares %s as '%s' but %s declares it as '%s'; the "
                            "schemas of one op must agree",
                            m->source, k->sch.name, k->sch.text,
                            other ? other->mod->source : "an earlier module", cur->text);
        }
        for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
            const kernel *o = atomic_load(&op->kernels[d]);
            if (o && d != k->device && strcmp(o->mod->real, m->real) && !decl_agree(k, o))
                return rt_error(rt, OPJIT_ESCHEMA,
                                "%s declares the gradient of %s otherwise than %s does; the "
                                "declarations of one op must agree",
                                m->source, k->sch.name, o->mod->source);
        }
        const kernel *held = atomic_load(&op->kernels[k->device]);
        if (held && strcmp(held->mod->real, m->real))
            return rt_error(rt, OPJIT_EEXIST,
                            "%s: %s already has a %s kernel from %s; a second module may "
                            "not register the same op and device",
                            m->source, k->sch.name, opjit_device_name(k->device),
                            held->mod->source);
    }
    return OPJIT_OK;
}

/* k becomes its op's kernel for its device (the op is made when it is
 * new). rt->lock held. */
static int publish_kernel_locked(opjit_runtime *rt, kernel *k)
{
    opjit_op *op = find_op_locked(rt, k->sch.name);
    if (op) {
        atomic_store_explicit(&op->kernels[k->device], k, memory_order_release);
        atomic_store_explicit(&op->sch, &k->sch, memory_order_release);
        return OPJIT_OK;
    }
    op = calloc(1, sizeof *op);
    if (!op || !(op->name = strdup(k->sch.name))) {
        free(op);
        return rt_error(rt, OPJIT_ENOMEM, "out of memory");
    }
    atomic_init(&op->sch, &k->sch);
    atomic_store_explicit(&op->kernels[k->device], k, memory_order_release);
    /* Fully built before it becomes reachable. */
    if (rt->ops_tail)
        atomic_store_explicit(&rt->ops_tail->next, op, memory_order_release);
    else
        atomic_store_explicit(&rt->ops, op, memory_order_release);
    rt->ops_tail = op;
    return OPJIT_OK;
}

int module_publish(opjit_runtime *rt, module *m)
{
    int rc = decl_resolve(rt, m); /* the module's own: no lock needed */
    if (rc)
        return rc;
    pthread_mutex_lock(&rt->lock);
    /* Check everything first: publish all or nothing. */
    rc = publish_check_locked(rt, m);
    for (kernel *k = m->kernels; k && rc == OPJIT_OK; k = k->next_in_module)
        rc = publish_kernel_locked(rt, k);
    if (rc == OPJIT_OK) {
        retire_dropped(rt, m);
        m->next = rt->modules;
        rt->modules = m;
    }
    pthread_mutex_unlock(&rt->lock);
    if (rc == OPJIT_OK)
        pool_blas_module(m->dl);
    return rc;
}

int module_unpublish(opjit_runtime *rt, const char *real)
{
    int n = 0;
    pthread_mutex_lock(&rt->lock);
    for (opjit_op *op = rt->ops; op; op = atomic_load(&op->next))
        for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
            const kernel *k = atomic_load(&op->kernels[d]);
            if (k && !strcmp(k->mod->real, real)) {
                /* The module stays mapped until opjit_destroy: calls that
                 * already picked this kernel finish on it. */
                atomic_store_explicit(&op->kernels[d], NULL, memory_order_release);
                n++;
            }
        }
    pthread_mutex_unlock(&rt->lock);
    return n;
}

/* An op whose every source was unloaded stays in the list (readers walk it
 * without a lock) but is no longer found or listed. */
static int op_has_kernels(const opjit_op *op)
{
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++)
        if (atomic_load(&op->kernels[d]))
            return 1;
    return 0;
}

int opjit_find_op(opjit_runtime *rt, const char *name, opjit_op **out)
{
    if (out)
        *out = NULL;
    if (!rt || !name || !out)
        return rt_error(rt, OPJIT_EINVAL, "opjit_find_op: NULL argument");
    pthread_mutex_lock(&rt->lock);
    opjit_op *op = find_op_locked(rt, name);
    pthread_mutex_unlock(&rt->lock);
    if (!op || !op_has_kernels(op))
        return rt_error(rt, OPJIT_ENOTFOUND, "no op named '%s' is loaded", name);
    *out = op;
    return OPJIT_OK;
}

int opjit_list(opjit_runtime *rt, int (*fn)(void *ud, const opjit_op *op), void *ud)
{
    if (!rt || !fn)
        return rt_error(rt, OPJIT_EINVAL, "opjit_list: NULL argument");
    /* Ops are never removed and are published with release stores, so
     * walking without the lock is safe. */
    for (opjit_op *op = atomic_load_explicit(&rt->ops, memory_order_acquire); op;
         op = atomic_load_explicit(&op->next, memory_order_acquire))
        if (op_has_kernels(op) && fn(ud, op))
            break;
    return OPJIT_OK;
}

int opjit_op_info_get(opjit_runtime *rt, const opjit_op *op, opjit_op_info *info)
{
    if (!rt || !op || !info)
        return rt_error(rt, OPJIT_EINVAL, "opjit_op_info_get: NULL argument");
    memset(info, 0, sizeof *info);
    info->name = op->name;
    const schema *sch = atomic_load(&op->sch);
    info->schema = sch->text;
    info->nargs = sch->nargs;
    info->nouts = sch->nouts;
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
        const kernel *k = atomic_load(&op->kernels[d]);
        if (k) {
            info->source[d] = k->mod->source;
            info->doc[d] = k->doc;
            info->tier[d] = k->mod->tier;
        }
    }
    return OPJIT_OK;
}

int opjit_op_arg(opjit_runtime *rt, const opjit_op *op, int i, opjit_arg_info *info)
{
    if (!rt || !op || !info)
        return rt_error(rt, OPJIT_EINVAL, "opjit_op_arg: NULL argument");
    const schema *sch = atomic_load(&op->sch);
    if (i < 0 || i >= sch->nargs)
        return rt_error(rt, OPJIT_EINVAL, "%s has no argument %d", op->name, i);
    const schema_arg *a = &sch->args[i];
    info->name = a->name;
    info->type = a->type;
    info->kind = a->kind;
    info->optional = a->optional;
    info->list_len = a->list_len;
    info->has_default = a->has_default;
    info->default_text = a->default_text;
    return OPJIT_OK;
}

int opjit_op_arg_index(const opjit_op *op, const char *name)
{
    return op && name ? schema_arg_index(atomic_load(&op->sch), name) : -1;
}

