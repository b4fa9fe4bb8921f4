/* tests/test_tcc_prelude.c - the build's preprocessed <opjit_op.h>
 * (jit/tcc_prelude.c): libtcc writes the same bytes with it as without,
 * and it is used only where the compile would see what it holds. */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "jit/jit.h"
#include "jit/tcc_prelude.h"
#include "opjit.h"
#include "t.h"
#include "t_files.h"

static const char *tmpdir;
static char incdir[PATH_MAX], opsdir[PATH_MAX];

/* text into path. */
static void write_str(const char *path, const char *text) { t_write(path, text, strlen(text)); }

/* text compiled as a .c op of src_dir by libtcc (the compiler table's
 * entry, as the loader calls it) into dir/host.so. */
static int compile_op(const char *name, const char *text, const char *src_dir, const char *dir,
                      char *diag, size_t n)
{
    const char *includes[] = {src_dir, incdir, NULL};
    mkdir(dir, 0700);
    jit_job job = {.source_name = name, .text = text, .len = strlen(text), .half = JIT_C,
                   .link_blas = strstr(text, "cblas") != NULL, .include_dirs = includes,
                   .target = jit_host_target(), .dir = dir, .artifact = "host.so"};
    return jit_tcc.compile(&job, diag, n);
}

static void the_build_made_a_prelude(void)
{
    /* This machine builds and runs the library: its headers are the ones
     * the prelude was made from. */
    const jit_prelude *op = &jit_tcc_preludes[0], *math = &jit_tcc_preludes[1];
    CHECK(op->includes[0] && !strcmp(op->includes[0], "opjit_op.h") && !op->includes[1]);
    CHECK(op->len > 1000 && strstr((const char *)op->text, "#define OPJIT_OP_H") != NULL);
    CHECK(math->includes[0] && !strcmp(math->includes[0], "opjit_op.h"));
    CHECK(math->includes[1] && !strcmp(math->includes[1], "math.h") && !math->includes[2]);
    CHECK(math->len > op->len && strstr((const char *)math->text, "#define _MATH_H") != NULL);
    CHECK(jit_tcc_prelude_headers[0].path != NULL);
    CHECK(jit_prelude_headers_unchanged(jit_tcc_prelude_headers));
}

/* text (an op in opsdir) compiles to the same bytes with the prelude as
 * through the include: the quoted spelling, which the prelude does not
 * stand in for, finds the same file here and keeps every line and column.
 * text is changed. */
static void same_with_and_without(const char *name, char *text)
{
    char a[PATH_MAX + 64], b[PATH_MAX + 64], diag[8192];
    size_t la = 0, lb = 0, plen = 0;
    const char *dirs[] = {opsdir, incdir, NULL};
    CHECKF(jit_tcc_prelude(text, dirs, incdir, &plen) != NULL, "%s: no prelude", name);
    char *inc = strstr(text, "#include <opjit_op.h>");
    CHECK(inc != NULL);
    snprintf(a, sizeof a, "%s/with-%s", tmpdir, name);
    snprintf(b, sizeof b, "%s/without-%s", tmpdir, name);
    CHECKF(compile_op(name, text, opsdir, a, diag, sizeof diag) == OPJIT_OK, "%s", diag);
    if (inc)
        memcpy(inc, "#include \"opjit_op.h\"", 21);
    CHECK(jit_tcc_prelude(text, dirs, incdir, &plen) == NULL);
    CHECKF(compile_op(name, text, opsdir, b, diag, sizeof diag) == OPJIT_OK, "%s", diag);
    strcat(a, "/host.so");
    strcat(b, "/host.so");
    char *x = t_slurp(a, &la), *y = t_slurp(b, &lb);
    CHECKF(x && y && la == lb && !memcmp(x, y, la), "%s: %zu bytes against %zu", name, la, lb);
    free(x);
    free(y);
}

static void shipped_ops_compile_to_the_same_bytes(void)
{
    const char *ops[] = {"nms.c", "mm.c", "conv2d.c", NULL};
    for (const char *const *op = ops; *op; op++) {
        char path[PATH_MAX + 64];
        size_t len = 0;
        snprintf(path, sizeof path, "%s/%s", opsdir, *op);
        char *text = t_slurp(path, &len);
        CHECKF(text != NULL, "%s", path);
        if (text)
            same_with_and_without(*op, text);
        free(text);
    }
}

/* libtcc prints "##" and "..." of a define wrongly; the build puts them
 * right (jit/gen/tcc_prelude_gen.c). Macros of the headers that paste
 * and take variable arguments. */
static void pasting_and_variadic_macros_compile_the_same(void)
{
    char text[] = "#include <opjit_op.h>\n"
                  "#include <stdint.h>\n"
                  "uint64_t consts(void) { return UINT64_C(1) << 40 | (uint64_t)INT64_C(-1) >> 60 |\n"
                  "                               UINTMAX_C(3) | UINT32_C(7); }\n"
                  "int pasted(void) { int __CONCAT(a, b) = 3; return ab; }\n"
                  "static int k(opjit_ctx *ctx, opjit_args *a) { (void)ctx; (void)a; return 0; }\n"
                  "OPJIT_MODULE(macros, m)\n"
                  "{\n"
                  "    opjit_def(m, \"macros(Tensor x) -> Tensor\", OPJIT_CPU, k, \"\");\n"
                  "}\n";
    same_with_and_without("macros.c", text);
}

/* An op that includes <math.h> next: its functions and its type-generic
 * macros (which paste) through the second prelude. */
static void math_op_compiles_the_same(void)
{
    char text[] = "#include <opjit_op.h>\n"
                  "#include <math.h>\n"
                  "double f(double x) { return sqrt(x) * M_PI + exp(x) + HUGE_VAL; }\n"
                  "float g(float x) { return fabsf(x) + expf(x) + (isnan(x) ? NAN : INFINITY); }\n"
                  "int h(double x) { return fpclassify(x) == FP_NORMAL && !signbit(x); }\n";
    same_with_and_without("math.c", text);
}

static void only_an_op_that_starts_with_the_include(void)
{
    const char *dirs[] = {opsdir, incdir, NULL};
    size_t len = 1;
    CHECK(jit_tcc_prelude("#include <opjit_op.h>\nint x;\n", dirs, incdir, &len) != NULL);
    CHECK(len == jit_tcc_preludes[0].len);
    /* <math.h> right after it: the prelude that holds both. */
    CHECK(jit_tcc_prelude("#include <opjit_op.h>\n/* m */\n#include <math.h> // m\nint x;\n", dirs,
                          incdir, &len) != NULL);
    CHECK(len == jit_tcc_preludes[1].len);
    CHECK(jit_tcc_prelude("#include <opjit_op.h>\n#include <string.h>\n#include <math.h>\n", dirs,
                          incdir, &len) != NULL);
    CHECK(len == jit_tcc_preludes[0].len);
    CHECK(jit_tcc_prelude("#include <math.h>\n#include <opjit_op.h>\n", dirs, incdir, &len) ==
          NULL);
    CHECK(jit_tcc_prelude("/* an op */\n// more\n\n  #  include  <opjit_op.h> // ops\n", dirs,
                          incdir, &len) != NULL);
    /* A define first could change what the headers declare. */
    CHECK(jit_tcc_prelude("#define _GNU_SOURCE\n#include <opjit_op.h>\n", dirs, incdir, &len) ==
          NULL);
    CHECK(len == 0);
    CHECK(jit_tcc_prelude("#pragma once\n#include <opjit_op.h>\n", dirs, incdir, &len) == NULL);
    CHECK(jit_tcc_prelude("int x;\n#include <opjit_op.h>\n", dirs, incdir, &len) == NULL);
    CHECK(jit_tcc_prelude("#include <opjit_op.h> int x;\n", dirs, incdir, &len) == NULL);
    CHECK(jit_tcc_prelude("#include <opjit_op.hh>\n", dirs, incdir, &len) == NULL);
    CHECK(jit_tcc_prelude("/* never closed #include <opjit_op.h>\n", dirs, incdir, &len) ==
          NULL);
    CHECK(jit_tcc_prelude("", dirs, incdir, &len) == NULL);
}

/* A source directory with a header by a name the prelude's were included
 * by would have it compiled instead. */
static void not_where_a_directory_holds_one_of_its_headers(void)
{
    char src[PATH_MAX + 16], f[PATH_MAX + 64], out[PATH_MAX + 16], diag[8192];
    snprintf(src, sizeof src, "%s/shadow", tmpdir);
    mkdir(src, 0700);
    const char *dirs[] = {src, incdir, NULL};
    const char *text = "#include <opjit_op.h>\n"
                       "#ifndef LOCAL_STDINT\n#error the local stdint.h was not used\n#endif\n"
                       "int f(void) { return (int)sizeof(uint32_t); }\n";
    size_t len;
    CHECK(jit_tcc_prelude(text, dirs, incdir, &len) != NULL);
    snprintf(f, sizeof f, "%s/stdint.h", src);
    write_str(f, "#define LOCAL_STDINT 1\n#include \"/usr/include/stdint.h\"\n");
    CHECK(jit_tcc_prelude(text, dirs, incdir, &len) == NULL);
    snprintf(out, sizeof out, "%s/shadow-out", tmpdir);
    CHECKF(compile_op("shadow.c", text, src, out, diag, sizeof diag) == OPJIT_OK, "%s", diag);
    unlink(f);
    CHECK(jit_tcc_prelude(text, dirs, incdir, &len) != NULL);
    /* A directory named like the first part of one (<bits/types.h>). */
    snprintf(f, sizeof f, "%s/bits", src);
    mkdir(f, 0700);
    CHECK(jit_tcc_prelude(text, dirs, incdir, &len) == NULL);
    rmdir(f);
    /* opjit_op.h is expected beside the library's headers, not beside
     * the source. */
    snprintf(f, sizeof f, "%s/opjit_op.h", src);
    write_str(f, "/* someone's copy */\n");
    CHECK(jit_tcc_prelude(text, dirs, incdir, &len) == NULL);
    const char *own[] = {src, NULL};
    CHECK(jit_tcc_prelude(text, own, src, &len) != NULL);
    unlink(f);
}

/* A system header that changed since the build (an upgrade): the prelude
 * would hold what it no longer says. */
static void not_after_a_header_changed(void)
{
    char f[PATH_MAX + 16];
    snprintf(f, sizeof f, "%s/header.h", tmpdir);
    write_str(f, "#define A 1\n");
    struct stat st;
    CHECK(stat(f, &st) == 0);
    jit_prelude_header h[] = {{f, (long long)st.st_size, (long long)st.st_mtim.tv_sec,
                               (long long)st.st_mtim.tv_nsec},
                              {0, 0, 0, 0}};
    CHECK(jit_prelude_headers_unchanged(h));
    write_str(f, "#define B 1\n"); /* the same size */
    struct timespec later[2] = {st.st_atim, st.st_mtim};
    later[1].tv_sec += 1;
    CHECK(utimensat(AT_FDCWD, f, later, 0) == 0);
    CHECK(!jit_prelude_headers_unchanged(h));
    write_str(f, "#define AB 1\n");
    later[1] = st.st_mtim; /* its time back, its size not */
    CHECK(utimensat(AT_FDCWD, f, later, 0) == 0);
    CHECK(!jit_prelude_headers_unchanged(h));
    unlink(f);
    CHECK(!jit_prelude_headers_unchanged(h));
}

/* A header of the same name put in a directory searched before the one
 * the prelude's came from would be compiled instead. */
static void not_after_a_header_appeared_before_one(void)
{
    char f[PATH_MAX + 16];
    snprintf(f, sizeof f, "%s/earlier.h", tmpdir);
    const char *paths[] = {"/nonexistent/opjit/x.h", f, NULL};
    CHECK(jit_prelude_paths_absent(paths));
    write_str(f, "\n");
    CHECK(!jit_prelude_paths_absent(paths));
    unlink(f);
    /* The build's list: glibc's <stdint.h> is in /usr/include, searched
     * after the machine's directory, where it must stay absent. */
    int listed = 0;
    for (const char *const *p = jit_tcc_prelude_absent; *p; p++)
        listed |= strstr(*p, "/stdint.h") != NULL;
    CHECK(listed);
    CHECK(jit_prelude_paths_absent(jit_tcc_prelude_absent));
}

int main(void)
{
    const char *src = getenv("OPJIT_SOURCE_DIR");
    char inc[PATH_MAX], ops[PATH_MAX];
    snprintf(inc, sizeof inc, "%s/include", src ? src : ".");
    snprintf(ops, sizeof ops, "%s/ops-src", src ? src : ".");
    if (!realpath(inc, incdir) || !realpath(ops, opsdir)) {
        perror("realpath");
        return 1;
    }
    tmpdir = t_tmpdir("prelude");
    T_RUN(the_build_made_a_prelude);
    T_RUN(shipped_ops_compile_to_the_same_bytes);
    T_RUN(pasting_and_variadic_macros_compile_the_same);
    T_RUN(math_op_compiles_the_same);
    T_RUN(only_an_op_that_starts_with_the_include);
    T_RUN(not_where_a_directory_holds_one_of_its_headers);
    T_RUN(not_after_a_header_changed);
    T_RUN(not_after_a_header_appeared_before_one);
    t_tmpdirs_remove();
    return t_done();
}
