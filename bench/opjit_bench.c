/*
 * bench/opjit_bench.c - the C side of bench/run (bench/bench.py drives it).
 *
 * Built by bench/run with cc -O2 against build/libopjit.a; tools/npy.c is
 * compiled in for the .npy inputs that bench.py writes with numpy, so both
 * sides read the same bytes.
 *
 *   opjit_bench load-once SRC [wait]
 *       In this (fresh) process: opjit_create + opjit_load_file(SRC), timed
 *       together; with "wait", opjit_wait afterwards (untimed). Prints one
 *       line "ok create_ms=.. load_ms=.. total_ms=.. hit=.. tier=.." or
 *       "err MESSAGE". The environment chooses the cache and the tiering
 *       ($OPJIT_BENCH_LOG=1: the library's debug log goes to stderr).
 *
 *   opjit_bench cc-once SRC OUTDIR
 *       The anchor of a cold load: spawn `cc -O2 -shared -fPIC -I include
 *       -I /usr/include/x86_64-linux-gnu -o OUTDIR/cc.so SRC -lopenblas -lm`,
 *       wait, dlopen the result, dlsym opjit_module_init; timed together.
 *
 *   opjit_bench dlopen-once SO
 *       dlopen + dlsym(opjit_module_init) of a prebuilt shared object.
 *
 *   opjit_bench tcc-once SRC OUTDIR
 *       The floor of a cold load through libtcc: libtcc alone compiles SRC
 *       as opjit has it compile (include/, SRC's directory, the dlpack and
 *       cblas headers; the tcc tier's defines; -lm) into OUTDIR/tcc.so,
 *       then dlopen + dlsym opjit_module_init; timed together, in process.
 *       No cache, no key, no checks: what opjit adds is the difference.
 *
 *   opjit_bench hit-floor SRC ENTRY [DEVICE_ENTRY]
 *       The floor of a cache hit: what any correct hit must do, alone,
 *       each step done plainly. Reads and hashes SRC, reads
 *       ENTRY/manifest (checking its end line), reads and hashes each
 *       header the manifest lists (beside SRC), checks those sums against
 *       the manifest's, reads and hashes ENTRY/host.so against its
 *       artifact line; for a .cu source the same of DEVICE_ENTRY's
 *       manifest and its artifact (the device code, a cubin), checked
 *       against the same source; then dlopen + dlsym opjit_module_init;
 *       timed together. No runtime, settings, trust checks of the cache's
 *       directories, lock, key, compiler identity or registration: what
 *       opjit adds is the difference.
 *
 *   opjit_bench loads SRC REPS [nocc]
 *       REPS repetitions, each in fresh processes (posix_spawn of this
 *       program) with a fresh empty cache directory: cold load and then
 *       cache-hit load (OPJIT_TIERING=0), a dlopen + dlsym of the artifact
 *       that hit loaded (its anchor), the cc + dlopen anchor and a
 *       dlopen of its result, libtcc alone (tcc-once), then a tiering run that leaves the optimized
 *       artifact in the cache (untimed) and a cache-hit load with tiering
 *       on that serves it. Prints one "rep ..." line per repetition, process wall times
 *       included (posix_spawn to waitpid).
 *
 *   opjit_bench lookup DIR OP FILE REPS
 *       The lookup of an op by name over a warm cache: REPS times, in a
 *       fresh runtime each (search path DIR only, tiering off),
 *       opjit_load_op(OP) timed; then, in another fresh runtime,
 *       opjit_load_file(DIR/FILE), the same load without the lookup.
 *       Prints "ok name_ms=.. path_ms=.. min_name_ms=.. min_path_ms=.."
 *       (medians and minima) or "err MESSAGE".
 *
 *   opjit_bench serve
 *       A coprocess answering one command per stdin line, so that bench.py
 *       can interleave repetitions of opjit and of torch in the same run:
 *         load NAME SRC           load in the tcc runtime (tiering off) and
 *                                 the opt runtime (tiering on + opjit_wait)
 *         input NAME FILE.npy     read an input
 *         nms TIER B S IOU ITERS  ITERS calls; "ok sec=.. kept=.. sum=.."
 *         conv TIER X W STRIDE PAD ITERS [OUT.npy]
 *         mm TIER A B ITERS [OUT.npy]
 *         sgemm A B [THREADS] ITERS  cblas_sgemm directly, preallocated C, on
 *                                 THREADS OpenBLAS threads (then back to 1)
 *         faultcost               microseconds to fault in a fresh page
 *         hosts TIER NHOSTS X W STRIDE PAD ITERS
 *                                 NHOSTS host threads, ITERS conv2d calls each,
 *                                 on one runtime at once
 *         add1 TIER ITERS         opjit_call of bench/ops/add1.c on 1 float
 *         direct ITERS            the same work as a direct C call
 *         quit
 *       TIER is tcc or opt, on the first thread count of $OPJIT_BENCH_THREADS
 *       (a comma list, default 1; one runtime per tier and count), or
 *       tcc@N / opt@N for N threads. Replies are one line: "ok ..." or
 *       "err ..."; timed replies give sec (wall), cpu (the calling thread),
 *       pcpu (the process) and flt (minor page faults per call).
 */
#define _GNU_SOURCE
#include <cblas.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <libgen.h>
#include <libtcc.h>
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <xxhash.h>

#include "opjit.h"
#include "tools/npy.h"

extern char **environ;

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* CPU time of the calling thread: unlike the wall clock, it does not count
 * the time other processes of a shared machine take the core away. */
static double cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* One line, without newlines, for a reply. */
static void oneline(char *s)
{
    for (; *s; s++)
        if (*s == '\n' || *s == '\r')
            *s = '|';
}

static void reply_err(const char *fmt, const char *msg)
{
    char buf[4096];
    snprintf(buf, sizeof buf, fmt, msg ? msg : "");
    oneline(buf);
    printf("err %s\n", buf);
    fflush(stdout);
}

/* ---- load-once, cc-once, dlopen-once: run in fresh processes ------------- */

/* $OPJIT_BENCH_LOG=1: the library's debug log to stderr (the remote
 * layer's per-entry fetch times, for bench/remote_bench.py). */
static void log_stderr(void *ud, int level, const char *msg)
{
    (void)ud;
    (void)level;
    fprintf(stderr, "%s\n", msg);
}

static int cmd_load_once(const char *src, int wait)
{
    double t0 = now_ms();
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    if (getenv("OPJIT_BENCH_LOG")) {
        cfg.log = log_stderr;
        cfg.verbosity = OPJIT_LOG_DEBUG;
    }
    opjit_runtime *rt;
    int rc = opjit_create(&cfg, &rt);
    double t1 = now_ms();
    if (rc) {
        printf("err opjit_create: %s\n", opjit_errstr(rc));
        return 1;
    }
    opjit_op *op = NULL;
    opjit_load_info info = {.size = sizeof info};
    rc = opjit_load_file(rt, src, &op, &info);
    double t2 = now_ms();
    if (rc) {
        reply_err("%s", opjit_errmsg(rt));
        opjit_destroy(rt);
        return 1;
    }
    const char *tier = info.tier;
    if (wait) {
        if (opjit_wait(rt)) {
            reply_err("opjit_wait: %s", opjit_errmsg(rt));
            opjit_destroy(rt);
            return 1;
        }
        opjit_op_info oi = {.size = sizeof oi};
        if (op && !opjit_op_info_get(rt, op, &oi) && oi.tier[OPJIT_CPU])
            tier = oi.tier[OPJIT_CPU];
    }
    printf("ok create_ms=%.4f load_ms=%.4f total_ms=%.4f hit=%d tier=%s key_ms=%.4f "
           "compile_ms=%.4f dlopen_init_ms=%.4f\n",
           t1 - t0, t2 - t1, t2 - t0, info.cache_hit, tier[0] ? tier : "-", info.key_ms,
           info.compile_ms, info.load_ms);
    fflush(stdout);
    opjit_destroy(rt);
    return 0;
}

static int spawn_wait(char *const argv[], const char *log)
{
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 1, log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    pid_t pid;
    int rc = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc)
        return -1;
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static int cmd_cc_once(const char *src, const char *outdir)
{
    char so[4096], log[4096];
    snprintf(so, sizeof so, "%s/cc.so", outdir);
    snprintf(log, sizeof log, "%s/cc.log", outdir);
    char *argv[] = {"cc", "-O2", "-shared", "-fPIC", "-I", "include",
                    "-I", "/usr/include/x86_64-linux-gnu", "-o", so, (char *)src,
                    "-lopenblas", "-lm", NULL};
    double t0 = now_ms();
    int rc = spawn_wait(argv, log);
    double t1 = now_ms();
    if (rc != 0) {
        printf("err cc failed (%d), see %s\n", rc, log);
        return 1;
    }
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    void *sym = h ? dlsym(h, "opjit_module_init") : NULL;
    double t2 = now_ms();
    if (!sym) {
        reply_err("dlopen/dlsym: %s", dlerror());
        return 1;
    }
    printf("ok cc_ms=%.4f dlopen_ms=%.4f total_ms=%.4f\n", t1 - t0, t2 - t1, t2 - t0);
    return 0;
}

/* dlopen + dlsym(opjit_module_init) of so; "ok total_ms=" since t0. */
static int dlopen_since(const char *so, double t0)
{
    void *h = dlopen(so, RTLD_NOW | RTLD_LOCAL);
    void *sym = h ? dlsym(h, "opjit_module_init") : NULL;
    double t1 = now_ms();
    if (!sym) {
        reply_err("dlopen/dlsym: %s", dlerror());
        return 1;
    }
    printf("ok total_ms=%.4f\n", t1 - t0);
    return 0;
}

static int cmd_tcc_once(const char *src, const char *outdir)
{
    char so[4096], dir[4096];
    snprintf(so, sizeof so, "%s/tcc.so", outdir);
    snprintf(dir, sizeof dir, "%s", src);
    double t0 = now_ms();
    TCCState *s = tcc_new();
    if (!s) {
        printf("err tcc_new failed\n");
        return 1;
    }
    tcc_set_output_type(s, TCC_OUTPUT_DLL);
    tcc_add_include_path(s, dirname(dir));
    tcc_add_include_path(s, "include");
    tcc_add_include_path(s, "/usr/include/x86_64-linux-gnu");
    tcc_define_symbol(s, "FORCE_OPENBLAS_COMPLEX_STRUCT", NULL);
    tcc_define_symbol(s, "OPJIT_TIER_TCC", NULL);
    int bad = tcc_add_file(s, src) < 0 || tcc_add_library(s, "m") < 0 ||
              tcc_output_file(s, so) < 0;
    tcc_delete(s);
    if (bad) {
        printf("err libtcc could not build %s\n", src);
        return 1;
    }
    return dlopen_since(so, t0);
}

static int cmd_dlopen_once(const char *so) { return dlopen_since(so, now_ms()); }

/* The whole of a file into a fresh buffer (NUL-terminated), as a hit reads
 * a source: NULL on failure. */
static char *read_whole(const char *path, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    char *buf = NULL;
    if (fd >= 0 && fstat(fd, &st) == 0 && (buf = malloc((size_t)st.st_size + 1)) &&
        read(fd, buf, (size_t)st.st_size) == st.st_size)
        buf[st.st_size] = '\0', *len = (size_t)st.st_size;
    else
        free(buf), buf = NULL;
    if (fd >= 0)
        close(fd);
    return buf;
}

/* dir (dlen bytes) + name (nlen) into out, n bytes: a path of this
 * program's own making ("" if it would not fit). */
static const char *join_path(char *out, size_t n, const char *dir, size_t dlen, const char *name,
                             size_t nlen)
{
    if (dlen + nlen + 1 > n)
        nlen = dlen = 0;
    memcpy(out, dir, dlen);
    memcpy(out + dlen, name, nlen);
    out[dlen + nlen] = '\0';
    return out;
}

/* The 16 hex digits a manifest gives after kind_name ("source NAME ",
 * "header NAME ": the first 8 bytes of its XXH3-128) match sum's. */
static int input_sum_ok(const char *manifest, const char *kind_name, XXH128_hash_t sum)
{
    static const char hexd[] = "0123456789abcdef";
    XXH128_canonical_t c;
    XXH128_canonicalFromHash(&c, sum);
    const char *at = strstr(manifest, kind_name);
    if (!at)
        return 0;
    at += strlen(kind_name);
    for (int i = 0; i < 8; i++)
        if (at[2 * i] != hexd[c.digest[i] >> 4] || at[2 * i + 1] != hexd[c.digest[i] & 15])
            return 0;
    return 1;
}

/* The manifest of entry (its end line checked): a fresh buffer, or NULL. */
static char *read_manifest(const char *entry, size_t elen, char *path, size_t n)
{
    size_t mlen;
    char *man = read_whole(join_path(path, n, entry, elen, "/manifest", 9), &mlen);
    const char *end = man ? strstr(man, "\nend ") : NULL;
    if (end && XXH3_64bits(man, (size_t)(end + 1 - man)) == strtoull(end + 5, NULL, 16))
        return man;
    free(man);
    return NULL;
}

/* The file man's artifact line names ("artifact SIZE SUM NAME"), read from
 * entry and checked against its size and sum; its path left in path. */
static int artifact_ok(const char *man, const char *entry, size_t elen, char *path, size_t n)
{
    const char *art = strstr(man, "\nartifact ");
    char *rest = NULL, *name;
    size_t len;
    if (!art)
        return 0;
    unsigned long long size = strtoull(art + 10, &rest, 10);
    unsigned long long sum = strtoull(rest, &name, 16);
    size_t nl = strcspn(++name, "\n");
    char file[300];
    if (nl + 2 > sizeof file)
        return 0;
    file[0] = '/';
    memcpy(file + 1, name, nl);
    char *data = read_whole(join_path(path, n, entry, elen, file, nl + 1), &len);
    int ok = data && len == size && XXH3_64bits(data, len) == sum;
    free(data);
    return ok;
}

/* No formatted output before the clock stops: a first printf faults in
 * pages of libc's code that a hit need not touch. dev: NULL, or the entry
 * of a .cu source's device code. */
static int cmd_hit_floor(const char *src, const char *entry, const char *dev)
{
    char path[4096], want[600];
    size_t len;
    double t0 = now_ms();
    const char *base = strrchr(src, '/') ? strrchr(src, '/') + 1 : src;
    size_t blen = strlen(base);
    char *text = read_whole(src, &len);
    char *man = read_manifest(entry, strlen(entry), path, sizeof path);
    char *dman = dev ? read_manifest(dev, strlen(dev), path, sizeof path) : NULL;
    int ok = text && man && (!dev || dman) && blen < 500;
    if (ok) {
        memcpy(want, "source ", 7);
        memcpy(want + 7, base, blen);
        memcpy(want + 7 + blen, " ", 2);
        XXH128_hash_t sum = XXH3_128bits(text, len); /* once, for both manifests */
        ok = input_sum_ok(man, want, sum) && (!dman || input_sum_ok(dman, want, sum));
    }
    /* each header the inputs line lists ("header NAME SUM", %0a-separated) */
    for (const char *h = ok ? strstr(man, "%0aheader ") : NULL; ok && h;
         h = strstr(h + 1, "%0aheader ")) {
        size_t nl = strcspn(h + 10, " "), hlen;
        char *ht = NULL;
        if (nl < 500) { /* "header NAME " into want */
            ht = read_whole(join_path(path, sizeof path, src, (size_t)(base - src), h + 10, nl),
                            &hlen);
            memcpy(want, h + 3, 7 + nl + 1);
            want[7 + nl + 1] = '\0';
        }
        ok = ht && input_sum_ok(man, want, XXH3_128bits(ht, hlen));
        free(ht);
    }
    ok = ok && (!dman || artifact_ok(dman, dev, strlen(dev), path, sizeof path)) &&
         artifact_ok(man, entry, strlen(entry), path, sizeof path);
    free(text);
    free(man);
    free(dman);
    if (!ok) {
        printf("err %s, its headers or %s not matching its manifest\n", src, path);
        return 1;
    }
    return dlopen_since(path, t0);
}

/* ---- loads: the parent of the fresh processes ----------------------------- */

static char self_path[4096];

/* Run this program with args in a fresh process, environment = ours plus
 * the overrides (NAME=VALUE, NULL-terminated). Its first output line goes to
 * line; the wall time (spawn to reaped) to *wall_ms. */
static int run_child(char *const args[], const char *const overrides[], char *line,
                     size_t n, double *wall_ms)
{
    int nenv = 0, nover = 0;
    while (environ[nenv])
        nenv++;
    while (overrides[nover])
        nover++;
    char **env = calloc((size_t)(nenv + nover + 1), sizeof *env);
    if (!env)
        return -1;
    int k = 0;
    for (int i = 0; i < nenv; i++) {
        int overridden = 0;
        for (int j = 0; j < nover; j++) {
            size_t len = strcspn(overrides[j], "=") + 1;
            if (!strncmp(environ[i], overrides[j], len))
                overridden = 1;
        }
        if (!overridden)
            env[k++] = environ[i];
    }
    for (int j = 0; j < nover; j++)
        env[k++] = (char *)overrides[j];
    env[k] = NULL;

    int fds[2];
    if (pipe(fds)) {
        free(env);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_addclose(&fa, fds[0]);
    posix_spawn_file_actions_addclose(&fa, fds[1]);
    pid_t pid;
    double t0 = now_ms();
    int rc = posix_spawn(&pid, self_path, &fa, NULL, args, env);
    posix_spawn_file_actions_destroy(&fa);
    close(fds[1]);
    free(env);
    if (rc) {
        close(fds[0]);
        return -1;
    }
    size_t got = 0;
    for (;;) {
        char buf[4096];
        ssize_t r = read(fds[0], buf, sizeof buf);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            break;
        for (ssize_t i = 0; i < r && got + 1 < n; i++)
            line[got++] = buf[i];
    }
    close(fds[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    *wall_ms = now_ms() - t0;
    line[got] = '\0';
    char *nl = strchr(line, '\n');
    if (nl)
        *nl = '\0';
    if (!got)
        snprintf(line, n, "err no output (status %d)", st);
    return 0;
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(p);
}

/* "k=v" from a child's line, as a string after the prefix; "" if none. */
static void field(const char *line, const char *key, char *out, size_t n)
{
    char pat[64];
    snprintf(pat, sizeof pat, " %s=", key);
    const char *p = strstr(line, pat);
    out[0] = '\0';
    if (!p)
        return;
    p += strlen(pat);
    size_t len = strcspn(p, " ");
    snprintf(out, n, "%.*s", (int)(len < n ? len : n - 1), p);
}

static void emit(const char *label, const char *line, double wall)
{
    if (!strncmp(line, "ok", 2)) {
        char v[64], hit[16], tier[16];
        field(line, "total_ms", v, sizeof v);
        field(line, "hit", hit, sizeof hit);
        field(line, "tier", tier, sizeof tier);
        printf(" %s_ms=%s %s_wall_ms=%.4f", label, v, label, wall);
        if (hit[0])
            printf(" %s_hit=%s %s_tier=%s", label, hit, label, tier);
        static const char *const parts[] = {"create_ms", "key_ms", "compile_ms", "dlopen_init_ms"};
        for (int i = 0; i < 4; i++) {
            field(line, parts[i], v, sizeof v);
            if (v[0])
                printf(" %s_%s=%s", label, parts[i], v);
        }
        if (!strcmp(label, "cc")) {
            field(line, "cc_ms", v, sizeof v);
            printf(" cc_compile_ms=%s", v);
        }
    } else {
        char buf[2048];
        snprintf(buf, sizeof buf, "%s", line);
        for (char *s = buf; *s; s++)
            if (*s == ' ')
                *s = '_';
        printf(" %s_err=%s", label, buf);
    }
}

/* The host.so a cache holds (with tiering off and one source loaded, the
 * one its hit loads): the anchor of that hit is a dlopen of this file. */
static char found_so[4096];

static int find_so(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    if (flag == FTW_F && !strcmp(p + ftw->base, "host.so")) {
        snprintf(found_so, sizeof found_so, "%s", p);
        return 1;
    }
    return 0;
}

/* The entry of a .cu source's device code (its cubin), for the floor. */
static char found_dev[4096];

static int find_dev(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    size_t n = strlen(p + ftw->base);
    if (flag == FTW_F && n > 6 && !strcmp(p + ftw->base + n - 6, ".cubin")) {
        snprintf(found_dev, sizeof found_dev, "%.*s", ftw->base - 1, p);
        return 1;
    }
    return 0;
}

static int cmd_loads(const char *src, int reps, int with_cc)
{
    for (int r = 0; r < reps; r++) {
        char tmpl[] = "/tmp/opjit-bench-XXXXXX";
        char *dir = mkdtemp(tmpl);
        if (!dir) {
            perror("mkdtemp");
            return 1;
        }
        char cache[4200], cachevar[4300], so[4200];
        snprintf(cache, sizeof cache, "%s/cache", dir);
        snprintf(cachevar, sizeof cachevar, "OPJIT_CACHE_DIR=%s", cache);
        snprintf(so, sizeof so, "%s/cc.so", dir);
        const char *off[] = {cachevar, "OPJIT_TIERING=0", NULL};
        const char *on[] = {cachevar, "OPJIT_TIERING=1", NULL};
        char *a_load[] = {self_path, "load-once", (char *)src, NULL};
        char *a_wait[] = {self_path, "load-once", (char *)src, "wait", NULL};
        char *a_cc[] = {self_path, "cc-once", (char *)src, dir, NULL};
        char *a_dl[] = {self_path, "dlopen-once", so, NULL};
        char *a_tcc[] = {self_path, "tcc-once", (char *)src, dir, NULL};
        char line[4096];
        double wall;

        printf("rep %d", r);
        if (run_child(a_load, off, line, sizeof line, &wall) == 0)
            emit("cold", line, wall);
        if (run_child(a_load, off, line, sizeof line, &wall) == 0)
            emit("hit", line, wall);
        /* dlopen + dlsym of the artifact that hit loaded, alone. */
        char entries[4300];
        snprintf(entries, sizeof entries, "%s/v1/entries", cache);
        found_so[0] = '\0';
        nftw(entries, find_so, 16, FTW_PHYS);
        char *a_hitdl[] = {self_path, "dlopen-once", found_so, NULL};
        if (found_so[0] && run_child(a_hitdl, off, line, sizeof line, &wall) == 0)
            emit("hitdl", line, wall);
        /* The floor of that hit: its entry, and a .cu's device code's. */
        char entry[4096];
        snprintf(entry, sizeof entry, "%s", found_so);
        size_t sl = strlen(src);
        int cu = sl > 3 && !strcmp(src + sl - 3, ".cu");
        found_dev[0] = '\0';
        if (cu)
            nftw(entries, find_dev, 16, FTW_PHYS);
        char *a_floor[] = {self_path, "hit-floor", (char *)src, dirname(entry),
                           cu ? found_dev : NULL, NULL};
        if (found_so[0] && (!cu || found_dev[0]) &&
            run_child(a_floor, off, line, sizeof line, &wall) == 0)
            emit("hitfloor", line, wall);
        if (with_cc) {
            if (run_child(a_cc, off, line, sizeof line, &wall) == 0)
                emit("cc", line, wall);
            if (run_child(a_dl, off, line, sizeof line, &wall) == 0)
                emit("dlopen", line, wall);
            if (run_child(a_tcc, off, line, sizeof line, &wall) == 0)
                emit("tccbare", line, wall);
            if (run_child(a_wait, on, line, sizeof line, &wall) == 0)
                emit("optbuild", line, wall);
            /* Tiering on: with it off, only libtcc artifacts are served. */
            if (run_child(a_load, on, line, sizeof line, &wall) == 0)
                emit("opthit", line, wall);
        }
        printf("\n");
        fflush(stdout);
        nftw(dir, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    }
    return 0;
}

/* ---- serve ------------------------------------------------------------------ */

#define MAXN 64

/* Runtimes: tier (tcc, opt) x thread count ($OPJIT_BENCH_THREADS, e.g.
 * "1,2"); runtime 2 * i + tier has threads[i] threads. */
#define MAXT 8
#define MAXRT (2 * MAXT)

typedef struct named_op {
    char name[64];
    opjit_op *op[MAXRT];
} named_op;

typedef struct named_in {
    char name[128];
    npy_array a;
} named_in;

static opjit_runtime *rts[MAXRT];
static int threads[MAXT], nthreads = 1, nrts = 2;
static named_op ops[MAXN];
static int nops;
static named_in ins[MAXN];
static int nins;

/* "tcc", "opt" (the first thread count), "opt@2": the runtime's index. */
static int tier_index(const char *spec)
{
    int tier = !strncmp(spec, "tcc", 3) ? 0 : !strncmp(spec, "opt", 3) ? 1 : -1;
    if (tier < 0 || (spec[3] && spec[3] != '@'))
        return -1;
    int want = spec[3] ? atoi(spec + 4) : threads[0];
    for (int i = 0; i < nthreads; i++)
        if (threads[i] == want)
            return 2 * i + tier;
    return -1;
}

static long minflt(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return ru.ru_minflt;
}

/* CPU time of the whole process: all threads of a parallel call. */
static double proc_cpu_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static opjit_op *find_op(const char *name, const char *tier)
{
    int t = tier_index(tier);
    if (t < 0)
        return NULL;
    for (int i = 0; i < nops; i++)
        if (!strcmp(ops[i].name, name))
            return ops[i].op[t];
    return NULL;
}

static DLTensor *find_in(const char *name)
{
    for (int i = 0; i < nins; i++)
        if (!strcmp(ins[i].name, name))
            return &ins[i].a.t;
    return NULL;
}

static void serve_load(const char *name, const char *src)
{
    if (nops >= MAXN)
        return reply_err("%s", "too many ops");
    named_op *no = &ops[nops];
    memset(no, 0, sizeof *no);
    snprintf(no->name, sizeof no->name, "%s", name);
    const char *tier[2] = {"-", "-"};
    for (int t = 0; t < nrts; t++) {
        opjit_load_info info = {.size = sizeof info};
        if (opjit_load_file(rts[t], src, &no->op[t], &info))
            return reply_err(t % 2 ? "opt runtime: %s" : "tcc runtime: %s",
                             opjit_errmsg(rts[t]));
        if (t % 2 == 1 && opjit_wait(rts[t]))
            return reply_err("opjit_wait: %s", opjit_errmsg(rts[t]));
        opjit_op_info oi = {.size = sizeof oi};
        if (t < 2 && !opjit_op_info_get(rts[t], no->op[t], &oi) && oi.tier[OPJIT_CPU])
            tier[t] = oi.tier[OPJIT_CPU];
    }
    nops++;
    printf("ok tcc=%s opt=%s\n", tier[0], tier[1]);
    fflush(stdout);
}

static void serve_input(const char *name, const char *path)
{
    if (find_in(name)) {
        printf("ok cached\n");
        fflush(stdout);
        return;
    }
    if (nins >= MAXN)
        return reply_err("%s", "too many inputs");
    char err[512];
    if (npy_read(path, &ins[nins].a, err, sizeof err))
        return reply_err("%s", err);
    snprintf(ins[nins].name, sizeof ins[nins].name, "%s", name);
    nins++;
    printf("ok\n");
    fflush(stdout);
}

static int write_out(const char *path, DLManagedTensor *mt)
{
    char err[512];
    if (npy_write(path, &mt->dl_tensor, err, sizeof err)) {
        reply_err("npy_write: %s", err);
        return -1;
    }
    return 0;
}

/* Time iters calls of op; reply "ok sec=.. " plus facts of the last output. */
static void timed_calls(opjit_op *op, int t, const opjit_value *args, int nargs, long iters,
                        const char *out, int is_nms)
{
    DLManagedTensor *res = NULL;
    long f0 = minflt();
    double p0 = proc_cpu_ms(), c0 = cpu_ms(), t0 = now_ms();
    for (long i = 0; i < iters; i++) {
        if (res)
            res->deleter(res);
        res = NULL;
        if (opjit_call(rts[t], op, args, nargs, &res, 1))
            return reply_err("opjit_call: %s", opjit_errmsg(rts[t]));
    }
    double t1 = now_ms(), c1 = cpu_ms(), p1 = proc_cpu_ms();
    double flt = (double)(minflt() - f0) / (double)iters;
    if (!res)
        return reply_err("%s", "no call made");
    if (out && out[0] && write_out(out, res)) {
        res->deleter(res);
        return;
    }
    if (is_nms) {
        const int64_t *idx = res->dl_tensor.data;
        int64_t kept = res->dl_tensor.shape[0], sum = 0;
        for (int64_t i = 0; i < kept; i++)
            sum += idx[i] * (i + 1);
        printf("ok sec=%.9f cpu=%.9f pcpu=%.9f flt=%.3f kept=%lld sum=%lld\n",
               (t1 - t0) / 1e3, (c1 - c0) / 1e3, (p1 - p0) / 1e3, flt, (long long)kept,
               (long long)sum);
    } else {
        printf("ok sec=%.9f cpu=%.9f pcpu=%.9f flt=%.3f\n", (t1 - t0) / 1e3, (c1 - c0) / 1e3,
               (p1 - p0) / 1e3, flt);
    }
    fflush(stdout);
    res->deleter(res);
}

static void serve_nms(char **w)
{
    int t = tier_index(w[1]);
    opjit_op *op = find_op("nms", w[1]);
    DLTensor *b = find_in(w[2]), *s = find_in(w[3]);
    if (t < 0 || !op || !b || !s)
        return reply_err("%s", "nms: unknown tier, op or input");
    opjit_value args[3] = {opjit_tensor(b), opjit_tensor(s), opjit_float(atof(w[4]))};
    timed_calls(op, t, args, 3, atol(w[5]), NULL, 1);
}

/* conv2d's arguments by name, so the harness follows the op's schema.
 * sv, pv: the stride and padding pairs the values point to. Returns the
 * argument count, or -1 with a reply sent. */
static int conv_args(int t, opjit_op *op, DLTensor *x, DLTensor *wt, int64_t stride, int64_t pad,
                     int64_t sv[2], int64_t pv[2], opjit_value args[16])
{
    sv[0] = sv[1] = stride;
    pv[0] = pv[1] = pad;
    opjit_op_info oi = {.size = sizeof oi};
    if (opjit_op_info_get(rts[t], op, &oi)) {
        reply_err("%s", opjit_errmsg(rts[t]));
        return -1;
    }
    int nargs = oi.nargs < 16 ? oi.nargs : 16, got_s = 0, got_p = 0;
    for (int i = 0; i < nargs; i++) {
        opjit_arg_info ai = {.size = sizeof ai};
        args[i] = opjit_none();
        if (opjit_op_arg_get(rts[t], op, i, &ai)) {
            reply_err("%s", opjit_errmsg(rts[t]));
            return -1;
        }
        const char *n = ai.name;
        if (!strcmp(n, "input") || !strcmp(n, "self") || !strcmp(n, "x")) {
            args[i] = opjit_tensor(x);
        } else if (!strcmp(n, "weight")) {
            args[i] = opjit_tensor(wt);
        } else if (!strcmp(n, "stride") || !strcmp(n, "padding")) {
            int64_t *v = n[0] == 's' ? sv : pv;
            args[i] = ai.kind == OPJIT_KIND_INTS ? opjit_ints(v, ai.list_len > 0 ? ai.list_len : 2)
                                                 : opjit_int(v[0]);
            if (n[0] == 's')
                got_s = 1;
            else
                got_p = 1;
        }
    }
    if ((stride != 1 && !got_s) || (pad != 0 && !got_p)) {
        reply_err("%s", "conv2d's schema has no stride/padding argument");
        return -1;
    }
    return nargs;
}

static void serve_conv(char **w, int nw)
{
    int t = tier_index(w[1]);
    opjit_op *op = find_op("conv2d", w[1]);
    DLTensor *x = find_in(w[2]), *wt = find_in(w[3]);
    if (t < 0 || !op || !x || !wt)
        return reply_err("%s", "conv: unknown tier, op or input");
    static int64_t sv[2], pv[2];
    opjit_value args[16];
    int nargs = conv_args(t, op, x, wt, atol(w[4]), atol(w[5]), sv, pv, args);
    if (nargs < 0)
        return;
    timed_calls(op, t, args, nargs, atol(w[6]), nw > 7 ? w[7] : NULL, 0);
}

/* Host threads calling one op at once, each `iters` times. */
typedef struct host_job {
    int t;
    opjit_op *op;
    const opjit_value *args;
    int nargs;
    long iters;
    int failed;
} host_job;

static void *host_main(void *arg)
{
    host_job *j = arg;
    for (long i = 0; i < j->iters && !j->failed; i++) {
        DLManagedTensor *res = NULL;
        if (opjit_call(rts[j->t], j->op, j->args, j->nargs, &res, 1))
            j->failed = 1;
        else
            res->deleter(res);
    }
    return NULL;
}

/* hosts TIER NHOSTS X W STRIDE PAD ITERS: NHOSTS host threads each make
 * ITERS conv2d calls on one runtime at once; "ok sec=.. calls=..". */
static void serve_hosts(char **w)
{
    int t = tier_index(w[1]), nh = atoi(w[2]);
    opjit_op *op = find_op("conv2d", w[1]);
    DLTensor *x = find_in(w[3]), *wt = find_in(w[4]);
    if (t < 0 || !op || !x || !wt || nh < 1 || nh > 64)
        return reply_err("%s", "hosts: unknown tier, op or input, or bad count");
    static int64_t sv[2], pv[2];
    opjit_value args[16];
    int nargs = conv_args(t, op, x, wt, atol(w[5]), atol(w[6]), sv, pv, args);
    if (nargs < 0)
        return;
    host_job jobs[64];
    pthread_t th[64];
    double p0 = proc_cpu_ms(), t0 = now_ms();
    int started = 0;
    for (int i = 0; i < nh; i++) {
        jobs[i] = (host_job){t, op, args, nargs, atol(w[7]), 0};
        if (pthread_create(&th[i], NULL, host_main, &jobs[i]))
            break;
        started++;
    }
    int failed = started < nh;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        failed |= jobs[i].failed;
    }
    double t1 = now_ms(), p1 = proc_cpu_ms();
    if (failed)
        return reply_err("%s", "hosts: a call or a thread failed");
    printf("ok sec=%.9f cpu=%.9f pcpu=%.9f flt=0 calls=%ld\n", (t1 - t0) / 1e3, (p1 - p0) / 1e3,
           (p1 - p0) / 1e3, (long)started * atol(w[7]));
    fflush(stdout);
}

static void serve_mm(char **w, int nw)
{
    int t = tier_index(w[1]);
    opjit_op *op = find_op("mm", w[1]);
    DLTensor *a = find_in(w[2]), *b = find_in(w[3]);
    if (t < 0 || !op || !a || !b)
        return reply_err("%s", "mm: unknown tier, op or input");
    opjit_value args[2] = {opjit_tensor(a), opjit_tensor(b)};
    timed_calls(op, t, args, 2, atol(w[4]), nw > 5 ? w[5] : NULL, 0);
}

static void serve_sgemm(char **w, int nw)
{
    /* sgemm A B ITERS, or sgemm A B THREADS ITERS */
    DLTensor *a = find_in(w[1]), *b = find_in(w[2]);
    long iters = atol(w[nw - 1]);
    int nth = nw > 4 ? atoi(w[3]) : 1;
    if (!a || !b || a->ndim != 2 || b->ndim != 2 || a->shape[1] != b->shape[0] || nth < 1)
        return reply_err("%s", "sgemm: bad inputs");
    int n = (int)a->shape[0], k = (int)a->shape[1], m = (int)b->shape[1];
    /* OpenBLAS loaded here, once, as a host would load it: linked to this
     * program, it would be in every load-once process too, and hide what
     * loading it costs an op's first load (2-3 ms). */
    static __typeof__(&cblas_sgemm) sgemm;
    static __typeof__(&openblas_set_num_threads) set_threads;
    if (!sgemm || !set_threads) {
        void *blas = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
        sgemm = blas ? (__typeof__(&cblas_sgemm))dlsym(blas, "cblas_sgemm") : NULL;
        set_threads = blas ? (__typeof__(&openblas_set_num_threads))dlsym(
                                 blas, "openblas_set_num_threads")
                           : NULL;
        if (!sgemm || !set_threads)
            return reply_err("sgemm: libopenblas.so.0: %s", dlerror());
    }
    float *c = aligned_alloc(64, ((size_t)n * m * sizeof(float) + 63) & ~(size_t)63);
    if (!c)
        return reply_err("%s", "out of memory");
    /* OpenBLAS's own threads; opjit's runtimes keep it at 1 between */
    set_threads(nth);
    long f0 = minflt();
    double p0 = proc_cpu_ms(), c0 = cpu_ms(), t0 = now_ms();
    for (long i = 0; i < iters; i++)
        sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, m, k, 1.0f, a->data, k, b->data, m,
              0.0f, c, m);
    double t1 = now_ms(), c1 = cpu_ms(), p1 = proc_cpu_ms();
    long f1 = minflt();
    set_threads(1);
    free(c);
    if (nth > 1) /* OpenBLAS's threads spin after a call: let them sleep first */
        usleep(200000);
    printf("ok sec=%.9f cpu=%.9f pcpu=%.9f flt=%.3f\n", (t1 - t0) / 1e3, (c1 - c0) / 1e3,
           (p1 - p0) / 1e3, (double)(f1 - f0) / (double)iters);
    fflush(stdout);
}

/* Microseconds to first-touch a page of a fresh mapping (twice: the
 * second mapping gets pages the first gave back, as a freed and
 * reallocated output does), and to rewrite a touched one. */
static void serve_faultcost(void)
{
    size_t bytes = (size_t)32 << 20;
    double pages = (double)bytes / (double)sysconf(_SC_PAGESIZE), us[3];
    for (int round = 0; round < 2; round++) {
        char *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED)
            return reply_err("%s", "mmap failed");
        double t0 = now_ms();
        memset(p, 1, bytes);
        double t1 = now_ms();
        memset(p, 2, bytes);
        double t2 = now_ms();
        munmap(p, bytes);
        us[round] = (t1 - t0) * 1e3 / pages;
        us[2] = (t2 - t1) * 1e3 / pages;
    }
    printf("ok fresh_us=%.3f again_us=%.3f reuse_us=%.3f\n", us[0], us[1], us[2]);
    fflush(stdout);
}

/* ---- call overhead ------------------------------------------------------------ */

/* The direct baseline: what add1's kernel and the runtime's output do, as
 * one C function compiled -O2 and called through a pointer (so the call is
 * not inlined away, as a call into a shared object would not be): one
 * allocation holding a DLManagedTensor, the shape and 64-aligned data,
 * filled in, x + 1 computed; the caller frees it with its deleter. */
typedef struct direct_block {
    DLManagedTensor mt;
    size_t size;
    int64_t shape[];
} direct_block;

static void direct_delete(DLManagedTensor *mt) { free(mt); }

__attribute__((noinline)) static int direct_add1(const DLTensor *x, DLManagedTensor **out)
{
    int64_t n = 1;
    for (int i = 0; i < x->ndim; i++)
        n *= x->shape[i];
    size_t head = sizeof(direct_block) + (size_t)x->ndim * sizeof(int64_t);
    size_t size = head + 64 + (size_t)n * sizeof(float);
    direct_block *b = malloc(size);
    if (!b)
        return -1;
    memset(b, 0, head);
    b->size = size;
    memcpy(b->shape, x->shape, (size_t)x->ndim * sizeof(int64_t));
    DLTensor *t = &b->mt.dl_tensor;
    t->data = (void *)(((uintptr_t)b + head + 63) & ~(uintptr_t)63);
    t->device = x->device;
    t->ndim = x->ndim;
    t->dtype = x->dtype;
    t->shape = b->shape;
    b->mt.deleter = direct_delete;
    const float *xs = (const float *)((const char *)x->data + x->byte_offset);
    float *ys = t->data;
    for (int64_t i = 0; i < n; i++)
        ys[i] = xs[i] + 1.0f;
    *out = &b->mt;
    return 0;
}

static int (*volatile direct_fn)(const DLTensor *, DLManagedTensor **) = direct_add1;

static float one_x = 41.0f;
static int64_t one_shape[1] = {1};
static DLTensor one_t = {&one_x, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, one_shape, NULL, 0};

static void serve_add1(char **w)
{
    int t = tier_index(w[1]);
    opjit_op *op = find_op("add1", w[1]);
    long iters = atol(w[2]);
    if (t < 0 || !op)
        return reply_err("%s", "add1: unknown tier or op not loaded");
    opjit_value args[1] = {opjit_tensor(&one_t)};
    double c0 = cpu_ms(), t0 = now_ms();
    for (long i = 0; i < iters; i++) {
        DLManagedTensor *res;
        if (opjit_call(rts[t], op, args, 1, &res, 1))
            return reply_err("opjit_call: %s", opjit_errmsg(rts[t]));
        res->deleter(res);
    }
    double t1 = now_ms(), c1 = cpu_ms();
    printf("ok sec=%.9f cpu=%.9f\n", (t1 - t0) / 1e3, (c1 - c0) / 1e3);
    fflush(stdout);
}

static void serve_direct(char **w)
{
    long iters = atol(w[1]);
    double c0 = cpu_ms(), t0 = now_ms();
    for (long i = 0; i < iters; i++) {
        DLManagedTensor *res;
        if (direct_fn(&one_t, &res))
            return reply_err("%s", "direct: out of memory");
        res->deleter(res);
    }
    double t1 = now_ms(), c1 = cpu_ms();
    printf("ok sec=%.9f cpu=%.9f\n", (t1 - t0) / 1e3, (c1 - c0) / 1e3);
    fflush(stdout);
}

static int cmd_serve(void)
{
    const char *base = getenv("OPJIT_BENCH_CACHE");
    if (!base || !*base) {
        fprintf(stderr, "serve: set OPJIT_BENCH_CACHE\n");
        return 2;
    }
    const char *tl = getenv("OPJIT_BENCH_THREADS");
    threads[0] = 1;
    if (tl && *tl) {
        nthreads = 0;
        for (const char *p = tl; *p && nthreads < MAXT;) {
            threads[nthreads++] = atoi(p);
            p = strchr(p, ',') ? strchr(p, ',') + 1 : p + strlen(p);
        }
    }
    nrts = 2 * nthreads;
    char dirs[2][4096];
    for (int t = 0; t < nrts; t++) {
        /* Separate caches: an optimized artifact in a cache is served even
         * with tiering off, and the tcc runtime must keep its libtcc code. */
        snprintf(dirs[t % 2], sizeof dirs[t % 2], "%s/%s", base, t % 2 ? "opt" : "tcc");
        opjit_config cfg;
        opjit_config_init(&cfg, sizeof cfg);
        cfg.cache_dir = dirs[t % 2];
        cfg.tiering = t % 2;
        cfg.num_threads = threads[t / 2];
        int rc = opjit_create(&cfg, &rts[t]);
        if (rc) {
            fprintf(stderr, "serve: opjit_create: %s\n", opjit_errstr(rc));
            return 1;
        }
    }
    char line[8192];
    while (fgets(line, sizeof line, stdin)) {
        char *w[16];
        int nw = 0;
        for (char *p = strtok(line, " \t\r\n"); p && nw < 16; p = strtok(NULL, " \t\r\n"))
            w[nw++] = p;
        if (!nw)
            continue;
        if (!strcmp(w[0], "quit"))
            break;
        else if (!strcmp(w[0], "load") && nw == 3)
            serve_load(w[1], w[2]);
        else if (!strcmp(w[0], "input") && nw == 3)
            serve_input(w[1], w[2]);
        else if (!strcmp(w[0], "nms") && nw == 6)
            serve_nms(w);
        else if (!strcmp(w[0], "conv") && nw >= 7)
            serve_conv(w, nw);
        else if (!strcmp(w[0], "mm") && nw >= 5)
            serve_mm(w, nw);
        else if (!strcmp(w[0], "sgemm") && (nw == 4 || nw == 5))
            serve_sgemm(w, nw);
        else if (!strcmp(w[0], "hosts") && nw == 8)
            serve_hosts(w);
        else if (!strcmp(w[0], "faultcost") && nw == 1)
            serve_faultcost();
        else if (!strcmp(w[0], "add1") && nw == 3)
            serve_add1(w);
        else if (!strcmp(w[0], "direct") && nw == 2)
            serve_direct(w);
        else
            reply_err("unknown or malformed command '%s'", w[0]);
    }
    for (int t = 0; t < nrts; t++)
        opjit_destroy(rts[t]);
    for (int i = 0; i < nins; i++)
        npy_free(&ins[i].a);
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One timed load in a fresh runtime: by name (file NULL) or by path. */
static double lookup_once(const char *dir, const char *op, const char *file)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.ops_path = dir;
    cfg.tiering = 0;
    opjit_runtime *rt = NULL;
    if (opjit_create(&cfg, &rt) != OPJIT_OK)
        return -1;
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, file ? file : "");
    double t0 = now_ms();
    int rc = file ? opjit_load_file(rt, path, NULL, NULL) : opjit_load_op(rt, op, NULL);
    double ms = now_ms() - t0;
    if (rc)
        printf("err %s\n", opjit_errmsg(rt));
    opjit_destroy(rt);
    return rc ? -1 : ms;
}

static int cmd_lookup(const char *dir, const char *op, const char *file, int reps)
{
    double name[256], path[256];
    if (reps < 1 || reps > 256)
        return 2;
    unsetenv("OPJIT_OPS_PATH"); /* DIR only */
    for (int i = 0; i < reps; i++)
        if ((name[i] = lookup_once(dir, op, NULL)) < 0 ||
            (path[i] = lookup_once(dir, op, file)) < 0)
            return 1;
    qsort(name, (size_t)reps, sizeof *name, cmp_double);
    qsort(path, (size_t)reps, sizeof *path, cmp_double);
    printf("ok name_ms=%.4f path_ms=%.4f min_name_ms=%.4f min_path_ms=%.4f\n", name[reps / 2],
           path[reps / 2], name[0], path[0]);
    return 0;
}

int main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", self_path, sizeof self_path - 1);
    if (n <= 0) {
        perror("readlink /proc/self/exe");
        return 1;
    }
    self_path[n] = '\0';
    if (argc >= 3 && !strcmp(argv[1], "load-once"))
        return cmd_load_once(argv[2], argc > 3 && !strcmp(argv[3], "wait"));
    if (argc == 4 && !strcmp(argv[1], "cc-once"))
        return cmd_cc_once(argv[2], argv[3]);
    if (argc == 4 && !strcmp(argv[1], "tcc-once"))
        return cmd_tcc_once(argv[2], argv[3]);
    if (argc == 3 && !strcmp(argv[1], "dlopen-once"))
        return cmd_dlopen_once(argv[2]);
    if ((argc == 4 || argc == 5) && !strcmp(argv[1], "hit-floor"))
        return cmd_hit_floor(argv[2], argv[3], argc == 5 ? argv[4] : NULL);
    if (argc >= 4 && !strcmp(argv[1], "loads"))
        return cmd_loads(argv[2], atoi(argv[3]), !(argc > 4 && !strcmp(argv[4], "nocc")));
    if (argc == 6 && !strcmp(argv[1], "lookup"))
        return cmd_lookup(argv[2], argv[3], argv[4], atoi(argv[5]));
    if (argc == 2 && !strcmp(argv[1], "serve"))
        return cmd_serve();
    fprintf(stderr,
            "usage: opjit_bench load-once SRC [wait] | cc-once SRC DIR | dlopen-once SO |\n"
            "                   hit-floor SRC ENTRY [DEVICE_ENTRY] |\n"
            "                   loads SRC REPS [nocc] | lookup DIR OP FILE REPS | serve\n");
    return 2;
}
