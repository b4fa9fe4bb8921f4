/* runtime/pool.c - threads for op code: opjit_parallel_for on the runtime's
 * pool (or the host's), and OpenBLAS's thread count.
 *
 * The pool has num_threads - 1 workers; the thread calling parallel_for is
 * the last one. Workers start at the first parallel_for that has more than
 * one chunk to run, so a host that never runs a parallel op never gets a
 * thread. A worker that finished its part of a region watches for the next
 * one for POOL_SPIN_NS, then blocks on a condition variable; the caller
 * watches its region's last workers leave the same way. Ops run regions
 * back to back (a GEMM's packing, then its product; mm_backward's two
 * products), and a sleeping thread took 40-110 us to wake on a shared VM:
 * a quarter of a 0.25 ms call on two threads. OpenMP runtimes spin for
 * milliseconds; this spins briefly and pauses while it does, so an idle
 * host loses at most POOL_SPIN_NS of a core after each region.
 *
 * One region (one parallel_for) runs on the pool at a time. A parallel_for
 * that finds the pool busy with another host thread's region runs its
 * chunks on its own thread, at once: host threads never wait for each
 * other, and the busy threads are the pool plus the host's own callers,
 * never a pool per caller. A parallel_for inside a chunk runs inline too.
 *
 * Chunks are [begin + k * grain, ...): fixed by the op, never by the
 * thread count, so an op that splits outputs gets the same bits whatever
 * the number of threads. Chunks are handed out in order from one atomic
 * counter (dynamic scheduling).
 *
 * A chunk may fail with opjit_fail(ctx, ...): the first message is kept in
 * the region, no new chunks start, and parallel_for, back on the calling
 * thread, records the message for the host and returns the status. */
#include <dlfcn.h>
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "runtime/runtime.h"

#define POOL_MAX_THREADS 1024
#define POOL_SPIN_NS 100000 /* 0.1 ms */

typedef struct region {
    opjit_ctx *ctx;
    opjit_chunk_fn fn;
    void *user;
    uint64_t begin, len, grain, nchunks;
    atomic_uint_fast64_t next; /* next chunk to hand out */
    atomic_int failed;         /* a chunk failed: hand out no more */
    atomic_int err_taken;      /* the first failure writes msg */
    atomic_int active;         /* workers inside (changed under the pool's mutex) */
    char msg[1024];
} region;

struct pool {
    int nthreads;        /* configured width, the calling thread included; 0: the CPUs
                          * this process may use, asked at first use (pool_width) */
    _Atomic int cpus;    /* that count once asked, else 0 */
    opjit_pool_fn host;  /* the host's pool, or NULL */
    void *host_ud;
    pthread_mutex_t mu;
    pthread_cond_t work; /* workers wait here for a region */
    pthread_cond_t done; /* the caller waits here for workers to leave */
    int started;         /* workers were started (or tried) */
    int nworkers;
    pthread_t *workers;
    atomic_int stop;
    atomic_ulong gen;    /* bumped for every region posted (under mu) */
    unsigned long gen_started; /* gen when the workers were started */
    region *cur;         /* the open region, or NULL */
    int busy;            /* a region is on the pool */
};

/* The region this thread is running chunks of, and its slot. */
static _Thread_local struct {
    region *r;
    int slot;
} tls_par;

/* ---- the thread count ------------------------------------------------------ */

/* CPUs this process may run on. */
static int affinity_cpus(void)
{
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0)
            return n;
    }
    return 1;
}

/* The settings' count (config, else $OPJIT_NUM_THREADS), else the CPUs we
 * may use. */
static int resolve_threads(const settings *set)
{
    if (set->num_threads > 0)
        return set->num_threads < POOL_MAX_THREADS ? set->num_threads : POOL_MAX_THREADS;
    return 0; /* the CPUs, asked at first use: a runtime that only loads never asks */
}

/* The pool's width. Threads racing on the first use ask the same thing
 * and store the same answer. */
static int pool_width(pool *p)
{
    if (p->nthreads)
        return p->nthreads;
    int n = atomic_load_explicit(&p->cpus, memory_order_relaxed);
    if (!n) {
        n = affinity_cpus();
        atomic_store_explicit(&p->cpus, n, memory_order_relaxed);
    }
    return n;
}

int pool_new(const settings *cfg, pool **out)
{
    pool *p = calloc(1, sizeof *p);
    if (!p)
        return OPJIT_ENOMEM;
    if (pthread_mutex_init(&p->mu, NULL)) {
        free(p);
        return OPJIT_ENOMEM;
    }
    if (pthread_cond_init(&p->work, NULL)) {
        pthread_mutex_destroy(&p->mu);
        free(p);
        return OPJIT_ENOMEM;
    }
    if (pthread_cond_init(&p->done, NULL)) {
        pthread_cond_destroy(&p->work);
        pthread_mutex_destroy(&p->mu);
        free(p);
        return OPJIT_ENOMEM;
    }
    p->nthreads = resolve_threads(cfg);
    atomic_init(&p->cpus, 0);
    p->host = cfg->pool;
    p->host_ud = cfg->pool_ud;
    *out = p;
    return OPJIT_OK;
}

int pool_threads(pool *p) { return pool_width(p); }

void pool_free(pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->work);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->nworkers; i++)
        pthread_join(p->workers[i], NULL);
    free(p->workers);
    pthread_cond_destroy(&p->done);
    pthread_cond_destroy(&p->work);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* ---- running chunks ---------------------------------------------------------- */

/* Record the region's first failure; later ones are usually consequences. */
static void region_vfail(region *r, const char *fmt, va_list ap)
{
    if (!atomic_exchange(&r->err_taken, 1))
        vsnprintf(r->msg, sizeof r->msg, fmt ? fmt : "(no message)", ap);
    atomic_store(&r->failed, 1);
}

static void region_fail(region *r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    region_vfail(r, fmt, ap);
    va_end(ap);
}

/* Take chunks of r until none is left (or one failed), as slot. */
static void run_chunks(region *r, int slot)
{
    region *prev_r = tls_par.r;
    int prev_slot = tls_par.slot;
    tls_par.r = r;
    tls_par.slot = slot;
    while (!atomic_load_explicit(&r->failed, memory_order_relaxed)) {
        uint64_t c = atomic_fetch_add_explicit(&r->next, 1, memory_order_relaxed);
        if (c >= r->nchunks)
            break;
        uint64_t off = c * r->grain;
        uint64_t n = r->len - off < r->grain ? r->len - off : r->grain;
        int64_t lo = (int64_t)(r->begin + off), hi = (int64_t)(r->begin + off + n);
        int rc = r->fn(r->user, lo, hi);
        if (rc)
            region_fail(r, "the chunk [%lld, %lld) failed (returned %d) without a message",
                        (long long)lo, (long long)hi, rc);
    }
    tls_par.r = prev_r;
    tls_par.slot = prev_slot;
}

static uint64_t pool_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* For a loop watching something without the pool's mutex: pauses the
 * CPU, and says when POOL_SPIN_NS has passed since its first call (i = 0). */
static int spin_over(unsigned i, uint64_t *end)
{
    cpu_relax();
    if (i == 0)
        *end = pool_now_ns() + POOL_SPIN_NS;
    return (i & 63) == 63 && pool_now_ns() >= *end;
}

static void *worker_main(void *arg)
{
    pool *p = arg;
    pthread_mutex_lock(&p->mu);
    int slot = 0;
    while (p->workers[slot] != pthread_self())
        slot++;
    unsigned long seen = p->gen_started; /* the region being posted is new */
    for (;;) {
        if (!p->cur)
            seen = p->gen; /* no region is open: any before now is over */
        if (!p->stop && p->gen == seen) { /* watch for the next region a while */
            pthread_mutex_unlock(&p->mu);
            uint64_t end;
            for (unsigned i = 0; atomic_load_explicit(&p->gen, memory_order_acquire) == seen &&
                                 !atomic_load_explicit(&p->stop, memory_order_relaxed) &&
                                 !spin_over(i, &end);
                 i++)
                ;
            pthread_mutex_lock(&p->mu);
        }
        while (!p->stop && (!p->cur || p->gen == seen))
            pthread_cond_wait(&p->work, &p->mu);
        if (p->stop)
            break;
        seen = p->gen;
        region *r = p->cur;
        r->active++;
        pthread_mutex_unlock(&p->mu);
        run_chunks(r, slot + 1);
        pthread_mutex_lock(&p->mu);
        if (--r->active == 0)
            pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* Start the workers (under p->mu). Workers block every signal: the host's
 * handlers run on the host's threads. Fewer workers than asked for when
 * threads cannot be made; none is fine too (chunks run on the caller). */
static void start_workers(pool *p)
{
    p->started = 1;
    p->gen_started = p->gen;
    int want = pool_width(p) - 1;
    if (want < 1 || !(p->workers = calloc((size_t)want, sizeof *p->workers)))
        return;
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    /* worker_main finds its slot in p->workers under p->mu, held here. */
    for (int i = 0; i < want; i++) {
        if (pthread_create(&p->workers[i], NULL, worker_main, p))
            break;
        pthread_setname_np(p->workers[i], "opjit-worker"); /* for top, gdb, tests */
        p->nworkers++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* The region on the runtime's own pool; inline when it is busy. */
static void run_on_pool(pool *p, region *r)
{
    pthread_mutex_lock(&p->mu);
    if (p->busy) {
        pthread_mutex_unlock(&p->mu);
        run_chunks(r, 0);
        return;
    }
    if (!p->started)
        start_workers(p);
    p->busy = 1;
    p->cur = r;
    p->gen++;
    uint64_t helpers = r->nchunks - 1;
    if (helpers >= (uint64_t)p->nworkers)
        pthread_cond_broadcast(&p->work);
    else
        for (uint64_t i = 0; i < helpers; i++)
            pthread_cond_signal(&p->work);
    pthread_mutex_unlock(&p->mu);
    run_chunks(r, 0);
    pthread_mutex_lock(&p->mu);
    p->cur = NULL; /* workers that wake from now on do not join */
    if (r->active) { /* its last workers are finishing their chunks */
        pthread_mutex_unlock(&p->mu);
        uint64_t end;
        for (unsigned i = 0; atomic_load_explicit(&r->active, memory_order_acquire) &&
                             !spin_over(i, &end);
             i++)
            ;
        pthread_mutex_lock(&p->mu);
    }
    while (r->active)
        pthread_cond_wait(&p->done, &p->mu);
    p->busy = 0;
    pthread_mutex_unlock(&p->mu);
}

static void host_task(void *arg, int task)
{
    region *r = arg;
    run_chunks(r, task);
}

/* The region on the host's pool: tasks that each take chunks until none
 * is left, so any one of them finishes the loop. */
static void run_on_host(pool *p, region *r)
{
    uint64_t width = (uint64_t)pool_width(p);
    uint64_t ntasks = r->nchunks < width ? r->nchunks : width;
    if (p->host(p->host_ud, (int)ntasks, host_task, r) != 0)
        run_chunks(r, 0); /* the host's pool refused: whatever is left, here */
}

/* ---- the api table's entries -------------------------------------------------- */

int api_parallel_for(opjit_ctx *ctx, int64_t begin, int64_t end, int64_t grain,
                     opjit_chunk_fn fn, void *user)
{
    if (!ctx)
        return OPJIT_EINVAL;
    region *outer = tls_par.r;
    if (!fn) {
        if (outer) {
            region_fail(outer, "opjit_parallel_for: NULL chunk function");
            return OPJIT_EKERNEL;
        }
        return call_error(ctx, OPJIT_EKERNEL, "opjit_parallel_for: NULL chunk function");
    }
    if (end <= begin)
        return OPJIT_OK;
    region r;
    r.ctx = ctx;
    r.fn = fn;
    r.user = user;
    r.begin = (uint64_t)begin;
    r.len = (uint64_t)end - (uint64_t)begin;
    r.grain = grain < 1 ? 1 : (uint64_t)grain;
    r.nchunks = (r.len - 1) / r.grain + 1;
    atomic_init(&r.next, 0);
    atomic_init(&r.failed, 0);
    atomic_init(&r.err_taken, 0);
    r.active = 0;
    r.msg[0] = '\0';
    pool *p = ctx->rt->pool;
    if (outer || r.nchunks == 1 || pool_width(p) == 1)
        run_chunks(&r, outer ? tls_par.slot : 0);
    else if (p->host)
        run_on_host(p, &r);
    else
        run_on_pool(p, &r);
    if (!atomic_load(&r.failed))
        return OPJIT_OK;
    if (outer) { /* a nested loop: the enclosing region reports it */
        region_fail(outer, "%s", r.msg);
        return OPJIT_EKERNEL;
    }
    return call_error(ctx, OPJIT_EKERNEL, "%s", r.msg);
}

int api_num_threads(opjit_ctx *ctx) { return ctx ? pool_width(ctx->rt->pool) : 1; }

int api_thread_num(opjit_ctx *ctx)
{
    (void)ctx;
    return tls_par.r ? tls_par.slot : 0;
}

int pool_in_chunk(void) { return tls_par.r != NULL; }

int pool_chunk_vfail(opjit_ctx *ctx, const char *fmt, va_list ap)
{
    region *r = tls_par.r;
    if (!r || r->ctx != ctx)
        return 0;
    region_vfail(r, fmt, ap);
    return 1;
}

/* ---- BLAS ------------------------------------------------------------------------ */

/* OpenBLAS runs one thread per call under opjit: ops split BLAS work over
 * the pool in blocks fixed by the shape, which keeps results independent
 * of the thread count (OpenBLAS's own threads change the rounding) and
 * keeps the busy cores at num_threads. Looked up in the module's
 * dependencies, so the library itself never links OpenBLAS. */
static _Atomic int blas_pinned; /* a module's OpenBLAS seen, and kept loaded */
/* The soname every compiler's -lopenblas records. */
#define BLAS_SONAME "libopenblas.so.0"

/* Whether the process has OpenBLAS before opjit brings it in (a module
 * that links it, or opjit_blas). */
int pool_blas_present(void)
{
    if (atomic_load(&blas_pinned))
        return 1;
    void *h = dlopen(BLAS_SONAME, RTLD_LAZY | RTLD_NOLOAD);
    if (h)
        dlclose(h);
    return h != NULL;
}

/* brought_in: the module's dlopen loaded OpenBLAS. Its constructor started
 * a server thread per core that nobody has given work, and each spins on
 * sched_yield for 2^28 cycles (about 0.1 s) before it sleeps: that took a
 * core from the op's own threads, and 2-thread calls in the first 0.1-0.2 s
 * after a load ran at 1-thread speed. With one thread per call OpenBLAS
 * never uses them, so they are stopped (it starts them again if a host
 * asks it for more threads). An OpenBLAS the host loaded is left running:
 * its threads may be working for the host. */
void pool_blas_module(void *dl, int brought_in)
{
    if (!dl)
        return;
    void (*set_threads)(int);
    void *sym = dlsym(dl, "openblas_set_num_threads");
    if (!sym)
        return;
    memcpy(&set_threads, &sym, sizeof sym);
    set_threads(1);
    /* Modules are unloaded when replaced: OpenBLAS stays (unloading it
     * would stop its threads, loading it start them again). */
    Dl_info di;
    if (atomic_exchange(&blas_pinned, 1))
        return;
    if (dladdr(sym, &di) && di.dli_fname)
        (void)dlopen(di.dli_fname, RTLD_LAZY | RTLD_NOLOAD | RTLD_NODELETE);
    void *stop = brought_in ? dlsym(dl, "blas_thread_shutdown_") : NULL;
    if (stop) {
        int (*stop_threads)(void);
        memcpy(&stop_threads, &stop, sizeof stop);
        (void)stop_threads();
    }
}

/* opjit_blas: OpenBLAS loaded the first time an op asks for one of its
 * functions, not with every op that may call it (loading it costs a
 * process that has not some milliseconds: relocations, and a constructor
 * that starts a thread per core), then set up as pool_blas_module sets up
 * a module's. */
static pthread_once_t blas_once = PTHREAD_ONCE_INIT;
static void *blas_dl;
static char blas_why[256];

static void blas_open(void)
{
    int before = pool_blas_present();
    void *dl = dlopen(BLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!dl) {
        const char *why = dlerror();
        snprintf(blas_why, sizeof blas_why, "%s", why ? why : BLAS_SONAME ": not found");
        return;
    }
    pool_blas_module(dl, !before);
    blas_dl = dl;
}

void *pool_blas_symbol(const char *name, const char **why)
{
    pthread_once(&blas_once, blas_open);
    if (!blas_dl) {
        *why = blas_why;
        return NULL;
    }
    void *f = name ? dlsym(blas_dl, name) : NULL;
    *why = f ? NULL : "no such function in " BLAS_SONAME;
    return f;
}
