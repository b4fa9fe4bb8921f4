/*
 * python/src/opjit_py.h - private to the extension module opjit._opjit.
 *
 * The module is four translation units sharing this header: module.c (init,
 * exceptions, what is looked up from torch and numpy), runtime.c (the
 * Runtime type), op.c (the Op type and the call path) and tensor.c (DLPack
 * in and out). Names shared between them start with opy_; they are hidden
 * (-fvisibility=hidden), so the module exports PyInit__opjit only.
 */
#ifndef OPJIT_PY_H
#define OPJIT_PY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pthread.h>

#include "opjit_admin.h"

/* Bounds of one call, checked against each op's schema when it is wrapped.
 * The runtime's own limits are lower (32 arguments, 8 outputs, int[8]). */
#define OPY_MAX_ARGS 32
#define OPY_MAX_OUTS 8
#define OPY_MAX_LIST 16
#define OPY_MAX_CUDA_DEVICES 64

/* Where a tensor argument came from; outputs go back to the framework of
 * the first tensor argument. */
typedef enum opy_framework {
    OPY_FW_NONE = 0, /* no tensor argument: numpy if importable */
    OPY_FW_CAPSULE,  /* a raw "dltensor" capsule: capsules out */
    OPY_FW_TORCH,
    OPY_FW_NUMPY,
    OPY_FW_OTHER,    /* another producer: its module's from_dlpack, if any */
} opy_framework;

/* What the module holds for the life of the process (single-phase init:
 * one interpreter). torch and numpy entries are filled the first time an
 * argument is not recognised and the framework is in sys.modules: importing
 * opjit imports neither. */
typedef struct opy_state {
    PyObject *Error, *CompileError, *NotFoundError, *CallError, *KernelError, *DeviceError;
    PyObject *s_dlpack, *s_dlpack_device, *s_from_dlpack, *s_stream;
    PyObject *s_dlpack_kw[4]; /* __dlpack__'s: stream, max_version, dl_device, copy */
    PyTypeObject *torch_tensor;  /* torch.Tensor */
    PyObject *torch_to_dlpack;   /* torch._C._to_dlpack: Tensor -> capsule */
    PyObject *torch_from_dlpack; /* torch._C._from_dlpack: capsule -> Tensor */
    PyObject *torch_stream_hook; /* set by opjit/__init__.py: device -> cudaStream_t int */
    PyObject *signature_hook;    /* set by opjit/_inline.py: Op -> inspect.Signature */
    PyTypeObject *np_ndarray;
    PyTypeObject *np_bool;       /* numpy.bool_: a bool, not an int */
    PyObject *np_from_dlpack;
} opy_state;

extern opy_state opy;
extern PyTypeObject opy_runtime_type, opy_op_type, opy_dlpack_tensor_type, opy_tensor_meta_type;

typedef struct opy_runtime {
    PyObject_HEAD
    opjit_runtime *rt;
    /* Calls on a CUDA device hold this for reading; switching the stream
     * opjit uses (opjit_set_cuda_stream, which must not race with calls)
     * holds it for writing. Always taken with the GIL released. */
    pthread_rwlock_t cuda_lock;
    int cuda_lock_ready;
    int initializing; /* __init__ is making rt (with the GIL released) */
    struct {
        int set;
        void *stream;
    } cuda[OPY_MAX_CUDA_DEVICES]; /* written under cuda_lock for writing */
    /* Loads and calls using rt with the GIL released, and close() asked:
     * close() waits for inflight to reach 0 before it destroys rt. Both
     * change with the GIL held only. */
    int inflight, closing;
} opy_runtime;

typedef struct opy_op {
    PyObject_HEAD
    vectorcallfunc vectorcall;
    opy_runtime *rt;          /* strong reference: the op lives in it */
    opjit_op *op;
    PyObject *name;           /* str */
    /* The schema's argument names (tuple of str), to bind keywords; read
     * again when the op's schema changes (a reload). */
    PyObject *arg_names;
    const char *names_schema; /* the schema text arg_names was read from */
} opy_op;

/* opjit.TensorMeta: a tensor with no data (decls.c). Calls read t with the
 * GIL released, so it is set once, whole, and never changed after. */
typedef struct opy_tensor_meta {
    PyObject_HEAD
    int ready;  /* __init__ has set t */
    DLTensor t; /* data NULL */
    int64_t shape[OPJIT_MAX_DIMS];
    int64_t strides[OPJIT_MAX_DIMS];
} opy_tensor_meta;

/* A tensor argument, borrowed for one call: keep holds what owns it. */
typedef struct opy_borrowed {
    PyObject *keep;     /* a capsule (or NULL) */
    int lent;           /* keep is lent under another name until released */
    DLTensor *tensor;
} opy_borrowed;

/* The pending exception, taken (NULL if none), and put back: the 3.12 API
 * (PyErr_GetRaisedException) on 3.11. */
static inline PyObject *opy_err_take(void)
{
#if PY_VERSION_HEX >= 0x030C0000
    return PyErr_GetRaisedException();
#else
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    if (!type)
        return NULL;
    PyErr_NormalizeException(&type, &value, &tb);
    if (value && tb)
        PyException_SetTraceback(value, tb);
    Py_XDECREF(type);
    Py_XDECREF(tb);
    return value;
#endif
}

static inline void opy_err_restore(PyObject *exc)
{
#if PY_VERSION_HEX >= 0x030C0000
    PyErr_SetRaisedException(exc);
#else
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(exc)), exc, PyException_GetTraceback(exc));
#endif
}

static inline Py_hash_t Py_HashPointer_compat(const void *p)
{
#if PY_VERSION_HEX >= 0x030D0000
    return Py_HashPointer(p);
#else
    return _Py_HashPointer(p);
#endif
}

/* module.c */
PyObject *opy_raise_status(const opjit_runtime *rt, int status);
PyObject *opy_raise(PyObject *cls, int status, const char *fmt, ...);
void opy_refresh_frameworks(void);

/* tensor.c */
opy_framework opy_tensor_kind(PyObject *obj);
int opy_borrow_tensor(PyObject *obj, opy_framework fw, opy_borrowed *out);
void opy_release_tensor(opy_borrowed *b);
PyObject *opy_output(DLManagedTensor *mt, opy_framework fw, PyObject *first_arg);

/* op.c */
PyObject *opy_op_new(opy_runtime *rt, opjit_op *op);

/* decls.c: Op.output_shapes on converted arguments; Op.declarations. */
PyObject *opy_shapes_call(opy_op *o, const opjit_value *args, int nargs);
PyObject *opy_op_declarations(PyObject *self, void *unused);

/* runtime.c: r's runtime for a load or call that releases the GIL (NULL
 * with an exception when r is closed), and the end of that use. u, on the
 * caller's stack, lists the use as its thread's: close() waits for the
 * uses of other threads, and refuses while its own thread has one (Python
 * code run inside a load or call: an __index__, a log handler). */
typedef struct opy_use {
    opy_runtime *r;
    struct opy_use *next;
} opy_use;
opjit_runtime *opy_runtime_enter(opy_runtime *r, opy_use *u);
void opy_runtime_leave(opy_use *u);

/* log.c: the runtime's log callback (any thread, no GIL needed); deliver
 * what it queued to logging (GIL held); the verbosity a new runtime gets
 * from logging.getLogger("opjit"); the hooks of opjit/_log.py. */
void opy_log_callback(void *ud, int level, const char *msg);
void opy_log_flush(void);
int opy_log_verbosity(void);
PyObject *opy_set_log_hooks(PyObject *self, PyObject *args);
PyObject *opy_log_close(PyObject *self, PyObject *unused);

/* inline.c: _load_inline(runtime, name, source, include_dir) -> [Op] */
PyObject *opy_load_inline(PyObject *self, PyObject *args);

#endif /* OPJIT_PY_H */
