/*
 * _codec.c -- the C codec of snapshot entries (API: _codec.h)
 * ============================================================
 *
 * The bytes a snapshot file holds for an entry's key, namespace and state are
 * those of the entry's serializers (cowstate.serializers). This library writes
 * and reads the bytes of the built-in ones in C, byte for byte as the Python
 * serializers do, so that a writer can encode a map snapshot's entries without
 * a Python call per value -- and, for immutable values, without the GIL. The
 * Python serializers stay the reference: whatever this file does not encode
 * exactly it hands back (CS_FALLBACK) and the caller calls the Python
 * serializer for that one value, which encodes it or raises its own error.
 *
 * What is encoded
 * ---------------
 * CS_KIND_VALUE (DefaultSerializer, ImmutableSerializer: the value codec,
 * cowstate/value_codec.py's docstring is the format): the version byte 0x01,
 * then one MessagePack object, as msgpack.Packer(use_bin_type=True,
 * strict_types=True) and value_codec's hook write it:
 *
 *   None, True, False       0xc0, 0xc3, 0xc2
 *   int in [-2**63, 2**64)  the smallest MessagePack int (fixint, u/int 8-64)
 *   other int               ext 1 BIGINT: minimal two's-complement big-endian
 *   float                   0xcb + the 8 bytes of the double (NaN payloads kept)
 *   str                     fixstr/str8/16/32 + UTF-8; a lone surrogate as its
 *                           3-byte sequence (the "surrogatepass" bytes)
 *   bytes                   bin8/16/32
 *   list, dict              array, map (a dict's items in its order)
 *   tuple                   ext 2: payload = one array of the items
 *   set, frozenset          ext 3, 4: payload = array header + the members'
 *                           encodings sorted as bytes (Python < 3.13; on 3.13+
 *                           they fall back: the set iteration API went private)
 *   VOID_NAMESPACE          ext 5, empty payload (0xc7 0x00 0x05)
 *
 * Exact types only: a subclass (an IntEnum, a str subclass, an OrderedDict)
 * and every other type is CS_FALLBACK, and so is anything beyond the nesting
 * limits (a value nested deeper than CS_MAX_CONTAINER_DEPTH lists and dicts
 * within one ext level, or CS_MAX_EXT_DEPTH tuples and sets), a length beyond
 * 2**32 - 1, and a str that is not ready (3.11's legacy strings): the Python
 * codec then raises its own UnsupportedValueError, or encodes it itself. The
 * limits are counted exactly as msgpack's packer does: an object packed
 * with d lists and dicts around it (within its ext level) is refused when d >
 * 1024, a tuple's payload array sits at depth 0 of the next ext level, each
 * set member is packed at depth 0 of it.
 *
 * CS_KIND_INT32 / INT64 (IntSerializer, LongSerializer): an exact int in
 * range as 4 / 8 bytes big-endian two's complement; CS_KIND_UTF8
 * (StringSerializer): an exact str as UTF-8 with surrogates passed;
 * CS_KIND_BYTES (BytesSerializer): exact bytes as they are. Anything else
 * (a bool, an int out of range, a subclass) falls back: the Python
 * serializer raises its InvalidArgumentError.
 *
 * What runs without the GIL, and why it is safe
 * ---------------------------------------------
 * cs_encode(kind, v, out, gil_held = 0) encodes only objects whose type is
 * exactly one of NoneType, bool, int, float, str, bytes, tuple (the types are
 * compared by address, Py_TYPE(v) == &PyLong_Type, ...) and VOID_NAMESPACE
 * (compared by address: no field of it is read), recursing into tuples; it
 * returns CS_NEEDS_GIL for a list, dict, set or frozenset anywhere in the
 * value, and for a str that is not compact. It calls no Python API function,
 * changes no reference count and allocates only with malloc/realloc (the
 * buffer). The fields it reads:
 *
 *   every object   ob_type (Py_TYPE)
 *   int            3.11: ob_size (sign and digit count) and ob_digit[];
 *                  3.12+: long_value.lv_tag and long_value.ob_digit[]
 *   float          ob_fval
 *   str            the PyASCIIObject's length and state.kind / compact /
 *                  ascii / ready, and the characters after the struct
 *   bytes          ob_size and ob_sval[]
 *   tuple          ob_size and ob_item[]
 *
 * Why the owner cannot change them while this reads them:
 *
 * (1) The objects are alive: the caller holds a strong reference to the
 *     value (a snapshot holds its entries' objects: snapshot pinning, rules E,
 *     S and C of the map keep what a snapshot reaches unchanged), and a tuple
 *     holds its items, so nothing read here is freed or reused meanwhile.
 * (2) The fields are written only while the object is created. CPython
 *     resizes or mutates an int, str, bytes or tuple in place only while it
 *     is private to the code that made it (_PyLong_Negate, unicode_resize and
 *     the `s += t` fast path, _PyBytes_Resize, _PyTuple_Resize: each requires
 *     a reference count of 1, i.e. no other holder -- and we are one).
 * (3) What the owner does write on these objects lies in other words of
 *     memory: ob_refcnt (Py_INCREF/Py_DECREF on the same objects, e.g. when
 *     it reads the live map), the cached hash of a str or bytes (hash()),
 *     a str's utf8 and wstr caches (PyUnicode_AsUTF8, never called here for
 *     that reason: the UTF-8 is computed from the canonical data), the GC
 *     header of a tuple (untracking) -- none of which is read here.
 * (4) One write shares a word with fields read here: interning a str
 *     (sys.intern, an attribute name) rewrites the `state` bit field, whose
 *     `interned` bits sit beside kind, compact, ascii and ready (3.11; 3.12+
 *     the same without ready). The write stores the word back with those
 *     bits unchanged -- a str's kind, compactness and ASCII-ness are fixed
 *     at creation -- so a read sees the old or the new word, and the bits it
 *     uses are the same in both. (ob_type of an instance of a built-in type
 *     cannot be reassigned: __class__ assignment needs heap types; an object
 *     of a heap subtype is CS_FALLBACK or CS_NEEDS_GIL whatever it reads.)
 *
 * A mutable value (a list or dict) is encoded with the GIL held only, and no
 * Python code runs while it is (no call, no allocation of a Python object: a
 * finalizer or a GC pass could run code that mutates it), so it cannot change
 * under the encoder either. A user who mutates a list state in place after a
 * snapshot (breaking the map's contract) changes what is encoded, never the
 * memory safety of the encoding.
 *
 * VOID_NAMESPACE is looked up once with the GIL (cs_prepare); until it is,
 * an object of any other type is CS_NEEDS_GIL without the GIL.
 *
 * Decoding (with the GIL)
 * -----------------------
 * cs_decode builds the Python objects of the same types from the same
 * formats, and also what msgpack accepts although this encoder never writes
 * it (an int in a wider format than needed, a float 32, a map repeating a
 * key: the last value wins, a set's members in any order). Everything the
 * Python decoder refuses -- and a few things it accepts but cowstate never
 * writes: MessagePack's timestamp ext (-1) -- is CS_FALLBACK with no
 * exception set, so the caller calls the Python deserializer, which decodes
 * it or raises its own error with its own message: there is one source of
 * refusals. An Exception raised while building (a dict key or set member
 * that is unhashable, a UnicodeDecodeError, even MemoryError, which the
 * Python decoder also turns into its own error) is cleared into CS_FALLBACK;
 * a BaseException that is not an Exception (KeyboardInterrupt) is kept:
 * CS_ERROR. The nesting limits are msgpack's unpacker's: a container is
 * refused when 1024 are already open within its ext level; ext levels as the
 * encoder counts them. A length is checked against the bytes left before
 * anything is allocated (each item takes at least one byte), so a hostile
 * length allocates nothing.
 *
 * CRC32
 * -----
 * cs_crc32 is zlib.crc32: zlib's own crc32() when built with
 * COWSTATE_CODEC_ZLIB (setup.py defines it when zlib.h is there), else a
 * slice-by-8 table of the same polynomial (0xEDB88320, reflected), whose
 * tables cs_init() computes. Either runs without the GIL.
 *
 * Test knob: -DCOWSTATE_CODEC_BUG=1 plants "a length prefix off by one for
 * non-ASCII strings" (the str header of a value codec str that is not
 * ASCII says one byte more); cowstate_spec.bad_codecs builds it, and the
 * differential tests must catch it.
 */
#include "_codec.h"

#include <stdlib.h>
#include <string.h>

#ifdef COWSTATE_CODEC_ZLIB
#include <zlib.h>
#endif

#ifndef COWSTATE_CODEC_BUG
#define COWSTATE_CODEC_BUG 0
#endif
#define CODEC_BUG_NON_ASCII_LENGTH 1

#if PY_VERSION_HEX >= 0x030C0000
#if _PyLong_SIGN_MASK != 3 || _PyLong_NON_SIZE_BITS != 3
#error "unknown int layout: teach _codec.c the lv_tag of this Python"
#endif
#endif

/* cowstate.VOID_NAMESPACE (a strong reference kept for the process), or NULL. */
static PyObject *void_namespace;

/* ------------------------------------------------------------------ buffer */

void cs_buf_init(cs_buf *b)
{
    b->data = NULL;
    b->len = 0;
    b->cap = 0;
}

void cs_buf_free(cs_buf *b)
{
    free(b->data);
    cs_buf_init(b);
}

int cs_buf_reserve(cs_buf *b, size_t extra)
{
    if (extra <= b->cap - b->len)
        return 0;
    if (extra > (size_t)PY_SSIZE_T_MAX - b->len)
        return -1;
    size_t need = b->len + extra;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < need)
        cap = cap > (size_t)PY_SSIZE_T_MAX / 2 ? need : cap * 2;
    unsigned char *data = realloc(b->data, cap);
    if (data == NULL)
        return -1;
    b->data = data;
    b->cap = cap;
    return 0;
}

/* Writers into reserved room. */
static inline void put1(cs_buf *b, unsigned int byte)
{
    b->data[b->len++] = (unsigned char)byte;
}

static inline void put_be(cs_buf *b, uint64_t v, int width)
{
    for (int i = width - 1; i >= 0; i--)
        b->data[b->len++] = (unsigned char)(v >> (8 * i));
}

static inline void write_be(unsigned char *at, uint64_t v, int width)
{
    for (int i = width - 1; i >= 0; i--)
        *at++ = (unsigned char)(v >> (8 * i));
}

/* ------------------------------------------------------------- set-up */

int cs_prepare(void)
{
    if (void_namespace != NULL)
        return 0;
    PyObject *module = PyImport_ImportModule("cowstate.keyed_state");
    PyObject *found = module == NULL ? NULL : PyObject_GetAttrString(module, "VOID_NAMESPACE");
    Py_XDECREF(module);
    if (found == NULL) {
        /* Not importable here: VOID_NAMESPACE is then not recognised, and the
         * Python codec decides about it (it imports the same module). */
        PyErr_Clear();
        return 0;
    }
    void_namespace = found; /* kept for the life of the process */
    return 0;
}

/* ------------------------------------------------------------ encoding */

typedef struct {
    cs_buf *out;
    int gil;
    int ext_depth; /* tuples and sets around the object being encoded */
} Enc;

static cs_status enc_obj(Enc *e, PyObject *v, int depth);

/* A MessagePack length header: the fix form below fix_limit (fix_base | n),
 * else the 8/16/32-bit forms whose codes are given (0: that form does not
 * exist for this family). Reserves its own room. */
static cs_status put_header(cs_buf *b, uint64_t n, unsigned int fix_base, uint64_t fix_limit,
                            unsigned int c8, unsigned int c16, unsigned int c32)
{
    if (cs_buf_reserve(b, 5) < 0)
        return CS_NOMEM;
    if (n < fix_limit)
        put1(b, fix_base | (unsigned int)n);
    else if (c8 && n < 0x100) {
        put1(b, c8);
        put_be(b, n, 1);
    }
    else if (n < 0x10000) {
        put1(b, c16);
        put_be(b, n, 2);
    }
    else if (n <= 0xFFFFFFFFu) {
        put1(b, c32);
        put_be(b, n, 4);
    }
    else
        return CS_FALLBACK; /* msgpack refuses it: the Python codec raises */
    return CS_OK;
}

/* The size of the ext header for a payload of n bytes. */
static size_t ext_header_size(size_t n)
{
    if (n == 1 || n == 2 || n == 4 || n == 8 || n == 16)
        return 2;
    if (n < 0x100)
        return 3;
    if (n < 0x10000)
        return 4;
    return 6;
}

/* Write the ext header of a payload of n bytes at `at` (ext_header_size(n)
 * bytes of room). */
static void write_ext_header(unsigned char *at, size_t n, int type)
{
    switch (n) {
    case 1: at[0] = 0xd4; at[1] = (unsigned char)type; return;
    case 2: at[0] = 0xd5; at[1] = (unsigned char)type; return;
    case 4: at[0] = 0xd6; at[1] = (unsigned char)type; return;
    case 8: at[0] = 0xd7; at[1] = (unsigned char)type; return;
    case 16: at[0] = 0xd8; at[1] = (unsigned char)type; return;
    default: break;
    }
    if (n < 0x100) {
        at[0] = 0xc7;
        at[1] = (unsigned char)n;
        at[2] = (unsigned char)type;
    }
    else if (n < 0x10000) {
        at[0] = 0xc8;
        write_be(at + 1, n, 2);
        at[3] = (unsigned char)type;
    }
    else {
        at[0] = 0xc9;
        write_be(at + 1, n, 4);
        at[5] = (unsigned char)type;
    }
}

/* An ext object whose payload was written at [start + 6, out->len): the
 * header goes at `start`, the payload moves up to follow it. */
static cs_status close_ext(cs_buf *b, size_t start, int type)
{
    size_t n = b->len - start - 6;
    if (n > 0xFFFFFFFFu)
        return CS_FALLBACK;
    size_t h = ext_header_size(n);
    write_ext_header(b->data + start, n, type);
    if (h != 6)
        memmove(b->data + start + h, b->data + start + 6, n);
    b->len = start + h + n;
    return CS_OK;
}

/* Open an ext object: room for the widest header, filled by close_ext. */
static cs_status open_ext(cs_buf *b, size_t *start)
{
    if (cs_buf_reserve(b, 6) < 0)
        return CS_NOMEM;
    *start = b->len;
    b->len += 6;
    return CS_OK;
}

/* --- ints: the sign and digits of an exact int, read from its struct. */

static void int_digits(PyObject *v, const digit **digits, Py_ssize_t *ndigits, int *negative)
{
    PyLongObject *l = (PyLongObject *)v;
#if PY_VERSION_HEX >= 0x030C0000
    uintptr_t tag = l->long_value.lv_tag;
    *negative = (tag & 3) == 2;
    *ndigits = (Py_ssize_t)(tag >> 3);
    *digits = l->long_value.ob_digit;
#else
    Py_ssize_t size = Py_SIZE(l);
    *negative = size < 0;
    *ndigits = size < 0 ? -size : size;
    *digits = l->ob_digit;
#endif
}

/* The magnitude of the int in *mag when it is below 2**64: 1, else 0. */
static int int_magnitude(const digit *d, Py_ssize_t nd, uint64_t *mag)
{
    uint64_t m = 0;
    for (Py_ssize_t i = nd - 1; i >= 0; i--) {
        if (m >> (64 - PyLong_SHIFT))
            return 0;
        m = (m << PyLong_SHIFT) | (uint64_t)d[i];
    }
    *mag = m;
    return 1;
}

/* An int beyond 64 bits: ext 1, the fewest two's-complement bytes. */
static cs_status enc_bigint(Enc *e, const digit *d, Py_ssize_t nd, int negative)
{
    size_t nb = (size_t)nd * PyLong_SHIFT / 8 + 2;
    unsigned char small[160];
    unsigned char *m = nb <= sizeof small ? small : malloc(nb);
    if (m == NULL)
        return CS_NOMEM;
    memset(m, 0, nb);
    /* the magnitude, little-endian */
    uint64_t acc = 0;
    int bits = 0;
    size_t k = 0;
    for (Py_ssize_t i = 0; i < nd; i++) {
        acc |= (uint64_t)d[i] << bits;
        bits += PyLong_SHIFT;
        while (bits >= 8) {
            m[k++] = (unsigned char)acc;
            acc >>= 8;
            bits -= 8;
        }
    }
    if (bits > 0)
        m[k++] = (unsigned char)acc;
    /* two's complement of -x is ~(x - 1): work on x - 1 for a negative int */
    if (negative) {
        for (size_t i = 0; i < nb; i++) {
            if (m[i]-- != 0)
                break;
        }
    }
    size_t top = nb;
    while (top > 0 && m[top - 1] == 0)
        top--;
    size_t bitlen = 0;
    if (top > 0) {
        unsigned int hi = m[top - 1];
        bitlen = (top - 1) * 8;
        while (hi) {
            bitlen++;
            hi >>= 1;
        }
    }
    size_t length = bitlen / 8 + 1; /* (v + (v < 0)).bit_length() // 8 + 1 */
    cs_status status = CS_OK;
    if (length > 0xFFFFFFFFu)
        status = CS_FALLBACK;
    else if (cs_buf_reserve(e->out, 6 + length) < 0)
        status = CS_NOMEM;
    else {
        cs_buf *b = e->out;
        write_ext_header(b->data + b->len, length, 1);
        b->len += ext_header_size(length);
        for (size_t i = length; i-- > 0;)
            put1(b, negative ? (unsigned char)~m[i] : m[i]);
    }
    if (m != small)
        free(m);
    return status;
}

static cs_status enc_int(Enc *e, PyObject *v)
{
    const digit *d;
    Py_ssize_t nd;
    int negative;
    uint64_t mag;
    int_digits(v, &d, &nd, &negative);
    if (!int_magnitude(d, nd, &mag) || (negative && mag > (UINT64_C(1) << 63)))
        return enc_bigint(e, d, nd, negative);
    cs_buf *b = e->out;
    if (cs_buf_reserve(b, 9) < 0)
        return CS_NOMEM;
    if (!negative) {
        if (mag < 0x80)
            put1(b, (unsigned int)mag);
        else if (mag < 0x100) {
            put1(b, 0xcc);
            put_be(b, mag, 1);
        }
        else if (mag < 0x10000) {
            put1(b, 0xcd);
            put_be(b, mag, 2);
        }
        else if (mag < UINT64_C(0x100000000)) {
            put1(b, 0xce);
            put_be(b, mag, 4);
        }
        else {
            put1(b, 0xcf);
            put_be(b, mag, 8);
        }
        return CS_OK;
    }
    int64_t s = -(int64_t)(mag - 1) - 1; /* mag >= 1 here; 2**63 gives INT64_MIN */
    if (s >= -32)
        put1(b, (unsigned int)(uint8_t)(int8_t)s);
    else if (s >= -128) {
        put1(b, 0xd0);
        put_be(b, (uint64_t)s, 1);
    }
    else if (s >= -32768) {
        put1(b, 0xd1);
        put_be(b, (uint64_t)s, 2);
    }
    else if (s >= -(INT64_C(1) << 31)) {
        put1(b, 0xd2);
        put_be(b, (uint64_t)s, 4);
    }
    else {
        put1(b, 0xd3);
        put_be(b, (uint64_t)s, 8);
    }
    return CS_OK;
}

/* An exact int in [lo, hi] as a signed 64-bit value: 1, else 0. */
static int int_in_range(PyObject *v, int64_t lo, int64_t hi, int64_t *out)
{
    const digit *d;
    Py_ssize_t nd;
    int negative;
    uint64_t mag;
    int_digits(v, &d, &nd, &negative);
    if (!int_magnitude(d, nd, &mag))
        return 0;
    if (negative) {
        if (mag - 1 > (uint64_t)(-(lo + 1)))
            return 0;
        *out = -(int64_t)(mag - 1) - 1;
    }
    else {
        if (mag > (uint64_t)hi)
            return 0;
        *out = (int64_t)mag;
    }
    return 1;
}

/* --- strs: UTF-8 from the canonical representation (kind, data). */

/* 1 when the str may be read here (ready; compact when without the GIL). */
static cs_status str_readable(PyObject *v, int gil)
{
#if PY_VERSION_HEX < 0x030C0000
    if (!PyUnicode_IS_READY(v))
        return gil ? CS_FALLBACK : CS_NEEDS_GIL;
#endif
    if (!gil && !PyUnicode_IS_COMPACT(v))
        return CS_NEEDS_GIL;
    return CS_OK;
}

static size_t utf8_length(int kind, const void *data, Py_ssize_t n)
{
    size_t total = 0;
    if (kind == PyUnicode_1BYTE_KIND) {
        const Py_UCS1 *s = data;
        for (Py_ssize_t i = 0; i < n; i++)
            total += s[i] < 0x80 ? 1 : 2;
    }
    else if (kind == PyUnicode_2BYTE_KIND) {
        const Py_UCS2 *s = data;
        for (Py_ssize_t i = 0; i < n; i++)
            total += s[i] < 0x80 ? 1 : s[i] < 0x800 ? 2 : 3;
    }
    else {
        const Py_UCS4 *s = data;
        for (Py_ssize_t i = 0; i < n; i++)
            total += s[i] < 0x80 ? 1 : s[i] < 0x800 ? 2 : s[i] < 0x10000 ? 3 : 4;
    }
    return total;
}

/* Append the UTF-8 of the characters (surrogates as their 3-byte form);
 * room reserved. */
static void put_utf8(cs_buf *b, int kind, const void *data, Py_ssize_t n)
{
    unsigned char *p = b->data + b->len;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_UCS4 c = PyUnicode_READ(kind, data, i);
        if (c < 0x80)
            *p++ = (unsigned char)c;
        else if (c < 0x800) {
            *p++ = (unsigned char)(0xc0 | (c >> 6));
            *p++ = (unsigned char)(0x80 | (c & 0x3f));
        }
        else if (c < 0x10000) {
            *p++ = (unsigned char)(0xe0 | (c >> 12));
            *p++ = (unsigned char)(0x80 | ((c >> 6) & 0x3f));
            *p++ = (unsigned char)(0x80 | (c & 0x3f));
        }
        else {
            *p++ = (unsigned char)(0xf0 | (c >> 18));
            *p++ = (unsigned char)(0x80 | ((c >> 12) & 0x3f));
            *p++ = (unsigned char)(0x80 | ((c >> 6) & 0x3f));
            *p++ = (unsigned char)(0x80 | (c & 0x3f));
        }
    }
    b->len = (size_t)(p - b->data);
}

/* The UTF-8 bytes of a str, with (value codec) or without (key) a header. */
static cs_status enc_str(cs_buf *b, PyObject *v, int gil, int with_header)
{
    cs_status status = str_readable(v, gil);
    if (status != CS_OK)
        return status;
    Py_ssize_t n = PyUnicode_GET_LENGTH(v);
    int ascii = PyUnicode_IS_ASCII(v);
    int kind = PyUnicode_KIND(v);
    const void *data = PyUnicode_DATA(v);
    size_t length = ascii ? (size_t)n : utf8_length(kind, data, n);
    if (with_header) {
        size_t said = length;
#if COWSTATE_CODEC_BUG == CODEC_BUG_NON_ASCII_LENGTH
        if (!ascii)
            said += 1;
#endif
        status = put_header(b, said, 0xa0, 32, 0xd9, 0xda, 0xdb);
        if (status != CS_OK)
            return status;
    }
    if (cs_buf_reserve(b, length) < 0)
        return CS_NOMEM;
    if (ascii) {
        if (length > 0) /* an empty str into an empty buffer: data may be NULL */
            memcpy(b->data + b->len, data, length);
        b->len += length;
    }
    else
        put_utf8(b, kind, data, n);
    return CS_OK;
}

static cs_status enc_bytes(cs_buf *b, PyObject *v)
{
    size_t n = (size_t)PyBytes_GET_SIZE(v);
    cs_status status = put_header(b, n, 0, 0, 0xc4, 0xc5, 0xc6);
    if (status != CS_OK)
        return status;
    if (cs_buf_reserve(b, n) < 0)
        return CS_NOMEM;
    memcpy(b->data + b->len, PyBytes_AS_STRING(v), n);
    b->len += n;
    return CS_OK;
}

static cs_status put_array_header(cs_buf *b, size_t n)
{
    return put_header(b, n, 0x90, 16, 0, 0xdc, 0xdd);
}

static cs_status enc_tuple(Enc *e, PyObject *v)
{
    if (e->ext_depth >= CS_MAX_EXT_DEPTH)
        return CS_FALLBACK;
    size_t start;
    cs_status status = open_ext(e->out, &start);
    if (status != CS_OK)
        return status;
    Py_ssize_t n = PyTuple_GET_SIZE(v);
    status = put_array_header(e->out, (size_t)n);
    e->ext_depth++;
    /* the payload is packer.pack(list(value)): the array at depth 0 */
    for (Py_ssize_t i = 0; i < n && status == CS_OK; i++)
        status = enc_obj(e, PyTuple_GET_ITEM(v, i), 1);
    e->ext_depth--;
    return status == CS_OK ? close_ext(e->out, start, 2) : status;
}

static cs_status enc_list(Enc *e, PyObject *v, int depth)
{
    Py_ssize_t n = PyList_GET_SIZE(v);
    cs_status status = put_array_header(e->out, (size_t)n);
    for (Py_ssize_t i = 0; i < n && status == CS_OK; i++)
        status = enc_obj(e, PyList_GET_ITEM(v, i), depth + 1);
    return status;
}

static cs_status enc_dict(Enc *e, PyObject *v, int depth)
{
    cs_status status = put_header(e->out, (size_t)PyDict_GET_SIZE(v), 0x80, 16, 0, 0xde, 0xdf);
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (status == CS_OK && PyDict_Next(v, &pos, &key, &value)) {
        status = enc_obj(e, key, depth + 1);
        if (status == CS_OK)
            status = enc_obj(e, value, depth + 1);
    }
    return status;
}

#if PY_VERSION_HEX < 0x030D0000
typedef struct {
    const unsigned char *p;
    size_t len;
} Member;

static int member_order(const void *a, const void *b)
{
    const Member *x = a, *y = b;
    int c = memcmp(x->p, y->p, x->len < y->len ? x->len : y->len);
    if (c != 0)
        return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

/* ext 3 / 4: the array header, then the members' encodings sorted as bytes
 * (each packed on its own, at depth 0 of the next ext level). With the GIL
 * only: _PySet_NextEntry runs no Python code, so the set cannot change. */
static cs_status enc_set(Enc *e, PyObject *v, int type)
{
    if (e->ext_depth >= CS_MAX_EXT_DEPTH)
        return CS_FALLBACK;
    Py_ssize_t n = PySet_GET_SIZE(v);
    cs_buf scratch;
    cs_buf_init(&scratch);
    size_t *ends = malloc(sizeof(size_t) * (size_t)(n > 0 ? n : 1));
    Member *members = malloc(sizeof(Member) * (size_t)(n > 0 ? n : 1));
    cs_status status = ends == NULL || members == NULL ? CS_NOMEM : CS_OK;
    Enc sub = {&scratch, e->gil, e->ext_depth + 1};
    Py_ssize_t pos = 0, count = 0;
    PyObject *member;
    Py_hash_t hash;
    while (status == CS_OK && count < n && _PySet_NextEntry(v, &pos, &member, &hash)) {
        status = enc_obj(&sub, member, 0);
        ends[count++] = scratch.len;
    }
    if (status == CS_OK && count != n)
        status = CS_FALLBACK; /* cannot happen: nothing ran that changes the set */
    if (status == CS_OK) {
        for (Py_ssize_t i = 0; i < n; i++) {
            size_t begin = i == 0 ? 0 : ends[i - 1];
            members[i].p = scratch.data + begin;
            members[i].len = ends[i] - begin;
        }
        qsort(members, (size_t)n, sizeof(Member), member_order);
        size_t start;
        status = open_ext(e->out, &start);
        if (status == CS_OK)
            status = put_array_header(e->out, (size_t)n);
        if (status == CS_OK && cs_buf_reserve(e->out, scratch.len) < 0)
            status = CS_NOMEM;
        if (status == CS_OK) {
            for (Py_ssize_t i = 0; i < n; i++) {
                memcpy(e->out->data + e->out->len, members[i].p, members[i].len);
                e->out->len += members[i].len;
            }
            status = close_ext(e->out, start, type);
        }
    }
    free(ends);
    free(members);
    cs_buf_free(&scratch);
    return status;
}
#endif

static cs_status enc_obj(Enc *e, PyObject *v, int depth)
{
    if (depth > CS_MAX_CONTAINER_DEPTH)
        return CS_FALLBACK; /* msgpack: "recursion limit exceeded" */
    cs_buf *b = e->out;
    /* The singletons first, by address: none of their fields is read, not even
     * the type (see "Shared cache lines" above). */
    if (v == Py_None || v == Py_True || v == Py_False) {
        if (cs_buf_reserve(b, 1) < 0)
            return CS_NOMEM;
        put1(b, v == Py_None ? 0xc0 : v == Py_True ? 0xc3 : 0xc2);
        return CS_OK;
    }
    if (v == void_namespace) { /* by address (NULL before cs_prepare: no v is) */
        if (cs_buf_reserve(b, 3) < 0)
            return CS_NOMEM;
        put1(b, 0xc7);
        put1(b, 0x00);
        put1(b, 0x05);
        return CS_OK;
    }
    PyTypeObject *type = Py_TYPE(v);
    if (type == &PyLong_Type)
        return enc_int(e, v);
    if (type == &PyFloat_Type) {
        double f = PyFloat_AS_DOUBLE(v);
        uint64_t bits;
        memcpy(&bits, &f, sizeof bits);
        if (cs_buf_reserve(b, 9) < 0)
            return CS_NOMEM;
        put1(b, 0xcb);
        put_be(b, bits, 8);
        return CS_OK;
    }
    if (type == &PyUnicode_Type)
        return enc_str(b, v, e->gil, 1);
    if (type == &PyBytes_Type)
        return enc_bytes(b, v);
    if (type == &PyTuple_Type)
        return enc_tuple(e, v);
    if (type == &PyList_Type || type == &PyDict_Type || type == &PySet_Type
        || type == &PyFrozenSet_Type) {
        if (!e->gil)
            return CS_NEEDS_GIL; /* mutable (or, a frozenset, read through set internals) */
        if (type == &PyList_Type)
            return enc_list(e, v, depth);
        if (type == &PyDict_Type)
            return enc_dict(e, v, depth);
#if PY_VERSION_HEX < 0x030D0000
        return enc_set(e, v, type == &PySet_Type ? 3 : 4);
#else
        return CS_FALLBACK;
#endif
    }
    if (void_namespace == NULL)
        return e->gil ? CS_FALLBACK : CS_NEEDS_GIL;
    return CS_FALLBACK;
}

static int immutable_at(PyObject *v, int depth)
{
    if (v == Py_None || v == Py_True || v == Py_False || v == void_namespace)
        return 1;
    PyTypeObject *type = Py_TYPE(v);
    if (type == &PyLong_Type || type == &PyFloat_Type || type == &PyUnicode_Type
        || type == &PyBytes_Type)
        return 1;
    if (type != &PyTuple_Type || depth >= CS_MAX_EXT_DEPTH)
        return 0;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(v); i++)
        if (!immutable_at(PyTuple_GET_ITEM(v, i), depth + 1))
            return 0;
    return 1;
}

int cs_immutable(PyObject *v) { return v != NULL && immutable_at(v, 0); }

cs_status cs_encode_value(PyObject *v, cs_buf *out, int gil_held)
{
    size_t start = out->len;
    if (cs_buf_reserve(out, 1) < 0)
        return CS_NOMEM;
    put1(out, 0x01); /* the format version */
    Enc e = {out, gil_held, 0};
    cs_status status = enc_obj(&e, v, 0);
    if (status != CS_OK)
        out->len = start;
    return status;
}

cs_status cs_encode(cs_kind kind, PyObject *v, cs_buf *out, int gil_held)
{
    size_t start = out->len;
    cs_status status = CS_FALLBACK;
    int64_t n;
    if (kind == CS_KIND_VALUE) /* before Py_TYPE(v): VOID_NAMESPACE's is not read */
        return cs_encode_value(v, out, gil_held);
    PyTypeObject *type = Py_TYPE(v);
    switch (kind) {
    case CS_KIND_INT32:
    case CS_KIND_INT64: {
        int width = kind == CS_KIND_INT32 ? 4 : 8;
        int64_t lo = kind == CS_KIND_INT32 ? INT32_MIN : INT64_MIN;
        int64_t hi = kind == CS_KIND_INT32 ? INT32_MAX : INT64_MAX;
        if (type != &PyLong_Type || !int_in_range(v, lo, hi, &n))
            return CS_FALLBACK;
        if (cs_buf_reserve(out, 8) < 0)
            return CS_NOMEM;
        put_be(out, (uint64_t)n, width);
        return CS_OK;
    }
    case CS_KIND_UTF8:
        if (type != &PyUnicode_Type)
            return CS_FALLBACK;
        status = enc_str(out, v, gil_held, 0);
        break;
    case CS_KIND_BYTES: {
        if (type != &PyBytes_Type)
            return CS_FALLBACK;
        size_t size = (size_t)PyBytes_GET_SIZE(v);
        if (cs_buf_reserve(out, size) < 0)
            return CS_NOMEM;
        if (size > 0)
            memcpy(out->data + out->len, PyBytes_AS_STRING(v), size);
        out->len += size;
        return CS_OK;
    }
    default:
        return CS_FALLBACK;
    }
    if (status != CS_OK)
        out->len = start;
    return status;
}

/* ------------------------------------------------------------ decoding */

typedef struct {
    const unsigned char *p;
    const unsigned char *end;
    int ext_depth;
} Dec;

static PyObject *dec_obj(Dec *d, int depth, cs_status *st);

/* A failed Python call while building: an Exception becomes CS_FALLBACK (the
 * Python decoder turns any Exception into its own error), anything else
 * (KeyboardInterrupt) stays set: CS_ERROR. */
static PyObject *failed(cs_status *st)
{
    if (PyErr_ExceptionMatches(PyExc_Exception)) {
        PyErr_Clear();
        *st = CS_FALLBACK;
    }
    else
        *st = CS_ERROR;
    return NULL;
}

static PyObject *fallback(cs_status *st)
{
    *st = CS_FALLBACK;
    return NULL;
}

static inline size_t left(const Dec *d)
{
    return (size_t)(d->end - d->p);
}

static uint64_t read_be(const unsigned char *p, int width)
{
    uint64_t v = 0;
    for (int i = 0; i < width; i++)
        v = (v << 8) | p[i];
    return v;
}

/* Read an unsigned big-endian length of `width` bytes (CS_FALLBACK: short). */
static int take_length(Dec *d, int width, size_t *n)
{
    if (left(d) < (size_t)width)
        return -1;
    *n = (size_t)read_be(d->p, width);
    d->p += width;
    return 0;
}

static PyObject *dec_str(Dec *d, size_t n, cs_status *st)
{
    if (left(d) < n)
        return fallback(st);
    PyObject *s = PyUnicode_DecodeUTF8((const char *)d->p, (Py_ssize_t)n, "surrogatepass");
    if (s == NULL)
        return failed(st);
    d->p += n;
    return s;
}

static PyObject *dec_bin(Dec *d, size_t n, cs_status *st)
{
    if (left(d) < n)
        return fallback(st);
    PyObject *b = PyBytes_FromStringAndSize((const char *)d->p, (Py_ssize_t)n);
    if (b == NULL)
        return failed(st);
    d->p += n;
    return b;
}

static PyObject *dec_array(Dec *d, size_t n, int depth, cs_status *st)
{
    if (depth >= CS_MAX_CONTAINER_DEPTH || n > left(d))
        return fallback(st); /* msgpack's stack is full / claims more than the bytes */
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (list == NULL)
        return failed(st);
    for (size_t i = 0; i < n; i++) {
        PyObject *item = dec_obj(d, depth + 1, st);
        if (item == NULL) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, item); /* steals item */
    }
    return list;
}

static PyObject *dec_map(Dec *d, size_t n, int depth, cs_status *st)
{
    if (depth >= CS_MAX_CONTAINER_DEPTH || n > left(d) / 2)
        return fallback(st);
    PyObject *dict = PyDict_New();
    if (dict == NULL)
        return failed(st);
    for (size_t i = 0; i < n; i++) {
        PyObject *key = dec_obj(d, depth + 1, st);
        if (key == NULL) {
            Py_DECREF(dict);
            return NULL;
        }
        PyObject *value = dec_obj(d, depth + 1, st);
        if (value == NULL) {
            Py_DECREF(key);
            Py_DECREF(dict);
            return NULL;
        }
        if (PyUnicode_CheckExact(key))
            PyUnicode_InternInPlace(&key); /* as msgpack does for str keys */
        int rc = PyDict_SetItem(dict, key, value); /* a repeated key: the last wins */
        Py_DECREF(key);
        Py_DECREF(value);
        if (rc < 0) {
            Py_DECREF(dict);
            return failed(st); /* an unhashable key */
        }
    }
    return dict;
}

/* The one array an ext payload of a tuple or set holds, one ext level down. */
static PyObject *dec_ext_array(Dec *d, const unsigned char *payload, size_t n, cs_status *st)
{
    if (d->ext_depth >= CS_MAX_EXT_DEPTH || n == 0)
        return fallback(st);
    unsigned int first = payload[0];
    if (!((first >= 0x90 && first <= 0x9f) || first == 0xdc || first == 0xdd))
        return fallback(st); /* not one array */
    Dec sub = {payload, payload + n, d->ext_depth + 1};
    PyObject *list = dec_obj(&sub, 0, st);
    if (list != NULL && sub.p != sub.end) {
        Py_DECREF(list); /* bytes after the array */
        return fallback(st);
    }
    return list;
}

static PyObject *dec_bigint(const unsigned char *p, size_t n, cs_status *st)
{
    /* Beyond 64 bits and minimal (what value_codec._ext_hook accepts): at
     * least 9 bytes, no redundant sign byte, and 9 bytes starting 0x00 are
     * below 2**64. */
    if (n < 9)
        return fallback(st);
    if ((p[0] == 0x00 && p[1] < 0x80) || (p[0] == 0xff && p[1] >= 0x80))
        return fallback(st);
    if (n == 9 && p[0] == 0x00)
        return fallback(st);
    PyObject *v = _PyLong_FromByteArray(p, n, 0, 1);
    return v == NULL ? failed(st) : v;
}

static PyObject *dec_ext(Dec *d, size_t n, cs_status *st)
{
    if (left(d) < 1 + n)
        return fallback(st);
    int type = (signed char)d->p[0];
    const unsigned char *payload = d->p + 1;
    d->p += 1 + n;
    PyObject *items, *result;
    switch (type) {
    case 1:
        return dec_bigint(payload, n, st);
    case 2:
        items = dec_ext_array(d, payload, n, st);
        if (items == NULL)
            return NULL;
        result = PyList_AsTuple(items);
        Py_DECREF(items);
        return result == NULL ? failed(st) : result;
    case 3:
    case 4: {
        items = dec_ext_array(d, payload, n, st);
        if (items == NULL)
            return NULL;
        result = type == 3 ? PySet_New(items) : PyFrozenSet_New(items);
        Py_ssize_t members = PyList_GET_SIZE(items);
        Py_DECREF(items);
        if (result == NULL)
            return failed(st); /* an unhashable member */
        if (PySet_GET_SIZE(result) != members) {
            Py_DECREF(result); /* a repeated member */
            return fallback(st);
        }
        return result;
    }
    case 5:
        if (n != 0 || void_namespace == NULL)
            return fallback(st);
        Py_INCREF(void_namespace);
        return void_namespace;
    default:
        return fallback(st); /* another tag, or MessagePack's timestamp (-1) */
    }
}

static PyObject *dec_obj(Dec *d, int depth, cs_status *st)
{
    if (d->p >= d->end)
        return fallback(st);
    unsigned int c = *d->p++;
    size_t n;
    if (c <= 0x7f)
        return PyLong_FromLong((long)c);
    if (c >= 0xe0)
        return PyLong_FromLong((long)c - 256);
    if (c <= 0x8f)
        return dec_map(d, c & 0x0f, depth, st);
    if (c <= 0x9f)
        return dec_array(d, c & 0x0f, depth, st);
    if (c <= 0xbf)
        return dec_str(d, c & 0x1f, st);
    switch (c) {
    case 0xc0:
        Py_RETURN_NONE;
    case 0xc2:
        Py_RETURN_FALSE;
    case 0xc3:
        Py_RETURN_TRUE;
    case 0xc4:
    case 0xc5:
    case 0xc6:
        if (take_length(d, 1 << (c - 0xc4), &n) < 0)
            return fallback(st);
        return dec_bin(d, n, st);
    case 0xc7:
    case 0xc8:
    case 0xc9:
        if (take_length(d, 1 << (c - 0xc7), &n) < 0)
            return fallback(st);
        return dec_ext(d, n, st);
    case 0xca: {
        if (left(d) < 4)
            return fallback(st);
        uint32_t bits = (uint32_t)read_be(d->p, 4);
        float f;
        memcpy(&f, &bits, sizeof f);
        d->p += 4;
        return PyFloat_FromDouble((double)f);
    }
    case 0xcb: {
        if (left(d) < 8)
            return fallback(st);
        uint64_t bits = read_be(d->p, 8);
        double f;
        memcpy(&f, &bits, sizeof f);
        d->p += 8;
        return PyFloat_FromDouble(f);
    }
    case 0xcc:
    case 0xcd:
    case 0xce:
    case 0xcf: {
        int width = 1 << (c - 0xcc);
        if (left(d) < (size_t)width)
            return fallback(st);
        uint64_t v = read_be(d->p, width);
        d->p += width;
        return PyLong_FromUnsignedLongLong(v);
    }
    case 0xd0:
    case 0xd1:
    case 0xd2:
    case 0xd3: {
        int width = 1 << (c - 0xd0);
        if (left(d) < (size_t)width)
            return fallback(st);
        uint64_t v = read_be(d->p, width);
        d->p += width;
        int shift = 64 - 8 * width; /* sign-extend */
        int64_t s = (int64_t)(v << shift) >> shift;
        return PyLong_FromLongLong(s);
    }
    case 0xd4:
    case 0xd5:
    case 0xd6:
    case 0xd7:
    case 0xd8:
        return dec_ext(d, (size_t)1 << (c - 0xd4), st);
    case 0xd9:
    case 0xda:
    case 0xdb:
        if (take_length(d, 1 << (c - 0xd9), &n) < 0)
            return fallback(st);
        return dec_str(d, n, st);
    case 0xdc:
    case 0xdd:
        if (take_length(d, 2 << (c - 0xdc), &n) < 0)
            return fallback(st);
        return dec_array(d, n, depth, st);
    case 0xde:
    case 0xdf:
        if (take_length(d, 2 << (c - 0xde), &n) < 0)
            return fallback(st);
        return dec_map(d, n, depth, st);
    default: /* 0xc1: reserved */
        return fallback(st);
    }
}

PyObject *cs_decode_value(const unsigned char *data, Py_ssize_t len, cs_status *status)
{
    *status = CS_OK;
    if (len < 1 || data[0] != 0x01 || cs_prepare() < 0)
        return fallback(status);
    Dec d = {data + 1, data + len, 0};
    PyObject *v = dec_obj(&d, 0, status);
    if (v == NULL) {
        if (*status == CS_OK)
            return failed(status); /* an allocation failed: PyErr is set */
        return NULL;
    }
    if (d.p != d.end) {
        Py_DECREF(v); /* bytes after the object */
        return fallback(status);
    }
    return v;
}

PyObject *cs_decode(cs_kind kind, const unsigned char *data, Py_ssize_t len, cs_status *status)
{
    *status = CS_OK;
    PyObject *v;
    switch (kind) {
    case CS_KIND_VALUE:
        return cs_decode_value(data, len, status);
    case CS_KIND_INT32:
        if (len != 4)
            return fallback(status); /* struct.error in the Python serializer */
        v = PyLong_FromLong((long)(int32_t)(uint32_t)read_be(data, 4));
        break;
    case CS_KIND_INT64:
        if (len != 8)
            return fallback(status);
        v = PyLong_FromLongLong((long long)(int64_t)read_be(data, 8));
        break;
    case CS_KIND_UTF8:
        v = PyUnicode_DecodeUTF8((const char *)data, len, "surrogatepass");
        break;
    case CS_KIND_BYTES:
        v = PyBytes_FromStringAndSize((const char *)data, len);
        break;
    default:
        return fallback(status);
    }
    return v == NULL ? failed(status) : v;
}

/* --------------------------------------------------------------- CRC32 */

#ifdef COWSTATE_CODEC_ZLIB

uint32_t cs_crc32(uint32_t crc, const void *data, size_t len)
{
    const Bytef *p = data;
    uLong c = crc;
    while (len > 0) { /* zlib takes a uInt length: chunks, as zlib.crc32 does */
        uInt chunk = len > 0x40000000u ? 0x40000000u : (uInt)len;
        c = crc32(c, p, chunk);
        p += chunk;
        len -= chunk;
    }
    return (uint32_t)c;
}

int cs_crc32_is_zlib(void)
{
    return 1;
}

void cs_init(void)
{
}

#else

static uint32_t crc_table[8][256];

void cs_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++)
            c = c & 1 ? 0xEDB88320u ^ (c >> 1) : c >> 1;
        crc_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = crc_table[0][i];
        for (int t = 1; t < 8; t++) {
            c = crc_table[0][c & 0xff] ^ (c >> 8);
            crc_table[t][i] = c;
        }
    }
}

uint32_t cs_crc32(uint32_t crc, const void *data, size_t len)
{
    const unsigned char *p = data;
    uint32_t c = ~crc;
    while (len >= 8) { /* slice-by-8, byte order independent */
        uint32_t lo = c ^ ((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16
                           | (uint32_t)p[3] << 24);
        uint32_t hi = (uint32_t)p[4] | (uint32_t)p[5] << 8 | (uint32_t)p[6] << 16
            | (uint32_t)p[7] << 24;
        c = crc_table[7][lo & 0xff] ^ crc_table[6][(lo >> 8) & 0xff]
            ^ crc_table[5][(lo >> 16) & 0xff] ^ crc_table[4][lo >> 24]
            ^ crc_table[3][hi & 0xff] ^ crc_table[2][(hi >> 8) & 0xff]
            ^ crc_table[1][(hi >> 16) & 0xff] ^ crc_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len-- > 0)
        c = crc_table[0][(c ^ *p++) & 0xff] ^ (c >> 8);
    return ~c;
}

int cs_crc32_is_zlib(void)
{
    return 0;
}

#endif
