/* tests/test_decl.c - what op modules declare beside their kernels
 * (runtime/decl.c): gradients (opjit_derivative, opjit_not_differentiable),
 * shape rules (opjit_shape), and what a host asks of them: the
 * declarations, output shapes before a call (opjit_output_shapes) and a
 * call of the backward op (opjit_call_backward). Bad declarations fail the
 * load with a message naming them. The shipped ops' shape rules agree with
 * what their calls return.
 *
 * The test ops are written by the test into a temporary directory. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opjit.h"
#include "t.h"
#include "t_files.h"

/* dscale(x, alpha) = alpha * x, its backward, and its shape rule;
 * dtwo(x, y) = (x + y, x * y) whose backward takes both incoming
 * gradients, an output and the mask; dcount(x) = the indices of the
 * positive elements of x ([<= n], data-dependent), not differentiable;
 * dplain has nothing declared. */
static const char good_source[] =
    "#include <opjit_op.h>\n"
    "static int out_like(opjit_ctx *ctx, int i, const DLTensor *x, DLTensor **o)\n"
    "{\n"
    "    *o = opjit_output(ctx, i, OPJIT_FLOAT32, x->ndim, x->shape);\n"
    "    return *o ? 0 : -1;\n"
    "}\n"
    "static int scale_k(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0), *o;\n"
    "    float al = (float)opjit_arg_float(a, 1);\n"
    "    if (out_like(ctx, 0, x, &o)) return -1;\n"
    "    for (int64_t i = 0; i < opjit_numel(x); i++)\n"
    "        ((float *)o->data)[i] = al * ((float *)opjit_data(x))[i];\n"
    "    return 0;\n"
    "}\n"
    "static int scale_shape(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
    "    if (opjit_arg_float(a, 1) < 0) return opjit_fail(ctx, \"alpha must be >= 0\");\n"
    "    return opjit_output_shape(ctx, 0, x->dtype, x->ndim, x->shape);\n"
    "}\n"
    "static int scale_bw(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *g = opjit_arg_tensor(a, 0), *o;\n"
    "    float al = (float)opjit_arg_float(a, 1);\n"
    "    int64_t zero = 0;\n"
    "    if (!opjit_arg_ints(a, 2)[0])\n"
    "        return opjit_output(ctx, 0, OPJIT_FLOAT32, 1, &zero) ? 0 : -1;\n"
    "    if (out_like(ctx, 0, g, &o)) return -1;\n"
    "    for (int64_t i = 0; i < opjit_numel(g); i++)\n"
    "        ((float *)o->data)[i] = al * ((float *)opjit_data(g))[i];\n"
    "    return 0;\n"
    "}\n"
    "static int two_k(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0), *y = opjit_arg_tensor(a, 1), *s, *p;\n"
    "    if (out_like(ctx, 0, x, &s) || out_like(ctx, 1, x, &p)) return -1;\n"
    "    for (int64_t i = 0; i < opjit_numel(x); i++) {\n"
    "        float u = ((float *)opjit_data(x))[i], v = ((float *)opjit_data(y))[i];\n"
    "        ((float *)s->data)[i] = u + v;\n"
    "        ((float *)p->data)[i] = u * v;\n"
    "    }\n"
    "    return 0;\n"
    "}\n"
    "/* d/dx = gs + gp * y = gs + gp * prod / x; d/dy = gs + gp * x */\n"
    "static int two_bw(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *gs = opjit_arg_tensor(a, 0), *gp = opjit_arg_tensor(a, 1);\n"
    "    DLTensor *x = opjit_arg_tensor(a, 2), *prod = opjit_arg_tensor(a, 3), *dx, *dy;\n"
    "    const int64_t *mask = opjit_arg_ints(a, 4);\n"
    "    if (!mask[0] || !mask[1]) return opjit_fail(ctx, \"the test asks for both\");\n"
    "    if (out_like(ctx, 0, x, &dx) || out_like(ctx, 1, x, &dy)) return -1;\n"
    "    for (int64_t i = 0; i < opjit_numel(x); i++) {\n"
    "        float u = ((float *)opjit_data(x))[i], s = ((float *)opjit_data(gs))[i];\n"
    "        float p = ((float *)opjit_data(gp))[i], q = ((float *)opjit_data(prod))[i];\n"
    "        ((float *)dx->data)[i] = s + p * q / u;\n"
    "        ((float *)dy->data)[i] = s + p * u;\n"
    "    }\n"
    "    return 0;\n"
    "}\n"
    "static int two_shape(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
    "    int rc = opjit_output_shape(ctx, 0, x->dtype, x->ndim, x->shape);\n"
    "    return rc ? rc : opjit_output_shape(ctx, 1, x->dtype, x->ndim, x->shape);\n"
    "}\n"
    "static int count_k(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0), *o;\n"
    "    int64_t n = 0, j = 0;\n"
    "    for (int64_t i = 0; i < opjit_numel(x); i++) n += ((float *)opjit_data(x))[i] > 0;\n"
    "    if (!(o = opjit_output(ctx, 0, OPJIT_INT64, 1, &n))) return -1;\n"
    "    for (int64_t i = 0; i < opjit_numel(x); i++)\n"
    "        if (((float *)opjit_data(x))[i] > 0) ((int64_t *)o->data)[j++] = i;\n"
    "    return 0;\n"
    "}\n"
    "static int count_shape(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    int64_t n = opjit_numel(opjit_arg_tensor(a, 0));\n"
    "    int rc = opjit_output_shape(ctx, 0, OPJIT_INT64, 1, &n);\n"
    "    return rc ? rc : opjit_output_dynamic(ctx, 0, 0);\n"
    "}\n"
    "/* Shape rules that break the rules */\n"
    "static int alloc_shape(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    int64_t n = 1;\n"
    "    (void)a;\n"
    "    return opjit_output(ctx, 0, OPJIT_INT64, 1, &n) ? 0 : -1;\n"
    "}\n"
    "static int silent_shape(opjit_ctx *ctx, opjit_args *a) { (void)ctx; (void)a; return 0; }\n"
    "OPJIT_MODULE(decl_ops, m)\n"
    "{\n"
    "    opjit_def(m, \"dscale(Tensor self, float alpha=2.0) -> Tensor\", OPJIT_CPU, scale_k, \"\");\n"
    "    opjit_require(m, \"self\", \"float32 contiguous\");\n"
    "    opjit_def(m, \"dscale_backward(Tensor grad, float alpha=2.0, int[1] output_mask=1) -> Tensor\",\n"
    "              OPJIT_CPU, scale_bw, \"\");\n"
    "    opjit_def(m, \"dtwo(Tensor x, Tensor y) -> (Tensor sum, Tensor prod)\", OPJIT_CPU, two_k, \"\");\n"
    "    opjit_def(m, \"dtwo_backward(Tensor grad_sum, Tensor grad_prod, Tensor x, Tensor prod,\"\n"
    "              \" int[2] output_mask, int unused=7) -> (Tensor grad_x, Tensor grad_y)\",\n"
    "              OPJIT_CPU, two_bw, \"\");\n"
    "    opjit_def(m, \"dcount(Tensor x) -> Tensor\", OPJIT_CPU, count_k, \"\");\n"
    "    opjit_def(m, \"dplain(Tensor x) -> Tensor\", OPJIT_CPU, count_k, \"\");\n"
    "    opjit_def(m, \"dalloc(Tensor x) -> Tensor\", OPJIT_CPU, count_k, \"\");\n"
    "    opjit_def(m, \"dsilent(Tensor x) -> Tensor\", OPJIT_CPU, count_k, \"\");\n"
    "    opjit_derivative(m, \"dscale\", \"dscale_backward\", \"self\");\n"
    "    opjit_shape(m, \"dscale\", scale_shape);\n"
    "    opjit_derivative(m, \"dtwo\", \"dtwo_backward\", \"x, y\");\n"
    "    opjit_shape(m, \"dtwo\", two_shape);\n"
    "    opjit_not_differentiable(m, \"dcount\");\n"
    "    opjit_shape(m, \"dcount\", count_shape);\n"
    "    opjit_shape(m, \"dalloc\", alloc_shape);\n"
    "    opjit_shape(m, \"dsilent\", silent_shape);\n"
    "}\n";

/* opjit.h has the types only: DLDataType constants of our own. */
static const DLDataType F32 = {kDLFloat, 32, 1}, F64 = {kDLFloat, 64, 1};

static opjit_runtime *rt;
static const char *dir;

static opjit_op *find(const char *name)
{
    opjit_op *op = NULL;
    CHECKF(opjit_find_op(rt, name, &op) == OPJIT_OK, "%s: %s", name, opjit_errmsg(rt));
    return op;
}

static DLTensor cpu_tensor(void *data, DLDataType dt, int ndim, int64_t *shape)
{
    DLTensor t;
    memset(&t, 0, sizeof t);
    t.data = data;
    t.device.device_type = kDLCPU;
    t.ndim = ndim;
    t.dtype = dt;
    t.shape = shape;
    return t;
}

static void declarations_are_read_back(void)
{
    const opjit_op_decls *d;
    CHECK(opjit_op_decls_get(rt, find("dscale"), &d) == OPJIT_OK);
    CHECK(d->gradient == OPJIT_GRAD_DECLARED && d->shape_rule == 1);
    CHECK(!strcmp(t_str(d->backward), "dscale_backward"));
    CHECK(d->ninputs == 1 && d->inputs[0] == 0);
    CHECK(d->nbackward_args == 3);
    CHECK(d->backward_args[0].from == OPJIT_GRAD_FROM_GRAD && d->backward_args[0].index == 0);
    CHECK(d->backward_args[1].from == OPJIT_GRAD_FROM_INPUT && d->backward_args[1].index == 1);
    CHECK(d->backward_args[2].from == OPJIT_GRAD_FROM_MASK);

    CHECK(opjit_op_decls_get(rt, find("dtwo"), &d) == OPJIT_OK);
    CHECK(d->gradient == OPJIT_GRAD_DECLARED && d->ninputs == 2);
    CHECK(d->inputs[0] == 0 && d->inputs[1] == 1);
    CHECK(d->nbackward_args == 6);
    static const int from[6] = {OPJIT_GRAD_FROM_GRAD, OPJIT_GRAD_FROM_GRAD,
                                OPJIT_GRAD_FROM_INPUT, OPJIT_GRAD_FROM_OUTPUT,
                                OPJIT_GRAD_FROM_MASK, OPJIT_GRAD_FROM_DEFAULT};
    static const int index[6] = {0, 1, 0, 1, 0, 0};
    for (int i = 0; i < 6 && i < d->nbackward_args; i++)
        CHECKF(d->backward_args[i].from == from[i] && d->backward_args[i].index == index[i],
               "argument %d: from %d index %d", i, d->backward_args[i].from,
               d->backward_args[i].index);

    CHECK(opjit_op_decls_get(rt, find("dcount"), &d) == OPJIT_OK);
    CHECK(d->gradient == OPJIT_GRAD_NONE && d->shape_rule && !d->backward);
    CHECK(opjit_op_decls_get(rt, find("dplain"), &d) == OPJIT_OK);
    CHECK(d->gradient == OPJIT_GRAD_UNDECLARED && !d->shape_rule && !d->backward);
    CHECK(opjit_op_decls_get(rt, find("dscale_backward"), &d) == OPJIT_OK);
    CHECK(d->gradient == OPJIT_GRAD_UNDECLARED);
    CHECK(opjit_op_decls_get(rt, NULL, &d) == OPJIT_EINVAL && d == NULL);
    CHECK(opjit_op_decls_get(rt, find("dscale"), NULL) == OPJIT_EINVAL);
}

static void shapes_before_a_call(void)
{
    int64_t shape[3] = {2, 3, 5};
    DLTensor x = cpu_tensor(NULL, F32, 3, shape); /* no data: never read */
    opjit_out_shape out[2];
    opjit_value args[2] = {opjit_tensor(&x), opjit_float(0.5)};
    memset(out, 0x5a, sizeof out);
    CHECKF(opjit_output_shapes(rt, find("dscale"), args, 2, out, 1) == OPJIT_OK, "%s",
           opjit_errmsg(rt));
    CHECK(out[0].ndim == 3 && out[0].shape[0] == 2 && out[0].shape[2] == 5);
    CHECK(out[0].dtype.code == kDLFloat && out[0].dtype.bits == 32 && out[0].dynamic == 0);
    /* defaults fill in as for a call */
    CHECK(opjit_output_shapes(rt, find("dscale"), args, 1, out, 1) == OPJIT_OK);
    /* the rule refuses what it refuses, the schema what it refuses */
    args[1] = opjit_float(-1);
    CHECK(opjit_output_shapes(rt, find("dscale"), args, 2, out, 1) == OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "dscale: alpha must be >= 0");
    DLTensor d64 = cpu_tensor(NULL, F64, 3, shape);
    args[0] = opjit_tensor(&d64);
    args[1] = opjit_float(1);
    CHECK(opjit_output_shapes(rt, find("dscale"), args, 2, out, 1) == OPJIT_ECALL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "expected dtype float32");
    args[0] = opjit_int(3);
    CHECK(opjit_output_shapes(rt, find("dscale"), args, 2, out, 1) == OPJIT_ECALL);
    args[0] = opjit_tensor(&x);
    CHECK(opjit_output_shapes(rt, find("dscale"), args, 2, out, 0) == OPJIT_ECALL);
    CHECK(opjit_output_shapes(rt, find("dscale"), args, 2, NULL, 1) == OPJIT_EINVAL);

    /* two outputs */
    opjit_value two[2] = {opjit_tensor(&x), opjit_tensor(&x)};
    CHECK(opjit_output_shapes(rt, find("dtwo"), two, 2, out, 2) == OPJIT_OK);
    CHECK(out[1].ndim == 3 && out[1].shape[1] == 3);

    /* a data-dependent size: its bound, flagged */
    CHECK(opjit_output_shapes(rt, find("dcount"), args, 1, out, 1) == OPJIT_OK);
    CHECK(out[0].ndim == 1 && out[0].shape[0] == 30 && out[0].dynamic == 1);
    CHECK(out[0].dtype.code == kDLInt && out[0].dtype.bits == 64);

    CHECK(opjit_output_shapes(rt, find("dplain"), args, 1, out, 1) == OPJIT_ENOTFOUND);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "dplain declares no shape rule");
    CHECK(opjit_output_shapes(rt, find("dalloc"), args, 1, out, 1) == OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "not allowed in a shape rule");
    CHECK(opjit_output_shapes(rt, find("dsilent"), args, 1, out, 1) == OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "did not say the shape of output 0");

    /* a real call still needs data */
    DLManagedTensor *res = NULL;
    CHECK(opjit_call(rt, find("dscale"), args, 1, &res, 1) == OPJIT_ECALL && !res);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "no data");
}

static void backward_from_c(void)
{
    float xs[4] = {1, 2, 3, 4}, ys[4] = {5, 6, 7, 8}, g1[4] = {1, 1, 1, 1},
          g2[4] = {0.5f, 1, 2, -1};
    int64_t shape[1] = {4};
    DLTensor x = cpu_tensor(xs, F32, 1, shape), y = cpu_tensor(ys, F32, 1, shape);
    DLTensor gs = cpu_tensor(g1, F32, 1, shape), gp = cpu_tensor(g2, F32, 1, shape);

    /* dscale: d(alpha x)/dx = alpha */
    opjit_value args[2] = {opjit_tensor(&x), opjit_float(3)};
    DLManagedTensor *out = NULL, *gin[2] = {NULL, NULL};
    CHECK(opjit_call(rt, find("dscale"), args, 2, &out, 1) == OPJIT_OK);
    DLTensor *grads[1] = {&gp};
    CHECKF(opjit_call_backward(rt, find("dscale"), args, 2, NULL, grads, NULL, gin, 1) == 0, "%s",
           opjit_errmsg(rt));
    for (int i = 0; gin[0] && i < 4; i++)
        CHECK(((float *)gin[0]->dl_tensor.data)[i] == 3 * g2[i]);
    if (gin[0])
        gin[0]->deleter(gin[0]);
    int no[1] = {0};
    gin[0] = NULL;
    CHECK(opjit_call_backward(rt, find("dscale"), args, 2, NULL, grads, no, gin, 1) == 0);
    CHECK(gin[0] && gin[0]->dl_tensor.ndim == 1 && gin[0]->dl_tensor.shape[0] == 0);
    if (gin[0])
        gin[0]->deleter(gin[0]);
    /* the forward's default reaches the backward */
    gin[0] = NULL;
    CHECK(opjit_call_backward(rt, find("dscale"), args, 1, NULL, grads, NULL, gin, 1) == 0);
    CHECK(gin[0] && ((float *)gin[0]->dl_tensor.data)[1] == 2 * g2[1]);
    if (gin[0])
        gin[0]->deleter(gin[0]);
    out->deleter(out);

    /* dtwo: both gradients, the output prod passed back */
    opjit_value targs[2] = {opjit_tensor(&x), opjit_tensor(&y)};
    DLManagedTensor *touts[2] = {NULL, NULL};
    CHECK(opjit_call(rt, find("dtwo"), targs, 2, touts, 2) == OPJIT_OK);
    DLTensor *tg[2] = {&gs, &gp}, *to[2] = {&touts[0]->dl_tensor, &touts[1]->dl_tensor};
    CHECKF(opjit_call_backward(rt, find("dtwo"), targs, 2, to, tg, NULL, gin, 2) == 0, "%s",
           opjit_errmsg(rt));
    for (int i = 0; gin[0] && gin[1] && i < 4; i++) {
        CHECK(fabsf(((float *)gin[0]->dl_tensor.data)[i] - (g1[i] + g2[i] * ys[i])) < 1e-5f);
        CHECK(fabsf(((float *)gin[1]->dl_tensor.data)[i] - (g1[i] + g2[i] * xs[i])) < 1e-5f);
    }
    for (int i = 0; i < 2; i++)
        if (gin[i])
            gin[i]->deleter(gin[i]);
    /* what the backward needs must be given */
    DLTensor *one_grad[2] = {&gs, NULL};
    CHECK(opjit_call_backward(rt, find("dtwo"), targs, 2, to, one_grad, NULL, gin, 2) ==
          OPJIT_ECALL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "gradient of output 1");
    CHECK(opjit_call_backward(rt, find("dtwo"), targs, 2, NULL, tg, NULL, gin, 2) == OPJIT_ECALL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "needs output 1");
    touts[0]->deleter(touts[0]);
    touts[1]->deleter(touts[1]);

    CHECK(opjit_call_backward(rt, find("dcount"), args, 1, NULL, grads, NULL, gin, 1) ==
          OPJIT_ENOTFOUND);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "declares it not differentiable");
    CHECK(opjit_call_backward(rt, find("dplain"), args, 1, NULL, grads, NULL, gin, 1) ==
          OPJIT_ENOTFOUND);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "declares none");
}

/* What opjit_op_decls_get hands out stays valid after the code that
 * declared it is unloaded (and unmapped) or replaced by a reload that
 * declares otherwise. Under ASan a dangling read fails. */
static void declarations_outlive_the_code(void)
{
    const char *path = t_path(dir, "decl_ops.c");
    opjit_runtime *r = NULL;
    opjit_op *op = NULL;
    const opjit_op_decls *before = NULL, *after = NULL;
    CHECK(opjit_create(NULL, &r) == OPJIT_OK);
    CHECKF(opjit_load_op(r, path, NULL) == 0 && opjit_find_op(r, "dscale", &op) == 0, "%s",
           opjit_errmsg(r));
    CHECK(op && opjit_op_decls_get(r, op, &before) == OPJIT_OK);
    CHECK(opjit_unload(r, path) == OPJIT_OK);
    CHECK(before && before->gradient == OPJIT_GRAD_DECLARED);
    CHECK(before && !strcmp(t_str(before->backward), "dscale_backward"));
    CHECK(before && before->ninputs == 1 && before->inputs[0] == 0);
    CHECK(before && before->backward_args[2].from == OPJIT_GRAD_FROM_MASK);
    /* a new version of the source: dscale is declared not differentiable */
    static const char decl[] = "opjit_derivative(m, \"dscale\", \"dscale_backward\", \"self\");";
    const char *at = strstr(good_source, decl);
    CHECK(at != NULL);
    if (at) {
        char buf[sizeof good_source + 64];
        snprintf(buf, sizeof buf, "%.*sopjit_not_differentiable(m, \"dscale\");%s",
                 (int)(at - good_source), good_source, at + strlen(decl));
        t_write(path, buf, strlen(buf));
        CHECKF(opjit_load_op(r, path, NULL) == OPJIT_OK, "%s", opjit_errmsg(r));
        CHECK(opjit_op_decls_get(r, op, &after) == OPJIT_OK);
        CHECK(after && after->gradient == OPJIT_GRAD_NONE && after->shape_rule);
        CHECK(before && before->gradient == OPJIT_GRAD_DECLARED); /* the old one, still readable */
        CHECK(before && !strcmp(t_str(before->backward), "dscale_backward"));
        t_write(path, good_source, sizeof good_source - 1);
    }
    opjit_destroy(r);
}

/* A module whose declarations break a rule fails its load, saying which. */
static void bad_declarations(void)
{
    static const struct {
        const char *body;
        const char *msg;
    } cases[] = {
        {"opjit_shape(m, \"f\", sh); opjit_def(m, \"f(Tensor x) -> Tensor\", OPJIT_CPU, k, \"\");",
         "opjit_shape(f): no op of that name was defined before it"},
        {"F; opjit_derivative(m, \"f\", \"f_bw\", \"x\");",
         "its backward op f_bw is not defined in this module"},
        {"F; B(\"f_bw(Tensor grad, Tensor x) -> (Tensor, Tensor)\"); "
         "opjit_derivative(m, \"f\", \"f_bw\", \"x\");",
         "f_bw returns 2 tensors, but 1 inputs are differentiable"},
        {"F; B(\"f_bw(Tensor grad, Tensor other) -> Tensor\"); "
         "opjit_derivative(m, \"f\", \"f_bw\", \"x\");",
         "argument 'other' is not grad, an argument or output of f"},
        {"F; B(\"f_bw(Tensor grad, int[2] output_mask) -> Tensor\"); "
         "opjit_derivative(m, \"f\", \"f_bw\", \"x\");",
         "output_mask must be int[1]"},
        {"F; B(\"f_bw(Tensor grad, int n) -> Tensor\"); opjit_derivative(m, \"f\", \"f_bw\", \"n\");",
         "'n' is not a Tensor argument of f"},
        {"F; B(\"f_bw(Tensor grad, Tensor n) -> Tensor\"); opjit_derivative(m, \"f\", \"f_bw\", \"x\");",
         "argument 'n' is Tensor but f's is int"},
        {"F; B(\"f_bw(Tensor x) -> Tensor\"); opjit_derivative(m, \"f\", \"f_bw\", \"x\");",
         "f_bw takes no incoming gradient"},
        {"F; B(\"f_bw(Tensor grad) -> Tensor\"); opjit_derivative(m, \"f\", \"f_bw\", \"\");",
         "no input listed"},
        {"F; B(\"f_bw(Tensor grad) -> Tensor\"); opjit_derivative(m, \"f\", \"f_bw\", \"x\"); "
         "opjit_not_differentiable(m, \"f\");",
         "f already declares a derivative"},
        {"F; opjit_shape(m, \"f\", sh); opjit_shape(m, \"f\", sh);", "declared twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char src[4096], name[64];
        snprintf(src, sizeof src,
                 "#include <opjit_op.h>\n"
                 "static int k(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\n"
                 "static int sh(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\n"
                 "#define F opjit_def(m, \"f(Tensor x, int n=1) -> Tensor\", OPJIT_CPU, k, \"\")\n"
                 "#define B(s) opjit_def(m, s, OPJIT_CPU, k, \"\")\n"
                 "OPJIT_MODULE(bad, m) { %s }\n",
                 cases[i].body);
        snprintf(name, sizeof name, "bad%zu.c", i);
        const char *path = t_path(dir, name);
        t_write(path, src, strlen(src));
        opjit_runtime *r = NULL;
        CHECK(opjit_create(NULL, &r) == OPJIT_OK);
        int rc = opjit_load_op(r, path, NULL);
        CHECKF(rc == OPJIT_EMODULE, "case %zu: %s", i, opjit_status_name(rc));
        CHECK_STR_CONTAINS(opjit_errmsg(r), cases[i].msg);
        CHECK_STR_CONTAINS(opjit_errmsg(r), name);
        opjit_op *f = NULL;
        CHECK(opjit_find_op(r, "f", &f) == OPJIT_ENOTFOUND); /* nothing published */
        opjit_destroy(r);
    }
}

/* Every output's shape of a call of op against the rule's. */
static void rule_matches_call(opjit_runtime *r, opjit_op *op, opjit_value *v, int n, int nouts,
                              const char *what)
{
    DLManagedTensor *res[3] = {NULL, NULL, NULL};
    opjit_out_shape o[3];
    CHECKF(opjit_call(r, op, v, n, res, nouts) == OPJIT_OK, "%s: %s", what, opjit_errmsg(r));
    CHECKF(opjit_output_shapes(r, op, v, n, o, nouts) == OPJIT_OK, "%s: %s", what,
           opjit_errmsg(r));
    for (int i = 0; i < nouts; i++) {
        if (!res[i])
            continue;
        DLTensor *t = &res[i]->dl_tensor;
        int same = t->ndim == o[i].ndim && t->dtype.bits == o[i].dtype.bits && !o[i].dynamic;
        for (int d = 0; same && d < t->ndim; d++)
            same = t->shape[d] == o[i].shape[d];
        CHECKF(same, "%s: output %d: the rule says %d-d, the call made %d-d", what, i,
               o[i].ndim, t->ndim);
        res[i]->deleter(res[i]);
    }
}

/* mm_backward and conv2d_backward, every output_mask, bias or none. */
static void backward_shapes_match_calls(opjit_runtime *r)
{
    opjit_op *mmb = NULL, *cb = NULL;
    CHECKF(opjit_find_op(r, "mm_backward", &mmb) == 0, "%s", opjit_errmsg(r));
    CHECKF(opjit_find_op(r, "conv2d_backward", &cb) == 0, "%s", opjit_errmsg(r));
    if (!mmb || !cb)
        return;
    static float buf[4096];
    int64_t gs[2] = {3, 5}, xs[2] = {3, 4}, ys[2] = {4, 5};
    DLTensor g = cpu_tensor(buf, F32, 2, gs), x = cpu_tensor(buf, F32, 2, xs),
             y = cpu_tensor(buf, F32, 2, ys);
    for (int mask = 0; mask < 4; mask++) {
        int64_t m2[2] = {mask & 1, mask >> 1};
        opjit_value v[4] = {opjit_tensor(&g), opjit_tensor(&x), opjit_tensor(&y), opjit_ints(m2, 2)};
        rule_matches_call(r, mmb, v, 4, 2, "mm_backward");
    }
    int64_t is[4] = {2, 4, 7, 6}, ws[4] = {6, 2, 3, 2}, bs[1] = {6}, os[4] = {2, 6, 3, 7};
    DLTensor in = cpu_tensor(buf, F32, 4, is), w = cpu_tensor(buf, F32, 4, ws),
             b = cpu_tensor(buf, F32, 1, bs), go = cpu_tensor(buf, F32, 4, os);
    int64_t st[2] = {2, 1}, pd[2] = {0, 1}, dl[2] = {1, 1};
    for (int mask = 0; mask < 16; mask++) {
        int64_t m3[3] = {mask & 1, (mask >> 1) & 1, (mask >> 2) & 1};
        opjit_value v[9] = {opjit_tensor(&go), opjit_tensor(&in), opjit_tensor(&w),
                            mask & 8 ? opjit_none() : opjit_tensor(&b), opjit_ints(st, 2),
                            opjit_ints(pd, 2), opjit_ints(dl, 2), opjit_int(2),
                            opjit_ints(m3, 3)};
        rule_matches_call(r, cb, v, 9, 3, "conv2d_backward");
    }
}

/* The shipped ops' rules say what their calls return, with no data. */
static void shipped_shape_rules(void)
{
    opjit_runtime *r = NULL;
    CHECK(opjit_create(NULL, &r) == OPJIT_OK);
    opjit_op *mm = NULL, *conv = NULL, *nms = NULL;
    CHECKF(opjit_load_op(r, "mm", &mm) == OPJIT_OK, "%s", opjit_errmsg(r));
    CHECKF(opjit_load_op(r, "conv2d", &conv) == OPJIT_OK, "%s", opjit_errmsg(r));
    CHECKF(opjit_load_op(r, "nms", &nms) == OPJIT_OK, "%s", opjit_errmsg(r));
    if (!mm || !conv || !nms) {
        opjit_destroy(r);
        return;
    }
    const opjit_op_decls *d;
    CHECK(opjit_op_decls_get(r, nms, &d) == 0 && d->gradient == OPJIT_GRAD_NONE && d->shape_rule);
    CHECK(opjit_op_decls_get(r, mm, &d) == 0 && d->shape_rule);
    CHECK(opjit_op_decls_get(r, conv, &d) == 0 && d->shape_rule);

    opjit_out_shape o;
    int64_t a_shape[2] = {3, 7}, b_shape[2] = {7, 5}, c_shape[2] = {6, 5};
    DLTensor a = cpu_tensor(NULL, F64, 2, a_shape), b = cpu_tensor(NULL, F64, 2, b_shape);
    DLTensor c = cpu_tensor(NULL, F64, 2, c_shape);
    opjit_value mv[2] = {opjit_tensor(&a), opjit_tensor(&b)};
    CHECK(opjit_output_shapes(r, mm, mv, 2, &o, 1) == OPJIT_OK);
    CHECK(o.ndim == 2 && o.shape[0] == 3 && o.shape[1] == 5 && o.dtype.bits == 64);
    mv[1] = opjit_tensor(&c);
    CHECK(opjit_output_shapes(r, mm, mv, 2, &o, 1) == OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(opjit_errmsg(r), "cannot be multiplied");

    int64_t bx_shape[2] = {17, 4}, sc_shape[1] = {17};
    DLTensor bx = cpu_tensor(NULL, F32, 2, bx_shape), sc = cpu_tensor(NULL, F32, 1, sc_shape);
    opjit_value nv[3] = {opjit_tensor(&bx), opjit_tensor(&sc), opjit_float(0.5)};
    CHECK(opjit_output_shapes(r, nms, nv, 3, &o, 1) == OPJIT_OK);
    CHECK(o.ndim == 1 && o.shape[0] == 17 && o.dynamic == 1 && o.dtype.code == kDLInt);

    /* conv2d: shapes from a real call, for several geometries */
    static const int64_t geo[][9] = {
        /* n c h w o kh kw stride pad (dil, groups below) */
        {2, 4, 9, 11, 6, 3, 3, 1, 1}, {1, 4, 9, 11, 8, 3, 1, 2, 0}, {3, 6, 10, 7, 6, 2, 3, 3, 2},
    };
    static const int64_t dil_groups[][2] = {{1, 1}, {2, 2}, {1, 3}};
    for (size_t g = 0; g < sizeof geo / sizeof geo[0]; g++) {
        const int64_t *q = geo[g];
        int64_t is[4] = {q[0], q[1], q[2], q[3]}, wsh[4] = {q[4], q[1] / dil_groups[g][1], q[5], q[6]};
        size_t ni = (size_t)(is[0] * is[1] * is[2] * is[3]), nw = (size_t)(wsh[0] * wsh[1] * wsh[2] * wsh[3]);
        float *in = calloc(ni, sizeof(float)), *w = calloc(nw, sizeof(float));
        DLTensor ti = cpu_tensor(in, F32, 4, is), tw = cpu_tensor(w, F32, 4, wsh);
        int64_t st[2] = {q[7], q[7]}, pd[2] = {q[8], q[8]}, dl[2] = {dil_groups[g][0], dil_groups[g][0]};
        opjit_value cv[7] = {opjit_tensor(&ti), opjit_tensor(&tw), opjit_none(), opjit_ints(st, 2),
                             opjit_ints(pd, 2), opjit_ints(dl, 2), opjit_int(dil_groups[g][1])};
        DLManagedTensor *res = NULL;
        CHECKF(opjit_call(r, conv, cv, 7, &res, 1) == OPJIT_OK, "%s", opjit_errmsg(r));
        ti.data = tw.data = NULL; /* the rule needs none */
        CHECKF(opjit_output_shapes(r, conv, cv, 7, &o, 1) == OPJIT_OK, "%s", opjit_errmsg(r));
        CHECK(res && o.ndim == res->dl_tensor.ndim && !o.dynamic);
        for (int i = 0; res && i < o.ndim; i++)
            CHECKF(o.shape[i] == res->dl_tensor.shape[i], "geometry %zu dim %d: %lld vs %lld", g,
                   i, (long long)o.shape[i], (long long)res->dl_tensor.shape[i]);
        if (res)
            res->deleter(res);
        free(in);
        free(w);
    }
    /* the derivatives, and the backward ops' rules against their calls */
    CHECK(opjit_op_decls_get(r, mm, &d) == 0 && d->gradient == OPJIT_GRAD_DECLARED);
    CHECK(!strcmp(t_str(d->backward), "mm_backward") && d->ninputs == 2);
    CHECK(opjit_op_decls_get(r, conv, &d) == 0 && d->gradient == OPJIT_GRAD_DECLARED);
    CHECK(!strcmp(t_str(d->backward), "conv2d_backward") && d->ninputs == 3);
    CHECK(d->inputs[0] == 0 && d->inputs[1] == 1 && d->inputs[2] == 2);
    backward_shapes_match_calls(r);

    /* conv2d.padding: "same" keeps the spatial size */
    opjit_op *convp = NULL;
    CHECKF(opjit_find_op(r, "conv2d.padding", &convp) == OPJIT_OK, "%s", opjit_errmsg(r));
    int64_t is[4] = {2, 4, 9, 7}, wsh[4] = {5, 4, 3, 2};
    DLTensor ti = cpu_tensor(NULL, F32, 4, is), tw = cpu_tensor(NULL, F32, 4, wsh);
    opjit_value pv[5] = {opjit_tensor(&ti), opjit_tensor(&tw), opjit_none(), opjit_int(1),
                         opjit_str("same")};
    CHECKF(convp && opjit_output_shapes(r, convp, pv, 5, &o, 1) == OPJIT_OK, "%s", opjit_errmsg(r));
    CHECK(o.ndim == 4 && o.shape[0] == 2 && o.shape[1] == 5 && o.shape[2] == 9 && o.shape[3] == 7);
    pv[4] = opjit_str("full");
    CHECK(convp && opjit_output_shapes(r, convp, pv, 5, &o, 1) == OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(opjit_errmsg(r), "Invalid padding string");
    opjit_destroy(r);
}

int main(void)
{
    dir = t_tmpdir("decl");
    const char *path = t_path(dir, "decl_ops.c");
    t_write(path, good_source, sizeof good_source - 1);
    if (opjit_create(NULL, &rt) || opjit_load_op(rt, path, NULL)) {
        fprintf(stderr, "loading the test ops: %s\n", rt ? opjit_errmsg(rt) : "no runtime");
        return 1;
    }
    T_RUN(declarations_are_read_back);
    T_RUN(shapes_before_a_call);
    T_RUN(backward_from_c);
    T_RUN(declarations_outlive_the_code);
    T_RUN(bad_declarations);
    T_RUN(shipped_shape_rules);
    opjit_destroy(rt);
    t_tmpdirs_remove();
    return t_done();
}
