/* tests/test_watch.c - cfg.watch (loader/watch.c): an editor-like burst of
 * writes makes one reload and the new code serves calls; so does an edit of
 * a local header and a save by rename; a broken edit keeps the old kernels
 * and reports the compile error with file:line; a new source is loadable
 * by name; a deleted one is unloaded; opjit_destroy stops the watcher.
 * And what issue 20 found: a replaced or re-pointed directory is watched
 * anew; a retargeted symlink is a reload; a source deleted and written
 * again is reloaded, however long it was away; a new source whose init
 * hangs holds up neither loads nor reloads nor opjit_destroy; replaced
 * code is unmapped while other threads keep calling. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "opjit.h"
#include "t.h"
#include "t_files.h"
#include "t_ops.h"

#define MAX_EVENTS 256

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cond = PTHREAD_COND_INITIALIZER;
static struct {
    int kind, status;
    char path[1024], message[2048];
} events[MAX_EVENTS];
static int nevents;

static void on_event(void *ud, const opjit_watch_event *ev)
{
    (void)ud;
    pthread_mutex_lock(&lock);
    if (nevents < MAX_EVENTS) {
        events[nevents].kind = ev->kind;
        events[nevents].status = ev->status;
        snprintf(events[nevents].path, sizeof events[nevents].path, "%s", ev->path);
        snprintf(events[nevents].message, sizeof events[nevents].message, "%s", ev->message);
        nevents++;
    }
    pthread_cond_broadcast(&cond);
    pthread_mutex_unlock(&lock);
}

/* Wait until there are more than `after` events (30 s at most: a loaded
 * machine); the
 * index of the first new one, or -1. */
static int wait_event(int after)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 30;
    pthread_mutex_lock(&lock);
    while (nevents <= after && pthread_cond_timedwait(&cond, &lock, &until) == 0)
        ;
    int i = nevents > after ? after : -1;
    pthread_mutex_unlock(&lock);
    return i;
}

static int count_events(void)
{
    pthread_mutex_lock(&lock);
    int n = nevents;
    pthread_mutex_unlock(&lock);
    return n;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* The source of op `ver` returning VALUE, from the header ver.h when
 * header is set. */
static void source_text(char *buf, size_t n, const char *value, int header)
{
    snprintf(buf, n,
             "#include <opjit_op.h>\n%s"
             "static int k(opjit_ctx *ctx, opjit_args *a)\n{\n    (void)a;\n"
             "    int64_t one = 1;\n"
             "    DLTensor *y = opjit_output(ctx, 0, (DLDataType){kDLFloat, 32, 1}, 1, &one);\n"
             "    if (!y)\n        return -1;\n"
             "    ((float *)y->data)[0] = %s;\n    return 0;\n}\n"
             "OPJIT_MODULE(ver, m)\n{\n"
             "    opjit_def(m, \"ver() -> Tensor\", OPJIT_CPU, k, \"\");\n"
             "    opjit_def(m, \"ver_twin() -> Tensor\", OPJIT_CPU, k, \"\");\n"
             "    opjit_not_differentiable(m, \"ver\");\n}\n",
             header ? "#include \"ver.h\"\n" : "", value);
}

static float call_ver(opjit_runtime *rt)
{
    opjit_op *op = NULL;
    return opjit_find_op(rt, "ver", &op) == OPJIT_OK ? t_call_f32(rt, op) : -1;
}

static double now_ms(void);

/* The watcher's quiet time (loader/watch.c's WATCH_QUIET_MS, 25 ms), less
 * a margin: pieces written closer than this are one burst. */
#define BURST_GAP_MS 20.0

/* Save path as an editor that truncates and writes in pieces does; the
 * longest gap between two pieces in ms (a loaded machine can stall the
 * writer past the watcher's quiet time: then the pieces are two bursts). */
static double save_in_pieces(const char *path, const char *text)
{
    size_t len = strlen(text), third = len / 3;
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f)
        return 0;
    double gap = 0, last = now_ms();
    for (int i = 0; i < 3; i++) {
        size_t n = i < 2 ? third : len - 2 * third;
        double t = now_ms();
        gap = t - last > gap ? t - last : gap;
        CHECK(fwrite(text + i * third, 1, n, f) == n);
        fflush(f);
        last = now_ms();
        if (i < 2)
            sleep_ms(3);
    }
    CHECK(fclose(f) == 0);
    return gap;
}

/* Save path as an editor that writes a temporary file and renames it. */
static void save_by_rename(const char *dir, const char *path, const char *text)
{
    const char *tmp = t_path(dir, ".ver.c.swp");
    t_write(tmp, text, strlen(text));
    CHECK(rename(tmp, path) == 0);
}

/* After a burst: exactly one new event within the quiet time, of kind. */
static void expect_one(int before, int kind)
{
    int i = wait_event(before);
    CHECKF(i >= 0, "no event");
    if (i < 0)
        return;
    sleep_ms(300); /* anything else the burst would cause comes by now */
    CHECKF(count_events() == before + 1, "%d events, expected 1", count_events() - before);
    for (int j = before; j < count_events() && count_events() != before + 1; j++)
        fprintf(stderr, "  event %d: kind %d %s: %s\n", j, events[j].kind, events[j].path,
                events[j].message);
    CHECKF(events[i].kind == kind, "event %d, expected %d (%s)", events[i].kind, kind,
           events[i].message);
}

/* After a burst the scheduler split (gap ms between pieces): events come
 * until the watcher is quiet, and the last is of kind. */
static void expect_last(int before, int kind, double gap)
{
    fprintf(stderr, "  the writer stalled %.0f ms between pieces (two bursts): "
                    "checking the last event only\n", gap);
    CHECKF(wait_event(before) >= 0, "no event");
    int n;
    do {
        n = count_events();
        sleep_ms(300);
    } while (count_events() != n);
    if (n > before)
        CHECKF(events[n - 1].kind == kind, "last event %d, expected %d (%s)", events[n - 1].kind,
               kind, events[n - 1].message);
}

/* One event of kind after a save in pieces, unless the writer stalled. */
static void expect_burst(int before, int kind, double gap)
{
    if (gap < BURST_GAP_MS)
        expect_one(before, kind);
    else
        expect_last(before, kind, gap);
}

static void test_watch(void)
{
    const char *dir = t_tmpdir("watch");
    const char *src = t_path(dir, "ver.c");
    char path[1024], text[2048];
    snprintf(path, sizeof path, "%s", src);
    t_write(t_path(dir, "ver.h"), "#define VER 10\n", 15);
    source_text(text, sizeof text, "1", 0);
    t_write(path, text, strlen(text));

    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.ops_path = dir;
    cfg.tiering = 0;
    cfg.watch = 1;
    cfg.watch_fn = on_event;
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    if (!rt)
        return;
    opjit_op *op = NULL;
    CHECK(opjit_load_op(rt, "ver_twin", &op) == OPJIT_OK); /* by an op's name */
    CHECK(call_ver(rt) == 1.0f);
    sleep_ms(300); /* the watcher has seen the load */

    /* A burst of writes: one reload, the new code serves. */
    int n = count_events();
    source_text(text, sizeof text, "2", 0);
    expect_burst(n, OPJIT_WATCH_RELOADED, save_in_pieces(path, text));
    CHECK(call_ver(rt) == 2.0f);

    /* A save by rename, now including a header. */
    n = count_events();
    source_text(text, sizeof text, "VER", 1);
    save_by_rename(dir, path, text);
    expect_one(n, OPJIT_WATCH_RELOADED);
    CHECK(call_ver(rt) == 10.0f);

    /* An edit of the header alone. */
    n = count_events();
    t_write(t_path(dir, "ver.h"), "#define VER 11\n", 15);
    expect_one(n, OPJIT_WATCH_RELOADED);
    CHECK(call_ver(rt) == 11.0f);

    /* A broken edit: reported with file:line; the old kernels serve. */
    n = count_events();
    source_text(text, sizeof text, "VER +", 1);
    expect_burst(n, OPJIT_WATCH_FAILED, save_in_pieces(path, text));
    if (count_events() > n) {
        int last = count_events() - 1;
        CHECK(events[last].status == OPJIT_ECOMPILE);
        CHECK_STR_CONTAINS(events[last].message, "ver.c:11: error");
    }
    CHECK(call_ver(rt) == 11.0f);

    /* A new source: loadable by name. */
    n = count_events();
    const char *fresh = "#include <opjit_op.h>\n"
                        "static int k(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\n"
                        "OPJIT_MODULE(f, m) { opjit_def(m, \"fresh_op() -> Tensor\", OPJIT_CPU, k, \"\"); }\n";
    t_write(t_path(dir, "fresh_mod.c"), fresh, strlen(fresh));
    expect_one(n, OPJIT_WATCH_ADDED);
    CHECK(opjit_load_op(rt, "fresh_op", &op) == OPJIT_OK);

    /* A deleted source: its ops leave. */
    n = count_events();
    CHECK(unlink(path) == 0);
    expect_one(n, OPJIT_WATCH_REMOVED);
    CHECK(opjit_find_op(rt, "ver", &op) == OPJIT_ENOTFOUND);
    opjit_destroy(rt);
}

/* ---- issue 20 ------------------------------------------------------------------- */

static void events_reset(void)
{
    pthread_mutex_lock(&lock);
    nevents = 0;
    pthread_mutex_unlock(&lock);
}

static int ends_with(const char *s, const char *suffix)
{
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

/* The first event of kind after index `after` whose path ends in suffix,
 * waiting ms at most; its index, or -1. */
static int wait_kind_ms(int after, int kind, const char *suffix, int ms)
{
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += ms / 1000;
    until.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L)
        until.tv_sec++, until.tv_nsec -= 1000000000L;
    int found = -1, timed_out = 0;
    pthread_mutex_lock(&lock);
    while (found < 0) {
        for (int i = after; i < nevents && found < 0; i++)
            if (events[i].kind == kind && ends_with(events[i].path, suffix))
                found = i;
        if (found >= 0 || timed_out)
            break;
        timed_out = pthread_cond_timedwait(&cond, &lock, &until) == ETIMEDOUT;
    }
    pthread_mutex_unlock(&lock);
    return found;
}

static int wait_kind(int after, int kind, const char *suffix)
{
    return wait_kind_ms(after, kind, suffix, 30000);
}

static int seen_kind(int after, int kind)
{
    pthread_mutex_lock(&lock);
    int seen = 0;
    for (int i = after; i < nevents; i++)
        seen |= events[i].kind == kind;
    pthread_mutex_unlock(&lock);
    return seen;
}

static opjit_runtime *watching(const char *ops_path)
{
    opjit_config cfg;
    opjit_config_init(&cfg, sizeof cfg);
    cfg.ops_path = ops_path;
    cfg.tiering = 0;
    cfg.watch = 1;
    cfg.watch_fn = on_event;
    opjit_runtime *rt = NULL;
    CHECK(opjit_create(&cfg, &rt) == OPJIT_OK);
    return rt;
}

static void write_ver(const char *path, const char *value)
{
    char text[2048];
    source_text(text, sizeof text, value, 0);
    t_write(path, text, strlen(text));
}

static const char *path_in(char *buf, size_t n, const char *dir, const char *name)
{
    CHECK((size_t)snprintf(buf, n, "%s/%s", dir, name) < n);
    return buf;
}

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A source defining op `name` (returning 7), not named after it. */
static void write_other(const char *path, const char *name)
{
    char text[1024];
    snprintf(text, sizeof text,
             "#include <opjit_op.h>\n"
             "static int k(opjit_ctx *c, opjit_args *a) { (void)c; (void)a; return 0; }\n"
             "OPJIT_MODULE(o, m) { opjit_def(m, \"%s() -> Tensor\", OPJIT_CPU, k, \"\"); }\n",
             name);
    t_write(path, text, strlen(text));
}

/* #20.5: the watched directory moved away and made again, removed and
 * made again: the new one is watched, its sources reloaded or indexed. */
static void test_dir_replaced(void)
{
    events_reset();
    const char *base = t_tmpdir("watch-dir");
    char d[1024], old[1024], src[1024], fresh[1024];
    path_in(d, sizeof d, base, "ops");
    path_in(old, sizeof old, base, "ops.old");
    path_in(src, sizeof src, d, "ver.c");
    path_in(fresh, sizeof fresh, d, "fresh2.c");
    CHECK(mkdir(d, 0700) == 0);
    write_ver(src, "1");
    opjit_runtime *rt = watching(d);
    opjit_op *op = NULL;
    if (!rt)
        return;
    CHECK(opjit_load_op(rt, "ver", &op) == OPJIT_OK);
    CHECK(call_ver(rt) == 1.0f);
    sleep_ms(300);

    /* Moved away and made again (an rsync swap, a checkout of the folder). */
    int n = count_events();
    CHECK(rename(d, old) == 0);
    CHECK(mkdir(d, 0700) == 0);
    write_ver(src, "2");
    CHECKF(wait_kind(n, OPJIT_WATCH_RELOADED, "/ver.c") >= 0, "no reload in the new directory");
    CHECK(call_ver(rt) == 2.0f);
    n = count_events();
    write_ver(src, "3"); /* the new directory is watched */
    CHECK(wait_kind(n, OPJIT_WATCH_RELOADED, "/ver.c") >= 0);
    CHECK(call_ver(rt) == 3.0f);
    n = count_events();
    write_other(fresh, "fresh2_op");
    CHECK(wait_kind(n, OPJIT_WATCH_ADDED, "/fresh2.c") >= 0);
    CHECK(opjit_load_op(rt, "fresh2_op", &op) == OPJIT_OK);

    /* Removed with everything in it, and made again. */
    n = count_events();
    nftw(d, t_rm_one, 16, FTW_DEPTH | FTW_PHYS);
    CHECK(mkdir(d, 0700) == 0);
    write_ver(src, "4");
    CHECKF(wait_kind(n, OPJIT_WATCH_RELOADED, "/ver.c") >= 0, "no reload in the remade directory");
    CHECK(call_ver(rt) == 4.0f);
    opjit_destroy(rt);
}

/* #20.5: the search path names a symlink to a directory, pointed at
 * another one: its sources are reloaded from there, and only edits there
 * count. */
static void test_dir_link_swapped(void)
{
    events_reset();
    const char *base = t_tmpdir("watch-link");
    char r1[1024], r2[1024], link[1024], tmp[1024], p1[1024], p2[1024];
    path_in(r1, sizeof r1, base, "r1");
    path_in(r2, sizeof r2, base, "r2");
    path_in(link, sizeof link, base, "ops");
    path_in(tmp, sizeof tmp, base, "ops.new");
    CHECK(mkdir(r1, 0700) == 0 && mkdir(r2, 0700) == 0 && symlink("r1", link) == 0);
    write_ver(path_in(p1, sizeof p1, r1, "ver.c"), "1");
    write_ver(path_in(p2, sizeof p2, r2, "ver.c"), "2");
    opjit_runtime *rt = watching(link);
    opjit_op *op = NULL;
    if (!rt)
        return;
    CHECK(opjit_load_op(rt, "ver", &op) == OPJIT_OK);
    CHECK(call_ver(rt) == 1.0f);

    /* At once: the link moves before the watcher looks at the load (a
     * load by name hands the loader r1/ver.c; it follows ops/ver.c). */
    int n = count_events();
    CHECK(symlink("r2", tmp) == 0 && rename(tmp, link) == 0);
    CHECKF(wait_kind(n, OPJIT_WATCH_RELOADED, "/ver.c") >= 0, "no reload after the link moved");
    CHECK(call_ver(rt) == 2.0f);
    n = count_events();
    write_ver(p2, "22");
    CHECK(wait_kind(n, OPJIT_WATCH_RELOADED, "/ver.c") >= 0);
    CHECK(call_ver(rt) == 22.0f);
    n = count_events();
    write_ver(p1, "11"); /* no longer on the path */
    sleep_ms(600);
    CHECKF(count_events() == n, "%d events for an edit off the path", count_events() - n);
    CHECK(call_ver(rt) == 22.0f);
    opjit_destroy(rt);
}

/* #20.6: ops/ver.c -> v1/ver.c retargeted to v2/ver.c is a reload; then
 * edits of v2 reload and edits of v1 do nothing. */
static void test_symlink_retarget(void)
{
    events_reset();
    const char *base = t_tmpdir("watch-retarget");
    char d[1024], v1[1024], v2[1024], p1[1024], p2[1024], name[1024], tmp[1024];
    path_in(d, sizeof d, base, "ops");
    path_in(v1, sizeof v1, base, "v1");
    path_in(v2, sizeof v2, base, "v2");
    CHECK(mkdir(d, 0700) == 0 && mkdir(v1, 0700) == 0 && mkdir(v2, 0700) == 0);
    write_ver(path_in(p1, sizeof p1, v1, "ver.c"), "1");
    write_ver(path_in(p2, sizeof p2, v2, "ver.c"), "2");
    path_in(name, sizeof name, d, "ver.c");
    path_in(tmp, sizeof tmp, d, ".ver.c.tmp");
    CHECK(symlink(p1, name) == 0);
    opjit_runtime *rt = watching(d);
    opjit_op *op = NULL;
    if (!rt)
        return;
    CHECK(opjit_load_op(rt, "ver", &op) == OPJIT_OK);
    CHECK(call_ver(rt) == 1.0f);
    sleep_ms(300);

    int n = count_events(); /* ln -sfn v2/ver.c ops/ver.c */
    CHECK(symlink(p2, tmp) == 0 && rename(tmp, name) == 0);
    CHECKF(wait_kind(n, OPJIT_WATCH_RELOADED, "/ver.c") >= 0, "retargeting is no reload");
    sleep_ms(300);
    CHECK(!seen_kind(n, OPJIT_WATCH_ADDED) && !seen_kind(n, OPJIT_WATCH_FAILED));
    CHECK(call_ver(rt) == 2.0f);
    n = count_events();
    write_ver(p2, "22");
    CHECK(wait_kind(n, OPJIT_WATCH_RELOADED, "/ver.c") >= 0);
    CHECK(call_ver(rt) == 22.0f);
    n = count_events();
    write_ver(p1, "11");
    sleep_ms(600);
    CHECKF(count_events() == n, "%d events for an edit of the old target", count_events() - n);
    CHECK(call_ver(rt) == 22.0f);

    /* Retargeted to a file that does not compile: v2 serves until it is fixed. */
    char v3[1024], p3[1024];
    path_in(v3, sizeof v3, base, "v3");
    CHECK(mkdir(v3, 0700) == 0);
    write_ver(path_in(p3, sizeof p3, v3, "ver.c"), "3 +");
    n = count_events();
    CHECK(symlink(p3, tmp) == 0 && rename(tmp, name) == 0);
    CHECK(wait_kind(n, OPJIT_WATCH_FAILED, "/ver.c") >= 0);
    CHECK(call_ver(rt) == 22.0f);
    n = count_events();
    write_ver(p3, "3");
    CHECKF(wait_kind(n, OPJIT_WATCH_RELOADED, "/ver.c") >= 0, "fixing the new target is no reload");
    CHECK(call_ver(rt) == 3.0f);
    opjit_destroy(rt);
}

/* #20.7: deleted and written again 100 ms later: the old code serves in
 * between, then the new; away for longer: removed, and loaded again when
 * it is back, edits after that included. */
static void test_delete_recreate(void)
{
    events_reset();
    const char *dir = t_tmpdir("watch-recreate");
    char src[1024];
    path_in(src, sizeof src, dir, "ver.c");
    write_ver(src, "1");
    opjit_runtime *rt = watching(dir);
    opjit_op *op = NULL;
    if (!rt)
        return;
    CHECK(opjit_load_op(rt, "ver", &op) == OPJIT_OK);
    sleep_ms(300);

    int n = count_events();
    CHECK(unlink(src) == 0);
    sleep_ms(100);
    CHECK(call_ver(rt) == 1.0f);
    write_ver(src, "2");
    CHECK(wait_kind(n, OPJIT_WATCH_RELOADED, "/ver.c") >= 0);
    CHECK(!seen_kind(n, OPJIT_WATCH_REMOVED));
    CHECK(call_ver(rt) == 2.0f);

    n = count_events();
    CHECK(unlink(src) == 0);
    CHECK(wait_kind(n, OPJIT_WATCH_REMOVED, "/ver.c") >= 0);
    CHECK(opjit_find_op(rt, "ver", &op) == OPJIT_ENOTFOUND);
    n = count_events();
    write_ver(src, "3");
    CHECKF(wait_kind(n, OPJIT_WATCH_RELOADED, "/ver.c") >= 0, "not loaded again when back");
    CHECK(call_ver(rt) == 3.0f);
    n = count_events();
    write_ver(src, "4");
    CHECK(wait_kind(n, OPJIT_WATCH_RELOADED, "/ver.c") >= 0);
    CHECK(call_ver(rt) == 4.0f);
    opjit_destroy(rt);
}

/* #20.8: a new source whose init never returns: discovery's child runs
 * until its time limit, and meanwhile loads, reloads and opjit_destroy do
 * not wait for it. */
static void test_slow_new_source(void)
{
    events_reset();
    setenv("OPJIT_DISCOVER_TIMEOUT", "60", 1);
    const char *dir = t_tmpdir("watch-hang"), *other = t_tmpdir("watch-other");
    char src[1024], hang[1024], plus[1024];
    path_in(src, sizeof src, dir, "ver.c");
    path_in(hang, sizeof hang, dir, "hang.c");
    path_in(plus, sizeof plus, other, "plus.c");
    write_ver(src, "1");
    write_other(plus, "plus");
    opjit_runtime *rt = watching(dir);
    opjit_op *op = NULL;
    if (!rt)
        return;
    CHECK(opjit_load_op(rt, "ver", &op) == OPJIT_OK);
    sleep_ms(300);
    const char *text = "#include <opjit_op.h>\nOPJIT_MODULE(hang, m) { (void)m; for (;;) ; }\n";
    t_write(hang, text, strlen(text));
    sleep_ms(800); /* its discovery is under way */

    double t0 = now_ms();
    CHECK(opjit_load_file(rt, plus, &op, NULL) == OPJIT_OK);
    double ms = now_ms() - t0;
    CHECKF(ms < 10000, "an unrelated load took %.0f ms", ms);
    int n = count_events();
    write_ver(src, "2");
    CHECKF(wait_kind_ms(n, OPJIT_WATCH_RELOADED, "/ver.c", 10000) >= 0,
           "no reload while a new source is indexed");
    CHECK(call_ver(rt) == 2.0f);
    t0 = now_ms();
    opjit_destroy(rt);
    ms = now_ms() - t0;
    CHECKF(ms < 10000, "opjit_destroy took %.0f ms", ms);
    unsetenv("OPJIT_DISCOVER_TIMEOUT");
}

/* Calls from several threads while the op is reloaded. */
typedef struct caller {
    opjit_runtime *rt;
    opjit_op *op;
    atomic_int *stop;
    long calls, bad;
} caller;

static void *caller_main(void *arg)
{
    caller *c = arg;
    while (!atomic_load(c->stop)) {
        DLManagedTensor *out = NULL;
        if (opjit_call(c->rt, c->op, NULL, 0, &out, 1) != OPJIT_OK) {
            c->bad++;
            continue;
        }
        float v = ((float *)out->dl_tensor.data)[0];
        c->bad += v < 1.0f || v > 100.0f;
        c->calls++;
        out->deleter(out);
    }
    return NULL;
}

static int count_maps(void) { return t_lines("/proc/self/maps"); }

/* #20.18: reloads under calls from 4 threads: no call fails, the replaced
 * code is unmapped, and what op info handed out before stays readable. */
static void test_reload_unmaps(void)
{
    enum { THREADS = 4, RELOADS = 40 };
    events_reset();
    const char *dir = t_tmpdir("watch-unmap");
    char src[1024];
    path_in(src, sizeof src, dir, "ver.c");
    write_ver(src, "1");
    opjit_runtime *rt = watching(dir);
    opjit_op *op = NULL;
    if (!rt)
        return;
    CHECK(opjit_load_op(rt, "ver", &op) == OPJIT_OK);
    opjit_op_info before = {.size = sizeof before};
    const opjit_op_decls *decls = NULL;
    CHECK(opjit_op_info_get(rt, op, &before) == OPJIT_OK);
    CHECK(opjit_op_decls_get(rt, op, &decls) == OPJIT_OK);
    atomic_int stop = 0;
    caller c[THREADS];
    pthread_t th[THREADS];
    int started = 0;
    for (; op && started < THREADS; started++) {
        c[started] = (caller){.rt = rt, .op = op, .stop = &stop};
        if (pthread_create(&th[started], NULL, caller_main, &c[started]) != 0)
            break;
    }
    sleep_ms(300);
    int maps0 = count_maps(), reloaded = 0;
    for (int i = 2; i < RELOADS + 2; i++) {
        char v[16];
        snprintf(v, sizeof v, "%d", i);
        int n = count_events();
        write_ver(src, v);
        reloaded += wait_kind(n, OPJIT_WATCH_RELOADED, "/ver.c") >= 0;
    }
    sleep_ms(600); /* an idle look unloads what calls still held */
    int maps1 = count_maps();
    atomic_store(&stop, 1);
    long calls = 0, bad = 0;
    for (int i = 0; i < started; i++) {
        pthread_join(th[i], NULL);
        calls += c[i].calls;
        bad += c[i].bad;
    }
    CHECK(started == THREADS && reloaded == RELOADS);
    CHECKF(calls > 0 && bad == 0, "%ld calls, %ld failed", calls, bad);
    printf("     %d memory maps before %d reloads, %d after\n", maps0, RELOADS, maps1);
    /* Each module kept would add 3 or more (its text, data, relro). */
    CHECKF(maps1 - maps0 < RELOADS, "%d memory maps before %d reloads, %d after", maps0, RELOADS,
           maps1);
    CHECK(call_ver(rt) == (float)(RELOADS + 1));
    opjit_op_info after = {.size = sizeof after};
    CHECK(opjit_op_info_get(rt, op, &after) == OPJIT_OK);
    CHECK(after.schema == before.schema); /* the same text: the same string */
    CHECK(!strcmp(before.schema, "ver() -> Tensor") && !strcmp(before.tier[OPJIT_CPU], "tcc"));
    CHECK(ends_with(before.source[OPJIT_CPU], "/ver.c") && !strcmp(before.doc[OPJIT_CPU], ""));
    CHECK(decls && decls->gradient == OPJIT_GRAD_NONE); /* valid until opjit_destroy */
    opjit_destroy(rt);
}

int main(void)
{
    unsetenv("OPJIT_OPS_PATH");
    T_RUN(test_watch);
    T_RUN(test_dir_replaced);
    T_RUN(test_dir_link_swapped);
    T_RUN(test_symlink_retarget);
    T_RUN(test_delete_recreate);
    T_RUN(test_slow_new_source);
    T_RUN(test_reload_unmaps);
    t_tmpdirs_remove();
    return t_done();
}
