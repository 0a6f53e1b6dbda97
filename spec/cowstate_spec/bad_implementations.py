"""Deliberately broken maps: the specification proves its strength on them.

Like Hypothesis' own "bad machines", each entry is one plausible bug in
``CopyOnWriteStateMap``, made by rewriting one line of one method's source
(so the broken class differs from the real one in exactly that line). The
test ``tests/test_spec_catches_bad_implementations.py`` runs the state machine
on each and requires it to fail; a bug the spec cannot see is a hole in the
spec. The layers above have their own lists here (``bad_backends()``,
``STORAGE_BUGS``) and in :mod:`cowstate_spec.bad_layers` (broken functions:
hashing, rescaling ranges, serializer copies, snapshot writer and reader,
RocksDB savepoints); the C map's in :mod:`cowstate_spec.bad_cmaps`; restore
checks that sample or count, which the restore tests catch (no machine's
snapshot holds a bad entry), in :mod:`cowstate_spec.bad_checks`.

Every defect class backed twice
===============================
Each defect class below is caught by a *state machine* exploring on its own
-- not only by a hand-written scenario -- within the ``ci`` profile's budget
(``tests/test_spec_catches_every_class.py``, generation only: map and table
machines 120 examples x 40 steps, the backend machine 120 x 80 as in
``tests/test_backend_machine.py``, the storage machine 30 x 40 as in
``tests/test_storage_machine.py``); the three marked (m) under the
``mutation`` profile's settings (60 x 40, no shrinking) too.
:data:`DEFECT_CLASSES` is this table as data; the test checks the two agree
with the lists.

=====================================  ===================================  ========
defect class                           planted bug(s)                       machine
=====================================  ===================================  ========
a skipped state copy                   get-skips-state-copy                 map
                                       c-get-skips-state-copy               C map
a relinked shared predecessor          remove-relinks-shared-predecessor,   map
                                       chain-copy-mutates-shared-predecessor
                                       c-relinks-shared-predecessor         C map
a rehash that relinks shared entries   rehash-relinks-shared-entries        map
a snapshot layout without the moved    snapshot-omits-moved-high-half (m)   map
high half
a release that forgets older           release-forgets-older-snapshots,     map
snapshots                              release-keeps-lowest-version
                                       c-release-forgets-open-snapshot      C map
an off-by-one table selection          select-active-table-off-by-one (m)   map
                                       c-select-active-table-off-by-one     C map
a rehash step that stops inside a      rehash-step-stops-inside-a-bucket    map
bucket
lost size bookkeeping                  rehash-forgets-moved-count           map
                                       c-rehash-forgets-moved-count         C map
a missing modification count           remove-skips-modification-count      map
                                       c-remove-skips-modification-count    C map
get checks the entry's version         get-checks-entry-version (m)         map
instead of the state's                 c-get-checks-entry-version           C map
string hashing over code points        string-hash-over-code-points         table
a writer that drops the last key       writer-drops-the-last-key-group      backend
group
an uncompared CRC (block path only)    uncompared-block-crc                 backend
a native savepoint that shares SSTs    native-savepoint-shares-sst-files    storage
subsumption deleting retained files    registry-deletes-files-still-used,   storage
                                       registry-deletes-a-chain-file-still-used
an incremental first checkpoint        no-claim-does-not-force-full         storage
after NO_CLAIM
a writer releasing key groups before   writer-releases-before-serializing   backend
serializing
a shallow serializer fast path         shallow-serializer-fast-path         backend
a clipped rescaling range              clipped-rescaling-range              backend
a leaked reference (issue 26)          c-put-leaks-replaced-state           C map
a change the tracking misses           get-mutation-not-recorded,           map
                                       remove-not-logged,
                                       release-guard-ignores-tracking
                                       c-get-mutation-not-recorded,         C map
                                       c-remove-not-logged,
                                       c-release-guard-ignores-tracking,
                                       c-put-does-not-mark-its-bucket,
                                       c-rehash-drops-marks
a heap delta that misses a removal     delta-misses-a-removal               storage
=====================================  ===================================  ========

A leaked reference has no pure-map form (Python counts the pure map's
references); the map machines catch it by the lifetimes of their states
(:mod:`cowstate_spec.collected`). Three classes have no C form here: a C snapshot copies whole chunk
directories (no compact layout to lose a high half of: its analogue is
``c-directory-copy-misses-a-chunk``), ``move_bucket`` moves a bucket all or
nothing by construction, and a C rehash relinking a shared entry in place
is a use-after-free (it crashes the interpreter; ``make sanitize`` is for
that), not a wrong answer a machine could assert on.
``c-get-checks-entry-version`` joined the table when the sweep rule
(``get_and_mutate_every_mapping``) picked the mappings it removes by position
instead of by equality: two ``HashKey`` keys of one value and other hashes are
equal yet two mappings, so the rule had skipped the ``get`` of every mapping
equal to a removed one, and under the fixed seed those were the entries whose
states a chain copy had left shared. The C map's bugs are ``C_BUGS`` (numbered
in ``_cmap.c``) and ``C_REWRITES`` (text rewrites of a copy) of
:mod:`cowstate_spec.bad_cmaps`.
"""

from __future__ import annotations

import functools
import inspect
import sys
import textwrap
from dataclasses import dataclass
from typing import Any

from cowstate.checkpoint.coordinator import CheckpointCoordinator
from cowstate.checkpoint.recovery import Recovery
from cowstate.checkpoint.registry import SharedStateRegistry
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.nested_table import NestedMapsStateTable
from cowstate.state_map import CopyOnWriteStateMap
from cowstate.state_table import CopyOnWriteStateTable, StateTable
from cowstate_spec.backends import BackendImplementation, heap_backend
from cowstate_spec.implementations import (
    HEAP,
    SUB_RANGE,
    TRACKED,
    TRACKED_REMOVAL_LIMIT,
    Implementation,
    TableType,
    table_implementation,
)
from cowstate_spec.invariants import (
    check_map,
    fingerprint,
    rehash_step_check,
    table_fingerprint,
)


@dataclass(frozen=True)
class Bug:
    """Replace ``old`` by ``new`` (exactly one occurrence) in ``cls.method``.

    Bugs of a state table are checked on a table over :data:`SUB_RANGE`, so
    the range's start offset and refused keys matter.
    """

    name: str
    method: str
    old: str
    new: str
    why: str
    cls: type[Any] = CopyOnWriteStateMap
    #: The map tracks changes (rules T and D): checked by the ChangeTracking rules.
    tracked: bool = False


BUGS: list[Bug] = [
    Bug(
        "get-skips-state-copy",
        "_copy_state_for_caller",
        "state: S = self._serializer.copy(e.state)",
        "state: S = e.state",
        "rule S: a caller mutates a state an open snapshot still holds",
    ),
    Bug(
        "get-fast-path-ignores-versions",
        "get",
        "if e.state_version < self._guard:",
        "if False:",
        "rule S on the hot path of get",
    ),
    Bug(
        "chain-copy-mutates-shared-predecessor",
        "_copy_chain",
        "if current.entry_version < required:\n            copy.next",
        "if current is until:\n            copy.next",
        "rule E: a shared predecessor is relinked instead of copied",
    ),
    Bug(
        "chain-copy-keeps-shared-head",
        "_copy_chain",
        "copy = current.copy(version)\n        tab[index] = copy",
        "copy = current",
        "rule E: the shared chain head is changed in place",
    ),
    Bug(
        "put-changes-shared-entry",
        "_put_entry",
        "if e.entry_version < self._highest_required:",
        "if False:",
        "rule E on put: a snapshot's entry gets the new state",
    ),
    Bug(
        "remove-relinks-shared-predecessor",
        "_remove_entry",
        "if prev.entry_version < self._highest_required:",
        "if False:",
        "rule E on remove: the snapshot loses the removed entry's successors",
    ),
    Bug(
        "put-and-get-old-returns-shared-state",
        "put_and_get_old",
        "old = self._serializer.copy(old)",
        "pass",
        "rule S: the old state handed out is still in a snapshot",
    ),
    Bug(
        "remove-and-get-old-returns-shared-state",
        "remove_and_get_old",
        "old = self._serializer.copy(old)",
        "pass",
        "rule S: the removed state handed out is still in a snapshot",
    ),
    Bug(
        "transform-mutates-shared-state",
        "transform",
        "old = self._serializer.copy(old)",
        "pass",
        "rule S: transform's function mutates a snapshot's state",
    ),
    Bug(
        "rehash-relinks-shared-entries",
        "_incremental_rehash",
        "if e.entry_version < required:",
        "if False:",
        "rule E in the rehash: moving an entry rewrites a snapshot's chain",
    ),
    Bug(
        "snapshot-omits-moved-high-half",
        "_snapshot_arrays",
        "self._rehash, self._rehash_index",
        "None if self._rehash is None else self._rehash[:len(self._primary)], self._rehash_index",
        "the snapshot layout drops buckets j + L of the rehash table",
    ),
    Bug(
        "release-keeps-lowest-version",
        "_release_version",
        "highest_required_version(self._open_versions)",
        "min(self._open_versions, default=0)",
        "H must be the highest open version, not the lowest",
    ),
    Bug(
        "select-active-table-off-by-one",
        "_select",
        "in_rehash_table(h, capacity, self._rehash_index)",
        "in_rehash_table(h, capacity, self._rehash_index + 1)",
        "a bucket is looked up in the rehash table before it moved",
    ),
    Bug(
        "rehash-forgets-moved-count",
        "_incremental_rehash",
        "self._rehash_size += moved",
        "self._rehash_size += moved - 1",
        "per-table counters drift (invariant 3)",
    ),
    Bug(
        "never-grows",
        "_put_entry",
        "self._double_capacity()",
        "pass",
        "the table never grows: invisible to the model, caught by invariant 9",
    ),
    Bug(
        "new-entry-not-at-head",
        "_put_entry",
        "e = _Entry(key, namespace, None, h, tab[index], version, version)\n    tab[index] = e",
        "e = _Entry(key, namespace, None, h, None, version, version)\n    tab[index] = e",
        "a new entry replaces the chain it heads",
    ),
    Bug(
        "get-checks-entry-version",
        "get",
        "if e.state_version < self._guard:  # rule S",
        "if e.entry_version < self._guard:  # rule S",
        "rule S asks the state's version: an entry copied by rule E (new entry "
        "version) still holds the snapshot's state",
    ),
    Bug(
        "scalar-exemption-takes-lists",
        "_copy_state_for_caller",
        "if self._scalars_as_is and type(e.state) in SCALAR_STATES:",
        "if self._scalars_as_is and (type(e.state) in SCALAR_STATES or isinstance(e.state, list)):",
        "rule S's scalar exemption hands out a list a snapshot holds: mutating it "
        "changes the snapshot",
    ),
    Bug(
        "get-mutation-not-recorded",
        "_copy_state_for_caller",
        "handed: S = self._mark(tab, index, e).state",
        "handed: S = e.state",
        "rule T: a state get hands out after the base is not marked, so a caller's "
        "mutation is missing from the next delta",
        tracked=True,
    ),
    Bug(
        "remove-not-logged",
        "_remove_entry",
        "self._log_removal(e.key, e.namespace)",
        "pass",
        "rule D: a removal missing from the log, so the next delta keeps the key",
        tracked=True,
    ),
    Bug(
        "release-guard-ignores-tracking",
        "_release_version",
        "self._highest_required if self._removals is None else self._version",
        "self._highest_required",
        "rule T: after the base is released get no longer marks what it hands out",
        tracked=True,
    ),
    Bug(
        "release-forgets-older-snapshots",
        "_release_version",
        "highest_required_version(self._open_versions)",
        "highest_required_version(frozenset(v for v in self._open_versions if v > version))",
        "releasing the newest snapshot drops H to 0 while older snapshots are open",
    ),
    Bug(
        "rehash-step-stops-inside-a-bucket",
        "_incremental_rehash",
        "moved += 1\n        old[r] = None",
        "moved += 1\n            if moved >= MIN_TRANSFERRED_PER_INCREMENTAL_REHASH:\n"
        "                break\n"
        "        if e is not None:\n            old[r] = e\n            break\n"
        "        old[r] = None",
        "a rehash step moves whole buckets: stopping after 4 entries splits bucket r "
        "between the tables (invariant 2)",
    ),
    Bug(
        "remove-skips-modification-count",
        "_remove_entry",
        "self._mod_count += 1",
        "pass",
        "an iterator must fail fast after a removal (fail-fast iteration)",
    ),
    # ------------------------------------------------------------ state tables
    Bug(
        "table-routes-by-python-hash",
        "_route",
        "key_group = assign_to_key_group(key, self._max_parallelism, self._key_serializer)",
        "key_group = hash(key) % self._max_parallelism",
        "key groups must be Flink's murmur of the Java hash, never Python's hash()",
        CopyOnWriteStateTable,
    ),
    Bug(
        "table-index-ignores-range-start",
        "_route",
        "index = key_group - self._start",
        "index = key_group",
        "the map of key group kg is maps[kg - start], not maps[kg]",
        CopyOnWriteStateTable,
    ),
    Bug(
        "table-snapshot-misorders-key-groups",
        "snapshot",
        "CopyOnWriteStateTableSnapshot(self, taken)",
        "CopyOnWriteStateTableSnapshot(self, taken[::-1])",
        "the map snapshot of key group kg must stand at kg - start",
        CopyOnWriteStateTable,
    ),
    Bug(
        "nested-snapshot-shares-states",
        "snapshot",
        "[m.copy_entries() for m in self._maps]",
        "[list(m) for m in self._maps]",
        "a synchronous snapshot must deep-copy, or in-place mutations reach it",
        NestedMapsStateTable,
    ),
    Bug(
        "table-size-counts-one-map",
        "__len__",
        "sum(len(m) for m in self._maps)",
        "sum(len(m) for m in self._maps[:1])",
        "the size of a table is the sum over all its key groups",
        NestedMapsStateTable,
    ),
]


#: Map bugs that only the differential run's ``interrupt_iteration`` shows (the
#: state machine interrupts iterators by rehash steps alone, which these still
#: notice): ``cowstate check --implementation bad-<name>`` takes them, and
#: tests/test_presets.py requires the presets to catch each.
ITERATION_BUGS: list[Bug] = [
    Bug(
        "iterator-ignores-mod-count",
        "_iterate",
        " " * 16 + "if (self._mod_count, self._structure_count) != expected:",
        " " * 16 + "if self._structure_count != expected[1]:",
        "fail-fast: after a put or remove mid-iteration the next step must raise, "
        "not yield (only the last step still checks the modification count)",
    ),
]


# ------------------------------------------- hostile user code (rule U, issue 17)
#: Bugs only hostile user code shows: the state machine with the rule of
#: hostile user code (``machine_for(..., hostile=True)``) must catch each
#: (``tests/test_user_code_errors.py``); the plain machine never could.
USER_CODE_BUGS: list[Bug] = [
    Bug(
        "remove-and-get-old-copies-after-unmapping",
        "remove_and_get_old",
        "old: S | None = e.state",
        "old: S | None = e.state; self._remove_entry(h, key, namespace)",
        "rule U: a copy that raises after the mapping was removed loses the old state",
    ),
    Bug(
        "lookup-lets-equality-error-escape",
        "_find",
        "except Exception as exc:  # rule U",
        "except ArithmeticError as exc:  # rule U",
        "rule U: a key's raising __eq__ must come out as KeyComparisonError",
    ),
    Bug(
        "put-ignores-a-map-changed-by-equality",
        "_put_entry",
        "if self._stamp != stamp:  # rule R1: an __eq__ changed the map",
        "if False:  # rule R1: an __eq__ changed the map",
        "rule R1: a put whose key's __eq__ put mappings inserts into the table and "
        "bucket it searched before, which a rehash step may have emptied or dropped",
    ),
]


#: The defect classes of the table in the module doc: class -> ``(machine, bug
#: name)`` pairs. Machines: ``map`` (the pure map's state machine over
#: :data:`BUGS`), ``c-map`` (over ``bad_cmaps.C_BUGS`` and ``C_REWRITES``), ``table`` (the table
#: machine over ``bad_layers.TABLE_LAYER_BUGS``), ``backend`` (the backend
#: machine over ``bad_layers.BACKEND_LAYER_BUGS``), ``storage`` (the storage
#: machine over :data:`STORAGE_BUGS` and ``bad_layers.storage_layer_bugs()``).
DEFECT_CLASSES: dict[str, tuple[tuple[str, str], ...]] = {
    "a skipped state copy": (("map", "get-skips-state-copy"), ("c-map", "c-get-skips-state-copy")),
    "a relinked shared predecessor": (
        ("map", "remove-relinks-shared-predecessor"),
        ("map", "chain-copy-mutates-shared-predecessor"),
        ("c-map", "c-relinks-shared-predecessor"),
    ),
    "a rehash that relinks shared entries": (("map", "rehash-relinks-shared-entries"),),
    "a snapshot layout without the moved high half": (("map", "snapshot-omits-moved-high-half"),),
    "a release that forgets older snapshots": (
        ("map", "release-forgets-older-snapshots"),
        ("map", "release-keeps-lowest-version"),
        ("c-map", "c-release-forgets-open-snapshot"),
    ),
    "an off-by-one table selection": (
        ("map", "select-active-table-off-by-one"),
        ("c-map", "c-select-active-table-off-by-one"),
    ),
    "a rehash step that stops inside a bucket": (("map", "rehash-step-stops-inside-a-bucket"),),
    "lost size bookkeeping": (
        ("map", "rehash-forgets-moved-count"),
        ("c-map", "c-rehash-forgets-moved-count"),
    ),
    "a missing modification count": (
        ("map", "remove-skips-modification-count"),
        ("c-map", "c-remove-skips-modification-count"),
    ),
    "get checks the entry's version instead of the state's": (
        ("map", "get-checks-entry-version"),
        ("c-map", "c-get-checks-entry-version"),
    ),
    "string hashing over code points": (("table", "string-hash-over-code-points"),),
    "a writer that drops the last key group": (("backend", "writer-drops-the-last-key-group"),),
    "an uncompared CRC": (("backend", "uncompared-block-crc"),),
    "a native savepoint that shares SST files": (("storage", "native-savepoint-shares-sst-files"),),
    "subsumption deleting retained files": (
        ("storage", "registry-deletes-files-still-used"),
        ("storage", "registry-deletes-a-chain-file-still-used"),
    ),
    "an incremental first checkpoint after NO_CLAIM": (
        ("storage", "no-claim-does-not-force-full"),
    ),
    "a writer releasing key groups before serializing": (
        ("backend", "writer-releases-before-serializing"),
    ),
    "a shallow serializer fast path": (("backend", "shallow-serializer-fast-path"),),
    "a clipped rescaling range": (("backend", "clipped-rescaling-range"),),
    "a leaked reference": (("c-map", "c-put-leaks-replaced-state"),),
    "a change the tracking misses": (
        ("map", "get-mutation-not-recorded"),
        ("map", "remove-not-logged"),
        ("map", "release-guard-ignores-tracking"),
        ("c-map", "c-get-mutation-not-recorded"),
        ("c-map", "c-remove-not-logged"),
        ("c-map", "c-release-guard-ignores-tracking"),
        ("c-map", "c-put-does-not-mark-its-bucket"),
        ("c-map", "c-rehash-drops-marks"),
    ),
    # delta-against-the-wrong-base (a pending checkpoint between base and delta)
    # is caught in replay (tests/test_spec_catches_bad_storage.py), not yet by
    # the machine exploring within the ci budget: no class of its own here.
    "a heap delta that misses a removal": (("storage", "delta-misses-a-removal"),),
}
#: The classes the ``mutation`` profile's settings must find too (no shrinking).
MUTATION_CLASSES = (
    "an off-by-one table selection",
    "get checks the entry's version instead of the state's",
    "a snapshot layout without the moved high half",
)


def broken_class(bug: Bug, **helpers: Any) -> type[Any]:
    """``bug.cls`` with ``bug`` applied to one method, compiled in the globals of
    the class's module (``helpers`` override names there: broken callees, see
    :mod:`cowstate_spec.bad_layers`)."""
    method = getattr(bug.cls, bug.method)
    source = textwrap.dedent(inspect.getsource(method))
    if source.count(bug.old) != 1:
        raise ValueError(
            f"bug {bug.name}: expected exactly one {bug.old!r} in {bug.method}, "
            f"found {source.count(bug.old)}"
        )
    # The method's own module (bug.cls may be a broken class made here).
    namespace = dict(vars(sys.modules[method.__module__])) | helpers
    exec(compile(source.replace(bug.old, bug.new), f"<bug {bug.name}>", "exec"), namespace)
    return type(
        f"Broken_{bug.name.replace('-', '_')}",
        (bug.cls,),
        {bug.method: namespace[bug.method], "__slots__": ()},
    )


def bad_implementation(bug: Bug, capacity: int = 4) -> Implementation:
    """The broken map or table as an implementation the state machine can check."""
    cls = broken_class(bug)
    name = f"bad-{bug.name}"
    if bug.cls is CopyOnWriteStateMap:

        def factory(initial_capacity: int = capacity) -> Any:
            m = cls(initial_capacity=initial_capacity)
            if bug.tracked:
                m.track_changes(TRACKED_REMOVAL_LIMIT)
            return m

        return Implementation(
            name,
            factory,
            check_map,
            fingerprint,
            rehash_step_check,
            capabilities=TRACKED if bug.tracked else HEAP,
        )

    assert issubclass(cls, StateTable), f"expected a map or a heap table, got {bug.cls}"
    copy_on_write = issubclass(cls, CopyOnWriteStateTable)
    table_type: TableType[Any] = TableType(
        name, cls, fingerprint=table_fingerprint if copy_on_write else None
    )
    return table_implementation(table_type, SUB_RANGE, name)


# ----------------------------------------------------------------- backends


def _cow_table_with(map_bug: str) -> type[Any]:
    """A copy-on-write table whose key-group maps carry the map bug ``map_bug``."""
    broken_map = broken_class(next(bug for bug in BUGS if bug.name == map_bug))

    class BrokenMaps(CopyOnWriteStateTable[Any, Any, Any]):
        def _create_map(self) -> Any:
            return broken_map(self._meta.state_serializer, self._initial_capacity)

    return BrokenMaps


def bad_backends() -> list[BackendImplementation]:
    """Heap backends over broken tables: the backend machine must catch each."""
    nested_shallow = broken_class(
        next(b for b in BUGS if b.name == "nested-snapshot-shares-states")
    )
    tables = {
        "heap-nested-snapshot-shares-states": nested_shallow,
        "heap-cow-get-skips-state-copy": _cow_table_with("get-skips-state-copy"),
        "heap-cow-put-changes-shared-entry": _cow_table_with("put-changes-shared-entry"),
        "heap-cow-transform-mutates-shared-state": _cow_table_with(
            "transform-mutates-shared-state"
        ),
        "heap-cow-remove-relinks-shared-predecessor": _cow_table_with(
            "remove-relinks-shared-predecessor"
        ),
    }
    return [
        BackendImplementation(name, functools.partial(heap_backend, table))
        for name, table in tables.items()
    ]


# ----------------------------------------------------------- checkpoint storage

#: One-line bugs of the coordinator and the storage; the storage machine must
#: catch each. ``STORAGE_BUGS_BACKEND`` names the backend kind that can show
#: it (bugs about shared files need RocksDB, whose checkpoints share files).
STORAGE_BUGS: list[Bug] = [
    Bug(
        "subsume-keeps-exclusive-files",
        "subsume",
        "filesystem.delete_dir(oldest.directory)",
        "pass",
        "rule 5: a subsumed checkpoint's directory leaks",
        CheckpointCoordinator,
    ),
    Bug(
        "abort-leaves-its-uploads",
        "abort_checkpoint",
        "pending.location.discard()\n    self.storage.filesystem.delete_dir("
        "pending.location.directory)",
        "pass",
        "rule 4: an aborted checkpoint's files leak",
        CheckpointCoordinator,
    ),
    Bug(
        "recovery-keeps-garbage",
        "_delete_garbage",
        "filesystem.delete(path)",
        "pass",
        "recovery must delete what no retained checkpoint uses",
        Recovery,
    ),
    Bug(
        "claim-does-not-own",
        "adopt",
        "self._retain(CompletedCheckpoint(metadata.checkpoint_id, record.directory, metadata))",
        "pass",
        "rule 7: a CLAIMed snapshot is subsumed and deleted like a checkpoint",
        CheckpointCoordinator,
    ),
    Bug(
        "garbage-deletes-what-the-job-does-not-own",
        "_delete_garbage",
        "if path not in keep and storage.owns(path):",
        "if path not in keep:",
        "rule 8: recovery never deletes a savepoint stored inside the job directory",
        Recovery,
    ),
]
STORAGE_BUGS += [
    Bug(
        "registry-deletes-disowned-files",
        "unregister",
        "if path not in self._not_owned:",
        "if True:",
        "rule 7: files of a LEGACY or NO_CLAIM snapshot are never deleted",
        SharedStateRegistry,
    ),
    Bug(
        "registry-deletes-files-still-used",
        "unregister",
        "if not users:",
        "if len(users) <= 1:",
        "rule 5: a shared file goes only when no retained checkpoint uses it",
        SharedStateRegistry,
    ),
    Bug(
        "registry-deletes-a-chain-file-still-used",
        "unregister",
        "if not users:",
        "if len(users) <= 1:",
        "rule 5 and heap chains: a subsumed checkpoint's base or delta goes only when "
        "no retained checkpoint's chain still names it",
        SharedStateRegistry,
    ),
    Bug(
        "subsume-deletes-what-a-pending-checkpoint-reuses",
        "_release_deferred",
        "for pending in self._pending.values()",
        "for pending in ()",
        "rule 5: a pending checkpoint keeps the shared files it may reuse",
        CheckpointCoordinator,
    ),
    Bug(
        "recovery-forgets-a-settled-claim",
        "_settles_claim",
        "if record is None or record.mode is not RestoreMode.CLAIM or record.settled:",
        "if True:",
        "rule 8: a settled claim's shared files are the job's to delete, after a crash too",
        CheckpointCoordinator,
    ),
    Bug(
        "no-claim-does-not-force-full",
        "adopt",
        "self.force_full = record.mode is RestoreMode.NO_CLAIM",
        "self.force_full = False",
        "rule 7: the first checkpoint after a NO_CLAIM restore must be full",
        CheckpointCoordinator,
    ),
    Bug(
        "delta-misses-a-removal",
        "_delta_plan",
        "groups[key_group] = held_removals(pairs)",
        "groups[key_group] = held_removals(pairs[1:])",
        "I5 of cowstate.heap_incremental: a delta without the first removal of a key "
        "group keeps the removed key in every checkpoint built on it",
        HeapKeyedStateBackend,
    ),
    Bug(
        "restore-applies-removals-to-the-wrong-key-group",
        "_decode_chain",
        "deltas.append((removals, decode(chain[index])))",
        "deltas.append(({name: {(kg + 1 if kg < self.key_group_range.end_key_group "
        "else kg - 1): pairs for kg, pairs in groups.items()} "
        "for name, groups in removals.items()}, decode(chain[index])))",
        "I5 of cowstate.heap_incremental: a restore (here rescaling) must apply each "
        "removal in its own key group",
        HeapKeyedStateBackend,
    ),
    Bug(
        "delta-against-the-wrong-base",
        "_delta_plan",
        "base_versions = base.versions.get(snap.meta.name)",
        "base_versions = max([base, *self._written.values()], "
        "key=lambda c: c.checkpoint_id).versions.get(snap.meta.name)",
        "I1 of cowstate.heap_incremental: the changes are taken since the newest written "
        "checkpoint, not since the confirmed base whose files the chain names",
        HeapKeyedStateBackend,
    ),
]
#: Which backend shows each storage bug, and how many checkpoints the job keeps.
STORAGE_BUGS_BACKEND = {bug.name: "heap" for bug in STORAGE_BUGS} | {
    "delta-misses-a-removal": "heap-incremental",
    "delta-against-the-wrong-base": "heap-incremental",
    "restore-applies-removals-to-the-wrong-key-group": "heap-incremental",
    "registry-deletes-disowned-files": "rocksdb",
    "registry-deletes-files-still-used": "rocksdb",
    "registry-deletes-a-chain-file-still-used": "heap-incremental",
    "no-claim-does-not-force-full": "rocksdb",
    "subsume-deletes-what-a-pending-checkpoint-reuses": "rocksdb",
    "recovery-forgets-a-settled-claim": "rocksdb",
}
STORAGE_BUGS_RETAINED = {bug.name: 1 for bug in STORAGE_BUGS} | {
    "registry-deletes-files-still-used": 2,
    "registry-deletes-a-chain-file-still-used": 2,
}
