/*
 * cache/cache_layer.h - one interface for the layers of a cache, walked
 * in order by cache_fetch (cache.c): the read-only layers (search order),
 * the writable cache, then the remote (Redis). Each is an instance of
 * cache_layer_ops; an operation a layer has no use for is NULL.
 *
 *   look up   the entry of a key, verified before anything is loaded from
 *             it (manifest, sizes, checksums, ELF completeness, owners):
 *             directory layers (read-only, writable)
 *   lock      one builder per key: the writable cache across this
 *             machine's processes (its remote peer takes the fleet's lock
 *             in fetch, where waiting for another builder polls for its
 *             value)
 *   fetch     install the entry from this layer into the writable cache,
 *             verified there like any entry: the remote
 *   publish   store a built entry: the writable cache (atomic rename), the
 *             remote (first writer wins, signed)
 *
 * The one return convention of cache/: an opjit_status. For an entry,
 *   OPJIT_OK         found and verified (or done)
 *   OPJIT_ENOTFOUND  not in this layer
 *   OPJIT_ECACHE     there but damaged (why says how): evict or skip it
 *   OPJIT_EIO        not checked, for a reason that says nothing about the
 *                    entry (out of descriptors or memory, an I/O error, a
 *                    server down): never evicted for that
 * Detail a caller acts on beyond the status (which errno) is left in
 * errno, as libc does; predicates return 1 or 0.
 */
#ifndef OPJIT_CACHE_LAYER_H
#define OPJIT_CACHE_LAYER_H

#include <stddef.h>

#include "cache/cache.h"

struct cache_manifest;
typedef struct cache_layer cache_layer;

#define CACHE_LAYER_TOKEN 64 /* a layer lock's token (the remote's) */

/* A lock a layer holds for one key, from lock or a claiming fetch. */
typedef struct cache_layer_lock {
    int fd;                        /* a directory layer's lock file, -1 */
    char token[CACHE_LAYER_TOKEN]; /* the remote's fleet lock, "" */
} cache_layer_lock;

typedef struct cache_layer_ops {
    const char *kind; /* "read-only", "writable", "remote" */
    /* The entry of req in this layer, verified (CACHE_CHK_* flags from the
     * layer; touch: also update its last-use time): OPJIT_OK with *m (free
     * with cache_manifest_free) and dir its directory, or as above. */
    int (*lookup)(cache_layer *l, const cache_request *req, int touch, char *dir, size_t dirlen,
                  struct cache_manifest *m, char *why, size_t whylen);
    /* Take the key's build lock, waiting for a builder holding it:
     * OPJIT_OK (lk holds it) or OPJIT_EIO, errno saying why. */
    int (*lock)(cache_layer *l, const cache_request *req, cache_layer_lock *lk);
    /* Install req's entry from this layer at dir (the writable cache's;
     * the caller holds its build lock): OPJIT_OK when a verified entry is
     * at dir (*keep, which may be NULL, its manifest unless another
     * process installed it first: then check dir), else OPJIT_ENOTFOUND.
     * claim: a miss takes this layer's build lock (lk), so that one
     * builder per key builds; after waiting too long for another, or with
     * the layer down, nobody's (lk empty). */
    int (*fetch)(cache_layer *l, const cache_request *req, const char *dir, int claim,
                 struct cache_manifest *keep, cache_layer_lock *lk);
    /* Store the entry built at tmp (a directory this process made, its
     * manifest written) as req's entry, dir (the writable cache: an atomic
     * rename), or the entry published at dir (the remote: its copy, unless
     * it has one; lk NULL: a local hit pushed); then drop lk. OPJIT_OK, or
     * why not, errno set (EEXIST: the entry is there already; EPERM: a
     * directory on the way is not trusted). */
    int (*publish)(cache_layer *l, const cache_request *req, const char *tmp, const char *dir,
                   cache_layer_lock *lk);
    /* Drop lk without publishing (the build failed or was not needed). */
    void (*unlock)(cache_layer *l, const cache_request *req, cache_layer_lock *lk);
} cache_layer_ops;

struct cache_layer {
    const cache_layer_ops *ops;
    cache *c;
    const char *root; /* a directory layer's root; the remote's URL */
    int writable;     /* the writable cache */
    int push;         /* publish local hits too (warming the remote) */
};

extern const cache_layer_ops cache_readonly_layer; /* cache_layer_dir.c */
extern const cache_layer_ops cache_writable_layer; /* cache_layer_dir.c */
extern const cache_layer_ops cache_remote_layer;   /* cache_remote.c */

/* An empty lock. */
static inline cache_layer_lock cache_layer_nolock(void)
{
    cache_layer_lock lk = {.fd = -1, .token = ""};
    return lk;
}

#endif
