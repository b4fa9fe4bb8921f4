/* tests/test_half.c - opjit_op.h's float16 and bfloat16 conversions and the
 * one-source-for-every-floating-dtype macros.
 *
 * The conversions are checked against an oracle built another way (the
 * nearest of the two neighbouring 16-bit values, found by search over the
 * decoding, ties to the even one), over every 16-bit value and a dense
 * sample of float32 bit patterns with every rounding boundary; against
 * x86's F16C where the CPU has it; and compiled by libtcc and by the
 * optimizing tier inside an op, which must give the same bits. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "opjit.h"
#include "t.h"
#include "t_files.h"

static DLDataType dt(int code, int bits) { return (DLDataType){(uint8_t)code, (uint8_t)bits, 1}; }

/* ---- the oracle ------------------------------------------------------------ */

static double f16_value(uint16_t h) /* finite h only */
{
    int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
    double v = exp ? ldexp(1024 + mant, exp - 25) : ldexp(mant, -24);
    return (h & 0x8000) ? -v : v;
}

static double bf16_value(uint16_t h) /* finite h only */
{
    int exp = (h >> 7) & 0xff, mant = h & 0x7f;
    double v = exp ? ldexp(128 + mant, exp - 134) : ldexp(mant, -133);
    return (h & 0x8000) ? -v : v;
}

/* The nearest of the positive finite values [0, top] of a 16-bit format
 * to a (>= 0), ties to the even code; top + 1 (infinity) past the last
 * value's half-way point. */
static uint16_t nearest(double a, uint16_t top, double (*value)(uint16_t))
{
    uint32_t lo = 0, hi = top;
    while (lo < hi) { /* the largest code whose value is <= a */
        uint32_t mid = (lo + hi + 1) / 2;
        if (value((uint16_t)mid) <= a)
            lo = mid;
        else
            hi = mid - 1;
    }
    double below = value((uint16_t)lo);
    double above = lo < top ? value((uint16_t)(lo + 1)) : 2 * value(top) - value((uint16_t)(top - 1));
    if (a - below < above - a || (a - below == above - a && !(lo & 1)))
        return (uint16_t)lo;
    return (uint16_t)(lo + 1); /* top + 1 is infinity's code in both formats */
}

static float f32_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* What a correct float32 -> 16-bit conversion gives for u. */
static uint16_t oracle_from_f32(uint32_t u, int bf)
{
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t a = u & 0x7fffffff;
    if (a > 0x7f800000) /* NaN: quiet, top payload bits */
        return bf ? (uint16_t)((u >> 16) | 0x40) : (uint16_t)(sign | 0x7e00 | ((a >> 13) & 0x3ff));
    if (a == 0x7f800000)
        return sign | (bf ? 0x7f80 : 0x7c00);
    return sign | nearest(f32_of(a), bf ? 0x7f7f : 0x7bff, bf ? bf16_value : f16_value);
}

/* Sample float32 patterns: a stride through all of them, plus each 16-bit
 * value's float32 bits and its neighbours there (the rounding boundaries
 * sit half-way between consecutive 16-bit values). */
static int for_samples(int (*fn)(uint32_t u, void *ud), void *ud)
{
    int bad = 0;
    for (uint64_t u = 0; u <= 0xffffffffu; u += 4099)
        bad += fn((uint32_t)u, ud);
    for (uint32_t h = 0; h < 0x10000; h++) {
        uint32_t f16 = bits_of(f16_value((uint16_t)h & 0x7fff) * ((h & 0x8000) ? -1 : 1));
        uint32_t bf = h << 16;
        for (int d = -2; d <= 2; d++) {
            if ((h & 0x7c00) != 0x7c00)
                bad += fn(f16 + (uint32_t)d, ud);
            bad += fn(bf + 0x8000 + (uint32_t)d, ud);
            bad += fn(bf + (uint32_t)d, ud);
        }
    }
    return bad;
}

/* ---- the C compiler's build of opjit_op.h ----------------------------------- */

static int check_from_f32(uint32_t u, void *ud)
{
    (void)ud;
    uint16_t h = opjit_f32_to_f16(f32_of(u)), b = opjit_f32_to_bf16(f32_of(u));
    uint16_t wh = oracle_from_f32(u, 0), wb = oracle_from_f32(u, 1);
    if (h == wh && b == wb)
        return 0;
    fprintf(stderr, "  0x%08x: f16 0x%04x want 0x%04x, bf16 0x%04x want 0x%04x\n", u, h, wh, b,
            wb);
    return 1;
}

static void conversions_round_to_nearest_even(void)
{
    int bad = for_samples(check_from_f32, NULL);
    CHECKF(bad == 0, "%d float32 values converted wrong", bad);
    CHECK(opjit_f32_to_f16(65504.0f) == 0x7bff && opjit_f32_to_f16(65519.99f) == 0x7bff);
    CHECK(opjit_f32_to_f16(65520.0f) == 0x7c00 && opjit_f32_to_f16(-1e30f) == 0xfc00);
    CHECK(opjit_f32_to_f16(5.9604645e-8f) == 0x0001 && opjit_f32_to_f16(2.9802322e-8f) == 0);
    CHECK(opjit_f32_to_f16(-0.0f) == 0x8000 && opjit_f32_to_bf16(-0.0f) == 0x8000);
    CHECK(opjit_f32_to_bf16(1.00390625f) == 0x3f80);     /* tie, to even */
    CHECK(opjit_f32_to_bf16(1.01171875f) == 0x3f82);     /* tie, to even (up) */
}

static void every_16_bit_value_decodes_and_comes_back(void)
{
    int bad = 0;
    for (uint32_t h = 0; h < 0x10000; h++) {
        uint32_t fnan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff);
        uint32_t bnan = (h & 0x7f80) == 0x7f80 && (h & 0x7f);
        float f = opjit_f16_to_f32((uint16_t)h), b = opjit_bf16_to_f32((uint16_t)h);
        if (fnan) /* a NaN of the same sign, quiet, payload kept */
            bad += !isnan(f) || (bits_of(f) >> 31) != (h >> 15) ||
                   opjit_f32_to_f16(f) != (h | 0x200);
        else
            bad += bits_of(f) != bits_of((float)(f16_value((uint16_t)(h & 0x7fff)) *
                                                 ((h & 0x8000) ? -1 : 1))) &&
                   (h & 0x7c00) != 0x7c00;
        if (!fnan)
            bad += opjit_f32_to_f16(f) != h;
        if (bnan)
            bad += !isnan(b) || opjit_f32_to_bf16(b) != (h | 0x40);
        else
            bad += opjit_f32_to_bf16(b) != h;
    }
    CHECKF(bad == 0, "%d 16-bit values wrong", bad);
    float inf = opjit_f16_to_f32(0x7c00);
    CHECK(isinf(inf) && opjit_f16_to_f32(0xfc00) < 0);
    CHECK(opjit_f16_to_f32(0x0001) == 5.9604644775390625e-8f);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("f16c"))) static uint16_t hw_f16(float f)
{
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
__attribute__((target("f16c"))) static float hw_f32(uint16_t h) { return _cvtsh_ss(h); }

static int check_against_f16c(uint32_t u, void *ud)
{
    (void)ud;
    return opjit_f32_to_f16(f32_of(u)) != hw_f16(f32_of(u));
}

/* The optimizing tier uses F16C where the CPU has it: the software path
 * must give the same bits, NaNs included. */
static void software_and_f16c_agree(void)
{
    if (!__builtin_cpu_supports("f16c")) {
        fprintf(stderr, "  (no F16C on this CPU: skipped)\n");
        return;
    }
    int bad = for_samples(check_against_f16c, NULL);
    for (uint32_t h = 0; h < 0x10000; h++)
        bad += bits_of(opjit_f16_to_f32((uint16_t)h)) != bits_of(hw_f32((uint16_t)h));
    CHECKF(bad == 0, "%d values differ from F16C", bad);
}
#endif

/* ---- the same, compiled inside an op, in both tiers ------------------------ */

/* A module converting whole tensors: float32 -> float16/bfloat16 (their
 * bits as uint16), and back; and OPJIT_FLOATING_KERNELS' scale on every
 * floating dtype. */
static const char half_op[] =
    "#include <opjit_op.h>\n"
    "static int to16(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
    "    int bf = (int)opjit_arg_int(a, 1);\n"
    "    int64_t n = opjit_numel(x);\n"
    "    DLTensor *y = opjit_output(ctx, 0, opjit_dtype(kDLUInt, 16), 1, &n);\n"
    "    if (!y) return -1;\n"
    "    const float *p = opjit_data(x);\n"
    "    uint16_t *q = opjit_data(y);\n"
    "    for (int64_t i = 0; i < n; i++)\n"
    "        q[i] = bf ? opjit_f32_to_bf16(p[i]) : opjit_f32_to_f16(p[i]);\n"
    "    return 0;\n"
    "}\n"
    "static int from16(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
    "    int bf = (int)opjit_arg_int(a, 1);\n"
    "    int64_t n = opjit_numel(x);\n"
    "    DLTensor *y = opjit_output(ctx, 0, OPJIT_FLOAT32, 1, &n);\n"
    "    if (!y) return -1;\n"
    "    const uint16_t *p = opjit_data(x);\n"
    "    float *q = opjit_data(y);\n"
    "    for (int64_t i = 0; i < n; i++)\n"
    "        q[i] = bf ? opjit_bf16_to_f32(p[i]) : opjit_f16_to_f32(p[i]);\n"
    "    return 0;\n"
    "}\n"
    "#define SCALE(NAME, T, ACC, LOAD, STORE)                          \\\n"
    "    static int NAME(const void *x, void *y, int64_t n, double s)  \\\n"
    "    {                                                             \\\n"
    "        for (int64_t i = 0; i < n; i++)                           \\\n"
    "            ((T *)y)[i] = STORE(LOAD(((const T *)x)[i]) * (ACC)s); \\\n"
    "        return 0;                                                 \\\n"
    "    }\n"
    "OPJIT_FLOATING_KERNELS(SCALE, scale)\n"
    "static int scale(opjit_ctx *ctx, opjit_args *a)\n"
    "{\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
    "    int64_t n = opjit_numel(x);\n"
    "    DLTensor *y = opjit_output(ctx, 0, x->dtype, 1, &n);\n"
    "    if (!y) return -1;\n"
    "    return OPJIT_DISPATCH_FLOATING(ctx, x->dtype, scale,\n"
    "                                   (opjit_data(x), opjit_data(y), n, opjit_arg_float(a, 1)));\n"
    "}\n"
    "OPJIT_MODULE(half_ops, m)\n"
    "{\n"
    "    opjit_def(m, \"to16(Tensor x, int bf) -> Tensor\", OPJIT_CPU, to16, \"\");\n"
    "    opjit_require(m, \"x\", \"float32 rank=1\");\n"
    "    opjit_def(m, \"from16(Tensor x, int bf) -> Tensor\", OPJIT_CPU, from16, \"\");\n"
    "    opjit_require(m, \"x\", \"uint16 rank=1\");\n"
    "    opjit_def(m, \"scale(Tensor x, float s) -> Tensor\", OPJIT_CPU, scale, \"\");\n"
    "    opjit_require(m, \"x\", \"floating rank=1\");\n"
    "    opjit_def(m, \"scale_any(Tensor x, float s) -> Tensor\", OPJIT_CPU, scale, \"\");\n"
    "    opjit_require(m, \"x\", \"rank=1\");\n"
    "}\n";

typedef struct op_run {
    opjit_runtime *rt;
    opjit_op *to16, *from16, *scale;
} op_run;

/* op(x (n values of dtype), int or float arg) -> a malloc'd copy of the
 * output's data, or NULL. */
static void *call1(op_run *r, opjit_op *op, void *data, DLDataType dt, int64_t n,
                   opjit_value arg)
{
    DLTensor t = {data, {kDLCPU, 0}, 1, dt, &n, NULL, 0};
    opjit_value args[2] = {opjit_tensor(&t), arg};
    DLManagedTensor *out = NULL;
    if (opjit_call(r->rt, op, args, 2, &out, 1) != OPJIT_OK) {
        fprintf(stderr, "  call: %s\n", opjit_errmsg(r->rt));
        return NULL;
    }
    size_t bytes = (size_t)n * out->dl_tensor.dtype.bits / 8;
    void *copy = malloc(bytes ? bytes : 1);
    memcpy(copy, out->dl_tensor.data, bytes);
    out->deleter(out);
    return copy;
}

static int collect(uint32_t u, void *ud)
{
    uint32_t **p = ud;
    *(*p)++ = u;
    return 0;
}

static void tier_agrees(int tiering, const char *src, const uint32_t *in, int64_t n)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.cache_dir = t_tmpdir("half-cache");
    cfg.tiering = tiering;
    op_run r = {0};
    CHECK(opjit_create(&cfg, &r.rt) == OPJIT_OK);
    opjit_op *op = NULL;
    CHECKF(opjit_load_file(r.rt, src, &op, NULL) == OPJIT_OK, "%s", opjit_errmsg(r.rt));
    if (tiering)
        CHECKF(opjit_wait(r.rt) == OPJIT_OK, "%s", opjit_errmsg(r.rt));
    const char *tier = tiering ? "opt" : "tcc";
    CHECK(opjit_find_op(r.rt, "to16", &r.to16) == OPJIT_OK);
    CHECK(opjit_find_op(r.rt, "from16", &r.from16) == OPJIT_OK);
    CHECK(opjit_find_op(r.rt, "scale", &r.scale) == OPJIT_OK);
    for (int bf = 0; bf <= 1 && r.to16; bf++) {
        uint16_t *h = call1(&r, r.to16, (void *)in, dt(kDLFloat, 32), n, opjit_int(bf));
        int bad = 0;
        for (int64_t i = 0; h && i < n; i++)
            bad += h[i] != oracle_from_f32(in[i], bf);
        CHECKF(h && bad == 0, "%s tier, %s: %d of %lld wrong", tier, bf ? "bf16" : "f16", bad,
               (long long)n);
        uint16_t all[65536];
        for (int i = 0; i < 65536; i++)
            all[i] = (uint16_t)i;
        float *f = call1(&r, r.from16, all, dt(kDLUInt, 16), 65536, opjit_int(bf));
        bad = 0;
        for (int i = 0; f && i < 65536; i++)
            bad += bits_of(f[i]) != bits_of(bf ? opjit_bf16_to_f32((uint16_t)i)
                                               : opjit_f16_to_f32((uint16_t)i));
        CHECKF(f && bad == 0, "%s tier, %s decode: %d wrong", tier, bf ? "bf16" : "f16", bad);
        free(h);
        free(f);
    }
    /* scale by 3 on each floating dtype: computed in float32 for the
     * 16-bit ones, rounded once */
    uint16_t x16[4] = {0x3c00, 0x3555, 0x7bff, 0x0001}; /* 1, 0.333, 65504, 2^-24 */
    uint16_t *y = call1(&r, r.scale, x16, dt(kDLFloat, 16), 4, opjit_float(3));
    CHECK(y && y[0] == 0x4200 && y[1] == opjit_f32_to_f16(opjit_f16_to_f32(0x3555) * 3) &&
          y[2] == 0x7c00 && y[3] == 0x0003);
    free(y);
    uint16_t b16[2] = {0x3f80, 0xc000}; /* 1, -2 */
    y = call1(&r, r.scale, b16, dt(kDLBfloat, 16), 2, opjit_float(3));
    CHECK(y && y[0] == 0x4040 && y[1] == 0xc0c0);
    free(y);
    double d[2] = {1.5, -0.1};
    double *dy = call1(&r, r.scale, d, dt(kDLFloat, 64), 2, opjit_float(3));
    CHECK(dy && dy[0] == 4.5 && dy[1] == -0.1 * 3);
    free(dy);
    int32_t i32[1] = {1};
    DLTensor t = {i32, {kDLCPU, 0}, 1, dt(kDLInt, 32), (int64_t[]){1}, NULL, 0};
    opjit_value args[2] = {opjit_tensor(&t), opjit_float(2)};
    DLManagedTensor *out = NULL;
    /* the schema's group refuses int32 before the kernel runs; without
     * it, the dispatch says there is no kernel for it */
    CHECK(opjit_call(r.rt, r.scale, args, 2, &out, 1) == OPJIT_ECALL);
    CHECK_STR_CONTAINS(opjit_errmsg(r.rt), "float32 or float64 or float16 or bfloat16, got int32");
    opjit_op *any = NULL;
    CHECK(opjit_find_op(r.rt, "scale_any", &any) == OPJIT_OK);
    CHECK(any && opjit_call(r.rt, any, args, 2, &out, 1) != OPJIT_OK);
    CHECK_STR_CONTAINS(opjit_errmsg(r.rt), "no scale kernel for dtype");
    opjit_destroy(r.rt);
}

static void both_tiers_give_the_oracles_bits(void)
{
    const char *dir = t_tmpdir("half-src");
    const char *src = t_path(dir, "half_ops.c");
    t_write(src, half_op, strlen(half_op));
    size_t cap = (0x100000000ull / 4099 + 1) + 65536 * 15;
    uint32_t *in = malloc(cap * sizeof *in), *end = in;
    if (!in)
        return;
    for_samples(collect, &end);
    int64_t n = end - in;
    tier_agrees(0, src, in, n);
    if (getenv("OPJIT_CC") && *getenv("OPJIT_CC"))
        tier_agrees(1, src, in, n);
    free(in);
}

int main(void)
{
    T_RUN(conversions_round_to_nearest_even);
    T_RUN(every_16_bit_value_decodes_and_comes_back);
#if defined(__x86_64__) && defined(__GNUC__)
    T_RUN(software_and_f16c_agree);
#endif
    T_RUN(both_tiers_give_the_oracles_bits);
    t_tmpdirs_remove();
    return t_done();
}
