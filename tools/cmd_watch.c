/*
 * tools/cmd_watch.c - `opjit watch`: an op author's edit loop. Loads every
 * source on the search path, then prints one line per event (loaded,
 * reloaded, failed, removed) as sources are edited, added and deleted,
 * until SIGINT or SIGTERM.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"

static const char watch_help[] =
    "usage: opjit watch [options]\n"
    "\n"
    "Load every operator source on the search path (--ops-path DIR, then\n"
    "$OPJIT_OPS_PATH; a name an earlier directory has is shadowed), then\n"
    "watch the sources and their local headers: an edited source is\n"
    "recompiled and its kernels swapped in, a new one is loaded, a deleted\n"
    "one unloaded. A source is followed by its path: a symlink retargeted or\n"
    "a directory replaced loads what the path names now. One line per event\n"
    "on stdout:\n"
    "\n"
    "  loaded PATH: OP, OP...        a source was loaded, with its ops\n"
    "  reloaded PATH (MS ms)         an edit is live, MS after the save\n"
    "  failed PATH: MESSAGE          a source does not compile or load (the\n"
    "                                compiler's file:line diagnostics follow,\n"
    "                                indented); the old kernels keep serving\n"
    "  removed PATH                  a loaded source was deleted (and not back\n"
    "                                within a second; it is loaded again when it is)\n"
    "  skipped PATH: WHY             a .cu source CUDA cannot serve here\n"
    "\n"
    "Runs until interrupted (Ctrl-C, SIGTERM), then exits with status 0.\n"
    "\n"
    "options:\n";

static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;
static int stop_pipe[2] = {-1, -1};
/* Set once opjit_create returned: the watcher may report before. */
static _Atomic(opjit_runtime *) watch_rt;

typedef struct op_names {
    opjit_runtime *rt;
    const char *path;
    char buf[1024];
    size_t n;
} op_names;

static int add_name(void *ud, const opjit_op *op)
{
    op_names *o = ud;
    opjit_op_info oi = {.size = sizeof oi};
    if (opjit_op_info_get(o->rt, op, &oi) != OPJIT_OK)
        return 0;
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++)
        if (oi.source[d] && cli_same_file(oi.source[d], o->path) && o->n < sizeof o->buf) {
            o->n += (size_t)snprintf(o->buf + o->n, sizeof o->buf - o->n, "%s%s",
                                     o->n ? ", " : "", oi.name);
            break;
        }
    return 0;
}

/* "failed PATH: MESSAGE", its further lines indented. */
static void print_failed(const char *path, const char *msg)
{
    printf("failed %s", strstr(msg, path) == msg ? "" : path);
    printf("%s", strstr(msg, path) == msg ? "" : ": ");
    for (const char *p = msg; *p; p++) {
        putchar(*p);
        if (*p == '\n' && p[1])
            fputs("    ", stdout);
    }
    if (!*msg || msg[strlen(msg) - 1] != '\n')
        putchar('\n');
}

/* Load path and say how it went. A relative path is made absolute as the
 * watcher spells the paths of its events (the cwd before it, symlinks
 * kept), so that one source has one name in every line. */
static void load_and_say(opjit_runtime *rt, const char *given)
{
    char cwd[4096], abs[8192];
    const char *path = given;
    if (given[0] != '/' && getcwd(cwd, sizeof cwd) &&
        (size_t)snprintf(abs, sizeof abs, "%s/%s", cwd, given) < sizeof abs)
        path = abs;
    int rc = opjit_load_file(rt, path, NULL, NULL);
    pthread_mutex_lock(&out_lock);
    if (rc == OPJIT_EDEVICE) {
        printf("skipped %s: %s\n", path, opjit_errmsg(rt)); /* CUDA cannot serve it here */
    } else if (rc != OPJIT_OK) {
        print_failed(path, opjit_errmsg(rt));
    } else {
        op_names o = {.rt = rt, .path = path};
        opjit_list(rt, add_name, &o);
        printf("loaded %s: %s\n", path, o.n ? o.buf : "(no ops)");
    }
    fflush(stdout);
    pthread_mutex_unlock(&out_lock);
}

static void on_event(void *ud, const opjit_watch_event *ev)
{
    (void)ud;
    opjit_runtime *rt = atomic_load(&watch_rt);
    if (ev->kind == OPJIT_WATCH_ADDED) {
        if (rt)
            load_and_say(rt, ev->path);
        return;
    }
    pthread_mutex_lock(&out_lock);
    if (ev->kind == OPJIT_WATCH_RELOADED)
        printf("reloaded %s (%.1f ms)\n", ev->path, ev->ms);
    else if (ev->kind == OPJIT_WATCH_FAILED)
        print_failed(ev->path, ev->message);
    else if (ev->kind == OPJIT_WATCH_REMOVED)
        printf("removed %s\n", ev->path);
    fflush(stdout);
    pthread_mutex_unlock(&out_lock);
}

typedef struct startup {
    opjit_runtime *rt;
    cli_strs taken; /* "dir/stem" of each op name loaded, as a load by name picks */
} startup;

/* Every source on the search path but those an earlier directory shadows. */
static int load_each(void *ud, const char *path)
{
    startup *st = ud;
    const char *file = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    size_t stem = cli_source_stem(file);
    for (int i = 0; i < st->taken.n; i++) {
        const char *t = st->taken.v[i], *tf = strrchr(t, '/') ? strrchr(t, '/') + 1 : t;
        if (strlen(tf) != stem || strncmp(tf, file, stem))
            continue;
        size_t dirlen = (size_t)(file - path);
        if ((size_t)(tf - t) == dirlen && !strncmp(t, path, dirlen))
            load_and_say(st->rt, path); /* nms.cu beside nms.c */
        return 0;                       /* else an earlier directory shadows it */
    }
    char key[4096];
    snprintf(key, sizeof key, "%.*s", (int)((size_t)(file - path) + stem), path);
    if (cli_strs_add(&st->taken, key) != 0)
        return 1;
    load_and_say(st->rt, path);
    return 0;
}

static void on_signal(int sig)
{
    (void)sig;
    int e = errno;
    ssize_t r = write(stop_pipe[1], "x", 1);
    (void)r;
    errno = e;
}

/* SIGINT and SIGTERM write to stop_pipe. */
static int catch_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (pipe(stop_pipe) != 0 || sigaction(SIGINT, &sa, NULL) || sigaction(SIGTERM, &sa, NULL)) {
        fprintf(stderr, "opjit: watch: %s\n", strerror(errno));
        return -1;
    }
    return 0;
}

static void wait_for_signal(void)
{
    char c;
    while (read(stop_pipe[0], &c, 1) < 0 && errno == EINTR)
        ;
}

/* The runtime, its threads started with SIGINT and SIGTERM blocked, so
 * that the signals reach this thread. */
static int create_watching(opjit_runtime **rt)
{
    opjit_config cfg;
    cli_config(&cfg);
    cfg.watch = 1;
    cfg.watch_fn = on_event;
    sigset_t set, old;
    sigemptyset(&set);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &set, &old);
    int rc = cli_create_with(&cfg, rt);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    atomic_store(&watch_rt, *rt);
    return rc;
}

int cmd_watch(int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        if (cli_is_help(argv[i])) {
            printf("%s%s", watch_help, cli_common_help);
            return CLI_EXIT_OK;
        }
        int r = cli_common_option(argc, argv, &i);
        if (r == CLI_EXIT_USAGE)
            return r;
        if (r != 1)
            return cli_usage_error("watch", "unexpected argument '%s'", argv[i]);
        i--;
    }
    opjit_runtime *rt = NULL;
    if (catch_signals() != 0)
        return CLI_EXIT_FAIL;
    int rc = create_watching(&rt);
    startup st = {.rt = rt};
    if (rc == CLI_EXIT_OK && opjit_sources(rt, NULL, load_each, &st) != OPJIT_OK)
        rc = CLI_EXIT_FAIL;
    cli_strs_free(&st.taken);
    if (rc == CLI_EXIT_OK) {
        pthread_mutex_lock(&out_lock);
        printf("watching %s\n", opjit_ops_path(rt));
        fflush(stdout);
        pthread_mutex_unlock(&out_lock);
        wait_for_signal();
    }
    atomic_store(&watch_rt, NULL);
    opjit_destroy(rt);
    return rc;
}
