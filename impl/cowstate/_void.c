/*
 * _void.c -- cowstate._void: VOID_NAMESPACE as an object the collector never sees
 * ===============================================================================
 *
 * VOID_NAMESPACE is the namespace of every keyed state that has none, so it is
 * the namespace of almost every entry of a backend's maps. The C map lets the
 * garbage collector skip a map whose live entries hold no object of a GC type
 * (its invariant 12: `gc_entries`), and a class written in Python is always a
 * GC type (CPython gives every heap type Py_TPFLAGS_HAVE_GC). So the singleton
 * is an instance of this static type, which has no Py_TPFLAGS_HAVE_GC: a
 * backend of int or str states then costs a full collection nothing, as a
 * dict of such does (issue 28).
 *
 * What it is, exactly as the pure-Python class of cowstate.void_namespace
 * (the fallback when this extension is not built; both types name
 * cowstate.keyed_state, the singleton's public home):
 *
 *   - one instance: VoidNamespace() returns it; the type cannot be subclassed;
 *   - hash 99 (Flink's VoidNamespace.hashCode()), equal to itself only;
 *   - repr and str "VOID_NAMESPACE";
 *   - __reduce__ returns "VOID_NAMESPACE": pickle stores a reference to
 *     cowstate.keyed_state.VOID_NAMESPACE (the type's __module__), and copy
 *     and deepcopy return the instance itself;
 *   - no instance dict, no weak references: nothing it holds for a collector
 *     to traverse.
 *
 * The instance is created at import and never freed (the module holds it);
 * its deallocation would be a reference-count bug, reported as None's is.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

typedef struct {
    PyObject_HEAD
} VoidObject;

static PyTypeObject Void_Type;
static PyObject *the_void;       /* the singleton; a strong reference held for good */

static PyObject *Void_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0)) {
        PyErr_SetString(PyExc_TypeError, "VoidNamespace() takes no arguments");
        return NULL;
    }
    return Py_NewRef(the_void);
}

static void Void_dealloc(PyObject *self)
{
    Py_FatalError("deallocating VOID_NAMESPACE");          /* a reference-count bug */
}

static PyObject *Void_repr(PyObject *self)
{
    return PyUnicode_FromString("VOID_NAMESPACE");
}

static Py_hash_t Void_hash(PyObject *self)
{
    return 99;                                             /* VoidNamespace.hashCode() */
}

static PyObject *Void_richcompare(PyObject *self, PyObject *other, int op)
{
    if (op == Py_EQ)
        return PyBool_FromLong(self == other);
    if (op == Py_NE)
        return PyBool_FromLong(self != other);
    Py_RETURN_NOTIMPLEMENTED;
}

static PyObject *Void_reduce(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyUnicode_FromString("VOID_NAMESPACE");         /* pickled by reference */
}

/* The instance's __module__ (a static type's own comes from tp_name, for the
 * type only): where pickle finds VOID_NAMESPACE again, with or without this
 * extension built. */
static PyObject *Void_module(PyObject *self, void *Py_UNUSED(closure))
{
    return PyUnicode_FromString("cowstate.keyed_state");
}

static PyGetSetDef Void_getset[] = {
    {"__module__", Void_module, NULL, "cowstate.keyed_state", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMethodDef Void_methods[] = {
    {"__reduce__", Void_reduce, METH_NOARGS,
     "The global name VOID_NAMESPACE: pickled by reference, copied as itself."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject Void_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cowstate.keyed_state.VoidNamespace",
    .tp_basicsize = sizeof(VoidObject),
    .tp_dealloc = Void_dealloc,
    .tp_repr = Void_repr,
    .tp_hash = Void_hash,
    .tp_flags = Py_TPFLAGS_DEFAULT,                        /* no HAVE_GC, no BASETYPE */
    .tp_doc = PyDoc_STR("The namespace of state that has none (Flink's VoidNamespace): "
                        "a singleton the garbage collector never tracks."),
    .tp_richcompare = Void_richcompare,
    .tp_methods = Void_methods,
    .tp_getset = Void_getset,
    .tp_new = Void_new,
};

static struct PyModuleDef void_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cowstate._void",
    .m_doc = "VOID_NAMESPACE as an instance of a type without Py_TPFLAGS_HAVE_GC.",
    .m_size = -1,
};

PyMODINIT_FUNC PyInit__void(void)
{
    if (PyType_Ready(&Void_Type) < 0)
        return NULL;
    if (the_void == NULL) {
        the_void = (PyObject *)PyObject_New(VoidObject, &Void_Type);
        if (the_void == NULL)
            return NULL;
    }
    PyObject *module = PyModule_Create(&void_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "VoidNamespace", (PyObject *)&Void_Type) < 0
        || PyModule_AddObjectRef(module, "VOID_NAMESPACE", the_void) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
