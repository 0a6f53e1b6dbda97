/*
 * _codec.h -- the C codec of snapshot entries (design: the header of _codec.c)
 *
 * A plain C library compiled into the extension modules that need it
 * (cowstate._codec today; the C snapshot writer next): the bytes of the
 * value codec (cowstate.value_codec) and of the Java-encoding key
 * serializers (cowstate.serializers), byte for byte those of the Python
 * serializers, their decoders, and CRC32 as zlib.crc32 computes it.
 *
 * Encoders never set a Python exception: they return a status, and on any
 * status but CS_OK the buffer is back at the length it had (nothing of the
 * value is left in it).
 */
#ifndef COWSTATE_CODEC_H
#define COWSTATE_CODEC_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

/* What an encoder or decoder says. */
typedef enum {
    CS_OK = 0,
    /* Not encoded or decoded here: the Python serializer decides (it encodes,
     * or raises its own error). */
    CS_FALLBACK = 1,
    /* Called without the GIL on an object that may only be read with it (a
     * list, dict, set, anything not known immutable): call again with it. */
    CS_NEEDS_GIL = 2,
    /* malloc/realloc failed; with the GIL the caller raises MemoryError. */
    CS_NOMEM = 3,
    /* Decoders only: a Python exception is set (MemoryError, ...). */
    CS_ERROR = 4,
} cs_status;

/* Which serializer a value is encoded with (a state's key, namespace or
 * state serializer); CS_KIND_PYTHON: none of the built-in ones here. */
typedef enum {
    CS_KIND_PYTHON = 0,
    CS_KIND_VALUE = 1, /* DefaultSerializer / ImmutableSerializer: the value codec */
    CS_KIND_INT32 = 2, /* IntSerializer: 4 bytes big-endian */
    CS_KIND_INT64 = 3, /* LongSerializer: 8 bytes big-endian */
    CS_KIND_UTF8 = 4,  /* StringSerializer: UTF-8, lone surrogates kept */
    CS_KIND_BYTES = 5, /* BytesSerializer: the bytes as they are */
} cs_kind;
#define CS_KIND_COUNT 6

/* A growable byte buffer; malloc/realloc only (usable without the GIL). */
typedef struct {
    unsigned char *data;
    size_t len;
    size_t cap;
} cs_buf;

void cs_buf_init(cs_buf *b);
void cs_buf_free(cs_buf *b);
/* Room for `extra` more bytes; 0 or -1 (out of memory). */
int cs_buf_reserve(cs_buf *b, size_t extra);

/* Once, when the module that links this library is initialised (the CRC
 * tables of the table-driven CRC32). */
void cs_init(void);

/* With the GIL, once before encoding or decoding: looks up
 * cowstate.VOID_NAMESPACE (imported late, as value_codec does). Returns 0;
 * when the import fails the error is cleared and VOID_NAMESPACE is simply
 * not recognised (the Python serializer then decides). Safe to call often. */
int cs_prepare(void);

/* Append the bytes of `v` under serializer `kind` (not CS_KIND_PYTHON).
 * gil_held == 0: reads only immutable objects of exact built-in types, by
 * their struct fields -- no Python API call, no reference count touched
 * (_codec.c's header says which fields and why); anything else is
 * CS_NEEDS_GIL. */
cs_status cs_encode(cs_kind kind, PyObject *v, cs_buf *out, int gil_held);
/* cs_encode(CS_KIND_VALUE, ...): the value codec's bytes, version byte first. */
cs_status cs_encode_value(PyObject *v, cs_buf *out, int gil_held);

/* 1 when `v` can never change: exactly None, bool, VOID_NAMESPACE (by
 * address), or of exact type int, float, str, bytes, or a tuple of such (at
 * most CS_MAX_EXT_DEPTH tuples deep); else 0 (a list, dict, set, a subclass,
 * anything else). With the GIL (cs_prepare called); reads the types and a
 * tuple's items only. What a heap delta may hold once its snapshot is gone
 * (_writer.c, "Frozen changes"). */
int cs_immutable(PyObject *v);

/* With the GIL: the object the bytes decode to under `kind` (a new
 * reference), or NULL with *status CS_FALLBACK (no exception set: the bytes
 * are for the Python deserializer, which decodes or refuses them with its own
 * error) or CS_ERROR (an exception is set). */
PyObject *cs_decode(cs_kind kind, const unsigned char *data, Py_ssize_t len, cs_status *status);
PyObject *cs_decode_value(const unsigned char *data, Py_ssize_t len, cs_status *status);

/* zlib.crc32(data, crc); no Python API, usable without the GIL. */
uint32_t cs_crc32(uint32_t crc, const void *data, size_t len);
/* 1 when cs_crc32 is zlib's, 0 when it is the table-driven one here. */
int cs_crc32_is_zlib(void);

/* The value codec's nesting limits (cowstate.value_codec). */
#define CS_MAX_CONTAINER_DEPTH 1024
#define CS_MAX_EXT_DEPTH 8

#endif /* COWSTATE_CODEC_H */
