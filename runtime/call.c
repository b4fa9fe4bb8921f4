/* runtime/call.c - opjit_call: check the arguments against the kernel's
 * schema, run it, hand the outputs over. Also the call-time services of
 * the api table: outputs, workspace, errors; and opjit_tensor_to_device,
 * whose copies are blocks like outputs.
 *
 * The hot path takes no lock and allocates nothing unless the kernel asks:
 * one atomic load picks the kernel, the checks read the schema parsed at
 * registration; two stores into this thread's own record say when a call
 * runs (runtime/reclaim.c: replaced code is unloaded after). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/cuda.h" /* the CUDA entries of the api table: launch, stream, ... */
#include "runtime/device.h"
#include "runtime/runtime.h"

/* ---- outputs ------------------------------------------------------------- */

/* An output is one block from the runtime's allocator: this header, the
 * shape, then the data aligned to 64 bytes. The deleter frees the block. */
typedef struct out_block {
    DLManagedTensor mt;
    opjit_alloc_fn alloc;
    void *alloc_ud;
    size_t size;
    device_mem dev; /* the data on a device without host memory; the block stays
                     * host memory */
    int64_t shape[];
} out_block;

static void out_block_delete(DLManagedTensor *mt)
{
    out_block *b = (out_block *)mt;
    if (b) {
        if (b->dev.free)
            b->dev.free(&b->dev);
        b->alloc(b->alloc_ud, b, b->size, 0);
    }
}

static int kernel_error(opjit_ctx *ctx, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    if (pool_chunk_vfail(ctx, fmt, ap)) { /* inside a chunk: the loop reports it */
        va_end(ap);
        return status;
    }
    va_end(ap);
    va_start(ap, fmt);
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!ctx->status)
        ctx->status = rt_error(ctx->rt, status, "%s: %s", ctx->k->sch->name, msg);
    return status;
}

/* Bytes of a dense tensor of elem-byte elements: 0, 1 + the dim whose size
 * is bad (negative, or the element count overflows), or -1 when the bytes
 * overflow. */
static int dense_bytes(int ndim, const int64_t *shape, size_t elem, size_t *bytes)
{
    size_t numel = 1;
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(numel, (size_t)shape[i], &numel) ||
            numel > SIZE_MAX / 2)
            return i + 1;
    if (__builtin_mul_overflow(numel, elem, bytes) || *bytes > SIZE_MAX / 2)
        return -1;
    return 0;
}

/* A new dense tensor of bytes bytes in one block from rt's allocator, on
 * device dev:id: in host memory, the data in the block; else the device's
 * memory (dev entered, or the call's), freed by the deleter. The caller
 * has checked dtype and shape. On failure the status, and err says why. */
static int out_block_new(opjit_runtime *rt, const device_ops *dev, int id, void *entered,
                         DLDataType dtype, int ndim, const int64_t *shape, size_t bytes,
                         DLManagedTensor **out, char *err, size_t errlen)
{
    int host = dev->host_memory;
    size_t head = sizeof(out_block) + (size_t)ndim * sizeof(int64_t);
    size_t size = head + (host ? 64 + bytes : 0);
    out_block *b = rt->alloc(rt->alloc_ud, NULL, 0, size);
    if (!b) {
        snprintf(err, errlen, "out of memory allocating %zu bytes", size);
        return OPJIT_ENOMEM;
    }
    memset(b, 0, head);
    b->alloc = rt->alloc;
    b->alloc_ud = rt->alloc_ud;
    b->size = size;
    if (ndim)
        memcpy(b->shape, shape, (size_t)ndim * sizeof(int64_t));
    uintptr_t data = ((uintptr_t)b + head + 63) & ~(uintptr_t)63;
    if (!host) {
        /* The device's memory (CUDA: at least 256-byte aligned), freed by
         * the deleter. */
        int rc = dev->mem_alloc(entered, id, bytes, &b->dev, err, errlen);
        if (rc) {
            b->alloc(b->alloc_ud, b, size, 0);
            return rc;
        }
        data = (uintptr_t)b->dev.ptr;
    }
    DLTensor *t = &b->mt.dl_tensor;
    t->data = (void *)data;
    t->device.device_type = dev->dl_type;
    t->device.device_id = host ? 0 : id;
    t->ndim = ndim;
    t->dtype = dtype;
    t->shape = b->shape;
    t->strides = NULL;
    t->byte_offset = 0;
    b->mt.manager_ctx = NULL;
    b->mt.deleter = out_block_delete;
    *out = &b->mt;
    return OPJIT_OK;
}

static DLTensor *api_output(opjit_ctx *ctx, int index, DLDataType dtype, int ndim,
                            const int64_t *shape)
{
    const kernel *k = ctx->k;
    if (ctx->shapes) {
        kernel_error(ctx, OPJIT_EKERNEL, "opjit_output: not allowed in a shape rule (it makes "
                     "no tensor: say the shape with opjit_output_shape)");
        return NULL;
    }
    if (pool_in_chunk()) { /* ctx belongs to the thread that started the loop */
        kernel_error(ctx, OPJIT_EKERNEL, "opjit_output: not allowed inside a parallel_for "
                     "chunk; allocate outputs before the loop");
        return NULL;
    }
    if (index < 0 || index >= k->sch->nouts) {
        kernel_error(ctx, OPJIT_EKERNEL, "opjit_output: output %d out of range (the schema has %d)",
                     index, k->sch->nouts);
        return NULL;
    }
    if (ctx->outs[index]) {
        kernel_error(ctx, OPJIT_EKERNEL, "opjit_output: output %d allocated twice", index);
        return NULL;
    }
    if (ndim < 0 || ndim > 32 || (ndim && !shape) || dtype.bits == 0 || dtype.bits % 8 ||
        dtype.lanes != 1) {
        kernel_error(ctx, OPJIT_EKERNEL, "opjit_output: bad dtype or rank for output %d", index);
        return NULL;
    }
    const device_ops *dev = devices[ctx->device];
    if (!dev) {
        kernel_error(ctx, OPJIT_EDEVICE, "opjit_output: no allocator for device %s",
                     opjit_device_name(ctx->device));
        return NULL;
    }
    size_t bytes;
    int bad = dense_bytes(ndim, shape, dtype.bits / 8, &bytes);
    if (bad > 0) {
        kernel_error(ctx, OPJIT_EKERNEL, "opjit_output: bad size %lld in dim %d of output %d",
                     (long long)shape[bad - 1], bad - 1, index);
        return NULL;
    }
    if (bad < 0) {
        kernel_error(ctx, OPJIT_ENOMEM, "opjit_output: output %d is too large", index);
        return NULL;
    }
    char err[512];
    int rc = out_block_new(ctx->rt, dev, ctx->device_id, ctx->cdev, dtype, ndim, shape, bytes,
                           &ctx->outs[index], err, sizeof err);
    if (rc) {
        ctx->outs[index] = NULL;
        kernel_error(ctx, rc, "opjit_output: output %d: %s", index, err);
        return NULL;
    }
    return &ctx->outs[index]->dl_tensor;
}

/* ---- workspace: an arena per call, reused across calls -------------------- */

struct overflow {
    struct overflow *next;
    size_t size;
};

static void *api_workspace(opjit_ctx *ctx, size_t bytes)
{
    opjit_runtime *rt = ctx->rt;
    if (ctx->shapes) {
        kernel_error(ctx, OPJIT_EKERNEL, "opjit_workspace: not allowed in a shape rule");
        return NULL;
    }
    if (pool_in_chunk()) {
        kernel_error(ctx, OPJIT_EKERNEL, "opjit_workspace: not allowed inside a parallel_for "
                     "chunk; take per-thread workspace before the loop (opjit_num_threads)");
        return NULL;
    }
    if (bytes > SIZE_MAX / 4) {
        kernel_error(ctx, OPJIT_ENOMEM, "opjit_workspace: %zu bytes is too large (out of memory)",
                     bytes);
        return NULL;
    }
    bytes = (bytes + 63) & ~(size_t)63;
    if (!ctx->ws) {
        pthread_mutex_lock(&rt->lock);
        ctx->ws = rt->free_ws;
        if (ctx->ws)
            rt->free_ws = ctx->ws->next;
        pthread_mutex_unlock(&rt->lock);
        if (!ctx->ws && !(ctx->ws = calloc(1, sizeof *ctx->ws))) {
            kernel_error(ctx, OPJIT_ENOMEM, "out of memory for the workspace");
            return NULL;
        }
        ctx->ws->used = 0;
        ctx->ws->want = 0;
    }
    workspace *ws = ctx->ws;
    if (ws->want > SIZE_MAX / 4 - bytes) {
        kernel_error(ctx, OPJIT_ENOMEM, "opjit_workspace: out of memory: too much workspace in one call");
        return NULL;
    }
    ws->want += bytes;
    if (ws->cap - ws->used >= bytes) {
        void *p = ws->base + ws->used;
        ws->used += bytes;
        return p;
    }
    /* Does not fit: a chunk for this call only; the arena grows to the
     * whole demand when the call ends, so the next call fits. */
    size_t size = sizeof(struct overflow) + 64 + bytes;
    struct overflow *o = rt_alloc(rt, size);
    if (!o) {
        kernel_error(ctx, OPJIT_ENOMEM, "out of memory allocating %zu bytes of workspace", bytes);
        return NULL;
    }
    o->size = size;
    o->next = ws->overflow;
    ws->overflow = o;
    return (void *)(((uintptr_t)(o + 1) + 63) & ~(uintptr_t)63);
}

static void workspace_release(opjit_runtime *rt, workspace *ws)
{
    if (ws->overflow) {
        while (ws->overflow) {
            struct overflow *o = ws->overflow;
            ws->overflow = o->next;
            rt_free(rt, o, o->size);
        }
        if (ws->mem)
            rt_free(rt, ws->mem, ws->cap + 64);
        ws->base = ws->mem = NULL;
        ws->cap = 0;
        /* Regions are multiples of 64 bytes from a 64-byte aligned base: a
         * cache line each (the allocator gives 16; AMX tile rows and AVX-512
         * loads that straddle two lines ran at half speed). */
        ws->mem = rt_alloc(rt, ws->want + 64);
        if (ws->mem) {
            ws->base = (char *)(((uintptr_t)ws->mem + 63) & ~(uintptr_t)63);
            ws->cap = ws->want;
        }
    }
    ws->used = 0;
    pthread_mutex_lock(&rt->lock);
    ws->next = rt->free_ws;
    rt->free_ws = ws;
    pthread_mutex_unlock(&rt->lock);
}

void workspace_free_all(opjit_runtime *rt)
{
    while (rt->free_ws) {
        workspace *ws = rt->free_ws;
        rt->free_ws = ws->next;
        if (ws->mem)
            rt_free(rt, ws->mem, ws->cap + 64);
        free(ws);
    }
}

/* ---- errors from kernels --------------------------------------------------- */

static int api_fail(opjit_ctx *ctx, const char *fmt, ...)
{
    if (!ctx)
        return OPJIT_EKERNEL;
    va_list cap;
    va_start(cap, fmt);
    int in_chunk = pool_chunk_vfail(ctx, fmt, cap); /* the loop reports it */
    va_end(cap);
    if (in_chunk)
        return OPJIT_EKERNEL;
    if (!ctx->status) {
        char msg[2048];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt ? fmt : "(no message)", ap);
        va_end(ap);
        ctx->status = rt_error(ctx->rt, OPJIT_EKERNEL, "%s: %s", ctx->k->sch->name, msg);
    }
    return ctx->status;
}

static int api_device_id(opjit_ctx *ctx) { return ctx ? ctx->device_id : -1; }

static int api_env_flag(const char *name, int dflt) { return settings_op_flag(name, dflt); }

static int api_half_kernel(opjit_ctx *ctx)
{
    const char *bad;
    int k = settings_half_kernel(&bad);
    if (k < 0)
        return api_fail(ctx, "OPJIT_HALF_KERNEL is '%s': expected auto, amx, dot, wide or nothing",
                        bad), -1;
    return k;
}

static void *api_blas(opjit_ctx *ctx, const char *name)
{
    const char *why;
    void *f = pool_blas_symbol(name, &why);
    if (!f)
        api_fail(ctx, "BLAS function %s: %s", name ? name : "(null)", why);
    return f;
}

const opjit_api runtime_api = {
    .abi_version = OPJIT_ABI_VERSION,
    .size = sizeof(opjit_api),
    .def = dispatch_def,
    .require = dispatch_require,
    .output = api_output,
    .workspace = api_workspace,
    .fail = api_fail,
    .device_id = api_device_id,
    .launch = cuda_api_launch,
    .memcpy_dev = cuda_api_memcpy,
    .device_workspace = cuda_api_device_workspace,
    .stream = cuda_api_stream,
    .synchronize = cuda_api_synchronize,
    .env_flag = api_env_flag,
    .half_kernel = api_half_kernel,
    .blas = api_blas,
    .parallel_for = api_parallel_for,
    .num_threads = api_num_threads,
    .thread_num = api_thread_num,
    .derivative = decl_derivative,
    .not_differentiable = decl_not_differentiable,
    .shape = decl_shape,
    .output_shape = decl_output_shape,
    .output_dynamic = decl_output_dynamic,
};

/* ---- the call --------------------------------------------------------------- */

static const char *kind_name(int kind)
{
    switch (kind) {
    case OPJIT_KIND_NONE: return "None";
    case OPJIT_KIND_TENSOR: return "Tensor";
    case OPJIT_KIND_INT: return "int";
    case OPJIT_KIND_FLOAT: return "float";
    case OPJIT_KIND_BOOL: return "bool";
    case OPJIT_KIND_INTS: return "int list";
    case OPJIT_KIND_STR: return "str";
    }
    return "unknown kind";
}



/* The device's name in capitals ("CUDA"), for messages, in buf. */
static const char *device_upper(int device, char *buf, size_t n)
{
    const char *dn = opjit_device_name(device);
    size_t i = 0;
    for (; dn[i] && i < n - 1; i++)
        buf[i] = (char)(dn[i] >= 'a' && dn[i] <= 'z' ? dn[i] - 32 : dn[i]);
    buf[i] = '\0';
    return buf;
}
/* Row-major dense. An empty tensor is, whatever its strides: it has no
 * element to misplace (numpy and torch give empty arrays strides of 0). */
static int is_contiguous(const DLTensor *t)
{
    if (!t->strides)
        return 1;
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] == 0)
            return 1;
    int64_t expect = 1;
    for (int i = t->ndim - 1; i >= 0; i--) {
        if (t->shape[i] != 1 && t->strides[i] != expect)
            return 0;
        expect *= t->shape[i];
    }
    return 1;
}

static int no_kernel(opjit_runtime *rt, const opjit_op *op, int device)
{
    char loaded[1024] = "";
    size_t n = 0;
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++) {
        const kernel *k = atomic_load(&op->kernels[d]);
        if (k)
            n += (size_t)snprintf(loaded + n, n < sizeof loaded ? sizeof loaded - n : 0,
                                  "%s%s from %s", n ? ", " : "", opjit_device_name(d),
                                  k->mod->source);
    }
    char upper[16];
    return rt_error(rt, OPJIT_ENOKERNEL, "%s has no %s kernel; loaded: %s", op->name,
                    device_upper(device, upper, sizeof upper), n ? loaded : "nothing");
}

static const char *dl_device_name(int dl_type)
{
    switch (dl_type) {
    case kDLCPU: return "cpu";
    case kDLCUDA: return "cuda";
    case kDLCUDAHost: return "cuda_host";
    case kDLCUDAManaged: return "cuda_managed";
    case kDLROCM: return "rocm";
    case kDLVulkan: return "vulkan";
    case kDLMetal: return "metal";
    case kDLOpenCL: return "opencl";
    }
    return "unknown-device";
}

/* Argument i's name for messages, from the op's current schema. */
static const char *arg_name(const opjit_op *op, int i)
{
    const schema *s = atomic_load_explicit(&op->sch, memory_order_acquire);
    return i < s->nargs ? s->args[i].name : "?";
}

/* A tensor a kernel can trust: shape present, sizes sane, data present
 * (unless need_data is 0: a shape rule reads no data). */
static int check_dltensor(opjit_runtime *rt, const opjit_op *op, int i, const DLTensor *t,
                          int need_data)
{
    if (!t)
        return rt_error(rt, OPJIT_ECALL, "%s: argument '%s' is a NULL tensor", op->name,
                        arg_name(op, i));
    if (t->ndim < 0 || t->ndim > 64 || (t->ndim > 0 && !t->shape))
        return rt_error(rt, OPJIT_ECALL, "%s: argument '%s' is a malformed tensor (ndim %d, shape %s)",
                        op->name, arg_name(op, i), t->ndim, t->shape ? "set" : "NULL");
    int64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0)
            return rt_error(rt, OPJIT_ECALL, "%s: argument '%s' has a negative size %lld in dim %d",
                            op->name, arg_name(op, i), (long long)t->shape[d], d);
        if (__builtin_mul_overflow(numel, t->shape[d], &numel)) /* no division on the hot path */
            numel = INT64_MAX;
    }
    if (numel > 0 && !t->data && need_data)
        return rt_error(rt, OPJIT_ECALL, "%s: argument '%s' has %lld elements but no data",
                        op->name, arg_name(op, i), (long long)numel);
    return OPJIT_OK;
}

static int check_tensor(opjit_runtime *rt, const kernel *k, const arg_check *c,
                        const DLTensor *t)
{
    const schema_arg *a = &k->sch->args[c->arg];
    char b1[64], b2[64];
    if (c->ndtypes) {
        int ok = 0;
        for (int j = 0; j < c->ndtypes && !ok; j++)
            ok = t->dtype.code == c->dtypes[j].code && t->dtype.bits == c->dtypes[j].bits &&
                 t->dtype.lanes == 1;
        if (!ok) {
            char want[256] = "";
            size_t n = 0;
            for (int j = 0; j < c->ndtypes; j++)
                n += (size_t)snprintf(want + n, sizeof want - n, "%s%s", j ? " or " : "",
                                      dtype_name(c->dtypes[j], b1, sizeof b1));
            return rt_error(rt, OPJIT_ECALL, "%s: argument '%s': expected dtype %s, got %s",
                            k->sch->name, a->name, want, dtype_name(t->dtype, b2, sizeof b2));
        }
    }
    if (c->rank >= 0 && t->ndim != c->rank)
        return rt_error(rt, OPJIT_ECALL, "%s: argument '%s': expected a %d-d tensor, got %d-d",
                        k->sch->name, a->name, c->rank, t->ndim);
    if (c->contiguous && !is_contiguous(t))
        return rt_error(rt, OPJIT_ECALL,
                        "%s: argument '%s': expected a contiguous tensor, got strides that "
                        "are not row-major",
                        k->sch->name, a->name);
    return OPJIT_OK;
}

/* The device of a call: that of its tensor arguments, which must be well
 * formed and agree (the CPU when there is none). *first: the first tensor
 * argument, or NULL. */
static int call_device(opjit_runtime *rt, const opjit_op *op, const opjit_value *args, int nargs,
                       int need_data, int *device, const DLTensor **first)
{
    *first = NULL;
    for (int i = 0; i < nargs; i++) {
        if (args[i].kind != OPJIT_KIND_TENSOR)
            continue;
        const DLTensor *t = args[i].u.tensor;
        int rc = check_dltensor(rt, op, i, t, need_data);
        if (rc)
            return rc;
        const DLTensor *f = *first;
        if (!f)
            *first = t;
        else if (t->device.device_type != f->device.device_type ||
                 t->device.device_id != f->device.device_id)
            return rt_error(rt, OPJIT_ECALL,
                            "%s: argument '%s' is on %s:%d but earlier tensors are on %s:%d; "
                            "tensors of one call must share a device",
                            op->name, arg_name(op, i), dl_device_name(t->device.device_type),
                            t->device.device_id, dl_device_name(f->device.device_type),
                            f->device.device_id);
    }
    *device = *first ? device_of_dl((*first)->device.device_type) : OPJIT_CPU;
    if (*device < 0)
        return rt_error(rt, OPJIT_ECALL, "%s: tensors are on DLPack device type %d, which opjit "
                        "does not support", op->name, (*first)->device.device_type);
    return OPJIT_OK;
}

/* Bind schema argument a to in (NULL: not given) into *v: given,
 * defaulted, or None. An int given for an int[N] fills expanded. */
static int bind_arg(opjit_runtime *rt, const opjit_op *op, const schema_arg *a,
                    const opjit_value *in, opjit_value *v, int64_t *expanded)
{
    if (!in || in->kind == OPJIT_KIND_NONE) {
        if (a->has_default)
            *v = a->def;
        else if (a->optional)
            *v = (opjit_value){.kind = OPJIT_KIND_NONE};
        else
            return rt_error(rt, OPJIT_ECALL, "%s: missing argument '%s' (%s)", op->name,
                            a->name, a->type);
        return OPJIT_OK;
    }
    *v = *in;
    int ok = in->kind == a->kind;
    if (a->kind == OPJIT_KIND_FLOAT && in->kind == OPJIT_KIND_INT) {
        v->kind = OPJIT_KIND_FLOAT; /* an int is a fine float, as in Python */
        v->u.f = (double)in->u.i;
        ok = 1;
    } else if (a->kind == OPJIT_KIND_INTS && in->kind == OPJIT_KIND_INT) {
        for (int j = 0; j < a->list_len; j++)
            expanded[j] = in->u.i;
        *v = (opjit_value){.kind = OPJIT_KIND_INTS, .len = a->list_len, .u.ints = expanded};
        ok = 1;
    } else if (ok && a->kind == OPJIT_KIND_INTS && (in->len != a->list_len || !in->u.ints)) {
        return rt_error(rt, OPJIT_ECALL, "%s: argument '%s': expected %s, got a list of %d",
                        op->name, a->name, a->type, in->len);
    } else if (ok && a->kind == OPJIT_KIND_STR && !in->u.str) {
        return rt_error(rt, OPJIT_ECALL, "%s: argument '%s': a str with a NULL pointer",
                        op->name, a->name);
    }
    if (!ok)
        return rt_error(rt, OPJIT_ECALL, "%s: argument '%s': expected %s, got %s", op->name,
                        a->name, a->type, kind_name(in->kind));
    return OPJIT_OK;
}

/* Bind every argument of k's schema into v (expanded: room for int
 * lists made from one int), then check the tensors as opjit_require
 * asked. */
static int bind_args(opjit_runtime *rt, const opjit_op *op, const kernel *k,
                     const opjit_value *args, int nargs, opjit_value *v,
                     int64_t (*expanded)[OPJIT_MAX_LIST])
{
    for (int i = 0; i < k->sch->nargs; i++) {
        int rc = bind_arg(rt, op, &k->sch->args[i], i < nargs ? &args[i] : NULL, &v[i],
                          expanded[i]);
        if (rc)
            return rc;
    }
    for (int j = 0; j < k->nchecks; j++) {
        const opjit_value *t = &v[k->checks[j].arg];
        if (t->kind == OPJIT_KIND_TENSOR) {
            int rc = check_tensor(rt, k, &k->checks[j], t->u.tensor);
            if (rc)
                return rc;
        }
    }
    return OPJIT_OK;
}

/* After the kernel returned rc: the call's status, with a message when
 * the kernel failed without one or left an output unmade. */
static int kernel_status(opjit_ctx *ctx, const opjit_op *op, int rc)
{
    opjit_runtime *rt = ctx->rt;
    if (rc && !ctx->status)
        ctx->status = rt_error(rt, OPJIT_EKERNEL, "%s: the kernel failed (returned %d) without "
                               "a message", op->name, rc);
    if (!rc && !ctx->status) {
        for (int i = 0; i < ctx->k->sch->nouts; i++)
            if (!ctx->outs[i]) {
                ctx->status = rt_error(rt, OPJIT_EKERNEL, "%s: the kernel returned without "
                                       "producing output %d", op->name, i);
                break;
            }
    }
    return ctx->status;
}

/* Run k on the bound arguments v with a fresh call context. On success
 * its outputs go to outs; on failure they are freed. */
static int run_kernel(opjit_runtime *rt, const opjit_op *op, const kernel *k, int device,
                      int device_id, opjit_value *v, DLManagedTensor **outs)
{
    const schema *s = k->sch;
    /* Set field by field: zeroing the whole struct (outs[] for the most
     * outputs any op may have) shows in the 50 ns budget. */
    opjit_ctx ctx;
    ctx.rt = rt;
    ctx.k = k;
    ctx.device = device;
    ctx.device_id = device_id;
    ctx.status = 0;
    ctx.ws = NULL;
    ctx.cdev = NULL;
    ctx.cmod = NULL;
    ctx.dws = NULL;
    ctx.pushed = 0;
    ctx.htod_pending = 0;
    ctx.shapes = NULL;
    for (int i = 0; i < s->nouts; i++)
        ctx.outs[i] = NULL;
    opjit_args kargs = {s->nargs, v};
    const device_ops *dev = devices[device];
    int rc;
    if (dev->call_begin && (rc = dev->call_begin(&ctx)))
        return rc;
    rc = k->fn(&ctx, &kargs);
    /* Which code served the call, for verbose hosts; one branch otherwise
     * (rt_log formats nothing below the host's verbosity). */
    rt_log(rt, OPJIT_LOG_DEBUG, "%s: %s kernel, %s tier, from %s%s", op->name,
           opjit_device_name(device), k->mod->tier, k->mod->source, rc ? " (failed)" : "");
    kernel_status(&ctx, op, rc);
    /* The device first: it waits for copies that still read the host
     * workspace (CUDA). */
    if (dev->call_end)
        dev->call_end(&ctx);
    if (ctx.ws)
        workspace_release(rt, ctx.ws);
    if (ctx.status) {
        for (int i = 0; i < s->nouts; i++)
            if (ctx.outs[i])
                ctx.outs[i]->deleter(ctx.outs[i]);
        return ctx.status;
    }
    for (int i = 0; i < s->nouts; i++)
        outs[i] = ctx.outs[i];
    return OPJIT_OK;
}

/* The call, between reclaim_enter and reclaim_exit: the kernel it picks
 * stays loaded until it returns. */
static int call_entered(opjit_runtime *rt, const opjit_op *op, const opjit_value *args,
                        int nargs, DLManagedTensor **outs, int nouts)
{
    call_bound b;
    int rc = call_bind(rt, op, args, nargs, 1, &b);
    if (rc)
        return rc;
    if (nouts < b.k->sch->nouts)
        return rt_error(rt, OPJIT_ECALL, "%s returns %d outputs; room was given for %d",
                        op->name, b.k->sch->nouts, nouts);
    return run_kernel(rt, op, b.k, b.device, b.device_id, b.v, outs);
}

/* Call it between reclaim_enter and reclaim_exit: b->k stays loaded
 * until then. */
int call_bind(opjit_runtime *rt, const opjit_op *op, const opjit_value *args, int nargs,
              int need_data, call_bound *b)
{
    const DLTensor *first;
    int rc = call_device(rt, op, args, nargs, need_data, &b->device, &first);
    if (rc)
        return rc;
    b->device_id = first ? first->device.device_id : 0;
    /* Sequentially consistent, after reclaim_enter's store (a plain load
     * on x86): see runtime/reclaim.c. */
    b->k = atomic_load(&op->kernels[b->device]);
    if (!b->k)
        return no_kernel(rt, op, b->device);
    /* From here on only the kernel's own schema counts: a reload may have
     * changed the op's since this call began. */
    if (nargs > b->k->sch->nargs)
        return rt_error(rt, OPJIT_ECALL, "%s takes at most %d arguments, got %d", op->name,
                        b->k->sch->nargs, nargs);
    return bind_args(rt, op, b->k, args, nargs, b->v, b->expanded);
}

int opjit_call(opjit_runtime *rt, const opjit_op *op, const opjit_value *args, int nargs,
               DLManagedTensor **outs, int nouts)
{
    if (!rt || !op || nargs < 0 || (nargs && !args) || nouts < 0 || (nouts && !outs))
        return rt_error(rt, OPJIT_EINVAL, "opjit_call: bad arguments");
    reclaim_enter();
    int rc = call_entered(rt, op, args, nargs, outs, nouts);
    reclaim_exit();
    return rc;
}

/* ---- copies between devices ------------------------------------------------- */

/* Whether src can be copied to device:device_id (the tensor dense,
 * row-major, of whole bytes, its data present): *from, the device it is
 * on, and *bytes, its size. fn names the caller in messages. */
static int copy_check(opjit_runtime *rt, const char *fn, const DLTensor *src, int device,
                      int device_id, int *from, size_t *bytes)
{
    const device_ops *to = device >= 0 && device < OPJIT_DEVICE_COUNT ? devices[device] : NULL;
    if (!to)
        return rt_error(rt, OPJIT_EINVAL, "%s: bad device %d (OPJIT_CPU or OPJIT_CUDA)", fn,
                        device);
    if (device_id < 0 || device_id > to->max_id)
        return rt_error(rt, OPJIT_EINVAL, "%s: bad device id %d for %s", fn, device_id,
                        opjit_device_name(device));
    *from = device_of_dl(src->device.device_type);
    if (*from < 0)
        return rt_error(rt, OPJIT_EINVAL, "%s: the tensor is on %s (DLPack device type %d), "
                        "which opjit does not support", fn,
                        dl_device_name(src->device.device_type), src->device.device_type);
    if (src->ndim < 0 || src->ndim > 64 || (src->ndim > 0 && !src->shape))
        return rt_error(rt, OPJIT_EINVAL, "%s: malformed tensor (ndim %d, shape %s)", fn,
                        src->ndim, src->shape ? "set" : "NULL");
    DLDataType dt = src->dtype;
    if (dt.bits == 0 || dt.bits % 8 || dt.lanes == 0)
        return rt_error(rt, OPJIT_EINVAL, "%s: dtype of %d bits x %d lanes: only whole bytes "
                        "can be copied", fn, dt.bits, dt.lanes);
    int bad = dense_bytes(src->ndim, src->shape, (size_t)dt.bits / 8 * dt.lanes, bytes);
    if (bad > 0)
        return rt_error(rt, OPJIT_EINVAL, "%s: bad size %lld in dim %d", fn,
                        (long long)src->shape[bad - 1], bad - 1);
    if (bad < 0)
        return rt_error(rt, OPJIT_EINVAL, "%s: the tensor is too large", fn);
    if (*bytes && !is_contiguous(src))
        return rt_error(rt, OPJIT_EINVAL, "%s: the tensor is not contiguous (its strides are "
                        "not row-major); only contiguous tensors can be copied", fn);
    if (*bytes && !src->data)
        return rt_error(rt, OPJIT_EINVAL, "%s: the tensor has %zu bytes but no data", fn, *bytes);
    return OPJIT_OK;
}

/* One end of a copy: the device, its id, its data; dev: its handle, when
 * entered. */
typedef struct copy_end {
    const device_ops *ops;
    int id;
    void *dev;
} copy_end;

/* From a device whose memory is not the host's to dst on the host, or
 * through the host to dst on another device (to entered). On failure the
 * status, with err. */
static int copy_through_host(opjit_runtime *rt, const copy_end *from, const void *src,
                             const copy_end *to, void *dst, size_t bytes, char *err,
                             size_t errlen)
{
    char why[1024], name[16];
    void *host = to->ops->host_memory ? dst : rt_alloc(rt, bytes);
    void *from_dev = NULL;
    int rc;
    if (!host) {
        rc = OPJIT_ENOMEM;
        snprintf(err, errlen, "out of memory allocating %zu bytes", bytes);
    } else if ((rc = from->ops->enter(rt, from->id, &from_dev, why, sizeof why))) {
        snprintf(err, errlen, "cannot copy from %s device %d: %s",
                 device_upper(device_of_dl(from->ops->dl_type), name, sizeof name), from->id,
                 why);
    } else {
        rc = from->ops->copy(from_dev, host, src, bytes, OPJIT_COPY_DTOH, err, errlen);
        from->ops->leave(from_dev);
        if (!rc && !to->ops->host_memory)
            rc = to->ops->copy(to->dev, dst, host, bytes, OPJIT_COPY_HTOD, err, errlen);
    }
    if (host && host != dst)
        rt_free(rt, host, bytes);
    return rc;
}

/* Copy bytes from src on from to dst on to (entered). On failure the
 * status, with err. */
static int copy_data(opjit_runtime *rt, const copy_end *from, const void *src,
                     const copy_end *to, void *dst, size_t bytes, char *err, size_t errlen)
{
    if (!bytes)
        return OPJIT_OK;
    if (from->ops->host_memory && to->ops->host_memory) {
        memcpy(dst, src, bytes);
        return OPJIT_OK;
    }
    if (from->ops->host_memory)
        return to->ops->copy(to->dev, dst, src, bytes, OPJIT_COPY_HTOD, err, errlen);
    if (from->ops == to->ops && from->id == to->id)
        return to->ops->copy(to->dev, dst, src, bytes, OPJIT_COPY_DTOD, err, errlen);
    return copy_through_host(rt, from, src, to, dst, bytes, err, errlen);
}

int opjit_tensor_to_device(opjit_runtime *rt, const DLTensor *src, int device, int device_id,
                           DLManagedTensor **out)
{
    static const char fn[] = "opjit_tensor_to_device";
    if (out)
        *out = NULL;
    if (!rt || !src || !out)
        return rt_error(rt, OPJIT_EINVAL, "%s: NULL %s", fn,
                        !rt ? "runtime" : !src ? "tensor" : "out");
    int from_device = -1;
    size_t bytes = 0;
    int rc = copy_check(rt, fn, src, device, device_id, &from_device, &bytes);
    if (rc)
        return rc;
    const char *from_data = (const char *)src->data + src->byte_offset;
    copy_end from = {devices[from_device], src->device.device_id, NULL};
    copy_end to = {devices[device], device_id, NULL};

    /* The destination stays entered until the end; a source on another
     * device is entered on top of it for its part of the copy. */
    char why[1024], err[1536] = "", name[16];
    if (to.ops->enter && (rc = to.ops->enter(rt, device_id, &to.dev, why, sizeof why)))
        return rt_error(rt, rc, "%s: cannot copy to %s device %d: %s", fn,
                        device_upper(device, name, sizeof name), device_id, why);
    DLManagedTensor *mt = NULL;
    rc = out_block_new(rt, to.ops, device_id, to.dev, src->dtype, src->ndim, src->shape, bytes,
                       &mt, err, sizeof err);
    if (!rc)
        rc = copy_data(rt, &from, from_data, &to, mt->dl_tensor.data, bytes, err, sizeof err);
    if (to.ops->leave)
        to.ops->leave(to.dev);
    if (rc) {
        if (mt)
            mt->deleter(mt);
        return rt_error(rt, rc, "%s: %s", fn, err);
    }
    *out = mt;
    return OPJIT_OK;
}
