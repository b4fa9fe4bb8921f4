/* tests/test_half_ops.c - mm and conv2d (forward, conv2d.padding, and the
 * backward ops) in float16 and bfloat16 on the CPU, in both tiers.
 *
 * On the widening path ($OPJIT_HALF_KERNEL=wide in the optimizing tier,
 * the only one in the baseline tier) the 16-bit result must be, bit for
 * bit, the float32 op's result on the widened inputs, rounded once: the
 * float32 paths are deterministic, so "computed in float32, rounded once
 * at the end" has exactly one answer. bfloat16 on an AVX512_BF16 CPU in
 * the optimizing tier (gemm_half.h, vdpbf16ps) sums in float32 in another
 * order: each element within the bound of a float32 sum over k rounded
 * once, against a float64 reference, on random and adversarial inputs
 * (large magnitudes, subnormals, infinities), the same bits for 1 and 2
 * threads; bfloat16 mm_backward also on operands whose float32 sums are
 * exact (multiples of 1/4), where every path at every CPU level and
 * thread count must give round(float64 sum) bit for bit, each operand
 * row-major, transposed or a slice of wider rows, and with a subnormal in
 * one operand, which the scans must see. Where the CPU has AMX (AMX-TILE,
 * AMX-BF16), the same checks
 * run again with the tile kernels forced ($OPJIT_HALF_KERNEL=amx), on
 * shapes that reach each of their paths; elsewhere they are skipped, said
 * on stderr, and "amx" must be an error that says why. float16 mm in the
 * optimizing tier (the float32 GEMM converting while it packs, mm.c) must
 * give the widening path's bits at each CPU level the tier builds, on
 * adversarial operands and views, within the float64 bound, for any
 * thread count. Mixed dtypes are
 * refused as torch refuses them, and the shape rules say the output has
 * the input's dtype. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opjit.h"
#include "t.h"

#if defined(__GNUC__) && defined(__x86_64__)
#include <cpuid.h>
#endif

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
static void conv_case(opjit_runtime *rt, int tiering, int kind, const char *what, int64_t n,
                      int64_t c, int64_t hw, int64_t o, int64_t k, int64_t stride, int64_t pad,
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
    /* the 16-bit forward never takes Winograd (its error with mixed
     * magnitudes): its bits are the GEMM path's, the float32 op's elsewhere;
     * that case is held to the float64 bound below and, with its gradient,
     * to torch's error in test_py_half */
    if (!strstr(what, "Winograd") || !tiering)
        same_bits(rt, pad_str ? "conv2d.padding" : "conv2d", kind, what, hv, fv, 7, 1);
    opjit_value hb[8] = {opjit_tensor(&g.th), opjit_tensor(&x.th), opjit_tensor(&w.th),
                         opjit_tensor(&b.th), opjit_ints(st, 2), padv, opjit_ints(dl, 2),
                         opjit_int(groups)};
    opjit_value fb[8] = {opjit_tensor(&g.tf), opjit_tensor(&x.tf), opjit_tensor(&w.tf),
                         opjit_tensor(&b.tf), opjit_ints(st, 2), padv, opjit_ints(dl, 2),
                         opjit_int(groups)};
    /* and neither does its grad_input (a convolution of the gradient) */
    if (!strstr(what, "Winograd") || !tiering)
        same_bits(rt, pad_str ? "conv2d_backward.padding" : "conv2d_backward", kind, what, hb,
                  fb, 8, 3);
    pair_free(&x);
    pair_free(&w);
    pair_free(&b);
    pair_free(&g);
}

static void conv_cases(opjit_runtime *rt, int tiering, int kind)
{
    conv_case(rt, tiering, kind, "conv2d 3x3 stride 1 (Winograd in the opt tier)", 2, 16, 20,
              24, 3, 1, 1, 1, NULL);
    conv_case(rt, tiering, kind, "conv2d 3x3 stride 2 groups 2", 2, 8, 13, 6, 3, 2, 1, 2, NULL);
    conv_case(rt, tiering, kind, "conv2d 1x1", 1, 32, 7, 40, 1, 1, 0, 1, NULL);
    conv_case(rt, tiering, kind, "conv2d.padding same 5x5", 1, 4, 11, 6, 5, 1, 0, 1, "same");
    conv_case(rt, tiering, kind, "conv2d.padding valid", 2, 3, 9, 5, 3, 1, 0, 1, "valid");
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

static opjit_runtime *new_runtime(int tiering, int threads)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = tiering;
    cfg.num_threads = threads;
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    if (!rt)
        return NULL;
    opjit_op *op = NULL;
    CHECKF(opjit_load_op(rt, "mm", &op) == OPJIT_OK, "%s", opjit_errmsg(rt));
    CHECKF(opjit_load_op(rt, "conv2d", &op) == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (tiering)
        CHECKF(opjit_wait(rt) == OPJIT_OK, "%s", opjit_errmsg(rt));
    return rt;
}

static void run_tier(int tiering)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = tiering;
    cfg.num_threads = 2;
    setenv("OPJIT_HALF_KERNEL", "wide", 1); /* the bit-exact checks: the widening path */
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
        conv_cases(rt, tiering, kind);
    }
    mixed_dtypes_refused(rt);
    unsetenv("OPJIT_HALF_KERNEL");
    opjit_destroy(rt);
}

static void baseline_tier(void) { run_tier(0); }

static void optimizing_tier(void)
{
    if (getenv("OPJIT_CC") && *getenv("OPJIT_CC"))
        run_tier(1);
}

/* ---- bfloat16 on the vdpbf16ps GEMM (the optimizing tier where the CPU has
 * AVX512_BF16; elsewhere these run the widening path, within the same
 * bound) ---------------------------------------------------------------- */

static int opt_tier(void) { return getenv("OPJIT_CC") && *getenv("OPJIT_CC"); }
static void bf16_within_float32_bound(void);

/* Whether the optimizing tier here has gemm_half.h's AMX kernels: CPUID
 * leaf 7 (EDX bit 22 AMX-BF16, bit 24 AMX-TILE) and AVX512_BF16 (Linux,
 * since 5.16, grants the tile state to a process that asks). */
static int amx_here(void)
{
#if defined(__GNUC__) && defined(__x86_64__) && defined(__linux__)
    unsigned a, b, c, d;
    __builtin_cpu_init();
    return opt_tier() && __builtin_cpu_supports("avx512bf16") &&
           __get_cpuid_count(7, 0, &a, &b, &c, &d) && (d >> 22 & 1) && (d >> 24 & 1);
#else
    return 0;
#endif
}

/* got (bfloat16) against ref (float64), mag = the sum of |products|, k
 * terms: a float32 sum over k rounded once to bfloat16 is within
 * 2^-8 (|ref| + e) + e of ref, e = k 2^-24 mag (plus k 2^-125: float32
 * sums below 2^-126 may be flushed to zero, as vdpbf16ps does). NaN and
 * the infinities must match. */
static int within(uint16_t got16, double ref, double mag, int64_t k)
{
    double got = opjit_bf16_to_f32(got16);
    double e = (double)k * ldexp(1.0, -24) * mag * 1.01 + (double)k * ldexp(1.0, -125);
    if (isnan(ref))
        return isnan(got);
    if (isinf(ref))
        return got == ref;
    return fabs(got - ref) <= ldexp(1.0, -8) * (fabs(ref) + e) + e;
}

/* Random bfloat16 values, some of them adversarial: large magnitudes
 * (sums stay below float32's range), subnormals where asked (sub), one
 * infinity where asked (inf). */
static void adversarial(pair *p, int sub, int inf)
{
    for (int64_t i = 0; i < p->n; i++) {
        uint32_t r = (uint32_t)(rnd() * 1000.0f + 1000.0f);
        if (r % 17 == 0)
            p->h[i] = opjit_f32_to_bf16(rnd() * 1e16f);
        else if (sub && r % 19 == 0)
            p->h[i] = (uint16_t)(0x0001u + r % 0x7fu); /* subnormal */
        p->f[i] = opjit_bf16_to_f32(p->h[i]);
    }
    if (inf && p->n > 1) {
        p->h[p->n / 2] = 0x7f80u;
        p->f[p->n / 2] = opjit_bf16_to_f32(0x7f80u);
    }
}

/* op(v) into out (nouts outputs): 1, or 0 with a failed check. */
static int call(opjit_runtime *rt, const char *name, opjit_value *v, int nargs,
                DLManagedTensor **out, int nouts)
{
    opjit_op *op = NULL;
    CHECKF(opjit_find_op(rt, name, &op) == OPJIT_OK, "%s: %s", name, opjit_errmsg(rt));
    int rc = op ? opjit_call(rt, op, v, nargs, out, nouts) : OPJIT_ECALL;
    CHECKF(rc == OPJIT_OK, "%s: %s", name, opjit_errmsg(rt));
    return rc == OPJIT_OK;
}

/* A result's bound: within (bfloat16) or within_f16 (float16). */
typedef int (*bound_fn)(uint16_t got16, double ref, double mag, int64_t k);

/* A [n, k] (element (i, q) at a[i * sa + q * sq]) times B [k, m] (element
 * (q, j) at b[q * sb + j * sj]) in float64 against got [n, m] (16-bit):
 * how many are outside the bound ok. */
static int64_t mm_bad(bound_fn ok, const float *a, int64_t sa, int64_t sq, const float *b,
                      int64_t sb, int64_t sj, const uint16_t *got, int64_t n, int64_t k, int64_t m)
{
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            double ref = 0, mag = 0;
            for (int64_t q = 0; q < k; q++) {
                double t = (double)a[i * sa + q * sq] * (double)b[q * sb + j * sj];
                ref += t;
                mag += fabs(t);
            }
            bad += !ok(got[i * m + j], ref, mag, k);
        }
    return bad;
}

/* adv: 0 random, 1 large magnitudes and subnormals, 2 also an infinity,
 * 3 large magnitudes and an infinity, no subnormal (the GEMM itself). */
static void mm_bound_case(opjit_runtime *rt, int64_t n, int64_t k, int64_t m, int adv)
{
    pair x, y, g;
    DLManagedTensor *o[2] = {0};
    pair_init(&x, BF16, 2, (int64_t[]){n, k});
    pair_init(&y, BF16, 2, (int64_t[]){k, m});
    pair_init(&g, BF16, 2, (int64_t[]){n, m});
    if (adv) {
        adversarial(&x, adv < 3, adv > 1);
        adversarial(&y, adv < 3, 0);
        adversarial(&g, adv < 3, 0);
    }
    opjit_value v[3] = {opjit_tensor(&x.th), opjit_tensor(&y.th)};
    if (call(rt, "mm", v, 2, o, 1)) {
        int64_t bad = mm_bad(within, x.f, k, 1, y.f, m, 1, o[0]->dl_tensor.data, n, k, m);
        CHECKF(bad == 0, "mm %lldx%lldx%lld (adversarial %d): %lld outside the bound",
               (long long)n, (long long)k, (long long)m, adv, (long long)bad);
        o[0]->deleter(o[0]);
    }
    /* mm_backward: grad mat2^T [n, k] and self^T grad [k, m] */
    opjit_value b[3] = {opjit_tensor(&g.th), opjit_tensor(&x.th), opjit_tensor(&y.th)};
    if (call(rt, "mm_backward", b, 3, o, 2)) {
        int64_t bad = mm_bad(within, g.f, m, 1, y.f, 1, m, o[0]->dl_tensor.data, n, m, k) +
                      mm_bad(within, x.f, 1, k, g.f, m, 1, o[1]->dl_tensor.data, k, n, m);
        CHECKF(bad == 0, "mm_backward %lldx%lldx%lld (adversarial %d): %lld outside the bound",
               (long long)n, (long long)k, (long long)m, adv, (long long)bad);
        o[0]->deleter(o[0]);
        o[1]->deleter(o[1]);
    }
    pair_free(&x);
    pair_free(&y);
    pair_free(&g);
}

/* Output element i of conv2d over x [n, c, hw, hw], w [o, c/groups, k, k],
 * bias b, stride s, padding p, in float64, and the sum of |terms|. */
static double conv_ref(const pair *x, const pair *w, const pair *b, int64_t i, int64_t s,
                       int64_t p, int64_t d, int64_t groups, double *mag)
{
    int64_t c = x->shape[1], hw = x->shape[2], o = w->shape[0], cg = w->shape[1], k = w->shape[2];
    int64_t ho = (hw + 2 * p - d * (k - 1) - 1) / s + 1, og = o / groups;
    int64_t ow = i % ho, oh = i / ho % ho, oc = i / (ho * ho) % o, img = i / (ho * ho * o);
    double ref = b->f[oc];
    *mag = fabs(b->f[oc]);
    for (int64_t ci = 0; ci < cg; ci++)
        for (int64_t ki = 0; ki < k; ki++)
            for (int64_t kj = 0; kj < k; kj++) {
                int64_t ih = oh * s - p + ki * d, iw = ow * s - p + kj * d;
                if (ih < 0 || ih >= hw || iw < 0 || iw >= hw)
                    continue;
                double t = (double)x->f[((img * c + oc / og * cg + ci) * hw + ih) * hw + iw] *
                           (double)w->f[((oc * cg + ci) * k + ki) * k + kj];
                ref += t;
                *mag += fabs(t);
            }
    return ref;
}

static void conv_dil_case(opjit_runtime *rt, int64_t n, int64_t c, int64_t hw, int64_t o,
                          int64_t k, int64_t s, int64_t p, int64_t d, int64_t groups, int adv)
{
    pair x, w, b;
    DLManagedTensor *out[1] = {0};
    int64_t ho = (hw + 2 * p - d * (k - 1) - 1) / s + 1, bad = 0;
    pair_init(&x, BF16, 4, (int64_t[]){n, c, hw, hw});
    pair_init(&w, BF16, 4, (int64_t[]){o, c / groups, k, k});
    pair_init(&b, BF16, 1, (int64_t[]){o});
    if (adv) {
        adversarial(&x, adv < 3, adv > 1);
        adversarial(&w, adv < 3, 0);
    }
    int64_t st[2] = {s, s}, pd[2] = {p, p}, dl[2] = {d, d};
    opjit_value v[7] = {opjit_tensor(&x.th), opjit_tensor(&w.th), opjit_tensor(&b.th),
                        opjit_ints(st, 2), opjit_ints(pd, 2), opjit_ints(dl, 2),
                        opjit_int(groups)};
    if (call(rt, "conv2d", v, 7, out, 1)) {
        const uint16_t *got = out[0]->dl_tensor.data;
        for (int64_t i = 0; i < n * o * ho * ho; i++) {
            double mag, ref = conv_ref(&x, &w, &b, i, s, p, d, groups, &mag);
            bad += !within(got[i], ref, mag, c / groups * k * k + 1);
        }
        CHECKF(bad == 0,
               "conv2d %lldx%lld c %lld o %lld dilation %lld (adversarial %d): %lld outside the "
               "bound", (long long)k, (long long)k, (long long)c, (long long)o, (long long)d, adv,
               (long long)bad);
        out[0]->deleter(out[0]);
    }
    pair_free(&x);
    pair_free(&w);
    pair_free(&b);
}

static void conv_bound_case(opjit_runtime *rt, int64_t n, int64_t c, int64_t hw, int64_t o,
                            int64_t k, int64_t s, int64_t p, int64_t groups, int adv)
{
    conv_dil_case(rt, n, c, hw, o, k, s, p, 1, groups, adv);
}

/* conv2d_backward over x [n, c, hw, hw], w [o, c/groups, k, k], a bias,
 * grad [n, o, ho, ho], stride s, padding p, dilation d: grad_input,
 * grad_weight and grad_bias (bfloat16) each within the bound of a float32
 * sum rounded once against float64, k the terms of each sum. adv as
 * mm_bound_case's, grad adversarial too, the infinity in the input
 * (grad_weight's operand). */
static void conv_bw_case(opjit_runtime *rt, int64_t n, int64_t c, int64_t hw, int64_t o,
                         int64_t k, int64_t s, int64_t p, int64_t d, int64_t groups, int adv)
{
    pair x, w, b, g;
    DLManagedTensor *out[3] = {0};
    int64_t ho = (hw + 2 * p - d * (k - 1) - 1) / s + 1, cg = c / groups, og = o / groups;
    int64_t nx = n * c * hw * hw, nw = o * cg * k * k, bad[3] = {0, 0, 0};
    pair_init(&x, BF16, 4, (int64_t[]){n, c, hw, hw});
    pair_init(&w, BF16, 4, (int64_t[]){o, cg, k, k});
    pair_init(&b, BF16, 1, (int64_t[]){o});
    pair_init(&g, BF16, 4, (int64_t[]){n, o, ho, ho});
    if (adv) {
        adversarial(&x, adv < 3, adv > 1);
        adversarial(&w, adv < 3, 0);
        adversarial(&g, adv < 3, 0);
    }
    if (adv > 1 && hw > 1) { /* and one at the end of a row, where the position past an
                              * odd width reads */
        x.h[hw + hw - 1] = 0x7f80u;
        x.f[hw + hw - 1] = opjit_bf16_to_f32(0x7f80u);
    }
    double *rx = calloc((size_t)nx, sizeof(double)), *mx = calloc((size_t)nx, sizeof(double));
    double *rw = calloc((size_t)nw, sizeof(double)), *mw = calloc((size_t)nw, sizeof(double));
    double *rb = calloc((size_t)o, sizeof(double)), *mb = calloc((size_t)o, sizeof(double));
    for (int64_t img = 0; img < n; img++)
        for (int64_t oc = 0; oc < o; oc++)
            for (int64_t oh = 0; oh < ho; oh++)
                for (int64_t ow = 0; ow < ho; ow++) {
                    double gv = g.f[((img * o + oc) * ho + oh) * ho + ow];
                    rb[oc] += gv;
                    mb[oc] += fabs(gv);
                    for (int64_t ci = 0; ci < cg; ci++)
                        for (int64_t ki = 0; ki < k; ki++)
                            for (int64_t kj = 0; kj < k; kj++) {
                                int64_t ih = oh * s - p + ki * d, iw = ow * s - p + kj * d;
                                if (ih < 0 || ih >= hw || iw < 0 || iw >= hw)
                                    continue;
                                int64_t xi = ((img * c + oc / og * cg + ci) * hw + ih) * hw + iw;
                                int64_t wi = ((oc * cg + ci) * k + ki) * k + kj;
                                double t = gv * (double)x.f[xi], u = gv * (double)w.f[wi];
                                rw[wi] += t;
                                mw[wi] += fabs(t);
                                rx[xi] += u;
                                mx[xi] += fabs(u);
                            }
                }
    int64_t st[2] = {s, s}, pd[2] = {p, p}, dl[2] = {d, d};
    opjit_value v[8] = {opjit_tensor(&g.th),  opjit_tensor(&x.th), opjit_tensor(&w.th),
                        opjit_tensor(&b.th),  opjit_ints(st, 2),   opjit_ints(pd, 2),
                        opjit_ints(dl, 2),    opjit_int(groups)};
    if (call(rt, "conv2d_backward", v, 8, out, 3)) {
        const uint16_t *dx = out[0]->dl_tensor.data, *dw = out[1]->dl_tensor.data,
                       *db = out[2]->dl_tensor.data;
        for (int64_t i = 0; i < nx; i++)
            bad[0] += !within(dx[i], rx[i], mx[i], og * k * k);
        for (int64_t i = 0; i < nw; i++)
            bad[1] += !within(dw[i], rw[i], mw[i], n * ho * ho);
        for (int64_t i = 0; i < o; i++)
            bad[2] += !within(db[i], rb[i], mb[i], n * ho * ho);
        CHECKF(bad[0] == 0 && bad[1] == 0 && bad[2] == 0,
               "conv2d_backward n %lld %lldx%lld c %lld o %lld @%lld stride %lld pad %lld "
               "dilation %lld groups %lld (adversarial %d): outside the bound: grad_input "
               "%lld, grad_weight %lld, grad_bias %lld",
               (long long)n, (long long)k, (long long)k, (long long)c, (long long)o,
               (long long)hw, (long long)s, (long long)p, (long long)d, (long long)groups, adv,
               (long long)bad[0], (long long)bad[1], (long long)bad[2]);
        for (int i = 0; i < 3; i++)
            out[i]->deleter(out[i]);
    }
    free(rx);
    free(mx);
    free(rw);
    free(mw);
    free(rb);
    free(mb);
    pair_free(&x);
    pair_free(&w);
    pair_free(&b);
    pair_free(&g);
}

/* The shapes of each path of the bfloat16 backward (conv2d.c's
 * conv_gi_bf16, gemm_half.h's hg_conv_gw_bf16) and of its fallbacks. */
static void conv_bw_cases(opjit_runtime *rt, int adv)
{
    conv_bw_case(rt, 2, 16, 20, 24, 3, 1, 1, 1, 1, adv);  /* 3x3: rows of an even width */
    conv_bw_case(rt, 1, 33, 12, 17, 3, 1, 1, 1, 1, adv);  /* odd channels */
    conv_bw_case(rt, 2, 8, 9, 6, 3, 1, 1, 1, 1, adv);     /* odd width: padded positions */
    conv_bw_case(rt, 2, 16, 26, 24, 3, 1, 2, 2, 1, adv);  /* dilation 2 */
    conv_bw_case(rt, 2, 6, 9, 10, 2, 1, 0, 1, 1, adv);    /* 2x2, no padding */
    conv_bw_case(rt, 1, 5, 11, 9, 5, 1, 2, 1, 1, adv);    /* 5x5 */
    conv_bw_case(rt, 2, 8, 13, 6, 3, 2, 1, 1, 1, adv);    /* stride 2: phase planes; dx widened */
    conv_bw_case(rt, 2, 16, 10, 12, 1, 2, 0, 1, 1, adv);  /* 1x1 stride 2 */
    conv_bw_case(rt, 2, 8, 9, 6, 3, 1, 1, 1, 2, adv);     /* groups: dw widened */
    conv_bw_case(rt, 1, 32, 7, 40, 1, 1, 0, 1, 1, adv);   /* 1x1 in place, swapped, odd plane */
    conv_bw_case(rt, 1, 20, 20, 70, 1, 1, 0, 1, 1, adv);  /* 1x1 in place, panels 64 + 16 */
    conv_bw_case(rt, 1, 70, 20, 20, 1, 1, 0, 1, 1, adv);  /* 1x1 in place */
    conv_bw_case(rt, 1, 40, 7, 20, 1, 1, 0, 1, 1, adv);   /* the same, odd plane: the
                                                           * infinity starts a channel */
    conv_bw_case(rt, 3, 40, 5, 17, 1, 1, 0, 1, 1, adv);   /* 1x1 batch folded */
    conv_bw_case(rt, 3, 17, 5, 40, 1, 1, 0, 1, 1, adv);   /* 1x1 batch folded, swapped */
    conv_bw_case(rt, 3, 4, 400, 4, 3, 1, 1, 1, 1, adv);   /* images in two chunks */
}

/* The same on the widening path, forced (the 16-bit forward used to take
 * Winograd there, thousands of elements outside the bound). */
static void bf16_widened_within_float32_bound(void)
{
    setenv("OPJIT_HALF_KERNEL", "wide", 1);
    bf16_within_float32_bound();
    unsetenv("OPJIT_HALF_KERNEL");
}

static void bf16_within_float32_bound(void)
{
    static const int64_t mm_sizes[][3] = {{37, 53, 29}, {300, 200, 500}, {8, 1, 16},
                                          {17, 3, 65},  {1, 257, 47},    {64, 64, 64}};
    opjit_runtime *rt = new_runtime(opt_tier(), 2);
    if (!rt)
        return;
    for (int adv = 0; adv <= 3; adv++) {
        for (size_t i = 0; i < sizeof mm_sizes / sizeof *mm_sizes; i++)
            mm_bound_case(rt, mm_sizes[i][0], mm_sizes[i][1], mm_sizes[i][2], adv);
        conv_bound_case(rt, 2, 16, 20, 24, 3, 1, 1, 1, adv);
        conv_bound_case(rt, 2, 8, 13, 6, 3, 2, 1, 2, adv);
        conv_bound_case(rt, 2, 8, 9, 6, 3, 1, 1, 2, adv); /* groups, stride 1: unfolded in pairs */
        conv_bound_case(rt, 1, 32, 7, 40, 1, 1, 0, 1, adv);
        conv_bound_case(rt, 2, 33, 5, 17, 1, 1, 0, 1, adv);
        conv_bound_case(rt, 1, 5, 11, 9, 5, 1, 2, 1, adv);
        /* stride 1 per tap on vdpbf16ps (gemm_half.h's hg_conv_vtaps):
         * dilation, an odd channel count, a 2x2 kernel without padding,
         * a plane of several blocks */
        conv_dil_case(rt, 2, 16, 26, 24, 3, 1, 2, 2, 1, adv);
        conv_dil_case(rt, 1, 33, 20, 20, 3, 1, 1, 1, 1, adv);
        conv_dil_case(rt, 2, 6, 9, 10, 2, 1, 0, 1, 1, adv);
        conv_dil_case(rt, 1, 8, 40, 12, 3, 1, 1, 1, 1, adv);
        conv_bw_cases(rt, adv);
    }
    opjit_destroy(rt);
}

/* The first output of name over v with threads threads, copied (*n
 * elements of 16 bits); NULL with a failed check. */
static uint16_t *output_with(int threads, const char *name, opjit_value *v, int nargs,
                             int64_t *n)
{
    opjit_runtime *rt = new_runtime(opt_tier(), threads);
    DLManagedTensor *o[1] = {0};
    uint16_t *copy = NULL;
    if (rt && call(rt, name, v, nargs, o, 1)) {
        *n = numel(&o[0]->dl_tensor);
        copy = malloc((size_t)*n * 2 + 2);
        memcpy(copy, o[0]->dl_tensor.data, (size_t)*n * 2);
        o[0]->deleter(o[0]);
    }
    if (rt)
        opjit_destroy(rt);
    return copy;
}

/* Output which of name's nouts over v with threads threads, copied (*n
 * elements of 16 bits); NULL with a failed check. */
static uint16_t *output_k_with(int threads, const char *name, opjit_value *v, int nargs,
                               int nouts, int which, int64_t *n)
{
    opjit_runtime *rt = new_runtime(opt_tier(), threads);
    DLManagedTensor *o[3] = {0};
    uint16_t *copy = NULL;
    if (rt && call(rt, name, v, nargs, o, nouts)) {
        *n = numel(&o[which]->dl_tensor);
        copy = malloc((size_t)*n * 2 + 2);
        memcpy(copy, o[which]->dl_tensor.data, (size_t)*n * 2);
        for (int i = 0; i < nouts; i++)
            o[i]->deleter(o[i]);
    }
    if (rt)
        opjit_destroy(rt);
    return copy;
}

/* conv2d_backward's grad_input and grad_weight (bfloat16), the same bits
 * for 1, 2 and 3 threads: x [n, c, hw, hw], w [o, c, k, k], padding p. */
static void bf16_backward_same_bits(int64_t n, int64_t c, int64_t hw, int64_t o, int64_t k,
                                    int64_t p)
{
    pair x, w, g;
    int64_t ho = hw + 2 * p - k + 1;
    pair_init(&x, BF16, 4, (int64_t[]){n, c, hw, hw});
    pair_init(&w, BF16, 4, (int64_t[]){o, c, k, k});
    pair_init(&g, BF16, 4, (int64_t[]){n, o, ho, ho});
    int64_t st[2] = {1, 1}, pd[2] = {p, p}, dl[2] = {1, 1};
    opjit_value v[8] = {opjit_tensor(&g.th), opjit_tensor(&x.th), opjit_tensor(&w.th),
                        opjit_none(),        opjit_ints(st, 2),   opjit_ints(pd, 2),
                        opjit_ints(dl, 2),   opjit_int(1)};
    for (int which = 0; which < 2; which++) {
        int64_t n1 = 0, n2 = 0, n3 = 0;
        uint16_t *a = output_k_with(1, "conv2d_backward", v, 8, 3, which, &n1);
        uint16_t *b = output_k_with(2, "conv2d_backward", v, 8, 3, which, &n2);
        uint16_t *c3 = output_k_with(3, "conv2d_backward", v, 8, 3, which, &n3);
        CHECKF(a && b && c3 && n1 == n2 && n1 == n3 && memcmp(a, b, (size_t)n1 * 2) == 0 &&
                   memcmp(a, c3, (size_t)n1 * 2) == 0,
               "conv2d_backward %lldx%lld c %lld o %lld: %s not the same bits for 1, 2 and 3 "
               "threads", (long long)k, (long long)k, (long long)c, (long long)o,
               which ? "grad_weight" : "grad_input");
        free(a);
        free(b);
        free(c3);
    }
    pair_free(&x);
    pair_free(&w);
    pair_free(&g);
}

static void bf16_same_bits_any_threads(void)
{
    bf16_backward_same_bits(2, 40, 20, 70, 3, 1);
    bf16_backward_same_bits(3, 100, 6, 30, 1, 0);

    pair x, y, w;
    pair_init(&x, BF16, 2, (int64_t[]){300, 200});
    pair_init(&y, BF16, 2, (int64_t[]){200, 500});
    pair_init(&w, BF16, 4, (int64_t[]){24, 15, 3, 3});
    opjit_value mv[2] = {opjit_tensor(&x.th), opjit_tensor(&y.th)};
    int64_t n1 = 0, n2 = 0;
    uint16_t *a = output_with(1, "mm", mv, 2, &n1), *b = output_with(2, "mm", mv, 2, &n2);
    CHECK(a && b && n1 == n2 && memcmp(a, b, (size_t)n1 * 2) == 0);
    free(a);
    free(b);
    int64_t xs[4] = {4, 15, 40, 25}; /* x's 60000 values as a batch of images */
    x.th.shape = xs;
    x.th.ndim = 4;
    opjit_value cv[2] = {opjit_tensor(&x.th), opjit_tensor(&w.th)};
    a = output_with(1, "conv2d", cv, 2, &n1);
    b = output_with(2, "conv2d", cv, 2, &n2);
    CHECK(a && b && n1 == n2 && memcmp(a, b, (size_t)n1 * 2) == 0);
    free(a);
    free(b);
    x.th.shape = x.shape;
    x.th.ndim = 2;
    pair_free(&x);
    pair_free(&y);
    pair_free(&w);
}

/* The AMX kernels forced (by default they run above wherever no operand
 * holds a subnormal): the bounds on shapes that reach each of their
 * paths: mm with self read in place (k a multiple of 32, rows of 16) or
 * padded, k in slices (past 256), transposed operands (mm_backward);
 * conv2d per tap at stride 1 (dilation, channels past a tile), im2col
 * blocks (stride 2, groups, planes too narrow for the taps), 1x1 over
 * small planes; the same bits for 1 and 2 threads. Not the inputs with
 * subnormals (adversarial 1 and 2): the tiles count them as zero, as
 * vdpbf16ps and oneDNN's kernels do, which the float32 bound does not
 * allow (a subnormal times 1e16 dropped; times an infinity NaN where
 * float64 says infinity); bf16_path_picked_by_cpu checks that rule. */
static void bf16_same_bits_any_threads(void);
static void bf16_mm_backward_threads(void);
static void bf16_amx_forced(void)
{
    static const int64_t mm_sizes[][3] = {{37, 53, 29}, {300, 200, 500}, {8, 1, 16},
                                          {17, 3, 65},  {1, 257, 47},    {64, 64, 64},
                                          {48, 64, 40}, {40, 300, 70},   {32, 544, 33},
                                          {64, 1024, 48}};
    if (!amx_here()) {
        fprintf(stderr, "-- no AMX here (or not the optimizing tier): the AMX checks are "
                        "skipped\n");
        return;
    }
    setenv("OPJIT_HALF_KERNEL", "amx", 1);
    bf16_same_bits_any_threads();
    bf16_mm_backward_threads();
    opjit_runtime *rt = new_runtime(1, 2);
    for (int adv = 0; rt && adv <= 3; adv += 3) {
        for (size_t i = 0; i < sizeof mm_sizes / sizeof *mm_sizes; i++)
            mm_bound_case(rt, mm_sizes[i][0], mm_sizes[i][1], mm_sizes[i][2], adv);
        conv_bound_case(rt, 2, 16, 20, 24, 3, 1, 1, 1, adv);
        conv_bound_case(rt, 2, 8, 13, 6, 3, 2, 1, 2, adv);
        conv_bound_case(rt, 2, 8, 9, 6, 3, 1, 1, 2, adv);
        conv_bound_case(rt, 1, 32, 7, 40, 1, 1, 0, 1, adv);
        conv_bound_case(rt, 2, 33, 5, 17, 1, 1, 0, 1, adv);
        conv_bound_case(rt, 1, 5, 11, 9, 5, 1, 2, 1, adv);
        conv_dil_case(rt, 2, 16, 26, 24, 3, 1, 2, 2, 1, adv); /* taps, dilation 2 */
        conv_dil_case(rt, 1, 40, 14, 70, 3, 1, 1, 1, 1, adv); /* taps, C and O past tiles */
        conv_dil_case(rt, 2, 64, 9, 32, 3, 1, 0, 1, 1, adv);  /* 7 wide: im2col blocks */
        conv_dil_case(rt, 3, 300, 4, 40, 1, 1, 0, 1, 1, adv); /* 1x1, small planes */
    }
    if (rt)
        opjit_destroy(rt);
    unsetenv("OPJIT_HALF_KERNEL");
}

/* A bfloat16 subnormal times 1. vdpbf16ps counts the subnormal as zero (as
 * torch's oneDNN kernels do on such CPUs), which OPJIT_HALF_KERNEL=dot
 * shows: the GEMM ran. By default an operand holding a subnormal goes the
 * widening path, which keeps it (the exact product); so does "wide"; the
 * AMX tiles ("amx") count it as zero too. Where the GEMM is not (the
 * baseline tier, a CPU without AVX512_BF16), "dot" is an error that says
 * why; so is "amx" where there are no tiles. */
static void bf16_path_picked_by_cpu(void)
{
    static const char *const modes[] = {"dot", "", "wide", "amx"};
    uint16_t a[2] = {0x0040u, 0}, b[2] = {0x3f80u, 0}; /* 2^-128 and 1 */
    int64_t sa[2] = {1, 2}, sb[2] = {2, 1};
    DLTensor ta = {a, {kDLCPU, 0}, 2, dt16(BF16), sa, NULL, 0};
    DLTensor tb = {b, {kDLCPU, 0}, 2, dt16(BF16), sb, NULL, 0};
    opjit_value v[2] = {opjit_tensor(&ta), opjit_tensor(&tb)};
    int dot = 0;
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    dot = opt_tier() && __builtin_cpu_supports("avx512bf16");
#endif
    for (int i = 0; i < 4; i++) {
        opjit_runtime *rt = new_runtime(opt_tier(), 1);
        opjit_op *op = NULL;
        DLManagedTensor *o[1] = {0};
        setenv("OPJIT_HALF_KERNEL", modes[i], 1);
        int rc = rt && opjit_find_op(rt, "mm", &op) == OPJIT_OK
                     ? opjit_call(rt, op, v, 2, o, 1) : OPJIT_ECALL;
        if ((i == 0 && !dot) || (i == 3 && !amx_here())) {
            CHECK(rc != OPJIT_OK);
            if (rt && opt_tier())
                CHECK_STR_CONTAINS(opjit_errmsg(rt), i == 0 ? "OPJIT_HALF_KERNEL=dot"
                                                            : "OPJIT_HALF_KERNEL=amx");
        } else {
            CHECKF(rc == OPJIT_OK, "%s: %s", modes[i], rt ? opjit_errmsg(rt) : "no runtime");
        }
        if (rc == OPJIT_OK) {
            uint16_t got = *(uint16_t *)o[0]->dl_tensor.data;
            CHECKF(got == (i == 0 || i == 3 ? 0 : 0x0040u), "OPJIT_HALF_KERNEL=%s: got 0x%04x",
                   modes[i],
                   got);
            o[0]->deleter(o[0]);
        }
        if (rt)
            opjit_destroy(rt);
        unsetenv("OPJIT_HALF_KERNEL");
    }
}

/* The bfloat16 backward where the GEMMs are not (OPJIT_CPU_LEVEL avx2
 * and portable: the widening path) and with OPJIT_HALF_KERNEL=dot (no
 * scan for subnormals: the inputs hold none; an infinity in the input of
 * an odd width must still not meet the zeros of positions that do not
 * exist): within the float64 bound. */
static void bf16_backward_other_paths(void)
{
    static const char *const levels[] = {"avx2", "portable"};
    int dot = 0;
    if (!opt_tier()) {
        fprintf(stderr, "-- not the optimizing tier: the CPU-level checks are skipped\n");
        return;
    }
    for (size_t l = 0; l < sizeof levels / sizeof *levels; l++) {
        setenv("OPJIT_CPU_LEVEL", levels[l], 1);
        opjit_runtime *rt = new_runtime(1, 2);
        if (rt) {
            conv_bw_case(rt, 2, 16, 20, 24, 3, 1, 1, 1, 1, 3);
            conv_bw_case(rt, 3, 40, 5, 17, 1, 1, 0, 1, 1, 1);
            opjit_destroy(rt);
        }
        unsetenv("OPJIT_CPU_LEVEL");
    }
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    dot = __builtin_cpu_supports("avx512bf16");
#endif
    if (!dot)
        return;
    setenv("OPJIT_HALF_KERNEL", "dot", 1);
    opjit_runtime *rt = new_runtime(1, 2);
    for (int adv = 0; rt && adv <= 3; adv += 3) {
        conv_bw_case(rt, 2, 8, 9, 6, 3, 1, 1, 1, 1, adv);
        conv_bw_case(rt, 2, 16, 20, 24, 3, 1, 1, 1, 1, adv);
        conv_bw_case(rt, 3, 17, 5, 40, 1, 1, 0, 1, 1, adv);
    }
    if (rt)
        opjit_destroy(rt);
    unsetenv("OPJIT_HALF_KERNEL");
}

/* ---- float16 mm on the float32 GEMM, converting while packing (the
 * optimizing tier on x86-64-v3 and up, by default; the portable level
 * and the baseline tier widen) ------------------------------------------ */

/* Random float16 values, some adversarial: subnormals, magnitudes near
 * the largest (65504), and where asked one infinity and one NaN. */
static void f16_adversarial(pair *p, int special)
{
    for (int64_t i = 0; i < p->n; i++) {
        uint32_t r = (uint32_t)(rnd() * 1000.0f + 1000.0f);
        if (r % 13 == 0)
            p->h[i] = (uint16_t)((r & 1 ? 0x8000u : 0) | (0x0001u + r % 0x3ffu)); /* subnormal */
        else if (r % 29 == 0)
            p->h[i] = opjit_f32_to_f16(rnd() * 65504.0f);
        p->f[i] = opjit_f16_to_f32(p->h[i]);
    }
    if (special && p->n > 2) {
        p->h[p->n / 2] = 0xfc00u; /* -infinity */
        p->h[p->n / 3] = 0x7e01u; /* a NaN with a payload */
        p->f[p->n / 2] = opjit_f16_to_f32(p->h[p->n / 2]);
        p->f[p->n / 3] = opjit_f16_to_f32(p->h[p->n / 3]);
    }
}

/* got (float16) against ref (float64), mag = the sum of |products|, k
 * terms: a float32 sum over k rounded once to float16 is within 2^-11
 * (|ref| + e) + e + 2^-25 (half float16's smallest subnormal) of ref, e
 * = k 2^-24 mag; past float16's range (65520) an infinity of ref's sign.
 * NaN and the infinities must match. */
static int within_f16(uint16_t got16, double ref, double mag, int64_t k)
{
    double got = opjit_f16_to_f32(got16);
    double e = (double)k * ldexp(1.0, -24) * mag * 1.01;
    if (isnan(ref))
        return isnan(got);
    if (isinf(ref) || (isinf(got) && fabs(ref) + e >= 65520.0))
        return isinf(got) && (got > 0) == (ref > 0);
    return fabs(got - ref) <= ldexp(1.0, -11) * (fabs(ref) + e) + e + ldexp(1.0, -25);
}

/* mm and mm_backward in float16 on adversarial operands: the float64
 * bound (mm's and both gradients'), and the bits of round(float32 op) on
 * the widened operands. special: an infinity and a NaN in self (bits only:
 * the bound holds nothing past a NaN). */
static void f16_mm_case(opjit_runtime *rt, int64_t n, int64_t k, int64_t m, int special)
{
    pair x, y, g;
    DLManagedTensor *o[2] = {0};
    pair_init(&x, F16, 2, (int64_t[]){n, k});
    pair_init(&y, F16, 2, (int64_t[]){k, m});
    pair_init(&g, F16, 2, (int64_t[]){n, m});
    f16_adversarial(&x, special);
    f16_adversarial(&y, 0);
    f16_adversarial(&g, 0);
    opjit_value hv[3] = {opjit_tensor(&x.th), opjit_tensor(&y.th)};
    opjit_value fv[3] = {opjit_tensor(&x.tf), opjit_tensor(&y.tf)};
    same_bits(rt, "mm", F16, "mm adversarial", hv, fv, 2, 1);
    opjit_value hb[3] = {opjit_tensor(&g.th), opjit_tensor(&x.th), opjit_tensor(&y.th)};
    opjit_value fb[3] = {opjit_tensor(&g.tf), opjit_tensor(&x.tf), opjit_tensor(&y.tf)};
    same_bits(rt, "mm_backward", F16, "mm_backward adversarial", hb, fb, 3, 2);
    if (!special && call(rt, "mm", hv, 2, o, 1)) {
        int64_t bad = mm_bad(within_f16, x.f, k, 1, y.f, m, 1, o[0]->dl_tensor.data, n, k, m);
        CHECKF(bad == 0, "f16 mm %lldx%lldx%lld: %lld outside the bound", (long long)n,
               (long long)k, (long long)m, (long long)bad);
        o[0]->deleter(o[0]);
    }
    if (!special && call(rt, "mm_backward", hb, 3, o, 2)) {
        int64_t bad = mm_bad(within_f16, g.f, m, 1, y.f, 1, m, o[0]->dl_tensor.data, n, m, k) +
                      mm_bad(within_f16, x.f, 1, k, g.f, m, 1, o[1]->dl_tensor.data, k, n, m);
        CHECKF(bad == 0, "f16 mm_backward %lldx%lldx%lld: %lld outside the bound", (long long)n,
               (long long)k, (long long)m, (long long)bad);
        o[0]->deleter(o[0]);
        o[1]->deleter(o[1]);
    }
    pair_free(&x);
    pair_free(&y);
    pair_free(&g);
}

/* A column-major mat2 (the data of [m, k] read as [k, m]) and a self
 * whose rows are a slice of wider ones (leading dimension past k): the
 * bits of round(float32 op), which reads the same views. */
static void f16_views(opjit_runtime *rt)
{
    pair x, y;
    pair_init(&x, F16, 2, (int64_t[]){45, 90});
    pair_init(&y, F16, 2, (int64_t[]){70, 61});
    int64_t xs[2] = {45, 61}, xst[2] = {90, 1}, ys[2] = {61, 70}, yst[2] = {1, 61};
    x.th.shape = x.tf.shape = xs;
    x.th.strides = x.tf.strides = xst;
    y.th.shape = y.tf.shape = ys;
    y.th.strides = y.tf.strides = yst;
    opjit_value hv[2] = {opjit_tensor(&x.th), opjit_tensor(&y.th)};
    opjit_value fv[2] = {opjit_tensor(&x.tf), opjit_tensor(&y.tf)};
    same_bits(rt, "mm", F16, "mm sliced self, transposed mat2", hv, fv, 2, 1);
    pair_free(&x);
    pair_free(&y);
}

/* The float16 GEMM at each CPU level the tier builds here: the default
 * (the CPU's best), avx2, portable (no F16C there: the widening path with
 * element-by-element conversions); the same bits as round(float32 op) on
 * random, adversarial and special operands and views, within the float64
 * bound, and the same bits for 1, 2 and 3 threads. */
static void f16_packed(void)
{
    static const char *const levels[] = {"", "avx2", "portable"};
    static const int64_t sizes[][3] = {{37, 53, 29}, {300, 200, 500}, {8, 1, 16},
                                       {17, 3, 65},  {1, 257, 47},    {64, 64, 64},
                                       {130, 700, 90}};
    if (!opt_tier()) {
        fprintf(stderr, "-- not the optimizing tier: the float16 GEMM checks are skipped\n");
        return;
    }
    unsetenv("OPJIT_HALF_KERNEL");
    for (size_t l = 0; l < sizeof levels / sizeof *levels; l++) {
        if (*levels[l])
            setenv("OPJIT_CPU_LEVEL", levels[l], 1);
        opjit_runtime *rt = new_runtime(1, 2);
        if (rt) {
            mm_cases(rt, F16);
            f16_views(rt);
            for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
                f16_mm_case(rt, sizes[i][0], sizes[i][1], sizes[i][2], 0);
            f16_mm_case(rt, 37, 53, 29, 1);
            f16_mm_case(rt, 300, 200, 500, 1);
            opjit_destroy(rt);
        }
        pair x, y;
        pair_init(&x, F16, 2, (int64_t[]){300, 200});
        pair_init(&y, F16, 2, (int64_t[]){200, 500});
        f16_adversarial(&x, 0);
        opjit_value mv[2] = {opjit_tensor(&x.th), opjit_tensor(&y.th)};
        int64_t n1 = 0, n2 = 0, n3 = 0;
        uint16_t *a = output_with(1, "mm", mv, 2, &n1), *b = output_with(2, "mm", mv, 2, &n2);
        uint16_t *c = output_with(3, "mm", mv, 2, &n3);
        CHECKF(a && b && c && n1 == n2 && n1 == n3 && memcmp(a, b, (size_t)n1 * 2) == 0 &&
                   memcmp(a, c, (size_t)n1 * 2) == 0,
               "float16 mm, OPJIT_CPU_LEVEL=%s: not the same bits for 1, 2 and 3 threads",
               levels[l]);
        free(a);
        free(b);
        free(c);
        pair_free(&x);
        pair_free(&y);
        unsetenv("OPJIT_CPU_LEVEL");
    }
}

/* ---- bfloat16 mm_backward on exact sums --------------------------------------
 * Operands whose values are multiples of 1/4 in (-8, 8): every product
 * and every float32 partial sum is exact (below 2^21 sixteenths), so on
 * every path (vdpbf16ps in the optimizing tier, the tiles, the widening
 * path at each CPU level, the baseline tier) each gradient is
 * round(float64 sum) bit for bit, in any summation order: a misplaced
 * pair, column or row in the transposing packers shows. Each operand row-
 * major, transposed (column-major) or the rows of a wider buffer (an odd
 * leading dimension); odd sizes and odd k for both products (m for grad
 * self, n for grad mat2), shapes past a block of 16 or 32 and past one
 * panel; 1, 2 and 3 threads. */

/* A bfloat16 [r, c] view of v (row-major values) laid out as layout says:
 * 0 row-major, 1 transposed (column-major), 2 rows of a wider buffer
 * (leading dimension c + 3). */
typedef struct bview {
    int64_t shape[2], strides[2];
    uint16_t *h;
    DLTensor t;
} bview;

static void bview_init(bview *b, const float *v, int64_t r, int64_t c, int layout)
{
    int64_t ld = layout == 2 ? c + 3 : layout == 1 ? r : c;
    b->shape[0] = r;
    b->shape[1] = c;
    b->strides[0] = layout == 1 ? 1 : ld;
    b->strides[1] = layout == 1 ? r : 1;
    b->h = malloc((size_t)(layout == 1 ? c * r : r * ld) * 2 + 2);
    for (int64_t i = 0; i < (layout == 1 ? c * r : r * ld); i++)
        b->h[i] = 0x7fc1u; /* the gaps of layout 2: a NaN that would show */
    for (int64_t i = 0; i < r; i++)
        for (int64_t j = 0; j < c; j++)
            b->h[i * b->strides[0] + j * b->strides[1]] = opjit_f32_to_bf16(v[i * c + j]);
    b->t = (DLTensor){b->h, {kDLCPU, 0}, 2, dt16(BF16), b->shape, b->strides, 0};
}

/* r x c multiples of 1/4 in (-8, 8). */
static float *quarters(int64_t r, int64_t c)
{
    float *v = malloc((size_t)(r * c) * sizeof(float) + 4);
    for (int64_t i = 0; i < r * c; i++)
        v[i] = (float)(int)(rnd() * 32.0f) / 4.0f;
    return v;
}

/* round(A B) in bfloat16, A [n, k] (element (i, q) at a[i * sa + q * sq]),
 * B [k, m] likewise, the sums exact. */
static uint16_t *exact_product(const float *a, int64_t sa, int64_t sq, const float *b,
                               int64_t sb, int64_t sj, int64_t n, int64_t k, int64_t m)
{
    uint16_t *out = malloc((size_t)(n * m) * 2 + 2);
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < m; j++) {
            double s = 0;
            for (int64_t q = 0; q < k; q++)
                s += (double)a[i * sa + q * sq] * (double)b[q * sb + j * sj];
            out[i * m + j] = opjit_f32_to_bf16((float)s);
        }
    return out;
}

/* mm_backward(g, x, y) with each layout combination in lay (3 digits base
 * 3: grad, self, mat2) against the exact gradients ex, ey. */
static void bf16_exact_case(opjit_runtime *rt, const char *mode, int threads, int64_t n,
                            int64_t k, int64_t m, const float *g, const float *x, const float *y,
                            const uint16_t *ex, const uint16_t *ey, const int *lay, int nlay)
{
    for (int l = 0; l < nlay; l++) {
        bview bg, bx, by;
        DLManagedTensor *o[2] = {0};
        bview_init(&bg, g, n, m, lay[l] / 9);
        bview_init(&bx, x, n, k, lay[l] / 3 % 3);
        bview_init(&by, y, k, m, lay[l] % 3);
        opjit_value v[3] = {opjit_tensor(&bg.t), opjit_tensor(&bx.t), opjit_tensor(&by.t)};
        if (call(rt, "mm_backward", v, 3, o, 2)) {
            int64_t bad = 0;
            for (int64_t i = 0; i < n * k; i++)
                bad += ((uint16_t *)o[0]->dl_tensor.data)[i] != ex[i];
            for (int64_t i = 0; i < k * m; i++)
                bad += ((uint16_t *)o[1]->dl_tensor.data)[i] != ey[i];
            CHECKF(bad == 0,
                   "bf16 mm_backward %lldx%lldx%lld, layouts %d%d%d, %s, %d thread(s): %lld of "
                   "%lld not round(exact sum)", (long long)n, (long long)k, (long long)m,
                   lay[l] / 9, lay[l] / 3 % 3, lay[l] % 3, mode, threads, (long long)bad,
                   (long long)(n * k + k * m));
            o[0]->deleter(o[0]);
            o[1]->deleter(o[1]);
        }
        free(bg.h);
        free(bx.h);
        free(by.h);
    }
}

static void bf16_mm_backward_exact(void)
{
    /* name=value settings: the default path (vdpbf16ps where the CPU has
     * it), widened, each lower CPU level, the tiles where there are */
    static const char *const modes[][2] = {{"", ""},
                                           {"OPJIT_HALF_KERNEL", "wide"},
                                           {"OPJIT_CPU_LEVEL", "avx2"},
                                           {"OPJIT_CPU_LEVEL", "portable"},
                                           {"OPJIT_HALF_KERNEL", "amx"}};
    /* n, k, m: odd k for both products, blocks of 16 and 32 and their
     * edges, several panels of grad self's mat2 (k 300 columns of 1100) */
    static const int64_t shapes[][3] = {{37, 53, 29}, {33, 17, 47}, {1, 5, 3},   {16, 32, 48},
                                        {65, 31, 97}, {130, 70, 97}, {70, 300, 1100}};
    int all[27], some[4] = {0, 13, 26, 5}; /* all row-major, transposed, wide rows, mixed */
    for (int i = 0; i < 27; i++)
        all[i] = i;
    for (size_t md = 0; md < sizeof modes / sizeof *modes; md++) {
        if (md == 4 && !amx_here())
            continue;
        if ((md == 2 || md == 3) && !opt_tier())
            continue; /* the CPU levels are the optimizing tier's */
        if (*modes[md][0])
            setenv(modes[md][0], modes[md][1], 1);
        for (int threads = 1; threads <= 3; threads++) {
            opjit_runtime *rt = new_runtime(opt_tier(), threads);
            for (size_t s = 0; rt && s < sizeof shapes / sizeof *shapes; s++) {
                int64_t n = shapes[s][0], k = shapes[s][1], m = shapes[s][2];
                float *g = quarters(n, m), *x = quarters(n, k), *y = quarters(k, m);
                uint16_t *ex = exact_product(g, m, 1, y, 1, m, n, m, k);
                uint16_t *ey = exact_product(x, 1, k, g, m, 1, k, n, m);
                int small = n * k * m < 100000;
                bf16_exact_case(rt, *modes[md][1] ? modes[md][1] : "default", threads, n, k, m,
                                g, x, y, ex, ey, small ? all : some, small ? 27 : 4);
                free(g);
                free(x);
                free(y);
                free(ex);
                free(ey);
            }
            if (rt)
                opjit_destroy(rt);
        }
        if (*modes[md][0])
            unsetenv(modes[md][0]);
    }
}

/* Both outputs of mm_backward over v with threads threads, one after the
 * other in one copy (*n values); NULL with a failed check. */
static uint16_t *grads_with(int threads, opjit_value *v, int64_t *n)
{
    opjit_runtime *rt = new_runtime(opt_tier(), threads);
    DLManagedTensor *o[2] = {0};
    uint16_t *copy = NULL;
    if (rt && call(rt, "mm_backward", v, 3, o, 2)) {
        int64_t n0 = numel(&o[0]->dl_tensor), n1 = numel(&o[1]->dl_tensor);
        *n = n0 + n1;
        copy = malloc((size_t)*n * 2 + 2);
        memcpy(copy, o[0]->dl_tensor.data, (size_t)n0 * 2);
        memcpy(copy + n0, o[1]->dl_tensor.data, (size_t)n1 * 2);
        o[0]->deleter(o[0]);
        o[1]->deleter(o[1]);
    }
    if (rt)
        opjit_destroy(rt);
    return copy;
}

/* bfloat16 mm_backward on random values (sums not exact: the order shows
 * in the last bits): the same bits for 1, 2 and 3 threads, each operand
 * row-major, then each transposed. */
static void bf16_mm_backward_threads(void)
{
    const int64_t n = 300, k = 200, m = 500;
    float *g = malloc((size_t)(n * m) * 4), *x = malloc((size_t)(n * k) * 4),
          *y = malloc((size_t)(k * m) * 4);
    for (int64_t i = 0; i < n * m; i++)
        g[i] = rnd() * 3.0f;
    for (int64_t i = 0; i < n * k; i++)
        x[i] = rnd() * 3.0f;
    for (int64_t i = 0; i < k * m; i++)
        y[i] = rnd() * 3.0f;
    for (int layout = 0; layout < 2; layout++) {
        bview bg, bx, by;
        bview_init(&bg, g, n, m, layout);
        bview_init(&bx, x, n, k, layout);
        bview_init(&by, y, k, m, layout);
        opjit_value v[3] = {opjit_tensor(&bg.t), opjit_tensor(&bx.t), opjit_tensor(&by.t)};
        int64_t n1 = 0, n2 = 0, n3 = 0;
        uint16_t *a = grads_with(1, v, &n1), *b = grads_with(2, v, &n2), *c = grads_with(3, v, &n3);
        CHECKF(a && b && c && n1 == n2 && n1 == n3 && memcmp(a, b, (size_t)n1 * 2) == 0 &&
                   memcmp(a, c, (size_t)n1 * 2) == 0,
               "bf16 mm_backward (layout %d): not the same bits for 1, 2 and 3 threads", layout);
        free(a);
        free(b);
        free(c);
        free(bg.h);
        free(bx.h);
        free(by.h);
    }
    free(g);
    free(x);
    free(y);
}

/* A bfloat16 subnormal s in one operand of mm_backward (grad, self or
 * mat2, in turn; row-major or transposed; its last element, the last
 * rows past a unit of 64), placed where one gradient element is s times
 * 1 plus zeros: by default the scans see it and both gradients widen, so
 * that element is s; with $OPJIT_HALF_KERNEL=dot (no scan) where the CPU
 * has vdpbf16ps, the GEMM counts s as zero, as oneDNN's kernels do: 0. */
static void bf16_mm_backward_subnormal(void)
{
    const int64_t n = 70, k = 37, m = 45;
    const uint16_t s = 0x0041u;
    int dot = opt_tier() && __builtin_cpu_supports("avx512bf16");
    opjit_runtime *rt = new_runtime(opt_tier(), 2);
    for (int which = 0; rt && which < 3; which++)
        for (int layout = 0; layout < 2; layout++)
            for (int mode = 0; mode <= dot; mode++) {
                float *g = quarters(n, m), *x = quarters(n, k), *y = quarters(k, m);
                float sf = opjit_bf16_to_f32(s);
                bview bg, bx, by;
                DLManagedTensor *o[2] = {0};
                /* the element: grad self (n-1, k-1), or grad mat2 (k-1, m-1) */
                g[n * m - 1] = 1.0f;
                if (which == 0) { /* grad's last row: s at its end, zeros */
                    for (int64_t j = 0; j < m; j++)
                        g[(n - 1) * m + j] = 0.0f;
                    g[n * m - 1] = sf;
                    y[k * m - 1] = 1.0f;
                } else if (which == 1) { /* self's last column: s at its end, zeros */
                    for (int64_t i = 0; i < n; i++)
                        x[i * k + k - 1] = 0.0f;
                    x[n * k - 1] = sf;
                } else { /* mat2's last row: s at its end, zeros */
                    for (int64_t j = 0; j < m; j++)
                        y[(k - 1) * m + j] = 0.0f;
                    y[k * m - 1] = sf;
                }
                bview_init(&bg, g, n, m, layout);
                bview_init(&bx, x, n, k, layout);
                bview_init(&by, y, k, m, layout);
                opjit_value v[3] = {opjit_tensor(&bg.t), opjit_tensor(&bx.t), opjit_tensor(&by.t)};
                if (mode)
                    setenv("OPJIT_HALF_KERNEL", "dot", 1);
                if (call(rt, "mm_backward", v, 3, o, 2)) {
                    uint16_t got = which == 1 ? ((uint16_t *)o[1]->dl_tensor.data)[k * m - 1]
                                              : ((uint16_t *)o[0]->dl_tensor.data)[n * k - 1];
                    CHECKF(got == (mode ? 0 : s),
                           "bf16 mm_backward, a subnormal in operand %d (layout %d), %s: got "
                           "0x%04x", which, layout, mode ? "dot" : "default", got);
                    o[0]->deleter(o[0]);
                    o[1]->deleter(o[1]);
                }
                unsetenv("OPJIT_HALF_KERNEL");
                free(bg.h);
                free(bx.h);
                free(by.h);
                free(g);
                free(x);
                free(y);
            }
    if (rt)
        opjit_destroy(rt);
}

/* A bad $OPJIT_HALF_KERNEL is an error, not a silent default. */
static void half_kernel_knob_checked(void)
{
    uint16_t a[1] = {0x3f80u};
    int64_t s[2] = {1, 1};
    DLTensor t = {a, {kDLCPU, 0}, 2, dt16(BF16), s, NULL, 0};
    opjit_value v[2] = {opjit_tensor(&t), opjit_tensor(&t)};
    for (int tier = 0; tier <= opt_tier(); tier++) {
        opjit_runtime *rt = new_runtime(tier, 1);
        opjit_op *op = NULL;
        DLManagedTensor *o[1] = {0};
        if (!rt)
            return;
        setenv("OPJIT_HALF_KERNEL", "fast", 1);
        CHECK(opjit_find_op(rt, "mm", &op) == OPJIT_OK &&
              opjit_call(rt, op, v, 2, o, 1) != OPJIT_OK);
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "OPJIT_HALF_KERNEL is 'fast': expected auto, amx, dot, wide");
        unsetenv("OPJIT_HALF_KERNEL");
        opjit_destroy(rt);
    }
}

int main(void)
{
    T_RUN(baseline_tier);
    T_RUN(optimizing_tier);
    T_RUN(bf16_within_float32_bound);
    T_RUN(bf16_widened_within_float32_bound);
    T_RUN(bf16_same_bits_any_threads);
    T_RUN(bf16_amx_forced);
    T_RUN(bf16_path_picked_by_cpu);
    T_RUN(bf16_backward_other_paths);
    T_RUN(f16_packed);
    T_RUN(bf16_mm_backward_exact);
    T_RUN(bf16_mm_backward_subnormal);
    T_RUN(bf16_mm_backward_threads);
    T_RUN(half_kernel_knob_checked);
    return t_done();
}
