"""Every implementation the specification checks.

Adding an implementation to the whole suite costs one line: a map in
:data:`IMPLEMENTATIONS` (a name, a factory, and the structural checker for its
internals, or ``None`` when it has no internals worth checking), a state
table in :data:`TABLE_TYPES` (which also puts it in ``IMPLEMENTATIONS``, over
all key groups and over a sub-range).

Implementations differ where the contract lets them; each difference is a
:class:`Capabilities` flag the state machine and the table tests consult,
never a missing entry. The RocksDB table, for one, has no table snapshots
(its snapshots are the backend's RocksDB checkpoints), does not say whether
``put`` inserted, hands out fresh copies of its states and does not fail fast.
"""

from __future__ import annotations

import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast

from cowstate.arithmetic import DEFAULT_CAPACITY
from cowstate.errors import ConcurrentModificationError, CowStateError
from cowstate.key_groups import DEFAULT_LOWER_BOUND_MAX_PARALLELISM, KeyGroupRange
from cowstate.nested_table import NestedMapsStateTable
from cowstate.protocols import KeyedTable
from cowstate.serializers import PickleSerializer, StateSerializer
from cowstate.state_map import CopyOnWriteStateMap
from cowstate.state_meta import StateMetaInfo
from cowstate.state_table import CopyOnWriteStateTable, MapFactory
from cowstate_model import ReferenceStateMap
from cowstate_model.state_table import ReferenceStateTable
from cowstate_spec.cmap_view import C_MAP_CLASS, PROBE_ERROR
from cowstate_spec.invariants import (
    SnapshotFingerprint,
    TableFingerprint,
    check_map,
    check_rocksdb_table,
    check_table,
    fingerprint,
    rehash_step_check,
    table_fingerprint,
)

if TYPE_CHECKING:
    from rocksdict import Rdict

    from cowstate.rocksdb.table import RocksDBStateTable
    from cowstate_spec._cmap_probe import Fingerprint

__all__ = [
    "C_MAP",
    "IMPLEMENTATIONS",
    "SUB_RANGE",
    "TABLE_MAX_PARALLELISM",
    "TABLE_TYPES",
    "TRACKED",
    "TRACKED_REMOVAL_LIMIT",
    "CMapsTable",
    "Capabilities",
    "Implementation",
    "PureMapsTable",
    "TableMaker",
    "TableType",
    "by_name",
    "close_rocksdb_table",
    "rocksdb_table",
    "table_implementation",
]

Checker = Callable[[Any, Sequence[Any]], None]
Fingerprinter = Callable[..., "SnapshotFingerprint | Fingerprint | TableFingerprint"]
#: Called before a keyed operation; what it returns is called after it succeeded.
StepChecker = Callable[[Any], Callable[[], None]]

TableT = TypeVar("TableT", bound="KeyedTable[Any, Any, Any]")
TableT_co = TypeVar("TableT_co", bound="KeyedTable[Any, Any, Any]", covariant=True)


@dataclass(frozen=True)
class Capabilities:
    """Where an implementation legitimately departs from the heap map's contract.

    - ``snapshots``: ``snapshot()`` and ``release(snapshot)``, with per-key-group
      contents and releases for a table. The RocksDB table has none: its
      snapshots are the backend's RocksDB checkpoints.
    - ``put_reports_insert``: ``put`` returns True for a new mapping, False for
      a replaced one. The RocksDB table returns ``None`` (knowing would cost a
      read).
    - ``mutations_persist``: a state ``get`` returns is the stored object, so
      mutating it in place changes the mapping (until the next snapshot).
      False where it is a fresh copy (RocksDB: mutating it changes nothing).
    - ``fail_fast``: adding or removing a mapping while iterating raises
      ``concurrent_modification`` (``ConcurrentModificationError``). RocksDB's
      iteration reads in chunks and sees such a change or not, never raising.
    - ``refuses_none``: ``put`` of ``None`` is refused (``None`` means absent).
    - ``frees_states``: a state the map maps no more (replaced or removed) has
      no reference left once no open snapshot holds it, so the machines and
      the differential runner watch the lifetimes of the states it is given
      (:mod:`cowstate_spec.collected`) and fail a leaked reference. False
      where that cannot be seen or is not promised: a map in a child process
      (:mod:`cowstate_spec.process_impl`: its objects are out of this
      process's reach), or someone else's map that keeps states on purpose
      (a cache, a free list). A state table's states are watched through
      its maps' own checks, never the table's.
    - ``refusals``: the exceptions bad input is refused with (cowstate's
      hierarchy; an implementation of someone else names its own, e.g.
      ``(ValueError, TypeError)``): any other exception is a crash.
    - ``concurrent_modification``: what a failing-fast iterator raises.
    - ``tracks_changes``: the map tracks changes (rules T and D of
      :mod:`cowstate.state_map`, turned on by its factory): the machine adds
      the rule that takes a base and checks the changes since it
      (:class:`~cowstate_spec.machine.ChangeTracking`). Off for the others.

    An implementation checked through :mod:`cowstate_spec.conformance` says
    what it lacks here; :func:`cowstate_spec.conformance.skipped_checks` names
    the checks that are then skipped.
    """

    snapshots: bool = True
    put_reports_insert: bool = True
    mutations_persist: bool = True
    fail_fast: bool = True
    refuses_none: bool = True
    frees_states: bool = True
    refusals: tuple[type[BaseException], ...] = (CowStateError,)
    concurrent_modification: type[BaseException] = ConcurrentModificationError
    tracks_changes: bool = False


#: The copy-on-write maps and the heap tables: everything.
HEAP = Capabilities()
#: A copy-on-write map that tracks changes (``tracks_changes``).
TRACKED = Capabilities(tracks_changes=True)
#: The RocksDB table (see :class:`Capabilities`).
ROCKSDB = Capabilities(
    snapshots=False, put_reports_insert=False, mutations_persist=False, fail_fast=False
)


def _keep(instance: object) -> None:
    """Nothing to free: the garbage collector takes a heap map or table."""


@dataclass(frozen=True)
class Implementation:
    """How to make one implementation and how to check its internals.

    ``factory(**options)`` makes a fresh, empty instance; the only option is
    ``initial_capacity`` (implementations without one ignore it). ``model()``
    makes the reference it is compared with: the plain map, or for a state
    table the reference table of the same key groups (``table`` is then
    true and the state machine adds the key-group rules). ``check`` asserts
    the structural invariants, ``fingerprint`` records what an open snapshot
    reaches, ``step_check`` watches one keyed operation (rehash progress);
    each is ``None`` where the implementation has no such internals.
    ``capabilities`` say what the machine may expect; ``close(instance)``
    frees what the factory took (the machine calls it in its teardown).
    ``example_share`` is the share of the profile's examples the machine
    runs on it (an implementation slow to make runs fewer). ``memory_unsafe``: its
    memory is managed by hand (the C maps, and the tables of them), so a
    broken bookkeeping can free what an open snapshot reaches and a read
    through that snapshot may crash the process; the differential runner
    then judges its structure before each release's read
    (:mod:`cowstate_spec.differential`, "Structure first").
    """

    name: str
    factory: Callable[..., Any]
    check: Checker | None = None
    fingerprint: Fingerprinter | None = None
    step_check: StepChecker | None = None
    model: Callable[[], Any] = ReferenceStateMap
    table: bool = False
    capabilities: Capabilities = HEAP
    close: Callable[[Any], None] = _keep
    example_share: float = 1.0
    memory_unsafe: bool = False

    def create(self, initial_capacity: int | None = None) -> Any:
        """A fresh instance, with ``initial_capacity`` if given."""
        if initial_capacity is None:
            return self.factory()
        return self.factory(initial_capacity=initial_capacity)

    def __repr__(self) -> str:
        return self.name


#: The removal-log bound of the map the machines run with change tracking
#: (small: the machines reach its overflow, after which deltas are refused).
TRACKED_REMOVAL_LIMIT = 6


def _cow(
    name: str,
    capacity: int,
    cls: type[Any] = CopyOnWriteStateMap,
    *,
    tracked: bool = False,
    memory_unsafe: bool = False,
) -> Implementation:
    def factory(initial_capacity: int = capacity) -> Any:
        m = cls(initial_capacity=initial_capacity)
        if tracked:  # rules T and D of cowstate.state_map; the machine checks them
            m.track_changes(TRACKED_REMOVAL_LIMIT)
        return m

    return Implementation(
        name,
        factory,
        check_map,
        fingerprint,
        rehash_step_check,
        capabilities=TRACKED if tracked else HEAP,
        memory_unsafe=memory_unsafe,
    )


#: The C map (cowstate._cmap), or None where it was not built or its probe
#: (cowstate_spec._cmap_probe, which checks it) not with it; a test fails then
#: unless COWSTATE_PURE_PYTHON=1 (tests/test_implementations.py).
C_MAP = C_MAP_CLASS


class PureMapsTable(CopyOnWriteStateTable[Any, Any, Any]):
    """A copy-on-write table over pure-Python maps, whatever the default is."""

    map_class = CopyOnWriteStateMap


class CMapsTable(CopyOnWriteStateTable[Any, Any, Any]):
    """A copy-on-write table over C maps (used only where C_MAP was built)."""

    map_class = cast(MapFactory, C_MAP if C_MAP is not None else CopyOnWriteStateMap)


class TableMaker(Protocol[TableT_co]):
    """What makes a table: a table class, or a function with its arguments."""

    def __call__(
        self,
        key_group_range: KeyGroupRange | None,
        max_parallelism: int,
        *,
        meta: StateMetaInfo | None,
        key_serializer: StateSerializer | None,
        initial_capacity: int,
    ) -> TableT_co: ...


@dataclass(frozen=True)
class TableType(Generic[TableT]):
    """One kind of state table, as the table machine and the table tests use it.

    Calling it makes a table with the heap tables' arguments (every key group
    of ``max_parallelism`` by default; ``initial_capacity`` is a heap table's
    knob). ``check`` and ``fingerprint`` judge its internals (``None``:
    nothing to judge), ``capabilities`` say what it offers, and
    ``close(table)`` frees what making it took: a test that makes tables
    closes each when it ends (``tests/conftest.py``: the ``table_type``
    fixture). ``example_share`` and ``memory_unsafe`` (a table of C maps) go to the
    machine's implementations.
    """

    name: str
    make: TableMaker[TableT]
    check: Checker | None = check_table
    fingerprint: Fingerprinter | None = None
    capabilities: Capabilities = HEAP
    close: Callable[[TableT], None] = _keep
    example_share: float = 1.0
    memory_unsafe: bool = False

    def __call__(
        self,
        key_group_range: KeyGroupRange | None = None,
        max_parallelism: int = DEFAULT_LOWER_BOUND_MAX_PARALLELISM,
        *,
        meta: StateMetaInfo | None = None,
        key_serializer: StateSerializer | None = None,
        initial_capacity: int = DEFAULT_CAPACITY,
    ) -> TableT:
        return self.make(
            key_group_range,
            max_parallelism,
            meta=meta,
            key_serializer=key_serializer,
            initial_capacity=initial_capacity,
        )

    def __repr__(self) -> str:
        return self.name


# ------------------------------------------------------------ the RocksDB table

#: The database under each RocksDB table :func:`rocksdb_table` made, closed and
#: deleted by :func:`close_rocksdb_table` (or when the table is collected).
_DATABASES: weakref.WeakKeyDictionary[RocksDBStateTable[Any, Any, Any], Callable[[], object]] = (
    weakref.WeakKeyDictionary()
)


def rocksdb_table(
    key_group_range: KeyGroupRange | None,
    max_parallelism: int,
    *,
    meta: StateMetaInfo | None,
    key_serializer: StateSerializer | None,
    initial_capacity: int = DEFAULT_CAPACITY,
    table_class: type[RocksDBStateTable[Any, Any, Any]] | None = None,
) -> RocksDBStateTable[Any, Any, Any]:
    """A RocksDB table in a database of its own, under the spec's RocksDB root
    (tmpfs where it has room). ``initial_capacity`` is ignored; ``table_class``
    is a subclass to make instead (a deliberately broken one). Close it with
    :func:`close_rocksdb_table`.

    ``cowstate.rocksdb`` is imported here, not at the top: rocksdict is an
    optional dependency (the ``rocksdb`` extra) that the maps do not need.
    """
    from rocksdict import Options, Rdict

    from cowstate.rocksdb.table import RocksDBStateTable
    from cowstate_spec.backends import _rocksdb_snapshot_root  # the backends' root too

    path = tempfile.mkdtemp(prefix="table-", dir=_rocksdb_snapshot_root())
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.set_keep_log_file_num(1)
    db = Rdict(path, options)
    try:
        table: RocksDBStateTable[Any, Any, Any] = (table_class or RocksDBStateTable)(
            db.create_column_family("state", options),
            key_group_range,
            max_parallelism,
            # The spec's namespaces include HashKeys, user objects the default
            # serializer refuses: pickle them (in-process, trusted), as the keys.
            meta=meta
            or StateMetaInfo(
                "state",
                namespace_serializer=PickleSerializer(),
                state_serializer=PickleSerializer(),
            ),
            key_serializer=key_serializer,
        )
    except BaseException:
        _drop_database(db, path)
        raise
    _DATABASES[table] = weakref.finalize(table, _drop_database, db, path)
    return table


def close_rocksdb_table(table: RocksDBStateTable[Any, Any, Any]) -> None:
    """Detach ``table`` and delete its database (a table of :func:`rocksdb_table`)."""
    table.detach()
    _DATABASES.pop(table)()


def _drop_database(db: Rdict, path: str) -> None:
    try:
        db.close()
    finally:
        shutil.rmtree(path, ignore_errors=True)


# --------------------------------------------------------------- the tables

#: The tables' key groups in the machine: 8 in all; the sub-range tables hold
#: 1..6, so a third of the spec's keys (2, 4, 8, HashKey(3, 0), ...) are refused.
TABLE_MAX_PARALLELISM = 8
SUB_RANGE = KeyGroupRange(1, 6)
#: The tables' key serializer: the spec's keys include ``HashKey``s, user
#: objects the default serializer refuses, so the tables hash them (and would
#: write them) with pickle -- in-process, trusted; the models hash the same bytes.
TABLE_KEY_SERIALIZER = PickleSerializer()

#: Every state table. The copy-on-write ones over both maps (the C map where it
#: was built), the nested-dict one, the RocksDB one.
TABLE_TYPES: list[TableType[Any]] = [
    TableType("cow-table", PureMapsTable, fingerprint=table_fingerprint),
    TableType("nested-table", NestedMapsStateTable),
    TableType(
        "rocksdb-table",
        rocksdb_table,
        check_rocksdb_table,
        capabilities=ROCKSDB,
        close=close_rocksdb_table,
        example_share=1 / 3,  # a database per example: about 2.5 times a heap table's time
    ),
]
if C_MAP is not None:
    TABLE_TYPES.insert(
        1, TableType("c-table", CMapsTable, fingerprint=table_fingerprint, memory_unsafe=True)
    )


def table_implementation(
    table_type: TableType[Any], key_groups: KeyGroupRange | None, name: str | None = None
) -> Implementation:
    """``table_type`` in the machine over ``key_groups`` of 8 (None: all), against
    the reference table of the same key groups. Named after the table type
    (``-sub-range`` over a sub-range) unless ``name`` is given."""

    def factory(initial_capacity: int = 4) -> Any:
        return table_type(
            key_groups,
            TABLE_MAX_PARALLELISM,
            initial_capacity=initial_capacity,
            key_serializer=TABLE_KEY_SERIALIZER,
        )

    def model() -> ReferenceStateTable:
        return ReferenceStateTable(
            key_groups, TABLE_MAX_PARALLELISM, key_serializer=TABLE_KEY_SERIALIZER.serialize
        )

    if name is None:
        name = table_type.name + ("" if key_groups is None else "-sub-range")
    return Implementation(
        name,
        factory,
        table_type.check,
        table_type.fingerprint,
        model=model,
        table=True,
        capabilities=table_type.capabilities,
        close=table_type.close,
        example_share=table_type.example_share,
        memory_unsafe=table_type.memory_unsafe,
    )


IMPLEMENTATIONS: list[Implementation] = [
    _cow("cow-map", 4),  # tiny table: rehashes start while snapshots are open
    _cow("cow-map-128", 128, tracked=True),  # Flink's default capacity; tracks changes
    Implementation("reference-model", ReferenceStateMap),  # the model against itself
]
if C_MAP is not None:  # the C map: the same spec, one line each
    IMPLEMENTATIONS += [
        _cow("c-map", 4, C_MAP, memory_unsafe=True),
        _cow("c-map-128", 128, C_MAP, tracked=True, memory_unsafe=True),
    ]
IMPLEMENTATIONS += [
    table_implementation(table_type, key_groups)
    for table_type in TABLE_TYPES
    for key_groups in (None, SUB_RANGE)
]


def by_name(name: str) -> Implementation:
    """The implementation called ``name``: one of :data:`IMPLEMENTATIONS`,
    ``bad-<bug>`` for a deliberately broken map of
    :mod:`cowstate_spec.bad_implementations` (so executors can rebuild it),
    ``package.module:factory`` for someone else's Python map
    (:func:`cowstate_spec.conformance.factory_implementation`), or a process
    speaking the protocol: ``process:COMMAND`` or a registered adapter's name
    (:data:`cowstate_spec.process_impl.ADAPTERS`)."""
    for implementation in IMPLEMENTATIONS:
        if implementation.name == name:
            return implementation
    from cowstate_spec.bad_implementations import BUGS, ITERATION_BUGS, bad_implementation

    for bug in (*BUGS, *ITERATION_BUGS):
        if name == f"bad-{bug.name}":
            return bad_implementation(bug)
    from cowstate_spec import process_impl
    from cowstate_spec.conformance import factory_implementation, is_factory_name

    if process_impl.is_process_name(name):
        return process_impl.process_implementation(name)
    if is_factory_name(name):
        return factory_implementation(name)
    known = ", ".join(i.name for i in IMPLEMENTATIONS)
    adapters = ", ".join(process_impl.ADAPTERS)
    alternatives = f"{known}, bad-<bug>, {adapters}, process:COMMAND or package.module:factory"
    if C_MAP is None and name.startswith("c-"):
        raise KeyError(
            f"expected one of {alternatives}, got {name!r}: the C map is checked "
            f"through its probe, which did not import here ({PROBE_ERROR})"
        )
    raise KeyError(f"expected one of {alternatives}, got {name!r}")
