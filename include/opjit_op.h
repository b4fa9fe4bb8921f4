/*
 * opjit_op.h - the API an operator source includes.
 *
 * This header is parsed by libtcc (op sources, host half of .cu files), by
 * NVRTC never (device code includes nothing of ours), and by the C compiler
 * that builds the library (shared types). Keep it C99 and free of compiler
 * extensions.
 *
 * An op module is one translation unit:
 *
 *   #include <opjit_op.h>
 *   static int relu_cpu(opjit_ctx *ctx, opjit_args *a) { ... }
 *   OPJIT_MODULE(m) {
 *       opjit_def(m, "relu(Tensor self) -> Tensor", OPJIT_CPU, relu_cpu, "max(x, 0)");
 *       opjit_require(m, "self", "float32 contiguous");
 *   }
 *
 * The runtime hands the module a table of functions (opjit_api) when it
 * runs the init entry, so an op shared object has no undefined symbols into
 * the host: the host may link opjit statically and need not export anything.
 */
#ifndef OPJIT_OP_H
#define OPJIT_OP_H

#include <stddef.h>
#include <stdint.h>
#include <dlpack/dlpack.h>

/* Bumped whenever a struct below or the meaning of an api entry changes.
 * The module init refuses a runtime with another ABI, and the cache key
 * includes it. */
#define OPJIT_ABI_VERSION 1

/* Device types a kernel can be registered for. X(name, lower-case name,
 * DLPack device type). */
#define OPJIT_DEVICE_LIST(X)            \
    X(CPU, "cpu", kDLCPU)               \
    X(CUDA, "cuda", kDLCUDA)

typedef enum opjit_device {
#define OPJIT_DEVICE_ENUM(name, str, dl) OPJIT_##name,
    OPJIT_DEVICE_LIST(OPJIT_DEVICE_ENUM)
#undef OPJIT_DEVICE_ENUM
    OPJIT_DEVICE_COUNT
} opjit_device;

/* DLPack 0.6 has no bool code; this is the value later DLPack versions use. */
#define OPJIT_DL_BOOL 6

/* Kinds of argument values: one tagged value type, as in tvm-ffi. */
typedef enum opjit_kind {
    OPJIT_KIND_NONE = 0, /* "not given": a default is used, or Tensor? = None */
    OPJIT_KIND_TENSOR,
    OPJIT_KIND_INT,
    OPJIT_KIND_FLOAT,
    OPJIT_KIND_BOOL,
    OPJIT_KIND_INTS, /* int[N] */
    OPJIT_KIND_STR   /* str: a NUL-terminated UTF-8 string (appended) */
} opjit_kind;

typedef struct opjit_value {
    int32_t kind; /* opjit_kind */
    int32_t len;  /* element count for OPJIT_KIND_INTS */
    union {
        DLTensor *tensor;
        int64_t i;
        double f;
        int64_t b;
        const int64_t *ints;
        const char *str; /* OPJIT_KIND_STR; the caller's, valid during the call */
    } u;
} opjit_value;

/* What a kernel sees: every schema argument in declaration order, checked
 * against the schema and with defaults filled in. */
typedef struct opjit_args {
    int n;
    const opjit_value *v;
} opjit_args;

typedef struct opjit_ctx opjit_ctx;       /* one call in flight */
typedef struct opjit_module opjit_module; /* a module being registered */

/* A kernel returns 0 on success; on failure, the return of opjit_fail(). */
typedef int (*opjit_kernel_fn)(opjit_ctx *ctx, opjit_args *a);

/* A shape rule (opjit_shape): what a call with these arguments would
 * return, computed from the tensors' shapes and dtypes and the other
 * arguments, never from data. It runs with the arguments checked against
 * the schema as for a call, but a tensor's data may be NULL (a framework's
 * fake or meta tensor): it must not read it. It names every output with
 * opjit_output_shape (and opjit_output_dynamic for a size that depends on
 * the data) and refuses what the kernel refuses with opjit_fail, ideally
 * by sharing the kernel's checks. Returns 0, or the status of opjit_fail. */
typedef int (*opjit_shape_fn)(opjit_ctx *ctx, opjit_args *a);

/* One chunk [lo, hi) of an opjit_parallel_for loop. Returns 0, or the
 * return of opjit_fail(). */
typedef int (*opjit_chunk_fn)(void *user, int64_t lo, int64_t hi);

/* The runtime's services, handed to the module's init. Append only. */
typedef struct opjit_api {
    uint32_t abi_version;
    uint32_t size; /* sizeof(opjit_api) of the runtime */
    /* registration */
    int (*def)(opjit_module *m, const char *schema, int device,
               opjit_kernel_fn fn, const char *doc);
    int (*require)(opjit_module *m, const char *arg, const char *spec);
    /* calls */
    DLTensor *(*output)(opjit_ctx *ctx, int index, DLDataType dtype,
                        int ndim, const int64_t *shape);
    void *(*workspace)(opjit_ctx *ctx, size_t bytes);
    int (*fail)(opjit_ctx *ctx, const char *fmt, ...);
    int (*device_id)(opjit_ctx *ctx);
    /* CUDA (the host half of a .cu op). Pointers are device pointers. */
    int (*launch)(opjit_ctx *ctx, const char *kernel, const unsigned grid[3],
                  const unsigned block[3], unsigned shared_bytes, void **params);
    int (*memcpy_dev)(opjit_ctx *ctx, void *dst, const void *src, size_t bytes,
                      int kind); /* OPJIT_COPY_* */
    void *(*device_workspace)(opjit_ctx *ctx, size_t bytes);
    void *(*stream)(opjit_ctx *ctx); /* the CUstream calls run on */
    int (*synchronize)(opjit_ctx *ctx);
    /* threads (appended: a module checks size before use) */
    int (*parallel_for)(opjit_ctx *ctx, int64_t begin, int64_t end, int64_t grain,
                        opjit_chunk_fn fn, void *user);
    int (*num_threads)(opjit_ctx *ctx);
    int (*thread_num)(opjit_ctx *ctx);
    /* settings (appended) */
    int (*env_flag)(const char *name, int dflt);
    /* gradients and shape rules (appended) */
    int (*derivative)(opjit_module *m, const char *op, const char *backward,
                      const char *inputs);
    int (*not_differentiable)(opjit_module *m, const char *op);
    int (*shape)(opjit_module *m, const char *op, opjit_shape_fn fn);
    int (*output_shape)(opjit_ctx *ctx, int index, DLDataType dtype, int ndim,
                        const int64_t *shape);
    int (*output_dynamic)(opjit_ctx *ctx, int index, int dim);
    /* half precision (appended) */
    int (*half_kernel)(opjit_ctx *ctx);
    /* the machine's BLAS, loaded on first use (appended) */
    void *(*blas)(opjit_ctx *ctx, const char *name);
} opjit_api;

/* Directions for opjit_memcpy. */
enum { OPJIT_COPY_HTOD = 1, OPJIT_COPY_DTOH = 2, OPJIT_COPY_DTOD = 3 };

/* What opjit_half_kernel returns ($OPJIT_HALF_KERNEL). */
enum { OPJIT_HALF_AUTO = 0, OPJIT_HALF_WIDE = 1, OPJIT_HALF_DOT = 2, OPJIT_HALF_AMX = 3 };

/* The entry point every module exports (what OPJIT_MODULE defines). */
#define OPJIT_MODULE_ENTRY "opjit_module_init"
typedef int (*opjit_module_init_fn)(const opjit_api *api, opjit_module *m);

#ifndef OPJIT_TYPES_ONLY

/* The api table of this module, set by the init entry. */
static inline const opjit_api **opjit__api_slot(void)
{
    static const opjit_api *api;
    return &api;
}
#define OPJIT__API (*opjit__api_slot())

/* OPJIT_MODULE(m) { body } defines the module init entry, the way
 * PYBIND11_MODULE does for Python. The body registers kernels on m. A
 * module has no name of its own: its file is its name (loading "mod::op"
 * reads mod.c and mod.cu), and its ops are named by their schemas.
 * OPJIT_MODULE(name, m), the older spelling, is still accepted (the name
 * is ignored, as it always was). */
#define OPJIT_MODULE(...) OPJIT__MODULE_PICK(__VA_ARGS__, OPJIT__MODULE2, OPJIT__MODULE1, _)(__VA_ARGS__)
#define OPJIT__MODULE_PICK(a, b, which, ...) which
#define OPJIT__MODULE1(m) OPJIT__MODULE_DEF(m)
#define OPJIT__MODULE2(name, m) OPJIT__MODULE_DEF(m)
#define OPJIT__MODULE_DEF(m)                                                \
    static void opjit__module_body(opjit_module *m);                        \
    int opjit_module_init(const opjit_api *api, opjit_module *m)            \
    {                                                                       \
        if (!api || api->abi_version != OPJIT_ABI_VERSION ||                \
            api->size < sizeof(opjit_api))                                  \
            return -1;                                                      \
        OPJIT__API = api;                                                   \
        opjit__module_body(m);                                              \
        return 0;                                                           \
    }                                                                       \
    static void opjit__module_body(opjit_module *m)

/* Register kernel fn for device under schema, e.g.
 * "mm(Tensor self, Tensor mat2) -> Tensor". A bad schema or a duplicate
 * registration is recorded on the module and fails the load. */
static inline int opjit_def(opjit_module *m, const char *schema, int device,
                            opjit_kernel_fn fn, const char *doc)
{
    return OPJIT__API->def(m, schema, device, fn, doc);
}

/* Constrain a Tensor argument of the kernel registered last, checked before
 * every call: spec is space-separated words among dtype names joined by '|'
 * ("float32|float64", or a group: "floating" for float32|float64|float16|
 * bfloat16, "half" for float16|bfloat16), "rank=N" and "contiguous". */
static inline int opjit_require(opjit_module *m, const char *arg,
                                const char *spec)
{
    return OPJIT__API->require(m, arg, spec);
}

/* ---- gradients and shape rules: what a framework needs beside the kernel.
 * Declared in the module's init after the opjit_def of the ops they name,
 * per op (not per kernel: the .c and .cu of an op declare alike), in the
 * spirit of PyTorch's derivatives.yaml. A bad declaration fails the load
 * with a message naming it. */

/* op's gradient is computed by the op backward, defined in this module
 * for this device, for the Tensor inputs listed in `inputs` (comma-
 * separated argument names of op: "input, weight, bias"); other inputs
 * get none. backward's arguments are filled by name:
 *   grad                 the incoming gradient of op's output (an op
 *                        with several outputs: grad_<output name>);
 *   <an argument of op>  that argument's value as op got it (the tensors
 *                        named so are what the forward saves);
 *   result               op's output (several: the output's own name);
 *   int[K] output_mask   1/0 per listed input: whether its gradient is
 *                        wanted (the kernel may skip a 0 and return a
 *                        tensor of shape [0] in that slot);
 *   anything else        must have a default, and gets it.
 * backward returns one Tensor per listed input, in that order. It is an
 * ordinary op (callable from C, the CLI, Python); declare its own
 * derivative to make op twice differentiable. */
static inline int opjit_derivative(opjit_module *m, const char *op, const char *backward,
                                   const char *inputs)
{
    return OPJIT__API->derivative(m, op, backward, inputs);
}

/* op's outputs are not differentiable functions of its inputs (indices,
 * counts, masks): frameworks give them no gradient (torch: outputs that
 * do not require grad). An op that declares neither this nor a derivative
 * has no gradient: training through it is an error at backward time. */
static inline int opjit_not_differentiable(opjit_module *m, const char *op)
{
    return OPJIT__API->not_differentiable(m, op);
}

/* op's shape rule (see opjit_shape_fn): hosts plan memory with it
 * (opjit_output_shapes), the Python front makes torch's fake kernel of it
 * (torch.compile). */
static inline int opjit_shape(opjit_module *m, const char *op, opjit_shape_fn fn)
{
    return OPJIT__API->shape(m, op, fn);
}

/* In a shape rule: output index (0-based) will have dtype and shape
 * (ndim sizes, ndim <= 32). Returns 0, or the status of the failure
 * recorded (return it). */
static inline int opjit_output_shape(opjit_ctx *ctx, int index, DLDataType dtype, int ndim,
                                     const int64_t *shape)
{
    return OPJIT__API->output_shape(ctx, index, dtype, ndim, shape);
}

/* In a shape rule, after opjit_output_shape: dimension dim of output
 * index depends on the data (nms: how many boxes are kept); the size
 * given for it is its upper bound. */
static inline int opjit_output_dynamic(opjit_ctx *ctx, int index, int dim)
{
    return OPJIT__API->output_dynamic(ctx, index, dim);
}

/* Argument accessors. The runtime has checked kinds against the schema. */
static inline DLTensor *opjit_arg_tensor(opjit_args *a, int i)
{
    return a->v[i].kind == OPJIT_KIND_TENSOR ? a->v[i].u.tensor : NULL;
}
static inline int64_t opjit_arg_int(opjit_args *a, int i) { return a->v[i].u.i; }
static inline double opjit_arg_float(opjit_args *a, int i) { return a->v[i].u.f; }
static inline int opjit_arg_bool(opjit_args *a, int i) { return a->v[i].u.b != 0; }
static inline const int64_t *opjit_arg_ints(opjit_args *a, int i) { return a->v[i].u.ints; }
static inline int opjit_arg_len(opjit_args *a, int i) { return a->v[i].len; }
/* A str argument, or NULL when it is None (str?). */
static inline const char *opjit_arg_str(opjit_args *a, int i)
{
    return a->v[i].kind == OPJIT_KIND_STR ? a->v[i].u.str : NULL;
}

/* Allocate output number index (0-based) on the call's device, contiguous.
 * The runtime owns it until the call returns it to the host. NULL on
 * failure, with the error recorded: return opjit_fail(ctx, ...) or -1. */
static inline DLTensor *opjit_output(opjit_ctx *ctx, int index, DLDataType dtype,
                                     int ndim, const int64_t *shape)
{
    return OPJIT__API->output(ctx, index, dtype, ndim, shape);
}

/* Scratch memory valid until the call returns, reused across calls. */
static inline void *opjit_workspace(opjit_ctx *ctx, size_t bytes)
{
    return OPJIT__API->workspace(ctx, bytes);
}

/* Record a printf-style error message for the host; returns the status to
 * return from the kernel. */
#define opjit_fail (OPJIT__API->fail)

/* CUDA, for the host half of a .cu op. Launch device kernel `kernel` (an
 * extern "C" __global__ function of the same file) on the call's stream;
 * params as for cuLaunchKernel: one pointer per kernel parameter. */
static inline int opjit_launch(opjit_ctx *ctx, const char *kernel, const unsigned grid[3],
                               const unsigned block[3], unsigned shared_bytes, void **params)
{
    return OPJIT__API->launch(ctx, kernel, grid, block, shared_bytes, params);
}
/* Copy on the call's stream, ordered with launches. OPJIT_COPY_DTOH waits
 * for the copy to finish. */
static inline int opjit_memcpy(opjit_ctx *ctx, void *dst, const void *src, size_t bytes,
                               int kind)
{
    return OPJIT__API->memcpy_dev(ctx, dst, src, bytes, kind);
}
/* Device scratch memory valid until the call returns, reused across calls. */
static inline void *opjit_device_workspace(opjit_ctx *ctx, size_t bytes)
{
    return OPJIT__API->device_workspace(ctx, bytes);
}
/* The CUstream the call runs on (the host's, when it handed one over). */
static inline void *opjit_stream(opjit_ctx *ctx) { return OPJIT__API->stream(ctx); }
static inline int opjit_synchronize(opjit_ctx *ctx) { return OPJIT__API->synchronize(ctx); }

/* The device ordinal of the call (0 for CPU). */
static inline int opjit_device_id(opjit_ctx *ctx) { return OPJIT__API->device_id(ctx); }

/* Threads. Run fn(user, lo, hi) over [begin, end) in chunks of grain
 * (the last may be shorter): [begin, begin + grain), [begin + grain, ...),
 * each chunk exactly once, in no particular order, on the runtime's pool
 * (or the host's), the calling thread included; returns when every chunk
 * has returned. Chunk boundaries depend on begin, end and grain only,
 * never on the number of threads: split outputs among chunks (never sum
 * across them) and the results are the same bits for any thread count.
 * One chunk, a pool of one thread, a call from inside a chunk, or a pool
 * busy with another host thread's loop: the chunks run on this thread.
 * A chunk fails by returning opjit_fail(ctx, ...) (or non-zero): chunks
 * not yet started are skipped and this returns the status, the first
 * failure's message recorded for the host; return it from the kernel.
 * Chunks may read the arguments and write outputs and workspace got
 * before the loop; opjit_output and opjit_workspace fail inside a chunk. */
static inline int opjit_parallel_for(opjit_ctx *ctx, int64_t begin, int64_t end, int64_t grain,
                                     opjit_chunk_fn fn, void *user)
{
    return OPJIT__API->parallel_for(ctx, begin, end, grain, fn, user);
}
/* How many threads opjit_parallel_for may use: size per-thread scratch by
 * it. Always at least 1. */
static inline int opjit_num_threads(opjit_ctx *ctx) { return OPJIT__API->num_threads(ctx); }
/* A boolean environment setting of the op, read the way opjit reads its
 * own: 1/0, true/false, yes/no, on/off in any case; dflt when unset or
 * anything else. */
static inline int opjit_env_flag(const char *name, int dflt)
{
    return OPJIT__API->env_flag(name, dflt);
}
/* Which 16-bit GEMM $OPJIT_HALF_KERNEL asks for (read at each call, as
 * the library reads its settings): OPJIT_HALF_AUTO (unset, empty or
 * "auto"), OPJIT_HALF_WIDE, OPJIT_HALF_DOT or OPJIT_HALF_AMX; -1 with the
 * error recorded (return it) for any other value. The shipped mm and
 * conv2d read it (ops-src/half_wide.h); an op of yours may too. */
static inline int opjit_half_kernel(opjit_ctx *ctx) { return OPJIT__API->half_kernel(ctx); }
/* The address of a function of the machine's BLAS, by its CBLAS name
 * (opjit_blas(ctx, "cblas_sgemm")): cast it to the function's type from
 * <cblas.h> and call it. The library (the OpenBLAS opjit was built with)
 * is loaded the first time any op asks, set to one thread (an op's
 * threads are opjit's, opjit_parallel_for) and kept. NULL, the error
 * recorded, when it cannot be loaded or has no such function: return -1
 * from the kernel (or the chunk). Also inside a chunk. An op that calls
 * cblas_* directly instead has the library linked to its artifact: every
 * load of the op loads it, some milliseconds in a process that has not,
 * whether a BLAS path then runs or not. */
static inline void *opjit_blas(opjit_ctx *ctx, const char *name)
{
    return OPJIT__API->blas(ctx, name);
}
/* Inside a chunk, the running thread's slot in [0, opjit_num_threads):
 * no two chunks running at once share one. 0 outside parallel_for. */
static inline int opjit_thread_num(opjit_ctx *ctx) { return OPJIT__API->thread_num(ctx); }

/* Handy DLDataType constructors and tensor helpers. */
static inline DLDataType opjit_dtype(int code, int bits)
{
    DLDataType t;
    t.code = (uint8_t)code;
    t.bits = (uint8_t)bits;
    t.lanes = 1;
    return t;
}
#define OPJIT_FLOAT32 opjit_dtype(kDLFloat, 32)
#define OPJIT_FLOAT64 opjit_dtype(kDLFloat, 64)
#define OPJIT_FLOAT16 opjit_dtype(kDLFloat, 16)
#define OPJIT_BFLOAT16 opjit_dtype(kDLBfloat, 16)
#define OPJIT_INT32 opjit_dtype(kDLInt, 32)
#define OPJIT_INT64 opjit_dtype(kDLInt, 64)

static inline int opjit_is_dtype(const DLTensor *t, int code, int bits)
{
    return t->dtype.code == code && t->dtype.bits == bits && t->dtype.lanes == 1;
}
static inline int64_t opjit_numel(const DLTensor *t)
{
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++)
        n *= t->shape[i];
    return n;
}
/* Data pointer with byte_offset applied. */
static inline void *opjit_data(const DLTensor *t)
{
    return (char *)t->data + t->byte_offset;
}

#endif /* OPJIT_TYPES_ONLY */

/* ---- half precision ---------------------------------------------------------
 * float16 (IEEE binary16) and bfloat16 elements are stored as their 16 bits
 * (uint16_t: libtcc has no _Float16). Compute in float32 and round once at
 * the end. Conversions round to nearest, ties to even; infinities, signed
 * zeros and subnormals are kept; a NaN stays a NaN of the same sign, made
 * quiet, with its payload's top bits (as x86's F16C instructions do, which
 * the optimizing tier uses where the CPU has them: both tiers give the same
 * bits). bfloat16 keeps float32's subnormals, as torch does. Hosts get
 * these through opjit.h too. */
typedef union opjit__bits32 {
    float f;
    uint32_t u;
} opjit__bits32;

#if defined(__F16C__) && !defined(__TINYC__) && !defined(__CUDACC_RTC__)
#include <immintrin.h>
static inline float opjit_f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }
static inline uint16_t opjit_f32_to_f16(float f)
{
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
#else
static inline float opjit_f16_to_f32(uint16_t h)
{
    opjit__bits32 v;
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
    if (exp == 0x1f) /* infinity, or NaN made quiet */
        v.u = sign | 0x7f800000u | (mant << 13) | (mant ? 0x00400000u : 0);
    else if (exp) /* normal: rebias the exponent from 15 to 127 */
        v.u = sign | ((exp + 112) << 23) | (mant << 13);
    else { /* zero or subnormal: mant * 2^-24, exact in float32 */
        v.f = (float)mant * 5.9604644775390625e-8f;
        v.u |= sign;
    }
    return v.f;
}
static inline uint16_t opjit_f32_to_f16(float f)
{
    opjit__bits32 v, magic;
    v.f = f;
    uint32_t sign = (v.u >> 16) & 0x8000u, a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) /* NaN: quiet, top payload bits */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x47800000u) /* 2^16 and up (and infinity): infinity */
        return (uint16_t)(sign | 0x7c00u);
    if (a < 0x38800000u) {
        /* below float16's smallest normal, 2^-14: adding 0.5 puts the
         * subnormal's 10 bits at the bottom of the float's mantissa, and
         * the float addition rounds them to nearest even */
        magic.u = 0x3f000000u;
        v.u = a;
        v.f += magic.f;
        return (uint16_t)(sign | (v.u - magic.u));
    }
    /* normal: rebias, then round the 13 dropped bits to nearest even; a
     * carry out of the mantissa steps the exponent (65520 and up become
     * infinity this way) */
    a += 0xc8000fffu + ((a >> 13) & 1u);
    return (uint16_t)(sign | (a >> 13));
}
#endif

static inline float opjit_bf16_to_f32(uint16_t h)
{
    opjit__bits32 v;
    v.u = (uint32_t)h << 16;
    return v.f;
}
static inline uint16_t opjit_f32_to_bf16(float f)
{
    opjit__bits32 v;
    v.f = f;
    if ((v.u & 0x7fffffffu) > 0x7f800000u) /* NaN: quiet */
        return (uint16_t)((v.u >> 16) | 0x40u);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

/* One kernel source for every floating dtype, as AT_DISPATCH_FLOATING_TYPES
 * does for PyTorch. Write the kernel once as a macro of its name, storage
 * type T, compute type ACC and the element conversions LOAD (T to ACC) and
 * STORE (ACC to T):
 *
 *   #define SCALE(NAME, T, ACC, LOAD, STORE)                                \
 *       static int NAME(const void *x, void *y, int64_t n, double s)        \
 *       {                                                                   \
 *           for (int64_t i = 0; i < n; i++)                                 \
 *               ((T *)y)[i] = STORE(LOAD(((const T *)x)[i]) * (ACC)s);      \
 *           return 0;                                                       \
 *       }
 *   OPJIT_FLOATING_KERNELS(SCALE, scale)   defines scale_f32, scale_f64,
 *                                          scale_f16 and scale_bf16
 *   ...
 *   return OPJIT_DISPATCH_FLOATING(ctx, x->dtype, scale, (px, py, n, s));
 *
 * float16 and bfloat16 compute in float32 (ACC), float64 in double. The
 * schema says which dtypes an argument takes ("floating" names all four). */
static inline float opjit__load_same_f(float x) { return x; }
static inline double opjit__load_same_d(double x) { return x; }
#define OPJIT_FLOATING_KERNELS(KERNEL, name)                                          \
    KERNEL(name##_f32, float, float, opjit__load_same_f, opjit__load_same_f)          \
    KERNEL(name##_f64, double, double, opjit__load_same_d, opjit__load_same_d)        \
    KERNEL(name##_f16, uint16_t, float, opjit_f16_to_f32, opjit_f32_to_f16)           \
    KERNEL(name##_bf16, uint16_t, float, opjit_bf16_to_f32, opjit_f32_to_bf16)

/* Call name_<suffix> args for dtype (one of the four); an error naming the
 * dtype for any other. Evaluates to the call's int status. */
#define OPJIT_DISPATCH_FLOATING(ctx, dtype, name, args)                                  \
    ((dtype).lanes != 1 ? opjit_fail(ctx, "no %s kernel for vector dtypes", #name)      \
     : (dtype).code == kDLFloat && (dtype).bits == 32 ? name##_f32 args                 \
     : (dtype).code == kDLFloat && (dtype).bits == 64 ? name##_f64 args                 \
     : (dtype).code == kDLFloat && (dtype).bits == 16 ? name##_f16 args                 \
     : (dtype).code == kDLBfloat && (dtype).bits == 16 ? name##_bf16 args               \
     : opjit_fail(ctx, "no %s kernel for dtype code %d, %d bits", #name, (dtype).code,  \
                  (dtype).bits))


/* glibc's <sys/cdefs.h> defines __attribute__ away for compilers that are
 * not GCC (libtcc among them); op code must not rely on it either way. */
#ifdef __TINYC__
#undef __attribute__
#endif

#endif /* OPJIT_OP_H */
