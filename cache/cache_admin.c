/*
 * cache/cache_admin.c - walking the cache: listing, totals, verifying,
 * eviction (LRU, under the size cap), and cleaning what crashed processes
 * left in tmp/ and locks/.
 *
 * Nothing here removes an entry some process uses: removal takes the key's
 * use lock exclusively without waiting and skips the entry when it is busy.
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

typedef struct cache_keylist {
    char (*hex)[33];
    size_t n, cap;
} cache_keylist;

static int cache_hex_cmp(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

/* The keys under an entries/ directory, sorted. A missing directory is an
 * empty list. Returns 0 or an errno. */
static int cache_list_keys(const char *entries, cache_keylist *kl)
{
    memset(kl, 0, sizeof *kl);
    DIR *d = opendir(entries);
    if (!d)
        return errno == ENOENT ? 0 : errno;
    int rc = 0;
    struct dirent *sd;
    while (rc == 0 && (sd = readdir(d))) {
        if (strlen(sd->d_name) != 2 || !cache_is_hex(sd->d_name, 2))
            continue;
        char shard[PATH_MAX];
        snprintf(shard, sizeof shard, "%s/%s", entries, sd->d_name);
        DIR *s = opendir(shard);
        if (!s) {
            /* Out of file descriptors, say: not an empty shard. */
            if (cache_transient_errno(errno))
                rc = errno;
            continue;
        }
        struct dirent *ed;
        while ((ed = readdir(s))) {
            const char *n = ed->d_name;
            if (strlen(n) != 32 || !cache_is_hex(n, 32) || strncmp(n, sd->d_name, 2) != 0)
                continue;
            if (kl->n == kl->cap) {
                size_t cap = kl->cap ? kl->cap * 2 : 64;
                void *p = realloc(kl->hex, cap * sizeof *kl->hex);
                if (!p) {
                    rc = ENOMEM;
                    break;
                }
                kl->hex = p;
                kl->cap = cap;
            }
            memcpy(kl->hex[kl->n++], n, 33);
        }
        closedir(s);
    }
    closedir(d);
    if (kl->n > 1)
        qsort(kl->hex, kl->n, sizeof *kl->hex, cache_hex_cmp);
    return rc;
}

/* Bytes of the regular files in dir, and the manifest's mtime (else the
 * directory's; *has_manifest says which). */
static void cache_dir_usage(const char *dir, uint64_t *size, int64_t *mtime, int *has_manifest)
{
    *size = 0;
    *mtime = 0;
    *has_manifest = 0;
    struct stat st;
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        /* A file or link where the entry should be: damage, of its size. */
        if (lstat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
            *size = S_ISREG(st.st_mode) ? (uint64_t)st.st_size : 0;
            *mtime = (int64_t)st.st_mtim.tv_sec;
        }
        return;
    }
    if (fstat(fd, &st) == 0)
        *mtime = (int64_t)st.st_mtim.tv_sec;
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        *size += (uint64_t)st.st_size;
        if (!strcmp(de->d_name, "manifest")) {
            *mtime = (int64_t)st.st_mtim.tv_sec;
            *has_manifest = 1;
        }
    }
    closedir(d);
}

static int cache_need_writable(const cache *c, char *err, size_t errlen)
{
    if (c->writable)
        return OPJIT_OK;
    return cache_errf(err, errlen, OPJIT_ECACHE, "cache: %s%s",
                      c->disabled ? "the cache is disabled" : "the cache directory is unusable: ",
                      c->disabled ? "" : (*c->root ? c->root : "(none)"));
}

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

/* ---- removal ------------------------------------------------------------ */

int cache_discard_entry(cache *c, const char *dir, const char *hex, int have_use)
{
    struct stat st;
    if (lstat(dir, &st) != 0)
        return errno == ENOENT ? 0 : errno;
    /* A file or symbolic link where an entry should be never served a
     * load, so nobody uses it: unlinking it is atomic already. */
    if (!S_ISDIR(st.st_mode))
        return unlink(dir) == 0 || errno == ENOENT ? 0 : errno;
    char trash[PATH_MAX];
    snprintf(trash, sizeof trash, "%s/%s.t.XXXXXX", c->tmp, hex);
    if (!mkdtemp(trash))
        return errno;
    /* Renaming over the empty directory mkdtemp made is atomic: the entry
     * leaves entries/ whole, even if we are killed right after. */
    if (rename(dir, trash) != 0) {
        int e = errno;
        rmdir(trash);
        return e == ENOENT ? 0 : e;
    }
    int fd = -1;
    if (have_use || cache_lock(c, hex, CACHE_LOCK_USE, 1, 0, &fd) == 0)
        cache_rm_rf(trash);
    if (fd >= 0)
        close(fd);
    return 0;
}

/* Remove what crashed or killed processes left in tmp/: a build directory
 * whose key nobody is building, a discarded entry nobody uses. */
void cache_clean_tmp(cache *c, uint64_t *removed)
{
    DIR *d = opendir(c->tmp);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if (strlen(n) < 34 || !cache_is_hex(n, 32) || n[32] != '.')
            continue;
        int which;
        if (n[33] == 'b')
            which = CACHE_LOCK_BUILD;
        else if (n[33] == 't' && n[34] == '.')
            which = CACHE_LOCK_USE;
        else
            continue;
        char hex[33], path[PATH_MAX];
        memcpy(hex, n, 32);
        hex[32] = '\0';
        snprintf(path, sizeof path, "%s/%s", c->tmp, n);
        int fd;
        if (cache_lock(c, hex, which, 1, 0, &fd) != 0)
            continue;
        if (cache_rm_rf(path) == 0 && removed)
            (*removed)++;
        close(fd);
    }
    closedir(d);
}

/* Unlink lock files of keys that have no entry and that nobody holds. */
static void cache_clean_locks(cache *c)
{
    DIR *d = opendir(c->locks);
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d))) {
        const char *n = de->d_name;
        if (strlen(n) != 32 || !cache_is_hex(n, 32))
            continue;
        char dir[PATH_MAX], path[PATH_MAX];
        struct stat st;
        cache_entry_dir_of(c->entries, n, dir, sizeof dir);
        if (lstat(dir, &st) == 0)
            continue;
        int fd;
        if (cache_lock(c, n, CACHE_LOCK_FILE, 1, 0, &fd) != 0)
            continue;
        /* Holding the whole file, nobody can be building the key. */
        snprintf(path, sizeof path, "%s/%s", c->locks, n);
        if (lstat(dir, &st) != 0)
            unlink(path);
        close(fd);
    }
    closedir(d);
}

typedef struct cache_victim {
    char hex[33];
    uint64_t size;
    int64_t last_use;
    int damaged;
} cache_victim;

static int cache_victim_cmp(const void *pa, const void *pb)
{
    const cache_victim *a = pa, *b = pb;
    if (a->damaged != b->damaged)
        return b->damaged - a->damaged; /* damaged ones go first */
    if (a->last_use != b->last_use)
        return a->last_use < b->last_use ? -1 : 1;
    return strcmp(a->hex, b->hex);
}

/* Evict least recently used entries until the writable cache holds at most
 * cap bytes (all: every entry), skipping entries in use. */
int cache_evict_to(cache *c, uint64_t cap, int all, cache_prune_result *r, char *err, size_t errlen)
{
    cache_prune_result dummy;
    if (!r)
        r = &dummy;
    int rc = cache_need_writable(c, err, errlen);
    if (rc != OPJIT_OK)
        return rc;
    cache_keylist kl;
    int e = cache_list_keys(c->entries, &kl);
    cache_victim *v = e ? NULL : calloc(kl.n + 1, sizeof *v);
    if (!v) {
        free(kl.hex);
        return cache_errf(err, errlen, e && e != ENOMEM ? OPJIT_EIO : OPJIT_ENOMEM,
                          "cache: cannot list %s: %s", c->entries, strerror(e ? e : ENOMEM));
    }
    uint64_t total = 0;
    for (size_t i = 0; i < kl.n; i++) {
        char dir[PATH_MAX];
        int hasm;
        memcpy(v[i].hex, kl.hex[i], 33);
        cache_entry_dir_of(c->entries, v[i].hex, dir, sizeof dir);
        cache_dir_usage(dir, &v[i].size, &v[i].last_use, &hasm);
        v[i].damaged = !hasm;
        total += v[i].size;
    }
    free(kl.hex);
    if (all || total > cap) {
        qsort(v, kl.n, sizeof *v, cache_victim_cmp);
        for (size_t i = 0; i < kl.n && (all || total > cap); i++) {
            char dir[PATH_MAX], lockpath[PATH_MAX];
            int fd;
            cache_entry_dir_of(c->entries, v[i].hex, dir, sizeof dir);
            if (cache_lock(c, v[i].hex, CACHE_LOCK_USE, 1, 0, &fd) != 0) {
                r->busy++;
                continue;
            }
            /* Rebuilt since we listed it? Then it is not the old one. */
            uint64_t size;
            int64_t last;
            int hasm;
            cache_dir_usage(dir, &size, &last, &hasm);
            if (hasm && last > v[i].last_use && !all) {
                close(fd);
                continue;
            }
            if (cache_discard_entry(c, dir, v[i].hex, 1) == 0) {
                total -= v[i].size < total ? v[i].size : total;
                r->removed++;
                r->removed_bytes += v[i].size;
                cache_logf(c, OPJIT_LOG_INFO, "cache: evicted %s (%llu bytes)", v[i].hex,
                           (unsigned long long)v[i].size);
                /* Its lock file too, when nobody else has it open-locked. */
                if (cache_relock(fd, CACHE_LOCK_FILE, 1, 0) == 0) {
                    snprintf(lockpath, sizeof lockpath, "%s/%s", c->locks, v[i].hex);
                    unlink(lockpath);
                }
            }
            close(fd);
        }
    }
    r->bytes_after = total;
    free(v);
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
