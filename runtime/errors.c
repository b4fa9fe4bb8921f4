/* runtime/errors.c - status names, per-thread error messages, logging. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runtime/runtime.h"

static const char *const status_names[] = {
#define X(name, desc) "OPJIT_" #name,
    OPJIT_STATUS_LIST(X)
#undef X
};

static const char *const status_descs[] = {
#define X(name, desc) desc,
    OPJIT_STATUS_LIST(X)
#undef X
};

static const char *const device_names[] = {
#define X(name, str, dl) str,
    OPJIT_DEVICE_LIST(X)
#undef X
};

const char *opjit_status_name(int status)
{
    if (status < 0 || status >= OPJIT_STATUS_COUNT)
        return "OPJIT_?";
    return status_names[status];
}

const char *opjit_errstr(int status)
{
    if (status < 0 || status >= OPJIT_STATUS_COUNT)
        return "unknown status";
    return status_descs[status];
}

const char *opjit_device_name(int device)
{
    if (device < 0 || device >= OPJIT_DEVICE_COUNT)
        return NULL;
    return device_names[device];
}

int opjit_version(void) { return OPJIT_VERSION_NUMBER; }

const char *opjit_version_string(void)
{
#define OPJIT_STR2(x) #x
#define OPJIT_STR(x) OPJIT_STR2(x)
    return OPJIT_STR(OPJIT_VERSION_MAJOR) "." OPJIT_STR(OPJIT_VERSION_MINOR) "." OPJIT_STR(
        OPJIT_VERSION_PATCH);
}

/* One message per thread, tagged with the runtime it belongs to: threads
 * calling ops concurrently never see each other's errors. Its 16 KB are
 * the heap's, taken at the thread's first error and given back when the
 * thread ends: as thread-local storage they would be zeroed for every
 * thread the host starts, whether it ever calls opjit or not (4 pages,
 * faulted in, per thread). Out of memory, the message is cut to what fits
 * in small. */
static _Thread_local struct {
    const opjit_runtime *rt;
    char *msg; /* OPJIT_ERRMSG_SIZE bytes, or NULL */
    char small[128];
} tls_err;

static pthread_key_t err_key; /* frees a thread's msg as it ends */
static pthread_once_t err_key_once = PTHREAD_ONCE_INIT;
static int err_key_made;

/* At the thread's end: a call made after it (another key's destructor)
 * takes a new buffer instead of writing into this one. */
static void err_buf_free(void *msg)
{
    tls_err.msg = NULL;
    free(msg);
}

static void err_key_make(void) { err_key_made = pthread_key_create(&err_key, err_buf_free) == 0; }

/* This thread's message buffer and its size. */
static char *err_buf(size_t *size)
{
    if (!tls_err.msg) {
        pthread_once(&err_key_once, err_key_make);
        char *m = err_key_made ? malloc(OPJIT_ERRMSG_SIZE) : NULL;
        if (m && pthread_setspecific(err_key, m) == 0)
            tls_err.msg = m;
        else
            free(m);
    }
    *size = tls_err.msg ? OPJIT_ERRMSG_SIZE : sizeof tls_err.small;
    return tls_err.msg ? tls_err.msg : tls_err.small;
}

void rt_clear_error(const opjit_runtime *rt)
{
    tls_err.rt = rt;
    tls_err.small[0] = '\0';
    if (tls_err.msg)
        tls_err.msg[0] = '\0';
}

int rt_verror(const opjit_runtime *rt, int status, const char *fmt, va_list ap)
{
    size_t size;
    char *buf = err_buf(&size);
    tls_err.rt = rt;
    vsnprintf(buf, size, fmt, ap);
    return status;
}

int rt_error(const opjit_runtime *rt, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    rt_verror(rt, status, fmt, ap);
    va_end(ap);
    return status;
}

const char *opjit_errmsg(const opjit_runtime *rt)
{
    if (tls_err.rt != rt)
        return "";
    return tls_err.msg ? tls_err.msg : tls_err.small;
}

void rt_log_emit(const opjit_runtime *rt, int level, const char *fmt, ...)
{
    char buf[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    rt->log(rt->log_ud, level, buf);
}

/* ---- errors of a call (runtime/call.c, cuda.c, pool.c) -------------------- */

int call_error(opjit_ctx *ctx, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    char msg[2048];
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (!ctx->status)
        ctx->status = rt_error(ctx->rt, status, "%s: %s", ctx->k->sch->name, msg);
    return ctx->status;
}
