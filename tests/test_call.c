/* tests/test_call.c - opjit_call: schema checks and their messages,
 * defaults, conversions, several outputs, failing kernels, workspaces.
 *
 * The ops are compiled from the source below, written by the test into its
 * own temporary directory. Run under ASan to catch outputs leaked by
 * failing calls. */
#include <errno.h>
#include <ftw.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "opjit.h"
#include "t.h"

static const char ops_source[] =
    "#include <opjit_op.h>\n"
    "#include <string.h>\n"
    "\n"
    "/* x + y, float32 */\n"
    "static int addk(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0), *y = opjit_arg_tensor(a, 1);\n"
    "    int64_t n = opjit_numel(x);\n"
    "    if (opjit_numel(y) != n)\n"
    "        return opjit_fail(ctx, \"sizes differ: %d and %d\", (int)n, (int)opjit_numel(y));\n"
    "    DLTensor *o = opjit_output(ctx, 0, OPJIT_FLOAT32, x->ndim, x->shape);\n"
    "    if (!o)\n"
    "        return -1;\n"
    "    const float *px = opjit_data(x), *py = opjit_data(y);\n"
    "    float *po = opjit_data(o);\n"
    "    for (int64_t i = 0; i < n; i++)\n"
    "        po[i] = px[i] + py[i];\n"
    "    return 0;\n"
    "}\n"
    "\n"
    "/* x * k */\n"
    "static int scalek(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
    "    int64_t k = opjit_arg_int(a, 1), n = opjit_numel(x);\n"
    "    DLTensor *o = opjit_output(ctx, 0, OPJIT_FLOAT32, x->ndim, x->shape);\n"
    "    if (!o)\n"
    "        return -1;\n"
    "    const float *px = opjit_data(x);\n"
    "    float *po = opjit_data(o);\n"
    "    for (int64_t i = 0; i < n; i++)\n"
    "        po[i] = px[i] * (float)k;\n"
    "    return 0;\n"
    "}\n"
    "\n"
    "/* What the kernel saw, as 11 float64 values. */\n"
    "static int defsk(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    int64_t shape[1] = {11};\n"
    "    DLTensor *o = opjit_output(ctx, 0, OPJIT_FLOAT64, 1, shape);\n"
    "    if (!o)\n"
    "        return -1;\n"
    "    double *r = opjit_data(o);\n"
    "    DLTensor *opt = opjit_arg_tensor(a, 4);\n"
    "    const int64_t *pair = opjit_arg_ints(a, 3), *trip = opjit_arg_ints(a, 5);\n"
    "    r[0] = (double)opjit_arg_int(a, 0);\n"
    "    r[1] = opjit_arg_float(a, 1);\n"
    "    r[2] = opjit_arg_bool(a, 2);\n"
    "    r[3] = (double)pair[0];\n"
    "    r[4] = (double)pair[1];\n"
    "    r[5] = opjit_arg_len(a, 3);\n"
    "    r[6] = opt != NULL;\n"
    "    r[7] = opt ? (double)opjit_numel(opt) : -1;\n"
    "    r[8] = (double)(trip[0] + 10 * trip[1] + 100 * trip[2]);\n"
    "    r[9] = a->v[1].kind;\n"
    "    r[10] = a->n;\n"
    "    if (a->v[4].kind != (opt ? OPJIT_KIND_TENSOR : OPJIT_KIND_NONE))\n"
    "        return opjit_fail(ctx, \"opt has kind %d\", a->v[4].kind);\n"
    "    return 0;\n"
    "}\n"
    "\n"
    "/* (x * 2, sum(x) as a 0-d float64) */\n"
    "static int twok(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
    "    int64_t n = opjit_numel(x);\n"
    "    DLTensor *o0 = opjit_output(ctx, 0, OPJIT_FLOAT32, x->ndim, x->shape);\n"
    "    DLTensor *o1 = opjit_output(ctx, 1, OPJIT_FLOAT64, 0, NULL);\n"
    "    if (!o0 || !o1)\n"
    "        return -1;\n"
    "    const float *px = opjit_data(x);\n"
    "    float *p0 = opjit_data(o0);\n"
    "    double s = 0;\n"
    "    for (int64_t i = 0; i < n; i++) {\n"
    "        p0[i] = 2 * px[i];\n"
    "        s += px[i];\n"
    "    }\n"
    "    *(double *)opjit_data(o1) = s;\n"
    "    return 0;\n"
    "}\n"
    "\n"
    "/* Kernels that misbehave in every way a kernel can. */\n"
    "static int failk(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    int64_t mode = opjit_arg_int(a, 0);\n"
    "    int64_t big[1] = {1 << 18};\n"
    "    DLTensor *o0, *o1;\n"
    "    switch (mode) {\n"
    "    case 0: /* outputs made, then a failure with a message */\n"
    "        o0 = opjit_output(ctx, 0, OPJIT_FLOAT32, 1, big);\n"
    "        o1 = opjit_output(ctx, 1, OPJIT_FLOAT32, 1, big);\n"
    "        if (!o0 || !o1)\n"
    "            return -1;\n"
    "        return opjit_fail(ctx, \"bad thing %d happened to %s\", 42, \"the input\");\n"
    "    case 1: /* non-zero without a message */\n"
    "        if (!opjit_output(ctx, 0, OPJIT_FLOAT32, 1, big))\n"
    "            return -1;\n"
    "        return 5;\n"
    "    case 2: /* forgets output 1 */\n"
    "        return opjit_output(ctx, 0, OPJIT_FLOAT32, 1, big) ? 0 : -1;\n"
    "    case 3: /* output 0 twice */\n"
    "        if (!opjit_output(ctx, 0, OPJIT_FLOAT32, 1, big))\n"
    "            return -1;\n"
    "        if (!opjit_output(ctx, 0, OPJIT_FLOAT32, 1, big))\n"
    "            return -1;\n"
    "        return 0;\n"
    "    case 4: /* fine */\n"
    "        o0 = opjit_output(ctx, 0, OPJIT_INT32, 1, big);\n"
    "        o1 = opjit_output(ctx, 1, OPJIT_INT32, 1, big);\n"
    "        if (!o0 || !o1)\n"
    "            return -1;\n"
    "        memset(o0->data, 0, (size_t)big[0] * 4);\n"
    "        memset(o1->data, 1, (size_t)big[0] * 4);\n"
    "        return 0;\n"
    "    case 5: /* an output the schema does not have */\n"
    "        if (!opjit_output(ctx, 0, OPJIT_FLOAT32, 1, big))\n"
    "            return -1;\n"
    "        return opjit_output(ctx, 2, OPJIT_FLOAT32, 1, big) ? 0 : -1;\n"
    "    case 6: /* records a failure but returns 0 */\n"
    "        opjit_output(ctx, 0, OPJIT_FLOAT32, 1, big);\n"
    "        opjit_output(ctx, 1, OPJIT_FLOAT32, 1, big);\n"
    "        opjit_fail(ctx, \"quietly broken\");\n"
    "        return 0;\n"
    "    case 7: /* two failures: the first message wins */\n"
    "        opjit_fail(ctx, \"first failure\");\n"
    "        return opjit_fail(ctx, \"second failure\");\n"
    "    case 8: { /* a negative size */\n"
    "        int64_t neg[2] = {4, -1};\n"
    "        return opjit_output(ctx, 0, OPJIT_FLOAT32, 2, neg) ? 0 : -1;\n"
    "    }\n"
    "    case 9: /* a dtype with no bytes */\n"
    "        return opjit_output(ctx, 0, opjit_dtype(kDLFloat, 0), 1, big) ? 0 : -1;\n"
    "    case 10: { /* too large to exist */\n"
    "        int64_t huge[2] = {(int64_t)1 << 40, (int64_t)1 << 30};\n"
    "        return opjit_output(ctx, 0, OPJIT_FLOAT64, 2, huge) ? 0 : -1;\n"
    "    }\n"
    "    case 11: { /* a workspace too large to exist */\n"
    "        void *w = opjit_workspace(ctx, (size_t)-1);\n"
    "        if (w)\n"
    "            return opjit_fail(ctx, \"got a workspace of SIZE_MAX bytes\");\n"
    "        return -1;\n"
    "    }\n"
    "    case 12: { /* nearly that large: header + size wraps around */\n"
    "        void *w = opjit_workspace(ctx, (size_t)-64);\n"
    "        if (w)\n"
    "            return opjit_fail(ctx, \"got a workspace of SIZE_MAX - 63 bytes\");\n"
    "        return -1;\n"
    "    }\n"
    "    }\n"
    "    return opjit_fail(ctx, \"unknown mode %d\", (int)mode);\n"
    "}\n"
    "\n"
    "/* n workspaces of size + i * grow bytes; each filled and verified; the\n"
    " * output holds their addresses. */\n"
    "static int wsk(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    int n = (int)opjit_arg_int(a, 0);\n"
    "    int64_t size = opjit_arg_int(a, 1), grow = opjit_arg_int(a, 2);\n"
    "    unsigned char *p[64];\n"
    "    if (n < 1 || n > 64)\n"
    "        return opjit_fail(ctx, \"bad n %d\", n);\n"
    "    int64_t shape[1] = {n};\n"
    "    DLTensor *o = opjit_output(ctx, 0, OPJIT_INT64, 1, shape);\n"
    "    if (!o)\n"
    "        return -1;\n"
    "    for (int i = 0; i < n; i++) {\n"
    "        size_t sz = (size_t)(size + i * grow);\n"
    "        p[i] = opjit_workspace(ctx, sz);\n"
    "        if (!p[i])\n"
    "            return -1;\n"
    "        memset(p[i], i + 1, sz);\n"
    "        ((int64_t *)o->data)[i] = (int64_t)(intptr_t)p[i];\n"
    "    }\n"
    "    for (int i = 0; i < n; i++) {\n"
    "        size_t sz = (size_t)(size + i * grow);\n"
    "        for (size_t j = 0; j < sz; j++)\n"
    "            if (p[i][j] != (unsigned char)(i + 1))\n"
    "                return opjit_fail(ctx, \"workspace %d byte %d was overwritten\", i, (int)j);\n"
    "    }\n"
    "    return 0;\n"
    "}\n"
    "\n"
    "OPJIT_MODULE(qac_ops, m)\n"
    "{\n"
    "    opjit_def(m, \"qac_add(Tensor x, Tensor y) -> Tensor\", OPJIT_CPU, addk, \"x + y\");\n"
    "    opjit_require(m, \"x\", \"float32 rank=1 contiguous\");\n"
    "    opjit_require(m, \"y\", \"float32\");\n"
    "    opjit_def(m, \"qac_scale(Tensor x, int k) -> Tensor\", OPJIT_CPU, scalek, \"x * k\");\n"
    "    opjit_require(m, \"x\", \"float32|float64 contiguous\");\n"
    "    opjit_def(m, \"qac_defs(int i=3, float f=0.5, bool b=True, int[2] pair=7, \"\n"
    "                 \"Tensor? opt=None, int[3] trip=[1, 2, 3]) -> Tensor\",\n"
    "              OPJIT_CPU, defsk, \"defaults\");\n"
    "    opjit_require(m, \"opt\", \"int32\");\n"
    "    opjit_def(m, \"qac_two(Tensor x) -> (Tensor doubled, Tensor total)\", OPJIT_CPU, twok, \"\");\n"
    "    opjit_require(m, \"x\", \"float32 contiguous\");\n"
    "    opjit_def(m, \"qac_fail(int mode) -> (Tensor, Tensor)\", OPJIT_CPU, failk, \"\");\n"
    "    opjit_def(m, \"qac_ws(int n, int size, int grow=0) -> Tensor\", OPJIT_CPU, wsk, \"\");\n"
    "}\n";

/* ---- helpers --------------------------------------------------------------------- */

/* Under ASan, an impossible allocation returns NULL as malloc does, rather
 * than aborting the test. Unused without ASan. */
const char *__asan_default_options(void);
const char *__asan_default_options(void) { return "allocator_may_return_null=1"; }

static char tmp_dir[512];
static char src_path[1024];
static opjit_runtime *rt;
static opjit_op *op_add, *op_scale, *op_defs, *op_two, *op_fail, *op_ws;

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    remove(p);
    return 0;
}

static void setup(void)
{
    const char *base = getenv("TMPDIR");
    snprintf(tmp_dir, sizeof tmp_dir, "%s/opjit-test-call-XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(tmp_dir)) {
        fprintf(stderr, "mkdtemp: %s\n", strerror(errno));
        exit(1);
    }
    if (!getenv("OPJIT_CACHE_DIR")) {
        char c[600];
        snprintf(c, sizeof c, "%s/cache", tmp_dir);
        setenv("OPJIT_CACHE_DIR", c, 1);
    }
    snprintf(src_path, sizeof src_path, "%s/qac_ops.c", tmp_dir);
    FILE *f = fopen(src_path, "wb");
    if (!f || fwrite(ops_source, 1, sizeof ops_source - 1, f) != sizeof ops_source - 1 ||
        fclose(f)) {
        fprintf(stderr, "cannot write %s\n", src_path);
        exit(1);
    }
    int rc = opjit_create(NULL, &rt);
    if (rc) {
        fprintf(stderr, "opjit_create: %s\n", opjit_status_name(rc));
        exit(1);
    }
    rc = opjit_load_op(rt, src_path, NULL);
    if (rc) {
        fprintf(stderr, "loading the test ops: %s: %s\n", opjit_status_name(rc),
                opjit_errmsg(rt));
        exit(1);
    }
    struct {
        const char *name;
        opjit_op **op;
    } ops[] = {{"qac_add", &op_add},   {"qac_scale", &op_scale}, {"qac_defs", &op_defs},
               {"qac_two", &op_two},   {"qac_fail", &op_fail},   {"qac_ws", &op_ws}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++)
        if (opjit_find_op(rt, ops[i].name, ops[i].op)) {
            fprintf(stderr, "%s not loaded\n", ops[i].name);
            exit(1);
        }
}

static void teardown(void)
{
    opjit_destroy(rt);
    nftw(tmp_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

/* A CPU float32 tensor over data with the given shape. */
typedef struct tensor {
    DLTensor t;
    int64_t shape[4];
    int64_t strides[4];
} tensor;

static tensor mk(void *data, DLDataType dt, int ndim, const int64_t *shape)
{
    tensor x;
    memset(&x, 0, sizeof x);
    x.t.data = data;
    x.t.device.device_type = kDLCPU;
    x.t.dtype = dt;
    x.t.ndim = ndim;
    for (int i = 0; i < ndim; i++)
        x.shape[i] = shape[i];
    return x;
}
#define F32 ((DLDataType){kDLFloat, 32, 1})
#define F64 ((DLDataType){kDLFloat, 64, 1})
#define I32 ((DLDataType){kDLInt, 32, 1})

/* Fix up the self pointers after a tensor struct is copied into place. */
static DLTensor *T(tensor *x)
{
    x->t.shape = x->shape;
    return &x->t;
}

/* Call expecting status; outs must come back untouched on failure. Returns
 * the message. */
static const char *call_fails(const opjit_op *op, const opjit_value *args, int nargs,
                              int status)
{
    DLManagedTensor *outs[4] = {NULL, NULL, NULL, NULL};
    int rc = opjit_call(rt, op, args, nargs, outs, 4);
    CHECKF(rc == status, "expected %s, got %s: %s", opjit_status_name(status),
           opjit_status_name(rc), opjit_errmsg(rt));
    for (int i = 0; i < 4; i++) {
        CHECKF(outs[i] == NULL, "output %d handed out by a failed call", i);
        if (rc == OPJIT_OK && outs[i])
            outs[i]->deleter(outs[i]);
    }
    const char *msg = opjit_errmsg(rt);
    CHECK(msg[0] != '\0');
    return msg;
}

/* ---- schema checks ------------------------------------------------------------------ */

static void a_good_call(void)
{
    float xs[4] = {1, 2, 3, 4}, ys[4] = {10, 20, 30, 40};
    int64_t n4[1] = {4};
    tensor x = mk(xs, F32, 1, n4), y = mk(ys, F32, 1, n4);
    opjit_value args[2] = {opjit_tensor(T(&x)), opjit_tensor(T(&y))};
    DLManagedTensor *out = NULL;
    int rc = opjit_call(rt, op_add, args, 2, &out, 1);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (!out)
        return;
    DLTensor *o = &out->dl_tensor;
    CHECK(o->ndim == 1 && o->shape[0] == 4);
    CHECK(o->dtype.code == kDLFloat && o->dtype.bits == 32 && o->dtype.lanes == 1);
    CHECK(o->device.device_type == kDLCPU);
    CHECK(o->strides == NULL || o->strides[0] == 1);
    CHECK(((uintptr_t)o->data + o->byte_offset) % 16 == 0);
    const float *r = (const float *)((char *)o->data + o->byte_offset);
    for (int i = 0; i < 4; i++)
        CHECK(r[i] == xs[i] + ys[i]);
    out->deleter(out);

    /* Explicit row-major strides are contiguous; byte_offset is honoured. */
    float big[6] = {0, 0, 1, 2, 3, 4};
    tensor xo = mk(big, F32, 1, n4);
    xo.t.byte_offset = 2 * sizeof(float);
    xo.strides[0] = 1;
    xo.t.strides = xo.strides;
    args[0] = opjit_tensor(T(&xo));
    rc = opjit_call(rt, op_add, args, 2, &out, 1);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (rc == OPJIT_OK) {
        r = out->dl_tensor.data;
        CHECK(r[0] == 11 && r[3] == 44);
        out->deleter(out);
    }
}

static void wrong_kind_missing_and_too_many(void)
{
    float xs[3] = {1, 2, 3};
    int64_t n3[1] = {3};
    tensor x = mk(xs, F32, 1, n3);
    const char *msg;

    /* An int where a Tensor goes. */
    opjit_value a1[2] = {opjit_int(3), opjit_tensor(T(&x))};
    msg = call_fails(op_add, a1, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "qac_add");
    CHECK_STR_CONTAINS(msg, "'x'");
    CHECK_STR_CONTAINS(msg, "Tensor");
    CHECK_STR_CONTAINS(msg, "int");

    /* A Tensor where an int goes. */
    opjit_value a2[2] = {opjit_tensor(T(&x)), opjit_tensor(T(&x))};
    msg = call_fails(op_scale, a2, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "qac_scale");
    CHECK_STR_CONTAINS(msg, "'k'");
    CHECK_STR_CONTAINS(msg, "expected int");
    CHECK_STR_CONTAINS(msg, "Tensor");

    /* A float where an int goes: not silently truncated. */
    opjit_value a3[2] = {opjit_tensor(T(&x)), opjit_float(2.5)};
    msg = call_fails(op_scale, a3, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "'k'");
    CHECK_STR_CONTAINS(msg, "float");

    /* A float where a bool goes. */
    opjit_value a3b[3] = {opjit_none(), opjit_none(), opjit_float(1)};
    msg = call_fails(op_defs, a3b, 3, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "'b'");
    CHECK_STR_CONTAINS(msg, "bool");

    /* A kind that does not exist. */
    opjit_value bogus = opjit_int(1);
    bogus.kind = 99;
    opjit_value a3c[2] = {opjit_tensor(T(&x)), bogus};
    msg = call_fails(op_scale, a3c, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "'k'");

    /* A required argument missing: by count, and as None. */
    opjit_value a4[1] = {opjit_tensor(T(&x))};
    msg = call_fails(op_scale, a4, 1, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "qac_scale");
    CHECK_STR_CONTAINS(msg, "missing");
    CHECK_STR_CONTAINS(msg, "'k'");
    opjit_value a5[2] = {opjit_tensor(T(&x)), opjit_none()};
    msg = call_fails(op_scale, a5, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "'k'");
    msg = call_fails(op_scale, NULL, 0, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "'x'");

    /* Too many. */
    opjit_value a6[3] = {opjit_tensor(T(&x)), opjit_int(2), opjit_int(3)};
    msg = call_fails(op_scale, a6, 3, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "qac_scale");
    CHECK_STR_CONTAINS(msg, "2");
    CHECK_STR_CONTAINS(msg, "3");

    /* Too little room for the outputs. */
    float one[1] = {1};
    int64_t n1[1] = {1};
    tensor x1 = mk(one, F32, 1, n1);
    opjit_value a7[1] = {opjit_tensor(T(&x1))};
    DLManagedTensor *outs[2] = {NULL, NULL};
    CHECK(opjit_call(rt, op_two, a7, 1, outs, 1) == OPJIT_ECALL);
    CHECK(outs[0] == NULL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "qac_two");

    /* Bad call arguments. */
    CHECK(opjit_call(rt, NULL, a7, 1, outs, 2) == OPJIT_EINVAL);
    CHECK(opjit_call(rt, op_two, NULL, 1, outs, 2) == OPJIT_EINVAL);
    CHECK(opjit_call(rt, op_two, a7, -1, outs, 2) == OPJIT_EINVAL);
    CHECK(opjit_call(rt, op_two, a7, 1, NULL, 2) == OPJIT_EINVAL);
    CHECK(opjit_call(NULL, op_two, a7, 1, outs, 2) == OPJIT_EINVAL);
    CHECK(outs[0] == NULL && outs[1] == NULL);
}

static void tensor_constraints(void)
{
    double xd[3] = {1, 2, 3};
    float xs[6] = {1, 2, 3, 4, 5, 6}, ys[6] = {0};
    int32_t xi[3] = {1, 2, 3};
    int64_t n3[1] = {3}, m23[2] = {2, 3};
    tensor y = mk(ys, F32, 1, n3);
    const char *msg;

    /* dtype */
    tensor x = mk(xd, F64, 1, n3);
    opjit_value a[2] = {opjit_tensor(T(&x)), opjit_tensor(T(&y))};
    msg = call_fails(op_add, a, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "qac_add");
    CHECK_STR_CONTAINS(msg, "'x'");
    CHECK_STR_CONTAINS(msg, "float32");
    CHECK_STR_CONTAINS(msg, "float64");
    /* dtype of the second argument */
    tensor xf = mk(xs, F32, 1, n3), yi = mk(xi, I32, 1, n3);
    opjit_value b[2] = {opjit_tensor(T(&xf)), opjit_tensor(T(&yi))};
    msg = call_fails(op_add, b, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "'y'");
    CHECK_STR_CONTAINS(msg, "int32");
    /* one of several dtypes */
    tensor xi3 = mk(xi, I32, 1, n3);
    opjit_value c[2] = {opjit_tensor(T(&xi3)), opjit_int(2)};
    msg = call_fails(op_scale, c, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "float32");
    CHECK_STR_CONTAINS(msg, "float64");
    CHECK_STR_CONTAINS(msg, "int32");
    /* lanes are part of the dtype */
    tensor xl = mk(xs, (DLDataType){kDLFloat, 32, 2}, 1, n3);
    opjit_value c2[2] = {opjit_tensor(T(&xl)), opjit_tensor(T(&y))};
    call_fails(op_add, c2, 2, OPJIT_ECALL);

    /* rank */
    tensor x2 = mk(xs, F32, 2, m23);
    opjit_value d[2] = {opjit_tensor(T(&x2)), opjit_tensor(T(&y))};
    msg = call_fails(op_add, d, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "'x'");
    CHECK_STR_CONTAINS(msg, "1-d");
    CHECK_STR_CONTAINS(msg, "2-d");

    /* contiguity: every other element */
    tensor xs2 = mk(xs, F32, 1, n3);
    xs2.strides[0] = 2;
    xs2.t.strides = xs2.strides;
    opjit_value e[2] = {opjit_tensor(T(&xs2)), opjit_tensor(T(&y))};
    msg = call_fails(op_add, e, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "'x'");
    CHECK_STR_CONTAINS(msg, "contiguous");
    /* a transposed 2x3 */
    tensor xt = mk(xs, F32, 2, m23);
    xt.strides[0] = 1;
    xt.strides[1] = 2;
    xt.t.strides = xt.strides;
    opjit_value f[2] = {opjit_tensor(T(&xt)), opjit_int(2)};
    msg = call_fails(op_scale, f, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "contiguous");
    /* an empty tensor is contiguous whatever its strides (numpy's are 0) */
    int64_t m03[2] = {0, 3};
    tensor xe = mk(xs, F32, 2, m03);
    xe.strides[0] = 0;
    xe.strides[1] = 0;
    xe.t.strides = xe.strides;
    opjit_value fe[2] = {opjit_tensor(T(&xe)), opjit_int(2)};
    DLManagedTensor *eout = NULL;
    CHECKF(opjit_call(rt, op_scale, fe, 2, &eout, 1) == OPJIT_OK, "empty, strides 0: %s",
           opjit_errmsg(rt));
    if (eout)
        eout->deleter(eout);

    /* A constraint on an optional argument applies when it is given. */
    tensor of = mk(xs, F32, 1, n3);
    opjit_value g[5] = {opjit_none(), opjit_none(), opjit_none(), opjit_none(),
                        opjit_tensor(T(&of))};
    msg = call_fails(op_defs, g, 5, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "'opt'");
    CHECK_STR_CONTAINS(msg, "int32");
}

static void null_tensors_and_devices(void)
{
    float xs[3] = {1, 2, 3}, ys[3] = {1, 1, 1};
    int64_t n3[1] = {3};
    tensor x = mk(xs, F32, 1, n3), y = mk(ys, F32, 1, n3);
    const char *msg;

    /* A Tensor value holding NULL. */
    opjit_value nullt = {.kind = OPJIT_KIND_TENSOR, .u.tensor = NULL};
    opjit_value a[2] = {opjit_tensor(T(&x)), nullt};
    msg = call_fails(op_add, a, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "qac_add");
    CHECK_STR_CONTAINS(msg, "'y'");
    CHECK_STR_CONTAINS(msg, "NULL");
    /* opjit_tensor(NULL) is None: missing. */
    opjit_value b[2] = {opjit_tensor(NULL), opjit_tensor(T(&y))};
    msg = call_fails(op_add, b, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "'x'");

    /* Tensors on two devices. */
    tensor yc = mk(ys, F32, 1, n3);
    yc.t.device.device_type = kDLCUDA;
    opjit_value c[2] = {opjit_tensor(T(&x)), opjit_tensor(T(&yc))};
    msg = call_fails(op_add, c, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "qac_add");
    CHECK_STR_CONTAINS(msg, "'y'");
    CHECK_STR_CONTAINS(msg, "device");
    /* Two CUDA devices. */
    tensor xc0 = mk(xs, F32, 1, n3), yc1 = mk(ys, F32, 1, n3);
    xc0.t.device.device_type = kDLCUDA;
    yc1.t.device.device_type = kDLCUDA;
    yc1.t.device.device_id = 1;
    opjit_value c2[2] = {opjit_tensor(T(&xc0)), opjit_tensor(T(&yc1))};
    msg = call_fails(op_add, c2, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "'y'");

    /* CUDA tensors for an op with only a CPU kernel. */
    tensor xc = mk(xs, F32, 1, n3);
    xc.t.device.device_type = kDLCUDA;
    opjit_value d[2] = {opjit_tensor(T(&xc)), opjit_tensor(T(&yc))};
    msg = call_fails(op_add, d, 2, OPJIT_ENOKERNEL);
    CHECK_STR_CONTAINS(msg, "qac_add has no CUDA kernel");
    CHECK_STR_CONTAINS(msg, "loaded: cpu from");
    CHECK_STR_CONTAINS(msg, "qac_ops.c");
    /* ... also when the only tensor is a list's neighbour */
    opjit_value d2[2] = {opjit_tensor(T(&xc)), opjit_int(2)};
    msg = call_fails(op_scale, d2, 2, OPJIT_ENOKERNEL);
    CHECK_STR_CONTAINS(msg, "qac_scale has no CUDA kernel");

    /* A device opjit does not know. */
    tensor xv = mk(xs, F32, 1, n3);
    xv.t.device.device_type = kDLVulkan;
    opjit_value e[2] = {opjit_tensor(T(&xv)), opjit_int(2)};
    msg = call_fails(op_scale, e, 2, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "qac_scale");
}

/* Call op_add with x made malformed by how, in a child process so that a
 * crash is a failed check rather than the end of the test; the child's
 * exit status is the call's status. */
static int call_in_child(int how)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        float xs[3] = {1, 2, 3}, ys[3] = {1, 1, 1};
        int64_t n3[1] = {3};
        tensor x = mk(xs, F32, 1, n3), y = mk(ys, F32, 1, n3);
        DLTensor *tx = T(&x);
        if (how == 0)
            tx->shape = NULL; /* ndim 1 without a shape */
        else if (how == 1)
            tx->ndim = -1;
        else if (how == 2)
            x.shape[0] = -3;
        opjit_value a[2] = {opjit_tensor(tx), opjit_tensor(T(&y))};
        DLManagedTensor *out = NULL;
        int rc = opjit_call(rt, op_add, a, 2, &out, 1);
        if (rc == OPJIT_OK)
            out->deleter(out);
        _exit(100 + rc);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0)
        ;
    /* A signal, or a sanitizer's report (exit status 1): a crash. */
    if (!WIFEXITED(st) || WEXITSTATUS(st) < 100)
        return 1000;
    return WEXITSTATUS(st) - 100;
}

static void malformed_tensors(void)
{
    /* A DLTensor that cannot describe any data is a bad call, not a crash. */
    static const char *what[] = {"NULL shape with ndim 1", "negative ndim", "negative size"};
    for (int how = 0; how < 3; how++) {
        int rc = call_in_child(how);
        CHECKF(rc == OPJIT_ECALL || (how == 2 && rc == OPJIT_EKERNEL), "%s: %s", what[how],
               rc >= 1000 ? "the call crashed" : opjit_status_name(rc));
    }
}

/* ---- defaults and conversions --------------------------------------------------------- */

/* Call qac_defs; fills r[11]; returns the status. */
static int defs(const opjit_value *args, int nargs, double r[11])
{
    DLManagedTensor *out = NULL;
    int rc = opjit_call(rt, op_defs, args, nargs, &out, 1);
    if (rc) {
        fprintf(stderr, "  defs: %s\n", opjit_errmsg(rt));
        return rc;
    }
    memcpy(r, out->dl_tensor.data, 11 * sizeof(double));
    CHECK(out->dl_tensor.shape[0] == 11);
    out->deleter(out);
    return rc;
}

static void defaults_fill_in(void)
{
    double r[11];
    /* Everything defaulted. */
    CHECK(defs(NULL, 0, r) == OPJIT_OK);
    CHECK(r[0] == 3);                   /* int i=3 */
    CHECK(r[1] == 0.5);                 /* float f=0.5 */
    CHECK(r[2] == 1);                   /* bool b=True */
    CHECK(r[3] == 7 && r[4] == 7);      /* int[2] pair=7: both entries */
    CHECK(r[5] == 2);                   /* its length */
    CHECK(r[6] == 0 && r[7] == -1);     /* Tensor? opt=None: NULL */
    CHECK(r[8] == 321);                 /* int[3] trip=[1, 2, 3] */
    CHECK(r[9] == OPJIT_KIND_FLOAT);
    CHECK(r[10] == 6);                  /* the kernel sees every argument */

    /* Given values. */
    int64_t pair[2] = {4, 5}, trip[3] = {7, 8, 9};
    int32_t od[4] = {1, 2, 3, 4};
    int64_t n4[1] = {4};
    tensor opt = mk(od, I32, 1, n4);
    opjit_value a[6] = {opjit_int(-8), opjit_float(1.25), opjit_bool(0),
                        opjit_ints(pair, 2), opjit_tensor(T(&opt)), opjit_ints(trip, 3)};
    CHECK(defs(a, 6, r) == OPJIT_OK);
    CHECK(r[0] == -8 && r[1] == 1.25 && r[2] == 0);
    CHECK(r[3] == 4 && r[4] == 5 && r[5] == 2);
    CHECK(r[6] == 1 && r[7] == 4);
    CHECK(r[8] == 987);

    /* None in the middle takes the default; later ones still count. */
    opjit_value b[3] = {opjit_none(), opjit_none(), opjit_bool(0)};
    CHECK(defs(b, 3, r) == OPJIT_OK);
    CHECK(r[0] == 3 && r[1] == 0.5 && r[2] == 0);

    /* An int for a float is accepted and converted. */
    opjit_value c[2] = {opjit_int(1), opjit_int(2)};
    CHECK(defs(c, 2, r) == OPJIT_OK);
    CHECK(r[1] == 2.0);
    CHECK(r[9] == OPJIT_KIND_FLOAT);

    /* A single int for int[N]: expanded to every entry. */
    opjit_value d[4] = {opjit_none(), opjit_none(), opjit_none(), opjit_int(-6)};
    CHECK(defs(d, 4, r) == OPJIT_OK);
    CHECK(r[3] == -6 && r[4] == -6 && r[5] == 2);
    opjit_value d3[6] = {opjit_none(), opjit_none(), opjit_none(),
                         opjit_none(), opjit_none(), opjit_int(4)};
    CHECK(defs(d3, 6, r) == OPJIT_OK);
    CHECK(r[8] == 444);

    /* Lists of the wrong length. */
    int64_t three[3] = {1, 2, 3};
    opjit_value e[4] = {opjit_none(), opjit_none(), opjit_none(), opjit_ints(three, 3)};
    const char *msg = call_fails(op_defs, e, 4, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "qac_defs");
    CHECK_STR_CONTAINS(msg, "'pair'");
    CHECK_STR_CONTAINS(msg, "int[2]");
    CHECK_STR_CONTAINS(msg, "3");
    opjit_value e1[4] = {opjit_none(), opjit_none(), opjit_none(), opjit_ints(three, 1)};
    msg = call_fails(op_defs, e1, 4, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "'pair'");
    opjit_value e0[4] = {opjit_none(), opjit_none(), opjit_none(), opjit_ints(NULL, 2)};
    call_fails(op_defs, e0, 4, OPJIT_ECALL);
    /* A float for an int list. */
    opjit_value e2[4] = {opjit_none(), opjit_none(), opjit_none(), opjit_float(2)};
    msg = call_fails(op_defs, e2, 4, OPJIT_ECALL);
    CHECK_STR_CONTAINS(msg, "'pair'");

    /* The defaults are not changed by calls that gave values. */
    CHECK(defs(NULL, 0, r) == OPJIT_OK);
    CHECK(r[3] == 7 && r[4] == 7 && r[8] == 321 && r[6] == 0);
}

static void several_outputs(void)
{
    float xs[5] = {1, 2, 3, 4, 5};
    int64_t n5[1] = {5};
    tensor x = mk(xs, F32, 1, n5);
    opjit_value a[1] = {opjit_tensor(T(&x))};
    DLManagedTensor *outs[3] = {NULL, NULL, (DLManagedTensor *)&x};
    int rc = opjit_call(rt, op_two, a, 1, outs, 3);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (rc)
        return;
    CHECK(outs[0] && outs[1] && outs[0] != outs[1]);
    CHECK(outs[2] == (DLManagedTensor *)&x); /* beyond the op's outputs: untouched */
    DLTensor *o0 = &outs[0]->dl_tensor, *o1 = &outs[1]->dl_tensor;
    CHECK(o0->ndim == 1 && o0->shape[0] == 5);
    for (int i = 0; i < 5; i++)
        CHECK(((float *)o0->data)[i] == 2 * xs[i]);
    CHECK(o1->ndim == 0);
    CHECK(o1->dtype.code == kDLFloat && o1->dtype.bits == 64);
    CHECK(*(double *)o1->data == 15);
    /* Outputs are independent: free in any order. */
    outs[1]->deleter(outs[1]);
    CHECK(((float *)o0->data)[4] == 10);
    outs[0]->deleter(outs[0]);
    opjit_op_info info = {.size = sizeof info};
    CHECK(opjit_op_info_get(rt, op_two, &info) == OPJIT_OK && info.nouts == 2);
}

/* ---- kernels that fail ------------------------------------------------------------------ */

static const char *fail_mode(int mode, int status)
{
    opjit_value a[1] = {opjit_int(mode)};
    return call_fails(op_fail, a, 1, status);
}

static void kernel_failures(void)
{
    const char *msg;
    /* opjit_fail after making both outputs: both freed (ASan would see). */
    msg = fail_mode(0, OPJIT_EKERNEL);
    CHECKF(!strncmp(msg, "qac_fail: ", 10), "not prefixed by the op: '%s'", msg);
    CHECK_STR_CONTAINS(msg, "bad thing 42 happened to the input");

    msg = fail_mode(1, OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(msg, "qac_fail");
    CHECK_STR_CONTAINS(msg, "5");

    msg = fail_mode(2, OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(msg, "qac_fail");
    CHECK_STR_CONTAINS(msg, "output 1");

    msg = fail_mode(3, OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(msg, "qac_fail");
    CHECK_STR_CONTAINS(msg, "twice");

    msg = fail_mode(5, OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(msg, "output 2");

    msg = fail_mode(6, OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(msg, "quietly broken");

    msg = fail_mode(7, OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(msg, "first failure");
    CHECK(strstr(msg, "second failure") == NULL);

    msg = fail_mode(8, OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(msg, "-1");

    msg = fail_mode(9, OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(msg, "dtype");

    opjit_value a10[1] = {opjit_int(10)};
    DLManagedTensor *o10[2] = {NULL, NULL};
    int rc = opjit_call(rt, op_fail, a10, 1, o10, 2);
    CHECKF(rc == OPJIT_ENOMEM || rc == OPJIT_EKERNEL, "huge output: %s", opjit_status_name(rc));
    CHECK(o10[0] == NULL && o10[1] == NULL);

    /* Workspace sizes that overflow any rounding. */
    for (int mode = 11; mode <= 12; mode++) {
        opjit_value am[1] = {opjit_int(mode)};
        DLManagedTensor *om[2] = {NULL, NULL};
        rc = opjit_call(rt, op_fail, am, 1, om, 2);
        CHECKF(rc == OPJIT_ENOMEM, "mode %d: %s: %s", mode, opjit_status_name(rc),
               opjit_errmsg(rt));
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "memory");
        CHECK(om[0] == NULL && om[1] == NULL);
    }

    msg = fail_mode(99, OPJIT_EKERNEL);
    CHECK_STR_CONTAINS(msg, "unknown mode 99");

    /* After all that, the op works and errors stay per call. */
    opjit_value a[1] = {opjit_int(4)};
    DLManagedTensor *outs[2] = {NULL, NULL};
    rc = opjit_call(rt, op_fail, a, 1, outs, 2);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (rc == OPJIT_OK) {
        CHECK(((int32_t *)outs[0]->dl_tensor.data)[100] == 0);
        CHECK(((int32_t *)outs[1]->dl_tensor.data)[100] == 0x01010101);
        outs[0]->deleter(outs[0]);
        outs[1]->deleter(outs[1]);
    }
    /* Many failing calls in a row leak nothing (ASan counts). */
    for (int i = 0; i < 50; i++) {
        opjit_value m[1] = {opjit_int(i % 4)};
        DLManagedTensor *o[2] = {NULL, NULL};
        rc = opjit_call(rt, op_fail, m, 1, o, 2);
        CHECK(rc == OPJIT_EKERNEL && !o[0] && !o[1]);
    }
}

/* ---- workspace -------------------------------------------------------------------------- */

static int cmp_i64(const void *a, const void *b)
{
    int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
    return (x > y) - (x < y);
}

/* n regions of size + i*grow: distinct, non-overlapping, cache-line aligned, intact. */
static void ws_call(int n, int64_t size, int64_t grow)
{
    opjit_value a[3] = {opjit_int(n), opjit_int(size), opjit_int(grow)};
    DLManagedTensor *out = NULL;
    int rc = opjit_call(rt, op_ws, a, 3, &out, 1);
    CHECKF(rc == OPJIT_OK, "ws(%d, %lld, %lld): %s", n, (long long)size, (long long)grow,
           opjit_errmsg(rt));
    if (rc)
        return;
    int64_t *addr = out->dl_tensor.data;
    struct {
        int64_t start, end;
    } r[64];
    for (int i = 0; i < n; i++) {
        CHECKF(addr[i] % 64 == 0, "workspace %d is not 64-byte aligned (a cache line)", i);
        r[i].start = addr[i];
        r[i].end = addr[i] + size + i * grow;
    }
    qsort(r, (size_t)n, sizeof r[0], cmp_i64);
    for (int i = 1; i < n; i++)
        CHECKF(r[i - 1].end <= r[i].start, "workspaces overlap (n=%d size=%lld)", n,
               (long long)size);
    out->deleter(out);
}

static void workspaces(void)
{
    ws_call(1, 64, 0);
    ws_call(4, 1000, 0);
    ws_call(8, 1, 0);            /* tiny, rounded */
    ws_call(3, 1 << 20, 0);      /* large */
    ws_call(5, 100, 0);          /* then small: reuses the arena */
    ws_call(2, 4 << 20, 0);      /* larger than before: grows */
    ws_call(16, 64, 0);
    ws_call(6, 10, 100000);      /* mixed sizes in one call */
    ws_call(64, 4096, 0);
    ws_call(1, 1, 0);
    for (int i = 0; i < 20; i++)
        ws_call(1 + i % 7, (int64_t)(i % 3 ? 200 : 300000), i % 2 ? 50 : 0);
}

int main(void)
{
    setup();
    T_RUN(a_good_call);
    T_RUN(wrong_kind_missing_and_too_many);
    T_RUN(tensor_constraints);
    T_RUN(null_tensors_and_devices);
    T_RUN(malformed_tensors);
    T_RUN(defaults_fill_in);
    T_RUN(several_outputs);
    T_RUN(kernel_failures);
    T_RUN(workspaces);
    teardown();
    return t_done();
}
