"""All-or-nothing restores (issue 15): a job's subtasks restore all or none, a
backend's restore from several files changes nothing unless every file
verified, the two-phase API (prepare_restore / commit / discard), and the
edges: ``restore([])`` is refused, the snapshot of a backend without states
restores to empty states.

"Unchanged" is exact: a fresh backend stays empty, a backend with state keeps
exactly its contents, and a RocksDB backend keeps no staged database.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from restore_support import (
    FULL,
    MAX_P,
    SER,
    by_group,
    crafted,
    dump,
    fill,
    group_of,
    handle_for,
    heap,
    rocks,
)

from cowstate.checkpoint.coordinator import CheckpointCoordinator, _restore_backends
from cowstate.checkpoint.filesystem import FileSystem
from cowstate.checkpoint.handles import KeyedStateHandle, RestoreMode, SnapshotOptions
from cowstate.checkpoint.location import SnapshotLocation, SnapshotSource
from cowstate.checkpoint.protocol import CheckpointingBackend, PreparedRestore
from cowstate.checkpoint.storage import CheckpointStorage
from cowstate.descriptors import ListStateDescriptor, ValueStateDescriptor
from cowstate.errors import (
    BackendClosedError,
    CowStateError,
    InvalidArgumentError,
    KeyGroupMismatchError,
    SnapshotEntryError,
    StateRegistrationError,
)
from cowstate.heap_backend import HeapKeyedStateBackend
from cowstate.key_groups import KeyGroupRange
from cowstate.keyed_backend import AbstractKeyedStateBackend
from cowstate.rocksdb.backend import RocksDBKeyedStateBackend
from cowstate.serializers import DefaultSerializer

LOW, HIGH = KeyGroupRange(0, 7), KeyGroupRange(8, 15)
#: Int keys whose key groups are in each range.
KEYS_OF = {r: [k for k in range(200) if group_of(k) in r] for r in (LOW, HIGH)}
SOURCE = SnapshotSource(FileSystem(), "/")
#: Makes a backend (over the full range unless a range is given).
Make = Callable[..., Any]


@pytest.fixture(params=["heap", "rocksdb"])
def make(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Make]:
    made: list[AbstractKeyedStateBackend[Any]] = []

    def factory(key_group_range: KeyGroupRange = FULL) -> AbstractKeyedStateBackend[Any]:
        backend: AbstractKeyedStateBackend[Any] = (
            heap(key_group_range)
            if request.param == "heap"
            else rocks(tmp_path / "local", key_group_range)
        )
        made.append(backend)
        return backend

    yield factory
    for backend in made:
        backend.close()


def databases(backend: AbstractKeyedStateBackend[Any]) -> list[str]:
    """The databases in a RocksDB backend's instance directory (none for the heap)."""
    if not isinstance(backend, RocksDBKeyedStateBackend):
        return []
    return sorted(p.name for p in backend.instance_path.iterdir() if p.name != "checkpoints")


def snapshot(backends: list[Any], root: Path) -> Any:
    """A checkpoint of a job of ``backends`` through the coordinator (untouched)."""
    coordinator = CheckpointCoordinator(CheckpointStorage(str(root), "job"), backends)
    completed = coordinator.complete_checkpoint(coordinator.trigger_checkpoint())
    return completed


def flip_largest_file(completed: Any, subtask: int) -> None:
    """Flip a byte in the middle of subtask ``subtask``'s largest file."""
    source = SnapshotSource(FileSystem(), completed.directory)
    file = max(completed.metadata.subtasks[subtask].files, key=lambda f: f.size)
    path = Path(source.path(file))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))


# ------------------------------------------------- a job restores all or none


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "with-state"])
def test_a_corrupt_subtask_restores_no_subtask(make: Make, tmp_path: Path, fresh: bool) -> None:
    job = [make(LOW), make(HIGH)]
    for backend in job:
        fill(backend, range(60))
    completed = snapshot(job, tmp_path / "a")
    flip_largest_file(completed, 1)
    targets = [make(LOW), make(HIGH)]
    if not fresh:
        for backend in targets:
            fill(backend, range(200, 230), tag="mine")
    before = [dump(b) for b in targets]
    dbs = [databases(b) for b in targets]
    with pytest.raises(CowStateError):
        CheckpointCoordinator.restore(
            CheckpointStorage(str(tmp_path / "b"), "job"),
            targets,
            completed.directory,
            RestoreMode.NO_CLAIM,
        )
    assert [dump(b) for b in targets] == before
    if fresh:
        assert all(b.num_state_entries() == 0 for b in targets)
    assert [databases(b) for b in targets] == dbs  # subtask 0's staging is gone


def test_the_control_job_restores(make: Make, tmp_path: Path) -> None:
    """The same job, not corrupted, restores both subtasks exactly."""
    job = [make(LOW), make(HIGH)]
    for backend in job:
        fill(backend, range(60))
    completed = snapshot(job, tmp_path / "a")
    targets = [make(LOW), make(HIGH)]
    CheckpointCoordinator.restore(
        CheckpointStorage(str(tmp_path / "b"), "job"),
        targets,
        completed.directory,
        RestoreMode.NO_CLAIM,
    )
    assert [dump(b) for b in targets] == [dump(b) for b in job]


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "with-state"])
def test_a_subtask_with_bad_entries_restores_no_subtask(
    make: Make, tmp_path: Path, fresh: bool
) -> None:
    """Subtask 1's file has valid CRCs but a None state: found while subtask 1 is
    prepared, after subtask 0 was (a rescaled job of 1 reads both files)."""
    kind = "heap" if isinstance(make(LOW), HeapKeyedStateBackend) else "rocksdb"
    good = crafted(by_group((k, "a", f"v{k}") for k in KEYS_OF[LOW]), key_group_range=LOW)
    bad_blocks = by_group((k, "a", f"v{k}") for k in KEYS_OF[HIGH])
    bad_blocks[max(bad_blocks)].append((KEYS_OF[HIGH][0], "z", None))
    bad = crafted(bad_blocks, key_group_range=HIGH)
    metadata = SimpleNamespace(
        subtasks=(
            handle_for(tmp_path / "0", good, key_group_range=LOW, backend=kind),
            handle_for(tmp_path / "1", bad, key_group_range=HIGH, backend=kind),
        )
    )
    for targets in ([make(LOW), make(HIGH)], [make(FULL)]):
        if not fresh:
            for backend in targets:
                fill(backend, range(200, 230), tag="mine")
        before = [dump(b) for b in targets]
        dbs = [databases(b) for b in targets]
        with pytest.raises(SnapshotEntryError, match="whose state is None"):
            _restore_backends(targets, metadata, SOURCE, incremental_base=False)  # type: ignore[arg-type]
        assert [dump(b) for b in targets] == before
        assert [databases(b) for b in targets] == dbs
    # the control: without the bad entry both subtasks restore
    metadata.subtasks = (
        metadata.subtasks[0],
        handle_for(
            tmp_path / "2",
            crafted(by_group((k, "a", f"v{k}") for k in KEYS_OF[HIGH]), key_group_range=HIGH),
            key_group_range=HIGH,
            backend=kind,
        ),
    )
    targets = [make(LOW), make(HIGH)]
    _restore_backends(targets, metadata, SOURCE, incremental_base=False)  # type: ignore[arg-type]
    assert [len(dump(b)["value"]) for b in targets] == [len(KEYS_OF[LOW]), len(KEYS_OF[HIGH])]


class _Staged:
    """A stand-in prepared restore: logs its commit and discard; the discard
    raises if ``discard_fails``."""

    def __init__(self, name: str, log: list[str], discard_fails: bool) -> None:
        self.name, self.log, self.discard_fails = name, log, discard_fails

    def commit(self) -> None:
        self.log.append(f"commit {self.name}")

    def discard(self) -> None:
        self.log.append(f"discard {self.name}")
        if self.discard_fails:
            raise OSError("the staging directory is gone")


class _StandIn:
    """A stand-in subtask for the coordinator's ``_restore_backends``: logs what
    it is asked; its prepare fails if ``fail``."""

    def __init__(
        self, name: str, log: list[str], *, fail: bool = False, discard_fails: bool = False
    ) -> None:
        self.name, self.log, self.fail, self.discard_fails = name, log, fail, discard_fails
        self.key_group_range = FULL

    def prepare_restore(self, *args: Any, **kwargs: Any) -> _Staged:
        self.log.append(f"prepare {self.name}")
        if self.fail:
            raise KeyGroupMismatchError("expected ..., got a broken file")
        return _Staged(self.name, self.log, self.discard_fails)


def test_a_failing_prepare_discards_every_prepared_restore() -> None:
    """The coordinator's side, with stand-in backends: all prepared, none
    committed, each discarded once; then the error."""
    log: list[str] = []
    metadata = SimpleNamespace(subtasks=())
    backends = [_StandIn("0", log), _StandIn("1", log), _StandIn("2", log, fail=True)]
    with pytest.raises(KeyGroupMismatchError):
        _restore_backends(backends, metadata, SOURCE, incremental_base=False)  # type: ignore[arg-type]
    assert log == ["prepare 0", "prepare 1", "prepare 2", "discard 0", "discard 1"]
    log.clear()
    _restore_backends(backends[:2], metadata, SOURCE, incremental_base=False)  # type: ignore[arg-type]
    assert log == ["prepare 0", "prepare 1", "commit 0", "commit 1"]


# _restore_backends__mutmut_21 (`suppress(None)`: a failing discard became a
# TypeError): the first error is the one reported, and every prepared restore
# is discarded.
@pytest.mark.kills(module="cowstate.checkpoint.coordinator")
def test_a_discard_that_fails_does_not_hide_the_error_or_stop_the_other_discards() -> None:
    log: list[str] = []
    metadata = SimpleNamespace(subtasks=())
    backends = [
        _StandIn("0", log, discard_fails=True),
        _StandIn("1", log),
        _StandIn("2", log, fail=True),
    ]
    with pytest.raises(KeyGroupMismatchError, match="got a broken file"):
        _restore_backends(backends, metadata, SOURCE, incremental_base=False)  # type: ignore[arg-type]
    assert log == ["prepare 0", "prepare 1", "prepare 2", "discard 0", "discard 1"]


# ------------------------------------------- one backend, several files


@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "with-state"])
def test_a_heap_restore_from_several_files_with_one_corrupt_changes_nothing(
    fresh: bool,
) -> None:
    files = [
        crafted(by_group((k, "a", k) for k in KEYS_OF[r]), key_group_range=r) for r in (LOW, HIGH)
    ]
    corrupt = bytearray(files[1])
    corrupt[len(corrupt) // 2] ^= 0x5A
    for broken in ([files[0], bytes(corrupt)], [files[0], files[1][:-20]], [files[0], files[0]]):
        backend = heap()
        if not fresh:
            fill(backend, range(200, 230), tag="mine")
        before = dump(backend)
        with pytest.raises(CowStateError):
            backend.restore(broken)
        assert dump(backend) == before
        if fresh:
            assert backend.num_state_entries() == 0
    backend.restore(files)  # the control
    assert len(dump(backend)["value"]) == len(KEYS_OF[LOW]) + len(KEYS_OF[HIGH])


def test_restore_closes_the_streams_it_opened_and_only_those() -> None:
    data = crafted(by_group((k, "a", k) for k in KEYS_OF[LOW]), key_group_range=LOW)
    opened: list[io.BytesIO] = []

    class Handle:
        def open(self) -> io.BytesIO:
            opened.append(io.BytesIO(data))
            return opened[-1]

    backend = heap()
    with pytest.raises(KeyGroupMismatchError, match="in one snapshot file only"):
        backend.restore([Handle(), Handle()])  # the same key groups twice
    assert len(opened) == 2 and all(s.closed for s in opened)
    given = io.BytesIO(crafted(by_group((k, "a", k) for k in KEYS_OF[HIGH]), key_group_range=HIGH))
    backend.restore([Handle(), given])
    assert opened[-1].closed and not given.closed and given.tell() == 0
    assert backend.num_state_entries() == len(KEYS_OF[LOW]) + len(KEYS_OF[HIGH])


# ------------------------------------------------------------- the edges


def test_restore_of_nothing_is_refused(make: Make) -> None:
    backend = make()
    fill(backend, range(30))
    before = dump(backend)
    with pytest.raises(InvalidArgumentError, match=r"restore\(\[\]\) would empty every state"):
        backend.restore([])
    with pytest.raises(InvalidArgumentError, match="would empty every state"):
        backend.restore_from([], SOURCE)
    with pytest.raises(InvalidArgumentError, match="would empty every state"):
        backend.prepare_restore([], SOURCE)
    assert dump(backend) == before


def test_a_key_group_in_two_handles_is_refused(make: Make, tmp_path: Path) -> None:
    kind = "heap" if isinstance(make(LOW), HeapKeyedStateBackend) else "rocksdb"
    low = handle_for(
        tmp_path / "low",
        crafted(by_group((k, "a", k) for k in KEYS_OF[LOW]), key_group_range=LOW),
        key_group_range=LOW,
        backend=kind,
    )
    backend = make()
    fill(backend, range(30))
    before = dump(backend)
    with pytest.raises(KeyGroupMismatchError, match="in one handle only"):
        backend.restore_from([low, low], SOURCE)
    assert dump(backend) == before
    backend.restore_from([low], SOURCE)  # the control: key groups 8-15 restore empty
    assert dump(backend) == {"value": {(k, "a"): k for k in KEYS_OF[LOW]}}


def test_an_empty_backends_snapshot_restores_to_empty_states(make: Make, tmp_path: Path) -> None:
    empty = make()
    location = SnapshotLocation(FileSystem(), str(tmp_path / "chk-1"), str(tmp_path / "shared"))
    serializers: dict[str, Any] = {"key_serializer": SER, "namespace_serializer": SER}
    bare: AbstractKeyedStateBackend[Any] = (  # no state registered
        HeapKeyedStateBackend(FULL, MAX_P, **serializers)
        if isinstance(empty, HeapKeyedStateBackend)
        else RocksDBKeyedStateBackend(FULL, MAX_P, local_dir=tmp_path / "bare", **serializers)
    )
    handle = bare.snapshot_to(1, location, SnapshotOptions()).result(30)
    assert handle.states == ()
    backend = make()
    fill(backend, range(30))
    assert backend.num_state_entries() > 0
    backend.restore_from([handle], SnapshotSource(FileSystem(), str(tmp_path / "chk-1")))
    assert dump(backend) == {"value": {}}
    if isinstance(bare, HeapKeyedStateBackend) and isinstance(backend, HeapKeyedStateBackend):
        result = bare.snapshot(2, io.BytesIO).result(30)
        assert result.handle is None and result.info is None
        fill(backend, range(30))
        backend.restore([result])  # was: InvalidArgumentError ... got NoneType
        assert dump(backend) == {"value": {}}
    bare.close()


# ------------------------------------------------------- the two phases


def test_prepare_changes_nothing_and_commit_swaps_in(make: Make, tmp_path: Path) -> None:
    kind = "heap" if isinstance(make(LOW), HeapKeyedStateBackend) else "rocksdb"
    data = crafted(by_group((k, "a", f"new{k}") for k in range(40)))
    handle = handle_for(tmp_path / "f", data, backend=kind)
    backend: AbstractKeyedStateBackend[Any] = make()
    as_protocol: object = backend
    assert isinstance(as_protocol, CheckpointingBackend)  # the protocol, at run time
    fill(backend, range(30))
    before = dump(backend)
    staged = backend.prepare_restore([handle], SOURCE)
    assert isinstance(staged, PreparedRestore)
    assert dump(backend) == before  # staged beside the live state
    staged.commit()
    assert dump(backend) == {"value": {(k, "a"): f"new{k}" for k in range(40)}}
    with pytest.raises(InvalidArgumentError, match="already committed"):
        staged.commit()
    staged.discard()  # a no-op once used
    assert len(dump(backend)["value"]) == 40
    assert len(databases(backend)) == (0 if kind == "heap" else 1)


def test_discard_drops_the_staging(make: Make, tmp_path: Path) -> None:
    kind = "heap" if isinstance(make(LOW), HeapKeyedStateBackend) else "rocksdb"
    handle = handle_for(
        tmp_path / "f", crafted(by_group((k, "a", k) for k in range(40))), backend=kind
    )
    backend = make()
    fill(backend, range(30))
    before, dbs = dump(backend), databases(backend)
    staged = backend.prepare_restore([handle], SOURCE)
    if kind == "rocksdb":
        assert len(databases(backend)) == 2  # the staged one beside the live one
    staged.discard()
    assert dump(backend) == before and databases(backend) == dbs
    with pytest.raises(InvalidArgumentError, match="already discarded"):
        staged.commit()
    assert dump(backend) == before


def test_commit_into_a_closed_backend_is_refused_and_discards(make: Make, tmp_path: Path) -> None:
    kind = "heap" if isinstance(make(LOW), HeapKeyedStateBackend) else "rocksdb"
    handle = handle_for(
        tmp_path / "f", crafted(by_group((k, "a", k) for k in range(40))), backend=kind
    )
    backend = make()
    staged = backend.prepare_restore([handle], SOURCE)
    backend.close()
    with pytest.raises(BackendClosedError, match="commit the restore"):
        staged.commit()
    if isinstance(backend, RocksDBKeyedStateBackend):
        assert not backend.instance_path.exists()


def bare_backend(kind: str, tmp_path: Path) -> AbstractKeyedStateBackend[Any]:
    """A backend with no state registered yet."""
    serializers: dict[str, Any] = {"key_serializer": SER, "namespace_serializer": SER}
    if kind == "heap":
        return HeapKeyedStateBackend(FULL, MAX_P, **serializers)
    return RocksDBKeyedStateBackend(FULL, MAX_P, local_dir=tmp_path / "rocks", **serializers)


def canonical_value_savepoint(tmp_path: Path) -> tuple[KeyedStateHandle, SnapshotSource]:
    """A canonical savepoint of value state ``value`` (the default serializer, which
    a restore can name before the state is registered): ``v<k>`` for keys 0-39."""
    writer = bare_backend("heap", tmp_path)
    value = writer.get_state(ValueStateDescriptor("value"))
    writer.set_current_namespace("a")
    for k in range(40):
        writer.set_current_key(k)
        value.update(f"v{k}")
    location = SnapshotLocation(FileSystem(), str(tmp_path / "sp"), str(tmp_path / "shared"))
    options = SnapshotOptions(kind="savepoint", format="canonical")
    handle = writer.snapshot_to(1, location, options).result(30)
    writer.close()
    assert isinstance(handle, KeyedStateHandle)
    return handle, SnapshotSource(FileSystem(), str(tmp_path / "sp"))


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_a_state_registered_between_prepare_and_commit_is_checked_at_the_commit(
    kind: str, tmp_path: Path
) -> None:
    # A state registered after prepare_restore escaped every check: the commit
    # installed the file's value state under a list state's handle (its get()
    # returned the restored value); only the next get_state refused it.
    handle, source = canonical_value_savepoint(tmp_path)
    backend = bare_backend(kind, tmp_path)
    staged = backend.prepare_restore([handle], source)
    items = backend.get_state(ListStateDescriptor("value"))
    with pytest.raises(StateRegistrationError) as excinfo:
        staged.commit()
    assert str(excinfo.value) == (
        "expected state 'value', registered after the restore was prepared, to be a value "
        "state with serializer 'cowstate-value' as the restore holds it, got a list "
        "state descriptor with serializer 'cowstate-value'; the restore is discarded"
    )
    assert staged.status == "discarded"
    assert dump(backend) == {"value": {}}  # unchanged: the list state, empty
    backend.set_current_key(1)
    assert list(items.get()) == []
    backend.close()


@pytest.mark.parametrize("kind", ["heap", "rocksdb"])
def test_a_state_registered_between_prepare_and_commit_takes_its_descriptors_serializer(
    kind: str, tmp_path: Path
) -> None:
    # The same state registered compatibly commits; the restored table then
    # uses the descriptor's serializer object, as a registration after the
    # commit would make it (it kept the one the file's identifier named).
    handle, source = canonical_value_savepoint(tmp_path)
    backend = bare_backend(kind, tmp_path)
    staged = backend.prepare_restore([handle], source)
    own = DefaultSerializer()
    value = backend.get_state(ValueStateDescriptor("value", serializer=own))
    staged.commit()
    assert backend.table("value").meta.state_serializer is own
    backend.set_current_key(3)
    backend.set_current_namespace("a")
    assert value.value() == "v3"
    backend.close()
