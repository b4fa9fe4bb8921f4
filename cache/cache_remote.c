/*
 * cache/cache_remote.c - the remote layer: a Redis server shared by a
 * fleet, behind the writable cache. See cache_remote.h for the format of a
 * value.
 *
 * A local miss asks the remote; a value found is verified (signature,
 * key, then the entry's own checks) in tmp/ and renamed into entries/, so
 * nothing remote reaches the loader unchecked. A build is stored in the
 * remote as well (SET NX: the first writer wins). Only one process per
 * fleet builds a key at a time: it holds "opjit:v1:lock:<hex>" (SET NX PX
 * lease, expiring if it dies) while the others poll for its value, and
 * build themselves when it does not come in time.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/random.h>

#include "opjit.h"
#include "cache/cache_int.h"
#include "cache/cache_libs.h"
#include "cache/cache_remote.h"

#define REMOTE_MAX_VALUE (256u << 20) /* larger entries are not shared */
#define REMOTE_MAX_SECTIONS 4097
#define REMOTE_HEAD_ROOM 128
#define REMOTE_POLL_MS 20

struct cache_remote {
    redis_link *link;
    char *key_file;     /* as configured, or NULL */
    unsigned char *key; /* the fleet key; NULL: unsigned mode */
    size_t keylen;
    int ro;             /* OPJIT_REMOTE_MODE=ro: never write */
    int push_hits;      /* also store entries found locally */
    int lease_ms;       /* of the fleet build lock */
    atomic_int warned_full;
};

/* ---- opening -------------------------------------------------------------- */

/* A duration setting in ms: the config's, else dflt. */
static int remote_ms(int cfg_ms, int dflt)
{
    return cfg_ms > 0 ? cfg_ms : dflt;
}

/* The fleet key, or unsigned mode; -1 (warned) when the layer must stay off. */
static int remote_trust(cache *c, cache_remote *r, const cache_config *cfg, const char *url)
{
    const char *file = cfg->remote_key_file;
    char why[PATH_MAX + 128];
    if (file && *file) {
        if (!(r->key_file = strdup(file)))
            return -1;
        if (sign_key_load(file, c->euid, &r->key, &r->keylen, why, sizeof why) == 0)
            return 0;
        cache_logf(c, OPJIT_LOG_WARN, "cache: remote cache %s is not used: fleet key: %s", url,
                   why);
        return -1;
    }
    if (cfg->remote_unsigned)
        return 0;
    cache_logf(c, OPJIT_LOG_WARN,
               "cache: remote cache %s is not used: no fleet key (set OPJIT_REMOTE_KEY_FILE; "
               "OPJIT_REMOTE_TRUST=unsigned uses it unsigned, which lets anyone who can write "
               "to the server run code here)", url);
    return -1;
}

int cache_remote_open(cache *c, const cache_config *cfg, cache_remote **out)
{
    *out = NULL;
    const char *url = cfg->remote_url;
    if (!url || !*url || c->disabled)
        return OPJIT_OK;
    if (!(c->remote_url = strdup(url)))
        return OPJIT_ENOMEM;
    if (!c->writable) {
        cache_logf(c, OPJIT_LOG_WARN, "cache: remote cache %s is not used: it needs a usable "
                   "local cache directory", url);
        return OPJIT_OK;
    }
    cache_remote *r = calloc(1, sizeof *r);
    if (!r)
        return OPJIT_ENOMEM;
    r->ro = cfg->remote_ro == 1;
    r->push_hits = cfg->remote_push == 1;
    r->lease_ms = remote_ms(cfg->remote_lease_ms, 20000);
    int connect_ms = remote_ms(cfg->remote_connect_timeout_ms, 50);
    int timeout_ms = remote_ms(cfg->remote_timeout_ms, 3000);
    int backoff_ms = remote_ms(cfg->remote_backoff_ms, 30000);
    char why[512];
    if (remote_trust(c, r, cfg, url) != 0) {
        cache_remote_close(r);
        return OPJIT_OK;
    }
    /* The client and the crypto library are loaded now, for the first
     * time in the process: a host without a remote never pays for them. */
    if (!remote_libs_get(why, sizeof why)) {
        cache_logf(c, OPJIT_LOG_WARN, "cache: remote cache %s is not used: %s", url, why);
        cache_remote_close(r);
        return OPJIT_OK;
    }
    r->link = redis_link_new(url, connect_ms, timeout_ms, backoff_ms, why, sizeof why);
    if (!r->link) {
        cache_logf(c, OPJIT_LOG_WARN, "cache: remote cache: %s; not used", why);
        cache_remote_close(r);
        return OPJIT_OK;
    }
    *out = r;
    return OPJIT_OK;
}

void cache_remote_close(cache_remote *r)
{
    if (!r)
        return;
    redis_link_free(r->link);
    free(r->key_file);
    sign_key_free(r->key, r->keylen);
    free(r);
}

int cache_remote_push_hits(const cache *c)
{
    return c->remote && c->remote->push_hits && !c->remote->ro;
}

/* ---- a growing buffer -------------------------------------------------------- */

typedef struct rbuf {
    char *p;
    size_t len, cap;
    int bad; /* out of memory, or too large */
} rbuf;

static char *rbuf_room(rbuf *b, size_t n)
{
    if (b->bad || n > REMOTE_MAX_VALUE || b->len + n > REMOTE_MAX_VALUE) {
        b->bad = 1;
        return NULL;
    }
    if (b->len + n > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->len + n)
            cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->bad = 1;
            return NULL;
        }
        b->p = p;
        b->cap = cap;
    }
    char *at = b->p + b->len;
    b->len += n;
    return at;
}

static void rbuf_printf(rbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void rbuf_printf(rbuf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    char *at = n < 0 || (size_t)n >= sizeof tmp ? (b->bad = 1, NULL) : rbuf_room(b, (size_t)n);
    if (at)
        memcpy(at, tmp, (size_t)n);
}

/* Append "<size> <name>\n" and the file's size bytes. 0 or -1. */
static int rbuf_file(rbuf *b, int dfd, const char *name, uint64_t size)
{
    rbuf_printf(b, "%" PRIu64 " %s\n", size, name);
    char *at = size > REMOTE_MAX_VALUE ? (b->bad = 1, NULL) : rbuf_room(b, (size_t)size);
    int fd = at ? openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
    size_t got = 0;
    while (fd >= 0 && got < size) {
        ssize_t n = read(fd, at + got, (size_t)size - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    if (fd >= 0)
        close(fd);
    return at && got == size ? 0 : -1;
}

/* ---- values ------------------------------------------------------------------- */

static void remote_rkey(char *out, size_t n, const char *prefix, const char *hex)
{
    snprintf(out, n, "%s%s", prefix, hex);
}

static void remote_hex(const unsigned char *b, size_t n, char *out)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        out[2 * i] = d[b[i] >> 4];
        out[2 * i + 1] = d[b[i] & 15];
    }
    out[2 * n] = '\0';
}

/* The value of the entry in dir: *base (malloc'd) holds it at *val, *len
 * bytes. 0, or -1 when it cannot be made (why). */
static int remote_encode(cache *c, const cache_remote *r, const char *hex, const char *rkey,
                         const char *dir, char **base, const char **val, size_t *len, char *why,
                         size_t whylen)
{
    cache_manifest m;
    rbuf b = {0};
    *base = NULL;
    if (cache_check(c, dir, hex, CACHE_CHK_OWNER, &m, why, whylen) != OPJIT_OK)
        return -1;
    uint64_t msize = m.size;
    for (int i = 0; i < m.nart; i++)
        msize -= m.art[i].size;
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    rbuf_room(&b, REMOTE_HEAD_ROOM);
    rbuf_printf(&b, "key %s\n", hex);
    int bad = dfd < 0 || rbuf_file(&b, dfd, "manifest", msize) != 0;
    for (int i = 0; i < m.nart && !bad; i++)
        bad = rbuf_file(&b, dfd, m.art[i].name, m.art[i].size) != 0;
    rbuf_printf(&b, "end\n");
    cache_manifest_free(&m);
    if (dfd >= 0)
        close(dfd);
    char head[REMOTE_HEAD_ROOM];
    unsigned char mac[SIGN_MAC_LEN];
    char machex[2 * SIGN_MAC_LEN + 1];
    if (!bad && !b.bad && r->key &&
        sign_compute(r->key, r->keylen, rkey, b.p + REMOTE_HEAD_ROOM, b.len - REMOTE_HEAD_ROOM,
                     mac) != 0)
        bad = 1;
    if (bad || b.bad) {
        snprintf(why, whylen, "cannot read the entry %s (or it is over %u MiB)", dir,
                 REMOTE_MAX_VALUE >> 20);
        free(b.p);
        return -1;
    }
    if (r->key)
        remote_hex(mac, sizeof mac, machex);
    int hl = snprintf(head, sizeof head, "opjit-remote 1 %s%s\n", r->key ? "hmac-sha256 " : "unsigned",
                      r->key ? machex : "");
    memcpy(b.p + REMOTE_HEAD_ROOM - hl, head, (size_t)hl);
    *base = b.p;
    *val = b.p + REMOTE_HEAD_ROOM - hl;
    *len = b.len - REMOTE_HEAD_ROOM + (size_t)hl;
    return 0;
}

/* The header line of a value: how it is signed (*how, *hl bytes: "unsigned"
 * or "hmac-sha256 <64 hex>"). Returns the body, or NULL and why when no
 * opjit writes such a value (damaged, whatever the key). */
static const char *remote_head(const char *val, size_t len, const char **how, size_t *hl,
                               size_t *blen, char *why, size_t whylen)
{
    static const char magic[] = "opjit-remote 1 ";
    const char *nl = memchr(val, '\n', len < REMOTE_HEAD_ROOM ? len : REMOTE_HEAD_ROOM);
    if (!nl || strncmp(val, magic, sizeof magic - 1) != 0) {
        snprintf(why, whylen, "not an opjit remote entry (or truncated)");
        return NULL;
    }
    *how = val + sizeof magic - 1;
    *hl = (size_t)(nl - *how);
    *blen = len - (size_t)(nl + 1 - val);
    if (*hl == 8 && !strncmp(*how, "unsigned", 8))
        return nl + 1;
    int ok = *hl == 12 + 2 * SIGN_MAC_LEN && !strncmp(*how, "hmac-sha256 ", 12);
    for (size_t i = 12; ok && i < *hl; i++)
        ok = ((*how)[i] >= '0' && (*how)[i] <= '9') || ((*how)[i] >= 'a' && (*how)[i] <= 'f');
    if (!ok) {
        snprintf(why, whylen, "its signature is malformed");
        return NULL;
    }
    return nl + 1;
}

/* Whether the body was signed with our key (always, in unsigned mode): 1,
 * or 0 and why. A value that fails may be another fleet key's (a key
 * rotation) as well as altered. */
static int remote_verify(const cache_remote *r, const char *rkey, const char *how, size_t hl,
                         const char *body, size_t blen, char *why, size_t whylen)
{
    unsigned char mac[SIGN_MAC_LEN];
    char want[2 * SIGN_MAC_LEN + 1];
    if (!r->key)
        return 1; /* unsigned mode: the signature is not checked */
    if (hl == 8) {
        snprintf(why, whylen, "it is unsigned, and this cache requires signatures");
        return 0;
    }
    if (sign_compute(r->key, r->keylen, rkey, body, blen, mac) != 0) {
        snprintf(why, whylen, "its signature cannot be computed");
        return 0;
    }
    remote_hex(mac, sizeof mac, want);
    if (!sign_equal((const unsigned char *)want, (const unsigned char *)how + 12) ||
        !sign_equal((const unsigned char *)want + SIGN_MAC_LEN,
                    (const unsigned char *)how + 12 + SIGN_MAC_LEN)) {
        snprintf(why, whylen, "bad signature (signed with another key, or altered)");
        return 0;
    }
    return 1;
}

/* One section header "<size> <name>\n" at *p (end: e). 0 with name (NUL
 * terminated, in out) and size, or -1. */
static int remote_section(const char **p, const char *e, char *name, size_t namelen,
                          uint64_t *size)
{
    const char *nl = memchr(*p, '\n', (size_t)(e - *p) < 300 ? (size_t)(e - *p) : 300);
    const char *sp = nl ? memchr(*p, ' ', (size_t)(nl - *p)) : NULL;
    if (!sp || sp == *p || (size_t)(nl - sp - 1) >= namelen || nl == sp + 1)
        return -1;
    uint64_t v = 0;
    for (const char *d = *p; d < sp; d++) {
        if (*d < '0' || *d > '9' || v > REMOTE_MAX_VALUE)
            return -1;
        v = v * 10 + (uint64_t)(*d - '0');
    }
    memcpy(name, sp + 1, (size_t)(nl - sp - 1));
    name[nl - sp - 1] = '\0';
    if (strchr(name, '/') || !strcmp(name, ".") || !strcmp(name, "..") || v > (uint64_t)(e - nl - 1))
        return -1;
    for (const char *s = name; *s; s++)
        if ((unsigned char)*s < 0x20 || *s == 0x7f)
            return -1;
    *size = v;
    *p = nl + 1;
    return 0;
}

static int remote_write(int dfd, const char *name, const char *data, size_t n)
{
    int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return errno;
    size_t off = 0;
    while (off < n) {
        ssize_t w = write(fd, data + off, n - off);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            break;
        off += (size_t)w;
    }
    int e = off == n ? 0 : errno ? errno : ENOSPC;
    if (close(fd) != 0 && !e)
        e = errno;
    return e;
}

/* What unpacking a value found, as statuses: UNPACK_BAD (OPJIT_ECACHE):
 * the value is damaged for every reader (malformed, or its files fail
 * their manifest); UNPACK_FOREIGN (OPJIT_EEXIST): intact, but not signed
 * with our key; UNPACK_LOCAL (OPJIT_EIO): we failed. */
#define UNPACK_OK OPJIT_OK
#define UNPACK_BAD OPJIT_ECACHE
#define UNPACK_LOCAL OPJIT_EIO
#define UNPACK_FOREIGN OPJIT_EEXIST

/* The files of body into the empty directory dfd: UNPACK_OK (*n sections
 * written), UNPACK_BAD (the value is wrong) or UNPACK_LOCAL (we failed). */
static int remote_unpack(const char *hex, const char *body, size_t blen, int dfd, int *n,
                         char *why, size_t whylen)
{
    const char *p = body, *e = body + blen;
    char name[256];
    uint64_t size;
    *n = 0;
    if (blen < 37 || strncmp(p, "key ", 4) || memcmp(p + 4, hex, 32) || p[36] != '\n') {
        snprintf(why, whylen, "it is the value of another key");
        return UNPACK_BAD;
    }
    for (p += 37; e - p != 4 || memcmp(p, "end\n", 4); (*n)++) {
        if (*n >= REMOTE_MAX_SECTIONS || remote_section(&p, e, name, sizeof name, &size) != 0 ||
            (*n == 0) != !strcmp(name, "manifest")) {
            snprintf(why, whylen, "it is malformed or truncated");
            return UNPACK_BAD;
        }
        int err = remote_write(dfd, name, p, (size_t)size);
        if (err == EEXIST) {
            snprintf(why, whylen, "it holds %s twice", name);
            return UNPACK_BAD;
        }
        if (err) {
            snprintf(why, whylen, "cannot write %s: %s", name, strerror(err));
            return UNPACK_LOCAL;
        }
        p += size;
    }
    return UNPACK_OK;
}

/* Unpack body into a new directory of tmp/ (*tmp) and check it like any
 * entry: UNPACK_OK (*m filled), UNPACK_BAD or UNPACK_LOCAL (why). */
static int remote_unpack_check(cache *c, const char *hex, const char *body, size_t blen,
                               char tmp[PATH_MAX], cache_manifest *m, char *why, size_t whylen)
{
    /* Named like a build: swept once the key's build lock (which the
     * caller holds) is free, if this process dies before the rename. */
    snprintf(tmp, PATH_MAX, "%s/%s.b%ld.XXXXXX", c->tmp, hex, (long)getpid());
    if (!mkdtemp(tmp)) {
        snprintf(why, whylen, "cannot create a directory in %s: %s", c->tmp, strerror(errno));
        tmp[0] = '\0';
        return UNPACK_LOCAL;
    }
    int dfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC), n = 0;
    int rc = dfd < 0 ? UNPACK_LOCAL : remote_unpack(hex, body, blen, dfd, &n, why, whylen);
    if (dfd >= 0)
        close(dfd);
    if (rc != UNPACK_OK)
        return rc;
    int chk = cache_check(c, tmp, hex, CACHE_CHK_SUMS | CACHE_CHK_OWNER, m, why, whylen);
    if (chk != OPJIT_OK)
        return chk == OPJIT_EIO ? UNPACK_LOCAL : UNPACK_BAD;
    if (n != m->nart + 1) {
        snprintf(why, whylen, "it holds files its manifest does not list");
        cache_manifest_free(m);
        return UNPACK_BAD;
    }
    return UNPACK_OK;
}

/* Verify val (the value of rkey) and install it at dir: UNPACK_OK,
 * UNPACK_BAD, UNPACK_FOREIGN (rejected: why) or UNPACK_LOCAL. The files
 * are checked even when the signature fails, to tell a damaged value
 * from another key's. keep (may be NULL) receives the manifest checked
 * when this call installed the entry (else it stays empty, and the caller
 * checks what is at dir). */
static int remote_install(cache *c, const char *hex, const char *rkey, const char *val,
                          size_t len, const char *dir, cache_manifest *keep, char *why,
                          size_t whylen)
{
    size_t blen, hl;
    const char *how;
    char sigwhy[128] = "", tmp[PATH_MAX];
    const char *body = remote_head(val, len, &how, &hl, &blen, why, whylen);
    if (!body)
        return UNPACK_BAD;
    int ours = remote_verify(c->remote, rkey, how, hl, body, blen, sigwhy, sizeof sigwhy);
    cache_manifest m = {0};
    int rc = remote_unpack_check(c, hex, body, blen, tmp, &m, why, whylen);
    if (rc == UNPACK_OK && !ours) {
        snprintf(why, whylen, "%s", sigwhy);
        rc = UNPACK_FOREIGN;
    }
    /* Not synced: after a crash, a lost or torn entry is a miss or fails
     * its checksums (then it is fetched again). */
    int e = rc != UNPACK_OK ? -1 : cache_install_dir(c, hex, tmp, dir) == OPJIT_OK ? 0 : errno;
    if (e > 0 && e != EEXIST && e != ENOTEMPTY) {
        snprintf(why, whylen, "cannot install it: %s", strerror(e));
        rc = UNPACK_LOCAL;
    }
    if (e == 0 && keep)
        *keep = m; /* the caller's now */
    else
        cache_manifest_free(&m);
    if (e != 0 && tmp[0])
        cache_rm_rf(tmp);
    return rc;
}

/* ---- talking to the server ----------------------------------------------------- */

static double remote_now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int64_t remote_now_ms(void)
{
    return (int64_t)(remote_now_us() / 1e3);
}

static redisReply *remote_cmd(cache *c, int argc, const char **argv, const size_t *lens)
{
    return redis_run(c, c->remote->link, argc, argv, lens);
}

redisReply *cache_remote_cmd(cache *c, int argc, const char **argv, const size_t *lens)
{
    return c->remote ? remote_cmd(c, argc, argv, lens) : NULL;
}

int cache_remote_readonly(const cache *c) { return c->remote && c->remote->ro; }
int cache_remote_signed(const cache *c) { return c->remote && c->remote->key; }
int cache_remote_enabled(const cache *c) { return c->remote != NULL; }

const char *cache_remote_url(const cache *c) { return c->remote_url; }
const char *cache_remote_key_file(const cache *c)
{
    return c->remote ? c->remote->key_file : NULL;
}

static redisReply *remote_cmd2(cache *c, const char *verb, const char *rkey)
{
    const char *argv[] = {verb, rkey};
    return remote_cmd(c, 2, argv, NULL);
}

static void remote_delete(cache *c, const char *rkey)
{
    redisReply *rep = c->remote->ro ? NULL : remote_cmd2(c, "DEL", rkey);
    if (rep)
        remote_lib.free_reply(rep);
}

/* GET_FOREIGN: the remote holds a value we cannot use and must not
 * delete (another fleet key's): build here, without waiting for others. */
#define GET_DOWN OPJIT_EIO
#define GET_MISS OPJIT_ENOTFOUND
#define GET_HIT OPJIT_OK
#define GET_FOREIGN OPJIT_EEXIST

/* A value of req was rejected: warn, and delete it when it is damaged for
 * every reader (never another key's, never in read-only mode). */
static int remote_rejected(cache *c, const cache_request *req, const char *rkey, int u,
                           const char *why)
{
    int del = u == UNPACK_BAD && !c->remote->ro;
    cache_logf(c, OPJIT_LOG_WARN, "cache: remote entry %s (op %s, source %s) is rejected: %s; %s",
               req->key.hex, req->op_name ? req->op_name : "?",
               req->source_name ? req->source_name : "?", why,
               del ? "deleting it" : u == UNPACK_BAD ? "ignoring it (read-only mode)"
                                                     : "keeping it (its files are intact)");
    if (del)
        remote_delete(c, rkey);
    return del ? GET_MISS : GET_FOREIGN;
}

/* GET the value of req and install it at dir. */
static int remote_get(cache *c, const cache_request *req, const char *dir, cache_manifest *keep)
{
    char rkey[64], why[PATH_MAX + 256];
    remote_rkey(rkey, sizeof rkey, REMOTE_PREFIX, req->key.hex);
    double t0 = remote_now_us();
    const char *argv[] = {"GET", rkey};
    redisReply *rep = NULL;
    int lr = redis_request(c, c->remote->link, 2, argv, NULL, REMOTE_MAX_VALUE, &rep);
    if (lr == OPJIT_ECACHE) {
        /* No opjit writes a value this large: not read, damaged. */
        snprintf(why, sizeof why, "it is over %u MiB (not fetched)", REMOTE_MAX_VALUE >> 20);
        return remote_rejected(c, req, rkey, UNPACK_BAD, why);
    }
    if (lr != OPJIT_OK)
        return GET_DOWN;
    int rc = GET_MISS;
    if (rep->type == REDIS_REPLY_STRING) {
        double t1 = remote_now_us();
        int u = remote_install(c, req->key.hex, rkey, rep->str, rep->len, dir, keep, why,
                               sizeof why);
        if (u == UNPACK_OK) {
            rc = GET_HIT;
            cache_logf(c, OPJIT_LOG_DEBUG, "cache: remote hit %s: %zu bytes in %.3f ms (GET "
                       "%.3f ms, verify and install %.3f ms)", req->key.hex, rep->len,
                       (remote_now_us() - t0) / 1e3, (t1 - t0) / 1e3,
                       (remote_now_us() - t1) / 1e3);
        } else if (u == UNPACK_BAD || u == UNPACK_FOREIGN) {
            rc = remote_rejected(c, req, rkey, u, why);
        } else {
            cache_logf(c, OPJIT_LOG_WARN, "cache: remote entry %s: %s", req->key.hex, why);
        }
    } else if (rep->type == REDIS_REPLY_ERROR) {
        cache_logf(c, OPJIT_LOG_DEBUG, "cache: remote GET %s: %s", rkey, rep->str);
    }
    remote_lib.free_reply(rep);
    return rc;
}

/* The lock at rkey is held: take it over (1) when it can never be a
 * holder's, with no time limit or one over the lease (planted, or a
 * server that lost its expiry); else 0, or -1 when the remote is down. */
static int remote_lock_bogus(cache *c, const cache_request *req, const char *rkey,
                             const char *token, const char *px)
{
    static const char script[] =
        "local t = redis.call('pttl', KEYS[1]) "
        "if t == -1 or t > tonumber(ARGV[2]) then "
        "redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end return 0";
    const char *argv[] = {"EVAL", script, "1", rkey, token, px};
    redisReply *rep = remote_cmd(c, 6, argv, NULL);
    int rc = !rep ? -1 : rep->type == REDIS_REPLY_INTEGER && rep->integer == 1;
    if (rep)
        remote_lib.free_reply(rep);
    if (rc == 1)
        cache_logf(c, OPJIT_LOG_WARN, "cache: the fleet lock of key %s had no time limit or one "
                   "over the lease (%s ms); taken over", req->key.hex, px);
    return rc;
}

/* Try to take the fleet lock of req: 1 (token filled), 0 held by another,
 * -1 the remote is down or refused. */
static int remote_lock(cache *c, const cache_request *req, char token[CACHE_LAYER_TOKEN])
{
    char rkey[64], px[24], host[64] = "";
    unsigned char rnd[8];
    char rhex[17];
    remote_rkey(rkey, sizeof rkey, REMOTE_LOCK_PREFIX, req->key.hex);
    if (getrandom(rnd, sizeof rnd, 0) != (ssize_t)sizeof rnd)
        return -1;
    remote_hex(rnd, sizeof rnd, rhex);
    gethostname(host, sizeof host - 1);
    snprintf(token, CACHE_LAYER_TOKEN, "%.20s:%ld:%s", host, (long)getpid(), rhex);
    snprintf(px, sizeof px, "%d", c->remote->lease_ms);
    const char *argv[] = {"SET", rkey, token, "NX", "PX", px};
    redisReply *rep = remote_cmd(c, 6, argv, NULL);
    int rc = !rep || rep->type == REDIS_REPLY_ERROR ? -1 : rep->type == REDIS_REPLY_STATUS;
    if (rep)
        remote_lib.free_reply(rep);
    if (rc == 0)
        rc = remote_lock_bogus(c, req, rkey, token, px);
    if (rc != 1)
        token[0] = '\0';
    return rc;
}

static void remote_unlock(cache *c, const cache_request *req, const char *token)
{
    static const char script[] =
        "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end "
        "return 0";
    if (!c->remote || !token || !*token)
        return;
    char rkey[64];
    remote_rkey(rkey, sizeof rkey, REMOTE_LOCK_PREFIX, req->key.hex);
    const char *argv[] = {"EVAL", script, "1", rkey, token};
    redisReply *rep = remote_cmd(c, 5, argv, NULL);
    if (rep)
        remote_lib.free_reply(rep);
}


static void remote_sleep_ms(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* We took the fleet lock: build, unless the previous holder published the
 * value between our GET and our SET. */
static int remote_owned(cache *c, const cache_request *req, const char *dir,
                        cache_manifest *keep, char token[CACHE_LAYER_TOKEN])
{
    if (remote_get(c, req, dir, keep) != GET_HIT)
        return OPJIT_ENOTFOUND;
    remote_unlock(c, req, token);
    token[0] = '\0';
    return OPJIT_OK;
}

/* Another process holds the fleet lock: poll for its value, taking the
 * lock when it is released without one, for at most two leases. */
static int remote_wait(cache *c, const cache_request *req, const char *dir,
                       cache_manifest *keep, char token[CACHE_LAYER_TOKEN])
{
    int64_t deadline = remote_now_ms() + 2 * (int64_t)c->remote->lease_ms;
    cache_logf(c, OPJIT_LOG_INFO, "cache: op %s (%s, key %s) is being built elsewhere; waiting",
               req->op_name ? req->op_name : "?", req->target ? req->target : "?", req->key.hex);
    while (remote_now_ms() < deadline) {
        remote_sleep_ms(REMOTE_POLL_MS);
        int g = remote_get(c, req, dir, keep);
        if (g != GET_MISS)
            return g == GET_HIT ? OPJIT_OK : OPJIT_ENOTFOUND;
        int l = remote_lock(c, req, token);
        if (l != 0)
            return l > 0 ? remote_owned(c, req, dir, keep, token) : OPJIT_ENOTFOUND;
    }
    cache_logf(c, OPJIT_LOG_INFO, "cache: waited %d ms for key %s; building it here",
               2 * c->remote->lease_ms, req->key.hex);
    return OPJIT_ENOTFOUND;
}

/* A local miss of req, whose entry directory is dir (writable cache), the
 * caller holding the key's build lock: ask the remote. OPJIT_OK when a
 * verified entry was installed at dir (keep as for cache_layer_ops.fetch),
 * else OPJIT_ENOTFOUND; with may_build, one process per fleet builds a key
 * at a time: token receives the fleet lock's token when this process
 * holds it, "" when not (the remote is down, or waiting for another
 * builder took too long). */
static int remote_fetch(cache *c, const cache_request *req, const char *dir, int may_build,
                        cache_manifest *keep, char token[CACHE_LAYER_TOKEN])
{
    token[0] = '\0';
    if (!c->remote)
        return OPJIT_ENOTFOUND;
    int g = remote_get(c, req, dir, keep);
    if (g == GET_HIT)
        return OPJIT_OK;
    if (g != GET_MISS || !may_build || c->remote->ro)
        return OPJIT_ENOTFOUND;
    int l = remote_lock(c, req, token);
    if (l < 0)
        return OPJIT_ENOTFOUND;
    return l == 0 ? remote_wait(c, req, dir, keep, token)
                  : remote_owned(c, req, dir, keep, token);
}

/* 1 when the remote has the value of rkey already (or cannot be asked). */
static int remote_has(cache *c, const char *rkey)
{
    redisReply *rep = remote_cmd2(c, "EXISTS", rkey);
    int has = !rep || rep->type != REDIS_REPLY_INTEGER || rep->integer != 0;
    if (rep)
        remote_lib.free_reply(rep);
    return has;
}

/* After a build published at dir, or a local hit to push (token NULL):
 * store the entry in the remote unless it is there (read-only mode:
 * never), then release the fleet lock token names (if any). */
static void remote_put(cache *c, const cache_request *req, const char *dir, const char *token)
{
    cache_remote *r = c->remote;
    char rkey[64], why[PATH_MAX + 256];
    char *base = NULL;
    const char *val;
    size_t len;
    remote_rkey(rkey, sizeof rkey, REMOTE_PREFIX, req->key.hex);
    if (!r || r->ro || (!token && remote_has(c, rkey)))
        goto out;
    if (remote_encode(c, r, req->key.hex, rkey, dir, &base, &val, &len, why, sizeof why) != 0) {
        cache_logf(c, OPJIT_LOG_INFO, "cache: not stored in the remote cache: %s", why);
        goto out;
    }
    const char *argv[] = {"SET", rkey, val, "NX"};
    size_t lens[] = {3, strlen(rkey), len, 2};
    redisReply *rep = remote_cmd(c, 4, argv, lens);
    if (rep && rep->type == REDIS_REPLY_ERROR && !atomic_exchange(&r->warned_full, 1))
        cache_logf(c, OPJIT_LOG_WARN, "cache: remote cache %s refused an entry (%s); entries are "
                   "not shared until it takes them (see maxmemory-policy allkeys-lru)",
                   redis_link_url(r->link), rep->str);
    else if (rep && rep->type == REDIS_REPLY_STATUS)
        cache_logf(c, OPJIT_LOG_DEBUG, "cache: stored %s in the remote cache (%zu bytes)",
                   req->key.hex, len);
    if (rep)
        remote_lib.free_reply(rep);
out:
    free(base);
    remote_unlock(c, req, token);
}

/* ---- the remote as a cache layer (cache_layer.h) ---------------------------------- */

static int layer_fetch(cache_layer *l, const cache_request *req, const char *dir, int claim,
                       cache_manifest *keep, cache_layer_lock *lk)
{
    return remote_fetch(l->c, req, dir, claim, keep, lk->token);
}

static int layer_publish(cache_layer *l, const cache_request *req, const char *tmp,
                         const char *dir, cache_layer_lock *lk)
{
    (void)tmp; /* the remote copies the published entry at dir */
    remote_put(l->c, req, dir, lk ? lk->token : NULL);
    if (lk)
        lk->token[0] = '\0';
    return OPJIT_OK;
}

static void layer_unlock(cache_layer *l, const cache_request *req, cache_layer_lock *lk)
{
    remote_unlock(l->c, req, lk->token);
    lk->token[0] = '\0';
}

const cache_layer_ops cache_remote_layer = {
    .kind = "remote",
    .fetch = layer_fetch,
    .publish = layer_publish,
    .unlock = layer_unlock,
};
