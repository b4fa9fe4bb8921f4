/* tests/test_backward.c - the shipped backward ops (mm_backward,
 * conv2d_backward, conv2d_backward.padding in ops-src/mm.c and conv2d.c)
 * through the public API, in both tiers, against the reference loops of
 * t_ref.h: many shapes (strides, padding, dilation, groups, bias or not,
 * unbatched, zero-size dimensions), every output_mask, operands of every
 * layout, and the error paths. */
#include "t_ref.h"

#include <stdio.h>

static opjit_runtime *rt;
static opjit_op *op_mm_bw;

/* Call op; 0 and outs[0..nouts) on success, else the status (the message
 * is checked by the caller). */
static int call(const opjit_op *op, opjit_value *a, int na, DLManagedTensor **outs, int nouts)
{
    for (int i = 0; i < nouts; i++)
        outs[i] = NULL;
    return opjit_call(rt, op, a, na, outs, nouts);
}

static void free_outs(DLManagedTensor **outs, int n)
{
    for (int i = 0; i < n; i++)
        if (outs[i])
            outs[i]->deleter(outs[i]);
}

static void expect_fail(const opjit_op *op, opjit_value *a, int na, int st, const char *needle,
                        const char *what)
{
    DLManagedTensor *outs[3];
    int rc = call(op, a, na, outs, 3);
    CHECKF(rc == st, "%s: expected %s, got %s (%s)", what, opjit_status_name(st),
           opjit_status_name(rc), opjit_errmsg(rt));
    if (rc == OPJIT_OK)
        free_outs(outs, 3);
    else
        CHECKF(strstr(opjit_errmsg(rt), needle) != NULL, "%s: message '%s' lacks '%s'", what,
               opjit_errmsg(rt), needle);
}

/* A [0] output for a gradient not asked for. */
static int is_empty_1d(const DLManagedTensor *o)
{
    int64_t zero = 0;
    return out_shape_is(o, 1, &zero);
}

/* ---- mm_backward ------------------------------------------------------------ */

/* grad [n, m], self [n, k], mat2 [k, m] in layouts lg, lx, ly (RL_*). */
static void mm_bw_run(int64_t n, int64_t k, int64_t m, int bits, int lg, int lx, int ly,
                      int mask, const char *what)
{
    rtensor g, x, y;
    int64_t gs[2] = {n, m}, xs[2] = {n, k}, ys[2] = {k, m};
    rt_layout(&g, bits, 2, gs, lg);
    rt_layout(&x, bits, 2, xs, lx);
    rt_layout(&y, bits, 2, ys, ly);
    int64_t mk[2] = {mask & 1, mask >> 1};
    opjit_value a[4] = {opjit_tensor(&g.t), opjit_tensor(&x.t), opjit_tensor(&y.t),
                        opjit_ints(mk, 2)};
    DLManagedTensor *outs[2];
    int rc = call(op_mm_bw, a, 4, outs, 2);
    CHECKF(rc == OPJIT_OK, "%s: %s", what, opjit_errmsg(rt));
    if (rc) {
        rt_free(&g), rt_free(&x), rt_free(&y);
        return;
    }
    double *gd = rt_doubles(&g), *xd = rt_doubles(&x), *yd = rt_doubles(&y), worst;
    double *want = malloc(sizeof(double) * (size_t)(n * k + k * m + 1));
    double *mag = malloc(sizeof(double) * (size_t)(n * k + k * m + 1));
    for (int i = 0; i < 2; i++) {
        int64_t r = i ? k : n, c = i ? m : k, shape[2] = {r, c};
        if (!(mask >> i & 1)) {
            CHECKF(is_empty_1d(outs[i]), "%s: output %d not asked for must be [0]", what, i);
            continue;
        }
        CHECKF(out_shape_is(outs[i], 2, shape) && outs[i]->dl_tensor.dtype.bits == bits,
               "%s: output %d shape or dtype", what, i);
        if (!out_shape_is(outs[i], 2, shape))
            continue;
        if (i == 0) /* grad mat2^T */
            ref_mm(n, m, k, gd, 0, yd, 1, want, mag);
        else /* self^T grad */
            ref_mm(k, n, m, xd, 1, gd, 0, want, mag);
        int64_t bad = ref_compare(outs[i], want, mag, r * c, bits, &worst);
        CHECKF(bad == 0, "%s: output %d: %lld elements off (worst %g)", what, i, (long long)bad,
               worst);
    }
    free(want), free(mag), free(gd), free(xd), free(yd);
    free_outs(outs, 2);
    rt_free(&g), rt_free(&x), rt_free(&y);
}

static void test_mm_backward(void)
{
    static const int64_t sizes[][3] = {{1, 1, 1},   {3, 4, 5},     {17, 31, 9}, {64, 128, 33},
                                       {129, 65, 257}, {1, 300, 1}, {0, 3, 4},   {3, 0, 4},
                                       {3, 4, 0},   {0, 0, 0},     {50, 70, 1}};
    char what[128];
    ref_seed(21);
    for (int bits = 32; bits <= 64; bits += 32)
        for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
            for (int lay = 0; lay < RL_COUNT; lay++) {
                int lg = lay, lx = (lay + 1) % RL_COUNT, ly = (lay + 2) % RL_COUNT;
                snprintf(what, sizeof what, "mm_backward %lldx%lldx%lld f%d grad %s self %s "
                         "mat2 %s", (long long)sizes[i][0], (long long)sizes[i][1],
                         (long long)sizes[i][2], bits, rl_names[lg], rl_names[lx],
                         rl_names[ly]);
                mm_bw_run(sizes[i][0], sizes[i][1], sizes[i][2], bits, lg, lx, ly, 3, what);
            }
    /* every output_mask */
    for (int mask = 0; mask < 4; mask++) {
        snprintf(what, sizeof what, "mm_backward mask %d", mask);
        mm_bw_run(20, 30, 40, 32, RL_DENSE, RL_CHLAST, RL_DENSE, mask, what);
    }
}

static void test_mm_backward_defaults_and_errors(void)
{
    rtensor g, x, y, g_bad, g64, g3;
    int64_t gs[2] = {2, 4}, xs[2] = {2, 3}, ys[2] = {3, 4}, gbs[2] = {4, 2}, g3s[3] = {2, 4, 1};
    rt_dense(&g, 32, 2, gs);
    rt_dense(&x, 32, 2, xs);
    rt_dense(&y, 32, 2, ys);
    rt_dense(&g_bad, 32, 2, gbs);
    rt_dense(&g64, 64, 2, gs);
    rt_dense(&g3, 32, 3, g3s);
    /* output_mask left out: both gradients */
    opjit_value a[4] = {opjit_tensor(&g.t), opjit_tensor(&x.t), opjit_tensor(&y.t)};
    DLManagedTensor *outs[2];
    int rc = call(op_mm_bw, a, 3, outs, 2);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (!rc) {
        CHECK(out_shape_is(outs[0], 2, xs) && out_shape_is(outs[1], 2, ys));
        free_outs(outs, 2);
    }
    a[0] = opjit_tensor(&g_bad.t);
    expect_fail(op_mm_bw, a, 3, OPJIT_EKERNEL, "grad has shape [4, 2]", "grad shape");
    a[0] = opjit_tensor(&g64.t);
    expect_fail(op_mm_bw, a, 3, OPJIT_EKERNEL, "grad dtype", "grad dtype");
    a[0] = opjit_tensor(&g3.t);
    expect_fail(op_mm_bw, a, 3, OPJIT_ECALL, "grad", "grad 3-D");
    a[0] = opjit_tensor(&g.t);
    int64_t three[3] = {1, 1, 1};
    a[3] = opjit_ints(three, 3);
    expect_fail(op_mm_bw, a, 4, OPJIT_ECALL, "output_mask", "output_mask of 3");
    a[1] = opjit_tensor(&y.t);
    a[2] = opjit_tensor(&x.t);
    a[3] = opjit_int(1);
    expect_fail(op_mm_bw, a, 4, OPJIT_EKERNEL, "cannot be multiplied", "self/mat2 mismatch");
    rt_free(&g), rt_free(&x), rt_free(&y), rt_free(&g_bad), rt_free(&g64), rt_free(&g3);
}

/* ---- main ---------------------------------------------------------------------- */

static const char *setup(int tiering)
{
    opjit_config cfg;
    opjit_op_info info;
    opjit_op *any = NULL;
    opjit_config_init(&cfg);
    cfg.tiering = tiering;
    cfg.no_cache = !tiering; /* else optimized code in the cache would serve */
    if (opjit_create(&cfg, &rt) != OPJIT_OK)
        return NULL;
    if (opjit_load_op(rt, "mm", &any) != OPJIT_OK ||
        opjit_find_op(rt, "mm_backward", &op_mm_bw) != OPJIT_OK) {
        fprintf(stderr, "loading the ops failed: %s\n", opjit_errmsg(rt));
        return NULL;
    }
    if (tiering && opjit_wait(rt) != OPJIT_OK) {
        fprintf(stderr, "optimizing tier failed: %s\n", opjit_errmsg(rt));
        return NULL;
    }
    if (opjit_op_info_get(rt, op_mm_bw, &info) != OPJIT_OK || !info.tier[OPJIT_CPU])
        return "?";
    return info.tier[OPJIT_CPU];
}

static void run_suite(void)
{
    T_RUN(test_mm_backward);
    T_RUN(test_mm_backward_defaults_and_errors);
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
