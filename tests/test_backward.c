/* tests/test_backward.c - the shipped backward ops (mm_backward,
 * conv2d_backward, conv2d_backward.padding in ops-src/mm.c and conv2d.c)
 * through the public API, in both tiers, against the reference loops of
 * t_ref.h: many shapes (strides, padding, dilation, groups, bias or not,
 * unbatched, zero-size dimensions), every output_mask, operands of every
 * layout, and the error paths. */
#include "t_ref.h"

#include <stdio.h>

static opjit_runtime *rt;
static opjit_op *op_mm_bw, *op_conv_bw, *op_conv_bw_pad;

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
                                       {3, 4, 0},   {0, 0, 0},     {50, 70, 1},
                                       {203, 90, 301}}; /* panels, blocks, tails */
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


/* ---- conv2d_backward ----------------------------------------------------------- */

/* One call of conv2d_backward (pad_str: conv2d_backward.padding with that
 * padding; then g's padding must be what it means) with grad, input and
 * weight in layouts lg, lx, lw, against the reference. */
typedef struct bw_case {
    ref_conv g;
    int bias, unbatched, mask; /* mask: bit i = output_mask[i] */
    int lg, lx, lw;
    const char *pad_str;
} bw_case;

static void conv_bw_check(const bw_case *bc, int bits, DLManagedTensor **outs, const rtensor *dy,
                          const rtensor *x, const rtensor *w, const char *what)
{
    const ref_conv *g = &bc->g;
    int64_t nx = ref_numel(4, x->shape), nw = ref_numel(4, w->shape), worst_i;
    double *dyd = rt_doubles(dy), *xd = rt_doubles(x), *wd = rt_doubles(w), worst;
    double *dx = malloc(sizeof(double) * (size_t)(nx + 1)), *dxm = malloc(sizeof(double) * (size_t)(nx + 1));
    double *dw = malloc(sizeof(double) * (size_t)(nw + 1)), *dwm = malloc(sizeof(double) * (size_t)(nw + 1));
    double *db = malloc(sizeof(double) * (size_t)(g->o + 1)), *dbm = malloc(sizeof(double) * (size_t)(g->o + 1));
    int64_t bs[1] = {g->o}, xs4[4] = {g->n, g->c, g->h, g->w};
    ref_conv_backward(g, dyd, xd, wd, dx, dxm, dw, dwm, db, dbm);
    const double *want[3] = {dx, dw, db}, *mag[3] = {dxm, dwm, dbm};
    const int64_t *shape[3] = {bc->unbatched ? xs4 + 1 : xs4, w->shape, bs};
    int nd[3] = {bc->unbatched ? 3 : 4, 4, 1};
    int64_t count[3] = {nx, nw, g->o};
    for (int i = 0; i < 3; i++) {
        int wanted = (bc->mask >> i & 1) && (i < 2 || bc->bias);
        if (!wanted) {
            CHECKF(is_empty_1d(outs[i]), "%s: output %d not asked for must be [0]", what, i);
            continue;
        }
        CHECKF(out_shape_is(outs[i], nd[i], shape[i]) && outs[i]->dl_tensor.dtype.bits == bits,
               "%s: output %d shape or dtype", what, i);
        if (!out_shape_is(outs[i], nd[i], shape[i]))
            continue;
        worst_i = ref_compare(outs[i], want[i], mag[i], count[i], bits, &worst);
        CHECKF(worst_i == 0, "%s: output %d: %lld elements off (worst %g)", what, i,
               (long long)worst_i, worst);
    }
    free(dyd), free(xd), free(wd), free(dx), free(dxm), free(dw), free(dwm), free(db), free(dbm);
}

static void conv_bw_run(const bw_case *bc, int bits, const char *what)
{
    ref_conv g = bc->g;
    rtensor dy, x, w, b;
    ref_conv_sizes(&g);
    int64_t xs[4] = {g.n, g.c, g.h, g.w}, ws[4] = {g.o, g.c / g.groups, g.kh, g.kw};
    int64_t ys[4] = {g.n, g.o, g.ho, g.wo}, bs[1] = {g.o};
    int u = bc->unbatched;
    rt_layout(&dy, bits, u ? 3 : 4, ys + u, u ? RL_DENSE : bc->lg);
    rt_layout(&x, bits, u ? 3 : 4, xs + u, u ? RL_DENSE : bc->lx);
    rt_layout(&w, bits, 4, ws, bc->lw);
    rt_dense(&b, bits, 1, bs);
    int64_t st[2] = {g.sh, g.sw}, pd[2] = {g.ph, g.pw}, dl[2] = {g.dh, g.dw};
    int64_t mk[3] = {bc->mask & 1, bc->mask >> 1 & 1, bc->mask >> 2 & 1};
    opjit_value a[9] = {opjit_tensor(&dy.t), opjit_tensor(&x.t), opjit_tensor(&w.t),
                        bc->bias ? opjit_tensor(&b.t) : opjit_none(), opjit_ints(st, 2),
                        bc->pad_str ? opjit_str(bc->pad_str) : opjit_ints(pd, 2),
                        opjit_ints(dl, 2), opjit_int(g.groups), opjit_ints(mk, 3)};
    DLManagedTensor *outs[3];
    int rc = call(bc->pad_str ? op_conv_bw_pad : op_conv_bw, a, 9, outs, 3);
    CHECKF(rc == OPJIT_OK, "%s: %s", what, opjit_errmsg(rt));
    if (!rc) {
        if (u) { /* the reference sees a batch of one */
            x.t.ndim = dy.t.ndim = 4;
            memmove(x.shape + 1, x.shape, 3 * sizeof(int64_t));
            memmove(dy.shape + 1, dy.shape, 3 * sizeof(int64_t));
            x.shape[0] = dy.shape[0] = 1;
        }
        bw_case c = *bc;
        c.g = g;
        conv_bw_check(&c, bits, outs, &dy, &x, &w, what);
        free_outs(outs, 3);
    }
    rt_free(&dy), rt_free(&x), rt_free(&w), rt_free(&b);
}

static void test_conv2d_backward_cases(void)
{
    /* n c h w o kh kw sh sw ph pw ph2 pw2 dh dw groups; bias unbatched */
    static const struct {
        ref_conv g;
        int bias, unbatched;
    } cases[] = {
        {{2, 3, 9, 11, 4, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0}, 1, 0}, /* plain */
        {{1, 4, 8, 8, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2, 0, 0}, 0, 0},  /* groups 2 */
        {{2, 6, 10, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 6, 0, 0}, 1, 0}, /* depthwise */
        {{2, 6, 10, 7, 12, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 6, 0, 0}, 1, 0}, /* depthwise x2 */
        {{1, 4, 12, 12, 8, 3, 3, 1, 1, 2, 2, 2, 2, 2, 2, 1, 0, 0}, 1, 0}, /* dilation 2 */
        {{3, 5, 13, 9, 7, 3, 2, 2, 3, 1, 0, 1, 0, 1, 2, 1, 0, 0}, 1, 0}, /* mixed */
        {{2, 8, 7, 5, 16, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0}, 1, 0}, /* 1x1 */
        {{2, 8, 7, 5, 16, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 2, 0, 0}, 0, 0}, /* 1x1 groups */
        {{2, 8, 7, 5, 16, 1, 1, 2, 2, 0, 0, 0, 0, 1, 1, 1, 0, 0}, 1, 0}, /* 1x1 stride 2 */
        {{2, 8, 7, 5, 16, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 1, 0}, /* 1x1 padded */
        {{1, 3, 5, 5, 2, 5, 5, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0}, 1, 0}, /* kernel = input */
        {{1, 3, 5, 5, 2, 5, 5, 3, 3, 4, 4, 4, 4, 1, 1, 1, 0, 0}, 1, 0}, /* big padding */
        {{1, 3, 4, 6, 2, 3, 3, 7, 7, 0, 4, 0, 4, 1, 1, 1, 0, 0}, 1, 0}, /* stride > size */
        {{1, 3, 6, 6, 3, 3, 3, 1, 1, 5, 5, 5, 5, 3, 3, 1, 0, 0}, 1, 0}, /* pad > input */
        {{1, 3, 6, 6, 3, 3, 3, 1, 1, 4, 1, 4, 1, 1, 1, 1, 0, 0}, 1, 0}, /* pad > k - 1 */
        {{1, 2, 1, 1, 3, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0}, 1, 0}, /* 1x1 image */
        {{1, 3, 1, 17, 4, 1, 3, 1, 2, 0, 1, 0, 1, 1, 1, 1, 0, 0}, 1, 0}, /* one row */
        {{2, 32, 17, 19, 64, 5, 3, 2, 1, 2, 1, 2, 1, 1, 3, 4, 0, 0}, 1, 0}, /* bigger */
        {{1, 3, 8, 9, 5, 3, 3, 1, 2, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 1, 1}, /* unbatched */
        {{1, 6, 13, 14, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 0, 1}, /* unbatched, 3x3 */
        {{0, 3, 5, 5, 4, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0}, 1, 0}, /* empty batch */
        {{2, 0, 5, 5, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 1, 0}, /* no channels */
        {{1, 3, 28, 28, 8, 7, 7, 2, 2, 3, 3, 3, 3, 1, 1, 1, 0, 0}, 1, 0}, /* stem-like */
        /* 3x3 stride 1 with enough tiles: Winograd for grad_input (opt) */
        {{4, 5, 9, 9, 6, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 1, 0},
        {{2, 16, 13, 17, 24, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 1, 0},
        {{3, 4, 7, 9, 5, 3, 3, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0}, 0, 0}, /* no padding */
        /* grad_weight in slices: a long reduction, few columns */
        {{6, 8, 40, 40, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 1, 0},
        {{4, 3, 60, 50, 16, 7, 7, 2, 2, 3, 3, 3, 3, 1, 1, 1, 0, 0}, 0, 0},
        /* many columns: several column blocks; many rows: row blocks */
        {{2, 70, 9, 8, 20, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 1, 0},
        {{2, 300, 5, 6, 40, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0}, 1, 0},
        {{1, 40, 4, 5, 600, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0}, 1, 0},
        {{2, 64, 16, 16, 64, 3, 3, 2, 2, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 1, 0}, /* stride 2 */
        /* a 1x1's grad_input over 8 MB (streamed out by tiles; rows unaligned) */
        {{2, 66, 127, 127, 24, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 2, 0, 0}, 0, 0},
        /* a 1x1 on one small image: grad_input in blocks of rows */
        {{1, 200, 7, 7, 24, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0}, 1, 0},
        /* grad_weight with more output channels than unfolded rows (no grad^T) */
        {{2, 16, 12, 11, 160, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}, 1, 0},
    };
    char what[96];
    for (int bits = 32; bits <= 64; bits += 32)
        for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
            bw_case bc = {cases[i].g, cases[i].bias, cases[i].unbatched, 7, RL_DENSE, RL_DENSE,
                          RL_DENSE, NULL};
            snprintf(what, sizeof what, "conv2d_backward case %zu f%d", i, bits);
            ref_seed(200 + i);
            conv_bw_run(&bc, bits, what);
        }
}

static void test_conv2d_backward_random(void)
{
    char what[96];
    ref_seed(9);
    for (int t = 0; t < 100; t++) {
        ref_conv g;
        memset(&g, 0, sizeof g);
        g.groups = ref_int(1, 4);
        g.c = g.groups * ref_int(1, 4);
        g.o = g.groups * ref_int(1, 4);
        g.kh = ref_int(1, 5);
        g.kw = ref_int(1, 5);
        g.sh = ref_int(1, 4);
        g.sw = ref_int(1, 4);
        g.ph = g.ph2 = ref_int(0, 4);
        g.pw = g.pw2 = ref_int(0, 4);
        g.dh = ref_int(1, 3);
        g.dw = ref_int(1, 3);
        int64_t hmin = g.dh * (g.kh - 1) + 1 - 2 * g.ph, wmin = g.dw * (g.kw - 1) + 1 - 2 * g.pw;
        g.h = ref_int(hmin < 1 ? 1 : hmin, (hmin < 1 ? 1 : hmin) + 10);
        g.w = ref_int(wmin < 1 ? 1 : wmin, (wmin < 1 ? 1 : wmin) + 10);
        g.n = ref_int(1, 3);
        bw_case bc = {g, (int)ref_int(0, 2), 0, (int)ref_int(1, 8), (int)ref_int(0, RL_COUNT),
                      (int)ref_int(0, RL_COUNT), (int)ref_int(0, RL_COUNT), NULL};
        snprintf(what, sizeof what, "conv2d_backward random %d (mask %d)", t, bc.mask);
        conv_bw_run(&bc, t % 3 == 0 ? 64 : 32, what);
    }
}

/* Every output_mask, operands of every layout, and padding="same"/"valid". */
static void test_conv2d_backward_masks_layouts_padding(void)
{
    ref_conv g = {2, 6, 11, 10, 8, 3, 3, 1, 1, 1, 1, 1, 1, 1, 1, 2, 0, 0};
    char what[128];
    ref_seed(10);
    for (int mask = 0; mask < 8; mask++)
        for (int bias = 0; bias < 2; bias++) {
            bw_case bc = {g, bias, 0, mask, RL_DENSE, RL_DENSE, RL_DENSE, NULL};
            snprintf(what, sizeof what, "conv2d_backward mask %d bias %d", mask, bias);
            conv_bw_run(&bc, 32, what);
        }
    for (int lay = 0; lay < RL_COUNT; lay++)
        for (int bits = 32; bits <= 64; bits += 32) {
            bw_case bc = {g, 1, 0, 7, lay, (lay + 1) % RL_COUNT, (lay + 2) % RL_COUNT, NULL};
            snprintf(what, sizeof what, "conv2d_backward f%d grad %s input %s weight %s", bits,
                     rl_names[bc.lg], rl_names[bc.lx], rl_names[bc.lw]);
            conv_bw_run(&bc, bits, what);
        }
    /* "same" with an even kernel pads one more at the bottom and right */
    static const int64_t ks[][4] = {{3, 3, 1, 1}, {2, 2, 1, 1}, {4, 3, 1, 2}, {2, 5, 3, 1}};
    for (size_t i = 0; i < sizeof ks / sizeof *ks; i++)
        for (int same = 0; same < 2; same++) {
            ref_conv q = {2, 4, 9, 10, 6, ks[i][0], ks[i][1], 1, 1, 0, 0, 0, 0, ks[i][2],
                          ks[i][3], 2, 0, 0};
            if (same) {
                q.ph = q.dh * (q.kh - 1) / 2;
                q.ph2 = q.dh * (q.kh - 1) - q.ph;
                q.pw = q.dw * (q.kw - 1) / 2;
                q.pw2 = q.dw * (q.kw - 1) - q.pw;
            }
            bw_case bc = {q, 1, 0, 7, RL_DENSE, RL_DENSE, RL_DENSE, same ? "same" : "valid"};
            snprintf(what, sizeof what, "conv2d_backward.padding %s %zu", bc.pad_str, i);
            conv_bw_run(&bc, 32, what);
        }
}

static void test_conv2d_backward_errors(void)
{
    rtensor dy, x, w, b, dy_bad, dy64;
    int64_t ys[4] = {1, 4, 3, 3}, xs[4] = {1, 2, 5, 5}, ws[4] = {4, 2, 3, 3}, bs[1] = {4};
    int64_t ybs[4] = {1, 4, 3, 2};
    rt_dense(&dy, 32, 4, ys);
    rt_dense(&x, 32, 4, xs);
    rt_dense(&w, 32, 4, ws);
    rt_dense(&b, 32, 1, bs);
    rt_dense(&dy_bad, 32, 4, ybs);
    rt_dense(&dy64, 64, 4, ys);
    opjit_value a[9] = {opjit_tensor(&dy.t), opjit_tensor(&x.t), opjit_tensor(&w.t),
                        opjit_tensor(&b.t)};
    DLManagedTensor *outs[3];
    /* only grad, input and weight given: all three gradients (the bias's) */
    CHECKF(call(op_conv_bw, a, 4, outs, 3) == OPJIT_OK, "%s", opjit_errmsg(rt));
    if (outs[0]) {
        CHECK(out_shape_is(outs[0], 4, xs) && out_shape_is(outs[1], 4, ws));
        CHECK(out_shape_is(outs[2], 1, bs));
        free_outs(outs, 3);
    }
    a[0] = opjit_tensor(&dy_bad.t);
    expect_fail(op_conv_bw, a, 4, OPJIT_EKERNEL, "grad must have the shape of the convolution's "
                "output, [1, 4, 3, 3], but got [1, 4, 3, 2]", "grad shape");
    a[0] = opjit_tensor(&dy64.t);
    expect_fail(op_conv_bw, a, 4, OPJIT_EKERNEL, "grad type (double)", "grad dtype");
    a[0] = opjit_tensor(&dy.t);
    a[8] = opjit_ints(ws, 2);
    expect_fail(op_conv_bw, a, 9, OPJIT_ECALL, "output_mask", "output_mask of 2");
    a[4] = opjit_int(1);
    a[5] = opjit_int(0);
    a[6] = opjit_int(1);
    a[7] = opjit_int(3);
    a[8] = opjit_int(1);
    expect_fail(op_conv_bw, a, 9, OPJIT_EKERNEL, "Given groups=3", "groups 3");
    a[7] = opjit_int(1);
    a[5] = opjit_str("same");
    expect_fail(op_conv_bw_pad, a, 9, OPJIT_EKERNEL, "grad must have the shape", "same: grad 3x3");
    a[5] = opjit_str("nope");
    expect_fail(op_conv_bw_pad, a, 9, OPJIT_EKERNEL, "Invalid padding string: 'nope'", "nope");
    a[4] = opjit_int(2);
    a[5] = opjit_str("same");
    expect_fail(op_conv_bw_pad, a, 9, OPJIT_EKERNEL,
                "padding='same' is not supported for strided convolutions", "same stride 2");
    rt_free(&dy), rt_free(&x), rt_free(&w), rt_free(&b), rt_free(&dy_bad), rt_free(&dy64);
}

/* ---- main ---------------------------------------------------------------------- */

static const char *setup(int tiering)
{
    opjit_config cfg;
    opjit_op_info info = {.size = sizeof info};
    opjit_op *any = NULL;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = tiering;
    cfg.no_cache = !tiering; /* else optimized code in the cache would serve */
    if (opjit_create(&cfg, &rt) != OPJIT_OK)
        return NULL;
    if (opjit_load_op(rt, "mm", &any) != OPJIT_OK ||
        opjit_find_op(rt, "mm_backward", &op_mm_bw) != OPJIT_OK ||
        opjit_load_op(rt, "conv2d", &any) != OPJIT_OK ||
        opjit_find_op(rt, "conv2d_backward", &op_conv_bw) != OPJIT_OK ||
        opjit_find_op(rt, "conv2d_backward.padding", &op_conv_bw_pad) != OPJIT_OK) {
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
    T_RUN(test_conv2d_backward_cases);
    T_RUN(test_conv2d_backward_random);
    T_RUN(test_conv2d_backward_masks_layouts_padding);
    T_RUN(test_conv2d_backward_errors);
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
