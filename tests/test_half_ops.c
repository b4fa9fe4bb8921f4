/* tests/test_half_ops.c - mm and conv2d (forward, conv2d.padding, and the
 * backward ops) in float16 and bfloat16 on the CPU, in both tiers.
 *
 * The 16-bit result must be, bit for bit, the float32 op's result on the
 * widened inputs, rounded once: the float32 paths are deterministic, so
 * "computed in float32, rounded once at the end" has exactly one answer.
 * Mixed dtypes are refused as torch refuses them, and the shape rules say
 * the output has the input's dtype. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "opjit.h"
#include "t.h"

#define MAXT 4

enum { F16, BF16 };

static DLDataType dt16(int kind)
{
    return (DLDataType){(uint8_t)(kind == F16 ? kDLFloat : kDLBfloat), 16, 1};
}

static uint16_t narrow(int kind, float f)
{
    return kind == F16 ? opjit_f32_to_f16(f) : opjit_f32_to_bf16(f);
}

static float widen(int kind, uint16_t h)
{
    return kind == F16 ? opjit_f16_to_f32(h) : opjit_bf16_to_f32(h);
}

/* A tensor in both forms: 16-bit values and their exact float32 widening. */
typedef struct pair {
    int64_t shape[4], n;
    int ndim;
    uint16_t *h;
    float *f;
    DLTensor th, tf;
} pair;

static uint32_t rng = 12345;
static float rnd(void)
{
    rng = rng * 1103515245u + 12345u;
    return (float)((rng >> 8) & 0xffff) / 32768.0f - 1.0f;
}

static void pair_init(pair *p, int kind, int ndim, const int64_t *shape)
{
    p->ndim = ndim;
    p->n = 1;
    for (int i = 0; i < ndim; i++)
        p->n *= p->shape[i] = shape[i];
    p->h = malloc((size_t)(p->n ? p->n : 1) * 2);
    p->f = malloc((size_t)(p->n ? p->n : 1) * 4);
    for (int64_t i = 0; i < p->n; i++) {
        p->h[i] = narrow(kind, rnd() * 3.0f);
        p->f[i] = widen(kind, p->h[i]);
    }
    p->th = (DLTensor){p->h, {kDLCPU, 0}, ndim, dt16(kind), p->shape, NULL, 0};
    p->tf = (DLTensor){p->f, {kDLCPU, 0}, ndim, {kDLFloat, 32, 1}, p->shape, NULL, 0};
}

static void pair_free(pair *p)
{
    free(p->h);
    free(p->f);
}

static int64_t numel(const DLTensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}

/* op(h args) against round(op(f args)): every output, bit for bit, and its
 * dtype the 16-bit one. hv/fv are the argument lists. */
static void same_bits(opjit_runtime *rt, const char *name, int kind, const char *what,
                      opjit_value *hv, opjit_value *fv, int nargs, int nouts)
{
    opjit_op *op = NULL;
    DLManagedTensor *ho[3] = {0}, *fo[3] = {0};
    CHECKF(opjit_find_op(rt, name, &op) == OPJIT_OK, "%s: %s", name, opjit_errmsg(rt));
    if (!op)
        return;
    int rh = opjit_call(rt, op, hv, nargs, ho, nouts);
    CHECKF(rh == OPJIT_OK, "%s (%s): %s", what, kind == F16 ? "f16" : "bf16", opjit_errmsg(rt));
    int rf = opjit_call(rt, op, fv, nargs, fo, nouts);
    CHECKF(rf == OPJIT_OK, "%s float32: %s", what, opjit_errmsg(rt));
    for (int o = 0; o < nouts && rh == OPJIT_OK && rf == OPJIT_OK; o++) {
        DLTensor *a = &ho[o]->dl_tensor, *b = &fo[o]->dl_tensor;
        int64_t n = numel(b), bad = 0;
        CHECKF(a->dtype.code == dt16(kind).code && a->dtype.bits == 16, "%s: output %d dtype",
               what, o);
        CHECKF(numel(a) == n, "%s: output %d has %lld elements, float32 %lld", what, o,
               (long long)numel(a), (long long)n);
        for (int64_t i = 0; i < n && numel(a) == n; i++)
            bad += ((uint16_t *)a->data)[i] != narrow(kind, ((float *)b->data)[i]);
        CHECKF(bad == 0, "%s (%s), output %d: %lld of %lld differ from round(float32)", what,
               kind == F16 ? "f16" : "bf16", o, (long long)bad, (long long)n);
    }
    for (int o = 0; o < 3; o++) {
        if (ho[o])
            ho[o]->deleter(ho[o]);
        if (fo[o])
            fo[o]->deleter(fo[o]);
    }
}

static void mm_cases(opjit_runtime *rt, int kind)
{
    static const int64_t sizes[][3] = {{37, 53, 29}, {300, 200, 500}, {1, 0, 3}, {0, 4, 5}};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        int64_t n = sizes[s][0], k = sizes[s][1], m = sizes[s][2];
        pair x, y, g;
        pair_init(&x, kind, 2, (int64_t[]){n, k});
        pair_init(&y, kind, 2, (int64_t[]){k, m});
        pair_init(&g, kind, 2, (int64_t[]){n, m});
        opjit_value hv[3] = {opjit_tensor(&x.th), opjit_tensor(&y.th)};
        opjit_value fv[3] = {opjit_tensor(&x.tf), opjit_tensor(&y.tf)};
        same_bits(rt, "mm", kind, "mm", hv, fv, 2, 1);
        opjit_value hb[3] = {opjit_tensor(&g.th), opjit_tensor(&x.th), opjit_tensor(&y.th)};
        opjit_value fb[3] = {opjit_tensor(&g.tf), opjit_tensor(&x.tf), opjit_tensor(&y.tf)};
        same_bits(rt, "mm_backward", kind, "mm_backward", hb, fb, 3, 2);
        pair_free(&x);
        pair_free(&y);
        pair_free(&g);
    }
    /* a transposed view of self: the data of [k, n], read as [n, k]; the
     * float32 reference gets the same view */
    pair x, y;
    pair_init(&x, kind, 2, (int64_t[]){40, 70});
    pair_init(&y, kind, 2, (int64_t[]){40, 30});
    int64_t st[2] = {1, 70}, sh[2] = {70, 40};
    x.th.shape = x.tf.shape = sh;
    x.th.strides = x.tf.strides = st;
    opjit_value hv[2] = {opjit_tensor(&x.th), opjit_tensor(&y.th)};
    opjit_value fv[2] = {opjit_tensor(&x.tf), opjit_tensor(&y.tf)};
    /* the float32 path reads the view in place, the 16-bit one a dense copy:
     * one chain of float32 products each way, the same bits */
    same_bits(rt, "mm", kind, "mm transposed self", hv, fv, 2, 1);
    pair_free(&x);
    pair_free(&y);
}

/* conv2d and its gradients over one geometry: input [n, c, hw, hw],
 * weight [o, c/groups, k, k], bias [o]. pad_str: conv2d.padding's. */
static void conv_case(opjit_runtime *rt, int kind, const char *what, int64_t n, int64_t c,
                      int64_t hw, int64_t o, int64_t k, int64_t stride, int64_t pad,
                      int64_t groups, const char *pad_str)
{
    pair x, w, b, g;
    pair_init(&x, kind, 4, (int64_t[]){n, c, hw, hw});
    pair_init(&w, kind, 4, (int64_t[]){o, c / groups, k, k});
    pair_init(&b, kind, 1, (int64_t[]){o});
    int64_t ho = pad_str ? hw : (hw + 2 * pad - k) / stride + 1;
    if (pad_str && !strcmp(pad_str, "valid"))
        ho = hw - k + 1;
    pair_init(&g, kind, 4, (int64_t[]){n, o, ho, ho});
    int64_t st[2] = {stride, stride}, pd[2] = {pad, pad}, dl[2] = {1, 1};
    opjit_value padv = pad_str ? opjit_str(pad_str) : opjit_ints(pd, 2);
    opjit_value hv[8] = {opjit_tensor(&x.th), opjit_tensor(&w.th), opjit_tensor(&b.th),
                         opjit_ints(st, 2), padv, opjit_ints(dl, 2), opjit_int(groups)};
    opjit_value fv[8] = {opjit_tensor(&x.tf), opjit_tensor(&w.tf), opjit_tensor(&b.tf),
                         opjit_ints(st, 2), padv, opjit_ints(dl, 2), opjit_int(groups)};
    same_bits(rt, pad_str ? "conv2d.padding" : "conv2d", kind, what, hv, fv, 7, 1);
    opjit_value hb[8] = {opjit_tensor(&g.th), opjit_tensor(&x.th), opjit_tensor(&w.th),
                         opjit_tensor(&b.th), opjit_ints(st, 2), padv, opjit_ints(dl, 2),
                         opjit_int(groups)};
    opjit_value fb[8] = {opjit_tensor(&g.tf), opjit_tensor(&x.tf), opjit_tensor(&w.tf),
                         opjit_tensor(&b.tf), opjit_ints(st, 2), padv, opjit_ints(dl, 2),
                         opjit_int(groups)};
    same_bits(rt, pad_str ? "conv2d_backward.padding" : "conv2d_backward", kind, what, hb, fb,
              8, 3);
    pair_free(&x);
    pair_free(&w);
    pair_free(&b);
    pair_free(&g);
}

static void conv_cases(opjit_runtime *rt, int kind)
{
    conv_case(rt, kind, "conv2d 3x3 stride 1 (Winograd in the opt tier)", 2, 16, 20, 24, 3, 1,
              1, 1, NULL);
    conv_case(rt, kind, "conv2d 3x3 stride 2 groups 2", 2, 8, 13, 6, 3, 2, 1, 2, NULL);
    conv_case(rt, kind, "conv2d 1x1", 1, 32, 7, 40, 1, 1, 0, 1, NULL);
    conv_case(rt, kind, "conv2d.padding same 5x5", 1, 4, 11, 6, 5, 1, 0, 1, "same");
    conv_case(rt, kind, "conv2d.padding valid", 2, 3, 9, 5, 3, 1, 0, 1, "valid");
}

/* One operand of another dtype: refused, with torch's wording. */
static void mixed_dtypes_refused(opjit_runtime *rt)
{
    pair a, b;
    pair_init(&a, F16, 2, (int64_t[]){3, 4});
    pair_init(&b, BF16, 2, (int64_t[]){4, 5});
    opjit_op *mm = NULL, *conv = NULL;
    DLManagedTensor *out = NULL;
    CHECK(opjit_find_op(rt, "mm", &mm) == OPJIT_OK);
    opjit_value v[2] = {opjit_tensor(&a.th), opjit_tensor(&b.th)};
    CHECK(mm && opjit_call(rt, mm, v, 2, &out, 1) != OPJIT_OK);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "mat2 dtype (bfloat16) must match self dtype (float16)");
    v[1] = opjit_tensor(&b.tf);
    b.tf.shape[0] = 4;
    CHECK(mm && opjit_call(rt, mm, v, 2, &out, 1) != OPJIT_OK);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "mat2 dtype (float32) must match self dtype (float16)");
    pair x, w;
    pair_init(&x, F16, 4, (int64_t[]){1, 2, 5, 5});
    pair_init(&w, F16, 4, (int64_t[]){3, 2, 3, 3});
    CHECK(opjit_find_op(rt, "conv2d", &conv) == OPJIT_OK);
    opjit_value cv[2] = {opjit_tensor(&x.th), opjit_tensor(&w.tf)};
    CHECK(conv && opjit_call(rt, conv, cv, 2, &out, 1) != OPJIT_OK);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "Input type (c10::Half) and weight type (float)");
    /* int32 is still refused by the schema, before the kernel */
    int32_t i32[20] = {0};
    DLTensor ti = {i32, {kDLCPU, 0}, 2, {kDLInt, 32, 1}, a.shape, NULL, 0};
    v[0] = opjit_tensor(&ti);
    CHECK(mm && opjit_call(rt, mm, v, 2, &out, 1) == OPJIT_ECALL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "float32 or float64 or float16 or bfloat16, got int32");
    /* the shape rules: the output has the input's dtype */
    opjit_out_shape s[2];
    v[0] = opjit_tensor(&a.th);
    v[1] = opjit_tensor(&a.th);
    int64_t sq[2] = {4, 3};
    a.th.shape = a.shape;
    DLTensor at = a.th;
    at.shape = sq;
    v[1] = opjit_tensor(&at);
    CHECKF(mm && opjit_output_shapes(rt, mm, v, 2, s, 1) == OPJIT_OK, "%s", opjit_errmsg(rt));
    CHECK(s[0].dtype.code == kDLFloat && s[0].dtype.bits == 16 && s[0].shape[0] == 3 &&
          s[0].shape[1] == 3);
    cv[1] = opjit_tensor(&w.th);
    CHECKF(conv && opjit_output_shapes(rt, conv, cv, 2, s, 1) == OPJIT_OK, "%s",
           opjit_errmsg(rt));
    CHECK(s[0].dtype.code == kDLFloat && s[0].dtype.bits == 16 && s[0].shape[1] == 3);
    pair_free(&a);
    pair_free(&b);
    pair_free(&x);
    pair_free(&w);
}

static void run_tier(int tiering)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = tiering;
    cfg.num_threads = 2;
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    if (!rt)
        return;
    opjit_op *op = NULL;
    CHECKF(opjit_load_op(rt, "mm", &op) == OPJIT_OK, "%s", opjit_errmsg(rt));
    CHECKF(opjit_load_op(rt, "conv2d", &op) == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (tiering)
        CHECKF(opjit_wait(rt) == OPJIT_OK, "%s", opjit_errmsg(rt));
    opjit_op_info info = {.size = sizeof info};
    CHECK(op && opjit_op_info_get(rt, op, &info) == OPJIT_OK);
    if (op)
        CHECK_STR_CONTAINS(info.tier[OPJIT_CPU], tiering ? "opt" : "tcc");
    for (int kind = F16; kind <= BF16; kind++) {
        mm_cases(rt, kind);
        conv_cases(rt, kind);
    }
    mixed_dtypes_refused(rt);
    opjit_destroy(rt);
}

static void baseline_tier(void) { run_tier(0); }

static void optimizing_tier(void)
{
    if (getenv("OPJIT_CC") && *getenv("OPJIT_CC"))
        run_tier(1);
}

int main(void)
{
    T_RUN(baseline_tier);
    T_RUN(optimizing_tier);
    return t_done();
}
