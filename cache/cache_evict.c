/*
 * cache/cache_evict.c - the entries on disk, listed and removed: LRU
 * eviction under the size cap, and cleaning what crashed processes left in
 * tmp/ and locks/. Below cache.c (publishing evicts) and cache_admin.c
 * (prune, clear, repair).
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

static int cache_hex_cmp(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

static int cache_keylist_add(cache_keylist *kl, const char *hex)
{
    if (kl->n == kl->cap) {
        size_t cap = kl->cap ? kl->cap * 2 : 64;
        void *p = realloc(kl->hex, cap * sizeof *kl->hex);
        if (!p)
            return ENOMEM;
        kl->hex = p;
        kl->cap = cap;
    }
    memcpy(kl->hex[kl->n++], hex, 33);
    return 0;
}

static int cache_keylist_bad(cache_keylist *kl, const char *shard)
{
    if (kl->nbad == kl->capbad) {
        size_t cap = kl->capbad ? kl->capbad * 2 : 8;
        void *p = realloc(kl->bad, cap * sizeof *kl->bad);
        if (!p)
            return ENOMEM;
        kl->bad = p;
        kl->capbad = cap;
    }
    memcpy(kl->bad[kl->nbad++], shard, 3);
    return 0;
}

void cache_keylist_free(cache_keylist *kl)
{
    free(kl->hex);
    free(kl->bad);
    memset(kl, 0, sizeof *kl);
}

/* The keys of one shard (sfd, closed here) into kl. */
static int cache_list_shard(int sfd, const char *shard, cache_keylist *kl)
{
    DIR *s = fdopendir(sfd);
    if (!s) {
        close(sfd);
        return cache_transient_errno(errno) ? errno : 0;
    }
    int rc = 0;
    struct dirent *ed;
    while (rc == 0 && (ed = readdir(s))) {
        const char *n = ed->d_name;
        if (strlen(n) == 32 && cache_is_hex(n, 32) && !strncmp(n, shard, 2))
            rc = cache_keylist_add(kl, n);
    }
    closedir(s);
    return rc;
}

/* The keys under an entries/ directory of c, sorted; shards that are not
 * directories (a symbolic link, a file) in kl->bad, never entered. A
 * missing directory is an empty list. Returns 0 or an errno. */
static int list_keys(const cache *c, const char *entries, cache_keylist *kl);

/* An opjit status; errno says which failure. */
int cache_list_keys(const cache *c, const char *entries, cache_keylist *kl)
{
    return cache_status_errno(list_keys(c, entries, kl));
}

/* cache_list_keys, returning 0 or an errno. */
static int list_keys(const cache *c, const char *entries, cache_keylist *kl)
{
    memset(kl, 0, sizeof *kl);
    int efd = cache_open_below(c, entries, NULL, 0);
    int dfd = efd < 0 ? -1 : dup(efd);
    DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
    if (!d) {
        int e = errno;
        if (dfd >= 0)
            close(dfd);
        if (efd >= 0)
            close(efd);
        return e == ENOENT ? 0 : e;
    }
    int rc = 0;
    struct dirent *sd;
    while (rc == 0 && (sd = readdir(d))) {
        if (strlen(sd->d_name) != 2 || !cache_is_hex(sd->d_name, 2))
            continue;
        int sfd = openat(efd, sd->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sfd >= 0)
            rc = cache_list_shard(sfd, sd->d_name, kl);
        else if (errno == ENOTDIR || errno == ELOOP)
            rc = cache_keylist_bad(kl, sd->d_name);
        else if (cache_transient_errno(errno)) /* out of descriptors: not an empty shard */
            rc = errno;
    }
    closedir(d);
    close(efd);
    if (kl->n > 1)
        qsort(kl->hex, kl->n, sizeof *kl->hex, cache_hex_cmp);
    return rc;
}

/* Bytes of the regular files in dir, and the manifest's mtime (else the
 * directory's; *has_manifest says which). */
void cache_dir_usage(const cache *c, const char *dir, uint64_t *size, int64_t *mtime,
                     int *has_manifest)
{
    *size = 0;
    *mtime = 0;
    *has_manifest = 0;
    struct stat st;
    int fd = cache_open_below(c, dir, NULL, 0);
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

int cache_need_writable(const cache *c, char *err, size_t errlen)
{
    if (c->writable)
        return OPJIT_OK;
    return cache_errf(err, errlen, OPJIT_ECACHE, "cache: %s%s",
                      c->disabled ? "the cache is disabled" : "the cache directory is unusable: ",
                      c->disabled ? "" : (*c->root ? c->root : "(none)"));
}

/* ---- removal ------------------------------------------------------------ */

/* name in dirfd, unless it is a directory: unlinked (a symbolic link
 * itself, never what it points at). 1: gone (or never there), 0: a
 * directory, left as is; else -errno. */
static int cache_unlink_nondir(int dirfd, const char *name)
{
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 1 : -errno;
    if (S_ISDIR(st.st_mode))
        return 0;
    return unlinkat(dirfd, name, 0) == 0 || errno == ENOENT ? 1 : -errno;
}

static int cache_discard_shard_errno(cache *c, const char *shard);

/* An opjit status (cache_layer.h); errno says which failure. */
int cache_discard_shard(cache *c, const char *shard)
{
    return cache_status_errno(cache_discard_shard_errno(c, shard));
}

/* cache_discard_shard, returning 0 or an errno. */
static int cache_discard_shard_errno(cache *c, const char *shard)
{
    int efd = cache_open_below(c, c->entries, NULL, 0);
    if (efd < 0)
        return errno == ENOENT ? 0 : errno;
    int r = cache_unlink_nondir(efd, shard);
    close(efd);
    return r < 0 ? -r : 0;
}

/* The shard directory of hex, open; -1 with *gone (nothing to discard:
 * absent, or not a directory and unlinked now) or *e. */
static int cache_open_shard(cache *c, const char *hex, int *gone, int *e)
{
    char shard[3] = {hex[0], hex[1], '\0'};
    *gone = *e = 0;
    int efd = cache_open_below(c, c->entries, NULL, 0);
    if (efd < 0) {
        *gone = errno == ENOENT;
        *e = *gone ? 0 : errno;
        return -1;
    }
    int r = cache_unlink_nondir(efd, shard);
    int sfd = r == 0 ? openat(efd, shard, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
    if (r == 0 && sfd < 0)
        r = errno == ENOENT ? 1 : -errno;
    close(efd);
    *gone = r > 0;
    *e = r < 0 ? -r : 0;
    return sfd;
}

static int cache_discard_entry_errno(cache *c, const char *dir, const char *hex, int have_use);

/* An opjit status (cache_layer.h); errno says which failure. */
int cache_discard_entry(cache *c, const char *dir, const char *hex, int have_use)
{
    return cache_status_errno(cache_discard_entry_errno(c, dir, hex, have_use));
}

/* cache_discard_entry, returning 0 or an errno. */
static int cache_discard_entry_errno(cache *c, const char *dir, const char *hex, int have_use)
{
    (void)dir; /* reached by descriptors from entries/: no link is followed */
    int gone, e;
    int sfd = cache_open_shard(c, hex, &gone, &e);
    if (sfd < 0)
        return e;
    /* A file or symbolic link where an entry should be never served a
     * load, so nobody uses it: unlinking it is atomic already. */
    int r = cache_unlink_nondir(sfd, hex);
    if (r != 0) {
        close(sfd);
        return r > 0 ? 0 : -r;
    }
    char trash[PATH_MAX];
    snprintf(trash, sizeof trash, "%s/%s.t.XXXXXX", c->tmp, hex);
    if (!mkdtemp(trash)) {
        e = errno;
        close(sfd);
        return e;
    }
    /* Renaming over the empty directory mkdtemp made is atomic: the entry
     * leaves entries/ whole, even if we are killed right after. */
    r = renameat(sfd, hex, AT_FDCWD, trash);
    e = r ? errno : 0;
    close(sfd);
    if (r) {
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
void cache_clean_locks(cache *c)
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

/* ---- the usage ledger ---------------------------------------------------- */

/* v1/usage holds "opjit-cache-usage 1 BYTES INSTALLS\n": the bytes of the
 * entries as the last walk of the cache counted them plus those installed
 * since, and how many were installed, read and written under an exclusive
 * lock on the file. It saves every build a walk of every entry (3,000
 * entries: 40 ms) to learn the cache is under its cap. What it cannot see
 * (entries removed or added by hand, a process killed between its rename
 * and its update, damaged entries discarded) a walk corrects: one runs
 * when the ledger is missing or unreadable, says the cap is passed, or has
 * counted CACHE_WALK_EVERY more installs. A cache whose entries/ this
 * process made starts its ledger without a walk: what another process
 * installed meanwhile, it counts itself once it gets the lock. */
#define CACHE_WALK_EVERY 256
#define CACHE_USAGE_MAGIC "opjit-cache-usage 1"

/* v1/usage, opened (created) and locked; -1 when it cannot be, or is not
 * a regular file of ours. */
static int usage_open(const cache *c)
{
    char path[PATH_MAX];
    if ((size_t)snprintf(path, sizeof path, "%s/v1/usage", c->root) >= sizeof path)
        return -1;
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) || !S_ISREG(st.st_mode) ||
                    cache_untrusted(&st, CACHE_OWNER_SELF, c->euid) ||
                    cache_relock(fd, CACHE_LOCK_FILE, 1, 1) != OPJIT_OK)) {
        close(fd);
        fd = -1;
    }
    return fd;
}

/* The ledger's counts: 1; 0 when it is empty (new), -1 when damaged. */
static int usage_read(int fd, uint64_t *bytes, uint64_t *installs)
{
    char buf[128];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return n == 0 ? 0 : -1;
    buf[n] = '\0';
    unsigned long long b, i;
    char end;
    return sscanf(buf, CACHE_USAGE_MAGIC " %llu %llu%c", &b, &i, &end) == 3 && end == '\n'
               ? (*bytes = b, *installs = i, 1)
               : -1;
}

static void usage_write(int fd, uint64_t bytes, uint64_t installs)
{
    char buf[128];
    int n = snprintf(buf, sizeof buf, CACHE_USAGE_MAGIC " %llu %llu\n",
                     (unsigned long long)bytes, (unsigned long long)installs);
    if (pwrite(fd, buf, (size_t)n, 0) == n)
        (void)!ftruncate(fd, n);
}

int cache_usage_add(cache *c, uint64_t bytes)
{
    int fd = usage_open(c);
    uint64_t total = 0, installs = 0;
    int got = fd >= 0 ? usage_read(fd, &total, &installs) : -1;
    int known = got == 1 || (got == 0 && c->entries_new);
    if (known)
        usage_write(fd, total + bytes, installs + 1);
    if (fd >= 0)
        close(fd);
    return !known || total + bytes > c->max_size || (installs + 1) % CACHE_WALK_EVERY == 0;
}

/* What a walk counted: the ledger starts again from it. */
static void usage_set(cache *c, uint64_t bytes)
{
    int fd = usage_open(c);
    uint64_t old = 0, installs = 0;
    if (fd < 0)
        return;
    usage_read(fd, &old, &installs);
    usage_write(fd, bytes, installs);
    close(fd);
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
    int e = cache_list_keys(c, c->entries, &kl) ? errno : 0;
    cache_victim *v = e ? NULL : calloc(kl.n + 1, sizeof *v);
    if (!v) {
        cache_keylist_free(&kl);
        return cache_errf(err, errlen, e && e != ENOMEM ? OPJIT_EIO : OPJIT_ENOMEM,
                          "cache: cannot list %s: %s", c->entries, strerror(e ? e : ENOMEM));
    }
    uint64_t total = 0;
    size_t nv = kl.n;
    for (size_t i = 0; all && i < kl.nbad; i++) /* clear: a link as a shard goes too */
        cache_discard_shard(c, kl.bad[i]);
    for (size_t i = 0; i < nv; i++) {
        char dir[PATH_MAX];
        int hasm;
        memcpy(v[i].hex, kl.hex[i], 33);
        cache_entry_dir_of(c->entries, v[i].hex, dir, sizeof dir);
        cache_dir_usage(c, dir, &v[i].size, &v[i].last_use, &hasm);
        v[i].damaged = !hasm;
        total += v[i].size;
    }
    cache_keylist_free(&kl);
    if (all || total > cap) {
        qsort(v, nv, sizeof *v, cache_victim_cmp);
        for (size_t i = 0; i < nv && (all || total > cap); i++) {
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
            cache_dir_usage(c, dir, &size, &last, &hasm);
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
    usage_set(c, total);
    free(v);
    return OPJIT_OK;
}
