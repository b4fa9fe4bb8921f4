/*
 * cache/cache_redis.c - the connection to the remote cache's Redis server,
 * shared by the threads of a cache. hiredis formats commands and parses
 * replies; the socket and its time limits are ours.
 *
 * Never a hang: connecting is bounded by connect_ms, and each request
 * (sending the command and receiving the whole reply) by timeout_ms, however
 * slowly the server sends. Never unbounded memory: a reply over the
 * request's limit is refused from its header, before its body is read (the
 * connection is then dropped). A failure (refused, timed out, reset)
 * costs that once: the link then backs off for backoff_ms, every command
 * failing at once, and says so with one warning per outage. A connection
 * that broke while idle (the server restarted) is reopened once at once.
 * The socket is close-on-exec, and a process forked with an open
 * connection drops it (never shares it).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "opjit.h"
#include "cache/cache_int.h"
#include "cache/cache_libs.h"
#include "cache/cache_remote.h"

#define REDIS_MAX_REPLY (1u << 20)      /* a reply to anything but GET */
#define REDIS_MAX_ELEMENTS (1 << 20)    /* of one array in a reply */
#define REDIS_READ_CHUNK 16384

struct redis_link {
    char *url;       /* as given, for messages */
    char *host;      /* TCP, or NULL */
    int port;
    char *path;      /* unix socket, or NULL */
    int db;
    int connect_ms, timeout_ms, backoff_ms;
    pthread_mutex_t mu;
    int fd;          /* the connection, or -1 */
    redisReader *reader; /* its reply parser */
    pid_t pid;       /* the process fd belongs to */
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
    r->fd = -1;
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

/* Drop the connection (the protocol state with it). */
static void redis_close(redis_link *r)
{
    if (r->fd >= 0)
        close(r->fd);
    r->fd = -1;
    if (r->reader)
        remote_lib.reader_free(r->reader);
    r->reader = NULL;
}

void redis_link_free(redis_link *r)
{
    if (!r)
        return;
    redis_close(r);
    pthread_mutex_destroy(&r->mu);
    free(r->url);
    free(r->host);
    free(r->path);
    free(r);
}

const char *redis_link_url(const redis_link *r) { return r->url; }

/* ---- replies: hiredis's objects, arrays bounded ----------------------------- */

static redisReplyObjectFunctions redis_fns;
static void *(*redis_array_default)(const redisReadTask *, int);
static pthread_once_t redis_fns_once = PTHREAD_ONCE_INIT;

/* An array header is a count the server chooses: hiredis would allocate
 * that many pointers before a byte of the elements came. */
static void *redis_array_bounded(const redisReadTask *task, int elements)
{
    return elements > REDIS_MAX_ELEMENTS ? NULL : redis_array_default(task, elements);
}

static void redis_fns_init(void)
{
    redisReader *d = remote_lib.reader_create();
    if (!d)
        return;
    redis_fns = *d->fn;
    redis_array_default = d->fn->createArray;
    redis_fns.createArray = redis_array_bounded;
    remote_lib.reader_free(d);
}

static redisReader *redis_reader_new(void)
{
    pthread_once(&redis_fns_once, redis_fns_init);
    return redis_array_default ? remote_lib.reader_create_with(&redis_fns) : NULL;
}

/* ---- the socket ---------------------------------------------------------------- */

/* Wait until fd is ready for events, at most until deadline (monotonic
 * ms). 0, or -1 with errno (ETIMEDOUT when the time is up). A process
 * that was not scheduled until past the deadline still looks once: what
 * is there already was not late. */
static int redis_wait(int fd, short events, int64_t deadline)
{
    for (;;) {
        int64_t left = deadline - redis_now_ms();
        struct pollfd p = {fd, events, 0};
        int n = poll(&p, 1, left <= 0 ? 0 : left > INT_MAX ? INT_MAX : (int)left);
        if (n > 0)
            return 0;
        if (n == 0 && left <= 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        if (n < 0 && errno != EINTR)
            return -1;
    }
}

/* A connected, non-blocking, close-on-exec socket to addr; -1 and errno. */
static int redis_dial_one(const struct sockaddr *addr, socklen_t len, int64_t deadline)
{
    int fd = socket(addr->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int e = 0;
    socklen_t elen = sizeof e;
    if (connect(fd, addr, len) != 0 &&
        (errno != EINPROGRESS || redis_wait(fd, POLLOUT, deadline) != 0 ||
         getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen) != 0 || (errno = e) != 0)) {
        e = errno;
        close(fd);
        errno = e;
        return -1;
    }
    if (addr->sa_family != AF_UNIX) { /* requests are small: no Nagle delay */
        int one = 1;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    }
    return fd;
}

/* Connect r's socket within connect_ms, and by the request's deadline.
 * The fd, or -1 and why. (A host name's lookup is not bounded: docs/deploying.md
 * says to name the server by address.) */
static int redis_dial(const redis_link *r, int64_t request_deadline, char *why, size_t whylen)
{
    int64_t deadline = redis_now_ms() + r->connect_ms;
    if (deadline > request_deadline)
        deadline = request_deadline;
    int fd = -1;
    if (r->path) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        snprintf(sa.sun_path, sizeof sa.sun_path, "%s", r->path);
        fd = redis_dial_one((const struct sockaddr *)&sa, sizeof sa, deadline);
    } else {
        char port[16];
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
                                 .ai_flags = AI_NUMERICSERV}, *ai = NULL;
        snprintf(port, sizeof port, "%d", r->port);
        int g = getaddrinfo(r->host, port, &hints, &ai);
        if (g != 0) {
            snprintf(why, whylen, "cannot connect: %s: %s", r->host, gai_strerror(g));
            return -1;
        }
        errno = EADDRNOTAVAIL;
        for (struct addrinfo *a = ai; a && fd < 0; a = a->ai_next)
            fd = redis_dial_one(a->ai_addr, a->ai_addrlen, deadline);
        freeaddrinfo(ai);
    }
    if (fd < 0)
        snprintf(why, whylen, "cannot connect: %s",
                 errno == ETIMEDOUT ? "no answer in time" : strerror(errno));
    return fd;
}

/* Send all n bytes by deadline. 0, or -1 and errno. MSG_NOSIGNAL: a
 * connection the server closed is an error, never a SIGPIPE. */
static int redis_send(int fd, const char *p, size_t n, int64_t deadline)
{
    while (n > 0) {
        ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (redis_wait(fd, POLLOUT, deadline) != 0)
                return -1;
            continue;
        }
        if (w == 0)
            errno = EPIPE;
        return -1;
    }
    return 0;
}

enum { LINK_IO = -1, LINK_LATE = -2, LINK_BIG = -3, LINK_PROTO = -4 };

/* What a reply's first line announces: LINK_BIG when it is a string
 * longer than max. head collects the line across reads. */
static int redis_head(char head[32], size_t *hl, const char *p, size_t n, size_t max)
{
    if (*hl >= 31 || memchr(head, '\n', *hl))
        return 0;
    size_t take = n < 31 - *hl ? n : 31 - *hl;
    memcpy(head + *hl, p, take);
    *hl += take;
    head[*hl] = '\0';
    if (head[0] != '$' || !strchr(head, '\n'))
        return 0;
    char *end;
    errno = 0;
    unsigned long long v = strtoull(head + 1, &end, 10);
    return head[1] != '-' && (errno || v > max) ? LINK_BIG : 0;
}

/* Receive one whole reply by deadline, at most max bytes of it (and its
 * framing). 0 (*out set) or a LINK_ error. */
static int redis_recv(redis_link *r, size_t max, int64_t deadline, redisReply **out)
{
    char buf[REDIS_READ_CHUNK], head[32] = "";
    size_t hl = 0, got = 0;
    void *rep = NULL;
    for (;;) {
        if (remote_lib.reader_get_reply(r->reader, &rep) != REDIS_OK)
            return LINK_PROTO;
        if (rep) {
            *out = rep;
            return 0;
        }
        if (redis_wait(r->fd, POLLIN, deadline) != 0)
            return errno == ETIMEDOUT ? LINK_LATE : LINK_IO;
        ssize_t n = read(r->fd, buf, sizeof buf);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = ECONNRESET;
            return LINK_IO;
        }
        got += (size_t)n;
        if (redis_head(head, &hl, buf, (size_t)n, max) || got > max + 64)
            return LINK_BIG;
        if (remote_lib.reader_feed(r->reader, buf, (size_t)n) != REDIS_OK)
            return LINK_PROTO;
    }
}

/* One command and its reply on r's connection, by deadline. 0 (*out set)
 * or a LINK_ error. */
static int redis_exchange(redis_link *r, int argc, const char **argv, const size_t *lens,
                          size_t max, int64_t deadline, redisReply **out)
{
    char *cmd = NULL;
    int len = remote_lib.format_argv(&cmd, argc, argv, lens);
    if (len < 0) {
        errno = ENOMEM;
        return LINK_IO;
    }
    int rc = redis_send(r->fd, cmd, (size_t)len, deadline);
    remote_lib.free_command(cmd);
    if (rc != 0)
        return errno == ETIMEDOUT ? LINK_LATE : LINK_IO;
    return redis_recv(r, max, deadline, out);
}

static void redis_why(int rc, const redis_link *r, char *why, size_t whylen)
{
    if (rc == LINK_LATE)
        snprintf(why, whylen, "no answer in time");
    else if (rc == LINK_PROTO)
        snprintf(why, whylen, "a malformed reply (%s)",
                 r->reader ? r->reader->errstr : "out of memory");
    else if (rc == LINK_BIG)
        snprintf(why, whylen, "a reply over the size limit");
    else
        snprintf(why, whylen, "%s", strerror(errno));
}

/* Connect (and select the database) by deadline. 0, or -1 and why. */
static int redis_connect(redis_link *r, int64_t deadline, char *why, size_t whylen)
{
    if ((r->fd = redis_dial(r, deadline, why, whylen)) < 0)
        return -1;
    if (!(r->reader = redis_reader_new())) {
        snprintf(why, whylen, "out of memory");
        redis_close(r);
        return -1;
    }
    r->pid = getpid();
    if (!r->db)
        return 0;
    char db[16];
    snprintf(db, sizeof db, "%d", r->db);
    const char *argv[] = {"SELECT", db};
    redisReply *rep = NULL;
    int rc = redis_exchange(r, 2, argv, NULL, REDIS_MAX_REPLY, deadline, &rep);
    int ok = rc == 0 && rep->type == REDIS_REPLY_STATUS;
    if (rc != 0)
        redis_why(rc, r, why, whylen);
    else if (!ok)
        snprintf(why, whylen, "SELECT %d failed: %.200s", r->db,
                 rep->type == REDIS_REPLY_ERROR ? rep->str : "an unexpected reply");
    if (rep)
        remote_lib.free_reply(rep);
    if (!ok)
        redis_close(r);
    return ok ? 0 : -1;
}

/* The command on a connection: reconnecting when there is none, and once
 * more when a connection kept from before turned out broken (not slow).
 * OPJIT_OK (*out set), OPJIT_ECACHE or OPJIT_EIO (why). */
static int redis_try(redis_link *r, int argc, const char **argv, const size_t *lens, size_t max,
                     redisReply **out, char *why, size_t whylen)
{
    int64_t deadline = redis_now_ms() + r->timeout_ms;
    for (int attempt = 0; attempt < 2; attempt++) {
        if (r->fd >= 0 && r->pid != getpid())
            redis_close(r); /* a forked copy: never talk on the parent's socket */
        int fresh = r->fd < 0;
        if (fresh && redis_connect(r, deadline, why, whylen) != 0)
            return OPJIT_EIO;
        int rc = redis_exchange(r, argc, argv, lens, max, deadline, out);
        if (rc == 0)
            return OPJIT_OK;
        redis_why(rc, r, why, whylen);
        redis_close(r); /* its state is unknown: a reply may be in flight */
        if (rc == LINK_BIG)
            return OPJIT_ECACHE;
        if (fresh || rc != LINK_IO)
            return OPJIT_EIO;
    }
    return OPJIT_EIO;
}

int redis_request(const cache *c, redis_link *r, int argc, const char **argv,
                  const size_t *lens, size_t max_reply, redisReply **out)
{
    char why[256] = "";
    *out = NULL;
    pthread_mutex_lock(&r->mu);
    int rc = OPJIT_EIO;
    if (r->down_until && redis_now_ms() < r->down_until)
        goto out;
    rc = redis_try(r, argc, argv, lens, max_reply, out, why, sizeof why);
    if (rc != OPJIT_EIO) {
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
    return rc;
}

redisReply *redis_run(const cache *c, redis_link *r, int argc, const char **argv,
                      const size_t *lens)
{
    redisReply *rep;
    return redis_request(c, r, argc, argv, lens, REDIS_MAX_REPLY, &rep) == OPJIT_OK ? rep
                                                                                       : NULL;
}

int redis_down(redis_link *r)
{
    pthread_mutex_lock(&r->mu);
    int down = r->down_until && redis_now_ms() < r->down_until;
    pthread_mutex_unlock(&r->mu);
    return down;
}
