/* runtime/alloc.c - the default allocator: malloc, plus a bounded cache of
 * large freed blocks.
 *
 * Why: the first touch of a fresh page costs a page fault (about 10 us per
 * 4 KiB page on the VMs we measure on: 20 ms for a fresh 8 MB output, 0.3
 * ms to rewrite a reused one). glibc gives large blocks back to the system
 * (above 32 MiB always, smaller ones depending on its thresholds), so a
 * host calling the same op in a loop may fault in every output anew.
 * Blocks of 64 KiB and more are kept on free lists by size class (4
 * classes per power of two: at most 25% more than asked) up to a bound,
 * and handed out again; the host still owns outputs and frees them with
 * their deleters, which may run on any thread and after opjit_destroy.
 *
 * The cache is reference counted: the runtime holds one reference, every
 * block handed out another; opjit_destroy frees what the cache holds and
 * blocks freed afterwards go straight back to the system.
 *
 * Bound: $OPJIT_OUTPUT_CACHE (bytes, with an optional K, M or G suffix; 0
 * turns it off), else 256 MiB or 1/16 of the memory, the smaller. Under
 * AddressSanitizer the default is 0, so reuse never hides a use after
 * free. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "runtime/runtime.h"

#define CACHE_MIN_SHIFT 16 /* 64 KiB */
#define CACHE_NCLASSES (4 * (48 - CACHE_MIN_SHIFT))

typedef struct cached {
    struct cached *next;
} cached;

struct out_cache {
    pthread_mutex_t mu;
    atomic_long refs;   /* the runtime + blocks handed out */
    int closed;         /* the runtime is gone: keep nothing */
    size_t held, cap;   /* bytes on the free lists, bound (under mu) */
    int on;             /* cap is not 0: large blocks go through the lists */
    unsigned long hits, misses;
    cached *free[CACHE_NCLASSES];
};

/* Size class of n >= 64 KiB: its index and its size (n rounded up to a
 * quarter of the power of two below it). -1 when too large. */
static int size_class(size_t n, size_t *size)
{
    int shift = 63 - __builtin_clzll((unsigned long long)n);
    if (shift + 1 >= 48)
        return -1;
    size_t quarter = (size_t)1 << (shift - 2);
    size_t up = (n + quarter - 1) & ~(quarter - 1);
    if (up >> shift == 2) { /* rounded up to the next power of two */
        shift++;
        up = (size_t)1 << shift;
    }
    int sub = (int)((up >> (shift - 2)) & 3); /* 4, 5, 6, 7 quarters -> 0..3 */
    *size = up;
    return (shift - CACHE_MIN_SHIFT) * 4 + sub;
}

/* c->cap before the machine's memory has been asked (never a real bound). */
#define CACHE_CAP_UNKNOWN (SIZE_MAX - 1)

/* The bound the settings give ($OPJIT_OUTPUT_CACHE), else 0 when the
 * cache is off (a sanitizer build), else CACHE_CAP_UNKNOWN: a sixteenth
 * of the memory up to 256 MiB, asked at the first block kept (memory_cap),
 * so a runtime that only loads asks nothing of the kernel. */
static size_t default_cap(opjit_runtime *rt)
{
    if (rt->set.output_cache_set)
        return rt->set.output_cache < SIZE_MAX ? (size_t)rt->set.output_cache : SIZE_MAX;
#if defined(__SANITIZE_ADDRESS__)
    return 0;
#else
    return CACHE_CAP_UNKNOWN;
#endif
}

static size_t memory_cap(void)
{
    size_t cap = (size_t)256 << 20;
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    if (pages > 0 && psz > 0 && (size_t)pages / 16 * (size_t)psz < cap)
        cap = (size_t)pages / 16 * (size_t)psz;
    return cap;
}

out_cache *out_cache_new(opjit_runtime *rt)
{
    out_cache *c = calloc(1, sizeof *c);
    if (!c)
        return NULL;
    if (pthread_mutex_init(&c->mu, NULL)) {
        free(c);
        return NULL;
    }
    atomic_init(&c->refs, 1);
    c->cap = default_cap(rt);
    c->on = c->cap != 0;
    return c;
}

static void cache_unref(out_cache *c)
{
    if (atomic_fetch_sub(&c->refs, 1) == 1) {
        pthread_mutex_destroy(&c->mu);
        free(c);
    }
}

/* Free what the cache holds; blocks freed later are not kept. */
void out_cache_close(out_cache *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->mu);
    c->closed = 1;
    for (int i = 0; i < CACHE_NCLASSES; i++)
        while (c->free[i]) {
            cached *b = c->free[i];
            c->free[i] = b->next;
            free(b);
        }
    c->held = 0;
    pthread_mutex_unlock(&c->mu);
    cache_unref(c);
}

void out_cache_stats(out_cache *c, size_t *held, unsigned long *hits, unsigned long *misses)
{
    pthread_mutex_lock(&c->mu);
    *held = c->held;
    *hits = c->hits;
    *misses = c->misses;
    pthread_mutex_unlock(&c->mu);
}

/* A block of at least n bytes: one kept of n's class, else a new one. */
static void *cache_get(out_cache *c, size_t n)
{
    size_t size;
    int k = size_class(n, &size);
    void *p = NULL;
    if (k < 0) /* too large to keep */
        return malloc(n);
    pthread_mutex_lock(&c->mu);
    if (c->free[k]) {
        cached *b = c->free[k];
        c->free[k] = b->next;
        c->held -= size;
        c->hits++;
        p = b;
    } else {
        c->misses++;
    }
    pthread_mutex_unlock(&c->mu);
    return p ? p : malloc(size);
}

/* Keep block p of n bytes, or free it when the cache is closed or full. */
static void cache_put(out_cache *c, void *p, size_t n)
{
    size_t size;
    int k = size_class(n, &size);
    pthread_mutex_lock(&c->mu);
    if (c->cap == CACHE_CAP_UNKNOWN)
        c->cap = memory_cap();
    if (k >= 0 && !c->closed && size <= c->cap && size <= c->cap - c->held) {
        cached *b = p;
        b->next = c->free[k];
        c->free[k] = b;
        c->held += size;
        p = NULL;
    }
    pthread_mutex_unlock(&c->mu);
    free(p);
}

/* Whether a block of n bytes goes through the free lists. */
static int cache_big(const out_cache *c, size_t n)
{
    return c->on && n >= ((size_t)1 << CACHE_MIN_SHIFT);
}

/* The opjit_alloc_fn of the default allocator; ud is the cache. Every
 * block holds a reference on the cache (so a deleter running after
 * opjit_destroy still finds it); blocks below 64 KiB, and all when the
 * cache is off, are plain malloc blocks. */
void *out_cache_alloc(void *ud, void *ptr, size_t osize, size_t nsize)
{
    out_cache *c = ud;
    void *p;
    if (nsize == 0) {
        if (!ptr)
            return NULL;
        if (cache_big(c, osize))
            cache_put(c, ptr, osize);
        else
            free(ptr);
        cache_unref(c);
        return NULL;
    }
    if (ptr && !cache_big(c, osize) && !cache_big(c, nsize))
        return realloc(ptr, nsize);
    p = cache_big(c, nsize) ? cache_get(c, nsize) : malloc(nsize);
    if (!p)
        return NULL; /* a failed realloc leaves ptr alone */
    if (ptr) { /* a move between kinds or classes; the reference moves too */
        memcpy(p, ptr, osize < nsize ? osize : nsize);
        if (cache_big(c, osize))
            cache_put(c, ptr, osize);
        else
            free(ptr);
    } else {
        atomic_fetch_add(&c->refs, 1);
    }
    return p;
}

/* ---- through the runtime's allocator (the default one or the host's) ---- */

void *rt_alloc(opjit_runtime *rt, size_t n) { return rt->alloc(rt->alloc_ud, NULL, 0, n); }

void rt_free(opjit_runtime *rt, void *p, size_t n)
{
    if (p)
        rt->alloc(rt->alloc_ud, p, n, 0);
}
