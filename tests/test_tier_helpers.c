/* tests/test_tier_helpers.c - the optimizing tier's helper processes
 * (loader/tier.c): runtimes made and destroyed in a loop leave no zombie,
 * also when the host is a subreaper (PID 1 in a container), a helper holds
 * none of the host's descriptors, and no more
 * helpers than OPJIT_CC_JOBS run at once per cache, from one process or
 * from several; a child between host and helper that hangs (a fork
 * handler of another library) never hangs the host.
 *
 * A helper is told from the rest by its session: the helper runs in the
 * session its short-lived parent made (setsid), so its session id is
 * neither its own pid nor ours; that parent, a session leader, is not
 * counted. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "opjit.h"
#include "t.h"

static char dir[PATH_MAX], cache[PATH_MAX + 16], src[PATH_MAX + 16], slowcc[PATH_MAX + 16];

static const char *op_text =
    "#include <opjit_op.h>\n"
    "static int twice(opjit_ctx *ctx, opjit_args *a) {\n"
    "    DLTensor *x = opjit_arg_tensor(a, 0);\n"
    "    DLTensor *y = opjit_output(ctx, 0, x->dtype, x->ndim, x->shape);\n"
    "    if (!y) return -1;\n"
    "    const float *xs = opjit_data(x); float *ys = y->data;\n"
    "    for (int64_t i = 0; i < opjit_numel(x); i++) ys[i] = xs[i] * 2.0f;\n"
    "    return 0;\n"
    "}\n"
    "OPJIT_MODULE(twice, m) {\n"
    "    opjit_def(m, \"twice(Tensor x) -> Tensor\", OPJIT_CPU, twice, \"2x\");\n"
    "}\n";

/* A source of its own per scenario, so none finds another's optimized
 * code in the cache. */
static void write_op(int variant)
{
    FILE *f = fopen(src, "w");
    if (!f)
        return;
    fprintf(f, "/* variant %d */\n%s", variant, op_text);
    fclose(f);
}

/* A compiler that takes seconds: helpers stay alive long enough to count. */
static int write_slow_cc(const char *real, int seconds)
{
    FILE *f = fopen(slowcc, "w");
    if (!f)
        return -1;
    fprintf(f, "#!/bin/sh\ncase \"$1\" in --version) exec '%s' --version;; esac\n"
               "sleep %d\nexec '%s' \"$@\"\n", real, seconds, real);
    fclose(f);
    return chmod(slowcc, 0755);
}

/* Our children: those alive that are helpers, and zombies. */
static void count_children(int *helpers, int *zombies)
{
    *helpers = *zombies = 0;
    pid_t self = getpid(), own_sid = getsid(0);
    DIR *d = opendir("/proc");
    struct dirent *de;
    while (d && (de = readdir(d))) {
        char path[300], buf[1024];
        if (de->d_name[0] < '0' || de->d_name[0] > '9')
            continue;
        snprintf(path, sizeof path, "/proc/%s/stat", de->d_name);
        FILE *f = fopen(path, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = '\0';
        char *rp = strrchr(buf, ')'), state;
        int ppid, pgrp, sid, pid = atoi(buf);
        if (!rp || sscanf(rp + 1, " %c %d %d %d", &state, &ppid, &pgrp, &sid) != 4 ||
            ppid != self)
            continue;
        if (state == 'Z')
            (*zombies)++;
        else if (sid != own_sid && sid != pid)
            (*helpers)++;
    }
    if (d)
        closedir(d);
}

static void nap_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The lock file of compile slot i of the cache (OPJIT_CC_JOBS is 2), or
 * -1 when there is none yet. */
static int slot_open(int i)
{
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/v1/locks/slot.%d", cache, i);
    return open(path, O_RDWR | O_CLOEXEC);
}

/* Whether the slot whose lock file is fd could be taken now (and is, until
 * fd is closed). */
static int slot_take(int fd)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET};
    return fcntl(fd, F_OFD_SETLK, &fl) == 0;
}

/* Until the helpers of an earlier scenario (not our children) are done:
 * their compile slots can be locked. */
static void wait_slots_free(void)
{
    for (int i = 0; i < 2; i++) {
        int fd = slot_open(i);
        for (int tries = 0; fd >= 0 && tries < 120 * 20 && !slot_take(fd); tries++)
            nap_ms(50);
        if (fd >= 0)
            close(fd);
    }
}

/* Make a runtime, load the op (libtcc; its optimizing compile is queued),
 * destroy the runtime (the job goes to a helper). */
static void cycle(void)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.cache_dir = cache;
    cfg.tiering = 1;
    cfg.cc = slowcc;
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    opjit_op *op;
    CHECK(opjit_load_file(rt, src, &op, NULL) == OPJIT_OK);
    opjit_destroy(rt);
}

/* Until no helper of ours is alive (at most limit_s): the most seen. */
static int watch_helpers(int limit_s, int most)
{
    for (int i = 0; i < limit_s * 20; i++) {
        int h, z;
        count_children(&h, &z);
        most = h > most ? h : most;
        if (!h)
            break;
        nap_ms(50);
    }
    return most;
}

/* Whether some process holds one of the cache's compile slots (a helper
 * compiling): the lock cannot be taken. */
static int slot_held(void)
{
    int held = 0;
    for (int i = 0; i < 2; i++) {
        int fd = slot_open(i);
        if (fd >= 0 && !slot_take(fd))
            held = 1;
        if (fd >= 0)
            close(fd);
    }
    return held;
}

/* A descriptor the host leaves open (its stdout, read by a shell's $(...))
 * is held by no helper: soon after opjit_destroy has returned (the
 * short-lived child between them may still be closing it), while the
 * helper still compiles, closing the host's copy is the reader's end of
 * file. */
static void host_descriptors_released(void)
{
    wait_slots_free();
    write_op(4);
    int p[2];
    CHECK(pipe(p) == 0); /* inheritable, as a host's stdio is */
    int high = fcntl(p[1], F_DUPFD, 40); /* above any a helper sets up for itself */
    CHECK(high >= 40);
    close(p[1]);
    p[1] = high;
    cycle();
    close(p[1]);
    struct pollfd pfd = {p[0], POLLIN, 0};
    CHECK(poll(&pfd, 1, 1000) == 1); /* the helper's slow compiler takes 2 s */
    CHECK(fcntl(p[0], F_SETFL, O_NONBLOCK) == 0);
    char c;
    ssize_t got = read(p[0], &c, 1);
    CHECKF(got == 0, "the host's pipe is not at its end (read: %zd, %s): a helper holds it",
           got, got < 0 ? strerror(errno) : "data");
    CHECKF(slot_held(), "no helper is compiling (the slow compiler takes 2 s)");
    close(p[0]);
}

/* The short-lived parent of each helper is reaped: 20 cycles, no zombie
 * (the last may take the worker, which runs on after opjit_destroy, a
 * moment). */
static void no_zombies_after_cycles(void)
{
    write_op(1);
    for (int i = 0; i < 20; i++)
        cycle();
    int h, z;
    for (int i = 0; i < 40; i++) {
        count_children(&h, &z);
        if (!z)
            break;
        nap_ms(50);
    }
    CHECKF(z == 0, "%d zombie children after 20 runtimes", z);
}

/* As a subreaper every helper becomes our child when its parent exits:
 * opjit reaps it. And at most OPJIT_CC_JOBS of them run at once. */
static void subreaper_bound_and_no_zombies(void)
{
    CHECK(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
    wait_slots_free();
    write_op(2);
    int most = 0;
    for (int i = 0; i < 30; i++) {
        cycle();
        int h, z;
        count_children(&h, &z);
        most = h > most ? h : most;
    }
    most = watch_helpers(120, most);
    fprintf(stderr, "  at most %d helpers alive at once\n", most);
    CHECKF(most >= 1 && most <= 2, "%d helpers alive at once (OPJIT_CC_JOBS=2)", most);
    int h = 0, z = 0;
    for (int i = 0; i < 40; i++) { /* the reaper is a thread: give it a moment */
        count_children(&h, &z);
        if (!z)
            break;
        nap_ms(50);
    }
    CHECKF(h == 0 && z == 0, "%d helpers alive, %d zombie children, as a subreaper", h, z);
}

/* Several processes on one cache: helpers queue for the same slots. The
 * helpers become our children (we are the subreaper above them); we reap
 * them here, as a container's init would. */
static void bound_holds_across_processes(void)
{
    wait_slots_free();
    write_op(3);
    pid_t kids[3];
    for (int k = 0; k < 3; k++) {
        kids[k] = fork();
        if (kids[k] == 0) {
            t_failed_checks = 0; /* the parent's count, inherited */
            for (int i = 0; i < 10; i++)
                cycle();
            _exit(t_failed_checks ? 1 : 0);
        }
        CHECK(kids[k] > 0);
    }
    int most = 0, left = 3, st;
    for (int i = 0; i < 120 * 20; i++) {
        int h, z;
        count_children(&h, &z);
        most = h > most ? h : most;
        pid_t r;
        while ((r = waitpid(-1, &st, WNOHANG)) > 0)
            for (int k = 0; k < 3; k++)
                if (r == kids[k]) {
                    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
                    left--;
                }
        if (!left && !h)
            break;
        nap_ms(20);
    }
    CHECK(left == 0);
    fprintf(stderr, "  at most %d helpers alive at once from 3 processes\n", most);
    CHECKF(most >= 1 && most <= 2, "%d helpers alive at once from 3 processes "
           "(OPJIT_CC_JOBS=2)", most);
    while (waitpid(-1, &st, WNOHANG) > 0)
        ;
}

/* A fork handler, as other libraries register them, that hangs when it
 * runs in a child of ours (the short-lived process between host and
 * helper forks the helper) while hang_in_children is set. */
static pid_t host_pid;
static volatile sig_atomic_t hang_in_children;

static void hang_prepare(void)
{
    while (hang_in_children && getpid() != host_pid)
        pause();
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Our children (any thread's), alive or not; each sent sig unless 0. */
static int children(int sig)
{
    int n = 0;
    DIR *d = opendir("/proc/self/task");
    struct dirent *de;
    char path[300];
    while (d && (de = readdir(d))) {
        snprintf(path, sizeof path, "/proc/self/task/%s/children", de->d_name);
        FILE *f = fopen(path, "r");
        int pid;
        while (f && fscanf(f, "%d", &pid) == 1) {
            n++;
            if (sig)
                kill(pid, sig);
        }
        if (f)
            fclose(f);
    }
    if (d)
        closedir(d);
    return n;
}

/* The helper's parent hangs in a fork handler: opjit_destroy returns at
 * once (the child handed to the worker, which kills it in time), and a
 * host that waits for the optimizing compile gets an error in time, not a
 * hang (alarm: a hang fails the test). No child is left either way. */
static void hanging_fork_handler(void)
{
    wait_slots_free();
    hang_in_children = 1;
    alarm(120);
    const char *real = getenv("OPJIT_CC");
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.cache_dir = cache;
    cfg.tiering = 1;
    cfg.cc = real && *real ? real : "cc";
    opjit_runtime *rt = NULL;
    opjit_op *op;

    write_op(5);
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    CHECK(opjit_load_file(rt, src, &op, NULL) == OPJIT_OK);
    nap_ms(500); /* the worker has forked the helper's parent, which hangs */
    double t0 = now_s();
    opjit_destroy(rt);
    double took = now_s() - t0;
    CHECKF(took < 2.0, "opjit_destroy took %.1f s while the helper's parent hung", took);

    write_op(6);
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    CHECK(opjit_load_file(rt, src, &op, NULL) == OPJIT_OK);
    t0 = now_s();
    int rc = opjit_wait(rt);
    took = now_s() - t0;
    CHECKF(rc == OPJIT_EIO && strstr(opjit_errmsg(rt), "did not fork it within"),
           "opjit_wait: %s (%s)", opjit_errstr(rc), opjit_errmsg(rt));
    CHECKF(took < 30.0, "opjit_wait took %.1f s", took);
    opjit_destroy(rt);

    /* A host that exits right after opjit_destroy: only the hung child's
     * own alarm ends it. We are a subreaper: it becomes our child. */
    CHECK(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
    write_op(7);
    pid_t kid = fork();
    if (kid == 0) {
        host_pid = getpid(); /* its own forks go on; its children's hang */
        if (opjit_create(&cfg, &rt) || opjit_load_file(rt, src, &op, NULL))
            _exit(1);
        nap_ms(500);
        opjit_destroy(rt);
        _exit(0);
    }
    int st = 0;
    CHECK(kid > 0 && waitpid(kid, &st, 0) == kid && WIFEXITED(st) && WEXITSTATUS(st) == 0);
    int n = children(0);
    for (int i = 0; n && i < 15 * 20; i++) { /* the first stop's, killed by its worker */
        nap_ms(50);
        while (waitpid(-1, NULL, WNOHANG) > 0)
            ;
        n = children(0);
    }
    CHECKF(n == 0, "%d children left (a hung child outlived its host)", n);
    if (n && children(SIGKILL)) /* not to leave them behind */
        while (waitpid(-1, NULL, 0) > 0)
            ;
    alarm(0);
    hang_in_children = 0;
}

int main(void)
{
    const char *base = getenv("OPJIT_CACHE_DIR"), *real = getenv("OPJIT_CC");
    if (!real || !*real)
        real = "cc";
    snprintf(dir, sizeof dir, "%s", base && *base ? base : "/tmp/opjit-test-tier-helpers");
    mkdir(dir, 0700);
    snprintf(cache, sizeof cache, "%s/cache", dir);
    snprintf(src, sizeof src, "%s/twice.c", dir);
    snprintf(slowcc, sizeof slowcc, "%s/slowcc", dir);
    if (write_slow_cc(real, 2) != 0) {
        fprintf(stderr, "cannot write %s\n", slowcc);
        return 1;
    }
    setenv("OPJIT_CC_JOBS", "2", 1);
    T_RUN(host_descriptors_released);
    T_RUN(no_zombies_after_cycles); /* before we become a subreaper */
    T_RUN(subreaper_bound_and_no_zombies);
    T_RUN(bound_holds_across_processes);
    host_pid = getpid();
    pthread_atfork(hang_prepare, NULL, NULL);
    T_RUN(hanging_fork_handler); /* last: the handler stays registered */
    return t_done();
}
