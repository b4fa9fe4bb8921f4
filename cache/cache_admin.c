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

/* Walk every entry of every layer: ro layers, then the writable cache.
 * flags as cache_check; fn gets the info. repair: see cache_verify_all. */
static int cache_walk(cache *c, int flags, int repair, cache_entry_fn fn, void *ud,
                      int *ndamaged, char *err, size_t errlen)
{
    int nlayers = c->disabled ? 0 : c->nro + (c->writable ? 1 : 0);
    int damaged = 0, unchecked = 0, stop = 0, rc = OPJIT_OK;
    char first[PATH_MAX + 600] = "";
    for (int li = 0; li < nlayers && !stop; li++) {
        int writable = li == c->nro;
        const char *root = writable ? c->root : c->ro[li];
        if (!writable && c->ro_why[li]) {
            /* A layer that is not trusted is never read: one problem. */
            if (!c->ro_absent[li])
                stop = cache_report_layer(c, li, fn, ud, &damaged);
            continue;
        }
        char entries[PATH_MAX];
        snprintf(entries, sizeof entries, "%s/v1/entries", root);
        cache_keylist kl;
        int e = cache_list_keys(entries, &kl);
        if (e) {
            free(kl.hex);
            rc = cache_errf(err, errlen, e == ENOMEM ? OPJIT_ENOMEM : OPJIT_EIO,
                            "cache: cannot read %s: %s", entries, strerror(e));
            break;
        }
        for (size_t i = 0; i < kl.n && !stop; i++) {
            const char *hex = kl.hex[i];
            char dir[PATH_MAX], why[512];
            cache_entry_dir_of(entries, hex, dir, sizeof dir);
            int fd = -1;
            /* Hold the use lock so an eviction in progress does not look
             * like damage. Read-only layers are never locked. */
            if (writable && cache_lock(c, hex, CACHE_LOCK_USE, 0, 1, &fd) != 0)
                fd = -1;
            cache_manifest m;
            int r = cache_check(c, dir, hex, flags | (writable ? CACHE_CHK_OWNER : 0), &m, why,
                                sizeof why);
            if (r == CACHE_MISSING || r == CACHE_TRANSIENT) {
                /* Could not be checked (out of file descriptors, an I/O
                 * error...): an error, not damage; never evicted for it. */
                if (r == CACHE_TRANSIENT && !unchecked++)
                    snprintf(first, sizeof first, "%s: %s", dir, why);
                if (fd >= 0)
                    close(fd);
                continue;
            }
            cache_entry_info info;
            memset(&info, 0, sizeof info);
            info.key = hex;
            info.dir = dir;
            info.layer = writable ? 0 : li + 1;
            info.layer_dir = root;
            if (r == CACHE_OK) {
                info.op_name = m.op;
                info.source_name = m.source;
                info.compiler = m.compiler;
                info.options = m.options;
                info.target = m.target;
                info.tier = m.tier;
                info.size = m.size;
                info.created = m.created;
                info.last_use = m.last_use;
                info.nartifacts = m.nart;
            } else {
                int hasm;
                damaged++;
                info.problem = why;
                cache_dir_usage(dir, &info.size, &info.last_use, &hasm);
                info.created = info.last_use;
            }
            if (fn && fn(ud, &info))
                stop = 1;
            cache_manifest_free(&m);
            if (fd >= 0)
                close(fd);
            if (r == CACHE_DAMAGED && repair && writable) {
                /* Evict it, unless someone uses it right now. */
                if (cache_lock(c, hex, CACHE_LOCK_USE, 1, 0, &fd) == 0) {
                    int e = cache_discard_entry(c, dir, hex, 1);
                    close(fd);
                    if (e && rc == OPJIT_OK)
                        rc = cache_errf(err, errlen, OPJIT_EIO,
                                        "cache: cannot evict the damaged entry %s: %s", dir,
                                        strerror(e));
                }
            }
        }
        free(kl.hex);
    }
    if (unchecked && rc == OPJIT_OK)
        rc = cache_errf(err, errlen, OPJIT_EIO,
                        "cache: %d entr%s could not be checked (not damage: left as is; try "
                        "again); %s",
                        unchecked, unchecked == 1 ? "y" : "ies", first);
    if (ndamaged)
        *ndamaged = damaged;
    return rc;
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
        int e = cache_list_keys(entries, &kl);
        if (e) {
            free(kl.hex);
            return cache_errf(err, errlen, OPJIT_EIO, "cache: cannot read %s: %s", entries, strerror(e));
        }
        for (size_t i = 0; i < kl.n; i++) {
            char dir[PATH_MAX];
            uint64_t size;
            int64_t mt;
            int hasm;
            cache_entry_dir_of(entries, kl.hex[i], dir, sizeof dir);
            cache_dir_usage(dir, &size, &mt, &hasm);
            *(writable ? &t->entries : &t->ro_entries) += 1;
            *(writable ? &t->bytes : &t->ro_bytes) += size;
        }
        free(kl.hex);
    }
    t->tmp_dirs = cache_count_tmp(c);
    return OPJIT_OK;
}

int cache_prune(cache *c, uint64_t max_bytes, cache_prune_result *r, char *err, size_t errlen)
{
    cache_prune_result dummy;
    if (!r)
        r = &dummy;
    memset(r, 0, sizeof *r);
    int rc = cache_need_writable(c, err, errlen);
    if (rc != OPJIT_OK)
        return rc;
    cache_clean_tmp(c, &r->tmp_removed);
    rc = cache_evict_to(c, max_bytes ? max_bytes : c->max_size, 0, r, err, errlen);
    cache_clean_locks(c);
    return rc;
}

int cache_clear(cache *c, cache_prune_result *r, char *err, size_t errlen)
{
    cache_prune_result dummy;
    if (!r)
        r = &dummy;
    memset(r, 0, sizeof *r);
    int rc = cache_need_writable(c, err, errlen);
    if (rc != OPJIT_OK)
        return rc;
    cache_clean_tmp(c, &r->tmp_removed);
    rc = cache_evict_to(c, 0, 1, r, err, errlen);
    cache_clean_locks(c);
    return rc;
}
