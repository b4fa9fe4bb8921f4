/* loader/discover.c - which ops the sources on the search path define,
 * without trusting them (opjit_discover).
 *
 * Knowing what a source registers means running its OPJIT_MODULE init, and
 * an unknown init may crash, call exit() or never return. So each source
 * is loaded in a child process, by a runtime of its own over the same
 * caches, which writes what it registered into a pipe; the parent waits
 * for it with a time limit. Only the host's own loads run op code in the
 * host process.
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
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jit/jit.h"
#include "loader/loader_int.h"
#include "runtime/env.h"

#define DISCOVER_DEFAULT_TIMEOUT_MS 60000
#define DISCOVER_MAX_OUTPUT (16u << 20)

/* ---- the child ------------------------------------------------------------ */

static void put_escaped(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        if (*s == '\\' || *s == '\t' || *s == '\n')
            fputc('\\', f), fputc(*s == '\t' ? 't' : *s == '\n' ? 'n' : '\\', f);
        else
            fputc(*s, f);
    }
}

typedef struct child_walk {
    FILE *out;
    opjit_runtime *rt;
    const char *real;
    int device;
} child_walk;

static int child_put_op(void *ud, const opjit_op *op)
{
    child_walk *w = ud;
    opjit_op_info info;
    char real[PATH_MAX];
    if (opjit_op_info_get(w->rt, op, &info) || !info.source[w->device] ||
        !realpath(info.source[w->device], real) || strcmp(real, w->real))
        return 0;
    fputs("op\t", w->out);
    put_escaped(w->out, info.schema);
    fputc('\t', w->out);
    put_escaped(w->out, info.doc[w->device]);
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
    opjit_config cfg;
    loader_same_caches(parent, &cfg);
    opjit_runtime *rt = NULL;
    int rc = loader_runtime_new(&cfg, &rt);
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
        put_escaped(out, rt ? opjit_errmsg(rt) : opjit_errstr(rc));
        fputc('\n', out);
    }
    fputs("end\n", out);
    int bad = fflush(out) != 0;
    loader_runtime_free(rt); /* removes its private scratch directory */
    _exit(bad ? 121 : 0);
}

/* ---- the parent ------------------------------------------------------------ */

typedef struct found {
    opjit_source_ops pub;
    char *buf;         /* the child's output, unescaped in place */
    const char **schemas, **docs;
    char msg[PATH_MAX + 1024];
} found;

static long discover_timeout_ms(opjit_runtime *rt)
{
    const char *e = getenv("OPJIT_DISCOVER_TIMEOUT");
    long ms = env_seconds_parse(e, DISCOVER_DEFAULT_TIMEOUT_MS);
    if (ms > 0)
        return ms;
    rt_log(rt, OPJIT_LOG_WARN, "OPJIT_DISCOVER_TIMEOUT='%s' is not a positive number of "
           "seconds; using %d", e, DISCOVER_DEFAULT_TIMEOUT_MS / 1000);
    return DISCOVER_DEFAULT_TIMEOUT_MS;
}

/* Read everything from fd until EOF or the deadline; 1 when it timed out
 * (or cancel, when >= 0, became readable). */
static int read_until(int fd, char **buf, size_t *len, double deadline, int cancel)
{
    size_t cap = 0;
    for (;;) {
        double left = deadline - loader_now_ms();
        if (left <= 0)
            return 1;
        struct pollfd p[2] = {{fd, POLLIN, 0}, {cancel, POLLIN, 0}};
        int r = poll(p, cancel >= 0 ? 2 : 1, left > 1e6 ? 1000000 : (int)left + 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r > 0 && cancel >= 0 && p[1].revents)
            return 1;
        if (r <= 0)
            return r == 0;
        if (*len + 4096 + 1 > cap) {
            if (cap >= DISCOVER_MAX_OUTPUT)
                return 0; /* a flood: what came is enough to judge */
            char *nb = realloc(*buf, cap ? cap * 2 : 8192);
            if (!nb)
                return 0;
            *buf = nb;
            cap = cap ? cap * 2 : 8192;
        }
        ssize_t n = read(fd, *buf + *len, cap - *len - 1);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0;
        *len += (size_t)n;
        (*buf)[*len] = '\0';
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
static void child_failed(found *f, int timed_out, int st, long timeout_ms)
{
    f->pub.status = OPJIT_EMODULE;
    if (timed_out)
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

static _Thread_local int outside_lock;

void discover_outside_lock(void)
{
    outside_lock = 1;
}

/* Load path in a child and fill f with what it registered. */
static void discover_one(loader *l, found *f, long timeout_ms)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) {
        f->pub.status = OPJIT_EIO;
        snprintf(f->msg, sizeof f->msg, "%s: cannot make a pipe: %s", f->pub.path, strerror(errno));
        return;
    }
    if (outside_lock)
        pthread_mutex_lock(&l->lock);
    jit_tcc_fork_prepare();
    pid_t pid = fork();
    jit_tcc_fork_done();
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
        snprintf(f->msg, sizeof f->msg, "%s: cannot fork: %s", f->pub.path, strerror(errno));
        return;
    }
    size_t len = 0;
    int timed_out = read_until(p[0], &f->buf, &len, loader_now_ms() + (double)timeout_ms,
                               l->discover_cancel_fd);
    close(p[0]);
    if (timed_out)
        kill(pid, SIGKILL);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    int ended = f->buf && parse_output(f);
    if (!ended || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        if (!ended || f->pub.status == OPJIT_OK)
            child_failed(f, timed_out, st, timeout_ms);
    } else if (f->pub.status == OPJIT_OK) {
        f->pub.tier = f->pub.device == OPJIT_CUDA ? "nvrtc" : NULL;
    }
}

/* Report one source: checked, loaded in a child where it can run here. */
static int discover_report(loader *l, const char *path, long timeout_ms,
                           int (*fn)(void *ud, const opjit_source_ops *src), void *ud,
                           int *first_error)
{
    found f;
    memset(&f, 0, sizeof f);
    f.pub.path = path;
    f.pub.device = strlen(path) > 3 && !strcmp(path + strlen(path) - 3, ".cu") ? OPJIT_CUDA
                                                                              : OPJIT_CPU;
    struct stat st;
    char why[512];
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
        f.pub.status = OPJIT_EINVAL;
        snprintf(f.msg, sizeof f.msg, "%s: not a regular file; skipped", path);
    } else if (f.pub.device == OPJIT_CUDA && cu_usable(why, sizeof why)) {
        f.pub.status = OPJIT_EDEVICE;
        snprintf(f.msg, sizeof f.msg, "%s: skipped: %s", path, why);
    } else {
        discover_one(l, &f, timeout_ms);
    }
    source src;
    if (f.pub.status == OPJIT_OK && !f.pub.tier) { /* a .c: optimized code cached? */
        f.pub.tier = "tcc";
        if (source_read(l, path, &src) == OPJIT_OK) {
            f.pub.tier = tier_would_serve(l, &src);
            source_free(&src);
        }
    }
    f.pub.error = f.pub.status == OPJIT_OK ? "" : f.msg;
    if (f.pub.status != OPJIT_OK && f.pub.status != OPJIT_EDEVICE && !*first_error)
        *first_error = f.pub.status;
    int stop = fn(ud, &f.pub);
    free(f.buf);
    free(f.schemas);
    free(f.docs);
    return stop;
}

int loader_discover_one(loader *l, const char *path,
                        int (*fn)(void *ud, const opjit_source_ops *src), void *ud)
{
    int first_error = 0;
    discover_report(l, path, discover_timeout_ms(l->rt), fn, ud, &first_error);
    return first_error;
}

/* ---- the search path --------------------------------------------------------- */

/* Which directory each op name was first found in: a later directory's
 * source of the same name is shadowed (a load by name takes the first). */
typedef struct discover_walk {
    loader *l;
    long timeout_ms;
    int (*fn)(void *ud, const opjit_source_ops *src);
    void *ud;
    int first_error, oom;
    char **seen; /* "dir/stem" of each name taken, one per name */
    size_t nseen, cap;
} discover_walk;

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
    return discover_report(w->l, path, w->timeout_ms, w->fn, w->ud, &w->first_error);
}

int opjit_discover(opjit_runtime *rt, int (*fn)(void *ud, const opjit_source_ops *src), void *ud)
{
    if (!rt || !fn)
        return rt_error(rt, OPJIT_EINVAL, "opjit_discover: NULL argument");
    discover_walk w = {.l = rt->loader, .timeout_ms = discover_timeout_ms(rt), .fn = fn, .ud = ud};
    int rc = opjit_sources(rt, NULL, discover_source, &w);
    for (size_t i = 0; i < w.nseen; i++)
        free(w.seen[i]);
    free(w.seen);
    if (rc)
        return rc;
    if (w.oom)
        return rt_error(rt, OPJIT_ENOMEM, "opjit_discover: out of memory");
    if (w.first_error)
        return rt_error(rt, w.first_error, "some sources on the search path could not be listed");
    return OPJIT_OK;
}
