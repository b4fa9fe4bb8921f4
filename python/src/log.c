/*
 * python/src/log.c - the runtime's messages (warnings above all: a cache
 * that stopped caching, an optimizing compile that failed) reach Python's
 * logging.getLogger("opjit"), as the CLI prints them on stderr.
 *
 * The runtime calls its log callback from whatever thread logs: the host
 * thread inside a load (which released the GIL), the optimizing tier's
 * worker, the watcher; sometimes with a lock of the library held. So the
 * callback never touches Python: it queues the message under a mutex of
 * its own and asks the interpreter to deliver the queue (Py_AddPendingCall,
 * which needs neither the GIL nor a thread state). The thread that made a
 * load also delivers the queue as soon as it has the GIL back, so a load's
 * warnings are logged before the load returns; what library threads log
 * arrives at the main thread's next bytecode. No thread ever waits for
 * the GIL while holding a library lock, so this cannot deadlock.
 *
 * The Python side (opjit/_log.py) hands over emit(level, text) and
 * verbosity(); at exit it closes the queue (after the default runtime is
 * gone), delivering what is left: nothing is queued after that.
 */
#include <stdatomic.h>

#include "opjit_py.h"

#define LOG_QUEUE_MAX 1000 /* then messages are counted, not kept */

typedef struct log_msg {
    struct log_msg *next;
    int level;
    size_t len;
    char text[];
} log_msg;

static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;
static log_msg *log_head, *log_tail; /* under log_lock */
static int log_count, log_dropped, log_scheduled, log_closed;
static atomic_int log_pending;       /* log_count, for a flush's fast path */
static PyObject *emit_hook, *verbosity_hook;

static int deliver_pending(void *unused);

void opy_log_callback(void *ud, int level, const char *msg)
{
    (void)ud;
    size_t n = strlen(msg);
    log_msg *m = malloc(sizeof *m + n + 1);
    pthread_mutex_lock(&log_lock);
    if (!m || log_closed || log_count >= LOG_QUEUE_MAX) {
        log_dropped += !log_closed;
        pthread_mutex_unlock(&log_lock);
        free(m);
        return;
    }
    m->next = NULL;
    m->level = level;
    m->len = n;
    memcpy(m->text, msg, n + 1);
    if (log_tail)
        log_tail->next = m;
    else
        log_head = m;
    log_tail = m;
    log_count++;
    atomic_store(&log_pending, log_count);
    /* Under log_lock: never after the queue was closed at exit. */
    if (!log_scheduled)
        log_scheduled = Py_AddPendingCall(deliver_pending, NULL) == 0;
    pthread_mutex_unlock(&log_lock);
}

static void emit(int level, const char *text, size_t len)
{
    PyObject *hook = Py_NewRef(emit_hook); /* it may replace the hooks */
    PyObject *s = PyUnicode_DecodeUTF8(text, (Py_ssize_t)len, "replace");
    PyObject *r = s ? PyObject_CallFunction(hook, "iO", level, s) : NULL;
    if (!r)
        PyErr_WriteUnraisable(hook);
    Py_XDECREF(r);
    Py_XDECREF(s);
    Py_DECREF(hook);
}

void opy_log_flush(void)
{
    if (!atomic_load(&log_pending))
        return;
    pthread_mutex_lock(&log_lock);
    log_msg *m = log_head;
    int dropped = log_dropped;
    log_head = log_tail = NULL;
    log_count = log_dropped = 0;
    atomic_store(&log_pending, 0);
    pthread_mutex_unlock(&log_lock);
    /* A pending exception (a failed call about to raise) waits meanwhile. */
    PyObject *exc = opy_err_take();
    while (m) {
        log_msg *next = m->next;
        if (emit_hook)
            emit(m->level, m->text, m->len);
        free(m);
        m = next;
    }
    if (dropped && emit_hook) {
        char text[128];
        int n = snprintf(text, sizeof text, "%d messages of the opjit runtime were dropped "
                         "(more than %d waited for the interpreter)", dropped, LOG_QUEUE_MAX);
        emit(OPJIT_LOG_WARN, text, (size_t)n);
    }
    if (exc)
        opy_err_restore(exc);
}

static int deliver_pending(void *unused)
{
    (void)unused;
    pthread_mutex_lock(&log_lock);
    log_scheduled = 0;
    pthread_mutex_unlock(&log_lock);
    opy_log_flush();
    return 0;
}

int opy_log_verbosity(void)
{
    if (!verbosity_hook)
        return OPJIT_LOG_WARN;
    PyObject *r = PyObject_CallNoArgs(verbosity_hook);
    long v = r ? PyLong_AsLong(r) : -1;
    Py_XDECREF(r);
    if (v < OPJIT_LOG_ERROR || v > OPJIT_LOG_DEBUG) {
        PyErr_Clear(); /* logging misconfigured: the CLI's default */
        return OPJIT_LOG_WARN;
    }
    return (int)v;
}

/* A fork (os.fork) while a library thread holds log_lock must not leave
 * the child a lock nobody will release. */
static void fork_prepare(void) { pthread_mutex_lock(&log_lock); }
static void fork_release(void) { pthread_mutex_unlock(&log_lock); }

PyObject *opy_set_log_hooks(PyObject *self, PyObject *args)
{
    (void)self;
    static int atfork_done;
    if (!atfork_done && pthread_atfork(fork_prepare, fork_release, fork_release) == 0)
        atfork_done = 1;
    PyObject *e, *v;
    if (!PyArg_ParseTuple(args, "OO:_set_log_hooks", &e, &v))
        return NULL;
    if (!PyCallable_Check(e) || !PyCallable_Check(v))
        return PyErr_Format(PyExc_TypeError, "expected two callables");
    Py_XSETREF(emit_hook, Py_NewRef(e));
    Py_XSETREF(verbosity_hook, Py_NewRef(v));
    Py_RETURN_NONE;
}

PyObject *opy_log_close(PyObject *self, PyObject *unused)
{
    (void)self;
    (void)unused;
    opy_log_flush();
    pthread_mutex_lock(&log_lock);
    log_closed = 1;
    pthread_mutex_unlock(&log_lock);
    opy_log_flush(); /* what came in between */
    Py_RETURN_NONE;
}
