/*
 * _cmap.h -- the memory layout of the C map, shared by the code that reads it
 * ===========================================================================
 *
 * cowstate/_cmap.c is the map (its header comment is the design: rules E, S,
 * C, G, T, D, M and P, retirement by version, invariants 1-15). This header holds only what
 * another C module needs to READ a map or a snapshot: the structs, the two
 * slot accessors, and the layout record the map module publishes. Its readers:
 *
 *   - cowstate_spec/_cmap_probe.c, the test-only probe (structure export,
 *     the invariant checker in C, corruption hooks), built beside _cmap;
 *   - cowstate/_writer.c, the snapshot writer in C (in cowstate._codec),
 *     which encodes a snapshot's entries straight from its chunks, without
 *     the GIL where it can.
 *
 * The published layout
 * --------------------
 * The map module has a capsule `_LAYOUT` (named COWSTATE_LAYOUT_CAPSULE) that
 * points to a CmapLayout: COWSTATE_LAYOUT_VERSION, the sizes of the structs,
 * the map's and the snapshot's type objects as that module built them, and
 * the module's own pin and unpin of a snapshot (version 2). A
 * reader compiled from this header must, before it touches a struct of an
 * object:
 *
 *   1. take the layout from the capsule and require `version` and every size
 *      to equal its own (a module built from another revision of this header
 *      is refused, not misread);
 *   2. require the object's type to be exactly `map_type` (or `snap_type`):
 *      not a subclass, not a look-alike of the same name.
 *
 * Change any struct below, or what a field means, and raise
 * COWSTATE_LAYOUT_VERSION.
 *
 * Reading rules
 * -------------
 * - Every field is the map's: a reader never writes one (the probe's
 *   corruption hooks are the one deliberate exception, test-only).
 * - An entry an OPEN snapshot reaches (through its directory copies, its
 *   chunks and the `next` links) stays valid, fields and objects, until that
 *   snapshot is released: live entries the map may not change in place
 *   (rules C and E), retired ones wait in a batch (invariant 11). A pinned
 *   snapshot (`readers` > 0) is not released under its reader.
 * - A reader that lets other threads run while it reads (releases the GIL,
 *   or calls Python code) pins the snapshot first, with the GIL, through
 *   the layout's `snap_pin` (an open snapshot only: `released` == 0), and
 *   unpins it with `snap_unpin`, with the GIL, when done. A release() in
 *   between -- by any thread -- only marks the snapshot released; the
 *   version stays open (copy-on-write goes on protecting it) and its
 *   directories and retired entries stay allocated until the last unpin,
 *   which finishes the release. `readers` is written only by these two
 *   functions, the map's own.
 * - `key`, `ns` and `state` are strong references the entry owns; a reader
 *   borrows them. Without the GIL a reader may follow pointers and copy
 *   bytes, but make no Python API call and change no reference count.
 * - A retired entry's `next` may point to freed memory: only entries reached
 *   from a directory (live or a snapshot's) are followed.
 */

#ifndef COWSTATE_CMAP_H
#define COWSTATE_CMAP_H

#include <Python.h>
#include <stddef.h>
#include <stdint.h>

/* Raise with any change of a struct below or of what a field means. */
#define COWSTATE_LAYOUT_VERSION 6        /* 6: the map's spare chunks (rule P) */
#define COWSTATE_LAYOUT_CAPSULE "cowstate._cmap._LAYOUT"

#define CHUNK_BITS_MAX 10                 /* C = 1024 buckets per chunk */
#define MARK_WORDS ((1 << CHUNK_BITS_MAX) / 64)   /* a chunk's marks: one bit per bucket */

/* ------------------------------------------------------------------ types */

typedef struct Entry {
    struct Entry *next;
    PyObject *key;
    PyObject *ns;
    PyObject *state;
    uint64_t hash;
    int32_t entry_version;
    int32_t state_version;
} Entry;

/* One record of the removal log (rule D of _cmap.c): (key, ns) was removed
 * at map version `version`. The log owns both references. */
typedef struct Removal {
    PyObject *key;
    PyObject *ns;
    int32_t version;
} Removal;

/* Entries retired at one version, freed when no open snapshot is that old. */
typedef struct Batch {
    struct Batch *next;         /* older batches first */
    int32_t version;
    Py_ssize_t size;
    Py_ssize_t capacity;
    Entry **entries;
} Batch;

/* marks_since and marks are rule M of _cmap.c (invariant 14): while the map
 * tracks changes, every entry of bucket j whose state_version >=
 * max(marks_since, the map's tracking_since) has bit j of marks set. */
typedef struct Chunk {
    Py_ssize_t refs;            /* 0: a spare chunk of the map (rule P), on `spare` */
    int32_t marks_since;
    int32_t unused;
    uint64_t marks[MARK_WORDS];
    Entry *slots[];
} Chunk;

typedef struct Table {
    Chunk **dir;            /* NULL: no table (the rehash table when not rehashing) */
    Py_ssize_t capacity;    /* buckets */
    Py_ssize_t ndir;        /* chunks */
    int bits;               /* log2 of buckets per chunk */
} Table;

typedef struct MapObject {
    PyObject_HEAD
    Table primary;
    Table rehash;
    Py_ssize_t rehash_index;
    Py_ssize_t primary_size;
    Py_ssize_t rehash_size;
    Py_ssize_t threshold;
    int32_t version;
    int32_t highest;            /* H */
    int32_t guard;              /* get's rule S/T bound: H, or V while tracking (inv. 13) */
    int32_t *open;              /* open snapshot versions, ascending */
    Py_ssize_t nopen;
    Py_ssize_t open_cap;
    uint64_t mod_count;         /* mappings added or removed */
    uint64_t structure_count;   /* rehash steps */
    uint64_t stamp;             /* every structural write (re-entrancy check) */
    Py_ssize_t gc_entries;      /* live entries holding an object of a GC type (inv. 12) */
    Batch *retired;             /* oldest first; the newest is at `retired_tail` */
    Batch *retired_tail;
    Batch *garbage;             /* handed back (rule G): no open snapshot reaches them */
    Batch *garbage_tail;
    Py_ssize_t garbage_next;    /* the first entry of `garbage` not freed yet */
    PyObject *serializer;
    PyObject *weakreflist;
    int scalars_as_is;          /* the serializer copies scalars as themselves (rule S) */
    /* Change tracking (rules T and D, invariant 13); removal_limit 0: not tracking. */
    Py_ssize_t removal_limit;   /* the log's bound, >= 1 while tracking */
    int32_t tracking_since;     /* the oldest base a delta may be built against */
    Removal *removals;          /* the removal log, oldest first (NULL: empty) */
    Py_ssize_t nremovals;
    Py_ssize_t removals_cap;
    /* Rule P (invariant 15): chunks no directory holds, each of as many
     * buckets as the live primary's chunks, kept for rule C's copies; linked
     * through slots[0]. */
    struct Chunk *spare;
    Py_ssize_t nspare;
} MapObject;

typedef struct SnapObject {
    PyObject_HEAD
    MapObject *owner;
    Table primary;              /* copies of the directories, holding their chunks */
    Table rehash;
    Py_ssize_t r;               /* rehash index when taken */
    Py_ssize_t size;
    int32_t version;
    int released;
    int readers;                /* C calls reading the directories right now */
    int release_pending;        /* released while read: finish when readers == 0 */
    int hand_back;              /* released by hand_back(): the owner frees (rule G) */
    int32_t marks_from;         /* rule M: the chunks' marks hold from this version on
                                   (the map's tracking_since when taken; INT32_MAX: none) */
} SnapObject;

/* What the map module publishes in its `_LAYOUT` capsule (see the top). */
typedef struct CmapLayout {
    int version;                /* COWSTATE_LAYOUT_VERSION */
    size_t entry_size, batch_size, chunk_size, table_size, map_size, snap_size;
    PyTypeObject *map_type;
    PyTypeObject *snap_type;
    /* With the GIL only (see "Reading rules"): pin an open snapshot, unpin it. */
    void (*snap_pin)(SnapObject *s);
    void (*snap_unpin)(SnapObject *s);
} CmapLayout;

/* ------------------------------------------------------------- accessors */

static inline Py_ssize_t chunk_slots(const Table *t) { return (Py_ssize_t)1 << t->bits; }

/* Rule M: may a delta against base version `since` visit only the marked
 * buckets of chunk `c` of snapshot `s`? (Else every bucket of it.) */
static inline int marks_cover(const SnapObject *s, const Chunk *c, long long since)
{
    return since >= s->marks_from && since >= c->marks_since;
}

static inline int bucket_marked(const Chunk *c, Py_ssize_t slot)
{
    return (int)((c->marks[slot >> 6] >> (slot & 63)) & 1);
}

static inline Entry *slot_get(const Table *t, Py_ssize_t bucket)
{
    Chunk *c = t->dir[bucket >> t->bits];
    return c == NULL ? NULL : c->slots[bucket & (chunk_slots(t) - 1)];
}

#endif /* COWSTATE_CMAP_H */
