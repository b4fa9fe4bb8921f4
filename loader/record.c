/* loader/record.c - a source's record: what discovery found for one
 * version of a source (its status and message, each op's schema and doc),
 * kept in the cache so that neither a listing (loader/discover.c) nor the
 * op index (loader/index.c) runs that source's code again.
 *
 * A record is the index's per-source note (loader/index_note.c, with its
 * def section), keyed by the source's digest (its bytes, local headers,
 * opjit's ABI and op header), its path and the note's format. The cache
 * keeps the first note written under a key, so a record is never
 * replaced: the answer to a source looked at again because it ran out of
 * a shorter time limit than today's goes under a key made from the
 * record before it (a chain, RECORD_CHAIN_MAX links at most). */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "loader/index_int.h"
#include "loader/loader_int.h"

void index_request(cache_request *req, const char *name, const char *src_name)
{
    *req = (cache_request){.op_name = name, .source_name = src_name,
                           .compiler = "opjit discovery", .options = "",
                           .target = jit_host_target(), .tier = "index"};
}

int index_note_fetch(loader *l, const char *real, const cache_key *key, idx_note *n)
{
    cache_request req;
    index_request(&req, "-", strrchr(real, '/')[1] ? strrchr(real, '/') + 1 : "/");
    req.key = *key;
    char *text = NULL;
    if (cache_note_get(l->cache, &req, "ops", &text) != OPJIT_OK)
        return -1;
    return note_open(n, text, strlen(text));
}

/* Failures worth remembering for this version of a source: it will fail
 * the same way again. */
static int lasting_status(int status)
{
    return status == OPJIT_OK || status == OPJIT_ECOMPILE || status == OPJIT_EMODULE ||
           status == OPJIT_ESCHEMA || status == OPJIT_EEXIST;
}

/* The key of the per-source note of s. Its path is in it: the messages
 * name the source, and a copy elsewhere is another source. */
static int source_note_key(const source *s, cache_key *key)
{
    cache_keygen *g = source_keygen(s);
    if (!g)
        return -1;
    cache_keygen_add_str(g, "what", "op-index");
    cache_keygen_add_str(g, "format", INDEX_FORMAT);
    cache_keygen_add_str(g, "target", jit_host_target());
    cache_keygen_add_str(g, "path", s->real);
    cache_keygen_finish(g, key);
    return 0;
}

#define RECORD_CHAIN_MAX 8

int index_record_get(loader *l, const source *s, record_key *key, idx_src *out)
{
    memset(out, 0, sizeof *out);
    if (source_note_key(s, &key->base))
        return -1;
    key->at = key->base;
    for (int link = 0; link < RECORD_CHAIN_MAX; link++) {
        idx_note n;
        if (index_note_fetch(l, s->real, &key->at, &n))
            return 0;
        int got = note_record(&n, out) == 0;
        note_close(&n);
        if (!got)
            return 0; /* garbled: looked at again each time, as if none */
        long limit = out->limit_ms;
        if (!limit || l->rt->set.discover_timeout_ms <= limit)
            return 1;
        /* It ran out of a shorter time limit than today's: look again,
         * the answer kept under the next link. */
        src_free(out);
        cache_keygen *g = cache_keygen_new();
        cache_keygen_add_str(g, "what", "op-index-retry");
        cache_keygen_add(g, "after", key->at.bytes, sizeof key->at.bytes);
        cache_keygen_add(g, "limit", &limit, sizeof limit);
        cache_keygen_finish(g, &key->at);
    }
    return 0;
}

/* Whether a local header of the source changed lately, as the index
 * judges it (the source's own bytes are checked against the key after
 * discovery instead). */
static void header_racy(void *ud, const char *real)
{
    int *racy = ud;
    struct stat st;
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    long long t0 = (long long)now.tv_sec * 1000000000LL + now.tv_nsec - RACY_MS * 1000000LL;
    *racy |= stat(real, &st) != 0 ||
             (long long)st.st_mtim.tv_sec * 1000000000LL + st.st_mtim.tv_nsec >= t0 ||
             (long long)st.st_ctim.tv_sec * 1000000000LL + st.st_ctim.tv_nsec >= t0;
}

static int headers_racy(const source *s)
{
    int racy = 0;
    source_each_header(s, header_racy, &racy);
    return racy;
}

int index_record_put(loader *l, const char *path, const record_key *key,
                     const opjit_source_ops *src, long limit_ms)
{
    source s;
    cache_key now;
    if (!lasting_status(src->status) || source_read(l, path, &s) != OPJIT_OK)
        return 0;
    /* It holds for that version: the source still has the digest it had. */
    int lasting = source_note_key(&s, &now) == 0 &&
                  !memcmp(now.bytes, key->base.bytes, sizeof now.bytes);
    int fresh = lasting && headers_racy(&s);
    source_free(&s);
    const char *file = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    if (!lasting || fresh || !one_field(file))
        return lasting;
    idx_src one = {.limit_ms = limit_ms};
    int ok = (one.file = strdup(file)) && !src_set_msg(&one, src->error) &&
             (src->status == OPJIT_OK ||
              (one.detail = strndup(src->error ? src->error : "", INDEX_DETAIL_MAX)));
    one.status = src->status;
    for (int k = 0; ok && k < src->nops; k++)
        ok = !src_add_def(&one, src->schemas[k], src->docs[k], 1);
    char *t = ok ? note_text(&one, 1, NULL, -1, 1) : NULL;
    src_free(&one);
    cache_request req;
    index_request(&req, "-", file);
    req.key = key->at;
    if (t)
        cache_note_put(l->cache, &req, "ops", t);
    free(t);
    return lasting;
}
