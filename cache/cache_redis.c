/*
 * cache/cache_redis.c - the connection to the remote cache's Redis server
 * (hiredis, blocking, with time limits), shared by the threads of a cache.
 *
 * Never a hang: connecting is bounded by connect_ms and every read or
 * write of a request by timeout_ms. A failure (refused, timed out, reset)
 * costs that once: the link then backs off for backoff_ms, every command
 * failing at once, and says so with one warning per outage. A connection
 * that broke while idle (the server restarted) is reopened once at once.
 * A process forked with an open connection drops it (never shares it).
 */
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <hiredis/hiredis.h>

#include "opjit.h"
#include "cache/cache_int.h"
#include "cache/cache_remote.h"

struct redis_link {
    char *url;       /* as given, for messages */
    char *host;      /* TCP, or NULL */
    int port;
    char *path;      /* unix socket, or NULL */
    int db;
    int connect_ms, timeout_ms, backoff_ms;
    pthread_mutex_t mu;
    redisContext *ctx;
    pid_t pid;       /* the process ctx belongs to */
    int64_t down_until; /* monotonic ms; 0: up */
    int warned;      /* this outage was warned about */
};

static int64_t redis_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static int redis_parse_db(const char *s, int *db)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < 0 || v > 100000)
        return -1;
    *db = (int)v;
    return 0;
}

/* "HOST[:PORT][/DB]" into r. 0 or -1. */
static int redis_parse_tcp(redis_link *r, const char *s)
{
    const char *slash = strchr(s, '/');
    size_t hl = slash ? (size_t)(slash - s) : strlen(s);
    char hostport[300];
    if (hl == 0 || hl >= sizeof hostport || strchr(s, '@'))
        return -1;
    memcpy(hostport, s, hl);
    hostport[hl] = '\0';
    if (slash && slash[1] && redis_parse_db(slash + 1, &r->db) != 0)
        return -1;
    r->port = 6379;
    char *colon = hostport[0] == '[' ? NULL : strrchr(hostport, ':');
    if (colon) {
        *colon = '\0';
        char *end;
        long p = strtol(colon + 1, &end, 10);
        if (end == colon + 1 || *end || p <= 0 || p > 65535)
            return -1;
        r->port = (int)p;
    }
    return hostport[0] && (r->host = strdup(hostport)) ? 0 : -1;
}

/* "/path[?db=N]" into r. 0 or -1. */
static int redis_parse_unix(redis_link *r, const char *s)
{
    const char *q = strchr(s, '?');
    size_t n = q ? (size_t)(q - s) : strlen(s);
    if (s[0] != '/' || n < 2 || n >= 108)
        return -1;
    if (q && (strncmp(q, "?db=", 4) != 0 || redis_parse_db(q + 4, &r->db) != 0))
        return -1;
    return (r->path = strndup(s, n)) ? 0 : -1;
}

redis_link *redis_link_new(const char *url, int connect_ms, int timeout_ms, int backoff_ms,
                           char *why, size_t whylen)
{
    redis_link *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    pthread_mutex_init(&r->mu, NULL);
    if (!(r->url = strdup(url))) {
        redis_link_free(r);
        snprintf(why, whylen, "out of memory");
        return NULL;
    }
    int bad = -1;
    if (!strncmp(url, "redis://", 8))
        bad = redis_parse_tcp(r, url + 8);
    else if (!strncmp(url, "redis+unix://", 13))
        bad = redis_parse_unix(r, url + 13);
    if (bad) {
        snprintf(why, whylen, "'%s' is not redis://HOST[:PORT][/DB] or "
                 "redis+unix:///PATH[?db=N]", url);
        redis_link_free(r);
        return NULL;
    }
    r->connect_ms = connect_ms;
    r->timeout_ms = timeout_ms;
    r->backoff_ms = backoff_ms;
    return r;
}

void redis_link_free(redis_link *r)
{
    if (!r)
        return;
    if (r->ctx)
        redisFree(r->ctx);
    pthread_mutex_destroy(&r->mu);
    free(r->url);
    free(r->host);
    free(r->path);
    free(r);
}

const char *redis_link_url(const redis_link *r) { return r->url; }

static struct timeval redis_tv(int ms)
{
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    return tv;
}

/* Connect (and select the database). NULL and why on failure. */
static redisContext *redis_connect(redis_link *r, char *why, size_t whylen)
{
    redisContext *ctx = r->path ? redisConnectUnixWithTimeout(r->path, redis_tv(r->connect_ms))
                                : redisConnectWithTimeout(r->host, r->port, redis_tv(r->connect_ms));
    if (!ctx || ctx->err) {
        snprintf(why, whylen, "cannot connect: %s", ctx ? ctx->errstr : "out of memory");
        if (ctx)
            redisFree(ctx);
        return NULL;
    }
    if (redisSetTimeout(ctx, redis_tv(r->timeout_ms)) != REDIS_OK) {
        snprintf(why, whylen, "cannot set a time limit: %s", ctx->errstr);
        redisFree(ctx);
        return NULL;
    }
    if (r->db) {
        redisReply *rep = redisCommand(ctx, "SELECT %d", r->db);
        int ok = rep && rep->type == REDIS_REPLY_STATUS;
        if (!ok)
            snprintf(why, whylen, "SELECT %d failed: %s", r->db,
                     rep && rep->type == REDIS_REPLY_ERROR ? rep->str : ctx->errstr);
        if (rep)
            freeReplyObject(rep);
        if (!ok) {
            redisFree(ctx);
            return NULL;
        }
    }
    return ctx;
}

/* hiredis write()s: writing to a connection the server closed raises
 * SIGPIPE, which would kill the host. It is blocked in this thread around
 * our I/O, and one raised meanwhile is taken off before unblocking. */
static int redis_sigpipe_block(sigset_t *old)
{
    sigset_t set, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pending);
    pthread_sigmask(SIG_BLOCK, &set, old);
    return sigismember(&pending, SIGPIPE) == 1; /* the host's own, left alone */
}

static void redis_sigpipe_restore(const sigset_t *old, int was_pending)
{
    sigset_t set, pending;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    sigpending(&pending);
    if (!was_pending && sigismember(&pending, SIGPIPE) == 1) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&set, NULL, &zero) < 0 && errno == EINTR)
            ;
    }
    pthread_sigmask(SIG_SETMASK, old, NULL);
}

/* The command on a connection: reconnecting when there is none, and once
 * more when a connection kept from before turned out broken (not slow). */
static redisReply *redis_try(redis_link *r, int argc, const char **argv, const size_t *lens,
                             char *why, size_t whylen)
{
    for (int attempt = 0; attempt < 2; attempt++) {
        int fresh = !r->ctx;
        if (r->ctx && r->pid != getpid()) {
            redisFree(r->ctx); /* a forked copy: never talk on the parent's socket */
            r->ctx = NULL;
            fresh = 1;
        }
        if (!r->ctx && !(r->ctx = redis_connect(r, why, whylen)))
            return NULL;
        r->pid = getpid();
        errno = 0;
        redisReply *rep = redisCommandArgv(r->ctx, argc, argv, lens);
        int e = errno;
        if (rep)
            return rep;
        int timed_out = r->ctx->err == REDIS_ERR_IO && (e == EAGAIN || e == EWOULDBLOCK);
        snprintf(why, whylen, "%s", timed_out ? "no answer in time" : r->ctx->errstr);
        redisFree(r->ctx);
        r->ctx = NULL;
        if (fresh || timed_out)
            return NULL;
    }
    return NULL;
}

redisReply *redis_run(const cache *c, redis_link *r, int argc, const char **argv,
                      const size_t *lens)
{
    char why[256] = "";
    pthread_mutex_lock(&r->mu);
    int64_t now = redis_now_ms();
    redisReply *rep = NULL;
    if (r->down_until && now < r->down_until)
        goto out;
    sigset_t old;
    int pending = redis_sigpipe_block(&old);
    rep = redis_try(r, argc, argv, lens, why, sizeof why);
    redis_sigpipe_restore(&old, pending);
    if (rep) {
        r->down_until = 0;
        r->warned = 0;
        goto out;
    }
    r->down_until = redis_now_ms() + r->backoff_ms;
    if (!r->down_until)
        r->down_until = 1;
    if (!r->warned) {
        r->warned = 1;
        cache_logf(c, OPJIT_LOG_WARN,
                   "cache: remote cache %s: %s; not used for %d s (loads go on locally)", r->url,
                   why, r->backoff_ms / 1000);
    }
out:
    pthread_mutex_unlock(&r->mu);
    return rep;
}

int redis_down(redis_link *r)
{
    pthread_mutex_lock(&r->mu);
    int down = r->down_until && redis_now_ms() < r->down_until;
    pthread_mutex_unlock(&r->mu);
    return down;
}
