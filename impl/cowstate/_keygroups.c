/* cowstate._keygroups: the key groups of one key or of many keys in one call.
 *
 * key_group(key, max_parallelism, long_keys) is one key's: the key context's
 * set_key (cowstate.keyed_state) routes the current key with it, -1 sending it
 * down the Python path.
 * key_groups(keys, max_parallelism, long_keys) returns, for every key of the
 * sequence ``keys``, cowstate.key_groups.assign_to_key_group(key,
 * max_parallelism, serializer) -- murmur_hash(java_hash(key)) % max_parallelism
 * -- where ``long_keys`` says whether the key serializer is a LongSerializer
 * (every int hashes as java.lang.Long), or -1 for a key this module does not
 * hash: the caller computes those in Python (cowstate.snapshot.checks).
 * first_not_in(keys, key_group, max_parallelism, long_keys, start) is the
 * restore's check without a list: the index of the first key from ``start``
 * on that is not confirmed to lie in ``key_group`` (another key group, or -1
 * above), or len(keys).
 *
 * Hashed here, exactly as cowstate.key_groups.java_hash does (the module
 * docstring there is the table; type checks are exact, as type(key) is ...):
 *
 *   bool                 1231 / 1237
 *   int in int32         the value (unless long_keys)
 *   int in int64         (int) (v ^ (v >>> 32))
 *   str                  31 * h + c over the UTF-16 code units (a code point
 *                        above U+FFFF is its surrogate pair)
 *   float                the long hash of doubleToLongBits (NaN canonical)
 *   bytes                Arrays.hashCode(byte[]): seed 1, signed bytes
 *   tuple                h = 31 * h + field over the fields, None fields 0,
 *                        from the first field's hash; () is 0; nested tuples
 *                        up to MAX_DEPTH levels
 *
 * Everything else -- ints beyond int64, subclasses, None, any other type, a
 * tuple holding one of them -- gives -1: the Python function hashes the key
 * serializer's bytes or raises. All arithmetic is uint32_t, which wraps
 * modulo 2**32 like Java's int; the results are compared with the Python
 * functions key by key in tests/test_restore_checks.py.
 *
 * The function calls no Python code (no __hash__, __eq__ or __index__), so it
 * holds the GIL throughout and the sequence cannot change under it.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH 32
#define UPPER_BOUND_MAX_PARALLELISM 32768

static uint32_t
long_hash(uint64_t v)
{
    return (uint32_t)(v ^ (v >> 32));
}

/* 1 and the Java hashCode of ``key`` in *out, or 0: not hashed here. */
static int
java_hash(PyObject *key, int long_keys, int depth, uint32_t *out)
{
    if (PyBool_Check(key)) {
        *out = key == Py_True ? 1231u : 1237u;
        return 1;
    }
    if (PyLong_CheckExact(key)) {
        int overflow = 0;
        long long v = PyLong_AsLongLongAndOverflow(key, &overflow);
        if (overflow != 0)
            return 0;
        if (!long_keys && v >= INT32_MIN && v <= INT32_MAX)
            *out = (uint32_t)(int32_t)v;
        else
            *out = long_hash((uint64_t)v);
        return 1;
    }
    if (PyUnicode_CheckExact(key)) {
#if PY_VERSION_HEX < 0x030C0000
        if (PyUnicode_READY(key) < 0) {
            PyErr_Clear();
            return 0;
        }
#endif
        int kind = PyUnicode_KIND(key);
        const void *data = PyUnicode_DATA(key);
        Py_ssize_t n = PyUnicode_GET_LENGTH(key);
        uint32_t h = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            Py_UCS4 c = PyUnicode_READ(kind, data, i);
            if (c > 0xFFFF) {
                c -= 0x10000;
                h = 31u * h + (uint32_t)(0xD800 + (c >> 10));
                h = 31u * h + (uint32_t)(0xDC00 + (c & 0x3FF));
            }
            else {
                h = 31u * h + (uint32_t)c;
            }
        }
        *out = h;
        return 1;
    }
    if (PyFloat_CheckExact(key)) {
        double d = PyFloat_AS_DOUBLE(key);
        uint64_t bits;
        if (d != d)
            bits = 0x7FF8000000000000ULL;
        else
            memcpy(&bits, &d, sizeof bits);
        *out = long_hash(bits);
        return 1;
    }
    if (PyBytes_CheckExact(key)) {
        const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(key);
        Py_ssize_t n = PyBytes_GET_SIZE(key);
        uint32_t h = 1;
        for (Py_ssize_t i = 0; i < n; i++)
            h = 31u * h + (uint32_t)(int32_t)(signed char)data[i];
        *out = h;
        return 1;
    }
    if (PyTuple_CheckExact(key)) {
        if (depth >= MAX_DEPTH)
            return 0;
        Py_ssize_t n = PyTuple_GET_SIZE(key);
        uint32_t h = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *field = PyTuple_GET_ITEM(key, i);
            uint32_t code = 0;
            if (field != Py_None && !java_hash(field, long_keys, depth + 1, &code))
                return 0;
            h = i == 0 ? code : 31u * h + code;
        }
        *out = h;
        return 1;
    }
    return 0;
}

/* Flink's MathUtils.murmurHash(code) % max_parallelism. */
static long
key_group_of(uint32_t code, long max_parallelism)
{
    uint32_t c = code * 0xCC9E2D51u;
    c = (c << 15) | (c >> 17);
    c *= 0x1B873593u;
    c = (c << 13) | (c >> 19);
    c = c * 5u + 0xE6546B64u;
    c ^= 4u;
    c ^= c >> 16; /* bitMix */
    c *= 0x85EBCA6Bu;
    c ^= c >> 13;
    c *= 0xC2B2AE35u;
    c ^= c >> 16;
    int32_t mixed = (int32_t)c;
    uint32_t positive;
    if (mixed >= 0)
        positive = (uint32_t)mixed;
    else if (mixed != INT32_MIN)
        positive = (uint32_t)(-(int64_t)mixed);
    else
        positive = 0;
    return (long)(positive % (uint32_t)max_parallelism);
}

/* The max_parallelism and long_keys arguments both functions take; -1 with an
 * exception set if either is invalid. */
static int
parse_hashing(PyObject *max_parallelism_arg, PyObject *long_keys_arg, long *max_parallelism,
              int *long_keys)
{
    *max_parallelism = PyLong_AsLong(max_parallelism_arg);
    if (*max_parallelism == -1 && PyErr_Occurred())
        return -1;
    if (*max_parallelism < 1 || *max_parallelism > UPPER_BOUND_MAX_PARALLELISM) {
        PyErr_Format(PyExc_ValueError, "expected max_parallelism in 1..%d, got %ld",
                     UPPER_BOUND_MAX_PARALLELISM, *max_parallelism);
        return -1;
    }
    *long_keys = PyObject_IsTrue(long_keys_arg);
    return *long_keys < 0 ? -1 : 0;
}

static PyObject *
key_groups(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError,
                     "key_groups() takes keys, max_parallelism and long_keys, got %zd arguments",
                     nargs);
        return NULL;
    }
    long max_parallelism;
    int long_keys;
    if (parse_hashing(args[1], args[2], &max_parallelism, &long_keys) < 0)
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "expected a sequence of keys");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    PyObject *out = PyList_New(n);
    if (out == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        uint32_t code;
        long group = java_hash(items[i], long_keys, 0, &code)
                         ? key_group_of(code, max_parallelism)
                         : -1;
        PyObject *value = PyLong_FromLong(group);
        if (value == NULL) {
            Py_DECREF(out);
            Py_DECREF(seq);
            return NULL;
        }
        PyList_SET_ITEM(out, i, value);
    }
    Py_DECREF(seq);
    return out;
}

/* key_group(key, max_parallelism, long_keys): one key's, for the key context's
 * set_key (cowstate.keyed_state) -- what key_groups() gives for [key], without
 * the list. */
static PyObject *
key_group(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError,
                     "key_group() takes key, max_parallelism and long_keys, got %zd arguments",
                     nargs);
        return NULL;
    }
    long max_parallelism;
    int long_keys;
    if (parse_hashing(args[1], args[2], &max_parallelism, &long_keys) < 0)
        return NULL;
    uint32_t code;
    return PyLong_FromLong(java_hash(args[0], long_keys, 0, &code)
                               ? key_group_of(code, max_parallelism)
                               : -1);
}

static PyObject *
first_not_in(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError,
                     "first_not_in() takes keys, key_group, max_parallelism, long_keys and "
                     "start, got %zd arguments",
                     nargs);
        return NULL;
    }
    long key_group = PyLong_AsLong(args[1]);
    if (key_group == -1 && PyErr_Occurred())
        return NULL;
    long max_parallelism;
    int long_keys;
    if (parse_hashing(args[2], args[3], &max_parallelism, &long_keys) < 0)
        return NULL;
    Py_ssize_t start = PyLong_AsSsize_t(args[4]);
    if (start == -1 && PyErr_Occurred())
        return NULL;
    PyObject *seq = PySequence_Fast(args[0], "expected a sequence of keys");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t i = start < 0 ? 0 : start;
    for (; i < n; i++) {
        uint32_t code;
        if (!java_hash(items[i], long_keys, 0, &code)
            || key_group_of(code, max_parallelism) != key_group)
            break;
    }
    Py_DECREF(seq);
    return PyLong_FromSsize_t(i < n ? i : n);
}

static PyMethodDef keygroups_methods[] = {
    {"first_not_in", (PyCFunction)(void (*)(void))first_not_in, METH_FASTCALL,
     "first_not_in(keys, key_group, max_parallelism, long_keys, start, /) -> int\n\n"
     "The index of the first key from start on that is not confirmed to be in\n"
     "key_group (another key group, or a key hashed only in Python), or len(keys)."},
    {"key_group", (PyCFunction)(void (*)(void))key_group, METH_FASTCALL,
     "key_group(key, max_parallelism, long_keys, /) -> int\n\n"
     "The key group of one key (-1 for a key hashed only in Python)."},
    {"key_groups", (PyCFunction)(void (*)(void))key_groups, METH_FASTCALL,
     "key_groups(keys, max_parallelism, long_keys, /) -> list[int]\n\n"
     "The key group of every key (-1 for a key hashed only in Python)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef keygroups_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cowstate._keygroups",
    .m_doc = "Key groups of many keys in C (design: the header of _keygroups.c).",
    .m_size = -1,
    .m_methods = keygroups_methods,
};

PyMODINIT_FUNC
PyInit__keygroups(void)
{
    return PyModule_Create(&keygroups_module);
}
