/* runtime/dispatch.c - registration (the api a module's init calls) and the
 * dispatch table: (op name, device) -> kernel.
 *
 * A module's registrations are staged on the module while its init runs and
 * published together afterwards, so a module whose init fails registers
 * nothing. Publishing swaps each op's per-device kernel pointer atomically.
 * A module none of whose kernels is in the table any more (replaced by a
 * reload, unloaded) is retired: unloaded once no call can still be running
 * in it (runtime/reclaim.c), so calls in flight finish on the code they
 * started with. What hosts are handed about ops (schemas, sources, docs,
 * tiers) is the runtime's and the op's own, never the module's, so it
 * outlives the module. */
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/abi.h"
#include "runtime/cuda.h"
#include "runtime/runtime.h"

/* ---- strings kept until the runtime goes ------------------------------------ */

static size_t str_hash(const char *s)
{
    size_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* Where s is, or the empty slot it would take. rt->lock held. */
static char **str_slot(opjit_runtime *rt, const char *s)
{
    size_t mask = rt->strings.cap - 1, i = str_hash(s) & mask;
    while (rt->strings.v[i] && strcmp(rt->strings.v[i], s))
        i = (i + 1) & mask;
    return &rt->strings.v[i];
}

static int strings_grow(opjit_runtime *rt)
{
    size_t cap = rt->strings.cap ? rt->strings.cap * 2 : 64;
    char **old = rt->strings.v, **v = calloc(cap, sizeof *v);
    if (!v)
        return -1;
    size_t oldcap = rt->strings.cap;
    rt->strings.v = v;
    rt->strings.cap = cap;
    for (size_t i = 0; i < oldcap; i++)
        if (old[i])
            *str_slot(rt, old[i]) = old[i];
    free(old);
    return 0;
}

const char *rt_intern(opjit_runtime *rt, const char *s)
{
    pthread_mutex_lock(&rt->lock);
    char **slot = NULL;
    if ((rt->strings.n + 1) * 2 <= rt->strings.cap || strings_grow(rt) == 0)
        slot = str_slot(rt, s);
    if (slot && !*slot && (*slot = strdup(s)))
        rt->strings.n++;
    pthread_mutex_unlock(&rt->lock);
    return slot ? *slot : NULL;
}

/* ---- modules ---------------------------------------------------------------- */

module *module_new(opjit_runtime *rt, const char *source, const char *real, const char *tier,
                   int device)
{
    module *m = calloc(1, sizeof *m);
    if (!m)
        return NULL;
    m->rt = rt;
    m->source = rt_intern(rt, source);
    m->real = strdup(real);
    m->tier = rt_intern(rt, tier);
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
    if (k->own_sch)
        schema_free(&k->own_sch->s);
    free(k->own_sch);
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
    free(m->real);
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
    if (!k || !(k->own_sch = calloc(1, sizeof *k->own_sch))) {
        free(k);
        return module_error(m, OPJIT_ENOMEM, "out of memory");
    }
    char err[512];
    int rc = schema_parse(text, &k->own_sch->s, err, sizeof err);
    if (rc) {
        free(k->own_sch);
        free(k);
        return module_error(m, rc, "%s: %s", m->source, err);
    }
    k->sch = &k->own_sch->s;
    for (kernel *o = m->kernels; o; o = o->next_in_module)
        if (!strcmp(o->sch->name, k->sch->name) && o->device == device) {
            module_error(m, OPJIT_EEXIST, "%s: %s is registered twice for %s", m->source,
                         k->sch->name, opjit_device_name(device));
            kernel_free(k);
            return OPJIT_EEXIST;
        }
    k->fn = fn;
    k->device = device;
    k->mod = m;
    k->doc = rt_intern(m->rt, doc ? doc : "");
    if (!k->doc) {
        kernel_free(k);
        return module_error(m, OPJIT_ENOMEM, "out of memory");
    }
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
    int i = arg ? schema_arg_index(k->sch, arg) : -1;
    if (i < 0 || k->sch->args[i].kind != OPJIT_KIND_TENSOR)
        return module_error(m, OPJIT_EMODULE, "%s: opjit_require: %s has no Tensor argument '%s'",
                            m->source, k->sch->name, arg ? arg : "(null)");
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

/* Whether kernel k comes from the source at real or at also (may be NULL). */
static int from_source(const kernel *k, const char *real, const char *also)
{
    return !strcmp(k->mod->real, real) || (also && !strcmp(k->mod->real, also));
}

/* Whether every kernel of op comes from the source at real (or also). */
static int only_from(const opjit_op *op, const char *real, const char *also)
{
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
        const kernel *k = atomic_load(&op->kernels[d]);
        if (k && !from_source(k, real, also))
            return 0;
    }
    return 1;
}

static int module_defines(const module *m, const char *name, int device)
{
    for (const kernel *k = m->kernels; k; k = k->next_in_module)
        if (k->device == device && !strcmp(k->sch->name, name))
            return 1;
    return 0;
}

/* The modules whose kernels one publish or unpublish took out of the
 * table: those with none left are retired. */
#define CANDIDATES 8
typedef struct candidates {
    module *v[CANDIDATES];
    int n, overflow; /* overflow: look at every published module */
} candidates;

static void candidate_add(candidates *c, const kernel *old)
{
    if (!old)
        return;
    for (int i = 0; i < c->n; i++)
        if (c->v[i] == old->mod)
            return;
    if (c->n < CANDIDATES)
        c->v[c->n++] = old->mod;
    else
        c->overflow = 1;
}

/* op's kernel for device becomes k (NULL: none); the one replaced is a
 * candidate for retirement. Sequentially consistent: see reclaim.c. */
static void kernel_swap(opjit_op *op, int device, kernel *k, candidates *c)
{
    candidate_add(c, atomic_exchange(&op->kernels[device], k));
}

/* A reload (m from a source already loaded, or from the one it replaces):
 * the ops the source's earlier module registered and m does not (removed
 * or renamed) are gone, so a module's ops are exactly what its latest init
 * registered. Called with rt->lock held. */
static void retire_dropped(opjit_runtime *rt, const module *m, const char *replaces,
                           candidates *c)
{
    for (opjit_op *op = rt->ops; op; op = atomic_load(&op->next)) {
        const kernel *k = atomic_load(&op->kernels[m->device]);
        if (k && k->mod != m && from_source(k, m->real, replaces) &&
            !module_defines(m, op->name, m->device))
            kernel_swap(op, m->device, NULL, c);
    }
}

static int module_reachable(const module *m)
{
    for (const kernel *k = m->kernels; k; k = k->next_in_module)
        if (k->op && atomic_load(&k->op->kernels[k->device]) == k)
            return 1;
    return 0;
}

static int is_candidate(const candidates *c, const module *m)
{
    for (int i = 0; i < c->n; i++)
        if (c->v[i] == m)
            return 1;
    return c->overflow;
}

/* The candidates none of whose kernels is in the table any more leave the
 * published modules for the retired ones, stamped with one epoch taken
 * after the table changed. rt->lock held. */
static void retire_unreachable_locked(opjit_runtime *rt, const candidates *c)
{
    uint64_t e = 0;
    for (module **p = &rt->modules; *p && (c->n || c->overflow);) {
        module *m = *p;
        if (!is_candidate(c, m) || module_reachable(m)) {
            p = &m->next;
            continue;
        }
        if (!e)
            e = reclaim_retire();
        *p = m->next;
        m->retired = e;
        m->next = rt->retired;
        rt->retired = m;
    }
}

/* Whether every kernel of m may be published: its schema agrees with
 * the op's other sources, and no other module holds its op and device.
 * rt->lock held. */
static int publish_check_locked(opjit_runtime *rt, const module *m, const char *replaces)
{
    for (const kernel *k = m->kernels; k; k = k->next_in_module) {
        opjit_op *op = find_op_locked(rt, k->sch->name);
        if (!op)
            continue;
        const schema *cur = atomic_load(&op->sch);
        /* A new schema is fine when this source is the op's only one
         * (an edit and reload); otherwise all sources must agree. */
        if (strcmp(cur->canonical, k->sch->canonical) && !only_from(op, m->real, replaces)) {
            const kernel *other = NULL;
            for (int d = 0; d < OPJIT_DEVICE_COUNT && !other; d++) {
                other = atomic_load(&op->kernels[d]);
                if (other && from_source(other, m->real, replaces))
                    other = NULL;
            }
            return rt_error(rt, OPJIT_ESCHEMA,
                            "%s declares %s as '%s' but %s declares it as '%s'; the "
                            "schemas of one op must agree",
                            m->source, k->sch->name, k->sch->text,
                            other ? other->mod->source : "an earlier module", cur->text);
        }
        for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
            const kernel *o = atomic_load(&op->kernels[d]);
            if (o && d != k->device && strcmp(o->mod->real, m->real) && !decl_agree(k, o))
                return rt_error(rt, OPJIT_ESCHEMA,
                                "%s declares the gradient of %s otherwise than %s does; the "
                                "declarations of one op must agree",
                                m->source, k->sch->name, o->mod->source);
        }
        const kernel *held = atomic_load(&op->kernels[k->device]);
        if (held && !from_source(held, m->real, replaces))
            return rt_error(rt, OPJIT_EEXIST,
                            "%s: %s already has a %s kernel from %s; a second module may "
                            "not register the same op and device",
                            m->source, k->sch->name, opjit_device_name(k->device),
                            held->mod->source);
    }
    return OPJIT_OK;
}

/* k's schema becomes the op's copy of its text: the one the op has, else
 * k's own parse, handed over (the op outlives its kernels). rt->lock held. */
static void op_schema_locked(opjit_op *op, kernel *k)
{
    op_schema *o = op->schemas;
    while (o && strcmp(o->s.text, k->sch->text))
        o = o->next;
    if (o) {
        schema_free(&k->own_sch->s);
        free(k->own_sch);
    } else {
        o = k->own_sch;
        o->next = op->schemas;
        op->schemas = o;
    }
    k->own_sch = NULL;
    k->sch = &o->s;
}

/* What publishing k needs, made before anything is published: its op
 * (a new one is appended with no kernel, so nobody finds it yet) and the
 * op's copy of its schema. rt->lock held. */
static int publish_prepare_locked(opjit_runtime *rt, kernel *k)
{
    opjit_op *op = find_op_locked(rt, k->sch->name);
    if (!op) {
        if (!(op = calloc(1, sizeof *op)) || !(op->name = strdup(k->sch->name))) {
            free(op);
            return rt_error(rt, OPJIT_ENOMEM, "out of memory");
        }
        op_schema_locked(op, k);
        atomic_init(&op->sch, k->sch);
        /* Fully built before it becomes reachable. */
        if (rt->ops_tail)
            atomic_store_explicit(&rt->ops_tail->next, op, memory_order_release);
        else
            atomic_store_explicit(&rt->ops, op, memory_order_release);
        rt->ops_tail = op;
    } else {
        op_schema_locked(op, k);
    }
    if (k->decls && !(k->op_decls = decl_op_copy_locked(op, k->decls)))
        return rt_error(rt, OPJIT_ENOMEM, "out of memory");
    k->op = op;
    return OPJIT_OK;
}

int module_publish_replacing(opjit_runtime *rt, module *m, const char *replaces)
{
    candidates c = {.n = 0};
    int rc = decl_resolve(rt, m); /* the module's own: no lock needed */
    if (rc)
        return rc;
    pthread_mutex_lock(&rt->lock);
    /* Check and allocate everything first: publish all or nothing. */
    rc = publish_check_locked(rt, m, replaces);
    for (kernel *k = m->kernels; k && rc == OPJIT_OK; k = k->next_in_module)
        rc = publish_prepare_locked(rt, k);
    if (rc == OPJIT_OK) {
        for (kernel *k = m->kernels; k; k = k->next_in_module) {
            kernel_swap(k->op, k->device, k, &c);
            atomic_store_explicit(&k->op->sch, k->sch, memory_order_release);
        }
        retire_dropped(rt, m, replaces, &c);
        m->next = rt->modules;
        rt->modules = m;
        retire_unreachable_locked(rt, &c);
    }
    pthread_mutex_unlock(&rt->lock);
    if (rc == OPJIT_OK)
        module_reclaim(rt);
    return rc;
}

int module_publish(opjit_runtime *rt, module *m)
{
    return module_publish_replacing(rt, m, NULL);
}

int module_unpublish(opjit_runtime *rt, const char *real)
{
    int n = 0;
    candidates c = {.n = 0};
    pthread_mutex_lock(&rt->lock);
    for (opjit_op *op = rt->ops; op; op = atomic_load(&op->next))
        for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
            const kernel *k = atomic_load(&op->kernels[d]);
            if (k && !strcmp(k->mod->real, real)) {
                kernel_swap(op, d, NULL, &c);
                n++;
            }
        }
    retire_unreachable_locked(rt, &c);
    pthread_mutex_unlock(&rt->lock);
    module_reclaim(rt);
    return n;
}

int module_reclaim(opjit_runtime *rt)
{
    module *done = NULL;
    int left = 0;
    pthread_mutex_lock(&rt->lock);
    uint64_t oldest = rt->retired ? reclaim_oldest() : 0;
    for (module **p = &rt->retired; *p;) {
        module *m = *p;
        if (m->retired < oldest) {
            *p = m->next;
            m->next = done;
            done = m;
        } else {
            p = &m->next;
            left++;
        }
    }
    pthread_mutex_unlock(&rt->lock);
    while (done) { /* unreachable now: unloaded without the lock */
        module *m = done;
        done = m->next;
        module_discard(m);
    }
    return left;
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

int opjit_op_info_get(opjit_runtime *rt, const opjit_op *op, opjit_op_info *host)
{
    if (!rt || !op || !host)
        return rt_error(rt, OPJIT_EINVAL, "opjit_op_info_get: NULL argument");
    int rc = abi_out_check_rt(rt, "opjit_op_info_get", host, ABI_MIN_OP_INFO, "opjit_op_info");
    if (rc)
        return rc;
    opjit_op_info mine = {.size = sizeof mine}, *info = &mine;
    info->name = op->name;
    const schema *sch = atomic_load(&op->sch);
    info->schema = sch->text;
    info->nargs = sch->nargs;
    info->nouts = sch->nouts;
    /* The strings are the runtime's: only reading the kernels needs them
     * not to be unloaded meanwhile. */
    reclaim_enter();
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
        const kernel *k = atomic_load(&op->kernels[d]);
        if (k) {
            info->source[d] = k->mod->source;
            info->doc[d] = k->doc;
            info->tier[d] = k->mod->tier;
        }
    }
    reclaim_exit();
    abi_out(host, &mine, sizeof mine);
    return OPJIT_OK;
}

int opjit_op_arg_get(opjit_runtime *rt, const opjit_op *op, int i, opjit_arg_info *host)
{
    if (!rt || !op || !host)
        return rt_error(rt, OPJIT_EINVAL, "opjit_op_arg_get: NULL argument");
    int rc = abi_out_check_rt(rt, "opjit_op_arg_get", host, ABI_MIN_ARG_INFO, "opjit_arg_info");
    if (rc)
        return rc;
    const schema *sch = atomic_load(&op->sch);
    if (i < 0 || i >= sch->nargs)
        return rt_error(rt, OPJIT_EINVAL, "%s has no argument %d", op->name, i);
    const schema_arg *a = &sch->args[i];
    opjit_arg_info mine = {.size = sizeof mine}, *info = &mine;
    info->name = a->name;
    info->type = a->type;
    info->kind = a->kind;
    info->optional = a->optional;
    info->list_len = a->list_len;
    info->has_default = a->has_default;
    info->default_text = a->default_text;
    abi_out(host, &mine, sizeof mine);
    return OPJIT_OK;
}

int opjit_op_arg_index(const opjit_op *op, const char *name)
{
    return op && name ? schema_arg_index(atomic_load(&op->sch), name) : -1;
}

