/*
 * ops-src/cuda_handles.h - library handles (cuDNN, cuBLAS) for the host
 * halves of .cu ops, kept per device for the life of the process, one per
 * call in flight. A local header of conv2d.cu and mm.cu (part of both
 * cache keys); each op has pools of its own.
 *
 *   static handle_pool pool = HANDLE_POOL_INIT;
 *   void *h = handle_pool_take(&pool, dev);
 *   if (!h) ... create one (in the call's context, which is current) ...
 *   ... use h on the call's stream ...
 *   handle_pool_give(&pool, dev, h);
 *
 * A handle is created in the context current at its first use on dev and
 * used from then on by whichever call on dev takes it.
 */
#ifndef OPJIT_CUDA_HANDLES_H
#define OPJIT_CUDA_HANDLES_H

#include <pthread.h>

#define HANDLE_POOL_DEVICES 64 /* device ids 0..63 */
#define HANDLE_POOL_SIZE 16    /* handles kept per device */

typedef struct handle_pool {
    pthread_mutex_t lock;
    void *free_[HANDLE_POOL_DEVICES][HANDLE_POOL_SIZE];
    int nfree[HANDLE_POOL_DEVICES];
} handle_pool;

#define HANDLE_POOL_INIT {PTHREAD_MUTEX_INITIALIZER, {{0}}, {0}}

/* Whether dev has a row in the pool. */
static inline int handle_pool_has_device(int dev) { return dev >= 0 && dev < HANDLE_POOL_DEVICES; }

/* A free handle of dev, or NULL: then the caller creates one. */
static inline void *handle_pool_take(handle_pool *p, int dev)
{
    void *h = NULL;
    if (!handle_pool_has_device(dev))
        return NULL;
    pthread_mutex_lock(&p->lock);
    if (p->nfree[dev] > 0)
        h = p->free_[dev][--p->nfree[dev]];
    pthread_mutex_unlock(&p->lock);
    return h;
}

/* h back to dev's free list. Beyond HANDLE_POOL_SIZE concurrent calls a
 * handle is leaked rather than destroyed under a running stream. */
static inline void handle_pool_give(handle_pool *p, int dev, void *h)
{
    if (!h || !handle_pool_has_device(dev))
        return;
    pthread_mutex_lock(&p->lock);
    if (p->nfree[dev] < HANDLE_POOL_SIZE)
        p->free_[dev][p->nfree[dev]++] = h;
    pthread_mutex_unlock(&p->lock);
}

#endif
