/* tests/test_strides.c - conv2d and mm take what torch takes: operands of
 * any strides (channels_last, transposed views, x[..., ::2], expand's zero
 * strides, views at an offset inside padded storage), and conv2d.padding
 * takes padding="valid" / "same" (asymmetric for even kernels, as torch
 * pads) and refuses what F.conv2d refuses, with its words. Both tiers,
 * against the reference loops of t_ref.h. */
#include "t_ref.h"

#include <stdio.h>

static opjit_runtime *rt;
static opjit_op *op_conv, *op_conv_pad, *op_mm;

/* conv2d (or conv2d.padding with pad_str) of input, weight (and bias)
 * in layouts lx, lw, lb, against the reference over g. */
static void conv_layout_run(ref_conv g, int bits, int lx, int lw, int lb, int bias,
                            const char *pad_str, const char *what)
{
    rtensor x, w, b;
    int64_t xs[4] = {g.n, g.c, g.h, g.w}, ws[4] = {g.o, g.c / g.groups, g.kh, g.kw};
    int64_t bs[1] = {g.o};
    ref_conv_sizes(&g);
    rt_layout(&x, bits, 4, xs, lx);
    rt_layout(&w, bits, 4, ws, lw);
    rt_layout(&b, bits, 1, bs, lb);
    int64_t st[2] = {g.sh, g.sw}, pd[2] = {g.ph, g.pw}, dl[2] = {g.dh, g.dw};
    opjit_value a[7] = {opjit_tensor(&x.t), opjit_tensor(&w.t),
                        bias ? opjit_tensor(&b.t) : opjit_none(), opjit_ints(st, 2),
                        pad_str ? opjit_str(pad_str) : opjit_ints(pd, 2), opjit_ints(dl, 2),
                        opjit_int(g.groups)};
    DLManagedTensor *out = NULL;
    int rc = opjit_call(rt, pad_str ? op_conv_pad : op_conv, a, 7, &out, 1);
    CHECKF(rc == OPJIT_OK, "%s: %s", what, opjit_errmsg(rt));
    int64_t os[4] = {g.n, g.o, g.ho, g.wo}, ny = ref_numel(4, os);
    if (!rc && out_shape_is(out, 4, os)) {
        double *xd = rt_doubles(&x), *wd = rt_doubles(&w), *bd = rt_doubles(&b), worst;
        double *y = malloc(sizeof(double) * (size_t)(ny + 1));
        double *ym = malloc(sizeof(double) * (size_t)(ny + 1));
        ref_conv_forward(&g, xd, wd, bias ? bd : NULL, y, ym);
        int64_t bad = ref_compare(out, y, ym, ny, bits, &worst);
        CHECKF(bad == 0, "%s: %lld elements off (worst %g)", what, (long long)bad, worst);
        free(xd), free(wd), free(bd), free(y), free(ym);
    } else if (!rc) {
        CHECKF(0, "%s: output shape", what);
    }
    if (out)
        out->deleter(out);
    rt_free(&x), rt_free(&w), rt_free(&b);
}

static void test_conv2d_layouts(void)
{
    /* n c h w o kh kw sh sw ph pw ph2 pw2 dh dw groups */
    static const ref_conv cases[] = {
        {2, 8, 9, 11, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},   /* Winograd (opt tier) */
        {2, 6, 7, 5, 4, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0},    /* 1x1 direct */
        {3, 4, 10, 9, 8, 3, 2, 2, 1, 1, 0, 1, 0, 1, 2, 2, 0, 0},   /* groups 2, strides */
        {1, 16, 20, 20, 32, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, /* tiles of 32 */
        {2, 6, 8, 8, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 6, 0, 0},    /* depthwise */
        {0, 3, 5, 5, 4, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0},    /* empty batch */
    };
    /* a 1x1 of a channels_last input with fewer output channels, read in
     * place in the optimizing tier: blocks of positions, bias, an image of
     * one row */
    static const ref_conv nhwc[] = {
        {3, 40, 20, 20, 24, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0},
        {2, 17, 1, 33, 5, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0},
        {1, 64, 30, 31, 63, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0},
    };
    char what[160];
    ref_seed(30);
    for (size_t i = 0; i < sizeof nhwc / sizeof *nhwc; i++)
        for (int bias = 0; bias < 2; bias++) {
            snprintf(what, sizeof what, "conv2d 1x1 channels_last case %zu bias %d", i, bias);
            conv_layout_run(nhwc[i], 32, RL_CHLAST, RL_DENSE, RL_DENSE, bias, NULL, what);
        }
    ref_seed(31);
    for (int bits = 32; bits <= 64; bits += 32)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
            for (int lay = 0; lay < RL_COUNT; lay++) {
                int lx = lay, lw = (lay + 2) % RL_COUNT, lb = (lay + 3) % RL_COUNT;
                snprintf(what, sizeof what, "conv2d case %zu f%d input %s weight %s bias %s",
                         i, bits, rl_names[lx], rl_names[lw], rl_names[lb]);
                conv_layout_run(cases[i], bits, lx, lw, lb, lay % 2 == 0, NULL, what);
            }
}

/* padding="same" and "valid" against explicit padding in the reference:
 * "same" pads dil * (k - 1) in all, the odd one at the bottom / right. */
static void test_conv2d_padding_strings(void)
{
    static const int64_t ks[][4] = {/* kh kw dh dw */
                                    {3, 3, 1, 1}, {2, 2, 1, 1}, {4, 3, 1, 2}, {2, 5, 3, 1},
                                    {1, 1, 1, 1}, {5, 5, 2, 2}, {6, 1, 1, 1}};
    char what[160];
    ref_seed(32);
    for (int bits = 32; bits <= 64; bits += 32)
        for (size_t i = 0; i < sizeof ks / sizeof *ks; i++)
            for (int same = 0; same < 2; same++) {
                ref_conv g = {2, 4, 9, 10, 6, ks[i][0], ks[i][1], 1, 1, 0, 0, 0, 0,
                              ks[i][2], ks[i][3], 2, 0, 0};
                if (same) {
                    g.ph = g.dh * (g.kh - 1) / 2;
                    g.ph2 = g.dh * (g.kh - 1) - g.ph;
                    g.pw = g.dw * (g.kw - 1) / 2;
                    g.pw2 = g.dw * (g.kw - 1) - g.pw;
                }
                snprintf(what, sizeof what, "conv2d.padding %s kernel %lldx%lld dilation "
                         "%lldx%lld f%d", same ? "same" : "valid", (long long)g.kh,
                         (long long)g.kw, (long long)g.dh, (long long)g.dw, bits);
                conv_layout_run(g, bits, i % 2 ? RL_CHLAST : RL_DENSE, RL_DENSE, RL_DENSE,
                                (int)(i % 2), same ? "same" : "valid", what);
            }
    /* Winograd in the optimizing tier with an asymmetric "same" (2x2 is
     * not 3x3: a 3x3 with dilation 1 is symmetric), and a large one */
    ref_conv g = {4, 8, 16, 17, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0};
    conv_layout_run(g, 32, RL_DENSE, RL_DENSE, RL_DENSE, 1, "same", "same 3x3 Winograd");
}

static void expect_fail(const opjit_op *op, opjit_value *a, int na, int st, const char *needle,
                        const char *what)
{
    DLManagedTensor *out = NULL;
    int rc = opjit_call(rt, op, a, na, &out, 1);
    CHECKF(rc == st, "%s: expected %s, got %s (%s)", what, opjit_status_name(st),
           opjit_status_name(rc), opjit_errmsg(rt));
    if (rc == OPJIT_OK)
        out->deleter(out);
    else
        CHECKF(strstr(opjit_errmsg(rt), needle) != NULL, "%s: message '%s' lacks '%s'", what,
               opjit_errmsg(rt), needle);
}

/* What F.conv2d refuses, conv2d refuses, with its words. */
static void test_conv2d_refusals(void)
{
    rtensor x, w, w0, b5, xe;
    int64_t xs[4] = {1, 4, 5, 5}, ws[4] = {4, 4, 3, 3}, w0s[4] = {4, 4, 0, 3}, bs[1] = {5};
    int64_t xes[4] = {1, 4, 0, 5};
    rt_dense(&x, 32, 4, xs);
    rt_dense(&w, 32, 4, ws);
    rt_dense(&w0, 32, 4, w0s);
    rt_dense(&b5, 32, 1, bs);
    rt_dense(&xe, 32, 4, xes);
    int64_t one[2] = {1, 1}, two[2] = {2, 2}, s12[2] = {1, 2};
    opjit_value a[7] = {opjit_tensor(&x.t), opjit_tensor(&w.t), opjit_none(), opjit_ints(one, 2),
                        opjit_str("same"), opjit_ints(one, 2), opjit_int(1)};
    DLManagedTensor *out = NULL;
    CHECKF(opjit_call(rt, op_conv_pad, a, 7, &out, 1) == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (out) {
        CHECK(out->dl_tensor.shape[2] == 5 && out->dl_tensor.shape[3] == 5);
        out->deleter(out);
    }
    /* the default is "valid" */
    out = NULL;
    CHECKF(opjit_call(rt, op_conv_pad, a, 2, &out, 1) == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (out) {
        CHECK(out->dl_tensor.shape[2] == 3 && out->dl_tensor.shape[3] == 3);
        out->deleter(out);
    }
    a[4] = opjit_str("foo");
    expect_fail(op_conv_pad, a, 7, OPJIT_EKERNEL, "Invalid padding string: 'foo'", "foo");
    a[4] = opjit_str("SAME");
    expect_fail(op_conv_pad, a, 7, OPJIT_EKERNEL, "Invalid padding string: 'SAME'", "SAME");
    a[4] = opjit_str("same");
    a[3] = opjit_ints(two, 2);
    expect_fail(op_conv_pad, a, 7, OPJIT_EKERNEL,
                "padding='same' is not supported for strided convolutions", "same, stride 2");
    a[3] = opjit_ints(s12, 2);
    expect_fail(op_conv_pad, a, 7, OPJIT_EKERNEL,
                "padding='same' is not supported for strided convolutions", "same, stride 1,2");
    a[3] = opjit_ints(one, 2);
    a[4] = opjit_int(1);
    expect_fail(op_conv_pad, a, 7, OPJIT_ECALL, "expected str", "an int for str padding");
    a[4] = opjit_str("valid");
    a[1] = opjit_tensor(&w0.t);
    expect_fail(op_conv_pad, a, 7, OPJIT_EKERNEL, "kernel size should be greater than zero",
                "kernel 0x3");
    a[1] = opjit_tensor(&w.t);
    a[2] = opjit_tensor(&b5.t);
    expect_fail(op_conv_pad, a, 7, OPJIT_EKERNEL, "expected bias to be 1-dimensional with 4",
                "bias of 5");
    a[2] = opjit_none();
    a[0] = opjit_tensor(&xe.t);
    a[4] = opjit_str("same");
    expect_fail(op_conv_pad, a, 7, OPJIT_EKERNEL,
                "Only zero batch or zero channel inputs are supported", "zero height");
    a[6] = opjit_int(0);
    a[0] = opjit_tensor(&x.t);
    expect_fail(op_conv_pad, a, 7, OPJIT_EKERNEL, "non-positive groups is not supported",
                "groups 0");
    rt_free(&x), rt_free(&w), rt_free(&w0), rt_free(&b5), rt_free(&xe);
}

/* mm of operands in layouts lx, ly. */
static void mm_layout_run(int64_t n, int64_t k, int64_t m, int bits, int lx, int ly,
                          const char *what)
{
    rtensor x, y;
    int64_t xs[2] = {n, k}, ys[2] = {k, m};
    rt_layout(&x, bits, 2, xs, lx);
    rt_layout(&y, bits, 2, ys, ly);
    opjit_value a[2] = {opjit_tensor(&x.t), opjit_tensor(&y.t)};
    DLManagedTensor *out = NULL;
    int rc = opjit_call(rt, op_mm, a, 2, &out, 1);
    CHECKF(rc == OPJIT_OK, "%s: %s", what, opjit_errmsg(rt));
    int64_t os[2] = {n, m};
    if (!rc && out_shape_is(out, 2, os)) {
        double *xd = rt_doubles(&x), *yd = rt_doubles(&y), worst;
        double *c = malloc(sizeof(double) * (size_t)(n * m + 1));
        double *cm = malloc(sizeof(double) * (size_t)(n * m + 1));
        ref_mm(n, k, m, xd, 0, yd, 0, c, cm);
        int64_t bad = ref_compare(out, c, cm, n * m, bits, &worst);
        CHECKF(bad == 0, "%s: %lld elements off (worst %g)", what, (long long)bad, worst);
        free(xd), free(yd), free(c), free(cm);
    } else if (!rc) {
        CHECKF(0, "%s: output shape", what);
    }
    if (out)
        out->deleter(out);
    rt_free(&x), rt_free(&y);
}

static void test_mm_layouts(void)
{
    static const int64_t sizes[][3] = {{1, 1, 1}, {5, 7, 3}, {64, 40, 130}, {130, 33, 70},
                                       {0, 4, 5}, {4, 0, 5}, {9, 1, 9}};
    char what[128];
    ref_seed(33);
    for (int bits = 32; bits <= 64; bits += 32)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
            for (int lx = 0; lx < RL_COUNT; lx++)
                for (int ly = 0; ly < RL_COUNT; ly++) {
                    snprintf(what, sizeof what, "mm %lldx%lldx%lld f%d self %s mat2 %s",
                             (long long)sizes[i][0], (long long)sizes[i][1],
                             (long long)sizes[i][2], bits, rl_names[lx], rl_names[ly]);
                    mm_layout_run(sizes[i][0], sizes[i][1], sizes[i][2], bits, lx, ly, what);
                }
}

/* as_strided: overlapping windows of one buffer, (i, j) -> i + j, as
 * torch.as_strided(t, (n, k), (1, 1)) gives. */
static void test_mm_as_strided(void)
{
    rtensor x, y;
    int64_t xs[2] = {6, 5}, xst[2] = {1, 1}, ys[2] = {5, 3};
    ref_seed(34);
    rt_view(&x, 32, 2, xs, xst, 2, 12);
    rt_dense(&y, 32, 2, ys);
    opjit_value a[2] = {opjit_tensor(&x.t), opjit_tensor(&y.t)};
    DLManagedTensor *out = NULL;
    CHECKF(opjit_call(rt, op_mm, a, 2, &out, 1) == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (out) {
        const float *xv = (const float *)x.store + 2, *yv = y.store;
        for (int i = 0; i < 6; i++)
            for (int j = 0; j < 3; j++) {
                double want = 0;
                for (int p = 0; p < 5; p++)
                    want += (double)xv[i + p] * yv[p * 3 + j];
                CHECKF(fabs(out_at(out, i * 3 + j) - want) < 1e-5, "as_strided [%d, %d]", i, j);
            }
        out->deleter(out);
    }
    rt_free(&x), rt_free(&y);
}

static const char *setup(int tiering)
{
    opjit_config cfg;
    opjit_op_info info = {.size = sizeof info};
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = tiering;
    cfg.no_cache = !tiering;
    if (opjit_create(&cfg, &rt) != OPJIT_OK)
        return NULL;
    if (opjit_load_op(rt, "conv2d", &op_conv) != OPJIT_OK ||
        opjit_find_op(rt, "conv2d.padding", &op_conv_pad) != OPJIT_OK ||
        opjit_load_op(rt, "mm", &op_mm) != OPJIT_OK) {
        fprintf(stderr, "loading the ops failed: %s\n", opjit_errmsg(rt));
        return NULL;
    }
    if (tiering && opjit_wait(rt) != OPJIT_OK) {
        fprintf(stderr, "optimizing tier failed: %s\n", opjit_errmsg(rt));
        return NULL;
    }
    if (opjit_op_info_get(rt, op_conv, &info) != OPJIT_OK || !info.tier[OPJIT_CPU])
        return "?";
    return info.tier[OPJIT_CPU];
}

static void run_suite(void)
{
    T_RUN(test_conv2d_layouts);
    T_RUN(test_conv2d_padding_strings);
    T_RUN(test_conv2d_refusals);
    T_RUN(test_mm_layouts);
    T_RUN(test_mm_as_strided);
}

int main(void)
{
    const char *tier = setup(0);
    CHECKF(tier && !strcmp(tier, "tcc"), "tiering off: tier %s", tier ? tier : "(none)");
    if (!tier) {
        opjit_destroy(rt);
        return t_done();
    }
    fprintf(stderr, "-- libtcc code\n");
    run_suite();
    opjit_destroy(rt);
    rt = NULL;
    tier = setup(1);
    if (!tier)
        CHECKF(0, "setup with tiering on failed");
    else if (!strcmp(tier, "opt")) {
        fprintf(stderr, "-- optimized code\n");
        run_suite();
    } else {
        fprintf(stderr, "-- optimizing tier not in use (tier %s): pass 2 skipped\n", tier);
    }
    opjit_destroy(rt);
    return t_done();
}
