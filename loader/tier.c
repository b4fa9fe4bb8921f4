/* loader/tier.c - background compilers: optimized code without waiting.
 *
 * libtcc makes an op callable within milliseconds but its code runs about
 * as fast as gcc -O0. A background compiler of the table (jit/jit.h; today
 * the system's cc at -O2) builds each source loaded through libtcc again,
 * into the cache, and its kernels are swapped in atomically when ready
 * (calls in flight finish on the libtcc code, unmapped once they have).
 *
 * The compiles run in a helper process detached from the host (its own
 * session, every inherited descriptor closed, its own cache handle and
 * scratch directory): a short-lived process that loads an op and exits
 * never waits for the optimizer, and the next process finds the optimized
 * code in the cache. A worker thread hands the queued jobs to a helper,
 * reads each job's outcome from a pipe and swaps the new code in;
 * opjit_destroy hands over what is still queued and returns once the
 * helper's parent is forked (the worker, detached, reaps it after). The
 * compiler's time limit (OPJIT_CC_TIMEOUT) bounds every helper, and the
 * cache's slots (cache_slot_take, OPJIT_CC_JOBS of them) how many run at
 * once on the machine: a host's worker waits for a free one, a host being
 * destroyed leaves the jobs to a later load when none is free.
 *
 * No helper is left a zombie: the short-lived process between the host
 * and its helper is reaped as soon as it exits, and where the helper
 * becomes the host's own child when that process exits (a subreaper, PID
 * 1 in a container) a thread of the library reaps it once it is done.
 *
 * Keys and index entries are the pipeline's (loader/pipeline.c): a load
 * finds optimized code through an index entry keyed by the compiler's
 * file, never by running it.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <dlfcn.h>
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include "loader/loader_int.h"
#include "runtime/env.h"

#define TIER_DEFAULT_TIMEOUT_MS 120000
#define TIER_SLOT_POLL_MS 100 /* how often a worker looks for a free slot */
#define TIER_MAX_JOBS 4096
/* How long the short-lived child between host and helper may take to say
 * its helper's pid. It forks and exits within milliseconds, unless a fork
 * handler of another library hangs in it: the child of a threaded host can
 * inherit a lock another thread held at the fork (a sanitizer's
 * allocator, say). Then it is killed (by the host's worker, else by its
 * own alarm): the host never waits on it for good, nor is it left hanging. */
#define HELPER_FORK_MS 10000

typedef struct tier_job {
    char *path; /* as given: diagnostics and module source name */
    source src; /* text owned by the job */
    const jit_compiler *jc;
    struct tier_job *next;
} tier_job;

struct tier_state {
    int enabled; /* tiering is on (settings) and background code may be built here */
    pthread_mutex_t lock;
    pthread_cond_t cond;
    tier_job *jobs, *jobs_tail; /* queued, not yet handed to a helper */
    int busy;                   /* a batch is out with a helper */
    int slots;                  /* OPJIT_CC_JOBS: helpers at once per cache */
    atomic_int stop;
    int wake[2]; /* a pipe: tier_destroy writes to it to wake the worker's poll */
    int started;
    int released; /* the worker touches neither this nor the loader again */
    int first_error;
    char first_msg[1024]; /* its message, for opjit_wait */
    pthread_t worker;
};

/* What a helper sends back for each job of its batch. */
typedef struct helper_result {
    int32_t index, status;
    uint32_t len; /* then len bytes of message */
} helper_result;

#define HELPER_MSG_MAX 3000

static void jobs_free(tier_job *j)
{
    while (j) {
        tier_job *next = j->next;
        free(j->path);
        source_free(&j->src);
        free(j);
        j = next;
    }
}

/* ---- the helper process ------------------------------------------------------ */

static void helper_send(int fd, int index, int status, const char *msg)
{
    size_t len = strlen(msg);
    helper_result r = {index, status, (uint32_t)(len < HELPER_MSG_MAX ? len : HELPER_MSG_MAX)};
    char buf[sizeof r + HELPER_MSG_MAX];
    memcpy(buf, &r, sizeof r);
    memcpy(buf + sizeof r, msg, r.len);
    /* One write of at most PIPE_BUF-ish bytes; a reader that went away is
     * no reason to stop compiling (SIGPIPE is ignored). */
    ssize_t w = write(fd, buf, sizeof r + r.len);
    (void)w;
}

/* Build each job of the batch into the cache, reporting to fd. Uses only
 * what it opens itself: the host's cache handle, log callback and scratch
 * directory stay the host's. */
static void helper_run(const loader *l, tier_job *batch, int fd)
{
    cache_config cc;
    pipeline_cache_config(&l->rt->set, &cc); /* no log: nobody reads one here */
    cache *c = NULL;
    pipeline p;
    char diag[4096];
    int rc = cache_open(&cc, &c, diag, sizeof diag);
    if (!rc && (rc = pipeline_init(&p, c, &l->pipe.set)))
        snprintf(diag, sizeof diag, "out of memory");
    int i = 0, last_rc = rc;
    for (tier_job *j = batch; j; j = j->next, i++) {
        pipeline_artifact art = {0};
        last_rc = rc ? rc : pipeline_get_host(&p, &j->src, j->jc, JIT_C, 1, &art, diag,
                                              sizeof diag);
        cache_entry_release(art.entry);
        if (last_rc == OPJIT_ECOMPILE) /* rejected: not tried again this hour */
            pipeline_failure_put(&p, &j->src, j->jc, diag);
        if (j->next)
            helper_send(fd, i, last_rc, last_rc ? diag : "");
    }
    /* The last outcome after the cleanup: a host that heard every job
     * finds no scratch directory of ours left in its TMPDIR. */
    if (!rc)
        pipeline_fini(&p);
    cache_close(c);
    if (i)
        helper_send(fd, i - 1, last_rc, last_rc ? diag : "");
}

/* In the child of the host, before it forks the helper: results on fd 1,
 * the compile slot on fd 3, the pid pipe on fd 4, /dev/null for 0 and 2,
 * nothing else of the host's open (its sockets, its locks, its stdio).
 * Done before the second fork, not in the helper: whoever reads the
 * host's stdout to its end (a shell's $(...), a test harness) then waits
 * for this short-lived child alone, never for the helper to get a CPU. */
static void helper_fds(int res, int slot, int pidfd)
{
    /* Out of the way of 0-4 first: the host may have closed its stdio. */
    res = fcntl(res, F_DUPFD, 10);
    slot = fcntl(slot, F_DUPFD, 10);
    pidfd = fcntl(pidfd, F_DUPFD, 10);
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0 && null < 10) { /* else it could be a number taken below */
        int high = fcntl(null, F_DUPFD_CLOEXEC, 10);
        close(null);
        null = high;
    }
    dup2(res, 1);
    dup2(slot, 3);
    dup2(pidfd, 4);
    fcntl(3, F_SETFD, FD_CLOEXEC); /* the compilers it runs do not hold the slot */
    fcntl(4, F_SETFD, FD_CLOEXEC);
    if (null >= 0) {
        dup2(null, 0);
        dup2(null, 2);
    }
    close_range(5, ~0U, 0);
}

/* In the helper: signals at their defaults, unblocked; SIGPIPE ignored;
 * the pid pipe closed (only its parent writes to it). */
static void helper_detach(void)
{
    close(4);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    for (int s = 1; s < 32; s++)
        if (s != SIGKILL && s != SIGSTOP)
            signal(s, SIG_DFL);
    signal(SIGPIPE, SIG_IGN);
    prctl(PR_SET_NAME, "opjit-optimize"); /* what ps and top show */
    /* Background work: the host and whatever it starts next come first. */
    if (setpriority(PRIO_PROCESS, 0, 10) != 0)
        errno = 0;
}

/* ---- reaping helpers that became the host's children ------------------------
 *
 * When the process between the host and a helper exits, the helper goes
 * to the nearest subreaper above it: init, or the host itself when it is
 * one (PR_SET_CHILD_SUBREAPER, or PID 1 of a container). Then nobody but
 * us knows to reap it: one thread per process waits for those helpers by
 * pid, in turn (each ends within its alarm), and exits when none is left.
 * It outlives opjit_destroy, so the library stays mapped from then on. */

static struct {
    pthread_mutex_t lock;
    pid_t *pids;
    int n, cap, running;
} reaper = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 0};

static int host_is_subreaper(void)
{
    int on = 0;
    return getpid() == 1 || (prctl(PR_GET_CHILD_SUBREAPER, &on) == 0 && on);
}

static void *reaper_main(void *arg)
{
    (void)arg;
    pthread_mutex_lock(&reaper.lock);
    while (reaper.n) {
        pid_t pid = reaper.pids[0];
        pthread_mutex_unlock(&reaper.lock);
        int st;
        /* ECHILD: the host reaped it itself. */
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
            ;
        pthread_mutex_lock(&reaper.lock);
        memmove(reaper.pids, reaper.pids + 1, (size_t)--reaper.n * sizeof *reaper.pids);
    }
    reaper.running = 0;
    pthread_mutex_unlock(&reaper.lock);
    return NULL;
}

/* Keep this library loaded for the thread's sake (a host may dlclose it). */
static void reaper_pin_library(void)
{
    Dl_info di;
    if (dladdr((void *)reaper_main, &di) && di.dli_fname && *di.dli_fname)
        (void)dlopen(di.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE);
}

/* Have the reaper wait for helper, now our child; started when needed,
 * with every signal blocked (the host's handlers run on its own threads). */
static void reaper_add(pid_t helper)
{
    pthread_mutex_lock(&reaper.lock);
    if (reaper.n == reaper.cap) {
        int cap = reaper.cap ? reaper.cap * 2 : 8;
        pid_t *p = realloc(reaper.pids, (size_t)cap * sizeof *p);
        if (!p) {
            pthread_mutex_unlock(&reaper.lock);
            return;
        }
        reaper.pids = p;
        reaper.cap = cap;
    }
    reaper.pids[reaper.n++] = helper;
    if (!reaper.running) {
        pthread_t th;
        pthread_attr_t at;
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pthread_attr_init(&at);
        pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&th, &at, reaper_main, NULL) == 0) {
            reaper.running = 1;
            reaper_pin_library();
        } else {
            reaper.n--; /* left to the host: nothing better to do */
        }
        pthread_attr_destroy(&at);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
    }
    pthread_mutex_unlock(&reaper.lock);
}

/* ---- starting a helper ---------------------------------------------------------- */

/* In the child of helper_spawn: fork the helper, tell the host its pid
 * on pidfd, exit. */
static void helper_fork(loader *l, tier_job *batch, int res, int slot, int pidfd,
                        unsigned life_s)
{
    /* Bounded whatever another library's fork handler does in the fork
     * below, also when the host is gone by then: SIGALRM at its default
     * ends this process (the helper does not inherit the alarm). */
    sigset_t alrm;
    sigemptyset(&alrm);
    sigaddset(&alrm, SIGALRM);
    signal(SIGALRM, SIG_DFL);
    sigprocmask(SIG_UNBLOCK, &alrm, NULL);
    alarm(HELPER_FORK_MS / 1000);
    helper_fds(res, slot, pidfd);
    setsid();
    pid_t g = fork();
    if (g == 0) {
        helper_detach();
        alarm(life_s); /* SIGALRM is at its default: it ends the helper */
        helper_run(l, batch, 1);
        _exit(0);
    }
    if (g > 0 && write(4, &g, sizeof g) != (ssize_t)sizeof g)
        g = -1;
    _exit(g < 0 ? 1 : 0);
}

/* Until the short-lived child of helper_spawn has said its helper's pid
 * (or ended) on pidfd: 1. 0 at once when wake (-1: none) is readable (the
 * tier is stopping); -1 when HELPER_FORK_MS passed first. */
static int helper_said(int pidfd, int wake)
{
    double deadline = loader_now_ms() + HELPER_FORK_MS;
    for (;;) {
        double left = deadline - loader_now_ms();
        if (left <= 0)
            return -1;
        struct pollfd pfd[2] = {{pidfd, POLLIN, 0}, {wake, POLLIN, 0}};
        int r = poll(pfd, wake >= 0 ? 2 : 1, (int)left + 1);
        if (r > 0 && pfd[0].revents)
            return 1;
        if (r > 0 && pfd[1].revents)
            return 0;
        if (r < 0 && errno != EINTR)
            poll(NULL, 0, 10); /* out of memory in the kernel, say: do not spin */
    }
}

/* Reap the short-lived child of helper_spawn (it exits within
 * milliseconds, once it has forked the helper: never a zombie for long),
 * said being what helper_said gave: killed first when it has not said its
 * helper's pid in HELPER_FORK_MS (said < 0). ECHILD: the host reaped it (a
 * SIGCHLD handler). Then its helper is the reaper's when it became ours.
 * Closes pidfd. 0, or -1 when it was killed (by us or by its alarm) for
 * not forking the helper in time. */
static int helper_reap(pid_t child, int pidfd, int said)
{
    int st = 0, killed = said < 0;
    if (killed)
        kill(child, SIGKILL);
    while (waitpid(child, &st, 0) < 0 && errno == EINTR)
        ;
    killed |= WIFSIGNALED(st) && WTERMSIG(st) == SIGALRM; /* its own alarm, first */
    pid_t helper = -1;
    if (read(pidfd, &helper, sizeof helper) == (ssize_t)sizeof helper && helper > 0 &&
        host_is_subreaper())
        reaper_add(helper);
    close(pidfd);
    return killed ? -1 : 0;
}

/* Fork a helper for batch, detached (a grandchild in a session of its
 * own), holding the compile slot slot (the host's copy is closed here).
 * The read end of its pipe, or -1. The child between host and helper is
 * left to the caller: helper_said, then helper_reap.
 *
 * The child of a threaded process may only use what no other thread held
 * at the fork: the helper opens its own cache and scratch directory and
 * takes none of the host's locks (glibc's malloc is fork-safe). Loads
 * allocate under the loader's lock, so the fork takes it too: with
 * sanitizer allocators, which are not fork-safe, that keeps our own
 * threads out of them at that instant. An alarm bounds the helper's life
 * whatever happens: the time limit of each compile, and a margin. */
static int helper_spawn(loader *l, tier_job *batch, int slot, pid_t *child, int *pidfd,
                        char *err, size_t n)
{
    int p[2], q[2], njobs = 0;
    for (tier_job *j = batch; j; j = j->next)
        njobs++;
    unsigned life_s = (unsigned)((l->pipe.set.cc_timeout_ms / 1000 + 5) * (njobs + 1) + 30);
    if (pipe2(p, O_CLOEXEC)) {
        snprintf(err, n, "cannot start the background compiler: pipe: %s", strerror(errno));
        close(slot);
        return -1;
    }
    if (pipe2(q, O_CLOEXEC | O_NONBLOCK)) {
        snprintf(err, n, "cannot start the background compiler: pipe: %s", strerror(errno));
        close(p[0]);
        close(p[1]);
        close(slot);
        return -1;
    }
    pthread_mutex_lock(&l->lock);
    pid_t pid = fork();
    if (pid == 0)
        helper_fork(l, batch, p[1], slot, q[1], life_s);
    pthread_mutex_unlock(&l->lock);
    int e = errno;
    close(p[1]);
    close(q[1]);
    close(slot); /* the helper holds it now */
    if (pid < 0) {
        snprintf(err, n, "cannot start the background compiler: fork: %s", strerror(e));
        close(p[0]);
        close(q[0]);
        return -1;
    }
    /* A helper that could not be forked closes the pipe unheard: an error
     * then, when its results are read. */
    *child = pid;
    *pidfd = q[0];
    return p[0];
}

/* A free compile slot: 0 and *fd, EAGAIN when stopping and none is free,
 * or another errno. Waits for one otherwise (tier_destroy wakes it). */
static int take_slot(loader *l, int *fd)
{
    tier_state *t = l->tier;
    for (;;) {
        int e = cache_slot_take(l->cache, t->slots, fd) ? errno : 0;
        if (e != EAGAIN || atomic_load(&t->stop))
            return e;
        struct pollfd pfd = {t->wake[0], POLLIN, 0};
        poll(&pfd, 1, TIER_SLOT_POLL_MS);
    }
}

/* ---- the worker thread -------------------------------------------------------- */

/* Read n bytes, or give up at once when tier_destroy wakes us. 0, or -1
 * at the end of the pipe or on stop. */
static int read_full(tier_state *t, int fd, void *buf, size_t n)
{
    char *p = buf;
    while (n) {
        if (atomic_load(&t->stop))
            return -1;
        struct pollfd pfd[2] = {{fd, POLLIN, 0}, {t->wake[0], POLLIN, 0}};
        int r = poll(pfd, 2, -1);
        if (r < 0 && errno != EINTR)
            return -1;
        if (r <= 0 || !(pfd[0].revents & (POLLIN | POLLHUP | POLLERR)))
            continue;
        ssize_t got = read(fd, p, n);
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return -1;
        p += got;
        n -= (size_t)got;
    }
    return 0;
}

static void note_error(loader *l, int rc, const char *msg)
{
    tier_state *t = l->tier;
    rt_log(l->rt, OPJIT_LOG_WARN, "%s; the code already loaded keeps serving it", msg);
    pthread_mutex_lock(&t->lock);
    if (!t->first_error) {
        t->first_error = rc;
        snprintf(t->first_msg, sizeof t->first_msg, "%s", msg);
    }
    pthread_mutex_unlock(&t->lock);
}

/* The job's code, now in the cache, replaces the code serving (libtcc's,
 * or the same compiler's for a lower CPU level), unless the source changed
 * since the job was queued. */
static void swap_in(loader *l, tier_job *job)
{
    pthread_mutex_lock(&l->lock);
    loaded *cur = loader_find_loaded(l, job->src.real);
    int other = cur && strcmp(cur->tier, job->jc->name);
    if (cur && !memcmp(cur->digest.bytes, job->src.digest.bytes, sizeof cur->digest.bytes) &&
        (other || cur->below_best)) {
        char diag[1024];
        pipeline_artifact art = {0};
        int rc = pipeline_get_host(&l->pipe, &job->src, job->jc, JIT_C, 0, &art, diag,
                                   sizeof diag);
        module *m = NULL;
        if (rc)
            rc = rt_error(l->rt, rc, "%s: %s", job->path, diag);
        else if (!other && !art.best)
            ; /* no better than what serves: keep it */
        else if (!(rc = load_module(l, &job->src, art.path, job->jc->name, &m)) &&
                 (rc = module_publish(l->rt, m)))
            module_discard(m);
        cache_entry_release(art.entry);
        if (rc) {
            char msg[OPJIT_ERRMSG_SIZE];
            snprintf(msg, sizeof msg, "%s", opjit_errmsg(l->rt));
            pthread_mutex_unlock(&l->lock);
            note_error(l, rc, msg);
            return;
        }
        if (m) {
            snprintf(cur->tier, sizeof cur->tier, "%s", job->jc->name);
            cur->below_best = !art.best;
            rt_log(l->rt, OPJIT_LOG_INFO, "%s: %s code for %s now serves calls", job->path,
                   job->jc->what, art.target);
        }
    }
    pthread_mutex_unlock(&l->lock);
}

/* The children between the host and the helpers handed the jobs at a
 * stop: the worker reaps them after tier_destroy has returned. */
typedef struct handover {
    struct handed {
        pid_t child;
        int pidfd;
    } *v;
    int n;
} handover;

static int handover_add(handover *h, pid_t child, int pidfd)
{
    struct handed *v = realloc(h->v, (size_t)(h->n + 1) * sizeof *v); /* one or two a stop */
    if (!v)
        return -1;
    h->v = v;
    h->v[h->n++] = (struct handed){child, pidfd};
    return 0;
}

/* Hand batch to a helper; unless stopping, take in its results. When
 * stopping, the child between host and helper goes to h, unreaped: the
 * host's opjit_destroy does not wait for it to fork the helper. */
static void run_batch(loader *l, tier_job *batch, handover *h)
{
    tier_state *t = l->tier;
    char err[512];
    int n = 0, slot = -1;
    for (tier_job *j = batch; j; j = j->next)
        n++;
    int e = take_slot(l, &slot);
    if (e == EAGAIN) { /* stopping: the next load of these sources queues them again */
        rt_log(l->rt, OPJIT_LOG_INFO, "tiering: all %d compile slots (OPJIT_CC_JOBS) are "
               "busy; %d optimizing compile(s) left to a later load", t->slots, n);
        return;
    }
    if (e) {
        snprintf(err, sizeof err, "cannot start the background compiler: no compile slot "
                 "in %s/v1/locks: %s", cache_dir(l->cache), strerror(e));
        note_error(l, OPJIT_EIO, err);
        return;
    }
    pid_t child;
    int pidfd;
    int fd = helper_spawn(l, batch, slot, &child, &pidfd, err, sizeof err);
    if (fd < 0) {
        note_error(l, OPJIT_EIO, err);
        return;
    }
    int said = helper_said(pidfd, t->wake[0]);
    if (!said && handover_add(h, child, pidfd) == 0) {
        close(fd); /* stopping: nothing is read */
        return;
    }
    if (helper_reap(child, pidfd, said ? said : helper_said(pidfd, -1))) {
        snprintf(err, sizeof err, "cannot start the background compiler: its parent process "
                 "did not fork it within %d s (a fork handler of another library that hangs "
                 "in a child?); killed", HELPER_FORK_MS / 1000);
        note_error(l, OPJIT_EIO, err);
        close(fd);
        return;
    }
    for (int done = 0; done < n; done++) {
        helper_result r;
        char msg[HELPER_MSG_MAX + 1];
        if (read_full(t, fd, &r, sizeof r) || r.index < 0 || r.index >= n ||
            r.len > HELPER_MSG_MAX || read_full(t, fd, msg, r.len)) {
            if (!atomic_load(&t->stop)) { /* the helper died: its jobs stay unfinished */
                snprintf(msg, sizeof msg, "the optimizing compile's helper process ended "
                         "before reporting on %d of %d source(s)", n - done, n);
                note_error(l, OPJIT_EIO, msg);
            }
            break;
        }
        msg[r.len] = '\0';
        tier_job *job = batch;
        for (int i = 0; i < r.index; i++)
            job = job->next;
        if (r.status == OPJIT_OK) {
            swap_in(l, job);
        } else {
            char full[HELPER_MSG_MAX + 1200];
            snprintf(full, sizeof full, "%s: %s: %s", job->path, job->jc->what, msg);
            note_error(l, r.status, full);
        }
    }
    close(fd);
}

/* batch without the jobs whose compiler rejected their source this hour
 * (pipeline_failure_get), each reported as the compile that failed. */
static tier_job *drop_rejected(loader *l, tier_job *batch)
{
    tier_job *keep = NULL, **tail = &keep;
    while (batch) {
        tier_job *j = batch;
        char *msg = NULL;
        batch = j->next;
        j->next = NULL;
        if (pipeline_failure_get(&l->pipe, &j->src, j->jc, &msg) == OPJIT_OK) {
            char full[HELPER_MSG_MAX + 1200];
            snprintf(full, sizeof full, "%s: %s: %s (it failed the same way this hour: not run "
                     "again until the next)", j->path, j->jc->what, msg);
            note_error(l, OPJIT_ECOMPILE, full);
            free(msg);
            jobs_free(j);
        } else {
            *tail = j;
            tail = &j->next;
        }
    }
    return keep;
}

/* Until stopped: hand each batch queued to a helper. Then, having said so
 * (released), touch nothing of the loader's (tier_destroy frees it and
 * returns), and reap the children of the helpers handed the last jobs. */
static void *worker_main(void *arg)
{
    loader *l = arg;
    tier_state *t = l->tier;
    handover h = {0};
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (!t->jobs && !atomic_load(&t->stop))
            pthread_cond_wait(&t->cond, &t->lock);
        if (!t->jobs)
            break;
        tier_job *batch = t->jobs;
        t->jobs = t->jobs_tail = NULL;
        t->busy = 1;
        pthread_mutex_unlock(&t->lock);
        batch = drop_rejected(l, batch);
        if (batch)
            run_batch(l, batch, &h); /* on stop: hands it over, reads nothing */
        jobs_free(batch);
        pthread_mutex_lock(&t->lock);
        t->busy = 0;
        pthread_cond_broadcast(&t->cond);
    }
    if (h.n)
        reaper_pin_library(); /* this thread runs on after opjit_destroy */
    t->released = 1;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
    for (int i = 0; i < h.n; i++)
        helper_reap(h.v[i].child, h.v[i].pidfd, helper_said(h.v[i].pidfd, -1));
    free(h.v);
    return NULL;
}

/* ---- the loader's interface --------------------------------------------------- */

void tier_schedule(loader *l, const jit_compiler *jc, const source *s)
{
    tier_state *t = l->tier;
    /* A helper must publish into a cache the host can read back. */
    if (!t->enabled || cache_offline(l->cache) || !cache_writable(l->cache))
        return;
    tier_job *job = calloc(1, sizeof *job);
    if (!job)
        return;
    job->src = *s;
    job->jc = jc;
    job->path = strdup(s->path);
    job->src.text = malloc(s->len + 1);
    job->src.inputs = (readable){0};
    if (s->inputs.text && (job->src.inputs.text = strdup(s->inputs.text)))
        job->src.inputs.len = job->src.inputs.cap = s->inputs.len;
    if (!job->path || !job->src.text || (s->inputs.text && !job->src.inputs.text)) {
        jobs_free(job);
        return;
    }
    memcpy(job->src.text, s->text, s->len + 1);
    job->src.path = job->path;
    job->src.name = strrchr(job->path, '/') ? strrchr(job->path, '/') + 1 : job->path;
    pthread_mutex_lock(&t->lock);
    if (!t->started) {
        if ((t->wake[0] < 0 && pipe2(t->wake, O_CLOEXEC)) ||
            pthread_create(&t->worker, NULL, worker_main, l)) {
            pthread_mutex_unlock(&t->lock);
            jobs_free(job);
            return;
        }
        t->started = 1;
    }
    if (t->jobs_tail)
        t->jobs_tail->next = job;
    else
        t->jobs = job;
    t->jobs_tail = job;
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
}

void tier_never_build(loader *l) { l->tier->enabled = 0; }

const char *tier_would_serve(loader *l, const source *s)
{
    for (int i = 0; jit_compilers[i]; i++) {
        const jit_compiler *jc = jit_compilers[i];
        if (!(jc->halves & JIT_C) || (jc->background && !l->rt->set.tiering))
            continue;
        if (!jc->background)
            return jc->name; /* what a load compiles with */
        char diag[512];
        pipeline_artifact art;
        if (pipeline_get_host(&l->pipe, s, jc, JIT_C, 0, &art, diag, sizeof diag) == OPJIT_OK) {
            cache_entry_release(art.entry);
            return jc->name;
        }
    }
    return "none"; /* no compiler of the table builds C */
}

int tier_wait(loader *l, char *msg, size_t n)
{
    tier_state *t = l->tier;
    pthread_mutex_lock(&t->lock);
    while (t->jobs || t->busy)
        pthread_cond_wait(&t->cond, &t->lock);
    int rc = t->first_error;
    if (n)
        snprintf(msg, n, "%s", rc ? t->first_msg : "");
    t->first_error = 0;
    pthread_mutex_unlock(&t->lock);
    return rc;
}

int tier_create(loader *l)
{
    tier_state *t = calloc(1, sizeof *t);
    if (!t)
        return OPJIT_ENOMEM;
    t->wake[0] = t->wake[1] = -1; /* made with the worker */
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->cond, NULL);
    const settings *s = &l->rt->set;
    int want = s->tiering;
    jit_settings *set = &l->pipe.set;
    /* With tiering off nothing asks for the background compilers: no
     * search of PATH. */
    int found = 0;
    for (int i = 0; want && jit_compilers[i]; i++)
        if (jit_compilers[i]->background)
            found |= !jit_compilers[i]->prepare || jit_compilers[i]->prepare(set);
    set->cc_timeout_ms = s->cc_timeout_ms;
    set->cpu_level = s->cpu_level;
    long ncpu = want && !s->cc_jobs ? sysconf(_SC_NPROCESSORS_ONLN) : 1;
    t->slots = !want ? 1 : s->cc_jobs ? s->cc_jobs : ncpu < 1 ? 1 : ncpu > 4096 ? 4096 : (int)ncpu;
    t->enabled = want && found;
    if (want && !found && s->tiering_asked)
        rt_log(l->rt, OPJIT_LOG_WARN, "tiering: no C compiler '%s' found; libtcc code only",
               s->cc);
    l->tier = t;
    return OPJIT_OK;
}

void tier_destroy(loader *l)
{
    tier_state *t = l->tier;
    if (!t)
        return;
    pthread_mutex_lock(&t->lock);
    atomic_store(&t->stop, 1);
    pthread_cond_broadcast(&t->cond);
    pthread_mutex_unlock(&t->lock);
    if (t->started) {
        ssize_t w = write(t->wake[1], "", 1); /* a worker in poll returns now */
        (void)w;
        pthread_mutex_lock(&t->lock);
        while (!t->released)
            pthread_cond_wait(&t->cond, &t->lock);
        pthread_mutex_unlock(&t->lock);
        pthread_detach(t->worker); /* it may still reap a helper's parent */
    }
    if (t->wake[0] >= 0) {
        close(t->wake[0]);
        close(t->wake[1]);
    }
    jobs_free(t->jobs);
    pthread_mutex_destroy(&t->lock);
    pthread_cond_destroy(&t->cond);
    free(t);
    l->tier = NULL;
}
