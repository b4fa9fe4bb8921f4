/* runtime/decl.c - what a module declares beside its kernels: gradients
 * (a backward op and which inputs it differentiates, or "not
 * differentiable") and shape rules, and what a shape rule says
 * (opjit_output_shape); hosts read the declarations (opjit_op_decls_get).
 * Running shape rules and backward ops for hosts is runtime/decl_query.c.
 *
 * Declarations are staged on the kernel the module registered last under
 * that name and published with it, so a reload replaces them with the
 * code; what hosts read is the op's copy, which lives as long as the op
 * (replaced code is unloaded once no call runs in it). The
 * backward op is resolved when the module is published: it must be a
 * kernel of the same module, and each of its arguments is matched by name
 * to a forward argument, output or incoming gradient (the table hosts and
 * the Python front read to call it). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

/* ---- declaring (the module's init) ------------------------------------------ */

static int decl_error(module *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static int decl_error(module *m, const char *fmt, ...)
{
    if (!m->status) {
        va_list ap;
        va_start(ap, fmt);
        int n = snprintf(m->err, sizeof m->err, "%s: ", m->source);
        vsnprintf(m->err + n, sizeof m->err - (size_t)n, fmt, ap);
        va_end(ap);
        m->status = OPJIT_EMODULE;
    }
    return m->status;
}

static kernel *module_kernel(module *m, const char *name)
{
    for (kernel *k = m->kernels; k; k = k->next_in_module)
        if (!strcmp(k->sch->name, name))
            return k;
    return NULL;
}

/* The declarations of op (what), made when first needed. NULL with the
 * module's error set when op was not defined before. */
static kernel_decls *decls_of(module *m, const char *op, const char *what)
{
    kernel *k = op ? module_kernel(m, op) : NULL;
    if (!k) {
        decl_error(m, "%s(%s): no op of that name was defined before it in this module "
                   "(declare after its opjit_def)", what, op ? op : "NULL");
        return NULL;
    }
    if (!k->decls && !(k->decls = calloc(1, sizeof *k->decls))) {
        decl_error(m, "out of memory");
        return NULL;
    }
    return k->decls;
}

void decl_free(kernel_decls *d)
{
    if (d) {
        free(d->backward);
        free(d->inputs_text);
        free(d);
    }
}

static int set_gradient(module *m, const char *op, const char *what, int kind)
{
    kernel_decls *d = decls_of(m, op, what);
    if (!d)
        return m->status;
    if (d->pub.gradient != OPJIT_GRAD_UNDECLARED)
        return decl_error(m, "%s(%s): %s already declares %s", what, op, op,
                          d->pub.gradient == OPJIT_GRAD_NONE ? "itself not differentiable"
                                                             : "a derivative");
    d->pub.gradient = kind;
    return OPJIT_OK;
}

int decl_derivative(opjit_module *om, const char *op, const char *backward, const char *inputs)
{
    module *m = (module *)om;
    if (!m)
        return OPJIT_EINVAL;
    if (!backward || !*backward || !inputs)
        return decl_error(m, "opjit_derivative(%s): the backward op and the inputs are required",
                          op ? op : "NULL");
    int rc = set_gradient(m, op, "opjit_derivative", OPJIT_GRAD_DECLARED);
    if (rc)
        return rc;
    kernel_decls *d = module_kernel(m, op)->decls;
    d->backward = strdup(backward);
    d->inputs_text = strdup(inputs);
    if (!d->backward || !d->inputs_text)
        return decl_error(m, "out of memory");
    return OPJIT_OK;
}

int decl_not_differentiable(opjit_module *om, const char *op)
{
    module *m = (module *)om;
    return m ? set_gradient(m, op, "opjit_not_differentiable", OPJIT_GRAD_NONE) : OPJIT_EINVAL;
}

int decl_shape(opjit_module *om, const char *op, opjit_shape_fn fn)
{
    module *m = (module *)om;
    if (!m)
        return OPJIT_EINVAL;
    kernel_decls *d = decls_of(m, op, "opjit_shape");
    if (!d)
        return m->status;
    if (!fn)
        return decl_error(m, "opjit_shape(%s): NULL shape rule", op);
    if (d->shape)
        return decl_error(m, "opjit_shape(%s): declared twice", op);
    d->shape = fn;
    d->pub.shape_rule = 1;
    return OPJIT_OK;
}

/* ---- resolving a derivative when the module is published --------------------- */

/* The differentiable inputs of k ("input, weight, bias") into d->inputs. */
static int parse_inputs(module *m, const kernel *k, kernel_decls *d)
{
    char buf[1024], *save = NULL;
    int n = 0;
    snprintf(buf, sizeof buf, "%s", d->inputs_text);
    for (char *w = strtok_r(buf, ", \t", &save); w; w = strtok_r(NULL, ", \t", &save)) {
        int i = schema_arg_index(k->sch, w);
        if (i < 0 || k->sch->args[i].kind != OPJIT_KIND_TENSOR)
            return decl_error(m, "opjit_derivative(%s): '%s' is not a Tensor argument of %s",
                              k->sch->name, w, k->sch->text);
        for (int j = 0; j < n; j++)
            if (d->inputs[j] == i)
                return decl_error(m, "opjit_derivative(%s): '%s' is listed twice", k->sch->name,
                                  w);
        d->inputs[n++] = i;
    }
    if (n == 0)
        return decl_error(m, "opjit_derivative(%s): no input listed (an op no input of which "
                          "is differentiable says opjit_not_differentiable)", k->sch->name);
    d->pub.ninputs = n;
    return OPJIT_OK;
}

/* Forward output j's name as a backward sees it: its schema name, or
 * "result" for the only output. */
static int output_named(const schema *f, const char *name)
{
    for (int j = 0; j < f->nouts; j++)
        if (f->out_names[j] && !strcmp(f->out_names[j], name))
            return j;
    return f->nouts == 1 && !strcmp(name, "result") ? 0 : -1;
}

/* Whether an argument of the backward may take the forward's argument fa. */
static int same_type(const schema_arg *fa, const schema_arg *ba)
{
    return fa->kind == ba->kind && fa->list_len == ba->list_len && (!fa->optional || ba->optional);
}

/* Where backward argument ba of forward f gets its value, into *ga. */
static int match_arg(module *m, const kernel *f, const kernel *b, const schema_arg *ba,
                     int ninputs, opjit_grad_arg *ga)
{
    const schema *fs = f->sch;
    int j = -1;
    if (!strcmp(ba->name, "grad") && fs->nouts == 1)
        j = 0;
    else if (!strncmp(ba->name, "grad_", 5))
        j = output_named(fs, ba->name + 5);
    if (j >= 0) {
        if (ba->kind != OPJIT_KIND_TENSOR)
            return decl_error(m, "%s: argument '%s' takes a gradient: it must be a Tensor",
                              b->sch->name, ba->name);
        *ga = (opjit_grad_arg){OPJIT_GRAD_FROM_GRAD, j};
    } else if ((j = schema_arg_index(fs, ba->name)) >= 0) {
        if (!same_type(&fs->args[j], ba))
            return decl_error(m, "%s: argument '%s' is %s but %s's is %s", b->sch->name,
                              ba->name, ba->type, fs->name, fs->args[j].type);
        *ga = (opjit_grad_arg){OPJIT_GRAD_FROM_INPUT, j};
    } else if (!strcmp(ba->name, "output_mask")) {
        if (ba->kind != OPJIT_KIND_INTS || ba->list_len != ninputs)
            return decl_error(m, "%s: output_mask must be int[%d] (one per differentiable "
                              "input of %s), not %s", b->sch->name, ninputs, fs->name, ba->type);
        *ga = (opjit_grad_arg){OPJIT_GRAD_FROM_MASK, 0};
    } else if ((j = output_named(fs, ba->name)) >= 0) {
        if (ba->kind != OPJIT_KIND_TENSOR)
            return decl_error(m, "%s: argument '%s' takes an output of %s: it must be a Tensor",
                              b->sch->name, ba->name, fs->name);
        *ga = (opjit_grad_arg){OPJIT_GRAD_FROM_OUTPUT, j};
    } else if (ba->has_default || ba->optional) {
        *ga = (opjit_grad_arg){OPJIT_GRAD_FROM_DEFAULT, 0};
    } else {
        return decl_error(m, "%s: argument '%s' is not grad%s, an argument or output of %s, "
                          "nor output_mask, and has no default: nothing can fill it",
                          b->sch->name, ba->name, fs->nouts == 1 ? "" : "_<output>", fs->name);
    }
    return OPJIT_OK;
}

/* f's backward op, from the same module, matched argument by argument. */
static int resolve_one(module *m, const kernel *f, kernel_decls *d)
{
    int rc = parse_inputs(m, f, d);
    if (rc)
        return rc;
    const kernel *b = module_kernel(m, d->backward);
    if (!b)
        return decl_error(m, "opjit_derivative(%s): its backward op %s is not defined in this "
                          "module (define it with opjit_def beside %s)",
                          f->sch->name, d->backward, f->sch->name);
    if (b->sch->nouts != d->pub.ninputs)
        return decl_error(m, "opjit_derivative(%s): %s returns %d tensors, but %d inputs are "
                          "differentiable (%s): one gradient each", f->sch->name, b->sch->name,
                          b->sch->nouts, d->pub.ninputs, d->inputs_text);
    int grads = 0;
    for (int i = 0; i < b->sch->nargs; i++) {
        if ((rc = match_arg(m, f, b, &b->sch->args[i], d->pub.ninputs, &d->bargs[i])))
            return rc;
        grads += d->bargs[i].from == OPJIT_GRAD_FROM_GRAD;
    }
    if (!grads)
        return decl_error(m, "opjit_derivative(%s): %s takes no incoming gradient (an "
                          "argument named grad%s)", f->sch->name, b->sch->name,
                          f->sch->nouts == 1 ? "" : "_<output name>");
    d->pub.backward = d->backward;
    d->pub.inputs = d->inputs;
    d->pub.nbackward_args = b->sch->nargs;
    d->pub.backward_args = d->bargs;
    return OPJIT_OK;
}

int decl_resolve(opjit_runtime *rt, module *m)
{
    for (kernel *k = m->kernels; k && !m->status; k = k->next_in_module)
        if (k->decls && k->decls->pub.gradient == OPJIT_GRAD_DECLARED)
            resolve_one(m, k, k->decls);
    return m->status ? rt_error(rt, m->status, "%s", m->err) : OPJIT_OK;
}

/* "derivative conv2d_backward(input,weight,bias)", "none" or "" */
static void gradient_text(const kernel *k, char *buf, size_t n)
{
    const kernel_decls *d = k->decls;
    buf[0] = '\0';
    if (!d || d->pub.gradient == OPJIT_GRAD_UNDECLARED)
        return;
    if (d->pub.gradient == OPJIT_GRAD_NONE) {
        snprintf(buf, n, "not differentiable");
        return;
    }
    size_t used = (size_t)snprintf(buf, n, "derivative %s for", d->backward);
    for (int i = 0; i < d->pub.ninputs && used < n; i++)
        used += (size_t)snprintf(buf + used, n - used, " %s", k->sch->args[d->inputs[i]].name);
}

int decl_agree(const kernel *k, const kernel *other)
{
    char a[512], b[512];
    gradient_text(k, a, sizeof a);
    gradient_text(other, b, sizeof b);
    return !a[0] || !b[0] || !strcmp(a, b);
}

/* ---- what hosts ask ------------------------------------------------------------ */

static int same_decls(const opjit_op_decls *a, const opjit_op_decls *b)
{
    if (a->gradient != b->gradient || a->shape_rule != b->shape_rule ||
        a->ninputs != b->ninputs || a->nbackward_args != b->nbackward_args ||
        !a->backward != !b->backward || (a->backward && strcmp(a->backward, b->backward)))
        return 0;
    for (int i = 0; i < a->ninputs; i++)
        if (a->inputs[i] != b->inputs[i])
            return 0;
    for (int i = 0; i < a->nbackward_args; i++)
        if (a->backward_args[i].from != b->backward_args[i].from ||
            a->backward_args[i].index != b->backward_args[i].index)
            return 0;
    return 1;
}

const opjit_op_decls *decl_op_copy_locked(opjit_op *op, const kernel_decls *d)
{
    for (op_decls *o = op->decls; o; o = o->next)
        if (same_decls(&o->pub, &d->pub))
            return &o->pub;
    op_decls *o = calloc(1, sizeof *o);
    if (!o || (d->pub.backward && !(o->backward = strdup(d->pub.backward)))) {
        free(o);
        return NULL;
    }
    o->pub = d->pub;
    memcpy(o->inputs, d->inputs, sizeof o->inputs);
    memcpy(o->bargs, d->bargs, sizeof o->bargs);
    o->pub.backward = o->backward;
    o->pub.inputs = o->inputs;
    o->pub.backward_args = o->bargs;
    o->next = op->decls;
    op->decls = o;
    return &o->pub;
}

void decl_op_free(opjit_op *op)
{
    for (op_decls *o = op->decls, *next; o; o = next) {
        next = o->next;
        free(o->backward);
        free(o);
    }
    op->decls = NULL;
}

int opjit_op_decls_get(opjit_runtime *rt, const opjit_op *op, const opjit_op_decls **decls)
{
    static const opjit_op_decls none = {OPJIT_GRAD_UNDECLARED, NULL, 0, NULL, 0, NULL, 0};
    if (decls)
        *decls = NULL;
    if (!rt || !op || !decls)
        return rt_error(rt, OPJIT_EINVAL, "opjit_op_decls_get: NULL argument");
    /* What speaks for op: the CPU kernel's, else the first device's that
     * declares anything. The op's copy: it outlives the kernel. */
    *decls = &none;
    reclaim_enter();
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
        const kernel *k = atomic_load(&op->kernels[d]);
        if (k && k->op_decls) {
            *decls = k->op_decls;
            break;
        }
    }
    reclaim_exit();
    return OPJIT_OK;
}

/* ---- shape rules ----------------------------------------------------------------- */

/* A mistake of op code in a shape rule: the call's error (op-prefixed). */
#define RULE_ERROR(ctx, ...) call_error((ctx), OPJIT_EKERNEL, __VA_ARGS__)

int decl_output_shape(opjit_ctx *ctx, int index, DLDataType dtype, int ndim,
                      const int64_t *shape)
{
    struct shape_run *r = ctx ? ctx->shapes : NULL;
    if (!r)
        return ctx ? RULE_ERROR(ctx, "opjit_output_shape: only a shape rule may call it")
                   : OPJIT_EINVAL;
    if (index < 0 || index >= r->nouts)
        return RULE_ERROR(ctx, "opjit_output_shape: output %d out of range (the schema has %d)",
                          index, r->nouts);
    if (ndim < 0 || ndim > OPJIT_MAX_DIMS || (ndim && !shape) || dtype.bits == 0 ||
        dtype.bits % 8 || dtype.lanes != 1)
        return RULE_ERROR(ctx, "opjit_output_shape: bad dtype or rank for output %d", index);
    opjit_out_shape *o = &r->outs[index];
    memset(o, 0, sizeof *o);
    o->dtype = dtype;
    o->ndim = ndim;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0)
            return RULE_ERROR(ctx, "opjit_output_shape: bad size %lld in dim %d of output %d",
                              (long long)shape[d], d, index);
        o->shape[d] = shape[d];
    }
    r->set |= 1u << index;
    return OPJIT_OK;
}

int decl_output_dynamic(opjit_ctx *ctx, int index, int dim)
{
    struct shape_run *r = ctx ? ctx->shapes : NULL;
    if (!r)
        return ctx ? RULE_ERROR(ctx, "opjit_output_dynamic: only a shape rule may call it")
                   : OPJIT_EINVAL;
    if (index < 0 || index >= r->nouts || !(r->set & (1u << index)) || dim < 0 ||
        dim >= r->outs[index].ndim)
        return RULE_ERROR(ctx, "opjit_output_dynamic: output %d has no dimension %d (say its "
                          "shape first with opjit_output_shape)", index, dim);
    r->outs[index].dynamic |= 1u << dim;
    return OPJIT_OK;
}
