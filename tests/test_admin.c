/* tests/test_admin.c - what the opjit command does, through opjit.h alone
 * (loader/admin.c, runtime/dtype.c): dtypes by name, the search path and
 * its sources, warming with a progress callback, and cache administration
 * (list, info, verify with repair, prune, clear) on a real cache, read-only
 * layers and their trust verdict included. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "opjit.h"
#include "opjit_admin.h"
#include "t_files.h"

/* A CPU op `name` returning x * k. */
static void write_op(const char *dir, const char *file, const char *name, int k)
{
    char text[2048];
    snprintf(text, sizeof text,
             "#include <opjit_op.h>\n"
             "static int f(opjit_ctx *ctx, opjit_args *a) {\n"
             "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
             "    DLTensor *y = opjit_output(ctx, 0, x->dtype, x->ndim, x->shape);\n"
             "    if (!y) return -1;\n"
             "    const float *xs = opjit_data(x); float *ys = y->data;\n"
             "    for (int64_t i = 0; i < opjit_numel(x); i++) ys[i] = xs[i] * %d;\n"
             "    return 0;\n"
             "}\n"
             "OPJIT_MODULE(%s, m) {\n"
             "    opjit_def(m, \"%s(Tensor x) -> Tensor\", OPJIT_CPU, f, \"x * %d\");\n"
             "    opjit_require(m, \"x\", \"float32 contiguous\");\n"
             "}\n",
             k, name, name, k);
    t_write(t_path(dir, file), text, strlen(text));
}

static opjit_runtime *make_rt(const char *ops_path, const char *cache, const char *ro)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.ops_path = ops_path;
    cfg.cache_dir = cache;
    cfg.readonly_caches = ro;
    cfg.tiering = 0;
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    return rt;
}

/* ---- dtypes ---------------------------------------------------------------- */

static void test_dtypes(void)
{
    DLDataType dt, back;
    int n = 0;
    const char *name;
    for (; (name = opjit_dtype_at(n, &dt)); n++) {
        CHECKF(opjit_dtype_parse(name, &back) == OPJIT_OK, "%s", name);
        CHECK(back.code == dt.code && back.bits == dt.bits && back.lanes == 1);
        CHECK(opjit_dtype_name(dt) && !strcmp(opjit_dtype_name(dt), name));
    }
    CHECK(n == 13);
    static const char *const want[] = {"float16", "bfloat16", "uint16", "uint32", "uint64",
                                       "bool", "int8"};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        CHECKF(opjit_dtype_parse(want[i], NULL) == OPJIT_OK, "%s", want[i]);
    CHECK(opjit_dtype_parse("bfloat16", &dt) == OPJIT_OK && dt.code == kDLBfloat &&
          dt.bits == 16);
    CHECK(opjit_dtype_parse("uint64", &dt) == OPJIT_OK && dt.code == kDLUInt && dt.bits == 64);
    CHECK(opjit_dtype_parse("float128", &dt) == OPJIT_EINVAL);
    CHECK(opjit_dtype_parse("", &dt) == OPJIT_EINVAL);
    CHECK(opjit_dtype_parse(NULL, &dt) == OPJIT_EINVAL);
    CHECK(opjit_dtype_at(-1, &dt) == NULL && opjit_dtype_at(n, NULL) == NULL);
    dt.code = kDLFloat, dt.bits = 32, dt.lanes = 4;
    CHECK(opjit_dtype_name(dt) == NULL);
    dt.lanes = 1, dt.bits = 8;
    CHECK(opjit_dtype_name(dt) == NULL);
}

/* A schema may require the dtypes the table added (uint32, float16). */
static void test_dtype_in_schema(void)
{
    const char *d = t_tmpdir("admin-schema");
    const char *text = "#include <opjit_op.h>\n"
                       "static int f(opjit_ctx *ctx, opjit_args *a)\n"
                       "{ (void)ctx; (void)a; return 0; }\n"
                       "OPJIT_MODULE(qad_u, m) {\n"
                       "    opjit_def(m, \"qad_u(Tensor x) -> Tensor\", OPJIT_CPU, f, \"\");\n"
                       "    opjit_require(m, \"x\", \"uint32|float16|bfloat16\");\n"
                       "}\n";
    t_write(t_path(d, "qad_u.c"), text, strlen(text));
    opjit_runtime *rt = make_rt(d, t_path(d, "cache"), NULL);
    opjit_op *op = NULL;
    CHECKF(opjit_load_op(rt, t_path(d, "qad_u.c"), &op) == OPJIT_OK, "%s", opjit_errmsg(rt));
    float x = 1;
    int64_t shape = 1;
    DLTensor t = {&x, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, &shape, NULL, 0};
    opjit_value v = opjit_tensor(&t);
    DLManagedTensor *out = NULL;
    CHECK(op && opjit_call(rt, op, &v, 1, &out, 1) == OPJIT_ECALL && !out);
    CHECK_STR_CONTAINS(opjit_errmsg(rt),
                       "expected dtype uint32 or float16 or bfloat16, got float32");
    opjit_destroy(rt);
}

/* ---- the search path and its sources ------------------------------------------ */

typedef struct seen {
    char paths[32][PATH_MAX];
    int n, stop_after;
} seen;

static int see(void *ud, const char *path)
{
    seen *s = ud;
    if (s->n < 32)
        snprintf(s->paths[s->n], PATH_MAX, "%s", path);
    s->n++;
    return s->stop_after && s->n >= s->stop_after;
}

/* How many of s's paths, from the first, lie in d1 or d2 (the rest come
 * from $OPJIT_OPS_PATH and the installed ops). */
static int ours(const seen *s, const char *d1, const char *d2)
{
    int n = 0;
    while (n < s->n && n < 32 &&
           (!strncmp(s->paths[n], d1, strlen(d1)) || !strncmp(s->paths[n], d2, strlen(d2))))
        n++;
    return n;
}

static void test_sources(void)
{
    const char *d1 = t_tmpdir("admin-src1"), *d2 = t_tmpdir("admin-src2");
    write_op(d1, "qas_b.c", "qas_b", 2);
    write_op(d1, "qas_a.c", "qas_a", 2);
    t_write(t_path(d1, "qas_b.cu"), "x", 1);
    t_write(t_path(d1, ".qas_hidden.c"), "x", 1);
    t_write(t_path(d1, "notes.txt"), "x", 1);
    write_op(d2, "qas_a.c", "qas_a", 3); /* shadowed by d1's */
    write_op(d2, "qas_c.c", "qas_c", 3);
    char path[3 * PATH_MAX];
    snprintf(path, sizeof path, "%s:%s::%s", d1, d2, d1); /* d1 twice: listed once */
    opjit_runtime *rt = make_rt(path, t_path(d1, "cache"), NULL);
    CHECK(!strncmp(opjit_ops_path(rt), path, strlen(path)));
    CHECK(!strcmp(opjit_ops_path(NULL), ""));

    seen s = {.n = 0};
    CHECK(opjit_sources(rt, NULL, see, &s) == OPJIT_OK);
    CHECKF(ours(&s, d1, d2) == 5, "%d", ours(&s, d1, d2));
    CHECK(!strcmp(s.paths[0], t_path(d1, "qas_a.c")));
    CHECK(!strcmp(s.paths[1], t_path(d1, "qas_b.c")));
    CHECK(!strcmp(s.paths[2], t_path(d1, "qas_b.cu")));
    CHECK(!strcmp(s.paths[3], t_path(d2, "qas_a.c")));
    CHECK(!strcmp(s.paths[4], t_path(d2, "qas_c.c")));

    memset(&s, 0, sizeof s);
    CHECK(opjit_sources(rt, "qas_a", see, &s) == OPJIT_OK);
    CHECK(s.n == 2 && !strcmp(s.paths[0], t_path(d1, "qas_a.c")) &&
          !strcmp(s.paths[1], t_path(d2, "qas_a.c")));
    memset(&s, 0, sizeof s);
    CHECK(opjit_sources(rt, "qas_b", see, &s) == OPJIT_OK && s.n == 2);
    memset(&s, 0, sizeof s);
    CHECK(opjit_sources(rt, "qas_none", see, &s) == OPJIT_OK && s.n == 0);
    memset(&s, 0, sizeof s);
    s.stop_after = 1;
    CHECK(opjit_sources(rt, NULL, see, &s) == OPJIT_OK && s.n == 1);

    CHECK(opjit_sources(rt, "a/b", see, &s) == OPJIT_EINVAL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "opjit_sources");
    CHECK(opjit_sources(rt, "", see, &s) == OPJIT_EINVAL);
    CHECK(opjit_sources(rt, NULL, NULL, NULL) == OPJIT_EINVAL);
    CHECK(opjit_sources(NULL, NULL, see, &s) == OPJIT_EINVAL);
    opjit_destroy(rt);
}

/* ---- warming --------------------------------------------------------------------- */

typedef struct events {
    int started, done, by_result[5];
    int last_index, order_ok;
    char nosource[256], failed_msg[2048];
} events;

static int on_warm(void *ud, const opjit_warm_event *ev)
{
    events *e = ud;
    if (!ev->done) {
        e->order_ok &= ev->index == e->started && ev->path && *ev->path && ev->total > 0;
        e->last_index = ev->index;
        e->started++;
        return 0;
    }
    e->done++;
    CHECK(ev->result >= 0 && ev->result <= OPJIT_WARM_NOSOURCE);
    e->by_result[ev->result]++;
    CHECK(ev->message != NULL);
    if (ev->result == OPJIT_WARM_NOSOURCE) {
        snprintf(e->nosource, sizeof e->nosource, "%s", ev->path);
        CHECK(ev->status == OPJIT_ENOTFOUND);
        CHECK_STR_CONTAINS(ev->message, "no source for op");
        return 0;
    }
    e->order_ok &= ev->index == e->last_index;
    if (ev->result == OPJIT_WARM_FAILED) {
        snprintf(e->failed_msg, sizeof e->failed_msg, "%s", ev->message);
        CHECK(ev->status != OPJIT_OK);
    } else {
        CHECK(ev->status == OPJIT_OK && ev->ms >= 0);
        /* a compile names the compilers whose code it built; a hit nothing */
        if (ev->result == OPJIT_WARM_COMPILED)
            CHECK_STR_CONTAINS(ev->message, "tcc");
        else
            CHECK(!*ev->message);
    }
    return 0;
}

static int count_entries(void *ud, const opjit_cache_entry *e)
{
    int *n = ud;
    (*n)++;
    CHECK(e->key && strlen(e->key) == 32 && e->problem == NULL && e->layer == 0);
    return 0;
}

static void test_warm(void)
{
    const char *d = t_tmpdir("admin-warm"), *cache = strdup(t_path(d, "cache"));
    const char *src = t_tmpdir("admin-warm-src"), *other = t_tmpdir("admin-warm-other");
    write_op(src, "qaw_one.c", "qaw_one", 2);
    write_op(other, "qaw_one.c", "qaw_one", 5); /* the same op name, another source */
    const char *bad_text = "#include <opjit_op.h>\nthis is not C;\n";
    t_write(t_path(src, "qaw_bad.c"), bad_text, strlen(bad_text));
    char path[2 * PATH_MAX];
    snprintf(path, sizeof path, "%s:%s", src, other);
    opjit_runtime *rt = make_rt(path, cache, NULL);

    /* By name: both sources of qaw_one (neither loaded into rt), and a name
     * with no source reported first. */
    const char *targets[] = {"qaw_missing", "qaw_one", "qaw_one"};
    opjit_warm_options o = {.size = sizeof o,.targets = targets, .ntargets = 3};
    opjit_warm_result r = {.size = sizeof r};
    events e = {.order_ok = 1};
    int st = opjit_warm(rt, &o, on_warm, &e, &r);
    CHECK(st == OPJIT_ENOTFOUND);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "no source for op 'qaw_missing'");
    CHECK(!strcmp(e.nosource, "qaw_missing"));
    CHECK(r.nosource == 1 && r.sources == 2 && r.compiled == 2 && r.hits == 0 && r.failed == 0);
    CHECK(e.started == 2 && e.done == 3 && e.order_ok);
    opjit_op *op;
    CHECK(opjit_find_op(rt, "qaw_one", &op) == OPJIT_ENOTFOUND);

    /* Again: hits. The failing source fails alone. */
    const char *targets2[] = {"qaw_one", t_path(src, "qaw_bad.c")};
    o.targets = targets2;
    o.ntargets = 2;
    memset(&e, 0, sizeof e);
    e.order_ok = 1;
    st = opjit_warm(rt, &o, on_warm, &e, &r);
    CHECK(st == OPJIT_ECOMPILE);
    CHECK(r.hits == 2 && r.failed == 1 && r.compiled == 0 && r.sources == 3);
    CHECK_STR_CONTAINS(e.failed_msg, "qaw_bad.c");
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "1 of 3 sources failed");
    CHECK(e.order_ok && e.started == 3 && e.done == 3);

    /* Everything on the path, no callback: the cache holds each source. */
    setenv("OPJIT_OPS_PATH", "", 1);
    opjit_destroy(rt);
    rt = make_rt(src, cache, NULL);
    CHECK(opjit_warm(rt, NULL, NULL, NULL, &r) == OPJIT_ECOMPILE);
    CHECK(r.sources >= 2 && r.hits >= 1 && r.failed == 1);
    int n = 0;
    CHECK(opjit_cache_list(rt, count_entries, &n) == OPJIT_OK);
    CHECKF(n == 2, "%d entries", n);

    /* The optimizing tier too, when a C compiler is there. */
    const char *cc = getenv("OPJIT_CC");
    if (cc && *cc) {
        const char *one[] = {"qaw_one"};
        opjit_warm_options opt = {.size = sizeof opt,.targets = one, .ntargets = 1, .opt = 1, .cc = cc};
        CHECKF(opjit_warm(rt, &opt, NULL, NULL, &r) == OPJIT_OK, "%s", opjit_errmsg(rt));
        /* its libtcc code was cached: the optimized code is what it built */
        CHECK(r.sources == 1 && r.compiled == 1 && r.hits == 0);
        CHECKF(opjit_warm(rt, &opt, NULL, NULL, &r) == OPJIT_OK, "%s", opjit_errmsg(rt));
        CHECK(r.sources == 1 && r.hits == 1 && r.compiled == 0);
        n = 0;
        CHECK(opjit_cache_list(rt, count_entries, &n) == OPJIT_OK);
        CHECKF(n > 2, "%d entries after --opt", n);
    }
    CHECK(opjit_warm(NULL, NULL, NULL, NULL, NULL) == OPJIT_EINVAL);
    const char *empty[] = {""};
    opjit_warm_options bad = {.size = sizeof bad,.targets = empty, .ntargets = 1};
    CHECK(opjit_warm(rt, &bad, NULL, NULL, NULL) == OPJIT_EINVAL);
    opjit_destroy(rt);
    unsetenv("OPJIT_OPS_PATH");
    free((void *)cache);
}

/* ---- the cache --------------------------------------------------------------------- */

typedef struct listing {
    int n, damaged, untrusted, layer1;
    char dir[PATH_MAX], problem[1024];
} listing;

static int list_one(void *ud, const opjit_cache_entry *e)
{
    listing *l = ud;
    l->n++;
    if (e->layer == 1)
        l->layer1++;
    if (e->problem && !strcmp(e->key, "-")) {
        l->untrusted++;
        snprintf(l->problem, sizeof l->problem, "%s", e->problem);
    } else if (e->problem) {
        l->damaged++;
        snprintf(l->problem, sizeof l->problem, "%s", e->problem);
    } else {
        CHECK(e->op_name && !strncmp(e->op_name, "qac_", 4) && e->size > 0 && e->created > 0);
        CHECK(e->nartifacts >= 1 && e->tier && e->compiler && e->target && e->source_name);
        snprintf(l->dir, sizeof l->dir, "%s", e->dir);
    }
    return 0;
}

/* Warm n ops qac_0..qac_{n-1} of d into cache. */
static void fill(const char *d, const char *cache, int n)
{
    char name[32], file[40];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "qac_%d", i);
        snprintf(file, sizeof file, "%s.c", name);
        write_op(d, file, name, i + 2);
    }
    opjit_runtime *rt = make_rt(d, cache, NULL);
    opjit_warm_result r = {.size = sizeof r};
    const char *files[8];
    for (int i = 0; i < n && i < 8; i++) {
        snprintf(file, sizeof file, "qac_%d.c", i);
        files[i] = strdup(t_path(d, file));
    }
    opjit_warm_options o = {.size = sizeof o,.targets = files, .ntargets = n};
    CHECKF(opjit_warm(rt, &o, NULL, NULL, &r) == OPJIT_OK, "%s", opjit_errmsg(rt));
    for (int i = 0; i < n && i < 8; i++)
        free((void *)files[i]);
    opjit_destroy(rt);
}

/* Damage one artifact of the entry at dir: it no longer verifies. */
static void damage(const char *dir)
{
    DIR *dd = opendir(dir);
    struct dirent *de;
    while (dd && (de = readdir(dd)))
        if (de->d_name[0] != '.' && strcmp(de->d_name, "manifest")) {
            const char *p = t_path(dir, de->d_name);
            chmod(p, 0644);
            FILE *f = fopen(p, "ab");
            CHECK(f && fputs("garbage", f) >= 0);
            if (f)
                fclose(f);
            break;
        }
    if (dd)
        closedir(dd);
}

static void test_cache_admin(void)
{
    const char *d = t_tmpdir("admin-cache");
    char *cache = strdup(t_path(d, "cache"));
    fill(d, cache, 3);
    opjit_runtime *rt = make_rt(d, cache, NULL);

    opjit_cache_info info = {.size = sizeof info};
    CHECK(opjit_cache_info_get(rt, &info) == OPJIT_OK);
    CHECK(!strcmp(info.dir, cache) && info.writable && !info.offline && info.nreadonly == 0);
    CHECK(info.entries == 3 && info.bytes > 0 && info.readonly_entries == 0);
    CHECK(info.max_size > 0 && info.tmp_dirs == 0);
    CHECK(opjit_cache_readonly_dir(rt, 0) == NULL);

    listing l = {0};
    CHECK(opjit_cache_list(rt, list_one, &l) == OPJIT_OK);
    CHECK(l.n == 3 && !l.damaged && !l.untrusted && l.dir[0]);

    int nd = -1;
    memset(&l, 0, sizeof l);
    CHECK(opjit_cache_verify(rt, 0, list_one, &l, &nd) == OPJIT_OK);
    CHECK(nd == 0 && l.n == 3);

    damage(l.dir);
    memset(&l, 0, sizeof l);
    CHECK(opjit_cache_verify(rt, 0, list_one, &l, &nd) == OPJIT_OK);
    CHECK(nd == 1 && l.damaged == 1 && l.n == 3);
    CHECK(opjit_cache_verify(rt, 1, NULL, NULL, &nd) == OPJIT_OK && nd == 1); /* evicted */
    CHECK(opjit_cache_verify(rt, 0, NULL, NULL, &nd) == OPJIT_OK && nd == 0);
    CHECK(opjit_cache_info_get(rt, &info) == OPJIT_OK && info.entries == 2);

    /* Prune to a size, then clear. */
    opjit_cache_prune_result pr = {.size = sizeof pr};
    CHECK(opjit_cache_prune(rt, 1u << 30, &pr) == OPJIT_OK && pr.removed == 0);
    CHECK(pr.bytes_after == info.bytes);
    CHECK(opjit_cache_prune(rt, 1, &pr) == OPJIT_OK);
    CHECK(pr.removed == 2 && pr.removed_bytes == info.bytes && pr.bytes_after == 0);
    fill(d, cache, 2);
    CHECK(opjit_cache_clear(rt, &pr) == OPJIT_OK && pr.removed == 2 && pr.bytes_after == 0);
    CHECK(opjit_cache_clear(rt, NULL) == OPJIT_OK);
    CHECK(opjit_cache_info_get(rt, &info) == OPJIT_OK && info.entries == 0);
    opjit_destroy(rt);
    free(cache);
}

/* A read-only layer is listed after nothing and before the writable cache;
 * one that others can write is not trusted, and says so. */
static void test_layers(void)
{
    const char *d = t_tmpdir("admin-layers");
    char *ro = strdup(t_path(d, "ro")), *bad = strdup(t_path(d, "bad"));
    char *own = strdup(t_path(d, "own")), layers[3 * PATH_MAX];
    fill(d, ro, 2);
    CHECK(mkdir(bad, 0700) == 0 && mkdir(t_path(bad, "v1"), 0700) == 0);
    const char *entries = t_path(bad, "v1/entries");
    CHECK(mkdir(entries, 0777) == 0 && chmod(entries, 0777) == 0); /* others may write */
    snprintf(layers, sizeof layers, "%s:%s", ro, bad);
    opjit_runtime *rt = make_rt(d, own, layers);

    opjit_cache_info info = {.size = sizeof info};
    CHECK(opjit_cache_info_get(rt, &info) == OPJIT_OK);
    CHECK(info.nreadonly == 2 && info.readonly_entries == 2 && info.entries == 0);
    CHECK(opjit_cache_readonly_dir(rt, 0) && !strcmp(opjit_cache_readonly_dir(rt, 0), ro));
    CHECK(opjit_cache_readonly_dir(rt, 1) && !strcmp(opjit_cache_readonly_dir(rt, 1), bad));
    CHECK(opjit_cache_readonly_dir(rt, 2) == NULL && opjit_cache_readonly_dir(rt, -1) == NULL);

    listing l = {0};
    CHECK(opjit_cache_list(rt, list_one, &l) == OPJIT_OK);
    CHECK(l.n == 3 && l.layer1 == 2 && l.untrusted == 1);
    CHECK_STR_CONTAINS(l.problem, "not trusted");
    int nd = 0;
    memset(&l, 0, sizeof l);
    CHECK(opjit_cache_verify(rt, 1, list_one, &l, &nd) == OPJIT_OK);
    CHECK(nd == 1 && l.untrusted == 1 && l.layer1 == 2);
    /* Read-only layers are never changed. */
    CHECK(opjit_cache_info_get(rt, &info) == OPJIT_OK && info.readonly_entries == 2);
    opjit_cache_prune_result pr = {.size = sizeof pr};
    CHECK(opjit_cache_clear(rt, &pr) == OPJIT_OK && pr.removed == 0);
    CHECK(opjit_cache_info_get(rt, &info) == OPJIT_OK && info.readonly_entries == 2);
    opjit_destroy(rt);
    free(ro);
    free(bad);
    free(own);
}

static void test_errors(void)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.no_cache = 1;
    cfg.tiering = 0;
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    opjit_cache_prune_result pr = {.size = sizeof pr};
    CHECK(opjit_cache_prune(rt, 0, &pr) == OPJIT_ECACHE);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "disabled");
    CHECK(opjit_cache_clear(rt, &pr) == OPJIT_ECACHE && pr.removed == 0);
    opjit_cache_info info = {.size = sizeof info};
    CHECK(opjit_cache_info_get(rt, &info) == OPJIT_OK && !info.writable && !*info.dir);
    CHECK(opjit_cache_list(rt, NULL, NULL) == OPJIT_EINVAL);
    CHECK(opjit_cache_info_get(rt, NULL) == OPJIT_EINVAL);
    CHECK(opjit_cache_list(NULL, list_one, NULL) == OPJIT_EINVAL);
    CHECK(opjit_cache_verify(NULL, 0, NULL, NULL, NULL) == OPJIT_EINVAL);
    CHECK(opjit_cache_prune(NULL, 0, NULL) == OPJIT_EINVAL);
    opjit_destroy(rt);

    uint64_t v = 0;
    CHECK(opjit_parse_size("512M", &v) == OPJIT_OK && v == 512ull << 20);
    CHECK(opjit_parse_size("2G", &v) == OPJIT_OK && v == 2ull << 30);
    CHECK(opjit_parse_size("100KiB", &v) == OPJIT_OK && v == 100ull << 10);
    CHECK(opjit_parse_size("7", &v) == OPJIT_OK && v == 7);
    CHECK(opjit_parse_size("x", &v) == OPJIT_EINVAL);
    CHECK(opjit_parse_size("5Q", &v) == OPJIT_EINVAL);
    CHECK(opjit_parse_size(NULL, &v) == OPJIT_EINVAL);
}

int main(void)
{
    T_RUN(test_dtypes);
    T_RUN(test_dtype_in_schema);
    T_RUN(test_sources);
    T_RUN(test_warm);
    T_RUN(test_cache_admin);
    T_RUN(test_layers);
    T_RUN(test_errors);
    t_tmpdirs_remove();
    return t_done();
}
