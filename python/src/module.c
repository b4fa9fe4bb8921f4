/*
 * python/src/module.c - the extension module opjit._opjit: its init, the
 * exception classes and how a runtime status becomes one, and what is
 * looked up from torch and numpy once the program has imported them.
 *
 * opjit/__init__.py re-exports what is public; the call path itself (op.c,
 * tensor.c, runtime.c) never goes through Python code.
 */
#include "opjit_py.h"

opy_state opy;

/* ---- exceptions ------------------------------------------------------------ */

/* The class a status is raised as. TypeError-like call mistakes are also
 * TypeErrors; "not found" is also a LookupError. */
static PyObject *class_of(int status)
{
    switch (status) {
    case OPJIT_ECOMPILE: return opy.CompileError;
    case OPJIT_ENOTFOUND: return opy.NotFoundError;
    case OPJIT_ECALL: return opy.CallError;
    case OPJIT_EKERNEL: return opy.KernelError;
    case OPJIT_EDEVICE:
    case OPJIT_ENOKERNEL: return opy.DeviceError;
    default: return opy.Error;
    }
}

/* Raise cls(text) with .status = "OPJIT_...", the current exception (if
 * any) as its __cause__. Always returns NULL. */
static PyObject *raise_text(PyObject *cls, int status, PyObject *text)
{
    PyObject *cause = opy_err_take();
    PyObject *exc = text ? PyObject_CallOneArg(cls, text) : NULL;
    Py_XDECREF(text);
    if (!exc) {
        /* The text could not be made (a repr that raised...): then the
         * error that failed it, else the cause, comes out. */
        if (cause && !PyErr_Occurred())
            opy_err_restore(cause);
        else
            Py_XDECREF(cause);
        return NULL;
    }
    PyObject *name = PyUnicode_FromString(opjit_status_name(status));
    if (!name || PyObject_SetAttrString(exc, "status", name) < 0) {
        Py_XDECREF(name);
        Py_XDECREF(cause);
        Py_DECREF(exc);
        return NULL;
    }
    Py_DECREF(name);
    if (cause)
        PyException_SetCause(exc, cause); /* steals cause */
    PyErr_SetObject(cls, exc);
    Py_DECREF(exc);
    return NULL;
}

PyObject *opy_raise_status(const opjit_runtime *rt, int status)
{
    const char *msg = rt ? opjit_errmsg(rt) : "";
    if (!msg || !*msg)
        msg = opjit_errstr(status);
    /* Compiler diagnostics may quote bytes of any encoding. */
    return raise_text(class_of(status), status,
                      PyUnicode_DecodeUTF8(msg, (Py_ssize_t)strlen(msg), "replace"));
}

PyObject *opy_raise(PyObject *cls, int status, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    PyObject *cause = opy_err_take();
    PyObject *text = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    if (cause)
        opy_err_restore(cause);
    return raise_text(cls, status, text);
}

static PyObject *new_error(const char *name, PyObject *bases, const char *doc)
{
    return PyErr_NewExceptionWithDoc(name, doc, bases, NULL);
}

static int add_exceptions(PyObject *m)
{
    /* A RuntimeError, as torch's and torchvision's errors for bad calls are. */
    opy.Error = new_error("opjit.Error", PyExc_RuntimeError,
                          "An error of the opjit runtime (a RuntimeError, as torch's); str() is "
                          "its message. .status names the runtime's status code "
                          "(\"OPJIT_ECALL\", ...).");
    if (!opy.Error)
        return -1;
    struct {
        PyObject **slot;
        const char *name;
        PyObject *also;
        const char *doc;
    } sub[] = {
        {&opy.CompileError, "opjit.CompileError", NULL,
         "A source did not compile; the message holds the compiler's diagnostics."},
        {&opy.NotFoundError, "opjit.NotFoundError", PyExc_LookupError,
         "No op or source of that name on the search path."},
        {&opy.CallError, "opjit.CallError", PyExc_TypeError,
         "A call does not match the op's schema: it names the op and the argument."},
        {&opy.KernelError, "opjit.KernelError", NULL, "The kernel reported a failure."},
        {&opy.DeviceError, "opjit.DeviceError", NULL,
         "No kernel for the tensors' device, or the device is unusable."},
    };
    for (size_t i = 0; i < sizeof sub / sizeof sub[0]; i++) {
        PyObject *bases = sub[i].also ? PyTuple_Pack(2, opy.Error, sub[i].also)
                                      : PyTuple_Pack(1, opy.Error);
        *sub[i].slot = bases ? new_error(sub[i].name, bases, sub[i].doc) : NULL;
        Py_XDECREF(bases);
        if (!*sub[i].slot)
            return -1;
    }
    if (PyModule_AddObjectRef(m, "Error", opy.Error) < 0)
        return -1;
    for (size_t i = 0; i < sizeof sub / sizeof sub[0]; i++)
        if (PyModule_AddObjectRef(m, strchr(sub[i].name, '.') + 1, *sub[i].slot) < 0)
            return -1;
    return 0;
}

/* ---- torch and numpy, once imported ------------------------------------------ */

static PyObject *attr_chain(PyObject *obj, const char *a, const char *b)
{
    PyObject *x = PyObject_GetAttrString(obj, a);
    if (x && b) {
        PyObject *y = PyObject_GetAttrString(x, b);
        Py_DECREF(x);
        x = y;
    }
    return x;
}

static void look_up_torch(PyObject *torch)
{
    PyObject *tensor = PyObject_GetAttrString(torch, "Tensor");
    PyObject *to = tensor ? attr_chain(torch, "_C", "_to_dlpack") : NULL;
    PyObject *from = to ? attr_chain(torch, "_C", "_from_dlpack") : NULL;
    if (to && !from) {
        PyErr_Clear();
        from = PyObject_GetAttrString(torch, "from_dlpack");
    }
    if (tensor && to && from && PyType_Check(tensor)) {
        opy.torch_tensor = (PyTypeObject *)tensor;
        opy.torch_to_dlpack = to;
        opy.torch_from_dlpack = from;
        return;
    }
    /* torch half imported, or too old: look again next time */
    PyErr_Clear();
    Py_XDECREF(tensor);
    Py_XDECREF(to);
    Py_XDECREF(from);
}

static void look_up_numpy(PyObject *np)
{
    PyObject *nd = PyObject_GetAttrString(np, "ndarray");
    PyObject *bool_ = nd ? PyObject_GetAttrString(np, "bool_") : NULL;
    PyObject *from = bool_ ? PyObject_GetAttrString(np, "from_dlpack") : NULL; /* numpy >= 1.22 */
    if (nd && bool_ && from && PyType_Check(nd) && PyType_Check(bool_)) {
        opy.np_ndarray = (PyTypeObject *)nd;
        opy.np_bool = (PyTypeObject *)bool_;
        opy.np_from_dlpack = from;
        return;
    }
    PyErr_Clear();
    Py_XDECREF(nd);
    Py_XDECREF(bool_);
    Py_XDECREF(from);
}

/* sys.modules[name], held (its __getattr__ may take it out of sys.modules
 * while it is looked at), or NULL without an error. */
static PyObject *loaded_module(const char *name)
{
    PyObject *mod = PyDict_GetItemString(PyImport_GetModuleDict(), name);
    return Py_XNewRef(mod);
}

void opy_refresh_frameworks(void)
{
    PyObject *torch = opy.torch_tensor ? NULL : loaded_module("torch");
    if (torch)
        look_up_torch(torch);
    Py_XDECREF(torch);
    PyObject *np = opy.np_ndarray ? NULL : loaded_module("numpy");
    if (np)
        look_up_numpy(np);
    Py_XDECREF(np);
}

/* ---- module functions ------------------------------------------------------------ */

static PyObject *set_torch_stream_hook(PyObject *self, PyObject *fn)
{
    (void)self;
    if (fn != Py_None && !PyCallable_Check(fn))
        return PyErr_Format(PyExc_TypeError, "expected a callable or None");
    Py_XSETREF(opy.torch_stream_hook, fn == Py_None ? NULL : Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyObject *set_signature_hook(PyObject *self, PyObject *fn)
{
    (void)self;
    if (!PyCallable_Check(fn))
        return PyErr_Format(PyExc_TypeError, "expected a callable");
    Py_XSETREF(opy.signature_hook, Py_NewRef(fn));
    Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"_load_inline", opy_load_inline, METH_VARARGS,
     "_load_inline(runtime, name, source, include_dir=None) -> [Op]: the module's ops, the "
     "one named after it first (opjit.load_inline makes the module object)."},
    {"_set_log_hooks", opy_set_log_hooks, METH_VARARGS,
     "_set_log_hooks(emit, verbosity): emit(level, text) for each runtime message, "
     "verbosity() -> the opjit log level a new runtime gets."},
    {"_log_close", opy_log_close, METH_NOARGS,
     "_log_close(): deliver what is queued, then queue nothing more (at exit)."},
    {"_set_signature_hook", set_signature_hook, METH_O,
     "_set_signature_hook(fn): fn(op) -> inspect.Signature, for op.__signature__."},
    {"_set_torch_stream_hook", set_torch_stream_hook, METH_O,
     "_set_torch_stream_hook(fn): fn(device_index) -> the cudaStream_t (an int) of torch's "
     "current stream on that device; opjit runs torch CUDA tensors' calls on it."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "opjit._opjit",
    .m_doc = "The C half of the opjit package (use the package opjit).",
    .m_size = -1,
    .m_methods = module_methods,
};

PyMODINIT_FUNC PyInit__opjit(void)
{
    if (opjit_version() / 100 != OPJIT_VERSION_NUMBER / 100)
        return PyErr_Format(PyExc_ImportError,
                            "opjit._opjit was built for libopjit %d.%d but %s is loaded",
                            OPJIT_VERSION_MAJOR, OPJIT_VERSION_MINOR, opjit_version_string());
    if (PyType_Ready(&opy_runtime_type) < 0 || PyType_Ready(&opy_op_type) < 0 ||
        PyType_Ready(&opy_dlpack_tensor_type) < 0 || PyType_Ready(&opy_tensor_meta_type) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module_def);
    if (!m)
        return NULL;
    if (add_exceptions(m) < 0 ||
        PyModule_AddObjectRef(m, "Runtime", (PyObject *)&opy_runtime_type) < 0 ||
        PyModule_AddObjectRef(m, "Op", (PyObject *)&opy_op_type) < 0 ||
        PyModule_AddObjectRef(m, "DLPackTensor", (PyObject *)&opy_dlpack_tensor_type) < 0 ||
        PyModule_AddObjectRef(m, "TensorMeta", (PyObject *)&opy_tensor_meta_type) < 0 ||
        PyModule_AddStringConstant(m, "library_version", opjit_version_string()) < 0 ||
        !(opy.s_dlpack = PyUnicode_InternFromString("__dlpack__")) ||
        !(opy.s_dlpack_device = PyUnicode_InternFromString("__dlpack_device__")) ||
        !(opy.s_from_dlpack = PyUnicode_InternFromString("from_dlpack")) ||
        !(opy.s_stream = PyUnicode_InternFromString("stream")) ||
        !(opy.s_dlpack_kw[0] = Py_NewRef(opy.s_stream)) ||
        !(opy.s_dlpack_kw[1] = PyUnicode_InternFromString("max_version")) ||
        !(opy.s_dlpack_kw[2] = PyUnicode_InternFromString("dl_device")) ||
        !(opy.s_dlpack_kw[3] = PyUnicode_InternFromString("copy"))) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
