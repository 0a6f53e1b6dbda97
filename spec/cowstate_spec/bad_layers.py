"""Deliberately broken layers above the map: key-group hashing, the rescaling
ranges, the default serializer's copy, the snapshot writer and reader, and the
RocksDB backend's savepoints.

:mod:`cowstate_spec.bad_implementations` breaks one line of one *method*; the
layers above also hold module-level *functions* (``java_string_hash``,
``write_snapshot``, ``_deep_copy``, ...), reached only through the functions
and methods that call them. A :class:`FunctionBug` rewrites one line of one
function (exactly one occurrence, as a :class:`~cowstate_spec.bad_implementations.Bug`);
the broken function reaches a machine through its callers, each re-compiled
from its own unchanged source with the broken callee in its globals
(:func:`rebound`, :func:`broken_class`'s ``helpers``). Nothing in ``cowstate``
is patched: every broken class and function is a private copy.

Where each is caught (the table of every defect class is in
:mod:`cowstate_spec.bad_implementations`):

==================================  ==========================================
bug                                 machine (rule or invariant that sees it)
==================================  ==========================================
string-hash-over-code-points        table machine (``put_astral_key``, then any
                                    keyed rule or ``entries_in_key_group``)
writer-drops-the-last-key-group     backend machine (``complete_snapshot``)
writer-releases-before-serializing  backend machine
                                    (``complete_snapshot_mutating_what_it_reads``)
shallow-serializer-fast-path        backend machine
                                    (``complete_snapshot_mutating_what_it_reads``
                                    on a map state holding a list)
uncompared-block-crc                backend machine (``restore_a_corrupted_copy``)
clipped-rescaling-range             backend machine (``rescale``: the operators
                                    together restore the whole snapshot)
native-savepoint-shares-sst-files   storage machine, ``savepoint`` rule: the
                                    coordinator's own write-time check refuses
                                    a savepoint listing shared files
confinement-by-string-prefix        the confinement properties
                                    (tests/test_restore_trust.py: a link to a
                                    sibling ``chk-1-evil`` of ``chk-1``)
relation-by-string-prefix           the confinement properties (a sibling
                                    ``job-shared`` of the job directory taken
                                    for its ``shared/``)
dot-dot-taken                       the confinement properties (a path with a
                                    ``..`` that stays inside taken, against P1)
==================================  ==========================================

The last three break path confinement (:data:`PATH_LAYER_BUGS`), which no
state machine exercises: :func:`bad_layer_confinement` gives the broken
functions and classes (a :class:`Confinement`) to Hypothesis properties over
a directory tree of hostile names and real symbolic links.

Each has an identity-rewrite control (``old`` replaced by itself, the same
callers rebound): the same machine must pass it.
"""

from __future__ import annotations

import functools
import inspect
import os
import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from cowstate import key_groups, serializers
from cowstate.checkpoint import paths
from cowstate.checkpoint.location import SnapshotSource
from cowstate.checkpoint.storage import CheckpointStorage
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import KeyGroupRange
from cowstate.snapshot import writer
from cowstate.snapshot.reader import SnapshotReader
from cowstate.state_table import CopyOnWriteStateTable
from cowstate_spec.backend_machine import BackendMachine, backend_machine_for
from cowstate_spec.backends import BackendImplementation, backend_named
from cowstate_spec.bad_implementations import Bug, broken_class
from cowstate_spec.implementations import SUB_RANGE, Implementation, TableType, table_implementation
from cowstate_spec.invariants import table_fingerprint

__all__ = [
    "BACKEND_LAYER_BUGS",
    "CONFINEMENT",
    "PATH_LAYER_BUGS",
    "TABLE_LAYER_BUGS",
    "Confinement",
    "FunctionBug",
    "LayerBug",
    "bad_layer_backend",
    "bad_layer_backend_machine",
    "bad_layer_confinement",
    "bad_layer_storage_kind",
    "bad_layer_table",
    "broken_function",
    "identity",
    "rebound",
    "storage_layer_bugs",
]


@dataclass(frozen=True)
class FunctionBug:
    """Replace ``old`` by ``new`` (exactly one occurrence) in ``function``."""

    name: str
    function: Callable[..., Any]
    old: str
    new: str
    why: str
    #: More (old, new) replacements, applied to the control too.
    also: tuple[tuple[str, str], ...] = ()


#: A planted defect of a layer: a broken function or a broken method.
LayerBug = FunctionBug | Bug


def identity(bug: LayerBug) -> LayerBug:
    """The control of ``bug``: the same rewrite, with ``old`` replaced by itself."""
    return replace(bug, name=f"identity-{bug.name}", new=bug.old, why="control")


def broken_function(bug: FunctionBug, **helpers: Any) -> Callable[..., Any]:
    """``bug.function`` with ``bug`` applied, compiled in its module's globals
    (``helpers`` override names there: broken callees)."""
    source = textwrap.dedent(inspect.getsource(bug.function))
    if source.count(bug.old) != 1:
        raise ValueError(
            f"bug {bug.name}: expected exactly one {bug.old!r} in {bug.function.__name__}, "
            f"found {source.count(bug.old)}"
        )
    source = source.replace(bug.old, bug.new)
    for old, new in bug.also:
        if source.count(old) != 1:
            raise ValueError(f"bug {bug.name}: expected exactly one {old!r}")
        source = source.replace(old, new)
    namespace = dict(vars(sys.modules[bug.function.__module__])) | helpers
    exec(compile(source, f"<bug {bug.name}>", "exec"), namespace)
    function: Callable[..., Any] = namespace[bug.function.__name__]
    return function


def rebound(function: Callable[..., Any], **helpers: Any) -> Callable[..., Any]:
    """``function`` recompiled from its unchanged source with ``helpers`` in its
    globals: a caller of a broken function."""
    head = f"def {function.__name__}("
    return broken_function(FunctionBug("rebound", function, head, head, "rebound"), **helpers)


# ------------------------------------------------------------------ tables

#: A Java ``String.hashCode()`` over code points instead of UTF-16 code units:
#: the same for every string of the Basic Multilingual Plane, different for a
#: character beyond it (one code point, two UTF-16 units).
CODE_POINTS = FunctionBug(
    "string-hash-over-code-points",
    key_groups.java_string_hash,
    'data = s.encode("utf-16-be", "surrogatepass")\n'
    "    for i in range(0, len(data), 2):\n"
    "        h = (31 * h + (data[i] << 8 | data[i + 1])) & _MASK32",
    "for c in s:\n        h = (31 * h + ord(c)) & _MASK32",
    "Flink hashes a String over its UTF-16 code units: a key beyond the BMP lands "
    "in another key group",
)

TABLE_LAYER_BUGS: list[LayerBug] = [CODE_POINTS]


def bad_layer_table(bug: LayerBug) -> Implementation:
    """A copy-on-write table whose routing hashes strings with ``bug`` (or its
    control): ``java_string_hash`` -> ``java_hash`` -> ``assign_to_key_group``
    -> ``CopyOnWriteStateTable._route``."""
    assert isinstance(bug, FunctionBug), f"expected a function bug, got {bug!r}"
    string_hash = broken_function(bug)
    java_hash = rebound(key_groups.java_hash, java_string_hash=string_hash)
    assign = rebound(key_groups.assign_to_key_group, java_hash=java_hash)
    route = Bug(bug.name, "_route", "def _route(", "def _route(", bug.why, CopyOnWriteStateTable)
    cls = broken_class(route, assign_to_key_group=assign)
    assert issubclass(cls, CopyOnWriteStateTable)
    name = f"bad-{bug.name}"
    table_type: TableType[Any] = TableType(name, cls, fingerprint=table_fingerprint)
    return table_implementation(table_type, SUB_RANGE, name)


# ---------------------------------------------------------------- backends

#: Where write_snapshot's Python loop takes a key group's entries (then encodes
#: them, through the C codec's sections or the Python loop).
_TAKE_ITEMS = "items = snap.key_group_items(key_group)\n"
#: The C writer pins a key group's map snapshots while it encodes them, so a
#: release before serializing cannot reach it: that bug runs the Python loop.
_PYTHON_LOOP = (("walked = sections.walked()\n", "walked = [None for _ in tables]\n"),)

BACKEND_LAYER_BUGS: list[LayerBug] = [
    FunctionBug(
        "writer-drops-the-last-key-group",
        writer.write_snapshot,
        "first, last = metadata.key_group_range\n",
        "first, last = metadata.key_group_range[0], metadata.key_group_range[1] - 1\n",
        "every key group of the range is written (the last one too; finish() writes "
        "an empty block for one never written)",
    ),
    FunctionBug(
        "writer-releases-before-serializing",
        writer.write_snapshot,
        _TAKE_ITEMS,
        "items = list(snap.key_group_items(key_group))\n"
        "                snap.release_key_group(key_group)\n",
        "a key group's map snapshots are released only once its states are serialized: "
        "released first, the owner mutates a state in place before the writer reads it",
        _PYTHON_LOOP,
    ),
    FunctionBug(
        "shallow-serializer-fast-path",
        serializers._deep_copy,
        "        and _IMMUTABLE_SCALARS.issuperset(map(type, state.values()))\n",
        "",
        "the flat-dict fast path must check the values too: a dict of lists is "
        "deep-copied, or a snapshot shares the lists",
    ),
    Bug(
        "uncompared-block-crc",
        "_read_block",
        "if crc != actual:",
        "if False:",
        "a key-group block's CRC32 is compared on reading (the metadata's and the "
        "index's still are)",
        SnapshotReader,
    ),
    FunctionBug(
        "clipped-rescaling-range",
        key_groups.compute_key_group_range_for_operator_index,
        "end = ((operator_index + 1) * max_parallelism - 1) // parallelism",
        "end = (operator_index + 1) * max_parallelism // parallelism - 1",
        "the ranges of a rescaling partition the key groups; rounding the end down "
        "drops a key group when the parallelism does not divide the max parallelism",
    ),
]


def _heap_class_with(**helpers: Any) -> type[Any]:
    """A heap backend whose writers (``snapshot``'s and ``snapshot_to``'s) and
    restore use ``helpers`` (broken callees)."""
    cls: type[Any] = HeapKeyedStateBackend
    for method in ("_write", "_write_to", "_decode_and_fill"):
        head = f"def {method}("
        identity_bug = Bug(f"rebound-{method}", method, head, head, "rebound", cls)
        cls = broken_class(identity_bug, **helpers)
    return cls


class _CopySerializer(serializers.DefaultSerializer):
    """The default serializer with another ``copy`` (its identifier unchanged)."""

    __slots__ = ("_copy",)

    def __init__(self, copy: Callable[[Any], Any]) -> None:
        self._copy = copy

    def copy(self, state: Any) -> Any:
        return self._copy(state)


class _CopyingMaps(CopyOnWriteStateTable[Any, Any, Any]):
    """A copy-on-write table whose maps copy shared states with :attr:`copy`."""

    copy: Callable[[Any], Any] = staticmethod(serializers._deep_copy)

    def _create_map(self) -> Any:
        return self.map_class(_CopySerializer(type(self).copy), self._initial_capacity)


def bad_layer_backend(bug: LayerBug) -> BackendImplementation:
    """A heap backend over copy-on-write tables with ``bug`` (or its control)
    planted in the layer it names."""
    table: Any = CopyOnWriteStateTable
    helpers: dict[str, Any] = {}
    if isinstance(bug, Bug):
        helpers["SnapshotReader"] = broken_class(bug)
    elif bug.function is writer.write_snapshot:
        helpers["write_snapshot"] = broken_function(bug)
    elif bug.function is serializers._deep_copy:
        table = type(
            "BrokenCopyMaps", (_CopyingMaps,), {"copy": staticmethod(broken_function(bug))}
        )
        # The machine mutates a state while the writer serializes it (rule
        # complete_snapshot_mutating_what_it_reads hooks the Python path's
        # serializer calls); the C writer encodes a built-in state with no call
        # to hook, and before the owner's next step, so this bug runs the
        # Python loop (the C writer's own race with the owner is
        # tests/test_snapshot_io.py's contract-breaker test).
        helpers["write_snapshot"] = broken_function(
            FunctionBug("python-loop", writer.write_snapshot, *_PYTHON_LOOP[0], "the Python loop")
        )
    backend_class = _heap_class_with(**helpers) if helpers else HeapKeyedStateBackend

    def factory(key_group_range: KeyGroupRange, max_parallelism: int) -> Any:
        return backend_class(
            key_group_range, max_parallelism, functools.partial(table, initial_capacity=4)
        )

    return BackendImplementation(f"bad-{bug.name}", factory)


def bad_layer_backend_machine(
    bug: LayerBug, key_group_range: KeyGroupRange
) -> type[BackendMachine]:
    """The backend machine for ``bug``: over a broken backend, or (a rescaling
    range) a real heap backend rescaled by the broken range function."""
    if (
        isinstance(bug, FunctionBug)
        and bug.function is key_groups.compute_key_group_range_for_operator_index
    ):
        machine = backend_machine_for(backend_named("heap-cow"), key_group_range)
        machine.operator_range = staticmethod(broken_function(bug))
        return machine
    return backend_machine_for(bad_layer_backend(bug), key_group_range)


# ----------------------------------------------------------------- storage


def storage_layer_bugs() -> list[LayerBug]:
    """The RocksDB backend's bugs the storage machine must catch (a function:
    ``cowstate.rocksdb`` needs the optional ``rocksdict``)."""
    from cowstate.rocksdb import RocksDBKeyedStateBackend

    return [
        Bug(
            "native-savepoint-shares-sst-files",
            "snapshot_to",
            "if options.reuses_files else {}",
            "if not options.full else {}",
            "a native savepoint uploads its own SSTs: reusing the job's shared ones, it "
            "loses them when the checkpoints that own them are subsumed",
            RocksDBKeyedStateBackend,
        )
    ]


def bad_layer_storage_kind(bug: LayerBug) -> BackendImplementation:
    """The storage machine's RocksDB backend (the machine's own options) with ``bug``."""
    assert isinstance(bug, Bug), f"expected a RocksDB backend bug, got {bug!r}"
    cls = broken_class(bug)

    def factory(key_group_range: KeyGroupRange, max_parallelism: int) -> Any:
        from rocksdict import Options

        from cowstate_spec.backends import _rocksdb_snapshot_root

        options = Options(raw_mode=True)
        options.set_keep_log_file_num(1)
        options.set_level_zero_file_num_compaction_trigger(2)  # as STORAGE_BACKENDS
        return cls(
            key_group_range,
            max_parallelism,
            options=options,
            local_dir=os.path.join(_rocksdb_snapshot_root(), "backends"),
        )

    return replace(backend_named("rocksdb"), name=f"bad-{bug.name}", factory=factory)


# -------------------------------------------------------------- confinement


@dataclass(frozen=True)
class Confinement:
    """What confines a name read from a file (P1-P3 of
    :mod:`cowstate.checkpoint.paths`) and says what the job owns: the real
    functions and classes (:data:`CONFINEMENT`), or copies with a planted bug."""

    is_inside: Callable[[str, str], bool]
    check_exclusive_path: Callable[[str], str]
    check_shared_path: Callable[[str], str]
    source: type[SnapshotSource]
    storage: type[CheckpointStorage]


CONFINEMENT = Confinement(
    paths.is_inside,
    paths.check_exclusive_path,
    paths.check_shared_path,
    SnapshotSource,
    CheckpointStorage,
)

PATH_LAYER_BUGS: list[LayerBug] = [
    FunctionBug(
        "confinement-by-string-prefix",
        paths.is_inside,
        "real.startswith(real_root.rstrip(os.sep) + os.sep)",
        "real.startswith(real_root.rstrip(os.sep))",
        "P3 compares names, not strings: a link to /a/chk-1-evil/x does not stay in /a/chk-1",
    ),
    Bug(
        "relation-by-string-prefix",
        "relation",
        'if not other[1].startswith(job[1] + "/"):',
        "if not other[1].startswith(job[1]):",
        "a sibling of the job directory whose name starts with the job's (job-shared) is not "
        "the job's: deleting in it deletes someone else's files",
        CheckpointStorage,
    ),
    FunctionBug(
        "dot-dot-taken",
        paths._components,
        'if part in (".", "..") or',
        'if part == "." or',
        "P1 refuses '..' wherever it leads: the lexical check is what bookkeeping and "
        "deletion trust (lexical_path), links or not",
    ),
]


def bad_layer_confinement(bug: LayerBug) -> Confinement:
    """:data:`CONFINEMENT` with ``bug`` (or its control) planted: the broken
    function, and the callers that reach it rebuilt around it."""
    if isinstance(bug, Bug):  # a method of CheckpointStorage
        return replace(CONFINEMENT, storage=broken_class(bug))
    if bug.function is paths.is_inside:
        inside = broken_function(bug)
        return replace(
            CONFINEMENT, is_inside=inside, source=_rebound_source("path", is_inside=inside)
        )
    assert bug.function is paths._components, f"expected a path bug, got {bug!r}"
    components = broken_function(bug)
    exclusive = rebound(paths.check_exclusive_path, _components=components)
    shared = rebound(paths.check_shared_path, _components=components)
    return replace(
        CONFINEMENT,
        check_exclusive_path=exclusive,
        check_shared_path=shared,
        source=_rebound_source(
            "lexical_path", check_exclusive_path=exclusive, check_shared_path=shared
        ),
    )


def _rebound_source(method: str, **helpers: Any) -> type[SnapshotSource]:
    """:class:`SnapshotSource` with ``method`` recompiled around ``helpers``."""
    head = f"def {method}("
    cls = broken_class(
        Bug(f"rebound-{method}", method, head, head, "rebound", SnapshotSource), **helpers
    )
    assert issubclass(cls, SnapshotSource)
    return cls
