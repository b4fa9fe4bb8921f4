/*
 * runtime/runtime.h - the runtime's private types: schemas, the dispatch
 * table, modules, calls. Shared by runtime/ and loader/ only.
 */
#ifndef OPJIT_RUNTIME_H
#define OPJIT_RUNTIME_H

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>

#include "opjit.h"
#include "runtime/settings.h"

#define OPJIT_MAX_ARGS 32
#define OPJIT_MAX_OUTS 8
#define OPJIT_MAX_LIST 8   /* longest int[N] */
#define OPJIT_MAX_DTYPES 8 /* dtypes one constraint may list */
#define OPJIT_ERRMSG_SIZE 16384

/* ---- schema (runtime/schema.c) ------------------------------------------ */

typedef struct schema_arg {
    char *name;
    char *type;         /* as written: "Tensor?", "int[2]" */
    int kind;           /* opjit_kind */
    int optional;       /* Tensor? */
    int list_len;       /* N of int[N]; 0 when not a list */
    int has_default;
    char *default_text;
    opjit_value def;    /* the default, ready to hand to a kernel */
    int64_t def_ints[OPJIT_MAX_LIST];
    char *def_str;      /* a str default, unquoted (def.u.str points here) */
    char *alias;        /* Tensor(a!): "a", the kernel writes this input; else NULL */
} schema_arg;

typedef struct schema {
    char *text;      /* as registered */
    char *canonical; /* normalized, to compare two registrations */
    char *name;
    int nargs;
    schema_arg args[OPJIT_MAX_ARGS];
    int nouts;
    char *out_names[OPJIT_MAX_OUTS]; /* "-> (Tensor values, Tensor indices)"; NULL if unnamed */
} schema;

/* Parse text into s. On failure returns OPJIT_ESCHEMA with a message in
 * err saying where. */
int schema_parse(const char *text, schema *s, char *err, size_t errlen);
void schema_free(schema *s);
int schema_arg_index(const schema *s, const char *name);

/* ---- kernels and ops (runtime/dispatch.c) ------------------------------- */

/* A constraint on one Tensor argument, from opjit_require. */
typedef struct arg_check {
    int arg;
    int ndtypes;
    DLDataType dtypes[OPJIT_MAX_DTYPES];
    int rank; /* -1: any */
    int contiguous;
} arg_check;

typedef struct module module;

/* What a module declared for one of its ops beside the kernel: its
 * gradient and shape rule (runtime/decl.c). pub is what hosts read. */
typedef struct kernel_decls {
    opjit_op_decls pub;
    char *backward;       /* opjit_derivative's backward op */
    char *inputs_text;    /* and its inputs, as declared */
    int inputs[OPJIT_MAX_ARGS];
    opjit_grad_arg bargs[OPJIT_MAX_ARGS]; /* filled when the module is published */
    opjit_shape_fn shape;
} kernel_decls;

/* One kernel registered for one device. Immutable once published. */
typedef struct kernel {
    opjit_kernel_fn fn;
    int device;
    module *mod;
    const char *doc;        /* the runtime's copy (rt_intern) */
    /* Its schema: own_sch's until published, then the op's copy of that
     * text (own_sch given to the op, or freed for an equal one it had). */
    const schema *sch;
    struct op_schema *own_sch;
    struct opjit_op *op;    /* the op it is published in (set when publishing) */
    const opjit_op_decls *op_decls; /* that op's copy of decls' (NULL: none) */
    int nchecks;
    arg_check checks[OPJIT_MAX_ARGS];
    kernel_decls *decls; /* NULL: the module declared nothing for it */
    struct kernel *next_in_module;
} kernel;

/* The op's own copy of one schema text its kernels had: the first such
 * kernel's parse, handed over when it was published. */
typedef struct op_schema {
    schema s;
    struct op_schema *next;
} op_schema;

/* The op's own copy of one declaration its kernels made (runtime/decl.c),
 * so that what opjit_op_decls_get hands out outlives the kernels. */
typedef struct op_decls {
    opjit_op_decls pub;
    char *backward;
    int inputs[OPJIT_MAX_ARGS];
    opjit_grad_arg bargs[OPJIT_MAX_ARGS];
    struct op_decls *next;
} op_decls;

struct opjit_op {
    char *name;
    /* The schema all its kernels share: the op's own copy, so that what
     * opjit_op_arg_get hands out outlives the kernels. A reload of the only
     * source of an op may change it; every schema text the op had stays
     * (in schemas) as long as the op. */
    _Atomic(const schema *) sch;
    op_schema *schemas;
    op_decls *decls; /* every declaration its kernels made, as long as the op */
    _Atomic(kernel *) kernels[OPJIT_DEVICE_COUNT];
    _Atomic(struct opjit_op *) next; /* ops are appended while others read */
};

/* A loaded shared object and what its init registered. */
struct module {
    opjit_runtime *rt;
    const char *source; /* path of the source file, as the host named it (rt_intern) */
    char *real;     /* its real path: what identifies "the same source" */
    const char *tier;   /* "tcc", ... (rt_intern) */
    int device;     /* the device its kernels may register for (.c: CPU) */
    void *dl;       /* dlopen handle */
    int links_blas; /* linked with OpenBLAS (its source mentions cblas): its
                     * threads are pinned to 1 when loaded */
    kernel *kernels;
    kernel *last;   /* for opjit_require */
    int status;     /* first registration error */
    char err[1024];
    struct cuda_module *cuda; /* .cu: device code per architecture (runtime/cuda.h) */
    uint64_t retired; /* the epoch it was retired in (runtime/reclaim.c) */
    module *next;     /* in rt->modules, or in rt->retired */
};

/* ---- runtime ------------------------------------------------------------ */

typedef struct workspace {
    char *base;  /* 64-byte aligned, in mem */
    char *mem;   /* what rt_alloc gave: cap + 64 bytes */
    size_t cap, used;
    size_t want; /* total asked in the last call, to size the next */
    struct overflow *overflow;
    struct workspace *next;
} workspace;

struct opjit_runtime {
    pthread_mutex_t lock; /* ops, modules, workspace pool */
    _Atomic(opjit_op *) ops; /* appended under lock, read without */
    opjit_op *ops_tail;
    module *modules; /* published: some kernel of each is in the table */
    module *retired; /* out of the table; unloaded once no call can be in them */
    struct {
        char **v; /* an open-addressing set; cap a power of two */
        size_t n, cap;
    } strings;    /* what op info hands out: kept until the runtime goes */
    workspace *free_ws;
    opjit_alloc_fn alloc;
    void *alloc_ud;
    opjit_log_fn log;
    void *log_ud;
    int verbosity;
    struct loader *loader; /* set and freed by loader/create.c; opaque here */
    struct cuda_rt *cuda; /* contexts, streams, device workspaces (runtime/cuda.h) */
    struct pool *pool;    /* threads for op code (runtime/pool.c) */
    struct out_cache *out_cache; /* the default allocator's (runtime/alloc.c), or NULL */
    settings set; /* resolved once (runtime/settings.h): what every layer reads */
};

/* ---- calls (runtime/call.c) -------------------------------------------- */

struct opjit_ctx {
    opjit_runtime *rt;
    const kernel *k;
    int device;
    int device_id;
    int status;
    DLManagedTensor *outs[OPJIT_MAX_OUTS];
    workspace *ws;
    /* CUDA calls (runtime/cuda.c) */
    struct cuda_dev *cdev;        /* the device's context and stream */
    struct cuda_loaded *cmod;     /* the module's device code in that context */
    struct cuda_ws *dws;          /* device workspace of this call */
    int pushed;                   /* the context was pushed */
    int htod_pending;             /* a host-to-device copy may still read host memory */
    struct shape_run *shapes;     /* a shape rule's context (runtime/decl_query.c), else NULL */
};

/* Where a shape rule's answers go (runtime/decl_query.c runs the rule,
 * decl.c's opjit_output_shape fills them). */
struct shape_run {
    opjit_out_shape *outs;
    int nouts;
    unsigned set; /* bit i: output i was named */
};

/* Arguments bound to the kernel a call picks (call_bind). */
typedef struct call_bound {
    const kernel *k;
    int device, device_id;
    opjit_value v[OPJIT_MAX_ARGS];
    int64_t expanded[OPJIT_MAX_ARGS][OPJIT_MAX_LIST];
} call_bound;

/* The first steps of opjit_call: the call's device, its kernel, every
 * argument bound and checked against the kernel's schema. need_data 0:
 * tensors may have no data (a shape query). Sets the message on failure. */
int call_bind(opjit_runtime *rt, const opjit_op *op, const opjit_value *args, int nargs,
              int need_data, call_bound *b);

extern const opjit_api runtime_api;
void workspace_free_all(opjit_runtime *rt);

/* ---- errors and logs (runtime/errors.c) --------------------------------- */

/* Set this thread's message for rt and return status. */
int rt_error(const opjit_runtime *rt, int status, const char *fmt, ...);
int rt_verror(const opjit_runtime *rt, int status, const char *fmt, va_list ap);
void rt_clear_error(const opjit_runtime *rt);
/* Whether rt's log takes messages of level (the host's callback, up to
 * its verbosity): rt_log formats none that nobody reads. */
static inline int rt_logs(const opjit_runtime *rt, int level)
{
    return rt && rt->log && level <= rt->verbosity;
}
void rt_log_emit(const opjit_runtime *rt, int level, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define rt_log(rt, level, ...) \
    (rt_logs((rt), (level)) ? rt_log_emit((rt), (level), __VA_ARGS__) : (void)0)
/* Record an error of the call ctx (the first one counts), prefixed with
 * the op's name; returns the call's status. For runtime/'s own services
 * of the api table (outputs, CUDA, parallel_for). */
int call_error(opjit_ctx *ctx, int status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* ---- allocation (runtime/alloc.c) ------------------------------------------ */

/* n bytes from the runtime's allocator (the host's, or the default one). */
void *rt_alloc(opjit_runtime *rt, size_t n);
void rt_free(opjit_runtime *rt, void *p, size_t n);

typedef struct out_cache out_cache;
out_cache *out_cache_new(opjit_runtime *rt);
void out_cache_close(out_cache *c);
void *out_cache_alloc(void *ud, void *ptr, size_t osize, size_t nsize);
void out_cache_stats(out_cache *c, size_t *held, unsigned long *hits, unsigned long *misses);

/* ---- threads (runtime/pool.c) --------------------------------------------- */

typedef struct pool pool;
int pool_new(const settings *set, pool **out);
void pool_free(pool *p);
int pool_threads(pool *p);
/* The api table's entries. */
int api_parallel_for(opjit_ctx *ctx, int64_t begin, int64_t end, int64_t grain,
                     opjit_chunk_fn fn, void *user);
int api_num_threads(opjit_ctx *ctx);
int api_thread_num(opjit_ctx *ctx);
/* Whether this thread is running a chunk of a parallel loop. */
int pool_in_chunk(void);
/* A failure inside a chunk of ctx's loop goes to the loop: returns 1 when
 * it did, 0 when this thread runs no chunk of ctx. */
int pool_chunk_vfail(opjit_ctx *ctx, const char *fmt, va_list ap);
/* After a module is loaded: OpenBLAS, when among its libraries, runs one
 * thread per call (ops split BLAS work over the pool). */
int pool_blas_present(void);
void pool_blas_module(void *dl, int brought_in);
/* A function of OpenBLAS by name (opjit_blas), the library loaded and set
 * up on the first call in the process; NULL and *why when it cannot be. */
void *pool_blas_symbol(const char *name, const char **why);

/* ---- modules (runtime/dispatch.c) --------------------------------------- */

module *module_new(opjit_runtime *rt, const char *source, const char *real, const char *tier,
                   int device);
/* Publish the module's kernels into the dispatch table, replacing kernels
 * earlier loaded from the same source. On a conflict nothing is published. */
int module_publish(opjit_runtime *rt, module *m);
/* The same, when m's source replaces the source at replaces (the file a
 * path names changed: a retargeted symlink): the kernels of both count as
 * one source's, and those of replaces that m does not define leave. */
int module_publish_replacing(opjit_runtime *rt, module *m, const char *replaces);
/* Take every kernel loaded from the source at real out of the dispatch
 * table; returns how many. Their modules are unloaded once no call can be
 * running in them (module_reclaim). */
int module_unpublish(opjit_runtime *rt, const char *real);
/* Unload the modules taken out of the table that no call can be running
 * in any more; returns how many are still waiting. Publishing and
 * unpublishing call it; a watcher calls it now and then. */
int module_reclaim(opjit_runtime *rt);
/* s kept by rt until it is freed (one copy per distinct string); NULL when
 * out of memory. */
const char *rt_intern(opjit_runtime *rt, const char *s);
/* Free a module that was never published (its dl handle is closed). */
void module_discard(module *m);
/* The registration entries of the api table. */
int dispatch_def(opjit_module *m, const char *schema, int device, opjit_kernel_fn fn,
                 const char *doc);
int dispatch_require(opjit_module *m, const char *arg, const char *spec);
/* runtime/decl.c: the declaration entries of the api table, and checking
 * them when the module is published (backward ops resolved): OPJIT_OK, or
 * the status with a message on rt. */
int decl_derivative(opjit_module *m, const char *op, const char *backward, const char *inputs);
int decl_not_differentiable(opjit_module *m, const char *op);
int decl_shape(opjit_module *m, const char *op, opjit_shape_fn fn);
int decl_output_shape(opjit_ctx *ctx, int index, DLDataType dtype, int ndim,
                      const int64_t *shape);
int decl_output_dynamic(opjit_ctx *ctx, int index, int dim);
int decl_resolve(opjit_runtime *rt, module *m);
/* Whether k's gradient declaration agrees with other's (either declaring
 * none agrees with anything). */
int decl_agree(const kernel *k, const kernel *other);
void decl_free(kernel_decls *d);
/* The op's copy of d: the one alike, else a new one; NULL when out of
 * memory. rt->lock held. decl_op_free frees them all (the runtime's end). */
const opjit_op_decls *decl_op_copy_locked(opjit_op *op, const kernel_decls *d);
void decl_op_free(opjit_op *op);
/* runtime/dtype.c: the dtype table (opjit_dtype_parse/_name) */
int dtype_parse(const char *s, DLDataType *out);
const char *dtype_name(DLDataType t, char *buf, size_t n);

/* ---- retired code (runtime/reclaim.c) ------------------------------------ */

/* Anything that reads kernels or modules from the table without rt->lock
 * (a call, op info) runs between reclaim_enter and reclaim_exit; they
 * nest, take no lock and cost a store each. Inline: the call path. */
typedef struct reclaim_reader {
    _Atomic uint64_t active; /* the epoch its outermost open call began in; 0: none */
    _Atomic int used;        /* claimed by a thread */
    struct reclaim_reader *next; /* set before it is listed, never changed */
} reclaim_reader;

typedef struct reclaim_thread {
    reclaim_reader *r; /* this thread's record, once it called */
    unsigned depth;    /* nested calls: only the outermost marks the record */
    int unrecorded;    /* the outermost call runs without a record */
} reclaim_thread;

extern _Thread_local reclaim_thread reclaim_me;
extern _Atomic uint64_t reclaim_epoch;
extern int reclaim_asym; /* membarrier: calls store without a fence */
void reclaim_enter_slow(void); /* the first call of a thread, or no membarrier */
void reclaim_exit_slow(void);

static inline void reclaim_enter(void)
{
    reclaim_thread *t = &reclaim_me;
    if (t->depth++)
        return;
    if (__builtin_expect(t->r && reclaim_asym, 1)) {
        /* Release: whoever reads it sees this thread's earlier calls. The
         * scan's barrier orders it before the kernel load (reclaim.c). */
        atomic_store_explicit(&t->r->active,
                              atomic_load_explicit(&reclaim_epoch, memory_order_acquire),
                              memory_order_release);
        atomic_signal_fence(memory_order_seq_cst);
    } else {
        reclaim_enter_slow();
    }
}

static inline void reclaim_exit(void)
{
    reclaim_thread *t = &reclaim_me;
    if (--t->depth)
        return;
    atomic_signal_fence(memory_order_seq_cst);
    if (__builtin_expect(t->r && !t->unrecorded, 1))
        atomic_store_explicit(&t->r->active, 0, memory_order_release);
    else
        reclaim_exit_slow();
}
/* After taking code out of the table: its epoch E. */
uint64_t reclaim_retire(void);
/* The epoch the oldest call still running began in (UINT64_MAX: none;
 * 0: unknown): code of epoch E may go when E < reclaim_oldest(). */
uint64_t reclaim_oldest(void);

/* ---- lifetime (runtime/lifetime.c) ------------------------------------- */
/* The runtime's own parts (allocator, log, CUDA bookkeeping); the loader is
 * attached and detached by opjit_create/opjit_destroy (loader/create.c),
 * which assemble the layers: nothing here calls upward. */
int runtime_new(const settings *set, opjit_runtime **out);
void runtime_free(opjit_runtime *rt);

#endif
