/* runtime/device.h - the devices kernels run on, behind one interface:
 * runtime/call.c runs kernels, makes outputs and copies tensors through a
 * device's entry and never asks which device it is. Two instances: the CPU
 * (runtime/device.c: host memory, nothing to set up) and CUDA (runtime/
 * cuda.c, through the Driver API). A new device is one instance and one
 * line of OPJIT_DEVICE_LIST (opjit_op.h). */
#ifndef OPJIT_RUNTIME_DEVICE_H
#define OPJIT_RUNTIME_DEVICE_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/runtime.h"

/* Memory of an output on a device whose memory is not the host's: what
 * its instance needs to free it, on any thread, after the runtime is gone. */
typedef struct device_mem {
    uint64_t ptr;   /* the data's address on the device; 0: none */
    void *cuctx;    /* the instance's own (CUDA: the context, */
    void *stream;   /* the stream it was allocated on, */
    int device;     /* the device id, */
    int primary;    /* a reference on the primary context, */
    int pooled;     /* from the device's output pool) */
    void (*free)(const struct device_mem *m); /* NULL: nothing to free */
} device_mem;

typedef struct device_ops {
    int dl_type;     /* the DLPack device type of its tensors */
    int host_memory; /* its data is host memory: an output's data is in its block, and
                      * copies to or from it are memcpy */
    int max_id;      /* the highest device id it may have (the CPU: 0) */
    /* Around a kernel of this device: made ready (context current, the
     * module's device code loaded) and taken down. NULL: nothing to do.
     * begin sets the runtime's message on failure. */
    int (*call_begin)(opjit_ctx *ctx);
    void (*call_end)(opjit_ctx *ctx);
    /* Outside a call (opjit_tensor_to_device): device id entered on this
     * thread, *dev its handle for mem_alloc and copy, until leave. On
     * failure the status and why. NULL for host memory. */
    int (*enter)(opjit_runtime *rt, int id, void **dev, char *why, size_t n);
    void (*leave)(void *dev);
    /* bytes on device id (dev entered, or the call's ctx->cdev), into *m;
     * on failure the status and err. NULL for host memory. */
    int (*mem_alloc)(void *dev, int id, size_t bytes, device_mem *m, char *err, size_t errlen);
    /* Copy bytes of kind OPJIT_COPY_* (HTOD, DTOH, DTOD) on dev, and wait;
     * on failure the status and err. NULL for host memory. */
    int (*copy)(void *dev, void *dst, const void *src, size_t bytes, int kind, char *err,
                size_t errlen);
} device_ops;

/* The instances, by opjit_device (NULL: none for that device here). */
extern const device_ops device_cpu, device_cuda;
extern const device_ops *const devices[OPJIT_DEVICE_COUNT];

/* The device of DLPack device type dl_type: OPJIT_CPU, ...; -1: none. */
int device_of_dl(int dl_type);

#endif
