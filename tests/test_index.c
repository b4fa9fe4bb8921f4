/* tests/test_index.c - ops found by name in any module (loader/index.c):
 * an op of a multi-op module, module::op names, two modules defining one
 * op, inits that crash, exit or hang while being indexed, re-indexing
 * after an edit (of a source, of a local header), and a warm lookup over
 * 50 sources that compiles nothing and runs no init. */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "opjit.h"
#include "opjit_admin.h"
#include "t.h"
#include "t_files.h"
#include "t_index.h"
#include "t_ops.h"

static const char *dir; /* the search path of these tests */

/* A module of one op per name in names (space separated), each kernel
 * writing value into a 1-element output. */
static void write_module(const char *path, const char *names, int value)
{
    char text[4096], defs[2048] = "", name[64];
    size_t n = 0;
    for (const char *p = names; sscanf(p, "%63s", name) == 1;) {
        n += (size_t)snprintf(defs + n, sizeof defs - n,
                              "    opjit_def(m, \"%s() -> Tensor\", OPJIT_CPU, k, \"\");\n", name);
        p = strstr(p, name) + strlen(name);
    }
    snprintf(text, sizeof text,
             "#include <opjit_op.h>\n"
             "static int k(opjit_ctx *ctx, opjit_args *a)\n{\n    (void)a;\n"
             "    int64_t one = 1;\n"
             "    DLTensor *y = opjit_output(ctx, 0, (DLDataType){kDLFloat, 32, 1}, 1, &one);\n"
             "    if (!y)\n        return -1;\n"
             "    ((float *)y->data)[0] = %d;\n    return 0;\n}\n"
             "OPJIT_MODULE(mod, m)\n{\n%s}\n", value, defs);
    t_write(path, text, strlen(text));
}

/* A module whose init does `what` before registering op. */
static void write_bad(const char *path, const char *what, const char *op)
{
    char text[1024];
    snprintf(text, sizeof text,
             "#include <opjit_op.h>\n#include <stdlib.h>\n"
             "static int k(opjit_ctx *ctx, opjit_args *a) { (void)ctx; (void)a; return 0; }\n"
             "OPJIT_MODULE(bad, m)\n{\n    %s;\n"
             "    opjit_def(m, \"%s() -> Tensor\", OPJIT_CPU, k, \"\");\n}\n", what, op);
    t_write(path, text, strlen(text));
}

static uint64_t cache_entries(opjit_runtime *rt)
{
    opjit_cache_info info = {.size = sizeof info};
    CHECK(opjit_cache_info_get(rt, &info) == OPJIT_OK);
    return info.entries;
}

static void test_multi_op_module(void)
{
    opjit_runtime *rt = t_index_rt(dir);
    opjit_op *op = NULL;
    const char *names[] = {"rmsnorm", "softmax", "matvec"};
    for (int i = 0; i < 3; i++) {
        int rc = opjit_load_op(rt, names[i], &op);
        CHECKF(rc == OPJIT_OK, "%s: %s", names[i], opjit_errmsg(rt));
        opjit_op_info info = {.size = sizeof info};
        if (!rc && op && opjit_op_info_get(rt, op, &info) == OPJIT_OK) {
            CHECK(!strcmp(info.name, names[i]));
            CHECK_STR_CONTAINS(info.source[OPJIT_CPU], "llama_ops.c");
        }
        if (op)
            CHECK(t_call_f32(rt, op) == 7.0f);
    }
    /* A file named after the op is found first, as before. */
    CHECK(opjit_load_op(rt, "direct", &op) == OPJIT_OK);
    opjit_destroy(rt);
}

static void test_qualified(void)
{
    opjit_runtime *rt = t_index_rt(dir);
    opjit_op *op = NULL;
    int rc = opjit_load_op(rt, "llama_ops::softmax", &op);
    CHECKF(rc == OPJIT_OK && op, "%s", opjit_errmsg(rt));
    rc = opjit_load_op(rt, "llama_ops::direct", &op);
    CHECK(rc == OPJIT_ENOTFOUND && !op);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "registers no op 'direct'");
    CHECK(opjit_load_op(rt, "nomodule::softmax", &op) == OPJIT_ENOTFOUND);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "module 'nomodule'");
    CHECK(opjit_load_op(rt, "::softmax", &op) == OPJIT_EINVAL);
    CHECK(opjit_load_op(rt, "llama_ops::", &op) == OPJIT_EINVAL);
    opjit_destroy(rt);
}

/* Crashing, exiting and hanging inits are reported; the rest indexed. */
static void test_bad_inits(void)
{
    opjit_runtime *rt = t_index_rt(dir);
    opjit_op *op = NULL;
    CHECK(opjit_load_op(rt, "matvec", &op) == OPJIT_OK);
    int rc = opjit_load_op(rt, "crashy", &op);
    CHECK(rc == OPJIT_ENOTFOUND);
    const char *msg = opjit_errmsg(rt);
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
    CHECK_STR_CONTAINS(msg, "crash.c: loading it"); /* the sanitizer turns the crash into an exit */
#else
    CHECK_STR_CONTAINS(msg, "crash.c: loading it crashed");
#endif
    CHECK_STR_CONTAINS(msg, "exits.c: loading it exited with status 3");
    CHECK_STR_CONTAINS(msg, "hangs.c: loading it did not finish");
    CHECK_STR_CONTAINS(msg, "broken.c");
    opjit_destroy(rt);
}

static void test_ambiguous(void)
{
    const char *d = t_tmpdir("index-dup");
    write_module(t_path(d, "a_ops.c"), "gelu relu", 1);
    write_module(t_path(d, "b_ops.c"), "gelu silu", 2);
    opjit_runtime *rt = t_index_rt(d);
    opjit_op *op = NULL;
    CHECK(opjit_load_op(rt, "gelu", &op) == OPJIT_EINVAL && !op);
    const char *msg = opjit_errmsg(rt);
    CHECK_STR_CONTAINS(msg, "a_ops.c");
    CHECK_STR_CONTAINS(msg, "b_ops.c");
    CHECK_STR_CONTAINS(msg, "a_ops::gelu");
    CHECK_STR_CONTAINS(msg, "b_ops::gelu");
    CHECK(opjit_load_op(rt, "silu", &op) == OPJIT_OK);
    CHECK(opjit_load_op(rt, "b_ops::gelu", &op) == OPJIT_OK && op && t_call_f32(rt, op) == 2.0f);
    opjit_destroy(rt);
    /* An earlier directory's module wins, as an earlier directory's file does. */
    const char *first = t_tmpdir("index-first");
    write_module(t_path(first, "c_ops.c"), "gelu", 3);
    char path[2048];
    snprintf(path, sizeof path, "%s:%s", first, d);
    rt = t_index_rt(path);
    CHECK(opjit_load_op(rt, "gelu", &op) == OPJIT_OK && op && t_call_f32(rt, op) == 3.0f);
    opjit_destroy(rt);
}

/* A name resolves to an op of that name or fails, saying what the file
 * named after it registers (#20.9). */
static void test_name_is_the_op(void)
{
    const char *d = t_tmpdir("index-name");
    write_module(t_path(d, "gelu.c"), "relu", 4);
    opjit_runtime *rt = t_index_rt(d);
    opjit_op *op = NULL;
    CHECK(opjit_load_op(rt, "gelu", &op) == OPJIT_ENOTFOUND && !op);
    const char *msg = opjit_errmsg(rt);
    CHECK_STR_CONTAINS(msg, "registers no op 'gelu'");
    CHECK_STR_CONTAINS(msg, "gelu.c registers relu");
    CHECK(opjit_load_op(rt, "gelu::gelu", &op) == OPJIT_ENOTFOUND && !op);
    CHECK(opjit_load_op(rt, "gelu::relu", &op) == OPJIT_OK && op && t_call_f32(rt, op) == 4.0f);
    opjit_destroy(rt);
}

/* Directories are searched in order, as PATH is: an earlier directory's
 * module beats a later directory's file named after the op (#20.17). */
static void test_earlier_directory_wins(void)
{
    const char *a = t_tmpdir("index-prec-a"), *b = t_tmpdir("index-prec-b");
    write_module(t_path(a, "my_override.c"), "dupop", 1);
    write_module(t_path(b, "dupop.c"), "dupop", 2);
    char path[2048];
    snprintf(path, sizeof path, "%s:%s", a, b);
    opjit_runtime *rt = t_index_rt(path);
    opjit_op *op = NULL, *q = NULL;
    int rc = opjit_load_op(rt, "dupop", &op);
    CHECKF(rc == OPJIT_OK && op && t_call_f32(rt, op) == 1.0f, "%s", opjit_errmsg(rt));
    rc = opjit_load_op(rt, "my_override::dupop", &q);
    CHECKF(rc == OPJIT_OK && q == op, "%s", opjit_errmsg(rt));
    opjit_destroy(rt);
    snprintf(path, sizeof path, "%s:%s", b, a);
    rt = t_index_rt(path);
    CHECK(opjit_load_op(rt, "dupop", &op) == OPJIT_OK && op && t_call_f32(rt, op) == 2.0f);
    opjit_destroy(rt);
    /* In one directory the file named after the op comes first. */
    write_module(t_path(a, "dupop.c"), "dupop", 3);
    rt = t_index_rt(a);
    CHECK(opjit_load_op(rt, "dupop", &op) == OPJIT_OK && op && t_call_f32(rt, op) == 3.0f);
    opjit_destroy(rt);
}

static void test_reindex_after_edit(void)
{
    const char *d = t_tmpdir("index-edit");
    write_module(t_path(d, "edit_ops.c"), "first_op", 1);
    const char *h = "#define NAME \"from_header\"\n";
    t_write(t_path(d, "hdr.h"), h, strlen(h));
    const char *src = "#include <opjit_op.h>\n#include \"hdr.h\"\n"
                      "static int k(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\n"
                      "OPJIT_MODULE(h, m) { opjit_def(m, NAME \"() -> Tensor\", OPJIT_CPU, k, \"\"); }\n";
    t_write(t_path(d, "hdr_ops.c"), src, strlen(src));
    opjit_runtime *rt = t_index_rt(d);
    opjit_op *op = NULL;
    CHECK(opjit_load_op(rt, "first_op", &op) == OPJIT_OK);
    CHECK(opjit_load_op(rt, "from_header", &op) == OPJIT_OK);
    opjit_destroy(rt);
    write_module(t_path(d, "edit_ops.c"), "second_op", 2);
    h = "#define NAME \"edited_header\"\n";
    t_write(t_path(d, "hdr.h"), h, strlen(h));
    write_module(t_path(d, "new_ops.c"), "third_op", 3);
    rt = t_index_rt(d);
    CHECK(opjit_load_op(rt, "second_op", &op) == OPJIT_OK && op && t_call_f32(rt, op) == 2.0f);
    CHECK(opjit_load_op(rt, "first_op", &op) == OPJIT_ENOTFOUND);
    CHECK(opjit_load_op(rt, "edited_header", &op) == OPJIT_OK);
    CHECK(opjit_load_op(rt, "from_header", &op) == OPJIT_ENOTFOUND);
    CHECK(opjit_load_op(rt, "third_op", &op) == OPJIT_OK);
    opjit_destroy(rt);
}

/* 50 sources: the first lookup indexes them; a later one, in a new
 * runtime as in a new process, compiles nothing and runs no init. */
static void test_warm_lookup(void)
{
    const char *d = t_tmpdir("index-50");
    char name[64], file[64];
    for (int i = 0; i < 50; i++) {
        snprintf(name, sizeof name, "op_%02d_a op_%02d_b", i, i);
        snprintf(file, sizeof file, "mod_%02d.c", i);
        write_module(t_path(d, file), name, i);
    }
    sleep(3); /* older than the index's racy window: the directory note is kept */
    for (int round = 0; round < 3; round++) {
        opjit_runtime *rt = t_index_rt(d);
        uint64_t before = cache_entries(rt);
        t_nlogs_indexed = 0;
        opjit_op *op = NULL;
        int rc = opjit_load_op(rt, "op_42_b", &op);
        CHECKF(rc == OPJIT_OK && op, "%s", opjit_errmsg(rt));
        if (op)
            CHECK(t_call_f32(rt, op) == 42.0f);
        if (round == 0) {
            CHECK(t_nlogs_indexed == 50);
        } else {
            CHECKF(t_nlogs_indexed == 0, "%d sources indexed again", t_nlogs_indexed);
            CHECKF(cache_entries(rt) == before, "%llu entries, %llu before",
                   (unsigned long long)cache_entries(rt), (unsigned long long)before);
        }
        opjit_destroy(rt);
    }
}

int main(void)
{
    unsetenv("OPJIT_OPS_PATH"); /* only the directories of these tests */
    setenv("OPJIT_DISCOVER_TIMEOUT", "1", 1);
    dir = t_tmpdir("index");
    write_module(t_path(dir, "llama_ops.c"), "rmsnorm softmax matvec", 7);
    write_module(t_path(dir, "direct.c"), "direct", 1);
    write_bad(t_path(dir, "crash.c"), "*(volatile int *)0 = 1", "crashy");
    write_bad(t_path(dir, "exits.c"), "exit(3)", "exity");
    write_bad(t_path(dir, "hangs.c"), "for (;;) {}", "hangy");
    write_bad(t_path(dir, "broken.c"), "this is not C", "brokeny");
    T_RUN(test_multi_op_module);
    T_RUN(test_qualified);
    T_RUN(test_bad_inits);
    T_RUN(test_ambiguous);
    T_RUN(test_name_is_the_op);
    T_RUN(test_earlier_directory_wins);
    T_RUN(test_reindex_after_edit);
    T_RUN(test_warm_lookup);
    t_tmpdirs_remove();
    return t_done();
}
