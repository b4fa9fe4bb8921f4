/*
 * python/src/inline.c - opjit.load_inline's C half: a module from a string
 * (opjit_load_inline, the GIL released while it compiles), handed back as
 * the list of its ops. opjit/_inline.py makes the module object.
 */
#include "opjit_py.h"

typedef struct op_vec {
    const opjit_op *v[64];
    int n, more;
} op_vec;

/* opjit_module_ops' callback: collects only. */
static int collect(void *ud, const opjit_op *op)
{
    op_vec *ops = ud;
    if (ops->n == (int)(sizeof ops->v / sizeof ops->v[0]))
        return ops->more = 1;
    ops->v[ops->n++] = op;
    return 0;
}

/* [the op named after the module (else its first), then the others]. */
static PyObject *module_ops(opy_runtime *r, opjit_runtime *rt, opjit_op *first)
{
    op_vec ops = {.n = 0};
    int rc = opjit_module_ops(rt, first, collect, &ops);
    if (rc)
        return opy_raise_status(rt, rc);
    if (ops.more)
        return opy_raise(opy.Error, OPJIT_EINVAL, "a module from a string may register at most "
                         "%d ops for Python", (int)(sizeof ops.v / sizeof ops.v[0]));
    PyObject *list = PyList_New(0);
    PyObject *op = list ? opy_op_new(r, first) : NULL;
    if (!op || PyList_Append(list, op) < 0)
        Py_CLEAR(list);
    Py_XDECREF(op);
    for (int i = 0; list && i < ops.n; i++) {
        if (ops.v[i] == first)
            continue;
        op = opy_op_new(r, (opjit_op *)ops.v[i]);
        if (!op || PyList_Append(list, op) < 0)
            Py_CLEAR(list);
        Py_XDECREF(op);
    }
    return list;
}

PyObject *opy_load_inline(PyObject *self, PyObject *args)
{
    (void)self;
    PyObject *rtobj, *name, *source, *inc = Py_None, *inc_b = NULL;
    if (!PyArg_ParseTuple(args, "O!UU|O:_load_inline", &opy_runtime_type, &rtobj, &name, &source,
                          &inc))
        return NULL;
    opy_runtime *r = (opy_runtime *)rtobj;
    Py_ssize_t len;
    const char *n = PyUnicode_AsUTF8(name);
    const char *text = n ? PyUnicode_AsUTF8AndSize(source, &len) : NULL;
    if (!text)
        return NULL;
    if ((size_t)len != strlen(text))
        return PyErr_Format(PyExc_ValueError, "load_inline: the source of %U holds a NUL "
                            "character", name);
    if (inc != Py_None && !PyUnicode_FSConverter(inc, &inc_b))
        return NULL;
    opy_use use;
    opjit_runtime *rt = opy_runtime_enter(r, &use);
    if (!rt) {
        Py_XDECREF(inc_b);
        return NULL;
    }
    opjit_op *op = NULL;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = opjit_load_inline(rt, n, text, inc_b ? PyBytes_AS_STRING(inc_b) : NULL, &op, NULL);
    Py_END_ALLOW_THREADS
    Py_XDECREF(inc_b);
    opy_log_flush();
    PyObject *result = rc ? opy_raise_status(rt, rc) : module_ops(r, rt, op);
    opy_runtime_leave(&use);
    return result;
}
