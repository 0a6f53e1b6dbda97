/*
 * _cmap.c -- the copy-on-write state map in C: cowstate._cmap.CopyOnWriteStateMap
 * ==============================================================================
 *
 * The same map as cowstate/state_map.py (read its module docstring first: the
 * version rules E and S, the two-table incremental rehash, invariants 1-9),
 * with the same public API, errors, messages and snapshot objects, so that one
 * specification (cowstate_spec) checks both. What changes is the memory
 * layout: entries are C structs, the garbage collector sees one map object, and
 * a snapshot copies a directory of chunk pointers instead of the bucket list.
 *
 * Entry layout (48 bytes, pymalloc)
 * ---------------------------------
 *
 *     struct Entry { Entry *next; PyObject *key, *ns, *state; uint64 hash;
 *                    int32 entry_version, state_version; }
 *
 * This struct and the others (Batch, Chunk, Table, MapObject, SnapObject) are
 * in _cmap.h, the layout other C modules read (its top: the published
 * `_LAYOUT` capsule and the rules for a reader).
 *
 * `key`, `ns` and `state` are strong references. `hash` is the composite hash
 * (cowstate.arithmetic.composite_hash: hash(key) * HASH_MIX + hash(ns) modulo
 * 2**64, then h ^ (h >> 16)).
 *
 * The chunked bucket directory
 * ----------------------------
 * A table of capacity L (a power of two) is a directory of L / C chunk
 * pointers; a chunk holds C bucket heads, C = min(L, 1024). A NULL directory
 * slot is a chunk of empty buckets that was never allocated:
 *
 *     directory      chunk 0                chunk 1               chunk 2
 *     +----+----+----+  +----+-------+----+  +----+-------+----+
 *     | c0 | c1 |NULL|  | e  | . . . | .  |  | .  | . . . | e  |     (NULL: all empty)
 *     +----+----+----+  +----+-------+----+  +----+-------+----+
 *                       buckets 0..C-1        buckets C..2C-1
 *
 * Each chunk counts the directories that hold it (`refs`): the live table's
 * and those of the open snapshots. snapshot() copies the directory (or both,
 * while rehashing) and adds one to every chunk's count: O(L / C), not O(L).
 *
 * Three copy-on-write rules
 * -------------------------
 * Rule E (entries) and rule S (states) are the pure map's, on entry_version and
 * state_version against H, the highest open snapshot version, with rule S's
 * scalar exemption (get hands out an exact int, str, ... as it is when the
 * serializer copies such states as themselves: `scalars_as_is`,
 * is_scalar_state). Rule C is new:
 *
 * Rule C (chunks)   Before writing a bucket slot of a chunk whose `refs` > 1,
 *                   replace it in the live directory by a copy (a memcpy of
 *                   its slots; the old chunk loses the live directory's
 *                   count). An unallocated chunk is allocated zeroed on its
 *                   first write.
 *
 * Rule C guards bucket heads, rule E guards `next` links and entry fields,
 * rule S guards the states' insides: together nothing an open snapshot can
 * reach changes (invariant 8).
 *
 * Rule P (spares)   A chunk whose last directory drops it (a snapshot's
 *                   release, the rehash leaving an old chunk) is kept on the
 *                   map's `spare` list instead of freed, if it has as many
 *                   buckets as the live primary's chunks and fewer than
 *                   spare_limit() spares are kept (one per directory slot
 *                   of the live tables); rule C's copies and new chunks take
 *                   one from there before they allocate. A release that
 *                   frees what the owner copied since the snapshot hands the
 *                   next snapshot's copies warm memory: freed, those chunks
 *                   went back to the allocator, which gave the pages back to
 *                   the system, and the owner's next first write to each
 *                   chunk paid a page fault (a sixth of its time in the
 *                   first 6,000 updates after a snapshot of 1M entries).
 *                   Memory: at most one chunk per directory slot, what an
 *                   open snapshot holds anyway once the owner wrote every
 *                   chunk; a completed rehash that changes the chunk size
 *                   and the map's clear free them all.
 *
 * Incremental rehash with lazy chunks
 * -----------------------------------
 * As in the pure map: past the threshold a table of 2L buckets starts, and
 * every keyed operation first moves whole buckets until at least 4 entries
 * moved. Starting it allocates only the new directory (2L / C NULL pointers);
 * a new chunk is allocated when the rehash (or an insertion) first writes
 * into it, and an old chunk is dropped from the live directory as soon as
 * the rehash index leaves it. No single operation allocates or copies O(n):
 * at most one directory of L / C pointers, two chunks and four-plus entries.
 * Moving a bucket is all-or-nothing: every chunk and entry copy it needs is
 * allocated before anything is relinked, so a MemoryError leaves the map as
 * it was (invariant 2 never sees a half-moved bucket).
 *
 * Ownership and reclamation: retirement by version
 * -------------------------------------------------
 * Chunks are reference counted (`refs`); entries are not. The live table owns
 * every entry it reaches. An entry leaves the live table when it is removed,
 * or replaced by its copy (rules E and S, a rehash relinking it). Then:
 *
 *     entry_version >= H   no open snapshot reaches it (invariant 6):
 *                          freed, as the operation's last step
 *     entry_version <  H   an open snapshot may reach it: retired into the
 *                          batch of the current version V
 *
 * A snapshot taken later than V cannot reach an entry retired at V, so batch V
 * is freed as soon as no open snapshot has a version <= V (the oldest open
 * version is above V, or none is open). Release frees those batches after
 * the bookkeeping is done. So an entry shared with open snapshots stays valid
 * until the last one that can reach it is released, and copying a chunk never
 * touches its entries (no per-entry counts to bump: a plain memcpy).
 * A retired entry is never followed: its `next` may point to an entry freed
 * since, and nothing reads it (only open snapshots reach entries, and any
 * entry an open snapshot reaches is live or retained). Dropping a snapshot
 * without release() releases it.
 *
 * Rule G (garbage)  hand_back() is release() for a snapshot writer on another
 *                   thread: the batches the release detaches are appended to
 *                   the map's `garbage` instead of freed, and every keyed
 *                   write (put, put_and_get_old, remove, remove_and_get_old,
 *                   transform) frees up to GARBAGE_STEP (4) of their entries
 *                   as its last step, oldest first; reclaim() frees the rest
 *                   at once, and so do the map's clear and deallocation.
 *
 * Freeing a replaced entry decrefs its state, so it needs the GIL: done at the
 * writer's release, it stopped the owner for the whole batch (about 40 ms of
 * every 650 ms at 1M entries) and moved every freed line to the writer's
 * core. A write copies at most a chain prefix and frees 4, so under writes
 * the garbage shrinks; without writes it waits, no larger than what the
 * snapshot kept alive. Each entry is taken off the list before it is freed,
 * so a __del__ that re-enters the map finds the list consistent.
 *
 * Change tracking (rules T and D)
 * -------------------------------
 * The pure map's (its docstring: "Change tracking"), with the same methods,
 * checks and messages (cowstate.map_contract): track_changes(removal_limit),
 * tracking_since, removals_since(version), trim_removals(version), and the
 * snapshot's changed_items(since). The map holds `guard`, what get compares
 * state_version with, and the removal log:
 *
 * Rule T (tracking)  guard = V while tracking (removal_limit > 0), else H;
 *                    every place that changes H or V sets it again
 *                    (snapshot, release_version -- so release, hand_back
 *                    and a pinned snapshot's deferred release --,
 *                    track_changes, the _version knob). get's fast path is
 *                    the one comparison state_version < guard, as it was
 *                    against H; past it a scalar of rule S's exemption is
 *                    handed out as it is (neither copied nor marked), a
 *                    state with state_version < H is copied (rule S), and
 *                    any other is marked: rule E first, then state_version
 *                    = V. put, put_and_get_old and transform set
 *                    state_version = V anyway (entry_set_state), and
 *                    transform marks the stored state before its
 *                    function gets it (it may change it in place and
 *                    raise: the transform contract keeps that change).
 * Rule D (deletion)  While tracking, every removal (remove,
 *                    remove_and_get_old: unlink_found) appends (V, key, ns)
 *                    to `removals`, an array of Removal records that owns
 *                    its references. At removal_limit records the next
 *                    one detaches the log (the caller drops its references
 *                    as its last step: a decref runs code), moves
 *                    tracking_since to V + 1 and starts over with that one
 *                    record. Out of memory the record is not written and
 *                    the log starts over empty as on an overflow: the bases
 *                    that would need it are refused, nothing is raised.
 *
 * Rule M (marks)    While tracking, each chunk also marks its buckets
 *                   that changed: `marks` (one bit per bucket) and
 *                   `marks_since` (a version). Wherever a state_version
 *                   >= tracking_since is set (entry_set_state, mark_state:
 *                   V) or moved into a bucket (the rehash), mark_bucket
 *                   first starts a chunk whose marks_since < V over (bits
 *                   cleared, marks_since = V), then sets the bucket's bit if
 *                   the state_version >= marks_since. The chunk is the live
 *                   table's alone then (rule C: these are writes to it);
 *                   rule C's copy carries the marks. A snapshot records the
 *                   version its chunks' marks hold from (`marks_from`: the
 *                   tracking_since when taken, else none).
 *
 *     chunk: marks_since = 7        bucket:  0   1   2   3   4   5  ...
 *            marks                           0   1   0   0   1   0
 *     an entry of bucket 1 or 4 has state_version >= 7; no entry of the
 *     other buckets has (invariant 14)
 *
 * So a delta against a base b (a checkpoint's snapshot of version b; the
 * owner's changes since are made at V >= b) need visit, in each chunk with
 * marks_since <= b (and b >= marks_from), only the marked buckets: the
 * writer reads 1,024 bits instead of 1,024 bucket heads and their entries
 * (_writer.c's walk). A chunk first changed after b shows marks_since == b;
 * one not changed since keeps older marks, a superset; only a chunk that
 * changed after a later snapshot (one that was not the base: a savepoint, a
 * failed checkpoint) or that the rehash filled is walked whole.
 *
 * Not tracking costs a removal one predictable branch, a write one branch in
 * mark_bucket, and nothing else; every chunk carries its 136 bytes of marks
 * (beside 8 KiB of slots at 1,024 buckets). Memory: at most removal_limit
 * records of 24 bytes (the array grows by doubling up to the limit), plus
 * the key and namespace each keeps alive.
 * The log is dropped by the map's tp_clear (tracking goes on:
 * tracking_since = V + 1) and deallocation; tp_traverse visits its keys and
 * namespaces of a GC type. removals_since copies the records it reads (new
 * references, into PyMem memory: no collection can run) before it builds
 * tuples, and trim_removals detaches what it drops before dropping it, so
 * re-entrant code meets a consistent log.

 * Garbage collector
 * -----------------
 * Entries are not Python objects. The map's tp_traverse visits the key,
 * namespace and state of every entry reachable from the LIVE table (each
 * exactly once: live chains form a forest), so a state that refers back to
 * the map is collected. Only objects of a GC type can be in a cycle, and a
 * map counts its live entries that hold one (`gc_entries`, invariant 12):
 * while it is 0 -- int or str keys, namespaces and states, as a dict of such
 * is untracked by CPython, and VOID_NAMESPACE, whose type (cowstate._void) is
 * not a GC type either -- tp_traverse returns at once, so a collection
 * costs O(1) whatever the size. A snapshot's tp_traverse visits only its owner: an
 * entry it shares with the live table is visited by the map, and visiting it
 * twice would over-count. Entries only an open snapshot can reach are not
 * visited: a cycle through such a state is collected after the release.
 *
 * Threads and the GIL
 * -------------------
 * Everything runs with the GIL held; nothing here releases it. Python code
 * (a key's __hash__/__eq__, serializer.copy, a transform function, a __del__
 * run by a decref) can let another thread run, which may only release
 * snapshots (the thread rule). A release lowers H and chunk counts: the owner
 * then at worst copies something that was no longer shared, never the
 * reverse. Owner operations therefore (a) re-read H after calling Python
 * code, (b) keep every entry they point at reachable from the live table while
 * Python code runs, (c) decref replaced objects only as their last step, and
 * (d) detect re-entrant changes of the map by the owner itself through
 * `stamp` (bumped by every structural write): a lookup restarts, any other
 * step raises ConcurrentModificationError before it writes (rule R of
 * state_map.py, whose `_stamp` follows the same rule). A release
 * detaches the batches it frees before freeing them, so an owner retiring
 * entries during a __del__ the release runs never meets a half-freed batch.
 * Iterators copy one bucket's chain (new references) when they reach it and
 * hold no entry pointer between two next() calls. Copying allocates tuples,
 * and an allocation may run the GC and any finalizer: a snapshot is pinned
 * while it is read (a release meanwhile is finished when the read ends), and
 * a read of the live map checks `stamp` after every allocation.
 *
 * User code (rule U)
 * ------------------
 * As in the pure map (its docstring: rule U, the transform contract, deep
 * states): an Exception raised by a key's __hash__ (hash_pair: TypeError is
 * UnhashableKeyError, anything else KeyHashError) or __eq__ (lookup, and the
 * keys() filter: KeyComparisonError), by serializer.copy (serializer_copy:
 * StateCopyError, StateTooDeepError for a RecursionError) or by a transform
 * function (TransformFunctionError) is replaced by the documented error,
 * chained from it, in one place: raise_user_error() (raise_unhashable() for a
 * TypeError from __hash__, the user's or CPython's "unhashable type"), which
 * calls the error's factory in cowstate.errors (the messages of misuse are
 * cowstate.map_contract's, the pure map's too). Each raise happens before
 * the operation's first write, so the map is unchanged; the factory runs
 * Python code (a repr), so nothing touches the map after it.
 * A KeyboardInterrupt (any BaseException that is not an Exception) passes as
 * it is, from the same points. Nothing here recurses into a state: a deep
 * state costs the map nothing until serializer.copy recurses in Python.
 *
 * Invariants
 * ----------
 * 1-9 and 13 are the pure map's (cowstate/state_map.py). The C map adds 10-12,
 * 14 and 15:
 *
 * 10. Chunks: every chunk's `refs` equals the number of directories (live and
 *     open snapshots) that hold it; a chunk with refs > 1 is never written.
 * 11. Retirement: no retired entry is reachable from the live table; every
 *     entry an open snapshot reaches is live or retained in a batch whose
 *     version is >= that snapshot's; no batch outlives every snapshot of a
 *     version <= its own; no garbage entry (rule G) is live or retired.
 * 12. GC count: `gc_entries` is the number of live entries whose key,
 *     namespace or state has a type with Py_TPFLAGS_HAVE_GC.
 * 13. Tracking is the pure map's invariant 13: not tracking, guard == H and
 *     the log is empty; tracking, guard == V, tracking_since <= V + 1, the
 *     log holds at most removal_limit records, their versions never
 *     decrease and lie in [tracking_since - 1, V].
 * 14. Marks (rule M): tracking, every allocated chunk of the live table has
 *     marks_since <= V, and every entry of its bucket j whose state_version
 *     >= max(marks_since, tracking_since) has bit j of marks set; no bit is
 *     set for a bucket the chunk does not have.
 * 15. Spares (rule P): the `spare` list holds exactly `nspare` chunks, at most
 *     spare_limit() (the directory slots of the live tables); each has refs
 *     0 and no directory -- live or an open snapshot's -- holds it.
 *
 * What checks them is not here
 * ----------------------------
 * This module exports nothing of its structure and cannot break it: the only
 * window is `_bookkeeping()` (counters and versions, read-only, for
 * cowstate.introspection). The specification reads the structs through
 * _cmap.h with a test-only module built beside this one,
 * cowstate_spec._cmap_probe (spec/cowstate_spec/_cmap_probe.c): the
 * structure export for the reference checker (cowstate_spec.cmap_view and
 * cowstate_spec.invariants), the same checker in C for invariants 1-15 (what
 * the machines and `cowstate check` run), and the corruption hooks of the
 * checker's tests. The probe reads a map only after finding its exact type in
 * a module whose `_LAYOUT` has the probe's own layout version and sizes.
 *
 * Test knobs: compiling with -DCOWSTATE_BUG=n (n = 1..7) plants one of the
 * defects the specification must catch (cowstate_spec.bad_cmaps); each site
 * is a PLANTED(BUG_...) condition, a constant 0 in the real build. The module
 * name then comes from -DCOWSTATE_MODULE=name.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <limits.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "_cmap.h"                 /* the structs: the layout other modules read */

#ifndef COWSTATE_BUG
#define COWSTATE_BUG 0
#endif
/* PLANTED(BUG_X): true only in a test build compiled with -DCOWSTATE_BUG=BUG_X
 * (cowstate_spec.bad_cmaps); a constant 0 in the real map, so the compiler
 * drops the planted branch and the site reads as the rule it guards. */
#define PLANTED(bug) (COWSTATE_BUG == (bug))
#define BUG_GET_SKIPS_STATE_COPY 1
#define BUG_RELINKS_SHARED_PREDECESSOR 2
#define BUG_WRITES_SHARED_CHUNK 3
#define BUG_DIRECTORY_COPY_MISSES_A_CHUNK 4
#define BUG_RELEASE_FORGETS_OPEN_SNAPSHOT 5
#define BUG_PUT_LEAKS_REPLACED_STATE 6
#define BUG_SPARE_UNCOUNTED 7

#ifndef COWSTATE_MODULE
#define COWSTATE_MODULE _cmap
#endif
#define STR_(x) #x
#define STR(x) STR_(x)
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)

#define MINIMUM_CAPACITY 4
#define MAXIMUM_CAPACITY ((Py_ssize_t)1 << 30)
#define MAX_ARRAY_SIZE ((Py_ssize_t)2147483647 - 8)
#define MAX_VERSION 2147483647
#define MIN_TRANSFERRED 4                 /* per incremental rehash step (inv. 9) */
#define HASH_MIX 0x9E3779B97F4A7C15ULL

/* ------------------------------------------------------------------ types */

/* Entry, Batch, Chunk, Table, MapObject and SnapObject are in _cmap.h. */

/* An iterator over a map (fail-fast) or a snapshot. It holds one link on the
 * entry it will yield next, so that entry outlives any change in between. */
typedef struct IterObject {
    PyObject_HEAD
    PyObject *source;           /* MapObject or SnapObject */
    int is_snapshot;
    int mode;                   /* ITER_ENTRIES, ITER_KEYS, ITER_TUPLES */
    PyObject *filter_ns;        /* keys(namespace): only this namespace */
    uint64_t expected_mod, expected_structure;
    int table;                  /* map: 0 primary, 1 rehash; snapshot: region 0..2 */
    Py_ssize_t bucket;
    PyObject *chain;            /* StateEntry tuples of the current bucket (a list) */
    Py_ssize_t position;        /* next index into `chain` */
    int started;
    int done;
} IterObject;

enum { ITER_ENTRIES, ITER_KEYS };

static PyTypeObject Map_Type;
static PyTypeObject Snap_Type;
static PyTypeObject Iter_Type;

/* Python-side helpers, looked up once (module state would be the modern way;
 * the module is single-phase and never re-initialised, see PyInit): the
 * errors of cowstate.errors, and the entry record, argument checks and
 * messages both maps share, cowstate.map_contract's public names. */
static PyObject *StateEntry_type;     /* cowstate.map_contract.StateEntry */
static PyObject *Err_ConcurrentModification, *Err_ForeignSnapshot, *Err_InvalidArgument,
    *Err_MaximumCapacity, *Err_NoneState, *Err_SnapshotReleased,
    *Err_UnhashableKey, *Err_VersionOverflow;
static PyObject *fn_constructor_arguments, *fn_checked_serializer, *fn_copies_scalars_as_is,
    *fn_none_message,
    *fn_modified_message, *fn_pair_message, *fn_foreign_message, *fn_overflow_message,
    *fn_capacity_message, *fn_released_message, *fn_open_versions_message,
    *fn_reentrant_message, *fn_checked_removal_limit, *fn_checked_version, *fn_trim_message;
static PyObject *str_copy, *str_of, *str_from_transform;
/* Rule U's factories, bound class methods of cowstate.errors: each builds the
 * error that stands for an exception user code raised. */
static PyObject *fn_key_hash_error, *fn_key_comparison_error, *fn_state_copy_error,
    *fn_transform_error;

/* ----------------------------------------------------------- the arithmetic
 * The C forms of cowstate.arithmetic; the structure export lets the checker
 * recompute each of them with cowstate_model.arithmetic (invariant 1, 9). */

static inline uint64_t composite_hash(Py_hash_t hk, Py_hash_t hn)
{
    uint64_t x = (uint64_t)hk * HASH_MIX + (uint64_t)hn;   /* modulo 2**64 */
    return x ^ (x >> 16);                                  /* spread_hash */
}

static Py_ssize_t threshold_for(Py_ssize_t capacity)
{
    if (capacity >= MAXIMUM_CAPACITY)
        return MAX_ARRAY_SIZE;
    return (capacity >> 1) + (capacity >> 2);
}

/* ------------------------------------------------------------------ entries */

static Entry *entry_new(PyObject *key, PyObject *ns, PyObject *state, uint64_t hash,
                        int32_t entry_version, int32_t state_version)
{
    Entry *e = PyMem_Malloc(sizeof(Entry));
    if (e == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    e->next = NULL;
    e->key = Py_NewRef(key);
    e->ns = Py_NewRef(ns);
    e->state = Py_XNewRef(state);
    e->hash = hash;
    e->entry_version = entry_version;
    e->state_version = state_version;
    return e;
}

/* A shallow copy: same objects, same successor. */
static Entry *entry_copy(const Entry *e, int32_t entry_version)
{
    Entry *c = entry_new(e->key, e->ns, e->state, e->hash, entry_version, e->state_version);
    if (c != NULL)
        c->next = e->next;
    return c;
}

/* Free one entry (not its successors). Decrefs of keys and states may run
 * Python code, so callers free entries only as their last step, or where a
 * copy still holds the same objects. */
static void entry_free(Entry *e)
{
    PyObject *key = e->key, *ns = e->ns, *state = e->state;
    PyMem_Free(e);
    Py_DECREF(key);
    Py_DECREF(ns);
    Py_XDECREF(state);
}

/* ------------------------------------------------------------------- chunks */

/* Rule P: the spare chunks. A spare is linked to the next through the bytes
 * of its slots[0] (no directory holds it: its slots are not read). */
static Chunk *spare_next(const Chunk *c)
{
    Chunk *next;
    memcpy(&next, &c->slots[0], sizeof next);
    return next;
}

/* How many spares the map may keep (invariant 15): one per directory slot of
 * its live tables. */
static Py_ssize_t spare_limit(const MapObject *m)
{
    return (m->primary.dir != NULL ? m->primary.ndir : 0)
        + (m->rehash.dir != NULL ? m->rehash.ndir : 0);
}

/* A spare chunk of `slots` buckets, or NULL (the caller allocates). Every
 * spare has as many buckets as the live primary's chunks (rule P). */
static Chunk *spare_take(MapObject *m, Py_ssize_t slots)
{
    Chunk *c = m->spare;
    if (c == NULL || slots != chunk_slots(&m->primary))
        return NULL;
    m->spare = spare_next(c);
    m->nspare--;
    return c;
}

/* Free spares beyond `limit` (after the limit fell: a rehash completed, the
 * map was cleared; 0: all of them). The loop follows the list, not only the
 * count: a count that drifted from the list (invariant 15 broken, as by
 * planted bug 7) may keep spares past the bound until the next trim to 0, but
 * never walks past the list's end, and a trim to 0 (the chunk size changed,
 * the map is cleared or freed) frees every chunk on it, so no spare of a size
 * the map no longer has can ever be taken. */
static void spare_trim(MapObject *m, Py_ssize_t limit)
{
    while (m->spare != NULL && (limit == 0 || m->nspare > limit)) {
        Chunk *c = m->spare;
        m->spare = spare_next(c);
        m->nspare--;
        PyMem_Free(c);
    }
    if (limit == 0)
        m->nspare = 0;
}

static Chunk *chunk_new(MapObject *m, Py_ssize_t slots)
{
    size_t size = sizeof(Chunk) + (size_t)slots * sizeof(Entry *);
    Chunk *c = spare_take(m, slots);
    if (c != NULL)
        memset(c, 0, size);
    else if ((c = PyMem_Calloc(1, size)) == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    c->refs = 1;
    return c;
}

/* Drop one directory's count (of a table of chunks of 1 << bits buckets);
 * the last one frees the chunk (never its entries) or makes it one of
 * `pool`'s spares (rule P; pool NULL: freed). */
static void chunk_decref(MapObject *pool, Chunk *c, int bits)
{
    if (c == NULL || --c->refs > 0)
        return;
    if (pool != NULL && pool->nspare < spare_limit(pool)                  /* rule P */
        && pool->primary.dir != NULL && bits == pool->primary.bits) {
        memcpy(&c->slots[0], &pool->spare, sizeof pool->spare);
        pool->spare = c;
        pool->nspare += !PLANTED(BUG_SPARE_UNCOUNTED);       /* planted: kept, not counted */
        return;
    }
    PyMem_Free(c);
}

/* ------------------------------------------------------------------- tables */

static int table_init(Table *t, Py_ssize_t capacity)
{
    int bits = 0;
    while (((Py_ssize_t)1 << bits) < capacity && bits < CHUNK_BITS_MAX)
        bits++;
    t->capacity = capacity;
    t->bits = bits;
    t->ndir = capacity >> bits;
    t->dir = PyMem_Calloc((size_t)t->ndir, sizeof(Chunk *));
    if (t->dir == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    return 0;
}

/* Drop a directory and its counts; chunks it held last become `pool`'s spares
 * (rule P) or are freed. */
static void table_free(MapObject *pool, Table *t)
{
    if (t->dir == NULL)
        return;
    Chunk **dir = t->dir;
    Py_ssize_t n = t->ndir;
    t->dir = NULL;
    for (Py_ssize_t i = 0; i < n; i++)
        chunk_decref(pool, dir[i], t->bits);
    PyMem_Free(dir);
}

/* A copy of the directory; every chunk gains one count (rule C). */
static int table_share(const Table *src, Table *dst)
{
    *dst = *src;
    dst->dir = PyMem_Malloc((size_t)src->ndir * sizeof(Chunk *));
    if (dst->dir == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    memcpy(dst->dir, src->dir, (size_t)src->ndir * sizeof(Chunk *));
    for (Py_ssize_t i = 0; i < src->ndir; i++) {
        if (PLANTED(BUG_DIRECTORY_COPY_MISSES_A_CHUNK) && i == src->ndir - 1)
            dst->dir[i] = NULL;               /* planted: the last chunk is not copied */
        if (dst->dir[i] != NULL)
            dst->dir[i]->refs++;
    }
    return 0;
}

/* The slot of `bucket`, writable by the live table `t` of map `m` (rule C). */
static Entry **slot_for_write(MapObject *m, Table *t, Py_ssize_t bucket)
{
    Py_ssize_t index = bucket >> t->bits, slots = chunk_slots(t);
    Chunk *c = t->dir[index];
    if (c == NULL) {
        c = chunk_new(m, slots);
        if (c == NULL)
            return NULL;
        t->dir[index] = c;
    }
    else if (c->refs > 1 && !PLANTED(BUG_WRITES_SHARED_CHUNK)) {          /* rule C */
        Chunk *copy = spare_take(m, slots);                  /* rule P */
        if (copy == NULL
            && (copy = PyMem_Malloc(sizeof(Chunk) + (size_t)slots * sizeof(Entry *))) == NULL) {
            PyErr_NoMemory();
            return NULL;
        }
        copy->refs = 1;
        copy->marks_since = c->marks_since;                  /* rule M: the same buckets */
        copy->unused = 0;
        memcpy(copy->marks, c->marks, sizeof copy->marks);
        memcpy(copy->slots, c->slots, (size_t)slots * sizeof(Entry *));
        c->refs--;                                           /* still held by a snapshot */
        t->dir[index] = c = copy;
    }
    return &c->slots[bucket & (slots - 1)];
}

/* ---------------------------------------------------------------- the map */

static inline Py_ssize_t map_len(const MapObject *m) { return m->primary_size + m->rehash_size; }

static inline int is_gc(PyObject *o) { return o != NULL && PyType_IS_GC(Py_TYPE(o)); }

/* Rule S's scalar exemption: a state of an exact type of
 * cowstate.serializers.SCALAR_STATES (the same six types; a test holds the two
 * lists together) is handed out by get as it is when the serializer copies
 * such states as themselves (m->scalars_as_is). */
static inline int is_scalar_state(PyObject *o)
{
    return PyLong_CheckExact(o) || PyUnicode_CheckExact(o) || PyFloat_CheckExact(o)
        || PyBytes_CheckExact(o) || PyBool_Check(o) || PyComplex_CheckExact(o);
}

/* Does an entry with these objects count in `gc_entries` (invariant 12)? */
static inline int holds_gc(PyObject *key, PyObject *ns, PyObject *state)
{
    return is_gc(key) || is_gc(ns) || is_gc(state);
}

/* --------------------------------------------------------------- retirement */

/* Retire `e` (it left the live table while an open snapshot may reach it)
 * into the batch of the current version. Frees nothing, runs no Python code.
 * Out of memory, the entry is leaked rather than freed: a snapshot may read it. */
static void retire(MapObject *m, Entry *e)
{
    Batch *b = m->retired_tail;
    if (b == NULL || b->version != m->version) {
        b = PyMem_Malloc(sizeof(Batch));
        if (b == NULL)
            return;
        b->next = NULL;
        b->version = m->version;
        b->size = b->capacity = 0;
        b->entries = NULL;
        if (m->retired_tail != NULL)
            m->retired_tail->next = b;
        else
            m->retired = b;
        m->retired_tail = b;
    }
    if (b->size == b->capacity) {
        Py_ssize_t capacity = b->capacity ? b->capacity * 2 : 16;
        Entry **grown = PyMem_Realloc(b->entries, (size_t)capacity * sizeof(Entry *));
        if (grown == NULL)
            return;
        b->entries = grown;
        b->capacity = capacity;
    }
    b->entries[b->size++] = e;
}

/* `e` left the live table: retire it if a snapshot may reach it (inv. 6),
 * else free it. Freeing runs Python code: only as an operation's last step. */
static void leave_live(MapObject *m, Entry *e)
{
    if (e->entry_version < m->highest)
        retire(m, e);
    else
        entry_free(e);
}

/* Detach the batches no open snapshot can reach: those of a version below the
 * oldest open one (all when none is open). The caller frees them. */
static Batch *detach_unreachable_batches(MapObject *m)
{
    int32_t oldest = m->nopen ? m->open[0] : INT32_MAX;
    Batch *head = m->retired, *last = NULL;
    for (Batch *b = head; b != NULL && b->version < oldest; b = b->next)
        last = b;
    if (last == NULL)
        return NULL;
    m->retired = last->next;
    if (m->retired == NULL)
        m->retired_tail = NULL;
    last->next = NULL;
    return head;
}

/* Free detached batches. A batch's entries (and their keys and states) lie
 * wherever the owner's copies left them, so the loop prefetches two levels
 * ahead -- the entry FREE_AHEAD slots on, the key and state of the entry half
 * as far on -- and the misses overlap instead of following each other (at a
 * release after heavy copy-on-write this runs with the GIL held, and the
 * owner waits for it). A prefetch reads nothing: it cannot fault. */
#define FREE_AHEAD 16
static inline void prefetch_to_free(Entry *const *entries, Py_ssize_t i, Py_ssize_t size)
{
    if (i + FREE_AHEAD < size)
        __builtin_prefetch(entries[i + FREE_AHEAD], 1);
    if (i + FREE_AHEAD / 2 < size) {
        const Entry *soon = entries[i + FREE_AHEAD / 2];
        __builtin_prefetch(soon->key, 1);
        __builtin_prefetch(soon->state, 1);
    }
}

static void free_batches(Batch *b)
{
    while (b != NULL) {
        Batch *next = b->next;
        for (Py_ssize_t i = 0; i < b->size; i++) {
            prefetch_to_free(b->entries, i, b->size);
            entry_free(b->entries[i]);
        }
        PyMem_Free(b->entries);
        PyMem_Free(b);
        b = next;
    }
}

/* Rule G: append detached batches to the garbage the owner frees. */
static void hand_back_batches(MapObject *m, Batch *b)
{
    if (b == NULL)
        return;
    if (m->garbage_tail != NULL)
        m->garbage_tail->next = b;
    else
        m->garbage = b;
    while (b->next != NULL)
        b = b->next;
    m->garbage_tail = b;
}

/* Rule G: free up to `budget` entries of the garbage (all: -1); the count
 * freed. Each entry is taken off the list before it is freed, and a batch
 * before its array is, so a __del__ that re-enters the map (and reclaims
 * in turn) finds the list consistent. Runs Python code: a last step. */
static Py_ssize_t reclaim(MapObject *m, Py_ssize_t budget)
{
    Py_ssize_t freed = 0;
    while (m->garbage != NULL && freed != budget) {
        Batch *b = m->garbage;
        if (m->garbage_next < b->size) {
            Py_ssize_t i = m->garbage_next++;
            prefetch_to_free(b->entries, i, b->size);
            entry_free(b->entries[i]);
            freed++;
            continue;
        }
        m->garbage = b->next;
        if (m->garbage == NULL)
            m->garbage_tail = NULL;
        m->garbage_next = 0;
        PyMem_Free(b->entries);
        PyMem_Free(b);
    }
    return freed;
}

/* The garbage entries not freed yet. */
static Py_ssize_t garbage_size(const MapObject *m)
{
    Py_ssize_t n = -m->garbage_next;
    for (const Batch *b = m->garbage; b != NULL; b = b->next)
        n += b->size;
    return n;
}

/* Rule G's step: a keyed write's last step frees a few handed-back entries. */
#define GARBAGE_STEP 4
static inline void reclaim_step(MapObject *m)
{
    if (m->garbage != NULL)
        reclaim(m, GARBAGE_STEP);
}

/* ------------------------------------------------------- change tracking */

/* Rule T: what get compares state_version with (invariant 13). Called
 * wherever H or V changed. */
static inline void set_guard(MapObject *m)
{
    m->guard = m->removal_limit != 0 ? m->version : m->highest;
}

/* Rule M: bucket b of the live table t now holds an entry whose state_version
 * is sv (just set to V, or moved by the rehash). Keeps invariant 14: nothing
 * to do unless tracking and sv >= tracking_since; a chunk whose marks are
 * older than V starts over at V (they only served bases older than V); the
 * bit is set when sv >= marks_since. Never fails: the chunk is the live
 * table's alone here (an entry of version >= H sits only in chunks written
 * since the newest open snapshot: rule C copied them), and if it were not,
 * rule C copies it first; out of memory for that copy, tracking_since moves
 * to V + 1 as on a log overflow (rule D: the next checkpoint is full). */
static void mark_bucket(MapObject *m, Table *t, Py_ssize_t b, int32_t sv)
{
    if (m->removal_limit == 0 || sv < m->tracking_since)
        return;
    Chunk *c = t->dir[b >> t->bits];
    if (c == NULL || c->refs > 1) {                            /* rule C (not expected) */
        if (slot_for_write(m, t, b) == NULL) {
            PyErr_Clear();
            m->tracking_since = m->version + 1;
            return;
        }
        c = t->dir[b >> t->bits];
    }
    if (c->marks_since < m->version) {
        memset(c->marks, 0, sizeof c->marks);
        c->marks_since = m->version;
    }
    if (sv >= c->marks_since) {
        Py_ssize_t j = b & (chunk_slots(t) - 1);
        c->marks[j >> 6] |= (uint64_t)1 << (j & 63);
    }
}

/* Records taken out of the log, for the caller to drop as its last step. */
typedef struct Dropped {
    Removal *records;
    Py_ssize_t n;
} Dropped;

/* Take the whole log out of the map into *d (which must be empty). */
static void detach_log(MapObject *m, Dropped *d)
{
    d->records = m->removals;
    d->n = m->nremovals;
    m->removals = NULL;
    m->nremovals = m->removals_cap = 0;
}

/* Drop detached records: their references were the log's. Runs Python code
 * (a __del__ of a key), so only as a last step. */
static void drop_records(Dropped *d)
{
    Removal *records = d->records;
    Py_ssize_t n = d->n;
    d->records = NULL;
    d->n = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(records[i].key);
        Py_DECREF(records[i].ns);
    }
    PyMem_Free(records);
}

/* Rule D: append (V, key, ns) to the removal log (new references, the
 * log's). Full, the log goes to *dropped and starts over at tracking_since
 * = V + 1. Never fails: out of memory, the record is not written and the
 * log starts over empty (see the header). Runs no Python code. */
static void log_removal(MapObject *m, PyObject *key, PyObject *ns, Dropped *dropped)
{
    if (m->nremovals >= m->removal_limit) {       /* overflow: older bases are unknown now */
        detach_log(m, dropped);
        m->tracking_since = m->version + 1;
    }
    if (m->nremovals == m->removals_cap) {
        Py_ssize_t cap = m->removals_cap ? m->removals_cap * 2 : 16;
        if (cap > m->removal_limit)
            cap = m->removal_limit;
        Removal *grown = (size_t)cap > PY_SSIZE_T_MAX / sizeof(Removal) ? NULL
            : PyMem_Realloc(m->removals, (size_t)cap * sizeof(Removal));
        if (grown == NULL) {                      /* forget, as an overflow does */
            if (m->nremovals > 0)                 /* then *dropped is still empty */
                detach_log(m, dropped);
            m->tracking_since = m->version + 1;
            return;
        }
        m->removals = grown;
        m->removals_cap = cap;
    }
    Removal *r = &m->removals[m->nremovals++];
    r->key = Py_NewRef(key);
    r->ns = Py_NewRef(ns);
    r->version = m->version;
}

/* Free (or, with snapshots open, retire) every entry of a detached table. */
static void table_drop_entries(MapObject *m, Table *t)
{
    if (t->dir == NULL)
        return;
    Py_ssize_t slots = chunk_slots(t);
    for (Py_ssize_t i = 0; i < t->ndir; i++) {
        Chunk *c = t->dir[i];
        if (c == NULL)
            continue;
        for (Py_ssize_t j = 0; j < slots; j++) {
            Entry *e = c->slots[j];
            while (e != NULL) {
                Entry *next = e->next;
                if (m->nopen > 0)
                    retire(m, e);
                else
                    entry_free(e);
                e = next;
            }
        }
    }
}

/* The table and bucket that hold hash h (invariant 2: arithmetic.in_rehash_table). */
static inline Table *select_table(MapObject *m, uint64_t h, Py_ssize_t *bucket)
{
    Py_ssize_t b = (Py_ssize_t)(h & (uint64_t)(m->primary.capacity - 1));
    if (m->rehash.dir != NULL && b < m->rehash_index) {
        *bucket = (Py_ssize_t)(h & (uint64_t)(m->rehash.capacity - 1));
        return &m->rehash;
    }
    *bucket = b;
    return &m->primary;
}

static int raise_from_helper(PyObject *exc_type, PyObject *helper, PyObject *args)
{
    /* `args` is a new reference (or NULL after an error); the message comes
     * from cowstate.map_contract, where both maps take it from. */
    if (args == NULL)
        return -1;
    PyObject *message = PyObject_CallObject(helper, args);
    Py_DECREF(args);
    if (message != NULL) {
        PyErr_SetObject(exc_type, message);
        Py_DECREF(message);
    }
    return -1;
}

/* The TypeError a __hash__ raised (the user's, or CPython's "unhashable
 * type") is set: replace it by UnhashableKeyError.of(key, ns), chained from
 * it (cause and context, as `raise ... from exc`; rule U). Returns -1. */
static int raise_unhashable(PyObject *key, PyObject *ns)
{
    PyObject *type, *cause, *tb;
    PyErr_Fetch(&type, &cause, &tb);                 /* three new references (or NULL) */
    PyErr_NormalizeException(&type, &cause, &tb);
    if (cause != NULL && tb != NULL)
        PyException_SetTraceback(cause, tb);         /* borrows tb */
    PyObject *exc = PyObject_CallMethodObjArgs(Err_UnhashableKey, str_of, key, ns, NULL);
    if (exc != NULL) {
        if (cause != NULL) {
            PyException_SetCause(exc, Py_NewRef(cause));     /* steals the new reference */
            PyException_SetContext(exc, Py_NewRef(cause));   /* steals the new reference */
        }
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    Py_XDECREF(type);
    Py_XDECREF(cause);
    Py_XDECREF(tb);
    return -1;
}

/* Rule U: the exception user code just raised (a key's __hash__ or __eq__,
 * serializer.copy, a transform function) is set; replace it by
 * `factory(args[0], ..., exc, ...)`, exc inserted at position `exc_at` of the
 * nargs + 1 arguments, raised from exc (cause and context, as `raise ... from
 * exc`). A BaseException that is not an Exception (KeyboardInterrupt,
 * SystemExit) passes as it is. The caller has changed nothing the map's
 * contents show (invariants 1-9 hold); the factory may run Python code (a
 * repr), so the caller must not touch the map after this. Returns -1. */
static int raise_user_error(PyObject *factory, PyObject *const *args, Py_ssize_t nargs,
                            Py_ssize_t exc_at)
{
    PyObject *type, *exc, *tb;
    PyErr_Fetch(&type, &exc, &tb);                   /* three new references (or NULL) */
    if (type == NULL)
        return -1;                                   /* nothing raised: nothing to map */
    PyErr_NormalizeException(&type, &exc, &tb);
    if (exc == NULL || !PyErr_GivenExceptionMatches(type, PyExc_Exception)) {
        PyErr_Restore(type, exc, tb);                /* steals all three */
        return -1;
    }
    if (tb != NULL)
        PyException_SetTraceback(exc, tb);          /* borrows tb */
    PyObject *call[4];
    assert(nargs <= 3 && exc_at <= nargs);
    for (Py_ssize_t i = 0, j = 0; i <= nargs; i++)
        call[i] = i == exc_at ? exc : args[j++];    /* borrowed: the call holds its own */
    PyObject *err_obj = PyObject_Vectorcall(factory, call, (size_t)nargs + 1, NULL);
    if (err_obj != NULL) {
        PyException_SetCause(err_obj, Py_NewRef(exc));     /* steals the new reference */
        PyException_SetContext(err_obj, Py_NewRef(exc));   /* steals the new reference */
        PyErr_SetObject((PyObject *)Py_TYPE(err_obj), err_obj);
        Py_DECREF(err_obj);
    }
    Py_DECREF(type);
    Py_DECREF(exc);
    Py_XDECREF(tb);
    return -1;
}

/* hash(key) and hash(ns) into the composite hash; a TypeError becomes
 * UnhashableKeyError, any other Exception KeyHashError (rule U). */
static int hash_pair(PyObject *key, PyObject *ns, uint64_t *h)
{
    Py_hash_t hk = PyObject_Hash(key);
    Py_hash_t hn = hk == -1 ? -1 : PyObject_Hash(ns);
    if (hn == -1 && PyErr_Occurred()) {             /* hk == -1 always sets an error */
        if (PyErr_ExceptionMatches(PyExc_TypeError))
            return raise_unhashable(key, ns);
        PyObject *args[2] = {key, ns};
        return raise_user_error(fn_key_hash_error, args, 2, 2);
    }
    *h = composite_hash(hk, hn);
    return 0;
}

static int raise_reentrant(const char *what)
{
    return raise_from_helper(Err_ConcurrentModification, fn_reentrant_message,
                             Py_BuildValue("(s)", what));
}

/* Does `e` hold (key, ns)? 1, 0, or -1 on error. Python's __eq__ may run:
 * the caller re-checks m->stamp afterwards (rule d of the header). */
static int entry_matches(Entry *e, uint64_t h, PyObject *key, PyObject *ns)
{
    if (e->hash != h)
        return 0;
    if (e->key != key) {
        PyObject *k = Py_NewRef(e->key);                    /* alive through __eq__ */
        int eq = PyObject_RichCompareBool(k, key, Py_EQ);
        Py_DECREF(k);
        if (eq <= 0)
            return eq;
    }
    if (e->ns != ns) {
        PyObject *n = Py_NewRef(e->ns);
        int eq = PyObject_RichCompareBool(n, ns, Py_EQ);
        Py_DECREF(n);
        if (eq <= 0)
            return eq;
    }
    return 1;
}

/* Find (key, ns): its entry, or NULL with *err = 0 when absent, or NULL with
 * *err = -1 on error. table, bucket and prev say where it is (prev: the entry
 * before it in the chain, or NULL at the head). Restarts if an __eq__ changed
 * the map. Changes nothing. */
static Entry *lookup(MapObject *m, uint64_t h, PyObject *key, PyObject *ns,
                     Table **table, Py_ssize_t *bucket, Entry **prev, int *err)
{
restart:;
    uint64_t stamp = m->stamp;
    Py_ssize_t b;
    Table *t = select_table(m, h, &b);
    Entry *p = NULL;
    if (m->nopen > 0 || m->removal_limit != 0) {
        /* A write after this lookup reads the chunk's `refs` (rule C) and,
         * while tracking, sets the bucket's bit of its marks (rule M): lines
         * of their own far from the slot, so fetch them beside the chain's
         * misses (the address is computed, not read: a prefetch cannot fault). */
        Chunk *c = t->dir[b >> t->bits];
        if (c != NULL) {
            __builtin_prefetch(c, 0);
            if (m->removal_limit != 0)
                __builtin_prefetch(&c->marks[(b & (chunk_slots(t) - 1)) >> 6], 1);
        }
    }
    for (Entry *e = slot_get(t, b); e != NULL; p = e, e = e->next) {
        int found = entry_matches(e, h, key, ns);
        if (found < 0) {                                    /* rule U: nothing written */
            PyObject *args[2] = {key, ns};
            *err = raise_user_error(fn_key_comparison_error, args, 2, 2);
            return NULL;
        }
        if (m->stamp != stamp)
            goto restart;                                   /* an __eq__ changed the map */
        if (found) {
            *table = t;
            *bucket = b;
            if (prev)
                *prev = p;
            *err = 0;
            return e;
        }
    }
    *table = t;
    *bucket = b;
    if (prev)
        *prev = NULL;
    *err = 0;
    return NULL;
}

/* Rule E: make private every shared entry from the head of `bucket` up to
 * `until`; return what stands for `until` in the live chain. */
static Entry *copy_chain(MapObject *m, Table *t, Py_ssize_t bucket, Entry *until)
{
    Entry **link = slot_for_write(m, t, bucket);               /* rule C first */
    if (link == NULL)
        return NULL;
    int32_t required = m->highest, version = m->version;
    m->stamp++;
    for (;;) {
        Entry *cur = *link;
        assert(cur != NULL);                                 /* `until` is in this chain */
        int last = cur == until;
        if (cur->entry_version < required) {                 /* shared: replace by a copy */
            Entry *copy = entry_copy(cur, version);
            if (copy == NULL)
                return NULL;         /* the copies made so far are equal: nothing lost */
            *link = copy;
            retire(m, cur);          /* an open snapshot may still reach it (inv. 6) */
            cur = copy;
        }
        if (last)
            return cur;
        link = &cur->next;
    }
}

static int double_capacity(MapObject *m)
{
    Py_ssize_t capacity = m->primary.capacity;
    if (capacity >= MAXIMUM_CAPACITY) {
        return raise_from_helper(Err_MaximumCapacity, fn_capacity_message,
                                 Py_BuildValue("(nn)", map_len(m), MAXIMUM_CAPACITY));
    }
    if (table_init(&m->rehash, capacity * 2) < 0)            /* O(L / C) pointers */
        return -1;
    m->threshold = threshold_for(capacity * 2);
    m->rehash_index = 0;
    return 0;
}

/* Move old bucket r into the rehash table, all or nothing; adds the number of
 * entries moved to *moved. */
static int move_bucket(MapObject *m, Py_ssize_t r, Py_ssize_t *moved)
{
    Table *old = &m->primary, *new = &m->rehash;
    Entry *head = slot_get(old, r);
    if (head == NULL)
        return 0;
    Py_ssize_t capacity = old->capacity;
    int32_t required = m->highest, version = m->version;

    /* Allocate first: the writable slots and every copy rule E needs. */
    Entry **old_slot = slot_for_write(m, old, r);
    if (old_slot == NULL || slot_for_write(m, new, r) == NULL
        || slot_for_write(m, new, r + capacity) == NULL)
        return -1;
    Py_ssize_t shared = 0;
    for (Entry *e = head; e != NULL; e = e->next)
        shared += e->entry_version < required;
    Entry *stack[64];
    Entry **copies = shared <= 64 ? stack : PyMem_Malloc((size_t)shared * sizeof(Entry *));
    if (copies == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t made = 0;
    for (Entry *e = head; e != NULL; e = e->next) {
        if (e->entry_version < required) {
            Entry *c = entry_new(e->key, e->ns, e->state, e->hash, version, e->state_version);
            if (c == NULL) {
                while (made > 0)
                    entry_free(copies[--made]);     /* objects still held by e: no Python runs */
                if (copies != stack)
                    PyMem_Free(copies);
                return -1;
            }
            copies[made++] = c;
        }
    }

    /* Relink; nothing below fails. */
    m->stamp++;
    *old_slot = NULL;
    made = 0;
    Entry *e = head;
    while (e != NULL) {
        Entry *successor = e->next;
        Py_ssize_t pos = (Py_ssize_t)(e->hash & (uint64_t)(2 * capacity - 1));  /* r or r + L */
        Entry **dst = &new->dir[pos >> new->bits]->slots[pos & (chunk_slots(new) - 1)];
        if (e->entry_version < required) {                   /* rule E: relinking a shared entry */
            Entry *c = copies[made++];
            c->next = *dst;
            *dst = c;
            retire(m, e);                                    /* a snapshot may reach e */
        }
        else {
            e->next = *dst;                                  /* private: relinked in place */
            *dst = e;
        }
        mark_bucket(m, new, pos, (*dst)->state_version);     /* rule M: its chunk is private */
        e = successor;
        (*moved)++;
    }
    if (copies != stack)
        PyMem_Free(copies);
    return 0;
}

/* One incremental rehash step: whole buckets until >= 4 entries moved (inv. 9). */
static int incremental_rehash(MapObject *m)
{
    Py_ssize_t r = m->rehash_index, capacity = m->primary.capacity, moved = 0;
    m->structure_count++;
    while (moved < MIN_TRANSFERRED) {
        if (move_bucket(m, r, &moved) < 0) {
            m->primary_size -= moved;
            m->rehash_size += moved;
            m->rehash_index = r;
            return -1;
        }
        r++;
        if ((r & (chunk_slots(&m->primary) - 1)) == 0) {      /* an old chunk is empty */
            Py_ssize_t index = (r - 1) >> m->primary.bits;
            chunk_decref(m, m->primary.dir[index], m->primary.bits);   /* rule P */
            m->primary.dir[index] = NULL;
        }
        if (r == capacity) {                                 /* complete: install the table */
            int old_bits = m->primary.bits;
            table_free(m, &m->primary);
            m->primary = m->rehash;
            m->rehash.dir = NULL;
            m->rehash.capacity = m->rehash.ndir = 0;
            m->primary_size += m->rehash_size;
            m->rehash_size = 0;
            m->rehash_index = 0;
            m->stamp++;
            /* inv. 15: the limit fell; spares of the old chunk size go */
            spare_trim(m, m->primary.bits == old_bits ? spare_limit(m) : 0);
            return 0;
        }
    }
    m->primary_size -= moved;
    m->rehash_size += moved;
    m->rehash_index = r;
    return 0;
}

static inline int rehash_step(MapObject *m)
{
    return m->rehash.dir == NULL ? 0 : incremental_rehash(m);
}

/* Where a lookup found (key, ns), or where it would go: valid until the next
 * structural change (m->stamp). */
typedef struct Found {
    uint64_t hash;
    Table *table;
    Py_ssize_t bucket;
    Entry *entry;               /* NULL: absent */
    Entry *prev;                /* the entry before it in its chain, NULL at the head */
} Found;

static int find(MapObject *m, uint64_t h, PyObject *key, PyObject *ns, Found *f)
{
    int err;
    f->hash = h;
    f->entry = lookup(m, h, key, ns, &f->table, &f->bucket, &f->prev, &err);
    return err;
}

/* The entry of a lookup's mapping, private to the live table (rule E), added at
 * its chain's head (state NULL) when absent. `f` must be current (no structural
 * change since the lookup); on return its table and bucket are where the entry
 * is (where rule M marks). */
static Entry *put_found(MapObject *m, Found *f, PyObject *key, PyObject *ns)
{
    Table *t = f->table;
    Py_ssize_t b = f->bucket;
    uint64_t h = f->hash;
    Entry *e = f->entry;
    if (e != NULL) {
        if (e->entry_version < m->highest)                    /* rule E */
            e = copy_chain(m, t, b, e);
        return e;
    }
    if (map_len(m) > m->threshold) {
        if (double_capacity(m) < 0)
            return NULL;
        t = select_table(m, h, &b);       /* a new rehash starts at index 0: the primary */
        f->table = t;
        f->bucket = b;
    }
    Entry **slot = slot_for_write(m, t, b);
    if (slot == NULL)
        return NULL;
    e = entry_new(key, ns, NULL, h, m->version, m->version);
    if (e == NULL)
        return NULL;
    e->next = *slot;
    *slot = e;
    m->gc_entries += holds_gc(key, ns, NULL);     /* the state is counted when it is set */
    m->stamp++;
    m->mod_count++;
    if (t == &m->primary)
        m->primary_size++;
    else
        m->rehash_size++;
    return e;
}

static Entry *put_entry(MapObject *m, Found *f, uint64_t h, PyObject *key, PyObject *ns)
{
    if (find(m, h, key, ns, f) < 0)
        return NULL;
    return put_found(m, f, key, ns);
}

/* Set the state of a private entry, which `f` says where it is; returns the
 * replaced state (a new reference, or NULL) for the caller to drop last. */
static inline PyObject *entry_set_state(MapObject *m, const Found *f, Entry *e, PyObject *state)
{
    PyObject *old = e->state;
    if (!holds_gc(e->key, e->ns, NULL))           /* else it counts whatever its state */
        m->gc_entries += is_gc(state) - is_gc(old);
    e->state = Py_NewRef(state);
    e->state_version = m->version;
    mark_bucket(m, f->table, f->bucket, m->version);          /* rule M */
    return old;
}

/* serializer.copy(state) for the mapping (key, ns): a new reference, or NULL
 * with StateCopyError or StateTooDeepError set (rule U). */
static PyObject *serializer_copy(MapObject *m, PyObject *state, PyObject *key, PyObject *ns)
{
    if (m->serializer == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "the map was cleared by the garbage collector");
        return NULL;
    }
    PyObject *serializer = Py_NewRef(m->serializer);
    PyObject *arg = Py_NewRef(state);
    PyObject *copy = PyObject_CallMethodOneArg(serializer, str_copy, arg);
    Py_DECREF(arg);
    Py_DECREF(serializer);
    if (copy == NULL) {
        PyObject *args[2] = {key, ns};
        raise_user_error(fn_state_copy_error, args, 2, 2);
    }
    return copy;
}

/* Rule S's copy of a state a snapshot may hold: serializer.copy, then the
 * re-entrancy check (rule d of the header). A new reference, or NULL. */
static PyObject *copy_shared_state(MapObject *m, PyObject *state, PyObject *key, PyObject *ns)
{
    uint64_t stamp = m->stamp;
    PyObject *copy = serializer_copy(m, state, key, ns);
    if (copy != NULL && m->stamp != stamp) {
        Py_DECREF(copy);
        raise_reentrant("serializer.copy");
        return NULL;
    }
    return copy;
}

/* The prologue of a keyed operation on (args[0], args[1]): check the argument
 * count, hash, take this operation's rehash step (unless `step` is 0), look
 * the mapping up. Returns 0 with *found (entry NULL when absent), or -1. */
static int keyed_prologue(MapObject *m, PyObject *const *args, Py_ssize_t nargs,
                          Py_ssize_t want, const char *name, int step, Found *found)
{
    if (nargs != want) {
        PyErr_Format(PyExc_TypeError, "%s() takes exactly %zd arguments (%zd given)", name,
                     want, nargs);
        return -1;
    }
    if (hash_pair(args[0], args[1], &found->hash) < 0 || (step && rehash_step(m) < 0))
        return -1;
    return find(m, found->hash, args[0], args[1], found);
}

/* Rule T: mark the state of `e`, which `f` found and no snapshot holds
 * (state_version >= H), as handed out at V -- on the owner's copy of the
 * entry if a snapshot shares it (rule E first). The entry that stands for
 * `e` now, or NULL with an error (the copy failed; nothing marked). */
static Entry *mark_state(MapObject *m, Found *f, Entry *e)
{
    if (e->entry_version < m->highest) {                      /* rule E */
        e = copy_chain(m, f->table, f->bucket, e);
        if (e == NULL)
            return NULL;
    }
    e->state_version = m->version;                            /* rule T: marked */
    mark_bucket(m, f->table, f->bucket, m->version);          /* rule M */
    return e;
}

/* ------------------------------------------------------------ map methods */

static PyObject *Map_get(MapObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    Found f;
    if (keyed_prologue(m, args, nargs, 2, "get", 1, &f) < 0)
        return NULL;
    Entry *e = f.entry;
    if (e == NULL)
        Py_RETURN_NONE;
    if (e->state_version < m->guard && !(m->scalars_as_is && is_scalar_state(e->state))
        && !PLANTED(BUG_GET_SKIPS_STATE_COPY)) {    /* rule S or rule T (scalars exempt) */
        if (e->state_version >= m->highest) {       /* rule T: no snapshot holds it: mark */
            e = mark_state(m, &f, e);
            return e == NULL ? NULL : Py_NewRef(e->state);
        }
        PyObject *copy = copy_shared_state(m, e->state, args[0], args[1]);
        if (copy == NULL)
            return NULL;
        if (e->entry_version < m->highest) {                  /* rule E, H re-read */
            e = copy_chain(m, f.table, f.bucket, e);
            if (e == NULL) {
                Py_DECREF(copy);
                return NULL;
            }
        }
        PyObject *old = entry_set_state(m, &f, e, copy);
        Py_XDECREF(old);              /* a snapshot (or our copy's source) still holds it */
        return copy;                  /* the reference we made is the caller's */
    }
    return Py_NewRef(e->state);
}

static PyObject *Map_contains_key(MapObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    Found f;
    if (keyed_prologue(m, args, nargs, 2, "contains_key", 1, &f) < 0)
        return NULL;
    return PyBool_FromLong(f.entry != NULL);
}

static int none_state(PyObject *key, PyObject *ns, const char *op)
{
    return raise_from_helper(Err_NoneState, fn_none_message,
                             Py_BuildValue("(OOs)", key, ns, op));
}

static PyObject *Map_put(MapObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_Format(PyExc_TypeError, "put() takes exactly 3 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *key = args[0], *ns = args[1], *state = args[2];
    if (state == Py_None) {
        none_state(key, ns, "put");
        return NULL;
    }
    uint64_t h;
    if (hash_pair(key, ns, &h) < 0 || rehash_step(m) < 0)
        return NULL;
    uint64_t count = m->mod_count;                  /* put_entry counts an insertion */
    Found f;
    Entry *e = put_entry(m, &f, h, key, ns);
    if (e == NULL)
        return NULL;
    int inserted = m->mod_count != count;
    PyObject *old = entry_set_state(m, &f, e, state);
    if (!PLANTED(BUG_PUT_LEAKS_REPLACED_STATE))
        Py_XDECREF(old);                                      /* last step: may run __del__ */
    reclaim_step(m);                                          /* rule G, after it */
    return PyBool_FromLong(inserted);                /* True: a new mapping */
}

static PyObject *Map_put_and_get_old(MapObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs == 3 && args[2] == Py_None) {
        none_state(args[0], args[1], "put_and_get_old");
        return NULL;
    }
    /* Copy a shared old state before changing anything (rule S), so a raising
     * serializer leaves the map as it was. */
    Found f;
    if (keyed_prologue(m, args, nargs, 3, "put_and_get_old", 1, &f) < 0)
        return NULL;
    PyObject *key = args[0], *ns = args[1], *state = args[2];
    PyObject *result = NULL;                                  /* a new reference or NULL */
    if (f.entry != NULL && f.entry->state_version < m->highest) {
        result = copy_shared_state(m, f.entry->state, key, ns);
        if (result == NULL)
            return NULL;
    }
    Entry *e = put_found(m, &f, key, ns);     /* `f` is current: a changed map raised above */
    if (e == NULL) {
        Py_XDECREF(result);
        return NULL;
    }
    PyObject *old = entry_set_state(m, &f, e, state);
    if (result == NULL)
        result = old != NULL ? old : Py_NewRef(Py_None);      /* the entry's reference is ours */
    else
        Py_XDECREF(old);
    reclaim_step(m);                                          /* rule G */
    return result;
}

/* Unlink the entry a current lookup found (f->entry, not NULL) and, while
 * tracking, log its removal (rule D); 0, or -1 on error (nothing changed). The
 * caller passes the entry to leave_live() and drops *dropped as its last steps. */
static int unlink_found(MapObject *m, Found *f, Dropped *dropped)
{
    Table *t = f->table;
    Py_ssize_t b = f->bucket;
    Entry *e = f->entry, *prev = f->prev;
    if (prev == NULL) {
        Entry **slot = slot_for_write(m, t, b);                  /* rule C */
        if (slot == NULL)
            return -1;
        *slot = e->next;                                      /* the live bucket list */
    }
    else {
        if (prev->entry_version < m->highest && !PLANTED(BUG_RELINKS_SHARED_PREDECESSOR)) {
            prev = copy_chain(m, t, b, prev);                 /* rule E */
            if (prev == NULL)
                return -1;
        }
        prev->next = e->next;                                 /* prev is private (rule E) */
    }
    m->gc_entries -= holds_gc(e->key, e->ns, e->state);
    m->stamp++;
    m->mod_count++;
    if (t == &m->primary)
        m->primary_size--;
    else
        m->rehash_size--;
    if (m->removal_limit != 0)                    /* tracking: the one branch it costs */
        log_removal(m, e->key, e->ns, dropped);   /* rule D */
    return 0;
}

static PyObject *Map_remove(MapObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    Found f;
    if (keyed_prologue(m, args, nargs, 2, "remove", 1, &f) < 0)
        return NULL;
    if (f.entry == NULL)
        Py_RETURN_NONE;
    Dropped dropped = {NULL, 0};
    if (unlink_found(m, &f, &dropped) < 0)
        return NULL;
    leave_live(m, f.entry);                                   /* last steps: may run __del__ */
    drop_records(&dropped);                                   /* an overflowed log (rule D) */
    reclaim_step(m);                                          /* rule G, after them */
    Py_RETURN_NONE;
}

static PyObject *Map_remove_and_get_old(MapObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    Found f;
    if (keyed_prologue(m, args, nargs, 2, "remove_and_get_old", 1, &f) < 0)
        return NULL;
    if (f.entry == NULL)
        Py_RETURN_NONE;
    /* Copy a shared state first (rule S): a raising copy loses nothing. */
    PyObject *result = f.entry->state_version < m->highest
        ? copy_shared_state(m, f.entry->state, args[0], args[1]) : Py_NewRef(f.entry->state);
    if (result == NULL)
        return NULL;
    Dropped dropped = {NULL, 0};
    if (unlink_found(m, &f, &dropped) < 0) {  /* `f` is current: a changed map raised above */
        Py_DECREF(result);
        return NULL;
    }
    leave_live(m, f.entry);
    drop_records(&dropped);                                   /* rule D */
    reclaim_step(m);                                          /* rule G */
    return result;
}

static PyObject *Map_transform(MapObject *m, PyObject *const *args, Py_ssize_t nargs)
{
    Found f;                                                  /* no rehash step yet */
    if (keyed_prologue(m, args, nargs, 4, "transform", 0, &f) < 0)
        return NULL;
    PyObject *key = args[0], *ns = args[1], *value = args[2], *fn = args[3];
    uint64_t h = f.hash;
    Entry *e = f.entry;
    PyObject *old;
    if (e == NULL)
        old = Py_NewRef(Py_None);
    else if (e->state_version < m->highest) {                 /* rule S */
        old = serializer_copy(m, e->state, key, ns);
        if (old == NULL)
            return NULL;
    }
    else {
        if (e->state_version < m->guard) {     /* rule T: fn gets the stored state and */
            e = mark_state(m, &f, e);          /* may change it in place, then raise: */
            if (e == NULL)                     /* marked first */
                return NULL;
        }
        old = Py_NewRef(e->state);
    }
    PyObject *new = PyObject_CallFunctionObjArgs(fn, old, value, NULL);
    Py_DECREF(old);
    if (new == NULL) {            /* rule U: TransformFunctionError.of(fn, exc, key, ns) */
        PyObject *args[3] = {fn, key, ns};
        raise_user_error(fn_transform_error, args, 3, 1);
        return NULL;
    }
    if (new == Py_None) {
        Py_DECREF(new);
        PyObject *err_obj = PyObject_CallMethodObjArgs(Err_NoneState, str_from_transform, key,
                                                       ns, NULL);
        if (err_obj != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(err_obj), err_obj);
            Py_DECREF(err_obj);
        }
        return NULL;
    }
    if (rehash_step(m) < 0) {                /* this operation's step, once fn succeeded */
        Py_DECREF(new);
        return NULL;
    }
    e = put_entry(m, &f, h, key, ns);
    if (e == NULL) {
        Py_DECREF(new);
        return NULL;
    }
    PyObject *replaced = entry_set_state(m, &f, e, new);
    Py_DECREF(new);
    Py_XDECREF(replaced);
    reclaim_step(m);                                          /* rule G */
    Py_RETURN_NONE;
}

static Py_ssize_t Map_length(MapObject *m) { return map_len(m); }        /* inv. 3 */

static int Map_contains(MapObject *m, PyObject *item)
{
    if (!PyTuple_Check(item) || PyTuple_GET_SIZE(item) != 2) {
        raise_from_helper(Err_InvalidArgument, fn_pair_message, PyTuple_Pack(1, item));
        return -1;
    }
    Found f;
    if (keyed_prologue(m, &PyTuple_GET_ITEM(item, 0), 2, 2, "__contains__", 1, &f) < 0)
        return -1;
    return f.entry != NULL;
}

/* ------------------------------------------------------------- snapshots */

static int open_version(MapObject *m, int32_t version)
{
    if (m->nopen == m->open_cap) {
        Py_ssize_t cap = m->open_cap ? m->open_cap * 2 : 4;
        int32_t *grown = PyMem_Realloc(m->open, (size_t)cap * sizeof(int32_t));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        m->open = grown;
        m->open_cap = cap;
    }
    m->open[m->nopen++] = version;               /* versions only grow: stays ascending */
    return 0;
}

static PyObject *open_versions_tuple(MapObject *m)
{
    PyObject *out = PyTuple_New(m->nopen);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < m->nopen; i++) {
        PyObject *v = PyLong_FromLong(m->open[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, v);
    }
    return out;
}

/* Remove `version` from the open set and recompute H (inv. 5); -1 if it was
 * not open. Frees nothing: the caller drops the snapshot's directories. */
static int release_version(MapObject *m, int32_t version)
{
    Py_ssize_t i = 0;
    while (i < m->nopen && m->open[i] != version)
        i++;
    if (i == m->nopen) {
        PyObject *open = open_versions_tuple(m);
        if (open != NULL)
            raise_from_helper(Err_SnapshotReleased, fn_open_versions_message,
                              Py_BuildValue("(Ni)", open, version));
        return -1;
    }
    memmove(&m->open[i], &m->open[i + 1], (size_t)(m->nopen - i - 1) * sizeof(int32_t));
    m->nopen--;
    m->highest = m->nopen ? m->open[m->nopen - 1] : 0;
    if (PLANTED(BUG_RELEASE_FORGETS_OPEN_SNAPSHOT))
        m->highest = 0;                               /* planted: forgets the others */
    set_guard(m);                                     /* inv. 13: H, or V while tracking */
    return 0;
}

static PyObject *Map_snapshot(MapObject *m, PyObject *Py_UNUSED(ignored))
{
    if (m->version >= MAX_VERSION) {
        raise_from_helper(Err_VersionOverflow, fn_overflow_message,
                          Py_BuildValue("(L)", (long long)m->version + 1));
        return NULL;
    }
    SnapObject *s = PyObject_GC_New(SnapObject, &Snap_Type);
    if (s == NULL)
        return NULL;
    s->owner = NULL;
    s->primary.dir = s->rehash.dir = NULL;
    s->released = 1;
    s->readers = s->release_pending = s->hand_back = 0;
    if (table_share(&m->primary, &s->primary) < 0)
        goto fail;
    if (m->rehash.dir != NULL) {
        if (table_share(&m->rehash, &s->rehash) < 0)
            goto fail;
    }
    else
        s->rehash.capacity = s->rehash.ndir = 0;
    if (open_version(m, m->version + 1) < 0)
        goto fail;
    m->version++;
    m->highest = m->version;                  /* inv. 5: the newest is the highest open */
    m->guard = m->version;                    /* inv. 13: V == H now, tracking or not */
    s->owner = (MapObject *)Py_NewRef((PyObject *)m);
    s->version = m->version;
    s->r = m->rehash.dir != NULL ? m->rehash_index : 0;
    s->size = map_len(m);
    s->marks_from = m->removal_limit != 0 ? m->tracking_since : INT32_MAX;   /* rule M */
    s->released = 0;
    PyObject_GC_Track(s);
    return (PyObject *)s;
fail:
    table_free(m, &s->primary);
    table_free(m, &s->rehash);
    s->released = 1;
    PyObject_GC_Del(s);
    return NULL;
}

/* Drop what a released snapshot held: its directories, then the batches no
 * open snapshot can reach any more. */
static void snap_free_held(SnapObject *s)
{
    Table primary = s->primary, rehash = s->rehash;
    s->primary.dir = s->rehash.dir = NULL;
    table_free(s->owner, &primary);             /* chunks only: no Python code runs */
    table_free(s->owner, &rehash);
    if (s->hand_back) {                         /* rule G: the owner frees them */
        hand_back_batches(s->owner, detach_unreachable_batches(s->owner));
        return;
    }
    /* Free last, detached first: freeing entries may run __del__ (and with it
     * the owner's thread); the bookkeeping above is already consistent. */
    free_batches(detach_unreachable_batches(s->owner));
}

static int snap_release(SnapObject *s)
{
    if (s->released) {
        raise_from_helper(Err_SnapshotReleased, fn_released_message,
                          Py_BuildValue("(is)", s->version, "already"));
        return -1;
    }
    if (s->readers > 0) {
        /* A finalizer run by an allocation of a reader released it: readers
         * stop at their next check; the version stays open until they end. */
        s->released = 1;
        s->release_pending = 1;
        return 0;
    }
    if (release_version(s->owner, s->version) < 0)
        return -1;
    s->released = 1;
    snap_free_held(s);
    return 0;
}

static void snap_pin(SnapObject *s) { s->readers++; }

static void snap_unpin(SnapObject *s)
{
    if (--s->readers == 0 && s->release_pending) {
        s->release_pending = 0;
        if (release_version(s->owner, s->version) < 0)
            PyErr_WriteUnraisable((PyObject *)s);
        snap_free_held(s);
    }
}

static PyObject *Map_release(MapObject *m, PyObject *snapshot)
{
    if (!PyObject_TypeCheck(snapshot, &Snap_Type)
        || ((SnapObject *)snapshot)->owner != m) {
        raise_from_helper(Err_ForeignSnapshot, fn_foreign_message, PyTuple_Pack(1, snapshot));
        return NULL;
    }
    if (snap_release((SnapObject *)snapshot) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* reclaim(): free every handed-back entry now (rule G); the count freed. */
static PyObject *Map_reclaim(MapObject *m, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(reclaim(m, -1));
}

static PyObject *Map_get_garbage(MapObject *m, void *closure)
{
    (void)closure;
    return PyLong_FromSsize_t(garbage_size(m));
}

static PyObject *Map_release_version(MapObject *m, PyObject *arg)
{
    long v = PyLong_AsLong(arg);
    if (v == -1 && PyErr_Occurred())
        return NULL;
    if (release_version(m, (int32_t)v) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* ------------------------------------------------------- change tracking */

/* A version argument of the tracking methods as a C integer: ints beyond the
 * range compare as the range's ends would. -1 with InvalidArgumentError
 * (cowstate.map_contract.checked_version) for anything but an int. */
static int version_arg(PyObject *arg, const char *what, long long *out)
{
    if (!PyLong_CheckExact(arg)) {
        PyObject *r = PyObject_CallFunction(fn_checked_version, "Os", arg, what);
        Py_XDECREF(r);
        if (r != NULL)                /* the contract accepted it: it is no int here */
            PyErr_Format(PyExc_TypeError, "expected an int %s", what);
        return -1;
    }
    int overflow;
    *out = PyLong_AsLongLongAndOverflow(arg, &overflow);
    if (overflow)
        *out = overflow > 0 ? LLONG_MAX : LLONG_MIN;
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* track_changes(removal_limit=DEFAULT_REMOVAL_LIMIT): rules T and D from now
 * on; already tracking, only the limit changes (a smaller one drops an
 * overlong log, as an overflow does). The check and the default are
 * map_contract.checked_removal_limit's: a bad limit changes nothing. */
static PyObject *Map_track_changes(MapObject *m, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"removal_limit", NULL};
    PyObject *arg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|O:track_changes", kwlist, &arg))
        return NULL;
    PyObject *checked = arg == NULL ? PyObject_CallNoArgs(fn_checked_removal_limit)
                                    : PyObject_CallOneArg(fn_checked_removal_limit, arg);
    if (checked == NULL)
        return NULL;
    int overflow;
    long long limit = PyLong_AsLongLongAndOverflow(checked, &overflow);
    Py_DECREF(checked);
    if (limit == -1 && PyErr_Occurred())
        return NULL;
    if (overflow > 0 || limit > PY_SSIZE_T_MAX)
        limit = PY_SSIZE_T_MAX;                   /* a bound no log reaches */
    Dropped log = {NULL, 0};
    if (m->removal_limit == 0 || m->nremovals > limit) {
        detach_log(m, &log);
        m->tracking_since = m->version + 1;
    }
    m->removal_limit = (Py_ssize_t)limit;
    set_guard(m);                                     /* inv. 13: V from now on */
    drop_records(&log);                               /* last step: may run __del__ */
    Py_RETURN_NONE;
}

static PyObject *Map_get_tracking_since(MapObject *m, void *closure)
{
    (void)closure;
    if (m->removal_limit == 0)
        Py_RETURN_NONE;
    return PyLong_FromLong(m->tracking_since);
}

static PyObject *Map_get_guard(MapObject *m, void *closure)
{
    (void)closure;
    return PyLong_FromLong(m->guard);
}

/* The index of the first record of version >= `version` (versions never
 * decrease: invariant 13). */
static Py_ssize_t first_record_since(const MapObject *m, long long version)
{
    Py_ssize_t lo = 0, hi = m->nremovals;
    while (lo < hi) {
        Py_ssize_t mid = lo + (hi - lo) / 2;
        if (m->removals[mid].version < version)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* removals_since(version): the (key, ns) pairs removed since the snapshot of
 * `version`, each once, in the order of their last removal; None when the
 * log cannot tell (not tracking, or version < tracking_since). */
static PyObject *Map_removals_since(MapObject *m, PyObject *arg)
{
    long long version;
    if (version_arg(arg, "version", &version) < 0)
        return NULL;
    if (m->removal_limit == 0 || version < m->tracking_since)
        Py_RETURN_NONE;
    /* Phase 1: copy the records (new references) without allocating an
     * object, so no collection runs code that changes the log meanwhile. */
    Py_ssize_t first = first_record_since(m, version), n = m->nremovals - first;
    PyObject **pairs = PyMem_Malloc((size_t)(2 * n + 1) * sizeof(PyObject *));
    if (pairs == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t i = 0; i < n; i++) {
        pairs[2 * i] = Py_NewRef(m->removals[first + i].key);
        pairs[2 * i + 1] = Py_NewRef(m->removals[first + i].ns);
    }
    /* Phase 2: newest first, each pair once, then reversed: the order of the
     * last removals (hash and == are the keys' own: the pure map's dict). */
    PyObject *out = PyList_New(0), *seen = PySet_New(NULL);
    for (Py_ssize_t i = n - 1; out != NULL && seen != NULL && i >= 0; i--) {
        PyObject *pair = PyTuple_Pack(2, pairs[2 * i], pairs[2 * i + 1]);
        int known = pair == NULL ? -1 : PySet_Contains(seen, pair);
        if (known < 0 || (!known && (PySet_Add(seen, pair) < 0 || PyList_Append(out, pair) < 0)))
            Py_CLEAR(out);
        Py_XDECREF(pair);
    }
    Py_XDECREF(seen);
    if (seen == NULL)
        Py_CLEAR(out);
    if (out != NULL && PyList_Reverse(out) < 0)
        Py_CLEAR(out);
    for (Py_ssize_t i = 0; i < 2 * n; i++)
        Py_DECREF(pairs[i]);
    PyMem_Free(pairs);
    return out;
}

/* trim_removals(version): drop the records older than `version`;
 * tracking_since moves up to it (never past V + 1: invariant 13). */
static PyObject *Map_trim_removals(MapObject *m, PyObject *arg)
{
    long long version;
    if (version_arg(arg, "version", &version) < 0)
        return NULL;
    if (version > (long long)m->version + 1) {
        raise_from_helper(Err_InvalidArgument, fn_trim_message,
                          Py_BuildValue("(OL)", arg, (long long)m->version + 1));
        return NULL;
    }
    if (m->removal_limit == 0 || version <= m->tracking_since)
        Py_RETURN_NONE;
    Py_ssize_t first = first_record_since(m, version);
    Dropped old = {NULL, 0};
    if (first > 0) {              /* detach the dropped prefix before dropping it */
        old.records = PyMem_Malloc((size_t)first * sizeof(Removal));
        if (old.records == NULL)
            return PyErr_NoMemory();
        old.n = first;
        memcpy(old.records, m->removals, (size_t)first * sizeof(Removal));
        memmove(m->removals, m->removals + first,
                (size_t)(m->nremovals - first) * sizeof(Removal));
        m->nremovals -= first;
    }
    m->tracking_since = (int32_t)version;
    drop_records(&old);                               /* last step: may run __del__ */
    Py_RETURN_NONE;
}

/* ----------------------------------------------------------- iteration */

static PyObject *make_iter(PyObject *source, int is_snapshot, int mode, PyObject *filter_ns)
{
    IterObject *it = PyObject_GC_New(IterObject, &Iter_Type);
    if (it == NULL)
        return NULL;
    it->source = Py_NewRef(source);
    it->is_snapshot = is_snapshot;
    it->mode = mode;
    it->filter_ns = Py_XNewRef(filter_ns);
    it->table = 0;
    it->bucket = 0;
    it->chain = NULL;
    it->position = 0;
    it->started = 0;
    it->done = 0;
    it->expected_mod = it->expected_structure = 0;
    if (!is_snapshot) {
        MapObject *m = (MapObject *)source;
        it->expected_mod = m->mod_count;       /* read at iter(), not at the first next() */
        it->expected_structure = m->structure_count;
    }
    else {
        SnapObject *s = (SnapObject *)source;
        it->bucket = s->rehash.dir != NULL ? s->r : 0;   /* region 0 starts at primary[r] */
    }
    PyObject_GC_Track(it);
    return (PyObject *)it;
}

static PyObject *Map_iter(MapObject *m) { return make_iter((PyObject *)m, 0, ITER_ENTRIES, NULL); }

static PyObject *Map_keys(MapObject *m, PyObject *ns)
{
    return make_iter((PyObject *)m, 0, ITER_KEYS, ns);
}

static PyObject *Map_size_of_namespace(MapObject *m, PyObject *ns)
{
    PyObject *it = make_iter((PyObject *)m, 0, ITER_KEYS, ns);
    if (it == NULL)
        return NULL;
    Py_ssize_t n = 0;
    PyObject *item;
    while ((item = PyIter_Next(it)) != NULL) {
        n++;
        Py_DECREF(item);
    }
    Py_DECREF(it);
    if (PyErr_Occurred())
        return NULL;
    return PyLong_FromSsize_t(n);
}

/* The chain at `head` as a list of StateEntry tuples. Allocating may run the
 * GC and with it Python code (rule d of the header): reading the live map
 * (`m` given), a changed stamp means the chain may be gone, so it fails fast;
 * a snapshot's reader pins it instead (m NULL). */
static PyObject *chain_items(Entry *head, MapObject *m)
{
    uint64_t stamp = m != NULL ? m->stamp : 0;
    Py_ssize_t n = 0;
    for (Entry *e = head; e != NULL; e = e->next)
        n++;
    PyObject *chain = PyList_New(n);
    if (chain == NULL)
        return NULL;
    PyTypeObject *type = (PyTypeObject *)StateEntry_type;
    Entry *e = head;
    for (Py_ssize_t i = 0; i < n; i++) {
        if (m != NULL && m->stamp != stamp)
            goto changed;
        PyObject *key = Py_NewRef(e->key), *ns = Py_NewRef(e->ns);
        PyObject *state = Py_NewRef(e->state);
        Entry *next = e->next;                     /* read before anything may run */
        PyObject *t = type->tp_alloc(type, 3);     /* a StateEntry (a tuple subclass) */
        if (t == NULL) {
            Py_DECREF(key);
            Py_DECREF(ns);
            Py_DECREF(state);
            Py_DECREF(chain);
            return NULL;
        }
        PyTuple_SET_ITEM(t, 0, key);
        PyTuple_SET_ITEM(t, 1, ns);
        PyTuple_SET_ITEM(t, 2, state);
        PyList_SET_ITEM(chain, i, t);
        e = next;
    }
    if (m == NULL || m->stamp == stamp)
        return chain;
changed:
    Py_DECREF(chain);
    raise_from_helper(Err_ConcurrentModification, fn_modified_message, PyTuple_New(0));
    return NULL;
}

/* The next non-empty bucket's chain of the source, as a list of StateEntry
 * tuples (no pointer into the map survives this call); NULL at the end (with
 * no error set) or on error. */
static PyObject *iter_next_chain(IterObject *it)
{
    for (;;) {
        const Table *t;
        Py_ssize_t end;
        if (it->is_snapshot) {
            SnapObject *s = (SnapObject *)it->source;
            /* compact layout: primary[r:L], rehash[0:r], rehash[L:L+r] */
            if (it->table == 0) {
                t = &s->primary;
                end = s->primary.capacity;
            }
            else if (s->rehash.dir != NULL && it->table == 1) {
                t = &s->rehash;
                end = s->r;
            }
            else if (s->rehash.dir != NULL && it->table == 2) {
                t = &s->rehash;
                end = s->primary.capacity + s->r;
            }
            else
                return NULL;
        }
        else {
            MapObject *m = (MapObject *)it->source;
            if (it->table == 0)
                t = &m->primary;
            else if (it->table == 1 && m->rehash.dir != NULL)
                t = &m->rehash;
            else
                return NULL;
            end = t->capacity;
        }
        while (it->bucket < end) {
            Py_ssize_t b = it->bucket++;
            Chunk *c = t->dir[b >> t->bits];
            if (c == NULL) {                          /* skip an unallocated chunk */
                it->bucket = ((b >> t->bits) + 1) << t->bits;
                continue;
            }
            Entry *head = c->slots[b & (chunk_slots(t) - 1)];
            if (head == NULL)
                continue;
            if (!it->is_snapshot)
                return chain_items(head, (MapObject *)it->source);
            SnapObject *s = (SnapObject *)it->source;
            snap_pin(s);
            PyObject *chain = chain_items(head, NULL);
            snap_unpin(s);
            return chain;
        }
        it->table++;
        if (it->is_snapshot) {
            SnapObject *s = (SnapObject *)it->source;
            it->bucket = it->table == 2 ? s->primary.capacity : 0;
        }
        else
            it->bucket = 0;
    }
}

static int iter_check(IterObject *it)
{
    if (it->is_snapshot) {
        SnapObject *s = (SnapObject *)it->source;
        if (s->released) {
            raise_from_helper(Err_SnapshotReleased, fn_released_message,
                              Py_BuildValue("(is)", s->version,
                                            it->started ? "while being read" : "released"));
            return -1;
        }
        return 0;
    }
    MapObject *m = (MapObject *)it->source;
    if (m->mod_count != it->expected_mod || m->structure_count != it->expected_structure) {
        raise_from_helper(Err_ConcurrentModification, fn_modified_message, PyTuple_New(0));
        return -1;
    }
    return 0;
}

static PyObject *Iter_next(IterObject *it)
{
    for (;;) {
        if (it->done)
            return NULL;
        if (iter_check(it) < 0) {                 /* before every item, as the pure map */
            it->done = 1;
            Py_CLEAR(it->chain);
            return NULL;
        }
        it->started = 1;
        if (it->chain == NULL || it->position >= PyList_GET_SIZE(it->chain)) {
            Py_CLEAR(it->chain);
            it->chain = iter_next_chain(it);
            it->position = 0;
            if (it->chain == NULL) {
                it->done = 1;
                if (!PyErr_Occurred())
                    iter_check(it);              /* the pure map checks once more at the end */
                return NULL;
            }
        }
        PyObject *item = PyList_GET_ITEM(it->chain, it->position);
        it->position++;
        if (it->mode == ITER_ENTRIES)
            return Py_NewRef(item);
        /* Our own reference: __eq__ (or the error's repr) may call next() on
         * this iterator, which replaces the chain that holds the item. */
        item = Py_NewRef(item);
        PyObject *eq = PyObject_RichCompare(PyTuple_GET_ITEM(item, 1), it->filter_ns, Py_EQ);
        int match = eq == NULL ? -1 : PyObject_IsTrue(eq);
        Py_XDECREF(eq);
        if (match < 0) {                      /* rule U: the namespace's __eq__ raised */
            PyObject *args[2] = {PyTuple_GET_ITEM(item, 0), it->filter_ns};
            raise_user_error(fn_key_comparison_error, args, 2, 2);
            Py_DECREF(item);
            return NULL;
        }
        PyObject *key = match ? Py_NewRef(PyTuple_GET_ITEM(item, 0)) : NULL;
        Py_DECREF(item);
        if (key != NULL)
            return key;
    }
}

static int Iter_traverse(IterObject *it, visitproc visit, void *arg)
{
    Py_VISIT(it->source);
    Py_VISIT(it->filter_ns);
    Py_VISIT(it->chain);
    return 0;
}

static int Iter_clear(IterObject *it)
{
    Py_CLEAR(it->chain);
    Py_CLEAR(it->filter_ns);
    Py_CLEAR(it->source);
    return 0;
}

static void Iter_dealloc(IterObject *it)
{
    PyObject_GC_UnTrack(it);
    Iter_clear(it);
    PyObject_GC_Del(it);
}

static PyTypeObject Iter_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cowstate._cmap.Iterator",
    .tp_basicsize = sizeof(IterObject),
    .tp_dealloc = (destructor)Iter_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Iter_traverse,
    .tp_clear = (inquiry)Iter_clear,
    .tp_iter = PyObject_SelfIter,
    .tp_iternext = (iternextfunc)Iter_next,
};

/* -------------------------------------------------------- snapshot type */

static PyObject *Snap_iter(SnapObject *s) { return make_iter((PyObject *)s, 1, ITER_ENTRIES, NULL); }

static Py_ssize_t Snap_length(SnapObject *s)
{
    if (s->released) {
        raise_from_helper(Err_SnapshotReleased, fn_released_message,
                          Py_BuildValue("(is)", s->version, "released"));
        return -1;
    }
    return s->size;
}

static PyObject *snap_items_pinned(SnapObject *s);

static PyObject *Snap_items(SnapObject *s, PyObject *Py_UNUSED(ignored))
{
    if (s->released) {
        raise_from_helper(Err_SnapshotReleased, fn_released_message,
                          Py_BuildValue("(is)", s->version, "released"));
        return NULL;
    }
    snap_pin(s);           /* an allocation may run a finalizer that releases it */
    PyObject *out = snap_items_pinned(s);
    snap_unpin(s);
    return out;
}

/* The bucket ranges of a snapshot's compact layout (primary[r:L],
 * rehash[0:r], rehash[L:L+r]; primary[0:L] outside a rehash); their count. */
static int snap_regions(const SnapObject *s, const Table *tables[3], Py_ssize_t begin[3],
                        Py_ssize_t end[3])
{
    if (s->rehash.dir == NULL) {
        tables[0] = &s->primary; begin[0] = 0; end[0] = s->primary.capacity;
        return 1;
    }
    tables[0] = &s->primary; begin[0] = s->r; end[0] = s->primary.capacity;
    tables[1] = &s->rehash; begin[1] = 0; end[1] = s->r;
    tables[2] = &s->rehash; begin[2] = s->primary.capacity;
    end[2] = s->primary.capacity + s->r;
    return 3;
}

static PyObject *snap_items_pinned(SnapObject *s)
{
    PyObject *out = PyList_New(s->size);
    if (out == NULL)
        return NULL;
    Py_ssize_t n = 0;
    const Table *tables[3];
    Py_ssize_t begin[3], end[3];
    int count = snap_regions(s, tables, begin, end);
    for (int k = 0; k < count; k++) {
        const Table *t = tables[k];
        for (Py_ssize_t b = begin[k]; b < end[k]; b++) {
            Chunk *c = t->dir[b >> t->bits];
            if (c == NULL)
                continue;
            for (Entry *e = c->slots[b & (chunk_slots(t) - 1)]; e != NULL; e = e->next) {
                PyObject *item = PyTuple_Pack(3, e->key, e->ns, e->state);
                if (item == NULL || n >= s->size) {
                    Py_XDECREF(item);
                    Py_DECREF(out);
                    if (!PyErr_Occurred())
                        PyErr_SetString(PyExc_AssertionError,
                                        "snapshot holds more entries than its size");
                    return NULL;
                }
                PyList_SET_ITEM(out, n++, item);
            }
        }
    }
    if (n != s->size) {
        Py_DECREF(out);
        PyErr_SetString(PyExc_AssertionError, "snapshot holds fewer entries than its size");
        return NULL;
    }
    return out;
}

/* changed_items(since): the mappings with state_version >= since (rule T: with
 * the map tracking since a base of version `since`, a superset of those that
 * differ from the base's), as items() gives them. */
static PyObject *Snap_changed_items(SnapObject *s, PyObject *arg)
{
    long long since;
    if (version_arg(arg, "since", &since) < 0)
        return NULL;
    if (s->released) {
        raise_from_helper(Err_SnapshotReleased, fn_released_message,
                          Py_BuildValue("(is)", s->version, "released"));
        return NULL;
    }
    snap_pin(s);           /* an allocation may run a finalizer that releases it */
    PyObject *out = PyList_New(0);
    const Table *tables[3];
    Py_ssize_t begin[3], end[3];
    int count = snap_regions(s, tables, begin, end);
    for (int k = 0; out != NULL && k < count; k++) {
        const Table *t = tables[k];
        for (Py_ssize_t b = begin[k]; out != NULL && b < end[k]; b++) {
            Chunk *c = t->dir[b >> t->bits];
            if (c == NULL)
                continue;
            for (Entry *e = c->slots[b & (chunk_slots(t) - 1)]; e != NULL; e = e->next) {
                if (e->state_version < since)
                    continue;
                PyObject *item = PyTuple_Pack(3, e->key, e->ns, e->state);
                if (item == NULL || PyList_Append(out, item) < 0) {
                    Py_XDECREF(item);
                    Py_CLEAR(out);
                    break;
                }
                Py_DECREF(item);
            }
        }
    }
    snap_unpin(s);
    return out;
}

static PyObject *Snap_release(SnapObject *s, PyObject *Py_UNUSED(ignored))
{
    if (snap_release(s) < 0)
        return NULL;
    Py_RETURN_NONE;
}

/* release(), leaving the entries only this snapshot kept alive to the owner
 * (rule G): what a snapshot writer on another thread calls. */
static PyObject *Snap_hand_back(SnapObject *s, PyObject *Py_UNUSED(ignored))
{
    int before = s->hand_back;
    s->hand_back = 1;
    if (snap_release(s) < 0) {
        s->hand_back = before;                  /* nothing was released by this call */
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *Snap_enter(SnapObject *s, PyObject *Py_UNUSED(ignored))
{
    return Py_NewRef((PyObject *)s);
}

static PyObject *Snap_exit(SnapObject *s, PyObject *const *args, Py_ssize_t nargs)
{
    (void)args;
    (void)nargs;
    if (!s->released && snap_release(s) < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Snap_get_released(SnapObject *s, void *closure)
{
    (void)closure;
    return PyBool_FromLong(s->released);
}

static PyObject *Snap_get_version(SnapObject *s, void *closure)
{
    (void)closure;
    return PyLong_FromLong(s->version);
}

static PyObject *Snap_get_owner(SnapObject *s, void *closure)
{
    (void)closure;
    if (s->owner == NULL)
        Py_RETURN_NONE;
    return Py_NewRef((PyObject *)s->owner);
}

static PyObject *Snap_repr(SnapObject *s)
{
    if (s->released)
        return PyUnicode_FromFormat("<StateMapSnapshot version=%d released>", (int)s->version);
    return PyUnicode_FromFormat("<StateMapSnapshot version=%d size=%zd>", (int)s->version,
                                s->size);
}

static int Snap_traverse(SnapObject *s, visitproc visit, void *arg)
{
    Py_VISIT(s->owner);             /* its entries: see "Garbage collector" in the header */
    return 0;
}

static int Snap_clear(SnapObject *s)
{
    if (!s->released && s->owner != NULL) {
        /* Dropped (or collected) open: release it, so copy-on-write stops. */
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        if (snap_release(s) < 0)
            PyErr_WriteUnraisable((PyObject *)s);
        PyErr_Restore(type, value, tb);
    }
    table_free(s->owner, &s->primary);
    table_free(s->owner, &s->rehash);
    s->released = 1;
    Py_CLEAR(s->owner);
    return 0;
}

static void Snap_dealloc(SnapObject *s)
{
    PyObject_GC_UnTrack(s);
    Snap_clear(s);
    PyObject_GC_Del(s);
}

static PyMethodDef Snap_methods[] = {
    {"release", (PyCFunction)Snap_release, METH_NOARGS,
     "Release this snapshot: copy-on-write stops protecting it."},
    {"hand_back", (PyCFunction)Snap_hand_back, METH_NOARGS,
     "Release this snapshot; the map's owner frees what only it kept alive "
     "(a few entries per keyed write, or reclaim())."},
    {"items", (PyCFunction)Snap_items, METH_NOARGS,
     "Every mapping as a plain (key, namespace, state) tuple, in one list."},
    {"changed_items", (PyCFunction)Snap_changed_items, METH_O,
     "The mappings whose state_version >= since, as items() gives them (rule T)."},
    {"__enter__", (PyCFunction)Snap_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Snap_exit, METH_FASTCALL, NULL},
    {"__class_getitem__", Py_GenericAlias, METH_O | METH_CLASS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Snap_getset[] = {
    {"is_released", (getter)Snap_get_released, NULL, NULL, NULL},
    {"version", (getter)Snap_get_version, NULL, NULL, NULL},
    {"_owner", (getter)Snap_get_owner, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Snap_as_sequence = {
    .sq_length = (lenfunc)Snap_length,
};

static PyTypeObject Snap_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cowstate._cmap.StateMapSnapshot",
    .tp_doc = "An immutable view of a map at one version (see cowstate.state_map).",
    .tp_basicsize = sizeof(SnapObject),
    .tp_dealloc = (destructor)Snap_dealloc,
    .tp_repr = (reprfunc)Snap_repr,
    .tp_as_sequence = &Snap_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Snap_traverse,
    .tp_clear = (inquiry)Snap_clear,
    .tp_iter = (getiterfunc)Snap_iter,
    .tp_methods = Snap_methods,
    .tp_getset = Snap_getset,
};

/* ------------------------------------------------------ map type plumbing */

/* Store `serializer` (a new reference, checked) and whether it copies scalars
 * as themselves (serializers.copies_scalars_as_is). -1 leaves the map as it was. */
static int set_serializer(MapObject *m, PyObject *serializer)
{
    PyObject *flag = PyObject_CallOneArg(fn_copies_scalars_as_is, serializer);
    if (flag == NULL) {
        Py_DECREF(serializer);
        return -1;
    }
    int as_is = flag == Py_True;
    Py_DECREF(flag);
    Py_XSETREF(m->serializer, serializer);
    m->scalars_as_is = as_is;
    return 0;
}

static PyObject *Map_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"serializer", "initial_capacity", NULL};
    PyObject *serializer = Py_None, *capacity_arg = NULL;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "|OO:CopyOnWriteStateMap", kwlist,
                                     &serializer, &capacity_arg))
        return NULL;
    /* Validation and defaults come from the pure map's module: one source. */
    PyObject *checked = capacity_arg == NULL
        ? PyObject_CallFunctionObjArgs(fn_constructor_arguments, serializer, NULL)
        : PyObject_CallFunctionObjArgs(fn_constructor_arguments, serializer, capacity_arg,
                                       NULL);
    if (checked == NULL)
        return NULL;
    Py_ssize_t capacity = PyLong_AsSsize_t(PyTuple_GET_ITEM(checked, 1));
    MapObject *m = (MapObject *)type->tp_alloc(type, 0);
    if (m == NULL) {
        Py_DECREF(checked);
        return NULL;
    }
    m->rehash.dir = NULL;
    int rc = set_serializer(m, Py_NewRef(PyTuple_GET_ITEM(checked, 0)));
    Py_DECREF(checked);
    if (rc < 0) {
        Py_DECREF(m);
        return NULL;
    }
    if (table_init(&m->primary, capacity) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    m->threshold = threshold_for(capacity);
    return (PyObject *)m;
}

static int Map_traverse(MapObject *m, visitproc visit, void *arg)
{
    Py_VISIT(m->serializer);
    for (Py_ssize_t i = 0; i < m->nremovals; i++) {          /* the removal log's (rule D) */
        if (PyType_IS_GC(Py_TYPE(m->removals[i].key)))
            Py_VISIT(m->removals[i].key);
        if (PyType_IS_GC(Py_TYPE(m->removals[i].ns)))
            Py_VISIT(m->removals[i].ns);
    }
    if (m->gc_entries == 0)              /* nothing here can be in a cycle (inv. 12) */
        return 0;
    const Table *tables[2] = {&m->primary, &m->rehash};
    for (int k = 0; k < 2; k++) {
        const Table *t = tables[k];
        if (t->dir == NULL)
            continue;
        Py_ssize_t slots = chunk_slots(t);
        for (Py_ssize_t i = 0; i < t->ndir; i++) {
            Chunk *c = t->dir[i];
            if (c == NULL)
                continue;
            for (Py_ssize_t j = 0; j < slots; j++) {
                for (Entry *e = c->slots[j]; e != NULL; e = e->next) {
                    /* Untracked objects (ints, strs, ...) cannot be in a cycle. */
                    if (PyType_IS_GC(Py_TYPE(e->key)))
                        Py_VISIT(e->key);
                    if (PyType_IS_GC(Py_TYPE(e->ns)))
                        Py_VISIT(e->ns);
                    if (e->state != NULL && PyType_IS_GC(Py_TYPE(e->state)))
                        Py_VISIT(e->state);
                }
            }
        }
    }
    return 0;
}

static void map_reset(MapObject *m, Table *primary_out, Table *rehash_out)
{
    /* Detach the live tables for the caller to free (freeing runs __del__). */
    *primary_out = m->primary;
    *rehash_out = m->rehash;
    m->primary.dir = NULL;
    m->rehash.dir = NULL;
    m->primary_size = m->rehash_size = 0;
    m->rehash_index = 0;
    m->gc_entries = 0;
    m->stamp++;
    m->mod_count++;
}

static void drop_tables(MapObject *m, Table *primary, Table *rehash)
{
    /* Entries first (retired while snapshots are open: the GC may clear a map
     * before the snapshots of the same cycle), then the directories. */
    table_drop_entries(m, primary);
    table_drop_entries(m, rehash);
    table_free(NULL, primary);                  /* the live tables: no spares kept */
    table_free(NULL, rehash);
}

static int Map_clear(MapObject *m)
{
    Table primary, rehash;
    map_reset(m, &primary, &rehash);
    if (table_init(&m->primary, MINIMUM_CAPACITY) < 0)
        PyErr_Clear();
    m->threshold = threshold_for(MINIMUM_CAPACITY);
    m->rehash.capacity = m->rehash.ndir = 0;
    drop_tables(m, &primary, &rehash);
    spare_trim(m, 0);                         /* inv. 15: a new table */
    Py_CLEAR(m->serializer);
    reclaim(m, -1);
    Dropped log = {NULL, 0};                  /* rule D: tracking goes on, from V + 1 */
    detach_log(m, &log);
    if (m->removal_limit != 0)
        m->tracking_since = m->version + 1;
    drop_records(&log);
    return 0;
}

static void Map_dealloc(MapObject *m)
{
    PyObject_GC_UnTrack(m);
    if (m->weakreflist != NULL)
        PyObject_ClearWeakRefs((PyObject *)m);
    Table primary, rehash;
    map_reset(m, &primary, &rehash);
    m->nopen = 0;                      /* snapshots hold their map: none is open now */
    drop_tables(m, &primary, &rehash);
    spare_trim(m, 0);
    Batch *retired = m->retired;
    m->retired = m->retired_tail = NULL;
    free_batches(retired);
    reclaim(m, -1);
    Dropped log = {NULL, 0};                  /* the removal log's references (rule D) */
    detach_log(m, &log);
    drop_records(&log);
    Py_CLEAR(m->serializer);
    PyMem_Free(m->open);
    m->open = NULL;
    Py_TYPE(m)->tp_free((PyObject *)m);
}

static PyObject *Map_repr(MapObject *m)
{
    PyObject *open = open_versions_tuple(m);
    if (open == NULL)
        return NULL;
    PyObject *list = PySequence_List(open);
    Py_DECREF(open);
    if (list == NULL)
        return NULL;
    PyObject *r = PyUnicode_FromFormat(
        "<CopyOnWriteStateMap size=%zd capacity=%zd%s version=%d open=%R>", map_len(m),
        m->primary.capacity, m->rehash.dir != NULL ? " rehashing" : "", (int)m->version, list);
    Py_DECREF(list);
    return r;
}

static PyObject *Map_get_serializer(MapObject *m, void *closure)
{
    (void)closure;
    return Py_NewRef(m->serializer != NULL ? m->serializer : Py_None);
}

static int Map_set_serializer(MapObject *m, PyObject *value, void *closure)
{
    (void)closure;
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "the serializer cannot be deleted");
        return -1;
    }
    PyObject *checked = PyObject_CallOneArg(fn_checked_serializer, value);
    if (checked == NULL)
        return -1;
    return set_serializer(m, checked);                 /* takes `checked` */
}

/* _version: readable; settable as a test knob (the version-overflow test)
 * only forwards, and only while no snapshot is open. */
static PyObject *Map_get_version(MapObject *m, void *closure)
{
    (void)closure;
    return PyLong_FromLong(m->version);
}

static int Map_set_version(MapObject *m, PyObject *value, void *closure)
{
    (void)closure;
    long v = value == NULL ? -1 : PyLong_AsLong(value);
    if (v == -1 && PyErr_Occurred())
        return -1;
    if (v < m->version || v > MAX_VERSION || m->nopen != 0) {
        PyErr_Format(Err_InvalidArgument,
                     "expected a version in [%d, %d] with no snapshot open, got %ld",
                     (int)m->version, MAX_VERSION, v);
        return -1;
    }
    m->version = (int32_t)v;
    set_guard(m);                                     /* inv. 13 */
    return 0;
}

static PyObject *Map_get_highest(MapObject *m, void *closure)
{
    (void)closure;
    return PyLong_FromLong(m->highest);
}

static PyObject *Map_get_open(MapObject *m, void *closure)
{
    (void)closure;
    PyObject *t = open_versions_tuple(m);
    if (t == NULL)
        return NULL;
    PyObject *f = PyFrozenSet_New(t);
    Py_DECREF(t);
    return f;
}

/* _bookkeeping(): the counters and versions cowstate.introspection reports,
 * read-only and O(1) (the structure itself is read by the test-only probe,
 * cowstate_spec._cmap_probe, through _cmap.h). */
static PyObject *Map_bookkeeping(MapObject *m, PyObject *Py_UNUSED(ignored))
{
    PyObject *open = open_versions_tuple(m);
    if (open == NULL)
        return NULL;
    return Py_BuildValue(
        "{s:n,s:n,s:O,s:n,s:n,s:n,s:n,s:i,s:i,s:N}", "capacity", m->primary.capacity,
        "rehash_capacity", m->rehash.dir != NULL ? m->rehash.capacity : (Py_ssize_t)0,
        "is_rehashing", m->rehash.dir != NULL ? Py_True : Py_False, "rehash_index",
        m->rehash_index, "primary_size", m->primary_size, "rehash_size", m->rehash_size,
        "threshold", m->threshold, "version", (int)m->version, "highest_required",
        (int)m->highest, "open_versions", open);
}

static PyMethodDef Map_methods[] = {
    {"get", (PyCFunction)(void (*)(void))Map_get, METH_FASTCALL,
     "The state of (key, namespace), or None if absent (rule S: a private copy)."},
    {"contains_key", (PyCFunction)(void (*)(void))Map_contains_key, METH_FASTCALL,
     "True if (key, namespace) is mapped."},
    {"put", (PyCFunction)(void (*)(void))Map_put, METH_FASTCALL,
     "Map (key, namespace) to state (never None)."},
    {"put_and_get_old", (PyCFunction)(void (*)(void))Map_put_and_get_old, METH_FASTCALL,
     "Map (key, namespace) to state; return the previous state or None."},
    {"remove", (PyCFunction)(void (*)(void))Map_remove, METH_FASTCALL,
     "Unmap (key, namespace); absent mappings are ignored."},
    {"remove_and_get_old", (PyCFunction)(void (*)(void))Map_remove_and_get_old, METH_FASTCALL,
     "Unmap (key, namespace); return its state or None if absent."},
    {"transform", (PyCFunction)(void (*)(void))Map_transform, METH_FASTCALL,
     "Map (key, namespace) to fn(old_or_None, value); atomic."},
    {"snapshot", (PyCFunction)Map_snapshot, METH_NOARGS,
     "Open a snapshot: an immutable view of the mappings as they are now."},
    {"reclaim", (PyCFunction)Map_reclaim, METH_NOARGS,
     "Free every entry handed back by a snapshot's hand_back() now; the count."},
    {"release", (PyCFunction)Map_release, METH_O,
     "Release snapshot, which must have been taken from this map."},
    {"keys", (PyCFunction)Map_keys, METH_O,
     "The keys mapped in namespace (fail-fast, like iter)."},
    {"size_of_namespace", (PyCFunction)Map_size_of_namespace, METH_O,
     "Number of mappings whose namespace equals namespace."},
    {"track_changes", (PyCFunction)(void (*)(void))Map_track_changes,
     METH_VARARGS | METH_KEYWORDS,
     "Track changes from the next snapshot on (rules T and D of cowstate.state_map)."},
    {"removals_since", (PyCFunction)Map_removals_since, METH_O,
     "The (key, namespace) pairs removed since the snapshot of version, or None."},
    {"trim_removals", (PyCFunction)Map_trim_removals, METH_O,
     "Drop the removal records older than version (tracking_since moves up to it)."},
    {"_release_version", (PyCFunction)Map_release_version, METH_O, NULL},
    {"_bookkeeping", (PyCFunction)Map_bookkeeping, METH_NOARGS,
     "Capacities, counters and versions, read-only (cowstate.introspection)."},
    {"__class_getitem__", Py_GenericAlias, METH_O | METH_CLASS, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Map_getset[] = {
    {"pending_reclaim", (getter)Map_get_garbage, NULL,
     "Entries handed back by hand_back() and not freed yet (rule G).", NULL},
    {"serializer", (getter)Map_get_serializer, (setter)Map_set_serializer,
     "The serializer that copies shared states.", NULL},
    {"_version", (getter)Map_get_version, (setter)Map_set_version, NULL, NULL},
    {"_highest_required", (getter)Map_get_highest, NULL, NULL, NULL},
    {"_guard", (getter)Map_get_guard, NULL, NULL, NULL},
    {"tracking_since", (getter)Map_get_tracking_since, NULL,
     "The oldest base version a delta may be built against, or None when not tracking.",
     NULL},
    {"_open_versions", (getter)Map_get_open, NULL, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Map_as_sequence = {
    .sq_length = (lenfunc)Map_length,
    .sq_contains = (objobjproc)Map_contains,
};

static PyTypeObject Map_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cowstate._cmap.CopyOnWriteStateMap",
    .tp_doc = "Map (key, namespace) -> state with cheap snapshots, in C "
              "(design: the header of impl/cowstate/_cmap.c).",
    .tp_basicsize = sizeof(MapObject),
    .tp_dealloc = (destructor)Map_dealloc,
    .tp_repr = (reprfunc)Map_repr,
    .tp_as_sequence = &Map_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Map_traverse,
    .tp_clear = (inquiry)Map_clear,
    .tp_weaklistoffset = offsetof(MapObject, weakreflist),
    .tp_iter = (getiterfunc)Map_iter,
    .tp_methods = Map_methods,
    .tp_getset = Map_getset,
    .tp_new = Map_new,
};

/* ------------------------------------------------------------- the module */

static int lookup_attr(PyObject *module, const char *name, PyObject **out)
{
    *out = PyObject_GetAttrString(module, name);
    return *out == NULL ? -1 : 0;
}

/* `module.cls.method`, a bound class method (rule U's error factories). */
static int lookup_method(PyObject *module, const char *cls, const char *method, PyObject **out)
{
    PyObject *owner = PyObject_GetAttrString(module, cls);
    *out = owner == NULL ? NULL : PyObject_GetAttrString(owner, method);
    Py_XDECREF(owner);
    return *out == NULL ? -1 : 0;
}

/* What a reader of _cmap.h checks before it touches a struct (published as
 * the capsule `_LAYOUT`; the rules are at the top of _cmap.h). */
static const CmapLayout layout = {
    .version = COWSTATE_LAYOUT_VERSION,
    .entry_size = sizeof(Entry),
    .batch_size = sizeof(Batch),
    .chunk_size = sizeof(Chunk),
    .table_size = sizeof(Table),
    .map_size = sizeof(MapObject),
    .snap_size = sizeof(SnapObject),
    .map_type = &Map_Type,
    .snap_type = &Snap_Type,
    .snap_pin = snap_pin,
    .snap_unpin = snap_unpin,
};

static struct PyModuleDef cmap_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cowstate." STR(COWSTATE_MODULE),
    .m_doc = "The copy-on-write state map in C (design: the header of _cmap.c).",
    .m_size = -1,
};

PyMODINIT_FUNC CAT(PyInit_, COWSTATE_MODULE)(void)
{
    /* What this module takes from Python: names of cowstate.errors, and of
     * cowstate.map_contract's __all__ (its public contract with this file;
     * tests/test_layering.py reads these lookups and requires each name
     * there). The first failed lookup ends the chain: nothing more is called
     * with its exception set. */
    PyObject *errors = PyImport_ImportModule("cowstate.errors");
    PyObject *contract = errors == NULL ? NULL : PyImport_ImportModule("cowstate.map_contract");
    if (contract == NULL) {
        Py_XDECREF(errors);
        return NULL;
    }
    int rc = lookup_attr(errors, "ConcurrentModificationError", &Err_ConcurrentModification)
        || lookup_attr(errors, "ForeignSnapshotError", &Err_ForeignSnapshot)
        || lookup_attr(errors, "InvalidArgumentError", &Err_InvalidArgument)
        || lookup_attr(errors, "MaximumCapacityError", &Err_MaximumCapacity)
        || lookup_attr(errors, "NoneStateError", &Err_NoneState)
        || lookup_attr(errors, "SnapshotReleasedError", &Err_SnapshotReleased)
        || lookup_attr(errors, "UnhashableKeyError", &Err_UnhashableKey)
        || lookup_attr(errors, "VersionOverflowError", &Err_VersionOverflow)
        || lookup_method(errors, "KeyHashError", "raised_by_pair", &fn_key_hash_error)
        || lookup_method(errors, "KeyComparisonError", "of", &fn_key_comparison_error)
        || lookup_method(errors, "StateCopyError", "of", &fn_state_copy_error)
        || lookup_method(errors, "TransformFunctionError", "of", &fn_transform_error)
        || lookup_attr(contract, "StateEntry", &StateEntry_type)
        || lookup_attr(contract, "constructor_arguments", &fn_constructor_arguments)
        || lookup_attr(contract, "checked_serializer", &fn_checked_serializer)
        || lookup_attr(contract, "copies_scalars_as_is", &fn_copies_scalars_as_is)
        || lookup_attr(contract, "none_message", &fn_none_message)
        || lookup_attr(contract, "modified_message", &fn_modified_message)
        || lookup_attr(contract, "pair_message", &fn_pair_message)
        || lookup_attr(contract, "foreign_message", &fn_foreign_message)
        || lookup_attr(contract, "overflow_message", &fn_overflow_message)
        || lookup_attr(contract, "capacity_message", &fn_capacity_message)
        || lookup_attr(contract, "released_message", &fn_released_message)
        || lookup_attr(contract, "open_versions_message", &fn_open_versions_message)
        || lookup_attr(contract, "reentrant_message", &fn_reentrant_message)
        || lookup_attr(contract, "checked_removal_limit", &fn_checked_removal_limit)
        || lookup_attr(contract, "checked_version", &fn_checked_version)
        || lookup_attr(contract, "trim_message", &fn_trim_message);
    Py_DECREF(errors);
    Py_DECREF(contract);
    if (rc != 0)
        return NULL;
    str_copy = PyUnicode_InternFromString("copy");
    str_of = PyUnicode_InternFromString("of");
    str_from_transform = PyUnicode_InternFromString("from_transform");
    if (str_copy == NULL || str_of == NULL || str_from_transform == NULL)
        return NULL;
    if (PyType_Ready(&Map_Type) < 0 || PyType_Ready(&Snap_Type) < 0
        || PyType_Ready(&Iter_Type) < 0)
        return NULL;
    /* The snapshot type's public name is the pure one's (messages name it). */
    PyObject *module = PyModule_Create(&cmap_module);
    if (module == NULL)
        return NULL;
    if (PyModule_AddObjectRef(module, "CopyOnWriteStateMap", (PyObject *)&Map_Type) < 0
        || PyModule_AddObjectRef(module, "StateMapSnapshot", (PyObject *)&Snap_Type) < 0
        || PyModule_AddIntConstant(module, "CHUNK_BUCKETS", 1 << CHUNK_BITS_MAX) < 0
        || PyModule_AddIntConstant(module, "BUG", COWSTATE_BUG) < 0
        || PyModule_AddIntConstant(module, "ENTRY_BYTES", (long)sizeof(Entry)) < 0
        || PyModule_AddIntConstant(module, "LAYOUT_VERSION", COWSTATE_LAYOUT_VERSION) < 0) {
        Py_DECREF(module);
        return NULL;
    }
    /* Read-only to Python: a capsule is opaque, and nothing here writes through it. */
    PyObject *capsule = PyCapsule_New((void *)&layout, COWSTATE_LAYOUT_CAPSULE, NULL);
    if (capsule == NULL || PyModule_AddObjectRef(module, "_LAYOUT", capsule) < 0) {
        Py_XDECREF(capsule);
        Py_DECREF(module);
        return NULL;
    }
    Py_DECREF(capsule);
    return module;
}
