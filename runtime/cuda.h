/*
 * runtime/cuda.h - CUDA through the Driver API (runtime/cuda.c); private to
 * runtime/ and loader/.
 *
 * libcuda.so.1 is dlopened on the first CUDA call (or when the loader asks
 * whether CUDA is usable), never at link time, so a machine without a
 * driver runs every CPU op. $OPJIT_CUDA_DRIVER names another library to
 * use instead (tests use a fake driver; runtime/settings.h). The device's
 * instance of runtime/device.h is device_cuda, at the end of cuda.c. Nothing here knows compilers: a .cu module's
 * device code arrives as images (cubin or PTX per architecture) that the
 * loader read from the cache.
 *
 * Per runtime and device: a context (the device's primary context,
 * retained on first use, or the host's from opjit_set_cuda_stream), the
 * stream calls run on, and a pool of device workspaces. Per module and
 * context: the CUmodule loaded from the image that suits the device, and
 * its kernels by name.
 */
#ifndef OPJIT_RUNTIME_CUDA_H
#define OPJIT_RUNTIME_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/device.h"
#include "runtime/runtime.h"

#define CUDA_MAX_DEVICES 64

/* ---- device code of a module ----------------------------------------------- */

typedef struct cuda_module cuda_module;

/* An empty set of images for the module of source (for messages). */
cuda_module *cuda_module_new(const char *source);
/* Add the image for arch ("sm_90": a cubin, "compute_90": PTX text);
 * producer says what made it ("NVRTC 13.0"), for messages. data
 * (malloc'd, room for size + 1 bytes: a NUL is put after them) is the
 * module's from OPJIT_OK on, not copied; on failure it stays the
 * caller's. OPJIT_EINVAL for a bad arch, OPJIT_ENOMEM. */
int cuda_module_take_image(cuda_module *cm, const char *arch, unsigned char *data, size_t size,
                           const char *producer);
/* The cubin of arch ("sm_90"; not PTX, which must end in a NUL) mapped
 * from the file at path, read only: no copy, and no page of it read
 * before the driver loads it. The file must not be truncated while the
 * module lives (a cache entry is replaced by rename, never rewritten).
 * OPJIT_EIO when it cannot be mapped (then read it and take_image). */
int cuda_module_map_image(cuda_module *cm, const char *arch, const char *path,
                          const char *producer);
/* The architectures held, comma-separated, into buf. */
const char *cuda_module_archs(const cuda_module *cm, char *buf, size_t n);
/* Unload from every context it was loaded into, and free. NULL is fine. */
void cuda_module_free(cuda_module *cm);

/* ---- the machine ------------------------------------------------------------- */

/* Load the driver and initialise it (once per process). OPJIT_OK when at
 * least one device exists; else OPJIT_EDEVICE with why: "no libcuda.so.1:
 * ...", "no CUDA device ...". */
int cuda_available(char *why, size_t n);
/* 0 when dlopen("libcuda.so.1") cannot find the driver: no
 * ld_library_path, no "libcuda.so.1" in the ld.so cache at ld_cache, and
 * none in dirs (NULL-terminated); else 1. Without the driver, glibc looks
 * for it in some 90 places (each system directory's hwcaps and tls
 * subdirectories): 120 us of every process that loads a .cu op or names
 * an op that has one, on every machine without a GPU. Where the driver is
 * installed, its installer and the container toolkits register it in the
 * cache. (cuda.c; the driver's directories are its callers'.) */
int cuda_driver_findable(const char *ld_library_path, const char *ld_cache,
                         const char *const *dirs);
/* Compute capabilities (major * 10 + minor) of the devices, up to max;
 * returns how many (0 without CUDA). */
int cuda_device_archs(int *cc, int max);

/* ---- per runtime -------------------------------------------------------------- */

typedef struct cuda_rt cuda_rt;
cuda_rt *cuda_rt_new(void);
/* After every module is freed: give back workspaces and contexts. */
void cuda_rt_free(cuda_rt *c);

/* ---- calls ----------------------------------------------------------------------- */

/* Before a CUDA kernel runs: driver, device, context made current, the
 * module's device code loaded. On failure the message is set on the
 * runtime (OPJIT_EDEVICE for a missing driver, device or suitable image). */
int cuda_call_begin(opjit_ctx *ctx);
/* After it: workspaces back to the pool, the context popped. */
void cuda_call_end(opjit_ctx *ctx);

/* A device's context and stream in a runtime (runtime/cuda.c). */
typedef struct cuda_dev cuda_dev;

/* Device memory of an output (runtime/device.h): freed with cuda_mem_free,
 * which may run on any thread, after the runtime is gone. */
typedef device_mem cuda_mem;
/* bytes of memory (at least 1 allocated) on CUDA device id, in d's context,
 * which is current: from the device's output pool, in the order of d's
 * stream, where the driver has memory pools; else cuMemAlloc. On failure
 * the status, with why in err. */
int cuda_mem_alloc(cuda_dev *d, int id, size_t bytes, cuda_mem *out, char *err, size_t errlen);
void cuda_mem_free(const cuda_mem *m);

/* ---- outside a call (opjit_tensor_to_device) -------------------------------------- */

/* Driver, device id, its context (the host's from opjit_set_cuda_stream,
 * else the primary one) made current on this thread. On failure nothing is
 * current, and the status (OPJIT_EDEVICE: no driver, no such device) and
 * why ("no libcuda.so.1: ...", "no CUDA device ...") say what is missing. */
int cuda_enter(opjit_runtime *rt, int id, cuda_dev **d, char *why, size_t n);
/* Pop what cuda_enter pushed. NULL is fine. */
void cuda_leave(cuda_dev *d);
/* Copy bytes (kind: OPJIT_COPY_*) on d's stream, d's context current, and
 * wait until it is done. On failure OPJIT_EDEVICE (or OPJIT_ENOMEM) with
 * err. */
int cuda_copy(cuda_dev *d, void *dst, const void *src, size_t bytes, int kind, char *err,
              size_t errlen);

/* The CUDA entries of the api table. */
int cuda_api_launch(opjit_ctx *ctx, const char *kernel, const unsigned grid[3],
                    const unsigned block[3], unsigned shared_bytes, void **params);
int cuda_api_memcpy(opjit_ctx *ctx, void *dst, const void *src, size_t bytes, int kind);
void *cuda_api_device_workspace(opjit_ctx *ctx, size_t bytes);
void *cuda_api_stream(opjit_ctx *ctx);
int cuda_api_synchronize(opjit_ctx *ctx);

#endif
