/* tests/test_jit.c - libtcc compiles (jit/tcc.c), without cache or runtime. */
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "jit/jit.h"
#include "opjit.h"
#include "opjit_build_config.h"
#include "t.h"
#include "t_files.h"

static char tmpdir[PATH_MAX];
static char incdir[PATH_MAX];

static int compile(const char *name, const char *text, const char *out, char *diag, size_t n)
{
    const char *includes[] = {incdir, OPJIT_DLPACK_INCLUDE_DIR, "/usr/include", NULL};
    const char *libs[] = {"m", NULL};
    jit_tcc_job job = {.source_name = name, .text = text, .include_dirs = includes,
                       .libraries = libs, .tcc_lib_dir = OPJIT_TCC_LIB_DIR, .out_path = out};
    return jit_tcc_compile(&job, diag, n);
}

static const char *good =
    "#include <opjit_op.h>\n"
    "#include <math.h>\n"
    "int twice(int x) { return (int)(2 * sqrt((double)x * x)); }\n";

static void compiles_a_shared_object(void)
{
    char out[PATH_MAX + 16], diag[4096];
    snprintf(out, sizeof out, "%s/good.so", tmpdir);
    CHECK(compile("good.c", good, out, diag, sizeof diag) == OPJIT_OK);
    void *h = dlopen(out, RTLD_NOW | RTLD_LOCAL);
    CHECKF(h != NULL, "%s", dlerror());
    if (h) {
        int (*twice)(int) = (int (*)(int))dlsym(h, "twice");
        CHECK(twice && twice(21) == 42);
        dlclose(h);
    }
}

static void syntax_error_has_file_line_and_source(void)
{
    char out[PATH_MAX + 16], diag[4096];
    snprintf(out, sizeof out, "%s/bad.so", tmpdir);
    const char *bad = "int ok(void) { return 1; }\n"
                      "\n"
                      "int broken(void) { return 1 +; }\n";
    CHECK(compile("ops/bad.c", bad, out, diag, sizeof diag) == OPJIT_ECOMPILE);
    CHECK_STR_CONTAINS(diag, "ops/bad.c:3:");
    CHECK_STR_CONTAINS(diag, "error");
    CHECK_STR_CONTAINS(diag, "    3 | int broken(void) { return 1 +; }");
    CHECK(access(out, F_OK) != 0);
}

static void odd_characters_in_the_name_are_harmless(void)
{
    char out[PATH_MAX + 16], diag[4096];
    snprintf(out, sizeof out, "%s/odd.so", tmpdir);
    CHECK(compile("we\"ird\\dir/ok.c", good, out, diag, sizeof diag) == OPJIT_OK);
    CHECK(compile("we\"ird\\dir/bad.c", "int f(void) { return 1 +; }\n", out, diag,
                  sizeof diag) == OPJIT_ECOMPILE);
    CHECK_STR_CONTAINS(diag, "we_ird_dir/bad.c:1:");
    CHECK_STR_CONTAINS(diag, "    1 | int f(void) { return 1 +; }");
}

static void missing_header_is_a_compile_error(void)
{
    char out[PATH_MAX + 16], diag[4096];
    snprintf(out, sizeof out, "%s/nohdr.so", tmpdir);
    CHECK(compile("nohdr.c", "#include \"nope.h\"\nint x;\n", out, diag, sizeof diag) ==
          OPJIT_ECOMPILE);
    CHECK_STR_CONTAINS(diag, "nohdr.c:1:");
    CHECK_STR_CONTAINS(diag, "nope.h");
}

static void unwritable_output_is_an_io_error(void)
{
    char diag[4096];
    int rc = compile("good.c", good, "/nonexistent-dir/x/good.so", diag, sizeof diag);
    CHECKF(rc == OPJIT_EIO, "rc %d: %s", rc, diag);
    CHECK(diag[0] != '\0');
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

/* A "quoted" header comes from the directories the job names, never from
 * the process's working directory (whose header was not hashed). */
static void quoted_header_is_not_taken_from_the_working_directory(void)
{
    char srcd[PATH_MAX + 16], cwdd[PATH_MAX + 16], p[PATH_MAX + 32], out[PATH_MAX + 16];
    char old[PATH_MAX], diag[4096];
    snprintf(srcd, sizeof srcd, "%s/src", tmpdir);
    snprintf(cwdd, sizeof cwdd, "%s/cwd", tmpdir);
    snprintf(out, sizeof out, "%s/quoted.so", tmpdir);
    CHECK(mkdir(srcd, 0700) == 0 && mkdir(cwdd, 0700) == 0);
    snprintf(p, sizeof p, "%s/hdr.h", srcd);
    write_file(p, "#define VAL 1\n");
    snprintf(p, sizeof p, "%s/hdr.h", cwdd);
    write_file(p, "#define VAL 666\n");
    CHECK(getcwd(old, sizeof old) != NULL);
    CHECK(chdir(cwdd) == 0);
    const char *includes[] = {srcd, incdir, NULL};
    jit_tcc_job job = {.source_name = "quoted.c",
                       .text = "#include \"hdr.h\"\nint val(void) { return VAL; }\n",
                       .include_dirs = includes, .tcc_lib_dir = OPJIT_TCC_LIB_DIR,
                       .out_path = out};
    int rc = jit_tcc_compile(&job, diag, sizeof diag);
    CHECK(chdir(old) == 0);
    CHECKF(rc == OPJIT_OK, "%s", diag);
    void *h = dlopen(out, RTLD_NOW | RTLD_LOCAL);
    CHECKF(h != NULL, "%s", dlerror());
    if (h) {
        int (*val)(void) = (int (*)(void))dlsym(h, "val");
        CHECK(val != NULL);
        if (val)
            CHECKF(val() == 1, "got %d: the working directory's header", val());
        dlclose(h);
    }
}

/* Diagnostics name the source as the job does (an absolute path too) and
 * a header by its path, never by the build directory the text was
 * compiled from. */
static void diagnostics_name_the_source_not_the_build_directory(void)
{
    char srcd[PATH_MAX + 16], name[PATH_MAX + 32], p[PATH_MAX + 32], out[PATH_MAX + 16];
    char diag[4096];
    snprintf(srcd, sizeof srcd, "%s/abs", tmpdir);
    CHECK(mkdir(srcd, 0700) == 0);
    snprintf(p, sizeof p, "%s/broken.h", srcd);
    write_file(p, "int in_header = not_declared_here;\n");
    snprintf(name, sizeof name, "%s/abs.c", srcd);
    snprintf(out, sizeof out, "%s/abs.so", tmpdir);
    const char *includes[] = {srcd, incdir, NULL};
    jit_tcc_job job = {.source_name = name, .text = "int x;\nint y = not_declared_here;\n",
                       .include_dirs = includes, .tcc_lib_dir = OPJIT_TCC_LIB_DIR,
                       .out_path = out};
    CHECK(jit_tcc_compile(&job, diag, sizeof diag) == OPJIT_ECOMPILE);
    char want[PATH_MAX + 64];
    snprintf(want, sizeof want, "%s:2: error", name);
    CHECK_STR_CONTAINS(diag, want);
    CHECK_STR_CONTAINS(diag, "    2 | int y = not_declared_here;");
    CHECK(strstr(diag, "//") == NULL);
    job.text = "#include \"broken.h\"\n";
    CHECK(jit_tcc_compile(&job, diag, sizeof diag) == OPJIT_ECOMPILE);
    snprintf(want, sizeof want, "%s:1:", name); /* "In file included from" */
    CHECK_STR_CONTAINS(diag, want);
    CHECK_STR_CONTAINS(diag, "broken.h:1: error");
    CHECKF(strstr(diag, "//") == NULL, "%s", diag);
}

static void *compile_thread(void *arg)
{
    long i = (long)arg;
    char out[PATH_MAX + 32], diag[4096];
    snprintf(out, sizeof out, "%s/t%ld.so", tmpdir, i);
    int ok = 1;
    for (int k = 0; k < 5; k++)
        ok &= compile("good.c", good, out, diag, sizeof diag) == OPJIT_OK;
    return (void *)(long)ok;
}

static void concurrent_compiles_are_serialised(void)
{
    pthread_t th[4];
    for (long i = 0; i < 4; i++)
        pthread_create(&th[i], NULL, compile_thread, (void *)i);
    for (int i = 0; i < 4; i++) {
        void *ok;
        pthread_join(th[i], &ok);
        CHECK(ok == (void *)1);
    }
}

/* A compiler's file id follows its path's links to the file (stat, no
 * realpath): the same for the same file, another when the link is
 * retargeted or the file changes, none when nothing is there. */
static void file_id_follows_links_to_the_file(void)
{
    char a[PATH_MAX + 16], b[PATH_MAX + 16], link[PATH_MAX + 16];
    char id1[128], id2[128], id3[128], id4[128];
    snprintf(a, sizeof a, "%s/cc-a", tmpdir);
    snprintf(b, sizeof b, "%s/cc-b", tmpdir);
    snprintf(link, sizeof link, "%s/cc", tmpdir);
    FILE *f = fopen(a, "w");
    CHECK(f && fputs("one", f) >= 0 && fclose(f) == 0);
    f = fopen(b, "w");
    CHECK(f && fputs("two!", f) >= 0 && fclose(f) == 0);
    unlink(link);
    CHECK(symlink(a, link) == 0);
    CHECK(jit_file_id("cc-file", link, id1, sizeof id1) == 1);
    CHECK(jit_file_id("cc-file", link, id2, sizeof id2) == 1);
    CHECK(strcmp(id1, id2) == 0);
    CHECK(strncmp(id1, "cc-file:", 8) == 0 && strlen(id1) == 8 + 32);
    CHECK(unlink(link) == 0 && symlink(b, link) == 0); /* retargeted */
    CHECK(jit_file_id("cc-file", link, id3, sizeof id3) == 1);
    CHECK(strcmp(id1, id3) != 0);
    f = fopen(b, "a"); /* the file itself changes */
    CHECK(f && fputs("more", f) >= 0 && fclose(f) == 0);
    CHECK(jit_file_id("cc-file", link, id4, sizeof id4) == 1);
    CHECK(strcmp(id3, id4) != 0);
    CHECK(unlink(b) == 0);
    CHECK(jit_file_id("cc-file", link, id4, sizeof id4) == 0); /* dangling */
    unlink(link);
    unlink(a);
}

/* The optimizing compiler's targets: the x86-64 levels this CPU runs, as
 * libgcc's feature test (the one the library used before it read glibc's)
 * sees them, best first, capped by OPJIT_CPU_LEVEL. */
static void cc_targets_are_the_levels_this_cpu_runs(void)
{
#if defined(__x86_64__)
    __builtin_cpu_init();
    int v3 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("bmi2");
    int v2 = __builtin_cpu_supports("sse4.2") && __builtin_cpu_supports("popcnt");
    int v4 = v3 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("avx512vl");
    for (int cap = 0; cap <= 4; cap++) {
        jit_settings set = {.cpu_level = cap};
        char got[128], want[128];
        int c = cap ? cap : 4;
        snprintf(want, sizeof want, "%s%s%sx86-64", v4 && c >= 4 ? "x86-64-v4," : "",
                 v3 && c >= 3 ? "x86-64-v3," : "", v2 && c >= 2 ? "x86-64-v2," : "");
        jit_cc.targets(&set, got, sizeof got);
        CHECKF(strcmp(got, want) == 0, "cap %d: %s, libgcc says %s", cap, got, want);
    }
#endif
}



/* Compile text in a directory of its own under tmpdir (dir), linked the
 * way tcc_lib_dir says. */
static int compile_linked(const char *name, const char *text, const char *dir, const char *libdir,
                          int blas, char *diag, size_t n)
{
    static char ops[PATH_MAX], blasdir[PATH_MAX];
    const char *src = getenv("OPJIT_SOURCE_DIR");
    snprintf(ops, sizeof ops, "%s/ops-src", src ? src : ".");
    jit_blas_dir(blasdir, sizeof blasdir);
    const char *includes[] = {ops, incdir, OPJIT_CBLAS_INCLUDE_DIR, OPJIT_DLPACK_INCLUDE_DIR, NULL};
    const char *defines[] = {"FORCE_OPENBLAS_COMPLEX_STRUCT", "OPJIT_TIER_TCC", NULL};
    const char *libs[] = {"m", blas ? "openblas" : NULL, NULL};
    const char *libdirs[] = {blasdir, NULL};
    char out[PATH_MAX + 32];
    mkdir(dir, 0700);
    snprintf(out, sizeof out, "%s/host.so", dir);
    jit_tcc_job job = {.source_name = name, .text = text, .include_dirs = includes,
                       .defines = defines, .libraries = libs, .library_dirs = libdirs,
                       .tcc_lib_dir = libdir, .out_path = out};
    return jit_tcc_compile(&job, diag, n);
}

/* The files in dir. */
static int files_in(const char *dir)
{
    char cmd[PATH_MAX + 64], line[64] = "";
    snprintf(cmd, sizeof cmd, "ls -A '%s' | wc -l", dir);
    FILE *p = popen(cmd, "r");
    if (p) {
        if (!fgets(line, sizeof line, p))
            line[0] = '\0';
        pclose(p);
    }
    return atoi(line);
}

/* a/host.so and b/host.so hold the same bytes (what: which pair). */
static void same_host_so(const char *a, const char *b, const char *what)
{
    char so[PATH_MAX + 48];
    size_t la = 0, lb = 0;
    snprintf(so, sizeof so, "%s/host.so", a);
    char *x = t_slurp(so, &la);
    snprintf(so, sizeof so, "%s/host.so", b);
    char *y = t_slurp(so, &lb);
    CHECKF(x && y && la == lb && !memcmp(x, y, la), "%s: %zu bytes against %zu", what, la, lb);
    free(x);
    free(y);
}

/* The shared libraries reach the link as stubs holding only the symbols
 * the op needs (jit/tcc_stub.c): libtcc must write the very bytes it
 * writes when it reads the whole libraries itself. */
static const char *calls_libc =
    "#include <stdarg.h>\n#include <stdio.h>\n#include <stdlib.h>\n#include <math.h>\n"
    "#include <string.h>\n"
    "static int seen;\n"
    "static void at_end(void) { seen++; }\n"
    "static double sum(int n, ...) { va_list ap; va_start(ap, n); double t = 0;\n"
    "  for (int i = 0; i < n; i++) t += va_arg(ap, double); va_end(ap); return t; }\n"
    "int probe(char *out, int n) { atexit(at_end); float f = fabsf(-2.5f);\n"
    "  unsigned long long big = (unsigned long long)(1e19 * (f / 2.5f));\n"
    "  if (getenv(\"OPJIT_NOT_SET_ANYWHERE\")) fputs(\"?\", stderr);\n"
    "  return snprintf(out, (size_t)n, \"%g %s %llu\", sum(2, 1.5, (double)f), strchr(\"ab\", 'b'),\n"
    "                  big / 1000000000000ull); }\n";

static void stubbed_link_writes_libtccs_bytes(void)
{
    if (strcmp(jit_tcc_link_mode(OPJIT_TCC_LIB_DIR), "files")) {
        fprintf(stderr, "  (libtcc links by itself on this machine: no stubs to compare)\n");
        return;
    }
    const char *src = getenv("OPJIT_SOURCE_DIR");
    struct {
        const char *name;
        int blas;
    } ops[] = {{"nms.c", 0}, {"mm.c", 1}, {"conv2d.c", 1}, {"calls_libc.c", 0}};
    for (size_t i = 0; i < sizeof ops / sizeof ops[0]; i++) {
        char path[PATH_MAX + 32], a[PATH_MAX + 32], b[PATH_MAX + 32], diag[4096];
        size_t tl = 0;
        snprintf(path, sizeof path, "%s/ops-src/%s", src ? src : ".", ops[i].name);
        char *text = strcmp(ops[i].name, "calls_libc.c") ? t_slurp(path, &tl) : strdup(calls_libc);
        CHECKF(text != NULL, "%s", path);
        if (!text)
            continue;
        snprintf(a, sizeof a, "%s/stub-%zu", tmpdir, i);
        snprintf(b, sizeof b, "%s/full-%zu", tmpdir, i);
        CHECKF(compile_linked(ops[i].name, text, a, OPJIT_TCC_LIB_DIR, ops[i].blas, diag,
                              sizeof diag) == OPJIT_OK, "%s", diag);
        /* Another spelling of the same directory: libtcc's own link. */
        CHECK(strcmp(jit_tcc_link_mode(OPJIT_TCC_LIB_DIR "/"), "libtcc") == 0);
        CHECKF(compile_linked(ops[i].name, text, b, OPJIT_TCC_LIB_DIR "/", ops[i].blas, diag,
                              sizeof diag) == OPJIT_OK, "%s", diag);
        free(text);
        same_host_so(a, b, ops[i].name); /* stubbed, by libtcc */
        /* The object and the stubs are gone: the directory holds the
         * artifact only. */
        CHECKF(files_in(a) == 1, "%s: %d files left in %s", ops[i].name, files_in(a), a);
    }
    /* And it runs: libc's, libm's and libtcc1's functions, atexit from
     * libc_nonshared.a. */
    char so[PATH_MAX + 48], out[64] = "";
    snprintf(so, sizeof so, "%s/stub-3/host.so", tmpdir);
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    CHECKF(h != NULL, "%s", dlerror());
    int (*probe)(char *, int) = h ? (int (*)(char *, int))dlsym(h, "probe") : NULL;
    CHECK(probe != NULL);
    if (probe) {
        probe(out, sizeof out);
        CHECKF(!strcmp(out, "4 b 10000000"), "probe said \"%s\"", out);
    }
}

/* A stub that cannot be written (a file of its name in the way) leaves
 * the link to libtcc: the same bytes, and the file is not touched. */
static void unwritable_stub_falls_back_to_libtccs_link(void)
{
    if (strcmp(jit_tcc_link_mode(OPJIT_TCC_LIB_DIR), "files"))
        return;
    char a[PATH_MAX + 32], b[PATH_MAX + 32], junk[PATH_MAX + 48], diag[4096];
    snprintf(a, sizeof a, "%s/fallback-stub", tmpdir);
    snprintf(b, sizeof b, "%s/fallback-full", tmpdir);
    mkdir(a, 0700);
    snprintf(junk, sizeof junk, "%s/libc.so.6", a);
    write_file(junk, "not a library\n");
    CHECKF(compile_linked("probe.c", calls_libc, a, OPJIT_TCC_LIB_DIR, 0, diag, sizeof diag) ==
               OPJIT_OK, "%s", diag);
    CHECKF(compile_linked("probe.c", calls_libc, b, OPJIT_TCC_LIB_DIR "/", 0, diag,
                          sizeof diag) == OPJIT_OK, "%s", diag);
    size_t lj = 0;
    same_host_so(a, b, "a stub in the way, by libtcc");
    char *j = t_slurp(junk, &lj);
    CHECK(j && !strcmp(j, "not a library\n"));
    CHECKF(files_in(a) == 2, "%d files in %s", files_in(a), a);
    free(j);
}

/* libtcc reads the text and writes the object in memory (memfd_create),
 * or, where that fails (an old kernel, a seccomp filter, no /proc), in
 * files in the build directory. The library's calls come here. */
static int memfd_fails;
int memfd_create(const char *name, unsigned int flags)
{
    if (memfd_fails) {
        errno = ENOSYS;
        return -1;
    }
    return (int)syscall(SYS_memfd_create, name, flags);
}

/* Without memfd: the same bytes, nothing left beside the artifact, and
 * diagnostics name the source, not the file it was copied to. */
static void without_memfd_the_build_uses_files(void)
{
    const char *src = getenv("OPJIT_SOURCE_DIR");
    char path[PATH_MAX + 32], a[PATH_MAX + 32], b[PATH_MAX + 32], diag[4096];
    size_t tl = 0;
    snprintf(path, sizeof path, "%s/ops-src/nms.c", src ? src : ".");
    char *text = t_slurp(path, &tl);
    CHECKF(text != NULL, "%s", path);
    if (!text)
        return;
    snprintf(a, sizeof a, "%s/memfd", tmpdir);
    snprintf(b, sizeof b, "%s/no-memfd", tmpdir);
    CHECKF(compile_linked("nms.c", text, a, OPJIT_TCC_LIB_DIR, 0, diag, sizeof diag) ==
               OPJIT_OK, "%s", diag);
    memfd_fails = 1;
    CHECKF(compile_linked("nms.c", text, b, OPJIT_TCC_LIB_DIR, 0, diag, sizeof diag) ==
               OPJIT_OK, "%s", diag);
    CHECK(compile_linked("ops/bad.c", "int x;\nint y = not_declared_here;\n", b,
                         OPJIT_TCC_LIB_DIR, 0, diag, sizeof diag) == OPJIT_ECOMPILE);
    memfd_fails = 0;
    CHECK_STR_CONTAINS(diag, "ops/bad.c:2: error");
    CHECKF(strstr(diag, b) == NULL, "%s", diag);
    free(text);
    same_host_so(a, b, "in memory, through files");
    CHECKF(files_in(b) == 1, "%d files left in %s", files_in(b), b);
}

/* The build's directory (opjit_op.h alone) is searched after the system
 * headers' directories, so that no system header is looked for in it;
 * before them only where one of them has an opjit_op.h of its own. */
static void op_header_directory_comes_after_the_system_ones(void)
{
    const char *mine[] = {"/the/source", "/the/build", NULL};
    jit_job job = {.include_dirs = mine};
    const char *out[8];
    int n = jit_host_includes(&job, out, 6);
    struct stat st;
    int installed = stat(OPJIT_CBLAS_INCLUDE_DIR "/opjit_op.h", &st) == 0 ||
                    stat(OPJIT_DLPACK_INCLUDE_DIR "/opjit_op.h", &st) == 0;
    CHECK(n == 4 && out[4] == NULL);
    CHECK(!strcmp(out[0], "/the/source"));
    CHECK(!strcmp(out[installed ? 1 : 3], "/the/build"));
    CHECK(!strcmp(out[installed ? 2 : 1], OPJIT_CBLAS_INCLUDE_DIR));
}

int main(void)
{
    const char *src = getenv("OPJIT_SOURCE_DIR");
    snprintf(incdir, sizeof incdir, "%s/include", src ? src : ".");
    snprintf(tmpdir, sizeof tmpdir, "/tmp/opjit-test-jit-XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    T_RUN(compiles_a_shared_object);
    T_RUN(syntax_error_has_file_line_and_source);
    T_RUN(odd_characters_in_the_name_are_harmless);
    T_RUN(missing_header_is_a_compile_error);
    T_RUN(unwritable_output_is_an_io_error);
    T_RUN(quoted_header_is_not_taken_from_the_working_directory);
    T_RUN(diagnostics_name_the_source_not_the_build_directory);
    T_RUN(concurrent_compiles_are_serialised);
    T_RUN(file_id_follows_links_to_the_file);
    T_RUN(cc_targets_are_the_levels_this_cpu_runs);
    T_RUN(op_header_directory_comes_after_the_system_ones);
    T_RUN(stubbed_link_writes_libtccs_bytes);
    T_RUN(unwritable_stub_falls_back_to_libtccs_link);
    T_RUN(without_memfd_the_build_uses_files);
    char cmd[PATH_MAX + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", tmpdir);
    return t_done();
}
