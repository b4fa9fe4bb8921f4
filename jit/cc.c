/* jit/cc.c - the optimizing C compiler (the system's cc, gcc or clang) as a
 * child process: finding it, asking its version, compiling one source into
 * a shared object with a time limit. Knows nothing of the cache: the
 * optimizing tier (loader/tier.c) keys and stores what it makes. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* What the CPU and its OS run (cc_targets), as glibc's loader found it when
 * the process started (glibc 2.33 and later): no CPUID here, each a trap
 * to the hypervisor on a VM (3.7 us here). Not libgcc's
 * __builtin_cpu_supports where glibc can say: it links a constructor that
 * asks CPUID a dozen times as the library loads, in every process, whether
 * it ever builds an optimized op or not (issue 26). */
#if defined(__x86_64__)
#if defined(__has_include) && __has_include(<sys/platform/x86.h>)
#include <sys/platform/x86.h>
/* CPU_FEATURE_ACTIVE's test in unsigned arithmetic: glibc's shifts an int
 * 1 by 31 for a register's last bit (AVX512VL), which is undefined. */
static int cc_active(unsigned index)
{
    const struct cpuid_feature *f = __x86_get_cpuid_feature_leaf(index / 128);
    return f->active_array[index % 128 / 32] >> index % 32 & 1;
}
#define CC_HAS(glibc_name, gcc_name) cc_active(x86_cpu_##glibc_name)
#else
#define CC_HAS(glibc_name, gcc_name) __builtin_cpu_supports(gcc_name)
#endif
#endif

#include <xxhash.h>

#include "jit/jit.h"
#include "opjit.h"
#include "opjit_build_config.h"

extern char **environ;

/* The flags and defines of every optimizing compile (cc_options puts them
 * in the key). No fused multiply-add: both tiers must round alike, or a box
 * at an IoU threshold could be kept by one and dropped by the other. A
 * non-executable stack whatever the source holds: dlopen would otherwise
 * make the host's stack executable (the cache refuses such code too). */
static const char *const cc_fixed_flags[] = {"-O2", "-ffp-contract=off", "-fPIC", "-shared",
                                             "-Wl,-z,noexecstack", "-std=gnu99", NULL};
static const char *const cc_defines[] = {"-DFORCE_OPENBLAS_COMPLEX_STRUCT", "-DOPJIT_TIER_OPT",
                                         NULL};

/* name (a path, or looked up on path, a $PATH; NULL: the usual one) as an
 * executable; 1 and out, or 0. */
static int cc_find(const char *name, const char *path, char *out, size_t n)
{
    if (strchr(name, '/')) {
        if (access(name, X_OK) != 0)
            return 0;
        snprintf(out, n, "%s", name);
        return 1;
    }
    if (!path)
        path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        const char *e = strchr(path, ':');
        size_t len = e ? (size_t)(e - path) : strlen(path);
        char cand[PATH_MAX];
        snprintf(cand, sizeof cand, "%.*s/%s", (int)len, len ? path : ".", name);
        struct stat st;
        if (stat(cand, &st) == 0 && S_ISREG(st.st_mode) && access(cand, X_OK) == 0) {
            snprintf(out, n, "%s", cand);
            return 1;
        }
        path += len + (e ? 1 : 0);
    }
    return 0;
}

static double jit_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Run argv with stdout and stderr into logfd, in a process group of its
 * own; the exit status, -1 when it could not run (errno in *spawn_err),
 * -3 when a signal ended it (*sig), or -2 when it ran past timeout_ms and
 * was killed with everything it started (cc runs cc1, as, ld). */
static int jit_run_logged(char *const argv[], int logfd, long timeout_ms, int *spawn_err,
                          int *sig)
{
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, logfd, 1);
    posix_spawn_file_actions_adddup2(&fa, logfd, 2);
    posix_spawnattr_init(&at);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
    posix_spawnattr_setpgroup(&at, 0);
    pid_t pid;
    int rc = posix_spawn(&pid, argv[0], &fa, &at, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    *spawn_err = rc;
    *sig = 0;
    if (rc)
        return -1;
    double deadline = jit_now_ms() + (double)timeout_ms;
    long nap_us = 1000;
    int st;
    for (;;) {
        pid_t r = waitpid(pid, &st, WNOHANG);
        if (r == pid)
            break;
        if (r < 0 && errno != EINTR)
            return -1;
        if (jit_now_ms() >= deadline) {
            kill(-pid, SIGKILL);
            while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
                ;
            return -2;
        }
        usleep((useconds_t)nap_us); /* 1 ms, doubling up to 10 ms */
        nap_us = nap_us < 10000 ? nap_us * 2 : 10000;
    }
    if (WIFSIGNALED(st))
        *sig = WTERMSIG(st);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -3;
}

/* A log file for a child's output, opened (and unlinked) by us: read back
 * through the descriptor, so it survives its directory being removed
 * meanwhile (a cache deleted during a compile). -1 and errno. */
static int jit_open_log(const char *path)
{
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
    if (fd >= 0)
        unlink(path);
    return fd;
}

/* The log's text, at most its last 64 KiB, NUL-terminated; NULL when out
 * of memory or unreadable. */
static char *jit_read_log(int fd, size_t *len)
{
    enum { MAX = 65536 };
    struct stat st;
    off_t size = fstat(fd, &st) == 0 ? st.st_size : 0;
    off_t from = size > MAX ? size - MAX : 0;
    char *buf = malloc(MAX + 1);
    ssize_t n = buf ? pread(fd, buf, MAX, from) : -1;
    if (n < 0) {
        free(buf);
        return NULL;
    }
    buf[n] = '\0';
    *len = (size_t)n;
    return buf;
}

char *jit_cc_version(const char *cc, const char *scratch, long timeout_ms, size_t *len)
{
    char log[PATH_MAX + 32];
    snprintf(log, sizeof log, "%s/cc-version.txt", scratch);
    char *argv[] = {(char *)cc, "--version", NULL};
    int fd = jit_open_log(log), serr, sig;
    char *out = fd >= 0 && jit_run_logged(argv, fd, timeout_ms, &serr, &sig) == 0
                    ? jit_read_log(fd, len)
                    : NULL;
    if (fd >= 0)
        close(fd);
    return out;
}

/* source.c in the job's directory: #line keeps diagnostics pointing at the
 * op's own file. A short write (a full disk) must not compile a truncated
 * source, which could still be valid C. */
static int jit_cc_write_source(const jit_cc_job *job, const char *path, char *diag, size_t n)
{
    FILE *f = fopen(path, "wbe");
    if (!f) {
        snprintf(diag, n, "cannot write %s: %s", path, strerror(errno));
        return OPJIT_EIO;
    }
    errno = 0;
    fputs("#line 1 \"", f);
    for (const char *c = job->source_name; *c; c++) /* as jit/tcc.c names it */
        fputc(*c == '"' || *c == '\\' || *c == '\n' || *c == '\r' ? '_' : *c, f);
    fputs("\"\n", f);
    int werr = fwrite(job->text, 1, job->len, f) != job->len || ferror(f);
    if (fclose(f) || werr) {
        snprintf(diag, n, "cannot write %s: %s", path, strerror(errno ? errno : EIO));
        return OPJIT_EIO;
    }
    return OPJIT_OK;
}

/* The last lines of a compiler's output (at most max bytes, from a line
 * start where there is one), trailing blanks cut. */
static const char *jit_log_tail(char *text, size_t len, size_t max)
{
    while (len && (text[len - 1] == '\n' || text[len - 1] == ' '))
        text[--len] = '\0';
    if (len <= max)
        return text;
    const char *t = text + len - max, *nl = strchr(t, '\n');
    return nl ? nl + 1 : t;
}

/* Why the compile failed: the time limit, the compiler's exit status or
 * signal with its last lines of output, and whether its output directory
 * still exists (a cache removed meanwhile says nothing on its own). */
static void jit_cc_why(const jit_cc_job *job, int st, int serr, int sig, int logfd, char *diag,
                       size_t n)
{
    size_t len = 0;
    char *text = jit_read_log(logfd, &len);
    const char *tail = text ? jit_log_tail(text, len, 3000) : "";
    struct stat dst;
    int gone = stat(job->dir, &dst) != 0 && errno == ENOENT;
    char status[96];
    if (st == -2)
        snprintf(status, sizeof status, "ran past its time limit of %.1f s and was killed "
                 "(OPJIT_CC_TIMEOUT)", (double)job->timeout_ms / 1000.0);
    else if (st == -1)
        snprintf(status, sizeof status, "could not be run: %s", strerror(serr ? serr : errno));
    else if (st == -3)
        snprintf(status, sizeof status, "was killed by signal %d (%s)", sig, strsignal(sig));
    else
        snprintf(status, sizeof status, "failed (exit status %d)", st);
    snprintf(diag, n, "%s %s%s%s%s%s", job->cc, status,
             gone ? "; its output directory " : "", gone ? job->dir : "",
             gone ? " no longer exists (was the cache removed meanwhile?)" : "",
             *tail ? ":\n" : st == -2 ? "" : "; it printed nothing");
    size_t k = strlen(diag);
    if (*tail && k + 1 < n)
        snprintf(diag + k, n - k, "%s", tail);
    free(text);
}

int jit_cc_compile(const jit_cc_job *job, char *diag, size_t diaglen)
{
    char srcf[PATH_MAX], out[PATH_MAX], log[PATH_MAX], march[64], libdir[PATH_MAX + 2];
    char inc[8][PATH_MAX + 2];
    snprintf(srcf, sizeof srcf, "%s/source.c", job->dir);
    snprintf(out, sizeof out, "%s/%s", job->dir, job->out_name);
    snprintf(log, sizeof log, "%s/cc.log", job->dir);
    int rc = jit_cc_write_source(job, srcf, diag, diaglen);
    if (rc)
        return rc;
    const char *argv[48];
    int n = 0, ni = 0;
    argv[n++] = job->cc;
    for (int i = 0; cc_fixed_flags[i]; i++)
        argv[n++] = cc_fixed_flags[i];
    if (job->march) {
        snprintf(march, sizeof march, "-march=%s", job->march);
        argv[n++] = march;
    }
    for (int i = 0; job->defines && job->defines[i] && n < 30; i++)
        argv[n++] = job->defines[i];
    for (int i = 0; job->include_dirs && job->include_dirs[i] && ni < 8; i++) {
        snprintf(inc[ni], sizeof inc[ni], "-I%s", job->include_dirs[i]);
        argv[n++] = inc[ni++];
    }
    argv[n++] = "-o";
    argv[n++] = out;
    argv[n++] = srcf;
    if (job->blas_dir) {
        snprintf(libdir, sizeof libdir, "-L%s", job->blas_dir);
        argv[n++] = libdir;
        argv[n++] = "-lopenblas";
    }
    argv[n++] = "-lm";
    argv[n] = NULL;
    int logfd = jit_open_log(log), serr = 0, sig = 0;
    if (logfd < 0) {
        snprintf(diag, diaglen, "cannot create %s: %s", log, strerror(errno));
        unlink(srcf);
        return OPJIT_EIO;
    }
    int st = jit_run_logged((char *const *)argv, logfd, job->timeout_ms, &serr, &sig);
    if (st)
        jit_cc_why(job, st, serr, sig, logfd, diag, diaglen);
    if (logfd >= 0)
        close(logfd);
    unlink(srcf); /* the directory holds the artifact only */
    /* An exit status: the compiler rejected the source, and would again
     * (the tier keeps that: loader/pipeline.c). Not run, past its time
     * limit or killed: nothing said about the source. */
    return !st ? OPJIT_OK : st > 0 ? OPJIT_ECOMPILE : OPJIT_EIO;
}

/* ---- the optimizing C compiler in the table of compilers ------------------- */

static int cc_file_id(const jit_settings *set, char *out, size_t n)
{
    return jit_file_id("cc-file", set->cc, out, n);
}

/* A hash of what `cc --version` says and where it lives. */
static int cc_identity(const jit_settings *set, char *out, size_t n, char *err, size_t errlen)
{
    if (!set->cc[0]) {
        snprintf(err, errlen, "no C compiler (OPJIT_CC)");
        return OPJIT_EDEVICE;
    }
    size_t len;
    char *version = jit_cc_version(set->cc, set->scratch, set->cc_timeout_ms, &len);
    if (!version) {
        snprintf(err, errlen, "%s --version failed", set->cc);
        return OPJIT_ECOMPILE;
    }
    char buf[PATH_MAX + 4096];
    int k = snprintf(buf, sizeof buf, "%s\n%.*s", set->cc, (int)(len < 4096 ? len : 4096),
                     version);
    free(version);
    XXH128_hash_t h = XXH3_128bits(buf, (size_t)k < sizeof buf ? (size_t)k : sizeof buf);
    snprintf(out, n, "cc:%016llx%016llx", (unsigned long long)h.high64,
             (unsigned long long)h.low64);
    return OPJIT_OK;
}

/* What cc_compile_job passes, as flags (-march is the target). */
static void cc_options(const jit_job *job, char *out, size_t n)
{
    size_t k = jit_join(out, n, 0, "", cc_fixed_flags);
    k = jit_join(out, n, k, "", cc_defines);
    snprintf(out + k, n - k, " -lm link-blas=%s", job->link_blas ? "yes" : "no");
}

/* The CPU levels this machine runs, best first, none above
 * set->cpu_level (OPJIT_CPU_LEVEL) when it is set: code built for one of
 * them never meets a CPU that lacks its features. The level is the
 * -march of the build and a field of its key, so kernels may pick their
 * instructions at compile time (conv2d.c, mm.c). */
static void cc_targets(const jit_settings *set, char *out, size_t n)
{
#if defined(__x86_64__)
    int v3 = CC_HAS(AVX2, "avx2") && CC_HAS(FMA, "fma") && CC_HAS(BMI2, "bmi2");
    int v2 = CC_HAS(SSE4_2, "sse4.2") && CC_HAS(POPCNT, "popcnt");
    int v4 = v3 && CC_HAS(AVX512F, "avx512f") && CC_HAS(AVX512BW, "avx512bw") &&
             CC_HAS(AVX512CD, "avx512cd") && CC_HAS(AVX512DQ, "avx512dq") &&
             CC_HAS(AVX512VL, "avx512vl");
    int cap = set->cpu_level > 0 ? set->cpu_level : 4;
    snprintf(out, n, "%s%s%sx86-64", v4 && cap >= 4 ? "x86-64-v4," : "",
             v3 && cap >= 3 ? "x86-64-v3," : "", v2 && cap >= 2 ? "x86-64-v2," : "");
#else
    (void)set;
    snprintf(out, n, "native-baseline");
#endif
}

static int cc_compile_job(const jit_job *job, char *diag, size_t n)
{
    char blas[PATH_MAX];
    jit_blas_dir(blas, sizeof blas);
    const char *includes[6];
    jit_host_includes(job, includes, 6);
    jit_cc_job cj = {
        .cc = job->set->cc,
        .source_name = job->source_name,
        .text = job->text,
        .len = job->len,
        .march = strncmp(job->target, "x86-64", 6) ? NULL : job->target,
        .defines = cc_defines,
        .include_dirs = includes,
        .blas_dir = job->link_blas ? blas : NULL,
        .dir = job->dir,
        .out_name = job->artifact,
        .timeout_ms = job->set->cc_timeout_ms,
    };
    if (!cj.cc[0]) {
        snprintf(diag, n, "no C compiler (OPJIT_CC)");
        return OPJIT_EDEVICE;
    }
    return jit_cc_compile(&cj, diag, n);
}

static int cc_prepare(jit_settings *set)
{
    int found = set->cc_name && cc_find(set->cc_name, set->path, set->cc, sizeof set->cc);
    if (!found)
        set->cc[0] = '\0';
    return found;
}

const jit_compiler jit_cc = {
    .name = "opt",
    .what = "the optimizing C compiler",
    .halves = JIT_C,
    .background = 1,
    .file_id = cc_file_id,
    .identity = cc_identity,
    .options = cc_options,
    .targets = cc_targets,
    .artifact = jit_host_artifact,
    .compile = cc_compile_job,
    .prepare = cc_prepare,
};
