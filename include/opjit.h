/*
 * opjit.h - load tensor operators from source text at run time.
 *
 * Lifecycle, in order:
 *   1. opjit_config_init(&cfg, sizeof cfg) + fill in,
 *      opjit_create()                                  -> runtime
 *   2. opjit_load_op(rt, "nms" | "path/nms.c", &op)     -> compiled, cached,
 *                                                        kernels registered
 *   3. opjit_find_op(), opjit_op_info(), opjit_list()    -> look up
 *   4. opjit_call(rt, op, args, nargs, outs, nouts)      -> run on DLPack
 *   5. opjit_destroy(rt)
 *
 * This header is the core: what a host needs to load and call ops. What
 * the opjit command does (dtypes by name, the search path's sources,
 * warming, the cache's administration) is the second tier, opjit_admin.h.
 *
 * Names: opjit_<subject>_<verb> (opjit_load_op, opjit_cache_prune); a
 * function filling a struct or value the caller owns through its last
 * argument is opjit_<thing>_get (opjit_op_info_get, opjit_num_threads_get);
 * one returning its value directly is named for it (opjit_errmsg).
 *
 * Every function returning int returns an opjit_status. On failure the
 * calling thread's message for that runtime is available from
 * opjit_errmsg(rt); opjit_status_name() and opjit_errstr() give a static
 * name and a static description of a status.
 *
 * The library never prints unless a log callback is set, never exits and
 * never aborts.
 *
 * Structs that grow. Every struct a host allocates and hands in (a config,
 * options, an info or result to fill) has `size_t size` as its first
 * member: sizeof the struct as the host's header has it, set by
 * opjit_config_init for a config and by the caller for the others
 * (opjit_op_info info = {.size = sizeof info};). A later library adds
 * fields at the end only, and reads and writes only the prefix the host's
 * size covers: a host built against an older header keeps working, the
 * fields it does not know taking their defaults. A host newer than the
 * library may pass a larger struct if the fields the library does not know
 * are zero (else OPJIT_EINVAL); an output's bytes past what the library
 * knows are left as the host set them. A size below the first version's,
 * or past 64 KiB (a size never set), is OPJIT_EINVAL.
 * Structs the library hands out (events, entries, reports) are read-only
 * to the host and owned by the library.
 */
#ifndef OPJIT_H
#define OPJIT_H

#include <stddef.h>
#include <stdint.h>

#define OPJIT_TYPES_ONLY
#include "opjit_op.h"
#undef OPJIT_TYPES_ONLY

#ifdef __cplusplus
extern "C" {
#endif
/* The library is built with hidden visibility: what this header declares
 * is all it exports. */
#if defined(__GNUC__)
#pragma GCC visibility push(default)
#endif

#define OPJIT_VERSION_MAJOR 0
#define OPJIT_VERSION_MINOR 1
#define OPJIT_VERSION_PATCH 0
#define OPJIT_VERSION_NUMBER \
    (OPJIT_VERSION_MAJOR * 10000 + OPJIT_VERSION_MINOR * 100 + OPJIT_VERSION_PATCH)

/* The library's version number, to compare with OPJIT_VERSION_NUMBER. */
int opjit_version(void);
/* "major.minor.patch" */
const char *opjit_version_string(void);

/* Status codes: X(name, description). */
#define OPJIT_STATUS_LIST(X)                                                 \
    X(OK, "success")                                                         \
    X(EINVAL, "invalid argument")                                            \
    X(ENOMEM, "out of memory")                                               \
    X(ENOTFOUND, "not found")                                                \
    X(EIO, "input/output error")                                             \
    X(ECOMPILE, "compile error")                                             \
    X(EMODULE, "bad operator module")                                        \
    X(ESCHEMA, "bad schema")                                                 \
    X(EEXIST, "already registered")                                          \
    X(ECALL, "call does not match the schema")                               \
    X(ENOKERNEL, "no kernel for this device")                                \
    X(EKERNEL, "kernel failed")                                              \
    X(EDEVICE, "device unavailable")                                         \
    X(ECACHE, "cache error")                                                 \
    X(EOFFLINE, "offline: not in the cache and compiling is off")

typedef enum opjit_status {
#define OPJIT_STATUS_ENUM(name, desc) OPJIT_##name,
    OPJIT_STATUS_LIST(OPJIT_STATUS_ENUM)
#undef OPJIT_STATUS_ENUM
    OPJIT_STATUS_COUNT
} opjit_status;

/* "OPJIT_EINVAL"; "OPJIT_?" for an unknown code. Static storage. */
const char *opjit_status_name(int status);
/* "invalid argument". Static storage. */
const char *opjit_errstr(int status);

/* "cpu", "cuda"; NULL for an unknown device. */
const char *opjit_device_name(int device);

typedef struct opjit_runtime opjit_runtime;
typedef struct opjit_op opjit_op;

/* The longest op name a schema may declare; a longer one fails the load. */
#define OPJIT_NAME_MAX 255

/* Log levels for the log callback. */
enum { OPJIT_LOG_ERROR = 0, OPJIT_LOG_WARN = 1, OPJIT_LOG_INFO = 2, OPJIT_LOG_DEBUG = 3 };
typedef void (*opjit_log_fn)(void *ud, int level, const char *msg);

/* A realloc-shaped allocator, as Lua's lua_Alloc: nsize == 0 frees ptr and
 * returns NULL; otherwise (re)allocates. osize is the old size (0 for new).
 * Outputs and workspaces come from it; it must return memory aligned to at
 * least 16 bytes. It must stay valid while any output it made is alive. */
typedef void *(*opjit_alloc_fn)(void *ud, void *ptr, size_t osize, size_t nsize);

/* A host's thread pool (opjit_config.pool), the way at::parallel_for lets
 * an extension share the framework's threads. It must run task(arg, i)
 * once for every i in [0, ntasks), concurrently as far as it can (the
 * calling thread may run some), and return 0 when all have returned; or
 * return non-zero at once, having run none, when it cannot take the work
 * (the calling thread then does it all). ntasks is at most num_threads.
 * It may be called from several host threads at once, and from inside its
 * own tasks only if it allows that; opjit never calls it from a task. */
typedef void (*opjit_task_fn)(void *arg, int task);
typedef int (*opjit_pool_fn)(void *pool_ud, int ntasks, opjit_task_fn task, void *arg);

/* What the watcher (opjit_config.watch) saw and did: one event per source
 * and burst of changes. */
enum {
    OPJIT_WATCH_RELOADED = 0, /* a loaded source or one of its local headers
                               * changed: its new kernels serve calls */
    OPJIT_WATCH_FAILED = 1,   /* it changed and did not compile or load: the
                               * old kernels keep serving; message says why
                               * (a compile error with file:line). Also a
                               * new source whose ops could not be indexed
                               * (its init crashed or did not return) */
    OPJIT_WATCH_REMOVED = 2,  /* a loaded source was deleted and not back
                               * within a second: its kernels left the
                               * dispatch table (a file appearing under its
                               * path later is loaded again: RELOADED) */
    OPJIT_WATCH_ADDED = 3     /* a source on the search path that is not
                               * loaded was created or changed: it was
                               * indexed, and is loadable by name */
};

typedef struct opjit_watch_event {
    int kind;            /* OPJIT_WATCH_* */
    const char *path;    /* the source */
    int status;          /* OPJIT_OK, or for FAILED why */
    const char *message; /* FAILED: the error; else "" */
    double ms;           /* RELOADED: from the change seen to the new code
                          * callable (compile included) */
} opjit_watch_event;

/* Called on one of the watcher's threads, one event at a time, with no
 * lock held: it may call the API (load a source it was told was added,
 * say). Strings live during the call only. */
typedef void (*opjit_watch_fn)(void *ud, const opjit_watch_event *ev);

typedef struct opjit_config {
    /* sizeof(opjit_config), set by opjit_config_init: see "Structs that grow". */
    size_t size;
    /* Colon-separated directories searched for op sources, before
     * $OPJIT_OPS_PATH. NULL: only the environment. */
    const char *ops_path;
    /* Writable cache directory. NULL: $OPJIT_CACHE_DIR, else
     * $XDG_CACHE_HOME/opjit, else ~/.cache/opjit. */
    const char *cache_dir;
    /* Colon-separated read-only caches searched first (also
     * $OPJIT_CACHE_READONLY). */
    const char *readonly_caches;
    /* 1: never compile; a cache miss is an error. -1: from $OPJIT_OFFLINE. */
    int offline;
    /* 1: cache off (compile into a private temporary directory). */
    int no_cache;
    opjit_log_fn log;
    void *log_ud;
    /* Messages up to this level reach the log callback. */
    int verbosity;
    opjit_alloc_fn alloc; /* NULL: malloc-based */
    void *alloc_ud;
    /* The optimizing tier: 1 on, 0 off (libtcc code only), -1 from
     * $OPJIT_TIERING (default on). On: optimized code found in a cache
     * serves at once; otherwise, when a C compiler is found (cc below, else
     * $OPJIT_CC, else cc on PATH) and the cache is writable, it is built by
     * a helper process that outlives this one, and swapped in when ready. */
    int tiering;
    const char *cc;
    /* Time limit of one optimizing compile, in milliseconds: a compiler
     * still running then is killed (with what it started) and libtcc code
     * keeps serving. 0: $OPJIT_CC_TIMEOUT (seconds), else 120 s. */
    int cc_timeout_ms;
    /* CUDA architectures a .cu source's device code is compiled for, each
     * its own cache entry: "sm_XY" makes a cubin, "compute_XY" PTX, e.g.
     * "sm_80,sm_90,compute_90". NULL: $OPJIT_CUDA_ARCHS, else the GPUs of
     * this machine, else (no GPU) "sm_80,sm_90,compute_90". A call runs
     * the cubin built for its GPU, else the highest compute_XY PTX not
     * above it (JIT-compiled by the driver). */
    const char *cuda_archs;
    /* Threads op code may use (opjit_parallel_for), the calling thread
     * included. 0: $OPJIT_NUM_THREADS, else the CPUs this process may run
     * on (sched_getaffinity). 1: ops run on the calling thread only. The
     * runtime's pool starts its num_threads - 1 threads at the first
     * parallel loop, never before; idle, they block. */
    int num_threads;
    /* The host's pool instead of the runtime's (see opjit_pool_fn); NULL:
     * the runtime's. Its width is num_threads as above. */
    opjit_pool_fn pool;
    void *pool_ud;
    /* Watch the sources: 1 on, 0 off, -1 from $OPJIT_WATCH (default off).
     * On, a thread of the runtime watches the directories of the search
     * path and of the loaded sources and their local headers (inotify).
     * When a loaded source or one of its headers changes it is recompiled
     * and its kernels swapped in (calls already running finish on the old
     * code, which is then unmapped); a burst of writes (an editor saving
     * in several steps) makes one rebuild, about 25 ms after the last
     * write. A broken edit keeps the old kernels and reports the error
     * (log callback, watch_fn). A loaded source is followed by the path it
     * was loaded by (by name: its directory as the search path spells it):
     * when that path comes to name another file
     * (a symlink retargeted, a directory replaced) the new file is loaded
     * in its place; when it names nothing for a second it is unloaded,
     * and loaded again when a file appears there. Directories replaced or
     * moved away are watched anew by their paths. A new source on the
     * search path is indexed (a second thread; loads never wait for it):
     * loadable by name. opjit_destroy stops the threads. With
     * watch 1 and no inotify, opjit_create fails with OPJIT_EIO (from
     * $OPJIT_WATCH: a warning, and no watching). */
    int watch;
    opjit_watch_fn watch_fn; /* each event, or NULL: then the log has them (info;
                              * error for a failure), else at debug level only */
    void *watch_ud;
    /* A remote cache shared by a fleet, behind the local one (docs/deploying.md,
     * "Sharing a cache across machines"): "redis://HOST[:PORT][/DB]" or
     * "redis+unix:///PATH". A local miss asks it; what it returns is
     * verified before use; builds are stored there. NULL:
     * $OPJIT_REMOTE_CACHE; "": none. Read-only with $OPJIT_REMOTE_MODE=ro. */
    const char *remote_cache;
    /* The fleet key file signing remote entries (HMAC-SHA256); it must be
     * ours or root's and readable by nobody else. NULL:
     * $OPJIT_REMOTE_KEY_FILE. Without a key the remote is not used, unless
     * $OPJIT_REMOTE_TRUST=unsigned (unsafe: whoever can write to the server
     * runs code on every machine). */
    const char *remote_key_file;
    /* Time limits of the remote, in milliseconds: connecting, and each
     * read or write of a request. 0: $OPJIT_REMOTE_CONNECT_TIMEOUT,
     * $OPJIT_REMOTE_TIMEOUT (seconds), else 50 ms and 3000 ms. A server
     * that fails or does not answer in time costs that once; the remote is
     * then skipped for $OPJIT_REMOTE_BACKOFF seconds (default 30). */
    int remote_connect_timeout_ms;
    int remote_timeout_ms;
    /* 1: also store in the remote the entries found in the local cache
     * (opjit warm --remote); 0: only what this runtime builds. */
    int remote_push;
} opjit_config;

/* Fill cfg with defaults (everything from the environment) and set
 * cfg->size to size, which must be sizeof *cfg as this host's header has
 * it: opjit_config_init(&cfg, sizeof cfg). OPJIT_EINVAL for a NULL cfg or
 * a size below the first opjit_config's (no runtime: no message). */
int opjit_config_init(opjit_config *cfg, size_t size);

/* Create a runtime. cfg may be NULL (defaults). On failure *out is NULL and
 * the status says why (no runtime exists to hold a message). */
int opjit_create(const opjit_config *cfg, opjit_runtime **out);

/* Destroy the runtime, unloading every module. Returns at once: optimizing
 * compiles still queued or running go on in a detached helper process and
 * fill the cache for the next process (when one was handed jobs here, a
 * thread of the library runs on for the milliseconds its short-lived
 * parent takes to exit, and reaps it; the library then stays loaded,
 * whatever dlclose is called). Outputs already handed to the host stay
 * valid (they own their memory). NULL is fine. */
void opjit_destroy(opjit_runtime *rt);

/* The number of threads ops of rt may use (cfg.num_threads resolved).
 * OPJIT_EINVAL for NULL arguments. */
int opjit_num_threads_get(const opjit_runtime *rt, int *num_threads);

/* The message of the last failure of a call on rt from this thread; "" if
 * none. Valid until the next call on rt from this thread. */
const char *opjit_errmsg(const opjit_runtime *rt);

/* Load an operator. spec is a path to a source ("ops-src/nms.c",
 * "/x/nms.cu"; anything with a '/' or a source suffix) or a name ("nms")
 * looked up on the search path directory by directory, as PATH is: the
 * first directory with a source named after it (nms.c, nms.cu; each one
 * usable on this machine is loaded) or a module that registers it
 * ("rmsnorm" in llama_ops.c) decides. Which module registers an op is
 * found through an index kept in the cache: each source is indexed once
 * per version, its init run in a child process with a time limit (as
 * opjit_discover does), and a warm lookup compiles nothing. In the
 * deciding directory the files named after the op come first; two other
 * modules registering it is OPJIT_EINVAL, the message naming both. A name
 * gives the op of that name or fails: OPJIT_ENOTFOUND when the module
 * found registers no op of that name, the message saying what it
 * registers. "module::op" loads the sources of module (module.c,
 * module.cu) and hands back its op op (OPJIT_ENOTFOUND when it registers
 * none). Compiles on a cache miss, runs the module's OPJIT_MODULE init and
 * registers its kernels. *op (may be NULL) receives, owned by rt, the op
 * asked for (loading by path: the op named after the file, else its
 * first). Loading a source already loaded and unchanged is a no-op; a
 * changed source is reloaded. */
int opjit_load_op(opjit_runtime *rt, const char *spec, opjit_op **op);

/* Unload what was loaded from a source path ("ops-src/nms.c"), or every
 * source of a loaded op ("nms"): its kernels leave the dispatch table at
 * once, and a later opjit_load_op loads it afresh (a cache hit when it is
 * unchanged). Calls already running finish safely: the code is unmapped
 * once they have (so is code a reload replaced). An op left with no kernel is no longer found or
 * listed; handles to it stay valid and their calls fail with
 * OPJIT_ENOKERNEL. OPJIT_ENOTFOUND when nothing was loaded from spec. */
int opjit_unload(opjit_runtime *rt, const char *spec);

/* The op registered under name, owned by rt; OPJIT_ENOTFOUND if none. */
int opjit_find_op(opjit_runtime *rt, const char *name, opjit_op **op);

/* Per-load facts, for tools and verbose logs. */
typedef struct opjit_load_info {
    size_t size;         /* sizeof(opjit_load_info), set by the caller */
    char source[1024];   /* path of the source that was loaded */
    int cache_hit;       /* 1 when the artifact came from a cache */
    double key_ms;       /* read sources and hash the key */
    double compile_ms;   /* 0 on a hit; wait_ms not included */
    double load_ms;      /* dlopen + module init */
    double total_ms;
    char tier[8];        /* "tcc", or "opt" when optimized code was loaded */
    /* Where the artifacts came from: "compiled" (any was compiled),
     * "remote" (any came from the remote cache, none compiled) or "local". */
    char origin[12];
    /* Of total_ms, the time spent waiting for other processes that were
     * compiling the same artifacts (one compile per artifact): 0 if none. */
    double wait_ms;
} opjit_load_info;

/* Like opjit_load_op for one source file, also reporting timings into
 * *info (may be NULL; info->size set by the caller: OPJIT_EINVAL when it
 * is below the first opjit_load_info's). */
int opjit_load_file(opjit_runtime *rt, const char *path, opjit_op **op,
                    opjit_load_info *info);

/* Load a module from source text in memory, as torch's load_inline or
 * CuPy's RawModule(code=...) take a string. name is a file name without a
 * directory: "scale2.c" (C, compiled by libtcc) or "scale2.cu" (CUDA: the
 * device half by NVRTC, the host half by libtcc); letters, digits, '_',
 * '-' and '.' only. Diagnostics point at lines of text under that name
 * ("scale2.c:3: error: ..."). text is NUL-terminated and copied; the
 * caller keeps it. The text is cached by content exactly like a file of
 * that name: the same name, text and headers hit the cache in any process
 * (a file of that name and text too).
 * include_dir names the directory its local headers come from: every
 * `#include "x.h"` of text is looked up there (and refused when it is not
 * there), and every local header, however included, must resolve inside
 * it (a "../x.h" or a link leading out is refused). NULL: no local headers
 * (`#include <...>` still finds opjit_op.h and system headers). Loading the
 * same name again with another text replaces the module (its kernels swap
 * in atomically, as for an edited file), with the same text does nothing.
 * *op (may be NULL) receives, owned by rt, the op named after the name's
 * stem, else the first the module registers; opjit_module_ops lists the
 * others. *info (may be NULL) as for opjit_load_file.
 * Errors: OPJIT_EINVAL (a NULL or empty name or text, a name with a '/' or
 * without a .c/.cu suffix, an include refused: the message names the line
 * and why), OPJIT_ENOTFOUND (include_dir does not exist), OPJIT_ECOMPILE
 * (the diagnostics), and those of opjit_load_file. */
int opjit_load_inline(opjit_runtime *rt, const char *name, const char *text,
                      const char *include_dir, opjit_op **op, opjit_load_info *info);

/* Call fn for every op the module of op registers (the source holding
 * op's kernel: an op of llama_ops.c gives rmsnorm, softmax and matvec), in
 * load order; stops early if fn returns non-zero. OPJIT_EINVAL for NULL
 * arguments, OPJIT_ENOKERNEL when op was unloaded. */
int opjit_module_ops(opjit_runtime *rt, const opjit_op *op,
                     int (*fn)(void *ud, const opjit_op *op), void *ud);

/* Wait until the background optimizing compiles started by loads on rt
 * have finished and swapped in. Returns the status of the first that
 * failed since the last wait (the op kept its libtcc code), else OPJIT_OK. */
int opjit_wait(opjit_runtime *rt);

/* CUDA: run calls on device `device` in the host's context and stream,
 * e.g. PyTorch's (torch.cuda.current_stream().cuda_stream). cu_context is a
 * CUcontext, NULL for the device's primary context (the one the CUDA
 * runtime and PyTorch use); cu_stream a CUstream of that context, NULL for
 * its default stream. opjit takes no ownership: both must outlive every
 * call on rt that uses them and, for a context, the runtime itself (device
 * code and workspaces live in it until opjit_destroy); outputs are memory
 * of that context. Calls run asynchronously on the stream, except those
 * that copy results to the host. CUDA outputs come from a stream-ordered
 * pool (where the driver has one) and their deleters give the memory back
 * in the order of the stream they were made on, as PyTorch's allocator
 * does: keep that stream alive until the outputs made on it are freed.
 * Call it before calls on that device, not concurrently with them; switching waits for work queued on the previous
 * stream. No CUDA work happens here. OPJIT_EINVAL for a bad device. */
int opjit_set_cuda_stream(opjit_runtime *rt, int device, void *cu_context, void *cu_stream);

/* Copy src (on the CPU or a CUDA device) to device (OPJIT_CPU, device_id
 * 0; or OPJIT_CUDA, device_id the GPU) as a new contiguous tensor of the
 * same dtype and shape, strides NULL. *out is owned by the caller and
 * freed with its deleter, which may run on any thread, after opjit_destroy:
 * CPU data comes from cfg.alloc; CUDA data is memory of the context calls
 * on that device use (opjit_set_cuda_stream's, else the primary context,
 * which the tensor keeps alive until its deleter runs), as for outputs.
 * src is read from data + byte_offset and must be contiguous (row-major;
 * strides NULL, or any stride for a dimension of size 1); an empty tensor
 * copies nothing. CUDA copies run on the runtime's stream for that device
 * and have finished when this returns; a copy between two GPUs goes
 * through host memory. Thread-safe, like opjit_call.
 * Errors (*out is NULL): OPJIT_EINVAL for a bad device or device_id, a
 * non-contiguous or malformed src, a src on a device opjit does not know
 * or a dtype of fractional bytes; OPJIT_EDEVICE when CUDA is needed and
 * unusable, with the call path's reason ("no libcuda.so.1: ...", "no CUDA
 * device ...", "there is no CUDA device 3 (1 found)"), or when a copy fails;
 * OPJIT_ENOMEM. */
int opjit_tensor_to_device(opjit_runtime *rt, const DLTensor *src, int device, int device_id,
                           DLManagedTensor **out);

/* Argument of an op's schema. */
typedef struct opjit_arg_info {
    size_t size;         /* sizeof(opjit_arg_info), set by the caller */
    const char *name;
    const char *type;      /* "Tensor", "Tensor?", "int", "float", "bool", "int[2]", "str" */
    int kind;              /* opjit_kind it takes */
    int optional;          /* T?: may be None */
    int list_len;          /* N of int[N], else 0 */
    int has_default;
    const char *default_text; /* as written in the schema, or NULL */
} opjit_arg_info;

typedef struct opjit_op_info {
    size_t size;         /* sizeof(opjit_op_info), set by the caller */
    const char *name;
    const char *schema;    /* as registered */
    int nargs;
    int nouts;
    /* Per device: the source that holds its kernel, NULL if none. */
    const char *source[OPJIT_DEVICE_COUNT];
    const char *doc[OPJIT_DEVICE_COUNT];
    /* Per device: the compiler tier of the kernel serving calls ("tcc"). */
    const char *tier[OPJIT_DEVICE_COUNT];
} opjit_op_info;

/* Describe op into *info (info->size set by the caller, as for every
 * struct filled here). Strings are owned by rt and live as long as the
 * op. */
int opjit_op_info_get(opjit_runtime *rt, const opjit_op *op, opjit_op_info *info);
/* Describe argument i of op's schema. */
int opjit_op_arg_get(opjit_runtime *rt, const opjit_op *op, int i, opjit_arg_info *info);
/* Index of argument name, or -1. */
int opjit_op_arg_index(const opjit_op *op, const char *name);

/* ---- gradients and shapes: what the op's source declares ----------------
 * (opjit_derivative, opjit_not_differentiable, opjit_shape in opjit_op.h) */

/* Whether op has a gradient (opjit_op_decls.gradient). */
enum {
    OPJIT_GRAD_UNDECLARED = 0, /* none declared: training through it is an error */
    OPJIT_GRAD_DECLARED = 1,   /* a backward op computes it */
    OPJIT_GRAD_NONE = 2        /* declared not differentiable (indices, masks) */
};

/* Where an argument of a backward op gets its value (opjit_grad_arg.from). */
enum {
    OPJIT_GRAD_FROM_DEFAULT = 0, /* its default */
    OPJIT_GRAD_FROM_GRAD = 1,    /* the incoming gradient of the forward's output `index` */
    OPJIT_GRAD_FROM_INPUT = 2,   /* the forward's argument `index`, as the forward got it */
    OPJIT_GRAD_FROM_OUTPUT = 3,  /* the forward's output `index` */
    OPJIT_GRAD_FROM_MASK = 4     /* output_mask: 1/0 per differentiable input */
};

typedef struct opjit_grad_arg {
    int from;  /* OPJIT_GRAD_FROM_* */
    int index; /* which output or argument of the forward */
} opjit_grad_arg;

typedef struct opjit_op_decls {
    int gradient;         /* OPJIT_GRAD_* */
    /* OPJIT_GRAD_DECLARED: */
    const char *backward; /* the backward op, loaded with op (same module) */
    int ninputs;          /* K, the differentiable inputs */
    const int *inputs;    /* [K] their argument indices in op's schema, in the
                           * order the backward returns their gradients */
    int nbackward_args;   /* the backward op's arguments */
    const opjit_grad_arg *backward_args; /* [nbackward_args]: where each gets its value */
    int shape_rule;       /* 1: op has a shape rule (opjit_output_shapes) */
} opjit_op_decls;

/* What op's source declares, into *decls: owned by rt, valid until
 * opjit_destroy (a reload makes a new one; ask again). The CPU kernel's
 * declarations, else the first device's that has any (a .c and its .cu
 * declare alike: a load refuses two that disagree). An op that declares
 * nothing gets gradient OPJIT_GRAD_UNDECLARED and shape_rule 0.
 * OPJIT_EINVAL for NULL arguments. */
int opjit_op_decls_get(opjit_runtime *rt, const opjit_op *op, const opjit_op_decls **decls);

/* The most dimensions of an output (opjit_output's limit). */
#define OPJIT_MAX_DIMS 32

/* One output's dtype and shape, from op's shape rule. Fixed in size: it
 * never grows (new facts would come through a new function). */
typedef struct opjit_out_shape {
    DLDataType dtype;
    int ndim;
    int64_t shape[OPJIT_MAX_DIMS];
    uint32_t dynamic; /* bit d set: dim d depends on the data; shape[d] is its upper bound */
} opjit_out_shape;

/* What opjit_call(rt, op, args, nargs, ...) would return, from op's shape
 * rule, before the call: for memory planning. Arguments are bound and
 * checked as for the call (the same kernel, the same messages), except
 * that tensors need no data (data may be NULL: nothing is read). outs[0..k)
 * receive the op's k outputs (nouts >= k). Thread-safe.
 * Errors: OPJIT_ENOTFOUND when op declares no shape rule; OPJIT_ECALL for
 * arguments that do not match the schema; OPJIT_EKERNEL when the rule
 * refuses them (the kernel's message); OPJIT_ENOKERNEL as for the call. */
int opjit_output_shapes(opjit_runtime *rt, const opjit_op *op, const opjit_value *args,
                        int nargs, opjit_out_shape *outs, int nouts);

/* Run op's backward op: args and nargs as given to the forward call, outs
 * its outputs (DLTensors of what it returned; may be NULL when the
 * backward takes no output), grads[j] the incoming gradient of output j
 * (NULL for an output the backward takes no gradient of), want[i] 1/0 per
 * differentiable input (NULL: all). grad_inputs[0..K) receive the gradients
 * of the differentiable inputs (opjit_op_decls.inputs), owned by the
 * caller; an input not wanted gets a tensor of shape [0] (or its
 * gradient: a backward may compute it anyway). Thread-safe.
 * Errors: OPJIT_ENOTFOUND when op has no gradient or its backward op is
 * not loaded; OPJIT_ECALL for a missing gradient or output; the backward
 * call's errors. */
int opjit_call_backward(opjit_runtime *rt, const opjit_op *op, const opjit_value *args,
                        int nargs, DLTensor *const *outs, DLTensor *const *grads,
                        const int *want, DLManagedTensor **grad_inputs, int ngrad);

/* Call fn for every loaded op, in load order; stops early if fn returns
 * non-zero. */
int opjit_list(opjit_runtime *rt, int (*fn)(void *ud, const opjit_op *op), void *ud);

/* Value constructors. */
static inline opjit_value opjit_tensor(DLTensor *t)
{
    opjit_value v; v.kind = t ? OPJIT_KIND_TENSOR : OPJIT_KIND_NONE; v.len = 0; v.u.tensor = t; return v;
}
static inline opjit_value opjit_int(int64_t i)
{
    opjit_value v; v.kind = OPJIT_KIND_INT; v.len = 0; v.u.i = i; return v;
}
static inline opjit_value opjit_float(double f)
{
    opjit_value v; v.kind = OPJIT_KIND_FLOAT; v.len = 0; v.u.f = f; return v;
}
static inline opjit_value opjit_bool(int b)
{
    opjit_value v; v.kind = OPJIT_KIND_BOOL; v.len = 0; v.u.b = b != 0; return v;
}
static inline opjit_value opjit_ints(const int64_t *p, int n)
{
    opjit_value v; v.kind = OPJIT_KIND_INTS; v.len = n; v.u.ints = p; return v;
}
/* A str argument; s must stay valid until the call returns. */
static inline opjit_value opjit_str(const char *s)
{
    opjit_value v; v.kind = s ? OPJIT_KIND_STR : OPJIT_KIND_NONE; v.len = 0; v.u.str = s; return v;
}
static inline opjit_value opjit_none(void)
{
    opjit_value v; v.kind = OPJIT_KIND_NONE; v.len = 0; v.u.i = 0; return v;
}

/* Call op with positional args (fewer than the schema: the rest take their
 * defaults; OPJIT_KIND_NONE also takes the default). The device is that of
 * the tensor arguments (CPU when there are none). On success outs[0..k)
 * receive the op's k outputs (nouts >= k), each owned by the caller and
 * freed with its deleter. On failure no output is returned. Thread-safe. */
int opjit_call(opjit_runtime *rt, const opjit_op *op, const opjit_value *args,
               int nargs, DLManagedTensor **outs, int nouts);

/* Where libopjit.a finds its installed ops. libopjit.so finds them next to
 * itself; an archive linked into a host has no place of its own, so
 * find_package(opjit) (opjit::opjit_static) and pkg-config opjit-static
 * give the host -DOPJIT_STATIC_OPS_DIR="<prefix>/share/opjit/ops", which
 * this turns into a weak symbol the library reads (searched after
 * cfg.ops_path and $OPJIT_OPS_PATH). */
#if defined(OPJIT_STATIC_OPS_DIR) && defined(__GNUC__)
extern const char opjit_static_ops_dir[];
__attribute__((weak)) const char opjit_static_ops_dir[] = OPJIT_STATIC_OPS_DIR;
#endif


#if defined(__GNUC__)
#pragma GCC visibility pop
#endif
#ifdef __cplusplus
}
#endif

#endif /* OPJIT_H */
