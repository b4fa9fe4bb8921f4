/* loader/watch.c - running hosts see new and edited sources (cfg.watch).
 *
 * One thread per runtime reads inotify events of the directories of the
 * search path, of the loaded sources (where the host's path for each lies,
 * and where the file it names lies) and of their local headers. Events
 * gather until WATCH_QUIET_MS pass without one (an editor saves in several
 * steps: a temporary file renamed over the source, or a truncate and a few
 * writes), then the burst is handled at once. A loaded source is followed
 * by the path the host loaded it by (a load by name: the search path's
 * spelling of its directory, loader/index.c):
 *
 *  - when its file or a local header was touched it is loaded again
 *    (opjit_load_file: a no-op when its key did not change); the reload
 *    swaps its kernels in, a failure leaves the old ones serving;
 *  - when the path names another file now (a symlink retargeted, a
 *    directory on the way replaced), that file is loaded in its place;
 *  - when the path names nothing it keeps serving for WATCH_GONE_MS (a
 *    save by delete and rewrite, a checkout), then it is unloaded; it is
 *    loaded again whenever a file appears under its path.
 *
 * A source of a search-path directory that is not loaded is indexed
 * (loader/index.c), so a load by name finds its ops at once. Indexing may
 * run a new source's init in a discovery child for as long as its time
 * limit: a second thread does it, holding no lock, so neither loads nor
 * reloads wait for it.
 *
 * The kernel drops a watch when its directory goes; a directory moved away
 * keeps its watch. So every WATCH_IDLE_MS, and at once after such an event,
 * each directory is looked up again by its path: one that is now another
 * directory (replaced, moved, a symlink on the way retargeted) is watched
 * anew and looked at as a whole; one that is gone is watched for.
 *
 * Each outcome is logged and handed to cfg.watch_fn, with no lock held, one
 * at a time. Code a reload replaced is unloaded once no call runs in it
 * (runtime/reclaim.c), at the latest at the next idle look. opjit_destroy
 * stops the threads through a pipe and joins them. */
#include <dirent.h>
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

#define WATCH_QUIET_MS 25      /* a burst ends after this long without an event */
#define WATCH_MAX_BURST_MS 500 /* ... or this long after it began */
#define WATCH_IDLE_MS 250      /* how often loads and directories are looked at */
#define WATCH_GONE_MS 1000     /* a deleted source serves this long before it leaves */
#define WATCH_MASK                                                                        \
    (IN_CLOSE_WRITE | IN_MODIFY | IN_CREATE | IN_DELETE | IN_MOVED_FROM | IN_MOVED_TO |  \
     IN_ATTRIB | IN_DELETE_SELF | IN_MOVE_SELF)

typedef struct strs {
    char **v;
    int n;
} strs;

/* A loaded source as the watcher knows it. */
typedef struct known {
    char *path;    /* as the host loaded it: what a reload loads */
    char *abs;     /* path made absolute, symlinks kept (in a search-path
                    * directory: through its path there): what it names now */
    char *name_r;  /* abs with its directory resolved: where events about it land */
    char *real;    /* the file loaded */
    char *tried;   /* the file its path names, when loading that failed; or NULL */
    strs headers;  /* real paths of its local headers */
    int failed;    /* its last reload failed: the next good one is news */
    int by_abs;    /* abs named another file once: loads load abs, not path */
    int gone;      /* unloaded here (its file went): loaded again when one is back */
    double missing; /* when its path was first seen naming nothing; 0: it names a file */
} known;

/* A directory watched, by the path it was found by. */
typedef struct wdir {
    char *name;  /* absolute, symlinks kept */
    char *real;  /* what name resolved to when it was watched; NULL: never */
    int wd;      /* -1: not watched now (gone, or not there yet) */
    dev_t dev;
    ino_t ino;
    int search;  /* a search-path directory: new sources in it are indexed */
    int said;    /* its loss was logged */
} wdir;

struct watcher {
    loader *l;
    opjit_watch_fn fn;
    void *ud;
    pthread_t thread, indexer;
    int ifd, stop[2], have_thread, have_indexer;
    int started;        /* the search path is watched: directories appearing are news */
    wdir *dirs;
    int ndirs;
    known *loaded;
    int nloaded;
    strs pending;       /* paths touched in the current burst */
    double first, last; /* times of its first and last events */
    int recheck;        /* a watched directory went: look at the directories now */
    double next_look;   /* the next idle look */
    pthread_mutex_t emit_lock; /* events are handed over one at a time */
    pthread_mutex_t qlock;     /* the indexer's queue, qstop */
    pthread_cond_t qcond;
    strs queue;
    int qstop;
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

/* Replace *dst by a copy of src (kept when out of memory). */
static void set_str(char **dst, const char *src)
{
    char *c = strdup(src);
    if (c) {
        free(*dst);
        *dst = c;
    }
}

/* path absolute (the cwd before a relative one), into out; 0 when too long. */
static int absolute(const char *path, char *out, size_t n)
{
    char cwd[PATH_MAX];
    if (path[0] == '/')
        return (size_t)snprintf(out, n, "%s", path) < n;
    return getcwd(cwd, sizeof cwd) && (size_t)snprintf(out, n, "%s/%s", cwd, path) < n;
}

/* The directory part of path, into out ("/" for "/x"). */
static void dir_part(const char *path, char *out, size_t n)
{
    snprintf(out, n, "%s", path);
    char *slash = strrchr(out, '/');
    if (slash)
        slash[slash == out] = '\0';
}

/* ---- events handed over ------------------------------------------------------- */

static void emit(struct watcher *w, int kind, const char *path, int status, const char *msg,
                 double ms)
{
    static const char *const what[] = {"reloaded", "failed to load", "removed", "added"};
    pthread_mutex_lock(&w->emit_lock);
    /* With a callback the event is the report: the log only repeats it. */
    rt_log(w->l->rt, w->fn ? OPJIT_LOG_DEBUG : kind == OPJIT_WATCH_FAILED ? OPJIT_LOG_ERROR
                                                                        : OPJIT_LOG_INFO,
           "watch: %s %s%s%s", what[kind], path, msg && *msg ? ": " : "", msg ? msg : "");
    if (w->fn) {
        opjit_watch_event ev = {kind, path, status, msg ? msg : "", ms};
        w->fn(w->ud, &ev);
    }
    pthread_mutex_unlock(&w->emit_lock);
}

/* ---- watched directories ------------------------------------------------------ */

/* Stop watching d's directory, unless another entry watches it too. */
static void unwatch(struct watcher *w, wdir *d)
{
    int shared = 0;
    for (int i = 0; i < w->ndirs; i++)
        shared |= &w->dirs[i] != d && w->dirs[i].wd == d->wd;
    if (d->wd >= 0 && !shared)
        inotify_rm_watch(w->ifd, d->wd);
    d->wd = -1;
}

static void queue_index(struct watcher *w, const char *path);

/* Everything under the directory d watches now is news: every loaded
 * source is looked at again (its path may pass through d) and, for a
 * search-path directory, every source in it is indexed. */
static void look_at_all(struct watcher *w, const wdir *d)
{
    if (!w->pending.n)
        w->first = loader_now_ms();
    w->last = loader_now_ms();
    for (int i = 0; i < w->nloaded; i++)
        strs_add(&w->pending, w->loaded[i].real);
    DIR *dir = d->search ? opendir(d->real) : NULL;
    for (struct dirent *de; dir && (de = readdir(dir));) {
        char path[PATH_MAX];
        if (loader_source_stem(de->d_name) &&
            (size_t)snprintf(path, sizeof path, "%s/%s", d->real, de->d_name) < sizeof path)
            strs_add(&w->pending, path);
    }
    if (dir)
        closedir(dir);
}

/* Look d up again by its name: watch the directory it names now when that
 * is not the one watched. */
static void check_dir(struct watcher *w, wdir *d)
{
    struct stat st;
    char real[PATH_MAX];
    int here = stat(d->name, &st) == 0 && S_ISDIR(st.st_mode) && realpath(d->name, real);
    if (here && d->wd >= 0 && st.st_dev == d->dev && st.st_ino == d->ino) {
        if (strcmp(real, d->real)) { /* the same directory, found elsewhere now */
            set_str(&d->real, real);
            look_at_all(w, d);
        }
        return;
    }
    if (d->wd >= 0)
        unwatch(w, d); /* moved away, or replaced: its watch follows the old one */
    if (!here) {
        if (d->real && !d->said)
            rt_log(w->l->rt, OPJIT_LOG_WARN, "watch: %s was removed or moved away; watching "
                   "for a directory of that name", d->name);
        d->said = 1;
        return;
    }
    int wd = inotify_add_watch(w->ifd, real, WATCH_MASK | IN_ONLYDIR);
    if (wd < 0) {
        if (!d->said)
            rt_log(w->l->rt, OPJIT_LOG_WARN, "watch: cannot watch %s: %s", real, strerror(errno));
        d->said = 1;
        return;
    }
    int again = d->real != NULL || (d->search && w->started);
    d->wd = wd;
    d->dev = st.st_dev;
    d->ino = st.st_ino;
    d->said = 0;
    set_str(&d->real, real);
    if (!d->real) {
        unwatch(w, d);
        return;
    }
    if (again) {
        rt_log(w->l->rt, OPJIT_LOG_INFO, "watch: %s is another directory now; watching it",
               d->name);
        look_at_all(w, d);
    }
}

static void check_dirs(struct watcher *w)
{
    for (int i = 0; i < w->ndirs; i++)
        check_dir(w, &w->dirs[i]);
}

/* Watch the directory at name (made absolute), from now on and whatever
 * it comes to name; search: one of the search path. */
static void watch_dir(struct watcher *w, const char *name, int search)
{
    char abs[PATH_MAX];
    if (!absolute(name, abs, sizeof abs))
        return;
    for (int i = 0; i < w->ndirs; i++)
        if (!strcmp(w->dirs[i].name, abs)) {
            w->dirs[i].search |= search;
            return;
        }
    wdir *v = realloc(w->dirs, (size_t)(w->ndirs + 1) * sizeof *v);
    if (!v)
        return;
    w->dirs = v;
    v[w->ndirs] = (wdir){.name = strdup(abs), .wd = -1, .search = search};
    if (!v[w->ndirs].name)
        return;
    check_dir(w, &v[w->ndirs++]);
}

static void watch_dir_of(struct watcher *w, const char *file)
{
    char dir[PATH_MAX];
    dir_part(file, dir, sizeof dir);
    watch_dir(w, dir, 0);
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
    for (const char *p = loader_ops_path(w->l); *p;) {
        size_t n = strcspn(p, ":");
        char dir[PATH_MAX];
        snprintf(dir, sizeof dir, "%.*s", (int)n, p);
        if (n)
            watch_dir(w, dir, 1);
        p += n + (p[n] == ':');
    }
}

/* The search-path directory whose real path is dir (len bytes), if any. */
static int is_search_dir(const struct watcher *w, const char *dir, size_t len)
{
    for (int i = 0; i < w->ndirs; i++) {
        const wdir *d = &w->dirs[i];
        if (d->search && d->wd >= 0 && strlen(d->real) == len && !strncmp(d->real, dir, len))
            return 1;
    }
    return 0;
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

static void forget_known(struct watcher *w, known *k)
{
    free(k->path);
    free(k->abs);
    free(k->name_r);
    free(k->real);
    free(k->tried);
    strs_free(&k->headers);
    *k = w->loaded[--w->nloaded];
}

/* Learn (again) where events about k land and which headers it includes,
 * watching their directories. Loader lock held. */
static void know_headers(struct watcher *w, known *k)
{
    char dir[PATH_MAX], real[PATH_MAX], name[PATH_MAX];
    dir_part(k->abs, dir, sizeof dir);
    if (realpath(dir, real) &&
        (size_t)snprintf(name, sizeof name, "%s/%s", strcmp(real, "/") ? real : "",
                         strrchr(k->abs, '/') + 1) < sizeof name)
        set_str(&k->name_r, name);
    watch_dir(w, dir, 0);
    watch_dir_of(w, k->real);
    strs_free(&k->headers);
    source s;
    if (source_read(w->l, k->real, &s) == OPJIT_OK) {
        source_each_header(&s, took_header, &k->headers);
        source_free(&s);
    }
    for (int i = 0; i < k->headers.n; i++)
        watch_dir_of(w, k->headers.v[i]);
}

/* abs, when its directory is a search-path directory, through that
 * directory's path on the search path (the first that is it). */
static void through_search_path(const struct watcher *w, char *abs, size_t n)
{
    char dir[PATH_MAX], real[PATH_MAX], out[PATH_MAX];
    dir_part(abs, dir, sizeof dir);
    if (!realpath(dir, real))
        return;
    for (int i = 0; i < w->ndirs; i++) {
        const wdir *d = &w->dirs[i];
        if (d->search && d->wd >= 0 && !strcmp(d->real, real)) {
            if ((size_t)snprintf(out, sizeof out, "%s/%s", d->name, strrchr(abs, '/') + 1) <
                sizeof out)
                snprintf(abs, n, "%s", out);
            return;
        }
    }
}

/* A source the host loaded by path, now at real. Loader lock held. */
static void know_source(struct watcher *w, const char *path, const char *real)
{
    char abs[PATH_MAX];
    if (!absolute(path, abs, sizeof abs))
        snprintf(abs, sizeof abs, "%s", real);
    through_search_path(w, abs, sizeof abs);
    known *v = realloc(w->loaded, (size_t)(w->nloaded + 1) * sizeof *v);
    if (!v)
        return;
    w->loaded = v;
    known *k = &v[w->nloaded];
    memset(k, 0, sizeof *k);
    k->path = strdup(path);
    k->abs = strdup(abs);
    k->name_r = strdup(real);
    k->real = strdup(real);
    w->nloaded++;
    if (!k->path || !k->abs || !k->name_r || !k->real) {
        forget_known(w, k);
        return;
    }
    know_headers(w, k);
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

/* Sources the host loaded, or unloaded, since the last look. */
static void look_at_loads(struct watcher *w)
{
    loader *l = w->l;
    pthread_mutex_lock(&l->lock);
    for (loaded *e = l->loaded; e; e = e->next) {
        known *k = find_known(w, e->path);
        if (k && k->gone) { /* the watcher unloaded it; the host loaded it again */
            k->gone = 0;
            k->missing = 0;
        }
        if (k)
            continue;
        char path[PATH_MAX];
        loaded_as(l->rt, e->path, path, sizeof path);
        know_source(w, path, e->path);
    }
    for (int i = 0; i < w->nloaded;) {
        if (!w->loaded[i].gone && !loader_find_loaded(l, w->loaded[i].real))
            forget_known(w, &w->loaded[i]); /* the host unloaded it */
        else
            i++;
    }
    pthread_mutex_unlock(&l->lock);
}

/* ---- handling a burst ---------------------------------------------------------- */

/* Whether the burst touched the loaded source k (its file, its path) or
 * one of its headers. */
static int touched(const struct watcher *w, const known *k)
{
    if (strs_has(&w->pending, k->real) || strs_has(&w->pending, k->name_r) ||
        (k->tried && strs_has(&w->pending, k->tried)))
        return 1;
    for (int i = 0; i < k->headers.n; i++)
        if (strs_has(&w->pending, k->headers.v[i]))
            return 1;
    return 0;
}

/* Whether path is a loaded source's file or path. */
static int path_known(const struct watcher *w, const char *path)
{
    for (int i = 0; i < w->nloaded; i++)
        if (!strcmp(w->loaded[i].real, path) || !strcmp(w->loaded[i].name_r, path))
            return 1;
    return 0;
}

static int missing_due(const known *k, double now)
{
    return k->missing > 0 && !k->gone && now >= k->missing + WATCH_GONE_MS;
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

static void unload_gone(struct watcher *w, known *k)
{
    pthread_mutex_lock(&w->l->lock);
    module_unpublish(w->l->rt, k->real);
    loader_forget(w->l, k->real);
    pthread_mutex_unlock(&w->l->lock);
    k->gone = 1;
    k->failed = 0;
    emit(w, OPJIT_WATCH_REMOVED, k->path, OPJIT_OK, "", 0);
}

/* After k's path came to name a file another entry knows (the host loaded
 * both): one entry is enough. */
static void drop_twin(struct watcher *w, known *k)
{
    for (int i = 0; i < w->nloaded; i++)
        if (&w->loaded[i] != k && !strcmp(w->loaded[i].real, k->real)) {
            forget_known(w, k);
            return;
        }
}

/* Load k's path again, which names now_real: its file or a header changed
 * (a no-op when its key did not), it names another file now (which takes
 * over its ops), or it is back after the watcher unloaded it. */
static void reload(struct watcher *w, known *k, const char *now_real)
{
    loader *l = w->l;
    cache_key before, after;
    memset(&before, 0, sizeof before);
    int was = !k->gone && loaded_key(l, k->real, &before);
    if (!k->gone && !was)
        return; /* the host unloaded it: the next look forgets it */
    int moved = strcmp(now_real, k->real) != 0;
    pthread_mutex_lock(&l->lock);
    const char *path = moved || k->by_abs ? k->abs : k->path;
    int rc = moved && was ? loader_load_replacing(l, path, k->real)
                          : loader_load_locked(l, path, NULL, NULL);
    if (!rc) {
        k->by_abs |= moved;
        set_str(&k->real, now_real);
        free(k->tried);
        k->tried = NULL;
        k->gone = 0;
        know_headers(w, k); /* its headers may have changed too */
    }
    pthread_mutex_unlock(&l->lock);
    if (rc) {
        if (moved) { /* the new file's next edit is news too */
            set_str(&k->tried, now_real);
            watch_dir_of(w, now_real);
        }
        k->failed = 1;
        emit(w, OPJIT_WATCH_FAILED, k->path, rc, opjit_errmsg(l->rt), 0);
        return;
    }
    /* A fix back to the text loaded before is news too: the error is gone. */
    int news = k->failed || moved || !was;
    k->failed = 0;
    if (loaded_key(l, k->real, &after) &&
        (news || memcmp(before.bytes, after.bytes, sizeof after.bytes)))
        emit(w, OPJIT_WATCH_RELOADED, k->path, OPJIT_OK, "", loader_now_ms() - w->last);
    if (moved)
        drop_twin(w, k);
}

/* What the loaded source known by real has come to. */
static void look_at_source(struct watcher *w, const char *real, double now)
{
    known *k = find_known(w, real);
    char now_real[PATH_MAX];
    if (!k)
        return;
    if (!realpath(k->abs, now_real)) { /* its path names nothing (now) */
        if (!k->gone && !k->missing)
            k->missing = now;
        else if (missing_due(k, now))
            unload_gone(w, k);
        return;
    }
    k->missing = 0;
    reload(w, k, now_real);
}

/* A touched path that no loaded source uses: a new or edited source of a
 * search-path directory is indexed (by the indexer: it may take long). */
static void maybe_added(struct watcher *w, const char *path)
{
    const char *file = strrchr(path, '/') + 1;
    struct stat st;
    if (!loader_source_stem(file) || stat(path, &st) != 0 || !S_ISREG(st.st_mode) ||
        !is_search_dir(w, path, (size_t)(file - 1 - path)))
        return;
    pthread_mutex_lock(&w->l->lock);
    int loaded_now = loader_find_loaded(w->l, path) != NULL;
    pthread_mutex_unlock(&w->l->lock);
    if (!loaded_now)
        queue_index(w, path);
}

static void handle_burst(struct watcher *w)
{
    double now = loader_now_ms();
    look_at_loads(w);
    strs reals = {0};
    for (int i = 0; i < w->nloaded; i++)
        if (touched(w, &w->loaded[i]) || missing_due(&w->loaded[i], now))
            strs_add(&reals, w->loaded[i].real);
    for (int i = 0; i < reals.n; i++)
        look_at_source(w, reals.v[i], now);
    for (int i = 0; i < w->pending.n; i++)
        if (!path_known(w, w->pending.v[i]) && !strs_has(&reals, w->pending.v[i]))
            maybe_added(w, w->pending.v[i]);
    strs_free(&reals);
    strs_free(&w->pending);
}

/* ---- the indexer ------------------------------------------------------------------ */

static void queue_index(struct watcher *w, const char *path)
{
    pthread_mutex_lock(&w->qlock);
    strs_add(&w->queue, path);
    pthread_cond_signal(&w->qcond);
    pthread_mutex_unlock(&w->qlock);
}

/* Index a new or edited source: added, or failed with why (its init
 * crashed or did not return in time, it does not compile). */
static void index_new(struct watcher *w, const char *path)
{
    int rc = index_source(w->l, path);
    pthread_mutex_lock(&w->qlock);
    int stopping = w->qstop;
    pthread_mutex_unlock(&w->qlock);
    if (stopping || rc == OPJIT_ENOTFOUND) /* stopped meanwhile, or deleted */
        return;
    if (rc == OPJIT_OK || rc == OPJIT_EDEVICE) /* EDEVICE: a .cu listed as skipped */
        emit(w, OPJIT_WATCH_ADDED, path, OPJIT_OK, "", 0);
    else
        emit(w, OPJIT_WATCH_FAILED, path, rc, opjit_errmsg(w->l->rt), 0);
}

static void *index_main(void *arg)
{
    struct watcher *w = arg;
    discover_outside_lock();
    pthread_mutex_lock(&w->qlock);
    while (!w->qstop) {
        if (!w->queue.n) {
            pthread_cond_wait(&w->qcond, &w->qlock);
            continue;
        }
        char *path = w->queue.v[0];
        memmove(w->queue.v, w->queue.v + 1, (size_t)--w->queue.n * sizeof *w->queue.v);
        pthread_mutex_unlock(&w->qlock);
        index_new(w, path);
        free(path);
        pthread_mutex_lock(&w->qlock);
    }
    pthread_mutex_unlock(&w->qlock);
    return NULL;
}

/* ---- the thread ------------------------------------------------------------------ */

/* A watch the kernel dropped (its directory went): nothing is watched there. */
static void dropped(struct watcher *w, int wd)
{
    for (int i = 0; i < w->ndirs; i++)
        if (w->dirs[i].wd == wd)
            w->dirs[i].wd = -1;
    w->recheck = 1;
}

/* Events were lost: everything may have changed. */
static void overflowed(struct watcher *w)
{
    for (int i = 0; i < w->ndirs; i++)
        if (w->dirs[i].wd >= 0)
            look_at_all(w, &w->dirs[i]);
    w->recheck = 1;
}

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
        if (ev->mask & IN_Q_OVERFLOW)
            overflowed(w);
        else if (ev->mask & IN_IGNORED)
            dropped(w, ev->wd);
        else if (ev->mask & (IN_DELETE_SELF | IN_MOVE_SELF))
            w->recheck = 1;
        else if (dir && ev->len &&
                 (size_t)snprintf(path, sizeof path, "%s/%s", dir, ev->name) < sizeof path)
            strs_add(&w->pending, path);
    }
}

/* Milliseconds until something is due: the burst's end, a deleted
 * source's time, the next idle look. */
static int next_timeout(const struct watcher *w, double now)
{
    double due = w->next_look;
    if (w->pending.n) {
        double end = w->last + WATCH_QUIET_MS;
        due = end < due ? end : due;
        due = w->first + WATCH_MAX_BURST_MS < due ? w->first + WATCH_MAX_BURST_MS : due;
    }
    for (int i = 0; i < w->nloaded; i++) {
        const known *k = &w->loaded[i];
        if (k->missing > 0 && !k->gone && k->missing + WATCH_GONE_MS < due)
            due = k->missing + WATCH_GONE_MS;
    }
    return due > now ? (int)(due - now) + 1 : 0;
}

static int burst_due(const struct watcher *w, double now)
{
    if (w->pending.n && (now >= w->last + WATCH_QUIET_MS || now >= w->first + WATCH_MAX_BURST_MS))
        return 1;
    for (int i = 0; i < w->nloaded; i++)
        if (missing_due(&w->loaded[i], now))
            return 1;
    return 0;
}

static void *watch_main(void *arg)
{
    struct watcher *w = arg;
    w->next_look = loader_now_ms() + WATCH_IDLE_MS;
    for (;;) {
        struct pollfd p[2] = {{w->stop[0], POLLIN, 0}, {w->ifd, POLLIN, 0}};
        int r = poll(p, 2, next_timeout(w, loader_now_ms()));
        if (r < 0 && errno != EINTR)
            break;
        if (r > 0 && p[0].revents)
            break;
        if (r > 0 && p[1].revents)
            read_events(w);
        double now = loader_now_ms();
        int idle = now >= w->next_look;
        if (idle || w->recheck) {
            w->recheck = 0;
            check_dirs(w);
        }
        if (idle) {
            w->next_look = now + WATCH_IDLE_MS;
            module_reclaim(w->l->rt); /* code no call can be running in any more */
        }
        if (burst_due(w, now))
            handle_burst(w);
        else if (idle && !w->pending.n)
            look_at_loads(w);
    }
    return NULL;
}

static void watcher_free(struct watcher *w)
{
    for (int i = 0; i < w->ndirs; i++) {
        free(w->dirs[i].name);
        free(w->dirs[i].real);
    }
    free(w->dirs);
    while (w->nloaded)
        forget_known(w, &w->loaded[0]);
    free(w->loaded);
    strs_free(&w->pending);
    strs_free(&w->queue);
    if (w->ifd >= 0)
        close(w->ifd);
    if (w->stop[0] >= 0)
        close(w->stop[0]), close(w->stop[1]);
    pthread_mutex_destroy(&w->emit_lock);
    pthread_mutex_destroy(&w->qlock);
    pthread_cond_destroy(&w->qcond);
    free(w);
}

/* Stop and join whichever threads run, then free w. */
static void watcher_end(loader *l, struct watcher *w)
{
    ssize_t r = write(w->stop[1], "x", 1); /* also cancels a discovery under way */
    (void)r;
    pthread_mutex_lock(&w->qlock);
    w->qstop = 1;
    pthread_cond_broadcast(&w->qcond);
    pthread_mutex_unlock(&w->qlock);
    if (w->have_thread)
        pthread_join(w->thread, NULL);
    if (w->have_indexer)
        pthread_join(w->indexer, NULL);
    l->discover_cancel_fd = -1;
    watcher_free(w);
}

int watch_start(loader *l)
{
    const settings *cfg = &l->rt->set;
    if (!cfg->watch)
        return OPJIT_OK;
    struct watcher *w = calloc(1, sizeof *w);
    if (!w)
        return OPJIT_ENOMEM;
    *w = (struct watcher){.l = l, .fn = cfg->watch_fn, .ud = cfg->watch_ud, .ifd = -1,
                          .stop = {-1, -1}};
    pthread_mutex_init(&w->emit_lock, NULL);
    pthread_mutex_init(&w->qlock, NULL);
    pthread_cond_init(&w->qcond, NULL);
    if ((w->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0 ||
        pipe2(w->stop, O_CLOEXEC) != 0) {
        /* Asked for by the config: an error; by $OPJIT_WATCH: a warning. */
        int asked = !cfg->watch_from_env;
        rt_log(l->rt, asked ? OPJIT_LOG_ERROR : OPJIT_LOG_WARN,
               "watch: cannot watch the sources: %s", strerror(errno));
        watcher_free(w);
        return asked ? OPJIT_EIO : OPJIT_OK;
    }
    watch_search_path(w);
    w->started = 1;
    l->discover_cancel_fd = w->stop[0];
    w->have_thread = pthread_create(&w->thread, NULL, watch_main, w) == 0;
    w->have_indexer = w->have_thread && pthread_create(&w->indexer, NULL, index_main, w) == 0;
    if (!w->have_indexer) {
        watcher_end(l, w);
        return OPJIT_ENOMEM;
    }
    l->watch = w;
    return OPJIT_OK;
}

void watch_stop(loader *l)
{
    if (l && l->watch) {
        watcher_end(l, l->watch);
        l->watch = NULL;
    }
}
