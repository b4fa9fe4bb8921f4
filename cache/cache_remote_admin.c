/*
 * cache/cache_remote_admin.c - what the fleet's remote cache holds, for
 * `opjit cache ls --remote` and `opjit cache info --remote`: a SCAN over
 * the entry keys, reading each value's head (its manifest) only. Nothing
 * here is verified or loaded; loads verify what they fetch.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "opjit.h"
#include "cache/cache_int.h"
#include "cache/cache_libs.h"
#include "cache/cache_remote.h"

#define REMOTE_HEAD_READ 8191 /* bytes of a value read to list it */

/* An integer reply to a one-key command; 0 when none. */
static uint64_t remote_int(cache *c, const char *verb, const char *rkey);

#define REMOTE_SCAN_COUNT 500

/* Walk the entry keys: fn(ud, key) for each; a non-zero return stops. 0,
 * -1 when the server could not be asked, or -2 when it did not end the
 * walk within what its DBSIZE (at most 2^24 counted) allows: 16 pages per
 * COUNT keys and 64 more, 4 keys per key and 1024 more. An honest server
 * needs about a page per COUNT keys and per 10 x COUNT buckets of its
 * table, and returns each key once (twice while it rehashes); a cursor
 * that never comes back to 0 ends there. */
static int remote_scan(cache *c, int (*fn)(cache *c, void *ud, const char *rkey), void *ud)
{
    const char *dbsize[] = {"DBSIZE"};
    redisReply *n = cache_remote_cmd(c, 1, dbsize, NULL);
    if (!n || n->type != REDIS_REPLY_INTEGER || n->integer < 0) {
        if (n)
            remote_lib.free_reply(n);
        return -1;
    }
    uint64_t keys = n->integer > (1LL << 24) ? 1ULL << 24 : (uint64_t)n->integer;
    uint64_t max_pages = 64 + 16 * (keys / REMOTE_SCAN_COUNT + 1), max_keys = 1024 + 4 * keys;
    remote_lib.free_reply(n);
    char cursor[32] = "0", count[16];
    snprintf(count, sizeof count, "%d", REMOTE_SCAN_COUNT);
    do {
        if (max_pages-- == 0)
            return -2;
        const char *argv[] = {"SCAN", cursor, "MATCH", REMOTE_PREFIX "*", "COUNT", count};
        redisReply *rep = cache_remote_cmd(c, 6, argv, NULL);
        if (!rep || rep->type != REDIS_REPLY_ARRAY || rep->elements != 2 ||
            rep->element[0]->type != REDIS_REPLY_STRING) {
            if (rep)
                remote_lib.free_reply(rep);
            return -1;
        }
        snprintf(cursor, sizeof cursor, "%s", rep->element[0]->str);
        redisReply *got = rep->element[1];
        int stop = 0;
        for (size_t i = 0; got->type == REDIS_REPLY_ARRAY && i < got->elements && !stop; i++) {
            const char *k = got->element[i]->str;
            stop = max_keys-- == 0 ? -2 : 0;
            if (!stop && k && strncmp(k, REMOTE_LOCK_PREFIX, strlen(REMOTE_LOCK_PREFIX)) != 0)
                stop = fn(c, ud, k);
        }
        remote_lib.free_reply(rep);
        if (stop)
            return stop < 0 ? stop : 0;
    } while (strcmp(cursor, "0") != 0);
    return 0;
}

static uint64_t remote_int(cache *c, const char *verb, const char *rkey)
{
    const char *argv[] = {verb, rkey};
    redisReply *rep = cache_remote_cmd(c, 2, argv, NULL);
    uint64_t v = rep && rep->type == REDIS_REPLY_INTEGER && rep->integer > 0
                     ? (uint64_t)rep->integer : 0;
    if (rep)
        remote_lib.free_reply(rep);
    return v;
}

typedef struct remote_walk {
    cache_entry_fn fn;
    void *ud;
    uint64_t entries, bytes;
} remote_walk;

static int remote_count(cache *c, void *ud, const char *rkey)
{
    remote_walk *w = ud;
    w->entries++;
    w->bytes += remote_int(c, "STRLEN", rkey);
    return 0;
}

/* The value of field name in the manifest text m ("name value\n"), into
 * out (escapes left as they are). */
static const char *remote_field(const char *m, const char *name, char *out, size_t n)
{
    size_t len = strlen(name);
    for (const char *p = m; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (!strncmp(p, name, len) && p[len] == ' ') {
            size_t v = strcspn(p + len + 1, "\n");
            snprintf(out, n, "%.*s", (int)v, p + len + 1);
            return out;
        }
    }
    return NULL;
}

static int remote_list_one(cache *c, void *ud, const char *rkey)
{
    remote_walk *w = ud;
    char end[16];
    snprintf(end, sizeof end, "%d", REMOTE_HEAD_READ);
    const char *argv[] = {"GETRANGE", rkey, "0", end};
    redisReply *rep = cache_remote_cmd(c, 4, argv, NULL);
    const char *head = rep && rep->type == REDIS_REPLY_STRING ? rep->str : "";
    const char *m = strstr(head, " manifest\n");
    m = m ? m + 10 : "";
    char f[7][256];
    const char *names[] = {"op", "source", "compiler", "options", "target", "tier", "created"};
    const char *v[7];
    for (int i = 0; i < 7; i++)
        v[i] = remote_field(m, names[i], f[i], sizeof f[i]);
    int nart = 0;
    for (const char *p = strstr(m, "\nartifact "); p; p = strstr(p + 1, "\nartifact "))
        nart++;
    cache_entry_info info = {
        .key = rkey + strlen(REMOTE_PREFIX), .dir = rkey, .layer = -1,
        .layer_dir = c->remote_url, .op_name = v[0], .source_name = v[1], .compiler = v[2],
        .options = v[3], .target = v[4], .tier = v[5],
        .size = remote_int(c, "STRLEN", rkey), .created = v[6] ? strtoll(v[6], NULL, 10) : 0,
        .nartifacts = nart, .problem = *m ? NULL : "no manifest at the head of the value",
    };
    int stop = w->fn(w->ud, &info);
    if (rep)
        remote_lib.free_reply(rep);
    return stop;
}

int cache_remote_foreach(cache *c, cache_entry_fn fn, void *ud, char *err, size_t errlen)
{
    if (!cache_remote_enabled(c))
        return cache_errf(err, errlen, OPJIT_ENOTFOUND, "cache: no remote cache in use%s%s",
                          c->remote_url ? " (see the warnings about " : "",
                          c->remote_url ? "it)" : " (set OPJIT_REMOTE_CACHE)");
    remote_walk w = {fn, ud, 0, 0};
    int rc = remote_scan(c, remote_list_one, &w);
    if (rc == -2)
        return cache_errf(err, errlen, OPJIT_EIO, "cache: remote cache %s: its SCAN did not "
                          "end within the pages and keys its DBSIZE allows; the list is "
                          "incomplete", c->remote_url);
    if (rc != 0)
        return cache_errf(err, errlen, OPJIT_EIO, "cache: remote cache %s cannot be reached",
                          c->remote_url);
    return OPJIT_OK;
}

/* used_memory, maxmemory and maxmemory_policy from INFO memory. */
static int remote_memory(cache *c, cache_remote_info *info)
{
    const char *argv[] = {"INFO", "memory"};
    redisReply *rep = cache_remote_cmd(c, 2, argv, NULL);
    if (!rep || rep->type != REDIS_REPLY_STRING) {
        if (rep)
            remote_lib.free_reply(rep);
        return -1;
    }
    const char *p;
    if ((p = strstr(rep->str, "\nused_memory:")))
        info->used_memory = strtoull(p + 13, NULL, 10);
    if ((p = strstr(rep->str, "\nmaxmemory:")))
        info->maxmemory = strtoull(p + 11, NULL, 10);
    if ((p = strstr(rep->str, "\nmaxmemory_policy:")))
        snprintf(info->policy, sizeof info->policy, "%.*s", (int)strcspn(p + 18, "\r\n"), p + 18);
    remote_lib.free_reply(rep);
    return 0;
}

int cache_remote_info_get(cache *c, cache_remote_info *info)
{
    memset(info, 0, sizeof *info);
    info->url = c->remote_url ? c->remote_url : "";
    if (!cache_remote_enabled(c))
        return OPJIT_OK;
    info->enabled = 1;
    info->readonly = cache_remote_readonly(c);
    info->is_signed = cache_remote_signed(c);
    if (remote_memory(c, info) != 0)
        return OPJIT_OK;
    remote_walk w = {NULL, NULL, 0, 0};
    int rc = remote_scan(c, remote_count, &w);
    info->reachable = rc != -1;
    if (rc == -2)
        cache_logf(c, OPJIT_LOG_WARN, "cache: remote cache %s: its SCAN did not end within the "
                   "pages and keys its DBSIZE allows; the counts are incomplete", c->remote_url);
    info->entries = w.entries;
    info->bytes = w.bytes;
    return OPJIT_OK;
}
