/*
 * _writer.h -- the snapshot writer in C (design: the header of _writer.c)
 *
 * Compiled into cowstate._codec beside the codec (_codec.c), whose module
 * (_codecmodule.c) publishes these as `write_blocks`, `freeze_changes` and `snapshot_type`.
 */
#ifndef COWSTATE_WRITER_H
#define COWSTATE_WRITER_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* write_blocks(stream, position, first, last, states, cancelled, written,
 * python_section, buffer_size) -> (offsets, entries, position): with the
 * GIL; _writer.c's header says what each argument is. */
PyObject *cw_write_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* freeze_changes(snapshot, since) -> a FrozenChanges (key, namespace, state of each
 * entry with state_version >= since, in the walk's order), or None when one
 * of them could change: with the GIL; _writer.c's "Frozen changes". */
PyObject *cw_freeze_changes(PyObject *self, PyObject *const *args, Py_ssize_t nargs);

/* snapshot_type() -> the C map's snapshot type the writer walks, or None when
 * cowstate._cmap is not built (or has another layout: then an error). */
PyObject *cw_snapshot_type(PyObject *self, PyObject *unused);

/* FrozenChanges: key, namespace, state per entry, flat (_writer.c); made by
 * cw_frozen_new(n) (n references, all NULL, to be filled before any other
 * code sees it) and its items array. */
extern PyTypeObject cw_FrozenType;
PyObject *cw_frozen_new(Py_ssize_t n);
PyObject **cw_frozen_items(PyObject *frozen);

/* The planted writer bug this build carries (COWSTATE_WRITER_BUG; 0: none). */
int cw_planted_bug(void);

#endif /* COWSTATE_WRITER_H */
