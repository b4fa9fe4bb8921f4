/* runtime/decl_query.c - what hosts ask of an op's declarations (decl.c):
 * its output shapes before a call (the shape rule run on the arguments
 * bound as call.c binds them, tensors without data allowed), and a call of
 * its backward op with the arguments its declaration maps. Above call.c:
 * it binds and calls through it. */
#include <stdio.h>
#include <string.h>

#include "runtime/runtime.h"

/* The shape rule for a call on k's device: k's, else another device's
 * kernel's (a rule reads no data, so any device's serves). */
static opjit_shape_fn shape_rule_of(const opjit_op *op, const kernel *k)
{
    if (k->decls && k->decls->shape)
        return k->decls->shape;
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
        const kernel *o = atomic_load_explicit(&op->kernels[d], memory_order_acquire);
        if (o && o->decls && o->decls->shape)
            return o->decls->shape;
    }
    return NULL;
}

/* Run fn as k's shape rule on the bound arguments b into outs. */
static int run_shape(opjit_runtime *rt, const opjit_op *op, call_bound *b, opjit_shape_fn fn,
                     opjit_out_shape *outs)
{
    struct shape_run run = {outs, b->k->sch->nouts, 0};
    opjit_ctx ctx;
    memset(&ctx, 0, sizeof ctx);
    ctx.rt = rt;
    ctx.k = b->k;
    ctx.device = b->device;
    ctx.device_id = b->device_id;
    ctx.shapes = &run;
    opjit_args a = {b->k->sch->nargs, b->v};
    int rc = fn(&ctx, &a);
    if (rc && !ctx.status)
        ctx.status = rt_error(rt, OPJIT_EKERNEL, "%s: the shape rule failed (returned %d) "
                              "without a message", op->name, rc);
    for (int i = 0; !ctx.status && i < run.nouts; i++)
        if (!(run.set & (1u << i)))
            ctx.status = rt_error(rt, OPJIT_EKERNEL, "%s: the shape rule did not say the "
                                  "shape of output %d", op->name, i);
    return ctx.status;
}

/* opjit_output_shapes between reclaim_enter and reclaim_exit (the rule's
 * code stays loaded). */
static int shapes_entered(opjit_runtime *rt, const opjit_op *op, const opjit_value *args,
                          int nargs, opjit_out_shape *outs, int nouts)
{
    call_bound b;
    int rc = call_bind(rt, op, args, nargs, 0, &b);
    if (rc)
        return rc;
    opjit_shape_fn fn = shape_rule_of(op, b.k);
    if (!fn)
        return rt_error(rt, OPJIT_ENOTFOUND, "%s declares no shape rule (opjit_shape in its "
                        "module)", op->name);
    if (nouts < b.k->sch->nouts)
        return rt_error(rt, OPJIT_ECALL, "%s returns %d outputs; room was given for %d",
                        op->name, b.k->sch->nouts, nouts);
    return run_shape(rt, op, &b, fn, outs);
}

int opjit_output_shapes(opjit_runtime *rt, const opjit_op *op, const opjit_value *args,
                        int nargs, opjit_out_shape *outs, int nouts)
{
    if (!rt || !op || nargs < 0 || (nargs && !args) || nouts < 0 || (nouts && !outs))
        return rt_error(rt, OPJIT_EINVAL, "opjit_output_shapes: bad arguments");
    reclaim_enter();
    int rc = shapes_entered(rt, op, args, nargs, outs, nouts);
    reclaim_exit();
    return rc;
}

/* ---- calling the backward op ------------------------------------------------------- */

/* Backward argument i's value from the forward's bound arguments fwd, its
 * outputs, the gradients and the mask. */
static int backward_value(opjit_runtime *rt, const opjit_op *op, const opjit_grad_arg *ga,
                          const call_bound *fwd, DLTensor *const *outs, DLTensor *const *grads,
                          const int64_t *mask, int ninputs, opjit_value *v)
{
    int j = ga->index;
    switch (ga->from) {
    case OPJIT_GRAD_FROM_GRAD:
        if (!grads || !grads[j])
            return rt_error(rt, OPJIT_ECALL, "%s: the backward needs the gradient of output %d",
                            op->name, j);
        *v = opjit_tensor(grads[j]);
        return OPJIT_OK;
    case OPJIT_GRAD_FROM_OUTPUT:
        if (!outs || !outs[j])
            return rt_error(rt, OPJIT_ECALL, "%s: the backward needs output %d", op->name, j);
        *v = opjit_tensor(outs[j]);
        return OPJIT_OK;
    case OPJIT_GRAD_FROM_INPUT:
        *v = fwd->v[j];
        return OPJIT_OK;
    case OPJIT_GRAD_FROM_MASK:
        *v = opjit_ints(mask, ninputs);
        return OPJIT_OK;
    }
    *v = opjit_none();
    return OPJIT_OK;
}

/* opjit_call_backward between reclaim_enter and reclaim_exit (the
 * declarations read stay loaded). */
static int backward_entered(opjit_runtime *rt, const opjit_op *op, const opjit_value *args,
                            int nargs, DLTensor *const *outs, DLTensor *const *grads,
                            const int *want, DLManagedTensor **grad_inputs, int ngrad)
{
    const opjit_op_decls *d;
    int rc = opjit_op_decls_get(rt, op, &d);
    if (rc)
        return rc;
    if (d->gradient != OPJIT_GRAD_DECLARED)
        return rt_error(rt, OPJIT_ENOTFOUND, "%s has no gradient: its module declares %s",
                        op->name, d->gradient == OPJIT_GRAD_NONE ? "it not differentiable"
                                                                 : "none (opjit_derivative)");
    opjit_op *bop;
    if ((rc = opjit_find_op(rt, d->backward, &bop)))
        return rt_error(rt, rc, "%s: its backward op %s is not loaded", op->name, d->backward);
    call_bound fwd;
    if ((rc = call_bind(rt, op, args, nargs, 0, &fwd)))
        return rc;
    int64_t mask[OPJIT_MAX_LIST];
    for (int i = 0; i < d->ninputs && i < OPJIT_MAX_LIST; i++)
        mask[i] = want ? want[i] != 0 : 1;
    opjit_value bv[OPJIT_MAX_ARGS];
    for (int i = 0; i < d->nbackward_args; i++)
        if ((rc = backward_value(rt, op, &d->backward_args[i], &fwd, outs, grads, mask,
                                 d->ninputs, &bv[i])))
            return rc;
    return opjit_call(rt, bop, bv, d->nbackward_args, grad_inputs, ngrad);
}

int opjit_call_backward(opjit_runtime *rt, const opjit_op *op, const opjit_value *args,
                        int nargs, DLTensor *const *outs, DLTensor *const *grads,
                        const int *want, DLManagedTensor **grad_inputs, int ngrad)
{
    reclaim_enter();
    int rc = backward_entered(rt, op, args, nargs, outs, grads, want, grad_inputs, ngrad);
    reclaim_exit();
    return rc;
}
