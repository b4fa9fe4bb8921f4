/* tests/test_loader.c - loading operators through the public API: paths,
 * names on the search path, reloads, local headers, the cache, every error
 * path of a load, and the op registry (list, info, arguments).
 *
 * Every op source is written by the test into its own temporary directory;
 * op names carry a "qal_" prefix so they never collide with ops-src/. */
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "opjit.h"
#include "opjit_admin.h"
#include "cache/cache_int.h"
#include "t.h"
#include "t_files.h"
#include <xxhash.h>

/* ---- helpers ----------------------------------------------------------------- */

static const char *tmpdir_new(void) { return t_tmpdir("loader"); }
#define pjoin t_path
#define write_bytes t_write
#define tmpdirs_remove t_tmpdirs_remove

static void write_text(const char *dir, const char *name, const char *text)
{
    write_bytes(pjoin(dir, name), text, strlen(text));
}

/* Unique to this run and written into every generated op source, so a
 * cache directory kept from an earlier run never turns an expected compile
 * into a hit. */
static char run_nonce[64];

/* An op source whose kernel returns a 1-element int64 tensor holding
 * value_expr + add. extra goes before the kernel (e.g. an #include). */
static void write_const_op_ex(const char *dir, const char *file, const char *op,
                              const char *value_expr, const char *extra)
{
    char src[4096];
    snprintf(src, sizeof src,
             "#include <opjit_op.h>\n"
             "%s\n"
             "static int k_%s(opjit_ctx *ctx, opjit_args *a)\n"
             "{\n"
             "    int64_t shape[1] = {1};\n"
             "    DLTensor *t = opjit_output(ctx, 0, OPJIT_INT64, 1, shape);\n"
             "    if (!t)\n"
             "        return -1;\n"
             "    ((int64_t *)opjit_data(t))[0] = (%s) + opjit_arg_int(a, 0);\n"
             "    return 0;\n"
             "}\n"
             "OPJIT_MODULE(%s, m)\n"
             "{\n"
             "    opjit_def(m, \"%s(int add=0) -> Tensor\", OPJIT_CPU, k_%s, \"constant %s\");\n"
             "}\n"
             "/* %s */\n",
             extra ? extra : "", op, value_expr, op, op, op, value_expr, run_nonce);
    write_text(dir, file, src);
}

static void write_const_op(const char *dir, const char *file, const char *op, long value)
{
    char v[32];
    snprintf(v, sizeof v, "%ld", value);
    write_const_op_ex(dir, file, op, v, NULL);
}

#define CALL_FAILED (-999999)

/* Call a constant op with no arguments; its value, or CALL_FAILED. */
static long call_value(opjit_runtime *rt, const opjit_op *op)
{
    if (!op)
        return CALL_FAILED;
    DLManagedTensor *out = NULL;
    int rc = opjit_call(rt, op, NULL, 0, &out, 1);
    if (rc) {
        fprintf(stderr, "  call failed: %s: %s\n", opjit_status_name(rc), opjit_errmsg(rt));
        return CALL_FAILED;
    }
    long v = (long)((int64_t *)out->dl_tensor.data)[0];
    out->deleter(out);
    return v;
}

#define CHECK_VALUE(expr, want)                                              \
    do {                                                                     \
        long got_ = (expr);                                                  \
        CHECKF(got_ == (want), "%s is %ld, expected %ld", #expr, got_,       \
               (long)(want));                                                \
    } while (0)

/* The value of the op registered as name, or CALL_FAILED. */
static long call_named(opjit_runtime *rt, const char *name)
{
    opjit_op *op = NULL;
    if (opjit_find_op(rt, name, &op))
        return CALL_FAILED;
    return call_value(rt, op);
}

static opjit_runtime *rt_new_cfg(const opjit_config *cfg)
{
    opjit_runtime *rt = NULL;
    int rc = opjit_create(cfg, &rt);
    CHECKF(rc == OPJIT_OK && rt, "opjit_create: %s", opjit_status_name(rc));
    if (!rt) {
        fprintf(stderr, "cannot go on without a runtime\n");
        exit(1);
    }
    return rt;
}

/* The defaults, but no optimizing tier unless a test asks for it: its
 * background work is a thread that a discovery fork can catch inside
 * malloc, and GCC 12's AddressSanitizer allocator, which has no fork
 * handlers, then leaves the child waiting on that lock for good (seen once
 * in CI, by_name_and_by_path_agree's child past its 60 s). */
static opjit_runtime *rt_new(void)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = 0;
    return rt_new_cfg(&cfg);
}

/* Run the test body with OPJIT_OPS_PATH set to value, restoring it after. */
static char *saved_ops_path;
static void ops_path_set(const char *value)
{
    const char *cur = getenv("OPJIT_OPS_PATH");
    free(saved_ops_path);
    saved_ops_path = cur ? strdup(cur) : NULL;
    if (value)
        setenv("OPJIT_OPS_PATH", value, 1);
    else
        unsetenv("OPJIT_OPS_PATH");
}
static void ops_path_restore(void)
{
    if (saved_ops_path)
        setenv("OPJIT_OPS_PATH", saved_ops_path, 1);
    else
        unsetenv("OPJIT_OPS_PATH");
    free(saved_ops_path);
    saved_ops_path = NULL;
}

/* ---- loading by path and by name ------------------------------------------------ */

static void load_by_path_returns_the_op_named_after_the_file(void)
{
    const char *d = tmpdir_new();
    write_const_op(d, "qal_alpha.c", "qal_alpha", 41);
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL;
    int rc = opjit_load_op(rt, pjoin(d, "qal_alpha.c"), &op);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK(op != NULL);
    opjit_op_info info = {.size = sizeof info};
    CHECK(opjit_op_info_get(rt, op, &info) == OPJIT_OK);
    CHECK(info.name && !strcmp(info.name, "qal_alpha"));
    CHECK_VALUE(call_value(rt, op), 41);

    /* Two ops in one file: the one named after the file comes back, even
     * when it is registered second. */
    write_text(d, "qal_two.c",
               "#include <opjit_op.h>\n"
               "static int k(opjit_ctx *ctx, opjit_args *a)\n"
               "{\n"
               "    (void)a;\n"
               "    int64_t shape[1] = {1};\n"
               "    DLTensor *t = opjit_output(ctx, 0, OPJIT_INT64, 1, shape);\n"
               "    if (!t) return -1;\n"
               "    ((int64_t *)t->data)[0] = 2;\n"
               "    return 0;\n"
               "}\n"
               "OPJIT_MODULE(qal_two, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_two_helper() -> Tensor\", OPJIT_CPU, k, \"helper\");\n"
               "    opjit_def(m, \"qal_two() -> Tensor\", OPJIT_CPU, k, \"main\");\n"
               "}\n");
    rc = opjit_load_op(rt, pjoin(d, "qal_two.c"), &op);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK(op && opjit_op_info_get(rt, op, &info) == OPJIT_OK && !strcmp(info.name, "qal_two"));
    opjit_op *helper = NULL;
    CHECK(opjit_find_op(rt, "qal_two_helper", &helper) == OPJIT_OK && helper && helper != op);

    /* A file whose ops are named otherwise: the first it registers. */
    write_const_op(d, "qal_gamma.c", "qal_delta", 4);
    rc = opjit_load_op(rt, pjoin(d, "qal_gamma.c"), &op);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK(op && opjit_op_info_get(rt, op, &info) == OPJIT_OK && !strcmp(info.name, "qal_delta"));
    CHECK_VALUE(call_value(rt, op), 4);

    /* op may be NULL. */
    write_const_op(d, "qal_noout.c", "qal_noout", 8);
    CHECK(opjit_load_op(rt, pjoin(d, "qal_noout.c"), NULL) == OPJIT_OK);
    CHECK(call_named(rt, "qal_noout") == 8);

    /* A relative path with a '/' is a path too. */
    char cwd[1024];
    CHECK(getcwd(cwd, sizeof cwd) != NULL);
    CHECK(chdir(d) == 0);
    write_const_op(".", "qal_rel.c", "qal_rel", 12);
    rc = opjit_load_op(rt, "./qal_rel.c", &op);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 12);
    CHECK(chdir(cwd) == 0);
    opjit_destroy(rt);
}

static void load_by_name_first_directory_wins(void)
{
    const char *a = tmpdir_new(), *b = tmpdir_new();
    write_const_op(a, "qal_named.c", "qal_named", 1);
    write_const_op(b, "qal_named.c", "qal_named", 2);
    write_const_op(b, "qal_only_b.c", "qal_only_b", 3);
    char path[2100];
    snprintf(path, sizeof path, "%s:%s", a, b);
    ops_path_set(path);
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL;
    int rc = opjit_load_op(rt, "qal_named", &op);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 1);
    opjit_op_info info = {.size = sizeof info};
    CHECK(op && opjit_op_info_get(rt, op, &info) == OPJIT_OK);
    CHECK(op && info.source[OPJIT_CPU] && strstr(info.source[OPJIT_CPU], a));
    /* By name again: the same op, nothing reloaded. */
    opjit_op *again = NULL;
    CHECK(opjit_load_op(rt, "qal_named", &again) == OPJIT_OK && again == op);
    rc = opjit_load_op(rt, "qal_only_b", &op);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 3);

    /* Unknown name: not found, and the message shows where we looked. */
    op = (opjit_op *)&rc; /* must be reset */
    rc = opjit_load_op(rt, "qal_no_such_op", &op);
    CHECK(rc == OPJIT_ENOTFOUND);
    CHECK(op == NULL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "qal_no_such_op");
    CHECK_STR_CONTAINS(opjit_errmsg(rt), a);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), b);
    opjit_destroy(rt);

    /* Empty entries on the path are ignored. */
    snprintf(path, sizeof path, "::%s::", b);
    ops_path_set(path);
    rt = rt_new();
    rc = opjit_load_op(rt, "qal_named", &op);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 2);
    opjit_destroy(rt);
    ops_path_restore();
}

static void config_ops_path_is_searched_before_the_environment(void)
{
    const char *envdir = tmpdir_new(), *cfgdir = tmpdir_new();
    write_const_op(envdir, "qal_cfg.c", "qal_cfg", 10);
    write_const_op(cfgdir, "qal_cfg.c", "qal_cfg", 20);
    write_const_op(envdir, "qal_envonly.c", "qal_envonly", 30);
    ops_path_set(envdir);
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.ops_path = cfgdir;
    opjit_runtime *rt = rt_new_cfg(&cfg);
    opjit_op *op = NULL;
    int rc = opjit_load_op(rt, "qal_cfg", &op);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 20);
    /* The environment is still searched after the config. */
    rc = opjit_load_op(rt, "qal_envonly", &op);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 30);
    opjit_destroy(rt);

    /* Several config directories: the first wins. */
    char two[2100];
    snprintf(two, sizeof two, "%s:%s", envdir, cfgdir);
    cfg.ops_path = two;
    rt = rt_new_cfg(&cfg);
    rc = opjit_load_op(rt, "qal_cfg", &op);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 10);
    opjit_destroy(rt);
    ops_path_restore();
}

/* ---- reloads, headers, the cache -------------------------------------------------- */

static void loading_an_unchanged_file_twice_is_a_no_op(void)
{
    const char *d = tmpdir_new();
    write_const_op(d, "qal_same.c", "qal_same", 5);
    opjit_runtime *rt = rt_new();
    opjit_op *op1 = NULL, *op2 = NULL;
    opjit_load_info info = {.size = sizeof info};
    int rc = opjit_load_file(rt, pjoin(d, "qal_same.c"), &op1, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK(strstr(info.source, "qal_same.c") != NULL);
    CHECK(info.total_ms >= 0 && info.key_ms >= 0);
    rc = opjit_load_file(rt, pjoin(d, "qal_same.c"), &op2, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK(op1 && op1 == op2);
    CHECK(info.cache_hit == 1);
    CHECK(info.compile_ms == 0);
    /* A second spelling of the same path. */
    char spelled[2100];
    snprintf(spelled, sizeof spelled, "%s/./qal_same.c", d);
    rc = opjit_load_file(rt, spelled, &op2, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK(op1 == op2 && info.cache_hit == 1);
    CHECK_VALUE(call_value(rt, op1), 5);
    opjit_op *found = NULL;
    CHECK(opjit_find_op(rt, "qal_same", &found) == OPJIT_OK && found == op1);
    opjit_destroy(rt);
}

static void editing_the_source_swaps_the_kernel(void)
{
    const char *d = tmpdir_new();
    const char *p = pjoin(d, "qal_edit.c");
    write_const_op(d, "qal_edit.c", "qal_edit", 100);
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL, *op2 = NULL;
    opjit_load_info info = {.size = sizeof info};
    int rc = opjit_load_file(rt, p, &op, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 100);
    write_const_op(d, "qal_edit.c", "qal_edit", 200);
    rc = opjit_load_file(rt, p, &op2, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK(info.cache_hit == 0);
    /* The op handle is stable: the old handle calls the new kernel. */
    CHECK(op2 == op);
    CHECK_VALUE(call_value(rt, op), 200);
    /* Back to the first text: the first kernel again. */
    write_const_op(d, "qal_edit.c", "qal_edit", 100);
    rc = opjit_load_op(rt, p, &op2);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 100);
    /* A change that only touches a comment is a change of text too. */
    write_const_op_ex(d, "qal_edit.c", "qal_edit", "300", "/* a comment */");
    CHECK(opjit_load_op(rt, p, NULL) == OPJIT_OK);
    CHECK_VALUE(call_value(rt, op), 300);
    opjit_destroy(rt);
}

static void reloading_through_another_spelling_of_the_path(void)
{
    /* Same file reached by two paths (a name on the search path and an
     * absolute path with "/./" in it): an edit reloads, it is not a second
     * module registering the same op. */
    const char *d = tmpdir_new();
    write_const_op(d, "qal_spell.c", "qal_spell", 1);
    ops_path_set(d);
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL;
    int rc = opjit_load_op(rt, "qal_spell", &op);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 1);
    write_const_op(d, "qal_spell.c", "qal_spell", 2);
    char spelled[2100];
    snprintf(spelled, sizeof spelled, "%s/./qal_spell.c", d);
    rc = opjit_load_op(rt, spelled, NULL);
    CHECKF(rc == OPJIT_OK, "reload through %s: %s: %s", spelled, opjit_status_name(rc),
           opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 2);
    opjit_destroy(rt);
    ops_path_restore();
}

static void angle_bracket_headers_next_to_the_source_are_in_the_key(void)
{
    /* <x.h> resolves in the source's directory first (it is on the include
     * path), so editing such a header must recompile too; and a quoted
     * include inside a subdirectory header that names a file next to the
     * source resolves there as well. */
    const char *d = tmpdir_new();
    CHECK(mkdir(pjoin(d, "sub"), 0700) == 0);
    write_text(d, "angle.h", "#include \"sub/deep.h\"\n#define ANGLE_VALUE (30 + DEEP_VALUE)\n");
    write_text(d, "sub/deep.h", "#include \"top.h\"\n#define DEEP_VALUE TOP_VALUE\n");
    write_text(d, "top.h", "#define TOP_VALUE 1\n");
    write_const_op_ex(d, "qal_angle.c", "qal_angle", "ANGLE_VALUE", "#include <angle.h>");
    const char *p = pjoin(d, "qal_angle.c");
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL;
    opjit_load_info info = {.size = sizeof info};
    int rc = opjit_load_file(rt, p, &op, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 31);
    write_text(d, "angle.h", "#include \"sub/deep.h\"\n#define ANGLE_VALUE (40 + DEEP_VALUE)\n");
    rc = opjit_load_file(rt, p, &op, &info);
    CHECK(rc == OPJIT_OK && info.cache_hit == 0);
    CHECK_VALUE(call_value(rt, op), 41);
    write_text(d, "top.h", "#define TOP_VALUE 5\n");
    rc = opjit_load_file(rt, p, &op, &info);
    CHECK(rc == OPJIT_OK && info.cache_hit == 0);
    CHECK_VALUE(call_value(rt, op), 45);
    opjit_destroy(rt);
}

static int count_ops(void *ud, const opjit_op *op)
{
    (void)op;
    (*(int *)ud)++;
    return 0;
}

static void unload_and_load_again(void)
{
    const char *d = tmpdir_new();
    write_const_op(d, "qal_unl.c", "qal_unl", 12);
    write_const_op(d, "qal_keep.c", "qal_keep", 13);
    const char *p = pjoin(d, "qal_unl.c");
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL, *keep = NULL, *found = NULL;
    CHECK(opjit_load_op(rt, p, &op) == OPJIT_OK);
    CHECK(opjit_load_op(rt, pjoin(d, "qal_keep.c"), &keep) == OPJIT_OK);
    CHECK_VALUE(call_value(rt, op), 12);

    /* By path: gone from lookups and lists; the old handle fails cleanly. */
    CHECK(opjit_unload(rt, p) == OPJIT_OK);
    CHECK(opjit_find_op(rt, "qal_unl", &found) == OPJIT_ENOTFOUND);
    int n = 0;
    opjit_list(rt, count_ops, &n);
    CHECK(n == 1);
    DLManagedTensor *out = NULL;
    CHECK(opjit_call(rt, op, NULL, 0, &out, 1) == OPJIT_ENOKERNEL && out == NULL);
    CHECK_VALUE(call_value(rt, keep), 13);
    CHECK(opjit_unload(rt, p) == OPJIT_ENOTFOUND);

    /* Loading again registers it afresh, from the cache, into the same op. */
    opjit_load_info info = {.size = sizeof info};
    opjit_op *again = NULL;
    CHECK(opjit_load_file(rt, p, &again, &info) == OPJIT_OK);
    CHECK(again == op && info.cache_hit == 1 && info.load_ms > 0);
    CHECK_VALUE(call_value(rt, op), 12);

    /* By name. */
    CHECK(opjit_unload(rt, "qal_unl") == OPJIT_OK);
    CHECK(opjit_find_op(rt, "qal_unl", &found) == OPJIT_ENOTFOUND);
    CHECK(opjit_unload(rt, "qal_nothing") == OPJIT_ENOTFOUND);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "qal_nothing");
    CHECK(opjit_unload(rt, NULL) == OPJIT_EINVAL);
    CHECK_VALUE(call_value(rt, keep), 13);
    opjit_destroy(rt);
}

static void editing_a_local_header_changes_the_op(void)
{
    const char *d = tmpdir_new();
    const char *p = pjoin(d, "qal_hdr.c");
    write_text(d, "helper.h", "#include \"inner.h\"\n#define HELPER_VALUE (7 + INNER_VALUE)\n");
    write_text(d, "inner.h", "#define INNER_VALUE 0\n");
    write_const_op_ex(d, "qal_hdr.c", "qal_hdr", "HELPER_VALUE", "#include \"helper.h\"");
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL;
    opjit_load_info info = {.size = sizeof info};
    int rc = opjit_load_file(rt, p, &op, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 7);

    /* The source is unchanged; the header is not. */
    write_text(d, "helper.h", "#include \"inner.h\"\n#define HELPER_VALUE (8 + INNER_VALUE)\n");
    rc = opjit_load_file(rt, p, &op, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK(info.cache_hit == 0);
    CHECK_VALUE(call_value(rt, op), 8);

    /* A header included by the header. */
    write_text(d, "inner.h", "#define INNER_VALUE 100\n");
    rc = opjit_load_file(rt, p, &op, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 108);

    /* Unchanged again: a no-op. */
    rc = opjit_load_file(rt, p, &op, &info);
    CHECK(rc == OPJIT_OK && info.cache_hit == 1);
    opjit_destroy(rt);

    /* A header in a subdirectory. */
    const char *d2 = tmpdir_new();
    CHECK(mkdir(pjoin(d2, "sub"), 0700) == 0);
    write_text(d2, "sub/v.h", "#define SUB_VALUE 1\n");
    write_const_op_ex(d2, "qal_sub.c", "qal_sub", "SUB_VALUE", "#include \"sub/v.h\"");
    rt = rt_new();
    CHECK(opjit_load_op(rt, pjoin(d2, "qal_sub.c"), &op) == OPJIT_OK);
    CHECK_VALUE(call_value(rt, op), 1);
    write_text(d2, "sub/v.h", "#define SUB_VALUE 2\n");
    CHECK(opjit_load_op(rt, pjoin(d2, "qal_sub.c"), &op) == OPJIT_OK);
    CHECK_VALUE(call_value(rt, op), 2);
    opjit_destroy(rt);
}

/* Every local header is part of the key, however many there are and
 * however deep they nest: an edit to the 70th header, or to the end of a
 * chain 24 deep, must recompile, never hit the old artifact. */
static void many_and_deep_local_headers_are_all_in_the_key(void)
{
    const char *d = tmpdir_new();
    char extra[2048] = "", name[32], text[128];
    for (int i = 0; i < 70; i++) {
        snprintf(name, sizeof name, "h%02d.h", i);
        snprintf(text, sizeof text, "#define H%02d %d\n", i, i == 69 ? 5 : 0);
        write_text(d, name, text);
        snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "#include \"%s\"\n", name);
    }
    for (int i = 0; i < 24; i++) {
        snprintf(name, sizeof name, "c%02d.h", i);
        if (i < 23)
            snprintf(text, sizeof text, "#include \"c%02d.h\"\n", i + 1);
        else
            snprintf(text, sizeof text, "#define CHAIN 10\n");
        write_text(d, name, text);
    }
    snprintf(extra + strlen(extra), sizeof extra - strlen(extra), "#include \"c00.h\"\n");
    write_const_op_ex(d, "qal_many.c", "qal_many", "H69 + CHAIN", extra);
    const char *p = pjoin(d, "qal_many.c");
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL;
    opjit_load_info info = {.size = sizeof info};
    int rc = opjit_load_file(rt, p, &op, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 15);

    write_text(d, "h69.h", "#define H69 6\n");
    rc = opjit_load_file(rt, p, &op, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK(info.cache_hit == 0);
    CHECK_VALUE(call_value(rt, op), 16);

    write_text(d, "c23.h", "#define CHAIN 20\n");
    rc = opjit_load_file(rt, p, &op, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK(info.cache_hit == 0);
    CHECK_VALUE(call_value(rt, op), 26);
    opjit_destroy(rt);
}

static void touching_without_change_does_not_recompile(void)
{
    const char *d = tmpdir_new();
    const char *p = pjoin(d, "qal_touch.c");
    write_text(d, "touch.h", "#define TOUCH_VALUE 9\n");
    write_const_op_ex(d, "qal_touch.c", "qal_touch", "TOUCH_VALUE", "#include \"touch.h\"");
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL;
    opjit_load_info info = {.size = sizeof info};
    int rc = opjit_load_file(rt, p, &op, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 9);

    /* New modification times, same bytes. */
    struct timespec ts[2] = {{.tv_sec = 2000000000, .tv_nsec = 0}, {.tv_sec = 2000000000}};
    CHECK(utimensat(AT_FDCWD, p, ts, 0) == 0);
    CHECK(utimensat(AT_FDCWD, pjoin(d, "touch.h"), ts, 0) == 0);
    rc = opjit_load_file(rt, p, &op, &info);
    CHECK(rc == OPJIT_OK && info.cache_hit == 1 && info.compile_ms == 0);
    opjit_destroy(rt);

    /* A fresh runtime on the same cache directory: a cache hit. */
    rt = rt_new();
    rc = opjit_load_file(rt, p, &op, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECKF(info.cache_hit == 1, "a fresh runtime recompiled an unchanged source");
    CHECK(info.compile_ms == 0);
    CHECK_VALUE(call_value(rt, op), 9);
    opjit_destroy(rt);

    /* The same text under another directory is the same artifact. */
    const char *d2 = tmpdir_new();
    write_text(d2, "touch.h", "#define TOUCH_VALUE 9\n");
    write_const_op_ex(d2, "qal_touch.c", "qal_touch", "TOUCH_VALUE", "#include \"touch.h\"");
    rt = rt_new();
    rc = opjit_load_file(rt, pjoin(d2, "qal_touch.c"), &op, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK(info.cache_hit == 1);
    CHECK_VALUE(call_value(rt, op), 9);
    opjit_destroy(rt);

    /* With no_cache, nothing is shared: compiled again. */
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.no_cache = 1;
    rt = rt_new_cfg(&cfg);
    rc = opjit_load_file(rt, p, &op, &info);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK(info.cache_hit == 0);
    CHECK_VALUE(call_value(rt, op), 9);
    opjit_destroy(rt);
}

static void header_edits_racing_the_optimizer(void)
{
    /* The optimizing tier compiles in the background. Headers edited while
     * it runs must never leave an artifact in the cache under the key of
     * header contents it was not built from: a later process would load the
     * wrong code. Edit a header repeatedly without waiting, then check
     * what fresh runtimes get for the final and the earlier contents. */
    enum { EDITS = 8 };
    const char *d = tmpdir_new();
    char p[1024];
    snprintf(p, sizeof p, "%s/qal_race.c", d);
    char h[128];
    write_text(d, "race.h", "#define RACE_VALUE 0\n");
    write_const_op_ex(d, "qal_race.c", "qal_race", "RACE_VALUE", "#include \"race.h\"");
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = 1;
    opjit_runtime *rt = rt_new_cfg(&cfg);
    opjit_op *op = NULL;
    int rc = opjit_load_op(rt, p, &op);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    CHECK_VALUE(call_value(rt, op), 0);
    for (int i = 1; i <= EDITS; i++) {
        snprintf(h, sizeof h, "#define RACE_VALUE %d\n", i);
        write_text(d, "race.h", h);
        CHECK(opjit_load_op(rt, p, &op) == OPJIT_OK);
        CHECK_VALUE(call_value(rt, op), i);
    }
    opjit_wait(rt); /* optimizing compiles may fail: they are optional */
    CHECK_VALUE(call_value(rt, op), EDITS);
    opjit_destroy(rt);

    for (int i = EDITS; i >= 0; i--) {
        snprintf(h, sizeof h, "#define RACE_VALUE %d\n", i);
        write_text(d, "race.h", h);
        rt = rt_new_cfg(&cfg);
        opjit_load_info info = {.size = sizeof info};
        rc = opjit_load_file(rt, p, &op, &info);
        CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
        long got = call_value(rt, op);
        CHECKF(got == i, "a fresh runtime loading race.h = %d got %ld from the %s tier", i, got,
               info.tier);
        opjit_wait(rt);
        got = call_value(rt, op);
        CHECKF(got == i, "race.h = %d: %ld after the optimizing tier swapped in", i, got);
        opjit_destroy(rt);
    }
}

/* ---- error paths -------------------------------------------------------------------- */

/* A runtime with one good op loaded; every error below must leave it
 * working. */
typedef struct fixture {
    const char *dir;
    opjit_runtime *rt;
    opjit_op *good;
} fixture;

static fixture fixture_new(void)
{
    fixture f = {.dir = tmpdir_new()};
    f.rt = rt_new();
    write_const_op(f.dir, "qal_good.c", "qal_good", 77);
    int rc = opjit_load_op(f.rt, pjoin(f.dir, "qal_good.c"), &f.good);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(f.rt));
    return f;
}

/* Load dir/file expecting status; returns the message. *op must come back
 * NULL, and the good op must still work. */
static const char *load_fails(fixture *f, const char *file, int status)
{
    opjit_op *op = (opjit_op *)f; /* must be reset to NULL */
    int rc = opjit_load_op(f->rt, pjoin(f->dir, file), &op);
    CHECKF(rc == status, "%s: expected %s, got %s: %s", file, opjit_status_name(status),
           opjit_status_name(rc), opjit_errmsg(f->rt));
    CHECKF(op == NULL, "%s: *op not reset on failure", file);
    static char msg[16384];
    snprintf(msg, sizeof msg, "%s", opjit_errmsg(f->rt));
    CHECKF(msg[0] != '\0', "%s: no message", file);
    CHECKF(call_value(f->rt, f->good) == 77, "the good op broke after loading %s", file);
    return msg;
}

static void syntax_error_reports_file_line_and_the_line(void)
{
    fixture f = fixture_new();
    write_text(f.dir, "qal_syntax.c",
               "#include <opjit_op.h>\n"                                   /* 1 */
               "static int k(opjit_ctx *ctx, opjit_args *a)\n"             /* 2 */
               "{\n"                                                       /* 3 */
               "    (void)ctx, (void)a;\n"                                 /* 4 */
               "    int value_here = qal_undeclared_thing;\n"              /* 5 */
               "    return value_here;\n"                                  /* 6 */
               "}\n"
               "OPJIT_MODULE(qal_syntax, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_syntax() -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "}\n");
    const char *msg = load_fails(&f, "qal_syntax.c", OPJIT_ECOMPILE);
    CHECK_STR_CONTAINS(msg, "qal_syntax.c:5:");
    CHECK_STR_CONTAINS(msg, "error");
    CHECK_STR_CONTAINS(msg, "qal_undeclared_thing");
    CHECK_STR_CONTAINS(msg, "int value_here = qal_undeclared_thing;"); /* quoted */
    opjit_op *op = NULL;
    CHECK(opjit_find_op(f.rt, "qal_syntax", &op) == OPJIT_ENOTFOUND);

    /* Editing a loaded op into a syntax error keeps the old kernel. */
    write_const_op_ex(f.dir, "qal_good.c", "qal_good", "78 +* ;", NULL);
    msg = load_fails(&f, "qal_good.c", OPJIT_ECOMPILE);
    CHECK_STR_CONTAINS(msg, "qal_good.c:");
    /* Fixed again: loads. */
    write_const_op(f.dir, "qal_good.c", "qal_good", 79);
    CHECK(opjit_load_op(f.rt, pjoin(f.dir, "qal_good.c"), NULL) == OPJIT_OK);
    CHECK_VALUE(call_value(f.rt, f.good), 79);
    opjit_destroy(f.rt);
}

static void error_in_a_local_header_names_the_header(void)
{
    fixture f = fixture_new();
    write_text(f.dir, "bad_helper.h", "#define OK_VALUE 1\nint broken_decl(;\n");
    write_const_op_ex(f.dir, "qal_badhdr.c", "qal_badhdr", "OK_VALUE", "#include \"bad_helper.h\"");
    const char *msg = load_fails(&f, "qal_badhdr.c", OPJIT_ECOMPILE);
    CHECK_STR_CONTAINS(msg, "bad_helper.h:2");
    opjit_destroy(f.rt);
}

static void missing_module_block(void)
{
    fixture f = fixture_new();
    write_text(f.dir, "qal_nomod.c",
               "#include <opjit_op.h>\n"
               "int qal_nomod_helper(int x) { return x + 1; }\n");
    const char *msg = load_fails(&f, "qal_nomod.c", OPJIT_EMODULE);
    CHECK_STR_CONTAINS(msg, "OPJIT_MODULE");
    CHECK_STR_CONTAINS(msg, "qal_nomod.c");
    opjit_destroy(f.rt);
}

static void undefined_symbol_is_named(void)
{
    fixture f = fixture_new();
    write_text(f.dir, "qal_undef.c",
               "#include <opjit_op.h>\n"
               "int qal_no_such_function_xyz(int);\n"
               "static int k(opjit_ctx *ctx, opjit_args *a)\n"
               "{\n"
               "    (void)a;\n"
               "    return qal_no_such_function_xyz(opjit_device_id(ctx));\n"
               "}\n"
               "OPJIT_MODULE(qal_undef, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_undef() -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "}\n");
    const char *msg = load_fails(&f, "qal_undef.c", OPJIT_EMODULE);
    CHECK_STR_CONTAINS(msg, "qal_no_such_function_xyz");
    CHECK_STR_CONTAINS(msg, "qal_undef.c");
    opjit_destroy(f.rt);
}

static void registration_errors(void)
{
    fixture f = fixture_new();
    const char *msg;

    /* A schema that does not parse. */
    write_text(f.dir, "qal_badschema.c",
               "#include <opjit_op.h>\n"
               "static int k(opjit_ctx *c, opjit_args *a) { (void)c, (void)a; return 0; }\n"
               "OPJIT_MODULE(qal_badschema, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_badschema(Tensor x -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "}\n");
    msg = load_fails(&f, "qal_badschema.c", OPJIT_ESCHEMA);
    CHECK_STR_CONTAINS(msg, "qal_badschema.c");
    CHECK_STR_CONTAINS(msg, "qal_badschema(Tensor x -> Tensor");

    /* A CUDA kernel registered from a .c file. */
    write_text(f.dir, "qal_cudafromc.c",
               "#include <opjit_op.h>\n"
               "static int k(opjit_ctx *c, opjit_args *a) { (void)c, (void)a; return 0; }\n"
               "OPJIT_MODULE(qal_cudafromc, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_cudafromc() -> Tensor\", OPJIT_CUDA, k, \"\");\n"
               "}\n");
    msg = load_fails(&f, "qal_cudafromc.c", OPJIT_EMODULE);
    CHECK_STR_CONTAINS(msg, "qal_cudafromc.c");
    CHECK_STR_CONTAINS(msg, "cuda");

    /* A module that registers nothing. */
    write_text(f.dir, "qal_empty.c",
               "#include <opjit_op.h>\n"
               "OPJIT_MODULE(qal_empty, m)\n"
               "{\n"
               "    (void)m;\n"
               "}\n");
    msg = load_fails(&f, "qal_empty.c", OPJIT_EMODULE);
    CHECK_STR_CONTAINS(msg, "qal_empty.c");
    CHECK_STR_CONTAINS(msg, "opjit_def");

    /* A NULL kernel. */
    write_text(f.dir, "qal_nullfn.c",
               "#include <opjit_op.h>\n"
               "OPJIT_MODULE(qal_nullfn, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_nullfn() -> Tensor\", OPJIT_CPU, 0, \"\");\n"
               "}\n");
    msg = load_fails(&f, "qal_nullfn.c", OPJIT_EMODULE);
    CHECK_STR_CONTAINS(msg, "qal_nullfn.c");

    /* A module init that refuses the runtime. */
    write_text(f.dir, "qal_refuse.c",
               "#include <opjit_op.h>\n"
               "int opjit_module_init(const opjit_api *api, opjit_module *m)\n"
               "{\n"
               "    (void)api, (void)m;\n"
               "    return -1;\n"
               "}\n");
    msg = load_fails(&f, "qal_refuse.c", OPJIT_EMODULE);
    CHECK_STR_CONTAINS(msg, "qal_refuse.c");

    /* opjit_require with a word it does not know. */
    write_text(f.dir, "qal_badreq.c",
               "#include <opjit_op.h>\n"
               "static int k(opjit_ctx *c, opjit_args *a) { (void)c, (void)a; return 0; }\n"
               "OPJIT_MODULE(qal_badreq, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_badreq(Tensor x) -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "    opjit_require(m, \"x\", \"float33\");\n"
               "}\n");
    msg = load_fails(&f, "qal_badreq.c", OPJIT_EMODULE);
    CHECK_STR_CONTAINS(msg, "float33");
    CHECK_STR_CONTAINS(msg, "qal_badreq.c");

    /* opjit_require on an argument that does not exist. */
    write_text(f.dir, "qal_badreq2.c",
               "#include <opjit_op.h>\n"
               "static int k(opjit_ctx *c, opjit_args *a) { (void)c, (void)a; return 0; }\n"
               "OPJIT_MODULE(qal_badreq2, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_badreq2(Tensor x) -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "    opjit_require(m, \"y\", \"float32\");\n"
               "}\n");
    msg = load_fails(&f, "qal_badreq2.c", OPJIT_EMODULE);
    CHECK_STR_CONTAINS(msg, "'y'");

    /* The same op twice in one module. */
    write_text(f.dir, "qal_twice.c",
               "#include <opjit_op.h>\n"
               "static int k(opjit_ctx *c, opjit_args *a) { (void)c, (void)a; return 0; }\n"
               "OPJIT_MODULE(qal_twice, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_twice() -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "    opjit_def(m, \"qal_twice() -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "}\n");
    msg = load_fails(&f, "qal_twice.c", OPJIT_EEXIST);
    CHECK_STR_CONTAINS(msg, "qal_twice");

    /* All or nothing: a good registration before a bad one is not kept. */
    write_text(f.dir, "qal_partial.c",
               "#include <opjit_op.h>\n"
               "static int k(opjit_ctx *c, opjit_args *a) { (void)c, (void)a; return 0; }\n"
               "OPJIT_MODULE(qal_partial, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_partial_ok() -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "    opjit_def(m, \"qal_partial(int x=) -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "}\n");
    msg = load_fails(&f, "qal_partial.c", OPJIT_ESCHEMA);
    opjit_op *op = NULL;
    CHECK(opjit_find_op(f.rt, "qal_partial_ok", &op) == OPJIT_ENOTFOUND);
    opjit_destroy(f.rt);
}

static void conflicts_between_files(void)
{
    fixture f = fixture_new();
    const char *msg;
    write_const_op(f.dir, "qal_one.c", "qal_dup", 1);
    opjit_op *dup = NULL;
    int rc = opjit_load_op(f.rt, pjoin(f.dir, "qal_one.c"), &dup);
    CHECKF(rc == OPJIT_OK, "%s", opjit_errmsg(f.rt));
    CHECK_VALUE(call_value(f.rt, dup), 1);

    /* A second file registering the same op for the same device. */
    write_const_op(f.dir, "qal_two_dup.c", "qal_dup", 2);
    msg = load_fails(&f, "qal_two_dup.c", OPJIT_EEXIST);
    CHECK_STR_CONTAINS(msg, "qal_one.c");
    CHECK_STR_CONTAINS(msg, "qal_two_dup.c");
    CHECK_STR_CONTAINS(msg, "qal_dup");
    CHECK_VALUE(call_value(f.rt, dup), 1);

    /* The same op name under another schema. */
    write_text(f.dir, "qal_three.c",
               "#include <opjit_op.h>\n"
               "static int k(opjit_ctx *c, opjit_args *a) { (void)c, (void)a; return 0; }\n"
               "OPJIT_MODULE(qal_three, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_dup(Tensor x, float y) -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "}\n");
    msg = load_fails(&f, "qal_three.c", OPJIT_ESCHEMA);
    CHECK_STR_CONTAINS(msg, "qal_one.c");
    CHECK_STR_CONTAINS(msg, "qal_three.c");
    CHECK_VALUE(call_value(f.rt, dup), 1);

    /* A conflicting file that also brings a new op publishes neither. */
    write_text(f.dir, "qal_four.c",
               "#include <opjit_op.h>\n"
               "static int k(opjit_ctx *c, opjit_args *a) { (void)c, (void)a; return 0; }\n"
               "OPJIT_MODULE(qal_four, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_four() -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "    opjit_def(m, \"qal_dup(int add=0) -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "}\n");
    msg = load_fails(&f, "qal_four.c", OPJIT_EEXIST);
    opjit_op *op = NULL;
    CHECK(opjit_find_op(f.rt, "qal_four", &op) == OPJIT_ENOTFOUND);
    CHECK_VALUE(call_value(f.rt, dup), 1);
    opjit_destroy(f.rt);
}

static void reload_that_fails_keeps_the_old_kernel(void)
{
    fixture f = fixture_new();
    /* Edit the good op into one that registers nothing. */
    write_text(f.dir, "qal_good.c",
               "#include <opjit_op.h>\n"
               "OPJIT_MODULE(qal_good, m) { (void)m; }\n");
    load_fails(&f, "qal_good.c", OPJIT_EMODULE);
    /* ... and into one with an undefined symbol. */
    write_text(f.dir, "qal_good.c",
               "#include <opjit_op.h>\n"
               "int qal_missing_too(void);\n"
               "static int k(opjit_ctx *c, opjit_args *a) { (void)c, (void)a; return qal_missing_too(); }\n"
               "OPJIT_MODULE(qal_good, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_good(int add=0) -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "}\n");
    load_fails(&f, "qal_good.c", OPJIT_EMODULE);
    /* Back to the text that is loaded: a no-op, still the old kernel. */
    write_const_op(f.dir, "qal_good.c", "qal_good", 77);
    CHECK(opjit_load_op(f.rt, pjoin(f.dir, "qal_good.c"), NULL) == OPJIT_OK);
    CHECK_VALUE(call_value(f.rt, f.good), 77);
    opjit_destroy(f.rt);
}

static void reload_with_a_changed_schema(void)
{
    /* Editing an op's signature and reloading it is the everyday case of
     * hot reload: the only kernel of the op is the one being replaced. */
    fixture f = fixture_new();
    write_text(f.dir, "qal_good.c",
               "#include <opjit_op.h>\n"
               "static int k(opjit_ctx *ctx, opjit_args *a)\n"
               "{\n"
               "    int64_t shape[1] = {1};\n"
               "    DLTensor *t = opjit_output(ctx, 0, OPJIT_INT64, 1, shape);\n"
               "    if (!t) return -1;\n"
               "    ((int64_t *)t->data)[0] = 1000 + opjit_arg_int(a, 0) + opjit_arg_int(a, 1);\n"
               "    return 0;\n"
               "}\n"
               "OPJIT_MODULE(qal_good, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_good(int add=0, int more=5) -> Tensor\", OPJIT_CPU, k, \"\");\n"
               "}\n");
    int rc = opjit_load_op(f.rt, pjoin(f.dir, "qal_good.c"), NULL);
    CHECKF(rc == OPJIT_OK, "reload with a new argument: %s: %s", opjit_status_name(rc),
           opjit_errmsg(f.rt));
    if (rc == OPJIT_OK) {
        CHECK_VALUE(call_value(f.rt, f.good), 1005);
        opjit_op_info info = {.size = sizeof info};
        CHECK(opjit_op_info_get(f.rt, f.good, &info) == OPJIT_OK && info.nargs == 2);
    } else {
        CHECK_VALUE(call_value(f.rt, f.good), 77);
    }
    opjit_destroy(f.rt);
}

static void bad_paths(void)
{
    fixture f = fixture_new();
    const char *msg;

    /* A NUL byte in the text. */
    static const char nul[] = "#include <opjit_op.h>\n/* \0 */\nOPJIT_MODULE(qal_nul, m) { (void)m; }\n";
    write_bytes(pjoin(f.dir, "qal_nul.c"), nul, sizeof nul - 1);
    msg = load_fails(&f, "qal_nul.c", OPJIT_EINVAL);
    CHECK_STR_CONTAINS(msg, "qal_nul.c");
    CHECK_STR_CONTAINS(msg, "NUL");

    /* Not a .c file. */
    write_const_op(f.dir, "qal_txt.txt", "qal_txt", 1);
    msg = load_fails(&f, "qal_txt.txt", OPJIT_EINVAL);
    CHECK_STR_CONTAINS(msg, "qal_txt.txt");
    write_text(f.dir, "qal_h.h", "#define X 1\n");
    msg = load_fails(&f, "qal_h.h", OPJIT_EINVAL);
    CHECK_STR_CONTAINS(msg, "qal_h.h");

    /* A path that does not exist. */
    msg = load_fails(&f, "qal_nope.c", OPJIT_ENOTFOUND);
    CHECK_STR_CONTAINS(msg, "qal_nope.c");
    msg = load_fails(&f, "no_dir/qal_nope.c", OPJIT_ENOTFOUND);
    CHECK_STR_CONTAINS(msg, "no_dir/qal_nope.c");

    /* A directory named like a source. */
    CHECK(mkdir(pjoin(f.dir, "qal_dir.c"), 0700) == 0);
    opjit_op *op = NULL;
    int rc = opjit_load_op(f.rt, pjoin(f.dir, "qal_dir.c"), &op);
    CHECK(rc != OPJIT_OK && op == NULL);
    CHECK(opjit_errmsg(f.rt)[0] != '\0');
    CHECK_VALUE(call_value(f.rt, f.good), 77);

    /* An empty file has no module. */
    write_text(f.dir, "qal_emptyfile.c", "");
    msg = load_fails(&f, "qal_emptyfile.c", OPJIT_EMODULE);
    CHECK_STR_CONTAINS(msg, "OPJIT_MODULE");

    /* NULL and empty specs. */
    CHECK(opjit_load_op(f.rt, NULL, &op) == OPJIT_EINVAL && op == NULL);
    CHECK(opjit_load_op(f.rt, "", &op) == OPJIT_EINVAL && op == NULL);
    CHECK(opjit_load_file(f.rt, NULL, &op, NULL) == OPJIT_EINVAL);
    CHECK(opjit_load_op(NULL, "x", &op) == OPJIT_EINVAL);
    CHECK_VALUE(call_value(f.rt, f.good), 77);
    opjit_destroy(f.rt);
}

/* ---- the registry ---------------------------------------------------------------- */

typedef struct list_acc {
    opjit_runtime *rt;
    char names[16][64];
    int n, stop_after;
} list_acc;

static int collect(void *ud, const opjit_op *op)
{
    list_acc *acc = ud;
    opjit_op_info info = {.size = sizeof info};
    if (opjit_op_info_get(acc->rt, op, &info) == OPJIT_OK && acc->n < 16)
        snprintf(acc->names[acc->n], 64, "%s", info.name);
    acc->n++;
    return acc->stop_after && acc->n >= acc->stop_after;
}

static void list_info_args_and_find(void)
{
    const char *d = tmpdir_new();
    write_text(d, "qal_info.c",
               "#include <opjit_op.h>\n"
               "static int k(opjit_ctx *c, opjit_args *a) { (void)c, (void)a; return 0; }\n"
               "OPJIT_MODULE(qal_info, m)\n"
               "{\n"
               "    opjit_def(m, \"qal_info(Tensor self, Tensor? bias=None, int[2] stride=1, "
               "float eps=1e-05, bool flag=True, int n=-3) -> (Tensor, Tensor)\",\n"
               "              OPJIT_CPU, k, \"the info op\");\n"
               "    opjit_def(m, \"qal_info_b(Tensor x) -> Tensor\", OPJIT_CPU, k, \"second\");\n"
               "}\n");
    write_const_op(d, "qal_first.c", "qal_first", 1);
    opjit_runtime *rt = rt_new();
    opjit_op *first = NULL, *op = NULL;
    CHECK(opjit_load_op(rt, pjoin(d, "qal_first.c"), &first) == OPJIT_OK);
    int rc = opjit_load_op(rt, pjoin(d, "qal_info.c"), &op);
    CHECKF(rc == OPJIT_OK, "%s: %s", opjit_status_name(rc), opjit_errmsg(rt));
    if (!op) {
        opjit_destroy(rt);
        return;
    }

    /* opjit_list: every op, in load order; stops early on request. */
    list_acc acc = {.rt = rt};
    CHECK(opjit_list(rt, collect, &acc) == OPJIT_OK);
    CHECK(acc.n == 3);
    CHECK(!strcmp(acc.names[0], "qal_first"));
    CHECK(!strcmp(acc.names[1], "qal_info"));
    CHECK(!strcmp(acc.names[2], "qal_info_b"));
    list_acc stop = {.rt = rt, .stop_after = 2};
    CHECK(opjit_list(rt, collect, &stop) == OPJIT_OK);
    CHECK(stop.n == 2);
    CHECK(opjit_list(rt, NULL, NULL) == OPJIT_EINVAL);

    /* opjit_op_info_get */
    opjit_op_info info = {.size = sizeof info};
    CHECK(opjit_op_info_get(rt, op, &info) == OPJIT_OK);
    CHECK(!strcmp(info.name, "qal_info"));
    CHECK(info.schema && strstr(info.schema, "qal_info(Tensor self") == info.schema);
    CHECK(info.nargs == 6);
    CHECK(info.nouts == 2);
    CHECK(info.source[OPJIT_CPU] && strstr(info.source[OPJIT_CPU], "qal_info.c"));
    CHECK(info.source[OPJIT_CUDA] == NULL);
    CHECK(info.doc[OPJIT_CPU] && !strcmp(info.doc[OPJIT_CPU], "the info op"));
    CHECK(info.doc[OPJIT_CUDA] == NULL);
    /* libtcc code, or the optimizing tier's once it has swapped in. */
    CHECK(info.tier[OPJIT_CPU] &&
          (!strcmp(info.tier[OPJIT_CPU], "tcc") || !strcmp(info.tier[OPJIT_CPU], "opt")));
    CHECK(opjit_op_info_get(rt, NULL, &info) == OPJIT_EINVAL);

    /* opjit_op_arg_get */
    static const struct {
        const char *name, *type;
        int kind, optional, list_len, has_default;
        const char *def;
    } want[] = {
        {"self", "Tensor", OPJIT_KIND_TENSOR, 0, 0, 0, NULL},
        {"bias", "Tensor?", OPJIT_KIND_TENSOR, 1, 0, 1, "None"},
        {"stride", "int[2]", OPJIT_KIND_INTS, 0, 2, 1, "1"},
        {"eps", "float", OPJIT_KIND_FLOAT, 0, 0, 1, "1e-05"},
        {"flag", "bool", OPJIT_KIND_BOOL, 0, 0, 1, "True"},
        {"n", "int", OPJIT_KIND_INT, 0, 0, 1, "-3"},
    };
    for (int i = 0; i < 6; i++) {
        opjit_arg_info ai = {.size = sizeof ai};
        memset(&ai, 0xab, sizeof ai);
        ai.size = sizeof ai;
        CHECK(opjit_op_arg_get(rt, op, i, &ai) == OPJIT_OK);
        CHECKF(ai.name && !strcmp(ai.name, want[i].name), "arg %d name", i);
        CHECKF(ai.type && !strcmp(ai.type, want[i].type), "arg %d type %s", i, ai.type);
        CHECKF(ai.kind == want[i].kind, "arg %d kind %d", i, ai.kind);
        CHECKF(ai.optional == want[i].optional, "arg %d optional", i);
        CHECKF(ai.list_len == want[i].list_len, "arg %d list_len", i);
        CHECKF(ai.has_default == want[i].has_default, "arg %d has_default", i);
        if (want[i].def)
            CHECKF(ai.default_text && !strcmp(ai.default_text, want[i].def),
                   "arg %d default '%s'", i, ai.default_text ? ai.default_text : "(null)");
        else
            CHECKF(ai.default_text == NULL, "arg %d has a default text", i);
        CHECK(opjit_op_arg_index(op, want[i].name) == i);
    }
    opjit_arg_info ai = {.size = sizeof ai};
    CHECK(opjit_op_arg_get(rt, op, 6, &ai) == OPJIT_EINVAL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "qal_info");
    CHECK(opjit_op_arg_get(rt, op, -1, &ai) == OPJIT_EINVAL);
    CHECK(opjit_op_arg_index(op, "nope") == -1);
    CHECK(opjit_op_arg_index(op, NULL) == -1);
    CHECK(opjit_op_arg_index(NULL, "self") == -1);

    /* opjit_find_op */
    opjit_op *found = NULL;
    CHECK(opjit_find_op(rt, "qal_info", &found) == OPJIT_OK && found == op);
    CHECK(opjit_find_op(rt, "qal_info_b", &found) == OPJIT_OK && found && found != op);
    CHECK(opjit_find_op(rt, "qal_first", &found) == OPJIT_OK && found == first);
    found = op;
    CHECK(opjit_find_op(rt, "qal_unknown", &found) == OPJIT_ENOTFOUND && found == NULL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "qal_unknown");
    CHECK(opjit_find_op(rt, NULL, &found) == OPJIT_EINVAL);
    opjit_destroy(rt);

    /* An empty runtime lists nothing. */
    rt = rt_new();
    list_acc none = {.rt = rt};
    CHECK(opjit_list(rt, collect, &none) == OPJIT_OK && none.n == 0);
    CHECK(opjit_find_op(rt, "qal_info", &found) == OPJIT_ENOTFOUND);
    opjit_destroy(rt);
}

static void by_name_and_by_path_agree(void)
{
    /* A file whose op is not named after it: loading that op by name hands
     * back the same op as loading the file by path; the file's name is no
     * op's name (issue 20.9: it never resolves to another op). */
    const char *d = tmpdir_new();
    write_const_op(d, "qal_file.c", "qal_other_name", 6);
    ops_path_set(d);
    opjit_runtime *rt = rt_new();
    opjit_op *by_path = NULL, *by_name = NULL;
    CHECK(opjit_load_op(rt, pjoin(d, "qal_file.c"), &by_path) == OPJIT_OK && by_path);
    int rc = opjit_load_op(rt, "qal_other_name", &by_name);
    CHECKF(rc == OPJIT_OK && by_name == by_path, "by name: %s: %s", opjit_status_name(rc),
           opjit_errmsg(rt));
    by_name = NULL;
    CHECK(opjit_load_op(rt, "qal_file", &by_name) == OPJIT_ENOTFOUND && !by_name);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "registers qal_other_name");
    opjit_destroy(rt);
    ops_path_restore();
}

/* ---- reloads drop what the new init no longer registers -------------------- */

static void write_multi(const char *dir, const char *second)
{
    char src[2048];
    snprintf(src, sizeof src,
             "#include <opjit_op.h>\n"
             "static int k(opjit_ctx *ctx, opjit_args *a)\n"
             "{\n"
             "    int64_t shape[1] = {1};\n"
             "    DLTensor *t = opjit_output(ctx, 0, OPJIT_INT64, 1, shape);\n"
             "    if (!t)\n"
             "        return -1;\n"
             "    ((int64_t *)opjit_data(t))[0] = 7 + opjit_arg_int(a, 0);\n"
             "    return 0;\n"
             "}\n"
             "OPJIT_MODULE(qal_multi, m)\n"
             "{\n"
             "    opjit_def(m, \"qal_multi(int add=0) -> Tensor\", OPJIT_CPU, k, \"\");\n"
             "    opjit_def(m, \"%s(int add=0) -> Tensor\", OPJIT_CPU, k, \"\");\n"
             "}\n/* %s */\n",
             second, run_nonce);
    write_text(dir, "qal_multi.c", src);
}

static void reload_drops_ops_the_new_init_no_longer_registers(void)
{
    const char *d = tmpdir_new();
    write_multi(d, "qal_old_name");
    opjit_runtime *rt = rt_new();
    CHECK(opjit_load_file(rt, pjoin(d, "qal_multi.c"), NULL, NULL) == OPJIT_OK);
    CHECK_VALUE(call_named(rt, "qal_old_name"), 7);
    opjit_op *old = NULL;
    CHECK(opjit_find_op(rt, "qal_old_name", &old) == OPJIT_OK);
    write_multi(d, "qal_new_name"); /* renamed in the source */
    CHECK(opjit_load_file(rt, pjoin(d, "qal_multi.c"), NULL, NULL) == OPJIT_OK);
    CHECK_VALUE(call_named(rt, "qal_new_name"), 7);
    CHECK_VALUE(call_named(rt, "qal_multi"), 7);
    opjit_op *gone = NULL;
    CHECK(opjit_find_op(rt, "qal_old_name", &gone) == OPJIT_ENOTFOUND && !gone);
    int n = 0;
    opjit_list(rt, count_ops, &n);
    CHECK(n == 2);
    /* A handle kept from before is refused, not run on the old code. */
    DLManagedTensor *out = NULL;
    CHECK(opjit_call(rt, old, NULL, 0, &out, 1) != OPJIT_OK && !out);
    opjit_destroy(rt);
}

/* ---- discovery: each source in a child ------------------------------------- */

typedef struct seen_sources {
    int n, ok, failed;
    char errors[4096];
    char schemas[2048];
} seen_sources;

static int note_source(void *ud, const opjit_source_ops *src)
{
    seen_sources *s = ud;
    s->n++;
    if (src->status == OPJIT_OK)
        s->ok++;
    else
        s->failed++;
    size_t e = strlen(s->errors), c = strlen(s->schemas);
    snprintf(s->errors + e, sizeof s->errors - e, "%s\n", src->error);
    for (int i = 0; i < src->nops; i++) {
        c = strlen(s->schemas);
        snprintf(s->schemas + c, sizeof s->schemas - c, "%s [%s]\n", src->schemas[i],
                 src->docs[i]);
    }
    return 0;
}

static void discover_survives_sources_that_exit_or_crash(void)
{
    const char *d = tmpdir_new();
    write_const_op(d, "qal_fine.c", "qal_fine", 1);
    write_text(d, "qal_exits.c",
               "#include <stdlib.h>\n#include <opjit_op.h>\n"
               "OPJIT_MODULE(qal_exits, m) { (void)m; exit(3); }\n");
    write_text(d, "qal_aborts.c",
               "#include <stdlib.h>\n#include <opjit_op.h>\n"
               "OPJIT_MODULE(qal_aborts, m) { (void)m; abort(); }\n");
    write_text(d, "qal_broken.c", "#include <opjit_op.h>\nint x = ;\n");
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.ops_path = d;
    cfg.tiering = 0;
    opjit_runtime *rt = rt_new_cfg(&cfg);
    seen_sources s = {0};
    int rc = opjit_discover(rt, note_source, &s);
    CHECK(rc == OPJIT_EMODULE || rc == OPJIT_ECOMPILE);
    /* The shipped ops are on the path too (the environment's directory). */
    CHECK(s.failed == 3 && s.ok >= 1);
    CHECK_STR_CONTAINS(s.schemas, "qal_fine(int add=0) -> Tensor [constant 1]");
    CHECK_STR_CONTAINS(s.errors, "qal_exits.c: loading it exited with status 3");
    CHECK_STR_CONTAINS(s.errors, "qal_aborts.c: loading it crashed (signal 6");
    CHECK_STR_CONTAINS(s.errors, "qal_broken.c: compile error");
    /* Nothing was loaded into the host's runtime. */
    int n = 0;
    opjit_list(rt, count_ops, &n);
    CHECK(n == 0);
    opjit_destroy(rt);
}

/* ---- a shared read-only layer: nobody else's code reaches dlopen ------------ */

/* The one entry directory under root's v1/entries. */
static int only_entry(const char *root, char *out, size_t n)
{
    char cmd[1400];
    snprintf(cmd, sizeof cmd, "find '%s/v1/entries' -mindepth 2 -maxdepth 2 -type d", root);
    FILE *f = popen(cmd, "r");
    int got = f && fgets(out, (int)n, f) != NULL;
    if (f)
        pclose(f);
    if (got)
        out[strcspn(out, "\n")] = '\0';
    return got;
}

/* Replace the entry's host.so with evil and write a manifest that matches,
 * as someone able to write the entry could. */
static void forge_entry(const char *entry, const char *evil_so)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cp '%s' '%s/host.so' && rm -f '%s/manifest'", evil_so, entry,
             entry);
    CHECK(system(cmd) == 0);
    int dfd = open(entry, O_RDONLY | O_DIRECTORY);
    cache_artifact *a = NULL;
    int n = 0;
    char err[512];
    cache_request req;
    memset(&req, 0, sizeof req);
    snprintf(req.key.hex, sizeof req.key.hex, "%s", strrchr(entry, '/') + 1);
    req.op_name = req.source_name = req.compiler = req.options = req.target = req.tier = "x";
    CHECK(dfd >= 0 && cache_scan_artifacts(dfd, &a, &n, err, sizeof err) == OPJIT_OK);
    uint64_t size;
    CHECK(cache_manifest_write(dfd, &req, a, n, 1, &size, err, sizeof err) == OPJIT_OK);
    cache_artifacts_free(a, n);
    close(dfd);
}

static int loads_from_layer(const char *layer, const char *src, int offline)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.cache_dir = tmpdir_new();
    cfg.readonly_caches = layer;
    cfg.offline = offline;
    cfg.tiering = 0;
    opjit_runtime *rt = rt_new_cfg(&cfg);
    opjit_op *op = NULL;
    int rc = opjit_load_file(rt, src, &op, NULL);
    if (rc == OPJIT_OK)
        CHECK_VALUE(call_value(rt, op), 5);
    opjit_destroy(rt);
    return rc;
}

static void a_forged_entry_in_a_readonly_layer_never_runs(void)
{
    const char *layer = tmpdir_new(), *d = tmpdir_new(), *evil_cache = tmpdir_new();
    char marker[1100], victim[1100], evil[1100], entry[1400], evil_entry[1400], so[1500];
    snprintf(marker, sizeof marker, "%s/evil-ran", d);
    write_const_op(d, "qal_victim.c", "qal_victim", 5);
    snprintf(victim, sizeof victim, "%s", pjoin(d, "qal_victim.c"));
    /* The attacker's module: its init leaves a mark, then registers the op. */
    char text[3000];
    snprintf(text, sizeof text,
             "#include <stdio.h>\n#include <opjit_op.h>\n"
             "static int k(opjit_ctx *c, opjit_args *a) { (void)a; int64_t s[1] = {1};\n"
             "  DLTensor *t = opjit_output(c, 0, OPJIT_INT64, 1, s); if (!t) return -1;\n"
             "  ((int64_t *)opjit_data(t))[0] = 5; return 0; }\n"
             "OPJIT_MODULE(qal_victim, m) { FILE *f = fopen(\"%s\", \"w\"); if (f) fclose(f);\n"
             "  opjit_def(m, \"qal_victim(int add=0) -> Tensor\", OPJIT_CPU, k, \"\"); }\n"
             "/* %s */\n", marker, run_nonce);
    write_text(d, "evil.c", text);
    snprintf(evil, sizeof evil, "%s", pjoin(d, "evil.c"));
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.tiering = 0;
    cfg.cache_dir = layer; /* the layer, filled by its owner */
    opjit_runtime *rt = rt_new_cfg(&cfg);
    CHECK(opjit_load_file(rt, victim, NULL, NULL) == OPJIT_OK);
    opjit_destroy(rt);
    cfg.cache_dir = evil_cache;
    rt = rt_new_cfg(&cfg);
    CHECK(opjit_load_file(rt, evil, NULL, NULL) == OPJIT_OK);
    opjit_destroy(rt);
    unlink(marker);
    if (!only_entry(layer, entry, sizeof entry) || !only_entry(evil_cache, evil_entry, sizeof evil_entry)) {
        CHECK(!"entries not found");
        return;
    }
    snprintf(so, sizeof so, "%s/host.so", evil_entry);
    forge_entry(entry, so);
    char cmd[1500];
    snprintf(cmd, sizeof cmd, "chmod -R go-w '%s'", layer);
    CHECK(system(cmd) == 0);
    /* The forgery is good: from a layer its owner controls it runs (the
     * owner is trusted), so the refusals below are the trust rule's. */
    CHECK(loads_from_layer(layer, victim, 1) == OPJIT_OK);
    CHECK(access(marker, F_OK) == 0);
    unlink(marker);

    char shard[1400];
    snprintf(shard, sizeof shard, "%s", entry);
    *strrchr(shard, '/') = '\0';
    /* Someone else may write the shard: the entry is refused. */
    CHECK(chmod(shard, 0777) == 0);
    CHECK(loads_from_layer(layer, victim, 1) == OPJIT_EOFFLINE);
    CHECK(loads_from_layer(layer, victim, 0) == OPJIT_OK); /* compiled here instead */
    CHECK(access(marker, F_OK) != 0);
    CHECK(chmod(shard, 0755) == 0);
    if (geteuid() == 0) {
        /* Another user owns the shard (as nobody would, having made it). */
        CHECK(chown(shard, 65534, 65534) == 0);
        CHECK(loads_from_layer(layer, victim, 1) == OPJIT_EOFFLINE);
        CHECK(access(marker, F_OK) != 0);
        CHECK(chown(shard, 0, 0) == 0);
        CHECK(chown(entry, 65534, 65534) == 0);
        CHECK(loads_from_layer(layer, victim, 1) == OPJIT_EOFFLINE);
        CHECK(access(marker, F_OK) != 0);
        CHECK(chown(entry, 0, 0) == 0);
    }
    /* The layer itself, or a directory above it, writable by others. */
    CHECK(chmod(layer, 0777) == 0);
    CHECK(loads_from_layer(layer, victim, 1) == OPJIT_EOFFLINE);
    CHECK(chmod(layer, 0755) == 0);
    char above[1100];
    snprintf(above, sizeof above, "%s/above", d);
    CHECK(mkdir(above, 0755) == 0);
    snprintf(cmd, sizeof cmd, "cp -a '%s' '%s/layer'", layer, above);
    CHECK(system(cmd) == 0);
    snprintf(cmd, sizeof cmd, "%s/layer", above);
    CHECK(chmod(above, 0777) == 0);
    CHECK(loads_from_layer(cmd, victim, 1) == OPJIT_EOFFLINE);
    CHECK(chmod(above, 01777) == 0); /* sticky, like /tmp: fine */
    CHECK(loads_from_layer(cmd, victim, 1) == OPJIT_OK);
    CHECK(access(marker, F_OK) == 0); /* (the forgery, from a trusted layer) */
    CHECK(chmod(above, 0755) == 0);
}

/* ---- op settings read like opjit's own ----------------------------------------- */

/* An environment variable's value and what the op reads from it. */
typedef struct {
    const char *value; /* NULL: unset */
    long want;
} env_case;

/* Call op once per case with var set to its value; a failed call must
 * say failed_msg. */
static void check_env_cases(opjit_runtime *rt, opjit_op *op, const char *var,
                            const env_case *cases, size_t n, const char *failed_msg)
{
    for (size_t i = 0; i < n; i++) {
        if (cases[i].value)
            setenv(var, cases[i].value, 1);
        else
            unsetenv(var);
        CHECK_VALUE(call_value(rt, op), cases[i].want);
        if (cases[i].want == CALL_FAILED)
            CHECK_STR_CONTAINS(opjit_errmsg(rt), failed_msg);
    }
    unsetenv(var);
}

static void ops_read_boolean_settings_like_opjit(void)
{
    const char *d = tmpdir_new();
    write_const_op_ex(d, "qal_flag.c", "qal_flag", "QAL_FLAG_VALUE",
                      "#define QAL_FLAG_VALUE opjit_env_flag(\"QAL_FLAG\", 7)");
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL;
    CHECK(opjit_load_file(rt, pjoin(d, "qal_flag.c"), &op, NULL) == OPJIT_OK);
    static const env_case cases[] = {{NULL, 7},  {"", 7},     {"1", 1},    {"on", 1},
                                     {"Yes", 1}, {"TRUE", 1}, {"0", 0},    {"off", 0},
                                     {"No", 0},  {" false ", 0}, {"maybe", 7}};
    check_env_cases(rt, op, "QAL_FLAG", cases, sizeof cases / sizeof cases[0], NULL);
    opjit_destroy(rt);
}

/* $OPJIT_HALF_KERNEL through the op API (opjit_half_kernel), read at each
 * call; another value fails the call with a message that says what is
 * expected (the op need not return the -1 it gets). */
static void ops_read_the_half_kernel_setting(void)
{
    const char *d = tmpdir_new();
    write_const_op_ex(d, "qal_half.c", "qal_half", "opjit_half_kernel(ctx)", NULL);
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL;
    CHECK(opjit_load_file(rt, pjoin(d, "qal_half.c"), &op, NULL) == OPJIT_OK);
    static const env_case cases[] = {
        {NULL, OPJIT_HALF_AUTO},   {"", OPJIT_HALF_AUTO},  {"auto", OPJIT_HALF_AUTO},
        {"wide", OPJIT_HALF_WIDE}, {"dot", OPJIT_HALF_DOT}, {"amx", OPJIT_HALF_AMX},
        {"fast", CALL_FAILED},     {"Wide", CALL_FAILED}};
    check_env_cases(rt, op, "OPJIT_HALF_KERNEL", cases, sizeof cases / sizeof cases[0],
                    "expected auto, amx, dot, wide or nothing");
    opjit_destroy(rt);
}

/* The machine's BLAS through the op API (opjit_blas): a function's
 * address; a name it lacks fails the call with a message naming it. */
static void ops_reach_blas_through_the_api(void)
{
    const char *d = tmpdir_new();
    write_const_op_ex(d, "qal_blas.c", "qal_blas", "opjit_blas(ctx, QAL_FN) != NULL",
                      "#define QAL_FN \"cblas_ddot\"");
    write_const_op_ex(d, "qal_noblas.c", "qal_noblas", "opjit_blas(ctx, QAL_FN) != NULL",
                      "#define QAL_FN \"opjit_no_such_blas\"");
    opjit_runtime *rt = rt_new();
    opjit_op *op = NULL, *bad = NULL;
    CHECK(opjit_load_file(rt, pjoin(d, "qal_blas.c"), &op, NULL) == OPJIT_OK);
    CHECK_VALUE(call_value(rt, op), 1);
    CHECK(opjit_load_file(rt, pjoin(d, "qal_noblas.c"), &bad, NULL) == OPJIT_OK);
    CHECK_VALUE(call_value(rt, bad), CALL_FAILED);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "BLAS function opjit_no_such_blas: no such function");
    opjit_destroy(rt);
}

static void status_strings(void)
{
    for (int s = 0; s < OPJIT_STATUS_COUNT; s++) {
        CHECK(strncmp(opjit_status_name(s), "OPJIT_", 6) == 0);
        CHECK(opjit_errstr(s)[0] != '\0');
    }
    opjit_runtime *rt = rt_new();
    CHECK(opjit_errmsg(rt) != NULL);
    opjit_destroy(rt);
    opjit_destroy(NULL);
    CHECK(opjit_create(NULL, NULL) == OPJIT_EINVAL);
}

/* ---- loading never makes the host's stack executable ----------------------- */

/* The permissions of this process's main stack ("rw-p"). */
static void stack_perms(char out[8])
{
    snprintf(out, 8, "?");
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, "[stack]"))
            sscanf(line, "%*s %7s", out);
    if (f)
        fclose(f);
}

/* 1 when the shared object at path carries PT_GNU_STACK without PF_X. */
static int so_stack_is_noexec(const char *path)
{
    Elf64_Ehdr eh;
    Elf64_Phdr ph;
    int fd = open(path, O_RDONLY), ok = 0;
    if (fd < 0 || pread(fd, &eh, sizeof eh, 0) != (ssize_t)sizeof eh)
        goto out;
    for (int i = 0; i < eh.e_phnum; i++)
        if (pread(fd, &ph, sizeof ph, (off_t)(eh.e_phoff + (uint64_t)i * sizeof ph)) ==
                (ssize_t)sizeof ph &&
            ph.p_type == PT_GNU_STACK)
            ok = !(ph.p_flags & PF_X);
out:
    if (fd >= 0)
        close(fd);
    return ok;
}

static int so_count, so_noexec;
static char so_last[PATH_MAX];
static int count_so(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)st, (void)ftw;
    size_t n = strlen(path);
    if (type == FTW_F && n > 3 && !strcmp(path + n - 3, ".so")) {
        so_count++;
        so_noexec += so_stack_is_noexec(path);
        snprintf(so_last, sizeof so_last, "%s", path);
    }
    return 0;
}

/* Every shipped source, both tiers: the stack stays rw-p after each load,
 * and every shared object in the cache says so in its program headers. */
static void loading_shipped_ops_keeps_the_stack_noexec(void)
{
    char perms[8], path[PATH_MAX + 64], dir[PATH_MAX];
    const char *files[] = {"nms.c", "conv2d.c", "mm.c", "nms.cu", "conv2d.cu", "mm.cu"};
    snprintf(dir, sizeof dir, "%s/ops-src", getenv("OPJIT_SOURCE_DIR"));
    for (int tiering = 0; tiering <= 1; tiering++) {
        opjit_config cfg;
        opjit_config_init(&cfg, sizeof cfg);
        cfg.cache_dir = tmpdir_new();
        cfg.tiering = tiering;
        opjit_runtime *rt = rt_new_cfg(&cfg);
        for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
            opjit_op *op = NULL;
            snprintf(path, sizeof path, "%s/%s", dir, files[i]);
            CHECKF(opjit_load_file(rt, path, &op, NULL) == OPJIT_OK, "%s: %s", files[i],
                   opjit_errmsg(rt));
            stack_perms(perms);
            CHECKF(!strchr(perms, 'x'), "after loading %s (tiering %d) the stack is %s",
                   files[i], tiering, perms);
        }
        if (tiering)
            CHECKF(opjit_wait(rt) == OPJIT_OK, "opjit_wait: %s", opjit_errmsg(rt));
        stack_perms(perms);
        CHECKF(!strchr(perms, 'x'), "after the optimized code came (tiering %d): %s", tiering,
               perms);
        opjit_destroy(rt);
        so_count = so_noexec = 0;
        nftw(cfg.cache_dir, count_so, 16, FTW_PHYS);
        /* host halves of 6 sources, and with tiering the 3 .c in the opt tier */
        CHECKF(so_count == (tiering ? 9 : 6) && so_noexec == so_count,
               "tiering %d: %d shared objects, %d with a non-executable PT_GNU_STACK", tiering,
               so_count, so_noexec);
    }
}

typedef struct logbuf {
    char text[8192];
} logbuf;

static void log_to_buf(void *ud, int level, const char *msg)
{
    logbuf *lb = ud;
    size_t n = strlen(lb->text);
    (void)level;
    snprintf(lb->text + n, sizeof lb->text - n, "%s\n", msg);
}

/* An entry whose host.so has no PT_GNU_STACK (what libtcc wrote before
 * opjit added one) is damaged: never dlopened, rebuilt, with a warning. */
static void an_entry_without_gnu_stack_is_rebuilt(void)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.cache_dir = tmpdir_new();
    cfg.tiering = 0;
    const char *d = tmpdir_new();
    write_const_op(d, "old.c", "old", 5);
    char src[PATH_MAX], perms[8];
    snprintf(src, sizeof src, "%s/old.c", d);
    opjit_runtime *rt = rt_new_cfg(&cfg);
    opjit_op *op = NULL;
    CHECK(opjit_load_file(rt, src, &op, NULL) == OPJIT_OK);
    opjit_destroy(rt);
    so_count = 0;
    nftw(cfg.cache_dir, count_so, 16, FTW_PHYS);
    CHECK(so_count == 1);
    /* the old shape: the object with its PT_GNU_STACK made PT_NULL, and a
     * manifest that agrees (cache_scan_artifacts would refuse it now) */
    char *entry = strdup(so_last), *old_so = so_last;
    *strrchr(entry, '/') = '\0';
    int dfd = open(entry, O_RDONLY | O_DIRECTORY), n = 0;
    cache_artifact *arts = NULL;
    char err[512];
    CHECK(dfd >= 0 && unlinkat(dfd, "manifest", 0) == 0);
    CHECKF(cache_scan_artifacts(dfd, &arts, &n, err, sizeof err) == OPJIT_OK, "%s", err);
    CHECK(chmod(old_so, 0600) == 0);
    Elf64_Ehdr eh;
    Elf64_Phdr ph;
    int fd = open(old_so, O_RDWR);
    CHECK(fd >= 0 && pread(fd, &eh, sizeof eh, 0) == (ssize_t)sizeof eh);
    for (int i = 0; fd >= 0 && i < eh.e_phnum; i++) {
        off_t at = (off_t)(eh.e_phoff + (uint64_t)i * sizeof ph);
        CHECK(pread(fd, &ph, sizeof ph, at) == (ssize_t)sizeof ph);
        if (ph.p_type == PT_GNU_STACK) {
            ph.p_type = PT_NULL;
            CHECK(pwrite(fd, &ph, sizeof ph, at) == (ssize_t)sizeof ph);
        }
    }
    struct stat st;
    char *bytes = fd >= 0 && fstat(fd, &st) == 0 ? malloc((size_t)st.st_size) : NULL;
    CHECK(bytes && pread(fd, bytes, (size_t)st.st_size, 0) == st.st_size);
    for (int i = 0; bytes && i < n; i++)
        if (!strcmp(arts[i].name, "host.so"))
            arts[i].sum = XXH3_64bits(bytes, (size_t)st.st_size);
    free(bytes);
    if (fd >= 0)
        close(fd);
    CHECK(!so_stack_is_noexec(old_so));
    cache_request req;
    memset(&req, 0, sizeof req);
    snprintf(req.key.hex, sizeof req.key.hex, "%s", strrchr(entry, '/') + 1);
    req.op_name = req.source_name = req.compiler = req.options = req.target = req.tier = "x";
    uint64_t size;
    CHECK(cache_manifest_write(dfd, &req, arts, n, 1, &size, err, sizeof err) == OPJIT_OK);
    cache_artifacts_free(arts, n);
    close(dfd);
    logbuf lb = {0};
    cfg.log = log_to_buf;
    cfg.log_ud = &lb;
    cfg.verbosity = OPJIT_LOG_WARN;
    rt = rt_new_cfg(&cfg);
    CHECK(opjit_load_file(rt, src, &op, NULL) == OPJIT_OK);
    CHECK_VALUE(call_value(rt, op), 5);
    opjit_destroy(rt);
    CHECKF(strstr(lb.text, "no PT_GNU_STACK") != NULL, "log: %s", lb.text);
    stack_perms(perms);
    CHECKF(!strchr(perms, 'x'), "the stack is %s", perms);
    so_count = so_noexec = 0; /* (the damaged entry waits in v1/tmp to be swept) */
    char entries[PATH_MAX];
    snprintf(entries, sizeof entries, "%s/v1/entries", cfg.cache_dir);
    nftw(entries, count_so, 16, FTW_PHYS);
    CHECKF(so_count == 1 && so_noexec == 1, "%d shared objects, %d with PT_GNU_STACK (%s)",
           so_count, so_noexec, so_last);
    free(entry);
}

int main(void)
{
    /* Run by hand: a private cache. */
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    snprintf(run_nonce, sizeof run_nonce, "run %ld.%ld.%ld", (long)getpid(), (long)now.tv_sec,
             (long)now.tv_nsec);
    const char *own_cache = NULL;
    if (!getenv("OPJIT_CACHE_DIR")) {
        own_cache = tmpdir_new();
        setenv("OPJIT_CACHE_DIR", own_cache, 1);
    }
    T_RUN(load_by_path_returns_the_op_named_after_the_file);
    T_RUN(load_by_name_first_directory_wins);
    T_RUN(config_ops_path_is_searched_before_the_environment);
    T_RUN(loading_an_unchanged_file_twice_is_a_no_op);
    T_RUN(editing_the_source_swaps_the_kernel);
    T_RUN(reloading_through_another_spelling_of_the_path);
    T_RUN(editing_a_local_header_changes_the_op);
    T_RUN(angle_bracket_headers_next_to_the_source_are_in_the_key);
    T_RUN(unload_and_load_again);
    T_RUN(many_and_deep_local_headers_are_all_in_the_key);
    T_RUN(touching_without_change_does_not_recompile);
    T_RUN(header_edits_racing_the_optimizer);
    T_RUN(syntax_error_reports_file_line_and_the_line);
    T_RUN(error_in_a_local_header_names_the_header);
    T_RUN(missing_module_block);
    T_RUN(undefined_symbol_is_named);
    T_RUN(registration_errors);
    T_RUN(conflicts_between_files);
    T_RUN(reload_that_fails_keeps_the_old_kernel);
    T_RUN(reload_with_a_changed_schema);
    T_RUN(bad_paths);
    T_RUN(list_info_args_and_find);
    T_RUN(by_name_and_by_path_agree);
    T_RUN(reload_drops_ops_the_new_init_no_longer_registers);
    T_RUN(discover_survives_sources_that_exit_or_crash);
    T_RUN(a_forged_entry_in_a_readonly_layer_never_runs);
    T_RUN(loading_shipped_ops_keeps_the_stack_noexec);
    T_RUN(an_entry_without_gnu_stack_is_rebuilt);
    T_RUN(ops_read_boolean_settings_like_opjit);
    T_RUN(ops_read_the_half_kernel_setting);
    T_RUN(ops_reach_blas_through_the_api);
    T_RUN(status_strings);
    tmpdirs_remove();
    return t_done();
}
