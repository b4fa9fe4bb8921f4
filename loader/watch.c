/* loader/watch.c - running hosts see new and edited sources (cfg.watch).
 *
 * One thread per runtime reads inotify events of the directories of the
 * search path, of the loaded sources and of their local headers. Events
 * gather until WATCH_QUIET_MS pass without one (an editor saves in several
 * steps: a temporary file renamed over the source, or a truncate and a few
 * writes), then the burst is handled at once:
 *
 *  - a loaded source whose file or local header was touched is loaded
 *    again (opjit_load_file: a no-op when its key did not change); the
 *    reload swaps its kernels in, a failure leaves the old ones serving;
 *  - a loaded source whose file is gone is unloaded;
 *  - a source of a search-path directory that is not loaded is indexed
 *    (loader/index.c), so a load by name finds its ops at once.
 *
 * Each outcome is logged and handed to cfg.watch_fn, with no lock held.
 * opjit_destroy stops the thread through a pipe and joins it. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loader/loader_int.h"
#include "runtime/env.h"

#define WATCH_QUIET_MS 25     /* a burst ends after this long without an event */
#define WATCH_MAX_BURST_MS 500 /* ... or this long after it began */
#define WATCH_IDLE_MS 250     /* how often loads made by the host are looked at */
#define WATCH_MASK                                                                        \
    (IN_CLOSE_WRITE | IN_MODIFY | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |  \
     IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF)

typedef struct strs {
    char **v;
    int n;
} strs;

/* A loaded source as the watcher knows it. */
typedef struct known {
    char *real;
    strs headers; /* real paths of its local headers */
    int failed;   /* its last reload failed: the next good one is news */
} known;

typedef struct wdir {
    int wd;
    char *real;
} wdir;

struct watcher {
    loader *l;
    opjit_watch_fn fn;
    void *ud;
    pthread_t thread;
    int ifd, stop[2];
    wdir *dirs;
    int ndirs;
    known *loaded;
    int nloaded;
    strs pending;      /* paths touched in the current burst */
    double first, last; /* times of its first and last events */
};

/* ---- small sets ------------------------------------------------------------- */

static int strs_has(const strs *s, const char *x)
{
    for (int i = 0; i < s->n; i++)
        if (!strcmp(s->v[i], x))
            return 1;
    return 0;
}

static void strs_add(strs *s, const char *x)
{
    if (strs_has(s, x))
        return;
    char **v = realloc(s->v, (size_t)(s->n + 1) * sizeof *v);
    if (!v)
        return;
    s->v = v;
    if ((v[s->n] = strdup(x)))
        s->n++;
}

static void strs_free(strs *s)
{
    for (int i = 0; i < s->n; i++)
        free(s->v[i]);
    free(s->v);
    s->v = NULL;
    s->n = 0;
}

/* ---- watched directories ------------------------------------------------------ */

static void watch_dir(struct watcher *w, const char *dir)
{
    char real[PATH_MAX];
    if (!realpath(dir, real))
        return;
    for (int i = 0; i < w->ndirs; i++)
        if (!strcmp(w->dirs[i].real, real))
            return;
    int wd = inotify_add_watch(w->ifd, real, WATCH_MASK | IN_ONLYDIR);
    wdir *v = wd < 0 ? NULL : realloc(w->dirs, (size_t)(w->ndirs + 1) * sizeof *v);
    if (!v) {
        if (wd >= 0)
            inotify_rm_watch(w->ifd, wd);
        rt_log(w->l->rt, OPJIT_LOG_DEBUG, "watch: cannot watch %s: %s", real,
               wd < 0 ? strerror(errno) : "out of memory");
        return;
    }
    w->dirs = v;
    v[w->ndirs].wd = wd;
    if ((v[w->ndirs].real = strdup(real)))
        w->ndirs++;
}

static void watch_dir_of(struct watcher *w, const char *file)
{
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", file);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = '\0';
        watch_dir(w, dir);
    }
}

static const char *dir_of_wd(const struct watcher *w, int wd)
{
    for (int i = 0; i < w->ndirs; i++)
        if (w->dirs[i].wd == wd)
            return w->dirs[i].real;
    return NULL;
}

static void watch_search_path(struct watcher *w)
{
    for (const char *p = w->l->ops_path; *p;) {
        size_t n = strcspn(p, ":");
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%.*s", (int)n, p);
        if (n)
            watch_dir(w, dir);
        p += n + (p[n] == ':');
    }
}

/* ---- loaded sources ------------------------------------------------------------- */

static void took_header(void *ud, const char *real)
{
    strs_add(ud, real);
}

static known *find_known(struct watcher *w, const char *real)
{
    for (int i = 0; i < w->nloaded; i++)
        if (!strcmp(w->loaded[i].real, real))
            return &w->loaded[i];
    return NULL;
}

/* Learn (again) the headers of the loaded source at real, watching their
 * directories. Loader lock held. */
static void know_source(struct watcher *w, const char *real)
{
    known *k = find_known(w, real);
    if (!k) {
        known *v = realloc(w->loaded, (size_t)(w->nloaded + 1) * sizeof *v);
        if (!v)
            return;
        w->loaded = v;
        k = &v[w->nloaded];
        memset(k, 0, sizeof *k);
        if (!(k->real = strdup(real)))
            return;
        w->nloaded++;
    }
    strs_free(&k->headers);
    watch_dir_of(w, real);
    source s;
    if (source_read(w->l, real, &s) == OPJIT_OK) {
        source_each_header(&s, took_header, &k->headers);
        source_free(&s);
    }
    for (int i = 0; i < k->headers.n; i++)
        watch_dir_of(w, k->headers.v[i]);
}

static void forget_source(struct watcher *w, const char *real)
{
    for (int i = 0; i < w->nloaded; i++)
        if (!strcmp(w->loaded[i].real, real)) {
            free(w->loaded[i].real);
            strs_free(&w->loaded[i].headers);
            w->loaded[i] = w->loaded[--w->nloaded];
            return;
        }
}

/* Sources the host loaded since the last look. */
static void look_at_loads(struct watcher *w)
{
    pthread_mutex_lock(&w->l->lock);
    for (loaded *e = w->l->loaded; e; e = e->next) {
        int seen = 0;
        for (int i = 0; i < w->nloaded && !seen; i++)
            seen = !strcmp(w->loaded[i].real, e->path);
        if (!seen)
            know_source(w, e->path);
    }
    pthread_mutex_unlock(&w->l->lock);
}

/* ---- handling a burst ---------------------------------------------------------- */

static void emit(struct watcher *w, int kind, const char *path, int status, const char *msg,
                 double ms)
{
    static const char *const what[] = {"reloaded", "failed to reload", "removed", "added"};
    rt_log(w->l->rt, kind == OPJIT_WATCH_FAILED ? OPJIT_LOG_ERROR : OPJIT_LOG_INFO,
           "watch: %s %s%s%s", what[kind], path, msg && *msg ? ": " : "", msg ? msg : "");
    if (!w->fn)
        return;
    opjit_watch_event ev = {kind, path, status, msg ? msg : "", ms};
    w->fn(w->ud, &ev);
}

/* Whether the burst touched the loaded source k or one of its headers. */
static int touched(const struct watcher *w, const known *k)
{
    if (strs_has(&w->pending, k->real))
        return 1;
    for (int i = 0; i < k->headers.n; i++)
        if (strs_has(&w->pending, k->headers.v[i]))
            return 1;
    return 0;
}

/* The path the host loaded real by (its module's source), into out. */
static void loaded_as(opjit_runtime *rt, const char *real, char *out, size_t n)
{
    snprintf(out, n, "%s", real);
    pthread_mutex_lock(&rt->lock);
    for (module *m = rt->modules; m; m = m->next)
        if (!strcmp(m->real, real)) {
            snprintf(out, n, "%s", m->source);
            break;
        }
    pthread_mutex_unlock(&rt->lock);
}

/* The state (source digest) real is loaded at now; 0 when it is not loaded. */
static int loaded_key(loader *l, const char *real, cache_key *key)
{
    pthread_mutex_lock(&l->lock);
    loaded *e = loader_find_loaded(l, real);
    if (e)
        *key = e->digest;
    pthread_mutex_unlock(&l->lock);
    return e != NULL;
}

static void unload_gone(struct watcher *w, const char *real)
{
    pthread_mutex_lock(&w->l->lock);
    module_unpublish(w->l->rt, real);
    loader_forget(w->l, real);
    forget_source(w, real);
    pthread_mutex_unlock(&w->l->lock);
    emit(w, OPJIT_WATCH_REMOVED, real, OPJIT_OK, "", 0);
}

/* Load the touched source again: reloaded, failed, or unchanged. */
static void reload(struct watcher *w, const char *real)
{
    opjit_runtime *rt = w->l->rt;
    char path[PATH_MAX];
    cache_key before, after;
    struct stat st;
    if (stat(real, &st) != 0 && errno == ENOENT) {
        unload_gone(w, real);
        return;
    }
    if (!loaded_key(w->l, real, &before))
        return; /* the host unloaded it */
    loaded_as(rt, real, path, sizeof path);
    int rc = opjit_load_file(rt, path, NULL, NULL);
    known *k = find_known(w, real);
    if (rc) {
        if (k)
            k->failed = 1;
        emit(w, OPJIT_WATCH_FAILED, path, rc, opjit_errmsg(rt), 0);
        return;
    }
    /* A fix back to the text loaded before is news too: the error is gone. */
    int news = k && k->failed;
    if (k)
        k->failed = 0;
    pthread_mutex_lock(&w->l->lock);
    know_source(w, real); /* its headers may have changed too */
    pthread_mutex_unlock(&w->l->lock);
    if (loaded_key(w->l, real, &after) &&
        (news || memcmp(before.bytes, after.bytes, sizeof after.bytes)))
        emit(w, OPJIT_WATCH_RELOADED, path, OPJIT_OK, "", loader_now_ms() - w->last);
}

/* A touched path that no loaded source uses: a new or edited source of a
 * search-path directory is indexed. */
static void maybe_added(struct watcher *w, const char *path)
{
    const char *file = strrchr(path, '/') + 1;
    struct stat st;
    if (!loader_source_stem(file) || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return;
    int on_path = 0;
    for (const char *p = w->l->ops_path; *p && !on_path;) {
        size_t n = strcspn(p, ":");
        char dir[PATH_MAX], real[PATH_MAX];
        snprintf(dir, sizeof dir, "%.*s", (int)n, p);
        on_path = n && realpath(dir, real) && strlen(real) == (size_t)(file - 1 - path) &&
                  !strncmp(real, path, (size_t)(file - 1 - path));
        p += n + (p[n] == ':');
    }
    if (!on_path)
        return;
    pthread_mutex_lock(&w->l->lock);
    int loaded_now = loader_find_loaded(w->l, path) != NULL;
    if (!loaded_now)
        index_source(w->l, path);
    pthread_mutex_unlock(&w->l->lock);
    if (!loaded_now)
        emit(w, OPJIT_WATCH_ADDED, path, OPJIT_OK, "", 0);
}

static void handle_burst(struct watcher *w)
{
    look_at_loads(w);
    strs reals = {0};
    for (int i = 0; i < w->nloaded; i++)
        if (touched(w, &w->loaded[i]))
            strs_add(&reals, w->loaded[i].real);
    for (int i = 0; i < reals.n; i++)
        reload(w, reals.v[i]);
    for (int i = 0; i < w->pending.n; i++) {
        int used = 0;
        for (int k = 0; k < w->nloaded && !used; k++)
            used = !strcmp(w->loaded[k].real, w->pending.v[i]);
        if (!used && !strs_has(&reals, w->pending.v[i]))
            maybe_added(w, w->pending.v[i]);
    }
    strs_free(&reals);
    strs_free(&w->pending);
}

/* ---- the thread ------------------------------------------------------------------ */

/* Read the events waiting; the paths they name join the burst. */
static void read_events(struct watcher *w)
{
    char buf[8192] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t n = read(w->ifd, buf, sizeof buf);
    for (char *p = buf; n > 0 && p < buf + n;) {
        const struct inotify_event *ev = (const struct inotify_event *)p;
        p += sizeof *ev + ev->len;
        const char *dir = dir_of_wd(w, ev->wd);
        char path[PATH_MAX];
        if (!w->pending.n)
            w->first = loader_now_ms();
        w->last = loader_now_ms();
        if (ev->mask & IN_Q_OVERFLOW) { /* events were lost: look at every loaded source */
            for (int i = 0; i < w->nloaded; i++)
                strs_add(&w->pending, w->loaded[i].real);
            continue;
        }
        if (ev->mask & IN_IGNORED) {
            for (int i = 0; i < w->ndirs; i++)
                if (w->dirs[i].wd == ev->wd) {
                    free(w->dirs[i].real);
                    w->dirs[i] = w->dirs[--w->ndirs];
                    break;
                }
            continue;
        }
        if (!dir || !ev->len ||
            (size_t)snprintf(path, sizeof path, "%s/%s", dir, ev->name) >= sizeof path)
            continue;
        strs_add(&w->pending, path);
    }
}

static void *watch_main(void *arg)
{
    struct watcher *w = arg;
    for (;;) {
        double now = loader_now_ms();
        int timeout = WATCH_IDLE_MS;
        if (w->pending.n) {
            double due = w->last + WATCH_QUIET_MS;
            if (due > w->first + WATCH_MAX_BURST_MS)
                due = w->first + WATCH_MAX_BURST_MS;
            timeout = due > now ? (int)(due - now) + 1 : 0;
        }
        struct pollfd p[2] = {{w->stop[0], POLLIN, 0}, {w->ifd, POLLIN, 0}};
        int r = poll(p, 2, timeout);
        if (r < 0 && errno != EINTR)
            break;
        if (r > 0 && p[0].revents)
            break;
        if (r > 0 && p[1].revents)
            read_events(w);
        now = loader_now_ms();
        if (w->pending.n && (now >= w->last + WATCH_QUIET_MS ||
                             now >= w->first + WATCH_MAX_BURST_MS))
            handle_burst(w);
        else if (!w->pending.n)
            look_at_loads(w);
    }
    return NULL;
}

static void watcher_free(struct watcher *w)
{
    for (int i = 0; i < w->ndirs; i++)
        free(w->dirs[i].real);
    free(w->dirs);
    for (int i = 0; i < w->nloaded; i++) {
        free(w->loaded[i].real);
        strs_free(&w->loaded[i].headers);
    }
    free(w->loaded);
    strs_free(&w->pending);
    if (w->ifd >= 0)
        close(w->ifd);
    if (w->stop[0] >= 0)
        close(w->stop[0]), close(w->stop[1]);
    free(w);
}

int watch_start(loader *l, const opjit_config *cfg)
{
    int want = cfg->watch;
    if (want < 0) {
        const char *e = getenv("OPJIT_WATCH");
        if ((want = env_bool_parse(e, 0)) < 0) {
            rt_log(l->rt, OPJIT_LOG_WARN, "OPJIT_WATCH='%s' is not a boolean; not watching", e);
            want = 0;
        }
    }
    if (!want)
        return OPJIT_OK;
    struct watcher *w = calloc(1, sizeof *w);
    if (!w)
        return OPJIT_ENOMEM;
    *w = (struct watcher){.l = l, .fn = cfg->watch_fn, .ud = cfg->watch_ud, .ifd = -1,
                          .stop = {-1, -1}};
    if ((w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0 ||
        pipe2(w->stop, O_CLOEXEC) != 0) {
        /* Asked for by the config: an error; by $OPJIT_WATCH: a warning. */
        rt_log(l->rt, cfg->watch == 1 ? OPJIT_LOG_ERROR : OPJIT_LOG_WARN,
               "watch: cannot watch the sources: %s", strerror(errno));
        watcher_free(w);
        return cfg->watch == 1 ? OPJIT_EIO : OPJIT_OK;
    }
    watch_search_path(w);
    if (pthread_create(&w->thread, NULL, watch_main, w) != 0) {
        watcher_free(w);
        return OPJIT_ENOMEM;
    }
    l->watch = w;
    return OPJIT_OK;
}

void watch_stop(loader *l)
{
    struct watcher *w = l ? l->watch : NULL;
    if (!w)
        return;
    ssize_t r = write(w->stop[1], "x", 1);
    (void)r;
    pthread_join(w->thread, NULL);
    watcher_free(w);
    l->watch = NULL;
}
