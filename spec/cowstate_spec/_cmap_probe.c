/*
 * _cmap_probe.c -- the C map seen from inside: cowstate_spec._cmap_probe
 * ======================================================================
 *
 * Test-only. The installed map (cowstate._cmap) holds no code that exports
 * its structure or breaks it; this module does both, for the specification,
 * by reading the map's structs through impl/cowstate/_cmap.h:
 *
 *   structure(m), snapshot_structure(s)   every table, chunk (a live one's
 *                                         marks too), entry and batch as plain
 *                                         tuples (cowstate_spec.cmap_view)
 *   fingerprint(s, ...), check(m, fps)    the structural checker in C:
 *                                         invariants 1-15 of the map, what an
 *                                         open snapshot reaches (6-8)
 *   rehash_progress(m), rehash_state(m)   the rehash, for coverage and the
 *                                         step check of invariant 9
 *   corrupt(m, what, ...)                 one invariant broken on purpose,
 *                                         undone when the returned object ends
 *
 * Which maps it reads
 * -------------------
 * attach(module) registers a map module (cowstate._cmap at import; each build
 * of cowstate_spec.bad_cmaps when it is loaded): it takes the module's
 * `_LAYOUT` capsule and requires the layout version and every struct size to
 * be this module's own (both compiled from _cmap.h). Every function then
 * requires its argument's type to be EXACTLY one registered map (snapshot)
 * type before it reads a struct: a subclass, a pure map or a module built
 * from another layout is a TypeError, never a misread.
 *
 * Reading without running code: two phases
 * ----------------------------------------
 * Python code -- a key's __hash__ or __eq__, a state's __eq__, a finalizer the
 * garbage collector runs when an allocation triggers it -- may change the map
 * or release a snapshot (freeing the entries only it reached). So every read
 * is split:
 *
 *   1. gather: follow the map's pointers and copy what is needed into C
 *      arrays (PyMem only: no object is allocated, so no collection runs),
 *      taking a new reference to every key, namespace and state copied;
 *   2. judge or build: run Python code (hashes, equality, tuples, messages)
 *      on the copies only, never following a map pointer again. Addresses
 *      are still compared, never dereferenced.
 *
 * The checker (check, fingerprint)
 * --------------------------------
 * cowstate_spec.invariants is the reference: check_map() over the structure
 * export (cmap_view) judges the C map with the same Python code as the pure
 * map. check() here judges the same facts in the same order and returns the
 * same message ("invariant N violated: ...") or None; tests require both to
 * accept every healthy map and to name the same violation for every
 * corruption below. Like the reference it computes hashes, thresholds and
 * the snapshot layout with the model's plain formulas (cowstate_model.
 * arithmetic, written again below), never with _cmap.c's helpers, and it
 * calls back into Python only for what the reference asks Python
 * (hash(), ==, deep_copy, is_known_immutable).
 *
 * A fingerprint records, right after snapshot(), every compact-layout slot
 * of the snapshot and every entry it reaches: address, successor, key,
 * namespace and state (new references), the state's deep copy when asked,
 * and whether the state is known immutable. check() compares the snapshot
 * as it is now along the recorded order: the heads first, then each entry's
 * key, state and successor, so it only ever follows pointers the snapshot
 * reaches now; recorded addresses are compared only. Order of judgement (the
 * reference's): 9, 2, 5 and 13 of the map; each live entry (1, 2, 4, 3, 5, 6, 7);
 * the counters (3); each fingerprint (8); 12; the batches (11); when every
 * open snapshot has a fingerprint, the chunk counts (10) and what each
 * snapshot reaches (11); last, while the map tracks changes, the marks of
 * each live table's chunks (14, rule M: per chunk in directory order its
 * marks_since, a bit beyond its buckets, then each entry of its buckets);
 * then the spare chunks (15, rule P: their count, their bound, then per spare
 * its count and the directories holding it).
 * The marks are gathered with the directory (each chunk's marks_since and
 * MARK_WORDS words, copied), so the judge reads no chunk either.
 *
 * Corruptions
 * -----------
 * corrupt(m, what, bucket, position=, to=) breaks one thing (the table in
 * corrupt_kinds below) and returns a Corruption that holds the map and undoes
 * the damage when it ends (`with`, undo(), or when it is dropped): the map
 * cannot be freed while it is corrupted, and no corruption transfers an
 * entry to two owners. Where the old in-map hook put a live entry into a
 * retired batch (so the batch and the live table both freed it), retire_live
 * here adds a batch the probe owns and that owns nothing: version INT32_MAX
 * (no release detaches it), unlinked and freed by the probe, never its entry.
 * hand_back_live likewise appends a one-entry batch of the probe's to the
 * map's garbage (rule G) and unlinks it; only a keyed write meanwhile (which
 * would free that live entry: never do one while it is active) takes it.
 * The four of invariant 13 change scalars of the tracking only (guard,
 * tracking_since, removal_limit, a record's version, that record found again
 * by its index and key before it is restored). The three of invariant 14
 * write the marks of a tracking map's chunk that no snapshot holds (rule C):
 * unmark clears the bit of a bucket that needs it, marks_since moves the
 * chunk's to V + 1, stray_mark sets bit `to` beyond the chunk's buckets. Their
 * undo keeps no chunk pointer: while the primary keeps its capacity, the
 * chunk at the bucket's index is the damaged one or rule C's copy of it
 * (which carries its marks) and is mended (marks_since only while it still
 * holds the value written: else its marks started over); a grown map freed
 * the damaged chunk and marked what its rehash moved.
 * Entries a corruption takes out of the map (relink's successor,
 * write_shared's head, unretire's entry) are held by the Corruption and put
 * back (unretire's is freed instead if a release freed its batch meanwhile,
 * as the batch would have). If the map changed structurally meanwhile (its
 * stamp or rehash count moved), what depends on entry pointers or on the
 * rehash index is left as it is, with a RuntimeWarning, and an entry still
 * held leaves the map as the map's own entries do (retired if an open snapshot
 * may reach it, else freed: probe_leave_live); the probe's batch,
 * unretire's entry, the chunk count, H, the threshold and the counters of
 * primary_size(_short) and gc_entries are always restored. One corruption at a time: a second one moves
 * the stamp, so the first leaves its damage in place.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_cmap.h"

/* cowstate_model.arithmetic, said again (the checker's own yardstick) */
#define MODEL_MINIMUM_CAPACITY 4
#define MODEL_MAXIMUM_CAPACITY ((Py_ssize_t)1 << 30)
#define MODEL_MAX_ARRAY_SIZE ((Py_ssize_t)2147483647 - 8)
#define MODEL_HASH_MIX 11400714819323198485ULL

/* (hash(key) * HASH_MIX + hash(ns)) modulo 2**64 (a negative hash is its two's
 * complement modulo 2**64, as Python's % gives), then h XOR h // 65536. */
static uint64_t model_composite_hash(Py_hash_t hk, Py_hash_t hn)
{
    uint64_t h = (uint64_t)hk * MODEL_HASH_MIX + (uint64_t)hn;
    return h ^ (h / 65536);
}

static Py_ssize_t model_threshold_for(Py_ssize_t capacity)
{
    if (capacity >= MODEL_MAXIMUM_CAPACITY)
        return MODEL_MAX_ARRAY_SIZE;
    return capacity * 3 / 4;
}

/* ================================================================ registry */

static PyObject *registry;          /* {map type or snapshot type: layout capsule} */

static const CmapLayout *layout_of_type(PyTypeObject *type)
{
    PyObject *capsule = PyDict_GetItemWithError(registry, (PyObject *)type);  /* borrowed */
    if (capsule == NULL)
        return NULL;
    return PyCapsule_GetPointer(capsule, COWSTATE_LAYOUT_CAPSULE);
}

/* `obj` as a map of a registered module, or NULL with TypeError. */
static MapObject *as_map(PyObject *obj)
{
    const CmapLayout *layout = layout_of_type(Py_TYPE(obj));
    if (layout != NULL && layout->map_type == Py_TYPE(obj))
        return (MapObject *)obj;
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_TypeError,
                     "expected a C map of an attached module (cowstate._cmap), got %.200s",
                     Py_TYPE(obj)->tp_name);
    return NULL;
}

static SnapObject *as_snap(PyObject *obj)
{
    const CmapLayout *layout = layout_of_type(Py_TYPE(obj));
    if (layout != NULL && layout->snap_type == Py_TYPE(obj))
        return (SnapObject *)obj;
    if (!PyErr_Occurred())
        PyErr_Format(PyExc_TypeError,
                     "expected a snapshot of a C map of an attached module, got %.200s",
                     Py_TYPE(obj)->tp_name);
    return NULL;
}

static PyObject *probe_attach(PyObject *self, PyObject *module)
{
    PyObject *capsule = PyObject_GetAttrString(module, "_LAYOUT");
    const CmapLayout *layout = NULL;
    if (capsule != NULL && PyCapsule_IsValid(capsule, COWSTATE_LAYOUT_CAPSULE))
        layout = PyCapsule_GetPointer(capsule, COWSTATE_LAYOUT_CAPSULE);
    if (layout == NULL) {
        PyErr_Clear();
        PyErr_Format(PyExc_ImportError, "expected %R to publish its layout as _LAYOUT, a "
                     "capsule named %s: rebuild it", module, COWSTATE_LAYOUT_CAPSULE);
        Py_XDECREF(capsule);
        return NULL;
    }
    if (layout->version != COWSTATE_LAYOUT_VERSION || layout->entry_size != sizeof(Entry)
        || layout->batch_size != sizeof(Batch) || layout->chunk_size != sizeof(Chunk)
        || layout->table_size != sizeof(Table) || layout->map_size != sizeof(MapObject)
        || layout->snap_size != sizeof(SnapObject)) {
        PyErr_Format(PyExc_ImportError,
                     "expected %R to have this probe's layout (version %d, a map of %zu "
                     "bytes), got version %d, a map of %zu bytes: rebuild both",
                     module, COWSTATE_LAYOUT_VERSION, sizeof(MapObject), layout->version,
                     layout->map_size);
        Py_DECREF(capsule);
        return NULL;
    }
    int rc = PyDict_SetItem(registry, (PyObject *)layout->map_type, capsule);
    if (rc == 0)
        rc = PyDict_SetItem(registry, (PyObject *)layout->snap_type, capsule);
    Py_DECREF(capsule);
    if (rc < 0)
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *probe_is_map(PyObject *self, PyObject *obj)
{
    const CmapLayout *layout = layout_of_type(Py_TYPE(obj));
    if (layout == NULL && PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(layout != NULL && layout->map_type == Py_TYPE(obj));
}

static PyObject *probe_is_snapshot(PyObject *self, PyObject *obj)
{
    const CmapLayout *layout = layout_of_type(Py_TYPE(obj));
    if (layout == NULL && PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(layout != NULL && layout->snap_type == Py_TYPE(obj));
}

/* ========================================================= phase 1: gather */

/* One entry as gathered. */
typedef struct Rec {
    const Entry *entry;             /* its address: compared, never followed later */
    const Entry *next;
    PyObject *key, *ns, *state;     /* new references; state NULL if the entry has none */
    uint64_t hash;
    int32_t entry_version, state_version;
    Py_ssize_t slot;                /* its bucket (a map's table) or compact slot (a snapshot) */
} Rec;

typedef struct Recs {
    Rec *at;
    Py_ssize_t n, cap;
} Recs;

static int recs_push(Recs *r, const Entry *e, Py_ssize_t slot)
{
    if (r->n == r->cap) {
        Py_ssize_t cap = r->cap ? r->cap * 2 : 64;
        Rec *grown = PyMem_Realloc(r->at, (size_t)cap * sizeof(Rec));
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        r->at = grown;
        r->cap = cap;
    }
    Rec *x = &r->at[r->n++];
    x->entry = e;
    x->next = e->next;
    x->key = Py_NewRef(e->key);
    x->ns = Py_NewRef(e->ns);
    x->state = Py_XNewRef(e->state);
    x->hash = e->hash;
    x->entry_version = e->entry_version;
    x->state_version = e->state_version;
    x->slot = slot;
    return 0;
}

/* Drop the references (may run finalizers: phase 2's last step). */
static void recs_clear(Recs *r)
{
    Rec *at = r->at;
    Py_ssize_t n = r->n;
    r->at = NULL;
    r->n = r->cap = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(at[i].key);
        Py_DECREF(at[i].ns);
        Py_XDECREF(at[i].state);
    }
    PyMem_Free(at);
}

/* One directory: its address (the table's identity), geometry and chunks;
 * a live table's with each chunk's marks (rule M, invariant 14) too. */
typedef struct DirFacts {
    int present;
    uintptr_t address;
    Py_ssize_t capacity, slots, ndir;
    const Chunk **chunks;           /* ndir pointers (NULL: never allocated) */
    Py_ssize_t *refs;               /* their counts when read */
    int32_t *marks_since;           /* with marks: ndir of them (0 where no chunk) */
    uint64_t *marks;                /* with marks: MARK_WORDS words per chunk */
} DirFacts;

static int gather_dir(const Table *t, DirFacts *d, int with_marks)
{
    memset(d, 0, sizeof(*d));
    if (t->dir == NULL)
        return 0;
    d->present = 1;
    d->address = (uintptr_t)t->dir;
    d->capacity = t->capacity;
    d->slots = chunk_slots(t);
    d->ndir = t->ndir;
    size_t n = (size_t)(t->ndir ? t->ndir : 1);
    d->chunks = PyMem_Malloc(n * sizeof(Chunk *));
    d->refs = PyMem_Malloc(n * sizeof(Py_ssize_t));
    if (with_marks) {
        d->marks_since = PyMem_Calloc(n, sizeof(int32_t));
        d->marks = PyMem_Calloc(n * MARK_WORDS, sizeof(uint64_t));
    }
    if (d->chunks == NULL || d->refs == NULL
        || (with_marks && (d->marks_since == NULL || d->marks == NULL))) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < t->ndir; i++) {
        const Chunk *c = t->dir[i];
        d->chunks[i] = c;
        d->refs[i] = c == NULL ? 0 : c->refs;
        if (with_marks && c != NULL) {
            d->marks_since[i] = c->marks_since;
            memcpy(&d->marks[i * MARK_WORDS], c->marks, sizeof c->marks);
        }
    }
    return 0;
}

/* Bit `slot` of chunk i's marks as gathered. */
static inline int dir_marked(const DirFacts *d, Py_ssize_t i, Py_ssize_t slot)
{
    return (int)((d->marks[i * MARK_WORDS + (slot >> 6)] >> (slot & 63)) & 1);
}

static void dir_clear(DirFacts *d)
{
    PyMem_Free((void *)d->chunks);
    PyMem_Free(d->refs);
    PyMem_Free(d->marks_since);
    PyMem_Free(d->marks);
    memset(d, 0, sizeof(*d));
}

/* Append the chains of buckets [begin, end) of `t` (slots numbered from
 * `slot`), head first, while `*budget` lasts; 1 when it ran out (more entries
 * than the budget: a cycle, or counters that lie), 0, or -1. */
static int gather_chains(const Table *t, Py_ssize_t begin, Py_ssize_t end, Py_ssize_t slot,
                         Recs *out, Py_ssize_t *budget)
{
    for (Py_ssize_t b = begin; b < end; b++, slot++) {
        for (const Entry *e = slot_get(t, b); e != NULL; e = e->next) {
            if (*budget <= 0)
                return 1;
            (*budget)--;
            if (recs_push(out, e, slot) < 0)
                return -1;
        }
    }
    return 0;
}

/* Everything the checker and the export read of a map. */
typedef struct MapFacts {
    DirFacts dir[2];                /* primary, rehash */
    Recs live[2];
    int cut[2];                     /* the walk of that table stopped at the budget */
    Py_ssize_t rehash_index, primary_size, rehash_size, threshold, gc_entries;
    int32_t version, highest;
    int32_t *open;
    Py_ssize_t nopen;
    uint64_t mod_count, structure_count;
    Py_ssize_t nbatches, nretired;
    int32_t *batch_version;         /* per batch, oldest first */
    Py_ssize_t *batch_end;          /* per batch: one past its last index in `retired` */
    const Entry **retired;
    Py_ssize_t ngarbage;
    const Entry **garbage;          /* handed back, not freed yet (rule G) */
    int32_t guard, tracking_since;  /* change tracking (rules T and D, inv. 13) */
    Py_ssize_t removal_limit, nremovals;
    Removal *removals;              /* copies holding new references */
    /* rule P (inv. 15): the spare list as walked (at most nspare + 1 chunks) */
    Py_ssize_t nspare, nspares_walked;
    const Chunk **spares;
    Py_ssize_t *spare_refs;
} MapFacts;

static void map_facts_clear(MapFacts *f)
{
    for (int k = 0; k < 2; k++) {
        dir_clear(&f->dir[k]);
        recs_clear(&f->live[k]);
    }
    PyMem_Free(f->open);
    PyMem_Free(f->batch_version);
    PyMem_Free(f->batch_end);
    PyMem_Free((void *)f->retired);
    PyMem_Free((void *)f->garbage);
    PyMem_Free((void *)f->spares);
    PyMem_Free(f->spare_refs);
    Removal *removals = f->removals;
    Py_ssize_t nremovals = f->nremovals;
    memset(f, 0, sizeof(*f));
    for (Py_ssize_t i = 0; i < nremovals; i++) {      /* last: decrefs may run code */
        Py_DECREF(removals[i].key);
        Py_DECREF(removals[i].ns);
    }
    PyMem_Free(removals);
}

/* Each live table's walk stops after len(map) + 2 entries: the reference's
 * cycle guard raises at len(map) + 2, so the judge sees what it needs. */
static int gather_map(const MapObject *m, MapFacts *f)
{
    memset(f, 0, sizeof(*f));
    f->rehash_index = m->rehash_index;
    f->primary_size = m->primary_size;
    f->rehash_size = m->rehash_size;
    f->threshold = m->threshold;
    f->gc_entries = m->gc_entries;
    f->version = m->version;
    f->highest = m->highest;
    f->mod_count = m->mod_count;
    f->structure_count = m->structure_count;
    f->nopen = m->nopen;
    f->open = PyMem_Malloc((size_t)(m->nopen ? m->nopen : 1) * sizeof(int32_t));
    if (f->open == NULL)
        goto nomemory;
    f->guard = m->guard;
    f->tracking_since = m->tracking_since;
    f->removal_limit = m->removal_limit;
    f->removals = PyMem_Malloc((size_t)(m->nremovals + 1) * sizeof(Removal));
    if (f->removals == NULL)
        goto nomemory;
    for (Py_ssize_t i = 0; i < m->nremovals; i++) {   /* new references: no code runs */
        f->removals[i] = m->removals[i];
        Py_INCREF(f->removals[i].key);
        Py_INCREF(f->removals[i].ns);
    }
    f->nremovals = m->nremovals;
    if (m->nopen > 0)
        memcpy(f->open, m->open, (size_t)m->nopen * sizeof(int32_t));
    const Table *tables[2] = {&m->primary, &m->rehash};
    Py_ssize_t total = m->primary_size + m->rehash_size;
    for (int k = 0; k < 2; k++) {
        if (gather_dir(tables[k], &f->dir[k], 1) < 0)
            goto fail;
        if (!f->dir[k].present)
            continue;
        Py_ssize_t budget = (total > 0 ? total : 0) + 2;
        int rc = gather_chains(tables[k], 0, tables[k]->capacity, 0, &f->live[k], &budget);
        if (rc < 0)
            goto fail;
        f->cut[k] = rc;
    }
    for (const Batch *b = m->retired; b != NULL; b = b->next) {
        f->nbatches++;
        f->nretired += b->size;
    }
    f->batch_version = PyMem_Malloc((size_t)(f->nbatches + 1) * sizeof(int32_t));
    f->batch_end = PyMem_Malloc((size_t)(f->nbatches + 1) * sizeof(Py_ssize_t));
    f->retired = PyMem_Malloc((size_t)(f->nretired + 1) * sizeof(Entry *));
    if (f->batch_version == NULL || f->batch_end == NULL || f->retired == NULL)
        goto nomemory;
    Py_ssize_t i = 0, n = 0;
    for (const Batch *b = m->retired; b != NULL; b = b->next, i++) {
        if (b->size > 0)
            memcpy((void *)&f->retired[n], b->entries, (size_t)b->size * sizeof(Entry *));
        n += b->size;
        f->batch_version[i] = b->version;
        f->batch_end[i] = n;
    }
    Py_ssize_t skip = m->garbage_next;
    for (const Batch *b = m->garbage; b != NULL; b = b->next, skip = 0)
        f->ngarbage += b->size - skip;
    f->garbage = PyMem_Malloc((size_t)(f->ngarbage + 1) * sizeof(Entry *));
    if (f->garbage == NULL)
        goto nomemory;
    n = 0;
    skip = m->garbage_next;
    for (const Batch *b = m->garbage; b != NULL; b = b->next, skip = 0)
        for (Py_ssize_t j = skip; j < b->size; j++)
            f->garbage[n++] = b->entries[j];
    /* rule P: walk at most nspare + 1 spares (a longer list shows as one too many) */
    f->nspare = m->nspare;
    Py_ssize_t cap = (m->nspare > 0 ? m->nspare : 0) + 1;
    f->spares = PyMem_Malloc((size_t)cap * sizeof(Chunk *));
    f->spare_refs = PyMem_Malloc((size_t)cap * sizeof(Py_ssize_t));
    if (f->spares == NULL || f->spare_refs == NULL)
        goto nomemory;
    for (const Chunk *c = m->spare; c != NULL && f->nspares_walked < cap;) {
        f->spares[f->nspares_walked] = c;
        f->spare_refs[f->nspares_walked++] = c->refs;
        Chunk *next;
        memcpy(&next, &c->slots[0], sizeof next);       /* the link (rule P of _cmap.c) */
        c = next;
    }
    return 0;
nomemory:
    PyErr_NoMemory();
fail:
    map_facts_clear(f);
    return -1;
}

/* Everything read of a snapshot: its compact layout (primary[r:L],
 * rehash[0:r], rehash[L:L+r]; primary[0:L] outside a rehash) and its chains. */
typedef struct SnapFacts {
    int released;                   /* released (or cleared): nothing else was read */
    int32_t version;
    Py_ssize_t size, r, nslots;
    DirFacts dir[2];
    const Entry **heads;            /* nslots */
    Recs recs;
    int cut;
} SnapFacts;

static void snap_facts_clear(SnapFacts *f)
{
    dir_clear(&f->dir[0]);
    dir_clear(&f->dir[1]);
    PyMem_Free((void *)f->heads);
    recs_clear(&f->recs);
    memset(f, 0, sizeof(*f));
}

/* The compact layout of tables (primary, rehash, r) as three bucket ranges. */
typedef struct Layout {
    const Table *table[3];
    Py_ssize_t begin[3], end[3];
    int parts;
    Py_ssize_t nslots;
} Layout;

static Layout compact_layout(const Table *primary, const Table *rehash, Py_ssize_t r)
{
    Layout l;
    Py_ssize_t L = primary->capacity;
    if (rehash->dir == NULL) {
        l.table[0] = primary, l.begin[0] = 0, l.end[0] = L;
        l.parts = 1;
        l.nslots = L;
    }
    else {
        l.table[0] = primary, l.begin[0] = r, l.end[0] = L;
        l.table[1] = rehash, l.begin[1] = 0, l.end[1] = r;
        l.table[2] = rehash, l.begin[2] = L, l.end[2] = L + r;
        l.parts = 3;
        l.nslots = L + r;
    }
    return l;
}

static const Entry **layout_heads(const Layout *l)
{
    const Entry **heads = PyMem_Malloc((size_t)(l->nslots ? l->nslots : 1) * sizeof(Entry *));
    if (heads == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    Py_ssize_t i = 0;
    for (int k = 0; k < l->parts; k++)
        for (Py_ssize_t b = l->begin[k]; b < l->end[k]; b++)
            heads[i++] = slot_get(l->table[k], b);
    return heads;
}

/* A snapshot reaches at most its owner's live and retired entries and its own
 * size: a walk past that is a cycle, and stops. */
static int gather_snap(const SnapObject *s, SnapFacts *f)
{
    memset(f, 0, sizeof(*f));
    f->version = s->version;
    f->size = s->size;
    if (s->released || s->primary.dir == NULL || s->owner == NULL) {
        f->released = 1;
        return 0;
    }
    f->r = s->rehash.dir != NULL ? s->r : 0;
    if (gather_dir(&s->primary, &f->dir[0], 0) < 0 || gather_dir(&s->rehash, &f->dir[1], 0) < 0)
        goto fail;
    Layout l = compact_layout(&s->primary, &s->rehash, s->r);
    f->nslots = l.nslots;
    f->heads = layout_heads(&l);
    if (f->heads == NULL)
        goto fail;
    const MapObject *m = s->owner;
    Py_ssize_t budget = s->size + m->primary_size + m->rehash_size + 2;
    for (const Batch *b = m->retired; b != NULL; b = b->next)
        budget += b->size;
    Py_ssize_t slot = 0;
    for (int k = 0; k < l.parts && !f->cut; k++) {
        int rc = gather_chains(l.table[k], l.begin[k], l.end[k], slot, &f->recs, &budget);
        if (rc < 0)
            goto fail;
        f->cut = rc;
        slot += l.end[k] - l.begin[k];
    }
    return 0;
fail:
    snap_facts_clear(f);
    return -1;
}

/* ====================================================== phase 2: the export */

static PyObject *rec_tuple(const Rec *x)
{
    /* (address, key, namespace, state, hash, next address, entry_version,
     *  state_version) */
    return Py_BuildValue("(KOOOKKii)", (unsigned long long)(uintptr_t)x->entry, x->key, x->ns,
                         x->state != NULL ? x->state : Py_None, (unsigned long long)x->hash,
                         (unsigned long long)(uintptr_t)x->next, (int)x->entry_version,
                         (int)x->state_version);
}

/* A list with, per slot of [0, nslots), a tuple of its entries' records (head
 * first); recs are in slot order. */
static PyObject *export_chains(const Recs *recs, Py_ssize_t nslots)
{
    PyObject *out = PyList_New(nslots);
    if (out == NULL)
        return NULL;
    Py_ssize_t i = 0;
    for (Py_ssize_t slot = 0; slot < nslots; slot++) {
        Py_ssize_t j = i;
        while (j < recs->n && recs->at[j].slot == slot)
            j++;
        PyObject *chain = PyTuple_New(j - i);
        if (chain == NULL)
            goto fail;
        PyList_SET_ITEM(out, slot, chain);
        for (Py_ssize_t k = i; k < j; k++) {
            PyObject *t = rec_tuple(&recs->at[k]);
            if (t == NULL)
                goto fail;
            PyTuple_SET_ITEM(chain, k - i, t);
        }
        i = j;
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

static PyObject *export_directory(const DirFacts *d)
{
    /* (directory address, capacity, buckets per chunk, ((chunk address or 0, refs), ...)) */
    if (!d->present)
        Py_RETURN_NONE;
    PyObject *chunks = PyTuple_New(d->ndir);
    if (chunks == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < d->ndir; i++) {
        PyObject *rec = Py_BuildValue("(Kn)", (unsigned long long)(uintptr_t)d->chunks[i],
                                      d->refs[i]);
        if (rec == NULL) {
            Py_DECREF(chunks);
            return NULL;
        }
        PyTuple_SET_ITEM(chunks, i, rec);
    }
    return Py_BuildValue("(KnnN)", (unsigned long long)d->address, d->capacity, d->slots,
                         chunks);
}

static PyObject *export_table(const DirFacts *d, const Recs *recs)
{
    if (!d->present)
        Py_RETURN_NONE;
    PyObject *dir = export_directory(d);
    PyObject *chains = dir == NULL ? NULL : export_chains(recs, d->capacity);
    if (chains == NULL) {
        Py_XDECREF(dir);
        return NULL;
    }
    return Py_BuildValue("(NN)", dir, chains);
}

/* A live table's marks (rule M): per chunk None (never allocated) or
 * (marks_since, (the indexes of its set bits, ascending)), every bit of the
 * MARK_WORDS words, those beyond the chunk's buckets too. */
static PyObject *export_marks(const DirFacts *d)
{
    if (!d->present)
        Py_RETURN_NONE;
    PyObject *out = PyTuple_New(d->ndir);
    for (Py_ssize_t i = 0; out != NULL && i < d->ndir; i++) {
        PyObject *chunk;
        if (d->chunks[i] == NULL)
            chunk = Py_NewRef(Py_None);
        else {
            PyObject *bits = PyList_New(0);
            for (Py_ssize_t j = 0; bits != NULL && j < MARK_WORDS * 64; j++) {
                if (!dir_marked(d, i, j))
                    continue;
                PyObject *index = PyLong_FromSsize_t(j);
                if (index == NULL || PyList_Append(bits, index) < 0)
                    Py_CLEAR(bits);
                Py_XDECREF(index);
            }
            PyObject *indexes = bits == NULL ? NULL : PyList_AsTuple(bits);
            Py_XDECREF(bits);
            chunk = indexes == NULL ? NULL
                : Py_BuildValue("(iN)", (int)d->marks_since[i], indexes);
        }
        if (chunk == NULL)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, i, chunk);
    }
    return out;
}

static PyObject *int32_tuple(const int32_t *values, Py_ssize_t n)
{
    PyObject *out = PyTuple_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *v = PyLong_FromLong(values[i]);
        if (v == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyTuple_SET_ITEM(out, i, v);
    }
    return out;
}

static PyObject *export_batches(const MapFacts *f)
{
    /* [(version, (entry addresses, ...)), ...], oldest first */
    PyObject *out = PyList_New(f->nbatches);
    if (out == NULL)
        return NULL;
    Py_ssize_t start = 0;
    for (Py_ssize_t i = 0; i < f->nbatches; i++) {
        Py_ssize_t end = f->batch_end[i];
        PyObject *addresses = PyTuple_New(end - start);
        if (addresses == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        for (Py_ssize_t j = start; j < end; j++) {
            uintptr_t address = (uintptr_t)f->retired[j];
            PyObject *a = PyLong_FromUnsignedLongLong((unsigned long long)address);
            if (a == NULL) {
                Py_DECREF(addresses);
                Py_DECREF(out);
                return NULL;
            }
            PyTuple_SET_ITEM(addresses, j - start, a);
        }
        PyObject *batch = Py_BuildValue("(iN)", (int)f->batch_version[i], addresses);
        if (batch == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, batch);
        start = end;
    }
    return out;
}

static PyObject *probe_structure(PyObject *self, PyObject *obj)
{
    MapObject *m = as_map(obj);
    MapFacts f;
    if (m == NULL || gather_map(m, &f) < 0)
        return NULL;
    PyObject *primary = export_table(&f.dir[0], &f.live[0]);
    PyObject *rehash = primary == NULL ? NULL : export_table(&f.dir[1], &f.live[1]);
    PyObject *open = rehash == NULL ? NULL : int32_tuple(f.open, f.nopen);
    PyObject *retired = open == NULL ? NULL : export_batches(&f);
    PyObject *garbage = retired == NULL ? NULL : PyTuple_New(f.ngarbage);
    for (Py_ssize_t j = 0; garbage != NULL && j < f.ngarbage; j++) {
        PyObject *a = PyLong_FromUnsignedLongLong((unsigned long long)(uintptr_t)f.garbage[j]);
        if (a == NULL)
            Py_CLEAR(garbage);
        else
            PyTuple_SET_ITEM(garbage, j, a);
    }
    /* the removal log as (version, key, ns) records, None while not tracking */
    PyObject *removals = garbage == NULL ? NULL
        : f.removal_limit == 0 ? Py_NewRef(Py_None) : PyList_New(f.nremovals);
    for (Py_ssize_t j = 0; removals != NULL && removals != Py_None && j < f.nremovals; j++) {
        PyObject *record = Py_BuildValue("(iOO)", (int)f.removals[j].version,
                                         f.removals[j].key, f.removals[j].ns);
        if (record == NULL)
            Py_CLEAR(removals);
        else
            PyList_SET_ITEM(removals, j, record);
    }
    PyObject *primary_marks = removals == NULL ? NULL : export_marks(&f.dir[0]); /* rule M */
    PyObject *rehash_marks = primary_marks == NULL ? NULL : export_marks(&f.dir[1]);
    /* rule P: the spares as walked, (address, refs) each */
    PyObject *spares = rehash_marks == NULL ? NULL : PyTuple_New(f.nspares_walked);
    for (Py_ssize_t j = 0; spares != NULL && j < f.nspares_walked; j++) {
        PyObject *pair = Py_BuildValue("(Kn)", (unsigned long long)(uintptr_t)f.spares[j],
                                       f.spare_refs[j]);
        if (pair == NULL)
            Py_CLEAR(spares);
        else
            PyTuple_SET_ITEM(spares, j, pair);
    }
    PyObject *out = NULL;
    if (spares != NULL)                 /* each above only if the one before it was made */
        out = Py_BuildValue(
            "{s:n,s:O,s:O,s:O,s:O,s:n,s:n,s:n,s:n,s:i,s:i,s:O,s:K,s:K,s:n,s:O,s:O,"
            "s:i,s:i,s:n,s:O,s:O,s:O,s:n,s:O}",
            "gc_entries", f.gc_entries, "retired", retired, "garbage", garbage, "primary",
            primary, "rehash", rehash,
            "rehash_index", f.rehash_index, "primary_size", f.primary_size, "rehash_size",
            f.rehash_size, "threshold", f.threshold, "version", (int)f.version,
            "highest_required", (int)f.highest, "open_versions", open, "mod_count",
            (unsigned long long)f.mod_count, "structure_count",
            (unsigned long long)f.structure_count, "chunk_buckets",
            (Py_ssize_t)1 << CHUNK_BITS_MAX, "primary_cut", f.cut[0] ? Py_True : Py_False,
            "rehash_cut", f.cut[1] ? Py_True : Py_False, "guard", (int)f.guard,
            "tracking_since", (int)f.tracking_since, "removal_limit", f.removal_limit,
            "removals", removals, "primary_marks", primary_marks, "rehash_marks",
            rehash_marks, "nspare", f.nspare, "spares", spares);
    Py_XDECREF(spares);
    Py_XDECREF(primary);                /* the dict holds its own references (O) */
    Py_XDECREF(rehash);
    Py_XDECREF(open);
    Py_XDECREF(retired);
    Py_XDECREF(garbage);
    Py_XDECREF(removals);
    Py_XDECREF(primary_marks);
    Py_XDECREF(rehash_marks);
    map_facts_clear(&f);
    return out;
}

static PyObject *probe_snapshot_structure(PyObject *self, PyObject *obj)
{
    SnapObject *s = as_snap(obj);
    SnapFacts f;
    if (s == NULL || gather_snap(s, &f) < 0)
        return NULL;
    if (f.released) {
        snap_facts_clear(&f);
        Py_RETURN_NONE;
    }
    PyObject *chains = export_chains(&f.recs, f.nslots);
    PyObject *primary = chains == NULL ? NULL : export_directory(&f.dir[0]);
    PyObject *rehash = primary == NULL ? NULL : export_directory(&f.dir[1]);
    PyObject *out = NULL;
    if (rehash != NULL)
        out = Py_BuildValue("{s:N,s:N,s:N,s:n,s:n,s:i,s:O}", "chains", chains, "primary",
                            primary, "rehash", rehash, "rehash_index", f.r, "size", f.size,
                            "version", (int)f.version, "cut", f.cut ? Py_True : Py_False);
    else {
        Py_XDECREF(chains);
        Py_XDECREF(primary);
    }
    snap_facts_clear(&f);
    return out;
}

/* (r, L) of a running rehash (its index and the old capacity), or None. */
static PyObject *probe_rehash_progress(PyObject *self, PyObject *obj)
{
    MapObject *m = as_map(obj);
    if (m == NULL)
        return NULL;
    if (m->rehash.dir == NULL)
        Py_RETURN_NONE;
    return Py_BuildValue("(nn)", m->rehash_index, m->primary.capacity);
}

/* (primary directory address, rehash directory address or 0, r, the chain
 * length of every primary bucket or None): what invariant 9's step check
 * compares before and after one keyed operation. */
static PyObject *probe_rehash_state(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "rehash_state(m, lengths) takes 2 arguments");
        return NULL;
    }
    MapObject *m = as_map(args[0]);
    int want = m == NULL ? -1 : PyObject_IsTrue(args[1]);
    if (want < 0)
        return NULL;
    uintptr_t primary = (uintptr_t)m->primary.dir, rehash = (uintptr_t)m->rehash.dir;
    Py_ssize_t r = m->rehash_index, L = m->primary.capacity;
    if (!want || rehash == 0)
        return Py_BuildValue("(KKnO)", (unsigned long long)primary,
                             (unsigned long long)rehash, r, Py_None);
    Py_ssize_t *lengths = PyMem_Malloc((size_t)L * sizeof(Py_ssize_t));
    if (lengths == NULL)
        return PyErr_NoMemory();
    for (Py_ssize_t b = 0; b < L; b++) {
        Py_ssize_t n = 0;
        for (const Entry *e = slot_get(&m->primary, b); e != NULL && n <= L + m->primary_size;
             e = e->next)
            n++;                                    /* bounded: a cycle stops, counted long */
        lengths[b] = n;
    }
    PyObject *out = PyTuple_New(L);
    for (Py_ssize_t b = 0; out != NULL && b < L; b++) {
        PyObject *n = PyLong_FromSsize_t(lengths[b]);
        if (n == NULL)
            Py_CLEAR(out);
        else
            PyTuple_SET_ITEM(out, b, n);
    }
    PyMem_Free(lengths);
    if (out == NULL)
        return NULL;
    return Py_BuildValue("(KKnN)", (unsigned long long)primary, (unsigned long long)rehash, r,
                         out);
}

/* ============================================================ address maps */

/* An open-addressing map from addresses (never 0) to a value: PyMem only, so
 * phase 1 may build one. */
typedef struct PtrMap {
    uintptr_t *keys;
    int64_t *values;
    Py_ssize_t n, cap;              /* cap: a power of two */
} PtrMap;

static inline size_t ptr_slot(uintptr_t key, Py_ssize_t cap)
{
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ULL;
    return (size_t)((h ^ (h >> 29)) & (uint64_t)(cap - 1));
}

static Py_ssize_t ptrmap_find(const PtrMap *map, uintptr_t key)
{
    size_t i = ptr_slot(key, map->cap);
    while (map->keys[i] != 0 && map->keys[i] != key)
        i = (i + 1) & (size_t)(map->cap - 1);
    return (Py_ssize_t)i;
}

static int ptrmap_grow(PtrMap *map)
{
    PtrMap bigger = {NULL, NULL, map->n, map->cap ? map->cap * 2 : 64};
    bigger.keys = PyMem_Calloc((size_t)bigger.cap, sizeof(uintptr_t));
    bigger.values = PyMem_Malloc((size_t)bigger.cap * sizeof(int64_t));
    if (bigger.keys == NULL || bigger.values == NULL) {
        PyMem_Free(bigger.keys);
        PyMem_Free(bigger.values);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < map->cap; i++) {
        if (map->keys[i] != 0) {
            Py_ssize_t j = ptrmap_find(&bigger, map->keys[i]);
            bigger.keys[j] = map->keys[i];
            bigger.values[j] = map->values[i];
        }
    }
    PyMem_Free(map->keys);
    PyMem_Free(map->values);
    *map = bigger;
    return 0;
}

/* Set key's value (or, with keep_first, only add it when absent); 1 if the
 * key was new, 0 if not, -1 out of memory. */
static int ptrmap_put(PtrMap *map, const void *key, int64_t value, int keep_first)
{
    if (2 * (map->n + 1) > map->cap && ptrmap_grow(map) < 0)
        return -1;
    Py_ssize_t i = ptrmap_find(map, (uintptr_t)key);
    int added = map->keys[i] == 0;
    if (added) {
        map->keys[i] = (uintptr_t)key;
        map->n++;
    }
    if (added || !keep_first)
        map->values[i] = value;
    return added;
}

/* 1 and *value if present, else 0. */
static int ptrmap_get(const PtrMap *map, const void *key, int64_t *value)
{
    if (map->cap == 0)
        return 0;
    Py_ssize_t i = ptrmap_find(map, (uintptr_t)key);
    if (map->keys[i] == 0)
        return 0;
    if (value != NULL)
        *value = map->values[i];
    return 1;
}

static void ptrmap_clear(PtrMap *map)
{
    PyMem_Free(map->keys);
    PyMem_Free(map->values);
    memset(map, 0, sizeof(*map));
}

/* ============================================================ fingerprints */

/* One entry a snapshot reached when it was fingerprinted. */
typedef struct FpRec {
    const Entry *entry, *next;      /* addresses: compared, never followed */
    PyObject *key, *ns, *state;     /* the fingerprint's references (state may be NULL) */
    PyObject *copy;                 /* a deep copy of the state, or NULL: identities only */
    int mutable_state;              /* not known immutable: invariant 7 watches it */
} FpRec;

typedef struct FingerprintObject {
    PyObject_HEAD
    PyObject *snapshot;             /* the snapshot (its exact type checked) */
    int32_t version;
    Py_ssize_t nslots, size;
    const Entry **heads;            /* its compact layout's heads, nslots of them */
    Py_ssize_t n;
    FpRec *recs;                    /* in layout order, each chain head first */
} FingerprintObject;

static PyTypeObject Fingerprint_Type;

static int Fingerprint_traverse(FingerprintObject *fp, visitproc visit, void *arg)
{
    Py_VISIT(fp->snapshot);
    for (Py_ssize_t i = 0; i < fp->n; i++) {
        Py_VISIT(fp->recs[i].key);
        Py_VISIT(fp->recs[i].ns);
        Py_VISIT(fp->recs[i].state);
        Py_VISIT(fp->recs[i].copy);
    }
    return 0;
}

static int Fingerprint_clear(FingerprintObject *fp)
{
    FpRec *recs = fp->recs;
    Py_ssize_t n = fp->n;
    fp->recs = NULL;
    fp->n = 0;
    PyMem_Free((void *)fp->heads);
    fp->heads = NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        Py_DECREF(recs[i].key);
        Py_DECREF(recs[i].ns);
        Py_XDECREF(recs[i].state);
        Py_XDECREF(recs[i].copy);
    }
    PyMem_Free(recs);
    Py_CLEAR(fp->snapshot);
    return 0;
}

static void Fingerprint_dealloc(FingerprintObject *fp)
{
    PyObject_GC_UnTrack(fp);
    Fingerprint_clear(fp);
    PyObject_GC_Del(fp);
}

static PyObject *Fingerprint_get_snapshot(FingerprintObject *fp, void *closure)
{
    return Py_NewRef(fp->snapshot != NULL ? fp->snapshot : Py_None);
}

static Py_ssize_t Fingerprint_length(FingerprintObject *fp) { return fp->n; }

static PyObject *Fingerprint_repr(FingerprintObject *fp)
{
    return PyUnicode_FromFormat("<Fingerprint of snapshot %d: %zd entries>", (int)fp->version,
                                fp->n);
}

static PyGetSetDef Fingerprint_getset[] = {
    {"snapshot", (getter)Fingerprint_get_snapshot, NULL, "The snapshot it records.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PySequenceMethods Fingerprint_as_sequence = {
    .sq_length = (lenfunc)Fingerprint_length,
};

static PyTypeObject Fingerprint_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cowstate_spec._cmap_probe.Fingerprint",
    .tp_doc = "What an open snapshot of a C map reached when it was taken (invariants 6-8).",
    .tp_basicsize = sizeof(FingerprintObject),
    .tp_dealloc = (destructor)Fingerprint_dealloc,
    .tp_repr = (reprfunc)Fingerprint_repr,
    .tp_as_sequence = &Fingerprint_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC,
    .tp_traverse = (traverseproc)Fingerprint_traverse,
    .tp_clear = (inquiry)Fingerprint_clear,
    .tp_getset = Fingerprint_getset,
};

/* "invariant N violated: <message>" */
static PyObject *violation(int invariant, const char *format, ...)
{
    va_list vargs;
    va_start(vargs, format);
    PyObject *message = PyUnicode_FromFormatV(format, vargs);
    va_end(vargs);
    if (message == NULL)
        return NULL;
    PyObject *out = PyUnicode_FromFormat("invariant %d violated: %U", invariant, message);
    Py_DECREF(message);
    return out;
}

static inline Py_ssize_t max_size(Py_ssize_t a, Py_ssize_t b) { return a > b ? a : b; }

/* fingerprint(snapshot, deep_copy, is_known_immutable): a Fingerprint, or
 * the message of invariant 8 when a snapshot taken at the map's current
 * version does not hold the map's buckets in the compact layout (what the
 * reference checks then). deep_copy None: identities only. */
static PyObject *probe_fingerprint(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError,
                        "fingerprint(snapshot, deep_copy, is_known_immutable) takes 3 arguments");
        return NULL;
    }
    SnapObject *s = as_snap(args[0]);
    PyObject *deep_copy = args[1] == Py_None ? NULL : args[1], *immutable = args[2];
    SnapFacts f;
    if (s == NULL || gather_snap(s, &f) < 0)
        return NULL;
    const Entry **map_heads = NULL;
    Py_ssize_t map_slots = 0, map_size = 0;
    int same_version = 0;
    PyObject *out = NULL;
    if (f.released) {
        PyErr_SetString(PyExc_AssertionError, "fingerprint of a released snapshot");
        goto done;
    }
    if (s->owner->version == s->version             /* nothing happened since snapshot() */
        && s->owner->primary.dir != NULL) {         /* (not a map cleared out of memory) */
        const MapObject *m = s->owner;
        Layout l = compact_layout(&m->primary, &m->rehash, m->rehash_index);
        map_heads = layout_heads(&l);
        if (map_heads == NULL)
            goto done;
        map_slots = l.nslots;
        map_size = m->primary_size + m->rehash_size;
        same_version = 1;
    }
    /* phase 2: nothing below follows a map pointer */
    if (same_version) {
        Py_ssize_t have = max_size(f.nslots, f.size), want = max_size(map_slots, map_size);
        int same = have == want;
        for (Py_ssize_t i = 0; same && i < have; i++) {
            const Entry *a = i < f.nslots ? f.heads[i] : NULL;
            const Entry *b = i < map_slots ? map_heads[i] : NULL;
            same = a == b;
        }
        if (!same) {
            out = violation(8, "snapshot %d does not hold the map's buckets in the compact "
                               "layout: %zd slots, expected %zd", (int)f.version, have, want);
            goto done;
        }
        if (f.size != map_size) {
            out = violation(8, "snapshot %d says size %zd, the map had %zd", (int)f.version,
                            f.size, map_size);
            goto done;
        }
    }
    FingerprintObject *fp = PyObject_GC_New(FingerprintObject, &Fingerprint_Type);
    if (fp == NULL)
        goto done;
    fp->snapshot = Py_NewRef((PyObject *)s);
    fp->version = f.version;
    fp->nslots = f.nslots;
    fp->size = f.size;
    fp->heads = f.heads;
    f.heads = NULL;
    fp->n = 0;
    fp->recs = PyMem_Malloc((size_t)(f.recs.n ? f.recs.n : 1) * sizeof(FpRec));
    if (fp->recs == NULL) {
        Py_DECREF(fp);
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < f.recs.n; i++) {     /* the gathered references move over */
        Rec *x = &f.recs.at[i];
        fp->recs[i] = (FpRec){x->entry, x->next, x->key, x->ns, x->state, NULL, 0};
    }
    fp->n = f.recs.n;
    f.recs.n = 0;
    PyObject_GC_Track(fp);
    for (Py_ssize_t i = 0; i < fp->n; i++) {        /* Python code: on our references only */
        FpRec *x = &fp->recs[i];
        PyObject *state = x->state != NULL ? x->state : Py_None;
        PyObject *answer = PyObject_CallOneArg(immutable, state);
        int known = answer == NULL ? -1 : PyObject_IsTrue(answer);
        Py_XDECREF(answer);
        if (known < 0 || (deep_copy != NULL
                          && (x->copy = PyObject_CallOneArg(deep_copy, state)) == NULL)) {
            Py_DECREF(fp);
            goto done;
        }
        x->mutable_state = !known;
    }
    out = (PyObject *)fp;
done:
    PyMem_Free((void *)map_heads);
    snap_facts_clear(&f);
    return out;
}

/* ================================================================ the check */

/* The (key, namespace) pairs judged so far (invariant 4): indices into the
 * live records, found by the model's composite hash, compared with == (as
 * the reference's set of tuples does: identity, then __eq__). */
typedef struct Seen {
    Py_ssize_t *slots;              /* -1: empty; else an index into `recs` */
    uint64_t *hashes;               /* per slot */
    Py_ssize_t n, cap;
} Seen;

static int seen_grow(Seen *seen)
{
    Py_ssize_t cap = seen->cap ? seen->cap * 2 : 64;
    Py_ssize_t *slots = PyMem_Malloc((size_t)cap * sizeof(Py_ssize_t));
    uint64_t *hashes = PyMem_Malloc((size_t)cap * sizeof(uint64_t));
    if (slots == NULL || hashes == NULL) {
        PyMem_Free(slots);
        PyMem_Free(hashes);
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < cap; i++)
        slots[i] = -1;
    for (Py_ssize_t i = 0; i < seen->cap; i++) {
        if (seen->slots[i] < 0)
            continue;
        size_t j = (size_t)(seen->hashes[i] & (uint64_t)(cap - 1));
        while (slots[j] >= 0)
            j = (j + 1) & (size_t)(cap - 1);
        slots[j] = seen->slots[i];
        hashes[j] = seen->hashes[i];
    }
    PyMem_Free(seen->slots);
    PyMem_Free(seen->hashes);
    seen->slots = slots;
    seen->hashes = hashes;
    seen->cap = cap;
    return 0;
}

/* Is (key, ns) of `x` among the pairs seen? 1, 0, or -1 with an error set
 * (an __eq__ raised). Python code may run: only our references are used. */
static int seen_contains(const Seen *seen, Rec *const *recs, uint64_t h, const Rec *x)
{
    if (seen->cap == 0)
        return 0;
    size_t j = (size_t)(h & (uint64_t)(seen->cap - 1));
    for (; seen->slots[j] >= 0; j = (j + 1) & (size_t)(seen->cap - 1)) {
        if (seen->hashes[j] != h)
            continue;
        const Rec *y = recs[seen->slots[j]];
        int eq = PyObject_RichCompareBool(y->key, x->key, Py_EQ);
        if (eq > 0)
            eq = PyObject_RichCompareBool(y->ns, x->ns, Py_EQ);
        if (eq != 0)
            return eq;
    }
    return 0;
}

static int seen_add(Seen *seen, uint64_t h, Py_ssize_t index)
{
    if (2 * (seen->n + 1) > seen->cap && seen_grow(seen) < 0)
        return -1;
    size_t j = (size_t)(h & (uint64_t)(seen->cap - 1));
    while (seen->slots[j] >= 0)
        j = (j + 1) & (size_t)(seen->cap - 1);
    seen->slots[j] = index;
    seen->hashes[j] = h;
    seen->n++;
    return 0;
}

static void seen_clear(Seen *seen)
{
    PyMem_Free(seen->slots);
    PyMem_Free(seen->hashes);
    memset(seen, 0, sizeof(*seen));
}

/* sorted(set(values)) as a list (the reference prints the open versions so). */
static PyObject *sorted_set(const int32_t *values, Py_ssize_t n)
{
    PyObject *t = int32_tuple(values, n);
    PyObject *s = t == NULL ? NULL : PyFrozenSet_New(t);
    Py_XDECREF(t);
    PyObject *list = s == NULL ? NULL : PySequence_List(s);
    Py_XDECREF(s);
    if (list != NULL && PyList_Sort(list) < 0)
        Py_CLEAR(list);
    return list;
}

static inline int holds_gc_object(const Rec *x)
{
    return PyType_IS_GC(Py_TYPE(x->key)) || PyType_IS_GC(Py_TYPE(x->ns))
        || (x->state != NULL && PyType_IS_GC(Py_TYPE(x->state)));
}

/* What one check judges: the map's facts and, per fingerprint, the snapshot
 * as it is now. */
typedef struct Check {
    MapFacts map;
    Py_ssize_t nfp;
    FingerprintObject **fps;        /* borrowed from the caller's sequence */
    SnapFacts *now;                 /* per fingerprint */
    PtrMap snapshot_entries, snapshot_states, live, retired_at, chunk_holds;
    const Chunk **chunk_order;      /* distinct chunks, first seen first */
    Py_ssize_t nchunks;
    Py_ssize_t *chunk_refs, *chunk_held;
    Seen seen;
    Rec **all;                      /* the live records of both tables, for `seen` */
} Check;

static void check_clear(Check *c)
{
    ptrmap_clear(&c->snapshot_entries);
    ptrmap_clear(&c->snapshot_states);
    ptrmap_clear(&c->live);
    ptrmap_clear(&c->retired_at);
    ptrmap_clear(&c->chunk_holds);
    PyMem_Free((void *)c->chunk_order);
    PyMem_Free(c->chunk_refs);
    PyMem_Free(c->chunk_held);
    seen_clear(&c->seen);
    PyMem_Free(c->all);
    if (c->now != NULL)
        for (Py_ssize_t i = 0; i < c->nfp; i++)
            snap_facts_clear(&c->now[i]);
    PyMem_Free(c->now);
    map_facts_clear(&c->map);               /* last: drops references, may run code */
}

/* Invariants 1-7 of the live entry c->all[at] in bucket `index` (the order of
 * the reference's _diagnose_entry), then record its pair for invariant 4.
 * None when they hold, the message of the first that does not, NULL on error. */
static PyObject *judge_entry(Check *c, Py_ssize_t at, Py_ssize_t index, int rehash_table)
{
    const Rec *x = c->all[at];
    const MapFacts *f = &c->map;
    const char *name = rehash_table ? "rehash" : "primary";
    Py_ssize_t length = f->dir[rehash_table].capacity, capacity = f->dir[0].capacity;
    Py_ssize_t r = f->rehash_index;
    Py_hash_t hk = PyObject_Hash(x->key);
    Py_hash_t hn = hk == -1 ? -1 : PyObject_Hash(x->ns);
    if (hn == -1)
        return NULL;
    uint64_t expected = model_composite_hash(hk, hn);
    PyObject *state = x->state != NULL ? x->state : Py_None;
#define WHERE "entry (%R, %R) in %s bucket %zd"
#define AT x->key, x->ns, name, index
    if (x->hash != expected)
        return violation(1, WHERE " caches hash %llu, expected %llu", AT,
                         (unsigned long long)x->hash, (unsigned long long)expected);
    if ((Py_ssize_t)(x->hash & (uint64_t)(length - 1)) != index)
        return violation(1, WHERE " belongs in bucket %zd", AT,
                         (Py_ssize_t)(x->hash & (uint64_t)(length - 1)));
    if (rehash_table && (Py_ssize_t)(x->hash & (uint64_t)(capacity - 1)) >= r)
        return violation(2, WHERE ": its primary bucket %zd >= rehash index %zd, so it must "
                            "still be in the primary table", AT,
                         (Py_ssize_t)(x->hash & (uint64_t)(capacity - 1)), r);
    int twice = seen_contains(&c->seen, c->all, expected, x);
    if (twice < 0)
        return NULL;
    if (twice)
        return violation(4, WHERE " is reachable twice", AT);
    if (x->state == NULL)
        return violation(3, WHERE " has state None", AT);
    if (x->entry_version > f->version || x->state_version > f->version)
        return violation(5, WHERE " has versions (%d, %d) above the map version %d", AT,
                         (int)x->entry_version, (int)x->state_version, (int)f->version);
    if (x->entry_version >= f->highest && ptrmap_get(&c->snapshot_entries, x->entry, NULL))
        return violation(6, WHERE " has entry version %d >= %d but an open snapshot reaches it",
                         AT, (int)x->entry_version, (int)f->highest);
    if (x->state_version >= f->highest && ptrmap_get(&c->snapshot_states, state, NULL))
        return violation(7, WHERE " has state version %d >= %d but an open snapshot reaches "
                            "its state", AT, (int)x->state_version, (int)f->highest);
#undef WHERE
#undef AT
    if (seen_add(&c->seen, expected, at) < 0)
        return NULL;
    return Py_NewRef(Py_None);
}

/* Invariant 13 (rules T and D): the guard and the removal log, the
 * reference's _check_tracking. */
static PyObject *judge_tracking(const MapFacts *f)
{
    if (f->removal_limit == 0) {
        if (f->guard != f->highest)
            return violation(13, "guard %d != H while not tracking", (int)f->guard);
        return Py_NewRef(Py_None);
    }
    long long version = f->version, since = f->tracking_since;
    if (f->guard != f->version)
        return violation(13, "guard %d != V = %d while tracking", (int)f->guard,
                         (int)f->version);
    if (since > version + 1)
        return violation(13, "tracking since %lld > V + 1 = %lld", since, version + 1);
    if (f->nremovals > f->removal_limit)
        return violation(13, "removal log of %zd records above its limit %zd", f->nremovals,
                         f->removal_limit);
    int ordered = 1, inside = 1;
    for (Py_ssize_t i = 0; i < f->nremovals; i++) {
        long long at = f->removals[i].version;
        ordered &= i == 0 || f->removals[i - 1].version <= at;
        inside &= since - 1 <= at && at <= version;
    }
    if (ordered && inside)
        return Py_NewRef(Py_None);
    PyObject *at = PyList_New(f->nremovals);
    for (Py_ssize_t i = 0; at != NULL && i < f->nremovals; i++) {
        PyObject *v = PyLong_FromLong(f->removals[i].version);
        if (v == NULL)
            Py_CLEAR(at);
        else
            PyList_SET_ITEM(at, i, v);
    }
    if (at == NULL)
        return NULL;
    PyObject *out = !ordered
        ? violation(13, "removal log versions %R out of order", at)
        : violation(13, "removal log versions %R outside [%lld, %lld]", at, since - 1, version);
    Py_DECREF(at);
    return out;
}

/* Invariants 9, 2 and 5 of the map's scalars (the reference's first checks). */
static PyObject *judge_scalars(const MapFacts *f)
{
    Py_ssize_t capacity = f->dir[0].capacity, r = f->rehash_index;
    Py_ssize_t size = f->primary_size + f->rehash_size;
    if (!(MODEL_MINIMUM_CAPACITY <= capacity && capacity <= MODEL_MAXIMUM_CAPACITY
          && (capacity & (capacity - 1)) == 0))
        return violation(9, "primary capacity %zd is not a power of two in [4, 2**30]",
                         capacity);
    if (!f->dir[1].present) {
        if (r != 0)
            return violation(2, "rehash index %zd while not rehashing", r);
        if (f->threshold != model_threshold_for(capacity))
            return violation(9, "threshold %zd != %zd for capacity %zd", f->threshold,
                             model_threshold_for(capacity), capacity);
        if (size > f->threshold + 1)
            return violation(9, "size %zd above threshold %zd + 1 outside a rehash", size,
                             f->threshold);
    }
    else {
        if (f->dir[1].capacity != 2 * capacity)
            return violation(9, "rehash table has %zd buckets, expected 2 * %zd",
                             f->dir[1].capacity, capacity);
        if (f->threshold != model_threshold_for(2 * capacity))
            return violation(9, "threshold %zd != %zd while rehashing", f->threshold,
                             model_threshold_for(2 * capacity));
        if (!(0 <= r && r < capacity))
            return violation(2, "rehash index %zd outside [0, %zd)", r, capacity);
    }
    int32_t highest = 0;                /* the model's highest_required_version */
    int in_range = 1;
    for (Py_ssize_t i = 0; i < f->nopen; i++) {
        if (f->open[i] > highest)
            highest = f->open[i];
        in_range &= 0 < f->open[i] && f->open[i] <= f->version;
    }
    if (f->highest != highest) {
        PyObject *open = sorted_set(f->open, f->nopen);
        if (open == NULL)
            return NULL;
        PyObject *out = violation(5, "highest required version %d != max of open %R",
                                  (int)f->highest, open);
        Py_DECREF(open);
        return out;
    }
    PyObject *tracking = judge_tracking(f);
    if (tracking != Py_None)
        return tracking;
    Py_DECREF(tracking);
    if (!in_range) {
        PyObject *open = sorted_set(f->open, f->nopen);
        if (open == NULL)
            return NULL;
        PyObject *out = violation(5, "open versions %R outside (0, %d]", open, (int)f->version);
        Py_DECREF(open);
        return out;
    }
    return Py_NewRef(Py_None);
}

/* Invariant 8 for one fingerprint: the snapshot as it is now against it. */
static PyObject *judge_fingerprint(const FingerprintObject *fp, const SnapFacts *now)
{
    if (now->released)
        return Py_NewRef(Py_None);
    int same = now->nslots == fp->nslots;
    for (Py_ssize_t i = 0; same && i < fp->nslots; i++)
        same = now->heads[i] == fp->heads[i];
    if (!same)
        return violation(8, "the bucket list of snapshot %d changed", (int)fp->version);
    /* Heads equal and each successor equal so far: now's i-th entry is the
     * recorded i-th one, so only pointers the snapshot reaches now are followed. */
    for (Py_ssize_t i = 0; i < fp->n; i++) {
        const FpRec *x = &fp->recs[i];
        const Rec *y = i < now->recs.n ? &now->recs.at[i] : NULL;
#define WHERE "snapshot %d: entry (%R, %R)"
#define AT (int)fp->version, x->key, x->ns
        if (y == NULL || y->entry != x->entry)      /* only after a cut walk */
            return violation(8, WHERE " now links to another successor", AT);
        if (y->key != x->key || y->ns != x->ns)
            return violation(8, WHERE " changed its key", AT);
        if (y->state != x->state)
            return violation(8, WHERE " now holds another state object %R", AT,
                             y->state != NULL ? y->state : Py_None);
        if (y->next != x->next)
            return violation(8, WHERE " now links to another successor", AT);
        if (x->copy != NULL) {
            PyObject *state = x->state != NULL ? x->state : Py_None;
            PyObject *eq = PyObject_RichCompare(state, x->copy, Py_EQ);  /* `==`: no identity */
            int equal = eq == NULL ? -1 : PyObject_IsTrue(eq);
            Py_XDECREF(eq);
            if (equal < 0)
                return NULL;
            if (!equal)
                return violation(8, WHERE ": its state was mutated in place to %R, was %R", AT,
                                 state, x->copy);
        }
#undef WHERE
#undef AT
    }
    return Py_NewRef(Py_None);
}

/* Count one directory's chunks for invariant 10, first seen first; a chunk's
 * count is the last directory's reading (they all agree: read in one phase). */
static int hold_chunks(Check *c, const DirFacts *d)
{
    for (Py_ssize_t i = 0; d->present && i < d->ndir; i++) {
        const Chunk *chunk = d->chunks[i];
        if (chunk == NULL)
            continue;
        int64_t at;
        if (!ptrmap_get(&c->chunk_holds, chunk, &at)) {
            Py_ssize_t n = c->nchunks + 1;
            const Chunk **order = PyMem_Realloc((void *)c->chunk_order,
                                                (size_t)n * sizeof(Chunk *));
            if (order != NULL)
                c->chunk_order = order;
            Py_ssize_t *refs = order == NULL ? NULL
                : PyMem_Realloc(c->chunk_refs, (size_t)n * sizeof(Py_ssize_t));
            if (refs != NULL)
                c->chunk_refs = refs;
            Py_ssize_t *held = refs == NULL ? NULL
                : PyMem_Realloc(c->chunk_held, (size_t)n * sizeof(Py_ssize_t));
            if (held == NULL) {
                PyErr_NoMemory();
                return -1;
            }
            c->chunk_held = held;
            at = c->nchunks++;
            c->chunk_order[at] = chunk;
            c->chunk_held[at] = 0;
            if (ptrmap_put(&c->chunk_holds, chunk, at, 0) < 0)
                return -1;
        }
        c->chunk_held[at]++;
        c->chunk_refs[at] = d->refs[i];
    }
    return 0;
}

/* Invariant 14 (rule M), the reference's check_marks: while tracking, per
 * live table (primary, rehash) and allocated chunk in directory order: its
 * marks_since <= V, no bit set beyond its buckets, then every entry of its
 * buckets (in bucket order, each chain head first) whose state_version >=
 * max(marks_since, tracking_since) has its bucket's bit set. */
static PyObject *judge_marks(const MapFacts *f)
{
    if (f->removal_limit == 0)                              /* not tracking: no claim */
        return Py_NewRef(Py_None);
    for (int k = 0; k < 2; k++) {
        const DirFacts *d = &f->dir[k];
        if (!d->present)
            continue;
        const char *name = k ? "rehash" : "primary";
        const Recs *recs = &f->live[k];
        Py_ssize_t at = 0;                                  /* recs are in bucket order */
        for (Py_ssize_t i = 0; i < d->ndir; i++) {
            if (d->chunks[i] == NULL)                       /* no chunk, no entry */
                continue;
            int32_t since = d->marks_since[i];
            if (since > f->version)
                return violation(14, "%s chunk %zd has marks since %d > V = %d", name, i,
                                 (int)since, (int)f->version);
            for (Py_ssize_t j = d->slots; j < MARK_WORDS * 64; j++)
                if (dir_marked(d, i, j))
                    return violation(14, "%s chunk %zd of %zd buckets marks bucket %zd of it",
                                     name, i, d->slots, j);
            int32_t bound = since > f->tracking_since ? since : f->tracking_since;
            Py_ssize_t first = i * d->slots, end = first + d->slots;
            while (at < recs->n && recs->at[at].slot < first)
                at++;
            for (; at < recs->n && recs->at[at].slot < end; at++) {
                const Rec *x = &recs->at[at];
                if (x->state_version >= bound && !dir_marked(d, i, x->slot - first))
                    return violation(14, "entry (%R, %R) in %s bucket %zd has state version "
                                         "%d >= %d but its chunk does not mark the bucket",
                                     x->key, x->ns, name, x->slot, (int)x->state_version,
                                     (int)bound);
            }
        }
    }
    return Py_NewRef(Py_None);
}

/* Invariant 15 (rule P), the reference's check_spares: the list walked holds
 * nspare chunks, no more than the live directories' slots; each has refs 0,
 * and no live directory holds one -- nor an open snapshot's, when every open
 * snapshot is known (`held`: the chunks judge_snapshot_chunks counted). */
static PyObject *judge_spares(Check *c, int all_known)
{
    const MapFacts *f = &c->map;
    if (f->nspares_walked != f->nspare)
        return violation(15, "the map counts %zd spare chunks, its list holds %s%zd", f->nspare,
                         f->nspares_walked > f->nspare ? "more than " : "",
                         f->nspares_walked > f->nspare ? f->nspare : f->nspares_walked);
    Py_ssize_t limit = 0;
    for (int k = 0; k < 2; k++)
        limit += f->dir[k].present ? f->dir[k].ndir : 0;
    if (f->nspare > limit)
        return violation(15, "the map keeps %zd spare chunks, its directories have %zd slots",
                         f->nspare, limit);
    for (Py_ssize_t j = 0; j < f->nspares_walked; j++) {
        const Chunk *spare = f->spares[j];
        if (f->spare_refs[j] != 0)
            return violation(15, "spare chunk %p counts %zd directories", (void *)spare,
                             f->spare_refs[j]);
        for (int k = 0; k < 2; k++)
            for (Py_ssize_t i = 0; f->dir[k].present && i < f->dir[k].ndir; i++)
                if (f->dir[k].chunks[i] == spare)
                    return violation(15, "spare chunk %p is chunk %zd of the live %s table",
                                     (void *)spare, i, k ? "rehash" : "primary");
        if (all_known && ptrmap_get(&c->chunk_holds, spare, NULL))
            return violation(15, "spare chunk %p is held by an open snapshot", (void *)spare);
    }
    return Py_NewRef(Py_None);
}

/* 10 and what each open snapshot reaches (11), every open snapshot known. */
static PyObject *judge_snapshot_chunks(Check *c)
{
    const MapFacts *f = &c->map;
    if (hold_chunks(c, &f->dir[0]) < 0 || hold_chunks(c, &f->dir[1]) < 0)
        return NULL;
    for (Py_ssize_t k = 0; k < c->nfp; k++)
        if (!c->now[k].released
            && (hold_chunks(c, &c->now[k].dir[0]) < 0 || hold_chunks(c, &c->now[k].dir[1]) < 0))
            return NULL;
    for (Py_ssize_t k = 0; k < c->nchunks; k++)
        if (c->chunk_refs[k] != c->chunk_held[k])
            return violation(10, "chunk %p counts %zd directories, %zd hold it",
                             (void *)c->chunk_order[k], c->chunk_refs[k], c->chunk_held[k]);
    for (Py_ssize_t k = 0; k < c->nfp; k++) {
        const SnapFacts *now = &c->now[k];
        if (now->released)
            continue;
        for (Py_ssize_t i = 0; i < now->recs.n; i++) {
            const Rec *x = &now->recs.at[i];
            int64_t at = -1;
            int retained = ptrmap_get(&c->retired_at, x->entry, &at);
            if (ptrmap_get(&c->live, x->entry, NULL) || (retained && at >= now->version))
                continue;
            if (retained)
                return violation(11, "snapshot %d reaches entry (%R, %R), which is neither "
                                     "live nor retained for it (batch %d)", (int)now->version,
                                 x->key, x->ns, (int)at);
            return violation(11, "snapshot %d reaches entry (%R, %R), which is neither live "
                                 "nor retained for it (batch None)", (int)now->version, x->key,
                             x->ns);
        }
    }
    return Py_NewRef(Py_None);
}

/* The whole judgement, in the reference's order. */
static PyObject *judge(Check *c)
{
    const MapFacts *f = &c->map;
    PyObject *verdict = judge_scalars(f);
    if (verdict != Py_None)
        return verdict;
    Py_DECREF(verdict);

    /* what the fingerprints reached: every entry, every state not known immutable */
    for (Py_ssize_t k = 0; k < c->nfp; k++) {
        const FingerprintObject *fp = c->fps[k];
        for (Py_ssize_t i = 0; i < fp->n; i++) {
            const FpRec *x = &fp->recs[i];
            if (ptrmap_put(&c->snapshot_entries, x->entry, 0, 1) < 0
                || (x->mutable_state
                    && ptrmap_put(&c->snapshot_states, x->state != NULL ? x->state : Py_None, 0,
                                  1) < 0))
                return NULL;
        }
    }

    /* each live entry, table by table, bucket by bucket */
    Py_ssize_t total = f->primary_size + f->rehash_size, nall = 0;
    c->all = PyMem_Malloc((size_t)(f->live[0].n + f->live[1].n + 1) * sizeof(Rec *));
    if (c->all == NULL)
        return PyErr_NoMemory();
    Py_ssize_t counts[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        if (!f->dir[k].present)
            continue;
        const char *name = k ? "rehash" : "primary";
        Py_ssize_t previous_slot = -1;
        for (Py_ssize_t i = 0; i < f->live[k].n; i++) {
            Rec *x = &f->live[k].at[i];
            if (k == 0 && f->dir[1].present && x->slot != previous_slot
                && x->slot < f->rehash_index)
                return violation(2, "primary bucket %zd < rehash index %zd is not empty",
                                 x->slot, f->rehash_index);
            previous_slot = x->slot;
            counts[k]++;
            if (counts[k] > total + 1)
                return violation(3, "%s table reaches more than len(map) = %zd entries (cycle?)",
                                 name, total);
            c->all[nall] = x;
            verdict = judge_entry(c, nall++, x->slot, k);
            if (verdict != Py_None)
                return verdict;
            Py_DECREF(verdict);
        }
    }
    if (counts[0] != f->primary_size)
        return violation(3, "primary table holds %zd entries, counter says %zd", counts[0],
                         f->primary_size);
    if (counts[1] != f->rehash_size)
        return violation(3, "rehash table holds %zd entries, counter says %zd", counts[1],
                         f->rehash_size);

    for (Py_ssize_t k = 0; k < c->nfp; k++) {
        verdict = judge_fingerprint(c->fps[k], &c->now[k]);
        if (verdict != Py_None)
            return verdict;
        Py_DECREF(verdict);
    }

    /* 12: the entries the collector must visit */
    Py_ssize_t holding_gc = 0;
    for (Py_ssize_t i = 0; i < nall; i++) {
        holding_gc += holds_gc_object(c->all[i]);
        if (ptrmap_put(&c->live, c->all[i]->entry, 0, 1) < 0)
            return NULL;
    }
    if (f->gc_entries != holding_gc)
        return violation(12, "the map counts %zd live entries holding an object of a GC type, "
                             "%zd do", f->gc_entries, holding_gc);

    /* 11: batches in order, none outliving the snapshots that could reach it,
     * none holding a live entry */
    for (Py_ssize_t i = 1; i < f->nbatches; i++) {
        if (f->batch_version[i] < f->batch_version[i - 1]) {
            PyObject *versions = PyList_New(f->nbatches);
            for (Py_ssize_t j = 0; versions != NULL && j < f->nbatches; j++) {
                PyObject *v = PyLong_FromLong(f->batch_version[j]);
                if (v == NULL)
                    Py_CLEAR(versions);
                else
                    PyList_SET_ITEM(versions, j, v);
            }
            if (versions == NULL)
                return NULL;
            verdict = violation(11, "batches out of order %R", versions);
            Py_DECREF(versions);
            return verdict;
        }
    }
    int32_t oldest = INT32_MAX;
    for (Py_ssize_t i = 0; i < f->nopen; i++)
        if (f->open[i] < oldest)
            oldest = f->open[i];
    Py_ssize_t start = 0;
    for (Py_ssize_t b = 0; b < f->nbatches; b++) {
        int32_t version = f->batch_version[b];
        if (f->nopen == 0)
            return violation(11, "batch %d outlives every snapshot that could reach it "
                                 "(oldest open: None)", (int)version);
        if (version < oldest)
            return violation(11, "batch %d outlives every snapshot that could reach it "
                                 "(oldest open: %d)", (int)version, (int)oldest);
        for (Py_ssize_t j = start; j < f->batch_end[b]; j++) {
            if (ptrmap_get(&c->live, f->retired[j], NULL))
                return violation(11, "entry %p is retired in batch %d but the live table "
                                     "reaches it", (void *)f->retired[j], (int)version);
            if (ptrmap_put(&c->retired_at, f->retired[j], version, 1) < 0)
                return NULL;
        }
        start = f->batch_end[b];
    }
    /* 11, rule G: a handed-back entry is neither live nor retired (an open
     * snapshot reaching one fails the check of the snapshots below) */
    for (Py_ssize_t j = 0; j < f->ngarbage; j++) {
        if (ptrmap_get(&c->live, f->garbage[j], NULL))
            return violation(11, "entry %p was handed back to the owner but the live table "
                                 "reaches it", (void *)f->garbage[j]);
        if (ptrmap_get(&c->retired_at, f->garbage[j], NULL))
            return violation(11, "entry %p was handed back to the owner and is retired too",
                             (void *)f->garbage[j]);
    }

    /* 10 and the rest of 11 only when every open snapshot has a fingerprint */
    Py_ssize_t open_known = 0;
    for (Py_ssize_t k = 0; k < c->nfp; k++)
        open_known += !c->now[k].released;
    if (open_known == f->nopen) {
        verdict = judge_snapshot_chunks(c);
        if (verdict != Py_None)
            return verdict;
        Py_DECREF(verdict);
    }
    verdict = judge_marks(f);                                /* 14 */
    if (verdict != Py_None)
        return verdict;
    Py_DECREF(verdict);
    return judge_spares(c, open_known == f->nopen);          /* 15, last */
}

/* check(m, fingerprints): None when every invariant holds, else the message
 * of the first that does not ("invariant N violated: ..."), in the order of
 * cowstate_spec.invariants.check_map. */
static PyObject *probe_check(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "check(m, fingerprints) takes 2 arguments");
        return NULL;
    }
    MapObject *m = as_map(args[0]);
    if (m == NULL)
        return NULL;
    PyObject *fps = PySequence_Fast(args[1], "expected a sequence of fingerprints");
    if (fps == NULL)
        return NULL;
    Check c;
    memset(&c, 0, sizeof(c));
    PyObject *out = NULL;
    c.nfp = PySequence_Fast_GET_SIZE(fps);
    c.fps = (FingerprintObject **)PySequence_Fast_ITEMS(fps);   /* `fps` holds them */
    for (Py_ssize_t k = 0; k < c.nfp; k++) {
        PyObject *fp = (PyObject *)c.fps[k];
        if (Py_TYPE(fp) != &Fingerprint_Type) {
            PyErr_Format(PyExc_TypeError, "expected fingerprints of this probe, got %.200s",
                         Py_TYPE(fp)->tp_name);
            Py_DECREF(fps);
            return NULL;
        }
    }
    c.now = PyMem_Calloc((size_t)(c.nfp ? c.nfp : 1), sizeof(SnapFacts));
    if (c.now == NULL) {
        Py_DECREF(fps);
        return PyErr_NoMemory();
    }
    /* phase 1: gather the map and each fingerprinted snapshot as they are now */
    if (gather_map(m, &c.map) < 0)
        goto done;
    for (Py_ssize_t k = 0; k < c.nfp; k++) {
        SnapObject *s = as_snap(c.fps[k]->snapshot);
        if (s == NULL || gather_snap(s, &c.now[k]) < 0)
            goto done;
    }
    /* phase 2 */
    out = judge(&c);
done:
    check_clear(&c);
    Py_DECREF(fps);
    return out;
}

/* ============================================================= corruptions */

typedef enum {
    K_HASH, K_STATE_VERSION, K_SHARED_ENTRY_VERSION, K_SHARED_STATE_VERSION, K_MOVE,
    K_DUPLICATE, K_RELINK, K_WRITE_SHARED, K_RETIRE_LIVE, K_UNRETIRE, K_HAND_BACK_LIVE,
    K_PRIMARY_SIZE,
    K_PRIMARY_SIZE_SHORT, K_GC_ENTRIES, K_HIGHEST_REQUIRED, K_THRESHOLD, K_REHASH_INDEX,
    K_CHUNK_REFS, K_GUARD, K_TRACKING_SINCE, K_REMOVAL_LIMIT, K_REMOVAL_VERSION,
    K_UNMARK, K_MARKS_SINCE, K_STRAY_MARK,
} Kind;

/* Each kind, the invariant it breaks, and what it does. `bucket` is a primary
 * bucket, `position` an entry of its chain (0: the head), `to` a bucket or a
 * value. */
static const struct {
    const char *name;
    Kind kind;
    int invariant;
} corrupt_kinds[] = {
    {"hash", K_HASH, 1},                            /* the cached hash, one bit flipped */
    {"move", K_MOVE, 1},                            /* the entry moved to bucket `to`'s head */
    {"rehash_index", K_REHASH_INDEX, 2},            /* r set to `to` */
    {"primary_size", K_PRIMARY_SIZE, 3},            /* the counter one above */
    {"primary_size_short", K_PRIMARY_SIZE_SHORT, 3},/* two below: the walk outruns len + 1 */
    {"duplicate", K_DUPLICATE, 4},                  /* its mapping again, at the head */
    {"state_version", K_STATE_VERSION, 5},          /* the state's version above the map's */
    {"highest_required", K_HIGHEST_REQUIRED, 5},    /* H set to `to` */
    {"shared_entry_version", K_SHARED_ENTRY_VERSION, 6},  /* a shared entry made current */
    {"shared_state_version", K_SHARED_STATE_VERSION, 7},  /* a shared state made current */
    {"write_shared", K_WRITE_SHARED, 8},            /* rule C broken: a shared head replaced */
    {"relink", K_RELINK, 8},                        /* the successor dropped (and uncounted) */
    {"threshold", K_THRESHOLD, 9},                  /* the threshold one above */
    {"chunk_refs", K_CHUNK_REFS, 10},               /* the bucket's chunk counts one more */
    {"retire_live", K_RETIRE_LIVE, 11},             /* a live entry in a batch too (the probe's) */
    {"unretire", K_UNRETIRE, 11},                   /* a retired entry taken out of its batch */
    {"hand_back_live", K_HAND_BACK_LIVE, 11},       /* a live entry in the garbage (rule G) */
    {"gc_entries", K_GC_ENTRIES, 12},               /* the GC count zeroed */
    {"guard", K_GUARD, 13},                         /* get's bound set to `to` */
    {"tracking_since", K_TRACKING_SINCE, 13},       /* moved to V + 2 */
    {"removal_limit", K_REMOVAL_LIMIT, 13},         /* one below the log's length */
    {"removal_version", K_REMOVAL_VERSION, 13},     /* record `position` out of order */
    {"unmark", K_UNMARK, 14},                       /* the bucket's bit cleared (it needs it) */
    {"marks_since", K_MARKS_SINCE, 14},             /* its chunk's marks_since moved to V + 1 */
    {"stray_mark", K_STRAY_MARK, 14},               /* bit `to` >= the chunk's buckets set */
};

#define NKINDS ((Py_ssize_t)(sizeof(corrupt_kinds) / sizeof(corrupt_kinds[0])))

typedef struct CorruptionObject {
    PyObject_HEAD
    MapObject *map;                 /* strong; not GC-tracked, so the map cannot be collected */
    Kind kind;
    Py_ssize_t index;               /* in corrupt_kinds */
    int active;
    uint64_t stamp, structure_count;    /* the map's, right after the corruption */
    Entry *entry;                   /* the entry changed in place */
    Entry *prev;                    /* move: its predecessor (NULL: it was the head) */
    Entry *held;                    /* taken out of the map: relink, write_shared, unretire */
    Entry *added;                   /* put into the map: duplicate, write_shared */
    Chunk *chunk;                   /* chunk_refs: the chunk counted; write_shared: written */
    Py_ssize_t bucket, to;
    Batch *batch;                   /* retire_live: the probe's batch; unretire: the source */
    int32_t batch_version;
    int64_t saved;
    const PyObject *record_key;     /* removal_version: the record's key, compared only */
    Py_ssize_t capacity;            /* the marks' kinds: the primary's capacity then */
} CorruptionObject;

static PyTypeObject Corruption_Type;

static Entry *probe_entry_copy(const Entry *e)
{
    Entry *d = PyMem_Malloc(sizeof(Entry));
    if (d == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    *d = *e;
    Py_INCREF(d->key);
    Py_INCREF(d->ns);
    Py_XINCREF(d->state);
    return d;
}

/* Free an entry the probe holds: the map's entry_free, said again. */
static void probe_entry_free(Entry *e)
{
    PyObject *key = e->key, *ns = e->ns, *state = e->state;
    PyMem_Free(e);
    Py_DECREF(key);
    Py_DECREF(ns);
    Py_XDECREF(state);
}

static Entry **slot_ref(Table *t, Py_ssize_t bucket)
{
    Chunk *c = t->dir[bucket >> t->bits];
    return c == NULL ? NULL : &c->slots[bucket & (chunk_slots(t) - 1)];
}

/* A batch of the map holding `b`, found by address and version, and the one
 * before it (NULL at the head). */
static int find_batch(MapObject *m, const Batch *b, int32_t version, Batch **before)
{
    Batch *p = NULL;
    for (Batch *x = m->retired; x != NULL; p = x, x = x->next) {
        if (x == b && x->version == version) {
            *before = p;
            return 1;
        }
    }
    return 0;
}

/* An entry a corruption took out of the map and cannot put back (the map
 * changed meanwhile) leaves it as the map's own entries do (_cmap.c's
 * leave_live, invariant 6): retired into the batch of the current version if
 * an open snapshot may reach it -- the map frees it with that batch -- else
 * returned for the caller to free as its last step. Out of memory, it is
 * leaked rather than freed: a snapshot may read it. */
static Entry *probe_leave_live(MapObject *m, Entry *e)
{
    if (e->entry_version >= m->highest)
        return e;
    Batch *b = m->retired_tail;
    if (b == NULL || b->version != m->version) {
        b = PyMem_Malloc(sizeof(Batch));
        if (b == NULL)
            return NULL;
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
            return NULL;
        b->entries = grown;
        b->capacity = capacity;
    }
    b->entries[b->size++] = e;
    return NULL;
}

/* A batch of the probe's holding only `e`, appended to the list at *head
 * (*tail its last); NULL when out of memory (nothing changed). */
static Batch *append_probe_batch(Batch **head, Batch **tail, int32_t version, Entry *e)
{
    Batch *b = PyMem_Malloc(sizeof(Batch));
    Entry **entries = b == NULL ? NULL : PyMem_Malloc(sizeof(Entry *));
    if (entries == NULL) {
        PyMem_Free(b);
        return NULL;
    }
    *b = (Batch){NULL, version, 1, 1, entries};
    entries[0] = e;
    if (*tail != NULL)
        (*tail)->next = b;
    else
        *head = b;
    *tail = b;
    return b;
}

/* Undo what can be undone (the design comment at the top). */
static void corruption_undo(CorruptionObject *c)
{
    if (!c->active)
        return;
    c->active = 0;
    MapObject *m = c->map;
    int unchanged = m->stamp == c->stamp && m->structure_count == c->structure_count;
    int left = 0;                   /* pointer-based damage left in place */
    Entry *to_free = NULL;
    switch (c->kind) {
    case K_HASH:
        if (unchanged)
            c->entry->hash = (uint64_t)c->saved;
        left = !unchanged;
        break;
    case K_STATE_VERSION:
    case K_SHARED_STATE_VERSION:
        if (unchanged)
            c->entry->state_version = (int32_t)c->saved;
        left = !unchanged;
        break;
    case K_SHARED_ENTRY_VERSION:
        if (unchanged)
            c->entry->entry_version = (int32_t)c->saved;
        left = !unchanged;
        break;
    case K_MOVE:
        if (unchanged) {
            Entry **to = slot_ref(&m->primary, c->to);
            *to = c->entry->next;
            Entry **link = c->prev != NULL ? &c->prev->next : slot_ref(&m->primary, c->bucket);
            c->entry->next = *link;
            *link = c->entry;
        }
        left = !unchanged;
        break;
    case K_DUPLICATE:
        if (unchanged) {
            *slot_ref(&m->primary, c->bucket) = c->added->next;
            m->primary_size--;
            to_free = c->added;
        }
        left = !unchanged;              /* else the map owns the duplicate */
        break;
    case K_RELINK:
        if (unchanged) {
            c->entry->next = c->held;
            m->primary_size++;
        }
        else                            /* the successor leaves as the map's entries do */
            to_free = probe_leave_live(m, c->held);
        c->held = NULL;
        left = !unchanged;
        break;
    case K_WRITE_SHARED:
        if (unchanged) {
            c->chunk->slots[c->bucket & (chunk_slots(&m->primary) - 1)] = c->held;
            to_free = c->added;
        }
        else                            /* the map owns the copy; the head leaves the map */
            to_free = probe_leave_live(m, c->held);
        c->held = NULL;
        left = !unchanged;
        break;
    case K_HAND_BACK_LIVE: {            /* the probe's batch, unless a write reclaimed it */
        Batch *before = NULL, *b = m->garbage;
        while (b != NULL && b != c->batch) {
            before = b;
            b = b->next;
        }
        if (b != NULL && (before != NULL || m->garbage_next == 0)) {
            if (before != NULL)
                before->next = b->next;
            else
                m->garbage = b->next;
            if (m->garbage_tail == b)
                m->garbage_tail = before;
            PyMem_Free(b->entries);
            PyMem_Free(b);
        }
        else
            left = 1;                   /* taken by the owner: the map owns it now */
        break;
    }
    case K_RETIRE_LIVE: {               /* always: the probe's batch owns no entry */
        Batch *before;
        if (find_batch(m, c->batch, c->batch_version, &before)) {
            if (before != NULL)
                before->next = c->batch->next;
            else
                m->retired = c->batch->next;
            if (m->retired_tail == c->batch)
                m->retired_tail = before;
        }
        PyMem_Free(c->batch->entries);
        PyMem_Free(c->batch);
        c->batch = NULL;
        break;
    }
    case K_UNRETIRE: {                  /* always: back into its batch, or freed with it */
        Batch *before, *b = c->batch;
        if (find_batch(m, b, c->batch_version, &before)) {
            if (b->size == b->capacity) {
                Entry **grown = PyMem_Realloc(b->entries,
                                              (size_t)(b->capacity + 1) * sizeof(Entry *));
                if (grown == NULL) {
                    left = 1;           /* out of memory: the entry stays held (leaked) */
                    break;
                }
                b->entries = grown;
                b->capacity++;
            }
            b->entries[b->size++] = c->held;
        }
        else
            to_free = c->held;          /* its batch was freed: no open snapshot reaches it */
        c->held = NULL;
        break;
    }
    case K_PRIMARY_SIZE:
    case K_PRIMARY_SIZE_SHORT:
    case K_THRESHOLD:
    case K_GC_ENTRIES:
        if (c->kind == K_THRESHOLD)
            m->threshold -= (Py_ssize_t)c->saved;
        else if (c->kind == K_GC_ENTRIES)
            m->gc_entries += (Py_ssize_t)c->saved;
        else
            m->primary_size -= (Py_ssize_t)c->saved;
        break;
    case K_HIGHEST_REQUIRED:
        m->highest = m->nopen ? m->open[m->nopen - 1] : 0;
        break;
    case K_GUARD:                       /* always: a scalar (rule T) */
        m->guard = m->removal_limit != 0 ? m->version : m->highest;
        break;
    case K_TRACKING_SINCE:
        m->tracking_since = (int32_t)c->saved;
        break;
    case K_REMOVAL_LIMIT:
        m->removal_limit = (Py_ssize_t)c->saved;
        break;
    case K_REMOVAL_VERSION:             /* the record, if the log still holds it there */
        if (c->to < m->nremovals && c->record_key == m->removals[c->to].key)
            m->removals[c->to].version = (int32_t)c->saved;
        else
            left = 1;
        break;
    case K_REHASH_INDEX:
        if (unchanged)
            m->rehash_index = (Py_ssize_t)c->saved;
        left = !unchanged;
        break;
    case K_UNMARK:
    case K_MARKS_SINCE:
    case K_STRAY_MARK: {                /* always: the chunk found again by its bucket */
        /* While the primary keeps its capacity, the chunk at the bucket's index
         * is the damaged one, or rule C's copy of it (which carries its marks),
         * or none (the rehash moved its buckets and marked them anew): the
         * pointer is read from the directory now, never kept. A new table
         * marked what it holds itself. */
        Table *t = &m->primary;
        Chunk *now = t->dir != NULL && t->capacity == c->capacity
            ? t->dir[c->bucket >> t->bits] : NULL;
        if (now == NULL)
            break;
        if (c->kind == K_UNMARK) {      /* a mark more never breaks invariant 14 */
            Py_ssize_t j = c->bucket & (chunk_slots(t) - 1);
            now->marks[j >> 6] |= (uint64_t)1 << (j & 63);
        }
        else if (c->kind == K_STRAY_MARK)   /* never a bucket's bit at this capacity */
            now->marks[c->to >> 6] &= ~((uint64_t)1 << (c->to & 63));
        else if (now->marks_since == c->to)     /* else its marks started over since */
            now->marks_since = (int32_t)c->saved;
        break;
    }
    case K_CHUNK_REFS:                  /* always: our count kept the chunk alive */
        if (--c->chunk->refs == 0)
            PyMem_Free(c->chunk);
        c->chunk = NULL;
        break;
    }
    m->stamp++;
    if (to_free != NULL)
        probe_entry_free(to_free);      /* last: may run a finalizer */
    if (left && PyErr_WarnFormat(PyExc_RuntimeWarning, 1,
                                 "the map changed structurally while corrupted (%s): the "
                                 "damage is left in place", corrupt_kinds[c->index].name) < 0)
        PyErr_WriteUnraisable((PyObject *)c);
}

static PyObject *Corruption_undo(CorruptionObject *c, PyObject *Py_UNUSED(ignored))
{
    corruption_undo(c);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_NONE;
}

static PyObject *Corruption_enter(CorruptionObject *c, PyObject *Py_UNUSED(ignored))
{
    return Py_NewRef((PyObject *)c);
}

static PyObject *Corruption_exit(CorruptionObject *c, PyObject *const *args, Py_ssize_t nargs)
{
    corruption_undo(c);
    if (PyErr_Occurred())
        return NULL;
    Py_RETURN_FALSE;
}

static PyObject *Corruption_get_active(CorruptionObject *c, void *closure)
{
    return PyBool_FromLong(c->active);
}

static void Corruption_dealloc(CorruptionObject *c)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    corruption_undo(c);
    if (PyErr_Occurred())
        PyErr_WriteUnraisable((PyObject *)c);
    PyErr_Restore(type, value, tb);
    Py_CLEAR(c->map);
    PyObject_Free(c);
}

static PyObject *Corruption_repr(CorruptionObject *c)
{
    return PyUnicode_FromFormat("<Corruption %s%s>", corrupt_kinds[c->index].name,
                                c->active ? "" : " undone");
}

static PyMethodDef Corruption_methods[] = {
    {"undo", (PyCFunction)Corruption_undo, METH_NOARGS, "Repair the map (also on exit)."},
    {"__enter__", (PyCFunction)Corruption_enter, METH_NOARGS, NULL},
    {"__exit__", (PyCFunction)(void (*)(void))Corruption_exit, METH_FASTCALL, NULL},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Corruption_getset[] = {
    {"active", (getter)Corruption_get_active, NULL, "True until undone.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject Corruption_Type = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "cowstate_spec._cmap_probe.Corruption",
    .tp_doc = "One invariant of a C map broken on purpose; undone when this ends.",
    .tp_basicsize = sizeof(CorruptionObject),
    .tp_dealloc = (destructor)Corruption_dealloc,
    .tp_repr = (reprfunc)Corruption_repr,
    .tp_flags = Py_TPFLAGS_DEFAULT,     /* not GC: the map it holds is never collected */
    .tp_methods = Corruption_methods,
    .tp_getset = Corruption_getset,
};

static PyObject *nothing_there(Py_ssize_t bucket, Py_ssize_t position, const char *what)
{
    PyErr_Format(PyExc_ValueError, "nothing there to corrupt: bucket %zd position %zd (%s)",
                 bucket, position, what);
    return NULL;
}

/* corrupt(m, what, bucket=0, *, position=0, to=0) -> Corruption */
static PyObject *probe_corrupt(PyObject *self, PyObject *args, PyObject *kwds)
{
    static char *kwlist[] = {"m", "what", "bucket", "position", "to", NULL};
    PyObject *obj;
    const char *what;
    Py_ssize_t bucket = 0, position = 0, to = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "Os|n$nn:corrupt", kwlist, &obj, &what,
                                     &bucket, &position, &to))
        return NULL;
    MapObject *m = as_map(obj);
    if (m == NULL)
        return NULL;
    Py_ssize_t k = 0;
    while (k < NKINDS && strcmp(corrupt_kinds[k].name, what) != 0)
        k++;
    if (k == NKINDS) {
        PyErr_Format(PyExc_ValueError, "expected a corruption of %s, got %s",
                     "cowstate_spec._cmap_probe.KINDS", what);
        return NULL;
    }
    Table *t = &m->primary;
    if (t->dir == NULL) {
        PyErr_SetString(PyExc_ValueError, "the map has no table (cleared by the collector)");
        return NULL;
    }
    if (bucket < 0 || bucket >= t->capacity || position < 0) {
        PyErr_Format(PyExc_IndexError,
                     "expected a bucket of the primary table [0, %zd) and a position >= 0, "
                     "got bucket %zd position %zd", t->capacity, bucket, position);
        return NULL;
    }
    Entry *prev = NULL, *e = slot_get(t, bucket);
    for (Py_ssize_t i = 0; e != NULL && i < position; i++) {
        prev = e;
        e = e->next;
    }
    Chunk *chunk = t->dir[bucket >> t->bits];
    Kind kind = corrupt_kinds[k].kind;
    CorruptionObject *c = PyObject_New(CorruptionObject, &Corruption_Type);
    if (c == NULL)
        return NULL;
    c->map = (MapObject *)Py_NewRef((PyObject *)m);
    c->kind = kind;
    c->index = k;
    c->active = 0;                  /* until the damage is done */
    c->entry = c->prev = c->held = c->added = NULL;
    c->chunk = NULL;
    c->batch = NULL;
    c->batch_version = 0;
    c->bucket = bucket;
    c->to = to;
    c->saved = 0;
    c->record_key = NULL;
    c->capacity = t->capacity;
    switch (kind) {
    case K_HASH:
    case K_STATE_VERSION:
    case K_SHARED_ENTRY_VERSION:
    case K_SHARED_STATE_VERSION:
    case K_RELINK:
    case K_RETIRE_LIVE:
    case K_HAND_BACK_LIVE:
    case K_DUPLICATE:
    case K_MOVE:
        if (e == NULL)
            goto nothing;
        break;
    case K_WRITE_SHARED:
        if (e == NULL || position != 0)
            goto nothing;
        break;
    case K_UNMARK:
    case K_MARKS_SINCE:
    case K_STRAY_MARK:              /* rule M: the live table's own chunks, while tracking */
        if (m->removal_limit == 0 || chunk == NULL || chunk->refs > 1
            || m->version == INT32_MAX) {
            Py_DECREF(c);
            PyErr_Format(PyExc_ValueError, "%s needs a map that tracks changes (at a version "
                         "below 2**31 - 1) and bucket %zd in a chunk no snapshot holds", what,
                         bucket);
            return NULL;
        }
        break;
    default:
        break;
    }
    switch (kind) {
    case K_HASH:
        c->entry = e;
        c->saved = (int64_t)e->hash;
        e->hash ^= 1;
        break;
    case K_STATE_VERSION:
        c->entry = e;
        c->saved = e->state_version;
        e->state_version = m->version + 7;
        break;
    case K_SHARED_STATE_VERSION:
        c->entry = e;
        c->saved = e->state_version;
        e->state_version = m->version;
        break;
    case K_SHARED_ENTRY_VERSION:
        c->entry = e;
        c->saved = e->entry_version;
        e->entry_version = m->version;
        break;
    case K_MOVE: {
        Entry **dst = to >= 0 && to < t->capacity ? slot_ref(t, to) : NULL;
        if (dst == NULL || to == bucket || chunk->refs > 1 || t->dir[to >> t->bits]->refs > 1) {
            Py_DECREF(c);
            PyErr_Format(PyExc_ValueError, "move needs another allocated bucket `to` of the "
                         "primary table in a chunk no snapshot holds, got %zd", to);
            return NULL;
        }
        Entry **link = prev != NULL ? &prev->next : slot_ref(t, bucket);
        *link = e->next;
        e->next = *dst;
        *dst = e;
        c->entry = e;
        c->prev = prev;
        break;
    }
    case K_DUPLICATE: {
        if (chunk->refs > 1) {
            Py_DECREF(c);
            PyErr_SetString(PyExc_ValueError, "duplicate needs a chunk no snapshot holds");
            return NULL;
        }
        Entry *d = probe_entry_copy(e);
        if (d == NULL) {
            Py_DECREF(c);
            return NULL;
        }
        d->entry_version = d->state_version = 0;
        Entry **head = slot_ref(t, bucket);
        d->next = *head;
        *head = d;
        m->primary_size++;
        c->added = d;
        break;
    }
    case K_RELINK:
        if (e->next == NULL)
            goto nothing;
        c->entry = e;
        c->held = e->next;
        e->next = e->next->next;
        m->primary_size--;          /* the live table stays counted right: 8 is named */
        break;
    case K_WRITE_SHARED: {
        if (chunk->refs < 2) {
            Py_DECREF(c);
            PyErr_SetString(PyExc_ValueError,
                            "write_shared needs a chunk a snapshot holds: take one first");
            return NULL;
        }
        Entry *d = probe_entry_copy(e);
        if (d == NULL) {
            Py_DECREF(c);
            return NULL;
        }
        d->entry_version = m->version;
        chunk->slots[bucket & (chunk_slots(t) - 1)] = d;
        c->chunk = chunk;
        c->held = e;
        c->added = d;
        break;
    }
    case K_RETIRE_LIVE: {
        if (m->version == INT32_MAX) {
            Py_DECREF(c);
            PyErr_SetString(PyExc_ValueError, "retire_live needs a map version below 2**31 - 1");
            return NULL;
        }
        /* never detached by a release */
        if ((c->batch = append_probe_batch(&m->retired, &m->retired_tail, INT32_MAX, e)) == NULL) {
            Py_DECREF(c);
            return PyErr_NoMemory();
        }
        c->batch_version = INT32_MAX;
        break;
    }
    case K_HAND_BACK_LIVE:
        if ((c->batch = append_probe_batch(&m->garbage, &m->garbage_tail, m->version, e)) == NULL) {
            Py_DECREF(c);
            return PyErr_NoMemory();
        }
        break;
    case K_UNRETIRE: {
        Batch *b = m->retired_tail;
        if (b == NULL || b->size == 0 || b->version == INT32_MAX) {   /* not retire_live's */
            Py_DECREF(c);
            PyErr_SetString(PyExc_ValueError,
                            "unretire needs a retired entry: replace a shared one first");
            return NULL;
        }
        c->held = b->entries[--b->size];
        c->batch = b;
        c->batch_version = b->version;
        break;
    }
    case K_PRIMARY_SIZE:
        c->saved = 1;
        m->primary_size += 1;
        break;
    case K_PRIMARY_SIZE_SHORT:
        c->saved = -2;
        m->primary_size -= 2;
        break;
    case K_GC_ENTRIES:
        c->saved = m->gc_entries;
        m->gc_entries = 0;
        break;
    case K_HIGHEST_REQUIRED:
        m->highest = (int32_t)to;
        break;
    case K_THRESHOLD:
        c->saved = 1;
        m->threshold += 1;
        break;
    case K_REHASH_INDEX:
        if (to < 0 || to >= t->capacity) {
            Py_DECREF(c);
            PyErr_Format(PyExc_ValueError, "rehash_index needs `to` in [0, %zd), got %zd",
                         t->capacity, to);
            return NULL;
        }
        c->saved = m->rehash_index;
        m->rehash_index = to;
        break;
    case K_CHUNK_REFS:
        if (chunk == NULL)
            goto nothing;
        chunk->refs++;
        c->chunk = chunk;
        break;
    case K_GUARD:
        c->saved = m->guard;
        m->guard = (int32_t)to;
        break;
    case K_TRACKING_SINCE:
        c->saved = m->tracking_since;
        m->tracking_since = m->version + 2;
        break;
    case K_REMOVAL_LIMIT:
        if (m->removal_limit == 0 || m->nremovals < 2) {
            Py_DECREF(c);
            PyErr_SetString(PyExc_ValueError,
                            "removal_limit needs a tracking map with two removals logged");
            return NULL;
        }
        c->saved = m->removal_limit;
        m->removal_limit = m->nremovals - 1;
        break;
    case K_UNMARK: {
        /* a bucket that needs its bit: an entry of state_version >= max(marks_since,
         * tracking_since) */
        int32_t bound = chunk->marks_since > m->tracking_since ? chunk->marks_since
                                                                : m->tracking_since;
        Entry *x = slot_get(t, bucket);
        while (x != NULL && x->state_version < bound)
            x = x->next;
        Py_ssize_t j = bucket & (chunk_slots(t) - 1);
        if (x == NULL || !bucket_marked(chunk, j))
            goto nothing;
        chunk->marks[j >> 6] &= ~((uint64_t)1 << (j & 63));
        break;
    }
    case K_MARKS_SINCE:
        c->saved = chunk->marks_since;
        c->to = m->version + 1;         /* the value written: compared at the undo */
        chunk->marks_since = (int32_t)c->to;
        break;
    case K_STRAY_MARK:
        if (to < chunk_slots(t) || to >= MARK_WORDS * 64) {
            Py_DECREF(c);
            PyErr_Format(PyExc_ValueError, "stray_mark needs `to` in [%zd, %d): a bit beyond "
                         "the chunk's buckets, got %zd", chunk_slots(t), MARK_WORDS * 64, to);
            return NULL;
        }
        chunk->marks[to >> 6] |= (uint64_t)1 << (to & 63);
        break;
    case K_REMOVAL_VERSION:
        if (position >= m->nremovals)
            goto nothing;
        /* the record by its index and key (compared, never followed) */
        c->to = position;
        c->record_key = m->removals[position].key;
        c->saved = m->removals[position].version;
        m->removals[position].version =
            position < m->nremovals - 1 ? m->version + 1 : 0;
        break;
    }
    m->stamp++;                     /* a structural write: operations in flight notice */
    c->stamp = m->stamp;
    c->structure_count = m->structure_count;
    c->active = 1;
    return (PyObject *)c;
nothing:
    Py_DECREF(c);
    return nothing_there(bucket, position, what);
}

/* ================================================================ the module */

static PyMethodDef probe_methods[] = {
    {"attach", (PyCFunction)probe_attach, METH_O,
     "Register a C map module whose _LAYOUT matches this probe's."},
    {"is_map", (PyCFunction)probe_is_map, METH_O,
     "True if the object's type is exactly a registered C map type."},
    {"is_snapshot", (PyCFunction)probe_is_snapshot, METH_O,
     "True if the object's type is exactly a registered C snapshot type."},
    {"structure", (PyCFunction)probe_structure, METH_O,
     "Every table, chunk, entry and batch of a C map (cowstate_spec.cmap_view)."},
    {"snapshot_structure", (PyCFunction)probe_snapshot_structure, METH_O,
     "A C snapshot's directories and chains, or None once released."},
    {"rehash_progress", (PyCFunction)probe_rehash_progress, METH_O,
     "(rehash index, old capacity) of a running rehash, or None."},
    {"rehash_state", (PyCFunction)(void (*)(void))probe_rehash_state, METH_FASTCALL,
     "(primary directory, rehash directory or 0, r, primary chain lengths or None)."},
    {"fingerprint", (PyCFunction)(void (*)(void))probe_fingerprint, METH_FASTCALL,
     "What an open snapshot reaches (a Fingerprint), or the message of invariant 8."},
    {"check", (PyCFunction)(void (*)(void))probe_check, METH_FASTCALL,
     "None if invariants 1-15 hold, else the message of the first that does not."},
    {"corrupt", (PyCFunction)(void (*)(void))probe_corrupt, METH_VARARGS | METH_KEYWORDS,
     "Break one invariant; the returned Corruption repairs it when it ends."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef probe_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "cowstate_spec._cmap_probe",
    .m_doc = "The C map seen from inside, for the specification only (design: the header "
             "of _cmap_probe.c).",
    .m_size = -1,
    .m_methods = probe_methods,
};

PyMODINIT_FUNC PyInit__cmap_probe(void)
{
    if (PyType_Ready(&Fingerprint_Type) < 0 || PyType_Ready(&Corruption_Type) < 0)
        return NULL;
    registry = PyDict_New();
    PyObject *kinds = PyDict_New();
    for (Py_ssize_t k = 0; kinds != NULL && k < NKINDS; k++) {
        PyObject *n = PyLong_FromLong(corrupt_kinds[k].invariant);
        if (n == NULL || PyDict_SetItemString(kinds, corrupt_kinds[k].name, n) < 0)
            Py_CLEAR(kinds);
        Py_XDECREF(n);
    }
    PyObject *module = registry == NULL || kinds == NULL ? NULL : PyModule_Create(&probe_module);
    if (module == NULL
        || PyModule_AddObjectRef(module, "KINDS", kinds) < 0
        || PyModule_AddObjectRef(module, "Fingerprint", (PyObject *)&Fingerprint_Type) < 0
        || PyModule_AddObjectRef(module, "Corruption", (PyObject *)&Corruption_Type) < 0
        || PyModule_AddIntConstant(module, "LAYOUT_VERSION", COWSTATE_LAYOUT_VERSION) < 0)
        goto fail;
    Py_CLEAR(kinds);
    /* The installed map: the probe reads nothing else until attach() says so. */
    PyObject *cmap = PyImport_ImportModule("cowstate._cmap");
    PyObject *done = cmap == NULL ? NULL : probe_attach(module, cmap);
    Py_XDECREF(cmap);
    if (done == NULL)
        goto fail;
    Py_DECREF(done);
    return module;
fail:
    Py_XDECREF(kinds);
    Py_XDECREF(module);
    return NULL;
}
