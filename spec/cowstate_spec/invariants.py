"""The structural invariant checker for ``cowstate.CopyOnWriteStateMap``.

``check_map(m, snapshots)`` walks the map's internals and raises
:class:`InvariantViolation` naming the first invariant (numbered as in the
``cowstate.state_map`` module docstring) that does not hold.
``fingerprint(snapshot)`` records, when a snapshot is opened, everything the
snapshot can reach, so that later checks prove it never changed (invariant 8).

A model comparison cannot see structure or cost (a table that never grows, a
stalled rehash, a wrong counter that happens to cancel out); this checker can.
``rehash_step_check(m)``, called before a keyed operation, returns the check
to run after it: the operation moved at least 4 entries or finished the
rehash (invariant 9), so a rehash ends within a bounded number of operations.
``check_table(table, snapshots)`` judges a heap table (routing, size, and
every copy-on-write map as above); ``check_rocksdb_table(table)`` judges the
RocksDB table's key layout, the one structure it has.

The checker computes hashes, thresholds, versions and the snapshot layout
with the plain formulations of :mod:`cowstate_model.arithmetic`, never with
the implementation's own helpers: a wrong helper cannot blind its judge.

The C map (``cowstate._cmap``) has two judges. The reference is this code:
the structure export of its probe (``cowstate_spec._cmap_probe``) read
through :mod:`cowstate_spec.cmap_view`, which also checks the C map's own
invariants 10 (chunk counts), 11 (retirement), 12 (the GC count) and, last,
14 (rule M: each live chunk marks its changed buckets; 13, the change
tracking, is the pure map's and checked here for both). The
fast one is the probe's checker in C: the same facts judged in the same
order, the same messages, without building a Python object per entry (an
export cost more than the map's own work: ``cowstate check`` ran the C map
slower than the pure one). ``fingerprint`` and ``check_map`` use the probe
for a C map unless ``reference=True``; a check takes the fingerprints of one
kind. ``tests/test_implementations.py`` requires both judges to accept
healthy maps and to name the same violation for every corruption the probe
can make.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from cowstate.serializers import is_known_immutable
from cowstate.state_map import StateMapSnapshot
from cowstate.state_table import CopyOnWriteStateTableSnapshot, StateTable
from cowstate_model import deep_copy
from cowstate_model.arithmetic import (
    MAXIMUM_CAPACITY,
    MINIMUM_CAPACITY,
    composite_hash,
    highest_required_version,
    snapshot_layout,
    threshold_for,
)
from cowstate_model.key_groups import assign_to_key_group, java_hash, murmur_hash
from cowstate_spec.cmap_view import (
    MAP_CLASSES,
    PROBE,
    MapView,
    SnapshotView,
    check_chunks_and_retirement,
    check_marks,
    check_spares,
    is_c_map,
    is_c_snapshot,
)
from cowstate_spec.cmap_view import view_of as view_of_map

if TYPE_CHECKING:
    from cowstate.rocksdb.table import RocksDBStateTable
    from cowstate_spec._cmap_probe import Fingerprint

__all__ = [
    "InvariantViolation",
    "SnapshotFingerprint",
    "TableFingerprint",
    "chain",
    "changed_keys",
    "check_map",
    "check_rocksdb_table",
    "check_table",
    "fingerprint",
    "rehash_step_check",
    "table_fingerprint",
]


def chain(head: Any) -> list[Any]:
    """The entries of one bucket, head first, following ``next``."""
    out = []
    e = head
    while e is not None:
        out.append(e)
        e = e.next
    return out


class InvariantViolation(AssertionError):
    """A structural invariant of the map does not hold."""


def _require(condition: bool, invariant: int, message: str) -> None:
    if not condition:
        raise InvariantViolation(f"invariant {invariant} violated: {message}")


@dataclass
class SnapshotFingerprint:
    """What one open snapshot could reach when it was opened."""

    snapshot: StateMapSnapshot[Any, Any, Any]
    heads: list[Any]
    # (entry, key, namespace, state object, next entry, deep copy of the state)
    entries: list[tuple[Any, Any, Any, Any, Any, Any]] = field(default_factory=list)


_NOT_RECORDED = object()


def fingerprint(
    snapshot: Any, *, values: bool = True, reference: bool = False
) -> SnapshotFingerprint | Fingerprint:
    """Record everything ``snapshot`` reaches; take it right after ``snapshot()``.

    With ``values=False`` only identities are recorded (no deep copies of the
    states): for callers that compare state values against the model anyway.
    A C map's snapshot is recorded by the probe (its checker's fingerprint),
    or with ``reference=True`` through its :class:`~cowstate_spec.cmap_view.
    SnapshotView` (the reference checker's).
    """
    if is_c_snapshot(snapshot):
        if not reference:
            assert PROBE is not None
            recorded = PROBE.fingerprint(
                snapshot, deep_copy if values else None, is_known_immutable
            )
            if isinstance(recorded, str):
                raise InvariantViolation(recorded)
            return recorded
        snapshot = SnapshotView(snapshot)
    data = snapshot._data
    assert data is not None, "fingerprint of a released snapshot"
    owner = snapshot._owner
    if owner._version == snapshot.version:  # nothing happened since snapshot()
        expected = snapshot_layout(owner._primary, owner._rehash, owner._rehash_index, len(owner))
        _require(
            len(data) == len(expected) and all(a is b for a, b in zip(data, expected, strict=True)),
            8,
            f"snapshot {snapshot.version} does not hold the map's buckets in the "
            f"compact layout: {len(data)} slots, expected {len(expected)}",
        )
        _require(
            snapshot._size == len(owner),
            8,
            f"snapshot {snapshot.version} says size {snapshot._size}, the map had {len(owner)}",
        )
    fp = SnapshotFingerprint(snapshot, list(data))
    for head in data:
        e = head
        while e is not None:
            fp.entries.append(
                (
                    e,
                    e.key,
                    e.namespace,
                    e.state,
                    e.next,
                    deep_copy(e.state) if values else _NOT_RECORDED,
                )
            )
            e = e.next
    return fp


def check_map(
    m: Any,
    snapshots: Iterable[SnapshotFingerprint | Fingerprint] = (),
    *,
    reference: bool = False,
) -> None:
    """Assert invariants 1-9 and 13 of ``m``; ``snapshots`` are the open ones'
    fingerprints. For the C map also invariants 10-12, 14 and 15: by the probe's
    checker when the fingerprints are the probe's (and ``reference`` is false),
    else by the reference (``cmap_view``: the export, ``check_chunks_and_retirement``,
    ``check_marks`` and ``check_spares``)."""
    fps = list(snapshots)
    by_reference = [fp for fp in fps if isinstance(fp, SnapshotFingerprint)]
    by_probe = [fp for fp in fps if not isinstance(fp, SnapshotFingerprint)]
    c_map = is_c_map(m)
    if by_probe and (reference or by_reference or not c_map):
        raise TypeError(
            "expected the fingerprints of one checker (fingerprint(..., reference=True) "
            "for the reference), got the probe's"
        )
    if not c_map:
        _check_map(m, by_reference)
    elif reference or by_reference:
        view = MapView(m)
        _check_map(view, by_reference)
        open_views = [fp.snapshot for fp in by_reference]
        check_chunks_and_retirement(view, open_views)
        check_marks(view)
        check_spares(view, open_views)
    else:
        assert PROBE is not None
        verdict = PROBE.check(m, by_probe)
        if verdict is not None:
            raise InvariantViolation(verdict)


def _check_map(m: Any, snapshots: Iterable[SnapshotFingerprint]) -> None:
    primary = m._primary
    rehash = m._rehash
    r = m._rehash_index
    capacity = len(primary)
    version = m._version
    required = m._highest_required

    # 9. growth: power-of-two capacities, threshold, load factor
    _require(
        MINIMUM_CAPACITY <= capacity <= MAXIMUM_CAPACITY and capacity & (capacity - 1) == 0,
        9,
        f"primary capacity {capacity} is not a power of two in [4, 2**30]",
    )
    _require(m._mask == capacity - 1, 9, f"mask {m._mask} != capacity - 1 = {capacity - 1}")
    if rehash is None:
        _require(r == 0, 2, f"rehash index {r} while not rehashing")
        _require(
            m._threshold == threshold_for(capacity),
            9,
            f"threshold {m._threshold} != {threshold_for(capacity)} for capacity {capacity}",
        )
        _require(
            len(m) <= m._threshold + 1,
            9,
            f"size {len(m)} above threshold {m._threshold} + 1 outside a rehash",
        )
    else:
        _require(
            len(rehash) == 2 * capacity,
            9,
            f"rehash table has {len(rehash)} buckets, expected 2 * {capacity}",
        )
        _require(
            m._threshold == threshold_for(2 * capacity),
            9,
            f"threshold {m._threshold} != {threshold_for(2 * capacity)} while rehashing",
        )
        _require(0 <= r < capacity, 2, f"rehash index {r} outside [0, {capacity})")

    # 5. version bookkeeping
    _require(
        required == highest_required_version(m._open_versions),
        5,
        f"highest required version {required} != max of open {sorted(m._open_versions)}",
    )
    _check_tracking(m)
    _require(
        all(0 < v <= version for v in m._open_versions),
        5,
        f"open versions {sorted(m._open_versions)} outside (0, {version}]",
    )

    snapshot_entries: set[int] = set()
    snapshot_states: set[int] = set()
    for fp in snapshots:
        for e, _k, _n, state, _next, _copy in fp.entries:
            snapshot_entries.add(id(e))
            if not is_known_immutable(state):
                snapshot_states.add(id(state))

    seen: set[tuple[Any, Any]] = set()
    total = len(m)
    counts = []
    for name, table in (("primary", primary), ("rehash", rehash)):
        count = 0
        if table is None:
            counts.append(0)
            continue
        length = len(table)
        for index, head in enumerate(table):
            if name == "primary" and rehash is not None:
                _require(
                    head is None or index >= r,
                    2,
                    f"primary bucket {index} < rehash index {r} is not empty",
                )
            e = head
            while e is not None:
                count += 1
                _require(
                    count <= total + 1,
                    3,
                    f"{name} table reaches more than len(map) = {total} entries (cycle?)",
                )
                composite = (e.key, e.namespace)
                # One cheap test per entry; the precise message is built on failure only.
                if not (
                    e.hash == composite_hash(e.key, e.namespace)
                    and e.hash & (length - 1) == index
                    and (name == "primary" or e.hash & (capacity - 1) < r)
                    and composite not in seen
                    and e.state is not None
                    and e.entry_version <= version
                    and e.state_version <= version
                    and (e.entry_version < required or id(e) not in snapshot_entries)
                    and (e.state_version < required or id(e.state) not in snapshot_states)
                ):
                    _diagnose_entry(
                        e,
                        name,
                        index,
                        length,
                        capacity,
                        r,
                        seen,
                        version,
                        required,
                        snapshot_entries,
                        snapshot_states,
                    )
                seen.add(composite)
                e = e.next
        counts.append(count)
    _require(
        counts[0] == m._primary_size,
        3,
        f"primary table holds {counts[0]} entries, counter says {m._primary_size}",
    )
    _require(
        counts[1] == m._rehash_size,
        3,
        f"rehash table holds {counts[1]} entries, counter says {m._rehash_size}",
    )

    for fp in snapshots:
        check_snapshot_unchanged(fp)


def changed_keys(m: Any, since: int) -> set[tuple[Any, Any]]:
    """The ``(key, namespace)`` of the map ``m``'s live entries whose
    ``state_version >= since`` (rule T of :mod:`cowstate.state_map`); a C map
    is read through its structure export."""
    if is_c_map(m):
        m = MapView(m)
    out: set[tuple[Any, Any]] = set()
    for tab in (m._primary, m._rehash or ()):
        for head in tab:
            for e in chain(head):
                if e.state_version >= since:
                    out.add((e.key, e.namespace))
    return out


def _check_tracking(m: Any) -> None:
    """Invariant 13 of :mod:`cowstate.state_map`: the guard and the removal log."""
    version = m._version
    log = m._removals
    if log is None:
        _require(m._guard == m._highest_required, 13, f"guard {m._guard} != H while not tracking")
        return
    since = m._tracking_since
    _require(m._guard == version, 13, f"guard {m._guard} != V = {version} while tracking")
    _require(since <= version + 1, 13, f"tracking since {since} > V + 1 = {version + 1}")
    _require(
        len(log) <= m._removal_limit,
        13,
        f"removal log of {len(log)} records above its limit {m._removal_limit}",
    )
    at = [record[0] for record in log]
    _require(at == sorted(at), 13, f"removal log versions {at} out of order")
    _require(
        all(since - 1 <= v <= version for v in at),
        13,
        f"removal log versions {at} outside [{since - 1}, {version}]",
    )


def check_snapshot_unchanged(fp: SnapshotFingerprint) -> None:
    """Invariant 8: nothing ``fp.snapshot`` reaches changed since it was opened."""
    snap = fp.snapshot
    if snap.is_released:
        return
    data = snap._data
    assert data is not None
    _require(
        len(data) == len(fp.heads) and all(a is b for a, b in zip(data, fp.heads, strict=True)),
        8,
        f"the bucket list of snapshot {snap.version} changed",
    )
    for e, key, namespace, state, successor, state_copy in fp.entries:
        if (
            e.key is key
            and e.namespace is namespace
            and e.state is state
            and e.next is successor
            and (state_copy is _NOT_RECORDED or state == state_copy)
        ):
            continue
        where = f"snapshot {snap.version}: entry ({key!r}, {namespace!r})"
        _require(e.key is key and e.namespace is namespace, 8, f"{where} changed its key")
        _require(e.state is state, 8, f"{where} now holds another state object {e.state!r}")
        _require(e.next is successor, 8, f"{where} now links to another successor")
        _require(
            state_copy is _NOT_RECORDED or state == state_copy,
            8,
            f"{where}: its state was mutated in place to {state!r}, was {state_copy!r}",
        )


def _diagnose_entry(
    e: Any,
    name: str,
    index: int,
    length: int,
    capacity: int,
    r: int,
    seen: set[tuple[Any, Any]],
    version: int,
    required: int,
    snapshot_entries: set[int],
    snapshot_states: set[int],
) -> None:
    """Raise the precise violation of an entry that failed the cheap test."""
    where = f"entry ({e.key!r}, {e.namespace!r}) in {name} bucket {index}"
    _require(
        e.hash == composite_hash(e.key, e.namespace),
        1,
        f"{where} caches hash {e.hash}, expected {composite_hash(e.key, e.namespace)}",
    )
    _require(
        e.hash & (length - 1) == index, 1, f"{where} belongs in bucket {e.hash & (length - 1)}"
    )
    _require(
        name == "primary" or e.hash & (capacity - 1) < r,
        2,
        f"{where}: its primary bucket {e.hash & (capacity - 1)} >= rehash index {r}, "
        "so it must still be in the primary table",
    )
    _require((e.key, e.namespace) not in seen, 4, f"{where} is reachable twice")
    _require(e.state is not None, 3, f"{where} has state None")
    _require(
        e.entry_version <= version and e.state_version <= version,
        5,
        f"{where} has versions ({e.entry_version}, {e.state_version}) above the map "
        f"version {version}",
    )
    _require(
        e.entry_version < required or id(e) not in snapshot_entries,
        6,
        f"{where} has entry version {e.entry_version} >= {required} but an open "
        "snapshot reaches it",
    )
    _require(
        e.state_version < required or id(e.state) not in snapshot_states,
        7,
        f"{where} has state version {e.state_version} >= {required} but an open "
        "snapshot reaches its state",
    )
    raise AssertionError(f"{where} failed the entry test but no invariant names why")


def rehash_step_check(m: Any) -> Callable[[], None]:
    """Record where ``m``'s rehash stands before a keyed operation; the returned
    function asserts invariant 9 after the operation succeeded: a rehash that
    was running moved whole buckets holding at least 4 entries, or finished.

    A table is known by identity: the list object of the pure map, the address
    of the directory of the C map (read by its probe, with the chain lengths,
    without an export)."""
    if is_c_map(m):
        return _c_rehash_step_check(m)
    before = view_of_map(m)
    if before._rehash is None:
        return _nothing
    rehash_table = _table_identity(before, "rehash")
    r = before._rehash_index
    lengths = [len(chain(head)) for head in before._primary]  # entries per bucket before

    def after() -> None:
        now = view_of_map(m)
        if now._rehash is None:
            _require(
                _table_identity(now, "primary") == rehash_table,
                9,
                "a running rehash ended without installing its table",
            )
            return
        _require(
            _table_identity(now, "rehash") == rehash_table,
            9,
            "a running rehash was replaced by another",
        )
        r_after = now._rehash_index
        _require(
            r_after > r,
            9,
            f"a keyed operation during a rehash did not move a bucket (index stays {r})",
        )
        moved = sum(lengths[r:r_after])
        _require(
            moved >= 4,
            9,
            f"a keyed operation moved buckets {r}..{r_after - 1} holding {moved} "
            "entries, expected at least 4 or the end of the rehash",
        )

    return after


def _c_rehash_step_check(m: Any) -> Callable[[], None]:
    """:func:`rehash_step_check` of a C map: the same judgement, from the probe's
    ``rehash_state`` (directory addresses, r, chain lengths) instead of views."""
    assert PROBE is not None
    probe = PROBE
    _primary, rehash_table, r, lengths = probe.rehash_state(m, True)
    if not rehash_table:
        return _nothing

    def after() -> None:
        primary, rehash, r_after, _ = probe.rehash_state(m, False)
        if not rehash:
            _require(
                primary == rehash_table, 9, "a running rehash ended without installing its table"
            )
            return
        _require(rehash == rehash_table, 9, "a running rehash was replaced by another")
        _require(
            r_after > r,
            9,
            f"a keyed operation during a rehash did not move a bucket (index stays {r})",
        )
        assert lengths is not None  # asked for while rehashing
        moved = sum(lengths[r:r_after])
        _require(
            moved >= 4,
            9,
            f"a keyed operation moved buckets {r}..{r_after - 1} holding {moved} "
            "entries, expected at least 4 or the end of the rehash",
        )

    return after


def _table_identity(m: Any, which: str) -> int:
    if isinstance(m, MapView):
        directory = m.primary_directory if which == "primary" else m.rehash_directory
        assert directory is not None
        return int(directory[0])
    return id(m._primary if which == "primary" else m._rehash)


def _nothing() -> None:
    return None


def owner_of(snapshot: Any) -> Any:
    """The map a (possibly viewed) snapshot was taken from."""
    return getattr(snapshot, "real", snapshot)._owner


# ------------------------------------------------------------------ tables


@dataclass
class TableFingerprint:
    """The fingerprints of one copy-on-write table snapshot, one per key group."""

    snapshot: CopyOnWriteStateTableSnapshot[Any, Any, Any]
    maps: list[SnapshotFingerprint | Fingerprint]


def table_fingerprint(
    snapshot: CopyOnWriteStateTableSnapshot[Any, Any, Any], *, values: bool = True
) -> TableFingerprint:
    """Fingerprint every key group's map snapshot; take it right after ``snapshot()``
    (``values`` as in :func:`fingerprint`)."""
    return TableFingerprint(
        snapshot,
        [fingerprint(snapshot.map_snapshot(kg), values=values) for kg in snapshot.key_group_range],
    )


def check_table(
    table: StateTable[Any, Any, Any], snapshots: Iterable[TableFingerprint] = ()
) -> None:
    """Assert a table's invariants: every mapping sits in the map of its key
    group (computed with the model's plain assignment, over the table's key
    serializer's bytes for keys without a Java hash), the size is the sum of
    the maps', and every copy-on-write map holds invariants 1-9 against the
    open snapshots of its key group."""
    fingerprints: dict[int, list[SnapshotFingerprint | Fingerprint]] = {}
    for table_fp in snapshots:
        for fp in table_fp.maps:
            if not fp.snapshot.is_released:  # its key group was written
                fingerprints.setdefault(id(owner_of(fp.snapshot)), []).append(fp)
    total = 0
    max_parallelism = table.max_parallelism
    key_bytes = table.key_serializer.serialize
    for key_group in table.key_group_range:
        m = table.state_map(key_group)
        for key, namespace, _state in m:
            actual = assign_to_key_group(key, max_parallelism, key_bytes)
            if actual != key_group:
                raise InvariantViolation(
                    f"table invariant (routing) violated: ({key!r}, {namespace!r}) is in the "
                    f"map of key group {key_group}, its key group is {actual}"
                )
        total += len(m)
        if isinstance(m, MAP_CLASSES):
            check_map(m, fingerprints.get(id(m), ()))
    if len(table) != total:
        raise InvariantViolation(
            f"table invariant (size) violated: len(table) = {len(table)}, the maps hold {total}"
        )


# ------------------------------------------------------------ the RocksDB table


def check_rocksdb_table(
    table: RocksDBStateTable[Any, Any, Any], snapshots: Iterable[object] = ()
) -> None:
    """Assert the RocksDB table's key layout over every raw entry of its column
    family, read with plain slicing (never the table's own encoder):

    - a RocksDB key is 2 bytes of key group, 4 of key length, the key's bytes
      and the namespace's bytes, and the key group is one of the table's;
    - the key group is the key's own (Flink's assignment, said plainly in
      :mod:`cowstate_model.key_groups`, over the table's key serializer);
    - key and namespace bytes are canonical: they decode to a key (namespace)
      that serializes to the very same bytes, so one mapping has one RocksDB key;
    - the value decodes to a state (never ``None``);
    - ``len(table)`` counts exactly these entries, and iterating the table
      yields them in key order.

    ``snapshots`` is ignored: the table has none (the backend's checkpoints are
    its snapshots).
    """
    key_serializer = table.key_serializer
    namespace_serializer = table.meta.namespace_serializer
    state_serializer = table.meta.state_serializer
    key_groups = table.key_group_range
    decoded = []
    for rocks_key, value in table.raw_items():
        where = f"RocksDB key {rocks_key!r}"
        if len(rocks_key) < 6:
            raise InvariantViolation(f"RocksDB layout violated: {where} is shorter than 6 bytes")
        key_group = int.from_bytes(rocks_key[:2], "big")
        length = int.from_bytes(rocks_key[2:6], "big")
        if 6 + length > len(rocks_key):
            raise InvariantViolation(
                f"RocksDB layout violated: {where} frames a key of {length} bytes, "
                f"{len(rocks_key) - 6} follow"
            )
        if key_group not in key_groups:
            raise InvariantViolation(
                f"RocksDB layout violated: {where} is in key group {key_group}, outside "
                f"{key_groups!r}"
            )
        key_bytes, namespace_bytes = rocks_key[6 : 6 + length], rocks_key[6 + length :]
        key = key_serializer.deserialize(key_bytes)
        namespace = namespace_serializer.deserialize(namespace_bytes)
        for what, data, again in (
            ("key", key_bytes, key_serializer.serialize(key)),
            ("namespace", namespace_bytes, namespace_serializer.serialize(namespace)),
        ):
            if again != data:
                raise InvariantViolation(
                    f"RocksDB layout violated: the {what} bytes of {where} are not "
                    f"canonical: they decode to {key if what == 'key' else namespace!r}, "
                    f"which serializes to {again!r}"
                )
        own = murmur_hash(java_hash(key, key_serializer.serialize)) % table.max_parallelism
        if own != key_group:
            raise InvariantViolation(
                f"RocksDB routing violated: ({key!r}, {namespace!r}) is stored in key group "
                f"{key_group}, its key group is {own}"
            )
        state = state_serializer.deserialize(value)
        if state is None:
            raise InvariantViolation(f"RocksDB values violated: {where} holds None")
        decoded.append((key, namespace, state))
    if len(table) != len(decoded):
        raise InvariantViolation(
            f"RocksDB size violated: len(table) = {len(table)}, the column family holds "
            f"{len(decoded)} entries of the table"
        )
    listed = [tuple(entry) for entry in table]
    if listed != decoded:
        raise InvariantViolation(
            f"RocksDB iteration violated: the table yields {listed!r}, its column family "
            f"holds {decoded!r} in key order"
        )
