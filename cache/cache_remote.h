/*
 * cache/cache_remote.h - the remote layer (Redis) behind the writable cache;
 * shared by the files of cache/ only.
 *
 * Redis holds one value per entry under "opjit:v1:<key hex>":
 *
 *   opjit-remote 1 hmac-sha256 <64 hex>\n     (or "opjit-remote 1 unsigned\n")
 *   key <32 hex>\n                            \
 *   <size> manifest\n<the manifest's bytes>    | the body, covered by the
 *   <size> <artifact>\n<its bytes>  ...        | signature (with the Redis key)
 *   end\n                                     /
 *
 * A value is written once (SET NX: the first writer wins) and read by
 * writing its files into the cache's tmp/, checking them like any entry
 * (cache_check: manifest, sizes, checksums, ELF completeness) and renaming
 * the directory into entries/. "opjit:v1:lock:<key hex>" is the fleet build
 * lock (SET NX PX lease, holding a random token).
 */
#ifndef OPJIT_CACHE_REMOTE_H
#define OPJIT_CACHE_REMOTE_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "cache/cache.h"

typedef struct cache_remote cache_remote;
struct cache_manifest;
struct redisReply;

#define SIGN_MAC_LEN 32
#define REMOTE_PREFIX "opjit:v1:"
#define REMOTE_LOCK_PREFIX "opjit:v1:lock:"

/* cache_sign.c */
/* Read the fleet key from path: absolute, a regular file of 16 to 4096
 * bytes that we or root own and nobody else may read or write, in trusted
 * directories. OPJIT_OK (*key malloc'd: free with sign_key_free), or
 * OPJIT_EINVAL and why. */
int sign_key_load(const char *path, uid_t euid, unsigned char **key, size_t *len, char *why,
                  size_t whylen);
void sign_key_free(unsigned char *key, size_t len);
/* HMAC-SHA256 over a domain tag, rkey (with its NUL) and body. OPJIT_OK
 * or OPJIT_EIO. */
int sign_compute(const unsigned char *key, size_t keylen, const char *rkey, const void *body,
                 size_t len, unsigned char mac[SIGN_MAC_LEN]);
/* Constant-time comparison of two MACs: 1 when equal. */
int sign_equal(const unsigned char *a, const unsigned char *b);

/* cache_redis.c: one connection per cache, its time limits and back-off. */
typedef struct redis_link redis_link;
/* Parse url ("redis://HOST[:PORT][/DB]", "redis+unix:///path[?db=N]").
 * NULL and why when it is not one. */
redis_link *redis_link_new(const char *url, int connect_ms, int timeout_ms, int backoff_ms,
                           char *why, size_t whylen);
void redis_link_free(redis_link *r);
const char *redis_link_url(const redis_link *r);
/* Run one command, sending it and receiving its whole reply within the
 * link's timeout_ms however slowly the server sends, the reply at most
 * max_reply bytes. OPJIT_OK (*out: the reply, freeReplyObject it; a
 * reply of type error too); OPJIT_ECACHE when the reply is larger (not
 * read: the connection is dropped); OPJIT_EIO when the server could
 * not be reached or did not answer in time (then the link backs off: later
 * commands fail at once for backoff_ms; one warning per outage through
 * c's log). */
int redis_request(const cache *c, redis_link *r, int argc, const char **argv,
                  const size_t *lens, size_t max_reply, struct redisReply **out);
/* redis_request with a reply of at most 1 MiB: the reply, or NULL. */
struct redisReply *redis_run(const cache *c, redis_link *r, int argc, const char **argv,
                             const size_t *lens);
/* 1 while the link is backing off after a failure. */
int redis_down(redis_link *r);

/* cache_remote.c */
/* The remote layer of c, from cfg and the environment; *out NULL when none
 * is configured or it cannot be used (warned about once). Fails only for
 * lack of memory. */
int cache_remote_open(cache *c, const cache_config *cfg, cache_remote **out);
void cache_remote_close(cache_remote *r);

/* Its fetch, publish and unlock are the layer cache_remote_layer
 * (cache_layer.h): a local miss asks it, a build is published there. */
int cache_remote_push_hits(const cache *c);
/* One command on c's remote (see redis_run); NULL when there is none. */
struct redisReply *cache_remote_cmd(cache *c, int argc, const char **argv, const size_t *lens);
int cache_remote_readonly(const cache *c);
int cache_remote_signed(const cache *c);

#endif
