/* loader/discover.c - which ops the sources on the search path define,
 * without trusting them (opjit_discover).
 *
 * Knowing what a source registers means running its OPJIT_MODULE init, and
 * an unknown init may crash, call exit() or never return. So each source
 * is loaded in a child process, by a runtime of its own over the same
 * caches, which writes what it registered into a pipe; the parent waits
 * for it with a time limit, up to one child per CPU at once. Only the
 * host's own loads run op code in the host process.
 *
 * What a child reported is kept in the cache as the source's record
 * (loader/record.c: the per-source note the op index reads too, keyed by
 * the source's digest (its bytes, local headers, opjit's ABI) and path),
 * so a listing runs each version of a source once: a source with a record
 * is reported from it, with no process and no op code run; only sources
 * never seen, or edited since, go to children. A failure is kept like a
 * success (a compile error, an init that crashed or exited), but a time
 * limit run out of is kept with that limit: a longer limit looks again.
 * The index looks for records itself (loader_discover_many runs children
 * for what it sends), and keeps what comes.
 *
 * The pipe carries text lines, fields separated by tabs, with '\\', tab and
 * newline escaped:
 *   op <schema> <doc>          one per registered op
 *   error <status> <message>   the load failed
 *   end                        the child finished
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jit/jit.h"
#include "loader/index_int.h"
#include "loader/loader_int.h"
#include "runtime/env.h"

#define DISCOVER_MAX_OUTPUT (16u << 20)
#define DISCOVER_MAX_JOBS 64

/* ---- the child ------------------------------------------------------------ */

typedef struct child_walk {
    FILE *out;
    opjit_runtime *rt;
    const char *real;
    int device;
} child_walk;

static int child_put_op(void *ud, const opjit_op *op)
{
    child_walk *w = ud;
    opjit_op_info info = {.size = sizeof info};
    char real[PATH_MAX];
    if (opjit_op_info_get(w->rt, op, &info) || !info.source[w->device] ||
        !realpath(info.source[w->device], real) || strcmp(real, w->real))
        return 0;
    fputs("op\t", w->out);
    note_put_escaped(w->out, info.schema);
    fputc('\t', w->out);
    note_put_escaped(w->out, info.doc[w->device]);
    fputc('\n', w->out);
    return 0;
}

/* In the child: load path with a runtime of its own, report, and leave
 * without running the host's exit handlers. */
static void child_main(loader *parent, const char *path, int device, int fd)
{
    int null = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) { /* what the init prints is not the host's output */
        dup2(null, 0), dup2(null, 1), dup2(null, 2);
    }
    FILE *out = fdopen(fd, "w");
    if (!out)
        _exit(120);
    settings set;
    if (loader_child_settings(parent, &set))
        _exit(120);
    /* No eviction here (no cap): each child walking the whole cache made
     * indexing many sources quadratic; the host's next build keeps the cap. */
    set.cache_max_size = UINT64_MAX;
    opjit_runtime *rt = NULL;
    int rc = loader_runtime_new(&set, &rt);
    settings_free(&set);
    if (rc == OPJIT_OK) {
        tier_never_build(rt->loader);
        rc = opjit_load_file(rt, path, NULL, NULL);
    }
    if (rc == OPJIT_OK) {
        child_walk w = {out, rt, "", device};
        char real[PATH_MAX];
        w.real = realpath(path, real) ? real : path;
        opjit_list(rt, child_put_op, &w);
    } else {
        fprintf(out, "error\t%d\t", rc);
        note_put_escaped(out, rt ? opjit_errmsg(rt) : opjit_errstr(rc));
        fputc('\n', out);
    }
    fputs("end\n", out);
    int bad = fflush(out) != 0;
    loader_runtime_free(rt); /* removes its private scratch directory */
    _exit(bad ? 121 : 0);
}

/* ---- the parent: several children at once ------------------------------------ */

/* One source looked at: its child while it runs, what came from it. */
typedef struct found {
    opjit_source_ops pub;
    char *buf;         /* the child's output, unescaped in place */
    size_t len, cap;
    const char **schemas, **docs;
    char msg[PATH_MAX + 1024];
    pid_t pid;         /* the child, while it runs; 0 */
    int fd;            /* its pipe, until EOF; -1 */
    double deadline;
    int timed_out, cancelled, state;
    idx_src rec;       /* the source's record, when it was reported from it */
    record_key key;    /* where the record is, or goes */
    int keyed;         /* key was made: what the child finds is kept under it */
} found;

enum { FOUND_IDLE, FOUND_READING, FOUND_REAPING, FOUND_DONE };

static long discover_timeout_ms(opjit_runtime *rt) { return rt->set.discover_timeout_ms; }

/* How many children run at once: one per CPU this process may use. */
static int discover_jobs(void)
{
    cpu_set_t set;
    int n = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 0;
    if (n <= 0)
        n = (int)sysconf(_SC_NPROCESSORS_ONLN);
    return n < 1 ? 1 : n > DISCOVER_MAX_JOBS ? DISCOVER_MAX_JOBS : n;
}

/* Read what the child wrote so far; 1 at EOF (or a flood: what came is
 * enough to judge), 0 while more may come. */
static int found_read(found *f)
{
    for (;;) {
        if (f->len + 4096 + 1 > f->cap) {
            if (f->cap >= DISCOVER_MAX_OUTPUT)
                return 1;
            size_t cap = f->cap ? f->cap * 2 : 8192;
            char *nb = realloc(f->buf, cap);
            if (!nb)
                return 1;
            f->buf = nb;
            f->cap = cap;
            f->buf[f->len] = '\0'; /* a string even when no read adds to it */
        }
        ssize_t n = read(f->fd, f->buf + f->len, f->cap - f->len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return 0;
        if (n <= 0)
            return 1;
        f->len += (size_t)n;
        f->buf[f->len] = '\0';
    }
}

static void unescape(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r == '\\' && r[1]) {
            r++;
            *w++ = *r == 't' ? '\t' : *r == 'n' ? '\n' : *r;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

/* Parse the child's lines into f. 1 when the "end" line came. */
static int parse_output(found *f)
{
    int n = 0, cap = 0, ended = 0;
    char *next;
    for (char *line = f->buf; line && *line; line = next) {
        next = strchr(line, '\n');
        if (!next)
            break; /* a cut line: the child died writing it */
        *next++ = '\0';
        char *t1 = strchr(line, '\t'), *t2 = t1 ? strchr(t1 + 1, '\t') : NULL;
        if (!strcmp(line, "end")) {
            ended = 1;
        } else if (t2 && !strncmp(line, "op\t", 3)) {
            if (n == cap) {
                cap = cap ? 2 * cap : 8;
                const char **s = realloc(f->schemas, (size_t)cap * sizeof *s);
                if (s)
                    f->schemas = s;
                const char **d = s ? realloc(f->docs, (size_t)cap * sizeof *d) : NULL;
                if (!d)
                    return ended;
                f->docs = d;
            }
            *t2 = '\0';
            unescape(t1 + 1);
            unescape(t2 + 1);
            f->schemas[n] = t1 + 1;
            f->docs[n++] = t2 + 1;
        } else if (t2 && !strncmp(line, "error\t", 6)) {
            unescape(t2 + 1);
            f->pub.status = atoi(t1 + 1);
            snprintf(f->msg, sizeof f->msg, "%s", t2 + 1);
        }
    }
    f->pub.nops = n;
    f->pub.schemas = f->schemas;
    f->pub.docs = f->docs;
    return ended;
}

/* Why a child that did not finish stopped, into f. */
static void child_failed(found *f, int st, long timeout_ms)
{
    f->pub.status = OPJIT_EMODULE;
    if (f->cancelled) {
        f->pub.status = OPJIT_EIO; /* not a lasting answer: nothing is noted */
        snprintf(f->msg, sizeof f->msg, "%s: killed: the runtime is being destroyed",
                 f->pub.path);
    } else if (f->timed_out)
        snprintf(f->msg, sizeof f->msg, "%s: loading it did not finish within %.1f s (an init "
                 "that never returns?); killed (OPJIT_DISCOVER_TIMEOUT)", f->pub.path,
                 (double)timeout_ms / 1000.0);
    else if (WIFSIGNALED(st))
        snprintf(f->msg, sizeof f->msg, "%s: loading it crashed (signal %d, %s)", f->pub.path,
                 WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        snprintf(f->msg, sizeof f->msg, "%s: loading it exited with status %d (its init "
                 "called exit?)", f->pub.path, WIFEXITED(st) ? WEXITSTATUS(st) : -1);
}

/* What is known of path before any child: not a regular file, or a .cu
 * CUDA cannot run here. 1 when that settles it. */
static int found_precheck(found *f, const char *path)
{
    memset(f, 0, sizeof *f);
    f->fd = -1;
    f->pub.path = path;
    f->pub.device = loader_is_cuda_source(path) ? OPJIT_CUDA : OPJIT_CPU;
    struct stat st;
    char why[512];
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
        f->pub.status = OPJIT_EINVAL;
        snprintf(f->msg, sizeof f->msg, "%s: not a regular file; skipped", path);
    } else if (f->pub.device == OPJIT_CUDA && cu_usable(why, sizeof why)) {
        f->pub.status = OPJIT_EDEVICE;
        snprintf(f->msg, sizeof f->msg, "%s: skipped: %s", path, why);
    } else {
        return 0;
    }
    return 1;
}

static _Thread_local int outside_lock;

void discover_outside_lock(void)
{
    outside_lock = 1;
}

/* Start the child that loads f's source. 0, or an errno (f says why). */
static int found_start(loader *l, found *f, long timeout_ms)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        int e = errno;
        f->pub.status = OPJIT_EIO;
        snprintf(f->msg, sizeof f->msg, "%s: cannot make a pipe: %s", f->pub.path, strerror(e));
        return e;
    }
    if (outside_lock)
        pthread_mutex_lock(&l->lock);
    jit_fork_prepare();
    pid_t pid = fork();
    int e = errno;
    jit_fork_done();
    if (outside_lock && pid != 0)
        pthread_mutex_unlock(&l->lock);
    if (pid == 0) {
        close(p[0]);
        child_main(l, f->pub.path, f->pub.device, p[1]);
    }
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        f->pub.status = OPJIT_EIO;
        snprintf(f->msg, sizeof f->msg, "%s: cannot fork: %s", f->pub.path, strerror(e));
        return e;
    }
    fcntl(p[0], F_SETFL, O_NONBLOCK);
    f->pid = pid;
    f->fd = p[0];
    f->deadline = loader_now_ms() + (double)timeout_ms;
    f->state = FOUND_READING;
    return 0;
}

/* Reap f's child (killed first when it ran out of time): 1 when it is
 * gone, 0 while it still runs within its time. Then f holds the result. */
static int found_reap(found *f, long timeout_ms)
{
    if (f->fd >= 0) {
        close(f->fd);
        f->fd = -1;
    }
    int st = 0;
    pid_t r;
    while ((r = waitpid(f->pid, &st, WNOHANG)) < 0 && errno == EINTR)
        ;
    if (r == 0 && loader_now_ms() < f->deadline) {
        f->state = FOUND_REAPING; /* EOF, yet still running: give it its time */
        return 0;
    }
    if (r == 0) {
        f->timed_out = 1;
        kill(f->pid, SIGKILL);
        while (waitpid(f->pid, &st, 0) < 0 && errno == EINTR)
            ;
    }
    f->pid = 0;
    f->state = FOUND_DONE;
    int ended = f->buf && parse_output(f);
    if (!ended || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        if (!ended || f->pub.status == OPJIT_OK)
            child_failed(f, st, timeout_ms);
    } else if (f->pub.status == OPJIT_OK) {
        const jit_compiler *dev = jit_first(JIT_CU_DEVICE);
        f->pub.tier = f->pub.device == OPJIT_CUDA && dev ? dev->name : NULL;
    }
    f->pub.error = f->pub.status == OPJIT_OK ? "" : f->msg;
    return 1;
}

static void found_free(found *f)
{
    if (f->pid > 0) { /* stopped early: the child goes */
        kill(f->pid, SIGKILL);
        while (waitpid(f->pid, NULL, 0) < 0 && errno == EINTR)
            ;
    }
    if (f->fd >= 0)
        close(f->fd);
    free(f->buf);
    free(f->schemas);
    free(f->docs);
    src_free(&f->rec);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

/* Report f's source from its record, when it has one, or why it cannot
 * be read (a child could not either): 1. Else 0, and f->key the record's
 * key for what the child will find. */
static int found_recorded(loader *l, found *f)
{
    source s;
    int rc = source_read(l, f->pub.path, &s);
    if (rc != OPJIT_OK) {
        f->pub.status = rc;
        snprintf(f->msg, sizeof f->msg, "%s", opjit_errmsg(l->rt));
        f->pub.error = f->msg;
        f->state = FOUND_DONE;
        return 1;
    }
    int got = index_record_get(l, &s, &f->key, &f->rec);
    f->keyed = got >= 0;
    if (got == 1) {
        const idx_src *r = &f->rec;
        const jit_compiler *dev = jit_first(JIT_CU_DEVICE);
        f->pub.status = r->status;
        snprintf(f->msg, sizeof f->msg, "%s", r->detail ? r->detail : r->msg);
        f->pub.error = r->status == OPJIT_OK ? "" : f->msg;
        f->pub.nops = r->nops;
        f->pub.schemas = (const char *const *)r->schemas;
        f->pub.docs = (const char *const *)r->docs;
        /* What a load would get now: looked up in the cache, not noted. */
        if (r->status == OPJIT_OK)
            f->pub.tier = f->pub.device == OPJIT_CUDA ? dev ? dev->name : NULL
                                                      : tier_would_serve(l, &s);
        f->state = FOUND_DONE;
    }
    source_free(&s);
    return got == 1;
}

/* A batch of sources, each looked at in a child; up to jobs at once. */
typedef struct discover_run {
    loader *l;
    long timeout_ms;
    int records; /* a source with a record is reported from it */
    int jobs, running, cancelled;
    const char *const *paths;
    int n, started, delivered;
    int w;       /* the window: sources started and not yet delivered */
    found *slot; /* slot[i % w] */
    int (*done)(void *ud, int i, found *f);
    void *ud;
} discover_run;

/* Start sources while there is room; a source settled without a child is
 * done at once. */
static void run_start(discover_run *r)
{
    while (r->started < r->n && r->started - r->delivered < r->w && r->running < r->jobs) {
        found *f = &r->slot[r->started % r->w];
        if (!found_precheck(f, r->paths[r->started]) && r->cancelled) {
            f->pub.status = OPJIT_EIO; /* not a lasting answer: nothing is noted */
            snprintf(f->msg, sizeof f->msg, "%s: not looked at: the runtime is being destroyed",
                     f->pub.path);
        } else if (f->pub.status == OPJIT_OK && !(r->records && found_recorded(r->l, f))) {
            int e = found_start(r->l, f, r->timeout_ms);
            if (e == EAGAIN && r->running > 0) { /* too many processes: fewer at once */
                r->jobs = r->running;
                return;
            }
            r->running += !e;
        }
        if (f->state == FOUND_IDLE) {
            f->pub.error = f->pub.status == OPJIT_OK ? "" : f->msg;
            f->state = FOUND_DONE;
        }
        r->started++;
    }
}

/* Wait for output, an exit or a deadline of the running children. */
static void run_wait(discover_run *r)
{
    int w = r->w, np = 0;
    struct pollfd p[2 * DISCOVER_MAX_JOBS + 1];
    found *of[2 * DISCOVER_MAX_JOBS];
    double now = loader_now_ms(), next = now + 1e6;
    for (int i = r->delivered; i < r->started; i++) {
        found *f = &r->slot[i % w];
        if (f->state == FOUND_READING) {
            p[np] = (struct pollfd){f->fd, POLLIN, 0};
            of[np++] = f;
        }
        if (f->state == FOUND_REAPING) /* no fd to wake us: look again soon */
            next = next < now + 10 ? next : now + 10;
        if (f->state != FOUND_DONE && f->deadline < next)
            next = f->deadline;
    }
    int ms = next <= now ? 0 : (int)(next - now) + 1, cancel = r->l->discover_cancel_fd;
    if (cancel >= 0)
        p[np] = (struct pollfd){cancel, POLLIN, 0};
    if (poll(p, (nfds_t)(np + (cancel >= 0)), ms) < 0 && errno != EINTR)
        poll(NULL, 0, 10); /* out of memory in the kernel, say: do not spin */
    if (cancel >= 0 && p[np].revents) { /* opjit_destroy: every child goes now */
        r->cancelled = 1;
        for (int i = r->delivered; i < r->started; i++)
            if (r->slot[i % w].state == FOUND_READING || r->slot[i % w].state == FOUND_REAPING) {
                r->slot[i % w].deadline = 0;
                r->slot[i % w].cancelled = 1;
            }
        np = 0;
    }
    for (int k = 0; k < np; k++)
        if ((p[k].revents & (POLLIN | POLLHUP | POLLERR)) && found_read(of[k]))
            r->running -= found_reap(of[k], r->timeout_ms);
    now = loader_now_ms();
    for (int i = r->delivered; i < r->started; i++) {
        found *f = &r->slot[i % w];
        if ((f->state == FOUND_REAPING || (f->state == FOUND_READING && f->deadline <= now)))
            r->running -= found_reap(f, r->timeout_ms);
    }
}

/* Look at n sources, up to one child per CPU at once; done(ud, i, f) is
 * called for each in order (non-zero: stop, the children still running
 * are killed). Returns how many were delivered. */
static int discover_batch(loader *l, const char *const *paths, int n, int records,
                          int (*done)(void *ud, int i, found *f), void *ud)
{
    int jobs = discover_jobs(), stop = 0;
    discover_run r = {l, discover_timeout_ms(l->rt), records, jobs, 0, 0, paths, n, 0, 0,
                      2 * jobs, NULL, done, ud};
    if (!(r.slot = calloc((size_t)r.w, sizeof *r.slot)))
        return -1;
    for (int i = 0; i < r.w; i++)
        r.slot[i].fd = -1;
    while (r.delivered < n && !stop) {
        run_start(&r);
        found *f;
        while (!stop && r.delivered < r.started &&
               (f = &r.slot[r.delivered % r.w])->state == FOUND_DONE) {
            stop = done(ud, r.delivered, f);
            found_free(f);
            r.delivered++;
        }
        if (!stop && r.running > 0)
            run_wait(&r);
    }
    for (int i = r.delivered; i < r.started; i++)
        found_free(&r.slot[i % r.w]);
    free(r.slot);
    return r.delivered;
}

/* ---- one source, or many, for the index ------------------------------------------- */

typedef struct to_fn {
    int (*fn)(void *ud, const opjit_source_ops *src);
    void (*each)(void *ud, int i, const opjit_source_ops *src, long timed_out_ms);
    void *ud;
    long timeout_ms;
    int first_error;
} to_fn;

static int deliver_one(void *ud, int i, found *f)
{
    to_fn *t = ud;
    (void)i;
    if (f->pub.status != OPJIT_OK && f->pub.status != OPJIT_EDEVICE && !t->first_error)
        t->first_error = f->pub.status;
    if (t->each) {
        t->each(t->ud, i, &f->pub, f->timed_out ? t->timeout_ms : 0);
        return 0;
    }
    return t->fn(t->ud, &f->pub);
}

int loader_discover_one(loader *l, const char *path,
                        int (*fn)(void *ud, const opjit_source_ops *src), void *ud)
{
    to_fn t = {fn, NULL, ud, 0, 0};
    const char *paths[1] = {path};
    if (discover_batch(l, paths, 1, 0, deliver_one, &t) != 1)
        return rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
    return t.first_error;
}

int loader_discover_many(loader *l, const char *const *paths, int n,
                         void (*fn)(void *ud, int i, const opjit_source_ops *src,
                                    long timed_out_ms),
                         void *ud)
{
    /* The index looked for the records itself, and keeps what comes. */
    to_fn t = {NULL, fn, ud, discover_timeout_ms(l->rt), 0};
    if (n > 0 && discover_batch(l, paths, n, 0, deliver_one, &t) != n)
        return rt_error(l->rt, OPJIT_ENOMEM, "out of memory");
    return OPJIT_OK;
}

/* ---- the search path --------------------------------------------------------- */

/* Which directory each op name was first found in: a later directory's
 * source of the same name is shadowed (a load by name takes the first). */
typedef struct discover_walk {
    loader *l;
    int (*fn)(void *ud, const opjit_source_ops *src);
    void *ud;
    int first_error, oom;
    char **seen; /* "dir/stem" of each name taken, one per name */
    size_t nseen, cap;
    char **paths; /* the sources to look at, in search order */
    int npaths, cappaths;
} discover_walk;

static int strs_push(char ***v, int *n, int *cap, char *s)
{
    if (!s)
        return -1;
    if (*n == *cap) {
        int c = *cap ? *cap * 2 : 32;
        char **nv = realloc(*v, (size_t)c * sizeof *nv);
        if (!nv) {
            free(s);
            return -1;
        }
        *v = nv;
        *cap = c;
    }
    (*v)[(*n)++] = s;
    return 0;
}

/* 1 when path's name was taken by an earlier directory; else records it. */
static int discover_shadowed(discover_walk *w, const char *path)
{
    const char *file = strrchr(path, '/') + 1;
    size_t dirlen = (size_t)(file - path), stem = loader_source_stem(file);
    for (size_t i = 0; i < w->nseen; i++) {
        const char *name = strrchr(w->seen[i], '/') + 1;
        size_t seen_dirlen = (size_t)(name - w->seen[i]);
        if (strlen(name) == stem && !strncmp(name, file, stem)) /* the same op name */
            return seen_dirlen != dirlen || strncmp(w->seen[i], path, dirlen) != 0;
    }
    if (w->nseen == w->cap) {
        size_t cap = w->cap ? w->cap * 2 : 32;
        char **v = realloc(w->seen, cap * sizeof *v);
        if (!v)
            return w->oom = 1;
        w->seen = v;
        w->cap = cap;
    }
    if (!(w->seen[w->nseen] = strndup(path, dirlen + stem)))
        return w->oom = 1;
    w->nseen++;
    return 0;
}

static int discover_source(void *ud, const char *path)
{
    discover_walk *w = ud;
    if (discover_shadowed(w, path))
        return w->oom;
    if (strs_push(&w->paths, &w->npaths, &w->cappaths, strdup(path)))
        return w->oom = 1;
    return 0;
}

/* One source listed, in search order: what its child found kept as its
 * record, which tier would serve it, then fn. */
static int discover_deliver(void *ud, int i, found *f)
{
    discover_walk *w = ud;
    (void)i;
    source src;
    if (f->keyed && !f->rec.file) /* looked at by a child */
        index_record_put(w->l, f->pub.path, &f->key, &f->pub,
                         f->timed_out ? discover_timeout_ms(w->l->rt) : 0);
    if (f->pub.status == OPJIT_OK && !f->pub.tier) { /* a .c: optimized code cached? */
        f->pub.tier = jit_first(JIT_C) ? jit_first(JIT_C)->name : "none";
        if (source_read(w->l, f->pub.path, &src) == OPJIT_OK) {
            f->pub.tier = tier_would_serve(w->l, &src);
            source_free(&src);
        }
    }
    if (f->pub.status != OPJIT_OK && f->pub.status != OPJIT_EDEVICE && !w->first_error)
        w->first_error = f->pub.status;
    return w->fn(w->ud, &f->pub);
}

int opjit_discover(opjit_runtime *rt, int (*fn)(void *ud, const opjit_source_ops *src), void *ud)
{
    if (!rt || !fn)
        return rt_error(rt, OPJIT_EINVAL, "opjit_discover: NULL argument");
    discover_walk w = {.l = rt->loader, .fn = fn, .ud = ud};
    int rc = opjit_sources(rt, NULL, discover_source, &w);
    if (!rc && !w.oom &&
        discover_batch(w.l, (const char *const *)w.paths, w.npaths, 1, discover_deliver, &w) < 0)
        w.oom = 1;
    for (size_t i = 0; i < w.nseen; i++)
        free(w.seen[i]);
    free(w.seen);
    for (int i = 0; i < w.npaths; i++)
        free(w.paths[i]);
    free(w.paths);
    if (rc)
        return rc;
    if (w.oom)
        return rt_error(rt, OPJIT_ENOMEM, "opjit_discover: out of memory");
    if (w.first_error)
        return rt_error(rt, w.first_error, "some sources on the search path could not be listed");
    return OPJIT_OK;
}
