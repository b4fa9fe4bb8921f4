/* tests/test_index_scale.c - the op index of a large directory (#20.19):
 * a directory note past 64 KiB is stored, and a warm lookup in a new
 * runtime reads a few notes, compiles nothing and runs no discovery child
 * (counted in the log, not timed); edits in place, new files and a
 * module picked that changed are still seen; and discovery runs several
 * children at once, never more than the CPUs. */
#include <ftw.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "opjit.h"
#include "t.h"
#include "t_files.h"
#include "t_index.h"
#include "t_ops.h"

#define NSRC 400 /* past the directories checked file by file */

/* A module registering op_names (space separated), each kernel giving value. */
static void write_module(const char *path, const char *op_names, int value)
{
    char text[4096], defs[2048] = "", name[128];
    size_t n = 0;
    for (const char *p = op_names; sscanf(p, "%127s", name) == 1;) {
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

/* Long names: 400 sources make a note of more than 64 KiB in any format. */
static const char *op_name(int i, int which)
{
    static char buf[4][96];
    static int k;
    char *b = buf[k++ % 4];
    snprintf(b, 96, "an_operator_with_a_rather_long_descriptive_name_%03d_%s", i,
             which == 0 ? "first" : which == 1 ? "second" : "third");
    return b;
}

static off_t biggest_note;

static int note_size(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)f;
    const char *base = strrchr(p, '/');
    if (flag == FTW_F && base && !strcmp(base, "/ops") && st->st_size > biggest_note)
        biggest_note = st->st_size;
    return 0;
}

static float load_value(opjit_runtime *rt, const char *name)
{
    opjit_op *op = NULL;
    int rc = opjit_load_op(rt, name, &op);
    CHECKF(rc == OPJIT_OK && op, "%s: %s", name, opjit_errmsg(rt));
    return op ? t_call_f32(rt, op) : -1.0f;
}

static const char *big; /* the directory of NSRC sources */

static void test_cold_then_warm(void)
{
    opjit_runtime *rt = t_index_rt(big);
    CHECK(load_value(rt, op_name(123, 1)) == 123.0f);
    CHECKF(t_nlogs_indexed == NSRC, "%d indexed", t_nlogs_indexed);
    opjit_destroy(rt);
    const char *cache = getenv("OPJIT_CACHE_DIR");
    biggest_note = 0;
    if (cache)
        nftw(cache, note_size, 16, FTW_PHYS);
    CHECKF(biggest_note > 64 * 1024, "the biggest note is %lld bytes",
           (long long)biggest_note);
    for (int round = 0; round < 2; round++) {
        rt = t_index_rt(big);
        CHECK(load_value(rt, op_name(321, 2)) == 321.0f);
        CHECKF(t_nlogs_indexed == 0, "%d sources indexed again", t_nlogs_indexed);
        /* The pointer and the note, not a note per source. */
        CHECKF(t_nlogs_note_hits <= 3, "%d notes read", t_nlogs_note_hits);
        opjit_destroy(rt);
    }
}

static void test_edits(void)
{
    /* In place: same inode, the directory unchanged. */
    write_module(t_path(big, "mod_200.c"), "renamed_op_200", 200);
    opjit_runtime *rt = t_index_rt(big);
    opjit_op *op = NULL;
    CHECK(opjit_load_op(rt, op_name(200, 0), &op) == OPJIT_ENOTFOUND && !op);
    CHECK(load_value(rt, "renamed_op_200") == 200.0f);
    CHECKF(t_nlogs_indexed == 1, "%d indexed", t_nlogs_indexed);
    opjit_destroy(rt);
    /* A new file: the directory changed. */
    write_module(t_path(big, "mod_new.c"), "brand_new_op", 7);
    rt = t_index_rt(big);
    CHECK(load_value(rt, "brand_new_op") == 7.0f);
    /* The others' entries kept from the directory's first note, not
     * read back one note per source. */
    CHECKF(t_nlogs_note_hits <= 4, "%d notes read", t_nlogs_note_hits);
    CHECK(load_value(rt, op_name(5, 0)) == 5.0f);
    CHECKF(t_nlogs_indexed == 1, "%d indexed", t_nlogs_indexed);
    opjit_destroy(rt);
    /* The same op in two modules of the directory is still an error. */
    write_module(t_path(big, "mod_dup.c"), op_name(17, 0), 1);
    rt = t_index_rt(big);
    CHECK(opjit_load_op(rt, op_name(17, 0), &op) == OPJIT_EINVAL);
    CHECK_STR_CONTAINS(opjit_errmsg(rt), "mod_017::");
    opjit_destroy(rt);
}

/* Each init waits until `want` inits run at once (at most 2 s), and
 * notes the most it saw. */
static void write_rendezvous(const char *path, const char *marks, int i, int want)
{
    char text[4096];
    snprintf(text, sizeof text,
             "#include <opjit_op.h>\n#include <dirent.h>\n#include <fcntl.h>\n"
             "#include <stdio.h>\n#include <string.h>\n#include <time.h>\n#include <unistd.h>\n"
             "static int k(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\n"
             "static int running(void)\n{\n    int n = 0;\n    DIR *d = opendir(\"%s\");\n"
             "    struct dirent *e;\n    while (d && (e = readdir(d)))\n"
             "        n += !strncmp(e->d_name, \"run.\", 4);\n    if (d)\n        closedir(d);\n"
             "    return n;\n}\n"
             "OPJIT_MODULE(par, m)\n{\n    char me[600], line[32];\n"
             "    snprintf(me, sizeof me, \"%s/run.%%d\", (int)getpid());\n"
             "    close(open(me, O_CREAT | O_WRONLY, 0600));\n    int most = 0;\n"
             "    struct timespec ts = {0, 10000000};\n"
             "    for (int i = 0; i < 200 && most < %d; i++) {\n"
             "        int n = running();\n        most = n > most ? n : most;\n"
             "        nanosleep(&ts, NULL);\n    }\n"
             "    ts.tv_nsec = 200000000;\n    nanosleep(&ts, NULL);\n"
             "    int n = running();\n    most = n > most ? n : most;\n"
             "    int fd = open(\"%s/seen\", O_CREAT | O_WRONLY | O_APPEND, 0600);\n"
             "    write(fd, line, (size_t)snprintf(line, sizeof line, \"%%d\\n\", most));\n"
             "    close(fd);\n    unlink(me);\n"
             "    opjit_def(m, \"par_%d() -> Tensor\", OPJIT_CPU, k, \"\");\n}\n",
             marks, marks, want, marks, i);
    t_write(path, text, strlen(text));
}

static void test_parallel_discovery(void)
{
    cpu_set_t set;
    int ncpu = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int want = ncpu < 2 ? 1 : 2;
    const char *d = t_tmpdir("index-par"), *marks = t_tmpdir("index-par-marks");
    char name[64];
    for (int i = 0; i < 6; i++) {
        snprintf(name, sizeof name, "par_mod_%d.c", i);
        write_rendezvous(t_path(d, name), marks, i, want);
    }
    opjit_runtime *rt = t_index_rt(d);
    opjit_op *op = NULL;
    CHECKF(opjit_load_op(rt, "par_4", &op) == OPJIT_OK, "%s", opjit_errmsg(rt));
    opjit_destroy(rt);
    FILE *f = fopen(t_path(marks, "seen"), "r");
    int most = 0, n = 0, v;
    while (f && fscanf(f, "%d", &v) == 1) {
        most = v > most ? v : most;
        n++;
    }
    if (f)
        fclose(f);
    CHECKF(n == 7, "%d inits ran", n); /* 6 discovery children and the load */
    CHECKF(most >= want, "at most %d discovery children ran at once (%d CPUs)", most, ncpu);
    CHECKF(most <= ncpu, "%d discovery children ran at once on %d CPUs", most, ncpu);
}

int main(void)
{
    unsetenv("OPJIT_OPS_PATH");
    setenv("OPJIT_DISCOVER_TIMEOUT", "30", 1);
    big = t_tmpdir("index-scale");
    char file[64], names[512];
    for (int i = 0; i < NSRC; i++) {
        snprintf(file, sizeof file, "mod_%03d.c", i);
        snprintf(names, sizeof names, "%s %s %s", op_name(i, 0), op_name(i, 1), op_name(i, 2));
        write_module(t_path(big, file), names, i);
    }
    sleep(3); /* older than the index's racy window: the notes are kept */
    T_RUN(test_cold_then_warm);
    T_RUN(test_edits);
    T_RUN(test_parallel_discovery);
    t_tmpdirs_remove();
    return t_done();
}
