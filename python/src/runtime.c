/*
 * python/src/runtime.c - opjit.Runtime: one opjit_runtime (search path,
 * cache, dispatch table, tiering). Its ops are opjit.Op objects (op.c),
 * which make the calls.
 *
 * Loads release the GIL: compiling never holds other Python threads up.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "opjit_py.h"

/* ---- construction ---------------------------------------------------------------- */

/* ops_path: a str/PathLike, or an iterable of them, into "a:b:c" bytes.
 * The list is copied first: __fspath__ may change it while it is read. */
static PyObject *ops_path_bytes(PyObject *obj)
{
    PyObject *one = NULL;
    if (PyUnicode_Check(obj) || PyBytes_Check(obj) || PyObject_HasAttrString(obj, "__fspath__"))
        return PyUnicode_FSConverter(obj, &one) ? one : NULL;
    PyObject *items = PySequence_Tuple(obj);
    if (!items) {
        if (PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError, "ops_path: expected a path or a list of paths, got %s",
                         Py_TYPE(obj)->tp_name);
        }
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(items);
    PyObject *parts = PyList_New(n);
    for (Py_ssize_t i = 0; parts && i < n; i++) {
        PyObject *b = NULL;
        if (!PyUnicode_FSConverter(PyTuple_GET_ITEM(items, i), &b))
            Py_CLEAR(parts);
        else
            PyList_SET_ITEM(parts, i, b);
    }
    Py_DECREF(items);
    if (!parts)
        return NULL;
    PyObject *sep = PyBytes_FromString(":");
    PyObject *joined = sep ? PyObject_CallMethod(sep, "join", "O", parts) : NULL;
    Py_XDECREF(sep);
    Py_DECREF(parts);
    return joined;
}

/* -1 for None (the environment decides), else 0 or 1. */
static int tristate(PyObject *obj)
{
    return obj == Py_None ? -1 : PyObject_IsTrue(obj);
}

/* The settings Runtime() takes, held: a C caller's kwargs dict may be one
 * that Python code run by __fspath__ or __bool__ empties. */
enum { ARG_OPS_PATH, ARG_CACHE_DIR, ARG_TIERING, ARG_OFFLINE, ARG_ARCHS, ARG_COUNT };

/* cfg from the arguments; *keep holds the bytes cfg points into. */
static int make_config(PyObject *const a[ARG_COUNT], opjit_config *cfg, PyObject *keep[3])
{
    opjit_config_init(cfg, sizeof *cfg);
    if (a[ARG_OPS_PATH] != Py_None && !(keep[0] = ops_path_bytes(a[ARG_OPS_PATH])))
        return -1;
    if (a[ARG_CACHE_DIR] != Py_None && !PyUnicode_FSConverter(a[ARG_CACHE_DIR], &keep[1]))
        return -1;
    if (a[ARG_ARCHS] != Py_None && !PyUnicode_FSConverter(a[ARG_ARCHS], &keep[2]))
        return -1;
    if ((cfg->tiering = tristate(a[ARG_TIERING])) == -1 && PyErr_Occurred())
        return -1;
    if ((cfg->offline = tristate(a[ARG_OFFLINE])) == -1 && PyErr_Occurred())
        return -1;
    cfg->ops_path = keep[0] ? PyBytes_AS_STRING(keep[0]) : NULL;
    cfg->cache_dir = keep[1] ? PyBytes_AS_STRING(keep[1]) : NULL;
    cfg->cuda_archs = keep[2] ? PyBytes_AS_STRING(keep[2]) : NULL;
    return 0;
}

/* A warning (warnings.warn: filters, -W error and pytest see it) for each
 * ops_path directory that is not one: a typo would otherwise only show as
 * "no source for op" later. The library's log line saying the same is
 * left out (_log.py). -1 when a filter made the warning an error. */
static int warn_missing_dirs(const char *path)
{
    char *list = strdup(path), *save = NULL;
    int rc = list ? 0 : (PyErr_NoMemory(), -1);
    for (char *d = list ? strtok_r(list, ":", &save) : NULL; d && !rc;
         d = strtok_r(NULL, ":", &save)) {
        struct stat st;
        if (stat(d, &st) != 0 || !S_ISDIR(st.st_mode))
            rc = PyErr_WarnFormat(PyExc_UserWarning, 1,
                                  "opjit.Runtime: ops_path directory '%s' %s; no operator "
                                  "sources are found there", d,
                                  stat(d, &st) != 0 ? "does not exist" : "is not a directory");
    }
    free(list);
    return rc;
}

/* The runtime is made with the GIL released into a local, and stored with
 * the GIL held; r->initializing turns other threads' __init__ away
 * meanwhile. */
static int runtime_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"ops_path", "cache_dir", "tiering", "offline", "cuda_archs", NULL};
    opy_runtime *r = (opy_runtime *)self;
    PyObject *a[ARG_COUNT] = {Py_None, Py_None, Py_None, Py_None, Py_None};
    if (!PyArg_ParseTupleAndKeywords(args, kw, "|OOO$OO:Runtime", kwlist, &a[ARG_OPS_PATH],
                                     &a[ARG_CACHE_DIR], &a[ARG_TIERING], &a[ARG_OFFLINE],
                                     &a[ARG_ARCHS]))
        return -1;
    if (r->rt || r->initializing) {
        PyErr_SetString(PyExc_RuntimeError, "Runtime.__init__ may run once");
        return -1;
    }
    r->initializing = 1;
    for (int i = 0; i < ARG_COUNT; i++)
        Py_INCREF(a[i]);
    opjit_config cfg;
    PyObject *keep[3] = {NULL, NULL, NULL};
    int rc = make_config(a, &cfg, keep);
    if (rc == 0 && cfg.ops_path)
        rc = warn_missing_dirs(cfg.ops_path);
    if (rc == 0) {
        opjit_runtime *rt = NULL;
        int status;
        cfg.log = opy_log_callback; /* to logging.getLogger("opjit") (log.c) */
        cfg.verbosity = opy_log_verbosity();
        Py_BEGIN_ALLOW_THREADS
        status = opjit_create(&cfg, &rt); /* copies what it keeps of cfg */
        Py_END_ALLOW_THREADS
        opy_log_flush();
        if (status) {
            opy_raise(opy.Error, status, "opjit_create: %s (%s)", opjit_errstr(status),
                      opjit_status_name(status));
            rc = -1;
        }
        r->rt = rt;
    }
    r->initializing = 0;
    for (int i = 0; i < 3; i++)
        Py_XDECREF(keep[i]);
    for (int i = 0; i < ARG_COUNT; i++)
        Py_DECREF(a[i]);
    return rc;
}

static PyObject *runtime_new(PyTypeObject *type, PyObject *args, PyObject *kw)
{
    (void)args;
    (void)kw;
    opy_runtime *r = (opy_runtime *)type->tp_alloc(type, 0);
    if (r && pthread_rwlock_init(&r->cuda_lock, NULL) == 0)
        r->cuda_lock_ready = 1;
    else if (r) {
        Py_DECREF(r);
        return PyErr_NoMemory();
    }
    return (PyObject *)r;
}

static int is_finalizing(void)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_IsFinalizing();
#else
    return _Py_IsFinalizing();
#endif
}

/* Ops hold their runtime, so none is alive here. opjit_destroy lets queued
 * optimizing compiles finish (they fill the cache for the next process). */
static void runtime_dealloc(PyObject *self)
{
    opy_runtime *r = (opy_runtime *)self;
    opjit_runtime *rt = r->rt;
    if (rt) {
        if (is_finalizing()) {
            opjit_destroy(rt);
        } else {
            Py_BEGIN_ALLOW_THREADS
            opjit_destroy(rt);
            Py_END_ALLOW_THREADS
        }
    }
    if (r->cuda_lock_ready)
        pthread_rwlock_destroy(&r->cuda_lock);
    Py_TYPE(self)->tp_free(self);
}

static int ready(opy_runtime *r)
{
    if (r->rt && !r->closing)
        return 0;
    if (r->closing)
        opy_raise(opy.Error, OPJIT_EINVAL, "this opjit.Runtime was closed");
    else
        PyErr_SetString(PyExc_RuntimeError, "this opjit.Runtime was not initialised");
    return -1;
}

/* This thread's uses, innermost first (they nest: a call's __index__ may
 * make another call). */
static _Thread_local opy_use *thread_uses;

opjit_runtime *opy_runtime_enter(opy_runtime *r, opy_use *u)
{
    if (ready(r) < 0)
        return NULL;
    r->inflight++;
    u->r = r;
    u->next = thread_uses;
    thread_uses = u;
    return r->rt;
}

void opy_runtime_leave(opy_use *u)
{
    u->r->inflight--;
    thread_uses = u->next;
}

static int used_by_this_thread(const opy_runtime *r)
{
    for (const opy_use *u = thread_uses; u; u = u->next)
        if (u->r == r)
            return 1;
    return 0;
}

/* Destroy the runtime now: later loads and calls on it (and its ops)
 * raise; what is running on other threads finishes first. */
static PyObject *runtime_close(PyObject *self, PyObject *unused)
{
    (void)unused;
    opy_runtime *r = (opy_runtime *)self;
    if (!r->rt || r->closing)
        Py_RETURN_NONE;
    if (used_by_this_thread(r)) /* it would wait for itself */
        return opy_raise(opy.Error, OPJIT_EINVAL,
                         "close(): this thread is inside a load or call on this opjit.Runtime "
                         "(Python code it runs: an argument's __index__ or __dlpack__, a log "
                         "handler); close it once that has returned");
    r->closing = 1;
    while (r->inflight) { /* they need the GIL to finish */
        Py_BEGIN_ALLOW_THREADS
        usleep(100);
        Py_END_ALLOW_THREADS
    }
    opjit_runtime *rt = r->rt;
    Py_BEGIN_ALLOW_THREADS
    opjit_destroy(rt);
    Py_END_ALLOW_THREADS
    r->rt = NULL;
    opy_log_flush();
    Py_RETURN_NONE;
}

static PyObject *runtime_enter(PyObject *self, PyObject *unused)
{
    (void)unused;
    return ready((opy_runtime *)self) < 0 ? NULL : Py_NewRef(self);
}

static PyObject *runtime_exit(PyObject *self, PyObject *args)
{
    (void)args;
    return runtime_close(self, NULL);
}

static PyObject *runtime_get_closed(PyObject *self, void *unused)
{
    (void)unused;
    return PyBool_FromLong(((opy_runtime *)self)->closing);
}

/* ---- loading and listing ------------------------------------------------------------- */

/* The runtime entered for a call naming spec (a str or path-like, into
 * *b as bytes); NULL with an exception set. */
static opjit_runtime *enter_with_spec(opy_runtime *r, PyObject *spec, PyObject **b,
                                      opy_use *use)
{
    *b = NULL;
    if (ready(r) < 0 || !PyUnicode_FSConverter(spec, b))
        return NULL;
    opjit_runtime *rt = opy_runtime_enter(r, use); /* after __fspath__, which may close r */
    if (!rt)
        Py_CLEAR(*b);
    return rt;
}

static PyObject *runtime_load_op(PyObject *self, PyObject *spec)
{
    opy_runtime *r = (opy_runtime *)self;
    PyObject *b;
    opy_use use;
    opjit_runtime *rt = enter_with_spec(r, spec, &b, &use);
    if (!rt)
        return NULL;
    const char *text = PyBytes_AS_STRING(b);
    opjit_op *op = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = opjit_load_op(rt, text, &op);
    Py_END_ALLOW_THREADS
    Py_DECREF(b);
    opy_log_flush();
    PyObject *res = rc   ? opy_raise_status(r->rt, rc)
                    : op ? opy_op_new(r, op)
                         : opy_raise(opy.NotFoundError, OPJIT_ENOTFOUND,
                                     "%R loaded no op named after its file", spec);
    opy_runtime_leave(&use);
    return res;
}

typedef struct op_list {
    const opjit_op **ops;
    size_t n, cap;
    int oom;
} op_list;

/* opjit_list's callback: collects only (it may run under the runtime's
 * lock, so no Python here). */
static int collect_op(void *ud, const opjit_op *op)
{
    op_list *l = ud;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        const opjit_op **ops = realloc(l->ops, cap * sizeof *ops);
        if (!ops) {
            l->oom = 1;
            return 1;
        }
        l->ops = ops;
        l->cap = cap;
    }
    l->ops[l->n++] = op;
    return 0;
}

static PyObject *runtime_list_ops(PyObject *self, PyObject *unused)
{
    (void)unused;
    opy_runtime *r = (opy_runtime *)self;
    if (ready(r) < 0)
        return NULL;
    op_list l = {0};
    int rc = opjit_list(r->rt, collect_op, &l);
    PyObject *list = NULL;
    if (l.oom)
        PyErr_NoMemory();
    else if (rc)
        opy_raise_status(r->rt, rc);
    else
        list = PyList_New(0);
    for (size_t i = 0; list && i < l.n; i++) {
        PyObject *op = opy_op_new(r, (opjit_op *)l.ops[i]);
        if (!op || PyList_Append(list, op) < 0)
            Py_CLEAR(list);
        Py_XDECREF(op);
    }
    free(l.ops);
    return list;
}

static PyObject *runtime_wait(PyObject *self, PyObject *unused)
{
    (void)unused;
    opy_runtime *r = (opy_runtime *)self;
    opy_use use;
    opjit_runtime *rt = opy_runtime_enter(r, &use);
    if (!rt)
        return NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = opjit_wait(rt);
    Py_END_ALLOW_THREADS
    opy_log_flush();
    PyObject *res = rc ? opy_raise_status(r->rt, rc) : Py_NewRef(Py_None);
    opy_runtime_leave(&use);
    return res;
}

static PyObject *runtime_unload(PyObject *self, PyObject *spec)
{
    opy_runtime *r = (opy_runtime *)self;
    PyObject *b;
    opy_use use;
    opjit_runtime *rt = enter_with_spec(r, spec, &b, &use);
    if (!rt)
        return NULL;
    const char *text = PyBytes_AS_STRING(b);
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = opjit_unload(rt, text);
    Py_END_ALLOW_THREADS
    Py_DECREF(b);
    opy_log_flush();
    PyObject *res = rc ? opy_raise_status(r->rt, rc) : Py_NewRef(Py_None);
    opy_runtime_leave(&use);
    return res;
}

/* ---- the type ------------------------------------------------------------------------------ */

static PyMethodDef runtime_methods[] = {
    {"load_op", runtime_load_op, METH_O,
     "load_op(spec) -> Op: a name on the search path (\"nms\": every source of that name "
     "usable here) or a path (\"ops-src/nms.c\"). Compiles on a cache miss; the GIL is "
     "released meanwhile. Loading an unchanged source again is a no-op, a changed one "
     "reloads it."},
    {"list_ops", runtime_list_ops, METH_NOARGS, "list_ops() -> [Op]: what is loaded, in load order."},
    {"wait", runtime_wait, METH_NOARGS,
     "wait(): until the background optimizing compiles have swapped in."},
    {"unload", runtime_unload, METH_O,
     "unload(spec): take out what was loaded from a source path, or every source of an op."},
    {"close", runtime_close, METH_NOARGS,
     "close(): destroy the runtime now (loads and calls running on other threads finish "
     "first); its ops then raise opjit.Error. Outputs already returned stay valid. Closing "
     "twice is fine. Raises opjit.Error from inside a load or call of this thread on it "
     "(an argument's __index__, a log handler)."},
    {"__enter__", runtime_enter, METH_NOARGS, NULL},
    {"__exit__", runtime_exit, METH_VARARGS, "close() at the end of a with block."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef runtime_getset[] = {
    {"closed", runtime_get_closed, NULL, "whether close() was called", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject opy_runtime_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "opjit.Runtime",
    .tp_doc = "Runtime(ops_path=None, cache_dir=None, tiering=None, *, offline=None, "
              "cuda_archs=None)\n\n"
              "An opjit runtime: its op search path (before $OPJIT_OPS_PATH and the installed "
              "ops), cache directory, the optimizing tier (None: $OPJIT_TIERING, default on), "
              "offline (never compile) and CUDA architectures. None takes opjit's default, "
              "from the environment.\n\n"
              "A context manager: `with opjit.Runtime() as rt:` closes it at the end. Its "
              "messages go to logging.getLogger(\"opjit\"), at the level that logger has when "
              "the runtime is made (WARNING unless configured).",
    .tp_basicsize = sizeof(opy_runtime),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = runtime_new,
    .tp_init = runtime_init,
    .tp_dealloc = runtime_dealloc,
    .tp_methods = runtime_methods,
    .tp_getset = runtime_getset,
};
