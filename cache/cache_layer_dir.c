/* cache/cache_layer_dir.c - the directory layers of a cache as instances
 * of cache_layer_ops (cache_layer.h): read-only layers (look up only) and
 * the writable cache (look up, lock, publish). Both verify an entry with
 * cache_check, the one verifier, before anything is loaded from it. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cache/cache_int.h"

/* A read-only layer: its files ours or root's, never touched. */
static int ro_lookup(cache_layer *l, const cache_request *req, int touch, char *dir,
                     size_t dirlen, cache_manifest *m, char *why, size_t whylen)
{
    (void)touch;
    snprintf(dir, dirlen, "%s/v1/entries/%.2s/%s", l->root, req->key.hex, req->key.hex);
    return cache_check(l->c, dir, req->key.hex, CACHE_CHK_SUMS, m, why, whylen);
}

/* The writable cache: its files ours only; a hit keeps its last use. */
static int rw_lookup(cache_layer *l, const cache_request *req, int touch, char *dir,
                     size_t dirlen, cache_manifest *m, char *why, size_t whylen)
{
    cache_entry_dir_of(l->c->entries, req->key.hex, dir, dirlen);
    int flags = CACHE_CHK_SUMS | CACHE_CHK_OWNER | (touch ? CACHE_CHK_TOUCH : 0);
    return cache_check(l->c, dir, req->key.hex, flags, m, why, whylen);
}

static int rw_lock(cache_layer *l, const cache_request *req, cache_layer_lock *lk)
{
    return cache_lock(l->c, req->key.hex, CACHE_LOCK_BUILD, 1, 1, &lk->fd);
}

static void rw_unlock(cache_layer *l, const cache_request *req, cache_layer_lock *lk)
{
    (void)l;
    (void)req;
    if (lk && lk->fd >= 0)
        close(lk->fd);
    if (lk)
        lk->fd = -1;
}

int cache_install_dir(cache *c, const char *hex, const char *tmp, const char *dir)
{
    (void)dir; /* reached from entries/ by descriptors: no link is followed */
    char shard[3] = {hex[0], hex[1], '\0'};
    struct stat st;
    int efd = cache_open_below(c, c->entries, NULL, 0);
    if (efd < 0)
        return cache_status_errno(errno == ENOTDIR ? EPERM : errno);
    int sfd = mkdirat(efd, shard, 0700) != 0 && errno != EEXIST
                  ? -1
                  : openat(efd, shard, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    int e = sfd < 0 ? (errno == ENOTDIR || errno == ELOOP ? EPERM : errno) : 0;
    close(efd);
    if (!e && (fstat(sfd, &st) != 0 || cache_untrusted(&st, CACHE_OWNER_SELF, c->euid)))
        e = EPERM;
    /* rename() of a directory is atomic: others see no entry or all of it. */
    if (!e && renameat(AT_FDCWD, tmp, sfd, hex) != 0)
        e = errno;
    if (sfd >= 0)
        close(sfd);
    return cache_status_errno(e);
}

static int rw_publish(cache_layer *l, const cache_request *req, const char *tmp,
                      const char *dir, cache_layer_lock *lk)
{
    int rc = cache_install_dir(l->c, req->key.hex, tmp, dir);
    int e = errno;
    rw_unlock(l, req, lk);
    errno = e;
    return rc;
}

const cache_layer_ops cache_readonly_layer = {
    .kind = "read-only",
    .lookup = ro_lookup,
};

const cache_layer_ops cache_writable_layer = {
    .kind = "writable",
    .lookup = rw_lookup,
    .lock = rw_lock,
    .publish = rw_publish,
    .unlock = rw_unlock,
};
