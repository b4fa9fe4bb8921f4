/*
 * python/src/decls.c - what an op's source declares, from Python: its
 * gradient (Op.declarations) and its shape rule (Op.output_shapes), and
 * TensorMeta, a tensor with a shape, dtype, strides and device but no data,
 * which is what output_shapes is given where the tensors have no data
 * (torch's fake tensors, in the fake kernel opjit/_torch.py registers).
 *
 * A TensorMeta argument is taken as its DLTensor directly (op.c's
 * convert), so no DLPack capsule is made for it; a call (rather than a
 * shape query) refuses it as a tensor without data.
 */
#include "opjit_py.h"

/* ---- TensorMeta ----------------------------------------------------------------- */

/* dims of a sequence of ints into out (at most OPJIT_MAX_DIMS); -1 with
 * an exception on failure. The sequence is copied first, so __index__
 * cannot change it under us. */
static int read_dims(PyObject *seq, const char *what, int64_t *out)
{
    PyObject *t = PySequence_Tuple(seq);
    if (!t)
        return -1;
    Py_ssize_t n = PyTuple_GET_SIZE(t);
    if (n > OPJIT_MAX_DIMS) {
        Py_DECREF(t);
        PyErr_Format(PyExc_ValueError, "TensorMeta: %s has %zd dimensions, at most %d", what, n,
                     OPJIT_MAX_DIMS);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        int overflow = 0;
        PyObject *x = PyNumber_Index(PyTuple_GET_ITEM(t, i));
        long long v = x ? PyLong_AsLongLongAndOverflow(x, &overflow) : -1;
        Py_XDECREF(x);
        if (!x || overflow || (v == -1 && PyErr_Occurred())) {
            if (!PyErr_Occurred() || overflow)
                PyErr_Format(PyExc_ValueError, "TensorMeta: %s[%zd] is not an int64", what, i);
            Py_DECREF(t);
            return -1;
        }
        out[i] = v;
    }
    Py_DECREF(t);
    return (int)n;
}

/* "cpu", "meta" (a framework's device-less tensor: the CPU's kernel
 * answers), "cuda" with an index. */
static int read_device(const char *type, int index, DLDevice *dev)
{
    if (!strcmp(type, "cpu") || !strcmp(type, "meta")) {
        dev->device_type = kDLCPU;
        dev->device_id = 0;
        return 0;
    }
    if (!strcmp(type, "cuda") && index >= 0) {
        dev->device_type = kDLCUDA;
        dev->device_id = index;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "TensorMeta: device must be \"cpu\", \"meta\" or \"cuda\" "
                 "with an index >= 0, got %s:%d", type, index);
    return -1;
}

static int meta_init_once(opy_tensor_meta *m)
{
    if (!m->ready)
        return 0;
    PyErr_SetString(PyExc_RuntimeError, "TensorMeta.__init__ may run once");
    return -1;
}

/* t's shape and strides from the sequences, into dims and steps. */
static int meta_read_dims(PyObject *shape, PyObject *strides, DLTensor *t, int64_t *dims,
                          int64_t *steps)
{
    int ndim = read_dims(shape, "shape", dims);
    if (ndim < 0)
        return -1;
    int ns = strides == Py_None ? ndim : read_dims(strides, "strides", steps);
    if (ns < 0)
        return -1;
    if (ns != ndim) {
        PyErr_Format(PyExc_ValueError, "TensorMeta: %d strides for %d dimensions", ns, ndim);
        return -1;
    }
    t->ndim = ndim;
    return 0;
}

/* dtype and device first (their text is borrowed from the arguments,
 * which a C caller's kwargs dict may drop), then the dims, whose __index__
 * runs Python code that may use m: read into locals, and m set whole at
 * the end, as a call on another thread may be reading it. */
static int meta_init(PyObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"shape", "dtype", "strides", "device", "index", NULL};
    opy_tensor_meta *m = (opy_tensor_meta *)self;
    PyObject *shape, *strides = Py_None;
    const char *dtype, *device = "cpu";
    int index = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "Os|Osi:TensorMeta", kwlist, &shape, &dtype,
                                     &strides, &device, &index) ||
        meta_init_once(m) < 0)
        return -1;
    DLTensor t;
    int64_t dims[OPJIT_MAX_DIMS], steps[OPJIT_MAX_DIMS];
    memset(&t, 0, sizeof t);
    if (read_device(device, index, &t.device) < 0)
        return -1;
    if (opjit_dtype_parse(dtype, &t.dtype) != OPJIT_OK) {
        PyErr_Format(PyExc_ValueError, "TensorMeta: unknown dtype '%s'", dtype);
        return -1;
    }
    Py_INCREF(shape);
    Py_INCREF(strides);
    int has_strides = strides != Py_None;
    int rc = meta_read_dims(shape, strides, &t, dims, steps);
    Py_DECREF(shape);
    Py_DECREF(strides);
    if (rc < 0 || meta_init_once(m) < 0) /* the Python code above may have */
        return -1;
    memcpy(m->shape, dims, (size_t)t.ndim * sizeof dims[0]);
    memcpy(m->strides, steps, has_strides ? (size_t)t.ndim * sizeof steps[0] : 0);
    t.shape = m->shape;
    t.strides = has_strides ? m->strides : NULL;
    m->t = t;
    m->ready = 1;
    return 0;
}

static PyObject *meta_repr(PyObject *self)
{
    opy_tensor_meta *m = (opy_tensor_meta *)self;
    PyObject *shape = PyTuple_New(m->t.ndim);
    for (int i = 0; shape && i < m->t.ndim; i++) {
        PyObject *d = PyLong_FromLongLong(m->shape[i]);
        if (!d)
            Py_CLEAR(shape);
        else
            PyTuple_SET_ITEM(shape, i, d);
    }
    const char *dt = opjit_dtype_name(m->t.dtype);
    PyObject *r = shape ? PyUnicode_FromFormat("opjit.TensorMeta(%R, '%s', device='%s')", shape,
                                               dt ? dt : "?",
                                               m->t.device.device_type == kDLCUDA ? "cuda" : "cpu")
                        : NULL;
    Py_XDECREF(shape);
    return r;
}

PyTypeObject opy_tensor_meta_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "opjit.TensorMeta",
    .tp_doc = "TensorMeta(shape, dtype, strides=None, device='cpu', index=0)\n\n"
              "A tensor's shape, dtype (\"float32\"), strides (in elements; None: row-major) "
              "and device (\"cpu\", \"cuda\" with an index, or \"meta\") without data: what "
              "Op.output_shapes takes where there is no data. A call refuses it.",
    .tp_basicsize = sizeof(opy_tensor_meta),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = meta_init,
    .tp_repr = meta_repr,
};

/* ---- Op.output_shapes -------------------------------------------------------------- */

static PyObject *shape_tuple(const int64_t *dims, int n)
{
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *d = PyLong_FromLongLong(dims[i]);
        if (!d)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, d);
    }
    return t;
}

/* ((shape, dtype name, (dynamic dims...)), ...) for one output. */
static PyObject *out_shape_obj(const opjit_out_shape *o)
{
    int64_t dyn[OPJIT_MAX_DIMS];
    int nd = 0;
    for (int d = 0; d < o->ndim; d++)
        if (o->dynamic & (1u << d))
            dyn[nd++] = d;
    const char *name = opjit_dtype_name(o->dtype);
    PyObject *shape = shape_tuple(o->shape, o->ndim), *dims = shape_tuple(dyn, nd);
    PyObject *r = shape && dims ? Py_BuildValue("(OsO)", shape, name ? name : "?", dims) : NULL;
    Py_XDECREF(shape);
    Py_XDECREF(dims);
    return r;
}

PyObject *opy_shapes_call(opy_op *o, const opjit_value *args, int nargs)
{
    opjit_out_shape outs[OPY_MAX_OUTS];
    int rc = opjit_output_shapes(o->rt->rt, o->op, args, nargs, outs, OPY_MAX_OUTS);
    if (rc)
        return opy_raise_status(o->rt->rt, rc);
    opjit_op_info info = {.size = sizeof info};
    if (opjit_op_info_get(o->rt->rt, o->op, &info))
        return opy_raise_status(o->rt->rt, OPJIT_EINVAL);
    int n = info.nouts < OPY_MAX_OUTS ? info.nouts : OPY_MAX_OUTS;
    PyObject *t = PyTuple_New(n);
    for (int i = 0; t && i < n; i++) {
        PyObject *x = out_shape_obj(&outs[i]);
        if (!x)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, x);
    }
    return t;
}

/* ---- Op.declarations ------------------------------------------------------------------ */

static const char *from_name(int from)
{
    switch (from) {
    case OPJIT_GRAD_FROM_GRAD: return "grad";
    case OPJIT_GRAD_FROM_INPUT: return "input";
    case OPJIT_GRAD_FROM_OUTPUT: return "output";
    case OPJIT_GRAD_FROM_MASK: return "mask";
    }
    return "default";
}

/* [(from, index), ...] of the backward's arguments, and the inputs. */
static int gradient_items(PyObject *d, const opjit_op_decls *g)
{
    PyObject *inputs = PyTuple_New(g->ninputs);
    PyObject *args = inputs ? PyTuple_New(g->nbackward_args) : NULL;
    for (int i = 0; args && i < g->ninputs; i++) {
        PyObject *x = PyLong_FromLong(g->inputs[i]);
        if (!x)
            Py_CLEAR(args);
        else
            PyTuple_SET_ITEM(inputs, i, x);
    }
    for (int i = 0; args && i < g->nbackward_args; i++) {
        PyObject *x = Py_BuildValue("(si)", from_name(g->backward_args[i].from),
                                    g->backward_args[i].index);
        if (!x)
            Py_CLEAR(args);
        else
            PyTuple_SET_ITEM(args, i, x);
    }
    int rc = args && PyDict_SetItemString(d, "inputs", inputs) == 0 &&
                     PyDict_SetItemString(d, "backward_args", args) == 0
                 ? 0
                 : -1;
    Py_XDECREF(inputs);
    Py_XDECREF(args);
    return rc;
}

PyObject *opy_op_declarations(PyObject *self, void *unused)
{
    (void)unused;
    opy_op *o = (opy_op *)self;
    const opjit_op_decls *g;
    if (!o->rt->rt || o->rt->closing)
        return opy_raise(opy.Error, OPJIT_EINVAL, "op %U: its opjit.Runtime was closed", o->name);
    if (opjit_op_decls_get(o->rt->rt, o->op, &g))
        return opy_raise_status(o->rt->rt, OPJIT_EINVAL);
    const char *kind = g->gradient == OPJIT_GRAD_DECLARED ? "derivative"
                       : g->gradient == OPJIT_GRAD_NONE   ? "not differentiable"
                                                          : "undeclared";
    PyObject *d = Py_BuildValue("{s:s,s:O}", "gradient", kind, "shape_rule",
                                g->shape_rule ? Py_True : Py_False);
    if (d && g->gradient == OPJIT_GRAD_DECLARED) {
        PyObject *b = PyUnicode_FromString(g->backward);
        if (!b || PyDict_SetItemString(d, "backward", b) < 0 || gradient_items(d, g) < 0)
            Py_CLEAR(d);
        Py_XDECREF(b);
    }
    return d;
}
