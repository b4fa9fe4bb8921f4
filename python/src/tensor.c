/*
 * python/src/tensor.c - tensors across the Python boundary, never copied.
 *
 * In: a torch.Tensor (torch._C._to_dlpack, skipping Tensor.__dlpack__'s
 * Python code), a numpy array or any object with __dlpack__, or a raw
 * "dltensor" capsule. The capsule is held for the call and released
 * unconsumed afterwards, so its producer's deleter runs when it dies;
 * meanwhile it is lent under another name, so nothing consumes it.
 *
 * Out: an opjit output (a DLManagedTensor whose deleter frees opjit's
 * block) handed to the framework of the first tensor argument: torch takes
 * a capsule, numpy >= 1.22 (and CuPy...) take an object with __dlpack__
 * and __dlpack_device__, which is what DLPackTensor is.
 */
#include "opjit_py.h"

/* ---- in ----------------------------------------------------------------------- */

opy_framework opy_tensor_kind(PyObject *obj)
{
    for (int pass = 0; pass < 2; pass++) {
        if (opy.torch_tensor && PyObject_TypeCheck(obj, opy.torch_tensor))
            return OPY_FW_TORCH;
        if (opy.np_ndarray && PyObject_TypeCheck(obj, opy.np_ndarray))
            return OPY_FW_NUMPY;
        if (PyCapsule_CheckExact(obj))
            return OPY_FW_CAPSULE;
        if (pass || (opy.torch_tensor && opy.np_ndarray))
            break;
        opy_refresh_frameworks(); /* torch or numpy may have been imported since */
    }
    if (PyObject_HasAttr(obj, opy.s_dlpack))
        return OPY_FW_OTHER;
    return OPY_FW_NONE;
}

/* ---- capsules lent to calls ---- */

/* A capsule Python code can reach (the caller's, or one its producer kept)
 * could be consumed while a call uses its tensor, by the __dlpack__ of a
 * later argument or by another thread while the call runs without the GIL,
 * and the tensor freed under the call. So while calls hold it, it carries
 * a name no DLPack consumer takes, and gets its own back when the last of
 * them is over. Touched with the GIL held only. */
static const char LENT_NAME[] = "opjit_lent_dltensor";

typedef struct lent_capsule {
    PyObject *cap;    /* borrowed: each call lending it holds it */
    const char *name; /* the producer's, put back at the end */
    Py_ssize_t calls;
} lent_capsule;

static struct {
    lent_capsule *v;
    Py_ssize_t n, cap;
} lent;

/* NULL, with the TypeError for a capsule that is not "dltensor". */
static DLManagedTensor *not_a_dltensor(PyObject *cap)
{
    const char *name = PyCapsule_CheckExact(cap) ? PyCapsule_GetName(cap) : NULL;
    PyErr_Format(PyExc_TypeError,
                 name && !strcmp(name, "used_dltensor")
                     ? "the DLPack capsule was already consumed"
                     : "expected a DLPack capsule named \"dltensor\", got %R",
                 cap);
    return NULL;
}

static lent_capsule *find_lent(PyObject *cap)
{
    for (Py_ssize_t i = 0; i < lent.n; i++)
        if (lent.v[i].cap == cap)
            return &lent.v[i];
    return NULL;
}

/* The tensor of a "dltensor" capsule or of one already lent, lent once more;
 * NULL with an exception set if it is neither. */
static DLManagedTensor *lend_capsule(PyObject *cap)
{
    lent_capsule *l = find_lent(cap);
    if (l) {
        l->calls++;
        return PyCapsule_GetPointer(cap, LENT_NAME);
    }
    if (!PyCapsule_IsValid(cap, "dltensor"))
        return not_a_dltensor(cap);
    if (lent.n == lent.cap) {
        Py_ssize_t n = lent.cap ? 2 * lent.cap : 16;
        lent_capsule *v = PyMem_Realloc(lent.v, (size_t)n * sizeof *v);
        if (!v)
            return PyErr_NoMemory(), NULL;
        lent.v = v;
        lent.cap = n;
    }
    const char *name = PyCapsule_GetName(cap);
    DLManagedTensor *mt = PyCapsule_GetPointer(cap, "dltensor");
    if (PyCapsule_SetName(cap, LENT_NAME) < 0)
        return NULL;
    lent.v[lent.n++] = (lent_capsule){cap, name, 1};
    return mt;
}

static void return_capsule(PyObject *cap)
{
    lent_capsule *l = find_lent(cap);
    if (!l || --l->calls > 0)
        return;
    PyCapsule_SetName(cap, l->name); /* cannot fail on a valid capsule */
    *l = lent.v[--lent.n];
}

/* ---- borrowing ---- */

int opy_borrow_tensor(PyObject *obj, opy_framework fw, opy_borrowed *out)
{
    PyObject *cap;
    if (fw == OPY_FW_TORCH)
        cap = PyObject_CallOneArg(opy.torch_to_dlpack, obj);
    else if (fw == OPY_FW_CAPSULE)
        cap = Py_NewRef(obj);
    else
        cap = PyObject_CallMethodNoArgs(obj, opy.s_dlpack);
    if (!cap)
        return -1;
    /* torch's capsule is new and ours alone (nothing else can consume it);
     * any other may be reachable, and is lent. */
    int lend = fw != OPY_FW_TORCH;
    DLManagedTensor *mt;
    if (lend)
        mt = lend_capsule(cap);
    else if (PyCapsule_IsValid(cap, "dltensor"))
        mt = PyCapsule_GetPointer(cap, "dltensor");
    else
        mt = not_a_dltensor(cap);
    if (!mt) {
        Py_DECREF(cap);
        return -1;
    }
    out->keep = cap;
    out->lent = lend;
    out->tensor = &mt->dl_tensor;
    return 0;
}

void opy_release_tensor(opy_borrowed *b)
{
    if (b->keep && b->lent)
        return_capsule(b->keep);
    Py_CLEAR(b->keep); /* unconsumed: its destructor calls the producer's deleter */
    b->tensor = NULL;
}

/* ---- out: capsules ------------------------------------------------------------- */

/* The destructor of the capsules opjit makes: frees the output unless a
 * consumer took it (and renamed the capsule "used_dltensor"). */
static void dltensor_capsule_free(PyObject *cap)
{
    if (!PyCapsule_IsValid(cap, "dltensor"))
        return;
    DLManagedTensor *mt = PyCapsule_GetPointer(cap, "dltensor");
    if (mt && mt->deleter)
        mt->deleter(mt);
}

/* A capsule owning mt; on failure mt is freed. */
static PyObject *new_capsule(DLManagedTensor *mt)
{
    PyObject *cap = PyCapsule_New(mt, "dltensor", dltensor_capsule_free);
    if (!cap && mt->deleter)
        mt->deleter(mt);
    return cap;
}

/* ---- out: DLPackTensor, an output for from_dlpack() ------------------------------------ */

typedef struct {
    PyObject_HEAD
    DLManagedTensor *mt; /* NULL once __dlpack__ handed it over */
    DLDevice device;
} dlpack_tensor;

static PyObject *new_dlpack_tensor(DLManagedTensor *mt)
{
    dlpack_tensor *t = PyObject_New(dlpack_tensor, &opy_dlpack_tensor_type);
    if (!t) {
        if (mt->deleter)
            mt->deleter(mt);
        return NULL;
    }
    t->mt = mt;
    t->device = mt->dl_tensor.device;
    return (PyObject *)t;
}

static void dlpack_tensor_dealloc(PyObject *self)
{
    dlpack_tensor *t = (dlpack_tensor *)self;
    if (t->mt && t->mt->deleter)
        t->mt->deleter(t->mt);
    PyObject_Free(self);
}

/* __dlpack__(*, stream=None, max_version=None, dl_device=None, copy=None):
 * the capsule, once. The output was made on the stream of the call (torch's
 * current stream for torch inputs), so no stream is waited on here. Fast
 * call with the keywords matched by hand: numpy.from_dlpack passes them on
 * every call, and building a dict for PyArg_ParseTupleAndKeywords cost a
 * quarter of a tiny call. */
static PyObject *dlpack_tensor_dlpack(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                      PyObject *kwnames)
{
    if (nargs)
        return PyErr_Format(PyExc_TypeError,
                            "__dlpack__() takes keyword arguments only (%zd given by position)",
                            nargs);
    PyObject *copy = Py_None;
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    for (Py_ssize_t i = 0; i < nkw; i++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, i);
        int k = 0;
        while (k < 4 && key != opy.s_dlpack_kw[k] &&
               PyUnicode_Compare(key, opy.s_dlpack_kw[k]) != 0)
            k++;
        if (k == 4)
            return PyErr_Format(PyExc_TypeError,
                                "__dlpack__() got an unexpected keyword argument %R", key);
        if (k == 3)
            copy = args[i];
    }
    dlpack_tensor *t = (dlpack_tensor *)self;
    if (copy == Py_True)
        return PyErr_Format(PyExc_BufferError, "opjit outputs are exported without a copy");
    if (!t->mt)
        return PyErr_Format(PyExc_BufferError,
                            "this opjit output was already exported through __dlpack__");
    DLManagedTensor *mt = t->mt;
    t->mt = NULL;
    return new_capsule(mt);
}

static PyObject *dlpack_tensor_device(PyObject *self, PyObject *unused)
{
    (void)unused;
    dlpack_tensor *t = (dlpack_tensor *)self;
    PyObject *type = PyLong_FromLong(t->device.device_type);
    PyObject *id = type ? PyLong_FromLong(t->device.device_id) : NULL;
    PyObject *pair = id ? PyTuple_Pack(2, type, id) : NULL;
    Py_XDECREF(type);
    Py_XDECREF(id);
    return pair;
}

static PyObject *dlpack_tensor_shape(PyObject *self, void *unused)
{
    (void)unused;
    dlpack_tensor *t = (dlpack_tensor *)self;
    if (!t->mt)
        Py_RETURN_NONE;
    const DLTensor *d = &t->mt->dl_tensor;
    PyObject *shape = PyTuple_New(d->ndim);
    for (int i = 0; shape && i < d->ndim; i++) {
        PyObject *n = PyLong_FromLongLong(d->shape[i]);
        if (!n) {
            Py_CLEAR(shape);
            break;
        }
        PyTuple_SET_ITEM(shape, i, n);
    }
    return shape;
}

static PyObject *dlpack_tensor_repr(PyObject *self)
{
    dlpack_tensor *t = (dlpack_tensor *)self;
    if (!t->mt)
        return PyUnicode_FromString("<opjit.DLPackTensor (exported)>");
    PyObject *shape = dlpack_tensor_shape(self, NULL);
    if (!shape)
        return NULL;
    const DLTensor *d = &t->mt->dl_tensor;
    const char *dev = opjit_device_name(d->device.device_type == kDLCUDA ? OPJIT_CUDA : OPJIT_CPU);
    PyObject *r = PyUnicode_FromFormat("<opjit.DLPackTensor shape=%R dtype=(code %d, %d bits) "
                                       "on %s:%d>",
                                       shape, d->dtype.code, d->dtype.bits, dev,
                                       d->device.device_id);
    Py_DECREF(shape);
    return r;
}

static PyMethodDef dlpack_tensor_methods[] = {
    {"__dlpack__", (PyCFunction)(void (*)(void))dlpack_tensor_dlpack, METH_FASTCALL | METH_KEYWORDS,
     "The output as a DLPack capsule; it can be exported once."},
    {"__dlpack_device__", dlpack_tensor_device, METH_NOARGS, "(device_type, device_id)"},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef dlpack_tensor_getset[] = {
    {"shape", dlpack_tensor_shape, NULL, "the shape (None once exported)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject opy_dlpack_tensor_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "opjit.DLPackTensor",
    .tp_doc = "An opjit output for a framework's from_dlpack(): numpy.from_dlpack(t), "
              "cupy.from_dlpack(t). Ops return one when no framework takes the output.",
    .tp_basicsize = sizeof(dlpack_tensor),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_dealloc = dlpack_tensor_dealloc,
    .tp_repr = dlpack_tensor_repr,
    .tp_methods = dlpack_tensor_methods,
    .tp_getset = dlpack_tensor_getset,
};

/* ---- out: to a framework ---------------------------------------------------------- */

/* fn(holder) where holder is a DLPackTensor owning mt. */
static PyObject *through_holder(PyObject *fn, DLManagedTensor *mt)
{
    PyObject *holder = new_dlpack_tensor(mt);
    if (!holder || !fn)
        return holder;
    PyObject *r = PyObject_CallOneArg(fn, holder);
    Py_DECREF(holder);
    return r;
}

/* The from_dlpack of the top-level module of obj's type (cupy.from_dlpack
 * for a cupy.ndarray), or NULL without an error. */
static PyObject *module_from_dlpack(PyObject *obj)
{
    PyObject *modname = PyObject_GetAttrString((PyObject *)Py_TYPE(obj), "__module__");
    PyObject *fn = NULL;
    if (modname && PyUnicode_Check(modname)) {
        Py_ssize_t dot = PyUnicode_FindChar(modname, '.', 0, PyUnicode_GET_LENGTH(modname), 1);
        PyObject *top = dot >= 0 ? PyUnicode_Substring(modname, 0, dot) : Py_NewRef(modname);
        /* held: its __getattr__ may take it out of sys.modules */
        PyObject *mod = top ? PyDict_GetItemWithError(PyImport_GetModuleDict(), top) : NULL;
        Py_XINCREF(mod);
        if (mod)
            fn = PyObject_GetAttr(mod, opy.s_from_dlpack);
        Py_XDECREF(mod);
        Py_XDECREF(top);
    }
    Py_XDECREF(modname);
    PyErr_Clear();
    return fn;
}

PyObject *opy_output(DLManagedTensor *mt, opy_framework fw, PyObject *first_arg)
{
    switch (fw) {
    case OPY_FW_TORCH: {
        PyObject *cap = new_capsule(mt);
        if (!cap)
            return NULL;
        PyObject *r = PyObject_CallOneArg(opy.torch_from_dlpack, cap);
        Py_DECREF(cap); /* consumed by torch, else freed here */
        return r;
    }
    case OPY_FW_CAPSULE:
        return new_capsule(mt);
    case OPY_FW_OTHER: {
        PyObject *fn = module_from_dlpack(first_arg);
        PyObject *r = through_holder(fn, mt);
        Py_XDECREF(fn);
        return r;
    }
    case OPY_FW_NUMPY:
    case OPY_FW_NONE:
        break;
    }
    if (!opy.np_from_dlpack)
        opy_refresh_frameworks();
    return through_holder(opy.np_from_dlpack, mt);
}
