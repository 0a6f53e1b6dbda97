/*
 * _codecmodule.c -- cowstate._codec: the C codec (_codec.c) for Python
 * =====================================================================
 *
 * The library's encoders and decoders (design: the header of _codec.c),
 * and the two loops the Python snapshot writer and reader run through them
 * (cowstate.snapshot.ccodec chooses when):
 *
 * encode(kind, value) -> bytes | None, decode(kind, data) -> object | FALLBACK,
 * crc32(data, start=0): one value; None / FALLBACK mean "the Python
 * serializer decides" (it encodes or decodes, or raises its own error).
 *
 * encode_section(items, key_kind, key_serialize, namespace_kind,
 * namespace_serialize, state_kind, state_serialize): the entries of one state
 * in one key group, `items` a list of (key, namespace, state) tuples, framed
 * as the snapshot format's block payload frames them (per entry: u32 length
 * + namespace bytes, u32 length + key bytes, u32 length + state bytes), as
 * bytes. Each value is encoded in C when its kind is built in, else (kind
 * KIND_PYTHON, or a value the C encoder hands back) by its Python serializer,
 * called exactly once per value in the Python writer's order (namespace, key,
 * state, entry by entry); a serializer's exception propagates as it is. A
 * serializer that returns something other than exact bytes (a bytearray, a
 * memoryview, a wrong type) turns the result into the list of (namespace,
 * key, state) rows the Python writer would have built -- the Python writer
 * then frames them (or fails) exactly as before. Returns None, calling no
 * serializer, when `items` is not a list of 3-tuples (tuples, or tuple
 * subclasses such as StateEntry that iterate as tuples do); the Python loop
 * then handles it.
 *
 * A section of at least RELEASE_AT_ENTRIES entries whose three kinds are all
 * built in is framed with the GIL released (frame_without_gil: cs_encode
 * without the GIL, immutable values only) up to its first entry that needs
 * the GIL -- a list, dict or set state, a value handed back to Python -- and
 * from there on with the GIL held, so the owner runs beside the writer while
 * it encodes immutable entries.
 *
 * decode_section(payload, position, entries, key_kind, state_kind, decoder,
 * key_group, block) -> (position, done): the hot loop of
 * cowstate.snapshot.reader._decoded_section in C, appending to the
 * DecodedBlock `block`'s columns. It stops before an entry it cannot finish
 * as the Python loop would -- a field past the block's end, a value the C
 * decoder hands back -- and returns where: the Python loop goes on from
 * that entry and raises the Python errors itself; a key or state decoded
 * to None it refuses itself with E1's error, for every entry (the Python
 * loop's check, in C) (built-in decoders run first, being pure, so no deserializer of
 * the user's is called twice). A user deserializer's Exception becomes
 * checks.undecodable_error(...) chained from it (`raise ... from exc`), a
 * BaseException passes, and namespaces go through the decoder's cache and
 * decode_namespace (which raises E1/E2 itself), as in Python.
 *
 * write_blocks(...) and snapshot_type(): the snapshot writer in C, which
 * frames whole blocks straight from C map snapshots (_writer.c; its header
 * is the design, and says what runs without the GIL); freeze_changes(...):
 * a heap delta's changes held apart from their snapshot (_writer.c, "Frozen
 * changes").
 *
 * flat_removals(pairs) -> FrozenChanges: the (key, namespace) pairs of a list, as
 * write_blocks' frozen changes of a heap-removals file: key, namespace and
 * b"" (the empty state) per pair, flat. A TypeError names the first item
 * that is not a 2-tuple.
 *
 * encode_without_gil(kind, values, rounds): a test hook. It encodes every
 * value of the list `values` `rounds` times with the GIL released (the path
 * the C snapshot writer takes for immutable values), and returns per value
 * its bytes, "fallback" or "needs-gil".
 *
 * Test knob: -DCOWSTATE_CODEC_BUG=2 plants "E1 checked for the first entry
 * of a block only" in decode_section (1 is _codec.c's);
 * cowstate_spec.bad_codecs builds it, and E1's test must catch it.
 *
 * Reference counts: every object taken from a tuple, list or dict here is
 * borrowed while its container is held (items is copied into a private list
 * first); everything a call returns is owned and released on every path.
 */
#include "_codec.h"
#include "_writer.h"

#include <stdint.h>
#include <string.h>

#ifndef COWSTATE_CODEC_MODULE
#define COWSTATE_CODEC_MODULE _codec
#endif
#ifndef COWSTATE_CODEC_BUG
#define COWSTATE_CODEC_BUG 0
#endif
/* The planted bug of this module (1, in _codec.c: a non-ASCII length). */
#define CODEC_BUG_E1_FIRST_ENTRY_ONLY 2
#define STR_(x) #x
#define STR(x) STR_(x)
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

static PyObject *FALLBACK;            /* the sentinel decode() returns */
static PyObject *fn_undecodable_error; /* cowstate.snapshot.checks, looked up late */
static PyObject *fn_none_error;

/* 1 when nargs is within [lo, hi], else 0 with a TypeError. */
static int check_args(const char *name, Py_ssize_t nargs, Py_ssize_t lo, Py_ssize_t hi)
{
    if (nargs >= lo && nargs <= hi)
        return 1;
    PyErr_Format(PyExc_TypeError, "%s() takes %zd to %zd positional arguments (%zd given)", name,
                 lo, hi, nargs);
    return 0;
}

static int parse_kind(PyObject *arg, int allow_python, cs_kind *kind)
{
    long k = PyLong_AsLong(arg);
    if (k == -1 && PyErr_Occurred())
        return -1;
    if (k < (allow_python ? 0 : 1) || k >= CS_KIND_COUNT) {
        PyErr_Format(PyExc_ValueError, "expected a codec kind %s to %d, got %ld",
                     allow_python ? "0" : "1", CS_KIND_COUNT - 1, k);
        return -1;
    }
    *kind = (cs_kind)k;
    return 0;
}

static PyObject *buf_to_bytes(cs_buf *b)
{
    PyObject *r = PyBytes_FromStringAndSize((const char *)b->data, (Py_ssize_t)b->len);
    cs_buf_free(b);
    return r;
}

/* ------------------------------------------------------------ one value */

static PyObject *m_encode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    cs_kind kind;
    if (!check_args("encode", nargs, 2, 2) || parse_kind(args[0], 0, &kind) < 0)
        return NULL;
    cs_prepare();
    cs_buf b;
    cs_buf_init(&b);
    cs_status status = cs_encode(kind, args[1], &b, 1);
    if (status == CS_OK)
        return buf_to_bytes(&b);
    cs_buf_free(&b);
    if (status == CS_NOMEM)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *m_decode(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    cs_kind kind;
    if (!check_args("decode", nargs, 2, 2) || parse_kind(args[0], 0, &kind) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    cs_status status;
    PyObject *v = cs_decode(kind, view.buf, view.len, &status);
    PyBuffer_Release(&view);
    if (v == NULL && status == CS_FALLBACK)
        return Py_NewRef(FALLBACK);
    return v;
}

static PyObject *m_flat_removals(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 1 || !PyList_CheckExact(args[0])) {
        PyErr_SetString(PyExc_TypeError, "flat_removals() takes one list of (key, namespace)");
        return NULL;
    }
    PyObject *pairs = args[0];
    Py_ssize_t n = PyList_GET_SIZE(pairs);
    PyObject *empty = PyBytes_FromStringAndSize(NULL, 0); /* the singleton: no collection */
    if (empty == NULL)
        return NULL;
    PyObject *flat = cw_frozen_new(3 * n);
    if (flat == NULL) {
        Py_DECREF(empty);
        return NULL;
    }
    /* Read after the allocation, which may run a collection whose finalizer
     * changes the list; nothing below runs Python code. */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i >= PyList_GET_SIZE(pairs)) {
            PyErr_SetString(PyExc_RuntimeError, "the removals changed while they were read");
            goto failed;
        }
        PyObject *pair = PyList_GET_ITEM(pairs, i);
        if (!PyTuple_CheckExact(pair) || PyTuple_GET_SIZE(pair) != 2) {
            PyErr_Format(PyExc_TypeError, "expected (key, namespace) pairs, got %.100s at %zd",
                         Py_TYPE(pair)->tp_name, i);
            goto failed;
        }
        PyObject **items = cw_frozen_items(flat) + 3 * i;
        items[0] = Py_NewRef(PyTuple_GET_ITEM(pair, 0));
        items[1] = Py_NewRef(PyTuple_GET_ITEM(pair, 1));
        items[2] = Py_NewRef(empty);
    }
    Py_DECREF(empty);
    return flat;
failed:
    Py_DECREF(flat); /* the items filled so far; the rest are NULL */
    Py_DECREF(empty);
    return NULL;
}

static PyObject *m_crc32(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!check_args("crc32", nargs, 1, 2))
        return NULL;
    uint32_t start = 0;
    if (nargs == 2) {
        unsigned long v = PyLong_AsUnsignedLongMask(args[1]); /* as zlib.crc32: bitwise */
        if (v == (unsigned long)-1 && PyErr_Occurred())
            return NULL;
        start = (uint32_t)v;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    uint32_t crc;
    if (view.len > 65536) { /* the export pins the buffer: no GIL needed to read it */
        Py_BEGIN_ALLOW_THREADS
        crc = cs_crc32(start, view.buf, (size_t)view.len);
        Py_END_ALLOW_THREADS
    }
    else
        crc = cs_crc32(start, view.buf, (size_t)view.len);
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong(crc);
}

/* -------------------------------------------------------- encode_section */

/* The rows (namespace, key, state) of the fully framed entries in
 * b[0, end), appended to `rows`; 0 or -1. */
static int rows_from_frames(const cs_buf *b, size_t end, PyObject *rows)
{
    size_t p = 0;
    while (p < end) {
        PyObject *fields[3];
        for (int r = 0; r < 3; r++) {
            uint32_t n = (uint32_t)b->data[p] << 24 | (uint32_t)b->data[p + 1] << 16
                | (uint32_t)b->data[p + 2] << 8 | b->data[p + 3];
            fields[r] = PyBytes_FromStringAndSize((const char *)b->data + p + 4, n);
            p += 4 + (size_t)n;
            if (fields[r] == NULL) {
                for (int k = 0; k < r; k++)
                    Py_DECREF(fields[k]);
                return -1;
            }
        }
        PyObject *row = PyTuple_Pack(3, fields[0], fields[1], fields[2]);
        for (int k = 0; k < 3; k++)
            Py_DECREF(fields[k]);
        if (row == NULL || PyList_Append(rows, row) < 0) {
            Py_XDECREF(row);
            return -1;
        }
        Py_DECREF(row);
    }
    return 0;
}

/* Sections of fewer entries are framed with the GIL held: releasing it costs
 * little, taking it back may wait for the owner's switch interval (5 ms). */
#define RELEASE_AT_ENTRIES 1024

static inline void put_u32_at(unsigned char *at, uint32_t v)
{
    at[0] = (unsigned char)(v >> 24);
    at[1] = (unsigned char)(v >> 16);
    at[2] = (unsigned char)(v >> 8);
    at[3] = (unsigned char)v;
}

/* Frame entries of `items` (a private list of 3-tuples, whose tuples and
 * their items it holds) from the first on, WITHOUT the GIL: only cs_encode
 * with gil_held = 0, which reads immutable objects only (_codec.c's header),
 * and the list's and tuples' item arrays, which nothing else can change (the
 * list is ours alone, tuples are immutable). Returns the index of the first
 * entry not framed (n when all were), its bytes removed again from `b`. */
static Py_ssize_t frame_without_gil(PyObject *items, Py_ssize_t n, const cs_kind kinds[3],
                                    cs_buf *b, int *nomem)
{
    static const int item_index[3] = {1, 0, 2};
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(items, i);
        size_t entry_start = b->len;
        for (int r = 0; r < 3; r++) {
            if (cs_buf_reserve(b, 4) < 0) {
                *nomem = 1;
                return i;
            }
            size_t at = b->len;
            b->len += 4;
            cs_status status = cs_encode(kinds[r], PyTuple_GET_ITEM(t, item_index[r]), b, 0);
            if (status == CS_OK && b->len - at - 4 <= 0xFFFFFFFFu) {
                put_u32_at(b->data + at, (uint32_t)(b->len - at - 4));
                continue;
            }
            *nomem = status == CS_NOMEM;
            b->len = entry_start; /* this entry again, with the GIL */
            return i;
        }
    }
    return n;
}

/* The owned bytes (or object) of one value: C when it can, else Python. */
static PyObject *encode_one(cs_kind kind, PyObject *serialize, PyObject *obj, cs_buf *scratch)
{
    if (kind != CS_KIND_PYTHON) {
        scratch->len = 0;
        cs_status status = cs_encode(kind, obj, scratch, 1);
        if (status == CS_OK)
            return PyBytes_FromStringAndSize((const char *)scratch->data,
                                             (Py_ssize_t)scratch->len);
        if (status == CS_NOMEM)
            return PyErr_NoMemory();
    }
    return PyObject_CallOneArg(serialize, obj);
}

static PyObject *m_encode_section(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!check_args("encode_section", nargs, 7, 7))
        return NULL;
    /* roles in the order the Python writer calls them: namespace, key, state */
    static const int item_index[3] = {1, 0, 2};
    cs_kind kinds[3];
    PyObject *serializers[3] = {args[4], args[2], args[6]};
    if (parse_kind(args[3], 1, &kinds[0]) < 0 || parse_kind(args[1], 1, &kinds[1]) < 0
        || parse_kind(args[5], 1, &kinds[2]) < 0)
        return NULL;
    PyObject *items = args[0];
    if (!PyList_CheckExact(items))
        Py_RETURN_NONE;
    /* A private copy: what serializers run cannot change what is iterated. */
    PyObject *copy = PyList_GetSlice(items, 0, PY_SSIZE_T_MAX);
    if (copy == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(copy);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(copy, i);
        /* a tuple, or a subclass unpacked as one (StateEntry): not its own __iter__ */
        if (!PyTuple_Check(t) || Py_TYPE(t)->tp_iter != PyTuple_Type.tp_iter
            || PyTuple_GET_SIZE(t) != 3) {
            Py_DECREF(copy);
            Py_RETURN_NONE;
        }
    }
    cs_prepare();
    cs_buf b, scratch;
    cs_buf_init(&b);
    cs_buf_init(&scratch);
    PyObject *rows = NULL; /* set once a value cannot be framed here */
    PyObject *fields[3] = {NULL, NULL, NULL};
    Py_ssize_t i = 0;
    if (n >= RELEASE_AT_ENTRIES && kinds[0] != CS_KIND_PYTHON && kinds[1] != CS_KIND_PYTHON
        && kinds[2] != CS_KIND_PYTHON) {
        /* Without the GIL until an entry needs it: then the rest with it (taking
         * the GIL back may wait for the owner's switch interval: once per section) */
        int nomem = 0;
        Py_BEGIN_ALLOW_THREADS
        i = frame_without_gil(copy, n, kinds, &b, &nomem);
        Py_END_ALLOW_THREADS
        if (nomem) {
            PyErr_NoMemory();
            goto error;
        }
    }
    for (; i < n; i++) {
        PyObject *t = PyList_GET_ITEM(copy, i);
        size_t entry_start = b.len;
        for (int r = 0; r < 3; r++) {
            PyObject *obj = PyTuple_GET_ITEM(t, item_index[r]);
            if (rows != NULL) {
                fields[r] = encode_one(kinds[r], serializers[r], obj, &scratch);
                if (fields[r] == NULL)
                    goto error;
                continue;
            }
            if (cs_buf_reserve(&b, 4) < 0) {
                PyErr_NoMemory();
                goto error;
            }
            size_t at = b.len;
            b.len += 4;
            PyObject *result = NULL;
            if (kinds[r] != CS_KIND_PYTHON) {
                cs_status status = cs_encode(kinds[r], obj, &b, 1);
                if (status == CS_NOMEM) {
                    PyErr_NoMemory();
                    goto error;
                }
                if (status == CS_OK && b.len - at - 4 <= 0xFFFFFFFFu) {
                    uint32_t len = (uint32_t)(b.len - at - 4);
                    b.data[at] = (unsigned char)(len >> 24);
                    b.data[at + 1] = (unsigned char)(len >> 16);
                    b.data[at + 2] = (unsigned char)(len >> 8);
                    b.data[at + 3] = (unsigned char)len;
                    continue;
                }
                if (status == CS_OK) { /* too long for a u32 frame: as Python fails */
                    result = PyBytes_FromStringAndSize((const char *)b.data + at + 4,
                                                       (Py_ssize_t)(b.len - at - 4));
                    if (result == NULL)
                        goto error;
                }
            }
            if (result == NULL) {
                result = PyObject_CallOneArg(serializers[r], obj);
                if (result == NULL)
                    goto error;
                if (PyBytes_CheckExact(result)
                    && (size_t)PyBytes_GET_SIZE(result) <= 0xFFFFFFFFu) {
                    size_t len = (size_t)PyBytes_GET_SIZE(result);
                    if (cs_buf_reserve(&b, len) < 0) {
                        Py_DECREF(result);
                        PyErr_NoMemory();
                        goto error;
                    }
                    b.data[at] = (unsigned char)(len >> 24);
                    b.data[at + 1] = (unsigned char)(len >> 16);
                    b.data[at + 2] = (unsigned char)(len >> 8);
                    b.data[at + 3] = (unsigned char)len;
                    memcpy(b.data + b.len, PyBytes_AS_STRING(result), len);
                    b.len += len;
                    Py_DECREF(result);
                    continue;
                }
            }
            /* Rows from here on: the entries before, this entry's fields so far. */
            rows = PyList_New(0);
            if (rows == NULL || rows_from_frames(&b, entry_start, rows) < 0) {
                Py_DECREF(result);
                goto error;
            }
            size_t p = entry_start;
            for (int k = 0; k < r; k++) {
                uint32_t len = (uint32_t)b.data[p] << 24 | (uint32_t)b.data[p + 1] << 16
                    | (uint32_t)b.data[p + 2] << 8 | b.data[p + 3];
                fields[k] = PyBytes_FromStringAndSize((const char *)b.data + p + 4, len);
                p += 4 + (size_t)len;
                if (fields[k] == NULL) {
                    Py_DECREF(result);
                    goto error;
                }
            }
            fields[r] = result; /* owned */
            cs_buf_free(&b);
        }
        if (rows != NULL) {
            PyObject *row = PyTuple_Pack(3, fields[0], fields[1], fields[2]);
            for (int k = 0; k < 3; k++)
                Py_CLEAR(fields[k]);
            if (row == NULL || PyList_Append(rows, row) < 0) {
                Py_XDECREF(row);
                goto error;
            }
            Py_DECREF(row);
        }
    }
    Py_DECREF(copy);
    cs_buf_free(&scratch);
    if (rows != NULL) {
        cs_buf_free(&b);
        return rows;
    }
    return buf_to_bytes(&b);
error:
    for (int k = 0; k < 3; k++)
        Py_CLEAR(fields[k]);
    Py_XDECREF(rows);
    Py_DECREF(copy);
    cs_buf_free(&b);
    cs_buf_free(&scratch);
    return NULL;
}

/* -------------------------------------------------------- decode_section */

static int load_checks(void)
{
    if (fn_none_error != NULL)
        return 0;
    PyObject *checks = PyImport_ImportModule("cowstate.snapshot.checks");
    if (checks == NULL)
        return -1;
    fn_undecodable_error = PyObject_GetAttrString(checks, "undecodable_error");
    fn_none_error = fn_undecodable_error == NULL
        ? NULL : PyObject_GetAttrString(checks, "none_error");
    Py_DECREF(checks);
    if (fn_none_error == NULL) {
        Py_CLEAR(fn_undecodable_error);
        return -1;
    }
    return 0;
}

/* `raise undecodable_error(name, key_group, exc) from exc` for the pending
 * exception when it is an Exception; anything else passes as it is. */
static void raise_undecodable(PyObject *name, PyObject *key_group)
{
    if (!PyErr_ExceptionMatches(PyExc_Exception))
        return;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    if (tb != NULL)
        PyException_SetTraceback(value, tb);
    PyObject *err = PyObject_CallFunctionObjArgs(fn_undecodable_error, name, key_group, value,
                                                 NULL);
    Py_DECREF(type);
    Py_XDECREF(tb);
    if (err == NULL) {
        Py_DECREF(value);
        return;
    }
    PyException_SetCause(err, Py_NewRef(value)); /* steals; suppresses the context */
    PyException_SetContext(err, value);          /* steals our reference */
    PyErr_Restore(Py_NewRef((PyObject *)Py_TYPE(err)), err, NULL);
}

static void raise_none(PyObject *name, PyObject *key_group, const char *role)
{
    PyObject *err = PyObject_CallFunction(fn_none_error, "OOs", name, key_group, role);
    if (err != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(err), err);
        Py_DECREF(err);
    }
}

static inline uint32_t u32_at(const unsigned char *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* One field: its bytes at *at, its length in *len; the position after it
 * (maybe past `end`: the caller checks), or -1 if its length is cut off. */
static Py_ssize_t field(const unsigned char *base, Py_ssize_t pos, Py_ssize_t end,
                        Py_ssize_t *at, Py_ssize_t *len)
{
    if (pos < 0 || end - pos < 4)
        return -1;
    *len = (Py_ssize_t)u32_at(base + pos);
    *at = pos + 4;
    return *at + *len;
}

/* A value of one entry: C for a built-in kind (NULL with *stop = 1: hand the
 * entry back to Python), else the Python deserializer. */
static PyObject *decode_built_in(cs_kind kind, const unsigned char *p, Py_ssize_t len, int *stop)
{
    cs_status status;
    PyObject *v = cs_decode(kind, p, len, &status);
    if (v == NULL && status == CS_FALLBACK)
        *stop = 1;
    return v;
}

static PyObject *m_decode_section(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (!check_args("decode_section", nargs, 8, 8))
        return NULL;
    PyObject *payload = args[0];
    if (!PyBytes_CheckExact(payload)) {
        PyErr_Format(PyExc_TypeError, "expected the payload as bytes, got %.100s",
                     Py_TYPE(payload)->tp_name);
        return NULL;
    }
    Py_ssize_t pos = PyLong_AsSsize_t(args[1]);
    Py_ssize_t entries = PyLong_AsSsize_t(args[2]);
    cs_kind key_kind, state_kind;
    if ((pos == -1 || entries == -1) && PyErr_Occurred())
        return NULL;
    if (parse_kind(args[3], 1, &key_kind) < 0 || parse_kind(args[4], 1, &state_kind) < 0)
        return NULL;
    PyObject *decoder = args[5], *key_group = args[6], *block = args[7];
    if (load_checks() < 0 || cs_prepare() < 0)
        return NULL;
    const unsigned char *base = (const unsigned char *)PyBytes_AS_STRING(payload);
    Py_ssize_t end = PyBytes_GET_SIZE(payload);

    PyObject *key_fn = PyObject_GetAttrString(decoder, "key");
    PyObject *state_fn = key_fn ? PyObject_GetAttrString(decoder, "state") : NULL;
    PyObject *name = state_fn ? PyObject_GetAttrString(decoder, "name") : NULL;
    PyObject *cache = name ? PyObject_GetAttrString(decoder, "namespaces") : NULL;
    PyObject *decode_ns = cache ? PyObject_GetAttrString(decoder, "decode_namespace") : NULL;
    PyObject *keys = decode_ns ? PyObject_GetAttrString(block, "keys") : NULL;
    PyObject *nss = keys ? PyObject_GetAttrString(block, "namespaces") : NULL;
    PyObject *states = nss ? PyObject_GetAttrString(block, "states") : NULL;
    PyObject *ns = NULL; /* the current namespace (owned) */
    PyObject *result = NULL;
    Py_ssize_t done = 0;
    if (states == NULL)
        goto finally;
    if (!PyDict_Check(cache) || !PyList_Check(keys) || !PyList_Check(nss)
        || !PyList_Check(states)) {
        PyErr_SetString(PyExc_TypeError,
                        "expected an EntryDecoder with a dict cache and a DecodedBlock");
        goto finally;
    }
    Py_ssize_t frame_at = 0, frame_len = 0; /* the previous namespace's frame */
    for (; done < entries; done++) {
        Py_ssize_t start = pos, ns_at = 0, ns_len = 0, key_at, key_len, state_at, state_len;
        int same_ns = 0;
        if (frame_len > 0 && end - pos >= frame_len
            && memcmp(base + pos, base + frame_at, (size_t)frame_len) == 0) {
            pos += frame_len;
            same_ns = 1;
        }
        else
            pos = field(base, pos, end, &ns_at, &ns_len);
        pos = field(base, pos, end, &key_at, &key_len);
        pos = field(base, pos, end, &state_at, &state_len);
        if (pos < 0 || pos > end) {
            pos = start; /* cut off: the Python loop raises */
            break;
        }
        int stop = 0;
        PyObject *key = NULL, *state = NULL;
        if (key_kind != CS_KIND_PYTHON) {
            key = decode_built_in(key_kind, base + key_at, key_len, &stop);
            if (key == NULL && !stop)
                goto finally;
        }
        if (!stop && state_kind != CS_KIND_PYTHON) {
            state = decode_built_in(state_kind, base + state_at, state_len, &stop);
            if (state == NULL && !stop) {
                Py_XDECREF(key);
                goto finally;
            }
        }
        if (stop) {
            Py_XDECREF(key);
            pos = start; /* the Python deserializer refuses it */
            break;
        }
        if (key == NULL || state == NULL) { /* the user's deserializers, key first */
            PyObject *data = NULL;
            if (key == NULL) {
                data = PyBytes_FromStringAndSize((const char *)base + key_at, key_len);
                key = data == NULL ? NULL : PyObject_CallOneArg(key_fn, data);
                Py_XDECREF(data);
            }
            if (key != NULL && state == NULL) {
                data = PyBytes_FromStringAndSize((const char *)base + state_at, state_len);
                state = data == NULL ? NULL : PyObject_CallOneArg(state_fn, data);
                Py_XDECREF(data);
            }
            if (key == NULL || state == NULL) {
                Py_XDECREF(key);
                Py_XDECREF(state);
                if (data != NULL)
                    raise_undecodable(name, key_group);
                goto finally;
            }
        }
        if (!same_ns) {
            PyObject *raw = PyBytes_FromStringAndSize((const char *)base + ns_at, ns_len);
            PyObject *found = raw == NULL ? NULL : PyDict_GetItemWithError(cache, raw);
            if (found != NULL)
                Py_INCREF(found);
            else if (raw != NULL && !PyErr_Occurred())
                found = PyObject_CallFunctionObjArgs(decode_ns, key_group, raw, NULL);
            Py_XDECREF(raw);
            if (found == NULL) {
                Py_DECREF(key);
                Py_DECREF(state);
                goto finally;
            }
            Py_XSETREF(ns, found);
            frame_at = ns_at - 4;
            frame_len = ns_len + 4;
        }
#if COWSTATE_CODEC_BUG == CODEC_BUG_E1_FIRST_ENTRY_ONLY
        /* planted: E1 checked while the block holds no entry yet, so only
         * the first of each block is checked (cowstate_spec.bad_codecs) */
        if ((key == Py_None || state == Py_None) && PyList_GET_SIZE(keys) == 0) {
#else
        if (key == Py_None || state == Py_None) { /* E1, for every entry */
#endif
            raise_none(name, key_group, key == Py_None ? "key" : "state");
            Py_DECREF(key);
            Py_DECREF(state);
            goto finally;
        }
        int rc = PyList_Append(keys, key);
        if (rc == 0)
            rc = PyList_Append(nss, ns);
        if (rc == 0)
            rc = PyList_Append(states, state);
        Py_DECREF(key);
        Py_DECREF(state);
        if (rc < 0)
            goto finally;
    }
    result = Py_BuildValue("nn", pos, done);
finally:
    Py_XDECREF(ns);
    Py_XDECREF(key_fn);
    Py_XDECREF(state_fn);
    Py_XDECREF(name);
    Py_XDECREF(cache);
    Py_XDECREF(decode_ns);
    Py_XDECREF(keys);
    Py_XDECREF(nss);
    Py_XDECREF(states);
    return result;
}

/* ------------------------------------------------------------ test hook */

static PyObject *m_encode_without_gil(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    cs_kind kind;
    if (!check_args("encode_without_gil", nargs, 3, 3)
        || parse_kind(args[0], 0, &kind) < 0)
        return NULL;
    if (!PyList_CheckExact(args[1])) {
        PyErr_SetString(PyExc_TypeError, "expected a list of values");
        return NULL;
    }
    long rounds = PyLong_AsLong(args[2]);
    if (rounds == -1 && PyErr_Occurred())
        return NULL;
    /* Own every value (the list may change while the GIL is released). */
    PyObject *copy = PyList_GetSlice(args[1], 0, PY_SSIZE_T_MAX);
    if (copy == NULL)
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(copy);
    PyObject **values = PyMem_Malloc(sizeof(PyObject *) * (size_t)(n > 0 ? n : 1));
    size_t *ends = PyMem_Malloc(sizeof(size_t) * (size_t)(n > 0 ? n : 1));
    cs_status *statuses = PyMem_Malloc(sizeof(cs_status) * (size_t)(n > 0 ? n : 1));
    if (values == NULL || ends == NULL || statuses == NULL) {
        PyMem_Free(values);
        PyMem_Free(ends);
        PyMem_Free(statuses);
        Py_DECREF(copy);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < n; i++)
        values[i] = PyList_GET_ITEM(copy, i); /* borrowed: `copy` holds them */
    cs_prepare();
    cs_buf b;
    cs_buf_init(&b);
    int nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    for (long r = 0; r < (rounds > 0 ? rounds : 1) && !nomem; r++) {
        b.len = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            statuses[i] = cs_encode(kind, values[i], &b, 0);
            ends[i] = b.len;
            if (statuses[i] == CS_NOMEM) {
                nomem = 1;
                break;
            }
        }
    }
    Py_END_ALLOW_THREADS
    PyObject *out = nomem ? PyErr_NoMemory() : PyList_New(n);
    for (Py_ssize_t i = 0; out != NULL && i < n; i++) {
        PyObject *item;
        if (statuses[i] == CS_OK) {
            size_t begin = i == 0 ? 0 : ends[i - 1];
            item = PyBytes_FromStringAndSize(b.data == NULL ? "" : (const char *)b.data + begin,
                                             (Py_ssize_t)(ends[i] - begin));
        }
        else
            item = PyUnicode_FromString(statuses[i] == CS_FALLBACK ? "fallback" : "needs-gil");
        if (item == NULL)
            Py_CLEAR(out);
        else
            PyList_SET_ITEM(out, i, item);
    }
    cs_buf_free(&b);
    PyMem_Free(values);
    PyMem_Free(ends);
    PyMem_Free(statuses);
    Py_DECREF(copy);
    return out;
}

/* ------------------------------------------------------------- the module */

static PyMethodDef codec_methods[] = {
    {"encode", (PyCFunction)(void (*)(void))m_encode, METH_FASTCALL,
     "encode(kind, value) -> bytes | None: None means the Python serializer decides."},
    {"decode", (PyCFunction)(void (*)(void))m_decode, METH_FASTCALL,
     "decode(kind, data) -> object: FALLBACK means the Python deserializer decides."},
    {"crc32", (PyCFunction)(void (*)(void))m_crc32, METH_FASTCALL,
     "crc32(data, start=0) -> int: zlib.crc32."},
    {"encode_section", (PyCFunction)(void (*)(void))m_encode_section, METH_FASTCALL,
     "encode_section(items, key_kind, key_serialize, namespace_kind, namespace_serialize, "
     "state_kind, state_serialize) -> bytes | list | None (the module docstring)."},
    {"decode_section", (PyCFunction)(void (*)(void))m_decode_section, METH_FASTCALL,
     "decode_section(payload, position, entries, key_kind, state_kind, decoder, key_group, "
     "block) -> (position, done) (the module docstring)."},
    {"write_blocks", (PyCFunction)(void (*)(void))cw_write_blocks, METH_FASTCALL,
     "write_blocks(stream, position, first, last, states, cancelled, written, python_section, "
     "buffer_size) -> (offsets, entries, position): the blocks of a snapshot file (_writer.c)."},
    {"flat_removals", (PyCFunction)(void (*)(void))m_flat_removals, METH_FASTCALL,
     "flat_removals(pairs) -> FrozenChanges: key, namespace, b'' per pair (write_blocks' "
     "frozen form)."},
    {"freeze_changes", (PyCFunction)(void (*)(void))cw_freeze_changes, METH_FASTCALL,
     "freeze_changes(snapshot, since) -> FrozenChanges | None: a heap delta's changes, held apart "
     "from the snapshot (_writer.c, \"Frozen changes\")."},
    {"snapshot_type", (PyCFunction)cw_snapshot_type, METH_NOARGS,
     "snapshot_type() -> type | None: the C map snapshot type write_blocks walks."},
    {"encode_without_gil", (PyCFunction)(void (*)(void))m_encode_without_gil, METH_FASTCALL,
     "encode_without_gil(kind, values, rounds) -> list: a test hook (GIL released)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef codec_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cowstate." STR(COWSTATE_CODEC_MODULE),
    .m_doc = "The C codec of snapshot entries (design: the headers of _codec.c and "
             "_codecmodule.c).",
    .m_size = -1,
    .m_methods = codec_methods,
};

PyMODINIT_FUNC CAT(PyInit_, COWSTATE_CODEC_MODULE)(void)
{
    cs_init();
    if (FALLBACK == NULL) {
        FALLBACK = PyObject_CallNoArgs((PyObject *)&PyBaseObject_Type);
        if (FALLBACK == NULL)
            return NULL;
    }
    if (PyType_Ready(&cw_FrozenType) < 0)
        return NULL;
    PyObject *module = PyModule_Create(&codec_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "FrozenChanges", (PyObject *)&cw_FrozenType) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    if (PyModule_AddObjectRef(module, "FALLBACK", FALLBACK) < 0
        || PyModule_AddIntConstant(module, "KIND_PYTHON", CS_KIND_PYTHON) < 0
        || PyModule_AddIntConstant(module, "KIND_VALUE", CS_KIND_VALUE) < 0
        || PyModule_AddIntConstant(module, "KIND_INT32", CS_KIND_INT32) < 0
        || PyModule_AddIntConstant(module, "KIND_INT64", CS_KIND_INT64) < 0
        || PyModule_AddIntConstant(module, "KIND_UTF8", CS_KIND_UTF8) < 0
        || PyModule_AddIntConstant(module, "KIND_BYTES", CS_KIND_BYTES) < 0
        || PyModule_AddIntConstant(module, "BUG", COWSTATE_CODEC_BUG) < 0
        || PyModule_AddIntConstant(module, "WRITER_BUG", cw_planted_bug()) < 0
        || PyModule_AddIntConstant(module, "CRC32_IS_ZLIB", cs_crc32_is_zlib()) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    return module;
}
