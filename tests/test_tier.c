/* tests/test_tier.c - the optimizing tier (loader/tier.c): background
 * compile with the system C compiler, atomic swap, the index that lets a
 * machine without a compiler use optimized artifacts, failures that leave
 * the libtcc code serving. */
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "opjit.h"
#include "t.h"

static char dir[PATH_MAX], cache[PATH_MAX + 16], src[PATH_MAX + 16];
static const char *cc;

static const char *op_text =
    "#include <opjit_op.h>\n"
    "static int scale(opjit_ctx *ctx, opjit_args *a) {\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
    "    DLTensor *y = opjit_output(ctx, 0, x->dtype, x->ndim, x->shape);\n"
    "    if (!y) return -1;\n"
    "    const float *xs = opjit_data(x); float *ys = y->data;\n"
    "    for (int64_t i = 0; i < opjit_numel(x); i++) ys[i] = xs[i] * 3.0f + 0.1f;\n"
    "#ifdef OPJIT_TIER_OPT\n"
    "    ys[0] = TIER_MARK;\n"
    "#endif\n"
    "    return 0;\n"
    "}\n"
    "OPJIT_MODULE(scale, m) {\n"
    "    opjit_def(m, \"scale(Tensor x) -> Tensor\", OPJIT_CPU, scale, \"3x + 0.1\");\n"
    "    opjit_require(m, \"x\", \"float32 contiguous\");\n"
    "}\n";

static void write_op(const char *mark)
{
    FILE *f = fopen(src, "w");
    fprintf(f, "#define TIER_MARK %s\n%s", mark, op_text);
    fclose(f);
}

static opjit_runtime *make_rt(int tiering, const char *compiler)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.cache_dir = cache;
    cfg.tiering = tiering;
    cfg.cc = compiler;
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    return rt;
}

/* y[0] of scale([1, 2, 3, 4]): 3.1 from libtcc code, the mark from -O2. */
static float first(opjit_runtime *rt, opjit_op *op, float *second)
{
    float x[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    DLTensor t = {x, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, shape, NULL, 0};
    opjit_value args[1] = {opjit_tensor(&t)};
    DLManagedTensor *out = NULL;
    if (opjit_call(rt, op, args, 1, &out, 1) != OPJIT_OK)
        return -1;
    float *y = out->dl_tensor.data, v = y[0];
    if (second)
        *second = y[1];
    out->deleter(out);
    return v;
}

static const char *tier_of(opjit_runtime *rt, opjit_op *op)
{
    opjit_op_info info = {.size = sizeof info};
    return opjit_op_info_get(rt, op, &info) == OPJIT_OK ? info.tier[OPJIT_CPU] : "?";
}

static void swaps_in_optimized_code(void)
{
    write_op("42.0f");
    opjit_runtime *rt = make_rt(1, cc);
    opjit_op *op;
    opjit_load_info info = {.size = sizeof info};
    CHECK(opjit_load_file(rt, src, &op, &info) == OPJIT_OK);
    CHECK(!strcmp(info.tier, "tcc"));
    CHECK(opjit_wait(rt) == OPJIT_OK);
    CHECK(!strcmp(tier_of(rt, op), "opt"));
    float second = 0;
    CHECK(first(rt, op, &second) == 42.0f);
    CHECK(second == 2 * 3.0f + 0.1f); /* same arithmetic in both tiers */
    opjit_destroy(rt);
}

static void later_runtime_loads_optimized_from_cache(void)
{
    opjit_runtime *rt = make_rt(1, cc);
    opjit_op *op;
    opjit_load_info info = {.size = sizeof info};
    CHECK(opjit_load_file(rt, src, &op, &info) == OPJIT_OK);
    CHECK(info.cache_hit && !strcmp(info.tier, "opt"));
    CHECK(first(rt, op, NULL) == 42.0f);
    opjit_destroy(rt);
}

static void no_compiler_still_finds_it_through_the_index(void)
{
    opjit_runtime *rt = make_rt(1, "/nonexistent/cc");
    opjit_op *op;
    opjit_load_info info = {.size = sizeof info};
    CHECK(opjit_load_file(rt, src, &op, &info) == OPJIT_OK);
    CHECK(!strcmp(info.tier, "opt"));
    CHECK(first(rt, op, NULL) == 42.0f);
    opjit_destroy(rt);
}

static void tiering_off_serves_libtcc(void)
{
    write_op("43.0f"); /* a new source: no optimized entry yet */
    opjit_runtime *rt = make_rt(0, cc);
    opjit_op *op;
    CHECK(opjit_load_file(rt, src, &op, NULL) == OPJIT_OK);
    CHECK(opjit_wait(rt) == OPJIT_OK);
    CHECK(!strcmp(tier_of(rt, op), "tcc"));
    CHECK(first(rt, op, NULL) == 3.1f);
    opjit_destroy(rt);
}

static void failed_optimizing_compile_keeps_libtcc(void)
{
    write_op("no_such_identifier"); /* only the -O2 build sees it */
    opjit_runtime *rt = make_rt(1, cc);
    opjit_op *op;
    CHECK(opjit_load_file(rt, src, &op, NULL) == OPJIT_OK);
    CHECK(opjit_wait(rt) == OPJIT_ECOMPILE);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "optimizing compile failed");
    CHECK(!strcmp(tier_of(rt, op), "tcc"));
    CHECK(first(rt, op, NULL) == 3.1f);
    CHECK(opjit_wait(rt) == OPJIT_OK); /* the failure was reported once */
    opjit_destroy(rt);
}

static void stale_job_is_not_swapped_in(void)
{
    /* Version 1's optimized build must never replace version 2, loaded
     * while it compiled. Version 2's own optimized build fails, so the
     * libtcc code of version 2 must be what serves in the end. */
    write_op("44.0f");
    opjit_runtime *rt = make_rt(1, cc);
    opjit_op *op;
    CHECK(opjit_load_file(rt, src, &op, NULL) == OPJIT_OK);
    write_op("no_such_identifier_either");
    CHECK(opjit_load_file(rt, src, &op, NULL) == OPJIT_OK);
    CHECK(opjit_wait(rt) == OPJIT_ECOMPILE);
    CHECK(first(rt, op, NULL) == 3.1f);
    CHECK(!strcmp(tier_of(rt, op), "tcc"));
    opjit_destroy(rt);
}

/* A compiler whose --version fails: the optimizing compile fails with a
 * message opjit_wait passes on, and the runtime's private temporary
 * directory is still removed by opjit_destroy. */
static void failing_compiler_leaves_no_temporary_directory(void)
{
    char tmpd[PATH_MAX + 16], badcc[PATH_MAX + 16];
    snprintf(tmpd, sizeof tmpd, "%s/tmpdir", dir);
    snprintf(badcc, sizeof badcc, "%s/badcc", dir);
    CHECK(mkdir(tmpd, 0700) == 0);
    FILE *f = fopen(badcc, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    fputs("#!/bin/sh\necho broken\nexit 3\n", f);
    fclose(f);
    CHECK(chmod(badcc, 0755) == 0);
    const char *old = getenv("TMPDIR");
    char *saved = old ? strdup(old) : NULL;
    setenv("TMPDIR", tmpd, 1);
    write_op("45.0f"); /* not in the cache yet: libtcc compiles it */
    opjit_runtime *rt = make_rt(1, badcc);
    opjit_op *op;
    CHECK(opjit_load_file(rt, src, &op, NULL) == OPJIT_OK);
    CHECK(opjit_wait(rt) == OPJIT_ECOMPILE);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "optimizing compile failed");
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "--version failed"); /* the worker's reason */
    CHECK(first(rt, op, NULL) == 3.1f);
    opjit_destroy(rt);
    if (saved) {
        setenv("TMPDIR", saved, 1);
        free(saved);
    } else {
        unsetenv("TMPDIR");
    }
    DIR *d = opendir(tmpd);
    int left = 0;
    struct dirent *de;
    while (d && (de = readdir(d)))
        if (de->d_name[0] != '.') {
            fprintf(stderr, "  left behind: %s/%s\n", tmpd, de->d_name);
            left++;
        }
    if (d)
        closedir(d);
    CHECK(d != NULL && left == 0);
}

/* A source the compiler rejects: the failure is kept for the hour, so a
 * later runtime (a process of its own as well) does not run the compiler
 * for it again, and says why; libtcc's code serves meanwhile. */
static void rejected_source_is_not_compiled_again(void)
{
    char wrap[PATH_MAX + 16], count[PATH_MAX + 16];
    snprintf(wrap, sizeof wrap, "%s/countcc", dir);
    snprintf(count, sizeof count, "%s/compiles", dir);
    FILE *f = fopen(wrap, "w");
    CHECK(f != NULL);
    if (!f)
        return;
    /* Counts the compiles (an output file), not the --version runs. */
    fprintf(f, "#!/bin/sh\ncase \" $* \" in *\" -o \"*) echo x >> '%s';; esac\nexec '%s' \"$@\"\n",
            count, cc);
    fclose(f);
    CHECK(chmod(wrap, 0755) == 0);
    write_op("rejected_identifier");
    long long hour = (long long)(time(NULL) / 3600);
    opjit_op *op;
    for (int i = 0; i < 2; i++) {
        opjit_runtime *rt = make_rt(1, wrap);
        CHECK(opjit_load_file(rt, src, &op, NULL) == OPJIT_OK);
        CHECK(opjit_wait(rt) == OPJIT_ECOMPILE);
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "rejected_identifier");
        if (i)
            CHECK_STR_CONTAINS(opjit_errmsg(rt), "failed the same way this hour");
        CHECK(first(rt, op, NULL) == 3.1f);
        opjit_destroy(rt);
    }
    if ((long long)(time(NULL) / 3600) == hour) /* else the second tried once more */
        CHECKF(t_lines(count) == 1, "%d compiles", t_lines(count));
}

int main(void)
{
    cc = getenv("OPJIT_CC");
    if (!cc || access(cc, X_OK) != 0) {
        printf("no C compiler (OPJIT_CC): the optimizing tier is untested here\n");
        return 77;
    }
    snprintf(dir, sizeof dir, "/tmp/opjit-test-tier-XXXXXX");
    if (!mkdtemp(dir))
        return 1;
    snprintf(cache, sizeof cache, "%s/cache", dir);
    snprintf(src, sizeof src, "%s/scale.c", dir);
    T_RUN(swaps_in_optimized_code);
    T_RUN(later_runtime_loads_optimized_from_cache);
    T_RUN(no_compiler_still_finds_it_through_the_index);
    T_RUN(tiering_off_serves_libtcc);
    T_RUN(failed_optimizing_compile_keeps_libtcc);
    T_RUN(stale_job_is_not_swapped_in);
    T_RUN(failing_compiler_leaves_no_temporary_directory);
    T_RUN(rejected_source_is_not_compiled_again);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return t_done();
}
