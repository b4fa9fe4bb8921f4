/*
 * python/src/op.c - opjit.Op: a loaded operator, callable.
 *
 * op(*args, **kwargs) binds Python values to the schema's arguments by
 * position and by name, turns them into opjit_values (tensors borrowed
 * through DLPack, scalars by their Python type), and calls opjit_call with
 * the GIL released. The runtime checks everything against the schema of
 * the kernel it picks, so binding here needs only the argument names, and
 * the runtime's messages name the op and the argument.
 *
 * The call is a vectorcall: no tuple or dict is built for it.
 */
#include "opjit_py.h"

/* One call's arguments as the runtime takes them, and what keeps them. */
typedef struct call_frame {
    opjit_value v[OPY_MAX_ARGS];
    int64_t ints[OPY_MAX_ARGS][OPY_MAX_LIST];
    opy_framework tensor_fw[OPY_MAX_ARGS]; /* OPY_FW_NONE: not a tensor */
    opy_borrowed borrowed[OPY_MAX_ARGS];
    int nborrowed;
    opy_framework fw;  /* of the first tensor argument */
    PyObject *first;   /* that argument (borrowed from the caller) */
    int first_index;
    const DLTensor *first_tensor;
} call_frame;

/* ---- argument names ------------------------------------------------------------- */

/* Read the argument names when the op's schema is not the one they were
 * read from (first use, or a reload changed it). */
static int refresh_names(opy_op *o)
{
    opjit_op_info info = {.size = sizeof info};
    if (opjit_op_info_get(o->rt->rt, o->op, &info))
        return opy_raise_status(o->rt->rt, OPJIT_EINVAL), -1;
    if (o->arg_names && info.schema == o->names_schema)
        return 0;
    PyObject *names = PyTuple_New(info.nargs);
    for (int i = 0; names && i < info.nargs; i++) {
        opjit_arg_info a = {.size = sizeof a};
        PyObject *s = opjit_op_arg_get(o->rt->rt, o->op, i, &a) ? NULL
                                                            : PyUnicode_InternFromString(a.name);
        if (!s) {
            Py_CLEAR(names);
            if (!PyErr_Occurred())
                opy_raise_status(o->rt->rt, OPJIT_EINVAL);
            break;
        }
        PyTuple_SET_ITEM(names, i, s);
    }
    if (!names)
        return -1;
    Py_XSETREF(o->arg_names, names);
    o->names_schema = info.schema;
    return 0;
}

/* Argument i's name for a message: a new reference. */
static PyObject *arg_label(opy_op *o, int i)
{
    if (o->arg_names && i < PyTuple_GET_SIZE(o->arg_names))
        return Py_NewRef(PyTuple_GET_ITEM(o->arg_names, i));
    return PyUnicode_FromFormat("#%d", i);
}

static int keyword_index(opy_op *o, PyObject *key)
{
    Py_ssize_t n = PyTuple_GET_SIZE(o->arg_names);
    for (Py_ssize_t i = 0; i < n; i++) /* interned names: usually the same object */
        if (PyTuple_GET_ITEM(o->arg_names, i) == key)
            return (int)i;
    for (Py_ssize_t i = 0; i < n; i++)
        if (PyUnicode_Compare(PyTuple_GET_ITEM(o->arg_names, i), key) == 0)
            return (int)i;
    return -1;
}

/* bound[0..*n) = the arguments in schema order, NULL where not given. */
static int bind(opy_op *o, PyObject *const *args, Py_ssize_t npos, PyObject *kwnames,
                PyObject **bound, int *n)
{
    Py_ssize_t nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    if (npos > OPY_MAX_ARGS)
        return opy_raise(opy.CallError, OPJIT_ECALL, "%U takes at most %d arguments, got %zd",
                         o->name, OPY_MAX_ARGS, npos), -1;
    for (Py_ssize_t i = 0; i < npos; i++)
        bound[i] = args[i];
    *n = (int)npos;
    if (!nkw)
        return 0;
    if (refresh_names(o) < 0)
        return -1;
    for (int i = (int)npos; i < OPY_MAX_ARGS; i++)
        bound[i] = NULL;
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *key = PyTuple_GET_ITEM(kwnames, k);
        int i = keyword_index(o, key);
        if (i < 0 || i >= OPY_MAX_ARGS)
            return opy_raise(opy.CallError, OPJIT_ECALL,
                             "%U() got an unexpected keyword argument '%U' (its arguments: %R)",
                             o->name, key, o->arg_names), -1;
        if (bound[i])
            return opy_raise(opy.CallError, OPJIT_ECALL,
                             "%U() got multiple values for argument '%U'", o->name, key), -1;
        bound[i] = args[npos + k];
        if (i + 1 > *n)
            *n = i + 1;
    }
    return 0;
}

/* ---- Python values to opjit values ---------------------------------------------------- */

/* What argument i takes, for a message: the schema's type, in words where
 * Python's spelling differs. A new reference. */
static PyObject *arg_expects(opy_op *o, int i)
{
    opjit_arg_info a = {.size = sizeof a};
    if (opjit_op_arg_get(o->rt->rt, o->op, i, &a))
        return PyUnicode_FromString("a tensor, int, float, bool, str, list of ints or None");
    if (a.kind == OPJIT_KIND_INTS && a.list_len > 0)
        return PyUnicode_FromFormat("%s (an int or a list of %d ints)", a.type, a.list_len);
    if (a.kind == OPJIT_KIND_INTS)
        return PyUnicode_FromFormat("%s (a list of ints)", a.type);
    if (a.kind == OPJIT_KIND_TENSOR)
        return PyUnicode_FromFormat("%s (an object with __dlpack__ or a DLPack capsule%s)", a.type,
                                    a.optional ? ", or None" : "");
    return PyUnicode_FromString(a.type);
}

/* Raise "<op>: argument '<name>': expected <what it takes>, got <got>",
 * got made from fmt; the pending exception, if any, is its cause. */
static int wrong_value(opy_op *o, int i, const char *fmt, ...)
{
    PyObject *cause = opy_err_take(); /* no Python code runs with it pending */
    va_list ap;
    va_start(ap, fmt);
    PyObject *got = PyUnicode_FromFormatV(fmt, ap);
    va_end(ap);
    PyObject *name = got ? arg_label(o, i) : NULL;
    PyObject *expects = name ? arg_expects(o, i) : NULL;
    if (expects) {
        if (cause)
            opy_err_restore(cause);
        opy_raise(opy.CallError, OPJIT_ECALL, "%U: argument '%S': expected %S, got %S", o->name,
                  name, expects, got);
    } else {
        Py_XDECREF(cause);
    }
    Py_XDECREF(expects);
    Py_XDECREF(name);
    Py_XDECREF(got);
    return -1;
}

/* A list element that is not an int64, described: "a list of str
 * (element 1 is 'a')". */
static int wrong_element(opy_op *o, int i, PyObject *seq, Py_ssize_t j, PyObject *item,
                         int overflow)
{
    return wrong_value(o, i, "a %s of %s (element %zd is %R%s)", Py_TYPE(seq)->tp_name,
                       Py_TYPE(item)->tp_name, j, item, overflow ? ", out of int64 range" : "");
}

/* The list is copied first: __index__ may change it (or drop its items)
 * while it is read. */
static int convert_ints(opy_op *o, int i, PyObject *seq, call_frame *f)
{
    PyObject *items = PySequence_Tuple(seq);
    if (!items)
        return -1;
    Py_ssize_t len = PyTuple_GET_SIZE(items);
    int rc = 0;
    if (len > OPY_MAX_LIST)
        rc = wrong_value(o, i, "a %s of %zd (too long: opjit takes at most %d)",
                         Py_TYPE(seq)->tp_name, len, OPY_MAX_LIST);
    for (Py_ssize_t j = 0; !rc && j < len; j++) {
        PyObject *item = PyNumber_Index(PyTuple_GET_ITEM(items, j));
        int overflow = 0;
        long long x = item ? PyLong_AsLongLongAndOverflow(item, &overflow) : -1;
        Py_XDECREF(item);
        if (!item || overflow || (x == -1 && PyErr_Occurred()))
            rc = wrong_element(o, i, seq, j, PyTuple_GET_ITEM(items, j), overflow);
        f->ints[i][j] = x;
    }
    Py_DECREF(items);
    if (!rc)
        f->v[i] = opjit_ints(f->ints[i], (int)len);
    return rc;
}

static int convert_tensor(opy_op *o, int i, PyObject *obj, opy_framework fw, call_frame *f)
{
    opy_borrowed *b = &f->borrowed[f->nborrowed];
    if (opy_borrow_tensor(obj, fw, b) < 0) {
        /* Say why in the message too; the exception stays the cause. */
        PyObject *cause = opy_err_take();
        PyObject *why = cause ? PyObject_Str(cause) : NULL;
        PyObject *name = why ? arg_label(o, i) : NULL;
        if (name)
            opy_err_restore(cause);
        else
            Py_XDECREF(cause);
        if (name)
            opy_raise(opy.CallError, OPJIT_ECALL,
                      "%U: argument '%S': cannot take this %s as a tensor: %s: %S", o->name, name,
                      Py_TYPE(obj)->tp_name, Py_TYPE(cause)->tp_name, why);
        Py_XDECREF(why);
        Py_XDECREF(name);
        return -1;
    }
    f->nborrowed++;
    if (!f->first || i < f->first_index) {
        f->first = obj;
        f->first_index = i;
        f->fw = fw;
        f->first_tensor = b->tensor;
    }
    f->v[i] = opjit_tensor(b->tensor);
    return 0;
}

/* Numbers that are not exactly int, float or bool (numpy scalars...). */
static int convert_number(opy_op *o, int i, PyObject *obj, call_frame *f)
{
    if (PyIndex_Check(obj)) {
        PyObject *x = PyNumber_Index(obj);
        int overflow = 0;
        long long v = x ? PyLong_AsLongLongAndOverflow(x, &overflow) : -1;
        Py_XDECREF(x);
        if (x && !overflow && !(v == -1 && PyErr_Occurred())) {
            f->v[i] = opjit_int(v);
            return 0;
        }
    } else {
        double d = PyFloat_AsDouble(obj);
        if (!(d == -1.0 && PyErr_Occurred())) {
            f->v[i] = opjit_float(d);
            return 0;
        }
    }
    if (PyLong_Check(obj))
        return wrong_value(o, i, "an int out of int64 range (%R)", obj);
    return wrong_value(o, i, "%s (%R), which is not an int64 or a float", Py_TYPE(obj)->tp_name,
                       obj);
}

/* A str argument: its UTF-8, owned by obj, which the caller holds for the
 * call. An embedded NUL would cut it short: refused. */
static int convert_str(opy_op *o, int i, PyObject *obj, call_frame *f)
{
    Py_ssize_t len;
    const char *s = PyUnicode_AsUTF8AndSize(obj, &len);
    if (s && (size_t)len == strlen(s)) {
        f->v[i] = opjit_str(s);
        return 0;
    }
    PyObject *name = s ? arg_label(o, i) : NULL;
    if (name)
        opy_raise(opy.CallError, OPJIT_ECALL, "%U: argument '%S': a str with a NUL character",
                  o->name, name);
    Py_XDECREF(name);
    return -1;
}

/* Everything but tensors, which are only recognised here: see lend_tensors. */
static int convert(opy_op *o, int i, PyObject *obj, call_frame *f)
{
    f->tensor_fw[i] = OPY_FW_NONE;
    if (obj && Py_TYPE(obj) == &opy_tensor_meta_type) { /* no data: a shape query's */
        opy_tensor_meta *m = (opy_tensor_meta *)obj;
        if (!m->ready) /* set once, then never changed: read without the GIL */
            return wrong_value(o, i, "a TensorMeta that was not initialised");
        f->v[i] = opjit_tensor(&m->t);
        return 0;
    }
    if (!obj || obj == Py_None) {
        f->v[i] = opjit_none(); /* the default, or None for Tensor? */
        return 0;
    }
    if (PyFloat_CheckExact(obj)) {
        f->v[i] = opjit_float(PyFloat_AS_DOUBLE(obj));
        return 0;
    }
    if (PyBool_Check(obj)) {
        f->v[i] = opjit_bool(obj == Py_True);
        return 0;
    }
    if (PyLong_CheckExact(obj))
        return convert_number(o, i, obj, f);
    if (PyUnicode_Check(obj))
        return convert_str(o, i, obj, f);
    opy_framework fw = opy_tensor_kind(obj);
    if (fw != OPY_FW_NONE) {
        f->tensor_fw[i] = fw;
        return 0;
    }
    if (PyList_Check(obj) || PyTuple_Check(obj))
        return convert_ints(o, i, obj, f);
    if (opy.np_bool && Py_TYPE(obj) == opy.np_bool) {
        f->v[i] = opjit_bool(PyObject_IsTrue(obj));
        return 0;
    }
    PyNumberMethods *nb = Py_TYPE(obj)->tp_as_number;
    if (PyIndex_Check(obj) || (nb && nb->nb_float))
        return convert_number(o, i, obj, f);
    return wrong_value(o, i, "%s", Py_TYPE(obj)->tp_name);
}

/* Take the tensors once every other argument is converted, the ones whose
 * export runs Python code (another producer's __dlpack__, a numpy subclass)
 * before torch's, numpy's and capsules: Python code run after a tensor was
 * taken could resize it or consume its capsule, freeing what the call
 * reads. (Capsules are also lent under another name: see tensor.c.) */
static int lend_tensors(opy_op *o, PyObject **bound, int n, call_frame *f)
{
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < n; i++) {
            opy_framework fw = f->tensor_fw[i];
            if (fw == OPY_FW_NONE)
                continue;
            int runs_code = fw == OPY_FW_OTHER ||
                            (fw == OPY_FW_NUMPY && Py_TYPE(bound[i]) != opy.np_ndarray);
            if (runs_code != (pass == 0))
                continue;
            if (convert_tensor(o, i, bound[i], fw, f) < 0)
                return -1;
        }
    return 0;
}

/* ---- into the runtime, on the right CUDA stream ------------------------------------- */

/* The stream a CUDA call on device dev runs on: torch's current stream for
 * torch tensors, else NULL (the context's default stream, the one a
 * DLPack producer asked without a stream has ordered its work on). */
static int cuda_stream_for(int dev, opy_framework fw, void **stream)
{
    *stream = NULL;
    if (fw != OPY_FW_TORCH || !opy.torch_stream_hook)
        return 0;
    PyObject *hook = Py_NewRef(opy.torch_stream_hook); /* it may replace itself */
    PyObject *s = PyObject_CallFunction(hook, "i", dev);
    Py_DECREF(hook);
    if (!s)
        return -1;
    *stream = PyLong_AsVoidPtr(s);
    Py_DECREF(s);
    return *stream == NULL && PyErr_Occurred() ? -1 : 0;
}

/* With the GIL released: take cuda_lock for reading with the runtime's
 * stream for dev being `stream`, switching it first if needed. Returns an
 * opjit status; on success the read lock is held. */
static int hold_cuda_stream(opy_runtime *r, int dev, void *stream)
{
    for (;;) {
        pthread_rwlock_rdlock(&r->cuda_lock);
        if (r->cuda[dev].set && r->cuda[dev].stream == stream)
            return OPJIT_OK;
        pthread_rwlock_unlock(&r->cuda_lock);
        pthread_rwlock_wrlock(&r->cuda_lock);
        int rc = OPJIT_OK;
        if (!r->cuda[dev].set || r->cuda[dev].stream != stream) {
            /* NULL context: the device's primary context, PyTorch's. */
            rc = opjit_set_cuda_stream(r->rt, dev, NULL, stream);
            r->cuda[dev].set = rc == OPJIT_OK;
            r->cuda[dev].stream = stream;
        }
        pthread_rwlock_unlock(&r->cuda_lock);
        if (rc)
            return rc;
    }
}

/* opjit_call with the GIL released. Calls on CUDA tensors run on the
 * stream of the framework that made the first tensor (torch's current
 * stream; the default stream for others), which opjit_set_cuda_stream
 * hands the runtime whenever it changes. */
static int runtime_call(opy_runtime *r, const opjit_op *op, const opjit_value *args,
                        int nargs, DLManagedTensor **outs, int nouts, const DLTensor *first,
                        opy_framework first_fw)
{
    int rc;
    int dev = first && first->device.device_type == kDLCUDA ? first->device.device_id : -1;
    if (dev < 0 || dev >= OPY_MAX_CUDA_DEVICES) { /* CPU (or a device opjit will refuse) */
        Py_BEGIN_ALLOW_THREADS
        rc = opjit_call(r->rt, op, args, nargs, outs, nouts);
        Py_END_ALLOW_THREADS
        return rc;
    }
    void *stream;
    if (cuda_stream_for(dev, first_fw, &stream) < 0)
        return -1;
    Py_BEGIN_ALLOW_THREADS
    rc = hold_cuda_stream(r, dev, stream);
    if (rc == OPJIT_OK) {
        rc = opjit_call(r->rt, op, args, nargs, outs, nouts);
        pthread_rwlock_unlock(&r->cuda_lock);
    }
    Py_END_ALLOW_THREADS
    return rc;
}

/* ---- the call ------------------------------------------------------------------------ */

/* The outputs as Python objects: None, one object, or a tuple. Takes
 * ownership of outs[]. */
static PyObject *outputs(DLManagedTensor **outs, call_frame *f)
{
    int k = 0;
    while (k < OPY_MAX_OUTS && outs[k])
        k++;
    if (k == 0)
        Py_RETURN_NONE;
    if (k == 1)
        return opy_output(outs[0], f->fw, f->first);
    PyObject *tuple = PyTuple_New(k);
    for (int j = 0; j < k; j++) {
        PyObject *item = tuple ? opy_output(outs[j], f->fw, f->first) : NULL;
        if (!item) { /* outs[j] is freed by opy_output; free the rest */
            for (int r = tuple ? j + 1 : j; r < k; r++)
                outs[r]->deleter(outs[r]);
            Py_XDECREF(tuple);
            return NULL;
        }
        PyTuple_SET_ITEM(tuple, j, item);
    }
    return tuple;
}

/* A call, or (shapes) a shape query: what the call would return. */
static PyObject *op_invoke(PyObject *self, PyObject *const *args, size_t nargsf,
                           PyObject *kwnames, int shapes)
{
    opy_op *o = (opy_op *)self;
    PyObject *bound[OPY_MAX_ARGS];
    int n;
    opy_use use;
    opjit_runtime *rt = opy_runtime_enter(o->rt, &use); /* close() waits for the call */
    if (!rt)
        return NULL;
    if (bind(o, args, PyVectorcall_NARGS(nargsf), kwnames, bound, &n) < 0) {
        opy_runtime_leave(&use);
        return NULL;
    }
    call_frame f;
    f.nborrowed = 0;
    f.fw = OPY_FW_NONE;
    f.first = NULL;
    f.first_index = 0;
    f.first_tensor = NULL;
    PyObject *result = NULL;
    int i = 0;
    while (i < n && convert(o, i, bound[i], &f) == 0)
        i++;
    int ready = i == n && lend_tensors(o, bound, n, &f) == 0;
    if (ready && shapes) {
        result = opy_shapes_call(o, f.v, n);
    } else if (ready) {
        DLManagedTensor *outs[OPY_MAX_OUTS] = {0};
        int rc = runtime_call(o->rt, o->op, f.v, n, outs, OPY_MAX_OUTS, f.first_tensor,
                                  f.fw);
        if (rc == 0)
            result = outputs(outs, &f);
        else if (rc > 0)
            opy_raise_status(rt, rc);
    }
    for (int j = 0; j < f.nborrowed; j++)
        opy_release_tensor(&f.borrowed[j]);
    opy_runtime_leave(&use);
    return result;
}

static PyObject *op_vectorcall(PyObject *self, PyObject *const *args, size_t nargsf,
                               PyObject *kwnames)
{
    return op_invoke(self, args, nargsf, kwnames, 0);
}

static PyObject *op_output_shapes(PyObject *self, PyObject *const *args, Py_ssize_t nargs,
                                  PyObject *kwnames)
{
    return op_invoke(self, args, (size_t)nargs, kwnames, 1);
}

/* ---- the type ---------------------------------------------------------------------------- */

PyObject *opy_op_new(opy_runtime *rt, opjit_op *op)
{
    opjit_op_info info = {.size = sizeof info};
    if (opjit_op_info_get(rt->rt, op, &info))
        return opy_raise_status(rt->rt, OPJIT_EINVAL);
    if (info.nargs > OPY_MAX_ARGS || info.nouts > OPY_MAX_OUTS)
        return opy_raise(opy.Error, OPJIT_ESCHEMA,
                         "%s: %d arguments and %d outputs; opjit's Python binding takes at most "
                         "%d and %d",
                         info.name, info.nargs, info.nouts, OPY_MAX_ARGS, OPY_MAX_OUTS);
    opy_op *o = PyObject_New(opy_op, &opy_op_type);
    if (!o)
        return NULL;
    o->vectorcall = op_vectorcall;
    o->rt = (opy_runtime *)Py_NewRef((PyObject *)rt);
    o->op = op;
    o->arg_names = NULL;
    o->names_schema = NULL;
    o->name = PyUnicode_FromString(info.name);
    if (!o->name || refresh_names(o) < 0) {
        Py_DECREF(o);
        return NULL;
    }
    return (PyObject *)o;
}

static void op_dealloc(PyObject *self)
{
    opy_op *o = (opy_op *)self;
    Py_XDECREF(o->name);
    Py_XDECREF(o->arg_names);
    Py_XDECREF((PyObject *)o->rt);
    PyObject_Free(self);
}

static int op_info(opy_op *o, opjit_op_info *info)
{
    if (!o->rt->rt || o->rt->closing)
        return opy_raise(opy.Error, OPJIT_EINVAL, "op %U: its opjit.Runtime was closed",
                         o->name), -1;
    if (opjit_op_info_get(o->rt->rt, o->op, info))
        return opy_raise_status(o->rt->rt, OPJIT_EINVAL), -1;
    return 0;
}

static PyObject *op_get_name(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef(((opy_op *)self)->name);
}

static PyObject *op_get_schema(PyObject *self, void *unused)
{
    (void)unused;
    opjit_op_info info = {.size = sizeof info};
    return op_info((opy_op *)self, &info) < 0 ? NULL : PyUnicode_FromString(info.schema);
}

static PyObject *op_get_devices(PyObject *self, void *unused)
{
    (void)unused;
    opjit_op_info info = {.size = sizeof info};
    if (op_info((opy_op *)self, &info) < 0)
        return NULL;
    PyObject *list = PyList_New(0);
    for (int d = 0; list && d < OPJIT_DEVICE_COUNT; d++) {
        PyObject *s = info.source[d] ? PyUnicode_FromString(opjit_device_name(d)) : NULL;
        if (info.source[d] && (!s || PyList_Append(list, s) < 0))
            Py_CLEAR(list);
        Py_XDECREF(s);
    }
    PyObject *tuple = list ? PyList_AsTuple(list) : NULL;
    Py_XDECREF(list);
    return tuple;
}

/* {device: per-device string} for the devices that have a kernel. */
static PyObject *per_device(PyObject *self, int sources)
{
    opjit_op_info info = {.size = sizeof info};
    if (op_info((opy_op *)self, &info) < 0)
        return NULL;
    PyObject *dict = PyDict_New();
    for (int d = 0; dict && d < OPJIT_DEVICE_COUNT; d++) {
        const char *s = sources ? info.source[d] : info.tier[d];
        if (!info.source[d])
            continue;
        PyObject *v = s ? PyUnicode_DecodeFSDefault(s) : Py_NewRef(Py_None);
        if (!v || PyDict_SetItemString(dict, opjit_device_name(d), v) < 0)
            Py_CLEAR(dict);
        Py_XDECREF(v);
    }
    return dict;
}

static PyObject *op_get_sources(PyObject *self, void *unused)
{
    (void)unused;
    return per_device(self, 1);
}

static PyObject *op_get_tiers(PyObject *self, void *unused)
{
    (void)unused;
    return per_device(self, 0);
}

/* The tier of the CPU kernel, else of the first device that has one. */
static PyObject *op_get_tier(PyObject *self, void *unused)
{
    (void)unused;
    opjit_op_info info = {.size = sizeof info};
    if (op_info((opy_op *)self, &info) < 0)
        return NULL;
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++)
        if (info.source[d] && info.tier[d])
            return PyUnicode_FromString(info.tier[d]);
    Py_RETURN_NONE;
}

static PyObject *op_get_doc(PyObject *self, void *unused)
{
    (void)unused;
    opjit_op_info info = {.size = sizeof info};
    if (op_info((opy_op *)self, &info) < 0)
        return NULL;
    for (int d = 0; d < OPJIT_DEVICE_COUNT; d++)
        if (info.source[d] && info.doc[d])
            return PyUnicode_FromFormat("%s\n\n%s", info.schema, info.doc[d]);
    return PyUnicode_FromString(info.schema);
}

/* inspect.signature(op): built from the schema by opjit/_inline.py. */
static PyObject *op_get_signature(PyObject *self, void *unused)
{
    (void)unused;
    if (!opy.signature_hook)
        Py_RETURN_NONE;
    return PyObject_CallOneArg(opy.signature_hook, self);
}

/* ((name, type, default text or None), ...) of the schema's arguments. */
static PyObject *op_get_arguments(PyObject *self, void *unused)
{
    (void)unused;
    opy_op *o = (opy_op *)self;
    opjit_op_info info = {.size = sizeof info};
    if (op_info(o, &info) < 0)
        return NULL;
    PyObject *t = PyTuple_New(info.nargs);
    for (int i = 0; t && i < info.nargs; i++) {
        opjit_arg_info a = {.size = sizeof a};
        PyObject *item = opjit_op_arg_get(o->rt->rt, o->op, i, &a)
                             ? opy_raise_status(o->rt->rt, OPJIT_EINVAL)
                             : Py_BuildValue("(ssz)", a.name, a.type,
                                             a.has_default ? a.default_text : NULL);
        if (!item)
            Py_CLEAR(t);
        else
            PyTuple_SET_ITEM(t, i, item);
    }
    return t;
}

static PyObject *op_get_runtime(PyObject *self, void *unused)
{
    (void)unused;
    return Py_NewRef((PyObject *)((opy_op *)self)->rt);
}

static PyObject *op_repr(PyObject *self)
{
    opjit_op_info info = {.size = sizeof info};
    if (op_info((opy_op *)self, &info) < 0)
        return NULL;
    PyObject *devices = op_get_devices(self, NULL);
    PyObject *tier = devices ? op_get_tier(self, NULL) : NULL;
    PyObject *r = tier ? PyUnicode_FromFormat("<opjit op %s on %R, tier %S>", info.schema,
                                              devices, tier)
                       : NULL;
    Py_XDECREF(devices);
    Py_XDECREF(tier);
    return r;
}

static Py_hash_t op_hash(PyObject *self)
{
    return Py_HashPointer_compat(((opy_op *)self)->op);
}

static PyObject *op_richcompare(PyObject *a, PyObject *b, int cmp)
{
    if (!PyObject_TypeCheck(b, &opy_op_type) || (cmp != Py_EQ && cmp != Py_NE))
        Py_RETURN_NOTIMPLEMENTED;
    int same = ((opy_op *)a)->op == ((opy_op *)b)->op;
    return PyBool_FromLong(cmp == Py_EQ ? same : !same);
}

static PyGetSetDef op_getset[] = {
    {"name", op_get_name, NULL, "the op's name (\"nms\")", NULL},
    {"schema", op_get_schema, NULL, "its schema, PyTorch's signature language", NULL},
    {"devices", op_get_devices, NULL, "devices with a kernel: (\"cpu\", \"cuda\")", NULL},
    {"tier", op_get_tier, NULL,
     "compiler tier serving the CPU kernel (else the first device's): \"tcc\" or \"opt\"", NULL},
    {"tiers", op_get_tiers, NULL, "{device: tier}", NULL},
    {"sources", op_get_sources, NULL, "{device: path of the source holding its kernel}", NULL},
    {"doc", op_get_doc, NULL, "the schema and the kernel's description", NULL},
    {"runtime", op_get_runtime, NULL, "the opjit.Runtime the op lives in", NULL},
    {"declarations", opy_op_declarations, NULL,
     "what the op's source declares: {'gradient': 'derivative' | 'not differentiable' | "
     "'undeclared', 'shape_rule': bool}, and for a derivative 'backward' (the backward op's "
     "name), 'inputs' (indices of the differentiable arguments, in the order the backward "
     "returns their gradients) and 'backward_args' (per backward argument, where its value "
     "comes from: ('grad', output), ('input', argument), ('output', output), ('mask', 0) or "
     "('default', 0))", NULL},
    {"__doc__", op_get_doc, NULL, NULL, NULL},  /* help(op): the schema and the doc */
    {"__name__", op_get_name, NULL, NULL, NULL},
    {"__signature__", op_get_signature, NULL, NULL, NULL},
    {"_arguments", op_get_arguments, NULL,
     "((name, type, default text or None), ...) of the schema's arguments", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef op_methods[] = {
    {"output_shapes", (PyCFunction)(void (*)(void))op_output_shapes,
     METH_FASTCALL | METH_KEYWORDS,
     "output_shapes(*args, **kwargs) -> ((shape, dtype, dynamic_dims), ...): what a call with "
     "these arguments would return, from the op's shape rule, reading no data. Tensors may be "
     "opjit.TensorMeta (no data). dynamic_dims: the dimensions whose size depends on the data "
     "(shape gives their upper bound). NotFoundError when the op declares no shape rule."},
    {NULL, NULL, 0, NULL},
};

PyTypeObject opy_op_type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "opjit.Op",
    .tp_doc = "A loaded operator: call it on tensors (positional or by the schema's names). "
              "Made by load_op() and list_ops().",
    .tp_basicsize = sizeof(opy_op),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL,
    .tp_vectorcall_offset = offsetof(opy_op, vectorcall),
    .tp_call = PyVectorcall_Call,
    .tp_dealloc = op_dealloc,
    .tp_repr = op_repr,
    .tp_hash = op_hash,
    .tp_richcompare = op_richcompare,
    .tp_getset = op_getset,
    .tp_methods = op_methods,
};
