/* tests/test_scratch.c - what a process leaves outside the cache. A
 * compile leaves nothing: opjit_op.h is put in the build's own directory
 * (#26.3). The loader's scratch directory ($TMPDIR/opjit-XXXXXX, made when
 * the optimizing compiler is first asked for its version) of a process
 * killed with kill -9 is removed by the next runtime that makes one, never
 * those of live ones (in another process or in this one), and nothing is
 * left once every runtime is destroyed. The cache's private build
 * directories work the same way (cache_private_mkdir) and are tested in
 * test_cache. */
#include <dirent.h>
#include <errno.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "opjit.h"
#include "opjit_admin.h"
#include "t.h"

static char base[1024], tmp[1100], src[1100];

static const char *bdir(const char *name)
{
    static char bufs[8][1200];
    static int i;
    char *b = bufs[i++ % 8];
    snprintf(b, sizeof bufs[0], "%s/%s", base, name);
    return b;
}

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
    (void)st, (void)flag, (void)f;
    remove(p);
    return 0;
}

static int exists(const char *p)
{
    struct stat st;
    return lstat(p, &st) == 0;
}

/* The names in tmp that are the loader's (opjit-XXXXXX) or the cache's
 * (opjit-build-XXXXXX), space-separated. */
static void snap(char *out, size_t n, int build)
{
    const char *prefix = build ? "opjit-build-" : "opjit-";
    size_t len = strlen(prefix) + 6;
    out[0] = '\0';
    DIR *d = opendir(tmp);
    struct dirent *de;
    while (d && (de = readdir(d))) {
        if (strncmp(de->d_name, prefix, strlen(prefix)) || strlen(de->d_name) != len)
            continue;
        size_t used = strlen(out);
        snprintf(out + used, n - used, "%s ", de->d_name);
    }
    if (d)
        closedir(d);
}

static int count(const char *s)
{
    int n = 0;
    for (; *s; s++)
        n += *s == ' ';
    return n;
}

/* The one name of after that is not in before ("" if none). */
static void added(const char *before, const char *after, char *out, size_t n)
{
    out[0] = '\0';
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", after);
    for (char *tok = strtok(copy, " "); tok; tok = strtok(NULL, " "))
        if (!strstr(before, tok))
            snprintf(out, n, "%s/%s", tmp, tok);
}

static int why_seen(void *ud, const opjit_cache_why_report *w)
{
    (void)ud, (void)w;
    return 0;
}

/* A runtime with its own cache (so its load compiles) that loads the op,
 * then asks what the optimizing tier would serve: that asks the compiler
 * (one that is not there: no helper process is started) for its version,
 * in the scratch directory. */
static opjit_runtime *load(const char *cache_dir)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.cache_dir = cache_dir;
    cfg.tiering = 1;
    cfg.cc = "/nonexistent/opjit-test-cc";
    opjit_runtime *rt = NULL;
    if (opjit_create(&cfg, &rt) != OPJIT_OK)
        return NULL;
    int rc = opjit_load_op(rt, src, NULL);
    CHECKF(rc == OPJIT_OK, "load: %s", opjit_errmsg(rt));
    rc = opjit_cache_why(rt, src, NULL, why_seen, NULL);
    CHECKF(rc == OPJIT_OK, "why: %s", opjit_errmsg(rt));
    return rt;
}

/* A compile puts nothing in $TMPDIR, not even while its runtime lives. */
static void a_compile_leaves_nothing_outside_the_cache(void)
{
    char s[4096];
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.cache_dir = bdir("c-compile");
    cfg.tiering = 0;
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    opjit_load_info info = {.size = sizeof info};
    CHECKF(opjit_load_op(rt, src, NULL) == OPJIT_OK, "%s", opjit_errmsg(rt));
    CHECK(opjit_load_file(rt, src, NULL, &info) == OPJIT_OK);
    snap(s, sizeof s, 0);
    CHECKF(count(s) == 0, "a compile made %s", s);
    snap(s, sizeof s, 1);
    CHECKF(count(s) == 0, "a compile made %s", s);
    opjit_destroy(rt);
}

/* A child that loads and is gone without destroying its runtime: like
 * kill -9 once the op is loaded. */
static void dead_child(const char *cache_dir)
{
    pid_t pid = fork();
    if (pid == 0) {
        int failed = t_failed_checks;
        opjit_runtime *rt = load(cache_dir);
        _exit(rt && t_failed_checks == failed ? 0 : 1);
    }
    int st = 0;
    CHECK(waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void scratch_of_dead_processes_is_swept(void)
{
    char s0[4096], s1[4096], s2[4096], s3[4096], live[1500], dead[1500], other[1500], mine[1500];
    snap(s0, sizeof s0, 0);
    CHECK(count(s0) == 0);

    /* A runtime of this process, alive throughout. */
    opjit_runtime *rt_live = load(bdir("c-live"));
    snap(s1, sizeof s1, 0);
    added(s0, s1, live, sizeof live);
    CHECKF(count(s1) == 1 && *live, "%s", s1);

    /* Another process, alive until killed below. */
    int go[2];
    CHECK(pipe(go) == 0);
    pid_t alive = fork();
    if (alive == 0) {
        close(go[1]);
        opjit_runtime *rt = load(bdir("c-other"));
        char ch;
        if (read(go[0], &ch, 1) < 0) { /* killed before it returns */ }
        _exit(rt ? 0 : 1);
    }
    close(go[0]);
    for (int i = 0; i < 20000; i++) {
        snap(s2, sizeof s2, 0);
        if (count(s2) == 2)
            break;
        usleep(1000);
    }
    added(s1, s2, other, sizeof other);
    CHECKF(count(s2) == 2 && *other, "%s", s2);

    /* A process gone without destroying its runtime. */
    dead_child(bdir("c-dead"));
    snap(s3, sizeof s3, 0);
    added(s2, s3, dead, sizeof dead);
    CHECKF(count(s3) == 3 && *dead, "%s", s3);

    /* This process compiles in a new runtime: the dead one's goes, the
     * live ones stay. */
    opjit_runtime *rt = load(bdir("c-parent"));
    snap(s1, sizeof s1, 0);
    added(s3, s1, mine, sizeof mine);
    CHECKF(!exists(dead), "%s is left", dead);
    CHECKF(exists(live) && exists(other) && *mine && exists(mine), "%s", s1);

    /* The other process is killed: the next runtime that compiles sweeps
     * its directory. */
    kill(alive, SIGKILL);
    int st;
    CHECK(waitpid(alive, &st, 0) == alive);
    close(go[1]);
    CHECK(exists(other));
    opjit_runtime *rt2 = load(bdir("c-parent2"));
    CHECKF(!exists(other), "%s is left", other);
    CHECK(exists(live) && exists(mine));

    opjit_destroy(rt2);
    opjit_destroy(rt);
    CHECK(!exists(mine) && exists(live));
    opjit_destroy(rt_live);
    snap(s1, sizeof s1, 0);
    CHECKF(count(s1) == 0, "left: %s", s1);
}

/* Only what the loader puts there goes: a dead process's directory that
 * holds something else stays (its files of ours go). A directory without
 * a lock file (an older opjit's, or one being made) is left alone. */
static void only_our_files_are_removed(void)
{
    char s0[4096], s1[4096], dead[1500], p[1600], nolock[1200];
    snap(s0, sizeof s0, 0);
    dead_child(bdir("c-dead2"));
    snap(s1, sizeof s1, 0);
    added(s0, s1, dead, sizeof dead);
    CHECK(*dead);
    snprintf(p, sizeof p, "%s/notes.txt", dead);
    FILE *f = fopen(p, "w");
    CHECK(f && fclose(f) == 0);
    snprintf(nolock, sizeof nolock, "%s/opjit-NOLOCK", tmp);
    CHECK(mkdir(nolock, 0700) == 0);
    snprintf(p, sizeof p, "%s/opjit_op.h", nolock);
    f = fopen(p, "w");
    CHECK(f && fclose(f) == 0);

    opjit_runtime *rt = load(bdir("c-parent3"));
    opjit_destroy(rt);
    snprintf(p, sizeof p, "%s/notes.txt", dead);
    CHECK(exists(dead) && exists(p));
    snprintf(p, sizeof p, "%s/opjit_op.h", dead);
    CHECK(!exists(p));
    snprintf(p, sizeof p, "%s/lock", dead);
    CHECK(!exists(p));
    snprintf(p, sizeof p, "%s/opjit_op.h", nolock);
    CHECK(exists(p));
    nftw(dead, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
    nftw(nolock, rm_cb, 8, FTW_DEPTH | FTW_PHYS);
}

/* A cache that cannot be written (a directory below a regular file)
 * builds in private directories: the loader releases them once the op is
 * loaded, so a process gone after loading leaves only its scratch
 * directory, swept as ever. (One killed while building leaves its build
 * directory, swept the same way by the next build: see test_cache.) */
static void with_an_unusable_cache_too(void)
{
    char s0[4096], s1[4096], dead[1500], file[1200], cdir[1300];
    snprintf(file, sizeof file, "%s", bdir("a-file"));
    FILE *f = fopen(file, "w");
    CHECK(f && fclose(f) == 0);
    snprintf(cdir, sizeof cdir, "%s/cache", file);
    snap(s0, sizeof s0, 0);
    dead_child(cdir);
    snap(s1, sizeof s1, 0);
    added(s0, s1, dead, sizeof dead);
    CHECKF(count(s1) == 1 && *dead, "%s", s1);
    snap(s1, sizeof s1, 1);
    CHECKF(count(s1) == 0, "left: %s", s1);

    opjit_runtime *rt = load(cdir);
    CHECKF(!exists(dead), "%s is left", dead);
    opjit_destroy(rt);
    snap(s1, sizeof s1, 1);
    CHECKF(count(s1) == 0, "left: %s", s1);
    snap(s1, sizeof s1, 0);
    CHECKF(count(s1) == 0, "left: %s", s1);
}

int main(void)
{
    const char *env = getenv("OPJIT_CACHE_DIR");
    if (env && *env)
        snprintf(base, sizeof base, "%s", env);
    else
        snprintf(base, sizeof base, "/tmp/opjit-test-scratch-%ld", (long)getpid());
    nftw(base, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    mkdir(base, 0700);
    snprintf(tmp, sizeof tmp, "%s/tmp", base);
    mkdir(tmp, 0700);
    setenv("TMPDIR", tmp, 1);
    snprintf(src, sizeof src, "%s/scratch_op.c", base);
    FILE *f = fopen(src, "w");
    if (!f || fputs("#include <opjit_op.h>\n"
                    "static int k(opjit_ctx *ctx, opjit_args *a)\n"
                    "{\n"
                    "    int64_t shape[1] = {1};\n"
                    "    DLTensor *t = opjit_output(ctx, 0, OPJIT_INT64, 1, shape);\n"
                    "    if (!t)\n"
                    "        return -1;\n"
                    "    ((int64_t *)opjit_data(t))[0] = opjit_arg_int(a, 0);\n"
                    "    return 0;\n"
                    "}\n"
                    "OPJIT_MODULE(scratch_op, m)\n"
                    "{\n"
                    "    opjit_def(m, \"scratch_op(int x=0) -> Tensor\", OPJIT_CPU, k, \"x\");\n"
                    "}\n",
                    f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "cannot write %s\n", src);
        return 1;
    }
    unsetenv("OPJIT_CACHE_READONLY");
    unsetenv("OPJIT_OFFLINE");

    T_RUN(a_compile_leaves_nothing_outside_the_cache);
    T_RUN(scratch_of_dead_processes_is_swept);
    T_RUN(only_our_files_are_removed);
    T_RUN(with_an_unusable_cache_too);
    if (!t_failed_tests)
        nftw(base, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
    return t_done();
}
