"""The C map's structure, seen the way the checker sees the pure map.

``cowstate._cmap`` keeps its entries as C structs and exports nothing of
them: the test-only probe :mod:`cowstate_spec._cmap_probe` (built beside it
from ``spec/cowstate_spec/_cmap_probe.c``, reading the structs through
``impl/cowstate/_cmap.h``) does. ``probe.structure(m)`` and
``probe.snapshot_structure(snapshot)`` export every table, chunk and entry
as plain tuples. This module turns an export into objects with the pure
map's internal attributes (``_primary``, ``_rehash``, entries with ``key``,
``namespace``, ``state``, ``hash``, ``next``, ``entry_version``,
``state_version``), so :mod:`cowstate_spec.invariants` judges both maps with
the same code and the model's plain arithmetic: the reference checker. The
probe's own checker (``probe.check``, in C, the one the machines and
``cowstate check`` run on the C map) must agree with it.

:data:`PROBE` is the probe, or ``None`` where it did not import (the C map was
not built, or the probe not with it: :data:`PROBE_ERROR` says why). Without
it the C map cannot be checked, so :data:`C_MAP_CLASS`, the C map the
specification checks, is ``None`` too. The probe reads a map only after
checking its exact type and the layout version both modules compiled in.

Identity is what invariants 6-8 are about, so entry views are interned by
the entry's address, per map: the view of one C entry is the same Python
object in every export while the entry lives, and each export refreshes its
fields. A snapshot keeps its entries alive, so a fingerprinted entry's address
is never reused while the fingerprint is checked.

The C map's own invariants 10 (chunk counts), 11 (retirement) and 12 (the
count of entries the garbage collector must visit), from the header of
``_cmap.c``, are checked by :func:`check_chunks_and_retirement`; 14 (rule M:
each live chunk marks its buckets that changed) by :func:`check_marks`, from
the marks the export carries per chunk of each live table
(``MapView.primary_marks``, ``rehash_marks``).
"""

from __future__ import annotations

import itertools
import weakref
from collections import Counter
from collections.abc import Iterable
from typing import Any

from cowstate.maps import c_map_class
from cowstate.state_map import CopyOnWriteStateMap as PureMap

try:
    from cowstate_spec import _cmap_probe as _probe
except ImportError as exc:  # no C map, or the probe did not build with it
    _probe = None  # type: ignore[assignment]
    PROBE_ERROR: str | None = f"{type(exc).__name__}: {exc}"
else:
    PROBE_ERROR = None

__all__ = [
    "C_MAP_CLASS",
    "MAP_CLASSES",
    "PROBE",
    "PROBE_ERROR",
    "EntryView",
    "MapView",
    "SnapshotView",
    "check_chunks_and_retirement",
    "check_marks",
    "is_c_map",
    "is_c_snapshot",
    "rehash_progress",
    "view_of",
    "view_of_snapshot",
]

#: The probe (``cowstate_spec._cmap_probe``), or None where it did not import.
PROBE = _probe
#: The C map the specification checks: built, and its probe with it.
C_MAP_CLASS: type[Any] | None = None if PROBE is None else c_map_class()
_HAVE_GC = 1 << 14  # Py_TPFLAGS_HAVE_GC
#: Every map class the checker knows: the pure map and, when checkable, the C map.
MAP_CLASSES: tuple[type[Any], ...] = (PureMap,) if C_MAP_CLASS is None else (PureMap, C_MAP_CLASS)


def is_c_map(m: object) -> bool:
    """A map of ``cowstate._cmap`` or of a build the probe attached (exact type)."""
    return PROBE is not None and PROBE.is_map(m)


def is_c_snapshot(s: object) -> bool:
    return PROBE is not None and PROBE.is_snapshot(s)


def _require_probe() -> Any:
    if PROBE is None:
        raise RuntimeError(f"the C map's probe did not import: {PROBE_ERROR}")
    return PROBE


class EntryView:
    """One C entry, as the pure map's ``_Entry`` reads (refreshed per export)."""

    __slots__ = (
        "__weakref__",
        "address",
        "entry_version",
        "hash",
        "key",
        "namespace",
        "next",
        "next_address",
        "state",
        "state_version",
    )

    def __init__(self, address: int) -> None:
        self.address = address
        self.next: EntryView | None = None
        self.key: Any = None
        self.namespace: Any = None
        self.state: Any = None
        self.hash = 0
        self.next_address = 0
        self.entry_version = 0
        self.state_version = 0

    def __repr__(self) -> str:
        return (
            f"EntryView({self.key!r}, {self.namespace!r}, {self.state!r}, "
            f"ev={self.entry_version}, sv={self.state_version})"
        )


# map -> {address: EntryView}; a snapshot's views live in its owner's registry
_REGISTRIES: weakref.WeakKeyDictionary[Any, dict[int, EntryView]] = weakref.WeakKeyDictionary()


def _registry(m: Any) -> dict[int, EntryView]:
    registry = _REGISTRIES.get(m)
    if registry is None:
        registry = _REGISTRIES[m] = {}
    return registry


def _heads(
    registry: dict[int, EntryView],
    chains: Iterable[tuple[tuple[Any, ...], ...]],
    cut: bool = False,
) -> list[EntryView | None]:
    """Entry views for exported chains (records head first); the heads. A cut
    export (the probe stopped a walk longer than the map can hold: a cycle)
    ends in the middle of its last non-empty chain."""
    heads: list[EntryView | None] = []
    chains = list(chains)
    last = max((i for i, records in enumerate(chains) if records), default=-1)
    for index, records in enumerate(chains):
        views = []
        for address, key, namespace, state, h, next_address, ev, sv in records:
            v = registry.get(address)
            if v is None:
                v = registry[address] = EntryView(address)
            v.key, v.namespace, v.state, v.hash = key, namespace, state, h
            v.next_address, v.entry_version, v.state_version = next_address, ev, sv
            views.append(v)
        for a, b in itertools.pairwise(views):
            a.next = b
        if views:
            views[-1].next = None
            # a next pointer the export did not follow would be a broken chain
            for v in views[:-1] if cut and index == last else views:
                expected = 0 if v.next is None else v.next.address
                if v.next_address != expected:
                    raise AssertionError(f"export of {v!r} lost its successor")
        heads.append(views[0] if views else None)
    return heads


#: One chunk's marks as exported: (marks_since, the indexes of its set bits).
Marks = tuple[int, tuple[int, ...]]


class MapView:
    """The pure map's internal attributes, read from one export of a C map."""

    def __init__(self, m: Any) -> None:
        self.real = m
        st = _require_probe().structure(m)
        self.structure = st
        registry = _registry(m)
        primary_dir, primary_chains = st["primary"]
        self._primary: list[EntryView | None] = _heads(registry, primary_chains, st["primary_cut"])
        self.primary_directory = primary_dir
        if st["rehash"] is None:
            self._rehash: list[EntryView | None] | None = None
            self.rehash_directory = None
        else:
            rehash_dir, rehash_chains = st["rehash"]
            self._rehash = _heads(registry, rehash_chains, st["rehash_cut"])
            self.rehash_directory = rehash_dir
        self._rehash_index: int = st["rehash_index"]
        self._primary_size: int = st["primary_size"]
        self._rehash_size: int = st["rehash_size"]
        self._threshold: int = st["threshold"]
        self._version: int = st["version"]
        self._highest_required: int = st["highest_required"]
        self._open_versions = frozenset(st["open_versions"])
        self._mask = len(self._primary) - 1
        self._mod_count: int = st["mod_count"]
        self._structure_count: int = st["structure_count"]
        #: (version, addresses) of the retired batches, oldest first
        self.retired: list[tuple[int, tuple[int, ...]]] = st["retired"]
        #: addresses of the entries handed back to the owner (rule G), not freed yet
        self.garbage: tuple[int, ...] = st["garbage"]
        self.gc_entries: int = st["gc_entries"]
        #: change tracking (rules T and D, invariant 13), as the pure map's attributes
        self._guard: int = st["guard"]
        self._removals: list[tuple[int, Any, Any]] | None = st["removals"]
        self._tracking_since: int = st["tracking_since"]
        self._removal_limit: int = st["removal_limit"]
        #: rule M (invariant 14): per chunk of each live table, None (never
        #: allocated) or (marks_since, the indexes of its set bits, ascending);
        #: rehash_marks is None outside a rehash
        self.primary_marks: tuple[Marks | None, ...] = st["primary_marks"]
        self.rehash_marks: tuple[Marks | None, ...] | None = st["rehash_marks"]
        #: rule P (invariant 15): the count of spare chunks, and the list as
        #: walked (at most that count plus one), (address, refs) each
        self.nspare: int = st["nspare"]
        self.spares: tuple[tuple[int, int], ...] = st["spares"]

    def __len__(self) -> int:
        return self._primary_size + self._rehash_size


class SnapshotView:
    """A C snapshot as the checker reads a pure one; ``_data`` re-exports."""

    def __init__(self, snapshot: Any) -> None:
        self.real = snapshot
        self.version: int = snapshot.version
        structure = _require_probe().snapshot_structure(snapshot)
        self._size: int = 0 if structure is None else structure["size"]

    @property
    def is_released(self) -> bool:
        return bool(self.real.is_released)

    @property
    def _owner(self) -> MapView:
        return MapView(self.real._owner)

    @property
    def _data(self) -> list[EntryView | None] | None:
        structure = _require_probe().snapshot_structure(self.real)
        if structure is None:
            return None
        heads = _heads(_registry(self.real._owner), structure["chains"], structure["cut"])
        # the pure map pads its compact layout with None up to the size
        heads.extend([None] * (self._size - len(heads)))
        return heads

    def directories(self) -> list[Any]:
        structure = _require_probe().snapshot_structure(self.real)
        if structure is None:
            return []
        return [d for d in (structure["primary"], structure["rehash"]) if d is not None]


def rehash_progress(m: Any) -> tuple[int, int] | None:
    """``(r, L)`` of a pure or C map's running rehash (its index and the old
    capacity), or None outside one. A C map's probe answers without exporting
    its tables."""
    if is_c_map(m):
        progress: tuple[int, int] | None = _require_probe().rehash_progress(m)
        return progress
    if m._rehash is None:
        return None
    return m._rehash_index, len(m._primary)


def states_held_by_views(m: Any) -> Counter[int]:
    """How many entry views of ``m`` hold each state (by ``id``): a view outlives
    its entry until the address is exported again, so a lifetime check
    (:mod:`cowstate_spec.collected`) discounts these references. Other maps
    have no views (and need not take weak references)."""
    if not is_c_map(m):
        return Counter()
    registry = _REGISTRIES.get(m)
    return Counter(id(v.state) for v in registry.values()) if registry else Counter()


def view_of(m: Any) -> Any:
    """``m`` itself for a pure map, a :class:`MapView` for a C map."""
    return MapView(m) if is_c_map(m) else m


def view_of_snapshot(s: Any) -> Any:
    return SnapshotView(s) if is_c_snapshot(s) else s


def check_chunks_and_retirement(m: Any, snapshots: Iterable[Any]) -> None:
    """Invariants 10 and 11 of the C map, when every open snapshot is known.

    ``snapshots`` are :class:`SnapshotView` objects of ``m``; with fewer than the
    map's open versions the counts cannot be judged and only the part of 11
    that needs no snapshot is checked.
    """
    from cowstate_spec.invariants import InvariantViolation

    view = m if isinstance(m, MapView) else MapView(m)
    live: set[int] = set()
    holding_gc = 0
    for table in (view._primary, view._rehash or []):
        for head in table:
            e = head
            while e is not None:
                live.add(e.address)
                holding_gc += any(
                    type(x).__flags__ & _HAVE_GC for x in (e.key, e.namespace, e.state)
                )
                e = e.next
    if view.gc_entries != holding_gc:
        raise InvariantViolation(
            f"invariant 12 violated: the map counts {view.gc_entries} live entries holding "
            f"an object of a GC type, {holding_gc} do"
        )
    retired: dict[int, int] = {}
    versions = [version for version, _ in view.retired]
    if versions != sorted(versions):
        raise InvariantViolation(f"invariant 11 violated: batches out of order {versions}")
    oldest_open = min(view._open_versions, default=None)
    for version, addresses in view.retired:
        if oldest_open is None or version < oldest_open:
            raise InvariantViolation(
                f"invariant 11 violated: batch {version} outlives every snapshot that could "
                f"reach it (oldest open: {oldest_open})"
            )
        for address in addresses:
            if address in live:
                raise InvariantViolation(
                    f"invariant 11 violated: entry {address:#x} is retired in batch {version} "
                    "but the live table reaches it"
                )
            retired.setdefault(address, version)
    for address in view.garbage:  # rule G: handed back, neither live nor retired
        if address in live:
            raise InvariantViolation(
                f"invariant 11 violated: entry {address:#x} was handed back to the owner but "
                "the live table reaches it"
            )
        if address in retired:
            raise InvariantViolation(
                f"invariant 11 violated: entry {address:#x} was handed back to the owner and "
                "is retired too"
            )
    open_views = [s for s in snapshots if not s.is_released]
    if len(open_views) != len(view._open_versions):
        return
    # 10: each chunk counts the directories holding it
    directories = [d for d in (view.primary_directory, view.rehash_directory) if d is not None]
    for s in open_views:
        directories.extend(s.directories())
    held: Counter[int] = Counter()
    refs: dict[int, int] = {}
    for _address, _capacity, _slots, chunks in directories:
        for chunk, count in chunks:
            if chunk:
                held[chunk] += 1
                refs[chunk] = count
    for chunk, count in held.items():
        if refs[chunk] != count:
            raise InvariantViolation(
                f"invariant 10 violated: chunk {chunk:#x} counts {refs[chunk]} directories, "
                f"{count} hold it"
            )
    # 11: what a snapshot reaches is live, or retained in a batch at least as new
    for s in open_views:
        for head in s._data or []:
            e = head
            while e is not None:
                if e.address not in live and retired.get(e.address, -1) < s.version:
                    raise InvariantViolation(
                        f"invariant 11 violated: snapshot {s.version} reaches entry "
                        f"({e.key!r}, {e.namespace!r}), which is neither live nor retained "
                        f"for it (batch {retired.get(e.address)})"
                    )
                e = e.next


def check_marks(m: Any) -> None:
    """Invariant 14 of the C map (rule M of ``_cmap.c``), the last it checks.

    While the map tracks changes, per live table (primary, then rehash) and
    allocated chunk in directory order: its ``marks_since`` is at most V, no
    bit is set beyond its buckets, and every entry of its buckets (in bucket
    order, each chain head first) whose ``state_version`` is at least
    ``max(marks_since, tracking_since)`` has its bucket's bit set. Not
    tracking: no claim.
    """
    from cowstate_spec.invariants import InvariantViolation

    view = m if isinstance(m, MapView) else MapView(m)
    if view._removals is None:
        return
    version = view._version
    for name, table, directory, marks in (
        ("primary", view._primary, view.primary_directory, view.primary_marks),
        ("rehash", view._rehash, view.rehash_directory, view.rehash_marks),
    ):
        if table is None or directory is None or marks is None:
            continue
        slots = directory[2]
        for index, chunk in enumerate(marks):
            if chunk is None:
                continue
            since, bits = chunk
            if since > version:
                raise InvariantViolation(
                    f"invariant 14 violated: {name} chunk {index} has marks since {since} "
                    f"> V = {version}"
                )
            stray = [bit for bit in bits if bit >= slots]
            if stray:
                raise InvariantViolation(
                    f"invariant 14 violated: {name} chunk {index} of {slots} buckets marks "
                    f"bucket {stray[0]} of it"
                )
            bound = max(since, view._tracking_since)
            marked = set(bits)
            first = index * slots
            for bucket in range(first, first + slots):
                e = table[bucket]
                while e is not None:
                    if e.state_version >= bound and bucket - first not in marked:
                        raise InvariantViolation(
                            f"invariant 14 violated: entry ({e.key!r}, {e.namespace!r}) in "
                            f"{name} bucket {bucket} has state version {e.state_version} >= "
                            f"{bound} but its chunk does not mark the bucket"
                        )
                    e = e.next


def check_spares(m: Any, snapshots: Iterable[Any]) -> None:
    """Invariant 15 of the C map (rule P of ``_cmap.c``), checked last.

    The spare list as walked holds ``nspare`` chunks, no more than the slots
    of the live directories; each has ``refs`` 0 and no live directory holds
    one, nor an open snapshot's when every open snapshot is known
    (``snapshots``: :class:`SnapshotView` objects, as for invariant 10).
    """
    from cowstate_spec.invariants import InvariantViolation

    view = m if isinstance(m, MapView) else MapView(m)
    walked = len(view.spares)
    if walked != view.nspare:
        more = walked > view.nspare
        raise InvariantViolation(
            f"invariant 15 violated: the map counts {view.nspare} spare chunks, its list holds "
            f"{'more than ' if more else ''}{view.nspare if more else walked}"
        )
    live = [d for d in (view.primary_directory, view.rehash_directory) if d is not None]
    limit = sum(len(chunks) for _address, _capacity, _slots, chunks in live)
    if view.nspare > limit:
        raise InvariantViolation(
            f"invariant 15 violated: the map keeps {view.nspare} spare chunks, its "
            f"directories have {limit} slots"
        )
    open_views = [s for s in snapshots if not s.is_released]
    held: set[int] = set()
    if len(open_views) == len(view._open_versions):
        for s in open_views:
            for _address, _capacity, _slots, chunks in s.directories():
                held.update(chunk for chunk, _refs in chunks if chunk)
    for spare, refs in view.spares:
        if refs != 0:
            raise InvariantViolation(
                f"invariant 15 violated: spare chunk {spare:#x} counts {refs} directories"
            )
        for name, directory in (
            ("primary", view.primary_directory),
            ("rehash", view.rehash_directory),
        ):
            chunks = [] if directory is None else directory[3]
            for index, (chunk, _refs) in enumerate(chunks):
                if chunk == spare:
                    raise InvariantViolation(
                        f"invariant 15 violated: spare chunk {spare:#x} is chunk {index} of "
                        f"the live {name} table"
                    )
        if spare in held:
            raise InvariantViolation(
                f"invariant 15 violated: spare chunk {spare:#x} is held by an open snapshot"
            )
