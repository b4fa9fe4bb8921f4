/* runtime/reclaim.c - when replaced code may be unloaded: no call that
 * could have picked it is still running.
 *
 * An epoch scheme, process-wide. Each thread that calls has a record of its
 * own (a cache line, never shared with another thread's); a call stores in
 * it the epoch it began in and clears it when it ends. Retiring code bumps
 * the epoch after taking the code out of the dispatch table: a call that
 * began in a later epoch can only have seen the new table, so the code may
 * go once no thread's record holds that epoch or an earlier one. A call
 * pays one store and one thread-local read at each end, takes no lock and
 * shares no written cache line with other calls.
 *
 * The store that marks a call must be seen by the scan before the call
 * loads its kernel. A fence per call would cost more than the rest of the
 * bookkeeping, so the fence is asymmetric where Linux has it: the scan
 * first runs membarrier(PRIVATE_EXPEDITED), a full barrier on every
 * thread of the process; a call's store then needs none. Without it
 * (a kernel before 4.14, a sandbox refusing it) calls store with a fence.
 *
 * Records are claimed on a thread's first call, given back when it ends
 * (a pthread key's destructor) and reused; the list only grows to the
 * most threads that ever called at once. */
#include <linux/membarrier.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "runtime/runtime.h"

typedef reclaim_reader reader;

/* Padded: records of threads calling at once never share a cache line. */
typedef union reader_line {
    reader r;
    char pad[64];
} reader_line;

_Atomic uint64_t reclaim_epoch = 1;
int reclaim_asym;
_Thread_local reclaim_thread reclaim_me;
static _Atomic(reader *) readers;
/* Calls running without a record (it could not be allocated): while any
 * does, nothing is reclaimed. */
static _Atomic long unrecorded;
static pthread_once_t key_once = PTHREAD_ONCE_INIT;
static pthread_key_t reader_key;
static int key_made;

#define me reclaim_me
#define epoch reclaim_epoch
#define asym reclaim_asym

static void reader_release(void *p)
{
    reader *r = p;
    if (me.r == r) /* a later destructor that calls claims another */
        me.r = NULL;
    atomic_store_explicit(&r->active, 0, memory_order_release);
    atomic_store_explicit(&r->used, 0, memory_order_release);
}

/* A forked child has only the forking thread: the others' records are free. */
static void reclaim_after_fork(void)
{
    for (reader *r = atomic_load(&readers); r; r = r->next)
        if (r != me.r)
            reader_release(r);
    atomic_store(&unrecorded, me.unrecorded ? 1 : 0);
}

static void make_key(void)
{
    key_made = pthread_key_create(&reader_key, reader_release) == 0;
    pthread_atfork(NULL, NULL, reclaim_after_fork);
#ifdef SYS_membarrier
    /* Asked, not registered: registering waits for an RCU grace period
     * when the process has threads (milliseconds on a busy machine), a
     * price only the first scan pays (reclaim_oldest), never a create. */
    long cmds = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0);
    asym = cmds > 0 && (cmds & MEMBARRIER_CMD_PRIVATE_EXPEDITED) &&
           (cmds & MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED);
#endif
}

#ifdef SYS_membarrier
static int registered; /* 1: registered; -1: refused (nothing is reclaimed) */
static pthread_once_t register_once = PTHREAD_ONCE_INIT;

/* Calls made before the registration stored without a fence too: the
 * barrier the scan runs after it reaches every thread that runs now, and a
 * thread that does not has been switched out since (a full barrier). */
static void register_asym(void)
{
    registered = syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0) == 0
                     ? 1 : -1;
}
#endif

/* The library unloaded (a host dlclosing it): no destructor may point here. */
__attribute__((destructor)) static void reclaim_fini(void)
{
    if (key_made)
        pthread_key_delete(reader_key);
}

/* This thread's record: a free one reused, else a new one; NULL when out of
 * memory. */
static reader *reader_claim(void)
{
    pthread_once(&key_once, make_key);
    reader *r = atomic_load(&readers);
    for (; r; r = r->next) {
        int free_ = 0;
        if (atomic_compare_exchange_strong(&r->used, &free_, 1))
            break;
    }
    if (!r) {
        reader_line *line = aligned_alloc(sizeof *line, sizeof *line);
        if (!line)
            return NULL;
        memset(line, 0, sizeof *line);
        r = &line->r;
        atomic_init(&r->active, 0);
        atomic_init(&r->used, 1);
        reader *head = atomic_load(&readers);
        do
            r->next = head;
        while (!atomic_compare_exchange_weak(&readers, &head, r));
    }
    if (key_made)
        pthread_setspecific(reader_key, r);
    return me.r = r;
}

void reclaim_enter_slow(void)
{
    reader *r = me.r ? me.r : reader_claim();
    if (__builtin_expect(!r, 0)) {
        me.unrecorded = 1;
        atomic_fetch_add(&unrecorded, 1);
        return;
    }
    uint64_t e = atomic_load_explicit(&epoch, memory_order_acquire);
    if (asym) {
        atomic_store_explicit(&r->active, e, memory_order_release);
        atomic_signal_fence(memory_order_seq_cst);
    } else { /* no barrier from the scan: this store orders itself */
        atomic_store(&r->active, e);
    }
}

void reclaim_exit_slow(void)
{
    if (me.unrecorded) {
        me.unrecorded = 0;
        atomic_fetch_sub_explicit(&unrecorded, 1, memory_order_release);
    } else if (me.r) {
        atomic_store_explicit(&me.r->active, 0, memory_order_release);
    }
}

uint64_t reclaim_retire(void)
{
    return atomic_fetch_add(&epoch, 1);
}

/* Code taken out of the table, then stamped e = reclaim_retire(): a call
 * whose record holds a later epoch read the epoch after the bump, so its
 * kernel load came after the table changed. A record found at 0 (after
 * the barrier: every store made before it is seen) belongs to a thread
 * whose next kernel load comes after the barrier, so after the change.
 * Only a record at e or earlier may be running the old code. */
uint64_t reclaim_oldest(void)
{
    pthread_once(&key_once, make_key);
#ifdef SYS_membarrier
    if (asym)
        pthread_once(&register_once, register_asym);
    if (asym && (registered != 1 ||
                 syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0) != 0))
        return 0;
#endif
    if (atomic_load(&unrecorded))
        return 0;
    uint64_t oldest = UINT64_MAX;
    for (reader *r = atomic_load(&readers); r; r = r->next) {
        uint64_t a = atomic_load(&r->active);
        if (a && a < oldest)
            oldest = a;
    }
    return oldest;
}
