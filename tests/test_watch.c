/* tests/test_watch.c - cfg.watch (loader/watch.c): an editor-like burst of
 * writes makes one reload and the new code serves calls; so does an edit of
 * a local header and a save by rename; a broken edit keeps the old kernels
 * and reports the compile error with file:line; a new source is loadable
 * by name; a deleted one is unloaded; opjit_destroy stops the watcher. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "opjit.h"
#include "t.h"
#include "t_files.h"
#include "t_ops.h"

#define MAX_EVENTS 64

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
             "    opjit_def(m, \"ver_twin() -> Tensor\", OPJIT_CPU, k, \"\");\n}\n",
             header ? "#include \"ver.h\"\n" : "", value);
}

static float call_ver(opjit_runtime *rt)
{
    opjit_op *op = NULL;
    return opjit_find_op(rt, "ver", &op) == OPJIT_OK ? t_call_f32(rt, op) : -1;
}

/* Save path as an editor that truncates and writes in pieces does. */
static void save_in_pieces(const char *path, const char *text)
{
    size_t len = strlen(text), third = len / 3;
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f)
        return;
    for (int i = 0; i < 3; i++) {
        size_t n = i < 2 ? third : len - 2 * third;
        CHECK(fwrite(text + i * third, 1, n, f) == n);
        fflush(f);
        sleep_ms(3);
    }
    CHECK(fclose(f) == 0);
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
    CHECKF(events[i].kind == kind, "event %d, expected %d (%s)", events[i].kind, kind,
           events[i].message);
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
    opjit_config_init(&cfg);
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
    save_in_pieces(path, text);
    expect_one(n, OPJIT_WATCH_RELOADED);
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
    save_in_pieces(path, text);
    expect_one(n, OPJIT_WATCH_FAILED);
    if (count_events() > n) {
        CHECK(events[n].status == OPJIT_ECOMPILE);
        CHECK_STR_CONTAINS(events[n].message, "ver.c:11: error");
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

int main(void)
{
    unsetenv("OPJIT_OPS_PATH");
    T_RUN(test_watch);
    t_tmpdirs_remove();
    return t_done();
}
