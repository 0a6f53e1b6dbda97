/*
 * _writer.c -- the snapshot writer in C: blocks straight from a C map
 * snapshot's chunks (API: _writer.h; in cowstate._codec)
 * ===================================================================
 *
 * cowstate.snapshot.writer.write_snapshot writes the header, the index and
 * the footer; this file writes the blocks between them, key group by key
 * group, byte for byte as the Python loops do (cowstate/snapshot/format.py is
 * the layout): per key group a 12-byte head, the payload (per state with
 * entries, by id: state id, entry count, and per entry the u32-framed
 * namespace, key and state bytes), and the CRC32 of head and payload.
 *
 * A state is *walked* here when its table snapshot is one C map snapshot per
 * key group (type exactly the `snap_type` of cowstate._cmap's `_LAYOUT`),
 * without a snapshot transformer, and its key, namespace and state
 * serializers are all built into the C codec: its entries are read from the
 * snapshot's directories, chunks and chains (the order of the snapshot's
 * items(): primary[r:L], rehash[0:r], rehash[L:L+r], each chain from its head)
 * and encoded by cs_encode into the block -- no Python object per entry. A
 * value the codec hands back (CS_FALLBACK: a subclass, a bytearray, a big
 * value) is encoded by its Python serializer, with the GIL, into the same
 * frame. Any other state takes the Python path for that state only, in the
 * same block: python_section(state_id, key_group) returns its framed section.
 *
 * write_blocks(stream, position, first, last, states, cancelled, written,
 *              python_section, buffer_size) -> (offsets, entries, position)
 *
 *   stream          what stream.write(bytes) is called on
 *   position        the stream offset of the first block (after the header)
 *   first, last     the key groups, inclusive: one block each
 *   states          by state id: None (the Python path), or (snapshots by
 *                   key-group index, key kind, namespace kind, state kind,
 *                   key serialize, namespace serialize, state serialize,
 *                   since): since is None, or for a heap delta the base's map
 *                   version by key-group index -- only the entries with
 *                   state_version >= it are written (what changed since the
 *                   base, rule T of _cmap.c; a key group with none writes no
 *                   section for the state, as the Python path's
 *                   changed_items does). In a chunk whose marks serve the
 *                   base (rule M of _cmap.c: marks_cover), only the marked
 *                   buckets are visited.
 *   cancelled(kg)   or None: raises to stop (SnapshotCancelledError)
 *   written(kg)     kg's block was handed over: releases its key group
 *   python_section(state_id, kg) -> (count, bytes of the framed section)
 *   buffer_size     blocks are handed to the stream once this many bytes
 *                   wait (0: each block at once), and at the end
 *
 * Windows and the GIL
 * -------------------
 * Key groups are written in windows of up to WINDOW_ENTRIES entries
 * (WINDOW_KEY_GROUPS key groups). With the GIL, a window is *prepared*:
 * cancelled(kg) for each, the Python path's sections, and each walked
 * state's snapshot pinned (the layout's snap_pin, with a strong reference).
 * Then it is *framed*: blocks, entries and CRCs, WITHOUT the GIL (a window of
 * fewer than KEEP_GIL_BELOW entries keeps it: taking the GIL back may wait a
 * switch interval). Then, with the GIL, each block is *handed over* in
 * order: cancelled(kg) again (so a cancel set while earlier blocks were
 * written stops before this one, as in the Python loop), the buffer given to
 * stream.write once it holds buffer_size bytes, written(kg); and the
 * snapshots are unpinned. The stream's write releases the GIL itself while
 * it writes (io.FileIO), on one buffer of up to buffer_size bytes (8 MiB by
 * default: each write is a round trip of the GIL). written(kg) releases the
 * key group's table snapshot, which hands its C map snapshots back (rule G
 * of _cmap.c): the entries the owner replaced meanwhile are freed by the
 * owner's own writes, not here with the owner stopped.
 *
 * Errors come out as the Python loops raise them, the first in their order
 * (key group by key group, state by state): a Python section that raises
 * while a window is prepared ends the window before its key group; the
 * window is written, then that key group's walked states before it go
 * through the Python path (their error wins), then its error is raised. A
 * serializer the Python path calls may thus run for a later key group
 * before a walked state's fallback value of an earlier one: the order of
 * calls across states of different paths is not the Python loops'.
 *
 * While framing, an entry whose values are not all immutable (a list, dict
 * or set anywhere in it, or a value for a Python serializer) takes the GIL
 * back and is encoded with it held (cs_encode with gil_held = 1 reads the
 * container with no Python code running: no call, no Python allocation, so
 * nothing can mutate it meanwhile). Entries after it are encoded with the
 * GIL too until GIL_SLICE_NS (1 ms) passed since it was taken; then it is
 * given back, and the writer stays off it HAND_OVER_NS (a thread waiting for
 * the GIL is woken by the release but would lose the race to an immediate
 * re-take, and never ask for a switch: the switch number moved), so the
 * owner is never starved by a section of list states.
 *
 * What is read without the GIL, and why the owner cannot change it
 * ------------------------------------------------------------------
 * Only these, and only of snapshots pinned (and frozen changes held) in the
 * window's preparation:
 *
 *   SnapObject   primary, rehash (dir, capacity, bits, ndir), r, size, marks_from
 *   Chunk        slots[], marks_since, marks[] (the snapshot's directory
 *                copies hold the chunks)
 *   Entry        next, key, ns, state, state_version
 *   objects      what cs_encode(gil_held = 0) reads of exact None, bool,
 *                int, float, str, bytes, tuple and VOID_NAMESPACE (_codec.c's
 *                header: their fields are fixed from creation, (1)-(4)),
 *                and Python-path section bytes and FrozenChanges (ob_size,
 *                items[]) the window holds
 *
 * (a) The snapshot's fields: primary, rehash, r, size and marks_from are set when it is
 *     taken and never written again while it is pinned: a release() by any
 *     thread meanwhile only marks it released (`released`,
 *     `release_pending`, which are not read here) and the last unpin, with
 *     the GIL, frees the directories (_cmap.h's reading rules).
 * (b) The chunks: each holds a count (`refs`) for the snapshot's directory,
 *     so it has refs > 1 or is the snapshot's alone, and rule C forbids the
 *     owner to write a slot of a chunk with refs > 1: it copies the chunk
 *     into its live directory first; rule M marks only the live table's own
 *     chunks (refs == 1) too. The owner's change of `refs` (a word not read
 *     here) is all it writes on such a chunk. Rule P reuses only a chunk no
 *     directory holds (refs 0): never one of a pinned snapshot's.
 * (c) The entries: every entry a pinned snapshot reaches has an entry
 *     version below the snapshot's version, which stays open (the highest
 *     open version H is at least it), so rule E makes the owner copy the
 *     entry instead of writing its `next`, key, namespace, state or
 *     state_version (rule T marks a state handed out by setting its
 *     state_version: rule E first, so only on the owner's copy); removed
 *     or replaced, it is retired, not freed, while the version is open
 *     (invariant 11). So `next` leads only through entries of the snapshot.
 * (d) The objects: each entry holds strong references to its key,
 *     namespace and state; rule S makes the owner copy a state before
 *     handing it out for mutation after the snapshot; and the immutable
 *     objects read here cannot change after creation.
 *
 * No Python API call and no reference-count change happen without the GIL:
 * pins, references, serializer calls, stream writes and every error are made
 * with it; the framing itself uses malloc/realloc only (cs_buf).
 *
 * A user who breaks the contract -- keeps a list state from before the
 * snapshot and mutates it in place (rule S cannot copy what it never hands
 * out) -- changes what the snapshot holds for that entry: the file may hold
 * the old or the new contents, or a mix of two mutations between entries.
 * It cannot crash the writer or make it read freed memory: such a state is
 * only read with the GIL held and no Python code running, so it is never
 * seen half-mutated, and the entry keeps it alive.
 *
 * Frozen changes
 * --------------
 * freeze_changes(snapshot, since), with the GIL on the owner's thread (a heap
 * delta's synchronous part: I6 of cowstate.heap_incremental), walks the
 * snapshot as a delta's section would be framed (walk, the same marks and
 * order) but collects instead of framing: per entry with state_version >=
 * since, new references to its key, namespace and state, into one
 * FrozenChanges (key, namespace, state, key, ...: a sequence, immutable).
 * It refuses (returns None) as soon
 * as one of those is not cs_immutable -- a list, dict, set, subclass, any
 * object that could change -- because the caller then releases the map
 * snapshot: rule S no longer copies a state the owner gets, so only a
 * value that can never change may outlive it there. The snapshot is pinned
 * while the walk and the allocation run (a finalizer may release it). A
 * refused walk drops what it collected. Dropping a FrozenChanges (with the
 * GIL, on the writer's thread once its key group is written) prefetches the
 * objects a few entries ahead of each decref.
 *
 * write_blocks takes a FrozenChanges in place of a key group's snapshot (the
 * `snapshots` list of a state): prepare holds a reference to it for the
 * window and counts its entries, frame_frozen frames them in order, without
 * the GIL as a walk does. What it reads then: its ob_size and items[]
 * (fixed once made; the window's reference keeps it and, through it, every
 * object alive) and the objects as (d)
 * below. A heap-removals file takes the same path: flat_removals (in
 * _codecmodule.c) puts its (key, namespace) pairs in this form with an empty
 * bytes state.
 *
 * Test knobs: -DCOWSTATE_WRITER_BUG=n plants one defect the differential
 * tests must catch (cowstate_spec.bad_codecs.WRITER_BUGS): 1 an entry
 * skipped at a chunk boundary (counted, not written), 2 the CRC over a stale
 * buffer (the block as it was before its last entry), 3 a frame's length
 * off by one for a non-ASCII str, 4 a key group released (written(kg)) as
 * soon as it is prepared, before its entries are encoded -- the pin keeps
 * the memory valid, so what it breaks is the release order: a key group
 * released before its block reaches the stream; 5 a delta that leaves out
 * the changes made at the base's own version; 6 a delta that trusts a
 * chunk's marks although they start after its base (a chunk changed after a
 * later snapshot than the base: its earlier changes are not marked); 7
 * freeze_changes collecting a state it must refuse (a list: the owner's
 * in-place change after a get then reaches the delta).
 */
#include "_writer.h"

#include <limits.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "_cmap.h"
#include "_codec.h"

#ifndef COWSTATE_WRITER_BUG
#define COWSTATE_WRITER_BUG 0
#endif
#define PLANTED(bug) (COWSTATE_WRITER_BUG == (bug))
#define WBUG_SKIPS_ENTRY_AT_CHUNK_BOUNDARY 1
#define WBUG_CRC_OVER_STALE_BUFFER 2
#define WBUG_NON_ASCII_FRAME_OFF_BY_ONE 3
#define WBUG_RELEASES_BEFORE_ENCODING 4
#define WBUG_DELTA_SINCE_OFF_BY_ONE 5
#define WBUG_TRUSTS_MARKS_OF_A_LATER_ERA 6
#define WBUG_FREEZES_A_MUTABLE_STATE 7

#define WINDOW_ENTRIES ((Py_ssize_t)1 << 16)
#define WINDOW_KEY_GROUPS 1024
#define KEEP_GIL_BELOW 1024
#define GIL_SLICE_NS 1000000ULL
#define HAND_OVER_NS 50000L
#define PREFETCH_SLOT 24    /* marked buckets ahead: the slot (flush_marked) */
#define PREFETCH_ENTRY 16   /* buckets ahead: the head entry */
#define PREFETCH_OBJECTS 8  /* buckets ahead: its key and state */
#define PREFETCH_CHUNKS 4   /* chunks ahead: the head and marks a delta's walk reads */

int cw_planted_bug(void) { return COWSTATE_WRITER_BUG; }

/* The map module's layout (held for the process: the module is never unloaded). */
static const CmapLayout *layout;

static int load_layout(int required)
{
    if (layout != NULL)
        return 0;
    PyObject *module = PyImport_ImportModule("cowstate._cmap");
    if (module == NULL) {
        if (!required && PyErr_ExceptionMatches(PyExc_ImportError)) {
            PyErr_Clear();
            return 1;
        }
        return -1;
    }
    PyObject *capsule = PyObject_GetAttrString(module, "_LAYOUT");
    Py_DECREF(module);
    if (capsule == NULL)
        return -1;
    const CmapLayout *found = PyCapsule_GetPointer(capsule, COWSTATE_LAYOUT_CAPSULE);
    Py_DECREF(capsule); /* the module keeps the capsule, sys.modules the module */
    if (found == NULL)
        return -1;
    if (found->version != COWSTATE_LAYOUT_VERSION || found->entry_size != sizeof(Entry)
        || found->chunk_size != sizeof(Chunk) || found->table_size != sizeof(Table)
        || found->map_size != sizeof(MapObject) || found->snap_size != sizeof(SnapObject)
        || found->batch_size != sizeof(Batch)) {
        PyErr_Format(PyExc_ImportError,
                     "expected cowstate._cmap of layout version %d with this writer's struct "
                     "sizes, got version %d: rebuild the extensions",
                     COWSTATE_LAYOUT_VERSION, found->version);
        return -1;
    }
    layout = found;
    return 0;
}

PyObject *cw_snapshot_type(PyObject *self, PyObject *unused)
{
    int rc = load_layout(0);
    if (rc < 0)
        return NULL;
    if (rc == 1)
        Py_RETURN_NONE;
    return Py_NewRef((PyObject *)layout->snap_type);
}

/* ------------------------------------------------------ frozen changes */

/* Key, namespace and state per entry, flat ("Frozen changes" above). Made
 * whole by freeze_changes or flat_removals and never changed after. Not a
 * GC type: it holds a map's keys, namespaces and states -- from
 * freeze_changes only what cs_immutable admits, from flat_removals removed
 * keys and namespaces (any hashable object; the writer frames one that is
 * not immutable with the GIL, as frame_entry does) and b"" -- and the
 * library hands it to no user code, so none of those can come to hold it:
 * no cycle runs through it. */
typedef struct {
    PyObject_VAR_HEAD
    PyObject *items[1];
} FrozenObject;

/* Drop the references in order, fetching the objects of the entries a few
 * ahead (each decref writes a random line of memory: at 10M mappings, a
 * delta's 75,000 changes took 6 ms of the writer's GIL without). */
static void Frozen_dealloc(FrozenObject *f)
{
    Py_ssize_t n = Py_SIZE(f);
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH_OBJECTS * 3 < n && f->items[i + PREFETCH_OBJECTS * 3] != NULL)
            __builtin_prefetch(f->items[i + PREFETCH_OBJECTS * 3], 1);
        Py_XDECREF(f->items[i]);
    }
    Py_TYPE(f)->tp_free((PyObject *)f);
}

static Py_ssize_t Frozen_length(FrozenObject *f) { return Py_SIZE(f); }

static PyObject *Frozen_item(FrozenObject *f, Py_ssize_t i)
{
    if (i < 0 || i >= Py_SIZE(f)) {
        PyErr_SetString(PyExc_IndexError, "FrozenChanges index out of range");
        return NULL;
    }
    return Py_NewRef(f->items[i]);
}

static PySequenceMethods Frozen_as_sequence = {
    .sq_length = (lenfunc)Frozen_length,
    .sq_item = (ssizeargfunc)Frozen_item,
};

PyTypeObject cw_FrozenType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cowstate._codec.FrozenChanges",
    .tp_basicsize = offsetof(FrozenObject, items),
    .tp_itemsize = sizeof(PyObject *),
    .tp_dealloc = (destructor)Frozen_dealloc,
    .tp_as_sequence = &Frozen_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A heap delta's changes held apart from their snapshot: key, namespace and "
              "state per entry, flat (freeze_changes, flat_removals; _writer.c).",
};

PyObject *cw_frozen_new(Py_ssize_t n)
{
    FrozenObject *f = PyObject_NewVar(FrozenObject, &cw_FrozenType, n);
    if (f != NULL)
        memset(f->items, 0, (size_t)n * sizeof(PyObject *)); /* NULL: nothing to drop yet */
    return (PyObject *)f;
}

PyObject **cw_frozen_items(PyObject *frozen) { return ((FrozenObject *)frozen)->items; }

/* ------------------------------------------------------------- the GIL */

typedef struct {
    PyThreadState *ts;  /* non-NULL while the GIL is released */
    int keep_gil;       /* this window is framed with the GIL held */
    uint64_t held_since;
    unsigned ticks;
    int nomem;          /* out of memory without the GIL: raised once it is back */
    int size_mismatch;  /* a snapshot's chains hold another count than its size */
    cs_buf out;         /* blocks not handed over yet */
    Entry *const **marked;  /* slots of marked buckets queued by walk_marked (malloc) */
    size_t nmarked, marked_cap;
    size_t last_entry;  /* where the last entry framed starts (WBUG_CRC_OVER_STALE_BUFFER) */
    int gathering;      /* freeze_changes: walk_chain collects the entries, frames nothing */
    int refused;        /* freeze_changes met a value that is not immutable */
    PyObject **held;    /* key, ns, state of each entry collected (strong references) */
    size_t nheld, held_cap;
} Writer;

static uint64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ULL + (uint64_t)t.tv_nsec;
}

static void gil_take(Writer *w)
{
    if (w->ts == NULL)
        return;
    PyEval_RestoreThread(w->ts);
    w->ts = NULL;
    w->held_since = now_ns();
    w->ticks = 0;
}

/* Release the GIL; `hand_over`: stay off it a moment (see the header). */
static void gil_give(Writer *w, int hand_over)
{
    if (w->ts != NULL || w->keep_gil)
        return;
    w->ts = PyEval_SaveThread();
    if (hand_over) {
        struct timespec pause = {0, HAND_OVER_NS};
        nanosleep(&pause, NULL);
    }
}

/* With the GIL, after an entry: give it back once it was held a slice. */
static void gil_tick(Writer *w)
{
    if (w->keep_gil || (++w->ticks & 15) != 0)
        return;
    if (now_ns() - w->held_since >= GIL_SLICE_NS)
        gil_give(w, 1);
}

/* ------------------------------------------------------------ framing */

typedef struct {
    int python;              /* 1: python_section frames this state */
    PyObject *snapshots;     /* list by key-group index (the `states` argument holds it) */
    cs_kind kinds[3];        /* namespace, key, state: the order of the frames */
    PyObject *serialize[3];
    long long *since;        /* by key-group index: write only state_version >= it; or NULL */
} Spec;

static inline void put_u32_at(unsigned char *at, uint32_t v)
{
    at[0] = (unsigned char)(v >> 24);
    at[1] = (unsigned char)(v >> 16);
    at[2] = (unsigned char)(v >> 8);
    at[3] = (unsigned char)v;
}

/* Frame one entry's three values at the end of w->out. gil: whether it is
 * held. 0 framed; 1 (without the GIL only) a value needs it: nothing of the
 * entry is left; -1 error (w->nomem, or with the GIL a Python exception). */
static int frame_entry(Writer *w, const Spec *sp, PyObject *const objs[3], int gil)
{
    cs_buf *out = &w->out;
    size_t start = out->len;
    for (int r = 0; r < 3; r++) {
        if (cs_buf_reserve(out, 4) < 0) {
            w->nomem = 1;
            return -1;
        }
        size_t at = out->len;
        out->len += 4;
        cs_status status = cs_encode(sp->kinds[r], objs[r], out, gil);
        if (status == CS_NOMEM) {
            w->nomem = 1;
            return -1;
        }
        if (status == CS_OK && out->len - at - 4 <= 0xFFFFFFFFu) {
            uint32_t len = (uint32_t)(out->len - at - 4);
            if (PLANTED(WBUG_NON_ASCII_FRAME_OFF_BY_ONE) && PyUnicode_CheckExact(objs[r])
                && !PyUnicode_IS_ASCII(objs[r]))
                len++; /* planted */
            put_u32_at(out->data + at, len);
            continue;
        }
        if (!gil) {
            out->len = start;
            return 1;
        }
        out->len = at + 4;
        if (status == CS_OK) { /* more than a u32 frame holds: as the Python writer fails */
            PyErr_SetString(PyExc_OverflowError,
                            "expected a value of at most 4294967295 bytes, got more");
            return -1;
        }
        /* CS_FALLBACK: the Python serializer writes this value */
        PyObject *data = PyObject_CallOneArg(sp->serialize[r], objs[r]);
        if (data == NULL)
            return -1;
        if (!PyBytes_CheckExact(data) || (size_t)PyBytes_GET_SIZE(data) > 0xFFFFFFFFu) {
            PyErr_Format(PyExc_TypeError, "expected bytes of at most 4294967295 from %R, got %.100s",
                         sp->serialize[r], Py_TYPE(data)->tp_name);
            Py_DECREF(data);
            return -1;
        }
        size_t len = (size_t)PyBytes_GET_SIZE(data);
        if (cs_buf_reserve(out, len) < 0) {
            Py_DECREF(data);
            w->nomem = 1;
            return -1;
        }
        memcpy(out->data + out->len, PyBytes_AS_STRING(data), len);
        out->len += len;
        put_u32_at(out->data + at, (uint32_t)len);
        Py_DECREF(data);
    }
    return 0;
}

/* Frame one entry (namespace, key, state), without the GIL if it can. */
static int encode_objs(Writer *w, const Spec *sp, PyObject *const objs[3])
{
    w->last_entry = w->out.len;
    if (w->ts != NULL) {
        int rc = frame_entry(w, sp, objs, 0);
        if (rc <= 0)
            return rc;
        gil_take(w); /* this entry needs the GIL */
    }
    if (frame_entry(w, sp, objs, 1) < 0)
        return -1;
    gil_tick(w);
    return 0;
}

static int encode_entry(Writer *w, const Spec *sp, const Entry *e)
{
    PyObject *const objs[3] = {e->ns, e->key, e->state};
    return encode_objs(w, sp, objs);
}

/* freeze_changes: collect an entry's key, namespace and state (the GIL held),
 * or refuse the snapshot if one of them could change ("Frozen changes"). */
static int gather_entry(Writer *w, const Entry *e)
{
    if (!cs_immutable(e->key) || !cs_immutable(e->ns)
        || (!cs_immutable(e->state) && !PLANTED(WBUG_FREEZES_A_MUTABLE_STATE))) {
        w->refused = 1;
        return -1;
    }
    if (w->nheld + 3 > w->held_cap) {
        size_t cap = w->held_cap ? 2 * w->held_cap : 3 * 256;
        PyObject **grown = realloc(w->held, cap * sizeof *grown);
        if (grown == NULL) {
            w->nomem = 1;
            return -1;
        }
        w->held = grown;
        w->held_cap = cap;
    }
    /* owned here at once, while the objects are in cache (the GIL is held:
     * freeze_changes runs on the owner's thread) */
    w->held[w->nheld++] = Py_NewRef(e->key);
    w->held[w->nheld++] = Py_NewRef(e->ns);
    w->held[w->nheld++] = Py_NewRef(e->state);
    return 0;
}

/* Frame the chain of one bucket (a delta: only state_version >= since). */
static int walk_chain(Writer *w, const Spec *sp, const Entry *e, long long since,
                      Py_ssize_t *n, Py_ssize_t *written)
{
    for (; e != NULL; e = e->next) {
        (*n)++;
        /* A delta (`since`): an entry whose state_version is below the base's
         * version holds the base's mapping (rule T of _cmap.c). */
        if (e->state_version < since + PLANTED(WBUG_DELTA_SINCE_OFF_BY_ONE))
            continue;
        if ((w->gathering ? gather_entry(w, e) : encode_entry(w, sp, e)) < 0)
            return -1;
        (*written)++;
    }
    return 0;
}

/* Rule M of _cmap.c: a delta may visit only the marked buckets of `c`. */
static inline int marks_serve(const SnapObject *s, const Chunk *c, long long since)
{
    if (since == LLONG_MIN) /* a full snapshot: every bucket */
        return 0;
    if (PLANTED(WBUG_TRUSTS_MARKS_OF_A_LATER_ERA))
        return since >= s->marks_from; /* planted: the chunk's marks_since unread */
    return marks_cover(s, c, since);
}

/* Queue the slots of the marked buckets [lo, hi) of chunk `c` (bucket numbers
 * of table t), in bucket order, for flush_marked. */
static int walk_marked(Writer *w, const Table *t, const Chunk *c, Py_ssize_t lo, Py_ssize_t hi)
{
    Py_ssize_t per = chunk_slots(t), base = lo & ~(per - 1);
    Py_ssize_t first = lo - base, last = hi - base; /* slots [first, last) */
    for (Py_ssize_t word = first >> 6; word <= (last - 1) >> 6; word++) {
        uint64_t bits = c->marks[word];
        if (word == first >> 6)
            bits &= ~(uint64_t)0 << (first & 63);
        if (word == (last - 1) >> 6 && (last & 63) != 0)
            bits &= ~(~(uint64_t)0 << (last & 63));
        while (bits != 0) {
            Py_ssize_t slot = word * 64 + __builtin_ctzll(bits);
            bits &= bits - 1;
            if (w->nmarked == w->marked_cap) {
                size_t cap = w->marked_cap ? 2 * w->marked_cap : 1024;
                Entry *const **grown = realloc((void *)w->marked, cap * sizeof *grown);
                if (grown == NULL) {
                    w->nomem = 1;
                    return -1;
                }
                w->marked = grown;
                w->marked_cap = cap;
            }
            w->marked[w->nmarked++] = &c->slots[slot];
        }
    }
    return 0;
}

/* Frame the chains of the queued slots, in order. A marked bucket is a
 * random place in memory, and so are its entry and objects: a pipeline of
 * prefetches (the slot PREFETCH_SLOT ahead, its head entry PREFETCH_ENTRY
 * ahead, that entry's key and state PREFETCH_OBJECTS ahead) overlaps
 * their misses, as the whole walk's does for consecutive buckets. */
static int flush_marked(Writer *w, const Spec *sp, long long since, Py_ssize_t *n,
                        Py_ssize_t *written)
{
    size_t count = w->nmarked;
    Entry *const **queued = w->marked;
    w->nmarked = 0;
    for (size_t i = 0; i < count; i++) {
        if (i + PREFETCH_SLOT < count)
            __builtin_prefetch(queued[i + PREFETCH_SLOT]);
        if (i + PREFETCH_ENTRY < count && *queued[i + PREFETCH_ENTRY] != NULL)
            __builtin_prefetch(*queued[i + PREFETCH_ENTRY]);
        if (i + PREFETCH_OBJECTS < count) {
            const Entry *ahead = *queued[i + PREFETCH_OBJECTS];
            if (ahead != NULL) {
                __builtin_prefetch(ahead->key);
                __builtin_prefetch(ahead->state);
            }
        }
        if (walk_chain(w, sp, *queued[i], since, n, written) < 0)
            return -1;
    }
    return 0;
}

/* A state's section: a 6-byte head (state id, entry count) then its entries.
 * section_open reserves the head; section_close fills it in, or drops the
 * section when it holds no entry (as in Python: no empty section). */
static int section_open(Writer *w, size_t *head)
{
    if (cs_buf_reserve(&w->out, 6) < 0) {
        w->nomem = 1;
        return -1;
    }
    *head = w->out.len;
    w->out.len += 6;
    return 0;
}

static void section_close(Writer *w, size_t head, int state_id, uint32_t written,
                          uint32_t *count)
{
    if (written == 0) {
        w->out.len = head;
        return;
    }
    unsigned char *at = w->out.data + head;
    at[0] = (unsigned char)(state_id >> 8);
    at[1] = (unsigned char)state_id;
    put_u32_at(at + 2, written);
    *count += written;
}

/* Frame the section of a pinned snapshot: its entries in items() order. A
 * delta visits, in each chunk whose marks serve its base (rule M), only the
 * marked buckets: then not every entry is counted, and the count is not
 * compared with the snapshot's size. */
static int walk(Writer *w, const Spec *sp, const SnapObject *s, int state_id, long long since,
                uint32_t *count)
{
    if (s->size == 0)
        return 0;
    size_t head;
    if (section_open(w, &head) < 0)
        return -1;
    const Table *tables[3];
    Py_ssize_t begin[3], end[3], regions;
    if (s->rehash.dir == NULL) {
        tables[0] = &s->primary; begin[0] = 0; end[0] = s->primary.capacity;
        regions = 1;
    }
    else {
        tables[0] = &s->primary; begin[0] = s->r; end[0] = s->primary.capacity;
        tables[1] = &s->rehash; begin[1] = 0; end[1] = s->r;
        tables[2] = &s->rehash; begin[2] = s->primary.capacity;
        end[2] = s->primary.capacity + s->r;
        regions = 3;
    }
    Py_ssize_t n = 0, written = 0; /* entries walked, entries framed */
    int counted = 1;               /* every entry walked: n must be the size */
    w->nmarked = 0;                /* nothing queued of another snapshot (a walk that failed) */
    for (Py_ssize_t k = 0; k < regions; k++) {
        const Table *t = tables[k];
        if (t->dir == NULL)
            continue;
        Py_ssize_t per = chunk_slots(t);
        for (Py_ssize_t b = begin[k]; b < end[k]; b++) {
            const Chunk *c = t->dir[b >> t->bits];
            if (c == NULL) { /* an unallocated chunk: all empty */
                b = (((b >> t->bits) + 1) << t->bits) - 1;
                continue;
            }
            if (since != LLONG_MIN && (b == begin[k] || (b & (per - 1)) == 0)
                && (b >> t->bits) + PREFETCH_CHUNKS < t->ndir) {
                /* a delta reads every chunk's head and marks (3 lines) and
                 * few of its slots: fetch those of a chunk ahead */
                const char *ahead = (const char *)t->dir[(b >> t->bits) + PREFETCH_CHUNKS];
                if (ahead != NULL) {
                    __builtin_prefetch(ahead);
                    __builtin_prefetch(ahead + 64);
                    __builtin_prefetch(ahead + 128);
                }
            }
            if (marks_serve(s, c, since)) { /* the rest of this chunk by its marks */
                Py_ssize_t hi = ((b >> t->bits) + 1) << t->bits;
                if (hi > end[k])
                    hi = end[k];
                if (walk_marked(w, t, c, b, hi) < 0)
                    return -1;
                counted = 0;
                b = hi - 1;
                continue;
            }
            /* a bucket walked whole: the queued ones come first (items() order) */
            if (w->nmarked > 0 && flush_marked(w, sp, since, &n, &written) < 0)
                return -1;
            /* Entries sit in memory in insertion order, buckets in hash order:
             * each is a cache miss, and so are its objects. Prefetch the head
             * of bucket b + PREFETCH_ENTRY and the key and state of bucket
             * b + PREFETCH_OBJECTS (its head fetched 8 buckets ago): only
             * slots of chunks of this snapshot and entries it reaches are read. */
            if (b + PREFETCH_ENTRY < end[k]) {
                const Chunk *ahead = t->dir[(b + PREFETCH_ENTRY) >> t->bits];
                if (ahead != NULL)
                    __builtin_prefetch(ahead->slots[(b + PREFETCH_ENTRY) & (per - 1)]);
            }
            if (b + PREFETCH_OBJECTS < end[k]) {
                const Chunk *ahead = t->dir[(b + PREFETCH_OBJECTS) >> t->bits];
                const Entry *next =
                    ahead == NULL ? NULL : ahead->slots[(b + PREFETCH_OBJECTS) & (per - 1)];
                if (next != NULL) {
                    __builtin_prefetch(next->key);
                    __builtin_prefetch(next->state);
                }
            }
            const Entry *e = c->slots[b & (per - 1)];
            if (PLANTED(WBUG_SKIPS_ENTRY_AT_CHUNK_BOUNDARY) && e != NULL && b != begin[k]
                && (b & (per - 1)) == 0) {
                e = e->next; /* planted: counted, never written */
                n++;
            }
            if (walk_chain(w, sp, e, since, &n, &written) < 0)
                return -1;
        }
    }
    if (w->nmarked > 0 && flush_marked(w, sp, since, &n, &written) < 0)
        return -1;
    if ((counted && n != s->size) || n > 0xFFFFFFFF || written > 0xFFFFFFFF) {
        w->size_mismatch = 1;
        return -1;
    }
    section_close(w, head, state_id, (uint32_t)written, count); /* none: nothing changed */
    return 0;
}

/* Frame the section of frozen changes (key, namespace and state per entry,
 * in the walk's order): what walk() framed from the snapshot they were
 * collected from. */
static int frame_frozen(Writer *w, const Spec *sp, PyObject *frozen, int state_id,
                        uint32_t *count)
{
    Py_ssize_t n = Py_SIZE(frozen) / 3;
    if (n == 0) /* nothing changed since the base: no section, as in Python */
        return 0;
    if (n > 0xFFFFFFFF) {
        w->size_mismatch = 1;
        return -1;
    }
    size_t head;
    if (section_open(w, &head) < 0)
        return -1;
    PyObject *const *items = ((FrozenObject *)frozen)->items;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i + PREFETCH_OBJECTS < n) {
            __builtin_prefetch(items[3 * (i + PREFETCH_OBJECTS)]);
            __builtin_prefetch(items[3 * (i + PREFETCH_OBJECTS) + 2]);
        }
        PyObject *const objs[3] = {items[3 * i + 1], items[3 * i], items[3 * i + 2]};
        if (encode_objs(w, sp, objs) < 0)
            return -1;
    }
    section_close(w, head, state_id, (uint32_t)n, count);
    return 0;
}

/* ------------------------------------------------------------ windows */

typedef struct {
    Py_ssize_t nstates, cap;
    Py_ssize_t used;          /* key groups in the window */
    SnapObject **snaps;       /* [used * nstates]: pinned, owned; or NULL */
    PyObject **frozen;        /* [used * nstates]: FrozenChanges, owned; or NULL */
    PyObject **sections;      /* [used * nstates]: bytes from python_section, owned; or NULL */
    size_t *block_end;        /* [used]: where each block ends in out */
    size_t *block_start;
    uint32_t *counts;
} Window;

static void window_clear(Window *win)
{
    for (Py_ssize_t i = 0; i < win->used * win->nstates; i++) {
        if (win->snaps[i] != NULL) {
            layout->snap_unpin(win->snaps[i]);
            Py_CLEAR(win->snaps[i]);
        }
        Py_CLEAR(win->frozen[i]);
        Py_CLEAR(win->sections[i]);
    }
    win->used = 0;
}

static int call_kg(PyObject *fn, long kg)
{
    if (fn == Py_None)
        return 0;
    PyObject *arg = PyLong_FromLong(kg);
    PyObject *r = arg == NULL ? NULL : PyObject_CallOneArg(fn, arg);
    Py_XDECREF(arg);
    Py_XDECREF(r);
    return r == NULL ? -1 : 0;
}

/* python_section(state_id, kg): its bytes (owned), or NULL on error. */
static PyObject *python_section(PyObject *fn, Py_ssize_t state_id, long kg)
{
    PyObject *r = PyObject_CallFunction(fn, "nl", state_id, kg);
    if (r == NULL)
        return NULL;
    if (!PyTuple_CheckExact(r) || PyTuple_GET_SIZE(r) != 2
        || !PyBytes_CheckExact(PyTuple_GET_ITEM(r, 1))) {
        PyErr_Format(PyExc_TypeError, "expected (count, bytes) from python_section, got %R", r);
        Py_DECREF(r);
        return NULL;
    }
    PyObject *data = Py_NewRef(PyTuple_GET_ITEM(r, 1));
    Py_DECREF(r);
    return data;
}

typedef struct {
    PyObject *stream, *states, *cancelled, *written, *python;
    long first, last;
    Spec *specs;
    Py_ssize_t nstates;
    size_t buffer_size;
    size_t flushed;          /* bytes of out already given to the stream */
    long long out_position;  /* the stream offset of out.data[0] */
    PyObject *pending[3];    /* a Python section's error, raised in the Python order */
    long pending_kg;
    Py_ssize_t pending_sid;
} Job;

/* Prepare key groups from `kg` on into the window, with the GIL. */
static int prepare(Job *job, Window *win, long kg)
{
    Py_ssize_t entries = 0;
    while (kg <= job->last && win->used < win->cap && entries < WINDOW_ENTRIES) {
        if (call_kg(job->cancelled, kg) < 0)
            return -1;
        Py_ssize_t base = win->used * job->nstates;
        win->used++; /* cleared by window_clear whatever follows */
        for (Py_ssize_t sid = 0; sid < job->nstates; sid++) {
            const Spec *sp = &job->specs[sid];
            if (!sp->python) {
                if (kg - job->first >= PyList_GET_SIZE(sp->snapshots)) {
                    PyErr_SetString(PyExc_ValueError, "expected a snapshot for every key group");
                    return -1;
                }
                PyObject *s = PyList_GET_ITEM(sp->snapshots, kg - job->first);
                if (Py_TYPE(s) == &cw_FrozenType) { /* it holds what is framed */
                    win->frozen[base + sid] = Py_NewRef(s);
                    entries += Py_SIZE(s) / 3;
                    continue;
                }
                if (Py_TYPE(s) != layout->snap_type) {
                    PyErr_Format(PyExc_TypeError,
                                 "expected a C map snapshot or frozen changes, got %.100s",
                                 Py_TYPE(s)->tp_name);
                    return -1;
                }
                SnapObject *snap = (SnapObject *)s;
                if (!snap->released) {
                    layout->snap_pin(snap);
                    win->snaps[base + sid] = (SnapObject *)Py_NewRef(s);
                    entries += snap->size;
                    continue;
                }
                /* released: the Python path says so (or writes what it holds) */
            }
            win->sections[base + sid] = python_section(job->python, sid, kg);
            if (win->sections[base + sid] == NULL) {
                /* The Python loops raise this only once the key groups before
                 * this one are written and this one's states before it encoded:
                 * keep it, end the window before this key group, and raise it
                 * after those (raise_pending), unless one of them raises first. */
                PyErr_Fetch(&job->pending[0], &job->pending[1], &job->pending[2]);
                job->pending_kg = kg;
                job->pending_sid = sid;
                for (Py_ssize_t at = base; at < base + job->nstates; at++) {
                    if (win->snaps[at] != NULL) {
                        layout->snap_unpin(win->snaps[at]);
                        Py_CLEAR(win->snaps[at]);
                    }
                    Py_CLEAR(win->frozen[at]);
                    Py_CLEAR(win->sections[at]);
                }
                win->used--;
                return 0;
            }
        }
        if (PLANTED(WBUG_RELEASES_BEFORE_ENCODING) && call_kg(job->written, kg) < 0)
            return -1; /* planted: released before its entries are encoded */
        kg++;
    }
    return 0;
}

/* With the GIL, once the key groups before it are written: the walked states
 * before the failed one of its key group through the Python path (whose error,
 * raised first in the Python loops, wins), then the kept error. Returns -1. */
static int raise_pending(Job *job)
{
    for (Py_ssize_t sid = 0; sid < job->pending_sid; sid++) {
        if (job->specs[sid].python)
            continue;
        PyObject *section = python_section(job->python, sid, job->pending_kg);
        if (section == NULL) {
            for (int k = 0; k < 3; k++)
                Py_CLEAR(job->pending[k]);
            return -1;
        }
        Py_DECREF(section);
    }
    PyErr_Restore(job->pending[0], job->pending[1], job->pending[2]);
    job->pending[0] = job->pending[1] = job->pending[2] = NULL;
    return -1;
}

/* Frame the window's blocks into w->out (the GIL released unless kept). */
static int frame_window(Job *job, Window *win, Writer *w, long first_kg)
{
    for (Py_ssize_t i = 0; i < win->used; i++) {
        long kg = first_kg + (long)i;
        size_t start = w->out.len;
        win->block_start[i] = start;
        if (cs_buf_reserve(&w->out, 12) < 0) {
            w->nomem = 1;
            return -1;
        }
        w->out.len += 12;
        uint32_t count = 0;
        for (Py_ssize_t sid = 0; sid < job->nstates; sid++) {
            Py_ssize_t at = i * job->nstates + sid;
            if (win->snaps[at] != NULL) {
                const Spec *sp = &job->specs[sid];
                long long since = sp->since == NULL ? LLONG_MIN : sp->since[kg - job->first];
                if (walk(w, sp, win->snaps[at], (int)sid, since, &count) < 0)
                    return -1;
                continue;
            }
            if (win->frozen[at] != NULL) {
                if (frame_frozen(w, &job->specs[sid], win->frozen[at], (int)sid, &count) < 0)
                    return -1;
                continue;
            }
            PyObject *section = win->sections[at];
            size_t len = (size_t)PyBytes_GET_SIZE(section);
            if (len == 0)
                continue;
            if (cs_buf_reserve(&w->out, len) < 0) {
                w->nomem = 1;
                return -1;
            }
            const unsigned char *data = (const unsigned char *)PyBytes_AS_STRING(section);
            memcpy(w->out.data + w->out.len, data, len);
            w->out.len += len;
            count += (uint32_t)data[2] << 24 | (uint32_t)data[3] << 16
                | (uint32_t)data[4] << 8 | data[5];
        }
        unsigned char *head = w->out.data + start;
        size_t payload = w->out.len - start - 12;
        put_u32_at(head, (uint32_t)kg);
        put_u32_at(head + 4, count);
        put_u32_at(head + 8, (uint32_t)payload);
        size_t crc_end = w->out.len;
        if (PLANTED(WBUG_CRC_OVER_STALE_BUFFER) && count > 0 && w->last_entry > start)
            crc_end = w->last_entry; /* planted: before the block's last entry */
        uint32_t crc = cs_crc32(0, w->out.data + start, crc_end - start);
        if (cs_buf_reserve(&w->out, 4) < 0) {
            w->nomem = 1;
            return -1;
        }
        put_u32_at(w->out.data + w->out.len, crc);
        w->out.len += 4;
        win->block_end[i] = w->out.len;
        win->counts[i] = count;
    }
    return 0;
}

static int flush(Job *job, Writer *w, size_t upto)
{
    if (upto <= job->flushed)
        return 0;
    PyObject *data = PyBytes_FromStringAndSize((const char *)w->out.data + job->flushed,
                                               (Py_ssize_t)(upto - job->flushed));
    if (data == NULL)
        return -1;
    PyObject *r = PyObject_CallMethod(job->stream, "write", "O", data);
    Py_DECREF(data);
    if (r == NULL)
        return -1;
    Py_DECREF(r);
    job->flushed = upto;
    return 0;
}

static int parse_specs(Job *job)
{
    job->nstates = PyList_GET_SIZE(job->states);
    job->specs = PyMem_Calloc((size_t)(job->nstates > 0 ? job->nstates : 1), sizeof(Spec));
    if (job->specs == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t kgs = (Py_ssize_t)(job->last - job->first + 1);
    for (Py_ssize_t sid = 0; sid < job->nstates; sid++) {
        PyObject *item = PyList_GET_ITEM(job->states, sid);
        Spec *sp = &job->specs[sid];
        if (item == Py_None) {
            sp->python = 1;
            continue;
        }
        PyObject *since = PyTuple_CheckExact(item) && PyTuple_GET_SIZE(item) == 8
                              ? PyTuple_GET_ITEM(item, 7) : NULL;
        if (since == NULL || !PyList_CheckExact(PyTuple_GET_ITEM(item, 0))
            || PyList_GET_SIZE(PyTuple_GET_ITEM(item, 0)) != kgs
            || (since != Py_None && (!PyList_CheckExact(since) || PyList_GET_SIZE(since) != kgs))) {
            PyErr_Format(PyExc_TypeError,
                         "expected None or (%zd snapshots, 3 kinds, 3 serializers, None or %zd "
                         "base versions) for state %zd, got %R", kgs, kgs, sid, item);
            return -1;
        }
        if (since != Py_None) {
            sp->since = PyMem_Calloc((size_t)(kgs > 0 ? kgs : 1), sizeof(long long));
            if (sp->since == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            for (Py_ssize_t i = 0; i < kgs; i++) {
                sp->since[i] = PyLong_AsLongLong(PyList_GET_ITEM(since, i));
                if (sp->since[i] == -1 && PyErr_Occurred())
                    return -1;
            }
        }
        sp->snapshots = PyTuple_GET_ITEM(item, 0);
        static const int kind_at[3] = {2, 1, 3}, ser_at[3] = {5, 4, 6}; /* ns, key, state */
        for (int r = 0; r < 3; r++) {
            long k = PyLong_AsLong(PyTuple_GET_ITEM(item, kind_at[r]));
            if (k == -1 && PyErr_Occurred())
                return -1;
            if (k < 1 || k >= CS_KIND_COUNT) {
                PyErr_Format(PyExc_ValueError, "expected a built-in codec kind 1 to %d, got %ld",
                             CS_KIND_COUNT - 1, k);
                return -1;
            }
            sp->kinds[r] = (cs_kind)k;
            sp->serialize[r] = PyTuple_GET_ITEM(item, ser_at[r]);
        }
    }
    return 0;
}

PyObject *cw_write_blocks(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 9) {
        PyErr_Format(PyExc_TypeError, "write_blocks() takes 9 positional arguments (%zd given)",
                     nargs);
        return NULL;
    }
    Job job = {0};
    job.stream = args[0];
    job.out_position = PyLong_AsLongLong(args[1]);
    job.first = PyLong_AsLong(args[2]);
    job.last = PyLong_AsLong(args[3]);
    job.states = args[4]; /* a private copy below: callbacks cannot change it */
    job.cancelled = args[5];
    job.written = args[6];
    job.python = args[7];
    Py_ssize_t buffer_size = PyLong_AsSsize_t(args[8]);
    if (PyErr_Occurred())
        return NULL;
    if (!PyList_CheckExact(job.states) || job.last < job.first || buffer_size < 0) {
        PyErr_SetString(PyExc_ValueError,
                        "expected a list of states, first <= last and buffer_size >= 0");
        return NULL;
    }
    job.buffer_size = (size_t)buffer_size;
    if (load_layout(1) < 0 || cs_prepare() < 0)
        return NULL;
    job.states = PyList_GetSlice(args[4], 0, PY_SSIZE_T_MAX); /* holds the specs' tuples */
    if (job.states == NULL)
        return NULL;
    PyObject *offsets = PyList_New(job.last - job.first + 1);
    if (offsets == NULL) {
        Py_DECREF(job.states);
        return NULL;
    }
    Writer w = {0};
    cs_buf_init(&w.out);
    Window win = {0};
    PyObject *result = NULL;
    long long entries = 0;
    if (parse_specs(&job) < 0)
        goto finally;
    win.nstates = job.nstates;
    win.cap = WINDOW_KEY_GROUPS;
    size_t slots = (size_t)(win.cap * (job.nstates > 0 ? job.nstates : 1));
    win.snaps = PyMem_Calloc(slots, sizeof(SnapObject *));
    win.frozen = PyMem_Calloc(slots, sizeof(PyObject *));
    win.sections = PyMem_Calloc(slots, sizeof(PyObject *));
    win.block_start = PyMem_Calloc((size_t)win.cap, sizeof(size_t));
    win.block_end = PyMem_Calloc((size_t)win.cap, sizeof(size_t));
    win.counts = PyMem_Calloc((size_t)win.cap, sizeof(uint32_t));
    if (win.snaps == NULL || win.frozen == NULL || win.sections == NULL || win.block_start == NULL
        || win.block_end == NULL || win.counts == NULL) {
        PyErr_NoMemory();
        goto finally;
    }
    for (long kg = job.first; kg <= job.last;) {
        if (prepare(&job, &win, kg) < 0)
            goto finally;
        if (win.used == 0) { /* the first key group's Python section failed */
            raise_pending(&job);
            goto finally;
        }
        Py_ssize_t pinned = 0;
        for (Py_ssize_t i = 0; i < win.used * win.nstates; i++) {
            if (win.snaps[i] != NULL)
                pinned += win.snaps[i]->size;
            if (win.frozen[i] != NULL)
                pinned += Py_SIZE(win.frozen[i]) / 3;
        }
        w.keep_gil = pinned < KEEP_GIL_BELOW;
        gil_give(&w, 0);
        int rc = frame_window(&job, &win, &w, kg);
        gil_take(&w);
        if (rc < 0) {
            if (w.nomem)
                PyErr_NoMemory();
            else if (w.size_mismatch)
                PyErr_SetString(PyExc_AssertionError,
                                "a snapshot's chains hold another number of entries than its "
                                "size");
            goto finally;
        }
        Py_ssize_t used = win.used;
        window_clear(&win); /* unpinned: the blocks hold everything now */
        for (Py_ssize_t i = 0; i < used; i++, kg++) {
            if (i > 0 && call_kg(job.cancelled, kg) < 0)
                goto finally;
            size_t end = win.block_end[i];
            if (end - job.flushed >= job.buffer_size && flush(&job, &w, end) < 0)
                goto finally;
            PyObject *at = PyLong_FromLongLong(job.out_position + (long long)win.block_start[i]);
            if (at == NULL)
                goto finally;
            PyList_SET_ITEM(offsets, kg - job.first, at);
            entries += win.counts[i];
            if (!PLANTED(WBUG_RELEASES_BEFORE_ENCODING) && call_kg(job.written, kg) < 0)
                goto finally;
        }
        if (job.pending[0] != NULL) {
            raise_pending(&job);
            goto finally;
        }
        if (job.flushed > 0) { /* keep only what waits for the stream */
            size_t rest = w.out.len - job.flushed;
            memmove(w.out.data, w.out.data + job.flushed, rest);
            w.out.len = rest;
            job.out_position += (long long)job.flushed;
            job.flushed = 0;
        }
    }
    if (flush(&job, &w, w.out.len) < 0)
        goto finally;
    result = Py_BuildValue("OLL", offsets, entries, job.out_position + (long long)w.out.len);
finally:
    if (win.snaps != NULL && win.frozen != NULL && win.sections != NULL) {
        /* unpinning may finish a release and run finalizers: not with an error set */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        window_clear(&win);
        PyErr_Restore(type, value, tb);
    }
    PyMem_Free(win.snaps);
    PyMem_Free(win.frozen);
    PyMem_Free(win.sections);
    PyMem_Free(win.block_start);
    PyMem_Free(win.block_end);
    PyMem_Free(win.counts);
    for (Py_ssize_t sid = 0; job.specs != NULL && sid < job.nstates; sid++)
        PyMem_Free(job.specs[sid].since);
    PyMem_Free(job.specs);
    for (int k = 0; k < 3; k++)
        Py_XDECREF(job.pending[k]);
    cs_buf_free(&w.out);
    free((void *)w.marked);
    Py_DECREF(offsets);
    Py_DECREF(job.states);
    return result;
}

PyObject *cw_freeze_changes(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_Format(PyExc_TypeError, "freeze_changes() takes 2 positional arguments (%zd given)",
                     nargs);
        return NULL;
    }
    if (load_layout(1) < 0 || cs_prepare() < 0)
        return NULL;
    PyObject *s = args[0];
    if (Py_TYPE(s) != layout->snap_type) {
        PyErr_Format(PyExc_TypeError, "expected a C map snapshot, got %.100s",
                     Py_TYPE(s)->tp_name);
        return NULL;
    }
    if (!PyLong_CheckExact(args[1])) {
        PyErr_Format(PyExc_TypeError, "expected an int base version, got %.100s",
                     Py_TYPE(args[1])->tp_name);
        return NULL;
    }
    long long since = PyLong_AsLongLong(args[1]);
    if (since == -1 && PyErr_Occurred())
        return NULL;
    SnapObject *snap = (SnapObject *)s;
    if (snap->released) {
        PyErr_SetString(PyExc_ValueError, "expected an open C map snapshot, got a released one");
        return NULL;
    }
    Writer w = {0};
    cs_buf_init(&w.out);
    w.gathering = 1;
    /* Pinned: the result's allocation may run a finalizer that releases the
     * snapshot; the entries collected stay reachable until the unpin. */
    layout->snap_pin(snap);
    uint32_t count = 0;
    PyObject *result = NULL;
    if (walk(&w, NULL, snap, 0, since, &count) == 0) {
        result = cw_frozen_new((Py_ssize_t)w.nheld);
        if (result != NULL && w.nheld > 0) { /* held's references move into it */
            memcpy(cw_frozen_items(result), w.held, w.nheld * sizeof(PyObject *));
            w.nheld = 0;
        }
    }
    else if (w.refused)
        result = Py_NewRef(Py_None);
    else if (w.nomem)
        PyErr_NoMemory();
    else
        PyErr_SetString(PyExc_AssertionError,
                        "a snapshot's chains hold another number of entries than its size");
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb); /* decrefs and unpinning may run finalizers */
    for (size_t i = 0; i < w.nheld; i++) /* refused or failed: what was collected */
        Py_DECREF(w.held[i]);
    free(w.held);
    free((void *)w.marked);
    cs_buf_free(&w.out);
    layout->snap_unpin(snap);
    PyErr_Restore(type, value, tb);
    return result;
}
