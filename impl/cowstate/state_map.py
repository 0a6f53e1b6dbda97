"""The copy-on-write state map: Flink's ``CopyOnWriteStateMap`` in Python.

A chained hash map from a composite key ``(key, namespace)`` to a state, built
so that a snapshot costs one list copy and a background writer can read the
snapshot while the owner keeps reading and writing the live map.

Versions
========
The map keeps a version counter ``V`` (starts at 0), the set of open snapshot
versions, and ``H``, the highest open version (0 when none is open).
Every entry carries ``entry_version`` (the map version when the entry object
was made) and ``state_version`` (the map version when its state object was
last handed out or replaced).

``snapshot()``   ``V += 1; H = V``; add ``V`` to the open set; shallow-copy the
                 bucket list(s). Entries and states are shared, not copied.
``release(v)``   remove ``v`` from the open set; ``H = max(open) or 0``.

Anything made before the newest open snapshot has a version ``< H`` and *may*
be reachable from a snapshot; anything made after has a version ``>= H`` and
cannot be. The two copy-on-write rules follow:

Rule E (entries)  Before changing an entry whose ``entry_version < H`` -- its
                  state, its ``state_version`` or its ``next`` -- replace it in
                  the live chain by a copy. A chain is singly linked, so every
                  shared predecessor (``entry_version < H``) is copied too; the
                  copies get ``entry_version = V``. The successors stay shared.
Rule S (states)   Before handing a state with ``state_version < H`` to a caller
                  who may mutate it (``get``, ``put_and_get_old``,
                  ``remove_and_get_old``, ``transform``), deep-copy it through
                  the serializer, store the copy (rule E first) and set
                  ``state_version = V``. Later gets return that same copy until
                  the next snapshot. Scalar exemption: ``get`` hands out a
                  state of an exact ``serializers.SCALAR_STATES`` type (int,
                  str, ...) as it is, with no copy and no write, when the
                  serializer declares it copies such states as themselves
                  (``serializers.copies_scalars_as_is``: the built-in ones do).
                  Nobody can mutate it, so sharing it is safe (invariants 7
                  and 8 hold: its ``state_version`` stays ``< H``), and a
                  ``get`` after a snapshot then costs a type check, not an
                  entry copy.

New entries go to the head of their chain, so inserting never touches a shared
entry. Removing a chain head only rewrites the live bucket list, which no
snapshot shares; removing any other entry rewrites its predecessor (rule E).

Incremental rehash
==================
When an insertion finds ``len(self) > threshold`` (3/4 of the capacity), a
table twice as large is allocated and every keyed operation (get, put,
contains, remove, transform and their variants) first moves whole buckets
until at least 4 entries have moved. ``r`` is the next old bucket to move::

      primary (L buckets)                 rehash table (2L buckets)
      +---+---+---+---+---+---+           +---+---+---+---+---+---+---+---+
      | . | . | x | x | x | x |           | y | y | . | . | y | y | . | . |
      +---+---+---+---+---+---+           +---+---+---+---+---+---+---+---+
        0   1   2=r         L-1             0   1         L  L+1       2L-1
      buckets < r are empty:              old bucket j went to j or j + L
      already moved

A mapping whose primary bucket ``j = h & (L - 1)`` is ``>= r`` lives in the
primary table; otherwise it lives in the rehash table at ``h & (2L - 1)``,
which is ``j`` or ``j + L``. An entry the move would relink is copied first
if a snapshot may hold it (rule E). When ``r`` reaches ``L`` the rehash table
becomes the primary table.

A snapshot taken while rehashing copies only the buckets that can hold
entries, in this compact layout (Flink's ``snapshotMapArrays``)::

      [ primary[r:L] | rehash[0:r] | rehash[L:L+r] | None padding ]
        L - r slots    r slots       r slots

padded with ``None`` to ``max(r + L, len(map))`` slots.

The arithmetic -- hashes, buckets, active-table selection, the rehash
destination, capacities, thresholds, versions and the snapshot layout -- is
defined once in :mod:`cowstate.arithmetic`, with contracts CrossHair checks.
What this map shares with the C map and every table -- the entry record
:class:`~cowstate.map_contract.StateEntry` that iteration yields, the
transform and keys contracts (``apply_transform``, ``keys_in``), the argument
checks and the messages of misuse -- is :mod:`cowstate.map_contract`, which
the C map imports by its public names; this module is the map alone.

Change tracking (incremental checkpoints)
=========================================
``track_changes(removal_limit)`` turns on what an incremental checkpoint
needs: which mappings changed, and which were removed, since the snapshot of
an earlier version ``b`` (the *base*, a checkpoint's snapshot). It is off by
default and costs nothing then (the map reads ``_guard`` where it read ``H``).

Rule T (tracking)  While tracking, ``_guard = V`` (else ``_guard = H``).
                   ``get`` takes its slow path for an entry whose
                   ``state_version < _guard``: rule S copies the state if
                   ``state_version < H``; otherwise the state is *marked*:
                   ``state_version = V`` (rule E first). So once a snapshot
                   of version ``b`` was taken, every state a caller could
                   mutate has ``state_version >= b``: ``put``,
                   ``put_and_get_old`` and ``transform`` set it anyway
                   (``transform`` marks the stored state before its
                   function gets it: the function may change it in place
                   and raise, and the transform contract keeps that), and
                   ``get`` marks the first time after each snapshot (a scalar
                   of rule S's exemption is neither copied nor marked: no
                   caller can change it but through ``put``).
Rule D (deletion)  Every removal of a mapping (``remove``,
                   ``remove_and_get_old``) appends ``(V, key, namespace)``
                   to the removal log. The log holds at most
                   ``removal_limit`` records: one more clears it and moves
                   ``tracking_since`` to ``V + 1`` (the deltas against
                   older bases are unknown: the next checkpoint is full).

Hence, for a base ``b >= tracking_since`` and a later snapshot ``s``:
the mappings of ``s`` that differ from ``b``'s are among those with
``state_version >= b`` (:meth:`StateMapSnapshot.changed_items`), and the keys
of ``b`` that ``s`` lacks are among the log's records with ``version >= b``
taken right after ``s`` (:meth:`CopyOnWriteStateMap.removals_since`). Both are supersets
(a state put back equal, a key inserted and removed in between): a delta
built from them, applied as removals first and mappings second, rebuilds
``s`` from ``b`` exactly. ``trim_removals(b)`` drops records older than the
base once no older base can be asked for. What ``get`` hands out may be
mutated only until the next snapshot (the contract above), so a mutation is
always of a marked state. Iteration hands out states to read, never to
mutate. Memory: at most ``removal_limit`` records (each a 3-tuple holding
the key and namespace alive), default :data:`DEFAULT_REMOVAL_LIMIT`.

Invariants
==========
The executable checker ``cowstate_spec.invariants.check_map`` asserts 1-9 and
13 after every step of the state machines (10-12 are the C map's own, in its
header comment). Comments in the code cite them.

1. Hash: an entry caches ``hash == composite_hash(key, namespace)``; in a
   table of length ``n`` it sits in bucket ``hash & (n - 1)``.
2. Placement: not rehashing, every entry is in the primary table. Rehashing at
   index ``r``, primary buckets ``< r`` are empty, and an entry is in the rehash
   table iff ``hash & (L - 1) < r``.
3. Counters: ``_primary_size`` and ``_rehash_size`` count the entries reachable
   in each table; ``len(map)`` is their sum.
4. Uniqueness: each ``(key, namespace)`` is reachable at most once.
5. Versions: ``entry_version <= V`` and ``state_version <= V`` for every live
   entry; ``H == max(open versions)`` or 0; ``V`` never decreases.
6. Entry sharing: an entry with ``entry_version >= H`` is reachable from no
   open snapshot (rule E may change it in place).
7. State sharing: a state with ``state_version >= H`` is reachable from no
   open snapshot (rule S may hand it out as it is).
8. Snapshot immutability: nothing reachable from an open snapshot changes --
   no entry's key, namespace, state or ``next``, no state's value.
9. Growth: capacities are powers of two in ``[4, 2**30]``; the rehash table is
   twice the primary; outside a rehash ``len(map) <= threshold + 1``; every
   keyed operation during a rehash moves at least 4 entries or finishes it.
13. Tracking: not tracking, ``_guard == H`` and there is no removal log;
    tracking, ``_guard == V``, ``tracking_since <= V + 1``, the log holds at
    most ``removal_limit`` records, their versions never decrease and lie in
    ``[tracking_since - 1, V]`` (a record may predate ``tracking_since`` by
    the version at which the log last overflowed or was trimmed to).

User code (rule U)
==================
The map calls code of its caller's: ``hash`` and ``==`` of keys and
namespaces, ``serializer.copy`` (rule S; the default serializer's deep copy
calls a state's ``__deepcopy__``) and the function of ``transform``.

Rule U (user code)  Whatever that code raises (an ``Exception``; a
                    ``KeyboardInterrupt`` or ``SystemExit`` passes unchanged)
                    comes out as a :mod:`cowstate.errors` exception chained
                    from it (``__cause__``), and the map is unchanged:

    __hash__ raised TypeError      UnhashableKeyError     (a TypeError)
    __hash__ raised anything else  KeyHashError           (an UnhashableKeyError)
    __eq__ raised                  KeyComparisonError     (a TypeError)
    serializer.copy raised         StateCopyError         (a TypeError)
      ... a RecursionError         StateTooDeepError      (a StateCopyError and a RecursionError)
    transform's function raised    TransformFunctionError

"Unchanged" means: the same mappings, each to the same state object (the
contents a model compares), invariants 1-9 hold, no open snapshot changed
(inv. 8), and the next operation works. It does not mean the same internal
layout: the operation's rehash step (inv. 9) may have run, and rule E may have
replaced shared entries by private copies (``put_and_get_old`` makes the
entry private before it copies the old state) -- neither shows in the
contents. The code keeps rule U by order, not by undoing: every hash comes
before anything else, a chain search writes nothing (rule E copies only once
the mapping is found), and every rule S copy comes before the write that
needs it (``remove_and_get_old`` copies before it unmaps). A ``keys`` or
``size_of_namespace`` whose namespace ``__eq__`` raises is a
KeyComparisonError too.

Rule R (re-entrant user code)  User code may use the map it was called
from: an ``__eq__`` that puts, a copy that removes. Every structural write --
an insertion, a removal, a rehash step, a rule E copy -- bumps ``_stamp``
(the C map's ``stamp``, rule (d) of its header), and:

  R1. A chain search compares ``_stamp`` after it ran; if an ``__eq__``
      changed it, the table, bucket and chain it walked may be gone, and the
      search starts over (the operation's rehash step is not repeated).
  R2. Any other step that ran user code before a write -- rule S's copy in
      ``get``, ``put_and_get_old`` and ``remove_and_get_old`` -- compares
      ``_stamp`` before that write and, if it changed, raises
      :class:`~cowstate.errors.ConcurrentModificationError` ("expected
      serializer.copy not to change the map it was called from, ...") with
      nothing written. ``transform`` searches again after its function
      (R1), so its copy and its function may change the map.

A snapshot taken by user code changes no structure: a step re-reads ``H``
after user code ran (rules E and S), so what was private is copied first.
When no user code re-enters, rule R costs a search one read of ``_stamp``
before and one compare after (about 25 ns of a pure ``get``'s 1-1.5 us),
an insertion or removal one increment; the search itself is unchanged.

The transform contract: ``fn(old, value)`` gets the mapped state object itself
when no open snapshot holds it (``state_version >= H``), else a private copy
(rule S). If ``fn`` raises (TransformFunctionError) or returns ``None``
(NoneStateError), the mapping still maps the same state object; an in-place
change ``fn`` made to its argument before raising is *not undone*: it shows in
the mapped state in the first case and is dropped with the copy in the second.
A function that must be all-or-nothing copies first (copying for every
transform would cost a deep copy per call). ``AggregatingState.add`` and the
other keyed states that transform keep the same contract.

Deep states: storing, reading a state no snapshot holds, iterating,
snapshotting and removing never recurse into a state, whatever its depth (the
C map neither). Copying does (the default serializer's deep copy takes two
Python frames per level), so a state nested deeper than about half the
recursion limit (some 500 levels at the default 1000) raises StateTooDeepError
wherever it must be copied -- rule S in ``get``, ``put_and_get_old``,
``remove_and_get_old`` and ``transform`` while a snapshot holds it, the nested
table's snapshot -- with the map unchanged; ``put`` and ``remove`` still
replace or drop it. A snapshot file refuses such a state by the value codec's
own limit (:data:`cowstate.value_codec.MAX_CONTAINER_DEPTH`).

Iteration is fail-fast: an iterator raises
:class:`~cowstate.errors.ConcurrentModificationError` when a mapping was added
or removed, or a rehash step relinked entries, since it was created. Replacing
the state of an existing mapping while no rehash runs is allowed.

Threads: every operation on the live map runs on the owner's thread. A
snapshot may be read and released on another thread (the backend's writer
does both) while the owner works on; ``release`` shares a lock with
``snapshot``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic

from cowstate.arithmetic import (
    DEFAULT_CAPACITY,
    DEFAULT_REMOVAL_LIMIT,
    HASH_MASK,
    HASH_MIX,
    MAX_VERSION,
    MAXIMUM_CAPACITY,
    MIN_TRANSFERRED_PER_INCREMENTAL_REHASH,
    MINIMUM_CAPACITY,
    bucket_index,
    composite_hash,
    highest_required_version,
    in_rehash_table,
    open_snapshot_version,
    rehash_destination,
    release_snapshot_version,
    snapshot_layout,
    threshold_for,
)
from cowstate.errors import (
    ConcurrentModificationError,
    ForeignSnapshotError,
    InvalidArgumentError,
    KeyComparisonError,
    KeyHashError,
    MaximumCapacityError,
    NoneStateError,
    SnapshotReleasedError,
    StateCopyError,
    UnhashableKeyError,
    VersionOverflowError,
)
from cowstate.map_contract import (
    StateEntry,
    apply_transform,
    capacity_message,
    checked_removal_limit,
    checked_serializer,
    checked_version,
    constructor_arguments,
    foreign_message,
    keys_in,
    modified_message,
    none_message,
    open_versions_message,
    overflow_message,
    pair_message,
    reentrant_message,
    released_message,
    trim_message,
)
from cowstate.serializers import SCALAR_STATES, StateSerializer, copies_scalars_as_is
from cowstate.type_vars import K, N, S, V

__all__ = [
    "DEFAULT_CAPACITY",
    "DEFAULT_REMOVAL_LIMIT",
    "MAXIMUM_CAPACITY",
    "MINIMUM_CAPACITY",
    "MIN_TRANSFERRED_PER_INCREMENTAL_REHASH",
    "CopyOnWriteStateMap",
    "StateMapSnapshot",
    "composite_hash",
]


# --------------------------------------------------------------------------
# The map
# --------------------------------------------------------------------------


class CopyOnWriteStateMap(Generic[K, N, S]):
    """Map ``(key, namespace) -> state`` with cheap snapshots (see module doc).

    ``serializer`` copies shared mutable states (rule S); the default copies
    anything it does not know to be immutable. ``initial_capacity`` is
    rounded up to a power of two in ``[4, 2**30]``.
    """

    __slots__ = (
        "__weakref__",
        "_guard",
        "_highest_required",
        "_lock",
        "_mask",
        "_mod_count",
        "_open_versions",
        "_primary",
        "_primary_size",
        "_rehash",
        "_rehash_index",
        "_rehash_size",
        "_removal_limit",
        "_removals",
        "_scalars_as_is",
        "_serializer",
        "_stamp",
        "_structure_count",
        "_threshold",
        "_tracking_since",
        "_version",
    )

    def __init__(
        self, serializer: StateSerializer | None = None, initial_capacity: int = DEFAULT_CAPACITY
    ) -> None:
        self._serializer, capacity = constructor_arguments(serializer, initial_capacity)
        self._scalars_as_is = copies_scalars_as_is(self._serializer)  # rule S, scalars
        self._primary: list[_Entry | None] = [None] * capacity
        self._mask = capacity - 1
        self._threshold = threshold_for(capacity)
        self._rehash: list[_Entry | None] | None = None
        self._rehash_index = 0
        self._primary_size = 0
        self._rehash_size = 0
        self._version = 0
        self._highest_required = 0
        self._open_versions: frozenset[int] = frozenset()
        self._lock = threading.Lock()
        self._mod_count = 0
        self._structure_count = 0
        self._stamp = 0  # every structural write (rule R)
        self._guard = 0  # H, or V while tracking (rule T, inv. 13)
        self._removals: list[tuple[int, Any, Any]] | None = None  # rule D
        self._removal_limit = 0
        self._tracking_since = 0

    # ---------------------------------------------------------------- reads

    def get(self, key: K, namespace: N) -> S | None:
        """The state of ``(key, namespace)``, or ``None`` if absent.

        The caller may mutate the returned state in place until the next
        ``snapshot()``: a state an open snapshot can reach is copied first
        (rule S).
        """
        try:
            h = (hash(key) * HASH_MIX + hash(namespace)) & HASH_MASK
        except TypeError as exc:  # rule U: chained, as CPython's own "unhashable type"
            raise UnhashableKeyError.of(key, namespace) from exc
        except Exception as exc:  # rule U
            raise KeyHashError.raised_by_pair(key, namespace, exc) from exc
        h ^= h >> 16  # composite_hash (inv. 1)
        if self._rehash is None:
            tab = self._primary
            index = h & self._mask
        else:
            self._incremental_rehash()
            tab, index = self._select(h)
        stamp = self._stamp
        e = tab[index]
        try:
            while e is not None:
                if (
                    e.hash == h
                    and (e.key is key or e.key == key)
                    and (e.namespace is namespace or e.namespace == namespace)
                ):
                    break
                e = e.next
        except Exception as exc:  # rule U: nothing written yet
            raise KeyComparisonError.of(key, namespace, exc) from exc
        if self._stamp != stamp:  # rule R1: an __eq__ changed the map
            tab, index, e, _ = self._lookup(h, key, namespace)
        if e is None:
            return None
        if e.state_version < self._guard:  # rule S (copy) or rule T (mark)
            return self._copy_state_for_caller(tab, index, e, key, namespace)
        state: S = e.state  # _Entry.state is Any: an annotated local, no cast call
        return state

    def contains_key(self, key: K, namespace: N) -> bool:
        """True if ``(key, namespace)`` is mapped."""
        h = self._hash_and_step(key, namespace)
        return self._find(h, key, namespace) is not None

    def __contains__(self, item: object) -> bool:
        if not isinstance(item, tuple) or len(item) != 2:
            raise InvalidArgumentError(pair_message(item))
        return self.contains_key(item[0], item[1])

    def __len__(self) -> int:
        return self._primary_size + self._rehash_size  # inv. 3

    def size_of_namespace(self, namespace: N) -> int:
        """Number of mappings whose namespace equals ``namespace``."""
        return sum(1 for _ in self.keys(namespace))

    def keys(self, namespace: N) -> Iterator[K]:
        """The keys mapped in ``namespace`` (fail-fast, like ``iter``); a
        namespace ``__eq__`` that raises ends it with KeyComparisonError."""
        return keys_in(iter(self), namespace)

    def __iter__(self) -> Iterator[StateEntry[K, N, S]]:
        """Every mapping once, primary table first (fail-fast, see module doc)."""
        # The counters are read here, not in the generator, so a change between
        # iter() and the first next() is detected too.
        expected = (self._mod_count, self._structure_count)
        tables = [self._primary] if self._rehash is None else [self._primary, self._rehash]
        return self._iterate(tables, expected)

    def _iterate(
        self, tables: list[list[_Entry | None]], expected: tuple[int, int]
    ) -> Iterator[StateEntry[K, N, S]]:
        if (self._mod_count, self._structure_count) != expected:
            raise ConcurrentModificationError(modified_message())
        for tab in tables:
            for head in tab:
                e = head
                while e is not None:
                    if (self._mod_count, self._structure_count) != expected:
                        raise ConcurrentModificationError(modified_message())
                    yield StateEntry(e.key, e.namespace, e.state)
                    e = e.next
        if (self._mod_count, self._structure_count) != expected:
            raise ConcurrentModificationError(modified_message())

    # --------------------------------------------------------------- writes

    def put(self, key: K, namespace: N, state: S) -> bool:
        """Map ``(key, namespace)`` to ``state`` (never ``None``); True if the
        mapping is new, False if it replaced a state."""
        if state is None:
            raise NoneStateError(none_message(key, namespace, "put"))
        try:
            h = (hash(key) * HASH_MIX + hash(namespace)) & HASH_MASK
        except TypeError as exc:  # rule U: chained, as CPython's own "unhashable type"
            raise UnhashableKeyError.of(key, namespace) from exc
        except Exception as exc:  # rule U
            raise KeyHashError.raised_by_pair(key, namespace, exc) from exc
        h ^= h >> 16  # composite_hash (inv. 1)
        if self._rehash is not None:
            self._incremental_rehash()
        count = self._mod_count  # _put_entry counts an insertion
        e = self._put_entry(h, key, namespace)
        inserted = self._mod_count != count  # before the write: it may run a __del__
        e.state = state
        e.state_version = self._version
        return inserted

    def put_and_get_old(self, key: K, namespace: N, state: S) -> S | None:
        """Map ``(key, namespace)`` to ``state``; return the previous state or ``None``."""
        if state is None:
            raise NoneStateError(none_message(key, namespace, "put_and_get_old"))
        h = self._hash_and_step(key, namespace)
        e = self._put_entry(h, key, namespace)
        old: S | None = e.state
        if old is not None and e.state_version < self._highest_required:  # rule S
            stamp = self._stamp
            try:  # rule U: only rule E's private copies were made so far
                old = self._serializer.copy(old)
            except Exception as exc:
                raise StateCopyError.of(key, namespace, exc) from exc
            if self._stamp != stamp:  # rule R2
                raise ConcurrentModificationError(reentrant_message("serializer.copy"))
            if e.entry_version < self._highest_required:  # the copy took a snapshot: rule E
                tab, index = self._select(h)
                e = self._copy_chain(tab, index, e)
        e.state = state
        e.state_version = self._version
        return old

    def remove(self, key: K, namespace: N) -> None:
        """Unmap ``(key, namespace)``; absent mappings are ignored."""
        h = self._hash_and_step(key, namespace)
        self._remove_entry(h, key, namespace)

    def remove_and_get_old(self, key: K, namespace: N) -> S | None:
        """Unmap ``(key, namespace)``; return its state or ``None`` if absent."""
        h = self._hash_and_step(key, namespace)
        e = self._find(h, key, namespace)
        if e is None:
            return None
        old: S | None = e.state
        if e.state_version < self._highest_required:  # rule S, before unmapping:
            stamp = self._stamp
            try:  # rule U: a raising copy loses nothing
                old = self._serializer.copy(old)
            except Exception as exc:
                raise StateCopyError.of(key, namespace, exc) from exc
            if self._stamp != stamp:  # rule R2
                raise ConcurrentModificationError(reentrant_message("serializer.copy"))
        self._remove_entry(h, key, namespace)
        return old

    def transform(self, key: K, namespace: N, value: V, fn: Callable[[S | None, V], S]) -> None:
        """Map ``(key, namespace)`` to ``fn(old_or_None, value)``.

        Atomic: if ``fn`` raises (:class:`TransformFunctionError`) or returns
        ``None`` (:class:`NoneStateError`) the mapping is unchanged. ``fn`` gets
        a state it may mutate (rule S) and must not use this map; what an
        in-place change before raising leaves is the transform contract of the
        module doc (rule U).
        """
        try:
            h = composite_hash(key, namespace)
        except TypeError as exc:  # rule U: chained, as CPython's own "unhashable type"
            raise UnhashableKeyError.of(key, namespace) from exc
        except Exception as exc:  # rule U
            raise KeyHashError.raised_by_pair(key, namespace, exc) from exc
        e = self._find(h, key, namespace)
        old = None
        if e is not None:
            old = e.state
            if e.state_version < self._highest_required:  # rule S
                try:  # rule U
                    old = self._serializer.copy(old)
                except Exception as exc:
                    raise StateCopyError.of(key, namespace, exc) from exc
            elif e.state_version < self._guard:  # rule T: fn gets the stored state
                # and may change it in place even if it then raises: marked first
                self._mark(*self._select(h), e)
        new = apply_transform(fn, old, value, key, namespace)
        if self._rehash is not None:  # this operation's rehash step, once fn succeeded
            self._incremental_rehash()
        e = self._put_entry(h, key, namespace)
        e.state = new
        e.state_version = self._version

    # ------------------------------------------------------------ snapshots

    def snapshot(self) -> StateMapSnapshot[K, N, S]:
        """Open a snapshot: an immutable view of the mappings as they are now.

        Costs one shallow copy of the bucket list(s). Release it (or use it as a
        context manager) when done: while it is open, changes copy shared data.
        """
        with self._lock:
            version, open_versions = open_snapshot_version(self._version, self._open_versions)
            if version > MAX_VERSION:
                raise VersionOverflowError(overflow_message(version))
            self._version = version
            self._open_versions = open_versions
            self._highest_required = version  # inv. 5: the newest is the highest open
            self._guard = version  # inv. 13: V == H now, tracking or not
        return StateMapSnapshot(self, version, self._snapshot_arrays(), len(self))

    def release(self, snapshot: StateMapSnapshot[Any, Any, Any]) -> None:
        """Release ``snapshot``, which must have been taken from this map."""
        if not isinstance(snapshot, StateMapSnapshot) or snapshot._owner is not self:
            raise ForeignSnapshotError(foreign_message(snapshot))
        snapshot.release()

    @property
    def pending_reclaim(self) -> int:
        """Entries a snapshot's ``hand_back`` left for this map to free: always
        0 here (Python frees them at the release; the C map's rule G)."""
        return 0

    def reclaim(self) -> int:
        """Free what ``hand_back`` left now; the count: 0 here (see
        :attr:`pending_reclaim`)."""
        return 0

    # ------------------------------------------------------ change tracking

    def track_changes(self, removal_limit: int = DEFAULT_REMOVAL_LIMIT) -> None:
        """Track changes from the next snapshot on (rules T and D of the module
        doc); already tracking, only the limit changes (a smaller one clears
        an overlong log, as an overflow does)."""
        removal_limit = checked_removal_limit(removal_limit)
        with self._lock:
            self._removal_limit = removal_limit
            if self._removals is None or len(self._removals) > removal_limit:
                self._removals = []
                self._tracking_since = self._version + 1
            self._guard = self._version  # inv. 13

    @property
    def tracking_since(self) -> int | None:
        """The oldest base version a delta may be built against (rules T, D), or
        None when the map does not track changes."""
        return None if self._removals is None else self._tracking_since

    def removals_since(self, version: int) -> list[tuple[K, N]] | None:
        """The ``(key, namespace)`` pairs removed since the snapshot of
        ``version`` up to now, each once, in the order of their last removal --
        every key that snapshot held and the map lacks now is among them
        (rule D) -- or None if the log cannot tell (not tracking, or
        ``version < tracking_since``). Owner's thread: called right after the
        snapshot of a delta, it gives the removals between the two snapshots."""
        version = checked_version(version)
        log = self._removals
        if log is None or version < self._tracking_since:
            return None
        seen: dict[tuple[Any, Any], None] = {}
        for at, key, namespace in log:
            if at >= version:
                seen.pop((key, namespace), None)
                seen[(key, namespace)] = None
        return list(seen)

    def trim_removals(self, version: int) -> None:
        """Drop the removal records older than ``version``: no delta will be
        built against an older base (``tracking_since`` moves up to it, at
        most to ``V + 1``: invariant 13)."""
        version = checked_version(version)
        if version > self._version + 1:
            raise InvalidArgumentError(trim_message(version, self._version + 1))
        log = self._removals
        if log is None or version <= self._tracking_since:
            return
        self._removals = [record for record in log if record[0] >= version]
        self._tracking_since = version

    @property
    def serializer(self) -> StateSerializer:
        """The serializer that copies shared states."""
        return self._serializer

    @serializer.setter
    def serializer(self, serializer: StateSerializer) -> None:
        self._serializer = checked_serializer(serializer)
        self._scalars_as_is = copies_scalars_as_is(self._serializer)  # rule S, scalars

    def __repr__(self) -> str:
        return (
            f"<CopyOnWriteStateMap size={len(self)} capacity={len(self._primary)}"
            f"{' rehashing' if self._rehash is not None else ''} version={self._version}"
            f" open={sorted(self._open_versions)}>"
        )

    # ------------------------------------------------------ private helpers

    def _hash_and_step(self, key: K, namespace: N) -> int:
        """Validate and hash the composite key, then do one rehash step."""
        try:
            h = (hash(key) * HASH_MIX + hash(namespace)) & HASH_MASK
        except TypeError as exc:  # rule U: chained, as CPython's own "unhashable type"
            raise UnhashableKeyError.of(key, namespace) from exc
        except Exception as exc:  # rule U
            raise KeyHashError.raised_by_pair(key, namespace, exc) from exc
        if self._rehash is not None:
            self._incremental_rehash()
        return h ^ (h >> 16)  # composite_hash (inv. 1)

    def _select(self, h: int) -> tuple[list[_Entry | None], int]:
        """The table and bucket that hold hash ``h`` (invariant 2)."""
        primary = self._primary
        capacity = len(primary)
        rehash = self._rehash
        if rehash is not None and in_rehash_table(h, capacity, self._rehash_index):
            return rehash, rehash_destination(h, capacity)
        return primary, bucket_index(h, capacity)

    def _find(self, h: int, key: K, namespace: N) -> _Entry | None:
        """The entry of ``(key, namespace)``; changes nothing."""
        if self._rehash is None:  # _select, inlined for the common case
            tab = self._primary
            index = h & self._mask
        else:
            tab, index = self._select(h)
        stamp = self._stamp
        e = tab[index]
        try:
            while e is not None:
                if (
                    e.hash == h
                    and (e.key is key or e.key == key)
                    and (e.namespace is namespace or e.namespace == namespace)
                ):
                    break
                e = e.next
        except Exception as exc:  # rule U
            raise KeyComparisonError.of(key, namespace, exc) from exc
        if self._stamp != stamp:  # rule R1: an __eq__ changed the map
            return self._lookup(h, key, namespace)[2]
        return e

    def _lookup(
        self, h: int, key: K, namespace: N
    ) -> tuple[list[_Entry | None], int, _Entry | None, _Entry | None]:
        """``(table, bucket, entry, predecessor)`` of ``(key, namespace)`` (entry
        None: absent; predecessor None: at the chain's head), searched until no
        ``__eq__`` changed the map meanwhile (rule R1); changes nothing. The
        keyed operations search inline and call this once a search saw a change."""
        while True:
            stamp = self._stamp
            tab, index = self._select(h)
            e = tab[index]
            prev: _Entry | None = None
            try:
                while e is not None:
                    if (
                        e.hash == h
                        and (e.key is key or e.key == key)
                        and (e.namespace is namespace or e.namespace == namespace)
                    ):
                        break
                    prev = e
                    e = e.next
            except Exception as exc:  # rule U
                raise KeyComparisonError.of(key, namespace, exc) from exc
            if self._stamp == stamp:
                return tab, index, e, prev

    def _put_entry(self, h: int, key: K, namespace: N) -> _Entry:
        """The entry of ``(key, namespace)``, private to the live map (rule E),
        added at its chain's head when absent."""
        if self._rehash is None:  # _select, inlined for the common case
            tab = self._primary
            index = h & self._mask
        else:
            tab, index = self._select(h)
        stamp = self._stamp
        e = tab[index]
        try:
            while e is not None:
                if (
                    e.hash == h
                    and (e.key is key or e.key == key)
                    and (e.namespace is namespace or e.namespace == namespace)
                ):
                    break
                e = e.next
        except Exception as exc:  # rule U: the search writes nothing
            raise KeyComparisonError.of(key, namespace, exc) from exc
        if self._stamp != stamp:  # rule R1: an __eq__ changed the map
            tab, index, e, _ = self._lookup(h, key, namespace)
        if e is not None:
            if e.entry_version < self._highest_required:  # rule E
                e = self._copy_chain(tab, index, e)
            return e
        self._mod_count += 1
        self._stamp += 1
        if self._primary_size + self._rehash_size > self._threshold:
            # A new rehash starts at index 0, so (tab, index) stays right (inv. 2).
            self._double_capacity()
        version = self._version
        e = _Entry(key, namespace, None, h, tab[index], version, version)
        tab[index] = e
        if tab is self._primary:
            self._primary_size += 1
        else:
            self._rehash_size += 1
        return e

    def _remove_entry(self, h: int, key: K, namespace: N) -> _Entry | None:
        if self._rehash is None:  # _select, inlined for the common case
            tab = self._primary
            index = h & self._mask
        else:
            tab, index = self._select(h)
        stamp = self._stamp
        e = tab[index]
        prev: _Entry | None = None
        try:
            while e is not None:
                if (
                    e.hash == h
                    and (e.key is key or e.key == key)
                    and (e.namespace is namespace or e.namespace == namespace)
                ):
                    break
                prev = e
                e = e.next
        except Exception as exc:  # rule U: the search writes nothing
            raise KeyComparisonError.of(key, namespace, exc) from exc
        if self._stamp != stamp:  # rule R1: an __eq__ changed the map
            tab, index, e, prev = self._lookup(h, key, namespace)
        if e is None:
            return None
        if prev is None:
            tab[index] = e.next  # the live bucket list is never shared
        else:
            if prev.entry_version < self._highest_required:  # rule E
                prev = self._copy_chain(tab, index, prev)
            prev.next = e.next
        self._mod_count += 1
        self._stamp += 1
        if tab is self._primary:
            self._primary_size -= 1
        else:
            self._rehash_size -= 1
        if self._removals is not None:  # rule D
            self._log_removal(e.key, e.namespace)
        return e

    def _copy_state_for_caller(
        self, tab: list[_Entry | None], index: int, e: _Entry, key: object, namespace: object
    ) -> S:
        """Rule S: replace a shared state by a deep copy and return the copy; or
        rule T: mark a state no snapshot holds as handed out at ``V``; or
        neither, for a scalar the serializer copies as itself (rule S)."""
        if self._scalars_as_is and type(e.state) in SCALAR_STATES:  # rule S, scalars
            scalar: S = e.state
            return scalar
        if e.state_version >= self._highest_required:  # rule T: mark, no copy
            handed: S = self._mark(tab, index, e).state
            return handed
        stamp = self._stamp
        try:  # rule U: before any write
            state: S = self._serializer.copy(e.state)
        except Exception as exc:
            raise StateCopyError.of(key, namespace, exc) from exc
        if self._stamp != stamp:  # rule R2
            raise ConcurrentModificationError(reentrant_message("serializer.copy"))
        if e.entry_version < self._highest_required:  # rule E
            e = self._copy_chain(tab, index, e)
        e.state = state
        e.state_version = self._version
        return state

    def _mark(self, tab: list[_Entry | None], index: int, e: _Entry) -> _Entry:
        """Rule T: mark the state of ``e`` (in ``tab[index]``'s chain), which no
        snapshot holds, as handed out at ``V`` -- on the owner's copy of the
        entry if a snapshot shares it (rule E first); the entry standing for
        ``e`` now."""
        if e.entry_version < self._highest_required:  # rule E
            e = self._copy_chain(tab, index, e)
        e.state_version = self._version
        return e

    def _copy_chain(self, tab: list[_Entry | None], index: int, until: _Entry) -> _Entry:
        """Rule E: copy every shared entry from the head of ``tab[index]`` up to
        ``until`` (found by identity) and return what stands for ``until``."""
        required = self._highest_required
        version = self._version
        self._stamp += 1  # rule R: entries are replaced
        current = tab[index]
        assert current is not None
        if current is until:  # the common case: a chain head
            copy = until.copy(version)
            tab[index] = copy
            return copy
        if current.entry_version < required:
            copy = current.copy(version)
            tab[index] = copy
        else:
            copy = current
        while current is not until:
            current = current.next
            assert current is not None, "copy-on-write target not in its chain"
            if current.entry_version < required:
                copy.next = current.copy(version)
                copy = copy.next
            else:
                copy = current
        return copy

    def _double_capacity(self) -> None:
        """Start a rehash into a table twice as large (invariant 9)."""
        assert self._rehash is None, "a rehash is already in progress"
        capacity = len(self._primary)
        if capacity >= MAXIMUM_CAPACITY:
            raise MaximumCapacityError(capacity_message(len(self), MAXIMUM_CAPACITY))
        new_capacity = capacity * 2
        self._rehash = [None] * new_capacity
        self._threshold = threshold_for(new_capacity)

    def _incremental_rehash(self) -> None:
        """Move whole buckets until at least 4 entries moved (invariant 9)."""
        old = self._primary
        new = self._rehash
        assert new is not None
        required = self._highest_required
        version = self._version
        r = self._rehash_index
        capacity = len(old)
        moved = 0
        self._structure_count += 1
        self._stamp += 1
        while moved < MIN_TRANSFERRED_PER_INCREMENTAL_REHASH:
            e = old[r]
            while e is not None:
                if e.entry_version < required:  # rule E: relinking
                    e = e.copy(version)
                successor = e.next
                pos = rehash_destination(e.hash, capacity)  # r or r + capacity
                e.next = new[pos]
                new[pos] = e
                e = successor
                moved += 1
            old[r] = None
            r += 1
            if r == capacity:  # rehash complete
                self._primary = new
                self._mask = len(new) - 1
                self._rehash = None
                self._primary_size += self._rehash_size
                self._rehash_size = 0
                self._rehash_index = 0
                return
        self._primary_size -= moved
        self._rehash_size += moved
        self._rehash_index = r

    def _snapshot_arrays(self) -> list[_Entry | None]:
        """The snapshot's shallow copy of the bucket list(s) (module doc layout)."""
        return snapshot_layout(self._primary, self._rehash, self._rehash_index, len(self))

    def _log_removal(self, key: object, namespace: object) -> None:
        """Rule D: record a removal; past the limit, forget and start over."""
        log = self._removals
        assert log is not None
        if len(log) < self._removal_limit:
            log.append((self._version, key, namespace))
            return
        # Overflow: older bases are unknown now. The full log is dropped last,
        # once the new one holds this record: dropping it may run a key's
        # finalizer that removes (and logs) again (rule R; the C map likewise).
        self._removals = [(self._version, key, namespace)]
        self._tracking_since = self._version + 1
        del log

    def _release_version(self, version: int) -> None:
        with self._lock:
            if version not in self._open_versions:
                raise SnapshotReleasedError(
                    open_versions_message(tuple(self._open_versions), version)
                )
            self._open_versions = release_snapshot_version(self._open_versions, version)
            self._highest_required = highest_required_version(self._open_versions)  # inv. 5
            # inv. 13: H, or V while tracking
            self._guard = self._highest_required if self._removals is None else self._version


class _Entry:
    """A chain link. Never handed out: iteration yields :class:`StateEntry`."""

    __slots__ = ("entry_version", "hash", "key", "namespace", "next", "state", "state_version")

    def __init__(
        self,
        key: Any,
        namespace: Any,
        state: Any,
        h: int,
        next_: _Entry | None,
        entry_version: int,
        state_version: int,
    ) -> None:
        self.key = key
        self.namespace = namespace
        self.state = state
        self.hash = h
        self.next = next_
        self.entry_version = entry_version
        self.state_version = state_version

    def copy(self, entry_version: int) -> _Entry:
        """A shallow copy (same state object, same successor) with a new entry version."""
        return _Entry(
            self.key,
            self.namespace,
            self.state,
            self.hash,
            self.next,
            entry_version,
            self.state_version,
        )

    def __repr__(self) -> str:
        return (
            f"_Entry({self.key!r}, {self.namespace!r}, {self.state!r}, "
            f"ev={self.entry_version}, sv={self.state_version})"
        )


class StateMapSnapshot(Generic[K, N, S]):
    """An immutable view of a map at one version (see the module doc).

    ``len(snap)`` and ``iter(snap)`` read it; ``release()`` ends it (once).
    Reading a released snapshot raises :class:`SnapshotReleasedError`.
    Yielded states are the snapshot's own objects: read, never mutate them.
    """

    __slots__ = ("_data", "_owner", "_released", "_size", "version")

    def __init__(
        self,
        owner: CopyOnWriteStateMap[K, N, S],
        version: int,
        data: list[_Entry | None],
        size: int,
    ) -> None:
        self._owner = owner
        self.version = version
        self._data: list[_Entry | None] | None = data
        self._size = size
        self._released = False

    @property
    def is_released(self) -> bool:
        return self._released

    def __len__(self) -> int:
        self._check_open()
        return self._size

    def __iter__(self) -> Iterator[StateEntry[K, N, S]]:
        data = self._check_open()
        for head in data:
            e = head
            while e is not None:
                if self._released:
                    raise SnapshotReleasedError(released_message(self.version, "while being read"))
                yield StateEntry(e.key, e.namespace, e.state)
                e = e.next

    def items(self) -> list[tuple[K, N, S]]:
        """Every mapping as a plain ``(key, namespace, state)`` tuple, in one list.

        The fast path for a writer that reads the snapshot once before
        releasing it: no per-entry release check (a release *during* the call
        is not detected), no :class:`StateEntry` per mapping.
        """
        out: list[tuple[K, N, S]] = []
        append = out.append
        for head in self._check_open():
            e = head
            while e is not None:
                append((e.key, e.namespace, e.state))
                e = e.next
        return out

    def changed_items(self, since: int) -> list[tuple[K, N, S]]:
        """The mappings whose state was put, replaced or handed out at version
        ``since`` or later (``state_version >= since``): with the map tracking
        since a base of version ``since``, a superset of the mappings that
        differ from the base's (rule T of the module doc)."""
        since = checked_version(since, "since")
        out: list[tuple[K, N, S]] = []
        append = out.append
        for head in self._check_open():
            e = head
            while e is not None:
                if e.state_version >= since:
                    append((e.key, e.namespace, e.state))
                e = e.next
        return out

    def release(self) -> None:
        """Release this snapshot: copy-on-write stops protecting it."""
        if self._released:
            raise SnapshotReleasedError(released_message(self.version, "already"))
        self._owner._release_version(self.version)
        self._released = True
        self._data = None

    def hand_back(self) -> None:
        """:meth:`release`, for a snapshot writer on another thread: the C map
        leaves freeing what only this snapshot kept alive to its owner (its
        rule G); here Python frees it at once, as ``release`` does."""
        self.release()

    def __enter__(self) -> StateMapSnapshot[K, N, S]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if not self._released:
            self.release()

    def _check_open(self) -> list[_Entry | None]:
        if self._data is None:
            raise SnapshotReleasedError(released_message(self.version, "released"))
        return self._data

    def __repr__(self) -> str:
        state = "released" if self._released else f"size={self._size}"
        return f"<StateMapSnapshot version={self.version} {state}>"
