/*
 * bench/dnnl_anchor.c - oneDNN's convolution (its C API), the CPU anchor of
 * conv2d in bench/run. Built by bench/run only where oneDNN is installed
 * (libdnnl-dev); the library never links it.
 *
 *   dnnl_anchor serve
 *       A coprocess answering one command per stdin line:
 *         conv X.npy W.npy STRIDE PAD THREADS ITERS
 *             ITERS convolutions of the NCHW float32 input by the OIHW
 *             weights, no bias, on THREADS OpenMP threads. Replies
 *             "ok sec=.. cpu=.. flt=.. impl=.. layout=.." (seconds for all
 *             ITERS, process CPU seconds, minor page faults per call, the
 *             implementation oneDNN chose, the layout timed).
 *         sgemm A.npy B.npy THREADS ITERS
 *             ITERS products A . B by dnnl_sgemm (row-major float32) into a
 *             preallocated C, as the cblas_sgemm row does. Replies "ok
 *             sec=.. cpu=.. flt=.. impl=gemm:ISA".
 *         quit
 *
 * The instruction set oneDNN dispatches to is its own choice; bench/run
 * --isa avx2 caps it with DNNL_MAX_CPU_ISA (ONEDNN_MAX_CPU_ISA) and every
 * reply names the one in effect.
 *
 * As a user of NCHW tensors gets it at its best: two primitives are set up
 * the first time a shape and thread count is seen, one computing on plain
 * NCHW tensors and one on the blocked layouts oneDNN prefers (weights in
 * its format either way, reordered once, untimed); both are timed once and
 * the faster is kept. A timed call of the blocked one includes reordering
 * the NCHW input into its layout and the output back to NCHW, as a host
 * holding NCHW tensors must. Each call allocates its NCHW output (malloc,
 * freed after the call), as a framework's operator does; the blocked
 * intermediates are allocated once.
 */
#define _GNU_SOURCE
#include <dnnl.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include "tools/npy.h"

#define CHECK_DNNL(call)                                                    \
    do {                                                                    \
        dnnl_status_t s_ = (call);                                          \
        if (s_ != dnnl_success) {                                           \
            printf("err %s: status %d\n", #call, (int)s_);                  \
            fflush(stdout);                                                 \
            return -1;                                                      \
        }                                                                   \
    } while (0)

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static double cpu_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static long minflt(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* One primitive with its memories. */
typedef struct variant {
    dnnl_primitive_t conv, rin, rout; /* rin/rout: NULL for plain NCHW */
    dnnl_memory_t src, wei, dst;      /* the convolution's memories */
    dnnl_memory_t user_src;           /* the NCHW input */
    dnnl_memory_desc_t user_dst_md;
    size_t dst_bytes;
    char impl[128];
} variant;

typedef struct setup {
    char x[512], w[512];
    int stride, pad, threads, blocked;
    variant v;
    struct setup *next;
} setup;

static dnnl_engine_t eng;
static dnnl_stream_t strm;
static setup *setups;

typedef struct loaded {
    char path[512];
    npy_array a;
    struct loaded *next;
} loaded;
static loaded *inputs;

static npy_array *input(const char *path)
{
    for (loaded *l = inputs; l; l = l->next)
        if (!strcmp(l->path, path))
            return &l->a;
    loaded *l = calloc(1, sizeof *l);
    char err[256];
    if (!l || npy_read(path, &l->a, err, sizeof err)) {
        printf("err %s: %s\n", path, l ? err : "out of memory");
        fflush(stdout);
        free(l);
        return NULL;
    }
    snprintf(l->path, sizeof l->path, "%s", path);
    l->next = inputs;
    inputs = l;
    return &l->a;
}

/* Build one variant: plain (every tensor NCHW/OIHW, weights any) or
 * blocked (every layout "any": oneDNN picks). */
static int build(variant *v, const npy_array *x, const npy_array *w, int stride, int pad,
                 int blocked)
{
    const int64_t *xs = x->t.shape, *ws = w->t.shape;
    int64_t ho = (xs[2] + 2 * pad - ws[2]) / stride + 1, wo = (xs[3] + 2 * pad - ws[3]) / stride + 1;
    dnnl_dims_t sd = {xs[0], xs[1], xs[2], xs[3]}, wd = {ws[0], ws[1], ws[2], ws[3]};
    dnnl_dims_t dd = {xs[0], ws[0], ho, wo}, st = {stride, stride}, pd = {pad, pad};
    dnnl_dims_t dil = {0, 0};
    dnnl_memory_desc_t u_src, u_wei, c_src, c_wei, c_dst;
    dnnl_format_tag_t act = blocked ? dnnl_format_tag_any : dnnl_nchw;
    CHECK_DNNL(dnnl_memory_desc_init_by_tag(&u_src, 4, sd, dnnl_f32, dnnl_nchw));
    CHECK_DNNL(dnnl_memory_desc_init_by_tag(&u_wei, 4, wd, dnnl_f32, dnnl_oihw));
    CHECK_DNNL(dnnl_memory_desc_init_by_tag(&v->user_dst_md, 4, dd, dnnl_f32, dnnl_nchw));
    CHECK_DNNL(dnnl_memory_desc_init_by_tag(&c_src, 4, sd, dnnl_f32, act));
    CHECK_DNNL(dnnl_memory_desc_init_by_tag(&c_wei, 4, wd, dnnl_f32, dnnl_format_tag_any));
    CHECK_DNNL(dnnl_memory_desc_init_by_tag(&c_dst, 4, dd, dnnl_f32, act));
    dnnl_convolution_desc_t cd;
    CHECK_DNNL(dnnl_dilated_convolution_forward_desc_init(
        &cd, dnnl_forward_inference, dnnl_convolution_auto, &c_src, &c_wei, NULL, &c_dst, st,
        dil, pd, pd));
    dnnl_primitive_desc_t cpd;
    CHECK_DNNL(dnnl_primitive_desc_create(&cpd, &cd, NULL, eng, NULL));
    const char *impl = "?";
    dnnl_primitive_desc_query(cpd, dnnl_query_impl_info_str, 0, &impl);
    snprintf(v->impl, sizeof v->impl, "%s", impl);
    const dnnl_memory_desc_t *psrc = dnnl_primitive_desc_query_md(cpd, dnnl_query_src_md, 0);
    const dnnl_memory_desc_t *pwei = dnnl_primitive_desc_query_md(cpd, dnnl_query_weights_md, 0);
    const dnnl_memory_desc_t *pdst = dnnl_primitive_desc_query_md(cpd, dnnl_query_dst_md, 0);
    CHECK_DNNL(dnnl_primitive_create(&v->conv, cpd));
    /* weights: reordered once into the primitive's format, untimed */
    dnnl_memory_t uw;
    CHECK_DNNL(dnnl_memory_create(&uw, &u_wei, eng, w->data));
    CHECK_DNNL(dnnl_memory_create(&v->wei, pwei, eng, DNNL_MEMORY_ALLOCATE));
    dnnl_primitive_desc_t rpd;
    CHECK_DNNL(dnnl_reorder_primitive_desc_create(&rpd, &u_wei, eng, pwei, eng, NULL));
    dnnl_primitive_t r;
    CHECK_DNNL(dnnl_primitive_create(&r, rpd));
    dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, uw}, {DNNL_ARG_TO, v->wei}};
    CHECK_DNNL(dnnl_primitive_execute(r, strm, 2, ra));
    CHECK_DNNL(dnnl_stream_wait(strm));
    dnnl_primitive_destroy(r);
    dnnl_primitive_desc_destroy(rpd);
    dnnl_memory_destroy(uw);
    CHECK_DNNL(dnnl_memory_create(&v->user_src, &u_src, eng, x->data));
    v->dst_bytes = dnnl_memory_desc_get_size(&v->user_dst_md);
    v->rin = v->rout = NULL;
    if (dnnl_memory_desc_equal(psrc, &u_src)) {
        v->src = v->user_src;
    } else {
        CHECK_DNNL(dnnl_memory_create(&v->src, psrc, eng, DNNL_MEMORY_ALLOCATE));
        CHECK_DNNL(dnnl_reorder_primitive_desc_create(&rpd, &u_src, eng, psrc, eng, NULL));
        CHECK_DNNL(dnnl_primitive_create(&v->rin, rpd));
        dnnl_primitive_desc_destroy(rpd);
    }
    if (dnnl_memory_desc_equal(pdst, &v->user_dst_md)) {
        /* the conv writes the user's (per-call) output */
        CHECK_DNNL(dnnl_memory_create(&v->dst, pdst, eng, DNNL_MEMORY_NONE));
    } else {
        CHECK_DNNL(dnnl_memory_create(&v->dst, pdst, eng, DNNL_MEMORY_ALLOCATE));
        CHECK_DNNL(dnnl_reorder_primitive_desc_create(&rpd, pdst, eng, &v->user_dst_md, eng,
                                                      NULL));
        CHECK_DNNL(dnnl_primitive_create(&v->rout, rpd));
        dnnl_primitive_desc_destroy(rpd);
    }
    dnnl_primitive_desc_destroy(cpd);
    return 0;
}

/* One call as a host with NCHW tensors makes it: reorder in (blocked),
 * convolve, reorder out (blocked) into a freshly allocated NCHW output. */
static int run_once(variant *v)
{
    void *out = malloc(v->dst_bytes);
    if (!out)
        return -1;
    dnnl_memory_t uo;
    CHECK_DNNL(dnnl_memory_create(&uo, &v->user_dst_md, eng, out));
    if (v->rin) {
        dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, v->user_src}, {DNNL_ARG_TO, v->src}};
        CHECK_DNNL(dnnl_primitive_execute(v->rin, strm, 2, a));
    }
    if (!v->rout)
        CHECK_DNNL(dnnl_memory_set_data_handle(v->dst, out));
    dnnl_exec_arg_t ca[3] = {{DNNL_ARG_SRC, v->src}, {DNNL_ARG_WEIGHTS, v->wei},
                             {DNNL_ARG_DST, v->dst}};
    CHECK_DNNL(dnnl_primitive_execute(v->conv, strm, 3, ca));
    if (v->rout) {
        dnnl_exec_arg_t a[2] = {{DNNL_ARG_FROM, v->dst}, {DNNL_ARG_TO, uo}};
        CHECK_DNNL(dnnl_primitive_execute(v->rout, strm, 2, a));
    }
    CHECK_DNNL(dnnl_stream_wait(strm));
    dnnl_memory_destroy(uo);
    free(out);
    return 0;
}

static double time_calls(variant *v, long iters)
{
    double t0 = now_s();
    for (long i = 0; i < iters; i++)
        if (run_once(v))
            return -1;
    return now_s() - t0;
}

static setup *find_setup(const char *xp, const char *wp, int stride, int pad, int threads)
{
    for (setup *s = setups; s; s = s->next)
        if (!strcmp(s->x, xp) && !strcmp(s->w, wp) && s->stride == stride && s->pad == pad &&
            s->threads == threads)
            return s;
    npy_array *x = input(xp), *w = input(wp);
    if (!x || !w)
        return NULL;
    variant cand[2];
    double best[2];
    for (int b = 0; b < 2; b++) {
        if (build(&cand[b], x, w, stride, pad, b))
            return NULL;
        time_calls(&cand[b], 2); /* warm up */
        best[b] = 1e30;
    }
    /* alternating, best of 9: a burst of load elsewhere hits both */
    for (int r = 0; r < 9; r++)
        for (int b = 0; b < 2; b++) {
            double t = time_calls(&cand[b], 2);
            if (t >= 0 && t < best[b])
                best[b] = t;
        }
    setup *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    snprintf(s->x, sizeof s->x, "%s", xp);
    snprintf(s->w, sizeof s->w, "%s", wp);
    s->stride = stride;
    s->pad = pad;
    s->threads = threads;
    s->blocked = best[1] < best[0];
    s->v = cand[s->blocked]; /* the other is never freed: a few per shape */
    s->next = setups;
    setups = s;
    return s;
}

static void serve_conv(char **w)
{
    int stride = atoi(w[3]), pad = atoi(w[4]), threads = atoi(w[5]);
    long iters = atol(w[6]);
    omp_set_num_threads(threads);
    setup *s = find_setup(w[1], w[2], stride, pad, threads);
    if (!s)
        return;
    long f0 = minflt();
    double c0 = cpu_s();
    double t = time_calls(&s->v, iters);
    double c1 = cpu_s();
    long f1 = minflt();
    if (t < 0) {
        printf("err a call failed\n");
    } else {
        for (char *p = s->v.impl; *p; p++)
            if (*p == ' ')
                *p = '_';
        printf("ok sec=%.9f cpu=%.9f flt=%.3f impl=%s layout=%s\n", t, c1 - c0,
               (double)(f1 - f0) / (double)iters, s->v.impl, s->blocked ? "blocked" : "nchw");
    }
    fflush(stdout);
}

/* The instruction set oneDNN dispatches to at most ("avx2"). */
static const char *isa_name(void)
{
    switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41: return "sse41";
    case dnnl_cpu_isa_avx: return "avx";
    case dnnl_cpu_isa_avx2: return "avx2";
    case dnnl_cpu_isa_avx2_vnni: return "avx2_vnni";
    case dnnl_cpu_isa_avx512_core: return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni: return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16: return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx: return "avx512_core_amx";
    default: return "other";
    }
}

static void serve_sgemm(char **w)
{
    npy_array *a = input(w[1]), *b = input(w[2]);
    int threads = atoi(w[3]);
    long iters = atol(w[4]);
    if (!a || !b)
        return;
    if (a->t.ndim != 2 || b->t.ndim != 2 || a->t.shape[1] != b->t.shape[0] || threads < 1) {
        printf("err sgemm: bad inputs\n");
        fflush(stdout);
        return;
    }
    dnnl_dim_t n = a->t.shape[0], k = a->t.shape[1], m = b->t.shape[1];
    float *c = malloc((size_t)(n * m) * sizeof(float));
    if (!c) {
        printf("err out of memory\n");
        fflush(stdout);
        return;
    }
    omp_set_num_threads(threads);
    dnnl_status_t st = dnnl_sgemm('N', 'N', n, m, k, 1.0f, a->data, k, b->data, m, 0.0f, c, m);
    long f0 = minflt();
    double c0 = cpu_s(), t0 = now_s();
    for (long i = 0; i < iters && st == dnnl_success; i++)
        st = dnnl_sgemm('N', 'N', n, m, k, 1.0f, a->data, k, b->data, m, 0.0f, c, m);
    double t = now_s() - t0, c1 = cpu_s();
    long f1 = minflt();
    free(c);
    if (st != dnnl_success)
        printf("err dnnl_sgemm: status %d\n", (int)st);
    else
        printf("ok sec=%.9f cpu=%.9f flt=%.3f impl=gemm:%s\n", t, c1 - c0,
               (double)(f1 - f0) / (double)iters, isa_name());
    fflush(stdout);
}

int main(int argc, char **argv)
{
    if (argc != 2 || strcmp(argv[1], "serve")) {
        fprintf(stderr, "usage: dnnl_anchor serve\n");
        return 2;
    }
    if (dnnl_engine_create(&eng, dnnl_cpu, 0) != dnnl_success ||
        dnnl_stream_create(&strm, eng, dnnl_stream_default_flags) != dnnl_success) {
        fprintf(stderr, "dnnl_anchor: no CPU engine\n");
        return 1;
    }
    char line[4096];
    while (fgets(line, sizeof line, stdin)) {
        char *w[16];
        int nw = 0;
        for (char *p = strtok(line, " \t\r\n"); p && nw < 16; p = strtok(NULL, " \t\r\n"))
            w[nw++] = p;
        if (!nw)
            continue;
        if (!strcmp(w[0], "quit"))
            break;
        if (!strcmp(w[0], "conv") && nw == 7)
            serve_conv(w);
        else if (!strcmp(w[0], "sgemm") && nw == 5)
            serve_sgemm(w);
        else {
            printf("err unknown or malformed command '%s'\n", w[0]);
            fflush(stdout);
        }
    }
    return 0;
}
