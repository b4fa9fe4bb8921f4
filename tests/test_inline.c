/* tests/test_inline.c - opjit_load_inline: modules from source text in
 * memory, cached by content like files, their local headers confined to the
 * directory the host names; and opjit_module_ops. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "opjit.h"
#include "t.h"
#include "t_files.h"

/* Unique to this run, written into every source, so a cache kept from an
 * earlier run never turns an expected compile into a hit. */
static char nonce[96];

/* A module with the op `name`() -> int64 tensor [expr], and maybe a second
 * op `name`_twice() -> [2 * expr]; extra goes first (an #include). */
static char *module_text(const char *name, const char *expr, const char *extra, int two)
{
    static char buf[4][4096];
    static int i;
    char *b = buf[i++ % 4];
    snprintf(b, 4096,
             "%s\n"
             "#include <opjit_op.h>\n"
             "static int put(opjit_ctx *ctx, int64_t v)\n"
             "{\n"
             "    int64_t shape[1] = {1};\n"
             "    DLTensor *t = opjit_output(ctx, 0, OPJIT_INT64, 1, shape);\n"
             "    if (!t)\n"
             "        return -1;\n"
             "    ((int64_t *)opjit_data(t))[0] = v;\n"
             "    return 0;\n"
             "}\n"
             "static int one(opjit_ctx *ctx, opjit_args *a) { (void)a; return put(ctx, %s); }\n"
             "static int two(opjit_ctx *ctx, opjit_args *a) { (void)a; return put(ctx, 2 * (%s)); }\n"
             "OPJIT_MODULE(%s, m)\n"
             "{\n"
             "    opjit_def(m, \"%s() -> Tensor\", OPJIT_CPU, one, \"the value\");\n"
             "    if (%d)\n"
             "        opjit_def(m, \"%s_twice() -> Tensor\", OPJIT_CPU, two, \"twice it\");\n"
             "}\n"
             "/* %s */\n",
             extra ? extra : "", expr, expr, name, name, two, name, nonce);
    return b;
}

#define CALL_FAILED (-999999)

static long call_value(opjit_runtime *rt, const opjit_op *op)
{
    DLManagedTensor *out = NULL;
    if (!op || opjit_call(rt, op, NULL, 0, &out, 1)) {
        fprintf(stderr, "  call failed: %s\n", opjit_errmsg(rt));
        return CALL_FAILED;
    }
    long v = (long)((int64_t *)out->dl_tensor.data)[0];
    out->deleter(out);
    return v;
}

static opjit_runtime *rt_new(void)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = 0; /* libtcc code only: what is compiled is what serves */
    opjit_runtime *rt = NULL;
    int rc = opjit_create(&cfg, &rt);
    if (rc || !rt) {
        fprintf(stderr, "opjit_create: %s\n", opjit_status_name(rc));
        exit(1);
    }
    return rt;
}

static void compiles_calls_and_hits_the_cache_in_a_fresh_runtime(void)
{
    const char *text = module_text("answer", "42", NULL, 0);
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL;
    opjit_load_info info = {.size = sizeof info};
    int rc = opjit_load_inline(rt, "answer.c", text, NULL, &op, &info);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    CHECK(info.cache_hit == 0);
    CHECK(!strcmp(info.source, "answer.c"));
    CHECK(call_value(rt, op) == 42);
    opjit_op_info oi = {.size = sizeof oi};
    CHECK(opjit_op_info_get(rt, op, &oi) == OPJIT_OK);
    CHECK(!strcmp(oi.source[OPJIT_CPU], "answer.c"));
    /* The same again: nothing to do. */
    CHECK(opjit_load_inline(rt, "answer.c", text, NULL, NULL, &info) == OPJIT_OK);
    CHECK(info.cache_hit == 1);
    opjit_destroy(rt);

    rt = rt_new();
    rc = opjit_load_inline(rt, "answer.c", text, NULL, &op, &info);
    CHECKF(rc == OPJIT_OK && info.cache_hit == 1, "a fresh runtime recompiled the same text");
    CHECK(call_value(rt, op) == 42);
    opjit_destroy(rt);

    /* A file of that name and text is the same cache entry. */
    const char *dir = t_tmpdir("inline-file");
    t_write(t_path(dir, "answer.c"), text, strlen(text));
    rt = rt_new();
    rc = opjit_load_file(rt, t_path(dir, "answer.c"), &op, &info);
    CHECKF(rc == OPJIT_OK && info.cache_hit == 1, "the file of the same text missed the cache");
    opjit_destroy(rt);
}

static int count_ops(void *ud, const opjit_op *op)
{
    (void)op;
    (*(int *)ud)++;
    return 0;
}

struct names {
    opjit_runtime *rt;
    char text[256];
};

static int collect_names(void *ud, const opjit_op *op)
{
    struct names *nm = ud;
    opjit_op_info oi = {.size = sizeof oi};
    if (opjit_op_info_get(nm->rt, op, &oi) == OPJIT_OK) {
        size_t n = strlen(nm->text);
        snprintf(nm->text + n, sizeof nm->text - n, "%s%s", n ? "," : "", oi.name);
    }
    return 0;
}

static void several_ops_in_one_module(void)
{
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL;
    int rc = opjit_load_inline(rt, "pair.c", module_text("pair", "7", NULL, 1), NULL, &op, NULL);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    CHECK(call_value(rt, op) == 7);
    opjit_op *twice = NULL;
    CHECK(opjit_find_op(rt, "pair_twice", &twice) == OPJIT_OK);
    CHECK(call_value(rt, twice) == 14);
    /* An unrelated module's ops are not listed with it. */
    CHECK(opjit_load_inline(rt, "other.c", module_text("other", "1", NULL, 0), NULL, NULL,
                            NULL) == OPJIT_OK);
    struct names nm = {rt, ""};
    CHECK(opjit_module_ops(rt, twice, collect_names, &nm) == OPJIT_OK);
    CHECKF(!strcmp(nm.text, "pair,pair_twice"), "module ops: %s", nm.text);
    int n = 0;
    CHECK(opjit_module_ops(rt, NULL, count_ops, &n) == OPJIT_EINVAL);
    CHECK(opjit_module_ops(NULL, op, count_ops, &n) == OPJIT_EINVAL);
    CHECK(opjit_module_ops(rt, op, NULL, NULL) == OPJIT_EINVAL);
    /* Loading the name again with another text replaces the module: the
     * op dropped from it is gone. */
    rc = opjit_load_inline(rt, "pair.c", module_text("pair", "8", NULL, 0), NULL, &op, NULL);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    CHECK(call_value(rt, op) == 8);
    CHECK(opjit_find_op(rt, "pair_twice", &twice) == OPJIT_ENOTFOUND);
    CHECK(opjit_unload(rt, "pair") == OPJIT_OK);
    CHECK(opjit_module_ops(rt, op, collect_names, &nm) == OPJIT_ENOKERNEL);
    opjit_destroy(rt);
}

static void compile_errors_point_at_lines_of_the_string(void)
{
    opjit_runtime *rt = rt_new();
    const char *bad = "#include <opjit_op.h>\n"
                      "static int f(void) { return 1; }\n"
                      "static int g(void) { return nope; }\n";
    opjit_op *op = (opjit_op *)1;
    int rc = opjit_load_inline(rt, "scale2.c", bad, NULL, &op, NULL);
    CHECK(rc == OPJIT_ECOMPILE);
    CHECK(op == NULL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "scale2.c:3: error");
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "return nope;");
    opjit_destroy(rt);
}

static void local_headers_come_from_the_include_dir(void)
{
    const char *dir = t_tmpdir("inline-inc");
    t_write(t_path(dir, "value.h"), "#define VALUE 5\n", 16);
    const char *text = module_text("withhdr", "VALUE", "#include \"value.h\"", 0);
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL;
    int rc = opjit_load_inline(rt, "withhdr.c", text, dir, &op, NULL);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(rt));
    CHECK(call_value(rt, op) == 5);
    /* The header is in the key: editing it changes the op. */
    t_write(t_path(dir, "value.h"), "#define VALUE 6\n", 16);
    opjit_load_info info = {.size = sizeof info};
    rc = opjit_load_inline(rt, "withhdr.c", text, dir, &op, &info);
    CHECKF(rc == OPJIT_OK && info.cache_hit == 0, "%s", opjit_errmsg(rt));
    CHECK(call_value(rt, op) == 6);
    /* Angle brackets find it there too. */
    text = module_text("angle", "VALUE", "#include <value.h>", 0);
    rc = opjit_load_inline(rt, "angle.c", text, dir, &op, NULL);
    CHECKF(rc == OPJIT_OK && call_value(rt, op) == 6, "%s", opjit_errmsg(rt));
    opjit_destroy(rt);
}

/* A load of text that must fail with status, its message holding want. */
static void refused(opjit_runtime *rt, const char *name, const char *text, const char *dir,
                    int status, const char *want)
{
    opjit_op *op = (opjit_op *)1;
    int rc = opjit_load_inline(rt, name, text, dir, &op, NULL);
    CHECKF(rc == status, "%s: got %s, want %s: %s", t_str(name), opjit_status_name(rc),
           opjit_status_name(status), opjit_errmsg(rt));
    CHECK(op == NULL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), want);
}

static void bad_names_and_texts(void)
{
    opjit_runtime *rt = rt_new();
    char *ok = strdup(module_text("fine", "1", NULL, 0));
    refused(rt, "fine.c", NULL, NULL, OPJIT_EINVAL, "NULL or empty source text");
    refused(rt, "fine.c", "", NULL, OPJIT_EINVAL, "NULL or empty source text");
    refused(rt, NULL, ok, NULL, OPJIT_EINVAL, "NULL or empty name");
    refused(rt, "", ok, NULL, OPJIT_EINVAL, "NULL or empty name");
    refused(rt, "dir/fine.c", ok, NULL, OPJIT_EINVAL, "a name, not a path");
    refused(rt, "../fine.c", ok, NULL, OPJIT_EINVAL, "a name, not a path");
    refused(rt, "fine", ok, NULL, OPJIT_EINVAL, "expected NAME.c");
    refused(rt, "fine.cpp", ok, NULL, OPJIT_EINVAL, "expected NAME.c");
    refused(rt, ".c", ok, NULL, OPJIT_EINVAL, "expected NAME.c");
    refused(rt, "fi\"ne.c", ok, NULL, OPJIT_EINVAL, "letters, digits");
    refused(rt, "fi ne.c", ok, NULL, OPJIT_EINVAL, "letters, digits");
    CHECK(opjit_load_inline(NULL, "fine.c", ok, NULL, NULL, NULL) == OPJIT_EINVAL);
    /* The runtime still works after all that. */
    opjit_op *op = NULL;
    CHECK(opjit_load_inline(rt, "fine.c", ok, NULL, &op, NULL) == OPJIT_OK);
    CHECK(call_value(rt, op) == 1);
    opjit_destroy(rt);
    free(ok);
}

static void bad_include_dirs_and_includes(void)
{
    opjit_runtime *rt = rt_new();
    const char *base = t_tmpdir("inline-conf");
    char dir[1024], sub[1024], outside[1024];
    snprintf(dir, sizeof dir, "%s/inc", base);
    snprintf(sub, sizeof sub, "%s/inc/sub", base);
    snprintf(outside, sizeof outside, "%s/secret.h", base);
    CHECK(mkdir(dir, 0700) == 0 && mkdir(sub, 0700) == 0);
    t_write(outside, "#define VALUE 9\n", 16);
    t_write(t_path(dir, "value.h"), "#define VALUE 5\n", 16);
    t_write(t_path(dir, "up.h"), "#include \"../secret.h\"\n", 23);
    t_write(t_path(sub, "deep.h"), "#include \"../../secret.h\"\n", 26);
    CHECK(symlink(outside, t_path(dir, "link.h")) == 0);
    char *ok = strdup(module_text("conf", "VALUE", "#include \"value.h\"", 0));

    refused(rt, "conf.c", ok, t_path(base, "missing"), OPJIT_ENOTFOUND, "include directory");
    refused(rt, "conf.c", ok, outside, OPJIT_EINVAL, "not a directory");
    refused(rt, "conf.c", ok, "", OPJIT_EINVAL, "include directory is \"\"");
    refused(rt, "conf.c", ok, NULL, OPJIT_EINVAL,
            "conf.c:1: #include \"value.h\": no include directory was given");
    refused(rt, "conf.c", module_text("conf", "VALUE", "#include \"nothere.h\"", 0), dir,
            OPJIT_EINVAL, "conf.c:1: #include \"nothere.h\": no such header in the include");
    refused(rt, "conf.c", module_text("conf", "VALUE", "#include \"../secret.h\"", 0), dir,
            OPJIT_EINVAL, "outside the include directory");
    refused(rt, "conf.c", module_text("conf", "VALUE", "#include <../secret.h>", 0), dir,
            OPJIT_EINVAL, "outside the include directory");
    refused(rt, "conf.c", module_text("conf", "VALUE", "#include \"link.h\"", 0), dir,
            OPJIT_EINVAL, "outside the include directory");
    refused(rt, "conf.c", module_text("conf", "VALUE", "#include \"up.h\"", 0), dir,
            OPJIT_EINVAL, "conf.c: a header's #include \"../secret.h\" resolves to");
    refused(rt, "conf.c", module_text("conf", "VALUE", "#include \"sub/deep.h\"", 0), dir,
            OPJIT_EINVAL, "outside the include directory");
    char abs_inc[1200];
    snprintf(abs_inc, sizeof abs_inc, "#include \"%s\"", outside);
    refused(rt, "conf.c", module_text("conf", "VALUE", abs_inc, 0), dir, OPJIT_EINVAL,
            "by relative path only");
    /* A header of the same name in the current directory would be read by
     * the compiler first: refused, never compiled in silently. */
    char cwd[1024];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(base) == 0);
    t_write("value.h", "#define VALUE 13\n", 17);
    refused(rt, "conf.c", ok, dir, OPJIT_EINVAL, "the current directory holds another value.h");
    CHECK(chdir(cwd) == 0);
    /* And the good one loads. */
    opjit_op *op = NULL;
    CHECKF(opjit_load_inline(rt, "conf.c", ok, dir, &op, NULL) == OPJIT_OK, "%s",
           opjit_errmsg(rt));
    CHECK(call_value(rt, op) == 5);
    opjit_destroy(rt);
    free(ok);
}

/* A .cu name is a CUDA source: compiled by NVRTC where it is (then the
 * load works), else the load says the device compiler is missing. */
static void a_cu_name_is_cuda(void)
{
    opjit_runtime *rt = rt_new();
    char text[4096];
    snprintf(text, sizeof text,
             "#ifdef __CUDACC_RTC__\n"
             "extern \"C\" __global__ void noop(int n) { (void)n; }\n"
             "#else\n"
             "#include <opjit_op.h>\n"
             "static int k(opjit_ctx *ctx, opjit_args *a) { (void)ctx; (void)a; return 0; }\n"
             "OPJIT_MODULE(cuinline, m)\n"
             "{\n"
             "    opjit_def(m, \"cuinline(Tensor x) -> Tensor\", OPJIT_CUDA, k, \"nothing\");\n"
             "}\n"
             "#endif\n/* %s */\n",
             nonce);
    opjit_op *op = NULL;
    int rc = opjit_load_inline(rt, "cuinline.cu", text, NULL, &op, NULL);
    CHECKF(rc == OPJIT_OK || rc == OPJIT_EDEVICE, "%s: %s", opjit_status_name(rc),
           opjit_errmsg(rt));
    if (rc == OPJIT_OK) {
        opjit_op_info oi = {.size = sizeof oi};
        CHECK(opjit_op_info_get(rt, op, &oi) == OPJIT_OK && oi.source[OPJIT_CUDA] &&
              !oi.source[OPJIT_CPU]);
    } else {
        CHECK_STR_CONTAINS(opjit_errmsg(rt), "NVRTC");
    }
    opjit_destroy(rt);
}

int main(void)
{
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(nonce, sizeof nonce, "run %ld.%ld.%ld", (long)getpid(), (long)now.tv_sec,
             (long)now.tv_nsec);
    if (!getenv("OPJIT_CACHE_DIR")) /* run by hand: a private cache */
        setenv("OPJIT_CACHE_DIR", t_tmpdir("inline-cache"), 1);
    T_RUN(compiles_calls_and_hits_the_cache_in_a_fresh_runtime);
    T_RUN(several_ops_in_one_module);
    T_RUN(compile_errors_point_at_lines_of_the_string);
    T_RUN(local_headers_come_from_the_include_dir);
    T_RUN(bad_names_and_texts);
    T_RUN(bad_include_dirs_and_includes);
    T_RUN(a_cu_name_is_cuda);
    t_tmpdirs_remove();
    return t_done();
}
