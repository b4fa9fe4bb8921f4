/*
 * cache/cache_admin.c - administering the cache: listing its entries,
 * totals, verifying (and repairing), pruning and clearing. The top of
 * cache/ beside cache.c; eviction and cleanup are cache_evict.c's.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "opjit.h"
#include "cache/cache_int.h"

/* ---- listing ------------------------------------------------------------ */

static int cache_report_layer(const cache *c, int li, cache_entry_fn fn, void *ud, int *damaged)
{
    char why[PATH_MAX + 160];
    snprintf(why, sizeof why, "the layer is not trusted: %s", c->ro_why[li]);
    cache_entry_info info;
    memset(&info, 0, sizeof info);
    info.key = "-";
    info.dir = c->ro[li];
    info.layer = li + 1;
    info.layer_dir = c->ro[li];
    info.problem = why;
    (*damaged)++;
    return fn && fn(ud, &info);
}

/* A walk over every entry of every layer (cache_walk). */
typedef struct cache_walker {
    cache *c;
    int flags, repair; /* as cache_walk's */
    cache_entry_fn fn;
    void *ud;
    int damaged, unchecked, stop;
    char first[PATH_MAX + 600]; /* the first entry that could not be checked */
    int rc;
    char *err;
    size_t errlen;
} cache_walker;

/* What the callback learns of an entry that cache_check found r (with m
 * or why). */
static void cache_info_fill(const cache *c, cache_entry_info *info, int r,
                            const cache_manifest *m, const char *why)
{
    if (r == OPJIT_OK) {
        info->op_name = m->op;
        info->source_name = m->source;
        info->compiler = m->compiler;
        info->options = m->options;
        info->target = m->target;
        info->tier = m->tier;
        info->inputs = m->inputs;
        info->size = m->size;
        info->created = m->created;
        info->last_use = m->last_use;
        info->nartifacts = m->nart;
    } else {
        int hasm;
        info->problem = why;
        cache_dir_usage(c, info->dir, &info->size, &info->last_use, &hasm);
        info->created = info->last_use;
    }
}

/* Evict the damaged entry dir of the writable cache, unless someone uses
 * it right now. */
static void cache_walk_repair(cache_walker *w, const char *dir, const char *hex)
{
    int fd;
    if (cache_lock(w->c, hex, CACHE_LOCK_USE, 1, 0, &fd) != 0)
        return;
    int e = cache_discard_entry(w->c, dir, hex, 1) ? errno : 0;
    close(fd);
    if (e && w->rc == OPJIT_OK)
        w->rc = cache_errf(w->err, w->errlen, OPJIT_EIO,
                           "cache: cannot evict the damaged entry %s: %s", dir, strerror(e));
}

/* Check the entry hex of layer li (root; its entries/ directory) and hand
 * it to the callback. */
static void cache_walk_entry(cache_walker *w, int li, const char *root, const char *entries,
                             const char *hex)
{
    cache *c = w->c;
    int writable = li == c->nro;
    char dir[PATH_MAX], why[512];
    cache_entry_dir_of(entries, hex, dir, sizeof dir);
    int fd = -1;
    /* Hold the use lock so an eviction in progress does not look like
     * damage. Read-only layers are never locked. */
    if (writable && cache_lock(c, hex, CACHE_LOCK_USE, 0, 1, &fd) != 0)
        fd = -1;
    cache_manifest m;
    int r = cache_check(c, dir, hex, w->flags | (writable ? CACHE_CHK_OWNER : 0), &m, why,
                        sizeof why);
    if (r == OPJIT_ENOTFOUND || r == OPJIT_EIO) {
        /* Could not be checked (out of file descriptors, an I/O error...):
         * an error, not damage; never evicted for it. */
        if (r == OPJIT_EIO && !w->unchecked++)
            snprintf(w->first, sizeof w->first, "%s: %s", dir, why);
        if (fd >= 0)
            close(fd);
        return;
    }
    cache_entry_info info;
    memset(&info, 0, sizeof info);
    info.key = hex;
    info.dir = dir;
    info.layer = writable ? 0 : li + 1;
    info.layer_dir = root;
    if (r != OPJIT_OK)
        w->damaged++;
    cache_info_fill(c, &info, r, &m, why);
    if (w->fn && w->fn(w->ud, &info))
        w->stop = 1;
    cache_manifest_free(&m);
    if (fd >= 0)
        close(fd);
    if (r == OPJIT_ECACHE && w->repair && writable)
        cache_walk_repair(w, dir, hex);
}

/* A shard of layer li that is not a directory (a symbolic link, a file):
 * damage, never entered; repair unlinks it (the link, not its target). */
static void cache_walk_bad_shard(cache_walker *w, int li, const char *root, const char *entries,
                                 const char *shard)
{
    int writable = li == w->c->nro;
    char dir[PATH_MAX + 8], why[PATH_MAX + 200];
    snprintf(dir, sizeof dir, "%s/%s", entries, shard);
    int fd = cache_open_below(w->c, dir, why, sizeof why);
    if (fd >= 0) { /* a directory now: listed next time */
        close(fd);
        return;
    }
    if (errno != ENOTDIR)
        snprintf(why, sizeof why, "cannot open the shard: %s", strerror(errno));
    cache_entry_info info;
    memset(&info, 0, sizeof info);
    info.key = shard;
    info.dir = dir;
    info.layer = writable ? 0 : li + 1;
    info.layer_dir = root;
    info.problem = why;
    w->damaged++;
    if (w->fn && w->fn(w->ud, &info))
        w->stop = 1;
    int e = w->repair && writable && cache_discard_shard(w->c, shard) ? errno : 0;
    if (e && w->rc == OPJIT_OK)
        w->rc = cache_errf(w->err, w->errlen, OPJIT_EIO, "cache: cannot remove %s: %s", dir,
                           strerror(e));
}

/* Every entry of layer li (the writable cache when li == c->nro). 0, or
 * -1 when the layer cannot be listed (w->rc says why). */
static int cache_walk_layer(cache_walker *w, int li)
{
    cache *c = w->c;
    int writable = li == c->nro;
    const char *root = writable ? c->root : c->ro[li];
    if (!writable && c->ro_why[li]) {
        /* A layer that is not trusted is never read: one problem. */
        if (!c->ro_absent[li])
            w->stop = cache_report_layer(c, li, w->fn, w->ud, &w->damaged);
        return 0;
    }
    char entries[PATH_MAX];
    snprintf(entries, sizeof entries, "%s/v1/entries", root);
    cache_keylist kl;
    int e = cache_list_keys(c, entries, &kl) ? errno : 0;
    if (e) {
        cache_keylist_free(&kl);
        w->rc = cache_errf(w->err, w->errlen, e == ENOMEM ? OPJIT_ENOMEM : OPJIT_EIO,
                           "cache: cannot read %s: %s", entries, strerror(e));
        return -1;
    }
    for (size_t i = 0; i < kl.nbad && !w->stop; i++)
        cache_walk_bad_shard(w, li, root, entries, kl.bad[i]);
    for (size_t i = 0; i < kl.n && !w->stop; i++)
        cache_walk_entry(w, li, root, entries, kl.hex[i]);
    cache_keylist_free(&kl);
    return 0;
}

/* Walk every entry of every layer: ro layers, then the writable cache.
 * flags as cache_check; fn gets the info. repair: see cache_verify_all. */
static int cache_walk(cache *c, int flags, int repair, cache_entry_fn fn, void *ud,
                      int *ndamaged, char *err, size_t errlen)
{
    cache_walker w = {.c = c, .flags = flags, .repair = repair, .fn = fn, .ud = ud,
                      .rc = OPJIT_OK, .err = err, .errlen = errlen};
    int nlayers = c->disabled ? 0 : c->nro + (c->writable ? 1 : 0);
    for (int li = 0; li < nlayers && !w.stop; li++)
        if (cache_walk_layer(&w, li) != 0)
            break;
    if (w.unchecked && w.rc == OPJIT_OK)
        w.rc = cache_errf(err, errlen, OPJIT_EIO,
                          "cache: %d entr%s could not be checked (not damage: left as is; try "
                          "again); %s",
                          w.unchecked, w.unchecked == 1 ? "y" : "ies", w.first);
    if (ndamaged)
        *ndamaged = w.damaged;
    return w.rc;
}

int cache_foreach(cache *c, cache_entry_fn fn, void *ud, char *err, size_t errlen)
{
    return cache_walk(c, 0, 0, fn, ud, NULL, err, errlen);
}

int cache_verify_all(cache *c, int repair, cache_entry_fn fn, void *ud, int *ndamaged,
                     char *err, size_t errlen)
{
    return cache_walk(c, CACHE_CHK_SUMS, repair, fn, ud, ndamaged, err, errlen);
}

static uint64_t cache_count_tmp(const cache *c)
{
    uint64_t n = 0;
    DIR *d = c->writable ? opendir(c->tmp) : NULL;
    if (!d)
        return 0;
    struct dirent *de;
    while ((de = readdir(d)))
        if (de->d_name[0] != '.')
            n++;
    closedir(d);
    return n;
}

int cache_get_totals(cache *c, cache_totals *t, char *err, size_t errlen)
{
    memset(t, 0, sizeof *t);
    int nlayers = c->disabled ? 0 : c->nro + (c->writable ? 1 : 0);
    for (int li = 0; li < nlayers; li++) {
        int writable = li == c->nro;
        if (!writable && c->ro_why[li])
            continue; /* not trusted: never read */
        char entries[PATH_MAX];
        snprintf(entries, sizeof entries, "%s/v1/entries", writable ? c->root : c->ro[li]);
        cache_keylist kl;
        int e = cache_list_keys(c, entries, &kl) ? errno : 0;
        if (e) {
            cache_keylist_free(&kl);
            return cache_errf(err, errlen, OPJIT_EIO, "cache: cannot read %s: %s", entries, strerror(e));
        }
        for (size_t i = 0; i < kl.n; i++) {
            char dir[PATH_MAX];
            uint64_t size;
            int64_t mt;
            int hasm;
            cache_entry_dir_of(entries, kl.hex[i], dir, sizeof dir);
            cache_dir_usage(c, dir, &size, &mt, &hasm);
            *(writable ? &t->entries : &t->ro_entries) += 1;
            *(writable ? &t->bytes : &t->ro_bytes) += size;
        }
        cache_keylist_free(&kl);
    }
    t->tmp_dirs = cache_count_tmp(c);
    return OPJIT_OK;
}

/* Leftover scratch directories removed, then entries evicted down to
 * max_bytes (all: every one), then unused lock files removed. */
static int cache_shrink(cache *c, uint64_t max_bytes, int all, cache_prune_result *r, char *err,
                        size_t errlen)
{
    cache_prune_result dummy;
    if (!r)
        r = &dummy;
    memset(r, 0, sizeof *r);
    int rc = cache_need_writable(c, err, errlen);
    if (rc != OPJIT_OK)
        return rc;
    cache_clean_tmp(c, &r->tmp_removed);
    rc = cache_evict_to(c, max_bytes, all, r, err, errlen);
    cache_clean_locks(c);
    return rc;
}

int cache_prune(cache *c, uint64_t max_bytes, cache_prune_result *r, char *err, size_t errlen)
{
    return cache_shrink(c, max_bytes ? max_bytes : c->max_size, 0, r, err, errlen);
}

int cache_clear(cache *c, cache_prune_result *r, char *err, size_t errlen)
{
    return cache_shrink(c, 0, 1, r, err, errlen);
}
