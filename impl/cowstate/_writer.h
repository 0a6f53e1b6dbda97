/*
 * _writer.h -- the snapshot writer in C (design: the header of _writer.c)
 *
 * Compiled into cowstate._codec beside the codec (_codec.c), whose module
 * (_codecmodule.c) publishes these as `write_blocks` and `snapshot_type`.
 */
#ifndef COWSTATE_WRITER_H
#define COWSTATE_WRITER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* write_blocks(stream, position, first, last, states, cancelled, written,
 * python_section, buffer_size) -> (offsets, entries, position): with the
 * GIL; _writer.c's header says what each argument is. */
PyObject *cw_write_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* snapshot_type() -> the C map's snapshot type the writer walks, or None when
 * cowstate._cmap is not built (or has another layout: then an error). */
PyObject *cw_snapshot_type(PyObject *self, PyObject *unused);

/* The planted writer bug this build carries (COWSTATE_WRITER_BUG; 0: none). */
int cw_planted_bug(void);

#endif /* COWSTATE_WRITER_H */
